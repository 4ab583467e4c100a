//! The request body limit (`max_message_bytes`): 413 for a body over it.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use super::ApiLimits;
use super::errors::error;

/// The 413 answer to a body larger than the limit.
pub(super) fn too_large(limits: ApiLimits) -> Response {
    error(StatusCode::PAYLOAD_TOO_LARGE, format!("the message is larger than max_message_bytes ({} bytes)", limits.max_body_bytes))
}

/// Of a body declared over the limit, how much is read and thrown away before the 413, and
/// for how long: a client still writing its body when the connection closes sees a reset
/// instead of the answer.
const DISCARD_BYTES: u64 = 1 << 20;
const DISCARD_TIME: Duration = Duration::from_secs(1);

/// Answers 413 to a request whose Content-Length is over the limit without keeping its body
/// (the body limit catches chunked bodies as they are read). A body not much over the limit
/// is read and discarded first (at most [`DISCARD_BYTES`] for [`DISCARD_TIME`]), so the
/// client gets to read the answer; unless the client waits to be asked for it
/// (`Expect: 100-continue`): reading would ask it (`100 Continue`), so it is refused unread
/// and the connection closes after the answer.
pub(super) async fn reject_declared_large_bodies(State(limits): State<ApiLimits>, request: Request, next: Next) -> Response {
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let Some(declared) = declared.filter(|length| *length > limits.max_body_bytes as u64) else {
        return next.run(request).await;
    };
    let waits_to_be_asked = request.headers().get(header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if waits_to_be_asked {
        let mut response = too_large(limits);
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        return response;
    }
    if declared <= limits.max_body_bytes as u64 + DISCARD_BYTES {
        let mut body = request.into_body().into_data_stream();
        let _ = tokio::time::timeout(DISCARD_TIME, async {
            use futures::StreamExt as _;
            while let Some(Ok(_)) = body.next().await {}
        })
        .await;
    }
    too_large(limits)
}
