//! The listener under tokio's paused clock: back-off, shrinking, growing, retiring, poison,
//! lease renewal and shutdown, on the in-memory backend (the embedded queue's semantics).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ebb::handler::{Handler, IncomingMessage};
use ebb::listener::{Listener, QueueSettings};
use ebb::names::DecisionSite;
use ebb::queue::memory::MemoryQueue;
use ebb::queue::{Message, QueueClient, QueueError, TokioClock};
use ebb::rules::{QueueRuleConfig, RuleEngine, RuleLimits, RuleSet};
use ebb_tests::guests;
use tokio::time::{Instant, sleep};

use crate::hooked_queue::{Hooked, Hooks};

const QUEUE: &str = "work";

/// Handles a message by sleeping for the milliseconds in its body ("sleep 500"), fails when
/// the body starts with "fail", panics when it says "panic", and pushes back as an app
/// answering 429 would on its k-th try with the k-th `Retry-After` of "pushback 7|soon".
#[derive(Default)]
struct TestHandler {
    calls: AtomicU64,
    /// While above zero, each call fails as the host's own error (out of file descriptors).
    host_errors_left: AtomicU64,
}

#[async_trait]
impl Handler for TestHandler {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let body = String::from_utf8_lossy(&message.body).into_owned();
        if self.host_errors_left.load(Ordering::Relaxed) > 0 {
            self.host_errors_left.fetch_sub(1, Ordering::Relaxed);
            return Err(ebb::handler::HostError(anyhow::anyhow!("Too many open files (os error 24)")).into());
        }
        if let Some(values) = body.strip_prefix("pushback ")
            && let Some(value) = values.split('|').nth(message.dequeue_count as usize - 1)
        {
            let retry_after = ebb::handler::RetryAfter::parse(value.as_bytes());
            return Err(ebb::handler::PushedBack { retry_after, detail: "app answered 429 Too Many Requests".into() }.into());
        }
        if body == "panic" {
            panic!("handler bug on try {}", message.dequeue_count);
        }
        if body.starts_with("fail") {
            Err(anyhow::anyhow!("boom on try {}", message.dequeue_count))
        } else {
            let ms: u64 = body.strip_prefix("sleep ").and_then(|n| n.parse().ok()).unwrap_or(0);
            sleep(Duration::from_millis(ms)).await;
            Ok(())
        }
    }
}

/// Records when each get happened and what it returned; panics in the next get when told
/// to, fails the next `failures_left` gets with a transient error, and marks a message whose
/// body is "corrupt-me" as the embedded store marks a body that fails its checksum.
#[derive(Default)]
struct GetRecorder {
    gets: Mutex<Vec<(Instant, usize)>>,
    /// When each get was sent, and how long it could wait for a message.
    sent: Mutex<Vec<(Instant, Duration)>>,
    /// The longest wait of a get, in whole seconds, as SQS's long polling (0: none).
    long_poll_secs: AtomicU64,
    /// The entries of each batch delete, and the most one takes (0: no batches).
    delete_batches: Mutex<Vec<usize>>,
    delete_batch_limit: AtomicU64,
    /// Batch deletes in flight now, and the most at once.
    delete_batches_in_flight: AtomicU64,
    most_delete_batches_in_flight: AtomicU64,
    /// The entries of each batch update, and the most one takes (0: no batches).
    update_batches: Mutex<Vec<usize>>,
    update_batch_limit: AtomicU64,
    panic_in_next_get: AtomicBool,
    failures_left: AtomicU64,
}

#[async_trait]
impl Hooks for GetRecorder {
    async fn before_get(&self, _max: u32) -> Result<(), QueueError> {
        if self.panic_in_next_get.swap(false, Ordering::Relaxed) {
            panic!("queue client bug");
        }
        if self.failures_left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok() {
            return Err(QueueError::Transient(anyhow::anyhow!("storage unavailable")));
        }
        Ok(())
    }
    async fn before_get_waiting(&self, max: u32, wait: Duration) -> Result<(), QueueError> {
        self.sent.lock().unwrap().push((Instant::now(), wait));
        self.before_get(max).await
    }
    async fn before_delete_batch(&self, entries: usize) {
        self.delete_batches.lock().unwrap().push(entries);
        let now = self.delete_batches_in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.most_delete_batches_in_flight.fetch_max(now, Ordering::Relaxed);
        // A request that takes time, so that deletes settle while it is in flight.
        sleep(Duration::from_millis(100)).await;
        self.delete_batches_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
    fn delete_batch_limit(&self) -> usize {
        (self.delete_batch_limit.load(Ordering::Relaxed) as usize).max(1)
    }
    async fn before_update_batch(&self, entries: usize) {
        self.update_batches.lock().unwrap().push(entries);
        // A request that takes time, so that renewals fall due while it is in flight.
        sleep(Duration::from_millis(100)).await;
    }
    fn update_batch_limit(&self) -> usize {
        (self.update_batch_limit.load(Ordering::Relaxed) as usize).max(1)
    }
    fn server_wait(&self, idle: Duration) -> Duration {
        Duration::from_secs(idle.as_secs().min(self.long_poll_secs.load(Ordering::Relaxed)))
    }
    async fn after_get(&self, got: &mut Result<Vec<Message>, QueueError>) {
        let Ok(got) = got else { return };
        for message in got.iter_mut() {
            if message.body == b"corrupt-me"[..] {
                message.defect = Some("corrupt: the body fails its checksum".into());
            }
        }
        self.gets.lock().unwrap().push((Instant::now(), got.len()));
    }
}

struct Fixture {
    queue: Arc<Hooked<GetRecorder>>,
    poison: Arc<MemoryQueue>,
    handler: Arc<TestHandler>,
    rules: Arc<RuleSet>,
    listener: Listener,
}

fn fixture(settings: QueueSettings, rule: Option<PathBuf>) -> Fixture {
    let clock = Arc::new(TokioClock::new());
    let queue = Hooked::new(MemoryQueue::new(QUEUE, clock.clone(), 65536), GetRecorder::default());
    let poison = Arc::new(MemoryQueue::new("work-poison", clock, 65536));
    let handler = Arc::new(TestHandler::default());
    let engine = RuleEngine::new(RuleLimits::default(), None).unwrap();
    let rules = Arc::new(RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::new(QUEUE).unwrap(), rule, params: vec![] }]));
    assert!(rules.load_all().is_empty());
    let settings = QueueSettings { random_seed: Some(7), ..settings };
    let listener = Listener::builder(queue.clone(), poison.clone(), handler.clone()).decider(Arc::new(rules.queue(QUEUE).unwrap())).settings(settings).build();
    Fixture { queue, poison, handler, rules, listener }
}

async fn put(queue: &dyn QueueClient, body: &str, count: usize) {
    for _ in 0..count {
        queue.put(body.as_bytes(), Duration::ZERO).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn idle_back_off_follows_the_paper_curve_then_holds_at_the_maximum() {
    let settings = QueueSettings { min_polling_interval: Duration::from_millis(100), max_polling_interval: Duration::from_secs(30), ..Default::default() };
    let f = fixture(settings, None);
    f.listener.start();
    sleep(Duration::from_secs(600)).await;
    let gets = f.queue.gets.lock().unwrap().clone();
    let gaps: Vec<f64> = gets.windows(2).map(|w| (w[1].0 - w[0].0).as_secs_f64() * 1e3).collect();
    for (n, gap) in gaps.iter().enumerate().take(8) {
        // The built-in rule: 100 ms × 1.75^n × random(0.8 .. 1.2), at least the 100 ms floor.
        let grown = 100.0 * 1.75f64.powi(n as i32);
        let (low, high) = ((grown * 0.8).clamp(100.0, 30_000.0), (grown * 1.2).clamp(100.0, 30_000.0));
        assert!((low - 1.0..=high + 1.0).contains(gap), "gap {} was {gap} ms, expected {low}..{high}", n + 1);
    }
    assert!(gaps[14..].iter().all(|gap| (gap - 30_000.0).abs() < 2.0), "holds at the maximum: {gaps:?}");
    // ~12 fast polls, then one get per 30 s: the idle cost the paper sets out to cut.
    assert!(gets.len() < 40, "{} gets in 10 idle minutes", gets.len());
    assert_eq!(f.listener.status().active_tasks, 1);
}

#[tokio::test(start_paused = true)]
async fn an_idle_delay_is_spent_waiting_in_the_next_get_as_far_as_the_queue_waits() -> anyhow::Result<()> {
    let settings = QueueSettings { min_polling_interval: Duration::from_millis(100), max_polling_interval: Duration::from_secs(30), ..Default::default() };
    let f = fixture(settings, None);
    f.queue.long_poll_secs.store(20, Ordering::Relaxed);
    f.listener.start();
    sleep(Duration::from_secs(600)).await;
    let sent = f.queue.sent.lock().unwrap().clone();
    let answered: Vec<Instant> = f.queue.gets.lock().unwrap().iter().map(|(at, _)| *at).collect();
    // The delays under a second are slept (the queue waits whole seconds); from there on
    // the whole seconds are waited in the get, at most 20, the rest asleep before it.
    assert_eq!(sent[..4].iter().map(|(_, wait)| *wait).collect::<Vec<_>>(), [Duration::ZERO; 4], "{sent:?}");
    assert!(sent.iter().all(|(_, wait)| wait.subsec_nanos() == 0 && *wait <= Duration::from_secs(20)), "{sent:?}");
    for n in answered.len() - 5..answered.len() {
        let (at, wait) = sent[n];
        let asleep = at - answered[n - 1];
        assert_eq!(wait, Duration::from_secs(20), "get {n}: {sent:?}");
        assert!((asleep.as_secs_f64() - 10.0).abs() < 0.01, "get {n} sent {asleep:?} after the last answered, not 30 s - 20 s");
        assert!(((answered[n] - answered[n - 1]).as_secs_f64() - 30.0).abs() < 0.01, "one get per idle delay");
    }
    // As many gets as without the wait: one per idle delay.
    assert!(sent.len() < 40, "{} gets in 10 idle minutes", sent.len());
    assert_eq!(f.listener.status().long_poll_secs, 20, "/status shows the wait");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_message_put_during_a_waiting_get_is_handled_at_once() -> anyhow::Result<()> {
    let settings = QueueSettings { min_polling_interval: Duration::from_millis(100), max_polling_interval: Duration::from_secs(20), ..Default::default() };
    let f = fixture(settings, None);
    f.queue.long_poll_secs.store(20, Ordering::Relaxed);
    f.listener.start();
    // Idle long enough for the back-off to hold at 20 s: all of it waited in the get.
    sleep(Duration::from_secs(300) + Duration::from_millis(7_300)).await;
    let gets_before = f.queue.sent.lock().unwrap().len();
    f.queue.put(b"sleep 0", Duration::ZERO).await?;
    sleep(Duration::from_millis(5)).await;
    assert_eq!(f.handler.calls.load(Ordering::Relaxed), 1, "handled as it came, not at the next get");
    assert_eq!(f.queue.sent.lock().unwrap().len(), gets_before, "by the get that was waiting");
    Ok(())
}

/// A pause that comes while a get waits on the queue (long polling): what that get brings
/// back is released at once, not handled while paused, and handled as soon as the queue
/// resumes (not when its lease would have run out).
#[tokio::test(start_paused = true)]
async fn what_a_waiting_get_brings_after_a_pause_is_released_and_handled_after_the_resume() -> anyhow::Result<()> {
    let settings = QueueSettings {
        min_polling_interval: Duration::from_millis(100),
        max_polling_interval: Duration::from_secs(20),
        lease_duration: Duration::from_secs(600),
        ..Default::default()
    };
    let f = fixture(settings, None);
    f.queue.long_poll_secs.store(20, Ordering::Relaxed);
    f.listener.start();
    // Idle long enough for the back-off to hold at 20 s, all of it waited in the get.
    sleep(Duration::from_secs(300) + Duration::from_millis(7_300)).await;
    f.listener.set_pause(Some(ebb::listener::Pause { since_ms: 0, until_ms: None }));
    f.queue.put(b"sleep 0", Duration::ZERO).await?;
    sleep(Duration::from_secs(60)).await;
    assert_eq!(f.handler.calls.load(Ordering::Relaxed), 0, "handled while paused");
    assert_eq!(f.queue.inner.approximate_count().await?, 1, "nothing lost");
    f.listener.set_pause(None);
    sleep(Duration::from_secs(2)).await;
    assert_eq!(f.listener.status().processed, 1, "released at once, so handled at the resume, not after its 600 s lease");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn deletes_settling_together_go_in_requests_of_at_most_the_backends_batch_limit() -> anyhow::Result<()> {
    let f = fixture(QueueSettings { batch_size: 32, max_concurrent_calls: 64, ..Default::default() }, None);
    f.queue.delete_batch_limit.store(10, Ordering::Relaxed);
    put(f.queue.as_ref(), "sleep 0", 25).await;
    f.listener.start();
    sleep(Duration::from_secs(6)).await;
    assert_eq!(f.listener.status().processed, 25);
    // The first leader takes the 10 that settled with it; the next full 10 go at once on
    // a call of their own, and the 5 left wait for more (up to 5 s) under one leader.
    assert_eq!(*f.queue.delete_batches.lock().unwrap(), [10, 10, 5]);
    assert_eq!(f.queue.inner.approximate_count().await?, 0);
    Ok(())
}

/// At load the deletes keep pace with the gets: a full batch does not wait for the call in
/// flight (SQS: with one DeleteMessageBatch at a time, T tasks' receives of 10 outran it).
#[tokio::test(start_paused = true)]
async fn full_delete_batches_go_side_by_side_without_waiting_for_the_call_in_flight() -> anyhow::Result<()> {
    let f = fixture(QueueSettings { batch_size: 32, max_concurrent_calls: 64, ..Default::default() }, None);
    f.queue.delete_batch_limit.store(10, Ordering::Relaxed);
    put(f.queue.as_ref(), "sleep 0", 30).await;
    f.listener.start();
    sleep(Duration::from_millis(150)).await;
    assert_eq!(f.listener.status().processed, 30, "three calls of 100 ms side by side, not one after another");
    assert_eq!(*f.queue.delete_batches.lock().unwrap(), [10, 10, 10]);
    assert_eq!(f.queue.most_delete_batches_in_flight.load(Ordering::Relaxed), 3);
    Ok(())
}

/// Issue 37's push goal: on a batching backend, sparse handled messages' deletes share a
/// batch. A delete that would go alone waits (briefly, well inside the lease) for the next.
#[tokio::test(start_paused = true)]
async fn a_delete_that_would_go_alone_waits_for_the_next_handled_messages_to_share_its_batch() -> anyhow::Result<()> {
    let f = fixture(QueueSettings { max_polling_interval: Duration::from_secs(1), ..Default::default() }, None);
    f.queue.delete_batch_limit.store(10, Ordering::Relaxed);
    f.listener.start();
    for _ in 0..4 {
        put(f.queue.as_ref(), "sleep 0", 1).await;
        sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(f.handler.calls.load(Ordering::Relaxed), 4, "each handled within a second");
    assert!(f.queue.delete_batches.lock().unwrap().is_empty(), "no delete alone: {:?}", f.queue.delete_batches.lock().unwrap());
    sleep(Duration::from_secs(5)).await;
    assert_eq!(*f.queue.delete_batches.lock().unwrap(), [4], "one request for the four, sent when the first's wait ran out");
    assert_eq!((f.listener.status().processed, f.queue.inner.approximate_count().await?), (4, 0));
    Ok(())
}

/// A delete waiting for others goes at once when its batch fills, and at shutdown.
#[tokio::test(start_paused = true)]
async fn a_waiting_delete_goes_at_once_when_its_batch_fills_or_the_listener_stops() -> anyhow::Result<()> {
    let f = fixture(QueueSettings { max_polling_interval: Duration::from_secs(1), ..Default::default() }, None);
    f.queue.delete_batch_limit.store(10, Ordering::Relaxed);
    f.listener.start();
    put(f.queue.as_ref(), "sleep 0", 1).await;
    sleep(Duration::from_secs(1)).await;
    put(f.queue.as_ref(), "sleep 0", 12).await;
    sleep(Duration::from_millis(1200)).await;
    assert_eq!(*f.queue.delete_batches.lock().unwrap(), [10], "the batch went when it filled");
    let started = Instant::now();
    f.listener.shutdown(Duration::from_secs(10)).await;
    assert!(started.elapsed() < Duration::from_secs(1), "shutdown waited {:?} for the waiting deletes", started.elapsed());
    assert_eq!(*f.queue.delete_batches.lock().unwrap(), [10, 3]);
    assert_eq!((f.listener.status().processed, f.queue.inner.approximate_count().await?), (13, 0));
    Ok(())
}

/// Issue 37 item 2: the leases of one get fall due for renewal together, and go as batch
/// updates (SQS: `ChangeMessageVisibilityBatch`) of at most the backend's limit.
#[tokio::test(start_paused = true)]
async fn renewals_falling_due_together_go_in_requests_of_at_most_the_backends_batch_limit() -> anyhow::Result<()> {
    let settings = QueueSettings { batch_size: 32, max_concurrent_calls: 64, lease_duration: Duration::from_secs(10), ..Default::default() };
    let f = fixture(settings, None);
    f.queue.update_batch_limit.store(10, Ordering::Relaxed);
    put(f.queue.as_ref(), "sleep 7000", 25).await;
    f.listener.start();
    sleep(Duration::from_secs(6)).await;
    // Leased together for 10 s, due together at 5 s: the first leader takes the 10 that fell
    // due with it; the rest go 10 and 5 as answers come.
    assert_eq!(*f.queue.update_batches.lock().unwrap(), [10, 10, 5]);
    sleep(Duration::from_secs(5)).await;
    let status = f.listener.status();
    assert_eq!((status.processed, status.lease_renewals, status.leases_lost), (25, 25, 0));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn idle_tasks_shrink_to_one_in_pull_mode_and_to_zero_with_push() {
    for (push_enabled, expected) in [(false, 1), (true, 0)] {
        // With push, nothing needs to poll: min_tasks 0 lets the last task stop too.
        let min_tasks = if push_enabled { 0 } else { 1 };
        let settings = QueueSettings { push_enabled, min_tasks, max_polling_interval: Duration::from_secs(10), ..Default::default() };
        let f = fixture(settings, None);
        f.listener.start();
        f.listener.start_tasks(10);
        assert_eq!(f.listener.status().active_tasks, 10 + min_tasks);
        sleep(Duration::from_secs(300)).await;
        assert_eq!(f.listener.status().active_tasks, expected, "push {push_enabled}");
        if push_enabled {
            // A push notification brings the listener back from zero.
            put(f.queue.as_ref(), "sleep 10", 50).await;
            f.listener.work_detected();
            sleep(Duration::from_secs(2)).await;
            assert_eq!(f.listener.status().processed, 50, "tasks started again from zero");
        }
    }
}

/// With push, a get that came back short found the queue drained, and anything put later is
/// notified: until a notification, the other tasks' next gets could only come back empty,
/// and are not sent (issue 37: the trailing empty receives at the end of each burst).
#[tokio::test(start_paused = true)]
async fn with_push_no_get_follows_a_short_one_until_a_notification() -> anyhow::Result<()> {
    // The first gets take a batch of 10 done after 100 ms, one done after 300 ms, and the last
    // 5: that one found the queue drained, so the two others need not look again when done.
    let settings = QueueSettings { push_enabled: true, min_tasks: 0, batch_size: 10, max_tasks: 64, ..Default::default() };
    let f = fixture(settings, Some(guests::FIXED_TASKS.into()));
    put(f.queue.as_ref(), "sleep 100", 10).await;
    put(f.queue.as_ref(), "sleep 300", 10).await;
    put(f.queue.as_ref(), "sleep 0", 5).await;
    f.listener.start();
    sleep(Duration::from_secs(30)).await;
    let sizes = |f: &Fixture| f.queue.gets.lock().unwrap().iter().map(|(_, n)| *n).collect::<Vec<_>>();
    assert_eq!(f.listener.status().processed, 25);
    let start = f.queue.gets.lock().unwrap()[0].0;
    let timed: Vec<_> = f.queue.gets.lock().unwrap().iter().map(|(at, n)| ((*at - start).as_millis(), *n)).collect();
    assert!(!sizes(&f).contains(&0), "no empty get after the short one: {timed:?}");
    put(f.queue.as_ref(), "sleep 0", 1).await;
    f.listener.work_detected();
    sleep(Duration::from_secs(2)).await;
    assert_eq!((sizes(&f).last(), f.listener.status().processed), (Some(&1), 26), "a notification brings the next get");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_burst_grows_the_tasks_to_the_rules_count() {
    // Handler calls bounded only by the tasks' batches (64 × 32): this is about tasks.
    let settings = QueueSettings { max_tasks: 64, max_concurrent_calls: 10_000, min_polling_interval: Duration::from_millis(100), ..Default::default() };
    let f = fixture(settings, None);
    f.listener.start();
    sleep(Duration::from_secs(5)).await;
    put(f.queue.as_ref(), "sleep 200", 10_000).await;
    sleep(Duration::from_secs(3)).await;
    let status = f.listener.status();
    // A full get counts the depth: ⌈10,000 ÷ 32⌉ = 313 tasks, clamped to max_tasks; they
    // drain it (64 × 32 messages per 200 ms), and the drained queue is back to one task.
    assert_eq!((status.peak_tasks, status.processed), (64, 10_000), "{status:?}");
    assert_eq!((status.target_tasks, status.active_tasks), (1, 1), "{status:?}");
}

#[tokio::test(start_paused = true)]
async fn a_wasm_rules_count_is_followed() {
    let f = fixture(QueueSettings { max_tasks: 64, ..Default::default() }, Some(guests::FIXED_TASKS.into()));
    f.listener.start();
    put(f.queue.as_ref(), "sleep 200", 5_000).await;
    f.listener.work_detected();
    sleep(Duration::from_secs(3)).await;
    let status = f.listener.status();
    assert_eq!((status.target_tasks, status.active_tasks, status.peak_tasks), (7, 7, 7), "{status:?}");
}

#[tokio::test(start_paused = true)]
async fn extra_tasks_retire_after_their_batch_when_the_rule_says_fewer() {
    let dir = tempfile::tempdir().unwrap();
    let rule_file = dir.path().join("rule.wasm");
    std::fs::copy(guests::PAPER_DEFAULT, &rule_file).unwrap();
    let f = fixture(QueueSettings { max_tasks: 20, ..Default::default() }, Some(rule_file.clone()));
    f.listener.start();
    put(f.queue.as_ref(), "sleep 500", 20_000).await;
    f.listener.work_detected();
    sleep(Duration::from_secs(3)).await;
    assert_eq!(f.listener.status().active_tasks, 20);
    // Deploy a rule that wants 7; the next decisions retire the extra tasks mid-load.
    std::fs::copy(guests::FIXED_TASKS, &rule_file).unwrap();
    f.rules.apply_file(&rule_file).unwrap();
    sleep(Duration::from_secs(5)).await;
    let status = f.listener.status();
    assert!(f.queue.inner.approximate_count().await.unwrap() > 5_000, "still under load");
    assert_eq!((status.target_tasks, status.active_tasks), (7, 7), "{status:?}");
}

/// Attack (session 13): a partition's poisoned message named its partition's own id, not the
/// id its producer got back (`1:19`), so it could not be matched to the send.
#[tokio::test(start_paused = true)]
async fn a_partitions_poisoned_message_names_the_id_its_producer_got() {
    let clock = Arc::new(TokioClock::new());
    let queue = Arc::new(MemoryQueue::new("work-1", clock.clone(), 65536));
    let poison = Arc::new(MemoryQueue::new("work-poison", clock, 65536));
    let handler = Arc::new(TestHandler::default());
    let settings = QueueSettings { max_dequeue_count: 1, random_seed: Some(7), ..Default::default() };
    let listener = Listener::builder(queue.clone(), poison.clone(), handler).settings(settings).partition(1).build();
    listener.start();
    let id = queue.put(b"fail", Duration::ZERO).await.unwrap();
    sleep(Duration::from_secs(60)).await;
    let poisoned = poison.get(32, Duration::from_secs(30)).await.unwrap();
    assert_eq!(poisoned.len(), 1);
    let envelope: serde_json::Value = serde_json::from_slice(&poisoned[0].body).unwrap();
    assert_eq!(envelope["original_id"], format!("1:{id}"), "{envelope}");
    listener.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn failing_messages_reach_the_poison_queue_after_max_dequeue_count_with_the_reason() {
    let settings = QueueSettings { max_dequeue_count: 3, visibility_timeout: Duration::from_secs(2), ..Default::default() };
    let f = fixture(settings, None);
    f.listener.start();
    let id = f.queue.put(b"fail", Duration::ZERO).await.unwrap();
    sleep(Duration::from_secs(120)).await;
    assert_eq!(f.handler.calls.load(Ordering::Relaxed), 3);
    assert_eq!(f.queue.inner.approximate_count().await.unwrap(), 0, "moved out of the queue");
    let poisoned = f.poison.get(32, Duration::from_secs(30)).await.unwrap();
    assert_eq!(poisoned.len(), 1);
    let envelope: serde_json::Value = serde_json::from_slice(&poisoned[0].body).unwrap();
    assert_eq!(envelope["original_id"], id.as_str());
    assert_eq!(envelope["dequeue_count"], 3);
    assert_eq!(envelope["body"], "fail");
    assert!(envelope["error"].as_str().unwrap().contains("boom on try 3"), "{envelope}");
    let status = f.listener.status();
    assert_eq!((status.failed, status.poisoned, status.processed), (3, 1, 0));
}

#[tokio::test(start_paused = true)]
async fn retries_wait_longer_with_each_failure() {
    let settings = QueueSettings {
        max_dequeue_count: 10,
        visibility_timeout: Duration::from_secs(4),
        min_polling_interval: Duration::from_millis(10),
        max_polling_interval: Duration::from_millis(100),
        ..Default::default()
    };
    let f = fixture(settings, None);
    f.listener.start();
    f.queue.put(b"fail", Duration::ZERO).await.unwrap();
    sleep(Duration::from_secs(100)).await;
    let tries: Vec<Instant> = f.queue.gets.lock().unwrap().iter().filter(|(_, n)| *n > 0).map(|(at, _)| *at).collect();
    let waits: Vec<u64> = tries.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
    assert_eq!(&waits[..4], &[4, 8, 16, 32], "retry delays double from visibility_timeout: {waits:?}");
}

#[tokio::test(start_paused = true)]
async fn a_slow_handler_keeps_its_message_by_renewing_the_lease() {
    let settings = QueueSettings { lease_duration: Duration::from_secs(10), max_tasks: 4, ..Default::default() };
    let f = fixture(settings, None);
    f.listener.start();
    f.listener.start_tasks(3);
    f.queue.put(b"sleep 45000", Duration::ZERO).await.unwrap();
    sleep(Duration::from_secs(60)).await;
    assert_eq!(f.handler.calls.load(Ordering::Relaxed), 1, "handled once, never by a second task");
    let status = f.listener.status();
    assert_eq!(status.processed, 1);
    assert!(status.lease_renewals >= 8, "renewed every 5 s: {}", status.lease_renewals);
    assert_eq!(f.queue.inner.approximate_count().await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn shutdown_drains_in_flight_messages_and_releases_the_rest() {
    let f = fixture(QueueSettings::default(), None);
    f.listener.start();
    f.queue.put(b"sleep 2000", Duration::ZERO).await.unwrap();
    let slow = f.queue.put(b"sleep 600000", Duration::ZERO).await.unwrap();
    sleep(Duration::from_millis(500)).await;
    assert_eq!(f.listener.status().in_flight, 2);
    let started = Instant::now();
    f.listener.shutdown(Duration::from_secs(10)).await;
    assert_eq!(started.elapsed().as_secs(), 10, "waited the drain timeout for the slow one");
    let status = f.listener.status();
    assert_eq!((status.processed, status.released_on_shutdown, status.active_tasks), (1, 1, 0));
    // Released, not abandoned: visible again at once, not after the lease.
    let again = f.queue.inner.get(32, Duration::from_secs(30)).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].id.as_str(), again[0].dequeue_count), (slow.as_str(), 2));
}

#[tokio::test(start_paused = true)]
async fn a_panicking_handler_is_a_failure_retried_then_poisoned() {
    let settings = QueueSettings { max_dequeue_count: 3, visibility_timeout: Duration::from_secs(2), ..Default::default() };
    let f = fixture(settings, None);
    f.listener.start();
    f.queue.put(b"panic", Duration::ZERO).await.unwrap();
    put(f.queue.as_ref(), "sleep 10", 5).await;
    sleep(Duration::from_secs(120)).await;
    // Each try reached the handler: the claim was released after each panic.
    assert_eq!(f.handler.calls.load(Ordering::Relaxed), 3 + 5);
    let status = f.listener.status();
    assert_eq!((status.handler_panics, status.failed, status.poisoned, status.processed), (3, 3, 1, 5), "{status:?}");
    assert_eq!(status.in_flight, 0, "no claim or task slot leaked");
    assert_eq!(status.task_panics, 0, "the task itself survived");
    assert!(status.recent_poison[0].reason.contains("handler panicked: handler bug on try 3"), "{:?}", status.recent_poison);
    assert_eq!(f.poison.approximate_count().await.unwrap(), 1);
    // The task that ran the panicking handler still dequeues.
    put(f.queue.as_ref(), "sleep 10", 3).await;
    sleep(Duration::from_secs(60)).await;
    assert_eq!(f.listener.status().processed, 8);
}

#[tokio::test(start_paused = true)]
async fn a_failing_message_too_large_for_the_envelope_is_poisoned_as_its_bare_body() {
    let settings = QueueSettings { max_dequeue_count: 2, visibility_timeout: Duration::from_secs(2), ..Default::default() };
    let f = fixture(settings, None);
    f.listener.start();
    let mut body = b"fail".to_vec();
    body.resize(65536, b'x');
    let id = f.queue.put(&body, Duration::ZERO).await.unwrap();
    sleep(Duration::from_secs(120)).await;
    assert_eq!(f.handler.calls.load(Ordering::Relaxed), 2, "not retried past max_dequeue_count");
    assert_eq!(f.queue.inner.approximate_count().await.unwrap(), 0, "moved out of the queue");
    let poisoned = f.poison.get(32, Duration::from_secs(30)).await.unwrap();
    assert_eq!(poisoned.len(), 1);
    assert!(poisoned[0].body == body, "the poison queue holds the body as it was");
    let status = f.listener.status();
    assert_eq!((status.poisoned, status.poisoned_body_only), (1, 1));
    let record = &status.recent_poison[0];
    assert_eq!((record.id.as_str(), record.form), (id.as_str(), ebb::listener::PoisonForm::Body));
    assert!(record.reason.contains("boom on try 2"), "the reason is kept where an operator finds it: {record:?}");
}

#[tokio::test(start_paused = true)]
async fn a_panicking_queue_client_restarts_the_task_and_is_counted() {
    let f = fixture(QueueSettings::default(), None);
    f.listener.start();
    sleep(Duration::from_secs(1)).await;
    f.queue.panic_in_next_get.store(true, Ordering::Relaxed);
    sleep(Duration::from_secs(120)).await;
    let status = f.listener.status();
    assert_eq!(status.task_panics, 1, "{status:?}");
    assert_eq!(status.active_tasks, 1, "the floor task was started again");
    put(f.queue.as_ref(), "sleep 10", 10).await;
    f.listener.work_detected();
    sleep(Duration::from_secs(60)).await;
    assert_eq!(f.listener.status().processed, 10, "the queue is still served");
}

#[tokio::test(start_paused = true)]
async fn a_message_whose_body_fails_its_checksum_goes_to_poison_never_to_the_handler() {
    let f = fixture(QueueSettings::default(), None);
    f.listener.start();
    f.queue.put(b"corrupt-me", Duration::ZERO).await.unwrap();
    sleep(Duration::from_secs(30)).await;
    assert_eq!(f.handler.calls.load(Ordering::Relaxed), 0);
    let status = f.listener.status();
    assert_eq!((status.poisoned, status.poisoned_corrupt, status.failed), (1, 1, 0), "{status:?}");
    assert!(status.recent_poison[0].reason.starts_with("corrupt"), "{:?}", status.recent_poison);
    assert_eq!(f.queue.inner.approximate_count().await.unwrap(), 0);
    assert_eq!(f.poison.approximate_count().await.unwrap(), 1);
}

/// Review defect: with the host out of file descriptors, every message's tries failed and a
/// healthy app's messages were all poisoned.
#[tokio::test(start_paused = true)]
async fn the_hosts_own_errors_never_poison_a_message() {
    let settings = QueueSettings { max_dequeue_count: 2, visibility_timeout: Duration::from_secs(1), ..Default::default() };
    let f = fixture(settings, None);
    f.handler.host_errors_left.store(6, Ordering::Relaxed);
    f.listener.start();
    f.queue.put(b"sleep 10", Duration::ZERO).await.unwrap();
    sleep(Duration::from_secs(120)).await;
    let status = f.listener.status();
    assert_eq!((status.host_errors, status.poisoned, status.failed, status.processed), (6, 0, 0, 1), "{status:?}");
    assert_eq!(f.poison.approximate_count().await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_pushed_back_message_waits_its_retry_after_and_is_never_poisoned_for_it() {
    // One real failure would poison it: a push back is not a failure.
    let settings = QueueSettings {
        max_dequeue_count: 1,
        visibility_timeout: Duration::from_secs(2),
        max_retry_delay: Duration::from_secs(60),
        min_polling_interval: Duration::from_millis(10),
        max_polling_interval: Duration::from_millis(100),
        ..Default::default()
    };
    let f = fixture(settings, None);
    f.listener.start();
    let past = httpdate::fmt_http_date(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000));
    f.queue.put(format!("pushback 7|soon|99999999999999999999999|{past}|-3").as_bytes(), Duration::ZERO).await.unwrap();
    sleep(Duration::from_secs(200)).await;
    let tries: Vec<Instant> = f.queue.gets.lock().unwrap().iter().filter(|(_, n)| *n > 0).map(|(at, _)| *at).collect();
    let waits: Vec<u64> = tries.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
    // As asked; malformed: the first retry delay; enormous: capped at max_retry_delay; a date
    // past and a negative number: the first retry delay.
    assert_eq!(waits, [7, 2, 60, 2, 2], "{waits:?}");
    let status = f.listener.status();
    assert_eq!((status.pushed_back, status.retry_after_capped, status.retry_after_unusable), (5, 1, 3), "{status:?}");
    assert_eq!((status.failed, status.poisoned, status.processed), (0, 0, 1), "{status:?}");
    assert_eq!(f.poison.approximate_count().await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_message_pushed_back_a_thousand_times_is_poisoned_with_the_reason() {
    let f = fixture(QueueSettings { max_dequeue_count: 5, ..Default::default() }, None);
    f.listener.start();
    let body = format!("pushback {}", vec!["0"; 1_000].join("|"));
    f.queue.put(body.as_bytes(), Duration::ZERO).await.unwrap();
    f.listener.work_detected();
    sleep(Duration::from_secs(3_600)).await;
    let status = f.listener.status();
    assert_eq!((status.pushed_back, status.failed, status.poisoned), (1_000, 0, 1), "{status:?}");
    let poisoned = f.poison.get(1, Duration::from_secs(30)).await.unwrap();
    let envelope: serde_json::Value = serde_json::from_slice(&poisoned[0].body).unwrap();
    assert!(envelope["error"].as_str().unwrap().contains("pushed back") && envelope["dequeue_count"] == 1_000, "{envelope}");
}

/// Review defect: 3,000 messages poisoned in a burst wrote ~1,000 WARN lines a second.
#[tokio::test(start_paused = true)]
async fn a_burst_of_poisoned_messages_does_not_flood_the_log() {
    let log = ebb_tests::LogCapture::default();
    let _guard = log.start(tracing::Level::WARN);
    let settings = QueueSettings { max_dequeue_count: 1, ..Default::default() };
    let f = fixture(settings, None);
    f.listener.start();
    put(f.queue.as_ref(), "fail", 300).await;
    f.listener.work_detected();
    sleep(Duration::from_secs(30)).await;
    assert_eq!(f.listener.status().poisoned, 300, "every one moved");
    let lines = log.text().lines().filter(|l| l.contains("moved to the poison queue")).count();
    assert!((1..=10).contains(&lines), "{lines} poison lines");
}

/// Azure's poison queue gets the original body (what Azure Functions writes, so tools that
/// requeue poisoned messages work); the reason stays in the status.
#[tokio::test(start_paused = true)]
async fn without_the_envelope_the_poison_queue_gets_the_original_body() {
    let settings = QueueSettings { max_dequeue_count: 1, poison_envelope: false, ..Default::default() };
    let f = fixture(settings, None);
    f.listener.start();
    f.queue.put(b"fail: the original", Duration::ZERO).await.unwrap();
    sleep(Duration::from_secs(30)).await;
    let poisoned = f.poison.get(32, Duration::from_secs(30)).await.unwrap();
    assert_eq!(poisoned.len(), 1);
    assert_eq!(poisoned[0].body, &b"fail: the original"[..]);
    let status = f.listener.status();
    assert!(status.recent_poison[0].reason.contains("boom on try 1"), "{:?}", status.recent_poison);
}

/// Item 15: handler failures were logged at DEBUG only, so at the default level a failing
/// app was invisible until a message was poisoned. Now at WARN, rate-limited.
#[tokio::test(start_paused = true)]
async fn handler_failures_are_warnings_and_do_not_flood_the_log() {
    let log = ebb_tests::LogCapture::default();
    let _guard = log.start(tracing::Level::WARN);
    let settings = QueueSettings { max_dequeue_count: 100, visibility_timeout: Duration::from_millis(10), ..Default::default() };
    let f = fixture(settings, None);
    f.listener.start();
    put(f.queue.as_ref(), "fail", 50).await;
    f.listener.work_detected();
    sleep(Duration::from_secs(20)).await;
    assert!(f.listener.status().failed >= 200, "{:?}", f.listener.status().failed);
    let text = log.text();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("handler failed, retrying later")).collect();
    assert!(!lines.is_empty() && lines.len() <= 10, "{} lines", lines.len());
    assert!(lines[0].contains("WARN") && lines[0].contains("boom on try"), "{}", lines[0]);
}

/// Item 4: on a backend whose count is a billed call, the status depth was refreshed only at
/// scaling decisions. Now watching the status counts again when the figure is older than
/// DEPTH_MAX_AGE, at most once per that time, and says how old it is.
#[tokio::test(start_paused = true)]
async fn a_remote_queues_status_depth_is_refreshed_when_stale() {
    let f = fixture(QueueSettings::default(), None);
    assert_eq!(f.queue.local_count(), None, "the fixture queue counts like a remote one");
    put(f.queue.as_ref(), "sleep 10", 5).await;
    let first = f.listener.status();
    assert_eq!((first.approximate_depth, first.depth_as_of), (0, None), "nothing counted yet");
    sleep(Duration::from_millis(10)).await;
    let counted = f.listener.status();
    assert_eq!(counted.approximate_depth, 5);
    assert!(counted.depth_as_of.is_some());
    put(f.queue.as_ref(), "sleep 10", 5).await;
    sleep(Duration::from_millis(10)).await;
    assert_eq!(f.listener.status().approximate_depth, 5, "fresh enough: no second count yet");
    sleep(ebb::listener::DEPTH_MAX_AGE).await;
    f.listener.status();
    sleep(Duration::from_millis(10)).await;
    assert_eq!(f.listener.status().approximate_depth, 10, "counted again once stale");
}

/// Slow storage: every get's answer arrives `get_delay` after the service leased the
/// messages, every update reaches the service `update_delay` after it was sent.
struct SlowStorage {
    get_delay: Duration,
    update_delay: Duration,
}

#[async_trait]
impl Hooks for SlowStorage {
    async fn after_get(&self, _got: &mut Result<Vec<Message>, QueueError>) {
        sleep(self.get_delay).await;
    }
    async fn before_update(&self) {
        sleep(self.update_delay).await;
    }
}

/// Counts the times a body was handled while another handler (on any host) held it.
#[derive(Default)]
struct OverlapHandler {
    active: Mutex<std::collections::BTreeSet<Vec<u8>>>,
    overlaps: AtomicU64,
    done: AtomicU64,
}

#[async_trait]
impl Handler for OverlapHandler {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        if !self.active.lock().unwrap().insert(message.body.to_vec()) {
            self.overlaps.fetch_add(1, Ordering::Relaxed);
        }
        sleep(Duration::from_secs(12)).await;
        self.active.lock().unwrap().remove(&message.body[..]);
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The lease is the service's, and it starts when the service answers the get, not when the
/// answer arrives: with gets that take 6 s of a 10 s lease and renewals that take 3 s to
/// arrive, a host renewing "half a lease after the handler started" renews too late and a
/// second host leases and handles the same message while the first still works on it.
#[tokio::test(start_paused = true)]
async fn slow_storage_calls_never_let_the_lease_lapse_under_a_running_handler() {
    let clock = Arc::new(TokioClock::new());
    let shared = Arc::new(MemoryQueue::new(QUEUE, clock.clone(), 65536));
    let poison = Arc::new(MemoryQueue::new("work-poison", clock, 65536));
    let handler = Arc::new(OverlapHandler::default());
    let settings = QueueSettings {
        lease_duration: Duration::from_secs(10),
        min_polling_interval: Duration::from_millis(100),
        max_polling_interval: Duration::from_millis(500),
        random_seed: Some(3),
        ..Default::default()
    };
    let hosts: Vec<Listener> = (0..2)
        .map(|_| {
            let slow = Hooked::new(shared.clone(), SlowStorage { get_delay: Duration::from_secs(6), update_delay: Duration::from_secs(3) });
            Listener::builder(slow, poison.clone(), handler.clone()).settings(settings.clone()).build()
        })
        .collect();
    for i in 0..3 {
        shared.put(format!("m-{i}").as_bytes(), Duration::ZERO).await.unwrap();
    }
    hosts.iter().for_each(Listener::start);
    sleep(Duration::from_secs(120)).await;
    assert_eq!(handler.overlaps.load(Ordering::Relaxed), 0, "a message was handled by two hosts at once");
    assert_eq!(handler.done.load(Ordering::Relaxed), 3, "each message handled once");
    assert_eq!(shared.approximate_count().await.unwrap(), 0, "all deleted");
    let renewals: u64 = hosts.iter().map(|h| h.status().lease_renewals).sum();
    assert!(renewals >= 3, "the leases were renewed: {renewals}");
}

/// A push to a queue running no task starts one at once: the scaler may be inside its
/// coalescing interval (one decision per `scale_interval`), and waiting for it made a
/// pushed message wait up to that long (seen as ~450 ms pickups at the 1 s default).
#[tokio::test(start_paused = true)]
async fn a_push_to_a_queue_with_no_task_is_picked_up_at_once_even_between_scaler_decisions() {
    let settings = QueueSettings {
        push_enabled: true,
        min_tasks: 0,
        scale_interval: Duration::from_secs(10),
        min_polling_interval: Duration::from_millis(100),
        max_polling_interval: Duration::from_millis(400),
        // No coalescing: a pickup is due at once (coalescing is tested below).
        max_pickup_delay: Duration::ZERO,
        ..Default::default()
    };
    let f = fixture(settings, None);
    f.listener.start();
    f.queue.put(b"first", Duration::ZERO).await.unwrap();
    f.listener.work_detected();
    sleep(Duration::from_secs(4)).await;
    assert_eq!(f.listener.status().processed, 1);
    assert_eq!(f.listener.status().active_tasks, 0, "idle tasks stopped (push variant)");
    // The scaler decided at the first push and again when the batch was found; it is
    // inside its 10 s interval now.
    f.queue.put(b"second", Duration::ZERO).await.unwrap();
    let pushed = Instant::now();
    f.listener.work_detected();
    while f.handler.calls.load(Ordering::Relaxed) < 2 {
        sleep(Duration::from_millis(1)).await;
    }
    assert!(pushed.elapsed() < Duration::from_millis(50), "picked up {:?} after the push", pushed.elapsed());
}

/// A push queue with no task: the settings of a zero-idle queue.
fn zero_idle(safety_poll: Duration) -> QueueSettings {
    QueueSettings { push_enabled: true, min_tasks: 0, safety_poll, ..Default::default() }
}

#[tokio::test(start_paused = true)]
async fn with_push_and_no_task_messages_queued_before_the_start_are_picked_up_at_once() {
    let f = fixture(zero_idle(Duration::from_secs(3600)), None);
    put(f.queue.as_ref(), "sleep 5", 40).await;
    f.listener.start();
    sleep(Duration::from_secs(5)).await;
    let status = f.listener.status();
    assert_eq!(status.processed, 40, "the start-up poll found them without a notification");
    assert_eq!(status.safety_polls, 1);
    // Then the tasks back off and stop: nothing polls until the next safety poll.
    sleep(Duration::from_secs(600)).await;
    assert_eq!(f.listener.status().active_tasks, 0);
}

#[tokio::test(start_paused = true)]
async fn a_lost_notification_delays_a_message_by_at_most_the_safety_poll() {
    let f = fixture(zero_idle(Duration::from_secs(600)), None);
    f.listener.start();
    // The start-up poll, and the one a lease (30 s) later, found nothing.
    sleep(Duration::from_secs(60)).await;
    assert_eq!(f.listener.status().active_tasks, 0, "the start-up polls found nothing and stopped");
    // Sent without a notification (or its notification was lost).
    let sent_at = Instant::now();
    put(f.queue.as_ref(), "hello", 1).await;
    sleep(Duration::from_secs(300)).await;
    assert_eq!(f.listener.status().processed, 0, "nothing looks before the safety poll");
    while f.listener.status().processed == 0 {
        assert!(sent_at.elapsed() <= Duration::from_secs(601), "not picked up within the safety poll");
        sleep(Duration::from_secs(1)).await;
    }
    assert!(sent_at.elapsed() >= Duration::from_secs(569), "picked up by the safety poll at 630 s, not before");
}

#[tokio::test(start_paused = true)]
async fn an_idle_push_queue_costs_one_get_per_safety_poll() {
    let f = fixture(zero_idle(Duration::from_secs(3600)), None);
    f.listener.start();
    sleep(Duration::from_secs(24 * 3600 - 1)).await;
    let gets = f.queue.gets.lock().unwrap().clone();
    // The start-up poll, the one a lease (30 s) later for leases a crashed host left, and
    // one per hour: 25 in a day, each one get.
    assert_eq!(gets.len(), 25, "{gets:?}");
    assert!(gets.iter().all(|(_, found)| *found == 0));
    assert_eq!(f.listener.status().safety_polls, 25);
    assert_eq!(f.listener.status().active_tasks, 0);
}

#[tokio::test(start_paused = true)]
async fn no_safety_poll_while_tasks_run_or_without_push() {
    // Push with a task kept: it polls, so no safety poll is needed.
    let settings = QueueSettings { min_tasks: 1, ..zero_idle(Duration::from_secs(60)) };
    let f = fixture(settings, None);
    f.listener.start();
    sleep(Duration::from_secs(600)).await;
    assert_eq!(f.listener.status().safety_polls, 0);
    // Pull: the polling task is the safety.
    let f = fixture(QueueSettings { safety_poll: Duration::from_secs(60), ..Default::default() }, None);
    f.listener.start();
    sleep(Duration::from_secs(600)).await;
    assert_eq!(f.listener.status().safety_polls, 0);
}

/// Panics in every decision: a native rule with a bug.
struct PanickingRule;

impl ebb::rules::NativeRule for PanickingRule {
    fn name(&self) -> &str {
        "panicking"
    }
    fn optimal_dequeue_task_count(&self, _state: &ebb::rules::QueueState) -> u32 {
        panic!("rule bug in the task count")
    }
    fn on_queue_empty(&self, _ctx: &ebb::rules::IdleContext) -> ebb::rules::IdleDecision {
        panic!("rule bug when empty")
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_native_rule_is_contained_and_the_built_in_decides() {
    let clock = Arc::new(TokioClock::new());
    let queue = Arc::new(MemoryQueue::new(QUEUE, clock.clone(), 65536));
    let poison = Arc::new(MemoryQueue::new("work-poison", clock, 65536));
    let handler = Arc::new(TestHandler::default());
    let listener = Listener::builder(queue.clone(), poison, handler).decider(Arc::new(PanickingRule)).build();
    listener.start();
    put(queue.as_ref(), "sleep 1", 50).await;
    sleep(Duration::from_secs(120)).await;
    let status = listener.status();
    assert_eq!(status.processed, 50);
    assert!(status.rule_call_panics >= 2, "{}", status.rule_call_panics);
    assert_eq!(status.last_queue_empty.unwrap().decision.source, ebb::rules::DecisionSource::Fallback);
    assert_eq!(status.task_panics, 0, "no task died of it");
}

/// Records the time each `QueueEmpty` decision is told, and otherwise decides like the paper.
#[derive(Default)]
struct TimeRecordingRule {
    told_ms: Mutex<Vec<u64>>,
}

impl ebb::rules::NativeRule for TimeRecordingRule {
    fn name(&self) -> &str {
        "time-recording"
    }
    fn optimal_dequeue_task_count(&self, state: &ebb::rules::QueueState) -> u32 {
        ebb_rules_sdk::paper::optimal_dequeue_task_count(state)
    }
    fn on_queue_empty(&self, ctx: &ebb::rules::IdleContext) -> ebb::rules::IdleDecision {
        self.told_ms.lock().unwrap().push(ctx.timestamp_ms);
        ebb_rules_sdk::paper::on_queue_empty(ctx)
    }
}

#[tokio::test(start_paused = true)]
async fn rules_are_told_the_listeners_clock_so_a_simulated_hour_is_an_hour() {
    let clock = Arc::new(TokioClock::new());
    let queue = Arc::new(MemoryQueue::new(QUEUE, clock.clone(), 65536));
    let poison = Arc::new(MemoryQueue::new("work-poison", clock.clone(), 65536));
    let rule = Arc::new(TimeRecordingRule::default());
    let listener = Listener::builder(queue, poison, Arc::new(TestHandler::default())).decider(rule.clone()).clock(clock).build();
    let real = std::time::Instant::now();
    listener.start();
    sleep(Duration::from_secs(3600)).await;
    let told = rule.told_ms.lock().unwrap().clone();
    let span_ms = told.last().unwrap() - told.first().unwrap();
    assert!(span_ms > 3_500_000, "the rule saw {span_ms} ms pass in a simulated hour");
    assert!(real.elapsed() < Duration::from_secs(60), "in much less real time");
}

/// Decides through the `Decider` seam itself: always `max_tasks`, idle as the paper, on
/// whichever thread the listener asks on (recorded), with a status of its own.
struct ThreadRecordingDecider {
    may_block: bool,
    threads: Mutex<Vec<std::thread::ThreadId>>,
}

impl ebb::rules::Decider for ThreadRecordingDecider {
    fn decide_task_count(&self, state: &ebb::rules::QueueState) -> ebb::rules::Decision<u32> {
        self.threads.lock().unwrap().push(std::thread::current().id());
        ebb::rules::Decision { value: state.max_tasks, source: ebb::rules::DecisionSource::Rule, clamped: false }
    }
    fn decide_queue_empty(&self, ctx: &ebb::rules::IdleContext) -> ebb::rules::Decision<ebb::rules::IdleDecision> {
        self.threads.lock().unwrap().push(std::thread::current().id());
        ebb::rules::Decider::decide_queue_empty(&ebb::rules::BuiltInRule, ctx)
    }
    fn status(&self) -> Option<ebb::rules::RuleStatus> {
        Some(ebb::rules::RuleStatus {
            file: Some("thread-recording".into()),
            sha256: None,
            loaded_at: None,
            quarantined: false,
            decisions: self.threads.lock().unwrap().len() as u64,
            faults: 0,
            clamps: 0,
            last_error: None,
            instance_memory_bytes: 0,
            shared_by: 1,
            rebuilding: false,
            compiling: false,
            decisions_while_compiling: 0,
            ..Default::default()
        })
    }
    fn may_block(&self) -> bool {
        self.may_block
    }
}

#[tokio::test(start_paused = true)]
async fn the_builders_decider_decides_shows_its_status_and_is_asked_off_the_async_thread_only_if_it_may_block() {
    let test_thread = std::thread::current().id();
    for may_block in [true, false] {
        let clock = Arc::new(TokioClock::new());
        let queue = Arc::new(MemoryQueue::new(QUEUE, clock.clone(), 65536));
        let poison = Arc::new(MemoryQueue::new("work-poison", clock, 65536));
        let decider = Arc::new(ThreadRecordingDecider { may_block, threads: Mutex::default() });
        let settings = QueueSettings { max_tasks: 3, ..Default::default() };
        let listener = Listener::builder(queue.clone(), poison, Arc::new(TestHandler::default())).decider(decider.clone()).settings(settings).build();
        listener.start();
        put(queue.as_ref(), "sleep 1000", 30).await;
        sleep(Duration::from_secs(60)).await;
        let status = listener.status();
        assert_eq!(status.processed, 30);
        let task_count = status.last_task_count.expect("a task count was decided").decision;
        assert_eq!((task_count.value, task_count.source), (3, ebb::rules::DecisionSource::Rule), "the decider's count, not the paper's");
        assert_eq!(status.peak_tasks, 3);
        assert_eq!(status.rule.expect("the decider's status is shown").file.as_deref(), Some("thread-recording"));
        let threads = decider.threads.lock().unwrap().clone();
        assert!(threads.len() >= 2, "{threads:?}");
        if may_block {
            assert!(threads.iter().all(|t| *t != test_thread), "a decider that may block is asked on the blocking pool");
        } else {
            assert!(threads.iter().all(|t| *t == test_thread), "a decider that answers at once is asked where the listener runs");
        }
        listener.shutdown(Duration::from_secs(1)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_start_up_poll_that_meets_a_storage_outage_keeps_trying_until_it_looks() {
    let f = fixture(zero_idle(Duration::from_secs(3600)), None);
    f.queue.failures_left.store(5, Ordering::Relaxed);
    put(f.queue.as_ref(), "sent while the host was down", 1).await;
    let listener = f.listener;
    listener.start();
    sleep(Duration::from_secs(120)).await;
    let status = listener.status();
    assert_eq!(status.storage_errors, 5);
    assert_eq!(status.processed, 1, "the probe retried with back-off and found the message");
    assert_eq!(status.safety_polls, 2, "one probe per look (at start-up and a lease later), not one per failure");
}

/// Review (session 4): a message the poison queue refuses (on Azure: 60,000 bytes of text
/// that is not base64, too large once encoded for the poison queue) came back at every
/// lease, failed to poison again, and logged an ERROR each time, forever.
#[tokio::test(start_paused = true)]
async fn a_message_the_poison_queue_refuses_waits_the_longest_retry_delay_and_logs_little() {
    let capture = ebb_tests::LogCapture::default();
    let _guard = capture.start(tracing::Level::WARN);
    let clock = Arc::new(TokioClock::new());
    let queue = Arc::new(MemoryQueue::new(QUEUE, clock.clone(), 65536));
    let poison = Arc::new(MemoryQueue::new("work-poison", clock, 8));
    let handler = Arc::new(TestHandler::default());
    let settings = QueueSettings {
        max_dequeue_count: 1,
        lease_duration: Duration::from_secs(2),
        max_retry_delay: Duration::from_secs(300),
        poison_envelope: false,
        ..Default::default()
    };
    let listener = Listener::builder(queue.clone(), poison.clone(), handler.clone()).settings(settings).build();
    queue.put(b"fail: too long for the poison queue", Duration::ZERO).await.unwrap();
    listener.start();
    sleep(Duration::from_secs(290)).await;
    assert_eq!(handler.calls.load(Ordering::Relaxed), 1, "not re-leased every 2 s lease");
    assert_eq!(listener.status().poison_failures, 1);
    assert_eq!(queue.approximate_count().await.unwrap(), 1, "the message is kept");
    // Visible again at 300 s; found within the idle back-off (at most a minute).
    sleep(Duration::from_secs(80)).await;
    assert_eq!(listener.status().poison_failures, 2, "poisoning tried again after max_retry_delay");
    let log = capture.text();
    assert_eq!(log.matches("cannot poison").count(), 2, "{log}");
}

/// Review (session 4): with push and no task, a message this host hid itself (a retry
/// delay after a failure, a send with a delay) became visible again unannounced, and
/// waited for the next safety poll (an hour by default), or for ever before there was one.
#[tokio::test(start_paused = true)]
async fn with_push_and_no_task_a_retried_message_is_picked_up_when_its_retry_delay_ends() {
    let settings = QueueSettings {
        push_enabled: true,
        min_tasks: 0,
        visibility_timeout: Duration::from_secs(20),
        max_polling_interval: Duration::from_millis(400),
        safety_poll: Duration::from_secs(3600),
        ..Default::default()
    };
    let f = fixture(settings, None);
    f.listener.start();
    f.queue.put(b"fail: once", Duration::ZERO).await.unwrap();
    f.listener.work_detected();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(f.handler.calls.load(Ordering::Relaxed), 1);
    assert_eq!(f.listener.status().active_tasks, 0, "every task stopped while the message is hidden");
    sleep(Duration::from_secs(17)).await;
    assert_eq!(f.handler.calls.load(Ordering::Relaxed), 2, "tried again when its 20 s retry delay ended, not at the safety poll");
}

/// Records every queue state it is told, and otherwise decides like the paper.
#[derive(Default)]
struct StateRecordingRule {
    states: Mutex<Vec<ebb::rules::QueueState>>,
}

impl ebb::rules::NativeRule for StateRecordingRule {
    fn name(&self) -> &str {
        "state-recording"
    }
    fn optimal_dequeue_task_count(&self, state: &ebb::rules::QueueState) -> u32 {
        self.states.lock().unwrap().push(state.clone());
        ebb_rules_sdk::paper::optimal_dequeue_task_count(state)
    }
    fn on_queue_empty(&self, ctx: &ebb::rules::IdleContext) -> ebb::rules::IdleDecision {
        ebb_rules_sdk::paper::on_queue_empty(ctx)
    }
}

/// Contract 0.2.0: the state a decision is told carries what the last get returned (its
/// messages, the batch asked, the oldest one's wait since it was put), the arrivals the
/// listener was told of over the last 10 s, and that the depth was counted.
#[tokio::test(start_paused = true)]
async fn a_decision_is_told_the_last_get_the_arrivals_and_where_the_depth_came_from() {
    let clock = Arc::new(TokioClock::new());
    let queue = Arc::new(MemoryQueue::new(QUEUE, clock.clone(), 65536));
    let poison = Arc::new(MemoryQueue::new("work-poison", clock.clone(), 65536));
    let rule = Arc::new(StateRecordingRule::default());
    let settings = QueueSettings { batch_size: 16, max_polling_interval: Duration::from_secs(1), ..Default::default() };
    let listener = Listener::builder(queue.clone(), poison, Arc::new(TestHandler::default())).decider(rule.clone()).settings(settings).clock(clock).build();
    listener.start();
    sleep(Duration::from_secs(30)).await;
    assert!(rule.states.lock().unwrap().is_empty(), "no work yet, no task-count decision");

    // 20 arrivals 2 s apart from the put, which is hidden for 2 s: the get that finds the
    // messages comes 2 to 3 s after they were put.
    listener.record_arrivals(20);
    sleep(Duration::from_secs(2)).await;
    for _ in 0..5 {
        queue.put(b"sleep 1", Duration::from_secs(2)).await.unwrap();
    }
    sleep(Duration::from_secs(5)).await;
    let states = rule.states.lock().unwrap().clone();
    let first = states.first().expect("the messages found were a work-detected event");
    assert_eq!((first.last_get_messages, first.batch_size), (5, 16), "{first:?}");
    let age = first.oldest_message_age_ms.expect("the memory queue tells insertion times");
    assert!((2_000..=3_200).contains(&age), "waited from its put, not from when it became visible: {age} ms");
    assert_eq!(first.depth_source, ebb::rules::DepthSource::Inferred, "5 of 16: the get drained the queue, no count was needed");
    // 20 arrivals over the last 9 to 10 s (they came 4 to 5 s before the decision).
    assert!((2.0..=20.0 / 9.0).contains(&first.arrivals_per_sec), "{first:?}");

    // Ten more seconds: the arrivals are out of the window. A message put straight into
    // storage and a wake-up: the get that finds it decides again.
    sleep(Duration::from_secs(10)).await;
    queue.put(b"sleep 1", Duration::ZERO).await.unwrap();
    listener.work_detected();
    sleep(Duration::from_secs(2)).await;
    let last = rule.states.lock().unwrap().last().cloned().unwrap();
    assert_eq!(last.arrivals_per_sec, 0.0, "a wake-up alone is not an arrival (the queue handle counts puts and notifications): {last:?}");
    assert_eq!(last.last_get_messages, 1, "{last:?}");
}

/// Contract 0.2.0: the queue handle counts each send through it and each notification made
/// to it as an arrival (what the rule sees as `arrivals_per_sec`).
#[tokio::test(start_paused = true)]
async fn sends_and_notifications_through_the_queue_handle_are_the_arrivals_a_rule_sees() {
    let clock = Arc::new(TokioClock::new());
    let queue: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new(QUEUE, clock.clone(), 65536));
    let poison = Arc::new(MemoryQueue::new("work-poison", clock.clone(), 65536));
    let rule = Arc::new(StateRecordingRule::default());
    let settings = QueueSettings { max_polling_interval: Duration::from_secs(1), scale_interval: Duration::from_millis(100), ..Default::default() };
    let listener = Listener::builder(queue.clone(), poison, Arc::new(TestHandler::default())).decider(rule.clone()).settings(settings).clock(clock).build();
    let handle = ebb::QueueHandle::new(QUEUE, queue, vec![listener.clone()]);
    listener.start();
    sleep(Duration::from_secs(30)).await;
    for _ in 0..9 {
        handle.send(b"sleep 1", Duration::ZERO, Duration::from_secs(5)).await.unwrap();
    }
    handle.notify();
    handle.notify();
    handle.notify();
    sleep(Duration::from_secs(1)).await;
    listener.work_detected();
    sleep(Duration::from_secs(1)).await;
    let last = rule.states.lock().unwrap().last().cloned().expect("work was detected");
    // 12 arrivals at 30 s, over the window of the last 9 to 10 s at 31 s.
    assert!((12.0 / 10.0..=12.0 / 9.0).contains(&last.arrivals_per_sec), "{last:?}");
}

/// Storage refusing every count call.
struct Uncountable;

#[async_trait]
impl Hooks for Uncountable {
    async fn before_count(&self) -> Result<(), QueueError> {
        Err(QueueError::Transient(anyhow::anyhow!("count unavailable")))
    }
}

/// Contract 0.2.0: when the count for a decision fails, the depth the rule is told is the
/// last known one, and it says so (`inferred`).
#[tokio::test(start_paused = true)]
async fn a_depth_that_could_not_be_counted_is_told_as_inferred() {
    let clock = Arc::new(TokioClock::new());
    let queue = Hooked::new(MemoryQueue::new(QUEUE, clock.clone(), 65536), Uncountable);
    let poison = Arc::new(MemoryQueue::new("work-poison", clock.clone(), 65536));
    let rule = Arc::new(StateRecordingRule::default());
    let listener = Listener::builder(queue.clone(), poison, Arc::new(TestHandler::default())).decider(rule.clone()).clock(clock).build();
    listener.start();
    put(queue.as_ref(), "sleep 1", 3).await;
    sleep(Duration::from_secs(60)).await;
    let states = rule.states.lock().unwrap().clone();
    assert!(!states.is_empty(), "the messages found were a work-detected event");
    assert!(states.iter().all(|s| s.depth_source == ebb::rules::DepthSource::Inferred), "{states:?}");
}

/// A paused queue makes no get; the calls that run finish and their messages are deleted,
/// so nothing is lost; resuming picks up where it stopped.
#[tokio::test(start_paused = true)]
async fn a_paused_queue_makes_no_get_lets_running_calls_finish_and_resumes() {
    let f = fixture(QueueSettings { min_polling_interval: Duration::from_millis(100), ..Default::default() }, None);
    put(f.queue.as_ref(), "sleep 1000", 200).await;
    f.listener.start();
    sleep(Duration::from_millis(500)).await;
    assert!(f.listener.status().handler_calls > 0, "calls run when the pause comes");
    f.listener.set_pause(Some(ebb::listener::Pause { since_ms: 0, until_ms: None }));
    let gets_at_pause = f.queue.gets.lock().unwrap().len();
    sleep(Duration::from_secs(30)).await;
    let paused = f.listener.status();
    assert_eq!(f.queue.gets.lock().unwrap().len(), gets_at_pause, "a get was made while paused");
    assert_eq!((paused.handler_calls, paused.in_flight), (0, 0), "running calls finished and were settled: {paused:?}");
    assert!(paused.processed > 0 && paused.processed < 200, "{paused:?}");
    assert_eq!(f.queue.inner.approximate_count().await.unwrap(), 200 - paused.processed, "nothing lost, nothing deleted unhandled");
    assert!(paused.paused.is_some(), "the status shows the pause");

    f.listener.set_pause(None);
    sleep(Duration::from_secs(60)).await;
    let resumed = f.listener.status();
    assert_eq!((resumed.processed, resumed.paused), (200, None), "{resumed:?}");
}

/// A pause with an end resumes by itself then, without anyone resuming it.
#[tokio::test(start_paused = true)]
async fn a_pause_for_a_while_ends_by_itself() {
    let clock = Arc::new(TokioClock::new());
    let queue = Hooked::new(MemoryQueue::new(QUEUE, clock.clone(), 65536), GetRecorder::default());
    let poison = Arc::new(MemoryQueue::new("work-poison", clock.clone(), 65536));
    let listener = Listener::builder(queue.clone(), poison, Arc::new(TestHandler::default())).clock(clock.clone()).build();
    let now_ms = ebb::queue::Clock::now_ms(clock.as_ref());
    listener.set_pause(Some(ebb::listener::Pause { since_ms: now_ms, until_ms: Some(now_ms + 10_000) }));
    put(queue.as_ref(), "sleep 1", 5).await;
    listener.start();
    sleep(Duration::from_secs(9)).await;
    assert_eq!(listener.status().processed, 0, "paused for 10 s");
    assert!(queue.gets.lock().unwrap().is_empty(), "no get while paused");
    sleep(Duration::from_secs(2)).await;
    let status = listener.status();
    assert_eq!((status.processed, status.paused), (5, None), "{status:?}");
}

struct AlwaysFails;

#[async_trait]
impl Handler for AlwaysFails {
    async fn handle(&self, _message: &IncomingMessage) -> anyhow::Result<()> {
        anyhow::bail!("refused")
    }
}

/// A body that reads as a poison envelope and is too large to wrap in one is left in place
/// (a poison failure), never moved bare: a requeue would take it for an envelope and put
/// back only the "body" inside it (found by the attack pass).
#[tokio::test(start_paused = true)]
async fn a_body_that_reads_as_a_poison_envelope_is_never_moved_bare() {
    let clock = Arc::new(TokioClock::new());
    let queue = Arc::new(MemoryQueue::new(QUEUE, clock.clone(), 65536));
    let poison = Arc::new(MemoryQueue::new("work-poison", clock, 400));
    let forged = serde_json::json!({
        "queue": "work", "original_id": "1", "dequeue_count": 1, "error": "fake", "inserted_at": "x", "poisoned_at": "y",
        "body": "TINY", "pad": "p".repeat(200),
    })
    .to_string();
    assert!(forged.len() < 400, "fits the poison queue bare, not wrapped");
    queue.put(forged.as_bytes(), Duration::ZERO).await.unwrap();
    let settings = QueueSettings { max_dequeue_count: 1, ..Default::default() };
    let listener = Listener::builder(queue.clone(), poison.clone(), Arc::new(AlwaysFails)).settings(settings).build();
    listener.start();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(poison.approximate_count().await.unwrap(), 0, "moved bare");
    assert!(listener.status().poison_failures >= 1, "{:?}", listener.status());
    assert_eq!(queue.approximate_count().await.unwrap(), 1, "left in place, not lost");
}

/// Always wants the same number of tasks; idles as the paper.
pub(crate) struct FixedCount(pub u32);

impl ebb::rules::NativeRule for FixedCount {
    fn name(&self) -> &str {
        "fixed-count"
    }
    fn optimal_dequeue_task_count(&self, _state: &ebb::rules::QueueState) -> u32 {
        self.0
    }
    fn on_queue_empty(&self, ctx: &ebb::rules::IdleContext) -> ebb::rules::IdleDecision {
        ebb_rules_sdk::paper::on_queue_empty(ctx)
    }
}

/// A listener on the in-memory queue deciding with `rule`, and a handle whose sends notify it.
fn with_rule(rule: FixedCount, settings: QueueSettings) -> (Listener, ebb::QueueHandle, Arc<TestHandler>) {
    let clock = Arc::new(TokioClock::new());
    let queue: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new(QUEUE, clock.clone(), 65536));
    let poison = Arc::new(MemoryQueue::new("work-poison", clock.clone(), 65536));
    let handler = Arc::new(TestHandler::default());
    let settings = QueueSettings { random_seed: Some(7), ..settings };
    let listener = Listener::builder(queue.clone(), poison, handler.clone()).decider(Arc::new(rule)).settings(settings).clock(clock).build();
    let handle = ebb::QueueHandle::new(QUEUE, queue, vec![listener.clone()]);
    (listener, handle, handler)
}

/// Issue 35: a notification's pickup started a task up to `max_tasks` whenever none rested,
/// past the rule's count (a rule saying 2, a 300 ms handler and ten sends a second reached
/// 3 tasks). A pickup uses a resting task or waits for a busy one to drain. (A 1 s handler
/// and a 100 ms `max_pickup_delay`: both tasks are still busy when a pickup comes due.)
#[tokio::test(start_paused = true)]
async fn pickups_while_every_task_is_busy_never_run_more_tasks_than_the_rules_count() {
    for push_enabled in [false, true] {
        let settings = QueueSettings {
            push_enabled,
            min_tasks: u32::from(!push_enabled),
            max_tasks: 32,
            max_pickup_delay: Duration::from_millis(100),
            ..Default::default()
        };
        let (listener, handle, _) = with_rule(FixedCount(2), settings);
        listener.start();
        sleep(Duration::from_secs(1)).await;
        for _ in 0..200 {
            handle.send(b"sleep 1000", Duration::ZERO, Duration::from_secs(5)).await.unwrap();
            sleep(Duration::from_millis(100)).await;
        }
        sleep(Duration::from_secs(10)).await;
        let status = listener.status();
        assert_eq!((status.processed, status.target_tasks, status.peak_tasks), (200, 2, 2), "push {push_enabled}: {status:?}");
    }
}

/// Issue 35: a pickup that cannot start a task (the rule's count is running, all busy) is
/// not lost: the first task to drain the queue gets for it, before it rests.
#[tokio::test(start_paused = true)]
async fn a_pickup_that_cannot_start_a_task_is_taken_by_the_first_task_to_drain() {
    let settings = QueueSettings { push_enabled: true, min_tasks: 0, max_pickup_delay: Duration::ZERO, ..Default::default() };
    let (listener, handle, handler) = with_rule(FixedCount(1), settings);
    listener.start();
    sleep(Duration::from_secs(1)).await;
    handle.send(b"sleep 1000", Duration::ZERO, Duration::from_secs(5)).await.unwrap();
    sleep(Duration::from_millis(100)).await;
    assert_eq!(listener.status().active_tasks, 1, "a push at zero tasks starts one");
    handle.send(b"sleep 10", Duration::ZERO, Duration::from_secs(5)).await.unwrap();
    sleep(Duration::from_millis(850)).await;
    assert_eq!(handler.calls.load(Ordering::Relaxed), 1, "the second waits for the busy task, no task is started for it");
    sleep(Duration::from_millis(100)).await;
    let status = listener.status();
    assert_eq!((handler.calls.load(Ordering::Relaxed), status.processed, status.peak_tasks), (2, 2, 1), "{status:?}");
}

/// Issue 37: a pickup waited `max_pickup_delay` to gather notifications into one get even
/// when they had announced a whole batch already (a dump of 20,000 on SQS waited 800 ms for
/// nothing). Nine sends wait for the delay, to share a get with more; ten, a batch, are got
/// at once.
#[tokio::test(start_paused = true)]
async fn notifications_that_announce_a_batch_are_picked_up_without_the_pickup_delay() {
    let settings = QueueSettings { push_enabled: true, min_tasks: 0, batch_size: 10, max_pickup_delay: Duration::from_millis(800), ..Default::default() };
    let (listener, handle, handler) = with_rule(FixedCount(1), settings);
    listener.start();
    sleep(Duration::from_secs(1)).await;
    for _ in 0..9 {
        handle.send(b"sleep 10", Duration::ZERO, Duration::from_secs(5)).await.unwrap();
    }
    sleep(Duration::from_millis(700)).await;
    assert_eq!(handler.calls.load(Ordering::Relaxed), 0, "fewer than a batch wait for the pickup delay");
    sleep(Duration::from_millis(200)).await;
    assert_eq!(handler.calls.load(Ordering::Relaxed), 9, "then one get takes them");
    sleep(Duration::from_secs(1)).await;
    for _ in 0..10 {
        handle.send(b"sleep 10", Duration::ZERO, Duration::from_secs(5)).await.unwrap();
    }
    sleep(Duration::from_millis(50)).await;
    assert_eq!(handler.calls.load(Ordering::Relaxed), 19, "a batch announced is got at once");
}

/// Issue 37: after a full get a task waited for its batch's slowest call before its next get,
/// so a backlog drained at tasks × batch per slowest call (a dump of 20,000 on SQS took 4 s
/// at 32 tasks, with slots for 1,024 calls). With more waiting, the task gets again as soon as
/// handler slots are free.
#[tokio::test(start_paused = true)]
async fn after_a_full_get_a_task_gets_again_without_waiting_for_its_batchs_calls() {
    let settings = QueueSettings { min_tasks: 1, max_tasks: 1, batch_size: 4, max_concurrent_calls: 16, ..Default::default() };
    let (listener, handle, handler) = with_rule(FixedCount(1), settings);
    for _ in 0..8 {
        handle.send(b"sleep 1000", Duration::ZERO, Duration::from_secs(5)).await.unwrap();
    }
    listener.start();
    sleep(Duration::from_millis(100)).await;
    assert_eq!(handler.calls.load(Ordering::Relaxed), 8, "one task, two batches running at once");
    sleep(Duration::from_secs(2)).await;
    let status = listener.status();
    assert_eq!((status.processed, status.peak_tasks), (8, 1), "{status:?}");
}

/// Issue 37: with `min_tasks = max_tasks` the rule's count is fixed whatever the depth, yet
/// each full get had the queue counted, once per `scale_interval` (on SQS a billed
/// `GetQueueAttributes`: `ebb bench sqs` runs its tasks so).
#[tokio::test(start_paused = true)]
async fn a_task_count_the_bounds_fix_is_decided_without_counting_the_queue() {
    let clock = Arc::new(TokioClock::new());
    let queue = Arc::new(ebb::queue::Metered::new(MemoryQueue::new(QUEUE, clock.clone(), 65536)));
    let poison = Arc::new(MemoryQueue::new("work-poison", clock.clone(), 65536));
    let handler = Arc::new(TestHandler::default());
    put(queue.as_ref(), "sleep 100", 400).await;
    let settings = QueueSettings { min_tasks: 4, max_tasks: 4, batch_size: 10, random_seed: Some(7), ..Default::default() };
    let listener = Listener::builder(queue.clone(), poison, handler).settings(settings).clock(clock).build();
    listener.start();
    sleep(Duration::from_secs(10)).await;
    let counts = queue.transactions().snapshot();
    assert_eq!((listener.status().processed, counts.counts), (400, 0), "{counts:?}");
}
