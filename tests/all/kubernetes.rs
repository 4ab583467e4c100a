//! Issue 25, ready for Kubernetes, through the real binary against a real Azurite and Redis:
//! a send through `ebb scaler` wakes a worker idle at zero tasks, and a host whose storage
//! is down at start-up waits for it (not ready), instead of exiting.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ebb_tests::azurite::{Azurite, free_port, unique_queue_name};
use ebb_tests::redis::RedisServer;

use crate::binary::{App, EBB, signal, wait_until};

const TOKEN: &str = "t0ken";

/// A running `ebb`, killed if the test fails before stopping it.
struct Running {
    child: Option<Child>,
    log: PathBuf,
}

impl Running {
    fn start(dir: &std::path::Path, command: &str, config: &str) -> Running {
        let config_path = dir.join(format!("{command}.toml"));
        std::fs::write(&config_path, config).unwrap();
        let log = dir.join(format!("{command}.log"));
        let child = Command::new(EBB)
            .arg(command)
            .arg("--config")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Running { child: Some(child), log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// True while the process runs.
    fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    async fn stop(mut self) {
        let child = self.child.take().unwrap();
        signal(&child, "-TERM");
        let log = self.log();
        let exit = tokio::task::spawn_blocking(move || {
            let mut child = child;
            child.wait().unwrap()
        })
        .await
        .unwrap();
        assert!(exit.success(), "the host exits 0 on SIGTERM: {exit:?}\n{log}");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

async fn get_json(url: &str) -> Option<(u16, serde_json::Value)> {
    let response = reqwest::Client::new().get(url).bearer_auth(TOKEN).send().await.ok()?;
    let status = response.status().as_u16();
    Some((status, serde_json::from_slice(&response.bytes().await.ok()?).ok()?))
}

async fn bus_connected(api: SocketAddr) -> bool {
    get_json(&format!("http://{api}/status")).await.is_some_and(|(_, status)| status["bus"]["connected"] == true)
}

/// A worker (`ebb run`) and a scaler host (`ebb scaler`) on one `push = true`, `min_tasks = 0`
/// Azure queue with a Redis bus and a safety poll of an hour (only a push wakes the worker
/// within a test), both connected to the bus and the worker idle after `idle` at start.
struct PushPair {
    azurite: Azurite,
    _redis: RedisServer,
    app: App,
    _dir: tempfile::TempDir,
    queue: String,
    scaler_api: SocketAddr,
    worker: Running,
    scaler: Running,
}

impl PushPair {
    async fn start(queue_prefix: &str, idle: Duration) -> PushPair {
        let azurite = Azurite::start();
        let redis = RedisServer::start();
        let (app, app_addr) = App::start(Duration::from_millis(1)).await;
        let dir = tempfile::tempdir().unwrap();
        let queue = unique_queue_name(queue_prefix);
        let azure = format!("[azure]\nconnection_string = \"{}\"\n[bus]\nredis_url = \"{}\"\n", azurite.connection_string(), redis.url());
        let queue_section = format!(
            "[queues.{queue}]\nbackend = \"azure\"\npush = true\nmin_tasks = 0\nsafety_poll = \"1h\"\nhandler = {{ url = \"http://{app_addr}/work\" }}\n"
        );
        let (worker_api, scaler_api, scaler_grpc) = (free_addr(), free_addr(), free_addr());
        let worker_config = format!("data_dir = \"worker-data\"\n[api]\nlisten = \"{worker_api}\"\ntoken = \"{TOKEN}\"\n{azure}{queue_section}");
        let worker = Running::start(dir.path(), "run", &worker_config);
        let scaler_config = format!(
            "data_dir = \"scaler-data\"\n[api]\nlisten = \"{scaler_api}\"\ntoken = \"{TOKEN}\"\n[scaler]\nlisten = \"{scaler_grpc}\"\n{azure}{queue_section}"
        );
        let scaler = Running::start(dir.path(), "scaler", &scaler_config);
        wait_until("the worker's bus", || bus_connected(worker_api)).await;
        wait_until("the scaler host's bus", || bus_connected(scaler_api)).await;
        // Let the worker's start-up poll pass, so it runs no task.
        tokio::time::sleep(idle).await;
        PushPair { azurite, _redis: redis, app, _dir: dir, queue, scaler_api, worker, scaler }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_or_notify_through_the_scaler_host_wakes_a_worker_idle_at_zero_tasks() {
    let PushPair { azurite, _redis, app, _dir, queue, scaler_api, worker, scaler } = PushPair::start("wake-from-zero", Duration::from_millis(500)).await;

    let client = reqwest::Client::new();
    let sent = client.post(format!("http://{scaler_api}/queues/{queue}/messages")).bearer_auth(TOKEN).body("via-scaler").send().await.unwrap();
    assert_eq!(sent.status(), reqwest::StatusCode::CREATED);
    let start = Instant::now();
    wait_until("the worker to handle the message sent to the scaler host", || async { app.seen.lock().unwrap().iter().any(|(_, b)| b == "via-scaler") }).await;
    assert!(start.elapsed() < Duration::from_secs(10), "woken by the push, not a poll: {:?}", start.elapsed());

    // Put straight into storage by another program, then announced through the scaler host.
    let direct = ebb::queue::azure::AzureQueue::new(&azurite.account(), &queue, Default::default()).unwrap();
    use ebb::queue::QueueClient as _;
    direct.put(b"put-directly", Duration::ZERO).await.unwrap();
    let notified = client.post(format!("http://{scaler_api}/queues/{queue}/notify")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(notified.status(), reqwest::StatusCode::ACCEPTED);
    wait_until("the worker to handle the message announced to the scaler host", || async { app.seen.lock().unwrap().iter().any(|(_, b)| b == "put-directly") })
        .await;
    let (_, status) = get_json(&format!("http://{scaler_api}/status")).await.unwrap();
    assert!(status["bus"]["published"].as_u64().unwrap() >= 2, "the scaler host published both: {status}");
    scaler.stop().await;
    worker.stop().await;
}

/// Issue 40 item 4: a message put straight into storage (no bus publish) waited for the
/// workers' safety poll (22+ minutes seen), while `ebb scaler` counted it every second and
/// told KEDA the queue was active. The scaler now publishes the wake-up itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_put_directly_wakes_a_push_worker_idle_at_zero_tasks_within_5_s() {
    let PushPair { azurite, _redis, app, _dir, queue, scaler_api, worker, scaler } = PushPair::start("direct-put", Duration::from_secs(1)).await;
    let published = || async { get_json(&format!("http://{scaler_api}/status")).await.unwrap().1["bus"]["published"].as_u64().unwrap() };
    assert_eq!(published().await, 0, "an empty queue is never woken");

    let direct = ebb::queue::azure::AzureQueue::new(&azurite.account(), &queue, Default::default()).unwrap();
    use ebb::queue::QueueClient as _;
    direct.put(b"put-directly", Duration::ZERO).await.unwrap();
    let start = Instant::now();
    wait_until("the worker to handle the message put directly", || async { app.seen.lock().unwrap().iter().any(|(_, b)| b == "put-directly") }).await;
    let waited = start.elapsed();
    assert!(waited < Duration::from_secs(5), "woken by the scaler, not a poll: {waited:?}\n{}", worker.log());
    // Handled and deleted: the scaler has nothing more to wake.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let woken = published().await;
    assert!((1..=2).contains(&woken), "the scaler published {woken} wake-ups for one message");
    eprintln!("a direct put handled after {waited:?}; {woken} wake-up(s) published");
    scaler.stop().await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_storage_is_down_at_start_waits_not_ready_then_delivers_everything() {
    let (app, app_addr) = App::start(Duration::from_millis(1)).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let api = free_addr();
    let queue = unique_queue_name("down-at-start");
    let config = format!(
        "[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n[azure]\nconnection_string = \"{}\"\n\
         [queues.{queue}]\nbackend = \"azure\"\nmax_polling_interval = \"1s\"\nhandler = {{ url = \"http://{app_addr}/work\" }}\n",
        Azurite::connection_string_for(port)
    );
    let mut host = Running::start(dir.path(), "run", &config);
    wait_until("the API, with storage down", || async { reqwest::get(format!("http://{api}/healthz")).await.is_ok_and(|r| r.status().is_success()) }).await;
    let ready = format!("http://{api}/readyz");
    let (status, body) = get_json(&ready).await.unwrap();
    assert_eq!(status, 503, "not ready while storage is down: {body}");
    assert_eq!(body["queues"][&queue]["ready"], false, "{body}");
    // Storage stays down for 30 s (the case): the host must not exit.
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(30) {
        assert!(host.alive(), "the host exited while storage was down:\n{}", host.log());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (status, _) = get_json(&ready).await.unwrap();
    assert_eq!(status, 503);
    let azurite = Azurite::start_on(port);
    let up = Instant::now();
    wait_until("ready after storage came up", || async { get_json(&ready).await.is_some_and(|(status, _)| status == 200) }).await;
    assert!(up.elapsed() < Duration::from_secs(15), "ready within the start-up back-off: {:?}", up.elapsed());
    let client = reqwest::Client::new();
    for i in 0..20 {
        let sent = client.post(format!("http://{api}/queues/{queue}/messages")).bearer_auth(TOKEN).body(format!("m{i}")).send().await.unwrap();
        assert_eq!(sent.status(), reqwest::StatusCode::CREATED);
    }
    wait_until("all 20 delivered", || async { app.seen.lock().unwrap().len() >= 20 }).await;
    let bodies: std::collections::BTreeSet<String> = app.seen.lock().unwrap().iter().map(|(_, b)| b.clone()).collect();
    assert_eq!(bodies.len(), 20, "every message sent after recovery delivered once");
    host.stop().await;
    drop(azurite);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_account_key_at_start_still_exits_at_once_naming_the_queue() {
    let azurite = Azurite::start();
    let dir = tempfile::tempdir().unwrap();
    let wrong = azurite.connection_string().replace("AccountKey=", "AccountKey=AAAA");
    let config = format!(
        "[api]\nlisten = \"{}\"\n[azure]\nconnection_string = \"{wrong}\"\n[queues.orders]\nbackend = \"azure\"\nhandler = {{ url = \"http://127.0.0.1:9/work\" }}\n",
        free_addr()
    );
    let mut host = Running::start(dir.path(), "run", &config);
    let deadline = Instant::now() + Duration::from_secs(30);
    while host.alive() {
        assert!(Instant::now() < deadline, "a fatal storage error must end the host:\n{}", host.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let exit = host.child.take().unwrap().wait().unwrap();
    assert_eq!(exit.code(), Some(1));
    assert!(host.log().contains("queue orders"), "the error names the queue:\n{}", host.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_outage_mid_run_turns_readyz_503_within_10_s_and_back_within_10_s() {
    let azurite = Azurite::start();
    let proxy = ebb_tests::fault_proxy::FaultProxy::start(azurite.port(), 0.0, 7).await;
    let (app, app_addr) = App::start(Duration::from_millis(1)).await;
    let dir = tempfile::tempdir().unwrap();
    let api = free_addr();
    let queue = unique_queue_name("outage-mid-run");
    // Polling at most every 2 s: an idle queue still asks its storage often enough to notice.
    let config = format!(
        "[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n[azure]\nconnection_string = \"{}\"\n\
         [queues.{queue}]\nbackend = \"azure\"\nmax_polling_interval = \"2s\"\nhandler = {{ url = \"http://{app_addr}/work\" }}\n",
        proxy.connection_string()
    );
    let host = Running::start(dir.path(), "run", &config);
    let ready = format!("http://{api}/readyz");
    wait_until("ready", || async { get_json(&ready).await.is_some_and(|(status, _)| status == 200) }).await;

    proxy.set_down(true);
    let down = Instant::now();
    wait_until("not ready during the outage", || async { get_json(&ready).await.is_some_and(|(status, _)| status == 503) }).await;
    assert!(down.elapsed() < Duration::from_secs(10), "/readyz turned 503 after {:?}", down.elapsed());
    let (_, body) = get_json(&ready).await.unwrap();
    let reason = body["queues"][&queue]["problems"]["storage"].as_str().unwrap_or_default().to_string();
    assert!(reason.contains("connection"), "the reason names the class of failure: {body}");
    tokio::time::sleep(Duration::from_secs(5)).await;

    proxy.set_down(false);
    let up = Instant::now();
    wait_until("ready after the outage", || async { get_json(&ready).await.is_some_and(|(status, _)| status == 200) }).await;
    assert!(up.elapsed() < Duration::from_secs(10), "/readyz turned 200 after {:?}", up.elapsed());
    let sent = reqwest::Client::new().post(format!("http://{api}/queues/{queue}/messages")).bearer_auth(TOKEN).body("after").send().await.unwrap();
    assert_eq!(sent.status(), reqwest::StatusCode::CREATED);
    wait_until("the message sent after the outage", || async { app.seen.lock().unwrap().iter().any(|(_, b)| b == "after") }).await;
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_never_answers_does_not_slow_a_send() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let api = free_addr();
    let config = format!(
        "[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n[bus]\nredis_url = \"{}\"\n[queues.orders]\nhandler = {{ url = \"http://127.0.0.1:9/work\" }}\n",
        redis.url()
    );
    let host = Running::start(dir.path(), "run", &config);
    wait_until("the bus", || bus_connected(api)).await;
    // Redis accepts connections and reads nothing from now on.
    redis.freeze();
    let client = reqwest::Client::new();
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let started = Instant::now();
        let sent = client.post(format!("http://{api}/queues/orders/messages")).bearer_auth(TOKEN).body(format!("m{i}")).send().await.unwrap();
        assert_eq!(sent.status(), reqwest::StatusCode::CREATED);
        slowest = slowest.max(started.elapsed());
    }
    assert!(slowest < Duration::from_secs(1), "a send waited {slowest:?} on a frozen Redis");
    redis.thaw();
    host.stop().await;
}

/// The value of the `/metrics` series `series` (its name and labels as written), if exported.
async fn metric_value(api: SocketAddr, series: &str) -> Option<f64> {
    let text = reqwest::Client::new().get(format!("http://{api}/metrics")).bearer_auth(TOKEN).send().await.ok()?.text().await.ok()?;
    text.lines().find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// Issue 40: a queue and its poison queue deleted under a running host (an operator's
/// delete, an account restored empty) come back: a message sent after the delete is
/// delivered within 30 s, a message that cannot be handled still reaches `<queue>-poison`,
/// each creation is counted, and `/metrics` counts the poison queue's calls with the queue's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_and_its_poison_queue_deleted_under_a_running_host_work_again_within_30_s() {
    use ebb_tests::azure_sdk::delete_queue;
    let azurite = Azurite::shared();
    let (app, app_addr) = App::start(Duration::from_millis(1)).await;
    let dir = tempfile::tempdir().unwrap();
    let api = free_addr();
    let queue = unique_queue_name("deleted-mid-run");
    let poison = format!("{queue}-poison");
    let connection = azurite.connection_string();
    let config = format!(
        "[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n[azure]\nconnection_string = \"{connection}\"\n\
         [queues.{queue}]\nbackend = \"azure\"\nmax_polling_interval = \"1s\"\nhandler = {{ url = \"http://{app_addr}/work\" }}\n"
    );
    let host = Running::start(dir.path(), "run", &config);
    let ready = format!("http://{api}/readyz");
    wait_until("ready", || async { get_json(&ready).await.is_some_and(|(status, _)| status == 200) }).await;

    delete_queue(&connection, &queue);
    delete_queue(&connection, &poison);
    let deleted = Instant::now();
    let sent = reqwest::Client::new().post(format!("http://{api}/queues/{queue}/messages")).bearer_auth(TOKEN).body("after").send().await.unwrap();
    assert_eq!(sent.status(), reqwest::StatusCode::CREATED, "{}", sent.text().await.unwrap_or_default());
    wait_until("the message sent after the delete", || async { app.seen.lock().unwrap().iter().any(|(_, b)| b == "after") }).await;
    assert!(deleted.elapsed() < Duration::from_secs(30), "delivered {:?} after the delete", deleted.elapsed());

    // Text that is not base64 cannot be handled: it is moved to the poison queue, created again.
    let direct = ebb::queue::azure::AzureQueue::new(&azurite.account(), &queue, Default::default()).unwrap();
    let plain = ebb::queue::azure::AzureOptions { encoding: ebb::queue::azure::Encoding::None, ..Default::default() };
    let plain = ebb::queue::azure::AzureQueue::new(&azurite.account(), &queue, plain).unwrap();
    use ebb::queue::QueueClient as _;
    plain.put(b"not base64!", Duration::ZERO).await.unwrap();
    let poisoned = ebb::queue::azure::AzureQueue::new(&azurite.account(), &poison, Default::default()).unwrap();
    wait_until("the poison queue created again, holding the message", || async { poisoned.approximate_count().await.is_ok_and(|n| n == 1) }).await;
    assert_eq!(direct.approximate_count().await.unwrap(), 0);
    assert_eq!(metric_value(api, &format!("ebb_storage_recreated_total{{queue=\"{queue}\"}}")).await, Some(1.0));
    assert_eq!(metric_value(api, &format!("ebb_storage_recreated_total{{queue=\"{poison}\"}}")).await, Some(1.0));
    let missing_put = format!("ebb_storage_failures_total{{queue=\"{poison}\",kind=\"put\",class=\"missing\"}}");
    assert_eq!(metric_value(api, &missing_put).await, Some(1.0), "the poison queue's failed put is counted");
    let (_, status) = get_json(&format!("http://{api}/status")).await.unwrap();
    assert!(status["storage"].as_array().unwrap().iter().any(|s| s["queue"] == poison.as_str() && s["recreated"] == 1), "{status}");
    assert_eq!(get_json(&ready).await.unwrap().0, 200);
    assert!(host.log().contains("created it again"), "the creation is logged:\n{}", host.log());
    host.stop().await;
}

/// Issue 40: a credential the storage refuses after start-up (a SAS past its expiry, a
/// rotated key; here the fault proxy answering 403 AuthenticationFailed as Azure does)
/// fails `/healthz` as well as `/readyz`, naming the queue, as docs/guides/kubernetes.md says: the
/// liveness probe restarts the pod, which reads the renewed secret. The next answer clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "host defect found 2026-11-29, to fix next: /readyz answers 200 before the poison queue is created, so under load the refusals start mid start-up and the host exits (failed to create queue …-poison)"]
async fn a_credential_refused_after_start_up_fails_healthz_until_the_storage_takes_it_again() {
    let azurite = Azurite::shared();
    let proxy = ebb_tests::fault_proxy::FaultProxy::start(azurite.port(), 0.0, 7).await;
    let (_app, app_addr) = App::start(Duration::from_millis(1)).await;
    let dir = tempfile::tempdir().unwrap();
    let api = free_addr();
    let queue = unique_queue_name("refused-mid-run");
    let config = format!(
        "[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n[azure]\nconnection_string = \"{}\"\n\
         [queues.{queue}]\nbackend = \"azure\"\nmax_polling_interval = \"1s\"\nhandler = {{ url = \"http://{app_addr}/work\" }}\n",
        proxy.connection_string()
    );
    let host = Running::start(dir.path(), "run", &config);
    let (health, ready) = (format!("http://{api}/healthz"), format!("http://{api}/readyz"));
    wait_until("ready", || async { get_json(&ready).await.is_some_and(|(status, _)| status == 200) }).await;

    proxy.set_refusing(true);
    let refused = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(60);
    while get_json(&health).await.is_none_or(|(status, _)| status != 503) {
        assert!(Instant::now() < deadline, "/healthz did not turn 503 within 60 s of the refusals; the host's log:\n{}", host.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused.elapsed() < Duration::from_secs(10), "/healthz turned 503 after {:?}; the host's log:\n{}", refused.elapsed(), host.log());
    let (_, body) = get_json(&health).await.unwrap();
    let problem = body["problems"][format!("queue {queue}")].as_str().unwrap_or_default().to_string();
    assert!(problem.contains("AuthenticationFailed") && problem.contains("check the account key"), "{body}");
    let (status, body) = get_json(&ready).await.unwrap();
    assert_eq!(status, 503);
    assert!(body["queues"][&queue]["problems"]["credential"].as_str().is_some_and(|p| p.contains("AuthenticationFailed")), "{body}");

    proxy.set_refusing(false);
    wait_until("/healthz 200 again", || async { reqwest::get(&health).await.is_ok_and(|r| r.status().is_success()) }).await;
    wait_until("/readyz 200 again", || async { get_json(&ready).await.is_some_and(|(status, _)| status == 200) }).await;
    host.stop().await;
}
