//! Recording each queue's arrivals, so that `ebb trace export` can give the simulator the
//! traffic a queue really had (issue 22).
//!
//! What is recorded, per queue and per second: puts through this host (`QueueHandle::send`,
//! the API's `/messages`), notifications made to it (`/notify`: they say messages arrived,
//! not how many), and messages a get returned for the first time (dequeue count 1). A
//! redelivery (dequeue count 2 and up) is the same arrival again and is not counted; a
//! message put through this host is counted when put and again when first got, which the
//! export undoes (see [`arrivals`]): a first sight is an arrival of its own only when no put
//! through the host is still waiting to be seen.
//!
//! The hot path is an atomic add into the bucket of the current second (a ring of a few
//! seconds); a background task ([`Recorder::spawn`]) takes the finished seconds once a
//! second and appends a line per second with arrivals to `<data_dir>/recordings/<queue>.csv`.
//! When that file reaches half the queue's `record_max_bytes`, it becomes
//! `<queue>.old.csv` (the previous old one is dropped): the two never hold more than the
//! cap, and the oldest seconds go first. A write that fails (a full disk, a folder that
//! cannot be written) stops that queue's recording with one warning; the queue runs on. A
//! file or folder removed while the host runs is made again (with its header), and a line a
//! crash cut short is cut off before the next write; a reader skips damaged lines, counting
//! them, and reads the rest.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, bail};
use tokio_util::sync::CancellationToken;

use crate::log_limit::LogLimiter;
use crate::queue::Clock;

/// The recordings' folder in the data directory.
pub(crate) const DIR: &str = "recordings";
/// The smallest `record_max_bytes`: a day of a line every second is about 2 MiB.
pub(crate) const MIN_MAX_BYTES: u64 = 64 << 10;
/// The largest `record_max_bytes`.
pub(crate) const MAX_MAX_BYTES: u64 = 1 << 30;
/// The first line of every recording file: what the columns are, and the format's version.
const HEADER: &str = "# ebb arrivals v1: unix_second,puts,first_seen,notifications";
/// Seconds in the ring: a flush that is late by less than this loses nothing, and one
/// later still only moves the late seconds to the spill list.
const RING: usize = 8;
/// How often the finished seconds are written.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// What was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Messages put through this host.
    Put,
    /// Messages a get returned with dequeue count 1.
    FirstGet,
    /// A notification (messages were put by someone else; how many is not said).
    Notification,
}

/// One second's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Seconds since the Unix epoch.
    pub second: u64,
    /// Messages put through this host.
    pub puts: u64,
    /// Messages first got.
    pub first_seen: u64,
    /// Notifications.
    pub notifications: u64,
}

impl Bucket {
    fn is_empty(&self) -> bool {
        self.puts == 0 && self.first_seen == 0 && self.notifications == 0
    }
}

/// One second's counts while they are counted (a place of the ring), taken into a [`Bucket`].
#[derive(Default)]
struct LiveBucket {
    second: AtomicU64,
    puts: AtomicU64,
    first_seen: AtomicU64,
    notifications: AtomicU64,
}

impl LiveBucket {
    fn take(&self) -> Bucket {
        Bucket {
            second: self.second.load(Ordering::Acquire),
            puts: self.puts.swap(0, Ordering::Relaxed),
            first_seen: self.first_seen.swap(0, Ordering::Relaxed),
            notifications: self.notifications.swap(0, Ordering::Relaxed),
        }
    }
}

/// One queue's counters, shared by its handle and its listeners.
pub struct QueueRecording {
    queue: String,
    clock: Arc<dyn Clock>,
    slots: [LiveBucket; RING],
    /// Seconds a writer had to push out of the ring before the flusher took them, and the
    /// lock of every change of a slot's second.
    spilled: Mutex<Vec<Bucket>>,
    active: AtomicBool,
}

impl QueueRecording {
    /// Counters for `queue`, timed by `clock`.
    pub fn new(queue: &str, clock: Arc<dyn Clock>) -> QueueRecording {
        QueueRecording { queue: queue.to_string(), clock, slots: Default::default(), spilled: Mutex::default(), active: AtomicBool::new(true) }
    }

    /// The queue's name.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Whether it still records (a failed write stops it).
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Counts `n` of `what` now. Never waits on a disk; takes a lock only once per second
    /// per ring slot, to start the slot's new second.
    pub fn record(&self, what: Seen, n: u64) {
        if n == 0 || !self.active.load(Ordering::Relaxed) {
            return;
        }
        let second = self.clock.now_ms() / 1000;
        let slot = &self.slots[(second % RING as u64) as usize];
        if slot.second.load(Ordering::Acquire) != second {
            self.start_second(slot, second);
        }
        let counter = match what {
            Seen::Put => &slot.puts,
            Seen::FirstGet => &slot.first_seen,
            Seen::Notification => &slot.notifications,
        };
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn start_second(&self, slot: &LiveBucket, second: u64) {
        let mut spilled = self.spilled.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let held = slot.second.load(Ordering::Acquire);
        // Another writer started it, or the clock stepped back: count into what the slot holds.
        if held >= second {
            return;
        }
        let old = slot.take();
        if !old.is_empty() {
            spilled.push(old);
        }
        slot.second.store(second, Ordering::Release);
    }

    /// The seconds finished before `now_ms`'s (all of them when `all`), oldest first, with
    /// what they counted; each second is taken once. A count added to a second after it was
    /// taken (a writer delayed across the flush) comes back as a second line for that
    /// second; readers sum lines of the same second.
    pub fn take_finished(&self, all: bool) -> Vec<Bucket> {
        let current = self.clock.now_ms() / 1000;
        let mut spilled = self.spilled.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut finished = std::mem::take(&mut *spilled);
        for slot in &self.slots {
            if all || slot.second.load(Ordering::Acquire) < current {
                let bucket = slot.take();
                if !bucket.is_empty() {
                    finished.push(bucket);
                }
            }
        }
        finished.sort_by_key(|b| b.second);
        finished
    }

    fn stop(&self) {
        self.active.store(false, Ordering::Relaxed);
    }
}

/// A queue's recording files.
struct Files {
    current: PathBuf,
    old: PathBuf,
    /// Each file's cap: half the queue's `record_max_bytes`.
    segment_bytes: u64,
}

/// The current and the old file of `queue` in `data_dir`.
pub(crate) fn files_of(data_dir: &Path, queue: &str) -> [PathBuf; 2] {
    let dir = data_dir.join(DIR);
    [dir.join(format!("{queue}.old.csv")), dir.join(format!("{queue}.csv"))]
}

impl Files {
    fn new(data_dir: &Path, queue: &str, max_bytes: u64) -> Files {
        let [old, current] = files_of(data_dir, queue);
        Files { current, old, segment_bytes: (max_bytes / 2).max(1) }
    }

    /// Appends the lines of `buckets`. The file's length is taken from the opened file at
    /// every write, not remembered: a file deleted (or replaced) while the host runs is begun
    /// again with its header, and a line a crash cut short is cut off first.
    fn append(&mut self, buckets: &[Bucket]) -> std::io::Result<()> {
        use std::io::Write as _;
        let mut lines = String::new();
        for bucket in buckets {
            lines.push_str(&format!("{},{},{},{}\n", bucket.second, bucket.puts, bucket.first_seen, bucket.notifications));
        }
        let mut file = self.open_current()?;
        let mut len = cut_torn_tail(&file)?;
        if len > 0 && len + lines.len() as u64 > self.segment_bytes {
            drop(file);
            std::fs::rename(&self.current, &self.old).map_err(|error| {
                // Said of the file in the way: the current one is fine.
                std::io::Error::new(error.kind(), format!("could not rotate into {}: {error}; remove it and the recording goes on", self.old.display()))
            })?;
            file = self.open_current()?;
            len = cut_torn_tail(&file)?;
        }
        let mut text = String::with_capacity(HEADER.len() + 1 + lines.len());
        if len == 0 {
            text.push_str(HEADER);
            text.push('\n');
        }
        text.push_str(&lines);
        file.write_all(text.as_bytes())
    }

    /// The current file, opened to append (created, and its folder too, when missing). Only a
    /// regular file: a FIFO would take the lines and block once full, a device (a link to
    /// /dev/zero, /dev/null) would swallow them; a symbolic link is not followed.
    fn open_current(&self) -> std::io::Result<std::fs::File> {
        use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .create(true)
                .append(true)
                // Opening a FIFO or a device must not wait for a peer before the type is seen.
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&self.current)
        };
        let file = match open() {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(self.current.parent().unwrap_or(Path::new(".")))?;
                open()
            }
            opened => opened,
        };
        let not_regular = |what: &str| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is {what}, not a regular file: remove it and restart the host to record again", self.current.display()),
            )
        };
        let file = match file {
            Err(error) if error.raw_os_error() == Some(libc::ELOOP) => return Err(not_regular("a symbolic link")),
            opened => opened?,
        };
        let meta = file.metadata()?;
        let kind = meta.file_type();
        // A hard link of a file elsewhere (a victim outside the data dir): lines appended to
        // the recording would be appended to it.
        if kind.is_file() && std::os::unix::fs::MetadataExt::nlink(&meta) > 1 {
            return Err(not_regular("a hard link of another file (a regular file with other names)"));
        }
        if !kind.is_file() {
            let what = if kind.is_fifo() {
                "a FIFO"
            } else if kind.is_char_device() || kind.is_block_device() {
                "a device"
            } else if kind.is_socket() {
                "a socket"
            } else if kind.is_dir() {
                "a folder"
            } else {
                "something else"
            };
            return Err(not_regular(what));
        }
        Ok(file)
    }
}

/// Cuts off the end of `file` after its last line end: what a crash left of a line being
/// written, which the next append would otherwise run on from. Returns the length kept.
fn cut_torn_tail(file: &std::fs::File) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt as _;
    let len = file.metadata()?.len();
    let mut chunk = [0u8; 512];
    let mut end = len;
    while end > 0 {
        let start = end.saturating_sub(chunk.len() as u64);
        let part = &mut chunk[..(end - start) as usize];
        file.read_exact_at(part, start)?;
        if let Some(at) = part.iter().rposition(|byte| *byte == b'\n') {
            end = start + at as u64 + 1;
            break;
        }
        end = start;
    }
    if end < len {
        file.set_len(end)?;
    }
    Ok(end)
}

/// Every recorded queue of a host, and the task that writes them.
pub struct Recorder {
    queues: Vec<(Arc<QueueRecording>, Mutex<Files>)>,
    warnings: LogLimiter,
}

impl Recorder {
    /// A recorder writing under `data_dir`.
    pub fn new() -> Recorder {
        Recorder { queues: Vec::new(), warnings: LogLimiter::new(5, Duration::from_secs(60)) }
    }

    /// Records `queue` into at most `max_bytes` of files in `data_dir`; returns its counters.
    pub fn add(&mut self, data_dir: &Path, queue: &str, max_bytes: u64, clock: Arc<dyn Clock>) -> Arc<QueueRecording> {
        let recording = Arc::new(QueueRecording::new(queue, clock));
        self.queues.push((recording.clone(), Mutex::new(Files::new(data_dir, queue, max_bytes))));
        recording
    }

    /// Whether it records any queue.
    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// Writes the finished seconds of every queue (all seconds when `all`). A queue whose
    /// write fails stops recording, with a warning.
    pub fn flush(&self, all: bool) {
        for (recording, files) in &self.queues {
            if !recording.is_active() {
                continue;
            }
            let _span = tracing::info_span!("record", queue = %recording.queue()).entered();
            let buckets = recording.take_finished(all);
            if buckets.is_empty() {
                continue;
            }
            let mut files = files.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Err(error) = files.append(&buckets) {
                recording.stop();
                if let Some(suppressed) = self.warnings.allow() {
                    tracing::warn!(
                        file = %files.current.display(),
                        suppressed,
                        "cannot write the arrivals recording ({error}); recording of this queue stops until the host restarts, the queue runs on"
                    );
                }
            }
        }
    }

    /// Writes the finished seconds every `FLUSH_EVERY` on tokio's blocking pool (a slow
    /// disk holds no worker thread), until `stop`; then writes what is left.
    pub fn spawn(self: Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(FLUSH_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let all = tokio::select! {
                    _ = tick.tick() => false,
                    () = stop.cancelled() => true,
                };
                let recorder = self.clone();
                if let Err(error) = tokio::task::spawn_blocking(move || recorder.flush(all)).await {
                    tracing::error!("the arrivals recorder's flush panicked: {error}");
                }
                if all {
                    return;
                }
            }
        })
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

/// The largest recording file read: a segment of the largest cap, plus a line of slack.
const MAX_FILE_BYTES: u64 = MAX_MAX_BYTES / 2 + 256;

/// The buckets recorded for `queue` in `data_dir` from `since_second` on, summed per second,
/// oldest first, and a warning for each file skipped (not a regular file, too large, of
/// another version) and for each file with damaged lines (skipped, counted).
pub fn read(data_dir: &Path, queue: &str, since_second: u64) -> (Vec<Bucket>, Vec<String>) {
    let mut seconds = std::collections::BTreeMap::<u64, Bucket>::new();
    let mut warnings = Vec::new();
    for path in files_of(data_dir, queue) {
        match std::fs::symlink_metadata(&path) {
            Err(_) => continue,
            // The host never records through a link: one here was put by someone else, and
            // reading it would export whatever file it names.
            Ok(meta) if meta.file_type().is_symlink() => {
                warnings.push(format!("skipped the recording {}: a symbolic link, not a regular file (the host never writes one)", path.display()));
                continue;
            }
            // Nor through a hard link of a file elsewhere (the host refuses to write one).
            Ok(meta) if meta.file_type().is_file() && std::os::unix::fs::MetadataExt::nlink(&meta) > 1 => {
                warnings.push(format!("skipped the recording {}: a hard link of another file (the host never writes one)", path.display()));
                continue;
            }
            Ok(_) => {}
        }
        // A stray byte that is not UTF-8 damages its line, not the file.
        let parsed = crate::input::read_file("recording", &path, MAX_FILE_BYTES).and_then(|bytes| parse(&String::from_utf8_lossy(&bytes)));
        match parsed {
            Ok(Parsed { buckets, damaged, first_damaged }) => {
                if let Some(first) = first_damaged {
                    let lines = if damaged == 1 { "line" } else { "lines" };
                    warnings.push(format!("the recording {}: skipped {damaged} damaged {lines} (the first: {first})", path.display()));
                }
                for bucket in buckets.into_iter().filter(|b| b.second >= since_second) {
                    let sum = seconds.entry(bucket.second).or_insert(Bucket { second: bucket.second, ..Bucket::default() });
                    sum.puts = sum.puts.saturating_add(bucket.puts);
                    sum.first_seen = sum.first_seen.saturating_add(bucket.first_seen);
                    sum.notifications = sum.notifications.saturating_add(bucket.notifications);
                }
            }
            Err(error) => warnings.push(format!("skipped the recording {}: {error:#}", path.display())),
        }
    }
    (seconds.into_values().collect(), warnings)
}

/// What a recording file holds.
#[derive(Debug, Default)]
struct Parsed {
    buckets: Vec<Bucket>,
    /// Lines that are not four whole numbers, skipped.
    damaged: u64,
    /// The first of them, for the warning.
    first_damaged: Option<String>,
}

/// The start of every version's header: a file of another version is not read at all.
const HEADER_PREFIX: &str = "# ebb arrivals v";

/// Longest line the host writes: four 20-digit numbers and their commas (the header is shorter).
const MAX_LINE_BYTES: usize = 4 * 20 + 3;

/// Longest part of a damaged line a warning shows.
const SHOWN_LINE_CHARS: usize = 60;

/// Parses a recording file. A last line without its line end (a write cut short by a
/// crash) is left out; any other line that is not four numbers is damaged: skipped and
/// counted, and the rest is read. A first line that is not the header is one of them (the
/// header itself damaged), unless it is the header of another version of the format.
fn parse(text: &str) -> Result<Parsed> {
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    let mut parsed = Parsed::default();
    // A crash cuts a line short: an end longer than any line the host writes is something else.
    let tail = text.len() - complete.len();
    if tail > MAX_LINE_BYTES {
        parsed.damaged += 1;
        parsed.first_damaged = Some(format!("the end of the file: {tail} bytes without a line end, longer than any line of a recording"));
    }
    for (index, line) in complete.lines().enumerate() {
        if index == 0 && line == HEADER {
            continue;
        }
        if index == 0 && line.starts_with(HEADER_PREFIX) {
            bail!("its first line is {line:?}, a version of the format this ebb does not read (it reads {HEADER:?})");
        }
        let numbers: Option<Vec<u64>> = line.split(',').map(|field| field.parse().ok()).collect();
        match numbers.as_deref() {
            Some(&[second, puts, first_seen, notifications]) => parsed.buckets.push(Bucket { second, puts, first_seen, notifications }),
            _ => {
                parsed.damaged += 1;
                if parsed.first_damaged.is_none() {
                    let shown: String = line.chars().take(SHOWN_LINE_CHARS).collect();
                    let cut = if shown.len() < line.len() { "…" } else { "" };
                    parsed.first_damaged = Some(format!("line {}: {shown:?}{cut} is not four whole numbers", index + 1));
                }
            }
        }
    }
    Ok(parsed)
}

/// The arrivals per second the buckets describe: every put through the host, and every
/// first sight that no earlier put still waiting to be seen accounts for (it was put by
/// someone else, or before the recording began). Puts are matched to first sights oldest
/// first. A put is recorded once its call returned, and a waiting receive (SQS's long poll)
/// may take the message before: a put in the second after such a first sight is that sight's
/// arrival, counted there, not another.
pub fn arrivals(buckets: &[Bucket]) -> Vec<(u64, u64)> {
    let mut unseen_puts = 0u64;
    // The last second's first sights that no put accounted for.
    let mut unexplained = (0u64, 0u64);
    let mut out = Vec::new();
    for bucket in buckets {
        let seen_early = if bucket.second == unexplained.0 + 1 { unexplained.1.min(bucket.puts) } else { 0 };
        let puts = bucket.puts - seen_early;
        unseen_puts = unseen_puts.saturating_add(puts);
        let explained = bucket.first_seen.min(unseen_puts);
        unseen_puts -= explained;
        unexplained = (bucket.second, bucket.first_seen - explained);
        let count = puts.saturating_add(unexplained.1);
        if count > 0 {
            out.push((bucket.second, count));
        }
    }
    out
}

/// Most lines a second becomes in a trace: its arrivals spread evenly over the second (the
/// simulator puts a line's messages at one instant; real traffic spreads them), within
/// the simulator's limit of lines for a day.
pub(crate) const LINES_PER_SECOND: u64 = 10;

/// The trace (`seconds,count` per line, seconds from `from_second`) of `arrivals`, each
/// second's spread over up to `lines_per_second` lines; at most `max_count_per_line` in a
/// line.
pub(crate) fn trace_text(arrivals: &[(u64, u64)], from_second: u64, lines_per_second: u64, max_count_per_line: u64) -> String {
    let mut text = String::new();
    for &(second, count) in arrivals {
        let offset = second.saturating_sub(from_second);
        let lines = count.min(lines_per_second.max(1)).max(count.div_ceil(max_count_per_line.max(1)));
        for line in 0..lines {
            // Shares that differ by at most one and add up to `count`.
            let share = count / lines + u64::from(line < count % lines);
            let at = offset as f64 + line as f64 / lines as f64;
            if share == 1 {
                text.push_str(&format!("{at:.3}\n"));
            } else {
                text.push_str(&format!("{at:.3},{share}\n"));
            }
        }
    }
    text
}

/// `ebb trace export`'s reading of `--since`: at most this far back.
pub(crate) const MAX_SINCE: Duration = Duration::from_secs(31 * 24 * 3600);

/// Refuses a `--since` outside 1 s to [`MAX_SINCE`].
pub(crate) fn check_since(since: Duration) -> Result<Duration> {
    if since < Duration::from_secs(1) || since > MAX_SINCE {
        bail!("--since: {} is outside 1s to {} (the longest trace the simulator takes)", crate::durations::show(since), crate::durations::show(MAX_SINCE));
    }
    Ok(since)
}

/// What the simulator takes in a trace.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TraceLimits {
    /// Lines.
    pub max_lines: u64,
    /// Messages in a line.
    pub max_count_per_line: u64,
    /// Messages in all.
    pub max_messages: u64,
}

/// Reads what `data_dir` recorded for `queue` over the last `since` before `now_ms`, and
/// gives the trace and how many messages it holds: each second spread over up to
/// `LINES_PER_SECOND` lines, or a line per second when that would be more lines than
/// the simulator takes. More messages or busy seconds than it takes is an error saying so.
pub(crate) fn export(data_dir: &Path, queue: &str, since: Duration, now_ms: u64, limits: TraceLimits) -> Result<Export> {
    check_since(since)?;
    let now_second = now_ms / 1000;
    let from_second = now_second.saturating_sub(since.as_secs());
    let (buckets, mut warnings) = read(data_dir, queue, from_second);
    // A second after now was recorded under a clock since stepped back (or written by hand):
    // in the trace it would stretch it past what the simulator takes.
    let (buckets, ahead): (Vec<_>, Vec<_>) = buckets.into_iter().partition(|b| b.second <= now_second);
    if let Some(latest) = ahead.iter().map(|b| b.second).max() {
        let at = std::time::UNIX_EPOCH
            .checked_add(Duration::from_secs(latest))
            .map_or_else(|| format!("second {latest}"), |t| humantime::format_rfc3339_seconds(t).to_string());
        warnings.push(format!("queue {queue}: skipped {} seconds recorded after now (a clock stepped back?), the latest {at}", ahead.len()));
    }
    let arrivals = arrivals(&buckets);
    let messages = arrivals.iter().map(|(_, n)| *n).fold(0u64, u64::saturating_add);
    if messages > limits.max_messages {
        bail!(
            "queue {queue}: {messages} messages recorded in the last {}, more than the {} a trace holds; give a shorter --since",
            crate::durations::show(since),
            limits.max_messages
        );
    }
    let lines_for =
        |per_second: u64| arrivals.iter().map(|(_, n)| (*n).min(per_second).max(n.div_ceil(limits.max_count_per_line.max(1)))).fold(0u64, u64::saturating_add);
    let Some(per_second) = [LINES_PER_SECOND, 1].into_iter().find(|per_second| lines_for(*per_second) <= limits.max_lines) else {
        bail!(
            "queue {queue}: {} seconds with arrivals in the last {}, more than the {} lines a trace holds; give a shorter --since",
            arrivals.len(),
            crate::durations::show(since),
            limits.max_lines
        );
    };
    let first = arrivals.first().map_or(from_second, |(second, _)| *second);
    let text = trace_text(&arrivals, first, per_second, limits.max_count_per_line);
    Ok(Export { text, messages, first_second: (!arrivals.is_empty()).then_some(first), warnings })
}

/// What [`export`] gives.
#[derive(Debug)]
pub(crate) struct Export {
    /// The trace: `seconds,count` lines, seconds from `first_second`.
    pub text: String,
    /// Messages in it.
    pub messages: u64,
    /// The Unix second its time 0 stands for (`None`: nothing was recorded in the window).
    pub first_second: Option<u64>,
    /// Files skipped, with the reason.
    pub warnings: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::TokioClock;

    fn recorder_in(dir: &Path, max_bytes: u64) -> (Arc<Recorder>, Arc<QueueRecording>, Arc<TokioClock>) {
        let mut recorder = Recorder::new();
        let clock = Arc::new(TokioClock::new());
        let recording = recorder.add(dir, "orders", max_bytes, clock.clone());
        (Arc::new(recorder), recording, clock)
    }

    #[tokio::test(start_paused = true)]
    async fn seconds_are_counted_apart_and_written_once_finished() {
        let dir = tempfile::tempdir().unwrap();
        let (recorder, recording, clock) = recorder_in(dir.path(), 8 << 20);
        // Start on a second's edge, so the counts below fall in known seconds.
        tokio::time::advance(Duration::from_millis(1000 - clock.now_ms() % 1000)).await;
        let first = clock.now_ms() / 1000;
        recording.record(Seen::Put, 3);
        recording.record(Seen::FirstGet, 2);
        tokio::time::advance(Duration::from_millis(1500)).await;
        recording.record(Seen::FirstGet, 1);
        recording.record(Seen::Notification, 1);
        recorder.flush(false);
        let (buckets, warnings) = read(dir.path(), "orders", 0);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(buckets, vec![Bucket { second: first, puts: 3, first_seen: 2, notifications: 0 }], "the current second waits");
        // Twenty seconds later (past the ring): the second still waiting was not lost.
        tokio::time::advance(Duration::from_secs(20)).await;
        recording.record(Seen::Put, 1);
        recorder.flush(true);
        let (buckets, _) = read(dir.path(), "orders", 0);
        let seconds: Vec<(u64, u64, u64, u64)> = buckets.iter().map(|b| (b.second - first, b.puts, b.first_seen, b.notifications)).collect();
        assert_eq!(seconds, vec![(0, 3, 2, 0), (1, 0, 1, 1), (21, 1, 0, 0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_pushed_out_of_the_ring_before_the_flush_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (recorder, recording, _clock) = recorder_in(dir.path(), 8 << 20);
        recording.record(Seen::Put, 5);
        // The same slot again, RING seconds on, with no flush between.
        tokio::time::advance(Duration::from_secs(RING as u64)).await;
        recording.record(Seen::Put, 7);
        recorder.flush(true);
        let (buckets, _) = read(dir.path(), "orders", 0);
        assert_eq!(buckets.iter().map(|b| b.puts).collect::<Vec<_>>(), vec![5, 7]);
        assert_eq!(buckets[1].second - buckets[0].second, RING as u64);
    }

    /// Review note: a rotation blocked by something in the way of the `.old.csv` file was
    /// reported as the bare OS error next to the current file's name, which is not the problem.
    #[test]
    fn a_rotation_that_cannot_happen_names_the_file_in_the_way() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = Files::new(dir.path(), "orders", 200);
        std::fs::create_dir_all(files.old.join("in-the-way")).unwrap();
        let buckets: Vec<Bucket> = (0..20).map(|second| Bucket { second, puts: 1, ..Bucket::default() }).collect();
        files.append(&buckets[..2]).unwrap();
        let error = files.append(&buckets[2..]).unwrap_err().to_string();
        assert!(error.contains("could not rotate into") && error.contains("orders.old.csv"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_files_rotate_and_stay_under_the_cap_dropping_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let cap = 4096;
        let (recorder, recording, clock) = recorder_in(dir.path(), cap);
        let start = clock.now_ms() / 1000;
        for _ in 0..2000 {
            recording.record(Seen::Put, 1);
            tokio::time::advance(Duration::from_secs(1)).await;
            recorder.flush(false);
        }
        let [old, current] = files_of(dir.path(), "orders");
        let total = std::fs::metadata(&old).unwrap().len() + std::fs::metadata(&current).unwrap().len();
        assert!(total <= cap, "{total} bytes over the cap of {cap}");
        let (buckets, warnings) = read(dir.path(), "orders", 0);
        assert!(warnings.is_empty(), "{warnings:?}");
        // The newest seconds are kept, without a gap; the oldest were dropped.
        let last = buckets.last().unwrap().second;
        assert_eq!(last, start + 1999);
        assert!(buckets.first().unwrap().second > start + 1000, "the oldest are dropped");
        assert!(buckets.windows(2).all(|w| w[1].second == w[0].second + 1), "no gap in what is kept");
        assert!(buckets.len() > 100, "about half the cap's worth or more is kept: {}", buckets.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_damaged_line_is_skipped_with_a_warning_and_the_rest_read() {
        let dir = tempfile::tempdir().unwrap();
        let (recorder, recording, _clock) = recorder_in(dir.path(), 8 << 20);
        recording.record(Seen::Put, 4);
        recorder.flush(true);
        let [old, current] = files_of(dir.path(), "orders");
        std::fs::write(&old, format!("{HEADER}\n12,1,0,0\n13,x,0,0\n")).unwrap();
        let (buckets, warnings) = read(dir.path(), "orders", 0);
        assert_eq!(buckets.iter().map(|b| b.puts).sum::<u64>(), 5, "the current file counts, and the old one's good line");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("orders.old.csv") && warnings[0].contains("1 damaged line") && warnings[0].contains("line 3"), "{warnings:?}");
        assert_eq!(buckets.iter().map(|b| b.second).collect::<Vec<_>>()[..1], [12], "the old file's good line still counts");
        // A line cut short at the end (a crash mid-write) is left out, not a damage.
        let text = std::fs::read_to_string(&current).unwrap();
        std::fs::write(&current, format!("{text}99,1")).unwrap();
        std::fs::write(&old, "not a recording\n").unwrap();
        let (buckets, warnings) = read(dir.path(), "orders", 0);
        assert_eq!(buckets.iter().map(|b| b.puts).sum::<u64>(), 4);
        assert!(warnings[0].contains("skipped 1 damaged line"), "{warnings:?}");
        // A later version of the format is not read as this one.
        std::fs::write(&old, "# ebb arrivals v2: unix_second,queue,puts\n12,orders,1\n").unwrap();
        let (_, warnings) = read(dir.path(), "orders", 0);
        assert!(warnings[0].contains("a version of the format this ebb does not read"), "{warnings:?}");
        // Not a regular file: refused at once, not read.
        std::fs::remove_file(&old).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &old).unwrap();
        let (_, warnings) = read(dir.path(), "orders", 0);
        assert!(warnings[0].contains("not a regular file"), "{warnings:?}");
        // A link to a regular file is not followed either.
        std::fs::remove_file(&old).unwrap();
        let elsewhere = dir.path().join("elsewhere.csv");
        std::fs::write(&elsewhere, format!("{HEADER}\n777,5,0,0\n")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &old).unwrap();
        let (buckets, warnings) = read(dir.path(), "orders", 0);
        assert!(warnings[0].contains("a symbolic link, not a regular file"), "{warnings:?}");
        assert!(buckets.iter().all(|b| b.second != 777), "the linked file was read: {buckets:?}");
        // Nor a hard link of a file elsewhere (attack, session 13: it was read and exported).
        std::fs::remove_file(&old).unwrap();
        std::fs::hard_link(&elsewhere, &old).unwrap();
        let (buckets, warnings) = read(dir.path(), "orders", 0);
        assert!(warnings[0].contains("a hard link of another file"), "{warnings:?}");
        assert!(buckets.iter().all(|b| b.second != 777), "the linked file was read: {buckets:?}");
        // An end without a line end longer than any line is damage, not a crash's cut
        // (attack, session 13: a file of NULs read as an empty recording without a word).
        std::fs::remove_file(&old).unwrap();
        std::fs::write(&old, format!("{HEADER}\n12,1,0,0\n{}", "\0".repeat(10_000))).unwrap();
        let (buckets, warnings) = read(dir.path(), "orders", 0);
        assert!(warnings[0].contains("10000 bytes without a line end"), "{warnings:?}");
        assert!(buckets.iter().any(|b| b.second == 12), "the lines before it are read: {buckets:?}");
        std::fs::write(&old, format!("{HEADER}\n12,1,0,0\n13,1,0")).unwrap();
        let (_, warnings) = read(dir.path(), "orders", 0);
        assert!(warnings.is_empty(), "a line cut short is no damage: {warnings:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn damaged_lines_are_skipped_with_one_warning_that_counts_them() {
        let dir = tempfile::tempdir().unwrap();
        let [_, current] = files_of(dir.path(), "orders");
        std::fs::create_dir_all(current.parent().unwrap()).unwrap();
        // A line with a letter, a stray byte that is not UTF-8, a line cut by a crash and
        // written over: each is one damaged line; the good lines around them still count.
        let mut bytes = format!("{HEADER}\n10,1,0,0\n11,x,0,0\n").into_bytes();
        bytes.extend_from_slice(b"12,2,0\xff,0\n13,4,0,0\n14,115,1,0,0\n15,8,0,0\n");
        std::fs::write(&current, bytes).unwrap();
        let (buckets, warnings) = read(dir.path(), "orders", 0);
        assert_eq!(buckets.iter().map(|b| (b.second, b.puts)).collect::<Vec<_>>(), vec![(10, 1), (13, 4), (15, 8)]);
        assert_eq!(warnings.len(), 1, "one warning for the file: {warnings:?}");
        assert!(warnings[0].contains("orders.csv") && warnings[0].contains("3 damaged lines") && warnings[0].contains("line 3"), "{warnings:?}");
    }

    /// Attack pass (session 11): a second recorded in the future went into the trace, which
    /// the simulator then refused (past 31 days), or stretched it to 2^64 seconds.
    #[test]
    fn seconds_recorded_after_now_are_left_out_of_the_export_with_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let [_, current] = files_of(dir.path(), "orders");
        std::fs::create_dir_all(current.parent().unwrap()).unwrap();
        let now = 1_000_000_000u64;
        std::fs::write(&current, format!("{HEADER}\n{},3,0,0\n{},5,0,0\n{},7,0,0\n", now - 9, now + 40 * 86_400, u64::MAX)).unwrap();
        let limits = TraceLimits { max_lines: 1_000, max_count_per_line: 1_000, max_messages: 1_000 };
        let export = export(dir.path(), "orders", Duration::from_secs(3600), now * 1000 + 500, limits).unwrap();
        assert_eq!(export.messages, 3, "{}", export.text);
        assert_eq!(export.first_second, Some(now - 9));
        assert!(export.warnings.iter().any(|w| w.contains("skipped 2 seconds recorded after now")), "{:?}", export.warnings);
    }

    #[tokio::test(start_paused = true)]
    async fn a_recording_file_deleted_while_the_host_runs_is_recreated_with_its_header() {
        let dir = tempfile::tempdir().unwrap();
        let (recorder, recording, _clock) = recorder_in(dir.path(), 8 << 20);
        recording.record(Seen::Put, 2);
        recorder.flush(true);
        let [_, current] = files_of(dir.path(), "orders");
        std::fs::remove_file(&current).unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        recording.record(Seen::Put, 3);
        recorder.flush(true);
        let text = std::fs::read_to_string(&current).unwrap();
        assert!(text.starts_with(&format!("{HEADER}\n")), "{text:?}");
        let (buckets, warnings) = read(dir.path(), "orders", 0);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(buckets.iter().map(|b| b.puts).sum::<u64>(), 3);
        // The folder too: it is made again.
        std::fs::remove_dir_all(current.parent().unwrap()).unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        recording.record(Seen::Put, 4);
        recorder.flush(true);
        assert!(recording.is_active(), "a removed folder is made again, not a reason to stop");
        let (buckets, warnings) = read(dir.path(), "orders", 0);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(buckets.iter().map(|b| b.puts).sum::<u64>(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_torn_tail_is_cut_on_open_so_the_next_append_starts_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let [_, current] = files_of(dir.path(), "orders");
        std::fs::create_dir_all(current.parent().unwrap()).unwrap();
        // The last host crashed in the middle of a line.
        std::fs::write(&current, format!("{HEADER}\n10,1,0,0\n11,7")).unwrap();
        let (recorder, recording, _clock) = recorder_in(dir.path(), 8 << 20);
        recording.record(Seen::Put, 5);
        recorder.flush(true);
        let (buckets, warnings) = read(dir.path(), "orders", 0);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(buckets.iter().map(|b| b.puts).collect::<Vec<_>>(), vec![1, 5]);
        // A file torn inside its header is begun again.
        std::fs::write(&current, &HEADER[..10]).unwrap();
        let (recorder, recording, _clock) = recorder_in(dir.path(), 8 << 20);
        recording.record(Seen::Put, 6);
        recorder.flush(true);
        let (buckets, warnings) = read(dir.path(), "orders", 0);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(buckets.iter().map(|b| b.puts).collect::<Vec<_>>(), vec![6]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_folder_that_cannot_be_written_stops_the_recording_not_the_counting_caller() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the recordings' folder should be: nothing can be created under it.
        std::fs::write(dir.path().join(DIR), b"in the way").unwrap();
        let (recorder, recording, _clock) = recorder_in(dir.path(), 8 << 20);
        recording.record(Seen::Put, 1);
        recorder.flush(true);
        assert!(!recording.is_active(), "a failed write stops the recording");
        // Counting afterwards costs nothing and fails nothing.
        recording.record(Seen::Put, 1);
        assert!(recording.take_finished(true).is_empty(), "nothing is counted once stopped");
    }

    /// Issue 22, defect 4: a FIFO, or a link to /dev/zero, at the recording's path was
    /// written to without a word (a FIFO nobody reads would block the flush once full). Only a
    /// regular file is written: anything else stops that queue's recording, the caller counts on.
    #[tokio::test(start_paused = true)]
    async fn a_recording_path_that_is_not_a_regular_file_stops_the_recording_and_is_not_written() {
        for kind in ["fifo", "link to /dev/zero", "hard link"] {
            let dir = tempfile::tempdir().unwrap();
            let [_, current] = files_of(dir.path(), "orders");
            std::fs::create_dir_all(current.parent().unwrap()).unwrap();
            let victim = dir.path().join("victim.txt");
            std::fs::write(&victim, "victim\n").unwrap();
            match kind {
                "fifo" => assert!(std::process::Command::new("mkfifo").arg(&current).status().unwrap().success()),
                "hard link" => std::fs::hard_link(&victim, &current).unwrap(),
                _ => std::os::unix::fs::symlink("/dev/zero", &current).unwrap(),
            }
            let (recorder, recording, _clock) = recorder_in(dir.path(), 8 << 20);
            recording.record(Seen::Put, 3);
            recorder.flush(true);
            assert!(!recording.is_active(), "{kind}: the recording stops");
            recording.record(Seen::Put, 1);
            assert!(recording.take_finished(true).is_empty(), "{kind}: nothing is counted once stopped");
            use std::os::unix::fs::FileTypeExt as _;
            assert_eq!(std::fs::symlink_metadata(&current).unwrap().file_type().is_fifo(), kind == "fifo", "{kind}: left as it was");
            assert_eq!(std::fs::read_to_string(&victim).unwrap(), "victim\n", "{kind}: nothing written through a hard link");
        }
    }

    #[test]
    fn first_sights_of_puts_through_the_host_are_not_counted_twice() {
        let bucket = |second, puts, first_seen| Bucket { second, puts, first_seen, notifications: 0 };
        // 3 put at 10, seen at 11: three arrivals, at 10.
        assert_eq!(arrivals(&[bucket(10, 3, 0), bucket(11, 0, 3)]), vec![(10, 3)]);
        // At 12, 1 put here and 2 put elsewhere, all 3 first seen at 12 and 13. Without ids,
        // which sight a put accounts for is not known: oldest first; the total is exact.
        let buckets = [bucket(12, 1, 2), bucket(13, 0, 1)];
        assert_eq!(arrivals(&buckets), vec![(12, 2), (13, 1)]);
        // Messages waiting before the host started: seen, never put through it.
        assert_eq!(arrivals(&[bucket(5, 0, 40)]), vec![(5, 40)]);
    }

    #[test]
    fn a_put_recorded_the_second_after_a_long_poll_took_its_message_is_one_arrival() {
        let bucket = |second, puts, first_seen| Bucket { second, puts, first_seen, notifications: 0 };
        // Seen at 9.999 by a waiting receive, its put's call returned at 10.001.
        assert_eq!(arrivals(&[bucket(9, 0, 1), bucket(10, 1, 0)]), vec![(9, 1)]);
        // One put elsewhere seen at 9, one put here at 10 and seen at 11: two arrivals.
        let total: u64 = arrivals(&[bucket(9, 0, 1), bucket(10, 1, 0), bucket(11, 0, 1)]).iter().map(|(_, n)| n).sum();
        assert_eq!(total, 2);
        // Two seconds apart: not the same message.
        assert_eq!(arrivals(&[bucket(8, 0, 1), bucket(10, 1, 0)]), vec![(8, 1), (10, 1)]);
    }

    #[test]
    fn a_trace_spreads_each_second_and_reads_back_as_the_same_arrivals() {
        // (seconds, count) per line, as the simulator reads `seconds[,count]`.
        let lines = |text: &str| -> Vec<(f64, u64)> {
            text.lines()
                .map(|line| match line.split_once(',') {
                    Some((at, count)) => (at.parse().unwrap(), count.parse().unwrap()),
                    None => (line.parse().unwrap(), 1),
                })
                .collect()
        };
        let arrivals = lines(&trace_text(&[(100, 1), (101, 25), (105, 3)], 100, LINES_PER_SECOND, 100_000));
        assert_eq!(arrivals.iter().map(|a| a.1).sum::<u64>(), 29);
        let in_second = |s: f64| arrivals.iter().filter(|a| a.0.floor() == s).count();
        assert_eq!((in_second(0.0), in_second(1.0), in_second(5.0)), (1, 10, 3));
        assert!(arrivals.windows(2).all(|w| w[0].0 < w[1].0), "spread, in order: {arrivals:?}");
        // A line never holds more than the simulator takes.
        let big = lines(&trace_text(&[(0, 2_000_000)], 0, LINES_PER_SECOND, 100_000));
        assert!(big.iter().all(|a| a.1 <= 100_000));
        assert_eq!(big.iter().map(|a| a.1).sum::<u64>(), 2_000_000);
    }

    #[test]
    fn since_is_bounded() {
        assert!(check_since(Duration::from_secs(3600)).is_ok());
        for bad in [Duration::ZERO, Duration::from_secs(32 * 24 * 3600)] {
            assert!(format!("{:#}", check_since(bad).unwrap_err()).contains("outside 1s to 31days"));
        }
    }
}
