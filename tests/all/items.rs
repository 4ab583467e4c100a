//! Issue 20: the listener delivers the items of an envelope one by one (or in batches),
//! fails them one by one, puts the failed ones back BEFORE it deletes the envelope, poisons
//! an item alone, poisons a broken envelope with its reason, and puts handlers' answers on
//! the reply queue. A memory queue behind hooks, under tokio's paused clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use ebb::handler::{Handler, IncomingMessage, ItemPosition};
use ebb::listener::{Listener, QueueSettings, Reply};
use ebb::payload::{Codec, Delivery, Item, Packer, PayloadSettings};
use ebb::queue::memory::MemoryQueue;
use ebb::queue::{MessageId, QueueClient, QueueError, TokioClock};
use tokio::time::sleep;

use crate::hooked_queue::{Hooked, Hooks};

const QUEUE: &str = "work";

/// Records puts and deletes in order; fails puts while `fail_puts` is set.
#[derive(Default)]
struct Storage {
    fail_puts: AtomicBool,
    events: Mutex<Vec<&'static str>>,
}

#[async_trait]
impl Hooks for Storage {
    async fn before_put(&self, _body: &[u8]) -> Result<(), QueueError> {
        if self.fail_puts.load(Ordering::SeqCst) {
            self.events.lock().unwrap().push("put refused");
            return Err(QueueError::Fatal(anyhow::anyhow!("storage refuses puts")));
        }
        self.events.lock().unwrap().push("put");
        Ok(())
    }
    async fn before_delete(&self, _id: &MessageId) {
        self.events.lock().unwrap().push("delete");
    }
}

/// One call the handler saw.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    body: String,
    item: Option<ItemPosition>,
    dequeue_count: u32,
}

/// Fails every item whose body starts with `fail`, and the first delivery of one starting
/// with `once`; answers `re:<body>`; records calls and the sizes of the batches it was given.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<Call>>,
    batches: Mutex<Vec<usize>>,
}

impl Recorder {
    fn take(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        let body = String::from_utf8_lossy(&message.body).into_owned();
        let mut calls = self.calls.lock().unwrap();
        let first = !calls.iter().any(|c| c.body == body);
        calls.push(Call { body: body.clone(), item: message.item, dequeue_count: message.dequeue_count });
        anyhow::ensure!(!body.starts_with("fail"), "{body} fails");
        anyhow::ensure!(!(first && body.starts_with("once")), "{body} fails the first time");
        Ok(())
    }

    fn bodies(&self, body: &str) -> Vec<Call> {
        self.calls.lock().unwrap().iter().filter(|c| c.body == body).cloned().collect()
    }
}

#[async_trait]
impl Handler for Recorder {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        self.take(message)
    }
    async fn handle_with_reply(&self, message: &IncomingMessage) -> anyhow::Result<Option<Bytes>> {
        self.take(message)?;
        Ok(Some(Bytes::from(format!("re:{}", String::from_utf8_lossy(&message.body)))))
    }
    async fn handle_batch(&self, items: &[IncomingMessage]) -> Vec<anyhow::Result<()>> {
        self.batches.lock().unwrap().push(items.len());
        items.iter().map(|item| self.take(item)).collect()
    }
}

struct Fixture {
    queue: Arc<Hooked<Storage>>,
    poison: Arc<MemoryQueue>,
    reply: Arc<MemoryQueue>,
    handler: Arc<Recorder>,
    listener: Listener,
}

fn fixture(delivery: Delivery, with_reply: bool) -> Fixture {
    let clock = Arc::new(TokioClock::new());
    let queue = Hooked::new(MemoryQueue::new(QUEUE, clock.clone(), 65536), Storage::default());
    let poison = Arc::new(MemoryQueue::new("work-poison", clock.clone(), 65536));
    let reply = Arc::new(MemoryQueue::new("work-replies", clock, 65536));
    let handler = Arc::new(Recorder::default());
    let settings = QueueSettings {
        max_dequeue_count: 3,
        visibility_timeout: Duration::from_secs(1),
        min_polling_interval: Duration::from_millis(100),
        max_polling_interval: Duration::from_millis(500),
        random_seed: Some(7),
        ..QueueSettings::default()
    };
    let payload = PayloadSettings { delivery, max_batch_items: 32, max_envelope_bytes: 65536, ..PayloadSettings::default() };
    let mut builder = Listener::builder(queue.clone(), poison.clone(), handler.clone()).settings(settings).payload(payload, false);
    if with_reply {
        builder = builder.reply_queue(reply.clone());
    }
    let listener = builder.build();
    Fixture { queue, poison, reply, handler, listener }
}

/// One envelope of `bodies`.
fn envelope(bodies: &[&str]) -> Vec<u8> {
    let items: Vec<Item> = bodies.iter().map(|b| Item::inline(b.to_string())).collect();
    let packed = Packer::new(Codec::Zstd, 65536).unwrap().pack(&items).unwrap();
    assert_eq!(packed.envelopes.len(), 1);
    packed.envelopes.into_iter().next().unwrap().bytes
}

/// Every message of `queue` now (leased for a minute, so each is read once).
async fn drain(queue: &dyn QueueClient) -> Vec<Bytes> {
    let mut all = Vec::new();
    loop {
        let got = queue.get(32, Duration::from_secs(60)).await.unwrap();
        if got.is_empty() {
            return all;
        }
        all.extend(got.into_iter().map(|m| m.body));
    }
}

#[tokio::test(start_paused = true)]
async fn each_item_of_an_envelope_reaches_the_handler_on_its_own_and_the_envelope_is_deleted() {
    let f = fixture(Delivery::Item, false);
    let bodies: Vec<String> = (0..50).map(|i| format!("{{\"order\":{i}}}")).collect();
    let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
    f.queue.put(&envelope(&refs), Duration::ZERO).await.unwrap();
    f.listener.start();
    sleep(Duration::from_secs(5)).await;
    let calls = f.handler.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 50);
    for (i, body) in bodies.iter().enumerate() {
        let call = calls.iter().find(|c| &c.body == body).unwrap_or_else(|| panic!("{body} not delivered"));
        assert_eq!(call.item, Some(ItemPosition { index: i as u32, count: 50, attempts: 0 }));
        assert_eq!(call.dequeue_count, 1);
    }
    assert_eq!(f.queue.inner.approximate_count().await.unwrap(), 0, "the envelope was deleted");
    let status = f.listener.status();
    assert_eq!((status.envelopes, status.items_delivered, status.items_failed, status.processed), (1, 50, 0, 1));
    f.listener.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_item_is_retried_alone_with_its_attempt_count_and_poisoned_alone() {
    let f = fixture(Delivery::Item, false);
    let sent = f.queue.put(&envelope(&["a", "fail-x", "b"]), Duration::ZERO).await.unwrap();
    f.listener.start();
    sleep(Duration::from_secs(30)).await;
    assert_eq!(f.handler.bodies("a").len(), 1, "a handled once");
    assert_eq!(f.handler.bodies("b").len(), 1, "b handled once");
    let tries = f.handler.bodies("fail-x");
    let seen: Vec<(Option<u32>, u32, u32)> = tries.iter().map(|c| (c.item.map(|i| i.attempts), c.item.map_or(0, |i| i.count), c.dequeue_count)).collect();
    // First in the envelope of 3; then alone in envelopes of 1, one more attempt each time.
    assert_eq!(seen, [(Some(0), 3, 1), (Some(1), 1, 2), (Some(2), 1, 3)]);
    let poisoned = drain(&*f.poison).await;
    assert_eq!(poisoned.len(), 1, "only the failing item is poisoned");
    let poisoned: serde_json::Value = serde_json::from_slice(&poisoned[0]).unwrap();
    assert_eq!(poisoned["body"], "fail-x");
    // Issue 35, item 2: what its producer got, not the envelope it was put back in (`3#0`).
    assert_eq!((poisoned["original_id"].as_str(), &poisoned["item"]), (Some(sent.as_str()), &serde_json::json!(1)), "{poisoned}");
    assert!(poisoned["error"].as_str().unwrap().contains("fail-x fails"), "{poisoned}");
    assert_eq!(f.queue.inner.approximate_count().await.unwrap(), 0);
    let status = f.listener.status();
    assert_eq!((status.items_delivered, status.items_failed, status.items_poisoned), (2, 3, 1));
    f.listener.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn the_envelope_is_not_deleted_before_its_failed_items_were_put_back() {
    let f = fixture(Delivery::Item, false);
    f.queue.put(&envelope(&["a", "fail-x"]), Duration::ZERO).await.unwrap();
    f.queue.fail_puts.store(true, Ordering::SeqCst);
    f.listener.start();
    sleep(Duration::from_millis(500)).await;
    // The put back was refused: the envelope stays, nothing was deleted.
    assert_eq!(f.queue.events.lock().unwrap().clone(), ["put", "put refused"]);
    assert_eq!(f.queue.inner.approximate_count().await.unwrap(), 1, "the envelope is still there");
    f.queue.fail_puts.store(false, Ordering::SeqCst);
    sleep(Duration::from_secs(30)).await;
    let events = f.queue.events.lock().unwrap().clone();
    let first_delete = events.iter().position(|e| *e == "delete").expect("deleted once the put back worked");
    assert_eq!(events[first_delete - 1], "put", "the failed item was put back just before: {events:?}");
    // Nothing lost: a delivered again (at least once), fail-x tried until poisoned.
    assert!(f.handler.bodies("a").len() >= 2);
    assert_eq!(f.handler.bodies("fail-x").last().unwrap().dequeue_count, 3);
    assert_eq!(drain(&*f.poison).await.len(), 1);
    f.listener.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn a_corrupt_envelope_goes_to_poison_with_the_reason_and_a_plain_message_is_delivered_as_it_is() {
    let f = fixture(Delivery::Item, false);
    let mut corrupt = envelope(&["a", "b"]);
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 0x40;
    f.queue.put(&corrupt, Duration::ZERO).await.unwrap();
    f.queue.put(b"plain old message", Duration::ZERO).await.unwrap();
    f.listener.start();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(f.handler.calls.lock().unwrap().clone(), [Call { body: "plain old message".into(), item: None, dequeue_count: 1 }]);
    let poisoned = drain(&*f.poison).await;
    assert_eq!(poisoned.len(), 1);
    let poisoned: serde_json::Value = serde_json::from_slice(&poisoned[0]).unwrap();
    assert!(poisoned["error"].as_str().unwrap().starts_with("broken envelope: corrupted envelope: its CRC32 is"), "{poisoned}");
    assert_eq!(poisoned["body_hex"], hex::encode(&corrupt), "the envelope is kept whole");
    f.listener.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn batch_delivery_gives_up_to_max_batch_items_per_call_and_retries_the_failed_alone() {
    let f = fixture(Delivery::Batch, false);
    let bodies: Vec<String> = (0..70).map(|i| if i == 40 { "fail-40".to_string() } else { format!("item-{i}") }).collect();
    let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
    f.queue.put(&envelope(&refs), Duration::ZERO).await.unwrap();
    f.listener.start();
    sleep(Duration::from_secs(30)).await;
    let mut batches = f.handler.batches.lock().unwrap().clone();
    batches.sort_unstable();
    // 70 items in batches of at most 32; then the failed item alone, twice more.
    assert_eq!(batches, [1, 1, 6, 32, 32]);
    assert_eq!(f.handler.bodies("item-39").len(), 1);
    assert_eq!(f.handler.bodies("fail-40").len(), 3);
    assert_eq!(drain(&*f.poison).await.len(), 1);
    f.listener.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn answers_reach_the_reply_queue_with_the_request_id_as_correlation_id_before_the_delete() {
    let f = fixture(Delivery::Item, true);
    let plain = f.queue.put(b"question", Duration::ZERO).await.unwrap();
    let packed = f.queue.put(&envelope(&["q0", "q1"]), Duration::ZERO).await.unwrap();
    f.listener.start();
    sleep(Duration::from_secs(5)).await;
    let mut replies: Vec<Reply> = drain(&*f.reply).await.iter().map(|b| serde_json::from_slice(b).unwrap()).collect();
    replies.sort_by_key(|r| (r.correlation_id.clone(), r.item));
    let mut expected = vec![(plain.to_string(), None, "re:question"), (packed.to_string(), Some(0), "re:q0"), (packed.to_string(), Some(1), "re:q1")];
    expected.sort();
    let got: Vec<(String, Option<u32>, String)> = replies.iter().map(|r| (r.correlation_id.clone(), r.item, String::from_utf8(r.bytes()).unwrap())).collect();
    assert_eq!(got, expected.into_iter().map(|(a, b, c)| (a, b, c.to_string())).collect::<Vec<_>>());
    assert!(replies.iter().all(|r| r.queue == QUEUE));
    assert_eq!(f.queue.inner.approximate_count().await.unwrap(), 0);
    assert_eq!(f.listener.status().replies, 3);
    f.listener.shutdown(Duration::from_secs(1)).await;
}

/// Refuses the puts of bodies holding `refuse`, as a reply queue that is gone would.
#[derive(Default)]
struct Picky;

#[async_trait]
impl Hooks for Picky {
    async fn before_put(&self, body: &[u8]) -> Result<(), QueueError> {
        if body.windows(6).any(|w| w == b"refuse") {
            return Err(QueueError::Fatal(anyhow::anyhow!("the reply queue is gone")));
        }
        Ok(())
    }
}

/// A listener on `queue` whose answers go to `reply`, with the fixture's settings.
fn replying(queue: Arc<Hooked<Storage>>, poison: Arc<MemoryQueue>, reply: Arc<dyn QueueClient>, handler: Arc<Recorder>) -> Listener {
    let settings = QueueSettings {
        max_dequeue_count: 3,
        visibility_timeout: Duration::from_secs(1),
        min_polling_interval: Duration::from_millis(100),
        max_polling_interval: Duration::from_millis(500),
        random_seed: Some(7),
        ..QueueSettings::default()
    };
    let payload = PayloadSettings { max_envelope_bytes: 65536, ..PayloadSettings::default() };
    Listener::builder(queue, poison, handler).settings(settings).payload(payload, false).reply_queue(reply).build()
}

/// Attack pass defect 1: an item whose answer the reply queue refused made the whole
/// envelope come back forever (never poisoned, every item handled again each time). The
/// item is now a failed delivery of its own: retried alone, poisoned alone with the reason
/// after `max_dequeue_count`; the other items settle at once.
#[tokio::test(start_paused = true)]
async fn an_item_whose_reply_cannot_be_put_is_poisoned_alone_and_the_others_settle() {
    let clock = Arc::new(TokioClock::new());
    let queue = Hooked::new(MemoryQueue::new(QUEUE, clock.clone(), 65536), Storage::default());
    let poison = Arc::new(MemoryQueue::new("work-poison", clock.clone(), 65536));
    let reply = Hooked::new(MemoryQueue::new("work-replies", clock, 65536), Picky);
    let handler = Arc::new(Recorder::default());
    let listener = replying(queue.clone(), poison.clone(), reply.clone(), handler.clone());
    queue.put(&envelope(&["a", "refuse-me", "b"]), Duration::ZERO).await.unwrap();
    listener.start();
    sleep(Duration::from_secs(60)).await;
    assert_eq!((handler.bodies("a").len(), handler.bodies("b").len()), (1, 1), "the items whose answers were put are handled once");
    assert_eq!(handler.bodies("refuse-me").len(), 3, "tried max_dequeue_count times");
    let mut answers: Vec<String> =
        drain(&*reply.inner).await.iter().map(|b| String::from_utf8(serde_json::from_slice::<Reply>(b).unwrap().bytes()).unwrap()).collect();
    answers.sort();
    assert_eq!(answers, ["re:a", "re:b"]);
    let poisoned = drain(&*poison).await;
    assert_eq!(poisoned.len(), 1, "only the item whose answer was refused");
    let poisoned: serde_json::Value = serde_json::from_slice(&poisoned[0]).unwrap();
    assert_eq!(poisoned["body"], "refuse-me");
    let reason = poisoned["error"].as_str().unwrap();
    assert!(reason.contains("reply could not be put") && reason.contains("the reply queue is gone"), "{reason}");
    assert_eq!(queue.inner.approximate_count().await.unwrap(), 0, "nothing comes back");
    assert_eq!(listener.status().items_poisoned, 1);
    listener.shutdown(Duration::from_secs(1)).await;
}

/// Attack pass defect 1: an answer too large for a message of the reply queue can never be
/// put; the item (or plain message) goes to the poison queue at its first delivery, with a
/// reason naming the limit, rather than being handled again and again.
#[tokio::test(start_paused = true)]
async fn an_answer_too_large_for_the_reply_queue_poisons_its_request_at_once_naming_the_limit() {
    let clock = Arc::new(TokioClock::new());
    let queue = Hooked::new(MemoryQueue::new(QUEUE, clock.clone(), 65536), Storage::default());
    let poison = Arc::new(MemoryQueue::new("work-poison", clock.clone(), 65536));
    let reply = Arc::new(MemoryQueue::new("work-replies", clock, 300));
    let handler = Arc::new(Recorder::default());
    let listener = replying(queue.clone(), poison.clone(), reply.clone(), handler.clone());
    let big = "x".repeat(400);
    let bigger = "y".repeat(500);
    queue.put(&envelope(&["a", &big]), Duration::ZERO).await.unwrap();
    queue.put(bigger.as_bytes(), Duration::ZERO).await.unwrap();
    listener.start();
    sleep(Duration::from_secs(60)).await;
    assert_eq!((handler.bodies(&big).len(), handler.bodies(&bigger).len()), (1, 1), "handled once each, not again");
    assert_eq!(drain(&*reply).await.len(), 1, "the small answer was put");
    let poisoned: Vec<serde_json::Value> = drain(&*poison).await.iter().map(|b| serde_json::from_slice(b).unwrap()).collect();
    assert_eq!(poisoned.len(), 2);
    for entry in &poisoned {
        let reason = entry["error"].as_str().unwrap();
        assert!(reason.contains("too large for the reply queue work-replies") && reason.contains("300 bytes"), "{reason}");
    }
    assert_eq!(queue.inner.approximate_count().await.unwrap(), 0);
    listener.shutdown(Duration::from_secs(1)).await;
}

/// Attack (session 13): an HTTP handler's answer over 1 MiB (which no reply queue takes) was
/// an ordinary failure, so the handler ran again up to `max_dequeue_count` times (its side
/// effects with it); it is poisoned at its first delivery, as a plain message and as an item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_answer_over_a_mebibyte_poisons_its_request_at_the_first_delivery() {
    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = calls.clone();
    let router = axum::Router::new().route(
        "/work",
        axum::routing::post(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { vec![b'z'; ebb::handler::MAX_REPLY_BYTES + 1] }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let handler = Arc::new(ebb::handler::HttpHandler::new(format!("http://{addr}/work").parse().unwrap(), Duration::from_secs(30)).unwrap());
    let clock = Arc::new(TokioClock::new());
    let queue = Arc::new(MemoryQueue::new(QUEUE, clock.clone(), 65536));
    let poison = Arc::new(MemoryQueue::new("work-poison", clock.clone(), 65536));
    let reply = Arc::new(MemoryQueue::new("work-replies", clock, 65536));
    let settings = QueueSettings {
        max_dequeue_count: 3,
        visibility_timeout: Duration::from_secs(1),
        min_polling_interval: Duration::from_millis(50),
        max_polling_interval: Duration::from_millis(200),
        max_retry_delay: Duration::from_millis(100),
        ..QueueSettings::default()
    };
    let payload = PayloadSettings { max_envelope_bytes: 65536, ..PayloadSettings::default() };
    queue.put(b"plain", Duration::ZERO).await.unwrap();
    queue.put(&envelope(&["item"]), Duration::ZERO).await.unwrap();
    let listener = Listener::builder(queue.clone(), poison.clone(), handler).settings(settings).payload(payload, false).reply_queue(reply.clone()).build();
    listener.start();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while poison.approximate_count().await.unwrap() < 2 {
        assert!(std::time::Instant::now() < deadline, "not poisoned; handler called {} times", calls.load(Ordering::SeqCst));
        sleep(Duration::from_millis(50)).await;
    }
    // Time for a retry to happen, were there one.
    sleep(Duration::from_millis(1500)).await;
    listener.shutdown(Duration::from_secs(1)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 2, "each request handled once");
    for body in drain(&*poison).await {
        let entry: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let reason = entry["error"].as_str().unwrap();
        assert!(reason.contains("more than 1048576 bytes: too large for a reply"), "{reason}");
    }
    assert_eq!(reply.approximate_count().await.unwrap(), 0);
}

/// The poison entries of `queue` as JSON.
async fn poison_entries(queue: &dyn QueueClient) -> Vec<serde_json::Value> {
    drain(queue).await.iter().map(|b| serde_json::from_slice(b).unwrap_or_else(|e| panic!("not a poison envelope ({e}): {b:?}"))).collect()
}

/// The one item of a poison entry kept as a one-item envelope (its `body_hex`).
fn held_item(entry: &serde_json::Value) -> anyhow::Result<Item> {
    let bytes = hex::decode(entry["body_hex"].as_str().ok_or_else(|| anyhow::anyhow!("no body_hex in {entry}"))?)?;
    match ebb::payload::decode(&bytes, &ebb::payload::Limits::default())? {
        ebb::payload::Decoded::Envelope(envelope) if envelope.items.len() == 1 => Ok(envelope.items.into_iter().next().expect("one item")),
        other => anyhow::bail!("not a one-item envelope: {other:?}"),
    }
}

/// Issue 35, item 1: an item that fits an envelope only compressed (70,009 bytes, over the
/// poison queue's 65,536) could never be poisoned (its bytes, moved alone, are too large),
/// so its envelope came back past `max_dequeue_count` forever and its small neighbour was
/// poisoned again at every return. Each is poisoned once; the large one as a one-item
/// envelope, which a requeue delivers again.
#[tokio::test(start_paused = true)]
async fn an_item_too_large_for_a_poison_message_is_poisoned_once_as_an_envelope_and_its_neighbour_once() -> anyhow::Result<()> {
    let f = fixture(Delivery::Item, false);
    let big = format!("fail-BIG-{}", "b".repeat(70_000));
    f.queue.put(&envelope(&["fail-small", &big]), Duration::ZERO).await?;
    f.listener.start();
    sleep(Duration::from_secs(300)).await;
    assert_eq!(f.handler.bodies("fail-small").len(), 3, "tried max_dequeue_count times");
    assert_eq!(f.handler.bodies(&big).len(), 3, "tried max_dequeue_count times, not past it");
    let entries = poison_entries(&*f.poison).await;
    assert_eq!(entries.len(), 2, "one poison entry per item: {:?}", entries.iter().map(|e| &e["error"]).collect::<Vec<_>>());
    let small = entries.iter().find(|e| e["body"] == "fail-small").expect("the small item is poisoned with its bytes");
    assert!(small["error"].as_str().unwrap().contains("fail-small fails"), "{small}");
    let large = entries.iter().find(|e| e["body"].is_null()).expect("the large item is poisoned");
    // The handler's error quotes the whole item: the reason keeps its first 4 KiB.
    let reason = large["error"].as_str().unwrap();
    assert!(reason.starts_with("fail-BIG-bbb") && reason.ends_with("bytes in all)") && reason.len() < 4200, "{reason}");
    let held = held_item(large)?;
    assert_eq!(held.body, ebb::payload::Body::Inline(Bytes::from(big.clone())), "the item's bytes, whole");
    assert_eq!(held.attempts, 0, "a requeue starts its attempts again");
    assert_eq!(f.queue.inner.approximate_count().await?, 0, "nothing comes back");
    let status = f.listener.status();
    assert_eq!((status.items_poisoned, status.poison_failures), (2, 0));
    f.listener.shutdown(Duration::from_secs(1)).await;
    Ok(())
}

/// Refuses the poison puts of bodies holding `refuse`, as a poison queue that cannot take
/// one message would.
#[derive(Default)]
struct RefusesSome {
    refused: std::sync::atomic::AtomicU32,
}

#[async_trait]
impl Hooks for RefusesSome {
    async fn before_put(&self, body: &[u8]) -> Result<(), QueueError> {
        if body.windows(6).any(|w| w == b"refuse") {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(QueueError::Fatal(anyhow::anyhow!("the poison queue refuses this one")));
        }
        Ok(())
    }
}

/// Issue 35: an item the poison queue refuses made its whole envelope come back, and the
/// items of it that were poisoned were poisoned again at each return. They are poisoned
/// once; the refused item alone is put back, hidden for `max_retry_delay` (as a plain
/// message the poison queue refuses is left in place), and tried again then.
#[tokio::test(start_paused = true)]
async fn an_item_the_poison_queue_refuses_is_put_back_alone_and_its_neighbours_are_poisoned_once() -> anyhow::Result<()> {
    let clock = Arc::new(TokioClock::new());
    let queue = Hooked::new(MemoryQueue::new(QUEUE, clock.clone(), 65536), Storage::default());
    let poison = Hooked::new(MemoryQueue::new("work-poison", clock, 65536), RefusesSome::default());
    let handler = Arc::new(Recorder::default());
    let settings = QueueSettings {
        max_dequeue_count: 3,
        visibility_timeout: Duration::from_secs(1),
        min_polling_interval: Duration::from_millis(100),
        max_polling_interval: Duration::from_millis(500),
        max_retry_delay: Duration::from_secs(60),
        random_seed: Some(7),
        ..QueueSettings::default()
    };
    let payload = PayloadSettings { max_envelope_bytes: 65536, ..PayloadSettings::default() };
    let listener = Listener::builder(queue.clone(), poison.clone(), handler.clone()).settings(settings).payload(payload, false).build();
    queue.put(&envelope(&["fail-a", "fail-refuse", "fail-b"]), Duration::ZERO).await?;
    listener.start();
    // Three deliveries (retry delays well under a minute), then the refused one waits 60 s.
    sleep(Duration::from_secs(50)).await;
    let entries = poison_entries(&*poison.inner).await;
    let mut bodies: Vec<&str> = entries.iter().map(|e| e["body"].as_str().unwrap()).collect();
    bodies.sort_unstable();
    assert_eq!(bodies, ["fail-a", "fail-b"], "each poisoned once");
    assert_eq!(handler.bodies("fail-refuse").len(), 3);
    assert_eq!(poison.refused.load(Ordering::SeqCst), 1, "refused once, then not tried again before max_retry_delay");
    assert_eq!(queue.inner.approximate_count().await?, 1, "the refused item, put back alone");
    sleep(Duration::from_secs(60)).await;
    assert_eq!(handler.bodies("fail-refuse").len(), 4, "delivered again after max_retry_delay");
    assert_eq!(handler.bodies("fail-a").len() + handler.bodies("fail-b").len(), 6, "the poisoned items are not delivered again");
    assert_eq!(poison.inner.approximate_count().await?, 2, "nothing poisoned twice");
    let status = listener.status();
    assert_eq!((status.items_poisoned, status.poison_failures), (2, 2));
    listener.shutdown(Duration::from_secs(1)).await;
    Ok(())
}

/// Issue 35, item 2: an item put back after failing is answered under the id and index its
/// producer got (what `wait_item_reply` waits for), not the envelope that carried it at last.
#[tokio::test(start_paused = true)]
async fn an_item_answered_after_a_retry_is_correlated_with_the_id_and_index_its_producer_got() -> anyhow::Result<()> {
    let f = fixture(Delivery::Item, true);
    let sent = f.queue.put(&envelope(&["q0", "once-q1"]), Duration::ZERO).await?;
    f.listener.start();
    sleep(Duration::from_secs(10)).await;
    assert_eq!(f.handler.bodies("once-q1").len(), 2, "failed once, then handled from the envelope it was put back in");
    let mut got: Vec<(String, Option<u32>, String)> = drain(&*f.reply)
        .await
        .iter()
        .map(|b| serde_json::from_slice::<Reply>(b).map(|r| (r.correlation_id.clone(), r.item, String::from_utf8(r.bytes()).unwrap())))
        .collect::<Result<_, _>>()?;
    got.sort();
    assert_eq!(got, [(sent.to_string(), Some(0), "re:q0".to_string()), (sent.to_string(), Some(1), "re:once-q1".to_string())]);
    f.listener.shutdown(Duration::from_secs(1)).await;
    Ok(())
}
