//! Spans exported over OTLP (`[telemetry]`, issue 39): the OpenTelemetry SDK's batch
//! processor and OTLP exporter behind `tracing-opentelemetry`, a layer beside the log's.
//!
//! Only spans of the target [`TARGET`] are exported: a send, a storage call (a get with the
//! messages it returned, its retries), a message's handling and its outcome, a rule's
//! decision. Without an endpoint no layer is installed and those spans are disabled at
//! their call sites, costing nothing.
//!
//! A collector that is away never slows a message: a finished span is queued without
//! waiting (at most [`MAX_QUEUED_SPANS`], the rest dropped), exports run on a runtime of
//! their own under a timeout, and every span lost (queue full, export refused or timed out)
//! is counted in `ebb_trace_spans_dropped_total`.

mod context;
pub(crate) mod traceparent;

pub use context::TraceContext;
pub(crate) use context::{join, sending, uncarried, with_sending};

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanData, SpanExporter, SpanProcessor};
use prometheus_client::metrics::counter::Counter;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// Protobuf in an HTTP POST (`/v1/traces`).
    HttpProtobuf,
    /// gRPC (`TraceService/Export`), plain text.
    Grpc,
}

/// Where and how spans are exported: the file and the environment resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpExport {
    /// The full URL: for HTTP, with `/v1/traces` added to a base URL.
    pub endpoint: String,
    /// HTTP or gRPC.
    pub protocol: OtlpProtocol,
    /// `service.name`.
    pub service_name: String,
}

/// The target of the spans that are exported (`tracing::debug_span!(target: TARGET, …)`).
/// At DEBUG, so the log shows them only when asked (`EBB_LOG=ebb::otel=debug`).
pub(crate) const TARGET: &str = "ebb::otel";

/// Finished spans waiting for an export, at most: about 2 MB at a typical span's size.
/// A collector away for longer than the queue lasts loses the spans after it, counted.
pub(crate) const MAX_QUEUED_SPANS: usize = 4096;

/// Longest an export may take, retries included: a hanging collector holds one batch this
/// long while the queue behind it fills and drops.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest shutdown waits for the last spans to be exported: a host stops within its
/// `drain_timeout` + 1 s, and this second more with spans exported.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(1);

/// Spans lost since start, for `/metrics`.
static DROPPED: LazyLock<Counter> = LazyLock::new(Counter::default);

/// Spans finished since start: each is exported or counted in [`DROPPED`].
static MADE: LazyLock<Counter> = LazyLock::new(Counter::default);

/// The running export, for [`shutdown`].
static RUNNING: Mutex<Option<Running>> = Mutex::new(None);

/// The counter of spans lost (queue full, export failed or timed out): a handle on the one count.
pub(crate) fn dropped_spans() -> Counter {
    DROPPED.clone()
}

/// The counter of spans finished, exported or dropped: a handle on the one count.
pub(crate) fn made_spans() -> Counter {
    MADE.clone()
}

struct Running {
    provider: SdkTracerProvider,
    runtime: tokio::runtime::Runtime,
    /// Spans ended and not yet exported (or counted dropped), for [`abandon`].
    pending: Arc<AtomicUsize>,
}

/// The layer that exports [`TARGET`]'s spans to `export`'s collector; [`shutdown`] flushes
/// it. Fails only when the exporter cannot be built (its runtime or client).
pub(crate) fn layer<S>(export: &OtlpExport) -> anyhow::Result<impl Layer<S> + use<S>>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    Ok(unfiltered_layer(export)?.with_filter(spans_filter()))
}

/// The filter of [`layer`]: [`TARGET`]'s spans. Static: every other call site is decided
/// once, not at each call.
pub fn spans_filter() -> Targets {
    Targets::new().with_target(TARGET, tracing::Level::DEBUG)
}

/// [`layer`] without its filter, for a program that switches the export on and off (the
/// benchmark of its cost) with a filter of its own.
pub fn unfiltered_layer<S>(export: &OtlpExport) -> anyhow::Result<impl Layer<S> + use<S>>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    // Exports run here, not on the host's runtime: a slow collector takes none of the
    // host's threads, and the runtime outlives the host's for the flush at shutdown.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("ebb-otlp")
        .enable_all()
        .build()
        .context("failed to start the OTLP exporter's runtime")?;
    let exporter = {
        // tonic's channel is made on a runtime.
        let _entered = runtime.enter();
        match export.protocol {
            OtlpProtocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(&export.endpoint)
                .with_timeout(EXPORT_TIMEOUT)
                .build(),
            OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder().with_tonic().with_endpoint(&export.endpoint).with_timeout(EXPORT_TIMEOUT).build(),
        }
        .with_context(|| format!("failed to build the OTLP exporter for {}", export.endpoint))?
    };
    let pending = Arc::new(AtomicUsize::new(0));
    let pending_at_exit = pending.clone();
    let counted = Counted {
        inner: Arc::new(exporter),
        runtime: runtime.handle().clone(),
        pending: pending.clone(),
        // Logged when exports fail: without its query, which may hold a key.
        endpoint: export.endpoint.split('?').next().unwrap_or_default().to_string(),
        failing: AtomicBool::new(false),
    };
    // The SDK's own queue is never the one that fills (see `Bounded`): its drops are not counted.
    let config = BatchConfigBuilder::default().with_max_queue_size(2 * MAX_QUEUED_SPANS).with_scheduled_delay(Duration::from_secs(1)).build();
    let batch = BatchSpanProcessor::new(counted, config);
    let provider = SdkTracerProvider::builder()
        .with_span_processor(Bounded { inner: batch, pending, closed: AtomicBool::new(false) })
        .with_resource(Resource::builder().with_service_name(export.service_name.clone()).build())
        .build();
    let tracer = provider.tracer("ebb");
    *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) = Some(Running { provider, runtime, pending: pending_at_exit });
    Ok(tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_context_activation(false))
}

/// Exports what is queued, waiting at most [`SHUTDOWN_TIMEOUT`] however the collector
/// behaves, and stops the exporter. Spans not exported by then are counted as dropped.
pub(crate) fn shutdown() {
    let Some(Running { provider, runtime, .. }) = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    if let Err(error) = provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
        tracing::warn!("spans not all exported at shutdown: {error}");
    }
    runtime.shutdown_timeout(Duration::from_millis(100));
    log_account();
}

/// For a process exiting at once (a second signal): the spans not exported yet are counted
/// dropped, not waited for, and the account is logged.
pub(crate) fn abandon() {
    if let Some(running) = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        DROPPED.inc_by(running.pending.swap(0, Ordering::AcqRel) as u64);
        log_account();
    }
}

/// The final account: every span made was exported or is in the dropped count.
fn log_account() {
    let (made, dropped) = (MADE.get(), DROPPED.get());
    tracing::info!(spans_made = made, spans_dropped = dropped, "spans at shutdown: {made} made, {} exported, {dropped} dropped", made.saturating_sub(dropped));
}

/// The SDK's batch processor behind a bound of its own, which counts what it drops: a span
/// is pending from its end until its export is over (sent or failed), so the SDK's queue
/// never holds more than [`MAX_QUEUED_SPANS`].
#[derive(Debug)]
struct Bounded {
    inner: BatchSpanProcessor,
    pending: Arc<AtomicUsize>,
    /// Set as shutdown starts: a span ending after it is dropped (the SDK would drop it
    /// uncounted), so `pending` only falls once shutdown has swept it.
    closed: AtomicBool,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        MADE.inc();
        if self.closed.load(Ordering::Acquire) {
            DROPPED.inc();
            return;
        }
        if self.pending.fetch_add(1, Ordering::AcqRel) >= MAX_QUEUED_SPANS {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            DROPPED.inc();
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.closed.store(true, Ordering::Release);
        let result = self.inner.shutdown_with_timeout(timeout);
        if result.is_err() {
            // Whatever is still pending is lost with the process.
            DROPPED.inc_by(self.pending.swap(0, Ordering::AcqRel) as u64);
        }
        result
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, run on the exporter's runtime under [`EXPORT_TIMEOUT`], its failures
/// counted as drops and logged when they start and stop.
#[derive(Debug)]
struct Counted {
    inner: Arc<opentelemetry_otlp::SpanExporter>,
    runtime: tokio::runtime::Handle,
    pending: Arc<AtomicUsize>,
    endpoint: String,
    failing: AtomicBool,
}

impl Counted {
    fn log_transition(&self, result: &OTelSdkResult, spans: usize) {
        match result {
            Err(error) if !self.failing.swap(true, Ordering::Relaxed) => {
                tracing::warn!(endpoint = %self.endpoint, "spans not exported, dropped ({spans} in this batch; all counted in ebb_trace_spans_dropped_total) until the collector answers: {error}");
            }
            Ok(()) if self.failing.swap(false, Ordering::Relaxed) => tracing::info!(endpoint = %self.endpoint, "spans exported again"),
            _ => {}
        }
    }
}

impl SpanExporter for Counted {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let spans = batch.len();
        let inner = self.inner.clone();
        let task = self.runtime.spawn(async move { tokio::time::timeout(EXPORT_TIMEOUT, inner.export(batch)).await });
        async move {
            let result = match task.await {
                Ok(Ok(result)) => result,
                Ok(Err(_elapsed)) => Err(OTelSdkError::Timeout(EXPORT_TIMEOUT)),
                Err(error) => Err(OTelSdkError::InternalFailure(format!("the export task ended: {error}"))),
            };
            // A shutdown that gave up has counted whatever was pending, this batch included:
            // an export ending after it (cancelled with the runtime) counts nothing again.
            let still_pending = self.pending.fetch_update(Ordering::AcqRel, Ordering::Acquire, |pending| pending.checked_sub(spans)).is_ok();
            if result.is_err() && still_pending {
                DROPPED.inc_by(spans as u64);
            }
            self.log_transition(&result, spans);
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        // Set once, at the provider's start, before any export holds a clone.
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.set_resource(resource);
        }
    }
}

/// The span of a message's handling: its outcome ([`outcome`], [`poisoned`]) is recorded
/// on it once settled.
pub(crate) fn handle_span(queue: &str, id: &impl std::fmt::Display, dequeue_count: u32) -> tracing::Span {
    tracing::debug_span!(
        target: TARGET,
        "handle",
        otel.kind = "consumer",
        queue,
        messaging.message.id = %id,
        dequeue_count,
        outcome = tracing::field::Empty,
        reason = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// The span of an envelope's item's handling, made within the envelope's [`handle_span`]:
/// the child of the context the item carries (its own producer's), linked both ways with
/// the envelope's handling; without one, the envelope's handling's child. Its outcome is
/// recorded as [`handle_span`]'s, within it.
pub(crate) fn handle_item_span(queue: &str, id: &impl std::fmt::Display, index: usize, attempts: u32, carried: Option<&TraceContext>) -> tracing::Span {
    let span = tracing::debug_span!(
        target: TARGET,
        "handle_item",
        otel.kind = "consumer",
        queue,
        messaging.message.id = %id,
        item = index,
        attempts,
        outcome = tracing::field::Empty,
        reason = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    if carried.is_some() && !span.is_disabled() {
        join(&span, carried);
        link_both_ways(&span, &tracing::Span::current());
    }
    span
}

/// The span of one handler call for a batch of an envelope's items: the envelope's
/// handling's child (one call has one parent), linked to each item's carried context.
pub(crate) fn handle_batch_span<'a>(
    queue: &str,
    id: &impl std::fmt::Display,
    carried: impl ExactSizeIterator<Item = Option<&'a TraceContext>>,
) -> tracing::Span {
    let span = tracing::debug_span!(target: TARGET, "handle_batch", otel.kind = "consumer", queue, messaging.message.id = %id, messaging.batch.message_count = carried.len());
    if !span.is_disabled() {
        for context in carried.flatten() {
            span.add_link(context.span_context().clone());
        }
    }
    span
}

/// Links `span` (in another trace) and `envelope` to each other, so either trace leads to
/// the other.
fn link_both_ways(span: &tracing::Span, envelope: &tracing::Span) {
    span.add_link(envelope.context().span().span_context().clone());
    envelope.add_link(span.context().span().span_context().clone());
}

/// Records how the message of the current [`handle_span`] was settled: `deleted`,
/// `retried`, `pushed_back`, `released`. Recorded once per span: a field recorded twice
/// is exported twice.
pub(crate) fn outcome(outcome: &'static str) {
    tracing::Span::current().record("outcome", outcome);
}

/// Records that the message of the current [`handle_span`] was poisoned, and why.
pub(crate) fn poisoned(reason: &str) {
    let span = tracing::Span::current();
    span.record("outcome", "poisoned");
    span.record("reason", reason);
    span.record("otel.status_code", "ERROR");
}
