//! `ebb.toml`: the file form (serde, unknown keys rejected, units in every doc) and its
//! validation into the runtime types. Every error names the key and the reason.
//!
//! Relative paths are relative to the folder of the config file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;

use crate::listener::QueueSettings;
use crate::queue::azure::{AzureAccount, Encoding, EntraMethod, EntraOptions};
use crate::queue::partitioned::{MAX_PARTITIONS, partition_name};
use crate::queue::{MAX_BATCH, MAX_VISIBILITY};
use crate::rules::{QueueRuleConfig, RuleLimits};

/// Environment variable that supplies the API token (overrides `api.token`).
pub const TOKEN_ENV: &str = "EBB_API_TOKEN";

/// Environment variable that supplies the scaler token (overrides `scaler.token`).
pub const SCALER_TOKEN_ENV: &str = "EBB_SCALER_TOKEN";

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Folder of the embedded queue store. Default `ebb-data`.
    #[serde(default = "defaults::data_dir")]
    pub data_dir: PathBuf,
    /// Watched folder of rule components. Default `rules`.
    #[serde(default = "defaults::rules_dir")]
    pub rules_dir: PathBuf,
    /// Largest message body accepted, in bytes, 1 to 1 MiB (also the API's body limit).
    /// Default 65536 (Azure's limit).
    #[serde(default = "defaults::max_message_bytes")]
    pub max_message_bytes: usize,
    /// How long shutdown waits for in-flight messages before releasing them. Default `30s`.
    #[serde(default = "defaults::drain_timeout", with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// What the storage service charges per 10,000 transactions, in US dollars, for the
    /// live cost figures. Default 0.01 (the whitepaper's price), 0 to 100.
    #[serde(default = "defaults::price_per_10k_transactions")]
    pub price_per_10k_transactions: f64,
    /// The HTTP API.
    #[serde(default)]
    pub api: ApiFile,
    /// KEDA's external scaler (gRPC), off unless `listen` is set.
    #[serde(default)]
    pub scaler: ScalerFile,
    /// Limits every rule runs under.
    #[serde(default)]
    pub rule_limits: RuleLimitsFile,
    /// The Azure Storage account of queues with `backend = "azure"` (a queue may name its own).
    pub azure: Option<AzureFile>,
    /// Push notifications across hosts.
    pub bus: Option<BusFile>,
    /// The queues to listen to, by name.
    #[serde(default)]
    pub queues: BTreeMap<String, QueueFile>,
}

/// `[bus]`: the publish/subscribe engine that carries push notifications between hosts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BusFile {
    /// `redis://[:password@]host:port[/db]` or `rediss://…` (TLS).
    pub redis_url: Option<String>,
    /// The environment variable holding the Redis URL (keeps a password out of the file).
    pub redis_url_env: Option<String>,
    /// Channel names: `<channel_prefix><queue>`. Default `ebb:queue:`.
    #[serde(default = "defaults::channel_prefix")]
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
    fn validate(self) -> Result<BusConfig> {
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

/// `[azure]` or `[queues.<name>.azure]`: one way to reach the account, and the encoding.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AzureFile {
    /// A connection string (`AccountName=…;AccountKey=…;…`, `UseDevelopmentStorage=true`, or
    /// with `SharedAccessSignature=…`).
    pub connection_string: Option<String>,
    /// The environment variable holding the connection string (keeps the secret out of the file).
    pub connection_string_env: Option<String>,
    /// The account name (with `key` or `key_env`).
    pub account: Option<String>,
    /// The account key.
    pub key: Option<String>,
    /// The environment variable holding the account key.
    pub key_env: Option<String>,
    /// The queue endpoint, e.g. `https://myaccount.queue.core.windows.net` (default from the account name).
    pub endpoint: Option<String>,
    /// With `account`, instead of a key: an Entra ID identity (`managed-identity`,
    /// `workload-identity`, `azure-cli`, `developer-tools`, `client-secret`).
    pub credential: Option<EntraMethod>,
    /// The identity's client id (a user-assigned managed identity, a workload identity, a service principal).
    pub client_id: Option<String>,
    /// The tenant id (`client-secret`; optional for `workload-identity` and `azure-cli`).
    pub tenant_id: Option<String>,
    /// The environment variable holding a service principal's secret (`client-secret`).
    pub client_secret_env: Option<String>,
    /// A PEM file of extra trusted root certificates for an https endpoint (a private CA;
    /// relative to the config file).
    pub ca_file: Option<PathBuf>,
    /// How bodies are written as message text: `base64` (default: Azure Functions' and the
    /// SDKs' convention) or `none` (UTF-8 text).
    pub message_encoding: Option<MessageEncoding>,
}

/// `message_encoding`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum MessageEncoding {
    /// Base64 of the bytes.
    Base64,
    /// The bytes as UTF-8 text.
    None,
}

/// Where a queue's messages live.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The embedded store in `data_dir`.
    #[default]
    Embedded,
    /// An Azure Storage account.
    Azure,
}

/// A validated backend.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The embedded store in `data_dir`.
    Embedded,
    /// An Azure Storage account; the `Debug` form of the account hides its secret.
    Azure {
        /// The account and its credential.
        account: AzureAccount,
        /// How bodies are written.
        encoding: Encoding,
    },
}

impl AzureFile {
    /// The account these keys name, or the key and the reason they do not.
    fn account(&self, key: &str, base: &Path) -> Result<(AzureAccount, Encoding)> {
        let env = |var_key: &str, var: &str| -> Result<String> {
            std::env::var(var).map_err(|_| anyhow::anyhow!("{key}.{var_key}: the environment variable {var} is not set"))
        };
        let sources = [self.connection_string.is_some(), self.connection_string_env.is_some(), self.account.is_some()];
        let account = match sources {
            [true, false, false] => AzureAccount::from_connection_string(self.connection_string.as_deref().unwrap_or_default())
                .with_context(|| format!("{key}.connection_string"))?,
            [false, true, false] => {
                let var = self.connection_string_env.as_deref().unwrap_or_default();
                AzureAccount::from_connection_string(&env("connection_string_env", var)?)
                    .with_context(|| format!("{key}.connection_string_env: the connection string in {var}"))?
            }
            [false, false, true] if self.credential.is_some() => {
                let name = self.account.as_deref().unwrap_or_default();
                let method = self.credential.unwrap_or(EntraMethod::ManagedIdentity);
                if self.key.is_some() || self.key_env.is_some() {
                    bail!("{key}.credential: give an account key or an Entra ID credential, not both");
                }
                let client_secret = match &self.client_secret_env {
                    Some(var) => Some(azure_core::credentials::Secret::new(env("client_secret_env", var)?)),
                    None => None,
                };
                let options = EntraOptions { client_id: self.client_id.clone(), tenant_id: self.tenant_id.clone(), client_secret };
                AzureAccount::with_entra(name, method, options, self.endpoint.as_deref()).with_context(|| format!("{key}.credential"))?
            }
            [false, false, true] => {
                let name = self.account.as_deref().unwrap_or_default();
                let secret = match (&self.key, &self.key_env) {
                    (Some(secret), None) => secret.clone(),
                    (None, Some(var)) => env("key_env", var)?,
                    _ => bail!("{key}.account: give the account key as exactly one of key or key_env, or an Entra ID credential"),
                };
                AzureAccount::with_key(name, &secret, self.endpoint.as_deref()).with_context(|| format!("{key}.account"))?
            }
            [false, false, false] => bail!("{key}: give one of connection_string, connection_string_env, or account with key, key_env or credential"),
            _ => bail!("{key}: give only one of connection_string, connection_string_env, or account"),
        };
        if (self.key.is_some() || self.key_env.is_some()) && self.account.is_none() {
            bail!("{key}.key: goes with account, not with a connection string");
        }
        if self.credential.is_none() {
            for (name, given) in
                [("client_id", self.client_id.is_some()), ("tenant_id", self.tenant_id.is_some()), ("client_secret_env", self.client_secret_env.is_some())]
            {
                if given {
                    bail!("{key}.{name}: goes with credential (an Entra ID identity)");
                }
            }
        }
        let account = match &self.ca_file {
            Some(file) => {
                let path = base.join(file);
                let pem = read_bounded(&path, MAX_CA_FILE_BYTES).with_context(|| format!("{key}.ca_file: {}", path.display()))?;
                account.with_root_certificate(&pem).with_context(|| format!("{key}.ca_file: {}", path.display()))?
            }
            None => account,
        };
        if self.endpoint.is_some() && self.account.is_none() {
            bail!("{key}.endpoint: goes with account (a connection string carries its own QueueEndpoint)");
        }
        let encoding = match self.message_encoding.unwrap_or(MessageEncoding::Base64) {
            MessageEncoding::Base64 => Encoding::Base64,
            MessageEncoding::None => Encoding::None,
        };
        Ok((account, encoding))
    }
}

/// `[api]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiFile {
    /// Address to listen on. Default `127.0.0.1:7070`. A non-loopback address needs a token.
    #[serde(default = "defaults::listen")]
    pub listen: String,
    /// Bearer token required on every request (or set `EBB_API_TOKEN`). Default: none.
    pub token: Option<String>,
    /// How long a client may take to send a request's headers (idle keep-alive time
    /// included) before its connection is closed. Default `10s`.
    #[serde(default = "defaults::header_read_timeout", with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// How long a connection may stay without traffic, no request being answered, before
    /// it is closed. Default `60s`.
    #[serde(default = "defaults::idle_timeout", with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Most connections open at once; more wait in the kernel's backlog. Default 256.
    #[serde(default = "defaults::max_connections")]
    pub max_connections: usize,
}

impl Default for ApiFile {
    fn default() -> Self {
        ApiFile {
            listen: defaults::listen(),
            token: None,
            header_read_timeout: defaults::header_read_timeout(),
            idle_timeout: defaults::idle_timeout(),
            max_connections: defaults::max_connections(),
        }
    }
}

/// `[scaler]`: KEDA's external-scaler gRPC service (see `docs/kubernetes.md`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScalerFile {
    /// Address to serve the scaler on. Default: none (the scaler is off). A non-loopback
    /// address needs a token.
    pub listen: Option<String>,
    /// Token every call must carry (`authorization: Bearer <token>` or the ScaledObject's
    /// `token`/`tokenFromEnv` metadata), or set `EBB_SCALER_TOKEN`. Default: none.
    pub token: Option<String>,
    /// Most instances the metric asks for, 1 to 10000. Default 100.
    #[serde(default = "defaults::max_instances")]
    pub max_instances: u32,
    /// `ebb scaler` only: how often each storage queue is counted (one billed count on
    /// Azure). Default `1s`; `100ms` to `1h`.
    #[serde(default = "defaults::scaler_poll_interval", with = "humantime_serde")]
    pub poll_interval: Duration,
}

impl Default for ScalerFile {
    fn default() -> Self {
        ScalerFile { listen: None, token: None, max_instances: defaults::max_instances(), poll_interval: defaults::scaler_poll_interval() }
    }
}

/// `[rule_limits]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleLimitsFile {
    /// Wall-clock budget of one decision. Default `10ms`.
    #[serde(default = "defaults::call_deadline", with = "humantime_serde")]
    pub call_deadline: Duration,
    /// Fuel (≈ wasm instructions) of one decision. Default 10000000.
    #[serde(default = "defaults::call_fuel")]
    pub call_fuel: u64,
    /// Linear memory per rule instance, in MiB. Default 64.
    #[serde(default = "defaults::memory_mib")]
    pub memory_mib: usize,
    /// Consecutive faults before a rule is quarantined. Default 5.
    #[serde(default = "defaults::quarantine_after")]
    pub quarantine_after: u32,
    /// Size bound of the compiled-rule cache on disk, in MiB. Default 256.
    #[serde(default = "defaults::cache_mib")]
    pub cache_mib: u64,
}

impl Default for RuleLimitsFile {
    fn default() -> Self {
        RuleLimitsFile {
            call_deadline: defaults::call_deadline(),
            call_fuel: defaults::call_fuel(),
            memory_mib: defaults::memory_mib(),
            quarantine_after: defaults::quarantine_after(),
            cache_mib: defaults::cache_mib(),
        }
    }
}

/// `[queues.<name>]`. Names follow Azure Functions' `host.json` queue settings where one exists.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueFile {
    /// Messages per get, 1 to 32. Default 32.
    #[serde(default = "defaults::batch_size")]
    pub batch_size: u32,
    /// Fewest dequeue tasks. Default 1 (0 allowed with `push = true`).
    #[serde(default = "defaults::min_tasks")]
    pub min_tasks: u32,
    /// Most dequeue tasks. Default 32.
    #[serde(default = "defaults::max_tasks")]
    pub max_tasks: u32,
    /// Shortest sleep after an empty get. Default `100ms`.
    #[serde(default = "defaults::min_polling_interval", with = "humantime_serde")]
    pub min_polling_interval: Duration,
    /// Longest sleep after an empty get. Default `1m` (as Azure Functions).
    #[serde(default = "defaults::max_polling_interval", with = "humantime_serde")]
    pub max_polling_interval: Duration,
    /// Retry delay after a handler failure, doubled with each further try. Default `1s`.
    #[serde(default = "defaults::visibility_timeout", with = "humantime_serde")]
    pub visibility_timeout: Duration,
    /// Cap on the retry delay. Default `10m`.
    #[serde(default = "defaults::max_retry_delay", with = "humantime_serde")]
    pub max_retry_delay: Duration,
    /// Lease a get takes on its messages, renewed at half while the handler runs. Default `30s`.
    #[serde(default = "defaults::lease_duration", with = "humantime_serde")]
    pub lease_duration: Duration,
    /// Tries before a message moves to `<queue>-poison`. Default 5 (as Azure Functions).
    #[serde(default = "defaults::max_dequeue_count")]
    pub max_dequeue_count: u32,
    /// Whether pushed messages and notifications wake the queue, so idle tasks may all stop. Default false.
    #[serde(default = "defaults::push")]
    pub push: bool,
    /// With `push = true`: while no task runs, one get at start-up and then one per this
    /// interval, so a message whose notification was lost waits at most this long.
    /// Default `1h`, `1s` to `24h`.
    #[serde(default, with = "humantime_serde")]
    pub safety_poll: Option<Duration>,
    /// Least time between two task-count decisions. Default `1s`.
    #[serde(default = "defaults::scale_interval", with = "humantime_serde")]
    pub scale_interval: Duration,
    /// One logical queue over this many partition queues `<name>-0` … `<name>-(N-1)`, each
    /// with its own listener and rule decisions. Default 1 (no partitions).
    #[serde(default = "defaults::partitions")]
    pub partitions: u32,
    /// Rule file name in `rules_dir`. Default: the built-in rule (the paper's).
    pub rule: Option<String>,
    /// Parameters passed to the rule's `configure`. Default: none.
    #[serde(default)]
    pub rule_params: BTreeMap<String, String>,
    /// Where messages go.
    pub handler: HandlerFile,
    /// Where the queue lives: `embedded` (default) or `azure`.
    #[serde(default)]
    pub backend: BackendKind,
    /// This queue's own Azure account (default: the host-wide `[azure]`).
    pub azure: Option<AzureFile>,
}

/// `[queues.<name>.handler]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerFile {
    /// URL each message is POSTed to; a 2xx answer is success.
    pub url: String,
    /// How long one POST may take before it counts as a failure. Default `30s`.
    #[serde(default = "defaults::handler_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

/// Defaults of the file form. Each value is written once: the runtime types' `Default`
/// ([`QueueSettings`], [`RuleLimits`], [`ApiLimits`]) hold theirs, and these read them.
mod defaults {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::{ApiLimits, ScalerSettings};
    use crate::listener::QueueSettings;
    use crate::rules::RuleLimits;

    pub fn data_dir() -> PathBuf {
        "ebb-data".into()
    }
    pub fn rules_dir() -> PathBuf {
        "rules".into()
    }
    pub fn max_message_bytes() -> usize {
        crate::queue::embedded::DEFAULT_MAX_MESSAGE_BYTES
    }
    pub fn drain_timeout() -> Duration {
        Duration::from_secs(30)
    }
    pub fn channel_prefix() -> String {
        "ebb:queue:".to_string()
    }

    pub fn price_per_10k_transactions() -> f64 {
        crate::cost::PAPER_PRICE_PER_10K
    }
    pub fn listen() -> String {
        "127.0.0.1:7070".into()
    }
    pub fn header_read_timeout() -> Duration {
        ApiLimits::default().header_read_timeout
    }
    pub fn idle_timeout() -> Duration {
        ApiLimits::default().idle_timeout
    }
    pub fn max_connections() -> usize {
        ApiLimits::default().max_connections
    }
    pub fn max_instances() -> u32 {
        ScalerSettings::default().max_instances
    }
    pub fn scaler_poll_interval() -> Duration {
        ScalerSettings::default().poll_interval
    }
    pub fn call_deadline() -> Duration {
        RuleLimits::default().call_deadline
    }
    pub fn call_fuel() -> u64 {
        RuleLimits::default().call_fuel
    }
    pub fn memory_mib() -> usize {
        RuleLimits::default().memory_bytes >> 20
    }
    pub fn quarantine_after() -> u32 {
        RuleLimits::default().quarantine_after
    }
    pub fn cache_mib() -> u64 {
        RuleLimits::default().cache_max_bytes >> 20
    }
    pub fn batch_size() -> u32 {
        QueueSettings::default().batch_size
    }
    pub fn min_tasks() -> u32 {
        QueueSettings::default().min_tasks
    }
    pub fn max_tasks() -> u32 {
        QueueSettings::default().max_tasks
    }
    pub fn min_polling_interval() -> Duration {
        QueueSettings::default().min_polling_interval
    }
    pub fn max_polling_interval() -> Duration {
        QueueSettings::default().max_polling_interval
    }
    pub fn visibility_timeout() -> Duration {
        QueueSettings::default().visibility_timeout
    }
    pub fn max_retry_delay() -> Duration {
        QueueSettings::default().max_retry_delay
    }
    pub fn lease_duration() -> Duration {
        QueueSettings::default().lease_duration
    }
    pub fn max_dequeue_count() -> u32 {
        QueueSettings::default().max_dequeue_count
    }
    pub fn push() -> bool {
        QueueSettings::default().push_enabled
    }
    pub fn scale_interval() -> Duration {
        QueueSettings::default().scale_interval
    }
    pub fn partitions() -> u32 {
        1
    }
    pub fn handler_timeout() -> Duration {
        Duration::from_secs(30)
    }
}

/// Largest `max_message_bytes`: 1 MiB, the largest request body the API accepts.
pub const MAX_MESSAGE_BYTES_LIMIT: usize = 1 << 20;
/// Longest polling interval, scale interval, drain, handler or API timeout.
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// Longest rule call deadline: a decision is meant to take microseconds.
pub const MAX_CALL_DEADLINE: Duration = Duration::from_secs(1);
/// Most linear memory per rule instance, in MiB.
pub const MAX_MEMORY_MIB: usize = 4096;
/// Largest compiled-rule cache, in MiB (64 GiB).
pub const MAX_CACHE_MIB: u64 = 65536;
/// Most API connections at once (each holds a file descriptor; the handler calls need theirs).
pub const MAX_API_CONNECTIONS: usize = 16384;
/// Longest safety poll interval (push mode).
pub const MAX_SAFETY_POLL: Duration = Duration::from_secs(24 * 3600);
/// Highest price per 10,000 transactions, in US dollars (today's prices are cents).
pub const MAX_PRICE_PER_10K: f64 = 100.0;
/// Most instances the scaler's metric asks for.
pub const MAX_INSTANCES: u32 = 10_000;
/// Most dequeue tasks per queue (each holds up to `batch_size` messages in flight).
pub const MAX_TASKS: u32 = 1024;
/// Longest queue name: Azure's 63 less the 7 of `-poison`, which names its poison queue.
pub const MAX_QUEUE_NAME_LEN: usize = 56;

/// The least a duration may be, for [`check_duration`].
enum AtLeast {
    /// Zero is fine.
    Zero,
    /// At least a millisecond (the unit the listener and rules work in).
    AboveZero,
    /// At least this much.
    Duration(Duration),
}

/// Checks that `key`'s `value` is at least `min` and at most `max`, naming the key and the bounds.
fn check_duration(key: &str, value: Duration, min: AtLeast, max: Duration) -> Result<()> {
    let show = |d: Duration| humantime::format_duration(d).to_string();
    let (ok, bounds) = match min {
        AtLeast::Zero => (value <= max, format!("at most {}", show(max))),
        AtLeast::AboveZero => (Duration::from_millis(1) <= value && value <= max, format!("1ms to {}", show(max))),
        AtLeast::Duration(min) => (min <= value && value <= max, format!("{} to {}", show(min), show(max))),
    };
    if !ok {
        bail!("{key}: must be {bounds}, got {}", show(value));
    }
    Ok(())
}

/// Largest `ca_file`: a bundle of a few hundred certificates.
const MAX_CA_FILE_BYTES: u64 = 1 << 20;

/// A small regular file's bytes, never blocking on a FIFO or reading a device without end.
fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::File::options().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    if !file.metadata()?.is_file() {
        bail!("not a regular file");
    }
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        bail!("larger than {limit} bytes");
    }
    Ok(bytes)
}

/// `key` names a folder: it must be one, or not exist yet (then it is created), never a file.
fn check_folder(key: &str, path: &Path) -> Result<()> {
    if let Some(existing) = path.ancestors().find(|a| a.symlink_metadata().is_ok())
        && !existing.is_dir()
    {
        if existing == path {
            bail!("{key}: {} is a file, not a folder", path.display());
        }
        bail!("{key}: {} cannot be a folder: {} is a file", path.display(), existing.display());
    }
    Ok(())
}

/// A validated configuration, ready to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Folder of the embedded queue store.
    pub data_dir: PathBuf,
    /// Watched rules folder.
    pub rules_dir: PathBuf,
    /// Largest message body, in bytes.
    pub max_message_bytes: usize,
    /// Shutdown's drain timeout.
    pub drain_timeout: Duration,
    /// US dollars per 10,000 storage transactions, for the cost figures.
    pub price_per_10k_transactions: f64,
    /// API address.
    pub listen: SocketAddr,
    /// Push notifications across hosts, if configured.
    pub bus: Option<BusConfig>,
    /// API token, if any.
    pub token: Option<String>,
    /// KEDA's external scaler: `None` when off.
    pub scaler: Option<ScalerSettings>,
    /// The API server's limits (`max_body_bytes` is `max_message_bytes`).
    pub api_limits: ApiLimits,
    /// Rule limits.
    pub rule_limits: RuleLimits,
    /// The queues.
    pub queues: Vec<QueueConfig>,
}

/// One validated queue.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// Its name.
    pub name: String,
    /// Listener settings.
    pub settings: QueueSettings,
    /// Its rule (path in the rules folder) and parameters.
    pub rule: QueueRuleConfig,
    /// Handler URL.
    pub handler_url: reqwest::Url,
    /// Handler timeout.
    pub handler_timeout: Duration,
    /// Partition queues (1: the queue is not partitioned).
    pub partitions: u32,
    /// Where its messages live.
    pub backend: Backend,
}

impl QueueConfig {
    /// The storage queues the listeners work on: the queue itself, or its partitions.
    pub fn storage_queues(&self) -> Vec<String> {
        if self.partitions <= 1 { vec![self.name.clone()] } else { (0..self.partitions).map(|i| partition_name(&self.name, i)).collect() }
    }

    /// Its poison queue (one for all partitions).
    pub fn poison_queue(&self) -> String {
        format!("{}-poison", self.name)
    }
}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).with_context(|| format!("failed to read config {}", path.display()))?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Config::parse_with_env(&text, &base, std::env::var(TOKEN_ENV).ok(), std::env::var(SCALER_TOKEN_ENV).ok())
            .with_context(|| format!("invalid config {}", path.display()))
    }

    /// Parses and validates config text; relative paths are taken from `base`.
    pub fn parse(text: &str, base: &Path, env_token: Option<String>) -> Result<Config> {
        Config::parse_with_env(text, base, env_token, None)
    }

    /// [`Config::parse`], with the scaler token's variable too (`EBB_SCALER_TOKEN`).
    pub fn parse_with_env(text: &str, base: &Path, env_token: Option<String>, env_scaler_token: Option<String>) -> Result<Config> {
        let file: ConfigFile = toml::from_str(text).map_err(toml_error)?;
        let scaler = file.scaler.validate(env_scaler_token)?;
        let mut config = file.validate(base, env_token)?;
        if let Some(scaler) = &scaler
            && scaler.listen == config.listen
            && scaler.listen.port() != 0
        {
            bail!("scaler.listen: {} is api.listen too; give the scaler an address of its own", scaler.listen);
        }
        config.scaler = scaler;
        Ok(config)
    }
}

/// A TOML error as the reader needs it: with its line when the parser knows it, and in words
/// for the nesting limit, which toml reports without a place as "recursion limit".
fn toml_error(error: toml::de::Error) -> anyhow::Error {
    match error.span() {
        Some(_) => anyhow::anyhow!("{}", error.to_string().trim_end()),
        None if error.message() == "recursion limit" => {
            anyhow::anyhow!("TOML parse error: tables, dotted keys or values are nested too deeply (the parser's recursion limit)")
        }
        None => anyhow::anyhow!("TOML parse error: {}", error.to_string().trim_end()),
    }
}

impl ConfigFile {
    fn validate(self, base: &Path, env_token: Option<String>) -> Result<Config> {
        let listen: SocketAddr =
            self.api.listen.parse().map_err(|_| anyhow::anyhow!("api.listen: {:?} is not an address like 127.0.0.1:7070", self.api.listen))?;
        let token = check_token("api.token", self.api.token, TOKEN_ENV, env_token)?;
        if !listen.ip().is_loopback() && token.is_none() {
            bail!("api.listen: {listen} is not a loopback address, so api.token (or {TOKEN_ENV}) is required");
        }
        check_duration("api.header_read_timeout", self.api.header_read_timeout, AtLeast::AboveZero, MAX_INTERVAL)?;
        check_duration("api.idle_timeout", self.api.idle_timeout, AtLeast::AboveZero, MAX_INTERVAL)?;
        if !(1..=MAX_API_CONNECTIONS).contains(&self.api.max_connections) {
            bail!("api.max_connections: must be 1 to {MAX_API_CONNECTIONS}, got {}", self.api.max_connections);
        }
        if !(1..=MAX_MESSAGE_BYTES_LIMIT).contains(&self.max_message_bytes) {
            bail!("max_message_bytes: must be 1 to {MAX_MESSAGE_BYTES_LIMIT} bytes (1 MiB, the largest body the API accepts), got {}", self.max_message_bytes);
        }
        check_duration("drain_timeout", self.drain_timeout, AtLeast::Zero, MAX_INTERVAL)?;
        let price = self.price_per_10k_transactions;
        if !(price.is_finite() && (0.0..=MAX_PRICE_PER_10K).contains(&price)) {
            bail!("price_per_10k_transactions: must be 0 to {MAX_PRICE_PER_10K} (US dollars per 10,000 transactions), got {price}");
        }
        let limits = &self.rule_limits;
        check_duration("rule_limits.call_deadline", limits.call_deadline, AtLeast::AboveZero, MAX_CALL_DEADLINE)?;
        if limits.call_fuel == 0 {
            bail!("rule_limits.call_fuel: must be more than 0");
        }
        if !(1..=MAX_MEMORY_MIB).contains(&limits.memory_mib) {
            bail!("rule_limits.memory_mib: must be 1 to {MAX_MEMORY_MIB}, got {}", limits.memory_mib);
        }
        if !(1..=MAX_CACHE_MIB).contains(&limits.cache_mib) {
            bail!("rule_limits.cache_mib: must be 1 to {MAX_CACHE_MIB}, got {}", limits.cache_mib);
        }
        let data_dir = base.join(&self.data_dir);
        check_folder("data_dir", &data_dir)?;
        let rules_dir = base.join(&self.rules_dir);
        check_folder("rules_dir", &rules_dir)?;
        for name in self.queues.keys() {
            if let Some(owner) = name.strip_suffix("-poison").filter(|owner| self.queues.contains_key(*owner)) {
                bail!("queues.{name}: this name is taken by the poison queue of queues.{owner}");
            }
        }
        let mut queues = Vec::new();
        for (name, queue) in self.queues {
            queues.push(queue.validate(&name, base, &rules_dir, self.azure.as_ref()).with_context(|| format!("queues.{name}"))?);
        }
        // Every storage queue (queues, partitions, poison queues) belongs to one configured queue.
        let mut owners: BTreeMap<String, &str> = BTreeMap::new();
        for queue in &queues {
            for (storage, role) in queue.storage_queues().into_iter().map(|s| (s, "")).chain([(queue.poison_queue(), "the poison queue of ")]) {
                if let Some(other) = owners.insert(storage.clone(), &queue.name) {
                    let (first, second) = if other < queue.name.as_str() { (other, queue.name.as_str()) } else { (queue.name.as_str(), other) };
                    bail!("queues.{second}: its storage queue {storage} is also used by queues.{first} ({role}or a partition)");
                }
            }
        }
        if queues.is_empty() {
            bail!("queues: configure at least one queue ([queues.<name>] with a handler)");
        }
        let bus = self.bus.map(BusFile::validate).transpose()?;
        Ok(Config {
            data_dir,
            rules_dir,
            max_message_bytes: self.max_message_bytes,
            drain_timeout: self.drain_timeout,
            price_per_10k_transactions: price,
            listen,
            bus,
            token,
            scaler: None,
            api_limits: ApiLimits {
                max_body_bytes: self.max_message_bytes,
                header_read_timeout: self.api.header_read_timeout,
                idle_timeout: self.api.idle_timeout,
                max_connections: self.api.max_connections,
            },
            rule_limits: RuleLimits {
                call_deadline: self.rule_limits.call_deadline,
                call_fuel: self.rule_limits.call_fuel,
                memory_bytes: self.rule_limits.memory_mib << 20,
                quarantine_after: self.rule_limits.quarantine_after,
                cache_max_bytes: self.rule_limits.cache_mib << 20,
                ..RuleLimits::default()
            },
            queues,
        })
    }
}

impl ScalerFile {
    fn validate(&self, env_token: Option<String>) -> Result<Option<ScalerSettings>> {
        if !(1..=MAX_INSTANCES).contains(&self.max_instances) {
            bail!("scaler.max_instances: must be 1 to {MAX_INSTANCES}, got {}", self.max_instances);
        }
        check_duration("scaler.poll_interval", self.poll_interval, AtLeast::Duration(Duration::from_millis(100)), MAX_INTERVAL)?;
        let token = check_token("scaler.token", self.token.clone(), SCALER_TOKEN_ENV, env_token)?;
        let Some(text) = &self.listen else {
            if token.is_some() && self.token.is_some() {
                bail!("scaler.token: set, but scaler.listen is not (the scaler is off); set scaler.listen or remove the token");
            }
            return Ok(None);
        };
        let listen: SocketAddr = text.parse().map_err(|_| anyhow::anyhow!("scaler.listen: {text:?} is not an address like 127.0.0.1:7071"))?;
        if !listen.ip().is_loopback() && token.is_none() {
            bail!("scaler.listen: {listen} is not a loopback address, so scaler.token (or {SCALER_TOKEN_ENV}) is required");
        }
        Ok(Some(ScalerSettings { listen, token, max_instances: self.max_instances, poll_interval: self.poll_interval }))
    }
}

/// A token from the file (`key`) or the environment (`env`, which wins): neither empty nor
/// blank, visible ASCII only (it travels in a header).
fn check_token(key: &str, file: Option<String>, env: &str, from_env: Option<String>) -> Result<Option<String>> {
    if file.as_deref().is_some_and(|t| t.trim().is_empty()) {
        bail!("{key}: is empty or blank; set a token, or remove the key to run without one");
    }
    let from_env = from_env.filter(|t| !t.is_empty());
    if from_env.as_deref().is_some_and(|t| t.trim().is_empty()) {
        bail!("{env}: is blank; set a token, or unset the variable");
    }
    let visible_ascii = |t: &str| t.bytes().all(|b| b.is_ascii_graphic());
    if file.as_deref().is_some_and(|t| !visible_ascii(t)) {
        bail!("{key}: use visible ASCII characters only (no spaces, no accents): it is sent in an HTTP header");
    }
    if from_env.as_deref().is_some_and(|t| !visible_ascii(t)) {
        bail!("{env}: use visible ASCII characters only (no spaces, no accents): it is sent in an HTTP header");
    }
    Ok(from_env.or(file))
}

/// Queue names as Azure allows them (3 to 63 lowercase letters, digits and single dashes),
/// at most [`MAX_QUEUE_NAME_LEN`] long so that `<name>-poison` is one too.
fn check_queue_name(name: &str) -> Result<()> {
    let ok_chars = name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !(3..=MAX_QUEUE_NAME_LEN).contains(&name.len()) || !ok_chars || name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        bail!(
            "{name:?} is not a valid queue name: 3 to {MAX_QUEUE_NAME_LEN} lowercase letters, digits and single dashes (\"-poison\" is added for its poison queue)"
        );
    }
    Ok(())
}

/// The handler URL: http or https, with a host written out (`http:///work` is rejected,
/// although URL parsing would take `work` for the host).
fn parse_handler_url(text: &str) -> Result<reqwest::Url> {
    let url = reqwest::Url::parse(text).map_err(|e| anyhow::anyhow!("handler.url: {text:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        bail!("handler.url: {text:?} must be http or https");
    }
    let authority = text.split_once("://").map_or("", |(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or(""));
    if authority.is_empty() || url.host_str().is_none_or(str::is_empty) {
        bail!("handler.url: {text:?} has no host; write it as http://host:port/path");
    }
    Ok(url)
}

impl QueueFile {
    fn validate(self, name: &str, base: &Path, rules_dir: &Path, host_azure: Option<&AzureFile>) -> Result<QueueConfig> {
        let backend = match (self.backend, &self.azure, host_azure) {
            (BackendKind::Embedded, Some(_), _) => bail!("azure: set backend = \"azure\" to use it"),
            (BackendKind::Embedded, None, _) => Backend::Embedded,
            (BackendKind::Azure, Some(own), _) => {
                let (account, encoding) = own.account("azure", base)?;
                Backend::Azure { account, encoding }
            }
            (BackendKind::Azure, None, Some(host)) => {
                let (account, encoding) = host.account("[azure]", base)?;
                Backend::Azure { account, encoding }
            }
            (BackendKind::Azure, None, None) => bail!("backend: \"azure\" needs an [azure] section, or [queues.{name}.azure]"),
        };
        check_queue_name(name)?;
        if !(1..=MAX_BATCH).contains(&self.batch_size) {
            bail!("batch_size: must be 1 to {MAX_BATCH}, got {}", self.batch_size);
        }
        if !(1..=MAX_TASKS).contains(&self.max_tasks) {
            bail!("max_tasks: must be 1 to {MAX_TASKS}, got {}", self.max_tasks);
        }
        if self.min_tasks > self.max_tasks {
            bail!("min_tasks: {} is more than max_tasks ({})", self.min_tasks, self.max_tasks);
        }
        if self.min_tasks == 0 && !self.push {
            bail!("min_tasks: 0 needs push = true (without push notifications, nothing would notice new messages)");
        }
        check_duration("min_polling_interval", self.min_polling_interval, AtLeast::AboveZero, MAX_INTERVAL)?;
        check_duration("max_polling_interval", self.max_polling_interval, AtLeast::AboveZero, MAX_INTERVAL)?;
        if self.min_polling_interval > self.max_polling_interval {
            bail!(
                "min_polling_interval: {} is more than max_polling_interval ({})",
                humantime::format_duration(self.min_polling_interval),
                humantime::format_duration(self.max_polling_interval)
            );
        }
        check_duration("lease_duration", self.lease_duration, AtLeast::Duration(Duration::from_secs(1)), MAX_VISIBILITY)?;
        check_duration("visibility_timeout", self.visibility_timeout, AtLeast::AboveZero, MAX_VISIBILITY)?;
        check_duration("max_retry_delay", self.max_retry_delay, AtLeast::Zero, MAX_VISIBILITY)?;
        check_duration("scale_interval", self.scale_interval, AtLeast::Zero, MAX_INTERVAL)?;
        let safety_poll = match self.safety_poll {
            Some(_) if !self.push => bail!("safety_poll: only applies with push = true (without push a task always polls)"),
            Some(interval) => {
                check_duration("safety_poll", interval, AtLeast::Duration(Duration::from_secs(1)), MAX_SAFETY_POLL)?;
                interval
            }
            None => QueueSettings::default().safety_poll,
        };
        if self.max_dequeue_count == 0 {
            bail!("max_dequeue_count: must be at least 1");
        }
        if !(1..=MAX_PARTITIONS).contains(&self.partitions) {
            bail!("partitions: must be 1 to {MAX_PARTITIONS}, got {}", self.partitions);
        }
        let rule = match self.rule {
            None if !self.rule_params.is_empty() => bail!("rule_params: given, but no rule is set (the built-in rule takes no parameters)"),
            None => None,
            Some(file) => {
                if file.contains('/') || file.contains('\\') || !file.ends_with(".wasm") {
                    bail!("rule: {file:?} must be a .wasm file name inside rules_dir, without a path");
                }
                Some(rules_dir.join(file))
            }
        };
        let handler_url = parse_handler_url(&self.handler.url)?;
        check_duration("handler.timeout", self.handler.timeout, AtLeast::AboveZero, MAX_INTERVAL)?;
        Ok(QueueConfig {
            name: name.to_string(),
            settings: QueueSettings {
                batch_size: self.batch_size,
                min_tasks: self.min_tasks,
                max_tasks: self.max_tasks,
                min_polling_interval: self.min_polling_interval,
                max_polling_interval: self.max_polling_interval,
                lease_duration: self.lease_duration,
                visibility_timeout: self.visibility_timeout,
                max_retry_delay: self.max_retry_delay,
                max_dequeue_count: self.max_dequeue_count,
                push_enabled: self.push,
                safety_poll,
                scale_interval: self.scale_interval,
                ..QueueSettings::default()
            },
            rule: QueueRuleConfig { queue: name.to_string(), rule, params: self.rule_params.into_iter().collect() },
            handler_url,
            handler_timeout: self.handler.timeout,
            partitions: self.partitions,
            backend,
        })
    }
}

/// Limits of the HTTP server (config keys `max_message_bytes`, `[api] header_read_timeout`
/// and `[api] idle_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiLimits {
    /// Largest request body, in bytes: the largest message (`max_message_bytes`). Default 65536.
    pub max_body_bytes: usize,
    /// How long a client may take to send a request's headers (from the first wait for them,
    /// idle keep-alive time included) before its connection is closed. Default 10 s.
    pub header_read_timeout: Duration,
    /// How long a connection may go without a byte read or written before it is closed (a
    /// request whose body stops coming, a client that stops reading). Default 60 s.
    pub idle_timeout: Duration,
    /// Most connections open at once; further clients wait in the kernel's backlog, so a
    /// flood of idle connections cannot take the file descriptors the host needs to call
    /// its handlers. Default 256.
    pub max_connections: usize,
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            max_body_bytes: crate::queue::embedded::DEFAULT_MAX_MESSAGE_BYTES,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 256,
        }
    }
}

/// `[scaler]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalerSettings {
    /// Where the gRPC service listens.
    pub listen: SocketAddr,
    /// Token every call must carry, if any.
    pub token: Option<String>,
    /// Most instances the metric asks for. Default 100.
    pub max_instances: u32,
    /// `ebb scaler`: how often each storage queue is counted. Default 1 s.
    pub poll_interval: Duration,
}

impl Default for ScalerSettings {
    fn default() -> Self {
        ScalerSettings { listen: SocketAddr::from(([127, 0, 0, 1], 7071)), token: None, max_instances: 100, poll_interval: Duration::from_secs(1) }
    }
}
