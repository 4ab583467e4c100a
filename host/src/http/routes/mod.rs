//! The API's routes, one file per family.

mod control;
mod health;
mod messages;
mod metrics;
mod poison;
mod status;

pub(crate) use messages::parse_items;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Extension};
use axum::middleware;
use axum::routing::{get, post};

use super::auth::require_token;
use super::body_limit::reject_declared_large_bodies;
use super::errors::json_errors;
use super::{Api, ApiLimits};

/// The API's routes, with the body limit of `limits` (the probes read no body, so no
/// declared length turns them away).
pub fn router(api: Arc<Api>, limits: ApiLimits) -> Router {
    let authenticated = Router::new()
        .route("/status", get(status::status))
        .route("/metrics", get(metrics::metrics))
        .route("/queues/{name}/messages", post(messages::send))
        .route("/queues/{name}/items", post(messages::send_items))
        .route("/queues/{name}/replies/{id}", post(messages::take_reply))
        .route("/queues/{name}/notify", post(messages::notify))
        .route("/queues/{name}/pause", post(control::pause))
        .route("/queues/{name}/resume", post(control::resume))
        .route("/queues/{name}/poison", get(poison::list))
        .route("/queues/{name}/poison/requeue", post(poison::requeue))
        .route("/queues/{name}/poison/purge", post(poison::purge))
        .route("/audit", get(audit_entries))
        .layer(middleware::from_fn_with_state(api.clone(), require_token))
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(middleware::from_fn_with_state(limits, reject_declared_large_bodies));
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .merge(authenticated)
        .with_state(api)
        .layer(Extension(limits))
        .layer(middleware::from_fn(json_errors))
}

/// Records an operator's change in the audit log, if the host keeps one.
fn audit(api: &Api, action: &str, target: &str, result: &str) {
    if let Some(log) = &api.audit {
        log.record("api", action, target, result);
    }
}

/// Most entries `GET /audit` returns.
const MAX_AUDIT_ENTRIES: usize = 1_000;

/// `GET /audit?limit=N`: the last operators' changes, oldest first (1 to 1,000; default 100).
async fn audit_entries(
    axum::extract::State(api): axum::extract::State<Arc<Api>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse as _;
    let mut limit = None;
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match (key.as_ref(), value.parse::<usize>()) {
            ("limit", _) if limit.is_some() => return super::errors::error(StatusCode::BAD_REQUEST, "limit: given more than once"),
            ("limit", Ok(n)) if (1..=MAX_AUDIT_ENTRIES).contains(&n) => limit = Some(n),
            ("limit", _) => return super::errors::error(StatusCode::BAD_REQUEST, format!("limit: a count from 1 to {MAX_AUDIT_ENTRIES}")),
            _ => {
                return super::errors::error(
                    StatusCode::BAD_REQUEST,
                    format!("unknown query parameter {:?} (this route takes only limit)", crate::health::truncate_reason(&key)),
                );
            }
        }
    }
    let entries = match &api.audit {
        Some(log) => match log.recent(limit.unwrap_or(100)) {
            Ok(entries) => entries,
            Err(e) => return super::errors::error(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}")),
        },
        None => Vec::new(),
    };
    axum::response::Json(serde_json::json!({ "entries": entries })).into_response()
}
