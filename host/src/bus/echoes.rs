//! This host's own triggers, published and not yet heard back. The engine sends a publish to
//! every subscriber, the publisher's own included; but a host woke its own listeners when it
//! sent (saying how many messages arrived), so its echo, delivered as well, would announce
//! the same messages twice: a listener would think a batch waits when half of one does, and
//! get it without its pickup delay.
//!
//! An echo is recognised by its content: a trigger equal to one this host published within
//! [`ECHO_WINDOW`]. Another host's identical trigger arriving meanwhile may be taken for it
//! and the echo then delivered in its place: the same wake-up either way.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::Trigger;

/// How long a published trigger waits for its echo: past it the echo is taken for lost (the
/// subscription was down, or came up after the publish), and an equal trigger is another's.
const ECHO_WINDOW: Duration = Duration::from_secs(5);

/// The triggers this host published whose echo has not come back, oldest first.
#[derive(Default)]
pub(super) struct OwnTriggers {
    sent: Mutex<VecDeque<(Instant, Trigger)>>,
}

impl OwnTriggers {
    fn sent(&self) -> std::sync::MutexGuard<'_, VecDeque<(Instant, Trigger)>> {
        let mut sent = self.sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while sent.front().is_some_and(|(at, _)| at.elapsed() > ECHO_WINDOW) {
            sent.pop_front();
        }
        sent
    }

    /// `trigger` is about to be published (noted before, as its echo may come back before
    /// the publish's own answer).
    pub(super) fn publishing(&self, trigger: &Trigger) {
        self.sent().push_back((Instant::now(), trigger.clone()));
    }

    /// The publish of `trigger` failed: no echo will come.
    pub(super) fn not_published(&self, trigger: &Trigger) {
        let mut sent = self.sent();
        if let Some(index) = sent.iter().rposition(|(_, own)| own == trigger) {
            sent.remove(index);
        }
    }

    /// Whether `trigger`, just received, is the echo of one this host published (then it is
    /// no longer waited for).
    pub(super) fn is_echo(&self, trigger: &Trigger) -> bool {
        let mut sent = self.sent();
        match sent.iter().position(|(_, own)| own == trigger) {
            Some(index) => {
                sent.remove(index);
                true
            }
            None => false,
        }
    }

    /// The subscription was lost: what was published meanwhile never comes back.
    pub(super) fn forget(&self) {
        self.sent().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trigger(count: u64) -> Trigger {
        Trigger { queue: "orders".into(), count: Some(count), delay_ms: None }
    }

    #[tokio::test(start_paused = true)]
    async fn an_echo_is_recognised_once_and_only_within_its_window() {
        let own = OwnTriggers::default();
        own.publishing(&trigger(3));
        own.publishing(&trigger(3));
        assert!(!own.is_echo(&trigger(4)), "another host's trigger");
        assert!(own.is_echo(&trigger(3)));
        assert!(own.is_echo(&trigger(3)));
        assert!(!own.is_echo(&trigger(3)), "a third, equal trigger is another host's");
        own.publishing(&trigger(5));
        own.not_published(&trigger(5));
        assert!(!own.is_echo(&trigger(5)), "a failed publish has no echo");
        own.publishing(&trigger(6));
        tokio::time::advance(ECHO_WINDOW + Duration::from_millis(1)).await;
        assert!(!own.is_echo(&trigger(6)), "an echo that never came is forgotten");
    }
}
