//! Rules engine figures, printed as JSON: `cargo bench -p ebb-tests --bench rules`.
//!
//! - decision calls on a reused instance (Rust, C, Python, JavaScript rules; the C rule
//!   beside its Rust counterpart `proportional`) against the same logic as a native Rust
//!   function, in the same run;
//! - rule file written → new rule deciding, over many swaps, with a decider running alongside;
//! - compile time, cached load time (new engine, disk cache) and instance memory per rule;
//! - each in a fresh process (this binary run again with `--section NAME`), so that one
//!   figure's memory is not another's: idle CPU and file reads with a 25 MB rule deployed
//!   and watched (`idle`), RSS across 20 swaps of a 25 MB rule (`swaps`), and RSS of 1,000
//!   queues on the Python example rule (`python-queues`).
//!
//! `EBB_BENCH_SECTIONS` runs only the sections it names, of `decision_call,hot_swap,load`
//! (in this process) and `idle,swaps,python-queues` (each in a fresh one); all by default.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ebb::names::DecisionSite;
use ebb::rules::{DecisionSource, QueueRuleConfig, QueueState, RuleEngine, RuleLimits, RuleSet};
use ebb_rules_sdk::paper;
use ebb_tests::guests;
use serde_json::{Value, json};

const QUEUE: &str = "bench";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--section") {
        let report = match args[at + 1].as_str() {
            "idle" => idle(),
            "swaps" => swap_memory(),
            "python-queues" => python_queues(),
            other => panic!("unknown section {other}"),
        };
        println!("{}", serde_json::to_string(&report).unwrap());
        return;
    }
    let sections = std::env::var("EBB_BENCH_SECTIONS").unwrap_or_else(|_| "decision_call,hot_swap,load,idle,swaps,python-queues".into());
    let mut report = json!({});
    for section in sections.split(',').filter(|s| !s.is_empty()) {
        match section {
            "decision_call" => report[section] = decision_calls(),
            "hot_swap" => {
                let swaps: usize = std::env::var("EBB_BENCH_SWAPS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
                report[section] = hot_swaps(swaps);
            }
            "load" => report[section] = loads(),
            _ => report[section] = in_fresh_process(section),
        }
    }
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}

/// Runs `section` in a fresh process (this binary with `--section`) and returns its report.
fn in_fresh_process(section: &str) -> Value {
    let out = std::process::Command::new(std::env::current_exe().unwrap()).args(["--section", section]).output().unwrap();
    assert!(out.status.success(), "section {section} failed: {}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_string();
    serde_json::from_str(&line).unwrap()
}

/// Resident memory of this process, in MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: f64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches(" kB").trim().parse().unwrap();
    (kib / 1024.0 * 10.0).round() / 10.0
}

/// CPU time (user + system) this process has used.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    // utime and stime are fields 14 and 15 of the line (11 and 12 after the command); ticks of 10 ms.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// Bytes this process has read through read(2) and friends (`rchar`), page cache included.
fn read_chars() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap();
    io.lines().find_map(|l| l.strip_prefix("rchar:")).unwrap().trim().parse().unwrap()
}

fn sha_of(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).unwrap().flatten().map(|e| e.metadata().unwrap().len()).sum()
}

/// The host's setup: a cache dir, a rules folder watched with the service's debounce.
struct Deployed {
    dir: tempfile::TempDir,
    cache: tempfile::TempDir,
    set: Arc<RuleSet>,
    _watcher: ebb::rules::RuleWatcher,
}

fn deployed(bytes: &[u8]) -> Deployed {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let path = dir.path().canonicalize().unwrap().join("rule.wasm");
    std::fs::write(&path, bytes).unwrap();
    let engine = RuleEngine::new(RuleLimits::default(), Some(cache.path().into())).unwrap();
    let set = Arc::new(RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::new(QUEUE).unwrap(), rule: Some(path), params: vec![] }]));
    assert!(set.load_all().is_empty());
    let watcher = set.watch(dir.path(), Duration::from_millis(30)).unwrap();
    Deployed { dir, cache, set, _watcher: watcher }
}

impl Deployed {
    /// Deploys `bytes` (write aside, rename) and waits until the rule decides.
    fn deploy(&self, bytes: &[u8]) -> Duration {
        let staging = self.dir.path().join("rule.wasm.partial");
        std::fs::write(&staging, bytes).unwrap();
        let started = Instant::now();
        std::fs::rename(&staging, self.dir.path().join("rule.wasm")).unwrap();
        let sha = sha_of(bytes);
        while self.set.status(QUEUE).unwrap().sha256.as_deref() != Some(sha.as_str()) {
            assert!(started.elapsed() < Duration::from_secs(120), "the deploy never took effect");
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(self.set.decide_task_count(QUEUE, &state(5)).source, DecisionSource::Rule);
        started.elapsed()
    }
}

/// A 25 MB rule deployed, changed once, then nothing happens for 10 s.
fn idle() -> Value {
    let bytes = std::fs::read(guests::PADDED).unwrap();
    let host = deployed(&bytes);
    host.deploy(&ebb_tests::version_of(&bytes, 1));
    std::thread::sleep(Duration::from_secs(1));
    let (reads, chars, cpu) = (host.set.file_reads(), read_chars(), cpu_time());
    let window = Duration::from_secs(10);
    std::thread::sleep(window);
    let cpu_used = cpu_time() - cpu;
    json!({
        "rule_bytes": bytes.len(),
        "window_s": window.as_secs(),
        "rule_file_reads": host.set.file_reads() - reads,
        "bytes_read": read_chars() - chars,
        "cpu_percent_of_one_core": round3(cpu_used.as_secs_f64() / window.as_secs_f64() * 100.0),
    })
}

/// 20 versions of a 25 MB rule deployed in turn, as an operator would.
fn swap_memory() -> Value {
    let bytes = std::fs::read(guests::PADDED).unwrap();
    let host = deployed(&bytes);
    let rss_loaded = rss_mib();
    let mut swap_ms = Vec::new();
    let mut rss_after = Vec::new();
    for version in 1..=20 {
        swap_ms.push(round3(host.deploy(&ebb_tests::version_of(&bytes, version)).as_secs_f64() * 1e3));
        rss_after.push(rss_mib());
    }
    json!({
        "rule_bytes": bytes.len(),
        "rss_mib_loaded": rss_loaded,
        "rss_mib_after_first_swap": rss_after[0],
        "rss_mib_after_20_swaps": rss_after[19],
        "rss_mib_after_each_swap": rss_after,
        "growth_first_to_20th_percent": round3((rss_after[19] / rss_after[0] - 1.0) * 100.0),
        "cache_dir_mib": round3(dir_bytes(host.cache.path()) as f64 / (1 << 20) as f64),
        "compiled_in_memory": host.set.engine().compiled_in_memory(),
        "swap_ms": swap_ms,
    })
}

/// 1,000 queues on the Python example rule with the same parameters, each deciding once.
fn python_queues() -> Value {
    let rss_start = rss_mib();
    let cache = tempfile::tempdir().unwrap();
    let engine = RuleEngine::new(RuleLimits::default(), Some(cache.path().into())).unwrap();
    let queues = (0..1000).map(|i| QueueRuleConfig {
        slot: DecisionSite::new(&format!("queue-{i}")).unwrap(),
        rule: Some(guests::PYTHON_DRAIN_TIME.into()),
        params: vec![("target_drain_s".into(), "5".into())],
    });
    let set = RuleSet::new(engine, queues);
    let started = Instant::now();
    assert!(set.load_all().is_empty());
    let load = started.elapsed();
    let started = Instant::now();
    for i in 0..1000 {
        let queue = format!("queue-{i}");
        let decision = set.decide_task_count(&queue, &QueueState { queue: queue.clone(), ..state(i) });
        assert_eq!(decision.source, DecisionSource::Rule);
    }
    let decide_all = started.elapsed();
    let status = set.status("queue-0").unwrap();
    json!({
        "queues": 1000,
        "rss_mib_before": rss_start,
        "rss_mib_after": rss_mib(),
        "load_s": round3(load.as_secs_f64()),
        "one_decision_per_queue_ms": round3(decide_all.as_secs_f64() * 1e3),
        "instance_memory_mib": round3(status.instance_memory_bytes as f64 / (1 << 20) as f64),
        "shared_by": status.shared_by,
    })
}

fn state(i: u64) -> QueueState {
    QueueState {
        queue: QUEUE.into(),
        approximate_depth: i % 2000,
        min_tasks: 1,
        max_tasks: 100,
        active_tasks: 1,
        random: i.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        ..Default::default()
    }
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
        ("rust_proportional", guests::PROPORTIONAL),
        ("c_proportional", guests::C_PROPORTIONAL),
        ("python_drain_time", guests::PYTHON_DRAIN_TIME),
        ("javascript_spare_capacity", guests::JAVASCRIPT_SPARE_CAPACITY),
    ] {
        let rule = engine.load_file(Path::new(guest)).unwrap();
        let mut instance = engine.instantiate(&rule, &[]).unwrap();
        let raw = time_calls(calls, |i| {
            black_box(instance.optimal_dequeue_task_count(&state(i)).unwrap());
        });
        let set = RuleSet::new(engine.clone(), [QueueRuleConfig { slot: DecisionSite::new(QUEUE).unwrap(), rule: Some(guest.into()), params: vec![] }]);
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
    let set = Arc::new(RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::new(QUEUE).unwrap(), rule: Some(path.clone()), params: vec![] }]));
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
        ("rust_proportional", guests::PROPORTIONAL),
        ("c_proportional", guests::C_PROPORTIONAL),
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
