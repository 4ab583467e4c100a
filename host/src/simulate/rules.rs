//! The rules a simulation compares: built-in baselines and WASM rule files.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::listener::QueueSettings;
use crate::rules::{BuiltInRule, Decider, IdleContext, IdleDecision, NativeRule, QueueState, RuleSet};

/// The built-in names `--rule` takes.
pub(crate) const BUILT_INS: &[&str] = &["fixed-1s", "functions", "lambda-esm", "paper", "paper-push"];

/// The rules compared when none is named: each backend's consumers of choice beside ebb's
/// defaults (Azure Functions' trigger on Azure, Lambda's event source mapping on SQS).
pub(crate) fn defaults_for(backend: super::SimBackend) -> &'static [&'static str] {
    if backend.is_sqs() { &["fixed-1s", "lambda-esm", "paper", "paper-push"] } else { &["fixed-1s", "functions", "paper", "paper-push"] }
}

/// One rule to simulate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleChoice {
    /// The paper's naive listener: one thread, a get every second.
    Fixed1s,
    /// Azure Functions' queue trigger: one poller per instance, batches of 16, a delay that
    /// starts at 100 ms and doubles (±20 % jitter) up to 60 s after each empty get.
    Functions,
    /// AWS Lambda's SQS event source mapping (standard mode), as [`LambdaEsm`] models it.
    LambdaEsm,
    /// The built-in rule (the paper's), pull: at least one task polls.
    Paper,
    /// The built-in rule with push: zero idle tasks, the publisher notifies, a safety poll
    /// each hour.
    PaperPush,
    /// A rule component, with the default queue settings (pull).
    Wasm(RuleFile),
    /// A rule component with push, as `paper-push` (`push:FILE.wasm`).
    WasmPush(RuleFile),
    /// What a configured queue runs (`--config --queue`): its rule file and `rule_params`,
    /// or the built-in rule (`None`), with the queue's settings.
    Live(Option<RuleFile>),
}

/// A rule component and the parameters its `configure` is given (a queue's `rule_params`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleFile {
    /// The component (.wasm).
    pub path: PathBuf,
    /// Its parameters, in the order given.
    pub params: Vec<(String, String)>,
}

impl<P: Into<PathBuf>> From<P> for RuleFile {
    fn from(path: P) -> Self {
        RuleFile { path: path.into(), params: Vec::new() }
    }
}

impl RuleChoice {
    /// A built-in name, or a path to a `.wasm` file.
    pub fn parse(text: &str) -> Result<RuleChoice> {
        Ok(match text {
            "fixed-1s" => RuleChoice::Fixed1s,
            "functions" => RuleChoice::Functions,
            "lambda-esm" => RuleChoice::LambdaEsm,
            "paper" => RuleChoice::Paper,
            "paper-push" => RuleChoice::PaperPush,
            path if path.ends_with(".wasm") => match path.strip_prefix("push:") {
                Some(path) => RuleChoice::WasmPush(path.into()),
                None => RuleChoice::Wasm(path.into()),
            },
            other => bail!("--rule: {other:?} is neither a built-in ({}) nor a .wasm file (push:FILE.wasm with push)", BUILT_INS.join(", ")),
        })
    }

    /// Its name in reports.
    pub fn name(&self) -> String {
        match self {
            RuleChoice::Fixed1s => "fixed-1s".into(),
            RuleChoice::Functions => "functions".into(),
            RuleChoice::LambdaEsm => "lambda-esm".into(),
            RuleChoice::Paper => "paper".into(),
            RuleChoice::PaperPush => "paper-push".into(),
            RuleChoice::Wasm(rule) => rule_name(rule),
            RuleChoice::WasmPush(rule) => format!("{} (push)", rule_name(rule)),
            RuleChoice::Live(Some(rule)) => format!("live: {}", rule_name(rule)),
            RuleChoice::Live(None) => "live: built-in".into(),
        }
    }

    /// Whether the publisher notifies the listener of each arrival (push).
    pub fn push(&self) -> bool {
        matches!(self, RuleChoice::PaperPush | RuleChoice::WasmPush(_))
    }

    /// The rule component and its parameters, if the rule is one.
    pub fn wasm(&self) -> Option<&RuleFile> {
        match self {
            RuleChoice::Wasm(rule) | RuleChoice::WasmPush(rule) | RuleChoice::Live(Some(rule)) => Some(rule),
            _ => None,
        }
    }

    /// The same rule with `params` for its `configure`; a built-in takes none.
    pub fn with_params(self, params: Vec<(String, String)>) -> Result<RuleChoice> {
        if params.is_empty() {
            return Ok(self);
        }
        match self {
            RuleChoice::Wasm(rule) => Ok(RuleChoice::Wasm(RuleFile { params, ..rule })),
            RuleChoice::WasmPush(rule) => Ok(RuleChoice::WasmPush(RuleFile { params, ..rule })),
            built_in => bail!("--param: the built-in rule {} takes no parameters (they are for a rule component's configure)", built_in.name()),
        }
    }

    /// The listener settings the rule runs with. The baselines model pollers that wait for
    /// their batch's calls before the next get (`wait_for_batch`): the paper's naive loop,
    /// Lambda's pollers (a synchronous invocation per batch) and Functions' (which gets the
    /// next batch when half of one is left: a little sooner than modelled).
    pub fn settings(&self) -> QueueSettings {
        let defaults = QueueSettings::default();
        match self {
            RuleChoice::Fixed1s => QueueSettings {
                min_tasks: 1,
                max_tasks: 1,
                min_polling_interval: Duration::from_secs(1),
                max_polling_interval: Duration::from_secs(1),
                wait_for_batch: true,
                ..defaults
            },
            RuleChoice::Functions => QueueSettings {
                batch_size: 16,
                min_tasks: 1,
                max_tasks: 1,
                min_polling_interval: Duration::from_millis(100),
                max_polling_interval: Duration::from_secs(60),
                wait_for_batch: true,
                ..defaults
            },
            RuleChoice::LambdaEsm => QueueSettings {
                batch_size: LambdaEsm::BATCH,
                min_tasks: LambdaEsm::IDLE_POLLERS,
                max_tasks: LambdaEsm::MAX_POLLERS,
                min_polling_interval: LambdaEsm::WAIT,
                max_polling_interval: LambdaEsm::WAIT,
                // A poller invokes the function with its batch and waits for the answer.
                wait_for_batch: true,
                ..defaults
            },
            RuleChoice::Paper | RuleChoice::Wasm(_) | RuleChoice::Live(_) => defaults,
            RuleChoice::PaperPush | RuleChoice::WasmPush(_) => QueueSettings { min_tasks: 0, push_enabled: true, ..defaults },
        }
    }

    /// The settings on `backend`: on SQS, as the config reads an SQS queue's defaults, a get
    /// asks for at most 10, every idle delay is a whole long poll, 20 s
    /// ([`crate::config::sqs_polling_intervals`]), and a pickup waits 800 ms
    /// ([`crate::config::sqs_pickup_delay`]).
    pub fn settings_on(&self, backend: super::SimBackend) -> QueueSettings {
        let settings = self.settings();
        if !backend.is_sqs() {
            return settings;
        }
        let (min_polling_interval, max_polling_interval) = crate::config::sqs_polling_intervals(settings.min_polling_interval, settings.max_polling_interval);
        let max_pickup_delay = crate::config::sqs_pickup_delay(settings.max_pickup_delay);
        QueueSettings { batch_size: settings.batch_size.min(backend.get_batch()), min_polling_interval, max_polling_interval, max_pickup_delay, ..settings }
    }

    /// What decides: the baseline written in Rust, the rule component's slot in `rule_set`
    /// (loaded by the caller), or the built-in rule.
    pub fn decider(&self, rule_set: Option<&RuleSet>) -> Result<Arc<dyn Decider>> {
        Ok(match (self, rule_set) {
            (RuleChoice::Fixed1s, _) => Arc::new(FixedInterval { name: "fixed-1s", interval_ms: 1000 }),
            (RuleChoice::Functions, _) => Arc::new(FunctionsBackoff),
            (RuleChoice::LambdaEsm, _) => Arc::new(LambdaEsm::default()),
            (_, Some(set)) => Arc::new(set.queue(super::QUEUE).context("the rule set has no slot for the simulated queue")?),
            (_, None) => Arc::new(BuiltInRule),
        })
    }
}

/// The file's name, and its parameters when it has some: the same file with other
/// parameters is another rule in a comparison.
fn rule_name(rule: &RuleFile) -> String {
    let path = &rule.path;
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let params: Vec<String> = rule.params.iter().map(|(key, value)| format!("{key}={value}")).collect();
    if params.is_empty() { name } else { format!("{name} {}", params.join(" ")) }
}

/// One task that never stops, a fixed sleep after each empty get.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FixedInterval {
    /// Its name in reports.
    pub name: &'static str,
    /// The sleep after an empty get, in milliseconds.
    pub interval_ms: u64,
}

impl NativeRule for FixedInterval {
    fn name(&self) -> &str {
        self.name
    }
    fn optimal_dequeue_task_count(&self, _state: &QueueState) -> u32 {
        1
    }
    fn on_queue_empty(&self, _ctx: &IdleContext) -> IdleDecision {
        IdleDecision { delay_ms: self.interval_ms, stop: false }
    }
}

/// Azure Functions' polling (its `RandomizedExponentialBackoffStrategy`): after the n-th
/// empty get in a row, `min_interval × 2^n` with ±20 % jitter, at most `max_interval`;
/// the poller never stops and is always one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FunctionsBackoff;

impl NativeRule for FunctionsBackoff {
    fn name(&self) -> &str {
        "functions"
    }
    fn optimal_dequeue_task_count(&self, _state: &QueueState) -> u32 {
        1
    }
    fn on_queue_empty(&self, ctx: &IdleContext) -> IdleDecision {
        let jitter = ebb_rules_sdk::backoff::uniform(ctx.random, 0.8, 1.2);
        let doubled = ctx.min_interval_ms as f64 * 2f64.powi(ctx.idle_count.min(64) as i32) * jitter;
        let delay_ms = if doubled >= ctx.max_interval_ms as f64 { ctx.max_interval_ms } else { doubled.round() as u64 };
        IdleDecision { delay_ms, stop: false }
    }
}

/// AWS Lambda's SQS event source mapping in standard mode, from AWS's documentation
/// ("Configuring scaling behavior for SQS event source mappings", and the event source
/// mapping's parameters): "For standard queues, Lambda uses long polling to poll a queue
/// until it becomes active. When messages are available, Lambda starts processing five
/// batches at a time with five concurrent invocations of your function. If messages are
/// still available, Lambda increases the number of processes that are reading batches by up
/// to 300 more instances per minute", at most 1,000 batches at once; `BatchSize` 10 and
/// `MaximumBatchingWindowInSeconds` 0 by default. How many pollers it keeps when idle is not
/// documented for standard mode: the model keeps 2, provisioned mode's documented minimum
/// (`MinimumPollers`, "default is 2, and minimum 2 required"), each long-polling 20 s.
#[derive(Debug, Default)]
pub(crate) struct LambdaEsm {
    /// When the pollers started growing (messages waiting), and how many there were then.
    ramp: Mutex<Option<(u64, u32)>>,
}

impl LambdaEsm {
    /// Messages per batch (the default `BatchSize`; no batching window).
    pub(crate) const BATCH: u32 = 10;
    /// Pollers kept long-polling when idle.
    pub(crate) const IDLE_POLLERS: u32 = 2;
    /// Pollers when messages become available.
    pub(crate) const FIRST_POLLERS: u32 = 5;
    /// Pollers added per minute at most while messages wait.
    pub(crate) const ADDED_PER_MINUTE: u64 = 300;
    /// Batches at once at most.
    pub(crate) const MAX_POLLERS: u32 = 1000;
    /// The long poll of an idle poller: SQS's longest.
    pub(crate) const WAIT: Duration = crate::queue::sqs::MAX_WAIT;
}

impl NativeRule for LambdaEsm {
    fn name(&self) -> &str {
        "lambda-esm"
    }

    /// Messages still waiting (the last receive came back full, or more are queued than in
    /// flight): 5 pollers, then up to 300 more a minute; otherwise as many as now (an idle
    /// poller retires down to 2).
    fn optimal_dequeue_task_count(&self, state: &QueueState) -> u32 {
        let mut ramp = self.ramp.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let waiting = state.last_get_messages >= state.batch_size.max(1) || state.approximate_depth > u64::from(state.in_flight);
        if !waiting {
            *ramp = None;
            return state.active_tasks.max(Self::IDLE_POLLERS);
        }
        let (since_ms, base) = *ramp.get_or_insert((state.timestamp_ms, state.active_tasks.max(Self::FIRST_POLLERS)));
        let added = state.timestamp_ms.saturating_sub(since_ms) * Self::ADDED_PER_MINUTE / 60_000;
        (u64::from(base) + added).min(u64::from(Self::MAX_POLLERS)) as u32
    }

    /// Long-polls again at once (the whole delay waits on SQS); a poller beyond the idle two stops.
    fn on_queue_empty(&self, ctx: &IdleContext) -> IdleDecision {
        IdleDecision { delay_ms: Self::WAIT.as_millis() as u64, stop: ctx.active_tasks > Self::IDLE_POLLERS }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_doubles_from_200ms_to_the_minute() {
        let ctx = |idle_count, random| IdleContext { idle_count, min_interval_ms: 100, max_interval_ms: 60_000, random, ..Default::default() };
        let mid = 1u64 << 63;
        assert_eq!(FunctionsBackoff.on_queue_empty(&ctx(1, mid)).delay_ms, 200);
        assert_eq!(FunctionsBackoff.on_queue_empty(&ctx(2, mid)).delay_ms, 400);
        assert_eq!(FunctionsBackoff.on_queue_empty(&ctx(1, 0)).delay_ms, 160, "−20 %");
        assert_eq!(FunctionsBackoff.on_queue_empty(&ctx(20, u64::MAX)).delay_ms, 60_000);
        assert_eq!(FunctionsBackoff.on_queue_empty(&ctx(u32::MAX, u64::MAX)).delay_ms, 60_000);
        assert!(!FunctionsBackoff.on_queue_empty(&ctx(30, 0)).stop);
    }

    #[test]
    fn lambda_starts_five_pollers_adds_three_hundred_a_minute_and_idles_at_two() {
        let esm = LambdaEsm::default();
        let busy = |timestamp_ms, active_tasks| QueueState {
            approximate_depth: 5000,
            batch_size: 10,
            last_get_messages: 10,
            active_tasks,
            timestamp_ms,
            ..Default::default()
        };
        assert_eq!(esm.optimal_dequeue_task_count(&busy(1_000, 2)), 5);
        assert_eq!(esm.optimal_dequeue_task_count(&busy(11_000, 5)), 5 + 50, "300 a minute: 50 in 10 s");
        assert_eq!(esm.optimal_dequeue_task_count(&busy(1_000 + 3_600_000, 55)), 1000, "at most 1,000 batches");
        let drained = QueueState { batch_size: 10, last_get_messages: 3, active_tasks: 40, timestamp_ms: 3_700_000, ..Default::default() };
        assert_eq!(esm.optimal_dequeue_task_count(&drained), 40);
        assert_eq!(esm.optimal_dequeue_task_count(&busy(3_800_000, 40)), 40, "a new ramp starts from the pollers there are");
        let idle = |active_tasks| IdleContext { active_tasks, ..Default::default() };
        assert_eq!(esm.on_queue_empty(&idle(3)), IdleDecision { delay_ms: 20_000, stop: true });
        assert_eq!(esm.on_queue_empty(&idle(2)), IdleDecision { delay_ms: 20_000, stop: false });
        let settings = RuleChoice::LambdaEsm.settings();
        assert_eq!((settings.batch_size, settings.min_tasks, settings.max_polling_interval), (10, 2, Duration::from_secs(20)));
    }

    #[test]
    fn names_parse_and_others_are_refused() {
        for name in BUILT_INS {
            assert_eq!(RuleChoice::parse(name).unwrap().name(), *name);
        }
        assert_eq!(RuleChoice::parse("rules/my.wasm").unwrap(), RuleChoice::Wasm("rules/my.wasm".into()));
        let push = RuleChoice::parse("push:rules/my.wasm").unwrap();
        assert_eq!((push.name().as_str(), push.push(), push.settings().min_tasks), ("my.wasm (push)", true, 0));
        assert!(RuleChoice::parse("fixed-2s").is_err());
    }
}
