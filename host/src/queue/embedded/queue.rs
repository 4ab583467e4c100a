//! One queue of a store: checks each call's arguments and turns it into a change for the writer.

use std::sync::OnceLock;
use std::time::Duration;

use anyhow::anyhow;
use async_trait::async_trait;
use redb::ReadableDatabase;

use super::changes::{Op, Reply};
use super::store::EmbeddedStore;
use super::tables::{COUNTS, QUEUES};
use crate::queue::{MAX_BATCH, MAX_VISIBILITY, Message, MessageId, PopReceipt, QueueClient, QueueError};

/// A visibility or delay in milliseconds, at most [`MAX_VISIBILITY`] (Azure's limit), so
/// adding it to a clock reading cannot overflow.
fn bounded_ms(duration: Duration) -> u64 {
    duration.min(MAX_VISIBILITY).as_millis() as u64
}

/// A header holds a body's length in 4 bytes: the limit whatever the options say.
const MAX_BODY_BYTES: usize = u32::MAX as usize;

/// One queue of an [`EmbeddedStore`].
pub struct EmbeddedQueue {
    pub(super) store: EmbeddedStore,
    pub(super) name: String,
    pub(super) id: OnceLock<u32>,
}

impl EmbeddedQueue {
    fn id(&self) -> Result<u32, QueueError> {
        if let Some(id) = self.id.get() {
            return Ok(*id);
        }
        let db = self.store.database()?;
        let lookup = || -> anyhow::Result<Option<u32>> {
            let txn = db.begin_read()?;
            Ok(txn.open_table(QUEUES)?.get(self.name.as_str())?.map(|v| v.value()))
        };
        match lookup().map_err(QueueError::Fatal)? {
            Some(id) => Ok(*self.id.get_or_init(|| id)),
            None => Err(QueueError::Fatal(anyhow!("queue {} does not exist in {}", self.name, self.store.dir().display()))),
        }
    }

    fn count(&self) -> Result<u64, QueueError> {
        let queue = self.id()?;
        let db = self.store.database()?;
        let read = || -> anyhow::Result<u64> {
            let txn = db.begin_read()?;
            Ok(txn.open_table(COUNTS)?.get(queue)?.map_or(0, |v| v.value()))
        };
        read().map_err(QueueError::Fatal)
    }
}

fn parse_id(id: &str) -> Result<u64, QueueError> {
    id.parse().map_err(|_| QueueError::StaleReceipt { id: id.into() })
}

fn parse_receipt(id: &str, receipt: &str) -> Result<u64, QueueError> {
    u64::from_str_radix(receipt, 16).map_err(|_| QueueError::StaleReceipt { id: id.into() })
}

#[async_trait]
impl QueueClient for EmbeddedQueue {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_if_missing(&self) -> Result<(), QueueError> {
        match self.store.call(Op::Create { name: self.name.clone() }).await? {
            Reply::QueueId(id) => {
                let _ = self.id.set(id);
                Ok(())
            }
            _ => unreachable!("create replies with the queue id"),
        }
    }

    async fn put(&self, body: &[u8], initial_visibility: Duration) -> Result<MessageId, QueueError> {
        let limit = self.store.shared.options.max_message_bytes.min(MAX_BODY_BYTES);
        if body.len() > limit {
            return Err(QueueError::MessageTooLarge { size: body.len(), limit });
        }
        let op = Op::Put { queue: self.id()?, now_ms: self.store.now_ms(), body: body.to_vec(), delay_ms: bounded_ms(initial_visibility) };
        match self.store.call(op).await? {
            Reply::Id(id) => Ok(MessageId::from(id)),
            _ => unreachable!("put replies with an id"),
        }
    }

    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
        if max == 0 || max > MAX_BATCH {
            return Err(QueueError::BadBatchSize(max));
        }
        let op = Op::Get { queue: self.id()?, now_ms: self.store.now_ms(), max, visibility_ms: bounded_ms(visibility) };
        match self.store.call(op).await? {
            Reply::Messages(messages) => Ok(messages),
            _ => unreachable!("get replies with messages"),
        }
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), QueueError> {
        let op = Op::Delete { queue: self.id()?, seq: parse_id(id)?, receipt: parse_receipt(id, pop_receipt)? };
        self.store.call(op).await.map(drop)
    }

    async fn update_visibility(&self, id: &MessageId, pop_receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError> {
        let op = Op::Update {
            queue: self.id()?,
            seq: parse_id(id)?,
            receipt: parse_receipt(id, pop_receipt)?,
            now_ms: self.store.now_ms(),
            visibility_ms: bounded_ms(visibility),
        };
        match self.store.call(op).await? {
            Reply::Receipt(receipt) => Ok(PopReceipt::from(receipt)),
            _ => unreachable!("update replies with a receipt"),
        }
    }

    async fn approximate_count(&self) -> Result<u64, QueueError> {
        self.count()
    }

    fn local_count(&self) -> Option<u64> {
        self.count().ok()
    }
}
