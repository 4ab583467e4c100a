//! Claim checks (issue 20, item 3) against real storage: Azurite's blob service (started by
//! the tests, from the same npm package as its queue service) and the embedded store; and a
//! producer killed with SIGKILL between a body's put and its message's, whose orphan the
//! sweeper removes.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use ebb::payload::claims::{AzureClaims, ClaimError, ClaimStore, EmbeddedClaims, sha256};
use ebb::payload::{BlobRef, ClaimCheck, DEFAULT_MAX_CLAIM_CHECK_BYTES};
use ebb::queue::QueueClient;
use ebb::queue::azure::{AzureAccount, AzureOptions, AzureQueue};
use ebb::queue::embedded::{EmbeddedOptions, EmbeddedStore};
use ebb_tests::azurite::{Azurite, free_port, unique_queue_name};

fn account() -> AzureAccount {
    Azurite::shared().account_with_blobs(Azurite::shared_blob())
}

fn store(queue: &str) -> AzureClaims {
    AzureClaims::new(&account(), queue, DEFAULT_MAX_CLAIM_CHECK_BYTES, &AzureOptions::default()).unwrap()
}

/// `len` bytes that do not compress and differ with `seed`.
fn random_body(len: usize, seed: u64) -> Bytes {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut body = vec![0u8; len];
    rng.fill(&mut body);
    Bytes::from(body)
}

#[tokio::test]
async fn a_50_mib_body_round_trips_through_azurite_blob_byte_identical_and_its_delete_leaves_none() -> anyhow::Result<()> {
    let claims = store(&unique_queue_name("claims-50mib"));
    let body = random_body(50 << 20, 1);
    let expected = sha256(&body);
    // The container does not exist yet: the first put creates it.
    let check = claims.put(body).await?;
    assert_eq!(check.size, 50 << 20);
    assert_eq!(check.sha256, expected);
    assert!(matches!(&check.location, BlobRef::Azure { container, .. } if container == claims.container_name()));
    assert_eq!(claims.list_names().await?.len(), 1);
    let fetched = claims.get(&check, DEFAULT_MAX_CLAIM_CHECK_BYTES).await?;
    assert_eq!(fetched.len(), 50 << 20);
    assert_eq!(sha256(&fetched), expected, "the body came back changed");
    claims.delete(&check).await?;
    assert_eq!(claims.list_names().await?, Vec::<String>::new(), "a blob was left behind");
    Ok(())
}

#[tokio::test]
async fn a_missing_blob_is_missing_a_poison_reason_not_a_retry() -> anyhow::Result<()> {
    let claims = store(&unique_queue_name("claims-missing"));
    let check = claims.put(Bytes::from_static(b"short-lived")).await?;
    claims.delete(&check).await?;
    let error = claims.get(&check, 1 << 20).await.unwrap_err();
    assert!(matches!(error, ClaimError::Missing { .. }), "{error:?}");
    assert!(!error.is_retryable());
    assert!(error.to_string().contains("is missing"), "{error}");
    // Deleting it again is no error.
    claims.delete(&check).await?;
    // A container that was never created: missing too, not a storage failure.
    let never = store(&unique_queue_name("claims-never"));
    let check =
        ClaimCheck { location: BlobRef::Azure { account: "devstoreaccount1".into(), container: never.container_name().into(), blob: "0123".into() }, ..check };
    assert!(matches!(never.get(&check, 1 << 20).await, Err(ClaimError::Missing { .. })));
    Ok(())
}

#[tokio::test]
async fn a_blob_that_is_not_the_claimed_body_is_corrupt() -> anyhow::Result<()> {
    let claims = store(&unique_queue_name("claims-corrupt"));
    let check = claims.put(random_body(100_000, 2)).await?;
    let wrong_hash = ClaimCheck { sha256: [1; 32], ..check.clone() };
    let error = claims.get(&wrong_hash, 1 << 20).await.unwrap_err();
    assert!(matches!(error, ClaimError::Corrupt { .. }) && error.to_string().contains("SHA-256"), "{error}");
    let shorter_claim = ClaimCheck { size: 99_999, ..check.clone() };
    let error = claims.get(&shorter_claim, 1 << 20).await.unwrap_err();
    assert!(matches!(error, ClaimError::Corrupt { .. }) && error.to_string().contains("more than"), "{error}");
    let longer_claim = ClaimCheck { size: 100_001, ..check.clone() };
    let error = claims.get(&longer_claim, 1 << 20).await.unwrap_err();
    assert!(matches!(error, ClaimError::Corrupt { .. }) && error.to_string().contains("100000 bytes"), "{error}");
    claims.get(&check, 1 << 20).await?;
    // A claim of no bytes is refused before any request (nothing offloads an empty body),
    // so it cannot turn into a download into a short buffer, which would be retried.
    let empty_claim = ClaimCheck { size: 0, sha256: sha256(b""), ..check };
    let error = claims.get(&empty_claim, 1 << 20).await.unwrap_err();
    assert!(matches!(error, ClaimError::Refused(_)) && error.to_string().contains("0 bytes"), "{error}");
    assert!(matches!(claims.put(Bytes::new()).await, Err(ClaimError::Refused(_))));
    Ok(())
}

#[tokio::test]
async fn foreign_and_malformed_references_are_refused_before_any_request() -> anyhow::Result<()> {
    // Nothing listens on this blob endpoint: a request would fail as a transient
    // connection error, so a refusal proves none was made.
    let nowhere = Azurite::shared().account().with_blob_endpoint(&format!("http://127.0.0.1:{}/devstoreaccount1", free_port()))?;
    let queue = unique_queue_name("claims-foreign");
    let claims = AzureClaims::new(&nowhere, &queue, 1 << 20, &AzureOptions::default())?;
    let ours = claims.container_name().to_string();
    let check = |account: &str, container: &str, blob: &str, size: u64| ClaimCheck {
        location: BlobRef::Azure { account: account.into(), container: container.into(), blob: blob.into() },
        size,
        sha256: [0; 32],
    };
    let cases = [
        ("another account", check("victim", &ours, "a", 1), "not allowed here"),
        ("another container", check("devstoreaccount1", "payroll-bodies", "a", 1), "not allowed here"),
        ("an embedded body", ClaimCheck { location: BlobRef::Embedded { queue: queue.clone(), key: 1 }, size: 1, sha256: [0; 32] }, "not allowed here"),
        ("dot-dot", check("devstoreaccount1", &ours, "../payroll-bodies/a", 1), "'..'"),
        ("a control character", check("devstoreaccount1", &ours, "a\u{7}", 1), "control"),
        ("over the limit", check("devstoreaccount1", &ours, "a", (1 << 20) + 1), "over the limit"),
    ];
    for (name, check, expected) in cases {
        // A delete never reads the body, so only its reference is checked, not its size.
        let delete = if name == "over the limit" { None } else { Some(("delete", claims.delete(&check).await)) };
        for (call, result) in [Some(("get", claims.get(&check, 1 << 20).await.map(drop))), delete].into_iter().flatten() {
            let error = result.expect_err(name);
            assert!(!error.is_retryable(), "{name} ({call}): a request was made: {error}");
            assert!(error.to_string().contains(expected), "{name} ({call}): {error}");
        }
    }
    // And the store really is unreachable: a put is a transient error.
    assert!(claims.put(Bytes::from_static(b"x")).await.unwrap_err().is_retryable());
    Ok(())
}

#[tokio::test]
async fn the_azure_sweep_removes_only_blobs_older_than_the_retention() -> anyhow::Result<()> {
    let claims = store(&unique_queue_name("claims-sweep"));
    let check = claims.put(Bytes::from_static(b"an orphan")).await?;
    let report = claims.sweep(Duration::from_secs(3600)).await?;
    assert_eq!((report.removed, report.transactions), (0, 1), "one list call, nothing old enough");
    claims.get(&check, 1 << 20).await?;
    // Azurite dates blobs to the second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let report = claims.sweep(Duration::ZERO).await?;
    assert_eq!((report.removed, report.transactions), (1, 2), "one list call and one delete");
    assert!(claims.list_names().await?.is_empty());
    Ok(())
}

/// Runs the crash producer on `kind` and `place` for `queue`, kills it with SIGKILL once it
/// has stored its body and before it puts the message, and gives where it said the body is.
fn crash_producer_after_its_body(kind: &str, place: &str, queue: &str) -> String {
    let mut producer = Command::new(env!("CARGO_BIN_EXE_claim-crash-producer"))
        .args([kind, place, queue])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the crash producer starts");
    let mut line = String::new();
    BufReader::new(producer.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("claimed "), "the producer said {line:?}");
    producer.kill().unwrap(); // SIGKILL: no destructor, no flush, no cleanup
    let status = producer.wait().unwrap();
    assert!(!status.success(), "it was killed, not finished: {status}");
    // Its stdin is gone with it; writing now would not make it send.
    let _ = producer.stdin.take().map(|mut stdin| stdin.write_all(b"go\n"));
    line.trim_end().trim_start_matches("claimed ").to_string()
}

#[tokio::test]
async fn a_producer_killed_between_blob_put_and_message_put_leaves_an_orphan_the_sweeper_removes_on_azure() -> anyhow::Result<()> {
    let queue_name = unique_queue_name("claims-crash");
    let account = account();
    let connection = format!("{};BlobEndpoint={}", Azurite::shared().connection_string(), Azurite::shared_blob().endpoint());
    let location = tokio::task::spawn_blocking({
        let queue_name = queue_name.clone();
        move || crash_producer_after_its_body("azure", &connection, &queue_name)
    })
    .await?;
    let queue = AzureQueue::new(&account, &queue_name, AzureOptions::default())?;
    assert_eq!(queue.approximate_count().await?, 0, "the message was never put");
    let claims = store(&queue_name);
    let orphans = claims.list_names().await?;
    assert_eq!(orphans.len(), 1, "the body is there, an orphan");
    assert!(location.contains(&orphans[0]), "{location} vs {orphans:?}");
    // Within the retention the sweeper keeps it (its message might still be on its way).
    assert_eq!(claims.sweep(Duration::from_secs(3600)).await?.removed, 0);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(claims.sweep(Duration::from_secs(1)).await?.removed, 1);
    assert!(claims.list_names().await?.is_empty(), "the orphan is still there");
    Ok(())
}

#[tokio::test]
async fn a_producer_killed_between_body_put_and_message_put_leaves_an_orphan_the_sweeper_removes_on_the_embedded_store() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let place = dir.path().to_str().unwrap().to_string();
    tokio::task::spawn_blocking(move || crash_producer_after_its_body("embedded", &place, "work")).await?;
    // The killed process held the store; it is ours now, and the body was durable.
    let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default())?;
    let queue = store.queue("work");
    assert_eq!(queue.approximate_count().await?, 0, "the message was never put");
    let claims = EmbeddedClaims::new(store.queue("work"), DEFAULT_MAX_CLAIM_CHECK_BYTES);
    assert_eq!(claims.count()?, 1, "the body survived the crash, an orphan");
    assert_eq!(claims.sweep(Duration::from_secs(3600)).await?.removed, 0);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(claims.sweep(Duration::from_millis(10)).await?.removed, 1);
    assert_eq!(claims.count()?, 0);
    Ok(())
}

/// The wall clock two hours ago: bodies put through it are two hours old.
struct TwoHoursAgo;

impl ebb::queue::Clock for TwoHoursAgo {
    fn now_ms(&self) -> u64 {
        ebb::queue::SystemClock.now_ms() - 2 * 3600 * 1000
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_host_sweeps_its_queues_old_claim_bodies_from_start_up() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let text = "[api]\nlisten = \"127.0.0.1:0\"\n[queues.orders]\nhandler = { url = \"http://127.0.0.1:9/work\" }\nclaim_check_retention = \"1h\"\n";
    let config = ebb::Config::parse(text, dir.path(), None)?;
    let old = {
        let store = EmbeddedStore::open(&config.data_dir, EmbeddedOptions { clock: std::sync::Arc::new(TwoHoursAgo), ..EmbeddedOptions::default() })?;
        store.queue("orders").create_if_missing().await?;
        EmbeddedClaims::new(store.queue("orders"), DEFAULT_MAX_CLAIM_CHECK_BYTES).put(Bytes::from_static(b"an orphan of two hours")).await?
    };
    let young = {
        let store = EmbeddedStore::open(&config.data_dir, EmbeddedOptions::default())?;
        EmbeddedClaims::new(store.queue("orders"), DEFAULT_MAX_CLAIM_CHECK_BYTES).put(Bytes::from_static(b"a body whose message is on its way")).await?
    };
    let host = ebb::Host::start(&config, ebb::Role::Worker).await?;
    // The first sweep runs as the host starts (one commit); the store is the host's until
    // it stops, so give the sweep a moment rather than looking.
    tokio::time::sleep(Duration::from_secs(1)).await;
    host.shutdown().await;
    let store = EmbeddedStore::open(&config.data_dir, EmbeddedOptions::default())?;
    let claims = EmbeddedClaims::new(store.queue("orders"), DEFAULT_MAX_CLAIM_CHECK_BYTES);
    assert!(matches!(claims.get(&old, 1 << 20).await, Err(ClaimError::Missing { .. })), "the old body is still there");
    claims.get(&young, 1 << 20).await?;
    assert_eq!(claims.count()?, 1);
    Ok(())
}
