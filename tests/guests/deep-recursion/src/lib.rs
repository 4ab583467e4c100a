//! Recurses without end on the wasm stack (scalar locals only, so no shadow stack in linear
//! memory): the host's stack limit must stop it.
use ebb_rules_sdk::{HandlerState, IdleContext, IdleDecision, QueueState, ScalingRule, export_rule};
use std::hint::black_box;

#[derive(Default)]
struct DeepRecursion;

#[inline(never)]
fn descend(depth: u64) -> u64 {
    if black_box(depth) == u64::MAX { 0 } else { descend(black_box(depth + 1)).wrapping_add(depth) }
}

impl ScalingRule for DeepRecursion {
    fn optimal_dequeue_task_count(&self, _: &QueueState) -> u32 {
        descend(0) as u32
    }
    fn on_queue_empty(&self, _: &IdleContext) -> IdleDecision {
        IdleDecision { delay_ms: descend(0), stop: false }
    }
    fn max_concurrent_calls(&self, _: &HandlerState) -> Option<u32> {
        Some(descend(0) as u32)
    }
}

export_rule!(DeepRecursion);
