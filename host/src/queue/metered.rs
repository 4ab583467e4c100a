//! Counts storage transactions: every call to the backend, by kind and by whether it
//! returned work. These are what the paper's cost model bills (empty gets included).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

use super::{Message, MessageId, PopReceipt, QueueClient, QueueError};

/// Live counters, shared with whoever reports them.
#[derive(Debug, Default)]
pub struct Transactions {
    puts: AtomicU64,
    gets_with_messages: AtomicU64,
    gets_empty: AtomicU64,
    deletes: AtomicU64,
    updates: AtomicU64,
    counts: AtomicU64,
    creates: AtomicU64,
    failed: AtomicU64,
}

/// A snapshot of [`Transactions`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TransactionCounts {
    /// Puts.
    pub puts: u64,
    /// Gets that returned at least one message.
    pub gets_with_messages: u64,
    /// Gets that returned nothing: the idle transactions.
    pub gets_empty: u64,
    /// Deletes.
    pub deletes: u64,
    /// Visibility updates (releases and lease renewals).
    pub updates: u64,
    /// Approximate-count queries.
    pub counts: u64,
    /// Create-if-missing calls.
    pub creates: u64,
    /// Calls that failed (also counted under their kind: a failed call is still billed).
    pub failed: u64,
}

impl TransactionCounts {
    /// Every billed transaction.
    pub fn total(&self) -> u64 {
        self.puts + self.gets_with_messages + self.gets_empty + self.deletes + self.updates + self.counts + self.creates
    }
}

impl Transactions {
    /// The counts so far.
    pub fn snapshot(&self) -> TransactionCounts {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TransactionCounts {
            puts: load(&self.puts),
            gets_with_messages: load(&self.gets_with_messages),
            gets_empty: load(&self.gets_empty),
            deletes: load(&self.deletes),
            updates: load(&self.updates),
            counts: load(&self.counts),
            creates: load(&self.creates),
            failed: load(&self.failed),
        }
    }
}

/// A backend whose calls are counted.
pub struct Metered<Q> {
    inner: Q,
    transactions: Arc<Transactions>,
}

impl<Q: QueueClient> Metered<Q> {
    /// Wraps `inner`, counting into fresh counters.
    pub fn new(inner: Q) -> Self {
        Metered { inner, transactions: Arc::default() }
    }

    /// The live counters.
    pub fn transactions(&self) -> Arc<Transactions> {
        self.transactions.clone()
    }

    fn count<T>(&self, counter: &AtomicU64, result: Result<T, QueueError>) -> Result<T, QueueError> {
        counter.fetch_add(1, Ordering::Relaxed);
        if result.is_err() {
            self.transactions.failed.fetch_add(1, Ordering::Relaxed);
        }
        result
    }
}

#[async_trait]
impl<Q: QueueClient> QueueClient for Metered<Q> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn create_if_missing(&self) -> Result<(), QueueError> {
        let result = self.inner.create_if_missing().await;
        self.count(&self.transactions.creates, result)
    }

    async fn put(&self, body: &[u8], initial_visibility: Duration) -> Result<MessageId, QueueError> {
        let result = self.inner.put(body, initial_visibility).await;
        self.count(&self.transactions.puts, result)
    }

    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
        let result = self.inner.get(max, visibility).await;
        let counter = match &result {
            Ok(messages) if !messages.is_empty() => &self.transactions.gets_with_messages,
            _ => &self.transactions.gets_empty,
        };
        self.count(counter, result)
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), QueueError> {
        let result = self.inner.delete(id, pop_receipt).await;
        self.count(&self.transactions.deletes, result)
    }

    async fn update_visibility(&self, id: &MessageId, pop_receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError> {
        let result = self.inner.update_visibility(id, pop_receipt, visibility).await;
        self.count(&self.transactions.updates, result)
    }

    async fn approximate_count(&self) -> Result<u64, QueueError> {
        let result = self.inner.approximate_count().await;
        self.count(&self.transactions.counts, result)
    }

    fn local_count(&self) -> Option<u64> {
        // Free by definition: not a billed transaction, so not counted.
        self.inner.local_count()
    }
}
