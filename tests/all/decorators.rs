//! The decorators that wrap any backend: retrying transient errors, metering transactions.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use ebb::queue::memory::MemoryQueue;
use ebb::queue::{Message, MessageId, Metered, PopReceipt, QueueClient, QueueError, RetryPolicy, Retrying, TokioClock};

/// Fails the next `failures` gets with the error `make` builds, then delegates.
struct Flaky {
    inner: MemoryQueue,
    failures: AtomicU32,
    calls: AtomicU32,
    make: fn() -> QueueError,
}

#[async_trait]
impl QueueClient for Flaky {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn create_if_missing(&self) -> Result<(), QueueError> {
        Ok(())
    }
    async fn put(&self, body: &[u8], delay: Duration) -> Result<MessageId, QueueError> {
        self.inner.put(body, delay).await
    }
    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.failures.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok() {
            return Err((self.make)());
        }
        self.inner.get(max, visibility).await
    }
    async fn delete(&self, id: &MessageId, receipt: &PopReceipt) -> Result<(), QueueError> {
        self.inner.delete(id, receipt).await
    }
    async fn update_visibility(&self, id: &MessageId, receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError> {
        self.inner.update_visibility(id, receipt, visibility).await
    }
    async fn approximate_count(&self) -> Result<u64, QueueError> {
        self.inner.approximate_count().await
    }
}

fn flaky(failures: u32, make: fn() -> QueueError) -> Flaky {
    Flaky { inner: MemoryQueue::new("flaky", Arc::new(TokioClock::new()), 65536), failures: AtomicU32::new(failures), calls: AtomicU32::new(0), make }
}

fn busy() -> QueueError {
    QueueError::Transient(anyhow::anyhow!("503 server busy"))
}

fn denied() -> QueueError {
    QueueError::Fatal(anyhow::anyhow!("403 authentication failed"))
}

const POLICY: RetryPolicy = RetryPolicy { max_attempts: 4, base_delay: Duration::from_millis(100), max_delay: Duration::from_secs(2) };

#[tokio::test(start_paused = true)]
async fn transient_errors_are_retried_with_growing_delays_and_counted() {
    let queue = Retrying::new(flaky(3, busy), POLICY);
    queue.put(b"m", Duration::ZERO).await.unwrap();
    let started = tokio::time::Instant::now();
    assert_eq!(queue.get(32, Duration::from_secs(30)).await.unwrap().len(), 1);
    assert_eq!(queue.retries(), 3);
    // 100, 200 and 400 ms, each ±50%: between 350 and 1050 ms in all.
    let waited = started.elapsed().as_millis();
    assert!((350..=1050).contains(&waited), "waited {waited} ms");
}

#[tokio::test(start_paused = true)]
async fn retries_are_bounded() {
    let queue = Retrying::new(flaky(10, busy), POLICY);
    let error = queue.get(32, Duration::from_secs(30)).await.unwrap_err();
    assert!(error.is_transient());
    assert_eq!(queue.retries(), 3, "max_attempts 4 = 1 try + 3 retries");
}

#[tokio::test(start_paused = true)]
async fn fatal_errors_are_not_retried() {
    let queue = Retrying::new(flaky(1, denied), POLICY);
    assert!(matches!(queue.get(32, Duration::from_secs(30)).await, Err(QueueError::Fatal(_))));
    assert_eq!(queue.retries(), 0);
}

#[tokio::test(start_paused = true)]
async fn every_attempt_is_metered_by_kind_and_by_whether_it_found_work() {
    // Metered inside Retrying: each attempt the storage answered is a billed transaction,
    // failed ones included (an attempt with no answer is counted apart).
    let metered = Metered::new(flaky(2, busy));
    let transactions = metered.transactions();
    let queue = Retrying::new(metered, POLICY);
    assert!(queue.get(32, Duration::from_secs(30)).await.unwrap().is_empty());
    queue.put(b"m", Duration::ZERO).await.unwrap();
    let got = queue.get(32, Duration::from_secs(30)).await.unwrap();
    queue.delete(&got[0].id, &got[0].pop_receipt).await.unwrap();
    queue.approximate_count().await.unwrap();
    let counts = transactions.snapshot();
    assert_eq!((counts.gets_empty, counts.gets_with_messages, counts.failed), (3, 1, 2), "{counts:?}");
    assert_eq!((counts.puts, counts.deletes, counts.counts), (1, 1, 1));
    assert_eq!(counts.total(), 7);
}
