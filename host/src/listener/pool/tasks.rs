//! The dequeue task loop: get a batch, process it or back off as the rule says, and retire
//! when there are more tasks than the rule's count. Each task holds a slot in
//! `active_tasks`, so concurrent starts never exceed their cap (the rule's count, or
//! `max_tasks`).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt as _;
use tracing::Instrument as _;

use crate::panics::panic_message;
use crate::queue::{Message, QueueError, RetryPolicy};

use super::permits::PermitGrant;
use super::pickup::{AfterDrained, TaskMark};
use crate::listener::Shared;
use crate::listener::telemetry::Counters;

/// A dequeue task's place in `active_tasks`, given back when the task ends however it
/// ends (a panic included), unless the task gave it back itself when it retired.
struct ActiveTaskGuard<'a> {
    counters: &'a Counters,
    held: bool,
}

impl ActiveTaskGuard<'_> {
    fn given_back(mut self) {
        self.held = false;
    }
}

impl Drop for ActiveTaskGuard<'_> {
    fn drop(&mut self) {
        if self.held {
            self.counters.active_tasks.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// What a task does after a round.
enum Step {
    /// Goes on to its next round.
    Go,
    /// The listener stops: the task ends, its slot given back as it goes.
    Stop,
    /// The task gave its slot back itself (it retired or stopped idle): it ends.
    Retired,
}

/// A dequeue task's own state from one get to the next.
struct TaskLoop {
    /// A probe stops at its first empty get (when the floor allows).
    probe: bool,
    /// Empty looks in a row.
    idle_count: u32,
    consecutive_errors: u32,
    /// After a full get the backlog's size is unknown: this task keeps going whatever a
    /// count made before it said.
    last_get_full: bool,
    /// How long the next get waits on the service for a first message: the part of the
    /// rule's idle delay the queue can spend there (long polling), zero otherwise.
    server_wait: Duration,
    /// The last get's answer was the whole queue's: on a backend that long-polls, only a
    /// get that waited asks every server (an SQS short poll samples some).
    last_get_conclusive: bool,
}

/// With push, the least a get waits on a service that long-polls: a short poll may miss
/// messages the notification announced, and a get that waited tells whether the queue
/// was drained (see `pickup`). One request all the same; it answers at once when a message is there.
const PUSH_GET_WAIT: Duration = Duration::from_secs(1);

impl Shared {
    /// Fewest tasks: `min_tasks`, and at least one polling task unless pushes can wake the queue.
    pub(in crate::listener) fn floor(&self) -> u32 {
        if self.push_enabled() { self.settings.min_tasks } else { self.settings.min_tasks.max(1) }
    }

    /// Push is configured and can reach the queue now.
    pub(in crate::listener) fn push_enabled(&self) -> bool {
        self.settings.push_enabled && self.events.push_available.load(Ordering::Acquire)
    }

    /// `StartListener(n)`: `n` more tasks, never beyond `max_tasks`.
    pub(in crate::listener) fn start_tasks(self: &Arc<Self>, n: u32) {
        self.spawn_tasks(n, false, self.settings.max_tasks);
    }

    /// Starts tasks until `count` run (never beyond `max_tasks`).
    pub(in crate::listener) fn start_tasks_up_to(self: &Arc<Self>, count: u32) {
        let active = self.telemetry.counters.active_tasks.load(Ordering::Acquire);
        self.spawn_tasks(count.saturating_sub(active), false, count);
    }

    /// Starts up to `n` dequeue tasks, while fewer than `cap` (and `max_tasks`) run; a
    /// `probe` task stops at its first empty get (when the floor allows), so a safety poll
    /// of an empty queue costs one get.
    pub(in crate::listener) fn spawn_tasks(self: &Arc<Self>, n: u32, probe: bool, cap: u32) {
        let counters = &self.telemetry.counters;
        let cap = cap.min(self.settings.max_tasks);
        for _ in 0..n {
            // Reserve a slot first, so concurrent starts (the scaler's, a pickup's) never
            // exceed the cap.
            let reserved = counters.active_tasks.fetch_update(Ordering::AcqRel, Ordering::Acquire, |active| (active < cap).then_some(active + 1));
            let Ok(previous) = reserved else { return };
            counters.peak_tasks.fetch_max(previous + 1, Ordering::Relaxed);
            counters.recent_peak_tasks.fetch_max(previous + 1, Ordering::Relaxed);
            let task_number = counters.tasks_started.fetch_add(1, Ordering::Relaxed) + 1;
            let shared = self.clone();
            let span = tracing::info_span!("dequeue_task", queue = %self.queue.name(), task = task_number);
            self.tasks.spawn(
                async move {
                    if let Err(panic) = AssertUnwindSafe(shared.clone().run_task(probe)).catch_unwind().await {
                        // Its slot was given back as it unwound; keep the floor running, and
                        // look at the queue again: the get may have covered notifications
                        // it never delivered.
                        shared.task_panicked("a dequeue task", &*panic);
                        if !shared.stopping.is_cancelled() {
                            shared.start_tasks_up_to(shared.floor());
                            shared.notified(1);
                        }
                    }
                }
                .instrument(span),
            );
        }
    }

    /// Surfaces a panic that escaped a task (as Vector re-raises task panics): counted in
    /// the status and logged at ERROR.
    pub(in crate::listener) fn task_panicked(&self, task: &str, panic: &(dyn std::any::Any + Send)) {
        self.telemetry.counters.task_panics.fetch_add(1, Ordering::Relaxed);
        tracing::error!("{task} panicked and was restarted: {}", panic_message(panic));
    }

    /// Gives up this task's slot if there are more tasks than the target (after a
    /// scale-down) and than `keep`.
    pub(in crate::listener) fn try_retire(&self, keep: u32) -> bool {
        let target = self.telemetry.counters.target_tasks.load(Ordering::Relaxed).max(self.floor()).max(keep);
        self.telemetry.counters.active_tasks.fetch_update(Ordering::AcqRel, Ordering::Acquire, |active| (active > target).then(|| active - 1)).is_ok()
    }

    /// Gives up this task's slot when the rule says an idle task stops, keeping the floor
    /// (one polling task in pull mode).
    fn try_stop_idle(&self) -> bool {
        let floor = self.floor();
        self.telemetry.counters.active_tasks.fetch_update(Ordering::AcqRel, Ordering::Acquire, |active| (active > floor).then(|| active - 1)).is_ok()
    }

    async fn run_task(self: Arc<Self>, probe: bool) {
        let slot = ActiveTaskGuard { counters: &self.telemetry.counters, held: true };
        // This task's place among the getting and resting tasks (see `pickup`).
        let mut mark = TaskMark::new(&self);
        let mut task = TaskLoop { probe, idle_count: 0, consecutive_errors: 0, last_get_full: false, server_wait: Duration::ZERO, last_get_conclusive: false };
        loop {
            match self.task_round(&mut task, &mut mark).await {
                Step::Go => {}
                Step::Stop => break,
                Step::Retired => {
                    slot.given_back();
                    return;
                }
            }
        }
        drop(mark);
        drop(slot);
    }

    /// One round of a task: wait for handler slots, get, then process what came or back off.
    async fn task_round(self: &Arc<Self>, task: &mut TaskLoop, mark: &mut TaskMark<'_>) -> Step {
        if self.stopping.is_cancelled() || !self.wait_while_paused().await {
            return Step::Stop;
        }
        // A probe looks once before anything else (the target may be zero tasks).
        if !task.probe && mark.try_retire(u32::from(task.last_get_full)) {
            tracing::debug!("retiring: more tasks than the rule's count");
            return Step::Retired;
        }
        if !task.probe && mark.queue_seen_drained() {
            // The get would come back empty (see `pickup`): the rule hears of an empty look
            // all the same, without the request.
            tracing::trace!("not getting: the queue was drained and nothing was notified since");
            task.last_get_full = false;
            task.idle_count = task.idle_count.saturating_add(1);
            return self.back_off(task, mark).await;
        }
        let (lease, batch_size) = (self.settings.lease_duration, self.settings.batch_size);
        // Handler slots first: a get asks for no more messages than can be handled at
        // once, so none waits leased for a slot.
        let grant = tokio::select! {
            grant = self.pool.slots.acquire(batch_size) => grant,
            _ = self.stopping.cancelled() => return Step::Stop,
        };
        if self.current_pause().is_some() {
            // Paused while waiting for slots: no get; wait at the top.
            return Step::Go;
        }
        self.pool.calls_started.notify_one();
        // The wait may have been long: retire now if the rule wants fewer tasks, rather
        // than after a batch taken only to be let go.
        if !task.probe && mark.try_retire(u32::from(task.last_get_full)) {
            tracing::debug!("retiring: more tasks than the rule's count");
            drop(grant);
            return Step::Retired;
        }
        // A fast app's calls end before a fetched-ahead message waits long for a slot.
        let ahead = self.reserve_prefetch(batch_size.saturating_sub(grant.count()));
        let asked = grant.count() + ahead;
        mark.get_starts();
        // The service's lease starts when it answers, somewhere after this: counting
        // it from here errs on the safe side when storage calls are slow.
        let asked_at = tokio::time::Instant::now();
        let mut wait = std::mem::take(&mut task.server_wait);
        if wait.is_zero() && self.push_enabled() {
            wait = self.queue.server_wait(PUSH_GET_WAIT);
        }
        task.last_get_conclusive = !wait.is_zero() || self.queue.server_wait(PUSH_GET_WAIT).is_zero();
        let batch = tokio::select! {
            batch = self.queue.get_waiting(asked, lease, wait) => batch,
            _ = self.stopping.cancelled() => return Step::Stop,
        };
        // A get that waited on the service leased what it found when it found it.
        let leased_from = asked_at + crate::queue::lease_offset(asked_at.elapsed(), wait);
        mark.get_answered(self);
        // What was reserved to fetch ahead and did not come back is free for other tasks.
        let fetched_ahead = batch.as_ref().map_or(0, |messages| (messages.len() as u32).saturating_sub(grant.count()).min(ahead));
        self.release_prefetch(ahead - fetched_ahead);
        match batch {
            Ok(messages) if !messages.is_empty() && self.current_pause().is_some() => {
                // Paused while the get waited on the service (a long poll): not handled now.
                drop(grant);
                self.release_prefetch(fetched_ahead);
                self.release_got_while_paused(messages).await;
                Step::Go
            }
            Ok(messages) => {
                self.record_get(&messages, asked);
                self.after_get(task, mark, messages, grant, asked, leased_from + lease).await
            }
            Err(error) => {
                drop(grant);
                self.after_failed_get(task, &error).await
            }
        }
    }

    /// After a get that answered: processes what it found, and, when it found the queue
    /// drained, backs off as the rule says (or stops).
    async fn after_get(
        self: &Arc<Self>,
        task: &mut TaskLoop,
        mark: &mut TaskMark<'_>,
        messages: Vec<Message>,
        grant: PermitGrant<'_>,
        asked: u32,
        leased_until: tokio::time::Instant,
    ) -> Step {
        task.consecutive_errors = 0;
        let found = messages.len();
        // As many as asked: more may wait, whether a batch or fewer was asked.
        task.last_get_full = found >= asked as usize;
        if found > 0 {
            // Found work: from now on an ordinary task, stopped by the rule.
            task.probe = false;
            // After idling this is the paper's QueueWorkDetected; while busy it
            // keeps the task count adapting (the scaler coalesces the raises).
            self.work_found();
            if task.last_get_full && !self.queue.fifo() && !self.settings.wait_for_batch {
                // More wait: get again as soon as handler slots are free, not after this
                // batch's slowest call (a dump of thousands drains at the slots' pace, not
                // at the tasks' × their batches'). A FIFO queue's batches keep their order.
                self.process_batch_apart(messages, grant, leased_until);
            } else {
                self.process_batch(messages, grant, leased_until).await;
            }
        } else {
            drop(grant);
        }
        if task.last_get_full {
            task.idle_count = 0;
            return Step::Go;
        }
        // Fewer than asked for: the queue was drained when storage answered. An
        // empty get counts as one more idle look; a short batch as the first (the
        // look that would have found the queue empty is not made).
        task.idle_count = if found == 0 { task.idle_count.saturating_add(1) } else { 1 };
        if task.last_get_conclusive {
            mark.got_short();
        }
        if task.probe && found == 0 {
            let mut stopped = false;
            let after = mark.after_drained(|| {
                stopped = self.try_stop_idle();
                stopped
            });
            if stopped && matches!(after, AfterDrained::Rest) {
                tracing::debug!("safety poll found the queue empty");
                return Step::Retired;
            }
        }
        self.back_off(task, mark).await
    }

    /// The queue was found drained `idle_count` times in a row: picks up what was notified
    /// meanwhile, or rests (or stops) as the rule says. The rest ends in the next get: as
    /// much of it as the queue can wait on the service is spent there (a message arriving
    /// meanwhile is taken at once), the rest asleep before it.
    async fn back_off(&self, task: &mut TaskLoop, mark: &mut TaskMark<'_>) -> Step {
        let idle_count = task.idle_count;
        let decision = self.decide_queue_empty(idle_count).await;
        // Listening before the claim is taken: a pickup made due meanwhile is not missed.
        let due_early = self.pool.pickup_due.notified();
        tokio::pin!(due_early);
        due_early.as_mut().enable();
        let mut stopped = false;
        let after = mark.after_drained(|| {
            stopped = decision.stop && self.try_stop_idle();
            stopped
        });
        let (wake_at, server_wait) = match after {
            AfterDrained::GetAt(at) => (at, Duration::ZERO),
            AfterDrained::Rest if stopped => {
                tracing::debug!(idle_count, "stopping: the rule retired this idle task");
                return Step::Retired;
            }
            AfterDrained::Rest => {
                let delay = Duration::from_millis(decision.delay_ms);
                let server_wait = self.queue.server_wait(delay).min(delay);
                (tokio::time::Instant::now() + (delay - server_wait), server_wait)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep_until(wake_at) => {
                task.server_wait = server_wait;
                Step::Go
            }
            // Woken early (a pickup, the scaler); the back-off restarts only if
            // this task finds messages.
            _ = self.pool.wake.notified(), if mark.is_resting() => Step::Go,
            // The pickup this task claimed is due now (a batch was announced).
            _ = due_early, if mark.has_claim() => Step::Go,
            _ = self.stopping.cancelled() => Step::Stop,
        }
    }

    /// After a failed get: waits longer after each failure in a row, up to `max_polling_interval`.
    async fn after_failed_get(&self, task: &mut TaskLoop, error: &QueueError) -> Step {
        task.consecutive_errors += 1;
        self.telemetry.counters.storage_errors.fetch_add(1, Ordering::Relaxed);
        let delay = RetryPolicy::default().delay(task.consecutive_errors).min(self.settings.max_polling_interval);
        if let Some(suppressed) = self.telemetry.storage_log.allow() {
            tracing::warn!(?delay, suppressed, "get failed: {error}");
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => Step::Go,
            _ = self.stopping.cancelled() => Step::Stop,
        }
    }
}
