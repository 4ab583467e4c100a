//! One logical queue over N partition queues (`<name>-0` … `<name>-(N-1)`), for throughput
//! beyond one queue's limit (Azure's target is 2,000 messages/s per queue). Puts go round
//! robin; each partition runs its own listener; this type serves the API and `ebb send`,
//! which see the logical queue. Its message ids carry the partition (`<index>:<id>`), so a
//! message taken from it can be deleted or updated through it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use super::{GroupedSend, Message, MessageId, PopReceipt, QueueClient, QueueError};

pub(crate) use crate::names::MAX_PARTITIONS;

/// A logical queue over partitions.
pub struct Partitioned {
    name: String,
    partitions: Vec<Arc<dyn QueueClient>>,
    next_put: AtomicUsize,
    next_get: AtomicUsize,
}

impl Partitioned {
    /// The logical queue `name` over `partitions` (at least one).
    pub fn new(name: &str, partitions: Vec<Arc<dyn QueueClient>>) -> Self {
        assert!(!partitions.is_empty(), "a partitioned queue needs a partition");
        Partitioned { name: name.to_string(), partitions, next_put: AtomicUsize::new(0), next_get: AtomicUsize::new(0) }
    }

    /// The partitions, in order.
    pub fn partitions(&self) -> &[Arc<dyn QueueClient>] {
        &self.partitions
    }

    fn next(&self, counter: &AtomicUsize) -> usize {
        counter.fetch_add(1, Ordering::Relaxed) % self.partitions.len()
    }

    /// The partition and the partition's own id of one of our ids.
    fn locate(&self, id: &MessageId) -> Result<(&Arc<dyn QueueClient>, MessageId), QueueError> {
        let stale = || QueueError::StaleReceipt { id: id.clone() };
        let (index, inner) = id.split_once(':').ok_or_else(stale)?;
        let index: usize = index.parse().map_err(|_| stale())?;
        let partition = self.partitions.get(index).ok_or_else(stale)?;
        Ok((partition, MessageId::from(inner)))
    }
}

/// The logical queue's id of message `id` of partition `index`: what a producer's send
/// answered.
pub(crate) fn tagged(index: usize, id: &MessageId) -> MessageId {
    MessageId::from(format!("{index}:{id}"))
}

#[async_trait]
impl QueueClient for Partitioned {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_if_missing(&self) -> Result<(), QueueError> {
        for partition in &self.partitions {
            partition.create_if_missing().await?;
        }
        Ok(())
    }

    async fn put(&self, body: &[u8], initial_visibility: Duration) -> Result<MessageId, QueueError> {
        let index = self.next(&self.next_put);
        let id = self.partitions[index].put(body, initial_visibility).await?;
        Ok(tagged(index, &id))
    }

    fn fifo(&self) -> bool {
        self.partitions.iter().any(|partition| partition.fifo())
    }

    /// A group's messages all go to one partition (chosen by the group id's hash), so its
    /// order is the one partition's order.
    async fn put_in_group(&self, body: &[u8], initial_visibility: Duration, send: &GroupedSend) -> Result<MessageId, QueueError> {
        use std::hash::{BuildHasher as _, BuildHasherDefault};
        let hash = BuildHasherDefault::<std::hash::DefaultHasher>::default().hash_one(&send.group);
        let index = (hash % self.partitions.len() as u64) as usize;
        let id = self.partitions[index].put_in_group(body, initial_visibility, send).await?;
        Ok(tagged(index, &id))
    }

    /// Up to `max` messages, from the partitions in turn (starting after the last one
    /// asked), in at most one pass.
    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
        if !(1..=super::MAX_BATCH).contains(&max) {
            return Err(QueueError::BadBatchSize(max));
        }
        let first = self.next(&self.next_get);
        let mut taken = Vec::new();
        for step in 0..self.partitions.len() {
            let wanted = max - taken.len() as u32;
            if wanted == 0 {
                break;
            }
            let index = (first + step) % self.partitions.len();
            for mut message in self.partitions[index].get(wanted, visibility).await? {
                message.id = tagged(index, &message.id);
                taken.push(message);
            }
        }
        Ok(taken)
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), QueueError> {
        let (partition, inner) = self.locate(id)?;
        partition.delete(&inner, pop_receipt).await
    }

    async fn update_visibility(&self, id: &MessageId, pop_receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError> {
        let (partition, inner) = self.locate(id)?;
        partition.update_visibility(&inner, pop_receipt, visibility).await
    }

    async fn approximate_count(&self) -> Result<u64, QueueError> {
        let mut total = 0u64;
        for partition in &self.partitions {
            total = total.saturating_add(partition.approximate_count().await?);
        }
        Ok(total)
    }

    fn local_count(&self) -> Option<u64> {
        self.partitions.iter().map(|p| p.local_count()).try_fold(0u64, |total, count| count.map(|c| total.saturating_add(c)))
    }

    fn call_records(&self) -> Vec<Arc<super::CallRecord>> {
        self.partitions.iter().flat_map(|p| p.call_records()).collect()
    }
}
