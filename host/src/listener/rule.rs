//! Asking the queue's rule: what it is told (the queue's state, or an idle task's context),
//! what the listener notes for it (the last get, the arrivals), the thread it is asked on,
//! and the built-in rule's answer when a call panics.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::panics::panic_message;
use crate::queue::{Clock, Message};
use crate::rules::{Decider, Decision, DecisionSource, DepthSource, IdleContext, IdleDecision, QueueState, built_in_queue_empty, built_in_task_count};

use super::telemetry::{LastGet, TaskCountInputs};
use super::{Listener, Shared};

/// What the listener asks its rule with: the rule, the time it is told, and the random
/// values it is given (one sequence per decision).
pub(super) struct Rule {
    /// Decides the task count and the idle sleeps (the built-in rule unless the builder was given another).
    pub(super) decider: Arc<dyn Decider>,
    /// The time rules are told (`timestamp_ms`).
    pub(super) clock: Arc<dyn Clock>,
    random: Mutex<fastrand::Rng>,
    /// The concurrency decision's own random values, so that asking it leaves the task-count
    /// and idle decisions' sequences as they are. Not only for old seeds: a rule in Rust is
    /// asked for concurrency whether it decides it or not, and with one shared sequence the
    /// `functions` baseline's figures in `ebb simulate --bench` move (paper-billing p99 52.6 s
    /// to 37.3 s) and a goal there turns from met to not met.
    concurrency_random: Mutex<fastrand::Rng>,
    /// The failure decision's, likewise.
    failure_random: Mutex<fastrand::Rng>,
}

impl Rule {
    /// `decider` asked with `clock`'s time; its random sequences from `seed`.
    pub(super) fn new(decider: Arc<dyn Decider>, clock: Arc<dyn Clock>, seed: u64) -> Rule {
        Rule {
            decider,
            clock,
            random: Mutex::new(fastrand::Rng::with_seed(seed)),
            concurrency_random: Mutex::new(fastrand::Rng::with_seed(seed.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15)),
            failure_random: Mutex::new(fastrand::Rng::with_seed(seed.rotate_left(16) ^ 0xc2b2_ae3d_27d4_eb4f)),
        }
    }

    /// The next random value of the concurrency decision's sequence.
    pub(super) fn concurrency_random(&self) -> u64 {
        self.concurrency_random.lock().unwrap().u64(..)
    }

    /// The next random value of the failure decision's sequence.
    pub(super) fn failure_random(&self) -> u64 {
        self.failure_random.lock().unwrap().u64(..)
    }
}

impl Listener {
    /// `n` messages arrived on the queue: puts through this host, or a notification it
    /// received (one each). The rule is told the rate (`arrivals_per_sec`, over the last
    /// 10 s). Only counts: waking the queue is [`Listener::work_detected`]'s.
    pub fn record_arrivals(&self, n: u64) {
        self.shared.telemetry.counters.record_arrivals(n);
    }
}

impl Shared {
    /// A get answered with `messages`: the rule is told how many, and how long the oldest of
    /// them had waited (by the listener's clock against the insertion time storage reports,
    /// 0 when storage's clock is ahead).
    pub(super) fn record_get(&self, messages: &[Message], asked: u32) {
        let now = crate::queue::clock::system_time(self.rule.clock.now_ms());
        let oldest = messages.iter().map(|m| m.inserted_at).min();
        let oldest_age_ms = oldest.map(|at| now.duration_since(at).map_or(0, |age| age.as_millis() as u64));
        self.telemetry.counters.record_get(LastGet { messages: messages.len().min(u32::MAX as usize) as u32, asked, oldest_age_ms });
        if let Some(recording) = &self.telemetry.recording {
            // A redelivery is the same arrival again: only a first delivery counts.
            let first = messages.iter().filter(|m| m.dequeue_count == 1).count();
            recording.record(crate::record::Seen::FirstGet, first as u64);
        }
    }

    /// `QueueEmpty` for a task that found the queue empty `idle_count` times in a row.
    pub(super) async fn decide_queue_empty(&self, idle_count: u32) -> IdleDecision {
        let ctx = IdleContext {
            queue: self.queue.name().to_string(),
            idle_count,
            active_tasks: self.telemetry.counters.active_tasks.load(Ordering::Relaxed),
            min_interval_ms: self.settings.min_polling_interval.as_millis() as u64,
            max_interval_ms: self.settings.max_polling_interval.as_millis() as u64,
            push_enabled: self.push_enabled(),
            timestamp_ms: self.rule.clock.now_ms(),
            random: self.random(),
        };
        let decision = self.ask_rule(ctx, |rule, ctx| rule.decide_queue_empty(ctx), |ctx| built_in_queue_empty(ctx, DecisionSource::Fallback)).await;
        self.telemetry.counters.record_queue_empty(decision);
        decision.value
    }

    /// `GetOptimalDequeueTaskCount` for a queue `depth` messages deep (counted for this
    /// decision, or inferred, as `depth_source` says), with the throughput, latency and
    /// failures since the last decision, the last get and the recent arrivals.
    pub(super) async fn decide_task_count(&self, depth: u64, depth_source: DepthSource) -> Decision<u32> {
        let window = self.telemetry.counters.take_window();
        let last_get = self.telemetry.counters.last_get();
        let state = QueueState {
            queue: self.queue.name().to_string(),
            approximate_depth: depth,
            in_flight: self.telemetry.counters.in_flight.load(Ordering::Relaxed),
            active_tasks: self.telemetry.counters.active_tasks.load(Ordering::Relaxed),
            min_tasks: self.floor(),
            max_tasks: self.settings.max_tasks,
            throughput_per_sec: window.throughput_per_sec,
            mean_handler_latency_ms: window.mean_handler_latency_ms,
            recent_failures: window.failures,
            push_enabled: self.push_enabled(),
            timestamp_ms: self.rule.clock.now_ms(),
            random: self.random(),
            last_get_messages: last_get.messages,
            batch_size: self.settings.batch_size,
            arrivals_per_sec: self.telemetry.counters.arrivals_per_sec(),
            oldest_message_age_ms: last_get.oldest_age_ms,
            depth_source,
        };
        let inputs = TaskCountInputs {
            approximate_depth: state.approximate_depth,
            in_flight: state.in_flight,
            active_tasks: state.active_tasks,
            throughput_per_sec: state.throughput_per_sec,
            mean_handler_latency_ms: state.mean_handler_latency_ms,
            recent_failures: state.recent_failures,
            arrivals_per_sec: state.arrivals_per_sec,
            oldest_message_age_ms: state.oldest_message_age_ms,
        };
        let decision = self.ask_rule(state, |rule, state| rule.decide_task_count(state), |state| built_in_task_count(state, DecisionSource::Fallback)).await;
        self.telemetry.counters.record_task_count(decision, inputs);
        decision
    }

    /// Asks the decider, off the async threads if it may block (a WASM rule runs up to its
    /// call deadline), on this one if it answers at once. If the call panics, `fallback`
    /// decides it (the built-in rule; for the concurrency, the configured bound).
    pub(super) async fn ask_rule<I, R>(&self, input: I, decide: fn(&dyn Decider, &I) -> R, fallback: fn(&I) -> R) -> R
    where
        I: Clone + Send + 'static,
        R: Send + 'static,
    {
        let decider = self.rule.decider.clone();
        let failure = if decider.may_block() {
            let call_input = input.clone();
            match tokio::task::spawn_blocking(move || decide(&*decider, &call_input)).await {
                Ok(decision) => return decision,
                Err(error) if error.is_panic() => format!("panicked: {}", panic_message(&*error.into_panic())),
                Err(error) => format!("was cancelled: {error}"),
            }
        } else {
            match catch_unwind(AssertUnwindSafe(|| decide(&*decider, &input))) {
                Ok(decision) => return decision,
                Err(panic) => format!("panicked: {}", panic_message(&*panic)),
            }
        };
        self.telemetry.counters.rule_call_panics.fetch_add(1, Ordering::Relaxed);
        tracing::error!("a rule call {failure}; decided without the rule instead");
        fallback(&input)
    }

    fn random(&self) -> u64 {
        self.rule.random.lock().unwrap().u64(..)
    }
}
