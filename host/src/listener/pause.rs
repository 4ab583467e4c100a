//! Pausing a queue: no get is made while it is paused; calls that run finish and their
//! messages are settled as usual, so nothing is lost. A pause may end by itself at a given
//! time. Tasks stay (and keep their place) but wait; the service persists pauses across
//! restarts (see `service::pauses`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Listener, Shared};

/// A pause: since when, and until when (`None`: until resumed). Times in milliseconds
/// since the Unix epoch, by the listener's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// When the pause began.
    pub since_ms: u64,
    /// When it ends by itself; `None`: it holds until the queue is resumed.
    pub until_ms: Option<u64>,
}

impl Pause {
    /// A pause from `now_ms`, for `length` (saturating) or until resumed.
    pub fn from_now(now_ms: u64, length: Option<Duration>) -> Pause {
        Pause { since_ms: now_ms, until_ms: length.map(|d| now_ms.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))) }
    }

    /// Whether the pause still holds at `now_ms`.
    pub fn holds_at(&self, now_ms: u64) -> bool {
        self.until_ms.is_none_or(|until| now_ms < until)
    }
}

impl Listener {
    /// Pauses the queue (`Some`) or resumes it (`None`). A pause already over by the
    /// listener's clock changes nothing.
    pub fn set_pause(&self, pause: Option<Pause>) {
        self.shared.paused.send_replace(pause);
    }

    /// The pause that holds now, if any.
    pub fn pause(&self) -> Option<Pause> {
        self.shared.current_pause()
    }
}

impl Shared {
    pub(super) fn current_pause(&self) -> Option<Pause> {
        let now = self.rule.clock.now_ms();
        (*self.paused.borrow()).filter(|pause| pause.holds_at(now))
    }

    /// Returns at once unless the queue is paused; else when it is resumed, its pause ends,
    /// or the listener stops (then `false`).
    pub(super) async fn wait_while_paused(&self) -> bool {
        // Before every get: the usual answer, not paused, without subscribing.
        if self.current_pause().is_none() {
            return true;
        }
        let mut changes = self.paused.subscribe();
        loop {
            let Some(pause) = self.current_pause() else { return true };
            let ends = pause.until_ms.map(|until| Duration::from_millis(until.saturating_sub(self.rule.clock.now_ms())));
            tokio::select! {
                _ = changes.changed() => {}
                () = async {
                    match ends {
                        Some(left) => tokio::time::sleep(left).await,
                        None => std::future::pending().await,
                    }
                } => {}
                () = self.stopping.cancelled() => return false,
            }
        }
    }
}
