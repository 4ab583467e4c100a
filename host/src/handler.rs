//! What processes a message: a Rust [`Handler`] when ebb is embedded as a library, or
//! [`HttpHandler`], which forwards each message to an application over HTTP (any language).

use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use async_trait::async_trait;
use bytes::Bytes;

use crate::queue::MessageId;

/// A message handed to a handler.
#[derive(Debug, Clone)]
pub struct IncomingMessage {
    /// The queue it came from.
    pub queue: String,
    /// Its id in that queue.
    pub id: MessageId,
    /// How many times it has been leased, this time included (1 on the first try).
    pub dequeue_count: u32,
    /// When it was put.
    pub inserted_at: SystemTime,
    /// The body, as put (cloning it shares the buffer, it does not copy it); for an item of
    /// an envelope, the item's bytes.
    pub body: Bytes,
    /// Set when the body is one item of an envelope (issue 20): which one. Then `id` is the
    /// envelope's message id and `dequeue_count` the item's failed deliveries plus this one.
    pub item: Option<ItemPosition>,
    /// The trace context its producer sent it with, if any (W3C `traceparent` and
    /// `tracestate`): a handler's spans join that trace with it as their parent.
    pub trace: Option<crate::telemetry::TraceContext>,
}

/// Where an item sits in its envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemPosition {
    /// Its index in the envelope, from 0.
    pub index: u32,
    /// Items in the envelope.
    pub count: u32,
    /// Deliveries of this item that failed before (0 for a new item).
    pub attempts: u32,
}

/// Processes messages. `Ok` deletes the message; `Err` makes it visible again after the
/// queue's retry delay, or moves it to `<queue>-poison` once it reaches `max_dequeue_count`.
/// Delivery is at least once: make handling idempotent.
///
/// ```
/// use ebb::handler::{Handler, IncomingMessage};
///
/// struct Shout;
///
/// #[async_trait::async_trait]
/// impl Handler for Shout {
///     async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
///         let text = std::str::from_utf8(&message.body)?;
///         println!("{}", text.to_uppercase());
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Handles one message.
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()>;

    /// Handles one message and answers it: on a queue with a `reply_queue`, the answer
    /// (when `Some`) is put there with the message's id as correlation id before the message
    /// is deleted. By default [`Handler::handle`], with no answer.
    async fn handle_with_reply(&self, message: &IncomingMessage) -> anyhow::Result<Option<Bytes>> {
        self.handle(message).await.map(|()| None)
    }

    /// Handles a batch of items (`delivery = "batch"`): one result per item, in order; a
    /// failed item is retried alone. By default each item through [`Handler::handle`], one
    /// after another.
    async fn handle_batch(&self, items: &[IncomingMessage]) -> Vec<anyhow::Result<()>> {
        let mut results = Vec::with_capacity(items.len());
        for item in items {
            results.push(self.handle(item).await);
        }
        results
    }
}

/// The host could not call the handler for a reason of its own (it ran out of file
/// descriptors): not the message's fault, so the try does not count towards poisoning.
#[derive(Debug, thiserror::Error)]
#[error("the host could not call the handler: {0:#}")]
pub struct HostError(pub anyhow::Error);

/// The handler answered an HTTP status that is a failure (not 2xx, 429 or 503): what a
/// failure rule is told as `http-status`.
#[derive(Debug, thiserror::Error)]
#[error("{detail}")]
pub struct HandlerStatus {
    /// The status code.
    pub status: u16,
    /// What answered, and the start of its answer, for the log and the poison envelope.
    pub detail: String,
}

/// The handler answered with more than [`MAX_REPLY_BYTES`]: no reply queue takes an answer
/// that large, so handling the message again cannot help (it is poisoned at once).
#[derive(Debug, thiserror::Error)]
#[error("handled, but {0}")]
pub(crate) struct AnswerTooLarge(pub String);

/// A handler (a Rust one, embedded) panicked; the panic was contained.
#[derive(Debug, thiserror::Error)]
#[error("handler panicked: {0}")]
pub(crate) struct HandlerPanicked(pub String);

/// The app asked for a pause (HTTP 429 Too Many Requests or 503 Service Unavailable, or a
/// Rust handler returning this error): not the message's fault. The message is made visible
/// again after the app's `Retry-After` (capped at the queue's `max_retry_delay`; the queue's
/// first retry delay when absent or unusable), counted as pushed back, not as failed, and
/// it is not poisoned for it until its dequeue count reaches `PUSHED_BACK_POISON_DEQUEUES`.
#[derive(Debug, thiserror::Error)]
#[error("{detail}: pushed back{}", match .retry_after {
    RetryAfter::Unspecified => String::new(),
    RetryAfter::Seconds(s) => format!(", retry after {s} s"),
    RetryAfter::At(at) => format!(", retry at {}", humantime::format_rfc3339_seconds(*at)),
    RetryAfter::Malformed(text) => format!(", with an unusable Retry-After {text:?}"),
})]
pub struct PushedBack {
    /// When the app asked to be called again.
    pub retry_after: RetryAfter,
    /// What answered, for the log (`handler http://… answered 429 Too Many Requests`).
    pub detail: String,
}

/// A pushed-back message is poisoned only once it has been dequeued this many times (each
/// push back is a dequeue), so an app that sheds load for hours loses nothing.
pub(crate) const PUSHED_BACK_POISON_DEQUEUES: u32 = 1_000;

/// An app's `Retry-After`, as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryAfter {
    /// None given.
    Unspecified,
    /// A number of seconds (saturated at `u64::MAX` when larger).
    Seconds(u64),
    /// An HTTP date.
    At(SystemTime),
    /// Neither (a negative or fractional number, text, a bad date), at most 64 characters of it.
    Malformed(String),
}

/// Why a `Retry-After` was not used as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryAfterAdjustment {
    /// Longer than the queue's `max_retry_delay`: capped.
    Capped,
    /// Not a number of seconds or an HTTP date: the default delay was used.
    Malformed,
    /// A date already past, or `0` seconds: the default delay was used.
    Past,
}

impl RetryAfter {
    /// Reads a `Retry-After` header's value (RFC 9110: seconds, or an HTTP date).
    pub fn parse(value: &[u8]) -> RetryAfter {
        let Ok(text) = std::str::from_utf8(value) else { return RetryAfter::Malformed(String::from_utf8_lossy(&value[..value.len().min(64)]).into_owned()) };
        let text = text.trim();
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            return RetryAfter::Seconds(text.parse().unwrap_or(u64::MAX));
        }
        match httpdate::parse_http_date(text) {
            Ok(at) => RetryAfter::At(at),
            Err(_) => RetryAfter::Malformed(text.chars().take(64).collect()),
        }
    }

    /// The delay before the message is visible again: as asked, within `cap`; `default`
    /// when nothing usable was asked. The adjustment says why it differs from the ask.
    pub(crate) fn delay(&self, now: SystemTime, default: Duration, cap: Duration) -> (Duration, Option<RetryAfterAdjustment>) {
        let asked = match self {
            RetryAfter::Unspecified => return (default.min(cap), None),
            RetryAfter::Malformed(_) => return (default.min(cap), Some(RetryAfterAdjustment::Malformed)),
            // "Now" from an app that is shedding load would make a hot loop of retries: an
            // ask of no time is taken as one already past.
            RetryAfter::Seconds(0) => return (default.min(cap), Some(RetryAfterAdjustment::Past)),
            RetryAfter::Seconds(seconds) => Duration::from_secs(*seconds),
            RetryAfter::At(at) => match at.duration_since(now) {
                Ok(wait) if !wait.is_zero() => wait,
                _ => return (default.min(cap), Some(RetryAfterAdjustment::Past)),
            },
        };
        if asked > cap { (cap, Some(RetryAfterAdjustment::Capped)) } else { (asked, None) }
    }
}

/// How much of a failing handler's answer is kept for the error message.
const ERROR_BODY_BYTES: usize = 4096;
/// How much of it is quoted.
const ERROR_QUOTE_CHARS: usize = 200;

/// POSTs the body to a URL; a 2xx answer is success; 429 and 503 push back (see
/// [`PushedBack`]); anything else (a redirect included: a redirected POST would arrive as a
/// GET without the body) or the timeout is a failure.
/// Headers: `ebb-queue`, `ebb-message-id`, `ebb-dequeue-count`, `ebb-inserted-at` (RFC 3339).
pub struct HttpHandler {
    client: reqwest::Client,
    url: reqwest::Url,
    /// The URL with its password masked, for logs and errors.
    shown_url: String,
    timeout: Duration,
}

impl HttpHandler {
    /// A handler posting to `url`, giving up on a request after `timeout`.
    pub fn new(url: reqwest::Url, timeout: Duration) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().context("failed to create the HTTP client")?;
        Ok(HttpHandler { client, shown_url: masked(&url), url, timeout })
    }
}

/// `url` with its password, if any, replaced by `***`.
pub(crate) fn masked(url: &reqwest::Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    shown.to_string()
}

/// True when an error comes from the host lacking a resource (file descriptors).
fn is_host_resource_error(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && matches!(io.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
        {
            return true;
        }
        cause = error.source();
    }
    false
}

/// Reads at most `limit` bytes of a body (a failing handler may answer with gigabytes).
async fn body_prefix(mut response: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    while kept.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => kept.extend_from_slice(&chunk[..chunk.len().min(limit - kept.len())]),
            _ => break,
        }
    }
    kept
}

/// Most bytes of an answer kept as a reply (a reply must fit a message anyway).
pub const MAX_REPLY_BYTES: usize = 1 << 20;

/// Most bytes of a batch call's answer read for the failed indexes.
const MAX_BATCH_ANSWER_BYTES: usize = 1 << 20;

/// What a batch call's answer may name: `{"failed": [indexes]}` (other fields ignored).
#[derive(serde::Deserialize)]
struct BatchAnswer {
    failed: Vec<u64>,
}

impl HttpHandler {
    /// POSTs `body` with `message`'s headers; the response when it is a 2xx, else the failure.
    async fn call(&self, message: &IncomingMessage, body: Bytes, batch: Option<usize>) -> anyhow::Result<reqwest::Response> {
        let mut request = self
            .client
            .post(self.url.clone())
            .timeout(self.timeout)
            .header("ebb-queue", &message.queue)
            .header("ebb-message-id", message.id.as_str())
            .header("ebb-dequeue-count", message.dequeue_count.to_string())
            .header("ebb-inserted-at", humantime::format_rfc3339_millis(message.inserted_at).to_string());
        if let Some(item) = message.item {
            request = request
                .header("ebb-item-index", item.index.to_string())
                .header("ebb-item-count", item.count.to_string())
                .header("ebb-item-attempts", item.attempts.to_string());
        }
        // The app's spans join the trace: the handling's span (an item's own, in its
        // producer's trace) is their parent when spans are exported, else the producer's.
        if let Some(context) = crate::telemetry::TraceContext::passed_on(&tracing::Span::current(), message.trace.as_ref()) {
            request = request.header("traceparent", context.traceparent());
            if let Some(state) = context.tracestate() {
                request = request.header("tracestate", state);
            }
        }
        if let Some(size) = batch {
            request = request.header("ebb-batch-size", size.to_string()).header(reqwest::header::CONTENT_TYPE, "application/json");
        }
        let response = request.body(body).send().await;
        let response = match response {
            Ok(response) => response,
            Err(error) => {
                // reqwest puts the URL, password included, in its errors.
                let error = error.without_url();
                let failure = anyhow::Error::new(error).context(format!("handler {} did not answer", self.shown_url));
                if is_host_resource_error(failure.as_ref()) {
                    return Err(HostError(failure).into());
                }
                return Err(failure);
            }
        };
        let status = response.status();
        if status.is_redirection() {
            let to = response.headers().get(reqwest::header::LOCATION).and_then(|v| v.to_str().ok()).unwrap_or("?").to_string();
            let detail = format!("handler {} answered {status} (to {to}); ebb does not follow redirects: set handler.url to the final address", self.shown_url);
            return Err(HandlerStatus { status: status.as_u16(), detail }.into());
        }
        if matches!(status, reqwest::StatusCode::TOO_MANY_REQUESTS | reqwest::StatusCode::SERVICE_UNAVAILABLE) {
            let retry_after = response.headers().get(reqwest::header::RETRY_AFTER).map_or(RetryAfter::Unspecified, |v| RetryAfter::parse(v.as_bytes()));
            return Err(PushedBack { retry_after, detail: format!("handler {} answered {status}", self.shown_url) }.into());
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body_prefix(response, ERROR_BODY_BYTES).await).into_owned();
            // Control characters escaped: an answer must not write lines of its own into the log.
            let text: String =
                text.chars().take(ERROR_QUOTE_CHARS).flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] }).collect();
            return Err(HandlerStatus { status: status.as_u16(), detail: format!("handler {} answered {status}: {text}", self.shown_url) }.into());
        }
        Ok(response)
    }
}

#[async_trait]
impl Handler for HttpHandler {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        self.call(message, message.body.clone(), None).await.map(drop)
    }

    /// A 200 with a non-empty body answers (at most [`MAX_REPLY_BYTES`]); any other 2xx,
    /// or an empty body, does not.
    async fn handle_with_reply(&self, message: &IncomingMessage) -> anyhow::Result<Option<Bytes>> {
        let response = self.call(message, message.body.clone(), None).await?;
        if response.status() != reqwest::StatusCode::OK {
            return Ok(None);
        }
        let body = body_prefix(response, MAX_REPLY_BYTES + 1).await;
        if body.len() > MAX_REPLY_BYTES {
            return Err(AnswerTooLarge(format!("handler {} answered with more than {MAX_REPLY_BYTES} bytes: too large for a reply", self.shown_url)).into());
        }
        Ok((!body.is_empty()).then(|| Bytes::from(body)))
    }

    /// One POST of a JSON array: each item's body as a JSON value when it is JSON, else as
    /// a string (every item here is UTF-8: the listener delivers others alone). A 2xx
    /// answer with `{"failed": [indexes]}` fails those items; a 2xx with an empty body, all
    /// succeeded; a 2xx with any other body (not JSON, wrong types, no `failed`, an index
    /// out of range), all failed with that reason; anything else (429 and 503 pushing
    /// back), all failed alike.
    async fn handle_batch(&self, items: &[IncomingMessage]) -> Vec<anyhow::Result<()>> {
        let Some(first) = items.first() else { return Vec::new() };
        let mut array = Vec::with_capacity(items.iter().map(|i| i.body.len() + 3).sum::<usize>() + 2);
        array.push(b'[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                array.push(b',');
            }
            if serde_json::from_slice::<serde::de::IgnoredAny>(&item.body).is_ok() {
                array.extend_from_slice(&item.body);
            } else {
                let text = String::from_utf8_lossy(&item.body);
                serde_json::to_writer(&mut array, &text).expect("a string serialises");
            }
        }
        array.push(b']');
        let all = |error: &anyhow::Error| -> Vec<anyhow::Result<()>> {
            items
                .iter()
                .map(|_| {
                    Err(match error.downcast_ref::<PushedBack>() {
                        Some(pushed) => PushedBack { retry_after: pushed.retry_after.clone(), detail: pushed.detail.clone() }.into(),
                        None => anyhow::anyhow!("{error:#}"),
                    })
                })
                .collect()
        };
        // One call has one parent: a context the items do not all share is none of theirs.
        let shared = items.iter().all(|item| item.trace == first.trace);
        let first = if shared { first.clone() } else { IncomingMessage { trace: None, ..first.clone() } };
        let response = match self.call(&first, Bytes::from(array), Some(items.len())).await {
            Ok(response) => response,
            Err(error) => return all(&error),
        };
        // One byte past the limit shows an answer cut short (refused, not half-read).
        let body = body_prefix(response, MAX_BATCH_ANSWER_BYTES + 1).await;
        let failed = if body.iter().all(u8::is_ascii_whitespace) {
            Vec::new()
        } else {
            match serde_json::from_slice::<BatchAnswer>(&body) {
                Ok(answer) if body.len() <= MAX_BATCH_ANSWER_BYTES => answer.failed,
                // Not silently "all succeeded": the handler may have done none of it.
                outcome => {
                    let why = match outcome {
                        Err(error) => error.to_string(),
                        Ok(_) => format!("more than {MAX_BATCH_ANSWER_BYTES} bytes"),
                    };
                    let quoted: String = String::from_utf8_lossy(&body)
                        .chars()
                        .take(ERROR_QUOTE_CHARS)
                        .flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] })
                        .collect();
                    return all(&anyhow::anyhow!(
                        "handler {} answered the batch of {} with a 2xx whose body is not {{\"failed\": [indexes]}} ({why}): \"{quoted}\"; every item of the batch counts as failed",
                        self.shown_url,
                        items.len()
                    ));
                }
            }
        };
        if let Some(out_of_range) = failed.iter().find(|&&i| i >= items.len() as u64) {
            return all(&anyhow::anyhow!("handler {} answered that item {out_of_range} failed, of a batch of {}", self.shown_url, items.len()));
        }
        (0..items.len() as u64)
            .map(|i| if failed.contains(&i) { Err(anyhow::anyhow!("handler {} answered that item {i} of the batch failed", self.shown_url)) } else { Ok(()) })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_after_of_no_time_waits_the_default_delay_not_a_hot_loop() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let (default, cap) = (Duration::from_secs(1), Duration::from_secs(600));
        assert_eq!(RetryAfter::parse(b"0").delay(now, default, cap), (default, Some(RetryAfterAdjustment::Past)));
        assert_eq!(RetryAfter::parse(b"2").delay(now, default, cap), (Duration::from_secs(2), None));
        assert_eq!(RetryAfter::At(now).delay(now, default, cap), (default, Some(RetryAfterAdjustment::Past)));
    }
}
