//! Paused queues, kept in `<data_dir>/paused.json` so that a pause outlives a restart (an
//! operator who paused a queue expects it to stay paused). Written whole on every change:
//! to a temporary file, synced, then renamed over the old one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::listener::Pause;

/// The file's name in the data directory.
pub const PAUSES_FILE: &str = "paused.json";
/// The largest pauses file read (one entry per queue is a few dozen bytes).
const MAX_FILE_BYTES: u64 = 1 << 20;
/// The latest time a pause may name: the end of the year 9999, in milliseconds since the
/// Unix epoch (what RFC 3339 can show).
const LATEST_MS: u64 = 253_402_300_799_999;
/// The longest pause with an end (`--for`): longer ones are pauses until resumed.
pub const MAX_PAUSE: Duration = Duration::from_secs(365 * 24 * 3600);

/// A pause's length as `ebb queue pause --for` and `?for=` take it: 1 s to [`MAX_PAUSE`].
pub fn check_pause_length(length: Duration) -> Result<Duration, String> {
    if length < Duration::from_secs(1) || length > MAX_PAUSE {
        return Err(format!("{} is outside 1s to {}", crate::durations::show(length), crate::durations::show(MAX_PAUSE)));
    }
    Ok(length)
}

/// The pauses of a host's queues, and their file.
pub struct Pauses {
    file: PathBuf,
    queues: Mutex<BTreeMap<String, Pause>>,
}

impl Pauses {
    /// Reads `<data_dir>/paused.json` (none: no queue is paused). A file that cannot be read
    /// is an error naming it: starting with its queues unpaused would process what an
    /// operator held back.
    pub fn open(data_dir: &Path) -> Result<Pauses> {
        let file = data_dir.join(PAUSES_FILE);
        let queues: BTreeMap<String, Pause> = match std::fs::metadata(&file) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(error) => return Err(error).with_context(|| format!("failed to read paused queues {}", file.display())),
            // A FIFO would hang the start, a device never end: only a regular file is read.
            Ok(meta) if !meta.is_file() => bail!("paused queues {} is not a regular file; delete it to resume every queue", file.display()),
            Ok(_) => {
                use std::io::Read as _;
                let mut text = Vec::new();
                let opened = std::fs::File::open(&file).with_context(|| format!("failed to read paused queues {}", file.display()))?;
                opened.take(MAX_FILE_BYTES + 1).read_to_end(&mut text).with_context(|| format!("failed to read paused queues {}", file.display()))?;
                if text.len() as u64 > MAX_FILE_BYTES {
                    bail!("paused queues {} is more than {MAX_FILE_BYTES} bytes: not a file ebb wrote", file.display());
                }
                serde_json::from_slice(&text)
                    .with_context(|| format!("paused queues {} is damaged; fix it, or delete it to resume every queue", file.display()))?
            }
        };
        if let Some((queue, _)) = queues.iter().find(|(_, pause)| pause.since_ms > LATEST_MS || pause.until_ms.is_some_and(|until| until > LATEST_MS)) {
            bail!("paused queues {}: the pause of {queue} has a time past the year 9999; fix it, or delete the file to resume every queue", file.display());
        }
        Ok(Pauses { file, queues: Mutex::new(queues) })
    }

    /// The queues the file holds a pause for.
    pub fn queues(&self) -> Vec<String> {
        self.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner).keys().cloned().collect()
    }

    /// The pause of `queue` kept in the file, if any (ended or not: the listener tells).
    pub fn get(&self, queue: &str) -> Option<Pause> {
        self.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(queue).copied()
    }

    /// Records `queue`'s pause (`None`: resumed) and writes the file; pauses ended by
    /// `now_ms` are dropped from it. On an error the file is as before, and so is a pause; a
    /// resume still holds here (on a full disk the queue must drain to free space) and goes
    /// to the file with the next change written.
    pub fn set(&self, queue: &str, pause: Option<Pause>, now_ms: u64) -> Result<()> {
        let mut queues = self.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut next = queues.clone();
        match pause {
            Some(pause) => next.insert(queue.to_string(), pause),
            None => next.remove(queue),
        };
        next.retain(|_, pause| pause.holds_at(now_ms));
        let written = crate::output::write_atomically(&self.file, &serde_json::to_vec_pretty(&next)?)
            .with_context(|| format!("failed to write paused queues {}", self.file.display()));
        if written.is_ok() || pause.is_none() {
            *queues = next;
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_survive_a_reopen_and_ended_ones_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let pauses = Pauses::open(dir.path()).unwrap();
        assert_eq!(pauses.get("orders"), None);
        let held = Pause { since_ms: 1_000, until_ms: None };
        pauses.set("orders", Some(held), 2_000).unwrap();
        pauses.set("mail", Some(Pause { since_ms: 1_000, until_ms: Some(5_000) }), 2_000).unwrap();
        let reopened = Pauses::open(dir.path()).unwrap();
        assert_eq!(reopened.get("orders"), Some(held));
        assert!(reopened.get("mail").is_some());
        reopened.set("orders", None, 6_000).unwrap();
        let again = Pauses::open(dir.path()).unwrap();
        assert_eq!((again.get("orders"), again.get("mail")), (None, None), "resumed, and ended at 5 s");
    }

    #[test]
    fn a_pause_recorded_before_the_first_start_creates_the_data_folder() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("not-yet");
        let pauses = Pauses::open(&data).unwrap();
        pauses.set("orders", Some(Pause { since_ms: 1, until_ms: None }), 2).unwrap();
        assert!(Pauses::open(&data).unwrap().get("orders").is_some());
    }

    #[test]
    fn files_ebb_did_not_write_are_refused_without_hanging_or_reading_them_whole() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(PAUSES_FILE);
        std::os::unix::fs::symlink("/dev/zero", &file).unwrap();
        let error = format!("{:#}", Pauses::open(dir.path()).err().unwrap());
        assert!(error.contains("is not a regular file"), "{error}");
        std::fs::remove_file(&file).unwrap();
        assert!(std::process::Command::new("mkfifo").arg(&file).status().unwrap().success());
        let error = format!("{:#}", Pauses::open(dir.path()).err().unwrap());
        assert!(error.contains("is not a regular file"), "{error}");
        std::fs::remove_file(&file).unwrap();
        std::fs::write(&file, br#"{"orders": {"since_ms": 1, "until_ms": 18446744073709551615}}"#).unwrap();
        let error = format!("{:#}", Pauses::open(dir.path()).err().unwrap());
        assert!(error.contains("the pause of orders has a time past the year 9999"), "{error}");
    }

    /// Issue 35 item 6: a paused queue could not be resumed on a full disk (the file could
    /// not be written), so it could not drain to free space. The resume holds here, and the
    /// next change written keeps it; a pause that cannot be kept is refused.
    #[test]
    fn a_resume_the_file_cannot_keep_holds_here_and_the_next_write_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let pauses = Pauses::open(dir.path()).unwrap();
        let held = Pause { since_ms: 1_000, until_ms: None };
        pauses.set("orders", Some(held), 2_000).unwrap();
        pauses.set("mail", Some(held), 2_000).unwrap();
        // The file cannot be replaced (as on a full disk, where its new copy cannot be written).
        let file = dir.path().join(PAUSES_FILE);
        std::fs::remove_file(&file).unwrap();
        std::fs::create_dir_all(file.join("in-the-way")).unwrap();
        let error = format!("{:#}", pauses.set("orders", None, 3_000).unwrap_err());
        assert!(error.contains("failed to write paused queues") && error.contains(PAUSES_FILE), "{error}");
        assert_eq!(pauses.get("orders"), None, "resumed here");
        assert!(pauses.set("jobs", Some(held), 3_000).is_err());
        assert_eq!(pauses.get("jobs"), None, "a pause that cannot be kept is refused");
        std::fs::remove_dir_all(&file).unwrap();
        pauses.set("mail", Some(held), 4_000).unwrap();
        let reopened = Pauses::open(dir.path()).unwrap();
        assert_eq!((reopened.get("orders"), reopened.get("mail")), (None, Some(held)), "the next write kept the resume");
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(PAUSES_FILE), b"{\"orders\": 12").unwrap();
        let error = format!("{:#}", Pauses::open(dir.path()).err().unwrap());
        assert!(error.contains("paused.json is damaged; fix it, or delete it to resume every queue"), "{error}");
    }
}
