//! Picking up notified work with the fewest gets: notifications that arrive while a task is
//! getting or processing change nothing (that task looks again before it rests); while
//! every task rests (or none runs), the first notification schedules one get
//! `max_pickup_delay` later and the ones after it within that time ride along.
//!
//! A task is *busy* from the moment it sends a get until it rests (sleeps or stops). A
//! notification seen by a busy task is its to pick up: before resting, it looks at
//! [`Pickup::pending_since`] under the same lock the notifications take, so none is lost
//! between the two.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::Shared;

/// What the queue's tasks and its notifications share, under one lock.
#[derive(Debug, Default)]
pub(super) struct Pickup {
    /// When the first notification not yet covered by a get arrived.
    pub pending_since: Option<Instant>,
    /// Tasks between sending a get and resting.
    pub busy: u32,
    /// A pickup is scheduled (a timer that wakes or starts a task).
    pub scheduled: bool,
}

/// What a task does once it has found the queue drained.
pub(super) enum AfterDrained {
    /// Notifications arrived since its get was sent: get again at this time (the first of
    /// them plus `max_pickup_delay`), to take them in one get.
    GetAt(Instant),
    /// Nothing arrived: rest as the rule says.
    Rest,
}

/// A task's mark in [`Pickup::busy`], taken off when the task rests or ends however it
/// ends (a panic included).
pub(super) struct Busy<'a> {
    shared: &'a Shared,
    on: bool,
}

impl<'a> Busy<'a> {
    pub(super) fn new(shared: &'a Shared) -> Busy<'a> {
        Busy { shared, on: false }
    }

    /// Whether the task is busy now.
    pub(super) fn is_on(&self) -> bool {
        self.on
    }

    /// The task is about to send a get: it is busy, and the get covers every notification
    /// so far.
    pub(super) fn get_starts(&mut self) {
        let mut pickup = self.shared.pickup();
        pickup.pending_since = None;
        if !self.on {
            pickup.busy += 1;
            self.on = true;
        }
    }

    /// Gives up the task's slot if there are more tasks than the rule's count (after a
    /// scale-down), unless it is the one busy task while notifications wait for a get.
    pub(super) fn try_retire(&mut self) -> bool {
        let mut pickup = self.shared.pickup();
        if pickup.pending_since.is_some() && pickup.busy <= u32::from(self.on) {
            return false;
        }
        if !self.shared.try_retire() {
            return false;
        }
        if self.on {
            pickup.busy -= 1;
            self.on = false;
        }
        true
    }

    /// The task found the queue drained (an empty get, or fewer messages than it asked for,
    /// now processed): it picks up what was notified meanwhile, or rests (`rest` runs under
    /// the lock: it gives the task's slot back if it stops).
    pub(super) fn after_drained(&mut self, rest: impl FnOnce()) -> AfterDrained {
        let mut pickup = self.shared.pickup();
        if let Some(since) = pickup.pending_since {
            return AfterDrained::GetAt(since + self.shared.settings.max_pickup_delay);
        }
        if self.on {
            pickup.busy -= 1;
            self.on = false;
        }
        rest();
        AfterDrained::Rest
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if self.on {
            self.shared.pickup().busy -= 1;
        }
    }
}

impl Shared {
    pub(super) fn pickup(&self) -> std::sync::MutexGuard<'_, Pickup> {
        self.pickup.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A notification: messages arrived. A busy task will take them; otherwise one get is
    /// scheduled `max_pickup_delay` after the first notification not yet covered.
    pub(super) fn notified(self: &Arc<Self>) {
        let mut pickup = self.pickup();
        let since = *pickup.pending_since.get_or_insert_with(Instant::now);
        if pickup.busy > 0 || pickup.scheduled || self.stopping.is_cancelled() {
            return;
        }
        pickup.scheduled = true;
        drop(pickup);
        let shared = self.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(since + shared.settings.max_pickup_delay) => shared.pick_up(),
                _ = shared.stopping.cancelled() => {}
            }
        });
    }

    /// The scheduled pickup is due: a resting task gets, or one starts when none runs. (A
    /// task that got meanwhile took the notifications with it.)
    fn pick_up(self: &Arc<Self>) {
        let mut pickup = self.pickup();
        pickup.scheduled = false;
        if pickup.pending_since.is_none() || pickup.busy > 0 || self.stopping.is_cancelled() {
            return;
        }
        if self.counters.active_tasks.load(Ordering::Acquire) == 0 {
            drop(pickup);
            if self.started.load(Ordering::Acquire) {
                self.start_tasks(1);
            }
        } else {
            // Every task rests: wake one (a task between resting and its sleep keeps the
            // permit and gets at once).
            self.wake.notify_one();
        }
    }
}
