//! A durable queue in a local data directory, on redb: nothing to install.
//!
//! Semantics follow Azure Storage Queues: a get leases messages for a visibility timeout
//! and issues a new pop receipt each time; a message whose lease ends becomes visible again
//! with its dequeue count kept; only the latest receipt can delete or update it.
//!
//! Layout: `messages (queue, seq) → header + body`, and an index `visible (queue,
//! visible_at_ms, seq)` so a get reads the oldest visible messages directly (roughly FIFO)
//! without walking leased or deleted ones. Every change is committed durably (fsync)
//! before it is acknowledged; one writer thread commits all changes that arrive while the
//! previous commit runs together (group commit), so concurrent puts and the deletes of a
//! batch share an fsync.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};
use async_trait::async_trait;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, Table, TableDefinition, WriteTransaction};
use tokio::sync::oneshot;

use super::clock::{Clock, SystemClock, system_time};
use super::{MAX_BATCH, Message, QueueClient, QueueError};

const QUEUES: TableDefinition<&str, u32> = TableDefinition::new("queues");
const MESSAGES: TableDefinition<(u32, u64), &[u8]> = TableDefinition::new("messages");
const VISIBLE: TableDefinition<(u32, u64, u64), ()> = TableDefinition::new("visible");
const COUNTS: TableDefinition<u32, u64> = TableDefinition::new("counts");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// Azure's message size limit, the default here too.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// Most changes committed together.
const MAX_GROUP: usize = 4096;
/// How long the writer waits for another request before committing what it has: small
/// next to an fsync (~150–250 µs here), long enough for requests sent together.
const GATHER_GAP: Duration = Duration::from_micros(20);

/// Options of an embedded store.
#[derive(Clone)]
pub struct EmbeddedOptions {
    /// Largest body accepted, in bytes.
    pub max_message_bytes: usize,
    /// The clock visibility timeouts run on.
    pub clock: Arc<dyn Clock>,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions { max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES, clock: Arc::new(SystemClock) }
    }
}

/// A data directory holding any number of queues. One process owns it at a time.
#[derive(Clone)]
pub struct EmbeddedStore {
    shared: Arc<Shared>,
}

struct Shared {
    dir: PathBuf,
    db: Arc<Database>,
    writer: Option<mpsc::Sender<Request>>,
    writer_thread: Option<std::thread::JoinHandle<()>>,
    options: EmbeddedOptions,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Close the channel, then wait for the last commit, so the file is released on return.
        self.writer.take();
        if let Some(thread) = self.writer_thread.take() {
            let _ = thread.join();
        }
    }
}

impl EmbeddedStore {
    /// Opens (creating if needed) the store in `dir`.
    pub fn open(dir: &Path, options: EmbeddedOptions) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("failed to create data directory {}", dir.display()))?;
        let file = dir.join("queues.redb");
        let db = match Database::create(&file) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                anyhow::bail!("data directory {} is in use by another ebb process (one process owns a data directory)", dir.display())
            }
            Err(e) => return Err(anyhow!(e)).with_context(|| format!("failed to open queue store {}", file.display())),
        };
        let db = Arc::new(db);
        let txn = db.begin_write()?;
        txn.open_table(QUEUES)?;
        txn.open_table(MESSAGES)?;
        txn.open_table(VISIBLE)?;
        txn.open_table(COUNTS)?;
        let next_seq = txn.open_table(META)?.get("next_seq")?.map_or(1, |v| v.value());
        txn.commit()?;
        let (sender, requests) = mpsc::channel();
        let writer = Writer { db: db.clone(), next_seq };
        let thread = std::thread::Builder::new()
            .name("ebb-queue-writer".into())
            .spawn(move || writer.run(requests))
            .context("failed to start the queue writer")?;
        Ok(EmbeddedStore {
            shared: Arc::new(Shared {
                dir: dir.to_path_buf(),
                db,
                writer: Some(sender),
                writer_thread: Some(thread),
                options,
            }),
        })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// A handle on queue `name` (create it with [`QueueClient::create_if_missing`]).
    pub fn queue(&self, name: &str) -> EmbeddedQueue {
        EmbeddedQueue { store: self.clone(), name: name.to_string(), id: OnceLock::new() }
    }

    async fn call(&self, op: Op) -> Result<Reply, QueueError> {
        let (reply, receive) = oneshot::channel();
        self.shared
            .writer
            .as_ref()
            .ok_or_else(|| QueueError::Fatal(anyhow!("the queue store is closed")))?
            .send(Request { op, reply })
            .map_err(|_| QueueError::Fatal(anyhow!("the queue writer has stopped")))?;
        receive.await.map_err(|_| QueueError::Fatal(anyhow!("the queue writer has stopped")))?
    }

    fn now_ms(&self) -> u64 {
        self.shared.options.clock.now_ms()
    }
}

/// One queue of an [`EmbeddedStore`].
pub struct EmbeddedQueue {
    store: EmbeddedStore,
    name: String,
    id: OnceLock<u32>,
}

impl EmbeddedQueue {
    fn id(&self) -> Result<u32, QueueError> {
        if let Some(id) = self.id.get() {
            return Ok(*id);
        }
        let lookup = || -> anyhow::Result<Option<u32>> {
            let txn = self.store.shared.db.begin_read()?;
            Ok(txn.open_table(QUEUES)?.get(self.name.as_str())?.map(|v| v.value()))
        };
        match lookup().map_err(QueueError::Fatal)? {
            Some(id) => Ok(*self.id.get_or_init(|| id)),
            None => Err(QueueError::Fatal(anyhow!("queue {} does not exist in {}", self.name, self.store.dir().display()))),
        }
    }
}

fn parse_id(id: &str) -> Result<u64, QueueError> {
    id.parse().map_err(|_| QueueError::StaleReceipt { id: id.to_string() })
}

fn parse_receipt(id: &str, receipt: &str) -> Result<u64, QueueError> {
    u64::from_str_radix(receipt, 16).map_err(|_| QueueError::StaleReceipt { id: id.to_string() })
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

    async fn put(&self, body: &[u8], initial_visibility: Duration) -> Result<String, QueueError> {
        let limit = self.store.shared.options.max_message_bytes;
        if body.len() > limit {
            return Err(QueueError::MessageTooLarge { size: body.len(), limit });
        }
        let op = Op::Put { queue: self.id()?, now_ms: self.store.now_ms(), body: body.to_vec(), delay_ms: initial_visibility.as_millis() as u64 };
        match self.store.call(op).await? {
            Reply::Id(id) => Ok(id),
            _ => unreachable!("put replies with an id"),
        }
    }

    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
        if max == 0 || max > MAX_BATCH {
            return Err(QueueError::BadBatchSize(max));
        }
        let op = Op::Get { queue: self.id()?, now_ms: self.store.now_ms(), max, visibility_ms: visibility.as_millis() as u64 };
        match self.store.call(op).await? {
            Reply::Messages(messages) => Ok(messages),
            _ => unreachable!("get replies with messages"),
        }
    }

    async fn delete(&self, id: &str, pop_receipt: &str) -> Result<(), QueueError> {
        let op = Op::Delete { queue: self.id()?, seq: parse_id(id)?, receipt: parse_receipt(id, pop_receipt)? };
        self.store.call(op).await.map(drop)
    }

    async fn update_visibility(&self, id: &str, pop_receipt: &str, visibility: Duration) -> Result<String, QueueError> {
        let op = Op::Update {
            queue: self.id()?,
            seq: parse_id(id)?,
            receipt: parse_receipt(id, pop_receipt)?,
            now_ms: self.store.now_ms(),
            visibility_ms: visibility.as_millis() as u64,
        };
        match self.store.call(op).await? {
            Reply::Receipt(receipt) => Ok(receipt),
            _ => unreachable!("update replies with a receipt"),
        }
    }

    async fn approximate_count(&self) -> Result<u64, QueueError> {
        let queue = self.id()?;
        let read = || -> anyhow::Result<u64> {
            let txn = self.store.shared.db.begin_read()?;
            Ok(txn.open_table(COUNTS)?.get(queue)?.map_or(0, |v| v.value()))
        };
        read().map_err(QueueError::Fatal)
    }
}

// ---- the writer ----

/// A change, carrying the caller's clock reading (the writer thread has no tokio clock).
enum Op {
    Create { name: String },
    Put { queue: u32, now_ms: u64, body: Vec<u8>, delay_ms: u64 },
    Get { queue: u32, now_ms: u64, max: u32, visibility_ms: u64 },
    Delete { queue: u32, seq: u64, receipt: u64 },
    Update { queue: u32, seq: u64, receipt: u64, now_ms: u64, visibility_ms: u64 },
}

enum Reply {
    QueueId(u32),
    Id(String),
    Messages(Vec<Message>),
    Deleted,
    Receipt(String),
}

struct Request {
    op: Op,
    reply: oneshot::Sender<Result<Reply, QueueError>>,
}

struct Writer {
    db: Arc<Database>,
    next_seq: u64,
}

/// The message header stored before the body.
struct Header {
    visible_at_ms: u64,
    inserted_at_ms: u64,
    receipt: u64,
    dequeue_count: u32,
}

const HEADER_BYTES: usize = 28;

impl Header {
    fn encode(&self, body: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
        bytes.extend_from_slice(&self.visible_at_ms.to_le_bytes());
        bytes.extend_from_slice(&self.inserted_at_ms.to_le_bytes());
        bytes.extend_from_slice(&self.receipt.to_le_bytes());
        bytes.extend_from_slice(&self.dequeue_count.to_le_bytes());
        bytes.extend_from_slice(body);
        bytes
    }

    fn decode(bytes: &[u8]) -> Header {
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        Header {
            visible_at_ms: u64_at(0),
            inserted_at_ms: u64_at(8),
            receipt: u64_at(16),
            dequeue_count: u32::from_le_bytes(bytes[24..28].try_into().unwrap()),
        }
    }
}

struct Tables<'t> {
    queues: Table<'t, &'static str, u32>,
    messages: Table<'t, (u32, u64), &'static [u8]>,
    visible: Table<'t, (u32, u64, u64), ()>,
    counts: Table<'t, u32, u64>,
}

fn storage(error: impl Into<anyhow::Error>) -> QueueError {
    QueueError::Fatal(error.into())
}

impl Writer {
    fn run(mut self, requests: mpsc::Receiver<Request>) {
        while let Ok(first) = requests.recv() {
            let mut group = vec![first];
            // Requests sent together (a batch's deletes, concurrent puts) arrive microseconds
            // apart: keep collecting while they do, so one fsync carries them all.
            let mut last_arrival = Instant::now();
            while group.len() < MAX_GROUP && last_arrival.elapsed() < GATHER_GAP {
                match requests.try_recv() {
                    Ok(request) => {
                        group.push(request);
                        last_arrival = Instant::now();
                    }
                    Err(mpsc::TryRecvError::Empty) => std::hint::spin_loop(),
                    Err(mpsc::TryRecvError::Disconnected) => break,
                }
            }
            let (ops, replies): (Vec<Op>, Vec<_>) = group.into_iter().map(|r| (r.op, r.reply)).unzip();
            let results = match self.commit(ops) {
                Ok(results) => results,
                Err(error) => {
                    let message = format!("{error:#}");
                    tracing::error!("queue store commit failed: {message}");
                    replies.iter().map(|_| Err(QueueError::Transient(anyhow!("commit failed: {message}")))).collect()
                }
            };
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result);
            }
        }
    }

    /// Applies every op in one transaction and commits it durably. An op that fails
    /// (stale receipt) changes nothing and gets its error; the others still commit.
    fn commit(&mut self, ops: Vec<Op>) -> anyhow::Result<Vec<Result<Reply, QueueError>>> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        let mut next_seq = self.next_seq;
        let results = {
            let mut tables = open_tables(&txn)?;
            ops.into_iter().map(|op| apply(&mut tables, op, &mut next_seq)).collect::<Vec<_>>()
        };
        if next_seq != self.next_seq {
            txn.open_table(META)?.insert("next_seq", next_seq)?;
        }
        txn.commit()?;
        self.next_seq = next_seq;
        Ok(results)
    }
}

fn open_tables(txn: &WriteTransaction) -> anyhow::Result<Tables<'_>> {
    Ok(Tables {
        queues: txn.open_table(QUEUES)?,
        messages: txn.open_table(MESSAGES)?,
        visible: txn.open_table(VISIBLE)?,
        counts: txn.open_table(COUNTS)?,
    })
}

fn apply(t: &mut Tables<'_>, op: Op, next_seq: &mut u64) -> Result<Reply, QueueError> {
    match op {
        Op::Create { name } => {
            if let Some(id) = t.queues.get(name.as_str()).map_err(storage)? {
                return Ok(Reply::QueueId(id.value()));
            }
            let id = t.queues.len().map_err(storage)? as u32 + 1;
            t.queues.insert(name.as_str(), id).map_err(storage)?;
            Ok(Reply::QueueId(id))
        }
        Op::Put { queue, now_ms, body, delay_ms } => {
            let seq = *next_seq;
            *next_seq += 1;
            let visible_at_ms = now_ms + delay_ms;
            let header = Header { visible_at_ms, inserted_at_ms: now_ms, receipt: 0, dequeue_count: 0 };
            t.messages.insert((queue, seq), header.encode(&body).as_slice()).map_err(storage)?;
            t.visible.insert((queue, visible_at_ms, seq), ()).map_err(storage)?;
            add_count(&mut t.counts, queue, 1)?;
            Ok(Reply::Id(seq.to_string()))
        }
        Op::Get { queue, now_ms, max, visibility_ms } => {
            let due: Vec<(u64, u64)> = t
                .visible
                .range((queue, 0, 0)..=(queue, now_ms, u64::MAX))
                .map_err(storage)?
                .take(max as usize)
                .map(|entry| entry.map(|(key, _)| (key.value().1, key.value().2)))
                .collect::<Result<_, _>>()
                .map_err(storage)?;
            let mut leased = Vec::with_capacity(due.len());
            for (visible_at_ms, seq) in due {
                t.visible.remove((queue, visible_at_ms, seq)).map_err(storage)?;
                let stored = t.messages.get((queue, seq)).map_err(storage)?.ok_or_else(|| storage(anyhow!("index names missing message {seq}")))?.value().to_vec();
                let old = Header::decode(&stored);
                let header = Header {
                    visible_at_ms: now_ms + visibility_ms,
                    inserted_at_ms: old.inserted_at_ms,
                    receipt: new_receipt(old.receipt),
                    dequeue_count: old.dequeue_count + 1,
                };
                let body = &stored[HEADER_BYTES..];
                t.messages.insert((queue, seq), header.encode(body).as_slice()).map_err(storage)?;
                t.visible.insert((queue, header.visible_at_ms, seq), ()).map_err(storage)?;
                leased.push(Message {
                    id: seq.to_string(),
                    pop_receipt: format!("{:016x}", header.receipt),
                    dequeue_count: header.dequeue_count,
                    inserted_at: system_time(header.inserted_at_ms),
                    next_visible_at: system_time(header.visible_at_ms),
                    body: body.to_vec(),
                });
            }
            Ok(Reply::Messages(leased))
        }
        Op::Delete { queue, seq, receipt } => {
            let header = leased_header(t, queue, seq, receipt)?;
            t.messages.remove((queue, seq)).map_err(storage)?;
            t.visible.remove((queue, header.visible_at_ms, seq)).map_err(storage)?;
            add_count(&mut t.counts, queue, -1)?;
            Ok(Reply::Deleted)
        }
        Op::Update { queue, seq, receipt, now_ms, visibility_ms } => {
            let header = leased_header(t, queue, seq, receipt)?;
            let stored = t.messages.get((queue, seq)).map_err(storage)?.map(|v| v.value().to_vec()).ok_or_else(|| QueueError::StaleReceipt { id: seq.to_string() })?;
            t.visible.remove((queue, header.visible_at_ms, seq)).map_err(storage)?;
            let updated = Header { visible_at_ms: now_ms + visibility_ms, receipt: new_receipt(receipt), ..header };
            t.messages.insert((queue, seq), updated.encode(&stored[HEADER_BYTES..]).as_slice()).map_err(storage)?;
            t.visible.insert((queue, updated.visible_at_ms, seq), ()).map_err(storage)?;
            Ok(Reply::Receipt(format!("{:016x}", updated.receipt)))
        }
    }
}

/// The header of a message whose current receipt is `receipt`, or a stale-receipt error.
fn leased_header(t: &Tables<'_>, queue: u32, seq: u64, receipt: u64) -> Result<Header, QueueError> {
    let stale = || QueueError::StaleReceipt { id: seq.to_string() };
    let stored = t.messages.get((queue, seq)).map_err(storage)?.ok_or_else(stale)?;
    let header = Header::decode(stored.value());
    if header.receipt != receipt || receipt == 0 {
        return Err(stale());
    }
    Ok(header)
}

fn new_receipt(previous: u64) -> u64 {
    loop {
        let receipt = fastrand::u64(1..);
        if receipt != previous {
            return receipt;
        }
    }
}

fn add_count(counts: &mut Table<'_, u32, u64>, queue: u32, delta: i64) -> Result<(), QueueError> {
    let current = counts.get(queue).map_err(storage)?.map_or(0, |v| v.value());
    counts.insert(queue, current.saturating_add_signed(delta)).map_err(storage)?;
    Ok(())
}
