//! Counters behind `QueryState`, and the recent window the task-count rule sees.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::time::Instant;

use crate::queue::{TransactionCounts, TransactionRates};
use crate::rules::{Decision, IdleDecision, QueueRules, RuleStatus};

use super::Shared;

#[derive(Default)]
pub(super) struct Counters {
    pub active_tasks: AtomicU32,
    pub target_tasks: AtomicU32,
    pub peak_tasks: AtomicU32,
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
    pub task_panics: AtomicU64,
    pub rule_call_panics: AtomicU64,
    pub last_depth: AtomicU64,
    /// When `last_depth` was read, in ms since the epoch (0: never).
    pub last_depth_at_ms: AtomicU64,
    handler_micros: AtomicU64,
    poison: Mutex<PoisonLog>,
    claimed: Mutex<HashSet<String>>,
    window: Mutex<Option<WindowStart>>,
    decisions: Mutex<Decisions>,
}

/// How many recent poisonings the status keeps.
const RECENT_POISON: usize = 10;

#[derive(Default)]
struct PoisonLog {
    corrupt: u64,
    body_only: u64,
    recent: VecDeque<PoisonRecord>,
}

/// What the poison queue received for a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoisonForm {
    /// A JSON envelope with the reason and the body.
    Envelope,
    /// The body as it was: the envelope did not fit the poison queue's size limit.
    Body,
}

impl PoisonForm {
    pub fn as_str(self) -> &'static str {
        match self {
            PoisonForm::Envelope => "envelope",
            PoisonForm::Body => "body",
        }
    }
}

/// One message moved to the poison queue, and why.
#[derive(Debug, Clone, Serialize)]
pub struct PoisonRecord {
    /// Its id in the queue it came from.
    pub id: String,
    /// Why it was poisoned: the last handler error, or `corrupt: …`.
    pub reason: String,
    /// What the poison queue holds for it.
    pub form: PoisonForm,
    /// When it was moved.
    #[serde(with = "humantime_serde")]
    pub at: SystemTime,
}

/// A message claimed for handling on this host, released when dropped (however its
/// processing ends: success, failure, a panic, or the task being dropped).
pub(super) struct Claim<'a> {
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

/// A decision and when it was made.
#[derive(Debug, Clone, Serialize)]
pub struct RecordedDecision<T> {
    /// The decision.
    #[serde(flatten)]
    pub decision: Decision<T>,
    /// When it was made.
    #[serde(with = "humantime_serde")]
    pub at: SystemTime,
}

#[derive(Clone, Copy)]
struct WindowStart {
    at: Instant,
    processed: u64,
    failed: u64,
    handler_micros: u64,
}

pub(super) struct Window {
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

    pub fn record_task_count(&self, decision: Decision<u32>) {
        self.decisions.lock().unwrap().task_count = Some(RecordedDecision { decision, at: SystemTime::now() });
    }

    pub fn record_queue_empty(&self, decision: Decision<IdleDecision>) {
        self.decisions.lock().unwrap().queue_empty = Some(RecordedDecision { decision, at: SystemTime::now() });
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

/// `QueryState()` for one queue.
#[derive(Debug, Clone, Serialize)]
pub struct ListenerStatus {
    /// The queue's name.
    pub queue: String,
    /// Approximate depth: read now where that is free (the embedded store), else the
    /// figure of the last count (see `depth_as_of`).
    pub approximate_depth: u64,
    /// When `approximate_depth` was measured (`None`: not yet).
    #[serde(with = "humantime_serde")]
    pub depth_as_of: Option<SystemTime>,
    /// Dequeue tasks running or waiting for work.
    pub active_tasks: u32,
    /// The rule's last task count (after clamping).
    pub target_tasks: u32,
    /// Most tasks active at once.
    pub peak_tasks: u32,
    /// Messages being handled now.
    pub in_flight: u32,
    /// Messages handled and deleted.
    pub processed: u64,
    /// Handler failures (each retry counts).
    pub failed: u64,
    /// Messages moved to the poison queue.
    pub poisoned: u64,
    /// Of those, messages whose stored body was corrupt.
    pub poisoned_corrupt: u64,
    /// Of those, messages moved as their bare body (the envelope did not fit).
    pub poisoned_body_only: u64,
    /// The last poisonings, oldest first, with their reasons.
    pub recent_poison: Vec<PoisonRecord>,
    /// Messages released unfinished at shutdown.
    pub released_on_shutdown: u64,
    /// Lease renewals for slow handlers.
    pub lease_renewals: u64,
    /// Leases found lost (another lease replaced ours) before or while the handler ran.
    pub leases_lost: u64,
    /// Poisonings the poison queue refused (the message stays, tried again after `max_retry_delay`).
    pub poison_failures: u64,
    /// Failed gets.
    pub storage_errors: u64,
    /// Work-detected events raised.
    pub work_detected: u64,
    /// Safety polls made (push mode: a get while no task ran, at start-up and then once
    /// per `safety_poll`).
    pub safety_polls: u64,
    /// Handler calls that panicked (counted as failures too).
    pub handler_panics: u64,
    /// Handler calls the host itself could not make (out of file descriptors): retried,
    /// not counted as failures, never a reason to poison.
    pub host_errors: u64,
    /// Dequeue tasks or scalers that panicked (and were restarted).
    pub task_panics: u64,
    /// Rule calls whose blocking task panicked (the built-in rule decided).
    pub rule_call_panics: u64,
    /// The queue's rule.
    pub rule: Option<RuleStatus>,
    /// The last task-count decision.
    pub last_task_count: Option<RecordedDecision<u32>>,
    /// The last queue-empty decision.
    pub last_queue_empty: Option<RecordedDecision<IdleDecision>>,
    /// Storage transactions by kind, if metered.
    pub transactions: Option<TransactionCounts>,
    /// All and idle transactions per hour over the last ten minutes, if metered.
    pub transaction_rates: Option<TransactionRates>,
}

impl Shared {
    pub(super) fn status(&self) -> ListenerStatus {
        let c = &self.counters;
        let load32 = |a: &AtomicU32| a.load(Ordering::Relaxed);
        let load64 = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (approximate_depth, depth_as_of) = match self.queue.local_count() {
            Some(depth) => (depth, Some(SystemTime::now())),
            None => {
                let at_ms = load64(&c.last_depth_at_ms);
                (load64(&c.last_depth), (at_ms > 0).then(|| SystemTime::UNIX_EPOCH + Duration::from_millis(at_ms)))
            }
        };
        let poison = c.poison.lock().unwrap();
        let decisions = c.decisions.lock().unwrap();
        ListenerStatus {
            queue: self.queue.name().to_string(),
            approximate_depth,
            depth_as_of,
            active_tasks: load32(&c.active_tasks),
            target_tasks: load32(&c.target_tasks),
            peak_tasks: load32(&c.peak_tasks),
            in_flight: load32(&c.in_flight),
            processed: load64(&c.processed),
            failed: load64(&c.failed),
            poisoned: load64(&c.poisoned),
            poisoned_corrupt: poison.corrupt,
            poisoned_body_only: poison.body_only,
            recent_poison: poison.recent.iter().cloned().collect(),
            released_on_shutdown: load64(&c.released_on_shutdown),
            lease_renewals: load64(&c.lease_renewals),
            leases_lost: load64(&c.leases_lost),
            poison_failures: load64(&c.poison_failures),
            storage_errors: load64(&c.storage_errors),
            work_detected: load64(&c.work_detected),
            safety_polls: load64(&c.safety_polls),
            handler_panics: load64(&c.handler_panics),
            host_errors: load64(&c.host_errors),
            task_panics: load64(&c.task_panics),
            rule_call_panics: load64(&c.rule_call_panics),
            rule: self.rules.as_ref().map(QueueRules::status),
            last_task_count: decisions.task_count.clone(),
            last_queue_empty: decisions.queue_empty.clone(),
            transactions: self.transactions.as_ref().map(|t| t.snapshot()),
            transaction_rates: self.transactions.as_ref().map(|t| t.rates()),
        }
    }
}
