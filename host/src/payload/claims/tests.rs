use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::payload::{AzureContainer, Codec, Decoded, Item, Limits, Packer, decode};
use crate::queue::QueueClient;
use crate::queue::TokioClock;
use crate::queue::embedded::{EmbeddedOptions, EmbeddedStore};

fn allowed() -> AllowedReferences {
    AllowedReferences {
        azure: Some(AzureContainer { account: "devstoreaccount1".into(), container: "orders-bodies".into() }),
        embedded_queue: Some("orders".into()),
        s3_bucket: None,
    }
}

fn azure_ref(account: &str, container: &str, blob: &str, size: u64) -> ClaimCheck {
    ClaimCheck { location: BlobRef::Azure { account: account.into(), container: container.into(), blob: blob.into() }, size, sha256: [0; 32] }
}

#[test]
fn hostile_references_are_refused_with_their_reason() {
    struct Case {
        name: &'static str,
        check: ClaimCheck,
        refusal: Option<&'static str>,
    }
    let embedded = |queue: &str| ClaimCheck { location: BlobRef::Embedded { queue: queue.into(), key: 7 }, size: 10, sha256: [0; 32] };
    let cases = [
        Case { name: "our container", check: azure_ref("devstoreaccount1", "orders-bodies", "0123abcd", 10), refusal: None },
        Case { name: "a path of plain segments", check: azure_ref("devstoreaccount1", "orders-bodies", "2026/11/a.bin", 10), refusal: None },
        Case { name: "our embedded queue", check: embedded("orders"), refusal: None },
        Case { name: "another account", check: azure_ref("victim", "orders-bodies", "a", 10), refusal: Some("is not allowed here") },
        Case { name: "another container", check: azure_ref("devstoreaccount1", "payroll-bodies", "a", 10), refusal: Some("is not allowed here") },
        Case { name: "another queue's store", check: embedded("payroll"), refusal: Some("is not allowed here") },
        Case {
            name: "dot-dot out of the container",
            check: azure_ref("devstoreaccount1", "orders-bodies", "../payroll-bodies/x", 10),
            refusal: Some("'..' segment"),
        },
        Case { name: "a lone dot", check: azure_ref("devstoreaccount1", "orders-bodies", "a/./b", 10), refusal: Some("'..' segment") },
        Case { name: "a leading slash", check: azure_ref("devstoreaccount1", "orders-bodies", "/a", 10), refusal: Some("empty") },
        Case { name: "a query", check: azure_ref("devstoreaccount1", "orders-bodies", "a?comp=list", 10), refusal: Some("character '?'") },
        Case { name: "an escape", check: azure_ref("devstoreaccount1", "orders-bodies", "a%2e%2e", 10), refusal: Some("character '%'") },
        Case { name: "a control character", check: azure_ref("devstoreaccount1", "orders-bodies", "a\nb", 10), refusal: Some("control characters") },
        Case { name: "a malformed container", check: azure_ref("devstoreaccount1", "Orders", "a", 10), refusal: Some("is not 3 to 63") },
        Case { name: "over the limit", check: azure_ref("devstoreaccount1", "orders-bodies", "a", 1001), refusal: Some("over the limit of 1000") },
        Case { name: "no bytes", check: azure_ref("devstoreaccount1", "orders-bodies", "a", 0), refusal: Some("a claim of 0 bytes") },
    ];
    for case in cases {
        let result = check_reference(&case.check, &allowed(), 1000);
        match (case.refusal, result) {
            (None, Ok(())) => {}
            (None, Err(error)) => panic!("{}: refused: {error}", case.name),
            (Some(expected), Ok(())) => panic!("{}: taken, expected a refusal with {expected:?}", case.name),
            (Some(expected), Err(error)) => {
                assert!(error.to_string().contains(expected), "{}: {error}", case.name);
                assert!(!error.is_retryable(), "{}: a refusal is a poison reason", case.name);
            }
        }
    }
}

#[test]
fn foreign_and_refused_are_told_apart() {
    let foreign = check_reference(&azure_ref("victim", "orders-bodies", "a", 1), &allowed(), 10).unwrap_err();
    assert!(matches!(foreign, ClaimError::Foreign { .. }), "{foreign:?}");
    let refused = check_reference(&azure_ref("devstoreaccount1", "orders-bodies", "..", 1), &allowed(), 10).unwrap_err();
    assert!(matches!(refused, ClaimError::Refused(_)), "{refused:?}");
}

#[test]
fn containers_are_named_after_their_queue_and_always_valid() {
    assert_eq!(container_for_queue("orders").unwrap(), "orders-bodies");
    let long_a = format!("{}-a", "x".repeat(61));
    let long_b = format!("{}-b", "x".repeat(61));
    let (a, b) = (container_for_queue(&long_a).unwrap(), container_for_queue(&long_b).unwrap());
    assert_ne!(a, b, "two long names sharing a start get different containers");
    for name in [&a, &b] {
        let as_ref = BlobRef::Azure { account: "acct".into(), container: name.clone(), blob: "x".into() };
        assert_eq!(as_ref.defect(), None, "{name}");
        assert!(name.len() <= 63 && name.ends_with("-bodies"), "{name}");
    }
    // A cut that lands on a dash must not leave two dashes in a row.
    let dashed = format!("{}-{}", "y".repeat(46), "z".repeat(16));
    let name = container_for_queue(&dashed).unwrap();
    assert!(!name.contains("--"), "{name}");
    for bad in ["", "ab", "Orders", "a--b", "-ab", "a_b"] {
        let error = container_for_queue(bad).unwrap_err().to_string();
        assert!(error.contains("is not an Azure queue name"), "{bad:?}: {error}");
    }
}

async fn embedded_store(dir: &std::path::Path) -> (EmbeddedStore, EmbeddedClaims) {
    let store = EmbeddedStore::open(dir, EmbeddedOptions { clock: Arc::new(TokioClock::new()), ..EmbeddedOptions::default() }).unwrap();
    let queue = store.queue("orders");
    queue.create_if_missing().await.unwrap();
    let claims = EmbeddedClaims::new(store.queue("orders"), 8 << 20);
    (store, claims)
}

fn body(len: usize, seed: u64) -> Bytes {
    let mut rng = fastrand::Rng::with_seed(seed);
    Bytes::from((0..len).map(|_| rng.u8(..)).collect::<Vec<u8>>())
}

#[tokio::test]
async fn an_embedded_body_round_trips_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let original = body(3 << 20, 1);
    let check = {
        let (_store, claims) = embedded_store(dir.path()).await;
        let check = claims.put(original.clone()).await.unwrap();
        assert_eq!(check.size, original.len() as u64);
        assert_eq!(check.sha256, sha256(&original));
        check
    };
    // The store is closed (the writer joined); a new one reads the body from the file.
    let (_store, claims) = embedded_store(dir.path()).await;
    let fetched = claims.get(&check, 8 << 20).await.unwrap();
    assert!(fetched == original, "the body came back changed");
    // The reference travels in an envelope and comes back the same.
    let packed = Packer::new(Codec::None, 4096).unwrap().pack(&[Item::claim_check(check.clone())]).unwrap();
    let limits = Limits { references: claims.allowed(), ..Limits::default() };
    let Decoded::Envelope(envelope) = decode(&packed.envelopes[0].bytes, &limits).unwrap() else { panic!("not an envelope") };
    assert_eq!(envelope.items[0].body, crate::payload::Body::ClaimCheck(check));
}

#[tokio::test]
async fn a_deleted_embedded_body_is_missing_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, claims) = embedded_store(dir.path()).await;
    let check = claims.put(body(100_000, 2)).await.unwrap();
    assert_eq!(claims.count().unwrap(), 1);
    claims.delete(&check).await.unwrap();
    assert_eq!(claims.count().unwrap(), 0);
    let error = claims.get(&check, 8 << 20).await.unwrap_err();
    assert!(matches!(error, ClaimError::Missing { .. }) && !error.is_retryable(), "{error:?}");
    // Deleting what is gone is no error (the listener may delete twice after a crash).
    claims.delete(&check).await.unwrap();
}

#[tokio::test]
async fn embedded_keys_are_never_given_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, claims) = embedded_store(dir.path()).await;
    let first = claims.put(body(10, 3)).await.unwrap();
    claims.delete(&first).await.unwrap();
    let second = claims.put(body(10, 4)).await.unwrap();
    assert_ne!(first.location, second.location);
    assert!(matches!(claims.get(&first, 100).await, Err(ClaimError::Missing { .. })));
}

#[tokio::test]
async fn a_body_that_is_not_the_claimed_one_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, claims) = embedded_store(dir.path()).await;
    let check = claims.put(body(5000, 5)).await.unwrap();
    let wrong_hash = ClaimCheck { sha256: [9; 32], ..check.clone() };
    let error = claims.get(&wrong_hash, 1 << 20).await.unwrap_err();
    assert!(matches!(error, ClaimError::Corrupt { .. }) && error.to_string().contains("SHA-256"), "{error}");
    let wrong_size = ClaimCheck { size: 4999, ..check.clone() };
    let error = claims.get(&wrong_size, 1 << 20).await.unwrap_err();
    assert!(matches!(error, ClaimError::Corrupt { .. }) && error.to_string().contains("5000 bytes"), "{error}");
    let longer = ClaimCheck { size: 5001, ..check };
    let error = claims.get(&longer, 1 << 20).await.unwrap_err();
    assert!(matches!(error, ClaimError::Corrupt { .. }), "{error}");
}

#[tokio::test]
async fn embedded_references_elsewhere_or_too_large_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (store, claims) = embedded_store(dir.path()).await;
    let other = store.queue("payroll");
    other.create_if_missing().await.unwrap();
    let payroll = EmbeddedClaims::new(store.queue("payroll"), 8 << 20);
    let secret = payroll.put(Bytes::from_static(b"salaries")).await.unwrap();
    let error = claims.get(&secret, 1 << 20).await.unwrap_err();
    assert!(matches!(error, ClaimError::Foreign { .. }), "{error:?}");
    // Nor can a reference be forged by naming this queue with the other's key... it finds
    // only this queue's bodies (keys are per queue).
    let forged = ClaimCheck {
        location: BlobRef::Embedded {
            queue: "orders".into(),
            key: match secret.location {
                BlobRef::Embedded { key, .. } => key,
                _ => unreachable!(),
            },
        },
        ..secret.clone()
    };
    assert!(matches!(claims.get(&forged, 1 << 20).await, Err(ClaimError::Missing { .. })));
    let mine = claims.put(body(2000, 6)).await.unwrap();
    let error = claims.get(&mine, 1999).await.unwrap_err();
    assert!(matches!(error, ClaimError::Refused(_)) && error.to_string().contains("over the limit of 1999"), "{error}");
    let error = claims.put(body((8 << 20) + 1, 7)).await.unwrap_err();
    assert!(matches!(error, ClaimError::Refused(_)) && error.to_string().contains("max_claim_check_bytes"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn the_embedded_sweep_removes_only_bodies_older_than_the_retention() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, claims) = embedded_store(dir.path()).await;
    let old = claims.put(body(10_000, 8)).await.unwrap();
    tokio::time::advance(Duration::from_secs(2 * 3600)).await;
    let young = claims.put(body(10_000, 9)).await.unwrap();
    let report = claims.sweep(Duration::from_secs(3600)).await.unwrap();
    assert_eq!(report, SweepReport { removed: 1, transactions: 0 });
    assert!(matches!(claims.get(&old, 1 << 20).await, Err(ClaimError::Missing { .. })));
    claims.get(&young, 1 << 20).await.unwrap();
}

/// Lets a sweep that a tick started finish: its change is committed by the store's writer
/// thread, which runs on real time while the test's clock is paused.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[tokio::test(start_paused = true)]
async fn the_sweeper_task_removes_an_orphan_once_it_outlives_the_retention() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, claims) = embedded_store(dir.path()).await;
    let claims = Arc::new(claims);
    let orphan = claims.put(body(10_000, 10)).await.unwrap();
    let settings = ClaimSettings { retention: Duration::from_secs(3 * 3600), sweep_interval: Duration::from_secs(3600), ..ClaimSettings::default() };
    let stop = CancellationToken::new();
    let task = spawn_sweeper("orders", claims.clone(), &settings, stop.clone());
    // Within the retention the sweeps find nothing to remove.
    for _ in 0..2 {
        tokio::time::advance(Duration::from_secs(3600)).await;
        settle().await;
    }
    claims.get(&orphan, 1 << 20).await.expect("a body younger than the retention is kept");
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(3600)).await;
        settle().await;
    }
    stop.cancel();
    let counts = task.await.unwrap();
    assert_eq!(claims.count().unwrap(), 0, "the orphan is still there after {counts:?}");
    assert!(matches!(claims.get(&orphan, 1 << 20).await, Err(ClaimError::Missing { .. })));
    assert_eq!(counts.removed, 1, "{counts:?}");
    assert_eq!(counts.failures, 0, "{counts:?}");
}

/// Attack pass: embedded keys came from the message sequence (a message's id minus one), so
/// a sender could forge an offloaded message naming another message's body and take it
/// (the victim then poisoned as missing), and a wrong hash in the forgery was answered with
/// the stored body's real SHA-256.
#[tokio::test]
async fn embedded_keys_cannot_be_guessed_from_a_message_id_and_a_wrong_hash_reveals_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, claims) = embedded_store(dir.path()).await;
    let queue = store.queue("orders");
    let mut keys = Vec::new();
    for n in 0..20 {
        let id: u64 = queue.put(b"a message", Duration::ZERO).await.unwrap().as_str().parse().unwrap();
        let check = claims.put(body(100, n)).await.unwrap();
        let BlobRef::Embedded { key, .. } = check.location else { panic!("an embedded body") };
        assert_ne!(key, id + 1, "the key follows the message sequence");
        keys.push(key);
    }
    keys.sort();
    assert!(keys.windows(2).all(|pair| pair[1] - pair[0] > 1), "keys in sequence: {keys:?}");
    let original = body(100, 99);
    let real = sha256(&original);
    let check = claims.put(original).await.unwrap();
    let forged = ClaimCheck { sha256: [0; 32], ..check };
    let error = claims.get(&forged, 8 << 20).await.unwrap_err().to_string();
    assert!(error.contains("is corrupt") && !error.contains(&hex::encode(real)), "{error}");
}
