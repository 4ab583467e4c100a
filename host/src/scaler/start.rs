//! The KEDA scaler over a service, whatever the host's role. On a worker (`ebb run` with
//! `[scaler] listen`) a queue's state comes from its listeners; on a watcher (`ebb
//! scaler`, for the pattern where KEDA scales the workers to zero) each storage queue is
//! counted every `[scaler] poll_interval` (one billed count on Azure; a free read on the
//! embedded store), and a count above zero is work detected. On both, a send or a
//! notification through the host's queue handles (the API, a bus trigger) is work
//! detected at once. With a bus, the watcher also publishes a wake-up for a push queue
//! whose count shows messages no worker was told of (see [`super::wake`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use super::wake::WakePolicy;
use super::{Counted, Scaler, ScalerQueue, Source};
use crate::bus::Bus;
use crate::config::ScalerSettings;
use crate::names::DecisionSite;
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
                // A push queue's workers may idle at zero tasks: the count wakes them.
                let heard = service.bus().filter(|_| queue.config.settings.push_enabled).map(|bus| (bus.clone(), queue.handle.work_events()));
                counted.push((name.clone(), partitions.clone(), heard));
                Source::Counted(partitions)
            }
        };
        let rules: Arc<dyn Decider> = match service.rules().queue(&DecisionSite::scaler(&queue.config.name)) {
            Some(rules) => Arc::new(rules),
            None => Arc::new(BuiltInRule),
        };
        queues.push(ScalerQueue::new(&queue.config, source, rules, settings, call_deadline).with_pause(queue.handle.pause_changes()));
    }
    let scaler = Scaler::new(queues, settings.token.clone());
    for (name, queue) in service.queues() {
        scaler.forward_events(name, queue.handle.work_events());
    }
    for (name, partitions, heard) in counted {
        let Some(queue) = scaler.queue(&name).cloned() else { continue };
        let wake = heard.map(|(bus, heard)| Wake { bus, heard, echo: None, policy: WakePolicy::default() });
        let span = tracing::info_span!("scaler_count", queue = %name);
        tasks.spawn(count_forever(queue, partitions, wake, settings.poll_interval, stop.clone()).instrument(span));
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

/// Counts `partitions` every `interval` until `stop`: a count above zero is work detected,
/// and `wake` (a push queue, with a bus) may publish a wake-up.
async fn count_forever(queue: Arc<ScalerQueue>, partitions: Arc<Counted>, mut wake: Option<Wake>, interval: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        let depth = partitions.count().await;
        if depth > 0 {
            queue.note_work();
        }
        if let Some(wake) = &mut wake {
            wake.after_count(&queue, depth);
        }
    }
}

/// A push queue's wake-ups, on `ebb scaler`.
struct Wake {
    bus: Arc<Bus>,
    /// The queue handle's events: sends and notifications through this host, and every
    /// trigger the bus delivers for the queue (anyone's, this scaler's own included).
    heard: tokio::sync::watch::Receiver<u64>,
    /// The event count the echo of this scaler's last wake-up would bring: that event is not
    /// news that someone else told the workers.
    echo: Option<u64>,
    policy: WakePolicy,
}

impl Wake {
    fn after_count(&mut self, queue: &ScalerQueue, depth: u64) {
        let now = tokio::time::Instant::now();
        if self.heard.has_changed().unwrap_or(false) {
            let events = *self.heard.borrow_and_update();
            if self.echo.take() != Some(events) {
                self.policy.heard(now);
            }
        }
        if queue.is_paused() || !self.policy.after_count(depth, now) {
            return;
        }
        tracing::debug!(depth, "the count shows messages no worker was told of: publishing a wake-up");
        self.echo = Some(self.heard.borrow().wrapping_add(1));
        self.bus.publish(queue.name(), None, Duration::ZERO);
    }
}
