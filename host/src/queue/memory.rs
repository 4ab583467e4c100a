//! An in-memory queue with the embedded queue's semantics, for simulations and tests under
//! tokio's paused clock (no thread, no disk: every call completes at once). Not durable.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use super::clock::{Clock, system_time};
use super::{MAX_BATCH, MAX_VISIBILITY, Message, MessageId, PopReceipt, QueueClient, QueueError};

#[derive(Default)]
struct State {
    next_seq: u64,
    messages: HashMap<u64, Stored>,
    /// (visible_at_ms, seq), like the embedded store's index.
    visible: BTreeSet<(u64, u64)>,
}

struct Stored {
    visible_at_ms: u64,
    inserted_at_ms: u64,
    receipt: u64,
    dequeue_count: u32,
    /// Shared with every lease's message, not copied into each.
    body: Bytes,
}

/// One in-memory queue.
pub struct MemoryQueue {
    name: String,
    clock: Arc<dyn Clock>,
    max_message_bytes: usize,
    state: Mutex<State>,
}

impl MemoryQueue {
    /// An empty queue on `clock`.
    pub fn new(name: &str, clock: Arc<dyn Clock>, max_message_bytes: usize) -> Self {
        MemoryQueue { name: name.to_string(), clock, max_message_bytes, state: Mutex::default() }
    }

    fn leased(state: &State, id: &str, receipt: &str) -> Result<u64, QueueError> {
        let stale = || QueueError::StaleReceipt { id: id.into() };
        let seq: u64 = id.parse().map_err(|_| stale())?;
        let receipt = u64::from_str_radix(receipt, 16).map_err(|_| stale())?;
        match state.messages.get(&seq) {
            Some(stored) if stored.receipt == receipt && receipt != 0 => Ok(seq),
            _ => Err(stale()),
        }
    }
}

#[async_trait]
impl QueueClient for MemoryQueue {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_if_missing(&self) -> Result<(), QueueError> {
        Ok(())
    }

    async fn put(&self, body: &[u8], initial_visibility: Duration) -> Result<MessageId, QueueError> {
        if body.len() > self.max_message_bytes {
            return Err(QueueError::MessageTooLarge { size: body.len(), limit: self.max_message_bytes });
        }
        let now = self.clock.now_ms();
        let mut state = self.state.lock().unwrap();
        state.next_seq += 1;
        let seq = state.next_seq;
        let visible_at_ms = now.saturating_add(initial_visibility.min(MAX_VISIBILITY).as_millis() as u64);
        state.messages.insert(seq, Stored { visible_at_ms, inserted_at_ms: now, receipt: 0, dequeue_count: 0, body: Bytes::copy_from_slice(body) });
        state.visible.insert((visible_at_ms, seq));
        Ok(seq.to_string().into())
    }

    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
        if max == 0 || max > MAX_BATCH {
            return Err(QueueError::BadBatchSize(max));
        }
        let now = self.clock.now_ms();
        let mut state = self.state.lock().unwrap();
        let due: Vec<(u64, u64)> = state.visible.range(..=(now, u64::MAX)).take(max as usize).copied().collect();
        let mut leased = Vec::with_capacity(due.len());
        for key in due {
            state.visible.remove(&key);
            let stored = state.messages.get_mut(&key.1).expect("the index names stored messages");
            stored.visible_at_ms = now.saturating_add(visibility.min(MAX_VISIBILITY).as_millis() as u64);
            stored.receipt = fastrand::u64(1..);
            stored.dequeue_count = stored.dequeue_count.saturating_add(1);
            leased.push(Message {
                id: key.1.to_string().into(),
                pop_receipt: format!("{:016x}", stored.receipt).into(),
                dequeue_count: stored.dequeue_count,
                inserted_at: system_time(stored.inserted_at_ms),
                next_visible_at: system_time(stored.visible_at_ms),
                body: stored.body.clone(),
                defect: None,
                fifo: None,
                trace: None,
            });
            let visible_at = stored.visible_at_ms;
            state.visible.insert((visible_at, key.1));
        }
        Ok(leased)
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), QueueError> {
        let mut state = self.state.lock().unwrap();
        let seq = Self::leased(&state, id, pop_receipt)?;
        let stored = state.messages.remove(&seq).expect("checked above");
        state.visible.remove(&(stored.visible_at_ms, seq));
        Ok(())
    }

    async fn update_visibility(&self, id: &MessageId, pop_receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError> {
        let now = self.clock.now_ms();
        let mut state = self.state.lock().unwrap();
        let seq = Self::leased(&state, id, pop_receipt)?;
        let stored = state.messages.get_mut(&seq).expect("checked above");
        let old = (stored.visible_at_ms, seq);
        stored.visible_at_ms = now.saturating_add(visibility.min(MAX_VISIBILITY).as_millis() as u64);
        stored.receipt = fastrand::u64(1..);
        let (new, receipt) = ((stored.visible_at_ms, seq), stored.receipt);
        state.visible.remove(&old);
        state.visible.insert(new);
        Ok(format!("{receipt:016x}").into())
    }

    async fn approximate_count(&self) -> Result<u64, QueueError> {
        Ok(self.state.lock().unwrap().messages.len() as u64)
    }

    fn local_count(&self) -> Option<u64> {
        Some(self.state.lock().unwrap().messages.len() as u64)
    }
}
