//! `ebb trace export`: a queue's recorded arrivals as a trace for `ebb simulate --trace`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::Subcommand;

use crate::config::Config;
use crate::queue::Clock as _;
use crate::record::{self, TraceLimits};
use crate::simulate::scenario;

/// `ebb trace …`.
#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// Write a queue's recorded arrivals (`record = true`, the default) as the trace
    /// `ebb simulate --trace` reads: `seconds,count` lines, seconds from the first arrival.
    /// Reads the recording in the data directory; works while the host runs (the last
    /// second or two are not written yet).
    Export {
        /// The queue.
        queue: String,
        /// How far back, from now (`90m`, `24h`, `7d`; 1s to 31days).
        #[arg(long, default_value = "24h", value_parser = parse_since)]
        since: Duration,
        /// The configuration file.
        #[arg(long, short, default_value = "ebb.toml")]
        config: PathBuf,
        /// Where to write the trace (default: stdout). A file is replaced whole (written
        /// beside it, then renamed over it); a FIFO or a character device (`/dev/null`) is
        /// written into as it is.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

fn parse_since(text: &str) -> Result<Duration, String> {
    let since = humantime::parse_duration(text).map_err(|e| format!("{e} (e.g. 90m, 24h, 7d)"))?;
    record::check_since(since).map_err(|e| e.to_string().trim_start_matches("--since: ").to_string())
}

pub fn run(command: TraceCommand) -> Result<()> {
    match command {
        TraceCommand::Export { queue, since, config, output } => export(&queue, since, &config, output.as_deref()),
    }
}

fn export(queue: &str, since: Duration, config_path: &Path, output: Option<&Path>) -> Result<()> {
    let config = Config::load(config_path)?;
    let configured = super::configured_queue(&config, queue)?;
    if let Some(path) = output {
        refuse_unwritable(path)?;
        refuse_recordings(path, &config.data_dir)?;
    }
    let limits = TraceLimits {
        max_lines: scenario::MAX_TRACE_LINES as u64,
        max_count_per_line: u64::from(scenario::MAX_COUNT_PER_LINE),
        max_messages: scenario::MAX_MESSAGES,
    };
    let export = record::export(&config.data_dir, queue, since, crate::queue::SystemClock.now_ms(), limits)?;
    for warning in &export.warnings {
        eprintln!("warning: {warning}");
    }
    let since_text = crate::durations::show(since);
    let mut text = format!("# ebb trace export: queue {queue}, the last {since_text}, {} messages\n", export.messages);
    match export.first_second {
        Some(second) => {
            let at = humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(second));
            text.push_str(&format!("# second 0 is {at}\nseconds,count\n"));
        }
        None => {
            let why = if configured.record_max_bytes.is_none() { " (the queue has record = false)" } else { "" };
            eprintln!("warning: no arrival of queue {queue} recorded in the last {since_text}{why}");
            text.push_str("seconds,count\n");
        }
    }
    text.push_str(&export.text);
    match output {
        Some(path) => write_output(path, text.as_bytes()).with_context(|| format!("-o: cannot write {}", path.display()))?,
        None => {
            use std::io::Write as _;
            std::io::stdout().lock().write_all(text.as_bytes())?;
        }
    }
    Ok(())
}

/// Whether `meta` is of a file written into as it is, not replaced: a FIFO (its reader is
/// waiting on it) or a character device (`/dev/null`, a terminal).
fn written_in_place(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt as _;
    meta.file_type().is_fifo() || meta.file_type().is_char_device()
}

/// Refuses, before any reading, an output path that is there and is neither a regular file,
/// a FIFO nor a character device (a directory, a socket, a disk).
fn refuse_unwritable(path: &Path) -> Result<()> {
    if let Ok(meta) = std::fs::metadata(path)
        && !written_in_place(&meta)
        && let Some(kind) = crate::input::file_kind(&meta)
    {
        bail!("-o: {} is {kind}; give a file, a FIFO or a character device", path.display());
    }
    // A typo in a folder's name must not make folders (once, at the root of the disk).
    if std::fs::symlink_metadata(path).is_err() {
        let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if !folder.is_dir() {
            bail!("-o: {}: the folder {} does not exist (it is not made)", path.display(), folder.display());
        }
    }
    Ok(())
}

/// Refuses an output in the recordings' own folder: it would replace what it was read from.
fn refuse_recordings(path: &Path, data_dir: &Path) -> Result<()> {
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let recordings = data_dir.join(record::DIR);
    if let (Ok(folder), Ok(recordings)) = (std::fs::canonicalize(folder), std::fs::canonicalize(&recordings))
        && folder == recordings
    {
        bail!("-o: {} is in the recordings' folder {}; write the trace elsewhere", path.display(), recordings.display());
    }
    Ok(())
}

/// Writes the trace to `path`: into a FIFO or a device as it is (it cannot be renamed over,
/// and replacing it would cut off its reader); a file whole, through a temporary file, so an
/// interrupted export never leaves half a trace behind. A link to a file is followed, so the
/// link stays.
fn write_output(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    match std::fs::metadata(path) {
        Ok(meta) if written_in_place(&meta) => {
            let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
            file.write_all(bytes)?;
        }
        Ok(_) => crate::output::write_atomically(&std::fs::canonicalize(path)?, bytes)?,
        Err(_) => crate::output::write_atomically(path, bytes)?,
    }
    Ok(())
}
