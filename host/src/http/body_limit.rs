//! The request body limit: `max_message_bytes`, or for a send to a queue with a claim store
//! (`POST /queues/{name}/messages` and `/items`) its `max_claim_check_bytes`; 413 over it.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use futures::StreamExt as _;
use tokio::sync::Semaphore;

use super::errors::error;
use super::{Api, ApiLimits};
use crate::service::packing::LINGER_BUFFER_BYTES;

/// The largest body one request may carry, and the setting that says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BodyLimit {
    /// In bytes.
    pub bytes: usize,
    /// The config key that sets it.
    pub key: &'static str,
    /// Why a larger body is not taken here, when that is not plain from the key.
    pub note: &'static str,
}

/// How many requests may be reading a body over `max_message_bytes` at once: each is held in
/// memory whole (up to `max_claim_check_bytes`, 100 MiB by default) until it is stored.
pub(crate) const LARGE_BODIES_AT_ONCE: usize = 2;

/// What [`limit_bodies`] needs: the API's limits, the queues (whose claim stores raise the
/// limit of a send), and the large bodies being read now.
#[derive(Clone)]
pub(super) struct BodyGate {
    limits: ApiLimits,
    api: Arc<Api>,
    large: Arc<Semaphore>,
}

impl BodyGate {
    pub(super) fn new(limits: ApiLimits, api: Arc<Api>) -> BodyGate {
        BodyGate { limits, api, large: Arc::new(Semaphore::new(LARGE_BODIES_AT_ONCE)) }
    }

    /// The limit of a request to `method path`.
    fn limit(&self, method: &Method, path: &str) -> BodyLimit {
        let api_limit = BodyLimit { bytes: self.limits.max_body_bytes, key: "max_message_bytes", note: "" };
        if method != Method::POST {
            return api_limit;
        }
        let Some(rest) = path.strip_prefix("/queues/") else { return api_limit };
        let (name, items) = match (rest.strip_suffix("/messages"), rest.strip_suffix("/items")) {
            (Some(name), _) => (name, false),
            (None, Some(name)) => (name, true),
            (None, None) => return api_limit,
        };
        let Some(handle) = self.api.handles.get(name) else { return api_limit };
        let limit = match handle.claim_limit() {
            // A send of items waits whole in the packing buffer.
            Some(bytes) if items && bytes > LINGER_BUFFER_BYTES => {
                BodyLimit { bytes: LINGER_BUFFER_BYTES, key: "the packing buffer of a send of items", note: "" }
            }
            Some(bytes) => BodyLimit { bytes, key: "max_claim_check_bytes", note: "" },
            None => BodyLimit {
                note: ": this queue has no claim store to offload a larger body to (it is partitioned, or on an Azure account without a blob endpoint)",
                ..api_limit
            },
        };
        if limit.bytes >= api_limit.bytes { limit } else { api_limit }
    }
}

/// The 413 answer to a body larger than `limit`.
pub(super) fn too_large(limit: BodyLimit) -> Response {
    error(StatusCode::PAYLOAD_TOO_LARGE, format!("the message is larger than {} ({} bytes){}", limit.key, limit.bytes, limit.note))
}

/// Of a body declared over the limit, how much is read and thrown away before the 413, and
/// for how long: a client still writing its body when the connection closes sees a reset
/// instead of the answer.
const DISCARD_BYTES: u64 = 1 << 20;
const DISCARD_TIME: Duration = Duration::from_secs(1);

/// Reads each request's body up to its [`BodyLimit`] (put in the request's extensions for
/// the route's 413), and answers 413 to a request whose Content-Length is over it without
/// keeping its body. A body not much over the limit is read and discarded first (at most
/// [`DISCARD_BYTES`] for [`DISCARD_TIME`]), so the client gets to read the answer; unless the
/// client waits to be asked for it (`Expect: 100-continue`): reading would ask it
/// (`100 Continue`), so it is refused unread and the connection closes after the answer.
/// A body over `max_message_bytes` (declared, or once that much of a chunked one came) needs
/// one of [`LARGE_BODIES_AT_ONCE`] places (503 with `Retry-After` when none is free).
pub(super) async fn limit_bodies(State(gate): State<BodyGate>, request: Request, next: Next) -> Response {
    let limit = gate.limit(request.method(), request.uri().path());
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if let Some(declared) = declared.filter(|length| *length > limit.bytes as u64) {
        let waits_to_be_asked = request.headers().get(header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        if waits_to_be_asked {
            let mut response = too_large(limit);
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            return response;
        }
        if declared <= limit.bytes as u64 + DISCARD_BYTES {
            let mut body = request.into_body().into_data_stream();
            let _ = tokio::time::timeout(DISCARD_TIME, async { while let Some(Ok(_)) = body.next().await {} }).await;
        }
        return too_large(limit);
    }
    let (mut parts, body) = request.into_parts();
    parts.extensions.insert(limit);
    let small = gate.limits.max_body_bytes;
    if limit.bytes <= small || declared.is_some_and(|length| length <= small as u64) {
        return next.run(Request::from_parts(parts, Body::new(http_body_util::Limited::new(body, limit.bytes)))).await;
    }
    // A body with no declared length (chunked) takes a place only once it turns out larger
    // than a message: its first bytes are read here, without one.
    let (body, large) = match declared {
        Some(_) => (body, true),
        None => {
            let mut stream = body.into_data_stream();
            let mut start = bytes::BytesMut::new();
            let mut ended = true;
            while let Some(chunk) = stream.next().await {
                match chunk {
                    Ok(chunk) => start.extend_from_slice(&chunk),
                    // Handed on as it is: the route answers the failed read (a 408 past
                    // body_read_timeout, for one).
                    Err(error) => {
                        let failed = futures::stream::iter([Ok(start.freeze()), Err(error)]);
                        return next.run(Request::from_parts(parts, Body::from_stream(failed))).await;
                    }
                }
                if start.len() > small {
                    ended = false;
                    break;
                }
            }
            let start = futures::stream::iter([Ok::<_, axum::Error>(start.freeze())]);
            if ended { (Body::from_stream(start), false) } else { (Body::from_stream(start.chain(stream)), true) }
        }
    };
    let _place = match large.then(|| gate.large.clone().try_acquire_owned()) {
        None => None,
        Some(Ok(place)) => Some(place),
        Some(Err(_)) => {
            let mut response = error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{LARGE_BODIES_AT_ONCE} bodies larger than max_message_bytes are being received already; try again shortly"),
            );
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return response;
        }
    };
    next.run(Request::from_parts(parts, Body::new(http_body_util::Limited::new(body, limit.bytes)))).await
}
