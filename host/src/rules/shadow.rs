//! A queue's shadow rule: asked with the live rule's inputs at every decision, never applied.
//!
//! The live decision is made and returned first; its inputs and output then go, by a
//! non-blocking send, to a bounded channel that one thread per shadowed queue drains. That
//! thread asks the shadow, compares, and counts. A full channel drops the decision (counted):
//! a slow or looping shadow costs the live path one failed send, never a wait. A shadow that
//! traps, loops, runs out of memory, is removed or cannot load is a fault or a skip in its
//! counts, and the shadow's own decision site (fallback, rebuild, quarantine) deals with it as it
//! does for a live rule.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result};
use ebb_rules_sdk::{FailureContext, FailureDecision, HandlerState, IdleContext, IdleDecision, QueueState};
use serde::{Deserialize, Serialize};

use super::decider::Decider;
use super::decision::{Decision, DecisionSource};
use super::lock;
use super::queue_rules::RuleStatus;
use crate::log_limit::LogLimiter;

/// Decisions waiting for the shadow, per queue, before new ones are dropped.
pub const SHADOW_CHANNEL_CAPACITY: usize = 1024;

/// The largest disagreements a queue keeps for `/status`.
pub(crate) const TOP_DISAGREEMENTS: usize = 10;

/// At most this many "shadow disagrees" INFO lines per queue per [`SHADOW_LOG_WINDOW`].
const SHADOW_LOG_LINES: u32 = 5;
const SHADOW_LOG_WINDOW: Duration = Duration::from_secs(60);

/// Which decision a comparison is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// `optimal-dequeue-task-count`.
    TaskCount,
    /// `on-queue-empty`.
    QueueEmpty,
    /// `max-concurrent-calls`.
    Concurrency,
    /// `on-handler-failure` (rules that export `ebb:rules/failures@0.4.0`).
    Failure,
}

impl DecisionKind {
    /// Every kind, in the order of [`DecisionKind::index`].
    pub const ALL: [DecisionKind; 4] = [DecisionKind::TaskCount, DecisionKind::QueueEmpty, DecisionKind::Concurrency, DecisionKind::Failure];

    /// The kind's name in `/status` and in the `kind` label of `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            DecisionKind::TaskCount => "task_count",
            DecisionKind::QueueEmpty => "queue_empty",
            DecisionKind::Concurrency => "concurrency",
            DecisionKind::Failure => "failure",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What became of one live decision, as far as the shadow goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ShadowOutcome {
    /// The shadow decided the same.
    Agree,
    /// The shadow decided otherwise.
    Disagree,
    /// The shadow faulted (trap, fuel, deadline, memory, a panic): the built-in rule's
    /// fallback answered in its site, and nothing was compared.
    Fault,
    /// The channel to the shadow was full: the shadow never saw this decision.
    Dropped,
    /// No shadow rule was in use (its file is missing or cannot load, it is quarantined,
    /// compiling or being rebuilt, or it does not decide this kind): nothing was compared.
    Skipped,
}

impl ShadowOutcome {
    /// Every outcome, in the order of [`ShadowOutcome::index`].
    pub const ALL: [ShadowOutcome; 5] = [ShadowOutcome::Agree, ShadowOutcome::Disagree, ShadowOutcome::Fault, ShadowOutcome::Dropped, ShadowOutcome::Skipped];

    /// The outcome's name in `/status` and in the `outcome` label of `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            ShadowOutcome::Agree => "agree",
            ShadowOutcome::Disagree => "disagree",
            ShadowOutcome::Fault => "fault",
            ShadowOutcome::Dropped => "dropped",
            ShadowOutcome::Skipped => "skipped",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Counts of one decision kind, by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ShadowCounts {
    /// Decisions the shadow made the same.
    pub agree: u64,
    /// Decisions the shadow made otherwise.
    pub disagree: u64,
    /// Decisions on which the shadow faulted.
    pub fault: u64,
    /// Decisions the shadow never saw (its channel was full).
    pub dropped: u64,
    /// Decisions with no shadow rule in use to ask.
    pub skipped: u64,
}

impl ShadowCounts {
    /// The count of `outcome`.
    pub(crate) fn get(&self, outcome: ShadowOutcome) -> u64 {
        match outcome {
            ShadowOutcome::Agree => self.agree,
            ShadowOutcome::Disagree => self.disagree,
            ShadowOutcome::Fault => self.fault,
            ShadowOutcome::Dropped => self.dropped,
            ShadowOutcome::Skipped => self.skipped,
        }
    }
}

/// One of the largest disagreements: what the live rule and the shadow were given and said.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Disagreement {
    /// Which decision.
    pub kind: DecisionKind,
    /// How far apart the two are: tasks or calls for a count, milliseconds of delay for
    /// `queue_empty` (plus `max_interval_ms` when only one of them stops the task).
    pub magnitude: u64,
    /// The inputs both rules were given.
    pub inputs: serde_json::Value,
    /// The live decision, as applied.
    pub live: serde_json::Value,
    /// The shadow's decision, never applied.
    pub shadow: serde_json::Value,
    /// When the shadow answered (RFC 3339 in JSON).
    #[serde(with = "humantime_serde")]
    pub at: SystemTime,
}

/// A queue's shadow rule, as `/status` shows it (`shadow` of each queue).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShadowStatus {
    /// The shadow's file name, while one is loaded.
    pub file: Option<String>,
    /// Hex sha256 of the shadow rule in use.
    pub sha256: Option<String>,
    /// Agreements out of the decisions compared, in percent; `None` before the first.
    pub agreement_percent: Option<f64>,
    /// Counts per decision kind (`task_count`, `queue_empty`, `concurrency`, `failure`).
    pub decisions: BTreeMap<String, ShadowCounts>,
    /// The largest disagreements so far, largest first (at most `TOP_DISAGREEMENTS`).
    pub top_disagreements: Vec<Disagreement>,
    /// The shadow rule's own site: its state, faults, quarantine and last error.
    pub rule: Option<RuleStatus>,
}

/// A decision for the shadow to take again.
enum Job {
    TaskCount {
        state: QueueState,
        live: u32,
    },
    QueueEmpty {
        ctx: IdleContext,
        live: IdleDecision,
    },
    Concurrency {
        state: HandlerState,
        live: Option<u32>,
    },
    /// `live`: what the live rule decided, `default` when it decides no failure.
    Failure {
        ctx: FailureContext,
        live: FailureDecision,
    },
    /// Answers once every job before it is done (tests, benchmarks).
    Flush(SyncSender<()>),
}

/// What is counted and kept of a queue's shadow; shared by the decider and its thread.
struct ShadowBook {
    queue: String,
    counts: [[AtomicU64; 5]; DecisionKind::ALL.len()],
    top: Mutex<Vec<Disagreement>>,
    log: LogLimiter,
}

impl ShadowBook {
    fn count(&self, kind: DecisionKind, outcome: ShadowOutcome) {
        self.counts[kind.index()][outcome.index()].fetch_add(1, Ordering::Relaxed);
    }

    fn counts(&self, kind: DecisionKind) -> ShadowCounts {
        let row = &self.counts[kind.index()];
        let get = |outcome: ShadowOutcome| row[outcome.index()].load(Ordering::Relaxed);
        ShadowCounts {
            agree: get(ShadowOutcome::Agree),
            disagree: get(ShadowOutcome::Disagree),
            fault: get(ShadowOutcome::Fault),
            dropped: get(ShadowOutcome::Dropped),
            skipped: get(ShadowOutcome::Skipped),
        }
    }

    /// Keeps `candidate` if it is among the largest; ties keep the older one.
    fn keep(&self, candidate: Disagreement) {
        let mut top = lock(&self.top);
        if top.len() >= TOP_DISAGREEMENTS && top.last().is_some_and(|smallest| smallest.magnitude >= candidate.magnitude) {
            return;
        }
        let at = top.iter().position(|d| d.magnitude < candidate.magnitude).unwrap_or(top.len());
        top.insert(at, candidate);
        top.truncate(TOP_DISAGREEMENTS);
    }

    fn would_keep(&self, magnitude: u64) -> bool {
        let top = lock(&self.top);
        top.len() < TOP_DISAGREEMENTS || top.last().is_some_and(|smallest| smallest.magnitude < magnitude)
    }
}

/// A decider with a shadow: decides as `live`, then hands the inputs and the decision to
/// the shadow's thread, which asks `shadow` and compares. Nothing of the shadow reaches the
/// decision returned.
pub struct Shadowed {
    live: Arc<dyn Decider>,
    shadow: Arc<dyn Decider>,
    book: Arc<ShadowBook>,
    jobs: SyncSender<Job>,
}

impl Shadowed {
    /// `live` with `shadow` beside it, for `queue`, with a channel of `capacity` decisions.
    /// Starts the shadow's thread, which ends when this decider is dropped.
    pub fn new(queue: &str, live: Arc<dyn Decider>, shadow: Arc<dyn Decider>, capacity: usize) -> Result<Shadowed> {
        let (jobs, received) = sync_channel(capacity);
        let book = Arc::new(ShadowBook {
            queue: queue.to_string(),
            counts: Default::default(),
            top: Mutex::default(),
            log: LogLimiter::new(SHADOW_LOG_LINES, SHADOW_LOG_WINDOW),
        });
        let worker = Worker { shadow: shadow.clone(), book: book.clone(), dropped_logged: 0 };
        std::thread::Builder::new()
            .name("ebb-shadow".into())
            .spawn(move || worker.run(received))
            .with_context(|| format!("could not start the shadow rule's thread of queue {queue}"))?;
        Ok(Shadowed { live, shadow, book, jobs })
    }

    /// Waits up to `bound` until the shadow has taken every decision handed to it so far;
    /// false at the bound. For tests and benchmarks: a live decision never waits on this.
    pub fn flush(&self, bound: Duration) -> bool {
        let (done, finished) = sync_channel(1);
        let sent = self.jobs.send(Job::Flush(done)).is_ok();
        sent && finished.recv_timeout(bound).is_ok()
    }

    /// The shadow's counts and largest disagreements, and its rule's own status.
    pub fn shadow_status(&self) -> ShadowStatus {
        let decisions: BTreeMap<String, ShadowCounts> = DecisionKind::ALL.iter().map(|&kind| (kind.name().to_string(), self.book.counts(kind))).collect();
        let (agree, disagree) = decisions.values().fold((0u64, 0u64), |(a, d), c| (a.saturating_add(c.agree), d.saturating_add(c.disagree)));
        let compared = agree.saturating_add(disagree);
        let rule = self.shadow.status();
        ShadowStatus {
            file: rule.as_ref().and_then(|r| r.file.clone()),
            sha256: rule.as_ref().and_then(|r| r.sha256.clone()),
            agreement_percent: (compared > 0).then(|| agree as f64 * 100.0 / compared as f64),
            decisions,
            top_disagreements: lock(&self.book.top).clone(),
            rule,
        }
    }

    fn hand_over(&self, kind: DecisionKind, job: Job) {
        match self.jobs.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => self.book.count(kind, ShadowOutcome::Dropped),
        }
    }
}

impl Decider for Shadowed {
    fn decide_task_count(&self, state: &QueueState) -> Decision<u32> {
        let decision = self.live.decide_task_count(state);
        self.hand_over(DecisionKind::TaskCount, Job::TaskCount { state: state.clone(), live: decision.value });
        decision
    }

    fn decide_queue_empty(&self, ctx: &IdleContext) -> Decision<IdleDecision> {
        let decision = self.live.decide_queue_empty(ctx);
        self.hand_over(DecisionKind::QueueEmpty, Job::QueueEmpty { ctx: ctx.clone(), live: decision.value });
        decision
    }

    fn decide_concurrency(&self, state: &HandlerState) -> Option<Decision<u32>> {
        let decision = self.live.decide_concurrency(state);
        self.hand_over(DecisionKind::Concurrency, Job::Concurrency { state: state.clone(), live: decision.map(|d| d.value) });
        decision
    }

    fn may_decide_concurrency(&self) -> bool {
        self.live.may_decide_concurrency()
    }

    /// The live rule's decision (`None`: `max_dequeue_count` decides), then the shadow is
    /// handed the failure, compared with what the live side decided.
    fn decide_failure(&self, ctx: &FailureContext) -> Option<Decision<FailureDecision>> {
        let decision = if self.live.may_decide_failures() { self.live.decide_failure(ctx) } else { None };
        let live = decision.as_ref().map_or(FailureDecision::Default, |d| d.value.clone());
        self.hand_over(DecisionKind::Failure, Job::Failure { ctx: ctx.clone(), live });
        decision
    }

    /// Either side: the listener asks (and so the shadow is asked) when the shadow decides
    /// failures though the live rule does not; the live answer is then `None`, as without it.
    fn may_decide_failures(&self) -> bool {
        self.live.may_decide_failures() || self.shadow.may_decide_failures()
    }

    fn status(&self) -> Option<RuleStatus> {
        self.live.status()
    }

    fn shadow_status(&self) -> Option<ShadowStatus> {
        Some(Shadowed::shadow_status(self))
    }

    fn may_block(&self) -> bool {
        self.live.may_block()
    }
}

/// The shadow's thread.
struct Worker {
    shadow: Arc<dyn Decider>,
    book: Arc<ShadowBook>,
    dropped_logged: u64,
}

/// A shadow's answer, before it is compared.
enum Answer<T> {
    Decided(T),
    Fault,
    Skipped,
}

impl<T> Answer<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Answer<U> {
        match self {
            Answer::Decided(value) => Answer::Decided(f(value)),
            Answer::Fault => Answer::Fault,
            Answer::Skipped => Answer::Skipped,
        }
    }
}

/// A failure decision, compared by what it does to the message: retried after a delay, or
/// poisoned (`default` is the host's handling: the doubling delay, or poison at
/// `max_dequeue_count`). Two poisons with other reasons agree. Shown as the decision.
#[derive(Debug, Clone)]
struct FailureOutcome {
    decision: FailureDecision,
    /// `None`: poisoned.
    retry_after_ms: Option<u64>,
}

impl FailureOutcome {
    fn new(decision: FailureDecision, ctx: &FailureContext) -> FailureOutcome {
        let retry_after_ms = match &decision {
            FailureDecision::Retry(delay_ms) => Some(*delay_ms),
            FailureDecision::Poison(_) => None,
            FailureDecision::Default => (ctx.dequeue_count < ctx.max_dequeue_count).then_some(ctx.default_retry_delay_ms),
        };
        FailureOutcome { decision, retry_after_ms }
    }
}

impl PartialEq for FailureOutcome {
    fn eq(&self, other: &Self) -> bool {
        self.retry_after_ms == other.retry_after_ms
    }
}

impl Serialize for FailureOutcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        self.decision.serialize(serializer)
    }
}

fn answer<T>(decision: std::thread::Result<Decision<T>>) -> Answer<T> {
    match decision {
        Ok(Decision { value, source: DecisionSource::Rule, .. }) => Answer::Decided(value),
        Ok(Decision { source: DecisionSource::Fallback, .. }) | Err(_) => Answer::Fault,
        Ok(Decision { source: DecisionSource::BuiltIn | DecisionSource::Compiling, .. }) => Answer::Skipped,
    }
}

impl Worker {
    fn run(mut self, jobs: Receiver<Job>) {
        let span = tracing::info_span!("shadow", queue = %self.book.queue);
        let _entered = span.enter();
        while let Ok(job) = jobs.recv() {
            self.take(job);
            self.log_dropped();
        }
    }

    fn take(&self, job: Job) {
        let shadow = &*self.shadow;
        match job {
            Job::TaskCount { state, live } => {
                let answer = answer(catch_unwind(AssertUnwindSafe(|| shadow.decide_task_count(&state))));
                self.compare(DecisionKind::TaskCount, answer, live, |s| u64::from(s.abs_diff(live)), || json(&state));
            }
            Job::QueueEmpty { ctx, live } => {
                let answer = answer(catch_unwind(AssertUnwindSafe(|| shadow.decide_queue_empty(&ctx))));
                let stop_weight = ctx.max_interval_ms;
                let magnitude = |s: &IdleDecision| s.delay_ms.abs_diff(live.delay_ms).saturating_add(if s.stop == live.stop { 0 } else { stop_weight });
                self.compare(DecisionKind::QueueEmpty, answer, live, magnitude, || json(&ctx));
            }
            Job::Concurrency { state, live } => {
                // A quarantined rule's "none" is its fallback keeping the bound, not its answer.
                if !shadow.may_decide_concurrency() || shadow.status().is_some_and(|s| s.quarantined) {
                    return self.book.count(DecisionKind::Concurrency, ShadowOutcome::Skipped);
                }
                // A WASM rule's fault here answers "none" like a rule that keeps the bound: its
                // site's fault count tells them apart (only this thread asks the shadow's site).
                let faults = || shadow.status().map_or(0, |s| s.faults_total);
                let before = faults();
                let answer = match catch_unwind(AssertUnwindSafe(|| shadow.decide_concurrency(&state))) {
                    Ok(_) if faults() > before => Answer::Fault,
                    Ok(None) => Answer::Decided(None),
                    Ok(Some(decision)) => match answer(Ok(decision)) {
                        Answer::Decided(value) => Answer::Decided(Some(value)),
                        Answer::Fault => Answer::Fault,
                        Answer::Skipped => Answer::Skipped,
                    },
                    Err(_) => Answer::Fault,
                };
                // "None" keeps the configured bound, which is `max_limit`.
                let bound = |v: Option<u32>| v.unwrap_or(state.max_limit);
                self.compare(DecisionKind::Concurrency, answer, live, |s| u64::from(bound(*s).abs_diff(bound(live))), || json(&state));
            }
            Job::Failure { ctx, live } => {
                if !shadow.may_decide_failures() {
                    return self.book.count(DecisionKind::Failure, ShadowOutcome::Skipped);
                }
                let answer = match catch_unwind(AssertUnwindSafe(|| shadow.decide_failure(&ctx))) {
                    Ok(None) => Answer::Skipped,
                    Ok(Some(decision)) => answer(Ok(decision)),
                    Err(_) => Answer::Fault,
                }
                .map(|decision| FailureOutcome::new(decision, &ctx));
                let live = FailureOutcome::new(live, &ctx);
                let magnitude = |s: &FailureOutcome| match (s.retry_after_ms, live.retry_after_ms) {
                    (Some(a), Some(b)) => a.abs_diff(b),
                    (None, None) => 0,
                    // Poisoned on one side, retried on the other: at least the longest retry apart.
                    _ => ctx.max_retry_delay_ms,
                };
                self.compare(DecisionKind::Failure, answer, live.clone(), magnitude, || json(&ctx));
            }
            Job::Flush(done) => {
                let _ = done.send(());
            }
        }
    }

    fn compare<T: PartialEq + Serialize + std::fmt::Debug>(
        &self,
        kind: DecisionKind,
        answer: Answer<T>,
        live: T,
        magnitude: impl Fn(&T) -> u64,
        inputs: impl FnOnce() -> serde_json::Value,
    ) {
        let shadow = match answer {
            Answer::Decided(shadow) => shadow,
            Answer::Fault => return self.book.count(kind, ShadowOutcome::Fault),
            Answer::Skipped => return self.book.count(kind, ShadowOutcome::Skipped),
        };
        if shadow == live {
            return self.book.count(kind, ShadowOutcome::Agree);
        }
        self.book.count(kind, ShadowOutcome::Disagree);
        let magnitude = magnitude(&shadow);
        match self.book.log.allow() {
            Some(0) => tracing::info!(kind = kind.name(), ?live, ?shadow, magnitude, "the shadow rule disagrees with the live rule"),
            Some(suppressed) => tracing::info!(
                kind = kind.name(),
                ?live,
                ?shadow,
                magnitude,
                suppressed,
                "the shadow rule disagrees with the live rule ({suppressed} more such lines were suppressed; /status counts them all)"
            ),
            None => {}
        }
        if self.book.would_keep(magnitude) {
            self.book.keep(Disagreement { kind, magnitude, inputs: inputs(), live: json(&live), shadow: json(&shadow), at: SystemTime::now() });
        }
    }

    fn log_dropped(&mut self) {
        let dropped: u64 = DecisionKind::ALL.iter().map(|&k| self.book.counts(k).dropped).sum();
        if dropped > self.dropped_logged && self.book.log.allow().is_some() {
            tracing::warn!(
                dropped = dropped - self.dropped_logged,
                "the shadow rule fell behind; decisions it could not take were dropped (live decisions are unaffected)"
            );
            self.dropped_logged = dropped;
        }
    }
}

fn json<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{Receiver, Sender, channel};

    use super::*;
    use crate::rules::{BuiltInRule, NativeRule, QueueRuleConfig, RuleEngine, RuleLimits, RuleSet};

    const BOUND: Duration = Duration::from_secs(10);

    /// Decides `tasks` tasks and `delay_ms` when empty.
    struct Fixed {
        tasks: u32,
        delay_ms: u64,
    }

    impl NativeRule for Fixed {
        fn name(&self) -> &str {
            "fixed"
        }
        fn optimal_dequeue_task_count(&self, _state: &QueueState) -> u32 {
            self.tasks
        }
        fn on_queue_empty(&self, _ctx: &IdleContext) -> IdleDecision {
            IdleDecision { delay_ms: self.delay_ms, stop: false }
        }
    }

    /// Decides as many tasks as the queue is deep.
    struct DepthTasks;

    impl NativeRule for DepthTasks {
        fn name(&self) -> &str {
            "depth"
        }
        fn optimal_dequeue_task_count(&self, state: &QueueState) -> u32 {
            u32::try_from(state.approximate_depth).unwrap_or(u32::MAX)
        }
        fn on_queue_empty(&self, _ctx: &IdleContext) -> IdleDecision {
            IdleDecision::default()
        }
    }

    struct Panics;

    impl NativeRule for Panics {
        fn name(&self) -> &str {
            "panics"
        }
        fn optimal_dequeue_task_count(&self, _state: &QueueState) -> u32 {
            panic!("a shadow rule's bug")
        }
        fn on_queue_empty(&self, _ctx: &IdleContext) -> IdleDecision {
            panic!("a shadow rule's bug")
        }
    }

    /// Says it has started, then holds its thread until released.
    struct Stuck {
        started: Mutex<Sender<()>>,
        release: Mutex<Receiver<()>>,
    }

    impl NativeRule for Stuck {
        fn name(&self) -> &str {
            "stuck"
        }
        fn optimal_dequeue_task_count(&self, _state: &QueueState) -> u32 {
            let _ = lock(&self.started).send(());
            let _ = lock(&self.release).recv();
            1
        }
        fn on_queue_empty(&self, _ctx: &IdleContext) -> IdleDecision {
            IdleDecision::default()
        }
    }

    fn state(depth: u64) -> QueueState {
        QueueState { min_tasks: 0, max_tasks: 10_000, approximate_depth: depth, ..Default::default() }
    }

    fn idle() -> IdleContext {
        IdleContext { idle_count: 1, min_interval_ms: 10, max_interval_ms: 60_000, ..Default::default() }
    }

    fn shadowed(live: impl Decider, shadow: impl Decider, capacity: usize) -> Shadowed {
        Shadowed::new("work", Arc::new(live), Arc::new(shadow), capacity).unwrap()
    }

    #[test]
    fn a_panicking_shadow_never_changes_the_live_decision_and_counts_faults() {
        let decider = shadowed(Fixed { tasks: 3, delay_ms: 500 }, Panics, 16);
        for depth in 0..5 {
            assert_eq!(decider.decide_task_count(&state(depth)), Fixed { tasks: 3, delay_ms: 500 }.decide_task_count(&state(depth)));
        }
        assert_eq!(decider.decide_queue_empty(&idle()).value, IdleDecision { delay_ms: 500, stop: false });
        assert!(decider.flush(BOUND));
        let status = decider.shadow_status();
        assert_eq!(status.decisions["task_count"], ShadowCounts { fault: 5, ..Default::default() });
        assert_eq!(status.decisions["queue_empty"], ShadowCounts { fault: 1, ..Default::default() });
        assert_eq!(status.agreement_percent, None, "nothing was compared");
    }

    #[test]
    fn agreements_and_disagreements_are_counted_per_kind() {
        // Live: 4 tasks; shadow: as deep as the queue. Depths 4 and 4 agree; 1, 2, 9 do not.
        let decider = shadowed(Fixed { tasks: 4, delay_ms: 100 }, DepthTasks, 16);
        for depth in [4, 1, 4, 2, 9] {
            assert_eq!(decider.decide_task_count(&state(depth)).value, 4);
        }
        // The shadow's empty-queue delay is 0, clamped to 10: a disagreement of 90 ms.
        decider.decide_queue_empty(&idle());
        assert!(decider.flush(BOUND));
        let status = decider.shadow_status();
        assert_eq!(status.decisions["task_count"], ShadowCounts { agree: 2, disagree: 3, ..Default::default() });
        assert_eq!(status.decisions["queue_empty"], ShadowCounts { disagree: 1, ..Default::default() });
        assert_eq!(status.decisions["concurrency"], ShadowCounts::default());
        assert_eq!(status.agreement_percent, Some(2.0 * 100.0 / 6.0));
        let largest = &status.top_disagreements[0];
        assert_eq!((largest.kind, largest.magnitude), (DecisionKind::QueueEmpty, 90));
        assert_eq!(
            (&largest.live, &largest.shadow),
            (&serde_json::json!({"delay_ms": 100, "stop": false}), &serde_json::json!({"delay_ms": 10, "stop": false}))
        );
        assert_eq!(status.top_disagreements[1].magnitude, 5, "depth 9 against 4 tasks");
        assert_eq!(status.top_disagreements[1].inputs["approximate_depth"], 9);
    }

    /// Answers every failure with its decision (none: the rule lacks the interface).
    struct Fails(Option<FailureDecision>);

    impl NativeRule for Fails {
        fn name(&self) -> &str {
            "fails"
        }
        fn optimal_dequeue_task_count(&self, _state: &QueueState) -> u32 {
            1
        }
        fn on_queue_empty(&self, _ctx: &IdleContext) -> IdleDecision {
            IdleDecision::default()
        }
        fn on_handler_failure(&self, _ctx: &FailureContext) -> Option<FailureDecision> {
            self.0.clone()
        }
    }

    /// Issue 22, defect 7: a shadow that decides failures was never asked about them. It is
    /// asked with the live rule's inputs, never applied, and compared by what would happen to
    /// the message (retried after which delay, or poisoned).
    #[test]
    fn a_shadow_is_asked_about_failures_never_applied_and_compared_by_what_would_happen() {
        let ctx = |tries| FailureContext {
            dequeue_count: tries,
            max_dequeue_count: 3,
            default_retry_delay_ms: 1_000,
            max_retry_delay_ms: 60_000,
            ..Default::default()
        };
        // The live rule keeps max_dequeue_count; the shadow retries after 1 s.
        let decider = shadowed(Fails(None), Fails(Some(FailureDecision::Retry(1_000))), 16);
        assert!(decider.may_decide_failures(), "failures are asked about, so that the shadow is");
        assert_eq!(decider.decide_failure(&ctx(1)), None, "the live rule's answer, not the shadow's");
        assert_eq!(decider.decide_failure(&ctx(3)), None);
        assert!(decider.flush(BOUND));
        let status = decider.shadow_status();
        // The first failure is retried after 1 s either way; at the third the default poisons.
        assert_eq!(status.decisions["failure"], ShadowCounts { agree: 1, disagree: 1, ..Default::default() });
        let largest = &status.top_disagreements[0];
        assert_eq!((largest.kind, largest.magnitude), (DecisionKind::Failure, 60_000));
        assert_eq!((&largest.live, &largest.shadow), (&serde_json::json!("default"), &serde_json::json!({"retry": 1000})));
        assert_eq!(largest.inputs["dequeue_count"], 3);

        // A live decision is applied whatever the shadow says; two poisons agree.
        let decider = shadowed(Fails(Some(FailureDecision::Poison("live".into()))), Fails(Some(FailureDecision::Poison("shadow".into()))), 16);
        assert_eq!(decider.decide_failure(&ctx(1)).map(|d| d.value), Some(FailureDecision::Poison("live".into())));
        let decider_retry = shadowed(Fails(Some(FailureDecision::Retry(5_000))), Fails(Some(FailureDecision::Retry(2_000))), 16);
        assert_eq!(decider_retry.decide_failure(&ctx(1)).map(|d| d.value), Some(FailureDecision::Retry(5_000)));
        assert!(decider.flush(BOUND) && decider_retry.flush(BOUND));
        assert_eq!(decider.shadow_status().decisions["failure"], ShadowCounts { agree: 1, ..Default::default() });
        let retried = decider_retry.shadow_status();
        assert_eq!(retried.decisions["failure"], ShadowCounts { disagree: 1, ..Default::default() });
        assert_eq!(retried.top_disagreements[0].magnitude, 3_000);

        // A shadow without the interface is skipped, not compared.
        let decider = shadowed(Fails(Some(FailureDecision::Retry(5_000))), Fails(None), 16);
        decider.decide_failure(&ctx(1));
        assert!(decider.flush(BOUND));
        assert_eq!(decider.shadow_status().decisions["failure"], ShadowCounts { skipped: 1, ..Default::default() });
    }

    #[test]
    fn the_top_disagreements_are_bounded_and_keep_the_largest() {
        let decider = shadowed(Fixed { tasks: 0, delay_ms: 0 }, DepthTasks, 256);
        // Magnitudes 1..=100 in a scrambled order.
        for i in 0..100u64 {
            decider.decide_task_count(&state((i * 37) % 100 + 1));
        }
        assert!(decider.flush(BOUND));
        let status = decider.shadow_status();
        assert_eq!(status.decisions["task_count"].disagree, 100);
        let kept: Vec<u64> = status.top_disagreements.iter().map(|d| d.magnitude).collect();
        assert_eq!(kept, (91..=100).rev().collect::<Vec<u64>>());
    }

    #[test]
    fn a_full_channel_drops_and_counts_without_waiting() {
        let (started, on_start) = channel();
        let (release, on_release) = channel();
        let decider = shadowed(Fixed { tasks: 2, delay_ms: 0 }, Stuck { started: Mutex::new(started), release: Mutex::new(on_release) }, 3);
        decider.decide_task_count(&state(1));
        on_start.recv_timeout(BOUND).expect("the shadow took the first decision");
        // The shadow holds its thread: 3 decisions fill the channel, the next 4 are dropped.
        for _ in 0..7 {
            assert_eq!(decider.decide_task_count(&state(1)).value, 2);
        }
        assert_eq!(decider.shadow_status().decisions["task_count"].dropped, 4);
        for _ in 0..4 {
            release.send(()).unwrap();
        }
        assert!(decider.flush(BOUND));
        let counts = decider.shadow_status().decisions["task_count"];
        assert_eq!(counts, ShadowCounts { disagree: 4, dropped: 4, ..Default::default() }, "the shadow said 1 to the live 2, four times");
    }

    #[test]
    fn a_shadow_whose_file_is_missing_is_skipped_and_the_live_rule_decides() {
        let engine = RuleEngine::new(RuleLimits::default(), None).unwrap();
        let slot = crate::names::DecisionSite::new("work").unwrap();
        let missing = std::env::temp_dir().join("ebb-no-such-shadow-rule.wasm");
        let set = RuleSet::new(engine, [QueueRuleConfig { slot: slot.shadow(), rule: Some(missing), params: vec![] }]);
        assert_eq!(set.load_all().len(), 1, "the shadow's file does not exist");
        let decider = shadowed(Fixed { tasks: 7, delay_ms: 0 }, set.queue(&slot.shadow()).unwrap(), 16);
        assert_eq!(decider.decide_task_count(&state(100)).value, 7);
        assert!(decider.flush(BOUND));
        let status = decider.shadow_status();
        assert_eq!(status.decisions["task_count"], ShadowCounts { skipped: 1, ..Default::default() });
        assert_eq!(status.rule.map(|r| r.state), Some(crate::rules::RuleState::Error));
        assert_eq!(status.file, None);
    }

    #[test]
    fn a_shadow_never_shares_an_instance_with_the_live_rule_of_the_same_file() {
        let engine = RuleEngine::new(RuleLimits::default(), None).unwrap();
        let slot = crate::names::DecisionSite::new("work").unwrap();
        let file = std::env::temp_dir().join("ebb-same-rule.wasm");
        let set = RuleSet::new(
            engine,
            [
                QueueRuleConfig { slot: slot.clone(), rule: Some(file.clone()), params: vec![] },
                QueueRuleConfig { slot: slot.shadow(), rule: Some(file), params: vec![] },
            ],
        );
        assert_eq!(set.status("work").unwrap().shared_by, 1);
        assert_eq!(set.status(&slot.shadow()).unwrap().shared_by, 1);
    }

    #[test]
    fn a_shadow_deciding_as_the_built_in_rule_is_skipped_not_compared() {
        let decider = shadowed(BuiltInRule, BuiltInRule, 16);
        decider.decide_task_count(&state(10));
        assert!(decider.flush(BOUND));
        // The built-in rule decides with source built-in: the shadow site had no rule to ask.
        assert_eq!(decider.shadow_status().decisions["task_count"], ShadowCounts { skipped: 1, ..Default::default() });
    }
}
