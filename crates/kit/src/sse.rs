//! Server-sent events as they arrive in chunks: one splitter for every
//! reader of `text/event-stream` (model providers' streamed answers, A2A
//! streams, MCP responses and subscriptions).

/// Takes the next whole event off the front of `buf`: its `event:` name
/// (empty when none) and its `data:` lines joined with `\n`. Events end at
/// a blank line in either line ending; comments (`: ping`) and events
/// without data are skipped; a partial event stays in `buf` until the rest
/// arrives.
pub fn next_event(buf: &mut Vec<u8>) -> Option<(String, String)> {
    loop {
        let end = buf
            .windows(2)
            .position(|w| w == b"\n\n")
            .map(|i| (i, 2))
            .into_iter()
            .chain(
                buf.windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .map(|i| (i, 4)),
            )
            .min_by_key(|(i, _)| *i)?;
        let block: Vec<u8> = buf.drain(..end.0 + end.1).collect();
        let text = String::from_utf8_lossy(&block[..end.0]);
        let mut name = String::new();
        let mut data: Vec<&str> = Vec::new();
        for line in text.lines() {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => name = value.to_owned(),
                "data" => data.push(value),
                _ => {}
            }
        }
        if !data.is_empty() {
            return Some((name, data.join("\n")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_split_whole_across_chunks_and_line_endings() {
        let mut buf =
            b"event: a\ndata: {\"x\":1}\n\n: comment\n\ndata: one\r\ndata: two\r\n\r\ndata: par"
                .to_vec();
        assert_eq!(
            next_event(&mut buf),
            Some(("a".to_owned(), r#"{"x":1}"#.to_owned()))
        );
        assert_eq!(
            next_event(&mut buf),
            Some((String::new(), "one\ntwo".to_owned()))
        );
        assert_eq!(next_event(&mut buf), None, "a partial event waits");
        buf.extend_from_slice(b"tial\n\n");
        assert_eq!(
            next_event(&mut buf),
            Some((String::new(), "partial".to_owned()))
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn a_crlf_stream_is_split_at_its_own_blank_lines() {
        let mut buf = b"event: message\r\ndata: {\"a\":1}\r\n\r\n: ping\r\n\r\n".to_vec();
        assert_eq!(
            next_event(&mut buf),
            Some(("message".to_owned(), r#"{"a":1}"#.to_owned()))
        );
        assert_eq!(next_event(&mut buf), None);
        assert!(buf.is_empty(), "the comment is consumed: {buf:?}");
    }
}
