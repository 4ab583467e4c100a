//! Shadow rules: a faulting or removed shadow never touches the live decision; through the
//! binary, a shadow shows in `/status` and `/metrics` and `ebb rule promote` makes it live.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use ebb::names::DecisionSite;
use ebb::rules::{Decider, DecisionSource, QueueRuleConfig, RuleLimits, RuleSet, RuleState, ShadowCounts, Shadowed};
use ebb_tests::guests;

use crate::binary::{App, EBB, signal, wait_until};
use crate::rules::{QUEUE, engine, idle, state};

const BOUND: Duration = Duration::from_secs(30);

/// `QUEUE` deciding with `live`, its shadow with `shadow` (a path, maybe not there yet).
fn with_shadow(limits: RuleLimits, live: &Path, live_params: &[(&str, &str)], shadow: &Path) -> (Arc<RuleSet>, Shadowed) {
    let slot = DecisionSite::new(QUEUE).unwrap();
    let params = live_params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let set = Arc::new(RuleSet::new(
        engine(limits),
        [
            QueueRuleConfig { slot: slot.clone(), rule: Some(live.to_path_buf()), params },
            QueueRuleConfig { slot: slot.shadow(), rule: Some(shadow.to_path_buf()), params: vec![] },
        ],
    ));
    set.load_all();
    let decider = Shadowed::new(QUEUE, Arc::new(set.queue(QUEUE).unwrap()), Arc::new(set.queue(&slot.shadow()).unwrap()), 64).unwrap();
    (set, decider)
}

/// The live rule decides 3 tasks, from its rule, at every call; and its status is untouched.
fn assert_live_unchanged(set: &RuleSet, decider: &Shadowed, calls: u64) {
    for depth in 0..calls {
        let decision = decider.decide_task_count(&state(depth * 100));
        assert_eq!((decision.value, decision.source), (3, DecisionSource::Rule));
        decider.decide_queue_empty(&idle(1, 0));
    }
    let live = set.status(QUEUE).unwrap();
    assert_eq!((live.state, live.faults_total, live.quarantined), (RuleState::Loaded, 0, false));
}

#[test]
fn a_trapping_shadow_never_changes_the_live_decision_and_is_quarantined_on_its_own() {
    let limits = RuleLimits { quarantine_after: 3, ..RuleLimits::default() };
    let (set, decider) = with_shadow(limits, Path::new(guests::FIXED_TASKS), &[("tasks", "3")], Path::new(guests::TRAP));
    // Between faults the shadow's instance is rebuilt on a thread of its own (its decisions
    // are skipped meanwhile): go on deciding until its faults in a row quarantine it.
    let deadline = std::time::Instant::now() + BOUND;
    while decider.shadow_status().rule.unwrap().state != RuleState::Quarantined {
        assert!(std::time::Instant::now() < deadline, "the shadow was never quarantined: {:?}", decider.shadow_status().decisions);
        assert_live_unchanged(&set, &decider, 1);
        assert!(decider.flush(BOUND));
    }
    let counts = decider.shadow_status().decisions["task_count"];
    assert!(counts.fault >= 1 && counts.agree + counts.disagree == 0, "{counts:?}");
}

#[test]
fn a_looping_shadow_is_stopped_by_fuel_and_never_changes_the_live_decision() {
    let limits = RuleLimits { call_fuel: 1_000_000, quarantine_after: 0, ..RuleLimits::default() };
    let (set, decider) = with_shadow(limits, Path::new(guests::FIXED_TASKS), &[("tasks", "3")], Path::new(guests::LOOP_FOREVER));
    assert_live_unchanged(&set, &decider, 5);
    assert!(decider.flush(BOUND));
    let status = decider.shadow_status();
    assert!(status.decisions["task_count"].fault >= 1, "{:?}", status.decisions);
    assert!(status.rule.unwrap().last_error.unwrap().contains("fuel"));
}

#[test]
fn a_removed_shadow_is_skipped_and_a_disagreeing_one_is_counted() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let shadow = dir.path().join("candidate.wasm");
    std::fs::copy(guests::FIXED_TASKS, &shadow)?; // 7 tasks, against the live 3
    let (set, decider) = with_shadow(RuleLimits::default(), Path::new(guests::FIXED_TASKS), &[("tasks", "3")], &shadow);
    assert_live_unchanged(&set, &decider, 4);
    assert!(decider.flush(BOUND));
    assert_eq!(decider.shadow_status().decisions["task_count"], ShadowCounts { disagree: 4, ..Default::default() });
    assert_eq!(decider.shadow_status().file.as_deref(), Some("candidate.wasm"));
    std::fs::remove_file(&shadow)?;
    set.apply_file(&shadow)?;
    assert_live_unchanged(&set, &decider, 2);
    assert!(decider.flush(BOUND));
    let status = decider.shadow_status();
    assert_eq!(status.decisions["task_count"], ShadowCounts { disagree: 4, skipped: 2, ..Default::default() });
    // Both rules back off as the paper does when the queue is empty: those agree.
    assert_eq!(status.decisions["queue_empty"], ShadowCounts { agree: 4, skipped: 2, ..Default::default() });
    assert_eq!(status.agreement_percent, Some(50.0));
    assert_eq!(status.top_disagreements[0].magnitude, 4);
    Ok(())
}

struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn promote(config: &Path, queue: &str) -> (bool, String) {
    promote_with(config, queue, &[])
}

fn promote_with(config: &Path, queue: &str, flags: &[&str]) -> (bool, String) {
    let output = Command::new(EBB).args(["rule", "promote", queue, "--config"]).arg(config).args(flags).output().unwrap();
    (output.status.success(), format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_rule_shows_in_status_and_metrics_and_promote_makes_it_live() -> Result<()> {
    shadow_shows_and_promote_makes_it_live(("", ""), &[]).await
}

/// The body of [`a_shadow_rule_shows_in_status_and_metrics_and_promote_makes_it_live`] with
/// `backend` in the tables of queues `orders` and `plain` and `table` after them (the
/// backend's), the host given `env`.
pub(crate) async fn shadow_shows_and_promote_makes_it_live((backend, table): (&str, &str), env: &[(&str, String)]) -> Result<()> {
    use sha2::Digest as _;
    let (_app, app) = App::start(Duration::ZERO).await;
    let dir = tempfile::tempdir()?;
    let api = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    std::fs::create_dir_all(dir.path().join("rules"))?;
    std::fs::copy(guests::PAPER_DEFAULT, dir.path().join("rules/live.wasm"))?;
    std::fs::copy(guests::FIXED_TASKS, dir.path().join("rules/candidate.wasm"))?;
    let config = dir.path().join("ebb.toml");
    std::fs::write(
        &config,
        format!(
            "drain_timeout = \"10s\"\n[api]\nlisten = \"{api}\"\ntoken = \"t\"\n\n[queues.orders]\n{backend}rule = \"live.wasm\"\nshadow_rule = \"candidate.wasm\"\n\
             scale_interval = \"100ms\"\nhandler = {{ url = \"http://{app}/work\" }}\n\n[queues.plain]\n{backend}rule = \"live.wasm\"\nhandler = {{ url = \"http://{app}/work\" }}\n{table}"
        ),
    )?;
    let log = std::fs::File::create(dir.path().join("host.log"))?;
    let host = Command::new(EBB)
        .arg("run")
        .arg("--config")
        .arg(&config)
        .envs(env.iter().map(|(name, value)| (name, value)))
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()?;
    // A failed assertion must not leave the host running.
    let mut host = KillOnDrop(Some(host));
    let client = reqwest::Client::new();
    let get = |path: &'static str| {
        let request = client.get(format!("http://{api}{path}")).bearer_auth("t");
        async move { request.send().await.ok()?.text().await.ok() }
    };
    let orders =
        |status: &serde_json::Value| status["queues"].as_array().and_then(|qs| qs.iter().find(|q| q["queue"] == "orders").cloned()).unwrap_or_default();
    let status = || async { get("/status").await.and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok()).unwrap_or_default() };
    // Task counts are decided when work is detected: for a short backlog the paper's rule
    // decides fewer tasks than the candidate's 7.
    wait_until("the host's API", || async { reqwest::get(format!("http://{api}/healthz")).await.is_ok_and(|r| r.status().is_success()) }).await;
    // Both rules load in the background: messages handled before the shadow is there leave it
    // nothing to disagree about (a loaded machine drained the 50 first).
    wait_until("both rules loaded", || async {
        let queue = orders(&status().await);
        queue["rule"]["file"] == "live.wasm" && queue["shadow"]["rule"]["state"] == "loaded"
    })
    .await;
    for i in 0..50 {
        let sent = client.post(format!("http://{api}/queues/orders/messages")).bearer_auth("t").body(format!("m{i}")).send().await?;
        assert!(sent.status().is_success(), "{sent:?}");
    }
    wait_until("a shadow disagreement", || async { orders(&status().await)["shadow"]["decisions"]["task_count"]["disagree"].as_u64() > Some(0) }).await;
    let shadow = orders(&status().await)["shadow"].clone();
    assert_eq!(shadow["file"], "candidate.wasm", "{shadow}");
    assert_eq!(shadow["sha256"], hex::encode(sha2::Sha256::digest(std::fs::read(guests::FIXED_TASKS)?)));
    assert!(shadow["agreement_percent"].as_f64().is_some_and(|p| p < 100.0), "{shadow}");
    assert_eq!(shadow["top_disagreements"][0]["kind"], "task_count", "{shadow}");
    assert_eq!(orders(&status().await)["rule"]["file"], "live.wasm");
    let metrics = get("/metrics").await.unwrap_or_default();
    assert!(metrics.contains("ebb_shadow_decisions_total{queue=\"orders\",logical_queue=\"orders\",kind=\"task_count\",outcome=\"disagree\"}"), "{metrics}");
    assert!(!metrics.contains("ebb_shadow_decisions_total{queue=\"plain\""), "a queue without a shadow has no shadow metrics");

    // Hostile: a queue with no shadow, a queue that does not exist.
    let (ok, said) = promote(&config, "plain");
    assert!(!ok && said.contains("queue plain has no shadow_rule"), "{said}");
    let (ok, said) = promote(&config, "nope");
    assert!(!ok && said.contains("\"nope\" is not in the configuration"), "{said}");

    // Queue plain runs live.wasm too: a rename over it would change plain's rule, unasked.
    let (ok, said) = promote(&config, "orders");
    assert!(!ok && said.contains("queues.plain.rule") && said.contains("--force"), "{said}");
    assert!(dir.path().join("rules/candidate.wasm").exists(), "a refused promote renames nothing");
    let (ok, said) = promote_with(&config, "orders", &["--force"]);
    assert!(ok, "{said}");
    assert!(said.contains("candidate.wasm") && said.contains("live.wasm"), "{said}");
    assert!(!dir.path().join("rules/candidate.wasm").exists());
    let promoted = hex::encode(sha2::Sha256::digest(std::fs::read(guests::FIXED_TASKS)?));
    wait_until("the promoted rule in use", || async { orders(&status().await)["rule"]["sha256"] == promoted.as_str() }).await;
    wait_until("the shadow gone", || async { orders(&status().await)["shadow"]["rule"]["state"] == "error" }).await;

    // Hostile: the shadow's file is missing now.
    let (ok, said) = promote(&config, "orders");
    assert!(!ok && said.contains("candidate.wasm does not exist"), "{said}");
    assert_eq!(std::fs::read(dir.path().join("rules/live.wasm"))?, std::fs::read(guests::FIXED_TASKS)?, "a refused promote changes nothing");

    let mut host = host.0.take().unwrap();
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await?.success());
    Ok(())
}

#[test]
fn promote_refuses_differing_params_and_a_live_file_that_is_missing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("rules"))?;
    std::fs::copy(guests::FIXED_TASKS, dir.path().join("rules/candidate.wasm"))?;
    let config = dir.path().join("ebb.toml");
    // No host runs: promote says it could not ask one about the shadow's faults.
    let idle_api = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let write = |extra: &str| {
        std::fs::write(
            &config,
            format!(
                "[api]\nlisten = \"{idle_api}\"\n[queues.orders]\nrule = \"live.wasm\"\nshadow_rule = \"candidate.wasm\"\nhandler = {{ url = \"http://127.0.0.1:9/work\" }}\n{extra}"
            ),
        )
    };
    write("")?;
    let (ok, said) = promote(&config, "orders");
    assert!(!ok && said.contains("live.wasm does not exist"), "{said}");
    std::fs::copy(guests::PAPER_DEFAULT, dir.path().join("rules/live.wasm"))?;
    write("[queues.orders.shadow_rule_params]\ntasks = \"9\"\n")?;
    let (ok, said) = promote(&config, "orders");
    assert!(!ok && said.contains("rule_params (none) differ from shadow_rule_params (tasks=\"9\")"), "{said}");
    assert!(dir.path().join("rules/candidate.wasm").exists(), "a refused promote renames nothing");
    // A shadow that links to the live file: renaming the link would leave live.wasm a link
    // to itself, the rule's bytes gone.
    write("")?;
    std::fs::rename(dir.path().join("rules/candidate.wasm"), dir.path().join("rules/kept.wasm"))?;
    std::os::unix::fs::symlink("live.wasm", dir.path().join("rules/candidate.wasm"))?;
    let (ok, said) = promote(&config, "orders");
    assert!(!ok && said.contains("candidate.wasm is a symbolic link"), "{said}");
    assert_eq!(std::fs::read(dir.path().join("rules/live.wasm"))?, std::fs::read(guests::PAPER_DEFAULT)?, "the live rule is intact");
    std::fs::remove_file(dir.path().join("rules/candidate.wasm"))?;
    // Attack pass (session 11): a shadow that is a hard link of the live file was "promoted"
    // (rename(2) between two links of one file does nothing) and both names stayed.
    std::fs::hard_link(dir.path().join("rules/live.wasm"), dir.path().join("rules/candidate.wasm"))?;
    let (ok, said) = promote(&config, "orders");
    assert!(!ok && said.contains("are one file"), "{said}");
    std::fs::remove_file(dir.path().join("rules/candidate.wasm"))?;
    std::fs::rename(dir.path().join("rules/kept.wasm"), dir.path().join("rules/candidate.wasm"))?;
    write("[queues.orders.shadow_rule_params]\ntasks = \"9\"\n")?;
    let output = Command::new(EBB).args(["rule", "promote", "orders", "--with-rule-params", "--config"]).arg(&config).output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("no host answers") && stderr.contains("faults"), "says the shadow's faults were not known: {stderr}");
    assert_eq!(std::fs::read(dir.path().join("rules/live.wasm"))?, std::fs::read(guests::FIXED_TASKS)?);
    Ok(())
}

#[test]
fn a_shadow_faulting_on_concurrency_counts_a_fault_not_an_answer_of_none() {
    let (set, decider) = with_shadow(RuleLimits::default(), Path::new(guests::FIXED_TASKS), &[("tasks", "3")], Path::new(guests::TRAPS_DECIDING_CONCURRENCY));
    let window = crate::rules::handler_window(8, 10, 5.0);
    let live = set.queue(QUEUE).unwrap().decide_concurrency(&window);
    assert_eq!(decider.decide_concurrency(&window), live, "the live answer, whatever the shadow does");
    assert!(decider.flush(BOUND));
    let counts = decider.shadow_status().decisions["concurrency"];
    assert_eq!(counts, ShadowCounts { fault: 1, ..Default::default() });
}

/// Attack pass (session 11): a quarantined shadow's concurrency fallback ("none", keep the
/// bound) was compared as its answer and counted as agreeing, so an always-trapping shadow
/// showed 100 % agreement.
#[test]
fn a_quarantined_shadows_concurrency_fallback_is_skipped_not_counted_as_agreeing() {
    let limits = RuleLimits { quarantine_after: 1, ..RuleLimits::default() };
    let (set, decider) = with_shadow(limits, Path::new(guests::FIXED_TASKS), &[("tasks", "3")], Path::new(guests::TRAPS_DECIDING_CONCURRENCY));
    let window = crate::rules::handler_window(8, 10, 5.0);
    let deadline = std::time::Instant::now() + BOUND;
    while decider.shadow_status().rule.unwrap().state != RuleState::Quarantined {
        assert!(std::time::Instant::now() < deadline, "the shadow was never quarantined: {:?}", decider.shadow_status().decisions);
        decider.decide_concurrency(&window);
        assert!(decider.flush(BOUND));
    }
    let before = decider.shadow_status().decisions["concurrency"];
    let live = set.queue(QUEUE).unwrap().decide_concurrency(&window);
    for _ in 0..5 {
        assert_eq!(decider.decide_concurrency(&window), live);
    }
    assert!(decider.flush(BOUND));
    let after = decider.shadow_status().decisions["concurrency"];
    assert_eq!((after.agree, after.disagree), (before.agree, before.disagree), "a quarantined shadow was compared: {after:?}");
    assert_eq!(after.skipped, before.skipped + 5, "{after:?}");
}

/// A host in `dir` running `config` (an `[api]` section is added), its log in `dir/host.log`.
async fn run_host(dir: &Path, queues: &str) -> Result<(KillOnDrop, std::net::SocketAddr, std::path::PathBuf)> {
    let api = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = dir.join("ebb.toml");
    std::fs::write(&config, format!("drain_timeout = \"10s\"\n[api]\nlisten = \"{api}\"\ntoken = \"t\"\n\n{queues}"))?;
    let log = std::fs::File::create(dir.join("host.log"))?;
    let host = Command::new(EBB).arg("run").arg("--config").arg(&config).stdout(std::process::Stdio::null()).stderr(log).spawn()?;
    let host = KillOnDrop(Some(host));
    wait_until("the host's API", || async { reqwest::get(format!("http://{api}/healthz")).await.is_ok_and(|r| r.status().is_success()) }).await;
    Ok((host, api, config))
}

async fn stop_host(mut host: KillOnDrop) -> Result<()> {
    let mut host = host.0.take().unwrap();
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await?.success());
    Ok(())
}

/// The `shadow` of queue `queue` in the host's `/status`.
async fn shadow_of(api: std::net::SocketAddr, queue: &str) -> serde_json::Value {
    let response = reqwest::Client::new().get(format!("http://{api}/status")).bearer_auth("t").send().await;
    let status: serde_json::Value = match response {
        Ok(response) => response.bytes().await.ok().and_then(|bytes| serde_json::from_slice(&bytes).ok()).unwrap_or_default(),
        Err(_) => return serde_json::Value::Null,
    };
    status["queues"].as_array().and_then(|qs| qs.iter().find(|q| q["queue"] == queue).map(|q| q["shadow"].clone())).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_refuses_a_shadow_the_running_host_quarantined_unless_forced() -> Result<()> {
    let (_app, app) = App::start(Duration::ZERO).await;
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("rules"))?;
    std::fs::copy(guests::PAPER_DEFAULT, dir.path().join("rules/live.wasm"))?;
    std::fs::copy(guests::TRAP, dir.path().join("rules/candidate.wasm"))?;
    let queues = format!(
        "[rule_limits]\nquarantine_after = 2\n\n[queues.orders]\nrule = \"live.wasm\"\nshadow_rule = \"candidate.wasm\"\n\
         min_polling_interval = \"50ms\"\nmax_polling_interval = \"100ms\"\nhandler = {{ url = \"http://{app}/work\" }}\n"
    );
    let (host, api, config) = run_host(dir.path(), &queues).await?;
    // The queue is empty: each poll's queue-empty decision is one the shadow traps on.
    wait_until("the shadow quarantined", || async { shadow_of(api, "orders").await["rule"]["state"] == "quarantined" }).await;
    let (ok, said) = promote(&config, "orders");
    assert!(!ok && said.contains("quarantined") && said.contains("this rule always fails") && said.contains("--force"), "{said}");
    assert_eq!(std::fs::read(dir.path().join("rules/live.wasm"))?, std::fs::read(guests::PAPER_DEFAULT)?, "a refused promote changes nothing");
    let (ok, said) = promote_with(&config, "orders", &["--force"]);
    assert!(ok, "{said}");
    assert_eq!(std::fs::read(dir.path().join("rules/live.wasm"))?, std::fs::read(guests::TRAP)?);
    stop_host(host).await?;
    // The shadow's faults and quarantine were logged as the shadow's: nothing of it decided.
    let log = std::fs::read_to_string(dir.path().join("host.log"))?;
    let shadow_lines: Vec<&str> = log.lines().filter(|line| line.contains("ebb::rules::queue_rules") && line.contains("orders/shadow")).collect();
    assert!(shadow_lines.iter().any(|line| line.contains("quarantined")), "{log}");
    for line in shadow_lines {
        assert!(line.contains("shadow rule") && !line.contains("the built-in rule decides"), "{line}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_rule_that_cannot_load_is_logged_as_the_shadow_not_as_the_live_rule() -> Result<()> {
    let (_app, app) = App::start(Duration::ZERO).await;
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("rules"))?;
    std::fs::copy(guests::PAPER_DEFAULT, dir.path().join("rules/live.wasm"))?;
    std::fs::write(dir.path().join("rules/broken.wasm"), b"not a component")?;
    let queues = format!("[queues.orders]\nrule = \"live.wasm\"\nshadow_rule = \"broken.wasm\"\nhandler = {{ url = \"http://{app}/work\" }}\n");
    let (host, api, _config) = run_host(dir.path(), &queues).await?;
    wait_until("the shadow's load failed", || async { shadow_of(api, "orders").await["rule"]["state"] == "error" }).await;
    // A new broken content, while the host runs: the watcher refuses it.
    std::fs::write(dir.path().join("rules/broken.wasm"), b"still not a component")?;
    let log = dir.path().join("host.log");
    let broken_lines = || std::fs::read_to_string(&log).unwrap_or_default().lines().filter(|line| line.contains("broken.wasm")).count();
    wait_until("the watcher's refusal", || async { broken_lines() >= 2 }).await;
    stop_host(host).await?;
    let text = std::fs::read_to_string(&log)?;
    let lines: Vec<&str> = text.lines().filter(|line| line.contains("broken.wasm")).collect();
    assert!(lines.len() >= 2, "the load at start and the refused new content: {text}");
    for line in lines {
        assert!(line.contains("orders/shadow") && line.contains("shadow rule"), "a line about the shadow names its slot: {line}");
        assert!(!line.contains("the queue uses the built-in rule") && !line.contains("each queue keeps the rule it has"), "{line}");
    }
    Ok(())
}
