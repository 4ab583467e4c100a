//! `ebb bench record`: what recording arrivals (issue 22) costs at load. The same run with
//! recording on and off, alternating in each round (off, on; then on, off) so the drift of
//! a shared machine hits both alike: producers send through a queue handle into the
//! embedded store while the listener posts every message to the local app; msg/s from the
//! first send to the last message done, and CPU per message; medians over the rounds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use serde::Serialize;

use crate::contenders::wait_until_processed;
use crate::measure::process_cpu;
use crate::server::ServerProcess;
use ebb::QueueHandle;
use ebb::handler::HttpHandler;
use ebb::listener::{Listener, QueueSettings};
use ebb::queue::embedded::{EmbeddedOptions, EmbeddedStore};
use ebb::queue::{QueueClient, SystemClock};
use ebb::record::Recorder;

/// The recording's file limit: a queue's default `record_max_bytes` (8 MiB).
const RECORD_MAX_BYTES: u64 = 8 << 20;

/// What to run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordBench {
    pub(crate) messages: u64,
    pub(crate) concurrency: u32,
    pub(crate) body_bytes: u32,
    pub(crate) rounds: u32,
}

/// One run's figures.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct RecordRun {
    pub(crate) recording: bool,
    pub(crate) msg_per_sec: f64,
    pub(crate) cpu_us_per_message: f64,
}

/// The whole result.
#[derive(Debug, Serialize)]
pub(crate) struct RecordReport {
    pub(crate) messages: u64,
    pub(crate) concurrency: u32,
    pub(crate) body_bytes: u32,
    pub(crate) rounds: u32,
    /// Median msg/s with recording off, and on.
    pub(crate) off_msg_per_sec: f64,
    pub(crate) on_msg_per_sec: f64,
    /// `1 − on ÷ off`, in percent: the throughput recording costs (negative: noise in its favour).
    pub(crate) throughput_cost_percent: f64,
    /// Median CPU per message, off and on, in µs.
    pub(crate) off_cpu_us_per_message: f64,
    pub(crate) on_cpu_us_per_message: f64,
    /// The hot path alone: one count (`QueueRecording::record`, the system clock read
    /// included), in ns, the median of 5 batches of 1,000,000 on one thread.
    pub(crate) record_call_ns: f64,
    /// What the hot path adds per message at most (two counts: its put, and its share of a
    /// get's first deliveries), in percent of the CPU a message costs with recording off: a
    /// bound the run-to-run noise of the msg/s figures cannot give.
    pub(crate) hot_path_cpu_percent: f64,
    /// The goal: at most 1 % of throughput.
    pub(crate) goal_met: bool,
    pub(crate) runs: Vec<RecordRun>,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

pub(crate) fn run(bench: RecordBench, json: bool, leading: &[&str]) -> anyhow::Result<()> {
    let server = ServerProcess::start(leading)?;
    let url = reqwest::Url::parse(&format!("http://{}/", server.address())).context("failed to make the bench server's URL")?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("failed to start the bench's runtime")?;
    let body = Bytes::from(vec![b'x'; bench.body_bytes as usize]);
    let mut runs = Vec::new();
    for round in 1..=bench.rounds {
        let order = if round % 2 == 1 { [false, true] } else { [true, false] };
        for recording in order {
            let run = runtime.block_on(one_run(&bench, &url, &body, recording)).with_context(|| format!("round {round}, recording {}", on_off(recording)))?;
            eprintln!(
                "round {round}/{}: recording {}: {:.0} msg/s, {:.1} CPU µs per message",
                bench.rounds,
                on_off(recording),
                run.msg_per_sec,
                run.cpu_us_per_message
            );
            runs.push(run);
        }
    }
    let record_call_ns = record_call_ns();
    let of = |on: bool, figure: fn(&RecordRun) -> f64| median(runs.iter().filter(|r| r.recording == on).map(figure).collect());
    let (off, on) = (of(false, |r| r.msg_per_sec), of(true, |r| r.msg_per_sec));
    let cost = (1.0 - on / off) * 100.0;
    let report = RecordReport {
        messages: bench.messages,
        concurrency: bench.concurrency,
        body_bytes: bench.body_bytes,
        rounds: bench.rounds,
        off_msg_per_sec: off,
        on_msg_per_sec: on,
        throughput_cost_percent: cost,
        off_cpu_us_per_message: of(false, |r| r.cpu_us_per_message),
        on_cpu_us_per_message: of(true, |r| r.cpu_us_per_message),
        record_call_ns,
        hot_path_cpu_percent: 2.0 * record_call_ns / (of(false, |r| r.cpu_us_per_message) * 1000.0) * 100.0,
        goal_met: cost <= 1.0,
        runs,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{} messages of {} B through a queue handle, T = {}, {} rounds (medians)\nrecording off: {:.0} msg/s, {:.1} CPU µs/msg\nrecording on:  {:.0} msg/s, {:.1} CPU µs/msg\ncost: {:.2} % of throughput (goal ≤ 1 %: {})\nhot path: {:.1} ns per count, at most {:.3} % of a message's CPU",
            report.messages,
            report.body_bytes,
            report.concurrency,
            report.rounds,
            report.off_msg_per_sec,
            report.off_cpu_us_per_message,
            report.on_msg_per_sec,
            report.on_cpu_us_per_message,
            report.throughput_cost_percent,
            if report.goal_met { "met" } else { "not met" },
            report.record_call_ns,
            report.hot_path_cpu_percent
        );
    }
    Ok(())
}

/// The median ns of one count, over 5 batches of 1,000,000.
fn record_call_ns() -> f64 {
    const CALLS: u32 = 1_000_000;
    let recording = ebb::record::QueueRecording::new("bench", Arc::new(SystemClock));
    let batches = (0..5)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..CALLS {
                recording.record(std::hint::black_box(ebb::record::Seen::Put), std::hint::black_box(1));
            }
            let ns = started.elapsed().as_nanos() as f64 / f64::from(CALLS);
            // Keep the counts from growing without bound across batches.
            let _ = recording.take_finished(true);
            ns
        })
        .collect();
    median(batches)
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

async fn one_run(bench: &RecordBench, url: &reqwest::Url, body: &Bytes, recording: bool) -> anyhow::Result<RecordRun> {
    let dir = tempfile::tempdir().context("failed to create a temporary folder for the store")?;
    let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default())?;
    let queue = Arc::new(store.queue("bench"));
    let poison = Arc::new(store.queue("bench-poison"));
    queue.create_if_missing().await?;
    poison.create_if_missing().await?;
    let mut recorder = Recorder::new();
    let counters = recording.then(|| recorder.add(dir.path(), "bench", RECORD_MAX_BYTES, Arc::new(SystemClock)));
    let recorder = Arc::new(recorder);
    let stop = tokio_util::sync::CancellationToken::new();
    let flusher = counters.is_some().then(|| recorder.clone().spawn(stop.clone()));

    let handler = HttpHandler::new(url.clone(), Duration::from_secs(30))?;
    let settings = QueueSettings { max_concurrent_calls: bench.concurrency, ..QueueSettings::default() };
    let mut builder = Listener::builder(queue.clone(), poison, Arc::new(handler)).settings(settings);
    if let Some(counters) = &counters {
        builder = builder.recording(counters.clone());
    }
    let listener = builder.build();
    let mut handle = QueueHandle::builder("bench", queue).listeners(vec![listener.clone()]);
    if let Some(counters) = &counters {
        handle = handle.recording(counters.clone());
    }
    let handle = handle.build();
    listener.start();
    let cpu_before = process_cpu();
    let started = Instant::now();
    let producers = bench.concurrency.max(1) as u64;
    let tasks: Vec<_> = (0..producers)
        .map(|i| {
            let (handle, body) = (handle.clone(), body.clone());
            let count = bench.messages / producers + u64::from(i < bench.messages % producers);
            tokio::spawn(async move {
                for _ in 0..count {
                    handle.send(&body, Duration::ZERO, Duration::from_secs(20)).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let finished = wait_until_processed(&listener, bench.messages).await;
    let elapsed = started.elapsed();
    let cpu = process_cpu().saturating_sub(cpu_before);
    listener.shutdown(Duration::from_secs(10)).await;
    stop.cancel();
    if let Some(flusher) = flusher {
        flusher.await?;
    }
    finished?;
    // The recording recorded: every send once (as a put) and every first delivery.
    if recording {
        let (buckets, warnings) = ebb::record::read(dir.path(), "bench", 0);
        let (puts, seen): (u64, u64) = buckets.iter().fold((0, 0), |(p, s), b| (p + b.puts, s + b.first_seen));
        if puts != bench.messages || seen != bench.messages || !warnings.is_empty() {
            bail!("the recording holds {puts} puts and {seen} first deliveries of {} messages ({warnings:?})", bench.messages);
        }
    }
    Ok(RecordRun {
        recording,
        msg_per_sec: bench.messages as f64 / elapsed.as_secs_f64().max(1e-9),
        cpu_us_per_message: cpu.as_secs_f64() * 1e6 / bench.messages.max(1) as f64,
    })
}
