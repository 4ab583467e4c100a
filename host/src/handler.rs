//! What processes a message: a Rust [`Handler`] when ebb is embedded as a library, or
//! [`HttpHandler`], which forwards each message to an application over HTTP (any language).

use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};
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
    /// The body, as put (cloning it shares the buffer, it does not copy it).
    pub body: Bytes,
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
}

/// The host could not call the handler for a reason of its own (it ran out of file
/// descriptors): not the message's fault, so the try does not count towards poisoning.
#[derive(Debug, thiserror::Error)]
#[error("the host could not call the handler: {0:#}")]
pub struct HostError(pub anyhow::Error);

/// The app asked for a pause (HTTP 429 Too Many Requests or 503 Service Unavailable, or a
/// Rust handler returning this error): not the message's fault. The message is made visible
/// again after the app's `Retry-After` (capped at the queue's `max_retry_delay`; the queue's
/// first retry delay when absent or unusable), counted as pushed back, not as failed, and
/// it is not poisoned for it until its dequeue count reaches [`PUSHED_BACK_POISON_DEQUEUES`].
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
pub const PUSHED_BACK_POISON_DEQUEUES: u32 = 1_000;

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
pub enum RetryAfterAdjustment {
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
    pub fn delay(&self, now: SystemTime, default: Duration, cap: Duration) -> (Duration, Option<RetryAfterAdjustment>) {
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
pub fn masked(url: &reqwest::Url) -> String {
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

#[async_trait]
impl Handler for HttpHandler {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        let response = self
            .client
            .post(self.url.clone())
            .timeout(self.timeout)
            .header("ebb-queue", &message.queue)
            .header("ebb-message-id", message.id.as_str())
            .header("ebb-dequeue-count", message.dequeue_count.to_string())
            .header("ebb-inserted-at", humantime::format_rfc3339_millis(message.inserted_at).to_string())
            .body(message.body.clone())
            .send()
            .await;
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
            bail!("handler {} answered {status} (to {to}); ebb does not follow redirects: set handler.url to the final address", self.shown_url);
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
            bail!("handler {} answered {status}: {text}", self.shown_url);
        }
        Ok(())
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
