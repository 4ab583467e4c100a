//! The contexts `ebb rule eval`, `ebb rule check` and `ebb rule test` call a rule with: the
//! defaults a given context is laid over, the contexts no host would send, and how a
//! failure decision is shown.

use anyhow::{Context as _, Result, bail};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::rules::{ErrorClass, FailureContext, FailureDecision};

/// Whether a fault's reason is the call deadline (wall-clock time), not fuel or a trap.
pub(super) fn past_deadline(reason: &str) -> bool {
    reason.contains("ran past its call deadline")
}

/// A failure decision as `ebb rule check` and `ebb rule test` show it: `retry after N ms`,
/// `poison "reason"` (bounded and escaped, as the host keeps it) or `default`, with what the
/// host makes of a raw decision it bounds.
pub(super) fn shown_failure(raw: &FailureDecision, clamped: &crate::rules::Decision<FailureDecision>) -> String {
    let shown = match &clamped.value {
        FailureDecision::Retry(_) => match raw {
            FailureDecision::Retry(delay_ms) => format!("retry after {delay_ms} ms"),
            _ => unreachable!("a retry is clamped into a retry"),
        },
        FailureDecision::Poison(reason) => format!("poison {reason:?}"),
        FailureDecision::Default => "default".into(),
    };
    match &clamped.value {
        FailureDecision::Retry(delay_ms) if clamped.clamped => format!("{shown} (the host bounds it to {delay_ms} ms, as it should)"),
        FailureDecision::Poison(_) if clamped.clamped => format!("{shown} (as the host keeps the reason: bounded and escaped)"),
        _ => shown,
    }
}

/// The queue state `ebb rule eval --task-count` and `ebb rule test` lay a given one over.
pub(super) fn task_count_defaults(queue: &str) -> Value {
    json!({ "queue": queue, "min_tasks": 1, "max_tasks": 100, "active_tasks": 1, "random": 1u64 << 63, "batch_size": 32 })
}

/// The handler state `ebb rule eval --concurrency` and `ebb rule check` lay a given one over:
/// a queue as it starts, its limit at the ceiling.
pub(super) fn concurrency_defaults(queue: &str) -> Value {
    json!({ "queue": queue, "current_limit": 32, "max_limit": 32, "window_ms": 250, "random": 1u64 << 63 })
}

/// The failed delivery `ebb rule eval --failure`, `ebb rule check` and `ebb rule test` lay a
/// given one over: a first failure with the queue defaults (`max_dequeue_count` 5,
/// `visibility_timeout` 1 s, `max_retry_delay` 10 min).
pub(super) fn failure_defaults(queue: &str) -> Value {
    json!({
        "queue": queue,
        "dequeue_count": 1,
        "max_dequeue_count": crate::defaults::MAX_DEQUEUE_COUNT,
        "error_class": "other",
        "error": "the handler failed",
        "default_retry_delay_ms": crate::defaults::VISIBILITY_TIMEOUT.as_millis() as u64,
        "max_retry_delay_ms": crate::defaults::MAX_RETRY_DELAY.as_millis() as u64,
        "random": 1u64 << 63,
    })
}

/// Fields of a failure context whose defaults follow other given fields: a given
/// `dequeue_count` (or `max_retry_delay_ms`) also sets the default retry delay, doubling from
/// the queue's default `visibility_timeout` as the host's does; an `http_status` means the
/// class `http-status`.
pub(super) fn with_dependent_failure_defaults(mut given: Value) -> Value {
    if let Value::Object(fields) = &mut given {
        if fields.contains_key("http_status") && !fields.get("http_status").is_some_and(Value::is_null) {
            fields.entry("error_class").or_insert_with(|| json!("http-status"));
        }
        if !fields.contains_key("default_retry_delay_ms") {
            let tries = fields.get("dequeue_count").and_then(Value::as_u64).unwrap_or(1);
            let most = fields.get("max_retry_delay_ms").and_then(Value::as_u64).unwrap_or(crate::defaults::MAX_RETRY_DELAY.as_millis() as u64);
            let base = crate::defaults::VISIBILITY_TIMEOUT.as_millis() as u64;
            let delay = base.saturating_mul(1 << tries.saturating_sub(1).min(30)).min(most);
            fields.insert("default_retry_delay_ms".into(), json!(delay));
        }
    }
    given
}

/// Why no host would send `ctx` (a rule's answer to it would say nothing), or `None`.
pub(super) fn impossible_failure(ctx: &FailureContext) -> Option<String> {
    let most = ebb_rules_sdk::MAX_FAILURE_TEXT_BYTES;
    if ctx.dequeue_count == 0 {
        return Some("dequeue_count is 0 (it counts deliveries so far, this one included: 1 on the first failure)".into());
    }
    if ctx.max_dequeue_count == 0 {
        return Some("max_dequeue_count is 0 (the configuration's is at least 1)".into());
    }
    match (ctx.error_class, ctx.http_status) {
        (ErrorClass::HttpStatus, None) => return Some("error_class \"http-status\" without http_status (the handler's status)".into()),
        (ErrorClass::HttpStatus, Some(status)) if !(100..=599).contains(&status) || (200..=299).contains(&status) || status == 429 || status == 503 => {
            return Some(format!(
                "http_status {status} is not a failure (a failure's status is 100 to 599, not 2xx; 429 and 503 push back and never reach the rule)"
            ));
        }
        (class, Some(status)) if class != ErrorClass::HttpStatus => {
            return Some(format!(
                "http_status {status} with error_class {:?}: the host gives a status only with error_class \"http-status\"",
                class_name(class)
            ));
        }
        _ => {}
    }
    if ctx.error.len() > most {
        return Some(format!("error is {} bytes, over the {most} the host sends", ctx.error.len()));
    }
    if crate::names::QueueName::new(&ctx.queue).is_err() {
        return Some(format!(
            "queue {} is not a queue name (the host names the queue, or its partition, that failed)",
            crate::health::escaped_text(&ctx.queue)
        ));
    }
    if crate::health::escaped_text(&ctx.error) != ctx.error {
        return Some("error holds control or reordering characters, which the host escapes before a rule sees them".into());
    }
    if let Some(item) = ctx.item.filter(|item| *item >= crate::payload::DEFAULT_MAX_ITEMS) {
        return Some(format!(
            "item {item}: an envelope holds at most {} items (0 to {})",
            crate::payload::DEFAULT_MAX_ITEMS,
            crate::payload::DEFAULT_MAX_ITEMS - 1
        ));
    }
    let longest = crate::queue::MAX_VISIBILITY.as_millis() as u64;
    if ctx.max_retry_delay_ms > longest {
        return Some(format!("max_retry_delay_ms {} is over {longest} (7 days), the longest retry delay the host allows", ctx.max_retry_delay_ms));
    }
    if ctx.default_retry_delay_ms > ctx.max_retry_delay_ms {
        return Some(format!("default_retry_delay_ms {} is over max_retry_delay_ms {}", ctx.default_retry_delay_ms, ctx.max_retry_delay_ms));
    }
    None
}

fn class_name(class: ErrorClass) -> String {
    serde_json::to_value(class).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// The idle context `ebb rule eval --queue-empty` and `ebb rule test` lay a given one over.
pub(super) fn queue_empty_defaults(queue: &str) -> Value {
    json!({ "queue": queue, "idle_count": 1, "active_tasks": 1, "min_interval_ms": 100, "max_interval_ms": 60000, "random": 1u64 << 63 })
}

/// `given` (a JSON object) laid over `defaults`, naming `what` (a flag, a case) and the field in errors.
pub(super) fn with_defaults<T: DeserializeOwned>(given: Value, mut defaults: Value, what: &str) -> Result<T> {
    let Value::Object(given) = given else { bail!("{what} must be a JSON object") };
    defaults.as_object_mut().expect("defaults are an object").extend(given);
    // Named as the contract names them (`queue-state`), which the docs and errors use.
    let described = match std::any::type_name::<T>().rsplit("::").next().unwrap_or_default() {
        "QueueState" => "a queue-state",
        "IdleContext" => "an idle-context",
        "HandlerState" => "a handler-state",
        "FailureContext" => "a failure-context",
        _ => "what it should",
    };
    serde_json::from_value(defaults).with_context(|| format!("{what} does not describe {described}"))
}
