//! Human log lines that lead with what happened:
//!
//! ```text
//! 2026-11-29T12:40:01.123456Z  INFO run approved run_id=run-1 by=bob  [rpc correlation_id=01a2…]  switchyard_approval
//! ```
//!
//! the time, the level, the message, the event's own fields, then the
//! fields of the spans it happened in (outermost first) and where it was
//! logged. Fields with nothing in them are left out.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The event format of `log_format = "human"`.
pub(super) struct MessageFirst;

impl<S, N> FormatEvent<S, N> for MessageFirst
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        SystemTime.format_time(&mut w)?;
        let meta = event.metadata();
        write!(w, " {:>5} ", meta.level())?;
        let mut fields = Fields::default();
        event.record(&mut fields);
        w.write_str(&fields.message)?;
        for (k, v) in &fields.rest {
            write!(w, " {k}={v}")?;
        }
        let mut spans = String::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                let kept = ext
                    .get::<FormattedFields<N>>()
                    .map(|f| without_empty(f))
                    .unwrap_or_default();
                if !spans.is_empty() {
                    spans.push_str(", ");
                }
                spans.push_str(span.name());
                if !kept.is_empty() {
                    let _ = write!(spans, " {kept}");
                }
            }
        }
        if !spans.is_empty() {
            write!(w, "  [{spans}]")?;
        }
        writeln!(w, "  {}", meta.target())
    }
}

/// An event's message and its other non-empty fields.
#[derive(Default)]
struct Fields {
    message: String,
    rest: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            value.clone_into(&mut self.message);
        } else if !value.is_empty() {
            self.rest.push((field.name(), format!("{value:?}")));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else if !text.is_empty() && text != "\"\"" {
            self.rest.push((field.name(), text));
        }
    }
}

/// `fields` (`key=value` pairs as the default formatter writes them, a
/// value quoted when it is a string with spaces) without those whose value
/// is empty.
fn without_empty(fields: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    let mut rest = fields.trim_start();
    while !rest.is_empty() {
        // One pair: up to the next space outside quotes.
        let mut quoted = false;
        let mut escaped = false;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                ' ' if !quoted => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        let pair = &rest[..end];
        let empty = pair
            .split_once('=')
            .is_some_and(|(_, v)| v.is_empty() || v == "\"\"");
        if !empty {
            kept.push(pair);
        }
        rest = rest[end..].trim_start();
    }
    kept.join(" ")
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::{MessageFirst, without_empty};

    #[test]
    fn a_line_leads_with_the_message_and_leaves_empty_fields_out() {
        let out = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .event_format(MessageFirst)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("rpc", correlation_id = "c-1", tenant = "");
            let _in = span.enter();
            tracing::info!(run_id = "run-1", by = "bob", comment = "", "run approved");
        });
        let line = String::from_utf8(out.lock().map(|o| o.clone()).unwrap_or_default())
            .unwrap_or_default();
        let after_level = line
            .split_once(" INFO ")
            .map(|(_, r)| r)
            .unwrap_or_default();
        assert!(
            after_level.starts_with(
                "run approved run_id=\"run-1\" by=\"bob\"  [rpc correlation_id=\"c-1\"]"
            ),
            "{line}"
        );
        assert!(
            !line.contains("comment") && !line.contains("tenant"),
            "{line}"
        );
    }

    /// A writer into a shared buffer.
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut b) = self.0.lock() {
                b.extend_from_slice(buf);
            }
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn empty_span_fields_are_left_out_and_quoted_values_kept_whole() {
        assert_eq!(
            without_empty(r#"correlation_id=01a2 tenant= job_id="" note="two words" n=3"#),
            r#"correlation_id=01a2 note="two words" n=3"#
        );
        assert_eq!(without_empty(""), "");
        assert_eq!(
            without_empty(r#"q="a \"quoted\" word" x="#),
            r#"q="a \"quoted\" word""#
        );
    }
}
