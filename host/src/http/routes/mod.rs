//! The API's routes, one file per family.

mod control;
mod health;
mod messages;
mod metrics;
mod poison;
mod status;

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
        .route("/queues/{name}/notify", post(messages::notify))
        .route("/queues/{name}/pause", post(control::pause))
        .route("/queues/{name}/resume", post(control::resume))
        .route("/queues/{name}/poison", get(poison::list))
        .route("/queues/{name}/poison/requeue", post(poison::requeue))
        .route("/queues/{name}/poison/purge", post(poison::purge))
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
