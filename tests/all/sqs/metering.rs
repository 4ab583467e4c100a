//! Issue 37's goal: ebb's own metering equals SQS's request count for every operation. moto
//! keeps no count per operation, so the fault proxy stands in front of it faulting nothing
//! and logs each request's `X-Amz-Target`; the meter's counts by kind must be those
//! requests, setup included (`CreateQueue`, the attribute read at create, `GetQueueUrl`).

use std::collections::BTreeMap;
use std::time::Duration;

use ebb::queue::sqs::{SqsOptions, SqsQueue};
use ebb::queue::{Metered, QueueClient, TransactionCounts};
use ebb_tests::azurite::unique_queue_name;
use ebb_tests::fault_proxy::FaultProxy;
use ebb_tests::moto::Moto;

/// The proxy's requests by operation; `GetQueueAttributes` split by what it asks: the
/// message limit (read at create, "GetQueueAttributes:limit") or the count.
fn by_operation(proxy: &FaultProxy) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for (operation, body) in proxy.sqs_requests() {
        let key = match operation.as_str() {
            "GetQueueAttributes" if body.contains("MaximumMessageSize") => "GetQueueAttributes:limit".to_string(),
            _ => operation,
        };
        *counts.entry(key).or_default() += 1;
    }
    counts
}

/// What the meter's counts say SQS saw, in the proxy's terms.
fn metered_as_operations(counts: &TransactionCounts, proxy: &BTreeMap<String, u64>) -> BTreeMap<&'static str, (u64, u64)> {
    let seen = |names: &[&str]| names.iter().map(|name| proxy.get(*name).copied().unwrap_or(0)).sum::<u64>();
    BTreeMap::from([
        (
            "setup: CreateQueue, GetQueueUrl, the limit's GetQueueAttributes",
            (counts.creates, seen(&["CreateQueue", "GetQueueUrl", "GetQueueAttributes:limit"])),
        ),
        ("puts: SendMessage", (counts.puts, seen(&["SendMessage"]))),
        ("gets: ReceiveMessage", (counts.gets_with_messages + counts.gets_empty, seen(&["ReceiveMessage"]))),
        ("deletes: DeleteMessage, DeleteMessageBatch", (counts.deletes, seen(&["DeleteMessage", "DeleteMessageBatch"]))),
        ("updates: ChangeMessageVisibility", (counts.updates, seen(&["ChangeMessageVisibility"]))),
        ("counts: GetQueueAttributes", (counts.counts, seen(&["GetQueueAttributes"]))),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_meter_counts_every_request_sqs_answered_by_operation() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let proxy = FaultProxy::start(moto.port(), 0.0, 1).await;
    let account = Moto::account_at(&format!("http://127.0.0.1:{}", proxy.port()));
    let name = unique_queue_name("metering");
    let queue = Metered::new(SqsQueue::new(&account, &name, SqsOptions::default())?);
    let transactions = queue.transactions();

    queue.create_if_missing().await?;
    for n in 0..12 {
        queue.put(format!("m-{n}").as_bytes(), Duration::ZERO).await?;
    }
    let mut got = queue.get(10, Duration::from_secs(30)).await?;
    assert_eq!(got.len(), 10, "a full receive");
    let released = got.remove(0);
    queue.update_visibility(&released.id, &released.pop_receipt, Duration::ZERO).await?;
    let single = got.remove(0);
    queue.delete(&single.id, &single.pop_receipt).await?;
    let entries: Vec<_> = got.iter().map(|m| (m.id.clone(), m.pop_receipt.clone())).collect();
    assert!(queue.delete_batch(&entries).await.iter().all(Result::is_ok));
    assert_eq!(queue.approximate_count().await?, 3);
    // A long poll that finds the rest, and one that waits and finds nothing.
    let rest = queue.get_waiting(10, Duration::from_secs(30), Duration::from_secs(1)).await?;
    for message in &rest {
        queue.delete(&message.id, &message.pop_receipt).await?;
    }
    while queue.approximate_count().await? > 0 {
        for message in queue.get_waiting(10, Duration::from_secs(30), Duration::from_secs(1)).await? {
            queue.delete(&message.id, &message.pop_receipt).await?;
        }
    }
    assert!(queue.get_waiting(10, Duration::from_secs(30), Duration::from_secs(1)).await?.is_empty());

    // Another handle on the same queue, its URL not known: the first call looks it up.
    let second = Metered::sharing(SqsQueue::new(&account, &name, SqsOptions::default())?, transactions.clone());
    assert_eq!(second.approximate_count().await?, 0);

    let proxy_counts = by_operation(&proxy);
    let counts = transactions.snapshot();
    eprintln!("proxy {proxy_counts:?}; meter {counts:?}");
    for (operation, (metered, seen)) in metered_as_operations(&counts, &proxy_counts) {
        assert_eq!(metered, seen, "{operation}: the meter counted {metered}, SQS answered {seen} (proxy {proxy_counts:?})");
    }
    assert_eq!(counts.total(), proxy_counts.values().sum::<u64>(), "every request counted once");
    assert!(proxy_counts.get("GetQueueUrl").copied() == Some(1) && proxy_counts.get("DeleteMessageBatch").copied() == Some(1), "{proxy_counts:?}");
    Ok(())
}
