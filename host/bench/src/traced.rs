//! The `ebb_traced` contender's spans: ebb's listener with its spans exported over
//! OTLP/HTTP (the exporter `ebb run` uses with `[telemetry]`) to a collector in this process
//! that takes each export and answers at once. The export is switched on for that
//! contender's runs only, by the layer's filter: off, its spans are disabled at their call
//! sites, as in a host without `[telemetry]`.

use std::sync::OnceLock;

use anyhow::Context as _;
use ebb::config::{OtlpExport, OtlpProtocol};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::{Layer, Registry, reload};

/// The filter's switch, set once the layer is made.
static SWITCH: OnceLock<reload::Handle<Targets, Registry>> = OnceLock::new();

/// The exporting layer, off until [`Spans::on`]; its collector started on a thread of its own.
pub(crate) fn layer() -> anyhow::Result<impl Layer<Registry>> {
    let endpoint = start_collector()?;
    let export = OtlpExport { endpoint: format!("{endpoint}/v1/traces"), protocol: OtlpProtocol::HttpProtobuf, service_name: "ebb-bench".into() };
    let (filter, switch) = reload::Layer::new(Targets::new());
    let _ = SWITCH.set(switch);
    Ok(ebb::telemetry::unfiltered_layer(&export)?.with_filter(filter))
}

/// Spans exported while it lives.
pub(crate) struct Spans;

impl Spans {
    /// Switches the export on (for the `ebb_traced` contender's run).
    pub(crate) fn on() -> anyhow::Result<Spans> {
        let switch = SWITCH.get().context("the bench's log was started without the span export")?;
        switch.reload(ebb::telemetry::spans_filter()).context("failed to switch the span export on")?;
        Ok(Spans)
    }
}

impl Drop for Spans {
    fn drop(&mut self) {
        if let Some(switch) = SWITCH.get() {
            let _ = switch.reload(Targets::new());
        }
    }
}

/// A collector that takes every export and answers 200: its base URL.
fn start_collector() -> anyhow::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("failed to bind the bench's collector")?;
    let address = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    std::thread::Builder::new().name("bench-collector".into()).spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("the collector's runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("the collector's socket");
            let router = axum::Router::new().route("/v1/traces", axum::routing::post(|_body: axum::body::Bytes| async { axum::http::StatusCode::OK }));
            let _ = axum::serve(listener, router).await;
        });
    })?;
    Ok(format!("http://{address}"))
}
