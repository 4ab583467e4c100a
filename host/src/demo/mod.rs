//! `ebb demo`: the whole host on the embedded queue, with a WASM rule from the watched
//! folder, an in-process app behind the real HTTP handler path, and a load in phases:
//! a burst, idle, a trickle, a rule swap, a second burst, idle again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use futures::StreamExt as _;

use crate::config::{Config, QueueConfig};
use crate::host::Host;
use crate::listener::{ListenerStatus, QueueSettings};
use crate::queue::QueueClient;
use crate::rules::RuleLimits;
use crate::service::Role;
use azurite::Azurite;

mod azurite;

const QUEUE: &str = "demo";

/// What the demo does; every field has a command-line flag.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// How long the demo runs.
    pub duration: Duration,
    /// How long the app takes per message.
    pub processing_time: Duration,
    /// Messages in the first burst (the second is 60% of it).
    pub burst: u64,
    /// Messages per second in the trickle phase.
    pub trickle_per_sec: u64,
    /// Run the queue on Azurite (Azure's emulator) instead of the embedded store.
    pub azurite: bool,
}

/// The demo's first rule: `example-rules/paper-default`, built for wasm32-wasip2 and kept
/// in the binary so that an installed `ebb` runs the demo with no Rust toolchain and no
/// checkout. `tests/all/demo.rs` holds these files to what the example sources build today.
const PAPER_DEFAULT: &[u8] = include_bytes!("rules/paper_default.wasm");
/// The rule swapped in mid-run: `example-rules/proportional`, kept likewise.
const PROPORTIONAL: &[u8] = include_bytes!("rules/proportional.wasm");

pub async fn run(options: DemoOptions) -> Result<()> {
    let files = DemoFiles::write()?;
    let azurite = if options.azurite { Some(Azurite::start()?) } else { None };
    let backend = match &azurite {
        Some(azurite) => crate::config::Backend::Azure { account: azurite.account()?, encoding: crate::queue::azure::Encoding::Base64 },
        None => crate::config::Backend::Embedded,
    };
    let processed_by_app = Arc::new(AtomicU64::new(0));
    let (app, app_server) = start_app(options.processing_time, processed_by_app.clone()).await?;
    let config = demo_config(&files, app, backend)?;
    // The demo's own display of the depth: not through the host's metered client, so the
    // transactions shown are the host's only.
    let display_queue = match &azurite {
        Some(_) => Some(crate::service::storage_queue(&config.queues[0].backend, None, QUEUE)?),
        None => None,
    };
    let service = Host::start(&config, Role::Worker).await?;
    let store = match &azurite {
        Some(azurite) => format!("Azurite at {} (every call a billed transaction on Azure)", azurite.endpoint),
        None => format!("the embedded store in {}", config.data_dir.display()),
    };
    println!(
        "ebb demo: queue {QUEUE} on {store}, rule {} from the watched folder {}, app at http://{app}/work ({} ms a message)",
        files.rule_file.file_name().unwrap().to_string_lossy(),
        files.rules_dir.display(),
        options.processing_time.as_millis()
    );
    let status = watch(&service, &options, &files, display_queue).await?;
    service.shutdown().await;
    // The host has drained: the app can go.
    drop(app_server);
    print_summary(&status, processed_by_app.load(Ordering::Relaxed), options.duration);
    Ok(())
}

/// The demo's folder, removed when dropped: its data, and the watched rules folder with the
/// first rule as `demo.wasm`.
struct DemoFiles {
    work: tempfile::TempDir,
    rules_dir: std::path::PathBuf,
    rule_file: std::path::PathBuf,
}

impl DemoFiles {
    fn write() -> Result<DemoFiles> {
        let work = tempfile::tempdir().context("failed to create a temporary folder")?;
        let rules_dir = work.path().join("rules");
        std::fs::create_dir_all(&rules_dir).with_context(|| format!("failed to create {}", rules_dir.display()))?;
        let rule_file = rules_dir.join("demo.wasm");
        std::fs::write(&rule_file, PAPER_DEFAULT).with_context(|| format!("failed to write {}", rule_file.display()))?;
        Ok(DemoFiles { work, rules_dir, rule_file })
    }

    /// Deploys the proportional rule over `demo.wasm` as an operator would: write aside, then
    /// rename into the watched folder.
    fn deploy_proportional(&self) -> Result<()> {
        let staging = self.rules_dir.join("demo.wasm.partial");
        std::fs::write(&staging, PROPORTIONAL)?;
        std::fs::rename(&staging, &self.rule_file)?;
        Ok(())
    }
}

/// The host's configuration: one queue, `demo`, handled by the app at `app`.
fn demo_config(files: &DemoFiles, app: std::net::SocketAddr, backend: crate::config::Backend) -> Result<Config> {
    Ok(Config {
        bus: None,
        data_dir: files.work.path().join("data"),
        rules_dir: files.rules_dir.clone(),
        max_message_bytes: crate::defaults::MAX_MESSAGE_BYTES,
        drain_timeout: Duration::from_secs(10),
        price_per_10k_transactions: crate::cost::PAPER_PRICE_PER_10K,
        listen: "127.0.0.1:0".parse()?,
        tokens: Vec::new(),
        scaler: None,
        api_limits: crate::config::ApiLimits::default(),
        rule_limits: RuleLimits::default(),
        log_format: crate::config::LogFormat::default(),
        queues: vec![QueueConfig {
            name: crate::names::QueueName::new(QUEUE)?,
            settings: QueueSettings { max_polling_interval: Duration::from_secs(5), ..QueueSettings::default() },
            rule: Some(crate::names::RuleFileName::new("demo.wasm")?),
            rule_params: vec![],
            shadow_rule: None,
            shadow_rule_params: vec![],
            handler_url: Some(format!("http://{app}/work").parse()?),
            handler_timeout: Duration::from_secs(30),
            partitions: 1,
            backend,
            claims: crate::payload::claims::ClaimSettings::default(),
            payload: crate::payload::PayloadSettings::default(),
            record_max_bytes: None,
        }],
    })
}

/// Runs the load through the host's API for the demo's duration, printing a live line a
/// second and deploying the proportional rule at 55% of it; returns the last status.
async fn watch(service: &Host, options: &DemoOptions, files: &DemoFiles, display_queue: Option<Arc<dyn QueueClient>>) -> Result<ListenerStatus> {
    let names = [(sha256(PAPER_DEFAULT), "paper-default"), (sha256(PROPORTIONAL), "proportional")];
    let total = options.duration.as_secs_f64();
    let at = |fraction: f64| Duration::from_secs_f64(total * fraction);
    let started = Instant::now();
    let load = tokio::spawn(generate_load(service.api_addr(), options.clone(), at(0.03), at(0.40), at(0.75), at(0.65), started));
    let mut swapped = false;
    let mut last = None::<ListenerStatus>;
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    while started.elapsed() < options.duration {
        ticker.tick().await;
        if !swapped && started.elapsed() >= at(0.55) {
            swapped = true;
            files.deploy_proportional()?;
            println!("-- deployed the proportional rule over demo.wasm (write aside + rename); the host swaps it in while it works");
        }
        let status = service.status().remove(0);
        let depth = match &display_queue {
            Some(queue) => queue.approximate_count().await?,
            None => service.depth(QUEUE).await?,
        };
        println!("{}", live_line(started.elapsed(), depth, &status, last.as_ref(), &names));
        last = Some(status);
    }
    load.abort();
    Ok(service.status().remove(0))
}

fn live_line(elapsed: Duration, depth: u64, s: &ListenerStatus, last: Option<&ListenerStatus>, names: &[(String, &str)]) -> String {
    let tx = s.transactions.unwrap_or_default();
    let last_tx = last.and_then(|l| l.transactions).unwrap_or_default();
    let rule = match (&s.rule, s.rule.as_ref().and_then(|r| r.sha256.clone())) {
        (Some(rule), Some(sha)) => {
            let name = names.iter().find(|(h, _)| *h == sha).map_or("?", |(_, n)| n);
            format!("{}={name}@{}", rule.file.clone().unwrap_or_default(), &sha[..8])
        }
        _ => "built-in".into(),
    };
    let source = s.last_task_count.as_ref().map_or("-".to_string(), |d| format!("{:?}", d.decision.source).to_lowercase());
    format!(
        "t={:>3}s depth={:>6} tasks={:>2}/{:<2} processed={:>6} (+{:>4}/s) storage_tx={:>6} (+{:>4}/s) idle_tx={:>4} rule={rule} decided_by={source}",
        elapsed.as_secs(),
        depth,
        s.active_tasks,
        s.target_tasks,
        s.processed,
        s.processed - last.map_or(0, |l| l.processed),
        tx.total(),
        tx.total() - last_tx.total(),
        tx.gets_empty,
    )
}

fn print_summary(s: &ListenerStatus, handled_by_app: u64, duration: Duration) {
    let tx = s.transactions.unwrap_or_default();
    let rule = s.rule.clone();
    println!("-- summary after {} s", duration.as_secs());
    println!("messages processed:       {} (the app saw {handled_by_app}; failed {}, poisoned {})", s.processed, s.failed, s.poisoned);
    println!("peak dequeue tasks:       {}", s.peak_tasks);
    println!(
        "storage transactions:     {} in all: {} puts, {} gets with messages, {} empty gets, {} deletes, {} visibility updates, {} counts",
        tx.total(),
        tx.puts,
        tx.gets_with_messages,
        tx.gets_empty,
        tx.deletes,
        tx.updates,
        tx.counts
    );
    if s.processed > 0 {
        let consuming = tx.gets_with_messages + tx.gets_empty + tx.deletes;
        println!("gets + deletes per message: {:.3} (the paper's floor: 1/32 get + 1 delete = 1.031)", consuming as f64 / s.processed as f64);
    }
    if let Some(rule) = rule {
        println!(
            "rule decisions:           {} ({} clamped, {} faults), rule in use: {}",
            rule.decisions,
            rule.clamps,
            rule.faults,
            rule.file.unwrap_or_else(|| "built-in".into())
        );
    }
}

/// The demo's app, serving until the handle is dropped.
async fn start_app(
    processing_time: Duration,
    processed: Arc<AtomicU64>,
) -> Result<(std::net::SocketAddr, tokio_util::task::AbortOnDropHandle<std::io::Result<()>>)> {
    let router = axum::Router::new().route(
        "/work",
        axum::routing::post(move || {
            let processed = processed.clone();
            async move {
                tokio::time::sleep(processing_time).await;
                processed.fetch_add(1, Ordering::Relaxed);
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    Ok((addr, tokio_util::task::AbortOnDropHandle::new(server)))
}

/// Posts through the host's API, as clients would: a burst, a trickle, a second burst.
async fn generate_load(
    api: std::net::SocketAddr,
    options: DemoOptions,
    burst_at: Duration,
    trickle_from: Duration,
    trickle_to: Duration,
    second_burst_at: Duration,
    started: Instant,
) {
    let client = reqwest::Client::new();
    let url = format!("http://{api}/queues/{QUEUE}/messages");
    let send = |n: u64| {
        let (client, url) = (client.clone(), url.clone());
        futures::stream::iter(0..n)
            .map(move |i| {
                let request = client.post(&url).body(format!("order {i}"));
                async move { request.send().await.map(drop).map_err(|e| tracing::warn!("demo load: {e}")) }
            })
            .buffer_unordered(64)
            .collect::<Vec<_>>()
    };
    let wait_until = |at: Duration| tokio::time::sleep(at.saturating_sub(started.elapsed()));
    wait_until(burst_at).await;
    println!("-- burst: {} messages", options.burst);
    send(options.burst).await;
    wait_until(trickle_from).await;
    println!("-- trickle: {} messages/s", options.trickle_per_sec);
    let mut second_burst_sent = false;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    while started.elapsed() < trickle_to {
        tick.tick().await;
        if !second_burst_sent && started.elapsed() >= second_burst_at {
            second_burst_sent = true;
            let n = options.burst * 3 / 5;
            println!("-- second burst: {n} messages");
            send(n).await;
        }
        send(options.trickle_per_sec).await;
    }
    println!("-- idle");
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}
