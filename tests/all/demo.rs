//! `ebb demo` as an installed binary runs it: alone in an empty folder, no Rust toolchain, its
//! two example rules carried in the binary, and those rules the ones the example sources
//! build today.

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, Result};
use ebb::rules::{HandlerState, IdleContext, QueueState, RuleEngine, RuleLimits};
use ebb_tests::guests;

/// The rules `host/src/demo/rules/` keeps, each beside the one `tests/build.rs` builds from
/// `example-rules/` in this run.
const DEMO_RULES: &[(&str, &str)] = &[("paper_default.wasm", guests::PAPER_DEFAULT), ("proportional.wasm", guests::PROPORTIONAL)];

fn kept(file: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/src/demo/rules").join(file)
}

/// Fails when an example rule's source changed and the copy in the binary was not refreshed.
/// To refresh: `cp <built> host/src/demo/rules/<file>` with the path this test prints.
#[test]
fn the_demo_rules_in_the_binary_decide_as_the_example_sources_build_today() -> Result<()> {
    let engine = RuleEngine::new(RuleLimits::default(), None)?;
    for (file, built) in DEMO_RULES {
        let kept_bytes = std::fs::read(kept(file)).with_context(|| format!("reading the demo's {file}"))?;
        let mut ours = engine.instantiate(&*engine.load_bytes(file, &kept_bytes)?, &[])?;
        let mut fresh = engine.instantiate(&*engine.load_file(Path::new(built))?, &[])?;
        let stale = || format!("host/src/demo/rules/{file} is stale: refresh it with `cp {built} host/src/demo/rules/{file}`");
        for depth in [0, 1, 31, 32, 99, 100, 999, 1_000, 10_000, 1_000_000] {
            for active_tasks in [0, 1, 4, 16] {
                let state = QueueState { queue: "demo".into(), approximate_depth: depth, active_tasks, min_tasks: 1, max_tasks: 32, ..Default::default() };
                assert_eq!(ours.optimal_dequeue_task_count(&state)?, fresh.optimal_dequeue_task_count(&state)?, "depth {depth}: {}", stale());
            }
        }
        for idle_count in [0, 1, 2, 5, 30] {
            for random in [0, 12_345, u64::MAX] {
                let idle = IdleContext {
                    queue: "demo".into(),
                    idle_count,
                    active_tasks: 2,
                    min_interval_ms: 100,
                    max_interval_ms: 5_000,
                    random,
                    ..Default::default()
                };
                assert_eq!(ours.on_queue_empty(&idle)?, fresh.on_queue_empty(&idle)?, "idle {idle_count}: {}", stale());
            }
        }
        let window =
            HandlerState { queue: "demo".into(), current_limit: 8, max_limit: 32, in_flight: 8, completed: 40, latency_mean_ms: 20.0, ..Default::default() };
        assert_eq!(ours.max_concurrent_calls(&window)?, fresh.max_concurrent_calls(&window)?, "{}", stale());
    }
    Ok(())
}

/// The goal: the binary copied alone into an empty folder, with nothing on PATH (no
/// cargo, no rustup), runs the demo to its summary, the rule swap included.
#[test]
fn the_binary_alone_in_an_empty_folder_runs_the_demo_with_nothing_on_path() -> Result<()> {
    let folder = tempfile::tempdir()?;
    let ebb = folder.path().join("ebb");
    std::fs::copy(crate::binary::EBB, &ebb)?;
    let empty_path = folder.path().join("no-tools");
    std::fs::create_dir(&empty_path)?;
    let output = Command::new(&ebb)
        .args(["demo", "--duration", "6s", "--burst", "300", "--trickle", "10"])
        .current_dir(folder.path())
        .env_clear()
        .env("PATH", &empty_path)
        .env("HOME", folder.path())
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", output.status);
    assert!(stdout.contains("deployed the proportional rule"), "the rule swap happened:\n{stdout}");
    let processed: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("messages processed:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("a summary line with the count:\n{stdout}"))?;
    assert!(processed >= 300, "the first burst was processed ({processed}):\n{stdout}");
    Ok(())
}
