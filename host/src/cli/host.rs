//! `ebb run` and `ebb check`.

use anyhow::{Result, bail};
use std::path::Path;
use std::time::Duration;

use crate::config::Config;
use crate::host::Host;
use crate::names::DecisionSite;
use crate::rules::{RuleEngine, RuleSet};
use crate::service::Role;

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
        // Through the log, so that in JSON it is a JSON line too.
        tracing::warn!("second signal: exiting now; messages in flight come back when their lease runs out");
        crate::telemetry::abandon();
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
        let slot = DecisionSite::from(&q.name);
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
    problems.extend(super::azure_check::check_azure_queues(&config));
    problems.extend(super::sqs_check::check_sqs_queues(&config));
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
        super::logging::print_error(problem);
    }
    if !problems.is_empty() {
        bail!("{} problem{} with {}", problems.len(), if problems.len() == 1 { "" } else { "s" }, config_path.display());
    }
    println!("{} is valid", config_path.display());
    Ok(())
}
