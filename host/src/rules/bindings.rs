//! Host bindings for `wit/ebb-rules-0.1.0`.

wasmtime::component::bindgen!({
    path: "../wit/ebb-rules-0.1.0",
    world: "ebb:rules/scaling-rule@0.1.0",
});

pub use exports::ebb::rules::decisions as wit;

/// The interface a rule component must export, with the version this host speaks.
pub const CONTRACT_INTERFACE: &str = "ebb:rules/decisions";
/// The contract version this host speaks.
pub const CONTRACT_VERSION: &str = "0.1.0";

impl From<&ebb_rules_sdk::QueueState> for wit::QueueState {
    fn from(s: &ebb_rules_sdk::QueueState) -> Self {
        wit::QueueState {
            queue: s.queue.clone(),
            approximate_depth: s.approximate_depth,
            in_flight: s.in_flight,
            active_tasks: s.active_tasks,
            min_tasks: s.min_tasks,
            max_tasks: s.max_tasks,
            throughput_per_sec: s.throughput_per_sec,
            mean_handler_latency_ms: s.mean_handler_latency_ms,
            recent_failures: s.recent_failures,
            push_enabled: s.push_enabled,
            timestamp_ms: s.timestamp_ms,
            random: s.random,
        }
    }
}

impl From<&ebb_rules_sdk::IdleContext> for wit::IdleContext {
    fn from(c: &ebb_rules_sdk::IdleContext) -> Self {
        wit::IdleContext {
            queue: c.queue.clone(),
            idle_count: c.idle_count,
            active_tasks: c.active_tasks,
            min_interval_ms: c.min_interval_ms,
            max_interval_ms: c.max_interval_ms,
            push_enabled: c.push_enabled,
            timestamp_ms: c.timestamp_ms,
            random: c.random,
        }
    }
}

impl From<wit::IdleDecision> for ebb_rules_sdk::IdleDecision {
    fn from(d: wit::IdleDecision) -> Self {
        ebb_rules_sdk::IdleDecision { delay_ms: d.delay_ms, stop: d.stop }
    }
}
