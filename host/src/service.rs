//! A running host: the store, the rules and their watcher, one listener per queue, the API.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio_util::sync::CancellationToken;

use crate::bus::Bus;
use crate::config::{Backend, BusConfig, Config};
use crate::handler::HttpHandler;
use crate::health::Health;
use crate::http::{Api, ApiLimits};
use crate::listener::QueueSettings;
use crate::listener::{Listener, ListenerStatus};
use crate::queue::azure::{AzureOptions, AzureQueue};
use crate::queue::embedded::{EmbeddedOptions, EmbeddedStore};
use crate::queue::partitioned::Partitioned;
use crate::queue::{Metered, QueueClient, RetryPolicy, Retrying, SystemClock};
use crate::rules::{QueueRuleConfig, RuleEngine, RuleSet, RuleWatcher};

/// Debounce of rule file events.
pub(crate) const RULE_DEBOUNCE: Duration = Duration::from_millis(30);

/// Queue `name` of a backend, undecorated (`store`: the open embedded store, needed only
/// by the embedded backend).
pub fn storage_queue(backend: &Backend, store: Option<&EmbeddedStore>, name: &str) -> Result<Arc<dyn QueueClient>> {
    Ok(match backend {
        Backend::Embedded => Arc::new(store.context("the embedded store is not open")?.queue(name)),
        Backend::Azure { account, encoding } => {
            let options = AzureOptions { encoding: *encoding, ..AzureOptions::default() };
            Arc::new(AzureQueue::new(account, name, options).with_context(|| format!("queue {name} on Azure account {}", account.name()))?)
        }
    })
}

/// What every host mode opens first: its health, the embedded store, the rules folder
/// (created if missing) and the rule engine with its compiled-rule cache.
pub(crate) struct HostParts {
    pub health: Health,
    pub store: EmbeddedStore,
    pub rules_dir: std::path::PathBuf,
    pub engine: Arc<RuleEngine>,
}

impl HostParts {
    pub fn open(config: &Config) -> Result<HostParts> {
        let health = Health::default();
        let options = EmbeddedOptions { max_message_bytes: config.max_message_bytes, clock: Arc::new(SystemClock), health: health.clone() };
        let store = EmbeddedStore::open(&config.data_dir, options)?;
        std::fs::create_dir_all(&config.rules_dir).with_context(|| format!("failed to create rules folder {}", config.rules_dir.display()))?;
        let rules_dir = config.rules_dir.canonicalize()?;
        let engine = RuleEngine::new(config.rule_limits.clone(), Some(config.data_dir.join("rule-cache")))?;
        Ok(HostParts { health, store, rules_dir, engine })
    }
}

/// A started host.
pub struct Service {
    listeners: Vec<Listener>,
    api_addr: SocketAddr,
    api_stop: CancellationToken,
    api_task: tokio::task::JoinHandle<()>,
    scaler: Option<RunningScaler>,
    drain_timeout: Duration,
    _watcher: RuleWatcher,
    /// The rule set: the listeners hold only their queues' handles and the watcher only a
    /// weak reference, so without this the set (and every rule swap) would be gone.
    _rules: Arc<RuleSet>,
    store: EmbeddedStore,
    bus: Option<Arc<Bus>>,
}

/// Subscribes to every queue's channel: a trigger wakes the queue's listeners (each
/// partition's); the bus's state tells them whether pushes can arrive.
fn start_bus(config: &BusConfig, listeners: &BTreeMap<String, Vec<Listener>>) -> Result<Bus> {
    let engine = config.engine()?;
    let by_queue = listeners.clone();
    let deliver: crate::bus::Deliver = Arc::new(move |trigger| {
        tracing::debug!(queue = %trigger.queue, count = ?trigger.count, "push notification");
        for listener in by_queue.get(&trigger.queue).into_iter().flatten() {
            listener.work_detected();
        }
    });
    let all: Vec<Listener> = listeners.values().flatten().cloned().collect();
    let available: crate::bus::Availability = Arc::new(move |available| all.iter().for_each(|l| l.set_push_available(available)));
    Ok(Bus::start(engine, &config.channel_prefix, listeners.keys().cloned().collect(), deliver, available))
}

impl Service {
    /// Opens the store, loads and watches the rules, starts every listener and the API.
    pub async fn start(config: &Config) -> Result<Service> {
        let HostParts { health, store, rules_dir, engine } = HostParts::open(config)?;
        // One rule slot per storage queue: each partition decides on its own state (queues
        // with the same file and parameters share one instance).
        // With the KEDA scaler on, one more slot per logical queue, where the scaler decides
        // for the whole queue (same file and parameters: it shares the listeners' instance).
        let scaler_on = config.scaler.is_some();
        let queue_rules = config.queues.iter().flat_map(|q| {
            let rule = q.rule.rule.as_ref().and_then(|p| p.file_name()).map(|name| rules_dir.join(name));
            let scaler_slot = scaler_on.then(|| crate::scaler::rule_slot(&q.name));
            q.storage_queues().into_iter().chain(scaler_slot).map(move |queue| QueueRuleConfig { queue, rule: rule.clone(), params: q.rule.params.clone() })
        });
        let rules = Arc::new(RuleSet::new(engine, queue_rules));
        rules.load_all_in_background();
        let watcher = rules.watch(&rules_dir, RULE_DEBOUNCE)?;

        let mut listeners: BTreeMap<String, Vec<Listener>> = BTreeMap::new();
        let mut queues: BTreeMap<String, Arc<dyn QueueClient>> = BTreeMap::new();
        for queue_config in &config.queues {
            let poison: Arc<dyn QueueClient> =
                Arc::new(Retrying::new(storage_queue(&queue_config.backend, Some(&store), &queue_config.poison_queue())?, RetryPolicy::default()));
            poison.create_if_missing().await.with_context(|| format!("failed to create queue {}", queue_config.poison_queue()))?;
            let handler = Arc::new(HttpHandler::new(queue_config.handler_url.clone(), queue_config.handler_timeout)?);
            let mut partitions = Vec::new();
            for name in queue_config.storage_queues() {
                let metered = Metered::new(storage_queue(&queue_config.backend, Some(&store), &name)?);
                let transactions = metered.transactions();
                let queue: Arc<dyn QueueClient> = Arc::new(Retrying::new(metered, RetryPolicy::default()));
                queue.create_if_missing().await.with_context(|| format!("failed to create queue {name}"))?;
                let queue_rules = rules.queue(&name).with_context(|| format!("queue {name} has no rule slot"))?;
                let listener = Listener::builder(queue.clone(), poison.clone(), handler.clone())
                    .rules(queue_rules)
                    .settings(QueueSettings { poison_envelope: matches!(queue_config.backend, Backend::Embedded), ..queue_config.settings.clone() })
                    .transactions(transactions)
                    .build();
                if config.bus.is_some() {
                    // Until the bus is subscribed, other hosts' pushes cannot arrive: poll.
                    listener.set_push_available(false);
                }
                listener.start();
                tracing::info!(queue = %name, handler = %crate::handler::masked(&queue_config.handler_url), "listening");
                listeners.entry(queue_config.name.clone()).or_default().push(listener);
                partitions.push(queue);
            }
            let logical = if partitions.len() == 1 { partitions.remove(0) } else { Arc::new(Partitioned::new(&queue_config.name, partitions)) };
            queues.insert(queue_config.name.clone(), logical);
        }

        let bus = match &config.bus {
            Some(bus) => Some(Arc::new(start_bus(bus, &listeners)?)),
            None => None,
        };
        let scaler = match &config.scaler {
            Some(settings) => Some(start_scaler(config, settings, &listeners, &rules).await?),
            None => None,
        };
        let api = Arc::new(Api {
            listeners: listeners.clone(),
            queues,
            token: config.token.clone(),
            health,
            bus: bus.clone(),
            price_per_10k_transactions: config.price_per_10k_transactions,
        });
        let tcp = tokio::net::TcpListener::bind(config.listen).await.with_context(|| format!("failed to listen on {}", config.listen))?;
        let api_addr = tcp.local_addr()?;
        let api_stop = CancellationToken::new();
        let stop = api_stop.clone();
        // The API takes the largest message as its largest body.
        let limits = ApiLimits { max_body_bytes: config.max_message_bytes, ..config.api_limits };
        let api_task = tokio::spawn(async move {
            if let Err(error) = crate::http::serve(tcp, api, stop, limits).await {
                tracing::error!("API server failed: {error}");
            }
        });
        tracing::info!(%api_addr, "API listening");
        let listeners = listeners.into_values().flatten().collect();
        Ok(Service { listeners, api_addr, api_stop, api_task, scaler, drain_timeout: config.drain_timeout, _watcher: watcher, _rules: rules, store, bus })
    }

    /// Where the API listens.
    pub fn api_addr(&self) -> SocketAddr {
        self.api_addr
    }

    /// Where KEDA's external scaler listens, when `[scaler] listen` is set.
    pub fn scaler_addr(&self) -> Option<SocketAddr> {
        self.scaler.as_ref().map(|s| s.addr)
    }

    /// Every queue's state.
    pub fn status(&self) -> Vec<ListenerStatus> {
        self.listeners.iter().map(Listener::status).collect()
    }

    /// A queue's approximate depth now, read without counting a storage transaction
    /// (for displays; the listener's own counts are metered).
    pub async fn depth(&self, queue: &str) -> Result<u64> {
        use crate::queue::QueueClient as _;
        Ok(self.store.queue(queue).approximate_count().await?)
    }

    /// Stops dequeuing, drains in-flight messages (releasing what outlasts the drain
    /// timeout), stops the API and closes the store.
    pub async fn shutdown(self) {
        let drain = self.drain_timeout;
        futures::future::join_all(self.listeners.iter().map(|l| l.shutdown(drain))).await;
        self.api_stop.cancel();
        let _ = self.api_task.await;
        if let Some(bus) = &self.bus {
            bus.stop();
        }
        if let Some(scaler) = self.scaler {
            scaler.stop.cancel();
            let _ = scaler.task.await;
            scaler.scaler.stop().await;
        }
    }
}

/// KEDA's external scaler, serving.
struct RunningScaler {
    addr: SocketAddr,
    scaler: Arc<crate::scaler::Scaler>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Starts KEDA's external scaler over the listeners (by logical queue).
async fn start_scaler(
    config: &Config,
    settings: &crate::scaler::ScalerSettings,
    listeners: &BTreeMap<String, Vec<Listener>>,
    rules: &RuleSet,
) -> Result<RunningScaler> {
    use crate::scaler::{Scaler, ScalerQueue, Source, rule_slot};
    let queues = config
        .queues
        .iter()
        .map(|q| {
            let source = Source::Listeners(listeners.get(&q.name).cloned().unwrap_or_default());
            ScalerQueue::new(q, source, rules.queue(&rule_slot(&q.name)), settings, config.rule_limits.call_deadline)
        })
        .collect();
    let scaler = Scaler::new(queues, settings.token.clone());
    let tcp = tokio::net::TcpListener::bind(settings.listen).await.with_context(|| format!("scaler.listen: failed to listen on {}", settings.listen))?;
    let addr = tcp.local_addr()?;
    let stop = CancellationToken::new();
    let (serving, serve_stop) = (scaler.clone(), stop.clone());
    let task = tokio::spawn(async move {
        if let Err(error) = crate::scaler::serve(tcp, serving, serve_stop).await {
            tracing::error!("{error:#}");
        }
    });
    tracing::info!(%addr, "KEDA external scaler listening");
    Ok(RunningScaler { addr, scaler, stop, task })
}
