//! Deletes that settle together go out together, on a backend that deletes in batches
//! (SQS: `DeleteMessageBatch` of up to 10): a [`GroupCommit`](super::group_commit::GroupCommit).
//! A backend without batches deletes each message on its own call, side by side, as before.
//!
//! A handled message's delete may *linger*: when it would go in a short batch, it waits up to
//! [`DELETE_LINGER`] (a quarter of the lease at most, so the message's lease, renewed at half
//! way while its handler ran, still holds) for the next messages' deletes, and goes at once
//! when the batch fills or the listener stops. Sparse traffic then pays a delete batch per
//! several messages, not one per message. It lingers apart from the dequeue task, which goes
//! on picking up work meanwhile.

use std::sync::Arc;
use std::time::Duration;

use super::group_commit::Batching;
use crate::listener::Shared;
use crate::queue::{MessageId, PopReceipt, QueueError};

/// The longest a handled message's delete waits for others to share its batch.
pub(in crate::listener) const DELETE_LINGER: Duration = Duration::from_secs(5);

impl Shared {
    /// Deletes a settled message: with the others that settle meanwhile, in one batch call,
    /// where the backend batches; else on its own call.
    pub(in crate::listener) async fn delete_settled(&self, id: &MessageId, receipt: &PopReceipt) -> Result<(), QueueError> {
        self.delete_in_batch(id, receipt, Duration::ZERO).await
    }

    /// Whether a handled message's delete lingers for others ([`DELETE_LINGER`]): on a
    /// backend that deletes in batches, but not where a delete is awaited: a FIFO group's
    /// next message waits for it, and an offloaded body is deleted after its message.
    pub(in crate::listener) fn deletes_linger(&self) -> bool {
        self.queue.delete_batch_limit() >= 2 && !self.queue.fifo() && self.delivery.claims.is_none()
    }

    /// Deletes a handled message in the background, lingering for the next ones to share its
    /// batch ([`deletes_linger`](Self::deletes_linger) must hold); counted as processed once
    /// deleted.
    pub(in crate::listener) fn delete_handled_later(self: &Arc<Self>, id: &MessageId, receipt: &PopReceipt, latency: Duration) {
        let (shared, id, receipt) = (self.clone(), id.clone(), receipt.clone());
        // In the message's handling span, which ends with its delete.
        let span = tracing::Span::current();
        let deleting = async move {
            let linger = DELETE_LINGER.min(shared.settings.lease_duration / 4);
            let deleted = shared.delete_in_batch(&id, &receipt, linger).await;
            shared.telemetry.counters.record_success(latency);
            if let Err(error) = deleted {
                // The work was done; the message may be handled again (at least once).
                tracing::warn!(%id, "handled, but the delete failed: {error}");
            }
        };
        self.tasks.spawn(tracing::Instrument::instrument(deleting, span));
    }

    async fn delete_in_batch(&self, id: &MessageId, receipt: &PopReceipt, linger: Duration) -> Result<(), QueueError> {
        let limit = self.queue.delete_batch_limit();
        if limit < 2 {
            return self.queue.delete(id, receipt).await;
        }
        let what = format!("delete of message {id}");
        let entry = (id.clone(), receipt.clone());
        let batching = Batching { limit, linger, flush: &self.stopping };
        self.delivery.deletes.run(entry, batching, &what, |batch| async move { self.queue.delete_batch(&batch).await }).await
    }
}
