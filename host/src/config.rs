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
use crate::queue::MAX_BATCH;
use crate::rules::{QueueRuleConfig, RuleLimits};

/// Environment variable that supplies the API token (overrides `api.token`).
pub const TOKEN_ENV: &str = "EBB_API_TOKEN";

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
    /// Largest message body accepted, in bytes. Default 65536 (Azure's limit).
    #[serde(default = "defaults::max_message_bytes")]
    pub max_message_bytes: usize,
    /// How long shutdown waits for in-flight messages before releasing them. Default `30s`.
    #[serde(default = "defaults::drain_timeout", with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// The HTTP API.
    #[serde(default)]
    pub api: ApiFile,
    /// Limits every rule runs under.
    #[serde(default)]
    pub rule_limits: RuleLimitsFile,
    /// The queues to listen to, by name.
    #[serde(default)]
    pub queues: BTreeMap<String, QueueFile>,
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
}

impl Default for ApiFile {
    fn default() -> Self {
        ApiFile { listen: defaults::listen(), token: None }
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
}

impl Default for RuleLimitsFile {
    fn default() -> Self {
        RuleLimitsFile {
            call_deadline: defaults::call_deadline(),
            call_fuel: defaults::call_fuel(),
            memory_mib: defaults::memory_mib(),
            quarantine_after: defaults::quarantine_after(),
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
    #[serde(default)]
    pub push: bool,
    /// Least time between two task-count decisions. Default `1s`.
    #[serde(default = "defaults::scale_interval", with = "humantime_serde")]
    pub scale_interval: Duration,
    /// Rule file name in `rules_dir`. Default: the built-in rule (the paper's).
    pub rule: Option<String>,
    /// Parameters passed to the rule's `configure`. Default: none.
    #[serde(default)]
    pub rule_params: BTreeMap<String, String>,
    /// Where messages go.
    pub handler: HandlerFile,
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

mod defaults {
    use std::path::PathBuf;
    use std::time::Duration;

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
    pub fn listen() -> String {
        "127.0.0.1:7070".into()
    }
    pub fn call_deadline() -> Duration {
        Duration::from_millis(10)
    }
    pub fn call_fuel() -> u64 {
        10_000_000
    }
    pub fn memory_mib() -> usize {
        64
    }
    pub fn quarantine_after() -> u32 {
        5
    }
    pub fn batch_size() -> u32 {
        32
    }
    pub fn min_tasks() -> u32 {
        1
    }
    pub fn max_tasks() -> u32 {
        32
    }
    pub fn min_polling_interval() -> Duration {
        Duration::from_millis(100)
    }
    pub fn max_polling_interval() -> Duration {
        Duration::from_secs(60)
    }
    pub fn visibility_timeout() -> Duration {
        Duration::from_secs(1)
    }
    pub fn max_retry_delay() -> Duration {
        Duration::from_secs(600)
    }
    pub fn lease_duration() -> Duration {
        Duration::from_secs(30)
    }
    pub fn max_dequeue_count() -> u32 {
        5
    }
    pub fn scale_interval() -> Duration {
        Duration::from_secs(1)
    }
    pub fn handler_timeout() -> Duration {
        Duration::from_secs(30)
    }
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
    /// API address.
    pub listen: SocketAddr,
    /// API token, if any.
    pub token: Option<String>,
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
    pub handler_url: String,
    /// Handler timeout.
    pub handler_timeout: Duration,
}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).with_context(|| format!("failed to read config {}", path.display()))?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Config::parse(&text, &base, std::env::var(TOKEN_ENV).ok()).with_context(|| format!("invalid config {}", path.display()))
    }

    /// Parses and validates config text; relative paths are taken from `base`.
    pub fn parse(text: &str, base: &Path, env_token: Option<String>) -> Result<Config> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
        file.validate(base, env_token)
    }
}

impl ConfigFile {
    fn validate(self, base: &Path, env_token: Option<String>) -> Result<Config> {
        let listen: SocketAddr =
            self.api.listen.parse().map_err(|_| anyhow::anyhow!("api.listen: {:?} is not an address like 127.0.0.1:7070", self.api.listen))?;
        let token = env_token.filter(|t| !t.is_empty()).or(self.api.token);
        if !listen.ip().is_loopback() && token.is_none() {
            bail!("api.listen: {listen} is not a loopback address, so api.token (or {TOKEN_ENV}) is required");
        }
        if self.max_message_bytes == 0 {
            bail!("max_message_bytes: must be more than 0");
        }
        if self.rule_limits.memory_mib == 0 || self.rule_limits.call_fuel == 0 || self.rule_limits.call_deadline.is_zero() {
            bail!("rule_limits: call_deadline, call_fuel and memory_mib must be more than 0");
        }
        let rules_dir = base.join(&self.rules_dir);
        let mut queues = Vec::new();
        for (name, queue) in self.queues {
            queues.push(queue.validate(&name, &rules_dir).with_context(|| format!("queues.{name}"))?);
        }
        if queues.is_empty() {
            bail!("queues: configure at least one queue ([queues.<name>] with a handler)");
        }
        Ok(Config {
            data_dir: base.join(self.data_dir),
            rules_dir,
            max_message_bytes: self.max_message_bytes,
            drain_timeout: self.drain_timeout,
            listen,
            token,
            rule_limits: RuleLimits {
                call_deadline: self.rule_limits.call_deadline,
                call_fuel: self.rule_limits.call_fuel,
                memory_bytes: self.rule_limits.memory_mib << 20,
                quarantine_after: self.rule_limits.quarantine_after,
                ..RuleLimits::default()
            },
            queues,
        })
    }
}

/// Queue names as Azure allows them: 3–63 lowercase letters, digits and single dashes.
fn check_queue_name(name: &str) -> Result<()> {
    let ok_chars = name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !(3..=56).contains(&name.len()) || !ok_chars || name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        bail!("{name:?} is not a valid queue name: 3 to 56 lowercase letters, digits and single dashes (\"-poison\" is added for its poison queue)");
    }
    Ok(())
}

impl QueueFile {
    fn validate(self, name: &str, rules_dir: &Path) -> Result<QueueConfig> {
        check_queue_name(name)?;
        if !(1..=MAX_BATCH).contains(&self.batch_size) {
            bail!("batch_size: must be 1 to {MAX_BATCH}, got {}", self.batch_size);
        }
        if self.max_tasks == 0 {
            bail!("max_tasks: must be at least 1");
        }
        if self.min_tasks > self.max_tasks {
            bail!("min_tasks: {} is more than max_tasks ({})", self.min_tasks, self.max_tasks);
        }
        if self.min_tasks == 0 && !self.push {
            bail!("min_tasks: 0 needs push = true (without push notifications, nothing would notice new messages)");
        }
        if self.min_polling_interval.is_zero() {
            bail!("min_polling_interval: must be more than 0");
        }
        if self.min_polling_interval > self.max_polling_interval {
            bail!("min_polling_interval: {} is more than max_polling_interval ({})", humantime::format_duration(self.min_polling_interval), humantime::format_duration(self.max_polling_interval));
        }
        if self.lease_duration < Duration::from_secs(1) {
            bail!("lease_duration: must be at least 1s");
        }
        if self.max_dequeue_count == 0 {
            bail!("max_dequeue_count: must be at least 1");
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
        let url = reqwest::Url::parse(&self.handler.url).map_err(|e| anyhow::anyhow!("handler.url: {:?} is not a URL: {e}", self.handler.url))?;
        if !matches!(url.scheme(), "http" | "https") {
            bail!("handler.url: {:?} must be http or https", self.handler.url);
        }
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
                scale_interval: self.scale_interval,
                random_seed: None,
            },
            rule: QueueRuleConfig { queue: name.to_string(), rule, params: self.rule_params.into_iter().collect() },
            handler_url: self.handler.url,
            handler_timeout: self.handler.timeout,
        })
    }
}
