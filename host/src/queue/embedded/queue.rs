//! One queue of a store: checks each call's arguments and turns it into a change for the writer.

use std::sync::OnceLock;
use std::time::Duration;

use anyhow::anyhow;
use async_trait::async_trait;
use redb::ReadableDatabase;

use super::claims::ClaimRecord;
use super::ops::{Op, Reply};
use super::store::EmbeddedStore;
use super::tables::{CLAIM_PARTS, CLAIMS, COUNTS, QUEUES};
use crate::queue::{MAX_BATCH, MAX_VISIBILITY, Message, MessageId, PopReceipt, QueueClient, QueueError};

/// A visibility or delay in milliseconds, at most [`MAX_VISIBILITY`] (Azure's limit), so
/// adding it to a clock reading cannot overflow.
fn bounded_ms(duration: Duration) -> u64 {
    duration.min(MAX_VISIBILITY).as_millis() as u64
}

// Beside the queue it makes, so that the store's file needs nothing of this one.
impl EmbeddedStore {
    /// A handle on queue `name` (create it with [`QueueClient::create_if_missing`]).
    pub fn queue(&self, name: &str) -> EmbeddedQueue {
        EmbeddedQueue { store: self.clone(), name: name.to_string(), id: OnceLock::new() }
    }
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

/// Largest claim-check body the store keeps: its parts are numbered with a u32.
pub(crate) const MAX_CLAIM_BODY_BYTES: u64 = u32::MAX as u64 * super::bodies::PAGE_PART_BYTES as u64;

/// What a claim-check body read found.
#[derive(Debug)]
pub(crate) enum ClaimRead {
    /// No body under that key: never put, deleted, or swept.
    Missing,
    /// Its record says it is longer than the reader takes; nothing was read.
    TooLarge(u64),
    /// The stored bytes, exactly its recorded length; whether they are the bytes the
    /// reference names is the caller's check.
    Body(Vec<u8>),
    /// Its record or parts are damaged (the parts add up to another length).
    Damaged(String),
}

/// Claim-check bodies (large bodies offloaded from envelopes, `ebb::payload::claims`) kept
/// in this queue's store, apart from its messages.
impl EmbeddedQueue {
    /// Keeps `body` durably (committed before this returns) and gives its key.
    pub async fn put_claim(&self, body: bytes::Bytes) -> Result<u64, QueueError> {
        if body.len() as u64 > MAX_CLAIM_BODY_BYTES {
            return Err(QueueError::MessageTooLarge { size: body.len(), limit: MAX_CLAIM_BODY_BYTES as usize });
        }
        match self.store.call(Op::PutClaim { queue: self.id()?, now_ms: self.store.now_ms(), body }).await? {
            Reply::ClaimKey(key) => Ok(key),
            _ => unreachable!("a claim put replies with its key"),
        }
    }

    /// The body under `key`, if its record says it is at most `max_len` bytes long (a
    /// buffer of that length is reserved before anything is read).
    pub(crate) fn read_claim(&self, key: u64, max_len: u64) -> Result<ClaimRead, QueueError> {
        let queue = self.id()?;
        let db = self.store.database()?;
        let read = || -> anyhow::Result<ClaimRead> {
            let txn = db.begin_read()?;
            let records = txn.open_table(CLAIMS)?;
            let Some(record) = records.get((queue, key))? else {
                return Ok(ClaimRead::Missing);
            };
            let Some(record) = ClaimRecord::decode(record.value()) else {
                return Ok(ClaimRead::Damaged(format!("the record of claim body {key} does not decode")));
            };
            if record.len > max_len {
                return Ok(ClaimRead::TooLarge(record.len));
            }
            // Bounded by max_len above, which the caller bounds by its body limit.
            let mut body = Vec::with_capacity(record.len as usize);
            for part in txn.open_table(CLAIM_PARTS)?.range((queue, key, 0)..=(queue, key, u32::MAX))? {
                let (_, part) = part?;
                if (body.len() + part.value().len()) as u64 > record.len {
                    return Ok(ClaimRead::Damaged(format!("claim body {key} has more bytes than its recorded {}", record.len)));
                }
                body.extend_from_slice(part.value());
            }
            if body.len() as u64 != record.len {
                return Ok(ClaimRead::Damaged(format!("claim body {key} has {} bytes, its record says {}", body.len(), record.len)));
            }
            Ok(ClaimRead::Body(body))
        };
        read().map_err(QueueError::Fatal)
    }

    /// Deletes the body under `key` (nothing if there is none), durably.
    pub async fn delete_claim(&self, key: u64) -> Result<(), QueueError> {
        self.store.call(Op::DeleteClaim { queue: self.id()?, key }).await.map(drop)
    }

    /// Deletes every body of this queue put more than `older_than` ago (by the store's
    /// clock), durably; gives how many.
    pub async fn sweep_claims(&self, older_than: Duration) -> Result<u64, QueueError> {
        let before_ms = self.store.now_ms().saturating_sub(older_than.as_millis().min(u64::MAX as u128) as u64);
        // Most sweeps find nothing: a read costs no commit (no fsync, no pages written).
        if !self.has_claims_before(before_ms)? {
            return Ok(0);
        }
        match self.store.call(Op::SweepClaims { queue: self.id()?, before_ms }).await? {
            Reply::Swept(count) => Ok(count),
            _ => unreachable!("a sweep replies with a count"),
        }
    }

    /// Whether any body of this queue was put before `before_ms` (or has a damaged record).
    fn has_claims_before(&self, before_ms: u64) -> Result<bool, QueueError> {
        let queue = self.id()?;
        let db = self.store.database()?;
        let look = || -> anyhow::Result<bool> {
            let txn = db.begin_read()?;
            for entry in txn.open_table(CLAIMS)?.range((queue, 0)..=(queue, u64::MAX))? {
                if ClaimRecord::decode(entry?.1.value()).is_none_or(|r| r.put_at_ms < before_ms) {
                    return Ok(true);
                }
            }
            Ok(false)
        };
        look().map_err(QueueError::Fatal)
    }

    /// How many claim bodies this queue's store keeps.
    pub fn claim_count(&self) -> Result<u64, QueueError> {
        let queue = self.id()?;
        let db = self.store.database()?;
        let count = || -> anyhow::Result<u64> {
            let txn = db.begin_read()?;
            let mut count = 0;
            for entry in txn.open_table(CLAIMS)?.range((queue, 0)..=(queue, u64::MAX))? {
                entry?;
                count += 1;
            }
            Ok(count)
        };
        count().map_err(QueueError::Fatal)
    }
}
