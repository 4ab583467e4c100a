//! Every error answer is JSON, `{"error": reason}`.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Json, Response};
use serde_json::json;

/// Longest part of a request (a path, a method, a queue name, a query key or value) an error
/// answer repeats, in bytes; more is cut and marked with `…`.
pub(crate) const MAX_ECHO_BYTES: usize = 64;

/// Longest reason an error answer carries, in bytes: a last bound, whatever a route put in it.
const MAX_REASON_BYTES: usize = 2048;

/// `text` cut to at most `max` bytes (on a character boundary), marked with `…` when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// A part of the request as an error answer may repeat it: at most [`MAX_ECHO_BYTES`], so an
/// answer never reflects what a client sent in bulk.
pub(crate) fn echoed(text: &str) -> String {
    cut(text, MAX_ECHO_BYTES)
}

/// `{"error": reason}` with `status`.
pub(crate) fn error(status: StatusCode, reason: impl Into<String>) -> Response {
    let reason = reason.into();
    let reason = if reason.len() > MAX_REASON_BYTES { cut(&reason, MAX_REASON_BYTES) } else { reason };
    (status, Json(json!({ "error": reason }))).into_response()
}

/// Seconds a producer is asked to wait (`Retry-After`) when the storage failed its send for
/// now: the host's own retries (about a second and a half) have already run.
pub(crate) const STORAGE_RETRY_AFTER_SECS: &str = "2";

/// `503 {"error": reason}` with `Retry-After`: the storage failed the request for now
/// (throttled, busy, out of reach after the host's retries); the same request may succeed.
pub(crate) fn storage_unavailable(reason: impl Into<String>) -> Response {
    let mut response = error(StatusCode::SERVICE_UNAVAILABLE, reason);
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static(STORAGE_RETRY_AFTER_SECS));
    response
}

/// The 404 of a route whose queue this host does not have.
pub(crate) fn no_queue(name: &str) -> Response {
    error(StatusCode::NOT_FOUND, format!("no queue named {} on this host", echoed(name)))
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
    let (method, shown_path) = (echoed(method.as_str()), echoed(&path));
    let reason = match status {
        StatusCode::NOT_FOUND => format!("no route {method} {shown_path}"),
        StatusCode::METHOD_NOT_ALLOWED => {
            // axum drops the Allow header when a layer wraps the route, so it comes from here.
            let allowed = allowed_methods(&path);
            parts.headers.insert(header::ALLOW, HeaderValue::from_static(allowed));
            format!("{method} is not allowed on {shown_path} (allowed: {allowed})")
        }
        _ if !text.is_empty() => crate::health::truncate_reason(&text),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echo_is_cut_on_a_character_and_marked() {
        assert_eq!(echoed("orders"), "orders");
        let long = "é".repeat(1_000);
        let shown = echoed(&long);
        assert!(shown.len() <= MAX_ECHO_BYTES + '…'.len_utf8() && shown.ends_with('…'), "{shown}");
        assert_eq!(echoed(&"x".repeat(MAX_ECHO_BYTES)), "x".repeat(MAX_ECHO_BYTES), "at the limit, nothing is cut");
    }
}
