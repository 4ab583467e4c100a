//! The counters behind `QueryState()`, the messages claimed on this host, the recent
//! window the task-count rule sees, what the last get returned and the arrivals seen.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::rules::{Decision, IdleDecision};

use super::calls::CallWindow;
use super::status::{DecisionWithInputs, PoisonForm, PoisonRecord, RECENT_DECISIONS, RecordedDecision, TaskCountInputs};

#[derive(Default)]
pub(in crate::listener) struct Counters {
    pub active_tasks: AtomicU32,
    pub target_tasks: AtomicU32,
    pub peak_tasks: AtomicU32,
    /// The most tasks since a reader last took it (`Listener::take_recent_peak_tasks`).
    pub recent_peak_tasks: AtomicU32,
    pub tasks_started: AtomicU64,
    pub in_flight: AtomicU32,
    pub processed: AtomicU64,
    pub failed: AtomicU64,
    pub poisoned: AtomicU64,
    pub released_on_shutdown: AtomicU64,
    pub lease_renewals: AtomicU64,
    pub leases_lost: AtomicU64,
    pub poison_failures: AtomicU64,
    pub storage_errors: AtomicU64,
    pub work_detected: AtomicU64,
    pub safety_polls: AtomicU64,
    pub handler_panics: AtomicU64,
    pub host_errors: AtomicU64,
    pub pushed_back: AtomicU64,
    pub retry_after_capped: AtomicU64,
    pub retry_after_unusable: AtomicU64,
    pub task_panics: AtomicU64,
    pub rule_call_panics: AtomicU64,
    /// Failures the queue's failure rule decided, by decision (see `failures`).
    pub failure_rule_retries: AtomicU64,
    pub failure_rule_poisons: AtomicU64,
    pub failure_rule_defaults: AtomicU64,
    pub last_depth: AtomicU64,
    /// When `last_depth` was read, in ms since the epoch (0: never).
    pub last_depth_at_ms: AtomicU64,
    handler_micros: AtomicU64,
    poison: Mutex<PoisonLog>,
    claimed: Mutex<HashSet<String>>,
    window: Mutex<Option<WindowStart>>,
    decisions: Mutex<Decisions>,
    last_get: Mutex<LastGet>,
    /// One more than the oldest message age of the last get that returned messages, in ms
    /// (0: none yet), so the default means none.
    pickup_latency_ms: AtomicU64,
    recent_decisions: Mutex<VecDeque<DecisionWithInputs>>,
    arrivals: Mutex<Arrivals>,
    /// The handler calls that ended in the concurrency decision's current window.
    pub calls: Mutex<CallWindow>,
    /// The rule's last concurrency decision (none while it has made none).
    pub last_concurrency: Mutex<Option<RecordedDecision<u32>>>,
    /// Envelopes and their items.
    pub items: ItemCounters,
}

/// What became of envelopes and their items.
#[derive(Default)]
pub(in crate::listener) struct ItemCounters {
    /// Envelopes whose items were delivered.
    pub envelopes: AtomicU64,
    /// Items handled.
    pub delivered: AtomicU64,
    /// Item deliveries that failed (each retried alone, or poisoned).
    pub failed: AtomicU64,
    /// Items moved to the poison queue alone.
    pub poisoned: AtomicU64,
    /// Answers put on the reply queue.
    pub replies: AtomicU64,
}

/// What the last get that answered returned (contract 0.2.0's `last-get-messages` and
/// `oldest-message-age-ms`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::listener) struct LastGet {
    /// Messages it returned.
    pub messages: u32,
    /// Messages it asked for: fewer than asked means it emptied what was visible (a get
    /// may ask for less than a batch when few handler slots are free).
    pub asked: u32,
    /// How long the oldest of them had waited when it was returned, in ms.
    pub oldest_age_ms: Option<u64>,
}

/// The window over which arrivals are averaged (contract 0.2.0's `arrivals-per-sec`).
pub(in crate::listener) const ARRIVALS_WINDOW: Duration = Duration::from_secs(10);
/// Arrivals are counted in buckets of this length: the window slides by this much.
const ARRIVALS_BUCKET: Duration = Duration::from_secs(1);
const ARRIVALS_BUCKETS: usize = (ARRIVALS_WINDOW.as_secs() / ARRIVALS_BUCKET.as_secs()) as usize;

/// Arrivals (puts and notifications) per one-second bucket, over the last [`ARRIVALS_WINDOW`].
struct Arrivals {
    /// When counting began: bucket `n` covers `[start + n s, start + (n + 1) s)`.
    start: Instant,
    /// Counts by bucket number modulo [`ARRIVALS_BUCKETS`], with the bucket number each holds.
    buckets: [(u64, u64); ARRIVALS_BUCKETS],
}

impl Default for Arrivals {
    fn default() -> Self {
        Arrivals { start: Instant::now(), buckets: [(u64::MAX, 0); ARRIVALS_BUCKETS] }
    }
}

impl Arrivals {
    fn bucket(&self, at: Instant) -> u64 {
        (at.duration_since(self.start).as_millis() / ARRIVALS_BUCKET.as_millis()) as u64
    }

    fn add(&mut self, n: u64, at: Instant) {
        let bucket = self.bucket(at);
        let slot = &mut self.buckets[(bucket % ARRIVALS_BUCKETS as u64) as usize];
        if slot.0 != bucket {
            *slot = (bucket, 0);
        }
        slot.1 = slot.1.saturating_add(n);
    }

    /// Arrivals per second over the last [`ARRIVALS_WINDOW`] (the current bucket and the
    /// ones before it: 9 to 10 s), or since counting began when that is shorter (but
    /// never over less than a second, so one early arrival is not a flood).
    fn per_sec(&self, at: Instant) -> f64 {
        let current = self.bucket(at);
        let oldest = current.saturating_sub(ARRIVALS_BUCKETS as u64 - 1);
        let total: u64 = self.buckets.iter().filter(|(b, _)| *b != u64::MAX && (oldest..=current).contains(b)).map(|(_, n)| n).sum();
        let covered = at.duration_since(self.start).saturating_sub(ARRIVALS_BUCKET * oldest as u32);
        total as f64 / covered.max(ARRIVALS_BUCKET).as_secs_f64()
    }
}

/// How many recent poisonings the status keeps.
const RECENT_POISON: usize = 10;

#[derive(Default)]
struct PoisonLog {
    corrupt: u64,
    body_only: u64,
    recent: VecDeque<PoisonRecord>,
}

/// The poisonings the status shows.
pub(in crate::listener) struct Poisonings {
    pub corrupt: u64,
    pub body_only: u64,
    /// The last ones, oldest first.
    pub recent: Vec<PoisonRecord>,
}

/// A message claimed for handling on this host, released when dropped (however its
/// processing ends: success, failure, a panic, or the task being dropped).
pub(in crate::listener) struct Claim<'a> {
    counters: &'a Counters,
    id: String,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.counters.claimed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.id) {
            self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[derive(Default)]
struct Decisions {
    task_count: Option<RecordedDecision<u32>>,
    queue_empty: Option<RecordedDecision<IdleDecision>>,
}

#[derive(Clone, Copy)]
struct WindowStart {
    at: Instant,
    processed: u64,
    failed: u64,
    handler_micros: u64,
}

pub(in crate::listener) struct Window {
    pub throughput_per_sec: f64,
    pub mean_handler_latency_ms: f64,
    pub failures: u32,
}

impl Counters {
    /// Marks a message as being handled here until the claim is dropped; `None` if it already is.
    pub fn claim(&self, id: &str) -> Option<Claim<'_>> {
        if !self.claimed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id.to_string()) {
            return None;
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(Claim { counters: self, id: id.to_string() })
    }

    pub fn record_poison(&self, id: &str, reason: &str, form: PoisonForm) {
        self.poisoned.fetch_add(1, Ordering::Relaxed);
        let mut log = self.poison.lock().unwrap();
        log.corrupt += u64::from(reason.starts_with("corrupt"));
        log.body_only += u64::from(form == PoisonForm::Body);
        if log.recent.len() == RECENT_POISON {
            log.recent.pop_front();
        }
        log.recent.push_back(PoisonRecord { id: id.to_string(), reason: reason.to_string(), form, at: SystemTime::now() });
    }

    pub fn poisonings(&self) -> Poisonings {
        let log = self.poison.lock().unwrap();
        Poisonings { corrupt: log.corrupt, body_only: log.body_only, recent: log.recent.iter().cloned().collect() }
    }

    /// The last task-count and queue-empty decisions.
    pub fn last_decisions(&self) -> (Option<RecordedDecision<u32>>, Option<RecordedDecision<IdleDecision>>) {
        let decisions = self.decisions.lock().unwrap();
        (decisions.task_count.clone(), decisions.queue_empty.clone())
    }

    pub fn record_depth(&self, depth: u64, at: SystemTime) {
        self.last_depth.store(depth, Ordering::Relaxed);
        let ms = at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        self.last_depth_at_ms.store(ms, Ordering::Relaxed);
    }

    /// Microseconds spent in the handler, over every message.
    pub fn handler_micros(&self) -> u64 {
        self.handler_micros.load(Ordering::Relaxed)
    }

    pub fn record_success(&self, latency: Duration) {
        self.processed.fetch_add(1, Ordering::Relaxed);
        self.handler_micros.fetch_add(latency.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn record_failure(&self, latency: Duration) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        self.handler_micros.fetch_add(latency.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn record_task_count(&self, decision: Decision<u32>, inputs: TaskCountInputs) {
        let output = RecordedDecision { decision, at: SystemTime::now() };
        self.decisions.lock().unwrap().task_count = Some(output.clone());
        let mut recent = self.recent_decisions.lock().unwrap();
        if recent.len() == RECENT_DECISIONS {
            recent.pop_front();
        }
        recent.push_back(DecisionWithInputs { inputs, output });
    }

    /// The last task-count decisions with their inputs, oldest first.
    pub fn recent_decisions(&self) -> Vec<DecisionWithInputs> {
        self.recent_decisions.lock().unwrap().iter().cloned().collect()
    }

    /// How long the oldest message of the last get that returned messages had waited, in ms.
    pub fn pickup_latency_ms(&self) -> Option<u64> {
        self.pickup_latency_ms.load(Ordering::Relaxed).checked_sub(1)
    }

    pub fn record_queue_empty(&self, decision: Decision<IdleDecision>) {
        self.decisions.lock().unwrap().queue_empty = Some(RecordedDecision { decision, at: SystemTime::now() });
    }

    /// A get answered with `messages` messages, the oldest of which had waited `oldest_age_ms`.
    pub fn record_get(&self, last: LastGet) {
        if let Some(age) = last.oldest_age_ms {
            self.pickup_latency_ms.store(age.saturating_add(1), Ordering::Relaxed);
        }
        *self.last_get.lock().unwrap() = last;
    }

    /// What the last get that answered returned (zero messages before the first).
    pub fn last_get(&self) -> LastGet {
        *self.last_get.lock().unwrap()
    }

    /// `n` messages arrived (puts through this host, or notifications it received).
    pub fn record_arrivals(&self, n: u64) {
        self.arrivals.lock().unwrap().add(n, Instant::now());
    }

    /// Arrivals per second over the last [`ARRIVALS_WINDOW`].
    pub fn arrivals_per_sec(&self) -> f64 {
        self.arrivals.lock().unwrap().per_sec(Instant::now())
    }

    /// Throughput, latency and failures since the previous call (the rule's recent window).
    pub fn take_window(&self) -> Window {
        let now = WindowStart {
            at: Instant::now(),
            processed: self.processed.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            handler_micros: self.handler_micros.load(Ordering::Relaxed),
        };
        let previous = self.window.lock().unwrap().replace(now);
        let Some(previous) = previous else {
            return Window { throughput_per_sec: 0.0, mean_handler_latency_ms: 0.0, failures: 0 };
        };
        let seconds = now.at.duration_since(previous.at).as_secs_f64();
        let finished = (now.processed - previous.processed) + (now.failed - previous.failed);
        Window {
            throughput_per_sec: if seconds > 0.0 { (now.processed - previous.processed) as f64 / seconds } else { 0.0 },
            mean_handler_latency_ms: if finished > 0 { (now.handler_micros - previous.handler_micros) as f64 / finished as f64 / 1e3 } else { 0.0 },
            failures: (now.failed - previous.failed).min(u32::MAX as u64) as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn arrivals_are_averaged_over_the_last_ten_seconds() {
        let mut arrivals = Arrivals::default();
        let start = arrivals.start;
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert_eq!(arrivals.per_sec(at(0)), 0.0);
        // Early on, over the time since counting began, but never less than a second.
        arrivals.add(3, at(200));
        assert_eq!(arrivals.per_sec(at(500)), 3.0);
        assert_eq!(arrivals.per_sec(at(3_000)), 1.0);
        // Then over the current second and the nine before it.
        arrivals.add(7, at(9_500));
        assert!((arrivals.per_sec(at(9_999)) - 10.0 / 9.999).abs() < 1e-9);
        assert_eq!(arrivals.per_sec(at(10_000)), 7.0 / 9.0, "the first second's 3 left the window");
        assert_eq!(arrivals.per_sec(at(19_999)), 0.0, "all left by then");
        // A bucket reused after a lap counts only its new arrivals.
        arrivals.add(4, at(20_100));
        assert_eq!(arrivals.per_sec(at(20_500)), 4.0 / 9.5);
    }
}
