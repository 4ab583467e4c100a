//! An OTLP trace receiver over HTTP and gRPC (`tests/otlp/receiver.py`, on the OpenTelemetry
//! protobuf definitions and grpcio from PyPI) for the telemetry tests: it decodes what ebb
//! exports as a collector would and answers the spans it has (or their count) as JSON.

use std::process::{Child, ChildStdin};
use std::sync::OnceLock;
use std::time::Duration;

use crate::azurite::{free_port, start_guarded};
use anyhow::{Context as _, Result};

include!(concat!(env!("OUT_DIR"), "/otlp.rs"));

/// One span as the receiver decoded it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// Hex.
    pub trace_id: String,
    /// Hex.
    pub span_id: String,
    /// Hex; empty for a root.
    pub parent_span_id: String,
    /// The span's name.
    pub name: String,
    /// `SPAN_KIND_…`.
    pub kind: String,
    /// The resource's `service.name`.
    pub service: Option<String>,
    /// Its attributes, each value as JSON.
    pub attributes: serde_json::Map<String, serde_json::Value>,
    /// `error`, `ok` or `unset`.
    pub status: String,
    /// The spans it links to: (trace id, span id), hex.
    pub links: Vec<(String, String)>,
}

impl ReceivedSpan {
    fn from_json(span: &serde_json::Value) -> Result<ReceivedSpan> {
        let text = |key: &str| span[key].as_str().map(str::to_string).with_context(|| format!("no {key} in the span {span}"));
        Ok(ReceivedSpan {
            trace_id: text("trace_id")?,
            span_id: text("span_id")?,
            parent_span_id: text("parent_span_id")?,
            name: text("name")?,
            kind: text("kind")?,
            service: text("service").ok(),
            attributes: span["attributes"].as_object().cloned().unwrap_or_default(),
            status: text("status")?,
            links: span["links"]
                .as_array()
                .map_or(&[][..], Vec::as_slice)
                .iter()
                .filter_map(|link| Some((link["trace_id"].as_str()?.to_string(), link["span_id"].as_str()?.to_string())))
                .collect(),
        })
    }

    /// The attribute `key` as text (a number or a flag in its JSON form).
    pub fn attribute(&self, key: &str) -> Option<String> {
        self.attributes.get(key).map(|value| value.as_str().map_or_else(|| value.to_string(), str::to_string))
    }
}

/// A running receiver, stopped with the test process.
pub struct OtlpReceiver {
    port: u16,
    grpc_port: u16,
    _child: Child,
    _guard: Option<ChildStdin>,
}

impl OtlpReceiver {
    /// One receiver for the whole test process, started on first use; tell a test's spans by
    /// their queue or trace id.
    pub fn shared() -> &'static OtlpReceiver {
        static SHARED: OnceLock<OtlpReceiver> = OnceLock::new();
        SHARED.get_or_init(|| OtlpReceiver::start(false))
    }

    /// A receiver of its own that counts the spans per service ([`OtlpReceiver::counts`])
    /// and keeps none: for a load of them.
    pub fn counting() -> OtlpReceiver {
        OtlpReceiver::start(true)
    }

    fn start(count_only: bool) -> OtlpReceiver {
        let (port, grpc_port) = (free_port(), free_port());
        let mut args = vec![OTLP_PYTHON.to_string(), OTLP_RECEIVER.to_string(), port.to_string(), grpc_port.to_string()];
        if count_only {
            args.push("--count-only".into());
        }
        let (child, guard) = start_guarded("the OTLP receiver", &args, port, Duration::from_secs(30), "is its venv installed (tests/build.rs)?");
        OtlpReceiver { port, grpc_port, _child: child, _guard: guard }
    }

    /// The base URL to give ebb (`[telemetry] otlp_endpoint`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The URL of its gRPC service, for `OTEL_EXPORTER_OTLP_PROTOCOL=grpc`.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// The spans received from the service `service` (its `service.name`) so far.
    pub async fn count(&self, service: &str) -> Result<u64> {
        let url = format!("{}/counts", self.endpoint());
        let answer = reqwest::get(&url).await.with_context(|| format!("failed to ask the OTLP receiver at {url}"))?;
        let counts: serde_json::Value = serde_json::from_slice(&answer.bytes().await?).context("the OTLP receiver's counts are not JSON")?;
        Ok(counts[service].as_u64().unwrap_or(0))
    }

    /// Every span received so far.
    pub async fn spans(&self) -> Result<Vec<ReceivedSpan>> {
        let url = format!("{}/spans", self.endpoint());
        let answer = reqwest::get(&url).await.with_context(|| format!("failed to ask the OTLP receiver at {url}"))?;
        let spans: Vec<serde_json::Value> = serde_json::from_slice(&answer.bytes().await?).context("the OTLP receiver's answer is not JSON")?;
        spans.iter().map(ReceivedSpan::from_json).collect()
    }
}
