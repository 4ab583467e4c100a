//! Allocates without end: the memory cap must stop it.
use ebb_rules_sdk::{HandlerState, IdleContext, IdleDecision, QueueState, ScalingRule, export_rule};

#[derive(Default)]
struct MemoryBomb;

fn hoard() -> ! {
    let mut chunks = Vec::new();
    loop {
        // Reserve without touching: growth is what the cap must stop.
        chunks.push(std::hint::black_box(Vec::<u8>::with_capacity(16 << 20)));
    }
}

impl ScalingRule for MemoryBomb {
    fn optimal_dequeue_task_count(&self, _: &QueueState) -> u32 {
        hoard()
    }
    fn on_queue_empty(&self, _: &IdleContext) -> IdleDecision {
        hoard()
    }
    fn max_concurrent_calls(&self, _: &HandlerState) -> Option<u32> {
        hoard()
    }
}

export_rule!(MemoryBomb);
