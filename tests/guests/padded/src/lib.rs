//! A 25 MB rule: the paper's decisions plus 25 MiB of data in its linear memory, the size
//! of a rule written in Python. Used to measure what swapping large rules costs in memory.
use ebb_rules_sdk::{QueueState, ScalingRule, export_rule};

static PAD: [u8; 25 << 20] = [0x5a; 25 << 20];

#[derive(Default)]
struct Padded;

impl ScalingRule for Padded {
    fn optimal_dequeue_task_count(&self, state: &QueueState) -> u32 {
        let pad = std::hint::black_box(&PAD);
        let byte = pad[(state.approximate_depth as usize) % pad.len()] as u32;
        // Always 9 (0x5a = 90), through the data so that it stays in the component.
        byte / 10
    }
}

export_rule!(Padded);
