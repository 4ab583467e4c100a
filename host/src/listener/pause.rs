//! Pausing a queue: no get is made while it is paused; calls that run finish and their
//! messages are settled as usual, so nothing is lost. A pause may end by itself at a given
//! time. Tasks stay (and keep their place) but wait; the service persists pauses across
//! restarts (see `service::pauses`). A get already waiting on the service (long polling)
//! when the pause comes may still answer with messages: they are released, not handled.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Listener, Shared};
use crate::queue::Message;

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

    /// Makes what a get brought back after the queue was paused (a long poll that answered
    /// during the pause) visible again at once, so it is handled at the resume, here or
    /// elsewhere, rather than when its lease runs out. Each release is one more receive on
    /// the message's dequeue count, as a release at shutdown is.
    pub(super) async fn release_got_while_paused(&self, messages: Vec<Message>) {
        tracing::info!(messages = messages.len(), "paused while a get waited: releasing what it brought, unhandled");
        let releases = messages.iter().map(|message| self.queue.update_visibility(&message.id, &message.pop_receipt, Duration::ZERO));
        for (message, released) in messages.iter().zip(futures::future::join_all(releases).await) {
            if let Err(error) = released {
                tracing::warn!(id = %message.id, "could not release (visible again when its lease runs out): {error}");
            }
        }
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
