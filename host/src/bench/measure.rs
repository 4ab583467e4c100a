//! What a run is measured with: this process's CPU time, and the bytes redb writes.

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redb::StorageBackend;
use redb::backends::FileBackend;

/// User plus system CPU time of this process so far, every thread included (the store's
/// writer thread and tokio's blocking pool are part of what a contender costs; the bench
/// server is another process and is not).
pub(crate) fn process_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given, which is plain data.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return Duration::ZERO;
        }
        usage
    };
    let time = |t: libc::timeval| Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.clamp(0, 999_999) as u64);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// CPU time of the threads of process `pid` (`None`: this one) whose name `wanted` accepts,
/// from the scheduler's own count (`/proc/…/task/*/schedstat`, nanoseconds; the `stat`
/// file's clock ticks are too coarse for runs of a second). `None` where that cannot be read.
pub(crate) fn threads_cpu(pid: Option<u32>, wanted: impl Fn(&str) -> bool) -> Option<Duration> {
    let tasks = match pid {
        Some(pid) => format!("/proc/{pid}/task"),
        None => "/proc/self/task".to_string(),
    };
    let mut total = Duration::ZERO;
    for task in std::fs::read_dir(tasks).ok()?.flatten() {
        let path = task.path();
        // A thread that ended meanwhile is simply not counted.
        let Ok(name) = std::fs::read_to_string(path.join("comm")) else { continue };
        if !wanted(name.trim_end()) {
            continue;
        }
        let Ok(schedstat) = std::fs::read_to_string(path.join("schedstat")) else { continue };
        let nanos: u64 = schedstat.split_whitespace().next()?.parse().ok()?;
        total += Duration::from_nanos(nanos);
    }
    Some(total)
}

/// Bytes a [`CountingBackend`] has written, shared with whoever reads the figure.
#[derive(Clone, Default)]
pub(crate) struct WrittenBytes(Arc<AtomicU64>);

impl WrittenBytes {
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// A redb backend over the file at `path` (created if absent) that adds what it writes
    /// to this count.
    pub(crate) fn backend(&self, path: &Path) -> std::io::Result<CountingBackend> {
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        let file = FileBackend::new(file).map_err(std::io::Error::other)?;
        Ok(CountingBackend { file, written: self.clone() })
    }
}

/// redb's file backend, counting the bytes written through it (what reaches the file system,
/// before the disk's own amplification). The embedded store's branch may grow a public one;
/// this one is kept small so that swapping it is a change of two lines.
pub(crate) struct CountingBackend {
    file: FileBackend,
    written: WrittenBytes,
}

impl std::fmt::Debug for CountingBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingBackend").field("written", &self.written.get()).finish()
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
        self.file.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.written.0.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.file.write(offset, data)
    }
    fn close(&self) -> std::io::Result<()> {
        self.file.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.file.try_lock_range(start, end)
    }
    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.file.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.file.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.file.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.file.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.file.query_lock_range(start, end)
    }
}
