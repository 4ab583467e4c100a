//! The one seam between a listener and whatever decides for it: a queue's WASM rule, the
//! built-in (paper's) rule, or a rule written in Rust (embedding, the simulator's baselines).
//!
//! Every decider returns decisions already clamped to the queue's bounds and says where
//! they came from; the listener only chooses the thread it calls on ([`Decider::may_block`])
//! and lets the built-in rule decide a call that panicked.

use ebb_rules_sdk::{FailureContext, FailureDecision, HandlerState, IdleContext, IdleDecision, QueueState};

use super::{
    Decision, DecisionSource, NativeRule, QueueRules, RuleStatus, ShadowStatus, built_in_queue_empty, built_in_task_count, native_concurrency, native_failure,
    native_queue_empty, native_task_count,
};

/// Decides a queue's task count and what a task does when the queue is empty.
pub trait Decider: Send + Sync + 'static {
    /// `GetOptimalDequeueTaskCount`, clamped to `[min_tasks, max_tasks]`.
    fn decide_task_count(&self, state: &QueueState) -> Decision<u32>;

    /// `QueueEmpty`, its delay clamped to `[min_interval_ms, max_interval_ms]`.
    fn decide_queue_empty(&self, ctx: &IdleContext) -> Decision<IdleDecision>;

    /// How many handler calls may run at once, clamped to `[1, state.max_limit]`; `None`
    /// when the rule does not decide it (the queue keeps its `max_concurrent_calls`). Only
    /// rules of contract 0.3.0 and later can decide it.
    fn decide_concurrency(&self, _state: &HandlerState) -> Option<Decision<u32>> {
        None
    }

    /// Whether [`Decider::decide_concurrency`] may answer now: `false` spares the listener
    /// asking four times a second, off its async threads, a rule that cannot (the built-in
    /// rule, a WASM rule of a contract before 0.3.0 or none loaded yet).
    fn may_decide_concurrency(&self) -> bool {
        true
    }

    /// What happens to a message whose handler failed (a retry's delay clamped to
    /// `[0, ctx.max_retry_delay_ms]`); `None` when the rule does not decide it (the queue keeps
    /// its `max_dequeue_count` handling). Only rules that export `ebb:rules/failures@0.4.0`
    /// can decide it.
    fn decide_failure(&self, _ctx: &FailureContext) -> Option<Decision<FailureDecision>> {
        None
    }

    /// Whether [`Decider::decide_failure`] may answer now: `false` spares the listener a
    /// trip to a blocking thread for every failure of a queue whose rule cannot.
    fn may_decide_failures(&self) -> bool {
        false
    }

    /// The rule's state as `/status` shows it; `None` when there is nothing beyond the
    /// decisions themselves (the built-in rule, a rule in Rust). Never waits on a decision.
    fn status(&self) -> Option<RuleStatus> {
        None
    }

    /// The queue's shadow rule, as `/status` shows it; `None` without one (see
    /// [`super::Shadowed`]). Never waits on a decision.
    fn shadow_status(&self) -> Option<ShadowStatus> {
        None
    }

    /// Whether a decision may hold its thread (a sandboxed rule runs up to its call
    /// deadline): the listener then calls it on tokio's blocking threads rather than on
    /// an async one. A decider that answers at once says `false`.
    fn may_block(&self) -> bool {
        true
    }
}

/// The built-in (paper's) rule: what decides for a queue with no rule of its own.
#[derive(Debug, Clone, Copy, Default)]
pub struct BuiltInRule;

impl Decider for BuiltInRule {
    fn decide_task_count(&self, state: &QueueState) -> Decision<u32> {
        built_in_task_count(state, DecisionSource::BuiltIn)
    }

    fn decide_queue_empty(&self, ctx: &IdleContext) -> Decision<IdleDecision> {
        built_in_queue_empty(ctx, DecisionSource::BuiltIn)
    }

    fn may_decide_concurrency(&self) -> bool {
        false
    }

    fn may_block(&self) -> bool {
        false
    }
}

/// A queue's WASM rule, which falls back to the built-in rule by itself when it faults.
impl Decider for QueueRules {
    fn decide_task_count(&self, state: &QueueState) -> Decision<u32> {
        QueueRules::decide_task_count(self, state)
    }

    fn decide_queue_empty(&self, ctx: &IdleContext) -> Decision<IdleDecision> {
        QueueRules::decide_queue_empty(self, ctx)
    }

    fn decide_concurrency(&self, state: &HandlerState) -> Option<Decision<u32>> {
        QueueRules::decide_concurrency(self, state)
    }

    fn may_decide_concurrency(&self) -> bool {
        QueueRules::rule_decides_concurrency(self)
    }

    fn decide_failure(&self, ctx: &FailureContext) -> Option<Decision<FailureDecision>> {
        QueueRules::decide_failure(self, ctx)
    }

    fn may_decide_failures(&self) -> bool {
        QueueRules::rule_decides_failures(self)
    }

    fn status(&self) -> Option<RuleStatus> {
        Some(QueueRules::status(self))
    }
}

/// A rule in Rust runs in the host, unsandboxed and at once; its raw decisions are clamped
/// like a WASM rule's.
impl<R: NativeRule> Decider for R {
    fn decide_task_count(&self, state: &QueueState) -> Decision<u32> {
        native_task_count(self, state)
    }

    fn decide_queue_empty(&self, ctx: &IdleContext) -> Decision<IdleDecision> {
        native_queue_empty(self, ctx)
    }

    fn decide_concurrency(&self, state: &HandlerState) -> Option<Decision<u32>> {
        native_concurrency(self, state)
    }

    fn decide_failure(&self, ctx: &FailureContext) -> Option<Decision<FailureDecision>> {
        native_failure(self, ctx)
    }

    fn may_decide_failures(&self) -> bool {
        true
    }

    fn may_block(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Eager;

    impl NativeRule for Eager {
        fn name(&self) -> &str {
            "eager"
        }
        fn optimal_dequeue_task_count(&self, _state: &QueueState) -> u32 {
            1000
        }
        fn on_queue_empty(&self, _ctx: &IdleContext) -> IdleDecision {
            IdleDecision { delay_ms: 0, stop: true }
        }
    }

    fn state() -> QueueState {
        QueueState { min_tasks: 1, max_tasks: 8, approximate_depth: 10_000, ..Default::default() }
    }

    fn idle() -> IdleContext {
        IdleContext { idle_count: 3, min_interval_ms: 100, max_interval_ms: 60_000, ..Default::default() }
    }

    #[test]
    fn a_native_rule_decides_as_the_rule_and_is_clamped_into_the_queues_bounds() {
        let decider: &dyn Decider = &Eager;
        let count = decider.decide_task_count(&state());
        assert_eq!((count.value, count.source, count.clamped), (8, DecisionSource::Rule, true));
        let empty = decider.decide_queue_empty(&idle());
        assert_eq!((empty.value.delay_ms, empty.value.stop, empty.source, empty.clamped), (100, true, DecisionSource::Rule, true));
        assert!(decider.status().is_none());
        assert!(!decider.may_block(), "a native rule answers at once, on the async thread");
    }

    #[test]
    fn the_built_in_rule_decides_as_the_paper_and_says_so() {
        let decider: &dyn Decider = &BuiltInRule;
        assert_eq!(decider.decide_task_count(&state()), built_in_task_count(&state(), DecisionSource::BuiltIn));
        assert_eq!(decider.decide_task_count(&state()).source, DecisionSource::BuiltIn);
        assert_eq!(decider.decide_queue_empty(&idle()), built_in_queue_empty(&idle(), DecisionSource::BuiltIn));
        assert!(decider.status().is_none());
        assert!(!decider.may_block());
    }

    #[test]
    fn a_queues_wasm_rules_show_their_status_and_are_called_off_the_async_threads() {
        let engine = crate::rules::RuleEngine::new(crate::rules::RuleLimits::default(), None).unwrap();
        let set = crate::rules::RuleSet::new(
            engine,
            [crate::rules::QueueRuleConfig { slot: crate::names::DecisionSite::new("work").unwrap(), rule: None, params: vec![] }],
        );
        let decider: &dyn Decider = &set.queue("work").unwrap();
        let status = decider.status().expect("a queue's rules have a status");
        assert_eq!((status.file, status.decisions), (None, 0));
        assert_eq!(decider.decide_task_count(&state()).source, DecisionSource::BuiltIn, "no rule file loaded yet");
        assert_eq!(decider.status().unwrap().decisions, 1, "the decision was counted by the queue's rules");
        assert!(decider.may_block(), "a WASM rule may run up to its call deadline");
    }
}
