//! Half a rule of contract 0.3.0: `optimal-dequeue-task-count` always answers (2 tasks) and
//! `on-queue-empty` is the paper's, but `max-concurrent-calls` always traps. Its faults must
//! be counted as that export's, and leave the queue at its configured bound.
use ebb_rules_sdk::{HandlerState, QueueState, ScalingRule, export_rule};

#[derive(Default)]
struct TrapsDecidingConcurrency;

impl ScalingRule for TrapsDecidingConcurrency {
    fn optimal_dequeue_task_count(&self, _: &QueueState) -> u32 {
        2
    }
    fn max_concurrent_calls(&self, state: &HandlerState) -> Option<u32> {
        eprintln!("about to fail at a limit of {}", state.current_limit);
        panic!("max-concurrent-calls always fails")
    }
}

export_rule!(TrapsDecidingConcurrency);
