//! `ebb scaler`: the scaler without processing, for the pattern where KEDA scales the
//! workers to zero and something must still see work arrive (see `docs/kubernetes.md`).
//!
//! It opens no dequeue task and calls no handler. Each storage queue is counted every
//! `[scaler] poll_interval` (one billed count on Azure; a free read on the embedded store);
//! a count above zero is work detected. The HTTP API runs too: a send or a notification
//! through it (`POST /queues/{name}/messages`, `/notify`) is work detected at once. Its
//! listeners are never started: they only carry those events, and `/status` shows them
//! with no task running.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use super::{Counted, Scaler, ScalerQueue, Source, rule_slot};
use crate::config::Config;
use crate::handler::HttpHandler;
use crate::http::{Api, ApiLimits};
use crate::listener::Listener;
use crate::queue::{QueueClient, RetryPolicy, Retrying};
use crate::rules::{QueueRuleConfig, RuleSet};
use crate::service::storage_queue;

/// Runs `ebb scaler` until `shutdown` completes.
pub async fn run_scaler_only(config: &Config, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let settings = config.scaler.clone().context("scaler.listen: not set; `ebb scaler` serves KEDA's external scaler and needs an address")?;
    let crate::service::HostParts { health, store, rules_dir, engine } = crate::service::HostParts::open(config)?;
    let slots = config.queues.iter().map(|q| {
        let rule = q.rule.rule.as_ref().and_then(|p| p.file_name()).map(|name| rules_dir.join(name));
        QueueRuleConfig { queue: rule_slot(&q.name), rule, params: q.rule.params.clone() }
    });
    let rules = Arc::new(RuleSet::new(engine, slots));
    rules.load_all_in_background();
    let _watcher = rules.watch(&rules_dir, crate::service::RULE_DEBOUNCE)?;

    let stop = CancellationToken::new();
    let counters = TaskTracker::new();
    let mut queues = Vec::new();
    let mut logical: BTreeMap<String, Arc<dyn QueueClient>> = BTreeMap::new();
    let mut idle_listeners: BTreeMap<String, Vec<Listener>> = BTreeMap::new();
    let mut watched = Vec::new();
    for queue_config in &config.queues {
        let poison: Arc<dyn QueueClient> =
            Arc::new(Retrying::new(storage_queue(&queue_config.backend, Some(&store), &queue_config.poison_queue())?, RetryPolicy::default()));
        let handler = Arc::new(HttpHandler::new(queue_config.handler_url.clone(), queue_config.handler_timeout)?);
        let mut partitions: Vec<Arc<dyn QueueClient>> = Vec::new();
        for name in queue_config.storage_queues() {
            let queue: Arc<dyn QueueClient> = Arc::new(Retrying::new(storage_queue(&queue_config.backend, Some(&store), &name)?, RetryPolicy::default()));
            queue.create_if_missing().await.with_context(|| format!("failed to create queue {name}"))?;
            // Never started: no dequeue task, no handler call.
            let listener = Listener::builder(queue.clone(), poison.clone(), handler.clone()).settings(queue_config.settings.clone()).build();
            idle_listeners.entry(queue_config.name.clone()).or_default().push(listener);
            partitions.push(queue);
        }
        let sender: Arc<dyn QueueClient> = if partitions.len() == 1 {
            partitions[0].clone()
        } else {
            Arc::new(crate::queue::partitioned::Partitioned::new(&queue_config.name, partitions.clone()))
        };
        logical.insert(queue_config.name.clone(), sender);
        let counted = Arc::new(Counted::new(partitions));
        let scaler_queue = ScalerQueue::new(
            queue_config,
            Source::Counted(counted.clone()),
            rules.queue(&rule_slot(&queue_config.name)),
            &settings,
            config.rule_limits.call_deadline,
        );
        watched.push(counted);
        queues.push(scaler_queue);
    }
    let scaler = Scaler::new(queues, settings.token.clone());
    for (name, listeners) in &idle_listeners {
        for listener in listeners {
            scaler.forward_work(name, listener);
        }
    }
    for counted in watched {
        let name = counted.partitions.first().map(|p| p.name().to_string()).unwrap_or_default();
        let queue = scaler.queues.values().find(|q| match &q.source {
            Source::Counted(c) => Arc::ptr_eq(c, &counted),
            Source::Listeners(_) => false,
        });
        let Some(queue) = queue.cloned() else { continue };
        let (stop, interval) = (stop.clone(), settings.poll_interval);
        let span = tracing::info_span!("scaler_count", queue = %queue.name());
        counters.spawn(
            async move {
                let mut tick = tokio::time::interval(interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        () = stop.cancelled() => return,
                    }
                    if counted.count().await > 0 {
                        queue.note_work();
                    }
                }
            }
            .instrument(span),
        );
        tracing::debug!(queue = %name, "counting");
    }

    let tcp = tokio::net::TcpListener::bind(settings.listen).await.with_context(|| format!("scaler.listen: failed to listen on {}", settings.listen))?;
    tracing::info!(scaler_addr = %tcp.local_addr()?, "scaler listening (scaler-only: no message is processed)");
    let server = tokio::spawn(super::serve(tcp, scaler.clone(), stop.clone()));

    let api = Arc::new(Api {
        listeners: idle_listeners,
        queues: logical,
        token: config.token.clone(),
        health,
        bus: None,
        price_per_10k_transactions: config.price_per_10k_transactions,
    });
    let api_tcp = tokio::net::TcpListener::bind(config.listen).await.with_context(|| format!("failed to listen on {}", config.listen))?;
    tracing::info!(api_addr = %api_tcp.local_addr()?, "API listening");
    let limits = ApiLimits { max_body_bytes: config.max_message_bytes, ..config.api_limits };
    let api_task = tokio::spawn(crate::http::serve(api_tcp, api, stop.clone(), limits));

    shutdown.await;
    stop.cancel();
    counters.close();
    counters.wait().await;
    scaler.stop().await;
    if let Ok(Err(error)) = server.await {
        tracing::error!("{error:#}");
    }
    let _ = api_task.await;
    drop(store);
    Ok(())
}
