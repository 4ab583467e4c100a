//! The Azure Storage Queues backend against a real Azurite (started by the tests): the
//! conformance suite, and what only Azure has: auth errors, encodings, the limit on
//! encoded size, fail-fast without the SDK's retries.
//!
//! The suite's `pass` sleeps for real (Azurite runs on the wall clock), so the cases that
//! let 20 s or 60 s pass take that long; they run in parallel.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use ebb::queue::azure::{AzureAccount, AzureOptions, AzureQueue, DEVELOPMENT_ACCOUNT, DEVELOPMENT_KEY, Encoding};
use ebb::queue::{QueueClient, QueueError, RetryPolicy, Retrying};
use ebb_tests::azurite::{Azurite, free_port, unique_queue_name};
use ebb_tests::conformance::Backend;

struct Azure {
    account: AzureAccount,
}

#[async_trait]
impl Backend for Azure {
    async fn queue(&self, name: &str) -> Arc<dyn QueueClient> {
        let queue = AzureQueue::new(&self.account, &unique_queue_name(name), AzureOptions::default()).unwrap();
        queue.create_if_missing().await.unwrap();
        Arc::new(queue)
    }

    async fn pass(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }

    fn max_message_bytes(&self) -> usize {
        Encoding::Base64.max_body_bytes()
    }
}

async fn azure() -> Azure {
    Azure { account: Azurite::shared().account() }
}

mod conformance {
    ebb_tests::queue_conformance!(#[tokio::test]; super::azure);
}

async fn queue_with(stem: &str, encoding: Encoding) -> AzureQueue {
    let options = AzureOptions { encoding, ..AzureOptions::default() };
    let queue = AzureQueue::new(&Azurite::shared().account(), &unique_queue_name(stem), options).unwrap();
    queue.create_if_missing().await.unwrap();
    queue
}

/// Another client on the same Azure queue, with another encoding.
fn same_queue(queue: &AzureQueue, encoding: Encoding) -> AzureQueue {
    AzureQueue::new(&Azurite::shared().account(), queue.name(), AzureOptions { encoding, ..AzureOptions::default() }).unwrap()
}

#[tokio::test]
async fn a_receipt_from_before_a_re_lease_is_the_typed_stale_receipt_error() {
    let queue = queue_with("stale", Encoding::Base64).await;
    queue.put(b"m", Duration::ZERO).await.unwrap();
    let first = queue.get(1, Duration::from_secs(1)).await.unwrap().remove(0);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = queue.get(1, Duration::from_secs(30)).await.unwrap().remove(0);
    assert_eq!((second.id.as_str(), second.dequeue_count), (first.id.as_str(), 2));
    for error in [
        queue.delete(&first.id, &first.pop_receipt).await.unwrap_err(),
        queue.update_visibility(&first.id, &first.pop_receipt, Duration::from_secs(5)).await.unwrap_err(),
    ] {
        assert!(matches!(&error, QueueError::StaleReceipt { id } if *id == first.id), "{error:?}");
    }
    queue.delete(&second.id, &second.pop_receipt).await.unwrap();
}

#[tokio::test]
async fn a_wrong_account_key_is_one_fatal_error_naming_the_account_and_authentication_failed() {
    let wrong_key = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmcta2V5LXdyb25nLWtleQ==";
    assert_ne!(wrong_key, DEVELOPMENT_KEY);
    let account = AzureAccount::with_key(DEVELOPMENT_ACCOUNT, wrong_key, Some(&Azurite::shared().endpoint())).unwrap();
    let queue = AzureQueue::new(&account, &unique_queue_name("orders"), AzureOptions::default()).unwrap();
    // Through the retry decorator: a fatal error is not retried.
    let policy = RetryPolicy { max_attempts: 5, base_delay: Duration::from_millis(10), max_delay: Duration::from_millis(50) };
    let retrying = Retrying::new(queue, policy);
    let error = retrying.create_if_missing().await.unwrap_err();
    assert!(matches!(error, QueueError::Fatal(_)), "{error:?}");
    assert_eq!(retrying.retries(), 0, "authentication is not retried");
    let text = format!("{error:#} {error:?}");
    assert!(text.contains(DEVELOPMENT_ACCOUNT) && text.contains("AuthenticationFailed") && text.contains("check the account key"), "{text}");
    assert!(!text.contains(wrong_key) && !text.contains(&wrong_key[..20]), "the key leaked: {text}");
    for error in [retrying.put(b"m", Duration::ZERO).await.unwrap_err(), retrying.get(1, Duration::from_secs(1)).await.unwrap_err()] {
        assert!(format!("{error:#}").contains("AuthenticationFailed (403)"), "{error:#}");
    }
}

#[tokio::test]
async fn binary_bodies_round_trip_as_base64() {
    let queue = queue_with("binary", Encoding::Base64).await;
    let body: Vec<u8> = (0..=255u8).rev().chain(0..=255).collect();
    queue.put(&body, Duration::ZERO).await.unwrap();
    let got = queue.get(1, Duration::from_secs(30)).await.unwrap().remove(0);
    assert_eq!((got.body.to_vec(), got.defect), (body, None));
}

#[tokio::test]
async fn markup_round_trips_as_plain_text_with_no_encoding() {
    let queue = queue_with("plain", Encoding::None).await;
    for text in ["<a & b>", "<?xml version=\"1.0\"?><x a='1'>&amp;</x>", "naïve – ünïcödé ✓"] {
        queue.put(text.as_bytes(), Duration::ZERO).await.unwrap();
        let got = queue.get(1, Duration::from_secs(30)).await.unwrap().remove(0);
        assert_eq!((String::from_utf8(got.body.to_vec()).unwrap().as_str(), got.defect), (text, None));
        queue.delete(&got.id, &got.pop_receipt).await.unwrap();
    }
    let error = queue.put(&[0xff, 0x00, 0xfe], Duration::ZERO).await.unwrap_err();
    assert!(matches!(&error, QueueError::InvalidBody(reason) if reason.contains("not valid UTF-8")), "{error:?}");
}

#[tokio::test]
async fn text_that_is_not_base64_comes_back_with_a_defect_not_dropped() {
    let writer = queue_with("foreign", Encoding::None).await;
    writer.put(b"plain text, not base64!", Duration::ZERO).await.unwrap();
    let reader = same_queue(&writer, Encoding::Base64);
    let got = reader.get(32, Duration::from_secs(30)).await.unwrap();
    assert_eq!(got.len(), 1, "delivered, not dropped");
    let defect = got[0].defect.as_deref().unwrap_or_default();
    assert!(defect.starts_with("undecodable: "), "{defect:?}");
    assert_eq!(got[0].body, &b"plain text, not base64!"[..], "the raw text is kept for the poison queue");
}

#[tokio::test]
async fn leases_map_dequeue_count_insertion_and_next_visible_times() {
    let queue = queue_with("times", Encoding::Base64).await;
    let before = SystemTime::now() - Duration::from_secs(2);
    queue.put(b"m", Duration::ZERO).await.unwrap();
    let got = queue.get(1, Duration::from_millis(20_500)).await.unwrap().remove(0);
    let after = SystemTime::now() + Duration::from_secs(2);
    assert_eq!(got.dequeue_count, 1);
    assert!(got.inserted_at >= before && got.inserted_at <= after, "{:?}", got.inserted_at);
    let lease = got.next_visible_at.duration_since(got.inserted_at).unwrap();
    assert!(lease >= Duration::from_secs(20) && lease <= Duration::from_secs(24), "rounded up to 21 s: {lease:?}");
    assert_eq!(queue.approximate_count().await.unwrap(), 1);
}

#[tokio::test]
async fn with_nothing_listening_a_get_fails_fast_as_transient() {
    let endpoint = format!("http://127.0.0.1:{}/{DEVELOPMENT_ACCOUNT}", free_port());
    let account = AzureAccount::with_key(DEVELOPMENT_ACCOUNT, DEVELOPMENT_KEY, Some(&endpoint)).unwrap();
    let queue = AzureQueue::new(&account, "orders", AzureOptions::default()).unwrap();
    let started = Instant::now();
    let error = queue.get(32, Duration::from_secs(30)).await.unwrap_err();
    let took = started.elapsed();
    assert!(error.is_transient(), "{error:?}");
    assert!(took < Duration::from_secs(5), "the SDK retried: {took:?}");
    let text = format!("{error:#}");
    assert!(text.contains("orders") && text.contains(DEVELOPMENT_ACCOUNT), "{text}");
}

#[tokio::test]
async fn the_64_kib_limit_applies_to_the_encoded_text() {
    for (encoding, limit) in [(Encoding::Base64, 49_152), (Encoding::None, 65_536)] {
        let queue = queue_with("limit", encoding).await;
        assert_eq!(encoding.max_body_bytes(), limit);
        queue.put(&vec![b'x'; limit], Duration::ZERO).await.unwrap_or_else(|e| panic!("{encoding:?}: Azurite refused {limit} bytes: {e:#}"));
        match queue.put(&vec![b'x'; limit + 1], Duration::ZERO).await {
            Err(QueueError::MessageTooLarge { size, limit: l }) => assert_eq!((size, l), (limit + 1, limit)),
            other => panic!("{encoding:?}: expected MessageTooLarge, got {other:?}"),
        }
        let got = queue.get(32, Duration::from_secs(30)).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].body.len(), limit);
    }
}

#[tokio::test]
async fn a_missing_queue_is_a_fatal_error_naming_it() {
    let queue = AzureQueue::new(&Azurite::shared().account(), &unique_queue_name("never-created"), AzureOptions::default()).unwrap();
    let error = queue.get(1, Duration::from_secs(1)).await.unwrap_err();
    let text = format!("{error:#}");
    assert!(matches!(error, QueueError::Fatal(_)) && text.contains("QueueNotFound") && text.contains(queue.name()), "{text}");
    queue.create_if_missing().await.unwrap();
    queue.create_if_missing().await.unwrap();
    assert!(queue.get(1, Duration::from_secs(1)).await.unwrap().is_empty());
}

#[tokio::test]
async fn use_development_storage_reaches_azurite_with_the_well_known_key() {
    let azurite = Azurite::shared();
    let account = AzureAccount::from_connection_string(&format!("UseDevelopmentStorage=true;QueueEndpoint={}", azurite.endpoint())).unwrap();
    let queue = AzureQueue::new(&account, &unique_queue_name("dev"), AzureOptions::default()).unwrap();
    queue.create_if_missing().await.unwrap();
    let id = queue.put(b"hi", Duration::ZERO).await.unwrap();
    let got = queue.get(1, Duration::from_secs(30)).await.unwrap().remove(0);
    assert_eq!(got.id, id);
    let renewed = queue.update_visibility(&got.id, &got.pop_receipt, Duration::from_millis(200)).await.unwrap();
    queue.delete(&got.id, &renewed).await.unwrap();
    assert_eq!(queue.approximate_count().await.unwrap(), 0);
}

/// Second review: a SAS's signature was in transport errors (and so in logs and API
/// answers) whenever the URL's query put `sig` before the rest of the SAS.
#[tokio::test]
async fn a_sas_signature_never_appears_in_an_error() {
    let endpoint = format!("http://127.0.0.1:{}/{DEVELOPMENT_ACCOUNT}", free_port());
    let account = AzureAccount::from_connection_string(&format!("SharedAccessSignature=sv=2020-08-04&sig=SECRETSIG%2Bx;QueueEndpoint={endpoint}")).unwrap();
    let queue = AzureQueue::new(&account, "orders", AzureOptions::default()).unwrap();
    for error in [
        queue.get(32, Duration::from_secs(30)).await.unwrap_err(),
        queue.approximate_count().await.unwrap_err(),
        queue.put(b"x", Duration::ZERO).await.unwrap_err(),
    ] {
        let text = format!("{error:#} {error:?}");
        assert!(!text.contains("SECRETSIG"), "{text}");
    }
}

/// A SAS from a connection string works against Azurite end to end, and a SAS without
/// the `p` (process) permission fails a get with one fatal error that names the permission
/// (what `ebb check` reports).
#[tokio::test]
async fn a_sas_works_and_a_missing_permission_is_named() {
    let azurite = Azurite::shared();
    let name = unique_queue_name("sas");
    AzureQueue::new(&azurite.account(), &name, AzureOptions::default()).unwrap().create_if_missing().await.unwrap();
    let expiry = std::time::SystemTime::now() + Duration::from_secs(3600);
    let with = |permissions: &str| {
        let sas = azurite.account().account_sas(permissions, expiry).unwrap();
        let account = AzureAccount::from_connection_string(&format!("SharedAccessSignature={sas};QueueEndpoint={}", azurite.endpoint())).unwrap();
        AzureQueue::new(&account, &name, AzureOptions::default()).unwrap()
    };
    let full = with("raupc");
    full.put(b"through a sas", Duration::ZERO).await.unwrap();
    assert_eq!(full.approximate_count().await.unwrap(), 1);
    let read_and_add = with("ra");
    read_and_add.put(b"second", Duration::ZERO).await.unwrap();
    let error = read_and_add.get(32, Duration::from_secs(30)).await.unwrap_err();
    let text = format!("{error:#}");
    assert!(matches!(error, QueueError::Fatal(_)), "{text}");
    assert!(text.contains("AuthorizationPermissionMismatch") && text.contains("p (process)"), "{text}");
    let got = full.get(32, Duration::from_secs(30)).await.unwrap();
    assert_eq!(got.len(), 2, "the refused get took nothing");
    for message in got {
        full.delete(&message.id, &message.pop_receipt).await.unwrap();
    }
    let wrong = azurite.account().account_sas("raupc", expiry).unwrap().replace("sig=", "sig=AAAA");
    let account = AzureAccount::from_connection_string(&format!("SharedAccessSignature={wrong};QueueEndpoint={}", azurite.endpoint())).unwrap();
    let error = AzureQueue::new(&account, &name, AzureOptions::default()).unwrap().approximate_count().await.unwrap_err();
    assert!(format!("{error:#}").contains("shared access signature"), "{error:#}");
}

/// Runs `tests/azure-sdk/interop.py` (the official Python SDK): its stdout lines.
fn python_sdk(args: &[&str]) -> Vec<String> {
    use ebb_tests::azure_sdk::{AZURE_SDK_INTEROP, AZURE_SDK_PYTHON};
    let output = std::process::Command::new(AZURE_SDK_PYTHON).arg(AZURE_SDK_INTEROP).args(args).output().unwrap();
    assert!(output.status.success(), "interop.py {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().lines().filter(|l| !l.is_empty()).map(str::to_string).collect()
}

/// Messages the official Python SDK writes (base64, as Azure Functions' output binding
/// writes them, and plain XML text) are read as they were written; what ebb writes the SDK
/// reads back; and a message that failed in ebb reaches `<queue>-poison` as its original
/// body, so a Functions app or an SDK script can requeue it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdk_and_ebb_read_each_others_messages_and_the_poison_queue() {
    use ebb::handler::{Handler, IncomingMessage};
    use ebb::listener::{Listener, QueueSettings};
    let azurite = Azurite::shared();
    let connection = azurite.connection_string();
    let bodies: Vec<Vec<u8>> = vec![(0..=255u8).collect(), br#"{"order": 42, "note": "<b>&amp;</b>"}"#.to_vec(), "héllo ✓".as_bytes().to_vec()];
    let hex_bodies: Vec<String> = bodies.iter().map(hex::encode).collect();

    // SDK → ebb, base64.
    let from_sdk = queue_with("sdk-base64", Encoding::Base64).await;
    let mut args = vec!["put", &connection, from_sdk.name(), "base64"];
    args.extend(hex_bodies.iter().map(String::as_str));
    python_sdk(&args);
    let mut got: Vec<Vec<u8>> = from_sdk.get(32, Duration::from_secs(30)).await.unwrap().into_iter().map(|m| m.body.to_vec()).collect();
    got.sort();
    let mut expected = bodies.clone();
    expected.sort();
    assert_eq!(got, expected);

    // SDK → ebb, plain text (the SDK's default), with markup that must be escaped on the wire.
    let text = queue_with("sdk-text", Encoding::None).await;
    python_sdk(&["put", &connection, text.name(), "none", &hex_bodies[1], &hex_bodies[2]]);
    let mut got: Vec<Vec<u8>> = text.get(32, Duration::from_secs(30)).await.unwrap().into_iter().map(|m| m.body.to_vec()).collect();
    got.sort();
    let mut expected = vec![bodies[1].clone(), bodies[2].clone()];
    expected.sort();
    assert_eq!(got, expected);

    // ebb → SDK, both encodings.
    let to_sdk = queue_with("ebb-base64", Encoding::Base64).await;
    for body in &bodies {
        to_sdk.put(body, Duration::ZERO).await.unwrap();
    }
    let mut read = python_sdk(&["take", &connection, to_sdk.name(), "base64", "3"]);
    read.sort();
    let mut wanted = hex_bodies.clone();
    wanted.sort();
    assert_eq!(read, wanted);

    // A failing message: ebb's listener moves it to <queue>-poison as it was written.
    struct Failing;
    #[async_trait]
    impl Handler for Failing {
        async fn handle(&self, _: &IncomingMessage) -> anyhow::Result<()> {
            anyhow::bail!("this handler always fails")
        }
    }
    let work = queue_with("poisoned", Encoding::Base64).await;
    let poison = AzureQueue::new(&azurite.account(), &format!("{}-poison", work.name()), AzureOptions::default()).unwrap();
    poison.create_if_missing().await.unwrap();
    python_sdk(&["put", &connection, work.name(), "base64", &hex_bodies[1]]);
    let settings = QueueSettings { max_dequeue_count: 1, poison_envelope: false, ..QueueSettings::default() };
    let listener = Listener::builder(Arc::new(work), Arc::new(poison), Arc::new(Failing)).settings(settings).build();
    listener.start();
    let deadline = Instant::now() + Duration::from_secs(30);
    while listener.status().poisoned < 1 {
        assert!(Instant::now() < deadline, "not poisoned: {:?}", listener.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let name = format!("{}-poison", listener.queue_name());
    listener.shutdown(Duration::from_secs(1)).await;
    assert_eq!(python_sdk(&["take", &connection, &name, "base64", "1"]), vec![hex_bodies[1].clone()]);
}

/// Issue 40: a queue deleted under its client (an operator's delete, an account restored
/// empty) is created again by the retry decorator, counted, and the call goes through; where
/// the credential may not create it (a SAS without `c`), the call fails saying so, the
/// readiness names what is missing, and the queue works again once an operator creates it.
#[tokio::test]
async fn a_deleted_queue_is_created_again_or_the_readiness_says_the_credential_may_not() {
    use ebb::health::{Readiness, ReadinessPart};
    use ebb_tests::azure_sdk::delete_queue;
    let azurite = Azurite::shared();
    let name = unique_queue_name("deleted");
    let keyed = Retrying::new(AzureQueue::new(&azurite.account(), &name, AzureOptions::default()).unwrap(), RetryPolicy::default())
        .with_readiness(Readiness::default(), &name);
    keyed.create_if_missing().await.unwrap();
    keyed.put(b"before", Duration::ZERO).await.unwrap();
    delete_queue(&azurite.connection_string(), &name);

    // A stack without readiness (`ebb check`, `ebb send` with no host) creates nothing.
    let checking = Retrying::new(AzureQueue::new(&azurite.account(), &name, AzureOptions::default()).unwrap(), RetryPolicy::default());
    let error = format!("{:#}", checking.approximate_count().await.unwrap_err());
    assert!(error.contains("QueueNotFound"), "{error}");
    assert_eq!(checking.call_record().snapshot().recreated, 0);

    keyed.put(b"after", Duration::ZERO).await.unwrap();
    let got = keyed.get(32, Duration::from_secs(30)).await.unwrap();
    assert_eq!(got.iter().map(|m| m.body.to_vec()).collect::<Vec<_>>(), vec![b"after".to_vec()], "the queue came back empty, with the new message");
    let calls = keyed.call_record().snapshot();
    assert_eq!(calls.recreated, 1);
    assert!(calls.failures.iter().any(|f| f.kind.as_str() == "put" && f.class == ebb::queue::FailureClass::Missing && f.count == 1), "{calls:?}");

    let expiry = SystemTime::now() + Duration::from_secs(3600);
    let sas = azurite.account().account_sas("raup", expiry).unwrap();
    let limited_account = AzureAccount::from_connection_string(&format!("SharedAccessSignature={sas};QueueEndpoint={}", azurite.endpoint())).unwrap();
    let readiness = Readiness::default();
    let limited = Retrying::new(AzureQueue::new(&limited_account, &name, AzureOptions::default()).unwrap(), RetryPolicy::default())
        .with_readiness(readiness.clone(), &name);
    delete_queue(&azurite.connection_string(), &name);
    let error = format!("{:#}", limited.get(32, Duration::from_secs(30)).await.unwrap_err());
    assert!(error.contains("QueueNotFound") && error.contains("creating it again failed") && error.contains("AuthorizationPermissionMismatch"), "{error}");
    let problem = readiness.snapshot()[&name].problems[&ReadinessPart::Storage].clone();
    assert!(problem.contains("does not exist") && problem.contains("permission to create"), "{problem}");
    assert!(readiness.refused_credentials().is_empty(), "not a refused credential: a restart would not create the queue");

    // The operator creates it (or grants `c`): the next call works and the queue is ready.
    keyed.create_if_missing().await.unwrap();
    assert!(limited.get(32, Duration::from_secs(30)).await.unwrap().is_empty());
    assert!(readiness.is_ready());
    assert_eq!(limited.call_record().snapshot().recreated, 0);
}

/// Issue 40 item 7, what `ebb_messages_poisoned_body_only`'s help and docs/config.md say of
/// poison on Azure: every poisoning moves the original body (no envelope, so no reason in
/// storage) and counts as body only; `/status` keeps the last ten reasons, no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_azure_poisoning_moves_the_bare_body_and_status_keeps_the_last_ten_reasons() -> anyhow::Result<()> {
    use ebb::handler::{Handler, IncomingMessage};
    struct Failing;
    #[async_trait]
    impl Handler for Failing {
        async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
            anyhow::bail!("refused {}", String::from_utf8_lossy(&message.body))
        }
    }
    let azurite = Azurite::shared();
    let name = unique_queue_name("bare");
    let dir = tempfile::tempdir()?;
    let text = format!(
        "[api]\nlisten = \"127.0.0.1:0\"\n[azure]\nconnection_string = \"{}\"\n[queues.{name}]\nbackend = \"azure\"\nmax_dequeue_count = 1\nmax_polling_interval = \"1s\"\n",
        azurite.connection_string()
    );
    let config = ebb::Config::parse(&text, dir.path(), None)?;
    let host = ebb::Host::builder(&config).handler(&name, Failing).start().await?;
    let bodies: Vec<String> = (0..12).map(|n| format!("body {n}")).collect();
    for body in &bodies {
        host.queue(&name).expect("configured").send(body.as_bytes(), Duration::ZERO, Duration::from_secs(5)).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let status = host.status().into_iter().find(|s| s.queue == name).expect("listed");
        if status.poisoned >= 12 {
            break status;
        }
        anyhow::ensure!(Instant::now() < deadline, "not all poisoned: {}", status.poisoned);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    host.shutdown().await;
    anyhow::ensure!(status.poisoned_body_only == 12, "body only: {} of {}", status.poisoned_body_only, status.poisoned);
    anyhow::ensure!(status.recent_poison.len() == 10, "recent: {}", status.recent_poison.len());
    let poison = AzureQueue::new(&azurite.account(), &format!("{name}-poison"), AzureOptions::default())?;
    let mut stored: Vec<String> = poison.get(32, Duration::from_secs(30)).await?.into_iter().map(|m| String::from_utf8_lossy(&m.body).into_owned()).collect();
    stored.sort();
    let mut expected = bodies.clone();
    expected.sort();
    anyhow::ensure!(stored == expected, "the poison queue holds {stored:?}");
    Ok(())
}
