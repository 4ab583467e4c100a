//! `ebb rule check`, `ebb rule eval` and `ebb rule compile` (`new` and `build`: `super::author`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use clap::{ArgGroup, Subcommand};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::names::RuleSlot;
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
        /// A queue state as JSON (fields of `queue-state`, snake_case, those of contract 0.2.0
        /// included: `last_get_messages`, `batch_size`, `arrivals_per_sec`,
        /// `oldest_message_age_ms` (a number or null), `depth_source` ("measured" or
        /// "inferred"); the rest default). A 0.1.0 rule is not told the 0.2.0 fields.
        #[arg(long, value_name = "JSON")]
        task_count: Option<String>,
        /// An idle context as JSON (fields of `idle-context`, snake_case; the rest default).
        #[arg(long, value_name = "JSON")]
        queue_empty: Option<String>,
        /// A rule parameter, as in the queue's `rule_params` (repeatable).
        #[arg(long = "param", value_name = "KEY=VALUE", value_parser = super::parse_key_value)]
        params: Vec<(String, String)>,
    },
    /// Compile rules ahead, so that a host starting with an empty cache finds them compiled:
    /// into the host's compiled-rule cache (`<data_dir>/rule-cache` of the configuration),
    /// or with `--out` into a folder (ship the artifacts beside the rules: the host looks
    /// there too). An artifact is only used by an ebb built with the same wasmtime, settings
    /// and CPU features; any other is ignored with a warning and the rule compiled at start.
    Compile {
        /// Rule components (.wasm), or folders whose `*.wasm` files are all compiled.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The folder to write the compiled artifacts into, instead of the configuration's cache.
        #[arg(long, value_name = "FOLDER")]
        out: Option<PathBuf>,
        /// The configuration file, for `data_dir` and the rule limits (without `--out`).
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Start a rule: a folder PARENT/NAME that builds outside this repository, with the rule
    /// (tasks = ⌈depth ÷ per_task⌉, the paper's back-off), a unit test in the language's own
    /// runner and `cases.toml` for `ebb rule test`. Never overwrites anything.
    New {
        /// The rule's name: 1 to 64 lowercase letters, digits and '-', starting with a letter.
        name: String,
        /// The rule's language.
        #[arg(long, value_enum)]
        lang: super::author::Lang,
        /// The folder to create the rule's folder in.
        #[arg(long, value_name = "PARENT", default_value = ".")]
        dir: PathBuf,
    },
    /// Build a rule folder (made by `ebb rule new`) into FOLDER/NAME.wasm with the right
    /// toolchain: cargo for wasm32-wasip2, componentize-py or componentize-qjs (pinned,
    /// installed on first use into $EBB_TOOL_CACHE, else ~/.cache/ebb/tools).
    Build {
        /// The rule's folder.
        #[arg(default_value = ".")]
        folder: PathBuf,
    },
}

pub fn run(command: RuleCommand) -> Result<()> {
    match command {
        RuleCommand::Check { file, params } => check(&file, params),
        RuleCommand::Eval { file, task_count, queue_empty, params } => eval(&file, task_count, queue_empty, params),
        RuleCommand::Compile { files, out, config } => compile(&files, out, config),
        RuleCommand::New { name, lang, dir } => super::author::new::create(&name, lang, &dir).map(|folder| super::author::new::print_next_steps(&folder, lang)),
        RuleCommand::Build { folder } => super::author::build::run(&folder),
    }
}

fn compile(files: &[PathBuf], out: Option<PathBuf>, config: Option<PathBuf>) -> Result<()> {
    let config = match (&config, &out) {
        (Some(path), _) => Some(crate::config::Config::load(path)?),
        (None, None) => Some(crate::config::Config::load(Path::new("ebb.toml")).context("without --out, the cache is the configuration's (--config)")?),
        (None, Some(_)) => None,
    };
    let limits = config.as_ref().map_or_else(RuleLimits::default, |c| c.rule_limits.clone());
    let folder = match (out, &config) {
        (Some(out), _) => out,
        (None, Some(config)) => config.data_dir.join("rule-cache"),
        (None, None) => unreachable!("a configuration is loaded without --out"),
    };
    let engine = RuleEngine::new(limits, Some(folder.clone()))?;
    let mut rules = Vec::new();
    for file in files {
        if file.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(file)
                .with_context(|| format!("failed to read rules folder {}", file.display()))?
                .flatten()
                .map(|entry| entry.path())
                .filter(|path| path.extension().is_some_and(|e| e == "wasm"))
                .collect();
            found.sort();
            rules.extend(found);
        } else {
            rules.push(file.clone());
        }
    }
    if rules.is_empty() && files.iter().all(|f| f.is_dir()) {
        // An image's rules folder may hold none yet: nothing to do is not a failure.
        println!("no rule (*.wasm) to compile in {}", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "));
        return Ok(());
    }
    if rules.is_empty() {
        bail!("no rule (*.wasm) to compile in {}", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "));
    }
    for file in rules {
        let started = Instant::now();
        // Compiled alone (not beside itself): an artifact shipped beside it is not a reason to skip.
        let bytes =
            crate::rules::read_rule_file(&file, engine.limits().max_file_bytes)?.with_context(|| format!("rule file {} does not exist", file.display()))?;
        let name = file.file_name().map_or_else(|| file.display().to_string(), |n| n.to_string_lossy().into_owned());
        let rule = engine.load_bytes(&name, &bytes).with_context(|| format!("failed to compile rule {}", file.display()))?;
        let artifact = folder.join(engine.artifact_file_name(&rule.sha256));
        if !artifact.is_file() {
            bail!("rule {} compiled, but its artifact could not be written to {} (see the warning above)", file.display(), folder.display());
        }
        let how = if rule.from_cache { "already compiled" } else { "compiled" };
        println!("{}: {how} in {:.1} ms -> {}", file.display(), started.elapsed().as_secs_f64() * 1e3, artifact.display());
    }
    Ok(())
}

/// Environment variable naming the compile cache of the `ebb rule` commands (empty: none).
pub(crate) const RULE_CACHE_ENV: &str = "EBB_RULE_CACHE";

/// Where `ebb rule check` and `eval` keep compiled rules, so that the second look at a rule
/// does not compile it again (a Python rule takes seconds): `$EBB_RULE_CACHE`, else the
/// user's cache folder (`$XDG_CACHE_HOME/ebb/rule-cache`, `~/.cache/ebb/rule-cache`).
pub(super) fn user_rule_cache() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(RULE_CACHE_ENV) {
        return (!dir.is_empty()).then(|| PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()).map(PathBuf::from);
    let base = base.or_else(|| std::env::var_os("HOME").filter(|d| !d.is_empty()).map(|home| PathBuf::from(home).join(".cache")))?;
    Some(base.join("ebb").join("rule-cache"))
}

/// The engine of the `ebb rule` commands: with the user's compile cache when it can be used,
/// without it (compiling each time, and saying why) when not.
fn cli_engine() -> Result<std::sync::Arc<RuleEngine>> {
    if let Some(dir) = user_rule_cache() {
        match RuleEngine::new(RuleLimits::default(), Some(dir.clone())) {
            Ok(engine) => return Ok(engine),
            Err(error) => eprintln!("note: no compile cache ({error:#}); set {RULE_CACHE_ENV} to a folder to keep compiled rules"),
        }
    }
    RuleEngine::new(RuleLimits::default(), None)
}

fn check(file: &Path, params: Vec<(String, String)>) -> Result<()> {
    let engine = cli_engine()?;
    let started = Instant::now();
    let rule = engine.load_file(file)?;
    let compile_time = started.elapsed();
    let instance = engine.instantiate(&rule, &params).with_context(|| format!("rule {} failed its set-up", rule.name))?;
    println!("rule:         {}", file.display());
    println!("size:         {} bytes", rule.size);
    println!("sha256:       {}", rule.sha256);
    println!("compile time: {:.1} ms{}", compile_time.as_secs_f64() * 1e3, if rule.from_cache { " (compiled before: from the cache)" } else { "" });
    let contract = rule.contract.interface();
    if rule.contract.as_str() == crate::rules::CONTRACT_VERSION {
        println!("contract:     {contract}");
    } else {
        println!(
            "contract:     {contract} (an older contract, still served: the rule is not told the fields {} added; rebuild it against wit/ebb-rules-{} to read them)",
            crate::rules::CONTRACT_VERSION,
            crate::rules::CONTRACT_VERSION
        );
    }
    println!("exports:      {}", rule.exports.join(", "));
    println!("imports:      {}", if rule.imports.is_empty() { "none".into() } else { rule.imports.join(", ") });
    println!("memory:       {} bytes after configure", instance.memory_bytes());
    println!("configure:    ok ({} parameter{})", params.len(), if params.len() == 1 { "" } else { "s" });
    Ok(())
}

fn eval(file: &Path, task_count: Option<String>, queue_empty: Option<String>, params: Vec<(String, String)>) -> Result<()> {
    let engine = cli_engine()?;
    // Absolute, but not resolved: errors name the file as given (a link, not its target).
    let file = std::path::absolute(file).with_context(|| format!("failed to read rule {}", file.display()))?;
    let queue = "eval";
    let rules = RuleSet::new(engine, [QueueRuleConfig { slot: RuleSlot::new(queue)?, rule: Some(file), params }]);
    if let Some(error) = rules.load_all().into_iter().next() {
        return Err(error);
    }
    let (output, source) = if let Some(text) = task_count {
        let defaults = json!({ "queue": queue, "min_tasks": 1, "max_tasks": 100, "active_tasks": 1, "random": 1u64 << 63, "batch_size": 32 });
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
