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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, Result};
use ebb_rules_sdk::{HandlerState, IdleContext, IdleDecision, QueueState};
use sha2::{Digest, Sha256};

use super::decision::{Decision, DecisionSource, built_in_queue_empty, built_in_task_count};
use super::engine::{CompiledRule, RuleEngine};
use super::file::read_rule_file;
use super::lock;
use super::memory::release_free_memory_after;
use super::queue_rules::{FAULT_LOG_LINES, FAULT_LOG_WINDOW, FaultRuns, Live, QueueEntry, QueueRules, RefusedFile, RuleGroup, RuleLoad, RuleStatus};
use super::threads::RuleThreads;
use crate::log_limit::LogLimiter;
use crate::names::DecisionSite;
use crate::panics::panic_message;

/// Which rule a decision site uses, from the host configuration.
#[derive(Debug, Clone)]
pub struct QueueRuleConfig {
    /// The site: a storage queue, or a queue's KEDA site.
    pub slot: DecisionSite,
    /// The rule file; `None` for the built-in rule.
    pub rule: Option<PathBuf>,
    /// The queue's `rule_params`, passed to the rule's `configure`.
    pub params: Vec<(String, String)>,
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
    queues: HashMap<DecisionSite, QueueRules>,
    groups: Vec<Arc<RuleGroup>>,
    seen: Mutex<HashMap<PathBuf, Seen>>,
    file_reads: AtomicU64,
    swaps: AtomicU64,
    /// One per rule file: held while the file is applied, so that a slow start-up compile and
    /// a file event for the same file apply in turn (the newer content last).
    applying: HashMap<PathBuf, Mutex<()>>,
    /// The background loads, the rebuilds and the watcher: see [`RuleSet::stop_threads`].
    pub(super) threads: Arc<RuleThreads>,
}

impl RuleSet {
    /// Entries for these queues, all on the built-in rule until [`RuleSet::load_all`] or a
    /// file event loads their rule. Queues with the same rule file and the same parameters
    /// share one rule instance.
    pub fn new(engine: Arc<RuleEngine>, queues: impl IntoIterator<Item = QueueRuleConfig>) -> Self {
        let threads = Arc::new(RuleThreads::default());
        let mut groups: Vec<Arc<RuleGroup>> = Vec::new();
        // (rule file, sorted parameters) -> (group index, its queues)
        // A shadow never shares a group with a live site: its faults must not quarantine a live rule.
        type Members = HashMap<(Option<PathBuf>, Vec<(String, String)>, bool), (usize, Vec<DecisionSite>)>;
        let mut members: Members = HashMap::new();
        let mut configs = Vec::new();
        for config in queues {
            let mut params = config.params.clone();
            params.sort();
            let next = members.len();
            let entry = members.entry((config.rule.clone(), params, config.slot.is_shadow())).or_insert_with(|| (next, Vec::new()));
            entry.1.push(config.slot.clone());
            configs.push((entry.0, config));
        }
        let mut ordered: Vec<_> = members.into_iter().collect();
        ordered.sort_by_key(|(_, (index, _))| *index);
        for ((path, _, _), (_, queues)) in ordered {
            let params = configs.iter().find(|(_, c)| c.slot == queues[0]).map(|(_, c)| c.params.clone()).unwrap_or_default();
            groups.push(Arc::new(RuleGroup {
                engine: engine.clone(),
                path,
                params,
                queues,
                slot: Mutex::default(),
                status: Mutex::default(),
                rebuilt: std::sync::Condvar::new(),
                consecutive_faults: FaultRuns::default(),
                memory_bytes: AtomicU64::new(0),
                fault_log: LogLimiter::new(FAULT_LOG_LINES, FAULT_LOG_WINDOW),
                threads: threads.clone(),
            }));
        }
        let queues = configs
            .into_iter()
            .map(|(index, config)| {
                let slot = QueueEntry {
                    name: config.slot.clone(),
                    group: groups[index].clone(),
                    decisions: AtomicU64::new(0),
                    faults_total: AtomicU64::new(0),
                    file_faults: Mutex::new((0, 0)),
                    waited_calls: AtomicU64::new(0),
                    clamps: AtomicU64::new(0),
                    while_compiling: AtomicU64::new(0),
                };
                (config.slot, QueueRules { slot: Arc::new(slot) })
            })
            .collect();
        let applying = groups.iter().filter_map(|g| g.path.clone()).map(|path| (path, Mutex::default())).collect();
        RuleSet { engine, queues, groups, seen: Mutex::default(), file_reads: AtomicU64::new(0), swaps: AtomicU64::new(0), applying, threads }
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

    /// Starts loading every rule file a queue names, each on a thread of its own, and returns
    /// at once: until a queue's rule is ready its decisions come from the built-in rule, with
    /// source [`DecisionSource::Compiling`], and [`QueueRules::load_state`] says
    /// [`RuleLoad::Compiling`]; then the rule is swapped in as a hot swap does. A failure is
    /// logged and kept (`RuleLoad::Failed`); the queue stays on the built-in rule until the
    /// file is fixed. This is how a host starts: a rule that takes seconds to compile (a
    /// Python rule on an empty cache) delays nothing.
    pub fn load_all_in_background(self: &Arc<Self>) {
        for path in self.rule_files() {
            for group in self.users(&path) {
                lock(&group.status).compiling = true;
            }
            let set = self.clone();
            let loading = path.clone();
            let error = match self.threads.spawn("ebb-rule-load", move || set.load_in_background(&loading)) {
                Ok(true) => continue,
                Ok(false) => anyhow::anyhow!("rule {} was not loaded: the host is stopping", path.display()),
                Err(error) => anyhow::anyhow!("could not start loading rule {}: {error}", path.display()),
            };
            let (slots, meanwhile) = self.while_unusable(&path);
            tracing::warn!(%slots, "{error:#}; {meanwhile}");
            self.record_error(&path, &error, None);
            self.users(&path).iter().for_each(|group| lock(&group.status).compiling = false);
        }
    }

    /// Stops the set's threads: starts no more background loads, rebuilds or watching, and
    /// waits up to `bound` for the running ones (a compile or an instantiation in progress
    /// cannot be interrupted) and joins them. Returns how many still ran at the bound; they
    /// end on their own, and change nothing a stopped host reads. Decisions go on (a faulted
    /// rule is no longer rebuilt: the built-in rule decides in its place).
    pub fn stop_threads(&self, bound: std::time::Duration) -> usize {
        self.threads.stop(bound)
    }

    /// Threads the set started (background loads, rebuilds, the watcher) that have not ended.
    pub fn running_threads(&self) -> usize {
        self.threads.running()
    }

    fn load_in_background(&self, path: &Path) {
        let started = std::time::Instant::now();
        let loaded = catch_unwind(AssertUnwindSafe(|| self.apply_file(path)));
        // `apply_file` keeps its own errors in the status; the others are kept here.
        let (error, kept) = match loaded {
            Ok(Ok(Some(rule))) => {
                let elapsed = started.elapsed();
                let (slots, _) = self.while_unusable(path);
                let users = self.users(path);
                let now = match (users.iter().any(|g| !g.is_shadow()), users.iter().any(|g| g.is_shadow())) {
                    (true, false) => "its queues no longer use the built-in rule",
                    (false, true) => "its shadow rule slots ask it beside the live rules, never applied",
                    _ => "its queues no longer use the built-in rule, and its shadow rule slots ask it beside the live rules",
                };
                tracing::info!(%slots, rule = %rule.name, from_cache = rule.from_cache, ?elapsed, "rule ready; {now}");
                (None, true)
            }
            Ok(Ok(None)) => (Some(anyhow::anyhow!("rule file {} does not exist", path.display())), true),
            Ok(Err(error)) => (Some(error), true),
            Err(panic) => (Some(anyhow::anyhow!("the host panicked while loading rule {}: {}", path.display(), panic_message(&*panic))), false),
        };
        if let Some(error) = &error {
            let (slots, meanwhile) = self.while_unusable(path);
            tracing::warn!(%slots, "{error:#}; until the file is fixed, {meanwhile}");
            if !kept {
                self.record_error(path, error, None);
            }
        }
        for group in self.users(path) {
            lock(&group.status).compiling = false;
        }
    }

    /// Whether `queue`'s rule is loaded, still compiling, or failed; `None` for an unknown queue.
    pub fn load_state(&self, queue: &str) -> Option<RuleLoad> {
        self.queues.get(queue).map(QueueRules::load_state)
    }

    /// Held while `path` is applied (`None` for a file no queue names).
    fn applying(&self, path: &Path) -> Option<std::sync::MutexGuard<'_, ()>> {
        self.applying.get(path).map(lock)
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
        let _applying = self.applying(path);
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
                self.record_error(path, &error, None);
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
        let _applying = self.applying(path);
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
                    let (slots, meanwhile) = self.while_unusable(path);
                    tracing::warn!(rule = %name, %slots, "not using this file ({meanwhile}): {error:#}");
                }
                // The file's bytes (as large as the rule) are freed only now.
                let freed = bytes.len();
                drop(bytes);
                release_free_memory_after(freed);
            }
            Err(error) => {
                let (slots, meanwhile) = self.while_unusable(path);
                tracing::warn!(rule = %name, %slots, "not using this file ({meanwhile}): {error:#}");
                self.record_error(path, &error, None);
            }
        }
    }

    fn users(&self, path: &Path) -> Vec<&Arc<RuleGroup>> {
        self.groups.iter().filter(|g| g.path.as_deref() == Some(path)).collect()
    }

    /// For a log line about `path` that cannot be used: the sites that name it, and what
    /// they do meanwhile. A shadow's site says so: its failure changes nothing live, and a
    /// line reading as the live rule's failure would send an operator after the wrong file.
    fn while_unusable(&self, path: &Path) -> (String, String) {
        let users = self.users(path);
        let slots = users.iter().flat_map(|group| group.queues.iter().map(|slot| slot.as_str())).collect::<Vec<_>>().join(", ");
        let mut meanwhile = Vec::new();
        if users.iter().any(|group| !group.is_shadow()) {
            meanwhile.push("each queue keeps the rule it has, or the built-in rule");
        }
        if users.iter().any(|group| group.is_shadow()) {
            meanwhile.push("each shadow rule slot keeps the shadow rule it has, or none is asked; the live rules are not affected");
        }
        (slots, meanwhile.join("; "))
    }

    /// Keeps why `path` (whose content has `sha256`, if it could be read) was not loaded: the
    /// last error of its queues, and, for those whose rule goes on deciding, the refused file.
    fn record_error(&self, path: &Path, error: &anyhow::Error, sha256: Option<&str>) {
        let message = format!("{error:#}");
        for group in self.users(path) {
            let mut status = lock(&group.status);
            status.last_error = Some(message.clone());
            if status.rule.is_some() {
                status.refused = Some(RefusedFile {
                    file: path.display().to_string(),
                    sha256: sha256.map(str::to_string),
                    reason: message.clone(),
                    at: std::time::SystemTime::now(),
                });
            }
        }
    }

    fn remove(&self, path: &Path) {
        let mut old = Vec::new();
        for group in self.users(path) {
            let mut slot = lock(&group.slot);
            let mut status = lock(&group.status);
            if status.rule.is_some() {
                match group.is_shadow() {
                    true => {
                        tracing::warn!(queues = %group.label(), rule = %path.display(), "shadow rule file removed; no shadow rule is asked until it is back")
                    }
                    false => tracing::warn!(queues = %group.label(), rule = %path.display(), "rule file removed; using the built-in rule"),
                }
                self.swaps.fetch_add(1, Ordering::Relaxed);
                status.record_swap(None);
            }
            old.push((slot.live.take(), status.rule.take()));
            status.generation += 1;
            status.quarantine = None;
            status.refused = None;
            status.rebuilding = false;
            group.rebuilt.notify_all();
            status.last_error = Some(format!("rule file {} does not exist", path.display()));
            group.consecutive_faults.reset();
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
            // The file holds the rule in use again: nothing is refused any more.
            users.iter().for_each(|group| lock(&group.status).refused = None);
            return Ok(lock(&users[0].status).rule.clone());
        }
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let prepared = self.engine.load_bytes_beside(&name, bytes, path.parent()).with_context(|| format!("failed to load rule {name}")).and_then(|rule| {
            let instances = users
                .iter()
                .map(|group| self.engine.instantiate(&rule, &group.params).with_context(|| format!("rule {} cannot serve {}", rule.name, group.label())))
                .collect::<Result<Vec<_>>>()?;
            Ok((rule, instances))
        });
        let (rule, instances) = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                self.record_error(path, &error, Some(&sha256));
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
            status.quarantine = None;
            status.refused = None;
            status.rebuilding = false;
            group.rebuilt.notify_all();
            status.last_error = None;
            group.consecutive_faults.reset();
            group.memory_bytes.store(memory, Ordering::Relaxed);
            if previous.as_deref() != Some(rule.sha256.as_str()) {
                status.record_swap(Some(&rule));
                let loaded = if group.is_shadow() { "shadow rule loaded" } else { "rule loaded" };
                tracing::info!(queues = %group.label(), rule = %rule.name, sha256 = %&rule.sha256[..12], from_cache = rule.from_cache, "{loaded}");
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

    /// How many handler calls `queue` may run at once, clamped to `[1, max_limit]`; `None`
    /// keeps its configured bound (see [`QueueRules::decide_concurrency`]). An unknown queue
    /// keeps its bound.
    pub fn decide_concurrency(&self, queue: &str, state: &HandlerState) -> Option<Decision<u32>> {
        self.queues.get(queue).and_then(|rules| rules.decide_concurrency(state))
    }

    /// The rule state of `queue`, or `None` if it is not configured. Never waits on a rule.
    pub fn status(&self, queue: &str) -> Option<RuleStatus> {
        self.queues.get(queue).map(QueueRules::status)
    }
}
