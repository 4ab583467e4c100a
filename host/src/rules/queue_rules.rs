//! One queue's rules and the rule group it belongs to: the shared instance, fallback to
//! the built-in rule on a fault, rebuilding off the decision path, and quarantine.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Result;
use ebb_rules_sdk::{FailureContext, FailureDecision, HandlerState, IdleContext, IdleDecision, QueueState, paper};
use serde::{Deserialize, Serialize};

use super::decision::{Decision, DecisionSource, clamp_concurrency, clamp_failure, clamp_idle, clamp_task_count};
use super::engine::{CompiledRule, RuleEngine};
use super::instance::RuleInstance;
use super::lock;
use super::stderr::OutputLogger;
use super::threads::RuleThreads;
use crate::log_limit::LogLimiter;
use crate::names::DecisionSite;
use crate::panics::panic_message;

/// A queue's rule, as `/status` reports it (`rule` of each queue). A [`super::Decider`] of
/// one's own builds it with `..Default::default()`, so that fields added later need no change.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RuleStatus {
    /// Where the queue's rule stands: `built-in` (no rule file, by choice), `compiling`,
    /// `loaded` (its rule decides), `quarantined` (its rule faulted too often; the built-in
    /// rule decides until the file's content changes) or `error` (the configured rule cannot
    /// load; the built-in rule decides until the file is fixed, and `error` says why).
    pub state: RuleState,
    /// Why the configured rule cannot load, when `state` is `error`.
    pub error: Option<String>,
    /// The rule file the configuration names (its path), loaded or not; `None` for the
    /// built-in rule.
    pub configured_file: Option<String>,
    /// The rule file's name, or `None` when the built-in rule decides.
    pub file: Option<String>,
    /// Hex sha256 of the rule in use.
    pub sha256: Option<String>,
    /// The contract version the rule in use was built for (`0.3.0`).
    #[serde(deserialize_with = "contract_from_wire")]
    pub contract: Option<Contract>,
    /// When the rule in use was loaded (RFC 3339 in JSON, like the other times of `/status`).
    #[serde(with = "humantime_serde")]
    pub loaded_at: Option<SystemTime>,
    /// Whether the rule is quarantined (the built-in decides until the file's content changes);
    /// `quarantine` says why and since when.
    pub quarantined: bool,
    /// Why and since when the rule in use is quarantined.
    pub quarantine: Option<Quarantine>,
    /// A newer content of the rule file that was refused (it failed to read, compile,
    /// validate or configure), while the rule in use (`file`, `sha256`) goes on deciding.
    pub refused: Option<RefusedFile>,
    /// The last swaps of the queue's rule (loads of a new content, removals), oldest first,
    /// at most 10.
    pub swaps: Vec<RuleSwap>,
    /// Decisions made for this queue, by any source.
    pub decisions: u64,
    /// This queue's calls in which the rule in use faulted (trap, deadline, fuel, memory,
    /// exit, or a host panic while calling it): the faults of that file's content only, so 0
    /// again when a new content is swapped in.
    pub faults: u64,
    /// This queue's faulty calls since the host started, whatever the rule file (the
    /// counter `/metrics` shows as `ebb_rule_faults_total`).
    pub faults_total: u64,
    /// Faults in a row so far of each export of the rule in use, and failed rebuilds of its
    /// instance in a row: the first to reach `quarantine_after` quarantines the rule.
    pub consecutive_faults: ConsecutiveFaults,
    /// Calls that took longer than the call deadline in wall-clock time but not in CPU time,
    /// and decided: their thread waited (for a CPU on a busy host, or in a sleep of the rule's).
    /// Not faults: a rule is charged for its own work (see `rule_limits.call_deadline`).
    pub waited_calls: u64,
    /// Decisions clamped into the queue's bounds.
    pub clamps: u64,
    /// The last load or call error, if any.
    pub last_error: Option<String>,
    /// Bytes of linear memory the rule's instance holds; the instance is shared by
    /// `shared_by` queues, so count it once per rule, not per queue. 0 without an instance.
    pub instance_memory_bytes: u64,
    /// How many queues share this queue's rule instance (same file, same parameters),
    /// this one included.
    pub shared_by: usize,
    /// True while the instance is being rebuilt after a fault (the built-in rule decides).
    pub rebuilding: bool,
    /// True while the queue's rule is being compiled at start-up (the built-in rule decides,
    /// with source `compiling`).
    pub compiling: bool,
    /// Decisions the built-in rule made for this queue because its rule was still compiling.
    pub decisions_while_compiling: u64,
}

/// Where a queue's rule stands (see [`RuleStatus::state`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuleState {
    /// No rule file: the built-in rule decides, by choice.
    #[default]
    BuiltIn,
    /// The rule is being compiled at start-up; the built-in rule decides meanwhile.
    Compiling,
    /// The rule decides.
    Loaded,
    /// The rule faulted `quarantine_after` times in a row in one export (or could not be
    /// rebuilt that often): the built-in rule decides until the file's content changes.
    Quarantined,
    /// The configured rule cannot load (missing, unreadable, invalid, or its `configure`
    /// failed): the built-in rule decides until the file is fixed.
    Error,
}

/// A rule's decisions, as its contract exports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Export {
    /// `optimal-dequeue-task-count`.
    OptimalDequeueTaskCount,
    /// `on-queue-empty`.
    OnQueueEmpty,
    /// `max-concurrent-calls` (since contract 0.3.0).
    MaxConcurrentCalls,
    /// `on-handler-failure` of the optional `failures` interface (since contract 0.4.0).
    OnHandlerFailure,
}

impl Export {
    /// The export's name in the contract.
    pub fn name(self) -> &'static str {
        match self {
            Export::OptimalDequeueTaskCount => "optimal-dequeue-task-count",
            Export::OnQueueEmpty => "on-queue-empty",
            Export::MaxConcurrentCalls => "max-concurrent-calls",
            Export::OnHandlerFailure => "on-handler-failure",
        }
    }
}

/// Where a fault happened. Each place has its own run of consecutive faults, so that the
/// successes of one export do not hide another that always fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FaultSite {
    /// A call of this export.
    Call(Export),
    /// Rebuilding the instance (instantiation and `configure`) after a fault.
    Rebuild,
}

impl FaultSite {
    fn index(self) -> usize {
        match self {
            FaultSite::Call(Export::OptimalDequeueTaskCount) => 0,
            FaultSite::Call(Export::OnQueueEmpty) => 1,
            FaultSite::Call(Export::MaxConcurrentCalls) => 2,
            FaultSite::Call(Export::OnHandlerFailure) => 3,
            FaultSite::Rebuild => 4,
        }
    }

    fn export(self) -> Option<Export> {
        match self {
            FaultSite::Call(export) => Some(export),
            FaultSite::Rebuild => None,
        }
    }
}

/// Consecutive faults of a rule group, one run per [`FaultSite`].
#[derive(Default)]
pub(super) struct FaultRuns([AtomicU32; 5]);

impl FaultRuns {
    /// Adds a fault at `site`; returns the length of its run.
    fn fault(&self, site: FaultSite) -> u32 {
        self.0[site.index()].fetch_add(1, Ordering::Relaxed).saturating_add(1)
    }

    /// `site` worked: its run ends.
    fn success(&self, site: FaultSite) {
        self.0[site.index()].store(0, Ordering::Relaxed);
    }

    /// A new rule (or none): every run ends.
    pub(super) fn reset(&self) {
        self.0.iter().for_each(|run| run.store(0, Ordering::Relaxed));
    }

    fn snapshot(&self) -> ConsecutiveFaults {
        let run = |site: FaultSite| self.0[site.index()].load(Ordering::Relaxed);
        ConsecutiveFaults {
            optimal_dequeue_task_count: run(FaultSite::Call(Export::OptimalDequeueTaskCount)),
            on_queue_empty: run(FaultSite::Call(Export::OnQueueEmpty)),
            max_concurrent_calls: run(FaultSite::Call(Export::MaxConcurrentCalls)),
            on_handler_failure: run(FaultSite::Call(Export::OnHandlerFailure)),
            rebuild: run(FaultSite::Rebuild),
        }
    }
}

/// Faults in a row, per export and for rebuilding the instance (see
/// [`RuleStatus::consecutive_faults`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConsecutiveFaults {
    /// Of `optimal-dequeue-task-count`.
    pub optimal_dequeue_task_count: u32,
    /// Of `on-queue-empty`.
    pub on_queue_empty: u32,
    /// Of `max-concurrent-calls` (0 for a rule of a contract before 0.3.0, never called).
    pub max_concurrent_calls: u32,
    /// Of `on-handler-failure` (0 for a rule that does not export `failures`, never called).
    pub on_handler_failure: u32,
    /// Failed rebuilds of the instance after a fault.
    pub rebuild: u32,
}

/// Why and since when a rule is quarantined. The whole rule is: a rule with one decision
/// always failing is a broken rule, and its other decision is no more trusted than it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantine {
    /// The export whose faults in a row reached `quarantine_after`; `None` when it was the
    /// instance that could not be rebuilt that many times in a row.
    pub export: Option<Export>,
    /// How many faults in a row.
    pub faults: u32,
    /// When the rule was quarantined (RFC 3339 in JSON).
    #[serde(with = "humantime_serde")]
    pub since: SystemTime,
    /// The last fault's reason.
    pub reason: String,
}

/// A newer content of a rule file that was refused while the rule in use goes on deciding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedFile {
    /// The file's path.
    pub file: String,
    /// Hex sha256 of the refused content; `None` when the file could not be read.
    pub sha256: Option<String>,
    /// Why it was refused.
    pub reason: String,
    /// When (RFC 3339 in JSON).
    #[serde(with = "humantime_serde")]
    pub at: SystemTime,
}

/// Whether a queue's rule is ready to decide, for readiness probes (`/readyz`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "state", content = "reason")]
pub enum RuleLoad {
    /// The queue names no rule file: the built-in rule decides, by choice.
    BuiltIn,
    /// The queue's rule is being compiled; the built-in rule decides meanwhile.
    Compiling,
    /// The queue's rule is in use (a quarantine or a rebuild after a fault does not change
    /// this: the queue still works, and its status says so).
    Loaded,
    /// The queue's rule could not be loaded, for this reason; the built-in rule decides until
    /// the file is fixed (a hot swap then loads it).
    Failed(String),
}

/// A configured instance and the rule it is an instance of.
pub(super) struct Live {
    pub(super) rule: Arc<CompiledRule>,
    pub(super) instance: RuleInstance,
}

/// The instance a rule group's queues share, and its output logger: held during a decision call.
#[derive(Default)]
pub(super) struct SharedInstance {
    pub(super) live: Option<Live>,
    pub(super) output_logger: OutputLogger,
}

/// Held only for field updates.
#[derive(Default)]
pub(super) struct GroupStatus {
    pub(super) rule: Option<Arc<CompiledRule>>,
    /// Bumped by every swap, so a rebuild started before it is discarded.
    pub(super) generation: u64,
    pub(super) quarantine: Option<Quarantine>,
    /// The newest content of the file that was refused, while `rule` goes on deciding.
    pub(super) refused: Option<RefusedFile>,
    pub(super) rebuilding: bool,
    /// Set while a load started by [`super::RuleSet::load_all_in_background`] runs.
    pub(super) compiling: bool,
    pub(super) last_error: Option<String>,
    /// The last swaps, oldest first, at most [`SWAP_HISTORY`].
    pub(super) swaps: std::collections::VecDeque<RuleSwap>,
}

/// How many swaps of a queue's rule the status keeps.
pub const SWAP_HISTORY: usize = 10;

/// A rule swapped in (or removed) for a queue, as `/status` shows it (`rule.swaps`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleSwap {
    /// When it happened (RFC 3339 in JSON).
    #[serde(with = "humantime_serde")]
    pub at: SystemTime,
    /// The rule file now deciding; `None` when the file was removed (the built-in rule decides).
    pub file: Option<String>,
    /// Hex sha256 of that rule.
    pub sha256: Option<String>,
    /// The contract version it was built for.
    #[serde(default, deserialize_with = "contract_from_wire")]
    pub contract: Option<Contract>,
}

/// A contract version's text. (An alias, so that serde does not take a status field of this
/// type for one borrowed from the JSON: [`contract_from_wire`] reads it.)
type Contract = &'static str;

/// Most contract versions this build does not know that [`contract_from_wire`] keeps.
const MAX_FOREIGN_CONTRACTS: usize = 16;

/// A contract version read from `/status` (by `ebb status` or an embedder), as the
/// `&'static str` the status holds: a version this build knows is its own constant; one it
/// does not (a newer host's) is kept once per distinct text, at most
/// [`MAX_FOREIGN_CONTRACTS`] of them (then `unknown`), so reading many answers leaks nothing.
fn contract_from_wire<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<&'static str>, D::Error> {
    static FOREIGN: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let Some(text) = Option::<String>::deserialize(deserializer)? else { return Ok(None) };
    if let Some(known) = super::bindings::CONTRACT_VERSIONS.iter().find(|v| **v == text) {
        return Ok(Some(known));
    }
    let mut foreign = FOREIGN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(kept) = foreign.iter().find(|v| **v == text) {
        return Ok(Some(kept));
    }
    if foreign.len() == MAX_FOREIGN_CONTRACTS {
        return Ok(Some("unknown"));
    }
    let kept: &'static str = Box::leak(text.into_boxed_str());
    foreign.push(kept);
    Ok(Some(kept))
}

impl GroupStatus {
    /// Notes a swap in the bounded history.
    pub(super) fn record_swap(&mut self, rule: Option<&CompiledRule>) {
        if self.swaps.len() == SWAP_HISTORY {
            self.swaps.pop_front();
        }
        self.swaps.push_back(RuleSwap {
            at: SystemTime::now(),
            file: rule.map(|r| r.name.clone()),
            sha256: rule.map(|r| r.sha256.clone()),
            contract: rule.map(|r| r.contract.as_str()),
        });
    }
}

/// The queues that use the same rule file with the same parameters, and their instance.
pub(super) struct RuleGroup {
    pub(super) engine: Arc<RuleEngine>,
    pub(super) path: Option<PathBuf>,
    pub(super) params: Vec<(String, String)>,
    pub(super) queues: Vec<DecisionSite>,
    pub(super) slot: Mutex<SharedInstance>,
    pub(super) status: Mutex<GroupStatus>,
    /// Notified whenever `status.rebuilding` ends (a rebuild done or failed, a swap): what a
    /// failure decision waits on ([`RuleGroup::wait_for_rebuild`]).
    pub(super) rebuilt: Condvar,
    pub(super) consecutive_faults: FaultRuns,
    pub(super) memory_bytes: AtomicU64,
    /// Bounds the "rule faulted" WARN lines: a rule that faults on every call, polled
    /// every millisecond with a high `quarantine_after`, would otherwise flood the log.
    pub(super) fault_log: LogLimiter,
    /// The set's threads, which a rebuild runs on.
    pub(super) threads: Arc<RuleThreads>,
}

/// At most this many "rule faulted" WARN lines per rule group per [`FAULT_LOG_WINDOW`]; the
/// rest are counted (exactly, in the status) and the next line logged says how many were left out.
pub(super) const FAULT_LOG_LINES: u32 = 10;
/// See [`FAULT_LOG_LINES`].
pub(super) const FAULT_LOG_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// One queue's entry in the rule set: where it decides, its group, and its counters.
pub(super) struct QueueEntry {
    pub(super) name: DecisionSite,
    pub(super) group: Arc<RuleGroup>,
    pub(super) decisions: AtomicU64,
    /// Faults since start, whatever the file.
    pub(super) faults_total: AtomicU64,
    /// Faults of the rule version in use: (the group's generation they belong to, count).
    pub(super) file_faults: Mutex<(u64, u64)>,
    pub(super) waited_calls: AtomicU64,
    pub(super) clamps: AtomicU64,
    pub(super) while_compiling: AtomicU64,
}

/// One queue's rules: a cheap, cloneable handle from [`RuleSet::queue`]. Decisions are
/// synchronous and may block for up to the call deadline (and while another queue that
/// shares the instance is deciding): from async code, call them through `spawn_blocking`.
#[derive(Clone)]
pub struct QueueRules {
    pub(super) slot: Arc<QueueEntry>,
}

impl QueueEntry {
    /// Counts a fault of the rule version of `generation`.
    fn count_fault(&self, generation: u64) {
        self.faults_total.fetch_add(1, Ordering::Relaxed);
        let mut file = lock(&self.file_faults);
        if file.0 != generation {
            *file = (generation, 0);
        }
        file.1 += 1;
    }

    /// Faults of the rule version of `generation`.
    fn file_faults(&self, generation: u64) -> u64 {
        let file = lock(&self.file_faults);
        if file.0 == generation { file.1 } else { 0 }
    }
}

impl QueueRules {
    /// The name of its site (a storage queue, or a queue's KEDA site).
    pub fn queue_name(&self) -> &str {
        &self.slot.name
    }

    /// `GetOptimalDequeueTaskCount`, clamped to `[min_tasks, max_tasks]`.
    pub fn decide_task_count(&self, state: &QueueState) -> Decision<u32> {
        let (raw, source) =
            self.decide(Export::OptimalDequeueTaskCount, state, |i| i.optimal_dequeue_task_count(state), || paper::optimal_dequeue_task_count(state));
        self.finish(clamp_task_count(raw, source, state))
    }

    /// `QueueEmpty`: the delay is clamped to `[min_interval_ms, max_interval_ms]`.
    pub fn decide_queue_empty(&self, ctx: &IdleContext) -> Decision<IdleDecision> {
        let (raw, source) = self.decide(Export::OnQueueEmpty, ctx, |i| i.on_queue_empty(ctx), || paper::on_queue_empty(ctx));
        self.finish(clamp_idle(raw, source, ctx))
    }

    /// How many handler calls may run at once, clamped to `[1, max_limit]`; `None` keeps the
    /// queue's configured bound. `None` when the rule says so; when the rule in use is of a
    /// contract before 0.3.0, or there is none yet (nothing is called or counted then); and
    /// when the rule cannot answer: it faulted on this call (counted as a fault of
    /// `max-concurrent-calls`, which quarantines the rule like the other exports' faults),
    /// is quarantined, or its instance is being rebuilt. The paper has no such decision, so
    /// the fallback is the configured bound, not a built-in rule's answer.
    pub fn decide_concurrency(&self, state: &HandlerState) -> Option<Decision<u32>> {
        let decision = self.concurrency_decision(state)?;
        decision.value.map(|value| Decision { value, source: decision.source, clamped: decision.clamped })
    }

    /// Whether the rule in use speaks a contract that decides handler concurrency (0.3.0 on).
    pub fn rule_decides_concurrency(&self) -> bool {
        lock(&self.slot.group.status).rule.as_ref().is_some_and(|rule| rule.contract.decides_concurrency())
    }

    /// [`QueueRules::decide_concurrency`], with where the answer came from even when it is
    /// none (`ebb rule eval` tells a rule's none from a fault's). `None` when no rule that
    /// decides concurrency is in use: nothing was asked.
    pub fn concurrency_decision(&self, state: &HandlerState) -> Option<Decision<Option<u32>>> {
        if !self.rule_decides_concurrency() {
            return None;
        }
        let (raw, source) = self.decide(Export::MaxConcurrentCalls, state, |i| i.max_concurrent_calls(state), || None);
        let decision = match raw {
            Some(raw) => {
                let clamped = clamp_concurrency(raw, source, state);
                Decision { value: Some(clamped.value), source, clamped: clamped.clamped }
            }
            None => Decision { value: None, source, clamped: false },
        };
        Some(self.finish(decision))
    }

    /// Whether the rule in use exports `ebb:rules/failures` (the `failure-aware-rule` world).
    pub fn rule_decides_failures(&self) -> bool {
        lock(&self.slot.group.status).rule.as_ref().is_some_and(|rule| rule.decides_failures)
    }

    /// What happens to a message whose handler failed, the delay clamped to
    /// `[0, ctx.max_retry_delay_ms]` and the reason bounded (see `clamp_failure`). `None`
    /// when no rule that decides failures is in use: nothing was asked, and the queue's
    /// `max_dequeue_count` handling applies as it always did. When the rule cannot answer (it
    /// faulted on this call, counted as a fault of `on-handler-failure` towards quarantine;
    /// it is quarantined; its instance could not be rebuilt within the set-up backstop), the
    /// decision is [`FailureDecision::Default`]. A rebuild under way is waited for: this call
    /// may block up to `rule_limits.setup_deadline`'s backstop.
    pub fn decide_failure(&self, ctx: &FailureContext) -> Option<Decision<FailureDecision>> {
        if !self.rule_decides_failures() {
            return None;
        }
        let call = |i: &mut RuleInstance| i.on_handler_failure(ctx).map(Option::unwrap_or_default);
        let (mut raw, mut source) = self.decide(Export::OnHandlerFailure, ctx, call, || FailureDecision::Default);
        // A scaling decision is made again a moment later; a failure is decided once. When the
        // instance is being rebuilt (the rule faulted on the call before, such as another item
        // of the same envelope), the rebuild is waited for, as long as a set-up may take.
        let group = &self.slot.group;
        if source == DecisionSource::BuiltIn && group.wait_for_rebuild(group.engine.limits().setup_backstop()) {
            (raw, source) = self.decide(Export::OnHandlerFailure, ctx, call, || FailureDecision::Default);
        }
        Some(self.finish(clamp_failure(raw, source, ctx)))
    }

    /// The queue's rule state. Never waits on a rule call or an instantiation.
    pub fn status(&self) -> RuleStatus {
        let slot = &self.slot;
        let group = &slot.group;
        let status = lock(&group.status);
        let load = load_state(group, &status);
        let state = match &load {
            RuleLoad::BuiltIn => RuleState::BuiltIn,
            RuleLoad::Compiling => RuleState::Compiling,
            RuleLoad::Loaded if status.quarantine.is_some() => RuleState::Quarantined,
            RuleLoad::Loaded => RuleState::Loaded,
            RuleLoad::Failed(_) => RuleState::Error,
        };
        RuleStatus {
            state,
            error: match load {
                RuleLoad::Failed(reason) => Some(reason),
                _ => None,
            },
            configured_file: group.path.as_ref().map(|p| p.display().to_string()),
            file: status.rule.as_ref().map(|r| r.name.clone()),
            sha256: status.rule.as_ref().map(|r| r.sha256.clone()),
            contract: status.rule.as_ref().map(|r| r.contract.as_str()),
            loaded_at: status.rule.as_ref().map(|r| r.loaded_at),
            quarantined: status.quarantine.is_some(),
            quarantine: status.quarantine.clone(),
            refused: status.refused.clone(),
            swaps: status.swaps.iter().cloned().collect(),
            decisions: slot.decisions.load(Ordering::Relaxed),
            faults: if status.rule.is_some() { slot.file_faults(status.generation) } else { 0 },
            faults_total: slot.faults_total.load(Ordering::Relaxed),
            consecutive_faults: group.consecutive_faults.snapshot(),
            waited_calls: slot.waited_calls.load(Ordering::Relaxed),
            clamps: slot.clamps.load(Ordering::Relaxed),
            last_error: status.last_error.clone(),
            instance_memory_bytes: group.memory_bytes.load(Ordering::Relaxed),
            shared_by: group.queues.len(),
            rebuilding: status.rebuilding,
            // A rule installed is in use, even before the loader clears its flag.
            compiling: status.compiling && status.rule.is_none(),
            decisions_while_compiling: slot.while_compiling.load(Ordering::Relaxed),
        }
    }

    /// Whether the queue's rule is loaded, still compiling, or failed (and why). Never waits
    /// on a rule.
    pub fn load_state(&self) -> RuleLoad {
        let group = &self.slot.group;
        load_state(group, &lock(&group.status))
    }

    fn finish<T>(&self, decision: Decision<T>) -> Decision<T> {
        self.slot.decisions.fetch_add(1, Ordering::Relaxed);
        if decision.clamped {
            self.slot.clamps.fetch_add(1, Ordering::Relaxed);
        }
        decision
    }

    /// The decision of `export` on `inputs`, in a `rule` span that records the inputs (as the
    /// JSON `ebb rule eval` reads), the result, where it came from and whether it was a fault.
    fn decide<T: std::fmt::Debug>(
        &self,
        export: Export,
        inputs: &impl serde::Serialize,
        call: impl FnOnce(&mut RuleInstance) -> Result<T>,
        built_in: impl FnOnce() -> T,
    ) -> (T, DecisionSource) {
        let empty = tracing::field::Empty;
        let span = tracing::debug_span!(target: crate::telemetry::TARGET, "rule", queue = %self.slot.name, export = export.name(), inputs = empty, source = empty, result = empty, fault = empty)
            .entered();
        if !span.is_disabled() {
            span.record("inputs", serde_json::to_string(inputs).unwrap_or_else(|error| format!("(not serializable: {error})")));
        }
        let (value, source) = self.decide_unspanned(export, call, built_in);
        if !span.is_disabled() {
            span.record("source", format!("{source:?}"));
            span.record("result", format!("{value:?}"));
            span.record("fault", source == DecisionSource::Fallback);
        }
        (value, source)
    }

    fn decide_unspanned<T>(&self, export: Export, call: impl FnOnce(&mut RuleInstance) -> Result<T>, built_in: impl FnOnce() -> T) -> (T, DecisionSource) {
        let slot = &*self.slot;
        let group = &slot.group;
        match catch_unwind(AssertUnwindSafe(|| group.call(slot, export, call))) {
            Ok(Called::Decided(value)) => (value, DecisionSource::Rule),
            Ok(Called::NoInstance) => {
                if lock(&group.status).compiling {
                    slot.while_compiling.fetch_add(1, Ordering::Relaxed);
                    return (built_in(), DecisionSource::Compiling);
                }
                group.rebuild_if_needed();
                (built_in(), DecisionSource::BuiltIn)
            }
            Ok(Called::Faulted) => (built_in(), DecisionSource::Fallback),
            Err(panic) => {
                // The instance may be half-way through anything: drop it, count a fault.
                let mut instance = lock(&group.slot);
                let rule = instance.live.take().map(|l| l.rule.name.clone()).unwrap_or_default();
                group.fault(slot, FaultSite::Call(export), &rule, format!("the host panicked while calling the rule: {}", panic_message(&*panic)));
                drop(instance);
                (built_in(), DecisionSource::Fallback)
            }
        }
    }
}

pub(super) enum Called<T> {
    Decided(T),
    NoInstance,
    Faulted,
}

impl RuleGroup {
    /// Whether its sites are shadow rules' (a group never mixes shadow and live sites).
    pub(super) fn is_shadow(&self) -> bool {
        self.queues.first().is_some_and(DecisionSite::is_shadow)
    }

    /// What its rule is, in a log line: a shadow's answers are only compared, never applied.
    fn kind(&self) -> &'static str {
        if self.is_shadow() { "shadow rule" } else { "rule" }
    }

    pub(super) fn label(&self) -> String {
        match self.queues.as_slice() {
            [one] => format!("queue {one}"),
            many if many.len() <= 3 => format!("queues {}", many.join(", ")),
            many => format!("queues {} and {} more", many[..3].join(", "), many.len() - 3),
        }
    }

    fn call<T>(self: &Arc<Self>, queue: &QueueEntry, export: Export, call: impl FnOnce(&mut RuleInstance) -> Result<T>) -> Called<T> {
        let mut guard = lock(&self.slot);
        let slot = &mut *guard;
        let Some(live) = slot.live.as_mut() else { return Called::NoInstance };
        let result = call(&mut live.instance);
        slot.output_logger.drain(live.instance.output(), &queue.name, &live.rule.name);
        match result {
            Ok(value) => {
                self.memory_bytes.store(live.instance.memory_bytes() as u64, Ordering::Relaxed);
                self.consecutive_faults.success(FaultSite::Call(export));
                if live.instance.waited() {
                    queue.waited_calls.fetch_add(1, Ordering::Relaxed);
                }
                Called::Decided(value)
            }
            Err(error) => {
                // A trapped instance cannot be entered again.
                let rule = live.rule.name.clone();
                slot.live = None;
                self.memory_bytes.store(0, Ordering::Relaxed);
                self.fault(queue, FaultSite::Call(export), &rule, format!("{error:#}"));
                Called::Faulted
            }
        }
    }

    /// Counts a fault of a call; quarantines the rule when the run of faults of that export
    /// reaches the limit (saying so once), otherwise starts rebuilding its instance off the
    /// decision path.
    fn fault(self: &Arc<Self>, queue: &QueueEntry, site: FaultSite, rule: &str, reason: String) {
        // The paper has no concurrency decision: that call keeps the configured bound instead.
        let instead = match site {
            _ if self.is_shadow() => "this decision is not compared; the live rule is not affected",
            FaultSite::Call(Export::MaxConcurrentCalls) => "the queue keeps its configured max_concurrent_calls",
            FaultSite::Call(Export::OnHandlerFailure) => "the message is retried or poisoned as max_dequeue_count says",
            _ => "the built-in rule decides this call",
        };
        let kind = self.kind();
        match self.fault_log.allow() {
            Some(0) => tracing::warn!(queue = %queue.name, rule, export = site.export().map(Export::name), %reason, "{kind} faulted; {instead}"),
            Some(suppressed) => tracing::warn!(
                queue = %queue.name,
                rule,
                export = site.export().map(Export::name),
                %reason,
                suppressed,
                "{kind} faulted; {instead} ({suppressed} more fault lines of this rule were suppressed; its status counts every fault)"
            ),
            None => {}
        }
        let quarantined = {
            let mut status = lock(&self.status);
            queue.count_fault(status.generation);
            self.count(&mut status, site, rule, reason)
        };
        if !quarantined {
            self.rebuild_if_needed();
        }
    }

    /// Adds a fault at `site` to its run and keeps `reason` as the last error; quarantines the
    /// rule in use when the run reaches the limit. Returns whether it is quarantined now.
    fn count(&self, status: &mut GroupStatus, site: FaultSite, rule: &str, reason: String) -> bool {
        let faults = self.consecutive_faults.fault(site);
        if self.engine.limits().quarantines_at(faults) && status.quarantine.is_none() && status.rule.is_some() {
            let export = site.export().map_or("(rebuilding its instance)", Export::name);
            let meanwhile = if self.is_shadow() { "it is not asked meanwhile; the live rule is not affected" } else { "the built-in rule decides" };
            tracing::warn!(
                queues = %self.label(),
                rule,
                export,
                faults,
                %reason,
                "{} quarantined until its file's content changes; {meanwhile}",
                self.kind()
            );
            status.quarantine = Some(Quarantine { export: site.export(), faults, since: SystemTime::now(), reason: reason.clone() });
        }
        status.last_error = Some(reason);
        status.quarantine.is_some()
    }

    /// Starts rebuilding the instance on a thread of its own (one of the set's threads, see
    /// [`super::RuleSet::stop_threads`]), unless one is on the way, the
    /// group has no rule, or it is quarantined.
    pub(super) fn rebuild_if_needed(self: &Arc<Self>) {
        let (rule, generation) = {
            let mut status = lock(&self.status);
            if status.rebuilding || status.quarantine.is_some() {
                return;
            }
            let Some(rule) = status.rule.clone() else { return };
            status.rebuilding = true;
            (rule, status.generation)
        };
        let group = self.clone();
        match self.threads.spawn("ebb-rule-rebuild", move || group.rebuild(rule, generation)) {
            Ok(true) => {}
            // The host is stopping: the built-in rule decides what little is left.
            Ok(false) => {
                lock(&self.status).rebuilding = false;
                self.rebuilt.notify_all();
            }
            Err(error) => {
                tracing::warn!(queues = %self.label(), "could not start rebuilding a rule instance: {error}");
                lock(&self.status).rebuilding = false;
                self.rebuilt.notify_all();
            }
        }
    }

    /// Waits up to `most` for a rebuild of the instance under way to end. Returns whether one
    /// was under way and ended (the instance may be back, or the rebuild failed).
    pub(super) fn wait_for_rebuild(&self, most: Duration) -> bool {
        let status = lock(&self.status);
        if !status.rebuilding {
            return false;
        }
        let (_status, waited) = self.rebuilt.wait_timeout_while(status, most, |s| s.rebuilding).unwrap_or_else(std::sync::PoisonError::into_inner);
        !waited.timed_out()
    }

    fn rebuild(self: Arc<Self>, rule: Arc<CompiledRule>, generation: u64) {
        let built = catch_unwind(AssertUnwindSafe(|| self.engine.instantiate(&rule, &self.params)))
            .unwrap_or_else(|panic| Err(anyhow::anyhow!("the host panicked: {}", panic_message(&*panic))));
        let mut slot = lock(&self.slot);
        let mut status = lock(&self.status);
        // Whatever follows, waiters look again once the locks are let go.
        self.rebuilt.notify_all();
        if status.generation != generation {
            return; // a swap came first; it reset the flags
        }
        status.rebuilding = false;
        match built {
            Ok(instance) if slot.live.is_none() && status.quarantine.is_none() => {
                self.memory_bytes.store(instance.memory_bytes() as u64, Ordering::Relaxed);
                self.consecutive_faults.success(FaultSite::Rebuild);
                slot.live = Some(Live { rule, instance });
            }
            Ok(_) => {}
            Err(error) => {
                drop(slot);
                // Counted like a faulty call, in a run of its own; the next decision tries
                // again (or quarantine holds).
                let reason = format!("its instance could not be rebuilt: {error:#}");
                let meanwhile = if self.is_shadow() { "it is not asked; the live rule is not affected" } else { "the built-in rule decides" };
                let kind = self.kind();
                match self.fault_log.allow() {
                    Some(0) => tracing::warn!(queues = %self.label(), rule = %rule.name, %reason, "{kind} faulted; {meanwhile}"),
                    Some(suppressed) => tracing::warn!(
                        queues = %self.label(),
                        rule = %rule.name,
                        %reason,
                        suppressed,
                        "{kind} faulted; {meanwhile} ({suppressed} more fault lines of this rule were suppressed)"
                    ),
                    None => {}
                }
                self.count(&mut status, FaultSite::Rebuild, &rule.name, reason);
            }
        }
    }
}

/// What [`QueueRules::load_state`] says, from the group's status.
fn load_state(group: &RuleGroup, status: &GroupStatus) -> RuleLoad {
    if status.rule.is_some() {
        RuleLoad::Loaded
    } else if status.compiling {
        RuleLoad::Compiling
    } else if group.path.is_none() {
        RuleLoad::BuiltIn
    } else {
        RuleLoad::Failed(status.last_error.clone().unwrap_or_else(|| "its rule was never loaded".into()))
    }
}

#[cfg(test)]
mod tests;
