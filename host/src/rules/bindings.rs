//! Host bindings for every contract version the host serves: `wit/ebb-rules-0.4.0` (the
//! current one), `wit/ebb-rules-0.3.0`, `0.2.0` and `0.1.0` (rules built before it keep
//! loading), and the conversions from the host's decision contexts into each version's records.

/// Bindings for `ebb:rules@0.4.0`, from its larger world (`failure-aware-rule`): a rule of
/// the `scaling-rule` world exports `decisions` only, and is loaded interface by interface
/// (`GuestIndices`), its `failures` left out.
pub(super) mod v0_4 {
    wasmtime::component::bindgen!({
        path: "../wit/ebb-rules-0.4.0",
        world: "ebb:rules/failure-aware-rule@0.4.0",
    });

    pub use exports::ebb::rules::decisions as wit;
    pub use exports::ebb::rules::failures as failures_wit;
}

/// Bindings for `ebb:rules/scaling-rule@0.3.0`.
pub(super) mod v0_3 {
    wasmtime::component::bindgen!({
        path: "../wit/ebb-rules-0.3.0",
        world: "ebb:rules/scaling-rule@0.3.0",
    });

    pub use exports::ebb::rules::decisions as wit;
}

/// Bindings for `ebb:rules/scaling-rule@0.2.0`.
pub(super) mod v0_2 {
    wasmtime::component::bindgen!({
        path: "../wit/ebb-rules-0.2.0",
        world: "ebb:rules/scaling-rule@0.2.0",
    });

    pub use exports::ebb::rules::decisions as wit;
}

/// Bindings for `ebb:rules/scaling-rule@0.1.0`.
pub(super) mod v0_1 {
    wasmtime::component::bindgen!({
        path: "../wit/ebb-rules-0.1.0",
        world: "ebb:rules/scaling-rule@0.1.0",
    });

    pub use exports::ebb::rules::decisions as wit;
}

/// The interface a rule component must export (`@<version>` follows).
pub(crate) const CONTRACT_INTERFACE: &str = "ebb:rules/decisions";
/// The newest contract version this host speaks: what the SDK and the examples build.
pub(crate) const CONTRACT_VERSION: &str = "0.4.0";
/// Every contract version this host loads, newest first.
pub(crate) const CONTRACT_VERSIONS: &[&str] = &["0.4.0", "0.3.0", "0.2.0", "0.1.0"];
/// The optional interface of failure decisions (`@0.4.0` follows): a rule that exports it
/// (world `failure-aware-rule`) decides what happens to failed messages.
pub(crate) const FAILURES_INTERFACE: &str = "ebb:rules/failures@0.4.0";

/// A contract version the host serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ContractVersion {
    /// `ebb:rules/decisions@0.1.0`: `queue-state` without the fields 0.2.0 added.
    V0_1,
    /// `ebb:rules/decisions@0.2.0`: without `max-concurrent-calls` (its queues keep their
    /// configured bound).
    V0_2,
    /// `ebb:rules/decisions@0.3.0`.
    V0_3,
    /// `ebb:rules/decisions@0.4.0` (as 0.3.0's), with `ebb:rules/failures@0.4.0` beside it
    /// when the rule decides failures.
    V0_4,
}

impl ContractVersion {
    /// The version, as in the interface name (`0.3.0`).
    pub fn as_str(self) -> &'static str {
        match self {
            ContractVersion::V0_1 => "0.1.0",
            ContractVersion::V0_2 => "0.2.0",
            ContractVersion::V0_3 => "0.3.0",
            ContractVersion::V0_4 => "0.4.0",
        }
    }

    /// Whether rules of this version decide how many handler calls run at once
    /// (`max-concurrent-calls`, since 0.3.0).
    pub fn decides_concurrency(self) -> bool {
        self >= ContractVersion::V0_3
    }

    /// The exported interface's full name (`ebb:rules/decisions@0.3.0`).
    pub fn interface(self) -> String {
        format!("{CONTRACT_INTERFACE}@{}", self.as_str())
    }

    pub(super) fn from_version(version: &str) -> Option<ContractVersion> {
        match version {
            "0.1.0" => Some(ContractVersion::V0_1),
            "0.2.0" => Some(ContractVersion::V0_2),
            "0.3.0" => Some(ContractVersion::V0_3),
            "0.4.0" => Some(ContractVersion::V0_4),
            _ => None,
        }
    }
}

impl std::fmt::Display for ContractVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Defines the queue-state conversion of a version whose record is 0.2.0's (0.3.0 left it
/// as it was).
macro_rules! queue_state_0_2 {
    ($wit:path) => {
        const _: () = {
            use $wit as wit;

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
                        last_get_messages: s.last_get_messages,
                        batch_size: s.batch_size,
                        arrivals_per_sec: s.arrivals_per_sec,
                        oldest_message_age_ms: s.oldest_message_age_ms,
                        depth_source: match s.depth_source {
                            ebb_rules_sdk::DepthSource::Measured => wit::DepthSource::Measured,
                            ebb_rules_sdk::DepthSource::Inferred => wit::DepthSource::Inferred,
                        },
                    }
                }
            }
        };
    };
}

queue_state_0_2!(v0_2::wit);
queue_state_0_2!(v0_3::wit);
queue_state_0_2!(v0_4::wit);

/// Defines the handler-state conversion of a version whose record is 0.3.0's.
macro_rules! handler_state_0_3 {
    ($wit:path) => {
        const _: () = {
            use $wit as wit;

            impl From<&ebb_rules_sdk::HandlerState> for wit::HandlerState {
                fn from(s: &ebb_rules_sdk::HandlerState) -> Self {
                    wit::HandlerState {
                        queue: s.queue.clone(),
                        current_limit: s.current_limit,
                        max_limit: s.max_limit,
                        in_flight: s.in_flight,
                        peak_in_flight: s.peak_in_flight,
                        waiting_tasks: s.waiting_tasks,
                        window_ms: s.window_ms,
                        completed: s.completed,
                        failed: s.failed,
                        pushed_back: s.pushed_back,
                        latency_mean_ms: s.latency_mean_ms,
                        latency_min_ms: s.latency_min_ms,
                        latency_max_ms: s.latency_max_ms,
                        timestamp_ms: s.timestamp_ms,
                        random: s.random,
                    }
                }
            }
        };
    };
}

handler_state_0_3!(v0_3::wit);
handler_state_0_3!(v0_4::wit);

impl From<&ebb_rules_sdk::FailureContext> for v0_4::failures_wit::FailureContext {
    fn from(c: &ebb_rules_sdk::FailureContext) -> Self {
        use v0_4::failures_wit::ErrorClass;
        v0_4::failures_wit::FailureContext {
            queue: c.queue.clone(),
            dequeue_count: c.dequeue_count,
            max_dequeue_count: c.max_dequeue_count,
            error_class: match c.error_class {
                ebb_rules_sdk::ErrorClass::Timeout => ErrorClass::Timeout,
                ebb_rules_sdk::ErrorClass::Connect => ErrorClass::Connect,
                ebb_rules_sdk::ErrorClass::HttpStatus => ErrorClass::HttpStatus,
                ebb_rules_sdk::ErrorClass::Panic => ErrorClass::Panic,
                ebb_rules_sdk::ErrorClass::Other => ErrorClass::Other,
            },
            http_status: c.http_status,
            error: c.error.clone(),
            item: c.item,
            elapsed_ms: c.elapsed_ms,
            handler_latency_ms: c.handler_latency_ms,
            default_retry_delay_ms: c.default_retry_delay_ms,
            max_retry_delay_ms: c.max_retry_delay_ms,
            timestamp_ms: c.timestamp_ms,
            random: c.random,
        }
    }
}

impl From<v0_4::failures_wit::FailureDecision> for ebb_rules_sdk::FailureDecision {
    fn from(d: v0_4::failures_wit::FailureDecision) -> Self {
        match d {
            v0_4::failures_wit::FailureDecision::Retry(delay_ms) => ebb_rules_sdk::FailureDecision::Retry(delay_ms),
            v0_4::failures_wit::FailureDecision::Poison(reason) => ebb_rules_sdk::FailureDecision::Poison(reason),
            v0_4::failures_wit::FailureDecision::Default => ebb_rules_sdk::FailureDecision::Default,
        }
    }
}

/// A 0.1.0 rule is told what it always was: the fields 0.2.0 added are left out.
impl From<&ebb_rules_sdk::QueueState> for v0_1::wit::QueueState {
    fn from(s: &ebb_rules_sdk::QueueState) -> Self {
        v0_1::wit::QueueState {
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

/// Defines the idle-context and idle-decision conversions of a version whose two records
/// are the same as 0.1.0's.
macro_rules! idle_records {
    ($wit:path) => {
        const _: () = {
            use $wit as wit;

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
        };
    };
}

idle_records!(v0_1::wit);
idle_records!(v0_2::wit);
idle_records!(v0_3::wit);
idle_records!(v0_4::wit);
