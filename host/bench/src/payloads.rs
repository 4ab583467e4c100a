//! `ebb bench payloads` (issue 20): producers that send one 1 KiB item at a time, packed
//! (`QueueHandle::send_items`, shared envelopes within `pack_linger`) against unpacked
//! (`QueueHandle::send`, a message per item), in the same run, through a real host with a
//! Rust handler: billed transactions per item (the queue's metered calls), pickup latency
//! from the send to the handler, and items per second, on the embedded queue and on an
//! Azurite the caller runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::time::Instant;

use ebb::handler::{Handler, IncomingMessage};
use ebb::{Config, Host};

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct PayloadsBench {
    /// Items per run.
    pub items: u64,
    /// Producers, each sending one item per call.
    pub producers: u32,
    /// Calls each producer has in flight (1: it waits for each answer before the next).
    pub in_flight: u32,
    /// Each item's bytes.
    pub item_bytes: usize,
    /// The packed runs' `pack_linger`.
    pub linger: Duration,
    /// An Azurite's queue port to run on too (none: the embedded queue only).
    pub azurite_port: Option<u16>,
}

/// One run's figures.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    backend: &'static str,
    packed: bool,
    items: u64,
    seconds: f64,
    transactions: u64,
    puts: u64,
    pickup_p50_ms: f64,
    pickup_p99_ms: f64,
}

impl Run {
    fn per_item(&self) -> f64 {
        self.transactions as f64 / self.items as f64
    }
    fn items_per_sec(&self) -> f64 {
        self.items as f64 / self.seconds
    }
}

/// Counts items and keeps each one's pickup latency (its body starts with the send's time).
struct Counter {
    start: Instant,
    handled: AtomicU64,
    latencies_us: std::sync::Mutex<Vec<u64>>,
}

#[async_trait::async_trait]
impl Handler for Counter {
    async fn handle(&self, message: &IncomingMessage) -> Result<()> {
        let sent_us: u64 =
            std::str::from_utf8(message.body.get(7..27).unwrap_or_default()).ok().and_then(|t| t.parse().ok()).context("an item of the bench")?;
        let now_us = self.start.elapsed().as_micros() as u64;
        self.latencies_us.lock().unwrap().push(now_us.saturating_sub(sent_us));
        self.handled.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A JSON item of `bytes` bytes carrying its send time (µs since the run's start).
fn item(sent_us: u64, seq: u64, bytes: usize) -> Bytes {
    // The time as a fixed-width string at a fixed place, so the handler reads it without parsing JSON.
    let head = format!("{{\"t\": \"{sent_us:020}\", \"seq\": {seq}, \"pad\": \"");
    let mut text = head.into_bytes();
    while text.len() + 2 < bytes {
        text.extend_from_slice(b"order line widget 42 ");
    }
    text.truncate(bytes.saturating_sub(2));
    text.extend_from_slice(b"\"}");
    Bytes::from(text)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index] as f64 / 1000.0
}

/// A host's configuration for one run: an API on a free port and one queue of a fresh name
/// (returned) on `backend`, packing within the bench's linger.
fn config(bench: &PayloadsBench, backend: &str, dir: &std::path::Path) -> Result<(Config, String)> {
    let queue = format!("bench-payloads-{}", fastrand::u32(..));
    let azure = match (backend, bench.azurite_port) {
        ("azurite", Some(port)) => format!(
            "[azure]\nconnection_string = \"DefaultEndpointsProtocol=http;AccountName={};AccountKey={};QueueEndpoint=http://127.0.0.1:{port}/{}\"\n",
            ebb::queue::azure::DEVELOPMENT_ACCOUNT,
            ebb::queue::azure::DEVELOPMENT_KEY,
            ebb::queue::azure::DEVELOPMENT_ACCOUNT
        ),
        _ => String::new(),
    };
    let backend_key = if azure.is_empty() { "" } else { "backend = \"azure\"\n" };
    let text =
        format!("{azure}[api]\nlisten = \"127.0.0.1:0\"\n[queues.{queue}]\n{backend_key}pack_linger = \"{}\"\n", humantime::format_duration(bench.linger));
    Ok((Config::parse(&text, dir, None)?, queue))
}

/// Sends the bench's items through `handle`, one per call, from its producers (each with
/// its calls in flight), every body stamped with its send time since `start`.
async fn produce(bench: &PayloadsBench, handle: &ebb::QueueHandle, start: Instant, packed: bool) -> Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let producers: Vec<_> = (0..bench.producers * bench.in_flight.max(1))
        .map(|_| {
            let (handle, next, bytes, total) = (handle.clone(), next.clone(), bench.item_bytes, bench.items);
            tokio::spawn(async move {
                loop {
                    let seq = next.fetch_add(1, Ordering::Relaxed);
                    if seq >= total {
                        return Ok::<(), anyhow::Error>(());
                    }
                    let body = item(start.elapsed().as_micros() as u64, seq, bytes);
                    if packed {
                        handle.send_items(vec![body]).await?;
                    } else {
                        handle.send(&body, Duration::ZERO, Duration::from_secs(20)).await?;
                    }
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await??;
    }
    Ok(())
}

/// Waits until `counter` has seen every item, for at most 10 minutes.
async fn all_handled(bench: &PayloadsBench, backend: &str, counter: &Counter) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while counter.handled.load(Ordering::Relaxed) < bench.items {
        if Instant::now() > deadline {
            bail!("{backend}: {} of {} items handled after 10 minutes", counter.handled.load(Ordering::Relaxed), bench.items);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// The host's billed transactions and puts so far, its queue's creation left out.
fn billed(host: &Host) -> (u64, u64) {
    let (mut transactions, mut puts) = (0, 0);
    for status in host.status() {
        if let Some(counts) = status.transactions {
            // Creating the queue is not the traffic's.
            transactions += counts.total() - counts.creates;
            puts += counts.puts;
        }
    }
    (transactions, puts)
}

async fn run_one(bench: &PayloadsBench, backend: &'static str, packed: bool) -> Result<Run> {
    let dir = tempfile::tempdir().context("a temporary folder")?;
    let (config, queue) = config(bench, backend, dir.path())?;
    let start = Instant::now();
    let counter = Arc::new(Counter { start, handled: AtomicU64::new(0), latencies_us: std::sync::Mutex::new(Vec::new()) });
    struct Shared(Arc<Counter>);
    #[async_trait::async_trait]
    impl Handler for Shared {
        async fn handle(&self, message: &IncomingMessage) -> Result<()> {
            self.0.handle(message).await
        }
    }
    let host = Host::builder(&config).handler(&queue, Shared(counter.clone())).start().await?;
    let handle = host.queue(&queue).context("the bench queue")?;
    let run_start = Instant::now();
    produce(bench, &handle, start, packed).await?;
    all_handled(bench, backend, &counter).await?;
    let seconds = run_start.elapsed().as_secs_f64();
    // The last deletes may still be on their way: give them a moment before counting.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (transactions, puts) = billed(&host);
    host.shutdown().await;
    let mut latencies = counter.latencies_us.lock().unwrap().clone();
    latencies.sort_unstable();
    Ok(Run {
        backend,
        packed,
        items: bench.items,
        seconds,
        transactions,
        puts,
        pickup_p50_ms: percentile(&latencies, 0.5),
        pickup_p99_ms: percentile(&latencies, 0.99),
    })
}

/// Every run: per backend, unpacked then packed.
pub(crate) async fn run(bench: &PayloadsBench) -> Result<Vec<Run>> {
    let mut backends = vec!["embedded"];
    if bench.azurite_port.is_some() {
        backends.push("azurite");
    }
    let mut runs = Vec::new();
    for backend in backends {
        for packed in [false, true] {
            runs.push(run_one(bench, backend, packed).await.with_context(|| format!("{backend}, {}", if packed { "packed" } else { "unpacked" }))?);
        }
    }
    Ok(runs)
}

/// The goals, each with its figure.
fn goals(bench: &PayloadsBench, runs: &[Run]) -> Vec<Value> {
    let mut goals = Vec::new();
    let linger_plus_1s = (bench.linger.as_secs_f64() + 1.0) * 1000.0;
    for run in runs.iter().filter(|r| r.packed) {
        goals.push(json!({"goal": format!("{}: billed transactions per item <= 0.05", run.backend), "value": run.per_item(), "met": run.per_item() <= 0.05}));
        goals.push(json!({"goal": format!("{}: pickup p99 <= linger + 1 s ({linger_plus_1s:.0} ms)", run.backend), "value": run.pickup_p99_ms, "met": run.pickup_p99_ms <= linger_plus_1s}));
    }
    let speed = |packed: bool| runs.iter().find(|r| r.backend == "azurite" && r.packed == packed).map(Run::items_per_sec);
    if let (Some(packed), Some(unpacked)) = (speed(true), speed(false)) {
        let ratio = packed / unpacked;
        goals.push(json!({"goal": "azurite: items per second packed >= 10 x unpacked", "value": ratio, "met": ratio >= 10.0}));
    }
    goals
}

/// The figures as JSON.
pub(crate) fn json(bench: &PayloadsBench, runs: &[Run]) -> Value {
    json!({
        "items": bench.items,
        "producers": bench.producers,
        "in_flight_per_producer": bench.in_flight,
        "item_bytes": bench.item_bytes,
        "pack_linger_ms": bench.linger.as_millis() as u64,
        "runs": runs.iter().map(|r| json!({
            "backend": r.backend,
            "mode": if r.packed { "packed" } else { "unpacked" },
            "seconds": r.seconds,
            "items_per_sec": r.items_per_sec(),
            "messages_put": r.puts,
            "items_per_message": r.items as f64 / r.puts.max(1) as f64,
            "transactions": r.transactions,
            "transactions_per_item": r.per_item(),
            "pickup_p50_ms": r.pickup_p50_ms,
            "pickup_p99_ms": r.pickup_p99_ms,
        })).collect::<Vec<_>>(),
        "goals": goals(bench, runs),
    })
}

/// The figures as a table.
pub(crate) fn table(bench: &PayloadsBench, runs: &[Run]) -> String {
    let mut out = format!(
        "{} items of {} bytes from {} producers (one item per call, {} call(s) in flight each), pack_linger {}\n",
        bench.items,
        bench.item_bytes,
        bench.producers,
        bench.in_flight,
        humantime::format_duration(bench.linger)
    );
    out += "backend   mode      items/s   messages  items/msg  transactions  per item  pickup p50 ms  p99 ms\n";
    for r in runs {
        out += &format!(
            "{:<9} {:<9} {:>7.0} {:>10} {:>10.1} {:>13} {:>9.4} {:>14.1} {:>7.1}\n",
            r.backend,
            if r.packed { "packed" } else { "unpacked" },
            r.items_per_sec(),
            r.puts,
            r.items as f64 / r.puts.max(1) as f64,
            r.transactions,
            r.per_item(),
            r.pickup_p50_ms,
            r.pickup_p99_ms
        );
    }
    for goal in goals(bench, runs) {
        out += &format!(
            "{}: {:.3} ({})\n",
            goal["goal"].as_str().unwrap_or_default(),
            goal["value"].as_f64().unwrap_or_default(),
            if goal["met"] == true { "met" } else { "NOT met" }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_has_the_asked_size_and_carries_its_send_time() {
        let body = item(1234, 7, 1024);
        assert_eq!(body.len(), 1024);
        assert_eq!(std::str::from_utf8(&body[7..27]).unwrap().parse::<u64>().unwrap(), 1234);
        assert!(serde_json::from_slice::<Value>(&body).is_ok());
    }
}
