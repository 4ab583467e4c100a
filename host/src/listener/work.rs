//! Work-detected events: a task finding messages, a push from outside, a hidden message
//! becoming visible again; whether pushes can reach the queue; and the safety poll that
//! looks at a push queue while no task runs.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::Instrument as _;

use super::Shared;

/// Most wake-ups waiting at once per queue.
const MAX_WAKE_TIMERS: u32 = 1024;

impl Shared {
    /// A push: messages arrived from outside. A busy task picks them up; otherwise one get
    /// is scheduled after `max_pickup_delay`, which later notifications ride along with
    /// (see `pickup`). The scaler is not asked: a get that comes back full asks it.
    pub(super) fn work_detected(self: &Arc<Self>) {
        self.counters.work_detected.fetch_add(1, Ordering::Relaxed);
        self.work_events.send_modify(|n| *n = n.wrapping_add(1));
        self.notified();
    }

    /// A task found messages: ask the scaler, without waking idle tasks (the scaler wakes as
    /// many as the backlog needs; waking one per find would turn a trickle into empty gets).
    pub(super) fn work_found(&self) {
        self.counters.work_detected.fetch_add(1, Ordering::Relaxed);
        self.work.notify_one();
        self.work_events.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// With push, a message this host hid (a retry delay, a delayed send) is visible again
    /// after `delay` and no notification will say so: wake the queue then, rather than at
    /// the next safety poll. At most [`MAX_WAKE_TIMERS`] wait at once; past that, the
    /// safety poll finds the rest.
    pub(super) fn wake_after(self: &Arc<Self>, delay: Duration) {
        if !self.settings.push_enabled || self.stopping.is_cancelled() {
            return;
        }
        let reserved = self.wake_timers.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < MAX_WAKE_TIMERS).then_some(n + 1));
        if reserved.is_err() {
            return;
        }
        let shared = self.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(delay) => shared.work_detected(),
                _ = shared.stopping.cancelled() => {}
            }
            shared.wake_timers.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// See [`super::Listener::set_push_available`]: losing push restores the polling floor.
    pub(super) fn set_push_available(self: &Arc<Self>, available: bool) {
        if self.push_available.swap(available, Ordering::AcqRel) == available || !self.settings.push_enabled {
            return;
        }
        if !available && !self.stopping.is_cancelled() {
            let active = self.counters.active_tasks.load(Ordering::Acquire);
            self.start_tasks(self.floor().saturating_sub(active));
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
            if self.counters.active_tasks.load(Ordering::Acquire) == 0 {
                self.counters.safety_polls.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("safety poll: no task is running, looking at the queue once");
                self.spawn_tasks(1, true);
            }
            let next = if std::mem::take(&mut after_leases) { self.settings.lease_duration } else { self.settings.safety_poll };
            tokio::select! {
                _ = tokio::time::sleep(next) => {}
                _ = self.stopping.cancelled() => return,
            }
        }
    }
}
