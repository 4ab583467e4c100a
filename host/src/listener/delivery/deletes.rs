//! Deletes that settle together go out together, on a backend that deletes in batches
//! (SQS: `DeleteMessageBatch` of up to 10): a [`GroupCommit`](super::group_commit::GroupCommit).
//! A backend without batches deletes each message on its own call, side by side, as before.

use crate::listener::Shared;
use crate::queue::{MessageId, PopReceipt, QueueError};

impl Shared {
    /// Deletes a settled message: with the others that settle meanwhile, in one batch call,
    /// where the backend batches; else on its own call.
    pub(in crate::listener) async fn delete_settled(&self, id: &MessageId, receipt: &PopReceipt) -> Result<(), QueueError> {
        let limit = self.queue.delete_batch_limit();
        if limit < 2 {
            return self.queue.delete(id, receipt).await;
        }
        let what = format!("delete of message {id}");
        let entry = (id.clone(), receipt.clone());
        self.delivery.deletes.run(entry, limit, &what, |batch| async move { self.queue.delete_batch(&batch).await }).await
    }
}
