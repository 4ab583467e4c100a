//! A faulty network in front of SQS (moto), as `azure_faults.rs` has in front of Azurite:
//! the listener, with the host's `Retrying` decorator, sees moto only through the fault
//! proxy, which answers 503 or drops the connection (before or after forwarding) for a
//! seeded share of requests. Nothing is lost, nothing is deleted before its handler
//! succeeded, and the queue ends empty.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ebb::handler::{Handler, IncomingMessage};
use ebb::listener::{Listener, QueueSettings};
use ebb::names::RuleSlot;
use ebb::queue::sqs::{MAX_GET, SqsOptions, SqsQueue};
use ebb::queue::{QueueClient, RetryPolicy, Retrying};
use ebb::rules::{QueueRuleConfig, RuleEngine, RuleLimits, RuleSet};
use ebb_tests::azurite::unique_queue_name;
use ebb_tests::fault_proxy::FaultProxy;
use ebb_tests::moto::Moto;

/// Records successes per body; the first try of every tenth body fails, so a host that
/// deleted before the handler succeeded would lose those bodies for good.
#[derive(Default)]
struct Recording {
    successes: Mutex<BTreeMap<String, u32>>,
    failures: Mutex<BTreeMap<String, u32>>,
}

#[async_trait]
impl Handler for Recording {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        let body = String::from_utf8(message.body.to_vec())?;
        tokio::time::sleep(Duration::from_millis(2)).await;
        let number: u32 = body.trim_start_matches("m-").parse()?;
        if number.is_multiple_of(10) && message.dequeue_count == 1 {
            *self.failures.lock().unwrap().entry(body.clone()).or_default() += 1;
            anyhow::bail!("the first try of {body} fails");
        }
        *self.successes.lock().unwrap().entry(body).or_default() += 1;
        Ok(())
    }
}

const MESSAGES: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn behind_a_proxy_failing_a_fifth_of_requests_no_sqs_message_is_lost_or_deleted_before_success() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let name = unique_queue_name("sqs-faults");
    let direct = SqsQueue::new(&moto.account(), &name, SqsOptions::default())?;
    direct.create_if_missing().await?;
    let poison_direct = SqsQueue::new(&moto.account(), &format!("{name}-poison"), SqsOptions::default())?;
    poison_direct.create_if_missing().await?;
    let sent: Vec<String> = (0..MESSAGES).map(|i| format!("m-{i}")).collect();
    for body in &sent {
        direct.put(body.as_bytes(), Duration::ZERO).await?;
    }

    let proxy = FaultProxy::start(moto.port(), 0.2, 37).await;
    let through = Moto::account_at(&format!("http://127.0.0.1:{}", proxy.port()));
    let policy = RetryPolicy { max_attempts: 5, base_delay: Duration::from_millis(20), max_delay: Duration::from_millis(500) };
    let queue = Arc::new(Retrying::new(SqsQueue::new(&through, &name, SqsOptions::default())?, policy.clone()));
    let poison = Arc::new(Retrying::new(SqsQueue::new(&through, &format!("{name}-poison"), SqsOptions::default())?, policy));
    let handler = Arc::new(Recording::default());
    let engine = RuleEngine::new(RuleLimits::default(), None)?;
    let rules = RuleSet::new(engine, [QueueRuleConfig { slot: RuleSlot::new(&name)?, rule: None, params: vec![] }]);
    let settings = QueueSettings {
        batch_size: MAX_GET,
        min_tasks: 4,
        max_tasks: 8,
        lease_duration: Duration::from_secs(3),
        // SQS counts visibility in whole seconds.
        visibility_timeout: Duration::from_secs(1),
        max_retry_delay: Duration::from_secs(1),
        max_dequeue_count: 10,
        min_polling_interval: Duration::from_millis(50),
        max_polling_interval: Duration::from_millis(500),
        random_seed: Some(37),
        ..QueueSettings::default()
    };
    let listener = Listener::builder(queue.clone(), poison.clone(), handler.clone())
        .decider(Arc::new(rules.queue(&name).expect("the queue has a rule slot")))
        .settings(settings)
        .build();
    let started = Instant::now();
    listener.start();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let handled = handler.successes.lock().unwrap().len();
        // Counted directly (not through the proxy): the queue is empty when every message
        // was deleted, leased ones included.
        if handled == MESSAGES && direct.approximate_count().await? == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{handled} of {MESSAGES} handled after 180 s; proxy: {:?}", proxy.counts());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    listener.shutdown(Duration::from_secs(5)).await;

    let successes = handler.successes.lock().unwrap().clone();
    assert!(sent.iter().all(|body| successes.contains_key(body)), "every message handled");
    let failures = handler.failures.lock().unwrap().clone();
    assert!(!failures.is_empty() && failures.keys().all(|body| successes.contains_key(body)), "each failed first try was retried: {failures:?}");
    assert_eq!(poison_direct.approximate_count().await?, 0, "nothing poisoned");
    let counts = proxy.counts();
    assert!(counts.server_busy > 0 && counts.dropped_before > 0 && counts.dropped_after > 0, "{counts:?}");
    let duplicates: u32 = successes.values().map(|n| n - 1).sum();
    eprintln!(
        "{MESSAGES} SQS messages through the fault proxy in {:?}: {counts:?}, retries {}, {duplicates} handled twice",
        started.elapsed(),
        queue.retries()
    );
    Ok(())
}
