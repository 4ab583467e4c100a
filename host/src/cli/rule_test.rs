//! `ebb rule test RULE CASES`: table-driven cases, run against the component itself under
//! the host's limits (like `opa test`). The cases file is TOML:
//!
//! ```toml
//! [params]                               # optional: the rule's parameters, strings
//! per_task = "32"
//!
//! [[case]]
//! name = "a deep queue runs one task per 32 messages"
//! decision = "task-count"                # or "queue-empty", "failure", "configure"
//! state = { approximate_depth = 320 }    # task-count: queue-state fields; the rest default
//! expect = 10                            # or expect_error = "a substring of the error"
//!
//! [[case]]
//! name = "422 is poisoned at once"
//! decision = "failure"                   # on-handler-failure, of a failure-aware rule
//! context = { http_status = 422 }        # failure-context fields; the rest default
//! expect = { poison = "HTTP 422" }       # or { retry = 1000 }, or "default"
//! ```
//!
//! A case cannot name a limit: fuel, memory and deadlines are the host's defaults.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::rule_contexts::{
    failure_defaults, impossible_failure, past_deadline, queue_empty_defaults, shown_failure, task_count_defaults, with_defaults,
    with_dependent_failure_defaults,
};
use crate::rules::{CompiledRule, DecisionSource, FailureContext, FailureDecision, IdleContext, IdleDecision, QueueState, RuleEngine};

/// Largest cases file, in bytes.
pub(crate) const MAX_CASES_BYTES: u64 = 1 << 20;
/// Most cases in one file.
pub(crate) const MAX_CASES: usize = 1000;

/// The queue name every case's context carries.
const QUEUE: &str = "test";

/// The file: shared parameters and the cases (each checked on its own, so that an error
/// names the case).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CasesFile {
    #[serde(default)]
    params: BTreeMap<String, String>,
    #[serde(default)]
    case: Vec<Map<String, Value>>,
}

/// One case, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    decision: DecisionKind,
    /// Replaces the file's `[params]` for this case.
    params: Option<BTreeMap<String, String>>,
    state: Option<Value>,
    context: Option<Value>,
    expect: Option<Value>,
    expect_error: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum DecisionKind {
    TaskCount,
    QueueEmpty,
    Failure,
    Configure,
}

/// What `queue-empty` cases expect: the fields given are compared, the others not.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IdleExpect {
    delay_ms: Option<u64>,
    stop: Option<bool>,
}

/// A case, ready to run.
struct Ready {
    name: String,
    params: Vec<(String, String)>,
    call: Call,
    expect: Expect,
}

enum Call {
    Configure,
    TaskCount(QueueState),
    QueueEmpty(IdleContext),
    Failure(FailureContext),
}

enum Expect {
    Success,
    TaskCount(u32),
    QueueEmpty(IdleExpect),
    Failure(FailureDecision),
    Error(String),
}

/// Runs every case of `cases` against `rule`; fails when any case fails.
pub(super) fn run(rule: &Path, cases: &Path, engine: Arc<RuleEngine>) -> Result<()> {
    let ready = read_cases(cases)?;
    let compiled = engine.load_file(rule)?;
    let mut failed = 0;
    for case in &ready {
        match run_case(&engine, &compiled, case) {
            Ok(note) => println!("ok    {}{note}", crate::health::untrusted_text(&case.name)),
            Err(diff) => {
                failed += 1;
                println!("FAIL  {}", crate::health::untrusted_text(&case.name));
                for line in diff.lines() {
                    println!("      {line}");
                }
            }
        }
    }
    println!("{} passed, {failed} failed", ready.len() - failed);
    if failed > 0 {
        bail!("{failed} of {} cases of {} failed (see the diffs above)", ready.len(), cases.display());
    }
    Ok(())
}

/// Reads and checks the whole file before anything runs: one mistake in case 40 is found
/// without running the 39 before it.
fn read_cases(path: &Path) -> Result<Vec<Ready>> {
    let text = crate::input::read_text("cases file", path, MAX_CASES_BYTES)?;
    let file: CasesFile = toml::from_str(&text).map_err(cases_error).with_context(|| format!("invalid cases file {}", path.display()))?;
    if file.case.len() > MAX_CASES {
        bail!("cases file {} has {} cases, over the limit of {MAX_CASES}: split it into several files", path.display(), file.case.len());
    }
    if file.case.is_empty() {
        bail!("cases file {} has no case: add one, starting with [[case]] (see docs/guides/writing-rules.md, \"Test a rule\")", path.display());
    }
    let mut ready = Vec::new();
    for (index, raw) in file.case.into_iter().enumerate() {
        let label = match raw.get("name").and_then(Value::as_str) {
            Some(name) => format!("case {} ({name:?})", index + 1),
            None => format!("case {}", index + 1),
        };
        let case = prepare(raw, &file.params).with_context(|| format!("invalid {label} in {}", path.display()))?;
        ready.push(case);
    }
    Ok(ready)
}

/// A TOML error of a cases file, with what to do about the usual one: an unquoted parameter.
fn cases_error(error: toml::de::Error) -> anyhow::Error {
    let text = error.to_string();
    let text = text.trim_end();
    if error.message().contains("expected a string") {
        return anyhow::anyhow!("{text}{}quote the value: rule parameters are strings, as in ebb.toml (per_task = \"32\")", crate::rules::HINT_PREFIX);
    }
    anyhow::anyhow!("{text}")
}

fn prepare(raw: Map<String, Value>, shared: &BTreeMap<String, String>) -> Result<Ready> {
    let case: Case = serde_json::from_value(Value::Object(raw)).map_err(|e| match e.to_string() {
        text if text.contains("expected a string") => {
            anyhow::anyhow!("{text}{}quote the value: rule parameters are strings (params = {{ per_task = \"32\" }})", crate::rules::HINT_PREFIX)
        }
        text => anyhow::anyhow!("{text}"),
    })?;
    let params = case.params.as_ref().unwrap_or(shared).iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let call = match case.decision {
        DecisionKind::Configure => {
            if case.state.is_some() || case.context.is_some() {
                bail!("a configure case takes no state or context (it only configures the rule with its params)");
            }
            Call::Configure
        }
        DecisionKind::TaskCount => {
            if case.context.is_some() {
                bail!("a task-count case takes `state` (queue-state fields), not `context`");
            }
            let given = case.state.clone().unwrap_or_else(|| Value::Object(Map::new()));
            let state: QueueState = with_defaults(given, task_count_defaults(QUEUE), "state")?;
            Call::TaskCount(state)
        }
        DecisionKind::QueueEmpty => {
            if case.state.is_some() {
                bail!("a queue-empty case takes `context` (idle-context fields), not `state`");
            }
            let given = case.context.clone().unwrap_or_else(|| Value::Object(Map::new()));
            let ctx: IdleContext = with_defaults(given, queue_empty_defaults(QUEUE), "context")?;
            Call::QueueEmpty(ctx)
        }
        DecisionKind::Failure => {
            if case.state.is_some() {
                bail!("a failure case takes `context` (failure-context fields), not `state`");
            }
            let given = with_dependent_failure_defaults(case.context.clone().unwrap_or_else(|| Value::Object(Map::new())));
            let ctx: FailureContext = with_defaults(given, failure_defaults(QUEUE), "context")?;
            if let Some(reason) = impossible_failure(&ctx) {
                bail!("context describes a failed delivery the host never sends: {reason}");
            }
            Call::Failure(ctx)
        }
    };
    let expect = match (case.expect, case.expect_error, case.decision) {
        (Some(_), Some(_), _) => bail!("give `expect` or `expect_error`, not both"),
        (None, Some(error), _) if error.is_empty() => bail!("expect_error is empty: give a part of the error's text, such as a parameter's name"),
        (None, Some(error), _) => Expect::Error(error),
        (None, None, DecisionKind::Configure) => Expect::Success,
        (None, None, _) => bail!("missing `expect` (the decision) or `expect_error` (a part of the error's text)"),
        (Some(_), None, DecisionKind::Configure) => bail!("a configure case takes `expect_error`, or nothing (configure must succeed), not `expect`"),
        (Some(value), None, DecisionKind::TaskCount) => match value.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(count) => Expect::TaskCount(count),
            None => bail!("expect: {value} is not a task count (a whole number, 0 to {})", u32::MAX),
        },
        (Some(value), None, DecisionKind::QueueEmpty) => {
            let idle: IdleExpect =
                serde_json::from_value(value).map_err(|e| anyhow::anyhow!("expect: {e} (write expect = {{ delay_ms = 800, stop = false }})"))?;
            if idle.delay_ms.is_none() && idle.stop.is_none() {
                bail!("expect: give delay_ms, stop or both");
            }
            Expect::QueueEmpty(idle)
        }
        (Some(value), None, DecisionKind::Failure) => {
            let decision: FailureDecision = serde_json::from_value(value).map_err(|e| {
                anyhow::anyhow!("expect: {e} (write expect = {{ retry = 1000 }}, expect = {{ poison = \"the reason\" }} or expect = \"default\")")
            })?;
            Expect::Failure(decision)
        }
    };
    Ok(Ready { name: case.name, params, call, expect })
}

/// Runs one case on an instance of its own (no state leaks from one case to the next):
/// `Ok` with a note, or `Err` with the diff.
fn run_case(engine: &RuleEngine, rule: &CompiledRule, case: &Ready) -> std::result::Result<String, String> {
    let mut instance = match (engine.instantiate(rule, &case.params), &case.call, &case.expect) {
        (Ok(_), Call::Configure, Expect::Success) => return Ok(String::new()),
        (Ok(_), Call::Configure, Expect::Error(wanted)) => return Err(format!("- expect_error: {wanted:?}\n+ got:          configure succeeded")),
        (Ok(instance), _, _) => instance,
        (Err(error), Call::Configure, Expect::Error(wanted)) => return matches_error(&format!("{error:#}"), wanted),
        (Err(error), _, _) => return Err(format!("- expect: configure to succeed\n+ got:    {error:#}")),
    };
    let call = |instance: &mut crate::rules::RuleInstance| match &case.call {
        Call::Configure => unreachable!("handled above"),
        Call::TaskCount(state) => {
            instance.optimal_dequeue_task_count(state).map(|raw| Got::TaskCount(raw, crate::rules::clamp_task_count(raw, DecisionSource::Rule, state)))
        }
        Call::QueueEmpty(ctx) => instance.on_queue_empty(ctx).map(|raw| Got::QueueEmpty(raw, crate::rules::clamp_idle(raw, DecisionSource::Rule, ctx))),
        Call::Failure(ctx) => instance.on_handler_failure(ctx).and_then(|raw| {
            let raw =
                raw.context("the rule does not export ebb:rules/failures@0.4.0, so it decides no failure (build it from the failure-aware-rule world)")?;
            let clamped = crate::rules::clamp_failure(raw.clone(), DecisionSource::Rule, ctx);
            Ok(Got::Failure(raw, clamped))
        }),
    };
    let mut got = call(&mut instance);
    // As `ebb rule check` does: time a busy machine took is not the rule's; one more try.
    if let Err(error) = &got
        && past_deadline(&format!("{error:#}"))
        && let Ok(mut fresh) = engine.instantiate(rule, &case.params)
    {
        got = call(&mut fresh);
    }
    match (got, &case.expect) {
        (Err(error), Expect::Error(wanted)) => matches_error(&format!("{error:#}"), wanted),
        (Err(error), _) => Err(format!("- expect: {}\n+ got:    the call faulted: {error:#}", case.expect.describe())),
        (Ok(got), Expect::Error(wanted)) => Err(format!("- expect_error: {wanted:?}\n+ got:          {}", got.describe())),
        (Ok(got), expect) => {
            let matched = match (&got, expect) {
                (Got::TaskCount(raw, _), Expect::TaskCount(count)) => raw == count,
                (Got::QueueEmpty(raw, _), Expect::QueueEmpty(idle)) => {
                    idle.delay_ms.is_none_or(|d| d == raw.delay_ms) && idle.stop.is_none_or(|s| s == raw.stop)
                }
                (Got::Failure(raw, _), Expect::Failure(expected)) => raw == expected,
                _ => unreachable!("a case's expectation is of its decision"),
            };
            if matched { Ok(got.clamp_note()) } else { Err(format!("- expect: {}\n+ got:    {}", expect.describe(), got.describe())) }
        }
    }
}

fn matches_error(error: &str, wanted: &str) -> std::result::Result<String, String> {
    if error.contains(wanted) { Ok(String::new()) } else { Err(format!("- expect_error: {wanted:?}\n+ got:          {error}")) }
}

/// What a decision returned: the raw value and what the host would make of it.
enum Got {
    TaskCount(u32, crate::rules::Decision<u32>),
    QueueEmpty(IdleDecision, crate::rules::Decision<IdleDecision>),
    Failure(FailureDecision, crate::rules::Decision<FailureDecision>),
}

impl Got {
    fn describe(&self) -> String {
        match self {
            Got::Failure(raw, clamped) => shown_failure(raw, clamped),
            _ => format!("{}{}", self.raw(), self.clamp_note()),
        }
    }

    fn raw(&self) -> String {
        match self {
            Got::TaskCount(raw, _) => raw.to_string(),
            Got::QueueEmpty(raw, _) => format!("{{ delay_ms = {}, stop = {} }}", raw.delay_ms, raw.stop),
            Got::Failure(raw, _) => shown_failure(raw, &crate::rules::Decision { value: raw.clone(), source: DecisionSource::Rule, clamped: false }),
        }
    }

    /// Cases compare the rule's own (raw) decision; the host's clamp is reported beside it.
    fn clamp_note(&self) -> String {
        match self {
            Got::TaskCount(_, clamped) if clamped.clamped => format!(" (the host would clamp it to {})", clamped.value),
            Got::QueueEmpty(_, clamped) if clamped.clamped => format!(" (the host would clamp delay_ms to {})", clamped.value.delay_ms),
            Got::Failure(_, clamped @ crate::rules::Decision { value: FailureDecision::Retry(delay_ms), .. }) if clamped.clamped => {
                format!(" (the host would clamp the delay to {delay_ms} ms)")
            }
            _ => String::new(),
        }
    }
}

impl Expect {
    fn describe(&self) -> String {
        match self {
            Expect::Success => "configure to succeed".into(),
            Expect::TaskCount(count) => count.to_string(),
            Expect::QueueEmpty(idle) => {
                let fields: Vec<String> =
                    [idle.delay_ms.map(|d| format!("delay_ms = {d}")), idle.stop.map(|s| format!("stop = {s}"))].into_iter().flatten().collect();
                format!("{{ {} }}", fields.join(", "))
            }
            Expect::Failure(decision) => {
                shown_failure(decision, &crate::rules::Decision { value: decision.clone(), source: DecisionSource::Rule, clamped: false })
            }
            Expect::Error(wanted) => format!("an error containing {wanted:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(toml_text: &str) -> Result<Ready> {
        let file: CasesFile = toml::from_str(toml_text)?;
        let raw = file.case.into_iter().next().unwrap();
        prepare(raw, &file.params)
    }

    #[test]
    fn an_unquoted_shared_parameter_is_refused_saying_to_quote_it() {
        let error = format!("{:#}", toml::from_str::<CasesFile>("[params]\nper_task = 32\n").map_err(cases_error).unwrap_err());
        assert!(error.contains("line 2") && error.contains("hint: quote the value"), "{error}");
    }

    #[test]
    fn a_random_of_2_to_the_63_and_above_is_read_as_the_u64_it_is() {
        let ready =
            prepared("[[case]]\nname = 'x'\ndecision = 'queue-empty'\ncontext = { random = 18446744073709551615 }\nexpect = { stop = false }\n").unwrap();
        let Call::QueueEmpty(ctx) = ready.call else { panic!("a queue-empty case") };
        assert_eq!(ctx.random, u64::MAX);
        assert_eq!(ctx.min_interval_ms, 100, "the rest defaults as in ebb rule eval");
    }

    #[test]
    fn a_case_that_mixes_or_lacks_expectations_is_refused_saying_what_to_write() {
        for (body, expected) in [
            ("decision = 'task-count'\nexpect = 1\nexpect_error = 'x'", "not both"),
            ("decision = 'task-count'", "missing `expect`"),
            ("decision = 'task-count'\nexpect = -1", "not a task count"),
            ("decision = 'queue-empty'\nexpect = { delay = 1 }", "unknown field `delay`"),
            ("decision = 'task-count'\ncontext = {}\nexpect = 1", "takes `state`"),
            ("decision = 'configure'\nexpect = 1", "takes `expect_error`"),
            ("decision = 'task-count'\nstate = { depth = 1 }\nexpect = 1", "unknown field `depth`"),
            ("decision = 'configure'\nparams = { per_task = 32 }", "hint: quote the value"),
        ] {
            let error = format!("{:#}", prepared(&format!("[[case]]\nname = 'x'\n{body}\n")).err().unwrap());
            assert!(error.contains(expected), "{body}: {error}");
        }
    }
}
