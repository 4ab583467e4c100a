//! Every error answer is JSON, `{"error": reason}`.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Json, Response};
use serde_json::json;

/// `{"error": reason}` with `status`.
pub(super) fn error(status: StatusCode, reason: impl Into<String>) -> Response {
    (status, Json(json!({ "error": reason.into() }))).into_response()
}

/// Turns every error answer that is not JSON yet (axum's empty 404 and 405, plain-text
/// rejections) into `{"error": reason}`, keeping its status and headers (`Allow` on a 405).
pub(super) async fn json_errors(request: Request, next: Next) -> Response {
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

/// The methods a route of [`router`](super::router) takes.
fn allowed_methods(path: &str) -> &'static str {
    // `/queues/{name}/poison` is read with GET; every other `/queues/` route is a POST.
    if path.starts_with("/queues/") && !path.ends_with("/poison") { "POST" } else { "GET" }
}
