//! `POST /queues/{name}/messages` (a send) and `POST /queues/{name}/notify` (a push
//! notification).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use serde_json::json;

use crate::http::body_limit::too_large;
use crate::http::errors::error;
use crate::http::{Api, ApiLimits};
use crate::queue::{MAX_VISIBILITY, QueueError};

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

pub(super) async fn send(
    State(api): State<Arc<Api>>,
    Extension(limits): Extension<ApiLimits>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let Some(queue) = api.handles.get(&name) else {
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
    let put = queue.send(&body, delay, limits.idle_timeout / 2).await;
    match put {
        Ok(id) => (StatusCode::CREATED, Json(json!({ "id": id }))).into_response(),
        Err(e @ QueueError::MessageTooLarge { .. }) => error(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()),
        // The sender's to fix: retrying the same body can never work.
        Err(e @ QueueError::InvalidBody(_)) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

pub(super) async fn notify(State(api): State<Arc<Api>>, Path(name): Path<String>, RawQuery(query): RawQuery) -> Response {
    if let Some((key, _)) = form_urlencoded::parse(query.unwrap_or_default().as_bytes()).next() {
        return error(StatusCode::BAD_REQUEST, format!("unknown query parameter {key:?} (this route takes none)"));
    }
    match api.handles.get(&name) {
        Some(queue) => {
            // Messages put straight into storage: this host's listeners and every other host hear of it.
            queue.notify();
            StatusCode::ACCEPTED.into_response()
        }
        None => error(StatusCode::NOT_FOUND, format!("no queue named {name} on this host")),
    }
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
}
