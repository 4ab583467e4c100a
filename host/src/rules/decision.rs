//! Decisions: where each came from, the clamp into the queue's bounds, the built-in
//! (paper's) rule, and native rules.

use ebb_rules_sdk::{FailureContext, FailureDecision, HandlerState, IdleContext, IdleDecision, MAX_FAILURE_TEXT_BYTES, QueueState, paper};
use serde::{Deserialize, Serialize};

/// Where a decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecisionSource {
    /// The queue's WASM rule.
    Rule,
    /// The built-in rule, because the queue has no rule, its file is gone, it is
    /// quarantined, or its instance is being rebuilt after a fault.
    BuiltIn,
    /// The built-in rule, because the queue's rule is still being compiled: at start-up a
    /// queue works at once and takes its rule when the compile ends.
    Compiling,
    /// The built-in rule, because the WASM rule faulted on this call (or the host panicked
    /// while calling it).
    Fallback,
}

/// A decision, where it came from, and whether the host had to clamp it into bounds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Decision<T> {
    /// The decision, after clamping.
    pub value: T,
    /// Who made it.
    pub source: DecisionSource,
    /// True when the raw decision was out of the queue's bounds and was clamped.
    pub clamped: bool,
}

/// The built-in (paper's) `GetOptimalDequeueTaskCount`, clamped to the queue's bounds: what
/// decides when a queue has no rule, or when no rule call could be made.
pub(crate) fn built_in_task_count(state: &QueueState, source: DecisionSource) -> Decision<u32> {
    clamp_task_count(paper::optimal_dequeue_task_count(state), source, state)
}

/// The built-in (paper's) `QueueEmpty`, clamped to the queue's polling intervals.
pub(crate) fn built_in_queue_empty(ctx: &IdleContext, source: DecisionSource) -> Decision<IdleDecision> {
    clamp_idle(paper::on_queue_empty(ctx), source, ctx)
}

/// A scaling rule written in Rust and run in the host, without a sandbox: for embedding
/// ebb as a library, and for the simulator's baselines (`ebb simulate --rule fixed-1s`).
/// Its decisions are clamped like a WASM rule's; a panic in it is contained by the
/// listener (the built-in rule decides that call).
pub trait NativeRule: Send + Sync + 'static {
    /// A short name, for reports.
    fn name(&self) -> &str;
    /// `GetOptimalDequeueTaskCount`, before the clamp to `[min_tasks, max_tasks]`.
    fn optimal_dequeue_task_count(&self, state: &QueueState) -> u32;
    /// `QueueEmpty`, before the delay's clamp to the polling interval range.
    fn on_queue_empty(&self, ctx: &IdleContext) -> IdleDecision;
    /// How many handler calls may run at once, before the clamp to `[1, max_limit]`;
    /// `None` (the default) keeps the queue's `max_concurrent_calls`.
    fn max_concurrent_calls(&self, _state: &HandlerState) -> Option<u32> {
        None
    }
    /// What happens to a message whose handler failed, before the clamp; `None` (the
    /// default) keeps the queue's `max_dequeue_count` handling.
    fn on_handler_failure(&self, _ctx: &FailureContext) -> Option<FailureDecision> {
        None
    }
}

/// A native rule's failure decision, clamped like a WASM rule's.
pub fn native_failure(rule: &dyn NativeRule, ctx: &FailureContext) -> Option<Decision<FailureDecision>> {
    rule.on_handler_failure(ctx).map(|raw| clamp_failure(raw, DecisionSource::Rule, ctx))
}

/// A failure decision made safe to act on: a retry's delay clamped to
/// `[0, min(ctx.max_retry_delay_ms, the backends' longest visibility of 7 days)]`; a poison
/// reason cut to [`MAX_FAILURE_TEXT_BYTES`] (at a character boundary), its control characters
/// escaped, and an empty one named. Each counts as a clamp.
pub(crate) fn clamp_failure(raw: FailureDecision, source: DecisionSource, ctx: &FailureContext) -> Decision<FailureDecision> {
    match raw {
        FailureDecision::Retry(delay_ms) => {
            let most = ctx.max_retry_delay_ms.min(crate::queue::MAX_VISIBILITY.as_millis() as u64);
            let value = delay_ms.min(most);
            Decision { value: FailureDecision::Retry(value), source, clamped: value != delay_ms }
        }
        FailureDecision::Poison(reason) => {
            // Cut before and after escaping: a 10 MiB reason is never escaped whole.
            let bounded = crate::health::escaped_text(cut(&reason, MAX_FAILURE_TEXT_BYTES));
            let bounded = if bounded.trim().is_empty() { "(the rule gave no reason)".to_string() } else { cut(&bounded, MAX_FAILURE_TEXT_BYTES).to_string() };
            let clamped = bounded != reason;
            Decision { value: FailureDecision::Poison(bounded), source, clamped }
        }
        FailureDecision::Default => Decision { value: FailureDecision::Default, source, clamped: false },
    }
}

/// `text`, at most `max` bytes of it, cut at a character boundary.
pub(crate) fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A native rule's task count, clamped to the queue's bounds.
pub(crate) fn native_task_count(rule: &dyn NativeRule, state: &QueueState) -> Decision<u32> {
    clamp_task_count(rule.optimal_dequeue_task_count(state), DecisionSource::Rule, state)
}

/// A native rule's `QueueEmpty`, clamped to the queue's polling intervals.
pub(crate) fn native_queue_empty(rule: &dyn NativeRule, ctx: &IdleContext) -> Decision<IdleDecision> {
    clamp_idle(rule.on_queue_empty(ctx), DecisionSource::Rule, ctx)
}

/// A native rule's concurrency decision, clamped to `[1, max_limit]`.
pub(crate) fn native_concurrency(rule: &dyn NativeRule, state: &HandlerState) -> Option<Decision<u32>> {
    rule.max_concurrent_calls(state).map(|raw| clamp_concurrency(raw, DecisionSource::Rule, state))
}

/// A concurrency decision clamped to `[1, max_limit]`: at least one call runs, and never
/// more than the queue's `max_concurrent_calls`.
pub(crate) fn clamp_concurrency(raw: u32, source: DecisionSource, state: &HandlerState) -> Decision<u32> {
    let value = raw.clamp(1, state.max_limit.max(1));
    Decision { value, source, clamped: value != raw }
}

pub(crate) fn clamp_task_count(raw: u32, source: DecisionSource, state: &QueueState) -> Decision<u32> {
    let value = raw.clamp(state.min_tasks, state.max_tasks.max(state.min_tasks));
    Decision { value, source, clamped: value != raw }
}

pub(crate) fn clamp_idle(raw: IdleDecision, source: DecisionSource, ctx: &IdleContext) -> Decision<IdleDecision> {
    let delay_ms = raw.delay_ms.clamp(ctx.min_interval_ms, ctx.max_interval_ms.max(ctx.min_interval_ms));
    Decision { value: IdleDecision { delay_ms, stop: raw.stop }, source, clamped: delay_ms != raw.delay_ms }
}

#[cfg(test)]
mod failure_tests {
    use super::*;

    fn ctx() -> FailureContext {
        FailureContext { max_retry_delay_ms: 60_000, ..Default::default() }
    }

    #[test]
    fn a_retry_is_clamped_to_max_retry_delay_and_to_seven_days_and_counted() {
        let clamped = clamp_failure(FailureDecision::Retry(u64::MAX), DecisionSource::Rule, &ctx());
        assert_eq!((clamped.value, clamped.clamped), (FailureDecision::Retry(60_000), true));
        let unbounded = FailureContext { max_retry_delay_ms: u64::MAX, ..ctx() };
        assert_eq!(clamp_failure(FailureDecision::Retry(u64::MAX), DecisionSource::Rule, &unbounded).value, FailureDecision::Retry(7 * 24 * 3_600_000));
        let kept = clamp_failure(FailureDecision::Retry(5_000), DecisionSource::Rule, &ctx());
        assert_eq!((kept.value, kept.clamped), (FailureDecision::Retry(5_000), false));
    }

    #[test]
    fn a_poison_reason_is_bounded_escaped_and_never_empty() {
        let long = clamp_failure(FailureDecision::Poison("é".repeat(2_000)), DecisionSource::Rule, &ctx());
        let FailureDecision::Poison(reason) = &long.value else { panic!("{long:?}") };
        assert!(reason.len() <= MAX_FAILURE_TEXT_BYTES && long.clamped, "{} bytes", reason.len());
        // Attack pass (session 11): the contract keeps 1024 bytes; 512 were kept.
        assert!(reason.len() > MAX_FAILURE_TEXT_BYTES - 4, "only {} bytes kept", reason.len());
        let forged = clamp_failure(FailureDecision::Poison("no\nWARN forged line".into()), DecisionSource::Rule, &ctx());
        assert_eq!(forged.value, FailureDecision::Poison("no\\nWARN forged line".into()));
        let empty = clamp_failure(FailureDecision::Poison("  ".into()), DecisionSource::Rule, &ctx());
        assert_eq!(empty.value, FailureDecision::Poison("(the rule gave no reason)".into()));
        let fine = clamp_failure(FailureDecision::Poison("HTTP 422".into()), DecisionSource::Rule, &ctx());
        assert!(!fine.clamped);
    }
}
