//! API requests (send, notify, status, metrics, health) driven straight into the router with
//! arbitrary methods, paths, queries, headers and bodies, against an in-memory queue.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request, StatusCode, Uri, header};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};

use crate::fuzz::budget;
use crate::handler::{Handler, IncomingMessage};
use crate::health::Health;
use crate::http::{Api, ApiLimits};
use crate::listener::Listener;
use crate::queue::memory::MemoryQueue;
use crate::queue::{QueueClient, TokioClock};

const TOKEN: &str = "t0ken";
const QUEUE: &str = "orders";
/// A small body limit, so bodies on both sides of it are cheap to make.
const MAX_BODY: usize = 1024;

struct NoHandler;

#[async_trait]
impl Handler for NoHandler {
    async fn handle(&self, _message: &IncomingMessage) -> anyhow::Result<()> {
        anyhow::bail!("the fuzzed API starts no listener, so no message is handled")
    }
}

/// A fresh API with one queue, `orders`, its listener built but not started, and a token.
fn api() -> (Arc<dyn QueueClient>, axum::Router) {
    let clock = Arc::new(TokioClock::new());
    let queue: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new(QUEUE, clock.clone(), MAX_BODY));
    let poison: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new("orders-poison", clock, MAX_BODY));
    let listener = Listener::builder(queue.clone(), poison, Arc::new(NoHandler)).build();
    let handle = crate::service::QueueHandle::new(QUEUE, queue.clone(), vec![listener.clone()]);
    let api = Api {
        listeners: BTreeMap::from([(QUEUE.to_string(), vec![listener])]),
        handles: BTreeMap::from([(QUEUE.to_string(), handle)]),
        tokens: vec![crate::config::ApiToken { name: "default".into(), role: crate::config::ApiRole::Admin, secret: TOKEN.to_string() }],
        health: Health::default(),
        readiness: Default::default(),
        bus: None,
        audit: None,
        price_per_10k_transactions: crate::cost::PAPER_PRICE_PER_10K,
        queue_prices: Default::default(),
    };
    let limits = ApiLimits { max_body_bytes: MAX_BODY, ..ApiLimits::default() };
    (queue, crate::http::router(Arc::new(api), limits))
}

/// A request as a client could put it on the wire (hyper has already refused what is not HTTP).
#[derive(Debug, Clone)]
struct FuzzRequest {
    method: String,
    path: String,
    query: Option<String>,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

fn strings(options: &'static [&'static str]) -> impl Strategy<Value = String> + Clone {
    proptest::sample::select(options).prop_map(str::to_string)
}

/// Any text, percent-encoded so it fits in a URI.
fn encoded() -> impl Strategy<Value = String> {
    any::<String>().prop_map(|text| form_urlencoded::byte_serialize(text.as_bytes()).collect())
}

fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => strings(&["GET", "POST"]),
        2 => strings(&["PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "TRACE", "CONNECT", "get", "post"]),
        1 => "[A-Z!#$%&'*+.^_`|~-]{1,12}",
    ]
}

fn queue_segment() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => Just(QUEUE.to_string()),
        1 => strings(&["ORDERS", "orders-poison", "other", "%6Frders", "orders%00", "%2F", "", ".", "..", "orders%2Fmessages", "%E2%82%AC", "%ff", "%zz", "%"]),
        1 => encoded(),
    ]
}

fn path() -> impl Strategy<Value = String> {
    let segment =
        prop_oneof![strings(&["queues", "orders", "messages", "notify", "status", "metrics", "healthz", "", ".", "..", "%2e%2e", "Status"]), encoded(),];
    prop_oneof![
        6 => queue_segment().prop_map(|q| format!("/queues/{q}/messages")),
        3 => queue_segment().prop_map(|q| format!("/queues/{q}/notify")),
        3 => strings(&["/status", "/metrics", "/healthz", "/", "/console/app.js", "/status/", "/healthz/", "//status", "/queues", "/queues/", "/queues/orders", "/queues//messages"]),
        2 => proptest::collection::vec(segment, 0..6).prop_map(|segments| format!("/{}", segments.join("/"))),
    ]
}

fn query() -> impl Strategy<Value = Option<String>> {
    let key = prop_oneof![6 => Just("delay_ms".to_string()), 1 => strings(&["delay", "", "DELAY_MS", "%64elay_ms", "delay_ms%00", "x"]), 1 => encoded()];
    let value = prop_oneof![
        4 => (0u64..1_000_000).prop_map(|n| n.to_string()),
        2 => strings(&[
            "0", "604800000", "604800001", "18446744073709551615", "18446744073709551616", "-1", "+1", "%2B1", "1e3", "1.5", "", "%31%30", "%20", "0x10", "%",
        ]),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => encoded(),
    ];
    let pair = (key, proptest::option::weighted(0.9, value)).prop_map(|(k, v)| match v {
        Some(v) => format!("{k}={v}"),
        None => k,
    });
    proptest::option::weighted(
        0.5,
        prop_oneof![4 => proptest::collection::vec(pair, 1..4).prop_map(|pairs| pairs.join("&")), 1 => encoded(), 1 => strings(&["", "&", "=", "&&=&"])],
    )
}

/// Header value bytes HTTP allows: visible ASCII, space, tab and obs-text.
fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(prop_oneof![0x20u8..0x7f, Just(b'\t'), 0x80u8..=0xff], 0..40)
}

fn headers() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
    let authorization = prop_oneof![
        6 => Just(format!("Bearer {TOKEN}").into_bytes()),
        1 => strings(&["Bearer wrong", "bearer t0ken", "Bearer t0ken ", "Bearer  t0ken", "Bearer ", "Bearer", "Basic dDBrZW4=", "t0ken", "Bearer t0ken, Bearer t0ken"])
            .prop_map(String::into_bytes),
        1 => Just(b"Bearer t\xf6ken".to_vec()),
        1 => header_bytes(),
    ]
    .prop_map(|value| ("authorization".to_string(), value));
    let content_length = prop_oneof![
        (0u64..2048).prop_map(|n| n.to_string()),
        strings(&["0", "1024", "1025", "1049600", "1049601", "18446744073709551615", "18446744073709551616", "-1", "abc", " 5", "5, 5", ""]),
    ]
    .prop_map(|value| ("content-length".to_string(), value.into_bytes()));
    let other = prop_oneof![
        (strings(&["content-type"]), strings(&["application/json", "text/plain", "application/octet-stream", "multipart/form-data; boundary=x", ""])),
        (strings(&["transfer-encoding"]), strings(&["chunked", "gzip, chunked", "identity", "x"])),
        (strings(&["expect"]), strings(&["100-continue", "x"])),
        (strings(&["content-encoding"]), strings(&["gzip", "br", "x"])),
        (strings(&["host"]), strings(&["ebb", "", "a:b:c"])),
    ]
    .prop_map(|(name, value)| (name, value.into_bytes()));
    let any_header = ("[a-z][a-z0-9-]{0,15}", header_bytes());
    // Most requests carry the right token up front, so most reach the routes behind it.
    let token = proptest::option::weighted(0.8, Just(("authorization".to_string(), format!("Bearer {TOKEN}").into_bytes())));
    let more = proptest::collection::vec(prop_oneof![2 => authorization, 2 => content_length, 2 => other, 1 => any_header], 0..4);
    (token, more).prop_map(|(token, more)| token.into_iter().chain(more).collect())
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::collection::vec(any::<u8>(), 0..64),
        1 => any::<String>().prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), MAX_BODY - 4..MAX_BODY + 4),
        1 => proptest::collection::vec(any::<u8>(), MAX_BODY * 2..MAX_BODY * 3),
        1 => strings(&["{\"a\":1}", "null", "{", "\u{0}"]).prop_map(String::into_bytes),
    ]
}

fn request() -> impl Strategy<Value = FuzzRequest> {
    (method(), path(), query(), headers(), body()).prop_map(|(method, path, query, headers, body)| FuzzRequest { method, path, query, headers, body })
}

fn build(request: &FuzzRequest) -> Request<Body> {
    let uri = match &request.query {
        Some(query) => format!("{}?{query}", request.path),
        None => request.path.clone(),
    };
    let uri: Uri = uri.parse().unwrap_or_else(|e| panic!("the generator made an invalid URI {uri:?}: {e}"));
    let method = Method::from_bytes(request.method.as_bytes()).expect("the generator makes method tokens");
    let mut built = Request::builder().method(method).uri(uri).body(Body::from(request.body.clone())).expect("a request from valid parts");
    for (name, value) in &request.headers {
        let name = HeaderName::from_bytes(name.as_bytes()).expect("the generator makes header names");
        let value = HeaderValue::from_bytes(value).expect("the generator makes header values");
        built.headers_mut().append(name, value);
    }
    built
}

/// Sends one request and checks the answer: never a panic or a 5xx, every error JSON with a
/// reason, nothing but `/healthz` without the token, and a send taken stores its body.
async fn check(request: FuzzRequest) -> Result<(), TestCaseError> {
    let (queue, router) = api();
    let built = build(&request);
    let path = built.uri().path().to_string();
    let method = built.method().clone();
    // Exactly one Authorization header, with the token: two are no credential, whatever they
    // say. The scheme is case-insensitive (RFC 9110): `bearer t0ken` is the token too.
    let credentials: Vec<_> = built.headers().get_all(header::AUTHORIZATION).iter().collect();
    let authorized = matches!(credentials.as_slice(), [only] if only.as_bytes().len() == 7 + TOKEN.len()
        && only.as_bytes()[..7].eq_ignore_ascii_case(b"bearer ")
        && &only.as_bytes()[7..] == TOKEN.as_bytes());
    let declared_length = built.headers().contains_key(header::CONTENT_LENGTH) || built.headers().contains_key(header::TRANSFER_ENCODING);
    let response = tower_service::Service::call(&mut router.clone(), built).await.unwrap_or_else(|never| match never {});
    let status = response.status();
    let content_type = response.headers().get(header::CONTENT_TYPE).map(|v| v.as_bytes().to_vec());
    let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.map_err(|e| TestCaseError::fail(format!("unreadable answer: {e}")))?;

    prop_assert!(!status.is_server_error(), "{} for {:?}: {}", status, request, String::from_utf8_lossy(&body));
    if status.is_client_error() {
        prop_assert!(content_type.as_deref().is_some_and(|t| t.starts_with(b"application/json")), "{} without JSON for {:?}", status, request);
    }
    // A HEAD answer's body never reaches the client (hyper sends none), so only its headers count.
    if status.is_client_error() && method != Method::HEAD {
        let value: serde_json::Value = serde_json::from_slice(&body).map_err(|e| TestCaseError::fail(format!("{status}: not JSON ({e}) for {request:?}")))?;
        let reason = value["error"].as_str().unwrap_or_default();
        prop_assert!(!reason.trim().is_empty(), "{} without a reason for {:?}: {}", status, request, value);
    }
    let read = method == Method::GET || method == Method::HEAD;
    let health = path == "/healthz" && read;
    // The console's files hold no data: the page loads, then asks for the token.
    let console_file = matches!(path.as_str(), "/" | "/console/app.js" | "/console/app.css") && read;
    if !authorized && !health && !console_file {
        prop_assert!(!status.is_success(), "{} without the token for {:?}", status, request);
    }

    let stored = queue.approximate_count().await.map_err(|e| TestCaseError::fail(format!("count: {e}")))?;
    if status == StatusCode::CREATED {
        prop_assert!(path == "/queues/orders/messages" || path == "/queues/%6Frders/messages", "201 on {}", path);
        prop_assert_eq!(stored, 1);
        let value: serde_json::Value = serde_json::from_slice(&body).map_err(|e| TestCaseError::fail(format!("201 not JSON: {e}")))?;
        prop_assert!(value["id"].is_string(), "201 without an id: {}", value);
        if let Some(message) = queue.get(32, Duration::from_secs(30)).await.map_err(|e| TestCaseError::fail(format!("get: {e}")))?.pop() {
            prop_assert_eq!(message.body, request.body.clone(), "the stored body differs from the one sent");
        }
    } else {
        prop_assert_eq!(stored, 0, "{} stored a message for {:?}", status, request);
    }

    // The plain cases have a known answer: a clean send is stored, a clean notify accepted.
    let clean = authorized && method == Method::POST && request.query.is_none() && !declared_length;
    if clean && path == "/queues/orders/messages" {
        let expected = if request.body.len() <= MAX_BODY { StatusCode::CREATED } else { StatusCode::PAYLOAD_TOO_LARGE };
        prop_assert_eq!(status, expected, "for {:?}", request);
    }
    if clean && path == "/queues/orders/notify" {
        prop_assert_eq!(status, StatusCode::ACCEPTED, "for {:?}", request);
    }
    Ok(())
}

/// Arbitrary requests: no panic and no 5xx; every error is `{"error": reason}`; only
/// `/healthz` and the console's files answer without the token; an accepted send stores exactly its body, and only
/// it stores anything.
#[test]
fn no_request_panics_or_gets_a_5xx_and_every_error_is_json() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
    let mut runner = TestRunner::new(budget(1000));
    if let Err(failure) = runner.run(&request(), |request| runtime.block_on(check(request))) {
        panic!("{failure}");
    }
}
