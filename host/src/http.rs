//! The HTTP API: `GET /status`, `GET /metrics`, `GET /healthz`,
//! `POST /queues/{name}/messages`, `POST /queues/{name}/notify`.
//! When a token is configured, every route but `/healthz` requires `Authorization: Bearer <token>`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use serde_json::json;

use crate::health::Health;
use crate::listener::{Listener, ListenerStatus};
use crate::queue::{QueueClient, QueueError};

/// What the API serves.
pub struct Api {
    /// Listeners by queue name.
    pub listeners: BTreeMap<String, Listener>,
    /// Queue clients by queue name (for sends).
    pub queues: BTreeMap<String, Arc<dyn QueueClient>>,
    /// Required bearer token, if any.
    pub token: Option<String>,
    /// The host's health, answered by `/healthz`.
    pub health: Health,
}

/// The API's routes.
pub fn router(api: Arc<Api>) -> Router {
    let authenticated = Router::new()
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route("/queues/{name}/messages", post(send))
        .route("/queues/{name}/notify", post(notify))
        .layer(middleware::from_fn_with_state(api.clone(), require_token));
    Router::new().route("/healthz", get(healthz)).merge(authenticated).with_state(api)
}

async fn require_token(State(api): State<Arc<Api>>, request: Request, next: Next) -> Response {
    if let Some(token) = &api.token {
        let given = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(token.as_str()) {
            return (StatusCode::UNAUTHORIZED, Json(json!({ "error": "missing or wrong API token (Authorization: Bearer <token>)" }))).into_response();
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
    api.listeners.values().map(Listener::status).collect()
}

async fn status(State(api): State<Arc<Api>>) -> Json<serde_json::Value> {
    Json(json!({ "queues": statuses(&api) }))
}

#[derive(Deserialize)]
struct SendOptions {
    /// Invisible for this many milliseconds. Default 0.
    #[serde(default)]
    delay_ms: u64,
}

async fn send(State(api): State<Arc<Api>>, Path(name): Path<String>, Query(options): Query<SendOptions>, body: Bytes) -> Response {
    let Some(queue) = api.queues.get(&name) else {
        return (StatusCode::NOT_FOUND, Json(json!({ "error": format!("no queue named {name} on this host") }))).into_response();
    };
    match queue.put(&body, std::time::Duration::from_millis(options.delay_ms)).await {
        Ok(id) => {
            // The host saw the message arrive: no need to wait for a poll to notice it.
            if let Some(listener) = api.listeners.get(&name) {
                listener.work_detected();
            }
            (StatusCode::CREATED, Json(json!({ "id": id }))).into_response()
        }
        Err(error @ QueueError::MessageTooLarge { .. }) => (StatusCode::PAYLOAD_TOO_LARGE, Json(json!({ "error": error.to_string() }))).into_response(),
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": error.to_string() }))).into_response(),
    }
}

async fn notify(State(api): State<Arc<Api>>, Path(name): Path<String>) -> Response {
    match api.listeners.get(&name) {
        Some(listener) => {
            listener.work_detected();
            StatusCode::ACCEPTED.into_response()
        }
        None => (StatusCode::NOT_FOUND, Json(json!({ "error": format!("no queue named {name} on this host") }))).into_response(),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
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
    let depth = gauge(&mut registry, "queue_depth", "Approximate messages in the queue at the last scaling decision");
    let active = gauge(&mut registry, "active_tasks", "Dequeue tasks running");
    let target = gauge(&mut registry, "target_tasks", "The rule's last task count");
    let in_flight = gauge(&mut registry, "in_flight", "Messages being handled");
    let processed = counter(&mut registry, "messages_processed", "Messages handled and deleted");
    let failed = counter(&mut registry, "messages_failed", "Handler failures");
    let poisoned = counter(&mut registry, "messages_poisoned", "Messages moved to the poison queue");
    let faults = counter(&mut registry, "rule_faults", "Rule calls that faulted (the built-in rule decided)");
    let clamps = counter(&mut registry, "rule_clamps", "Rule decisions clamped into the queue's bounds");
    let transactions = Family::<TransactionLabel, Counter>::default();
    registry.register("storage_transactions", "Storage transactions (billed calls) by kind", transactions.clone());
    for s in statuses(&api) {
        let label = QueueLabel { queue: s.queue.clone() };
        depth.get_or_create(&label).set(s.approximate_depth as i64);
        active.get_or_create(&label).set(s.active_tasks.into());
        target.get_or_create(&label).set(s.target_tasks.into());
        in_flight.get_or_create(&label).set(s.in_flight.into());
        processed.get_or_create(&label).inc_by(s.processed);
        failed.get_or_create(&label).inc_by(s.failed);
        poisoned.get_or_create(&label).inc_by(s.poisoned);
        if let Some(rule) = &s.rule {
            faults.get_or_create(&label).inc_by(rule.faults);
            clamps.get_or_create(&label).inc_by(rule.clamps);
        }
        if let Some(t) = s.transactions {
            for (kind, n) in [("put", t.puts), ("get", t.gets_with_messages), ("get_empty", t.gets_empty), ("delete", t.deletes), ("update", t.updates), ("count", t.counts), ("create", t.creates)] {
                transactions.get_or_create(&TransactionLabel { queue: s.queue.clone(), kind }).inc_by(n);
            }
        }
    }
    let mut text = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &registry) {
        return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response();
    }
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
}
