//! A message's trace context through the queue (issue 39, item 2), through the binary and
//! checked by a real OTLP receiver: a producer's `traceparent` on the API send, `ebb send
//! --traceparent`, and an SQS message's `AWSTraceHeader` or `traceparent` attribute reach
//! the handling's span as its parent and the app as its `traceparent` header; a plain
//! message on an Azure queue that did not opt in stays byte-identical; a malformed context
//! is counted and its message handled in a new trace. Puts made off a send's task keep it:
//! a poisoned message's through a requeue, an answer's on an SQS reply queue, packed items'.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use ebb::queue::QueueClient as _;
use ebb_raw_http::{get, raw};
use ebb_tests::azurite::{Azurite, unique_queue_name};
use ebb_tests::moto::{Moto, REGION};
use ebb_tests::otlp::{OtlpReceiver, ReceivedSpan};
use tokio::time::Instant;

use crate::binary::EBB;
use crate::otel::{PRODUCER_SPAN, PRODUCER_TRACE, TOKEN, VARIABLES, named, spans_until};

/// The producer's context, as a header's value.
fn producer_traceparent() -> String {
    format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01")
}

/// One handler call as the app saw it.
#[derive(Debug, Clone)]
struct Call {
    body: Bytes,
    traceparent: Option<String>,
    tracestate: Option<String>,
}

/// A handler app answering 200 to every call (500 while told to fail), and what it was
/// called with.
#[derive(Clone, Default)]
struct App {
    calls: Arc<Mutex<Vec<Call>>>,
    failing: Arc<AtomicBool>,
}

impl App {
    async fn start(&self) -> Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (calls, failing) = (self.calls.clone(), self.failing.clone());
        let router = axum::Router::new().route(
            "/work",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| async move {
                let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
                calls.lock().unwrap().push(Call { body, traceparent: header("traceparent"), tracestate: header("tracestate") });
                if failing.load(Ordering::Relaxed) { (StatusCode::INTERNAL_SERVER_ERROR, "failing") } else { (StatusCode::OK, "ok") }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, router).await });
        Ok(addr)
    }

    /// The call with `body`, once it came (within 30 s).
    async fn call_with(&self, body: &str) -> Result<Call> {
        self.call_where(body, |call| call.body == body.as_bytes(), 0).await
    }

    /// The call after the first `skip` that `is_it` (`what` says what it is), once it came
    /// (within 30 s).
    async fn call_where(&self, what: &str, is_it: impl Fn(&Call) -> bool, skip: usize) -> Result<Call> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(call) = self.calls.lock().unwrap().iter().filter(|call| is_it(call)).nth(skip).cloned() {
                return Ok(call);
            }
            ensure!(Instant::now() < deadline, "no call {skip} with {what:?}: {:?}", self.calls.lock().unwrap());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// From now on the app answers 500 (`failing`), or 200.
    fn fail(&self, failing: bool) {
        self.failing.store(failing, Ordering::Relaxed);
    }
}

/// `ebb run` of `config`, its spans exported to the shared receiver.
struct Host {
    child: Child,
    api: SocketAddr,
    log_path: std::path::PathBuf,
    dir: tempfile::TempDir,
}

impl Host {
    /// A host of queue `queue` (its table's keys `queue_keys`), handled by `app`, with the
    /// top-level `tables` (`[azure]`, `[aws]`) and `env`.
    async fn start(queue: &str, queue_keys: &str, app: SocketAddr, tables: &str, env: &[(&str, &str)]) -> Result<Host> {
        let dir = tempfile::tempdir()?;
        let api: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let endpoint = OtlpReceiver::shared().endpoint();
        let config = format!(
            "[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"ebb-under-test\"\n\n[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n\n{tables}\n\
             [queues.{queue}]\nmin_polling_interval = \"100ms\"\nmax_polling_interval = \"500ms\"\n{queue_keys}handler = {{ url = \"http://{app}/work\" }}\n"
        );
        std::fs::write(dir.path().join("ebb.toml"), config)?;
        let log_path = dir.path().join("host.log");
        let mut command = Command::new(EBB);
        command.arg("run").arg("--config").arg(dir.path().join("ebb.toml")).current_dir(dir.path()).stdout(Stdio::null());
        command.stderr(std::fs::File::create(&log_path)?).envs(env.iter().copied());
        for variable in VARIABLES {
            command.env_remove(variable);
        }
        let host = Host { child: command.spawn()?, api, log_path, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        while raw(api, &get("/readyz", None)).await.map(|a| a.status).ok() != Some(200) {
            ensure!(Instant::now() < deadline, "the host did not become ready: {}", host.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(host)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Sends `body` to `queue` with `headers` (whole lines); the message's id.
    async fn send(&self, queue: &str, headers: &str, body: &str) -> Result<String> {
        let sent = self.post(&format!("/queues/{queue}/messages"), headers, body).await?;
        Ok(sent["id"].as_str().context("the send answers the message's id")?.to_string())
    }

    /// POSTs `body` to `path` with `headers` (whole lines); the answer, which must be a 201.
    async fn post(&self, path: &str, headers: &str, body: &str) -> Result<serde_json::Value> {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: ebb\r\nAuthorization: Bearer {TOKEN}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let answer = raw(self.api, request.as_bytes()).await?;
        ensure!((200..300).contains(&answer.status), "the request was refused: {answer:?}");
        Ok(serde_json::from_str(&answer.body)?)
    }

    /// The queue's poison messages, once there are `count` (within 60 s).
    async fn poisoned(&self, queue: &str, count: usize) -> Result<Vec<serde_json::Value>> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let answer = raw(self.api, &get(&format!("/queues/{queue}/poison"), Some(TOKEN))).await?;
            let listed: serde_json::Value = serde_json::from_str(&answer.body).with_context(|| format!("the poison listing: {answer:?}"))?;
            let messages = listed["messages"].as_array().cloned().unwrap_or_default();
            if messages.len() == count {
                return Ok(messages);
            }
            ensure!(Instant::now() < deadline, "{} poison messages, not {count}: {listed}; {}", messages.len(), self.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The value of the series `name` (its first) in `/metrics`.
    async fn metric(&self, name: &str) -> Result<f64> {
        let answer = raw(self.api, &get("/metrics", Some(TOKEN))).await?;
        let line = answer.body.lines().find(|line| line.starts_with(name)).with_context(|| format!("no {name} in /metrics"))?;
        Ok(line.rsplit(' ').next().unwrap_or_default().parse()?)
    }

    /// `ebb send` with `args` against this host's config; its output, which must say it succeeded.
    fn ebb_send(&self, args: &[&str]) -> Result<String> {
        let output = Command::new(EBB).arg("send").args(args).arg("--config").arg(self.dir.path().join("ebb.toml")).output()?;
        ensure!(output.status.success(), "ebb send {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The handle span of message `id` of `queue`, once exported.
async fn handle_span(queue: &str, id: &str) -> Result<(ReceivedSpan, Vec<ReceivedSpan>)> {
    handle_span_where(queue, |s| s.attribute("messaging.message.id").as_deref() == Some(id)).await
}

/// The `traceparent` the app gets names the handle span as its parent, in its trace.
fn names_the_handle_span(call: &Call, handle: &ReceivedSpan) -> Result<()> {
    let expected = format!("00-{}-{}-01", handle.trace_id, handle.span_id);
    ensure!(call.traceparent.as_deref() == Some(expected.as_str()), "the app's traceparent names the handling: {call:?}, {handle:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producers_trace_runs_through_send_get_handle_and_delete_into_the_apps_traceparent() -> Result<()> {
    let queue = "context-through";
    let app = App::default();
    let host = Host::start(queue, "trace_envelope = true\n", app.start().await?, "", &[]).await?;
    let headers = format!("traceparent: {}\r\ntracestate: vendor=1\r\n", producer_traceparent());
    let id = host.send(queue, &headers, "hello").await?;
    let call = app.call_with("hello").await?;

    let (handle, _) = handle_span(queue, &id).await?;
    let spans = spans_until(queue, |spans| spans.iter().any(|s| s.name == "delete" && s.parent_span_id == handle.span_id)).await?;
    // Message ids are per store, and other tests' sends are in the producer's trace too.
    let ours = |s: &&ReceivedSpan| s.attribute("queue").as_deref() == Some(queue) && s.attribute("messaging.message.id").as_deref() == Some(id.as_str());
    let send = named(&spans, "send").into_iter().find(ours).context("the send span")?;
    ensure!(send.trace_id == PRODUCER_TRACE && send.parent_span_id == PRODUCER_SPAN, "the send is the producer's child: {send:?}");
    ensure!(handle.trace_id == PRODUCER_TRACE && handle.parent_span_id == send.span_id, "the handling is the send's child: {handle:?}, {send:?}");
    ensure!(handle.attribute("outcome").as_deref() == Some("deleted"), "{handle:?}");
    let all = OtlpReceiver::shared().spans().await?;
    let got = all.iter().any(|s| s.name == "get" && s.attribute("queue").as_deref() == Some(queue) && s.attribute("messages").as_deref() == Some("1"));
    ensure!(got, "a get span says it returned the message");
    names_the_handle_span(&call, &handle)?;
    ensure!(call.tracestate.as_deref() == Some("vendor=1"), "the producer's tracestate goes on: {call:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebb_send_with_a_traceparent_reaches_the_handler_in_the_producers_trace() -> Result<()> {
    let queue = "context-cli";
    let app = App::default();
    let host = Host::start(queue, "trace_envelope = true\n", app.start().await?, "", &[]).await?;
    let traceparent = producer_traceparent();
    host.ebb_send(&[queue, "from the command line", "--traceparent", &traceparent, "--tracestate", "cli=1"])?;
    let call = app.call_with("from the command line").await?;
    let trace = call.traceparent.as_deref().and_then(|t| t.split('-').nth(1));
    ensure!(trace == Some(PRODUCER_TRACE) && call.tracestate.as_deref() == Some("cli=1"), "the app is in the producer's trace: {call:?}");

    // A malformed one is warned of, never refused nor passed on: the message starts a new trace.
    let output = Command::new(EBB)
        .args(["send", queue, "malformed", "--traceparent", "00-zz-01", "--tracestate", "a=1,a=2"])
        .arg("--config")
        .arg(host.dir.path().join("ebb.toml"))
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(output.status.success() && stderr.contains("--traceparent: \"00-zz-01\" is not a W3C traceparent"), "a malformed one is sent without it: {stderr}");
    let call = app.call_with("malformed").await?;
    let trace = call.traceparent.as_deref().and_then(|t| t.split('-').nth(1));
    ensure!(trace.is_some_and(|trace| trace != PRODUCER_TRACE && !trace.contains("zz")) && call.tracestate.is_none(), "a new trace: {call:?}");

    let output = Command::new(EBB)
        .args(["send", queue, "bad state", "--traceparent", &traceparent, "--tracestate", "a=1,a=2"])
        .arg("--config")
        .arg(host.dir.path().join("ebb.toml"))
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(output.status.success() && stderr.contains("--tracestate: \"a=1,a=2\" is not a W3C tracestate"), "{stderr}");
    let call = app.call_with("bad state").await?;
    ensure!(
        call.traceparent.as_deref().is_some_and(|t| t.contains(PRODUCER_TRACE)) && call.tracestate.is_none(),
        "the parent kept, the state dropped: {call:?}"
    );
    Ok(())
}

/// A host whose queue `queue` is on moto's SQS.
async fn on_moto(moto: &Moto, queue: &str, app: &App) -> Result<Host> {
    on_moto_with(moto, queue, "", "", app).await
}

/// [`on_moto`] with the queue's keys `queue_keys` (beside its backend) and the top-level
/// `tables` (other queues on moto).
async fn on_moto_with(moto: &Moto, queue: &str, queue_keys: &str, tables: &str, app: &App) -> Result<Host> {
    let aws = format!(
        "[aws]\nregion = \"{REGION}\"\nendpoint = \"{}\"\naccess_key_id_env = \"EBB_TEST_SQS_KEY_ID\"\nsecret_access_key_env = \"EBB_TEST_SQS_SECRET\"\n\n{tables}",
        moto.endpoint()
    );
    let env = [("EBB_TEST_SQS_KEY_ID", "testing"), ("EBB_TEST_SQS_SECRET", "testing")];
    Host::start(queue, &format!("backend = \"sqs\"\n{queue_keys}"), app.start().await?, &aws, &env).await
}

/// An API send's context rides the SQS message's attributes, taken from the send's task
/// (`telemetry::sending`): the app is called in the producer's trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_send_onto_sqs_reaches_the_app_in_the_producers_trace() -> Result<()> {
    let queue = unique_queue_name("context-api");
    let app = App::default();
    let host = on_moto(Moto::shared(), &queue, &app).await?;
    let headers = format!("traceparent: {}\r\n", producer_traceparent());
    host.send(&queue, &headers, "through the api").await?;
    let call = app.call_with("through the api").await?;
    let trace = call.traceparent.as_deref().and_then(|t| t.split('-').nth(1));
    ensure!(trace == Some(PRODUCER_TRACE), "the app is in the producer's trace: {call:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_messages_with_an_aws_trace_header_or_a_traceparent_attribute_are_handled_in_that_trace() -> Result<()> {
    let moto = Moto::shared();
    let queue = unique_queue_name("context");
    let app = App::default();
    let host = on_moto(moto, &queue, &app).await?;
    let before = host.metric("ebb_traceparent_rejected_total").await?;
    let send = "url = sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl']\n\
                string = lambda v: {'DataType': 'String', 'StringValue': v}\n\
                sqs.send_message(QueueUrl=url, MessageBody='xray', MessageSystemAttributes={'AWSTraceHeader': string(sys.argv[2])})\n\
                sqs.send_message(QueueUrl=url, MessageBody='w3c', MessageAttributes={'traceparent': string(sys.argv[3]), 'tracestate': string('s=1')})\n\
                sqs.send_message(QueueUrl=url, MessageBody='malformed', MessageAttributes={'traceparent': string('00-xyz-01')})";
    let xray = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
    moto.boto3(send, &[&queue, xray, &producer_traceparent()]);

    for (body, trace, parent) in [("xray", "5759e988bd862e3fe1be46a994272793", "53995c3f42cd8ad8"), ("w3c", PRODUCER_TRACE, PRODUCER_SPAN)] {
        let call = app.call_with(body).await?;
        // Other tests' handlings are in the producer's trace too.
        let ours = |s: &ReceivedSpan| s.name == "handle" && s.trace_id == trace && s.attribute("queue").as_deref() == Some(queue.as_str());
        let spans = spans_until(&queue, |spans| spans.iter().any(ours)).await?;
        let handle = spans.iter().find(|s| ours(s)).context("the handle span")?;
        ensure!(handle.parent_span_id == parent, "{body}: the handling is the producer's child: {handle:?}");
        names_the_handle_span(&call, handle)?;
    }
    let call = app.call_with("malformed").await?;
    let trace = call.traceparent.as_deref().and_then(|t| t.split('-').nth(1)).context("a new trace's traceparent")?;
    ensure!(trace != PRODUCER_TRACE && trace.len() == 32, "a malformed context starts a new trace: {call:?}");
    ensure!(host.metric("ebb_traceparent_rejected_total").await? > before, "the malformed context is counted");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_queue_not_opted_in_keeps_a_traced_plain_message_byte_identical_and_one_opted_in_carries_it() -> Result<()> {
    let azurite = Azurite::shared();
    let (plain, opted) = (unique_queue_name("ctx-plain"), unique_queue_name("ctx-opted"));
    let app = App::default();
    let azure = format!("[azure]\nconnection_string = \"{}\"\n", azurite.connection_string());
    let host = Host::start(&opted, "backend = \"azure\"\ntrace_envelope = true\n", app.start().await?, &azure, &[]).await?;
    // The queue not opted in is no host's (`ebb send` finds none on its API and puts it
    // straight into storage): what it put stays there, to be read raw.
    let offline = tempfile::tempdir()?;
    let nobody = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let plain_config =
        format!("[api]\nlisten = \"{nobody}\"\n\n{azure}\n[queues.{plain}]\nbackend = \"azure\"\nhandler = {{ url = \"http://127.0.0.1:9/work\" }}\n");
    std::fs::write(offline.path().join("ebb.toml"), plain_config)?;
    let body = "{\"order\": 7, \"note\": \"caf\u{e9}\"}";
    let output = Command::new(EBB)
        .args(["send", &plain, body, "--traceparent", &producer_traceparent()])
        .arg("--config")
        .arg(offline.path().join("ebb.toml"))
        .output()?;
    ensure!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let raw_queue = ebb::queue::azure::AzureQueue::new(&azurite.account(), &plain, ebb::queue::azure::AzureOptions::default())?;
    let got = raw_queue.get(1, Duration::from_secs(30)).await?;
    ensure!(got.len() == 1 && got[0].body == body.as_bytes(), "byte-identical to a consumer that knows nothing of contexts: {got:?}");

    host.send(&opted, &format!("traceparent: {}\r\n", producer_traceparent()), body).await?;
    let call = app.call_with(body).await?;
    ensure!(call.traceparent.as_deref().and_then(|t| t.split('-').nth(1)) == Some(PRODUCER_TRACE), "the opted-in queue carries it: {call:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_traceparent_on_a_send_is_counted_and_its_message_handled_in_a_new_trace() -> Result<()> {
    let queue = "context-malformed";
    let app = App::default();
    let host = Host::start(queue, "trace_envelope = true\n", app.start().await?, "", &[]).await?;
    let before = host.metric("ebb_traceparent_rejected_total").await?;
    for (n, bad) in [
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
    ]
    .into_iter()
    .enumerate()
    {
        let id = host.send(queue, &format!("traceparent: {bad}\r\n"), &format!("bad-{n}")).await?;
        let call = app.call_with(&format!("bad-{n}")).await?;
        let (handle, spans) = handle_span(queue, &id).await?;
        let send = named(&spans, "send").into_iter().find(|s| s.span_id == handle.parent_span_id).context("the handling is its send's child")?;
        ensure!(send.parent_span_id.is_empty() && send.trace_id != PRODUCER_TRACE, "{bad}: the send starts a new trace, the context not passed on: {send:?}");
        names_the_handle_span(&call, &handle)?;
    }
    ensure!(host.metric("ebb_traceparent_rejected_total").await? == before + 3.0, "each malformed context is counted once");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_sent_with_a_traceparent_each_reach_the_app_with_the_producers_context() -> Result<()> {
    let queue = "context-items";
    let app = App::default();
    let host = Host::start(queue, "", app.start().await?, "", &[]).await?;
    let headers = format!("traceparent: {}\r\ntracestate: items=1\r\n", producer_traceparent());
    host.post(&format!("/queues/{queue}/items"), &headers, r#"["first item", "second item"]"#).await?;
    host.post(&format!("/queues/{queue}/items"), "", r#"["untraced item"]"#).await?;
    for body in ["first item", "second item"] {
        let call = app.call_with(body).await?;
        // Its parent is the item's own span, in the producer's trace (tests/all/trace_items.rs).
        let trace = call.traceparent.as_deref().and_then(|traceparent| traceparent.split('-').nth(1));
        ensure!(trace == Some(PRODUCER_TRACE) && call.tracestate.as_deref() == Some("items=1"), "{call:?}");
    }
    let call = app.call_with("untraced item").await?;
    // Its span is the envelope's handling's child: not in the producer's trace.
    let trace = call.traceparent.as_deref().and_then(|traceparent| traceparent.split('-').nth(1));
    ensure!(trace.is_some_and(|trace| trace != PRODUCER_TRACE), "an item sent without a context is handled in a trace of this host's: {call:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_offloaded_to_the_claim_store_carries_its_context_in_its_envelope() -> Result<()> {
    let queue = "context-offloaded";
    let app = App::default();
    // Not opted in: only the envelope that references the offloaded body carries the context.
    let host = Host::start(queue, "", app.start().await?, "", &[]).await?;
    let body = "x".repeat(100 << 10);
    let id = host.send(queue, &format!("traceparent: {}\r\n", producer_traceparent()), &body).await?;
    let call = app.call_with(&body).await?;
    let (handle, _) = handle_span(queue, &id).await?;
    ensure!(handle.trace_id == PRODUCER_TRACE, "the handling joins the producer's trace: {handle:?}");
    names_the_handle_span(&call, &handle)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_that_would_put_its_message_over_the_limit_goes_as_its_traceparent_alone_or_not_at_all_counted() -> Result<()> {
    let queue = "context-at-the-limit";
    let app = App::default();
    let host = Host::start(queue, "trace_envelope = true\n", app.start().await?, "", &[]).await?;
    // 32 members of 240 characters: a valid tracestate of 7.8 KB.
    let tracestate = (0..32).map(|i| format!("k{i}={}", "v".repeat(240))).collect::<Vec<_>>().join(",");
    let headers = format!("traceparent: {}\r\ntracestate: {tracestate}\r\n", producer_traceparent());
    let near_the_limit = "n".repeat(65_000);
    host.send(queue, &headers, &near_the_limit).await?;
    let call = app.call_with(&near_the_limit).await?;
    ensure!(call.traceparent.as_deref().is_some_and(|t| t.contains(PRODUCER_TRACE)) && call.tracestate.is_none(), "the parent kept: {:?}", call.traceparent);
    ensure!(host.metric("ebb_trace_context_dropped_total").await? == 1.0, "counted");

    // The body alone is as large as a message may be: it goes without its context.
    let at_the_limit = "a".repeat(65_536);
    host.send(queue, &headers, &at_the_limit).await?;
    let call = app.call_with(&at_the_limit).await?;
    ensure!(call.traceparent.as_deref().is_some_and(|t| !t.contains(PRODUCER_TRACE)), "a new trace: {:?}", call.traceparent);
    ensure!(host.metric("ebb_trace_context_dropped_total").await? == 2.0, "counted");
    Ok(())
}

/// Sends a message in the producer's trace that the app fails until it is poisoned, then
/// requeues it through the API (what the console's button calls): the app's call after the
/// requeue is in the producer's trace.
async fn a_requeue_keeps_the_producers_trace(host: &Host, app: &App, queue: &str) -> Result<()> {
    let body = "fails until poisoned";
    app.fail(true);
    host.send(queue, &format!("traceparent: {}\r\n", producer_traceparent()), body).await?;
    requeued_in_the_producers_trace(host, app, queue, body).await
}

/// Once `body`, sent in the producer's trace to `queue` whose app fails, is poisoned: the
/// app's call after a requeue through the API is in the producer's trace.
async fn requeued_in_the_producers_trace(host: &Host, app: &App, queue: &str, body: &str) -> Result<()> {
    host.poisoned(queue, 1).await?;
    app.fail(false);
    let first = app.call_with(body).await?;
    ensure!(first.traceparent.as_deref().and_then(|t| t.split('-').nth(1)) == Some(PRODUCER_TRACE), "the first call is in the producer's trace: {first:?}");
    let requeued = host.post(&format!("/queues/{queue}/poison/requeue?all=true"), "", "").await?;
    ensure!(requeued["requeued"] == 1, "{requeued}");
    let again = app.call_where(body, |call| call.body == body.as_bytes(), 1).await?;
    let trace = again.traceparent.as_deref().and_then(|t| t.split('-').nth(1));
    ensure!(trace == Some(PRODUCER_TRACE), "the requeued message is handled in the producer's trace: {again:?}");
    let (handle, _) = handle_span_where(queue, |s| s.span_id == again.traceparent.as_deref().and_then(|t| t.split('-').nth(2)).unwrap_or_default()).await?;
    ensure!(handle.trace_id == PRODUCER_TRACE, "its handle span joins the producer's trace: {handle:?}");
    Ok(())
}

/// The handle span of `queue` that `is_it`, once exported.
async fn handle_span_where(queue: &str, is_it: impl Fn(&ReceivedSpan) -> bool) -> Result<(ReceivedSpan, Vec<ReceivedSpan>)> {
    let ours = |s: &ReceivedSpan| s.name == "handle" && s.attribute("queue").as_deref() == Some(queue) && is_it(s);
    let spans = spans_until(queue, |spans| spans.iter().any(ours)).await?;
    let handle = spans.iter().find(|s| ours(s)).cloned().context("the handle span")?;
    Ok((handle, spans))
}

/// The embedded queue's poison envelope keeps the context, as `traceparent` and
/// `tracestate` beside the body; the requeue sends the body with it (`trace_envelope`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_message_requeued_on_the_embedded_queue_is_handled_in_its_producers_trace() -> Result<()> {
    let queue = "context-requeue";
    let app = App::default();
    let host = Host::start(queue, "trace_envelope = true\nmax_dequeue_count = 1\n", app.start().await?, "", &[]).await?;
    a_requeue_keeps_the_producers_trace(&host, &app, queue).await
}

/// ebb's own poison queue on SQS takes the context as the poisoned message's attributes, and
/// the requeue puts it back with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_message_requeued_on_sqs_is_handled_in_its_producers_trace() -> Result<()> {
    let queue = unique_queue_name("context-requeue");
    let app = App::default();
    let host = on_moto_with(Moto::shared(), &queue, "max_dequeue_count = 1\n", "", &app).await?;
    a_requeue_keeps_the_producers_trace(&host, &app, &queue).await
}

/// A handler's answer put on an SQS reply queue carries the context of the handling that
/// made it (its attributes, put from the listener's task): the queue handling the answers
/// (a pipeline) handles it as that handling's child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_on_an_sqs_reply_queue_is_handled_next_as_the_child_of_its_handling() -> Result<()> {
    let (queue, answers) = (unique_queue_name("context-asks"), unique_queue_name("context-answers"));
    let app = App::default();
    // A second server of the same app: the answers' queue is configured before the host starts.
    let answers_app = app.start().await?;
    let tables = format!(
        "[queues.{answers}]\nbackend = \"sqs\"\nmin_polling_interval = \"100ms\"\nmax_polling_interval = \"500ms\"\nhandler = {{ url = \"http://{answers_app}/work\" }}\n\n"
    );
    let host = on_moto_with(Moto::shared(), &queue, &format!("reply_queue = \"{answers}\"\n"), &tables, &app).await?;
    let id = host.send(&queue, &format!("traceparent: {}\r\n", producer_traceparent()), "asks").await?;
    app.call_with("asks").await?;
    let (handle, _) = handle_span(&queue, &id).await?;
    let correlated = format!("\"correlation_id\":\"{id}\"");
    let answer = app.call_where(&correlated, |call| String::from_utf8_lossy(&call.body).contains(&correlated), 0).await?;
    let (next, _) = handle_span_where(&answers, |s| s.trace_id == PRODUCER_TRACE).await?;
    ensure!(next.parent_span_id == handle.span_id, "the answer's handling is the child of the handling that answered: {next:?}, {handle:?}");
    names_the_handle_span(&answer, &next)?;
    Ok(())
}

/// Items of two sends packed into one SQS message by the packing task (on its own task,
/// where no send's context is) each reach the app with their own producer's context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_of_two_sends_packed_into_one_sqs_message_each_keep_their_producers_context() -> Result<()> {
    let queue = unique_queue_name("context-packed");
    let app = App::default();
    let host = on_moto_with(Moto::shared(), &queue, "pack_linger = \"1s\"\n", "", &app).await?;
    let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let path = format!("/queues/{queue}/items");
    let (producers, others) = (format!("traceparent: {}\r\n", producer_traceparent()), format!("traceparent: {other}\r\ntracestate: other=1\r\n"));
    let (first, second, third) = tokio::join!(
        host.post(&path, &producers, r#"["producer's item"]"#),
        host.post(&path, &others, r#"["other's item"]"#),
        host.post(&path, "", r#"["untraced item"]"#),
    );
    let messages: Vec<serde_json::Value> = [first?, second?, third?].iter().map(|sent| sent["messages"].clone()).collect();
    ensure!(messages.iter().all(|m| *m == messages[0]), "the three sends share one message: {messages:?}");
    // Each item is handled in a span of its producer's trace, which the app's traceparent names.
    let trace_of = |call: &Call| call.traceparent.as_deref().and_then(|t| t.split('-').nth(1)).map(str::to_string);
    let call = app.call_with("producer's item").await?;
    ensure!(trace_of(&call).as_deref() == Some(PRODUCER_TRACE) && call.tracestate.is_none(), "{call:?}");
    let call = app.call_with("other's item").await?;
    ensure!(trace_of(&call).as_deref() == Some(&other[3..35]) && call.tracestate.as_deref() == Some("other=1"), "{call:?}");
    let call = app.call_with("untraced item").await?;
    let untraced = trace_of(&call);
    ensure!(untraced.is_some_and(|t| t != PRODUCER_TRACE && t != other[3..35]), "an item sent without a context is in neither producer's trace: {call:?}");
    Ok(())
}

/// SQS moves the message to the dead-letter queue of the queue's RedrivePolicy with its
/// attributes; the requeue puts it back with its context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_requeued_from_an_sqs_dead_letter_queue_is_handled_in_its_producers_trace() -> Result<()> {
    let moto = Moto::shared();
    let (queue, dead_letter) = (unique_queue_name("context-redrive"), unique_queue_name("context-redrive-dlq"));
    let create = "import json\n\
                  dlq = sqs.create_queue(QueueName=sys.argv[2])['QueueUrl']\n\
                  arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=['QueueArn'])['Attributes']['QueueArn']\n\
                  sqs.create_queue(QueueName=sys.argv[1], Attributes={'RedrivePolicy': json.dumps({'deadLetterTargetArn': arn, 'maxReceiveCount': '1'})})";
    moto.boto3(create, &[&queue, &dead_letter]);
    let app = App::default();
    let host = on_moto(moto, &queue, &app).await?;
    a_requeue_keeps_the_producers_trace(&host, &app, &queue).await
}

/// An Azure queue with `trace_envelope` poisons the message as it was sent, the envelope
/// carrying its context (Azure keeps nothing beside a message), and the requeue puts that back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_message_requeued_on_an_azure_queue_with_trace_envelope_is_handled_in_its_producers_trace() -> Result<()> {
    let queue = unique_queue_name("ctx-requeue");
    let app = App::default();
    let azure = format!("[azure]\nconnection_string = \"{}\"\n", Azurite::shared().connection_string());
    let keys = "backend = \"azure\"\ntrace_envelope = true\nmax_dequeue_count = 1\n";
    let host = Host::start(&queue, keys, app.start().await?, &azure, &[]).await?;
    a_requeue_keeps_the_producers_trace(&host, &app, &queue).await
}

/// A message that its SQS poison queue takes only without its context's attributes is
/// poisoned all the same, its context dropped: a context never costs a message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_its_sqs_poison_queue_takes_only_without_its_context_is_poisoned_all_the_same() -> Result<()> {
    let moto = Moto::shared();
    let queue = unique_queue_name("context-tight");
    // SQS's smallest limit: the body fits it, the body with its context's attributes does not.
    moto.boto3("sqs.create_queue(QueueName=sys.argv[1] + '-poison', Attributes={'MaximumMessageSize': '1024'})", &[&queue]);
    let app = App::default();
    app.fail(true);
    let host = on_moto_with(moto, &queue, "max_dequeue_count = 1\n", "", &app).await?;
    let body = "x".repeat(1000);
    host.send(&queue, &format!("traceparent: {}\r\ntracestate: vendor=1\r\n", producer_traceparent()), &body).await?;
    let poisoned = host.poisoned(&queue, 1).await?;
    ensure!(poisoned[0]["body_bytes"] == 1000, "the body is in the poison queue: {poisoned:?}");
    Ok(())
}

/// An item poisoned alone on SQS keeps its own context (the item's, not its envelope
/// message's) in the poison message's attributes, and the requeue puts it back with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_poisoned_on_sqs_and_requeued_is_handled_in_its_producers_trace() -> Result<()> {
    let queue = unique_queue_name("context-item-requeue");
    let app = App::default();
    let host = on_moto_with(Moto::shared(), &queue, "max_dequeue_count = 1\n", "", &app).await?;
    app.fail(true);
    let headers = format!("traceparent: {}\r\n", producer_traceparent());
    host.post(&format!("/queues/{queue}/items"), &headers, r#"["an item failing until poisoned"]"#).await?;
    requeued_in_the_producers_trace(&host, &app, &queue, "an item failing until poisoned").await
}
