//! The paper's queue listener: dequeue tasks that get batches, hand each message to the
//! handler and delete it only after success, back off by the rule when the queue is empty,
//! and a scaler that asks the rule how many tasks to run whenever work is detected.
//!
//! The paper's contract maps to: `StartListener(n)` → [`Listener::start_tasks`];
//! `QueryState()` → [`Listener::status`]; `QueueEmpty` and `GetOptimalDequeueTaskCount` →
//! the rule's two decisions; `QueueWorkDetected` → [`Listener::work_detected`], raised by a
//! task that finds messages (after idling, and while busy) and by push notifications.
//!
//! The files follow the data path:
//! - `tasks`: the dequeue task loop (get, process or back off, retire), and its slots;
//! - `process`: a batch's messages through the handler, and each one's outcome (delete,
//!   retry later, release at shutdown); `lease`: renewing a message's lease while the
//!   handler runs; `poison`: moving a message that cannot be handled aside; `failures`:
//!   retry or poison after a failure (the rule's `on-handler-failure`, or `max_dequeue_count`);
//! - `work`: work-detected events, pushes, wake-ups and the safety poll;
//! - `scaling`: the scaler, which moves the task count toward the rule's;
//!   `rule`: what the rule is told and the thread it is asked on;
//! - `pause`: a paused queue makes no get;
//! - `counters` and `status`: what `QueryState()` reports.

mod builder;
mod concurrency;
mod counters;
mod failures;
mod items;
mod lease;
mod pause;
mod pickup;
mod poison;
mod process;
mod rule;
mod scaling;
mod settings;
mod slots;
mod status;
mod tasks;
mod work;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::handler::Handler;
use crate::log_limit::LogLimiter;
use crate::queue::{Clock, QueueClient, Transactions};
use crate::rules::Decider;

pub use builder::ListenerBuilder;
pub use concurrency::CONCURRENCY_WINDOW;
use counters::Counters;
pub use items::Reply;
pub use pause::Pause;
pub(crate) use poison::PoisonEnvelope;
pub use settings::QueueSettings;
pub use status::{DEPTH_MAX_AGE, ListenerStatus, PoisonForm};

/// One queue's listener. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Listener {
    shared: Arc<Shared>,
}

/// What the listener's tasks share; each file of this module adds the methods of its job.
struct Shared {
    queue: Arc<dyn QueueClient>,
    poison: Arc<dyn QueueClient>,
    handler: Arc<dyn Handler>,
    /// Decides the task count and the idle sleeps (the built-in rule unless the builder was given another).
    decider: Arc<dyn Decider>,
    /// The time rules are told (`timestamp_ms`).
    clock: Arc<dyn Clock>,
    settings: QueueSettings,
    transactions: Option<Arc<Transactions>>,
    /// Counts the messages gets see for the first time (arrivals, for `ebb trace export`).
    recording: Option<Arc<crate::record::QueueRecording>>,
    counters: Counters,
    /// Raised by `work_detected`; the scaler coalesces raises.
    work: Notify,
    /// Wakes resting tasks early (a pickup, the scaler).
    wake: Notify,
    /// Notifications waiting for a get, and the tasks that will make it.
    pickup: Mutex<pickup::Pickup>,
    /// Bumped by every work-detected event, for watchers outside (the KEDA scaler's
    /// `StreamIsActive`).
    work_events: tokio::sync::watch::Sender<u64>,
    /// Stop taking new batches.
    stopping: CancellationToken,
    /// Drain time is over: release what is still in flight.
    abandon: CancellationToken,
    tasks: TaskTracker,
    random: Mutex<fastrand::Rng>,
    /// The concurrency decision's own random values, so that adding it left the task-count
    /// and idle decisions' sequences (and a seeded simulation's figures) as they were.
    concurrency_random: Mutex<fastrand::Rng>,
    /// The failure decision's, likewise.
    failure_random: Mutex<fastrand::Rng>,
    /// Handler failures and retries are logged at WARN, this many per window.
    failure_log: LogLimiter,
    /// Poisonings, likewise (each one's reason stays in the status and the metrics).
    poison_log: LogLimiter,
    /// When the depth was last counted (remote backends: each count is a billed call).
    depth_counted: Mutex<Option<tokio::time::Instant>>,
    /// Failed gets, likewise.
    storage_log: LogLimiter,
    /// Whether pushes can reach the queue now (false while the bus between hosts is down:
    /// then a `push` queue polls as a pull queue does).
    push_available: AtomicBool,
    /// Set by `start`: a listener never started (`ebb scaler`'s) only carries events.
    started: AtomicBool,
    /// Wake-ups waiting for hidden messages to become visible (`wake_after`), and the
    /// news that an earlier one was added (the one timer re-arms).
    wakeups: Mutex<work::Wakeups>,
    wakeups_changed: Notify,
    /// Handler slots: how many handler calls run at once.
    slots: slots::Slots,
    /// Raised when slots are taken, so the idle concurrency decision starts its windows.
    calls_started: Notify,
    /// The recent mean handler latency, in µs (0 before the first call): how far tasks
    /// may fetch ahead of the free slots.
    latency_micros: std::sync::atomic::AtomicU64,
    /// Messages fetched ahead of the free slots and not yet given one, all tasks together
    /// (with the places reserved for gets in flight).
    fetched_ahead: std::sync::atomic::AtomicU32,
    /// The queue's pause, if any (see `pause`).
    paused: tokio::sync::watch::Sender<Option<pause::Pause>>,
    /// How envelopes' items are delivered, and put back when they fail.
    payload: crate::payload::PayloadSettings,
    /// Packs failed items into a new envelope.
    packer: crate::payload::Packer,
    /// Envelopes go as base64 text (an Azure queue with `encoding = "none"`).
    text_envelopes: bool,
    /// Where handlers' answers go, if anywhere.
    reply: Option<Arc<dyn QueueClient>>,
    /// Where claim-check items' bodies are, if the queue has a claim store.
    claims: Option<Arc<dyn crate::payload::claims::ClaimStore>>,
    /// Which partition of its logical queue the queue is, if it is one: replies carry the
    /// logical ids producers know.
    partition: Option<usize>,
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
        self.shared.counters.target_tasks.store(initial, Ordering::Relaxed);
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

    /// Messages arrive hidden for `delay` (a delayed send): with push, the queue is woken
    /// when they become visible.
    pub(crate) fn work_detected_after(&self, delay: Duration) {
        if delay.is_zero() {
            self.shared.work_detected();
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
        self.shared.work_events.subscribe()
    }

    /// Time spent in the handler so far, over every message (with `processed` and `failed`
    /// of the status, the mean latency over any window).
    pub(crate) fn handler_time(&self) -> Duration {
        Duration::from_micros(self.shared.counters.handler_micros())
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

    /// Messages released at shutdown so far (the status's `released_on_shutdown`, read
    /// without the status's depth refresh).
    pub(crate) fn released_on_shutdown(&self) -> u64 {
        self.shared.counters.released_on_shutdown.load(Ordering::Relaxed)
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
