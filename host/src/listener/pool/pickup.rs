//! Picking up notified work with the fewest gets, and never behind a handler.
//!
//! A notification that arrives while a get is in flight changes nothing: when the get
//! answers, what it did not cover gets one pickup. Otherwise the first notification claims
//! one get `max_pickup_delay` later and the notifications within that time ride along (once
//! they announce a batch of messages or more, the get is due at once: a full batch gains
//! nothing by waiting, and a dump of thousands would wait the delay for nothing): a
//! resting task is woken for it, or, when every task is busy with its handlers, a task is
//! started only while fewer run than the rule's latest count (or none runs: a push wakes a
//! queue at zero tasks). The rule's count is the bound: an app that needs faster pickup asks
//! its rule for more tasks. A task that drains the queue picks up what was notified meanwhile
//! and nobody claimed, before it rests.
//!
//! A task is *getting* from sending a get until it answers, and *resting* while it sleeps in
//! its back-off; the counts and the claim share one lock with the notifications, so none is
//! lost between a task's look and its rest.
//!
//! With push, a get that came back short of what it asked found the queue drained (SQS's
//! long poll asks every server), and whatever arrives later is notified: until the next
//! notification, another task's get could only come back empty, and is not sent
//! ([`TaskMark::queue_seen_drained`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use crate::listener::Shared;

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
pub(in crate::listener) struct Pickup {
    /// When the first notification not yet covered by a get arrived.
    pending_since: Option<Instant>,
    /// Tasks whose get is in flight.
    getting: u32,
    /// Tasks asleep in their back-off.
    resting: u32,
    claim: Claim,
    /// Notifications so far (a sequence number: no clock reading can order a notification
    /// and a get at one instant).
    notifications: u64,
    /// A get sent when `notifications` was this came back short of what it asked, and
    /// none came since it was sent: the queue was drained then.
    drained_at: Option<u64>,
    /// Messages the notifications not yet covered by a get announced (one for a
    /// notification that does not say).
    pending_messages: u64,
    /// Bumped at each timer claim: a timer whose pickup was made early does nothing.
    timer: u64,
}

impl Pickup {
    /// Tasks asleep in their back-off.
    pub(in crate::listener) fn resting(&self) -> u32 {
        self.resting
    }

    /// Claims the pickup for a timer: its number and when it is due.
    fn claim_timer(&mut self, since: Instant, shared: &Shared) -> (u64, Instant) {
        self.claim = Claim::Timer;
        self.timer = self.timer.wrapping_add(1);
        (self.timer, self.due(since, shared))
    }

    /// When the get for the pending notifications is due: `max_pickup_delay` after the first,
    /// or at once when they announced at least a batch (`batch_size`).
    fn due(&self, since: Instant, shared: &Shared) -> Instant {
        if self.pending_messages >= u64::from(shared.settings.batch_size.max(1)) {
            Instant::now().min(since + shared.settings.max_pickup_delay)
        } else {
            since + shared.settings.max_pickup_delay
        }
    }
}

/// What a task does once it has found the queue drained.
pub(in crate::listener) enum AfterDrained {
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
pub(in crate::listener) struct TaskMark<'a> {
    shared: &'a Shared,
    state: State,
    /// The task holds the pickup's claim (`Claim::Task`) until its next get starts.
    claimed: bool,
    /// `Pickup::notifications` when its latest get was sent.
    sent_after: u64,
}

impl<'a> TaskMark<'a> {
    pub(in crate::listener) fn new(shared: &'a Shared) -> TaskMark<'a> {
        TaskMark { shared, state: State::Other, claimed: false, sent_after: 0 }
    }

    /// Whether the task rests (a wake-up is for it).
    pub(in crate::listener) fn is_resting(&self) -> bool {
        self.state == State::Resting
    }

    /// Whether the task owes the pickup's get (a pickup made due early is for it).
    pub(in crate::listener) fn has_claim(&self) -> bool {
        self.claimed
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
    pub(in crate::listener) fn get_starts(&mut self) {
        let mut pickup = self.shared.pickup();
        self.leave(&mut pickup);
        pickup.getting += 1;
        self.state = State::Getting;
        self.sent_after = pickup.notifications;
        pickup.pending_since = None;
        pickup.pending_messages = 0;
        if pickup.claim == Claim::Task {
            pickup.claim = Claim::None;
        }
        self.claimed = false;
    }

    /// The get answered: notifications that came while it was in flight, and that no other
    /// get in flight can cover, get their pickup now (this task may be busy with its
    /// handlers for long).
    pub(in crate::listener) fn get_answered(&mut self, shared: &Arc<Shared>) {
        let mut pickup = self.shared.pickup();
        self.leave(&mut pickup);
        if pickup.getting == 0
            && pickup.claim == Claim::None
            && let Some(since) = pickup.pending_since
        {
            let (timer, due) = pickup.claim_timer(since, self.shared);
            drop(pickup);
            shared.schedule_pickup(timer, due);
        }
    }

    /// Its get came back short of what it asked: the queue was drained when storage looked,
    /// so (with push) until the next notification a get would find nothing.
    pub(in crate::listener) fn got_short(&self) {
        let mut pickup = self.shared.pickup();
        if pickup.notifications == self.sent_after {
            pickup.drained_at = Some(self.sent_after);
        }
    }

    /// With push, a get now could only come back empty: one came back short since the last
    /// notification (messages put since are notified; this host's own retries and delayed
    /// sends wake it as notifications do).
    pub(in crate::listener) fn queue_seen_drained(&self) -> bool {
        let pickup = self.shared.pickup();
        self.shared.push_enabled() && pickup.drained_at == Some(pickup.notifications)
    }

    /// Gives up the task's slot if there are more tasks than the rule's count (after a
    /// scale-down) and at least `keep` (1 after a full get: the backlog's size is not
    /// known), unless notifications wait that nobody will get for.
    pub(in crate::listener) fn try_retire(&mut self, keep: u32) -> bool {
        let mut pickup = self.shared.pickup();
        // This task claimed the pickup when it drained: it owes that get.
        if self.claimed || (pickup.pending_since.is_some() && pickup.claim == Claim::None && pickup.getting == 0) {
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
    pub(in crate::listener) fn after_drained(&mut self, rest: impl FnOnce() -> bool) -> AfterDrained {
        let mut pickup = self.shared.pickup();
        self.leave(&mut pickup);
        if let Some(since) = pickup.pending_since
            && pickup.claim == Claim::None
            && pickup.getting == 0
        {
            pickup.claim = Claim::Task;
            self.claimed = true;
            return AfterDrained::GetAt(pickup.due(since, self.shared));
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
        if self.state != State::Other || self.claimed {
            let mut pickup = self.shared.pickup();
            self.leave(&mut pickup);
            // Ended (stopping, a panic) owing the claimed get: the next notification may
            // claim it again (a panic's restart notifies).
            if self.claimed && pickup.claim == Claim::Task {
                pickup.claim = Claim::None;
            }
        }
    }
}

impl Shared {
    pub(in crate::listener) fn pickup(&self) -> std::sync::MutexGuard<'_, Pickup> {
        self.pool.pickup.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A notification of `messages` arrived messages (1 when the notifier does not say). A
    /// get in flight, or a pickup already claimed, will take them; otherwise one get is
    /// claimed `max_pickup_delay` after the first notification not yet covered. Once they
    /// announce a batch, a claimed pickup is made at once (see [`Pickup::due`]).
    pub(in crate::listener) fn notified(self: &Arc<Self>, messages: u64) {
        let mut pickup = self.pickup();
        pickup.notifications = pickup.notifications.wrapping_add(1);
        let batch = u64::from(self.settings.batch_size.max(1));
        let was_batch = pickup.pending_messages >= batch;
        pickup.pending_messages = pickup.pending_messages.saturating_add(messages.max(1));
        let since = *pickup.pending_since.get_or_insert_with(Instant::now);
        if pickup.getting > 0 || self.stopping.is_cancelled() {
            return;
        }
        match pickup.claim {
            Claim::None => {
                let (timer, due) = pickup.claim_timer(since, self);
                drop(pickup);
                self.schedule_pickup(timer, due);
            }
            // The claimed get is not due yet, but a batch now waits: make it now.
            Claim::Timer if !was_batch && pickup.pending_messages >= batch => {
                // The timer's own pickup, later, is then stale.
                pickup.timer = pickup.timer.wrapping_add(1);
                let timer = pickup.timer;
                drop(pickup);
                self.pick_up(timer);
            }
            Claim::Task if !was_batch && pickup.pending_messages >= batch => {
                drop(pickup);
                self.pool.pickup_due.notify_waiters();
            }
            Claim::Timer | Claim::Task => {}
        }
    }

    fn schedule_pickup(self: &Arc<Self>, timer: u64, due: Instant) {
        let shared = self.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(due) => shared.pick_up(timer),
                _ = shared.stopping.cancelled() => {}
            }
        });
    }

    /// The claimed pickup is due: a resting task gets, or, when none rests, a task starts
    /// while fewer run than the rule's latest count (or none runs). (A get sent meanwhile
    /// took the notifications with it; with the rule's count running and every task busy,
    /// the first to drain the queue picks them up.)
    fn pick_up(self: &Arc<Self>, timer: u64) {
        let mut pickup = self.pickup();
        if timer != pickup.timer {
            // Made early (a batch was announced); a later claim has a timer of its own.
            return;
        }
        if pickup.claim == Claim::Timer {
            pickup.claim = Claim::None;
        }
        if pickup.pending_since.is_none() || pickup.getting > 0 || self.stopping.is_cancelled() {
            return;
        }
        if pickup.resting > 0 {
            // A task between resting and its sleep keeps the permit and gets at once.
            self.pool.wake.notify_one();
        } else if self.started.load(Ordering::Acquire) {
            drop(pickup);
            // The rule's count bounds the tasks: a pickup starts one only below it (or when
            // none runs: a push must wake a queue at zero). Otherwise the notification stays
            // pending, and the first task to drain the queue gets for it.
            let cap = self.telemetry.counters.target_tasks.load(Ordering::Acquire).max(1);
            self.spawn_tasks(1, false, cap);
        }
    }
}
