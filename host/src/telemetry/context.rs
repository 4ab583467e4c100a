//! A message's trace context (W3C `traceparent` and `tracestate`), carried from its producer
//! to its handler: in SQS message attributes, in an envelope's item, and to the app as the
//! handler call's headers (`docs/reference/config.md`, "Trace context").

use opentelemetry::trace::{SpanContext, TraceContextExt as _, TraceFlags, TraceState};

use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The `traceparent` and `tracestate` of a message's producer, checked: only a well-formed
/// context is ever built, so only one is passed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
    /// The span both name, kept as parsed: a handling joins it without parsing again.
    parent: SpanContext,
}

impl TraceContext {
    /// The context `traceparent` and `tracestate` name; `None` (and counted in
    /// `ebb_traceparent_rejected_total`) when `traceparent` is malformed: the message then
    /// starts a new trace. A malformed `tracestate` is dropped and counted, the parent kept.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        super::traceparent::parse(traceparent, tracestate).ok().map(|parent| Self::of(&parent))
    }

    /// The context of an HTTP request's `headers`, as [`TraceContext::parse`] takes it.
    /// Repeated `tracestate` headers are one list, in order; repeated `traceparent` headers
    /// name no one parent, so they are malformed. A value that is not text is malformed.
    pub(crate) fn from_headers(headers: &axum::http::HeaderMap) -> Option<TraceContext> {
        let mut parents = headers.get_all("traceparent").iter();
        let first = parents.next()?;
        let traceparent = if parents.next().is_some() { "" } else { first.to_str().unwrap_or_default() };
        let states: Vec<&str> = headers.get_all("tracestate").iter().map(|value| value.to_str().unwrap_or("=")).collect();
        let tracestate = (!states.is_empty()).then(|| states.join(","));
        TraceContext::parse(traceparent, tracestate.as_deref())
    }

    /// The context without its `tracestate`: the parent alone, in a few dozen bytes.
    pub(crate) fn without_state(&self) -> TraceContext {
        let parent = &self.parent;
        Self::of(&SpanContext::new(parent.trace_id(), parent.span_id(), parent.trace_flags(), true, TraceState::default()))
    }

    /// The `traceparent` header's value (version 00).
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` header's value, if the producer sent a non-empty one.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The bytes of both values, for a backend that counts its metadata in a message's size.
    pub fn len(&self) -> usize {
        self.traceparent.len() + self.tracestate.as_ref().map_or(0, String::len)
    }

    /// Whether both values are empty: never, for a context that was parsed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The context of an AWS X-Ray `AWSTraceHeader` (`Root=1-{8 hex}-{24 hex};Parent={16
    /// hex};Sampled={0|1}`, fields in any order, others ignored), as W3C: the root's time and
    /// random parts are the trace id. Refused and counted like a malformed `traceparent`
    /// when its root or parent is missing or malformed.
    pub fn from_xray(header: &str) -> Option<TraceContext> {
        let field = |name: &str| header.split(';').filter_map(|part| part.trim().split_once('=')).find(|(key, _)| *key == name).map(|(_, value)| value);
        let trace =
            field("Root").and_then(|root| root.strip_prefix("1-")).and_then(|root| root.split_once('-')).map(|(time, random)| format!("{time}{random}"));
        let sampled = if field("Sampled") == Some("1") { "01" } else { "00" };
        let traceparent = match (trace, field("Parent")) {
            (Some(trace), Some(parent)) => format!("00-{}-{}-{sampled}", trace.to_ascii_lowercase(), parent.to_ascii_lowercase()),
            // Passed to the checker so that it is counted with the other malformed contexts.
            _ => String::new(),
        };
        Self::parse(&traceparent, None)
    }

    /// The context naming `parent` as the span to join (from elsewhere: a remote parent).
    fn of(parent: &SpanContext) -> TraceContext {
        let flags = parent.trace_flags() & TraceFlags::SAMPLED;
        let traceparent = format!("00-{}-{}-{:02x}", parent.trace_id(), parent.span_id(), flags.to_u8());
        let tracestate = Some(parent.trace_state().header()).filter(|state| !state.is_empty());
        let parent = SpanContext::new(parent.trace_id(), parent.span_id(), flags, true, parent.trace_state().clone());
        TraceContext { traceparent, tracestate, parent }
    }

    /// The remote span this names, for a span link.
    pub(crate) fn span_context(&self) -> &SpanContext {
        &self.parent
    }

    /// The OpenTelemetry context whose remote parent this is, for `set_parent`.
    pub(crate) fn parent(&self) -> opentelemetry::Context {
        opentelemetry::Context::new().with_remote_span_context(self.parent.clone())
    }

    /// The context to pass on from within `span`: `span`'s own when its spans are exported
    /// (the next hop becomes its child), else `carried` unchanged, as a hop that makes no
    /// spans passes a trace on.
    pub(crate) fn passed_on(span: &tracing::Span, carried: Option<&TraceContext>) -> Option<TraceContext> {
        if span.is_disabled() {
            return carried.cloned();
        }
        let context = span.context();
        let own = context.span().span_context().clone();
        own.is_valid().then(|| Self::of(&own)).or_else(|| carried.cloned())
    }
}

/// Sets `span`'s parent to the context `carried` names, if any: before anything starts the
/// span's context (a child, [`TraceContext::passed_on`]), or it has no effect.
pub(crate) fn join(span: &tracing::Span, carried: Option<&TraceContext>) {
    if let Some(carried) = carried
        && !span.is_disabled()
    {
        let _ = span.set_parent(carried.parent());
    }
}

tokio::task_local! {
    /// The context of the send the current task is making: a backend with message metadata
    /// (SQS) puts it in the message's attributes. A task-local rather than a parameter of
    /// every backend's and decorator's `put`, which carry bytes: only one backend has
    /// anywhere else to put it.
    static SENDING: Option<TraceContext>;
}

/// Contexts a message could not carry since start, for `/metrics`: it went without (or
/// with its `traceparent` alone) because carrying them put it over its queue's size limit.
static UNCARRIED: std::sync::LazyLock<prometheus_client::metrics::counter::Counter> = std::sync::LazyLock::new(Default::default);

/// The counter of contexts dropped for size (a handle on the one count).
pub(crate) fn uncarried() -> prometheus_client::metrics::counter::Counter {
    UNCARRIED.clone()
}

/// Runs `send` with `context` as the context its puts carry (see [`sending`]).
pub(crate) async fn with_sending<F: Future>(context: Option<TraceContext>, send: F) -> F::Output {
    SENDING.scope(context, send).await
}

/// The context of the send being made on this task, if any.
pub(crate) fn sending() -> Option<TraceContext> {
    SENDING.try_with(Clone::clone).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_tracestate_headers_are_one_list_and_repeated_traceparents_none() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut headers = axum::http::HeaderMap::new();
        headers.append("traceparent", parent.parse().unwrap());
        headers.append("tracestate", "a=1".parse().unwrap());
        headers.append("tracestate", "b=2".parse().unwrap());
        assert_eq!(TraceContext::from_headers(&headers).unwrap().tracestate(), Some("a=1,b=2"));
        headers.append("traceparent", parent.parse().unwrap());
        let before = super::super::traceparent::rejected().get();
        assert_eq!(TraceContext::from_headers(&headers), None, "two parents are none");
        assert!(super::super::traceparent::rejected().get() > before, "counted");
    }

    #[test]
    fn an_xray_header_becomes_the_w3c_context_of_the_same_trace() {
        let cases = [
            ("Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1", Some("00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01")),
            ("Parent=53995c3f42cd8ad8; Root=1-5759e988-bd862e3fe1be46a994272793; Lineage=a:1", Some("00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-00")),
            ("Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1", None),
            ("Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8", None),
            ("Root=1-5759e988-bd862e3fe1be46a99427279;Parent=53995c3f42cd8ad8", None),
            ("garbage", None),
        ];
        for (header, traceparent) in cases {
            let before = super::super::traceparent::rejected().get();
            let context = TraceContext::from_xray(header);
            assert_eq!(context.as_ref().map(TraceContext::traceparent), traceparent, "{header}");
            // The count is shared with the tests running beside this one: only a rise is telling.
            if traceparent.is_none() {
                assert!(super::super::traceparent::rejected().get() > before, "{header}: a refusal is counted");
            }
        }
    }

    #[test]
    fn a_context_is_passed_on_as_version_00_with_its_state() {
        let later = TraceContext::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-more", Some("a=1")).unwrap();
        assert_eq!(later.traceparent(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!(later.tracestate(), Some("a=1"));
        assert_eq!(TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", Some("")).unwrap().tracestate(), None);
        assert!(TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", None).is_none());
    }

    #[tokio::test]
    async fn a_send_carries_its_context_only_within_its_scope() {
        let context = TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None);
        assert_eq!(with_sending(context.clone(), async { sending() }).await, context);
        assert_eq!(sending(), None);
    }
}
