//! Pickup latency through the real binary, printed as JSON:
//! `cargo bench -p ebb-tests --bench push` (`EBB_BENCH_PUSH_SAMPLES`, default 50;
//! `EBB_BENCH_PUSH_MODES`, a comma list of push, scaler, pull, default all).
//!
//! A host (`ebb run`, release) on an Azurite queue with the built-in rule, min 100 ms and
//! max 1 s polling, handling into a local HTTP app that notes when each message arrives.
//! Another process puts a message straight into the queue, then:
//! - push (`push = true`, `min_tasks = 0`, `[bus]` on Redis on loopback): waits until the
//!   host runs no task at all, publishes the trigger on the queue's channel; the latency is
//!   publish → handler start;
//! - pull (same rule and intervals, `push = false`): at a random point of the idle
//!   back-off; the latency is put → handler start;
//! - push through a scaler host (issue 25): the worker as for push, and `ebb scaler` (no
//!   processing) on the same queue and bus; the message is sent to the scaler host's API,
//!   and the latency is send → handler start on the worker.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use ebb::bus::PubSub as _;
use ebb::queue::QueueClient as _;
use ebb::queue::azure::AzureQueue;
use ebb_tests::azurite::{Azurite, unique_queue_name};
use ebb_tests::redis::RedisServer;
use serde_json::json;

const EBB: &str = env!("CARGO_BIN_EXE_ebb-under-test");

type Arrivals = Arc<Mutex<HashMap<String, Instant>>>;

async fn handler_app() -> (Arrivals, SocketAddr) {
    let arrivals: Arrivals = Arc::default();
    let record = arrivals.clone();
    let app = axum::Router::new().route(
        "/work",
        axum::routing::post(move |body: Bytes| {
            let record = record.clone();
            async move {
                record.lock().unwrap().entry(String::from_utf8_lossy(&body).into_owned()).or_insert_with(Instant::now);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (arrivals, addr)
}

struct Host {
    child: Child,
    api: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// `ebb <command>` (`run`, or `scaler` for a host that only watches) on `queue`.
async fn start_host(command: &str, queue: &str, push: bool, azurite: &Azurite, redis: &RedisServer, app: SocketAddr) -> Host {
    let dir = tempfile::tempdir().unwrap();
    let api = free_addr();
    let push_keys = if push { "push = true\nmin_tasks = 0\n" } else { "" };
    let scaler = if command == "scaler" { format!("[scaler]\nlisten = \"{}\"\n", free_addr()) } else { String::new() };
    let config = format!(
        "{scaler}[api]\nlisten = \"{api}\"\n\n[azure]\nconnection_string = \"{}\"\n\n[bus]\nredis_url = \"{}\"\n\n[queues.{queue}]\nbackend = \"azure\"\n{push_keys}min_polling_interval = \"100ms\"\nmax_polling_interval = \"1s\"\nhandler = {{ url = \"http://{app}/work\" }}\n",
        azurite.connection_string(),
        redis.url()
    );
    std::fs::write(dir.path().join("ebb.toml"), config).unwrap();
    // `EBB_BENCH_PUSH_LOG=<file>` keeps the host's log (with `RUST_LOG` as the host reads it).
    let log = match std::env::var_os("EBB_BENCH_PUSH_LOG") {
        Some(path) => Stdio::from(std::fs::File::options().create(true).append(true).open(path).unwrap()),
        None => Stdio::null(),
    };
    let child = Command::new(EBB).arg(command).arg("--config").arg(dir.path().join("ebb.toml")).stdout(Stdio::null()).stderr(log).spawn().unwrap();
    let host = Host { child, api, _dir: dir };
    wait_until(Duration::from_secs(30), || async { reqwest::get(format!("http://{api}/healthz")).await.is_ok_and(|r| r.status().is_success()) }).await;
    host
}

async fn wait_until<F: Future<Output = bool>>(limit: Duration, mut condition: impl FnMut() -> F) {
    let deadline = Instant::now() + limit;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn queue_status(api: SocketAddr) -> serde_json::Value {
    let body = reqwest::get(format!("http://{api}/status")).await.unwrap().bytes().await.unwrap();
    serde_json::from_slice(&body).unwrap()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    (sorted[index] * 10.0).round() / 10.0
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Push,
    Pull,
    /// Push, the message sent to a scaler host's API.
    ThroughScaler,
}

async fn measure(mode: Mode, samples: usize, azurite: &Azurite, redis: &RedisServer) -> serde_json::Value {
    let push = mode != Mode::Pull;
    let queue = unique_queue_name(match mode {
        Mode::Push => "bench-push",
        Mode::Pull => "bench-pull",
        Mode::ThroughScaler => "bench-via-scaler",
    });
    let direct = AzureQueue::new(&azurite.account(), &queue, Default::default()).unwrap();
    direct.create_if_missing().await.unwrap();
    let (arrivals, app) = handler_app().await;
    let host = start_host("run", &queue, push, azurite, redis, app).await;
    let scaler_host = match mode {
        Mode::ThroughScaler => {
            let scaler_host = start_host("scaler", &queue, push, azurite, redis, app).await;
            wait_until(Duration::from_secs(30), || async { queue_status(scaler_host.api).await["bus"]["connected"] == true }).await;
            Some(scaler_host)
        }
        _ => None,
    };
    let http = reqwest::Client::new();
    let publisher = ebb::bus::redis::RedisPubSub::new(&redis.url()).unwrap();
    let channel = format!("ebb:queue:{queue}");
    let mut latencies_ms = Vec::new();
    for i in 0..samples {
        if push {
            // Zero idle tasks: only the trigger can wake the queue.
            wait_until(Duration::from_secs(30), || async {
                let status = queue_status(host.api).await;
                status["bus"]["connected"] == true && status["queues"][0]["active_tasks"] == 0
            })
            .await;
        } else {
            // Anywhere in the back-off (it reaches its 1 s maximum within 2 s of a find).
            tokio::time::sleep(Duration::from_millis(fastrand::u64(0..2500))).await;
        }
        let body = format!("sample-{i}");
        // Through a scaler host the clock starts at the send; otherwise once the message is stored.
        let sent = match &scaler_host {
            Some(scaler_host) => {
                let sent = Instant::now();
                let url = format!("http://{}/queues/{queue}/messages", scaler_host.api);
                assert!(http.post(url).body(body.clone()).send().await.unwrap().status().is_success());
                sent
            }
            None => {
                direct.put(body.as_bytes(), Duration::ZERO).await.unwrap();
                Instant::now()
            }
        };
        if std::env::var_os("EBB_BENCH_PUSH_LOG").is_some() {
            eprintln!("{} sent {body}", humantime::format_rfc3339_micros(std::time::SystemTime::now()));
        }
        if mode == Mode::Push {
            publisher.publish(&channel, format!(r#"{{"queue":"{queue}","count":1}}"#).as_bytes()).await.unwrap();
        }
        wait_until(Duration::from_secs(30), || async { arrivals.lock().unwrap().contains_key(&body) }).await;
        let arrived = arrivals.lock().unwrap()[&body];
        latencies_ms.push(arrived.duration_since(sent).as_secs_f64() * 1000.0);
    }
    drop(scaler_host);
    drop(host);
    latencies_ms.sort_by(f64::total_cmp);
    json!({
        "mode": match mode {
            Mode::Push => "push (Redis, zero idle tasks)",
            Mode::Pull => "pull (one polling task, back-off 100 ms to 1 s)",
            Mode::ThroughScaler => "push, sent to a scaler host's API (send -> handler on the worker)",
        },
        "samples": samples,
        "p50_ms": percentile(&latencies_ms, 0.5),
        "p99_ms": percentile(&latencies_ms, 0.99),
        "max_ms": percentile(&latencies_ms, 1.0),
    })
}

fn main() {
    let samples = std::env::var("EBB_BENCH_PUSH_SAMPLES").ok().and_then(|v| v.parse().ok()).unwrap_or(50usize).clamp(1, 10_000);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let azurite = Azurite::start();
    let redis = RedisServer::start();
    let report = runtime.block_on(async {
        // `EBB_BENCH_PUSH_MODES`: which of push, scaler, pull to run (default all).
        let modes = std::env::var("EBB_BENCH_PUSH_MODES").unwrap_or_else(|_| "push,scaler,pull".into());
        let mut results = Vec::new();
        for (name, mode) in [("push", Mode::Push), ("scaler", Mode::ThroughScaler), ("pull", Mode::Pull)] {
            if modes.split(',').any(|m| m.trim() == name) {
                eprintln!("{name}");
                results.push(measure(mode, samples, &azurite, &redis).await);
            }
        }
        json!({ "pickup_latency": results })
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}
