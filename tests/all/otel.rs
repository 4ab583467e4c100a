//! Spans over OTLP through the binary (issue 39, items 2's first half, 3 and 4), checked by
//! a receiver that speaks the real protocol (tests/otlp/receiver.py): a send with a
//! producer's `traceparent` is its child, a message's handling ends in a delete (or says
//! why it was poisoned), a collector that refuses or hangs costs spans (counted), never
//! messages or a prompt shutdown, and an endpoint that is not a URL is a config error.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use ebb_raw_http::{Answer, get, raw};
use ebb_tests::guests;
use ebb_tests::otlp::{OtlpReceiver, ReceivedSpan};
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::binary::EBB;

pub(crate) const TOKEN: &str = "t0ken";

/// The producer's span, as its `traceparent` names it.
pub(crate) const PRODUCER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
pub(crate) const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

/// The variables that would choose the log or the export for the host.
pub(crate) const VARIABLES: [&str; 8] = [
    "RUST_LOG",
    "EBB_LOG",
    "EBB_LOG_FORMAT",
    "EBB_API_TOKEN",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_SERVICE_NAME",
];

/// A handler app answering every message with `status` and `body`.
async fn app(status: u16, body: &'static str) -> Result<SocketAddr> {
    let app = TcpListener::bind("127.0.0.1:0").await?;
    let addr = app.local_addr()?;
    let status = axum::http::StatusCode::from_u16(status)?;
    let router = axum::Router::new().route("/work", axum::routing::post(move || async move { (status, body) }));
    tokio::spawn(async move { axum::serve(app, router).await });
    Ok(addr)
}

/// `ebb run` of one queue, `queue`, handled by `app`, its spans exported to `endpoint`.
struct Host {
    child: Child,
    api: SocketAddr,
    log_path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Host {
    async fn start(queue: &str, app: SocketAddr, endpoint: &str, queue_keys: &str) -> Result<Host> {
        Host::start_with_env(queue, app, endpoint, queue_keys, &[]).await
    }

    /// [`Host::start`] with the environment variables `env` (of [`VARIABLES`], which are
    /// otherwise removed).
    async fn start_with_env(queue: &str, app: SocketAddr, endpoint: &str, queue_keys: &str, env: &[(&str, &str)]) -> Result<Host> {
        let dir = tempfile::tempdir()?;
        let api: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let config = format!(
            "[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"ebb-under-test\"\n\n[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n\n[queues.{queue}]\n{queue_keys}handler = {{ url = \"http://{app}/work\" }}\n"
        );
        std::fs::write(dir.path().join("ebb.toml"), config)?;
        // The rules a queue may name: `paper.wasm` answers, `trap.wasm` traps at every call.
        std::fs::create_dir_all(dir.path().join("rules"))?;
        std::fs::copy(guests::PAPER_DEFAULT, dir.path().join("rules/paper.wasm"))?;
        std::fs::copy(guests::TRAP, dir.path().join("rules/trap.wasm"))?;
        let log_path = dir.path().join("host.log");
        // `EBB_OTEL_HOST_BINARY` lets the steady load be measured on a release build.
        let mut command = Command::new(std::env::var("EBB_OTEL_HOST_BINARY").unwrap_or_else(|_| EBB.to_string()));
        command
            .arg("run")
            .arg("--config")
            .arg(dir.path().join("ebb.toml"))
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path)?);
        for variable in VARIABLES {
            command.env_remove(variable);
        }
        command.envs(env.iter().copied());
        let host = Host { child: command.spawn()?, api, log_path, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        while raw(api, &get("/healthz", None)).await.map(|a| a.status).ok() != Some(200) {
            ensure!(Instant::now() < deadline, "the host's API did not come up: {}", host.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(host)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Sends `body` to `queue` with `headers` (whole lines); the answer.
    async fn send(&self, queue: &str, headers: &str, body: &str) -> Result<Answer> {
        let request = format!(
            "POST /queues/{queue}/messages HTTP/1.1\r\nHost: ebb\r\nAuthorization: Bearer {TOKEN}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let answer = raw(self.api, request.as_bytes()).await?;
        ensure!(answer.status == 201, "the send was refused: {answer:?}");
        Ok(answer)
    }

    /// The value of the series `name` (its first) in `/metrics`.
    async fn metric(&self, name: &str) -> Result<f64> {
        let answer = raw(self.api, &get("/metrics", Some(TOKEN))).await?;
        let line = answer.body.lines().find(|line| line.starts_with(name)).with_context(|| format!("no {name} in /metrics"))?;
        Ok(line.rsplit(' ').next().unwrap_or_default().parse()?)
    }

    /// Waits until `name` reaches `at_least`, for at most `within`.
    async fn wait_for_metric(&self, name: &str, at_least: f64, within: Duration) -> Result<f64> {
        let deadline = Instant::now() + within;
        loop {
            let value = self.metric(name).await?;
            if value >= at_least {
                return Ok(value);
            }
            ensure!(Instant::now() < deadline, "{name} stayed at {value} (below {at_least}): {}", self.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM, then the time until it exited, which must be a success.
    fn stop(self) -> Result<Duration> {
        Ok(self.stop_with_log()?.0)
    }

    /// Two SIGINTs, the second while the first drains: the exit status and the whole log.
    fn stop_twice(mut self) -> Result<(std::process::ExitStatus, String)> {
        for _ in 0..2 {
            ensure!(Command::new("kill").args(["-INT", &self.child.id().to_string()]).status()?.success());
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok((self.child.wait()?, self.log()))
    }

    /// [`Host::stop`], and its whole log.
    fn stop_with_log(mut self) -> Result<(Duration, String)> {
        let asked = std::time::Instant::now();
        ensure!(Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status()?.success());
        let status = self.child.wait()?;
        ensure!(status.success(), "graceful shutdown exits 0, got {status}: {}", self.log());
        Ok((asked.elapsed(), self.log()))
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The spans of `queue` the receiver has once `done` holds of them, within 30 s.
pub(crate) async fn spans_until(queue: &str, done: impl Fn(&[ReceivedSpan]) -> bool) -> Result<Vec<ReceivedSpan>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let all = OtlpReceiver::shared().spans().await?;
        // A trace is the queue's when one of its spans names the queue.
        let traces: Vec<String> = all.iter().filter(|s| s.attribute("queue").as_deref() == Some(queue)).map(|s| s.trace_id.clone()).collect();
        let spans: Vec<ReceivedSpan> = all.into_iter().filter(|s| traces.contains(&s.trace_id)).collect();
        if done(&spans) {
            return Ok(spans);
        }
        if Instant::now() > deadline {
            bail!("the spans expected of {queue} did not come: {spans:#?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|span| span.name == name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_with_a_traceparent_is_the_producers_child_and_its_message_is_handled_then_deleted_in_spans() -> Result<()> {
    let queue = "traced";
    let receiver = OtlpReceiver::shared();
    let host = Host::start(queue, app(200, "ok").await?, &receiver.endpoint(), "").await?;
    let traceparent = format!("traceparent: 00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01\r\ntracestate: vendor=1\r\n");
    let sent = host.send(queue, &traceparent, "hello").await?;
    let id: serde_json::Value = serde_json::from_str(&sent.body)?;
    let id = id["id"].as_str().context("the send answers the message's id")?.to_string();
    let handled = |spans: &[ReceivedSpan]| {
        spans.iter().any(|s| {
            s.name == "handle" && s.attribute("queue").as_deref() == Some(queue) && s.attribute("messaging.message.id").as_deref() == Some(id.as_str())
        })
    };
    let spans = spans_until(queue, |spans| handled(spans) && named(spans, "delete").len() + named(spans, "send").len() >= 2).await?;

    let send = named(&spans, "send")
        .into_iter()
        .find(|s| s.trace_id == PRODUCER_TRACE)
        .with_context(|| format!("no send span in the producer's trace: {spans:#?}"))?;
    ensure!(send.parent_span_id == PRODUCER_SPAN, "the send's parent is the producer's span: {send:?}");
    ensure!(send.kind == "SPAN_KIND_PRODUCER" && send.service.as_deref() == Some("ebb-under-test"), "{send:?}");
    ensure!(send.attribute("messaging.message.id").as_deref() == Some(id.as_str()), "the send names its message: {send:?}");
    let put = spans.iter().find(|s| s.name == "put" && s.parent_span_id == send.span_id);
    ensure!(put.is_some(), "the storage put is the send's child: {spans:#?}");

    let all = receiver.spans().await?;
    // Message ids are per store: another test's host has a message "1" too.
    let handle = all
        .iter()
        .find(|s| s.name == "handle" && s.attribute("queue").as_deref() == Some(queue) && s.attribute("messaging.message.id").as_deref() == Some(id.as_str()))
        .context("no handle span")?;
    ensure!(handle.attribute("outcome").as_deref() == Some("deleted") && handle.attribute("dequeue_count").as_deref() == Some("1"), "{handle:?}");
    ensure!(handle.kind == "SPAN_KIND_CONSUMER" && handle.status != "error", "{handle:?}");
    let delete = all.iter().find(|s| s.name == "delete" && s.parent_span_id == handle.span_id && s.trace_id == handle.trace_id);
    ensure!(delete.is_some(), "the delete is the handling's child: {all:#?}");
    let get = all.iter().find(|s| s.name == "get" && s.attribute("queue").as_deref() == Some(queue) && s.attribute("messages").as_deref() == Some("1"));
    ensure!(get.is_some(), "a get span says it returned the message: {all:#?}");

    // A malformed traceparent starts a new trace, and is counted.
    let before = host.metric("ebb_traceparent_rejected_total").await?;
    let bad = "traceparent: 00-00000000000000000000000000000000-00f067aa0ba902b7-01\r\n";
    let sent = host.send(queue, bad, "second").await?;
    let second: serde_json::Value = serde_json::from_str(&sent.body)?;
    let second = second["id"].as_str().context("an id")?.to_string();
    let spans =
        spans_until(queue, |spans| spans.iter().any(|s| s.name == "send" && s.attribute("messaging.message.id").as_deref() == Some(second.as_str()))).await?;
    let send = spans.iter().find(|s| s.name == "send" && s.attribute("messaging.message.id").as_deref() == Some(second.as_str())).context("the second send")?;
    ensure!(send.parent_span_id.is_empty() && send.trace_id != "0".repeat(32), "a malformed traceparent is not passed on: {send:?}");
    ensure!(host.metric("ebb_traceparent_rejected_total").await? == before + 1.0, "the malformed traceparent is counted");
    host.stop()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_messages_handling_span_says_why() -> Result<()> {
    let queue = "traced-poison";
    let host =
        Host::start(queue, app(500, "the app says no").await?, &OtlpReceiver::shared().endpoint(), "max_dequeue_count = 2\nvisibility_timeout = \"100ms\"\n")
            .await?;
    host.send(queue, "", "doomed").await?;
    let poisoned = |s: &&ReceivedSpan| s.name == "handle" && s.attribute("outcome").as_deref() == Some("poisoned");
    let spans = spans_until(queue, |spans| spans.iter().any(|s| poisoned(&s))).await?;
    let span = spans.iter().find(poisoned).context("a poisoned span")?;
    let reason = span.attribute("reason").unwrap_or_default();
    ensure!(reason.contains("500") && reason.contains("the app says no"), "the reason names the app's answer: {span:?}");
    ensure!(span.status == "error" && span.attribute("dequeue_count").as_deref() == Some("2"), "{span:?}");
    ensure!(spans.iter().any(|s| s.name == "handle" && s.attribute("outcome").as_deref() == Some("retried")), "the first try was retried: {spans:#?}");
    host.stop()?;
    Ok(())
}

/// The `rule` spans of `queue`'s decisions of `export`, once one satisfies `done`.
async fn rule_spans(queue: &str, export: &str, done: impl Fn(&ReceivedSpan) -> bool) -> Result<Vec<ReceivedSpan>> {
    let of_export = |s: &ReceivedSpan| s.name == "rule" && s.attribute("queue").as_deref() == Some(queue) && s.attribute("export").as_deref() == Some(export);
    let spans = spans_until(queue, |spans| spans.iter().any(|s| of_export(s) && done(s))).await?;
    Ok(spans.into_iter().filter(of_export).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_decisions_span_names_its_export_inputs_result_and_fault() -> Result<()> {
    let receiver = OtlpReceiver::shared();
    let answering = Host::start("ruled", app(200, "ok").await?, &receiver.endpoint(), "rule = \"paper.wasm\"\n").await?;
    answering.send("ruled", "", "work").await?;
    let spans = rule_spans("ruled", "on-queue-empty", |s| s.attribute("source").as_deref() == Some("Rule")).await?;
    let span = spans.iter().find(|s| s.attribute("source").as_deref() == Some("Rule")).context("a decision of the rule")?;
    let inputs: serde_json::Value = serde_json::from_str(&span.attribute("inputs").with_context(|| format!("no inputs: {span:?}"))?)?;
    ensure!(inputs["queue"] == "ruled" && inputs.get("idle_count").is_some(), "the inputs are the rule's idle context: {inputs}");
    let result = span.attribute("result").unwrap_or_default();
    ensure!(result.contains("delay_ms") && span.attribute("fault").as_deref() == Some("false"), "{span:?}");
    answering.stop()?;

    let trapping = Host::start("ruled-trap", app(200, "ok").await?, &receiver.endpoint(), "rule = \"trap.wasm\"\n").await?;
    let spans = rule_spans("ruled-trap", "on-queue-empty", |s| s.attribute("fault").as_deref() == Some("true")).await?;
    let span = spans.iter().find(|s| s.attribute("fault").as_deref() == Some("true")).context("a faulted decision")?;
    ensure!(span.attribute("source").as_deref() == Some("Fallback") && span.attribute("inputs").is_some_and(|i| i.contains("ruled-trap")), "{span:?}");
    trapping.stop()?;
    Ok(())
}

/// Messages are all handled with the collector at `endpoint` away, the spans lost are
/// counted, and shutdown is prompt.
async fn collector_away_costs_spans_only(queue: &str, endpoint: &str) -> Result<()> {
    let host = Host::start(queue, app(200, "ok").await?, endpoint, "").await?;
    for n in 0..20 {
        host.send(queue, "", &format!("m{n}")).await?;
    }
    host.wait_for_metric("ebb_messages_processed_total", 20.0, Duration::from_secs(20)).await?;
    // An export is tried each second; one that hangs gives up after 5 s.
    host.wait_for_metric("ebb_trace_spans_dropped_total", 1.0, Duration::from_secs(20)).await?;
    let stopped = host.stop()?;
    // drain_timeout's default (30 s) is not waited: nothing is in flight; the flush waits ≤ 1 s.
    ensure!(stopped < Duration::from_secs(5), "shutdown waited {stopped:?} on the collector");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_refuses_costs_counted_spans_never_messages() -> Result<()> {
    // A port nobody listens on: every connection is refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    collector_away_costs_spans_only("traced-refused", &format!("http://127.0.0.1:{port}")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_hangs_costs_counted_spans_never_messages_nor_a_stuck_shutdown() -> Result<()> {
    // Connections are taken (the kernel's backlog) and never answered.
    let silent = std::net::TcpListener::bind("127.0.0.1:0")?;
    collector_away_costs_spans_only("traced-hung", &format!("http://{}", silent.local_addr()?)).await
}

#[test]
fn an_otlp_endpoint_that_is_not_a_url_is_a_config_error_naming_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = "[telemetry]\notlp_endpoint = \"collector:4318\"\n\n[queues.orders]\nhandler = { url = \"http://127.0.0.1:9/work\" }\n";
    std::fs::write(dir.path().join("ebb.toml"), config)?;
    let mut command = Command::new(EBB);
    command.arg("run").arg("--config").arg(dir.path().join("ebb.toml")).current_dir(dir.path());
    for variable in VARIABLES {
        command.env_remove(variable);
    }
    let output = command.output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(!output.status.success(), "ebb run should refuse the endpoint: {stderr}");
    ensure!(stderr.contains("telemetry.otlp_endpoint: must be an http:// or https:// URL, got \"collector:4318\""), "{stderr}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_grpc_a_handled_messages_spans_reach_a_grpc_receiver() -> Result<()> {
    let queue = "traced-grpc";
    let receiver = OtlpReceiver::shared();
    // The receiver's gRPC port speaks only gRPC: what arrives came over TraceService/Export.
    let env = [("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")];
    let host = Host::start_with_env(queue, app(200, "ok").await?, &receiver.grpc_endpoint(), "", &env).await?;
    let traceparent = format!("traceparent: 00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01\r\n");
    let sent: serde_json::Value = serde_json::from_str(&host.send(queue, &traceparent, "over grpc").await?.body)?;
    let id = sent["id"].as_str().context("the send answers the message's id")?.to_string();
    let ours = |s: &ReceivedSpan| s.attribute("queue").as_deref() == Some(queue) && s.attribute("messaging.message.id").as_deref() == Some(id.as_str());
    let spans = spans_until(queue, |spans| spans.iter().any(|s| s.name == "handle" && ours(s) && s.attribute("outcome").is_some())).await?;

    let send = spans.iter().find(|s| s.name == "send" && ours(s)).with_context(|| format!("no send span: {spans:#?}"))?;
    ensure!(send.trace_id == PRODUCER_TRACE && send.parent_span_id == PRODUCER_SPAN, "the send is the producer's child: {send:?}");
    ensure!(send.service.as_deref() == Some("ebb-under-test"), "{send:?}");
    let handle = spans.iter().find(|s| s.name == "handle" && ours(s)).context("no handle span")?;
    ensure!(handle.attribute("outcome").as_deref() == Some("deleted") && handle.kind == "SPAN_KIND_CONSUMER", "{handle:?}");
    let spans = spans_until(queue, |spans| spans.iter().any(|s| s.name == "delete" && s.parent_span_id == handle.span_id)).await?;
    ensure!(spans.iter().any(|s| s.name == "delete" && s.trace_id == handle.trace_id), "the delete is in the handling's trace: {spans:#?}");
    ensure!(host.metric("ebb_trace_spans_dropped_total").await? == 0.0, "spans dropped over gRPC: {}", host.log());
    host.stop()?;
    Ok(())
}

/// The steady load's rate. The issue asks 1,000 msg/s; a debug host on a 2-core machine
/// shared with builds took sends at 549-585 msg/s when asked 1,000 (its API and handling in
/// one process), so the test holds 300, with room for a loaded CI run. A release host is
/// measured at 1,000: `EBB_OTEL_HOST_BINARY=target/release/ebb EBB_STEADY_RATE=1000`.
/// At least 100: [`send_steadily`] sends `rate / 100` a tick, so less would send nothing, forever.
fn steady_rate() -> u64 {
    std::env::var("EBB_STEADY_RATE").ok().and_then(|rate| rate.parse().ok()).unwrap_or(300).max(100)
}
/// How long the load lasts.
const STEADY_FOR: Duration = Duration::from_secs(60);

/// Sends `count` messages to `queue` at `rate` a second, spread in 10 ms ticks, at most 128
/// in flight (a send's latency does not bound the rate; the API has 248 request slots); the
/// time it took, which is `count / rate` when the host keeps up.
async fn send_steadily(host: &Host, queue: &str, count: u64, rate: u64) -> Result<Duration> {
    let client = reqwest::Client::new();
    let url = format!("http://{}/queues/{queue}/messages", host.api);
    let per_tick = rate / 100;
    let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(128));
    let mut sends = tokio::task::JoinSet::new();
    let started = Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_millis(10));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = 0;
    while sent < count {
        ticks.tick().await;
        for n in sent..(sent + per_tick).min(count) {
            let permit = in_flight.clone().acquire_owned().await?;
            let request = client.post(&url).bearer_auth(TOKEN).body(format!("m{n}"));
            sends.spawn(async move {
                let _permit = permit;
                request.send().await.and_then(reqwest::Response::error_for_status)
            });
        }
        sent = (sent + per_tick).min(count);
        while let Some(done) = sends.try_join_next() {
            done?.context("a send of the steady load failed")?;
        }
    }
    while let Some(done) = sends.join_next().await {
        done?.context("a send of the steady load failed")?;
    }
    Ok(started.elapsed())
}

/// `spans at shutdown: MADE made, … DROPPED dropped` of the host's last log line about spans.
fn spans_at_shutdown(log: &str) -> Result<(u64, u64)> {
    let line = log.lines().rev().find(|line| line.contains("spans at shutdown")).with_context(|| format!("no account of the spans at shutdown: {log}"))?;
    let number = |field: &str| -> Result<u64> {
        let at = line.find(&format!("{field}=")).with_context(|| format!("no {field} in {line}"))? + field.len() + 1;
        Ok(line[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap_or_default().parse()?)
    };
    Ok((number("spans_made")?, number("spans_dropped")?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_steady_load_for_a_minute_every_span_made_is_received_or_counted_dropped() -> Result<()> {
    let queue = "traced-steady";
    let receiver = OtlpReceiver::counting();
    let service = "ebb-steady";
    let env = [("OTEL_SERVICE_NAME", service)];
    let host = Host::start_with_env(queue, app(200, "ok").await?, &receiver.endpoint(), "max_concurrent_calls = 64\n", &env).await?;
    let rate = steady_rate();
    let count = rate * STEADY_FOR.as_secs();
    let took = send_steadily(&host, queue, count, rate).await?;
    let held = count as f64 / took.as_secs_f64();
    ensure!(held >= 0.9 * rate as f64, "the host took sends at {held:.0} msg/s, not {rate}");
    // Handled as they came: a few seconds after the last send, all are.
    host.wait_for_metric("ebb_messages_processed_total", count as f64, Duration::from_secs(10)).await?;
    let (_, log) = host.stop_with_log()?;

    // The host exits once its last export is answered (or counted dropped): what the receiver
    // has now is all it will get.
    let (made, dropped) = spans_at_shutdown(&log)?;
    let received = receiver.count(service).await?;
    // A send, its put, a handling and its delete a message, and the gets.
    ensure!(made >= 4 * count, "{made} spans made for {count} messages");
    ensure!(received + dropped == made, "{received} spans received + {dropped} counted dropped, but {made} made");
    eprintln!("{count} messages at {held:.0} msg/s: {made} spans made, {received} received, {dropped} dropped");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once_with_every_span_made_counted_dropped() -> Result<()> {
    let queue = "traced-second-signal";
    let silent = std::net::TcpListener::bind("127.0.0.1:0")?;
    // A handler that never answers keeps the first signal's drain going.
    let app = TcpListener::bind("127.0.0.1:0").await?;
    let app_address = app.local_addr()?;
    let router = axum::Router::new().route("/work", axum::routing::post(std::future::pending::<&'static str>));
    tokio::spawn(async move { axum::serve(app, router).await });
    let host = Host::start(queue, app_address, &format!("http://{}", silent.local_addr()?), "").await?;
    for n in 0..5 {
        host.send(queue, "", &format!("m{n}")).await?;
    }
    // Their sends' spans ended; an export of them hangs.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, log) = host.stop_twice()?;
    ensure!(status.code() == Some(130), "a second signal exits at once: {status}: {log}");
    let (made, dropped) = spans_at_shutdown(&log)?;
    ensure!(made >= 10 && dropped == made, "none exported, so each of the {made} spans made is counted dropped: {dropped}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_hangs_through_shutdown_gets_every_span_counted_dropped_once() -> Result<()> {
    let queue = "traced-hung-at-stop";
    // Connections are taken (the kernel's backlog) and never answered.
    let silent = std::net::TcpListener::bind("127.0.0.1:0")?;
    let host = Host::start(queue, app(200, "ok").await?, &format!("http://{}", silent.local_addr()?), "").await?;
    for n in 0..20 {
        host.send(queue, "", &format!("m{n}")).await?;
    }
    host.wait_for_metric("ebb_messages_processed_total", 20.0, Duration::from_secs(20)).await?;
    // An export is hanging now (one is tried each second, given up after 5 s): the stop
    // gives up on it after 1 s.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, log) = host.stop_with_log()?;
    let (made, dropped) = spans_at_shutdown(&log)?;
    ensure!(made >= 4 * 20, "{made} spans made for 20 messages");
    ensure!(dropped == made, "none exported, so each of the {made} spans made is dropped once: {dropped} counted");
    Ok(())
}
