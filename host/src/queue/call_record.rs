//! What became of one storage queue's calls: failures by kind and class, retries, calls given
//! up, deletes found already done, and when the last call and the last count succeeded.
//! [`Retrying`](super::Retrying) keeps one; `/metrics` and `/status` read it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::failure::{CallKind, FailureClass};
use crate::health::truncate_reason;

const KINDS: usize = CallKind::ALL.len();
const CLASSES: usize = FailureClass::ALL.len();

/// Live counters of one storage queue's calls. Shared (`Arc`) with whoever reports them.
#[derive(Debug)]
pub struct CallRecord {
    queue: String,
    failures: [[AtomicU64; CLASSES]; KINDS],
    retries: [AtomicU64; KINDS],
    gave_up: [AtomicU64; KINDS],
    already_done: AtomicU64,
    recreated: AtomicU64,
    abandoned: AtomicU64,
    times: Mutex<Times>,
}

#[derive(Debug, Default)]
struct Times {
    last_success: Option<Instant>,
    last_count: Option<Instant>,
    last_failure: Option<(Instant, CallKind, FailureClass, String)>,
}

impl CallRecord {
    /// An empty record for storage queue `queue`.
    pub fn new(queue: &str) -> Self {
        CallRecord {
            queue: queue.to_string(),
            failures: Default::default(),
            retries: Default::default(),
            gave_up: Default::default(),
            already_done: AtomicU64::new(0),
            recreated: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            times: Mutex::default(),
        }
    }

    /// The storage queue's name.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// A call of `kind` failed with `class` (each attempt counts).
    pub fn record_failure(&self, kind: CallKind, class: FailureClass, error: &str) {
        self.failures[kind.index()][class.index()].fetch_add(1, Ordering::Relaxed);
        self.times().last_failure = Some((Instant::now(), kind, class, truncate_reason(error)));
    }

    /// A call of `kind` is tried again.
    pub fn record_retry(&self, kind: CallKind) {
        self.retries[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// A call of `kind` failed for good: not retried, or out of attempts.
    pub fn record_gave_up(&self, kind: CallKind) {
        self.gave_up[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// A delete retried after an attempt that may have reached the service found the message
    /// gone: the earlier attempt had deleted it.
    pub fn record_already_done(&self) {
        self.already_done.fetch_add(1, Ordering::Relaxed);
    }

    /// The queue was found missing and created again.
    pub fn record_recreated(&self) {
        self.recreated.fetch_add(1, Ordering::Relaxed);
    }

    /// An attempt was given up before its answer came (its caller stopped waiting: the
    /// listener shutting down mid-get). Its outcome is unknown: the service may have
    /// refused it, failed it, or done it; so it is neither a failure nor an answer.
    pub fn record_abandoned(&self) {
        self.abandoned.fetch_add(1, Ordering::Relaxed);
    }

    /// The storage answered a call of `kind` (whatever the answer).
    pub fn record_answer(&self, kind: CallKind) {
        let now = Instant::now();
        let mut times = self.times();
        times.last_success = Some(now);
        if kind == CallKind::Count {
            times.last_count = Some(now);
        }
    }

    /// The depth was read now where reading it is free (the embedded store).
    pub fn record_local_count(&self) {
        self.times().last_count = Some(Instant::now());
    }

    /// Failed attempts of `kind` with `class`.
    pub fn failures(&self, kind: CallKind, class: FailureClass) -> u64 {
        self.failures[kind.index()][class.index()].load(Ordering::Relaxed)
    }

    /// Retries of calls of `kind`.
    pub fn retries(&self, kind: CallKind) -> u64 {
        self.retries[kind.index()].load(Ordering::Relaxed)
    }

    /// Calls of `kind` that failed for good.
    pub fn gave_up(&self, kind: CallKind) -> u64 {
        self.gave_up[kind.index()].load(Ordering::Relaxed)
    }

    fn times(&self) -> std::sync::MutexGuard<'_, Times> {
        self.times.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The figures now.
    pub fn snapshot(&self) -> CallSnapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for kind in CallKind::ALL {
            for class in FailureClass::ALL {
                let count = load(&self.failures[kind.index()][class.index()]);
                if count > 0 {
                    failures.push(FailureCount { kind, class, count });
                }
            }
        }
        let by_kind = |counters: &[AtomicU64; KINDS]| -> Vec<KindCount> {
            CallKind::ALL.iter().map(|&kind| KindCount { kind, count: load(&counters[kind.index()]) }).filter(|c| c.count > 0).collect()
        };
        let now = Instant::now();
        let age = |at: Option<Instant>| at.map(|at| now.saturating_duration_since(at).as_secs_f64());
        let times = self.times();
        CallSnapshot {
            queue: self.queue.clone(),
            failures,
            retries: by_kind(&self.retries),
            gave_up: by_kind(&self.gave_up),
            already_done: load(&self.already_done),
            recreated: load(&self.recreated),
            abandoned: load(&self.abandoned),
            last_success_age_secs: age(times.last_success),
            last_count_age_secs: age(times.last_count),
            last_failure: times.last_failure.as_ref().map(|(at, kind, class, error)| LastFailure {
                kind: *kind,
                class: *class,
                error: error.clone(),
                age_secs: now.saturating_duration_since(*at).as_secs_f64(),
            }),
        }
    }
}

/// Failed calls of one kind and class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureCount {
    /// The kind of call.
    pub kind: CallKind,
    /// The class of failure.
    pub class: FailureClass,
    /// How many attempts failed so.
    pub count: u64,
}

/// A count by kind of call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindCount {
    /// The kind of call.
    pub kind: CallKind,
    /// How many.
    pub count: u64,
}

/// The last failure seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastFailure {
    /// The kind of call.
    pub kind: CallKind,
    /// The class of failure.
    pub class: FailureClass,
    /// The storage's error text, truncated.
    pub error: String,
    /// Seconds since.
    pub age_secs: f64,
}

/// A snapshot of a [`CallRecord`], as `/status` shows it (only counts above zero are listed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CallSnapshot {
    /// The storage queue.
    pub queue: String,
    /// Failed attempts by kind and class.
    pub failures: Vec<FailureCount>,
    /// Retries by kind.
    pub retries: Vec<KindCount>,
    /// Calls that failed for good by kind (not worth retrying, or out of attempts).
    pub gave_up: Vec<KindCount>,
    /// Deletes whose retry found the message already gone after an attempt that may have
    /// reached the service: done by that attempt, not a lost lease.
    pub already_done: u64,
    /// Times the queue was found missing (deleted while the host ran) and created again.
    pub recreated: u64,
    /// Attempts given up before their answer came (the host stopping mid-call): whether
    /// the service failed them or did them is unknown.
    pub abandoned: u64,
    /// Seconds since the storage last answered a call (`None`: never).
    pub last_success_age_secs: Option<f64>,
    /// Seconds since the queue's depth was last read (`None`: never).
    pub last_count_age_secs: Option<f64>,
    /// The last failure, if any.
    pub last_failure: Option<LastFailure>,
}

impl CallSnapshot {
    /// Failed attempts in all.
    pub fn failed_attempts(&self) -> u64 {
        self.failures.iter().map(|f| f.count).sum()
    }

    /// Retries in all.
    pub fn total_retries(&self) -> u64 {
        self.retries.iter().map(|r| r.count).sum()
    }

    /// Failed attempts of `kind` with `class`.
    pub fn failures_of(&self, kind: CallKind, class: FailureClass) -> u64 {
        self.failures.iter().filter(|f| f.kind == kind && f.class == class).map(|f| f.count).sum()
    }

    /// Retries of calls of `kind`.
    pub fn retries_of(&self, kind: CallKind) -> u64 {
        count_of(&self.retries, kind)
    }

    /// Calls of `kind` that failed for good.
    pub fn gave_up_of(&self, kind: CallKind) -> u64 {
        count_of(&self.gave_up, kind)
    }

    /// Adds `other`'s figures, another client's of the same storage queue (a reply queue
    /// that another configured queue handles): counts add up, ages are the more recent.
    pub fn merge(&mut self, other: &CallSnapshot) {
        for failure in &other.failures {
            match self.failures.iter_mut().find(|f| f.kind == failure.kind && f.class == failure.class) {
                Some(mine) => mine.count += failure.count,
                None => self.failures.push(*failure),
            }
        }
        self.failures.sort_by_key(|f| (f.kind, f.class));
        add_counts(&mut self.retries, &other.retries);
        add_counts(&mut self.gave_up, &other.gave_up);
        self.already_done += other.already_done;
        self.recreated += other.recreated;
        self.abandoned += other.abandoned;
        let newer = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_success_age_secs = newer(self.last_success_age_secs, other.last_success_age_secs);
        self.last_count_age_secs = newer(self.last_count_age_secs, other.last_count_age_secs);
        if let Some(theirs) = &other.last_failure
            && self.last_failure.as_ref().is_none_or(|mine| theirs.age_secs < mine.age_secs)
        {
            self.last_failure = Some(theirs.clone());
        }
    }
}

fn count_of(counts: &[KindCount], kind: CallKind) -> u64 {
    counts.iter().filter(|c| c.kind == kind).map(|c| c.count).sum()
}

fn add_counts(mine: &mut Vec<KindCount>, theirs: &[KindCount]) {
    for count in theirs {
        match mine.iter_mut().find(|c| c.kind == count.kind) {
            Some(c) => c.count += count.count,
            None => mine.push(*count),
        }
    }
    mine.sort_by_key(|c| c.kind);
}

/// How long ago, for log lines: "400 ms", "3.2 s".
pub(crate) fn short_duration(duration: Duration) -> String {
    if duration < Duration::from_secs(1) { format!("{} ms", duration.as_millis()) } else { format!("{:.1} s", duration.as_secs_f64()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_snapshot_lists_what_happened_and_how_long_ago() {
        let record = CallRecord::new("orders");
        let empty = record.snapshot();
        assert_eq!((empty.failed_attempts(), empty.last_success_age_secs, empty.last_failure), (0, None, None));
        record.record_failure(CallKind::Get, FailureClass::Connection, &"x".repeat(10_000));
        record.record_retry(CallKind::Get);
        record.record_answer(CallKind::Get);
        record.record_failure(CallKind::Delete, FailureClass::Throttled, "busy");
        record.record_failure(CallKind::Delete, FailureClass::Throttled, "busy");
        tokio::time::advance(Duration::from_secs(3)).await;
        record.record_answer(CallKind::Count);
        tokio::time::advance(Duration::from_secs(2)).await;
        let s = record.snapshot();
        assert_eq!(
            s.failures,
            vec![
                FailureCount { kind: CallKind::Get, class: FailureClass::Connection, count: 1 },
                FailureCount { kind: CallKind::Delete, class: FailureClass::Throttled, count: 2 }
            ]
        );
        assert_eq!((s.failed_attempts(), s.total_retries()), (3, 1));
        assert_eq!((s.last_success_age_secs, s.last_count_age_secs), (Some(2.0), Some(2.0)));
        let last = s.last_failure.unwrap();
        assert_eq!((last.kind, last.class, last.error.as_str(), last.age_secs), (CallKind::Delete, FailureClass::Throttled, "busy", 5.0));
        record.record_failure(CallKind::Get, FailureClass::Other, &"y".repeat(10_000));
        assert!(record.snapshot().last_failure.unwrap().error.len() < 600, "a long error text is cut");
    }

    #[tokio::test(start_paused = true)]
    async fn two_records_of_one_storage_queue_merge_into_sums_and_the_latest_times() {
        let (first, second) = (CallRecord::new("invoices"), CallRecord::new("invoices"));
        first.record_failure(CallKind::Put, FailureClass::Throttled, "busy");
        first.record_retry(CallKind::Put);
        first.record_answer(CallKind::Put);
        tokio::time::advance(Duration::from_secs(3)).await;
        second.record_failure(CallKind::Put, FailureClass::Throttled, "busy again");
        second.record_failure(CallKind::Get, FailureClass::Connection, "reset");
        second.record_retry(CallKind::Get);
        second.record_answer(CallKind::Get);
        tokio::time::advance(Duration::from_secs(1)).await;
        let mut merged = first.snapshot();
        merged.merge(&second.snapshot());
        assert_eq!((merged.failures_of(CallKind::Put, FailureClass::Throttled), merged.failures_of(CallKind::Get, FailureClass::Connection)), (2, 1));
        assert_eq!((merged.retries_of(CallKind::Put), merged.retries_of(CallKind::Get), merged.total_retries()), (1, 1, 2));
        assert_eq!(merged.last_success_age_secs, Some(1.0));
        assert_eq!(merged.last_failure.map(|f| f.error), Some("reset".to_string()));
    }

    #[test]
    fn short_durations_read_as_milliseconds_and_longer_ones_as_seconds() {
        assert_eq!(short_duration(Duration::from_millis(400)), "400 ms");
        assert_eq!(short_duration(Duration::from_millis(3200)), "3.2 s");
    }
}
