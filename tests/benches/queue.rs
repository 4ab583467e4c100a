//! Embedded queue figures, printed as JSON: `cargo bench -p ebb-tests --bench queue`.
//! `EBB_BENCH_DEPTHS=5000,50000,1000000` sets the queue depths measured.
//!
//! Same run, same machine, durable commits (fsync) everywhere, 64-byte bodies:
//! - processing: get 32 (lease in one commit), delete them (second commit), through the
//!   embedded backend (one consumer task, and four), against raw redb and raw fjall loops
//!   doing the same writes: the baselines, and the spike that chose redb;
//! - concurrent single puts (group commit) against one put per commit on raw redb;
//! - approximate count latency with the deepest queue.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ebb::queue::QueueClient;
use ebb::queue::embedded::{EmbeddedOptions, EmbeddedQueue, EmbeddedStore};
use redb::Durability;
use serde_json::{Value, json};

const BODY: [u8; 64] = [b'x'; 64];
const LEASE_MS: u64 = 60_000;
const PROCESSED: usize = 20_000;

fn main() {
    let depths: Vec<usize> = std::env::var("EBB_BENCH_DEPTHS")
        .unwrap_or_else(|_| "5000,50000,1000000".into())
        .split(',')
        .map(|d| d.trim().parse().expect("depths are numbers"))
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let mut processing = json!({});
    for &depth in &depths {
        let embedded_1 = runtime.block_on(embedded_processing(depth, 1));
        let embedded_4 = runtime.block_on(embedded_processing(depth, 4));
        let redb = ebb_tests::baselines::raw_redb_processing(depth, PROCESSED);
        let fjall = raw_fjall_processing(depth);
        processing[depth.to_string()] = json!({
            "embedded_1_task_msg_per_s": embedded_1,
            "embedded_4_tasks_msg_per_s": embedded_4,
            "raw_redb_msg_per_s": redb,
            "raw_fjall_msg_per_s": fjall,
            "embedded_1_task_vs_raw_redb": round2(embedded_1 / redb),
            "embedded_4_tasks_vs_raw_redb": round2(embedded_4 / redb),
        });
    }
    let report = json!({
        "processing_put_get32_delete": processing,
        "single_puts": runtime.block_on(single_puts()),
        "approximate_count": runtime.block_on(count_latency(*depths.iter().max().unwrap())),
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

async fn filled_queue(dir: &Path, depth: usize) -> EmbeddedQueue {
    let store = EmbeddedStore::open(dir, EmbeddedOptions::default()).unwrap();
    let queue = store.queue("bench");
    queue.create_if_missing().await.unwrap();
    let queue = Arc::new(queue);
    // Fill with many concurrent puts: group commit makes this quick.
    for chunk in (0..depth).collect::<Vec<_>>().chunks(20_000) {
        let puts = chunk.iter().map(|_| {
            let queue = queue.clone();
            tokio::spawn(async move { queue.put(&BODY, Duration::ZERO).await.unwrap() })
        });
        futures::future::join_all(puts).await;
    }
    Arc::into_inner(queue).unwrap()
}

/// Messages per second through get(32) + delete of each, with `tasks` consumers.
async fn embedded_processing(depth: usize, tasks: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let queue = Arc::new(filled_queue(dir.path(), depth).await);
    let target = PROCESSED.min(depth);
    let started = Instant::now();
    let consumers = (0..tasks).map(|_| {
        let queue = queue.clone();
        tokio::spawn(async move {
            let mut done = 0;
            while done < target / tasks {
                let batch = queue.get(32, Duration::from_millis(LEASE_MS)).await.unwrap();
                if batch.is_empty() {
                    break;
                }
                let deletes = batch.iter().map(|m| queue.delete(&m.id, &m.pop_receipt));
                for result in futures::future::join_all(deletes).await {
                    result.unwrap();
                }
                done += batch.len();
            }
            done
        })
    });
    let done: usize = futures::future::join_all(consumers).await.into_iter().map(Result::unwrap).sum();
    done as f64 / started.elapsed().as_secs_f64()
}

/// The same loop on fjall, scanning from the low-water mark (from key 0 it would walk
/// every tombstone).
fn raw_fjall_processing(depth: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let db = fjall::Database::builder(dir.path()).open().unwrap();
    let keyspace = db.keyspace("raw", fjall::KeyspaceCreateOptions::default).unwrap();
    for chunk in (0..depth as u64).collect::<Vec<_>>().chunks(10_000) {
        let mut batch = db.batch();
        for seq in chunk {
            batch.insert(&keyspace, seq.to_be_bytes(), [&0u64.to_le_bytes()[..], &BODY].concat());
        }
        batch.commit().unwrap();
    }
    db.persist(fjall::PersistMode::SyncAll).unwrap();
    let target = PROCESSED.min(depth);
    let (mut done, mut low_water) = (0, 0u64);
    let started = Instant::now();
    while done < target {
        let now = now_ms();
        let visible: Vec<(u64, Vec<u8>)> = keyspace
            .range(low_water.to_be_bytes()..)
            .map(|guard| guard.into_inner().unwrap())
            .filter(|(_, v)| u64::from_le_bytes(v[..8].try_into().unwrap()) <= now)
            .take(32)
            .map(|(k, v)| (u64::from_be_bytes(k[..8].try_into().unwrap()), v.to_vec()))
            .collect();
        let mut lease = db.batch().durability(Some(fjall::PersistMode::SyncAll));
        for (seq, value) in &visible {
            let mut value = value.clone();
            value[..8].copy_from_slice(&(now + LEASE_MS).to_le_bytes());
            lease.insert(&keyspace, seq.to_be_bytes(), value);
        }
        lease.commit().unwrap();
        let mut delete = db.batch().durability(Some(fjall::PersistMode::SyncAll));
        for (seq, _) in &visible {
            delete.remove(&keyspace, seq.to_be_bytes());
        }
        delete.commit().unwrap();
        low_water = visible.last().map_or(low_water, |(l, _)| l + 1);
        done += visible.len();
    }
    done as f64 / started.elapsed().as_secs_f64()
}

/// Many clients putting one message at a time, against one put per commit on raw redb.
async fn single_puts() -> Value {
    let window = Duration::from_secs(3);
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
    let queue = Arc::new(store.queue("puts"));
    queue.create_if_missing().await.unwrap();
    let clients = 256;
    let started = Instant::now();
    let putters = (0..clients).map(|_| {
        let queue = queue.clone();
        tokio::spawn(async move {
            let mut puts = 0u64;
            while started.elapsed() < window {
                queue.put(&BODY, Duration::ZERO).await.unwrap();
                puts += 1;
            }
            puts
        })
    });
    let puts: u64 = futures::future::join_all(putters).await.into_iter().map(Result::unwrap).sum();
    let grouped = puts as f64 / started.elapsed().as_secs_f64();

    let raw_dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(raw_dir.path().join("raw.redb")).unwrap();
    let started = Instant::now();
    let mut seq = 0u64;
    while started.elapsed() < window {
        let mut txn = db.begin_write().unwrap();
        txn.set_durability(Durability::Immediate).unwrap();
        txn.open_table(ebb_tests::baselines::RAW).unwrap().insert(seq, &BODY[..]).unwrap();
        txn.commit().unwrap();
        seq += 1;
    }
    let one_per_commit = seq as f64 / started.elapsed().as_secs_f64();
    json!({
        "clients": clients,
        "embedded_group_commit_puts_per_s": grouped.round(),
        "raw_redb_one_put_per_commit_per_s": one_per_commit.round(),
        "ratio": round2(grouped / one_per_commit),
    })
}

async fn count_latency(depth: usize) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let queue = filled_queue(dir.path(), depth).await;
    assert_eq!(queue.approximate_count().await.unwrap(), depth as u64);
    let mut samples: Vec<Duration> = Vec::with_capacity(10_000);
    for _ in 0..10_000 {
        let started = Instant::now();
        black_box(queue.approximate_count().await.unwrap());
        samples.push(started.elapsed());
    }
    samples.sort();
    let us = |q: f64| (samples[((samples.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6 * 100.0).round() / 100.0;
    json!({ "queued": depth, "p50_us": us(0.5), "p99_us": us(0.99) })
}
