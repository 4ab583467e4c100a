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
use tracing::Instrument as _;

use crate::http::body_limit::{BodyLimit, too_large};
use crate::http::errors::{error, storage_unavailable};
use crate::http::{Api, ApiLimits};
use crate::queue::{GroupedSend, MAX_VISIBILITY, MessageId, QueueClient as _, QueueError};
use crate::service::packing::{ItemsError, MAX_ITEMS_PER_SEND};
use crate::telemetry::TraceContext;

/// Parses the query of `POST /queues/{name}/messages`: `delay_ms`, a whole number of
/// milliseconds up to [`MAX_VISIBILITY`] (the route table lets no other parameter through).
fn parse_send_query(query: Option<&str>) -> Result<Duration, String> {
    let Some(value) = super::query_value(query, "delay_ms") else { return Ok(Duration::ZERO) };
    // Digits only: u64's parser would take a sign.
    let ms: u64 = Some(value.as_str())
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("delay_ms: {:?} is not a whole number of milliseconds", crate::http::errors::echoed(&value)))?;
    if u128::from(ms) > MAX_VISIBILITY.as_millis() {
        return Err(format!("delay_ms: {ms} is more than {} (7 days), the longest a message may stay invisible", MAX_VISIBILITY.as_millis()));
    }
    Ok(Duration::from_millis(ms))
}

/// The FIFO part of a send's query: `group` (the message group id) and `dedup_id` (its
/// deduplication id, only with a group). Their values are checked by the queue.
fn parse_group(query: Option<&str>) -> Result<Option<GroupedSend>, String> {
    let dedup_id = super::query_value(query, "dedup_id");
    match super::query_value(query, "group") {
        Some(group) => Ok(Some(GroupedSend { group, dedup_id })),
        None if dedup_id.is_some() => Err("dedup_id: only with group (a deduplication id is for a FIFO queue's sends)".to_string()),
        None => Ok(None),
    }
}

pub(super) async fn send(
    State(api): State<Arc<Api>>,
    Extension(limits): Extension<ApiLimits>,
    Extension(body_limit): Extension<BodyLimit>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let (span, context) = send_span(&name, &headers);
    let send = send_message(api, limits, body_limit, name, query, body).instrument(span);
    crate::telemetry::with_sending(context, send).await
}

/// The span of a send, a child of the producer's span when its `traceparent` names one (a
/// malformed one is counted and starts a new trace), and the context its message carries:
/// the send span's when spans are exported, else the producer's.
fn send_span(queue: &str, headers: &axum::http::HeaderMap) -> (tracing::Span, Option<TraceContext>) {
    let span = tracing::debug_span!(target: crate::telemetry::TARGET, "send", otel.kind = "producer", queue, messaging.message.id = tracing::field::Empty);
    let producer = TraceContext::from_headers(headers);
    crate::telemetry::join(&span, producer.as_ref());
    let context = TraceContext::passed_on(&span, producer.as_ref());
    (span, context)
}

async fn send_message(
    api: Arc<Api>,
    limits: ApiLimits,
    body_limit: BodyLimit,
    name: String,
    query: Option<String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let Some(queue) = api.handles.get(&name) else {
        return crate::http::errors::no_queue(&name);
    };
    let (delay, group) = match parse_send_query(query.as_deref()).and_then(|delay| Ok((delay, parse_group(query.as_deref())?))) {
        Ok(parsed) => parsed,
        Err(reason) => return error(StatusCode::BAD_REQUEST, reason),
    };
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => return too_large(body_limit),
        Err(rejection) => return error(rejection.status(), rejection.body_text()),
    };
    // Storage that stalls (each try may wait its request timeout, and retries add up) must
    // still get the client an answer, before its connection times out or the client gives up.
    let put = queue.send_in(group.as_ref(), &body, delay, limits.idle_timeout / 2).await;
    match put {
        Ok(id) => {
            tracing::Span::current().record("messaging.message.id", id.as_str());
            (StatusCode::CREATED, Json(json!({ "id": id }))).into_response()
        }
        Err(e @ QueueError::MessageTooLarge { .. }) => error(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()),
        // The sender's to fix: retrying the same body can never work.
        Err(e @ (QueueError::InvalidBody(_) | QueueError::BadSend(_))) => error(StatusCode::BAD_REQUEST, e.to_string()),
        // The storage failed for now (after the host's retries): the producer may send again.
        Err(e @ QueueError::Transient(_)) => storage_unavailable(e.to_string()),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// What `POST /queues/{name}/items` takes: a JSON array of items, or NDJSON (one item per
/// line; `Content-Type: application/x-ndjson` or `application/jsonl`). Each item is a JSON
/// value: a string is the item's text (unquoted, escapes resolved), any other value is its
/// JSON text as written. Nothing else is accepted: the count is bounded by
/// [`MAX_ITEMS_PER_SEND`], the bytes by the API's body limit.
pub(crate) fn parse_items(body: &[u8], ndjson: bool) -> Result<Vec<Bytes>, (StatusCode, String)> {
    use serde_json::value::RawValue;
    let bad = |reason: String| (StatusCode::BAD_REQUEST, reason);
    let raw: Vec<(usize, &RawValue)> = if ndjson {
        let mut raw = Vec::new();
        for (line, text) in body.split(|&b| b == b'\n').enumerate() {
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if raw.len() == MAX_ITEMS_PER_SEND {
                return Err((StatusCode::PAYLOAD_TOO_LARGE, format!("more than {MAX_ITEMS_PER_SEND} items in one send")));
            }
            let value: &RawValue = serde_json::from_slice(text).map_err(|e| bad(format!("line {}: not a JSON value: {e}", line + 1)))?;
            raw.push((line + 1, value));
        }
        raw
    } else {
        let values: Vec<&RawValue> =
            serde_json::from_slice(body).map_err(|e| bad(format!("not a JSON array of items: {e} (send NDJSON with Content-Type: application/x-ndjson)")))?;
        if values.len() > MAX_ITEMS_PER_SEND {
            return Err((StatusCode::PAYLOAD_TOO_LARGE, format!("{} items in one send, over the limit of {MAX_ITEMS_PER_SEND}", values.len())));
        }
        values.into_iter().enumerate().collect()
    };
    if raw.is_empty() {
        return Err(bad("no items: send a JSON array of at least one item, or NDJSON lines".into()));
    }
    raw.into_iter()
        .map(|(at, value)| {
            let text = value.get();
            if text.starts_with('"') {
                let string: String = serde_json::from_str(text).map_err(|e| bad(format!("item {at}: {e}")))?;
                Ok(Bytes::from(string))
            } else {
                Ok(Bytes::copy_from_slice(text.as_bytes()))
            }
        })
        .collect()
}

/// `POST /queues/{name}/items`: work items, packed with the other items sent within the
/// queue's `pack_linger`; `201 {"items": n, "messages": [ids]}` once all are stored.
pub(super) async fn send_items(
    State(api): State<Arc<Api>>,
    Extension(body_limit): Extension<BodyLimit>,
    Path(name): Path<String>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let Some(queue) = api.handles.get(&name) else {
        return crate::http::errors::no_queue(&name);
    };
    if queue.client().fifo() {
        // Packing never mixes groups: it takes none.
        let reason =
            format!("queue {name} is a FIFO queue: send each message with POST /queues/{name}/messages?group=G (items are not packed for FIFO queues)");
        return error(StatusCode::BAD_REQUEST, reason);
    }
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => return too_large(body_limit),
        Err(rejection) => return error(rejection.status(), rejection.body_text()),
    };
    let ndjson = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| matches!(v.trim(), "application/x-ndjson" | "application/jsonl" | "application/ndjson"));
    let items = match parse_items(&body, ndjson) {
        Ok(items) => items,
        Err((status, reason)) => return error(status, reason),
    };
    // The producer's context goes with each item as it came: the send span is its child,
    // and the item's handling is another (an envelope's handling spans many producers' items).
    let context = TraceContext::from_headers(&headers);
    let span = tracing::debug_span!(target: crate::telemetry::TARGET, "send", otel.kind = "producer", queue = name, items = items.len());
    crate::telemetry::join(&span, context.as_ref());
    match crate::telemetry::with_sending(context, queue.send_items(items)).instrument(span).await {
        Ok(sent) => (StatusCode::CREATED, Json(json!({ "items": sent.items, "messages": sent.messages, "ids": sent.ids }))).into_response(),
        Err(e @ (ItemsError::TooLarge { .. } | ItemsError::OverClaimLimit { .. } | ItemsError::TooMany { .. } | ItemsError::TooManyBytes { .. })) => {
            error(StatusCode::PAYLOAD_TOO_LARGE, e.to_string())
        }
        Err(e @ ItemsError::Empty) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(ItemsError::Storage(e @ QueueError::MessageTooLarge { .. })) => error(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()),
        Err(ItemsError::Storage(e @ QueueError::InvalidBody(_))) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e @ ItemsError::Storage(QueueError::Transient(_))) => storage_unavailable(e.to_string()),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// Longest `timeout_ms` of a wait for a reply: within the API's idle timeout's default.
const MAX_REPLY_WAIT: Duration = Duration::from_secs(30);

/// `POST /queues/{name}/replies/{id}?timeout_ms=N&item=K`: waits up to N ms (default and
/// most 30,000) for the answer to message `id` (with `item`: to item K of envelope `id`,
/// as `POST /queues/{name}/items` answered in `ids`) on the queue's reply queue and takes
/// it: `200` with the reply (docs/guides/payloads.md), `404` when none came in time.
pub(super) async fn take_reply(
    State(api): State<Arc<Api>>,
    Extension(limits): Extension<ApiLimits>,
    Path((name, id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let Some(queue) = api.handles.get(&name) else {
        return crate::http::errors::no_queue(&name);
    };
    let item = match super::query_value(query.as_deref(), "item") {
        None => None,
        // Digits only: u32's parser would take a sign.
        Some(value) => match Some(value.as_str()).filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit())).and_then(|v| v.parse::<u32>().ok()) {
            Some(index) => Some(index),
            None => return error(StatusCode::BAD_REQUEST, format!("item: {} is not an item index (0 to {})", crate::http::errors::echoed(&value), u32::MAX)),
        },
    };
    let timeout = match super::query_value(query.as_deref(), "timeout_ms") {
        None => None,
        Some(value) => match value.parse::<u64>() {
            Ok(ms) if !value.starts_with('+') && Duration::from_millis(ms) <= MAX_REPLY_WAIT => Some(Duration::from_millis(ms)),
            _ => return error(StatusCode::BAD_REQUEST, format!("timeout_ms: a whole number of milliseconds up to {}", MAX_REPLY_WAIT.as_millis())),
        },
    };
    // Within the connection's idle timeout, so the client gets the answer.
    let timeout = timeout.unwrap_or(MAX_REPLY_WAIT).min(limits.idle_timeout / 2);
    match queue.wait_answer(&MessageId::from(id.as_str()), item, timeout).await {
        Ok(Some(reply)) => (StatusCode::OK, Json(reply)).into_response(),
        Ok(None) => {
            error(StatusCode::NOT_FOUND, format!("no reply to message {} within {}", crate::http::errors::echoed(&id), humantime::format_duration(timeout)))
        }
        Err(e) if queue.has_reply_queue() => error(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}")),
        Err(e) => error(StatusCode::CONFLICT, format!("{e:#}")),
    }
}

pub(super) async fn notify(State(api): State<Arc<Api>>, Path(name): Path<String>) -> Response {
    match api.handles.get(&name) {
        Some(queue) => {
            // Messages put straight into storage: this host's listeners and every other host hear of it.
            queue.notify();
            StatusCode::ACCEPTED.into_response()
        }
        None => crate::http::errors::no_queue(&name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_json_values_strings_as_their_text_others_as_written() {
        let items = parse_items(br#"["plain text", {"b": 1,  "a": [2]}, 3, "esc\"aped\n", null]"#, false).unwrap();
        assert_eq!(items, [&b"plain text"[..], br#"{"b": 1,  "a": [2]}"#, b"3", b"esc\"aped\n", b"null"]);
        let items = parse_items(b"{\"order\": 1}\n\n\"two\"\r\n[3]\n", true).unwrap();
        assert_eq!(items, [&br#"{"order": 1}"#[..], b"two", b"[3]"]);
        for (body, ndjson, status, reason) in [
            (&b"[]"[..], false, 400, "no items"),
            (b"", true, 400, "no items"),
            (b"{\"a\":1}", false, 400, "not a JSON array of items"),
            (b"[1,", false, 400, "not a JSON array of items"),
            (b"1\n{oops\n", true, 400, "line 2: not a JSON value"),
        ] {
            let (got, text) = parse_items(body, ndjson).unwrap_err();
            assert_eq!((got.as_u16(), text.contains(reason)), (status, true), "{text}");
        }
        let many = format!("[{}]", vec!["1"; MAX_ITEMS_PER_SEND + 1].join(","));
        assert_eq!(parse_items(many.as_bytes(), false).unwrap_err().0, StatusCode::PAYLOAD_TOO_LARGE);
        let many = "1\n".repeat(MAX_ITEMS_PER_SEND + 1);
        assert_eq!(parse_items(many.as_bytes(), true).unwrap_err().0, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn send_takes_a_delay_of_at_most_seven_days() {
        assert_eq!(parse_send_query(None), Ok(Duration::ZERO));
        assert_eq!(parse_send_query(Some("delay_ms=250")), Ok(Duration::from_millis(250)));
        assert_eq!(parse_send_query(Some("delay_ms=604800000")), Ok(MAX_VISIBILITY));
        // Percent-encoded digits are digits.
        assert_eq!(parse_send_query(Some("delay_ms=%31%30")), Ok(Duration::from_millis(10)));
        for bad in ["delay_ms=604800001", "delay_ms=18446744073709551615", "delay_ms=x", "delay_ms=", "delay_ms=-1", "delay_ms=+1", "delay_ms=%2B1"] {
            assert!(parse_send_query(Some(bad)).is_err(), "{bad} was taken");
        }
    }
}
