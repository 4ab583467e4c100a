//! From the file form to a [`Config`]: every key checked, every error naming it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use super::backend::{AzureFile, Backend, SqsFile};
use super::bus::BusFile;
use super::checks::{
    AtLeast, MAX_API_CONNECTIONS, MAX_CACHE_MIB, MAX_CALL_DEADLINE, MAX_INSTANCES, MAX_INTERVAL, MAX_MEMORY_MIB, MAX_MESSAGE_BYTES_LIMIT, MAX_PRICE_PER_10K,
    MIN_MESSAGE_BYTES_LIMIT, check_duration, check_folder, check_token, check_token_text,
};
use super::file::{ApiTokenFile, ConfigFile, QueueFile, ScalerFile};
use super::settings::{ApiLimits, ApiRole, ApiToken, ScalerSettings};
use super::{Config, QueueConfig, SCALER_TOKEN_ENV, TOKEN_ENV};
use crate::rules::RuleLimits;

/// Who reads the config: the host, which serves the API's tokens, or a client of it
/// ([`Config::parse_for_client`]), which only sends one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reader {
    Host,
    Client,
}

impl ConfigFile {
    /// `env` reads the variables `[[api.tokens]]` name.
    pub(super) fn validate(self, base: &Path, env_token: Option<String>, reader: Reader, env: &dyn Fn(&str) -> Option<String>) -> Result<Config> {
        let (listen, tokens) = self.api.listen_and_tokens(env_token, reader, env)?;
        let api_limits = self.api.limits(self.max_message_bytes)?;
        if !(MIN_MESSAGE_BYTES_LIMIT..=MAX_MESSAGE_BYTES_LIMIT).contains(&self.max_message_bytes) {
            bail!(
                "max_message_bytes: must be {MIN_MESSAGE_BYTES_LIMIT} to {MAX_MESSAGE_BYTES_LIMIT} bytes (room for an envelope or an offloaded message's reference, up to 1 MiB, the largest body the API accepts), got {}",
                self.max_message_bytes
            );
        }
        check_duration("drain_timeout", self.drain_timeout, AtLeast::Zero, MAX_INTERVAL)?;
        // The exporter itself is started with the log (cli/logging.rs); a bad endpoint stops
        // the host here. A client's command exports nothing: its table is not its concern.
        if reader == Reader::Host {
            self.telemetry.resolve(env).map_err(anyhow::Error::msg)?;
        }
        let price = self.price_per_10k_transactions;
        if !(price.is_finite() && (0.0..=MAX_PRICE_PER_10K).contains(&price)) {
            bail!("price_per_10k_transactions: must be 0 to {MAX_PRICE_PER_10K} (US dollars per 10,000 transactions), got {price}");
        }
        let rule_limits = self.rule_limits.validate()?;
        let data_dir = base.join(&self.data_dir);
        check_folder("data_dir", &self.data_dir, &data_dir)?;
        let rules_dir = base.join(&self.rules_dir);
        check_folder("rules_dir", &self.rules_dir, &rules_dir)?;
        let queues = validate_queues(self.queues, base, (self.azure.as_ref(), self.aws.as_ref()), self.max_message_bytes)?;
        let bus = self.bus.map(BusFile::validate).transpose()?;
        Ok(Config {
            data_dir,
            rules_dir,
            max_message_bytes: self.max_message_bytes,
            drain_timeout: self.drain_timeout,
            price_per_10k_transactions: price,
            listen,
            bus,
            tokens,
            scaler: None,
            api_limits,
            rule_limits,
            log_format: self.log.format,
            queues,
        })
    }
}

impl super::file::RuleLimitsFile {
    /// `[rule_limits]`, checked, in the engine's units.
    fn validate(&self) -> Result<RuleLimits> {
        check_duration("rule_limits.call_deadline", self.call_deadline, AtLeast::AboveZero, MAX_CALL_DEADLINE)?;
        if self.call_fuel == 0 {
            bail!("rule_limits.call_fuel: must be more than 0");
        }
        if !(1..=MAX_MEMORY_MIB).contains(&self.memory_mib) {
            bail!("rule_limits.memory_mib: must be 1 to {MAX_MEMORY_MIB}, got {}", self.memory_mib);
        }
        if !(1..=MAX_CACHE_MIB).contains(&self.cache_mib) {
            bail!("rule_limits.cache_mib: must be 1 to {MAX_CACHE_MIB}, got {}", self.cache_mib);
        }
        Ok(RuleLimits {
            call_deadline: self.call_deadline,
            call_fuel: self.call_fuel,
            memory_bytes: self.memory_mib << 20,
            quarantine_after: self.quarantine_after,
            cache_max_bytes: self.cache_mib << 20,
            ..RuleLimits::default()
        })
    }
}

/// Every `[queues.<name>]`, checked, then checked together: no name taken by another's
/// poison queue, no storage queue shared, no reply cycles or unread reply queues.
fn validate_queues(
    files: BTreeMap<String, QueueFile>,
    base: &Path,
    (host_azure, host_aws): (Option<&AzureFile>, Option<&SqsFile>),
    max_message_bytes: usize,
) -> Result<Vec<QueueConfig>> {
    for name in files.keys() {
        if let Some(owner) = name.strip_suffix("-poison").filter(|owner| files.contains_key(*owner)) {
            bail!("queues.{name}: this name is taken by the poison queue of queues.{owner}");
        }
    }
    let mut queues = Vec::new();
    for (name, queue) in files {
        queues.push(queue.validate(&name, base, host_azure, host_aws, max_message_bytes).with_context(|| format!("queues.{name}"))?);
    }
    let owners = storage_owners(&queues)?;
    if queues.is_empty() {
        bail!("queues: configure at least one queue ([queues.<name>] with a handler)");
    }
    refuse_reply_cycles(&queues, &owners)?;
    refuse_unread_reply_queues(&queues)?;
    Ok(queues)
}

/// The configured queue each storage queue (queues, partitions, poison queues) belongs to:
/// one only.
fn storage_owners(queues: &[QueueConfig]) -> Result<BTreeMap<String, &str>> {
    let mut owners: BTreeMap<String, &str> = BTreeMap::new();
    for queue in queues {
        let storage = queue.storage_queues().into_iter().map(|s| (String::from(s), "")).chain([(queue.poison_queue().into(), "the poison queue of ")]);
        for (storage, role) in storage {
            if let Some(other) = owners.insert(storage.clone(), &queue.name) {
                let (first, second) = if other < queue.name.as_str() { (other, queue.name.as_str()) } else { (queue.name.as_str(), other) };
                bail!("queues.{second}: its storage queue {storage} is also used by queues.{first} ({role}or a partition)");
            }
        }
    }
    Ok(owners)
}

/// Refuses a `reply_queue` that names a configured queue whose listeners never read the
/// storage queue the answers would go to: a partitioned queue (its listeners read its
/// partitions, not a queue of its own name), or a queue on other storage (answers are put on
/// the answering queue's own backend and account).
fn refuse_unread_reply_queues(queues: &[QueueConfig]) -> Result<()> {
    for queue in queues {
        let Some(reply) = queue.payload.reply_queue.as_deref() else { continue };
        if let Some(target) = queues.iter().find(|other| other.name.as_str() == reply && other.partitions > 1) {
            bail!(
                "queues.{}.reply_queue: {reply} is a partitioned queue: its listeners read {reply}-0 to {reply}-{}, never a storage queue named {reply}, so the answers would never be read; name one of its partitions ({reply}-0), or a queue that is not partitioned",
                queue.name,
                target.partitions - 1
            );
        }
        let Some(target) = queues.iter().find(|other| other.storage_queues().iter().any(|s| s.as_str() == reply)) else { continue };
        let same_storage = match (&queue.backend, &target.backend) {
            (Backend::Embedded, Backend::Embedded) => true,
            (Backend::Azure { account: a, .. }, Backend::Azure { account: b, .. }) => a.name() == b.name() && a.endpoint() == b.endpoint(),
            (Backend::Sqs { account: a, .. }, Backend::Sqs { account: b, .. }) => a.describe() == b.describe(),
            _ => false,
        };
        if !same_storage {
            bail!(
                "queues.{}.reply_queue: {reply} is a queue on other storage ({}): answers are put on this queue's own storage ({}), where queue {reply}'s listeners never look; give both queues the same backend and account",
                queue.name,
                storage_of(&target.backend),
                storage_of(&queue.backend)
            );
        }
    }
    Ok(())
}

fn storage_of(backend: &Backend) -> String {
    match backend {
        Backend::Embedded => "the embedded store".into(),
        Backend::Azure { account, .. } => format!("Azure account {}", account.name()),
        Backend::Sqs { account, .. } => account.describe(),
    }
}

/// Refuses `reply_queue`s that lead back to where they started: each handler's answer is a
/// message to the next queue's handler, whose answer goes on, around the cycle without end.
/// `owners` gives the configured queue of each storage queue (a queue, or a partition).
fn refuse_reply_cycles(queues: &[QueueConfig], owners: &BTreeMap<String, &str>) -> Result<()> {
    let replies_to = |queue: &str| -> Option<&str> {
        let reply = queues.iter().find(|q| q.name.as_str() == queue)?.payload.reply_queue.as_deref()?;
        owners.get(reply).copied()
    };
    for start in queues {
        let mut path = vec![start.name.as_str()];
        let mut at = start.name.as_str();
        while let Some(next) = replies_to(at) {
            if next == start.name.as_str() {
                let hops: Vec<String> = path
                    .iter()
                    .map(|queue| {
                        format!(
                            "{queue} (reply_queue = {:?})",
                            queues.iter().find(|q| q.name.as_str() == *queue).and_then(|q| q.payload.reply_queue.as_deref()).unwrap_or_default()
                        )
                    })
                    .collect();
                bail!(
                    "queues.{}.reply_queue: the answers go round a cycle, {} -> {next}: each answer is handled and answered again, without end; end the chain at a queue without a reply_queue",
                    start.name,
                    hops.join(" -> ")
                );
            }
            // A cycle that does not pass through `start` is reported from one of its own queues.
            if path.contains(&next) {
                break;
            }
            path.push(next);
            at = next;
        }
    }
    Ok(())
}

impl ScalerFile {
    pub(super) fn validate(&self, env_token: Option<String>) -> Result<Option<ScalerSettings>> {
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

impl super::file::ApiFile {
    /// The address the API listens on and the tokens it serves (none for a client, which
    /// only sends one); a token is required off loopback.
    fn listen_and_tokens(&self, env_token: Option<String>, reader: Reader, env: &dyn Fn(&str) -> Option<String>) -> Result<(SocketAddr, Vec<ApiToken>)> {
        let listen: SocketAddr = self.listen.parse().map_err(|_| anyhow::anyhow!("api.listen: {:?} is not an address like 127.0.0.1:7070", self.listen))?;
        let env_token = if reader == Reader::Host { env_token } else { None };
        let default_key = if env_token.as_deref().is_some_and(|t| !t.is_empty()) { TOKEN_ENV } else { "api.token" };
        let token = check_token("api.token", self.token.clone(), TOKEN_ENV, env_token)?;
        let tokens = api_tokens(token.map(|t| (default_key, t)), &self.tokens, env, reader == Reader::Client)?;
        if reader == Reader::Host && !listen.ip().is_loopback() && tokens.is_empty() {
            bail!("api.listen: {listen} is not a loopback address, so a token is required: api.token (or {TOKEN_ENV}) or [[api.tokens]]");
        }
        Ok((listen, tokens))
    }

    /// The API's timeouts and connection bounds, checked; bodies up to `max_body_bytes`.
    fn limits(&self, max_body_bytes: usize) -> Result<ApiLimits> {
        check_duration("api.header_read_timeout", self.header_read_timeout, AtLeast::AboveZero, MAX_INTERVAL)?;
        check_duration("api.idle_timeout", self.idle_timeout, AtLeast::AboveZero, MAX_INTERVAL)?;
        if !(1..=MAX_API_CONNECTIONS).contains(&self.max_connections) {
            bail!("api.max_connections: must be 1 to {MAX_API_CONNECTIONS}, got {}", self.max_connections);
        }
        check_duration("api.body_read_timeout", self.body_read_timeout, AtLeast::AboveZero, MAX_INTERVAL)?;
        let probe_connections = match self.probe_connections {
            Some(n) if n >= self.max_connections => {
                bail!("api.probe_connections: must be less than api.max_connections ({}), got {n}", self.max_connections)
            }
            Some(n) => n,
            None => crate::defaults::PROBE_CONNECTIONS.min(self.max_connections / 2),
        };
        Ok(ApiLimits {
            max_body_bytes,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            body_read_timeout: self.body_read_timeout,
            max_connections: self.max_connections,
            probe_connections,
        })
    }

    /// The token a client command sends (see [`Config::parse_for_client`]): the configured
    /// token named `name`; else `env_token` (`EBB_API_TOKEN`) as it is; else `api.token`.
    pub(super) fn client_token(&self, name: Option<&str>, env_token: Option<String>, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<String>> {
        let env_token = env_token.filter(|t| !t.is_empty());
        let Some(name) = name else {
            if let Some(token) = env_token {
                check_token_text(TOKEN_ENV, &token)?;
                return Ok(Some(token));
            }
            // api.token is checked with the rest of the file.
            return Ok(self.token.clone());
        };
        // The name comes from the command line or the environment: shown escaped and cut.
        let shown = crate::health::untrusted_text(name);
        if name == DEFAULT_TOKEN_NAME {
            return match (env_token, &self.token) {
                (Some(token), _) => check_token_text(TOKEN_ENV, &token).map(|()| Some(token)),
                (None, Some(token)) => Ok(Some(token.clone())),
                (None, None) => bail!("--token-name default: neither {TOKEN_ENV} nor api.token is set"),
            };
        }
        let Some((i, file)) = self.tokens.iter().enumerate().find(|(_, t)| t.name.as_deref() == Some(name)) else {
            let names: Vec<&str> = self.token.iter().map(|_| DEFAULT_TOKEN_NAME).chain(self.tokens.iter().filter_map(|t| t.name.as_deref())).collect();
            let names = if names.is_empty() { "none".to_string() } else { names.join(", ") };
            bail!("--token-name {shown}: the config has no token of that name (its tokens: {names})");
        };
        let (key, secret) = match (&file.token, &file.token_env) {
            (Some(secret), _) => (format!("api.tokens[{i}].token"), secret.clone()),
            (None, Some(var)) => match env(var).filter(|s| !s.is_empty()) {
                Some(secret) => (format!("api.tokens[{i}].token_env ({var})"), secret),
                None => bail!("--token-name {shown}: its secret is read from {var} (api.tokens[{i}].token_env), which is not set here"),
            },
            (None, None) => bail!("api.tokens[{i}]: give the token as token = \"…\" or token_env = \"VARIABLE\""),
        };
        check_token_text(&key, &secret)?;
        Ok(Some(secret))
    }
}

/// The name `api.token` (or `EBB_API_TOKEN`) goes by.
pub(crate) const DEFAULT_TOKEN_NAME: &str = "default";
/// Names that mean someone else in the audit log: no token (`anonymous`), `ebb queue` with no
/// host (`cli`), and the name of `api.token`.
const RESERVED_TOKEN_NAMES: [&str; 3] = [DEFAULT_TOKEN_NAME, "anonymous", "cli"];
/// Longest token name.
pub(crate) const MAX_TOKEN_NAME_LEN: usize = 64;

/// Every API token: `default` (the admin token of `api.token` / `EBB_API_TOKEN`, already
/// checked) first, then `[[api.tokens]]` in order, their variables read through `env`. Names
/// and secrets are each unique, so the audit log can tell who acted. `skip_unset`: a token
/// whose variable is not set (or empty) is left out instead of refused (a client's view).
pub(super) fn api_tokens(
    default: Option<(&str, String)>,
    named: &[ApiTokenFile],
    env: &dyn Fn(&str) -> Option<String>,
    skip_unset: bool,
) -> Result<Vec<ApiToken>> {
    let mut tokens: Vec<(String, ApiToken)> = Vec::new();
    if let Some((key, secret)) = default {
        tokens.push((key.to_string(), ApiToken { name: DEFAULT_TOKEN_NAME.into(), role: ApiRole::Admin, secret }));
    }
    for (i, file) in named.iter().enumerate() {
        let key = format!("api.tokens[{i}]");
        let name = match file.name.as_deref() {
            None => bail!("{key}.name: missing; name the token's holder ([a-z0-9_-], 1 to {MAX_TOKEN_NAME_LEN} characters), as the audit log shows it"),
            Some(name) if name.is_empty() || name.len() > MAX_TOKEN_NAME_LEN => {
                bail!("{key}.name: must be 1 to {MAX_TOKEN_NAME_LEN} characters, got {}", name.chars().count())
            }
            Some(name) if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-') => {
                bail!("{key}.name: {name:?} may hold only lowercase letters, digits, _ and -")
            }
            Some(name) if RESERVED_TOKEN_NAMES.contains(&name) => {
                bail!("{key}.name: {name:?} is reserved (default: api.token; anonymous: no token; cli: ebb queue with no host); choose another")
            }
            Some(name) => name,
        };
        if let Some((other, _)) = tokens.iter().find(|(_, t)| t.name == name) {
            bail!("{key}.name: {name:?} is also the name of {other}; each token needs its own name, or the audit log cannot tell who acted");
        }
        let role = match file.role.as_deref() {
            Some("read") => ApiRole::Read,
            Some("admin") => ApiRole::Admin,
            None => bail!("{key}.role: missing; \"read\" (every GET route, no change) or \"admin\" (every route)"),
            Some(other) => bail!("{key}.role: {:?} is not a role; use \"read\" or \"admin\"", crate::health::truncate_reason(other)),
        };
        let (secret_key, secret) = match (&file.token, &file.token_env) {
            (Some(secret), None) => (format!("{key}.token"), secret.clone()),
            (None, Some(var)) => {
                let secret_key = format!("{key}.token_env");
                if var.trim().is_empty() {
                    bail!("{secret_key}: is empty; name the environment variable holding the token");
                }
                let secret = env(var);
                if skip_unset && secret.as_deref().is_none_or(str::is_empty) {
                    continue;
                }
                let Some(secret) = secret else { bail!("{secret_key}: {var} is not set") };
                (format!("{secret_key} ({var})"), secret)
            }
            (Some(_), Some(_)) => bail!("{key}: give the token as exactly one of token or token_env, not both"),
            (None, None) => bail!("{key}: give the token as token = \"…\" or token_env = \"VARIABLE\" (keeps the secret out of the file)"),
        };
        check_token_text(&secret_key, &secret)?;
        if let Some((other, _)) = tokens.iter().find(|(_, t)| t.secret == secret) {
            bail!("{secret_key}: the same token as {other}; give each token its own secret, or the API cannot tell who calls");
        }
        tokens.push((key, ApiToken { name: name.to_string(), role, secret }));
    }
    Ok(tokens.into_iter().map(|(_, token)| token).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(name: &str, role: &str, token: Option<&str>, token_env: Option<&str>) -> ApiTokenFile {
        ApiTokenFile { name: Some(name.into()), role: Some(role.into()), token: token.map(Into::into), token_env: token_env.map(Into::into) }
    }

    fn env(var: &str) -> Option<String> {
        (var == "EBB_OPS_TOKEN").then(|| "from-the-environment".to_string())
    }

    #[test]
    fn the_default_token_comes_first_as_admin_and_named_tokens_keep_their_role() {
        let named = [token("ops", "read", None, Some("EBB_OPS_TOKEN")), token("deploy-bot_2", "admin", Some("s3cret"), None)];
        let tokens = api_tokens(Some(("api.token", "t0ken".into())), &named, &env, false).unwrap();
        let seen: Vec<(&str, ApiRole, &str)> = tokens.iter().map(|t| (t.name.as_str(), t.role, t.secret.as_str())).collect();
        assert_eq!(seen, [("default", ApiRole::Admin, "t0ken"), ("ops", ApiRole::Read, "from-the-environment"), ("deploy-bot_2", ApiRole::Admin, "s3cret")]);
        assert!(api_tokens(None, &[], &env, false).unwrap().is_empty());
        assert!(!format!("{tokens:?}").contains("s3cret"), "a logged config shows no secret");
    }

    #[test]
    fn every_bad_token_is_refused_naming_its_key_and_reason() {
        let long = "a".repeat(MAX_TOKEN_NAME_LEN + 1);
        let cases: Vec<(Vec<ApiTokenFile>, &str)> = vec![
            (vec![token("Ops", "read", Some("a"), None)], "api.tokens[0].name: \"Ops\" may hold only lowercase letters, digits, _ and -"),
            (vec![token("", "read", Some("a"), None)], "api.tokens[0].name: must be 1 to 64 characters, got 0"),
            (vec![token(&long, "read", Some("a"), None)], "api.tokens[0].name: must be 1 to 64 characters, got 65"),
            (vec![token("default", "read", Some("a"), None)], "api.tokens[0].name: \"default\" is reserved"),
            (vec![token("anonymous", "read", Some("a"), None)], "api.tokens[0].name: \"anonymous\" is reserved"),
            (
                vec![token("ops", "read", Some("a"), None), token("ops", "admin", Some("b"), None)],
                "api.tokens[1].name: \"ops\" is also the name of api.tokens[0]",
            ),
            (vec![token("ops", "writer", Some("a"), None)], "api.tokens[0].role: \"writer\" is not a role; use \"read\" or \"admin\""),
            (vec![token("ops", "read", Some("a"), Some("EBB_OPS_TOKEN"))], "api.tokens[0]: give the token as exactly one of token or token_env, not both"),
            (vec![token("ops", "read", None, None)], "api.tokens[0]: give the token as token = "),
            (vec![token("ops", "read", Some("  "), None)], "api.tokens[0].token: is empty or blank"),
            (vec![token("ops", "read", Some("s3 cret"), None)], "api.tokens[0].token: use visible ASCII characters only"),
            (vec![token("ops", "read", None, Some(""))], "api.tokens[0].token_env: is empty; name the environment variable"),
            (vec![token("ops", "read", Some("a"), None), token("ci", "read", None, Some("EBB_X"))], "api.tokens[1].token_env: EBB_X is not set"),
            (vec![token("ops", "read", Some("t0ken"), None)], "api.tokens[0].token: the same token as api.token"),
            (
                vec![token("ops", "read", Some("from-the-environment"), None), token("ci", "admin", None, Some("EBB_OPS_TOKEN"))],
                "api.tokens[1].token_env (EBB_OPS_TOKEN): the same token as api.tokens[0]",
            ),
        ];
        for (named, expected) in cases {
            let error = format!("{:#}", api_tokens(Some(("api.token", "t0ken".into())), &named, &env, false).unwrap_err());
            assert!(error.starts_with(expected), "expected {expected:?}, got {error:?}");
        }
    }

    /// Issue 22, defect 6: `--token-name` with control characters or escapes printed them raw
    /// (a terminal would act on them); they are escaped, and a long name is cut.
    #[test]
    fn a_token_name_not_configured_is_shown_escaped() {
        let file: super::super::file::ApiFile = toml::from_str("[[tokens]]\nname = \"ops\"\nrole = \"read\"\ntoken = \"a\"\n").unwrap();
        for name in ["\u{1b}[2J\u{1b}]0;owned\u{7}", "a\nERROR forged", "bidi\u{202e}txt"] {
            let error = format!("{:#}", file.client_token(Some(name), None, &env).unwrap_err());
            assert!(error.starts_with("--token-name "), "{error:?}");
            assert!(!error.chars().any(|c| c.is_control() || c == '\u{202e}'), "raw control characters in {error:?}");
            assert!(error.contains("the config has no token of that name"), "{error:?}");
        }
        let error = format!("{:#}", file.client_token(Some("\u{1b}[31mred"), None, &env).unwrap_err());
        assert!(error.contains("\\u{1b}[31mred"), "escaped as \\u{{..}}: {error:?}");
    }
}
