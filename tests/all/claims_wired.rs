//! Issue 20, item 3 wired in: an item too large for any envelope is offloaded into the
//! queue's claim store before its envelope is put, the listener fetches it and hands it over
//! byte-identical, deletes its body once handled, keeps it while the item is retried, and
//! poisons an item whose body is missing with that reason. A host embedding ebb on the
//! embedded queue (its claim store is the same redb store), its producer the queue handle.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ebb::handler::{Handler, IncomingMessage};
use ebb::payload::claims::{ClaimStore, EmbeddedClaims, sha256};
use ebb::payload::{Codec, Item, Packer};
use ebb::queue::QueueClient;
use ebb::queue::embedded::{EmbeddedOptions, EmbeddedStore};
use ebb::{Config, Host};

const BIG: usize = 5 << 20;

/// Fails the first delivery of each item, records each call's body size and SHA-256.
#[derive(Default)]
struct FailsFirst {
    calls: Mutex<Vec<(usize, [u8; 32], u32)>>,
}

#[async_trait::async_trait]
impl Handler for FailsFirst {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        self.calls.lock().unwrap().push((message.body.len(), sha256(&message.body), message.dequeue_count));
        anyhow::ensure!(message.dequeue_count > 1, "first try");
        Ok(())
    }
}

fn config(dir: &Path) -> Config {
    config_with(dir, "max_retry_delay = \"1s\"\nvisibility_timeout = \"1s\"\nmin_polling_interval = \"100ms\"\n")
}

/// A host on `dir/data` whose queue `orders` has the keys `queue` (TOML lines).
fn config_with(dir: &Path, queue: &str) -> Config {
    let text = format!("data_dir = {:?}\n[api]\nlisten = \"127.0.0.1:0\"\n[queues.orders]\n{queue}", dir.join("data"));
    Config::parse(&text, dir, None).unwrap()
}

/// The host's store, once the host that owned it let go of it.
async fn open_store(dir: &Path) -> EmbeddedStore {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match EmbeddedStore::open(&dir.join("data"), EmbeddedOptions::default()) {
            Ok(store) => return store,
            Err(error) if std::time::Instant::now() < deadline && format!("{error:#}").contains("in use") => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(error) => panic!("{error:#}"),
        }
    }
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `BIG` incompressible bytes: no codec makes them fit a 64 KiB message.
fn noise(seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..BIG).map(|_| rng.u8(..)).collect()
}

/// Waits until the queue is empty (what was retried was deleted), lets the listener finish
/// the body's delete after the message's, and stops the host.
async fn settle_and_stop(host: Host) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while host.depth("orders").await.unwrap() > 0 {
        assert!(std::time::Instant::now() < deadline, "the retried message was not deleted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    host.shutdown().await;
}

/// Asserts the queue's claim store holds no body.
async fn no_claim_body_left(dir: &Path) {
    let store = open_store(dir).await;
    let claims = EmbeddedClaims::new(store.queue("orders"), ebb::payload::DEFAULT_MAX_CLAIM_CHECK_BYTES);
    assert_eq!(claims.sweep(Duration::ZERO).await.unwrap().removed, 0, "no claim body left behind after it was handled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5_mib_item_is_offloaded_retried_with_its_body_and_its_body_deleted_once_handled() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let handler = Arc::new(FailsFirst::default());
    struct Shared(Arc<FailsFirst>);
    #[async_trait::async_trait]
    impl Handler for Shared {
        async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
            self.0.handle(message).await
        }
    }
    let host = Host::builder(&config).handler("orders", Shared(handler.clone())).start().await.unwrap();
    let big = noise(20);
    let digest = sha256(&big);
    let sent = host.queue("orders").unwrap().send_items(vec![Bytes::from(big), Bytes::from_static(b"small")]).await.unwrap();
    assert_eq!(sent.items, 2);
    wait_until("the big item handled on its second try", || handler.calls.lock().unwrap().iter().filter(|c| c.0 == BIG && c.2 > 1).count() == 1).await;
    settle_and_stop(host).await;
    let calls = handler.calls.lock().unwrap().clone();
    let big_calls: Vec<_> = calls.iter().filter(|c| c.0 == BIG).collect();
    assert_eq!(big_calls.len(), 2, "failed once, retried once: {:?}", calls.iter().map(|c| (c.0, c.2)).collect::<Vec<_>>());
    assert!(big_calls.iter().all(|c| c.1 == digest), "the handler got the 5 MiB body byte-identical, on the retry too (its body was kept)");
    no_claim_body_left(dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_check_item_whose_body_is_missing_goes_to_poison_with_the_reason_missing() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    {
        // A producer that offloaded a body, whose body then went (swept, say).
        let store = open_store(dir.path()).await;
        let queue = store.queue("orders");
        queue.create_if_missing().await.unwrap();
        let claims = EmbeddedClaims::new(store.queue("orders"), ebb::payload::DEFAULT_MAX_CLAIM_CHECK_BYTES);
        let check = claims.put(Bytes::from(vec![7u8; 100_000])).await.unwrap();
        claims.delete(&check).await.unwrap();
        let packed = Packer::new(Codec::None, 65_536).unwrap().pack(&[Item::claim_check(check), Item::inline(Bytes::from_static(b"fine"))]).unwrap();
        queue.put(&packed.envelopes[0].bytes, Duration::ZERO).await.unwrap();
    }
    let handler = Arc::new(FailsFirst::default());
    struct Shared(Arc<FailsFirst>);
    #[async_trait::async_trait]
    impl Handler for Shared {
        async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
            self.0.handle(message).await
        }
    }
    let host = Host::builder(&config).handler("orders", Shared(handler.clone())).start().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while host.depth("orders").await.unwrap() > 0 || handler.calls.lock().unwrap().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "not settled: {:?}", handler.calls.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    host.shutdown().await;
    assert!(handler.calls.lock().unwrap().iter().all(|c| c.0 == 4), "only the inline item reached the handler");
    let store = open_store(dir.path()).await;
    let poison = store.queue("orders-poison");
    let poisoned = poison.get(32, Duration::from_secs(60)).await.unwrap();
    assert_eq!(poisoned.len(), 1, "the missing item alone went to poison");
    let text = String::from_utf8_lossy(&poisoned[0].body);
    assert!(text.contains("is missing"), "the reason names the missing body: {text}");
}

/// A call's body size, SHA-256, delivery count and whether it came as an item.
type PlainCall = (usize, [u8; 32], u32, bool);

/// Records each call.
#[derive(Default)]
struct PlainCalls {
    calls: Mutex<Vec<PlainCall>>,
}

#[async_trait::async_trait]
impl Handler for PlainCalls {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        self.calls.lock().unwrap().push((message.body.len(), sha256(&message.body), message.dequeue_count, message.item.is_some()));
        anyhow::ensure!(message.dequeue_count > 1, "first try");
        Ok(())
    }
}

struct SharedPlain(Arc<PlainCalls>);

#[async_trait::async_trait]
impl Handler for SharedPlain {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        self.0.handle(message).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5_mib_plain_send_is_offloaded_delivered_as_the_plain_message_retried_and_its_body_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let handler = Arc::new(PlainCalls::default());
    let host = Host::builder(&config).handler("orders", SharedPlain(handler.clone())).start().await.unwrap();
    let big = noise(21);
    let digest = sha256(&big);
    let id = host.queue("orders").unwrap().send(&big, Duration::ZERO, Duration::from_secs(20)).await.unwrap();
    wait_until("the big message handled on its second try", || handler.calls.lock().unwrap().iter().any(|c| c.2 > 1)).await;
    settle_and_stop(host).await;
    let calls = handler.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2, "failed once, retried once: {:?}", calls.iter().map(|c| (c.0, c.2, c.3)).collect::<Vec<_>>());
    assert!(calls.iter().all(|c| c.0 == BIG && c.1 == digest), "the handler got the 5 MiB body byte-identical, on the retry too");
    assert!(calls.iter().all(|c| !c.3), "delivered as the plain message it was sent as, not as an item");
    assert!(!id.as_str().is_empty());
    no_claim_body_left(dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offloaded_plain_message_whose_body_is_missing_goes_to_poison_with_the_reason_and_one_over_the_claim_limit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with(dir.path(), "max_claim_check_bytes = 1048576\nmax_retry_delay = \"1s\"\nmin_polling_interval = \"100ms\"\n");
    {
        let store = open_store(dir.path()).await;
        let queue = store.queue("orders");
        queue.create_if_missing().await.unwrap();
        let claims = EmbeddedClaims::new(store.queue("orders"), ebb::payload::DEFAULT_MAX_CLAIM_CHECK_BYTES);
        let check = claims.put(Bytes::from(vec![7u8; 100_000])).await.unwrap();
        claims.delete(&check).await.unwrap();
        queue.put(&ebb::payload::encode_message(check).unwrap(), Duration::ZERO).await.unwrap();
    }
    let handler = Arc::new(PlainCalls::default());
    let host = Host::builder(&config).handler("orders", SharedPlain(handler.clone())).start().await.unwrap();
    let refused = host.queue("orders").unwrap().send(&vec![1u8; (1 << 20) + 1], Duration::ZERO, Duration::from_secs(20)).await;
    match refused {
        Err(ebb::queue::QueueError::MessageTooLarge { size, limit }) => assert_eq!((size, limit), ((1 << 20) + 1, 1 << 20)),
        other => panic!("a body over max_claim_check_bytes must be refused as too large, got {other:?}"),
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while host.depth("orders").await.unwrap() > 0 {
        assert!(std::time::Instant::now() < deadline, "not settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    host.shutdown().await;
    assert!(handler.calls.lock().unwrap().is_empty(), "the handler never saw a message without its body");
    let store = open_store(dir.path()).await;
    let poisoned = store.queue("orders-poison").get(32, Duration::from_secs(60)).await.unwrap();
    assert_eq!(poisoned.len(), 1, "the message went to poison once");
    let text = String::from_utf8_lossy(&poisoned[0].body);
    assert!(text.contains("offloaded body") && text.contains("is missing"), "the reason names the missing body: {text}");
}

/// Attack pass: purging the poison queue left offloaded bodies in the claim store until
/// `claim_check_retention` (14 days by default), for every purged message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purging_poisoned_offloaded_messages_deletes_their_bodies() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with(dir.path(), "max_dequeue_count = 1\nmin_polling_interval = \"100ms\"\n");
    // Fails every first delivery: with max_dequeue_count = 1, each goes to poison.
    let handler = Arc::new(PlainCalls::default());
    let host = Host::builder(&config).handler("orders", SharedPlain(handler.clone())).start().await.unwrap();
    let queue = host.queue("orders").unwrap();
    for seed in 0..2 {
        queue.send(&noise(30 + seed), Duration::ZERO, Duration::from_secs(20)).await.unwrap();
    }
    let poison = queue.poison_queue().unwrap().clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while poison.approximate_count().await.unwrap() < 2 {
        assert!(std::time::Instant::now() < deadline, "not poisoned");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The listing says how large each offloaded body is (what it holds is the small envelope).
    let listed = reqwest::Client::new().get(format!("http://{}/queues/orders/poison", host.api_addr())).send().await.unwrap().bytes().await.unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&listed).unwrap();
    let mut sizes: Vec<u64> = listed["messages"].as_array().unwrap().iter().map(|m| m["offloaded_bytes"].as_u64().expect("offloaded_bytes")).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [noise(30).len() as u64, noise(31).len() as u64], "{listed}");
    let purged = reqwest::Client::new().post(format!("http://{}/queues/orders/poison/purge?confirm=orders", host.api_addr())).send().await.unwrap();
    assert_eq!(purged.status(), 200, "{:?}", purged.text().await);
    // The store is let go only once nothing holds its queues.
    drop((poison, queue));
    host.shutdown().await;
    no_claim_body_left(dir.path()).await;
}
