//! Issue 9, several hosts on one Azure queue: two `ebb run` processes (their own data
//! directories and API ports) on the same queue of one Azurite, under load; then kill -9 of
//! one of them mid-load. The app records which host handled which message, and whether two
//! handlers ever held the same message at the same time.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use ebb::queue::QueueClient;
use ebb::queue::azure::{AzureOptions, AzureQueue};
use ebb_tests::azurite::Azurite;
use ebb_tests::fault_proxy::FaultProxy;
use ebb_tests::guests;

const EBB: &str = env!("CARGO_BIN_EXE_ebb-under-test");
const TOKEN: &str = "t0ken";
/// The Azure queue both hosts read (this test has its own Azurite, so the name is free).
pub(crate) const QUEUE: &str = "orders";

#[derive(Default)]
pub(crate) struct Record {
    /// Completed handles: (message id, body, host).
    handled: Vec<(String, String, String)>,
    /// Bodies being handled now, with the host handling each.
    in_flight: BTreeMap<String, String>,
    /// Bodies a second handler received while a first still held them: (body, hosts).
    overlaps: Vec<(String, String, String)>,
    /// Hosts killed: a handler that ends after its host died is not a success (its answer
    /// cannot reach the host, which never deletes the message).
    dead: BTreeSet<String>,
    /// When each completed handle ended.
    ended: Vec<(String, Instant)>,
    /// How long a handler takes.
    delay: Duration,
}

/// The application both hosts forward to, at `/work/<host>`.
#[derive(Clone, Default)]
pub(crate) struct App {
    record: Arc<Mutex<Record>>,
}

/// Takes a body out of the in-flight set when its handler ends, even if the request is
/// dropped (the host that sent it was killed).
struct InFlight {
    record: Arc<Mutex<Record>>,
    body: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.record.lock().unwrap().in_flight.remove(&self.body);
    }
}

impl App {
    pub(crate) async fn start(delay: Duration) -> (App, SocketAddr) {
        let app = App::default();
        app.record.lock().unwrap().delay = delay;
        let record = app.record.clone();
        let router = axum::Router::new().route(
            "/work/{host}",
            axum::routing::post(move |Path(host): Path<String>, headers: HeaderMap, body: Bytes| {
                let record = record.clone();
                async move {
                    let id = headers.get("ebb-message-id").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
                    let body = String::from_utf8_lossy(&body).into_owned();
                    let guard = {
                        let mut r = record.lock().unwrap();
                        match r.in_flight.get(&body).cloned() {
                            // A killed host's call the app is still finishing holds nothing: its
                            // answer reaches no one (seen in CI, the app on two loaded cores).
                            Some(other) if !r.dead.contains(&other) => r.overlaps.push((body.clone(), other, host.clone())),
                            _ => {
                                r.in_flight.insert(body.clone(), host.clone());
                            }
                        }
                        InFlight { record: record.clone(), body: body.clone() }
                    };
                    let delay = record.lock().unwrap().delay;
                    tokio::time::sleep(delay).await;
                    let mut r = record.lock().unwrap();
                    if r.dead.contains(&host) {
                        return StatusCode::SERVICE_UNAVAILABLE;
                    }
                    r.ended.push((body.clone(), Instant::now()));
                    r.handled.push((id, body, host));
                    drop(r);
                    drop(guard);
                    StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        (app, addr)
    }

    /// Successful handles per body.
    fn counts(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for (_, body, _) in &self.record.lock().unwrap().handled {
            *counts.entry(body.clone()).or_default() += 1;
        }
        counts
    }

    fn handled_by(&self, host: &str) -> usize {
        self.record.lock().unwrap().handled.iter().filter(|(_, _, h)| h == host).count()
    }

    fn overlaps(&self) -> Vec<(String, String, String)> {
        self.record.lock().unwrap().overlaps.clone()
    }

    /// The overlaps the storage does not account for: those of a message it handed to two
    /// receives at once (`handed_twice`: message ids) are its own doing, not a lease's.
    fn overlaps_besides(&self, handed_twice: &BTreeSet<String>) -> Vec<(String, String, String)> {
        let r = self.record.lock().unwrap();
        let ids_of = |body: &str| r.handled.iter().filter(|(_, b, _)| b == body).map(|(id, _, _)| id.clone()).collect::<BTreeSet<_>>();
        r.overlaps.iter().filter(|(body, _, _)| !ids_of(body).iter().any(|id| handed_twice.contains(id))).cloned().collect()
    }
}

/// One host: its own directory (config, rules, data) and API port; the shared queue.
pub(crate) struct Host {
    dir: tempfile::TempDir,
    api: SocketAddr,
    env: Vec<(&'static str, String)>,
}

/// A test that fails leaves no host running: a leftover host works on its queue and, once
/// its moto's and app's ports are reused by a later run, handles that run's messages as "a"
/// or "b" (seen as overlaps with no lease warning). Killed by its config's path, so a reused
/// pid is never hit.
impl Drop for Host {
    fn drop(&mut self) {
        let config = self.config();
        let _ = Command::new("pkill").arg("-KILL").arg("-f").arg(format!("run --config {}", config.display())).status();
    }
}

/// Where the hosts' queue is: its `backend` and the table that reaches it.
pub(crate) struct Storage {
    /// The queue's `backend` key.
    pub backend: &'static str,
    /// The table reaching it (`[azure]`, `[aws]`), in TOML.
    pub table: String,
    /// Environment variables each host gets (the keys a table names).
    pub env: Vec<(&'static str, String)>,
}

impl Host {
    fn new(name: &str, app: SocketAddr, connection_string: &str, lease: &str) -> Host {
        let table = format!("[azure]\nconnection_string = \"{connection_string}\"\n");
        Host::on(name, app, &Storage { backend: "azure", table, env: Vec::new() }, lease)
    }

    /// Host `name` on queue [`QUEUE`] of `storage`, forwarding to `app`.
    pub(crate) fn on(name: &str, app: SocketAddr, storage: &Storage, lease: &str) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let api: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        std::fs::create_dir_all(dir.path().join("rules")).unwrap();
        std::fs::copy(guests::PAPER_DEFAULT, dir.path().join("rules/orders.wasm")).unwrap();
        let config = format!(
            "drain_timeout = \"10s\"\n[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n\n\
             [queues.{QUEUE}]\nbackend = \"{}\"\nrule = \"orders.wasm\"\nlease_duration = \"{lease}\"\n\
             max_tasks = 8\nbatch_size = 8\nmax_polling_interval = \"1s\"\nhandler = {{ url = \"http://{app}/work/{name}\" }}\n\n{}",
            storage.backend, storage.table
        );
        std::fs::write(dir.path().join("ebb.toml"), config).unwrap();
        Host { dir, api, env: storage.env.clone() }
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("ebb.toml")
    }

    async fn start(&self) -> Child {
        let log = std::fs::File::create(self.dir.path().join("host.log")).unwrap();
        let child = Command::new(EBB)
            .arg("run")
            .arg("--config")
            .arg(self.config())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let url = format!("http://{}/healthz", self.api);
        wait_until("a host's API", Duration::from_secs(60), || async { reqwest::get(&url).await.is_ok_and(|r| r.status().is_success()) }).await;
        child
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("host.log")).unwrap_or_default()
    }
}

async fn wait_until<F: Future<Output = bool>>(what: &str, limit: Duration, mut condition: impl FnMut() -> F) {
    let deadline = Instant::now() + limit;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn terminate(mut host: Child) {
    assert!(Command::new("kill").args(["-TERM", &host.id().to_string()]).status().unwrap().success());
    let exit = tokio::task::spawn_blocking(move || host.wait().unwrap()).await.unwrap();
    assert!(exit.success(), "graceful shutdown exits 0: {exit:?}");
}

/// Successful deletes per message id, and the number of deletes the service refused (a
/// stale pop receipt: the lease had run out and another get had taken the message).
fn deletes(proxy: &FaultProxy) -> (BTreeMap<String, usize>, usize) {
    let (mut deleted, mut refused) = (BTreeMap::new(), 0);
    for (method, path, status) in proxy.answered() {
        if method == "DELETE" && path.contains("/messages/") {
            if status == 204 {
                *deleted.entry(path).or_default() += 1;
            } else {
                refused += 1;
            }
        }
    }
    (deleted, refused)
}

/// The hosts' log lines about leases (lost, lapsed, renewal failures), for an overlap's cause.
fn lease_warnings(hosts: &[&Host]) -> String {
    hosts.iter().flat_map(|host| host.log().lines().filter(|line| line.contains("lease")).map(String::from).collect::<Vec<_>>()).collect::<Vec<_>>().join("\n")
}

/// Puts `bodies` on the queue directly (not through a host), 50 at a time.
async fn put_all(queue: &Arc<dyn QueueClient>, bodies: &[String]) {
    for chunk in bodies.chunks(50) {
        let puts = chunk.iter().map(|body| {
            let queue = queue.clone();
            let body = body.clone();
            async move { queue.put(body.as_bytes(), Duration::ZERO).await.unwrap() }
        });
        futures::future::join_all(puts).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hosts_on_one_azure_queue_share_it_without_overlap_and_a_killed_host_loses_nothing() {
    let azurite = Azurite::start();
    let queue: Arc<dyn QueueClient> = Arc::new(AzureQueue::new(&azurite.account(), QUEUE, AzureOptions::default()).unwrap());
    queue.create_if_missing().await.unwrap();
    // The hosts reach Azurite through the proxy (with no faults), which logs every answer:
    // how many deletes of each message succeeded.
    let proxy = FaultProxy::start(azurite.port(), 0.0, 1).await;
    let storage = Storage { backend: "azure", table: format!("[azure]\nconnection_string = \"{}\"\n", proxy.connection_string()), env: Vec::new() };
    // Azurite never hands a message to two gets within its lease.
    two_hosts_share_a_queue_and_a_killed_one_loses_nothing(queue, &storage, Some(&proxy), Duration::from_secs(5), &BTreeSet::new).await;
}

/// Two hosts on queue [`QUEUE`] of `storage` (`queue` reaches it directly) under load, then
/// kill -9 of one mid-load: every message handled, never by two handlers at once, what the
/// killed host held handled by the other after its lease. With `proxy` (the hosts' way to
/// the storage), each message deleted once. `lease` is the hosts' lease: "never by two at once"
/// holds while storage answers within half of it.
pub(crate) async fn two_hosts_share_a_queue_and_a_killed_one_loses_nothing(
    queue: Arc<dyn QueueClient>,
    storage: &Storage,
    proxy: Option<&FaultProxy>,
    lease: Duration,
    handed_twice: &(dyn Fn() -> BTreeSet<String> + Sync),
) {
    let (app, app_addr) = App::start(Duration::from_millis(20)).await;
    let lease_setting = format!("{}s", lease.as_secs());
    let a = Host::on("a", app_addr, storage, &lease_setting);
    let b = Host::on("b", app_addr, storage, &lease_setting);
    let host_a = a.start().await;
    let host_b = b.start().await;

    // Both hosts under load: each body handled, never by two at a time, deleted once.
    let first: Vec<String> = (0..600).map(|i| format!("first-{i}")).collect();
    put_all(&queue, &first).await;
    wait_until("600 messages handled", Duration::from_secs(120), || async { app.counts().len() == first.len() }).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // any late duplicate shows up
    let counts = app.counts();
    assert_eq!(counts.keys().cloned().collect::<BTreeSet<_>>(), first.iter().cloned().collect(), "every message handled");
    let twice = handed_twice();
    assert_eq!(app.overlaps_besides(&twice), vec![], "a message held by two handlers at once; what the hosts said of leases:\n{}", lease_warnings(&[&a, &b]));
    let (by_a, by_b) = (app.handled_by("a"), app.handled_by("b"));
    assert!(by_a > 0 && by_b > 0, "both hosts took a share: a {by_a}, b {by_b}\nA:\n{}\nB:\n{}", a.log(), b.log());
    wait_until("every message deleted", Duration::from_secs(30), || async { queue.approximate_count().await.unwrap() == 0 }).await;
    let extra: usize = counts.values().map(|n| n - 1).sum();
    if let Some(proxy) = proxy {
        let (deleted, refused) = deletes(proxy);
        assert_eq!(deleted.len(), first.len(), "each message deleted: {} distinct deletes", deleted.len());
        assert!(deleted.values().all(|n| *n == 1), "a message deleted twice: {deleted:?}");
        // A second handle happens only when a lease ran out before its host's delete (Azurite
        // slow under load): that delete is refused, so there is one refused delete per extra handle.
        assert!(refused >= extra, "{extra} extra handles but only {refused} refused deletes");
    }
    eprintln!(
        "two hosts, 600 messages: {extra} handled twice (lease ran out first, or handed out twice: {} overlaps of {} messages the storage gave two receives at once), every message deleted",
        app.overlaps().len(),
        twice.len()
    );

    // kill -9 of host a mid-load: what it held comes back after its lease and b handles it.
    let second: Vec<String> = (0..600).map(|i| format!("second-{i}")).collect();
    let handled_before = app.record.lock().unwrap().handled.len();
    let by_a_before = app.handled_by("a");
    app.record.lock().unwrap().delay = Duration::from_millis(500); // slower, so the kill lands mid-load
    put_all(&queue, &second).await;
    wait_until("host a handling the second batch", Duration::from_secs(60), || async { app.handled_by("a") >= by_a_before + 10 }).await;
    let mut host_a = host_a;
    let held_by_a: Vec<String> = {
        let mut r = app.record.lock().unwrap();
        r.dead.insert("a".into());
        r.in_flight.iter().filter(|(_, h)| *h == "a").map(|(b, _)| b.clone()).collect()
    };
    host_a.kill().unwrap(); // SIGKILL
    host_a.wait().unwrap();
    let killed_at = Instant::now();
    let handled_at_kill = app.record.lock().unwrap().handled.len() - handled_before;
    assert!(handled_at_kill < second.len(), "killed mid-load ({handled_at_kill} of the second batch handled)");
    wait_until("every message of the second batch handled", Duration::from_secs(120), || async {
        let counts = app.counts();
        second.iter().all(|body| counts.contains_key(body))
    })
    .await;
    let recovered_after = killed_at.elapsed();
    let twice = handed_twice();
    assert_eq!(app.overlaps_besides(&twice), vec![], "a message held by two handlers at once; what the hosts said of leases:\n{}", lease_warnings(&[&a, &b]));
    wait_until("the queue empty", Duration::from_secs(30), || async { queue.approximate_count().await.unwrap() == 0 }).await;
    // What a held at the kill came back only after its lease, and b handled it. The lease is
    // renewed half way, so the last renewal may be up to half a lease before the kill: it runs
    // out at least half a lease after it (a bound of 4 s of 5 failed when a renewal came just
    // before the kill).
    for body in &held_by_a {
        let r = app.record.lock().unwrap();
        let ended = r.ended.iter().filter(|(b, _)| b == body).map(|(_, at)| *at).min().unwrap();
        assert!(ended >= killed_at + lease / 2, "{body}, held by the killed host, handled before its lease ran out");
    }
    let came_back = app.record.lock().unwrap().ended.iter().filter(|(b, at)| b.starts_with("second-") && *at >= killed_at + lease / 2).count();
    let counts = app.counts();
    let duplicates = second.iter().filter(|body| counts[*body] > 1).count();
    // A message whose handler returned just before the kill, but which the killed host had
    // not deleted yet, is handled again by b (at least once): the only duplicates allowed.
    {
        let r = app.record.lock().unwrap();
        for body in second.iter().filter(|body| counts[*body] > 1) {
            let first = r.handled.iter().find(|(_, b, _)| b == body).unwrap();
            assert_eq!(first.2, "a", "{body} handled twice, first by the host that was not killed");
        }
    }
    // The queue reads empty as soon as Azurite has done the last delete; the proxy notes
    // its answer a moment later (seen once in CI as 1199 of 1200): wait for it, bounded.
    let expected = first.len() + second.len();
    if let Some(proxy) = proxy {
        let proxy_saw_all = tokio::time::timeout(Duration::from_secs(10), async {
            while deletes(proxy).0.len() < expected {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        let (deleted, _) = deletes(proxy);
        assert!(proxy_saw_all.is_ok(), "{} of {expected} messages deleted", deleted.len());
        assert_eq!(deleted.len(), expected, "each message deleted");
        assert!(deleted.values().all(|n| *n == 1), "a message deleted twice: {deleted:?}");
    }
    eprintln!(
        "kill -9 mid-load: {handled_at_kill} handled before the kill, {} held by the killed host, all 600 handled {recovered_after:?} after the kill ({came_back} after the lease ran out), {duplicates} handled twice",
        held_by_a.len()
    );
    terminate(host_b).await;
}

/// Issue 40 (item 6's leftover): a credential without create permission could not start a host
/// even on queues that exist (`ebb run` asked to create each at start, and exited on the 403).
/// With an account SAS of `sp=raup` on `orders` and `orders-poison` made beforehand, the host
/// starts, is ready, handles a message, and says it was refused the create of each queue and
/// that each exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_sas_may_not_create_runs_on_queues_that_exist() {
    let azurite = Azurite::start();
    let keyed = |name: &str| Arc::new(AzureQueue::new(&azurite.account(), name, AzureOptions::default()).unwrap());
    let queue = keyed(QUEUE);
    queue.create_if_missing().await.unwrap();
    keyed(&format!("{QUEUE}-poison")).create_if_missing().await.unwrap();
    let sas = azurite.account().account_sas("raup", std::time::SystemTime::now() + Duration::from_secs(3600)).unwrap();
    let connection = format!("SharedAccessSignature={sas};QueueEndpoint={}", azurite.endpoint());
    let (app, app_addr) = App::start(Duration::ZERO).await;
    let host = Host::new("limited", app_addr, &connection, "5s");
    let log = std::fs::File::create(host.dir.path().join("host.log")).unwrap();
    let mut child = Command::new(EBB).arg("run").arg("--config").arg(host.config()).stdout(Stdio::null()).stderr(log).spawn().unwrap();
    let readyz = format!("http://{}/readyz", host.api);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !reqwest::get(&readyz).await.is_ok_and(|r| r.status().is_success()) {
        assert!(child.try_wait().unwrap().is_none(), "the host exited: {}", host.log());
        assert!(Instant::now() < deadline, "not ready: {}", host.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    queue.put(b"through a sas without c", Duration::ZERO).await.unwrap();
    wait_until("the message handled", Duration::from_secs(30), || async { app.handled_by("limited") == 1 }).await;
    let log = host.log();
    for name in [QUEUE.to_string(), format!("{QUEUE}-poison")] {
        assert!(log.contains(&format!("queue {name} exists; the credential may not create it")), "{log}");
    }
    terminate(child).await;
}
