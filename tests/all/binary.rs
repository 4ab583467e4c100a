//! End to end through the binary: `ebb run` + `ebb send` + `ebb status` + a handler app,
//! graceful SIGTERM, and SIGKILL of the host mid-load.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use ebb::status::{HostStatus, QueueStatus};
use ebb_tests::guests;

pub(crate) const EBB: &str = env!("CARGO_BIN_EXE_ebb-under-test");
const TOKEN: &str = "t0ken";

/// The application the host forwards messages to: records (message id, body), answers 200.
#[derive(Clone, Default)]
pub(crate) struct App {
    pub(crate) seen: Arc<Mutex<Vec<(String, String)>>>,
}

impl App {
    pub(crate) async fn start(delay: Duration) -> (App, SocketAddr) {
        let app = App::default();
        let record = app.clone();
        let router = axum::Router::new().route(
            "/work",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let record = record.clone();
                async move {
                    tokio::time::sleep(delay).await;
                    let id = headers.get("ebb-message-id").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
                    record.seen.lock().unwrap().push((id, String::from_utf8_lossy(&body).into_owned()));
                    StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        (app, addr)
    }

    fn bodies(&self) -> BTreeSet<String> {
        self.seen.lock().unwrap().iter().map(|(_, body)| body.clone()).collect()
    }
}

pub(crate) struct Site {
    dir: tempfile::TempDir,
    api: SocketAddr,
    /// `PATH` for the processes it starts (default: the test's own).
    path: Option<std::ffi::OsString>,
    /// More environment variables for the processes it starts.
    env: Vec<(&'static str, String)>,
}

impl Site {
    pub(crate) fn new(app: SocketAddr, lease: &str) -> Site {
        let dir = tempfile::tempdir().unwrap();
        let api: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        std::fs::create_dir_all(dir.path().join("rules")).unwrap();
        std::fs::copy(guests::PAPER_DEFAULT, dir.path().join("rules/orders.wasm")).unwrap();
        let config = format!(
            "drain_timeout = \"10s\"\n[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n\n[queues.orders]\nrule = \"orders.wasm\"\nlease_duration = \"{lease}\"\nmax_polling_interval = \"2s\"\nhandler = {{ url = \"http://{app}/work\" }}\n"
        );
        std::fs::write(dir.path().join("ebb.toml"), config).unwrap();
        Site { dir, api, path: None, env: Vec::new() }
    }

    /// [`Site::new`] with queue `orders` on SQS at `moto` (its own: the name is fixed),
    /// reached with moto's test keys.
    pub(crate) fn on_sqs(app: SocketAddr, lease: &str, moto: &ebb_tests::moto::Moto) -> Site {
        let site = Site::new(app, lease).with_moto_keys();
        let plain = std::fs::read_to_string(site.config()).unwrap();
        let config = format!("{}\n{}", plain.replace("[queues.orders]\n", "[queues.orders]\nbackend = \"sqs\"\n"), aws_table(moto));
        std::fs::write(site.config(), config).unwrap();
        site
    }

    /// Its processes get moto's test keys in the SDK's environment variables.
    pub(crate) fn with_moto_keys(mut self) -> Site {
        self.env = vec![("AWS_ACCESS_KEY_ID", "testing".into()), ("AWS_SECRET_ACCESS_KEY", "testing".into())];
        self
    }

    /// A command running the binary, with this site's `PATH` and environment.
    fn command(&self) -> Command {
        let mut command = Command::new(EBB);
        if let Some(path) = &self.path {
            command.env("PATH", path);
        }
        command.envs(self.env.iter().map(|(name, value)| (name, value)));
        command
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("ebb.toml")
    }

    fn ebb(&self, args: &[&str]) -> Output {
        let output = self.command().args(args).arg("--config").arg(self.config()).output().unwrap();
        assert!(output.status.success(), "ebb {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
        output
    }

    async fn start_host(&self) -> Child {
        let log = std::fs::File::create(self.dir.path().join("host.log")).unwrap();
        let child = self.command().arg("run").arg("--config").arg(self.config()).stdout(Stdio::null()).stderr(log).spawn().unwrap();
        let url = format!("http://{}/healthz", self.api);
        wait_until("the host's API", || async { reqwest::get(&url).await.is_ok_and(|r| r.status().is_success()) }).await;
        child
    }

    async fn post(&self, body: String) -> reqwest::StatusCode {
        let client = reqwest::Client::new();
        let url = format!("http://{}/queues/orders/messages", self.api);
        client.post(url).bearer_auth(TOKEN).body(body).send().await.unwrap().status()
    }

    async fn status(&self) -> serde_json::Value {
        serde_json::from_slice(&self.ebb(&["status", "--json"]).stdout).unwrap()
    }

    /// [`Site::status`] read into the library's types, as an embedder reads it.
    async fn typed_status(&self) -> ebb::status::HostStatus {
        serde_json::from_slice(&self.ebb(&["status", "--json"]).stdout).unwrap()
    }

    /// The first queue partition's status.
    async fn first_queue(&self) -> ebb::status::QueueStatus {
        self.typed_status().await.queues.into_iter().next().expect("a queue in the status")
    }

    /// Waits until every queue decides with its rule (rules load in the background at start).
    async fn rule_in_use(&self) {
        let in_use = |status: HostStatus| status.queues.iter().all(|q| rule_file(q) == Some("orders.wasm"));
        wait_until("the rule in use", || async { in_use(self.typed_status().await) }).await;
    }
}

/// The `[aws]` table of a config on `moto`: its region and endpoint.
pub(crate) fn aws_table(moto: &ebb_tests::moto::Moto) -> String {
    format!("[aws]\nregion = \"{}\"\nendpoint = \"{}\"\n", ebb_tests::moto::REGION, moto.endpoint())
}

/// The file of the rule a queue's status shows in use.
fn rule_file(queue: &QueueStatus) -> Option<&str> {
    queue.rule.as_ref().and_then(|r| r.file.as_deref())
}

/// The sha256 of the rule a queue's status shows in use.
fn rule_sha256(queue: &QueueStatus) -> Option<&str> {
    queue.rule.as_ref().and_then(|r| r.sha256.as_deref())
}

pub(crate) async fn wait_until<F: Future<Output = bool>>(what: &str, mut condition: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn signal(child: &Child, name: &str) {
    assert!(Command::new("kill").args([name, &child.id().to_string()]).status().unwrap().success());
}

async fn store_count(data_dir: &Path) -> u64 {
    use ebb::queue::QueueClient;
    let store = ebb::queue::embedded::EmbeddedStore::open(data_dir, Default::default()).unwrap();
    store.queue("orders").approximate_count().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_send_and_status_through_the_binary() {
    let (app, app_addr) = App::start(Duration::from_millis(1)).await;
    let site = Site::new(app_addr, "30s");
    // No host yet: `ebb send` writes the store directly.
    let output = site.ebb(&["send", "orders", "early", "--count", "5"]);
    assert!(String::from_utf8_lossy(&output.stdout).contains("no host running"));

    let mut host = site.start_host().await;
    let output = site.ebb(&["send", "orders", "via-api", "--count", "40"]);
    assert!(String::from_utf8_lossy(&output.stdout).contains("via http://"));
    wait_until("45 messages handled", || async { app.seen.lock().unwrap().len() >= 45 }).await;
    assert_eq!(app.bodies(), BTreeSet::from(["early".to_string(), "via-api".to_string()]));

    site.rule_in_use().await;
    let status = site.status().await;
    let queue = &status["queues"][0];
    assert_eq!(queue["processed"], 45);
    assert_eq!(queue["rule"]["file"], "orders.wasm");
    let table = String::from_utf8(site.ebb(&["status"]).stdout).unwrap();
    assert!(table.contains("orders") && table.contains("orders.wasm"), "{table}");

    // The token is required.
    let unauthenticated = reqwest::get(format!("http://{}/status", site.api)).await.unwrap();
    assert_eq!(unauthenticated.status(), reqwest::StatusCode::UNAUTHORIZED);
    let metrics = reqwest::Client::new().get(format!("http://{}/metrics", site.api)).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("ebb_messages_processed_total{queue=\"orders\",logical_queue=\"orders\"} 45"), "{metrics}");

    signal(&host, "-TERM");
    let exit = tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap();
    assert!(exit.success(), "graceful shutdown exits 0: {exit:?}");
    assert_eq!(store_count(&site.dir.path().join("ebb-data")).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_host_mid_load_loses_no_message() {
    let (app, app_addr) = App::start(Duration::from_millis(20)).await;
    let site = Site::new(app_addr, "2s");
    let mut host = site.start_host().await;
    let sent: BTreeSet<String> = (0..600).map(|i| format!("m{i}")).collect();
    for body in &sent {
        assert_eq!(site.post(body.clone()).await, reqwest::StatusCode::CREATED);
    }
    wait_until("some messages handled", || async { app.seen.lock().unwrap().len() >= 100 }).await;
    host.kill().unwrap(); // SIGKILL, mid-load
    host.wait().unwrap();
    let before_restart = app.bodies().len();
    assert!(before_restart < sent.len(), "killed before the end ({before_restart} handled)");

    let mut host = site.start_host().await;
    wait_until("every message handled", || async { app.bodies().len() == sent.len() }).await;
    assert_eq!(app.bodies(), sent, "no message lost");
    // Copies leased by the killed host come back after their lease and are handled again
    // (at least once): wait for the queue to empty before stopping.
    wait_until("the queue empty", || async {
        let queue = site.first_queue().await;
        queue.approximate_depth == 0 && queue.in_flight == 0
    })
    .await;
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
    assert_eq!(store_count(&site.dir.path().join("ebb-data")).await, 0, "every message deleted after its handler succeeded");
}

fn ebb_raw(args: &[&str]) -> Output {
    Command::new(EBB).args(args).output().unwrap()
}

/// Issue 26 (a fast loop): `ebb rule check` and `eval` keep compiled rules in the user's
/// compile cache (`EBB_RULE_CACHE` here), so the second look at a rule does not compile it;
/// an empty `EBB_RULE_CACHE` turns the cache off.
#[test]
fn rule_check_and_eval_reuse_what_they_compiled() {
    let cache = tempfile::tempdir().unwrap();
    let with_cache = |args: &[&str]| Command::new(EBB).args(args).env("EBB_RULE_CACHE", cache.path()).output().unwrap();
    let first = with_cache(&["rule", "check", guests::PROPORTIONAL]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    assert!(!String::from_utf8_lossy(&first.stdout).contains("from the cache"), "{}", String::from_utf8_lossy(&first.stdout));
    assert_eq!(
        std::fs::read_dir(cache.path()).unwrap().flatten().filter(|e| !e.file_name().to_string_lossy().starts_with('.')).count(),
        1,
        "one artifact kept"
    );
    let second = with_cache(&["rule", "check", guests::PROPORTIONAL]);
    assert!(String::from_utf8_lossy(&second.stdout).contains("(compiled before: from the cache)"), "{}", String::from_utf8_lossy(&second.stdout));
    let eval = with_cache(&["rule", "eval", guests::PROPORTIONAL, "--task-count", r#"{"approximate_depth": 50}"#]);
    assert!(eval.status.success(), "{}", String::from_utf8_lossy(&eval.stderr));
    let off = Command::new(EBB).args(["rule", "check", guests::PROPORTIONAL]).env("EBB_RULE_CACHE", "").output().unwrap();
    assert!(off.status.success() && !String::from_utf8_lossy(&off.stdout).contains("from the cache"), "{}", String::from_utf8_lossy(&off.stdout));
}

/// Review note (session 6): the note echoed the whole value of EBB_RULE_CACHE, 5,000
/// characters included.
#[test]
fn an_unusable_rule_cache_is_noted_briefly_and_the_rule_still_checked() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let cache = file.join("x".repeat(5_000));
    let output = Command::new(EBB).args(["rule", "check", guests::PROPORTIONAL]).env("EBB_RULE_CACHE", &cache).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let note = stderr.lines().find(|l| l.starts_with("note: no compile cache")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(note.len() < 1_000 && note.contains("bytes cut"), "{} bytes: {note}", note.len());
}

/// Review defect: pointed at a server that answers other JSON, `ebb status` printed an empty
/// table and exited 0.
#[tokio::test]
async fn status_refuses_an_answer_that_is_not_an_ebb_status() {
    let router = axum::Router::new().route("/status", axum::routing::get(|| async { axum::Json(serde_json::json!({ "hello": 1 })) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let (_app, app) = App::start(Duration::ZERO).await;
    let site = Site::new(app, "30s");
    let config = std::fs::read_to_string(site.config()).unwrap().replace(&site.api.to_string(), &other.to_string());
    std::fs::write(site.config(), config).unwrap();
    let output = tokio::task::spawn_blocking(move || site.command().arg("status").arg("--config").arg(site.config()).output().unwrap()).await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("answered JSON that is not an ebb status"), "{stderr}");
}

/// Review defect: `--param per_task=5 --param per_task=6` used 6 without a word.
#[test]
fn a_rule_parameter_given_twice_is_refused() {
    for command in ["check", "eval"] {
        let mut args = vec!["rule", command, guests::PROPORTIONAL, "--param", "per_task=5", "--param", "per_task=6"];
        if command == "eval" {
            args.extend(["--task-count", "{}"]);
        }
        let output = Command::new(EBB).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{command}: {stderr}");
        assert!(stderr.contains("--param per_task: given twice"), "{command}: {stderr}");
    }
}

#[test]
fn rule_eval_shows_what_the_rule_printed_without_a_log_setting() {
    let output = Command::new(EBB)
        .args(["rule", "eval", guests::TRAP, "--task-count", r#"{"approximate_depth": 42}"#])
        .env_remove("RUST_LOG")
        .env_remove("EBB_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "the rule traps: {stderr}");
    assert!(stderr.contains("rule output: about to fail at depth 42"), "{stderr}");
}

#[test]
fn rule_check_describes_a_rule_and_fails_with_the_reason() {
    let output = ebb_raw(&["rule", "check", guests::THRESHOLD_TABLE, "--param", "table=10:1, *:4"]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for field in [
        "sha256:",
        "compile time:",
        "contract:     ebb:rules/decisions@0.4.0\n",
        "exports:      ebb:rules/decisions@0.4.0",
        "failures:     not decided by the rule",
        "imports:",
        "configure:    ok (1 parameter)",
    ] {
        assert!(text.contains(field), "missing {field:?} in\n{text}");
    }
    // A rule built against 0.1.0 still checks, and is reported as such.
    let output = ebb_raw(&["rule", "check", guests::CONTRACT_0_1]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(text.contains("contract:     ebb:rules/decisions@0.1.0 (an older contract, still served"), "{text}");
    let output = ebb_raw(&["rule", "check", guests::FUTURE_VERSION]);
    assert_eq!(output.status.code(), Some(1));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(
        error.contains("ebb:rules/decisions@0.9.0, but this host speaks ebb:rules/decisions@0.4.0 or ebb:rules/decisions@0.3.0 or ebb:rules/decisions@0.2.0 or ebb:rules/decisions@0.1.0"),
        "{error}"
    );
    let output = ebb_raw(&["rule", "check", guests::THRESHOLD_TABLE, "--param", "tabel=1"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown parameter tabel"));
}

#[test]
fn rule_eval_prints_the_decision_as_json() {
    let output = ebb_raw(&["rule", "eval", guests::THRESHOLD_TABLE, "--param", "table=10:1, *:4", "--task-count", r#"{"approximate_depth": 50}"#]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let decision: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(decision, serde_json::json!({ "value": 4, "source": "rule", "clamped": false }));
    let output = ebb_raw(&["rule", "eval", guests::PAPER_DEFAULT, "--queue-empty", r#"{"idle_count": 2, "random": 0}"#]);
    let decision: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(decision["value"], serde_json::json!({ "delay_ms": 140, "stop": false }), "100 ms × 1.75 × 0.8");
    let output = ebb_raw(&["rule", "eval", guests::PAPER_DEFAULT, "--queue-empty", r#"{"idle": 2}"#]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown field `idle`"));
}

/// Contract 0.2.0's fields are read from `--task-count` (batch_size defaults to 32).
#[test]
fn rule_eval_takes_the_fields_of_contract_0_2_0() {
    let eval = |field: &str, state: &str| {
        let output = ebb_raw(&["rule", "eval", guests::ECHO_STATE, "--param", &format!("field={field}"), "--task-count", state]);
        assert!(output.status.success(), "{field}: {}", String::from_utf8_lossy(&output.stderr));
        let decision: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        // max_tasks is raised so that no echo is clamped.
        assert_eq!(decision["clamped"], false, "{field}: {decision}");
        decision["value"].as_u64().unwrap()
    };
    let state = r#"{"max_tasks": 100000, "last_get_messages": 5, "arrivals_per_sec": 2.5, "oldest_message_age_ms": 900, "depth_source": "inferred"}"#;
    assert_eq!(eval("last_get_messages", state), 5);
    assert_eq!(eval("arrivals_per_sec", state), 2500);
    assert_eq!(eval("oldest_message_age_ms", state), 901);
    assert_eq!(eval("depth_source", state), 2);
    assert_eq!(eval("batch_size", state), 32, "the default batch size");
    assert_eq!(eval("oldest_message_age_ms", r#"{"min_tasks": 0, "oldest_message_age_ms": null}"#), 0, "none");
    let output = ebb_raw(&["rule", "eval", guests::ECHO_STATE, "--task-count", r#"{"depth_source": "guessed"}"#]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown variant `guessed`"), "{}", String::from_utf8_lossy(&output.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_validates_the_config_and_its_rules() {
    let (_app, app_addr) = App::start(Duration::ZERO).await;
    let site = Site::new(app_addr, "30s");
    let output = site.ebb(&["check"]);
    assert!(String::from_utf8_lossy(&output.stdout).contains("is valid"));
    std::fs::write(site.dir.path().join("rules/orders.wasm"), b"not wasm").unwrap();
    let output = Command::new(EBB).arg("check").arg("--config").arg(site.config()).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("orders.wasm") && error.contains("not a WebAssembly file"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_rejects_unknown_queues_and_oversized_messages_and_takes_notifications() {
    let (app, app_addr) = App::start(Duration::ZERO).await;
    let site = Site::new(app_addr, "30s");
    let mut host = site.start_host().await;
    let client = reqwest::Client::new();
    let post = |path: String, body: Vec<u8>| client.post(format!("http://{}{path}", site.api)).bearer_auth(TOKEN).body(body).send();
    assert_eq!(post("/queues/nope/messages".into(), b"x".to_vec()).await.unwrap().status(), reqwest::StatusCode::NOT_FOUND);
    // A send may be larger (it goes to the queue's claim store: tests/all/large_sends.rs);
    // every other route keeps max_message_bytes.
    assert_eq!(post("/queues/orders/notify".into(), vec![b'x'; 65_537]).await.unwrap().status(), reqwest::StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(post("/queues/orders/notify".into(), vec![]).await.unwrap().status(), reqwest::StatusCode::ACCEPTED);
    assert_eq!(post("/queues/orders/messages".into(), vec![b'x'; 65_536]).await.unwrap().status(), reqwest::StatusCode::CREATED);
    wait_until("the largest allowed message handled", || async { app.seen.lock().unwrap().len() == 1 }).await;
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once_and_the_message_comes_back() {
    let (app, app_addr) = App::start(Duration::from_secs(600)).await;
    let site = Site::new(app_addr, "2s");
    let mut host = site.start_host().await;
    assert_eq!(site.post("slow".into()).await, reqwest::StatusCode::CREATED);
    wait_until("the handler to be called", || async { site.first_queue().await.in_flight == 1 }).await;
    signal(&host, "-TERM"); // drain: would wait up to drain_timeout (10 s)
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    signal(&host, "-TERM");
    let exit = tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap();
    assert_eq!(exit.code(), Some(130));
    assert!(started.elapsed() < Duration::from_secs(5), "exited at once");
    drop(app);
    assert_eq!(store_count(&site.dir.path().join("ebb-data")).await, 1, "not deleted: it comes back when its lease runs out");
}

/// Flips one letter inside every stored copy of `marker` in the store file.
fn damage_on_disk(data_dir: &Path, marker: &[u8]) {
    let path = data_dir.join(ebb::queue::embedded::STORE_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let mut flipped = 0;
    for at in 0..bytes.len() - marker.len() {
        if &bytes[at..at + marker.len()] == marker {
            bytes[at + marker.len() / 2] ^= 0x20;
            flipped += 1;
        }
    }
    assert!(flipped > 0, "the marker is stored as is");
    std::fs::write(&path, &bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_store_file_stops_the_host_with_a_clear_error_not_a_panic() {
    let (_app, app_addr) = App::start(Duration::ZERO).await;
    let site = Site::new(app_addr, "30s");
    site.ebb(&["send", "orders", "one of many", "--count", "200"]);
    let path = site.dir.path().join("ebb-data").join(ebb::queue::embedded::STORE_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let mut rng = fastrand::Rng::with_seed(11);
    for byte in &mut bytes[4096..] {
        *byte = rng.u8(..);
    }
    std::fs::write(&path, &bytes).unwrap();
    let output = Command::new(EBB).arg("run").arg("--config").arg(site.config()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains(&path.display().to_string()) && stderr.contains("is damaged") && stderr.contains("move the file aside"), "{stderr}");
}

/// A byte flipped inside a stored body fails its page's checksum: the store is refused at
/// start, naming the file, and the app sees nothing. (A body damaged where redb's checksums
/// pass is poisoned as corrupt: `embedded_queue::a_body_changed_on_disk_is_delivered_marked_corrupt`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_damaged_on_disk_is_refused_at_start_and_never_reaches_the_app() {
    let (app, app_addr) = App::start(Duration::ZERO).await;
    let site = Site::new(app_addr, "30s");
    let marker = "MARKER-0123456789-abcdefghijklmnopqrstuvwxyz";
    site.ebb(&["send", "orders", marker]);
    site.ebb(&["send", "orders", "intact"]);
    damage_on_disk(&site.dir.path().join("ebb-data"), marker.as_bytes());
    let output = Command::new(EBB).arg("run").arg("--config").arg(site.config()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let path = site.dir.path().join("ebb-data").join(ebb::queue::embedded::STORE_FILE);
    assert!(stderr.contains(&path.display().to_string()) && stderr.contains("is damaged"), "{stderr}");
    assert!(app.seen.lock().unwrap().is_empty(), "the app saw nothing: {:?}", app.bodies());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_the_current_depth_not_the_last_decisions() {
    let (_app, app_addr) = App::start(Duration::ZERO).await;
    let site = Site::new(app_addr, "30s");
    let mut host = site.start_host().await;
    site.ebb(&["send", "orders", "ten", "--count", "10"]);
    wait_until("10 processed", || async { site.first_queue().await.processed == 10 }).await;
    let status = site.status().await;
    assert_eq!(status["queues"][0]["approximate_depth"], 0, "{status}");
    assert!(status["queues"][0]["depth_as_of"].is_string(), "says how old the figure is: {status}");
    let table = String::from_utf8(site.ebb(&["status"]).stdout).unwrap();
    let row = table.lines().find(|l| l.starts_with("orders")).unwrap();
    assert!(row.split_whitespace().nth(1) == Some("0"), "the table's depth column: {table}");
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
}

/// Review defect: `ebb send --count 0` through the API still sent one message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_count_zero_is_refused_and_sends_nothing() {
    let (app, app_addr) = App::start(Duration::ZERO).await;
    let site = Site::new(app_addr, "30s");
    let mut host = site.start_host().await;
    let output = Command::new(EBB).args(["send", "orders", "none", "--count", "0", "--config"]).arg(site.config()).output().unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("--count"), "{output:?}");
    site.ebb(&["send", "orders", "one"]);
    wait_until("the one message handled", || async { app.seen.lock().unwrap().len() == 1 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.bodies(), BTreeSet::from(["one".to_string()]));
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
}

/// Review defect: ANSI colour codes went into the log when stderr was a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_has_no_colour_codes_when_stderr_is_a_file() {
    let (_app, app_addr) = App::start(Duration::ZERO).await;
    let site = Site::new(app_addr, "30s");
    let mut host = site.start_host().await;
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
    let log = std::fs::read_to_string(site.dir.path().join("host.log")).unwrap();
    assert!(log.contains("listening"), "{log}");
    assert!(!log.contains('\u{1b}'), "escape codes in the log: {log:?}");
}

/// Issue 9, partitioned queues on the embedded backend: one logical queue over three
/// partition queues, sends spread over them (API and direct), one listener and one rule
/// slot per partition, and the sums in `/status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_queue_spreads_messages_and_sums_its_status() {
    let (app, app_addr) = App::start(Duration::ZERO).await;
    let site = Site::new(app_addr, "30s");
    let config = std::fs::read_to_string(site.config()).unwrap().replace("[queues.orders]\n", "[queues.orders]\npartitions = 3\n");
    std::fs::write(site.config(), config).unwrap();
    site.ebb(&["send", "orders", "direct", "--count", "30"]);
    let mut host = site.start_host().await;
    site.ebb(&["send", "orders", "via-api", "--count", "30"]);
    wait_until("60 messages handled", || async { app.seen.lock().unwrap().len() >= 60 }).await;
    site.rule_in_use().await;
    let status = site.status().await;
    let queues = status["queues"].as_array().unwrap();
    let names: Vec<&str> = queues.iter().map(|q| q["queue"].as_str().unwrap()).collect();
    assert_eq!(names, ["orders-0", "orders-1", "orders-2"], "{status}");
    for queue in queues {
        assert!(queue["processed"].as_u64().unwrap() >= 10, "each partition took its share: {status}");
        assert_eq!(queue["rule"]["file"], "orders.wasm", "each partition has the rule: {status}");
    }
    let logical = &status["partitioned"][0];
    assert_eq!((logical["queue"].as_str(), logical["processed"].as_u64()), (Some("orders"), Some(60)), "{status}");
    // The cost of the logical queue sums its partitions' (each has its puts, gets and deletes).
    let partition_rate = |q: &serde_json::Value| q["cost"]["transactions_per_hour"].as_f64().unwrap();
    let largest = queues.iter().map(partition_rate).fold(0.0, f64::max);
    assert!(largest > 0.0 && logical["cost"]["transactions_per_hour"].as_f64().unwrap() > largest, "{status}");
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
}

/// Defect 1 (rules review): bytes n/4..n/2 of a compiled rule in `data/rule-cache` overwritten
/// made every `ebb run` exit 139 (SIGSEGV) with nothing on stderr. Now the damaged file is
/// detected by its checksum, deleted with a WARN, and the rule recompiled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_rule_cache_is_recompiled_not_a_crash() {
    let (_app, app_addr) = App::start(Duration::ZERO).await;
    let site = Site::new(app_addr, "30s");
    let mut host = site.start_host().await;
    site.rule_in_use().await;
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
    let cache = site.dir.path().join("ebb-data/rule-cache");
    let files: Vec<PathBuf> = std::fs::read_dir(&cache).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "cwasm")).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let n = bytes.len();
    let mut rng = fastrand::Rng::with_seed(3);
    bytes[n / 4..n / 2].iter_mut().for_each(|b| *b = rng.u8(..));
    std::fs::write(&files[0], &bytes).unwrap();

    let mut host = site.start_host().await;
    wait_until("the rule in use", || async { rule_file(&site.first_queue().await) == Some("orders.wasm") }).await;
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
    let log = without_colours(&std::fs::read_to_string(site.dir.path().join("host.log")).unwrap());
    let warn = log.lines().find(|l| l.contains("WARN") && l.contains("damaged")).unwrap_or_else(|| panic!("{log}"));
    assert!(warn.contains(&files[0].display().to_string()) && warn.contains("recompiling"), "{warn}");
    assert!(log.contains("from_cache=false"), "{log}");
}

/// `text` without its ANSI colour sequences (the host colours its log).
fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            chars.by_ref().find(|c| c.is_ascii_alphabetic());
        } else {
            out.push(c);
        }
    }
    out
}

/// Runs `ebb` with `args`, killing it after `limit`: `None` if it had not exited by then.
fn ebb_within(args: &[&std::ffi::OsStr], limit: Duration) -> Option<Output> {
    let mut child = Command::new(EBB).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(child.wait_with_output().unwrap())
}

/// Defect 2 (rules review): `ebb rule check` and `ebb check` hung on a FIFO, and
/// `ebb rule check /dev/zero` read until it held 4 GB. Each now exits 1 at once, naming the
/// file and saying it is not a regular file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_check_and_check_refuse_fifos_and_devices_at_once() {
    use std::ffi::OsStr;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.wasm");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let zero_link = dir.path().join("zero.wasm");
    std::os::unix::fs::symlink("/dev/zero", &zero_link).unwrap();
    // The FIFO first: on code that blocks on it, the test fails by the time limit, not by memory.
    let cases: [(&Path, &str); 3] = [
        (&fifo, "is a FIFO (named pipe), not a regular file"),
        (&zero_link, "is a symbolic link to /dev/zero, which is a character device, not a regular file"),
        (Path::new("/dev/zero"), "is a character device, not a regular file"),
    ];
    for (path, reason) in cases {
        for command in ["check", "eval"] {
            let mut args = vec![OsStr::new("rule"), OsStr::new(command), path.as_os_str()];
            if command == "eval" {
                args.extend([OsStr::new("--task-count"), OsStr::new("{}")]);
            }
            let output = ebb_within(&args, Duration::from_secs(10)).unwrap_or_else(|| panic!("ebb rule {command} {} hung", path.display()));
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(1), "{stderr}");
            assert!(stderr.contains(&path.display().to_string()) && stderr.contains(reason), "ebb rule {command}: {stderr}");
        }
    }
    let (_app, app_addr) = App::start(Duration::ZERO).await;
    let site = Site::new(app_addr, "30s");
    let rule = site.dir.path().join("rules/orders.wasm");
    std::fs::remove_file(&rule).unwrap();
    assert!(Command::new("mkfifo").arg(&rule).status().unwrap().success());
    let output =
        ebb_within(&[OsStr::new("check"), OsStr::new("--config"), site.config().as_os_str()], Duration::from_secs(10)).expect("ebb check hung on a FIFO");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("orders.wasm") && stderr.contains("FIFO"), "{stderr}");
}

/// Defect 6 (rules review): `ebb rule eval` on a rule that traps exited 0 and printed the
/// built-in rule's decision (`"source": "fallback"`), so an author could miss the fault. It
/// still prints the JSON, but exits 1 with the fault's reason on stderr.
#[test]
fn rule_eval_of_a_faulting_rule_exits_1_with_the_reason() {
    for decision in [["--task-count", r#"{"approximate_depth": 42}"#], ["--queue-empty", "{}"]] {
        let output = ebb_raw(&["rule", "eval", guests::TRAP, decision[0], decision[1]]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{decision:?}: {stderr}");
        let printed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(printed["source"], "fallback", "{decision:?}: the decision is still printed");
        // The reason: its trap, or (on a machine too loaded to run it in 10 ms) the deadline.
        let error = stderr.lines().find(|l| l.starts_with("error: ")).unwrap_or_else(|| panic!("{decision:?}: {stderr}"));
        let reason_given = (error.contains("trapped") && error.contains("this rule always fails")) || error.contains("deadline");
        assert!(error.contains("the rule faulted") && reason_given, "{decision:?}: {stderr}");
    }
    // A rule that decides still exits 0.
    let output = ebb_raw(&["rule", "eval", guests::FIXED_TASKS, "--task-count", "{}"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

/// Issue 9 through the binary on Azurite: `ebb check` reaches the queues, `ebb run` handles
/// what `ebb send` put, and a wrong account key is one clear error that never shows the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_queue_through_the_binary() {
    let azurite = ebb_tests::azurite::Azurite::shared();
    let (app, app_addr) = App::start(Duration::ZERO).await;
    let site = Site::new(app_addr, "30s");
    let plain = std::fs::read_to_string(site.config()).unwrap();
    let with_azure = |connection: &str| {
        format!(
            "{}\n[azure]\nconnection_string = \"{connection}\"\n",
            plain.replace("[queues.orders]\n", "[queues.orders]\nbackend = \"azure\"\npartitions = 2\n")
        )
    };
    std::fs::write(site.config(), with_azure(&azurite.connection_string())).unwrap();
    let checked = String::from_utf8(site.ebb(&["check"]).stdout).unwrap();
    assert!(checked.contains("queue orders-0: reached on Azure") && checked.contains("queue orders-poison: reached on Azure"), "{checked}");
    assert!(!checked.contains("may read"), "the queues do not exist yet, nothing to probe: {checked}");

    let mut host = site.start_host().await;
    site.ebb(&["send", "orders", "to-azure", "--count", "20"]);
    wait_until("20 messages handled", || async { app.seen.lock().unwrap().len() >= 20 }).await;
    // `processed` counts a message once its delete returned, which may trail the handler.
    wait_until("20 messages processed", || async { site.typed_status().await.partitioned.first().is_some_and(|p| p.processed == 20) }).await;
    let status = site.status().await;
    assert!(status["queues"][0]["transactions"]["gets_with_messages"].as_u64().unwrap() > 0, "{status}");
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
    let checked = String::from_utf8(site.ebb(&["check"]).stdout).unwrap();
    assert!(checked.contains("queue orders-1: reached on Azure, 0 messages; may create, read, process and update"), "{checked}");

    // A wrong key: `ebb check` and `ebb run` fail once, clearly, without the key.
    let wrong_key = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmcta2V5";
    let connection = azurite.connection_string().replace(ebb::queue::azure::DEVELOPMENT_KEY, wrong_key);
    std::fs::write(site.config(), with_azure(&connection)).unwrap();
    for command in ["check", "run"] {
        let output = Command::new(EBB).arg(command).arg("--config").arg(site.config()).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "ebb {command}: {stderr}");
        assert!(stderr.contains("AuthenticationFailed") && stderr.contains("devstoreaccount1"), "ebb {command}: {stderr}");
        assert!(!stderr.contains(wrong_key) && !stderr.contains(ebb::queue::azure::DEVELOPMENT_KEY), "ebb {command} shows a key: {stderr}");
    }

    // A SAS that may read, add and update but not process: `ebb check` names the missing
    // permission (probed with a message that does not exist: nothing in the queue changes).
    let expiry = std::time::SystemTime::now() + Duration::from_secs(3600);
    let sas = azurite.account().account_sas("rau", expiry).unwrap();
    std::fs::write(site.config(), with_azure(&format!("SharedAccessSignature={sas};QueueEndpoint={}", azurite.endpoint()))).unwrap();
    let output = Command::new(EBB).arg("check").arg("--config").arg(site.config()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("AuthorizationPermissionMismatch") && stderr.contains("it needs p (process)"), "{stderr}");
    assert!(!stderr.contains(sas.split("sig=").nth(1).unwrap()), "the SAS's signature is shown: {stderr}");
}

/// A rule deployed into the running host's folder (write aside, rename) is swapped in. (The
/// rule set was once dropped after start-up, leaving the watcher nothing to apply to.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_deployed_into_the_running_hosts_folder_is_swapped_in() {
    use sha2::Digest as _;
    let (_app, app_addr) = App::start(Duration::ZERO).await;
    let site = Site::new(app_addr, "30s");
    let mut host = site.start_host().await;
    let sha = |path: &str| hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()));
    // Rules load in the background at start-up.
    let first = sha(guests::PAPER_DEFAULT);
    wait_until("the rule in use", || async { rule_sha256(&site.first_queue().await) == Some(first.as_str()) }).await;
    let staging = site.dir.path().join("rules/orders.wasm.partial");
    std::fs::copy(guests::FIXED_TASKS, &staging).unwrap();
    std::fs::rename(&staging, site.dir.path().join("rules/orders.wasm")).unwrap();
    let wanted = sha(guests::FIXED_TASKS);
    wait_until("the new rule in use", || async { rule_sha256(&site.first_queue().await) == Some(wanted.as_str()) }).await;
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
}

/// An Entra ID token as Azure issues it (Azurite's `--oauth basic` checks the issuer, the
/// audience and the times, not the signature).
fn entra_token(audience: &str) -> String {
    use azure_core::base64::encode_url_safe as base64url;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let header = base64url(br#"{"typ":"JWT","alg":"RS256"}"#);
    let claims = serde_json::json!({
        "aud": audience,
        "iss": "https://sts.windows.net/72f988bf-86f1-41af-91ab-2d7cd011db47/",
        "iat": now - 60, "nbf": now - 60, "exp": now + 3600,
        "oid": "00000000-0000-0000-0000-00000000e0b0", "tid": "72f988bf-86f1-41af-91ab-2d7cd011db47",
    });
    format!("{header}.{}.c2lnbmF0dXJl", base64url(claims.to_string().as_bytes()))
}

/// Issue 9, Entra ID: `credential = "azure-cli"` takes its token from `az account
/// get-access-token` (here a stand-in `az` on the host's PATH that prints a token as the
/// Azure CLI does, and records that it was asked) and reaches Azurite over https (its
/// self-signed certificate trusted through `ca_file`) with `--oauth basic`: `ebb check`,
/// `ebb send` and `ebb run` work. A token for another audience is one clear error naming
/// the credential.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entra_id_identity_reaches_azure_over_https() {
    use std::os::unix::fs::PermissionsExt as _;
    let scratch = tempfile::tempdir().unwrap();
    let azurite = ebb_tests::azurite::Azurite::start_https_oauth(scratch.path());
    let (app, app_addr) = App::start(Duration::ZERO).await;
    let mut site = Site::new(app_addr, "30s");
    let bin = site.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let asked = site.dir.path().join("az-asked");
    let az_answer = site.dir.path().join("az-answer.json");
    let write_token = |audience: &str| {
        let expires = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 3600;
        let answer = serde_json::json!({ "accessToken": entra_token(audience), "expires_on": expires, "tokenType": "Bearer" });
        std::fs::write(&az_answer, answer.to_string()).unwrap();
    };
    write_token("https://storage.azure.com");
    let script = format!("#!/bin/sh\necho \"$@\" >> {}\ncat {}\n", asked.display(), az_answer.display());
    std::fs::write(bin.join("az"), script).unwrap();
    std::fs::set_permissions(bin.join("az"), std::fs::Permissions::from_mode(0o755)).unwrap();
    site.path = Some(format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()).into());

    let plain = std::fs::read_to_string(site.config()).unwrap();
    let config = format!(
        "{}\n[azure]\naccount = \"devstoreaccount1\"\ncredential = \"azure-cli\"\nendpoint = \"{}\"\nca_file = \"{}\"\n",
        plain.replace("[queues.orders]\n", "[queues.orders]\nbackend = \"azure\"\n"),
        azurite.endpoint(),
        azurite.certificate().unwrap().display()
    );
    std::fs::write(site.config(), config).unwrap();
    // The queue exists beforehand (creating queues needs a role the host may not have).
    let admin =
        ebb::queue::azure::AzureAccount::with_key(ebb::queue::azure::DEVELOPMENT_ACCOUNT, ebb::queue::azure::DEVELOPMENT_KEY, Some(&azurite.endpoint()))
            .unwrap()
            .with_root_certificate(&std::fs::read(azurite.certificate().unwrap()).unwrap())
            .unwrap();
    for name in ["orders", "orders-poison"] {
        use ebb::queue::QueueClient as _;
        ebb::queue::azure::AzureQueue::new(&admin, name, Default::default()).unwrap().create_if_missing().await.unwrap();
    }

    let checked = String::from_utf8(site.ebb(&["check"]).stdout).unwrap();
    assert!(checked.contains("queue orders: reached on Azure, 0 messages; may create, read, process and update"), "{checked}");
    let mut host = site.start_host().await;
    site.ebb(&["send", "orders", "with-a-token", "--count", "5"]);
    wait_until("5 messages handled", || async { app.seen.lock().unwrap().len() >= 5 }).await;
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
    let asked = std::fs::read_to_string(&asked).unwrap();
    assert!(asked.contains("account get-access-token") && asked.contains("https://storage.azure.com/.default"), "{asked}");

    write_token("https://some-other-service.example");
    let output = site.command().arg("check").arg("--config").arg(site.config()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("azure-cli"), "the error names the credential: {stderr}");
    assert!(!stderr.contains("c2lnbmF0dXJl"), "the token is shown: {stderr}");
}

/// Issue 10 through the binary: a host whose queue has `push = true` and `min_tasks = 0`
/// on Azure (Azurite) with a `[bus]` on Redis. Idle, it runs no task; a message put straight
/// into storage by another process is picked up when that process publishes the trigger
/// (a raw Redis publish, as any app may, or `ebb send` with no host at its API); while
/// Redis is down the host polls (a message with no trigger is still found); it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_across_hosts_over_redis_with_zero_idle_tasks_and_polling_through_an_outage() {
    use ebb::queue::QueueClient as _;
    let azurite = ebb_tests::azurite::Azurite::shared();
    let queue = ebb_tests::azurite::unique_queue_name("pushed");
    let (app, app_addr) = App::start(Duration::ZERO).await;
    let direct = ebb::queue::azure::AzureQueue::new(&azurite.account(), &queue, Default::default()).unwrap();
    direct.create_if_missing().await.unwrap();
    let storage = format!("[azure]\nconnection_string = \"{}\"\n", azurite.connection_string());
    push_across_hosts(&Site::new(app_addr, "30s"), &app, &queue, ("azure", &storage), &direct).await;
}

/// The body of [`push_across_hosts_over_redis_with_zero_idle_tasks_and_polling_through_an_outage`]
/// on `site` with its queue renamed `queue`, on `backend` reached by the table `storage`;
/// `direct` reaches the queue as another process would.
pub(crate) async fn push_across_hosts(site: &Site, app: &App, queue: &str, (backend, storage): (&str, &str), direct: &dyn ebb::queue::QueueClient) {
    use ebb::bus::PubSub as _;
    let mut redis = ebb_tests::redis::RedisServer::start();
    let plain = std::fs::read_to_string(site.config()).unwrap();
    let queue_section = format!("[queues.{queue}]\nbackend = \"{backend}\"\npush = true\nmin_tasks = 0\nmin_polling_interval = \"100ms\"\n");
    let config = format!(
        "{}\n{storage}\n[bus]\nredis_url = \"{}\"\n",
        plain.replace("[queues.orders]\n", &queue_section).replace("max_polling_interval = \"2s\"", "max_polling_interval = \"1s\""),
        redis.url()
    );
    std::fs::write(site.config(), &config).unwrap();

    let checked = String::from_utf8(site.ebb(&["check"]).stdout).unwrap();
    assert!(checked.contains(&format!("bus: redis://127.0.0.1:{} answers", redis.port())), "{checked}");
    let mut host = site.start_host().await;
    let bus_up = |status: &HostStatus| status.bus.as_ref().is_some_and(|b| b.connected);
    wait_until("subscribed, and no idle task left", || async {
        let status = site.typed_status().await;
        bus_up(&status) && status.queues[0].active_tasks == 0
    })
    .await;

    // Another process stores a message and publishes the trigger on the queue's channel.
    direct.put(b"pushed-by-an-app", Duration::ZERO).await.unwrap();
    let publisher = ebb::bus::redis::RedisPubSub::new(&redis.url()).unwrap();
    publisher.publish(&format!("ebb:queue:{queue}"), format!(r#"{{"queue":"{queue}","count":1}}"#).as_bytes()).await.unwrap();
    wait_until("the pushed message handled", || async { app.bodies().contains("pushed-by-an-app") }).await;

    // `ebb send` from a machine with no host at its API writes to Azure and publishes.
    let sender = site.dir.path().join("sender.toml");
    let dead_api = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    std::fs::write(&sender, config.replace(&site.api.to_string(), &dead_api.to_string())).unwrap();
    wait_until("idle again", || async { site.first_queue().await.active_tasks == 0 }).await;
    let sent = site.command().args(["send", queue, "sent-from-elsewhere", "--config"]).arg(&sender).output().unwrap();
    assert!(sent.status.success(), "{}", String::from_utf8_lossy(&sent.stderr));
    assert!(String::from_utf8_lossy(&sent.stdout).contains("notified the hosts"), "{}", String::from_utf8_lossy(&sent.stdout));
    wait_until("the sent message handled", || async { app.bodies().contains("sent-from-elsewhere") }).await;

    // Redis goes down: the host polls, so a message nobody announces is still handled.
    redis.stop();
    wait_until("the outage seen and a polling task started", || async {
        let status = site.typed_status().await;
        !bus_up(&status) && status.queues[0].active_tasks >= 1
    })
    .await;
    let output = site.command().arg("check").arg("--config").arg(site.config()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "ebb check with Redis down: {stderr}");
    assert!(stderr.contains("bus: push notifications between hosts would not work"), "{stderr}");
    direct.put(b"unannounced", Duration::ZERO).await.unwrap();
    wait_until("the unannounced message handled by polling", || async { app.bodies().contains("unannounced") }).await;
    redis.resume();
    wait_until("subscribed again", || async { bus_up(&site.typed_status().await) }).await;
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
    let log = std::fs::read_to_string(site.dir.path().join("host.log")).unwrap();
    assert_eq!(log.matches("push notifications lost").count(), 1, "the outage is logged once:\n{log}");
}

/// A site with one queue `orders` on the built-in rule, with these extra queue keys.
fn built_in_site(app: SocketAddr, queue_keys: &str) -> Site {
    let dir = tempfile::tempdir().unwrap();
    let api: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let config = format!(
        "drain_timeout = \"10s\"\n[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n\n[queues.orders]\n{queue_keys}handler = {{ url = \"http://{app}/work\" }}\n"
    );
    std::fs::write(dir.path().join("ebb.toml"), config).unwrap();
    Site { dir, api, path: None, env: Vec::new() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_idle_push_queue_through_the_binary_polls_at_start_and_shows_its_cost() {
    let (app, app_addr) = App::start(Duration::from_millis(1)).await;
    let site = built_in_site(app_addr, "push = true\nmin_tasks = 0\nmax_polling_interval = \"1s\"\nsafety_poll = \"1h\"\n");
    // Sent while no host runs: no notification reaches anyone.
    site.ebb(&["send", "orders", "while-down", "--count", "3"]);
    let mut host = site.start_host().await;
    wait_until("the messages sent while the host was down", || async { app.seen.lock().unwrap().len() >= 3 }).await;
    wait_until("every task stopped", || async { site.first_queue().await.active_tasks == 0 }).await;
    let status = site.status().await;
    let queue = &status["queues"][0];
    assert_eq!(queue["safety_polls"], 1, "the start-up poll: {queue}");
    // A send through the API notifies the queue: picked up with no task running.
    site.ebb(&["send", "orders", "pushed"]);
    wait_until("the pushed message", || async { app.bodies().contains("pushed") }).await;

    // The live cost figures, per queue and in total.
    let status = site.status().await;
    let cost = &status["queues"][0]["cost"];
    assert_eq!(cost["price_per_10k_transactions"], 0.01);
    assert!(cost["transactions_per_hour"].as_f64().unwrap() > 0.0, "{cost}");
    // Each get came back with fewer messages than it asked for, which says the queue was
    // drained: no empty get was made to learn it.
    assert_eq!(cost["idle_transactions_per_hour"].as_f64().unwrap(), 0.0, "no empty get: {cost}");
    assert_eq!(status["cost"]["usd_per_month"], cost["usd_per_month"], "one queue: the total is the queue");
    let table = String::from_utf8(site.ebb(&["status"]).stdout).unwrap();
    assert!(table.contains("tx/h all/idle") && table.contains("\ntotal: ") && table.contains("per 10,000 transactions"), "{table}");
    let metrics = reqwest::Client::new().get(format!("http://{}/metrics", site.api)).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap();
    for line in [
        "ebb_projected_usd_per_month{queue=\"orders\",logical_queue=\"orders\",kind=\"idle\"}",
        "ebb_host_transactions_per_hour{kind=\"all\"}",
        "ebb_safety_polls_total{queue=\"orders\",logical_queue=\"orders\"} 1",
        "ebb_price_per_10k_transactions_usd 0.01",
    ] {
        assert!(metrics.contains(line), "missing {line} in\n{metrics}");
    }
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_agrees_with_the_real_binary_within_five_percent() {
    let (app, app_addr) = App::start(Duration::from_millis(1)).await;
    let site = built_in_site(app_addr, "");
    // A trickle of 60 messages, one every 250 ms from 1 s on, over a 25 s run.
    let arrivals: Vec<f64> = (0..60).map(|i| 1.0 + f64::from(i) * 0.25).collect();
    let run = Duration::from_secs(25);
    let mut host = site.start_host().await;
    let start = tokio::time::Instant::now();
    for (i, at) in arrivals.iter().enumerate() {
        tokio::time::sleep_until(start + Duration::from_secs_f64(*at)).await;
        assert_eq!(site.post(format!("m{i}")).await, reqwest::StatusCode::CREATED);
    }
    tokio::time::sleep_until(start + run).await;
    let status = site.status().await;
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
    assert_eq!(app.seen.lock().unwrap().len(), 60);
    let tx = &status["queues"][0]["transactions"];
    let real: u64 = ["puts", "gets_with_messages", "gets_empty", "deletes", "updates", "counts", "creates"].iter().map(|k| tx[*k].as_u64().unwrap()).sum();

    // The same arrivals through the simulator: the built-in rule, each send notifying the
    // queue as the API does, a 1 ms handler.
    let trace = site.dir.path().join("trace.csv");
    std::fs::write(&trace, arrivals.iter().map(|a| format!("{a}\n")).collect::<String>()).unwrap();
    let output = Command::new(EBB)
        .args(["simulate", "--trace", trace.to_str().unwrap(), "--duration", "25s", "--rule", "paper", "--notify", "--handler-time", "1ms", "--json"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let simulated: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let rule = &simulated["rules"][0];
    assert_eq!(rule["handled"], 60);
    let sim = rule["billed_transactions"].as_u64().unwrap();
    let difference = (sim as f64 - real as f64).abs() / real as f64;
    println!("transactions: simulated {sim} {}, real {real} {tx}", rule["transactions"]);
    assert!(difference <= 0.05, "simulated {sim} transactions ({}), real {real} ({tx}): {:.1} % apart", rule["transactions"], difference * 100.0);
}

/// The binary these tests run: `EBB_UNDER_TEST` when set (to show a test failing on an older
/// build), else this build's.
fn ebb_under_test() -> std::ffi::OsString {
    std::env::var_os("EBB_UNDER_TEST").unwrap_or_else(|| EBB.into())
}

/// Runs `ebb` with `args` and `stdin`, its data segment capped at 1 GiB (code that reads
/// without end fails on memory instead of taking the machine), killed after `limit`:
/// `None` if it had not exited by then.
fn ebb_capped(args: &[&std::ffi::OsStr], stdin: Stdio, limit: Duration) -> Option<Output> {
    let mut child = Command::new("prlimit")
        .arg(format!("--data={}", 1u64 << 30))
        .arg("--")
        .arg(ebb_under_test())
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(child.wait_with_output().unwrap())
}

/// Issue 18: `ebb send < /dev/zero` grew to 7 GB, a config that is a symbolic link to
/// /dev/zero did the same, a FIFO as config hung, and `send --count` had no bound. Each
/// ends at once with an error naming the input and the limit.
#[test]
fn unbounded_inputs_to_the_cli_end_at_once_with_a_clear_error() {
    use std::ffi::OsStr;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ebb.toml");
    std::fs::write(&config, "[api]\nlisten = \"127.0.0.1:9\"\n[queues.orders]\nhandler = { url = \"http://127.0.0.1:9/work\" }\n").unwrap();
    let fifo = dir.path().join("fifo.toml");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let zero = dir.path().join("zero.toml");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let (config, fifo, zero) = (config.as_os_str(), fifo.as_os_str(), zero.as_os_str());
    let show = |path: &OsStr| path.to_string_lossy().into_owned();
    let dev_zero = || Stdio::from(std::fs::File::open("/dev/zero").unwrap());
    // The FIFOs first: on code that blocks on them, the test fails by the time limit, not by memory.
    let cases: Vec<(Vec<&OsStr>, Stdio, i32, String)> = vec![
        (
            vec![OsStr::new("check"), OsStr::new("--config"), fifo],
            Stdio::null(),
            1,
            format!("config {} is a FIFO (named pipe), not a regular file", show(fifo)),
        ),
        (vec![OsStr::new("status"), OsStr::new("--config"), fifo], Stdio::null(), 1, format!("config {} is a FIFO (named pipe)", show(fifo))),
        (vec![OsStr::new("simulate"), OsStr::new("--trace"), fifo], Stdio::null(), 1, format!("{} is not a regular file", show(fifo))),
        (
            vec![OsStr::new("check"), OsStr::new("--config"), zero],
            Stdio::null(),
            1,
            format!("config {} is a symbolic link to /dev/zero, which is a character device, not a regular file", show(zero)),
        ),
        (vec![OsStr::new("send"), OsStr::new("orders"), OsStr::new("x"), OsStr::new("--config"), zero], Stdio::null(), 1, "/dev/zero".into()),
        (
            vec![OsStr::new("send"), OsStr::new("orders"), OsStr::new("--config"), config],
            dev_zero(),
            1,
            // The queue has a claim store: a body up to its max_claim_check_bytes is taken.
            "the message (at most max_claim_check_bytes) on stdin is over the limit of 104857600 bytes".into(),
        ),
        (
            vec![
                OsStr::new("send"),
                OsStr::new("orders"),
                OsStr::new("x"),
                OsStr::new("--count"),
                OsStr::new("18446744073709551615"),
                OsStr::new("--config"),
                config,
            ],
            Stdio::null(),
            2,
            "18446744073709551615 is not in 1..=1000000".into(),
        ),
    ];
    for (args, stdin, code, expected) in cases {
        let started = Instant::now();
        let output = ebb_capped(&args, stdin, Duration::from_secs(20)).unwrap_or_else(|| panic!("ebb {args:?} still ran after 20 s"));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "ebb {args:?}: {stderr}");
        assert!(stderr.contains(&expected), "ebb {args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "ebb {args:?}: {stderr}");
        eprintln!("ebb {args:?}: exit {code} in {:?}", started.elapsed());
    }
}

/// Issue 25: `ebb check | head -1` and `ebb status | head -1` panicked with a backtrace
/// (broken pipe). A command whose output is closed ends quietly: status 0, or killed by
/// SIGPIPE as `cat` would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_whose_output_is_closed_end_quietly() {
    use std::os::unix::process::ExitStatusExt as _;
    let status = serde_json::json!({ "queues": [{ "queue": "orders", "approximate_depth": 3 }], "cost": null, "bus": null });
    let router = axum::Router::new()
        .route("/status", axum::routing::get(move || async move { axum::Json(status.clone()) }))
        .route("/queues/orders/messages", axum::routing::post(|| async { (StatusCode::CREATED, axum::Json(serde_json::json!({ "id": "1" }))) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ebb.toml");
    std::fs::write(&config, format!("[api]\nlisten = \"{api}\"\n[queues.orders]\nhandler = {{ url = \"http://127.0.0.1:9/work\" }}\n")).unwrap();
    for args in [&["check"][..], &["status"], &["status", "--json"], &["send", "orders", "x"], &["simulate", "--scenario", "idle", "--duration", "1m"]] {
        let config = config.clone();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let output = tokio::task::spawn_blocking(move || {
            // A reader that has gone: the first line printed meets a closed pipe.
            let (reader, writer) = std::io::pipe().unwrap();
            drop(reader);
            let mut command = Command::new(ebb_under_test());
            command.args(&args);
            if args[0] != "simulate" {
                command.arg("--config").arg(&config);
            }
            command.stdout(writer).stderr(Stdio::piped()).output().unwrap()
        })
        .await
        .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        let quiet = output.status.success() || output.status.signal() == Some(13);
        assert!(quiet && !stderr.contains("panicked"), "ebb {:?}: {:?}, {stderr}", output.status, output.status.signal());
    }
}

/// Issue 25: `ebb check` exited 1 on a single 503 from storage, where `ebb run` retries. It
/// retries transient errors too, within a bounded time: storage that is always busy fails it
/// in well under a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_retries_a_503_from_storage() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let azurite = ebb_tests::azurite::Azurite::shared();
    use std::sync::atomic::{AtomicU32, Ordering};
    // In front of Azurite: `busy_left` connections are answered 503 ServerBusy, the rest pass.
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_port = proxy.local_addr().unwrap().port();
    let upstream = azurite.port();
    let busy_answers = Arc::new(AtomicU32::new(0));
    let busy_left = Arc::new(AtomicU32::new(1));
    let (counted, left) = (busy_answers.clone(), busy_left.clone());
    tokio::spawn(async move {
        loop {
            let (mut client, _) = proxy.accept().await.unwrap();
            if left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok() {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && client.read(&mut byte).await.unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let body = "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>ServerBusy</Code><Message>busy</Message></Error>";
                let answer = format!(
                    "HTTP/1.1 503 The server is busy.\r\nContent-Type: application/xml\r\nx-ms-error-code: ServerBusy\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = client.write_all(answer.as_bytes()).await;
                counted.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    use ebb::queue::azure::{DEVELOPMENT_ACCOUNT, DEVELOPMENT_KEY};
    let connection = format!(
        "DefaultEndpointsProtocol=http;AccountName={DEVELOPMENT_ACCOUNT};AccountKey={DEVELOPMENT_KEY};QueueEndpoint=http://127.0.0.1:{proxy_port}/{DEVELOPMENT_ACCOUNT}"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ebb.toml");
    std::fs::write(
        &config,
        format!(
            "[azure]\nconnection_string = \"{connection}\"\n[queues.{}]\nbackend = \"azure\"\nhandler = {{ url = \"http://127.0.0.1:9/work\" }}\n",
            ebb_tests::azurite::unique_queue_name("check")
        ),
    )
    .unwrap();
    let check = || {
        let config = config.clone();
        tokio::task::spawn_blocking(move || Command::new(ebb_under_test()).arg("check").arg("--config").arg(&config).output().unwrap())
    };
    let output = check().await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(busy_answers.load(Ordering::Relaxed), 1, "the proxy answered 503 once");
    assert!(output.status.success(), "ebb check failed on one 503: {stderr}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("reached on Azure"), "{output:?}");

    busy_left.store(u32::MAX, Ordering::Relaxed);
    let started = Instant::now();
    let output = check().await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("ServerBusy") || stderr.contains("did not answer within"), "{stderr}");
    assert!(busy_answers.load(Ordering::Relaxed) > 3, "retried: {} busy answers", busy_answers.load(Ordering::Relaxed));
    assert!(started.elapsed() < Duration::from_secs(40), "an always busy storage held ebb check for {:?}", started.elapsed());
    eprintln!("ebb check against always-busy storage failed after {:?}", started.elapsed());
}

/// `ebb queue pause` holds a queue on the running host (no message reaches the app), the
/// pause shows in `/status` and `/metrics` and survives a restart; `ebb queue resume` lets
/// the messages through. Paused with no host running, the next start holds the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_holds_its_messages_across_a_restart_until_resumed() {
    let (app, app_addr) = App::start(Duration::from_millis(1)).await;
    pause_holds_across_a_restart_until_resumed(&Site::new(app_addr, "30s"), &app).await;
}

/// The body of [`a_paused_queue_holds_its_messages_across_a_restart_until_resumed`], on
/// `site`'s queue `orders` (whatever its backend), forwarding to `app`.
pub(crate) async fn pause_holds_across_a_restart_until_resumed(site: &Site, app: &App) {
    let mut host = site.start_host().await;
    let paused = String::from_utf8(site.ebb(&["queue", "pause", "orders"]).stdout).unwrap();
    assert!(paused.contains("orders paused until resumed"), "{paused}");
    site.ebb(&["send", "orders", "held", "--count", "10"]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(app.seen.lock().unwrap().is_empty(), "a message reached the app while paused");
    let status = site.status().await;
    assert!(status["queues"][0]["paused"]["since_ms"].is_u64(), "{status}");
    let table = String::from_utf8(site.ebb(&["status"]).stdout).unwrap();
    assert!(table.contains("orders: paused until resumed"), "{table}");
    let metrics = reqwest::Client::new().get(format!("http://{}/metrics", site.api)).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("ebb_queue_paused{queue=\"orders\",logical_queue=\"orders\"} 1"), "{metrics}");
    let refused = reqwest::Client::new().post(format!("http://{}/queues/orders/pause?for=forever", site.api)).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(refused.status(), reqwest::StatusCode::BAD_REQUEST);
    let audit: serde_json::Value = serde_json::from_slice(
        &reqwest::Client::new().get(format!("http://{}/audit", site.api)).bearer_auth(TOKEN).send().await.unwrap().bytes().await.unwrap(),
    )
    .unwrap();
    let entries = audit["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "the refused request changed nothing and is not a change: {audit}");
    assert_eq!((&entries[0]["actor"], &entries[0]["action"], &entries[0]["target"]), (&"default".into(), &"pause".into(), &"orders".into()), "{audit}");
    assert_eq!(entries[0]["result"], "ok: paused until resumed");
    for query in ["limit=0", "limit=1001", "limit=", "limit=1&limit=2", "since=1"] {
        let refused = reqwest::Client::new().get(format!("http://{}/audit?{query}", site.api)).bearer_auth(TOKEN).send().await.unwrap();
        assert_eq!(refused.status(), reqwest::StatusCode::BAD_REQUEST, "/audit?{query}");
    }

    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
    host = site.start_host().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(app.seen.lock().unwrap().is_empty(), "the pause did not survive the restart");

    let resumed = String::from_utf8(site.ebb(&["queue", "resume", "orders"]).stdout).unwrap();
    assert!(resumed.contains("orders resumed"), "{resumed}");
    wait_until("10 messages handled", || async { app.seen.lock().unwrap().len() >= 10 }).await;
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());

    // No host: the pause is recorded for the next start.
    let offline = String::from_utf8(site.ebb(&["queue", "pause", "orders", "--for", "1h"]).stdout).unwrap();
    assert!(offline.contains("no host running"), "{offline}");
    site.ebb(&["send", "orders", "offline", "--count", "3"]);
    host = site.start_host().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(app.seen.lock().unwrap().len(), 10, "paused offline, the next start held the queue");
    let audit: serde_json::Value = serde_json::from_slice(
        &reqwest::Client::new().get(format!("http://{}/audit?limit=2", site.api)).bearer_auth(TOKEN).send().await.unwrap().bytes().await.unwrap(),
    )
    .unwrap();
    let actions: Vec<(&str, &str)> =
        audit["entries"].as_array().unwrap().iter().map(|e| (e["actor"].as_str().unwrap(), e["action"].as_str().unwrap())).collect();
    assert_eq!(actions, [("default", "resume"), ("cli", "pause")], "{audit}");
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
}

/// `ebb poison`: messages the app refused are listed with their reason (a hostile body
/// shown as text), one is requeued by id and reaches the app with a fresh dequeue count,
/// the rest are purged only when confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_are_listed_requeued_and_purged() {
    let refusing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let (flag, record) = (refusing.clone(), seen.clone());
    let router = axum::Router::new().route(
        "/work",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let (flag, record) = (flag.clone(), record.clone());
            async move {
                if flag.load(std::sync::atomic::Ordering::Relaxed) {
                    return StatusCode::INTERNAL_SERVER_ERROR;
                }
                let count = headers.get("ebb-dequeue-count").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
                record.lock().unwrap().push((String::from_utf8_lossy(&body).into_owned(), count));
                StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let site = Site::new(app, "30s");
    let config = std::fs::read_to_string(site.config()).unwrap().replace("[queues.orders]\n", "[queues.orders]\nmax_dequeue_count = 1\n");
    std::fs::write(site.config(), config).unwrap();
    let mut host = site.start_host().await;
    site.ebb(&["send", "orders", "<script>alert(1)</script>"]);
    site.ebb(&["send", "orders", "plain", "--count", "2"]);
    wait_until("3 poisoned", || async { site.first_queue().await.poisoned == 3 }).await;

    let listed: serde_json::Value = serde_json::from_slice(&site.ebb(&["poison", "list", "orders", "--json"]).stdout).unwrap();
    let messages = listed["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{listed}");
    let hostile = messages.iter().find(|m| m["preview"] == "<script>alert(1)</script>").expect("the hostile body, as text");
    assert!(hostile["reason"].as_str().unwrap().contains("500"), "{listed}");
    let table = String::from_utf8(site.ebb(&["poison", "list", "orders"]).stdout).unwrap();
    assert!(table.starts_with("3 poison messages of orders"), "{table}");

    refusing.store(false, std::sync::atomic::Ordering::Relaxed);
    let id = hostile["id"].as_str().unwrap();
    let requeued = String::from_utf8(site.ebb(&["poison", "requeue", "orders", "--id", id]).stdout).unwrap();
    assert!(requeued.contains("requeued 1 poison message to orders"), "{requeued}");
    wait_until("the requeued message handled", || async { !seen.lock().unwrap().is_empty() }).await;
    assert_eq!(seen.lock().unwrap()[0], ("<script>alert(1)</script>".to_string(), "1".to_string()), "the body, with a fresh dequeue count");
    // Ids that are not there (the one requeued just now, a made-up one) are named, and the
    // command fails (attack, session 13: it said "requeued 0" and exited 0).
    let missing = site.command().args(["poison", "requeue", "orders", "--id", id, "--id", "999999", "--config"]).arg(site.config()).output().unwrap();
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success() && said.contains("no poison message of orders has the id") && said.contains("999999"), "{said}");
    let answer = reqwest::Client::new()
        .post(format!("http://{}/queues/orders/poison/requeue?ids=999999,{id}", site.api))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!((answer["requeued"].as_u64(), answer["not_found"].as_array().map(Vec::len)), (Some(0), Some(2)), "{answer}");

    let refused = site.command().args(["poison", "purge", "orders", "--config"]).arg(site.config()).output().unwrap();
    assert!(!refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("add --yes"));
    let wrong_method = reqwest::Client::new().post(format!("http://{}/queues/orders/poison", site.api)).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(wrong_method.status(), reqwest::StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(wrong_method.headers()["allow"], "GET", "the listing is read with GET");
    let unconfirmed = reqwest::Client::new().post(format!("http://{}/queues/orders/poison/purge", site.api)).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(unconfirmed.status(), reqwest::StatusCode::BAD_REQUEST);
    let purged = String::from_utf8(site.ebb(&["poison", "purge", "orders", "--yes"]).stdout).unwrap();
    assert!(purged.contains("purged 2 poison messages of orders"), "{purged}");
    let after: serde_json::Value = serde_json::from_slice(&site.ebb(&["poison", "list", "orders", "--json"]).stdout).unwrap();
    assert_eq!(after["messages"].as_array().unwrap().len(), 0);
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
}
