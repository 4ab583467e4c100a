//! `ebb bench` through the binary: a short run of `http` reports every figure, and leaves no
//! server process behind.

use std::process::Command;

use serde_json::Value;

use crate::binary::EBB;

/// A figure of the report: a finite number above zero.
fn positive(value: &Value, what: &str) -> f64 {
    let number = value.as_f64().unwrap_or_else(|| panic!("{what} is not a number: {value}"));
    assert!(number.is_finite() && number > 0.0, "{what} is {number}, not finite and positive");
    number
}

#[test]
fn bench_http_reports_every_figure_and_leaves_no_server_behind() {
    let output = Command::new(EBB)
        .args(["bench", "http", "--json", "--messages", "200", "--redb-messages", "100", "--rounds", "1", "--sizes", "256", "--concurrency", "4"])
        .output()
        .unwrap();
    assert!(output.status.success(), "ebb bench http failed: {}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&output.stdout)));

    let cells = report["cells"].as_array().expect("cells");
    assert_eq!(cells.len(), 1, "one size at one concurrency: {report:#}");
    let cell = &cells[0];
    assert_eq!((cell["body_bytes"].as_u64(), cell["concurrency"].as_u64()), (Some(256), Some(4)));
    for contender in ["reqwest_loop", "redb_loop", "ebb", "ebb_fixed_tasks"] {
        let figures = &cell["contenders"][contender];
        positive(&figures["msg_per_s"], &format!("{contender} msg_per_s"));
        positive(&figures["cpu_ms_per_1000"], &format!("{contender} cpu_ms_per_1000"));
        // The app's CPU is read in clock ticks: a short run may read zero.
        let app = figures["app_cpu_ms_per_1000"].as_f64().expect("the app's CPU, read from /proc");
        assert!(app.is_finite() && app >= 0.0, "{contender} app_cpu_ms_per_1000 is {app}");
        let store = &figures["store_bytes_written_per_message"];
        if contender == "reqwest_loop" {
            assert!(store.is_null(), "the reqwest loop has no store: {figures}");
        } else {
            for part in ["put", "processing", "total", "total_over_body"] {
                positive(&store[part], &format!("{contender} store bytes {part}"));
            }
        }
    }
    for variant in ["ebb", "ebb_fixed_tasks"] {
        let verdict = &cell["verdicts"][variant];
        for ratio in [
            "throughput_vs_reqwest_loop",
            "cpu_per_message_vs_reqwest_loop",
            "throughput_vs_redb_loop",
            "store_bytes_per_message_vs_body",
            "store_bytes_processing_per_message_vs_body",
        ] {
            positive(&verdict["ratios"][ratio], &format!("{variant} {ratio}"));
        }
        let goals: Vec<&str> = verdict["goals"].as_array().expect("goals").iter().map(|g| g["goal"].as_str().expect("a goal's name")).collect();
        // 256 B: no bytes-written goal (the issue sets it at 16 KiB).
        assert_eq!(goals, ["cpu_per_message_vs_reqwest_loop", "throughput_vs_reqwest_loop", "throughput_vs_redb_loop"]);
        for goal in verdict["goals"].as_array().unwrap() {
            positive(&goal["value"], &format!("{variant} {goal}"));
            assert!(goal["met"].is_boolean(), "{goal}");
        }
    }
    assert!(report["goals"].as_u64() == Some(6) && report["all_goals_met"].is_boolean(), "{report:#}");

    let pid = report["server"]["pid"].as_i64().expect("the server's pid") as libc::pid_t;
    // SAFETY: signal 0 only asks whether the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    assert!(!alive, "the bench server (pid {pid}) is still running after the bench ended");
}

#[test]
fn bench_http_refuses_flags_out_of_their_ranges() {
    for (args, expected) in [
        (&["--concurrency", "0"][..], "--concurrency"),
        (&["--sizes", "65537"][..], "--sizes"),
        (&["--rounds", "21"][..], "--rounds"),
        (&["--messages", "100000", "--sizes", "65536"][..], "at most 2 GiB"),
        (&["--messages", "10", "--redb-messages", "11"][..], "--redb-messages: at most --messages (10)"),
    ] {
        let output = Command::new(EBB).args(["bench", "http"]).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains(expected), "ebb bench http {args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "ebb bench http {args:?} ran: {}", String::from_utf8_lossy(&output.stdout));
    }
}

#[test]
fn bench_knee_refuses_an_app_that_takes_no_time() {
    let output = Command::new(EBB).args(["bench", "knee", "--latency", "0ms"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("--latency: more than 0"), "{stderr}");
    assert!(output.stdout.is_empty(), "ebb bench knee --latency 0ms ran: {}", String::from_utf8_lossy(&output.stdout));
}

#[test]
fn bench_record_runs_recording_on_and_off_alternating_and_reports_the_cost() {
    let output = Command::new(EBB).args(["bench", "record", "--json", "--messages", "300", "--rounds", "2", "--concurrency", "8"]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    positive(&report["off_msg_per_sec"], "off_msg_per_sec");
    positive(&report["on_msg_per_sec"], "on_msg_per_sec");
    assert!(report["throughput_cost_percent"].is_number() && report["goal_met"].is_boolean(), "{report}");
    // Off then on, then on then off: the order alternates so drift hits both alike.
    let order: Vec<bool> = report["runs"].as_array().unwrap().iter().map(|r| r["recording"].as_bool().unwrap()).collect();
    assert_eq!(order, [false, true, true, false]);
}

#[test]
fn bench_trace_memory_with_a_collector_that_never_answers_counts_drops_and_rss_stays_flat() {
    // The short version of the 10-minute goal (docs/benchmarks.md): 30 s of load.
    let output = Command::new(EBB).args(["bench", "trace-memory", "--json", "--duration", "30s", "--rate", "200", "--host-binary", EBB]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let (traced, untraced) = (&report["traced"], &report["untraced"]);
    positive(&traced["processed"], "traced processed");
    positive(&untraced["processed"], "untraced processed");
    assert!(positive(&traced["spans_dropped"], "traced spans_dropped") <= positive(&traced["spans_made"], "traced spans_made"), "{report}");
    assert_eq!(untraced["spans_made"], 0, "{report}");
    // The span queue is full after a third of the run: from then on, nothing grows.
    let growth = positive(&traced["rss_end_mib"], "rss_end_mib") - positive(&traced["rss_warm_mib"], "rss_warm_mib");
    assert!(growth <= 8.0, "the traced host's RSS grew {growth:.1} MiB after its span queue filled: {report}");
    assert!(report["rss_difference_mib"].as_f64().unwrap() <= 20.0, "{report}");
}
