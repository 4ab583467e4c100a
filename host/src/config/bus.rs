//! `[bus]`: the publish/subscribe engine between hosts, and its validation.

use super::serde_defaults;
use anyhow::{Context as _, Result, bail};
use serde::Deserialize;

/// `[bus]`: the publish/subscribe engine that carries push notifications between hosts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BusFile {
    /// `redis://[:password@]host:port[/db]` or `rediss://…` (TLS).
    pub redis_url: Option<String>,
    /// The environment variable holding the Redis URL (keeps a password out of the file).
    pub redis_url_env: Option<String>,
    /// Channel names: `<channel_prefix><queue>`. Default `ebb:queue:`.
    #[serde(default = "serde_defaults::channel_prefix")]
    pub channel_prefix: String,
}

/// A validated `[bus]`; its `Debug` form hides the URL (it may carry a password).
#[derive(Clone)]
pub struct BusConfig {
    /// The Redis URL.
    pub redis_url: String,
    /// Channel names: `<channel_prefix><queue>`.
    pub channel_prefix: String,
}

impl std::fmt::Debug for BusConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BusConfig").field("redis_url", &"<redacted>").field("channel_prefix", &self.channel_prefix).finish()
    }
}

impl BusConfig {
    /// The engine it names (nothing is connected yet).
    pub fn engine(&self) -> Result<std::sync::Arc<dyn crate::bus::PubSub>> {
        Ok(std::sync::Arc::new(crate::bus::redis::RedisPubSub::new(&self.redis_url)?))
    }
}

impl BusFile {
    pub(super) fn validate(self) -> Result<BusConfig> {
        let redis_url = match (self.redis_url, self.redis_url_env) {
            (Some(url), None) => url,
            (None, Some(var)) => std::env::var(&var).map_err(|_| anyhow::anyhow!("bus.redis_url_env: the environment variable {var} is not set"))?,
            _ => bail!("bus: give the Redis URL as exactly one of redis_url or redis_url_env"),
        };
        crate::bus::redis::RedisPubSub::new(&redis_url).context("bus.redis_url")?;
        let prefix = self.channel_prefix;
        if prefix.is_empty() || prefix.len() > 200 || prefix.chars().any(|c| c.is_whitespace() || c.is_control() || c == '*' || c == '?' || c == '[') {
            bail!("bus.channel_prefix: {prefix:?} must be 1 to 200 characters without spaces, control characters or glob characters (* ? [)");
        }
        Ok(BusConfig { redis_url, channel_prefix: prefix })
    }
}
