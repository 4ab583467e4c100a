//! The three ways of moving messages to the app, one run each: a plain reqwest loop (the
//! floor: no queue at all), a hand-written redb queue loop (what a user would write), and
//! ebb's listener over the embedded store.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use redb::{Database, Durability, ReadableTable, TableDefinition};

use crate::measure::{process_cpu, threads_cpu};
use ebb::handler::HttpHandler;
use ebb::listener::{Listener, QueueSettings};
use ebb::queue::QueueClient;
use ebb::queue::embedded::{CountingBackend, EmbeddedOptions, EmbeddedStore};

/// A contender of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Contender {
    ReqwestLoop,
    RedbLoop,
    Ebb(EbbSettings),
}

/// The contenders run when none are named, in the order each round runs them.
pub(crate) const CONTENDERS: [Contender; 4] =
    [Contender::ReqwestLoop, Contender::RedbLoop, Contender::Ebb(EbbSettings::ConcurrentCalls), Contender::Ebb(EbbSettings::FixedTasks)];

/// Every contender, in the order each round runs them: `ebb_traced` right after `ebb`, the
/// run it is compared with.
pub(crate) const ALL_CONTENDERS: [Contender; 5] = [
    Contender::ReqwestLoop,
    Contender::RedbLoop,
    Contender::Ebb(EbbSettings::ConcurrentCalls),
    Contender::Ebb(EbbSettings::Traced),
    Contender::Ebb(EbbSettings::FixedTasks),
];

impl Contender {
    /// Its name in the JSON.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Contender::ReqwestLoop => "reqwest_loop",
            Contender::RedbLoop => "redb_loop",
            Contender::Ebb(EbbSettings::ConcurrentCalls) => "ebb",
            Contender::Ebb(EbbSettings::FixedTasks) => "ebb_fixed_tasks",
            Contender::Ebb(EbbSettings::Traced) => "ebb_traced",
        }
    }

    /// Its name in the table.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Contender::ReqwestLoop => "reqwest loop",
            Contender::RedbLoop => "redb loop",
            Contender::Ebb(EbbSettings::ConcurrentCalls) => "ebb, max_concurrent_calls = T",
            Contender::Ebb(EbbSettings::FixedTasks) => "ebb, min_tasks = max_tasks = T",
            Contender::Ebb(EbbSettings::Traced) => "ebb, max_concurrent_calls = T, spans exported",
        }
    }

    pub(super) async fn run(self, setup: &Setup<'_>) -> anyhow::Result<Run> {
        match self {
            Contender::ReqwestLoop => reqwest_loop(setup).await,
            Contender::RedbLoop => redb_loop(setup).await,
            Contender::Ebb(settings) => ebb(setup, settings).await,
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) messages: u64,
    /// From the first message taken to the last one done.
    pub(crate) elapsed: Duration,
    /// This process's CPU time over `elapsed`.
    pub(crate) cpu: Duration,
    /// The app's (the bench server's) CPU time over `elapsed`, when it could be read.
    pub(crate) server_cpu: Option<Duration>,
    /// For the contenders with a store.
    pub(crate) store: Option<StoreWrites>,
    /// ebb: the CPU time of the store's writer thread over `elapsed` (part of `cpu`).
    pub(crate) writer_cpu: Option<Duration>,
    /// ebb: how far its concurrency went.
    pub(crate) listener: Option<ListenerPeaks>,
}

/// The most dequeue tasks and handler calls ebb ran at once in a run (the calls sampled
/// every millisecond, so a brief higher peak may be missed).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListenerPeaks {
    pub(crate) tasks: u32,
    pub(crate) calls: u32,
}

/// Bytes written to the store's file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreWrites {
    /// While the messages were put, before the run.
    pub(crate) put: u64,
    /// During the run: leases and deletes.
    pub(crate) processing: u64,
    /// Commits (each one fsync) during the run.
    pub(crate) processing_commits: u64,
}

/// How a run is set up: the app, the message body, and how many.
pub(crate) struct Setup<'a> {
    pub(crate) url: reqwest::Url,
    pub(crate) body: Bytes,
    pub(crate) messages: u64,
    pub(crate) concurrency: u32,
    /// An empty folder for the store.
    pub(crate) dir: &'a Path,
    /// Reads the app's CPU time.
    pub(crate) server_cpu: &'a (dyn Fn() -> Option<Duration> + Sync),
}

/// Measures from now until [`Stopwatch::stop`]: wall time, this process's CPU and the app's.
struct Stopwatch<'a> {
    started: Instant,
    cpu: Duration,
    server_cpu: Option<Duration>,
    read_server_cpu: &'a (dyn Fn() -> Option<Duration> + Sync),
}

impl<'a> Stopwatch<'a> {
    fn start(read_server_cpu: &'a (dyn Fn() -> Option<Duration> + Sync)) -> Self {
        Stopwatch { server_cpu: read_server_cpu(), cpu: process_cpu(), started: Instant::now(), read_server_cpu }
    }

    fn stop(self, messages: u64, store: Option<StoreWrites>) -> Run {
        let elapsed = self.started.elapsed();
        let cpu = process_cpu().saturating_sub(self.cpu);
        let server_cpu = self.server_cpu.zip((self.read_server_cpu)()).map(|(before, after)| after.saturating_sub(before));
        Run { messages, elapsed, cpu, server_cpu, store, writer_cpu: None, listener: None }
    }
}

/// A POST that fails the run unless the app answers 2xx.
async fn post(client: &reqwest::Client, url: &reqwest::Url, body: impl Into<reqwest::Body>) -> anyhow::Result<()> {
    let response = client.post(url.clone()).body(body).send().await.with_context(|| format!("the bench server {url} did not answer"))?;
    let status = response.status();
    if !status.is_success() {
        bail!("the bench server {url} answered {status}");
    }
    Ok(())
}

/// Waits for every task, failing with the first error.
async fn join_all(tasks: Vec<tokio::task::JoinHandle<anyhow::Result<u64>>>) -> anyhow::Result<u64> {
    let mut done = 0;
    for task in tasks {
        done += task.await.context("a bench task panicked")??;
    }
    Ok(done)
}

/// T tasks on one reqwest `Client`, each POSTing the body until `messages` were posted in all.
pub(crate) async fn reqwest_loop(setup: &Setup<'_>) -> anyhow::Result<Run> {
    let client = reqwest::Client::new();
    let next = Arc::new(AtomicU64::new(0));
    let watch = Stopwatch::start(setup.server_cpu);
    let tasks = (0..setup.concurrency)
        .map(|_| {
            let (client, url, body, next, messages) = (client.clone(), setup.url.clone(), setup.body.clone(), next.clone(), setup.messages);
            tokio::spawn(async move {
                let mut posted = 0;
                while next.fetch_add(1, Ordering::Relaxed) < messages {
                    post(&client, &url, body.clone()).await?;
                    posted += 1;
                }
                Ok(posted)
            })
        })
        .collect();
    let posted = join_all(tasks).await?;
    Ok(watch.stop(posted, None))
}

/// The redb loop's table: sequence number → visible-at (milliseconds since the epoch, 8
/// bytes little-endian) + body.
const MESSAGES: TableDefinition<u64, &[u8]> = TableDefinition::new("messages");
/// How long the redb loop leases a message.
const REDB_LEASE: Duration = Duration::from_secs(60);

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A queue as a user would write it on redb: T tasks, each leasing one message (a durable
/// write transaction marking it leased), POSTing it, and deleting it (a second durable
/// transaction), until no message is left to lease.
pub(crate) async fn redb_loop(setup: &Setup<'_>) -> anyhow::Result<Run> {
    let written = ebb::queue::embedded::StoreWrites::default();
    let file = setup.dir.join("loop.redb");
    let backend = CountingBackend::open(&file, written.clone()).with_context(|| format!("failed to open redb file {}", file.display()))?;
    let db = Arc::new(Database::builder().create_with_backend(backend).with_context(|| format!("failed to create redb file {}", file.display()))?);
    let before_put = written.bytes();
    fill_redb(&db, &setup.body, setup.messages).with_context(|| format!("failed to put the messages into {}", file.display()))?;
    let put = written.bytes() - before_put;
    let client = reqwest::Client::new();
    let watch = Stopwatch::start(setup.server_cpu);
    let (before_run, syncs_before_run) = (written.bytes(), written.syncs());
    let tasks = (0..setup.concurrency)
        .map(|_| {
            let (db, client, url) = (db.clone(), client.clone(), setup.url.clone());
            tokio::spawn(async move {
                let mut done = 0;
                loop {
                    let leasing = db.clone();
                    // redb's calls block (a commit waits for the disk): off the async threads.
                    let Some((seq, body)) = tokio::task::spawn_blocking(move || lease_one(&leasing)).await?? else { break };
                    post(&client, &url, body).await?;
                    let deleting = db.clone();
                    tokio::task::spawn_blocking(move || delete(&deleting, seq)).await??;
                    done += 1;
                }
                Ok(done)
            })
        })
        .collect();
    let done = join_all(tasks).await?;
    let store = StoreWrites { put, processing: written.bytes() - before_run, processing_commits: written.syncs() - syncs_before_run };
    Ok(watch.stop(done, Some(store)))
}

fn fill_redb(db: &Database, body: &[u8], messages: u64) -> anyhow::Result<()> {
    let mut value = 0u64.to_le_bytes().to_vec();
    value.extend_from_slice(body);
    let mut seq = 0;
    while seq < messages {
        let txn = db.begin_write()?;
        {
            let mut table = txn.open_table(MESSAGES)?;
            for _ in 0..1000.min(messages - seq) {
                table.insert(seq, value.as_slice())?;
                seq += 1;
            }
        }
        txn.commit()?;
    }
    Ok(())
}

/// Leases the first visible message, durably; `None` when none is left to lease.
fn lease_one(db: &Database) -> anyhow::Result<Option<(u64, Vec<u8>)>> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    let leased = {
        let mut table = txn.open_table(MESSAGES)?;
        let now = now_ms();
        let visible_at = |value: &[u8]| u64::from_le_bytes(value[..8].try_into().expect("eight bytes"));
        let mut first = None;
        for entry in table.iter()? {
            let (key, value) = entry?;
            if visible_at(value.value()) <= now {
                first = Some((key.value(), value.value().to_vec()));
                break;
            }
        }
        match first {
            Some((seq, mut value)) => {
                value[..8].copy_from_slice(&(now + REDB_LEASE.as_millis() as u64).to_le_bytes());
                table.insert(seq, value.as_slice())?;
                Some((seq, value.split_off(8)))
            }
            None => None,
        }
    };
    txn.commit()?;
    Ok(leased)
}

fn delete(db: &Database, seq: u64) -> anyhow::Result<()> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    txn.open_table(MESSAGES)?.remove(seq)?;
    txn.commit()?;
    Ok(())
}

/// How ebb's listener is set up for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EbbSettings {
    /// The default task settings (the built-in rule decides), `max_concurrent_calls = T`.
    ConcurrentCalls,
    /// `min_tasks = max_tasks = T`, the default `max_concurrent_calls`.
    FixedTasks,
    /// As `ConcurrentCalls`, with the spans exported (`crate::traced`).
    Traced,
}

/// The embedded store's writer thread, by the name it gives it (Linux keeps 15 bytes).
const WRITER_THREAD: &str = "ebb-queue-write";

/// Longest a run may go without a message processed before it is given up.
const STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// ebb's listener over an embedded store holding the messages, handing each to
/// [`HttpHandler`], from its start until every message is deleted.
pub(crate) async fn ebb(setup: &Setup<'_>, settings: EbbSettings) -> anyhow::Result<Run> {
    let (store, written) = EmbeddedStore::open_counting(setup.dir, EmbeddedOptions::default())?;
    let queue = Arc::new(store.queue("bench"));
    let poison = Arc::new(store.queue("bench-poison"));
    queue.create_if_missing().await?;
    poison.create_if_missing().await?;
    let before_put = written.bytes();
    fill_store(&queue, &setup.body, setup.messages).await.with_context(|| format!("failed to put the messages into the store in {}", setup.dir.display()))?;
    let put = written.bytes() - before_put;

    let handler = HttpHandler::new(setup.url.clone(), Duration::from_secs(30))?;
    let t = setup.concurrency;
    let traced = settings == EbbSettings::Traced;
    let settings = match settings {
        EbbSettings::ConcurrentCalls | EbbSettings::Traced => QueueSettings { max_concurrent_calls: t, ..QueueSettings::default() },
        EbbSettings::FixedTasks => QueueSettings { min_tasks: t, max_tasks: t, ..QueueSettings::default() },
    };
    let listener = Listener::builder(queue, poison, Arc::new(handler)).settings(settings).build();
    let spans = traced.then(crate::traced::Spans::on).transpose()?;
    let writer_cpu = || threads_cpu(None, |name| name == WRITER_THREAD);
    let writer_before = writer_cpu();
    let watch = Stopwatch::start(setup.server_cpu);
    let (before_run, syncs_before_run) = (written.bytes(), written.syncs());
    listener.start();
    let finished = wait_until_processed(&listener, setup.messages).await;
    let store = StoreWrites { put, processing: written.bytes() - before_run, processing_commits: written.syncs() - syncs_before_run };
    let mut run = watch.stop(setup.messages, Some(store));
    run.writer_cpu = writer_before.zip(writer_cpu()).map(|(before, after)| after.saturating_sub(before));
    listener.shutdown(Duration::from_secs(10)).await;
    drop(spans);
    finished.map(|peak_calls| {
        run.listener = Some(ListenerPeaks { tasks: listener.status().peak_tasks, calls: peak_calls });
        run
    })
}

/// Puts the messages, a thousand at a time (the store commits the puts that arrive together
/// in one transaction, as it would for many producers).
async fn fill_store(queue: &Arc<ebb::queue::embedded::EmbeddedQueue>, body: &Bytes, messages: u64) -> anyhow::Result<()> {
    let mut put = 0;
    while put < messages {
        let chunk = 1000.min(messages - put);
        let puts = (0..chunk).map(|_| queue.put(body, Duration::ZERO));
        for result in futures::future::join_all(puts).await {
            result?;
        }
        put += chunk;
    }
    Ok(())
}

/// Waits until the listener has deleted `messages` messages, and returns the most handler
/// calls seen at once; fails on a handler failure (the app always answers 200: a failure is
/// the bench's own problem) or a stall.
pub(crate) async fn wait_until_processed(listener: &Listener, messages: u64) -> anyhow::Result<u32> {
    let (mut last, mut last_progress, mut peak_calls) = (0, Instant::now(), 0);
    loop {
        let status = listener.status();
        peak_calls = peak_calls.max(status.handler_calls);
        if status.processed >= messages {
            return Ok(peak_calls);
        }
        if status.failed > 0 || status.host_errors > 0 || status.poisoned > 0 {
            bail!(
                "ebb's handler failed {} times ({} host errors, {} poisoned) after {} of {messages} messages; the log says why",
                status.failed,
                status.host_errors,
                status.poisoned,
                status.processed
            );
        }
        if status.processed > last {
            (last, last_progress) = (status.processed, Instant::now());
        } else if last_progress.elapsed() > STALL_TIMEOUT {
            bail!("ebb processed nothing for {STALL_TIMEOUT:?}, after {last} of {messages} messages");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
