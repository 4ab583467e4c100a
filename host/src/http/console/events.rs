//! `GET /events`: the console's server push, as server-sent events read with `fetch` (an
//! `EventSource` cannot send the `Authorization` header).
//!
//! One task per API server ([`Console`]) reads every queue's status every [`PUSH_EVERY`]
//! while a page watches (every [`SAMPLE_EVERY`] otherwise), keeps the last hour of samples
//! per queue ([`SAMPLES_KEPT`] points, fixed memory per queue) and publishes the latest frame
//! on a `watch` channel. Each client sends what changed since the frame it last sent: a
//! client that reads slowly skips frames (the channel holds only the latest) and catches up
//! on the samples it missed from the bounded history, so no client makes the host buffer.
//! At most [`MAX_EVENT_CLIENTS`] streams are open at once, at most [`MAX_READ_EVENT_CLIENTS`]
//! of them a read token's.
//!
//! Events: `hello` (the host, every queue and the history, once), `update` (the host if
//! changed, the queues whose figures changed), `samples` (the points taken since the last
//! ones sent); a comment every [`KEEP_ALIVE`] when nothing else went out, so the connection
//! is never idle long enough for `api_limits.idle_timeout`.

use std::collections::{BTreeSet, VecDeque};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::Extension;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ApiRole;
use crate::cost::CostStatus;
use crate::health::ReadinessPart;
use crate::http::errors::error;
use crate::http::{Api, Caller, queue_cost};
use crate::listener::ListenerStatus;

/// How often a watched page gets the figures that changed.
pub const PUSH_EVERY: Duration = Duration::from_secs(2);
/// How often every queue's figures are kept for the charts, watched or not.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// Samples kept per queue: the last hour at [`SAMPLE_EVERY`].
pub const SAMPLES_KEPT: usize = 360;
/// Most event streams open at once; more get 503.
pub const MAX_EVENT_CLIENTS: usize = 8;
/// Most of them read tokens hold: the rest are kept for admin tokens, so read-only viewers
/// (a wall display, a team's tabs) cannot lock the operators out of the console.
pub const MAX_READ_EVENT_CLIENTS: usize = 6;
/// Longest time a stream goes without a byte.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Processed counts kept per queue for the throughput: about 10 s at [`PUSH_EVERY`].
const THROUGHPUT_POINTS: usize = 6;

/// One sample of a queue: depth, throughput (messages per second), pickup latency (ms; NaN,
/// sent as `null`, when nothing was picked up since the sample before), active tasks. `f32`
/// keeps 360 of them per queue at 5.6 KiB.
type Point = [f32; 4];

struct Series {
    points: VecDeque<Point>,
    /// (when, processed so far, settled so far), the last few reads, for the throughput and
    /// whether anything was picked up lately.
    processed: VecDeque<(Instant, u64, u64)>,
    /// Messages settled (handled, failed or poisoned) when the last sample was taken.
    settled_at_sample: u64,
}

struct History {
    series: Vec<Series>,
    /// When each kept sample was taken, ms since the epoch.
    times_ms: VecDeque<u64>,
    /// Samples taken since start (the newest has number `taken`).
    taken: u64,
    next_sample: Instant,
}

/// What the task publishes at each tick.
pub(crate) struct Frame {
    /// One JSON object per queue partition, in the order of the API's listeners; an object
    /// whose figures did not change is the previous frame's `Arc`.
    rows: Vec<Arc<str>>,
    host: Arc<str>,
    /// Samples taken so far.
    samples_taken: u64,
}

/// The console's shared state: the history, the latest frame, the stream slots.
pub(crate) struct Console {
    api: Arc<Api>,
    /// Queue partition names, in the order of the frames' rows.
    names: Vec<String>,
    history: Mutex<History>,
    frames: watch::Sender<Arc<Frame>>,
    clients: Arc<Semaphore>,
    /// The read tokens' share of `clients`.
    read_clients: Arc<Semaphore>,
    closing: CancellationToken,
    /// The wall clock and the monotonic clock at start: sample times are the first plus
    /// the second's elapsed time, so they never go back when the system clock is set.
    started: (SystemTime, Instant),
}

fn round(value: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (value * scale).round() / scale
}

fn cost_json(cost: &CostStatus) -> serde_json::Value {
    json!({
        "transactions_per_hour": round(cost.transactions_per_hour, 0),
        "usd_per_hour": round(cost.usd_per_month / crate::cost::HOURS_PER_MONTH, 5),
        "usd_per_month": round(cost.usd_per_month, 3),
        "idle_usd_per_month": round(cost.idle_usd_per_month, 3),
    })
}

/// A queue's row: what the table shows. Only figures that change with the queue's state
/// (no timestamps), so an idle queue's row stays the same and is not sent again.
/// `pickup_ms`: the pickup latency, `None` when nothing was picked up lately. `not_ready`: why
/// its storage cannot work now (`/readyz`'s storage or credential problem).
fn row_json(logical: &str, status: &ListenerStatus, throughput: f64, pickup_ms: Option<u64>, price: f64, not_ready: Option<&str>) -> String {
    let cost = queue_cost(status, price);
    let rule = status.rule.as_ref();
    // The last call of an export faulted (the built-in rule decided instead); a quarantined
    // rule is shown as such.
    let faulting = rule.is_some_and(|r| {
        let f = &r.consecutive_faults;
        !r.quarantined && f.optimal_dequeue_task_count + f.on_queue_empty + f.max_concurrent_calls + f.on_handler_failure + f.rebuild > 0
    });
    json!({
        "queue": status.queue,
        "logical": logical,
        "depth": status.approximate_depth,
        "active_tasks": status.active_tasks,
        "target_tasks": status.target_tasks,
        "in_flight": status.in_flight,
        "throughput_per_sec": round(throughput, 2),
        "pickup_latency_ms": pickup_ms,
        "cost": cost.as_ref().map(cost_json),
        "paused": status.paused,
        "processed": status.processed,
        "failed": status.failed,
        "poisoned": status.poisoned,
        "rule": rule.map(|r| json!({
            "state": r.state,
            "file": r.file,
            "sha256": r.sha256,
            "contract": r.contract,
            "quarantined": r.quarantined,
            "faulting": faulting,
            "swaps": r.swaps.len(),
        })),
        "not_ready": not_ready,
        "last_task_count": status.last_task_count.as_ref().map(|d| json!({ "value": d.decision.value, "source": d.decision.source })),
    })
    .to_string()
}

impl Console {
    /// The console of `api`: its first sample taken now, its task started (when a runtime
    /// runs), ended by `closing` or when the console is dropped. Streams end with `closing`.
    pub(crate) fn start(api: Arc<Api>, closing: CancellationToken) -> Arc<Console> {
        let names: Vec<String> = api.listeners.values().flatten().map(|l| l.queue_name().to_string()).collect();
        let now = Instant::now();
        let history = History {
            series: names.iter().map(|_| Series { points: VecDeque::new(), processed: VecDeque::new(), settled_at_sample: 0 }).collect(),
            times_ms: VecDeque::new(),
            taken: 0,
            next_sample: now,
        };
        let (frames, _) = watch::channel(Arc::new(Frame { rows: Vec::new(), host: Arc::from("{}"), samples_taken: 0 }));
        let console = Arc::new(Console {
            api,
            names,
            history: Mutex::new(history),
            frames,
            clients: Arc::new(Semaphore::new(MAX_EVENT_CLIENTS)),
            read_clients: Arc::new(Semaphore::new(MAX_READ_EVENT_CLIENTS)),
            closing,
            started: (SystemTime::now(), now),
        });
        console.tick(false);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(run(Arc::downgrade(&console), console.closing.clone()));
        }
        console
    }

    /// Whether a page watches now.
    fn watched(&self) -> bool {
        self.clients.available_permits() < MAX_EVENT_CLIENTS
    }

    /// Reads every queue's status, takes a sample when one is due, publishes the frame.
    /// `watched`: a page is open, so the depth may be counted (at most once per
    /// `DEPTH_MAX_AGE`, as `/status` does); unwatched samples never cost a transaction.
    fn tick(&self, watched: bool) {
        let api = &self.api;
        let price = api.host_price();
        let now = Instant::now();
        let mut history = self.history.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let sample = now >= history.next_sample;
        if sample {
            history.next_sample = now + SAMPLE_EVERY;
        }
        let previous = self.frames.borrow().clone();
        let mut rows = Vec::with_capacity(self.names.len());
        let mut costs = Vec::new();
        // Logical queues paused, as the header counts queues: a queue is paused whole, so its
        // partitions are one.
        let mut paused = BTreeSet::new();
        let readiness = api.readiness.snapshot();
        let not_ready = |logical: &str| {
            let problems = &readiness.get(logical)?.problems;
            problems.get(&ReadinessPart::Storage).or_else(|| problems.get(&ReadinessPart::Credential)).map(String::as_str)
        };
        let listeners = api.listeners.iter().flat_map(|(logical, listeners)| listeners.iter().map(move |l| (logical, l)));
        for (index, (logical, listener)) in listeners.enumerate() {
            let status = if watched { listener.status() } else { listener.status_as_is() };
            let Some(series) = history.series.get_mut(index) else { break };
            let settled = status.processed.saturating_add(status.failed).saturating_add(status.poisoned);
            series.processed.push_back((now, status.processed, settled));
            if series.processed.len() > THROUGHPUT_POINTS {
                series.processed.pop_front();
            }
            let (throughput, settled_lately) = match series.processed.front() {
                Some(&(at, processed, settled_then)) if now > at => {
                    (status.processed.saturating_sub(processed) as f64 / now.duration_since(at).as_secs_f64(), settled > settled_then)
                }
                _ => (0.0, false),
            };
            // The pickup latency is the last get's: it holds while nothing is picked up, so
            // it is shown only while messages are (settled lately, or held now).
            let picking = status.in_flight > 0;
            if sample {
                if series.points.len() == SAMPLES_KEPT {
                    series.points.pop_front();
                }
                let picked = picking || settled > series.settled_at_sample;
                series.settled_at_sample = settled;
                let pickup = status.pickup_latency_ms.filter(|_| picked).map_or(f32::NAN, |ms| ms as f32);
                series.points.push_back([status.approximate_depth as f32, round(throughput, 2) as f32, pickup, status.active_tasks as f32]);
            }
            let queue_price = api.price_of(logical);
            costs.extend(queue_cost(&status, queue_price));
            if status.paused.is_some() {
                paused.insert(logical);
            }
            let pickup = status.pickup_latency_ms.filter(|_| picking || settled_lately);
            let row = row_json(logical, &status, throughput, pickup, queue_price, not_ready(logical));
            rows.push(match previous.rows.get(index) {
                Some(old) if **old == *row => old.clone(),
                _ => Arc::from(row),
            });
        }
        if sample {
            if history.times_ms.len() == SAMPLES_KEPT {
                history.times_ms.pop_front();
            }
            let (wall, monotonic) = self.started;
            history.times_ms.push_back(epoch_ms(wall).saturating_add(u64::try_from(now.duration_since(monotonic).as_millis()).unwrap_or(u64::MAX)));
            history.taken += 1;
        }
        let host = json!({
            "version": env!("CARGO_PKG_VERSION"),
            // Logical queues; their partitions are `partitions` rows.
            "queues": api.listeners.len(),
            "partitions": self.names.len(),
            "paused": paused.len(),
            "bus": api.bus.as_ref().map(|b| { let s = b.status(); json!({ "engine": s.engine, "connected": s.connected }) }),
            "cost": cost_json(&CostStatus::total(&costs, price)),
        })
        .to_string();
        let host = if *previous.host == *host { previous.host.clone() } else { Arc::from(host) };
        let samples_taken = history.taken;
        drop(history);
        self.frames.send_replace(Arc::new(Frame { rows, host, samples_taken }));
    }

    /// The `samples` data of the points taken after the first `after`: `{"times_ms": [...],
    /// "series": {"queue": [[depth, throughput, pickup_ms, tasks], ...]}}`.
    fn samples_since(&self, after: u64) -> String {
        let history = self.history.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let new = usize::try_from(history.taken.saturating_sub(after)).unwrap_or(usize::MAX).min(history.times_ms.len());
        let skip = history.times_ms.len() - new;
        let times: Vec<u64> = history.times_ms.iter().skip(skip).copied().collect();
        let mut series = serde_json::Map::new();
        for (name, s) in self.names.iter().zip(&history.series) {
            let skip = s.points.len().saturating_sub(new);
            series.insert(name.clone(), json!(s.points.iter().skip(skip).collect::<Vec<_>>()));
        }
        json!({ "times_ms": times, "series": series }).to_string()
    }
}

fn epoch_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The console's task: a tick every [`PUSH_EVERY`] while a page watches, else only when a
/// sample is due.
async fn run(console: Weak<Console>, closing: CancellationToken) {
    let mut ticks = tokio::time::interval(PUSH_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = closing.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let Some(console) = console.upgrade() else { return };
        let watched = console.watched();
        let due = Instant::now() >= console.history.lock().unwrap_or_else(std::sync::PoisonError::into_inner).next_sample;
        if watched || due {
            // Reading a thousand statuses takes milliseconds: off the async threads.
            let reader = console.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || reader.tick(watched)).await {
                tracing::error!("the console's sampler failed: {e}");
            }
        }
    }
}

/// One event: its name and JSON data (one line: JSON holds no raw newline).
fn event(out: &mut String, name: &str, data: &str) {
    let _ = write!(out, "event: {name}\ndata: {data}\n\n");
}

/// One open stream.
struct Client {
    console: Arc<Console>,
    frames: watch::Receiver<Arc<Frame>>,
    /// The rows and host last sent (compared by pointer: an unchanged row is the same `Arc`).
    sent: Option<Arc<Frame>>,
    samples_sent: u64,
    keep_alive_at: Instant,
    _slot: OwnedSemaphorePermit,
    /// A read token's stream also holds one of the read tokens' share.
    _read_slot: Option<OwnedSemaphorePermit>,
}

impl Client {
    fn hello(&mut self) -> String {
        let frame = self.frames.borrow_and_update().clone();
        let console = &self.console;
        let mut data = format!(
            "{{\"version\":{},\"push_every_ms\":{},\"sample_every_ms\":{},\"samples_kept\":{},\"host\":{},\"queues\":[",
            json!(env!("CARGO_PKG_VERSION")),
            PUSH_EVERY.as_millis(),
            SAMPLE_EVERY.as_millis(),
            SAMPLES_KEPT,
            frame.host
        );
        for (i, row) in frame.rows.iter().enumerate() {
            if i > 0 {
                data.push(',');
            }
            data.push_str(row);
        }
        let _ = write!(data, "],\"history\":{}}}", console.samples_since(0));
        self.samples_sent = frame.samples_taken;
        self.sent = Some(frame);
        let mut out = String::new();
        event(&mut out, "hello", &data);
        out
    }

    /// What changed since the last frame sent, if anything.
    fn update(&mut self) -> Option<String> {
        let frame = self.frames.borrow_and_update().clone();
        let mut out = String::new();
        if frame.samples_taken > self.samples_sent {
            event(&mut out, "samples", &self.console.samples_since(self.samples_sent));
            self.samples_sent = frame.samples_taken;
        }
        let sent = self.sent.as_ref();
        let changed: Vec<&Arc<str>> = frame
            .rows
            .iter()
            .enumerate()
            .filter(|(i, row)| sent.and_then(|s| s.rows.get(*i)).is_none_or(|old| !Arc::ptr_eq(old, row)))
            .map(|(_, row)| row)
            .collect();
        let host_changed = sent.is_none_or(|s| !Arc::ptr_eq(&s.host, &frame.host));
        if !changed.is_empty() || host_changed {
            let mut data = String::from("{");
            if host_changed {
                let _ = write!(data, "\"host\":{},", frame.host);
            }
            data.push_str("\"queues\":[");
            for (i, row) in changed.iter().enumerate() {
                if i > 0 {
                    data.push(',');
                }
                data.push_str(row);
            }
            data.push_str("]}");
            event(&mut out, "update", &data);
        }
        self.sent = Some(frame);
        (!out.is_empty()).then_some(out)
    }

    /// The next chunk to write; `None` ends the stream (the server closes).
    async fn next(&mut self) -> Option<String> {
        loop {
            tokio::select! {
                biased;
                () = self.console.closing.cancelled() => return None,
                changed = self.frames.changed() => {
                    changed.ok()?;
                    if let Some(out) = self.update() {
                        return Some(out);
                    }
                }
                () = tokio::time::sleep_until(self.keep_alive_at) => return Some(": keep-alive\n\n".to_string()),
            }
        }
    }
}

/// `GET /events`: the stream (503 beyond [`MAX_EVENT_CLIENTS`], or for a read token beyond
/// its share, [`MAX_READ_EVENT_CLIENTS`]).
pub(crate) async fn events(Extension(console): Extension<Arc<Console>>, Extension(caller): Extension<Caller>) -> Response {
    let read_slot = match caller.role {
        ApiRole::Admin => None,
        ApiRole::Read => match console.read_clients.clone().try_acquire_owned() {
            Ok(slot) => Some(slot),
            Err(_) => {
                let reason = format!(
                    "read tokens hold {MAX_READ_EVENT_CLIENTS} of the console's {MAX_EVENT_CLIENTS} event streams already (the other {} are kept for admin tokens); try again later",
                    MAX_EVENT_CLIENTS - MAX_READ_EVENT_CLIENTS
                );
                let mut response = error(StatusCode::SERVICE_UNAVAILABLE, reason);
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("10"));
                return response;
            }
        },
    };
    let Ok(slot) = console.clients.clone().try_acquire_owned() else {
        let mut response =
            error(StatusCode::SERVICE_UNAVAILABLE, format!("the console's event stream has its {MAX_EVENT_CLIENTS} clients already; try again later"));
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("10"));
        return response;
    };
    let frames = console.frames.subscribe();
    let mut client = Client { console, frames, sent: None, samples_sent: 0, keep_alive_at: Instant::now() + KEEP_ALIVE, _slot: slot, _read_slot: read_slot };
    let first = client.hello();
    let rest = futures::stream::unfold(client, |mut client| async move {
        let chunk = client.next().await?;
        client.keep_alive_at = Instant::now() + KEEP_ALIVE;
        Some((Ok::<_, Infallible>(Bytes::from(chunk)), client))
    });
    let stream = futures::StreamExt::chain(futures::stream::once(async move { Ok::<_, Infallible>(Bytes::from(first)) }), rest);
    let mut response = Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    super::protect(headers);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
