//! Connections: accepting them within `max_connections`, and closing those that are slow
//! to send their headers, idle, or open at shutdown.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Api, ApiLimits, router};

/// Serves the API on `listener` until `shutdown` is cancelled, then stops accepting, lets
/// every open connection finish its request in progress (idle ones close at once) and returns.
pub async fn serve(listener: TcpListener, api: Arc<Api>, shutdown: CancellationToken, limits: ApiLimits) -> anyhow::Result<()> {
    let router = router(api, limits);
    let connections = TaskTracker::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        // Accept only with a free slot: the rest wait in the backlog, holding no descriptor of ours.
        let slot = tokio::select! {
            () = shutdown.cancelled() => break,
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
        };
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
        let _ = stream.set_nodelay(true);
        let connection = serve_connection(stream, router.clone(), shutdown.clone(), limits);
        connections.spawn(async move {
            connection.await;
            drop(slot);
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

/// One connection: HTTP/1.1 with keep-alive, the header-read timeout, the idle timeout, and a
/// graceful close on shutdown.
async fn serve_connection(stream: TcpStream, router: Router, shutdown: CancellationToken, limits: ApiLimits) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked { inner: stream, activity: activity.clone() });
    let service = hyper::service::service_fn(move |request: Request<Incoming>| tower_service::Service::call(&mut router.clone(), request));
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let mut closing = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!("API connection ended: {error}");
                }
                return;
            }
            () = shutdown.cancelled(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = activity.idle_for(limits.idle_timeout) => {
                tracing::debug!("closing an API connection idle for {}", humantime::format_duration(limits.idle_timeout));
                return;
            }
        }
    }
}

/// When a connection last moved a byte.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity { start: Instant::now(), last_ms: AtomicU64::new(0) }
    }

    fn touch(&self) {
        let now = self.start.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// Completes once no byte has moved for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
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
