//! From the file form to a [`Config`]: every key checked, every error naming it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use super::bus::BusFile;
use super::checks::{
    AtLeast, MAX_API_CONNECTIONS, MAX_CACHE_MIB, MAX_CALL_DEADLINE, MAX_INSTANCES, MAX_INTERVAL, MAX_MEMORY_MIB, MAX_MESSAGE_BYTES_LIMIT, MAX_PRICE_PER_10K,
    check_duration, check_folder, check_token,
};
use super::file::{ConfigFile, ScalerFile};
use super::settings::{ApiLimits, ScalerSettings};
use super::{Config, SCALER_TOKEN_ENV, TOKEN_ENV};
use crate::rules::RuleLimits;

impl ConfigFile {
    pub(super) fn validate(self, base: &Path, env_token: Option<String>) -> Result<Config> {
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
        check_duration("api.body_read_timeout", self.api.body_read_timeout, AtLeast::AboveZero, MAX_INTERVAL)?;
        let probe_connections = match self.api.probe_connections {
            Some(n) if n >= self.api.max_connections => {
                bail!("api.probe_connections: must be less than api.max_connections ({}), got {n}", self.api.max_connections)
            }
            Some(n) => n,
            None => crate::defaults::PROBE_CONNECTIONS.min(self.api.max_connections / 2),
        };
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
        check_folder("data_dir", &self.data_dir, &data_dir)?;
        let rules_dir = base.join(&self.rules_dir);
        check_folder("rules_dir", &self.rules_dir, &rules_dir)?;
        for name in self.queues.keys() {
            if let Some(owner) = name.strip_suffix("-poison").filter(|owner| self.queues.contains_key(*owner)) {
                bail!("queues.{name}: this name is taken by the poison queue of queues.{owner}");
            }
        }
        let mut queues = Vec::new();
        for (name, queue) in self.queues {
            queues.push(queue.validate(&name, base, self.azure.as_ref(), self.max_message_bytes).with_context(|| format!("queues.{name}"))?);
        }
        // Every storage queue (queues, partitions, poison queues) belongs to one configured queue.
        let mut owners: BTreeMap<String, &str> = BTreeMap::new();
        for queue in &queues {
            let storage = queue.storage_queues().into_iter().map(|s| (String::from(s), "")).chain([(queue.poison_queue().into(), "the poison queue of ")]);
            for (storage, role) in storage {
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
                body_read_timeout: self.api.body_read_timeout,
                max_connections: self.api.max_connections,
                probe_connections,
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
