//! Handlers' answers: put on the reply queue, correlated by the id the producer got back,
//! before the request is deleted.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;

use crate::handler::IncomingMessage;
use crate::listener::Shared;
use crate::payload::Origin;
use crate::queue::{MessageId, QueueError};

impl Shared {
    /// Puts a handler's answer on the reply queue (a no-op without one), in the handling's
    /// trace context, correlated by the id the producer got back (on a partitioned queue, the logical queue's; for an item,
    /// the envelope it was sent in, `item`, whatever envelope carries it now).
    pub(in crate::listener) async fn put_reply(&self, message: &IncomingMessage, item: Option<Origin>, reply: &Bytes) -> Result<(), ReplyNotPut> {
        let Some(queue) = &self.delivery.reply else { return Ok(()) };
        let id = item.as_ref().map_or_else(|| message.id.clone(), |o| MessageId::from(o.message_id.as_str()));
        let correlation_id = self.producer_id(&id);
        let body = serde_json::to_vec(&Reply::new(correlation_id.to_string(), message, item.map(|o| o.index), reply)).expect("a reply serialises");
        // The answer carries the context of the handling that made it (SQS puts it in the
        // answer's attributes): made on the listener's task, where no send's context is.
        let context = crate::telemetry::TraceContext::passed_on(&tracing::Span::current(), message.trace.as_ref());
        match crate::queue::with_sending_if_it_fits(context, || queue.put(&body, Duration::ZERO)).await {
            Ok(_) => {
                self.telemetry.counters.items.replies.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            // Handling it again would give an answer as large: no retry can put it.
            Err(QueueError::MessageTooLarge { size, limit }) => Err(ReplyNotPut::Never(format!(
                "handled, but its answer of {} bytes is too large for the reply queue {}: the reply message would be {size} bytes, over its limit of {limit} bytes (an answer must fit one message of the reply queue with its JSON: on Azure about 48 KiB of UTF-8, about 36 KiB of other bytes, which go as base64)",
                reply.len(),
                queue.name()
            ))),
            Err(error @ QueueError::InvalidBody(_)) => {
                Err(ReplyNotPut::Never(format!("handled, but its answer cannot be a message of the reply queue {}: {error}", queue.name())))
            }
            Err(error) => Err(ReplyNotPut::NotNow(
                anyhow::Error::new(error).context(format!("handled, but its reply could not be put on the reply queue {}", queue.name())),
            )),
        }
    }
}

/// Why a handler's answer is not on the reply queue.
pub(in crate::listener) enum ReplyNotPut {
    /// It can never be put there (too large for a message of it): the request is poisoned
    /// at once, with this reason.
    Never(String),
    /// The put failed; a later delivery may succeed: a failed delivery of the request.
    NotNow(anyhow::Error),
}

/// What a reply queue holds for each answer (JSON; docs/guides/payloads.md).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reply {
    /// The request's message id.
    pub correlation_id: String,
    /// The queue the request came from.
    pub queue: String,
    /// For an item of an envelope: its index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<u32>,
    /// When the answer was put, RFC 3339.
    pub replied_at: String,
    /// The answer, if it is UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The answer in base64, if it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
}

impl Reply {
    fn new(correlation_id: String, message: &IncomingMessage, item: Option<u32>, reply: &Bytes) -> Reply {
        let text = std::str::from_utf8(reply).ok().map(str::to_owned);
        Reply {
            correlation_id,
            queue: message.queue.clone(),
            item,
            replied_at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            body_base64: text.is_none().then(|| azure_core::base64::encode(reply)),
            body: text,
        }
    }

    /// The answer's bytes (none when its base64 is malformed).
    pub fn bytes(&self) -> Vec<u8> {
        match (&self.body, &self.body_base64) {
            (Some(text), _) => text.clone().into_bytes(),
            (None, Some(b64)) => azure_core::base64::decode(b64).unwrap_or_default(),
            (None, None) => Vec::new(),
        }
    }
}
