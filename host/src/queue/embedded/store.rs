//! The store's handle: opens a data directory, starts the writer, and passes changes to it.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};
use redb::{Database, StorageBackend};
use tokio::sync::oneshot;

use super::opening::{InUse, Opener, create_if_absent, open_database};
use super::ops::{Op, Reply};
use super::writer::{DatabaseSlot, Request, STORAGE_LOG_LINES, Writer};
use super::{EmbeddedOptions, STORE_FILE};
use crate::log_limit::LogLimiter;
use crate::queue::QueueError;

/// A data directory holding any number of queues. One process owns it at a time.
#[derive(Clone)]
pub struct EmbeddedStore {
    pub(super) shared: Arc<Shared>,
}

pub(super) struct Shared {
    pub(super) dir: PathBuf,
    pub(super) file: PathBuf,
    pub(super) db: DatabaseSlot,
    pub(super) writer: Option<mpsc::Sender<Request>>,
    pub(super) writer_thread: Option<std::thread::JoinHandle<()>>,
    pub(super) options: EmbeddedOptions,
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

/// Opens the store at start, waiting up to `wait` while another process holds it: an `ebb
/// send` with no host running holds the data directory for a moment, and a host started
/// then exited at once.
fn open_waiting(opener: &Opener, file: &Path, wait: Duration) -> anyhow::Result<(Arc<Database>, u64)> {
    let deadline = Instant::now() + wait;
    let mut waiting = false;
    loop {
        match open_database(opener, file, true) {
            Err(error) if error.is::<InUse>() && Instant::now() < deadline => {
                if !waiting {
                    tracing::info!(file = %file.display(), "{error}; waiting up to {} for it to let go", humantime::format_duration(wait));
                    waiting = true;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(error) if error.is::<InUse>() && waiting => {
                return Err(error.context(format!("waited {} for it", humantime::format_duration(wait))));
            }
            opened => {
                if waiting && opened.is_ok() {
                    tracing::info!(file = %file.display(), "the other process let go of the data directory; store opened");
                }
                return opened;
            }
        }
    }
}

impl EmbeddedStore {
    /// Opens the store in `dir`, creating it if `dir` has no store file. A store file that is
    /// not a valid store (empty, another kind of file, truncated, damaged) is refused with an
    /// error naming it and how to recover; it is never overwritten.
    pub fn open(dir: &Path, options: EmbeddedOptions) -> anyhow::Result<Self> {
        Self::open_with(dir, options, Arc::new(|path: &Path, check_pages| Database::builder().set_check_integrity_on_open(check_pages).create(path)))
    }

    /// As [`EmbeddedStore::open`], on a storage backend of the caller's over the store file:
    /// `make_backend` gets the file's path at each open (the first, and reopens after a
    /// failed commit). For injecting faults in tests.
    pub fn open_with_backend<B: StorageBackend>(
        dir: &Path,
        options: EmbeddedOptions,
        make_backend: impl Fn(&Path) -> std::io::Result<B> + Send + Sync + 'static,
    ) -> anyhow::Result<Self> {
        Self::open_with(
            dir,
            options,
            Arc::new(move |path: &Path, check_pages| Database::builder().set_check_integrity_on_open(check_pages).create_with_backend(make_backend(path)?)),
        )
    }

    fn open_with(dir: &Path, options: EmbeddedOptions, opener: Opener) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("failed to create data directory {}", dir.display()))?;
        let file = dir.join(STORE_FILE);
        create_if_absent(&opener, &file)?;
        let (db, next_seq) = open_waiting(&opener, &file, options.wait_for_owner)?;
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

    pub(super) async fn call(&self, op: Op) -> Result<Reply, QueueError> {
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
    pub(super) fn database(&self) -> Result<Arc<Database>, QueueError> {
        let slot = self.shared.db.read().unwrap_or_else(PoisonError::into_inner);
        slot.clone().ok_or_else(|| QueueError::Transient(anyhow!("queue store {} is unavailable: reopening after a storage error", self.shared.file.display())))
    }

    pub(super) fn now_ms(&self) -> u64 {
        self.shared.options.clock.now_ms()
    }
}
