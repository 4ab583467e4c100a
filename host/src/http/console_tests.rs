//! The event stream in process, on tokio's paused clock: the hour kept per queue, updates
//! that carry only what changed, the bound on streams, streams that end with the server,
//! and the headers of the page. Beside `console` rather than in it: it drives the whole
//! router (`routes`), which mounts the console.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use async_trait::async_trait;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;

use super::console::events::{MAX_EVENT_CLIENTS, PUSH_EVERY, SAMPLE_EVERY, SAMPLES_KEPT};
use crate::handler::{Handler, IncomingMessage};
use crate::health::Health;
use crate::http::{Api, ApiLimits};
use crate::listener::Listener;
use crate::queue::memory::MemoryQueue;
use crate::queue::{QueueClient, TokioClock};

const TOKEN: &str = "t0ken";
/// The read token `viewer`.
const READ_TOKEN: &str = "r3ad";

struct NoHandler;

#[async_trait]
impl Handler for NoHandler {
    async fn handle(&self, _message: &IncomingMessage) -> anyhow::Result<()> {
        anyhow::bail!("no listener is started in these tests")
    }
}

/// An API over two in-memory queues, `alpha` and `beta` (listeners built, not started), and
/// its router; the queues to put messages in.
fn api(closing: CancellationToken) -> (axum::Router, BTreeMap<String, Arc<dyn QueueClient>>) {
    let clock = Arc::new(TokioClock::new());
    let mut listeners = BTreeMap::new();
    let mut handles = BTreeMap::new();
    let mut queues = BTreeMap::new();
    for name in ["alpha", "beta"] {
        let queue: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new(name, clock.clone(), 1024));
        let poison: Arc<dyn QueueClient> = Arc::new(MemoryQueue::new(&format!("{name}-poison"), clock.clone(), 1024));
        let listener = Listener::builder(queue.clone(), poison, Arc::new(NoHandler)).build();
        handles.insert(name.to_string(), crate::service::QueueHandle::new(name, queue.clone(), vec![listener.clone()]));
        listeners.insert(name.to_string(), vec![listener]);
        queues.insert(name.to_string(), queue);
    }
    let api = Api {
        listeners,
        handles,
        tokens: vec![
            crate::config::ApiToken { name: "default".into(), role: crate::config::ApiRole::Admin, secret: TOKEN.to_string() },
            crate::config::ApiToken { name: "viewer".into(), role: crate::config::ApiRole::Read, secret: READ_TOKEN.to_string() },
        ],
        health: Health::default(),
        readiness: Default::default(),
        bus: None,
        audit: None,
        price_per_10k_transactions: crate::cost::PAPER_PRICE_PER_10K,
        queue_prices: Default::default(),
    };
    (super::routes::router_until(Arc::new(api), ApiLimits::default(), closing), queues)
}

async fn call(router: &axum::Router, path: &str, token: Option<&str>) -> axum::response::Response {
    let mut request = Request::get(path);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    tower_service::Service::call(&mut router.clone(), request.body(Body::empty()).unwrap()).await.unwrap_or_else(|never| match never {})
}

/// The events of a stream, one chunk at a time.
struct Events(axum::body::BodyDataStream);

impl Events {
    async fn open(router: &axum::Router) -> Result<Events> {
        Events::open_as(router, TOKEN).await
    }

    async fn open_as(router: &axum::Router, token: &str) -> Result<Events> {
        let response = call(router, "/events", Some(token)).await;
        ensure!(response.status() == StatusCode::OK, "GET /events: {}", response.status());
        ensure!(response.headers()[header::CONTENT_TYPE] == "text/event-stream");
        Ok(Events(response.into_body().into_data_stream()))
    }

    /// The next chunk as (event name, JSON data) pairs; `None` once the stream ended.
    async fn next(&mut self) -> Result<Option<Vec<(String, serde_json::Value)>>> {
        let Some(chunk) = self.0.next().await else { return Ok(None) };
        let text = String::from_utf8(chunk?.to_vec())?;
        let mut events = Vec::new();
        for block in text.split("\n\n").filter(|b| !b.is_empty() && !b.starts_with(':')) {
            let name = block.lines().find_map(|l| l.strip_prefix("event: ")).context("an event without a name")?;
            let data = block.lines().find_map(|l| l.strip_prefix("data: ")).context("an event without data")?;
            events.push((name.to_string(), serde_json::from_str(data)?));
        }
        Ok(Some(events))
    }
}

fn queue_names(update: &serde_json::Value) -> Vec<String> {
    update["queues"].as_array().unwrap().iter().map(|q| q["queue"].as_str().unwrap().to_string()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_stream_starts_with_every_queue_then_sends_only_the_queues_that_changed() -> Result<()> {
    let (router, queues) = api(CancellationToken::new());
    let mut events = Events::open(&router).await?;
    let hello = events.next().await?.context("no hello")?;
    let (name, data) = &hello[0];
    assert_eq!(name, "hello");
    assert_eq!(queue_names(data), ["alpha", "beta"]);
    assert_eq!(data["history"]["times_ms"].as_array().map(Vec::len), Some(1), "the first sample is taken at start");

    queues["beta"].put(b"one", Duration::ZERO).await?;
    let update = events.next().await?.context("the stream ended")?;
    let (name, data) = update.iter().find(|(n, _)| n == "update").context("no update")?;
    assert_eq!(name, "update");
    assert_eq!(queue_names(data), ["beta"], "alpha did not change: {data}");
    assert_eq!(data["queues"][0]["depth"], 1);
    assert!(data.get("host").is_none(), "the host's figures did not change: {data}");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn an_idle_stream_sends_no_update_and_never_stays_silent_past_the_keep_alive() -> Result<()> {
    let (router, _queues) = api(CancellationToken::new());
    let mut events = Events::open(&router).await?;
    events.next().await?.context("no hello")?;
    let mut last = tokio::time::Instant::now();
    let end = last + ApiLimits::default().idle_timeout * 3;
    while last < end {
        let chunk = events.next().await?.context("the stream ended")?;
        let gap = last.elapsed();
        assert!(gap <= super::console::events::KEEP_ALIVE, "{gap:?} without a byte");
        assert!(chunk.iter().all(|(name, _)| name == "samples"), "an event while nothing changed: {chunk:?}");
        last = tokio::time::Instant::now();
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn the_history_keeps_the_last_hour_and_a_late_stream_gets_it_whole() -> Result<()> {
    let (router, queues) = api(CancellationToken::new());
    queues["alpha"].put(b"one", Duration::ZERO).await?;
    // Two hours with no page open: samples go on every 10 s, the oldest dropped.
    tokio::time::sleep(Duration::from_secs(2 * 3600)).await;
    let mut events = Events::open(&router).await?;
    let hello = events.next().await?.context("no hello")?;
    let history = &hello[0].1["history"];
    let times = history["times_ms"].as_array().context("no times")?;
    assert_eq!(times.len(), SAMPLES_KEPT);
    let span = times.last().unwrap().as_u64().unwrap() - times[0].as_u64().unwrap();
    assert!(span >= (SAMPLE_EVERY * (SAMPLES_KEPT as u32 - 2)).as_millis() as u64, "the samples cover {span} ms");
    let alpha = history["series"]["alpha"].as_array().context("no alpha")?;
    assert_eq!(alpha.len(), SAMPLES_KEPT);
    assert!(alpha.iter().all(|p| p[0] == 1.0), "alpha's depth was 1 throughout");

    // The next sample reaches the stream as one point per queue.
    let deadline = tokio::time::Instant::now() + SAMPLE_EVERY + PUSH_EVERY;
    loop {
        let chunk = events.next().await?.context("the stream ended")?;
        if let Some((_, samples)) = chunk.iter().find(|(n, _)| n == "samples") {
            assert_eq!(samples["times_ms"].as_array().map(Vec::len), Some(1));
            assert_eq!(samples["series"]["beta"].as_array().map(Vec::len), Some(1));
            break;
        }
        ensure!(tokio::time::Instant::now() < deadline, "no samples event within a sample period");
    }
    Ok(())
}

/// Samples say when nothing was picked up: no pickup latency (`null`), not a zero that reads
/// as an instant pickup (a pickup carried forward is the browser test's).
#[tokio::test(start_paused = true)]
async fn a_queue_that_picked_nothing_up_has_no_pickup_latency_in_its_samples_or_row() -> Result<()> {
    let (router, _queues) = api(CancellationToken::new());
    tokio::time::sleep(SAMPLE_EVERY * 3).await;
    let mut events = Events::open(&router).await?;
    let hello = events.next().await?.context("no hello")?;
    let data = &hello[0].1;
    let alpha = data["history"]["series"]["alpha"].as_array().context("no alpha")?;
    ensure!(alpha.len() >= 3, "samples of alpha: {alpha:?}");
    assert!(alpha.iter().all(|p| p[2].is_null()), "the pickup latencies of a queue that picked nothing up: {alpha:?}");
    assert!(data["queues"][0]["pickup_latency_ms"].is_null(), "alpha's row: {}", data["queues"][0]);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn streams_beyond_the_limit_get_503_until_one_closes() -> Result<()> {
    let (router, _queues) = api(CancellationToken::new());
    let mut open = Vec::new();
    for _ in 0..MAX_EVENT_CLIENTS {
        open.push(Events::open(&router).await?);
    }
    let refused = call(&router, "/events", Some(TOKEN)).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().contains_key(header::RETRY_AFTER));
    open.pop();
    Events::open(&router).await?;
    Ok(())
}

/// Attack pass, defect 18: read tokens could hold all the streams, and an admin then had no
/// console. Read tokens get at most a share of the streams; the rest stay an admin's.
#[tokio::test(start_paused = true)]
async fn read_tokens_cannot_take_the_streams_an_admin_needs() -> Result<()> {
    let (router, _queues) = api(CancellationToken::new());
    let mut open = Vec::new();
    while open.len() < MAX_EVENT_CLIENTS {
        let response = call(&router, "/events", Some(READ_TOKEN)).await;
        if response.status() != StatusCode::OK {
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            let body = axum::body::to_bytes(response.into_body(), 1 << 16).await?;
            ensure!(String::from_utf8_lossy(&body).contains("read tokens"), "the refusal says why: {}", String::from_utf8_lossy(&body));
            break;
        }
        open.push(response);
    }
    let read_streams = open.len();
    ensure!(read_streams < MAX_EVENT_CLIENTS, "read tokens took all {read_streams} streams");
    ensure!(read_streams >= MAX_EVENT_CLIENTS / 2, "read tokens got only {read_streams} streams");
    let mut admin = Vec::new();
    for _ in read_streams..MAX_EVENT_CLIENTS {
        admin.push(Events::open_as(&router, TOKEN).await.context("an admin's stream")?);
    }
    ensure!(call(&router, "/events", Some(TOKEN)).await.status() == StatusCode::SERVICE_UNAVAILABLE, "the total is still the limit");
    // A read stream closed frees a read slot.
    open.pop();
    ensure!(call(&router, "/events", Some(READ_TOKEN)).await.status() == StatusCode::OK);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn streams_end_when_the_server_closes() -> Result<()> {
    let closing = CancellationToken::new();
    let (router, _queues) = api(closing.clone());
    let mut events = Events::open(&router).await?;
    events.next().await?.context("no hello")?;
    closing.cancel();
    assert!(events.next().await?.is_none(), "the stream went on after the server closed");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn the_page_needs_no_token_and_is_protected_while_its_data_needs_one() -> Result<()> {
    let (router, _queues) = api(CancellationToken::new());
    for path in ["/", "/console/app.js", "/console/app.css"] {
        let response = call(&router, path, None).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let headers = response.headers();
        let policy = headers[header::CONTENT_SECURITY_POLICY].to_str()?;
        assert!(policy.contains("default-src 'self'") && policy.contains("script-src 'self'") && !policy.contains("unsafe-inline"), "{path}: {policy}");
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY");
        assert!(!headers.contains_key(header::SET_COOKIE));
        let etag = headers[header::ETAG].clone();
        let again = Request::get(path).header(header::IF_NONE_MATCH, etag).body(Body::empty())?;
        let cached = tower_service::Service::call(&mut router.clone(), again).await.unwrap_or_else(|never| match never {});
        assert_eq!(cached.status(), StatusCode::NOT_MODIFIED, "{path} revalidated");
    }
    assert_eq!(call(&router, "/events", None).await.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(call(&router, "/events", Some("wrong")).await.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(call(&router, "/events?x=1", Some(TOKEN)).await.status(), StatusCode::BAD_REQUEST);
    Ok(())
}
