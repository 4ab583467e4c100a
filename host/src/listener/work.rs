//! Work-detected events: a task finding messages, a push from outside, a hidden message
//! becoming visible again; whether pushes can reach the queue; and the safety poll that
//! looks at a push queue while no task runs.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument as _;

use super::Shared;

/// Most wake-ups waiting at once per queue (each one instant, a few dozen bytes). Past
/// this, a new wake-up rides with the next later one (or replaces the last): none is dropped,
/// some come late.
const MAX_WAKEUPS: usize = 65_536;
/// The grain wake-ups are coalesced at: a wake-up comes at most this late (then the pickup
/// waits its `max_pickup_delay`, as for any notification).
const WAKE_GRAIN: Duration = Duration::from_millis(25);

/// The instants the queue is to be woken at (hidden messages becoming visible), on a grid
/// of [`WAKE_GRAIN`]: the wake-ups within one step of each other are one. One timer task
/// sleeps until the earliest.
#[derive(Default)]
pub(super) struct Wakeups {
    at: BTreeSet<Instant>,
    /// The grid's origin (when the first wake-up was asked for: before every due time).
    origin: Option<Instant>,
    timer_running: bool,
}

impl Wakeups {
    /// Adds a wake-up at `due` or up to one `grain` after it; whether the timer must be told
    /// (the new one is the earliest).
    fn add(&mut self, now: Instant, due: Instant, grain: Duration) -> bool {
        let origin = *self.origin.get_or_insert(now);
        let steps = due.saturating_duration_since(origin).as_nanos().div_ceil(grain.as_nanos());
        let at = origin + grain.saturating_mul(u32::try_from(steps).unwrap_or(u32::MAX));
        if self.at.contains(&at) {
            return false;
        }
        if self.at.len() >= MAX_WAKEUPS {
            // Full: ride with the next later wake-up; past the last, move the last later.
            if self.at.range(at..).next().is_some() {
                return false;
            }
            self.at.pop_last();
        }
        self.at.insert(at);
        self.at.first() == Some(&at)
    }
}

/// Work-detected events and the wake-ups of hidden messages, and whether pushes reach the queue.
pub(super) struct Events {
    /// Raised by `work_detected`; the scaler coalesces raises.
    pub(super) work: Notify,
    /// Bumped by every work-detected event, for watchers outside (the KEDA scaler's
    /// `StreamIsActive`).
    pub(super) work_events: tokio::sync::watch::Sender<u64>,
    /// Wake-ups waiting for hidden messages to become visible (`wake_after`), and the
    /// news that an earlier one was added (the one timer re-arms).
    wakeups: Mutex<Wakeups>,
    wakeups_changed: Notify,
    /// Whether pushes can reach the queue now (false while the bus between hosts is down:
    /// then a `push` queue polls as a pull queue does).
    pub(super) push_available: AtomicBool,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            work: Notify::new(),
            work_events: tokio::sync::watch::Sender::new(0),
            wakeups: Mutex::default(),
            wakeups_changed: Notify::new(),
            push_available: AtomicBool::new(true),
        }
    }
}

impl Shared {
    /// A push: messages arrived from outside. A busy task picks them up; otherwise one get
    /// is scheduled after `max_pickup_delay`, which later notifications ride along with
    /// (see `pickup`). The scaler is not asked: a get that comes back full asks it.
    pub(super) fn work_detected(self: &Arc<Self>) {
        self.messages_arrived(1);
    }

    /// A push that says how many messages arrived: once a batch waits, its get is not
    /// delayed (see `pickup`).
    pub(super) fn messages_arrived(self: &Arc<Self>, messages: u64) {
        self.telemetry.counters.work_detected.fetch_add(1, Ordering::Relaxed);
        self.events.work_events.send_modify(|n| *n = n.wrapping_add(1));
        self.notified(messages);
    }

    /// A task found messages: ask the scaler, without waking idle tasks (the scaler wakes as
    /// many as the backlog needs; waking one per find would turn a trickle into empty gets).
    pub(super) fn work_found(&self) {
        self.telemetry.counters.work_detected.fetch_add(1, Ordering::Relaxed);
        self.events.work.notify_one();
        self.events.work_events.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// With push, a message this host hid (a retry delay, a delayed send) is visible again
    /// after `delay` and no notification will say so: wake the queue then (at most
    /// [`WAKE_GRAIN`] late), rather than at the next safety poll. Wake-ups are coalesced (see
    /// [`Wakeups`]); one timer task serves them all.
    pub(super) fn wake_after(self: &Arc<Self>, delay: Duration) {
        if !self.settings.push_enabled || self.stopping.is_cancelled() {
            return;
        }
        let now = Instant::now();
        let due = now + delay;
        let (earliest, start_timer) = {
            let mut wakeups = self.events.wakeups.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let earliest = wakeups.add(now, due, WAKE_GRAIN);
            (earliest, !std::mem::replace(&mut wakeups.timer_running, true))
        };
        if start_timer {
            let span = tracing::info_span!("wakeups", queue = %self.queue.name());
            self.tasks.spawn(self.clone().run_wakeups().instrument(span));
        } else if earliest {
            self.events.wakeups_changed.notify_one();
        }
    }

    /// The one timer: sleeps until the earliest wake-up, wakes the queue, and goes on to the
    /// next; re-armed when an earlier one is added; ends when the listener stops.
    async fn run_wakeups(self: Arc<Self>) {
        loop {
            let next = self.events.wakeups.lock().unwrap_or_else(std::sync::PoisonError::into_inner).at.first().copied();
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = sleep => {
                    let now = Instant::now();
                    let mut wakeups = self.events.wakeups.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    while wakeups.at.first().is_some_and(|at| *at <= now) {
                        wakeups.at.pop_first();
                    }
                    drop(wakeups);
                    self.work_detected();
                }
                () = self.events.wakeups_changed.notified() => {}
                () = self.stopping.cancelled() => return,
            }
        }
    }

    /// See [`super::Listener::set_push_available`]: losing push restores the polling floor.
    pub(super) fn set_push_available(self: &Arc<Self>, available: bool) {
        if self.events.push_available.swap(available, Ordering::AcqRel) == available || !self.settings.push_enabled {
            return;
        }
        // Before `start` (the bus says so as the listener is built) there is no floor to
        // restore: the queue may not exist yet, and `start` applies the floor itself.
        if !available && self.started.load(Ordering::Acquire) && !self.stopping.is_cancelled() {
            self.start_tasks_up_to(self.floor());
        }
    }

    pub(super) fn spawn_safety_poll(self: &Arc<Self>) {
        let shared = self.clone();
        let span = tracing::info_span!("safety_poll", queue = %self.queue.name());
        self.tasks.spawn(shared.run_safety_poll().instrument(span));
    }

    /// The safety poll (push mode): while no dequeue task runs, a probe task looks at the
    /// queue at start-up, again once the leases a host killed before this start held have
    /// run out (`lease_duration` later: a restart after a crash finds its own leased
    /// messages then, not a safety poll later), and then once per `safety_poll`.
    async fn run_safety_poll(self: Arc<Self>) {
        let mut after_leases = self.settings.lease_duration < self.settings.safety_poll;
        loop {
            if self.telemetry.counters.active_tasks.load(Ordering::Acquire) == 0 {
                self.telemetry.counters.safety_polls.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("safety poll: no task is running, looking at the queue once");
                self.spawn_tasks(1, true, 1);
            }
            let next = if std::mem::take(&mut after_leases) { self.settings.lease_duration } else { self.settings.safety_poll };
            tokio::select! {
                _ = tokio::time::sleep(next) => {}
                _ = self.stopping.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wake-ups within one grain are one, never earlier than due; past the bound none is
    /// dropped: a new one rides with a later one, or moves the last later.
    #[test]
    fn wakeups_coalesce_and_stay_bounded_without_dropping_any() {
        let grain = Duration::from_millis(500);
        let now = Instant::now();
        let mut w = Wakeups::default();
        assert!(w.add(now, now + Duration::from_millis(1200), grain));
        assert!(!w.add(now, now + Duration::from_millis(1400), grain), "same step: rides along");
        assert_eq!(w.at.iter().map(|at| *at - now).collect::<Vec<_>>(), [Duration::from_millis(1500)]);
        assert!(w.add(now, now + Duration::from_millis(300), grain), "earlier: the timer is told");
        assert!(!w.add(now, now + Duration::from_secs(9), grain));
        assert_eq!(w.at.len(), 3);
        let mut full = Wakeups::default();
        for i in 0..MAX_WAKEUPS as u64 + 10 {
            full.add(now, now + Duration::from_secs(2 * i + 1), grain);
        }
        assert_eq!(full.at.len(), MAX_WAKEUPS);
        let last = *full.at.last().unwrap() - now;
        assert!(last >= Duration::from_secs(2 * (MAX_WAKEUPS as u64 + 9) + 1), "the latest due is still woken: {last:?}");
    }
}
