//! The log of every command: its filter (`EBB_LOG`, `RUST_LOG`), its format (`EBB_LOG_FORMAT`,
//! `[log] format`), and, in JSON, the lines that would otherwise bypass it (a refused command
//! line, a panic, the fatal error at exit) as JSON objects too, so that every line of stderr
//! parses.

use std::io::Write as _;
use std::path::Path;
use std::sync::OnceLock;

use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::config::{LOG_FORMAT_ENV, LogFormat};

/// The format [`init`] chose, for the lines written after it outside the log.
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// Starts the log of a command. `config`: the host's file (`run`, `scaler`, `check`);
/// its `[log] format` is read here, before anything is logged, rather than with the rest of
/// the file later: a subscriber cannot change its format once installed, and the start-up
/// lines (and a config error) must be in the format the file asks for. `EBB_LOG_FORMAT` wins
/// over the file, as the environment wins over the file for the tokens: a Deployment sets it
/// without editing the mounted ebb.toml.
///
/// With `export_spans` (a host), the file's `[telemetry]` and the OpenTelemetry variables are
/// read here too: the span exporter is a layer of the same subscriber. A bad endpoint starts
/// no exporter; the full parse of the file refuses it.
pub fn init(default_level: &str, config: Option<&Path>, export_spans: bool) {
    let text = config.and_then(|path| crate::input::read_text("config", path, crate::input::MAX_CONFIG_BYTES).ok());
    let file_format = text.as_deref().and_then(crate::config::log_format_in);
    let (format, format_warning) = log_format(std::env::var(LOG_FORMAT_ENV).ok(), file_format);
    let (filter, filter_warning) = log_filter(std::env::var("EBB_LOG").ok(), std::env::var("RUST_LOG").ok(), default_level);
    let telemetry = text.as_deref().and_then(crate::config::telemetry_in).unwrap_or_default();
    let export = if export_spans { telemetry.resolve(|var| std::env::var(var).ok()).ok().flatten() } else { None };
    let mut export_warning = None;
    let spans = export
        .and_then(|export| crate::telemetry::layer(&export).inspect_err(|error| export_warning = Some(format!("spans are not exported: {error:#}"))).ok());
    let registry = tracing_subscriber::registry().with(spans);
    let stderr = std::io::stderr;
    let _ = match format {
        LogFormat::Human => {
            // Colours only on a terminal: not into log files and journals.
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            registry.with(tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(stderr).with_filter(filter)).try_init()
        }
        LogFormat::Json => {
            // The message beside the other fields at the top level (where log shippers look
            // for it), and every span the event is in, outermost first: the queue, the task.
            let layer =
                tracing_subscriber::fmt::layer().json().flatten_event(true).with_current_span(false).with_span_list(true).with_ansi(false).with_writer(stderr);
            registry.with(layer.with_filter(filter)).try_init()
        }
    };
    let _ = FORMAT.set(format);
    if format == LogFormat::Json {
        std::panic::set_hook(Box::new(log_panic));
    }
    // Said once the log runs, so that in JSON they are JSON too.
    for warning in [format_warning, filter_warning, export_warning].into_iter().flatten() {
        tracing::warn!("{warning}");
    }
}

/// An error a command reports (the one it ends with, a problem `ebb check` found), on stderr:
/// `error: …`, or in JSON one object, written here rather than through the log so that no
/// filter (`EBB_LOG=off`) hides it.
pub fn print_error(error: &anyhow::Error) {
    match FORMAT.get() {
        Some(LogFormat::Json) => print_json_error(&format!("{error:#}"), serde_json::Map::new()),
        _ => eprintln!("error: {error:#}"),
    }
}

/// A command line clap refuses, met before the log starts: clap's usage text, or in JSON (as
/// `EBB_LOG_FORMAT` says: no file is read yet) one `ERROR` line holding it; either way the
/// exit code is clap's (2). Help and version are not errors: they go to stdout as text.
pub fn exit_on_command_line_error(error: clap::Error) -> ! {
    let (format, _) = log_format(std::env::var(LOG_FORMAT_ENV).ok(), None);
    if format == LogFormat::Human || !error.use_stderr() {
        error.exit()
    }
    // Plain text (no colours), without clap's own "error: ": the line's level says it.
    let rendered = error.render().to_string();
    let message = rendered.trim_end();
    print_json_error(message.strip_prefix("error: ").unwrap_or(message), serde_json::Map::new());
    std::process::exit(error.exit_code())
}

/// One `ERROR` line in the keys of the log's own lines and their order, `fields` after the
/// message, written to stderr past the log and its filter. A failed write is ignored: this
/// runs in the panic hook too, where a second panic would abort.
fn print_json_error(message: &str, fields: serde_json::Map<String, serde_json::Value>) {
    #[derive(serde::Serialize)]
    struct Line<'a> {
        timestamp: String,
        level: &'static str,
        message: &'a str,
        #[serde(flatten)]
        fields: serde_json::Map<String, serde_json::Value>,
        target: &'static str,
    }
    let timestamp = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
    let line = Line { timestamp, level: "ERROR", message, fields, target: "ebb" };
    let _ = writeln!(std::io::stderr().lock(), "{}", serde_json::to_string(&line).unwrap_or_default());
}

/// The panic hook in JSON: the default hook writes several raw lines (the message, the note on
/// RUST_BACKTRACE, the backtrace). A panic contained where it happens (a handler's, a rule's)
/// is one line still, written past the filter as the default hook's lines are: a panic is a
/// bug to report whatever `EBB_LOG` says.
fn log_panic(info: &std::panic::PanicHookInfo<'_>) {
    let message = crate::panics::panic_message(info.payload());
    let mut fields = serde_json::Map::new();
    fields.insert("location".into(), info.location().map(ToString::to_string).unwrap_or_default().into());
    fields.insert("thread".into(), std::thread::current().name().unwrap_or("unnamed").into());
    // Captured when RUST_BACKTRACE asks, as the default hook does.
    let backtrace = std::backtrace::Backtrace::capture();
    if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
        fields.insert("backtrace".into(), backtrace.to_string().into());
    }
    print_json_error(&format!("panicked: {message}"), fields);
}

/// The format: `EBB_LOG_FORMAT` if set and valid, else the file's, else human. An invalid
/// variable is reported (once the log runs) and ignored, as an invalid filter is.
fn log_format(env: Option<String>, file: Option<LogFormat>) -> (LogFormat, Option<String>) {
    let from_file = file.unwrap_or_default();
    match env.filter(|v| !v.trim().is_empty()) {
        None => (from_file, None),
        Some(name) => match LogFormat::parse(LOG_FORMAT_ENV, name.trim()) {
            Ok(format) => (format, None),
            Err(why) => (from_file, Some(format!("{why}; using \"{from_file}\""))),
        },
    }
}

/// The log filter: `EBB_LOG` if set (ebb's own name, kept as an alias), else `RUST_LOG` (the
/// ecosystem's convention), else the command's default. Both take `tracing` filter directives,
/// e.g. `warn,ebb=debug`. An invalid filter is reported (the warning returned, to be logged
/// once the log runs) and the default used. The default keeps the Azure SDK's own request log
/// at `warn`: it logs every failed try at `info`, a line per try per task during an outage,
/// which ebb reports itself, rate-limited.
fn log_filter(ebb_log: Option<String>, rust_log: Option<String>, default_level: &str) -> (tracing_subscriber::EnvFilter, Option<String>) {
    let default = || tracing_subscriber::EnvFilter::new(format!("{default_level},typespec_client_core=warn,azure_core=warn"));
    let Some((variable, directives)) =
        [("EBB_LOG", ebb_log), ("RUST_LOG", rust_log)].into_iter().find_map(|(name, value)| value.filter(|v| !v.trim().is_empty()).map(|v| (name, v)))
    else {
        return (default(), None);
    };
    match tracing_subscriber::EnvFilter::try_new(&directives) {
        Ok(filter) => (filter, None),
        Err(error) => (default(), Some(format!("{variable}={directives:?} is not a log filter ({error}); using {default_level:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::{log_filter, log_format};
    use crate::config::LogFormat;

    #[test]
    fn the_log_filter_comes_from_ebb_log_then_rust_log_then_the_default() {
        let filter = |ebb: Option<&str>, rust: Option<&str>| log_filter(ebb.map(Into::into), rust.map(Into::into), "info").0.to_string();
        let default = tracing_subscriber::EnvFilter::new("info,typespec_client_core=warn,azure_core=warn").to_string();
        assert_eq!(filter(None, None), default, "the Azure SDK's per-try request log stays at warn");
        // EnvFilter prints its directives in its own order.
        assert_eq!(filter(None, Some("warn,ebb=debug")), tracing_subscriber::EnvFilter::new("warn,ebb=debug").to_string());
        assert_eq!(filter(Some("error"), Some("warn")), "error");
        assert_eq!(filter(Some(""), Some("warn")), "warn", "an empty EBB_LOG is as if unset");
        assert_eq!(filter(None, Some("ebb=[[[")), default, "an invalid filter falls back to the default");
        assert!(log_filter(None, Some("ebb=[[[".into()), "info").1.is_some_and(|w| w.contains("RUST_LOG")), "and is reported");
    }

    #[test]
    fn the_log_format_comes_from_ebb_log_format_then_the_file_then_human() {
        let format = |env: Option<&str>, file: Option<LogFormat>| log_format(env.map(Into::into), file);
        assert_eq!(format(None, None), (LogFormat::Human, None));
        assert_eq!(format(None, Some(LogFormat::Json)), (LogFormat::Json, None));
        assert_eq!(format(Some("json"), None), (LogFormat::Json, None));
        assert_eq!(format(Some("human"), Some(LogFormat::Json)), (LogFormat::Human, None), "the environment wins over the file");
        assert_eq!(format(Some(" "), Some(LogFormat::Json)), (LogFormat::Json, None), "a blank variable is as if unset");
        let (chosen, warning) = format(Some("xml"), Some(LogFormat::Json));
        assert_eq!(chosen, LogFormat::Json, "an invalid variable is ignored");
        let warning = warning.unwrap_or_default();
        assert!(warning.contains("EBB_LOG_FORMAT") && warning.contains("\"human\" or \"json\"") && warning.contains("\"xml\""), "{warning}");
    }
}
