//! Moving a message that cannot be handled (failed `max_dequeue_count` times, or corrupt)
//! to the poison queue, and what the poison queue receives for it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use crate::handler::IncomingMessage;
use crate::payload::Origin;
use crate::queue::{DeadLetter, MessageId, PopReceipt, QueueClient, QueueError};

use crate::listener::Shared;
use crate::listener::telemetry::PoisonForm;

impl Shared {
    /// The id its producer got for the message `id` of this queue: on a partitioned queue,
    /// the logical queue's (`partition:id`).
    pub(in crate::listener) fn producer_id(&self, id: &MessageId) -> MessageId {
        match self.delivery.partition {
            Some(index) => crate::queue::partitioned::tagged(index, id),
            None => id.clone(),
        }
    }

    /// Puts `message` (or one item of an envelope, sent as `origin`) into the poison queue
    /// with `reason`, deleting nothing: a JSON envelope with the reason, or, when that does
    /// not fit, the body as it is. The form it took.
    /// Where the queue has a dead-letter queue of its service's, that queue takes it (an
    /// item the service cannot count alone).
    ///
    /// It keeps its producer's trace context, for a requeue to send on: in SQS attributes
    /// (the puts are made as a send with that context; without, when they make it too
    /// large), in the JSON envelope, or, bare on a queue with `trace_envelope`, as the
    /// envelope it was sent as.
    pub(in crate::listener) async fn put_poison(&self, message: &IncomingMessage, origin: Option<&Origin>, reason: &str) -> Result<PoisonForm, QueueError> {
        // Made on the listener's task, where no send's context is.
        crate::queue::with_sending_if_it_fits(message.trace.clone(), || self.put_poison_traced(message, origin, reason)).await
    }

    async fn put_poison_traced(&self, message: &IncomingMessage, origin: Option<&Origin>, reason: &str) -> Result<PoisonForm, QueueError> {
        let poison = self.queue.dead_letter().map_or_else(|| self.delivery.poison.clone(), |dead_letter| dead_letter.queue);
        let (mut form, mut put) = (PoisonForm::Body, None);
        if self.settings.poison_envelope {
            // The id the producer got back, whatever envelope carries an item now.
            let original_id = self.producer_id(&origin.map_or_else(|| message.id.clone(), |o| MessageId::from(o.message_id.as_str())));
            let mut envelope = PoisonEnvelope::new(message, original_id, reason);
            envelope.item = origin.map(|o| o.index).or(envelope.item);
            let envelope = serde_json::to_vec(&envelope).expect("the envelope serialises");
            match poison.put(&envelope, Duration::ZERO).await {
                Err(QueueError::MessageTooLarge { .. }) => {}
                other => (form, put) = (PoisonForm::Envelope, Some(other)),
            }
        }
        let put = match put {
            Some(put) => put,
            // A body that reads as a poison envelope, moved bare, would later be taken for one
            // (a requeue would put back the "body" inside it and lose the rest): left in place.
            None if serde_json::from_slice::<PoisonEnvelope>(&message.body).is_ok() => Err(QueueError::InvalidBody(
                "its body reads as a poison envelope and is too large to wrap in one; moved bare, it would be taken for one".into(),
            )),
            None => self.put_bare(poison.as_ref(), message).await,
        };
        put.map(|_| form)
    }

    /// Puts `message`'s body as it is; on a queue with `trace_envelope`, as the envelope
    /// carrying its context that it was sent as, as much of it as fits (see
    /// [`crate::payload::put_carrying`]).
    async fn put_bare(&self, poison: &dyn QueueClient, message: &IncomingMessage) -> Result<MessageId, QueueError> {
        let Some(context) = message.trace.clone().filter(|_| self.delivery.payload.trace_envelope) else {
            return poison.put(&message.body, Duration::ZERO).await;
        };
        crate::payload::put_carrying(&message.body, context, self.delivery.text_envelopes, |bytes| async move { poison.put(&bytes, Duration::ZERO).await })
            .await
    }

    /// Put in the poison queue first, deleted here after, so a crash in between duplicates
    /// rather than loses it. The poison queue gets a JSON envelope with the reason; when
    /// that does not fit its size limit, the body as it is (as Azure Functions moves it),
    /// and the reason stays in the log, the status and the metrics.
    ///
    /// A queue whose service has a dead-letter queue for it (SQS's RedrivePolicy) is left to
    /// the service ([`Shared::leave_to_dead_letter`]).
    pub(in crate::listener) async fn poison(self: &Arc<Self>, message: &IncomingMessage, receipt: &PopReceipt, reason: &str) {
        crate::telemetry::poisoned(reason);
        if let Some(dead_letter) = self.queue.dead_letter() {
            return self.leave_to_dead_letter(message, receipt, reason, &dead_letter).await;
        }
        let put = self.put_poison(message, None, reason).await;
        match put {
            Ok(form) => {
                self.telemetry.counters.record_poison(&message.id, reason, form);
                if let Some(suppressed) = self.telemetry.poison_log.allow() {
                    tracing::warn!(
                        id = %message.id,
                        dequeue_count = message.dequeue_count,
                        poison_queue = %self.delivery.poison.name(),
                        form = form.as_str(),
                        suppressed,
                        "message moved to the poison queue: {reason}"
                    );
                }
                // With the deletes that settle meanwhile: one batch call where the backend batches.
                match self.delete_settled(&message.id, receipt).await {
                    Ok(()) => self.delivery.groups.deleted(&message.id),
                    Err(error) => tracing::warn!(id = %message.id, "poisoned, but the delete failed (it may be poisoned twice): {error}"),
                }
            }
            Err(error) => {
                // Left in place, but out of the way for the longest retry delay: a message the
                // poison queue refuses (too large once encoded, the queue gone) would
                // otherwise come back at every lease, and with it this line.
                self.telemetry.counters.poison_failures.fetch_add(1, Ordering::Relaxed);
                let delay = self.settings.max_retry_delay;
                if let Some(suppressed) = self.telemetry.poison_log.allow() {
                    tracing::error!(id = %message.id, ?delay, suppressed, "cannot poison ({reason}), leaving the message in place, tried again after {delay:?}: {error}");
                }
                if let Err(error) = self.hide_for(&message.id, receipt, delay).await {
                    tracing::debug!(id = %message.id, "could not set the delay before the next poisoning try (it comes back after its lease): {error}");
                }
            }
        }
    }
}

impl Shared {
    /// Releases `message` at once rather than moving it: the service moves it to its
    /// dead-letter queue when a receive finds it received `max_receive_count` times already,
    /// with its attributes, which a copy would lose. Released, it is received again at once
    /// until then, so no retry delay holds it up.
    async fn leave_to_dead_letter(&self, message: &IncomingMessage, receipt: &PopReceipt, reason: &str, dead_letter: &DeadLetter) {
        if let Some(suppressed) = self.telemetry.poison_log.allow() {
            tracing::warn!(
                id = %message.id,
                dequeue_count = message.dequeue_count,
                dead_letter_queue = %dead_letter.name,
                suppressed,
                "message left to the dead-letter queue {} (the queue's service moves it once received {} times): {reason}",
                dead_letter.name,
                dead_letter.max_receive_count
            );
        }
        if let Err(error) = self.queue.update_visibility(&message.id, receipt, Duration::ZERO).await {
            tracing::debug!(id = %message.id, "could not release it for its dead-letter move (it comes back after its lease): {error}");
        }
    }
}

/// The most of a reason a poison envelope keeps: a handler's error may quote a large
/// body, and the reason must not push the message out of the poison envelope.
const MAX_POISON_REASON_BYTES: usize = 4096;

/// What `<queue>-poison` holds for each poisoned message (JSON).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct PoisonEnvelope {
    /// The queue the message came from.
    pub queue: String,
    /// Its id as its producer got it: there, or `partition:id` on a partitioned queue.
    pub original_id: MessageId,
    /// Times it was leased.
    pub dequeue_count: u32,
    /// The last handler error (its first 4 KiB).
    pub error: String,
    /// When it was put, RFC 3339.
    pub inserted_at: String,
    /// When it was poisoned, RFC 3339.
    pub poisoned_at: String,
    /// The body, if it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The body as hex, if it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_hex: Option<String>,
    /// For an item of an envelope poisoned alone: its index in the envelope its producer
    /// sent it in (`original_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<u32>,
    /// Its producer's W3C trace context, if it carried one: a requeue sends it on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

impl PoisonEnvelope {
    fn new(message: &IncomingMessage, original_id: MessageId, reason: &str) -> Self {
        let text = std::str::from_utf8(&message.body).ok().map(str::to_owned);
        PoisonEnvelope {
            queue: message.queue.clone(),
            original_id,
            dequeue_count: message.dequeue_count,
            error: match crate::rules::cut(reason, MAX_POISON_REASON_BYTES) {
                whole if whole.len() == reason.len() => reason.to_string(),
                cut => format!("{cut}… ({} bytes in all)", reason.len()),
            },
            inserted_at: humantime::format_rfc3339_millis(message.inserted_at).to_string(),
            poisoned_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            body_hex: text.is_none().then(|| hex::encode(&message.body)),
            body: text,
            item: message.item.map(|item| item.index),
            traceparent: message.trace.as_ref().map(|trace| trace.traceparent().to_string()),
            tracestate: message.trace.as_ref().and_then(|trace| trace.tracestate()).map(str::to_string),
        }
    }

    /// The trace context it keeps, if any (a malformed one, edited by hand, is counted and dropped).
    pub(crate) fn trace(&self) -> Option<crate::telemetry::TraceContext> {
        let traceparent = self.traceparent.as_deref()?;
        crate::telemetry::TraceContext::parse(traceparent, self.tracestate.as_deref())
    }
}
