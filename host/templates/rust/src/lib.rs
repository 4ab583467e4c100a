//! {{name}}: an ebb scaling rule. One dequeue task per `per_task` messages of backlog,
//! ⌈depth ÷ per_task⌉; when the queue is empty, the paper's back-off (the SDK's default).
//!
//! Parameters (the queue's `rule_params`): `per_task`, messages per task, a whole number
//! from 1 (default 32).
//!
//! Test: `cargo test`. Build: `ebb rule build`. Then `ebb rule test {{name}}.wasm cases.toml`.

use ebb_rules_sdk::{Params, ParamsExt, QueueState, ScalingRule, export_rule};

/// Messages per task when `per_task` is not given.
const DEFAULT_PER_TASK: u64 = 32;

/// The rule: its parameters, set once by `configure` before any decision.
pub struct Rule {
    per_task: u64,
}

impl Default for Rule {
    fn default() -> Self {
        Rule { per_task: DEFAULT_PER_TASK }
    }
}

impl ScalingRule for Rule {
    // An `Err` rejects the parameters: the host shows it and keeps the rule it had.
    fn configure(&mut self, params: &Params) -> Result<(), String> {
        let mut reader = params.reader();
        let per_task: u64 = reader.get_or("per_task", DEFAULT_PER_TASK)?;
        if per_task == 0 {
            return Err("parameter \"per_task\": must be 1 or more (messages per task)".into());
        }
        reader.finish()?;
        self.per_task = per_task;
        Ok(())
    }

    fn optimal_dequeue_task_count(&self, state: &QueueState) -> u32 {
        u32::try_from(state.approximate_depth.div_ceil(self.per_task)).unwrap_or(u32::MAX)
    }

    // `on_queue_empty` is the SDK's default: `ebb_rules_sdk::paper::on_queue_empty`. So is
    // `max_concurrent_calls` (contract 0.3.0): `None`, the queue keeps its max_concurrent_calls.
}

export_rule!(Rule);

#[cfg(test)]
mod tests {
    use super::*;
    use ebb_rules_sdk::IdleContext;

    fn configured(pairs: &[(&str, &str)]) -> Result<Rule, String> {
        let params: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut rule = Rule::default();
        rule.configure(&params)?;
        Ok(rule)
    }

    fn tasks(rule: &Rule, depth: u64) -> u32 {
        rule.optimal_dequeue_task_count(&QueueState { approximate_depth: depth, ..Default::default() })
    }

    #[test]
    fn per_task_must_be_a_whole_number_from_1() {
        for bad in ["zero", "0", "-1", "1.5", "", "1e3", "0x10", "5_000"] {
            let error = configured(&[("per_task", bad)]).err().unwrap_or_else(|| panic!("per_task {bad:?} was accepted"));
            assert!(error.contains("per_task"), "{error}");
        }
        let error = configured(&[("per_tasks", "8")]).err().expect("a misspelt parameter is rejected");
        assert!(error.contains("per_tasks"), "{error}");
    }

    #[test]
    fn one_task_per_per_task_messages_rounded_up() -> Result<(), String> {
        let rule = configured(&[("per_task", "32")])?;
        assert_eq!([0, 1, 32, 33, 320, 321].map(|depth| tasks(&rule, depth)), [0, 1, 1, 2, 10, 11]);
        assert_eq!(tasks(&configured(&[])?, 64), 2, "per_task defaults to 32");
        assert_eq!(tasks(&configured(&[("per_task", "1")])?, u64::MAX), u32::MAX, "saturates");
        Ok(())
    }

    #[test]
    fn an_empty_queue_backs_off_from_the_minimum_and_stops_with_push() -> Result<(), String> {
        let rule = configured(&[])?;
        let idle = |idle_count, push_enabled| IdleContext {
            idle_count,
            min_interval_ms: 800,
            max_interval_ms: 60_000,
            push_enabled,
            random: 1 << 62,
            ..Default::default()
        };
        let first = rule.on_queue_empty(&idle(1, false));
        assert_eq!((first.delay_ms, first.stop), (800, false));
        assert_eq!(rule.on_queue_empty(&idle(3, false)).delay_ms, 2205, "800 x 1.75² x 0.9");
        assert!(rule.on_queue_empty(&idle(1, true)).stop, "with push an idle task stops");
        Ok(())
    }
}
