//! `GET /metrics`: Prometheus/OpenMetrics text, from a table of descriptors ([`QUEUE_METRICS`]):
//! each metric's name, help and type, and how to read its series from a queue's status. The
//! host's own series (cost, bus, storage calls, claim checks) follow.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::status::queue_statuses;
use crate::cost::CostStatus;
use crate::http::Api;
use crate::http::errors;
use crate::queue::CallKind;
use crate::rules::{DecisionKind, RuleState, ShadowOutcome};
use crate::status::QueueStatus;

/// A series' labels after `queue` and `logical_queue`, in order.
type Labels = Vec<(&'static str, String)>;

/// A queue's series of one metric: its labels after `queue` and `logical_queue`, and its value.
type Series<T> = Vec<(Labels, T)>;

/// How a metric's series are read from a queue's status, and of which type they are.
enum Read {
    /// A gauge of whole numbers.
    Gauge(fn(&QueueStatus) -> Series<i64>),
    /// A counter (`_total` is added to its name).
    Counter(fn(&QueueStatus) -> Series<u64>),
    /// A gauge of fractions.
    Fraction(fn(&QueueStatus) -> Series<f64>),
}

/// One metric of every queue: `ebb_<name>`, its help, and its series.
struct QueueMetric {
    name: &'static str,
    help: &'static str,
    read: Read,
}

/// The one series of a metric, labelled by queue only.
fn one<T>(value: T) -> Series<T> {
    vec![(Vec::new(), value)]
}

/// The one series of a metric a queue may not have (a rule's, a shadow's): none without.
fn maybe<T>(value: Option<T>) -> Series<T> {
    value.into_iter().flat_map(one).collect()
}

/// A gauge of whole numbers, one series per queue.
const fn gauge(name: &'static str, help: &'static str, read: fn(&QueueStatus) -> Series<i64>) -> QueueMetric {
    QueueMetric { name, help, read: Read::Gauge(read) }
}

/// A counter, one series per queue (or several, by a label of its own).
const fn counter(name: &'static str, help: &'static str, read: fn(&QueueStatus) -> Series<u64>) -> QueueMetric {
    QueueMetric { name, help, read: Read::Counter(read) }
}

/// A gauge of fractions.
const fn fraction(name: &'static str, help: &'static str, read: fn(&QueueStatus) -> Series<f64>) -> QueueMetric {
    QueueMetric { name, help, read: Read::Fraction(read) }
}

/// Every queue's metrics, in the order `/metrics` shows them.
const QUEUE_METRICS: &[QueueMetric] = &[
    gauge("queue_depth", "Approximate messages in the queue (current on the embedded store; see depth_as_of in /status)", |q| one(q.approximate_depth as i64)),
    gauge("active_tasks", "Dequeue tasks running", |q| one(q.active_tasks.into())),
    gauge("target_tasks", "The rule's last task count", |q| one(q.target_tasks.into())),
    gauge("in_flight", "Messages leased on this host and not yet settled (waiting for, in or after the handler call)", |q| one(q.in_flight.into())),
    gauge("handler_calls", "Handler calls running", |q| one(q.handler_calls.into())),
    gauge("handler_concurrency_limit", "Handler calls allowed at once: the rule's concurrency decision, or max_concurrent_calls", |q| {
        one(q.concurrency_limit.into())
    }),
    gauge("tasks_waiting_for_slots", "Dequeue tasks waiting for free handler slots before their next get", |q| one(q.tasks_waiting_for_slots.into())),
    gauge("queue_paused", "1 while the queue is paused (no get; calls that run finish)", |q| one(q.paused.is_some().into())),
    counter("messages_processed", "Messages handled and deleted", |q| one(q.processed)),
    counter("messages_failed", "Handler failures", |q| one(q.failed)),
    counter("messages_poisoned", "Messages moved to the poison queue", |q| one(q.poisoned)),
    counter("messages_poisoned_corrupt", "Messages poisoned because their stored body failed its checksum", |q| one(q.poisoned_corrupt)),
    counter(
        "messages_poisoned_body_only",
        "Poisoned messages moved as the bare body, their reason not kept in storage (only in the log, at most 10 lines a minute per storage queue, and the last ten in /status): on Azure every one (as Azure Functions moves them), on the embedded store those whose envelope did not fit",
        |q| one(q.poisoned_body_only),
    ),
    counter("handler_panics", "Handler calls that panicked (counted as failures)", |q| one(q.handler_panics)),
    counter("handler_host_errors", "Handler calls the host could not make (out of file descriptors); retried, never poisoned for", |q| one(q.host_errors)),
    counter("handler_pushed_back", "Handler calls the app pushed back (HTTP 429 or 503); retried after its Retry-After, not failures", |q| one(q.pushed_back)),
    counter("envelopes", "Envelopes (messages of many items) whose items were delivered", |q| one(q.envelopes)),
    counter("items_delivered", "Items of envelopes handled", |q| one(q.items_delivered)),
    counter("items_failed", "Item deliveries that failed (each retried alone, or poisoned alone)", |q| one(q.items_failed)),
    counter("items_poisoned", "Items moved to the poison queue alone", |q| one(q.items_poisoned)),
    counter("replies", "Handler answers put on the reply queue", |q| one(q.replies)),
    counter(
        "handler_retry_after_adjusted",
        "Retry-After values not used as given, by reason: capped (over max_retry_delay), unusable (malformed or past)",
        |q| vec![(vec![("reason", "capped".into())], q.retry_after_capped), (vec![("reason", "unusable".into())], q.retry_after_unusable)],
    ),
    counter("poison_failures", "Poisonings the poison queue refused (the message stays, tried again after max_retry_delay)", |q| one(q.poison_failures)),
    counter("leases_lost", "Leases another lease replaced, or that ran out, before or while the handler ran (storage slower than half the lease)", |q| {
        one(q.leases_lost)
    }),
    counter("task_panics", "Dequeue or scaler tasks that panicked and were restarted", |q| one(q.task_panics)),
    counter("rule_call_panics", "Rule calls whose blocking task panicked (the built-in rule decided)", |q| one(q.rule_call_panics)),
    counter(
        "failure_rule_retries",
        "Failed deliveries the queue's rule (on-handler-failure) retried after a delay of its own",
        |q| one(q.failure_rule_retries),
    ),
    counter("failure_rule_poisons", "Failed deliveries the queue's rule (on-handler-failure) poisoned", |q| one(q.failure_rule_poisons)),
    counter(
        "failure_rule_defaults",
        "Failed deliveries the queue's rule left to max_dequeue_count handling: it said default, could not answer, or retried past the host's ceiling",
        |q| one(q.failure_rule_defaults),
    ),
    counter("rule_faults", "Rule calls that faulted (the built-in rule decided), whatever the rule file", |q| maybe(q.rule.as_ref().map(|r| r.faults_total))),
    counter(
        "rule_waited_calls",
        "Rule calls past the call deadline in wall-clock time but not in CPU time (the host was short of CPU, or the rule slept): not faults",
        |q| maybe(q.rule.as_ref().map(|r| r.waited_calls)),
    ),
    gauge("rule_quarantined", "1 while the queue's rule is quarantined (the built-in rule decides until its file changes)", |q| {
        maybe(q.rule.as_ref().map(|r| r.quarantined.into()))
    }),
    gauge("rule_load_failed", "1 while the queue's configured rule cannot load (the built-in rule decides until the file is fixed)", |q| {
        maybe(q.rule.as_ref().map(|r| (r.state == RuleState::Error).into()))
    }),
    gauge("rule_refused", "1 while a newer content of the queue's rule file is refused (the rule in use goes on deciding)", |q| {
        maybe(q.rule.as_ref().map(|r| r.refused.is_some().into()))
    }),
    counter(
        "shadow_decisions",
        "Live decisions by what the queue's shadow rule made of them: agree, disagree, fault (the shadow faulted), dropped (it fell behind), skipped (no shadow rule in use)",
        shadow_decisions,
    ),
    counter("shadow_rule_faults", "Shadow rule calls that faulted, whatever the shadow file (never applied: live decisions are unaffected)", |q| {
        maybe(q.shadow.as_ref().map(|s| s.rule.as_ref().map_or(0, |r| r.faults_total)))
    }),
    gauge("shadow_rule_quarantined", "1 while the queue's shadow rule is quarantined (it is not asked until its file changes)", |q| {
        maybe(q.shadow.as_ref().map(|s| s.rule.as_ref().is_some_and(|r| r.quarantined).into()))
    }),
    counter("rule_clamps", "Rule decisions clamped into the queue's bounds", |q| maybe(q.rule.as_ref().map(|r| r.clamps))),
    fraction(
        "rule_loaded_timestamp_seconds",
        "Unix time the queue's rule in use was loaded: a change is a swap (absent while the built-in rule decides)",
        |q| maybe(q.rule.as_ref().and_then(|r| r.loaded_at?.duration_since(std::time::UNIX_EPOCH).ok()).map(|at| at.as_secs_f64())),
    ),
    counter("safety_polls", "Safety polls (push mode: a get while no task ran)", |q| one(q.safety_polls)),
    counter("storage_transactions", "Storage transactions (billed calls: the storage answered) by kind", storage_transactions),
    counter(
        "storage_unanswered",
        "Storage call attempts that got no answer (connection broken, no answer in time) by kind: not in ebb_storage_transactions_total, and billed or not (the service may have done them)",
        storage_unanswered,
    ),
    fraction(
        "transactions_per_hour",
        "Billed transactions per hour over the last 10 minutes: all, or idle (empty gets and counts that found the queue empty); unanswered: attempts that got no answer, not in all",
        |q| q.cost.as_ref().map_or_else(Vec::new, |c| cost_kinds(c).map(|(kind, per_hour, _)| (vec![("kind", kind.into())], per_hour)).into()),
    ),
    fraction(
        "projected_usd_per_month",
        "A 30-day month at the current transaction rate, in US dollars: all, or the idle part; unanswered: at most this much more, if the service billed the attempts that got no answer",
        |q| q.cost.as_ref().map_or_else(Vec::new, |c| cost_kinds(c).map(|(kind, _, usd)| (vec![("kind", kind.into())], usd)).into()),
    ),
];

/// Each decision kind by each outcome of the queue's shadow rule (none without one).
fn shadow_decisions(q: &QueueStatus) -> Series<u64> {
    let Some(shadow) = &q.shadow else { return Vec::new() };
    let mut series = Vec::new();
    for kind in DecisionKind::ALL {
        let counts = shadow.decisions.get(kind.name()).copied().unwrap_or_default();
        for outcome in ShadowOutcome::ALL {
            series.push((vec![("kind", kind.name().into()), ("outcome", outcome.name().into())], counts.get(outcome)));
        }
    }
    series
}

/// Billed transactions by kind (none when the queue is not metered).
fn storage_transactions(q: &QueueStatus) -> Series<u64> {
    let Some(t) = q.transactions else { return Vec::new() };
    [
        ("put", t.puts),
        ("get", t.gets_with_messages),
        ("get_empty", t.gets_empty),
        ("delete", t.deletes),
        ("update", t.updates),
        ("count", t.counts),
        ("create", t.creates),
    ]
    .into_iter()
    .map(|(kind, n)| (vec![("kind", kind.into())], n))
    .collect()
}

/// Attempts that got no answer by kind (none when the queue is not metered).
fn storage_unanswered(q: &QueueStatus) -> Series<u64> {
    let Some(t) = q.transactions else { return Vec::new() };
    CallKind::ALL.into_iter().map(|kind| (vec![("kind", kind.as_str().into())], t.unanswered.of(kind))).collect()
}

/// Registers `metric` in `registry` with the series of every queue of `queues`, each paired
/// with the ebb queue it is a partition of. `logical_queue` is that queue's name (equal to
/// `queue` when unpartitioned), so a partitioned queue can be summed with `sum by (logical_queue)`.
fn register_queue_metric(registry: &mut Registry, metric: &QueueMetric, queues: &[(&str, &QueueStatus)]) {
    let labelled =
        |(logical, q): &(&str, &QueueStatus), labels: Labels| [vec![("queue", q.queue.clone()), ("logical_queue", logical.to_string())], labels].concat();
    match metric.read {
        Read::Gauge(read) => {
            let family = Family::<Labels, Gauge>::default();
            registry.register(metric.name, metric.help, family.clone());
            for (q, (labels, value)) in queues.iter().flat_map(|q| read(q.1).into_iter().map(move |s| (q, s))) {
                family.get_or_create(&labelled(q, labels)).set(value);
            }
        }
        Read::Counter(read) => {
            let family = Family::<Labels, Counter>::default();
            registry.register(metric.name, metric.help, family.clone());
            for (q, (labels, value)) in queues.iter().flat_map(|q| read(q.1).into_iter().map(move |s| (q, s))) {
                family.get_or_create(&labelled(q, labels)).inc_by(value);
            }
        }
        Read::Fraction(read) => {
            let family = Family::<Labels, Gauge<f64, AtomicU64>>::default();
            registry.register(metric.name, metric.help, family.clone());
            for (q, (labels, value)) in queues.iter().flat_map(|q| read(q.1).into_iter().map(move |s| (q, s))) {
                family.get_or_create(&labelled(q, labels)).set(value);
            }
        }
    }
}

/// The host's cost by kind (all, idle, unanswered), and the price the figures use.
fn register_host_cost(registry: &mut Registry, queues: &[QueueStatus], price: f64) {
    let host_rate = Family::<Vec<(&'static str, &'static str)>, Gauge<f64, AtomicU64>>::default();
    registry.register(
        "host_transactions_per_hour",
        "Billed transactions per hour of every queue of the host: all, or idle; unanswered: attempts that got no answer, not in all",
        host_rate.clone(),
    );
    let host_monthly = Family::<Vec<(&'static str, &'static str)>, Gauge<f64, AtomicU64>>::default();
    registry.register(
        "host_projected_usd_per_month",
        "A 30-day month at the host's current transaction rate, in US dollars: all, or the idle part; unanswered: at most this much more",
        host_monthly.clone(),
    );
    let price_gauge = Gauge::<f64, AtomicU64>::default();
    registry.register("price_per_10k_transactions_usd", "The price the cost figures use, US dollars per 10,000 transactions", price_gauge.clone());
    price_gauge.set(price);
    let total = CostStatus::total(queues.iter().filter_map(|q| q.cost.as_ref()), price);
    for (kind, per_hour, usd) in cost_kinds(&total) {
        host_rate.get_or_create(&vec![("kind", kind)]).set(per_hour);
        host_monthly.get_or_create(&vec![("kind", kind)]).set(usd);
    }
}

/// The bus's series, if the host has a bus.
fn register_bus(registry: &mut Registry, api: &Api) {
    let Some(bus) = api.bus.as_ref().map(|b| b.status()) else { return };
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

/// The span export's losses, and the producers' trace context refused (both 0 without an
/// OTLP endpoint).
fn register_telemetry(registry: &mut Registry) {
    registry.register("trace_spans", "Spans finished: each is exported or counted in ebb_trace_spans_dropped_total", crate::telemetry::made_spans());
    registry.register(
        "trace_spans_dropped",
        "Spans not exported: the export queue was full, or the collector refused, failed or did not answer in time",
        crate::telemetry::dropped_spans(),
    );
    registry.register(
        "traceparent_rejected",
        "Malformed traceparent headers refused (the send starts a new trace) and tracestate headers dropped",
        crate::telemetry::traceparent::rejected(),
    );
    registry.register(
        "trace_context_dropped",
        "Trace contexts a message went without (or with its traceparent alone): carrying them put it over its queue's size limit",
        crate::telemetry::uncarried(),
    );
}

pub(super) async fn metrics(State(api): State<Arc<Api>>) -> Response {
    let queues = queue_statuses(&api);
    // `queue_statuses` reads the listeners in this order, one status each.
    let logical = api.listeners.iter().flat_map(|(queue, partitions)| partitions.iter().map(move |_| queue.as_str()));
    let labelled: Vec<(&str, &QueueStatus)> = logical.zip(&queues).collect();
    let mut registry = Registry::with_prefix("ebb");
    for metric in QUEUE_METRICS {
        register_queue_metric(&mut registry, metric, &labelled);
    }
    register_host_cost(&mut registry, &queues, api.host_price());
    register_bus(&mut registry, &api);
    register_telemetry(&mut registry);
    crate::http::storage_metrics::register(&mut registry, api.handles.values().flat_map(|h| h.storage_clients()), queues.iter().map(|q| &q.listener));
    crate::http::storage_metrics::register_claims(&mut registry, api.handles.values().filter_map(|h| h.claim_records()));
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
            queue_prices: Default::default(),
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
            "ebb_failure_rule_retries_total{queue=\"orders\",logical_queue=\"orders\"} 2",
            "ebb_failure_rule_poisons_total{queue=\"orders\",logical_queue=\"orders\"} 1",
            "ebb_failure_rule_defaults_total{queue=\"orders\",logical_queue=\"orders\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        listener.shutdown(Duration::from_secs(1)).await;
    }

    /// Issue 38, item 8: a partitioned queue's partitions were labelled by their storage queue
    /// only, so a dashboard could not sum them into their ebb queue. Each series carries
    /// `logical_queue`: the partitioned queue's name, or `queue` itself when unpartitioned.
    #[tokio::test(start_paused = true)]
    async fn a_partitioned_queues_partitions_carry_its_name_as_logical_queue() {
        let clock = Arc::new(TokioClock::new());
        let listener_of = |name: &str| {
            let queue: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new(name, clock.clone(), 65536));
            let poison: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new(&format!("{name}-poison"), clock.clone(), 65536));
            Listener::builder(queue, poison, Arc::new(FailsWithBody)).build()
        };
        let mut api = Arc::into_inner(api_of(listener_of("plain"))).unwrap();
        api.listeners =
            BTreeMap::from([("orders".to_string(), vec![listener_of("orders-0"), listener_of("orders-1")]), ("plain".to_string(), vec![listener_of("plain")])]);
        let text = scrape(&Arc::new(api)).await;
        for line in [
            "ebb_queue_depth{queue=\"orders-0\",logical_queue=\"orders\"} 0",
            "ebb_queue_depth{queue=\"orders-1\",logical_queue=\"orders\"} 0",
            "ebb_queue_depth{queue=\"plain\",logical_queue=\"plain\"} 0",
            "ebb_messages_processed_total{queue=\"orders-1\",logical_queue=\"orders\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        // Every series of every per-queue metric (the storage failure series, which also count
        // poison queues, are the host's and not among them).
        let per_queue = |line: &&str| {
            QUEUE_METRICS.iter().any(|m| [format!("ebb_{}{{", m.name), format!("ebb_{}_total{{", m.name)].iter().any(|p| line.starts_with(p.as_str())))
        };
        let partitions: Vec<&str> = text.lines().filter(per_queue).filter(|l| l.contains("{queue=\"orders-")).collect();
        assert!(partitions.len() > 20 && partitions.iter().all(|l| l.contains(",logical_queue=\"orders\"")), "{text}");
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
            "ebb_storage_transactions_total{queue=\"orders\",logical_queue=\"orders\",kind=\"put\"} 2",
            "ebb_storage_unanswered_total{queue=\"orders\",logical_queue=\"orders\",kind=\"put\"} 2",
            "ebb_storage_unanswered_total{queue=\"orders\",logical_queue=\"orders\",kind=\"get\"} 0",
            // Two of each in (at least) a minute.
            "ebb_transactions_per_hour{queue=\"orders\",logical_queue=\"orders\",kind=\"all\"} 120.0",
            "ebb_transactions_per_hour{queue=\"orders\",logical_queue=\"orders\",kind=\"unanswered\"} 120.0",
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
