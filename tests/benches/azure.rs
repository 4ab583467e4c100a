//! Azure Storage Queues figures on Azurite, printed as JSON:
//! `cargo bench -p ebb-tests --bench azure` (`EBB_BENCH_AZURE_MESSAGES`, default 1000;
//! `EBB_BENCH_AZURE_IDLE_SECS`, default 60).
//!
//! - throughput of the listener (no-op handler, 8 tasks) against a raw loop on the same
//!   client doing the same gets (32) and deletes at the same concurrency, same run;
//! - storage transactions per processed message at that load (the `Metered` counters);
//! - idle transactions on a real clock (min 100 ms, max 2 s polling) against what the
//!   default rule's back-off curve predicts for that window;
//! - two listeners ("hosts") against one on the same queue: throughput ratio, duplicates;
//! - throughput behind the fault proxy at 0 %, 10 % and 20 % faults.
//!
//! Azurite is a single Node.js process on this machine, not Azure: absolute figures say
//! little about Azure; the ratios (same emulator, same run) are the point.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ebb::handler::{Handler, IncomingMessage};
use ebb::listener::{Listener, QueueSettings};
use ebb::names::DecisionSite;
use ebb::queue::azure::{AzureAccount, AzureOptions, AzureQueue};
use ebb::queue::{Metered, QueueClient, RetryPolicy, Retrying, TransactionCounts};
use ebb::rules::{QueueRuleConfig, QueueRules, RuleEngine, RuleLimits, RuleSet};
use ebb_rules_sdk::IdleContext;
use ebb_tests::azurite::{Azurite, unique_queue_name};
use ebb_tests::fault_proxy::FaultProxy;
use serde_json::json;

const TASKS: u32 = 8;

/// Counts handles per body (the bodies are unique), so duplicates show.
#[derive(Default)]
struct Counting {
    seen: Mutex<HashMap<Vec<u8>, u32>>,
}

#[async_trait]
impl Handler for Counting {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        *self.seen.lock().unwrap().entry(message.body.to_vec()).or_default() += 1;
        Ok(())
    }
}

impl Counting {
    fn duplicates(&self) -> u32 {
        self.seen.lock().unwrap().values().map(|n| n - 1).sum()
    }
}

fn rules(queue: &str) -> QueueRules {
    let engine = RuleEngine::new(RuleLimits::default(), None).unwrap();
    let set = RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::new(queue).unwrap(), rule: None, params: vec![] }]);
    set.queue(queue).expect("the queue was configured")
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    let messages = env_number("EBB_BENCH_AZURE_MESSAGES", 1000) as usize;
    let idle_secs = env_number("EBB_BENCH_AZURE_IDLE_SECS", 60);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let azurite = Azurite::start();
    let account = azurite.account();
    let report = runtime.block_on(async {
        // Warm Azurite up (Node's JIT) first, then alternate listener and raw loop, twice,
        // so a drift of the machine hits both.
        eprintln!("warm-up");
        raw_loop(&account, messages).await;
        let mut listener_runs = Vec::new();
        let mut raw_runs = Vec::new();
        for run in 0..2 {
            eprintln!("listener and raw loop, run {run}");
            listener_runs.push(listener_throughput(&account, messages).await);
            raw_runs.push(raw_loop(&account, messages).await);
        }
        let best = |runs: &[f64]| runs.iter().cloned().fold(0.0, f64::max);
        let listener_best = best(&listener_runs.iter().map(|r| r.0).collect::<Vec<_>>());
        let raw_best = best(&raw_runs.iter().map(|r| r.0).collect::<Vec<_>>());
        let (_, tx_per_message, tx, _, _) = listener_runs.last().cloned().unwrap();
        eprintln!("two hosts vs one");
        let two_hosts = hosts(&account, messages).await;
        eprintln!("fault proxy");
        let faults = faulty(&azurite, messages / 3).await;
        eprintln!("idle window");
        let idle = idle_window(&account, Duration::from_secs(idle_secs)).await;
        json!({
            "messages": messages,
            "tasks": TASKS,
            "throughput": {
                "listener_msg_per_s": listener_runs.iter().map(|r| r.0.round()).collect::<Vec<_>>(),
                "raw_loop_msg_per_s": raw_runs.iter().map(|r| r.0.round()).collect::<Vec<_>>(),
                "raw_loop_failed_calls": raw_runs.iter().map(|r| r.1).collect::<Vec<_>>(),
                "listener_storage_errors": listener_runs.iter().map(|r| r.3).collect::<Vec<_>>(),
                "ratio_best_listener_to_best_raw": (listener_best / raw_best * 100.0).round() / 100.0,
            },
            "storage_tx_per_message": tx_per_message,
            "storage_tx_per_message_at_load": listener_runs.iter().map(|r| r.4).collect::<Vec<_>>(),
            "transactions": tx,
            "two_hosts_vs_one": two_hosts,
            "behind_fault_proxy": faults,
            "idle_window": idle,
        })
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}

async fn filled_queue(account: &AzureAccount, stem: &str, messages: usize) -> String {
    let name = unique_queue_name(stem);
    let queue = Arc::new(AzureQueue::new(account, &name, AzureOptions::default()).unwrap());
    queue.create_if_missing().await.unwrap();
    let poison = AzureQueue::new(account, &format!("{name}-poison"), AzureOptions::default()).unwrap();
    poison.create_if_missing().await.unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let putters = (0..32).map(|_| {
        let (queue, next) = (queue.clone(), next.clone());
        tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= messages {
                    return;
                }
                queue.put(format!("message-{i:08}").as_bytes(), Duration::ZERO).await.unwrap();
            }
        })
    });
    futures::future::join_all(putters).await;
    name
}

/// A queue as the host builds it: retries around metering around the client.
fn host_queue(account: &AzureAccount, name: &str) -> (Arc<dyn QueueClient>, Arc<ebb::queue::Transactions>) {
    let metered = Metered::new(AzureQueue::new(account, name, AzureOptions::default()).unwrap());
    let transactions = metered.transactions();
    (Arc::new(Retrying::new(metered, RetryPolicy::default())), transactions)
}

fn listener_on(account: &AzureAccount, name: &str, handler: Arc<dyn Handler>, settings: QueueSettings) -> (Listener, Arc<ebb::queue::Transactions>) {
    let (queue, transactions) = host_queue(account, name);
    let (poison, _) = host_queue(account, &format!("{name}-poison"));
    let listener = Listener::builder(queue, poison, handler).decider(Arc::new(rules(name))).settings(settings).transactions(transactions.clone()).build();
    (listener, transactions)
}

fn busy_settings() -> QueueSettings {
    QueueSettings { min_tasks: TASKS, max_tasks: TASKS, ..QueueSettings::default() }
}

/// Listener throughput (msg/s), transactions per message over the whole drain and at load
/// (from 10 % to 60 % processed: 8 tasks hold up to 8 × 32 messages, so past about 75 %
/// nothing is left to get and the tasks' empty gets begin, which are the drain's idle cost,
/// measured by the idle window), and the counts.
async fn listener_throughput(account: &AzureAccount, messages: usize) -> (f64, f64, TransactionCounts, u64, f64) {
    let name = filled_queue(account, "bench-listener", messages).await;
    let handler = Arc::new(Counting::default());
    let (listener, transactions) = listener_on(account, &name, handler, busy_settings());
    let consuming = |tx: &TransactionCounts| tx.gets_with_messages + tx.gets_empty + tx.deletes + tx.updates + tx.counts;
    let started = Instant::now();
    listener.start();
    let mut marks = [None, None];
    loop {
        let processed = listener.status().processed;
        for (mark, share) in marks.iter_mut().zip([0.1, 0.6]) {
            if mark.is_none() && processed as f64 >= messages as f64 * share {
                *mark = Some((processed, consuming(&transactions.snapshot())));
            }
        }
        if processed >= messages as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    let tx = transactions.snapshot();
    let storage_errors = listener.status().storage_errors;
    listener.shutdown(Duration::from_secs(5)).await;
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let [(p10, t10), (p60, t60)] = marks.map(Option::unwrap);
    let at_load = round((t60 - t10) as f64 / (p60 - p10).max(1) as f64);
    (messages as f64 / elapsed.as_secs_f64(), round(consuming(&tx) as f64 / messages as f64), tx, storage_errors, at_load)
}

/// The baseline: `TASKS` loops on the client (no listener, no metering; the same retry
/// decorator as the host, since Azurite refuses connections now and then at this
/// concurrency), each getting 32 and deleting them concurrently, until all are deleted.
/// Returns msg/s and the calls that failed even after retries.
async fn raw_loop(account: &AzureAccount, messages: usize) -> (f64, usize) {
    let name = filled_queue(account, "bench-raw", messages).await;
    let queue = Arc::new(Retrying::new(AzureQueue::new(account, &name, AzureOptions::default()).unwrap(), RetryPolicy::default()));
    let done = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers = (0..TASKS).map(|_| {
        let (queue, done, errors) = (queue.clone(), done.clone(), errors.clone());
        tokio::spawn(async move {
            while done.load(Ordering::Relaxed) < messages {
                let Ok(batch) = queue.get(32, Duration::from_secs(30)).await else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                let deletes = batch.iter().map(|m| queue.delete(&m.id, &m.pop_receipt));
                for result in futures::future::join_all(deletes).await {
                    match result {
                        Ok(()) => done.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }
        })
    });
    futures::future::join_all(workers).await;
    (messages as f64 / started.elapsed().as_secs_f64(), errors.load(Ordering::Relaxed))
}

/// One listener, then two ("hosts": separate clients, counters and tasks) on one queue.
async fn hosts(account: &AzureAccount, messages: usize) -> serde_json::Value {
    let mut results = Vec::new();
    for hosts in [1, 2] {
        let name = filled_queue(account, &format!("bench-hosts-{hosts}"), messages).await;
        let handler = Arc::new(Counting::default());
        let listeners: Vec<Listener> = (0..hosts).map(|_| listener_on(account, &name, handler.clone(), busy_settings()).0).collect();
        let started = Instant::now();
        listeners.iter().for_each(Listener::start);
        while handler.seen.lock().unwrap().len() < messages {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let elapsed = started.elapsed();
        for listener in &listeners {
            listener.shutdown(Duration::from_secs(5)).await;
        }
        let shares: Vec<u64> = listeners.iter().map(|l| l.status().processed).collect();
        results.push(json!({
            "hosts": hosts,
            "msg_per_s": (messages as f64 / elapsed.as_secs_f64()).round(),
            "duplicates": handler.duplicates(),
            "processed_per_host": shares,
        }));
    }
    let ratio = results[1]["msg_per_s"].as_f64().unwrap() / results[0]["msg_per_s"].as_f64().unwrap();
    json!({ "runs": results, "throughput_ratio_two_to_one": (ratio * 100.0).round() / 100.0 })
}

/// The listener behind the fault proxy at growing fault shares.
async fn faulty(azurite: &Azurite, messages: usize) -> serde_json::Value {
    let mut runs = Vec::new();
    for share in [0.0, 0.1, 0.2] {
        let proxy = FaultProxy::start(azurite.port(), share, 7).await;
        let name = filled_queue(&azurite.account(), "bench-faults", messages).await;
        let handler = Arc::new(Counting::default());
        let settings = QueueSettings { lease_duration: Duration::from_secs(5), ..busy_settings() };
        let (listener, _) = listener_on(&proxy.account(), &name, handler.clone(), settings);
        let started = Instant::now();
        listener.start();
        let mut to_90_percent = None;
        while handler.seen.lock().unwrap().len() < messages {
            if to_90_percent.is_none() && handler.seen.lock().unwrap().len() * 10 >= messages * 9 {
                to_90_percent = Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let elapsed = started.elapsed();
        listener.shutdown(Duration::from_secs(5)).await;
        let counts = proxy.counts();
        let to_90_percent = to_90_percent.unwrap_or(elapsed);
        runs.push(json!({
            "fault_share": share,
            "msg_per_s": (messages as f64 / elapsed.as_secs_f64()).round(),
            "msg_per_s_first_90_percent": (messages as f64 * 0.9 / to_90_percent.as_secs_f64()).round(),
            "last_10_percent_s": ((elapsed - to_90_percent).as_secs_f64() * 10.0).round() / 10.0,
            "duplicates": handler.duplicates(),
            "requests_faulted": counts.faults(),
            "get_answers_dropped": counts.dropped_get_answers,
            "requests_forwarded": counts.forwarded,
        }));
    }
    json!({ "messages": messages, "runs": runs })
}

/// An idle listener on an empty queue with the default rule, min 100 ms and max 2 s, for
/// `window` of real time: its storage transactions against the rule's back-off curve.
async fn idle_window(account: &AzureAccount, window: Duration) -> serde_json::Value {
    let name = filled_queue(account, "bench-idle", 0).await;
    let (min, max) = (Duration::from_millis(100), Duration::from_secs(2));
    let settings = QueueSettings { min_polling_interval: min, max_polling_interval: max, random_seed: Some(1), ..QueueSettings::default() };
    let (listener, transactions) = listener_on(account, &name, Arc::new(Counting::default()), settings);
    listener.start();
    let half = window / 2;
    tokio::time::sleep(half).await;
    let at_half = transactions.snapshot();
    tokio::time::sleep(window - half).await;
    let tx = transactions.snapshot();
    let peak_tasks = listener.status().peak_tasks;
    listener.shutdown(Duration::from_secs(1)).await;
    // The curve: every task backs off along the paper rule; all but one stop when they
    // reach the maximum interval; the last polls at the maximum until the window ends.
    let predict = |random: u64| {
        let (min_ms, max_ms, window_ms) = (min.as_millis() as u64, max.as_millis() as u64, window.as_millis() as u64);
        let decide = |idle_count: u32, active_tasks: u32| {
            ebb_rules_sdk::paper::on_queue_empty(&IdleContext {
                queue: name.clone(),
                idle_count,
                active_tasks,
                min_interval_ms: min_ms,
                max_interval_ms: max_ms,
                push_enabled: false,
                timestamp_ms: 0,
                random,
            })
        };
        let mut gets = 0u64;
        for task in (1..=peak_tasks).rev() {
            let (mut at, mut idle) = (0u64, 0u32);
            while at < window_ms {
                gets += 1;
                idle += 1;
                let decision = decide(idle, task);
                if decision.stop {
                    break;
                }
                at += decision.delay_ms;
            }
        }
        gets
    };
    let (low, mid, high) = (predict(u64::MAX), predict(1 << 63), predict(0));
    let second_half_gets = tx.gets_empty - at_half.gets_empty;
    json!({
        "window_s": window.as_secs(),
        "min_polling_ms": min.as_millis() as u64,
        "max_polling_ms": max.as_millis() as u64,
        "peak_tasks": peak_tasks,
        "storage_tx": tx.total(),
        "empty_gets": tx.gets_empty,
        "count_calls": tx.counts,
        "creates": tx.creates,
        "curve_predicted_gets": { "mean_jitter": mid, "range": [low, high] },
        "measured_over_predicted": (tx.gets_empty as f64 / mid as f64 * 1000.0).round() / 1000.0,
        "steady_empty_gets_per_hour_second_half": (second_half_gets as f64 * 3600.0 / (window - half).as_secs_f64()).round(),
        "steady_curve_per_hour": 3600 * 1000 / max.as_millis() as u64,
    })
}
