//! Always asks for `tasks` dequeue tasks (parameter, default 7). Used to observe swaps.
use ebb_rules_sdk::params::ParamsExt;
use ebb_rules_sdk::{Params, QueueState, ScalingRule, export_rule};

struct FixedTasks(u32);

impl Default for FixedTasks {
    fn default() -> Self {
        FixedTasks(7)
    }
}

impl ScalingRule for FixedTasks {
    fn configure(&mut self, params: &Params) -> Result<(), String> {
        let mut reader = params.reader();
        self.0 = reader.get_or("tasks", self.0)?;
        reader.finish()
    }
    fn optimal_dequeue_task_count(&self, _: &QueueState) -> u32 {
        self.0
    }
}

export_rule!(FixedTasks);
