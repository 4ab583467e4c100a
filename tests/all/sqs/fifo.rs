//! FIFO queues on SQS (issue 37 item 5) against moto, with boto3 as the other party: a
//! receive carries the group, deduplication id and sequence number; a send needs a group id
//! (and a deduplication id unless the queue deduplicates by content), refused naming the
//! parameter; listeners, one or two on one queue, keep each group's order. moto 5.2.5 holds a
//! group while one of its messages is in flight, as SQS does (checked first, below).
//!
//! moto runs on the wall clock: these tests sleep for real. moto's receive is not atomic
//! (two at once both read the in-flight groups before either marks its own, and may both
//! take one group's messages: seen here, `c:1` to one listener while `c:0` was in flight on
//! the other), so the listeners' receives go one at a time ([`OneReceiveAtATime`]), as SQS's are.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ebb::handler::{Handler, IncomingMessage};
use ebb::listener::{Listener, QueueSettings};
use ebb::queue::sqs::{SqsOptions, SqsQueue};
use ebb::queue::{GroupedSend, Message, MessageId, PopReceipt, QueueClient, QueueError, RetryPolicy, Retrying};
use ebb_tests::azurite::unique_queue_name;
use ebb_tests::fault_proxy::{FaultMix, FaultProxy};
use ebb_tests::moto::{Moto, REGION};

const EBB: &str = env!("CARGO_BIN_EXE_ebb-under-test");

/// Creates FIFO queue `name` with boto3 (`content`: with content-based deduplication).
fn create_fifo(moto: &Moto, name: &str, content: bool) {
    let script = "sqs.create_queue(QueueName=sys.argv[1], Attributes={'FifoQueue': 'true', 'ContentBasedDeduplication': sys.argv[2]})";
    moto.boto3(script, &[name, if content { "true" } else { "false" }]);
}

/// ebb's handle on FIFO queue `name` of the shared moto, created by boto3.
async fn fifo_queue(stem: &str, content: bool) -> anyhow::Result<SqsQueue> {
    let moto = Moto::shared();
    let name = format!("{}.fifo", unique_queue_name(stem));
    create_fifo(moto, &name, content);
    let queue = SqsQueue::new(&moto.account(), &name, SqsOptions::default())?;
    queue.create_if_missing().await?;
    Ok(queue)
}

/// boto3 sends `bodies` (each `group:seq`) in order, each to the group its body names.
fn boto3_sends(moto: &Moto, queue: &str, bodies: &[String]) {
    let script = "url = sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl']\n\
                  for body in sys.argv[2:]: sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=body.split(':')[0])";
    let args: Vec<&str> = std::iter::once(queue).chain(bodies.iter().map(String::as_str)).collect();
    moto.boto3(script, &args);
}

/// `groups` groups of `per_group` messages each, interleaved in send order.
fn interleaved(groups: &[&str], per_group: usize) -> Vec<String> {
    (0..per_group).flat_map(|seq| groups.iter().map(move |group| format!("{group}:{seq}"))).collect()
}

#[test]
fn moto_holds_a_group_while_one_of_its_messages_is_in_flight() {
    let moto = Moto::shared();
    let name = format!("{}.fifo", unique_queue_name("hold"));
    create_fifo(moto, &name, true);
    let script = "url = sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl']\n\
                  for body in ['a:0', 'b:0', 'a:1']: sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=body[0])\n\
                  first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=30)['Messages']\n\
                  rest = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30).get('Messages', [])\n\
                  print(' '.join(m['Body'] for m in first + rest))";
    assert_eq!(moto.boto3(script, &[&name]).trim(), "a:0 b:0", "a:1 is held while a:0 is in flight");
}

#[tokio::test]
async fn a_receive_carries_the_group_deduplication_id_and_sequence_number_boto3_sent() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let queue = fifo_queue("fields", false).await?;
    let script = "url = sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl']\n\
                  print(sqs.send_message(QueueUrl=url, MessageBody='hello', MessageGroupId='customer-7', MessageDeduplicationId='order-42')['SequenceNumber'])";
    let sequence = moto.boto3(script, &[queue.name()]).trim().to_string();
    let got = queue.get(10, Duration::from_secs(30)).await?;
    assert_eq!(got.len(), 1);
    let fifo = got[0].fifo.clone().expect("a FIFO queue's message carries its fields");
    assert_eq!(fifo.group, "customer-7");
    assert_eq!(fifo.deduplication_id.as_deref(), Some("order-42"));
    assert_eq!(fifo.sequence_number.as_deref(), Some(sequence.as_str()));
    Ok(())
}

#[tokio::test]
async fn a_send_without_a_group_or_a_needed_dedup_id_is_refused_naming_the_parameter() -> anyhow::Result<()> {
    let send = |group: &str, dedup: Option<&str>| GroupedSend { group: group.into(), dedup_id: dedup.map(String::from) };
    let plain = fifo_queue("refused", false).await?;
    let refused = plain.put(b"x", Duration::ZERO).await.unwrap_err();
    assert!(matches!(&refused, QueueError::BadSend(reason) if reason.contains("`group`")), "{refused}");
    let refused = plain.put_in_group(b"x", Duration::ZERO, &send("g", None)).await.unwrap_err();
    assert!(matches!(&refused, QueueError::BadSend(reason) if reason.contains("`dedup_id`")), "SQS's refusal, named: {refused}");
    let refused = plain.put_in_group(b"x", Duration::from_secs(5), &send("g", Some("d"))).await.unwrap_err();
    assert!(matches!(&refused, QueueError::BadSend(reason) if reason.contains("delay_ms")), "{refused}");
    plain.put_in_group(b"x", Duration::ZERO, &send("g", Some("d"))).await?;

    let by_content = fifo_queue("content", true).await?;
    by_content.put_in_group(b"x", Duration::ZERO, &send("g", None)).await?;
    by_content.put_in_group(b"x", Duration::ZERO, &send("g", None)).await?;
    assert_eq!(by_content.get(10, Duration::from_secs(30)).await?.len(), 1, "the same body within 5 minutes is one message");

    let standard = SqsQueue::new(&Moto::shared().account(), &unique_queue_name("standard"), SqsOptions::default())?;
    standard.create_if_missing().await?;
    let refused = standard.put_in_group(b"x", Duration::ZERO, &send("g", None)).await.unwrap_err();
    assert!(matches!(&refused, QueueError::BadSend(reason) if reason.contains("not a FIFO queue")), "{refused}");
    Ok(())
}

/// A host's config for ebb queue `queue` on FIFO queue `<queue>.fifo` of `moto` (created
/// here), handled by `handler`, its keys in the environment variables [`FIFO_ENV`] gives:
/// the config's path (in `dir`), and its API's address.
fn fifo_config(moto: &Moto, dir: &std::path::Path, queue: &str, handler: &str) -> anyhow::Result<(std::path::PathBuf, std::net::SocketAddr)> {
    // An ebb queue's name has no dot: a FIFO queue is named by its URL.
    let fifo_name = format!("{queue}.fifo");
    create_fifo(moto, &fifo_name, false);
    let url = moto.boto3("print(sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl'])", &[&fifo_name]).trim().to_string();
    let api = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = format!(
        "drain_timeout = \"5s\"\ndata_dir = \"{}\"\n[api]\nlisten = \"{api}\"\n[aws]\nregion = \"{REGION}\"\nendpoint = \"{}\"\naccess_key_id_env = \"EBB_TEST_SQS_KEY_ID\"\nsecret_access_key_env = \"EBB_TEST_SQS_SECRET\"\n\n\
         [queues.{queue}]\nbackend = \"sqs\"\nhandler = {{ url = \"{handler}\" }}\nsqs = {{ queue_url = \"{url}\" }}\n",
        dir.join("data").display(),
        moto.endpoint()
    );
    let path = dir.join("ebb.toml");
    std::fs::write(&path, config)?;
    Ok((path, api))
}

/// The environment variables [`fifo_config`]'s config reads its keys from.
const FIFO_ENV: [(&str, &str); 2] = [("EBB_TEST_SQS_KEY_ID", "testing"), ("EBB_TEST_SQS_SECRET", "testing")];

/// `ebb send queue ARGS` on the config at `path`.
fn ebb_send(path: &std::path::Path, queue: &str, args: &[&str]) -> std::io::Result<std::process::Output> {
    std::process::Command::new(EBB).args(["send", queue]).args(args).arg("--config").arg(path).envs(FIFO_ENV).output()
}

/// `ebb send --group` with no host running (straight to moto): boto3 receives the group and
/// the deduplication id; without `--group` the send is refused naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebb_send_with_group_reaches_boto3_with_its_group_and_dedup_id() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let queue = unique_queue_name("cli");
    let dir = tempfile::tempdir()?;
    let (path, _) = fifo_config(moto, dir.path(), &queue, "http://127.0.0.1:9/")?;
    let refused = ebb_send(&path, &queue, &["no group"])?;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("--group"), "refused naming --group: {stderr}");
    let sent = ebb_send(&path, &queue, &["hello", "--group", "customer-7", "--dedup-id", "order-42"])?;
    assert!(sent.status.success(), "{}", String::from_utf8_lossy(&sent.stderr));
    let script = "url = sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl']\n\
                  m = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=['All'])['Messages']\n\
                  print(len(m), m[0]['Body'], m[0]['Attributes']['MessageGroupId'], m[0]['Attributes']['MessageDeduplicationId'])";
    assert_eq!(moto.boto3(script, &[&format!("{queue}.fifo")]).trim(), "1 hello customer-7 order-42");
    Ok(())
}

/// Issue 37: a send to a FIFO queue without content-based deduplication and without a
/// deduplication id gets one, made once per send: a send whose answers were lost and that
/// was tried again is one message, and six sends of one body are six. Half the answers are
/// dropped after moto took the request (the fault proxy, seeded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_without_a_dedup_id_gets_one_per_send_so_its_retries_are_one_message_and_equal_bodies_are_not() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let name = format!("{}.fifo", unique_queue_name("gendedup"));
    create_fifo(moto, &name, false);
    let proxy = FaultProxy::start_with_mix(moto.port(), FaultMix { server_busy: 0.0, drop_before: 0.0, drop_after: 0.5 }, 7).await;
    let account = Moto::account_at(&format!("http://127.0.0.1:{}", proxy.port()));
    let policy = RetryPolicy { max_attempts: 30, base_delay: Duration::from_millis(10), max_delay: Duration::from_millis(100) };
    let queue = Retrying::new(SqsQueue::new(&account, &name, SqsOptions::default())?, policy);
    queue.create_if_missing().await?;
    let send = GroupedSend { group: "g".into(), dedup_id: None };
    for _ in 0..6 {
        queue.put_in_group(b"same body", Duration::ZERO, &send).await?;
    }
    let sends = proxy.sqs_requests().iter().filter(|(operation, _)| operation == "SendMessage").count();
    assert!(sends > 6, "some sends reached moto more than once (their answers dropped): {sends} SendMessage requests");
    let direct = SqsQueue::new(&moto.account(), &name, SqsOptions::default())?;
    assert_eq!(direct.approximate_count().await?, 6, "one message per send: its retries deduplicated, equal bodies not");
    Ok(())
}

/// Group and deduplication ids SQS would refuse: empty, 129 characters, and characters
/// outside its set (printable ASCII without the space): a space, a tab, a newline, DEL, `é`.
fn hostile_ids() -> Vec<String> {
    ["", "a b", "tab\there", "line\n", "del\u{7f}", "caf\u{e9}"].iter().map(|s| s.to_string()).chain(["a".repeat(129)]).collect()
}

/// The messages FIFO queue `<queue>.fifo` holds, visible or not.
fn held(moto: &Moto, queue: &str) -> u64 {
    let script = "url = sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl']\n\
                  a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=['All'])['Attributes']\n\
                  print(int(a['ApproximateNumberOfMessages']) + int(a['ApproximateNumberOfMessagesNotVisible']))";
    moto.boto3(script, &[&format!("{queue}.fifo")]).trim().parse().unwrap()
}

/// Issue 37, bad input: a hostile `--group` or `--dedup-id` (with no host: straight to
/// moto), or `?group=` / `?dedup_id=` (the API of a running host), is refused with an error
/// naming the parameter, and nothing is sent; a good send then goes through both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_fifo_group_and_dedup_ids_are_refused_naming_the_parameter_and_nothing_is_sent() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let queue = unique_queue_name("hostile");
    let dir = tempfile::tempdir()?;
    let (app, app_addr) = crate::binary::App::start(Duration::ZERO).await;
    let (path, api) = fifo_config(moto, dir.path(), &queue, &format!("http://{app_addr}/work"))?;

    for hostile in hostile_ids() {
        for (args, named) in [(["--group", &hostile, "--dedup-id", "d"], "group"), (["--group", "g", "--dedup-id", &hostile], "dedup_id")] {
            let output = ebb_send(&path, &queue, &[&["body"][..], &args[..]].concat())?;
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success(), "{args:?} was sent");
            assert!(stderr.contains(&format!("{named}: 1 to 128 of the printable ASCII characters")), "{args:?}: {stderr}");
        }
    }
    assert_eq!(held(moto, &queue), 0, "nothing sent without a host");
    let sent = ebb_send(&path, &queue, &["offline", "--group", "g", "--dedup-id", "a!~\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}"])?;
    assert!(sent.status.success(), "every character of SQS's set is taken: {}", String::from_utf8_lossy(&sent.stderr));

    let log = std::fs::File::create(dir.path().join("host.log"))?;
    let mut host =
        std::process::Command::new(EBB).arg("run").arg("--config").arg(&path).envs(FIFO_ENV).stdout(std::process::Stdio::null()).stderr(log).spawn()?;
    crate::binary::wait_until("the offline send handled", || async { app.seen.lock().unwrap().len() == 1 }).await;
    let http = reqwest::Client::new();
    let url = format!("http://{api}/queues/{queue}/messages");
    for hostile in hostile_ids() {
        for (query, named) in [([("group", hostile.as_str()), ("dedup_id", "d")], "group"), ([("group", "g"), ("dedup_id", hostile.as_str())], "dedup_id")] {
            let answer = http.post(&url).query(&query).body("api").send().await?;
            let status = answer.status();
            let text = answer.text().await?;
            assert_eq!(status, reqwest::StatusCode::BAD_REQUEST, "{query:?}: {text}");
            assert!(text.contains(&format!("{named}: 1 to 128 of the printable ASCII characters")), "{query:?}: {text}");
        }
    }
    let answer = http.post(&url).query(&[("group", "g"), ("dedup_id", "good")]).body("through the API").send().await?;
    assert!(answer.status().is_success(), "{}", answer.text().await?);
    crate::binary::wait_until("the API's send handled", || async { app.seen.lock().unwrap().len() == 2 }).await;
    crate::binary::signal(&host, "-TERM");
    assert!(tokio::task::spawn_blocking(move || host.wait()).await??.success());
    let bodies: Vec<String> = app.seen.lock().unwrap().iter().map(|(_, body)| body.clone()).collect();
    assert_eq!(bodies, ["offline", "through the API"], "only the good sends were sent");
    assert_eq!(held(moto, &queue), 0);
    Ok(())
}

/// One handler call, and which listener made it.
#[derive(Debug, Clone)]
struct Call {
    body: String,
    listener: usize,
    started: Instant,
    ended: Instant,
}

/// Records every call (shared by the listeners); takes longer for a group's earlier
/// messages; fails the first try of `a:0`.
#[derive(Clone)]
struct Recorder {
    listener: usize,
    calls: Arc<Mutex<Vec<Call>>>,
}

#[async_trait]
impl Handler for Recorder {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        let body = String::from_utf8_lossy(&message.body).into_owned();
        let seq: u64 = body.split_once(':').and_then(|(_, seq)| seq.parse().ok()).unwrap_or(0);
        let started = Instant::now();
        tokio::time::sleep(Duration::from_millis(80u64.saturating_sub(8 * seq))).await;
        let mut calls = self.calls.lock().unwrap();
        let first = !calls.iter().any(|call| call.body == body);
        calls.push(Call { body: body.clone(), listener: self.listener, started, ended: Instant::now() });
        if first && body == "a:0" {
            anyhow::bail!("a:0 fails its first try");
        }
        Ok(())
    }
}

/// A queue whose receives, and those of every queue sharing its `turn`, go one at a time:
/// what SQS does and moto does not (see the module's doc).
struct OneReceiveAtATime {
    inner: SqsQueue,
    turn: Arc<tokio::sync::Mutex<()>>,
}

#[async_trait]
impl QueueClient for OneReceiveAtATime {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn create_if_missing(&self) -> Result<(), QueueError> {
        self.inner.create_if_missing().await
    }
    async fn put(&self, body: &[u8], delay: Duration) -> Result<MessageId, QueueError> {
        self.inner.put(body, delay).await
    }
    fn fifo(&self) -> bool {
        self.inner.fifo()
    }
    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
        let _turn = self.turn.lock().await;
        self.inner.get(max, visibility).await
    }
    async fn delete(&self, id: &MessageId, receipt: &PopReceipt) -> Result<(), QueueError> {
        self.inner.delete(id, receipt).await
    }
    async fn delete_batch(&self, entries: &[(MessageId, PopReceipt)]) -> Vec<Result<(), QueueError>> {
        self.inner.delete_batch(entries).await
    }
    fn delete_batch_limit(&self) -> usize {
        self.inner.delete_batch_limit()
    }
    async fn update_visibility(&self, id: &MessageId, receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError> {
        self.inner.update_visibility(id, receipt, visibility).await
    }
    async fn approximate_count(&self) -> Result<u64, QueueError> {
        self.inner.approximate_count().await
    }
}

/// A listener on `name` of the shared moto, its calls recorded in `calls` as listener `index`,
/// its receives taking `turn`s with other listeners'.
async fn listening(name: &str, index: usize, calls: &Arc<Mutex<Vec<Call>>>, turn: &Arc<tokio::sync::Mutex<()>>) -> anyhow::Result<Listener> {
    let moto = Moto::shared();
    let queue = Arc::new(OneReceiveAtATime { inner: SqsQueue::new(&moto.account(), name, SqsOptions::default())?, turn: turn.clone() });
    let poison = Arc::new(SqsQueue::new(&moto.account(), &unique_queue_name("fifo-poison"), SqsOptions::default())?);
    poison.create_if_missing().await?;
    let settings = QueueSettings {
        min_tasks: 2,
        max_tasks: 4,
        batch_size: 4,
        max_concurrent_calls: 8,
        min_polling_interval: Duration::from_millis(50),
        max_polling_interval: Duration::from_millis(200),
        max_retry_delay: Duration::from_secs(1),
        ..Default::default()
    };
    let handler = Arc::new(Recorder { listener: index, calls: calls.clone() });
    Ok(Listener::builder(queue, poison, handler).settings(settings).build())
}

/// Waits until each of `bodies` was handled (`a:0` twice), at most a minute.
async fn until_handled(calls: &Mutex<Vec<Call>>, bodies: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = {
            let calls = calls.lock().unwrap();
            calls.len() > bodies.len() && bodies.iter().all(|body| calls.iter().any(|call| &call.body == body))
        };
        if done {
            return;
        }
        assert!(Instant::now() < deadline, "not all handled: {:?}", calls.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Each group's calls in the order they started: asserts none started before the one
/// before it ended, and returns the bodies.
fn group_orders(calls: &[Call]) -> BTreeMap<String, Vec<String>> {
    let mut calls = calls.to_vec();
    calls.sort_by_key(|call| call.started);
    let mut groups: BTreeMap<String, Vec<Call>> = BTreeMap::new();
    for call in calls {
        groups.entry(call.body.split_once(':').unwrap().0.to_string()).or_default().push(call);
    }
    groups
        .into_iter()
        .map(|(group, calls)| {
            for pair in calls.windows(2) {
                assert!(pair[1].started >= pair[0].ended, "group {group}: {} started before {} ended: {calls:?}", pair[1].body, pair[0].body);
            }
            (group, calls.into_iter().map(|call| call.body).collect())
        })
        .collect()
}

/// The expected order of group `group`'s calls: its `per_group` messages in send order, `a:0`
/// twice (its first try fails, and nothing of its group overtakes its retry).
fn expected(group: &str, per_group: usize) -> Vec<String> {
    let sent = (0..per_group).map(|seq| format!("{group}:{seq}"));
    if group == "a" { std::iter::once("a:0".to_string()).chain(sent).collect() } else { sent.collect() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_keeps_each_groups_order_and_retries_a_failed_message_before_those_behind_it() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let name = format!("{}.fifo", unique_queue_name("order"));
    create_fifo(moto, &name, true);
    let bodies = interleaved(&["a", "b", "c"], 6);
    boto3_sends(moto, &name, &bodies);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let listener = listening(&name, 0, &calls, &Arc::default()).await?;
    listener.start();
    until_handled(&calls, &bodies).await;
    listener.shutdown(Duration::from_secs(5)).await;
    let orders = group_orders(&calls.lock().unwrap());
    for (group, order) in &orders {
        assert_eq!(order, &expected(group, 6), "group {group}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_listeners_on_one_fifo_queue_keep_each_groups_order() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let name = format!("{}.fifo", unique_queue_name("two"));
    create_fifo(moto, &name, true);
    let groups = ["a", "b", "c", "d", "e", "f"];
    let bodies = interleaved(&groups, 8);
    boto3_sends(moto, &name, &bodies);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let turn = Arc::default();
    let (first, second) = (listening(&name, 0, &calls, &turn).await?, listening(&name, 1, &calls, &turn).await?);
    first.start();
    second.start();
    until_handled(&calls, &bodies).await;
    tokio::join!(first.shutdown(Duration::from_secs(5)), second.shutdown(Duration::from_secs(5)));
    let calls = calls.lock().unwrap().clone();
    for listener in [0, 1] {
        assert!(calls.iter().any(|call| call.listener == listener), "listener {listener} handled some: {calls:?}");
    }
    let orders = group_orders(&calls);
    assert_eq!(orders.len(), groups.len());
    for (group, order) in &orders {
        assert_eq!(order, &expected(group, 8), "group {group}, across both listeners");
    }
    Ok(())
}
