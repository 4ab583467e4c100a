//! The queue seam: one small, object-safe trait that every backend implements, modelled on
//! Azure Storage Queues (leases with visibility timeouts, pop receipts, dequeue counts), and
//! decorators that wrap any backend.
//!
//! - [`embedded`]: a durable queue in a local data directory (redb), nothing to install.
//! - [`azure`]: Azure Storage Queues (and Azurite), over the official SDK.
//! - [`sqs`]: Amazon SQS (and moto), over the official SDK.
//! - [`Retrying`]: retries transient errors with jittered exponential back-off, and keeps a
//!   [`CallRecord`] of failures by kind and [`FailureClass`], retries and answers.
//! - [`Metered`]: counts every storage call by kind and by whether it returned work: the
//!   transactions the paper's cost model bills.

pub mod azure;
mod call_record;
pub(crate) mod clock;
pub mod embedded;
mod failure;
pub mod memory;
mod metered;
pub mod partitioned;
mod retrying;
pub mod sqs;
mod traced;

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;

pub(crate) use call_record::CallRecord;
pub use call_record::{CallSnapshot, FailureCount, KindCount, LastFailure};
pub use clock::{Clock, SystemClock, TokioClock};
pub use failure::FailureClass;
pub(crate) use failure::{CallKind, classified};
pub use metered::{Metered, TransactionCounts, TransactionRates, Transactions, UnansweredCounts};

pub use retrying::{RetryPolicy, Retrying};
pub(crate) use traced::with_sending_if_it_fits;

/// The most messages one get may ask for (Azure's limit, 32); a backend may return fewer (SQS at most 10).
pub const MAX_BATCH: u32 = 32;

/// Azure's limit on a visibility timeout or an initial delay: 7 days. Backends saturate
/// longer values to it; the API and the config reject them with the reason.
pub const MAX_VISIBILITY: Duration = Duration::from_secs(7 * 24 * 3600);

/// The least time allowed for a long poll's answer to come back: its lease is counted from
/// at least this long before the answer (see [`lease_offset`]).
const ANSWER_MARGIN: Duration = Duration::from_secs(1);

/// How long after sending a get its lease began, erring early, for a get that waited up to
/// `wait` on the service and answered `elapsed` after it was sent. Without a wait, at once.
/// With one, the service took the messages somewhere within the wait, so the lease is
/// counted from the answer less the time its way back may have taken: what the call took
/// beyond the wait, and at least [`ANSWER_MARGIN`]. Counting a long poll's lease from its
/// sending would end it up to `wait` early, before it began when the lease is shorter.
pub(crate) fn lease_offset(elapsed: Duration, wait: Duration) -> Duration {
    if wait.is_zero() {
        return Duration::ZERO;
    }
    elapsed.saturating_sub(elapsed.saturating_sub(wait).max(ANSWER_MARGIN))
}

/// Defines a string newtype for a value the queue service issues and the host only passes
/// back: comparable, printable, readable as `&str`, never built from arbitrary text by mistake.
macro_rules! opaque_string {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The value as the service issued it.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                $name(value)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                $name(value.to_string())
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

opaque_string!(
    /// Identifies a message within its queue.
    MessageId
);
opaque_string!(
    /// Proves one lease of a message: deleting it or changing its visibility needs the
    /// receipt of its latest lease or update.
    PopReceipt
);

/// A dead-letter queue the service itself moves a queue's messages to after
/// `max_receive_count` receives (SQS's `RedrivePolicy`): the listener then leaves poisoning
/// to the service, and `ebb poison` works on this queue.
#[derive(Clone)]
pub struct DeadLetter {
    /// The dead-letter queue's name.
    pub name: String,
    /// Its ARN, as the policy names it.
    pub arn: String,
    /// Receives after which the service moves a message there.
    pub max_receive_count: u32,
    /// The dead-letter queue, its transient errors retried.
    pub queue: std::sync::Arc<dyn QueueClient>,
}

impl std::fmt::Debug for DeadLetter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetter").field("arn", &self.arn).field("max_receive_count", &self.max_receive_count).finish()
    }
}

/// A leased message. Its `pop_receipt` proves the lease: delete it, or change its
/// visibility, with this receipt. A later lease issues a new receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Identifies the message within its queue.
    pub id: MessageId,
    /// Proves this lease; a stale receipt cannot delete or update.
    pub pop_receipt: PopReceipt,
    /// How many times the message has been leased, this lease included.
    pub dequeue_count: u32,
    /// When the message was put.
    pub inserted_at: SystemTime,
    /// When the lease ends and the message becomes visible again.
    pub next_visible_at: SystemTime,
    /// The body, as put. A `Bytes`, so passing it on (to the handler, to an HTTP request)
    /// shares the buffer the backend read it into instead of copying it.
    pub body: Bytes,
    /// Why this message cannot be handled, if it cannot: its stored body failed its
    /// checksum, or it could not be decoded. The listener moves such a message to the
    /// poison queue with this reason and never hands it to the handler.
    pub defect: Option<String>,
    /// Its FIFO fields, on a queue that keeps messages in groups (an SQS `.fifo` queue):
    /// the listener handles a group's messages one at a time, in order. `None` elsewhere.
    pub fifo: Option<FifoFields>,
    /// The trace context its producer sent it with, where the backend keeps it beside the
    /// body (SQS: message attributes); `None` elsewhere (an envelope may carry one).
    pub trace: Option<crate::telemetry::TraceContext>,
}

/// A message's fields on a FIFO queue, as the service gave them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FifoFields {
    /// The group whose order the message keeps (SQS `MessageGroupId`).
    pub group: String,
    /// The id that deduplicated its send (SQS `MessageDeduplicationId`).
    pub deduplication_id: Option<String>,
    /// Its place in the queue (SQS `SequenceNumber`, a decimal up to 128 bits).
    pub sequence_number: Option<String>,
}

/// What a send to a FIFO queue carries besides the body: its group, and optionally the id
/// that deduplicates it (without one, the queue's content-based deduplication, or one ebb
/// makes up, kept across its retries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupedSend {
    /// The message group id: its messages are handled one at a time, in send order.
    pub group: String,
    /// The deduplication id: a send with the id of one of the last 5 minutes is dropped.
    pub dedup_id: Option<String>,
}

/// What a queue operation can fail with. Callers branch on these.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Worth retrying: busy, timed out, connection reset.
    #[error("transient storage error: {0:#}")]
    Transient(anyhow::Error),
    /// Not worth retrying: misconfiguration, corruption, authentication.
    #[error("storage error: {0:#}")]
    Fatal(anyhow::Error),
    /// The message was leased again, or deleted, since this receipt was issued.
    #[error("stale pop receipt for message {id}: it was leased again or deleted")]
    StaleReceipt {
        /// The message id.
        id: MessageId,
    },
    /// The body is over the queue's size limit.
    #[error("message of {size} bytes is over the limit of {limit} bytes")]
    MessageTooLarge {
        /// The body's size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The body cannot be a message of this queue at all (not text, where the queue
    /// stores text): the sender's to fix, never worth retrying.
    #[error("the body cannot be stored in this queue: {0}")]
    InvalidBody(String),
    /// The send does not fit the queue: a FIFO queue's without a group id, a group id to a
    /// queue without groups. The sender's to fix; names the parameter.
    #[error("the send is refused: {0}")]
    BadSend(String),
    /// A get asked for more than `MAX_BATCH` messages (or none).
    #[error("a get takes 1 to {MAX_BATCH} messages, not {0}")]
    BadBatchSize(u32),
}

impl QueueError {
    /// Whether retrying the same call may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, QueueError::Transient(_))
    }
}

/// One queue of some backend. Object-safe: listeners hold `Arc<dyn QueueClient>`.
#[async_trait]
pub trait QueueClient: Send + Sync + 'static {
    /// The queue's name.
    fn name(&self) -> &str;

    /// Creates the queue if it does not exist.
    async fn create_if_missing(&self) -> Result<(), QueueError>;

    /// Adds a message, invisible for `initial_visibility` (zero: visible at once). Returns its id.
    async fn put(&self, body: &[u8], initial_visibility: Duration) -> Result<MessageId, QueueError>;

    /// Whether the queue keeps its messages in groups (an SQS `.fifo` queue): its sends
    /// go through [`QueueClient::put_in_group`], and a plain put is refused.
    fn fifo(&self) -> bool {
        false
    }

    /// The deduplication id a FIFO send without one goes with, or `None` to send it as it
    /// is (the default; an SQS queue with content-based deduplication). Asked once per send
    /// by [`Retrying`], so its retries carry the same id and SQS keeps one copy.
    fn generated_dedup_id(&self) -> Option<String> {
        None
    }

    /// Adds a message to `send`'s group of a FIFO queue. Refused
    /// ([`QueueError::BadSend`]) by a queue without groups (the default).
    async fn put_in_group(&self, _body: &[u8], _initial_visibility: Duration, send: &GroupedSend) -> Result<MessageId, QueueError> {
        Err(QueueError::BadSend(format!(
            "queue {} is not a FIFO queue: a message group id ({:?}) is only for SQS .fifo queues",
            self.name(),
            crate::health::truncate_reason(&send.group)
        )))
    }

    /// Leases up to `max` (1..=32) visible messages, oldest first (roughly), each for
    /// `visibility`. An empty result means no message is visible now.
    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError>;

    /// How much of an idle wait of `idle` a get can spend waiting on the service for a first
    /// message (long polling), so that one arriving meanwhile is taken at once: zero where
    /// the service answers at once (the default), else at most `idle`, in the steps the
    /// service counts (SQS: whole seconds, up to 20).
    fn server_wait(&self, _idle: Duration) -> Duration {
        Duration::ZERO
    }

    /// A [`QueueClient::get`] that, finding no message, waits on the service up to `wait`
    /// (as [`QueueClient::server_wait`] allowed) for one. One call, one billed request,
    /// however long it waits.
    async fn get_waiting(&self, max: u32, visibility: Duration, _wait: Duration) -> Result<Vec<Message>, QueueError> {
        self.get(max, visibility).await
    }

    /// Deletes a leased message. Fails with [`QueueError::StaleReceipt`] if the lease is lost.
    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), QueueError>;

    /// Deletes leased messages, each with its receipt: one result per entry, in order, each
    /// failing on its own (a lost lease as [`QueueError::StaleReceipt`] of that entry). A
    /// service with a batch delete makes one call per batch (SQS: `DeleteMessageBatch` of
    /// up to 10); the default deletes them one by one.
    async fn delete_batch(&self, entries: &[(MessageId, PopReceipt)]) -> Vec<Result<(), QueueError>> {
        let mut results = Vec::with_capacity(entries.len());
        for (id, pop_receipt) in entries {
            results.push(self.delete(id, pop_receipt).await);
        }
        results
    }

    /// The most entries one request of [`QueueClient::delete_batch`] carries: 1 (a delete
    /// each) unless the service deletes in batches (SQS: 10). [`Metered`] bills a batch
    /// delete as one request per this many; [`Retrying`] retries each such request alone.
    fn delete_batch_limit(&self) -> usize {
        1
    }

    /// Sets a leased message's visibility to `visibility` from now (zero: release it now;
    /// longer: renew the lease). Returns the new pop receipt.
    async fn update_visibility(&self, id: &MessageId, pop_receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError>;

    /// Sets each leased message's visibility to `visibility` from now (lease renewals that
    /// fall due together): one result per entry, in order, each failing on its own (a
    /// refused receipt as [`QueueError::StaleReceipt`] of that entry). A service with a batch
    /// update makes one call per [`QueueClient::update_batch_limit`] entries (SQS:
    /// `ChangeMessageVisibilityBatch` of up to 10); the default updates them one by one.
    async fn update_visibility_batch(&self, entries: &[(MessageId, PopReceipt)], visibility: Duration) -> Vec<Result<PopReceipt, QueueError>> {
        let mut results = Vec::with_capacity(entries.len());
        for (id, pop_receipt) in entries {
            results.push(self.update_visibility(id, pop_receipt, visibility).await);
        }
        results
    }

    /// The most entries one request of [`QueueClient::update_visibility_batch`] carries: 1
    /// unless the service updates in batches (SQS: 10).
    fn update_batch_limit(&self) -> usize {
        1
    }

    /// The dead-letter queue the service moves this queue's messages to, if its policy names
    /// one (read at [`QueueClient::create_if_missing`]). `None`: ebb's poison queue.
    fn dead_letter(&self) -> Option<DeadLetter> {
        None
    }

    /// Approximate number of messages in the queue, visible or not.
    async fn approximate_count(&self) -> Result<u64, QueueError>;

    /// The approximate count, when reading it is free (a local read, not a billed storage
    /// call): for status displays that must be current. `None` on remote backends, whose
    /// count costs a transaction, and when it cannot be read now.
    fn local_count(&self) -> Option<u64> {
        None
    }

    /// The records of this queue's storage calls (a partitioned queue has one per
    /// partition), for `/metrics` and `/status`. Empty unless a [`Retrying`] decorator keeps one.
    fn call_records(&self) -> Vec<std::sync::Arc<CallRecord>> {
        Vec::new()
    }

    /// The requests the service bills for a put of `body`, for [`Metered`] (which wraps the
    /// backend itself): one, unless the service bills a large body by the chunk (SQS: each
    /// 64 KiB of the payload as sent).
    fn put_requests(&self, _body: &[u8]) -> u64 {
        1
    }

    /// Requests made since the last time this was asked that no call of the trait stands
    /// for, for [`Metered`] (which counts them as creates): SQS's queue URL look-up, and the
    /// attribute read that follows its `CreateQueue`. The service bills them as any other.
    fn take_setup_requests(&self) -> u64 {
        0
    }
}

/// A shared client is a client: decorators can wrap whichever backend a queue was given.
#[async_trait]
impl QueueClient for std::sync::Arc<dyn QueueClient> {
    fn name(&self) -> &str {
        (**self).name()
    }
    async fn create_if_missing(&self) -> Result<(), QueueError> {
        (**self).create_if_missing().await
    }
    async fn put(&self, body: &[u8], initial_visibility: Duration) -> Result<MessageId, QueueError> {
        (**self).put(body, initial_visibility).await
    }
    fn fifo(&self) -> bool {
        (**self).fifo()
    }
    fn generated_dedup_id(&self) -> Option<String> {
        (**self).generated_dedup_id()
    }
    async fn put_in_group(&self, body: &[u8], initial_visibility: Duration, send: &GroupedSend) -> Result<MessageId, QueueError> {
        (**self).put_in_group(body, initial_visibility, send).await
    }
    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
        (**self).get(max, visibility).await
    }
    fn server_wait(&self, idle: Duration) -> Duration {
        (**self).server_wait(idle)
    }
    async fn get_waiting(&self, max: u32, visibility: Duration, wait: Duration) -> Result<Vec<Message>, QueueError> {
        (**self).get_waiting(max, visibility, wait).await
    }
    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), QueueError> {
        (**self).delete(id, pop_receipt).await
    }
    async fn delete_batch(&self, entries: &[(MessageId, PopReceipt)]) -> Vec<Result<(), QueueError>> {
        (**self).delete_batch(entries).await
    }
    fn delete_batch_limit(&self) -> usize {
        (**self).delete_batch_limit()
    }
    async fn update_visibility(&self, id: &MessageId, pop_receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError> {
        (**self).update_visibility(id, pop_receipt, visibility).await
    }
    async fn update_visibility_batch(&self, entries: &[(MessageId, PopReceipt)], visibility: Duration) -> Vec<Result<PopReceipt, QueueError>> {
        (**self).update_visibility_batch(entries, visibility).await
    }
    fn update_batch_limit(&self) -> usize {
        (**self).update_batch_limit()
    }
    fn dead_letter(&self) -> Option<DeadLetter> {
        (**self).dead_letter()
    }
    async fn approximate_count(&self) -> Result<u64, QueueError> {
        (**self).approximate_count().await
    }
    fn local_count(&self) -> Option<u64> {
        (**self).local_count()
    }
    fn call_records(&self) -> Vec<std::sync::Arc<CallRecord>> {
        (**self).call_records()
    }
    fn put_requests(&self, body: &[u8]) -> u64 {
        (**self).put_requests(body)
    }
    fn take_setup_requests(&self) -> u64 {
        (**self).take_setup_requests()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_polls_lease_is_counted_from_its_answer_less_the_way_back() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // (elapsed, wait) -> offset from sending the get.
        let cases = [
            // No wait: from the sending, as a short poll's.
            ((s(3), Duration::ZERO), Duration::ZERO),
            // A message 8 s into a 20 s wait: from the answer less the margin.
            ((ms(8_200), s(20)), ms(7_200)),
            // A full wait and a slow answer: the time beyond the wait is the way back.
            ((s(23), s(20)), s(20)),
            // An answer quicker than the margin: from the sending.
            ((ms(300), s(20)), Duration::ZERO),
        ];
        for ((elapsed, wait), offset) in cases {
            assert_eq!(lease_offset(elapsed, wait), offset, "elapsed {elapsed:?}, wait {wait:?}");
        }
    }
}
