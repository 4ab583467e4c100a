//! A queue (the memory queue unless a test names another) with hooks around its gets and
//! visibility updates: the listener tests
//! watch and disturb storage through it (a get that panics, fails or answers late, an update
//! that arrives late, a count that fails) instead of each writing its own forwarding queue.
//!
//! It does not forward `local_count`: like a remote queue, counting it is a call.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ebb::queue::memory::MemoryQueue;
use ebb::queue::{Message, MessageId, PopReceipt, QueueClient, QueueError};
use tokio::sync::Notify;

/// What a test does around the queue's calls; each hook does nothing unless overridden.
#[async_trait]
pub(crate) trait Hooks: Send + Sync + 'static {
    /// Before a get of up to `max` messages reaches the queue; an error fails the get.
    async fn before_get(&self, _max: u32) -> Result<(), QueueError> {
        Ok(())
    }
    /// Before a get that may wait `wait` for a message reaches the queue (a plain get
    /// waits zero); an error fails the get.
    async fn before_get_waiting(&self, max: u32, _wait: Duration) -> Result<(), QueueError> {
        self.before_get(max).await
    }
    /// How much of an idle wait the queue waits in a get (long polling): none unless
    /// overridden, as the memory queue.
    fn server_wait(&self, _idle: Duration) -> Duration {
        Duration::ZERO
    }
    /// After the queue answered a get, before the listener sees the answer.
    async fn after_get(&self, _got: &mut Result<Vec<Message>, QueueError>) {}
    /// Before a visibility update reaches the queue.
    async fn before_update(&self) {}
    /// Before a put of `body` reaches the queue; an error fails the put.
    async fn before_put(&self, _body: &[u8]) -> Result<(), QueueError> {
        Ok(())
    }
    /// Before a delete reaches the queue.
    async fn before_delete(&self, _id: &MessageId) {}
    /// Before a batch delete of `entries` reaches the queue (each entry then as a delete).
    async fn before_delete_batch(&self, _entries: usize) {}
    /// The most entries a batch delete takes in one request: 1 unless overridden (as the
    /// memory queue).
    fn delete_batch_limit(&self) -> usize {
        1
    }
    /// Before a batch update of `entries` reaches the queue (each entry then as an update).
    async fn before_update_batch(&self, _entries: usize) {}
    /// The most entries a batch update takes in one request: 1 unless overridden (as the
    /// memory queue).
    fn update_batch_limit(&self) -> usize {
        1
    }
    /// Before a count reaches the queue; an error fails the count.
    async fn before_count(&self) -> Result<(), QueueError> {
        Ok(())
    }
}

/// The queue `inner` behind `hooks`; the hooks' fields read through it.
pub(crate) struct Hooked<H, Q = MemoryQueue> {
    pub(crate) inner: Arc<Q>,
    pub(crate) hooks: H,
    /// Raised by each put, for gets that wait for a message.
    put_done: Notify,
}

impl<H> Hooked<H> {
    pub(crate) fn new(inner: impl Into<Arc<MemoryQueue>>, hooks: H) -> Arc<Self> {
        Hooked::around(inner.into(), hooks)
    }
}

impl<H, Q> Hooked<H, Q> {
    pub(crate) fn around(inner: Arc<Q>, hooks: H) -> Arc<Self> {
        Arc::new(Hooked { inner, hooks, put_done: Notify::new() })
    }
}

impl<H, Q> Deref for Hooked<H, Q> {
    type Target = H;
    fn deref(&self) -> &H {
        &self.hooks
    }
}

#[async_trait]
impl<H: Hooks, Q: QueueClient> QueueClient for Hooked<H, Q> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn create_if_missing(&self) -> Result<(), QueueError> {
        self.inner.create_if_missing().await
    }
    async fn put(&self, body: &[u8], delay: Duration) -> Result<MessageId, QueueError> {
        self.hooks.before_put(body).await?;
        let put = self.inner.put(body, delay).await;
        self.put_done.notify_waiters();
        put
    }
    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
        self.get_waiting(max, visibility, Duration::ZERO).await
    }
    fn server_wait(&self, idle: Duration) -> Duration {
        self.hooks.server_wait(idle)
    }
    /// Waits as a long poll does: answers when a put brings a message, or empty after
    /// `wait` (a delayed put is not waited for).
    async fn get_waiting(&self, max: u32, visibility: Duration, wait: Duration) -> Result<Vec<Message>, QueueError> {
        self.hooks.before_get_waiting(max, wait).await?;
        let deadline = tokio::time::Instant::now() + wait;
        let mut got = loop {
            let put_done = self.put_done.notified();
            tokio::pin!(put_done);
            put_done.as_mut().enable();
            let got = self.inner.get(max, visibility).await;
            if !matches!(&got, Ok(messages) if messages.is_empty()) || tokio::time::Instant::now() >= deadline {
                break got;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break got,
                _ = put_done => {}
            }
        };
        self.hooks.after_get(&mut got).await;
        got
    }
    async fn delete(&self, id: &MessageId, receipt: &PopReceipt) -> Result<(), QueueError> {
        self.hooks.before_delete(id).await;
        self.inner.delete(id, receipt).await
    }
    async fn delete_batch(&self, entries: &[(MessageId, PopReceipt)]) -> Vec<Result<(), QueueError>> {
        self.hooks.before_delete_batch(entries.len()).await;
        let mut results = Vec::with_capacity(entries.len());
        for (id, receipt) in entries {
            results.push(self.delete(id, receipt).await);
        }
        results
    }
    fn delete_batch_limit(&self) -> usize {
        self.hooks.delete_batch_limit()
    }
    async fn update_visibility(&self, id: &MessageId, receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError> {
        self.hooks.before_update().await;
        self.inner.update_visibility(id, receipt, visibility).await
    }
    async fn update_visibility_batch(&self, entries: &[(MessageId, PopReceipt)], visibility: Duration) -> Vec<Result<PopReceipt, QueueError>> {
        self.hooks.before_update_batch(entries.len()).await;
        let mut results = Vec::with_capacity(entries.len());
        for (id, receipt) in entries {
            results.push(self.update_visibility(id, receipt, visibility).await);
        }
        results
    }
    fn update_batch_limit(&self) -> usize {
        self.hooks.update_batch_limit()
    }
    async fn approximate_count(&self) -> Result<u64, QueueError> {
        self.hooks.before_count().await?;
        self.inner.approximate_count().await
    }
}
