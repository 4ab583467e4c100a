//! `ebb rule promote QUEUE`: the queue's shadow rule becomes its rule, by an atomic rename in
//! the rules folder; the running host's watcher swaps it in like any other new content.
//!
//! Parameters: the host configures the promoted rule with the queue's `rule_params`, which it
//! read at start. When `shadow_rule_params` differ, promoting would run the shadow with
//! parameters it was never compared with, so it is refused unless `--with-rule-params` says
//! that is meant.
//!
//! Two more refusals that `--force` overrides: a rename changes every queue that names either
//! file, not only this one; and a shadow the running host saw fault (its `/status`) would
//! become a faulting live rule.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use sha2::{Digest as _, Sha256};

use crate::config::{Config, QueueConfig};
use crate::names::{DecisionSite, RuleFileName};
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

/// What the user allowed beyond the safe promotion.
#[derive(Debug, Clone, Copy, Default)]
pub struct PromoteOptions {
    /// The promoted rule may run with `rule_params` when they differ from `shadow_rule_params`.
    pub with_rule_params: bool,
    /// Other queues naming the files may change with it, and a shadow the host saw fault may
    /// become live.
    pub force: bool,
}

/// What the running host says of the queue's shadow rule (its `/status`).
#[derive(Debug, Clone)]
pub enum HostView {
    /// `shadow.rule` of the queue in the host's `/status`.
    Shadow(serde_json::Value),
    /// No host could be asked, or it did not say; why.
    Unknown(String),
}

/// Promotes `queue`'s shadow rule of `config`, refusing what `options` do not allow; `host`
/// is what the running host says of the shadow.
pub fn promote(config: &Config, queue: &str, options: PromoteOptions, host: &HostView) -> Result<Promoted> {
    let Some(q) = config.queues.iter().find(|q| q.name.as_str() == queue) else {
        bail!("queue {queue:?} is not in the configuration");
    };
    let (live_name, shadow_name) = files(q)?;
    let with_rule_params = options.with_rule_params;
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
    // Two names of one file (a hard link): rename(2) between them does nothing, and the shadow
    // would only ever have agreed with the live rule.
    if let (Ok(a), Ok(b)) = (std::fs::metadata(&shadow), std::fs::metadata(&live))
        && (a.dev(), a.ino()) == (b.dev(), b.ino())
    {
        bail!(
            "queues.{queue}.shadow_rule: {} and {} are one file ({}): there is nothing to promote; copy the candidate into the shadow's file instead",
            shadow.display(),
            live.display(),
            how_one_file(&shadow, &live)
        );
    }
    if !options.force {
        refuse_shared_files(config, q, live_name, shadow_name)?;
    }
    loads(config, q, &shadow)?;
    let sha256 = hex::encode(Sha256::digest(&bytes));
    if !options.force
        && let HostView::Shadow(status) = host
        && let Some(fault) = shadow_fault(status, &sha256)
    {
        bail!(
            "queues.{queue}.shadow_rule: {fault}; promoted, it would fault as the live rule. Fix the shadow (the host tries a new content at once), or pass --force to promote it anyway"
        );
    }
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
    Ok((live, shadow))
}

/// Refuses when other queues name the live or the shadow file: the rename changes their rule
/// (or removes their shadow) too, which nobody asked for.
fn refuse_shared_files(config: &Config, q: &QueueConfig, live: &RuleFileName, shadow: &RuleFileName) -> Result<()> {
    let mut others = Vec::new();
    for other in config.queues.iter().filter(|other| other.name != q.name) {
        for (key, file) in [("rule", &other.rule), ("shadow_rule", &other.shadow_rule)] {
            if let Some(file) = file.as_ref().filter(|file| *file == live || *file == shadow) {
                others.push(format!("queues.{}.{key} ({})", other.name, file.as_str()));
            }
        }
    }
    if !others.is_empty() {
        bail!(
            "queues.{}: promote renames {} over {}, and other queues name these files: {}; their rules would change too. Give queue {} files of its own, \
             or pass --force to change them all",
            q.name,
            shadow.as_str(),
            live.as_str(),
            others.join(", "),
            q.name
        );
    }
    Ok(())
}

/// Why the host's view of the shadow (`shadow.rule` of `/status`) says it should not be
/// promoted, when the content it judged is `sha256`; `None` when nothing is held against it.
/// Faults of another content (the file changed since) are not held against this one.
pub fn shadow_fault(rule: &serde_json::Value, sha256: &str) -> Option<String> {
    let text = |value: &serde_json::Value| value.as_str().unwrap_or("no reason given").to_string();
    if rule["refused"]["sha256"] == sha256 {
        return Some(format!("the running host refused this content of the shadow file: {}", text(&rule["refused"]["reason"])));
    }
    match rule["state"].as_str() {
        Some("error") => return Some(format!("the running host cannot load the shadow rule: {}", text(&rule["error"]))),
        Some("quarantined") if rule["sha256"] == sha256 => {
            let quarantine = &rule["quarantine"];
            let export = quarantine["export"].as_str().map_or_else(|| "rebuilding its instance".to_string(), |export| format!("of {export}"));
            return Some(format!(
                "the running host quarantined the shadow rule ({} faults in a row {export}: {})",
                quarantine["faults"],
                text(&quarantine["reason"])
            ));
        }
        _ => {}
    }
    let faults = rule["faults"].as_u64().unwrap_or(0);
    (faults > 0 && rule["sha256"] == sha256)
        .then(|| format!("the running host counted {faults} faults of the shadow rule (the last: {})", text(&rule["last_error"])))
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
    let set = RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::from(&q.name), rule: Some(shadow.to_path_buf()), params: q.rule_params.clone() }]);
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

/// What the host running `config` says of `queue`'s shadow rule; asked with a short timeout,
/// as a promotion with no host running is fine (the watcher of the next host loads the file).
pub async fn host_view(config: &Config, queue: &str) -> HostView {
    let url = format!("{}/status", super::client::api_base(config));
    let asked = async {
        let response = super::client::client(config.default_token())?.get(&url).timeout(std::time::Duration::from_secs(5)).send().await?;
        let status = response.status();
        let body: serde_json::Value = serde_json::from_slice(&response.bytes().await?).context("its answer is not JSON")?;
        if !status.is_success() {
            bail!("it answered {status}");
        }
        let shadow = body["queues"].as_array().and_then(|queues| queues.iter().find(|q| q["queue"] == queue)).map(|q| q["shadow"]["rule"].clone());
        match shadow {
            Some(rule) if rule.is_object() => Ok(HostView::Shadow(rule)),
            Some(_) => {
                Ok(HostView::Unknown(format!("the host at {url} runs queue {queue} without a shadow rule (restarted since the configuration changed?)")))
            }
            None => Ok(HostView::Unknown(format!("the host at {url} does not run queue {queue}"))),
        }
    };
    match asked.await {
        Ok(view) => view,
        Err(error) if error.downcast_ref::<reqwest::Error>().is_some_and(reqwest::Error::is_connect) => HostView::Unknown(format!("no host answers at {url}")),
        Err(error) => HostView::Unknown(format!("could not ask the host at {url}: {error:#}")),
    }
}

/// How two paths name one file, for a refusal: a symbolic link (one to the other, or both to
/// a third) or hard links.
pub(super) fn how_one_file(a: &Path, b: &Path) -> &'static str {
    let linked = |path: &Path| std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_symlink());
    if linked(a) || linked(b) { "one names it through a symbolic link" } else { "hard links" }
}

#[cfg(test)]
mod tests {
    use super::shadow_fault;
    use serde_json::json;

    #[test]
    fn only_faults_of_the_content_being_promoted_are_held_against_it() {
        let quarantined =
            json!({"state": "quarantined", "sha256": "aa", "faults": 3, "quarantine": {"export": "on-queue-empty", "faults": 3, "reason": "trapped"}});
        let said = shadow_fault(&quarantined, "aa").unwrap();
        assert!(said.contains("quarantined the shadow rule (3 faults in a row of on-queue-empty: trapped)"), "{said}");
        assert_eq!(shadow_fault(&quarantined, "bb"), None, "the file changed since: the new content was not judged");
        let faulted = json!({"state": "loaded", "sha256": "aa", "faults": 2, "last_error": "fuel"});
        assert!(shadow_fault(&faulted, "aa").unwrap().contains("counted 2 faults of the shadow rule (the last: fuel)"));
        let refused = json!({"state": "loaded", "sha256": "aa", "faults": 0, "refused": {"sha256": "bb", "reason": "not a component"}});
        assert!(shadow_fault(&refused, "bb").unwrap().contains("refused this content of the shadow file: not a component"));
        let cannot_load = json!({"state": "error", "sha256": null, "error": "configure failed"});
        assert!(shadow_fault(&cannot_load, "aa").unwrap().contains("cannot load the shadow rule: configure failed"));
        let healthy = json!({"state": "loaded", "sha256": "aa", "faults": 0});
        assert_eq!(shadow_fault(&healthy, "aa"), None);
    }
}
