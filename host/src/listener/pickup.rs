//! Picking up notified work with the fewest gets, and never behind a handler.
//!
//! A notification that arrives while a get is in flight changes nothing: when the get
//! answers, what it did not cover gets one pickup. Otherwise the first notification claims
//! one get `max_pickup_delay` later and the notifications within that time ride along: a
//! resting task is woken for it, or a task is started (up to `max_tasks`) when every task is
//! busy with its handlers or none runs. A task that drains the queue picks up what was
//! notified meanwhile and nobody claimed, before it rests.
//!
//! A task is *getting* from sending a get until it answers, and *resting* while it sleeps in
//! its back-off; the counts and the claim share one lock with the notifications, so none is
//! lost between a task's look and its rest.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::Shared;

/// Who will make the get that covers the pending notifications.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// Nobody yet.
    #[default]
    None,
    /// A timer, `max_pickup_delay` after the first of them.
    Timer,
    /// A task that drained the queue, at the same time.
    Task,
}

/// What the queue's tasks and its notifications share, under one lock.
#[derive(Debug, Default)]
pub(super) struct Pickup {
    /// When the first notification not yet covered by a get arrived.
    pending_since: Option<Instant>,
    /// Tasks whose get is in flight.
    getting: u32,
    /// Tasks asleep in their back-off.
    resting: u32,
    claim: Claim,
}

impl Pickup {
    /// Tasks asleep in their back-off.
    pub(super) fn resting(&self) -> u32 {
        self.resting
    }
}

/// What a task does once it has found the queue drained.
pub(super) enum AfterDrained {
    /// Notifications arrived since its get was sent and nobody else will get for them: get
    /// again at this time (the first of them plus `max_pickup_delay`), to take them in one get.
    GetAt(Instant),
    /// Rest as the rule says.
    Rest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Other,
    Getting,
    Resting,
}

/// A task's place in [`Pickup`]'s counts, taken off when the task ends however it ends (a
/// panic included).
pub(super) struct TaskMark<'a> {
    shared: &'a Shared,
    state: State,
}

impl<'a> TaskMark<'a> {
    pub(super) fn new(shared: &'a Shared) -> TaskMark<'a> {
        TaskMark { shared, state: State::Other }
    }

    /// Whether the task rests (a wake-up is for it).
    pub(super) fn is_resting(&self) -> bool {
        self.state == State::Resting
    }

    fn leave(&mut self, pickup: &mut Pickup) {
        match self.state {
            State::Getting => pickup.getting -= 1,
            State::Resting => pickup.resting -= 1,
            State::Other => {}
        }
        self.state = State::Other;
    }

    /// The task is about to send a get: it covers every notification so far.
    pub(super) fn get_starts(&mut self) {
        let mut pickup = self.shared.pickup();
        self.leave(&mut pickup);
        pickup.getting += 1;
        self.state = State::Getting;
        pickup.pending_since = None;
        if pickup.claim == Claim::Task {
            pickup.claim = Claim::None;
        }
    }

    /// The get answered: notifications that came while it was in flight, and that no other
    /// get in flight can cover, get their pickup now (this task may be busy with its
    /// handlers for long).
    pub(super) fn get_answered(&mut self, shared: &Arc<Shared>) {
        let mut pickup = self.shared.pickup();
        self.leave(&mut pickup);
        if pickup.getting == 0
            && pickup.claim == Claim::None
            && let Some(since) = pickup.pending_since
        {
            pickup.claim = Claim::Timer;
            drop(pickup);
            shared.schedule_pickup(since);
        }
    }

    /// Gives up the task's slot if there are more tasks than the rule's count (after a
    /// scale-down) and at least `keep` (1 after a full get: the backlog's size is not
    /// known), unless notifications wait that nobody will get for.
    pub(super) fn try_retire(&mut self, keep: u32) -> bool {
        let mut pickup = self.shared.pickup();
        if pickup.pending_since.is_some() && pickup.claim == Claim::None && pickup.getting == 0 {
            return false;
        }
        if !self.shared.try_retire(keep) {
            return false;
        }
        self.leave(&mut pickup);
        true
    }

    /// The task found the queue drained (an empty get, or fewer messages than it asked for,
    /// now processed): it picks up what was notified meanwhile if nobody else will, or rests
    /// (`rest` runs under the lock: it gives the task's slot back if it stops).
    pub(super) fn after_drained(&mut self, rest: impl FnOnce() -> bool) -> AfterDrained {
        let mut pickup = self.shared.pickup();
        self.leave(&mut pickup);
        if let Some(since) = pickup.pending_since
            && pickup.claim == Claim::None
            && pickup.getting == 0
        {
            pickup.claim = Claim::Task;
            return AfterDrained::GetAt(since + self.shared.settings.max_pickup_delay);
        }
        if !rest() {
            pickup.resting += 1;
            self.state = State::Resting;
        }
        AfterDrained::Rest
    }
}

impl Drop for TaskMark<'_> {
    fn drop(&mut self) {
        if self.state != State::Other {
            let mut pickup = self.shared.pickup();
            self.leave(&mut pickup);
        }
    }
}

impl Shared {
    pub(super) fn pickup(&self) -> std::sync::MutexGuard<'_, Pickup> {
        self.pickup.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A notification: messages arrived. A get in flight, or a pickup already claimed, will
    /// take them; otherwise one get is claimed `max_pickup_delay` after the first
    /// notification not yet covered.
    pub(super) fn notified(self: &Arc<Self>) {
        let mut pickup = self.pickup();
        let since = *pickup.pending_since.get_or_insert_with(Instant::now);
        if pickup.getting > 0 || pickup.claim != Claim::None || self.stopping.is_cancelled() {
            return;
        }
        pickup.claim = Claim::Timer;
        drop(pickup);
        self.schedule_pickup(since);
    }

    fn schedule_pickup(self: &Arc<Self>, since: Instant) {
        let shared = self.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(since + shared.settings.max_pickup_delay) => shared.pick_up(),
                _ = shared.stopping.cancelled() => {}
            }
        });
    }

    /// The claimed pickup is due: a resting task gets, or a task starts (up to `max_tasks`)
    /// when none rests. (A get sent meanwhile took the notifications with it; at
    /// `max_tasks` with every task busy, the first to drain the queue picks them up.)
    fn pick_up(self: &Arc<Self>) {
        let mut pickup = self.pickup();
        if pickup.claim == Claim::Timer {
            pickup.claim = Claim::None;
        }
        if pickup.pending_since.is_none() || pickup.getting > 0 || self.stopping.is_cancelled() {
            return;
        }
        if pickup.resting > 0 {
            // A task between resting and its sleep keeps the permit and gets at once.
            self.wake.notify_one();
        } else if self.started.load(Ordering::Acquire) && self.counters.active_tasks.load(Ordering::Acquire) < self.settings.max_tasks {
            drop(pickup);
            self.start_tasks(1);
        }
    }
}
