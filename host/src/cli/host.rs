//! `ebb run` and `ebb check`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};

use crate::config::{Backend, Config};
use crate::host::Host;
use crate::names::RuleSlot;
use crate::queue::{MessageId, PopReceipt, QueueClient, QueueError, RetryPolicy};
use crate::rules::{RuleEngine, RuleSet};
use crate::service::{QueueStack, Role, StackOptions, storage_queue};

pub async fn run(config_path: &Path) -> Result<()> {
    let config = Config::load(config_path)?;
    // `ebb check` refuses this; a running host only says so: a shadow never touches the live
    // path, so it is no reason to stop processing (it would only ever agree).
    for problem in config.queues.iter().filter_map(|queue| shadow_is_the_rule(queue, &config.rules_dir)) {
        tracing::warn!("{problem:#}");
    }
    // Listening before the API answers: a signal that arrives once it does is a shutdown.
    let mut signals = Signals::listen()?;
    let Some(host) = start_unless_signalled(&config, Role::Worker, &mut signals).await? else {
        return Ok(());
    };
    signals.next().await;
    tracing::info!(drain_timeout = ?config.drain_timeout, "shutting down: draining in-flight messages (a second signal exits at once)");
    tokio::spawn(async move {
        signals.next().await;
        eprintln!("second signal: exiting now; messages in flight come back when their lease runs out");
        std::process::exit(130);
    });
    shutdown_within_bound(host, config.drain_timeout).await;
    tracing::info!("stopped");
    Ok(())
}

/// `ebb scaler`: KEDA's external scaler without processing, until SIGINT or SIGTERM.
pub async fn scaler(config_path: &Path) -> Result<()> {
    let config = Config::load(config_path)?;
    let mut signals = Signals::listen()?;
    let Some(host) = start_unless_signalled(&config, Role::Watcher, &mut signals).await? else {
        return Ok(());
    };
    signals.next().await;
    shutdown_within_bound(host, config.drain_timeout).await;
    tracing::info!("stopped");
    Ok(())
}

/// How much longer than `drain_timeout` a shutdown may take (the release of what is left in
/// flight, the half second the API gives the requests still open when it stops) before the
/// process exits regardless.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Starts the host; `None` when a signal came first (a start waits for storage up to
/// [`START_ATTEMPT_TIMEOUT`](crate::service::START_ATTEMPT_TIMEOUT)): nothing was taken
/// from a queue yet that a stop would have to drain.
async fn start_unless_signalled(config: &Config, role: Role, signals: &mut Signals) -> Result<Option<Host>> {
    tokio::select! {
        host = Host::start(config, role) => Ok(Some(host?)),
        () = signals.next() => {
            tracing::info!("signal during start-up: stopping");
            Ok(None)
        }
    }
}

/// The graceful stop, within `drain_timeout` + [`SHUTDOWN_GRACE`]: past that (storage that
/// does not answer a release, a rule still compiling) the process exits, and what is still
/// leased comes back when its lease runs out.
async fn shutdown_within_bound(host: Host, drain_timeout: Duration) {
    let bound = drain_timeout + SHUTDOWN_GRACE;
    if tokio::time::timeout(bound, host.shutdown()).await.is_err() {
        tracing::warn!(
            "shutdown not finished {} after the signal: exiting now; messages still leased come back when their lease runs out",
            humantime::format_duration(bound)
        );
        // Not through the runtime's drop, which would wait for blocking work without bound.
        std::process::exit(0);
    }
}

/// SIGINT and SIGTERM, caught from when [`Signals::listen`] returns.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn listen() -> Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals { interrupt: signal(SignalKind::interrupt())?, terminate: signal(SignalKind::terminate())? })
    }

    /// The next SIGINT or SIGTERM.
    async fn next(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// How `ebb check` retries a transient storage error (503 ServerBusy, a dropped connection),
/// as `run` does, within [`CHECK_STORAGE_DEADLINE`] per storage queue.
const CHECK_RETRY: RetryPolicy = RetryPolicy { max_attempts: 8, base_delay: Duration::from_millis(200), max_delay: Duration::from_secs(3) };

/// The longest `ebb check` spends reaching one storage queue, retries included (the queues are
/// checked at once, so this bounds the whole storage check).
const CHECK_STORAGE_DEADLINE: Duration = Duration::from_secs(20);

/// Reaches every Azure queue of the config with a read (its message count), then probes
/// the permissions a host needs without touching a message: a delete and an update of a
/// message that does not exist answer "not found" when allowed and 403 when not. (Adding
/// cannot be probed without adding; a missing `a` shows at the first send.) Each failure
/// names the queue, the account and what is missing. Transient errors are retried, within
/// [`CHECK_STORAGE_DEADLINE`].
fn check_azure_queues(config: &Config) -> Vec<anyhow::Error> {
    let azure: Vec<_> = config.queues.iter().filter(|q| matches!(q.backend, Backend::Azure { .. })).collect();
    if azure.is_empty() {
        return Vec::new();
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return vec![error.into()],
    };
    // Each queue's clients as `run` assembles them, retrying as `run` does (within a deadline).
    let mut problems = Vec::new();
    let mut clients: Vec<Arc<dyn QueueClient>> = Vec::new();
    for queue in azure {
        let open = |name: &str| storage_queue(&queue.backend, None, name);
        match QueueStack::assemble(queue, &open, &StackOptions { metered: false, retry: Some(CHECK_RETRY), readiness: None }) {
            Ok(stack) => clients.extend(stack.partitions.into_iter().map(|p| p.client).chain([stack.poison])),
            Err(error) => problems.push(error),
        }
    }
    let checks = clients.iter().map(|client| async move {
        let name = client.name();
        match tokio::time::timeout(CHECK_STORAGE_DEADLINE, check_azure_queue(client.as_ref())).await {
            Ok(checked) => checked,
            Err(_) => Err(anyhow::anyhow!(
                "queue {name}: storage did not answer within {} (transient errors retried)",
                humantime::format_duration(CHECK_STORAGE_DEADLINE)
            )),
        }
    });
    for checked in runtime.block_on(futures::future::join_all(checks)) {
        match checked {
            Ok(line) => println!("{line}"),
            Err(error) => problems.push(error),
        }
    }
    problems
}

/// One storage queue of [`check_azure_queues`]: the line to print, or what is wrong.
async fn check_azure_queue(client: &dyn QueueClient) -> Result<String> {
    let name = client.name();
    let count = match client.approximate_count().await {
        Ok(count) => count,
        Err(error) if format!("{error}").contains("QueueNotFound") => {
            return Ok(format!("queue {name}: reached on Azure; it does not exist yet (ebb run creates it)"));
        }
        Err(error) => return Err(anyhow::Error::new(error)),
    };
    let (nobody, no_receipt) = (MessageId::from("00000000-0000-0000-0000-000000000000"), PopReceipt::from("AAAAAAAAAAAAAAAAAAAAAA=="));
    for probe in [client.delete(&nobody, &no_receipt).await.map(|_| ()), client.update_visibility(&nobody, &no_receipt, Duration::ZERO).await.map(|_| ())] {
        match probe {
            Ok(()) | Err(QueueError::StaleReceipt { .. }) => {}
            Err(error) => return Err(anyhow::Error::new(error)),
        }
    }
    Ok(format!("queue {name}: reached on Azure, {count} message{}; may read, process and update", if count == 1 { "" } else { "s" }))
}

/// A queue whose `shadow_rule` and `rule` are two names of one file (hard links, or a link
/// to the other): the shadow could only agree with the live rule, and `ebb rule promote`
/// would have nothing to rename. The names differ, or the configuration refused it already.
fn shadow_is_the_rule(queue: &crate::config::QueueConfig, rules_dir: &Path) -> Option<anyhow::Error> {
    use std::os::unix::fs::MetadataExt as _;
    let (live, shadow) = (queue.rule.as_ref()?.in_dir(rules_dir), queue.shadow_rule.as_ref()?.in_dir(rules_dir));
    let (a, b) = (std::fs::metadata(&live).ok()?, std::fs::metadata(&shadow).ok()?);
    ((a.dev(), a.ino()) == (b.dev(), b.ino())).then(|| {
        anyhow::anyhow!(
            "queues.{}.shadow_rule: {} and {} are one file ({}): a shadow that is the live rule can only agree with it; copy the candidate into the shadow's file instead",
            queue.name,
            shadow.display(),
            live.display(),
            super::promote::how_one_file(&shadow, &live)
        )
    })
}

pub fn check(config_path: &Path) -> Result<()> {
    let config = Config::load(config_path)?;
    // `ebb run` has no Rust handler: every queue needs its URL.
    config.check_handlers(&|_| false)?;
    // The same check of the folders as `ebb run` makes before it opens them.
    config.check_folders()?;
    // And of the store: a file there that is not a valid store is refused as `run` refuses it.
    crate::queue::embedded::check_store(&config.data_dir)?;
    let engine = RuleEngine::new(config.rule_limits.clone(), None)?;
    // Shadow rules are checked as rules are: a shadow that cannot load is a problem to fix
    // before it is relied on, though it would never stop the host.
    let slots = config.queues.iter().flat_map(|q| {
        let slot = RuleSlot::from(&q.name);
        let shadow = q.shadow_rule_config(&slot, &config.rules_dir);
        std::iter::once(q.rule_config(slot, &config.rules_dir)).chain(shadow)
    });
    let rules = RuleSet::new(engine, slots);
    let problems = rules.load_all();
    for queue in &config.queues {
        let rule = match &queue.rule {
            Some(file) => file.in_dir(&config.rules_dir).display().to_string(),
            None => "built-in (the paper's rule)".into(),
        };
        let shadow = queue.shadow_rule.as_ref().map(|file| format!(", shadow rule {}", file.in_dir(&config.rules_dir).display())).unwrap_or_default();
        println!(
            "queue {}: rule {rule}{shadow}, tasks {}..{}, handler {}",
            queue.name,
            queue.settings.min_tasks,
            queue.settings.max_tasks,
            queue.handler_url.as_ref().map_or_else(|| "not set".to_string(), crate::handler::masked)
        );
    }
    let tokens: Vec<String> = config.tokens.iter().map(|t| format!("{} ({})", t.name, t.role)).collect();
    match tokens.as_slice() {
        [] => println!("api: on {}, no token (every caller is the admin {})", config.listen, crate::http::ANONYMOUS),
        _ => println!("api: on {}, tokens {}", config.listen, tokens.join(", ")),
    }
    if let Some(scaler) = &config.scaler {
        let token = if scaler.token.is_some() { "token required" } else { "no token" };
        println!("scaler: KEDA external scaler on {} ({token}), at most {} instances per queue", scaler.listen, scaler.max_instances);
    }
    let mut problems = problems;
    problems.extend(config.queues.iter().filter_map(|queue| shadow_is_the_rule(queue, &config.rules_dir)));
    problems.extend(check_azure_queues(&config));
    if let Some(bus) = &config.bus {
        let reached = bus.engine().and_then(|engine| {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(crate::bus::reach(&*engine))?;
            Ok(engine.describe())
        });
        match reached {
            Ok(described) => println!("bus: {described} answers; hosts publish and subscribe on {}<queue>", bus.channel_prefix),
            Err(error) => problems.push(error.context("bus: push notifications between hosts would not work (queues would poll)")),
        }
    }
    for problem in &problems {
        eprintln!("error: {problem:#}");
    }
    if !problems.is_empty() {
        bail!("{} problem{} with {}", problems.len(), if problems.len() == 1 { "" } else { "s" }, config_path.display());
    }
    println!("{} is valid", config_path.display());
    Ok(())
}
