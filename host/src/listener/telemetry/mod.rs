//! What the listener tells about itself: the counters behind `QueryState()` (`counters`,
//! and the handler calls of the concurrency window in `calls`), the status built from them
//! (`status`), the arrivals recorded for traces, and the rate limits on repeated log lines.

mod calls;
mod counters;
mod status;

use std::sync::{Arc, Mutex};

use crate::log_limit::LogLimiter;
use crate::queue::Transactions;
use crate::record::QueueRecording;

pub(in crate::listener) use calls::CallEnd;
pub(in crate::listener) use counters::{Counters, LastGet};
pub use status::{DEPTH_MAX_AGE, ListenerStatus, PoisonForm, RecordedDecision, TaskCountInputs};

/// The listener's counters, what it records, and its log limits.
pub(in crate::listener) struct Telemetry {
    pub(in crate::listener) counters: Counters,
    /// Handler failures and retries are logged at WARN, this many per window.
    pub(in crate::listener) failure_log: LogLimiter,
    /// Poisonings, likewise (each one's reason stays in the status and the metrics).
    pub(in crate::listener) poison_log: LogLimiter,
    /// Failed gets, likewise.
    pub(in crate::listener) storage_log: LogLimiter,
    /// Counts the messages gets see for the first time (arrivals, for `ebb trace export`).
    pub(in crate::listener) recording: Option<Arc<QueueRecording>>,
    /// Storage transactions shown in the status, if metered.
    pub(in crate::listener) transactions: Option<Arc<Transactions>>,
    /// When the depth was last counted (remote backends: each count is a billed call).
    pub(in crate::listener) depth_counted: Mutex<Option<tokio::time::Instant>>,
}
