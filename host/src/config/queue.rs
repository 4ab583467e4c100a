//! `[queues.<name>]`, validated into a [`QueueConfig`].

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use super::QueueConfig;
use super::backend::{AzureFile, Backend, BackendKind, SqsFile};
use super::checks::{
    AtLeast, MAX_BATCH_ITEMS, MAX_CONCURRENT_CALLS, MAX_INTERVAL, MAX_PACK_LINGER, MAX_PICKUP_DELAY, MAX_SAFETY_POLL, MAX_TASKS, check_duration,
    parse_handler_url,
};
use super::file::QueueFile;
use crate::listener::QueueSettings;
use crate::names::{QueueName, RuleFileName};
use crate::payload::claims::{ClaimSettings, MAX_CLAIM_CHECK_BYTES_LIMIT, MAX_RETENTION, MAX_SWEEP_INTERVAL, MIN_RETENTION, MIN_SWEEP_INTERVAL};
use crate::payload::{AZURE_MAX_ENVELOPE_BYTES, Delivery, PayloadSettings};
use crate::queue::partitioned::MAX_PARTITIONS;
use crate::queue::sqs::MAX_GET as SQS_MAX_GET;
use crate::queue::{MAX_BATCH, MAX_VISIBILITY};

/// The MaximumMessageSize the envelope limit of an SQS queue assumes: 256 KiB, the default
/// of queues created before 2025 (the queue's own is read only at start).
const SQS_ASSUMED_MESSAGE_BYTES: usize = 256 * 1024;

impl QueueFile {
    pub(super) fn validate(
        self,
        name: &str,
        base: &Path,
        host_azure: Option<&AzureFile>,
        host_aws: Option<&SqsFile>,
        max_message_bytes: usize,
    ) -> Result<QueueConfig> {
        let backend = self.backend(name, base, host_azure, host_aws)?;
        let name = QueueName::new(name)?;
        self.check_tasks()?;
        let batch_size = self.batch_size_on(&backend)?;
        self.check_timings(&backend)?;
        let safety_poll = self.safety_poll()?;
        if self.max_dequeue_count == 0 {
            bail!("max_dequeue_count: must be at least 1");
        }
        let claims = self.claim_settings()?;
        if !(1..=MAX_PARTITIONS).contains(&self.partitions) {
            bail!("partitions: must be 1 to {MAX_PARTITIONS}, got {}", self.partitions);
        }
        let rule = self.rule()?;
        self.check_record_max_bytes()?;
        let shadow_rule = self.shadow_rule(rule.as_ref())?;
        let (handler_url, handler_timeout) = self.handler()?;
        let payload = self.payload_settings(&name, &backend, max_message_bytes)?;
        Ok(QueueConfig {
            name: name.clone(),
            settings: self.polling_on(&backend, self.queue_settings(safety_poll, batch_size)),
            rule,
            rule_params: self.rule_params.into_iter().collect(),
            shadow_rule,
            shadow_rule_params: self.shadow_rule_params.into_iter().collect(),
            handler_url,
            handler_timeout,
            partitions: self.partitions,
            backend,
            claims,
            payload,
            record_max_bytes: self.record.then_some(self.record_max_bytes),
        })
    }

    /// Where the queue's messages live: the embedded queue, Azure with the queue's own
    /// `azure` section or else the host's `[azure]`, or SQS with its `sqs` section or `[aws]`.
    fn backend(&self, name: &str, base: &Path, host_azure: Option<&AzureFile>, host_aws: Option<&SqsFile>) -> Result<Backend> {
        if self.sqs.is_some() && self.backend != BackendKind::Sqs {
            bail!("sqs: set backend = \"sqs\" to use it");
        }
        Ok(match (self.backend, &self.azure, host_azure) {
            (BackendKind::Sqs, Some(_), _) => bail!("azure: a queue with backend = \"sqs\" takes [queues.{name}.sqs], not azure"),
            (BackendKind::Sqs, None, _) => SqsFile::backend(name, self.sqs.as_ref(), host_aws)?,
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
        })
    }

    /// The batch size and the bounds of tasks and handler calls.
    fn check_tasks(&self) -> Result<()> {
        if !(1..=MAX_BATCH).contains(&self.batch_size) {
            bail!("batch_size: must be 1 to {MAX_BATCH}, got {}", self.batch_size);
        }
        if !(1..=MAX_TASKS).contains(&self.max_tasks) {
            bail!("max_tasks: must be 1 to {MAX_TASKS}, got {}", self.max_tasks);
        }
        if !(1..=MAX_CONCURRENT_CALLS).contains(&self.max_concurrent_calls) {
            bail!("max_concurrent_calls: must be 1 to {MAX_CONCURRENT_CALLS}, got {}", self.max_concurrent_calls);
        }
        if self.min_tasks > self.max_tasks {
            bail!("min_tasks: {} is more than max_tasks ({})", self.min_tasks, self.max_tasks);
        }
        if self.min_tasks == 0 && !self.push {
            bail!("min_tasks: 0 needs push = true (without push notifications, nothing would notice new messages)");
        }
        Ok(())
    }

    /// The batch size on `backend`: an SQS receive takes at most 10, so the default (32) is
    /// read as 10 there and more is refused.
    fn batch_size_on(&self, backend: &Backend) -> Result<u32> {
        Ok(match backend {
            Backend::Sqs { .. } if self.batch_size == crate::defaults::BATCH_SIZE => self.batch_size.min(SQS_MAX_GET),
            Backend::Sqs { .. } if self.batch_size > SQS_MAX_GET => {
                bail!("batch_size: must be 1 to {SQS_MAX_GET} on SQS (a receive takes at most 10), got {}", self.batch_size)
            }
            _ => self.batch_size,
        })
    }

    /// `settings` with the polling intervals and pickup delay on `backend`
    /// ([`sqs_polling_intervals`], [`sqs_pickup_delay`] on SQS).
    fn polling_on(&self, backend: &Backend, settings: QueueSettings) -> QueueSettings {
        if !matches!(backend, Backend::Sqs { .. }) {
            return settings;
        }
        let (min_polling_interval, max_polling_interval) = sqs_polling_intervals(settings.min_polling_interval, settings.max_polling_interval);
        QueueSettings { min_polling_interval, max_polling_interval, max_pickup_delay: sqs_pickup_delay(settings.max_pickup_delay), ..settings }
    }

    /// The polling intervals, leases, retry delays and scaling times.
    fn check_timings(&self, backend: &Backend) -> Result<()> {
        check_duration("min_polling_interval", self.min_polling_interval, AtLeast::AboveZero, MAX_INTERVAL)?;
        check_duration("max_polling_interval", self.max_polling_interval, AtLeast::AboveZero, MAX_INTERVAL)?;
        if self.min_polling_interval > self.max_polling_interval {
            bail!(
                "min_polling_interval: {} is more than max_polling_interval ({})",
                humantime::format_duration(self.min_polling_interval),
                humantime::format_duration(self.max_polling_interval)
            );
        }
        // SQS holds a message invisible for at most 12 hours.
        let max_visibility = if matches!(backend, Backend::Sqs { .. }) { crate::queue::sqs::MAX_VISIBILITY } else { MAX_VISIBILITY };
        check_duration("lease_duration", self.lease_duration, AtLeast::Duration(Duration::from_secs(1)), max_visibility)?;
        check_duration("visibility_timeout", self.visibility_timeout, AtLeast::AboveZero, max_visibility)?;
        check_duration("max_retry_delay", self.max_retry_delay, AtLeast::Zero, max_visibility)?;
        check_duration("scale_interval", self.scale_interval, AtLeast::Zero, MAX_INTERVAL)?;
        check_duration("max_pickup_delay", self.max_pickup_delay, AtLeast::Zero, MAX_PICKUP_DELAY)?;
        Ok(())
    }

    /// The safety poll of a push queue (the default when not given).
    fn safety_poll(&self) -> Result<Duration> {
        match self.safety_poll {
            Some(_) if !self.push => bail!("safety_poll: only applies with push = true (without push a task always polls)"),
            Some(interval) => {
                check_duration("safety_poll", interval, AtLeast::Duration(Duration::from_secs(1)), MAX_SAFETY_POLL)?;
                Ok(interval)
            }
            None => Ok(crate::defaults::SAFETY_POLL),
        }
    }

    /// The rule's file name; `None`: the built-in rule.
    fn rule(&self) -> Result<Option<RuleFileName>> {
        match &self.rule {
            None if !self.rule_params.is_empty() => bail!("rule_params: given, but no rule is set (the built-in rule takes no parameters)"),
            None => Ok(None),
            Some(file) => Ok(Some(RuleFileName::new(file).context("rule")?)),
        }
    }

    fn check_record_max_bytes(&self) -> Result<()> {
        if !(crate::record::MIN_MAX_BYTES..=crate::record::MAX_MAX_BYTES).contains(&self.record_max_bytes) {
            bail!(
                "record_max_bytes: must be {} to {} bytes (64 KiB to 1 GiB), got {}",
                crate::record::MIN_MAX_BYTES,
                crate::record::MAX_MAX_BYTES,
                self.record_max_bytes
            );
        }
        Ok(())
    }

    /// The shadow rule's file name, which must not be the live rule's.
    fn shadow_rule(&self, live: Option<&RuleFileName>) -> Result<Option<RuleFileName>> {
        let shadow_rule = match &self.shadow_rule {
            None if !self.shadow_rule_params.is_empty() => bail!("shadow_rule_params: given, but no shadow_rule is set"),
            None => None,
            Some(file) => Some(RuleFileName::new(file).context("shadow_rule")?),
        };
        if let (Some(shadow), Some(live)) = (&shadow_rule, live)
            && shadow == live
        {
            bail!(
                "shadow_rule: {:?} is also this queue's rule; a shadow that is the live rule can only agree with it: name the candidate rule's file, or remove shadow_rule",
                shadow.as_str()
            );
        }
        Ok(shadow_rule)
    }

    /// The handler's URL (`None`: a handler given in code) and its timeout.
    fn handler(&self) -> Result<(Option<reqwest::Url>, Duration)> {
        let handler_url = self.handler.as_ref().map(|handler| parse_handler_url(&handler.url)).transpose()?;
        let handler_timeout = self.handler.as_ref().map_or(crate::defaults::HANDLER_TIMEOUT, |handler| handler.timeout);
        check_duration("handler.timeout", handler_timeout, AtLeast::AboveZero, MAX_INTERVAL)?;
        Ok((handler_url, handler_timeout))
    }

    /// How messages are packed and delivered, and where answers go.
    fn payload_settings(&self, name: &QueueName, backend: &Backend, max_message_bytes: usize) -> Result<PayloadSettings> {
        check_duration("pack_linger", self.pack_linger, AtLeast::Zero, MAX_PACK_LINGER)?;
        let max_batch_items = match self.max_batch_items {
            Some(_) if self.delivery != Delivery::Batch => bail!("max_batch_items: only applies with delivery = \"batch\""),
            Some(count) if !(1..=MAX_BATCH_ITEMS).contains(&count) => bail!("max_batch_items: must be 1 to {MAX_BATCH_ITEMS}, got {count}"),
            Some(count) => count,
            None => crate::defaults::MAX_BATCH_ITEMS,
        };
        if self.reply_ttl.is_some() && self.reply_queue.is_none() {
            bail!("reply_ttl: only applies with reply_queue (how long an answer nobody took stays on it); set reply_queue, or remove reply_ttl");
        }
        let reply_ttl = self.reply_ttl.unwrap_or(crate::defaults::REPLY_TTL);
        check_duration("reply_ttl", reply_ttl, AtLeast::Duration(Duration::from_secs(1)), MAX_VISIBILITY)?;
        let reply_queue = self.reply_queue(name)?;
        if self.trace_envelope && matches!(backend, Backend::Sqs { .. }) {
            bail!("trace_envelope: not for an SQS queue, whose message attributes carry a message's trace context; remove it");
        }
        let max_envelope_bytes = match backend {
            Backend::Embedded => max_message_bytes,
            Backend::Azure { .. } => AZURE_MAX_ENVELOPE_BYTES,
            Backend::Sqs { encoding, .. } => encoding.max_body_bytes(SQS_ASSUMED_MESSAGE_BYTES),
        };
        Ok(PayloadSettings {
            compression: self.compression,
            pack_linger: self.pack_linger,
            delivery: self.delivery,
            max_batch_items,
            max_envelope_bytes,
            reply_queue,
            reply_ttl,
            trace_envelope: self.trace_envelope,
        })
    }

    /// The queue answers go to, which must be neither this queue nor a poison queue.
    fn reply_queue(&self, name: &QueueName) -> Result<Option<String>> {
        let Some(reply) = &self.reply_queue else {
            return Ok(None);
        };
        if self.delivery == Delivery::Batch {
            bail!(
                "reply_queue: a queue with delivery = \"batch\" has no answer per item (the handler answers which items failed); use delivery = \"item\", or remove reply_queue"
            );
        }
        let reply = QueueName::new(reply).context("reply_queue")?;
        if reply == *name || name.partitions(self.partitions).iter().any(|p| p.as_str() == reply.as_str()) {
            bail!("reply_queue: {reply} is this queue (or one of its partitions); answers would come back as requests");
        }
        if reply.as_str().ends_with("-poison") {
            bail!("reply_queue: {reply} is a poison queue; answers would be taken for poisoned messages");
        }
        Ok(Some(reply.to_string()))
    }

    /// The listener's settings: the queue's keys, the rest the host's defaults.
    fn queue_settings(&self, safety_poll: Duration, batch_size: u32) -> QueueSettings {
        QueueSettings {
            batch_size,
            min_tasks: self.min_tasks,
            max_tasks: self.max_tasks,
            max_concurrent_calls: self.max_concurrent_calls,
            min_polling_interval: self.min_polling_interval,
            max_polling_interval: self.max_polling_interval,
            lease_duration: self.lease_duration,
            visibility_timeout: self.visibility_timeout,
            max_retry_delay: self.max_retry_delay,
            max_dequeue_count: self.max_dequeue_count,
            push_enabled: self.push,
            safety_poll,
            scale_interval: self.scale_interval,
            max_pickup_delay: self.max_pickup_delay,
            ..QueueSettings::default()
        }
    }

    /// The claim-check keys, checked.
    fn claim_settings(&self) -> Result<ClaimSettings> {
        if !(1..=MAX_CLAIM_CHECK_BYTES_LIMIT).contains(&self.max_claim_check_bytes) {
            bail!("max_claim_check_bytes: must be 1 to {MAX_CLAIM_CHECK_BYTES_LIMIT}, got {}", self.max_claim_check_bytes);
        }
        check_duration("claim_check_retention", self.claim_check_retention, AtLeast::Duration(MIN_RETENTION), MAX_RETENTION)?;
        // A message waiting out its retry delay must find its body when it comes back.
        if self.claim_check_retention <= self.max_retry_delay {
            bail!(
                "claim_check_retention: {} is not more than max_retry_delay ({}): a message waiting for its retry would lose its body",
                humantime::format_duration(self.claim_check_retention),
                humantime::format_duration(self.max_retry_delay)
            );
        }
        check_duration("claim_sweep_interval", self.claim_sweep_interval, AtLeast::Duration(MIN_SWEEP_INTERVAL), MAX_SWEEP_INTERVAL)?;
        Ok(ClaimSettings { max_bytes: self.max_claim_check_bytes, retention: self.claim_check_retention, sweep_interval: self.claim_sweep_interval })
    }
}

/// The polling intervals of an SQS queue: the defaults (800 ms to 60 s) are read as SQS's
/// longest long poll, 20 s, each idle delay then waiting on SQS whole: a message arriving
/// meanwhile is taken at once, and an idle hour costs 180 requests. Backing off from 800 ms
/// buys nothing where a wait answers the moment a message comes; it only makes more
/// requests (`ebb simulate --backend sqs --bench`: on trickle 1,881 with the back-off
/// against 939 for Lambda's two idle long-pollers; a minute's delay, 40 s of it asleep,
/// picks up 21 s late). Set values are kept (the longest at least the shortest).
pub(crate) fn sqs_polling_intervals(min: Duration, max: Duration) -> (Duration, Duration) {
    let wait = crate::queue::sqs::MAX_WAIT;
    let min_set = min != crate::defaults::MIN_POLLING_INTERVAL;
    let max = if max == crate::defaults::MAX_POLLING_INTERVAL { wait.max(min) } else { max };
    let min = if min_set { min } else { wait.min(max) };
    (min, max)
}

/// The pickup delay of an SQS queue: the default (500 ms) is read as [`SQS_PICKUP_DELAY`].
/// SQS bills each receive, and a receive takes what arrived within the delay: at 800 ms the
/// push default bills 1.16 × the floor on paper-billing with pickup p99 885 ms, against
/// 1.35 × at 500 ms (`ebb simulate --backend sqs --bench`; the floor's W and the goal's
/// p99 are 1 s). A set value is kept.
pub(crate) fn sqs_pickup_delay(delay: Duration) -> Duration {
    if delay == crate::defaults::MAX_PICKUP_DELAY { SQS_PICKUP_DELAY } else { delay }
}

/// See [`sqs_pickup_delay`].
pub(crate) const SQS_PICKUP_DELAY: Duration = Duration::from_millis(800);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_sqs_the_default_polling_intervals_are_a_whole_long_poll_and_set_ones_are_kept() {
        let (s, ms) = (Duration::from_secs, Duration::from_millis);
        let defaults = (crate::defaults::MIN_POLLING_INTERVAL, crate::defaults::MAX_POLLING_INTERVAL);
        assert_eq!(sqs_polling_intervals(defaults.0, defaults.1), (s(20), s(20)));
        assert_eq!(sqs_polling_intervals(ms(100), defaults.1), (ms(100), s(20)), "a set shortest is kept");
        assert_eq!(sqs_polling_intervals(defaults.0, s(5)), (s(5), s(5)), "a set longest bounds the shortest");
        assert_eq!(sqs_polling_intervals(s(30), defaults.1), (s(30), s(30)), "the longest at least the shortest");
        assert_eq!(sqs_polling_intervals(ms(200), s(90)), (ms(200), s(90)));
    }

    #[test]
    fn on_sqs_the_default_pickup_delay_is_800_ms_and_a_set_one_is_kept() {
        let ms = Duration::from_millis;
        assert_eq!(sqs_pickup_delay(crate::defaults::MAX_PICKUP_DELAY), ms(800));
        assert_eq!((sqs_pickup_delay(ms(200)), sqs_pickup_delay(Duration::ZERO)), (ms(200), Duration::ZERO));
    }
}
