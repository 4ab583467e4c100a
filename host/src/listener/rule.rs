//! Asking the queue's rule: what it is told (the queue's state, or an idle task's context),
//! the thread it is asked on, and the built-in rule's answer when a call panics.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;

use crate::panics::panic_message;
use crate::rules::{Decider, Decision, DecisionSource, IdleContext, IdleDecision, QueueState, built_in_queue_empty, built_in_task_count};

use super::Shared;

impl Shared {
    /// `QueueEmpty` for a task that found the queue empty `idle_count` times in a row.
    pub(super) async fn decide_queue_empty(&self, idle_count: u32) -> IdleDecision {
        let ctx = IdleContext {
            queue: self.queue.name().to_string(),
            idle_count,
            active_tasks: self.counters.active_tasks.load(Ordering::Relaxed),
            min_interval_ms: self.settings.min_polling_interval.as_millis() as u64,
            max_interval_ms: self.settings.max_polling_interval.as_millis() as u64,
            push_enabled: self.push_enabled(),
            timestamp_ms: self.clock.now_ms(),
            random: self.random(),
        };
        let decision = self.ask_rule(ctx, |rule, ctx| rule.decide_queue_empty(ctx), built_in_queue_empty).await;
        self.counters.record_queue_empty(decision);
        decision.value
    }

    /// `GetOptimalDequeueTaskCount` for a queue `depth` messages deep, with the throughput,
    /// latency and failures since the last decision.
    pub(super) async fn decide_task_count(&self, depth: u64) -> Decision<u32> {
        let window = self.counters.take_window();
        let state = QueueState {
            queue: self.queue.name().to_string(),
            approximate_depth: depth,
            in_flight: self.counters.in_flight.load(Ordering::Relaxed),
            active_tasks: self.counters.active_tasks.load(Ordering::Relaxed),
            min_tasks: self.floor(),
            max_tasks: self.settings.max_tasks,
            throughput_per_sec: window.throughput_per_sec,
            mean_handler_latency_ms: window.mean_handler_latency_ms,
            recent_failures: window.failures,
            push_enabled: self.push_enabled(),
            timestamp_ms: self.clock.now_ms(),
            random: self.random(),
        };
        let decision = self.ask_rule(state, |rule, state| rule.decide_task_count(state), built_in_task_count).await;
        self.counters.record_task_count(decision);
        decision
    }

    /// Asks the decider, off the async threads if it may block (a WASM rule runs up to its
    /// call deadline), on this one if it answers at once. If the call panics, the built-in
    /// rule decides it.
    async fn ask_rule<I, T>(&self, input: I, decide: fn(&dyn Decider, &I) -> Decision<T>, built_in: fn(&I, DecisionSource) -> Decision<T>) -> Decision<T>
    where
        I: Clone + Send + 'static,
        T: Send + 'static,
    {
        let decider = self.decider.clone();
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
        self.counters.rule_call_panics.fetch_add(1, Ordering::Relaxed);
        tracing::error!("a rule call {failure}; the built-in rule decided instead");
        built_in(&input, DecisionSource::Fallback)
    }

    fn random(&self) -> u64 {
        self.random.lock().unwrap().u64(..)
    }
}
