//! Half a rule: `optimal-dequeue-task-count` always answers (2 tasks), `on-queue-empty`
//! always traps. The successes of the one must not hide the faults of the other.
use ebb_rules_sdk::{IdleContext, IdleDecision, QueueState, ScalingRule, export_rule};

#[derive(Default)]
struct TrapsWhenEmpty;

impl ScalingRule for TrapsWhenEmpty {
    fn optimal_dequeue_task_count(&self, _: &QueueState) -> u32 {
        2
    }
    fn on_queue_empty(&self, _: &IdleContext) -> IdleDecision {
        panic!("on-queue-empty always fails")
    }
}

export_rule!(TrapsWhenEmpty);
