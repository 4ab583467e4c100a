//! KEDA's external scaler: the host serves `externalscaler.proto` (vendored from
//! kedacore/keda in `host/proto/`) so that the queue's rule, which decides how many dequeue
//! tasks a host runs, also decides how many instances (pods) the cluster runs.
//!
//! - The metric of a queue is *desired instances* = ⌈the rule's task count for the queue's
//!   total state ÷ tasks one instance runs (the queue's `max_tasks`)⌉, at most
//!   `[scaler] max_instances`. The state is summed over the queue's partitions. The metric's
//!   target is 1, so KEDA's HPA (metric type `AverageValue`) runs exactly that many.
//! - A queue is *active* when messages are queued or in flight, or work was detected in the
//!   last [`ACTIVITY_HOLD`]. `StreamIsActive` sends `true` the moment work is detected (a
//!   send through the API, a push notification, a dequeue task finding messages), not at
//!   KEDA's next poll.
//! - Answers come from the host's live state: no storage call per request (the listener's
//!   status reads the embedded store's free count, or the last count on Azure), and the rule
//!   is asked at most once per [`METRIC_CACHE`] per unchanged state, for at most the rule
//!   call deadline (past it, the last answer or the built-in rule's stands).
//!
//! [`Scaler`] holds the queues; [`serve`] runs the gRPC server; `ebb scaler` (no
//! processing, queues counted every `poll_interval`) is [`start`] on a watcher service; with
//! a bus, it also wakes push queues whose count shows messages no worker was told of (see
//! [`wake`]).

mod grpc;
mod proto;
mod start;
#[cfg(test)]
mod tests;
mod wake;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::config::QueueConfig;
pub use crate::config::ScalerSettings;
use crate::listener::Listener;
use crate::queue::{FailureClass, QueueClient};
use crate::rules::{Decider, Decision, DecisionSource, DepthSource, QueueState, built_in_task_count};

pub use grpc::{MAX_CONNECTIONS, MAX_STREAMS, serve};
pub use proto::external_scaler_client::ExternalScalerClient;
pub use proto::{GetMetricsRequest, IsActiveResponse, ScaledObjectRef};
pub use start::{RunningScaler, start};

/// A queue stays active this long after work was last detected, even when its depth reads
/// 0 (a count on Azure may be older than the message that just arrived).
pub const ACTIVITY_HOLD: Duration = Duration::from_secs(5);
/// How long a metric answer is reused while the queue's state and rule are unchanged.
pub const METRIC_CACHE: Duration = Duration::from_secs(1);
/// The metric's throughput and latency are measured over windows of at least this long.
const WINDOW: Duration = Duration::from_secs(1);

/// Where a queue's live state comes from.
pub enum Source {
    /// This host's listeners (one per partition).
    Listeners(Vec<Listener>),
    /// `ebb scaler`: counts of the storage queues, refreshed by a watcher.
    Counted(Arc<Counted>),
}

/// The last counts of a queue's storage queues (`ebb scaler`).
pub struct Counted {
    partitions: Vec<Arc<dyn QueueClient>>,
    depths: Vec<AtomicU64>,
}

impl Counted {
    /// Counts of `partitions`, all 0 until counted.
    pub fn new(partitions: Vec<Arc<dyn QueueClient>>) -> Counted {
        let depths = partitions.iter().map(|_| AtomicU64::new(0)).collect();
        Counted { partitions, depths }
    }

    /// Counts every partition now (one storage call each; billed on Azure) and returns the
    /// total. A failed count keeps that partition's last figure (and is logged), except
    /// where the queue does not exist: it holds nothing.
    pub async fn count(&self) -> u64 {
        for (partition, depth) in self.partitions.iter().zip(&self.depths) {
            match partition.approximate_count().await {
                Ok(count) => depth.store(count, Ordering::Relaxed),
                Err(error) if error.failure_class() == Some(FailureClass::Missing) => {
                    depth.store(0, Ordering::Relaxed);
                    tracing::warn!(partition = partition.name(), "count failed: the queue does not exist, so the scaler counts 0: {error}");
                }
                Err(error) => tracing::warn!(partition = partition.name(), "count failed; the scaler keeps the last count: {error}"),
            }
        }
        self.depths.iter().map(|d| d.load(Ordering::Relaxed)).fold(0, u64::saturating_add)
    }
}

/// The state the metric and activity are computed from, summed over partitions.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Snapshot {
    /// Messages in the queue (visible or not).
    pub depth: u64,
    /// Messages being handled on this host.
    pub in_flight: u32,
    /// Dequeue tasks running on this host.
    pub active_tasks: u32,
    processed: u64,
    failed: u64,
    handler_time: Duration,
}

/// The metric's answer for one queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InstanceMetric {
    /// Desired instances: ⌈`tasks` ÷ tasks per instance⌉, at most `max_instances`.
    pub instances: u32,
    /// The rule's task count for the whole queue (clamped to 0..=tasks per instance × max instances).
    pub tasks: u32,
    /// Who decided.
    pub source: DecisionSource,
    /// True when the rule did not answer within its deadline and an earlier answer stands.
    pub stale: bool,
    /// True when the queue is paused: no demand, whatever its depth (the rule is not asked).
    pub paused: bool,
}

#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    processed: u64,
    failed: u64,
    handler_time: Duration,
}

#[derive(Default)]
struct Window {
    previous: Option<Sample>,
    throughput_per_sec: f64,
    mean_handler_latency_ms: f64,
    failures: u32,
}

/// What a cached answer was computed from.
#[derive(Clone, PartialEq)]
struct CacheKey {
    depth: u64,
    in_flight: u32,
    rule: Option<String>,
    quarantined: bool,
}

struct Cached {
    at: Instant,
    key: CacheKey,
    metric: InstanceMetric,
}

/// One logical queue, as the scaler sees it.
pub struct ScalerQueue {
    name: String,
    source: Source,
    rules: Arc<dyn Decider>,
    push_enabled: bool,
    batch_size: u32,
    tasks_per_instance: u32,
    max_instances: u32,
    call_deadline: Duration,
    work: watch::Sender<u64>,
    /// The queue's pause on this host, when the scaler is told of it.
    pause: Option<watch::Receiver<Option<crate::listener::Pause>>>,
    last_work: Mutex<Option<Instant>>,
    window: Mutex<Window>,
    cache: Arc<Mutex<Option<Cached>>>,
    deciding: Arc<tokio::sync::Mutex<()>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ScalerQueue {
    /// The scaler's view of `config`'s queue: its state from `source`, its decisions from
    /// `rules` decide (the decision site [`crate::names::DecisionSite::scaler`] names, or the
    /// built-in rule).
    pub fn new(config: &QueueConfig, source: Source, rules: Arc<dyn Decider>, settings: &ScalerSettings, call_deadline: Duration) -> ScalerQueue {
        ScalerQueue {
            name: config.name.to_string(),
            source,
            rules,
            push_enabled: config.settings.push_enabled,
            batch_size: config.settings.batch_size,
            tasks_per_instance: config.settings.max_tasks.max(1),
            max_instances: settings.max_instances.max(1),
            call_deadline,
            work: watch::Sender::new(0),
            pause: None,
            last_work: Mutex::new(None),
            window: Mutex::default(),
            cache: Arc::new(Mutex::new(None)),
            deciding: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// The queue's (logical) name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Watches the queue's pause: while it holds, the queue has no demand.
    pub fn with_pause(mut self, pause: watch::Receiver<Option<crate::listener::Pause>>) -> ScalerQueue {
        self.pause = Some(pause);
        self
    }

    /// Whether the queue is paused now.
    pub fn is_paused(&self) -> bool {
        let now_ms = crate::queue::Clock::now_ms(&crate::queue::SystemClock);
        self.pause.as_ref().is_some_and(|pause| pause.borrow().is_some_and(|p| p.holds_at(now_ms)))
    }

    /// Work was detected: the queue is active now, and every `StreamIsActive` hears so.
    pub fn note_work(&self) {
        *lock(&self.last_work) = Some(Instant::now());
        self.work.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Work-detected events, as a counter that goes up.
    pub fn work_events(&self) -> watch::Receiver<u64> {
        self.work.subscribe()
    }

    /// The queue's state now, summed over its partitions. Never a storage call: the
    /// listeners' status (the embedded store's free count, or the last count on Azure), or
    /// the watcher's last counts.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::default();
        match &self.source {
            Source::Listeners(listeners) => {
                for listener in listeners {
                    let status = listener.status();
                    s.depth = s.depth.saturating_add(status.approximate_depth);
                    s.in_flight = s.in_flight.saturating_add(status.in_flight);
                    s.active_tasks = s.active_tasks.saturating_add(status.active_tasks);
                    s.processed = s.processed.saturating_add(status.processed);
                    s.failed = s.failed.saturating_add(status.failed);
                    s.handler_time = s.handler_time.saturating_add(listener.handler_time());
                }
            }
            Source::Counted(counted) => {
                // A free local read where there is one (the embedded store), else the last count.
                s.depth = counted
                    .partitions
                    .iter()
                    .zip(&counted.depths)
                    .map(|(partition, last)| partition.local_count().unwrap_or_else(|| last.load(Ordering::Relaxed)))
                    .fold(0, u64::saturating_add);
            }
        }
        s
    }

    /// Whether the queue has work: messages queued or in flight, or work detected within
    /// [`ACTIVITY_HOLD`].
    pub fn is_active(&self) -> bool {
        if self.is_paused() {
            return false;
        }
        let s = self.snapshot();
        s.depth > 0 || s.in_flight > 0 || lock(&self.last_work).is_some_and(|at| at.elapsed() < ACTIVITY_HOLD)
    }

    /// The queue's state as the rule sees it, for the whole cluster: the totals of
    /// [`ScalerQueue::snapshot`], recent throughput and latency, `min_tasks` 0 and
    /// `max_tasks` = tasks per instance × `max_instances`.
    fn rule_state(&self, s: &Snapshot) -> QueueState {
        let now = Sample { at: Instant::now(), processed: s.processed, failed: s.failed, handler_time: s.handler_time };
        let mut window = lock(&self.window);
        match window.previous {
            None => window.previous = Some(now),
            Some(previous) if now.at.duration_since(previous.at) >= WINDOW => {
                let seconds = now.at.duration_since(previous.at).as_secs_f64();
                let processed = now.processed.saturating_sub(previous.processed);
                let failed = now.failed.saturating_sub(previous.failed);
                let finished = processed.saturating_add(failed);
                window.throughput_per_sec = processed as f64 / seconds;
                window.mean_handler_latency_ms =
                    if finished > 0 { now.handler_time.saturating_sub(previous.handler_time).as_secs_f64() * 1e3 / finished as f64 } else { 0.0 };
                window.failures = failed.min(u32::MAX as u64) as u32;
                window.previous = Some(now);
            }
            Some(_) => {}
        }
        QueueState {
            queue: self.name.clone(),
            approximate_depth: s.depth,
            in_flight: s.in_flight,
            active_tasks: s.active_tasks,
            min_tasks: 0,
            max_tasks: self.tasks_per_instance.saturating_mul(self.max_instances),
            throughput_per_sec: window.throughput_per_sec,
            mean_handler_latency_ms: window.mean_handler_latency_ms,
            recent_failures: window.failures,
            push_enabled: self.push_enabled,
            timestamp_ms: SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
            random: fastrand::u64(..),
            // The cluster's state comes from the last counts and the listeners' status, not
            // from gets or arrivals of its own: contract 0.2.0's fields say so.
            last_get_messages: 0,
            batch_size: self.batch_size,
            arrivals_per_sec: 0.0,
            oldest_message_age_ms: None,
            depth_source: DepthSource::Inferred,
        }
    }

    fn metric_of(&self, decision: Decision<u32>, stale: bool) -> InstanceMetric {
        instance_metric(decision, self.tasks_per_instance, self.max_instances, stale)
    }

    /// Desired instances now. Asks the rule at most once per [`METRIC_CACHE`] while the
    /// state and the rule are unchanged (concurrent callers share one call), and waits for
    /// it at most the rule call deadline: past that, the last answer stands (or the built-in
    /// rule's, when there is none) and the call finishes in the background, holding back
    /// further calls until it does.
    pub async fn metric(&self) -> InstanceMetric {
        if self.is_paused() {
            return InstanceMetric { instances: 0, tasks: 0, source: DecisionSource::BuiltIn, stale: false, paused: true };
        }
        let snapshot = self.snapshot();
        let rule = self.rules.status();
        let key = CacheKey {
            depth: snapshot.depth,
            in_flight: snapshot.in_flight,
            rule: rule.as_ref().and_then(|r| r.sha256.clone()),
            quarantined: rule.as_ref().is_some_and(|r| r.quarantined),
        };
        if let Some(metric) = self.cached(&key) {
            return metric;
        }
        let state = self.rule_state(&snapshot);
        let rules = self.rules.clone();
        if !rules.may_block() {
            return self.remember(key, self.metric_of(rules.decide_task_count(&state), false));
        }
        let deadline = Instant::now() + self.call_deadline;
        let Ok(guard) = tokio::time::timeout_at(deadline, self.deciding.clone().lock_owned()).await else {
            return self.stale(&state);
        };
        // Another caller may have answered while this one waited.
        if let Some(metric) = self.cached(&key) {
            return metric;
        }
        let call_state = state.clone();
        let (cache, per_instance, max_instances) = (self.cache.clone(), self.tasks_per_instance, self.max_instances);
        // The answer is cached by the call itself: one that ends after its caller gave up
        // still serves the next callers, rather than a second call being made.
        let call = tokio::task::spawn_blocking(move || {
            let _one_call_at_a_time = guard;
            let metric = instance_metric(rules.decide_task_count(&call_state), per_instance, max_instances, false);
            *lock(&cache) = Some(Cached { at: Instant::now(), key, metric });
            metric
        });
        match tokio::time::timeout_at(deadline, call).await {
            Ok(Ok(metric)) => {
                tracing::debug!(queue = %self.name, depth = snapshot.depth, tasks = metric.tasks, instances = metric.instances, source = ?metric.source, "scaler metric");
                metric
            }
            Ok(Err(error)) => {
                tracing::error!(queue = %self.name, "the scaler's rule call failed; the built-in rule decided: {error}");
                self.metric_of(built_in_task_count(&state, DecisionSource::Fallback), false)
            }
            Err(_) => self.stale(&state),
        }
    }

    fn cached(&self, key: &CacheKey) -> Option<InstanceMetric> {
        let cache = lock(&self.cache);
        cache.as_ref().filter(|c| &c.key == key && c.at.elapsed() < METRIC_CACHE).map(|c| c.metric)
    }

    fn remember(&self, key: CacheKey, metric: InstanceMetric) -> InstanceMetric {
        *lock(&self.cache) = Some(Cached { at: Instant::now(), key, metric });
        metric
    }

    /// The rule did not answer in time: the last answer, else the built-in rule's.
    fn stale(&self, state: &QueueState) -> InstanceMetric {
        tracing::debug!(queue = %self.name, "the rule did not answer within its deadline; the scaler answers with its last metric");
        match lock(&self.cache).as_ref() {
            Some(cached) => InstanceMetric { stale: true, ..cached.metric },
            None => InstanceMetric { stale: true, ..self.metric_of(built_in_task_count(state, DecisionSource::BuiltIn), false) },
        }
    }
}

/// ⌈`decision` ÷ `per_instance`⌉ instances, at most `max_instances`.
fn instance_metric(decision: Decision<u32>, per_instance: u32, max_instances: u32, stale: bool) -> InstanceMetric {
    let instances = decision.value.div_ceil(per_instance.max(1)).min(max_instances);
    InstanceMetric { instances, tasks: decision.value, source: decision.source, stale, paused: false }
}

/// Every queue the scaler answers for, and the tasks that feed their work events.
pub struct Scaler {
    queues: BTreeMap<String, Arc<ScalerQueue>>,
    token: Option<String>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl Scaler {
    /// A scaler for `queues`. For listener-backed queues, starts forwarding the listeners'
    /// work-detected events; stops with [`Scaler::stop`].
    pub fn new(queues: Vec<ScalerQueue>, token: Option<String>) -> Arc<Scaler> {
        let scaler = Arc::new(Scaler {
            queues: queues.into_iter().map(|q| (q.name.clone(), Arc::new(q))).collect(),
            token,
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        for queue in scaler.queues.values() {
            if let Source::Listeners(listeners) = &queue.source {
                for listener in listeners {
                    scaler.forward_events(queue.name(), listener.work_events());
                }
            }
        }
        scaler
    }

    /// Makes the work-detected events of `events` (a listener's task finding messages; a
    /// queue handle's sends, notifications and bus triggers) work detected on queue `name`,
    /// until [`Scaler::stop`].
    pub fn forward_events(&self, name: &str, mut events: watch::Receiver<u64>) {
        let Some(queue) = self.queues.get(name).cloned() else { return };
        let stop = self.stop.clone();
        let span = tracing::info_span!("scaler_work_events", queue = %name);
        self.tasks.spawn(
            async move {
                loop {
                    tokio::select! {
                        changed = events.changed() => if changed.is_err() { return },
                        () = stop.cancelled() => return,
                    }
                    queue.note_work();
                }
            }
            .instrument(span),
        );
    }

    /// The queue named `name`.
    pub fn queue(&self, name: &str) -> Option<&Arc<ScalerQueue>> {
        self.queues.get(name)
    }

    /// The queues' names.
    pub fn queue_names(&self) -> Vec<&str> {
        self.queues.keys().map(String::as_str).collect()
    }

    /// Ends every stream and forwarding task, without waiting (a dropped host).
    pub fn stop_now(&self) {
        self.stop.cancel();
        self.tasks.close();
    }

    /// Ends every stream and forwarding task, and waits for them.
    pub async fn stop(&self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}
