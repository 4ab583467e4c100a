//! `ebb rule check` and `ebb rule eval`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use clap::{ArgGroup, Subcommand};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::rules::{DecisionSource, IdleContext, QueueRuleConfig, QueueState, RuleEngine, RuleLimits, RuleSet};

#[derive(Debug, Subcommand)]
pub enum RuleCommand {
    /// Load a rule, validate it against the contract, configure it, and describe it.
    /// Exits with 1 and the reason on any problem.
    Check {
        /// The rule component (.wasm).
        file: PathBuf,
        /// A rule parameter, as in the queue's `rule_params` (repeatable).
        #[arg(long = "param", value_name = "KEY=VALUE", value_parser = super::parse_key_value)]
        params: Vec<(String, String)>,
    },
    /// Ask a rule for one decision and print it as JSON (with its source and any clamp).
    /// Exits with 1 and the reason when the rule faulted (the JSON then shows the built-in
    /// rule's decision, with source "fallback").
    #[command(group(ArgGroup::new("decision").required(true).args(["task_count", "queue_empty"])))]
    Eval {
        /// The rule component (.wasm).
        file: PathBuf,
        /// A queue state as JSON (fields of `queue-state`, snake_case; the rest default).
        #[arg(long, value_name = "JSON")]
        task_count: Option<String>,
        /// An idle context as JSON (fields of `idle-context`, snake_case; the rest default).
        #[arg(long, value_name = "JSON")]
        queue_empty: Option<String>,
        /// A rule parameter, as in the queue's `rule_params` (repeatable).
        #[arg(long = "param", value_name = "KEY=VALUE", value_parser = super::parse_key_value)]
        params: Vec<(String, String)>,
    },
}

pub fn run(command: RuleCommand) -> Result<()> {
    match command {
        RuleCommand::Check { file, params } => check(&file, params),
        RuleCommand::Eval { file, task_count, queue_empty, params } => eval(&file, task_count, queue_empty, params),
    }
}

fn check(file: &Path, params: Vec<(String, String)>) -> Result<()> {
    let engine = RuleEngine::new(RuleLimits::default(), None)?;
    let started = Instant::now();
    let rule = engine.load_file(file)?;
    let compile_time = started.elapsed();
    let instance = engine.instantiate(&rule, &params).with_context(|| format!("rule {} failed its set-up", rule.name))?;
    println!("rule:         {}", file.display());
    println!("size:         {} bytes", rule.size);
    println!("sha256:       {}", rule.sha256);
    println!("compile time: {:.1} ms", compile_time.as_secs_f64() * 1e3);
    println!("contract:     {}@{}", crate::rules::CONTRACT_INTERFACE, crate::rules::CONTRACT_VERSION);
    println!("exports:      {}", rule.exports.join(", "));
    println!("imports:      {}", if rule.imports.is_empty() { "none".into() } else { rule.imports.join(", ") });
    println!("memory:       {} bytes after configure", instance.memory_bytes());
    println!("configure:    ok ({} parameter{})", params.len(), if params.len() == 1 { "" } else { "s" });
    Ok(())
}

fn eval(file: &Path, task_count: Option<String>, queue_empty: Option<String>, params: Vec<(String, String)>) -> Result<()> {
    let engine = RuleEngine::new(RuleLimits::default(), None)?;
    // Absolute, but not resolved: errors name the file as given (a link, not its target).
    let file = std::path::absolute(file).with_context(|| format!("failed to read rule {}", file.display()))?;
    let queue = "eval";
    let rules = RuleSet::new(engine, [QueueRuleConfig { queue: queue.into(), rule: Some(file), params }]);
    if let Some(error) = rules.load_all().into_iter().next() {
        return Err(error);
    }
    let (output, source) = if let Some(text) = task_count {
        let defaults = json!({ "queue": queue, "min_tasks": 1, "max_tasks": 100, "active_tasks": 1, "random": 1u64 << 63 });
        let state: QueueState = with_defaults(&text, defaults, "--task-count")?;
        let decision = rules.decide_task_count(queue, &QueueState { queue: queue.into(), ..state });
        (serde_json::to_value(decision)?, decision.source)
    } else if let Some(text) = queue_empty {
        let defaults = json!({ "queue": queue, "idle_count": 1, "active_tasks": 1, "min_interval_ms": 100, "max_interval_ms": 60000, "random": 1u64 << 63 });
        let ctx: IdleContext = with_defaults(&text, defaults, "--queue-empty")?;
        let decision = rules.decide_queue_empty(queue, &IdleContext { queue: queue.into(), ..ctx });
        (serde_json::to_value(decision)?, decision.source)
    } else {
        unreachable!("clap requires one of the two")
    };
    println!("{}", serde_json::to_string_pretty(&output)?);
    // The decision printed is the built-in rule's, not the rule's: an author must not miss it.
    if source != DecisionSource::Rule {
        let reason = rules.status(queue).and_then(|s| s.last_error).unwrap_or_else(|| "no reason recorded".into());
        bail!("the rule faulted, so the decision above is the built-in rule's ({}): {reason}", serde_json::to_value(source)?.as_str().unwrap_or_default());
    }
    Ok(())
}

/// Parses `text` as a JSON object laid over `defaults`, naming `flag` and the field in errors.
fn with_defaults<T: DeserializeOwned>(text: &str, mut defaults: Value, flag: &str) -> Result<T> {
    let given: Value = serde_json::from_str(text).with_context(|| format!("{flag} is not valid JSON"))?;
    let Value::Object(given) = given else { bail!("{flag} must be a JSON object") };
    defaults.as_object_mut().unwrap().extend(given);
    serde_json::from_value(defaults).with_context(|| format!("{flag} does not describe a {}", std::any::type_name::<T>().rsplit("::").next().unwrap()))
}
