//! A rule built against contract 0.2.0 (`wit/ebb-rules-0.2.0`), as SDK rules were before
//! 0.3.0: hosts that speak 0.3.0 must keep loading it, its decisions must not change, and it
//! decides no handler concurrency (it has no `max-concurrent-calls`). Without parameters it
//! decides as the paper does; with `field` set, `optimal-dequeue-task-count` returns that
//! field of `queue-state` (`approximate_depth`, `last_get_messages`, `batch_size`,
//! `arrivals_per_sec` in thousandths, `oldest_message_age_ms` as 0 for none and the age + 1
//! otherwise, `depth_source` as 1 for measured and 2 for inferred), so a test can read what
//! the host told it.
wit_bindgen::generate!({
    path: "../../../wit/ebb-rules-0.2.0",
    world: "ebb:rules/scaling-rule@0.2.0",
});

use std::cell::RefCell;

use exports::ebb::rules::decisions::*;

thread_local! {
    static FIELD: RefCell<Option<String>> = const { RefCell::new(None) };
}

const FIELDS: &[&str] = &["approximate_depth", "last_get_messages", "batch_size", "arrivals_per_sec", "oldest_message_age_ms", "depth_source"];

struct Rule;

impl Guest for Rule {
    fn configure(params: Vec<(String, String)>) -> Result<(), String> {
        for (key, value) in params {
            if key != "field" {
                return Err(format!("unknown parameter {key} (this rule takes: field)"));
            }
            if !FIELDS.contains(&value.as_str()) {
                return Err(format!("parameter \"field\": {value} is not one of {}", FIELDS.join(", ")));
            }
            FIELD.with(|f| *f.borrow_mut() = Some(value));
        }
        Ok(())
    }

    fn optimal_dequeue_task_count(s: QueueState) -> u32 {
        let clip = |n: u64| n.min(u32::MAX as u64) as u32;
        FIELD.with(|f| match f.borrow().as_deref() {
            None => {
                let state = ebb_rules_sdk::QueueState { approximate_depth: s.approximate_depth, ..Default::default() };
                ebb_rules_sdk::paper::optimal_dequeue_task_count(&state)
            }
            Some("approximate_depth") => clip(s.approximate_depth),
            Some("last_get_messages") => s.last_get_messages,
            Some("batch_size") => s.batch_size,
            Some("arrivals_per_sec") => (s.arrivals_per_sec * 1000.0).round() as u32,
            Some("oldest_message_age_ms") => s.oldest_message_age_ms.map_or(0, |age| clip(age.saturating_add(1))),
            Some(_) => match s.depth_source {
                DepthSource::Measured => 1,
                DepthSource::Inferred => 2,
            },
        })
    }

    fn on_queue_empty(c: IdleContext) -> IdleDecision {
        let ctx = ebb_rules_sdk::IdleContext {
            queue: c.queue,
            idle_count: c.idle_count,
            active_tasks: c.active_tasks,
            min_interval_ms: c.min_interval_ms,
            max_interval_ms: c.max_interval_ms,
            push_enabled: c.push_enabled,
            timestamp_ms: c.timestamp_ms,
            random: c.random,
        };
        let d = ebb_rules_sdk::paper::on_queue_empty(&ctx);
        IdleDecision { delay_ms: d.delay_ms, stop: d.stop }
    }
}

export!(Rule);
