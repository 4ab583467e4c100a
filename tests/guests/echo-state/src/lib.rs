//! Built with the SDK (contract 0.3.0): `optimal-dequeue-task-count` returns the field of
//! `queue-state` its `field` parameter names, as a u32, so a test can read what the host
//! told it. `arrivals_per_sec` is in thousandths; `oldest_message_age_ms` is 0 for none and
//! the age + 1 otherwise; `depth_source` is 1 for measured and 2 for inferred. Likewise
//! `max-concurrent-calls` returns the field of `handler-state` its `handler_field` parameter
//! names (latencies in thousandths of a millisecond, `window_ms`, `timestamp_ms` and `random`
//! modulo 2^32), or none when it names none (the default). Idle back-off is the paper's.
use ebb_rules_sdk::params::ParamsExt;
use ebb_rules_sdk::{DepthSource, HandlerState, Params, QueueState, ScalingRule, export_rule};

#[derive(Default)]
struct EchoState {
    field: String,
    handler_field: Option<String>,
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

const HANDLER_FIELDS: &[&str] = &[
    "current_limit",
    "max_limit",
    "in_flight",
    "peak_in_flight",
    "waiting_tasks",
    "window_ms",
    "completed",
    "failed",
    "pushed_back",
    "latency_mean_ms",
    "latency_min_ms",
    "latency_max_ms",
    "timestamp_ms",
    "random",
    "queue_len",
];

impl ScalingRule for EchoState {
    fn configure(&mut self, params: &Params) -> Result<(), String> {
        let mut reader = params.reader();
        self.field = reader.get_or("field", "approximate_depth".to_string())?;
        self.handler_field = reader.get("handler_field")?;
        reader.finish()?;
        if let Some(field) = self.handler_field.as_deref().filter(|f| !HANDLER_FIELDS.contains(f)) {
            return Err(format!("parameter \"handler_field\": {field} is not one of {}", HANDLER_FIELDS.join(", ")));
        }
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

    fn max_concurrent_calls(&self, s: &HandlerState) -> Option<u32> {
        let thousandths = |ms: f64| (ms * 1000.0).round() as u32;
        Some(match self.handler_field.as_deref()? {
            "current_limit" => s.current_limit,
            "max_limit" => s.max_limit,
            "in_flight" => s.in_flight,
            "peak_in_flight" => s.peak_in_flight,
            "waiting_tasks" => s.waiting_tasks,
            "window_ms" => s.window_ms as u32,
            "completed" => s.completed,
            "failed" => s.failed,
            "pushed_back" => s.pushed_back,
            "latency_mean_ms" => thousandths(s.latency_mean_ms),
            "latency_min_ms" => thousandths(s.latency_min_ms),
            "latency_max_ms" => thousandths(s.latency_max_ms),
            "timestamp_ms" => s.timestamp_ms as u32,
            "random" => s.random as u32,
            "queue_len" => s.queue.len() as u32,
            _ => unreachable!("configure checked the field"),
        })
    }
}

export_rule!(EchoState);
