//! The decision contexts, as plain Rust values (the WIT records of `ebb:rules/decisions`).

/// What a listener knows about one queue when work is detected.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct QueueState {
    /// The queue's name, as in the host configuration.
    pub queue: String,
    /// Approximate number of messages in the queue (visible and leased).
    pub approximate_depth: u64,
    /// Messages this host has leased and not yet finished.
    pub in_flight: u32,
    /// Dequeue tasks running or waiting for work on this queue, on this host.
    pub active_tasks: u32,
    /// Configured lower bound on dequeue tasks.
    pub min_tasks: u32,
    /// Configured upper bound on dequeue tasks.
    pub max_tasks: u32,
    /// Messages completed per second over the recent window.
    pub throughput_per_sec: f64,
    /// Mean handler latency over the recent window, in milliseconds.
    pub mean_handler_latency_ms: f64,
    /// Handler failures over the recent window.
    pub recent_failures: u32,
    /// Whether push notifications can wake this queue.
    pub push_enabled: bool,
    /// Wall-clock time of the decision, in milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// A uniformly random value supplied by the host, for jitter.
    pub random: u64,
}

/// What a dequeue task knows when a get returned no message.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct IdleContext {
    /// The queue's name, as in the host configuration.
    pub queue: String,
    /// Consecutive empty gets of this task (1 on the first).
    pub idle_count: u32,
    /// Dequeue tasks running or waiting for work on this queue, on this host.
    pub active_tasks: u32,
    /// Configured shortest polling interval, in milliseconds.
    pub min_interval_ms: u64,
    /// Configured longest polling interval, in milliseconds.
    pub max_interval_ms: u64,
    /// Whether push notifications can wake this queue.
    pub push_enabled: bool,
    /// Wall-clock time of the decision, in milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// A uniformly random value supplied by the host, for jitter.
    pub random: u64,
}

/// What a dequeue task does after an empty get.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct IdleDecision {
    /// How long the task sleeps before its next get, in milliseconds.
    pub delay_ms: u64,
    /// True when this task must stop.
    pub stop: bool,
}
