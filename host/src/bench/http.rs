//! `ebb bench http`: the handler path (issue 24). Every contender runs once per body size
//! and concurrency in each round, in turn, against one app started for the whole bench.

use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;

use super::contenders::{self, EbbSettings, Run, Setup};
use super::report::Report;
use super::server::ServerProcess;

/// Most bytes one store of the bench may hold (messages × body), so that a typo in a flag
/// does not fill the disk.
pub(crate) const MAX_STORE_BYTES: u64 = 2 << 30;

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct HttpBench {
    /// Body sizes in bytes, in the order given, without repeats.
    pub(crate) sizes: Vec<u32>,
    /// Concurrencies (T), likewise.
    pub(crate) concurrency: Vec<u32>,
    /// Messages per run of the reqwest loop and of ebb.
    pub(crate) messages: u64,
    /// Messages per run of the redb loop (its two durable commits per message make it slow;
    /// its rate hardly depends on the count).
    pub(crate) redb_messages: u64,
    pub(crate) rounds: u32,
    /// Which contenders run, in the order each round runs them (all by default; fewer to
    /// profile one of them).
    pub(crate) contenders: Vec<Contender>,
}

impl HttpBench {
    /// Refuses a combination the flags' own ranges let through: a store too large.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        let largest = u64::from(self.sizes.iter().copied().max().unwrap_or(0));
        let bytes = self.messages.max(self.redb_messages) * largest;
        if bytes > MAX_STORE_BYTES {
            bail!(
                "--messages {} × a body of {largest} bytes is {:.1} GiB per store; at most {} GiB: fewer messages or a smaller size",
                self.messages.max(self.redb_messages),
                bytes as f64 / f64::from(1 << 30),
                MAX_STORE_BYTES >> 30
            );
        }
        if self.sizes.is_empty() || self.concurrency.is_empty() || self.contenders.is_empty() {
            bail!("--sizes, --concurrency and --contenders each need at least one value");
        }
        Ok(())
    }
}

/// A contender of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Contender {
    ReqwestLoop,
    RedbLoop,
    Ebb(EbbSettings),
}

/// Every contender, in the order each round runs them.
pub(crate) const CONTENDERS: [Contender; 4] =
    [Contender::ReqwestLoop, Contender::RedbLoop, Contender::Ebb(EbbSettings::ConcurrentCalls), Contender::Ebb(EbbSettings::FixedTasks)];

impl Contender {
    /// Its name in the JSON.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Contender::ReqwestLoop => "reqwest_loop",
            Contender::RedbLoop => "redb_loop",
            Contender::Ebb(EbbSettings::ConcurrentCalls) => "ebb",
            Contender::Ebb(EbbSettings::FixedTasks) => "ebb_fixed_tasks",
        }
    }

    /// Its name in the table.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Contender::ReqwestLoop => "reqwest loop",
            Contender::RedbLoop => "redb loop",
            Contender::Ebb(EbbSettings::ConcurrentCalls) => "ebb, max_concurrent_calls = T",
            Contender::Ebb(EbbSettings::FixedTasks) => "ebb, min_tasks = max_tasks = T",
        }
    }

    async fn run(self, setup: &Setup<'_>) -> anyhow::Result<Run> {
        match self {
            Contender::ReqwestLoop => contenders::reqwest_loop(setup).await,
            Contender::RedbLoop => contenders::redb_loop(setup).await,
            Contender::Ebb(settings) => contenders::ebb(setup, settings).await,
        }
    }
}

/// One body size at one concurrency: every contender's runs, in round order.
#[derive(Debug)]
pub(crate) struct Cell {
    pub(crate) body_bytes: u32,
    pub(crate) concurrency: u32,
    pub(crate) runs: Vec<(Contender, Vec<Run>)>,
}

/// Runs the bench and prints its report: a table, or JSON with `json`.
pub(crate) fn run(bench: HttpBench, json: bool) -> anyhow::Result<()> {
    bench.check()?;
    let server = ServerProcess::start()?;
    let url = reqwest::Url::parse(&format!("http://{}/", server.address())).context("failed to make the bench server's URL")?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("failed to start the bench's runtime")?;
    let mut cells: Vec<Cell> = bench
        .sizes
        .iter()
        .flat_map(|&body_bytes| bench.concurrency.iter().map(move |&concurrency| (body_bytes, concurrency)))
        .map(|(body_bytes, concurrency)| Cell { body_bytes, concurrency, runs: bench.contenders.iter().map(|&c| (c, Vec::new())).collect() })
        .collect();
    let server_cpu = || server.cpu();
    for round in 1..=bench.rounds {
        for cell in &mut cells {
            let body = Bytes::from(vec![b'x'; cell.body_bytes as usize]);
            for (contender, runs) in &mut cell.runs {
                let dir = tempfile::tempdir().context("failed to create a temporary folder for the store")?;
                let messages = if *contender == Contender::RedbLoop { bench.redb_messages.min(bench.messages) } else { bench.messages };
                let setup = Setup { url: url.clone(), body: body.clone(), messages, concurrency: cell.concurrency, dir: dir.path(), server_cpu: &server_cpu };
                let run = runtime
                    .block_on(contender.run(&setup))
                    .with_context(|| format!("{} with {} B bodies at T = {} (round {round})", contender.label(), cell.body_bytes, cell.concurrency))?;
                eprintln!(
                    "round {round}/{}: {} B, T = {}: {}: {:.0} msg/s, {:.1} CPU ms per 1,000",
                    bench.rounds,
                    cell.body_bytes,
                    cell.concurrency,
                    contender.label(),
                    run.messages as f64 / run.elapsed.as_secs_f64().max(1e-9),
                    run.cpu.as_secs_f64() * 1e6 / run.messages.max(1) as f64
                );
                runs.push(run);
                // A store's fsyncs and freed pages settle before the next contender starts.
                drop(dir);
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    drop(runtime);
    let report = Report::new(&bench, &cells, server.address(), server.pid());
    if json {
        println!("{}", serde_json::to_string_pretty(&report.json()).context("failed to write the report as JSON")?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
