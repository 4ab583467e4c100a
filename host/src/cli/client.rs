//! `ebb send`, `ebb poison` and `ebb queue pause|resume`: talk to the running host's API,
//! or (send, pause) write the data directory directly when no host is up.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use serde_json::Value;

use crate::config::{Backend, Config, QueueConfig};
use crate::payload::claims::ClaimRecords;
use crate::queue::embedded::{EmbeddedOptions, EmbeddedStore, OWNER_WAIT};
use crate::queue::{GroupedSend, RetryPolicy};
use crate::service::{QueueHandle, QueueStack, StackOptions};
use crate::telemetry::TraceContext;

pub(super) fn api_base(config: &Config) -> String {
    let mut addr = config.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    format!("http://{addr}")
}

/// Which configured token a command that calls the running host sends.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TokenArgs {
    /// Send the configured API token of this name (`default`, or a `[[api.tokens]]` name; its
    /// `token_env` variable must be set here), instead of `EBB_API_TOKEN` or `api.token`. Or
    /// set `EBB_TOKEN_NAME`.
    #[arg(long, value_name = "NAME")]
    pub token_name: Option<String>,
}

/// The config at `config_path` and the token to send: the one named by `--token-name` (or
/// `EBB_TOKEN_NAME`), else `EBB_API_TOKEN` as it is, else `api.token`.
pub(super) fn load(config_path: &Path, token: &TokenArgs) -> Result<(Config, Option<String>)> {
    let name = token.token_name.clone().or_else(|| std::env::var(crate::config::TOKEN_NAME_ENV).ok().filter(|n| !n.is_empty()));
    Config::load_for_client(config_path, name.as_deref())
}

pub(super) fn client(token: Option<&str>) -> Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = token {
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse()?);
    }
    Ok(reqwest::Client::builder().default_headers(headers).timeout(Duration::from_secs(30)).build()?)
}

/// Readies a queue's storage for sends without a host. The embedded store's queues are
/// created (a local file: nothing to ask). On Azure a send needs only the permission to add
/// (the Storage Queue Data Message Sender role, or a SAS with `a`): the queues sent to are
/// created where the credential may, and a refusal is no error (they may exist; if not, the
/// put says so); the poison and reply queues are the host's to create.
async fn create_for_sending(stack: &QueueStack, backend: &Backend) -> Result<()> {
    let account = match backend {
        Backend::Embedded => return Ok(stack.create_if_missing().await?),
        Backend::Azure { account, .. } => Some(account),
        // On SQS a sender may lack sqs:CreateQueue and sqs:GetQueueAttributes alike.
        Backend::Sqs { .. } => None,
    };
    // A SAS that says it may not create: asking would only log the refusal.
    if account.and_then(|account| account.sas_grant()).is_some_and(|grant| !grant.lacks(&[crate::queue::azure::QueuePermission::Create]).is_empty()) {
        return Ok(());
    }
    for partition in &stack.partitions {
        match partition.client.create_if_missing().await {
            Err(error) if error.failure_class() == Some(crate::queue::FailureClass::Auth) => {
                tracing::debug!(queue = partition.client.name(), "may not create the queue, sending anyway: {error}");
            }
            other => other?,
        }
    }
    Ok(())
}

/// `ebb send --traceparent [--tracestate]`'s context. A malformed one is never refused nor
/// passed on, as a host takes a producer's: the message starts a new trace, and a warning
/// names the form it must take (a malformed `--tracestate` is dropped, the parent kept).
pub fn trace_context(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<TraceContext> {
    let traceparent = traceparent?;
    let Some(context) = TraceContext::parse(traceparent, tracestate) else {
        tracing::warn!(
            "--traceparent: {traceparent:?} is not a W3C traceparent (00-<32 hex>-<16 hex, not all zero>-<2 hex>, lowercase); sent without it, the message starts a new trace"
        );
        return None;
    };
    if let Some(tracestate) = tracestate.filter(|state| context.tracestate().is_none() && !state.trim().is_empty()) {
        tracing::warn!("--tracestate: {tracestate:?} is not a W3C tracestate (at most 32 key=value members, each key once); sent without it");
    }
    Some(context)
}

pub async fn send(
    config_path: &Path,
    token: &TokenArgs,
    queue: &str,
    count: u64,
    body: Option<String>,
    group: Option<&GroupedSend>,
    context: Option<TraceContext>,
) -> Result<()> {
    let (config, token) = load(config_path, token)?;
    let Some(queue_config) = config.queues.iter().find(|q| q.name == queue) else {
        bail!("queue {queue} is not configured in {}", config_path.display());
    };
    let body = read_message(&config, queue_config, body)?;
    let http = client(token.as_deref())?;
    let url = format!("{}/queues/{queue}/messages{}", api_base(&config), group_query(group));
    // Through a host, as the headers a producer's send carries; straight into storage, as
    // the host's own sends carry it.
    let post = || traced(http.post(&url), context.as_ref());
    let first = post().body(body.clone()).send().await;
    match first {
        Err(error) if error.is_connect() => crate::telemetry::with_sending(context.clone(), send_offline(&config, queue_config, &body, count, group)).await,
        first => send_through_host(&config, &post, queue, first, bytes::Bytes::from(body), count).await,
    }
}

/// `request` with `context` as its `traceparent` and `tracestate` headers, as a producer's
/// send carries them.
fn traced(request: reqwest::RequestBuilder, context: Option<&TraceContext>) -> reqwest::RequestBuilder {
    let Some(context) = context else { return request };
    let request = request.header("traceparent", context.traceparent());
    match context.tracestate() {
        Some(state) => request.header("tracestate", state),
        None => request,
    }
}

/// The query of a send into `group` (none without one): `?group=G[&dedup_id=D]`.
fn group_query(group: Option<&GroupedSend>) -> String {
    let Some(group) = group else { return String::new() };
    let mut query = form_urlencoded::Serializer::new(String::from("?"));
    query.append_pair("group", &group.group);
    if let Some(dedup_id) = &group.dedup_id {
        query.append_pair("dedup_id", dedup_id);
    }
    query.finish()
}

/// The queue's producer when no host answers: its stack straight on storage (the data
/// directory, or the Azure account), readied for sending, and its handle built as the
/// service builds it, so a body or item too large for a message goes to the claim store.
async fn offline_producer(config: &Config, queue: &QueueConfig) -> Result<QueueHandle> {
    let store = match queue.backend {
        Backend::Embedded => Some(
            EmbeddedStore::open(
                &config.data_dir,
                EmbeddedOptions { max_message_bytes: config.max_message_bytes, wait_for_owner: OWNER_WAIT, ..Default::default() },
            )
            .context("no host answers on the API, and the data directory could not be opened")?,
        ),
        Backend::Azure { .. } | Backend::Sqs { .. } => None,
    };
    let open = |name: &str| crate::service::storage_queue(&queue.backend, store.as_ref(), name);
    let stack = QueueStack::assemble(queue, &open, &StackOptions { metered: false, retry: Some(RetryPolicy::default()), readiness: None })?;
    within_storage_bound(format!("creating queue {}", queue.name), create_for_sending(&stack, &queue.backend)).await?;
    Ok(stack.producer(queue, store.as_ref(), &ClaimRecords::default()).build())
}

/// `ebb send` with no host running: `count` copies of `body` put straight into storage,
/// then the hosts elsewhere told on the bus, if one is configured.
async fn send_offline(config: &Config, queue: &QueueConfig, body: &[u8], count: u64, group: Option<&GroupedSend>) -> Result<()> {
    let handle = offline_producer(config, queue).await?;
    let mut puts = futures::stream::iter(0..count)
        .map(|_| within_storage_bound(format!("sending to queue {}", queue.name), handle.send_in(group, body, Duration::ZERO, Duration::MAX)))
        .buffer_unordered(256);
    while let Some(put) = puts.next().await {
        put?;
    }
    let written_to = match &queue.backend {
        Backend::Embedded => config.data_dir.display().to_string(),
        Backend::Azure { account, .. } => format!("Azure account {}", account.name()),
        Backend::Sqs { account, .. } => account.describe(),
    };
    super::end_quietly_when_output_closes();
    println!("sent {count} message{} to {} (no host running: written to {written_to})", plural(count), queue.name);
    notify_hosts(config, &queue.name, count).await
}

/// Tells the hosts listening on `queue` elsewhere of `count` messages at once (they would
/// find them by polling otherwise), when a bus is configured.
async fn notify_hosts(config: &Config, queue: &str, count: u64) -> Result<()> {
    let Some(bus) = &config.bus else {
        return Ok(());
    };
    let trigger = crate::bus::Trigger { queue: queue.to_string(), count: Some(count), delay_ms: None };
    let engine = bus.engine()?;
    match crate::bus::publish_once(&*engine, &bus.channel_prefix, &trigger).await {
        Ok(()) => println!("notified the hosts on {}{queue} via {}", bus.channel_prefix, engine.describe()),
        Err(error) => eprintln!("warning: could not notify the hosts (they find the messages by polling): {error:#}"),
    }
    Ok(())
}

/// `ebb send` through the running host at `url` (`first`: its answer to the first of the
/// `count` sends of `body`). The host reads at most two bodies larger than a message at once
/// (each held whole): those go one at a time; any send the host is too busy for is retried.
async fn send_through_host(
    config: &Config,
    post: &(dyn Fn() -> reqwest::RequestBuilder + Sync),
    queue: &str,
    first: reqwest::Result<reqwest::Response>,
    body: bytes::Bytes,
    count: u64,
) -> Result<()> {
    let in_flight = if body.len() > config.max_message_bytes { 1 } else { 64 };
    let mut sent = 0u64;
    let failed = match retry_busy(first, || post().body(body.clone())).await {
        Ok(()) => {
            sent += 1;
            let mut rest = futures::stream::iter(1..count).map(|_| retry_busy_send(|| post().body(body.clone()))).buffer_unordered(in_flight);
            let mut failed = None;
            while let Some(result) = rest.next().await {
                match result {
                    Ok(()) => sent += 1,
                    Err(error) => {
                        failed = Some(error);
                        break;
                    }
                }
            }
            failed
        }
        Err(error) => Some(error),
    };
    if let Some(error) = failed {
        return Err(error.context(format!("sent {sent} of {count} message{} to {queue}", plural(count))));
    }
    super::end_quietly_when_output_closes();
    println!("sent {count} message{} to {queue} via {}", plural(count), api_base(config));
    Ok(())
}

/// The longest `ebb send` without a running host waits for storage to answer one call
/// (creating the queue, putting a message; transient errors are retried within it): storage
/// that accepts connections and never answers is given up on, not waited for.
pub(crate) const STORAGE_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// `work`, failing once it outlasts [`STORAGE_ANSWER_TIMEOUT`] (`what` names it).
async fn within_storage_bound<T, E: Into<anyhow::Error>>(what: String, work: impl Future<Output = std::result::Result<T, E>>) -> Result<T> {
    match tokio::time::timeout(STORAGE_ANSWER_TIMEOUT, work).await {
        Ok(done) => done.map_err(Into::into).context(what),
        Err(_) => bail!("{what}: storage did not answer within {}", humantime::format_duration(STORAGE_ANSWER_TIMEOUT)),
    }
}

/// The message `ebb send` sends: `body`, or stdin up to the largest body the queue takes
/// (its `max_claim_check_bytes` when a body too large for a message can go to its claim
/// store: a queue of one storage queue, not partitioned; the host or the store refuses it
/// when there is no claim store after all).
fn read_message(config: &crate::config::Config, queue: &crate::config::QueueConfig, body: Option<String>) -> Result<Vec<u8>> {
    if let Some(body) = body {
        return Ok(body.into_bytes());
    }
    let offloads = queue.storage_queues().len() == 1;
    let (key, limit) = if offloads {
        ("max_claim_check_bytes", queue.claims.max_bytes.max(config.max_message_bytes as u64))
    } else {
        ("max_message_bytes: a partitioned queue has no claim store for a larger body", config.max_message_bytes as u64)
    };
    crate::input::read_stdin(&format!("the message (at most {key})"), limit)
}

/// Requests of a replay in flight at once: more waits (and the replay falls behind the
/// trace, which its last line reports).
const REPLAY_IN_FLIGHT: usize = 64;

/// `ebb send QUEUE --trace FILE`: each arrival of the trace (the simulator's format, read
/// through the same bounded reader as `ebb simulate --trace`) sent at its time, from now,
/// through the running host's API, each message its own request (so each notifies the queue
/// as any send does). Ctrl-C stops it at once.
pub async fn send_trace(config_path: &Path, token: &TokenArgs, queue: &str, trace: &Path, body: Option<String>) -> Result<()> {
    let arrivals = crate::simulate::scenario::read_trace(trace)?;
    let (config, token) = load(config_path, token)?;
    if !config.queues.iter().any(|q| q.name == queue) {
        bail!("queue {queue} is not configured in {}", config_path.display());
    }
    if let Some(body) = &body
        && body.len() > config.max_message_bytes
    {
        bail!("the message is {} bytes, over max_message_bytes ({} bytes)", body.len(), config.max_message_bytes);
    }
    let http = client(token.as_deref())?;
    let base = api_base(&config);
    // Found now, not at the first arrival (which may be hours away).
    let probe = format!("{base}/healthz");
    http.get(&probe).send().await.with_context(|| format!("no host answers at {probe}: `ebb send --trace` replays through a running host's API"))?;
    let url = format!("{base}/queues/{queue}/messages");
    let total: u64 = arrivals.iter().map(|a| u64::from(a.count)).sum();
    let length = arrivals.last().map_or(Duration::ZERO, |a| a.at);
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let start = tokio::time::Instant::now();
    let replay = replay(&http, &url, &arrivals, body.as_deref(), start, sent.clone());
    tokio::select! {
        lag = replay => {
            let lag = lag?;
            super::end_quietly_when_output_closes();
            println!(
                "replayed {total} message{} ({} arrivals over {}) to {queue} via {base}; the latest a send started after its time: {}",
                plural(total),
                arrivals.len(),
                crate::simulate::scenario::show_duration(Duration::from_millis(length.as_millis() as u64)),
                humantime::format_duration(Duration::from_millis(lag.as_millis() as u64)),
            );
            Ok(())
        }
        _ = tokio::signal::ctrl_c() => bail!(
            "stopped by Ctrl-C after {} of {total} messages, {} into the trace's {}",
            sent.load(std::sync::atomic::Ordering::Relaxed),
            humantime::format_duration(Duration::from_secs(start.elapsed().as_secs())),
            crate::simulate::scenario::show_duration(Duration::from_secs(length.as_secs())),
        ),
    }
}

/// Sends every arrival at `start` + its time; returns how late the latest send started.
/// Dropped (Ctrl-C), it stops at once: the requests in flight are dropped with it.
async fn replay(
    http: &reqwest::Client,
    url: &str,
    arrivals: &[crate::simulate::Arrival],
    body: Option<&str>,
    start: tokio::time::Instant,
    sent: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> Result<Duration> {
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(REPLAY_IN_FLIGHT));
    let mut requests = tokio::task::JoinSet::new();
    let mut lag = Duration::ZERO;
    let mut seq = 0u64;
    for arrival in arrivals {
        tokio::time::sleep_until(start + arrival.at).await;
        for _ in 0..arrival.count {
            let slot = slots.clone().acquire_owned().await.context("the replay's request slots closed")?;
            lag = lag.max(start.elapsed().saturating_sub(arrival.at));
            seq += 1;
            let body = body.map_or_else(|| format!("{{\"trace_seconds\":{},\"seq\":{seq}}}", arrival.at.as_secs_f64()), str::to_string);
            let request = http.post(url).body(body);
            let sent = sent.clone();
            let at = arrival.at;
            requests.spawn(async move {
                let _slot = slot;
                let answer = async { check_response(request.send().await?).await }.await;
                answer.with_context(|| format!("sending message {seq} (the arrival at {}s)", at.as_secs_f64()))?;
                sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                anyhow::Ok(())
            });
            // The first failure ends the replay.
            while let Some(done) = requests.try_join_next() {
                done.context("a send of the replay panicked")??;
            }
        }
    }
    while let Some(done) = requests.join_next().await {
        done.context("a send of the replay panicked")??;
    }
    Ok(lag)
}

/// Pauses `queue` (`Some`: for that long, or until resumed) or resumes it (`None`): through
/// the running host's API, else in the data directory, where the next start reads it.
pub async fn pause(config_path: &Path, token: &TokenArgs, queue: &str, pause: Option<Option<Duration>>) -> Result<()> {
    let (config, token) = load(config_path, token)?;
    if !config.queues.iter().any(|q| q.name == queue) {
        bail!("queue {queue} is not configured in {}", config_path.display());
    }
    let http = client(token.as_deref())?;
    let (verb, query) = match pause {
        Some(Some(for_)) => ("pause", format!("?for={}", humantime::format_duration(for_).to_string().replace(' ', ""))),
        Some(None) => ("pause", String::new()),
        None => ("resume", String::new()),
    };
    let url = format!("{}/queues/{queue}/{verb}{query}", api_base(&config));
    match http.post(&url).send().await {
        Err(error) if error.is_connect() => {
            let pauses = crate::service::Pauses::open(&config.data_dir)?;
            // A change that cannot be recorded is not made.
            crate::service::AuditLog::new(&config.data_dir).writable()?;
            let now_ms = crate::queue::Clock::now_ms(&crate::queue::SystemClock);
            let kept = pause.map(|for_| crate::listener::Pause::from_now(now_ms, for_));
            pauses.set(queue, kept, now_ms)?;
            let done = if pause.is_some() { "paused" } else { "resumed" };
            crate::service::AuditLog::new(&config.data_dir).record(
                "cli",
                if pause.is_some() { "pause" } else { "resume" },
                queue,
                &format!("ok: {done} with no host running"),
            );
            println!("{queue} {done} (no host running: recorded in {}, read at the next start)", config.data_dir.display());
        }
        answered => {
            let response = answered.with_context(|| format!("failed to reach the host at {url}"))?;
            if !response.status().is_success() {
                return check_response(response).await;
            }
            // A resume the host could not keep across a restart (its disk is full) says so.
            let answer: Value = serde_json::from_slice(&response.bytes().await?).unwrap_or_default();
            if let Some(warning) = answer["warning"].as_str() {
                eprintln!("warning: {queue} {warning}");
            }
            match pause {
                Some(Some(for_)) => println!("{queue} paused for {}", humantime::format_duration(for_)),
                Some(None) => println!("{queue} paused until resumed (ebb queue resume {queue})"),
                None => println!("{queue} resumed"),
            }
        }
    }
    Ok(())
}

/// `ebb poison list|requeue|purge`, through the running host's API.
pub async fn poison(command: super::PoisonCommand) -> Result<()> {
    use super::PoisonCommand;
    let (config_path, queue, token) = match &command {
        PoisonCommand::List { config, queue, token, .. }
        | PoisonCommand::Requeue { config, queue, token, .. }
        | PoisonCommand::Purge { config, queue, token, .. } => (config, queue, token),
    };
    let (config, token) = load(config_path, token)?;
    if !config.queues.iter().any(|q| q.name == queue.as_str()) {
        bail!("queue {queue} is not configured in {}", config_path.display());
    }
    let http = client(token.as_deref())?;
    let base = format!("{}/queues/{queue}/poison", api_base(&config));
    let encode = |text: &str| form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>();
    let request = match &command {
        PoisonCommand::List { limit, .. } => http.get(format!("{base}?limit={limit}")),
        PoisonCommand::Requeue { all: true, .. } => http.post(format!("{base}/requeue?all=true")),
        PoisonCommand::Requeue { ids, .. } => http.post(format!("{base}/requeue?ids={}", encode(&ids.join(",")))),
        PoisonCommand::Purge { yes: false, .. } => bail!("purging deletes every poison message of {queue} for good: add --yes"),
        PoisonCommand::Purge { .. } => http.post(format!("{base}/purge?confirm={}", encode(queue))),
    };
    let response = request.send().await.with_context(|| format!("no host answers at {base}: the poison commands work through the running host"))?;
    let status = response.status();
    let body: Value = serde_json::from_slice(&response.bytes().await?).context("the host answered with invalid JSON")?;
    if !status.is_success() {
        bail!("{}", refusal(status, body["error"].as_str().unwrap_or("(no reason)")));
    }
    match command {
        PoisonCommand::List { json: true, .. } => println!("{}", serde_json::to_string_pretty(&body)?),
        PoisonCommand::List { .. } => {
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            println!("{} poison message{} of {queue} (in {})", messages.len(), plural(messages.len() as u64), cell(&body["poison_queue"]));
            for m in messages {
                // One line each: a body's own line breaks and control characters shown escaped.
                let preview: String = match m["offloaded_bytes"].as_u64() {
                    Some(bytes) => format!("(an offloaded message: its {bytes}-byte body is in the queue's claim store)"),
                    None => m["preview"].as_str().unwrap_or_default().chars().take(80).flat_map(char::escape_debug).collect(),
                };
                let reason: String = m["reason"].as_str().unwrap_or("(bare body: no reason kept)").chars().take(120).flat_map(char::escape_debug).collect();
                println!("{}  {}  dequeued {}  {reason}\n    {preview}", cell(&m["id"]), cell(&m["poisoned_at"]), cell(&m["dequeue_count"]));
            }
        }
        PoisonCommand::Requeue { .. } => {
            println!("requeued {} poison message{} to {queue}", cell(&body["requeued"]), plural(body["requeued"].as_u64().unwrap_or(0)));
            for skipped in body["skipped"].as_array().into_iter().flatten() {
                let reason: String = skipped["reason"].as_str().unwrap_or_default().chars().take(200).flat_map(char::escape_debug).collect();
                eprintln!("left {} in the poison queue: {reason}", cell(&skipped["id"]));
            }
            let not_found: Vec<String> =
                body["not_found"].as_array().into_iter().flatten().map(|id| id.as_str().unwrap_or_default().escape_debug().to_string()).collect();
            if !not_found.is_empty() {
                bail!("no poison message of {queue} has the id {} (listed with `ebb poison list {queue}`)", not_found.join(", "));
            }
        }
        PoisonCommand::Purge { .. } => println!("purged {} poison message{} of {queue}", cell(&body["purged"]), plural(body["purged"].as_u64().unwrap_or(0))),
    }
    Ok(())
}

/// Longest `ebb send --wait-reply --timeout`.
const MAX_REPLY_TIMEOUT: Duration = Duration::from_secs(3600);
/// The shortest `--timeout`: a shorter one would send, and give up before any handler could
/// have answered.
const MIN_REPLY_TIMEOUT: Duration = Duration::from_secs(1);

/// Longest wait one look for a reply asks the host for (the host's own bound).
const REPLY_LONG_POLL: Duration = Duration::from_secs(30);

/// How much longer than the wait it asks for a look for a reply may take: the client's own
/// timeout (30 s for every other request) would end a 30 s long poll before the host's
/// answer, however long `--timeout` is.
const REPLY_LONG_POLL_MARGIN: Duration = Duration::from_secs(15);

/// Refuses a `--wait-reply` that cannot be: a timeout outside [`MIN_REPLY_TIMEOUT`] to
/// [`MAX_REPLY_TIMEOUT`], or a queue without a `reply_queue`.
fn check_wait_reply(config_path: &Path, config: &crate::config::Config, queue: &crate::config::QueueConfig, timeout: Duration) -> Result<()> {
    if !(MIN_REPLY_TIMEOUT..=MAX_REPLY_TIMEOUT).contains(&timeout) {
        bail!(
            "--timeout: {} to {} (a reply comes once the request is handled), got {}; nothing was sent",
            humantime::format_duration(MIN_REPLY_TIMEOUT),
            humantime::format_duration(MAX_REPLY_TIMEOUT),
            humantime::format_duration(timeout)
        );
    }
    let Some(reply) = &queue.payload.reply_queue else {
        bail!("queue {} has no reply_queue in {}: there is no answer to wait for", queue.name, config_path.display());
    };
    if let Some(handler) = config.queues.iter().find(|other| other.storage_queues().iter().any(|s| s.as_str() == reply)) {
        bail!(
            "queue {}'s answers go to {reply}, which queue {} handles in {} (a pipeline): its listener takes them, so there is no answer to wait for (nothing was sent)",
            queue.name,
            handler.name,
            config_path.display()
        );
    }
    Ok(())
}

/// Waits until `deadline` for the answer to message `id` (with `item`: to that item of
/// envelope `id`) through the host's long poll, asking again every 30 s; the reply's JSON,
/// none when the deadline passed.
async fn wait_for_reply(
    http: &reqwest::Client,
    base: &str,
    queue: &str,
    id: &str,
    item: Option<u32>,
    deadline: tokio::time::Instant,
) -> Result<Option<String>> {
    let item_query = item.map_or(String::new(), |item| format!("&item={item}"));
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now()).min(REPLY_LONG_POLL);
        let url = format!("{base}/queues/{queue}/replies/{id}?timeout_ms={}{item_query}", left.as_millis());
        let answer = http.post(&url).timeout(left + REPLY_LONG_POLL_MARGIN).send().await.with_context(|| format!("waiting for the reply to message {id}"))?;
        let status = answer.status();
        let text = answer.text().await.unwrap_or_default();
        if status.is_success() {
            return Ok(Some(text));
        }
        if status != reqwest::StatusCode::NOT_FOUND {
            bail!("{}", refusal(status, &reason_of(&text)));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
    }
}

/// `ebb send QUEUE [BODY] --wait-reply`: sends through the running host's API (with
/// `context` as its `traceparent`), then waits for the answer on the queue's reply queue
/// (each look at most 30 s, until `timeout`) and prints its body.
pub async fn send_wait_reply(
    config_path: &Path,
    token: &TokenArgs,
    queue: &str,
    body: Option<String>,
    timeout: Duration,
    context: Option<TraceContext>,
) -> Result<()> {
    let (config, token) = load(config_path, token)?;
    let Some(queue_config) = config.queues.iter().find(|q| q.name == queue) else {
        bail!("queue {queue} is not configured in {}", config_path.display());
    };
    check_wait_reply(config_path, &config, queue_config, timeout)?;
    let body = read_message(&config, queue_config, body)?;
    let http = client(token.as_deref())?;
    let base = api_base(&config);
    let sent = traced(http.post(format!("{base}/queues/{queue}/messages")), context.as_ref())
        .body(body)
        .send()
        .await
        .with_context(|| format!("no host answers at {base}: --wait-reply needs a running host"))?;
    let status = sent.status();
    let text = sent.text().await.unwrap_or_default();
    if !status.is_success() {
        bail!("{}", refusal(status, &reason_of(&text)));
    }
    let id = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["id"].as_str().map(str::to_owned))
        .context("the host's answer names no message id")?;
    let deadline = tokio::time::Instant::now() + timeout;
    let Some(text) = wait_for_reply(&http, &base, queue, &id, None, deadline).await? else {
        bail!("no reply to message {id} within {}", humantime::format_duration(timeout));
    };
    let reply: crate::listener::Reply = serde_json::from_str(&text).context("the host's reply is not a reply")?;
    use std::io::Write as _;
    super::end_quietly_when_output_closes();
    let mut out = std::io::stdout().lock();
    out.write_all(&reply.bytes())?;
    out.write_all(b"\n")?;
    Ok(())
}

/// Largest file of items `ebb send --items` reads.
const MAX_ITEMS_FILE_BYTES: u64 = 256 << 20;

/// `ebb send QUEUE --items FILE`: the NDJSON items of `path` (`-`: stdin), through the
/// running host's API in requests within its body limit, or packed here and put straight
/// into storage when no host runs. With `wait_reply` (through a running host only): then
/// waits up to that long for each item's answer and prints each reply's JSON on a line, in
/// the order of the items. Every item carries `context`, as the API's send of items does.
pub async fn send_items(
    config_path: &Path,
    token: &TokenArgs,
    queue: &str,
    path: &Path,
    wait_reply: Option<Duration>,
    context: Option<TraceContext>,
) -> Result<()> {
    let (config, token) = load(config_path, token)?;
    let Some(queue_config) = config.queues.iter().find(|q| q.name == queue) else {
        bail!("queue {queue} is not configured in {}", config_path.display());
    };
    if let Some(timeout) = wait_reply {
        check_wait_reply(config_path, &config, queue_config, timeout)?;
    }
    let text = if path == Path::new("-") {
        crate::input::read_stdin("the items", MAX_ITEMS_FILE_BYTES)?
    } else {
        crate::input::read_file("the items file", path, MAX_ITEMS_FILE_BYTES)?
    };
    let lines = item_lines(&text, path)?;
    let http = client(token.as_deref())?;
    let probe = http.get(format!("{}/healthz", api_base(&config))).send().await;
    if matches!(&probe, Err(error) if error.is_connect()) {
        if wait_reply.is_some() {
            bail!("no host answers at {}: --wait-reply needs a running host (nothing was sent)", api_base(&config));
        }
        return crate::telemetry::with_sending(context, send_items_offline(&config, queue_config, &lines, path)).await;
    }
    let (messages, ids) = post_items(&config, queue_config, &http, &lines, path, context.as_ref()).await?;
    let count = lines.len() as u64;
    let Some(timeout) = wait_reply else {
        super::end_quietly_when_output_closes();
        println!("sent {count} item{} in {} message{} to {queue} via {}", plural(count), messages.len(), plural(messages.len() as u64), api_base(&config));
        return Ok(());
    };
    if ids.len() as u64 != count {
        bail!("the host answered {} item ids for {count} items: cannot wait for their replies (an older host?)", ids.len());
    }
    print_item_replies(&http, &api_base(&config), queue, ids, timeout).await
}

/// The items of `text` (the file at `path`), one per line, blank lines skipped. Every line
/// is checked first, so a bad line sends nothing.
fn item_lines<'a>(text: &'a [u8], path: &Path) -> Result<Vec<&'a [u8]>> {
    let mut lines: Vec<&[u8]> = Vec::new();
    for (number, line) in text.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        crate::http::parse_items(line, true)
            .map_err(|(_, reason)| anyhow::anyhow!("{}: line {}: {}", path.display(), number + 1, reason.trim_start_matches("line 1: ")))?;
        lines.push(line);
    }
    if lines.is_empty() {
        bail!("{}: no items (one JSON value per line)", path.display());
    }
    Ok(lines)
}

/// `ebb send --items` with no host running: the items packed here and put straight into
/// storage.
async fn send_items_offline(config: &Config, queue: &QueueConfig, lines: &[&[u8]], path: &Path) -> Result<()> {
    let handle = offline_producer(config, queue).await?;
    let mut messages = 0;
    for chunk in lines.chunks(crate::service::packing::MAX_ITEMS_PER_SEND) {
        let items = chunk
            .iter()
            .map(|line| crate::http::parse_items(line, true).map(|mut one| one.remove(0)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|(_, reason)| anyhow::anyhow!("{reason}"))?;
        let sent = within_storage_bound(format!("failed to send the items of {}", path.display()), handle.send_items(items)).await?;
        messages += sent.messages.len();
    }
    let count = lines.len() as u64;
    super::end_quietly_when_output_closes();
    println!(
        "sent {count} item{} in {messages} message{} to {} (no host running: written straight to storage)",
        plural(count),
        plural(messages as u64),
        queue.name
    );
    Ok(())
}

/// The items' message ids, and each item's id in the order of the lines.
type PostedItems = (std::collections::BTreeSet<String>, Vec<(String, u32)>);

/// Sends `lines` through the running host's API: in requests within its body limit and item
/// count, side by side, so the host packs them together. Each body is made when its request
/// is, so the file is held once, not twice: at most the 16 requests in flight are copies of it.
/// Each request carries `context` as its `traceparent` and `tracestate`.
async fn post_items(
    config: &Config,
    queue: &QueueConfig,
    http: &reqwest::Client,
    lines: &[&[u8]],
    path: &Path,
    context: Option<&TraceContext>,
) -> Result<PostedItems> {
    let (item_key, item_limit) = item_limit(config, queue);
    if let Some((number, line)) = lines.iter().enumerate().find(|(_, line)| line.len() + 1 > item_limit) {
        bail!("{}: item {} is {} bytes, over the API's body limit ({item_key}: {item_limit} bytes)", path.display(), number + 1, line.len());
    }
    let url = format!("{}/queues/{}/items", api_base(config), queue.name);
    let mut sends = futures::stream::iter(item_bodies(lines, config.max_message_bytes))
        .map(|body| post_item_body(http, &url, bytes::Bytes::from(body), context))
        // In order: the items' ids line up with the file's lines.
        .buffered(16);
    let mut messages = std::collections::BTreeSet::new();
    let mut ids = Vec::new();
    while let Some(sent) = sends.next().await {
        let (sent_messages, sent_ids) = sent?;
        messages.extend(sent_messages);
        ids.extend(sent_ids);
    }
    Ok((messages, ids))
}

/// The largest item the API takes in a request, and the key that sets it: an item larger
/// than a message goes alone, up to what the host takes in one send of items on a queue
/// with a claim store (its max_claim_check_bytes, at most the packing buffer).
fn item_limit(config: &Config, queue: &QueueConfig) -> (&'static str, usize) {
    let limit = config.max_message_bytes;
    if queue.storage_queues().len() == 1 {
        (
            "max_claim_check_bytes, at most 16 MiB in one send of items",
            queue.claims.max_bytes.min(crate::service::packing::LINGER_BUFFER_BYTES as u64).max(limit as u64) as usize,
        )
    } else {
        ("max_message_bytes", limit)
    }
}

/// The NDJSON bodies of `lines`: each within `limit` bytes (but for an item larger alone)
/// and [`crate::service::packing::MAX_ITEMS_PER_SEND`] items.
fn item_bodies<'a>(lines: &'a [&'a [u8]], limit: usize) -> impl Iterator<Item = Vec<u8>> + 'a {
    let mut rest = lines;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut body = Vec::new();
        let mut taken = 0;
        while let Some(line) = rest.get(taken) {
            if taken == crate::service::packing::MAX_ITEMS_PER_SEND || (taken > 0 && body.len() + line.len() + 1 > limit) {
                break;
            }
            body.extend_from_slice(line);
            body.push(b'\n');
            taken += 1;
        }
        rest = &rest[taken..];
        Some(body)
    })
}

/// Posts one NDJSON `body` of items to `url` (retried while the host is busy): the ids of
/// the messages they went in, and each item's id.
async fn post_item_body(http: &reqwest::Client, url: &str, body: bytes::Bytes, context: Option<&TraceContext>) -> Result<(Vec<String>, Vec<(String, u32)>)> {
    let make = move || traced(http.post(url), context).header(reqwest::header::CONTENT_TYPE, "application/x-ndjson").body(body.clone());
    let response = send_retrying_busy(make).await?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    if !status.is_success() {
        bail!("{}", refusal(status, &reason_of(&text)));
    }
    let answer: serde_json::Value = serde_json::from_str(&text).context("the host's answer is not JSON")?;
    let messages = answer["messages"].as_array().map_or(Vec::new(), |ids| ids.iter().filter_map(|id| id.as_str().map(str::to_owned)).collect::<Vec<_>>());
    let ids: Vec<(String, u32)> = answer["ids"].as_array().map_or(Vec::new(), |ids| {
        ids.iter().filter_map(|id| Some((id["message_id"].as_str()?.to_owned(), u32::try_from(id["item"].as_u64()?).ok()?))).collect()
    });
    Ok((messages, ids))
}

/// Waits until `timeout` from now for each item's answer, and prints each reply's JSON on a
/// line, in the order of `ids`.
async fn print_item_replies(http: &reqwest::Client, base: &str, queue: &str, ids: Vec<(String, u32)>, timeout: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    use std::io::Write as _;
    for (message_id, item) in ids {
        let Some(text) = wait_for_reply(http, base, queue, &message_id, Some(item), deadline).await? else {
            bail!("no reply to item {item} of message {message_id} within {}", humantime::format_duration(timeout));
        };
        let reply: Value = serde_json::from_str(&text).context("the host's reply is not JSON")?;
        super::end_quietly_when_output_closes();
        let mut out = std::io::stdout().lock();
        serde_json::to_writer(&mut out, &reply)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// How long one send keeps trying while the host answers 503 with `Retry-After`.
const BUSY_RETRY_FOR: Duration = Duration::from_secs(60);

/// Sends the request `make` builds, retrying it while the host is too busy for it.
async fn retry_busy_send(make: impl Fn() -> reqwest::RequestBuilder) -> Result<()> {
    retry_busy(make().send().await, make).await
}

/// [`retry_busy`], the final answer given back rather than checked.
async fn send_retrying_busy(make: impl Fn() -> reqwest::RequestBuilder) -> Result<reqwest::Response> {
    answer_retrying_busy(make().send().await, make).await
}

/// Checks `first` (the answer to a request `make` builds), retried while the host is busy
/// ([`answer_retrying_busy`]).
async fn retry_busy(first: reqwest::Result<reqwest::Response>, make: impl Fn() -> reqwest::RequestBuilder) -> Result<()> {
    check_response(answer_retrying_busy(first, make).await?).await
}

/// While `first` is a 503 with `Retry-After` (the host busy: its request slots, or its
/// large-body places, taken), waits that long (at most 5 s) and sends again, for up to
/// [`BUSY_RETRY_FOR`]; the last answer.
async fn answer_retrying_busy(first: reqwest::Result<reqwest::Response>, make: impl Fn() -> reqwest::RequestBuilder) -> Result<reqwest::Response> {
    let deadline = tokio::time::Instant::now() + BUSY_RETRY_FOR;
    let mut answer = first?;
    loop {
        let retry_after = answer.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
        match retry_after {
            Some(seconds) if answer.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_secs(seconds.clamp(1, 5))).await;
                answer = make().send().await?;
            }
            _ => return Ok(answer),
        }
    }
}

async fn check_response(response: reqwest::Response) -> Result<()> {
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        bail!("{}", refusal(status, &reason_of(&text)));
    }
    Ok(())
}

/// What a refused request says: the status and the host's reason, and for a 401 or a 403 what
/// to do about it (the host knows no such token, or knows it as a read token).
pub(super) fn refusal(status: reqwest::StatusCode, reason: &str) -> String {
    let ways = format!("--token-name NAME or {} for a configured one, or {} set to its secret", crate::config::TOKEN_NAME_ENV, crate::config::TOKEN_ENV);
    match status {
        reqwest::StatusCode::UNAUTHORIZED => format!(
            "the host answered {status}: {reason}\nthe host does not accept the token this command sends (or it sent none): give one of the host's tokens ({ways})"
        ),
        reqwest::StatusCode::FORBIDDEN => format!(
            "the host answered {status}: {reason}\nthe token this command sends has role read on that host: use an admin token to change anything ({ways})"
        ),
        _ => format!("the host answered {status}: {reason}"),
    }
}

/// The host's reason in the text of an answer: its JSON `error`, else the text as it is.
pub(super) fn reason_of(text: &str) -> String {
    serde_json::from_str::<Value>(text).ok().and_then(|v| v["error"].as_str().map(str::to_string)).unwrap_or_else(|| text.trim().to_string())
}

pub(super) fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// A JSON value as a table cell: strings without quotes, `-` for null or missing.
pub(super) fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
