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
