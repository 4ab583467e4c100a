//! The writer thread: commits every change that arrives while the previous commit runs in
//! one durable transaction (group commit), and reopens the database after a failed commit.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use anyhow::anyhow;
use redb::{Database, Durability};
use tokio::sync::oneshot;

use super::changes::apply;
use super::opening::{Opener, open_database};
use super::ops::{Op, Reply};
use super::tables::{META, open_tables};
use crate::health::Health;
use crate::log_limit::LogLimiter;
use crate::panics::{panic_message, quietly};
use crate::queue::QueueError;

/// The open database, shared by the writer and readers; `None` while it is being reopened
/// or cannot be.
pub(super) type DatabaseSlot = Arc<RwLock<Option<Arc<Database>>>>;

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
/// Lines per minute about failing commits and reopens (a full disk fails every commit); the
/// rest are counted in the next line.
pub(super) const STORAGE_LOG_LINES: u32 = 5;
/// Successful commits in a row after which a store that kept failing is healthy again
/// (a nearly full disk lets small commits through between failures).
const COMMITS_TO_RECOVER: u32 = 3;

pub(super) struct Request {
    pub(super) op: Op,
    pub(super) reply: oneshot::Sender<Result<Reply, QueueError>>,
}

pub(super) struct Writer {
    pub(super) slot: DatabaseSlot,
    /// The open database; `None` while it cannot be reopened.
    pub(super) db: Option<Arc<Database>>,
    pub(super) opener: Opener,
    pub(super) file: PathBuf,
    pub(super) next_seq: u64,
    pub(super) health: Health,
    /// While the database is not open: when to try again.
    pub(super) next_reopen: Instant,
    pub(super) failed_commits: u32,
    pub(super) good_commits: u32,
    pub(super) log: LogLimiter,
}

impl Writer {
    pub(super) fn run(mut self, requests: mpsc::Receiver<Request>) {
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
            let results = ops.into_iter().map(|op| apply(&mut tables, op, &mut next_seq)).collect::<anyhow::Result<Vec<_>>>()?;
            tables.write_counts()?;
            results
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
        let (db, next_seq) = open_database(&self.opener, &self.file, false).map_err(|e| format!("{e:#}"))?;
        self.next_seq = next_seq;
        *self.slot.write().unwrap_or_else(PoisonError::into_inner) = Some(db.clone());
        self.db = Some(db);
        if let Some(suppressed) = self.log.allow() {
            tracing::warn!(file = %self.file.display(), suppressed, "queue store reopened after a failed commit");
        }
        Ok(())
    }
}
