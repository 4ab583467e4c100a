//! The handler calls that ended in the concurrency decision's current window, by how each
//! ended: what the rule is told every window (see `pool::concurrency`).

use std::time::Duration;

/// How a handler call ended, as the concurrency decision counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::listener) enum CallEnd {
    Succeeded,
    /// An error, a timeout, an answer other than 2xx, 429 and 503; or the host could not
    /// make the call (the host is overloaded too: a reason to slow down).
    Failed,
    /// The app asked for a pause (HTTP 429 or 503).
    PushedBack,
}

/// The handler calls that ended in the current window.
#[derive(Debug, Clone, Copy, Default)]
pub(in crate::listener) struct CallWindow {
    pub(in crate::listener) completed: u32,
    pub(in crate::listener) failed: u32,
    pub(in crate::listener) pushed_back: u32,
    pub(in crate::listener) total_micros: u64,
    pub(in crate::listener) min_micros: Option<u64>,
    pub(in crate::listener) max_micros: u64,
}

impl CallWindow {
    pub(in crate::listener) fn record(&mut self, end: CallEnd, latency: Duration) {
        let micros = latency.as_micros().min(u64::MAX as u128) as u64;
        self.completed = self.completed.saturating_add(1);
        match end {
            CallEnd::Succeeded => {}
            CallEnd::Failed => self.failed = self.failed.saturating_add(1),
            CallEnd::PushedBack => self.pushed_back = self.pushed_back.saturating_add(1),
        }
        self.total_micros = self.total_micros.saturating_add(micros);
        self.min_micros = Some(self.min_micros.map_or(micros, |min| min.min(micros)));
        self.max_micros = self.max_micros.max(micros);
    }

    pub(in crate::listener) fn is_empty(&self) -> bool {
        self.completed == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_sums_its_calls_by_how_they_ended() {
        let mut window = CallWindow::default();
        assert!(window.is_empty());
        window.record(CallEnd::Succeeded, Duration::from_millis(10));
        window.record(CallEnd::Failed, Duration::from_millis(30));
        window.record(CallEnd::PushedBack, Duration::from_millis(2));
        assert_eq!((window.completed, window.failed, window.pushed_back), (3, 1, 1));
        assert_eq!((window.min_micros, window.max_micros, window.total_micros), (Some(2_000), 30_000, 42_000));
        window.record(CallEnd::Succeeded, Duration::MAX);
        assert_eq!(window.max_micros, u64::MAX, "an absurd latency saturates");
        assert_eq!(window.total_micros, u64::MAX);
    }
}
