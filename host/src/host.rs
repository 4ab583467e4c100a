//! A running host: its service, its API and, when configured, KEDA's external scaler.
//! Starts in order: the ports are bound first (a bind failure starts no work), then the API
//! (its probes answer at once, whatever storage does), then the service's work, then the
//! scaler; stops everything it started, and waits for it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::handler::Handler;
use crate::http::Api;
use crate::listener::ListenerStatus;
use crate::scaler::RunningScaler;
use crate::service::{Handlers, QueueHandle, Role, Service};

/// A started host.
///
/// [`Host::shutdown`]`.await` is the graceful stop: in-flight messages drain for
/// `drain_timeout`, what is left is released and announced, and every task is waited for,
/// within `drain_timeout` + 1 s (then it stops at once, as a drop does).
/// Dropping a host instead is the abrupt stop: it stops taking messages, releases what its
/// handlers hold (their futures are dropped mid-call), stops its API and scaler, and returns
/// at once; its tasks end, and release the store in `data_dir`, soon after (a new host on the
/// same `data_dir` may need to retry its start for a moment).
pub struct Host {
    /// Taken by [`Host::shutdown`]; present until then.
    service: Option<Service>,
    drain_timeout: Duration,
    api_addr: SocketAddr,
    api_stop: CancellationToken,
    api_task: Option<tokio::task::JoinHandle<()>>,
    scaler: Option<RunningScaler>,
}

/// How much longer than `drain_timeout` [`Host::shutdown`] may take (releasing what is left in
/// flight, the half second the API gives the requests still open when it stops) before it
/// stops what is left at once: storage that does not answer a release, a handler that never
/// returns, a rule still compiling. `ebb run` exits at the same bound.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// A host to start, with the Rust handlers of the program embedding it (see the crate docs).
pub struct HostBuilder<'a> {
    config: &'a Config,
    handlers: Handlers,
    /// A queue given a second handler: refused at start, not silently replaced.
    given_twice: Option<String>,
}

impl HostBuilder<'_> {
    /// Messages of `queue` go to `handler` instead of its `handler.url` (which may then be
    /// left out of the configuration).
    pub fn handler(mut self, queue: &str, handler: impl Handler) -> Self {
        if self.handlers.insert(queue.to_string(), Arc::new(handler)).is_some() {
            self.given_twice.get_or_insert_with(|| queue.to_string());
        }
        self
    }

    /// Starts a worker: see [`Host::start`]. Fails when a queue has neither a handler URL nor
    /// a Rust handler, a Rust handler names a queue the configuration does not have, or a
    /// queue was given two.
    pub async fn start(self) -> Result<Host> {
        if let Some(queue) = self.given_twice {
            anyhow::bail!("two Rust handlers are given for queue {queue}; give each queue one");
        }
        Host::start_with(self.config, Role::Worker, &self.handlers).await
    }
}

impl Host {
    /// A worker host for `config` whose queues may have Rust handlers.
    pub fn builder(config: &Config) -> HostBuilder<'_> {
        HostBuilder { config, handlers: Handlers::new(), given_twice: None }
    }

    /// Opens the service for `role`, binds the API (and the scaler, when `[scaler] listen`
    /// is set; a watcher needs it), starts the work, then serves them. Every queue's
    /// messages are posted to its `handler.url`.
    pub async fn start(config: &Config, role: Role) -> Result<Host> {
        Host::start_with(config, role, &Handlers::new()).await
    }

    async fn start_with(config: &Config, role: Role, handlers: &Handlers) -> Result<Host> {
        if role == Role::Watcher && config.scaler.is_none() {
            anyhow::bail!("scaler.listen: not set; `ebb scaler` serves KEDA's external scaler and needs an address");
        }
        let service = Service::open(config, role, handlers).await?;
        let api_tcp = crate::http::bind(config.listen).with_context(|| format!("api.listen: failed to listen on {}", config.listen))?;
        let scaler_tcp = match &config.scaler {
            Some(settings) => {
                Some(tokio::net::TcpListener::bind(settings.listen).await.with_context(|| format!("scaler.listen: failed to listen on {}", settings.listen))?)
            }
            None => None,
        };
        let api_addr = api_tcp.local_addr()?;
        let api = Arc::new(Api {
            listeners: service.listeners(),
            handles: service.handles(),
            tokens: config.tokens.clone(),
            health: service.health().clone(),
            readiness: service.readiness().clone(),
            bus: service.bus().cloned(),
            audit: Some(Arc::new(crate::service::AuditLog::new(&config.data_dir))),
            price_per_10k_transactions: config.price_per_10k_transactions,
            queue_prices: Api::queue_prices_of(config),
        });
        let (api_stop, started) = (CancellationToken::new(), CancellationToken::new());
        if let Some(log) = &api.audit {
            for (name, handle) in &api.handles {
                let now_ms = || crate::queue::Clock::now_ms(&crate::queue::SystemClock);
                tokio::spawn(crate::service::record_timed_resumes(log.clone(), name.clone(), handle.pause_changes(), now_ms, api_stop.clone()));
            }
        }
        let (stop, opened) = (api_stop.clone(), started.clone());
        // The API takes the largest message as its largest body.
        let limits = crate::config::ApiLimits { max_body_bytes: config.max_message_bytes, ..config.api_limits };
        // Served before the work starts, so the probes answer whatever storage does; the
        // other requests wait for the start (bounded by START_ATTEMPT_TIMEOUT), so the
        // first sends find the queues created.
        // Logged before the work starts: a probe may be answered (and the host stopped) before
        // the queues are created (api::the_log_filter_is_read_from_rust_log_and_ebb_log_wins).
        tracing::info!(%api_addr, "API listening");
        let api_task = tokio::spawn(async move {
            if let Err(error) = crate::http::serve_once_started(api_tcp, api, stop, limits, opened).await {
                tracing::error!("API server failed: {error}");
            }
        });
        // The ports are ours: now the work may start. A queue whose storage does not answer
        // (within START_ATTEMPT_TIMEOUT) is retried in the background (not ready).
        if let Err(error) = service.start_work().await {
            api_stop.cancel();
            let _ = api_task.await;
            service.shutdown().await;
            return Err(error);
        }
        started.cancel();
        let scaler = match (scaler_tcp, &config.scaler) {
            (Some(tcp), Some(settings)) => Some(crate::scaler::start(&service, settings, config.rule_limits.call_deadline, tcp)?),
            _ => None,
        };
        Ok(Host { service: Some(service), drain_timeout: config.drain_timeout, api_addr, api_stop, api_task: Some(api_task), scaler })
    }

    /// Where the API listens.
    pub fn api_addr(&self) -> SocketAddr {
        self.api_addr
    }

    /// Where KEDA's external scaler listens, when `[scaler] listen` is set.
    pub fn scaler_addr(&self) -> Option<SocketAddr> {
        self.scaler.as_ref().map(RunningScaler::addr)
    }

    /// The handle of queue `name` (send a message through it), if the host has that queue.
    pub fn queue(&self, name: &str) -> Option<QueueHandle> {
        self.service().handles().remove(name)
    }

    /// Every storage queue's state.
    pub fn status(&self) -> Vec<ListenerStatus> {
        self.service().status()
    }

    /// A queue's approximate depth now, without a billed call (see [`Service::depth`]).
    pub async fn depth(&self, queue: &str) -> Result<u64> {
        self.service().depth(queue).await
    }

    /// The rules of every queue: each slot's status (file, decisions, faults, quarantine),
    /// and the threads that load them.
    pub fn rules(&self) -> Arc<crate::rules::RuleSet> {
        self.service().rules().clone()
    }

    fn service(&self) -> &Service {
        self.service.as_ref().expect("the service is present until shutdown")
    }

    /// Drains the work (see [`Service::shutdown`]), then stops the API and the scaler, and
    /// waits for every task. The graceful stop; dropping the host is the abrupt one.
    ///
    /// Bounded: it returns within `drain_timeout` + 1 s whatever storage or a
    /// handler does. What is not done by then is stopped as a drop stops it: handlers'
    /// futures dropped, their messages released if storage answers (otherwise visible again
    /// when their lease runs out), tasks left to end on their own, with a warning.
    pub async fn shutdown(mut self) {
        let bound = self.drain_timeout + SHUTDOWN_GRACE;
        if tokio::time::timeout(bound, self.stop_gracefully()).await.is_ok() {
            self.service = None;
            return;
        }
        tracing::warn!(
            "shutdown not finished {} after it began: stopping at once; messages still leased come back when their lease runs out",
            humantime::format_duration(bound)
        );
        if let Some(service) = self.service.take() {
            service.stop_now();
        }
        // The rest (the API, the scaler) is stopped by the drop.
    }

    /// The graceful stop, unbounded; the service stays in place for a stop at once.
    async fn stop_gracefully(&mut self) {
        if let Some(service) = &self.service {
            service.shutdown().await;
        }
        self.api_stop.cancel();
        if let Some(api_task) = self.api_task.as_mut() {
            let _ = api_task.await;
        }
        if let Some(scaler) = self.scaler.take() {
            scaler.stop().await;
        }
    }
}

/// The abrupt stop (see [`Host`]): everything is told to stop, nothing is waited for.
impl Drop for Host {
    fn drop(&mut self) {
        if let Some(service) = &self.service {
            tracing::warn!("host dropped without shutdown: stopping at once, releasing messages in flight");
            service.stop_now();
        }
        self.api_stop.cancel();
        if let Some(scaler) = &self.scaler {
            scaler.stop_now();
        }
    }
}
