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

/// Accepts every message.
struct Accepts;

#[async_trait::async_trait]
impl ebb::handler::Handler for Accepts {
    async fn handle(&self, _: &ebb::handler::IncomingMessage) -> anyhow::Result<()> {
        Ok(())
    }
}

/// The S3 requests the proxy saw S3 answer for `bucket` (path-style), by what S3 bills:
/// (PUT class: `PutObject`, `CreateBucket`; GET; DELETE; LIST).
fn s3_requests(proxy: &FaultProxy, bucket: &str) -> (u64, u64, u64, u64) {
    let (mut puts, mut gets, mut deletes, mut lists) = (0, 0, 0, 0);
    for (method, path, _) in proxy.answered() {
        let Some(rest) = path.strip_prefix(&format!("/{bucket}")) else { continue };
        let object = rest.len() > 1;
        match (method.as_str(), object) {
            ("PUT", _) => puts += 1,
            ("GET", true) => gets += 1,
            ("GET", false) => lists += 1,
            ("DELETE", true) => deletes += 1,
            other => panic!("an S3 request the test does not expect: {other:?} {path}"),
        }
    }
    (puts, gets, deletes, lists)
}

/// Issue 37: the S3 requests of claim checks (bodies too large for a message) are metered
/// apart from SQS's, as `/status`' `s3` and `/metrics`' `ebb_s3_requests_total`, equal to
/// the requests S3 (moto behind the proxy, faulting nothing) answered, by operation
/// (the first put finds no bucket, ebb creates it, puts again; a get and a delete per
/// message; the sweeper's list), and priced at S3's list price.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_s3_requests_of_claim_checks_are_metered_apart_from_sqs_and_equal_what_s3_answered() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let proxy = FaultProxy::start(moto.port(), 0.0, 1).await;
    let (queue, bucket) = (unique_queue_name("s3meter"), unique_queue_name("ebb-s3-meter"));
    // SAFETY: every test of this module sets them to the same values.
    unsafe {
        std::env::set_var("EBB_TEST_S3_METER_KEY_ID", "testing");
        std::env::set_var("EBB_TEST_S3_METER_SECRET", "testing");
    }
    let dir = tempfile::tempdir()?;
    let text = format!(
        "data_dir = {data:?}\ndrain_timeout = \"2s\"\n[api]\nlisten = \"127.0.0.1:0\"\n[scaler]\nlisten = \"127.0.0.1:0\"\n\
         [aws]\nregion = \"{region}\"\nendpoint = \"http://127.0.0.1:{port}\"\naccess_key_id_env = \"EBB_TEST_S3_METER_KEY_ID\"\n\
         secret_access_key_env = \"EBB_TEST_S3_METER_SECRET\"\nclaim_bucket = \"{bucket}\"\n\
         [queues.{queue}]\nbackend = \"sqs\"\nmin_polling_interval = \"100ms\"\nmax_polling_interval = \"500ms\"\nclaim_sweep_interval = \"24h\"\n",
        data = dir.path().join("data"),
        region = ebb_tests::moto::REGION,
        port = proxy.port(),
    );
    let host = ebb::Host::builder(&ebb::Config::parse(&text, dir.path(), None)?).handler(&queue, Accepts).start().await?;
    let sent = 3;
    for n in 0..sent {
        let body = vec![b'a' + n as u8; 1_200_000];
        host.queue(&queue).expect("the queue's handle").send(&body, Duration::ZERO, Duration::from_secs(60)).await?;
    }
    let http = reqwest::Client::new();
    let status_url = format!("http://{}/status", host.api_addr());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        let status: serde_json::Value = serde_json::from_slice(&http.get(&status_url).send().await?.bytes().await?)?;
        let deleted = status["s3"].as_array().and_then(|all| all.first()).and_then(|s3| s3["deletes"].as_u64());
        if deleted == Some(sent) {
            break status;
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "the bodies not all deleted within a minute: {}", status["s3"]);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let metrics = http.get(format!("http://{}/metrics", host.api_addr())).send().await?.text().await?;
    let seen = s3_requests(&proxy, &bucket);
    host.shutdown().await;

    let s3 = &status["s3"][0];
    assert_eq!(s3["queue"], queue.as_str());
    let metered = |field: &str| s3[field].as_u64().unwrap_or_default();
    assert_eq!((metered("puts"), metered("gets"), metered("deletes"), metered("lists")), seen, "(puts, gets, deletes, lists) metered and seen: {s3}");
    assert!(
        seen.0 == sent + 2 && seen.1 == sent && seen.3 >= 1,
        "a put per body, the bucket's creation and the put it failed; a get per body; a list: {seen:?}"
    );
    let usd = (seen.0 + seen.3) as f64 * 0.005 / 1000.0 + seen.1 as f64 * 0.0004 / 1000.0;
    assert!((s3["usd"].as_f64().unwrap_or_default() - usd).abs() < 1e-12, "priced at S3 Standard's: {s3}, not {usd}");
    for (operation, count) in [("s3_put", seen.0), ("s3_get", seen.1), ("s3_delete", seen.2), ("s3_list", seen.3)] {
        let line = format!("ebb_s3_requests_total{{queue=\"{queue}\",operation=\"{operation}\"}} {count}");
        assert!(metrics.contains(&line), "{line} in /metrics");
    }
    assert!(!metrics.contains("kind=\"s3_"), "S3's requests are not SQS's kinds");
    Ok(())
}

/// Issue 37: an S3 request the SDK tries again (S3 answered 503, the fault proxy's busy
/// answer) is a retry of the claim-check call that made it, as a storage call's is; each
/// attempt answered is a billed request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_request_tried_again_is_counted_as_a_retry_of_its_call_and_each_answer_as_a_request() -> anyhow::Result<()> {
    use ebb::payload::claims::{ClaimCall, ClaimStore, S3Claims, S3Operation};
    let moto = Moto::shared();
    let mix = ebb_tests::fault_proxy::FaultMix { server_busy: 0.3, drop_before: 0.0, drop_after: 0.0 };
    let proxy = FaultProxy::start_with_mix(moto.port(), mix, 11).await;
    let account = Moto::account_at(&format!("http://127.0.0.1:{}", proxy.port()));
    let claims = S3Claims::new(&account, &unique_queue_name("ebb-s3-retries"), "orders", 1 << 20);
    claims.create_if_missing().await?;
    for n in 0..4u8 {
        let check = claims.put(bytes::Bytes::from(vec![n; 1000])).await?;
        claims.get(&check, 1 << 20).await?;
        claims.delete(&check).await?;
    }
    let record = claims.record();
    let busy = proxy.counts().server_busy;
    let retries: u64 = ClaimCall::ALL.iter().map(|&call| record.retries(call)).sum();
    assert!(busy > 0, "the proxy answered some requests 503");
    assert_eq!(retries, busy, "every 503 tried again, counted as a retry of its call");
    let answered: u64 = S3Operation::ALL.iter().map(|&operation| record.s3().of(operation)).sum();
    assert_eq!(answered, proxy.counts().forwarded + busy, "each answer, 503s included, a request");
    assert_eq!(record.s3().unanswered(), 0);
    assert_eq!(record.s3_counts().retries, retries, "in /status too");
    Ok(())
}
