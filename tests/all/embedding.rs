//! Issue 18: the public API a Rust program embeds ebb with: a host whose queues have Rust
//! handlers, started from a configuration, sending through its queue handles.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ebb::handler::{Handler, IncomingMessage};
use ebb::{Config, Host};

/// Fails each message's first try, then succeeds; counts the tries.
struct FailsOnce(Arc<AtomicU32>);

#[async_trait::async_trait]
impl Handler for FailsOnce {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        self.0.fetch_add(1, Ordering::SeqCst);
        anyhow::ensure!(message.dequeue_count > 1, "first try of {}", message.id);
        Ok(())
    }
}

fn config(dir: &Path, queues: &str) -> Config {
    Config::parse(&format!("[api]\nlisten = \"127.0.0.1:0\"\n{queues}"), dir, None).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_handler_gets_the_messages_and_a_failure_retries_as_over_http() {
    let dir = tempfile::tempdir().unwrap();
    // One queue handled in Rust (no URL), one that keeps its URL.
    let config = config(dir.path(), "[queues.orders]\nmax_retry_delay = \"1s\"\n[queues.mail]\nhandler = { url = \"http://127.0.0.1:9/work\" }\n");
    let tries = Arc::new(AtomicU32::new(0));
    let host = Host::builder(&config).handler("orders", FailsOnce(tries.clone())).start().await.unwrap();
    let orders = host.queue("orders").unwrap();
    orders.send(b"one", Duration::ZERO, Duration::from_secs(5)).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while host.depth("orders").await.unwrap() > 0 || tries.load(Ordering::SeqCst) < 2 {
        assert!(std::time::Instant::now() < deadline, "not handled: {} tries", tries.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(tries.load(Ordering::SeqCst), 2, "failed once, retried, deleted");
    assert!(host.queue("nope").is_none());
    host.shutdown().await;
}

#[tokio::test]
async fn a_rust_handler_for_a_queue_the_configuration_lacks_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "[queues.orders]\n");
    let error = Host::builder(&config).handler("order", FailsOnce(Arc::default())).start().await.err().expect("must fail");
    assert!(format!("{error:#}").contains("queue order, which the configuration does not have"), "{error:#}");
    let error = Host::start(&config, ebb::Role::Worker).await.err().expect("must fail");
    assert!(format!("{error:#}").contains("queues.orders.handler: not set"), "{error:#}");
}

/// Takes every message.
struct Discard;

#[async_trait::async_trait]
impl Handler for Discard {
    async fn handle(&self, _message: &IncomingMessage) -> anyhow::Result<()> {
        Ok(())
    }
}

/// Issue 18 (stop everything): a host shut down while its rule still loads waits for the
/// load's thread, so no rule thread outlives the shutdown (it was left running, detached).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_shut_down_while_its_rule_loads_leaves_no_rule_thread_running() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("rules")).unwrap();
    std::fs::copy(ebb_tests::guests::SLOW_SETUP, dir.path().join("rules/slow.wasm")).unwrap();
    let config = config(dir.path(), "[queues.orders]\nrule = \"slow.wasm\"\nrule_params = { setup_ms = \"1500\" }\n");
    let host = Host::builder(&config).handler("orders", Discard).start().await.unwrap();
    let rules = host.rules();
    assert_eq!(rules.load_state("orders"), Some(ebb::rules::RuleLoad::Compiling));
    assert!(rules.running_threads() >= 2, "the load and the watcher run: {}", rules.running_threads());
    host.shutdown().await;
    assert_eq!(rules.running_threads(), 0, "a rule thread outlived the shutdown");
}

/// A TCP relay to Azurite that can be made to hang: from then on it forwards nothing more,
/// on open connections or new ones, and closes none (storage that stops answering).
struct HangableRelay {
    port: u16,
    hung: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl HangableRelay {
    async fn start(upstream: u16) -> anyhow::Result<HangableRelay> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let hung = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = hung.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let hung = flag.clone();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else { return };
                    let ((client_read, client_write), (server_read, server_write)) = (client.into_split(), server.into_split());
                    tokio::join!(relay(client_read, server_write, &hung), relay(server_read, client_write, &hung));
                });
            }
        });
        Ok(HangableRelay { port, hung, task })
    }

    /// From now on nothing is forwarded and nothing closed.
    fn hang(&self) {
        self.hung.store(true, Ordering::SeqCst);
    }
}

impl Drop for HangableRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to` until either closes; once `hung`, holds both forever.
async fn relay(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, hung: &std::sync::atomic::AtomicBool) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buffer = vec![0; 64 * 1024];
    while let Ok(read) = from.read(&mut buffer).await
        && read > 0
    {
        if hung.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
}

/// Takes a message and never returns; says when it has one.
struct NeverReturns(Arc<tokio::sync::Notify>);

#[async_trait::async_trait]
impl Handler for NeverReturns {
    async fn handle(&self, _message: &IncomingMessage) -> anyhow::Result<()> {
        self.0.notify_one();
        std::future::pending().await
    }
}

/// Issue 40 item 1, for embedders: `ebb run` exits at `drain_timeout` + 1 s whatever is left,
/// but `Host::shutdown` had no bound: with a handler that never returns on storage that then
/// stops answering, the release of its message waited out every try of the request timeout
/// (5 of 30 s). It returns within `drain_timeout` + 1 s, stopping what is left at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_within_drain_timeout_and_a_second_on_storage_that_stops_answering() -> anyhow::Result<()> {
    let relay = HangableRelay::start(ebb_tests::azurite::Azurite::shared().port()).await?;
    let queue = ebb_tests::azurite::unique_queue_name("hung");
    let dir = tempfile::tempdir()?;
    let drain = Duration::from_secs(1);
    let connection = ebb_tests::azurite::Azurite::connection_string_for(relay.port);
    let config = Config::parse(
        &format!(
            "drain_timeout = \"1s\"\n[api]\nlisten = \"127.0.0.1:0\"\n[azure]\nconnection_string = \"{connection}\"\n[queues.{queue}]\nbackend = \"azure\"\n"
        ),
        dir.path(),
        None,
    )?;
    let called = Arc::new(tokio::sync::Notify::new());
    let host = Host::builder(&config).handler(&queue, NeverReturns(called.clone())).start().await?;
    host.queue(&queue).expect("configured").send(b"stuck", Duration::ZERO, Duration::from_secs(5)).await?;
    tokio::time::timeout(Duration::from_secs(30), called.notified()).await.map_err(|_| anyhow::anyhow!("the handler was never called"))?;
    relay.hang();
    let asked = std::time::Instant::now();
    let stopped = tokio::time::timeout(Duration::from_secs(15), host.shutdown()).await;
    let took = asked.elapsed();
    anyhow::ensure!(stopped.is_ok(), "shutdown still running {took:?} after it was asked, drain_timeout {drain:?}");
    anyhow::ensure!(took < drain + Duration::from_millis(1500), "shutdown took {took:?}, drain_timeout {drain:?}");
    Ok(())
}
