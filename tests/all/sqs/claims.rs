//! Issue 37, item 6: claim checks in S3 on an SQS queue, in the format of Amazon's SQS
//! Extended Client Library, against moto (which serves SQS and S3 on one endpoint). The
//! Python Extended Client (PyPI `amazon-sqs-extended-client`, pinned in
//! tests/moto/requirements.txt) is the other party: what it offloads reaches ebb's handler
//! byte-identical, and what ebb offloads it reads byte-identical. A pointer to a missing
//! object, or into a bucket ebb is not configured for, is poisoned with the reason; the
//! sweep removes ebb's old objects and nothing else.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use bytes::Bytes;
use ebb::handler::{Handler, IncomingMessage};
use ebb::payload::claims::{ClaimStore, S3Claims};
use ebb::queue::sqs::{SqsOptions, SqsQueue};
use ebb::queue::{GroupedSend, QueueClient};
use ebb::{Config, Host, Role};
use ebb_tests::azurite::unique_queue_name;
use ebb_tests::moto::{MOTO_PYTHON, Moto, REGION};

/// The environment variables the config names for moto's keys (moto takes any).
const KEY_ID_ENV: &str = "EBB_TEST_SQS_CLAIMS_KEY_ID";
const SECRET_ENV: &str = "EBB_TEST_SQS_CLAIMS_SECRET";

fn set_keys() {
    static KEYS: Once = Once::new();
    // SAFETY: set once, before any host of this module reads them, to values that never change.
    KEYS.call_once(|| unsafe {
        std::env::set_var(KEY_ID_ENV, "testing");
        std::env::set_var(SECRET_ENV, "testing");
    });
}

/// A host config on moto with SQS queue `queue`, claim checks in `bucket` (`extra`: more
/// lines for the queue's table).
fn config(dir: &Path, queue: &str, bucket: &str, extra: &str) -> Result<Config> {
    set_keys();
    let text = format!(
        "data_dir = {data:?}\ndrain_timeout = \"2s\"\n[api]\nlisten = \"127.0.0.1:0\"\n[scaler]\nlisten = \"127.0.0.1:0\"\n\
         [aws]\nregion = \"{REGION}\"\nendpoint = \"{endpoint}\"\naccess_key_id_env = \"{KEY_ID_ENV}\"\nsecret_access_key_env = \"{SECRET_ENV}\"\nclaim_bucket = \"{bucket}\"\n\
         [queues.{queue}]\nbackend = \"sqs\"\nmin_polling_interval = \"100ms\"\nmax_polling_interval = \"500ms\"\nvisibility_timeout = \"2s\"\nmax_retry_delay = \"1s\"\n{extra}",
        data = dir.join("data"),
        endpoint = Moto::shared().endpoint(),
    );
    Config::parse(&text, dir, None)
}

/// Runs `script` under moto's Python with boto3 and `extended(bucket)`, an SQS client that
/// is the Extended Client offloading into `bucket`, moto's endpoint and keys in the environment, `stdin` on its input;
/// returns what it printed.
fn python(script: &str, args: &[&str], stdin: &[u8]) -> Result<Vec<u8>> {
    // The Extended Client patches boto3's sessions when imported: only `extended` imports it.
    // It deletes an object with its message only when told to (Java's client does by default).
    let prelude = "import sys, boto3\nfrom botocore.config import Config\n\
                   def extended(bucket):\n    import sqs_extended_client\n    sqs = boto3.client('sqs')\n    sqs.large_payload_support = bucket\n    sqs.use_legacy_attribute = False\n\
                   \x20   sqs.delete_payload_from_s3 = True\n\
                   \x20   sqs.s3_client = boto3.client('s3', config=Config(s3={'addressing_style': 'path'}))\n    return sqs\n";
    let mut child = Command::new(MOTO_PYTHON)
        .arg("-c")
        .arg(format!("{prelude}{script}"))
        .args(args)
        .envs([
            ("AWS_ENDPOINT_URL", Moto::shared().endpoint().as_str()),
            ("AWS_DEFAULT_REGION", REGION),
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("PYTHONIOENCODING", "utf-8"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("moto's python")?;
    let mut input = child.stdin.take().context("python's stdin")?;
    let stdin = stdin.to_vec();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut input, &stdin));
    let output = child.wait_with_output()?;
    let written = writer.join().expect("the writer ends");
    ensure!(output.status.success(), "python failed: {}\n{script}", String::from_utf8_lossy(&output.stderr));
    written?;
    Ok(output.stdout)
}

/// Creates `bucket` and SQS queue `queue` (the Extended Client needs both beforehand).
fn create_bucket_and_queue(bucket: &str, queue: &str) -> Result<()> {
    python("sqs = extended(sys.argv[1])\nsqs.s3_client.create_bucket(Bucket=sys.argv[1])\nsqs.create_queue(QueueName=sys.argv[2])", &[bucket, queue], b"")?;
    Ok(())
}

/// The keys of every object in `bucket`.
fn objects_in(bucket: &str) -> Result<Vec<String>> {
    let script = "s3 = boto3.client('s3', config=Config(s3={'addressing_style': 'path'}))\n\
                  print('\\n'.join(o['Key'] for o in s3.list_objects_v2(Bucket=sys.argv[1]).get('Contents', [])))";
    Ok(String::from_utf8(python(script, &[bucket], b"")?)?.lines().filter(|l| !l.is_empty()).map(str::to_string).collect())
}

/// A text body of `len` bytes with multi-byte characters (the Extended Client carries text).
fn text_body(len: usize) -> Vec<u8> {
    let mut body = String::with_capacity(len + 8);
    let mut i = 0u64;
    while body.len() < len {
        body.push_str(["é", "日本", "{\"order\": ", "\n", "x"][(i % 5) as usize]);
        body.push_str(&i.to_string());
        i += 1;
    }
    body.into_bytes()
}

/// Records each call's body; fails each body's first try.
#[derive(Default, Clone)]
struct FailsFirst {
    calls: Arc<Mutex<Vec<(Bytes, u32)>>>,
}

#[async_trait::async_trait]
impl Handler for FailsFirst {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        self.calls.lock().unwrap().push((message.body.clone(), message.dequeue_count));
        ensure!(message.dequeue_count > 1, "first try");
        Ok(())
    }
}

async fn wait_until(what: &str, mut done: impl AsyncFnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done().await? {
        ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Messages in SQS queue `queue`: visible, in flight and delayed.
async fn depth(queue: &str) -> Result<u64> {
    Ok(SqsQueue::new(&Moto::shared().account(), queue, SqsOptions::default())?.approximate_count().await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_python_extended_client_offloaded_reaches_the_handler_byte_identical_and_its_object_goes_only_after_the_message() -> Result<()> {
    let (queue, bucket) = (unique_queue_name("s3in"), unique_queue_name("ebb-claims-in"));
    create_bucket_and_queue(&bucket, &queue)?;
    let body = text_body(300_000);
    python(
        "sqs = extended(sys.argv[1])\nurl = sqs.get_queue_url(QueueName=sys.argv[2])['QueueUrl']\nsqs.send_message(QueueUrl=url, MessageBody=sys.stdin.read())",
        &[&bucket, &queue],
        &body,
    )?;
    ensure!(objects_in(&bucket)?.len() == 1, "the Extended Client offloaded the body to the bucket");

    let dir = tempfile::tempdir()?;
    let handler = FailsFirst::default();
    let host = Host::builder(&config(dir.path(), &queue, &bucket, "")?).handler(&queue, handler.clone()).start().await?;
    // The first try fails: the retry fetching the body again shows the object outlived it.
    wait_until("the message handled and deleted", async || {
        let calls = handler.calls.lock().unwrap().len();
        Ok(calls >= 2 && depth(&queue).await? == 0)
    })
    .await?;
    wait_until("the object deleted after its message", async || Ok(objects_in(&bucket)?.is_empty())).await?;
    host.shutdown().await;
    let calls = handler.calls.lock().unwrap().clone();
    ensure!(calls.len() == 2, "failed once, handled once: {} calls", calls.len());
    ensure!(calls.iter().all(|(got, _)| got[..] == body[..]), "the handler got the body byte-identical both times (not the pointer)");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_ebb_offloaded_is_read_byte_identical_by_the_python_extended_client() -> Result<()> {
    let (queue, bucket) = (unique_queue_name("s3out"), unique_queue_name("ebb-claims-out"));
    let dir = tempfile::tempdir()?;
    // A watcher: it sends, and no listener of its own takes the message.
    let host = Host::start(&config(dir.path(), &queue, &bucket, "")?, Role::Watcher).await?;
    let body = text_body(1_500_000);
    host.queue(&queue).context("the queue's handle")?.send(&body, Duration::ZERO, Duration::from_secs(60)).await?;
    host.shutdown().await;
    let keys = objects_in(&bucket)?;
    ensure!(keys.len() == 1 && keys[0].starts_with(&format!("{queue}/")), "ebb created the bucket and put the body under the queue's prefix: {keys:?}");

    let script = "sqs = extended(sys.argv[1])\nurl = sqs.get_queue_url(QueueName=sys.argv[2])['QueueUrl']\n\
                  m = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=10)['Messages'][0]\n\
                  sys.stdout.write(m['Body'])\nsys.stdout.flush()\nsqs.delete_message(QueueUrl=url, ReceiptHandle=m['ReceiptHandle'])";
    let received = python(script, &[&bucket, &queue], b"")?;
    ensure!(received == body, "the Extended Client read {} bytes, byte-identical: {}", received.len(), received == body);
    ensure!(objects_in(&bucket)?.is_empty(), "the Extended Client deleted the object with the message");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebb_sends_the_extended_clients_pointer_with_the_size_attribute() -> Result<()> {
    let (queue, bucket) = (unique_queue_name("s3wire"), unique_queue_name("ebb-claims-wire"));
    let dir = tempfile::tempdir()?;
    let host = Host::start(&config(dir.path(), &queue, &bucket, "")?, Role::Watcher).await?;
    let body = vec![0xC1u8; 1_200_000]; // not UTF-8: ebb's own consumers take any bytes
    host.queue(&queue).context("the queue's handle")?.send(&body, Duration::ZERO, Duration::from_secs(60)).await?;
    host.shutdown().await;
    let script = "import json\nsqs = boto3.client('sqs')\nurl = sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl']\n\
                  m = sqs.receive_message(QueueUrl=url, MessageAttributeNames=['All'], VisibilityTimeout=0)['Messages'][0]\n\
                  print(json.dumps([m['Body'], m['MessageAttributes']['ExtendedPayloadSize']]))";
    // A plain boto3 client: the message as it is on the queue.
    let raw = python(script, &[&queue], b"")?;
    let (pointer, size): (String, serde_json::Value) = serde_json::from_slice(&raw)?;
    let key = objects_in(&bucket)?.pop().context("the object")?;
    ensure!(
        pointer == format!(r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{{"s3BucketName":"{bucket}","s3Key":"{key}"}}]"#),
        "the body is the Extended Client's pointer: {pointer}"
    );
    ensure!(size["DataType"] == "Number" && size["StringValue"] == "1200000", "ExtendedPayloadSize holds the size as a Number: {size}");
    Ok(())
}

/// Sends a pointer as a foreign producer would, to `key` in `bucket` (nothing put there).
fn send_pointer(queue: &str, bucket: &str, key: &str) -> Result<()> {
    let script = "import json\nsqs = boto3.client('sqs')\nurl = sqs.create_queue(QueueName=sys.argv[1])['QueueUrl']\n\
                  body = json.dumps(['software.amazon.payloadoffloading.PayloadS3Pointer', {'s3BucketName': sys.argv[2], 's3Key': sys.argv[3]}])\n\
                  sqs.send_message(QueueUrl=url, MessageBody=body, MessageAttributes={'ExtendedPayloadSize': {'DataType': 'Number', 'StringValue': '300000'}})";
    python(script, &[queue, bucket, key], b"")?;
    Ok(())
}

/// Runs a host on `queue` until its one message is poisoned: the reasons the host gives
/// (on SQS the poison queue holds the message as it came, the pointer, and the reason is in
/// the status, the log and the metrics) and the handler's calls.
async fn poisoned_by_a_host(queue: &str, bucket: &str) -> Result<(Vec<String>, usize)> {
    let dir = tempfile::tempdir()?;
    let handler = FailsFirst::default();
    let host = Host::builder(&config(dir.path(), queue, bucket, "")?).handler(queue, handler.clone()).start().await?;
    wait_until("the pointer poisoned", async || Ok(depth(queue).await? == 0 && depth(&format!("{queue}-poison")).await? == 1)).await?;
    let reasons = host.status().iter().flat_map(|status| status.recent_poison.iter().map(|record| record.reason.clone())).collect();
    host.shutdown().await;
    let calls = handler.calls.lock().unwrap().len();
    Ok((reasons, calls))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pointer_to_a_missing_object_is_poisoned_with_the_reason_missing() -> Result<()> {
    let (queue, bucket) = (unique_queue_name("s3missing"), unique_queue_name("ebb-claims-missing"));
    create_bucket_and_queue(&bucket, &queue)?;
    send_pointer(&queue, &bucket, "gone-0001")?;
    let (poisoned, calls) = poisoned_by_a_host(&queue, &bucket).await?;
    ensure!(calls == 0, "the handler was never called");
    ensure!(poisoned.len() == 1, "one message poisoned: {poisoned:?}");
    ensure!(poisoned[0].contains(&format!("s3 object {bucket}/\"gone-0001\" is missing")), "the reason names the missing object: {}", poisoned[0]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pointer_into_a_bucket_ebb_is_not_configured_for_is_poisoned_naming_both_buckets() -> Result<()> {
    let (queue, bucket, other) = (unique_queue_name("s3foreign"), unique_queue_name("ebb-claims-mine"), unique_queue_name("someone-elses"));
    create_bucket_and_queue(&other, &queue)?;
    python(
        "s3 = boto3.client('s3', config=Config(s3={'addressing_style': 'path'}))\ns3.put_object(Bucket=sys.argv[1], Key='k1', Body=b'secret')",
        &[&other],
        b"",
    )?;
    send_pointer(&queue, &other, "k1")?;
    let (poisoned, calls) = poisoned_by_a_host(&queue, &bucket).await?;
    ensure!(calls == 0, "the handler was never called");
    ensure!(poisoned.len() == 1, "one message poisoned: {poisoned:?}");
    ensure!(
        poisoned[0].contains(&format!("s3 object {other}/\"k1\"")) && poisoned[0].contains(&format!("only objects in s3 bucket {bucket}")),
        "{}",
        poisoned[0]
    );
    ensure!(objects_in(&other)? == ["k1"], "the other bucket's object was neither read into a handler nor deleted");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_removes_ebbs_objects_older_than_the_retention_and_nothing_else() -> Result<()> {
    let (queue, bucket) = (unique_queue_name("s3sweep"), unique_queue_name("ebb-claims-sweep"));
    let claims = S3Claims::new(&Moto::shared().account(), &bucket, &queue, 1 << 20);
    claims.put(Bytes::from_static(b"an orphan")).await?;
    let other = S3Claims::new(&Moto::shared().account(), &bucket, "another-queue", 1 << 20);
    other.put(Bytes::from_static(b"another queue's")).await?;
    python(
        "s3 = boto3.client('s3', config=Config(s3={'addressing_style': 'path'}))\ns3.put_object(Bucket=sys.argv[1], Key='foreign', Body=b'x')",
        &[&bucket],
        b"",
    )?;
    ensure!(claims.sweep(Duration::from_secs(3600)).await?.removed == 0, "nothing is older than an hour");
    // S3 keeps modification times in whole seconds.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let report = claims.sweep(Duration::ZERO).await?;
    ensure!(report.removed == 1 && report.transactions == 2, "one list, one delete: {report:?}");
    let mut left = objects_in(&bucket)?;
    left.sort();
    ensure!(left.len() == 2 && left[0].starts_with("another-queue/") && left[1] == "foreign", "another queue's and the foreign object stay: {left:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_body_too_large_for_a_message_goes_as_the_extended_clients_pointer_keeping_its_group_and_dedup_id() -> Result<()> {
    let (queue, bucket) = (unique_queue_name("s3fifo"), unique_queue_name("ebb-claims-fifo"));
    // An ebb queue's name has no dot: the FIFO queue is named by its URL.
    let fifo = format!("{queue}.fifo");
    let script = "sqs = boto3.client('sqs')\nprint(sqs.create_queue(QueueName=sys.argv[1], Attributes={'FifoQueue': 'true'})['QueueUrl'])";
    let url = String::from_utf8(python(script, &[&fifo], b"")?)?.trim().to_string();
    let dir = tempfile::tempdir()?;
    let host = Host::start(&config(dir.path(), &queue, &bucket, &format!("sqs = {{ queue_url = \"{url}\" }}\n"))?, Role::Watcher).await?;
    let body = text_body(1_200_000);
    let group = GroupedSend { group: "customer-7".into(), dedup_id: Some("order-42".into()) };
    host.queue(&queue).context("the queue's handle")?.send_in(Some(&group), &body, Duration::ZERO, Duration::from_secs(60)).await?;
    host.shutdown().await;

    let script = "sqs = extended(sys.argv[1])\n\
                  m = sqs.receive_message(QueueUrl=sys.argv[2], MaxNumberOfMessages=1, WaitTimeSeconds=10, AttributeNames=['All'])['Messages'][0]\n\
                  print(m['Attributes']['MessageGroupId'], m['Attributes']['MessageDeduplicationId'])\n\
                  sys.stdout.write(m['Body'])\nsys.stdout.flush()\nsqs.delete_message(QueueUrl=sys.argv[2], ReceiptHandle=m['ReceiptHandle'])";
    let received = python(script, &[&bucket, &url], b"")?;
    let split = received.iter().position(|&b| b == b'\n').context("the ids' line")?;
    ensure!(&received[..split] == b"customer-7 order-42", "the group and deduplication ids kept: {}", String::from_utf8_lossy(&received[..split]));
    let got = &received[split + 1..];
    ensure!(got == body, "the Extended Client read {} bytes, byte-identical: {}", got.len(), got == body);
    ensure!(objects_in(&bucket)?.is_empty(), "the Extended Client deleted the object with the message");
    Ok(())
}
