//! The probes, which need no token and take no input: `GET /healthz`, whether the process is
//! sound (liveness), and `GET /readyz`, whether each queue can work now (readiness).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use serde_json::json;

use crate::http::Api;
use crate::http::auth::authorized;

/// 200 `ok` when healthy; 503 with every problem (JSON) when a component cannot work.
pub(super) async fn healthz(State(api): State<Arc<Api>>) -> Response {
    let mut problems = api.health.problems();
    // A credential refused after start-up: a restart reads the renewed secret.
    problems.extend(api.readiness.refused_credentials());
    if problems.is_empty() {
        return "ok\n".into_response();
    }
    (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": "the host cannot do its work", "problems": problems }))).into_response()
}

/// 200 when every queue is ready (its storage answers, its rule is loaded), 503 when one is
/// not; JSON per queue either way. Without the token (when one is configured) only each
/// queue's `ready` shows: the reasons may name accounts, hosts and files. Takes no query (the route table refuses one).
pub(super) async fn readyz(State(api): State<Arc<Api>>, headers: HeaderMap) -> Response {
    let queues = api.readiness.snapshot();
    let ready = queues.values().all(|queue| queue.ready);
    let queues: serde_json::Map<String, serde_json::Value> = if authorized(&api, &headers) {
        queues.into_iter().map(|(name, queue)| (name, json!(queue))).collect()
    } else {
        queues.into_iter().map(|(name, queue)| (name, json!({ "ready": queue.ready }))).collect()
    };
    if ready {
        return Json(json!({ "ready": true, "queues": queues })).into_response();
    }
    (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "ready": false, "error": "not every queue is ready", "queues": queues }))).into_response()
}
