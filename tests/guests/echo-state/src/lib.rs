//! Built with the SDK (contract 0.2.0): `optimal-dequeue-task-count` returns the field of
//! `queue-state` its `field` parameter names, as a u32, so a test can read what the host
//! told it. `arrivals_per_sec` is in thousandths; `oldest_message_age_ms` is 0 for none and
//! the age + 1 otherwise; `depth_source` is 1 for measured and 2 for inferred. Idle back-off
//! is the paper's.
use ebb_rules_sdk::params::ParamsExt;
use ebb_rules_sdk::{DepthSource, Params, QueueState, ScalingRule, export_rule};

#[derive(Default)]
struct EchoState {
    field: String,
}

const FIELDS: &[&str] = &[
    "approximate_depth",
    "in_flight",
    "active_tasks",
    "recent_failures",
    "last_get_messages",
    "batch_size",
    "arrivals_per_sec",
    "oldest_message_age_ms",
    "depth_source",
];

impl ScalingRule for EchoState {
    fn configure(&mut self, params: &Params) -> Result<(), String> {
        let mut reader = params.reader();
        self.field = reader.get_or("field", "approximate_depth".to_string())?;
        reader.finish()?;
        if !FIELDS.contains(&self.field.as_str()) {
            return Err(format!("parameter \"field\": {} is not one of {}", self.field, FIELDS.join(", ")));
        }
        Ok(())
    }

    fn optimal_dequeue_task_count(&self, s: &QueueState) -> u32 {
        let clip = |n: u64| n.min(u32::MAX as u64) as u32;
        match self.field.as_str() {
            "approximate_depth" => clip(s.approximate_depth),
            "in_flight" => s.in_flight,
            "active_tasks" => s.active_tasks,
            "recent_failures" => s.recent_failures,
            "last_get_messages" => s.last_get_messages,
            "batch_size" => s.batch_size,
            "arrivals_per_sec" => (s.arrivals_per_sec * 1000.0).round() as u32,
            "oldest_message_age_ms" => s.oldest_message_age_ms.map_or(0, |age| clip(age.saturating_add(1))),
            "depth_source" => match s.depth_source {
                DepthSource::Measured => 1,
                DepthSource::Inferred => 2,
            },
            _ => unreachable!("configure checked the field"),
        }
    }
}

export_rule!(EchoState);
