//! When `ebb scaler` publishes a wake-up for a push queue on the bus. A message put straight
//! into storage (another program, the Azure SDK) tells no one: workers idle at zero tasks
//! would find it only at their safety poll, while the scaler's count sees it within a
//! second. The count cannot tell a message no worker was told of from a backlog the workers
//! are busy with, so the scaler publishes only where a wake-up may help:
//!
//! - the count is above zero and did not go down since the previous count (when it goes
//!   down, someone is taking messages); and
//! - no notification for the queue was heard (anyone's publish, a send or a notify through
//!   the scaler host, the scaler's own wake-up) within the hold: [`HOLD`] when the count
//!   went up (new messages), else [`HOLD`] doubled for each wake-up after the first since
//!   the count last went down, at most [`HOLD_MAX`] (a stuck backlog, messages in flight or hidden for a
//!   retry: waking the workers again does not help, so it is done ever more rarely).

use std::time::Duration;

use tokio::time::Instant;

/// The hold after a notification, and between wake-ups while new messages come.
pub const HOLD: Duration = Duration::from_secs(2);
/// The longest hold, while the count neither goes down nor up.
pub const HOLD_MAX: Duration = Duration::from_secs(60);

/// One queue's wake-up decisions, fed every count.
#[derive(Debug, Default)]
pub struct WakePolicy {
    previous_depth: u64,
    last_heard: Option<Instant>,
    /// Wake-ups published since the count last went down (or was 0).
    unanswered: u32,
}

impl WakePolicy {
    /// A notification for the queue was heard at `at`: workers were told.
    pub fn heard(&mut self, at: Instant) {
        self.last_heard = Some(at);
    }

    /// The count at `now` is `depth`: whether to publish a wake-up (if so, it counts as
    /// heard now).
    pub fn after_count(&mut self, depth: u64, now: Instant) -> bool {
        let previous = std::mem::replace(&mut self.previous_depth, depth);
        if depth == 0 || depth < previous {
            self.unanswered = 0;
            return false;
        }
        let hold = if depth > previous { HOLD } else { HOLD.saturating_mul(1 << self.unanswered.saturating_sub(1).min(16)).min(HOLD_MAX) };
        if self.last_heard.is_some_and(|at| now.duration_since(at) < hold) {
            return false;
        }
        self.unanswered = self.unanswered.saturating_add(1);
        self.last_heard = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts once a second from `start`, `depths` in turn; the seconds at which it publishes.
    fn publishes(policy: &mut WakePolicy, start: Instant, depths: &[u64]) -> Vec<u64> {
        let mut at = Vec::new();
        for (second, depth) in depths.iter().enumerate() {
            if policy.after_count(*depth, start + Duration::from_secs(second as u64)) {
                at.push(second as u64);
            }
        }
        at
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_no_one_was_told_of_is_woken_at_the_first_count() {
        let mut policy = WakePolicy::default();
        assert_eq!(publishes(&mut policy, Instant::now(), &[0, 0, 1, 0, 0]), [2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_backlog_going_down_is_never_woken() {
        let mut policy = WakePolicy::default();
        assert_eq!(publishes(&mut policy, Instant::now(), &[500, 480, 450, 449, 420, 100, 3, 0]), [0], "only the first count, which saw it appear");
    }

    #[tokio::test(start_paused = true)]
    async fn a_recent_notification_holds_the_wake_up_back_for_two_seconds() {
        let mut policy = WakePolicy::default();
        let start = Instant::now();
        policy.heard(start);
        assert_eq!(publishes(&mut policy, start, &[1, 1, 1, 1]), [2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stuck_count_is_woken_ever_more_rarely_up_to_once_a_minute() {
        let mut policy = WakePolicy::default();
        let at = publishes(&mut policy, Instant::now(), &[3; 400]);
        assert_eq!(&at[..7], [0, 2, 6, 14, 30, 62, 122]);
        assert!(at.windows(2).skip(6).all(|w| w[1] - w[0] == 60), "{at:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn new_messages_on_a_stuck_count_are_woken_within_two_seconds() {
        let mut policy = WakePolicy::default();
        let start = Instant::now();
        assert_eq!(publishes(&mut policy, start, &[3; 40]).len(), 5);
        let later = start + Duration::from_secs(40);
        assert_eq!(publishes(&mut policy, later, &[3, 4, 5, 6, 7, 8]), [1, 3, 5], "rising: every 2 s, not every count");
        // Taken: back to the shortest hold.
        let after = later + Duration::from_secs(6);
        assert_eq!(publishes(&mut policy, after, &[7, 7, 7, 7]), [1, 3]);
    }
}
