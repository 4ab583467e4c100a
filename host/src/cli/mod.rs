//! The `ebb` command line.

mod rule;

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
    /// Work with rule components: check one, or ask it for a decision.
    #[command(subcommand)]
    Rule(rule::RuleCommand),
}

/// Runs the command line; errors are printed with their causes and exit with code 1.
pub fn main(cli: Cli) -> ExitCode {
    // Author commands print their own results; only warnings belong on stderr.
    init_logging(match cli.command {
        Command::Rule(_) => "warn",
    });
    let result = match cli.command {
        Command::Rule(command) => rule::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("EBB_LOG").unwrap_or_else(|_| default_level.into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Parses `key=value` (for `--param`).
fn parse_key_value(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("expected key=value, got {text:?}"))
}
