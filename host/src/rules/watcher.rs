//! Hot reload: watch the rules folder and swap rules in when their files change.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use anyhow::{Context as _, Result};
use notify::{RecursiveMode, Watcher as _};

use super::set::RuleSet;

/// Watches a rules folder while it lives; dropping it stops the watch.
pub struct RuleWatcher {
    _watcher: notify::RecommendedWatcher,
}

impl RuleSet {
    /// Watches `dir` (not recursively). When `.wasm` files change, waits until no event has
    /// come for `debounce`, then applies each changed file to the queues that use it
    /// ([`RuleSet::apply_file`]); a file no queue uses is still compiled, to report
    /// problems early and warm the cache. Work runs on a thread of its own.
    pub fn watch(self: &Arc<Self>, dir: &Path, debounce: Duration) -> Result<RuleWatcher> {
        let dir = dir.canonicalize().with_context(|| format!("failed to open rules folder {}", dir.display()))?;
        let (events_tx, events) = mpsc::channel::<PathBuf>();
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
            Ok(event) => {
                for path in event.paths.into_iter().filter(|p| is_rule_file(p)) {
                    let _ = events_tx.send(path);
                }
            }
            Err(error) => tracing::warn!("rules folder watch error: {error}"),
        })
        .context("failed to start watching the rules folder")?;
        watcher
            .watch(&dir, RecursiveMode::NonRecursive)
            .with_context(|| format!("failed to watch rules folder {}", dir.display()))?;
        let rules = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("ebb-rule-watch".into())
            .spawn(move || {
                let span = tracing::info_span!("rule_watcher", dir = %dir.display());
                let _entered = span.enter();
                while let Ok(first) = events.recv() {
                    let mut changed = BTreeSet::from([first]);
                    loop {
                        match events.recv_timeout(debounce) {
                            Ok(path) => {
                                changed.insert(path);
                            }
                            Err(RecvTimeoutError::Timeout) => break,
                            Err(RecvTimeoutError::Disconnected) => return,
                        }
                    }
                    let Some(rules) = rules.upgrade() else { return };
                    for path in changed {
                        rules.on_file_event(&dir.join(path.file_name().unwrap_or_default()));
                    }
                }
            })
            .context("failed to start the rule watcher thread")?;
        Ok(RuleWatcher { _watcher: watcher })
    }

    fn on_file_event(&self, path: &Path) {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if self.rule_files().iter().any(|p| p == path) {
            if let Err(error) = self.apply_file(path) {
                tracing::warn!(rule = %name, "keeping the current rule: {error:#}");
            }
        } else if path.exists() {
            match self.engine().load_file(path) {
                Ok(rule) => tracing::info!(rule = %name, sha256 = %&rule.sha256[..12], "rule compiled; no queue uses it"),
                Err(error) => tracing::warn!(rule = %name, "{error:#}"),
            }
        }
    }
}

fn is_rule_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "wasm")
}
