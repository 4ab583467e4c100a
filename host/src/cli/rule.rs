//! `ebb rule check`, `ebb rule eval`, `ebb rule test` (in `rule_test`) and `ebb rule compile` (`new` and `build`: `super::author`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use clap::{ArgGroup, Subcommand};
use serde_json::Value;

use super::rule_contexts::{
    concurrency_defaults, failure_defaults, impossible_failure, past_deadline, queue_empty_defaults, shown_failure, task_count_defaults, with_defaults,
    with_dependent_failure_defaults,
};
use crate::names::DecisionSite;
use crate::rules::{
    CompiledRule, ContractVersion, DecisionSource, ErrorClass, FailureContext, HandlerState, IdleContext, QueueRuleConfig, QueueState, RuleEngine,
    RuleInstance, RuleLimits, RuleSet,
};

#[derive(Debug, Subcommand)]
pub enum RuleCommand {
    /// Load a rule, validate it against the contract, configure it, describe it, then call
    /// each export with default and edge contexts under the host's limits and print what came
    /// back. Exits with 1 and every reason (each with a hint) on a load or set-up problem, or
    /// a fault in any call (a trap, fuel, the deadline, memory). A delay outside the interval
    /// the rule was given, which the host clamps, is a warning (a failure with --strict).
    Check {
        /// The rule component (.wasm).
        file: PathBuf,
        /// A rule parameter, as in the queue's `rule_params` (repeatable).
        #[arg(long = "param", value_name = "KEY=VALUE", value_parser = super::parse_key_value)]
        params: Vec<(String, String)>,
        /// Fail on a delay the host would clamp, too (a warning without it).
        #[arg(long)]
        strict: bool,
    },
    /// Ask a rule for one decision and print it as JSON (with its source and any clamp).
    /// Exits with 1 and the reason when the rule faulted (the JSON then shows the built-in
    /// rule's decision, with source "fallback"; for --concurrency, a value of null: the queue
    /// keeps its configured bound; for --failure, "default": max_dequeue_count decides).
    #[command(group(ArgGroup::new("decision").required(true).args(["task_count", "queue_empty", "concurrency", "failure"])))]
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
        /// A handler state as JSON, for `max-concurrent-calls` (fields of `handler-state`,
        /// snake_case: `current_limit`, `max_limit`, `in_flight`, `peak_in_flight`,
        /// `waiting_tasks`, `window_ms`, `completed`, `failed`, `pushed_back`,
        /// `latency_mean_ms`, `latency_min_ms`, `latency_max_ms`; the rest default). A value of
        /// null means the queue keeps its configured bound. Rules of contract 0.3.0 and later.
        #[arg(long, value_name = "JSON")]
        concurrency: Option<String>,
        /// A failed delivery as JSON, for `on-handler-failure` (fields of `failure-context`,
        /// snake_case: `dequeue_count`, `max_dequeue_count`, `error_class` ("timeout",
        /// "connect", "http-status", "panic", "other"), `http_status`, `error`, `item`,
        /// `elapsed_ms`, `handler_latency_ms`, `default_retry_delay_ms`,
        /// `max_retry_delay_ms`; the rest default). Prints the decision: {"retry": MS},
        /// {"poison": REASON} or "default". Rules that export ebb:rules/failures@0.4.0.
        #[arg(long, value_name = "JSON")]
        failure: Option<String>,
        /// A rule parameter, as in the queue's `rule_params` (repeatable).
        #[arg(long = "param", value_name = "KEY=VALUE", value_parser = super::parse_key_value)]
        params: Vec<(String, String)>,
    },
    /// Run a rule against table-driven cases (a TOML file of `[[case]]`s: a context in, the
    /// expected decision or error out) under the host's limits; prints ok or FAIL with a diff
    /// per case and `N passed, M failed`. Exits with 1 on any failure.
    Test {
        /// The rule component (.wasm).
        rule: PathBuf,
        /// The cases file (.toml); see docs/guides/writing-rules.md, "Test a rule".
        cases: PathBuf,
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
    /// Make a queue's shadow rule its rule: renames the `shadow_rule` file over the `rule`
    /// file in the rules folder (atomic), and the running host's watcher swaps it in. The queue
    /// has no shadow afterwards until a file is put at `shadow_rule` again. Refused when the
    /// queue has no shadow, a file is missing, the shadow does not load with `rule_params`,
    /// the files cannot be renamed atomically, or `rule_params` and `shadow_rule_params`
    /// differ (the host configures the promoted rule with `rule_params`, read at start;
    /// `--with-rule-params` accepts that); and, unless `--force`, when other queues name either
    /// file (the rename changes them too) or the running host's `/status` shows the shadow
    /// faulting (quarantined, refused, or faults counted).
    Promote {
        /// The queue.
        queue: String,
        /// The configuration file.
        #[arg(long, short, default_value = "ebb.toml")]
        config: PathBuf,
        /// Promote even though `shadow_rule_params` differ: the rule runs with `rule_params`.
        #[arg(long)]
        with_rule_params: bool,
        /// Promote even though other queues name the rule's or the shadow's file (they change
        /// too), or the running host saw the shadow fault (quarantined, refused, faults counted).
        #[arg(long)]
        force: bool,
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
        RuleCommand::Check { file, params, strict } => super::refuse_repeated_params(&params).and_then(|()| check(&file, params, strict)),
        RuleCommand::Eval { file, task_count, queue_empty, concurrency, failure, params } => {
            super::refuse_repeated_params(&params).and_then(|()| eval(&file, Asked { task_count, queue_empty, concurrency, failure }, params))
        }
        RuleCommand::Test { rule, cases } => super::rule_test::run(&rule, &cases, cli_engine()?),
        RuleCommand::Compile { files, out, config } => compile(&files, out, config),
        RuleCommand::New { name, lang, dir } => super::author::new::create(&name, lang, &dir).map(|folder| super::author::new::print_next_steps(&folder, lang)),
        RuleCommand::Build { folder } => super::author::build::run(&folder),
        RuleCommand::Promote { queue, config, with_rule_params, force } => {
            use super::promote::{HostView, PromoteOptions};
            let config = crate::config::Config::load(&config)?;
            let host = tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(super::promote::host_view(&config, &queue));
            if let HostView::Unknown(why) = &host {
                eprintln!("warning: {why}: the shadow's faults on live traffic are not known; promoting on the checks of the file alone");
            }
            let promoted = super::promote::promote(&config, &queue, PromoteOptions { with_rule_params, force }, &host)?;
            println!(
                "promoted {} to {} (sha256 {}); the host's watcher swaps it in. Queue {queue} has no shadow rule until a file is put at {} again \
                 (or remove shadow_rule from the configuration: `ebb check` reports the missing file)",
                promoted.from.display(),
                promoted.to.display(),
                &promoted.sha256[..12],
                promoted.from.display()
            );
            Ok(())
        }
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
pub(super) fn cli_engine() -> Result<std::sync::Arc<RuleEngine>> {
    if let Some(dir) = user_rule_cache() {
        match RuleEngine::new(RuleLimits::default(), Some(dir.clone())) {
            Ok(engine) => return Ok(engine),
            // The reason names the folder, which comes from the environment: bounded.
            Err(error) => eprintln!(
                "note: no compile cache ({}); set {RULE_CACHE_ENV} to a folder to keep compiled rules",
                crate::health::truncate_reason(&format!("{error:#}"))
            ),
        }
    }
    RuleEngine::new(RuleLimits::default(), None)
}

fn check(file: &Path, params: Vec<(String, String)>, strict: bool) -> Result<()> {
    let engine = cli_engine()?;
    let started = Instant::now();
    let rule = engine.load_file(file)?;
    let compile_time = started.elapsed();
    let instance = engine.instantiate(&rule, &params).with_context(|| format!("rule {} failed its set-up", rule.name))?;
    describe(file, &rule, compile_time);
    println!("memory:       {} bytes after configure", instance.memory_bytes());
    println!("configure:    ok ({} parameter{})", params.len(), if params.len() == 1 { "" } else { "s" });
    let probes = probes_for(&rule);
    let outcome = CheckRun { engine: &engine, rule: &rule, params: &params, strict }.run_all(&probes, instance);
    outcome.verdict(file, probes.len())
}

/// Prints what the rule is: its file, size, hash, compile time, contract, exports and imports.
fn describe(file: &Path, rule: &CompiledRule, compile_time: std::time::Duration) {
    println!("rule:         {}", file.display());
    println!("size:         {} bytes", rule.size);
    println!("sha256:       {}", rule.sha256);
    println!("compile time: {:.1} ms{}", compile_time.as_secs_f64() * 1e3, if rule.from_cache { " (compiled before: from the cache)" } else { "" });
    let contract = rule.contract.interface();
    let newest = crate::rules::CONTRACT_VERSION;
    match rule.contract {
        ContractVersion::V0_4 => println!("contract:     {contract}"),
        ContractVersion::V0_3 => println!("contract:     {contract}"),
        ContractVersion::V0_2 => println!(
            "contract:     {contract} (an older contract, still served: the rule does not decide handler concurrency (max-concurrent-calls, added in 0.3.0), so its queues keep their max_concurrent_calls; rebuild it against wit/ebb-rules-{newest} to decide it)"
        ),
        ContractVersion::V0_1 => println!(
            "contract:     {contract} (an older contract, still served: the rule is not told the fields 0.2.0 added and does not decide handler concurrency (0.3.0); rebuild it against wit/ebb-rules-{newest} for both)"
        ),
    }
    println!("exports:      {}", rule.exports.join(", "));
    println!(
        "failures:     {}",
        if rule.decides_failures {
            "decided by the rule (it exports ebb:rules/failures@0.4.0: on-handler-failure)"
        } else {
            "not decided by the rule (it does not export ebb:rules/failures@0.4.0): its queues keep max_dequeue_count"
        }
    );
    println!("imports:      {}", if rule.imports.is_empty() { "none".into() } else { rule.imports.join(", ") });
}

/// The probes the rule answers: those of the decisions its contract and exports have.
fn probes_for(rule: &CompiledRule) -> Vec<Probe> {
    check_probes()
        .into_iter()
        .filter(|probe| rule.contract.decides_concurrency() || !probe.decides_concurrency())
        .filter(|probe| rule.decides_failures || !probe.decides_failures())
        .collect()
}

/// `ebb rule check`'s calls of one rule.
struct CheckRun<'a> {
    engine: &'a RuleEngine,
    rule: &'a CompiledRule,
    params: &'a [(String, String)],
    strict: bool,
}

impl CheckRun<'_> {
    /// Makes every call, printing a row of the table for each.
    fn run_all(&self, probes: &[Probe], instance: RuleInstance) -> CheckOutcome {
        let mut outcome = CheckOutcome::default();
        let mut live = Some(instance);
        println!("\n{:<28} {:<36} returned", "export", "context");
        for probe in probes {
            // A fresh instance after each fault: a trapped one cannot be entered again, and one
            // fault must not hide the next.
            let instance = match live.take() {
                Some(instance) => instance,
                None => match self.engine.instantiate(self.rule, self.params) {
                    Ok(instance) => instance,
                    Err(error) => {
                        outcome.failures.add(probe.export(), format!("the rule could not be set up again after a fault: {error:#}"), probe.context);
                        break;
                    }
                },
            };
            let (instance, shown, failure) = self.call(probe, instance);
            println!("{:<28} {:<36} {shown}", probe.export(), probe.context);
            match failure {
                Some(ProbeFailure::Fault(reason)) => outcome.failures.add(probe.export(), reason, probe.context),
                Some(ProbeFailure::Clamped(reason)) => {
                    if self.strict { &mut outcome.failures } else { &mut outcome.warnings }.add(probe.export(), reason, probe.context);
                    live = Some(instance);
                }
                None => live = Some(instance),
            }
        }
        outcome
    }

    /// Makes one call; returns the instance to go on with, what to show and any failure.
    fn call(&self, probe: &Probe, mut instance: RuleInstance) -> (RuleInstance, String, Option<ProbeFailure>) {
        let (mut shown, mut failure) = probe.run(&mut instance);
        // Wall-clock time lost to a busy machine is not the rule's: a call past its deadline
        // is tried once more on a fresh instance (fuel, which counts the rule's own work,
        // stops a real loop first, every time).
        if matches!(&failure, Some(ProbeFailure::Fault(reason)) if past_deadline(reason))
            && let Ok(mut fresh) = self.engine.instantiate(self.rule, self.params)
        {
            (shown, failure) = probe.run(&mut fresh);
            instance = fresh;
        }
        (instance, shown, failure)
    }
}

/// Failures and warnings (values the host clamps), each as (export, reason) -> the
/// contexts it happened in: one reason is said once, with every context that produced it.
#[derive(Default)]
struct CheckOutcome {
    failures: Grouped,
    warnings: Grouped,
}

impl CheckOutcome {
    /// Warns of clamped values; fails with every failure, or says the check passed.
    fn verdict(&self, file: &Path, calls: usize) -> Result<()> {
        let CheckOutcome { failures, warnings } = self;
        if !warnings.is_empty() {
            eprintln!("warning: rule {} returned a value the host clamps in {} of {calls} calls:\n{}", file.display(), warnings.calls(), warnings.listed());
        }
        if failures.is_empty() {
            let clamped = if warnings.is_empty() {
                "or returned a value the host would have to correct".to_string()
            } else {
                format!("({} returned a value the host clamps: warnings above; --strict fails on them)", warnings.calls())
            };
            println!("\nok: {calls} calls, none faulted {clamped}");
            return Ok(());
        }
        bail!("rule {} failed {} of {calls} calls:\n{}", file.display(), failures.calls(), failures.listed())
    }
}

/// What went wrong (or was clamped) in `ebb rule check`'s calls: each (export, reason) with
/// the contexts it happened in, in the order first seen.
#[derive(Default)]
struct Grouped(Vec<(&'static str, String, Vec<&'static str>)>);

impl Grouped {
    fn add(&mut self, export: &'static str, reason: String, context: &'static str) {
        match self.0.iter_mut().find(|(e, r, _)| *e == export && *r == reason) {
            Some((_, _, contexts)) => contexts.push(context),
            None => self.0.push((export, reason, vec![context])),
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The calls counted, over every reason.
    fn calls(&self) -> usize {
        self.0.iter().map(|(_, _, contexts)| contexts.len()).sum()
    }

    /// One line per reason: `- export (context; context): reason`.
    fn listed(&self) -> String {
        let lines: Vec<String> =
            self.0.iter().map(|(export, reason, contexts)| format!("- {export} ({}): {}", contexts.join("; "), reason.replace('\n', "\n  "))).collect();
        lines.join("\n")
    }
}

/// One call `ebb rule check` makes: an export, the context it is called with, and the
/// context's name in the table.
struct Probe {
    context: &'static str,
    call: ProbeCall,
}

enum ProbeCall {
    TaskCount(QueueState),
    QueueEmpty(IdleContext),
    Concurrency(HandlerState),
    Failure(FailureContext),
}

enum ProbeFailure {
    /// The call faulted: the instance cannot be used again.
    Fault(String),
    /// The call returned a value the host clamps, which signals a mistake: a warning (a
    /// failure with `--strict`).
    Clamped(String),
}

impl Probe {
    fn export(&self) -> &'static str {
        match self.call {
            ProbeCall::TaskCount(_) => "optimal-dequeue-task-count",
            ProbeCall::QueueEmpty(_) => "on-queue-empty",
            ProbeCall::Concurrency(_) => "max-concurrent-calls",
            ProbeCall::Failure(_) => "on-handler-failure",
        }
    }

    /// Whether the probe asks the optional decision of `ebb:rules/failures@0.4.0`.
    fn decides_failures(&self) -> bool {
        matches!(self.call, ProbeCall::Failure(_))
    }

    /// Whether the probe asks the decision only contract 0.3.0 and later have.
    fn decides_concurrency(&self) -> bool {
        matches!(self.call, ProbeCall::Concurrency(_))
    }

    /// Calls the export; returns what to show in the table and, when the call failed the
    /// check, why.
    fn run(&self, instance: &mut crate::rules::RuleInstance) -> (String, Option<ProbeFailure>) {
        match &self.call {
            ProbeCall::TaskCount(state) => match instance.optimal_dequeue_task_count(state) {
                Err(error) => ("FAULT".into(), Some(ProbeFailure::Fault(format!("{error:#}")))),
                // A count outside [min_tasks, max_tasks] is the host's to bound: the paper's own
                // rule returns 0 for an empty queue and a count beyond any cap for a deep one.
                Ok(raw) => {
                    let clamped = crate::rules::clamp_task_count(raw, DecisionSource::Rule, state);
                    let note = if clamped.clamped { format!(" (the host bounds it to {}, as it should)", clamped.value) } else { String::new() };
                    (format!("{raw}{note}"), None)
                }
            },
            ProbeCall::QueueEmpty(ctx) => match instance.on_queue_empty(ctx) {
                Err(error) => ("FAULT".into(), Some(ProbeFailure::Fault(format!("{error:#}")))),
                Ok(raw) => {
                    let shown = format!("delay_ms {}, stop {}", raw.delay_ms, raw.stop);
                    let clamped = crate::rules::clamp_idle(raw, DecisionSource::Rule, ctx);
                    if !clamped.clamped {
                        return (shown, None);
                    }
                    // The rule was told the range and left it: a jitter below the minimum (the
                    // paper's own back-off at the first idle), or a unit mistake (seconds for
                    // milliseconds) or a back-off that is not capped. The host clamps it, so
                    // it is a warning.
                    let reason = format!(
                        "delay_ms {} is outside the interval the rule was given [min_interval_ms {}, max_interval_ms {}], so the host clamps it to {}{}keep the delay within ctx.min_interval_ms..=ctx.max_interval_ms (milliseconds), e.g. max(min_interval_ms, min(delay, max_interval_ms)) after the jitter",
                        raw.delay_ms,
                        ctx.min_interval_ms,
                        ctx.max_interval_ms,
                        clamped.value.delay_ms,
                        crate::rules::HINT_PREFIX
                    );
                    (format!("{shown} (warning: outside the interval; the host clamps it to {})", clamped.value.delay_ms), Some(ProbeFailure::Clamped(reason)))
                }
            },
            ProbeCall::Concurrency(state) => match instance.max_concurrent_calls(state) {
                Err(error) => ("FAULT".into(), Some(ProbeFailure::Fault(format!("{error:#}")))),
                Ok(None) => ("none (the queue keeps its max_concurrent_calls)".into(), None),
                // Like a task count, a limit outside [1, max_limit] is the host's to bound.
                Ok(Some(raw)) => {
                    let clamped = crate::rules::clamp_concurrency(raw, DecisionSource::Rule, state);
                    let note = if clamped.clamped { format!(" (the host bounds it to {}, as it should)", clamped.value) } else { String::new() };
                    (format!("{raw}{note}"), None)
                }
            },
            ProbeCall::Failure(ctx) => match instance.on_handler_failure(ctx) {
                Err(error) => ("FAULT".into(), Some(ProbeFailure::Fault(format!("{error:#}")))),
                // The rule exports the interface (or the probe is not made): never `None`.
                Ok(None) => ("not asked (the rule does not export ebb:rules/failures)".into(), None),
                // A delay past max_retry_delay_ms is the host's to bound, as a count past max_tasks.
                Ok(Some(raw)) => (shown_failure(&raw, &crate::rules::clamp_failure(raw.clone(), DecisionSource::Rule, ctx)), None),
            },
        }
    }
}

/// The contexts `ebb rule check` calls each export with: the defaults of `ebb rule eval`,
/// then one edge at a time, then every field at its extreme.
fn check_probes() -> Vec<Probe> {
    let queue = "check";
    [task_count_probes(queue), queue_empty_probes(queue), concurrency_probes(queue), failure_probes(queue)].into_iter().flatten().collect()
}

fn task_count_probes(queue: &str) -> Vec<Probe> {
    let state: QueueState = serde_json::from_value(task_count_defaults(queue)).expect("the defaults are a queue state");
    let task_count = |context, change: &dyn Fn(&mut QueueState)| {
        let mut state = state.clone();
        change(&mut state);
        Probe { context, call: ProbeCall::TaskCount(state) }
    };
    vec![
        task_count("defaults", &|_| {}),
        task_count("approximate_depth 0", &|s| s.approximate_depth = 0),
        task_count("approximate_depth 2^64-1", &|s| s.approximate_depth = u64::MAX),
        task_count("push_enabled", &|s| s.push_enabled = true),
        task_count("random 0", &|s| s.random = 0),
        task_count("random 2^64-1", &|s| s.random = u64::MAX),
        task_count("min_tasks = max_tasks = 1", &|s| (s.min_tasks, s.max_tasks) = (1, 1)),
        task_count("every field at its least", &|s| {
            *s = QueueState { queue: queue.into(), batch_size: 1, ..QueueState::default() };
        }),
        task_count("every field at its most", &|s| {
            *s = QueueState {
                queue: queue.into(),
                approximate_depth: u64::MAX,
                in_flight: u32::MAX,
                active_tasks: u32::MAX,
                min_tasks: crate::config::MAX_TASKS,
                max_tasks: crate::config::MAX_TASKS,
                // Rates a real queue could report (a billion a second), not infinities.
                throughput_per_sec: 1e9,
                mean_handler_latency_ms: 1e9,
                recent_failures: u32::MAX,
                push_enabled: true,
                timestamp_ms: u64::MAX,
                random: u64::MAX,
                last_get_messages: 32,
                batch_size: 32,
                arrivals_per_sec: 1e9,
                oldest_message_age_ms: Some(u64::MAX),
                depth_source: crate::rules::DepthSource::Inferred,
            };
        }),
    ]
}

fn queue_empty_probes(queue: &str) -> Vec<Probe> {
    let idle: IdleContext = serde_json::from_value(queue_empty_defaults(queue)).expect("the defaults are an idle context");
    let queue_empty = |context, change: &dyn Fn(&mut IdleContext)| {
        let mut ctx = idle.clone();
        change(&mut ctx);
        Probe { context, call: ProbeCall::QueueEmpty(ctx) }
    };
    let max_interval_ms = crate::config::MAX_INTERVAL.as_millis() as u64;
    vec![
        queue_empty("defaults (first empty get)", &|_| {}),
        queue_empty("idle_count 1000", &|c| c.idle_count = 1000),
        queue_empty("min_interval_ms = max_interval_ms", &|c| (c.min_interval_ms, c.max_interval_ms) = (800, 800)),
        queue_empty("min = max, idle_count 1000", &|c| (c.min_interval_ms, c.max_interval_ms, c.idle_count) = (800, 800, 1000)),
        queue_empty("push_enabled", &|c| c.push_enabled = true),
        queue_empty("random 0", &|c| c.random = 0),
        queue_empty("random 2^64-1", &|c| c.random = u64::MAX),
        queue_empty("every field at its least", &|c| {
            // Intervals are at least 1 ms (the configuration refuses 0).
            *c = IdleContext { queue: queue.into(), idle_count: 1, min_interval_ms: 1, max_interval_ms: 1, ..IdleContext::default() };
        }),
        queue_empty("every field at its most", &|c| {
            *c = IdleContext {
                queue: queue.into(),
                idle_count: u32::MAX,
                active_tasks: u32::MAX,
                min_interval_ms: max_interval_ms,
                max_interval_ms,
                push_enabled: true,
                timestamp_ms: u64::MAX,
                random: u64::MAX,
            };
        }),
    ]
}

fn concurrency_probes(queue: &str) -> Vec<Probe> {
    let handler: HandlerState = serde_json::from_value(concurrency_defaults(queue)).expect("the defaults are a handler state");
    // A busy window: every slot taken, tasks waiting, calls ending in 50 ms.
    let busy = HandlerState {
        in_flight: handler.current_limit,
        peak_in_flight: handler.current_limit,
        waiting_tasks: 4,
        completed: 40,
        latency_mean_ms: 50.0,
        latency_min_ms: 40.0,
        latency_max_ms: 80.0,
        ..handler
    };
    let concurrency = |context, change: &dyn Fn(&mut HandlerState)| {
        let mut state = busy.clone();
        change(&mut state);
        Probe { context, call: ProbeCall::Concurrency(state) }
    };
    vec![
        concurrency("a busy window", &|_| {}),
        concurrency("completed 0", &|s| (s.completed, s.latency_mean_ms, s.latency_min_ms, s.latency_max_ms) = (0, 0.0, 0.0, 0.0)),
        concurrency("latencies 0 ms", &|s| (s.latency_mean_ms, s.latency_min_ms, s.latency_max_ms) = (0.0, 0.0, 0.0)),
        concurrency("latencies 1e9 ms", &|s| (s.latency_mean_ms, s.latency_min_ms, s.latency_max_ms) = (1e9, 1e9, 1e9)),
        concurrency("every call failed or pushed back", &|s| (s.failed, s.pushed_back) = (s.completed / 2, s.completed - s.completed / 2)),
        concurrency("current_limit = max_limit = 1", &|s| (s.current_limit, s.max_limit, s.in_flight, s.peak_in_flight) = (1, 1, 1, 1)),
        concurrency("every field at its least", &|s| {
            *s = HandlerState { queue: queue.into(), ..HandlerState::default() };
        }),
        concurrency("every field at its most", &|s| {
            *s = HandlerState {
                queue: queue.into(),
                current_limit: u32::MAX,
                max_limit: u32::MAX,
                in_flight: u32::MAX,
                peak_in_flight: u32::MAX,
                waiting_tasks: u32::MAX,
                window_ms: u64::MAX,
                completed: u32::MAX,
                failed: u32::MAX,
                pushed_back: u32::MAX,
                // Latencies a real handler could report (a million seconds), not infinities.
                latency_mean_ms: 1e9,
                latency_min_ms: 1e9,
                latency_max_ms: 1e9,
                timestamp_ms: u64::MAX,
                random: u64::MAX,
            };
        }),
    ]
}

fn failure_probes(queue: &str) -> Vec<Probe> {
    let failed: FailureContext = serde_json::from_value(failure_defaults(queue)).expect("the defaults are a failure context");
    let failure = |context, change: &dyn Fn(&mut FailureContext)| {
        let mut ctx = failed.clone();
        change(&mut ctx);
        Probe { context, call: ProbeCall::Failure(ctx) }
    };
    let http = |status: u16| {
        move |c: &mut FailureContext| (c.error_class, c.http_status, c.error) = (ErrorClass::HttpStatus, Some(status), format!("handler answered {status}"))
    };
    let week_ms = crate::queue::MAX_VISIBILITY.as_millis() as u64;
    vec![
        failure("other error, first failure", &|_| {}),
        failure("HTTP 422, first failure", &http(422)),
        failure("HTTP 500, first failure", &http(500)),
        failure("HTTP 500, last attempt", &|c| {
            http(500)(c);
            c.dequeue_count = c.max_dequeue_count;
        }),
        failure("HTTP 500, past max_dequeue_count", &|c| {
            http(500)(c);
            c.dequeue_count = c.max_dequeue_count + 1;
        }),
        failure("timeout, first failure", &|c| (c.error_class, c.error) = (ErrorClass::Timeout, "handler did not answer in time".into())),
        failure("connect, first failure", &|c| (c.error_class, c.error) = (ErrorClass::Connect, "connection refused".into())),
        failure("panic, first failure", &|c| (c.error_class, c.error) = (ErrorClass::Panic, "the handler panicked".into())),
        failure("an item of an envelope", &|c| c.item = Some(3)),
        failure("dequeue_count 1000 (the ceiling)", &|c| c.dequeue_count = crate::handler::PUSHED_BACK_POISON_DEQUEUES),
        failure("elapsed 7 days", &|c| c.elapsed_ms = week_ms),
        failure("error of 1024 bytes", &|c| c.error = "e".repeat(ebb_rules_sdk::MAX_FAILURE_TEXT_BYTES)),
        failure("random 0", &|c| c.random = 0),
        failure("random 2^64-1", &|c| c.random = u64::MAX),
        failure("every field at its least", &|c| {
            *c = FailureContext { queue: queue.into(), dequeue_count: 1, max_dequeue_count: 1, ..FailureContext::default() };
        }),
        failure("every field at its most", &|c| {
            *c = FailureContext {
                queue: queue.into(),
                dequeue_count: u32::MAX,
                max_dequeue_count: u32::MAX,
                error_class: ErrorClass::HttpStatus,
                http_status: Some(599),
                error: "e".repeat(ebb_rules_sdk::MAX_FAILURE_TEXT_BYTES),
                item: Some(u32::MAX),
                elapsed_ms: u64::MAX,
                handler_latency_ms: u64::MAX,
                default_retry_delay_ms: week_ms,
                max_retry_delay_ms: week_ms,
                timestamp_ms: u64::MAX,
                random: u64::MAX,
            };
        }),
    ]
}

/// The decision `ebb rule eval` was asked for (clap lets exactly one through).
struct Asked {
    task_count: Option<String>,
    queue_empty: Option<String>,
    concurrency: Option<String>,
    failure: Option<String>,
}

fn eval(file: &Path, asked: Asked, params: Vec<(String, String)>) -> Result<()> {
    let engine = cli_engine()?;
    // Absolute, but not resolved: errors name the file as given (a link, not its target).
    let path = std::path::absolute(file).with_context(|| format!("failed to read rule {}", file.display()))?;
    let queue = "eval";
    let rules = RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::new(queue)?, rule: Some(path), params }]);
    if let Some(error) = rules.load_all().into_iter().next() {
        return Err(error);
    }
    let (output, source) = if let Some(text) = asked.task_count {
        let state: QueueState = with_defaults(parse_json(&text, "--task-count")?, task_count_defaults(queue), "--task-count")?;
        let decision = rules.decide_task_count(queue, &QueueState { queue: queue.into(), ..state });
        (serde_json::to_value(decision)?, decision.source)
    } else if let Some(text) = asked.queue_empty {
        let ctx: IdleContext = with_defaults(parse_json(&text, "--queue-empty")?, queue_empty_defaults(queue), "--queue-empty")?;
        let decision = rules.decide_queue_empty(queue, &IdleContext { queue: queue.into(), ..ctx });
        (serde_json::to_value(decision)?, decision.source)
    } else if let Some(text) = asked.concurrency {
        let given = with_dependent_defaults(parse_json(&text, "--concurrency")?);
        let state: HandlerState = with_defaults(given, concurrency_defaults(queue), "--concurrency")?;
        if let Some(reason) = impossible_handler_state(&state) {
            bail!("--concurrency describes a handler state the host never sends: {reason}");
        }
        let queue_rules = rules.queue(queue).context("the rule set holds the queue it was made with")?;
        let Some(decision) = queue_rules.concurrency_decision(&HandlerState { queue: queue.into(), ..state }) else {
            let version = rules.status(queue).and_then(|s| s.contract).unwrap_or("an older version");
            bail!(
                "rule {} speaks contract {version}, which has no max-concurrent-calls (added in 0.3.0): its queues keep their max_concurrent_calls; rebuild it against wit/ebb-rules-{} to decide it",
                file.display(),
                crate::rules::CONTRACT_VERSION
            );
        };
        println!("{}", serde_json::to_string_pretty(&decision)?);
        if decision.source != DecisionSource::Rule {
            let reason = rules.status(queue).and_then(|s| s.last_error).unwrap_or_else(|| "no reason recorded".into());
            bail!("the rule faulted, so the queue would keep its max_concurrent_calls (the value above is null): {reason}");
        }
        return Ok(());
    } else if let Some(text) = asked.failure {
        let given = with_dependent_failure_defaults(parse_json(&text, "--failure")?);
        let ctx: FailureContext = with_defaults(given, failure_defaults(queue), "--failure")?;
        if let Some(reason) = impossible_failure(&ctx) {
            bail!("--failure describes a failed delivery the host never sends: {reason}");
        }
        let queue_rules = rules.queue(queue).context("the rule set holds the queue it was made with")?;
        let Some(decision) = queue_rules.decide_failure(&FailureContext { queue: queue.into(), ..ctx }) else {
            bail!(
                "rule {} does not export ebb:rules/failures@0.4.0 (the failure-aware-rule world of wit/ebb-rules-0.4.0): it decides no failure, and its queues keep max_dequeue_count",
                file.display()
            );
        };
        println!("{}", serde_json::to_string_pretty(&decision)?);
        if decision.source != DecisionSource::Rule {
            let reason = rules.status(queue).and_then(|s| s.last_error).unwrap_or_else(|| "no reason recorded".into());
            bail!("the rule faulted, so the failure would take the default handling (max_dequeue_count; the value above is \"default\"): {reason}");
        }
        return Ok(());
    } else {
        unreachable!("clap requires one of the four")
    };
    println!("{}", serde_json::to_string_pretty(&output)?);
    // The decision printed is the built-in rule's, not the rule's: an author must not miss it.
    if source != DecisionSource::Rule {
        let reason = rules.status(queue).and_then(|s| s.last_error).unwrap_or_else(|| "no reason recorded".into());
        bail!("the rule faulted, so the decision above is the built-in rule's ({}): {reason}", serde_json::to_value(source)?.as_str().unwrap_or_default());
    }
    Ok(())
}

/// Fields of a handler state whose defaults follow other given fields, so that a state
/// given in part stays one the host could send: the current limit is the given ceiling, and
/// a given mean latency is also the shortest and the longest.
fn with_dependent_defaults(mut given: Value) -> Value {
    if let Value::Object(fields) = &mut given {
        if let Some(max_limit) = fields.get("max_limit").cloned() {
            fields.entry("current_limit").or_insert(max_limit);
        }
        if let Some(mean) = fields.get("latency_mean_ms").cloned() {
            fields.entry("latency_min_ms").or_insert(mean.clone());
            fields.entry("latency_max_ms").or_insert(mean);
        }
    }
    given
}

/// Why no host would send `state` (a rule's answer to it would say nothing), or `None`.
fn impossible_handler_state(state: &HandlerState) -> Option<String> {
    let most = crate::config::MAX_CONCURRENT_CALLS;
    let latencies = [("latency_min_ms", state.latency_min_ms), ("latency_mean_ms", state.latency_mean_ms), ("latency_max_ms", state.latency_max_ms)];
    if !(1..=most).contains(&state.max_limit) {
        return Some(format!("max_limit {} is outside [1, {most}] (the range of max_concurrent_calls)", state.max_limit));
    }
    if !(1..=state.max_limit).contains(&state.current_limit) {
        return Some(format!("current_limit {} is outside [1, max_limit {}]", state.current_limit, state.max_limit));
    }
    if state.window_ms == 0 {
        return Some("window_ms is 0 (the host's window is 250 ms)".into());
    }
    if u64::from(state.failed) + u64::from(state.pushed_back) > u64::from(state.completed) {
        return Some(format!(
            "failed {} + pushed_back {} is more than completed {} (they count calls among those that ended)",
            state.failed, state.pushed_back, state.completed
        ));
    }
    if let Some((name, value)) = latencies.iter().find(|(_, value)| !value.is_finite() || *value < 0.0) {
        return Some(format!("{name} {value} is not a duration in milliseconds"));
    }
    if state.completed == 0 && latencies.iter().any(|(_, value)| *value != 0.0) {
        return Some("latencies are 0 when no call completed in the window".into());
    }
    if state.completed > 0 && !(state.latency_min_ms <= state.latency_mean_ms && state.latency_mean_ms <= state.latency_max_ms) {
        return Some(format!(
            "latency_min_ms {} <= latency_mean_ms {} <= latency_max_ms {} does not hold",
            state.latency_min_ms, state.latency_mean_ms, state.latency_max_ms
        ));
    }
    None
}

fn parse_json(text: &str, flag: &str) -> Result<Value> {
    serde_json::from_str(text).with_context(|| format!("{flag} is not valid JSON"))
}
