//! The API served in process over an in-memory queue, on tokio's paused clock: every error
//! answer is JSON with a reason, the body limit, slow and idle connections closed (header,
//! body and idle timeouts), room kept for the probes. (The binary's side is in
//! `tests/all/api.rs`.)

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use ebb_raw_http::{Answer, chunked, closed, get, raw, read_answer, request};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Api;
use super::errors::MAX_ECHO_BYTES;
use crate::config::ApiLimits;
use crate::health::{Health, Readiness, ReadinessPart};
use crate::queue::memory::MemoryQueue;
use crate::queue::{QueueClient, TokioClock};

const TOKEN: &str = "t0ken";
/// A read token, `viewer`, beside the admin `default` ([`TOKEN`]).
const READ_TOKEN: &str = "r3ad";

/// The head of a POST to `orders` whose body of `length` bytes is still to come.
fn post_head(length: usize) -> Vec<u8> {
    ebb_raw_http::post_head("/queues/orders/messages", TOKEN, length)
}

/// An API with one in-memory queue, `orders`, and no listener, served in process with `limits`.
async fn serve(limits: ApiLimits) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<Result<()>>) {
    serve_queue(limits, Arc::new(MemoryQueue::new("orders", Arc::new(TokioClock::new()), limits.max_body_bytes))).await
}

/// An API with `queue` as `orders`.
async fn serve_queue(limits: ApiLimits, queue: Arc<dyn QueueClient>) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<Result<()>>) {
    serve_api(limits, queue, Readiness::default()).await
}

/// An API with `queue` as `orders` and `readiness` for `/readyz`.
async fn serve_api(
    limits: ApiLimits,
    queue: Arc<dyn QueueClient>,
    readiness: Readiness,
) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<Result<()>>) {
    serve_handle(limits, crate::service::QueueHandle::new("orders", queue, Vec::new()), readiness).await
}

/// An API with `handle` as `orders`.
async fn serve_handle(
    limits: ApiLimits,
    handle: crate::service::QueueHandle,
    readiness: Readiness,
) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<Result<()>>) {
    let handles = BTreeMap::from([("orders".to_string(), handle)]);
    let api = Arc::new(Api {
        listeners: BTreeMap::new(),
        handles,
        tokens: vec![
            crate::config::ApiToken { name: "default".into(), role: crate::config::ApiRole::Admin, secret: TOKEN.into() },
            crate::config::ApiToken { name: "viewer".into(), role: crate::config::ApiRole::Read, secret: READ_TOKEN.into() },
        ],
        health: Health::default(),
        readiness,
        bus: None,
        audit: None,
        price_per_10k_transactions: crate::cost::PAPER_PRICE_PER_10K,
        queue_prices: Default::default(),
    });
    let listener = super::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(super::serve(listener, api, shutdown.clone(), limits));
    (addr, shutdown, task)
}

#[tokio::test(start_paused = true)]
async fn a_client_slow_to_send_its_headers_is_closed_at_the_header_read_timeout() -> Result<()> {
    let limits = ApiLimits { header_read_timeout: Duration::from_secs(10), idle_timeout: Duration::from_secs(60), ..ApiLimits::default() };
    let (addr, _shutdown, _task) = serve(limits).await;
    let stream = TcpStream::connect(addr).await?;
    let started = Instant::now();
    let (mut read, mut write) = stream.into_split();
    write.write_all(b"GET /status HTTP/1.1\r\nHost: ebb\r\n").await?;
    // One more header line every 2 s: each keeps bytes coming, none completes the head.
    let trickle = async {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_secs(2)).await;
            if write.write_all(b"X-Slow: 1\r\n").await.is_err() {
                break;
            }
        }
    };
    let closed = closed(&mut read);
    tokio::select! { () = trickle => bail!("never closed"), () = closed => {} }
    let elapsed = started.elapsed();
    ensure!(elapsed >= Duration::from_secs(10) && elapsed < Duration::from_secs(11), "closed after {elapsed:?}, the timeout is 10 s");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_moves_no_byte_is_closed_at_the_idle_timeout() -> Result<()> {
    let limits = ApiLimits {
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        body_read_timeout: Duration::from_secs(600),
        ..ApiLimits::default()
    };
    let (addr, _shutdown, _task) = serve(limits).await;
    // Whole headers, then a body that never comes: the header timeout no longer applies.
    let mut stream = TcpStream::connect(addr).await?;
    let started = Instant::now();
    stream
        .write_all(format!("POST /queues/orders/messages HTTP/1.1\r\nHost: ebb\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 10\r\n\r\nabc").as_bytes())
        .await?;
    closed(&mut stream).await;
    let elapsed = started.elapsed();
    ensure!(elapsed >= Duration::from_secs(60) && elapsed < Duration::from_secs(61), "closed after {elapsed:?}, the idle timeout is 60 s");

    // A kept-alive connection after its answer waits for the next request's headers: the
    // header timeout closes it.
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: ebb\r\n\r\n").await?;
    let started = Instant::now();
    closed(&mut stream).await;
    let elapsed = started.elapsed();
    ensure!(elapsed >= Duration::from_secs(10) && elapsed < Duration::from_secs(11), "idle keep-alive closed after {elapsed:?}");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn shutdown_closes_idle_connections_and_serve_returns() -> Result<()> {
    let (addr, shutdown, task) = serve(ApiLimits::default()).await;
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: ebb\r\n\r\n").await?;
    let mut buf = [0u8; 256];
    let n = stream.read(&mut buf).await?;
    ensure!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&buf[..n]));
    let started = Instant::now();
    shutdown.cancel();
    task.await??;
    closed(&mut stream).await;
    ensure!(started.elapsed() < Duration::from_secs(1), "shutdown waited {:?} for an idle connection", started.elapsed());
    ensure!(TcpStream::connect(addr).await.is_err(), "still accepting after shutdown");
    Ok(())
}

/// Issue 25: liveness apart from readiness. `/readyz` answers 200 when every queue is ready
/// and 503 with each queue's reasons when one is not; like `/healthz` it needs no token, but
/// without it shows only each queue's `ready`. A query is refused.
#[tokio::test(start_paused = true)]
async fn readyz_answers_per_queue_and_shows_reasons_only_with_the_token() -> Result<()> {
    let readiness = Readiness::default();
    readiness.add_queue("orders");
    readiness.add_queue("invoices");
    let queue = Arc::new(MemoryQueue::new("orders", Arc::new(TokioClock::new()), 1000));
    let (addr, _shutdown, _task) = serve_api(ApiLimits::default(), queue, readiness.clone()).await;
    let json = |answer: &Answer| -> Result<serde_json::Value> { Ok(serde_json::from_str(&answer.body)?) };

    let answer = raw(addr, &get("/readyz", None)).await?;
    ensure!(answer.status == 200, "{answer:?}");
    ensure!(json(&answer)? == serde_json::json!({ "ready": true, "queues": { "invoices": { "ready": true }, "orders": { "ready": true } } }), "{answer:?}");

    let reason = "connection refused by 10.0.0.7:10001 (account prodstore)";
    readiness.set_problem("orders", ReadinessPart::Storage, reason);
    for (path, token) in [("/readyz", None), ("/readyz", Some("wrong"))] {
        let answer = raw(addr, &get(path, token)).await?;
        ensure!(answer.status == 503 && answer.error()?.contains("not every queue is ready"), "{answer:?}");
        let body = json(&answer)?;
        ensure!(body["queues"] == serde_json::json!({ "invoices": { "ready": true }, "orders": { "ready": false } }), "{answer:?}");
        ensure!(!answer.body.contains("refused"), "the reason shown without the token: {answer:?}");
    }
    // A query is refused, as on every route, briefly however long.
    let long_query = format!("/readyz?{}", "x=1&".repeat(10_000));
    let answer = raw(addr, &get(&long_query, None)).await?;
    ensure!(answer.status == 400 && answer.body.len() < 200 && answer.error()?.contains("unknown query parameter \"x\""), "{answer:?}");
    let answer = raw(addr, &get("/readyz", Some(TOKEN))).await?;
    ensure!(answer.status == 503, "{answer:?}");
    let body = json(&answer)?;
    ensure!(body["queues"]["orders"] == serde_json::json!({ "ready": false, "problems": { "storage": reason } }), "{answer:?}");
    ensure!(body["queues"]["invoices"]["ready"] == true, "{answer:?}");

    readiness.clear_problem("orders", ReadinessPart::Storage);
    let answer = raw(addr, &get("/readyz", Some(TOKEN))).await?;
    ensure!(answer.status == 200 && json(&answer)?["ready"] == true, "{answer:?}");
    Ok(())
}

/// Issue 18: a body sent a byte every 5 s was never idle, so it held its connection for as
/// long as the client liked. Its body must arrive within `body_read_timeout`.
#[tokio::test(start_paused = true)]
async fn a_body_sent_a_byte_at_a_time_gets_408_at_the_body_read_timeout() -> Result<()> {
    let limits = ApiLimits { body_read_timeout: Duration::from_secs(30), ..ApiLimits::default() };
    let (addr, _shutdown, _task) = serve(limits).await;
    let (mut read, mut write) = TcpStream::connect(addr).await?.into_split();
    write.write_all(&post_head(1000)).await?;
    let started = Instant::now();
    let dribble = async {
        for _ in 0..1000 {
            if write.write_all(b"x").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    };
    let answer = tokio::select! {
        () = dribble => bail!("the body was still being taken after 5000 s"),
        answer = read_answer(&mut read) => answer?,
    };
    let elapsed = started.elapsed();
    ensure!(answer.status == 408 && answer.error()?.contains("body_read_timeout (30s)"), "{answer:?}");
    ensure!(elapsed >= Duration::from_secs(30) && elapsed < Duration::from_secs(31), "answered after {elapsed:?}, the timeout is 30 s");
    ensure!(answer.headers.get("connection").is_some_and(|c| c == "close"), "{answer:?}");
    Ok(())
}

/// Issue 18: 256 connections sending a body at a byte per 5 s held every API slot and
/// `/healthz` timed out. Other requests leave `probe_connections` to the probes.
/// (Real clock: the goal is a second of real time.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_within_a_second_while_slow_bodies_take_every_connection() -> Result<()> {
    let limits = ApiLimits { max_connections: 8, probe_connections: 2, ..ApiLimits::default() };
    let (addr, shutdown, task) = serve(limits).await;
    let mut slow = Vec::new();
    for _ in 0..limits.max_connections {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(&post_head(1000)).await?;
        slow.push(stream);
    }
    let dribble = tokio::spawn(async move {
        loop {
            for stream in &mut slow {
                let _ = stream.write_all(b"x").await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(1), raw(addr, &get("/healthz", None))).await.context("/healthz did not answer within 1 s")??;
        ensure!(answer.status == 200, "{answer:?}");
        eprintln!("/healthz answered in {:?} beside {} slow bodies", started.elapsed(), limits.max_connections);
    }
    // A request that is not a probe finds every other slot taken.
    let answer = tokio::time::timeout(Duration::from_secs(1), raw(addr, &get("/status", Some(TOKEN)))).await.context("/status got no answer within 1 s")??;
    ensure!(answer.status == 503 && answer.error()?.contains("busy"), "{answer:?}");
    dribble.abort();
    shutdown.cancel();
    task.await??;
    Ok(())
}

/// Issue 18: 1,000 idle connections delayed `/healthz` by 20 s: past `max_connections`
/// clients waited in a backlog of 128 until the header timeout closed the idle ones. The
/// connection that has waited longest for a request now makes room for a newcomer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_within_a_second_after_a_thousand_idle_connections() -> Result<()> {
    let limits = ApiLimits { max_connections: 16, ..ApiLimits::default() };
    let (addr, shutdown, task) = serve(limits).await;
    let connects = (0..1000).map(|_| tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)));
    let idle: Vec<_> = futures::future::join_all(connects).await.into_iter().filter_map(|c| c.ok().and_then(Result::ok)).collect();
    let started = std::time::Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(1), raw(addr, &get("/healthz", None))).await.context("/healthz did not answer within 1 s")??;
    ensure!(answer.status == 200, "{answer:?}");
    eprintln!("/healthz answered in {:?} after {} idle connections", started.elapsed(), idle.len());
    drop(idle);
    shutdown.cancel();
    task.await??;
    Ok(())
}

/// Found by attack: connections that send one byte of a request line and nothing more were
/// each given 100 ms to finish before making room, one at a time, so 600 of them kept
/// `/healthz` waiting in the backlog for tens of seconds. A connection asked to make room
/// while it is not inside a request now closes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_within_a_second_after_many_half_sent_request_lines() -> Result<()> {
    let limits = ApiLimits { max_connections: 16, ..ApiLimits::default() };
    let (addr, shutdown, task) = serve(limits).await;
    let mut half_sent = Vec::new();
    for _ in 0..300 {
        let Ok(Ok(mut stream)) = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)).await else { continue };
        let _ = stream.write_all(b"G").await;
        half_sent.push(stream);
    }
    let started = std::time::Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(1), raw(addr, &get("/healthz", None))).await.context("/healthz did not answer within 1 s")??;
    ensure!(answer.status == 200, "{answer:?}");
    eprintln!("/healthz answered in {:?} after {} half-sent request lines", started.elapsed(), half_sent.len());
    drop(half_sent);
    shutdown.cancel();
    task.await??;
    Ok(())
}

/// Found by attack: a probe carrying a large Content-Length got 413 (after a second when just
/// over the limit), though the probes read no body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probes_answer_whatever_body_length_a_request_declares() -> Result<()> {
    let limits = ApiLimits::default();
    let (addr, shutdown, task) = serve(limits).await;
    for path in ["/healthz", "/readyz"] {
        for length in [limits.max_body_bytes + 1, 100_000_000] {
            let head = format!("GET {path} HTTP/1.1\r\nHost: ebb\r\nContent-Length: {length}\r\n\r\n");
            let started = std::time::Instant::now();
            let answer = tokio::time::timeout(Duration::from_secs(1), raw(addr, head.as_bytes())).await.context("no answer within 1 s")??;
            ensure!(answer.status == 200, "{path} with Content-Length {length}: {answer:?}");
            ensure!(started.elapsed() < Duration::from_millis(500), "{path} took {:?}", started.elapsed());
        }
    }
    shutdown.cancel();
    task.await??;
    Ok(())
}

/// Issue 18: a client announcing a body over the limit with `Expect: 100-continue` was told
/// to send it (`100 Continue`), then refused. It gets 413 at once.
#[tokio::test(start_paused = true)]
async fn an_oversized_body_announced_with_expect_100_continue_gets_413_and_no_100() -> Result<()> {
    let limits = ApiLimits::default();
    let (addr, _shutdown, _task) = serve(limits).await;
    for length in [limits.max_body_bytes + 1, limits.max_body_bytes * 100] {
        let head = format!(
            "POST /queues/orders/messages HTTP/1.1\r\nHost: ebb\r\nAuthorization: Bearer {TOKEN}\r\nExpect: 100-continue\r\nContent-Length: {length}\r\n\r\n"
        );
        let answer = raw(addr, head.as_bytes()).await?;
        ensure!(answer.status == 413 && answer.error()?.contains("max_message_bytes"), "Content-Length {length}: {answer:?}");
    }
    // Within the limit, the client is asked for its body.
    let head =
        format!("POST /queues/orders/messages HTTP/1.1\r\nHost: ebb\r\nAuthorization: Bearer {TOKEN}\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
    let answer = raw(addr, head.as_bytes()).await?;
    ensure!(answer.status == 100, "{answer:?}");
    Ok(())
}

#[tokio::test]
async fn errors_of_the_router_itself_are_json() -> Result<()> {
    let (addr, shutdown, _task) = serve(ApiLimits { max_body_bytes: 100, ..ApiLimits::default() }).await;
    let cases = [
        (get("/nope", Some(TOKEN)), 404, "no route GET /nope"),
        (get("/status", None), 401, "token"),
        (get("/status", Some("t0kem")), 401, "token"),
        (get("/status", Some("t0ken-and-more")), 401, "token"),
        (request("POST", "/status", Some(TOKEN), b""), 405, "POST is not allowed on /status (allowed: GET"),
        (get("/queues/orders/messages", Some(TOKEN)), 405, "allowed: POST"),
        (request("POST", "/queues/nope/messages", Some(TOKEN), b"x"), 404, "no queue named nope"),
        (request("POST", "/queues/orders/messages", Some(TOKEN), &[b'x'; 101]), 413, "max_message_bytes (100 bytes)"),
        (chunked("/queues/orders/messages", TOKEN, &[b'x'; 101]), 413, "max_message_bytes (100 bytes)"),
        (request("POST", "/queues/orders/messages?delay_ms=604800001", Some(TOKEN), b"x"), 400, "7 days"),
    ];
    for (request, status, reason) in cases {
        let answer = raw(addr, &request).await?;
        ensure!(answer.status == status, "{}: {answer:?}", String::from_utf8_lossy(&request));
        let error = answer.error()?;
        ensure!(error.contains(reason), "{error:?} should say {reason:?}");
    }
    shutdown.cancel();
    Ok(())
}

/// A read token may GET (and HEAD, which this raw client cannot read) and nothing else, whatever the path: a method or a route
/// the table does not know is refused as well, before routing can answer 404 or 405 (which
/// the admin gets), and the refusal shows the route's pattern, or an unknown path cut short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_token_gets_403_on_every_method_but_get_whatever_the_path() -> Result<()> {
    let (addr, shutdown, _task) = serve(ApiLimits::default()).await;
    let long = format!("/queues/{}/poison/requeue/x", "n".repeat(5_000));
    let cases = [
        ("GET", "/status".to_string(), 200, 200, None),
        ("GET", "/whoami".to_string(), 200, 200, None),
        ("POST", "/queues/orders/messages".to_string(), 403, 201, Some("token \"viewer\" has role read; POST /queues/{name}/messages needs admin")),
        ("DELETE", "/status".to_string(), 403, 405, Some("DELETE /status needs admin")),
        ("PUT", "/queues/orders/pause".to_string(), 403, 405, Some("PUT /queues/{name}/pause needs admin")),
        ("PATCH", "/nowhere".to_string(), 403, 404, Some("PATCH /nowhere needs admin")),
        ("POST", long.clone(), 403, 404, Some("…")),
    ];
    for (method, path, read_status, admin_status, reason) in cases {
        let answer = raw(addr, &request(method, &path, Some(READ_TOKEN), b"x")).await?;
        ensure!(answer.status == read_status, "read {method} {path}: {answer:?}");
        if let Some(reason) = reason {
            let error = answer.error()?;
            ensure!(error.contains(reason) && error.len() < 200, "read {method} {path}: {error:?} should say {reason:?}, briefly");
        }
        let answer = raw(addr, &request(method, &path, Some(TOKEN), b"x")).await?;
        ensure!(answer.status == admin_status, "admin {method} {path}: {answer:?}");
    }
    let answer = raw(addr, &get("/whoami", Some(READ_TOKEN))).await?;
    ensure!(answer.body == r#"{"name":"viewer","role":"read"}"#, "{answer:?}");
    shutdown.cancel();
    Ok(())
}

/// Review defect: ~21,000 idle connections took every file descriptor, and the handler calls
/// failed with "Too many open files". At most `max_connections` are open: past it, the one
/// that has waited longest for a request is closed for the newcomer.
/// (Real clock: a closed connection is noticed by real I/O.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_limit_the_connection_waiting_longest_makes_room() -> Result<()> {
    let limits = ApiLimits { max_connections: 2, probe_connections: 1, ..ApiLimits::default() };
    let (addr, shutdown, task) = serve(limits).await;
    let mut first = TcpStream::connect(addr).await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut second = TcpStream::connect(addr).await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let answer = tokio::time::timeout(Duration::from_secs(1), raw(addr, &get("/healthz", None))).await.context("the newcomer was not served")??;
    ensure!(answer.status == 200, "{answer:?}");
    tokio::time::timeout(Duration::from_secs(1), closed(&mut first)).await.context("the oldest idle connection is still open")?;
    let mut buf = [0u8; 16];
    ensure!(tokio::time::timeout(Duration::from_millis(200), second.read(&mut buf)).await.is_err(), "the younger idle connection was closed too");
    shutdown.cancel();
    task.await??;
    Ok(())
}

/// With every connection inside a request, nothing can make room: a newcomer waits in the
/// backlog until a request ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_connection_is_inside_a_request_a_newcomer_waits() -> Result<()> {
    let limits = ApiLimits { max_connections: 2, probe_connections: 0, ..ApiLimits::default() };
    let (addr, shutdown, task) = serve(limits).await;
    let mut first = TcpStream::connect(addr).await?;
    first.write_all(&post_head(100)).await?;
    let mut second = TcpStream::connect(addr).await?;
    second.write_all(&post_head(100)).await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let third = tokio::spawn(async move { raw(addr, &get("/healthz", None)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(!third.is_finished(), "a third connection was served while two requests were in progress");
    drop(first);
    let answer = tokio::time::timeout(Duration::from_secs(5), third).await.context("still waiting after a request ended")???;
    ensure!(answer.status == 200, "{answer:?}");
    drop(second);
    shutdown.cancel();
    task.await??;
    Ok(())
}

/// A queue whose puts never answer (stalled storage), or always refuse the body.
struct Refusing {
    stall: bool,
}

#[async_trait::async_trait]
impl QueueClient for Refusing {
    fn name(&self) -> &str {
        "orders"
    }
    async fn create_if_missing(&self) -> Result<(), crate::queue::QueueError> {
        Ok(())
    }
    async fn put(&self, _: &[u8], _: Duration) -> Result<crate::queue::MessageId, crate::queue::QueueError> {
        if self.stall {
            std::future::pending::<()>().await;
        }
        Err(crate::queue::QueueError::InvalidBody("it holds the character U+0000".into()))
    }
    async fn get(&self, _: u32, _: Duration) -> Result<Vec<crate::queue::Message>, crate::queue::QueueError> {
        Ok(vec![])
    }
    async fn delete(&self, _: &crate::queue::MessageId, _: &crate::queue::PopReceipt) -> Result<(), crate::queue::QueueError> {
        Ok(())
    }
    async fn update_visibility(
        &self,
        _: &crate::queue::MessageId,
        r: &crate::queue::PopReceipt,
        _: Duration,
    ) -> Result<crate::queue::PopReceipt, crate::queue::QueueError> {
        Ok(r.clone())
    }
    async fn approximate_count(&self) -> Result<u64, crate::queue::QueueError> {
        Ok(0)
    }
}

/// Review (session 4): a send to stalled storage got no answer at all (the connection was
/// closed at the idle timeout, 60 s, after the retries' request timeouts added up), and a
/// body the queue can never store answered 503, which clients retry.
#[tokio::test(start_paused = true)]
async fn a_send_to_stalled_storage_answers_503_in_time_and_an_impossible_body_400() -> Result<()> {
    let limits = ApiLimits::default();
    let (addr, _shutdown, _task) = serve_queue(limits, Arc::new(Refusing { stall: true })).await;
    let started = Instant::now();
    let answer = raw(addr, &request("POST", "/queues/orders/messages", Some(TOKEN), b"x")).await?;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert!(answer.error()?.contains("did not answer within"), "{answer:?}");
    assert!(started.elapsed() < limits.idle_timeout, "answered after {:?}", started.elapsed());

    let (addr, _shutdown, _task) = serve_queue(limits, Arc::new(Refusing { stall: false })).await;
    let answer = raw(addr, &request("POST", "/queues/orders/messages", Some(TOKEN), b"x")).await?;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.error()?.contains("U+0000"), "{answer:?}");
    Ok(())
}

/// Attack pass (session 15): a large send to a slow blob service, storing for longer than
/// `idle_timeout` (the claim store's bound is longer), got an empty reply: the idle timeout
/// closed the connection while the host, not the client, was silent. The host's work on an
/// answer does not count as idle; a client's silence still does.
#[tokio::test(start_paused = true)]
async fn a_send_stored_for_longer_than_the_idle_timeout_is_answered() -> Result<()> {
    let limits = ApiLimits { idle_timeout: Duration::from_secs(10), ..ApiLimits::default() };
    let claims = SlowClaims { put_delay: Duration::from_secs(15) };
    let queue = Arc::new(MemoryQueue::new("orders", Arc::new(TokioClock::new()), 1024));
    let handle = crate::service::QueueHandle::builder("orders", queue).claims(Arc::new(claims)).build();
    let (addr, _shutdown, _task) = serve_handle(limits, handle, Readiness::default()).await;
    let started = Instant::now();
    let answer = raw(addr, &request("POST", "/queues/orders/messages", Some(TOKEN), &[b'x'; 4096])).await?;
    assert_eq!(answer.status, 201, "{answer:?}");
    assert!(started.elapsed() >= Duration::from_secs(15), "answered after {:?}", started.elapsed());

    // A body that stops coming still closes at the idle timeout.
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(&post_head(10)).await?;
    stream.write_all(b"abc").await?;
    let started = Instant::now();
    closed(&mut stream).await;
    let elapsed = started.elapsed();
    ensure!(elapsed >= Duration::from_secs(10) && elapsed < Duration::from_secs(11), "a body that stopped coming closed after {elapsed:?}");
    Ok(())
}

/// A claim store whose puts take `put_delay` (a slow blob service) and keep nothing.
struct SlowClaims {
    put_delay: Duration,
}

#[async_trait::async_trait]
impl crate::payload::claims::ClaimStore for SlowClaims {
    fn describe(&self) -> String {
        "a slow blob service".into()
    }
    fn allowed(&self) -> crate::payload::AllowedReferences {
        crate::payload::AllowedReferences { azure: None, embedded_queue: Some("orders".into()), s3_bucket: None }
    }
    fn max_bytes(&self) -> u64 {
        8 << 20
    }
    async fn put(&self, body: bytes::Bytes) -> Result<crate::payload::ClaimCheck, crate::payload::claims::ClaimError> {
        tokio::time::sleep(self.put_delay).await;
        let location = crate::payload::BlobRef::Embedded { queue: "orders".into(), key: 1 };
        Ok(crate::payload::ClaimCheck { location, size: body.len() as u64, sha256: [0; 32] })
    }
    async fn get(&self, _: &crate::payload::ClaimCheck, _: u64) -> Result<bytes::Bytes, crate::payload::claims::ClaimError> {
        unreachable!("the test only sends")
    }
    async fn delete(&self, _: &crate::payload::ClaimCheck) -> Result<(), crate::payload::claims::ClaimError> {
        Ok(())
    }
    async fn sweep(&self, _: Duration) -> Result<crate::payload::claims::SweepReport, crate::payload::claims::ClaimError> {
        Ok(Default::default())
    }
}

/// Attack pass, defect 13: a 404, a 405 and a route's own errors echoed the request's path,
/// method, queue name and query unbounded (a 30 KB path came back whole). What an answer
/// echoes is cut short, marked, and the answer stays small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_echoes_at_most_a_short_part_of_the_request() -> Result<()> {
    let (addr, shutdown, _task) = serve(ApiLimits::default()).await;
    let long = "n".repeat(30_000);
    let digits = "9".repeat(30_000);
    let requests = [
        get(&format!("/{long}"), Some(TOKEN)),
        get(&format!("/queues/{long}/messages"), Some(TOKEN)),
        request(&"N".repeat(10_000), "/status", Some(TOKEN), b""),
        request("POST", &format!("/queues/{long}/messages"), Some(TOKEN), b"x"),
        request("POST", &format!("/queues/{long}/items"), Some(TOKEN), b"[1]"),
        request("POST", &format!("/queues/{long}/notify"), Some(TOKEN), b""),
        request("POST", &format!("/queues/{long}/pause"), Some(TOKEN), b""),
        request("POST", &format!("/queues/{long}/resume"), Some(TOKEN), b""),
        request("POST", &format!("/queues/{long}/replies/{long}?timeout_ms=1"), Some(TOKEN), b""),
        request("POST", &format!("/queues/orders/replies/{long}?timeout_ms=1"), Some(TOKEN), b""),
        get(&format!("/queues/{long}/poison"), Some(TOKEN)),
        request("POST", &format!("/queues/{long}/poison/requeue?all=true"), Some(TOKEN), b""),
        request("POST", &format!("/queues/{long}/poison/purge?confirm=x"), Some(TOKEN), b""),
        request("POST", &format!("/queues/{long}/poison/purge?confirm={long}"), Some(TOKEN), b""),
        request("POST", &format!("/queues/orders/messages?delay_ms={digits}"), Some(TOKEN), b"x"),
        request("POST", &format!("/queues/orders/notify?{long}=1"), Some(TOKEN), b""),
        request("POST", &format!("/queues/orders/pause?for={long}"), Some(TOKEN), b""),
        get(&format!("/audit?limit={long}"), Some(TOKEN)),
        get(&format!("/status?{long}"), Some(TOKEN)),
    ];
    for request in requests {
        let answer = raw(addr, &request).await?;
        let line = String::from_utf8_lossy(&request[..request.len().min(80)]).into_owned();
        ensure!((400..500).contains(&answer.status), "{line}…: {answer:?}");
        let error = answer.error()?;
        ensure!(answer.body.len() <= 1_024, "{line}…: a {}-byte answer: {}…", answer.body.len(), &error[..error.len().min(200)]);
        for run in ["n", "9", "N"] {
            ensure!(!error.contains(&run.repeat(MAX_ECHO_BYTES + 1)), "{line}…: more than {MAX_ECHO_BYTES} bytes of the request echoed: {error}");
        }
        ensure!(error.contains('…') || !error.contains(&"n".repeat(10)), "{line}…: what is cut is marked: {error}");
    }
    shutdown.cancel();
    Ok(())
}

/// The request path (with `{name}` and `{id}` filled in) of each route, for a call that
/// gets past the route's own checks.
fn route_path(pattern: &str) -> String {
    pattern.replace("{name}", "orders").replace("{id}", "m1")
}

/// Attack pass, defect 14: `GET /status?x=1` was answered as if `x` were not there. Every
/// route, the probes and the console's files included, refuses a query parameter it does not
/// take (and one given twice), naming it; the parameters a route takes still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_a_query_parameter_it_does_not_take_naming_it() -> Result<()> {
    let (addr, shutdown, _task) = serve(ApiLimits::default()).await;
    let mut calls: Vec<(String, String)> =
        super::authenticated_route_table().into_iter().map(|(method, pattern)| (method.to_string(), route_path(pattern))).collect();
    for path in ["/healthz", "/readyz", "/", "/console/app.js", "/console/app.css"] {
        calls.push(("GET".into(), path.into()));
    }
    ensure!(calls.len() >= 19, "only {} routes tried", calls.len());
    for (method, path) in &calls {
        for query in ["x=1", "x"] {
            let answer = raw(addr, &request(method, &format!("{path}?{query}"), Some(TOKEN), b"")).await?;
            ensure!(answer.status == 400, "{method} {path}?{query}: {answer:?}");
            let error = answer.error()?;
            ensure!(error.contains("unknown query parameter \"x\""), "{method} {path}?{query}: {error:?}");
        }
    }
    let answer = raw(addr, &get("/audit?limit=5&x=1", Some(TOKEN))).await?;
    ensure!(answer.status == 400 && answer.error()?.contains("unknown query parameter \"x\""), "a known one beside: {answer:?}");
    for (method, path) in [("GET", "/audit?limit=1&limit=2"), ("POST", "/queues/orders/messages?delay_ms=1&delay_ms=1")] {
        let answer = raw(addr, &request(method, path, Some(TOKEN), b"x")).await?;
        ensure!(answer.status == 400 && answer.error()?.contains("given more than once"), "{method} {path}: {answer:?}");
    }
    // Without a token, the token is what is wrong (a query says nothing to a stranger).
    ensure!(raw(addr, &get("/status?x=1", None)).await?.status == 401);
    for (method, path, status) in [
        ("GET", "/audit?limit=5", 200),
        ("POST", "/queues/orders/messages?delay_ms=1", 201),
        ("POST", "/queues/orders/pause?for=1m", 200),
        ("POST", "/queues/orders/resume", 200),
        ("POST", "/queues/orders/replies/m1?timeout_ms=1", 409),
        ("GET", "/queues/orders/poison?limit=5", 404),
    ] {
        let answer = raw(addr, &request(method, path, Some(TOKEN), b"x")).await?;
        ensure!(answer.status == status, "{method} {path}: {answer:?}");
    }
    shutdown.cancel();
    Ok(())
}

/// Issue 22, defect 6: `GET /queues/orders/messages?x=1` got 400 (unknown parameter) where
/// the method is what is wrong: a route's method is checked before its query, so a method a
/// path does not take gets 405 with `Allow`, query or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_a_route_does_not_take_gets_405_before_its_query_is_looked_at() -> Result<()> {
    let (addr, shutdown, _task) = serve(ApiLimits::default()).await;
    for (method, path, allow) in
        [("GET", "/queues/orders/messages", "POST"), ("DELETE", "/status", "GET"), ("POST", "/healthz", "GET"), ("PUT", "/queues/orders/poison", "GET")]
    {
        for query in ["", "?x=1", "?delay_ms=1&delay_ms=2"] {
            let answer = raw(addr, &request(method, &format!("{path}{query}"), Some(TOKEN), b"")).await?;
            ensure!(answer.status == 405, "{method} {path}{query}: {answer:?}");
            let allowed = answer.headers.get("allow").cloned().unwrap_or_default();
            ensure!(allowed.contains(allow), "{method} {path}{query}: Allow {allowed:?}");
        }
    }
    shutdown.cancel();
    Ok(())
}

/// A request header is bounded before anything parses it: hyper reads at most its buffer
/// (~400 KiB) of head and answers 431 to a 1 MiB `Authorization` header, never holding the
/// megabyte; the server goes on answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_mib_header_gets_431_without_being_read_whole() -> Result<()> {
    let (addr, shutdown, _task) = serve(ApiLimits::default()).await;
    for header in ["Authorization: Bearer ", "X-Anything: "] {
        let head = format!("GET /status HTTP/1.1\r\nHost: ebb\r\n{header}{}\r\n\r\n", "a".repeat(1 << 20));
        let (mut read, mut write) = TcpStream::connect(addr).await?.into_split();
        let writer = tokio::spawn(async move {
            // The server stops reading at its limit: the rest of the write may be refused.
            let _ = write.write_all(head.as_bytes()).await;
            write
        });
        let answer = tokio::time::timeout(Duration::from_secs(10), read_answer(&mut read)).await.context("no answer")??;
        ensure!(answer.status == 431, "{header}<1 MiB>: {answer:?}");
        drop(writer.await?);
    }
    ensure!(raw(addr, &get("/status", Some(TOKEN))).await?.status == 200, "the server goes on");
    shutdown.cancel();
    Ok(())
}

/// A FIFO queue (issue 37 item 5): a plain put refused as SQS's `.fifo` queue is, a grouped
/// put recorded.
#[derive(Default)]
struct Fifo {
    sent: std::sync::Mutex<Vec<crate::queue::GroupedSend>>,
}

#[async_trait::async_trait]
impl QueueClient for Fifo {
    fn name(&self) -> &str {
        "orders"
    }
    async fn create_if_missing(&self) -> Result<(), crate::queue::QueueError> {
        Ok(())
    }
    async fn put(&self, _: &[u8], _: Duration) -> Result<crate::queue::MessageId, crate::queue::QueueError> {
        Err(crate::queue::QueueError::BadSend("queue orders is a FIFO queue: a send needs a message group id (`group`)".into()))
    }
    fn fifo(&self) -> bool {
        true
    }
    async fn put_in_group(&self, _: &[u8], _: Duration, send: &crate::queue::GroupedSend) -> Result<crate::queue::MessageId, crate::queue::QueueError> {
        self.sent.lock().unwrap().push(send.clone());
        Ok("1".into())
    }
    async fn get(&self, _: u32, _: Duration) -> Result<Vec<crate::queue::Message>, crate::queue::QueueError> {
        Ok(vec![])
    }
    async fn delete(&self, _: &crate::queue::MessageId, _: &crate::queue::PopReceipt) -> Result<(), crate::queue::QueueError> {
        Ok(())
    }
    async fn update_visibility(
        &self,
        _: &crate::queue::MessageId,
        r: &crate::queue::PopReceipt,
        _: Duration,
    ) -> Result<crate::queue::PopReceipt, crate::queue::QueueError> {
        Ok(r.clone())
    }
    async fn approximate_count(&self) -> Result<u64, crate::queue::QueueError> {
        Ok(0)
    }
}

#[tokio::test]
async fn a_fifo_send_takes_group_and_dedup_id_and_without_a_group_is_400_naming_it() -> Result<()> {
    let queue = Arc::new(Fifo::default());
    let (addr, _shutdown, _task) = serve_queue(ApiLimits::default(), queue.clone()).await;
    let send = |query: &str| request("POST", &format!("/queues/orders/messages{query}"), Some(TOKEN), b"x");
    let answer = raw(addr, &send("?group=customer-7&dedup_id=order-42")).await?;
    assert_eq!(answer.status, 201, "{answer:?}");
    let sent = queue.sent.lock().unwrap().clone();
    assert_eq!(sent, [crate::queue::GroupedSend { group: "customer-7".into(), dedup_id: Some("order-42".into()) }]);
    for (query, named) in [("", "`group`"), ("?dedup_id=order-42", "dedup_id: only with group")] {
        let answer = raw(addr, &send(query)).await?;
        assert_eq!(answer.status, 400, "{query}: {answer:?}");
        assert!(answer.error()?.contains(named), "{query}: {answer:?}");
    }
    let items = raw(addr, &request("POST", "/queues/orders/items", Some(TOKEN), b"[\"a\"]")).await?;
    assert_eq!(items.status, 400, "{items:?}");
    assert!(items.error()?.contains("?group="), "{items:?}");

    let plain = Arc::new(MemoryQueue::new("orders", Arc::new(TokioClock::new()), 1024));
    let (addr, _shutdown, _task) = serve_queue(ApiLimits::default(), plain).await;
    let answer = raw(addr, &send("?group=g")).await?;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.error()?.contains("not a FIFO queue"), "{answer:?}");
    Ok(())
}
