//! Rate limits for log lines that a fault can repeat (a failing handler, a broken rule
//! file), so one bad input cannot flood the log: the first lines of a window are logged,
//! the rest counted and reported with the next line that is.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Lets at most `per_window` events through per `window`.
#[derive(Debug)]
pub struct LogLimiter {
    per_window: u32,
    window: Duration,
    state: Mutex<Option<WindowState>>,
}

#[derive(Debug)]
struct WindowState {
    started: Instant,
    allowed: u32,
    suppressed: u64,
}

impl LogLimiter {
    /// A limiter letting `per_window` events through every `window`.
    pub const fn new(per_window: u32, window: Duration) -> Self {
        LogLimiter { per_window, window, state: Mutex::new(None) }
    }

    /// `Some(suppressed)` when this event may be logged, with the number of events
    /// suppressed since the last one that was; `None` when it must be only counted.
    pub fn allow(&self) -> Option<u64> {
        let now = Instant::now();
        let mut guard = self.state.lock().unwrap();
        let state = guard.get_or_insert(WindowState { started: now, allowed: 0, suppressed: 0 });
        if now.duration_since(state.started) >= self.window {
            state.started = now;
            state.allowed = 0;
        }
        if state.allowed < self.per_window {
            state.allowed += 1;
            Some(std::mem::take(&mut state.suppressed))
        } else {
            state.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn lets_a_few_through_per_window_and_reports_the_rest() {
        let limiter = LogLimiter::new(2, Duration::from_secs(10));
        assert_eq!(limiter.allow(), Some(0));
        assert_eq!(limiter.allow(), Some(0));
        assert_eq!(limiter.allow(), None);
        assert_eq!(limiter.allow(), None);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(limiter.allow(), Some(2), "the next line reports what was suppressed");
        assert_eq!(limiter.allow(), Some(0));
        assert_eq!(limiter.allow(), None);
    }
}
