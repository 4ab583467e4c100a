//! The bounds of every value and the checks that name the key and the reason.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};

/// Largest `max_message_bytes`: 1 MiB, the largest request body the API accepts.
pub(crate) const MAX_MESSAGE_BYTES_LIMIT: usize = 1 << 20;
/// Smallest `max_message_bytes`: room for an envelope of one small item, and for an
/// offloaded message's reference (a smaller limit took the body into the claim store and
/// then refused the reference, naming its size as if it were the body's).
pub const MIN_MESSAGE_BYTES_LIMIT: usize = 256;
/// Longest polling interval, scale interval, drain, handler or API timeout.
pub(crate) const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// Longest `max_pickup_delay`: a notified message should not wait longer for its get.
pub const MAX_PICKUP_DELAY: Duration = Duration::from_secs(10);
/// Longest rule call deadline: a decision is meant to take microseconds.
pub(crate) const MAX_CALL_DEADLINE: Duration = Duration::from_secs(1);
/// Most linear memory per rule instance, in MiB.
pub(crate) const MAX_MEMORY_MIB: usize = 4096;
/// Largest compiled-rule cache, in MiB (64 GiB).
pub(crate) const MAX_CACHE_MIB: u64 = 65536;
/// Most API connections at once (each holds a file descriptor; the handler calls need theirs).
pub(crate) const MAX_API_CONNECTIONS: usize = 16384;
/// Longest safety poll interval (push mode).
pub(crate) const MAX_SAFETY_POLL: Duration = Duration::from_secs(24 * 3600);
/// Highest price per 10,000 transactions, in US dollars (today's prices are cents).
pub(crate) const MAX_PRICE_PER_10K: f64 = 100.0;
/// Most instances the scaler's metric asks for.
pub(crate) const MAX_INSTANCES: u32 = 10_000;
/// Most dequeue tasks per queue (each holds up to `batch_size` messages in flight).
pub(crate) const MAX_TASKS: u32 = 1024;
/// Most handler calls at once one queue may allow (`max_concurrent_calls`).
pub const MAX_CONCURRENT_CALLS: u32 = 10_000;
pub use crate::names::MAX_QUEUE_NAME_LEN;
/// Longest `pack_linger`: a producer's item should not wait longer for its put.
pub const MAX_PACK_LINGER: Duration = Duration::from_secs(10);
/// Most items in one batch call (`max_batch_items`): a JSON array the app must hold at once.
pub const MAX_BATCH_ITEMS: u32 = 1_000;

/// The least a duration may be, for [`check_duration`].
pub(super) enum AtLeast {
    /// Zero is fine.
    Zero,
    /// At least a millisecond (the unit the listener and rules work in).
    AboveZero,
    /// At least this much.
    Duration(Duration),
}

/// Checks that `key`'s `value` is at least `min` and at most `max`, naming the key and the bounds.
pub(super) fn check_duration(key: &str, value: Duration, min: AtLeast, max: Duration) -> Result<()> {
    let show = |d: Duration| humantime::format_duration(d).to_string();
    let (ok, bounds) = match min {
        AtLeast::Zero => (value <= max, format!("at most {}", show(max))),
        AtLeast::AboveZero => (Duration::from_millis(1) <= value && value <= max, format!("1ms to {}", show(max))),
        AtLeast::Duration(min) => (min <= value && value <= max, format!("{} to {}", show(min), show(max))),
    };
    if !ok {
        bail!("{key}: must be {bounds}, got {}", show(value));
    }
    Ok(())
}

/// Largest `ca_file`: a bundle of a few hundred certificates.
pub(super) const MAX_CA_FILE_BYTES: u64 = 1 << 20;

/// A small regular file's bytes, never blocking on a FIFO or reading a device without end.
pub(super) fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::File::options().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    if !file.metadata()?.is_file() {
        bail!("not a regular file");
    }
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        bail!("larger than {limit} bytes");
    }
    Ok(bytes)
}

/// Longest path the host takes, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest name of one path component, in bytes (Linux's `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;

/// `key` names a folder (`given` as written, `path` resolved against the config's folder):
/// written out, a path the system can open, and one folder, or not existing yet (then it is
/// created), never a file.
pub(super) fn check_folder(key: &str, given: &Path, path: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    if given.as_os_str().is_empty() {
        bail!("{key}: is empty; name a folder (\".\" for the config file's own)");
    }
    let bytes = path.as_os_str().as_bytes();
    if bytes.contains(&0) {
        bail!("{key}: contains a NUL character, which no path may hold");
    }
    if bytes.len() > MAX_PATH_BYTES {
        bail!("{key}: is {} bytes long; a path may be at most {MAX_PATH_BYTES}", bytes.len());
    }
    if let Some(long) = path.components().map(|c| c.as_os_str().as_bytes()).find(|c| c.len() > MAX_NAME_BYTES) {
        bail!("{key}: has a name of {} bytes; each name in a path may be at most {MAX_NAME_BYTES}", long.len());
    }
    if let Some(existing) = path.ancestors().find(|a| a.symlink_metadata().is_ok())
        && !existing.is_dir()
    {
        if existing == path {
            bail!("{key}: {} is a file, not a folder", path.display());
        }
        bail!("{key}: {} cannot be a folder: {} is a file", path.display(), existing.display());
    }
    Ok(())
}

/// Longest API or scaler token, in bytes: far beyond any secret's need, far below what a
/// request header may carry.
pub(crate) const MAX_TOKEN_BYTES: usize = 4096;

/// Refuses a token over [`MAX_TOKEN_BYTES`], naming `key` and its length (never the token).
fn check_token_length(key: &str, token: &str) -> Result<()> {
    if token.len() > MAX_TOKEN_BYTES {
        bail!("{key}: is {} bytes; a token may be at most {MAX_TOKEN_BYTES} bytes (it is sent in an HTTP header)", token.len());
    }
    Ok(())
}

/// A token from the file (`key`) or the environment (`env`, which wins): neither empty nor
/// blank, at most [`MAX_TOKEN_BYTES`], visible ASCII only (it travels in a header).
pub(super) fn check_token(key: &str, file: Option<String>, env: &str, from_env: Option<String>) -> Result<Option<String>> {
    if file.as_deref().is_some_and(|t| t.trim().is_empty()) {
        bail!("{key}: is empty or blank; set a token, or remove the key to run without one");
    }
    let from_env = from_env.filter(|t| !t.is_empty());
    if from_env.as_deref().is_some_and(|t| t.trim().is_empty()) {
        bail!("{env}: is blank; set a token, or unset the variable");
    }
    if let Some(token) = &file {
        check_token_length(key, token)?;
    }
    if let Some(token) = &from_env {
        check_token_length(env, token)?;
    }
    let visible_ascii = |t: &str| t.bytes().all(|b| b.is_ascii_graphic());
    if file.as_deref().is_some_and(|t| !visible_ascii(t)) {
        bail!("{key}: use visible ASCII characters only (no spaces, no accents): it is sent in an HTTP header");
    }
    if from_env.as_deref().is_some_and(|t| !visible_ascii(t)) {
        bail!("{env}: use visible ASCII characters only (no spaces, no accents): it is sent in an HTTP header");
    }
    Ok(from_env.or(file))
}

/// A token's text (`key` names where it came from): neither empty nor blank, at most
/// [`MAX_TOKEN_BYTES`], visible ASCII only (it travels in a header).
pub(super) fn check_token_text(key: &str, token: &str) -> Result<()> {
    if token.trim().is_empty() {
        bail!("{key}: is empty or blank; set a token");
    }
    check_token_length(key, token)?;
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        bail!("{key}: use visible ASCII characters only (no spaces, no accents): it is sent in an HTTP header");
    }
    Ok(())
}

/// The handler URL: http or https, with a host written out (`http:///work` is rejected,
/// although URL parsing would take `work` for the host).
pub(super) fn parse_handler_url(text: &str) -> Result<reqwest::Url> {
    let url = reqwest::Url::parse(text).map_err(|e| anyhow::anyhow!("handler.url: {text:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        bail!("handler.url: {text:?} must be http or https");
    }
    let authority = text.split_once("://").map_or("", |(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or(""));
    if authority.is_empty() || url.host_str().is_none_or(str::is_empty) {
        bail!("handler.url: {text:?} has no host; write it as http://host:port/path");
    }
    Ok(url)
}
