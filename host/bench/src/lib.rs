//! `ebb-bench` (also `ebb bench …`): ebb measured against what a user would write instead,
//! in the same run. A crate of its own, apart from the shipped library, over its public API:
//! `cargo run --release -p ebb-bench -- http` (docs/benchmarks.md).
//!
//! Each bench interleaves its contenders (A, B, C, A, B, C …) so that the drift of a shared,
//! noisy machine hits all of them alike, and reports medians over the rounds.
//!
//! - `http`: the handler path (issue 24): messages POSTed to a local app by a plain reqwest
//!   loop, by a hand-written redb queue loop, and by ebb's listener over the embedded store;
//!   throughput, CPU per message and bytes written to the store per message.
//! - `server`: that local app, an HTTP server answering 200 at once, run as a process of its
//!   own (`ebb-bench serve`) so that its CPU is not counted as the client's.
//! - `plan`: what `http` runs and the runs it gathers.
//! - `contenders`: the three ways of moving the messages, one run each.
//! - `measure`: what a run is measured with: the process's CPU time, and a storage backend
//!   counting the bytes redb writes.
//! - `report`: medians, ratios, the goals, and the table or JSON printed.
//! - `claims`: a large body (50 MiB by default) through a claim-check store on Azurite's
//!   blob service, against the official SDK's own upload and download of the same bytes.
//! - `record`: what recording arrivals costs at load (issue 22): the same run, recording
//!   on and off, alternating.
//! - `codecs`: the envelope's codecs (issue 20) on a corpus of JSON work items: ratio,
//!   items per envelope, packing and decoding speed, against no compression.
//! - `payloads`: producers sending one item at a time, packed against unpacked, through a
//!   real host (issue 20): billed transactions per item, pickup latency, items per second.
//! - `shadow`: a shadow rule's added cost per decision (issue 22), against no shadow.
//! - `sqs`: throughput on Amazon SQS (issue 37): ebb's listener against a hand-written
//!   receive-10, delete-batch loop of the same SDK, on an endpoint the bench is given.
//! - `trace_memory`: what a collector that never answers costs a host in memory (issue 39):
//!   two `ebb run` hosts under the same load, one exporting spans to it, one not.
//! - `cli`: the command line.

mod claims;
mod cli;
mod codecs;
mod contenders;
mod failures;
mod http;
mod measure;
mod payloads;
mod plan;
mod record;
mod report;
mod server;
mod shadow;
mod sqs;
mod trace_memory;
mod traced;

use std::ffi::OsString;
use std::process::ExitCode;

/// Runs `ebb-bench` on this process's command line, printing an error with its causes and
/// exiting with code 1 on failure. `leading` are the arguments that select the bench in this
/// binary, skipped before parsing: `&[]` in `ebb-bench`, `&["bench"]` in a binary that hands
/// `bench …` here. The bench starts its app server again through them (`… serve`).
pub fn main(leading: &[&str]) -> ExitCode {
    let mut args = std::env::args_os();
    let program = args.next().unwrap_or_else(|| OsString::from("ebb-bench"));
    let args: Vec<OsString> = std::iter::once(program).chain(args.skip(leading.len())).collect();
    let command = cli::parse(args);
    cli::end_quietly_when_output_closes();
    cli::init_logging(cli::exports_spans(&command));
    match cli::run(command, leading) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
