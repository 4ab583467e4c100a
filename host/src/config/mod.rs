//! `ebb.toml`: the file form (serde, unknown keys rejected, units in every doc) and its
//! validation into the runtime types. Every error names the key and the reason.
//!
//! Relative paths are relative to the folder of the config file.

//!
//! Where the configuration sits: above the parts whose settings it builds (`queue`,
//! `rules`, `bus`, `listener`), below what assembles and runs them (`service`, `host`,
//! `http`, `scaler`, the CLI). Settings of the parts above it ([`ApiLimits`],
//! [`ScalerSettings`]) are defined here, so no import runs back up. Every default lives
//! once, in [`crate::defaults`].
//!
//! - `file.rs`: the file form (serde), with its defaults in `serde_defaults.rs`;
//! - `validate.rs`, `queue.rs`: its validation into [`Config`] and [`QueueConfig`];
//! - `backend.rs`, `bus.rs`: the Azure account and the bus;
//! - `log.rs`, `telemetry.rs`: `[log]` and `[telemetry]`, which the CLI also reads before the log starts;
//! - `checks.rs`: the bounds of every value;
//! - `settings.rs`: the API server's and the scaler's settings.

mod backend;
mod bus;
mod checks;
mod file;
mod log;
mod queue;
pub(crate) use queue::{sqs_pickup_delay, sqs_polling_intervals};
mod serde_defaults;
mod settings;
mod telemetry;
mod validate;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::listener::QueueSettings;
use crate::names::{DecisionSite, PartitionName, PoisonQueueName, QueueName, RuleFileName};
use crate::rules::{QueueRuleConfig, RuleLimits};

pub use backend::Backend;
pub use bus::BusConfig;
pub use checks::{MAX_CONCURRENT_CALLS, MAX_PACK_LINGER, MAX_QUEUE_NAME_LEN};
pub(crate) use checks::{MAX_INTERVAL, MAX_PRICE_PER_10K, MAX_SAFETY_POLL, MAX_TASKS};
use file::ConfigFile;
pub use log::LogFormat;
pub(crate) use log::{LOG_FORMAT_ENV, log_format_in};
pub use settings::{ApiLimits, ApiRole, ApiToken, ScalerSettings};
pub(crate) use telemetry::telemetry_in;
pub use telemetry::{OtlpExport, OtlpProtocol, TelemetryFile};

pub(crate) use validate::DEFAULT_TOKEN_NAME;

/// Environment variable that supplies the API token. For `ebb run`, `ebb scaler` and
/// `ebb check` it is the host's admin token `default` (overriding `api.token`); for the
/// commands that call a running host (`ebb status`, `send`, `queue`, `poison`) it is the token
/// they send, as it is: any token the host knows, a named one included.
pub(crate) const TOKEN_ENV: &str = "EBB_API_TOKEN";

/// Environment variable naming the configured token the client commands send (as
/// `--token-name` does): `default` or a `[[api.tokens]]` name.
pub(crate) const TOKEN_NAME_ENV: &str = "EBB_TOKEN_NAME";

/// Environment variable that supplies the scaler token (overrides `scaler.token`).
pub(crate) const SCALER_TOKEN_ENV: &str = "EBB_SCALER_TOKEN";

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
    /// The API's tokens: `default` (`api.token` or `EBB_API_TOKEN`, admin) first, then
    /// `[[api.tokens]]`. None: the API takes every request as the admin `anonymous` (loopback
    /// only).
    pub tokens: Vec<ApiToken>,
    /// KEDA's external scaler: `None` when off.
    pub scaler: Option<ScalerSettings>,
    /// The API server's limits (`max_body_bytes` is `max_message_bytes`).
    pub api_limits: ApiLimits,
    /// Rule limits.
    pub rule_limits: RuleLimits,
    /// How the log is written (`[log] format`; `EBB_LOG_FORMAT` wins, read by the CLI).
    pub log_format: LogFormat,
    /// The queues.
    pub queues: Vec<QueueConfig>,
}

/// One validated queue.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// Its name.
    pub name: QueueName,
    /// Listener settings.
    pub settings: QueueSettings,
    /// Its rule file in the rules folder; `None` for the built-in rule.
    pub rule: Option<RuleFileName>,
    /// Its `rule_params`, passed to the rule's `configure`.
    pub rule_params: Vec<(String, String)>,
    /// Its shadow rule file in the rules folder: asked beside the rule, never applied.
    pub shadow_rule: Option<RuleFileName>,
    /// Its `shadow_rule_params`, passed to the shadow rule's `configure`.
    pub shadow_rule_params: Vec<(String, String)>,
    /// Handler URL; `None` when the embedding program gives a Rust handler instead.
    pub handler_url: Option<reqwest::Url>,
    /// Handler timeout.
    pub handler_timeout: Duration,
    /// Partition queues (1: the queue is not partitioned).
    pub partitions: u32,
    /// Where its messages live.
    pub backend: Backend,
    /// Claim checks: the largest offloaded body, and the sweeper's retention and period.
    pub claims: crate::payload::claims::ClaimSettings,
    /// Packing, delivery of items and answers.
    pub payload: crate::payload::PayloadSettings,
    /// Its arrivals recording's size cap in bytes; `None`: not recorded (`record = false`).
    pub record_max_bytes: Option<u64>,
}

impl QueueConfig {
    /// How the queue's backend bills its requests.
    pub fn billing(&self) -> crate::cost::Billing {
        match &self.backend {
            Backend::Sqs { queue_url, .. } => {
                let fifo = queue_url.as_ref().is_some_and(|(_, url)| url.trim_end_matches('/').ends_with(".fifo"));
                if fifo { crate::cost::Billing::SqsFifo } else { crate::cost::Billing::SqsStandard }
            }
            _ => crate::cost::Billing::Configured,
        }
    }

    /// The storage queues the listeners work on: the queue itself, or its partitions.
    pub fn storage_queues(&self) -> Vec<PartitionName> {
        self.name.partitions(self.partitions)
    }

    /// Its poison queue (one for all partitions).
    pub fn poison_queue(&self) -> PoisonQueueName {
        self.name.poison()
    }

    /// The rule of `slot`, one of this queue's decision sites: its file in `rules_dir`, and its
    /// parameters.
    pub fn rule_config(&self, slot: DecisionSite, rules_dir: &Path) -> QueueRuleConfig {
        QueueRuleConfig { slot, rule: self.rule.as_ref().map(|file| file.in_dir(rules_dir)), params: self.rule_params.clone() }
    }

    /// The shadow rule beside `slot`, in the site's shadow site ([`DecisionSite::shadow`]);
    /// `None` when the queue has no `shadow_rule`.
    pub fn shadow_rule_config(&self, slot: &DecisionSite, rules_dir: &Path) -> Option<QueueRuleConfig> {
        let file = self.shadow_rule.as_ref()?;
        Some(QueueRuleConfig { slot: slot.shadow(), rule: Some(file.in_dir(rules_dir)), params: self.shadow_rule_params.clone() })
    }
}

impl Config {
    /// The host's admin token `default`: `api.token` or `EBB_API_TOKEN`.
    pub fn default_token(&self) -> Option<&str> {
        self.tokens.iter().find(|t| t.name == DEFAULT_TOKEN_NAME).map(|t| t.secret.as_str())
    }

    /// Reads `path` for a command that calls the running host (`ebb status`, `send`,
    /// `queue`, `poison`), and picks the token it sends ([`Config::parse_for_client`]).
    /// `token_name`: `--token-name` or `EBB_TOKEN_NAME`.
    pub fn load_for_client(path: &Path, token_name: Option<&str>) -> Result<(Config, Option<String>)> {
        let text = crate::input::read_text("config", path, crate::input::MAX_CONFIG_BYTES)?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let env = |var: &str| std::env::var(var).ok();
        Config::parse_for_client(&text, &base, token_name, &env).map_err(|error| {
            // A token that cannot be picked is the command's to fix, not the file's.
            if error.downcast_ref::<ClientTokenError>().is_some() { error } else { error.context(format!("invalid config {}", path.display())) }
        })
    }

    /// [`Config::parse`] for a client of the running host, with the token it sends. The API's
    /// tokens are the host's to check, not a client's: `EBB_API_TOKEN` is not made the host's
    /// `default` here (so a named token's secret in it is no duplicate), a `[[api.tokens]]`
    /// whose `token_env` is not set here is left out (a client holds its own token, not
    /// everyone's), and a public `api.listen` needs no token in the file. The token sent:
    /// the configured token named `token_name` (`default` is `EBB_API_TOKEN`, else
    /// `api.token`); else `EBB_API_TOKEN` as it is (the host judges it); else `api.token`.
    /// Variables (`EBB_API_TOKEN`, `EBB_SCALER_TOKEN`, each `token_env`) are read through `env`.
    pub fn parse_for_client(text: &str, base: &Path, token_name: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Result<(Config, Option<String>)> {
        let config = Config::parse_as(text, base, None, env(SCALER_TOKEN_ENV), validate::Reader::Client, env)?;
        let file: ConfigFile = toml::from_str(text).map_err(toml_error)?;
        let token = file.api.client_token(token_name, env(TOKEN_ENV), env).map_err(|error| anyhow::Error::new(ClientTokenError(format!("{error:#}"))))?;
        Ok((config, token))
    }

    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Config> {
        let text = crate::input::read_text("config", path, crate::input::MAX_CONFIG_BYTES)?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Config::parse_with_env(&text, &base, std::env::var(TOKEN_ENV).ok(), std::env::var(SCALER_TOKEN_ENV).ok())
            .with_context(|| format!("invalid config {}", path.display()))
    }

    /// Whether the host can use its folders: `data_dir` and `rules_dir` are folders it can
    /// write in, or can be created where it can write. `ebb run` and `ebb check` both ask;
    /// nothing is created or left behind.
    pub fn check_folders(&self) -> Result<()> {
        for (key, path) in [("data_dir", &self.data_dir), ("rules_dir", &self.rules_dir)] {
            let existing = path.ancestors().find(|a| a.is_dir()).unwrap_or(Path::new("/"));
            tempfile::tempfile_in(existing).map_err(|error| {
                let what = if existing == path.as_path() { "cannot be written in".to_string() } else { format!("cannot be created in {}", existing.display()) };
                anyhow::anyhow!("{key}: {} {what}: {error}", path.display())
            })?;
        }
        Ok(())
    }

    /// Whether every queue has a handler: its `handler.url`, or a Rust handler in
    /// `embedded` (what a program embedding ebb registered). A worker needs one per queue;
    /// `ebb scaler` processes nothing and needs none.
    pub fn check_handlers(&self, embedded: &dyn Fn(&str) -> bool) -> Result<()> {
        for queue in &self.queues {
            if queue.handler_url.is_none() && !embedded(&queue.name) {
                bail!("queues.{}.handler: not set; give the URL each message is POSTed to: handler = {{ url = \"http://127.0.0.1:8080/work\" }}", queue.name);
            }
        }
        Ok(())
    }

    /// Parses and validates config text; relative paths are taken from `base`.
    pub fn parse(text: &str, base: &Path, env_token: Option<String>) -> Result<Config> {
        Config::parse_with_env(text, base, env_token, None)
    }

    /// [`Config::parse`], with the scaler token's variable too (`EBB_SCALER_TOKEN`).
    pub fn parse_with_env(text: &str, base: &Path, env_token: Option<String>, env_scaler_token: Option<String>) -> Result<Config> {
        Config::parse_as(text, base, env_token, env_scaler_token, validate::Reader::Host, &|var| std::env::var(var).ok())
    }

    fn parse_as(
        text: &str,
        base: &Path,
        env_token: Option<String>,
        env_scaler_token: Option<String>,
        reader: validate::Reader,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config> {
        let file: ConfigFile = match toml::from_str(text) {
            Ok(file) => file,
            // serde stops at the first bad value; for rule_params, say them all at once.
            Err(error) => return Err(unquoted_rule_params(text).unwrap_or_else(|| toml_error(error))),
        };
        let scaler = file.scaler.validate(env_scaler_token)?;
        let mut config = file.validate(base, env_token, reader, env)?;
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

/// Why a client command cannot pick the token it was told to send.
#[derive(Debug)]
struct ClientTokenError(String);

impl std::fmt::Display for ClientTokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ClientTokenError {}

/// Every `rule_params` value of every queue that is not a string (`per_task = 10`), in one
/// error saying how to quote them; `None` when there is none (or the text is not TOML).
fn unquoted_rule_params(text: &str) -> Option<anyhow::Error> {
    let table: toml::Table = toml::from_str(text).ok()?;
    let mut bad = Vec::new();
    for (queue, settings) in table.get("queues")?.as_table()? {
        let Some(params) = settings.get("rule_params").and_then(toml::Value::as_table) else { continue };
        for (key, value) in params {
            if !value.is_str() {
                // Without toml's `display` feature: the scalars as written, the rest by kind.
                let written = match value {
                    toml::Value::Integer(n) => n.to_string(),
                    toml::Value::Float(x) => x.to_string(),
                    toml::Value::Boolean(b) => b.to_string(),
                    toml::Value::Datetime(d) => d.to_string(),
                    other => format!("<{}>", other.type_str()),
                };
                bad.push((
                    queue.clone(),
                    format!("queues.{queue}.rule_params.{key} = {written} (a TOML {})", value.type_str()),
                    format!("{key} = {written:?}"),
                ));
            }
        }
    }
    if bad.is_empty() {
        return None;
    }
    let listed: Vec<String> = bad.iter().map(|(_, what, _)| format!("  {what}")).collect();
    let fixes: Vec<String> = bad.iter().map(|(_, _, fix)| fix.clone()).collect();
    // Named after the first queue, as every queue error is; the list has them all.
    Some(anyhow::anyhow!(
        "queues.{}: rule_params: values are strings (a rule reads them as text), and {} {} not:\n{}{}quote {}: {}",
        bad[0].0,
        bad.len(),
        if bad.len() == 1 { "is" } else { "are" },
        listed.join("\n"),
        crate::rules::HINT_PREFIX,
        if bad.len() == 1 { "the value" } else { "each value" },
        fixes.join(", ")
    ))
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
