//! Slow to set up, and optionally faulty: `configure` waits `setup_ms` milliseconds
//! (default 0; in 10 ms sleeps, counted: the clocks a rule reads stand still) and panics with a message if `panic_in_configure` is 1; decisions return
//! `tasks` (default 3), or trap if `trap` is 1.
use ebb_rules_sdk::params::ParamsExt;
use ebb_rules_sdk::{IdleContext, IdleDecision, Params, QueueState, ScalingRule, export_rule};
use std::time::Duration;

#[derive(Default)]
struct SlowSetup {
    tasks: u32,
    trap: bool,
}

impl ScalingRule for SlowSetup {
    fn configure(&mut self, params: &Params) -> Result<(), String> {
        let mut reader = params.reader();
        let setup_ms: u64 = reader.get_or("setup_ms", 0)?;
        self.tasks = reader.get_or("tasks", 3)?;
        self.trap = reader.get_or("trap", 0u32)? == 1;
        let panic_in_configure = reader.get_or("panic_in_configure", 0u32)? == 1;
        reader.finish()?;
        // Short sleeps, so a setup deadline stops it soon after it passes.
        let mut slept = 0;
        while slept < setup_ms {
            std::thread::sleep(Duration::from_millis(10));
            slept += 10;
        }
        if panic_in_configure {
            panic!("configure exploded on purpose");
        }
        Ok(())
    }
    fn optimal_dequeue_task_count(&self, _: &QueueState) -> u32 {
        if self.trap {
            panic!("the decision failed on purpose");
        }
        self.tasks
    }
    fn on_queue_empty(&self, ctx: &IdleContext) -> IdleDecision {
        if self.trap {
            panic!("the decision failed on purpose");
        }
        IdleDecision { delay_ms: ctx.min_interval_ms, stop: false }
    }
}

export_rule!(SlowSetup);
