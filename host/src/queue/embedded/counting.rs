//! A storage backend that counts what the store writes to its file: the figure that says
//! whether a body is written once (tests, and `ebb bench`'s bytes per message).

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

use super::{EmbeddedOptions, EmbeddedStore};

/// What a store opened with [`EmbeddedStore::open_counting`] has written to its file since
/// it was opened (reopens after a failed commit included). Cheap to clone; every clone reads
/// the same totals.
#[derive(Clone, Debug, Default)]
pub struct StoreWrites {
    bytes: Arc<AtomicU64>,
    syncs: Arc<AtomicU64>,
}

impl StoreWrites {
    /// Bytes written to the store file (redb writes whole pages: 4 KiB or a power of two of them).
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Times the store file was synced to disk (fsync).
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }
}

/// The store file, counting into a [`StoreWrites`].
#[derive(Debug)]
pub struct CountingBackend {
    file: FileBackend,
    writes: StoreWrites,
}

impl CountingBackend {
    /// Opens (creating if absent) the file at `path`, counting into `writes`.
    pub fn open(path: &Path, writes: StoreWrites) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        let file = FileBackend::new(file).map_err(std::io::Error::other)?;
        Ok(CountingBackend { file, writes })
    }
}

impl EmbeddedStore {
    /// As [`EmbeddedStore::open`], counting every byte the store writes to its file: for
    /// tests and benchmarks that measure what a message costs the disk. Read
    /// [`StoreWrites::bytes`] before and after the work and divide by the messages.
    pub fn open_counting(dir: &Path, options: EmbeddedOptions) -> anyhow::Result<(EmbeddedStore, StoreWrites)> {
        let writes = StoreWrites::default();
        let counted = writes.clone();
        let store = EmbeddedStore::open_with_backend(dir, options, move |path| CountingBackend::open(path, counted.clone()))?;
        Ok((store, writes))
    }
}

impl StorageBackend for CountingBackend {
    fn len(&self) -> std::io::Result<u64> {
        self.file.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.file.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.file.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.writes.syncs.fetch_add(1, Ordering::Relaxed);
        self.file.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.writes.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.file.write(offset, data)
    }
    fn close(&self) -> std::io::Result<()> {
        self.file.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_range(start, end)
    }
    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}
