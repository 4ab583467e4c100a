//! The HTTP API: `GET /status`, `GET /metrics`, `GET /healthz`,
//! `POST /queues/{name}/messages`, `POST /queues/{name}/notify`.
//! When a token is configured, every route but `/healthz` requires `Authorization: Bearer <token>`.
//!
//! Every error answer is JSON, `{"error": "<reason>"}`. [`serve`] runs the API on hyper with a
//! header-read timeout and an idle timeout per connection ([`ApiLimits`]), so slow or idle
//! clients cannot hold connections open forever.

use std::collections::BTreeMap;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Extension, Path, RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use crate::config::ApiLimits;
use crate::cost::CostStatus;
use crate::health::Health;
use crate::listener::{Listener, ListenerStatus};
use crate::queue::{MAX_VISIBILITY, QueueClient, QueueError};

/// What the API serves.
pub struct Api {
    /// Listeners by (logical) queue name: one, or one per partition.
    pub listeners: BTreeMap<String, Vec<Listener>>,
    /// Queue clients by (logical) queue name, for sends: a partitioned queue spreads them.
    pub queues: BTreeMap<String, Arc<dyn QueueClient>>,
    /// Required bearer token, if any.
    pub token: Option<String>,
    /// The host's health, answered by `/healthz`.
    pub health: Health,
    /// Push notifications to the other hosts, if a bus is configured.
    pub bus: Option<Arc<crate::bus::Bus>>,
    /// US dollars per 10,000 storage transactions, for the cost figures of `/status` and
    /// `/metrics` (config `price_per_10k_transactions`).
    pub price_per_10k_transactions: f64,
}

/// Serves the API on `listener` until `shutdown` is cancelled, then stops accepting, lets
/// every open connection finish its request in progress (idle ones close at once) and returns.
pub async fn serve(listener: TcpListener, api: Arc<Api>, shutdown: CancellationToken, limits: ApiLimits) -> anyhow::Result<()> {
    let router = router(api, limits);
    let connections = TaskTracker::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        // Accept only with a free slot: the rest wait in the backlog, holding no descriptor of ours.
        let slot = tokio::select! {
            () = shutdown.cancelled() => break,
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        let stream = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    // Out of file descriptors, or a connection reset before it was accepted:
                    // not the server's end. Pause briefly so a full table is not spun on.
                    tracing::debug!("API accept failed: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let connection = serve_connection(stream, router.clone(), shutdown.clone(), limits);
        connections.spawn(async move {
            connection.await;
            drop(slot);
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

/// One connection: HTTP/1.1 with keep-alive, the header-read timeout, the idle timeout, and a
/// graceful close on shutdown.
async fn serve_connection(stream: TcpStream, router: Router, shutdown: CancellationToken, limits: ApiLimits) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked { inner: stream, activity: activity.clone() });
    let service = hyper::service::service_fn(move |request: Request<Incoming>| tower_service::Service::call(&mut router.clone(), request));
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let mut closing = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!("API connection ended: {error}");
                }
                return;
            }
            () = shutdown.cancelled(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = activity.idle_for(limits.idle_timeout) => {
                tracing::debug!("closing an API connection idle for {}", humantime::format_duration(limits.idle_timeout));
                return;
            }
        }
    }
}

/// When a connection last moved a byte.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity { start: Instant::now(), last_ms: AtomicU64::new(0) }
    }

    fn touch(&self) {
        let now = self.start.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// Completes once no byte has moved for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            let deadline = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed)) + timeout;
            if deadline <= Instant::now() {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A stream that records its activity.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.touch();
        }
        result
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        result
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The API's routes, with the body limit of `limits`.
pub fn router(api: Arc<Api>, limits: ApiLimits) -> Router {
    let authenticated = Router::new()
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route("/queues/{name}/messages", post(send))
        .route("/queues/{name}/notify", post(notify))
        .layer(middleware::from_fn_with_state(api.clone(), require_token));
    Router::new()
        .route("/healthz", get(healthz))
        .merge(authenticated)
        .with_state(api)
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(middleware::from_fn_with_state(limits, reject_declared_large_bodies))
        .layer(Extension(limits))
        .layer(middleware::from_fn(json_errors))
}

/// `{"error": reason}` with `status`.
fn error(status: StatusCode, reason: impl Into<String>) -> Response {
    (status, Json(json!({ "error": reason.into() }))).into_response()
}

/// Turns every error answer that is not JSON yet (axum's empty 404 and 405, plain-text
/// rejections) into `{"error": reason}`, keeping its status and headers (`Allow` on a 405).
async fn json_errors(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10).await.map(|b| String::from_utf8_lossy(&b).trim().to_string()).unwrap_or_default();
    let reason = match status {
        StatusCode::NOT_FOUND => format!("no route {method} {path}"),
        StatusCode::METHOD_NOT_ALLOWED => {
            // axum drops the Allow header when a layer wraps the route, so it comes from here.
            let allowed = allowed_methods(&path);
            parts.headers.insert(header::ALLOW, HeaderValue::from_static(allowed));
            format!("{method} is not allowed on {path} (allowed: {allowed})")
        }
        _ if !text.is_empty() => text,
        _ => status.canonical_reason().unwrap_or("error").to_lowercase(),
    };
    let body = serde_json::to_vec(&json!({ "error": reason })).unwrap_or_default();
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

/// The methods a route of [`router`] takes.
fn allowed_methods(path: &str) -> &'static str {
    if path.starts_with("/queues/") { "POST" } else { "GET" }
}

/// The 413 answer to a body larger than the limit.
fn too_large(limits: ApiLimits) -> Response {
    error(StatusCode::PAYLOAD_TOO_LARGE, format!("the message is larger than max_message_bytes ({} bytes)", limits.max_body_bytes))
}

/// Of a body declared over the limit, how much is read and thrown away before the 413, and
/// for how long: a client still writing its body when the connection closes sees a reset
/// instead of the answer.
const DISCARD_BYTES: u64 = 1 << 20;
const DISCARD_TIME: Duration = Duration::from_secs(1);

/// Answers 413 to a request whose Content-Length is over the limit without keeping its body
/// (the body limit catches chunked bodies as they are read). A body not much over the limit
/// is read and discarded first (at most [`DISCARD_BYTES`] for [`DISCARD_TIME`]), so the
/// client gets to read the answer.
async fn reject_declared_large_bodies(State(limits): State<ApiLimits>, request: Request, next: Next) -> Response {
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let Some(declared) = declared.filter(|length| *length > limits.max_body_bytes as u64) else {
        return next.run(request).await;
    };
    if declared <= limits.max_body_bytes as u64 + DISCARD_BYTES {
        let mut body = request.into_body().into_data_stream();
        let _ = tokio::time::timeout(DISCARD_TIME, async {
            use futures::StreamExt as _;
            while let Some(Ok(_)) = body.next().await {}
        })
        .await;
    }
    too_large(limits)
}

/// True when `given` is the token, compared in constant time (both sides hashed first, so
/// neither the content nor the length of the token leaks through timing).
pub(crate) fn token_matches(token: &str, given: Option<&str>) -> bool {
    let expected = Sha256::digest(token.as_bytes());
    let given = Sha256::digest(given.unwrap_or_default().as_bytes());
    bool::from(expected.as_slice().ct_eq(given.as_slice()))
}

async fn require_token(State(api): State<Arc<Api>>, request: Request, next: Next) -> Response {
    if let Some(token) = &api.token {
        let given = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        if given.is_none() || !token_matches(token, given) {
            return error(StatusCode::UNAUTHORIZED, "missing or wrong API token (Authorization: Bearer <token>)");
        }
    }
    next.run(request).await
}

/// 200 `ok` when healthy; 503 with every problem (JSON) when a component cannot work.
async fn healthz(State(api): State<Arc<Api>>) -> Response {
    let problems = api.health.problems();
    if problems.is_empty() {
        return "ok\n".into_response();
    }
    (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": "the host cannot do its work", "problems": problems }))).into_response()
}

fn statuses(api: &Api) -> Vec<ListenerStatus> {
    api.listeners.values().flatten().map(Listener::status).collect()
}

/// A queue's live cost figures (`None` when its transactions are not metered).
fn queue_cost(status: &ListenerStatus, price: f64) -> Option<CostStatus> {
    status.transaction_rates.map(|rates| CostStatus::new(rates, price))
}

/// The sums over a partitioned queue's partitions.
fn partitioned_status(queue: &str, listeners: &[Listener], price: f64) -> serde_json::Value {
    let statuses: Vec<ListenerStatus> = listeners.iter().map(Listener::status).collect();
    let costs: Vec<CostStatus> = statuses.iter().filter_map(|s| queue_cost(s, price)).collect();
    let sum = |f: fn(&ListenerStatus) -> u64| statuses.iter().map(f).fold(0u64, u64::saturating_add);
    json!({
        "queue": queue,
        "partitions": statuses.iter().map(|s| s.queue.clone()).collect::<Vec<_>>(),
        "approximate_depth": sum(|s| s.approximate_depth),
        "active_tasks": sum(|s| s.active_tasks.into()),
        "in_flight": sum(|s| s.in_flight.into()),
        "processed": sum(|s| s.processed),
        "failed": sum(|s| s.failed),
        "poisoned": sum(|s| s.poisoned),
        "cost": CostStatus::total(&costs, price),
    })
}

async fn status(State(api): State<Arc<Api>>) -> Json<serde_json::Value> {
    let price = api.price_per_10k_transactions;
    let partitioned: Vec<_> = api.listeners.iter().filter(|(_, l)| l.len() > 1).map(|(queue, l)| partitioned_status(queue, l, price)).collect();
    let mut costs = Vec::new();
    let queues: Vec<serde_json::Value> = statuses(&api)
        .into_iter()
        .map(|s| {
            let cost = queue_cost(&s, price);
            costs.extend(cost);
            let mut value = serde_json::to_value(&s).unwrap_or_default();
            value["cost"] = json!(cost);
            value
        })
        .collect();
    let bus = api.bus.as_ref().map(|b| b.status());
    let storage = crate::storage_metrics::status(api.queues.values());
    Json(json!({ "queues": queues, "partitioned": partitioned, "cost": CostStatus::total(&costs, price), "bus": bus, "storage": storage }))
}

/// Parses the query of `POST /queues/{name}/messages`: only `delay_ms`, a whole number of
/// milliseconds up to [`MAX_VISIBILITY`].
fn parse_send_query(query: Option<&str>) -> Result<Duration, String> {
    let mut delay = None;
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if key != "delay_ms" {
            return Err(format!("unknown query parameter {key:?} (this route takes only delay_ms)"));
        }
        if delay.is_some() {
            return Err("delay_ms: given more than once".into());
        }
        // Digits only: u64's parser would take a sign.
        let ms: u64 = Some(value.as_ref())
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("delay_ms: {value:?} is not a whole number of milliseconds"))?;
        if u128::from(ms) > MAX_VISIBILITY.as_millis() {
            return Err(format!("delay_ms: {ms} is more than {} (7 days), the longest a message may stay invisible", MAX_VISIBILITY.as_millis()));
        }
        delay = Some(Duration::from_millis(ms));
    }
    Ok(delay.unwrap_or_default())
}

async fn send(
    State(api): State<Arc<Api>>,
    Extension(limits): Extension<ApiLimits>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let Some(queue) = api.queues.get(&name) else {
        return error(StatusCode::NOT_FOUND, format!("no queue named {name} on this host"));
    };
    let delay = match parse_send_query(query.as_deref()) {
        Ok(delay) => delay,
        Err(reason) => return error(StatusCode::BAD_REQUEST, reason),
    };
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => return too_large(limits),
        Err(rejection) => return error(rejection.status(), rejection.body_text()),
    };
    // Storage that stalls (each try may wait its request timeout, and retries add up) must
    // still get the client an answer, before its connection times out or the client gives up.
    let deadline = SEND_DEADLINE.min(limits.idle_timeout / 2);
    let put = match tokio::time::timeout(deadline, queue.put(&body, delay)).await {
        Ok(put) => put,
        Err(_) => Err(QueueError::Transient(anyhow::anyhow!("storage did not answer within {}", humantime::format_duration(deadline)))),
    };
    match put {
        Ok(id) => {
            // The host saw the message arrive: no need to wait for a poll to notice it (a
            // delayed one, once its delay is over).
            for listener in api.listeners.get(&name).into_iter().flatten() {
                listener.work_detected_after(delay);
            }
            if let Some(bus) = &api.bus {
                bus.publish(&name, Some(1));
            }
            (StatusCode::CREATED, Json(json!({ "id": id }))).into_response()
        }
        Err(e @ QueueError::MessageTooLarge { .. }) => error(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()),
        // The sender's to fix: retrying the same body can never work.
        Err(e @ QueueError::InvalidBody(_)) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// The longest a send waits for storage before answering 503 (at most half the API's
/// `idle_timeout`; under `ebb send`'s 30 s).
const SEND_DEADLINE: Duration = Duration::from_secs(20);

async fn notify(State(api): State<Arc<Api>>, Path(name): Path<String>, RawQuery(query): RawQuery) -> Response {
    if let Some((key, _)) = form_urlencoded::parse(query.unwrap_or_default().as_bytes()).next() {
        return error(StatusCode::BAD_REQUEST, format!("unknown query parameter {key:?} (this route takes none)"));
    }
    match api.listeners.get(&name) {
        Some(listeners) => {
            for listener in listeners {
                listener.work_detected();
            }
            // Messages put straight into storage concern every host on the queue.
            if let Some(bus) = &api.bus {
                bus.publish(&name, None);
            }
            StatusCode::ACCEPTED.into_response()
        }
        None => error(StatusCode::NOT_FOUND, format!("no queue named {name} on this host")),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RateLabel {
    queue: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransactionLabel {
    queue: String,
    kind: &'static str,
}

async fn metrics(State(api): State<Arc<Api>>) -> Response {
    let mut registry = Registry::with_prefix("ebb");
    let gauge = |registry: &mut Registry, name: &str, help: &str| {
        let family = Family::<QueueLabel, Gauge>::default();
        registry.register(name, help, family.clone());
        family
    };
    let counter = |registry: &mut Registry, name: &str, help: &str| {
        let family = Family::<QueueLabel, Counter>::default();
        registry.register(name, help, family.clone());
        family
    };
    let depth = gauge(&mut registry, "queue_depth", "Approximate messages in the queue (current on the embedded store; see depth_as_of in /status)");
    let active = gauge(&mut registry, "active_tasks", "Dequeue tasks running");
    let target = gauge(&mut registry, "target_tasks", "The rule's last task count");
    let in_flight = gauge(&mut registry, "in_flight", "Messages being handled");
    let processed = counter(&mut registry, "messages_processed", "Messages handled and deleted");
    let failed = counter(&mut registry, "messages_failed", "Handler failures");
    let poisoned = counter(&mut registry, "messages_poisoned", "Messages moved to the poison queue");
    let poisoned_corrupt = counter(&mut registry, "messages_poisoned_corrupt", "Messages poisoned because their stored body failed its checksum");
    let poisoned_body_only = counter(&mut registry, "messages_poisoned_body_only", "Poisoned messages moved as the bare body because the envelope did not fit");
    let handler_panics = counter(&mut registry, "handler_panics", "Handler calls that panicked (counted as failures)");
    let host_errors =
        counter(&mut registry, "handler_host_errors", "Handler calls the host could not make (out of file descriptors); retried, never poisoned for");
    let poison_failures =
        counter(&mut registry, "poison_failures", "Poisonings the poison queue refused (the message stays, tried again after max_retry_delay)");
    let leases_lost =
        counter(&mut registry, "leases_lost", "Leases another lease replaced before or while the handler ran (storage slower than half the lease)");
    let task_panics = counter(&mut registry, "task_panics", "Dequeue or scaler tasks that panicked and were restarted");
    let rule_call_panics = counter(&mut registry, "rule_call_panics", "Rule calls whose blocking task panicked (the built-in rule decided)");
    let faults = counter(&mut registry, "rule_faults", "Rule calls that faulted (the built-in rule decided)");
    let clamps = counter(&mut registry, "rule_clamps", "Rule decisions clamped into the queue's bounds");
    let safety_polls = counter(&mut registry, "safety_polls", "Safety polls (push mode: a get while no task ran)");
    let transactions = Family::<TransactionLabel, Counter>::default();
    registry.register("storage_transactions", "Storage transactions (billed calls) by kind", transactions.clone());
    let rate = Family::<RateLabel, Gauge<f64, AtomicU64>>::default();
    registry.register(
        "transactions_per_hour",
        "Billed transactions per hour over the last 10 minutes: all, or idle (empty gets and counts that found the queue empty)",
        rate.clone(),
    );
    let monthly = Family::<RateLabel, Gauge<f64, AtomicU64>>::default();
    registry.register("projected_usd_per_month", "A 30-day month at the current transaction rate, in US dollars: all, or the idle part", monthly.clone());
    let host_rate = Family::<KindLabel, Gauge<f64, AtomicU64>>::default();
    registry.register("host_transactions_per_hour", "Billed transactions per hour of every queue of the host: all, or idle", host_rate.clone());
    let host_monthly = Family::<KindLabel, Gauge<f64, AtomicU64>>::default();
    registry.register(
        "host_projected_usd_per_month",
        "A 30-day month at the host's current transaction rate, in US dollars: all, or the idle part",
        host_monthly.clone(),
    );
    let price = Gauge::<f64, AtomicU64>::default();
    registry.register("price_per_10k_transactions_usd", "The price the cost figures use, US dollars per 10,000 transactions", price.clone());
    price.set(api.price_per_10k_transactions);
    let mut costs = Vec::new();
    for s in statuses(&api) {
        if let Some(cost) = queue_cost(&s, api.price_per_10k_transactions) {
            for (kind, per_hour, usd) in
                [("all", cost.transactions_per_hour, cost.usd_per_month), ("idle", cost.idle_transactions_per_hour, cost.idle_usd_per_month)]
            {
                rate.get_or_create(&RateLabel { queue: s.queue.clone(), kind }).set(per_hour);
                monthly.get_or_create(&RateLabel { queue: s.queue.clone(), kind }).set(usd);
            }
            costs.push(cost);
        }
        safety_polls.get_or_create(&QueueLabel { queue: s.queue.clone() }).inc_by(s.safety_polls);
        let label = QueueLabel { queue: s.queue.clone() };
        depth.get_or_create(&label).set(s.approximate_depth as i64);
        active.get_or_create(&label).set(s.active_tasks.into());
        target.get_or_create(&label).set(s.target_tasks.into());
        in_flight.get_or_create(&label).set(s.in_flight.into());
        processed.get_or_create(&label).inc_by(s.processed);
        failed.get_or_create(&label).inc_by(s.failed);
        poisoned.get_or_create(&label).inc_by(s.poisoned);
        poisoned_corrupt.get_or_create(&label).inc_by(s.poisoned_corrupt);
        poisoned_body_only.get_or_create(&label).inc_by(s.poisoned_body_only);
        handler_panics.get_or_create(&label).inc_by(s.handler_panics);
        task_panics.get_or_create(&label).inc_by(s.task_panics);
        leases_lost.get_or_create(&label).inc_by(s.leases_lost);
        poison_failures.get_or_create(&label).inc_by(s.poison_failures);
        host_errors.get_or_create(&label).inc_by(s.host_errors);
        rule_call_panics.get_or_create(&label).inc_by(s.rule_call_panics);
        if let Some(rule) = &s.rule {
            faults.get_or_create(&label).inc_by(rule.faults);
            clamps.get_or_create(&label).inc_by(rule.clamps);
        }
        if let Some(t) = s.transactions {
            for (kind, n) in [
                ("put", t.puts),
                ("get", t.gets_with_messages),
                ("get_empty", t.gets_empty),
                ("delete", t.deletes),
                ("update", t.updates),
                ("count", t.counts),
                ("create", t.creates),
            ] {
                transactions.get_or_create(&TransactionLabel { queue: s.queue.clone(), kind }).inc_by(n);
            }
        }
    }
    if let Some(bus) = api.bus.as_ref().map(|b| b.status()) {
        let connected = Gauge::<i64>::default();
        connected.set(i64::from(bus.connected));
        registry.register("bus_connected", "1 while subscribed to push notifications from other hosts", connected);
        for (name, help, value) in [
            ("bus_received", "Push notifications received and delivered", bus.received),
            ("bus_published", "Push notifications published", bus.published),
            ("bus_publish_failures", "Publishes that failed (the message was stored; hosts find it by polling)", bus.publish_failures),
            ("bus_dropped", "Push notifications dropped because the publish backlog was full", bus.dropped),
            ("bus_outages", "Times the subscription was lost", bus.outages),
            ("bus_ignored", "Payloads ignored: not the trigger JSON, too long, or naming another queue", bus.ignored),
        ] {
            let counter = Counter::<u64>::default();
            counter.inc_by(value);
            registry.register(name, help, counter);
        }
    }
    crate::storage_metrics::register(&mut registry, api.queues.values(), &statuses(&api));
    let total = CostStatus::total(&costs, api.price_per_10k_transactions);
    for (kind, per_hour, usd) in
        [("all", total.transactions_per_hour, total.usd_per_month), ("idle", total.idle_transactions_per_hour, total.idle_usd_per_month)]
    {
        host_rate.get_or_create(&KindLabel { kind }).set(per_hour);
        host_monthly.get_or_create(&KindLabel { kind }).set(usd);
    }
    let mut text = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &registry) {
        return self::error(StatusCode::INTERNAL_SERVER_ERROR, error.to_string());
    }
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_takes_only_a_delay_of_at_most_seven_days() {
        assert_eq!(parse_send_query(None), Ok(Duration::ZERO));
        assert_eq!(parse_send_query(Some("delay_ms=250")), Ok(Duration::from_millis(250)));
        assert_eq!(parse_send_query(Some("delay_ms=604800000")), Ok(MAX_VISIBILITY));
        // Percent-encoded digits are digits.
        assert_eq!(parse_send_query(Some("delay_ms=%31%30")), Ok(Duration::from_millis(10)));
        for bad in [
            "delay_ms=604800001",
            "delay_ms=18446744073709551615",
            "delay_ms=x",
            "delay_ms=",
            "delay_ms=-1",
            "delay_ms=+1",
            "delay_ms=%2B1",
            "delay=1",
            "delay_ms=1&delay_ms=1",
            "delay_%6Ds=1&x",
        ] {
            assert!(parse_send_query(Some(bad)).is_err(), "{bad} was taken");
        }
    }

    #[test]
    fn the_token_matches_only_itself() {
        assert!(token_matches("s3cret", Some("s3cret")));
        for wrong in [None, Some(""), Some("s3cre"), Some("s3cret "), Some("S3cret"), Some("s3cret-and-more")] {
            assert!(!token_matches("s3cret", wrong), "{wrong:?}");
        }
    }
}
