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

struct Site {
    dir: tempfile::TempDir,
    api: SocketAddr,
}

impl Site {
    fn new(app: SocketAddr, lease: &str) -> Site {
        let dir = tempfile::tempdir().unwrap();
        let api: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        std::fs::create_dir_all(dir.path().join("rules")).unwrap();
        std::fs::copy(guests::PAPER_DEFAULT, dir.path().join("rules/orders.wasm")).unwrap();
        let config = format!(
            "drain_timeout = \"10s\"\n[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n\n[queues.orders]\nrule = \"orders.wasm\"\nlease_duration = \"{lease}\"\nmax_polling_interval = \"2s\"\nhandler = {{ url = \"http://{app}/work\" }}\n"
        );
        std::fs::write(dir.path().join("ebb.toml"), config).unwrap();
        Site { dir, api }
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("ebb.toml")
    }

    fn ebb(&self, args: &[&str]) -> Output {
        let output = Command::new(EBB).args(args).arg("--config").arg(self.config()).output().unwrap();
        assert!(output.status.success(), "ebb {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
        output
    }

    async fn start_host(&self) -> Child {
        let log = std::fs::File::create(self.dir.path().join("host.log")).unwrap();
        let child = Command::new(EBB).arg("run").arg("--config").arg(self.config()).stdout(Stdio::null()).stderr(log).spawn().unwrap();
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
    assert!(metrics.contains("ebb_messages_processed_total{queue=\"orders\"} 45"), "{metrics}");

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
        let status = site.status().await;
        status["queues"][0]["approximate_depth"] == 0 && status["queues"][0]["in_flight"] == 0
    })
    .await;
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
    assert_eq!(store_count(&site.dir.path().join("ebb-data")).await, 0, "every message deleted after its handler succeeded");
}

fn ebb_raw(args: &[&str]) -> Output {
    Command::new(EBB).args(args).output().unwrap()
}

#[test]
fn rule_check_describes_a_rule_and_fails_with_the_reason() {
    let output = ebb_raw(&["rule", "check", guests::THRESHOLD_TABLE, "--param", "table=10:1, *:4"]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for field in ["sha256:", "compile time:", "exports:      ebb:rules/decisions@0.1.0", "imports:", "configure:    ok (1 parameter)"] {
        assert!(text.contains(field), "missing {field:?} in\n{text}");
    }
    let output = ebb_raw(&["rule", "check", guests::FUTURE_VERSION]);
    assert_eq!(output.status.code(), Some(1));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("ebb:rules/decisions@0.2.0, but this host speaks ebb:rules/decisions@0.1.0"), "{error}");
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
    assert_eq!(decision["value"], serde_json::json!({ "delay_ms": 340, "stop": false }), "100 + 3 × 80 ms");
    let output = ebb_raw(&["rule", "eval", guests::PAPER_DEFAULT, "--queue-empty", r#"{"idle": 2}"#]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown field `idle`"));
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
    assert_eq!(post("/queues/orders/messages".into(), vec![b'x'; 65_537]).await.unwrap().status(), reqwest::StatusCode::PAYLOAD_TOO_LARGE);
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
    wait_until("the handler to be called", || async { site.status().await["queues"][0]["in_flight"] == 1 }).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_damaged_on_disk_goes_to_poison_as_corrupt_and_never_to_the_app() {
    let (app, app_addr) = App::start(Duration::ZERO).await;
    let site = Site::new(app_addr, "30s");
    let marker = "MARKER-0123456789-abcdefghijklmnopqrstuvwxyz";
    site.ebb(&["send", "orders", marker]);
    site.ebb(&["send", "orders", "intact"]);
    damage_on_disk(&site.dir.path().join("ebb-data"), marker.as_bytes());
    let mut host = site.start_host().await;
    wait_until("the damaged message poisoned", || async { site.status().await["queues"][0]["poisoned_corrupt"] == 1 }).await;
    wait_until("the intact message handled", || async { app.bodies().contains("intact") }).await;
    assert_eq!(app.seen.lock().unwrap().len(), 1, "the app saw only the intact message: {:?}", app.bodies());
    let status = site.status().await;
    let reason = status["queues"][0]["recent_poison"][0]["reason"].as_str().unwrap().to_string();
    assert!(reason.starts_with("corrupt"), "{status}");
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_the_current_depth_not_the_last_decisions() {
    let (_app, app_addr) = App::start(Duration::ZERO).await;
    let site = Site::new(app_addr, "30s");
    let mut host = site.start_host().await;
    site.ebb(&["send", "orders", "ten", "--count", "10"]);
    wait_until("10 processed", || async { site.status().await["queues"][0]["processed"] == 10 }).await;
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
    wait_until("the rule in use", || async { site.status().await["queues"][0]["rule"]["file"] == "orders.wasm" }).await;
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
    let output = ebb_within(&[OsStr::new("check"), OsStr::new("--config"), site.config().as_os_str()], Duration::from_secs(10)).expect("ebb check hung on a FIFO");
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
        format!("{}\n[azure]\nconnection_string = \"{connection}\"\n", plain.replace("[queues.orders]\n", "[queues.orders]\nbackend = \"azure\"\npartitions = 2\n"))
    };
    std::fs::write(site.config(), with_azure(&azurite.connection_string())).unwrap();
    let checked = String::from_utf8(site.ebb(&["check"]).stdout).unwrap();
    assert!(checked.contains("queue orders-0: reached on Azure") && checked.contains("queue orders-poison: reached on Azure"), "{checked}");

    let mut host = site.start_host().await;
    site.ebb(&["send", "orders", "to-azure", "--count", "20"]);
    wait_until("20 messages handled", || async { app.seen.lock().unwrap().len() >= 20 }).await;
    // `processed` counts a message once its delete returned, which may trail the handler.
    wait_until("20 messages processed", || async { site.status().await["partitioned"][0]["processed"] == 20 }).await;
    let status = site.status().await;
    assert!(status["queues"][0]["transactions"]["gets_with_messages"].as_u64().unwrap() > 0, "{status}");
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());

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
    assert_eq!(site.status().await["queues"][0]["rule"]["sha256"], sha(guests::PAPER_DEFAULT));
    let staging = site.dir.path().join("rules/orders.wasm.partial");
    std::fs::copy(guests::FIXED_TASKS, &staging).unwrap();
    std::fs::rename(&staging, site.dir.path().join("rules/orders.wasm")).unwrap();
    let wanted = sha(guests::FIXED_TASKS);
    wait_until("the new rule in use", || async { site.status().await["queues"][0]["rule"]["sha256"] == wanted.as_str() }).await;
    signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
}
