//! Issue 37's bad input that needs SQS itself (moto), beyond the other SQS test files: a
//! wrong endpoint, a wrong region, and a receipt handle whose lease ran out (taken by SQS,
//! so a host must not renew a lease its own clock says ran out).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ebb::handler::{Handler, IncomingMessage};
use ebb::listener::{Listener, QueueSettings};
use ebb::queue::sqs::{AwsCredentials, AwsSettings, SqsAccount, SqsOptions, SqsQueue};
use ebb::queue::{FailureClass, Message, QueueClient, QueueError};
use ebb_tests::azurite::{free_port, unique_queue_name};
use ebb_tests::moto::Moto;

use crate::hooked_queue::{Hooked, Hooks};

/// An account on `endpoint` in `region`, with moto's test keys.
fn account(endpoint: &str, region: &str) -> SqsAccount {
    let credentials = AwsCredentials::Static { access_key_id: "testing".into(), secret_access_key: "testing".into(), session_token: None };
    SqsAccount::new(AwsSettings { region: Some(region.into()), endpoint: Some(endpoint.into()), credentials, ..AwsSettings::default() })
}

#[tokio::test]
async fn a_wrong_endpoint_is_a_connection_failure_worth_retrying_that_names_it() -> anyhow::Result<()> {
    // Nothing listens there.
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let queue = SqsQueue::new(&account(&endpoint, "us-east-1"), "orders", SqsOptions::default())?;
    let error = queue.create_if_missing().await.unwrap_err();
    assert_eq!((error.failure_class(), error.is_transient()), (Some(FailureClass::Connection), true), "{error}");
    assert!(error.to_string().contains(&endpoint) && error.to_string().contains("queue orders"), "{error}");
    Ok(())
}

#[tokio::test]
async fn a_wrong_region_finds_no_queue_and_the_error_names_the_region() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let name = unique_queue_name("region");
    SqsQueue::new(&moto.account(), &name, SqsOptions::default())?.create_if_missing().await?;
    // The same endpoint, another region: SQS queues are regional.
    let queue = SqsQueue::new(&account(&moto.endpoint(), "eu-west-1"), &name, SqsOptions::default())?;
    let error = queue.put(b"m", Duration::ZERO).await.unwrap_err();
    assert_eq!((error.failure_class(), error.is_transient()), (Some(FailureClass::Missing), false), "{error}");
    assert!(error.to_string().contains(&name) && error.to_string().contains("eu-west-1"), "{error}");
    Ok(())
}

/// SQS takes a receipt handle whose lease ran out without an error (AWS: the delete
/// succeeds but may not delete; moto deletes): a host that handled a message after its lease
/// ran out reports no failure, nor does the host that received it again.
#[tokio::test]
async fn a_receipt_whose_lease_ran_out_is_taken_without_error_by_both_holders() -> anyhow::Result<()> {
    let queue = SqsQueue::new(&Moto::shared().account(), &unique_queue_name("expired"), SqsOptions::default())?;
    queue.create_if_missing().await?;
    queue.put(b"m", Duration::ZERO).await?;
    let first = queue.get(1, Duration::from_secs(1)).await?.remove(0);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = queue.get(1, Duration::from_secs(30)).await?.remove(0);
    assert_eq!((second.id.as_str(), second.dequeue_count), (first.id.as_str(), 2));
    assert_ne!(first.pop_receipt, second.pop_receipt, "each receive issues a handle of its own");
    queue.update_visibility(&first.id, &first.pop_receipt, Duration::from_secs(30)).await?;
    queue.delete(&first.id, &first.pop_receipt).await?;
    queue.delete(&second.id, &second.pop_receipt).await?;
    assert_eq!(queue.approximate_count().await?, 0);
    Ok(())
}

/// Holds the first get's answer back for `get` after moto gave it, and each renewal for
/// `update` before it reaches moto, as a loaded moto or a slow network does.
struct Late {
    get: Duration,
    update: Duration,
    held: AtomicBool,
}

impl Late {
    fn new(get: Duration, update: Duration) -> Self {
        Late { get, update, held: AtomicBool::new(false) }
    }
}

#[async_trait]
impl Hooks for Late {
    async fn after_get(&self, got: &mut Result<Vec<Message>, QueueError>) {
        if got.as_ref().is_ok_and(|messages| !messages.is_empty()) && !self.held.swap(true, Ordering::SeqCst) {
            tokio::time::sleep(self.get).await;
        }
    }
    async fn before_update(&self) {
        tokio::time::sleep(self.update).await;
    }
}

/// Which bodies are in a handler now, and every time one was handled while another handler
/// (on either host) held it.
#[derive(Default)]
struct Overlaps {
    active: Mutex<BTreeSet<Vec<u8>>>,
    overlaps: AtomicU64,
    handled: AtomicU64,
}

#[async_trait]
impl Handler for Overlaps {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        if !self.active.lock().unwrap().insert(message.body.to_vec()) {
            self.overlaps.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        self.active.lock().unwrap().remove(&message.body[..]);
        self.handled.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A get answered after its lease ran out (seen in CI: two hosts on a loaded moto, a message
/// held by both handlers at once): SQS renews an old receipt handle without an error, so
/// renewing before the handler starts cannot tell that another host has the message now.
/// The host must go by its own clock and leave the message alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_lease_ran_out_before_its_get_was_answered_is_left_to_the_host_that_has_it() -> anyhow::Result<()> {
    // Its get has the message (leased for 2 s) and its answer is on the way for 4 s.
    a_late_host_leaves_the_message_to_the_other(Late::new(Duration::from_secs(4), Duration::ZERO)).await
}

/// A get answered with less than half the lease left, so renewed before the handler starts,
/// and that renewal reaches SQS only after the lease ran out: SQS takes it without an error,
/// though another host has the message by then. A renewal answered after the lease it renews
/// ran out proves nothing; the host leaves the message alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_answered_after_the_lease_ran_out_leaves_the_message_to_the_host_that_has_it() -> anyhow::Result<()> {
    // Its get is answered 1.5 s into the 2 s lease; the renewal reaches moto 2 s later.
    a_late_host_leaves_the_message_to_the_other(Late::new(Duration::from_millis(1500), Duration::from_secs(2))).await
}

/// Two listeners on one SQS queue holding one message, the first seeing moto through `late`:
/// while its lease runs out unseen, the second leases the message and handles it for 3 s. The
/// first must count its lease lost and never hand the message to its handler.
async fn a_late_host_leaves_the_message_to_the_other(late: Late) -> anyhow::Result<()> {
    let moto = Moto::shared();
    let name = unique_queue_name("late-get");
    let poison_name = format!("{name}-poison");
    let queue = || SqsQueue::new(&moto.account(), &name, SqsOptions::default());
    queue()?.create_if_missing().await?;
    let poison = Arc::new(SqsQueue::new(&moto.account(), &poison_name, SqsOptions::default())?);
    poison.create_if_missing().await?;
    queue()?.put(b"m", Duration::ZERO).await?;
    let settings = QueueSettings {
        lease_duration: Duration::from_secs(2),
        min_tasks: 1,
        max_tasks: 1,
        min_polling_interval: Duration::from_millis(100),
        max_polling_interval: Duration::from_millis(200),
        ..QueueSettings::default()
    };
    let handler = Arc::new(Overlaps::default());
    let late = Hooked::around(Arc::new(queue()?), late);
    let slow = Listener::builder(late.clone(), poison.clone(), handler.clone()).settings(settings.clone()).build();
    slow.start();
    while !late.held.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let other = Listener::builder(Arc::new(queue()?), poison, handler.clone()).settings(settings).build();
    other.start();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while handler.handled.load(Ordering::Relaxed) == 0 || queue()?.approximate_count().await? > 0 {
        assert!(std::time::Instant::now() < deadline, "the message was not handled and deleted within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(handler.overlaps.load(Ordering::Relaxed), 0, "the message was handled by both hosts at once");
    assert_eq!((slow.status().leases_lost, other.status().processed), (1, 1), "the late get's lease counted lost; the other host handled it");
    slow.shutdown(Duration::from_secs(5)).await;
    other.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
