//! The embedded queue: the conformance suite, durability across SIGKILL, ownership.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ebb::queue::embedded::{DEFAULT_MAX_MESSAGE_BYTES, EmbeddedOptions, EmbeddedStore};
use ebb::queue::{Clock, QueueClient, SystemClock, TokioClock};
use ebb_tests::conformance::Backend;

struct Embedded {
    store: EmbeddedStore,
    _dir: tempfile::TempDir,
}

#[async_trait]
impl Backend for Embedded {
    async fn queue(&self, name: &str) -> Arc<dyn QueueClient> {
        let queue = self.store.queue(name);
        queue.create_if_missing().await.unwrap();
        Arc::new(queue)
    }

    async fn pass(&self, duration: Duration) {
        tokio::time::advance(duration).await;
    }

    fn max_message_bytes(&self) -> usize {
        DEFAULT_MAX_MESSAGE_BYTES
    }
}

async fn embedded() -> Embedded {
    let dir = tempfile::tempdir().unwrap();
    let options = EmbeddedOptions { clock: Arc::new(TokioClock::new()), ..EmbeddedOptions::default() };
    Embedded { store: EmbeddedStore::open(dir.path(), options).unwrap(), _dir: dir }
}

mod conformance {
    ebb_tests::queue_conformance!(#[tokio::test(start_paused = true)]; super::embedded);
}

/// The in-memory backend (simulations, paused-clock listener tests) must behave the same.
struct Memory(Arc<TokioClock>);

#[async_trait]
impl Backend for Memory {
    async fn queue(&self, name: &str) -> Arc<dyn QueueClient> {
        Arc::new(ebb::queue::memory::MemoryQueue::new(name, self.0.clone(), DEFAULT_MAX_MESSAGE_BYTES))
    }

    async fn pass(&self, duration: Duration) {
        tokio::time::advance(duration).await;
    }

    fn max_message_bytes(&self) -> usize {
        DEFAULT_MAX_MESSAGE_BYTES
    }
}

async fn memory() -> Memory {
    Memory(Arc::new(TokioClock::new()))
}

mod memory_conformance {
    ebb_tests::queue_conformance!(#[tokio::test(start_paused = true)]; super::memory);
}

/// A clock an hour ahead: every lease taken before a crash has run out.
struct AnHourLater;

impl Clock for AnHourLater {
    fn now_ms(&self) -> u64 {
        SystemClock.now_ms() + 3_600_000
    }
}

#[tokio::test]
async fn sigkill_mid_batch_loses_no_message() {
    let dir = tempfile::tempdir().unwrap();
    let total = 3000;
    {
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
        let queue = store.queue("work");
        queue.create_if_missing().await.unwrap();
        let puts = (0..total).map(|i| {
            let queue = &queue;
            async move { queue.put(format!("message {i}").as_bytes(), Duration::ZERO).await.unwrap() }
        });
        let ids = futures::future::join_all(puts).await;
        assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), total);
    } // closed: the worker can own the directory

    let mut worker = Command::new(env!("CARGO_BIN_EXE_queue-crash-worker"))
        .arg(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(worker.stdout.take().unwrap()).lines();
    let (mut attempted, mut acked) = (BTreeSet::new(), BTreeSet::new());
    let (mut batch, mut deleted_in_batch, mut batches) = (0, 0, 0);
    // Let a few batches finish, then kill the worker in the middle of one.
    while let Some(line) = lines.next() {
        let line = line.unwrap();
        if let Some(n) = line.strip_prefix("leased ") {
            (batch, deleted_in_batch) = (n.parse().unwrap(), 0);
            batches += 1;
        } else if let Some(id) = line.strip_prefix("deleting ") {
            attempted.insert(id.to_string());
        } else if let Some(id) = line.strip_prefix("deleted ") {
            acked.insert(id.to_string());
            deleted_in_batch += 1;
            if batches >= 4 && deleted_in_batch == batch / 3 {
                worker.kill().unwrap(); // SIGKILL
                break;
            }
        }
    }
    worker.wait().unwrap();
    for line in lines.map_while(Result::ok) {
        if let Some(id) = line.strip_prefix("deleting ") {
            attempted.insert(id.to_string());
        } else if let Some(id) = line.strip_prefix("deleted ") {
            acked.insert(id.to_string());
        }
    }
    assert!(acked.len() > 96, "the worker finished several batches before the kill");

    let options = EmbeddedOptions { clock: Arc::new(AnHourLater), ..EmbeddedOptions::default() };
    let store = EmbeddedStore::open(dir.path(), options).unwrap();
    let queue = store.queue("work");
    let mut drained = BTreeSet::new();
    let mut released_leases = 0;
    loop {
        let messages = queue.get(32, Duration::from_secs(600)).await.unwrap();
        if messages.is_empty() {
            break;
        }
        for message in messages {
            released_leases += usize::from(message.dequeue_count == 2);
            assert!(drained.insert(message.id.clone()), "{} came back twice", message.id);
            queue.delete(&message.id, &message.pop_receipt).await.unwrap();
        }
    }
    assert!(acked.is_disjoint(&drained), "an acknowledged delete came back");
    let missing = total - drained.len();
    // Every message is either back, or was being deleted by the worker when it died.
    assert!(missing <= attempted.len(), "{missing} missing, only {} deletes attempted", attempted.len());
    assert!(acked.len() <= missing, "acknowledged deletes stay deleted");
    assert!(released_leases > 0, "the messages leased by the killed worker came back");
    assert_eq!(queue.approximate_count().await.unwrap(), 0);
}

#[tokio::test]
async fn a_second_process_cannot_open_an_owned_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let _owner = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_queue-crash-worker")).arg(dir.path()).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is in use by another ebb process"), "{stderr}");
}

