//! Hot reload: watch the rules folder and swap rules in when their files change.
//!
//! Only events that can change what a file holds count (writes, close-after-write,
//! creations, renames, removals, permission changes); opening and reading a file, which
//! the host itself does, are ignored. A burst of events is applied after `debounce`
//! without events, or at the latest [`MAX_DEBOUNCE_DELAY`] after its first event, and a
//! file is re-applied only when its content's sha256 changed.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use notify::event::{AccessKind, AccessMode, MetadataKind, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher as _};

use super::set::RuleSet;

/// The longest a burst of file events can delay applying them: a folder written without
/// pause is still applied this often.
pub const MAX_DEBOUNCE_DELAY: Duration = Duration::from_secs(1);

/// Watches a rules folder while it lives; dropping it stops the watch, and its thread once
/// a swap in progress is done (the set's [`RuleSet::stop_threads`] waits for that).
pub struct RuleWatcher {
    _watcher: notify::RecommendedWatcher,
    stop: mpsc::Sender<Seen>,
}

impl Drop for RuleWatcher {
    fn drop(&mut self) {
        let _ = self.stop.send(Seen::Stop);
    }
}

/// What the watcher's thread hears.
enum Seen {
    /// A rule file some queue uses may have changed.
    Changed(PathBuf),
    /// The watcher was dropped.
    Stop,
}

impl RuleSet {
    /// Watches `dir` (not recursively). When a rule file some queue uses changes, waits
    /// until no event has come for `debounce` (or [`MAX_DEBOUNCE_DELAY`] since the first
    /// event of the burst, whichever comes first), then applies each changed file whose
    /// content changed to the queues that use it. Files no queue uses are ignored (never
    /// read or compiled), so however many of them arrive, a swap waits for none of them.
    /// Work runs on a thread of its own, one of the set's threads (see
    /// [`RuleSet::stop_threads`]); a stopping set applies no more files.
    pub fn watch(self: &Arc<Self>, dir: &Path, debounce: Duration) -> Result<RuleWatcher> {
        let dir = dir.canonicalize().with_context(|| format!("failed to open rules folder {}", dir.display()))?;
        // The files of this folder some queue uses, by name, with the path the set knows them by.
        let used: HashMap<OsString, PathBuf> = self
            .rule_files()
            .into_iter()
            .filter(|path| path.parent().and_then(|parent| parent.canonicalize().ok()).as_deref() == Some(dir.as_path()))
            .filter_map(|path| Some((path.file_name()?.to_os_string(), path)))
            .collect();
        let (events_tx, events) = mpsc::channel::<Seen>();
        let stop = events_tx.clone();
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
            Ok(event) if may_change_content(&event.kind) => {
                for path in event.paths.into_iter().filter(|p| is_rule_file(p)) {
                    match path.file_name().and_then(|name| used.get(name)) {
                        Some(used) => {
                            let _ = events_tx.send(Seen::Changed(used.clone()));
                        }
                        None => tracing::debug!(file = %path.display(), "ignoring a change to a rule file no queue uses"),
                    }
                }
            }
            Ok(_) => {}
            Err(error) => tracing::warn!("rules folder watch error: {error}"),
        })
        .context("failed to start watching the rules folder")?;
        watcher.watch(&dir, RecursiveMode::NonRecursive).with_context(|| format!("failed to watch rules folder {}", dir.display()))?;
        let rules = Arc::downgrade(self);
        let threads = self.threads.clone();
        let started = self
            .threads
            .spawn("ebb-rule-watch", move || {
                let span = tracing::info_span!("rule_watcher", dir = %dir.display());
                let _entered = span.enter();
                let mut burst = Debounce::new(debounce, MAX_DEBOUNCE_DELAY.max(debounce));
                let mut changed = BTreeSet::new();
                loop {
                    let next = match burst.remaining(Instant::now()) {
                        None => events.recv().map_err(|_| RecvTimeoutError::Disconnected),
                        Some(left) if left.is_zero() => Err(RecvTimeoutError::Timeout),
                        Some(left) => events.recv_timeout(left),
                    };
                    match next {
                        Ok(Seen::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                        Ok(Seen::Changed(path)) => {
                            changed.insert(path);
                            burst.event(Instant::now());
                        }
                        Err(RecvTimeoutError::Timeout) => {
                            burst.clear();
                            if threads.stopping() {
                                return;
                            }
                            let Some(rules) = rules.upgrade() else { return };
                            for path in std::mem::take(&mut changed) {
                                rules.refresh(&path);
                            }
                        }
                    }
                }
            })
            .context("failed to start the rule watcher thread")?;
        anyhow::ensure!(started, "the rules folder is not watched: the host is stopping");
        Ok(RuleWatcher { _watcher: watcher, stop })
    }
}

/// Whether an event may have changed a file's content (or whether it can be read). Opening,
/// reading and closing without writing, which the host's own reads cause, do not.
fn may_change_content(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)) => false,
        _ => true,
    }
}

fn is_rule_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "wasm")
}

/// When a burst of events is due: `quiet` after its last event, but no later than
/// `max_delay` after its first.
#[derive(Debug)]
struct Debounce {
    quiet: Duration,
    max_delay: Duration,
    burst: Option<(Instant, Instant)>,
}

impl Debounce {
    fn new(quiet: Duration, max_delay: Duration) -> Self {
        Debounce { quiet, max_delay, burst: None }
    }

    fn event(&mut self, now: Instant) {
        let first = self.burst.map_or(now, |(first, _)| first);
        self.burst = Some((first, now));
    }

    /// Time left before the pending burst is due (zero: due now); `None` without one.
    fn remaining(&self, now: Instant) -> Option<Duration> {
        let (first, last) = self.burst?;
        Some((last + self.quiet).min(first + self.max_delay).saturating_duration_since(now))
    }

    fn clear(&mut self) {
        self.burst = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_quiet_burst_is_due_after_the_debounce() {
        let start = Instant::now();
        let mut d = Debounce::new(30 * MS, 1000 * MS);
        assert_eq!(d.remaining(start), None);
        d.event(start);
        d.event(start + 10 * MS);
        assert_eq!(d.remaining(start + 10 * MS), Some(30 * MS));
        assert_eq!(d.remaining(start + 40 * MS), Some(Duration::ZERO));
        d.clear();
        assert_eq!(d.remaining(start + 50 * MS), None);
    }

    #[test]
    fn events_without_pause_are_due_after_the_max_delay() {
        let start = Instant::now();
        let mut d = Debounce::new(30 * MS, 1000 * MS);
        let mut now = start;
        // An event every 20 ms never leaves 30 ms of quiet, yet the burst comes due at 1 s.
        while d.remaining(now) != Some(Duration::ZERO) {
            d.event(now);
            now += 20 * MS;
            assert!(now <= start + 1020 * MS, "never due");
        }
        assert!(now >= start + 1000 * MS);
    }

    #[test]
    fn only_events_that_can_change_content_count() {
        use notify::event::{CreateKind, DataChange, RemoveKind, RenameMode};
        assert!(!may_change_content(&EventKind::Access(AccessKind::Open(AccessMode::Any))));
        assert!(!may_change_content(&EventKind::Access(AccessKind::Close(AccessMode::Read))));
        assert!(!may_change_content(&EventKind::Access(AccessKind::Read)));
        assert!(!may_change_content(&EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime))));
        assert!(may_change_content(&EventKind::Access(AccessKind::Close(AccessMode::Write))));
        assert!(may_change_content(&EventKind::Create(CreateKind::File)));
        assert!(may_change_content(&EventKind::Modify(ModifyKind::Data(DataChange::Any))));
        assert!(may_change_content(&EventKind::Modify(ModifyKind::Name(RenameMode::To))));
        assert!(may_change_content(&EventKind::Remove(RemoveKind::File)));
    }
}
