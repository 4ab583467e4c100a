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
//!
//! Failures: each body carries a CRC-32 checksum; a body that fails it is delivered with a
//! [`Message::defect`] (the listener poisons it, never hands it to the handler). A commit
//! that fails (an I/O error leaves redb refusing every later call) makes the writer reopen
//! the database; if it cannot, the store reports the problem in [`Health`] once, answers
//! every call with a transient "unavailable" error, and keeps trying to reopen.

use std::io::ErrorKind;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};
use async_trait::async_trait;
use redb::{
    Database, DatabaseError, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, StorageBackend, StorageError, Table, TableDefinition,
    WriteTransaction,
};
use tokio::sync::oneshot;

use super::clock::{Clock, SystemClock, system_time};
use super::{MAX_BATCH, MAX_VISIBILITY, Message, MessageId, PopReceipt, QueueClient, QueueError};
use crate::health::Health;
use crate::log_limit::LogLimiter;
use crate::panics::{panic_message, quietly};

const QUEUES: TableDefinition<&str, u32> = TableDefinition::new("queues");
const MESSAGES: TableDefinition<(u32, u64), &[u8]> = TableDefinition::new("messages");
const VISIBLE: TableDefinition<(u32, u64, u64), ()> = TableDefinition::new("visible");
const COUNTS: TableDefinition<u32, u64> = TableDefinition::new("counts");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The store's file in its data directory.
pub const STORE_FILE: &str = "queues.redb";
/// Record format: 1 had no body checksum (its records are migrated at open), 2 has one.
const FORMAT: u64 = 2;
/// Azure's message size limit, the default here too.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// Most changes committed together.
const MAX_GROUP: usize = 4096;
/// How long the writer waits for another request before committing what it has: small
/// next to an fsync (~150–250 µs here), long enough for requests sent together.
const GATHER_GAP: Duration = Duration::from_micros(20);
/// Pauses between the reopen attempts right after a failed commit.
const REOPEN_PAUSES: [Duration; 3] = [Duration::ZERO, Duration::from_millis(50), Duration::from_millis(250)];
/// While the store is unavailable, how often the writer tries to reopen it.
const REOPEN_INTERVAL: Duration = Duration::from_secs(1);
/// Consecutive failed commits after which the host reports itself unhealthy even though
/// each reopen succeeded (a full disk).
const FAILED_COMMITS_UNHEALTHY: u32 = 3;
/// Commit failures logged per minute; the rest are counted in the next line.
/// Lines per minute about failing commits and reopens: a full disk fails every commit.
const STORAGE_LOG_LINES: u32 = 5;
/// Successful commits in a row after which a store that kept failing is healthy again
/// (a nearly full disk lets small commits through between failures).
const COMMITS_TO_RECOVER: u32 = 3;

/// Options of an embedded store.
#[derive(Clone)]
pub struct EmbeddedOptions {
    /// Largest body accepted, in bytes.
    pub max_message_bytes: usize,
    /// The clock visibility timeouts run on.
    pub clock: Arc<dyn Clock>,
    /// Where the store reports that it cannot work (it cannot be reopened, commits fail).
    pub health: Health,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions { max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES, clock: Arc::new(SystemClock), health: Health::default() }
    }
}

/// Opens the database: at start, and again after a failed commit.
type Opener = Arc<dyn Fn() -> Result<Database, DatabaseError> + Send + Sync>;
/// The open database, shared by the writer and readers; `None` while it is being reopened
/// or cannot be.
type DatabaseSlot = Arc<RwLock<Option<Arc<Database>>>>;

/// A data directory holding any number of queues. One process owns it at a time.
#[derive(Clone)]
pub struct EmbeddedStore {
    shared: Arc<Shared>,
}

struct Shared {
    dir: PathBuf,
    file: PathBuf,
    db: DatabaseSlot,
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
        let file = dir.join(STORE_FILE);
        Self::open_with(dir, options, Arc::new(move || Database::create(&file)))
    }

    /// Opens (creating if needed) the store in `dir` on a storage backend of the caller's:
    /// `make_backend` gets the store file's path at each open (the first, and reopens after
    /// a failed commit). For other media, and for injecting faults in tests.
    pub fn open_with_backend<B: StorageBackend>(
        dir: &Path,
        options: EmbeddedOptions,
        make_backend: impl Fn(&Path) -> std::io::Result<B> + Send + Sync + 'static,
    ) -> anyhow::Result<Self> {
        let file = dir.join(STORE_FILE);
        Self::open_with(dir, options, Arc::new(move || Database::builder().create_with_backend(make_backend(&file)?)))
    }

    fn open_with(dir: &Path, options: EmbeddedOptions, opener: Opener) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("failed to create data directory {}", dir.display()))?;
        let file = dir.join(STORE_FILE);
        let (db, next_seq) = open_database(&opener, &file)?;
        let slot: DatabaseSlot = Arc::new(RwLock::new(Some(db.clone())));
        let (sender, requests) = mpsc::channel();
        let writer = Writer {
            slot: slot.clone(),
            db: Some(db),
            opener,
            file: file.clone(),
            next_seq,
            health: options.health.clone(),
            next_reopen: Instant::now(),
            failed_commits: 0,
            good_commits: 0,
            log: LogLimiter::new(STORAGE_LOG_LINES, Duration::from_secs(60)),
        };
        // The writer logs where the store was opened would (a test's or a command's subscriber).
        let dispatch = tracing::dispatcher::get_default(Clone::clone);
        let thread = std::thread::Builder::new()
            .name("ebb-queue-writer".into())
            .spawn(move || tracing::dispatcher::with_default(&dispatch, || writer.run(requests)))
            .context("failed to start the queue writer")?;
        Ok(EmbeddedStore { shared: Arc::new(Shared { dir: dir.to_path_buf(), file, db: slot, writer: Some(sender), writer_thread: Some(thread), options }) })
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

    /// The open database for a read, or a transient error while it is being reopened.
    fn database(&self) -> Result<Arc<Database>, QueueError> {
        let slot = self.shared.db.read().unwrap_or_else(PoisonError::into_inner);
        slot.clone().ok_or_else(|| QueueError::Transient(anyhow!("queue store {} is unavailable: reopening after a storage error", self.shared.file.display())))
    }

    fn now_ms(&self) -> u64 {
        self.shared.options.clock.now_ms()
    }
}

/// A visibility or delay in milliseconds, at most [`MAX_VISIBILITY`] (Azure's limit), so
/// adding it to a clock reading cannot overflow.
fn bounded_ms(duration: Duration) -> u64 {
    duration.min(MAX_VISIBILITY).as_millis() as u64
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
        let limit = self.store.shared.options.max_message_bytes;
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

// ---- opening ----

/// Opens the database and prepares it (tables, record format), naming the file and what
/// to do when it cannot. A damaged file can make redb panic: that is an error here too.
fn open_database(opener: &Opener, file: &Path) -> anyhow::Result<(Arc<Database>, u64)> {
    let opened = match quietly(|| opener()) {
        Ok(opened) => opened,
        Err(panic) => return Err(anyhow!("reading it failed: {}", panic_message(&*panic))).with_context(|| damaged(file)),
    };
    let db = match opened {
        Ok(db) => db,
        Err(DatabaseError::DatabaseAlreadyOpen) => {
            anyhow::bail!("data directory {} is in use by another ebb process (one process owns a data directory)", file.parent().unwrap_or(file).display())
        }
        // redb reports some damage (a wrong magic number) as invalid data.
        Err(DatabaseError::Storage(StorageError::Io(error))) if matches!(error.kind(), ErrorKind::InvalidData | ErrorKind::UnexpectedEof) => {
            return Err(anyhow!(error)).with_context(|| damaged(file));
        }
        Err(DatabaseError::Storage(StorageError::Io(error))) => {
            return Err(anyhow!(error)).with_context(|| format!("failed to open queue store {}", file.display()));
        }
        Err(error) => return Err(anyhow!(error)).with_context(|| damaged(file)),
    };
    let next_seq = match quietly(|| prepare(&db)) {
        Ok(prepared) => prepared.with_context(|| format!("failed to prepare queue store {}", file.display()))?,
        Err(panic) => return Err(anyhow!("reading it failed: {}", panic_message(&*panic))).with_context(|| damaged(file)),
    };
    Ok((Arc::new(db), next_seq))
}

fn damaged(file: &Path) -> String {
    format!(
        "queue store {} is damaged and cannot be opened; stop ebb, move the file aside (keep it for recovery) \
         and start again with an empty store, or restore it from a backup",
        file.display()
    )
}

/// Creates the tables, migrates records to the current format, and returns the next sequence number.
fn prepare(db: &Database) -> anyhow::Result<u64> {
    let txn = db.begin_write()?;
    txn.open_table(QUEUES)?;
    txn.open_table(VISIBLE)?;
    txn.open_table(COUNTS)?;
    let next_seq;
    {
        let mut meta = txn.open_table(META)?;
        next_seq = meta.get("next_seq")?.map_or(1, |v| v.value());
        let format = meta.get("format")?.map(|v| v.value());
        match format {
            Some(FORMAT) => {}
            Some(newer) if newer > FORMAT => anyhow::bail!("its records are in format {newer}, written by a newer ebb (this one reads up to {FORMAT})"),
            _ => {
                add_checksums(&mut txn.open_table(MESSAGES)?)?;
                meta.insert("format", FORMAT)?;
            }
        }
    }
    txn.commit()?;
    Ok(next_seq)
}

/// Rewrites format-1 records (a 28-byte header, no checksum) with a checksum of their body.
fn add_checksums(messages: &mut Table<'_, (u32, u64), &'static [u8]>) -> anyhow::Result<()> {
    const OLD_HEADER_BYTES: usize = 28;
    let mut rewritten = Vec::new();
    for entry in messages.iter()? {
        let (key, value) = entry?;
        let old = value.value();
        // A record too short for the old header stays as it is: a get reports it corrupt.
        if old.len() >= OLD_HEADER_BYTES {
            let body = &old[OLD_HEADER_BYTES..];
            let mut record = Vec::with_capacity(HEADER_BYTES + body.len());
            record.extend_from_slice(&old[..OLD_HEADER_BYTES]);
            record.extend_from_slice(&checksum(body).to_le_bytes());
            record.extend_from_slice(body);
            rewritten.push((key.value(), record));
        }
    }
    for (key, record) in rewritten {
        messages.insert(key, record.as_slice())?;
    }
    Ok(())
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
    slot: DatabaseSlot,
    /// The open database; `None` while it cannot be reopened.
    db: Option<Arc<Database>>,
    opener: Opener,
    file: PathBuf,
    next_seq: u64,
    health: Health,
    /// While the database is not open: when to try again.
    next_reopen: Instant,
    failed_commits: u32,
    good_commits: u32,
    log: LogLimiter,
}

/// The message header stored before the body.
struct Header {
    visible_at_ms: u64,
    inserted_at_ms: u64,
    receipt: u64,
    dequeue_count: u32,
    body_checksum: u32,
}

const HEADER_BYTES: usize = 32;

fn checksum(body: &[u8]) -> u32 {
    crc32fast::hash(body)
}

impl Header {
    fn encode(&self, body: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
        bytes.extend_from_slice(&self.visible_at_ms.to_le_bytes());
        bytes.extend_from_slice(&self.inserted_at_ms.to_le_bytes());
        bytes.extend_from_slice(&self.receipt.to_le_bytes());
        bytes.extend_from_slice(&self.dequeue_count.to_le_bytes());
        bytes.extend_from_slice(&self.body_checksum.to_le_bytes());
        bytes.extend_from_slice(body);
        bytes
    }

    /// The header of a stored record, or `None` if it is too short to hold one.
    fn decode(bytes: &[u8]) -> Option<Header> {
        let header = bytes.get(..HEADER_BYTES)?;
        let u64_at = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().unwrap());
        Some(Header { visible_at_ms: u64_at(0), inserted_at_ms: u64_at(8), receipt: u64_at(16), dequeue_count: u32_at(24), body_checksum: u32_at(28) })
    }
}

/// A stored record as a get sees it: its header, its body, and what is wrong with it.
struct Record {
    header: Header,
    body: Vec<u8>,
    defect: Option<String>,
}

impl Record {
    fn read(stored: &[u8], now_ms: u64) -> Record {
        match Header::decode(stored) {
            Some(header) => {
                let body = stored[HEADER_BYTES..].to_vec();
                let computed = checksum(&body);
                let defect = (computed != header.body_checksum)
                    .then(|| format!("corrupt: the body fails its checksum (stored {:08x}, computed {computed:08x})", header.body_checksum));
                Record { header, body, defect }
            }
            None => Record {
                // Keep the bytes as the body with a checksum that cannot match, so the record
                // stays marked corrupt if it is leased again.
                header: Header { visible_at_ms: now_ms, inserted_at_ms: now_ms, receipt: 0, dequeue_count: 0, body_checksum: !checksum(stored) },
                body: stored.to_vec(),
                defect: Some(format!("corrupt: the record is {} bytes, shorter than its {HEADER_BYTES}-byte header", stored.len())),
            },
        }
    }
}

struct Tables<'t> {
    queues: Table<'t, &'static str, u32>,
    messages: Table<'t, (u32, u64), &'static [u8]>,
    visible: Table<'t, (u32, u64, u64), ()>,
    counts: Table<'t, u32, u64>,
}

impl Writer {
    fn run(mut self, requests: mpsc::Receiver<Request>) {
        loop {
            let first = if self.db.is_some() {
                match requests.recv() {
                    Ok(request) => request,
                    Err(_) => return,
                }
            } else {
                match requests.recv_timeout(REOPEN_INTERVAL) {
                    Ok(request) => request,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        self.reopen_if_due();
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            };
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
            let results = self.commit_group(ops);
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result);
            }
        }
    }

    /// Commits a group, containing any failure to it: a failed commit reopens the database,
    /// a panic fails only this group's requests.
    fn commit_group(&mut self, ops: Vec<Op>) -> Vec<Result<Reply, QueueError>> {
        let count = ops.len();
        if self.db.is_none() {
            self.reopen_if_due();
        }
        let Some(db) = self.db.clone() else {
            let unavailable = || QueueError::Transient(anyhow!("queue store {} is unavailable; it will be reopened when it can be", self.file.display()));
            return (0..count).map(|_| Err(unavailable())).collect();
        };
        match catch_unwind(AssertUnwindSafe(|| self.commit(&db, ops))) {
            Ok(Ok(results)) => {
                self.failed_commits = 0;
                self.good_commits = self.good_commits.saturating_add(1);
                if self.good_commits >= COMMITS_TO_RECOVER && self.health.clear_problem("store") {
                    tracing::info!(file = %self.file.display(), "queue store commits succeed again");
                }
                results
            }
            Ok(Err(error)) => {
                drop(db);
                let reason = format!("{error:#}");
                self.failed_commits = self.failed_commits.saturating_add(1);
                self.good_commits = 0;
                if let Some(suppressed) = self.log.allow() {
                    tracing::error!(file = %self.file.display(), suppressed, "queue store commit failed, reopening it: {reason}");
                }
                self.reopen_after_failure(&reason);
                if self.db.is_some() && self.failed_commits >= FAILED_COMMITS_UNHEALTHY {
                    let problem = format!("queue store {}: {} commits in a row failed, the last with: {reason}", self.file.display(), self.failed_commits);
                    if self.health.set_problem("store", problem) {
                        tracing::error!(file = %self.file.display(), "queue store commits keep failing: the host reports itself unhealthy until one succeeds");
                    }
                }
                (0..count).map(|_| Err(QueueError::Transient(anyhow!("the queue store could not commit: {reason}")))).collect()
            }
            Err(panic) => {
                let reason = panic_message(&*panic);
                if let Some(suppressed) = self.log.allow() {
                    tracing::error!(file = %self.file.display(), suppressed, "the queue writer panicked on a group of {count} changes (they fail; the store is reopened): {reason}");
                }
                // A panic inside redb leaves its locks poisoned: every later commit would
                // panic too. Start again from the file, as after an I/O error.
                drop(db);
                self.failed_commits = self.failed_commits.saturating_add(1);
                self.good_commits = 0;
                self.reopen_after_failure(&format!("a panic: {reason}"));
                (0..count).map(|_| Err(QueueError::Fatal(anyhow!("the queue writer failed on this change: {reason}")))).collect()
            }
        }
    }

    /// Applies every op in one transaction and commits it durably. An op that fails on its
    /// own terms (a stale receipt) changes nothing and gets its error; the others still
    /// commit. A storage error aborts the whole transaction.
    fn commit(&mut self, db: &Database, ops: Vec<Op>) -> anyhow::Result<Vec<Result<Reply, QueueError>>> {
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        let mut next_seq = self.next_seq;
        let results = {
            let mut tables = open_tables(&txn)?;
            ops.into_iter().map(|op| apply(&mut tables, op, &mut next_seq)).collect::<anyhow::Result<Vec<_>>>()?
        };
        if next_seq != self.next_seq {
            txn.open_table(META)?.insert("next_seq", next_seq)?;
        }
        txn.commit()?;
        self.next_seq = next_seq;
        Ok(results)
    }

    /// After a failed commit (redb refuses every later call after an I/O error until the
    /// database is reopened): a few quick reopen attempts, then "unavailable".
    fn reopen_after_failure(&mut self, cause: &str) {
        let mut last = String::new();
        for pause in REOPEN_PAUSES {
            std::thread::sleep(pause);
            match self.reopen() {
                Ok(()) => return,
                Err(error) => last = error,
            }
        }
        let problem = format!("queue store {} cannot be reopened after a failed commit ({cause}): {last}", self.file.display());
        if self.health.set_problem("store", problem.clone()) {
            tracing::error!(
                "{problem}; dequeuing stops until it can be reopened (trying every {REOPEN_INTERVAL:?}); messages handled meanwhile come back after their lease"
            );
        }
        self.next_reopen = Instant::now() + REOPEN_INTERVAL;
    }

    /// While unavailable: one reopen attempt per interval.
    fn reopen_if_due(&mut self) {
        if Instant::now() < self.next_reopen {
            return;
        }
        match self.reopen() {
            Ok(()) => {
                self.health.clear_problem("store");
                tracing::info!(file = %self.file.display(), "queue store reopened; dequeuing resumes");
            }
            Err(error) => {
                tracing::debug!(file = %self.file.display(), "queue store still cannot be reopened: {error}");
                self.next_reopen = Instant::now() + REOPEN_INTERVAL;
            }
        }
    }

    /// Closes the database (waiting briefly for readers to let go, as the file stays locked
    /// while any handle lives) and opens it again; redb repairs it to the last commit.
    fn reopen(&mut self) -> Result<(), String> {
        self.db = None;
        let old = self.slot.write().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(mut old) = old {
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                match Arc::try_unwrap(old) {
                    Ok(db) => {
                        // A database whose locks a panic poisoned may panic as it closes.
                        let _ = quietly(move || drop(db));
                        break;
                    }
                    Err(shared) if Instant::now() < deadline => {
                        old = shared;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(_) => break,
                }
            }
        }
        let (db, next_seq) = open_database(&self.opener, &self.file).map_err(|e| format!("{e:#}"))?;
        self.next_seq = next_seq;
        *self.slot.write().unwrap_or_else(PoisonError::into_inner) = Some(db.clone());
        self.db = Some(db);
        if let Some(suppressed) = self.log.allow() {
            tracing::warn!(file = %self.file.display(), suppressed, "queue store reopened after a failed commit");
        }
        Ok(())
    }
}

fn open_tables(txn: &WriteTransaction) -> anyhow::Result<Tables<'_>> {
    Ok(Tables { queues: txn.open_table(QUEUES)?, messages: txn.open_table(MESSAGES)?, visible: txn.open_table(VISIBLE)?, counts: txn.open_table(COUNTS)? })
}

/// Applies one op. The outer error is a storage failure (abort the transaction); the inner
/// one is this op's own (a stale receipt), which leaves the others to commit.
fn apply(t: &mut Tables<'_>, op: Op, next_seq: &mut u64) -> anyhow::Result<Result<Reply, QueueError>> {
    match op {
        Op::Create { name } => {
            if let Some(id) = t.queues.get(name.as_str())? {
                return Ok(Ok(Reply::QueueId(id.value())));
            }
            let id = t.queues.len()? as u32 + 1;
            t.queues.insert(name.as_str(), id)?;
            Ok(Ok(Reply::QueueId(id)))
        }
        Op::Put { queue, now_ms, body, delay_ms } => {
            let seq = *next_seq;
            *next_seq += 1;
            let visible_at_ms = now_ms.saturating_add(delay_ms);
            let header = Header { visible_at_ms, inserted_at_ms: now_ms, receipt: 0, dequeue_count: 0, body_checksum: checksum(&body) };
            t.messages.insert((queue, seq), header.encode(&body).as_slice())?;
            t.visible.insert((queue, visible_at_ms, seq), ())?;
            add_count(&mut t.counts, queue, 1)?;
            Ok(Ok(Reply::Id(seq.to_string())))
        }
        Op::Get { queue, now_ms, max, visibility_ms } => {
            let due: Vec<(u64, u64)> = t
                .visible
                .range((queue, 0, 0)..=(queue, now_ms, u64::MAX))?
                .take(max as usize)
                .map(|entry| entry.map(|(key, _)| (key.value().1, key.value().2)))
                .collect::<Result<_, _>>()?;
            let mut leased = Vec::with_capacity(due.len());
            for (visible_at_ms, seq) in due {
                t.visible.remove((queue, visible_at_ms, seq))?;
                let Some(stored) = t.messages.get((queue, seq))?.map(|v| v.value().to_vec()) else {
                    // An index entry without its message (a damaged file): drop the entry.
                    tracing::warn!(queue, seq, "dropping an index entry whose message is missing");
                    continue;
                };
                let Record { header: old, body, defect } = Record::read(&stored, now_ms);
                let header = Header {
                    visible_at_ms: now_ms.saturating_add(visibility_ms),
                    receipt: new_receipt(old.receipt),
                    dequeue_count: old.dequeue_count.saturating_add(1),
                    ..old
                };
                t.messages.insert((queue, seq), header.encode(&body).as_slice())?;
                t.visible.insert((queue, header.visible_at_ms, seq), ())?;
                leased.push(Message {
                    id: seq.to_string().into(),
                    pop_receipt: format!("{:016x}", header.receipt).into(),
                    dequeue_count: header.dequeue_count,
                    inserted_at: system_time(header.inserted_at_ms),
                    next_visible_at: system_time(header.visible_at_ms),
                    body,
                    defect,
                });
            }
            Ok(Ok(Reply::Messages(leased)))
        }
        Op::Delete { queue, seq, receipt } => {
            let header = match leased_header(t, queue, seq, receipt)? {
                Ok(header) => header,
                Err(stale) => return Ok(Err(stale)),
            };
            t.messages.remove((queue, seq))?;
            t.visible.remove((queue, header.visible_at_ms, seq))?;
            add_count(&mut t.counts, queue, -1)?;
            Ok(Ok(Reply::Deleted))
        }
        Op::Update { queue, seq, receipt, now_ms, visibility_ms } => {
            let header = match leased_header(t, queue, seq, receipt)? {
                Ok(header) => header,
                Err(stale) => return Ok(Err(stale)),
            };
            let stored = t.messages.get((queue, seq))?.map(|v| v.value().to_vec()).unwrap_or_default();
            t.visible.remove((queue, header.visible_at_ms, seq))?;
            let updated = Header { visible_at_ms: now_ms.saturating_add(visibility_ms), receipt: new_receipt(receipt), ..header };
            t.messages.insert((queue, seq), updated.encode(&stored[HEADER_BYTES..]).as_slice())?;
            t.visible.insert((queue, updated.visible_at_ms, seq), ())?;
            Ok(Ok(Reply::Receipt(format!("{:016x}", updated.receipt))))
        }
    }
}

/// The header of a message whose current receipt is `receipt`, or (inner) a stale-receipt error.
fn leased_header(t: &Tables<'_>, queue: u32, seq: u64, receipt: u64) -> anyhow::Result<Result<Header, QueueError>> {
    let stale = || QueueError::StaleReceipt { id: seq.to_string().into() };
    let Some(stored) = t.messages.get((queue, seq))? else { return Ok(Err(stale())) };
    match Header::decode(stored.value()) {
        Some(header) if header.receipt == receipt && receipt != 0 => Ok(Ok(header)),
        _ => Ok(Err(stale())),
    }
}

fn new_receipt(previous: u64) -> u64 {
    loop {
        let receipt = fastrand::u64(1..);
        if receipt != previous {
            return receipt;
        }
    }
}

fn add_count(counts: &mut Table<'_, u32, u64>, queue: u32, delta: i64) -> anyhow::Result<()> {
    let current = counts.get(queue)?.map_or(0, |v| v.value());
    counts.insert(queue, current.saturating_add_signed(delta))?;
    Ok(())
}
