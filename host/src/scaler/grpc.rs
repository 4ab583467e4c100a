//! The gRPC service: KEDA's `ExternalScaler` over [`Scaler`].
//!
//! A ScaledObject names its queue in the trigger's metadata (`queue: orders`). When a token
//! is configured, every call carries it: as `authorization: Bearer <token>` (any gRPC
//! client), or in the trigger's metadata as `token`, or `tokenFromEnv` (KEDA resolves that
//! one from the scaled workload's environment, so the token stays out of the ScaledObject).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::Stream;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use super::proto::external_scaler_server::{ExternalScaler, ExternalScalerServer};
use super::proto::{GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec, MetricValue, ScaledObjectRef};
use super::{Scaler, ScalerQueue};

/// Most streams (`StreamIsActive`, `StreamMetricSpec`) open at once; more are refused with
/// `RESOURCE_EXHAUSTED`. KEDA opens one of each per ScaledObject trigger.
pub const MAX_STREAMS: usize = 1024;
/// How often an open `StreamIsActive` re-reads the queue's state to see it go inactive
/// (going active is pushed at once, by the work-detected event).
pub const STREAM_RECHECK: Duration = Duration::from_secs(1);
/// Most connections open at once; further clients wait in the kernel's backlog (KEDA holds
/// one connection per scaler address).
pub const MAX_CONNECTIONS: usize = 256;
/// Longest time a unary call may take before it is answered `DEADLINE_EXCEEDED`.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The metric's name for `queue`.
pub fn metric_name(queue: &str) -> String {
    format!("ebb-{queue}-instances")
}

struct Service {
    scaler: Arc<Scaler>,
    streams: Arc<Semaphore>,
    stop: CancellationToken,
    /// The open streams' tasks, waited for when the server stops.
    stream_tasks: TaskTracker,
}

/// Serves the external scaler on `listener` until `shutdown` is cancelled; then every open
/// stream ends, and the server returns once their tasks have.
pub async fn serve(listener: TcpListener, scaler: Arc<Scaler>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let stream_tasks = TaskTracker::new();
    let service = Service { scaler, streams: Arc::new(Semaphore::new(MAX_STREAMS)), stop: shutdown.clone(), stream_tasks: stream_tasks.clone() };
    let incoming = limited(listener, Arc::new(Semaphore::new(MAX_CONNECTIONS)));
    let served = tonic::transport::Server::builder()
        .timeout(CALL_TIMEOUT)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .concurrency_limit_per_connection(256)
        // Room for every stream on one connection (as KEDA holds one), plus unary calls.
        .max_concurrent_streams(Some(MAX_STREAMS as u32 * 2))
        .add_service(ExternalScalerServer::new(service))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
        .context("the scaler's gRPC server failed");
    // Each stream's task ends at `shutdown`, or when its client goes (as a failed server's do).
    stream_tasks.close();
    stream_tasks.wait().await;
    served
}

/// Accepted connections, at most `slots` open at once: a connection holds its slot until it
/// closes, and no connection is accepted without one.
fn limited(listener: TcpListener, slots: Arc<Semaphore>) -> impl Stream<Item = std::io::Result<Limited>> {
    futures::stream::unfold((listener, slots), |(listener, slots)| async move {
        let slot = slots.clone().acquire_owned().await.expect("the semaphore is never closed");
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let silence = Some(Box::pin(tokio::time::sleep(FIRST_BYTES_DEADLINE)));
                    return Some((Ok(Limited { stream, _slot: slot, silence }), (listener, slots)));
                }
                Err(error) => {
                    // Out of descriptors, or reset before accepted: not the server's end.
                    tracing::debug!("scaler accept failed: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    })
}

/// How long a new connection may stay silent: one that sends nothing (a half-open or
/// hostile client) would otherwise hold its slot for ever, and enough of them lock KEDA out.
const FIRST_BYTES_DEADLINE: Duration = Duration::from_secs(5);

/// A connection and its slot.
struct Limited {
    stream: tokio::net::TcpStream,
    _slot: OwnedSemaphorePermit,
    /// Until the first bytes arrive: when it fires first, the connection is closed.
    silence: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl tonic::transport::server::Connected for Limited {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl tokio::io::AsyncRead for Limited {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &mut tokio::io::ReadBuf<'_>) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        if self.silence.is_some() {
            if buf.filled().len() > before {
                self.silence = None;
            } else if read.is_pending() && self.silence.as_mut().is_some_and(|s| s.as_mut().poll(cx).is_ready()) {
                return std::task::Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the client sent nothing")));
            }
        }
        read
    }
}

impl tokio::io::AsyncWrite for Limited {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &[u8]) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

impl Service {
    /// The call's queue, once its token is checked.
    fn queue<T>(&self, request: &Request<T>, object: Option<&ScaledObjectRef>) -> Result<Arc<ScalerQueue>, Status> {
        let object = object.ok_or_else(|| Status::invalid_argument("scaledObjectRef: missing"))?;
        if let Some(token) = &self.scaler.token {
            // The auth scheme is case-insensitive (RFC 7235); any of the token's places may carry it.
            let header = request
                .metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, given)| given.trim());
            let metadata = ["token", "tokenFromEnv"].iter().filter_map(|k| object.scaler_metadata.get(*k)).map(String::as_str);
            let matches = |given: Option<&str>| given.is_some_and(|given| crate::http::token_matches(token, Some(given)));
            if !matches(header) && !metadata.into_iter().any(|given| matches(Some(given))) {
                return Err(Status::unauthenticated(
                    "missing or wrong scaler token (authorization: Bearer <token>, or the trigger metadata's token or tokenFromEnv)",
                ));
            }
        }
        let names = || self.scaler.queue_names().join(", ");
        let name = object
            .scaler_metadata
            .get("queue")
            .ok_or_else(|| Status::invalid_argument(format!("scalerMetadata.queue: missing; name one of this host's queues ({})", names())))?;
        self.scaler.queue(name).cloned().ok_or_else(|| {
            let shown: String = name.chars().take(64).collect();
            Status::not_found(format!("scalerMetadata.queue: no queue named {shown:?} on this host (it has {})", names()))
        })
    }

    fn stream_slot(&self) -> Result<OwnedSemaphorePermit, Status> {
        self.streams
            .clone()
            .try_acquire_owned()
            .map_err(|_| Status::resource_exhausted(format!("{MAX_STREAMS} streams are open on this scaler; close one first")))
    }

    fn spec(queue: &ScalerQueue) -> GetMetricSpecResponse {
        GetMetricSpecResponse { metric_specs: vec![MetricSpec { metric_name: metric_name(queue.name()), target_size: 1, target_size_float: 1.0 }] }
    }
}

#[tonic::async_trait]
impl ExternalScaler for Service {
    async fn is_active(&self, request: Request<ScaledObjectRef>) -> Result<Response<IsActiveResponse>, Status> {
        let queue = self.queue(&request, Some(request.get_ref()))?;
        Ok(Response::new(IsActiveResponse { result: queue.is_active() }))
    }

    type StreamIsActiveStream = Stream_<IsActiveResponse>;

    async fn stream_is_active(&self, request: Request<ScaledObjectRef>) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        let queue = self.queue(&request, Some(request.get_ref()))?;
        let slot = self.stream_slot()?;
        let (tx, rx) = mpsc::channel(4);
        let stop = self.stop.clone();
        let span = tracing::info_span!("stream_is_active", queue = %queue.name());
        self.stream_tasks.spawn(
            async move {
                let _slot = slot;
                let mut events = queue.work_events();
                let mut recheck = tokio::time::interval(STREAM_RECHECK);
                recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut sent = None;
                loop {
                    // The first tick is at once: the stream opens with the current answer.
                    let active = tokio::select! {
                        changed = events.changed() => {
                            if changed.is_err() { return }
                            // Work detected is activity, unless the queue is paused.
                            !queue.is_paused()
                        }
                        _ = recheck.tick() => queue.is_active(),
                        () = stop.cancelled() => return,
                        () = tx.closed() => return,
                    };
                    if sent != Some(active) {
                        if tx.send(Ok(IsActiveResponse { result: active })).await.is_err() {
                            return;
                        }
                        tracing::debug!(active, "StreamIsActive sent");
                        sent = Some(active);
                    }
                }
            }
            .instrument(span),
        );
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn get_metric_spec(&self, request: Request<ScaledObjectRef>) -> Result<Response<GetMetricSpecResponse>, Status> {
        let queue = self.queue(&request, Some(request.get_ref()))?;
        Ok(Response::new(Service::spec(&queue)))
    }

    async fn get_metrics(&self, request: Request<GetMetricsRequest>) -> Result<Response<GetMetricsResponse>, Status> {
        let queue = self.queue(&request, request.get_ref().scaled_object_ref.as_ref())?;
        let expected = metric_name(queue.name());
        let asked = &request.get_ref().metric_name;
        if !asked.is_empty() && *asked != expected {
            let shown: String = asked.chars().take(64).collect();
            return Err(Status::not_found(format!("metricName: {shown:?} is not a metric of queue {} (its metric is {expected})", queue.name())));
        }
        let metric = queue.metric().await;
        let value = MetricValue { metric_name: expected, metric_value: metric.instances.into(), metric_value_float: metric.instances.into() };
        Ok(Response::new(GetMetricsResponse { metric_values: vec![value] }))
    }

    type StreamMetricSpecStream = Stream_<GetMetricSpecResponse>;

    /// The spec never changes while the host runs: sent once, then the stream stays open
    /// (KEDA's contract: send the current spec at once) until the host stops.
    async fn stream_metric_spec(&self, request: Request<ScaledObjectRef>) -> Result<Response<Self::StreamMetricSpecStream>, Status> {
        let queue = self.queue(&request, Some(request.get_ref()))?;
        let slot = self.stream_slot()?;
        let (tx, rx) = mpsc::channel(1);
        let stop = self.stop.clone();
        let spec = Service::spec(&queue);
        self.stream_tasks.spawn(async move {
            let _slot = slot;
            if tx.send(Ok(spec)).await.is_err() {
                return;
            }
            tokio::select! {
                () = stop.cancelled() => {}
                () = tx.closed() => {}
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}
