//! The command line of `ebb-bench` (and of `ebb bench …`): measurements of ebb against what
//! a user would write instead.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::contenders::EbbSettings;
use crate::contenders::{ALL_CONTENDERS, CONTENDERS, Contender};
use crate::http;
use crate::plan::HttpBench;

/// Most messages per run.
const MAX_MESSAGES: u64 = 100_000;
/// Largest body: the embedded store's default message limit.
const MAX_BODY_BYTES: u32 = ebb::queue::embedded::DEFAULT_MAX_MESSAGE_BYTES as u32;
/// Highest concurrency.
const MAX_CONCURRENCY: u32 = 1024;
/// Most rounds.
const MAX_ROUNDS: u32 = 20;

/// ebb-bench: ebb measured against what a user would write instead, in the same run.
#[derive(Debug, Parser)]
#[command(name = "ebb-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// The handler path (issue 24): ebb's listener over the embedded store posting every
    /// message to a local app, against a plain reqwest loop and a hand-written redb queue
    /// loop in the same run: msg/s, CPU per message, bytes written to the store per message,
    /// and the goals, each met or not. Build with --release for figures worth reading.
    Http(HttpArgs),
    /// Adaptive concurrency (issue 24): in simulated time on the real listener, an app whose
    /// latency grows with the square of its calls past a knee; a sweep of fixed
    /// max_concurrent_calls against a rule that decides the concurrency itself (default: none,
    /// the sweep alone), with the goals: the rule's throughput at least 0.9 × the best fixed
    /// setting's, its handler latency p99 at most 1.5 × the latency at the knee.
    Knee(KneeArgs),
    /// The envelope's codecs (issue 20): a corpus of JSON work items packed into envelopes
    /// by each codec and by none in the same run: compression ratio, items per envelope,
    /// packing and decoding MB/s and µs per envelope. Build with --release for figures
    /// worth reading.
    Codecs(CodecsArgs),
    /// Claim checks (issue 20): a large body put and got through ebb's claim-check store on
    /// Azurite's blob service (started by the bench), against a loop of the official SDK's
    /// own upload and download of the same bytes in the same run: time and MB/s each way,
    /// and whether every body came back byte-identical (SHA-256).
    Claims(ClaimsArgs),
    /// Packing (issue 20): producers sending one 1 KiB item at a time through a real host,
    /// packed (shared envelopes within pack_linger) against unpacked (a message per item)
    /// in the same run, on the embedded queue and (with --azurite-port) on a running
    /// Azurite: billed transactions per item, pickup p50/p99 from the send, items per
    /// second, and the goals. Build with --release for figures worth reading.
    Payloads(PayloadsArgs),
    /// Recording arrivals (issue 22): producers send through a queue handle into the
    /// embedded store while the listener posts every message to a local app, with recording
    /// on and off alternating in each round: msg/s and CPU per message (medians), the cost in
    /// percent of throughput, and the goal (at most 1 %). Build with --release for figures
    /// worth reading.
    Record(RecordArgs),
    /// A shadow rule's added cost per decision (issue 22): a rule in Rust decides with no
    /// shadow and with one (the same rule), batch by batch in one run, every decision timed;
    /// p50 and p99 of each and their difference, against the goal of at most 1 µs at p50.
    /// Build with --release for figures worth reading.
    Shadow(ShadowArgs),
    /// What a failure decision costs (issue 22): a WASM rule that exports
    /// ebb:rules/failures, asked through its queue's rule slot as the listener asks it,
    /// against the same policy in Rust run in the host, batch by batch in one run: p50 and
    /// p99 per decision. Build with --release for figures worth reading.
    Failures(FailuresArgs),
    /// Throughput on Amazon SQS (issue 37): ebb's listener against a hand-written loop of
    /// the same SDK (receive 10, handle, DeleteMessageBatch) with as many tasks, alternating
    /// on one queue: msg/s, ebb's ratio to the loop (goal: at least 0.9) and requests per
    /// message. Starts nothing: the endpoint and region come from the flags or the SDK's
    /// environment (AWS_ENDPOINT_URL, AWS_REGION, the credential variables), e.g. moto.
    Sqs(SqsArgs),
    /// What a collector that never answers costs in memory (issue 39): two `ebb run` hosts
    /// side by side under the same steady load, one exporting its spans to a collector that
    /// accepts and never replies, one without [telemetry]: RSS (warm, end, highest), spans
    /// made and dropped, and the goal (RSS within 20 MiB, drops counted). Give a release
    /// `ebb` for figures worth reading.
    TraceMemory(TraceMemoryArgs),
    /// The app `ebb bench http` posts to: 200 with an empty body at once, on 127.0.0.1 (a
    /// free port, written to --port-file), until stdin closes. Started by the bench itself.
    #[command(hide = true)]
    Serve {
        /// Where to write the port once listening.
        #[arg(long)]
        port_file: PathBuf,
    },
}

#[derive(Debug, Args)]
pub(crate) struct ShadowArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Decisions timed per contender, 256 to 10,000,000.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(256..=10_000_000))]
    decisions: u64,
    /// A rule component (.wasm) deciding live and in the shadow, each in its own instance;
    /// without it, the same arithmetic compiled into the host.
    #[arg(long)]
    rule: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct SqsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// The SQS endpoint (default: the SDK's: AWS_ENDPOINT_URL_SQS, AWS_ENDPOINT_URL, or AWS's).
    #[arg(long)]
    endpoint: Option<String>,
    /// The region (default: the SDK's: AWS_REGION, the shared profile).
    #[arg(long)]
    region: Option<String>,
    /// The queue, created when missing (and its -poison queue); it must be empty.
    #[arg(long, default_value = "ebb-bench")]
    queue: String,
    /// Messages per run, 10 to 100,000.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(10..=MAX_MESSAGES))]
    messages: u64,
    /// The loop's tasks and ebb's dequeue tasks, 1 to 64.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    tasks: u32,
    /// Body size in bytes, 1 to 65,536.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    body_bytes: u32,
    /// Rounds, 1 to 20: each runs the loop and ebb, in turn (the order alternates).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_ROUNDS)))]
    rounds: u32,
}

#[derive(Debug, Args)]
pub(crate) struct TraceMemoryArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// How long the load lasts (the goal: 10 minutes), 10s to 1h.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    duration: std::time::Duration,
    /// Messages a second sent to each host, 10 to 5,000.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=5_000))]
    rate: u64,
    /// The `ebb` the hosts run (default: `ebb` beside this program).
    #[arg(long)]
    host_binary: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct FailuresArgs {
    /// A rule component of the failure-aware-rule world (contract 0.4.0), e.g.
    /// example-rules/retry-policy built for wasm32-wasip2.
    #[arg(long)]
    rule: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Decisions timed per contender, 1,024 to 10,000,000.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1_024..=10_000_000))]
    decisions: u64,
}

#[derive(Debug, Args)]
pub(crate) struct HttpArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Rounds, 1 to 20: each runs every contender once per size and concurrency, in turn;
    /// the figures are medians over the rounds.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_ROUNDS)))]
    rounds: u32,
    /// Messages per run of the reqwest loop and of ebb, 1 to 100,000. The default makes the
    /// reqwest loop's runs last about half a second: shorter ones are mostly noise.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=MAX_MESSAGES))]
    messages: u64,
    /// Messages per run of the redb loop, 1 to 100,000 (at most --messages): it commits
    /// twice per message, one transaction at a time, so it is slow and its rate hardly
    /// depends on the count.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=MAX_MESSAGES))]
    redb_messages: u64,
    /// Body sizes in bytes, comma-separated, each 1 to 65,536. The throughput goals
    /// are set for 256 and 16384.
    #[arg(long, value_delimiter = ',', default_values_t = [256, 16384], value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BODY_BYTES)))]
    sizes: Vec<u32>,
    /// Concurrency T, comma-separated, each 1 to 1,024: the reqwest and redb loops' tasks,
    /// ebb's max_concurrent_calls (one variant) and its task count (the other).
    #[arg(long, value_delimiter = ',', default_values_t = [4, 16, 32], value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CONCURRENCY)))]
    concurrency: Vec<u32>,
    /// Which contenders run, comma-separated (default: all). The goals need both baselines
    /// and ebb; fewer contenders are for profiling one of them.
    #[arg(long, value_delimiter = ',', value_enum)]
    contenders: Vec<ContenderArg>,
}

#[derive(Debug, Args)]
pub(crate) struct KneeArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Calls at once past which the app slows down, 1 to 10,000.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=i64::from(ebb::simulate::scenario::MAX_HANDLER_KNEE)))]
    knee: u32,
    /// The app's latency up to the knee (more than 0, at most 10 minutes).
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    latency: std::time::Duration,
    /// Fixed max_concurrent_calls to sweep, comma-separated, each 1 to 10,000; the highest is
    /// also the rule's ceiling.
    #[arg(long, value_delimiter = ',', default_values_t = ebb::simulate::knee::FIXED.to_vec(), value_parser = clap::value_parser!(u32).range(1..=i64::from(ebb::config::MAX_CONCURRENT_CALLS)))]
    fixed: Vec<u32>,
    /// A rule component that decides the concurrency (contract 0.3.0), e.g.
    /// example-rules/adaptive-concurrency built for wasm32-wasip2.
    #[arg(long)]
    rule: Option<PathBuf>,
    /// A parameter for the rule, as in the queue's `rule_params` (repeatable).
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    params: Vec<(String, String)>,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Debug, Args)]
pub(crate) struct RecordArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Rounds, 1 to 20: each runs recording off and on, in turn (the order alternates).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_ROUNDS)))]
    rounds: u32,
    /// Messages per run, 1 to 100,000.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=MAX_MESSAGES))]
    messages: u64,
    /// Producer tasks and the queue's max_concurrent_calls, 1 to 1,024.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CONCURRENCY)))]
    concurrency: u32,
    /// Body size in bytes, 1 to 65,536.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BODY_BYTES)))]
    body_bytes: u32,
}

#[derive(Debug, Args)]
pub(crate) struct CodecsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Rounds, 1 to 20: each runs every codec once, in turn; the figures are medians.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_ROUNDS)))]
    rounds: u32,
    /// Work items in the corpus, 1 to 100,000.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    items: u64,
    /// Each item's length in bytes, 512 to 16,384.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(512..=16_384))]
    item_bytes: u64,
    /// The message limit envelopes are packed to, in bytes (default: an Azure message's;
    /// the embedded queue's default is 65,536).
    #[arg(long, default_value_t = ebb::payload::AZURE_MAX_ENVELOPE_BYTES as u64, value_parser = clap::value_parser!(u64).range(16_384..=u64::from(MAX_BODY_BYTES)))]
    envelope_bytes: u64,
}

#[derive(Debug, Args)]
pub(crate) struct ClaimsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Rounds, 1 to 20: each puts and gets the body through ebb, then through the SDK loop;
    /// the figures are medians.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_ROUNDS)))]
    rounds: u32,
    /// The body's length in MiB, 1 to 100 (the default max_claim_check_bytes).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=100))]
    mib: u64,
    /// Azurite's blob service to start (default: where the tests install it,
    /// target/azurite/node_modules/.bin/azurite-blob).
    #[arg(long)]
    azurite_blob: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct PayloadsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Items per run, 1 to 100,000.
    #[arg(long, default_value_t = 4000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    items: u64,
    /// Producers, each sending one item at a time, 1 to 1,024.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    producers: u32,
    /// Calls each producer has in flight, 1 to 64 (1: it waits for each answer, so at most
    /// one item per producer can share a message).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    in_flight: u32,
    /// Each item's length in bytes, 512 to 16,384.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(512..=16_384))]
    item_bytes: u64,
    /// The packed runs' pack_linger, at most 10s.
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
    linger: std::time::Duration,
    /// Also run on the Azurite whose queue service listens on this port of 127.0.0.1 (the
    /// development account; start it yourself, e.g. `azurite-queue --queuePort 10001`).
    #[arg(long)]
    azurite_port: Option<u16>,
}

/// A contender, as `--contenders` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ContenderArg {
    /// A plain reqwest loop: T tasks posting the body, no queue.
    ReqwestLoop,
    /// A hand-written redb queue loop: lease one (a durable commit), post, delete (another).
    RedbLoop,
    /// ebb's listener with the default task settings and max_concurrent_calls = T.
    Ebb,
    /// ebb's listener with min_tasks = max_tasks = T.
    EbbFixedTasks,
    /// As `ebb`, its spans exported over OTLP/HTTP to a collector in the bench's process
    /// (not run unless named: the cost of `[telemetry]`, against `ebb` in the same run).
    EbbTraced,
}

impl From<ContenderArg> for Contender {
    fn from(arg: ContenderArg) -> Contender {
        match arg {
            ContenderArg::ReqwestLoop => Contender::ReqwestLoop,
            ContenderArg::RedbLoop => Contender::RedbLoop,
            ContenderArg::Ebb => Contender::Ebb(EbbSettings::ConcurrentCalls),
            ContenderArg::EbbFixedTasks => Contender::Ebb(EbbSettings::FixedTasks),
            ContenderArg::EbbTraced => Contender::Ebb(EbbSettings::Traced),
        }
    }
}

/// Keeps the first of each value, in order.
fn distinct(values: Vec<u32>) -> Vec<u32> {
    let mut seen = std::collections::HashSet::new();
    values.into_iter().filter(|v| seen.insert(*v)).collect()
}

/// Parses `args` (the program's name first), exiting with clap's message when they do not parse.
pub(crate) fn parse(args: Vec<OsString>) -> BenchCommand {
    Cli::parse_from(args).command
}

/// Runs one bench; `leading` selects the bench in this binary (see [`crate::main`]).
pub(crate) fn run(command: BenchCommand, leading: &[&str]) -> anyhow::Result<()> {
    match command {
        BenchCommand::Http(args) => http(args, leading),
        BenchCommand::Knee(args) => knee(args),
        BenchCommand::Payloads(args) => payloads(args),
        BenchCommand::Codecs(args) => codecs(args),
        BenchCommand::Claims(args) => {
            let bench = crate::claims::ClaimsBench {
                body_bytes: (args.mib << 20) as usize,
                rounds: args.rounds,
                azurite_blob: args.azurite_blob.unwrap_or_else(crate::claims::default_azurite_blob),
            };
            let report = crate::claims::run(&bench)?;
            print_report(args.json, &report, crate::claims::table)
        }
        BenchCommand::Record(args) => crate::record::run(
            crate::record::RecordBench { messages: args.messages, concurrency: args.concurrency, body_bytes: args.body_bytes, rounds: args.rounds },
            args.json,
            leading,
        ),
        BenchCommand::Shadow(args) => {
            let report = crate::shadow::run(usize::try_from(args.decisions)?, args.rule.as_deref())?;
            print_report(args.json, &report, crate::shadow::table)
        }
        BenchCommand::Failures(args) => {
            let report = crate::failures::run(&args.rule, usize::try_from(args.decisions)?)?;
            print_report(args.json, &report, crate::failures::table)
        }
        BenchCommand::Sqs(args) => {
            let bench = crate::sqs::SqsBench {
                region: args.region,
                endpoint: args.endpoint,
                queue: args.queue,
                messages: args.messages,
                tasks: args.tasks,
                body_bytes: args.body_bytes,
                rounds: args.rounds,
            };
            let report = crate::sqs::run(&bench)?;
            print_report(args.json, &report, crate::sqs::table)
        }
        BenchCommand::TraceMemory(args) => {
            if !(Duration::from_secs(10)..=Duration::from_secs(3600)).contains(&args.duration) {
                anyhow::bail!("--duration: 10s to 1h, got {}", humantime::format_duration(args.duration));
            }
            let host_binary = match args.host_binary {
                Some(path) => path,
                None => std::env::current_exe().context("failed to find this program")?.with_file_name("ebb"),
            };
            let bench = crate::trace_memory::TraceMemoryBench { duration: args.duration, rate: args.rate, host_binary };
            let report = crate::trace_memory::run(&bench, leading)?;
            print_report(args.json, &report, crate::trace_memory::table)
        }
        BenchCommand::Serve { port_file } => crate::server::serve(&port_file),
    }
}

/// Prints `report` as pretty JSON with `json`, else as `table` makes it.
fn print_report<R: serde::Serialize>(json: bool, report: &R, table: impl FnOnce(&R) -> String) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", table(report));
    }
    Ok(())
}

/// `http`: the flags checked against each other, then the bench.
fn http(args: HttpArgs, leading: &[&str]) -> anyhow::Result<()> {
    if args.redb_messages > args.messages {
        anyhow::bail!("--redb-messages: at most --messages ({}), as its help says; got {}", args.messages, args.redb_messages);
    }
    let bench = HttpBench {
        sizes: distinct(args.sizes),
        concurrency: distinct(args.concurrency),
        messages: args.messages,
        redb_messages: args.redb_messages,
        rounds: args.rounds,
        // Always in the bench's own order, whatever order they were named in.
        contenders: ALL_CONTENDERS
            .into_iter()
            .filter(|c| if args.contenders.is_empty() { CONTENDERS.contains(c) } else { args.contenders.iter().any(|a| Contender::from(*a) == *c) })
            .collect(),
    };
    http::run(bench, args.json, leading)
}

/// `knee`: the app's latency and the rule's parameters checked, then the sweep.
fn knee(args: KneeArgs) -> anyhow::Result<()> {
    if args.latency.is_zero() {
        anyhow::bail!("--latency: more than 0 (an app that takes no time has no knee to find)");
    }
    if args.latency > ebb::simulate::scenario::MAX_HANDLER_TIME {
        anyhow::bail!("--latency: at most {}", humantime::format_duration(ebb::simulate::scenario::MAX_HANDLER_TIME));
    }
    if args.rule.is_none() && !args.params.is_empty() {
        anyhow::bail!("--param: give --rule FILE.wasm for it");
    }
    refuse_repeated_params(&args.params)?;
    let rule = args.rule.map(|path| ebb::simulate::RuleChoice::Wasm(ebb::simulate::RuleFile { path, params: args.params }));
    let report = ebb::simulate::knee::run(args.knee, args.latency, &distinct(args.fixed), rule, args.seed)?;
    print_report(args.json, &report, ebb::simulate::knee::table)
}

/// `payloads`: the linger checked, then the runs on a runtime of their own.
fn payloads(args: PayloadsArgs) -> anyhow::Result<()> {
    if args.linger > ebb::config::MAX_PACK_LINGER {
        anyhow::bail!("--linger: at most {}", humantime::format_duration(ebb::config::MAX_PACK_LINGER));
    }
    let bench = crate::payloads::PayloadsBench {
        items: args.items,
        producers: args.producers,
        in_flight: args.in_flight,
        item_bytes: args.item_bytes as usize,
        linger: args.linger,
        azurite_port: args.azurite_port,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let runs = runtime.block_on(crate::payloads::run(&bench))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&crate::payloads::json(&bench, &runs))?);
    } else {
        print!("{}", crate::payloads::table(&bench, &runs));
    }
    Ok(())
}

/// `codecs`: the corpus packed by each codec, then the report.
fn codecs(args: CodecsArgs) -> anyhow::Result<()> {
    let bench = crate::codecs::CodecsBench {
        items: args.items as usize,
        item_bytes: args.item_bytes as usize,
        envelope_bytes: args.envelope_bytes as usize,
        rounds: args.rounds,
    };
    let figures = crate::codecs::run(&bench)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&crate::codecs::json(&bench, &figures))?);
    } else {
        print!("{}", crate::codecs::table(&bench, &figures));
    }
    Ok(())
}

/// Parses `key=value` (for `--param`).
fn parse_key_value(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("expected key=value, got {text:?}"))
}

/// Refuses a parameter given twice: in a queue's `rule_params` (a TOML table) a key is
/// given once, and the last of two silently winning hides a typo.
fn refuse_repeated_params(params: &[(String, String)]) -> anyhow::Result<()> {
    let mut seen = std::collections::HashSet::new();
    match params.iter().find(|(key, _)| !seen.insert(key.as_str())) {
        Some((key, _)) => anyhow::bail!("--param {key}: given twice (a rule parameter takes one value)"),
        None => Ok(()),
    }
}

/// A bench's output read by another program (`ebb-bench http | head -1`) ends quietly, as
/// `cat` does, when that program stops reading: SIGPIPE's default action ends the process.
/// Rust ignores SIGPIPE, so `println!` would panic on the closed pipe instead.
pub(crate) fn end_quietly_when_output_closes() {
    // SAFETY: setting a signal's disposition to its default; a process-wide setting that no
    // thread of ours reads or changes.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Logs to stderr: warnings, unless `EBB_LOG` or `RUST_LOG` says otherwise (as `ebb` does).
/// With `export_spans` (the `ebb_traced` contender), the span exporter beside it, off until
/// that contender runs.
pub(crate) fn init_logging(export_spans: bool) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let directives = ["EBB_LOG", "RUST_LOG"].into_iter().find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()));
    let filter = directives.and_then(|d| tracing_subscriber::EnvFilter::try_new(d).ok()).unwrap_or_else(|| tracing_subscriber::EnvFilter::new("warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let spans = export_spans.then(crate::traced::layer).transpose().unwrap_or_else(|error| {
        eprintln!("warning: spans are not exported: {error:#}");
        None
    });
    let log = tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(std::io::stderr);
    let _ = tracing_subscriber::registry().with(spans).with(tracing_subscriber::Layer::with_filter(log, filter)).try_init();
}

/// Whether `command` runs the `ebb_traced` contender.
pub(crate) fn exports_spans(command: &BenchCommand) -> bool {
    matches!(command, BenchCommand::Http(args) if args.contenders.contains(&ContenderArg::EbbTraced))
}
