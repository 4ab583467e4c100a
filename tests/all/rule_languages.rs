//! Rules written in Python, JavaScript and C, and the sha256-keyed compile cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use ebb::names::DecisionSite;
use ebb::rules::{DecisionSource, HandlerState, IdleContext, QueueRuleConfig, QueueState, RuleEngine, RuleInstance, RuleLimits, RuleSet};
use ebb_tests::guests;

const QUEUE: &str = "orders";

/// Kept across test runs, so the 18 MB Python rule is compiled once per target dir.
fn shared_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("rule-cache")
}

fn rules(engine: Arc<RuleEngine>, guest: &str, params: &[(&str, &str)]) -> (RuleSet, Vec<anyhow::Error>) {
    let params = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let set = RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::new(QUEUE).unwrap(), rule: Some(guest.into()), params }]);
    let errors = set.load_all();
    (set, errors)
}

fn state(depth: u64, throughput_per_sec: f64, active_tasks: u32) -> QueueState {
    QueueState { queue: QUEUE.into(), approximate_depth: depth, throughput_per_sec, active_tasks, min_tasks: 1, max_tasks: 1000, ..Default::default() }
}

/// The rule's back-off must match the built-in rule's (both compute it with the same loop).
fn assert_paper_back_off(set: &RuleSet) {
    let built_in = RuleSet::new(set.engine().clone(), [QueueRuleConfig { slot: DecisionSite::new(QUEUE).unwrap(), rule: None, params: vec![] }]);
    for idle_count in 0..=20 {
        for random in [0, 1 << 63, u64::MAX] {
            for active_tasks in [1, 3] {
                let ctx =
                    IdleContext { queue: QUEUE.into(), idle_count, active_tasks, min_interval_ms: 100, max_interval_ms: 60_000, random, ..Default::default() };
                let decision = set.decide_queue_empty(QUEUE, &ctx);
                assert_eq!(decision.source, DecisionSource::Rule);
                assert_eq!(decision.value, built_in.decide_queue_empty(QUEUE, &ctx).value, "idle {idle_count}, random {random}");
            }
        }
    }
}

#[test]
fn python_rule_sizes_tasks_to_drain_time() {
    let engine = RuleEngine::new(RuleLimits::default(), Some(shared_cache())).unwrap();
    let (set, errors) = rules(engine.clone(), guests::PYTHON_DRAIN_TIME, &[("target_drain_s", "5")]);
    assert!(errors.is_empty(), "{errors:?}");
    // 20 msg/s over 2 tasks = 10 msg/s a task; 500 messages in 5 s need 10 tasks.
    assert_eq!(set.decide_task_count(QUEUE, &state(500, 20.0, 2)).value, 10);
    // No throughput figure yet: the built-in rule's count, one task per batch (32 when the
    // state does not say).
    assert_eq!(set.decide_task_count(QUEUE, &state(500, 0.0, 1)).value, 16);
    assert_eq!(set.decide_task_count(QUEUE, &QueueState { batch_size: 10, ..state(500, 0.0, 1) }).value, 50);
    // Contract 0.2.0: 30 msg/s keep arriving, so 100 + 30 msg/s need 13 tasks of 10 msg/s.
    let arriving = QueueState { arrivals_per_sec: 30.0, ..state(500, 20.0, 2) };
    assert_eq!(set.decide_task_count(QUEUE, &arriving).value, 13);
    assert_paper_back_off(&set);

    let (_, errors) = rules(engine, guests::PYTHON_DRAIN_TIME, &[("target_drain_s", "soon")]);
    let error = format!("{:#}", errors[0]);
    assert!(error.contains("parameter \"target_drain_s\": cannot read 'soon' as a number"), "{error}");
}

#[test]
fn javascript_rule_adds_spare_capacity() {
    let engine = RuleEngine::new(RuleLimits::default(), Some(shared_cache())).unwrap();
    let (set, errors) = rules(engine.clone(), guests::JAVASCRIPT_SPARE_CAPACITY, &[]);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(set.decide_task_count(QUEUE, &state(50, 0.0, 1)).value, 13, "10 + 25% spare, rounded up");
    // Contract 0.2.0's option reaches JavaScript: messages that waited over max_wait_ms
    // (1 s) double the spare share; none, or a short wait, leave it.
    let waited = |age: Option<u64>| QueueState { oldest_message_age_ms: age, ..state(50, 0.0, 1) };
    assert_eq!(set.decide_task_count(QUEUE, &waited(Some(5_000))).value, 15, "10 + 50% spare");
    assert_eq!(set.decide_task_count(QUEUE, &waited(Some(1_000))).value, 13);
    assert_eq!(set.decide_task_count(QUEUE, &waited(None)).value, 13);
    assert_paper_back_off(&set);

    let (set, errors) = rules(engine.clone(), guests::JAVASCRIPT_SPARE_CAPACITY, &[("spare_percent", "100")]);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(set.decide_task_count(QUEUE, &state(5000, 0.0, 1)).value, 200);

    let (_, errors) = rules(engine, guests::JAVASCRIPT_SPARE_CAPACITY, &[("spare", "5")]);
    assert!(format!("{:#}", errors[0]).contains("unknown parameter spare (this rule takes: spare_percent, max_wait_ms)"));
}

fn pairs(params: &[(&str, &str)]) -> Vec<(String, String)> {
    params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The C example and its Rust counterpart (`example-rules/proportional`), configured alike.
fn c_and_rust(engine: &RuleEngine, params: &[(&str, &str)]) -> Result<(RuleInstance, RuleInstance)> {
    let params = pairs(params);
    let c = engine.instantiate(&*engine.load_file(Path::new(guests::C_PROPORTIONAL))?, &params)?;
    let rust = engine.instantiate(&*engine.load_file(Path::new(guests::PROPORTIONAL))?, &params)?;
    Ok((c, rust))
}

#[test]
fn c_rule_decides_as_its_rust_counterpart() -> Result<()> {
    let engine = RuleEngine::new(RuleLimits::default(), Some(shared_cache()))?;
    let (mut c, rust) = c_and_rust(&engine, &[])?;
    assert!(c.decides_concurrency(), "the C rule speaks contract 0.3.0");
    // Built with a 1 MiB stack (Zig's default, 16 MiB, would be held by every instance).
    assert!(c.memory_bytes() <= 2 * rust.memory_bytes(), "C {} bytes, Rust {} bytes", c.memory_bytes(), rust.memory_bytes());
    // The documented count: one task per 200 queued messages, rounded up.
    let tasks = |rule: &mut RuleInstance, depth| rule.optimal_dequeue_task_count(&state(depth, 0.0, 1)).unwrap();
    assert_eq!([0, 1, 200, 201, 3000].map(|depth| tasks(&mut c, depth)), [0, 1, 1, 2, 15]);

    let depths = [0, 1, 2, 6, 7, 8, 199, 200, 201, 999, 1000, 1001, 123_456_789, u64::from(u32::MAX) * 7, u64::MAX - 1, u64::MAX];
    for params in [&[][..], &[("per_task", "1")], &[("per_task", "7")], &[("per_task", " +1000 ")], &[("per_task", "3"), ("per_task", "1000")]] {
        let (mut c, mut rust) = c_and_rust(&engine, params)?;
        for depth in depths {
            assert_eq!(tasks(&mut c, depth), tasks(&mut rust, depth), "depth {depth}, params {params:?}");
        }
        for (idle_count, random, active_tasks, push_enabled, min_interval_ms, max_interval_ms) in [0, 1, 2, 5, 9, 10, 20, 199, 200, 201, u32::MAX]
            .into_iter()
            .flat_map(|idle| [0, 1, 1 << 62, 1 << 63, u64::MAX - 1024, u64::MAX].map(move |random| (idle, random)))
            .flat_map(|(idle, random)| [(1, false), (2, false), (1, true), (5, true)].map(move |(tasks, push)| (idle, random, tasks, push)))
            .flat_map(|(idle, random, tasks, push)| {
                [(100, 60_000), (800, 60_000), (0, 0), (0, 1), (5_000, 1_000), (1, u64::MAX)].map(move |(min, max)| (idle, random, tasks, push, min, max))
            })
        {
            let ctx =
                IdleContext { queue: QUEUE.into(), idle_count, active_tasks, min_interval_ms, max_interval_ms, push_enabled, random, ..Default::default() };
            assert_eq!(c.on_queue_empty(&ctx)?, rust.on_queue_empty(&ctx)?, "{ctx:?}");
        }
        let handlers = HandlerState { current_limit: 8, max_limit: 32, peak_in_flight: 8, waiting_tasks: 4, completed: 40, ..Default::default() };
        assert_eq!(c.max_concurrent_calls(&handlers)?, None, "the queue keeps its configured bound");
        assert_eq!(rust.max_concurrent_calls(&handlers)?, None);
    }
    Ok(())
}

#[test]
fn c_rule_rejects_bad_params_with_its_rust_counterparts_messages() -> Result<()> {
    let engine = RuleEngine::new(RuleLimits::default(), Some(shared_cache()))?;
    let c = engine.load_file(Path::new(guests::C_PROPORTIONAL))?;
    let rust = engine.load_file(Path::new(guests::PROPORTIONAL))?;
    for (params, expected) in [
        (&[("per_task", "ten")][..], "the rule rejected its parameters: parameter \"per_task\": cannot read \"ten\" as u64"),
        (&[("per_task", "0")], "parameter \"per_task\": must be at least 1"),
        (&[("per_task", "-5")], "cannot read \"-5\" as u64"),
        (&[("per_task", "")], "cannot read \"\" as u64"),
        (&[("per_task", "18446744073709551616")], "cannot read \"18446744073709551616\" as u64"),
        (&[("per_task", "1 000")], "cannot read \"1 000\" as u64"),
        (&[("per_task", "say \"hi\"\\")], r#"cannot read "say \"hi\"\\" as u64"#),
        (&[("per_task", "5"), ("per_task", "x")], "cannot read \"x\" as u64"),
        (&[("per_tsk", "5")], "unknown parameter per_tsk (this rule takes: per_task)"),
        (&[("b", "1"), ("per_task", "9"), ("a", "2"), ("b", "3")], "unknown parameter a, b (this rule takes: per_task)"),
    ] {
        let c_error = format!("{:#}", engine.instantiate(&c, &pairs(params)).err().unwrap_or_else(|| panic!("the C rule accepted {params:?}")));
        let rust_error = format!("{:#}", engine.instantiate(&rust, &pairs(params)).err().unwrap_or_else(|| panic!("the Rust rule accepted {params:?}")));
        assert!(c_error.contains(expected), "{params:?}: {c_error}");
        assert_eq!(c_error, rust_error, "{params:?}");
    }
    Ok(())
}

/// The C bindings hand each export its arguments to own: a rule that does not free the
/// queue's name leaks it at every decision, until its 64 MiB run out and it faults.
#[test]
fn c_rule_frees_what_each_decision_is_given() -> Result<()> {
    let engine = RuleEngine::new(RuleLimits::default(), Some(shared_cache()))?;
    let (mut c, _) = c_and_rust(&engine, &[])?;
    let queue = "q".repeat(4096);
    let queue_state = QueueState { queue: queue.clone(), ..state(500, 0.0, 1) };
    let ctx = IdleContext { queue: queue.clone(), idle_count: 3, min_interval_ms: 100, max_interval_ms: 60_000, ..Default::default() };
    let handlers = HandlerState { queue, current_limit: 8, max_limit: 32, ..Default::default() };
    let warm = |c: &mut RuleInstance| -> Result<()> {
        c.optimal_dequeue_task_count(&queue_state)?;
        c.on_queue_empty(&ctx)?;
        c.max_concurrent_calls(&handlers)?;
        Ok(())
    };
    warm(&mut c)?;
    let before = c.memory_bytes();
    // 4 KiB leaked 3 times a round would be 240 MiB over these rounds.
    for round in 0..20_000 {
        warm(&mut c).map_err(|e| e.context(format!("round {round}")))?;
    }
    assert_eq!(c.memory_bytes(), before, "linear memory grew over 60,000 decisions");
    Ok(())
}

/// A C rule copied into the rules folder of a running host (`ebb run`) is swapped in and
/// decides for delivered messages, without a fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_runs_a_queue_with_the_c_rule_from_its_rules_folder() {
    crate::rule_author::decides_in_a_running_host(Path::new(guests::C_PROPORTIONAL), "proportional-c").await;
}

#[test]
fn compiled_rules_are_cached_by_sha256_across_engines() -> Result<()> {
    let cache = tempfile::tempdir()?;
    let path = Path::new(guests::JAVASCRIPT_SPARE_CAPACITY);
    let first = RuleEngine::new(RuleLimits::default(), Some(cache.path().into()))?.load_file(path)?;
    assert!(!first.from_cache);
    let cached: Vec<_> = std::fs::read_dir(cache.path())?.flatten().map(|e| e.file_name().into_string().unwrap()).collect();
    assert_eq!(cached.len(), 1);
    assert!(cached[0].starts_with(&first.sha256), "cache entries are named by sha256: {cached:?}");

    // A restart: a new engine finds the artifact on disk instead of compiling.
    let second = RuleEngine::new(RuleLimits::default(), Some(cache.path().into()))?.load_file(path)?;
    assert!(second.from_cache);
    assert_eq!(second.sha256, first.sha256);
    assert!(second.compile_time < first.compile_time, "{:?} (cached) vs {:?}", second.compile_time, first.compile_time);
    Ok(())
}

/// Issue 25 (start fast whatever the rule): `ebb run` with a Python rule on an empty compile
/// cache answered nothing until the compile ended (7.2 s). Now the API answers and a message
/// is delivered while the rule compiles, decided by the built-in rule (`compiling`, counted);
/// then the rule is swapped in and reported in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_with_a_slow_to_compile_rule_delivers_before_the_compile_ends() {
    use crate::binary::{App, EBB, signal};
    let (app, app_addr) = App::start(std::time::Duration::ZERO).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("rules")).unwrap();
    std::fs::copy(guests::PYTHON_DRAIN_TIME, dir.path().join("rules/orders.wasm")).unwrap();
    let api = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let config = format!(
        "data_dir = \"{data}\"\nrules_dir = \"{rules}\"\n[api]\nlisten = \"{api}\"\ntoken = \"t\"\n\n[queues.orders]\nrule = \"orders.wasm\"\nhandler = {{ url = \"http://{app_addr}/work\" }}\n",
        data = dir.path().join("data").display(),
        rules = dir.path().join("rules").display(),
    );
    std::fs::write(dir.path().join("ebb.toml"), config).unwrap();
    let log = std::fs::File::create(dir.path().join("host.log")).unwrap();
    let host = std::process::Command::new(EBB)
        .arg("run")
        .arg("--config")
        .arg(dir.path().join("ebb.toml"))
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    // Killed if an assertion fails (a graceful stop is asserted at the end).
    let mut host = KillOnDrop(Some(host));
    let client = reqwest::Client::new();
    let status = || async {
        let response = client.get(format!("http://{api}/status")).bearer_auth("t").send().await.ok()?;
        serde_json::from_slice::<serde_json::Value>(&response.bytes().await.ok()?).ok()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let wait = |what: &str| assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
    while status().await.is_none() {
        wait("the API");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let sent = client.post(format!("http://{api}/queues/orders/messages")).bearer_auth("t").body("early").send().await.unwrap();
    assert!(sent.status().is_success(), "{sent:?}");
    while app.seen.lock().unwrap().is_empty() {
        wait("the message");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let queue = status().await.unwrap()["queues"][0].clone();
    assert_eq!(queue["rule"]["compiling"], true, "the message was delivered while the rule compiled: {queue}");
    assert!(queue["rule"]["decisions_while_compiling"].as_u64().unwrap() >= 1, "{queue}");
    let source = |q: &serde_json::Value| {
        [&q["last_task_count"], &q["last_queue_empty"]].iter().filter_map(|d| d["source"].as_str()).map(String::from).collect::<Vec<_>>()
    };
    assert!(source(&queue).iter().all(|s| s == "compiling") && !source(&queue).is_empty(), "{queue}");

    loop {
        let queue = status().await.unwrap()["queues"][0].clone();
        if queue["rule"]["file"] == "orders.wasm" {
            assert_eq!(queue["rule"]["compiling"], false, "{queue}");
            break;
        }
        wait("the Python rule in use");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let mut host = host.0.take().unwrap();
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
}

/// A child process killed (and reaped) when the test ends, however it ends.
pub(crate) struct KillOnDrop(pub(crate) Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
