//! The Amazon SQS backend against moto's server (started by the tests): the conformance
//! suite, where SQS differs by nature (10 per get, earlier receipt handles stay valid, a
//! visibility change keeps the receipt) said in the cases, and what only SQS has: the
//! queue's MaximumMessageSize, bodies SQS cannot carry as text, boto3 as the other party.
//!
//! The suite's `pass` sleeps for real (moto runs on the wall clock).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ebb::queue::sqs::{Encoding, SqsOptions, SqsQueue};

/// The message attribute ebb marks a base64 body with (docs/guides/sqs.md): a wire name other
/// SQS clients read, so spelt here as they would.
const ENCODING_ATTRIBUTE: &str = "ebb-encoding";
/// SQS's documented limits: 10 messages per receive, 1 MiB per message.
const MAX_GET: u32 = 10;
const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
use ebb::queue::{MessageId, PopReceipt, QueueClient, QueueError};
use ebb_tests::azurite::unique_queue_name;
use ebb_tests::conformance::Backend;
use ebb_tests::moto::Moto;

struct Sqs;

#[async_trait]
impl Backend for Sqs {
    async fn queue(&self, name: &str) -> Arc<dyn QueueClient> {
        Arc::new(created(name, SqsOptions::default()).await)
    }

    async fn pass(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }

    fn max_message_bytes(&self) -> usize {
        MAX_MESSAGE_BYTES
    }

    fn max_get(&self) -> u32 {
        MAX_GET
    }

    fn refuses_stale_receipts(&self) -> bool {
        false
    }

    fn update_issues_new_receipt(&self) -> bool {
        false
    }
}

async fn sqs() -> Sqs {
    Sqs
}

mod conformance {
    ebb_tests::queue_conformance!(#[tokio::test]; super::sqs);
}

/// A created queue of a unique name on the shared moto.
async fn created(stem: &str, options: SqsOptions) -> SqsQueue {
    let queue = SqsQueue::new(&Moto::shared().account(), &unique_queue_name(stem), options).unwrap();
    queue.create_if_missing().await.unwrap();
    queue
}

#[tokio::test]
async fn the_limit_is_the_queues_maximum_message_size_read_at_create() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let name = unique_queue_name("small");
    moto.boto3("sqs.create_queue(QueueName=sys.argv[1], Attributes={'MaximumMessageSize': '2048'})", &[&name]);
    let queue = SqsQueue::new(&moto.account(), &name, SqsOptions::default())?;
    queue.create_if_missing().await?;
    assert_eq!(queue.max_message_bytes(), 2048);
    queue.put(&[b'x'; 2048], Duration::ZERO).await?;
    let refused = queue.put(&[b'x'; 2049], Duration::ZERO).await.unwrap_err();
    assert!(matches!(refused, QueueError::MessageTooLarge { size: 2049, limit: 2048 }), "{refused}");
    // Binary bodies go as base64 with the attribute: less of them fits.
    let largest = queue.max_body_bytes();
    assert!(largest < 2048 * 3 / 4, "{largest}");
    queue.put(&vec![0u8; largest], Duration::ZERO).await?;
    let refused = queue.put(&vec![0u8; largest + 3], Duration::ZERO).await.unwrap_err();
    assert!(matches!(refused, QueueError::MessageTooLarge { limit, .. } if limit == largest), "{refused}");
    Ok(())
}

#[tokio::test]
async fn binary_bodies_go_as_marked_base64_and_text_as_it_is_for_other_sqs_clients() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let queue = created("bodies", SqsOptions::default()).await;
    let binary: Vec<u8> = (0..=255).collect();
    queue.put(b"{\"order\": 1}", Duration::ZERO).await?;
    queue.put(&binary, Duration::ZERO).await?;
    // boto3 sees the text as it is, and the binary body marked.
    let script = format!(
        "url = sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl']\n\
         got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=['All'], VisibilityTimeout=0)['Messages']\n\
         for m in sorted(got, key=lambda m: len(m['Body'])): print(m['Body'][:20], m.get('MessageAttributes', {{}}).get('{ENCODING_ATTRIBUTE}', {{}}).get('StringValue'))"
    );
    let seen = moto.boto3(&script, &[queue.name()]);
    assert_eq!(seen.lines().next(), Some("{\"order\": 1} None"), "{seen}");
    assert!(seen.lines().nth(1).is_some_and(|line| line.ends_with(" base64")), "{seen}");
    let mut bodies: Vec<Vec<u8>> = queue.get(10, Duration::from_secs(30)).await?.into_iter().map(|m| m.body.to_vec()).collect();
    bodies.sort_by_key(Vec::len);
    assert_eq!(bodies, [b"{\"order\": 1}".to_vec(), binary]);
    Ok(())
}

#[tokio::test]
async fn a_text_queue_refuses_a_body_sqs_cannot_carry_naming_the_character() -> anyhow::Result<()> {
    let queue = created("text", SqsOptions { encoding: Encoding::Text, ..SqsOptions::default() }).await;
    let refused = queue.put(b"a\x01b", Duration::ZERO).await.unwrap_err();
    assert!(matches!(&refused, QueueError::InvalidBody(reason) if reason.contains("U+0001")), "{refused}");
    assert_eq!(queue.approximate_count().await?, 0);
    Ok(())
}

#[tokio::test]
async fn messages_sent_by_boto3_are_received_with_their_receive_count_and_sent_time() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let queue = created("interop", SqsOptions::default()).await;
    let before = std::time::SystemTime::now() - Duration::from_secs(5);
    moto.boto3("url = sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl']\nsqs.send_message(QueueUrl=url, MessageBody='from boto3')", &[queue.name()]);
    let first = queue.get(10, Duration::from_secs(1)).await?.remove(0);
    assert_eq!((&first.body[..], first.dequeue_count, first.defect.as_deref()), (&b"from boto3"[..], 1, None));
    assert!(first.inserted_at > before && first.inserted_at < std::time::SystemTime::now() + Duration::from_secs(5), "{:?}", first.inserted_at);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = queue.get(10, Duration::from_secs(30)).await?.remove(0);
    assert_eq!((second.id.as_str(), second.dequeue_count), (first.id.as_str(), 2));
    queue.delete(&second.id, &second.pop_receipt).await?;
    assert_eq!(queue.approximate_count().await?, 0);
    Ok(())
}

#[tokio::test]
async fn a_receipt_handle_sqs_never_issued_is_a_stale_receipt() -> anyhow::Result<()> {
    let queue = created("never-issued", SqsOptions::default()).await;
    let id = queue.put(b"m", Duration::ZERO).await?;
    let forged = PopReceipt::from(format!("{id} AQEBnotahandle"));
    for error in [queue.delete(&id, &forged).await.unwrap_err(), queue.update_visibility(&id, &forged, Duration::ZERO).await.unwrap_err()] {
        assert!(matches!(&error, QueueError::StaleReceipt { id: stale } if *stale == id), "{error}");
    }
    let other = MessageId::from("not-this-one");
    assert!(matches!(queue.delete(&other, &forged).await, Err(QueueError::StaleReceipt { .. })));
    Ok(())
}

#[tokio::test]
async fn a_queue_that_does_not_exist_is_a_missing_queue_naming_it() -> anyhow::Result<()> {
    let name = unique_queue_name("absent");
    let queue = SqsQueue::new(&Moto::shared().account(), &name, SqsOptions::default())?;
    let error = queue.put(b"m", Duration::ZERO).await.unwrap_err();
    assert_eq!(error.failure_class(), Some(ebb::queue::FailureClass::Missing), "{error}");
    assert!(error.to_string().contains(&name), "{error}");
    Ok(())
}

#[tokio::test]
async fn a_queue_url_from_the_config_needs_no_create_or_look_up() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let name = unique_queue_name("by-url");
    let url = moto.boto3("print(sqs.create_queue(QueueName=sys.argv[1])['QueueUrl'])", &[&name]);
    // The ebb queue's own name differs from the SQS queue's: the URL decides.
    let queue = SqsQueue::new(&moto.account(), "another-name", SqsOptions { queue_url: Some(url.trim().to_string()), ..SqsOptions::default() })?;
    queue.create_if_missing().await?;
    queue.put(b"by url", Duration::ZERO).await?;
    let count = moto.boto3(
        "url = sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl']\nprint(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=['ApproximateNumberOfMessages'])['Attributes']['ApproximateNumberOfMessages'])",
        &[&name],
    );
    assert_eq!(count.trim(), "1");
    Ok(())
}

/// SQS bills a send per 64 KiB of its payload (the body as sent, and its attributes): the
/// meter counts what the bill will, so the cost figures and the simulator's floor hold.
#[tokio::test]
async fn a_send_is_metered_as_one_request_per_64_kib_as_sqs_bills_it() -> anyhow::Result<()> {
    let metered = ebb::queue::Metered::new(created("billed", SqsOptions::default()).await);
    let transactions = metered.transactions();
    metered.put(&[b'x'; 64 * 1024], Duration::ZERO).await?;
    assert_eq!(transactions.snapshot().puts, 1, "64 KiB is one request");
    metered.put(&[b'x'; 200 * 1024], Duration::ZERO).await?;
    assert_eq!(transactions.snapshot().puts, 1 + 4, "200 KiB is four");
    // A binary body is billed as sent: base64, a third larger, and its attribute.
    metered.put(&[0u8; 48 * 1024 + 1], Duration::ZERO).await?;
    assert_eq!(transactions.snapshot().puts, 5 + 2, "48 KiB of bytes is 64 KiB and more as base64");
    metered.get(10, Duration::from_secs(30)).await?;
    assert_eq!(transactions.snapshot().gets_with_messages, 1, "a receive is one request however many it returns");
    Ok(())
}

/// Long polling: a get that may wait answers as soon as a message arrives, and an empty one
/// after its wait, one billed request either way.
#[tokio::test]
async fn a_waiting_get_answers_when_a_message_arrives_and_an_empty_one_is_one_request() -> anyhow::Result<()> {
    let metered = Arc::new(ebb::queue::Metered::new(created("waiting", SqsOptions::default()).await));
    let transactions = metered.transactions();
    let sender = metered.clone();
    let sent = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        sender.put(b"during the wait", Duration::ZERO).await
    });
    let asked = std::time::Instant::now();
    let got = metered.get_waiting(10, Duration::from_secs(30), Duration::from_secs(10)).await?;
    let took = asked.elapsed();
    sent.await??;
    assert_eq!(got.iter().map(|m| &m.body[..]).collect::<Vec<_>>(), [&b"during the wait"[..]]);
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(2), "answered {took:?} after asking, the message came at 1 s");
    let asked = std::time::Instant::now();
    let got = metered.get_waiting(10, Duration::from_secs(30), Duration::from_secs(2)).await?;
    let took = asked.elapsed();
    assert!(got.is_empty() && took >= Duration::from_millis(1_900), "an empty queue waited {took:?} of 2 s");
    let counts = transactions.snapshot();
    assert_eq!((counts.gets_with_messages, counts.gets_empty), (1, 1), "one request per get, however long it waited");
    Ok(())
}

/// Counts the messages it handled and when it handled the first.
#[derive(Default)]
struct Handled {
    first_at: std::sync::Mutex<Option<std::time::Instant>>,
}

#[async_trait]
impl ebb::handler::Handler for Handled {
    async fn handle(&self, _message: &ebb::handler::IncomingMessage) -> anyhow::Result<()> {
        self.first_at.lock().unwrap().get_or_insert_with(std::time::Instant::now);
        Ok(())
    }
}

/// Issue 37 item 3: the rule's idle delay (10 s here) is spent in a long poll, so a message
/// sent 1 s into it is handled at once, and the idle queue costs one receive per delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_listener_on_sqs_handles_a_message_sent_during_its_long_poll_at_once() -> anyhow::Result<()> {
    let metered = Arc::new(ebb::queue::Metered::new(created("idle", SqsOptions::default()).await));
    let transactions = metered.transactions();
    let poison = Arc::new(created("idle-poison", SqsOptions::default()).await);
    let handler = Arc::new(Handled::default());
    let delay = Duration::from_secs(10);
    let settings = ebb::listener::QueueSettings { min_polling_interval: delay, max_polling_interval: delay, ..Default::default() };
    let listener = ebb::listener::Listener::builder(metered.clone(), poison, handler.clone()).settings(settings).build();
    listener.start();
    // The first get finds the queue empty; the next waits the whole 10 s in SQS.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sent_at = std::time::Instant::now();
    metered.put(b"picked up at once", Duration::ZERO).await?;
    let deadline = sent_at + Duration::from_secs(5);
    while handler.first_at.lock().unwrap().is_none() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let handled_at = handler.first_at.lock().unwrap().ok_or_else(|| anyhow::anyhow!("not handled within 5 s"))?;
    let pickup = handled_at - sent_at;
    assert!(pickup < Duration::from_secs(1), "handled {pickup:?} after it was sent, 1 s into a 10 s idle wait");
    let counts = transactions.snapshot();
    assert!(counts.gets_empty + counts.gets_with_messages <= 2, "receives in the first 2 s: the first, and the one waiting: {counts:?}");
    assert_eq!(listener.status().long_poll_secs, 20, "/status shows the wait");
    listener.shutdown(Duration::from_secs(5)).await;
    Ok(())
}

/// Puts 12 messages and leases them for `lease`: their (id, receipt) entries, with a receipt
/// SQS never issued (for message 3's id) inserted as entry 5, and that id.
pub(super) async fn twelve_leased_and_a_refused_receipt(
    queue: &impl QueueClient,
    lease: Duration,
) -> anyhow::Result<(Vec<(MessageId, PopReceipt)>, MessageId)> {
    for n in 0..12 {
        queue.put(format!("message {n}").as_bytes(), Duration::ZERO).await?;
    }
    let mut entries = Vec::new();
    while entries.len() < 12 {
        let got = queue.get(10, lease).await?;
        anyhow::ensure!(!got.is_empty(), "moto returned {} of 12", entries.len());
        entries.extend(got.into_iter().map(|m| (m.id, m.pop_receipt)));
    }
    let refused = entries[3].0.clone();
    entries.insert(5, (refused.clone(), PopReceipt::from(format!("{refused} AQEBnotissued"))));
    Ok((entries, refused))
}

/// Issue 37 item 2: deletes go as `DeleteMessageBatch`, one request per 10, and a receipt
/// SQS refuses fails its own entry only, as a stale receipt.
#[tokio::test]
async fn a_batch_delete_is_one_request_per_10_and_a_refused_receipt_fails_its_entry_alone() -> anyhow::Result<()> {
    let metered = ebb::queue::Metered::new(created("batched", SqsOptions::default()).await);
    let transactions = metered.transactions();
    let (entries, refused) = twelve_leased_and_a_refused_receipt(&metered, Duration::from_secs(60)).await?;
    let before = transactions.snapshot().deletes;
    let results = metered.delete_batch(&entries).await;
    assert_eq!(transactions.snapshot().deletes - before, 2, "13 entries are two requests");
    for (n, result) in results.iter().enumerate() {
        match n {
            5 => assert!(matches!(result, Err(QueueError::StaleReceipt { id }) if *id == refused), "entry 5: {result:?}"),
            _ => assert!(result.is_ok(), "entry {n}: {result:?}"),
        }
    }
    assert_eq!(metered.approximate_count().await?, 0, "the 12 are deleted");
    Ok(())
}

/// Issue 37 item 2: messages handled side by side are deleted together, one
/// `DeleteMessageBatch` for a receive of 10, not ten `DeleteMessage`s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_messages_handled_together_are_deleted_in_one_request() -> anyhow::Result<()> {
    let metered = Arc::new(ebb::queue::Metered::new(created("together", SqsOptions::default()).await));
    let transactions = metered.transactions();
    for n in 0..10 {
        metered.put(format!("message {n}").as_bytes(), Duration::ZERO).await?;
    }
    let poison = Arc::new(created("together-poison", SqsOptions::default()).await);
    let settings = ebb::listener::QueueSettings { batch_size: 10, ..Default::default() };
    let listener = ebb::listener::Listener::builder(metered.clone(), poison, Arc::new(Handled::default())).settings(settings).build();
    listener.start();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while listener.status().processed < 10 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let counts = transactions.snapshot();
    assert_eq!((listener.status().processed, counts.gets_with_messages, counts.deletes), (10, 1, 1), "{counts:?}");
    assert_eq!(metered.approximate_count().await?, 0);
    listener.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
