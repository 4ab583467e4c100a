//! A rule whose decisions take the time its parameters say: each call spins `work`
//! iterations of a loop (CPU time, and fuel) and then sleeps `sleep_ms` milliseconds (wall-clock
//! time, no CPU: the clocks a rule reads stand still, but a sleep still sleeps), at most 100 ms
//! at a time, so that the host's deadline checks, which come between wasm instructions, see it
//! go by (and few enough host calls that their own CPU time stays small). Decides 4 tasks, and the paper's idle back-off. For telling the rule's own work from
//! time it waits.
use ebb_rules_sdk::params::ParamsExt;
use ebb_rules_sdk::{IdleContext, IdleDecision, Params, QueueState, ScalingRule, export_rule, paper};
use std::time::Duration;

#[derive(Default)]
struct Paced {
    work: u64,
    sleep_ms: u64,
}

impl Paced {
    fn take_time(&self) {
        let mut n = 0u64;
        for i in 0..self.work {
            n = std::hint::black_box(n.wrapping_add(i));
        }
        std::hint::black_box(n);
        let mut left = self.sleep_ms;
        while left > 0 {
            let step = left.min(100);
            std::thread::sleep(Duration::from_millis(step));
            left -= step;
        }
    }
}

impl ScalingRule for Paced {
    fn configure(&mut self, params: &Params) -> Result<(), String> {
        let mut reader = params.reader();
        self.work = reader.get_or("work", 0)?;
        self.sleep_ms = reader.get_or("sleep_ms", 0)?;
        reader.finish()
    }
    fn optimal_dequeue_task_count(&self, _: &QueueState) -> u32 {
        self.take_time();
        4
    }
    fn on_queue_empty(&self, ctx: &IdleContext) -> IdleDecision {
        self.take_time();
        paper::on_queue_empty(ctx)
    }
}

export_rule!(Paced);
