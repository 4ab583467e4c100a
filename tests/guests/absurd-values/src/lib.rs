//! Returns values far outside any sane bound: the host must clamp them.
use ebb_rules_sdk::{HandlerState, IdleContext, IdleDecision, QueueState, ScalingRule, export_rule};

#[derive(Default)]
struct AbsurdValues;

impl ScalingRule for AbsurdValues {
    fn optimal_dequeue_task_count(&self, _: &QueueState) -> u32 {
        u32::MAX
    }
    fn on_queue_empty(&self, _: &IdleContext) -> IdleDecision {
        IdleDecision { delay_ms: u64::MAX, stop: false }
    }
    fn max_concurrent_calls(&self, _: &HandlerState) -> Option<u32> {
        Some(u32::MAX)
    }
}

export_rule!(AbsurdValues);
