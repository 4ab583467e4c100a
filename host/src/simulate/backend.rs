//! The backend a simulation models (`--backend`): its limits, its floor and its price.
//!
//! - `azure` (also what the embedded queue does): the in-memory queue as it is, gets of up to
//!   32, a delete per message, answers at once; priced at `--price` (the paper's by default).
//! - `sqs`, `sqs-fifo`: SQS's shape over the same queue ([`SqsModel`]): receives of up to 10,
//!   deletes that settle together as one `DeleteMessageBatch` per 10, and long polls: a get
//!   after an idle sleep waits on the "service" up to 20 s and answers the moment a message
//!   arrives, one request however long it waits; priced at SQS's $0.40 (FIFO $0.50) per
//!   million requests. FIFO's ordering of groups is not modelled, only its price. A receive,
//!   a delete and an update take [`REQUEST_TIME`] of simulated time, so that deletes
//!   settling meanwhile join the next batch as they do against SQS (a call answering in no
//!   time would send nearly each delete alone); puts take none, so arrivals land on time.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use async_trait::async_trait;

use crate::queue::memory::MemoryQueue;
use crate::queue::{Message, MessageId, PopReceipt, QueueClient, QueueError};

/// The names `--backend` takes.
pub(crate) const BACKENDS: &[&str] = &["azure", "sqs", "sqs-fifo"];

/// How long an SQS consumer request takes in the model: a typical round trip within a region.
pub(crate) const REQUEST_TIME: Duration = Duration::from_millis(10);

/// The storage a simulation runs on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SimBackend {
    /// Azure Storage Queues (and the embedded queue): gets of 32, a delete per message.
    #[default]
    Azure,
    /// An SQS standard queue.
    Sqs,
    /// An SQS FIFO queue: SQS's limits at FIFO's price.
    SqsFifo,
}

impl SimBackend {
    /// `azure`, `sqs` or `sqs-fifo`.
    pub fn parse(text: &str) -> Result<SimBackend> {
        Ok(match text {
            "azure" => SimBackend::Azure,
            "sqs" => SimBackend::Sqs,
            "sqs-fifo" => SimBackend::SqsFifo,
            other => bail!("--backend: {other:?} is not one of {}", BACKENDS.join(", ")),
        })
    }

    /// The backend a configured queue runs on (the embedded queue is Azure-shaped).
    pub fn of_queue(queue: &crate::config::QueueConfig) -> SimBackend {
        match queue.billing() {
            crate::cost::Billing::Configured => SimBackend::Azure,
            crate::cost::Billing::SqsStandard => SimBackend::Sqs,
            crate::cost::Billing::SqsFifo => SimBackend::SqsFifo,
        }
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            SimBackend::Azure => "azure",
            SimBackend::Sqs => "sqs",
            SimBackend::SqsFifo => "sqs-fifo",
        }
    }

    /// Its price when `--price` is not given: the paper's for Azure, SQS's own for SQS.
    pub fn default_price_per_10k(self) -> f64 {
        match self {
            SimBackend::Azure => crate::cost::PAPER_PRICE_PER_10K,
            SimBackend::Sqs => crate::cost::SQS_STANDARD_PRICE_PER_10K,
            SimBackend::SqsFifo => crate::cost::SQS_FIFO_PRICE_PER_10K,
        }
    }

    /// Whether it is SQS (standard or FIFO).
    pub fn is_sqs(self) -> bool {
        self != SimBackend::Azure
    }

    /// Messages one get returns at most.
    pub fn get_batch(self) -> u32 {
        if self.is_sqs() { crate::queue::sqs::MAX_GET } else { crate::queue::MAX_BATCH }
    }

    /// Deletes one request carries at most.
    pub fn delete_batch(self) -> u32 {
        if self.is_sqs() { crate::queue::sqs::MAX_DELETE_BATCH as u32 } else { 1 }
    }

    /// What the floor counts, in words (for the tables' headings).
    pub(crate) fn floor_words(self) -> String {
        if self.is_sqs() {
            format!("a delete batch per {} messages + the fewest receives of at most {}", self.delete_batch(), self.get_batch())
        } else {
            format!("a delete per message + the fewest gets of at most {}", self.get_batch())
        }
    }

    /// The storage queue the listener's stack wraps, over `memory`.
    pub(crate) fn storage(self, memory: Arc<MemoryQueue>) -> Arc<dyn QueueClient> {
        if self.is_sqs() { Arc::new(SqsModel::new(memory)) } else { memory }
    }
}

/// SQS's shape over the in-memory queue, under the simulated clock: receives of at most 10,
/// batch deletes of 10, long polls of up to 20 s woken by a put or a release.
pub(crate) struct SqsModel {
    inner: Arc<MemoryQueue>,
    /// Woken by every put and release, so a waiting receive answers at once.
    arrived: tokio::sync::Notify,
}

impl SqsModel {
    pub(crate) fn new(inner: Arc<MemoryQueue>) -> SqsModel {
        SqsModel { inner, arrived: tokio::sync::Notify::new() }
    }
}

#[async_trait]
impl QueueClient for SqsModel {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn create_if_missing(&self) -> Result<(), QueueError> {
        self.inner.create_if_missing().await
    }

    async fn put(&self, body: &[u8], initial_visibility: Duration) -> Result<MessageId, QueueError> {
        let id = self.inner.put(body, initial_visibility).await?;
        self.arrived.notify_waiters();
        Ok(id)
    }

    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
        self.get_waiting(max, visibility, Duration::ZERO).await
    }

    /// As SQS counts it: whole seconds, at most 20.
    fn server_wait(&self, idle: Duration) -> Duration {
        Duration::from_secs(idle.min(crate::queue::sqs::MAX_WAIT).as_secs())
    }

    /// Looks after the request's time; finding nothing, waits up to `wait` for a put or a
    /// release and looks again at once (another waiting receive may have taken it: then it
    /// waits on). SQS answers a waiting receive with what is there when the message
    /// arrives: one arriving during the answer's way back is the next receive's.
    async fn get_waiting(&self, max: u32, visibility: Duration, wait: Duration) -> Result<Vec<Message>, QueueError> {
        let max = max.min(crate::queue::sqs::MAX_GET);
        let deadline = tokio::time::Instant::now() + wait.min(crate::queue::sqs::MAX_WAIT);
        tokio::time::sleep(REQUEST_TIME).await;
        loop {
            // Registered before looking, so a put between the look and the wait is not missed.
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let messages = self.inner.get(max, visibility).await?;
            if !messages.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(messages);
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), QueueError> {
        tokio::time::sleep(REQUEST_TIME).await;
        self.inner.delete(id, pop_receipt).await
    }

    /// One request for up to 10 (the retry decorator above sends no more in one).
    async fn delete_batch(&self, entries: &[(MessageId, PopReceipt)]) -> Vec<Result<(), QueueError>> {
        tokio::time::sleep(REQUEST_TIME).await;
        let mut results = Vec::with_capacity(entries.len());
        for (id, pop_receipt) in entries {
            results.push(self.inner.delete(id, pop_receipt).await);
        }
        results
    }

    fn delete_batch_limit(&self) -> usize {
        crate::queue::sqs::MAX_DELETE_BATCH
    }

    async fn update_visibility(&self, id: &MessageId, pop_receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError> {
        tokio::time::sleep(REQUEST_TIME).await;
        let receipt = self.inner.update_visibility(id, pop_receipt, visibility).await?;
        if visibility.is_zero() {
            self.arrived.notify_waiters();
        }
        Ok(receipt)
    }

    async fn approximate_count(&self) -> Result<u64, QueueError> {
        self.inner.approximate_count().await
    }

    fn local_count(&self) -> Option<u64> {
        self.inner.local_count()
    }

    fn put_requests(&self, body: &[u8]) -> u64 {
        body.len().div_ceil(crate::queue::sqs::BILLED_CHUNK_BYTES).max(1) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::TokioClock;

    fn model() -> SqsModel {
        SqsModel::new(Arc::new(MemoryQueue::new("q", Arc::new(TokioClock::new()), 1 << 20)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_poll_answers_the_moment_a_message_arrives() -> anyhow::Result<()> {
        let queue = Arc::new(model());
        let start = tokio::time::Instant::now();
        let putter = queue.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(7300)).await;
            putter.put(b"x", Duration::ZERO).await.unwrap();
        });
        let got = queue.get_waiting(32, Duration::from_secs(30), Duration::from_secs(20)).await?;
        assert_eq!((got.len(), start.elapsed()), (1, Duration::from_millis(7300)));
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_receive_takes_ten_at_most_and_an_empty_wait_ends_at_twenty_seconds() -> anyhow::Result<()> {
        let queue = model();
        for _ in 0..25 {
            queue.put(b"x", Duration::ZERO).await?;
        }
        assert_eq!(queue.get(32, Duration::from_secs(30)).await?.len(), 10);
        assert_eq!(queue.server_wait(Duration::from_millis(60_500)), Duration::from_secs(20));
        assert_eq!(queue.server_wait(Duration::from_millis(1_500)), Duration::from_secs(1));
        let empty = model();
        let start = tokio::time::Instant::now();
        assert!(empty.get_waiting(10, Duration::from_secs(30), Duration::from_secs(60)).await?.is_empty());
        assert_eq!(start.elapsed(), Duration::from_secs(20));
        assert_eq!((empty.delete_batch_limit(), empty.put_requests(&vec![0; 64 * 1024 + 1])), (10, 2));
        Ok(())
    }

    #[test]
    fn backends_parse_with_their_limits_and_prices() {
        for name in BACKENDS {
            assert_eq!(SimBackend::parse(name).unwrap().name(), *name);
        }
        let sqs = SimBackend::parse("sqs").unwrap();
        assert_eq!((sqs.get_batch(), sqs.delete_batch(), sqs.default_price_per_10k()), (10, 10, 0.004));
        assert_eq!((SimBackend::Azure.get_batch(), SimBackend::Azure.delete_batch()), (32, 1));
        assert_eq!(SimBackend::SqsFifo.default_price_per_10k(), 0.005);
        assert!(SimBackend::parse("kafka").unwrap_err().to_string().contains("azure, sqs, sqs-fifo"));
    }
}
