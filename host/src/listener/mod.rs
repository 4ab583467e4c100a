//! The paper's queue listener: dequeue tasks that get batches, hand each message to the
//! handler and delete it only after success, back off by the rule when the queue is empty,
//! and a scaler that asks the rule how many tasks to run whenever work is detected.
//!
//! The paper's contract maps to: `StartListener(n)` → [`Listener::start_tasks`];
//! `QueryState()` → [`Listener::status`]; `QueueEmpty` and `GetOptimalDequeueTaskCount` →
//! the rule's two decisions; `QueueWorkDetected` → [`Listener::work_detected`], raised by a
//! task that finds messages (after idling, and while busy) and by push notifications.
//!
//! A plain message's way through the listener reads top to bottom in five files:
//! 1. `pool/tasks.rs`: a dequeue task takes handler slots, gets a batch and hands it on (or,
//!    when the queue is empty, backs off as the rule says);
//! 2. `delivery/process.rs`: each message to the handler, then its outcome settled: deleted
//!    on success, hidden for a retry delay, or released at once at shutdown;
//! 3. `delivery/lease.rs`: its lease renewed while the handler runs;
//! 4. `delivery/failures.rs`: after a failure, retry or poison (the rule's
//!    `on-handler-failure`, or `max_dequeue_count`);
//! 5. `delivery/poison.rs`: put on the poison queue, then deleted.
//!
//! The parts, each with its own state:
//! - `pool/`: the task pool: tasks, the pickup of notified work, handler slots, fetch-ahead,
//!   scaling the task count and the concurrency decision;
//! - `delivery/`: the above, and envelopes' items and replies (`items`);
//! - `telemetry/`: the counters and status behind `QueryState()`, recording and log limits;
//! - `rule.rs`: what the rule is told and the thread it is asked on; `work.rs`: work-detected
//!   events, pushes, wake-ups and the safety poll; `pause.rs`: a paused queue makes no get;
//!   `builder.rs` and `settings.rs`: what a listener is made of.

mod builder;
mod delivery;
mod pause;
mod pool;
mod rule;
mod settings;
mod telemetry;
mod work;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::handler::Handler;
use crate::queue::QueueClient;

pub(crate) use delivery::PoisonEnvelope;
pub use delivery::Reply;
pub use pause::Pause;
pub use pool::CONCURRENCY_WINDOW;
pub use settings::QueueSettings;
pub use telemetry::{DEPTH_MAX_AGE, DeadLetterStatus, DecisionWithInputs, ListenerStatus, PoisonForm, PoisonRecord, RecordedDecision, TaskCountInputs};

/// One queue's listener. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Listener {
    shared: Arc<Shared>,
}

/// What the listener's tasks share: the queue and its handler, the run's lifetime, and the
/// parts, each with its own state (the methods of each job are in its part's files).
struct Shared {
    queue: Arc<dyn QueueClient>,
    handler: Arc<dyn Handler>,
    settings: QueueSettings,
    /// Stop taking new batches.
    stopping: CancellationToken,
    /// Drain time is over: release what is still in flight.
    abandon: CancellationToken,
    tasks: TaskTracker,
    /// Set by `start`: a listener never started (`ebb scaler`'s) only carries events.
    started: AtomicBool,
    /// The queue's pause, if any (see `pause`).
    paused: tokio::sync::watch::Sender<Option<pause::Pause>>,
    /// The rule, the time it is told and its random values (see `rule`).
    rule: rule::Rule,
    /// Work-detected events, wake-ups and whether pushes reach the queue (see `work`).
    events: work::Events,
    /// The dequeue tasks' pickup, handler slots and fetch-ahead (see `pool`).
    pool: pool::Pool,
    /// The poison and reply queues, envelopes and claims (see `delivery`).
    delivery: delivery::Delivery,
    /// Counters, recording and log limits (see `telemetry`).
    telemetry: telemetry::Telemetry,
}

impl Listener {
    /// The queue's name.
    pub fn queue_name(&self) -> &str {
        self.shared.queue.name()
    }

    /// Starts the scaler and the initial dequeue tasks: `min_tasks`, and at least one unless
    /// push notifications can wake the queue. With push, also the safety poll: while no task
    /// runs, one get now (messages queued before the start) and one per `safety_poll`
    /// (messages whose notification was lost).
    pub fn start(&self) {
        self.shared.started.store(true, Ordering::Release);
        self.shared.spawn_scaler();
        self.shared.spawn_concurrency();
        let initial = self.shared.floor();
        self.shared.telemetry.counters.target_tasks.store(initial, Ordering::Relaxed);
        self.start_tasks(initial);
        if self.shared.settings.push_enabled {
            self.shared.spawn_safety_poll();
        }
    }

    /// `StartListener(n)`: starts `n` more dequeue tasks (never beyond `max_tasks`).
    pub fn start_tasks(&self, n: u32) {
        self.shared.start_tasks(n);
    }

    /// `QueueWorkDetected` from outside (a push): messages have arrived. Wakes one idle task
    /// and asks the scaler to decide the task count.
    pub fn work_detected(&self) {
        self.shared.work_detected();
    }

    /// [`Listener::work_detected`] by a notifier that knows how many messages arrived: once
    /// the notified messages make a batch, their get is made at once rather than after
    /// `max_pickup_delay` (a batch gains nothing by waiting for more).
    pub fn messages_arrived(&self, messages: u64) {
        self.shared.messages_arrived(messages);
    }

    /// `messages` arrive hidden for `delay` (a delayed send): with push, the queue is woken
    /// when they become visible.
    pub(crate) fn work_detected_after(&self, messages: u64, delay: Duration) {
        if delay.is_zero() {
            self.shared.messages_arrived(messages);
        } else {
            self.shared.wake_after(delay);
        }
    }

    /// Whether push notifications can reach this queue now. While they cannot (the bus
    /// between hosts is down), a `push` queue keeps a polling task and its rule is told push
    /// is off, so messages are found with the rule's back-off; when they can again, idle
    /// tasks may stop as the rule says.
    pub(crate) fn set_push_available(&self, available: bool) {
        self.shared.set_push_available(available);
    }

    /// A receiver that sees every work-detected event (a task finding messages, a push),
    /// as a counter that goes up: for watchers outside the listener, like the KEDA scaler.
    pub(crate) fn work_events(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.events.work_events.subscribe()
    }

    /// Time spent in the handler so far, over every message (with `processed` and `failed`
    /// of the status, the mean latency over any window).
    pub(crate) fn handler_time(&self) -> Duration {
        Duration::from_micros(self.shared.telemetry.counters.handler_micros())
    }

    /// `QueryState()`: the listener's state, for status and metrics.
    ///
    /// On a backend whose count is a billed call (Azure), the depth is the last count made:
    /// a scaling decision's, or one this starts in the background when the last is older
    /// than [`DEPTH_MAX_AGE`] (so watching the status costs at most one count per that
    /// time; `depth_as_of` says how old the figure is).
    pub fn status(&self) -> ListenerStatus {
        self.shared.refresh_depth_if_stale();
        self.shared.status()
    }

    /// The status without starting a count: the depth is the last figure made (free on the
    /// embedded store; on Azure, a decision's count). For readers that must cost nothing.
    pub(crate) fn status_as_is(&self) -> ListenerStatus {
        self.shared.status()
    }

    /// The most dequeue tasks that ran at once since the last call (the tasks running now
    /// when none started since): a sampler sees a peak that came and went between samples.
    pub(crate) fn take_recent_peak_tasks(&self) -> u32 {
        let counters = &self.shared.telemetry.counters;
        let active = counters.active_tasks.load(Ordering::Relaxed);
        counters.recent_peak_tasks.swap(active, Ordering::Relaxed).max(active)
    }

    /// Messages released at shutdown so far (the status's `released_on_shutdown`, read
    /// without the status's depth refresh).
    pub(crate) fn released_on_shutdown(&self) -> u64 {
        self.shared.telemetry.counters.released_on_shutdown.load(Ordering::Relaxed)
    }

    /// Stops at once, without waiting: no new batch, and messages in flight are released
    /// (visible again at once) as their handlers' futures are dropped. The tasks end soon
    /// after, on their own. For a host dropped without its graceful shutdown.
    pub(crate) fn stop_now(&self) {
        self.shared.stopping.cancel();
        self.shared.tasks.close();
        self.shared.abandon.cancel();
    }

    /// Stops taking new batches, lets in-flight messages finish for up to `drain_timeout`,
    /// releases what is left (visible again at once), and returns when every task is done.
    pub async fn shutdown(&self, drain_timeout: Duration) {
        self.shared.stopping.cancel();
        self.shared.tasks.close();
        let abandon = self.shared.abandon.clone();
        let drained = tokio::time::timeout(drain_timeout, self.shared.tasks.wait()).await;
        if drained.is_err() {
            tracing::warn!(queue = %self.queue_name(), ?drain_timeout, "drain timeout: releasing messages still in flight");
            abandon.cancel();
            self.shared.tasks.wait().await;
        }
    }
}
