//! Retries transient errors with jittered exponential back-off, bounded.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use super::{Message, MessageId, PopReceipt, QueueClient, QueueError};

/// How transient errors are retried.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// Delay before the first retry; doubles with each retry, with ±50% jitter.
    pub base_delay: Duration,
    /// Cap on one delay.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { max_attempts: 5, base_delay: Duration::from_millis(100), max_delay: Duration::from_secs(5) }
    }
}

impl RetryPolicy {
    /// The delay before retry number `retry` (1 for the first retry).
    pub fn delay(&self, retry: u32) -> Duration {
        let exponential = self.base_delay.saturating_mul(1u32 << retry.saturating_sub(1).min(20));
        exponential.min(self.max_delay).mul_f64(0.5 + fastrand::f64())
    }
}

/// A backend whose transient errors are retried. `retries()` counts the retries made.
pub struct Retrying<Q> {
    inner: Q,
    policy: RetryPolicy,
    retries: Arc<AtomicU64>,
}

impl<Q: QueueClient> Retrying<Q> {
    /// Wraps `inner`.
    pub fn new(inner: Q, policy: RetryPolicy) -> Self {
        Retrying { inner, policy, retries: Arc::default() }
    }

    /// Retries made so far.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    async fn run<'a, T, F>(&'a self, what: &str, mut call: impl FnMut(&'a Q) -> F) -> Result<T, QueueError>
    where
        F: Future<Output = Result<T, QueueError>>,
    {
        let mut attempt = 1;
        loop {
            match call(&self.inner).await {
                Err(error) if error.is_transient() && attempt < self.policy.max_attempts => {
                    let delay = self.policy.delay(attempt);
                    tracing::debug!(queue = self.inner.name(), attempt, ?delay, "retrying {what} after: {error}");
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                result => return result,
            }
        }
    }
}

#[async_trait]
impl<Q: QueueClient> QueueClient for Retrying<Q> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn create_if_missing(&self) -> Result<(), QueueError> {
        self.run("create", |q| q.create_if_missing()).await
    }

    async fn put(&self, body: &[u8], initial_visibility: Duration) -> Result<MessageId, QueueError> {
        self.run("put", |q| q.put(body, initial_visibility)).await
    }

    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
        self.run("get", |q| q.get(max, visibility)).await
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), QueueError> {
        self.run("delete", |q| q.delete(id, pop_receipt)).await
    }

    async fn update_visibility(&self, id: &MessageId, pop_receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError> {
        self.run("update", |q| q.update_visibility(id, pop_receipt, visibility)).await
    }

    async fn approximate_count(&self) -> Result<u64, QueueError> {
        self.run("count", |q| q.approximate_count()).await
    }

    fn local_count(&self) -> Option<u64> {
        self.inner.local_count()
    }
}
