//! What processes a message: a Rust [`Handler`] when ebb is embedded as a library, or
//! [`HttpHandler`], which forwards each message to an application over HTTP (any language).

use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};
use async_trait::async_trait;

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
    /// The body, as put.
    pub body: Vec<u8>,
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

/// POSTs the body to a URL; a 2xx answer is success, anything else (or the timeout) failure.
/// Headers: `ebb-queue`, `ebb-message-id`, `ebb-dequeue-count`, `ebb-inserted-at` (RFC 3339).
pub struct HttpHandler {
    client: reqwest::Client,
    url: reqwest::Url,
    timeout: Duration,
}

impl HttpHandler {
    /// A handler posting to `url`, giving up on a request after `timeout`.
    pub fn new(url: reqwest::Url, timeout: Duration) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder().build().context("failed to create the HTTP client")?;
        Ok(HttpHandler { client, url, timeout })
    }
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
            .await
            .with_context(|| format!("handler {} did not answer", self.url))?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            let text: String = text.chars().take(200).collect();
            bail!("handler {} answered {status}: {text}", self.url);
        }
        Ok(())
    }
}
