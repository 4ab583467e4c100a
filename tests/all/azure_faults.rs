//! Issue 9, a faulty network: the listener (with the host's `Retrying` decorator) on an
//! Azurite queue behind the fault proxy, which answers 503 ServerBusy or drops the connection
//! for a seeded 20 % of requests. Nothing is lost, nothing is deleted before its handler
//! succeeded, and the queue ends empty.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ebb::handler::{Handler, IncomingMessage};
use ebb::listener::{Listener, QueueSettings};
use ebb::queue::azure::{AzureOptions, AzureQueue};
use ebb::queue::{QueueClient, RetryPolicy, Retrying};
use ebb::rules::{QueueRuleConfig, RuleEngine, RuleLimits, RuleSet};
use ebb_tests::azurite::{Azurite, unique_queue_name};
use ebb_tests::fault_proxy::FaultProxy;

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
        let body = String::from_utf8(message.body.clone())?;
        tokio::time::sleep(Duration::from_millis(2)).await;
        let number: u32 = body.trim_start_matches("m-").parse()?;
        if number % 10 == 0 && message.dequeue_count == 1 {
            *self.failures.lock().unwrap().entry(body.clone()).or_default() += 1;
            anyhow::bail!("the first try of {body} fails");
        }
        *self.successes.lock().unwrap().entry(body).or_default() += 1;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn behind_a_proxy_failing_a_fifth_of_requests_no_message_is_lost_or_deleted_before_success() {
    const MESSAGES: usize = 400;
    let azurite = Azurite::shared();
    let proxy = FaultProxy::start(azurite.port(), 0.2, 9).await;
    let name = unique_queue_name("faults");
    let direct = AzureQueue::new(&azurite.account(), &name, AzureOptions::default()).unwrap();
    direct.create_if_missing().await.unwrap();
    let poison_direct = AzureQueue::new(&azurite.account(), &format!("{name}-poison"), AzureOptions::default()).unwrap();
    poison_direct.create_if_missing().await.unwrap();
    let sent: Vec<String> = (0..MESSAGES).map(|i| format!("m-{i}")).collect();
    for chunk in sent.chunks(50) {
        futures::future::join_all(chunk.iter().map(|body| direct.put(body.as_bytes(), Duration::ZERO))).await.into_iter().for_each(|r| {
            r.unwrap();
        });
    }

    // The listener sees Azurite only through the proxy, with the host's retry decorator.
    let options = AzureOptions { request_timeout: Duration::from_secs(5), ..AzureOptions::default() };
    let policy = RetryPolicy { max_attempts: 5, base_delay: Duration::from_millis(20), max_delay: Duration::from_millis(500) };
    let through = |queue: &str| Arc::new(Retrying::new(AzureQueue::new(&proxy.account(), queue, options.clone()).unwrap(), policy.clone()));
    let queue = through(&name);
    let poison = through(&format!("{name}-poison"));
    let handler = Arc::new(Recording::default());
    let engine = RuleEngine::new(RuleLimits::default(), None).unwrap();
    let rules = RuleSet::new(engine, [QueueRuleConfig { queue: name.clone(), rule: None, params: vec![] }]);
    let settings = QueueSettings {
        min_tasks: 4,
        max_tasks: 8,
        lease_duration: Duration::from_secs(3),
        visibility_timeout: Duration::from_millis(200),
        max_retry_delay: Duration::from_millis(500),
        max_dequeue_count: 10,
        min_polling_interval: Duration::from_millis(50),
        max_polling_interval: Duration::from_millis(500),
        random_seed: Some(9),
        ..QueueSettings::default()
    };
    let listener = Listener::builder(queue.clone(), poison, handler.clone()).decider(Arc::new(rules.queue(&name).unwrap())).settings(settings).build();
    let started = Instant::now();
    listener.start();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let handled = handler.successes.lock().unwrap().len();
        // Counted directly (not through the proxy): the queue is empty when every message
        // was deleted, leased ones included.
        if handled == MESSAGES && direct.approximate_count().await.unwrap() == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{handled} of {MESSAGES} handled after 120 s; proxy: {:?}; {:?}", proxy.counts(), listener.status());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = started.elapsed();
    listener.shutdown(Duration::from_secs(5)).await;

    let successes = handler.successes.lock().unwrap().clone();
    assert_eq!(successes.keys().cloned().collect::<Vec<_>>().len(), MESSAGES);
    for body in &sent {
        assert!(successes.contains_key(body), "{body} lost");
    }
    // The first try of every tenth body fails (unless a get whose answer the proxy dropped
    // had already counted its first dequeue): each was still there for its retry, not
    // deleted before its handler succeeded, and none went to poison.
    let failures = handler.failures.lock().unwrap().clone();
    assert!(!failures.is_empty() && failures.len() <= MESSAGES / 10, "{failures:?}");
    assert!(failures.keys().all(|body| successes.contains_key(body)));
    assert_eq!(poison_direct.approximate_count().await.unwrap(), 0, "nothing poisoned");
    let counts = proxy.counts();
    let duplicates: u32 = successes.values().map(|n| n - 1).sum();
    assert!(counts.faults() > 0 && counts.server_busy > 0 && counts.dropped_before > 0 && counts.dropped_after > 0, "{counts:?}");
    let share = counts.faults() as f64 / (counts.faults() + counts.forwarded) as f64;
    assert!((0.1..0.3).contains(&share), "about a fifth of requests faulted: {counts:?}");
    eprintln!(
        "{MESSAGES} messages through the fault proxy in {took:?}: {counts:?} ({:.1} % faulted), retries {}, {duplicates} handled twice (a delete whose answer was lost)",
        share * 100.0,
        queue.retries()
    );
}
