//! The file form of `ebb.toml`: serde structs, unknown keys rejected, units and defaults
//! in every doc. Validation turns them into the runtime types (see `validate.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::backend::{AzureFile, BackendKind, SqsFile};
use super::bus::BusFile;
use super::log::LogFile;
use super::serde_defaults;
use super::telemetry::TelemetryFile;
use serde::Deserialize;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Folder of the embedded queue store. Default `ebb-data`.
    #[serde(default = "serde_defaults::data_dir")]
    pub data_dir: PathBuf,
    /// Watched folder of rule components. Default `rules`.
    #[serde(default = "serde_defaults::rules_dir")]
    pub rules_dir: PathBuf,
    /// Largest message body accepted, in bytes, 1 to 1 MiB (also the API's body limit).
    /// Default 65536 (Azure's limit).
    #[serde(default = "serde_defaults::max_message_bytes")]
    pub max_message_bytes: usize,
    /// How long shutdown waits for in-flight messages before releasing them. Default `30s`.
    #[serde(default = "serde_defaults::drain_timeout", with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// What the storage service charges per 10,000 transactions, in US dollars, for the
    /// live cost figures. Default 0.01 (the whitepaper's price), 0 to 100.
    #[serde(default = "serde_defaults::price_per_10k_transactions")]
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
    /// Where Amazon SQS is, for queues with `backend = "sqs"` (a queue may override it).
    pub aws: Option<SqsFile>,
    /// Push notifications across hosts.
    pub bus: Option<BusFile>,
    /// How the log is written.
    #[serde(default)]
    pub log: LogFile,
    /// Where spans are exported over OTLP.
    #[serde(default)]
    pub telemetry: TelemetryFile,
    /// The queues to listen to, by name.
    #[serde(default)]
    pub queues: BTreeMap<String, QueueFile>,
}

/// `[api]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiFile {
    /// Address to listen on. Default `127.0.0.1:7070`. A non-loopback address needs a token.
    #[serde(default = "serde_defaults::listen")]
    pub listen: String,
    /// Bearer token required on every request (or set `EBB_API_TOKEN`): an admin token
    /// named `default`. Default: none.
    pub token: Option<String>,
    /// Named tokens, each with a role (`[[api.tokens]]`). Default: none.
    #[serde(default)]
    pub tokens: Vec<ApiTokenFile>,
    /// How long a client may take to send a request's headers (idle keep-alive time
    /// included) before its connection is closed. Default `10s`.
    #[serde(default = "serde_defaults::header_read_timeout", with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// How long a connection may stay without traffic, no request being answered, before
    /// it is closed. Default `60s`.
    #[serde(default = "serde_defaults::idle_timeout", with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// How long a client may take to send a request's body once its headers are in (with
    /// `header_read_timeout`, how long a whole request may take to arrive); then 408 and the
    /// connection is closed. Default `30s`.
    #[serde(default = "serde_defaults::body_read_timeout", with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// Most connections open at once; when all are open, the one that has waited longest for
    /// a request is closed for a newcomer, or, all being inside requests, newcomers wait in the
    /// kernel's backlog. Default 256.
    #[serde(default = "serde_defaults::max_connections")]
    pub max_connections: usize,
    /// Of `max_connections`, how many other requests never take, so `/healthz` and `/readyz`
    /// always find a connection; a request finding the rest taken gets 503. Default 8 (at
    /// most half of `max_connections`).
    pub probe_connections: Option<usize>,
}

impl Default for ApiFile {
    fn default() -> Self {
        ApiFile {
            listen: serde_defaults::listen(),
            token: None,
            tokens: Vec::new(),
            header_read_timeout: serde_defaults::header_read_timeout(),
            idle_timeout: serde_defaults::idle_timeout(),
            body_read_timeout: serde_defaults::body_read_timeout(),
            max_connections: serde_defaults::max_connections(),
            probe_connections: None,
        }
    }
}

/// `[[api.tokens]]`: one named token.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiTokenFile {
    /// Who holds it, in the audit log and `GET /whoami`: `[a-z0-9_-]`, 1 to 64 characters.
    pub name: Option<String>,
    /// `read` (every GET route, no change) or `admin` (every route). Checked in validation,
    /// so the error names the token.
    pub role: Option<String>,
    /// The token itself (or `token_env`, exactly one of the two).
    pub token: Option<String>,
    /// The environment variable holding the token (keeps the secret out of the file).
    pub token_env: Option<String>,
}

/// `[scaler]`: KEDA's external-scaler gRPC service (see `docs/guides/kubernetes.md`).
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
    #[serde(default = "serde_defaults::max_instances")]
    pub max_instances: u32,
    /// `ebb scaler` only: how often each storage queue is counted (one billed count on
    /// Azure). Default `1s`; `100ms` to `1h`.
    #[serde(default = "serde_defaults::scaler_poll_interval", with = "humantime_serde")]
    pub poll_interval: Duration,
}

impl Default for ScalerFile {
    fn default() -> Self {
        ScalerFile { listen: None, token: None, max_instances: serde_defaults::max_instances(), poll_interval: serde_defaults::scaler_poll_interval() }
    }
}

/// `[rule_limits]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleLimitsFile {
    /// Wall-clock budget of one decision. Default `10ms`.
    #[serde(default = "serde_defaults::call_deadline", with = "humantime_serde")]
    pub call_deadline: Duration,
    /// Fuel (≈ wasm instructions) of one decision. Default 10000000.
    #[serde(default = "serde_defaults::call_fuel")]
    pub call_fuel: u64,
    /// Linear memory per rule instance, in MiB. Default 64.
    #[serde(default = "serde_defaults::memory_mib")]
    pub memory_mib: usize,
    /// Consecutive faults before a rule is quarantined; 0: never. Default 5.
    #[serde(default = "serde_defaults::quarantine_after")]
    pub quarantine_after: u32,
    /// Size bound of the compiled-rule cache on disk, in MiB. Default 256.
    #[serde(default = "serde_defaults::cache_mib")]
    pub cache_mib: u64,
}

impl Default for RuleLimitsFile {
    fn default() -> Self {
        RuleLimitsFile {
            call_deadline: serde_defaults::call_deadline(),
            call_fuel: serde_defaults::call_fuel(),
            memory_mib: serde_defaults::memory_mib(),
            quarantine_after: serde_defaults::quarantine_after(),
            cache_mib: serde_defaults::cache_mib(),
        }
    }
}

/// `[queues.<name>]`. Names follow Azure Functions' `host.json` queue settings where one exists.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueFile {
    /// Messages per get, 1 to 32. Default 32.
    #[serde(default = "serde_defaults::batch_size")]
    pub batch_size: u32,
    /// Fewest dequeue tasks. Default 1 (0 allowed with `push = true`).
    #[serde(default = "serde_defaults::min_tasks")]
    pub min_tasks: u32,
    /// Most dequeue tasks. Default 32.
    #[serde(default = "serde_defaults::max_tasks")]
    pub max_tasks: u32,
    /// Most handler calls at once for this queue on this host (a rule may decide fewer).
    /// Default 32, 1 to 10,000.
    #[serde(default = "serde_defaults::max_concurrent_calls", deserialize_with = "concurrent_calls")]
    pub max_concurrent_calls: u32,
    /// Shortest sleep after an empty get (or a short one). Default `800ms`.
    #[serde(default = "serde_defaults::min_polling_interval", with = "humantime_serde")]
    pub min_polling_interval: Duration,
    /// Longest sleep after an empty get. Default `1m` (as Azure Functions).
    #[serde(default = "serde_defaults::max_polling_interval", with = "humantime_serde")]
    pub max_polling_interval: Duration,
    /// Retry delay after a handler failure, doubled with each further try. Default `1s`.
    #[serde(default = "serde_defaults::visibility_timeout", with = "humantime_serde")]
    pub visibility_timeout: Duration,
    /// Cap on the retry delay. Default `10m`.
    #[serde(default = "serde_defaults::max_retry_delay", with = "humantime_serde")]
    pub max_retry_delay: Duration,
    /// Lease a get takes on its messages, renewed at half while the handler runs. Default `30s`.
    #[serde(default = "serde_defaults::lease_duration", with = "humantime_serde")]
    pub lease_duration: Duration,
    /// Tries before a message moves to `<queue>-poison`. Default 5 (as Azure Functions).
    #[serde(default = "serde_defaults::max_dequeue_count")]
    pub max_dequeue_count: u32,
    /// Whether pushed messages and notifications wake the queue, so idle tasks may all stop. Default false.
    #[serde(default = "serde_defaults::push")]
    pub push: bool,
    /// With `push = true`: while no task runs, one get at start-up and then one per this
    /// interval, so a message whose notification was lost waits at most this long.
    /// Default `2h`, `1s` to `24h`.
    #[serde(default, with = "humantime_serde")]
    pub safety_poll: Option<Duration>,
    /// Least time between two task-count decisions. Default `1s`.
    #[serde(default = "serde_defaults::scale_interval", with = "humantime_serde")]
    pub scale_interval: Duration,
    /// Longest a notified message waits for its get while no task is busy (notifications
    /// within it share one get). Default `500ms`, `0s` to `10s`.
    #[serde(default = "serde_defaults::max_pickup_delay", with = "humantime_serde")]
    pub max_pickup_delay: Duration,
    /// One logical queue over this many partition queues `<name>-0` … `<name>-(N-1)`, each
    /// with its own listener and rule decisions. Default 1 (no partitions).
    #[serde(default = "serde_defaults::partitions")]
    pub partitions: u32,
    /// Largest body offloaded as a claim check (or fetched for one), in bytes. Default
    /// 104857600 (100 MiB), 1 to 4294967296 (4 GiB).
    #[serde(default = "serde_defaults::max_claim_check_bytes")]
    pub max_claim_check_bytes: u64,
    /// Age after which the sweeper removes a claim-check body (an orphan, or one whose
    /// message outlived it). Default `14days`, `1h` to `1year`, and more than
    /// `max_retry_delay`.
    #[serde(default = "serde_defaults::claim_check_retention", with = "humantime_serde")]
    pub claim_check_retention: Duration,
    /// How often the sweeper looks for claim-check bodies older than the retention (one
    /// billed list call on Azure). Default `1h`, `1m` to `24h`.
    #[serde(default = "serde_defaults::claim_sweep_interval", with = "humantime_serde")]
    pub claim_sweep_interval: Duration,
    /// Whether the queue's arrivals are recorded (per second, in `data_dir/recordings`) for
    /// `ebb trace export`. Default true.
    #[serde(default = "serde_defaults::record")]
    pub record: bool,
    /// The recording's size cap, in bytes, 64 KiB to 1 GiB; the oldest seconds are dropped
    /// first. Default 8388608 (8 MiB).
    #[serde(default = "serde_defaults::record_max_bytes")]
    pub record_max_bytes: u64,
    /// Rule file name in `rules_dir`. Default: the built-in rule (the paper's).
    pub rule: Option<String>,
    /// Parameters passed to the rule's `configure`. Default: none.
    #[serde(default)]
    pub rule_params: BTreeMap<String, String>,
    /// A shadow rule's file name in `rules_dir`: asked with the same inputs as `rule` at
    /// every decision, never applied, compared. Default: none.
    pub shadow_rule: Option<String>,
    /// Parameters passed to the shadow rule's `configure`. Default: none.
    #[serde(default)]
    pub shadow_rule_params: BTreeMap<String, String>,
    /// Where messages go: required, unless ebb is embedded as a library with a Rust
    /// handler for this queue.
    pub handler: Option<HandlerFile>,
    /// Where the queue lives: `embedded` (default), `azure` or `sqs`.
    #[serde(default)]
    pub backend: BackendKind,
    /// The codec of the envelopes its producers pack: `none`, `deflate`, `zstd` (default)
    /// or `lz4`.
    #[serde(default)]
    pub compression: crate::payload::Codec,
    /// How long the packing task waits for more items after the first. Default `10ms`,
    /// `0s` to `10s`.
    #[serde(default = "serde_defaults::pack_linger", with = "humantime_serde")]
    pub pack_linger: Duration,
    /// An envelope's items to the handler one per call (`item`, default) or in batches (`batch`).
    #[serde(default)]
    pub delivery: crate::payload::Delivery,
    /// Most items in one batch call (`delivery = "batch"` only). Default 32, 1 to 1,000.
    pub max_batch_items: Option<u32>,
    /// The queue handlers' answers are put on. Default: none (answers are dropped).
    pub reply_queue: Option<String>,
    /// How long an answer nobody took stays on the reply queue. Default `1h`, `1s` to `7days`.
    #[serde(default, with = "humantime_serde")]
    pub reply_ttl: Option<Duration>,
    /// A plain message sent with a trace context goes as an envelope of one message that
    /// carries it (only ebb's listeners then read the queue's messages). Default `false`:
    /// plain messages go byte-identical, without their context. Not on SQS, whose message
    /// attributes carry it.
    #[serde(default)]
    pub trace_envelope: bool,
    /// This queue's own Azure account (default: the host-wide `[azure]`).
    pub azure: Option<AzureFile>,
    /// This queue's SQS settings over `[aws]`, and its URL.
    pub sqs: Option<SqsFile>,
}

/// `[queues.<name>.handler]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerFile {
    /// URL each message is POSTed to; a 2xx answer is success.
    pub url: String,
    /// How long one POST may take before it counts as a failure. Default `30s`.
    #[serde(default = "serde_defaults::handler_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

/// `max_concurrent_calls`, refused with its range whatever is wrong with it: serde's own
/// message for `-1` ("expected u32") did not say what the key accepts.
fn concurrent_calls<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    struct Calls;
    impl serde::de::Visitor<'_> for Calls {
        type Value = u32;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a count of handler calls, 1 to {}", super::MAX_CONCURRENT_CALLS)
        }
        // A count in u32's range is checked against the range with the other keys.
        fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<u32, E> {
            u32::try_from(value).map_err(|_| E::custom(format_args!("max_concurrent_calls must be 1 to {}, got {value}", super::MAX_CONCURRENT_CALLS)))
        }
        fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<u32, E> {
            u32::try_from(value).map_err(|_| E::custom(format_args!("max_concurrent_calls must be 1 to {}, got {value}", super::MAX_CONCURRENT_CALLS)))
        }
    }
    deserializer.deserialize_any(Calls)
}
