//! Connections and their limits: at most `max_connections` open; a flood of connections that
//! send nothing cannot keep a new client (a health probe) out, because the one that has waited
//! longest for a request makes room; requests other than the probes use at most
//! `max_connections - probe_connections` connections at once, so slow bodies cannot take the
//! probes' room either; headers must arrive within `header_read_timeout`, a body within
//! `body_read_timeout`, and a connection moving no byte for `idle_timeout` is closed (not
//! while the host works on an answer to a request that came whole).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::errors::error;
use super::{Api, ApiLimits};

/// The listen backlog of the API's socket: connections the kernel completes and queues before
/// the server accepts them (the kernel caps it at `net.core.somaxconn`). tokio's own `bind`
/// asks for 128, which a burst of connections overflows: the kernel then drops their SYNs and
/// a health probe among them waits for its retransmission, a second or more.
pub const LISTEN_BACKLOG: u32 = 4096;

/// How long a connection asked to close to make room may take to finish the answer it is
/// writing before it is dropped.
const EVICT_GRACE: Duration = Duration::from_millis(100);

/// The paths of the probes, which need no token and always find a connection.
const PROBE_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// Binds `addr` for [`serve`] with a backlog of [`LISTEN_BACKLOG`].
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// How long the requests still open when the API stops may take to finish before their
/// connections are closed: the API stops once the host has drained, and no client (a body
/// trickled a byte at a time, a reader that never reads) may hold the host past that.
pub const CLOSE_GRACE: Duration = Duration::from_millis(500);

/// [`serve_once_started`] with the work started already.
#[cfg(test)]
pub async fn serve(listener: TcpListener, api: Arc<Api>, shutdown: CancellationToken, limits: ApiLimits) -> anyhow::Result<()> {
    let started = CancellationToken::new();
    started.cancel();
    serve_once_started(listener, api, shutdown, limits, started).await
}

/// Serves the API on `listener` until `shutdown` is cancelled, then stops accepting, lets
/// every open connection finish its request in progress (idle ones close at once) within
/// [`CLOSE_GRACE`], closes those still open, and returns. Requests other than the probes
/// wait until `started` is cancelled (the host's work has started: a send finds its queue
/// created); the probes answer at once. Bind `listener` with [`bind`] for a backlog that
/// holds a burst of connections.
pub async fn serve_once_started(
    listener: TcpListener,
    api: Arc<Api>,
    shutdown: CancellationToken,
    limits: ApiLimits,
    started: CancellationToken,
) -> anyhow::Result<()> {
    let shared = Arc::new(Shared {
        started,
        stopping: shutdown.clone(),
        router: super::routes::router_until(api, limits, shutdown.clone()),
        limits,
        requests: Arc::new(Semaphore::new(limits.request_slots())),
        open: Mutex::default(),
        next_id: AtomicU64::new(0),
        waiting_again: Notify::new(),
    });
    let tasks = TaskTracker::new();
    let cut = CancellationToken::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    // Out of file descriptors, or a connection reset before it was accepted:
                    // not the server's end. Pause briefly so a full table is not spun on.
                    tracing::debug!("API accept failed: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Accepted first, then room is made: the newcomer may be a probe, and the kernel's
        // backlog is first come, first served.
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => match make_room(&shared, &slots, &shutdown).await {
                Some(slot) => slot,
                None => break,
            },
        };
        let _ = stream.set_nodelay(true);
        let connection = shared.register();
        let task = serve_connection(stream, shared.clone(), connection, shutdown.clone(), cut.clone());
        tasks.spawn(async move {
            task.await;
            drop(slot);
        });
    }
    drop(listener);
    tasks.close();
    if tokio::time::timeout(CLOSE_GRACE, tasks.wait()).await.is_err() {
        tracing::info!(
            connections = tasks.len(),
            "closing the API connections whose requests did not finish {} after the API stopped",
            humantime::format_duration(CLOSE_GRACE)
        );
        cut.cancel();
        tasks.wait().await;
    }
    Ok(())
}

/// Waits for a free slot, asking the connection that has waited longest for a request to
/// close; when every connection is inside a request, waits until one leaves it. `None` on
/// shutdown.
async fn make_room(shared: &Shared, slots: &Arc<Semaphore>, shutdown: &CancellationToken) -> Option<OwnedSemaphorePermit> {
    loop {
        let waiting_again = shared.waiting_again.notified();
        tokio::pin!(waiting_again);
        waiting_again.as_mut().enable();
        let evicted = shared.evict_longest_waiting();
        tokio::select! {
            () = shutdown.cancelled() => return None,
            slot = slots.clone().acquire_owned() => return Some(slot.expect("the semaphore is never closed")),
            () = waiting_again, if !evicted => {}
        }
    }
}

/// What every connection of one server shares.
struct Shared {
    /// Cancelled once the host's work has started (see [`serve_once_started`]).
    started: CancellationToken,
    /// The server's shutdown.
    stopping: CancellationToken,
    router: Router,
    limits: ApiLimits,
    /// Connections inside a request other than a probe.
    requests: Arc<Semaphore>,
    /// Open connections, by accept order.
    open: Mutex<BTreeMap<u64, Arc<Connection>>>,
    next_id: AtomicU64,
    /// Signalled when a connection finishes a request (it can then be asked to close).
    waiting_again: Notify,
}

/// One open connection, as the accept loop sees it.
struct Connection {
    id: u64,
    /// When it began waiting for its next request; `None` while it answers one.
    waiting_since: Mutex<Option<Instant>>,
    /// Cancelled to ask it to close (to make room).
    evict: CancellationToken,
}

impl Shared {
    fn register(&self) -> Arc<Connection> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(Connection { id, waiting_since: Mutex::new(Some(Instant::now())), evict: CancellationToken::new() });
        self.open.lock().unwrap().insert(id, connection.clone());
        connection
    }

    fn unregister(&self, connection: &Connection) {
        self.open.lock().unwrap().remove(&connection.id);
    }

    /// Asks the connection that has waited longest for a request to close. False when every
    /// connection is inside a request (or already asked).
    fn evict_longest_waiting(&self) -> bool {
        let open = self.open.lock().unwrap();
        let longest = open
            .values()
            .filter(|c| !c.evict.is_cancelled())
            .filter_map(|c| c.waiting_since.lock().unwrap().map(|since| (since, c)))
            .min_by_key(|(since, c)| (*since, c.id));
        match longest {
            Some((_, connection)) => {
                connection.evict.cancel();
                true
            }
            None => false,
        }
    }
}

/// Marks a connection inside a request until dropped (the answer is ready, or the connection
/// went away mid-request).
struct InRequest<'a> {
    shared: &'a Shared,
    connection: &'a Connection,
}

impl<'a> InRequest<'a> {
    fn enter(shared: &'a Shared, connection: &'a Connection) -> InRequest<'a> {
        *connection.waiting_since.lock().unwrap() = None;
        InRequest { shared, connection }
    }
}

impl Drop for InRequest<'_> {
    fn drop(&mut self) {
        *self.connection.waiting_since.lock().unwrap() = Some(Instant::now());
        self.shared.waiting_again.notify_waiters();
    }
}

/// One connection: HTTP/1.1 with keep-alive, the header-read timeout, the idle timeout, and a
/// graceful close on shutdown or when asked to make room, and an abrupt one when `cut`.
async fn serve_connection(stream: TcpStream, shared: Arc<Shared>, connection: Arc<Connection>, shutdown: CancellationToken, cut: CancellationToken) {
    let limits = shared.limits;
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked { inner: stream, activity: activity.clone() });
    let service = {
        let (shared, connection, activity) = (shared.clone(), connection.clone(), activity.clone());
        hyper::service::service_fn(move |request: Request<Incoming>| {
            let (shared, connection, activity) = (shared.clone(), connection.clone(), activity.clone());
            async move {
                let _in_request = InRequest::enter(&shared, &connection);
                let _answered = Answered(&activity);
                Ok::<_, Infallible>(answer(&shared, request, &activity).await)
            }
        })
    };
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let http = builder.serve_connection(io, service);
    tokio::pin!(http);
    let mut closing = false;
    let mut drop_at = None;
    loop {
        tokio::select! {
            result = http.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!("API connection ended: {error}");
                }
                break;
            }
            () = shutdown.cancelled(), if !closing => {
                http.as_mut().graceful_shutdown();
                closing = true;
            }
            () = cut.cancelled() => break,
            () = connection.evict.cancelled(), if !closing => {
                // Not inside a request (idle, or headers still coming, maybe a byte at a time):
                // close now, so room is made at once however many such connections queue up.
                // An answer being written gets a moment.
                if connection.waiting_since.lock().unwrap().is_some() {
                    break;
                }
                http.as_mut().graceful_shutdown();
                closing = true;
                drop_at = Some(Instant::now() + EVICT_GRACE);
            }
            () = sleep_until(drop_at) => {
                // A request that arrived as it was asked to close is answered; anything else
                // (headers still coming, an unread body) is dropped.
                if connection.waiting_since.lock().unwrap().is_some() {
                    break;
                }
                drop_at = None;
            }
            () = activity.idle_for(limits.idle_timeout) => {
                tracing::debug!("closing an API connection idle for {}", humantime::format_duration(limits.idle_timeout));
                break;
            }
        }
    }
    shared.unregister(&connection);
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The answer to one request: a probe at once; any other request only with a free request
/// slot (503 otherwise), and 408 when its body does not arrive within `body_read_timeout`.
async fn answer(shared: &Shared, request: Request<Incoming>, activity: &Arc<Activity>) -> Response {
    let limits = shared.limits;
    let probe = PROBE_PATHS.contains(&request.uri().path());
    if !probe && !shared.started.is_cancelled() {
        // Within the start-up attempts' bound (START_ATTEMPT_TIMEOUT); a start that fails
        // stops the API.
        tokio::select! {
            () = shared.started.cancelled() => {}
            () = shared.stopping.cancelled() => {
                return closing(error(StatusCode::SERVICE_UNAVAILABLE, "the host is stopping"));
            }
        }
    }
    let _slot = if probe {
        None
    } else {
        match shared.requests.clone().try_acquire_owned() {
            Ok(slot) => Some(slot),
            Err(_) => {
                let reason = format!("the API is busy: all {} request slots are taken; try again", limits.request_slots());
                let mut response = closing(error(StatusCode::SERVICE_UNAVAILABLE, reason));
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return response;
            }
        }
    };
    let timed_out = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + limits.body_read_timeout;
    if request.body().is_end_stream() {
        activity.answering.store(true, Ordering::Relaxed);
    }
    let request = request.map(|body| {
        Body::new(DeadlineBody { inner: body, sleep: Box::pin(tokio::time::sleep_until(deadline)), timed_out: timed_out.clone(), activity: activity.clone() })
    });
    let response = tower_service::Service::call(&mut shared.router.clone(), request).await.unwrap_or_else(|never| match never {});
    if timed_out.load(Ordering::Relaxed) {
        let reason = format!("the request body did not arrive within body_read_timeout ({})", humantime::format_duration(limits.body_read_timeout));
        return closing(error(StatusCode::REQUEST_TIMEOUT, reason));
    }
    response
}

/// `response`, asking the client to close the connection after it.
fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A request body that fails once its deadline has passed.
struct DeadlineBody {
    inner: Incoming,
    sleep: Pin<Box<Sleep>>,
    timed_out: Arc<AtomicBool>,
    /// Told when the whole body has come: from then on the host, not the client, is working.
    activity: Arc<Activity>,
}

/// What a [`DeadlineBody`] yields when its deadline passes.
#[derive(Debug)]
struct BodyTimedOut;

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive in time")
    }
}

impl std::error::Error for BodyTimedOut {}

impl hyper::body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if frame.is_none() || this.inner.is_end_stream() {
                this.activity.answering.store(true, Ordering::Relaxed);
            }
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        if this.sleep.as_mut().poll(cx).is_ready() {
            this.timed_out.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(BodyTimedOut.into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// When a connection last moved a byte, and whether the host is working on an answer (the
/// request has come whole): a store that takes longer than `idle_timeout` (a large send to a
/// slow blob service) is the host's silence, not the client's, and is bounded by its own
/// deadlines.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    answering: AtomicBool,
}

/// Ends the host's work on an answer: the idle time counts from here.
struct Answered<'a>(&'a Activity);

impl Drop for Answered<'_> {
    fn drop(&mut self) {
        self.0.answering.store(false, Ordering::Relaxed);
        self.0.touch();
    }
}

impl Activity {
    fn new() -> Activity {
        Activity { start: Instant::now(), last_ms: AtomicU64::new(0), answering: AtomicBool::new(false) }
    }

    fn touch(&self) {
        let now = self.start.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// Completes once no byte has moved for `timeout` outside the host's work on an answer.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            if self.answering.load(Ordering::Relaxed) {
                // Looked at again a timeout later; the answer's end counts as activity.
                tokio::time::sleep(timeout).await;
                continue;
            }
            let deadline = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed)) + timeout;
            if deadline <= Instant::now() {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A stream that records its activity.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.touch();
        }
        result
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        result
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
