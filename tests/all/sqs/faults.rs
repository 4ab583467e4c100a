//! A faulty network in front of SQS (moto), as `azure_faults.rs` has in front of Azurite:
//! the listener, with the host's `Retrying` decorator, sees moto only through the fault
//! proxy, which answers 503, throttles (400 `RequestThrottled` or `ThrottlingException`) or
//! drops the connection (before or after forwarding) for a seeded share of requests. Nothing is lost, nothing is deleted before its handler
//! succeeded, and the queue ends empty.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ebb::listener::{Listener, QueueSettings};
use ebb::names::DecisionSite;
use ebb::queue::sqs::{SqsOptions, SqsQueue};
use ebb::queue::{FailureClass, QueueClient, RetryPolicy, Retrying};
use ebb::rules::{QueueRuleConfig, RuleEngine, RuleLimits, RuleSet};
use ebb_tests::azurite::unique_queue_name;
use ebb_tests::fault_proxy::{FaultMix, FaultProxy};
use ebb_tests::moto::Moto;

use crate::fault_runs::{self, Recording};

const MESSAGES: usize = 200;

/// What a run through the proxy left.
type Run = fault_runs::Run<SqsQueue>;

/// Puts [`MESSAGES`] directly, then runs a listener that sees moto only through `proxy`
/// until every message is handled and the queue is empty, and shuts it down.
async fn deliver_all_through(moto: &Moto, proxy: &FaultProxy, policy: RetryPolicy, seed: u64) -> anyhow::Result<Run> {
    let name = unique_queue_name("sqs-faults");
    let direct = SqsQueue::new(&moto.account(), &name, SqsOptions::default())?;
    direct.create_if_missing().await?;
    let poison_direct = SqsQueue::new(&moto.account(), &format!("{name}-poison"), SqsOptions::default())?;
    poison_direct.create_if_missing().await?;
    let sent: Vec<String> = (0..MESSAGES).map(|i| format!("m-{i}")).collect();
    for body in &sent {
        direct.put(body.as_bytes(), Duration::ZERO).await?;
    }

    let through = Moto::account_at(&format!("http://127.0.0.1:{}", proxy.port()));
    let queue = Arc::new(Retrying::new(SqsQueue::new(&through, &name, SqsOptions::default())?, policy.clone()));
    let poison = Arc::new(Retrying::new(SqsQueue::new(&through, &format!("{name}-poison"), SqsOptions::default())?, policy));
    let handler = Arc::new(Recording::default());
    let engine = RuleEngine::new(RuleLimits::default(), None)?;
    let rules = RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::new(&name)?, rule: None, params: vec![] }]);
    let settings = QueueSettings {
        batch_size: 10, // SQS's most per receive
        min_tasks: 4,
        max_tasks: 8,
        lease_duration: Duration::from_secs(3),
        // SQS counts visibility in whole seconds.
        visibility_timeout: Duration::from_secs(1),
        max_retry_delay: Duration::from_secs(1),
        max_dequeue_count: 10,
        min_polling_interval: Duration::from_millis(50),
        max_polling_interval: Duration::from_millis(500),
        random_seed: Some(seed),
        ..QueueSettings::default()
    };
    let decider = Arc::new(rules.queue(&name).expect("the queue has a rule slot"));
    let listener = Listener::builder(queue.clone(), poison.clone(), handler.clone()).decider(decider).settings(settings).build();
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
    let took = started.elapsed();
    listener.shutdown(Duration::from_secs(5)).await;
    Ok(Run { sent, handler, queue, poison, poison_direct, took })
}

/// No message lost, none poisoned, every failed first try retried to success.
async fn assert_nothing_lost(run: &Run) -> anyhow::Result<()> {
    let successes = run.handler.successes.lock().unwrap().clone();
    assert!(run.sent.iter().all(|body| successes.contains_key(body)), "every message handled");
    let failures = run.handler.failures.lock().unwrap().clone();
    assert!(!failures.is_empty() && failures.keys().all(|body| successes.contains_key(body)), "each failed first try was retried: {failures:?}");
    assert_eq!(run.poison_direct.approximate_count().await?, 0, "nothing poisoned");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn behind_a_proxy_failing_a_fifth_of_requests_no_sqs_message_is_lost_or_deleted_before_success() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let proxy = FaultProxy::start(moto.port(), 0.2, 37).await;
    let policy = RetryPolicy { max_attempts: 5, base_delay: Duration::from_millis(20), max_delay: Duration::from_millis(500) };
    let run = deliver_all_through(moto, &proxy, policy, 37).await?;
    assert_nothing_lost(&run).await?;
    let counts = proxy.counts();
    assert!(counts.server_busy > 0 && counts.dropped_before > 0 && counts.dropped_after > 0, "{counts:?}");
    let duplicates: u32 = run.handler.successes.lock().unwrap().values().map(|n| n - 1).sum();
    eprintln!("{MESSAGES} SQS messages through the fault proxy in {:?}: {counts:?}, retries {}, {duplicates} handled twice", run.took, run.queue.retries());
    Ok(())
}

/// As on Azure (issue 25): the failed calls the host counts are exactly the requests the
/// proxy refused or dropped, by class: SQS's 503 is throttling, a dropped connection (before
/// or after forwarding) a connection failure, whatever the AWS SDK made of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sqs_failures_the_host_counts_are_the_ones_the_proxy_made() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let mix = FaultMix { server_busy: 0.20, drop_before: 0.025, drop_after: 0.025 };
    let proxy = FaultProxy::start_with_mix(moto.port(), mix, 38).await;
    // Enough attempts that no call runs out of them: every failure is one proxy fault.
    let policy = RetryPolicy { max_attempts: 10, base_delay: Duration::from_millis(20), max_delay: Duration::from_millis(200) };
    let run = deliver_all_through(moto, &proxy, policy, 38).await?;
    assert_nothing_lost(&run).await?;
    let counts = proxy.counts();
    let (queue, poison) = (run.queue.call_record().snapshot(), run.poison.call_record().snapshot());
    let counted = |class: FailureClass| -> u64 { [&queue, &poison].iter().flat_map(|s| &s.failures).filter(|f| f.class == class).map(|f| f.count).sum() };
    eprintln!("proxy {counts:?}; host: queue {queue:?}, poison {poison:?}");
    assert!(counts.server_busy > 20 && counts.dropped_before + counts.dropped_after > 0, "{counts:?}");
    assert_eq!(queue.failed_attempts() + poison.failed_attempts(), counts.faults(), "every refused or dropped request, and nothing else, is a failure");
    assert_eq!(counted(FailureClass::Throttled), counts.server_busy, "SQS's 503 is throttling");
    assert_eq!(counted(FailureClass::Connection), counts.dropped_before + counts.dropped_after, "a dropped connection is a connection failure");
    assert!(queue.gave_up.is_empty() && poison.gave_up.is_empty(), "{queue:?}");
    Ok(())
}

/// Issue 37, bad input: SQS throttles with 400 `RequestThrottled` or `ThrottlingException`
/// (the proxy answers a quarter of requests so, in the JSON protocol's exact shape, and 5 %
/// with 503). Each throttled call is retried after the policy's jittered back-off (the first
/// retry of a call 0.5 to 1.5 times the base delay after it, spread, not one fixed delay),
/// counted as throttling, none given up; nothing lost, and the queue ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn throttled_sqs_calls_are_retried_with_jitter_counted_as_throttling_and_nothing_is_lost() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let mix = FaultMix { server_busy: 0.05, drop_before: 0.0, drop_after: 0.0 };
    let proxy = FaultProxy::start_with_mix(moto.port(), mix, 39).await;
    proxy.set_throttling(0.25);
    let base = Duration::from_millis(100);
    let policy = RetryPolicy { max_attempts: 10, base_delay: base, max_delay: Duration::from_secs(1) };
    let run = deliver_all_through(moto, &proxy, policy, 39).await?;
    assert_nothing_lost(&run).await?;

    let counts = proxy.counts();
    let (queue, poison) = (run.queue.call_record().snapshot(), run.poison.call_record().snapshot());
    eprintln!("proxy {counts:?}; host: queue {queue:?}, poison {poison:?}");
    assert!(counts.throttled > 20 && counts.server_busy > 0, "{counts:?}");
    let counted = |class: FailureClass| -> u64 { [&queue, &poison].iter().flat_map(|s| &s.failures).filter(|f| f.class == class).map(|f| f.count).sum() };
    assert_eq!(counted(FailureClass::Throttled), counts.throttled + counts.server_busy, "a throttled call is counted as throttling");
    assert_eq!(queue.failed_attempts() + poison.failed_attempts(), counts.faults(), "each throttled request is one failed attempt");
    assert_eq!(queue.total_retries() + poison.total_retries(), counts.faults(), "each failed attempt is retried");
    assert!(queue.gave_up.is_empty() && poison.gave_up.is_empty(), "no call given up: {queue:?}");

    let gaps = first_retry_gaps(&proxy.sqs_arrivals());
    eprintln!("first retries after a throttled call, ms: {:?}", gaps.iter().map(Duration::as_millis).collect::<Vec<_>>());
    assert!(gaps.len() >= 5, "throttled calls of their own body: {gaps:?}");
    let (least, most) = (*gaps.iter().min().unwrap(), *gaps.iter().max().unwrap());
    assert!(least >= base / 2, "no retry before half the base delay: {least:?}");
    assert!(most - least >= base * 3 / 10, "the retries' delays are spread by jitter: {least:?} to {most:?}");
    Ok(())
}

/// For each throttled first attempt of a call whose body no other call sends (a delete or
/// visibility change names its receipt handles; a receive's body is every task's), the time
/// to the same request again: its first retry.
fn first_retry_gaps(arrivals: &[ebb_tests::fault_proxy::SqsArrival]) -> Vec<Duration> {
    let own_body = |operation: &str| operation != "ReceiveMessage" && operation != "GetQueueAttributes";
    let mut gaps = Vec::new();
    for (i, arrival) in arrivals.iter().enumerate() {
        let same = |other: &&ebb_tests::fault_proxy::SqsArrival| other.operation == arrival.operation && other.body == arrival.body;
        let first_attempt = !arrivals[..i].iter().any(|earlier| same(&earlier));
        if arrival.throttled
            && own_body(&arrival.operation)
            && first_attempt
            && let Some(retry) = arrivals[i + 1..].iter().find(same)
        {
            gaps.push(retry.at - arrival.at);
        }
    }
    gaps
}
