//! The KEDA scaler over a service, whatever the host's role. On a worker (`ebb run` with
//! `[scaler] listen`) a queue's state comes from its listeners; on a watcher (`ebb
//! scaler`, for the pattern where KEDA scales the workers to zero) each storage queue is
//! counted every `[scaler] poll_interval` (one billed count on Azure; a free read on the
//! embedded store), and a count above zero is work detected. On both, a send or a
//! notification through the host's queue handles (the API, a bus trigger) is work
//! detected at once.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use super::{Counted, Scaler, ScalerQueue, Source};
use crate::config::ScalerSettings;
use crate::names::RuleSlot;
use crate::rules::{BuiltInRule, Decider};
use crate::service::{Role, Service};

/// KEDA's external scaler, serving.
pub struct RunningScaler {
    addr: std::net::SocketAddr,
    scaler: Arc<Scaler>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl RunningScaler {
    /// Where it listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Stops serving, counting and forwarding, without waiting (a dropped host).
    pub fn stop_now(&self) {
        self.stop.cancel();
        self.tasks.close();
        self.scaler.stop_now();
    }

    /// Stops serving, counting and forwarding, and waits for all of it.
    pub async fn stop(self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        self.scaler.stop().await;
    }
}

/// Starts the scaler for `service`'s queues on `tcp` (already bound).
pub fn start(service: &Service, settings: &ScalerSettings, call_deadline: std::time::Duration, tcp: TcpListener) -> anyhow::Result<RunningScaler> {
    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();
    let mut queues = Vec::new();
    let mut counted = Vec::new();
    for (name, queue) in service.queues() {
        let source = match service.role() {
            Role::Worker => Source::Listeners(queue.handle.listeners().to_vec()),
            Role::Watcher => {
                let partitions = Arc::new(Counted::new(queue.stack.partitions.iter().map(|p| p.client.clone()).collect()));
                counted.push((name.clone(), partitions.clone()));
                Source::Counted(partitions)
            }
        };
        let rules: Arc<dyn Decider> = match service.rules().queue(&RuleSlot::scaler(&queue.config.name)) {
            Some(rules) => Arc::new(rules),
            None => Arc::new(BuiltInRule),
        };
        queues.push(ScalerQueue::new(&queue.config, source, rules, settings, call_deadline).with_pause(queue.handle.pause_changes()));
    }
    let scaler = Scaler::new(queues, settings.token.clone());
    for (name, queue) in service.queues() {
        scaler.forward_events(name, queue.handle.work_events());
    }
    for (name, partitions) in counted {
        let Some(queue) = scaler.queue(&name).cloned() else { continue };
        let (stop, interval) = (stop.clone(), settings.poll_interval);
        let span = tracing::info_span!("scaler_count", queue = %name);
        tasks.spawn(
            async move {
                let mut tick = tokio::time::interval(interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        () = stop.cancelled() => return,
                    }
                    if partitions.count().await > 0 {
                        queue.note_work();
                    }
                }
            }
            .instrument(span),
        );
    }
    let addr = tcp.local_addr()?;
    let (serving, serve_stop) = (scaler.clone(), stop.clone());
    tasks.spawn(async move {
        if let Err(error) = super::serve(tcp, serving, serve_stop).await {
            tracing::error!("{error:#}");
        }
    });
    match service.role() {
        Role::Worker => tracing::info!(%addr, "KEDA external scaler listening"),
        Role::Watcher => tracing::info!(scaler_addr = %addr, "scaler listening (scaler-only: no message is processed)"),
    }
    Ok(RunningScaler { addr, scaler, stop, tasks })
}
