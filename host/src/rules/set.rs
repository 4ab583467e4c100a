//! The rules of every queue on the host.
//!
//! Queues that name the same rule file with the same parameters form one *rule group*
//! and share one configured instance (rules are pure decisions), so memory grows with the
//! number of distinct rules, not with the number of queues. Each queue keeps its own
//! counters and clamps; faults and quarantine belong to the group.
//!
//! Locks: a group's instance lock is held during a decision call (bounded by the call
//! deadline); its status lock is only ever held for a few field updates, never across a
//! rule call or an instantiation, so [`QueueRules::status`] never waits on a rule. After a
//! fault the instance is rebuilt on a thread of its own while the built-in rule decides.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::{Context as _, Result};
use ebb_rules_sdk::{IdleContext, IdleDecision, QueueState, paper};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::engine::{CompiledRule, RuleEngine, RuleInstance, lock, read_rule_file, release_free_memory_after};
use super::stderr::OutputLogger;
use crate::log_limit::LogLimiter;

/// Which rule a queue uses, from the host configuration.
#[derive(Debug, Clone)]
pub struct QueueRuleConfig {
    /// The queue's name.
    pub queue: String,
    /// The rule file; `None` for the built-in rule.
    pub rule: Option<PathBuf>,
    /// The queue's `rule_params`, passed to the rule's `configure`.
    pub params: Vec<(String, String)>,
}

/// Where a decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecisionSource {
    /// The queue's WASM rule.
    Rule,
    /// The built-in rule, because the queue has no rule, its file is gone, it is
    /// quarantined, or its instance is being rebuilt after a fault.
    BuiltIn,
    /// The built-in rule, because the WASM rule faulted on this call (or the host panicked
    /// while calling it).
    Fallback,
}

/// A decision, where it came from, and whether the host had to clamp it into bounds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Decision<T> {
    /// The decision, after clamping.
    pub value: T,
    /// Who made it.
    pub source: DecisionSource,
    /// True when the raw decision was out of the queue's bounds and was clamped.
    pub clamped: bool,
}

/// A queue's rule, as `QueryState` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct RuleStatus {
    /// The rule file's name, or `None` when the built-in rule decides.
    pub file: Option<String>,
    /// Hex sha256 of the rule in use.
    pub sha256: Option<String>,
    /// When the rule in use was loaded (RFC 3339 in JSON, like the other times of `/status`).
    #[serde(with = "humantime_serde")]
    pub loaded_at: Option<SystemTime>,
    /// Whether the rule is quarantined (the built-in decides until the file's content changes).
    pub quarantined: bool,
    /// Decisions made for this queue, by any source.
    pub decisions: u64,
    /// This queue's calls in which the rule faulted (trap, deadline, fuel, memory, exit, or
    /// a host panic while calling it).
    pub faults: u64,
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
}

/// A configured instance and the rule it is an instance of.
struct Live {
    rule: Arc<CompiledRule>,
    instance: RuleInstance,
}

/// Held during a decision call.
#[derive(Default)]
struct InstanceSlot {
    live: Option<Live>,
    output_logger: OutputLogger,
}

/// Held only for field updates.
#[derive(Default)]
struct GroupStatus {
    rule: Option<Arc<CompiledRule>>,
    /// Bumped by every swap, so a rebuild started before it is discarded.
    generation: u64,
    quarantined: bool,
    rebuilding: bool,
    last_error: Option<String>,
}

/// The queues that use the same rule file with the same parameters, and their instance.
struct RuleGroup {
    engine: Arc<RuleEngine>,
    path: Option<PathBuf>,
    params: Vec<(String, String)>,
    queues: Vec<String>,
    slot: Mutex<InstanceSlot>,
    status: Mutex<GroupStatus>,
    consecutive_faults: AtomicU32,
    memory_bytes: AtomicU64,
    /// Bounds the "rule faulted" WARN lines: a rule that faults on every call, polled
    /// every millisecond with a high `quarantine_after`, would otherwise flood the log.
    fault_log: LogLimiter,
}

/// At most this many "rule faulted" WARN lines per rule group per [`FAULT_LOG_WINDOW`]; the
/// rest are counted (exactly, in the status) and the next line logged says how many were left out.
const FAULT_LOG_LINES: u32 = 10;
/// See [`FAULT_LOG_LINES`].
const FAULT_LOG_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

struct QueueSlot {
    name: String,
    group: Arc<RuleGroup>,
    decisions: AtomicU64,
    faults: AtomicU64,
    clamps: AtomicU64,
    inject_panic: AtomicBool,
}

/// One queue's rules: a cheap, cloneable handle from [`RuleSet::queue`]. Decisions are
/// synchronous and may block for up to the call deadline (and while another queue that
/// shares the instance is deciding): from async code, call them through `spawn_blocking`.
#[derive(Clone)]
pub struct QueueRules {
    slot: Arc<QueueSlot>,
}

/// What the set last saw in a rule file, so that an event that changed nothing does nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Missing,
    Content(String),
    Unreadable(String),
}

/// The rules of every queue on this host.
pub struct RuleSet {
    engine: Arc<RuleEngine>,
    queues: HashMap<String, QueueRules>,
    groups: Vec<Arc<RuleGroup>>,
    seen: Mutex<HashMap<PathBuf, Seen>>,
    file_reads: AtomicU64,
    swaps: AtomicU64,
}

impl RuleSet {
    /// Slots for these queues, all on the built-in rule until [`RuleSet::load_all`] or a
    /// file event loads their rule. Queues with the same rule file and the same parameters
    /// share one rule instance.
    pub fn new(engine: Arc<RuleEngine>, queues: impl IntoIterator<Item = QueueRuleConfig>) -> Self {
        let mut groups: Vec<Arc<RuleGroup>> = Vec::new();
        let mut members: HashMap<(Option<PathBuf>, Vec<(String, String)>), (usize, Vec<String>)> = HashMap::new();
        let mut configs = Vec::new();
        for config in queues {
            let mut params = config.params.clone();
            params.sort();
            let next = members.len();
            let entry = members.entry((config.rule.clone(), params)).or_insert_with(|| (next, Vec::new()));
            entry.1.push(config.queue.clone());
            configs.push((entry.0, config));
        }
        let mut ordered: Vec<_> = members.into_iter().collect();
        ordered.sort_by_key(|(_, (index, _))| *index);
        for ((path, _), (_, queues)) in ordered {
            let params = configs.iter().find(|(_, c)| c.queue == queues[0]).map(|(_, c)| c.params.clone()).unwrap_or_default();
            groups.push(Arc::new(RuleGroup {
                engine: engine.clone(),
                path,
                params,
                queues,
                slot: Mutex::default(),
                status: Mutex::default(),
                consecutive_faults: AtomicU32::new(0),
                memory_bytes: AtomicU64::new(0),
                fault_log: LogLimiter::new(FAULT_LOG_LINES, FAULT_LOG_WINDOW),
            }));
        }
        let queues = configs
            .into_iter()
            .map(|(index, config)| {
                let slot = QueueSlot {
                    name: config.queue.clone(),
                    group: groups[index].clone(),
                    decisions: AtomicU64::new(0),
                    faults: AtomicU64::new(0),
                    clamps: AtomicU64::new(0),
                    inject_panic: AtomicBool::new(false),
                };
                (config.queue, QueueRules { slot: Arc::new(slot) })
            })
            .collect();
        RuleSet { engine, queues, groups, seen: Mutex::default(), file_reads: AtomicU64::new(0), swaps: AtomicU64::new(0) }
    }

    /// The engine the rules run on.
    pub fn engine(&self) -> &Arc<RuleEngine> {
        &self.engine
    }

    /// The rules of `queue`, or `None` if it was not configured.
    pub fn queue(&self, queue: &str) -> Option<QueueRules> {
        self.queues.get(queue).cloned()
    }

    /// Loads every rule file a queue names. Each failure is returned (the queue stays on
    /// the built-in rule); `ebb check` reports them, `ebb run` logs them and carries on.
    pub fn load_all(&self) -> Vec<anyhow::Error> {
        self.rule_files()
            .into_iter()
            .filter_map(|path| match self.apply_file(&path) {
                Ok(Some(_)) => None,
                Ok(None) => Some(anyhow::anyhow!("rule file {} does not exist", path.display())),
                Err(error) => Some(error),
            })
            .collect()
    }

    /// The rule files some queue names.
    pub fn rule_files(&self) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = self.groups.iter().filter_map(|g| g.path.clone()).collect();
        paths.sort();
        paths.dedup();
        paths
    }

    /// How many times the set has read a rule file's content (at load, and when a file
    /// event came). While nothing changes in the rules folder, this does not move.
    pub fn file_reads(&self) -> u64 {
        self.file_reads.load(Ordering::Relaxed)
    }

    /// How many times a new rule version was swapped in for some queues (or a removed file
    /// put them back on the built-in rule).
    pub fn swaps(&self) -> u64 {
        self.swaps.load(Ordering::Relaxed)
    }

    /// Brings the queues that name `path` up to date with the file: loads, validates and
    /// configures the new rule for each of their groups, then swaps it in for all of them.
    /// If anything fails, every queue keeps its current rule. A missing file puts its
    /// queues back on the built-in rule. Content identical to the rule in use changes
    /// nothing (a quarantine holds). Returns the rule now in use, if any.
    pub fn apply_file(&self, path: &Path) -> Result<Option<Arc<CompiledRule>>> {
        match self.read(path) {
            Ok(None) => {
                self.remove(path);
                Ok(None)
            }
            Ok(Some(bytes)) => {
                let applied = self.apply_bytes(path, &bytes);
                let freed = bytes.len();
                drop(bytes);
                release_free_memory_after(freed);
                applied
            }
            Err(error) => {
                self.record_error(path, &error);
                Err(error)
            }
        }
    }

    /// Reads `path` and remembers what it held.
    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>> {
        let read = read_rule_file(path, self.engine.limits().max_file_bytes);
        let seen = match &read {
            Ok(None) => Seen::Missing,
            Ok(Some(bytes)) => {
                self.file_reads.fetch_add(1, Ordering::Relaxed);
                Seen::Content(hex::encode(Sha256::digest(bytes)))
            }
            Err(error) => Seen::Unreadable(format!("{error:#}")),
        };
        lock(&self.seen).insert(path.to_path_buf(), seen);
        read
    }

    /// A file event for `path`: re-reads it and acts only if what it holds changed since
    /// the set last looked (so the set's own reads, or a rewrite of the same bytes, do
    /// nothing). A file no queue uses is not read at all.
    pub(crate) fn refresh(&self, path: &Path) {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if self.users(path).is_empty() {
            tracing::debug!(rule = %name, "ignoring a rule file no queue uses");
            return;
        }
        let before = lock(&self.seen).get(path).cloned();
        let read = self.read(path);
        if lock(&self.seen).get(path) == before.as_ref() {
            tracing::trace!(rule = %name, "file event without a change of content");
            return;
        }
        match read {
            Ok(None) => self.remove(path),
            Ok(Some(bytes)) => {
                if let Err(error) = self.apply_bytes(path, &bytes) {
                    tracing::warn!(rule = %name, "keeping the current rule: {error:#}");
                }
                // The file's bytes (as large as the rule) are freed only now.
                let freed = bytes.len();
                drop(bytes);
                release_free_memory_after(freed);
            }
            Err(error) => {
                tracing::warn!(rule = %name, "keeping the current rule: {error:#}");
                self.record_error(path, &error);
            }
        }
    }

    fn users(&self, path: &Path) -> Vec<&Arc<RuleGroup>> {
        self.groups.iter().filter(|g| g.path.as_deref() == Some(path)).collect()
    }

    fn record_error(&self, path: &Path, error: &anyhow::Error) {
        let message = format!("{error:#}");
        for group in self.users(path) {
            lock(&group.status).last_error = Some(message.clone());
        }
    }

    fn remove(&self, path: &Path) {
        let mut old = Vec::new();
        for group in self.users(path) {
            let mut slot = lock(&group.slot);
            let mut status = lock(&group.status);
            if status.rule.is_some() {
                tracing::warn!(queues = %group.label(), rule = %path.display(), "rule file removed; using the built-in rule");
                self.swaps.fetch_add(1, Ordering::Relaxed);
            }
            old.push((slot.live.take(), status.rule.take()));
            status.generation += 1;
            status.quarantined = false;
            status.rebuilding = false;
            status.last_error = Some(format!("rule file {} does not exist", path.display()));
            group.consecutive_faults.store(0, Ordering::Relaxed);
            group.memory_bytes.store(0, Ordering::Relaxed);
        }
        drop(old);
        self.engine.evict_unused();
    }

    fn apply_bytes(&self, path: &Path, bytes: &[u8]) -> Result<Option<Arc<CompiledRule>>> {
        let users = self.users(path);
        let sha256 = hex::encode(Sha256::digest(bytes));
        let unchanged = !users.is_empty() && users.iter().all(|g| lock(&g.status).rule.as_ref().is_some_and(|r| r.sha256 == sha256));
        if unchanged {
            return Ok(lock(&users[0].status).rule.clone());
        }
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let prepared = self.engine.load_bytes(&name, bytes).with_context(|| format!("failed to load rule {name}")).and_then(|rule| {
            let instances = users
                .iter()
                .map(|group| self.engine.instantiate(&rule, &group.params).with_context(|| format!("rule {} cannot serve {}", rule.name, group.label())))
                .collect::<Result<Vec<_>>>()?;
            Ok((rule, instances))
        });
        let (rule, instances) = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                self.record_error(path, &error);
                self.engine.evict_unused();
                return Err(error);
            }
        };
        let mut old = Vec::new();
        for (group, instance) in users.iter().zip(instances) {
            let memory = instance.memory_bytes() as u64;
            let mut slot = lock(&group.slot);
            let mut status = lock(&group.status);
            let previous = status.rule.as_ref().map(|r| r.sha256.clone());
            old.push((slot.live.replace(Live { rule: rule.clone(), instance }), status.rule.replace(rule.clone())));
            status.generation += 1;
            status.quarantined = false;
            status.rebuilding = false;
            status.last_error = None;
            group.consecutive_faults.store(0, Ordering::Relaxed);
            group.memory_bytes.store(memory, Ordering::Relaxed);
            if previous.as_deref() != Some(rule.sha256.as_str()) {
                tracing::info!(queues = %group.label(), rule = %rule.name, sha256 = %&rule.sha256[..12], from_cache = rule.from_cache, "rule loaded");
            }
        }
        self.swaps.fetch_add(1, Ordering::Relaxed);
        // The previous versions go now, and with them (past a small LRU) their compiled code.
        drop(old);
        self.engine.evict_unused();
        Ok(Some(rule))
    }

    /// `GetOptimalDequeueTaskCount` for `queue`, clamped to `[min_tasks, max_tasks]`. An
    /// unknown queue gets the built-in rule's decision.
    pub fn decide_task_count(&self, queue: &str, state: &QueueState) -> Decision<u32> {
        match self.queues.get(queue) {
            Some(rules) => rules.decide_task_count(state),
            None => built_in_task_count(state, DecisionSource::BuiltIn),
        }
    }

    /// `QueueEmpty` for `queue`: the delay is clamped to `[min_interval_ms, max_interval_ms]`.
    /// An unknown queue gets the built-in rule's decision.
    pub fn decide_queue_empty(&self, queue: &str, ctx: &IdleContext) -> Decision<IdleDecision> {
        match self.queues.get(queue) {
            Some(rules) => rules.decide_queue_empty(ctx),
            None => built_in_queue_empty(ctx, DecisionSource::BuiltIn),
        }
    }

    /// The rule state of `queue`, or `None` if it is not configured. Never waits on a rule.
    pub fn status(&self, queue: &str) -> Option<RuleStatus> {
        self.queues.get(queue).map(QueueRules::status)
    }
}

/// The built-in (paper's) `GetOptimalDequeueTaskCount`, clamped to the queue's bounds: what
/// decides when a queue has no rule, or when no rule call could be made.
pub fn built_in_task_count(state: &QueueState, source: DecisionSource) -> Decision<u32> {
    clamp_task_count(paper::optimal_dequeue_task_count(state), source, state)
}

/// The built-in (paper's) `QueueEmpty`, clamped to the queue's polling intervals.
pub fn built_in_queue_empty(ctx: &IdleContext, source: DecisionSource) -> Decision<IdleDecision> {
    clamp_idle(paper::on_queue_empty(ctx), source, ctx)
}

/// A scaling rule written in Rust and run in the host, without a sandbox: for embedding
/// ebb as a library, and for the simulator's baselines (`ebb simulate --rule fixed-1s`).
/// Its decisions are clamped like a WASM rule's; a panic in it is contained by the
/// listener (the built-in rule decides that call).
pub trait NativeRule: Send + Sync + 'static {
    /// A short name, for reports.
    fn name(&self) -> &str;
    /// `GetOptimalDequeueTaskCount`, before the clamp to `[min_tasks, max_tasks]`.
    fn optimal_dequeue_task_count(&self, state: &QueueState) -> u32;
    /// `QueueEmpty`, before the delay's clamp to the polling interval range.
    fn on_queue_empty(&self, ctx: &IdleContext) -> IdleDecision;
}

/// A native rule's task count, clamped to the queue's bounds.
pub fn native_task_count(rule: &dyn NativeRule, state: &QueueState) -> Decision<u32> {
    clamp_task_count(rule.optimal_dequeue_task_count(state), DecisionSource::Rule, state)
}

/// A native rule's `QueueEmpty`, clamped to the queue's polling intervals.
pub fn native_queue_empty(rule: &dyn NativeRule, ctx: &IdleContext) -> Decision<IdleDecision> {
    clamp_idle(rule.on_queue_empty(ctx), DecisionSource::Rule, ctx)
}

fn clamp_task_count(raw: u32, source: DecisionSource, state: &QueueState) -> Decision<u32> {
    let value = raw.clamp(state.min_tasks, state.max_tasks.max(state.min_tasks));
    Decision { value, source, clamped: value != raw }
}

fn clamp_idle(raw: IdleDecision, source: DecisionSource, ctx: &IdleContext) -> Decision<IdleDecision> {
    let delay_ms = raw.delay_ms.clamp(ctx.min_interval_ms, ctx.max_interval_ms.max(ctx.min_interval_ms));
    Decision { value: IdleDecision { delay_ms, stop: raw.stop }, source, clamped: delay_ms != raw.delay_ms }
}

impl QueueRules {
    /// The queue's name.
    pub fn queue_name(&self) -> &str {
        &self.slot.name
    }

    /// `GetOptimalDequeueTaskCount`, clamped to `[min_tasks, max_tasks]`.
    pub fn decide_task_count(&self, state: &QueueState) -> Decision<u32> {
        let (raw, source) = self.decide(|i| i.optimal_dequeue_task_count(state), || paper::optimal_dequeue_task_count(state));
        self.finish(clamp_task_count(raw, source, state))
    }

    /// `QueueEmpty`: the delay is clamped to `[min_interval_ms, max_interval_ms]`.
    pub fn decide_queue_empty(&self, ctx: &IdleContext) -> Decision<IdleDecision> {
        let (raw, source) = self.decide(|i| i.on_queue_empty(ctx), || paper::on_queue_empty(ctx));
        self.finish(clamp_idle(raw, source, ctx))
    }

    /// The queue's rule state. Never waits on a rule call or an instantiation.
    pub fn status(&self) -> RuleStatus {
        let slot = &self.slot;
        let group = &slot.group;
        let status = lock(&group.status);
        RuleStatus {
            file: status.rule.as_ref().map(|r| r.name.clone()),
            sha256: status.rule.as_ref().map(|r| r.sha256.clone()),
            loaded_at: status.rule.as_ref().map(|r| r.loaded_at),
            quarantined: status.quarantined,
            decisions: slot.decisions.load(Ordering::Relaxed),
            faults: slot.faults.load(Ordering::Relaxed),
            clamps: slot.clamps.load(Ordering::Relaxed),
            last_error: status.last_error.clone(),
            instance_memory_bytes: group.memory_bytes.load(Ordering::Relaxed),
            shared_by: group.queues.len(),
            rebuilding: status.rebuilding,
        }
    }

    /// Fault injection for tests: the next call into the rule panics on the host side.
    #[doc(hidden)]
    pub fn inject_host_panic(&self) {
        self.slot.inject_panic.store(true, Ordering::Relaxed);
    }

    fn finish<T>(&self, decision: Decision<T>) -> Decision<T> {
        self.slot.decisions.fetch_add(1, Ordering::Relaxed);
        if decision.clamped {
            self.slot.clamps.fetch_add(1, Ordering::Relaxed);
        }
        decision
    }

    fn decide<T>(&self, call: impl FnOnce(&mut RuleInstance) -> Result<T>, built_in: impl FnOnce() -> T) -> (T, DecisionSource) {
        let slot = &*self.slot;
        let group = &slot.group;
        match catch_unwind(AssertUnwindSafe(|| group.call(slot, call))) {
            Ok(Called::Decided(value)) => (value, DecisionSource::Rule),
            Ok(Called::NoInstance) => {
                group.rebuild_if_needed();
                (built_in(), DecisionSource::BuiltIn)
            }
            Ok(Called::Faulted) => (built_in(), DecisionSource::Fallback),
            Err(panic) => {
                // The instance may be half-way through anything: drop it, count a fault.
                let mut instance = lock(&group.slot);
                let rule = instance.live.take().map(|l| l.rule.name.clone()).unwrap_or_default();
                slot.faults.fetch_add(1, Ordering::Relaxed);
                group.fault(&slot.name, &rule, format!("the host panicked while calling the rule: {}", panic_message(&*panic)));
                drop(instance);
                (built_in(), DecisionSource::Fallback)
            }
        }
    }
}

enum Called<T> {
    Decided(T),
    NoInstance,
    Faulted,
}

impl RuleGroup {
    fn label(&self) -> String {
        match self.queues.as_slice() {
            [one] => format!("queue {one}"),
            many if many.len() <= 3 => format!("queues {}", many.join(", ")),
            many => format!("queues {} and {} more", many[..3].join(", "), many.len() - 3),
        }
    }

    fn call<T>(self: &Arc<Self>, queue: &QueueSlot, call: impl FnOnce(&mut RuleInstance) -> Result<T>) -> Called<T> {
        let mut guard = lock(&self.slot);
        let slot = &mut *guard;
        let Some(live) = slot.live.as_mut() else { return Called::NoInstance };
        if queue.inject_panic.swap(false, Ordering::Relaxed) {
            panic!("fault injected by a test");
        }
        let result = call(&mut live.instance);
        slot.output_logger.drain(live.instance.output(), &queue.name, &live.rule.name);
        match result {
            Ok(value) => {
                self.memory_bytes.store(live.instance.memory_bytes() as u64, Ordering::Relaxed);
                self.consecutive_faults.store(0, Ordering::Relaxed);
                Called::Decided(value)
            }
            Err(error) => {
                // A trapped instance cannot be entered again.
                let rule = live.rule.name.clone();
                slot.live = None;
                self.memory_bytes.store(0, Ordering::Relaxed);
                queue.faults.fetch_add(1, Ordering::Relaxed);
                self.fault(&queue.name, &rule, format!("{error:#}"));
                Called::Faulted
            }
        }
    }

    /// Counts a fault; quarantines the rule at the limit (saying so once), otherwise starts
    /// rebuilding its instance off the decision path.
    fn fault(self: &Arc<Self>, queue: &str, rule: &str, reason: String) {
        let faults = self.consecutive_faults.fetch_add(1, Ordering::Relaxed) + 1;
        match self.fault_log.allow() {
            Some(0) => tracing::warn!(queue, rule, %reason, "rule faulted; the built-in rule decides this call"),
            Some(suppressed) => tracing::warn!(
                queue,
                rule,
                %reason,
                suppressed,
                "rule faulted; the built-in rule decides this call ({suppressed} more fault lines of this rule were suppressed; its status counts every fault)"
            ),
            None => {}
        }
        let quarantine = {
            let mut status = lock(&self.status);
            status.last_error = Some(reason);
            let quarantine = faults >= self.engine.limits().quarantine_after && !status.quarantined && status.rule.is_some();
            status.quarantined |= quarantine;
            quarantine
        };
        if quarantine {
            tracing::warn!(queues = %self.label(), rule, faults, "rule quarantined until its file's content changes; the built-in rule decides");
        } else {
            self.rebuild_if_needed();
        }
    }

    /// Starts rebuilding the instance on a thread of its own, unless one is on the way, the
    /// group has no rule, or it is quarantined.
    fn rebuild_if_needed(self: &Arc<Self>) {
        let (rule, generation) = {
            let mut status = lock(&self.status);
            if status.rebuilding || status.quarantined {
                return;
            }
            let Some(rule) = status.rule.clone() else { return };
            status.rebuilding = true;
            (rule, status.generation)
        };
        let group = self.clone();
        let spawned = std::thread::Builder::new().name("ebb-rule-rebuild".into()).spawn(move || group.rebuild(rule, generation));
        if let Err(error) = spawned {
            tracing::warn!(queues = %self.label(), "could not start rebuilding a rule instance: {error}");
            lock(&self.status).rebuilding = false;
        }
    }

    fn rebuild(self: Arc<Self>, rule: Arc<CompiledRule>, generation: u64) {
        let built = catch_unwind(AssertUnwindSafe(|| self.engine.instantiate(&rule, &self.params)))
            .unwrap_or_else(|panic| Err(anyhow::anyhow!("the host panicked: {}", panic_message(&*panic))));
        let mut slot = lock(&self.slot);
        let mut status = lock(&self.status);
        if status.generation != generation {
            return; // a swap came first; it reset the flags
        }
        status.rebuilding = false;
        match built {
            Ok(instance) if slot.live.is_none() && !status.quarantined => {
                self.memory_bytes.store(instance.memory_bytes() as u64, Ordering::Relaxed);
                slot.live = Some(Live { rule, instance });
            }
            Ok(_) => {}
            Err(error) => {
                drop(status);
                drop(slot);
                // Counted like a faulty call; the next decision tries again (or quarantine holds).
                let faults = self.consecutive_faults.fetch_add(1, Ordering::Relaxed) + 1;
                let reason = format!("its instance could not be rebuilt: {error:#}");
                match self.fault_log.allow() {
                    Some(0) => tracing::warn!(queues = %self.label(), rule = %rule.name, %reason, "rule faulted; the built-in rule decides"),
                    Some(suppressed) => tracing::warn!(
                        queues = %self.label(),
                        rule = %rule.name,
                        %reason,
                        suppressed,
                        "rule faulted; the built-in rule decides ({suppressed} more fault lines of this rule were suppressed)"
                    ),
                    None => {}
                }
                let mut status = lock(&self.status);
                status.last_error = Some(reason);
                if faults >= self.engine.limits().quarantine_after && !status.quarantined && status.generation == generation {
                    status.quarantined = true;
                    tracing::warn!(queues = %self.label(), rule = %rule.name, faults, "rule quarantined until its file's content changes; the built-in rule decides");
                }
            }
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_else(|| "(no message)".into())
}
