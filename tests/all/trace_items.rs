//! Packed items' own trace context (issue 39), through the binary and checked by a real
//! OTLP receiver: items of two producers packed into one envelope are each handled in a
//! `handle_item` span, the child of their own producer's span and linked to the envelope's
//! `handle` span, and reach the app naming that span (a batch call, in one `handle_batch`
//! span linked to each item's producer; without export, the context its items share);
//! `ebb send --items --traceparent` (and `--wait-reply`)
//! carries the context on every item, through a host and straight into storage.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use axum::body::Bytes;
use axum::http::HeaderMap;
use ebb_raw_http::{get, raw};
use ebb_tests::otlp::ReceivedSpan;
use tokio::time::Instant;

use crate::binary::EBB;
use crate::otel::{TOKEN, VARIABLES, spans_until};

/// Two producers' spans (trace id, span id), their own to this file: the receiver is shared.
const PRODUCER_A: (&str, &str) = ("1a2b3c4d5e6f708192a3b4c5d6e7f801", "a1a2a3a4a5a6a7a8");
const PRODUCER_B: (&str, &str) = ("2b3c4d5e6f708192a3b4c5d6e7f80112", "b1b2b3b4b5b6b7b8");
const PRODUCER_C: (&str, &str) = ("3c4d5e6f708192a3b4c5d6e7f8011223", "c1c2c3c4c5c6c7c8");
const PRODUCER_D: (&str, &str) = ("4d5e6f708192a3b4c5d6e7f801122334", "d1d2d3d4d5d6d7d8");
const PRODUCER_E: (&str, &str) = ("5e6f708192a3b4c5d6e7f80112233445", "e1e2e3e4e5e6e7e8");
const PRODUCER_F: (&str, &str) = ("6f708192a3b4c5d6e7f8011223344556", "f1f2f3f4f5f6f7f8");
const PRODUCER_G: (&str, &str) = ("708192a3b4c5d6e7f801122334455667", "0102030405060708");
const PRODUCER_H: (&str, &str) = ("8192a3b4c5d6e7f80112233445566778", "1112131415161718");
const PRODUCER_I: (&str, &str) = ("92a3b4c5d6e7f8011223344556677889", "2122232425262728");
const PRODUCER_J: (&str, &str) = ("a3b4c5d6e7f801122334455667788990", "3132333435363738");

fn traceparent((trace, span): (&str, &str)) -> String {
    format!("00-{trace}-{span}-01")
}

/// What the app was called with: the body and its `traceparent`.
type Calls = Arc<Mutex<Vec<(Bytes, Option<String>)>>>;

/// A handler app answering 200 to every call, but 500 to a body that starts with `fail`.
async fn app(calls: Calls) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let router = axum::Router::new().route(
        "/work",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| async move {
            let traceparent = headers.get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_string);
            let status = if body.starts_with(b"fail") { axum::http::StatusCode::INTERNAL_SERVER_ERROR } else { axum::http::StatusCode::OK };
            calls.lock().unwrap().push((body, traceparent));
            (status, "ok")
        }),
    );
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(addr)
}

/// The `traceparent` the app got with `body`, once it came (within 30 s).
async fn traceparent_of(calls: &Calls, body: &str) -> Result<String> {
    let (_, traceparent) = call_with_any(calls, &[body]).await?;
    traceparent.with_context(|| format!("the call with {body:?} has no traceparent"))
}

/// The call with one of `bodies` (a batch's items packed in either order), once it came
/// (within 30 s).
async fn call_with_any(calls: &Calls, bodies: &[&str]) -> Result<(Bytes, Option<String>)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(call) = calls.lock().unwrap().iter().find(|(b, _)| bodies.iter().any(|body| b == body.as_bytes())) {
            return Ok(call.clone());
        }
        ensure!(Instant::now() < deadline, "no call with any of {bodies:?}: {:?}", calls.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The config of a host of `queue` (with the keys `queue_keys`) handled by `app`, its spans
/// exported to the shared receiver, its items packed for 2 s so that two sends share an
/// envelope.
fn write_config(dir: &Path, queue: &str, queue_keys: &str, app: SocketAddr, api: SocketAddr) -> Result<PathBuf> {
    let endpoint = ebb_tests::otlp::OtlpReceiver::shared().endpoint();
    let telemetry = format!("[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"ebb-under-test\"\n\n");
    write_config_with(dir, &telemetry, queue, queue_keys, app, api)
}

/// [`write_config`] with the top-level `telemetry` table (or none).
fn write_config_with(dir: &Path, telemetry: &str, queue: &str, queue_keys: &str, app: SocketAddr, api: SocketAddr) -> Result<PathBuf> {
    let config = format!(
        "{telemetry}[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n\n\
         [queues.{queue}]\nmin_polling_interval = \"100ms\"\nmax_polling_interval = \"500ms\"\npack_linger = \"2s\"\n{queue_keys}handler = {{ url = \"http://{app}/work\" }}\n"
    );
    let path = dir.join("ebb.toml");
    std::fs::write(&path, config)?;
    Ok(path)
}

/// A host of `queue` (with `queue_keys`, its config in `dir`, its spans exported) handled by an
/// app that records its calls.
async fn host_of(dir: &Path, queue: &str, queue_keys: &str) -> Result<(Host, Calls)> {
    let calls = Calls::default();
    let api: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = write_config(dir, queue, queue_keys, app(calls.clone()).await?, api)?;
    Ok((Host::start(&config, api).await?, calls))
}

/// `ebb run` of `config`, killed when dropped.
struct Host {
    child: Child,
    api: SocketAddr,
    log_path: PathBuf,
}

impl Host {
    async fn start(config: &Path, api: SocketAddr) -> Result<Host> {
        let dir = config.parent().context("the config's folder")?;
        let log_path = dir.join("host.log");
        let mut command = Command::new(EBB);
        command.arg("run").arg("--config").arg(config).current_dir(dir).stdout(Stdio::null()).stderr(std::fs::File::create(&log_path)?);
        for variable in VARIABLES {
            command.env_remove(variable);
        }
        let host = Host { child: command.spawn()?, api, log_path };
        let deadline = Instant::now() + Duration::from_secs(60);
        while raw(api, &get("/readyz", None)).await.map(|a| a.status).ok() != Some(200) {
            ensure!(Instant::now() < deadline, "the host did not become ready: {}", std::fs::read_to_string(&host.log_path).unwrap_or_default());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(host)
    }

    /// POSTs the JSON array `items` to `queue`'s items with `traceparent`; the id of the
    /// message they went in.
    async fn send_items(&self, queue: &str, traceparent: &str, items: &str) -> Result<String> {
        let request = format!(
            "POST /queues/{queue}/items HTTP/1.1\r\nHost: ebb\r\nAuthorization: Bearer {TOKEN}\r\ntraceparent: {traceparent}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{items}",
            items.len()
        );
        let answer = raw(self.api, request.as_bytes()).await?;
        ensure!(answer.status == 201, "the send was refused: {answer:?}");
        let answer: serde_json::Value = serde_json::from_str(&answer.body)?;
        Ok(answer["messages"][0].as_str().context("the send answers its message's id")?.to_string())
    }
}

impl Host {
    /// Sends the items `a` and `b`, each in its producer's trace, side by side: the id of the
    /// one envelope both went in.
    async fn in_one_envelope(&self, queue: &str, a: ((&str, &str), &str), b: ((&str, &str), &str)) -> Result<String> {
        let (parent_a, parent_b) = (traceparent(a.0), traceparent(b.0));
        let (a, b) = tokio::join!(self.send_items(queue, &parent_a, a.1), self.send_items(queue, &parent_b, b.1));
        let envelope = a?;
        ensure!(b? == envelope, "both items were packed in one envelope");
        Ok(envelope)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ebb send` with `args` against `config`; it must succeed.
fn ebb_send(config: &Path, args: &[&str]) -> Result<()> {
    let output = Command::new(EBB).arg("send").args(args).arg("--config").arg(config).env_remove("EBB_API_TOKEN").output()?;
    ensure!(output.status.success(), "ebb send {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}

/// The `handle_item` span whose trace is `producer`'s, once exported with its outcome.
async fn item_span(queue: &str, producer: (&str, &str)) -> Result<(ReceivedSpan, Vec<ReceivedSpan>)> {
    let is_it = |s: &ReceivedSpan| s.name == "handle_item" && s.trace_id == producer.0 && s.attribute("queue").as_deref() == Some(queue);
    let spans = spans_until(queue, |spans| spans.iter().any(is_it)).await?;
    let span = spans.iter().find(|s| is_it(s)).cloned().context("the handle_item span")?;
    Ok((span, spans))
}

/// The item's span is the child of its producer's span, a consumer's, settled by a delete.
fn is_the_producers_child(span: &ReceivedSpan, producer: (&str, &str)) -> Result<()> {
    ensure!(span.parent_span_id == producer.1, "the item's span is its producer's child: {span:?}");
    ensure!(span.kind == "SPAN_KIND_CONSUMER" && span.attribute("outcome").as_deref() == Some("deleted"), "{span:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_of_two_producers_in_one_envelope_are_each_handled_in_a_span_of_their_producers_trace() -> Result<()> {
    let queue = "trace-items-two";
    let dir = tempfile::tempdir()?;
    let (host, calls) = host_of(dir.path(), queue, "").await?;
    let envelope = host.in_one_envelope(queue, (PRODUCER_A, r#"["from a"]"#), (PRODUCER_B, r#"["from b"]"#)).await?;

    for (producer, body) in [(PRODUCER_A, "from a"), (PRODUCER_B, "from b")] {
        let (span, spans) = item_span(queue, producer).await?;
        is_the_producers_child(&span, producer)?;
        ensure!(span.attribute("messaging.message.id").as_deref() == Some(envelope.as_str()), "the item's span names its envelope: {span:?}");
        let handle = spans.iter().find(|s| s.name == "handle" && s.attribute("messaging.message.id").as_deref() == Some(envelope.as_str()));
        let handle = handle.with_context(|| format!("the envelope's handle span: {spans:#?}"))?;
        ensure!(handle.trace_id != producer.0, "the envelope's handling is in a trace of its own: {handle:?}");
        ensure!(span.links.contains(&(handle.trace_id.clone(), handle.span_id.clone())), "the item's span links to the envelope's handling: {span:?}");
        ensure!(handle.links.contains(&(span.trace_id.clone(), span.span_id.clone())), "the envelope's handling links to the item's span: {handle:?}");
        let expected = format!("00-{}-{}-01", producer.0, span.span_id);
        ensure!(traceparent_of(&calls, body).await? == expected, "the app's traceparent names the item's span");
        let send = spans.iter().find(|s| s.name == "send" && s.trace_id == producer.0 && s.attribute("queue").as_deref() == Some(queue));
        let send = send.with_context(|| format!("the items' send span: {spans:#?}"))?;
        ensure!(send.parent_span_id == producer.1 && send.attribute("items").as_deref() == Some("1"), "the send is its producer's child: {send:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebb_send_items_with_a_traceparent_carries_it_on_every_item_through_a_host_and_straight_into_storage() -> Result<()> {
    let queue = "trace-items-cli";
    let calls = Calls::default();
    let dir = tempfile::tempdir()?;
    let api: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = write_config(dir.path(), queue, "", app(calls.clone()).await?, api)?;
    let items = dir.path().join("items.ndjson");
    // No host yet: packed by `ebb send` and put straight into the embedded queue.
    std::fs::write(&items, "\"offline 1\"\n\"offline 2\"\n")?;
    ebb_send(&config, &[queue, "--items", &items.to_string_lossy(), "--traceparent", &traceparent(PRODUCER_C)])?;
    let _host = Host::start(&config, api).await?;
    std::fs::write(&items, "\"online 1\"\n\"online 2\"\n")?;
    ebb_send(&config, &[queue, "--items", &items.to_string_lossy(), "--traceparent", &traceparent(PRODUCER_D)])?;

    for (producer, bodies) in [(PRODUCER_C, ["offline 1", "offline 2"]), (PRODUCER_D, ["online 1", "online 2"])] {
        for body in bodies {
            let traceparent = traceparent_of(&calls, body).await?;
            ensure!(traceparent.split('-').nth(1) == Some(producer.0), "{body:?} reached the app in its producer's trace: {traceparent}");
        }
        let is_it = |s: &ReceivedSpan| s.name == "handle_item" && s.trace_id == producer.0;
        let spans = spans_until(queue, |spans| spans.iter().filter(|s| is_it(s)).count() == 2).await?;
        for span in spans.iter().filter(|s| is_it(s)) {
            is_the_producers_child(span, producer)?;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_two_producers_items_is_one_call_in_the_envelopes_trace_linked_to_both_producers() -> Result<()> {
    let queue = "trace-items-batch";
    let dir = tempfile::tempdir()?;
    let (host, calls) = host_of(dir.path(), queue, "delivery = \"batch\"\n").await?;
    let envelope = host.in_one_envelope(queue, (PRODUCER_E, r#"["batch a"]"#), (PRODUCER_F, r#"["batch b"]"#)).await?;

    let is_it = |s: &ReceivedSpan| s.name == "handle_batch" && s.attribute("messaging.message.id").as_deref() == Some(envelope.as_str());
    let spans = spans_until(queue, |spans| spans.iter().any(is_it)).await?;
    let batch = spans.iter().find(|s| is_it(s)).context("the handle_batch span")?;
    let handle = spans.iter().find(|s| s.name == "handle" && s.attribute("messaging.message.id").as_deref() == Some(envelope.as_str()));
    let handle = handle.with_context(|| format!("the envelope's handle span: {spans:#?}"))?;
    ensure!(batch.parent_span_id == handle.span_id && batch.trace_id == handle.trace_id, "the batch call is the envelope's handling's child: {batch:?}");
    for (trace, span) in [PRODUCER_E, PRODUCER_F] {
        ensure!(batch.links.contains(&(trace.to_string(), span.to_string())), "the batch's span links to each item's producer: {batch:?}");
    }
    let expected = format!("00-{}-{}-01", batch.trace_id, batch.span_id);
    let (_, traceparent) = call_with_any(&calls, &[r#"["batch a","batch b"]"#, r#"["batch b","batch a"]"#]).await?;
    ensure!(traceparent == Some(expected), "the app's traceparent names the batch's span");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_items_span_records_how_it_was_settled_a_failed_item_poisoned_with_its_reason_beside_a_deleted_one() -> Result<()> {
    let queue = "trace-items-settled";
    let dir = tempfile::tempdir()?;
    let (host, _calls) = host_of(dir.path(), queue, "max_dequeue_count = 1\n").await?;
    host.in_one_envelope(queue, (PRODUCER_G, r#"["fail always"]"#), (PRODUCER_H, r#"["handled"]"#)).await?;

    let (failed, _) = item_span(queue, PRODUCER_G).await?;
    ensure!(failed.parent_span_id == PRODUCER_G.1 && failed.attribute("outcome").as_deref() == Some("poisoned"), "{failed:?}");
    ensure!(
        failed.attribute("reason").is_some_and(|reason| reason.contains("500")) && failed.status == "error",
        "the poisoned item's span says why: {failed:?}"
    );
    let (handled, _) = item_span(queue, PRODUCER_H).await?;
    is_the_producers_child(&handled, PRODUCER_H)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_span_export_a_batch_call_carries_the_context_its_items_share_and_none_when_they_differ() -> Result<()> {
    let queue = "trace-items-batch-unexported";
    let calls = Calls::default();
    let dir = tempfile::tempdir()?;
    let api: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = write_config_with(dir.path(), "", queue, "delivery = \"batch\"\n", app(calls.clone()).await?, api)?;
    let host = Host::start(&config, api).await?;
    let (parent_a, parent_b) = (traceparent(PRODUCER_A), traceparent(PRODUCER_B));
    host.send_items(queue, &parent_a, r#"["shared 1", "shared 2"]"#).await?;
    ensure!(traceparent_of(&calls, r#"["shared 1","shared 2"]"#).await? == parent_a, "one producer's batch carries its context");

    let (a, b) = tokio::join!(host.send_items(queue, &parent_a, r#"["mixed a"]"#), host.send_items(queue, &parent_b, r#"["mixed b"]"#));
    ensure!(a? == b?, "both items were packed in one envelope");
    let call = call_with_any(&calls, &[r#"["mixed a","mixed b"]"#, r#"["mixed b","mixed a"]"#]).await?;
    ensure!(call.1.is_none(), "a batch of two producers' items carries neither's context: {call:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebb_send_wait_reply_with_a_traceparent_carries_it_on_a_message_and_on_every_item() -> Result<()> {
    let queue = "trace-items-asks";
    let calls = Calls::default();
    let dir = tempfile::tempdir()?;
    let api: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = write_config(dir.path(), queue, "reply_queue = \"trace-items-answers\"\ntrace_envelope = true\n", app(calls.clone()).await?, api)?;
    let _host = Host::start(&config, api).await?;
    let waiting = ["--wait-reply", "--timeout", "30s", "--traceparent"];
    ebb_send(&config, &[&[queue, "plain ask"][..], &waiting, &[&traceparent(PRODUCER_I)]].concat())?;
    let items = dir.path().join("asks.ndjson");
    std::fs::write(&items, "\"ask 1\"\n\"ask 2\"\n")?;
    ebb_send(&config, &[&[queue, "--items", &items.to_string_lossy()][..], &waiting, &[&traceparent(PRODUCER_J)]].concat())?;

    for (producer, body) in [(PRODUCER_I, "plain ask"), (PRODUCER_J, "ask 1"), (PRODUCER_J, "ask 2")] {
        let traceparent = traceparent_of(&calls, body).await?;
        ensure!(traceparent.split('-').nth(1) == Some(producer.0), "{body:?} reached the app in its producer's trace: {traceparent}");
    }
    Ok(())
}
