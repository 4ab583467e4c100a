//! Issue 37 item 4, poison the SQS way, and item 2's renewals, against moto: a queue whose
//! RedrivePolicy names a dead-letter queue leaves poisoning to SQS and `ebb poison` works on
//! that queue; retry delays are visibility changes SQS accepts (up to 12 hours from the first
//! receive); renewals go as `ChangeMessageVisibilityBatch`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::StatusCode;
use ebb::queue::sqs::{SqsOptions, SqsQueue};
use ebb::queue::{Metered, QueueClient, QueueError};
use ebb_tests::azurite::unique_queue_name;
use ebb_tests::moto::{Moto, REGION};

use super::queue::twelve_leased_and_a_refused_receipt;

const EBB: &str = env!("CARGO_BIN_EXE_ebb-under-test");
const TOKEN: &str = "t0ken";

/// Creates queue `argv[2]` (the dead-letter queue) and `argv[1]` with a RedrivePolicy naming
/// it, maxReceiveCount `argv[3]`.
const CREATE_WITH_DLQ: &str = "import json\n\
    dlq = sqs.create_queue(QueueName=sys.argv[2])['QueueUrl']\n\
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=['QueueArn'])['Attributes']['QueueArn']\n\
    policy = json.dumps({'deadLetterTargetArn': arn, 'maxReceiveCount': sys.argv[3]})\n\
    sqs.create_queue(QueueName=sys.argv[1], Attributes={'RedrivePolicy': policy})";

/// Messages in queue `queue` (visible, in flight or delayed) as boto3 reads them; `None`
/// when it does not exist.
fn messages_in(moto: &Moto, queue: &str) -> Option<u64> {
    let script = "urls = sqs.list_queues(QueueNamePrefix=sys.argv[1]).get('QueueUrls', [])\n\
                  url = next((u for u in urls if u.endswith('/' + sys.argv[1])), None)\n\
                  if url is None: print('none')\n\
                  else:\n    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=['All'])['Attributes']\n    \
                  print(sum(int(a[k]) for k in ['ApproximateNumberOfMessages', 'ApproximateNumberOfMessagesNotVisible', 'ApproximateNumberOfMessagesDelayed']))";
    moto.boto3(script, &[queue]).trim().parse().ok()
}

/// What `ebb poison` needs first: moto 5.2.5 moves a message to the dead-letter queue at the
/// first receive after `maxReceiveCount` receives, as SQS does.
#[tokio::test]
async fn moto_moves_a_message_to_the_dead_letter_queue_after_max_receive_count_receives() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let (queue, dlq) = (unique_queue_name("redrive"), unique_queue_name("redrive-dlq"));
    moto.boto3(CREATE_WITH_DLQ, &[&queue, &dlq, "2"]);
    let script = "url = sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl']\n\
                  sqs.send_message(QueueUrl=url, MessageBody='fails')\n\
                  print(' '.join(str(len(sqs.receive_message(QueueUrl=url, VisibilityTimeout=0).get('Messages', []))) for _ in range(3)))";
    assert_eq!(moto.boto3(script, &[&queue]).trim(), "1 1 0", "received twice, then moved");
    assert_eq!((messages_in(moto, &queue), messages_in(moto, &dlq)), (Some(0), Some(1)));
    Ok(())
}

/// The app: fails every call while `failing`, and counts the tries of each body.
#[derive(Clone, Default)]
struct App {
    failing: Arc<AtomicBool>,
    tries: Arc<Mutex<BTreeMap<String, u32>>>,
}

impl App {
    async fn start(&self) -> SocketAddr {
        let (failing, tries) = (self.failing.clone(), self.tries.clone());
        let router = axum::Router::new().route(
            "/work",
            axum::routing::post(move |body: Bytes| {
                let (failing, tries) = (failing.clone(), tries.clone());
                async move {
                    *tries.lock().unwrap().entry(String::from_utf8_lossy(&body).into_owned()).or_default() += 1;
                    if failing.load(Ordering::Relaxed) { StatusCode::INTERNAL_SERVER_ERROR } else { StatusCode::OK }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        address
    }
}

async fn wait_until(what: &str, log: impl Fn() -> String, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}; host log:\n{}", log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `ebb run` on moto with the `[queues.<name>]` sections `queues` after `preamble`, moto's keys in named environment variables, waited for until ready.
struct MotoHost {
    dir: tempfile::TempDir,
    child: std::process::Child,
}

const KEYS: [(&str, &str); 2] = [("EBB_TEST_SQS_KEY_ID", "testing"), ("EBB_TEST_SQS_SECRET", "testing")];

impl MotoHost {
    async fn start(moto: &Moto, preamble: &str, queues: &str) -> anyhow::Result<MotoHost> {
        let dir = tempfile::tempdir()?;
        let api = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let config = format!(
            "{preamble}[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n\n{queues}\n\
             [aws]\nregion = \"{REGION}\"\nendpoint = \"{}\"\naccess_key_id_env = \"EBB_TEST_SQS_KEY_ID\"\nsecret_access_key_env = \"EBB_TEST_SQS_SECRET\"\n",
            moto.endpoint()
        );
        std::fs::write(dir.path().join("ebb.toml"), config)?;
        let log = std::fs::File::create(dir.path().join("host.log"))?;
        let child = Command::new(EBB).arg("run").arg("--config").arg(dir.path().join("ebb.toml")).envs(KEYS).stdout(Stdio::null()).stderr(log).spawn()?;
        let host = MotoHost { dir, child };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !matches!(reqwest::get(format!("http://{api}/readyz")).await, Ok(answer) if answer.status().is_success()) {
            assert!(Instant::now() < deadline, "the host did not become ready: {}", host.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(host)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("host.log")).unwrap_or_default()
    }

    /// `ebb <args>` on the host's config; it must succeed.
    fn ebb(&self, args: &[&str]) -> Output {
        let output = Command::new(EBB).args(args).arg("--config").arg(self.dir.path().join("ebb.toml")).envs(KEYS).output().unwrap();
        assert!(output.status.success(), "ebb {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
        output
    }

    /// SIGTERM; the host must exit 0.
    async fn stop(mut self) -> anyhow::Result<()> {
        assert!(Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status()?.success());
        let log = self.log();
        let exit = tokio::task::spawn_blocking(move || self.child.wait()).await??;
        assert!(exit.success(), "graceful shutdown exits 0: {exit:?}\n{log}");
        Ok(())
    }
}

/// `ebb run` on a queue whose RedrivePolicy (maxReceiveCount 2) names a dead-letter queue,
/// with a handler that always fails and `max_dequeue_count = 1`: the message is tried twice
/// and SQS moves it to its dead-letter queue (ebb's `<queue>-poison` is never created); the
/// start log and `/status` say so; `ebb poison list`, `requeue` and `purge` work on the
/// dead-letter queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_with_a_redrive_policy_leaves_poisoning_to_sqs_and_ebb_poison_works_on_its_dead_letter_queue() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let (queue, dlq) = (unique_queue_name("redrive"), unique_queue_name("redrive-dlq"));
    moto.boto3(CREATE_WITH_DLQ, &[&queue, &dlq, "2"]);
    let app = App::default();
    app.failing.store(true, Ordering::Relaxed);
    let app_address = app.start().await;
    let queues = format!(
        "[queues.{queue}]\nbackend = \"sqs\"\nmax_dequeue_count = 1\nmin_polling_interval = \"100ms\"\nmax_polling_interval = \"500ms\"\n\
         visibility_timeout = \"1s\"\nmax_retry_delay = \"1s\"\nhandler = {{ url = \"http://{app_address}/work\" }}\n"
    );
    let host = MotoHost::start(moto, "drain_timeout = \"5s\"\n", &queues).await?;
    let log = || host.log();
    let ebb = |args: &[&str]| host.ebb(args);
    moto.boto3("sqs.send_message(QueueUrl=sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl'], MessageBody='fails')", &[&queue]);

    wait_until("the message in the dead-letter queue", log, || messages_in(moto, &dlq) == Some(1)).await;
    assert_eq!(app.tries.lock().unwrap()["fails"], 2, "tried maxReceiveCount times, not max_dequeue_count");
    assert_eq!(messages_in(moto, &format!("{queue}-poison")), None, "ebb's poison queue is not even created");
    assert!(log().contains(&format!("SQS's dead-letter queue arn:aws:sqs:{REGION}:")) && log().contains("(maxReceiveCount 2) does the poisoning"), "{}", log());
    let status: serde_json::Value = serde_json::from_slice(&ebb(&["status", "--json"]).stdout)?;
    let shown = &status["queues"][0];
    assert_eq!((shown["poisoning"].as_str(), shown["dead_letter_queue"]["max_receive_count"].as_u64()), (Some("sqs"), Some(2)), "{shown}");

    let listed: serde_json::Value = serde_json::from_slice(&ebb(&["poison", "list", &queue, "--json"]).stdout)?;
    assert_eq!(listed["poison_queue"].as_str(), Some(dlq.as_str()), "{listed}");
    let messages = listed["messages"].as_array().unwrap();
    assert_eq!((messages.len(), messages[0]["preview"].as_str()), (1, Some("fails")), "{listed}");
    assert_eq!(messages_in(moto, &dlq), Some(1), "listing consumes nothing");

    app.failing.store(false, Ordering::Relaxed);
    let id = messages[0]["id"].as_str().unwrap();
    let requeued = String::from_utf8(ebb(&["poison", "requeue", &queue, "--id", id]).stdout)?;
    assert!(requeued.contains(&format!("requeued 1 poison message to {queue}")), "{requeued}");
    wait_until("the requeued message handled", log, || app.tries.lock().unwrap()["fails"] == 3 && messages_in(moto, &queue) == Some(0)).await;
    assert_eq!(messages_in(moto, &dlq), Some(0), "moved back, not copied");

    moto.boto3("sqs.send_message(QueueUrl=sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl'], MessageBody='dead')", &[&dlq]);
    let purged = String::from_utf8(ebb(&["poison", "purge", &queue, "--yes"]).stdout)?;
    assert!(purged.contains(&format!("purged 1 poison message of {queue}")), "{purged}");
    assert_eq!(messages_in(moto, &dlq), Some(0));
    host.stop().await
}

/// A created queue of a unique name on the shared moto.
async fn created(stem: &str) -> SqsQueue {
    let queue = SqsQueue::new(&Moto::shared().account(), &unique_queue_name(stem), SqsOptions::default()).unwrap();
    queue.create_if_missing().await.unwrap();
    queue
}

/// Issue 37 item 4: the failure rule's retry delay is a visibility change (`hide_for`), and
/// one of 12 hours or more saturates at what SQS allows the message, 12 hours from its first
/// receive, rather than being refused (the message then came back when its lease ran out).
#[tokio::test]
async fn a_retry_delay_of_12_hours_or_more_hides_the_message_on_sqs() -> anyhow::Result<()> {
    let queue = created("long-delay").await;
    for delay in [Duration::from_secs(12 * 3600), Duration::from_secs(7 * 24 * 3600)] {
        queue.put(b"retried tomorrow", Duration::ZERO).await?;
        let message = queue.get(1, Duration::from_secs(1)).await?.pop().expect("the message");
        let hidden = queue.update_visibility(&message.id, &message.pop_receipt, delay).await;
        assert!(hidden.is_ok(), "a retry delay of {delay:?}: {hidden:?}");
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert!(queue.get(10, Duration::from_secs(1)).await?.is_empty(), "hidden past its 1 s lease by a delay of {delay:?}");
    }
    Ok(())
}

/// Issue 37 item 2: renewals go as `ChangeMessageVisibilityBatch`, one request per 10, and a
/// receipt SQS refuses fails its own entry only, as a stale receipt.
#[tokio::test]
async fn a_batch_update_is_one_request_per_10_and_a_refused_receipt_fails_its_entry_alone() -> anyhow::Result<()> {
    let metered = Metered::new(created("renewed").await);
    let transactions = metered.transactions();
    let (entries, refused) = twelve_leased_and_a_refused_receipt(&metered, Duration::from_secs(2)).await?;
    let before = transactions.snapshot().updates;
    let results = metered.update_visibility_batch(&entries, Duration::from_secs(60)).await;
    assert_eq!(transactions.snapshot().updates - before, 2, "13 entries are two requests");
    for (n, result) in results.iter().enumerate() {
        match n {
            5 => assert!(matches!(result, Err(QueueError::StaleReceipt { id }) if *id == refused), "entry 5: {result:?}"),
            _ => assert_eq!(result.as_ref().ok(), Some(&entries[n].1), "entry {n}: the receipt holds"),
        }
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(metered.get(10, Duration::from_secs(1)).await?.is_empty(), "the 12 leases were renewed past their 2 s");
    Ok(())
}

/// A partitioned queue on SQS: each partition is an SQS queue of its own (`<queue>-0`, …),
/// long-polled, and one whose RedrivePolicy names a dead-letter queue leaves poisoning to SQS,
/// as an unpartitioned queue does (`/status` says so per partition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_partition_of_an_sqs_queue_long_polls_and_follows_its_own_redrive_policy() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let queue = unique_queue_name("parts");
    let dlq = unique_queue_name("parts-dlq");
    moto.boto3(CREATE_WITH_DLQ, &[&format!("{queue}-0"), &dlq, "3"]);
    let queues = format!("[queues.{queue}]\nbackend = \"sqs\"\npartitions = 2\nhandler = {{ url = \"http://127.0.0.1:9/work\" }}\n");
    let host = MotoHost::start(moto, "", &queues).await?;
    let status = host.ebb(&["status", "--json"]);
    let log = host.log();
    host.stop().await?;
    let status: serde_json::Value = serde_json::from_slice(&status.stdout)?;
    let partitions: Vec<(String, u64, String)> = status["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .map(|q| {
            (
                q["queue"].as_str().unwrap_or_default().to_string(),
                q["long_poll_secs"].as_u64().unwrap_or(0),
                q["poisoning"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let expected = vec![(format!("{queue}-0"), 20, "sqs".to_string()), (format!("{queue}-1"), 20, "ebb".to_string())];
    assert_eq!(partitions, expected, "{status}\n{log}");
    assert_eq!(messages_in(moto, &format!("{queue}-1")), Some(0), "the second partition was created");
    Ok(())
}
