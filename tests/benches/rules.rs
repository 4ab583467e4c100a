//! Rules engine figures, printed as JSON: `cargo bench -p ebb-tests --bench rules`.
//!
//! - decision calls on a reused instance (Rust, Python, JavaScript rules) against the same
//!   logic as a native Rust function, in the same run;
//! - rule file written → new rule deciding, over many swaps, with a decider running alongside;
//! - compile time, cached load time (new engine, disk cache) and instance memory per rule.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ebb::rules::{DecisionSource, QueueRuleConfig, QueueState, RuleEngine, RuleLimits, RuleSet};
use ebb_rules_sdk::paper;
use ebb_tests::guests;
use serde_json::{Value, json};

const QUEUE: &str = "bench";

fn main() {
    let swaps: usize = std::env::var("EBB_BENCH_SWAPS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let report = json!({
        "decision_call": decision_calls(),
        "hot_swap": hot_swaps(swaps),
        "load": loads(),
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}

fn state(i: u64) -> QueueState {
    QueueState { queue: QUEUE.into(), approximate_depth: i % 2000, min_tasks: 1, max_tasks: 100, active_tasks: 1, random: i.wrapping_mul(0x9E37_79B9_7F4A_7C15), ..Default::default() }
}

/// Percentiles of per-call latencies in microseconds.
fn summarize(mut samples: Vec<Duration>) -> Value {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    json!({ "calls": samples.len(), "p50_us": round3(at(0.50)), "p99_us": round3(at(0.99)), "max_us": round3(at(1.0)) })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn time_calls(calls: u64, mut call: impl FnMut(u64)) -> Value {
    for i in 0..calls / 10 {
        call(i); // warm up
    }
    let samples = (0..calls)
        .map(|i| {
            let started = Instant::now();
            call(i);
            started.elapsed()
        })
        .collect();
    summarize(samples)
}

fn decision_calls() -> Value {
    let engine = RuleEngine::new(RuleLimits::default(), None).unwrap();
    let calls = 200_000;
    let mut report = json!({
        "native_rust_paper_rule": time_calls(calls, |i| {
            black_box(paper::optimal_dequeue_task_count(black_box(&state(i))));
        }),
    });
    for (name, guest) in [
        ("rust_paper_default", guests::PAPER_DEFAULT),
        ("python_drain_time", guests::PYTHON_DRAIN_TIME),
        ("javascript_spare_capacity", guests::JAVASCRIPT_SPARE_CAPACITY),
    ] {
        let rule = engine.load_file(Path::new(guest)).unwrap();
        let mut instance = engine.instantiate(&rule, &[]).unwrap();
        let raw = time_calls(calls, |i| {
            black_box(instance.optimal_dequeue_task_count(&state(i)).unwrap());
        });
        let set = RuleSet::new(engine.clone(), [QueueRuleConfig { queue: QUEUE.into(), rule: Some(guest.into()), params: vec![] }]);
        assert!(set.load_all().is_empty());
        let through_rule_set = time_calls(calls, |i| {
            let decision = set.decide_task_count(QUEUE, &state(i));
            assert_eq!(decision.source, DecisionSource::Rule);
        });
        report[name] = json!({ "instance_call": raw, "rule_set_decision": through_rule_set });
    }
    report
}

fn hot_swaps(swaps: usize) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().canonicalize().unwrap().join("rule.wasm");
    std::fs::copy(guests::PAPER_DEFAULT, &path).unwrap();
    let engine = RuleEngine::new(RuleLimits::default(), None).unwrap();
    let debounce = Duration::from_millis(20);
    let set = Arc::new(RuleSet::new(engine, [QueueRuleConfig { queue: QUEUE.into(), rule: Some(path.clone()), params: vec![] }]));
    assert!(set.load_all().is_empty());
    let _watcher = set.watch(dir.path(), debounce).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let (failed, made) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let decider = {
        let (set, stop, failed, made) = (set.clone(), stop.clone(), failed.clone(), made.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if set.decide_task_count(QUEUE, &state(5)).source != DecisionSource::Rule {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                made.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let versions = [(std::fs::read(guests::FIXED_TASKS).unwrap(), 7), (std::fs::read(guests::PAPER_DEFAULT).unwrap(), 10)];
    let staging = dir.path().join("rule.wasm.partial");
    let mut samples = Vec::with_capacity(swaps);
    for round in 0..swaps {
        let (bytes, tasks) = &versions[round % 2];
        std::fs::write(&staging, bytes).unwrap();
        let started = Instant::now();
        std::fs::rename(&staging, &path).unwrap();
        while set.decide_task_count(QUEUE, &state(5)).value != *tasks {
            std::thread::sleep(Duration::from_micros(500));
            assert!(started.elapsed() < Duration::from_secs(10), "swap {round} never took effect");
        }
        samples.push(started.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    decider.join().unwrap();
    let mut report = summarize(samples);
    report["debounce_ms"] = json!(debounce.as_millis() as u64);
    report["decisions_during_swaps"] = json!(made.load(Ordering::Relaxed));
    report["failed_decisions"] = json!(failed.load(Ordering::Relaxed));
    report
}

fn loads() -> Value {
    let mut report = json!({});
    for (name, guest) in [
        ("rust_paper_default", guests::PAPER_DEFAULT),
        ("rust_threshold_table", guests::THRESHOLD_TABLE),
        ("python_drain_time", guests::PYTHON_DRAIN_TIME),
        ("javascript_spare_capacity", guests::JAVASCRIPT_SPARE_CAPACITY),
    ] {
        let cache = tempfile::tempdir().unwrap();
        let first_engine = RuleEngine::new(RuleLimits::default(), Some(cache.path().into())).unwrap();
        let compiled = first_engine.load_file(Path::new(guest)).unwrap();
        assert!(!compiled.from_cache);
        let started = Instant::now();
        let instance = first_engine.instantiate(&compiled, &[]).unwrap();
        let instantiate = started.elapsed();
        // A restart: a new engine, the same cache folder.
        let restarted = RuleEngine::new(RuleLimits::default(), Some(cache.path().into())).unwrap();
        let started = Instant::now();
        let cached = restarted.load_file(Path::new(guest)).unwrap();
        let cached_load = started.elapsed();
        assert!(cached.from_cache);
        report[name] = json!({
            "file_bytes": compiled.size,
            "compile_ms": round3(compiled.compile_time.as_secs_f64() * 1e3),
            "cached_load_ms": round3(cached_load.as_secs_f64() * 1e3),
            "instantiate_and_configure_ms": round3(instantiate.as_secs_f64() * 1e3),
            "instance_memory_bytes": instance.memory_bytes(),
        });
    }
    report
}
