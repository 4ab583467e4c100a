//! `ebb bench claims`: a large body through a claim-check store (issue 20, item 3) on
//! Azurite's blob service, against a plain loop of the official SDK's own upload and
//! download of the same bytes in the same run (no hashing, no checks, the download
//! collected into a fresh buffer), interleaved round by round.
//!
//! ebb's put hashes the body (SHA-256) and uploads it in 4 MiB blocks; its get downloads
//! into one buffer of the claimed size and checks its length and SHA-256. The difference
//! between the two is what those checks cost.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use azure_core::http::{NoFormat, RequestContent};
use bytes::Bytes;
use serde::Serialize;

use crate::report::median;
use ebb::payload::claims::{AzureClaims, ClaimStore, sha256};
use ebb::queue::azure::{AzureAccount, AzureOptions, DEVELOPMENT_ACCOUNT, DEVELOPMENT_KEY};

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct ClaimsBench {
    /// The body's length in bytes.
    pub body_bytes: usize,
    /// Rounds: each puts and gets the body once through ebb and once through the SDK loop.
    pub rounds: u32,
    /// `azurite-blob` to start (in memory, on a free port).
    pub azurite_blob: PathBuf,
}

/// One contender's medians.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Figures {
    /// Median put time, in milliseconds.
    pub put_ms: f64,
    /// Median get time, in milliseconds.
    pub get_ms: f64,
    /// Median put and get, in milliseconds.
    pub round_trip_ms: f64,
    /// Body MB (10^6 bytes) a second, put.
    pub put_mb_s: f64,
    /// Body MB a second, get.
    pub get_mb_s: f64,
}

/// The bench's result.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub body_bytes: usize,
    pub rounds: u32,
    /// Whether every get through ebb gave the body back byte for byte (by SHA-256).
    pub sha256_identical: bool,
    /// Blobs left in ebb's container after the runs (each round deletes its body).
    pub blobs_left: usize,
    pub ebb: Figures,
    pub sdk_loop: Figures,
    /// ebb's round trip over the SDK loop's.
    pub round_trip_ratio: f64,
}

/// Azurite's blob service on a free port, stopped on drop.
struct AzuriteBlob {
    child: Child,
    endpoint: String,
}

impl AzuriteBlob {
    fn start(tool: &Path) -> Result<AzuriteBlob> {
        if !tool.exists() {
            bail!(
                "--azurite-blob: {} does not exist; `cargo test -p ebb-tests` installs Azurite into target/azurite (or give the path of azurite-blob)",
                tool.display()
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(tool)
            .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string(), "--inMemoryPersistence", "--disableTelemetry", "--silent"])
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("failed to start {} (needs Node.js 20+)", tool.display()))?;
        let mut azurite = AzuriteBlob { child, endpoint: format!("http://127.0.0.1:{port}/{DEVELOPMENT_ACCOUNT}") };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = azurite.child.try_wait()? {
                bail!("azurite-blob exited ({status}) before answering on port {port}");
            }
            if Instant::now() > deadline {
                bail!("azurite-blob did not answer on port {port} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(azurite)
    }
}

impl Drop for AzuriteBlob {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The default `azurite-blob`: where the tests' build installs Azurite.
pub(crate) fn default_azurite_blob() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new(".")).join("target/azurite/node_modules/.bin/azurite-blob")
}

pub(crate) fn run(bench: &ClaimsBench) -> Result<Report> {
    let azurite = AzuriteBlob::start(&bench.azurite_blob)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(measure(bench, &azurite.endpoint))
}

async fn measure(bench: &ClaimsBench, endpoint: &str) -> Result<Report> {
    // The queue endpoint is never called: only the blob service runs.
    let account = AzureAccount::with_key(DEVELOPMENT_ACCOUNT, DEVELOPMENT_KEY, Some("http://127.0.0.1:9/devstoreaccount1"))?.with_blob_endpoint(endpoint)?;
    let options = AzureOptions { request_timeout: Duration::from_secs(120), ..AzureOptions::default() };
    let claims = AzureClaims::new(&account, "bench-claims", bench.body_bytes as u64, &options)?;
    claims.create_if_missing().await?;
    // The loop's container, beside ebb's, reached through the same SDK and credential.
    let raw = AzureClaims::new(&account, "bench-raw", bench.body_bytes as u64, &options)?;
    raw.create_if_missing().await?;
    let raw_container = azure_storage_blob::BlobContainerClient::new(
        account.container_url(raw.container_name())?,
        None,
        Some(azure_storage_blob::BlobContainerClientOptions {
            client_options: ebb::queue::azure::sdk_client_options(&account, options.request_timeout, options.pool_idle_timeout, "bench")?.0,
            version: ebb::queue::azure::API_VERSION.to_string(),
        }),
    )?;
    let mut rng = fastrand::Rng::with_seed(1);
    let mut body = vec![0u8; bench.body_bytes];
    rng.fill(&mut body);
    let body = Bytes::from(body);
    let expected = sha256(&body);
    let (mut ebb_put, mut ebb_get, mut raw_put, mut raw_get) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut identical = true;
    for round in 0..bench.rounds {
        let started = Instant::now();
        let check = claims.put(body.clone()).await.map_err(|e| anyhow::anyhow!("round {round}: ebb put: {e}"))?;
        ebb_put.push(started.elapsed().as_secs_f64());
        let started = Instant::now();
        let fetched = claims.get(&check, bench.body_bytes as u64).await.map_err(|e| anyhow::anyhow!("round {round}: ebb get: {e}"))?;
        ebb_get.push(started.elapsed().as_secs_f64());
        identical &= sha256(&fetched) == expected;
        drop(fetched);
        claims.delete(&check).await.map_err(|e| anyhow::anyhow!("round {round}: ebb delete: {e}"))?;

        let blob = raw_container.blob_client(&format!("round-{round}"));
        let started = Instant::now();
        blob.upload(<RequestContent<Bytes, NoFormat> as From<Bytes>>::from(body.clone()), None).await.with_context(|| format!("round {round}: SDK upload"))?;
        raw_put.push(started.elapsed().as_secs_f64());
        let started = Instant::now();
        let downloaded = blob.download(None).await.with_context(|| format!("round {round}: SDK download"))?;
        let bytes = downloaded.body.collect().await.with_context(|| format!("round {round}: SDK download body"))?;
        raw_get.push(started.elapsed().as_secs_f64());
        if bytes.len() != bench.body_bytes {
            bail!("round {round}: the SDK loop got {} bytes back of {}", bytes.len(), bench.body_bytes);
        }
        blob.delete(None).await.with_context(|| format!("round {round}: SDK delete"))?;
    }
    let blobs_left = claims.list_names().await?.len();
    let figures = |puts: Vec<f64>, gets: Vec<f64>| {
        let round_trips: Vec<f64> = puts.iter().zip(&gets).map(|(p, g)| p + g).collect();
        let (put, get) = (median(puts), median(gets));
        let mb = bench.body_bytes as f64 / 1e6;
        Figures { put_ms: put * 1e3, get_ms: get * 1e3, round_trip_ms: median(round_trips) * 1e3, put_mb_s: mb / put, get_mb_s: mb / get }
    };
    let ebb = figures(ebb_put, ebb_get);
    let sdk_loop = figures(raw_put, raw_get);
    let round_trip_ratio = ebb.round_trip_ms / sdk_loop.round_trip_ms;
    Ok(Report { body_bytes: bench.body_bytes, rounds: bench.rounds, sha256_identical: identical, blobs_left, ebb, sdk_loop, round_trip_ratio })
}

/// The report as a table.
pub(crate) fn table(report: &Report) -> String {
    let mut out = format!(
        "{} bytes, {} rounds (medians); every get byte-identical (SHA-256): {}; blobs left: {}\n\n",
        report.body_bytes, report.rounds, report.sha256_identical, report.blobs_left
    );
    out.push_str("| contender | put ms | get ms | put+get ms | put MB/s | get MB/s |\n|---|---|---|---|---|---|\n");
    for (name, f) in [("ebb claim store", &report.ebb), ("SDK loop", &report.sdk_loop)] {
        out.push_str(&format!("| {name} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |\n", f.put_ms, f.get_ms, f.round_trip_ms, f.put_mb_s, f.get_mb_s));
    }
    out.push_str(&format!("\nebb's put+get: {:.2} × the SDK loop's\n", report.round_trip_ratio));
    out
}
