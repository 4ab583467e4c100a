//! Handler concurrency (issue 24): `max_concurrent_calls` bounds the calls at once apart from
//! the dequeue tasks, gets ask for no more messages than there are free slots, a rule of
//! contract 0.3.0 may lower the limit, and every slot comes back whatever the handler did.
//! Under tokio's paused clock, on the in-memory backend.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ebb::handler::{Handler, IncomingMessage};
use ebb::listener::{CONCURRENCY_WINDOW, Listener, QueueSettings};
use ebb::queue::memory::MemoryQueue;
use ebb::queue::{Message, QueueClient, QueueError, TokioClock};
use ebb::rules::{HandlerState, IdleContext, IdleDecision, NativeRule, QueueState};
use tokio::time::{Instant, sleep};

use crate::hooked_queue::{Hooked, Hooks};

/// Sleeps 100 ms per message ("panic" panics, "hang" never answers), and records the most
/// calls at once and how long each message waited between its get and its call.
#[derive(Default)]
struct CountingHandler {
    calls: AtomicU32,
    peak: AtomicU32,
    /// When each get answered, by message id (filled by [`AskRecorder`]).
    got_at: Arc<Mutex<std::collections::HashMap<String, Instant>>>,
    longest_wait: Mutex<Duration>,
}

struct CallMark<'a>(&'a AtomicU32);

impl Drop for CallMark<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl Handler for CountingHandler {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        if let Some(got) = self.got_at.lock().unwrap().get(message.id.as_str()) {
            let mut longest = self.longest_wait.lock().unwrap();
            *longest = (*longest).max(got.elapsed());
        }
        let now = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let _mark = CallMark(&self.calls);
        self.peak.fetch_max(now, Ordering::Relaxed);
        match &message.body[..] {
            b"panic" => panic!("handler bug"),
            b"hang" => std::future::pending().await,
            b"fast" => sleep(Duration::from_millis(1)).await,
            _ => sleep(Duration::from_millis(100)).await,
        }
        Ok(())
    }
}

/// Records the most and fewest messages a get asked for, and when each message was handed out.
struct AskRecorder {
    largest_ask: AtomicU32,
    smallest_ask: AtomicU32,
    got_at: Arc<Mutex<std::collections::HashMap<String, Instant>>>,
}

#[async_trait]
impl Hooks for AskRecorder {
    async fn before_get(&self, max: u32) -> Result<(), QueueError> {
        self.largest_ask.fetch_max(max, Ordering::Relaxed);
        self.smallest_ask.fetch_min(max, Ordering::Relaxed);
        Ok(())
    }
    async fn after_get(&self, got: &mut Result<Vec<Message>, QueueError>) {
        let mut at = self.got_at.lock().unwrap();
        for message in got.iter().flatten() {
            at.insert(message.id.to_string(), Instant::now());
        }
    }
}

struct Fixture {
    queue: Arc<Hooked<AskRecorder>>,
    poison: Arc<MemoryQueue>,
    handler: Arc<CountingHandler>,
    listener: Listener,
}

fn fixture(settings: QueueSettings, rule: Option<Arc<dyn ebb::rules::Decider>>) -> Fixture {
    let clock = Arc::new(TokioClock::new());
    let got_at = Arc::new(Mutex::default());
    let queue = Hooked::new(
        MemoryQueue::new("work", clock.clone(), 65536),
        AskRecorder { largest_ask: AtomicU32::new(0), smallest_ask: AtomicU32::new(u32::MAX), got_at: got_at.clone() },
    );
    let poison = Arc::new(MemoryQueue::new("work-poison", clock, 65536));
    let handler = Arc::new(CountingHandler { got_at, ..Default::default() });
    let mut builder = Listener::builder(queue.clone(), poison.clone(), handler.clone()).settings(QueueSettings { random_seed: Some(3), ..settings });
    if let Some(rule) = rule {
        builder = builder.decider(rule);
    }
    Fixture { queue, poison, handler, listener: builder.build() }
}

async fn put(queue: &dyn QueueClient, body: &str, count: usize) {
    for _ in 0..count {
        queue.put(body.as_bytes(), Duration::ZERO).await.unwrap();
    }
}

/// Sixteen tasks, five slots: the shape the issue warns of (many tasks, a small app pool).
fn many_tasks_few_slots() -> QueueSettings {
    QueueSettings { min_tasks: 16, max_tasks: 16, max_concurrent_calls: 5, min_polling_interval: Duration::from_millis(100), ..Default::default() }
}

#[tokio::test(start_paused = true)]
async fn handler_calls_never_exceed_max_concurrent_calls_and_no_message_waits_leased_for_a_slot() {
    let f = fixture(many_tasks_few_slots(), None);
    put(f.queue.as_ref(), "work", 300).await;
    f.listener.start();
    sleep(Duration::from_secs(3)).await;
    let status = f.listener.status();
    assert!(status.tasks_waiting_for_slots > 0, "with 16 tasks and 5 slots, tasks wait: {status:?}");
    assert!(status.handler_calls <= 5 && status.in_flight >= status.handler_calls, "{status:?}");
    assert_eq!((status.concurrency_limit, status.max_concurrent_calls), (5, 5));
    // 5 at a time, 100 ms each: 50 a second, where 16 tasks of 32 would have done all 300 at once.
    assert!(status.processed <= 150, "{} processed within 3 s of calls at 5 at once", status.processed);
    sleep(Duration::from_secs(10)).await;
    assert_eq!(f.listener.status().processed, 300);
    assert_eq!(f.handler.peak.load(Ordering::Relaxed), 5, "the bound was reached and never passed");
    assert!(f.queue.largest_ask.load(Ordering::Relaxed) <= 5, "no get asked for more messages than free slots");
    let waited = *f.handler.longest_wait.lock().unwrap();
    assert!(waited <= Duration::from_millis(1), "a message waited {waited:?} between its get and its call");
}

#[tokio::test(start_paused = true)]
async fn a_get_waits_until_half_the_slots_are_free_so_gets_stay_large() {
    let settings = QueueSettings { max_concurrent_calls: 32, ..many_tasks_few_slots() };
    let f = fixture(settings, None);
    put(f.queue.as_ref(), "work", 640).await;
    f.listener.start();
    sleep(Duration::from_secs(10)).await;
    assert_eq!(f.listener.status().processed, 640);
    // Each get costs a billed call: sixteen tasks never split 32 slots into gets of one or
    // two as calls end one by one; a task waits until half of them (16) are free.
    assert!(f.queue.smallest_ask.load(Ordering::Relaxed) >= 16, "a get asked for {}", f.queue.smallest_ask.load(Ordering::Relaxed));
}

#[tokio::test(start_paused = true)]
async fn a_fast_app_gets_what_its_slots_finish_within_five_ms_beyond_its_free_slots() {
    let settings = QueueSettings { min_tasks: 16, max_tasks: 16, max_concurrent_calls: 2, ..Default::default() };
    let f = fixture(settings, None);
    put(f.queue.as_ref(), "fast", 640).await;
    f.listener.start();
    let mut most_leased = 0;
    for _ in 0..2_000 {
        sleep(Duration::from_millis(1)).await;
        most_leased = most_leased.max(f.listener.status().in_flight);
    }
    assert_eq!(f.listener.status().processed, 640);
    // What is fetched ahead is the queue's, not each task's: sixteen tasks do not hold
    // sixteen batches leased for two slots.
    assert!(most_leased <= 12 + 2, "{most_leased} messages leased at once for 2 slots");
    // Two slots end ten 1 ms calls within the 5 ms a fetched-ahead message may wait: gets of
    // twelve (six times fewer gets than gets of two); the slow app of the test above never
    // got more than its free slots.
    assert_eq!(f.queue.largest_ask.load(Ordering::Relaxed), 12);
    assert_eq!(f.handler.peak.load(Ordering::Relaxed), 2, "still two calls at once");
    let waited = *f.handler.longest_wait.lock().unwrap();
    assert!(waited <= Duration::from_millis(10), "a fetched-ahead message waited {waited:?}");
}

/// Decides a fixed handler concurrency (or none, or panics), the paper's rule for the rest.
struct Concurrency(Option<u32>, bool);

impl NativeRule for Concurrency {
    fn name(&self) -> &str {
        "concurrency"
    }
    fn optimal_dequeue_task_count(&self, state: &QueueState) -> u32 {
        ebb_rules_sdk::paper::optimal_dequeue_task_count(state)
    }
    fn on_queue_empty(&self, ctx: &IdleContext) -> IdleDecision {
        ebb_rules_sdk::paper::on_queue_empty(ctx)
    }
    fn max_concurrent_calls(&self, state: &HandlerState) -> Option<u32> {
        if self.1 {
            panic!("rule bug");
        }
        assert!(state.max_limit == 5 && state.current_limit >= 1, "the rule is told the bounds: {state:?}");
        self.0
    }
}

#[tokio::test(start_paused = true)]
async fn a_rule_that_decides_concurrency_sets_the_limit_and_one_that_does_not_keeps_the_configured_bound() {
    for (decided, expected) in [(Some(2), 2), (None, 5), (Some(0), 1), (Some(1_000), 5)] {
        let f = fixture(many_tasks_few_slots(), Some(Arc::new(Concurrency(decided, false))));
        put(f.queue.as_ref(), "work", 400).await;
        f.listener.start();
        // The first window runs under the configured bound; then the rule's limit holds.
        sleep(CONCURRENCY_WINDOW * 2).await;
        f.handler.peak.store(0, Ordering::Relaxed);
        sleep(Duration::from_secs(4)).await;
        let status = f.listener.status();
        assert_eq!(status.concurrency_limit, expected, "rule decided {decided:?}: {status:?}");
        assert_eq!(f.handler.peak.load(Ordering::Relaxed), expected, "rule decided {decided:?}");
        assert_eq!(status.last_concurrency.as_ref().map(|d| d.decision.clamped), decided.map(|d| d != expected), "{status:?}");
    }
}

/// The built-in rule's decisions, counting how often the listener asks it for a
/// concurrency it says it cannot decide.
#[derive(Default)]
struct CannotDecideConcurrency {
    asked: AtomicU32,
}

impl ebb::rules::Decider for CannotDecideConcurrency {
    fn decide_task_count(&self, state: &QueueState) -> ebb::rules::Decision<u32> {
        ebb::rules::BuiltInRule.decide_task_count(state)
    }
    fn decide_queue_empty(&self, ctx: &IdleContext) -> ebb::rules::Decision<IdleDecision> {
        ebb::rules::BuiltInRule.decide_queue_empty(ctx)
    }
    fn decide_concurrency(&self, _state: &HandlerState) -> Option<ebb::rules::Decision<u32>> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        None
    }
    fn may_decide_concurrency(&self) -> bool {
        false
    }
}

/// A rule that cannot decide the concurrency is not asked four times a second under load
/// (each ask of a WASM rule goes to a blocking thread), and the configured bound holds.
#[tokio::test(start_paused = true)]
async fn a_rule_that_cannot_decide_concurrency_is_not_asked() {
    let rule = Arc::new(CannotDecideConcurrency::default());
    let f = fixture(many_tasks_few_slots(), Some(rule.clone()));
    put(f.queue.as_ref(), "work", 400).await;
    f.listener.start();
    sleep(Duration::from_secs(4)).await;
    assert!(f.listener.status().processed > 100, "{:?}", f.listener.status());
    assert_eq!(rule.asked.load(Ordering::Relaxed), 0, "asked for a concurrency it cannot decide");
    assert_eq!(f.listener.status().concurrency_limit, 5);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_concurrency_decision_keeps_the_configured_bound_and_is_counted() {
    let f = fixture(many_tasks_few_slots(), Some(Arc::new(Concurrency(Some(2), true))));
    put(f.queue.as_ref(), "work", 100).await;
    f.listener.start();
    sleep(Duration::from_secs(5)).await;
    let status = f.listener.status();
    assert_eq!(status.processed, 100, "processing went on: {status:?}");
    assert!(status.rule_call_panics > 0, "{status:?}");
    assert_eq!(status.concurrency_limit, 5);
}

#[tokio::test(start_paused = true)]
async fn handlers_that_panic_or_hang_give_their_slots_back() {
    let settings = QueueSettings {
        max_concurrent_calls: 2,
        max_dequeue_count: 3,
        visibility_timeout: Duration::from_millis(100),
        lease_duration: Duration::from_secs(2),
        ..many_tasks_few_slots()
    };
    let f = fixture(settings, None);
    put(f.queue.as_ref(), "panic", 6).await;
    put(f.queue.as_ref(), "work", 20).await;
    f.listener.start();
    sleep(Duration::from_secs(30)).await;
    let status = f.listener.status();
    // Had a panicking call kept its slot, two panics would have stopped every call.
    assert_eq!((status.processed, status.poisoned, status.handler_panics), (20, 6, 18), "{status:?}");
    assert_eq!((status.handler_calls, status.tasks_waiting_for_slots), (0, 0));
    assert_eq!(f.poison.approximate_count().await.unwrap(), 6);

    // A call that never answers holds its slot until shutdown abandons it; then it is free.
    put(f.queue.as_ref(), "hang", 1).await;
    // The idle tasks have backed off to the longest polling interval by now.
    sleep(Duration::from_secs(61)).await;
    assert_eq!(f.listener.status().handler_calls, 1);
    f.listener.shutdown(Duration::from_millis(100)).await;
    let status = f.listener.status();
    assert_eq!((status.handler_calls, status.released_on_shutdown), (0, 1), "{status:?}");
}
