//! Wall-clock time for visibility timeouts, swappable for tokio's (pausable) clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, as the queue sees them.
pub trait Clock: Send + Sync + 'static {
    /// Now, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
    }
}

/// Wall-clock time that advances with tokio's clock, so a paused test or a simulation
/// moves message visibility forward with `tokio::time::advance`.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    start_ms: u64,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// Starts at the current system time.
    pub fn new() -> Self {
        TokioClock { start_ms: SystemClock.now_ms(), start: tokio::time::Instant::now() }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.start_ms + self.start.elapsed().as_millis() as u64
    }
}

/// Converts queue milliseconds back into a `SystemTime`.
pub(crate) fn system_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}
