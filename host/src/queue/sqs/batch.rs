//! Lease renewals that fall due together as one `ChangeMessageVisibilityBatch` (up to
//! [`super::MAX_DELETE_BATCH`] entries, SQS's limit on every batch call), each entry's failure its
//! own: a receipt SQS refuses is stale for that entry alone.

use std::time::Duration;

use anyhow::anyhow;
use aws_sdk_sqs::types::ChangeMessageVisibilityBatchRequestEntry;

use super::{Call, MAX_VISIBILITY, SqsQueue, seconds_up};
use crate::queue::{FailureClass, MessageId, PopReceipt, QueueError, classified};

impl SqsQueue {
    /// One `ChangeMessageVisibilityBatch` of at most [`super::MAX_DELETE_BATCH`] entries, each named
    /// by its place in `chunk` and saturating at what SQS allows it (as
    /// [`crate::queue::QueueClient::update_visibility`]); a receipt that is not its message's
    /// is stale without a call. SQS issues no new handle: each success returns its receipt.
    pub(super) async fn update_chunk(&self, chunk: &[(MessageId, PopReceipt)], visibility: Duration) -> Vec<Result<PopReceipt, QueueError>> {
        let mut results: Vec<Result<PopReceipt, QueueError>> = Vec::with_capacity(chunk.len());
        let mut batch = Vec::new();
        for (index, (id, pop_receipt)) in chunk.iter().enumerate() {
            let (first, handle) = match Self::receipt_parts(id, pop_receipt) {
                Ok(parts) => parts,
                Err(stale) => {
                    results.push(Err(stale));
                    continue;
                }
            };
            let seconds = seconds_up(Self::visibility_left(first, visibility), MAX_VISIBILITY);
            match ChangeMessageVisibilityBatchRequestEntry::builder().id(index.to_string()).receipt_handle(handle).visibility_timeout(seconds).build() {
                Ok(entry) => {
                    batch.push(entry);
                    // Until SQS's answer names the entry.
                    results.push(Err(QueueError::Fatal(anyhow!("{}: message {id}: the answer does not name its entry", self.context(Call::Update)))));
                }
                Err(e) => results.push(Err(QueueError::Fatal(anyhow!("{}: the batch entry of message {id}: {e}", self.context(Call::Update))))),
            }
        }
        if batch.is_empty() {
            return results;
        }
        let sent = async {
            let url = self.url().await?;
            let client = self.client(Call::Update).await?;
            Ok::<_, QueueError>(client.change_message_visibility_batch().queue_url(url).set_entries(Some(batch.clone())).send().await)
        };
        let indices = batch.iter().filter_map(|entry| entry.id().parse::<usize>().ok());
        let answer = match sent.await {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => {
                for index in indices {
                    results[index] = Err(self.classify(Call::Update, Some(&chunk[index].0), &error));
                }
                return results;
            }
            Err(error) => {
                // No URL or no client: the same reason for each entry.
                let (text, transient, class) = (error.to_string(), error.is_transient(), error.failure_class().unwrap_or(FailureClass::Other));
                for index in indices {
                    let again = classified(class, text.clone());
                    results[index] = Err(if transient { QueueError::Transient(again) } else { QueueError::Fatal(again) });
                }
                return results;
            }
        };
        for changed in answer.successful() {
            if let Some(index) = changed.id().parse::<usize>().ok().filter(|index| *index < chunk.len()) {
                results[index] = Ok(chunk[index].1.clone());
            }
        }
        for failed in answer.failed() {
            let Some(index) = failed.id().parse::<usize>().ok().filter(|index| *index < chunk.len()) else {
                tracing::warn!(queue = %self.name, "queue {}: ChangeMessageVisibilityBatch reported an entry it was not sent: {}", self.name, failed.id());
                continue;
            };
            // SQS's fault (not the sender's) is a server error, worth retrying.
            let status = if failed.sender_fault() { 400 } else { 500 };
            results[index] = Err(self.classify_answer(Call::Update, Some(&chunk[index].0), status, Some(failed.code()), failed.message()));
        }
        results
    }
}
