//! `ebb rule promote QUEUE`: the queue's shadow rule becomes its rule, by an atomic rename in
//! the rules folder; the running host's watcher swaps it in like any other new content.
//!
//! Parameters: the host configures the promoted rule with the queue's `rule_params`, which it
//! read at start. When `shadow_rule_params` differ, promoting would run the shadow with
//! parameters it was never compared with, so it is refused unless `--with-rule-params` says
//! that is meant.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use sha2::{Digest as _, Sha256};

use crate::config::{Config, QueueConfig};
use crate::names::RuleSlot;
use crate::rules::{QueueRuleConfig, RuleEngine, RuleSet, read_rule_file};

/// What a promotion did.
#[derive(Debug)]
pub struct Promoted {
    /// The shadow's file, gone now.
    pub from: PathBuf,
    /// The rule's file, holding the shadow's content now.
    pub to: PathBuf,
    /// Hex sha256 of the content promoted.
    pub sha256: String,
}

/// Promotes `queue`'s shadow rule of `config`; `with_rule_params` accepts that the promoted
/// rule is configured with `rule_params` when they differ from `shadow_rule_params`.
pub fn promote(config: &Config, queue: &str, with_rule_params: bool) -> Result<Promoted> {
    let Some(q) = config.queues.iter().find(|q| q.name.as_str() == queue) else {
        bail!("queue {queue:?} is not in the configuration");
    };
    let (live_name, shadow_name) = files(q)?;
    if !with_rule_params && sorted(&q.rule_params) != sorted(&q.shadow_rule_params) {
        bail!(
            "queues.{queue}: rule_params ({}) differ from shadow_rule_params ({}): the running host configures the promoted rule with rule_params, \
             which it read at start, so the rule would run with parameters it was never compared with. Make them equal in the configuration and \
             restart the host, or pass --with-rule-params to promote it configured with rule_params",
            shown(&q.rule_params),
            shown(&q.shadow_rule_params)
        );
    }
    let live = live_name.in_dir(&config.rules_dir);
    let shadow = shadow_name.in_dir(&config.rules_dir);
    // A rename moves a link, not what it points at: a shadow linking to the live file would
    // become a link to itself and the rule's bytes would be gone.
    if std::fs::symlink_metadata(&shadow).is_ok_and(|m| m.file_type().is_symlink()) {
        bail!(
            "queues.{queue}.shadow_rule: {} is a symbolic link; promote renames the file itself, so copy the rule into the rules folder as a regular file",
            shadow.display()
        );
    }
    let bytes = match read_rule_file(&shadow, config.rule_limits.max_file_bytes)? {
        Some(bytes) => bytes,
        None => bail!("queues.{queue}.shadow_rule: {} does not exist: there is nothing to promote", shadow.display()),
    };
    if std::fs::symlink_metadata(&live).is_err() {
        bail!(
            "queues.{queue}.rule: {} does not exist (the queue runs the built-in rule until it does); promote replaces an existing rule file",
            live.display()
        );
    }
    same_filesystem(&shadow, &live, &config.rules_dir)?;
    loads(config, q, &shadow)?;
    let sha256 = hex::encode(Sha256::digest(&bytes));
    std::fs::rename(&shadow, &live).map_err(|error| match error.kind() {
        std::io::ErrorKind::CrossesDevices => anyhow::anyhow!("cannot rename {} to {}: they are on different filesystems", shadow.display(), live.display()),
        _ => anyhow::anyhow!("cannot rename {} to {}: {error}", shadow.display(), live.display()),
    })?;
    Ok(Promoted { from: shadow, to: live, sha256 })
}

/// The queue's rule and shadow rule file names, or why it has nothing to promote.
fn files(q: &QueueConfig) -> Result<(&crate::names::RuleFileName, &crate::names::RuleFileName)> {
    let queue = &q.name;
    let Some(shadow) = &q.shadow_rule else {
        bail!("queue {queue} has no shadow_rule: there is nothing to promote");
    };
    let Some(live) = &q.rule else {
        bail!("queue {queue} has no rule (it runs the built-in rule): set queues.{queue}.rule to the file the shadow should replace");
    };
    if live == shadow {
        bail!("queues.{queue}: rule and shadow_rule are the same file ({}): it is already live", live.as_str());
    }
    Ok((live, shadow))
}

/// A rename within one filesystem is atomic; across two it fails, and a file that is a mount
/// point of its own (a Kubernetes ConfigMap's subPath) cannot be renamed at all.
fn same_filesystem(shadow: &Path, live: &Path, rules_dir: &Path) -> Result<()> {
    let device = |path: &Path| std::fs::symlink_metadata(path).map(|m| m.dev()).with_context(|| format!("cannot read {}", path.display()));
    let dir = device(rules_dir)?;
    for file in [shadow, live] {
        if device(file)? != dir {
            bail!(
                "{} is on another filesystem than its folder {} (a mount of its own?): it cannot be renamed atomically; copy the shadow's content instead",
                file.display(),
                rules_dir.display()
            );
        }
    }
    Ok(())
}

/// Refuses a shadow that the host could not load as the queue's rule (with `rule_params`).
fn loads(config: &Config, q: &QueueConfig, shadow: &Path) -> Result<()> {
    let engine = RuleEngine::new(config.rule_limits.clone(), None)?;
    let set = RuleSet::new(engine, [QueueRuleConfig { slot: RuleSlot::from(&q.name), rule: Some(shadow.to_path_buf()), params: q.rule_params.clone() }]);
    if let Some(error) = set.load_all().into_iter().next() {
        return Err(error.context(format!("queues.{}: the shadow rule cannot be the queue's rule, so it was not promoted", q.name)));
    }
    Ok(())
}

fn sorted(params: &[(String, String)]) -> Vec<(String, String)> {
    let mut params = params.to_vec();
    params.sort();
    params
}

fn shown(params: &[(String, String)]) -> String {
    if params.is_empty() {
        return "none".into();
    }
    sorted(params).iter().map(|(k, v)| format!("{k}={v:?}")).collect::<Vec<_>>().join(", ")
}
