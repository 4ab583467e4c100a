//! Never returns from a decision: the deadline (or fuel) must stop it.
use ebb_rules_sdk::{HandlerState, IdleContext, IdleDecision, QueueState, ScalingRule, export_rule};

#[derive(Default)]
struct LoopForever;

fn spin() -> ! {
    let mut n = 0u64;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

impl ScalingRule for LoopForever {
    fn optimal_dequeue_task_count(&self, _: &QueueState) -> u32 {
        spin()
    }
    fn on_queue_empty(&self, _: &IdleContext) -> IdleDecision {
        spin()
    }
    fn max_concurrent_calls(&self, _: &HandlerState) -> Option<u32> {
        spin()
    }
}

export_rule!(LoopForever);
