//! Span export that counts what it loses. The SDK's batch processor drops
//! a span when its queue is full and says so only in its shutdown log; a
//! trace missing under load must be visible while it happens. [`Admit`]
//! lets at most `cap` spans be in the pipeline (queued or being exported)
//! and counts every span it turns away; [`Counted`] counts each batch the
//! exporter delivered or failed to deliver and frees its places. With `cap`
//! no larger than the batch processor's queue, the batch processor never
//! drops on its own, so `dropped + exported + failed + in flight` is every
//! span ended — `switchyard_trace_spans_{dropped,exported,export_failed}_total`
//! in `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};

/// What the pipeline holds and what it lost or delivered.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    in_flight: AtomicUsize,
    dropped: AtomicU64,
    exported: AtomicU64,
    failed: AtomicU64,
}

#[cfg(test)]
impl Stats {
    /// Spans turned away because the pipeline was full.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Spans the collector accepted.
    pub(crate) fn exported(&self) -> u64 {
        self.exported.load(Ordering::Relaxed)
    }

    /// Spans whose export failed (the collector refused or was unreachable).
    pub(crate) fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

/// A span processor that admits a span into `inner` only while fewer than
/// `cap` are in the pipeline, counting the ones it turns away.
#[derive(Debug)]
pub(crate) struct Admit<P> {
    pub(crate) inner: P,
    pub(crate) stats: Arc<Stats>,
    pub(crate) cap: usize,
}

impl<P: SpanProcessor> SpanProcessor for Admit<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        let took = self
            .stats
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            });
        if took.is_ok() {
            self.inner.on_end(span);
            return;
        }
        let n = self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        crate::metrics::global().trace_spans_dropped.inc();
        // The first loss, then every 10,000th: enough to be seen, never a flood.
        if n.is_multiple_of(10_000) {
            tracing::warn!(
                dropped = n + 1,
                queue = self.cap,
                "span export queue full: spans are being dropped (switchyard_trace_spans_dropped_total); raise telemetry.span_queue or lower telemetry.trace_sample_ratio"
            );
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// An exporter that counts what `inner` delivered or failed to deliver and
/// gives the spans' places in the pipeline back.
#[derive(Debug)]
pub(crate) struct Counted<E> {
    pub(crate) inner: E,
    pub(crate) stats: Arc<Stats>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let r = self.inner.export(batch).await;
        let m = crate::metrics::global();
        if r.is_ok() {
            self.stats.exported.fetch_add(n as u64, Ordering::Relaxed);
            m.trace_spans_exported.inc_by(n as u64);
        } else {
            self.stats.failed.fetch_add(n as u64, Ordering::Relaxed);
            m.trace_spans_export_failed.inc_by(n as u64);
        }
        self.stats.in_flight.fetch_sub(n, Ordering::AcqRel);
        r
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status};
    use opentelemetry_sdk::error::OTelSdkError;
    use std::sync::Mutex;

    /// A processor that keeps what it is given, to hand to an exporter.
    #[derive(Debug, Default)]
    struct Keep(Mutex<Vec<SpanData>>);

    impl SpanProcessor for Keep {
        fn on_start(&self, _: &mut Span, _: &Context) {}
        fn on_end(&self, span: SpanData) {
            self.0.lock().unwrap().push(span);
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
    }

    /// An exporter that accepts or refuses every batch.
    #[derive(Debug)]
    struct Collector(bool);

    impl SpanExporter for Collector {
        async fn export(&self, _: Vec<SpanData>) -> OTelSdkResult {
            if self.0 {
                Ok(())
            } else {
                Err(OTelSdkError::InternalFailure("collector down".into()))
            }
        }
    }

    fn span(name: &'static str) -> SpanData {
        SpanData {
            span_context: SpanContext::empty_context(),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: name.into(),
            start_time: std::time::SystemTime::UNIX_EPOCH,
            end_time: std::time::SystemTime::UNIX_EPOCH,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_full_pipeline_drops_and_counts_every_span_it_turns_away() {
        let stats = Arc::new(Stats::default());
        let admit = Admit {
            inner: Keep::default(),
            stats: stats.clone(),
            cap: 2,
        };
        for n in ["a", "b", "c", "d"] {
            admit.on_end(span(n));
        }
        assert_eq!(stats.dropped(), 2, "two spans past a cap of two");
        let queued: Vec<SpanData> = std::mem::take(&mut *admit.inner.0.lock().unwrap());
        assert_eq!(queued.len(), 2);

        // Delivered spans give their places back: the next span is admitted.
        let ok = Counted {
            inner: Collector(true),
            stats: stats.clone(),
        };
        ok.export(queued).await.unwrap();
        assert_eq!(stats.exported(), 2);
        admit.on_end(span("e"));
        assert_eq!(stats.dropped(), 2, "room again after the export");

        // A failed export counts as failed and frees its place too.
        let down = Counted {
            inner: Collector(false),
            stats: stats.clone(),
        };
        let queued = std::mem::take(&mut *admit.inner.0.lock().unwrap());
        assert!(down.export(queued).await.is_err());
        assert_eq!((stats.failed(), stats.exported()), (1, 2));
        admit.on_end(span("f"));
        admit.on_end(span("g"));
        admit.on_end(span("h"));
        assert_eq!(
            stats.dropped(),
            3,
            "two places free, the third span dropped"
        );
    }
}
