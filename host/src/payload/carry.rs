//! A plain message sent with its trace context on a queue without message metadata
//! (`trace_envelope`): the envelope of one item carrying the context, as much of it as the
//! queue's size limit allows.

use std::future::Future;

use bytes::Bytes;

use super::{Item, encode_message_item, to_text};
use crate::queue::{MessageId, QueueError};
use crate::telemetry::TraceContext;

/// Puts `body` through `put` as the envelope carrying `context`; when that is over the
/// queue's limit, carrying its `traceparent` alone; else as the body alone. A context cut
/// or dropped is counted in `ebb_trace_context_dropped_total`. `text`: the envelope as
/// base64, for a queue of text. A body too large even alone is `put`'s refusal.
pub(crate) async fn put_carrying<Fut>(body: &[u8], context: TraceContext, text: bool, put: impl Fn(Vec<u8>) -> Fut) -> Result<MessageId, QueueError>
where
    Fut: Future<Output = Result<MessageId, QueueError>>,
{
    let parent_alone = context.without_state();
    let tries = if context.tracestate().is_some() { vec![context, parent_alone] } else { vec![parent_alone] };
    for (tried, context) in tries.into_iter().enumerate() {
        match put(envelope_carrying(body, context, text)?).await {
            Err(QueueError::MessageTooLarge { .. }) => continue,
            put => {
                if tried > 0 {
                    crate::telemetry::uncarried().inc();
                }
                return put;
            }
        }
    }
    let put = put(body.to_vec()).await;
    if put.is_ok() {
        crate::telemetry::uncarried().inc();
    }
    put
}

/// `body` as the envelope of one item carrying `context`, as base64 with `text`.
fn envelope_carrying(body: &[u8], context: TraceContext, text: bool) -> Result<Vec<u8>, QueueError> {
    let item = Item::inline(Bytes::copy_from_slice(body)).with_trace(Some(context));
    let envelope = encode_message_item(&item).map_err(QueueError::Fatal)?;
    Ok(if text { to_text(&envelope).into_bytes() } else { envelope })
}
