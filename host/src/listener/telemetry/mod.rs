//! What the listener tells about itself: the counters behind `QueryState()` (`counters`,
//! and the handler calls of the concurrency window in `calls`), the status built from them
//! (`status`), the arrivals recorded for traces, and the rate limits on repeated log lines.

mod calls;
mod counters;
mod status;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::log_limit::LogLimiter;
use crate::queue::Transactions;
use crate::record::QueueRecording;

pub(in crate::listener) use calls::CallEnd;
pub(in crate::listener) use counters::{Counters, LastGet};
pub use status::{DEPTH_MAX_AGE, DeadLetterStatus, DecisionWithInputs, ListenerStatus, PoisonForm, PoisonRecord, RecordedDecision, TaskCountInputs};

/// Log lines per window for repeated failures (handler failures, failed gets, poisonings).
const FAILURE_LOG_LINES: u32 = 10;
const FAILURE_LOG_WINDOW: Duration = Duration::from_secs(60);

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
    transactions: Option<Arc<Transactions>>,
    /// When the depth was last counted (remote backends: each count is a billed call).
    pub(in crate::listener) depth_counted: Mutex<Option<tokio::time::Instant>>,
}

impl Telemetry {
    /// Counters from zero, arrivals recorded to `recording`, and `transactions` shown in the status.
    pub(in crate::listener) fn new(recording: Option<Arc<QueueRecording>>, transactions: Option<Arc<Transactions>>) -> Telemetry {
        Telemetry {
            counters: Counters::default(),
            failure_log: LogLimiter::new(FAILURE_LOG_LINES, FAILURE_LOG_WINDOW),
            poison_log: LogLimiter::new(FAILURE_LOG_LINES, FAILURE_LOG_WINDOW),
            storage_log: LogLimiter::new(FAILURE_LOG_LINES, FAILURE_LOG_WINDOW),
            recording,
            transactions,
            depth_counted: Mutex::new(None),
        }
    }
}
