//! KEDA external-scaler figures, printed as JSON: `cargo bench -p ebb-tests --bench scaler`.
//!
//! - Activation latency: a message sent through the HTTP API → the `StreamIsActive` event
//!   (`true`) received by a gRPC client, on loopback, one sample per queue (each queue's
//!   stream starts inactive); KEDA's own azure-queue scaler polls every 30 s by default.
//! - `GetMetrics` latency under 100 concurrent callers on one HTTP/2 connection (as KEDA
//!   holds one), against `IsActive` (the same round trip without the rule) in the same run.
//!
//! `EBB_BENCH_QUEUES` sets the number of activation samples (queues), default 200.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ebb::Host;
use ebb::Role;
use ebb::config::Config;
use ebb::keda::{ExternalScalerClient, GetMetricsRequest, ScaledObjectRef};
use serde_json::json;
use tonic::transport::Channel;

const CONCURRENT: usize = 100;
const CALLS_EACH: usize = 50;

fn object(queue: &str) -> ScaledObjectRef {
    ScaledObjectRef { name: "workers".into(), namespace: "default".into(), scaler_metadata: [("queue".to_string(), queue.to_string())].into_iter().collect() }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let index = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index].as_secs_f64() * 1e3
}

fn summary(mut samples: Vec<Duration>) -> serde_json::Value {
    samples.sort();
    json!({
        "samples": samples.len(),
        "p50_ms": (percentile(&samples, 0.50) * 1000.0).round() / 1000.0,
        "p99_ms": (percentile(&samples, 0.99) * 1000.0).round() / 1000.0,
        "max_ms": (percentile(&samples, 1.0) * 1000.0).round() / 1000.0,
    })
}

fn main() {
    let queues: usize = std::env::var("EBB_BENCH_QUEUES").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let report = runtime.block_on(run(queues));
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}

async fn start_app() -> std::net::SocketAddr {
    let router = axum::Router::new().route("/work", axum::routing::post(|| async { axum::http::StatusCode::OK }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

async fn run(queues: usize) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let app = start_app().await;
    let mut text = String::from("[api]\nlisten = \"127.0.0.1:0\"\n[scaler]\nlisten = \"127.0.0.1:0\"\n");
    for i in 0..queues {
        text.push_str(&format!("[queues.q{i:04}]\nhandler = {{ url = \"http://{app}/work\" }}\n"));
    }
    let config = Config::parse(&text, dir.path(), None).unwrap();
    let service = Host::start(&config, Role::Worker).await.unwrap();
    let (api, scaler) = (service.api_addr(), service.scaler_addr().unwrap());
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{scaler}")).unwrap().connect().await.unwrap();
    let mut client = ExternalScalerClient::new(channel.clone());

    // Activation: every queue's stream open and inactive, then one send per queue.
    let mut streams = Vec::new();
    for i in 0..queues {
        let mut stream = client.stream_is_active(object(&format!("q{i:04}"))).await.unwrap().into_inner();
        assert!(!stream.message().await.unwrap().unwrap().result, "q{i:04} starts inactive");
        streams.push(stream);
    }
    let http = reqwest::Client::new();
    let mut activation = Vec::new();
    for (i, stream) in streams.iter_mut().enumerate() {
        let started = Instant::now();
        let sent = http.post(format!("http://{api}/queues/q{i:04}/messages")).body("wake").send().await.unwrap();
        assert_eq!(sent.status(), reqwest::StatusCode::CREATED);
        let answer = tokio::time::timeout(Duration::from_secs(10), stream.message()).await.expect("activation within 10 s").unwrap().unwrap();
        activation.push(started.elapsed());
        assert!(answer.result);
    }
    drop(streams);
    // The HTTP send alone, for comparison (a queue that is already active sends no event).
    let mut send_only = Vec::new();
    for i in 0..queues {
        let started = Instant::now();
        http.post(format!("http://{api}/queues/q{i:04}/messages")).body("again").send().await.unwrap();
        send_only.push(started.elapsed());
    }

    let get_metrics = concurrent(channel.clone(), |mut client| async move {
        let request = GetMetricsRequest { scaled_object_ref: Some(object("q0000")), metric_name: String::new() };
        client.get_metrics(request).await.unwrap();
    })
    .await;
    let is_active = concurrent(channel.clone(), |mut client| async move {
        client.is_active(object("q0000")).await.unwrap();
    })
    .await;
    service.shutdown().await;
    json!({
        "activation_send_to_stream_event": summary(activation),
        "http_send_alone_baseline": summary(send_only),
        "keda_azure_queue_default_polling_interval_ms": 30_000,
        "get_metrics_100_concurrent": summary(get_metrics),
        "is_active_100_concurrent_baseline": summary(is_active),
    })
}

/// [`CONCURRENT`] callers on one connection, [`CALLS_EACH`] calls each, every call timed.
async fn concurrent<F, Fut>(channel: Channel, call: F) -> Vec<Duration>
where
    F: Fn(ExternalScalerClient<Channel>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let call = Arc::new(call);
    let callers = (0..CONCURRENT).map(|_| {
        let (call, channel) = (call.clone(), channel.clone());
        tokio::spawn(async move {
            let mut times = Vec::with_capacity(CALLS_EACH);
            for _ in 0..CALLS_EACH {
                let started = Instant::now();
                call(ExternalScalerClient::new(channel.clone())).await;
                times.push(started.elapsed());
            }
            times
        })
    });
    futures::future::join_all(callers).await.into_iter().flat_map(Result::unwrap).collect()
}
