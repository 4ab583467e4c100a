//! What a run is measured with: CPU time, of this process and of its threads (the bytes redb
//! writes are counted by the store's own `CountingBackend`).

use std::time::Duration;

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
