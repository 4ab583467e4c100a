//! The rule author's loop: how long `ebb rule eval` and `ebb rule check` take for the example
//! rules, from an empty compile cache (`cold`) and with the rule already compiled (`warm`),
//! printed as JSON: `cargo bench -p ebb-tests --bench author` (`EBB_BENCH_AUTHOR_SAMPLES`,
//! default 5). Baseline, in the same run: `ebb --version`, the cost of starting the binary
//! at all (every command pays it).

use std::process::{Command, Stdio};
use std::time::Instant;

use ebb_tests::guests;
use serde_json::json;

const EBB: &str = env!("CARGO_BIN_EXE_ebb-under-test");

/// Runs `ebb args` with the compile cache in `cache`, returns milliseconds; panics on failure.
fn timed(args: &[&str], cache: &std::path::Path) -> f64 {
    let started = Instant::now();
    let status = Command::new(EBB).args(args).env("EBB_RULE_CACHE", cache).stdout(Stdio::null()).stderr(Stdio::null()).status().unwrap();
    let ms = started.elapsed().as_secs_f64() * 1e3;
    assert!(status.success(), "ebb {args:?} failed ({status})");
    ms
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    (values[values.len() / 2] * 10.0).round() / 10.0
}

fn main() {
    let samples: usize = std::env::var("EBB_BENCH_AUTHOR_SAMPLES").ok().and_then(|s| s.parse().ok()).unwrap_or(5).max(1);
    let scratch = tempfile::tempdir().unwrap();
    let start = median((0..samples).map(|_| timed(&["--version"], scratch.path())).collect());
    let mut report = json!({
        "samples": samples,
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "baseline_ebb_version_ms": start,
    });
    for (name, rule, param) in [
        ("rust_proportional", guests::PROPORTIONAL, "per_task=50"),
        ("python_drain_time", guests::PYTHON_DRAIN_TIME, "target_drain_s=5"),
        ("javascript_spare_capacity", guests::JAVASCRIPT_SPARE_CAPACITY, "spare_percent=25"),
    ] {
        let eval = ["rule", "eval", rule, "--task-count", r#"{"approximate_depth": 500}"#, "--param", param];
        let check = ["rule", "check", rule, "--param", param];
        let mut cold = Vec::new();
        let mut warm_eval = Vec::new();
        let mut warm_check = Vec::new();
        for _ in 0..samples {
            let cache = tempfile::tempdir().unwrap();
            cold.push(timed(&eval, cache.path()));
            warm_eval.push(timed(&eval, cache.path()));
            warm_check.push(timed(&check, cache.path()));
        }
        report[name] = json!({
            "eval_cold_ms": median(cold),
            "eval_warm_ms": median(warm_eval),
            "check_warm_ms": median(warm_check),
        });
    }
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}
