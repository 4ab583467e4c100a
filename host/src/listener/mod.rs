//! The paper's queue listener: dequeue tasks that get batches, hand each message to the
//! handler and delete it only after success, back off by the rule when the queue is empty,
//! and a scaler that asks the rule how many tasks to run whenever work is detected.
//!
//! The paper's contract maps to: `StartListener(n)` → [`Listener::start_tasks`];
//! `QueryState()` → [`Listener::status`]; `QueueEmpty` and `GetOptimalDequeueTaskCount` →
//! the rule's two decisions; `QueueWorkDetected` → [`Listener::work_detected`], raised by a
//! task that finds messages (after idling, and while busy) and by push notifications.

mod message;
mod settings;
mod state;

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::FutureExt as _;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::handler::Handler;
use crate::log_limit::LogLimiter;
use crate::panics::panic_message;
use crate::queue::{Clock, QueueClient, SystemClock, Transactions};
use crate::rules::{
    Decision, DecisionSource, IdleContext, NativeRule, QueueRules, QueueState, built_in_queue_empty, built_in_task_count, native_queue_empty, native_task_count,
};

pub use settings::QueueSettings;
use state::Counters;
pub use state::{ListenerStatus, PoisonForm, PoisonRecord, RecordedDecision};

/// Log lines per window for repeated failures (handler failures, failed gets).
const FAILURE_LOG_LINES: u32 = 10;
const FAILURE_LOG_WINDOW: Duration = Duration::from_secs(60);
/// The oldest depth figure the status shows on a backend whose count is billed, before it
/// counts again.
pub const DEPTH_MAX_AGE: Duration = Duration::from_secs(30);

/// One queue's listener. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Listener {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Arc<dyn QueueClient>,
    poison: Arc<dyn QueueClient>,
    handler: Arc<dyn Handler>,
    /// The queue's rule; `None`: the built-in rule decides.
    rules: Option<QueueRules>,
    /// A rule in Rust, which decides instead of `rules` when set.
    native: Option<Arc<dyn NativeRule>>,
    /// The time rules are told (`timestamp_ms`).
    clock: Arc<dyn Clock>,
    settings: QueueSettings,
    transactions: Option<Arc<Transactions>>,
    counters: Counters,
    /// Raised by `work_detected`; the scaler coalesces raises.
    work: Notify,
    /// Wakes idle tasks early (push notifications).
    wake: Notify,
    /// Bumped by every work-detected event, for watchers outside (the KEDA scaler's
    /// `StreamIsActive`).
    work_events: tokio::sync::watch::Sender<u64>,
    /// Stop taking new batches.
    stopping: CancellationToken,
    /// Drain time is over: release what is still in flight.
    abandon: CancellationToken,
    tasks: TaskTracker,
    random: Mutex<fastrand::Rng>,
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
    /// Wake-ups waiting for hidden messages to become visible (`wake_after`).
    wake_timers: AtomicU32,
}

/// Most wake-ups waiting at once per queue.
const MAX_WAKE_TIMERS: u32 = 1024;

/// A dequeue task's slot in `active_tasks`, given back when the task ends however it
/// ends (a panic included), unless the task gave it back itself when it retired.
struct TaskSlot<'a> {
    counters: &'a Counters,
    held: bool,
}

impl TaskSlot<'_> {
    fn given_back(mut self) {
        self.held = false;
    }
}

impl Drop for TaskSlot<'_> {
    fn drop(&mut self) {
        if self.held {
            self.counters.active_tasks.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Builds a [`Listener`]: the queue, its poison queue and the handler are required; the
/// rule (default: the built-in one), the settings (default: [`QueueSettings::default`]) and
/// the transaction counters shown in the status (default: none) are not.
pub struct ListenerBuilder {
    queue: Arc<dyn QueueClient>,
    poison: Arc<dyn QueueClient>,
    handler: Arc<dyn Handler>,
    rules: Option<QueueRules>,
    native: Option<Arc<dyn NativeRule>>,
    clock: Arc<dyn Clock>,
    settings: QueueSettings,
    transactions: Option<Arc<Transactions>>,
}

impl ListenerBuilder {
    /// The clock whose time the rules are told (default: the system's; a simulation gives
    /// its paused clock, so a time-of-day rule sees simulated time).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// A rule written in Rust that decides instead of a WASM rule (embedding, simulations).
    pub fn native_rule(mut self, rule: Arc<dyn NativeRule>) -> Self {
        self.native = Some(rule);
        self
    }

    /// The rule that decides the task count and the idle sleeps (from [`crate::rules::RuleSet::queue`]).
    pub fn rules(mut self, rules: QueueRules) -> Self {
        self.rules = Some(rules);
        self
    }

    /// The queue's settings.
    pub fn settings(mut self, settings: QueueSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Storage counters to report in the status.
    pub fn transactions(mut self, transactions: Arc<Transactions>) -> Self {
        self.transactions = Some(transactions);
        self
    }

    /// The listener; no task runs until [`Listener::start`].
    pub fn build(self) -> Listener {
        let ListenerBuilder { queue, poison, handler, rules, native, clock, settings, transactions } = self;
        let seed = settings.random_seed.unwrap_or_else(|| fastrand::u64(..));
        Listener {
            shared: Arc::new(Shared {
                queue,
                poison,
                handler,
                rules,
                native,
                clock,
                settings,
                transactions,
                counters: Counters::default(),
                work: Notify::new(),
                wake: Notify::new(),
                work_events: tokio::sync::watch::Sender::new(0),
                stopping: CancellationToken::new(),
                abandon: CancellationToken::new(),
                tasks: TaskTracker::new(),
                random: Mutex::new(fastrand::Rng::with_seed(seed)),
                failure_log: LogLimiter::new(FAILURE_LOG_LINES, FAILURE_LOG_WINDOW),
                poison_log: LogLimiter::new(FAILURE_LOG_LINES, FAILURE_LOG_WINDOW),
                depth_counted: Mutex::new(None),
                storage_log: LogLimiter::new(FAILURE_LOG_LINES, FAILURE_LOG_WINDOW),
                push_available: AtomicBool::new(true),
                started: AtomicBool::new(false),
                wake_timers: AtomicU32::new(0),
            }),
        }
    }
}

impl Listener {
    /// A builder for a listener on `queue`, whose poisoned messages go to `poison`.
    pub fn builder(queue: Arc<dyn QueueClient>, poison: Arc<dyn QueueClient>, handler: Arc<dyn Handler>) -> ListenerBuilder {
        ListenerBuilder {
            queue,
            poison,
            handler,
            rules: None,
            native: None,
            clock: Arc::new(SystemClock),
            settings: QueueSettings::default(),
            transactions: None,
        }
    }

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
        let shared = self.shared.clone();
        let span = tracing::info_span!("scaler", queue = %self.queue_name());
        self.shared.tasks.spawn(
            async move {
                // A panic ends one decision, not scaling: count it, pause, start over.
                while let Err(panic) = AssertUnwindSafe(shared.clone().run_scaler()).catch_unwind().await {
                    shared.task_panicked("the scaler", &*panic);
                    tokio::select! {
                        _ = tokio::time::sleep(shared.settings.scale_interval) => {}
                        _ = shared.stopping.cancelled() => return,
                    }
                }
            }
            .instrument(span),
        );
        let initial = self.shared.floor();
        self.shared.counters.target_tasks.store(initial, Ordering::Relaxed);
        self.start_tasks(initial);
        if self.shared.settings.push_enabled {
            let shared = self.shared.clone();
            let span = tracing::info_span!("safety_poll", queue = %self.queue_name());
            self.shared.tasks.spawn(shared.run_safety_poll().instrument(span));
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
    pub fn work_detected_after(&self, delay: Duration) {
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
    pub fn set_push_available(&self, available: bool) {
        let shared = &self.shared;
        if shared.push_available.swap(available, Ordering::AcqRel) == available || !shared.settings.push_enabled {
            return;
        }
        if !available && !shared.stopping.is_cancelled() {
            let active = shared.counters.active_tasks.load(Ordering::Acquire);
            shared.start_tasks(shared.floor().saturating_sub(active));
        }
    }

    /// A receiver that sees every work-detected event (a task finding messages, a push),
    /// as a counter that goes up: for watchers outside the listener, like the KEDA scaler.
    pub fn work_events(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.work_events.subscribe()
    }

    /// Time spent in the handler so far, over every message (with `processed` and `failed`
    /// of the status, the mean latency over any window).
    pub fn handler_time(&self) -> Duration {
        Duration::from_micros(self.shared.counters.handler_micros())
    }

    /// `QueryState()`: the listener's state, for status and metrics.
    ///
    /// On a backend whose count is a billed call (Azure), the depth is the last count made:
    /// a scaling decision's, or one this starts in the background when the last is older
    /// than [`DEPTH_MAX_AGE`] (so watching the status costs at most one count per that
    /// time; `depth_as_of` says how old the figure is).
    pub fn status(&self) -> ListenerStatus {
        self.refresh_depth_if_stale();
        self.shared.status()
    }

    fn refresh_depth_if_stale(&self) {
        let shared = &self.shared;
        if shared.queue.local_count().is_some() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        {
            let mut counted = shared.depth_counted.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if counted.is_some_and(|at| at.elapsed() < DEPTH_MAX_AGE) {
                return;
            }
            *counted = Some(tokio::time::Instant::now());
        }
        let shared = shared.clone();
        runtime.spawn(async move {
            match shared.queue.approximate_count().await {
                Ok(depth) => shared.counters.record_depth(depth, SystemTime::now()),
                Err(error) => tracing::debug!("could not refresh the depth for the status: {error}"),
            }
        });
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

impl Shared {
    /// Fewest tasks: `min_tasks`, and at least one polling task unless pushes can wake the queue.
    fn floor(&self) -> u32 {
        if self.push_enabled() { self.settings.min_tasks } else { self.settings.min_tasks.max(1) }
    }

    /// Push is configured and can reach the queue now.
    fn push_enabled(&self) -> bool {
        self.settings.push_enabled && self.push_available.load(Ordering::Acquire)
    }

    fn start_tasks(self: &Arc<Self>, n: u32) {
        self.spawn_tasks(n, false);
    }

    /// Starts `n` dequeue tasks; a `probe` task stops at its first empty get (when the
    /// floor allows), so a safety poll of an empty queue costs one get.
    fn spawn_tasks(self: &Arc<Self>, n: u32, probe: bool) {
        let counters = &self.counters;
        for _ in 0..n {
            // Reserve a slot first, so concurrent starts never exceed max_tasks.
            let reserved =
                counters.active_tasks.fetch_update(Ordering::AcqRel, Ordering::Acquire, |active| (active < self.settings.max_tasks).then_some(active + 1));
            let Ok(previous) = reserved else { return };
            counters.peak_tasks.fetch_max(previous + 1, Ordering::Relaxed);
            let task_number = counters.tasks_started.fetch_add(1, Ordering::Relaxed) + 1;
            let shared = self.clone();
            let span = tracing::info_span!("dequeue_task", queue = %self.queue.name(), task = task_number);
            self.tasks.spawn(
                async move {
                    if let Err(panic) = AssertUnwindSafe(shared.clone().run_task(probe)).catch_unwind().await {
                        // Its slot was given back as it unwound; keep the floor running.
                        shared.task_panicked("a dequeue task", &*panic);
                        if !shared.stopping.is_cancelled() {
                            let active = shared.counters.active_tasks.load(Ordering::Acquire);
                            shared.start_tasks(shared.floor().saturating_sub(active));
                        }
                    }
                }
                .instrument(span),
            );
        }
    }

    /// Surfaces a panic that escaped a task (as Vector re-raises task panics): counted in
    /// the status and logged at ERROR.
    fn task_panicked(&self, task: &str, panic: &(dyn std::any::Any + Send)) {
        self.counters.task_panics.fetch_add(1, Ordering::Relaxed);
        tracing::error!("{task} panicked and was restarted: {}", panic_message(panic));
    }

    /// Gives up this task's slot if there are more tasks than the target (after a scale-down).
    fn try_retire(&self) -> bool {
        let target = self.counters.target_tasks.load(Ordering::Relaxed).max(self.floor());
        self.counters.active_tasks.fetch_update(Ordering::AcqRel, Ordering::Acquire, |active| (active > target).then(|| active - 1)).is_ok()
    }

    /// Gives up this task's slot when the rule says an idle task stops, keeping the floor
    /// (one polling task in pull mode).
    fn try_stop_idle(&self) -> bool {
        let floor = self.floor();
        self.counters.active_tasks.fetch_update(Ordering::AcqRel, Ordering::Acquire, |active| (active > floor).then(|| active - 1)).is_ok()
    }

    /// A push: messages arrived from outside. One idle task is enough to pick them up; if
    /// more are needed, the scaler's decision wakes or starts them. With no task at all (an
    /// idle push queue), one starts at once: the scaler may be inside its coalescing
    /// interval, and the message would wait for it.
    fn work_detected(self: &Arc<Self>) {
        self.work_found();
        if self.started.load(Ordering::Acquire) && self.counters.active_tasks.load(Ordering::Acquire) == 0 && !self.stopping.is_cancelled() {
            self.start_tasks(1);
        } else {
            self.wake.notify_one();
        }
    }

    /// With push, a message this host hid (a retry delay, a delayed send) is visible again
    /// after `delay` and no notification will say so: wake the queue then, rather than at
    /// the next safety poll. At most [`MAX_WAKE_TIMERS`] wait at once; past that, the
    /// safety poll finds the rest.
    fn wake_after(self: &Arc<Self>, delay: Duration) {
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

    /// A task found messages: ask the scaler, without waking idle tasks (the scaler wakes as
    /// many as the backlog needs; waking one per find would turn a trickle into empty gets).
    fn work_found(&self) {
        self.counters.work_detected.fetch_add(1, Ordering::Relaxed);
        self.work.notify_one();
        self.work_events.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn random(&self) -> u64 {
        self.random.lock().unwrap().u64(..)
    }

    /// The safety poll (push mode): while no dequeue task runs, a probe task looks at the
    /// queue at start-up and then once per `safety_poll`.
    async fn run_safety_poll(self: Arc<Self>) {
        loop {
            if self.counters.active_tasks.load(Ordering::Acquire) == 0 {
                self.counters.safety_polls.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("safety poll: no task is running, looking at the queue once");
                self.spawn_tasks(1, true);
            }
            tokio::select! {
                _ = tokio::time::sleep(self.settings.safety_poll) => {}
                _ = self.stopping.cancelled() => return,
            }
        }
    }

    async fn run_task(self: Arc<Self>, mut probe: bool) {
        let slot = TaskSlot { counters: &self.counters, held: true };
        let mut idle_count = 0u32;
        let mut consecutive_errors = 0u32;
        let lease = self.settings.lease_duration;
        loop {
            if self.stopping.is_cancelled() {
                break;
            }
            // A probe looks once before anything else (the target may be zero tasks).
            if !probe && self.try_retire() {
                tracing::debug!("retiring: more tasks than the rule's count");
                slot.given_back();
                return;
            }
            // The service's lease starts when it answers, somewhere after this: counting
            // it from here errs on the safe side when storage calls are slow.
            let asked_at = tokio::time::Instant::now();
            let batch = tokio::select! {
                batch = self.queue.get(self.settings.batch_size, lease) => batch,
                _ = self.stopping.cancelled() => break,
            };
            match batch {
                Ok(messages) if messages.is_empty() => {
                    consecutive_errors = 0;
                    idle_count = idle_count.saturating_add(1);
                    if probe && self.try_stop_idle() {
                        tracing::debug!("safety poll found the queue empty");
                        slot.given_back();
                        return;
                    }
                    let decision = self.decide_queue_empty(idle_count).await;
                    if decision.stop && self.try_stop_idle() {
                        tracing::debug!(idle_count, "stopping: the rule retired this idle task");
                        slot.given_back();
                        return;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(decision.delay_ms)) => {}
                        // Woken early; the back-off restarts only if this task finds messages.
                        _ = self.wake.notified() => {}
                        _ = self.stopping.cancelled() => break,
                    }
                }
                Ok(messages) => {
                    consecutive_errors = 0;
                    // Found work: from now on an ordinary task, stopped by the rule.
                    probe = false;
                    // After idling this is the paper's QueueWorkDetected; while busy it keeps
                    // the task count adapting (the scaler coalesces the raises).
                    self.work_found();
                    idle_count = 0;
                    let leased_until = asked_at + lease;
                    let processing = messages.into_iter().map(|message| self.process(message, leased_until));
                    futures::future::join_all(processing).await;
                }
                Err(error) => {
                    consecutive_errors += 1;
                    self.counters.storage_errors.fetch_add(1, Ordering::Relaxed);
                    let delay = crate::queue::RetryPolicy::default().delay(consecutive_errors).min(self.settings.max_polling_interval);
                    if let Some(suppressed) = self.storage_log.allow() {
                        tracing::warn!(?delay, suppressed, "get failed: {error}");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = self.stopping.cancelled() => break,
                    }
                }
            }
        }
        drop(slot);
    }

    async fn decide_queue_empty(&self, idle_count: u32) -> crate::rules::IdleDecision {
        let ctx = IdleContext {
            queue: self.queue.name().to_string(),
            idle_count,
            active_tasks: self.counters.active_tasks.load(Ordering::Relaxed),
            min_interval_ms: self.settings.min_polling_interval.as_millis() as u64,
            max_interval_ms: self.settings.max_polling_interval.as_millis() as u64,
            push_enabled: self.push_enabled(),
            timestamp_ms: self.clock.now_ms(),
            random: self.random(),
        };
        let decision = self.ask_rule(ctx, QueueRules::decide_queue_empty, native_queue_empty, built_in_queue_empty).await;
        self.counters.record_queue_empty(decision);
        decision.value
    }

    /// Asks the queue's rule, off the async threads (rules are synchronous and may block up
    /// to their deadline). The built-in rule decides when the queue has no rule, or when the
    /// call's thread panicked.
    async fn ask_rule<I, T>(
        &self,
        input: I,
        call: fn(&QueueRules, &I) -> Decision<T>,
        native: fn(&dyn NativeRule, &I) -> Decision<T>,
        built_in: fn(&I, DecisionSource) -> Decision<T>,
    ) -> Decision<T>
    where
        I: Clone + Send + 'static,
        T: Send + 'static,
    {
        if let Some(rule) = &self.native {
            // In-process and fast: no blocking thread, but a panic is still contained.
            return match std::panic::catch_unwind(AssertUnwindSafe(|| native(&**rule, &input))) {
                Ok(decision) => decision,
                Err(panic) => {
                    self.counters.rule_call_panics.fetch_add(1, Ordering::Relaxed);
                    tracing::error!("the native rule {} panicked; the built-in rule decided instead: {}", rule.name(), panic_message(&*panic));
                    built_in(&input, DecisionSource::Fallback)
                }
            };
        }
        let Some(rules) = self.rules.clone() else {
            return built_in(&input, DecisionSource::BuiltIn);
        };
        let call_input = input.clone();
        match tokio::task::spawn_blocking(move || call(&rules, &call_input)).await {
            Ok(decision) => decision,
            Err(error) => {
                self.rule_call_failed(&error);
                built_in(&input, DecisionSource::Fallback)
            }
        }
    }

    /// A rule call's blocking task panicked or was cancelled: the built-in rule decides.
    fn rule_call_failed(&self, error: &tokio::task::JoinError) {
        self.counters.rule_call_panics.fetch_add(1, Ordering::Relaxed);
        let reason = if error.is_panic() { "panicked" } else { "was cancelled" };
        tracing::error!("a rule call {reason}; the built-in rule decided instead: {error}");
    }

    async fn run_scaler(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = self.work.notified() => {}
                _ = self.stopping.cancelled() => return,
            }
            self.scale().await;
            // Coalesce raises: at most one decision per scale interval.
            tokio::select! {
                _ = tokio::time::sleep(self.settings.scale_interval) => {}
                _ = self.stopping.cancelled() => return,
            }
        }
    }

    async fn scale(self: &Arc<Self>) {
        let depth = match self.queue.approximate_count().await {
            Ok(depth) => depth,
            Err(error) => {
                tracing::warn!("approximate count failed, scaling on the last known depth: {error}");
                self.counters.last_depth.load(Ordering::Relaxed)
            }
        };
        self.counters.record_depth(depth, SystemTime::now());
        *self.depth_counted.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(tokio::time::Instant::now());
        let window = self.counters.take_window();
        let state = QueueState {
            queue: self.queue.name().to_string(),
            approximate_depth: depth,
            in_flight: self.counters.in_flight.load(Ordering::Relaxed),
            active_tasks: self.counters.active_tasks.load(Ordering::Relaxed),
            min_tasks: self.floor(),
            max_tasks: self.settings.max_tasks,
            throughput_per_sec: window.throughput_per_sec,
            mean_handler_latency_ms: window.mean_handler_latency_ms,
            recent_failures: window.failures,
            push_enabled: self.push_enabled(),
            timestamp_ms: self.clock.now_ms(),
            random: self.random(),
        };
        let decision = self.ask_rule(state, QueueRules::decide_task_count, native_task_count, built_in_task_count).await;
        self.counters.record_task_count(decision);
        let target = decision.value;
        self.counters.target_tasks.store(target, Ordering::Relaxed);
        // Idle tasks asleep in their back-off count as active: wake as many as the backlog
        // can keep busy, then start the rest.
        let busy_enough = depth.div_ceil(self.settings.batch_size as u64).min(target as u64);
        for _ in 0..busy_enough {
            self.wake.notify_one();
        }
        let active = self.counters.active_tasks.load(Ordering::Relaxed);
        if target > active {
            tracing::debug!(depth, active, target, source = ?decision.source, "starting dequeue tasks");
            self.start_tasks(target - active);
        }
    }
}
