//! Rule state a person can see (issue 26, item 5): a refused newer file, a rule that cannot
//! load, faults per rule file, quarantine per decision, and a rule charged for its own work
//! only (CPU time and fuel), not for the time a busy host keeps it off a CPU.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ebb::rules::{DecisionSource, Export, RuleLimits, RuleLoad, RuleSet, RuleState};
use ebb_tests::guests;

use crate::binary::{App, EBB, signal, wait_until};
use crate::rules::{QUEUE, engine, idle, loaded, rules_for, sha_of, state, wait_for, watched_with_params};

#[test]
fn a_newer_file_whose_configure_rejects_the_parameters_is_shown_refused_while_the_old_rule_decides() {
    let w = watched_with_params(guests::FIXED_TASKS, RuleLimits::default(), Duration::from_millis(20), &[("tasks", "3")]);
    let status = w.rules.status(QUEUE).unwrap();
    assert_eq!((status.state, status.contract, status.refused.as_ref()), (RuleState::Loaded, Some("0.4.0"), None));

    // echo-state takes `field`, not `tasks`: its configure rejects the queue's parameters.
    w.deploy(guests::ECHO_STATE);
    wait_for("the new file to be refused", || w.rules.status(QUEUE).unwrap().refused.is_some());
    let status = w.rules.status(QUEUE).unwrap();
    let refused = status.refused.clone().unwrap();
    assert_eq!(refused.file, w.rule_path().display().to_string());
    assert_eq!(refused.sha256, Some(sha_of(guests::ECHO_STATE)));
    assert!(refused.reason.contains("rejected its parameters") && refused.reason.contains("unknown parameter tasks"), "{}", refused.reason);
    assert_eq!(status.state, RuleState::Loaded, "the old rule goes on deciding");
    assert_eq!(status.sha256, Some(sha_of(guests::FIXED_TASKS)));
    let decision = w.rules.decide_task_count(QUEUE, &state(5));
    assert_eq!((decision.value, decision.source), (3, DecisionSource::Rule));

    // The JSON of `/status` carries it as it is.
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["state"], "loaded");
    assert_eq!(json["refused"]["sha256"], sha_of(guests::ECHO_STATE));
    assert!(json["refused"]["at"].as_str().is_some_and(|at| at.ends_with('Z')), "{json}");

    // The file holds the rule in use again: nothing is refused any more.
    w.deploy(guests::FIXED_TASKS);
    wait_for("the refusal to clear", || w.rules.status(QUEUE).unwrap().refused.is_none());
    assert_eq!(w.rules.status(QUEUE).unwrap().sha256, Some(sha_of(guests::FIXED_TASKS)));

    // An unreadable file is refused too, without a sha256 (a link to a folder, put in place at
    // once: a removal on its own would put the queue back on the built-in rule).
    let staging = w.dir.path().join("rule.wasm.partial");
    std::os::unix::fs::symlink(w.dir.path(), &staging).unwrap();
    std::fs::rename(&staging, w.rule_path()).unwrap();
    wait_for("the directory to be refused", || w.rules.status(QUEUE).unwrap().refused.is_some());
    let refused = w.rules.status(QUEUE).unwrap().refused.unwrap();
    assert_eq!(refused.sha256, None);
    assert!(refused.reason.contains("is a directory"), "{}", refused.reason);
}

#[test]
fn a_rule_that_cannot_load_at_start_up_is_an_error_not_the_built_in_rule() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.wasm");
    // (rule file, its parameters, the reason it cannot load: none for the built-in rule)
    type Case<'a> = (Option<&'a Path>, &'a [(&'a str, &'a str)], Option<&'a str>);
    let cases: [Case; 3] = [
        (Some(Path::new(guests::FIXED_TASKS)), &[("tasks", "many")], Some("rejected its parameters")),
        (Some(&missing), &[], Some("does not exist")),
        (None, &[], None),
    ];
    for (rule, params, reason) in cases {
        let rules = Arc::new(rules_for(engine(RuleLimits::default()), rule, params));
        rules.load_all_in_background();
        wait_for("the load to end", || rules.load_state(QUEUE) != Some(RuleLoad::Compiling));
        let status = rules.status(QUEUE).unwrap();
        match reason {
            Some(reason) => {
                assert_eq!(status.state, RuleState::Error, "{status:?}");
                assert!(status.error.as_deref().is_some_and(|e| e.contains(reason)), "{status:?}");
                assert_eq!(status.configured_file, rule.map(|r| r.display().to_string()));
                assert_eq!(status.file, None);
                assert!(matches!(rules.load_state(QUEUE), Some(RuleLoad::Failed(failed)) if failed.contains(reason)), "readiness agrees");
            }
            None => {
                assert_eq!(
                    (status.state, status.error.as_deref(), status.configured_file.as_deref()),
                    (RuleState::BuiltIn, None, None),
                    "the built-in rule by choice"
                );
                assert_eq!(rules.load_state(QUEUE), Some(RuleLoad::BuiltIn));
            }
        }
        assert_eq!(rules.decide_task_count(QUEUE, &state(5)).source, DecisionSource::BuiltIn);
        assert_eq!(serde_json::to_value(&status).unwrap()["state"], if reason.is_some() { "error" } else { "built-in" });
    }
}

/// Rebuilds after each fault run off the decision path: wait for one before the next call.
fn settle(rules: &RuleSet) {
    wait_for("the rebuild", || !rules.status(QUEUE).unwrap().rebuilding);
}

#[test]
fn faults_are_counted_per_rule_file_and_in_total() {
    let limits = RuleLimits { quarantine_after: 0, ..RuleLimits::default() };
    let w = watched_with_params(guests::TRAPS_WHEN_EMPTY, limits, Duration::from_millis(20), &[]);
    for _ in 0..3 {
        assert_eq!(w.rules.decide_queue_empty(QUEUE, &idle(1, 0)).source, DecisionSource::Fallback);
        settle(&w.rules);
    }
    let status = w.rules.status(QUEUE).unwrap();
    assert_eq!((status.faults, status.faults_total), (3, 3));
    assert_eq!(status.consecutive_faults.on_queue_empty, 3);

    w.deploy(guests::FIXED_TASKS);
    wait_for("the new file", || w.rules.status(QUEUE).unwrap().sha256 == Some(sha_of(guests::FIXED_TASKS)));
    let status = w.rules.status(QUEUE).unwrap();
    assert_eq!((status.faults, status.faults_total), (0, 3), "a new file starts with no faults; the total stays");
    assert_eq!(status.consecutive_faults, Default::default());

    // Back to the faulty content: it is a new version, counted from 0 again.
    w.deploy(guests::TRAPS_WHEN_EMPTY);
    wait_for("the faulty file again", || w.rules.status(QUEUE).unwrap().sha256 == Some(sha_of(guests::TRAPS_WHEN_EMPTY)));
    assert_eq!(w.rules.decide_queue_empty(QUEUE, &idle(1, 0)).source, DecisionSource::Fallback);
    let status = w.rules.status(QUEUE).unwrap();
    assert_eq!((status.faults, status.faults_total), (1, 4));
}

#[test]
fn one_decision_that_always_traps_quarantines_the_rule_though_the_other_succeeds() {
    let limits = RuleLimits { quarantine_after: 3, ..RuleLimits::default() };
    let rules = loaded(guests::TRAPS_WHEN_EMPTY, limits);
    for round in 0..3 {
        // The task count succeeds between the faults: it used to reset the one run of faults.
        let decision = rules.decide_task_count(QUEUE, &state(5));
        assert_eq!((decision.value, decision.source), (2, DecisionSource::Rule), "round {round}");
        assert!(!rules.status(QUEUE).unwrap().quarantined, "round {round}");
        assert_eq!(rules.decide_queue_empty(QUEUE, &idle(1, 0)).source, DecisionSource::Fallback);
        settle(&rules);
    }
    let status = rules.status(QUEUE).unwrap();
    assert_eq!(status.state, RuleState::Quarantined);
    let quarantine = status.quarantine.expect("quarantined");
    assert_eq!((quarantine.export, quarantine.faults), (Some(Export::OnQueueEmpty), 3));
    assert!(quarantine.reason.contains("on-queue-empty always fails"), "{}", quarantine.reason);
    assert!(quarantine.since <= std::time::SystemTime::now());
    assert_eq!(status.consecutive_faults.optimal_dequeue_task_count, 0);
    // The whole rule is quarantined: its working decision is not trusted either.
    assert_eq!(rules.decide_task_count(QUEUE, &state(5)).source, DecisionSource::BuiltIn);
    assert_eq!(rules.load_state(QUEUE), Some(RuleLoad::Loaded), "a quarantined queue still works (readiness)");
    let json = serde_json::to_value(rules.status(QUEUE).unwrap()).unwrap();
    assert_eq!((&json["state"], &json["quarantine"]["export"], &json["quarantined"]), (&"quarantined".into(), &"on-queue-empty".into(), &true.into()));
}

// ---- a rule is charged for its own work ----

#[test]
fn an_endless_loop_is_stopped_by_fuel_under_the_default_limits() {
    let rules = loaded(guests::LOOP_FOREVER, RuleLimits::default());
    let started = Instant::now();
    assert_eq!(rules.decide_task_count(QUEUE, &state(5)).source, DecisionSource::Fallback);
    let took = started.elapsed();
    let error = rules.status(QUEUE).unwrap().last_error.unwrap();
    assert!(error.contains("ran out of its call fuel") && error.contains("rule_limits.call_fuel"), "{error}");
    assert!(took < RuleLimits::default().call_backstop(), "stopped in {took:?}");
    println!("an endless loop ran out of {} units of fuel in {took:?}", RuleLimits::default().call_fuel);
}

#[test]
fn a_rule_that_works_past_its_deadline_is_stopped_by_its_cpu_time() {
    let limits = RuleLimits { call_fuel: u64::MAX / 2, ..RuleLimits::default() };
    let rules = loaded(guests::LOOP_FOREVER, limits);
    assert_eq!(rules.decide_task_count(QUEUE, &state(5)).source, DecisionSource::Fallback);
    let error = rules.status(QUEUE).unwrap().last_error.unwrap();
    assert!(error.contains("ran past its call deadline of 10ms of CPU time") && error.contains("rule_limits.call_deadline"), "{error}");
}

#[test]
fn a_rule_that_waits_is_not_charged_until_the_backstop_then_faults() {
    // 30 ms asleep, three times the deadline of 10 ms, using next to no CPU.
    let limits = RuleLimits { quarantine_after: 1, ..RuleLimits::default() };
    let rules = rules_for(engine(limits.clone()), Some(Path::new(guests::PACED)), &[("sleep_ms", "30")]);
    assert!(rules.load_all().is_empty());
    for _ in 0..3 {
        let started = Instant::now();
        assert_eq!(rules.decide_task_count(QUEUE, &state(5)).source, DecisionSource::Rule);
        assert!(started.elapsed() >= Duration::from_millis(30));
    }
    let status = rules.status(QUEUE).unwrap();
    assert_eq!((status.faults, status.waited_calls, status.quarantined), (0, 3, false), "{status:?}");

    // Past the backstop (1 s for a 10 ms deadline), waiting is a fault.
    let rules = rules_for(engine(limits.clone()), Some(Path::new(guests::PACED)), &[("sleep_ms", "1200")]);
    assert!(rules.load_all().is_empty());
    assert_eq!(rules.decide_task_count(QUEUE, &state(5)).source, DecisionSource::Fallback);
    let status = rules.status(QUEUE).unwrap();
    let error = status.last_error.clone().unwrap();
    assert!(error.contains("past the wall-clock backstop (1s) of its call deadline of 10ms") && error.contains("waiting"), "{error}");
    assert!(status.quarantined, "a fault like any other");
}

/// Pins the calling thread to one CPU.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET and sched_setaffinity only touch
    // the set this function owns (and the calling thread's affinity).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let pinned = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(pinned, 0, "sched_setaffinity: {}", std::io::Error::last_os_error());
    }
}

/// Stops the spinning threads however the test ends.
struct Spinners(Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>);

impl Spinners {
    /// `count` threads spinning on `cpu`.
    fn start(cpu: usize, count: usize) -> Spinners {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..count)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    pin_to(cpu);
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::black_box(0u64);
                    }
                })
            })
            .collect();
        Spinners(stop, threads)
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        self.1.drain(..).for_each(|t| drop(t.join()));
    }
}

/// The soak's finding: on a host short of CPU, the scheduler kept a trivial rule's thread off
/// the CPU past its 10 ms deadline, and the wall-clock deadline charged that to the rule. Here
/// the calling thread shares one CPU with six spinning threads, so a call that needs a
/// fraction of a millisecond of CPU often takes tens of milliseconds: the rule is never
/// charged for it (quarantine_after = 1 would quarantine it at the first), and the calls that
/// the wall clock would have failed are counted as `waited_calls`. An endless loop on the same
/// starved thread is still stopped, by its fuel.
#[test]
fn a_rule_held_off_the_cpu_by_a_busy_host_is_not_charged_for_the_wait() {
    let deadline = Duration::from_millis(10);
    // Most of each call's time in the guest (about 1 ms of CPU; fuel raised for it), so that
    // the scheduler holds calls off inside the guest, where the deadline is checked, and not
    // only in the host's code around it (a CI run saw 1,508 calls held off, none inside).
    let limits = RuleLimits { call_deadline: deadline, call_fuel: 200_000_000, quarantine_after: 1, ..RuleLimits::default() };
    let rules = Arc::new(rules_for(engine(limits), Some(Path::new(guests::PACED)), &[("work", "1000000")]));
    assert!(rules.load_all().is_empty());
    let forever = Arc::new(loaded(guests::LOOP_FOREVER, RuleLimits::default()));
    // SAFETY: sched_getcpu only reads which CPU this thread is on.
    let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).expect("sched_getcpu");
    let _spinners = Spinners::start(cpu, 6);
    let caller = {
        let (rules, forever) = (rules.clone(), forever.clone());
        std::thread::spawn(move || {
            pin_to(cpu);
            let (mut calls, mut held_off, mut slowest) = (0u32, 0u32, Duration::ZERO);
            let started = Instant::now();
            while rules.status(QUEUE).unwrap().waited_calls < 5 && started.elapsed() < Duration::from_secs(60) {
                let call = Instant::now();
                let decision = rules.decide_task_count(QUEUE, &state(5));
                let took = call.elapsed();
                assert_eq!(decision.source, DecisionSource::Rule, "call {calls} ({took:?}): {:?}", rules.status(QUEUE).unwrap().last_error);
                slowest = slowest.max(took);
                held_off += u32::from(took > deadline * 2);
                calls += 1;
            }
            let looped = Instant::now();
            let source = forever.decide_task_count(QUEUE, &state(5)).source;
            (calls, held_off, slowest, source, looped.elapsed())
        })
    };
    let (calls, held_off, slowest, source, looped) = caller.join().unwrap();
    let status = rules.status(QUEUE).unwrap();
    println!("{calls} calls, {held_off} held off past twice the deadline, the slowest {slowest:?}; {} waited calls", status.waited_calls);
    assert!(
        held_off >= 1 && status.waited_calls >= 1,
        "the scheduler never held a call off past its deadline ({calls} calls, slowest {slowest:?}): inconclusive"
    );
    assert_eq!((status.faults, status.quarantined), (0, false), "{status:?}");
    assert_eq!(source, DecisionSource::Fallback, "the endless loop was stopped");
    let error = forever.status(QUEUE).unwrap().last_error.unwrap();
    assert!(error.contains("fuel"), "stopped by its fuel, not the clock: {error} (after {looped:?})");
}

// ---- through the binary: `ebb status`, `/status`, `/metrics`, `/readyz` ----

const TOKEN: &str = "t0ken";

struct Host {
    dir: tempfile::TempDir,
    api: std::net::SocketAddr,
}

impl Host {
    fn new(app: std::net::SocketAddr) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let api = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        std::fs::create_dir_all(dir.path().join("rules")).unwrap();
        std::fs::copy(guests::FIXED_TASKS, dir.path().join("rules/orders.wasm")).unwrap();
        let config = format!(
            "drain_timeout = \"5s\"\n[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n\n[queues.orders]\nrule = \"orders.wasm\"\nrule_params = {{ tasks = \"3\" }}\n\
             handler = {{ url = \"http://{app}/work\" }}\n"
        );
        std::fs::write(dir.path().join("ebb.toml"), config).unwrap();
        Host { dir, api }
    }

    fn deploy(&self, guest: &str) {
        let staging = self.dir.path().join("rules/orders.wasm.partial");
        std::fs::copy(guest, &staging).unwrap();
        std::fs::rename(&staging, self.dir.path().join("rules/orders.wasm")).unwrap();
    }

    async fn start(&self) -> Child {
        let log = std::fs::File::create(self.dir.path().join("host.log")).unwrap();
        let child = Command::new(EBB).arg("run").arg("--config").arg(self.dir.path().join("ebb.toml")).stdout(Stdio::null()).stderr(log).spawn().unwrap();
        let url = format!("http://{}/healthz", self.api);
        wait_until("the host's API", || async { reqwest::get(&url).await.is_ok_and(|r| r.status().is_success()) }).await;
        child
    }

    async fn stop(&self, host: Child) {
        signal(&host, "-TERM");
        let mut host = host;
        let exit = tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap();
        assert!(exit.success(), "{exit:?}");
    }

    async fn get(&self, path: &str) -> (reqwest::StatusCode, String) {
        let response = reqwest::Client::new().get(format!("http://{}{path}", self.api)).bearer_auth(TOKEN).send().await.unwrap();
        (response.status(), response.text().await.unwrap())
    }

    async fn rule(&self) -> serde_json::Value {
        let status: serde_json::Value = serde_json::from_str(&self.get("/status").await.1).unwrap();
        status["queues"][0]["rule"].clone()
    }

    /// `ebb status`, the table a person reads.
    fn status_text(&self) -> String {
        let output = Command::new(EBB).arg("status").arg("--config").arg(self.dir.path().join("ebb.toml")).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    }
}

/// A refused hot swap shows in `/status`, `ebb status` and `/metrics` while the old rule
/// decides; after a restart with the refused file on disk, the queue's rule is an error (not a
/// quiet built-in rule) in all of them and in `/readyz`, until the file is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_a_refused_file_and_after_a_restart_the_rule_that_cannot_load() {
    let (_app, app_addr) = App::start(Duration::ZERO).await;
    let site = Host::new(app_addr);
    let host = site.start().await;
    wait_until("the rule in use", || async { site.rule().await["state"] == "loaded" }).await;
    let text = site.status_text();
    let short = &sha_of(guests::FIXED_TASKS)[..12];
    assert!(text.contains(&format!("orders.wasm ({short}, contract 0.4.0, 0 faults)")), "{text}");

    site.deploy(guests::ECHO_STATE);
    wait_until("the refusal", || async { site.rule().await["refused"].is_object() }).await;
    let rule = site.rule().await;
    assert_eq!((&rule["state"], &rule["sha256"]), (&"loaded".into(), &sha_of(guests::FIXED_TASKS).into()), "{rule}");
    assert_eq!(rule["refused"]["sha256"], sha_of(guests::ECHO_STATE));
    let text = site.status_text();
    let refused_line = text.lines().find(|l| l.starts_with("orders: refused: ")).unwrap_or_else(|| panic!("{text}"));
    assert!(refused_line.contains(&format!("rules/orders.wasm (sha256 {})", &sha_of(guests::ECHO_STATE)[..12])), "{refused_line}");
    assert!(refused_line.contains("rejected its parameters: unknown parameter tasks"), "{refused_line}");
    assert!(refused_line.ends_with(&format!("orders.wasm ({short}) goes on deciding")), "{refused_line}");
    let metrics = site.get("/metrics").await.1;
    assert!(
        metrics.contains("ebb_rule_refused{queue=\"orders\",logical_queue=\"orders\"} 1")
            && metrics.contains("ebb_rule_load_failed{queue=\"orders\",logical_queue=\"orders\"} 0"),
        "{metrics}"
    );
    assert_eq!(site.get("/readyz").await.0, reqwest::StatusCode::OK, "the old rule works");
    site.stop(host).await;

    // Restarted with the refused file on disk: no rule of the queue's can load.
    let host = site.start().await;
    wait_until("the load error", || async { site.rule().await["state"] == "error" }).await;
    let rule = site.rule().await;
    assert!(rule["error"].as_str().is_some_and(|e| e.contains("rejected its parameters")), "{rule}");
    assert!(rule["configured_file"].as_str().is_some_and(|f| f.ends_with("rules/orders.wasm")) && rule["file"].is_null(), "{rule}");
    let text = site.status_text();
    assert!(text.contains("ERROR: orders.wasm not loaded (built-in decides)"), "{text}");
    let error_line = text.lines().find(|l| l.starts_with("orders: error: rule ")).unwrap_or_else(|| panic!("{text}"));
    assert!(error_line.contains("rejected its parameters") && error_line.ends_with("the built-in rule decides until the file is fixed"), "{error_line}");
    assert!(site.get("/metrics").await.1.contains("ebb_rule_load_failed{queue=\"orders\",logical_queue=\"orders\"} 1"));
    let (ready, body) = site.get("/readyz").await;
    assert_eq!(ready, reqwest::StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("its rule cannot load") && body.contains("rejected its parameters"), "{body}");

    // Fixed: the queue takes it, and is ready.
    site.deploy(guests::FIXED_TASKS);
    wait_until("the fixed rule", || async { site.rule().await["state"] == "loaded" }).await;
    wait_until("readiness", || async { site.get("/readyz").await.0 == reqwest::StatusCode::OK }).await;
    site.stop(host).await;
}
