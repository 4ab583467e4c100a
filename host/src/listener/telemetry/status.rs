//! `QueryState()`: what the status shows of a listener, and the depth figure it carries.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::queue::{TransactionCounts, TransactionRates};
use crate::rules::{Decision, IdleDecision, RuleStatus};

use crate::listener::Shared;

/// The oldest depth figure the status shows on a backend whose count is billed, before it
/// counts again.
pub const DEPTH_MAX_AGE: Duration = Duration::from_secs(30);

/// What the poison queue received for a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoisonForm {
    /// A JSON envelope with the reason and the body.
    Envelope,
    /// The body as it was: the envelope did not fit the poison queue's size limit.
    Body,
}

impl PoisonForm {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PoisonForm::Envelope => "envelope",
            PoisonForm::Body => "body",
        }
    }
}

/// The dead-letter queue a queue's service moves its messages to.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeadLetterStatus {
    /// Its ARN.
    pub arn: String,
    /// Receives after which the service moves a message there.
    pub max_receive_count: u32,
}

/// One message moved to the poison queue, and why.
#[derive(Debug, Clone, Serialize, Deserialize)]
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

/// A decision and when it was made.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecordedDecision<T> {
    /// The decision.
    #[serde(flatten)]
    pub decision: Decision<T>,
    /// When it was made.
    #[serde(with = "humantime_serde")]
    pub at: SystemTime,
}

/// How many task-count decisions, with their inputs, the status keeps.
pub const RECENT_DECISIONS: usize = 10;

/// What the task-count rule was told, in short (the inputs an operator reads to see why the
/// worker scaled).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskCountInputs {
    /// The queue's approximate depth.
    pub approximate_depth: u64,
    /// Messages leased and not yet settled.
    pub in_flight: u32,
    /// Dequeue tasks running.
    pub active_tasks: u32,
    /// Messages handled per second since the previous decision.
    pub throughput_per_sec: f64,
    /// Mean handler latency since the previous decision, in ms.
    pub mean_handler_latency_ms: f64,
    /// Handler failures since the previous decision.
    pub recent_failures: u32,
    /// Puts and notifications per second over the last 10 s.
    pub arrivals_per_sec: f64,
    /// How long the oldest message of the last get had waited, in ms.
    pub oldest_message_age_ms: Option<u64>,
}

/// A task-count decision with what it was decided from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DecisionWithInputs {
    /// What the rule was told.
    pub inputs: TaskCountInputs,
    /// What it answered (after clamping), who answered, and when.
    #[serde(flatten)]
    pub output: RecordedDecision<u32>,
}

/// `QueryState()` for one queue.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ListenerStatus {
    /// The queue's name.
    pub queue: String,
    /// Approximate depth: read now where that is free (the embedded store), else the
    /// figure of the last count (see `depth_as_of`).
    pub approximate_depth: u64,
    /// When `approximate_depth` was measured (`None`: not yet).
    #[serde(with = "humantime_serde")]
    pub depth_as_of: Option<SystemTime>,
    /// The pause that holds now (no get is made), if any.
    pub paused: Option<crate::listener::Pause>,
    /// Dequeue tasks running or waiting for work.
    pub active_tasks: u32,
    /// The rule's last task count (after clamping).
    pub target_tasks: u32,
    /// Most tasks active at once.
    pub peak_tasks: u32,
    /// Messages leased on this host and not yet settled (handled and deleted, retried or
    /// poisoned): those whose handler call runs, those about to start, those being deleted.
    pub in_flight: u32,
    /// Handler calls running now.
    pub handler_calls: u32,
    /// Handler calls allowed at once now: the rule's concurrency decision, or
    /// `max_concurrent_calls`.
    pub concurrency_limit: u32,
    /// The queue's `max_concurrent_calls`.
    pub max_concurrent_calls: u32,
    /// Dequeue tasks waiting for free handler slots before their next get.
    pub tasks_waiting_for_slots: u32,
    /// The rule's last concurrency decision (none while the rule decides none: the built-in
    /// rule, a rule of a contract before 0.3.0, or one that answers none).
    pub last_concurrency: Option<RecordedDecision<u32>>,
    /// Messages handled and deleted.
    pub processed: u64,
    /// Handler failures (each retry counts).
    pub failed: u64,
    /// Messages moved to the poison queue.
    pub poisoned: u64,
    /// Of those, messages whose stored body was corrupt.
    pub poisoned_corrupt: u64,
    /// Of those, messages moved as their bare body, the reason only in the log, the status and
    /// the metrics: on Azure every poisoning, elsewhere one whose JSON entry did not fit.
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
    /// The longest a get waits on the service for a first message (long polling), in
    /// seconds: that much of each idle delay is spent in the get, so a message arriving then
    /// is taken at once. 0 where the service answers at once.
    pub long_poll_secs: u64,
    /// Who moves messages that cannot be handled: `ebb` (to `<queue>-poison`), or `sqs` (the
    /// queue's RedrivePolicy names a dead-letter queue, which SQS moves them to).
    pub poisoning: String,
    /// With `poisoning` `sqs`: the dead-letter queue's ARN and its maxReceiveCount.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letter_queue: Option<DeadLetterStatus>,
    /// Handler calls that panicked (counted as failures too).
    pub handler_panics: u64,
    /// Handler calls the host itself could not make (out of file descriptors): retried,
    /// not counted as failures, never a reason to poison.
    pub host_errors: u64,
    /// Handler calls the app pushed back (HTTP 429 or 503): retried after its
    /// `Retry-After`, not counted as failures.
    pub pushed_back: u64,
    /// Of those, `Retry-After`s longer than `max_retry_delay` (capped to it).
    pub retry_after_capped: u64,
    /// Of those, `Retry-After`s that were malformed or a date already past (the first
    /// retry delay was used).
    pub retry_after_unusable: u64,
    /// Dequeue tasks or scalers that panicked (and were restarted).
    pub task_panics: u64,
    /// Rule calls whose blocking task panicked (the built-in rule decided).
    pub rule_call_panics: u64,
    /// Failed deliveries (messages or items) the queue's rule retried after a delay of its
    /// own (`on-handler-failure`, contract 0.4.0). 0 for a rule that does not export `failures`.
    pub failure_rule_retries: u64,
    /// Failed deliveries the queue's rule poisoned.
    pub failure_rule_poisons: u64,
    /// Failed deliveries the queue's rule left to the default handling (`max_dequeue_count`):
    /// it said `default`, or could not answer (a fault: counted in `rule.faults`).
    pub failure_rule_defaults: u64,
    /// Envelopes whose items were delivered (issue 20).
    pub envelopes: u64,
    /// Items of envelopes handled.
    pub items_delivered: u64,
    /// Item deliveries that failed (each retried alone, or poisoned alone).
    pub items_failed: u64,
    /// Items moved to the poison queue alone.
    pub items_poisoned: u64,
    /// Answers put on the reply queue.
    pub replies: u64,
    /// The queue's rule.
    pub rule: Option<RuleStatus>,
    /// The queue's shadow rule: its agreement with the rule, counts, largest disagreements
    /// and faults; `None` without a `shadow_rule`.
    pub shadow: Option<crate::rules::ShadowStatus>,
    /// The last task-count decision.
    pub last_task_count: Option<RecordedDecision<u32>>,
    /// The last task-count decisions with their inputs, oldest first (at most 10).
    pub recent_decisions: Vec<DecisionWithInputs>,
    /// Pickup latency: how long the oldest message of the last get that returned messages
    /// had waited in the queue, in ms (`None`: no such get yet, or storage gave no time).
    pub pickup_latency_ms: Option<u64>,
    /// The last queue-empty decision.
    pub last_queue_empty: Option<RecordedDecision<IdleDecision>>,
    /// Storage transactions by kind, if metered.
    pub transactions: Option<TransactionCounts>,
    /// All and idle transactions per hour over the last ten minutes, if metered.
    pub transaction_rates: Option<TransactionRates>,
}

impl Shared {
    /// On a backend whose count is a billed call, starts a count in the background when
    /// the last one is older than [`DEPTH_MAX_AGE`].
    pub(in crate::listener) fn refresh_depth_if_stale(self: &Arc<Self>) {
        if self.queue.local_count().is_some() {
            return;
        }
        if tokio::runtime::Handle::try_current().is_err() || self.stopping.is_cancelled() {
            return;
        }
        {
            let mut counted = self.telemetry.depth_counted.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if counted.is_some_and(|at| at.elapsed() < DEPTH_MAX_AGE) {
                return;
            }
            *counted = Some(tokio::time::Instant::now());
        }
        // Tracked with the tasks, so a shutdown waits for it (or ends it at once).
        let shared = self.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                count = shared.queue.approximate_count() => match count {
                    Ok(depth) => shared.telemetry.counters.record_depth(depth, SystemTime::now()),
                    // A queue that does not exist holds nothing.
                    Err(error) if error.failure_class() == Some(crate::queue::FailureClass::Missing) => shared.telemetry.counters.record_depth(0, SystemTime::now()),
                    Err(error) => tracing::debug!("could not refresh the depth for the status: {error}"),
                },
                _ = shared.stopping.cancelled() => {}
            }
        });
    }

    pub(in crate::listener) fn status(&self) -> ListenerStatus {
        let c = &self.telemetry.counters;
        let load32 = |a: &AtomicU32| a.load(Ordering::Relaxed);
        let load64 = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (approximate_depth, depth_as_of) = match self.queue.local_count() {
            Some(depth) => (depth, Some(SystemTime::now())),
            None => {
                let at_ms = load64(&c.last_depth_at_ms);
                (load64(&c.last_depth), (at_ms > 0).then(|| SystemTime::UNIX_EPOCH + Duration::from_millis(at_ms)))
            }
        };
        let poison = c.poisonings();
        let dead_letter = self.queue.dead_letter();
        let (last_task_count, last_queue_empty) = c.last_decisions();
        ListenerStatus {
            queue: self.queue.name().to_string(),
            approximate_depth,
            depth_as_of,
            paused: self.current_pause(),
            active_tasks: load32(&c.active_tasks),
            target_tasks: load32(&c.target_tasks),
            peak_tasks: load32(&c.peak_tasks),
            in_flight: load32(&c.in_flight),
            handler_calls: self.pool.slots.in_use(),
            concurrency_limit: self.pool.slots.limit(),
            max_concurrent_calls: self.settings.max_concurrent_calls,
            tasks_waiting_for_slots: self.pool.slots.waiting(),
            last_concurrency: c.last_concurrency.lock().unwrap().clone(),
            processed: load64(&c.processed),
            failed: load64(&c.failed),
            poisoned: load64(&c.poisoned),
            poisoned_corrupt: poison.corrupt,
            poisoned_body_only: poison.body_only,
            recent_poison: poison.recent,
            released_on_shutdown: load64(&c.released_on_shutdown),
            lease_renewals: load64(&c.lease_renewals),
            leases_lost: load64(&c.leases_lost),
            poison_failures: load64(&c.poison_failures),
            storage_errors: load64(&c.storage_errors),
            work_detected: load64(&c.work_detected),
            safety_polls: load64(&c.safety_polls),
            long_poll_secs: self.queue.server_wait(Duration::MAX).as_secs(),
            poisoning: if dead_letter.is_some() { "sqs" } else { "ebb" }.to_string(),
            dead_letter_queue: dead_letter.map(|d| DeadLetterStatus { arn: d.arn, max_receive_count: d.max_receive_count }),
            handler_panics: load64(&c.handler_panics),
            host_errors: load64(&c.host_errors),
            pushed_back: load64(&c.pushed_back),
            retry_after_capped: load64(&c.retry_after_capped),
            retry_after_unusable: load64(&c.retry_after_unusable),
            task_panics: load64(&c.task_panics),
            rule_call_panics: load64(&c.rule_call_panics),
            failure_rule_retries: load64(&c.failure_rule_retries),
            failure_rule_poisons: load64(&c.failure_rule_poisons),
            failure_rule_defaults: load64(&c.failure_rule_defaults),
            envelopes: load64(&c.items.envelopes),
            items_delivered: load64(&c.items.delivered),
            items_failed: load64(&c.items.failed),
            items_poisoned: load64(&c.items.poisoned),
            replies: load64(&c.items.replies),
            rule: self.rule.decider.status(),
            shadow: self.rule.decider.shadow_status(),
            last_task_count,
            recent_decisions: c.recent_decisions(),
            pickup_latency_ms: c.pickup_latency_ms(),
            last_queue_empty,
            transactions: self.telemetry.transactions.as_ref().map(|t| t.snapshot()),
            transaction_rates: self.telemetry.transactions.as_ref().map(|t| t.rates()),
        }
    }
}
