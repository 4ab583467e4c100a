//! Panics (a trap) on every decision, after writing to stderr.
use ebb_rules_sdk::{HandlerState, IdleContext, IdleDecision, QueueState, ScalingRule, export_rule};

#[derive(Default)]
struct Trap;

impl ScalingRule for Trap {
    fn optimal_dequeue_task_count(&self, state: &QueueState) -> u32 {
        eprintln!("about to fail at depth {}", state.approximate_depth);
        panic!("this rule always fails")
    }
    fn on_queue_empty(&self, _: &IdleContext) -> IdleDecision {
        panic!("this rule always fails")
    }
    fn max_concurrent_calls(&self, _: &HandlerState) -> Option<u32> {
        panic!("this rule always fails")
    }
}

export_rule!(Trap);
