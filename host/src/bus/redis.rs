//! Redis pub/sub as the bus: a local `redis-server`, or Azure Cache for Redis (`rediss://`,
//! TLS with the system's roots).

use anyhow::Context as _;
use async_trait::async_trait;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use redis::aio::MultiplexedConnection;

use super::PubSub;

/// How often an idle subscription is pinged, and how long an answer may take.
const PING_EVERY: std::time::Duration = std::time::Duration::from_secs(3);
const PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// A Redis server's pub/sub.
pub struct RedisPubSub {
    client: redis::Client,
    described: String,
    /// The publishing connection, opened on first use and again after a failure.
    publisher: tokio::sync::Mutex<Option<MultiplexedConnection>>,
}

impl RedisPubSub {
    /// A Redis at `url` (`redis://[:password@]host:port[/db]` or `rediss://…`); nothing is
    /// connected yet.
    pub fn new(url: &str) -> anyhow::Result<Self> {
        let client =
            redis::Client::open(url).map_err(|e| anyhow::anyhow!("not a Redis URL (redis://[:password@]host:port[/db] or rediss://…): {}", e.category()))?;
        let scheme = url.split_once("://").map_or("redis", |(scheme, _)| scheme);
        let described = format!("{scheme}://{}", client.get_connection_info().addr());
        Ok(RedisPubSub { client, described, publisher: tokio::sync::Mutex::new(None) })
    }
}

#[async_trait]
impl PubSub for RedisPubSub {
    fn describe(&self) -> String {
        self.described.clone()
    }

    async fn publish(&self, channel: &str, payload: &[u8]) -> anyhow::Result<()> {
        let mut publisher = self.publisher.lock().await;
        // A kept connection may have died with the server since (an outage): then one more
        // try on a fresh connection.
        let tries = if publisher.is_some() { 2 } else { 1 };
        let mut last_error = None;
        for _ in 0..tries {
            let connection = match publisher.as_mut() {
                Some(connection) => connection,
                None => {
                    publisher.insert(self.client.get_multiplexed_async_connection().await.with_context(|| format!("cannot connect to {}", self.described))?)
                }
            };
            let published: redis::RedisResult<i64> = redis::cmd("PUBLISH").arg(channel).arg(payload).query_async(connection).await;
            match published {
                Ok(_) => return Ok(()),
                Err(error) => {
                    *publisher = None;
                    last_error = Some(error);
                }
            }
        }
        let error = last_error.expect("at least one try");
        Err(anyhow::anyhow!("{}: PUBLISH {channel}: {error}", self.described))
    }

    async fn reach(&self) -> anyhow::Result<()> {
        let mut connection = self.client.get_multiplexed_async_connection().await.with_context(|| format!("cannot connect to {}", self.described))?;
        let _: redis::Value = redis::cmd("PING").query_async(&mut connection).await.map_err(|e| anyhow::anyhow!("{}: PING: {e}", self.described))?;
        Ok(())
    }

    async fn subscribe(&self, channels: &[String]) -> anyhow::Result<BoxStream<'static, (String, Vec<u8>)>> {
        let mut pubsub = self.client.get_async_pubsub().await.with_context(|| format!("cannot connect to {}", self.described))?;
        pubsub.subscribe(channels).await.with_context(|| format!("{}: SUBSCRIBE", self.described))?;
        let (mut sink, messages) = pubsub.split();
        // A stalled server or a silently dropped connection (a load balancer that sends no
        // reset) never ends the stream by itself: ping it, and end the stream when a ping
        // goes unanswered, so the bus reports the outage and the queues poll.
        let lost = tokio_util::sync::CancellationToken::new();
        let pinger = lost.clone();
        let pings = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(PING_EVERY) => {}
                    _ = pinger.cancelled() => return,
                }
                let answered = tokio::time::timeout(PING_TIMEOUT, sink.ping::<redis::Value>()).await;
                if !matches!(answered, Ok(Ok(_))) {
                    pinger.cancel();
                    return;
                }
            }
        });
        // Dropping the stream (a reconnection, a stop) ends the pinger there and then, even
        // in the middle of a ping.
        let stop_pings = tokio_util::task::AbortOnDropHandle::new(pings);
        let until_lost = lost.cancelled_owned();
        Ok(messages
            .map(move |message| {
                let _ = &stop_pings;
                (message.get_channel_name().to_string(), message.get_payload_bytes().to_vec())
            })
            .take_until(until_lost)
            .boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_never_shows_a_password_and_bad_urls_are_refused() {
        let engine = RedisPubSub::new("redis://:s3cret@cache.example:6380/2").unwrap();
        assert_eq!(engine.describe(), "redis://cache.example:6380");
        let tls = RedisPubSub::new("rediss://user:s3cret@cache.example:6380").unwrap();
        assert_eq!(tls.describe(), "rediss://cache.example:6380");
        for bad in ["http://cache.example", "cache.example:6379", "redis://:s3cret@[::1"] {
            let error = RedisPubSub::new(bad).err().unwrap_or_else(|| panic!("{bad} was taken"));
            assert!(!format!("{error:#}").contains("s3cret"), "{error:#}");
        }
    }
}
