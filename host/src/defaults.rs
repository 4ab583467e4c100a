//! Every default of ebb, written once. The file form's serde defaults (`config`), the
//! runtime types' `Default` (`QueueSettings`, `RuleLimits`, `ApiLimits`, `ScalerSettings`)
//! and the `--help` texts read these; a test checks that `docs/reference/config.md` names the same
//! values.

use std::time::Duration;

/// `data_dir`: the folder of the embedded store and the compiled-rule cache.
pub const DATA_DIR: &str = "ebb-data";
/// `rules_dir`: the watched folder of rule components.
pub const RULES_DIR: &str = "rules";
/// `max_message_bytes`: Azure's limit on a message, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 65536;
/// `drain_timeout`.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// `price_per_10k_transactions`: the whitepaper's price, US dollars per 10,000 transactions.
pub const PRICE_PER_10K_TRANSACTIONS: f64 = 0.01;

/// `[api] listen`.
pub const API_LISTEN: &str = "127.0.0.1:7070";
/// `[api] header_read_timeout`.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// `[api] idle_timeout`.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// `[api] body_read_timeout`.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// `[api] max_connections`.
pub const MAX_CONNECTIONS: usize = 256;
/// `[api] probe_connections` (at most half of `max_connections`).
pub const PROBE_CONNECTIONS: usize = 8;

/// `[scaler] listen`, when a test or tool needs an address (the scaler is off by default).
pub const SCALER_LISTEN: &str = "127.0.0.1:7071";
/// `[scaler] max_instances`.
pub const MAX_INSTANCES: u32 = 100;
/// `[scaler] poll_interval`.
pub const SCALER_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// `[bus] channel_prefix`.
pub const CHANNEL_PREFIX: &str = "ebb:queue:";

/// `[rule_limits] call_deadline`.
pub const CALL_DEADLINE: Duration = Duration::from_millis(10);
/// `[rule_limits] call_fuel`.
pub const CALL_FUEL: u64 = 10_000_000;
/// `[rule_limits] memory_mib`.
pub const MEMORY_MIB: usize = 64;
/// `[rule_limits] quarantine_after`.
pub const QUARANTINE_AFTER: u32 = 5;
/// `[rule_limits] cache_mib`.
pub const CACHE_MIB: u64 = 256;

/// `[queues.<name>] batch_size`.
pub const BATCH_SIZE: u32 = 32;
/// `[queues.<name>] min_tasks`.
pub const MIN_TASKS: u32 = 1;
/// `[queues.<name>] max_tasks`.
pub const MAX_TASKS: u32 = 32;
/// `[queues.<name>] min_polling_interval`.
pub const MIN_POLLING_INTERVAL: Duration = Duration::from_millis(800);
/// `[queues.<name>] max_concurrent_calls`: handler calls at once per queue and host.
pub const MAX_CONCURRENT_CALLS: u32 = 32;
/// `[queues.<name>] max_polling_interval` (as Azure Functions).
pub const MAX_POLLING_INTERVAL: Duration = Duration::from_secs(60);
/// `[queues.<name>] visibility_timeout`: the first retry delay.
pub const VISIBILITY_TIMEOUT: Duration = Duration::from_secs(1);
/// `[queues.<name>] max_retry_delay`.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(600);
/// `[queues.<name>] lease_duration`.
pub const LEASE_DURATION: Duration = Duration::from_secs(30);
/// `[queues.<name>] max_dequeue_count` (as Azure Functions).
pub const MAX_DEQUEUE_COUNT: u32 = 5;
/// `[queues.<name>] push`.
pub const PUSH: bool = false;
/// `[queues.<name>] safety_poll`: with 200 idle listeners on Azure, under $0.10 a month.
pub const SAFETY_POLL: Duration = Duration::from_secs(2 * 3600);
/// `[queues.<name>] scale_interval`.
pub const SCALE_INTERVAL: Duration = Duration::from_secs(1);
/// `[queues.<name>] max_pickup_delay`.
pub const MAX_PICKUP_DELAY: Duration = Duration::from_millis(500);
/// `[queues.<name>] record`.
pub const RECORD: bool = true;
/// `[queues.<name>] record_max_bytes`: about four days of a line every second.
pub const RECORD_MAX_BYTES: u64 = 8 << 20;
/// `[queues.<name>] partitions`.
pub const PARTITIONS: u32 = 1;
/// `[queues.<name>] compression`: zstd, by `ebb bench codecs` (see `payload::Codec::default`,
/// which reads it; this layer cannot name the codec type).
pub const COMPRESSION: &str = "zstd";
/// `[log] format`: for people; a cluster asks for `json` (see `config::LogFormat::default`,
/// which reads it; this layer cannot name the format type).
pub const LOG_FORMAT: &str = "human";
/// `[queues.<name>] pack_linger`: a Kafka producer's `linger.ms` is 5 ms (since 4.0); 10 ms
/// adds no pickup delay anyone notices and lets producers that send one item at a time
/// share messages.
pub const PACK_LINGER: Duration = Duration::from_millis(10);
/// `[queues.<name>] max_batch_items`: a full get's worth (`batch_size`).
pub const MAX_BATCH_ITEMS: u32 = 32;
/// `[queues.<name>] reply_ttl`: an answer waited for is taken within the wait (at most
/// minutes); an hour leaves room for a producer that restarts, and bounds what piles up.
pub const REPLY_TTL: Duration = Duration::from_secs(3600);
/// `[queues.<name>.handler] timeout`.
pub const HANDLER_TIMEOUT: Duration = Duration::from_secs(30);

/// Every default as docs/reference/config.md shows it: (table section, key, value as written there).
#[cfg(test)]
pub(crate) fn documented() -> Vec<(&'static str, &'static str, String)> {
    let d = |d: Duration| format!("\"{}\"", humantime::format_duration(d));
    vec![
        ("Top level", "data_dir", DATA_DIR.to_string()),
        ("Top level", "rules_dir", RULES_DIR.to_string()),
        ("Top level", "max_message_bytes", MAX_MESSAGE_BYTES.to_string()),
        ("Top level", "drain_timeout", d(DRAIN_TIMEOUT)),
        ("Top level", "price_per_10k_transactions", PRICE_PER_10K_TRANSACTIONS.to_string()),
        ("`[api]`", "listen", format!("\"{API_LISTEN}\"")),
        ("`[api]`", "header_read_timeout", d(HEADER_READ_TIMEOUT)),
        ("`[api]`", "idle_timeout", d(IDLE_TIMEOUT)),
        ("`[api]`", "body_read_timeout", d(BODY_READ_TIMEOUT)),
        ("`[api]`", "max_connections", MAX_CONNECTIONS.to_string()),
        ("`[scaler]`", "max_instances", MAX_INSTANCES.to_string()),
        ("`[scaler]`", "poll_interval", d(SCALER_POLL_INTERVAL)),
        ("`[bus]`", "channel_prefix", format!("\"{CHANNEL_PREFIX}\"")),
        ("`[log]`", "format", LOG_FORMAT.to_string()),
        ("`[rule_limits]`", "call_deadline", d(CALL_DEADLINE)),
        ("`[rule_limits]`", "call_fuel", CALL_FUEL.to_string()),
        ("`[rule_limits]`", "memory_mib", MEMORY_MIB.to_string()),
        ("`[rule_limits]`", "quarantine_after", QUARANTINE_AFTER.to_string()),
        ("`[rule_limits]`", "cache_mib", CACHE_MIB.to_string()),
        ("`[queues.<name>]`", "batch_size", BATCH_SIZE.to_string()),
        ("`[queues.<name>]`", "min_tasks", MIN_TASKS.to_string()),
        ("`[queues.<name>]`", "max_tasks", MAX_TASKS.to_string()),
        ("`[queues.<name>]`", "max_concurrent_calls", MAX_CONCURRENT_CALLS.to_string()),
        ("`[queues.<name>]`", "min_polling_interval", d(MIN_POLLING_INTERVAL)),
        ("`[queues.<name>]`", "max_polling_interval", d(MAX_POLLING_INTERVAL)),
        ("`[queues.<name>]`", "visibility_timeout", d(VISIBILITY_TIMEOUT)),
        ("`[queues.<name>]`", "max_retry_delay", d(MAX_RETRY_DELAY)),
        ("`[queues.<name>]`", "lease_duration", d(LEASE_DURATION)),
        ("`[queues.<name>]`", "max_dequeue_count", MAX_DEQUEUE_COUNT.to_string()),
        ("`[queues.<name>]`", "push", PUSH.to_string()),
        ("`[queues.<name>]`", "safety_poll", d(SAFETY_POLL)),
        ("`[queues.<name>]`", "scale_interval", d(SCALE_INTERVAL)),
        ("`[queues.<name>]`", "max_pickup_delay", d(MAX_PICKUP_DELAY)),
        ("`[queues.<name>]`", "partitions", PARTITIONS.to_string()),
        ("`[queues.<name>]`", "compression", COMPRESSION.to_string()),
        ("`[queues.<name>]`", "pack_linger", d(PACK_LINGER)),
        ("`[queues.<name>]`", "delivery", "item".to_string()),
        ("`[queues.<name>]`", "max_batch_items", MAX_BATCH_ITEMS.to_string()),
        ("`[queues.<name>]`", "reply_ttl", d(REPLY_TTL)),
        ("`[queues.<name>]`", "record", RECORD.to_string()),
        ("`[queues.<name>]`", "record_max_bytes", RECORD_MAX_BYTES.to_string()),
        ("`[queues.<name>]`", "handler.timeout", d(HANDLER_TIMEOUT)),
    ]
}

#[cfg(test)]
mod tests {
    /// The rows of the table under the heading that starts with `## {section}`: key → default.
    fn table(doc: &str, section: &str) -> std::collections::BTreeMap<String, String> {
        let heading = format!("## {section}");
        let start = doc.lines().position(|l| l.starts_with(&heading)).unwrap_or_else(|| panic!("docs/reference/config.md has no heading {heading}"));
        doc.lines()
            .skip(start + 1)
            .take_while(|l| !l.starts_with("## "))
            .filter(|l| l.starts_with("| `"))
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                Some((cells.get(1)?.trim_matches('`').to_string(), cells.get(3)?.trim_matches('`').to_string()))
            })
            .collect()
    }

    /// Equal as written, or as durations (`"60s"` is `"1m"`), quotes aside.
    fn same_value(documented: &str, code: &str) -> bool {
        let (documented, code) = (documented.trim_matches('"'), code.trim_matches('"'));
        documented == code || matches!((humantime::parse_duration(documented), humantime::parse_duration(code)), (Ok(a), Ok(b)) if a == b)
    }

    #[test]
    fn docs_config_md_names_every_default_as_the_code_has_it() {
        let doc = include_str!("../../docs/reference/config.md");
        let mut wrong = Vec::new();
        for (section, key, value) in super::documented() {
            let rows = table(doc, section);
            match rows.get(key) {
                Some(documented) if same_value(documented, &value) => {}
                Some(documented) => wrong.push(format!("{section} {key}: docs say {documented}, the code {value}")),
                None => wrong.push(format!("{section} {key}: not in docs/reference/config.md")),
            }
        }
        assert!(wrong.is_empty(), "docs/reference/config.md disagrees with host/src/defaults.rs:\n{}", wrong.join("\n"));
    }
}
