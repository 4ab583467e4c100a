//! A faulty network in front of Azurite: an HTTP/1.1 proxy on 127.0.0.1 that, for a seeded
//! random share of requests, answers `503 ServerBusy` (as Azure does when a partition is hot)
//! or drops the connection, before or after forwarding the request (so the service may have
//! done the work and the client never hears of it). Everything else is forwarded. It can
//! also stand for an outage (every connection dropped) or for a credential the service no
//! longer takes (every request answered `403 AuthenticationFailed`, as Azure answers a SAS
//! past its expiry).
//!
//! It speaks just enough HTTP for the Azure SDK's requests: a head, then a body of
//! `Content-Length` bytes; responses go back with a `Content-Length`. It serves the AWS SDK's
//! SQS requests too (JSON, the operation in `X-Amz-Target`), in front of moto: its 503 then
//! comes in SQS's form, and it can throttle a seeded share of them as SQS does
//! ([`FaultProxy::set_throttling`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy did, request by request.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FaultCounts {
    /// Requests forwarded and answered.
    pub forwarded: u64,
    /// Requests answered `503 ServerBusy` without forwarding.
    pub server_busy: u64,
    /// SQS requests answered with SQS's throttling error without forwarding.
    pub throttled: u64,
    /// Connections closed before the request was forwarded.
    pub dropped_before: u64,
    /// Requests forwarded, then the connection closed without the answer.
    pub dropped_after: u64,
    /// Of those, gets of messages: the service leased them and nobody heard of it, so they
    /// come back only when that lease runs out.
    pub dropped_get_answers: u64,
    /// Of those, deletes: the service deleted the message and nobody heard of it.
    pub dropped_delete_answers: u64,
}

impl FaultCounts {
    /// Requests that met a fault.
    pub fn faults(&self) -> u64 {
        self.server_busy + self.throttled + self.dropped_before + self.dropped_after
    }
}

#[derive(Default)]
struct Counters {
    forwarded: AtomicU64,
    server_busy: AtomicU64,
    throttled: AtomicU64,
    dropped_before: AtomicU64,
    dropped_after: AtomicU64,
    dropped_get_answers: AtomicU64,
    dropped_delete_answers: AtomicU64,
}

/// Which share (0..=1) of requests meets each fault; the rest are forwarded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultMix {
    /// Answered `503 ServerBusy` without forwarding.
    pub server_busy: f64,
    /// Connection closed before forwarding.
    pub drop_before: f64,
    /// Forwarded, then the connection closed without the answer.
    pub drop_after: f64,
}

impl FaultMix {
    /// `share` of requests fault, half of them 503 ServerBusy, a quarter dropped before
    /// forwarding, a quarter after.
    pub fn even(share: f64) -> FaultMix {
        FaultMix { server_busy: share / 2.0, drop_before: share / 4.0, drop_after: share / 4.0 }
    }
}

struct Shared {
    upstream: String,
    mix: FaultMix,
    rng: Mutex<fastrand::Rng>,
    counters: Counters,
    client: reqwest::Client,
    /// Requests answered by the service: (method, path without the query, status).
    log: Mutex<Vec<(String, String, u16)>>,
    /// The SQS requests of those: (operation, body).
    sqs_log: Mutex<Vec<(String, String)>>,
    /// An outage: every request's connection is dropped before it is forwarded.
    down: std::sync::atomic::AtomicBool,
    /// A refused credential: every request is answered 403 AuthenticationFailed.
    refusing: std::sync::atomic::AtomicBool,
    /// The share (0..=1) of SQS requests throttled, as `f64` bits; drawn before the mix.
    throttling: AtomicU64,
    /// Every SQS request as it arrived: when, its operation and body, and whether it was
    /// throttled.
    sqs_arrivals: Mutex<Vec<SqsArrival>>,
    /// Each answered `ReceiveMessage`: when its answer came, and the ids of its messages.
    sqs_received: Mutex<Vec<(std::time::Instant, Vec<String>)>>,
}

/// An SQS request as the proxy received it.
#[derive(Debug, Clone)]
pub struct SqsArrival {
    /// When it arrived.
    pub at: std::time::Instant,
    /// Its operation (`X-Amz-Target` without `AmazonSQS.`).
    pub operation: String,
    /// Its JSON body.
    pub body: String,
    /// Whether the proxy answered it with a throttling error.
    pub throttled: bool,
}

/// The proxy; it stops when dropped.
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

enum Fate {
    Refuse,
    Forward,
    Busy,
    Throttle,
    DropBefore,
    DropAfter,
}

impl FaultProxy {
    /// Starts a proxy to `upstream_port` on 127.0.0.1 that faults `fault_share` (0..=1) of
    /// requests, split evenly between 503 ServerBusy and dropped connections (half of those
    /// before forwarding, half after), chosen by a generator seeded with `seed`.
    pub async fn start(upstream_port: u16, fault_share: f64, seed: u64) -> FaultProxy {
        FaultProxy::start_with_mix(upstream_port, FaultMix::even(fault_share), seed).await
    }

    /// Starts a proxy to `upstream_port` on 127.0.0.1 that faults requests in the shares of
    /// `mix`, chosen by a generator seeded with `seed`.
    pub async fn start_with_mix(upstream_port: u16, mix: FaultMix, seed: u64) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a local port for the fault proxy");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream: format!("http://127.0.0.1:{upstream_port}"),
            mix,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            counters: Counters::default(),
            client: reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap(),
            log: Mutex::default(),
            sqs_log: Mutex::default(),
            down: std::sync::atomic::AtomicBool::new(false),
            refusing: std::sync::atomic::AtomicBool::new(false),
            throttling: AtomicU64::new(0f64.to_bits()),
            sqs_arrivals: Mutex::default(),
            sqs_received: Mutex::default(),
        });
        let accepting = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(accepting.clone(), stream));
            }
        });
        FaultProxy { port, shared, task }
    }

    /// Starts (`true`) or ends an outage: meanwhile every request's connection is dropped
    /// before it reaches the service (counted as dropped before).
    pub fn set_down(&self, down: bool) {
        self.shared.down.store(down, Ordering::Relaxed);
    }

    /// Starts (`true`) or ends refusing the credential: meanwhile every request is answered
    /// `403 AuthenticationFailed` without reaching the service, as Azure answers an expired SAS.
    pub fn set_refusing(&self, refusing: bool) {
        self.shared.refusing.store(refusing, Ordering::Relaxed);
    }

    /// From now on, answers a seeded share (0..=1) of SQS requests with SQS's throttling
    /// error, without forwarding them: HTTP 400 in the AWS JSON 1.0 protocol's shape with the
    /// query-compatible code header, as `RequestThrottled` and `ThrottlingException` in turn.
    /// The share is drawn before the [`FaultMix`]'s, which the rest of the requests meet.
    pub fn set_throttling(&self, share: f64) {
        self.shared.throttling.store(share.to_bits(), Ordering::Relaxed);
    }

    /// Every SQS request as it arrived, in order.
    pub fn sqs_arrivals(&self) -> Vec<SqsArrival> {
        self.shared.sqs_arrivals.lock().unwrap().clone()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The queue endpoint through the proxy, for the development account.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{}", self.port, ebb::queue::azure::DEVELOPMENT_ACCOUNT)
    }

    /// A connection string for the development account through the proxy.
    pub fn connection_string(&self) -> String {
        use ebb::queue::azure::{DEVELOPMENT_ACCOUNT, DEVELOPMENT_KEY};
        format!("DefaultEndpointsProtocol=http;AccountName={DEVELOPMENT_ACCOUNT};AccountKey={DEVELOPMENT_KEY};QueueEndpoint={}", self.endpoint())
    }

    /// The development account through the proxy.
    pub fn account(&self) -> ebb::queue::azure::AzureAccount {
        ebb::queue::azure::AzureAccount::from_connection_string(&self.connection_string()).expect("the connection string parses")
    }

    /// The requests the service answered (dropped answers included): method, path without
    /// the query, status.
    pub fn answered(&self) -> Vec<(String, String, u16)> {
        self.shared.log.lock().unwrap().clone()
    }

    /// The SQS requests the service answered (dropped answers included): the operation
    /// (`X-Amz-Target` without `AmazonSQS.`) and the JSON body, in order.
    pub fn sqs_requests(&self) -> Vec<(String, String)> {
        self.shared.sqs_log.lock().unwrap().clone()
    }

    /// Each `ReceiveMessage` the service answered: when, and the ids of the messages it gave.
    pub fn sqs_received(&self) -> Vec<(std::time::Instant, Vec<String>)> {
        self.shared.sqs_received.lock().unwrap().clone()
    }

    /// What it did so far.
    pub fn counts(&self) -> FaultCounts {
        let c = &self.shared.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FaultCounts {
            forwarded: load(&c.forwarded),
            server_busy: load(&c.server_busy),
            throttled: load(&c.throttled),
            dropped_before: load(&c.dropped_before),
            dropped_after: load(&c.dropped_after),
            dropped_get_answers: load(&c.dropped_get_answers),
            dropped_delete_answers: load(&c.dropped_delete_answers),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A parsed request: method, path and query, headers, body.
struct Request {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// Reads one request from `stream` (None at the end of the connection or on nonsense).
async fn read_request(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<Request> {
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let (method, target) = (request_line.next()?.to_string(), request_line.next()?.to_string());
    let headers: Vec<(String, String)> =
        lines.filter(|l| !l.is_empty()).filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect();
    let length: usize = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("content-length")).and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    while buffer.len() < head_end + length {
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = buffer[head_end..head_end + length].to_vec();
    buffer.drain(..head_end + length);
    Some(Request { method, target, headers, body })
}

async fn serve(shared: Arc<Shared>, mut stream: TcpStream) {
    let mut buffer = Vec::new();
    while let Some(request) = read_request(&mut stream, &mut buffer).await {
        let fate = {
            let mut rng = shared.rng.lock().unwrap();
            let roll = rng.f64();
            let FaultMix { server_busy, drop_before, drop_after } = shared.mix;
            // Only SQS requests are throttled; with no throttling the mix is drawn as before.
            let throttling = if sqs_operation(&request).is_some() { f64::from_bits(shared.throttling.load(Ordering::Relaxed)) } else { 0.0 };
            let (throttle, roll) = (roll < throttling, (roll - throttling).max(0.0));
            if shared.down.load(Ordering::Relaxed) {
                Fate::DropBefore
            } else if shared.refusing.load(Ordering::Relaxed) {
                Fate::Refuse
            } else if throttle {
                Fate::Throttle
            } else if roll < server_busy {
                Fate::Busy
            } else if roll < server_busy + drop_before {
                Fate::DropBefore
            } else if roll < server_busy + drop_before + drop_after {
                Fate::DropAfter
            } else {
                Fate::Forward
            }
        };
        let counters = &shared.counters;
        if let Some(operation) = sqs_operation(&request) {
            let arrival = SqsArrival {
                at: std::time::Instant::now(),
                operation: operation.to_string(),
                body: String::from_utf8_lossy(&request.body).into_owned(),
                throttled: matches!(fate, Fate::Throttle),
            };
            shared.sqs_arrivals.lock().unwrap().push(arrival);
        }
        match fate {
            Fate::Refuse => {
                let body = "\u{feff}<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>AuthenticationFailed</Code><Message>Server failed to authenticate the request (fault proxy).</Message><AuthenticationErrorDetail>Signed expiry time must be after the current time</AuthenticationErrorDetail></Error>";
                let response = format!(
                    "HTTP/1.1 403 Server failed to authenticate the request.\r\nContent-Type: application/xml\r\nx-ms-error-code: AuthenticationFailed\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                if stream.write_all(response.as_bytes()).await.is_err() {
                    return;
                }
            }
            Fate::Busy if sqs_operation(&request).is_some() => {
                counters.server_busy.fetch_add(1, Ordering::Relaxed);
                let body = r#"{"__type":"com.amazonaws.sqs#ServiceUnavailable","message":"The service is unavailable (fault proxy)."}"#;
                let response = format!(
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/x-amz-json-1.0\r\nx-amzn-query-error: ServiceUnavailable;Receiver\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                if stream.write_all(response.as_bytes()).await.is_err() {
                    return;
                }
            }
            Fate::Throttle => {
                let nth = counters.throttled.fetch_add(1, Ordering::Relaxed);
                if stream.write_all(throttled_answer(nth).as_bytes()).await.is_err() {
                    return;
                }
            }
            Fate::Busy => {
                counters.server_busy.fetch_add(1, Ordering::Relaxed);
                let body = "\u{feff}<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>ServerBusy</Code><Message>The server is busy (fault proxy).</Message></Error>";
                let response = format!(
                    "HTTP/1.1 503 The server is busy.\r\nContent-Type: application/xml\r\nx-ms-error-code: ServerBusy\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                if stream.write_all(response.as_bytes()).await.is_err() {
                    return;
                }
            }
            Fate::DropBefore => {
                counters.dropped_before.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Fate::Forward | Fate::DropAfter => {
                let operation = sqs_operation(&request);
                let gets_messages = (request.method == "GET" && request.target.split('?').next().unwrap_or_default().ends_with("/messages"))
                    || operation == Some("ReceiveMessage");
                let deletes = (request.method == "DELETE" && request.target.to_ascii_lowercase().contains("popreceipt="))
                    || matches!(operation, Some("DeleteMessage" | "DeleteMessageBatch"));
                let Some(response) = forward(&shared, request).await else { return };
                if matches!(fate, Fate::DropAfter) {
                    counters.dropped_after.fetch_add(1, Ordering::Relaxed);
                    if gets_messages {
                        counters.dropped_get_answers.fetch_add(1, Ordering::Relaxed);
                    }
                    if deletes {
                        counters.dropped_delete_answers.fetch_add(1, Ordering::Relaxed);
                    }
                    return;
                }
                counters.forwarded.fetch_add(1, Ordering::Relaxed);
                if stream.write_all(&response).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// SQS's answer to a throttled request in the AWS JSON 1.0 protocol the AWS SDK speaks to
/// it: 400, the error's shape id in `__type`, and (SQS being query-compatible) the legacy
/// code and fault in `x-amzn-query-error`, which the SDK takes as the error code. SQS's own
/// `RequestThrottled` and AWS's common `ThrottlingException` in turn (`nth` throttled so far).
fn throttled_answer(nth: u64) -> String {
    let (shape, code) = match nth % 2 {
        0 => ("com.amazonaws.sqs#RequestThrottled", "RequestThrottled"),
        _ => ("com.amazon.coral.availability#ThrottlingException", "ThrottlingException"),
    };
    let body = format!(r#"{{"__type":"{shape}","message":"Rate exceeded (fault proxy)."}}"#);
    format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/x-amz-json-1.0\r\nx-amzn-query-error: {code};Sender\r\nx-amzn-RequestId: fault-proxy-{nth}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The SQS operation an AWS SDK request calls (`X-Amz-Target: AmazonSQS.<operation>`).
fn sqs_operation(request: &Request) -> Option<&str> {
    request.headers.iter().find(|(name, _)| name.eq_ignore_ascii_case("x-amz-target")).and_then(|(_, value)| value.strip_prefix("AmazonSQS."))
}

/// Sends `request` upstream; the answer as bytes to write back, with a `Content-Length`.
async fn forward(shared: &Shared, request: Request) -> Option<Vec<u8>> {
    let method = reqwest::Method::from_bytes(request.method.as_bytes()).ok()?;
    let path = request.target.split('?').next().unwrap_or_default().to_string();
    let logged_method = request.method.clone();
    let sqs = sqs_operation(&request).map(|operation| (operation.to_string(), String::from_utf8_lossy(&request.body).into_owned()));
    let receives = sqs_operation(&request) == Some("ReceiveMessage");
    let mut upstream = shared.client.request(method, format!("{}{}", shared.upstream, request.target));
    for (name, value) in &request.headers {
        let skip = ["host", "connection", "content-length", "transfer-encoding"].iter().any(|h| name.eq_ignore_ascii_case(h));
        if !skip {
            upstream = upstream.header(name.as_str(), value.as_str());
        }
    }
    upstream = upstream.body(request.body);
    let answer = upstream.send().await.ok()?;
    let status = answer.status();
    shared.log.lock().unwrap().push((logged_method, path, status.as_u16()));
    if let Some(sqs) = sqs {
        shared.sqs_log.lock().unwrap().push(sqs);
    }
    let mut head = format!("HTTP/1.1 {} {}\r\n", status.as_u16(), status.canonical_reason().unwrap_or("Unknown"));
    for (name, value) in answer.headers() {
        let skip = ["connection", "content-length", "transfer-encoding", "keep-alive"].iter().any(|h| name.as_str().eq_ignore_ascii_case(h));
        if !skip {
            head.push_str(&format!("{}: {}\r\n", name, value.to_str().unwrap_or_default()));
        }
    }
    let body = answer.bytes().await.ok()?;
    if receives && status.is_success() {
        let ids = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|answer| {
            answer["Messages"].as_array().map(|messages| messages.iter().filter_map(|m| m["MessageId"].as_str().map(String::from)).collect())
        });
        shared.sqs_received.lock().unwrap().push((std::time::Instant::now(), ids.unwrap_or_default()));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut out = head.into_bytes();
    out.extend_from_slice(&body);
    Some(out)
}
