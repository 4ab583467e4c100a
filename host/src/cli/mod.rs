//! The `ebb` command line.

mod author;
mod azure_check;
mod bench;
mod client;
mod host;
mod logging;
mod promote;
mod rule;
mod rule_contexts;
mod rule_test;
mod simulate;
mod sqs_check;
mod status;
mod trace;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// ebb: queue workers whose scaling decisions are hot-swapped WebAssembly rules.
#[derive(Debug, Parser)]
#[command(name = "ebb", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the whole host on the embedded queue with example rules, an in-process app and a
    /// load in phases, printing a live line per second and a summary.
    ///
    /// Runs from any folder: its two example rules (paper-default, then proportional) are
    /// built into the binary.
    Demo {
        /// How long the demo runs.
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        duration: std::time::Duration,
        /// How long the demo app takes per message.
        #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
        processing_time: std::time::Duration,
        /// Messages in the first burst.
        #[arg(long, default_value_t = 5000)]
        burst: u64,
        /// Messages per second in the trickle phase.
        #[arg(long, default_value_t = 20)]
        trickle: u64,
        /// Where the demo queue lives: `embedded`, or `azurite` (Azure's emulator, installed
        /// from npm into ~/.cache/ebb on first use; needs Node.js 20+), to see the Azure path
        /// and its billed transactions.
        #[arg(long, default_value = "embedded", value_parser = ["embedded", "azurite"])]
        backend: String,
    },
    /// Run the host: listen to every configured queue until SIGINT or SIGTERM.
    Run {
        /// The configuration file.
        #[arg(long, short, default_value = "ebb.toml")]
        config: PathBuf,
    },
    /// Serve KEDA's external scaler only: watch every configured queue (counting it every
    /// `[scaler] poll_interval`) without processing any message, so that something answers
    /// KEDA while the workers are scaled to zero. Needs `[scaler] listen`.
    Scaler {
        /// The configuration file.
        #[arg(long, short, default_value = "ebb.toml")]
        config: PathBuf,
    },
    /// Validate a configuration file and the rules it names, without running anything.
    Check {
        /// The configuration file.
        #[arg(long, short, default_value = "ebb.toml")]
        config: PathBuf,
    },
    /// Send messages to a queue: through the running host's API, or straight into the
    /// store when no host is running.
    Send {
        /// The queue.
        queue: String,
        /// The message body; read from stdin when absent (at most `max_message_bytes`; on a queue with a claim store, a body larger than a message goes there, up to its `max_claim_check_bytes`).
        body: Option<String>,
        /// How many copies to send, 1 to 1,000,000.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=MAX_SEND_COUNT))]
        count: u64,
        /// Replay a trace's arrivals at their times (from now) through the running host's
        /// API: the CSV of `ebb simulate --trace` (`seconds[,count]` per line). Each message is
        /// the body if given, else `{"trace_seconds":…,"seq":…}`. Ctrl-C stops it.
        #[arg(long, conflicts_with = "count")]
        trace: Option<PathBuf>,
        /// Send work items instead of a message: a file of NDJSON, one item per line (a JSON
        /// string is the item's text, any other value its JSON text), `-` for stdin, at most
        /// 256 MiB. Items are packed into as few messages as fit (docs/guides/payloads.md).
        #[arg(long, conflicts_with_all = ["count", "trace", "body"])]
        items: Option<PathBuf>,
        /// After sending the message, wait for the handler's answer on the queue's
        /// `reply_queue` (matched by the message's id) and print it; with `--items`, wait for
        /// each item's answer (matched by its envelope's id and its index there) and print
        /// each reply's JSON on a line, in the order of the items. Needs a running host.
        #[arg(long, conflicts_with_all = ["count", "trace"])]
        wait_reply: bool,
        /// The message group id, for a FIFO queue (SQS `.fifo`), whose sends need one: a
        /// group's messages are handled one at a time, in send order.
        #[arg(long, conflicts_with_all = ["items", "trace", "wait_reply"])]
        group: Option<String>,
        /// With `--group`: the deduplication id (SQS drops a send whose id it saw in the last
        /// 5 minutes). Needed unless the queue has content-based deduplication.
        #[arg(long, requires = "group")]
        dedup_id: Option<String>,
        /// The W3C trace context the message (with `--items`, every item) carries to its
        /// handler, whose handling joins that trace (`00-<trace id>-<parent id>-<flags>`).
        #[arg(long, conflicts_with = "trace")]
        traceparent: Option<String>,
        /// With `--traceparent`: its W3C `tracestate`.
        #[arg(long, requires = "traceparent")]
        tracestate: Option<String>,
        /// With `--wait-reply`: how long to wait, at most 1h.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, requires = "wait_reply")]
        timeout: std::time::Duration,
        #[command(flatten)]
        token: client::TokenArgs,
        /// The configuration file.
        #[arg(long, short, default_value = "ebb.toml")]
        config: PathBuf,
    },
    /// Print the running host's state, one line per queue.
    Status {
        /// Print the raw JSON of `GET /status`.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        token: client::TokenArgs,
        /// The configuration file.
        #[arg(long, short, default_value = "ebb.toml")]
        config: PathBuf,
    },
    /// Pause a queue (no get; calls that run finish; kept across restarts) or resume it,
    /// through the running host's API, or in its data directory when no host runs.
    #[command(subcommand)]
    Queue(QueueCommand),
    /// A queue's poison messages on the running host: list them, requeue some or all to
    /// their queue (a fresh dequeue count), or purge them.
    #[command(subcommand)]
    Poison(PoisonCommand),
    /// Work with rule components: check one, or ask it for a decision.
    #[command(subcommand)]
    Rule(rule::RuleCommand),
    /// Measure ebb against what a user would write instead, in the same run: runs
    /// `ebb-bench` (a binary of its own, next to ebb or on PATH; in a checkout, `cargo run
    /// --release -p ebb-bench -- --help`).
    #[command(disable_help_flag = true)]
    Bench {
        /// The bench and its flags, passed on to `ebb-bench`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Compare rules over a scenario on the real listener, the in-memory queue and a paused
    /// clock (a simulated day takes seconds): billed transactions, $/month, pickup latency.
    Simulate(Box<simulate::SimulateArgs>),
    /// Traces of real traffic: export a queue's recorded arrivals for `ebb simulate --trace`.
    #[command(subcommand)]
    Trace(trace::TraceCommand),
}

/// `ebb queue …`.
#[derive(Debug, Subcommand)]
pub(crate) enum QueueCommand {
    /// Pause a queue: no get is made; calls that run finish and are settled.
    Pause {
        /// The queue.
        queue: String,
        /// Resume by itself after this long (`90s`, `10m`, `2h`; 1s to 365days); without
        /// it, the queue stays paused until resumed.
        #[arg(long = "for", value_name = "DURATION", value_parser = parse_pause_duration)]
        for_: Option<std::time::Duration>,
        #[command(flatten)]
        token: client::TokenArgs,
        /// The configuration file.
        #[arg(long, short, default_value = "ebb.toml")]
        config: PathBuf,
    },
    /// Resume a paused queue: gets start again at once.
    Resume {
        /// The queue.
        queue: String,
        #[command(flatten)]
        token: client::TokenArgs,
        /// The configuration file.
        #[arg(long, short, default_value = "ebb.toml")]
        config: PathBuf,
    },
}

/// `ebb poison …`.
#[derive(Debug, Subcommand)]
pub(crate) enum PoisonCommand {
    /// List a queue's poison messages, oldest first: id, when, reason, dequeue count, a preview.
    List {
        /// The queue (not its poison queue).
        queue: String,
        /// Most messages listed, 1 to 10,000.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: u32,
        /// Print the raw JSON of `GET /queues/{name}/poison`.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        token: client::TokenArgs,
        /// The configuration file.
        #[arg(long, short, default_value = "ebb.toml")]
        config: PathBuf,
    },
    /// Put poison messages back on their queue (new messages: their dequeue count starts again).
    Requeue {
        /// The queue.
        queue: String,
        /// A poison message's id, as `list` shows it (repeatable).
        #[arg(long = "id", required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<String>,
        /// Every poison message of the queue.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        token: client::TokenArgs,
        /// The configuration file.
        #[arg(long, short, default_value = "ebb.toml")]
        config: PathBuf,
    },
    /// Delete every poison message of a queue.
    Purge {
        /// The queue.
        queue: String,
        /// Confirms the purge (it cannot be undone).
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        token: client::TokenArgs,
        /// The configuration file.
        #[arg(long, short, default_value = "ebb.toml")]
        config: PathBuf,
    },
}

fn parse_pause_duration(text: &str) -> Result<std::time::Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|e| format!("{e} (e.g. 90s, 10m, 2h)"))?;
    crate::service::check_pause_length(duration)
}

impl Cli {
    /// Parses the process's command line, as [`Parser::parse`] does, and keeps what depends on
    /// where arguments stand (which `--rule` of `ebb simulate` each `--param` follows).
    pub(crate) fn from_env() -> Cli {
        use clap::{CommandFactory, FromArgMatches};
        // Refused in the log's format: a JSON log has no line of usage text.
        let matches = Cli::command().try_get_matches().unwrap_or_else(|error| logging::exit_on_command_line_error(error));
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| logging::exit_on_command_line_error(error));
        if let (Command::Simulate(args), Some(("simulate", sub))) = (&mut cli.command, matches.subcommand()) {
            args.attach_params(sub);
        }
        cli
    }
}

/// Most copies one `ebb send` sends.
const MAX_SEND_COUNT: u64 = 1_000_000;

/// The default log of the rule author's commands: warnings, and the rule's own output.
const RULE_AUTHOR_LOG: &str = "warn,ebb::rules::stderr=info";

/// Runs the command line; errors are printed with their causes and exit with code 1.
pub(crate) fn main(cli: Cli) -> ExitCode {
    // Not for `send` either: hyper writes a request body with `writev`, which raises SIGPIPE
    // (no MSG_NOSIGNAL there) when the host answers early (413, 503) and closes: the command
    // must see the answer, not die mid-send.
    if !matches!(cli.command, Command::Run { .. } | Command::Scaler { .. } | Command::Send { .. }) {
        end_quietly_when_output_closes();
    }
    // Author commands print their own results; only warnings belong on stderr, and what the
    // rule itself printed (an author's first debugging tool).
    let default_level = match cli.command {
        Command::Run { .. } | Command::Scaler { .. } => "info",
        Command::Demo { .. } => "ebb=warn",
        Command::Rule(_) | Command::Simulate(_) => RULE_AUTHOR_LOG,
        _ => "warn",
    };
    // The `[log] format` of the file a host reads holds from its first line (logging::init).
    let host_config = match &cli.command {
        Command::Run { config } | Command::Scaler { config } | Command::Check { config } => Some(config.as_path()),
        _ => None,
    };
    logging::init(default_level, host_config, matches!(cli.command, Command::Run { .. }));
    let result = match cli.command {
        Command::Rule(command) => rule::run(command),
        Command::Bench { args } => bench::run(args),
        Command::Simulate(args) => simulate::run(*args),
        Command::Trace(command) => trace::run(command),
        Command::Check { config } => host::check(&config),
        Command::Demo { duration, processing_time, burst, trickle, backend } => {
            let options = crate::demo::DemoOptions { duration, processing_time, burst, trickle_per_sec: trickle, azurite: backend == "azurite" };
            runtime().and_then(|rt| rt.block_on(crate::demo::run(options)))
        }
        Command::Run { config } => runtime().and_then(|rt| rt.block_on(host::run(&config))),
        Command::Scaler { config } => runtime().and_then(|rt| rt.block_on(host::scaler(&config))),
        Command::Send { queue, body, items: None, wait_reply: true, timeout, traceparent, tracestate, config, token, .. } => {
            let context = client::trace_context(traceparent.as_deref(), tracestate.as_deref());
            runtime().and_then(|rt| rt.block_on(client::send_wait_reply(&config, &token, &queue, body, timeout, context)))
        }
        Command::Send { queue, items: Some(items), wait_reply, timeout, traceparent, tracestate, config, token, .. } => {
            let context = client::trace_context(traceparent.as_deref(), tracestate.as_deref());
            runtime().and_then(|rt| rt.block_on(client::send_items(&config, &token, &queue, &items, wait_reply.then_some(timeout), context)))
        }
        Command::Send { queue, body, count, trace: None, group, dedup_id, traceparent, tracestate, config, token, .. } => {
            let group = group.map(|group| crate::queue::GroupedSend { group, dedup_id });
            let context = client::trace_context(traceparent.as_deref(), tracestate.as_deref());
            runtime().and_then(|rt| rt.block_on(client::send(&config, &token, &queue, count, body, group.as_ref(), context)))
        }
        Command::Send { queue, body, trace: Some(trace), config, token, .. } => {
            runtime().and_then(|rt| rt.block_on(client::send_trace(&config, &token, &queue, &trace, body)))
        }
        Command::Status { json, config, token } => runtime().and_then(|rt| rt.block_on(status::status(&config, &token, json))),
        Command::Queue(QueueCommand::Pause { queue, for_, config, token }) => {
            runtime().and_then(|rt| rt.block_on(client::pause(&config, &token, &queue, Some(for_))))
        }
        Command::Poison(command) => runtime().and_then(|rt| rt.block_on(client::poison(command))),
        Command::Queue(QueueCommand::Resume { queue, config, token }) => runtime().and_then(|rt| rt.block_on(client::pause(&config, &token, &queue, None))),
    };
    // The last spans, flushed within a bound however the collector behaves.
    crate::telemetry::shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            logging::print_error(&error);
            ExitCode::FAILURE
        }
    }
}

/// A command whose output another program reads (`ebb check | head -1`) ends quietly, as
/// `cat` does, when that program stops reading: SIGPIPE's default action ends the process.
/// Rust ignores SIGPIPE, so `println!` would panic on the closed pipe instead. Not for `run`
/// and `scaler`: a host must outlive a closed stderr; `send` calls it once its bodies are
/// sent (see [`main`]).
fn end_quietly_when_output_closes() {
    // SAFETY: setting a signal's disposition to its default; a process-wide setting that no
    // thread of ours reads or changes.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

/// The queue `name` of `config`, or an error naming the queues it has.
fn configured_queue<'a>(config: &'a crate::config::Config, name: &str) -> anyhow::Result<&'a crate::config::QueueConfig> {
    config.queues.iter().find(|q| q.name.as_str() == name).ok_or_else(|| {
        let names: Vec<&str> = config.queues.iter().map(|q| q.name.as_str()).collect();
        match names.is_empty() {
            true => anyhow::anyhow!("queue {name:?}: the configuration has no queue"),
            false => anyhow::anyhow!("queue {name:?}: not in the configuration (its queues: {})", names.join(", ")),
        }
    })
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
