//! The rollout loop (issue 22): a host records its queues' arrivals, `ebb trace export`
//! turns the recording into a trace, and `ebb simulate --config --queue` runs the queue's
//! own rule and settings on it against candidate rules.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ebb_tests::guests;
use serde_json::Value;

use crate::binary::{App, EBB, signal, wait_until};

const TOKEN: &str = "r0llout";

/// A host's folder: `ebb.toml` with one queue `orders` (these extra keys), its data and rules.
struct Site {
    dir: tempfile::TempDir,
    api: SocketAddr,
}

impl Site {
    fn new(app: SocketAddr, queue_keys: &str) -> Site {
        let dir = tempfile::tempdir().unwrap();
        let api = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        std::fs::create_dir_all(dir.path().join("rules")).unwrap();
        let config = format!(
            "drain_timeout = \"10s\"\n[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n\n[queues.orders]\n{queue_keys}handler = {{ url = \"http://{app}/work\" }}\n"
        );
        std::fs::write(dir.path().join("ebb.toml"), config).unwrap();
        Site { dir, api }
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("ebb.toml")
    }

    fn ebb(&self, args: &[&str]) -> Output {
        Command::new(EBB).args(args).arg("--config").arg(self.config()).output().unwrap()
    }

    async fn start_host(&self) -> Child {
        let log = std::fs::File::create(self.dir.path().join("host.log")).unwrap();
        let child = Command::new(EBB).arg("run").arg("--config").arg(self.config()).stdout(Stdio::null()).stderr(log).spawn().unwrap();
        let url = format!("http://{}/healthz", self.api);
        wait_until("the host's API", || async { reqwest::get(&url).await.is_ok_and(|r| r.status().is_success()) }).await;
        child
    }

    async fn post(&self, path: &str, body: String) -> reqwest::StatusCode {
        let url = format!("http://{}/queues/orders/{path}", self.api);
        reqwest::Client::new().post(url).bearer_auth(TOKEN).body(body).send().await.unwrap().status()
    }

    async fn status(&self) -> Value {
        let url = format!("http://{}/status", self.api);
        let response = reqwest::Client::new().get(url).bearer_auth(TOKEN).send().await.unwrap();
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
    }

    /// `ebb trace export orders` (with `args`) into a file; the trace's (seconds, count) lines.
    fn export(&self, args: &[&str]) -> (Vec<(f64, u64)>, String) {
        let file = self.dir.path().join("exported.csv");
        let output = self.ebb(&[&["trace", "export", "orders", "-o", file.to_str().unwrap()][..], args].concat());
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "export failed: {stderr}");
        (trace_lines(&std::fs::read_to_string(&file).unwrap()), stderr)
    }
}

/// A trace's arrivals, as `ebb simulate --trace` reads them (comments and the header skipped).
fn trace_lines(text: &str) -> Vec<(f64, u64)> {
    text.lines()
        .filter(|line| !line.starts_with('#') && *line != "seconds,count")
        .map(|line| match line.split_once(',') {
            Some((at, count)) => (at.parse().unwrap(), count.parse().unwrap()),
            None => (line.parse().unwrap(), 1),
        })
        .collect()
}

fn total(lines: &[(f64, u64)]) -> u64 {
    lines.iter().map(|(_, n)| n).sum()
}

async fn stop(host: Child) {
    signal(&host, "-TERM");
    let mut host = host;
    assert!(tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_export_gives_each_arrival_once_while_the_host_runs_and_after() {
    let (app, app_addr) = App::start(Duration::from_millis(1)).await;
    let site = Site::new(app_addr, "");
    // Put straight into the store while no host runs: the host sees them first at its gets.
    let sent = site.ebb(&["send", "orders", "early", "--count", "5"]);
    assert!(sent.status.success(), "{}", String::from_utf8_lossy(&sent.stderr));
    let host = site.start_host().await;
    wait_until("the messages sent before the start", || async { app.seen.lock().unwrap().len() >= 5 }).await;
    // Through the API: counted when put, and not again when first got.
    for i in 0..20 {
        assert_eq!(site.post("messages", format!("m{i}")).await, reqwest::StatusCode::CREATED);
    }
    assert!(site.post("notify", String::new()).await.is_success());
    wait_until("every message handled", || async { app.seen.lock().unwrap().len() >= 25 }).await;
    // The recorder writes the seconds that are over, once a second.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (lines, stderr) = site.export(&[]);
    assert_eq!(total(&lines), 25, "each arrival once, exported while the host runs: {lines:?} {stderr}");
    assert!(lines.iter().all(|(at, _)| *at < 60.0), "seconds from the first arrival: {lines:?}");

    // Refused with the reason: an unknown queue names the configured ones; --since is bounded.
    let output = site.ebb(&["trace", "export", "nope"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("queue \"nope\": not in the configuration (its queues: orders)"), "{stderr}");
    for since in ["0s", "32days", "soon"] {
        let output = site.ebb(&["trace", "export", "orders", "--since", since]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "--since {since}: {stderr}");
        assert!(stderr.contains("--since"), "{stderr}");
    }

    stop(host).await;
    // A damaged line is skipped with a warning; what the files hold besides is still exported.
    let old = site.dir.path().join("ebb-data/recordings/orders.old.csv");
    std::fs::write(&old, "not a recording\n").unwrap();
    let (lines, stderr) = site.export(&["--since", "1h"]);
    assert_eq!(total(&lines), 25, "after the shutdown's last write: {lines:?}");
    assert!(stderr.contains("warning: the recording") && stderr.contains("orders.old.csv: skipped 1 damaged line"), "{stderr}");
}

/// A run of `ebb simulate` with these arguments, as JSON without its real-time figures.
fn simulate(site: &Site, args: &[&str]) -> Value {
    let output = Command::new(EBB).arg("simulate").arg("--config").arg(site.config()).args(args).arg("--json").output().unwrap();
    assert!(output.status.success(), "simulate {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    let mut report: Value = serde_json::from_slice(&output.stdout).unwrap();
    for rule in report["rules"].as_array_mut().unwrap() {
        rule.as_object_mut().unwrap().remove("wall_secs");
    }
    report
}

#[test]
fn simulate_with_the_config_runs_the_queues_rule_and_candidates_reproducibly() {
    let site = Site::new("127.0.0.1:9".parse().unwrap(), "rule = \"live.wasm\"\nrule_params = { per_task = \"200\" }\nmax_tasks = 24\n");
    std::fs::copy(guests::PROPORTIONAL, site.dir.path().join("rules/live.wasm")).unwrap();
    let trace = site.dir.path().join("trace.csv");
    // A backlog of 3,000, then a trickle.
    let text: String = std::iter::once("0,3000\n".to_string()).chain((1..120).map(|s| format!("{}\n", 60 + s))).collect();
    std::fs::write(&trace, text).unwrap();
    let args = [
        "--queue",
        "orders",
        "--trace",
        trace.to_str().unwrap(),
        "--candidate",
        guests::PROPORTIONAL,
        "--param",
        "per_task=10",
        "--candidate",
        guests::PROPORTIONAL,
        "--param",
        "per_task=2000",
        "--seed",
        "5",
    ];
    let first = simulate(&site, &args);
    let second = simulate(&site, &args);
    assert_eq!(first, second, "the same inputs and seed give the same report");
    let rules = first["rules"].as_array().unwrap();
    let names: Vec<&str> = rules.iter().map(|r| r["rule"].as_str().unwrap()).collect();
    assert_eq!(names, ["live: live.wasm per_task=200", "proportional.wasm per_task=10", "proportional.wasm per_task=2000"]);
    // The queue's max_tasks holds for every rule; each candidate's parameter is applied.
    let peaks: Vec<u64> = rules.iter().map(|r| r["peak_tasks"].as_u64().unwrap()).collect();
    assert_eq!(peaks[1], 24, "one task per 10 messages, up to the queue's max_tasks: {peaks:?}");
    assert!(peaks[2] < peaks[0] && peaks[0] < peaks[1], "one task per 2000 runs fewer than per 200, which runs fewer than per 10: {peaks:?}");

    // Bad input is refused with the reason.
    for (extra, expected) in [
        (vec!["--queue", "nope"], "queue \"nope\": not in the configuration (its queues: orders)"),
        (vec!["--queue", "orders", "--param", "per_task=5"], "--param per_task=5: give it after the --candidate FILE.wasm it is for"),
        (vec!["--queue", "orders", "--candidate", "rules.txt"], "--candidate: rules.txt is not a rule component"),
        (vec!["--queue", "orders", "--candidate", "/dev/zero.wasm"], "--rule: cannot open /dev/zero.wasm"),
        (vec!["--queue", "orders", "--candidate", guests::PROPORTIONAL, "--param", "per_task=0"], "per_task"),
        (vec!["--queue", "orders", "--candidate", guests::PROPORTIONAL, "--param", "a=1", "--param", "a=2"], "--param a: given twice"),
    ] {
        let output = Command::new(EBB)
            .arg("simulate")
            .arg("--config")
            .arg(site.config())
            .args(["--scenario", "idle", "--duration", "1m"])
            .args(&extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{extra:?}: {stderr}");
        assert!(stderr.contains(expected), "{extra:?}: expected {expected:?} in {stderr}");
    }
}

/// The run: posts through the API at `arrivals` (seconds from `start`), returns when each
/// is sent.
async fn post_at(site: &Site, start: tokio::time::Instant, arrivals: &[f64]) {
    for (i, at) in arrivals.iter().enumerate() {
        tokio::time::sleep_until(start + Duration::from_secs_f64(*at)).await;
        assert_eq!(site.post("messages", format!("m{i}")).await, reqwest::StatusCode::CREATED);
    }
}

fn billed(transactions: &Value) -> u64 {
    ["puts", "gets_with_messages", "gets_empty", "deletes", "updates", "counts", "creates"].iter().map(|k| transactions[*k].as_u64().unwrap()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exported_trace_of_a_real_run_simulated_with_its_config_bills_within_ten_percent() {
    let (app, app_addr) = App::start(Duration::from_millis(1)).await;
    let site = Site::new(app_addr, "max_polling_interval = \"10s\"\n");
    // 50 s: a burst of 60 over 3 s from 1 s, then one message every 700 ms from 8 s to 36 s.
    let mut arrivals: Vec<f64> = (0..60).map(|i| 1.0 + f64::from(i) * 0.05).collect();
    arrivals.extend((0..40).map(|i| 8.0 + f64::from(i) * 0.7));
    let run = Duration::from_secs(50);
    let host = site.start_host().await;
    let start = tokio::time::Instant::now();
    let first_post = SystemTime::now() + Duration::from_secs(1);
    post_at(&site, start, &arrivals).await;
    tokio::time::sleep_until(start + run).await;
    let status = site.status().await;
    let ended = SystemTime::now();
    stop(host).await;
    assert_eq!(app.seen.lock().unwrap().len(), 100);
    let real = billed(&status["queues"][0]["transactions"]);

    let (lines, _) = site.export(&["--since", "1h"]);
    assert_eq!(total(&lines), 100);
    let trace = site.dir.path().join("exported.csv");
    // From the second of the first arrival (the trace's 0) to the status: what the host billed
    // over, but for the second it ran before the first arrival.
    let first_second = first_post.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    let duration = ended.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs_f64() - first_second as f64;
    let duration = format!("{}ms", (duration * 1000.0) as u64);
    // Every send through the API notifies the queue: --notify.
    let report = simulate(&site, &["--queue", "orders", "--trace", trace.to_str().unwrap(), "--duration", &duration, "--notify", "--handler-time", "1ms"]);
    let rule = &report["rules"][0];
    assert_eq!(rule["handled"], 100, "{rule}");
    let sim = rule["billed_transactions"].as_u64().unwrap();
    let difference = (sim as f64 - real as f64).abs() / real as f64;
    println!("billed: simulated {sim} {}, real {real} {}", rule["transactions"], status["queues"][0]["transactions"]);
    assert!(difference <= 0.10, "simulated {sim}, real {real}: {:.1} % apart", difference * 100.0);
}

/// Fails each message's first try, handles the retry.
struct FailsFirstTry(std::sync::atomic::AtomicU64);

#[async_trait::async_trait]
impl ebb::handler::Handler for FailsFirstTry {
    async fn handle(&self, message: &ebb::handler::IncomingMessage) -> anyhow::Result<()> {
        if message.dequeue_count == 1 {
            anyhow::bail!("the first try fails");
        }
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_redelivered_message_is_not_recorded_as_a_second_arrival() {
    use ebb::queue::QueueClient as _;
    let clock = Arc::new(ebb::queue::TokioClock::new());
    let queue = Arc::new(ebb::queue::memory::MemoryQueue::new("orders", clock.clone(), 65536));
    let poison = Arc::new(ebb::queue::memory::MemoryQueue::new("orders-poison", clock.clone(), 65536));
    for i in 0..40 {
        queue.put(format!("m{i}").as_bytes(), Duration::ZERO).await.unwrap();
    }
    let recording = Arc::new(ebb::record::QueueRecording::new("orders", clock.clone()));
    let handler = Arc::new(FailsFirstTry(Default::default()));
    let settings = ebb::listener::QueueSettings { visibility_timeout: Duration::from_millis(100), ..Default::default() };
    let listener = ebb::listener::Listener::builder(queue, poison, handler.clone()).settings(settings).recording(recording.clone()).build();
    listener.start();
    for _ in 0..600 {
        if handler.0.load(std::sync::atomic::Ordering::SeqCst) == 40 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    listener.shutdown(Duration::from_secs(5)).await;
    assert_eq!(handler.0.load(std::sync::atomic::Ordering::SeqCst), 40, "each message handled at its second try");
    let buckets = recording.take_finished(true);
    let first_seen: u64 = buckets.iter().map(|b| b.first_seen).sum();
    assert_eq!(first_seen, 40, "40 messages got twice each are 40 arrivals: {buckets:?}");
    assert_eq!(ebb::record::arrivals(&buckets).iter().map(|(_, n)| n).sum::<u64>(), 40);
}

/// A recording of `orders` in `site`'s data directory: `puts` put a minute ago.
fn recorded(site: &Site, puts: u64) {
    let dir = site.dir.path().join("ebb-data/recordings");
    std::fs::create_dir_all(&dir).unwrap();
    let second = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() - 60;
    std::fs::write(dir.join("orders.csv"), format!("# ebb arrivals v1: unix_second,puts,first_seen,notifications\n{second},{puts},0,0\n")).unwrap();
}

#[test]
fn trace_export_writes_to_a_device_or_a_fifo_as_it_is_and_refuses_a_directory() {
    let site = Site::new("127.0.0.1:9".parse().unwrap(), "");
    recorded(&site, 3);
    let export_to = |output: &Path| site.ebb(&["trace", "export", "orders", "-o", output.to_str().unwrap()]);
    let done = export_to(Path::new("/dev/null"));
    assert!(done.status.success(), "-o /dev/null: {}", String::from_utf8_lossy(&done.stderr));

    // A FIFO is written straight into, not replaced: its reader gets the trace.
    let fifo = site.dir.path().join("trace.fifo");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let reader = std::thread::spawn({
        let fifo = fifo.clone();
        move || std::fs::read_to_string(fifo).unwrap()
    });
    let done = export_to(&fifo);
    assert!(done.status.success(), "-o FIFO: {}", String::from_utf8_lossy(&done.stderr));
    assert_eq!(total(&trace_lines(&reader.join().unwrap())), 3);
    use std::os::unix::fs::FileTypeExt as _;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO is still a FIFO");

    // A regular file gets the whole trace, through a temporary file that does not stay behind.
    let file = site.dir.path().join("out/trace.csv");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, "an older trace\n").unwrap();
    let done = export_to(&file);
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    assert_eq!(total(&trace_lines(&std::fs::read_to_string(&file).unwrap())), 3);
    assert_eq!(std::fs::read_dir(file.parent().unwrap()).unwrap().count(), 1, "no temporary file is left");

    // A directory is not something to write a trace into.
    let done = export_to(site.dir.path());
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(!done.status.success() && stderr.contains("is a directory"), "{stderr}");
}

/// Attack pass (session 11): `-o` into a missing folder made the folders (at the root of the
/// disk for `/nonexist/dir/f`), `-o` onto the queue's own recording replaced it, and a file
/// replaced through the temporary file came out 0600.
#[test]
fn trace_export_makes_no_folder_spares_the_recordings_and_keeps_a_files_mode() {
    use std::os::unix::fs::PermissionsExt as _;
    let site = Site::new("127.0.0.1:9".parse().unwrap(), "");
    recorded(&site, 3);
    let export_to = |output: &Path| site.ebb(&["trace", "export", "orders", "-o", output.to_str().unwrap()]);
    let missing = site.dir.path().join("no-such-folder/deeper/trace.csv");
    let done = export_to(&missing);
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(!done.status.success() && stderr.contains("does not exist"), "{stderr}");
    assert!(!site.dir.path().join("no-such-folder").exists(), "the folder was made");

    let recording = site.dir.path().join("ebb-data/recordings/orders.csv");
    let before = std::fs::read(&recording).unwrap();
    let done = export_to(&recording);
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(!done.status.success() && stderr.contains("recordings"), "{stderr}");
    assert_eq!(std::fs::read(&recording).unwrap(), before, "the recording was replaced");

    let file = site.dir.path().join("shared.csv");
    std::fs::write(&file, "an older trace\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let done = export_to(&file);
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o644);
}

#[test]
fn trace_export_shows_durations_as_they_are_written() {
    let site = Site::new("127.0.0.1:9".parse().unwrap(), "");
    recorded(&site, 2);
    let file = site.dir.path().join("exported.csv");
    let done = site.ebb(&["trace", "export", "orders", "-o", file.to_str().unwrap()]);
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.starts_with("# ebb trace export: queue orders, the last 1day, 2 messages\n"), "{text}");
    let done = site.ebb(&["trace", "export", "orders", "--since", "32days"]);
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(stderr.contains("32days is outside 1s to 31days"), "{stderr}");
    let done = Command::new(EBB).args(["trace", "export", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&done.stdout);
    assert!(help.contains("1s to 31days") && help.contains("[default: 24h]"), "{help}");
}
