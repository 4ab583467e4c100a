//! Retry and poison decided by a rule (contract 0.4.0's optional `failures` interface), under
//! tokio's paused clock on the in-memory backend (the embedded queue's semantics; the embedded
//! store's own I/O threads let the paused clock run ahead of it, so the listener's timing
//! tests use the memory queue, as `listener` does): a rule that poisons at once, one that
//! retries after its own delay, one without the interface, and one that faults.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ebb::handler::{Handler, HandlerStatus, IncomingMessage};
use ebb::listener::{Listener, QueueSettings};
use ebb::names::DecisionSite;
use ebb::queue::memory::MemoryQueue;
use ebb::queue::{QueueClient, TokioClock};
use ebb::rules::{ErrorClass, FailureContext, FailureDecision, QueueRuleConfig, RuleEngine, RuleLimits, RuleSet};
use ebb_tests::guests;
use tokio::time::{Instant, sleep};

const QUEUE: &str = "work";

/// Fails a body "status N" as an app answering HTTP N would, "fail" with an error of its own,
/// and handles anything else; notes when each body was delivered.
#[derive(Default)]
struct FailingApp {
    calls: Mutex<BTreeMap<String, Vec<Instant>>>,
}

impl FailingApp {
    fn calls(&self, body: &str) -> Vec<Instant> {
        self.calls.lock().unwrap().get(body).cloned().unwrap_or_default()
    }
}

#[async_trait]
impl Handler for FailingApp {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        let body = String::from_utf8_lossy(&message.body).into_owned();
        self.calls.lock().unwrap().entry(body.clone()).or_default().push(Instant::now());
        if let Some(status) = body.strip_prefix("status ") {
            let status: u16 = status.parse()?;
            return Err(HandlerStatus { status, detail: format!("handler answered {status}") }.into());
        }
        if body.starts_with("fail") {
            anyhow::bail!("boom on try {}", message.dequeue_count);
        }
        Ok(())
    }
}

struct Fixture {
    queue: Arc<dyn QueueClient>,
    poison: Arc<dyn QueueClient>,
    app: Arc<FailingApp>,
    rules: Arc<RuleSet>,
    listener: Listener,
}

async fn fixture(settings: QueueSettings, rule: Option<&str>, params: &[(&str, &str)]) -> Fixture {
    let clock = Arc::new(TokioClock::new());
    let queue: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new(QUEUE, clock.clone(), 65536));
    let poison: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new("work-poison", clock, 65536));
    let engine = RuleEngine::new(RuleLimits::default(), None).unwrap();
    let params = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let rules = Arc::new(RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::new(QUEUE).unwrap(), rule: rule.map(PathBuf::from), params }]));
    assert!(rules.load_all().is_empty());
    let app = Arc::new(FailingApp::default());
    let settings = QueueSettings {
        random_seed: Some(7),
        min_polling_interval: Duration::from_millis(10),
        max_polling_interval: Duration::from_millis(100),
        visibility_timeout: Duration::from_secs(2),
        ..settings
    };
    let listener = Listener::builder(queue.clone(), poison.clone(), app.clone()).decider(Arc::new(rules.queue(QUEUE).unwrap())).settings(settings).build();
    Fixture { queue, poison, app, rules, listener }
}

async fn poisoned(poison: &dyn QueueClient) -> Vec<serde_json::Value> {
    poison.get(32, Duration::from_secs(30)).await.unwrap().iter().map(|m| serde_json::from_slice(&m.body).unwrap()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_rule_that_poisons_http_422_poisons_at_the_first_failure_with_its_reason() {
    let f = fixture(QueueSettings { max_dequeue_count: 5, ..Default::default() }, Some(guests::RETRY_POLICY), &[]).await;
    assert!(f.rules.queue(QUEUE).unwrap().rule_decides_failures());
    f.listener.start();
    f.queue.put(b"status 422", Duration::ZERO).await.unwrap();
    f.queue.put(b"status 500", Duration::ZERO).await.unwrap();
    sleep(Duration::from_millis(500)).await;
    assert_eq!(f.app.calls("status 422").len(), 1, "delivered once, never retried");
    let poisoned = poisoned(&*f.poison).await;
    assert_eq!(poisoned.len(), 1, "{poisoned:?}");
    assert_eq!(poisoned[0]["body"], "status 422");
    assert_eq!(poisoned[0]["dequeue_count"], 1);
    let error = poisoned[0]["error"].as_str().unwrap();
    assert!(error.contains("retry-policy: HTTP 422 is not retried") && error.contains("handler answered 422"), "{error}");
    // A 500 is retried by the same rule: still in the queue, not poisoned.
    assert_eq!(f.app.calls("status 500").len(), 1);
    assert_eq!(f.queue.approximate_count().await.unwrap(), 1);
    let status = f.listener.status();
    assert_eq!((status.failure_rule_poisons, status.failure_rule_retries, status.poisoned), (1, 1, 1), "{status:?}");
    f.listener.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn a_rule_that_retries_after_a_delay_hides_the_message_for_that_delay() {
    let f =
        fixture(QueueSettings { max_dequeue_count: 3, ..Default::default() }, Some(guests::FAILURE_PROBE), &[("mode", "retry"), ("delay_ms", "45000")]).await;
    f.listener.start();
    f.queue.put(b"fail", Duration::ZERO).await.unwrap();
    sleep(Duration::from_secs(1)).await;
    assert_eq!(f.app.calls("fail").len(), 1);
    // Hidden for the rule's 45 s, not the queue's 2 s: nothing to get before then.
    assert!(f.queue.get(1, Duration::from_secs(1)).await.unwrap().is_empty(), "the message is hidden");
    sleep(Duration::from_secs(43)).await;
    assert_eq!(f.app.calls("fail").len(), 1, "not delivered again before 45 s");
    sleep(Duration::from_secs(2)).await;
    let calls = f.app.calls("fail");
    assert_eq!(calls.len(), 2, "delivered again after 45 s");
    let waited = calls[1] - calls[0];
    assert!(waited >= Duration::from_secs(45) && waited < Duration::from_millis(45_300), "{waited:?}");
    // The rule retries past max_dequeue_count (3): the rule owns the policy.
    sleep(Duration::from_secs(45 * 3)).await;
    assert!(f.app.calls("fail").len() >= 4, "{}", f.app.calls("fail").len());
    assert!(poisoned(&*f.poison).await.is_empty());
    let status = f.listener.status();
    assert!(status.failure_rule_retries >= 4 && status.poisoned == 0, "{status:?}");
    f.listener.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn a_retry_delay_over_max_retry_delay_is_clamped_to_it_and_counted() {
    let settings = QueueSettings { max_dequeue_count: 3, max_retry_delay: Duration::from_secs(60), ..Default::default() };
    let f = fixture(settings, Some(guests::FAILURE_PROBE), &[("mode", "retry"), ("delay_ms", "999999999999")]).await;
    f.listener.start();
    f.queue.put(b"fail", Duration::ZERO).await.unwrap();
    sleep(Duration::from_secs(61)).await;
    let calls = f.app.calls("fail");
    assert_eq!(calls.len(), 2, "delivered again after max_retry_delay");
    let waited = calls[1] - calls[0];
    assert!(waited >= Duration::from_secs(60) && waited < Duration::from_millis(60_300), "{waited:?}");
    assert!(f.rules.queue(QUEUE).unwrap().status().clamps >= 1);
    f.listener.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn a_rule_without_the_failures_interface_keeps_max_dequeue_count() {
    let f = fixture(QueueSettings { max_dequeue_count: 3, ..Default::default() }, Some(guests::PAPER_DEFAULT), &[]).await;
    let rules = f.rules.queue(QUEUE).unwrap();
    assert!(!rules.rule_decides_failures());
    assert_eq!(rules.decide_failure(&FailureContext { http_status: Some(422), ..Default::default() }), None, "nothing is asked");
    f.listener.start();
    f.queue.put(b"status 422", Duration::ZERO).await.unwrap();
    sleep(Duration::from_secs(30)).await;
    let calls = f.app.calls("status 422");
    let waits: Vec<u64> = calls.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
    assert_eq!(waits, [2, 4], "the doubling delay from visibility_timeout, then poisoned at the third");
    let poisoned = poisoned(&*f.poison).await;
    assert_eq!((poisoned.len(), &poisoned[0]["dequeue_count"]), (1, &serde_json::json!(3)));
    assert!(!poisoned[0]["error"].as_str().unwrap().contains("rule"), "{}", poisoned[0]["error"]);
    let status = f.listener.status();
    assert_eq!((status.failure_rule_retries, status.failure_rule_poisons, status.failure_rule_defaults), (0, 0, 0), "{status:?}");
    f.listener.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn a_trapping_or_looping_failures_rule_falls_back_to_max_dequeue_count_and_processing_continues() {
    for mode in ["trap", "loop"] {
        let f = fixture(QueueSettings { max_dequeue_count: 2, ..Default::default() }, Some(guests::FAILURE_PROBE), &[("mode", mode)]).await;
        f.listener.start();
        f.queue.put(b"fail", Duration::ZERO).await.unwrap();
        f.queue.put(b"ok", Duration::ZERO).await.unwrap();
        sleep(Duration::from_secs(30)).await;
        assert_eq!(f.app.calls("fail").len(), 2, "{mode}: retried by default, then poisoned");
        assert_eq!(f.app.calls("ok").len(), 1, "{mode}");
        let poisoned = poisoned(&*f.poison).await;
        assert_eq!(poisoned.len(), 1, "{mode}");
        assert!(poisoned[0]["error"].as_str().unwrap().contains("boom on try 2"), "{mode}: {}", poisoned[0]["error"]);
        let status = f.listener.status();
        assert_eq!((status.processed, status.poisoned, status.failure_rule_defaults), (1, 1, 2), "{mode}: {status:?}");
        let rule = f.rules.queue(QUEUE).unwrap().status();
        // The second failure may come while the instance is being rebuilt (then the built-in
        // handling decides it without a call): at least the first fault is counted.
        assert!((1..=2).contains(&rule.faults), "{mode}: {rule:?}");
        assert!(rule.last_error.as_deref().unwrap_or_default().contains(if mode == "trap" { "probe traps" } else { "ran" }), "{mode}: {:?}", rule.last_error);
        f.listener.shutdown(Duration::from_secs(1)).await;
    }
}

/// The listener settings of the envelope tests: quick polls, five deliveries before poison.
fn envelope_settings() -> QueueSettings {
    QueueSettings {
        max_dequeue_count: 5,
        visibility_timeout: Duration::from_secs(30),
        min_polling_interval: Duration::from_millis(10),
        max_polling_interval: Duration::from_millis(100),
        random_seed: Some(7),
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn an_envelopes_failed_items_are_each_decided_by_the_rule() {
    use ebb::payload::{Codec, Delivery, Item, Packer, PayloadSettings};
    let clock = Arc::new(TokioClock::new());
    let queue: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new(QUEUE, clock.clone(), 65536));
    let poison: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new("work-poison", clock, 65536));
    let engine = RuleEngine::new(RuleLimits::default(), None).unwrap();
    let rules = RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::new(QUEUE).unwrap(), rule: Some(guests::RETRY_POLICY.into()), params: vec![] }]);
    assert!(rules.load_all().is_empty());
    let app = Arc::new(FailingApp::default());
    let settings = envelope_settings();
    let payload = PayloadSettings { delivery: Delivery::Item, max_batch_items: 32, max_envelope_bytes: 65536, ..PayloadSettings::default() };
    let listener = Listener::builder(queue.clone(), poison.clone(), app.clone())
        .decider(Arc::new(rules.queue(QUEUE).unwrap()))
        .settings(settings)
        .payload(payload, false)
        .build();
    let items: Vec<Item> = ["status 422", "fail", "ok"].iter().map(|b| Item::inline(b.to_string())).collect();
    let packed = Packer::new(Codec::Zstd, 65536).unwrap().pack(&items).unwrap();
    listener.start();
    queue.put(&packed.envelopes[0].bytes, Duration::ZERO).await.unwrap();
    sleep(Duration::from_secs(5)).await;
    // The 422 item is poisoned alone at its first failure, with the rule's reason and its index.
    let poisoned = poisoned(&*poison).await;
    assert_eq!(poisoned.len(), 1, "{poisoned:?}");
    assert_eq!((&poisoned[0]["body"], &poisoned[0]["item"]), (&serde_json::json!("status 422"), &serde_json::json!(0)));
    assert!(poisoned[0]["error"].as_str().unwrap().contains("retry-policy: HTTP 422 is not retried"), "{}", poisoned[0]["error"]);
    // The failing item is put back after the rule's delay (1 s, ±10 %), not the queue's 30 s.
    let calls = app.calls("fail");
    assert!(calls.len() >= 2, "{calls:?}");
    let waited = calls[1] - calls[0];
    assert!(waited >= Duration::from_millis(900) && waited <= Duration::from_millis(1_200), "{waited:?}");
    assert_eq!((app.calls("ok").len(), app.calls("status 422").len()), (1, 1));
    listener.shutdown(Duration::from_secs(1)).await;
}

/// Issue 22, defect 1: a failures rule that faulted on one item of an envelope left the
/// envelope's other failed items to the default (its instance was being rebuilt). Each of
/// them is now asked of the rebuilt instance: only the item it faulted on takes the default.
#[tokio::test(start_paused = true)]
async fn a_failures_rule_that_faults_on_one_item_still_decides_the_envelopes_other_items() {
    use ebb::payload::{Codec, Delivery, Item, Packer, PayloadSettings};
    for delivery in [Delivery::Item, Delivery::Batch] {
        let clock = Arc::new(TokioClock::new());
        let queue: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new(QUEUE, clock.clone(), 65536));
        let poison: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new("work-poison", clock, 65536));
        let engine = RuleEngine::new(RuleLimits::default(), None).unwrap();
        let params = [("mode", "poison"), ("trap_item", "1")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let rules = RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::new(QUEUE).unwrap(), rule: Some(guests::FAILURE_PROBE.into()), params }]);
        assert!(rules.load_all().is_empty());
        let app = Arc::new(FailingApp::default());
        let settings = envelope_settings();
        let payload = PayloadSettings { delivery, max_batch_items: 32, max_envelope_bytes: 65536, ..PayloadSettings::default() };
        let listener = Listener::builder(queue.clone(), poison.clone(), app.clone())
            .decider(Arc::new(rules.queue(QUEUE).unwrap()))
            .settings(settings)
            .payload(payload, false)
            .build();
        let bodies = ["fail 0", "fail 1", "fail 2", "fail 3", "fail 4", "fail 5"];
        let items: Vec<Item> = bodies.iter().map(|b| Item::inline(b.to_string())).collect();
        let packed = Packer::new(Codec::Zstd, 65536).unwrap().pack(&items).unwrap();
        listener.start();
        queue.put(&packed.envelopes[0].bytes, Duration::ZERO).await.unwrap();
        sleep(Duration::from_secs(5)).await;
        // The rule poisons every failed item but the one it faults on, which the default retries.
        let mut poisoned: Vec<u64> = poisoned(&*poison).await.iter().map(|p| p["item"].as_u64().unwrap()).collect();
        poisoned.sort();
        assert_eq!(poisoned, [0, 2, 3, 4, 5], "{delivery:?}");
        let status = listener.status();
        assert_eq!((status.failure_rule_poisons, status.failure_rule_defaults), (5, 1), "{delivery:?}: {status:?}");
        let rule = rules.queue(QUEUE).unwrap().status();
        assert_eq!(rule.faults, 1, "{delivery:?}: {rule:?}");
        assert!(rule.last_error.as_deref().unwrap_or_default().contains("probe traps on item 1"), "{delivery:?}: {:?}", rule.last_error);
        listener.shutdown(Duration::from_secs(1)).await;
    }
}

#[test]
fn the_python_retry_example_loads_and_decides() -> anyhow::Result<()> {
    let engine = RuleEngine::new(RuleLimits::default(), None)?;
    let rule = engine.load_file(std::path::Path::new(guests::PYTHON_RETRY))?;
    assert!(rule.decides_failures, "exports {:?}", rule.exports);
    assert_eq!(rule.contract.as_str(), "0.4.0");
    let mut instance = engine.instantiate(&rule, &[("base_retry_ms".into(), "500".into())])?;
    let ctx = |class, status, attempt| FailureContext {
        queue: QUEUE.into(),
        error_class: class,
        http_status: status,
        dequeue_count: attempt,
        max_dequeue_count: 5,
        max_retry_delay_ms: 600_000,
        random: u64::MAX / 2,
        ..Default::default()
    };
    let decided = instance.on_handler_failure(&ctx(ErrorClass::HttpStatus, Some(422), 1))?;
    assert_eq!(decided, Some(FailureDecision::Poison("python-retry: HTTP 422 is not retried".into())));
    assert_eq!(instance.on_handler_failure(&ctx(ErrorClass::HttpStatus, Some(500), 3))?, Some(FailureDecision::Retry(2_000)));
    assert_eq!(instance.on_handler_failure(&ctx(ErrorClass::Timeout, None, 1))?, Some(FailureDecision::Retry(10_000)));
    assert_eq!(instance.on_handler_failure(&ctx(ErrorClass::Other, None, 5))?, Some(FailureDecision::Default));
    Ok(())
}

#[test]
fn rule_check_says_whether_a_rule_decides_failures() {
    for (rule, expected) in [
        (guests::RETRY_POLICY, "failures:     decided by the rule (it exports ebb:rules/failures@0.4.0"),
        (guests::PAPER_DEFAULT, "failures:     not decided by the rule"),
    ] {
        let output = std::process::Command::new(crate::binary::EBB).args(["rule", "check", rule]).output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert!(stdout.contains(expected), "{stdout}");
    }
}
