//! Issue 40, item 5: large sends survive a flaky blob service. A host whose queue is on
//! Azurite and whose claim store (Azurite's blob service) is reached only through the fault
//! proxy. Each blob request (a block, the commit, a range, a delete) is retried on its own,
//! so 50 MiB sends succeed while the blob service answers 503 to 15 % of requests; a send
//! that still fails answers 503 with `Retry-After`; the claim-check calls have metrics of
//! their own, and a fetch that fails is not counted as a handler call the host could not make.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use ebb::handler::{Handler, IncomingMessage};
use ebb::payload::claims::{AzureClaims, BLOB_RETRY, ClaimCall, sha256};
use ebb::queue::azure::AzureOptions;

use ebb::{Config, Host, QueueHandle};
use ebb_tests::azurite::{Azurite, unique_queue_name};
use ebb_tests::fault_proxy::{FaultMix, FaultProxy};

/// Records the SHA-256 of each body it is called with.
#[derive(Clone, Default)]
struct Digests(Arc<Mutex<Vec<[u8; 32]>>>);

#[async_trait::async_trait]
impl Handler for Digests {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        self.0.lock().unwrap().push(sha256(&message.body));
        Ok(())
    }
}

/// A worker host on `dir` for queue `queue` on the shared Azurite, its blobs through `proxy`.
async fn host_through(dir: &std::path::Path, proxy: &FaultProxy, queue: &str, handler: Digests) -> Result<Host> {
    let connection = format!("{};BlobEndpoint={}", Azurite::shared().connection_string(), proxy.endpoint());
    let text = format!(
        "data_dir = {:?}\n[azure]\nconnection_string = \"{connection}\"\n[api]\nlisten = \"127.0.0.1:0\"\n\
         [queues.{queue}]\nbackend = \"azure\"\nmax_claim_check_bytes = 67108864\nmin_polling_interval = \"100ms\"\nmax_polling_interval = \"500ms\"\n",
        dir.join("data")
    );
    let config = Config::parse(&text, dir, None)?;
    Host::builder(&config).handler(queue, handler).start().await
}

/// `len` bytes that do not compress and differ with `seed`.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut body = vec![0u8; len];
    fastrand::Rng::with_seed(seed).fill(&mut body);
    body
}

async fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + within;
    while !done() {
        ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The value of the `/metrics` line that starts with `series` (its name and labels).
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// Sums a claim-check figure over every call.
fn over_calls(handle: &QueueHandle, queue: &str, figure: impl Fn(&ebb::payload::claims::ClaimRecord, ClaimCall) -> u64) -> u64 {
    let record = handle.claim_records().expect("the service attaches claim records").for_queue(queue);
    ClaimCall::ALL.into_iter().map(|call| figure(&record, call)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_50_mib_sends_through_a_blob_service_answering_503_to_15_percent_of_requests_all_succeed_every_retry_counted() -> Result<()> {
    const SENDS: u64 = 3;
    let proxy = FaultProxy::start_with_mix(Azurite::shared_blob().port(), FaultMix { server_busy: 0.15, drop_before: 0.0, drop_after: 0.0 }, 405).await;
    let queue = unique_queue_name("blob-busy");
    // The container made beforehand, past the proxy: the first upload would otherwise fail
    // with ContainerNotFound and drop its other blocks' requests mid-retry (uncounted).
    let direct = AzureClaims::new(&Azurite::shared().account_with_blobs(Azurite::shared_blob()), &queue, 64 << 20, &AzureOptions::default())?;
    direct.create_if_missing().await?;
    let dir = tempfile::tempdir()?;
    let handler = Digests::default();
    let host = host_through(dir.path(), &proxy, &queue, handler.clone()).await?;
    let handle = host.queue(&queue).expect("the queue has a handle");
    let http = reqwest::Client::new();
    let started = Instant::now();
    let mut sent = Vec::new();
    for seed in 0..SENDS {
        let body = noise(50 << 20, seed);
        sent.push(sha256(&body));
        let answer = http.post(format!("http://{}/queues/{queue}/messages", host.api_addr())).body(body).send().await?;
        let status = answer.status();
        ensure!(status == 201, "send {} of {SENDS} failed: {status} {}", seed + 1, answer.text().await?);
    }
    let took = started.elapsed();
    wait_until("every body handled", Duration::from_secs(120), || handler.0.lock().unwrap().len() as u64 >= SENDS).await?;
    let mut handled = handler.0.lock().unwrap().clone();
    handled.sort();
    sent.sort();
    assert_eq!(handled, sent, "each body reached the handler once, byte-identical");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !direct.list_names().await?.is_empty() {
        ensure!(Instant::now() < deadline, "the handled bodies were not deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let metrics = http.get(format!("http://{}/metrics", host.api_addr())).send().await?.text().await?;
    let upload = format!("ebb_claim_calls_total{{queue=\"{queue}\",call=\"upload\"}}");
    assert_eq!(metric(&metrics, &upload), Some(SENDS as f64), "{upload} in /metrics");
    let upload_retries = format!("ebb_claim_retries_total{{queue=\"{queue}\",call=\"upload\"}}");
    assert!(metric(&metrics, &upload_retries).is_some_and(|n| n > 0.0), "{upload_retries} counts the blocks tried again");
    host.shutdown().await;
    // Only the blob service is behind the proxy, and no call was abandoned: each 503 it made
    // was one request retried.
    let busy = proxy.counts().server_busy;
    assert!(busy > 0, "the proxy made no fault");
    assert_eq!(over_calls(&handle, &queue, |r, c| r.retries(c)), busy, "every 503 the proxy made was retried and counted");
    assert_eq!(over_calls(&handle, &queue, |r, c| r.failed(c)), 0, "no claim-check call failed for good");
    eprintln!("{SENDS} sends of 50 MiB, blob 503s at 15 %: all succeeded in {took:?}, {busy} requests retried");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_the_blob_service_fails_throughout_answers_503_with_retry_after_and_a_failed_fetch_is_not_a_host_error() -> Result<()> {
    let proxy = FaultProxy::start_with_mix(Azurite::shared_blob().port(), FaultMix { server_busy: 0.0, drop_before: 0.0, drop_after: 0.0 }, 406).await;
    let queue = unique_queue_name("blob-down");
    let dir = tempfile::tempdir()?;
    let handler = Digests::default();
    let host = host_through(dir.path(), &proxy, &queue, handler.clone()).await?;
    let handle = host.queue(&queue).expect("the queue has a handle");
    let record = handle.claim_records().unwrap().for_queue(&queue);
    let api = host.api_addr();
    let http = reqwest::Client::new();
    // A body stored while the blob service answers, its message held back by a pause.
    let paused = http.post(format!("http://{api}/queues/{queue}/pause")).send().await?;
    ensure!(paused.status().is_success(), "pause: {}", paused.status());
    let stored = http.post(format!("http://{api}/queues/{queue}/messages")).body(noise(1 << 20, 1)).send().await?;
    ensure!(stored.status() == 201, "{} {}", stored.status(), stored.text().await?);

    // The blob service out of reach: a send fails after its retries, and says when to come back.
    proxy.set_down(true);
    let refused = http.post(format!("http://{api}/queues/{queue}/messages")).body(noise(1 << 20, 2)).send().await?;
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers().get("retry-after").map(|v| v.as_bytes().to_vec()), Some(b"2".to_vec()), "a producer is told when to send again");
    assert_eq!(record.failed(ClaimCall::Upload), 1, "the upload failed for good once");
    // A body under a block's size is one request, tried BLOB_RETRY.max_attempts times.
    assert_eq!(record.retries(ClaimCall::Upload), u64::from(BLOB_RETRY.max_attempts - 1));

    // The held message's body cannot be fetched: retried later, not a host error.
    let resumed = http.post(format!("http://{api}/queues/{queue}/resume")).send().await?;
    ensure!(resumed.status().is_success(), "resume: {}", resumed.status());
    wait_until("a fetch that failed for good", Duration::from_secs(60), || record.failed(ClaimCall::Fetch) >= 1).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let metrics = http.get(format!("http://{api}/metrics")).send().await?.text().await?;
    let host_errors = format!("ebb_handler_host_errors_total{{queue=\"{queue}\",logical_queue=\"{queue}\"}}");
    assert_eq!(metric(&metrics, &host_errors), Some(0.0), "{host_errors}: a storage failure is not the host out of file descriptors");
    let fetch_failed = format!("ebb_claim_gave_up_total{{queue=\"{queue}\",call=\"fetch\"}}");
    assert!(metric(&metrics, &fetch_failed).is_some_and(|n| n >= 1.0), "{fetch_failed} in /metrics");
    assert!(handler.0.lock().unwrap().is_empty(), "the handler was not called without its body");
    host.shutdown().await;
    Ok(())
}
