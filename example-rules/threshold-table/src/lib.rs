//! A depth → tasks table and a back-off curve, both from the queue's `rule_params`:
//!
//! | parameter | meaning | default |
//! |---|---|---|
//! | `table` | `depth:tasks` rows, ending with `*:tasks` | `100:10, 1000:50, *:100` |
//! | `step_min_ms`, `step_max_ms` | jitter range of one back-off step, ms | 80, 120 |
//! | `keep_tasks` | idle tasks that never stop (0 lets all stop, with push) | 1 |

use ebb_rules_sdk::backoff::jittered_exponential;
use ebb_rules_sdk::params::ParamsExt;
use ebb_rules_sdk::thresholds::DynThresholdTable;
use ebb_rules_sdk::{IdleContext, IdleDecision, Params, QueueState, ScalingRule, export_rule};

#[derive(Debug)]
struct ThresholdTable {
    table: DynThresholdTable,
    step_ms: (f64, f64),
    keep_tasks: u32,
}

impl Default for ThresholdTable {
    fn default() -> Self {
        ThresholdTable { table: DynThresholdTable::parse("100:10, 1000:50, *:100").expect("the default table parses"), step_ms: (80.0, 120.0), keep_tasks: 1 }
    }
}

impl ScalingRule for ThresholdTable {
    fn configure(&mut self, params: &Params) -> Result<(), String> {
        let mut reader = params.reader();
        if let Some(table) = reader.parse_with("table", DynThresholdTable::parse)? {
            self.table = table;
        }
        let low = reader.get_or("step_min_ms", self.step_ms.0)?;
        let high = reader.get_or("step_max_ms", self.step_ms.1)?;
        if !(0.0..=high).contains(&low) {
            return Err(format!("parameter \"step_min_ms\": {low} must be between 0 and step_max_ms ({high})"));
        }
        self.step_ms = (low, high);
        self.keep_tasks = reader.get_or("keep_tasks", self.keep_tasks)?;
        reader.finish()
    }

    fn optimal_dequeue_task_count(&self, state: &QueueState) -> u32 {
        self.table.tasks_for(state.approximate_depth)
    }

    fn on_queue_empty(&self, ctx: &IdleContext) -> IdleDecision {
        let delay_ms = jittered_exponential(ctx.idle_count, ctx.min_interval_ms, ctx.max_interval_ms, self.step_ms, ctx.random);
        let stop = delay_ms >= ctx.max_interval_ms && ctx.active_tasks > self.keep_tasks;
        IdleDecision { delay_ms, stop }
    }
}

export_rule!(ThresholdTable);

#[cfg(test)]
mod tests {
    use super::*;

    fn configured(pairs: &[(&str, &str)]) -> Result<ThresholdTable, String> {
        let params: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut rule = ThresholdTable::default();
        rule.configure(&params).map(|()| rule)
    }

    #[test]
    fn table_param_replaces_the_paper_table() {
        let rule = configured(&[("table", "5:1, *:3")]).unwrap();
        let at = |depth| rule.optimal_dequeue_task_count(&QueueState { approximate_depth: depth, ..Default::default() });
        assert_eq!((at(4), at(5)), (1, 3));
    }

    #[test]
    fn bad_params_are_rejected_by_name() {
        assert!(configured(&[("table", "5:1")]).unwrap_err().contains("parameter \"table\""));
        assert!(configured(&[("tabel", "5:1, *:2")]).unwrap_err().contains("unknown parameter tabel"));
    }
}
