//! A message's trace context on SQS: W3C `traceparent` and `tracestate` as message
//! attributes of those names (what ebb writes, and what OpenTelemetry's SQS instrumentation
//! writes), or X-Ray's `AWSTraceHeader` system attribute (what AWS's SDKs and Lambda set).

use std::collections::HashMap;

use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName};

use crate::telemetry::TraceContext;

/// The message attribute of the W3C `traceparent`.
pub(super) const TRACEPARENT_ATTRIBUTE: &str = "traceparent";
/// The message attribute of the W3C `tracestate`.
pub(super) const TRACESTATE_ATTRIBUTE: &str = "tracestate";

/// The attributes that carry `context`, named and valued.
pub(super) fn attributes(context: &TraceContext) -> anyhow::Result<Vec<(&'static str, MessageAttributeValue)>> {
    let value = |text: &str| MessageAttributeValue::builder().data_type("String").string_value(text).build();
    let mut attributes = vec![(TRACEPARENT_ATTRIBUTE, value(context.traceparent())?)];
    if let Some(state) = context.tracestate() {
        attributes.push((TRACESTATE_ATTRIBUTE, value(state)?));
    }
    Ok(attributes)
}

/// The bytes SQS counts in a message's size for `context`'s attributes: each one's name,
/// data type and value.
pub(super) fn attribute_bytes(context: &TraceContext) -> usize {
    let string = "String".len();
    let state = context.tracestate().map_or(0, |state| TRACESTATE_ATTRIBUTE.len() + string + state.len());
    TRACEPARENT_ATTRIBUTE.len() + string + context.traceparent().len() + state
}

/// The context a received message carries: its `traceparent` attribute's, else its
/// `AWSTraceHeader`'s. A malformed one is counted and dropped (the message starts a trace).
pub(super) fn received(
    attributes: Option<&HashMap<String, MessageAttributeValue>>,
    system: Option<&HashMap<MessageSystemAttributeName, String>>,
) -> Option<TraceContext> {
    let text = |name: &str| attributes.and_then(|a| a.get(name)).and_then(|value| value.string_value());
    if let Some(traceparent) = text(TRACEPARENT_ATTRIBUTE) {
        return TraceContext::parse(traceparent, text(TRACESTATE_ATTRIBUTE));
    }
    system.and_then(|system| system.get(&MessageSystemAttributeName::AwsTraceHeader)).and_then(|header| TraceContext::from_xray(header))
}
