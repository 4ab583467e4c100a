//! One queue's rules and the rule group it belongs to: the shared instance, fallback to
//! the built-in rule on a fault, rebuilding off the decision path, and quarantine.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::Result;
use ebb_rules_sdk::{IdleContext, IdleDecision, QueueState, paper};
use serde::Serialize;

use super::decision::{Decision, DecisionSource, clamp_idle, clamp_task_count};
use super::engine::{CompiledRule, RuleEngine};
use super::instance::RuleInstance;
use super::lock;
use super::stderr::OutputLogger;
use super::threads::RuleThreads;
use crate::log_limit::LogLimiter;
use crate::names::RuleSlot;

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
    /// True while the queue's rule is being compiled at start-up (the built-in rule decides,
    /// with source `compiling`).
    pub compiling: bool,
    /// Decisions the built-in rule made for this queue because its rule was still compiling.
    pub decisions_while_compiling: u64,
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

/// Held during a decision call.
#[derive(Default)]
pub(super) struct InstanceSlot {
    pub(super) live: Option<Live>,
    pub(super) output_logger: OutputLogger,
}

/// Held only for field updates.
#[derive(Default)]
pub(super) struct GroupStatus {
    pub(super) rule: Option<Arc<CompiledRule>>,
    /// Bumped by every swap, so a rebuild started before it is discarded.
    pub(super) generation: u64,
    pub(super) quarantined: bool,
    pub(super) rebuilding: bool,
    /// Set while a load started by [`super::RuleSet::load_all_in_background`] runs.
    pub(super) compiling: bool,
    pub(super) last_error: Option<String>,
}

/// The queues that use the same rule file with the same parameters, and their instance.
pub(super) struct RuleGroup {
    pub(super) engine: Arc<RuleEngine>,
    pub(super) path: Option<PathBuf>,
    pub(super) params: Vec<(String, String)>,
    pub(super) queues: Vec<RuleSlot>,
    pub(super) slot: Mutex<InstanceSlot>,
    pub(super) status: Mutex<GroupStatus>,
    pub(super) consecutive_faults: AtomicU32,
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

pub(super) struct QueueSlot {
    pub(super) name: RuleSlot,
    pub(super) group: Arc<RuleGroup>,
    pub(super) decisions: AtomicU64,
    pub(super) faults: AtomicU64,
    pub(super) clamps: AtomicU64,
    pub(super) while_compiling: AtomicU64,
    pub(super) inject_panic: AtomicBool,
}

/// One queue's rules: a cheap, cloneable handle from [`RuleSet::queue`]. Decisions are
/// synchronous and may block for up to the call deadline (and while another queue that
/// shares the instance is deciding): from async code, call them through `spawn_blocking`.
#[derive(Clone)]
pub struct QueueRules {
    pub(super) slot: Arc<QueueSlot>,
}

impl QueueRules {
    /// The name of its slot (a storage queue, or a queue's KEDA slot).
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
            // A rule installed is in use, even before the loader clears its flag.
            compiling: status.compiling && status.rule.is_none(),
            decisions_while_compiling: slot.while_compiling.load(Ordering::Relaxed),
        }
    }

    /// Whether the queue's rule is loaded, still compiling, or failed (and why). Never waits
    /// on a rule.
    pub fn load_state(&self) -> RuleLoad {
        let group = &self.slot.group;
        let status = lock(&group.status);
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
                slot.faults.fetch_add(1, Ordering::Relaxed);
                group.fault(&slot.name, &rule, format!("the host panicked while calling the rule: {}", panic_message(&*panic)));
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
    pub(super) fn label(&self) -> String {
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
            let quarantine = self.engine.limits().quarantines_at(faults) && !status.quarantined && status.rule.is_some();
            status.quarantined |= quarantine;
            quarantine
        };
        if quarantine {
            tracing::warn!(queues = %self.label(), rule, faults, "rule quarantined until its file's content changes; the built-in rule decides");
        } else {
            self.rebuild_if_needed();
        }
    }

    /// Starts rebuilding the instance on a thread of its own (one of the set's threads, see
    /// [`super::RuleSet::stop_threads`]), unless one is on the way, the
    /// group has no rule, or it is quarantined.
    pub(super) fn rebuild_if_needed(self: &Arc<Self>) {
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
        match self.threads.spawn("ebb-rule-rebuild", move || group.rebuild(rule, generation)) {
            Ok(true) => {}
            // The host is stopping: the built-in rule decides what little is left.
            Ok(false) => lock(&self.status).rebuilding = false,
            Err(error) => {
                tracing::warn!(queues = %self.label(), "could not start rebuilding a rule instance: {error}");
                lock(&self.status).rebuilding = false;
            }
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
                if self.engine.limits().quarantines_at(faults) && !status.quarantined && status.generation == generation {
                    status.quarantined = true;
                    tracing::warn!(queues = %self.label(), rule = %rule.name, faults, "rule quarantined until its file's content changes; the built-in rule decides");
                }
            }
        }
    }
}

pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_else(|| "(no message)".into())
}
