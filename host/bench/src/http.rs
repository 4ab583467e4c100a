//! `ebb bench http`: the handler path (issue 24). Every contender runs once per body size
//! and concurrency in each round, in turn, against one app started for the whole bench.

use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;

use crate::contenders::{Contender, Setup};
use crate::plan::{Cell, HttpBench};
use crate::report::Report;
use crate::server::ServerProcess;

/// Runs the bench and prints its report: a table, or JSON with `json`.
pub(crate) fn run(bench: HttpBench, json: bool, leading: &[&str]) -> anyhow::Result<()> {
    bench.check()?;
    let server = ServerProcess::start(leading)?;
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
