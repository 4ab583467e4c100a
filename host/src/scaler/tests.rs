//! A queue's metric in process: one rule call serves concurrent callers, the metric never
//! asks for more than `max_instances`, a rule that does not answer holds a call no longer
//! than its deadline, and work keeps a queue active for the activity hold. (KEDA's calls
//! through the binary and a running host are tested in `tests/all/scaler.rs`.)

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ebb_rules_sdk::{IdleContext, IdleDecision, QueueState};

use super::{ACTIVITY_HOLD, Counted, METRIC_CACHE, ScalerQueue, Source};
use crate::config::Config;
use crate::queue::memory::MemoryQueue;
use crate::queue::{QueueClient, SystemClock};
use crate::rules::{BuiltInRule, Decider, Decision, DecisionSource};

/// A rule in the sandbox's place: it takes `takes` per call (a blocking call, as a WASM
/// rule's is), answers ⌈depth ÷ `per_task`⌉ tasks, and counts its calls.
struct SlowRule {
    per_task: u64,
    takes: Duration,
    calls: AtomicU32,
}

impl SlowRule {
    fn new(per_task: u64, takes: Duration) -> Arc<SlowRule> {
        Arc::new(SlowRule { per_task, takes, calls: AtomicU32::new(0) })
    }
}

impl Decider for SlowRule {
    fn decide_task_count(&self, state: &QueueState) -> Decision<u32> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.takes);
        // Clamped to the bounds in the state, as every decider does.
        let tasks = u32::try_from(state.approximate_depth.div_ceil(self.per_task)).unwrap_or(u32::MAX).min(state.max_tasks);
        Decision { value: tasks, source: DecisionSource::Rule, clamped: false }
    }

    fn decide_queue_empty(&self, ctx: &IdleContext) -> Decision<IdleDecision> {
        BuiltInRule.decide_queue_empty(ctx)
    }
}

/// Queue `orders` (max_tasks 4, so one instance runs 4 tasks; a 10 ms rule call deadline)
/// decided by `rules`, over a memory queue holding `depth` messages, counted once; at most 5
/// instances.
async fn scaler_queue(rules: Arc<dyn Decider>, depth: usize) -> ScalerQueue {
    let text = "[scaler]\nlisten = \"127.0.0.1:0\"\nmax_instances = 5\n[rule_limits]\ncall_deadline = \"10ms\"\n[queues.orders]\nmax_tasks = 4\n";
    let config = Config::parse(text, Path::new("/srv"), None).unwrap();
    let memory: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new("orders", Arc::new(SystemClock), 65536));
    for _ in 0..depth {
        memory.put(b"m", Duration::ZERO).await.unwrap();
    }
    let counted = Arc::new(Counted::new(vec![memory]));
    assert_eq!(counted.count().await, depth as u64);
    let settings = config.scaler.clone().unwrap();
    ScalerQueue::new(&config.queues[0], Source::Counted(counted), rules, &settings, config.rule_limits.call_deadline)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_metric_calls_make_one_rule_call() {
    let rule = SlowRule::new(10, Duration::from_millis(2));
    let queue = Arc::new(scaler_queue(rule.clone(), 95).await);
    let calls = (0..100).map(|_| {
        let queue = queue.clone();
        tokio::spawn(async move { queue.metric().await })
    });
    let mut by_rule = 0;
    for metric in futures::future::join_all(calls).await {
        let metric = metric.unwrap();
        // (The paper's rule, which answers a caller that waited past the deadline on a
        // loaded machine, also says 10 at this depth.)
        assert_eq!((metric.tasks, metric.instances), (10, 3), "ceil(95 / 10) tasks, ceil(10 / 4) instances");
        assert!(metric.source == DecisionSource::Rule || metric.stale, "{metric:?}");
        by_rule += usize::from(metric.source == DecisionSource::Rule);
    }
    assert!(by_rule > 0);
    assert_eq!(rule.calls.load(Ordering::SeqCst), 1, "one rule call answered them all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metric_never_asks_for_more_than_max_instances() {
    let queue = scaler_queue(SlowRule::new(1, Duration::ZERO), 4_000).await;
    let metric = queue.metric().await;
    assert_eq!((metric.tasks, metric.instances), (20, 5), "4,000 tasks clamped to 4 tasks × 5 instances");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_that_does_not_answer_holds_a_metric_call_no_longer_than_its_deadline_and_the_built_in_rule_answers() {
    let rule = SlowRule::new(1, Duration::from_secs(3));
    let queue = scaler_queue(rule.clone(), 300).await;
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let metric = queue.metric().await;
        // The deadline is 10 ms; allow for a loaded machine, but far below the rule's 3 s.
        assert!(started.elapsed() < Duration::from_millis(500), "took {:?}", started.elapsed());
        assert_ne!(metric.source, DecisionSource::Rule);
        assert_eq!((metric.tasks, metric.instances), (10, 3), "the built-in rule at 300: one task per batch of 32, ⌈10 ÷ 4⌉ instances");
        tokio::time::sleep(METRIC_CACHE).await;
    }
    assert_eq!(rule.calls.load(Ordering::SeqCst), 1, "the late call held back further calls until it ended");
}

#[tokio::test(start_paused = true)]
async fn work_detected_keeps_an_empty_queue_active_for_the_activity_hold() {
    let queue = scaler_queue(Arc::new(BuiltInRule), 0).await;
    let events = queue.work_events();
    assert!(!queue.is_active());
    queue.note_work();
    assert!(events.has_changed().unwrap(), "stream watchers hear of it at once");
    assert!(queue.is_active());
    tokio::time::advance(ACTIVITY_HOLD - Duration::from_millis(1)).await;
    assert!(queue.is_active());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(!queue.is_active(), "nothing queued or in flight, no work for {ACTIVITY_HOLD:?}");
}

/// A paused queue has no demand, however deep: KEDA scales its workers in, and the rule is
/// not asked; resumed, the demand is the rule's again.
#[tokio::test]
async fn a_paused_queue_has_no_demand() {
    let rule = SlowRule::new(10, Duration::ZERO);
    let (pause, watching) = tokio::sync::watch::channel(Some(crate::listener::Pause { since_ms: 0, until_ms: None }));
    let queue = scaler_queue(rule.clone(), 35).await.with_pause(watching);
    queue.note_work();
    assert!(!queue.is_active(), "paused, with work just detected");
    let metric = queue.metric().await;
    assert_eq!((metric.instances, metric.tasks, metric.paused), (0, 0, true));
    assert_eq!(rule.calls.load(Ordering::SeqCst), 0, "the rule was asked for a paused queue");
    pause.send_replace(None);
    assert!(queue.is_active());
    let metric = queue.metric().await;
    assert_eq!((metric.tasks, metric.paused), (4, false), "35 deep at 10 per task, capped by max_tasks 4");
}
