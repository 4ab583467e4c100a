//! `ebb simulate`: the real listener (its tasks, the rules, the decorators, the metering)
//! over the in-memory queue under tokio's paused clock, so a simulated day takes seconds.
//!
//! Each rule runs on its own current-thread runtime whose clock starts paused: whenever
//! every task waits, tokio moves the clock to the next timer. The in-memory queue reads
//! the same clock ([`TokioClock`]), so leases and visibility follow simulated time. A WASM
//! rule's calls run on tokio's blocking pool, which holds the clock still while they run
//! (a call takes real microseconds and no simulated time); its deadline is real time.
//!
//! A producer puts each arrival's messages at its time (and, for push rules, notifies the
//! listener as a publisher would); the handler sleeps a handler time drawn from the
//! distribution and records the pickup latency (arrival → handler start).

mod backend;
pub(crate) mod bench;
pub(crate) mod chart;
pub(crate) mod floor;
pub mod knee;
pub(crate) mod report;
pub(crate) mod rules;
pub mod scenario;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use async_trait::async_trait;
use serde::Serialize;

use crate::cost::PAPER_PRICE_PER_10K;
use crate::handler::{Handler, IncomingMessage};
use crate::listener::Listener;
use crate::names::{DecisionSite, QueueName};
use crate::queue::memory::MemoryQueue;
use crate::queue::{QueueClient, RetryPolicy, TokioClock, TransactionCounts};
use crate::rules::{QueueRuleConfig, RuleEngine, RuleLimits, RuleSet};
use crate::service::{QueueStack, StackOptions};

pub use backend::SimBackend;
pub(crate) use floor::Floor;
pub use rules::{RuleChoice, RuleFile};
pub(crate) use scenario::DEFAULT_HANDLER_TIME;
pub use scenario::{Arrival, HandlerTime, Scenario, Workload};

/// The simulated queue's name.
pub const QUEUE: &str = "simulated";
/// The simulated queue's poison queue.
const POISON_QUEUE: &str = "simulated-poison";
/// Most listeners `--listeners` takes.
pub(crate) const MAX_LISTENERS: u64 = 1_000_000;
/// Most rules in one run.
pub(crate) const MAX_RULES: usize = 16;
/// Points per rule in the chart (and in `--json`'s samples).
pub(crate) const SAMPLES: u32 = 720;
/// How often, in simulated time, a run looks at the real clock (`--max-wall`).
const WALL_CHECK: Duration = Duration::from_secs(1);

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// The arrivals and the run's length.
    pub workload: Workload,
    /// The rules to compare, each in a run of its own.
    pub rules: Vec<RuleChoice>,
    /// The handler's time per message.
    pub handler_time: HandlerTime,
    /// Listeners the monthly cost is given for (each on its own queue, all alike).
    pub listeners: u64,
    /// The backend modelled: its limits, its floor (and its price by default).
    pub backend: SimBackend,
    /// US dollars per 10,000 transactions.
    pub price_per_10k: f64,
    /// Seed of every random choice (jitter, handler times).
    pub seed: u64,
    /// Notify the listener of each arrival for every rule (as the HTTP API does), not
    /// only for push rules.
    pub notify: bool,
    /// Real time one rule's run may take before it is stopped with an error.
    pub max_wall: Duration,
    /// The safety poll of push rules (default: the config's default).
    pub safety_poll: Option<Duration>,
    /// The floor's wait budget W: the longest a message may wait for a get.
    pub wait_budget: Duration,
    /// The app slows down past this many calls at once (see `scenario::knee_latency`);
    /// `None`: its latency does not depend on concurrency.
    pub handler_knee: Option<u32>,
    /// The queue's `max_concurrent_calls`; `None`: the queue's own, as `ebb run` has it (the
    /// host's default, or the configured queue's with `queue_settings`).
    pub max_concurrent_calls: Option<u32>,
    /// The settings of a configured queue (`--config --queue`): every rule then runs with
    /// them (push included) instead of its own; `None`: each rule's own.
    pub queue_settings: Option<crate::listener::QueueSettings>,
    /// The limits rules run under (a configuration's `[rule_limits]`); `None`: the defaults.
    pub rule_limits: Option<RuleLimits>,
    /// Where compiled rule components are kept between runs (`ebb simulate` uses the user's
    /// compile cache, as `ebb rule check` does); `None` compiles each time.
    pub rule_cache: Option<PathBuf>,
}

impl SimOptions {
    /// Options for `workload` with these rules and the defaults: handler times of
    /// `DEFAULT_HANDLER_TIME`, the host's queue defaults, 1 listener, Azure at the paper's
    /// price, seed 1.
    pub fn new(workload: Workload, rules: Vec<RuleChoice>) -> SimOptions {
        SimOptions {
            workload,
            rules,
            handler_time: DEFAULT_HANDLER_TIME,
            listeners: 1,
            backend: SimBackend::Azure,
            price_per_10k: PAPER_PRICE_PER_10K,
            seed: 1,
            notify: false,
            max_wall: Duration::from_secs(600),
            safety_poll: None,
            wait_budget: floor::DEFAULT_WAIT_BUDGET,
            handler_knee: None,
            max_concurrent_calls: None,
            queue_settings: None,
            rule_limits: None,
            rule_cache: None,
        }
    }

    fn check(&self) -> Result<()> {
        if self.rules.is_empty() {
            bail!("--rule: name at least one rule");
        }
        if self.rules.len() > MAX_RULES {
            bail!("--rule: at most {MAX_RULES} rules in one run, got {}", self.rules.len());
        }
        if !(1..=MAX_LISTENERS).contains(&self.listeners) {
            bail!("--listeners: must be 1 to {MAX_LISTENERS}, got {}", self.listeners);
        }
        if !(self.price_per_10k.is_finite() && (0.0..=crate::config::MAX_PRICE_PER_10K).contains(&self.price_per_10k)) {
            bail!("--price: must be 0 to {} US dollars per 10,000 transactions, got {}", crate::config::MAX_PRICE_PER_10K, self.price_per_10k);
        }
        if let Some(interval) = self.safety_poll
            && !(Duration::from_secs(1)..=crate::config::MAX_SAFETY_POLL).contains(&interval)
        {
            bail!("--safety-poll: must be 1s to {}, got {}", scenario::show_duration(crate::config::MAX_SAFETY_POLL), scenario::show_duration(interval));
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&self.max_wall) {
            bail!("--max-wall: must be 1s to 1h, got {}", humantime::format_duration(self.max_wall));
        }
        floor::check_wait_budget(self.wait_budget)?;
        if let Some(knee) = self.handler_knee
            && !(1..=scenario::MAX_HANDLER_KNEE).contains(&knee)
        {
            bail!("--handler-knee: must be 1 to {} calls, got {knee}", scenario::MAX_HANDLER_KNEE);
        }
        if let Some(limit) = self.max_concurrent_calls
            && !(1..=crate::config::MAX_CONCURRENT_CALLS).contains(&limit)
        {
            bail!("--max-concurrent-calls: must be 1 to {}, got {limit}", crate::config::MAX_CONCURRENT_CALLS);
        }
        Ok(())
    }
}

/// A point of a rule's run, for the chart.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Simulated seconds from the start.
    pub t_secs: f64,
    /// The most messages in the queue (visible and leased) since the previous sample: a
    /// burst drained between two samples still shows.
    pub backlog: u64,
    /// Dequeue tasks running.
    pub tasks: u32,
    /// The most dequeue tasks that ran at once since the previous sample (a peak between
    /// two samples still shows).
    pub peak_tasks: u32,
    /// Pickup latency (arrival → handler start) of the messages picked up since the
    /// previous sample: the median; `None` when none was picked up.
    pub pickup_p50_ms: Option<u64>,
    /// The 99th percentile of the same pickups.
    pub pickup_p99_ms: Option<u64>,
    /// Billed transactions so far.
    pub transactions: u64,
    /// Consumer calls so far: billed transactions but puts.
    pub consumer_calls: u64,
}

/// Pickup latencies, arrival → handler start, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Latency {
    /// Median.
    pub p50_ms: u64,
    /// 99th percentile.
    pub p99_ms: u64,
    /// Longest.
    pub max_ms: u64,
}

/// One rule's result.
#[derive(Debug, Clone, Serialize)]
pub struct RuleReport {
    /// The rule's name.
    pub rule: String,
    /// Messages that arrived.
    pub messages: u64,
    /// Messages whose handling started before the end of the run.
    pub handled: u64,
    /// Every billed transaction.
    pub billed_transactions: u64,
    /// Of those, idle ones: empty gets, and counts that found the queue empty.
    pub idle_transactions: u64,
    /// The rest: puts, gets with messages, deletes, updates, counts that found messages, creates.
    pub useful_transactions: u64,
    /// Idle transactions per simulated hour.
    pub idle_transactions_per_hour: f64,
    /// By kind.
    pub transactions: TransactionCounts,
    /// What the consumer billed: every transaction but the puts.
    pub consumer_calls: u64,
    /// Consumer calls per message (`None` when no message arrived).
    pub calls_per_message: Option<f64>,
    /// The floor's consumer calls for the run's arrivals (the same for every rule).
    pub floor_calls: u64,
    /// `consumer_calls ÷ floor_calls` (`None` when the floor is 0: no message arrived).
    pub ratio_to_floor: Option<f64>,
    /// The floor's wait budget W, in milliseconds.
    pub wait_budget_ms: u64,
    /// Pickup latency (arrival → handler start) median, in milliseconds.
    pub pickup_p50_ms: Option<u64>,
    /// Its 99th percentile.
    pub pickup_p99_ms: Option<u64>,
    /// Its longest.
    pub pickup_max_ms: Option<u64>,
    /// A 30-day month of runs like this one for all the listeners, in US dollars (a run of
    /// up to a day is taken as a whole day's activity, as the paper counts its 22 idle
    /// hours; a longer run is averaged per day).
    pub usd_per_month: f64,
    /// The idle transactions' part of it.
    pub idle_usd_per_month: f64,
    /// The monthly cost of one listener.
    pub usd_per_month_per_listener: f64,
    /// Pickup latency; `None` when no message was handled.
    pub latency: Option<Latency>,
    /// Handler calls that ended in the run (retries included).
    pub completed_calls: u64,
    /// Of those, per simulated second.
    pub throughput_per_sec: f64,
    /// Handler latency (call start → end) median, in milliseconds.
    pub handler_p50_ms: Option<u64>,
    /// Its 99th percentile.
    pub handler_p99_ms: Option<u64>,
    /// Most handler calls at once.
    pub peak_handler_calls: u32,
    /// The handler concurrency limit at the end of the run.
    pub final_concurrency_limit: u32,
    /// Most dequeue tasks at once.
    pub peak_tasks: u32,
    /// Most messages in the queue at once.
    pub peak_backlog: u64,
    /// Safety polls made (push rules).
    pub safety_polls: u64,
    /// Simulated time, in seconds.
    pub simulated_secs: f64,
    /// Real time the run took, in seconds.
    pub wall_secs: f64,
    /// The run over time.
    pub samples: Vec<Sample>,
}

/// The whole result.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    /// The scenario's name, or the trace file's.
    pub scenario: String,
    /// Simulated seconds per run.
    pub duration_secs: f64,
    /// Messages in the scenario.
    pub messages: u64,
    /// The handler-time distribution.
    pub handler_time: String,
    /// Listeners the monthly cost is for.
    pub listeners: u64,
    /// The backend modelled (`azure`, `sqs`, `sqs-fifo`).
    pub backend: SimBackend,
    /// The price used.
    pub price_per_10k_transactions: f64,
    /// The seed.
    pub seed: u64,
    /// The floor's wait budget W, in milliseconds.
    pub wait_budget_ms: u64,
    /// The floor: the fewest consumer calls (a delete per message, gets of at most 32; on
    /// SQS a delete batch per 10 messages, receives of 10) that fetch every message within W
    /// of its arrival.
    pub floor_calls: u64,
    /// Of those, gets.
    pub floor_gets: u64,
    /// One per rule, in the order given.
    pub rules: Vec<RuleReport>,
    /// The floor's schedule, for the chart.
    #[serde(skip)]
    pub(crate) floor: Floor,
}

/// Runs every rule over the workload, one after the other.
pub fn run(options: &SimOptions) -> Result<SimReport> {
    options.check()?;
    let any_wasm = options.rules.iter().any(|r| r.wasm().is_some());
    let limits = options.rule_limits.clone().unwrap_or_default();
    let engine = if any_wasm { Some(rule_engine(limits, options.rule_cache.as_ref())?) } else { None };
    let backend = options.backend;
    let floor = floor::floor_of(&options.workload.arrivals, options.wait_budget, backend.get_batch(), backend.delete_batch());
    let mut reports = Vec::new();
    for rule in &options.rules {
        let mut report = run_rule(rule, engine.as_ref(), options).with_context(|| format!("simulating rule {}", rule.name()))?;
        report.floor_calls = floor.calls();
        report.ratio_to_floor = (floor.calls() > 0).then(|| report.consumer_calls as f64 / floor.calls() as f64);
        reports.push(report);
    }
    Ok(SimReport {
        scenario: options.workload.name.clone(),
        duration_secs: options.workload.duration.as_secs_f64(),
        messages: options.workload.messages(),
        handler_time: options.handler_time.to_string(),
        listeners: options.listeners,
        backend,
        price_per_10k_transactions: options.price_per_10k,
        seed: options.seed,
        wait_budget_ms: options.wait_budget.as_millis() as u64,
        floor_calls: floor.calls(),
        floor_gets: floor.gets,
        rules: reports,
        floor,
    })
}

/// The engine of a simulation: with the compile cache when it can be used, else without it
/// (compiling each time, and saying why).
fn rule_engine(limits: RuleLimits, cache: Option<&PathBuf>) -> Result<Arc<RuleEngine>> {
    if let Some(dir) = cache {
        match RuleEngine::new(limits.clone(), Some(dir.clone())) {
            Ok(engine) => return Ok(engine),
            Err(error) => tracing::warn!("no compile cache for the simulated rules ({error:#}); compiling them each time"),
        }
    }
    RuleEngine::new(limits, None)
}

fn run_rule(rule: &RuleChoice, engine: Option<&Arc<RuleEngine>>, options: &SimOptions) -> Result<RuleReport> {
    // A WASM rule is loaded (and rejected with the reason) before any time runs.
    let rule_set = match (rule.wasm(), engine) {
        (Some(file), Some(engine)) => {
            let path = file.path.canonicalize().with_context(|| format!("--rule: cannot open {}", file.path.display()))?;
            let set = RuleSet::new(engine.clone(), [QueueRuleConfig { slot: DecisionSite::new(QUEUE)?, rule: Some(path), params: file.params.clone() }]);
            if let Some(error) = set.load_all().into_iter().next() {
                return Err(error.context("--rule"));
            }
            Some(Arc::new(set))
        }
        _ => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build()?;
    let wall = std::time::Instant::now();
    let mut report = runtime.block_on(simulate(rule, rule_set, options, wall))?;
    report.wall_secs = wall.elapsed().as_secs_f64();
    Ok(report)
}

/// The handler of a simulation: sleeps a drawn handler time (longer past the knee, if any),
/// records pickup and handler latencies.
struct SimHandler {
    start: tokio::time::Instant,
    time: HandlerTime,
    knee: Option<u32>,
    rng: Mutex<fastrand::Rng>,
    latencies_ms: Mutex<Vec<u64>>,
    /// The pickup latencies since the last sample took them.
    recent_ms: Mutex<Vec<u64>>,
    handler_ms: Mutex<Vec<u64>>,
    handled: AtomicU64,
    calls: AtomicU32,
    peak_calls: AtomicU32,
}

impl SimHandler {
    fn new(start: tokio::time::Instant, options: &SimOptions) -> SimHandler {
        SimHandler {
            start,
            time: options.handler_time,
            knee: options.handler_knee,
            rng: Mutex::new(fastrand::Rng::with_seed(options.seed)),
            latencies_ms: Mutex::default(),
            recent_ms: Mutex::default(),
            handler_ms: Mutex::default(),
            handled: AtomicU64::new(0),
            calls: AtomicU32::new(0),
            peak_calls: AtomicU32::new(0),
        }
    }

    /// The pickup latencies recorded (taking them); `None` when no message was handled.
    fn pickup_latency(&self) -> Option<Latency> {
        let mut latencies = std::mem::take(&mut *self.latencies_ms.lock().unwrap());
        latencies.sort_unstable();
        (!latencies.is_empty()).then(|| Latency {
            p50_ms: percentile(&latencies, 50.0).unwrap_or(0),
            p99_ms: percentile(&latencies, 99.0).unwrap_or(0),
            max_ms: *latencies.last().unwrap_or(&0),
        })
    }

    /// The median and 99th percentile of the pickups since the last call (taking them).
    fn take_recent_pickups(&self) -> (Option<u64>, Option<u64>) {
        let mut recent = std::mem::take(&mut *self.recent_ms.lock().unwrap());
        recent.sort_unstable();
        (percentile(&recent, 50.0), percentile(&recent, 99.0))
    }

    /// The handler times recorded (taking them), sorted.
    fn handler_times_sorted(&self) -> Vec<u64> {
        let mut handler_ms = std::mem::take(&mut *self.handler_ms.lock().unwrap());
        handler_ms.sort_unstable();
        handler_ms
    }
}

/// A call counted among the handler's calls at once until it ends.
struct CallMark<'a>(&'a AtomicU32);

impl Drop for CallMark<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl Handler for SimHandler {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        let now_ms = self.start.elapsed().as_millis() as u64;
        let arrived_ms: u64 = std::str::from_utf8(&message.body).ok().and_then(|b| b.parse().ok()).unwrap_or(now_ms);
        if message.dequeue_count == 1 {
            let pickup_ms = now_ms.saturating_sub(arrived_ms);
            self.latencies_ms.lock().unwrap().push(pickup_ms);
            self.recent_ms.lock().unwrap().push(pickup_ms);
            self.handled.fetch_add(1, Ordering::Relaxed);
        }
        let calls = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let _mark = CallMark(&self.calls);
        self.peak_calls.fetch_max(calls, Ordering::Relaxed);
        let mut time = self.time.sample(&mut self.rng.lock().unwrap());
        if let Some(knee) = self.knee {
            time = scenario::knee_latency(time, calls, knee);
        }
        tokio::time::sleep(time).await;
        self.handler_ms.lock().unwrap().push(time.as_millis() as u64);
        Ok(())
    }
}

/// The `p`th percentile of sorted values.
fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    (!sorted.is_empty()).then(|| sorted[((p / 100.0 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1])
}

async fn simulate(rule: &RuleChoice, rule_set: Option<Arc<RuleSet>>, options: &SimOptions, wall: std::time::Instant) -> Result<RuleReport> {
    let start = tokio::time::Instant::now();
    let queue = SimQueue::assemble(options.backend).await?;
    let handler = Arc::new(SimHandler::new(start, options));
    let settings = settings_of(rule, options);
    let notify = options.notify || settings.push_enabled;
    let listener = Listener::builder(queue.logical.clone(), queue.poison.clone(), handler.clone())
        .decider(rule.decider(rule_set.as_deref())?)
        .settings(settings)
        .transactions(queue.transactions.clone())
        .clock(queue.clock.clone())
        .build();
    listener.start();
    let backlog = Arc::new(Backlog::default());
    let producer = spawn_producer(&queue, &listener, &backlog, options.workload.arrivals.clone(), notify, start);
    let run = Run { start, wall, queue: &queue, listener: &listener, handler: &handler, backlog: &backlog, producer: &producer };
    let samples = run.sample_to_the_end(options).await?;
    producer.abort();
    let end = End { status: listener.status(), counts: queue.transactions.snapshot(), peak_backlog: backlog.peak.load(Ordering::Relaxed) };
    listener.shutdown(Duration::from_secs(60)).await;
    Ok(rule_report(rule, options, &handler, end, samples))
}

/// The simulated queue, assembled as `ebb run` assembles a queue.
struct SimQueue {
    /// The storage queue itself, read for the backlog.
    memory: Arc<MemoryQueue>,
    /// The logical queue the listener and the producer use.
    logical: Arc<dyn QueueClient>,
    poison: Arc<dyn QueueClient>,
    transactions: Arc<crate::queue::Transactions>,
    /// The simulated clock, which the rules read too.
    clock: Arc<dyn crate::queue::Clock>,
}

impl SimQueue {
    async fn assemble(backend: SimBackend) -> Result<SimQueue> {
        let clock = Arc::new(TokioClock::new());
        let memory = Arc::new(MemoryQueue::new(QUEUE, clock.clone(), crate::defaults::MAX_MESSAGE_BYTES));
        let storage = backend.storage(memory.clone());
        let poison_memory = Arc::new(MemoryQueue::new(POISON_QUEUE, clock.clone(), crate::defaults::MAX_MESSAGE_BYTES));
        let poison_storage = backend.storage(poison_memory);
        let open = |name: &str| -> Result<Arc<dyn QueueClient>> { Ok(if name == POISON_QUEUE { poison_storage.clone() } else { storage.clone() }) };
        // The same stack as `ebb run`: retries around metering around the backend.
        let name = QueueName::new(QUEUE)?;
        let stack = QueueStack::assemble_named(
            &name,
            &name.partitions(1),
            &name.poison(),
            &open,
            &StackOptions { metered: true, retry: Some(RetryPolicy::default()), readiness: None },
        )?;
        stack.create_if_missing().await?;
        let transactions = stack.partitions[0].transactions.clone().context("the simulated queue is metered")?;
        Ok(SimQueue { memory, logical: stack.logical, poison: stack.poison, transactions, clock })
    }

    /// Messages in the queue now, visible and leased.
    fn backlog(&self) -> u64 {
        self.memory.local_count().unwrap_or(0)
    }
}

/// The settings the rule runs with: the configured queue's or the rule's own (on the
/// backend), with the run's seed and the options' overrides.
fn settings_of(rule: &RuleChoice, options: &SimOptions) -> crate::listener::QueueSettings {
    let own = options.queue_settings.clone().unwrap_or_else(|| rule.settings_on(options.backend));
    let mut settings = crate::listener::QueueSettings { random_seed: Some(options.seed), ..own };
    if let Some(interval) = options.safety_poll {
        settings.safety_poll = interval;
    }
    // Unless told otherwise, the queue's own bound, as `ebb run` has it (the host's default,
    // or the configured queue's).
    if let Some(limit) = options.max_concurrent_calls {
        settings.max_concurrent_calls = limit;
    }
    settings
}

/// The most messages seen in the queue: in the whole run, and since the last sample (so a
/// burst drained between two samples still shows).
#[derive(Default)]
struct Backlog {
    peak: AtomicU64,
    since_sample: AtomicU64,
}

impl Backlog {
    fn observe(&self, backlog: u64) {
        self.peak.fetch_max(backlog, Ordering::Relaxed);
        self.since_sample.fetch_max(backlog, Ordering::Relaxed);
    }

    /// The most since the last sample, `now` included; starts the next sample's count.
    fn take_sample(&self, now: u64) -> u64 {
        self.peak.fetch_max(now, Ordering::Relaxed);
        self.since_sample.swap(0, Ordering::Relaxed).max(now)
    }
}

/// Puts each arrival's messages at its time, each body its arrival time in milliseconds (for
/// the pickup latency), and notifies the listener when `notify`.
fn spawn_producer(
    queue: &SimQueue,
    listener: &Listener,
    backlog: &Arc<Backlog>,
    arrivals: Vec<Arrival>,
    notify: bool,
    start: tokio::time::Instant,
) -> tokio::task::JoinHandle<()> {
    let (logical, memory, listener, backlog) = (queue.logical.clone(), queue.memory.clone(), listener.clone(), backlog.clone());
    tokio::spawn(async move {
        for arrival in arrivals {
            tokio::time::sleep_until(start + arrival.at).await;
            let body = (start.elapsed().as_millis() as u64).to_string();
            for _ in 0..arrival.count {
                if let Err(error) = logical.put(body.as_bytes(), Duration::ZERO).await {
                    tracing::error!("simulated put failed: {error}");
                }
            }
            backlog.observe(memory.local_count().unwrap_or(0));
            if notify {
                // As a send through the API says: how many arrived.
                listener.messages_arrived(u64::from(arrival.count));
            }
        }
    })
}

/// A rule's run in progress, as its sampling loop sees it.
struct Run<'a> {
    start: tokio::time::Instant,
    /// When the run began in real time (for `--max-wall`).
    wall: std::time::Instant,
    queue: &'a SimQueue,
    listener: &'a Listener,
    handler: &'a SimHandler,
    backlog: &'a Backlog,
    producer: &'a tokio::task::JoinHandle<()>,
}

impl Run<'_> {
    /// Samples the run every step of simulated time until the workload's end; stops it with
    /// an error past `--max-wall`.
    async fn sample_to_the_end(&self, options: &SimOptions) -> Result<Vec<Sample>> {
        let duration = options.workload.duration;
        let step = (duration / SAMPLES).max(Duration::from_millis(100));
        let mut samples = Vec::with_capacity(SAMPLES as usize + 2);
        let mut at = Duration::ZERO;
        loop {
            samples.push(self.sample(at));
            if at >= duration {
                return Ok(samples);
            }
            let next = (at + step).min(duration);
            // Up to the next sample, look at the real clock each simulated second: a rule that
            // polls every millisecond may take long in real time to reach the next sample.
            while at < next {
                if self.wall.elapsed() > options.max_wall {
                    return Err(self.stop_past_max_wall(at, options).await);
                }
                at = (at + WALL_CHECK).min(next);
                tokio::time::sleep_until(self.start + at).await;
            }
        }
    }

    fn sample(&self, at: Duration) -> Sample {
        let status = self.listener.status();
        let backlog = self.backlog.take_sample(self.queue.backlog());
        let counts = self.queue.transactions.snapshot();
        let (pickup_p50_ms, pickup_p99_ms) = self.handler.take_recent_pickups();
        Sample {
            t_secs: at.as_secs_f64(),
            backlog,
            tasks: status.active_tasks,
            peak_tasks: self.listener.take_recent_peak_tasks(),
            pickup_p50_ms,
            pickup_p99_ms,
            transactions: counts.total(),
            consumer_calls: counts.total() - counts.puts,
        }
    }

    async fn stop_past_max_wall(&self, at: Duration, options: &SimOptions) -> anyhow::Error {
        self.producer.abort();
        self.listener.shutdown(Duration::ZERO).await;
        anyhow::anyhow!(
            "stopped after {} of real time at {} of {} simulated (--max-wall): the rule polls too often to simulate this long",
            humantime::format_duration(options.max_wall),
            humantime::format_duration(Duration::from_secs(at.as_secs())),
            scenario::show_duration(options.workload.duration)
        )
    }
}

/// What the listener and the queue say at the end of a run.
struct End {
    status: crate::listener::ListenerStatus,
    counts: TransactionCounts,
    peak_backlog: u64,
}

/// The rule's report from the run's figures (the floor is filled by [`run`], which knows it).
fn rule_report(rule: &RuleChoice, options: &SimOptions, handler: &SimHandler, end: End, samples: Vec<Sample>) -> RuleReport {
    let workload = &options.workload;
    let latency = handler.pickup_latency();
    let handler_ms = handler.handler_times_sorted();
    let days = (workload.duration.as_secs_f64() / 86_400.0).max(1.0);
    let monthly = |transactions: u64| crate::cost::usd(transactions as f64 / days * 30.0, options.price_per_10k);
    let End { status, counts, peak_backlog } = end;
    let billed = counts.total();
    let idle = counts.idle();
    let consumer_calls = billed - counts.puts;
    let messages = workload.messages();
    RuleReport {
        rule: rule.name(),
        messages,
        handled: handler.handled.load(Ordering::Relaxed),
        billed_transactions: billed,
        idle_transactions: idle,
        useful_transactions: billed - idle,
        idle_transactions_per_hour: idle as f64 / (workload.duration.as_secs_f64() / 3600.0),
        transactions: counts,
        consumer_calls,
        calls_per_message: (messages > 0).then(|| consumer_calls as f64 / messages as f64),
        // Filled by `run`, which knows the floor.
        floor_calls: 0,
        ratio_to_floor: None,
        wait_budget_ms: options.wait_budget.as_millis() as u64,
        pickup_p50_ms: latency.map(|l| l.p50_ms),
        pickup_p99_ms: latency.map(|l| l.p99_ms),
        pickup_max_ms: latency.map(|l| l.max_ms),
        usd_per_month: monthly(billed) * options.listeners as f64,
        idle_usd_per_month: monthly(idle) * options.listeners as f64,
        usd_per_month_per_listener: monthly(billed),
        latency,
        completed_calls: handler_ms.len() as u64,
        throughput_per_sec: handler_ms.len() as f64 / workload.duration.as_secs_f64(),
        handler_p50_ms: percentile(&handler_ms, 50.0),
        handler_p99_ms: percentile(&handler_ms, 99.0),
        peak_handler_calls: handler.peak_calls.load(Ordering::Relaxed),
        final_concurrency_limit: status.concurrency_limit,
        peak_tasks: status.peak_tasks,
        peak_backlog,
        safety_polls: status.safety_polls,
        simulated_secs: workload.duration.as_secs_f64(),
        wall_secs: 0.0,
        samples,
    }
}
