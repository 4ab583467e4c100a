//! The `ebb` command line.

mod author;
mod azure_check;
mod bench;
mod client;
mod host;
mod promote;
mod rule;
mod rule_contexts;
mod rule_test;
mod simulate;
mod trace;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// ebb: queue workers whose scaling decisions are hot-swapped WebAssembly rules.
#[derive(Debug, Parser)]
#[command(name = "ebb", version, about)]
pub struct Cli {
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
pub enum QueueCommand {
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
pub enum PoisonCommand {
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
    pub fn from_env() -> Cli {
        use clap::{CommandFactory, FromArgMatches};
        let matches = Cli::command().get_matches();
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
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
pub fn main(cli: Cli) -> ExitCode {
    // Not for `send` either: hyper writes a request body with `writev`, which raises SIGPIPE
    // (no MSG_NOSIGNAL there) when the host answers early (413, 503) and closes: the command
    // must see the answer, not die mid-send.
    if !matches!(cli.command, Command::Run { .. } | Command::Scaler { .. } | Command::Send { .. }) {
        end_quietly_when_output_closes();
    }
    // Author commands print their own results; only warnings belong on stderr, and what the
    // rule itself printed (an author's first debugging tool).
    init_logging(match cli.command {
        Command::Run { .. } | Command::Scaler { .. } => "info",
        Command::Demo { .. } => "ebb=warn",
        Command::Rule(_) | Command::Simulate(_) => RULE_AUTHOR_LOG,
        _ => "warn",
    });
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
        Command::Send { queue, body, items: None, wait_reply: true, timeout, config, token, .. } => {
            runtime().and_then(|rt| rt.block_on(client::send_wait_reply(&config, &token, &queue, body, timeout)))
        }
        Command::Send { queue, items: Some(items), wait_reply, timeout, config, token, .. } => {
            runtime().and_then(|rt| rt.block_on(client::send_items(&config, &token, &queue, &items, wait_reply.then_some(timeout))))
        }
        Command::Send { queue, body, count, trace: None, config, token, .. } => {
            runtime().and_then(|rt| rt.block_on(client::send(&config, &token, &queue, count, body)))
        }
        Command::Send { queue, body, trace: Some(trace), config, token, .. } => {
            runtime().and_then(|rt| rt.block_on(client::send_trace(&config, &token, &queue, &trace, body)))
        }
        Command::Status { json, config, token } => runtime().and_then(|rt| rt.block_on(client::status(&config, &token, json))),
        Command::Queue(QueueCommand::Pause { queue, for_, config, token }) => {
            runtime().and_then(|rt| rt.block_on(client::pause(&config, &token, &queue, Some(for_))))
        }
        Command::Poison(command) => runtime().and_then(|rt| rt.block_on(client::poison(command))),
        Command::Queue(QueueCommand::Resume { queue, config, token }) => runtime().and_then(|rt| rt.block_on(client::pause(&config, &token, &queue, None))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
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

/// The log filter: `EBB_LOG` if set (ebb's own name, kept as an alias), else `RUST_LOG` (the
/// ecosystem's convention), else the command's default. Both take `tracing` filter directives,
/// e.g. `warn,ebb=debug`. An invalid filter is reported and the default used. The default
/// keeps the Azure SDK's own request log at `warn`: it logs every failed try at `info`, a
/// line per try per task during an outage, which ebb reports itself, rate-limited.
fn log_filter(ebb_log: Option<String>, rust_log: Option<String>, default_level: &str) -> tracing_subscriber::EnvFilter {
    let default = || tracing_subscriber::EnvFilter::new(format!("{default_level},typespec_client_core=warn,azure_core=warn"));
    let Some((variable, directives)) =
        [("EBB_LOG", ebb_log), ("RUST_LOG", rust_log)].into_iter().find_map(|(name, value)| value.filter(|v| !v.trim().is_empty()).map(|v| (name, v)))
    else {
        return default();
    };
    tracing_subscriber::EnvFilter::try_new(&directives).unwrap_or_else(|error| {
        eprintln!("warning: {variable}={directives:?} is not a log filter ({error}); using {default_level:?}");
        default()
    })
}

fn init_logging(default_level: &str) {
    let filter = log_filter(std::env::var("EBB_LOG").ok(), std::env::var("RUST_LOG").ok(), default_level);
    // Colours only on a terminal: not into log files and journals.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
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

#[cfg(test)]
mod tests {
    use super::log_filter;

    #[test]
    fn the_log_filter_comes_from_ebb_log_then_rust_log_then_the_default() {
        let filter = |ebb: Option<&str>, rust: Option<&str>| log_filter(ebb.map(Into::into), rust.map(Into::into), "info").to_string();
        let default = tracing_subscriber::EnvFilter::new("info,typespec_client_core=warn,azure_core=warn").to_string();
        assert_eq!(filter(None, None), default, "the Azure SDK's per-try request log stays at warn");
        // EnvFilter prints its directives in its own order.
        assert_eq!(filter(None, Some("warn,ebb=debug")), tracing_subscriber::EnvFilter::new("warn,ebb=debug").to_string());
        assert_eq!(filter(Some("error"), Some("warn")), "error");
        assert_eq!(filter(Some(""), Some("warn")), "warn", "an empty EBB_LOG is as if unset");
        assert_eq!(filter(None, Some("ebb=[[[")), default, "an invalid filter falls back to the default");
    }
}
