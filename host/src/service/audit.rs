//! The audit log: every change an operator makes to a queue (pause, resume, requeue, purge),
//! through the API or `ebb queue` with no host running, is appended to
//! `<data_dir>/audit.log`, one JSON object a line: when, who, what, on which queue, and how it
//! ended. Past 10 MiB the file is moved to `audit.log.1` (the one before is dropped).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

/// The file's name in the data directory.
pub const AUDIT_FILE: &str = "audit.log";
/// The size past which the file is moved aside.
const MAX_FILE_BYTES: u64 = 10 << 20;
/// The most of the file's end read for the recent entries.
const TAIL_BYTES: u64 = 1 << 20;

/// One change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// When, RFC 3339.
    pub at: String,
    /// Who: the name of the API token the change came with (`default` for `api.token`,
    /// `anonymous` when the API has no token), or `cli` (`ebb queue` with no host running).
    pub actor: String,
    /// `pause`, `resume`, `requeue` or `purge`.
    pub action: String,
    /// The queue.
    pub target: String,
    /// `ok: …` with what it did, or `failed: …` with why.
    pub result: String,
}

/// The audit log of a data directory.
pub struct AuditLog {
    file: PathBuf,
    appending: Mutex<()>,
}

impl AuditLog {
    pub fn new(data_dir: &Path) -> AuditLog {
        AuditLog { file: data_dir.join(AUDIT_FILE), appending: Mutex::new(()) }
    }

    /// Appends an entry. A failure to write is logged, not returned: the change it records
    /// has been made already.
    pub fn record(&self, actor: &str, action: &str, target: &str, result: &str) {
        let entry = AuditEntry {
            at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            actor: actor.to_string(),
            action: action.to_string(),
            target: target.to_string(),
            result: crate::health::truncate_reason(result),
        };
        if let Err(error) = self.append(&entry) {
            tracing::error!(file = %self.file.display(), ?entry, "could not write the audit log: {error:#}");
        }
    }

    fn append(&self, entry: &AuditEntry) -> Result<()> {
        let _one_writer = self.appending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(dir) = self.file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        if std::fs::metadata(&self.file).is_ok_and(|meta| meta.len() > MAX_FILE_BYTES) {
            std::fs::rename(&self.file, self.file.with_extension("log.1"))?;
        }
        let mut line = serde_json::to_vec(entry)?;
        line.push(b'\n');
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&self.file)?;
        file.write_all(&line)?;
        file.sync_data()?;
        Ok(())
    }

    /// The last `limit` entries, oldest first (from the file's last MiB; lines that are not
    /// entries are skipped).
    pub fn recent(&self, limit: usize) -> Result<Vec<AuditEntry>> {
        use std::io::{Read as _, Seek as _, SeekFrom};
        let mut file = match std::fs::File::open(&self.file) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            opened => opened.with_context(|| format!("failed to read audit log {}", self.file.display()))?,
        };
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))?;
        let mut tail = Vec::new();
        file.take(TAIL_BYTES).read_to_end(&mut tail)?;
        let entries: Vec<AuditEntry> = tail.split(|b| *b == b'\n').filter_map(|line| serde_json::from_slice(line).ok()).collect();
        Ok(entries[entries.len().saturating_sub(limit)..].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_appended_and_read_back_newest_last() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::new(&dir.path().join("data"));
        assert!(log.recent(10).unwrap().is_empty());
        log.record("api", "pause", "orders", "ok: paused until resumed");
        log.record("cli", "resume", "orders", "ok: resumed");
        std::fs::OpenOptions::new().append(true).open(dir.path().join("data").join(AUDIT_FILE)).unwrap().write_all(b"not json\n").unwrap();
        log.record("api", "purge", "mail", &"x".repeat(10_000));
        let recent = log.recent(2).unwrap();
        assert_eq!(recent.iter().map(|e| e.action.as_str()).collect::<Vec<_>>(), ["resume", "purge"]);
        assert!(recent[1].result.len() < 1_000, "a long result is cut");
        assert_eq!(log.recent(10).unwrap().len(), 3, "the damaged line is skipped");
    }
}
