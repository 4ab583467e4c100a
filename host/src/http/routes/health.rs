//! `GET /healthz`: whether the process is sound.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use serde_json::json;

use crate::http::Api;

/// 200 `ok` when healthy; 503 with every problem (JSON) when a component cannot work.
pub(super) async fn healthz(State(api): State<Arc<Api>>) -> Response {
    let problems = api.health.problems();
    if problems.is_empty() {
        return "ok\n".into_response();
    }
    (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": "the host cannot do its work", "problems": problems }))).into_response()
}
