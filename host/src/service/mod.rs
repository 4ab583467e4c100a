//! The service: what a host runs, assembled from its configuration. The embedded store, the
//! rules and their watcher, each queue's client stack ([`QueueStack`]) and handle
//! ([`QueueHandle`]), one listener per storage queue, the bus, health and readiness.
//!
//! Opening a service starts no work: [`Service::start_work`] does, once the host's ports
//! are bound (see [`crate::host`]). A queue whose storage does not answer at start-up is
//! not ready (`/readyz`) and is retried with back-off; its listeners start when it answers.

mod assembly;
mod audit;
mod handle;
pub mod packing;
mod pauses;
pub mod poison;
mod replies;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

pub use assembly::claim_store;
use assembly::store_of_claims;
use assembly::text_envelopes;
pub(crate) use assembly::{QueueStack, StackOptions, storage_queue};
pub(crate) use audit::record_timed_resumes;
pub use audit::{AuditLog, AuditTail};
pub use handle::QueueHandle;
pub use pauses::{Pauses, check_pause_length};

use crate::bus::Bus;
use crate::config::{Backend, BusConfig, Config, QueueConfig};
use crate::handler::{Handler, HttpHandler};
use crate::health::{Health, Readiness, ReadinessPart};
use crate::listener::{Listener, ListenerStatus, QueueSettings};
use crate::log_limit::LogLimiter;
use crate::names::DecisionSite;
use crate::payload::claims::ClaimRecords;
use crate::queue::embedded::{EmbeddedOptions, EmbeddedStore};
use crate::queue::{QueueError, RetryPolicy, SystemClock};
use crate::record::{QueueRecording, Recorder};
use crate::rules::{Decider, QueueRuleConfig, QueueRules, RuleEngine, RuleLoad, RuleSet, RuleWatcher, SHADOW_CHANNEL_CAPACITY, Shadowed};

/// Debounce of rule file events.
pub(crate) const RULE_DEBOUNCE: Duration = Duration::from_millis(30);

/// The longest a shutdown waits for the rules' threads (a compile at start-up or after a
/// swap, a rebuild after a fault): a compile cannot be interrupted, and a large rule (Python,
/// on an empty cache) compiles for seconds. A thread still running then is left to end on
/// its own, with a warning; it changes nothing the stopped host reads.
pub(crate) const RULE_THREADS_BOUND: Duration = Duration::from_secs(10);

/// The longest one attempt to create a queue in storage may take (at start-up, and each
/// background retry; its transient errors retried within it): storage that accepts
/// connections and never answers leaves the queue not ready, not the host waiting.
pub const START_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Back-off between start-up attempts on storage that does not answer: from the first to
/// the longest.
const START_RETRY_MIN: Duration = Duration::from_millis(500);
const START_RETRY_MAX: Duration = Duration::from_secs(10);

/// The Rust handlers of a program embedding ebb, by queue name.
pub(crate) type Handlers = BTreeMap<String, Arc<dyn Handler>>;

/// What a host does with its queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `ebb run`: dequeue tasks, handler calls, the rules deciding.
    Worker,
    /// `ebb scaler`: watches the queues for KEDA without processing: no listener, no
    /// handler call. Sends and notifications through its API still reach every host.
    Watcher,
}

/// What every host mode opens first: its health, the embedded store, the rules folder
/// (created if missing) and the rule engine with its compiled-rule cache.
pub(crate) struct HostParts {
    pub health: Health,
    pub store: EmbeddedStore,
    pub rules_dir: std::path::PathBuf,
    pub engine: Arc<RuleEngine>,
}

impl HostParts {
    pub fn open(config: &Config) -> Result<HostParts> {
        config.check_folders()?;
        let health = Health::default();
        let wait_for_owner = crate::queue::embedded::OWNER_WAIT;
        let options = EmbeddedOptions { max_message_bytes: config.max_message_bytes, clock: Arc::new(SystemClock), health: health.clone(), wait_for_owner };
        let store = EmbeddedStore::open(&config.data_dir, options)?;
        std::fs::create_dir_all(&config.rules_dir).with_context(|| format!("failed to create rules folder {}", config.rules_dir.display()))?;
        let rules_dir = config.rules_dir.canonicalize()?;
        let engine = RuleEngine::new(config.rule_limits.clone(), Some(config.data_dir.join("rule-cache")))?;
        Ok(HostParts { health, store, rules_dir, engine })
    }
}

/// One logical queue of the service.
pub struct ServiceQueue {
    /// Its configuration.
    pub config: QueueConfig,
    /// Its clients.
    pub stack: QueueStack,
    /// Its handle (send, notify, work events).
    pub handle: QueueHandle,
}

/// An opened service.
pub struct Service {
    role: Role,
    drain_timeout: Duration,
    health: Health,
    readiness: Readiness,
    store: EmbeddedStore,
    rules: Arc<RuleSet>,
    /// Taken (and so stopped) by [`Service::shutdown`].
    watcher: std::sync::Mutex<Option<RuleWatcher>>,
    queues: BTreeMap<String, ServiceQueue>,
    bus: Option<Arc<Bus>>,
    stop: CancellationToken,
    tasks: TaskTracker,
    /// Each queue's arrivals recording, and the task writing it (stopped last, after the
    /// listeners, so what they saw while draining is written).
    recorder: Arc<Recorder>,
    recorder_stop: CancellationToken,
    recorder_task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Service {
    /// Opens the store, loads and watches the rules, assembles every queue and its handle
    /// and (for a worker) its listeners, and starts the bus. Touches no queue in storage
    /// and starts no dequeue task: see [`Service::start_work`].
    /// A worker's queue with a Rust handler in `handlers` calls it; every other queue posts
    /// to its `handler.url`.
    pub async fn open(config: &Config, role: Role, handlers: &Handlers) -> Result<Service> {
        check_handlers(config, role, handlers)?;
        let HostParts { health, store, rules_dir, engine } = HostParts::open(config)?;
        let rules = Arc::new(RuleSet::new(engine, decision_sites(config, role, &rules_dir)));
        rules.load_all_in_background();
        let watcher = rules.watch(&rules_dir, RULE_DEBOUNCE)?;
        let readiness = Readiness::default();
        let pauses = open_pauses(config)?;
        let mut recorder = Recorder::new();
        let opening = QueueOpening { config, role, handlers, store: &store, rules: &rules, readiness: &readiness, pauses: &pauses };
        let mut queues = BTreeMap::new();
        for queue_config in &config.queues {
            queues.insert(queue_config.name.to_string(), opening.open(queue_config, &mut recorder)?);
        }
        let bus = start_bus_of(config.bus.as_ref(), &queues)?;
        Ok(Service {
            role,
            drain_timeout: config.drain_timeout,
            health,
            readiness,
            store,
            rules,
            watcher: std::sync::Mutex::new(Some(watcher)),
            queues,
            bus,
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
            recorder: Arc::new(recorder),
            recorder_stop: CancellationToken::new(),
            recorder_task: std::sync::Mutex::new(None),
        })
    }

    /// Creates every queue in storage where missing and starts its listeners: the queues at
    /// once, each attempt bounded by [`START_ATTEMPT_TIMEOUT`]. A fatal storage error (a
    /// wrong key, a missing permission) fails, naming the queue; a queue whose storage does
    /// not answer (in time) is marked not ready and retried in the background with back-off,
    /// and its listeners start when it answers.
    pub async fn start_work(&self) -> Result<()> {
        {
            let mut recorder_task = self.recorder_task.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if !self.recorder.is_empty() && recorder_task.is_none() {
                *recorder_task = Some(self.recorder.clone().spawn(self.recorder_stop.clone()));
            }
        }
        let attempts = self.queues.values().map(|queue| async move { (queue, create_within_bound(&queue.stack).await) });
        for (queue, created) in futures::future::join_all(attempts).await {
            match created {
                Ok(()) => self.queue_started(queue),
                Err(error) if error.is_transient() => {
                    self.not_reachable(queue, &error);
                    let retry = StartRetry { queue: queue.handle.clone(), stack: queue.stack.clone(), service: self.starter() };
                    let span = tracing::info_span!("start_retry", queue = %queue.config.name);
                    self.tasks.spawn(retry.run().instrument(span));
                }
                Err(error) => return Err(anyhow::Error::new(error).context(format!("failed to create queue {}", queue.config.name))),
            }
        }
        if self.role == Role::Worker {
            self.start_claim_sweepers();
            self.start_reply_sweepers();
        }
        Ok(())
    }

    /// One claim-check sweeper per storage queue (`claim_sweep_interval`,
    /// `claim_check_retention`), stopped with the service. Many hosts on one Azure queue
    /// each sweep: a delete of a blob another host removed first is no error.
    fn start_claim_sweepers(&self) {
        for queue in self.queues.values() {
            for partition in queue.config.storage_queues() {
                let name = partition.as_str();
                let records = queue.handle.claim_records().cloned().unwrap_or_default();
                match claim_store(&queue.config.backend, Some(&self.store), name, &queue.config.claims, &records) {
                    Ok(store) => drop(self.tasks.spawn(crate::payload::claims::sweeper_task(name, store, &queue.config.claims, self.stop.clone()))),
                    // An Azure account without a blob endpoint (Azurite without BlobEndpoint):
                    // nothing can have been offloaded there.
                    Err(error) => tracing::info!(queue = %name, "no claim-check sweeper: {error:#}"),
                }
            }
        }
    }

    /// One sweeper per reply queue (`reply_ttl`), stopped with the service: answers nobody
    /// waits for are deleted once they outlive it.
    fn start_reply_sweepers(&self) {
        for queue in self.queues.values() {
            if let Some(reader) = queue.handle.reply_reader().filter(|reader| reader.handled_by().is_none()) {
                let task = replies::sweeper_task(queue.config.name.to_string(), reader.clone(), queue.config.payload.reply_ttl, self.stop.clone());
                drop(self.tasks.spawn(task));
            }
        }
    }

    fn starter(&self) -> Starter {
        Starter { readiness: self.readiness.clone(), health: self.health.clone(), stop: self.stop.clone(), role: self.role }
    }

    fn queue_started(&self, queue: &ServiceQueue) {
        self.starter().started(&queue.handle);
    }

    fn not_reachable(&self, queue: &ServiceQueue, error: &QueueError) {
        self.readiness.set_problem(&queue.config.name, ReadinessPart::Storage, &format!("{error}"));
        tracing::warn!(queue = %queue.config.name, "storage does not answer at start-up: {error}; retrying in the background (the queue is not ready)");
    }

    /// What the host does with its queues.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The service's queues, by logical name.
    pub fn queues(&self) -> &BTreeMap<String, ServiceQueue> {
        &self.queues
    }

    /// Every queue's handle, by logical name.
    pub fn handles(&self) -> BTreeMap<String, QueueHandle> {
        self.queues.iter().map(|(name, q)| (name.clone(), q.handle.clone())).collect()
    }

    /// Every queue's listeners, by logical name (none on a watcher).
    pub fn listeners(&self) -> BTreeMap<String, Vec<Listener>> {
        self.queues.iter().map(|(name, q)| (name.clone(), q.handle.listeners().to_vec())).collect()
    }

    /// The process's health (`/healthz`).
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// Each queue's readiness (`/readyz`).
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// The bus, when configured.
    pub fn bus(&self) -> Option<&Arc<Bus>> {
        self.bus.as_ref()
    }

    /// The rules of every queue.
    pub fn rules(&self) -> &Arc<RuleSet> {
        &self.rules
    }

    /// Every storage queue's state (one per partition).
    pub fn status(&self) -> Vec<ListenerStatus> {
        self.queues.values().flat_map(|q| q.handle.listeners().iter().map(Listener::status)).collect()
    }

    /// A queue's approximate depth now, read without counting a storage transaction
    /// (for displays; the listener's own counts are metered).
    pub async fn depth(&self, queue: &str) -> Result<u64> {
        use crate::queue::QueueClient as _;
        Ok(self.store.queue(queue).approximate_count().await?)
    }

    /// Stops everything it can without waiting: start-up retries, the listeners (messages in
    /// flight are released, not drained), the bus. The tasks end soon after on their own,
    /// and with them their hold on the store. For a host dropped without
    /// [`Service::shutdown`].
    pub fn stop_now(&self) {
        self.stop.cancel();
        self.close_reply_waits();
        self.tasks.close();
        for listener in self.queues.values().flat_map(|q| q.handle.listeners()) {
            listener.stop_now();
        }
        if let Some(bus) = &self.bus {
            bus.stop();
        }
        self.recorder_stop.cancel();
    }

    /// Ends the API's waits for replies at once (answered 503): a wait holds its request open
    /// up to 30 s, longer than a drain may take.
    fn close_reply_waits(&self) {
        for reader in self.queues.values().filter_map(|q| q.handle.reply_reader()) {
            reader.close("the host is shutting down: wait for the reply through another host, or once this one is back");
        }
    }

    /// Stops start-up retries, ends waits for replies, stops dequeuing, drains in-flight messages (releasing what
    /// outlasts the drain timeout, and telling the other hosts on the bus), stops the bus and the rules' threads (the watcher, a
    /// compile in progress: waited for up to [`RULE_THREADS_BOUND`]), and waits for all of it.
    /// Borrowed, not consumed, so a caller bounding it in time can still [`Service::stop_now`].
    pub async fn shutdown(&self) {
        self.stop.cancel();
        self.close_reply_waits();
        self.tasks.close();
        self.tasks.wait().await;
        let drain = self.drain_timeout;
        // Each queue tells the other hosts of what its listeners released; the bus is still
        // up, and its shutdown publishes what is queued before it stops.
        futures::future::join_all(self.queues.values().map(|q| q.handle.shutdown_listeners(drain))).await;
        if let Some(bus) = &self.bus {
            bus.shutdown().await;
        }
        self.recorder_stop.cancel();
        let recorder_task = self.recorder_task.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(task) = recorder_task {
            let _ = task.await;
        }
        drop(self.watcher.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take());
        let rules = self.rules.clone();
        let left = tokio::task::spawn_blocking(move || rules.stop_threads(RULE_THREADS_BOUND)).await.unwrap_or_else(|_| self.rules.running_threads());
        if left > 0 {
            tracing::warn!(
                threads = left,
                "rule threads still running {} after shutdown (a compile in progress); leaving them to end",
                humantime::format_duration(RULE_THREADS_BOUND)
            );
        }
    }
}

/// Refuses a Rust handler for a queue the configuration does not have, and (a worker) a
/// queue with neither a Rust handler nor a `handler.url`.
fn check_handlers(config: &Config, role: Role, handlers: &Handlers) -> Result<()> {
    if let Some(unknown) = handlers.keys().find(|name| !config.queues.iter().any(|q| q.name.as_str() == name.as_str())) {
        anyhow::bail!("a Rust handler is given for queue {unknown}, which the configuration does not have");
    }
    if role == Role::Worker {
        config.check_handlers(&|queue| handlers.contains_key(queue))?;
    }
    Ok(())
}

/// The pauses kept in the data directory. One kept for a queue the configuration no longer
/// has is kept (it applies if the queue comes back), with a warning.
fn open_pauses(config: &Config) -> Result<Arc<Pauses>> {
    let pauses = Arc::new(Pauses::open(&config.data_dir)?);
    for stray in pauses.queues().into_iter().filter(|name| !config.queues.iter().any(|q| q.name == name.as_str())) {
        tracing::warn!(queue = %stray, "paused.json holds a pause for a queue the configuration does not have; it is kept, and applies if the queue comes back");
    }
    Ok(pauses)
}

/// What opening each queue of a service shares.
struct QueueOpening<'a> {
    config: &'a Config,
    role: Role,
    handlers: &'a Handlers,
    store: &'a EmbeddedStore,
    rules: &'a Arc<RuleSet>,
    readiness: &'a Readiness,
    pauses: &'a Arc<Pauses>,
}

impl QueueOpening<'_> {
    /// `queue`'s client stack, its listeners (a worker's), its handle and its readiness
    /// checks; its recording, if it records, is added to `recorder`.
    fn open(&self, queue: &QueueConfig, recorder: &mut Recorder) -> Result<ServiceQueue> {
        let recording = queue.record_max_bytes.map(|max| recorder.add(&self.config.data_dir, &queue.name, max, Arc::new(SystemClock)));
        let open = |name: &str| storage_queue(&queue.backend, Some(self.store), name);
        let options = StackOptions { metered: true, retry: Some(RetryPolicy::default()), readiness: Some(self.readiness.clone()) };
        let stack = QueueStack::assemble(queue, &open, &options)?;
        let claim_records = ClaimRecords::default();
        let listeners = match self.role {
            Role::Worker => self.listeners(queue, &stack, recording.as_ref(), &claim_records)?,
            Role::Watcher => Vec::new(),
        };
        let handle = self.handle(queue, &stack, &claim_records, listeners, recording);
        self.add_readiness_checks(queue);
        Ok(ServiceQueue { config: queue.clone(), stack, handle })
    }

    /// A worker's listeners on `queue` (see [`worker_listeners`]).
    fn listeners(
        &self,
        queue: &QueueConfig,
        stack: &QueueStack,
        recording: Option<&Arc<QueueRecording>>,
        claim_records: &ClaimRecords,
    ) -> Result<Vec<Listener>> {
        let claims_of = |name: &str| store_of_claims(queue, Some(self.store), name, claim_records);
        let handler = self.handlers.get(queue.name.as_str());
        worker_listeners(queue, handler, stack, self.rules, self.config.bus.is_some(), recording, &claims_of)
    }

    /// `queue`'s handle: its producer (see [`QueueStack::producer`]) waking `listeners`,
    /// with the service's pauses, the poison and reply queues and the recording.
    fn handle(
        &self,
        queue: &QueueConfig,
        stack: &QueueStack,
        claim_records: &ClaimRecords,
        listeners: Vec<Listener>,
        recording: Option<Arc<QueueRecording>>,
    ) -> QueueHandle {
        let mut builder = stack.producer(queue, Some(self.store), claim_records).listeners(listeners).pauses(self.pauses.clone()).poison(stack.poison.clone());
        if let Some(reply) = &stack.reply {
            // A reply queue that is another configured queue's storage queue is a pipeline's.
            let handled_by = self.config.queues.iter().find(|other| other.storage_queues().iter().any(|s| s.as_str() == reply.name()));
            builder = match handled_by {
                Some(other) => builder.handled_reply(reply.clone(), &other.name),
                None => builder.reply(reply.clone(), queue.payload.reply_ttl),
            };
        }
        match recording {
            Some(recording) => builder.recording(recording).build(),
            None => builder.build(),
        }
    }

    /// Not ready until its storage has answered (see [`Service::start_work`]), nor while its
    /// rule is compiling or cannot load (the built-in rule decides meanwhile).
    fn add_readiness_checks(&self, queue: &QueueConfig) {
        self.readiness.set_problem(&queue.name, ReadinessPart::Storage, "storage not reached yet");
        let slots: Vec<QueueRules> =
            decision_site_names(queue, self.role, self.config.scaler.is_some()).iter().filter_map(|slot| self.rules.queue(slot)).collect();
        self.readiness.add_check(&queue.name, ReadinessPart::Rule, move || slots.iter().find_map(rule_problem));
    }
}

/// What a background start-up retry needs of the service.
#[derive(Clone)]
struct Starter {
    readiness: Readiness,
    health: Health,
    stop: CancellationToken,
    role: Role,
}

impl Starter {
    fn started(&self, handle: &QueueHandle) {
        if self.readiness.clear_problem(handle.name(), ReadinessPart::Storage) {
            tracing::info!(queue = %handle.name(), "storage answers: the queue is ready");
        }
        if self.role == Role::Worker {
            for listener in handle.listeners() {
                listener.start();
                tracing::info!(queue = %listener.queue_name(), "listening");
            }
        }
    }
}

/// Retries a queue's creation until its storage answers, then starts it.
struct StartRetry {
    queue: QueueHandle,
    stack: QueueStack,
    service: Starter,
}

impl StartRetry {
    async fn run(self) {
        let limiter = LogLimiter::new(1, Duration::from_secs(30));
        let mut delay = START_RETRY_MIN;
        loop {
            let wait = delay.mul_f64(0.5 + fastrand::f64() / 2.0);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.service.stop.cancelled() => return,
            }
            let created = tokio::select! {
                created = create_within_bound(&self.stack) => created,
                () = self.service.stop.cancelled() => return,
            };
            match created {
                Ok(()) => return self.service.started(&self.queue),
                Err(error) if error.is_transient() => {
                    self.service.readiness.set_problem(self.queue.name(), ReadinessPart::Storage, &format!("{error}"));
                    delay = delay.saturating_mul(2).min(START_RETRY_MAX);
                    if let Some(suppressed) = limiter.allow() {
                        tracing::warn!(suppressed, "storage still does not answer: {error}; next try within {}", humantime::format_duration(delay));
                    }
                }
                Err(error) => {
                    // A wrong key or a lost permission after start: nothing a retry fixes.
                    let reason = format!("failed to create queue {}: {error}", self.queue.name());
                    self.service.readiness.set_problem(self.queue.name(), ReadinessPart::Storage, &reason);
                    self.service.health.set_problem(&format!("queue {}", self.queue.name()), crate::health::truncate_reason(&reason));
                    tracing::error!("{reason}; the queue stays stopped until the host restarts");
                    return;
                }
            }
        }
    }
}

/// `stack`'s creation, a transient error once it outlasts [`START_ATTEMPT_TIMEOUT`].
async fn create_within_bound(stack: &QueueStack) -> Result<(), QueueError> {
    match tokio::time::timeout(START_ATTEMPT_TIMEOUT, stack.create_if_missing()).await {
        Ok(created) => created,
        Err(_) => Err(QueueError::Transient(anyhow::anyhow!("storage did not answer within {}", humantime::format_duration(START_ATTEMPT_TIMEOUT)))),
    }
}

/// The decision sites: a worker decides per storage queue (each partition on its own state;
/// queues with the same file and parameters share one instance); with the KEDA scaler on,
/// one more per logical queue, for the whole queue.
fn decision_sites(config: &Config, role: Role, rules_dir: &std::path::Path) -> Vec<QueueRuleConfig> {
    let mut slots = Vec::new();
    for q in &config.queues {
        for slot in decision_site_names(q, role, config.scaler.is_some()) {
            // Only listeners' decisions have a shadow: the scaler's site has none.
            if role == Role::Worker && !slot.is_scaler() {
                slots.extend(q.shadow_rule_config(&slot, rules_dir));
            }
            slots.push(q.rule_config(slot, rules_dir));
        }
    }
    slots
}

/// The decision sites of `queue` on a host of `role` (see [`decision_sites`]).
fn decision_site_names(queue: &QueueConfig, role: Role, scaler: bool) -> Vec<DecisionSite> {
    let mut names: Vec<DecisionSite> = if role == Role::Worker { queue.storage_queues().into_iter().map(DecisionSite::from).collect() } else { Vec::new() };
    if scaler {
        names.push(DecisionSite::scaler(&queue.name));
    }
    names
}

/// Why a queue's decision site is not ready, if it is not.
fn rule_problem(rules: &QueueRules) -> Option<String> {
    match rules.load_state() {
        RuleLoad::BuiltIn | RuleLoad::Loaded => None,
        RuleLoad::Compiling => Some("its rule is compiling (the built-in rule decides meanwhile)".into()),
        RuleLoad::Failed(reason) => Some(format!("its rule cannot load (the built-in rule decides): {reason}")),
    }
}

/// A worker's listeners on `queue`, one per partition, not started; `claims_of` gives a
/// storage queue's claim store, if it can have one.
fn worker_listeners(
    queue: &QueueConfig,
    handler: Option<&Arc<dyn Handler>>,
    stack: &QueueStack,
    rules: &RuleSet,
    with_bus: bool,
    recording: Option<&Arc<QueueRecording>>,
    claims_of: &dyn Fn(&str) -> Option<Arc<dyn crate::payload::claims::ClaimStore>>,
) -> Result<Vec<Listener>> {
    let handler: Arc<dyn Handler> = match (handler, &queue.handler_url) {
        (Some(handler), _) => handler.clone(),
        (None, Some(url)) => Arc::new(HttpHandler::new(url.clone(), queue.handler_timeout)?),
        (None, None) => anyhow::bail!("queues.{}.handler: not set", queue.name),
    };
    let mut listeners = Vec::new();
    let partitioned = stack.partitions.len() > 1;
    for (index, partition) in stack.partitions.iter().enumerate() {
        let name = partition.client.name().to_string();
        let queue_rules = rules.queue(&name).with_context(|| format!("queue {name} has no rule slot"))?;
        let live: Arc<dyn Decider> = Arc::new(queue_rules);
        let decider: Arc<dyn Decider> = match rules.queue(&DecisionSite::new(&name)?.shadow()) {
            Some(shadow) => Arc::new(Shadowed::new(&name, live, Arc::new(shadow), SHADOW_CHANNEL_CAPACITY)?),
            None => live,
        };
        let mut builder = Listener::builder(partition.client.clone(), stack.poison.clone(), handler.clone())
            .decider(decider)
            .settings(QueueSettings { poison_envelope: matches!(queue.backend, Backend::Embedded), ..queue.settings.clone() })
            .payload(queue.payload.clone(), text_envelopes(&queue.backend));
        if let Some(claims) = claims_of(&name) {
            builder = builder.claims(claims);
        }
        if let Some(reply) = &stack.reply {
            builder = builder.reply_queue(reply.clone());
        }
        if partitioned {
            builder = builder.partition(index);
        }
        if let Some(transactions) = &partition.transactions {
            builder = builder.transactions(transactions.clone());
        }
        if let Some(recording) = recording {
            builder = builder.recording(recording.clone());
        }
        let listener = builder.build();
        if with_bus {
            // Until the bus is subscribed, other hosts' pushes cannot arrive: poll.
            listener.set_push_available(false);
        }
        listeners.push(listener);
    }
    Ok(listeners)
}

/// The bus, when `config` configures one, subscribed to every queue's channel; each
/// handle publishes on it from now on.
fn start_bus_of(config: Option<&BusConfig>, queues: &BTreeMap<String, ServiceQueue>) -> Result<Option<Arc<Bus>>> {
    let Some(config) = config else {
        return Ok(None);
    };
    let bus = Arc::new(start_bus(config, queues)?);
    for queue in queues.values() {
        queue.handle.attach_bus(bus.clone());
    }
    Ok(Some(bus))
}

/// Subscribes to every queue's channel: a trigger reaches the queue's handle (which wakes
/// its listeners and watchers); the bus's state tells the listeners whether pushes can arrive.
fn start_bus(config: &BusConfig, queues: &BTreeMap<String, ServiceQueue>) -> Result<Bus> {
    let engine = config.engine()?;
    let handles: BTreeMap<String, QueueHandle> = queues.iter().map(|(name, q)| (name.clone(), q.handle.clone())).collect();
    let listeners: Vec<Listener> = handles.values().flat_map(|h| h.listeners().to_vec()).collect();
    let names = handles.keys().cloned().collect();
    let deliver: crate::bus::Deliver = Arc::new(move |trigger| {
        tracing::debug!(queue = %trigger.queue, count = ?trigger.count, delay_ms = ?trigger.delay_ms, "push notification");
        if let Some(handle) = handles.get(&trigger.queue) {
            handle.delivered(trigger.count, Duration::from_millis(trigger.delay_ms.unwrap_or(0)));
        }
    });
    let available: crate::bus::Availability = Arc::new(move |available| listeners.iter().for_each(|l| l.set_push_available(available)));
    Ok(Bus::start(engine, &config.channel_prefix, names, deliver, available))
}
