//! Listener figures, printed as JSON: `cargo bench -p ebb-tests --bench listener`.
//!
//! - end-to-end throughput on the embedded queue with a no-op handler, against the raw redb
//!   loop (get 32 + delete, durable) in the same run;
//! - storage transactions per processed message at that load;
//! - storage transactions in one idle hour with the default (paper) rule, simulated on the
//!   real listener under tokio's paused clock, against polling once a second;
//! - burst reaction: 10,000 messages land (posted, so the host is notified) → the rule's
//!   task count running.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ebb::handler::{Handler, IncomingMessage};
use ebb::listener::{Listener, QueueSettings};
use ebb::names::DecisionSite;
use ebb::queue::embedded::{EmbeddedOptions, EmbeddedStore};
use ebb::queue::memory::MemoryQueue;
use ebb::queue::{Metered, QueueClient, TokioClock};
use ebb::rules::{QueueRuleConfig, QueueRules, RuleEngine, RuleLimits, RuleSet};
use ebb_tests::baselines::{BODY, raw_redb_processing};
use serde_json::json;

const MESSAGES: usize = 50_000;

struct Noop;

#[async_trait]
impl Handler for Noop {
    async fn handle(&self, _: &IncomingMessage) -> anyhow::Result<()> {
        Ok(())
    }
}

fn rules(queue: &str) -> QueueRules {
    let engine = RuleEngine::new(RuleLimits::default(), None).unwrap();
    let set = RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::new(queue).unwrap(), rule: None, params: vec![] }]);
    set.queue(queue).expect("the queue was configured")
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let mut throughput = json!({});
    for max_tasks in [4, 16, 32] {
        throughput[format!("max_tasks_{max_tasks}")] = runtime.block_on(end_to_end(max_tasks));
    }
    let raw = raw_redb_processing(MESSAGES, MESSAGES);
    let burst = runtime.block_on(burst_reaction());
    let idle = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap().block_on(idle_hour());
    let report = json!({
        "end_to_end_noop_handler": throughput,
        "raw_redb_get32_delete_msg_per_s": raw.round(),
        "idle_hour": idle,
        "burst_reaction": burst,
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}

async fn end_to_end(max_tasks: u32) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
    let filler = Arc::new(store.queue("bench"));
    filler.create_if_missing().await.unwrap();
    for chunk in (0..MESSAGES).collect::<Vec<_>>().chunks(20_000) {
        let puts = chunk.iter().map(|_| {
            let q = filler.clone();
            tokio::spawn(async move { q.put(&BODY, Duration::ZERO).await.unwrap() })
        });
        futures::future::join_all(puts).await;
    }
    let metered = Metered::new(store.queue("bench"));
    let transactions = metered.transactions();
    let poison = Arc::new(store.queue("bench-poison"));
    poison.create_if_missing().await.unwrap();
    let settings = QueueSettings { max_tasks, min_tasks: max_tasks, ..Default::default() };
    let listener = Listener::builder(Arc::new(metered), poison, Arc::new(Noop)).decider(Arc::new(rules("bench"))).settings(settings).build();
    let started = Instant::now();
    listener.start();
    while listener.status().processed < MESSAGES as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    let tx = transactions.snapshot();
    listener.shutdown(Duration::from_secs(5)).await;
    let consuming = tx.gets_with_messages + tx.gets_empty + tx.deletes + tx.updates + tx.counts;
    json!({
        "messages": MESSAGES,
        "msg_per_s": (MESSAGES as f64 / elapsed.as_secs_f64()).round(),
        "storage_tx_per_message": (consuming as f64 / MESSAGES as f64 * 1000.0).round() / 1000.0,
        "transactions": tx,
    })
}

/// One idle hour, one queue, default settings and the built-in (paper) rule, on the
/// in-memory backend under the paused clock: every get is counted as it would be billed.
async fn idle_hour() -> serde_json::Value {
    let clock = Arc::new(TokioClock::new());
    let metered = Metered::new(MemoryQueue::new("idle", clock.clone(), 65536));
    let transactions = metered.transactions();
    let poison = Arc::new(MemoryQueue::new("idle-poison", clock, 65536));
    let settings = QueueSettings { random_seed: Some(1), ..Default::default() };
    let listener = Listener::builder(Arc::new(metered), poison, Arc::new(Noop)).decider(Arc::new(rules("idle"))).settings(settings).build();
    listener.start();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let tx = transactions.snapshot();
    listener.shutdown(Duration::from_secs(1)).await;
    let per_day = tx.total() as f64 * 24.0;
    json!({
        "storage_tx": tx.total(),
        "empty_gets": tx.gets_empty,
        "polling_every_second_baseline": 3600,
        "per_month_usd_at_0.01_per_10k": (per_day * 30.0 / 10_000.0 * 0.01 * 1000.0).round() / 1000.0,
        "baseline_per_month_usd": (3600.0 * 24.0 * 30.0 / 10_000.0 * 0.01 * 1000.0_f64).round() / 1000.0,
    })
}

/// The listener idles (back-off grows), then 10,000 messages land and the host is notified
/// (as the API does on a post): time until the rule's task count is running.
async fn burst_reaction() -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
    let queue = Arc::new(store.queue("burst"));
    queue.create_if_missing().await.unwrap();
    let poison = Arc::new(store.queue("burst-poison"));
    poison.create_if_missing().await.unwrap();
    struct Slow;
    #[async_trait]
    impl Handler for Slow {
        async fn handle(&self, _: &IncomingMessage) -> anyhow::Result<()> {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(())
        }
    }
    let settings = QueueSettings { max_tasks: 32, ..Default::default() };
    let listener = Listener::builder(queue.clone(), poison, Arc::new(Slow)).decider(Arc::new(rules("burst"))).settings(settings).build();
    listener.start();
    tokio::time::sleep(Duration::from_secs(10)).await; // idle: back-off has grown
    let landed = Instant::now();
    let puts = (0..10_000).map(|_| {
        let q = queue.clone();
        tokio::spawn(async move { q.put(&BODY, Duration::ZERO).await.unwrap() })
    });
    futures::future::join_all(puts).await;
    let puts_done = landed.elapsed();
    listener.work_detected();
    while listener.status().active_tasks < 32 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let reaction = landed.elapsed();
    let status = listener.status();
    listener.shutdown(Duration::from_secs(5)).await;
    json!({
        "messages": 10_000,
        "puts_took_ms": puts_done.as_millis() as u64,
        "landed_to_target_tasks_ms": reaction.as_millis() as u64,
        "notified_to_target_tasks_ms": (reaction - puts_done).as_millis() as u64,
        "target_tasks": status.target_tasks,
    })
}
