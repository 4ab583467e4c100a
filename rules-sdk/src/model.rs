//! The decision contexts, as plain Rust values (the WIT records of `ebb:rules/decisions@0.4.0`
//! and `ebb:rules/failures@0.4.0`).

/// Where [`QueueState::approximate_depth`] comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum DepthSource {
    /// Counted by storage for this decision (a count call).
    #[default]
    Measured,
    /// The host's estimate, without a count for this decision: the last count made (when
    /// this one failed or was not made), or what gets and arrivals tell.
    Inferred,
}

/// What a listener knows about one queue when work is detected.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct QueueState {
    /// The queue's name, as in the host configuration.
    pub queue: String,
    /// Approximate number of messages in the queue (visible and leased); see
    /// [`QueueState::depth_source`].
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
    /// Messages the last get of this queue on this host returned (0 when it found the
    /// queue empty, or before the first get). Fewer than [`QueueState::batch_size`] means
    /// that get emptied what was visible. (Since contract 0.2.0.)
    pub last_get_messages: u32,
    /// Messages each get asks for (the queue's `batch_size`, 1 to 32). (Since 0.2.0.)
    pub batch_size: u32,
    /// Messages arriving per second as this host sees them, over the last 10 seconds: each
    /// put through this host and each notification made to it (its API's notify) counts
    /// one. Puts by other programs or hosts that do not notify this host are not seen.
    /// (Since 0.2.0.)
    pub arrivals_per_sec: f64,
    /// How long the oldest message of the last get had waited in the queue when that get
    /// returned it, in milliseconds; `None` when the last get returned nothing or storage
    /// does not tell. (Since 0.2.0.)
    pub oldest_message_age_ms: Option<u64>,
    /// Whether [`QueueState::approximate_depth`] was counted for this decision or
    /// inferred. (Since 0.2.0.)
    pub depth_source: DepthSource,
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

/// What a listener knows about its handler calls, for the concurrency decision (since
/// contract 0.3.0). The figures cover the window that just ended: the calls that ended in
/// it, whatever their outcome.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct HandlerState {
    /// The queue's name, as in the host configuration.
    pub queue: String,
    /// Handler calls allowed at once now (the last decision, or `max_limit`).
    pub current_limit: u32,
    /// The queue's `max_concurrent_calls`: the host clamps the decision to `[1, max_limit]`.
    pub max_limit: u32,
    /// Handler calls running now.
    pub in_flight: u32,
    /// Most handler calls running at once during the window.
    pub peak_in_flight: u32,
    /// Dequeue tasks waiting now for a free handler slot (demand beyond the limit).
    pub waiting_tasks: u32,
    /// The window's length, in milliseconds.
    pub window_ms: u64,
    /// Handler calls that ended in the window (every outcome).
    pub completed: u32,
    /// Of those, calls that failed (an error, a timeout, an answer other than 2xx, 429 and 503).
    pub failed: u32,
    /// Of those, calls the app pushed back (HTTP 429 or 503).
    pub pushed_back: u32,
    /// Mean latency of the calls that ended in the window, in milliseconds (0 when none).
    pub latency_mean_ms: f64,
    /// Shortest of them, in milliseconds (0 when none).
    pub latency_min_ms: f64,
    /// Longest of them, in milliseconds (0 when none).
    pub latency_max_ms: f64,
    /// Wall-clock time of the decision, in milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// A uniformly random value supplied by the host, for jitter.
    pub random: u64,
}

/// How a handler call failed (`error-class` of `ebb:rules/failures@0.4.0`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum ErrorClass {
    /// The handler did not answer within the queue's handler timeout.
    Timeout,
    /// The handler could not be reached (connection refused, reset, DNS).
    Connect,
    /// The handler answered with a status other than 2xx, 429 and 503 (see
    /// [`FailureContext::http_status`]).
    HttpStatus,
    /// The handler (a Rust handler embedded in the host) panicked.
    Panic,
    /// Anything else: a handler's own error, an answer that could not be read.
    #[default]
    Other,
}

/// What the host knows about one failed delivery, of a message or of one item of an
/// envelope (then the counts are the item's own). Pushed-back calls (HTTP 429 and 503) and
/// calls the host itself could not make are never given to a rule. (Since contract 0.4.0.)
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct FailureContext {
    /// The queue's name, as in the host configuration.
    pub queue: String,
    /// Deliveries of this message (or item) so far, this one included: 1 on the first failure.
    pub dequeue_count: u32,
    /// The queue's `max_dequeue_count`: the default poisons once `dequeue_count` reaches it.
    pub max_dequeue_count: u32,
    /// How the call failed.
    pub error_class: ErrorClass,
    /// The handler's HTTP status, when it answered one.
    pub http_status: Option<u16>,
    /// The error, in words, at most [`MAX_FAILURE_TEXT_BYTES`] bytes.
    pub error: String,
    /// For an item of an envelope: its index; `None` for a plain message.
    pub item: Option<u32>,
    /// Time since the message was put on the queue, in milliseconds.
    pub elapsed_ms: u64,
    /// How long the failed handler call took, in milliseconds.
    pub handler_latency_ms: u64,
    /// The delay the host would retry after by default, in milliseconds.
    pub default_retry_delay_ms: u64,
    /// The queue's `max_retry_delay`, in milliseconds: a retry's delay is clamped to it.
    pub max_retry_delay_ms: u64,
    /// Wall-clock time of the decision, in milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// A uniformly random value supplied by the host, for jitter.
    pub random: u64,
}

/// The longest error text a [`FailureContext`] carries and the longest poison reason the
/// host keeps, in bytes.
pub const MAX_FAILURE_TEXT_BYTES: usize = 1024;

/// What happens to a message whose handler failed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum FailureDecision {
    /// Deliver it again after this many milliseconds (clamped to
    /// `[0, max_retry_delay_ms]`); honoured past `max_dequeue_count`, up to the host's
    /// ceiling of 1000 deliveries.
    Retry(u64),
    /// Move it to the poison queue now, with this reason.
    Poison(String),
    /// The host's own handling: retry after `default_retry_delay_ms`, poison once
    /// `dequeue_count` reaches `max_dequeue_count`.
    #[default]
    Default,
}
