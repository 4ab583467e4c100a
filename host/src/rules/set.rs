//! One rule slot per queue: the current rule, its instance, faults and clamps.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::{Context as _, Result};
use ebb_rules_sdk::{IdleContext, IdleDecision, QueueState, paper};
use serde::Serialize;

use super::engine::{CompiledRule, RuleEngine, RuleInstance};
use super::stderr::OutputLogger;

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
    /// The built-in rule, because the queue has no rule, its file is gone, or it is quarantined.
    BuiltIn,
    /// The built-in rule, because the WASM rule faulted on this call.
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
    /// When the rule in use was loaded.
    pub loaded_at: Option<SystemTime>,
    /// Whether the rule is quarantined (the built-in decides until the file changes).
    pub quarantined: bool,
    /// Decisions made, by any source.
    pub decisions: u64,
    /// Calls in which the rule faulted (trap, deadline, fuel, memory, exit).
    pub faults: u64,
    /// Decisions clamped into the queue's bounds.
    pub clamps: u64,
    /// The last load or call error, if any.
    pub last_error: Option<String>,
}

#[derive(Default)]
struct SlotState {
    rule: Option<Arc<CompiledRule>>,
    instance: Option<RuleInstance>,
    consecutive_faults: u32,
    quarantined: bool,
    last_error: Option<String>,
    output_logger: OutputLogger,
}

struct QueueSlot {
    config: QueueRuleConfig,
    state: Mutex<SlotState>,
    decisions: AtomicU64,
    faults: AtomicU64,
    clamps: AtomicU64,
}

/// The rules of every queue on this host.
pub struct RuleSet {
    engine: Arc<RuleEngine>,
    slots: HashMap<String, QueueSlot>,
}

impl RuleSet {
    /// Slots for these queues, all on the built-in rule until [`RuleSet::load_all`] or a
    /// file event loads their rule.
    pub fn new(engine: Arc<RuleEngine>, queues: impl IntoIterator<Item = QueueRuleConfig>) -> Self {
        let slots = queues
            .into_iter()
            .map(|config| {
                let slot = QueueSlot {
                    config,
                    state: Mutex::default(),
                    decisions: AtomicU64::new(0),
                    faults: AtomicU64::new(0),
                    clamps: AtomicU64::new(0),
                };
                (slot.config.queue.clone(), slot)
            })
            .collect();
        RuleSet { engine, slots }
    }

    /// The engine the rules run on.
    pub fn engine(&self) -> &Arc<RuleEngine> {
        &self.engine
    }

    /// Loads every rule file a queue names. Each failure is returned (the queue stays on
    /// the built-in rule); `ebb check` reports them, `ebb run` logs them and carries on.
    pub fn load_all(&self) -> Vec<anyhow::Error> {
        let mut paths: Vec<&PathBuf> = self.slots.values().filter_map(|s| s.config.rule.as_ref()).collect();
        paths.sort();
        paths.dedup();
        paths
            .into_iter()
            .filter_map(|path| match self.apply_file(path) {
                Ok(Some(_)) => None,
                Ok(None) => Some(anyhow::anyhow!("rule file {} does not exist", path.display())),
                Err(error) => Some(error),
            })
            .collect()
    }

    /// The rule files some queue names.
    pub fn rule_files(&self) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = self.slots.values().filter_map(|s| s.config.rule.clone()).collect();
        paths.sort();
        paths.dedup();
        paths
    }

    /// Brings the queues that name `path` up to date with the file: loads, validates and
    /// configures the new rule for each of them, then swaps it in for all of them at once.
    /// If anything fails, every queue keeps its current rule. A missing file puts its
    /// queues back on the built-in rule. Returns the rule now in use, if any.
    pub fn apply_file(&self, path: &Path) -> Result<Option<Arc<CompiledRule>>> {
        let users: Vec<&QueueSlot> = self.slots.values().filter(|s| s.config.rule.as_deref() == Some(path)).collect();
        if !path.exists() {
            for slot in &users {
                let mut state = slot.state.lock().unwrap();
                if state.rule.is_some() {
                    tracing::warn!(queue = %slot.config.queue, rule = %path.display(), "rule file removed; using the built-in rule");
                }
                *state = SlotState { last_error: Some(format!("rule file {} is missing", path.display())), ..SlotState::default() };
            }
            return Ok(None);
        }
        let result = self.prepare(path, &users);
        let (rule, instances) = match result {
            Ok(prepared) => prepared,
            Err(error) => {
                let message = format!("{error:#}");
                for slot in &users {
                    slot.state.lock().unwrap().last_error = Some(message.clone());
                }
                return Err(error);
            }
        };
        for (slot, instance) in users.iter().zip(instances) {
            let mut state = slot.state.lock().unwrap();
            let previous = state.rule.as_ref().map(|r| r.sha256.clone());
            *state = SlotState { rule: Some(rule.clone()), instance: Some(instance), ..SlotState::default() };
            if previous.as_deref() != Some(rule.sha256.as_str()) {
                tracing::info!(queue = %slot.config.queue, rule = %rule.name, sha256 = %&rule.sha256[..12], from_cache = rule.from_cache, "rule loaded");
            }
        }
        Ok(Some(rule))
    }

    fn prepare(&self, path: &Path, users: &[&QueueSlot]) -> Result<(Arc<CompiledRule>, Vec<RuleInstance>)> {
        let rule = self.engine.load_file(path)?;
        let instances = users
            .iter()
            .map(|slot| {
                self.engine
                    .instantiate(&rule, &slot.config.params)
                    .with_context(|| format!("rule {} cannot serve queue {}", rule.name, slot.config.queue))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((rule, instances))
    }

    /// `GetOptimalDequeueTaskCount` for `queue`, clamped to `[min_tasks, max_tasks]`.
    ///
    /// # Panics
    /// If `queue` was not configured.
    pub fn decide_task_count(&self, queue: &str, state: &QueueState) -> Decision<u32> {
        let slot = self.slot(queue);
        let (raw, source) = self.decide(slot, |i| i.optimal_dequeue_task_count(state), || paper::optimal_dequeue_task_count(state));
        let value = raw.clamp(state.min_tasks, state.max_tasks.max(state.min_tasks));
        slot.finish(Decision { value, source, clamped: value != raw })
    }

    /// `QueueEmpty` for `queue`: the delay is clamped to `[min_interval_ms, max_interval_ms]`.
    ///
    /// # Panics
    /// If `queue` was not configured.
    pub fn decide_queue_empty(&self, queue: &str, ctx: &IdleContext) -> Decision<IdleDecision> {
        let slot = self.slot(queue);
        let (raw, source) = self.decide(slot, |i| i.on_queue_empty(ctx), || paper::on_queue_empty(ctx));
        let delay_ms = raw.delay_ms.clamp(ctx.min_interval_ms, ctx.max_interval_ms.max(ctx.min_interval_ms));
        let value = IdleDecision { delay_ms, stop: raw.stop };
        slot.finish(Decision { value, source, clamped: delay_ms != raw.delay_ms })
    }

    /// The rule state of `queue`, or `None` if it is not configured.
    pub fn status(&self, queue: &str) -> Option<RuleStatus> {
        let slot = self.slots.get(queue)?;
        let state = slot.state.lock().unwrap();
        Some(RuleStatus {
            file: state.rule.as_ref().map(|r| r.name.clone()),
            sha256: state.rule.as_ref().map(|r| r.sha256.clone()),
            loaded_at: state.rule.as_ref().map(|r| r.loaded_at),
            quarantined: state.quarantined,
            decisions: slot.decisions.load(Ordering::Relaxed),
            faults: slot.faults.load(Ordering::Relaxed),
            clamps: slot.clamps.load(Ordering::Relaxed),
            last_error: state.last_error.clone(),
        })
    }

    fn slot(&self, queue: &str) -> &QueueSlot {
        self.slots.get(queue).unwrap_or_else(|| panic!("queue {queue} has no rule slot"))
    }

    fn decide<T>(
        &self,
        slot: &QueueSlot,
        call: impl FnOnce(&mut RuleInstance) -> Result<T>,
        built_in: impl FnOnce() -> T,
    ) -> (T, DecisionSource) {
        let mut guard = slot.state.lock().unwrap();
        let state = &mut *guard;
        let Some(rule) = state.rule.clone() else { return (built_in(), DecisionSource::BuiltIn) };
        if state.quarantined {
            return (built_in(), DecisionSource::BuiltIn);
        }
        let instance = match state.instance.take() {
            Some(instance) => Ok(instance),
            // The previous call trapped: a trapped instance cannot be entered again.
            None => self.engine.instantiate(&rule, &slot.config.params),
        };
        let outcome = instance.and_then(|mut instance| {
            let result = call(&mut instance);
            state.output_logger.drain(instance.output(), &slot.config.queue, &rule.name);
            result.map(|value| (value, instance))
        });
        match outcome {
            Ok((value, instance)) => {
                state.instance = Some(instance);
                state.consecutive_faults = 0;
                (value, DecisionSource::Rule)
            }
            Err(error) => {
                slot.faults.fetch_add(1, Ordering::Relaxed);
                state.consecutive_faults += 1;
                let reason = format!("{error:#}");
                tracing::warn!(queue = %slot.config.queue, rule = %rule.name, %reason, "rule faulted; the built-in rule decides this call");
                if state.consecutive_faults >= self.engine.limits().quarantine_after {
                    state.quarantined = true;
                    tracing::warn!(queue = %slot.config.queue, rule = %rule.name, faults = state.consecutive_faults, "rule quarantined until its file changes");
                }
                state.last_error = Some(reason);
                (built_in(), DecisionSource::Fallback)
            }
        }
    }
}

impl QueueSlot {
    fn finish<T>(&self, decision: Decision<T>) -> Decision<T> {
        self.decisions.fetch_add(1, Ordering::Relaxed);
        if decision.clamped {
            self.clamps.fetch_add(1, Ordering::Relaxed);
        }
        decision
    }
}
