//! One conformance suite for every queue backend: [`queue_conformance!`] expands into a
//! test per case, each run against a fresh queue of the given [`Backend`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ebb::queue::{MAX_BATCH, QueueClient, QueueError};

/// A backend under test.
#[async_trait]
pub trait Backend: Send + Sync {
    /// A fresh, empty, created queue.
    async fn queue(&self, name: &str) -> Arc<dyn QueueClient>;
    /// Lets `duration` pass on the clock the backend's visibility timeouts run on.
    async fn pass(&self, duration: Duration);
    /// The backend's message size limit, in bytes.
    fn max_message_bytes(&self) -> usize;
    /// The most messages one get returns: [`MAX_BATCH`] (Azure's 32), or the service's
    /// lower limit (SQS: 10 per ReceiveMessage).
    fn max_get(&self) -> u32 {
        MAX_BATCH
    }
    /// Whether the service refuses a receipt of an earlier lease, or of a deleted message.
    /// SQS, by nature, keeps a message's earlier receipt handles valid (AWS documents that a
    /// delete with one succeeds) and answers a second delete with success.
    fn refuses_stale_receipts(&self) -> bool {
        true
    }
    /// Whether a visibility update issues a new receipt (SQS's ChangeMessageVisibility
    /// does not: the lease's receipt holds).
    fn update_issues_new_receipt(&self) -> bool {
        true
    }
}

/// Expands into one `#[tokio::test]` per conformance case. `$attr` is the test attribute
/// (e.g. `#[tokio::test(start_paused = true)]`), `$backend` an async fn returning a `Backend`.
#[macro_export]
macro_rules! queue_conformance {
    ($(#[$attr:meta])* ; $backend:path) => {
        $crate::queue_conformance!(@cases [$(#[$attr])*] $backend;
            put_get_delete_round_trip,
            leased_message_reappears_after_visibility_timeout,
            stale_receipt_cannot_delete_or_update,
            malformed_receipt_or_id_is_a_stale_receipt,
            release_makes_visible_and_renewal_extends_lease,
            get_takes_at_most_32_and_rejects_bad_batch_sizes,
            empty_get_returns_nothing,
            approximate_count_counts_leased_messages_until_deleted,
            message_size_limit_is_enforced,
            order_is_roughly_fifo,
            initial_visibility_delays_a_put,
            queues_are_independent,
        );
    };
    (@cases $attrs:tt $backend:path; $($case:ident),* $(,)?) => {
        $( $crate::queue_conformance!(@one $attrs $backend; $case); )*
    };
    (@one [$(#[$attr:meta])*] $backend:path; $case:ident) => {
        $(#[$attr])*
        async fn $case() {
            let backend = $backend().await;
            $crate::conformance::$case(&backend).await;
        }
    };
}

const LEASE: Duration = Duration::from_secs(30);

async fn bodies(queue: &dyn QueueClient, max: u32) -> Vec<String> {
    queue.get(max, LEASE).await.unwrap().into_iter().map(|m| String::from_utf8(m.body.to_vec()).unwrap()).collect()
}

pub async fn put_get_delete_round_trip(backend: &impl Backend) {
    let queue = backend.queue("round-trip").await;
    let id = queue.put(b"hello", Duration::ZERO).await.unwrap();
    let got = queue.get(32, LEASE).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].id.as_str(), &got[0].body[..], got[0].dequeue_count), (id.as_str(), &b"hello"[..], 1));
    queue.delete(&got[0].id, &got[0].pop_receipt).await.unwrap();
    backend.pass(LEASE * 2).await;
    assert!(queue.get(32, LEASE).await.unwrap().is_empty(), "a deleted message never comes back");
}

pub async fn leased_message_reappears_after_visibility_timeout(backend: &impl Backend) {
    let queue = backend.queue("visibility").await;
    queue.put(b"m", Duration::ZERO).await.unwrap();
    let first = queue.get(1, Duration::from_secs(2)).await.unwrap().remove(0);
    assert!(queue.get(32, LEASE).await.unwrap().is_empty(), "leased, so invisible");
    backend.pass(Duration::from_secs(3)).await;
    let again = queue.get(1, LEASE).await.unwrap().remove(0);
    assert_eq!(again.id, first.id);
    assert_eq!(again.dequeue_count, 2);
    assert_ne!(again.pop_receipt, first.pop_receipt, "every lease issues a new receipt");
}

pub async fn stale_receipt_cannot_delete_or_update(backend: &impl Backend) {
    let queue = backend.queue("stale").await;
    queue.put(b"m", Duration::ZERO).await.unwrap();
    let first = queue.get(1, Duration::from_secs(1)).await.unwrap().remove(0);
    backend.pass(Duration::from_secs(2)).await;
    let second = queue.get(1, LEASE).await.unwrap().remove(0);
    if !backend.refuses_stale_receipts() {
        // SQS: the earlier handle may still act on the message; whatever it does, each
        // answer is success or a stale receipt (never an error that stops a task), and once
        // the current holder deleted it the message is gone.
        let answers = [
            queue.update_visibility(&first.id, &first.pop_receipt, Duration::from_secs(1)).await.map(|_| ()),
            queue.delete(&first.id, &first.pop_receipt).await,
            queue.delete(&second.id, &second.pop_receipt).await,
            queue.delete(&second.id, &second.pop_receipt).await,
        ];
        for answer in answers {
            assert!(matches!(answer, Ok(()) | Err(QueueError::StaleReceipt { .. })), "{answer:?}");
        }
        backend.pass(Duration::from_secs(2)).await;
        assert!(queue.get(32, LEASE).await.unwrap().is_empty(), "deleted by its holder");
        return;
    }
    let stale = queue.delete(&first.id, &first.pop_receipt).await.unwrap_err();
    assert!(matches!(stale, QueueError::StaleReceipt { .. }), "{stale}");
    let stale = queue.update_visibility(&first.id, &first.pop_receipt, Duration::ZERO).await.unwrap_err();
    assert!(matches!(stale, QueueError::StaleReceipt { .. }), "{stale}");
    queue.delete(&second.id, &second.pop_receipt).await.unwrap();
    let gone = queue.delete(&second.id, &second.pop_receipt).await.unwrap_err();
    assert!(matches!(gone, QueueError::StaleReceipt { .. }), "deleting twice: {gone}");
}

/// A receipt or id that was never issued (garbage from a caller, a receipt from another
/// backend) is a lost lease, like any stale receipt: never a fatal error that stops a task,
/// and the message stays leased to its holder.
pub async fn malformed_receipt_or_id_is_a_stale_receipt(backend: &impl Backend) {
    let queue = backend.queue("malformed").await;
    queue.put(b"m", Duration::ZERO).await.unwrap();
    let leased = queue.get(1, LEASE).await.unwrap().remove(0);
    let garbage_receipt = ebb::queue::PopReceipt::from("not a receipt%00");
    let garbage_id = ebb::queue::MessageId::from("not an id");
    for (id, receipt) in [(&leased.id, &garbage_receipt), (&garbage_id, &leased.pop_receipt), (&garbage_id, &garbage_receipt)] {
        let error = queue.delete(id, receipt).await.unwrap_err();
        assert!(matches!(error, QueueError::StaleReceipt { .. }), "delete {id} with {receipt:?}: {error}");
        let error = queue.update_visibility(id, receipt, Duration::ZERO).await.unwrap_err();
        assert!(matches!(error, QueueError::StaleReceipt { .. }), "update {id} with {receipt:?}: {error}");
    }
    assert!(queue.get(1, LEASE).await.unwrap().is_empty(), "the message is still leased to its holder");
    queue.delete(&leased.id, &leased.pop_receipt).await.unwrap();
}

pub async fn release_makes_visible_and_renewal_extends_lease(backend: &impl Backend) {
    let queue = backend.queue("update").await;
    queue.put(b"m", Duration::ZERO).await.unwrap();
    let leased = queue.get(1, LEASE).await.unwrap().remove(0);
    let released = queue.update_visibility(&leased.id, &leased.pop_receipt, Duration::ZERO).await.unwrap();
    if backend.update_issues_new_receipt() {
        assert_ne!(released, leased.pop_receipt);
    } else {
        assert_eq!(released, leased.pop_receipt, "the lease's receipt holds");
    }
    let again = queue.get(1, Duration::from_secs(10)).await.unwrap().remove(0);
    assert_eq!((again.id.as_str(), again.dequeue_count), (leased.id.as_str(), 2));
    let renewed = queue.update_visibility(&again.id, &again.pop_receipt, Duration::from_secs(60)).await.unwrap();
    backend.pass(Duration::from_secs(20)).await;
    assert!(queue.get(32, LEASE).await.unwrap().is_empty(), "the renewed lease still holds");
    queue.delete(&again.id, &renewed).await.unwrap();
}

pub async fn get_takes_at_most_32_and_rejects_bad_batch_sizes(backend: &impl Backend) {
    let queue = backend.queue("batches").await;
    for i in 0..40 {
        queue.put(format!("{i}").as_bytes(), Duration::ZERO).await.unwrap();
    }
    // 32, or the service's lower limit per get (SQS: 10), then the rest.
    let per_get = MAX_BATCH.min(backend.max_get()) as usize;
    assert_eq!(queue.get(32, LEASE).await.unwrap().len(), per_get);
    let mut got = per_get;
    while got < 40 {
        let n = queue.get(32, LEASE).await.unwrap().len();
        assert!(n > 0 && n <= per_get, "a get of 32 returned {n} with {} left", 40 - got);
        got += n;
    }
    for bad in [0, 33] {
        assert!(matches!(queue.get(bad, LEASE).await, Err(QueueError::BadBatchSize(n)) if n == bad));
    }
}

pub async fn empty_get_returns_nothing(backend: &impl Backend) {
    let queue = backend.queue("empty").await;
    assert!(queue.get(32, LEASE).await.unwrap().is_empty());
    assert_eq!(queue.approximate_count().await.unwrap(), 0);
}

pub async fn approximate_count_counts_leased_messages_until_deleted(backend: &impl Backend) {
    let queue = backend.queue("count").await;
    for _ in 0..5 {
        queue.put(b"m", Duration::ZERO).await.unwrap();
    }
    assert_eq!(queue.approximate_count().await.unwrap(), 5);
    let leased = queue.get(2, LEASE).await.unwrap();
    assert_eq!(queue.approximate_count().await.unwrap(), 5, "leased messages still count");
    queue.delete(&leased[0].id, &leased[0].pop_receipt).await.unwrap();
    assert_eq!(queue.approximate_count().await.unwrap(), 4);
}

pub async fn message_size_limit_is_enforced(backend: &impl Backend) {
    let queue = backend.queue("size").await;
    let limit = backend.max_message_bytes();
    queue.put(&vec![b'x'; limit], Duration::ZERO).await.unwrap();
    match queue.put(&vec![b'x'; limit + 1], Duration::ZERO).await {
        Err(QueueError::MessageTooLarge { size, limit: l }) => assert_eq!((size, l), (limit + 1, limit)),
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
    assert_eq!(bodies(queue.as_ref(), 32).await.len(), 1, "the oversized message was not stored");
}

pub async fn order_is_roughly_fifo(backend: &impl Backend) {
    let queue = backend.queue("fifo").await;
    let sent: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    for body in &sent {
        queue.put(body.as_bytes(), Duration::ZERO).await.unwrap();
    }
    let got = bodies(queue.as_ref(), 32).await;
    let mut sorted = got.clone();
    sorted.sort_by_key(|b| b[1..].parse::<u32>().unwrap());
    assert_eq!(sorted, sent, "every message exactly once");
    assert_eq!(got[0], "m0", "the oldest comes first");
}

pub async fn initial_visibility_delays_a_put(backend: &impl Backend) {
    let queue = backend.queue("delayed").await;
    queue.put(b"later", Duration::from_secs(5)).await.unwrap();
    assert!(queue.get(32, LEASE).await.unwrap().is_empty());
    backend.pass(Duration::from_secs(6)).await;
    assert_eq!(bodies(queue.as_ref(), 32).await, ["later"]);
}

pub async fn queues_are_independent(backend: &impl Backend) {
    let a = backend.queue("first").await;
    let b = backend.queue("second").await;
    a.put(b"for a", Duration::ZERO).await.unwrap();
    assert!(b.get(32, LEASE).await.unwrap().is_empty());
    assert_eq!(b.approximate_count().await.unwrap(), 0);
    assert_eq!(bodies(a.as_ref(), 32).await, ["for a"]);
}
