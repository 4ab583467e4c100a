//! `GET /metrics`: Prometheus/OpenMetrics text.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::status::statuses;
use crate::cost::CostStatus;
use crate::http::errors;
use crate::http::{Api, queue_cost};
use crate::queue::CallKind;
use crate::rules::{DecisionKind, ShadowOutcome};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RateLabel {
    queue: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransactionLabel {
    queue: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShadowLabel {
    queue: String,
    kind: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RetryAfterLabel {
    queue: String,
    reason: String,
}

pub(super) async fn metrics(State(api): State<Arc<Api>>) -> Response {
    let mut registry = Registry::with_prefix("ebb");
    let gauge = |registry: &mut Registry, name: &str, help: &str| {
        let family = Family::<QueueLabel, Gauge>::default();
        registry.register(name, help, family.clone());
        family
    };
    let counter = |registry: &mut Registry, name: &str, help: &str| {
        let family = Family::<QueueLabel, Counter>::default();
        registry.register(name, help, family.clone());
        family
    };
    let depth = gauge(&mut registry, "queue_depth", "Approximate messages in the queue (current on the embedded store; see depth_as_of in /status)");
    let active = gauge(&mut registry, "active_tasks", "Dequeue tasks running");
    let target = gauge(&mut registry, "target_tasks", "The rule's last task count");
    let in_flight = gauge(&mut registry, "in_flight", "Messages leased on this host and not yet settled (waiting for, in or after the handler call)");
    let handler_calls = gauge(&mut registry, "handler_calls", "Handler calls running");
    let concurrency_limit =
        gauge(&mut registry, "handler_concurrency_limit", "Handler calls allowed at once: the rule's concurrency decision, or max_concurrent_calls");
    let waiting_for_slots = gauge(&mut registry, "tasks_waiting_for_slots", "Dequeue tasks waiting for free handler slots before their next get");
    let paused = gauge(&mut registry, "queue_paused", "1 while the queue is paused (no get; calls that run finish)");
    let processed = counter(&mut registry, "messages_processed", "Messages handled and deleted");
    let failed = counter(&mut registry, "messages_failed", "Handler failures");
    let poisoned = counter(&mut registry, "messages_poisoned", "Messages moved to the poison queue");
    let poisoned_corrupt = counter(&mut registry, "messages_poisoned_corrupt", "Messages poisoned because their stored body failed its checksum");
    let poisoned_body_only = counter(
        &mut registry,
        "messages_poisoned_body_only",
        "Poisoned messages moved as the bare body, their reason not kept in storage (only in the log, at most 10 lines a minute per storage queue, and the last ten in /status): on Azure every one (as Azure Functions moves them), on the embedded store those whose envelope did not fit",
    );
    let handler_panics = counter(&mut registry, "handler_panics", "Handler calls that panicked (counted as failures)");
    let host_errors =
        counter(&mut registry, "handler_host_errors", "Handler calls the host could not make (out of file descriptors); retried, never poisoned for");
    let pushed_back =
        counter(&mut registry, "handler_pushed_back", "Handler calls the app pushed back (HTTP 429 or 503); retried after its Retry-After, not failures");
    let envelopes = counter(&mut registry, "envelopes", "Envelopes (messages of many items) whose items were delivered");
    let items_delivered = counter(&mut registry, "items_delivered", "Items of envelopes handled");
    let items_failed = counter(&mut registry, "items_failed", "Item deliveries that failed (each retried alone, or poisoned alone)");
    let items_poisoned = counter(&mut registry, "items_poisoned", "Items moved to the poison queue alone");
    let replies = counter(&mut registry, "replies", "Handler answers put on the reply queue");
    let retry_after_adjusted = Family::<RetryAfterLabel, Counter>::default();
    registry.register(
        "handler_retry_after_adjusted",
        "Retry-After values not used as given, by reason: capped (over max_retry_delay), unusable (malformed or past)",
        retry_after_adjusted.clone(),
    );
    let poison_failures =
        counter(&mut registry, "poison_failures", "Poisonings the poison queue refused (the message stays, tried again after max_retry_delay)");
    let leases_lost =
        counter(&mut registry, "leases_lost", "Leases another lease replaced before or while the handler ran (storage slower than half the lease)");
    let task_panics = counter(&mut registry, "task_panics", "Dequeue or scaler tasks that panicked and were restarted");
    let rule_call_panics = counter(&mut registry, "rule_call_panics", "Rule calls whose blocking task panicked (the built-in rule decided)");
    let failure_retries =
        counter(&mut registry, "failure_rule_retries", "Failed deliveries the queue's rule (on-handler-failure) retried after a delay of its own");
    let failure_poisons = counter(&mut registry, "failure_rule_poisons", "Failed deliveries the queue's rule (on-handler-failure) poisoned");
    let failure_defaults = counter(
        &mut registry,
        "failure_rule_defaults",
        "Failed deliveries the queue's rule left to max_dequeue_count handling: it said default, could not answer, or retried past the host's ceiling",
    );
    let faults = counter(&mut registry, "rule_faults", "Rule calls that faulted (the built-in rule decided), whatever the rule file");
    let waited = counter(
        &mut registry,
        "rule_waited_calls",
        "Rule calls past the call deadline in wall-clock time but not in CPU time (the host was short of CPU, or the rule slept): not faults",
    );
    let quarantined = gauge(&mut registry, "rule_quarantined", "1 while the queue's rule is quarantined (the built-in rule decides until its file changes)");
    let load_failed =
        gauge(&mut registry, "rule_load_failed", "1 while the queue's configured rule cannot load (the built-in rule decides until the file is fixed)");
    let refused = gauge(&mut registry, "rule_refused", "1 while a newer content of the queue's rule file is refused (the rule in use goes on deciding)");
    let shadow_decisions = Family::<ShadowLabel, Counter>::default();
    registry.register(
        "shadow_decisions",
        "Live decisions by what the queue's shadow rule made of them: agree, disagree, fault (the shadow faulted), dropped (it fell behind), skipped (no shadow rule in use)",
        shadow_decisions.clone(),
    );
    let shadow_faults =
        counter(&mut registry, "shadow_rule_faults", "Shadow rule calls that faulted, whatever the shadow file (never applied: live decisions are unaffected)");
    let shadow_quarantined =
        gauge(&mut registry, "shadow_rule_quarantined", "1 while the queue's shadow rule is quarantined (it is not asked until its file changes)");
    let clamps = counter(&mut registry, "rule_clamps", "Rule decisions clamped into the queue's bounds");
    let loaded_at = Family::<QueueLabel, Gauge<f64, AtomicU64>>::default();
    registry.register(
        "rule_loaded_timestamp_seconds",
        "Unix time the queue's rule in use was loaded: a change is a swap (absent while the built-in rule decides)",
        loaded_at.clone(),
    );
    let safety_polls = counter(&mut registry, "safety_polls", "Safety polls (push mode: a get while no task ran)");
    let transactions = Family::<TransactionLabel, Counter>::default();
    registry.register("storage_transactions", "Storage transactions (billed calls: the storage answered) by kind", transactions.clone());
    let unanswered = Family::<TransactionLabel, Counter>::default();
    registry.register(
        "storage_unanswered",
        "Storage call attempts that got no answer (connection broken, no answer in time) by kind: not in ebb_storage_transactions_total, and billed or not (the service may have done them)",
        unanswered.clone(),
    );
    let rate = Family::<RateLabel, Gauge<f64, AtomicU64>>::default();
    registry.register(
        "transactions_per_hour",
        "Billed transactions per hour over the last 10 minutes: all, or idle (empty gets and counts that found the queue empty); unanswered: attempts that got no answer, not in all",
        rate.clone(),
    );
    let monthly = Family::<RateLabel, Gauge<f64, AtomicU64>>::default();
    registry.register(
        "projected_usd_per_month",
        "A 30-day month at the current transaction rate, in US dollars: all, or the idle part; unanswered: at most this much more, if the service billed the attempts that got no answer",
        monthly.clone(),
    );
    let host_rate = Family::<KindLabel, Gauge<f64, AtomicU64>>::default();
    registry.register(
        "host_transactions_per_hour",
        "Billed transactions per hour of every queue of the host: all, or idle; unanswered: attempts that got no answer, not in all",
        host_rate.clone(),
    );
    let host_monthly = Family::<KindLabel, Gauge<f64, AtomicU64>>::default();
    registry.register(
        "host_projected_usd_per_month",
        "A 30-day month at the host's current transaction rate, in US dollars: all, or the idle part; unanswered: at most this much more",
        host_monthly.clone(),
    );
    let price = Gauge::<f64, AtomicU64>::default();
    registry.register("price_per_10k_transactions_usd", "The price the cost figures use, US dollars per 10,000 transactions", price.clone());
    price.set(api.price_per_10k_transactions);
    let mut costs = Vec::new();
    for s in statuses(&api) {
        if let Some(cost) = queue_cost(&s, api.price_per_10k_transactions) {
            for (kind, per_hour, usd) in cost_kinds(&cost) {
                rate.get_or_create(&RateLabel { queue: s.queue.clone(), kind }).set(per_hour);
                monthly.get_or_create(&RateLabel { queue: s.queue.clone(), kind }).set(usd);
            }
            costs.push(cost);
        }
        safety_polls.get_or_create(&QueueLabel { queue: s.queue.clone() }).inc_by(s.safety_polls);
        let label = QueueLabel { queue: s.queue.clone() };
        depth.get_or_create(&label).set(s.approximate_depth as i64);
        active.get_or_create(&label).set(s.active_tasks.into());
        target.get_or_create(&label).set(s.target_tasks.into());
        in_flight.get_or_create(&label).set(s.in_flight.into());
        handler_calls.get_or_create(&label).set(s.handler_calls.into());
        concurrency_limit.get_or_create(&label).set(s.concurrency_limit.into());
        waiting_for_slots.get_or_create(&label).set(s.tasks_waiting_for_slots.into());
        paused.get_or_create(&label).set(i64::from(s.paused.is_some()));
        processed.get_or_create(&label).inc_by(s.processed);
        failed.get_or_create(&label).inc_by(s.failed);
        poisoned.get_or_create(&label).inc_by(s.poisoned);
        poisoned_corrupt.get_or_create(&label).inc_by(s.poisoned_corrupt);
        poisoned_body_only.get_or_create(&label).inc_by(s.poisoned_body_only);
        handler_panics.get_or_create(&label).inc_by(s.handler_panics);
        task_panics.get_or_create(&label).inc_by(s.task_panics);
        leases_lost.get_or_create(&label).inc_by(s.leases_lost);
        poison_failures.get_or_create(&label).inc_by(s.poison_failures);
        host_errors.get_or_create(&label).inc_by(s.host_errors);
        pushed_back.get_or_create(&label).inc_by(s.pushed_back);
        envelopes.get_or_create(&label).inc_by(s.envelopes);
        items_delivered.get_or_create(&label).inc_by(s.items_delivered);
        items_failed.get_or_create(&label).inc_by(s.items_failed);
        items_poisoned.get_or_create(&label).inc_by(s.items_poisoned);
        replies.get_or_create(&label).inc_by(s.replies);
        for (reason, count) in [("capped", s.retry_after_capped), ("unusable", s.retry_after_unusable)] {
            retry_after_adjusted.get_or_create(&RetryAfterLabel { queue: label.queue.clone(), reason: reason.into() }).inc_by(count);
        }
        rule_call_panics.get_or_create(&label).inc_by(s.rule_call_panics);
        failure_retries.get_or_create(&label).inc_by(s.failure_rule_retries);
        failure_poisons.get_or_create(&label).inc_by(s.failure_rule_poisons);
        failure_defaults.get_or_create(&label).inc_by(s.failure_rule_defaults);
        if let Some(rule) = &s.rule {
            faults.get_or_create(&label).inc_by(rule.faults_total);
            waited.get_or_create(&label).inc_by(rule.waited_calls);
            quarantined.get_or_create(&label).set(i64::from(rule.quarantined));
            load_failed.get_or_create(&label).set(i64::from(rule.state == crate::rules::RuleState::Error));
            refused.get_or_create(&label).set(i64::from(rule.refused.is_some()));
            clamps.get_or_create(&label).inc_by(rule.clamps);
            if let Some(at) = rule.loaded_at.and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok()) {
                loaded_at.get_or_create(&label).set(at.as_secs_f64());
            }
        }
        if let Some(shadow) = &s.shadow {
            for kind in DecisionKind::ALL {
                let counts = shadow.decisions.get(kind.name()).copied().unwrap_or_default();
                for outcome in ShadowOutcome::ALL {
                    shadow_decisions
                        .get_or_create(&ShadowLabel { queue: s.queue.clone(), kind: kind.name(), outcome: outcome.name() })
                        .inc_by(counts.get(outcome));
                }
            }
            shadow_faults.get_or_create(&label).inc_by(shadow.rule.as_ref().map_or(0, |r| r.faults_total));
            shadow_quarantined.get_or_create(&label).set(i64::from(shadow.rule.as_ref().is_some_and(|r| r.quarantined)));
        }
        if let Some(t) = s.transactions {
            for (kind, n) in [
                ("put", t.puts),
                ("get", t.gets_with_messages),
                ("get_empty", t.gets_empty),
                ("delete", t.deletes),
                ("update", t.updates),
                ("count", t.counts),
                ("create", t.creates),
            ] {
                transactions.get_or_create(&TransactionLabel { queue: s.queue.clone(), kind }).inc_by(n);
            }
            for kind in CallKind::ALL {
                unanswered.get_or_create(&TransactionLabel { queue: s.queue.clone(), kind: kind.as_str() }).inc_by(t.unanswered.of(kind));
            }
        }
    }
    if let Some(bus) = api.bus.as_ref().map(|b| b.status()) {
        let connected = Gauge::<i64>::default();
        connected.set(i64::from(bus.connected));
        registry.register("bus_connected", "1 while subscribed to push notifications from other hosts", connected);
        for (name, help, value) in [
            ("bus_received", "Push notifications received and delivered", bus.received),
            ("bus_published", "Push notifications published", bus.published),
            ("bus_publish_failures", "Publishes that failed (the message was stored; hosts find it by polling)", bus.publish_failures),
            ("bus_dropped", "Push notifications dropped because the publish backlog was full", bus.dropped),
            ("bus_outages", "Times the subscription was lost", bus.outages),
            ("bus_ignored", "Payloads ignored: not the trigger JSON, too long, or naming another queue", bus.ignored),
        ] {
            let counter = Counter::<u64>::default();
            counter.inc_by(value);
            registry.register(name, help, counter);
        }
    }
    crate::http::storage_metrics::register(&mut registry, api.handles.values().flat_map(|h| h.storage_clients()), &statuses(&api));
    crate::http::storage_metrics::register_claims(&mut registry, api.handles.values().filter_map(|h| h.claim_records()));
    let total = CostStatus::total(&costs, api.price_per_10k_transactions);
    for (kind, per_hour, usd) in cost_kinds(&total) {
        host_rate.get_or_create(&KindLabel { kind }).set(per_hour);
        host_monthly.get_or_create(&KindLabel { kind }).set(usd);
    }
    let mut text = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &registry) {
        return errors::error(StatusCode::INTERNAL_SERVER_ERROR, error.to_string());
    }
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
}

/// The `kind` label of the cost gauges, with the rate per hour and the month's cost of each.
fn cost_kinds(cost: &CostStatus) -> [(&'static str, f64, f64); 3] {
    [
        ("all", cost.transactions_per_hour, cost.usd_per_month),
        ("idle", cost.idle_transactions_per_hour, cost.idle_usd_per_month),
        ("unanswered", cost.unanswered_transactions_per_hour, cost.unanswered_usd_per_month),
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use ebb_rules_sdk::{FailureContext, FailureDecision, IdleContext, IdleDecision, QueueState};

    use super::*;
    use crate::handler::{Handler, IncomingMessage};
    use crate::health::{Health, Readiness};
    use crate::listener::{Listener, QueueSettings};
    use crate::queue::memory::MemoryQueue;
    use crate::queue::{Message, MessageId, Metered, PopReceipt, QueueClient, QueueError, TokioClock};
    use crate::rules::NativeRule;

    /// An API serving `listener` as the queue `orders`.
    fn api_of(listener: Listener) -> Arc<Api> {
        Arc::new(Api {
            listeners: BTreeMap::from([("orders".to_string(), vec![listener])]),
            handles: BTreeMap::new(),
            tokens: Vec::new(),
            health: Health::default(),
            readiness: Readiness::default(),
            bus: None,
            audit: None,
            price_per_10k_transactions: crate::cost::PAPER_PRICE_PER_10K,
        })
    }

    /// `/metrics` as text.
    async fn scrape(api: &Arc<Api>) -> String {
        let answer = metrics(State(api.clone())).await;
        String::from_utf8(axum::body::to_bytes(answer.into_body(), usize::MAX).await.unwrap().to_vec()).unwrap()
    }

    /// Retries a failure whose error says "retry", poisons one that says "poison", leaves
    /// the rest to the default.
    struct ByErrorText;

    impl NativeRule for ByErrorText {
        fn name(&self) -> &str {
            "by-error-text"
        }

        fn optimal_dequeue_task_count(&self, _state: &QueueState) -> u32 {
            1
        }

        fn on_queue_empty(&self, ctx: &IdleContext) -> IdleDecision {
            IdleDecision { delay_ms: ctx.min_interval_ms, stop: false }
        }

        fn on_handler_failure(&self, ctx: &FailureContext) -> Option<FailureDecision> {
            Some(if ctx.error.contains("retry") {
                FailureDecision::Retry(3_600_000)
            } else if ctx.error.contains("poison") {
                FailureDecision::Poison("asked to".into())
            } else {
                FailureDecision::Default
            })
        }
    }

    /// Fails every message with its body as the error.
    struct FailsWithBody;

    #[async_trait::async_trait]
    impl Handler for FailsWithBody {
        async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
            anyhow::bail!("{}", String::from_utf8_lossy(&message.body))
        }
    }

    /// Issue 22, defect 3: `/status` counted the failures rule's decisions
    /// (`failure_rule_{retries,poisons,defaults}`), `/metrics` had no series for them.
    #[tokio::test(start_paused = true)]
    async fn metrics_count_the_failures_rules_retries_poisons_and_defaults_as_status_does() {
        let clock = Arc::new(TokioClock::new());
        let queue: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new("orders", clock.clone(), 65536));
        let poison: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new("orders-poison", clock, 65536));
        let settings = QueueSettings {
            max_dequeue_count: 5,
            visibility_timeout: Duration::from_secs(3600),
            min_polling_interval: Duration::from_millis(10),
            max_polling_interval: Duration::from_millis(100),
            random_seed: Some(7),
            ..Default::default()
        };
        let listener = Listener::builder(queue.clone(), poison, Arc::new(FailsWithBody)).decider(Arc::new(ByErrorText)).settings(settings).build();
        for body in ["retry 1", "retry 2", "poison", "other"] {
            queue.put(body.as_bytes(), Duration::ZERO).await.unwrap();
        }
        listener.start();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let status = listener.status();
        assert_eq!((status.failure_rule_retries, status.failure_rule_poisons, status.failure_rule_defaults), (2, 1, 1), "{status:?}");
        let api = api_of(listener.clone());
        let text = scrape(&api).await;
        for line in [
            "ebb_failure_rule_retries_total{queue=\"orders\"} 2",
            "ebb_failure_rule_poisons_total{queue=\"orders\"} 1",
            "ebb_failure_rule_defaults_total{queue=\"orders\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        listener.shutdown(Duration::from_secs(1)).await;
    }

    /// Puts whose body starts with `reset` fail as a connection reset does (no answer);
    /// everything else is the memory queue's.
    struct ResetsSomePuts(MemoryQueue);

    #[async_trait::async_trait]
    impl QueueClient for ResetsSomePuts {
        fn name(&self) -> &str {
            self.0.name()
        }
        async fn create_if_missing(&self) -> Result<(), QueueError> {
            self.0.create_if_missing().await
        }
        async fn put(&self, body: &[u8], visibility: Duration) -> Result<MessageId, QueueError> {
            if body.starts_with(b"reset") {
                let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset by peer");
                return Err(QueueError::Transient(anyhow::Error::new(reset).context("put")));
            }
            self.0.put(body, visibility).await
        }
        async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
            self.0.get(max, visibility).await
        }
        async fn delete(&self, id: &MessageId, receipt: &PopReceipt) -> Result<(), QueueError> {
            self.0.delete(id, receipt).await
        }
        async fn update_visibility(&self, id: &MessageId, receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError> {
            self.0.update_visibility(id, receipt, visibility).await
        }
        async fn approximate_count(&self) -> Result<u64, QueueError> {
            self.0.approximate_count().await
        }
    }

    /// Issue 35, item 7b: an attempt that got no answer (a reset connection) was counted as a
    /// billed transaction. Status and metrics count it apart, by kind, and the cost says how
    /// much more the bill may be.
    #[tokio::test(start_paused = true)]
    async fn unanswered_attempts_are_shown_apart_from_billed_transactions_in_status_and_metrics() {
        let clock = Arc::new(TokioClock::new());
        let metered = Metered::new(ResetsSomePuts(MemoryQueue::new("orders", clock.clone(), 65536)));
        let transactions = metered.transactions();
        let queue: Arc<dyn QueueClient> = Arc::new(metered);
        let poison: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new("orders-poison", clock, 65536));
        let listener = Listener::builder(queue.clone(), poison, Arc::new(FailsWithBody)).transactions(transactions).build();
        for body in ["one", "reset", "two", "reset again"] {
            let _ = queue.put(body.as_bytes(), Duration::ZERO).await;
        }
        let api = api_of(listener);
        let text = scrape(&api).await;
        for line in [
            "ebb_storage_transactions_total{queue=\"orders\",kind=\"put\"} 2",
            "ebb_storage_unanswered_total{queue=\"orders\",kind=\"put\"} 2",
            "ebb_storage_unanswered_total{queue=\"orders\",kind=\"get\"} 0",
            // Two of each in (at least) a minute.
            "ebb_transactions_per_hour{queue=\"orders\",kind=\"all\"} 120.0",
            "ebb_transactions_per_hour{queue=\"orders\",kind=\"unanswered\"} 120.0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        let status = serde_json::to_value(crate::http::routes::status::status(State(api)).await.0).unwrap();
        let queue = &status["queues"][0];
        assert_eq!((queue["transactions"]["puts"].as_u64(), queue["transactions"]["unanswered"]["puts"].as_u64()), (Some(2), Some(2)), "{queue}");
        assert_eq!(queue["cost"]["unanswered_transactions_per_hour"].as_f64(), Some(120.0), "{queue}");
        assert_eq!(status["cost"]["unanswered_transactions_per_hour"].as_f64(), Some(120.0), "{status}");
    }
}
