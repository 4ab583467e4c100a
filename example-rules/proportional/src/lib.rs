//! Proportional scaling: one dequeue task per `per_task` queued messages (rounded up), so
//! the task count tracks the backlog smoothly instead of in the paper's three steps.
//! Idle back-off is the paper's.
//!
//! | parameter | meaning | default |
//! |---|---|---|
//! | `per_task` | queued messages per dequeue task | 200 |

use ebb_rules_sdk::params::ParamsExt;
use ebb_rules_sdk::{Params, QueueState, ScalingRule, export_rule};

struct Proportional {
    per_task: u64,
}

impl Default for Proportional {
    fn default() -> Self {
        Proportional { per_task: 200 }
    }
}

impl ScalingRule for Proportional {
    fn configure(&mut self, params: &Params) -> Result<(), String> {
        let mut reader = params.reader();
        self.per_task = reader.get_or("per_task", self.per_task)?;
        if self.per_task == 0 {
            return Err("parameter \"per_task\": must be at least 1".into());
        }
        reader.finish()
    }

    fn optimal_dequeue_task_count(&self, state: &QueueState) -> u32 {
        state.approximate_depth.div_ceil(self.per_task).min(u32::MAX as u64) as u32
    }
}

export_rule!(Proportional);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_task_per_share_of_the_backlog() {
        let rule = Proportional::default();
        let tasks = |depth| rule.optimal_dequeue_task_count(&QueueState { approximate_depth: depth, ..Default::default() });
        assert_eq!([0, 1, 200, 201, 3000].map(tasks), [0, 1, 1, 2, 15]);
    }
}
