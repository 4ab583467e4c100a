//! `ebb bench trace-memory`: what a collector that never answers costs in memory (issue 39).
//! Two `ebb run` hosts side by side under the same steady load, one exporting its spans to a
//! collector that accepts every connection and never replies, one without `[telemetry]`;
//! their RSS sampled each second. The goal: the traced host's RSS within 20 MiB of the
//! other's at the end, and its lost spans counted.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use serde::Serialize;

use crate::server::ServerProcess;

/// The goal: the traced host's RSS at most this much above the untraced one's.
const GOAL_MIB: f64 = 20.0;
const TOKEN: &str = "bench";
const QUEUE: &str = "bench";
/// RSS sampled this often.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// What the bench runs.
pub(crate) struct TraceMemoryBench {
    /// How long the load lasts.
    pub(crate) duration: Duration,
    /// Messages a second sent to each host.
    pub(crate) rate: u64,
    /// The `ebb` binary the hosts run.
    pub(crate) host_binary: PathBuf,
}

/// One host's figures.
#[derive(Debug, Serialize)]
pub(crate) struct HostFigures {
    /// RSS after the first third of the run (the span queue full by then), MiB.
    pub(crate) rss_warm_mib: f64,
    /// RSS at the end, MiB.
    pub(crate) rss_end_mib: f64,
    /// Highest RSS sampled, MiB.
    pub(crate) rss_max_mib: f64,
    /// Messages handled.
    pub(crate) processed: u64,
    /// `ebb_trace_spans_total` (0 untraced).
    pub(crate) spans_made: u64,
    /// `ebb_trace_spans_dropped_total` (0 untraced).
    pub(crate) spans_dropped: u64,
}

/// The report.
#[derive(Debug, Serialize)]
pub(crate) struct TraceMemoryReport {
    pub(crate) duration_s: u64,
    pub(crate) rate: u64,
    pub(crate) untraced: HostFigures,
    pub(crate) traced: HostFigures,
    /// Traced minus untraced RSS at the end, MiB.
    pub(crate) rss_difference_mib: f64,
    /// Within [`GOAL_MIB`] and drops counted.
    pub(crate) goal_met: bool,
}

/// Runs the bench; `leading` starts the app server (see [`crate::main`]).
pub(crate) fn run(bench: &TraceMemoryBench, leading: &[&str]) -> anyhow::Result<TraceMemoryReport> {
    ensure!(bench.host_binary.is_file(), "--host-binary: no ebb at {}", bench.host_binary.display());
    let app = ServerProcess::start(leading)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("failed to start the bench's runtime")?;
    runtime.block_on(async {
        let silent = silent_collector().await?;
        let untraced = Host::start(&bench.host_binary, app.address(), None)?;
        let traced = Host::start(&bench.host_binary, app.address(), Some(silent))?;
        for host in [&untraced, &traced] {
            host.ready().await?;
        }
        let loads = [&untraced, &traced].map(|host| load(host.api, bench.rate, bench.duration));
        let sampling = sample_rss([untraced.pid(), traced.pid()], bench.duration);
        let (sent, samples) = tokio::join!(futures::future::try_join_all(loads), sampling);
        sent?;
        let untraced = untraced.figures(&samples[0]).await?;
        let traced = traced.figures(&samples[1]).await?;
        let difference = traced.rss_end_mib - untraced.rss_end_mib;
        Ok(TraceMemoryReport {
            duration_s: bench.duration.as_secs(),
            rate: bench.rate,
            goal_met: difference <= GOAL_MIB && traced.spans_dropped > 0,
            rss_difference_mib: round(difference),
            untraced,
            traced,
        })
    })
}

/// The report as a table.
pub(crate) fn table(report: &TraceMemoryReport) -> String {
    let mut out = format!("{} s at {} msg/s per host; a collector that accepts and never replies\n\n", report.duration_s, report.rate);
    out.push_str("host      RSS warm  RSS end  RSS max  processed  spans made  dropped\n");
    for (name, f) in [("untraced", &report.untraced), ("traced", &report.traced)] {
        out.push_str(&format!(
            "{name:<8} {:>7.1}  {:>7.1}  {:>7.1}  {:>9}  {:>10}  {:>7}\n",
            f.rss_warm_mib, f.rss_end_mib, f.rss_max_mib, f.processed, f.spans_made, f.spans_dropped
        ));
    }
    let met = if report.goal_met { "met" } else { "not met" };
    out.push_str(&format!("\ntraced - untraced RSS at the end: {:+.1} MiB (goal <= {GOAL_MIB} MiB, drops counted): {met}\n", report.rss_difference_mib));
    out
}

fn round(mib: f64) -> f64 {
    (mib * 10.0).round() / 10.0
}

/// A collector that accepts every connection, reads what is sent and never replies: its URL.
async fn silent_collector() -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("failed to bind the silent collector")?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            // Held open until the exporter gives up on it.
            tokio::spawn(async move { tokio::io::copy(&mut stream, &mut tokio::io::sink()).await });
        }
    });
    Ok(format!("http://{address}"))
}

/// An `ebb run` of one embedded queue posting to the app; killed when dropped.
struct Host {
    child: Child,
    api: SocketAddr,
    dir: tempfile::TempDir,
}

impl Host {
    fn start(binary: &Path, app: SocketAddr, collector: Option<String>) -> anyhow::Result<Host> {
        let dir = tempfile::tempdir().context("failed to create a temporary folder for a host")?;
        let api = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let telemetry = collector.map(|url| format!("[telemetry]\notlp_endpoint = \"{url}\"\n\n")).unwrap_or_default();
        let config = format!(
            "{telemetry}[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n\n[queues.{QUEUE}]\nmax_concurrent_calls = 32\nhandler = {{ url = \"http://{app}/work\" }}\n"
        );
        std::fs::write(dir.path().join("ebb.toml"), config)?;
        let mut command = Command::new(binary);
        command.arg("run").arg("--config").arg(dir.path().join("ebb.toml")).current_dir(dir.path()).stdout(Stdio::null());
        command.stderr(std::fs::File::create(dir.path().join("host.log"))?);
        for variable in ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "EBB_API_TOKEN"] {
            command.env_remove(variable);
        }
        let child = command.spawn().with_context(|| format!("failed to start {}", binary.display()))?;
        Ok(Host { child, api, dir })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("host.log")).unwrap_or_default()
    }

    async fn ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let url = format!("http://{}/healthz", self.api);
        while !reqwest::get(&url).await.is_ok_and(|r| r.status().is_success()) {
            ensure!(Instant::now() < deadline, "the host did not come up: {}", self.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// The series `name` (summed over its labels) in `/metrics`.
    async fn metric(&self, name: &str) -> anyhow::Result<u64> {
        let url = format!("http://{}/metrics", self.api);
        let text = reqwest::Client::new().get(&url).bearer_auth(TOKEN).send().await?.error_for_status()?.text().await?;
        let values = text.lines().filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with([' ', '{'])));
        Ok(values.filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum::<f64>() as u64)
    }

    async fn figures(&self, rss: &[f64]) -> anyhow::Result<HostFigures> {
        let Some(&end) = rss.last() else { bail!("no RSS sampled: {}", self.log()) };
        Ok(HostFigures {
            rss_warm_mib: round(rss[rss.len() / 3]),
            rss_end_mib: round(end),
            rss_max_mib: round(rss.iter().copied().fold(0.0, f64::max)),
            processed: self.metric("ebb_messages_processed_total").await?,
            spans_made: self.metric("ebb_trace_spans_total").await?,
            spans_dropped: self.metric("ebb_trace_spans_dropped_total").await?,
        })
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `rate` messages a second to the host at `api` for `duration`, in 10 ms ticks, at
/// most 128 in flight (beyond that, ticks are skipped: the rate is a ceiling, not a debt).
async fn load(api: SocketAddr, rate: u64, duration: Duration) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let url = format!("http://{api}/queues/{QUEUE}/messages");
    let per_tick = (rate / 100).max(1);
    let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(128));
    let mut sends = tokio::task::JoinSet::new();
    let mut ticks = tokio::time::interval(Duration::from_millis(per_tick * 1000 / rate));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let end = Instant::now() + duration;
    while Instant::now() < end {
        ticks.tick().await;
        for _ in 0..per_tick {
            let Ok(permit) = in_flight.clone().try_acquire_owned() else { break };
            let request = client.post(&url).bearer_auth(TOKEN).body(vec![b'x'; 256]);
            sends.spawn(async move {
                let _permit = permit;
                request.send().await?.error_for_status()
            });
        }
        while let Some(done) = sends.try_join_next() {
            done?.context("a send to a host failed")?;
        }
    }
    while let Some(done) = sends.join_next().await {
        done?.context("a send to a host failed")?;
    }
    Ok(())
}

/// The RSS (MiB) of each of `pids`, sampled each second for `duration`.
async fn sample_rss(pids: [u32; 2], duration: Duration) -> [Vec<f64>; 2] {
    let mut samples = [Vec::new(), Vec::new()];
    let end = Instant::now() + duration;
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    while Instant::now() < end {
        ticks.tick().await;
        for (pid, series) in pids.iter().zip(&mut samples) {
            series.extend(rss_mib(*pid));
        }
    }
    samples
}

/// `VmRSS` of process `pid`, MiB.
fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()?;
    Some(kib / 1024.0)
}
