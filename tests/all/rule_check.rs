//! Issue 26: `ebb rule check` decides (it calls every export with default and edge contexts
//! and fails, naming the export and the context, on what would go wrong in a host), `ebb
//! rule test` runs table-driven cases, and each author's mistake gets a hint, held by a
//! golden file per case (`tests/golden/rule-errors/<case>.err`; `EBB_UPDATE_GOLDEN=1`
//! rewrites them).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use ebb_tests::guests;

use crate::binary::EBB;

/// One compile cache for every test here, kept in the target's temp folder: a Python rule
/// compiles once, not per test (a temp dir held in a static is never dropped, so it leaked
/// tens of MB into /tmp on every run).
fn cache() -> &'static Path {
    static CACHE: OnceLock<std::path::PathBuf> = OnceLock::new();
    CACHE.get_or_init(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("rule-check-cache"))
}

/// Runs `ebb` in `dir` with the shared compile cache.
fn ebb_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(EBB).args(args).current_dir(dir).env("EBB_RULE_CACHE", cache()).env_remove("RUST_LOG").env_remove("EBB_LOG").output().unwrap()
}

/// A folder holding `rule` as `rule.wasm`, so that messages name it the same on every machine.
fn with_rule(rule: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(rule, dir.path().join("rule.wasm")).unwrap();
    dir
}

/// The smallest core WebAssembly module: a header and nothing else.
const CORE_MODULE: &[u8] = b"\0asm\x01\0\0\0";

struct Checked {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `ebb rule ARGS --param P…` on `rule`, copied into a folder of its own as `rule.wasm`.
fn run_rule(rule: &str, args: &[&str], params: &[&str]) -> Checked {
    let dir = with_rule(rule);
    let mut args = args.to_vec();
    for param in params {
        args.extend(["--param", param]);
    }
    let output = ebb_in(dir.path(), &args);
    Checked {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn check(rule: &str, params: &[&str]) -> Checked {
    run_rule(rule, &["rule", "check", "rule.wasm"], params)
}

/// What the check's table shows came back from `export` in `context`.
fn row<'a>(stdout: &'a str, export: &str, context: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|line| {
            line.strip_prefix(export).map(str::trim_start).and_then(|rest| rest.strip_prefix(context)).filter(|rest| rest.starts_with("  ")).map(str::trim)
        })
        .unwrap_or_else(|| panic!("no row for {export} in {context}:\n{stdout}"))
}

fn assert_fails_with(checked: &Checked, expected: &[&str]) {
    assert_eq!(checked.code, Some(1), "stdout:\n{}\nstderr:\n{}", checked.stdout, checked.stderr);
    for part in expected {
        assert!(checked.stderr.contains(part), "missing {part:?} in\n{}", checked.stderr);
    }
}

#[test]
fn rule_check_fails_a_core_module_saying_to_build_a_component() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rule.wasm"), CORE_MODULE).unwrap();
    let output = ebb_in(dir.path(), &["rule", "check", "rule.wasm"]);
    let checked = Checked { code: output.status.code(), stdout: String::new(), stderr: String::from_utf8_lossy(&output.stderr).into_owned() };
    assert_fails_with(
        &checked,
        &["attempted to parse a wasm module with a component parser", "hint: this is a core WebAssembly module", "wasm32-wasip2", "ebb rule build"],
    );
}

#[test]
fn rule_check_fails_a_wrong_contract_version_naming_the_versions_served() {
    assert_fails_with(
        &check(guests::FUTURE_VERSION, &[]),
        &[
            "ebb:rules/decisions@0.9.0, but this host speaks ebb:rules/decisions@0.4.0 or ebb:rules/decisions@0.3.0 or ebb:rules/decisions@0.2.0 or ebb:rules/decisions@0.1.0",
            "hint: rebuild the rule against a contract this host serves: Rust with this ebb's rules-sdk (wit/ebb-rules-0.4.0), Python and JavaScript with `ebb rule build`",
        ],
    );
}

#[test]
fn rule_check_fails_a_missing_function() {
    assert_fails_with(&check(guests::MISSING_EXPORT, &[]), &["lacks the function", "hint: a rule exports every function of its contract"]);
}

#[test]
fn rule_check_fails_a_0_3_0_rule_without_max_concurrent_calls_saying_how_to_add_it() {
    assert_fails_with(
        &check(guests::MISSING_CONCURRENCY_EXPORT, &[]),
        &[
            "its export ebb:rules/decisions@0.3.0 lacks the function max-concurrent-calls",
            "hint: contract 0.3.0 adds max-concurrent-calls",
            "rebuild with the SDK",
            "build against wit/ebb-rules-0.2.0, which the host still serves",
        ],
    );
}

#[test]
fn rule_check_fails_a_misnamed_javascript_export_naming_each_export_and_the_camel_case_names() {
    let checked = check(guests::JS_SNAKE_CASE_EXPORTS, &[]);
    assert_fails_with(
        &checked,
        &[
            "failed 18 of 18 calls",
            "- optimal-dequeue-task-count (defaults; approximate_depth 0; approximate_depth 2^64-1",
            "function 'optimalDequeueTaskCount' not found",
            "- on-queue-empty (defaults (first empty get); idle_count 1000;",
            "function 'onQueueEmpty' not found",
            "decisions.optimalDequeueTaskCount`, `decisions.onQueueEmpty`, `decisions.configure`",
        ],
    );
    // Its configure ran (the object has one): the load and set-up were not the problem.
    assert!(checked.stdout.contains("configure:    ok"), "{}", checked.stdout);
}

#[test]
fn rule_check_fails_a_trap_in_any_decision_listing_every_failure_not_the_first() {
    let checked = check(guests::TRAP, &[]);
    assert_fails_with(
        &checked,
        &[
            "failed 26 of 26 calls",
            "- optimal-dequeue-task-count (defaults;",
            "about to fail at depth 0",
            "about to fail at depth 18446744073709551615",
            "- on-queue-empty (defaults (first empty get);",
            "- max-concurrent-calls (a busy window; completed 0;",
        ],
    );
    // The table shows every call made, each with what came back.
    assert_eq!(checked.stdout.lines().filter(|l| l.ends_with("FAULT")).count(), 26, "{}", checked.stdout);
}

#[test]
fn rule_check_fails_console_use_in_javascript_naming_the_export() {
    let checked = check(guests::JS_CONSOLE_LOG, &[]);
    assert_fails_with(
        &checked,
        &[
            "failed 9 of 18 calls",
            "- optimal-dequeue-task-count (",
            "console is not defined",
            "hint: optimal-dequeue-task-count uses `console`",
            "`ebb rule build`",
        ],
    );
    // on-queue-empty, which does not log, answered.
    assert_eq!(row(&checked.stdout, "on-queue-empty", "defaults (first empty get)"), "delay_ms 100, stop false", "{}", checked.stdout);
}

#[test]
fn rule_check_fails_a_fractional_count_from_python_naming_the_export() {
    let checked = check(guests::PY_FAULTY, &["mode=float-count"]);
    assert_fails_with(&checked, &["- optimal-dequeue-task-count (", "TypeError", "hint: optimal-dequeue-task-count returned a float", "math.ceil"]);
    assert!(!checked.stderr.contains("- on-queue-empty"), "{}", checked.stderr);
}

#[test]
fn rule_check_fails_fuel_exhaustion_in_each_export() {
    assert_fails_with(
        &check(guests::LOOP_FOREVER, &[]),
        &[
            "failed 26 of 26 calls",
            "- optimal-dequeue-task-count (",
            "- on-queue-empty (",
            "- max-concurrent-calls (",
            "hint: max-concurrent-calls did not return within the host's limits",
        ],
    );
}

/// Issue 38, item 6: a rule with no loop that raises 2 to the depth (a Python big integer)
/// ran out of fuel at a depth of 2^64 - 1, and the hint sent its author looking for a loop.
#[test]
fn rule_check_fails_a_huge_integer_power_with_a_hint_that_names_it() {
    let checked = check(guests::PY_FAULTY, &["mode=huge-power"]);
    assert_fails_with(&checked, &["- optimal-dequeue-task-count (", "hint: optimal-dequeue-task-count", "integer power"]);
}

#[test]
fn rule_check_fails_rejected_parameters_with_the_rules_message() {
    assert_fails_with(
        &check(guests::PROPORTIONAL, &["per_task=0"]),
        &["rule rule.wasm failed its set-up", "the rule rejected its parameters: parameter \"per_task\": must be at least 1"],
    );
}

/// Issue 35: a delay the host clamps failed the check, though the host clamps it (as it
/// clamps task counts, which the check only marks): the paper's own jittered back-off dips
/// below its minimum at the first idle look. It is a warning now, and the check passes.
#[test]
fn rule_check_warns_of_a_jittered_delay_under_the_minimum_and_passes() {
    let checked = check(guests::JS_UNFLOORED_BACKOFF, &[]);
    assert_eq!(checked.code, Some(0), "stdout:\n{}\nstderr:\n{}", checked.stdout, checked.stderr);
    assert_eq!(
        row(&checked.stdout, "on-queue-empty", "random 0"),
        "delay_ms 80, stop false (warning: outside the interval; the host clamps it to 100)",
        "{}",
        checked.stdout
    );
    for part in [
        "warning: rule rule.wasm returned a value the host clamps in",
        "- on-queue-empty (",
        "delay_ms 80 is outside the interval the rule was given [min_interval_ms 100, max_interval_ms 60000], so the host clamps it to 100",
        "hint: keep the delay within",
    ] {
        assert!(checked.stderr.contains(part), "missing {part:?} in\n{}", checked.stderr);
    }
    assert!(checked.stdout.contains("none faulted (") && checked.stdout.contains("--strict fails on them"), "{}", checked.stdout);
}

/// With `--strict`, a delay the host clamps fails the check; a count the host caps is the
/// host's documented job, marked in the table and never a failure, strict or not.
#[test]
fn rule_check_strict_fails_a_delay_the_host_clamps_but_not_a_count_the_host_caps() {
    // absurd-values returns u32::MAX tasks and a delay of u64::MAX ms (outside [min, max]:
    // a unit mistake or an uncapped back-off).
    let warned = check(guests::ABSURD_VALUES, &[]);
    assert_eq!(warned.code, Some(0), "stdout:\n{}\nstderr:\n{}", warned.stdout, warned.stderr);
    assert!(warned.stderr.contains("returned a value the host clamps in 9 of 26 calls"), "{}", warned.stderr);
    let strict = run_rule(guests::ABSURD_VALUES, &["rule", "check", "rule.wasm", "--strict"], &[]);
    assert_fails_with(
        &strict,
        &[
            "failed 9 of 26 calls",
            "- on-queue-empty (",
            "delay_ms 18446744073709551615 is outside the interval the rule was given [min_interval_ms 800, max_interval_ms 800]",
            "hint: keep the delay within",
        ],
    );
    for checked in [&warned, &strict] {
        assert!(!checked.stderr.contains("- optimal-dequeue-task-count") && !checked.stderr.contains("- max-concurrent-calls"), "{}", checked.stderr);
        assert!(checked.stdout.contains("4294967295 (the host bounds it to 100, as it should)"), "{}", checked.stdout);
        assert_eq!(row(&checked.stdout, "max-concurrent-calls", "a busy window"), "4294967295 (the host bounds it to 32, as it should)", "{}", checked.stdout);
    }
}

#[test]
fn rule_check_fails_a_trap_in_max_concurrent_calls_naming_the_export_and_each_context() {
    let checked = check(guests::TRAPS_DECIDING_CONCURRENCY, &[]);
    assert_fails_with(
        &checked,
        &[
            "failed 8 of 26 calls",
            // Grouped by reason, which holds what the rule wrote: the limit it was told.
            "- max-concurrent-calls (a busy window; completed 0; latencies 0 ms; latencies 1e9 ms; every call failed or pushed back): trapped",
            "about to fail at a limit of 32",
            "- max-concurrent-calls (every field at its most): trapped",
            "about to fail at a limit of 4294967295",
            "max-concurrent-calls always fails",
        ],
    );
    assert!(!checked.stderr.contains("- optimal-dequeue-task-count") && !checked.stderr.contains("- on-queue-empty"), "{}", checked.stderr);
    assert_eq!(row(&checked.stdout, "optimal-dequeue-task-count", "defaults"), "2", "{}", checked.stdout);
}

#[test]
fn rule_check_calls_the_adaptive_example_with_every_handler_state_and_passes_it() {
    let checked = check(guests::ADAPTIVE_CONCURRENCY, &["initial=4", "tolerance=1.5"]);
    assert_eq!(checked.code, Some(0), "{}\n{}", checked.stdout, checked.stderr);
    assert!(checked.stdout.contains("contract:     ebb:rules/decisions@0.4.0\n"), "{}", checked.stdout);
    assert!(checked.stdout.contains("ok: 26 calls"), "{}", checked.stdout);
    // A queue starting at its ceiling starts from `initial`.
    assert_eq!(row(&checked.stdout, "max-concurrent-calls", "a busy window"), "4", "{}", checked.stdout);
    let checked = check(guests::ADAPTIVE_CONCURRENCY, &["backoff=1"]);
    assert_fails_with(&checked, &["the rule rejected its parameters: parameter \"backoff\""]);
}

#[test]
fn rule_check_passes_rules_that_decide_in_every_language_even_when_the_host_bounds_their_counts() {
    // Rules of contract 0.3.0 are also called with 8 handler states; older ones are not.
    for (rule, calls) in [
        (guests::PAPER_DEFAULT, 26),
        (guests::PROPORTIONAL, 26),
        (guests::THRESHOLD_TABLE, 26),
        (guests::ADAPTIVE_CONCURRENCY, 26),
        (guests::CONTRACT_0_2, 18),
        (guests::CONTRACT_0_1, 18),
        (guests::JAVASCRIPT_SPARE_CAPACITY, 18),
        (guests::PYTHON_DRAIN_TIME, 18),
        (guests::C_PROPORTIONAL, 26),
    ] {
        let checked = check(rule, &[]);
        assert_eq!(checked.code, Some(0), "{rule}: {}\n{}", checked.stdout, checked.stderr);
        assert!(checked.stdout.contains(&format!("ok: {calls} calls")), "{rule}: {}", checked.stdout);
    }
    let checked = check(guests::PAPER_DEFAULT, &[]);
    assert_eq!(row(&checked.stdout, "max-concurrent-calls", "a busy window"), "none (the queue keeps its max_concurrent_calls)", "{}", checked.stdout);
    let checked = check(guests::CONTRACT_0_2, &[]);
    assert!(
        checked.stdout.contains("contract:     ebb:rules/decisions@0.2.0 (an older contract, still served: the rule does not decide handler concurrency"),
        "{}",
        checked.stdout
    );
    // The paper's rule returns 0 tasks for an empty queue: the host raises it to min_tasks.
    let checked = check(guests::PAPER_DEFAULT, &[]);
    assert_eq!(row(&checked.stdout, "optimal-dequeue-task-count", "approximate_depth 0"), "0 (the host bounds it to 1, as it should)", "{}", checked.stdout);
}

// ---- ebb rule eval --concurrency ----

fn eval_concurrency(rule: &str, params: &[&str], state: &str) -> Checked {
    run_rule(rule, &["rule", "eval", "rule.wasm", "--concurrency", state], params)
}

#[test]
fn rule_eval_asks_max_concurrent_calls_with_a_handler_state() {
    let json =
        |checked: &Checked| serde_json::from_str::<serde_json::Value>(&checked.stdout).unwrap_or_else(|e| panic!("{e}: {}{}", checked.stdout, checked.stderr));
    let echoed = eval_concurrency(guests::ECHO_STATE, &["handler_field=completed"], r#"{"completed": 20, "latency_mean_ms": 50}"#);
    assert_eq!(echoed.code, Some(0), "{}", echoed.stderr);
    assert_eq!(json(&echoed), serde_json::json!({ "value": 20, "source": "rule", "clamped": false }));
    let bounded = eval_concurrency(guests::ECHO_STATE, &["handler_field=completed"], r#"{"completed": 20, "max_limit": 16}"#);
    assert_eq!(json(&bounded), serde_json::json!({ "value": 16, "source": "rule", "clamped": true }));
    let defaults = eval_concurrency(guests::ECHO_STATE, &["handler_field=max_limit"], "{}");
    assert_eq!(json(&defaults)["value"], 32, "the defaults: a queue at its ceiling of 32");

    let none = eval_concurrency(guests::PAPER_DEFAULT, &[], "{}");
    assert_eq!(none.code, Some(0), "{}", none.stderr);
    assert_eq!(json(&none), serde_json::json!({ "value": null, "source": "rule", "clamped": false }), "none: the configured bound");

    let faulted = eval_concurrency(guests::TRAPS_DECIDING_CONCURRENCY, &[], "{}");
    assert_eq!(faulted.code, Some(1));
    assert_eq!(json(&faulted), serde_json::json!({ "value": null, "source": "fallback", "clamped": false }));
    assert!(
        faulted.stderr.contains("the rule faulted, so the queue would keep its max_concurrent_calls") && faulted.stderr.contains("always fails"),
        "{}",
        faulted.stderr
    );

    let older = eval_concurrency(guests::CONTRACT_0_2, &[], "{}");
    assert_eq!(older.code, Some(1));
    assert!(older.stderr.contains("speaks contract 0.2.0, which has no max-concurrent-calls (added in 0.3.0)"), "{}", older.stderr);

    for (state, reason) in [
        (r#"{"current_limit": 40}"#, "current_limit 40 is outside [1, max_limit 32]"),
        (r#"{"max_limit": 10001}"#, "max_limit 10001 is outside [1, 10000]"),
        (r#"{"completed": 3, "failed": 2, "pushed_back": 2, "latency_mean_ms": 1}"#, "failed 2 + pushed_back 2 is more than completed 3"),
        (r#"{"completed": 0, "latency_mean_ms": 5}"#, "latencies are 0 when no call completed"),
        (r#"{"completed": 5, "latency_min_ms": 9, "latency_mean_ms": 5}"#, "latency_min_ms 9 <= latency_mean_ms 5"),
        (r#"{"completed": 5, "latency_mean_ms": -1}"#, "latency_min_ms -1 is not a duration"),
        (r#"{"window_ms": 0}"#, "window_ms is 0"),
    ] {
        let impossible = eval_concurrency(guests::ECHO_STATE, &["handler_field=completed"], state);
        assert_eq!(impossible.code, Some(1), "{state}: {}", impossible.stdout);
        assert!(
            impossible.stderr.contains("describes a handler state the host never sends") && impossible.stderr.contains(reason),
            "{state}: {}",
            impossible.stderr
        );
        assert!(impossible.stdout.is_empty(), "{state}: the rule was asked: {}", impossible.stdout);
    }

    let wrong = eval_concurrency(guests::PAPER_DEFAULT, &[], r#"{"latency_ms": 5}"#);
    assert_eq!(wrong.code, Some(1));
    assert!(wrong.stderr.contains("--concurrency does not describe a handler-state") && wrong.stderr.contains("latency_ms"), "{}", wrong.stderr);
}

// ---- ebb rule test ----

/// A folder with `rule.wasm` and `cases.toml`.
fn with_cases(rule: &str, cases: &str) -> tempfile::TempDir {
    let dir = with_rule(rule);
    std::fs::write(dir.path().join("cases.toml"), cases).unwrap();
    dir
}

fn rule_test(rule: &str, cases: &str) -> Checked {
    let dir = with_cases(rule, cases);
    let output = ebb_in(dir.path(), &["rule", "test", "rule.wasm", "cases.toml"]);
    Checked {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

const PROPORTIONAL_CASES: &str = r#"
[params]
per_task = "32"

[[case]]
name = "a deep queue runs one task per 32 messages"
decision = "task-count"
state = { approximate_depth = 320 }
expect = 10

[[case]]
name = "a count past max_tasks is the rule's, reported with the host's clamp"
decision = "task-count"
state = { approximate_depth = 320000, max_tasks = 50 }
expect = 10000

[[case]]
name = "first empty get sleeps the minimum"
decision = "queue-empty"
context = { idle_count = 1, min_interval_ms = 800, random = 0 }
expect = { delay_ms = 800, stop = false }

[[case]]
name = "a random of 2^63 and above is read as the u64 it is"
decision = "queue-empty"
context = { idle_count = 1, min_interval_ms = 800, random = 18446744073709551615 }
expect = { delay_ms = 960 }

[[case]]
name = "per_task must be a positive number"
params = { per_task = "zero" }
decision = "configure"
expect_error = "per_task"

[[case]]
name = "per_task 1 is accepted"
params = { per_task = "1" }
decision = "configure"
"#;

#[test]
fn rule_test_passes_a_correct_cases_file() {
    let tested = rule_test(guests::PROPORTIONAL, PROPORTIONAL_CASES);
    assert_eq!(tested.code, Some(0), "{}\n{}", tested.stdout, tested.stderr);
    assert!(tested.stdout.contains("ok    a deep queue runs one task per 32 messages\n"), "{}", tested.stdout);
    assert!(
        tested.stdout.contains("ok    a count past max_tasks is the rule's, reported with the host's clamp (the host would clamp it to 50)\n"),
        "{}",
        tested.stdout
    );
    assert!(tested.stdout.ends_with("6 passed, 0 failed\n"), "{}", tested.stdout);
}

#[test]
fn rule_test_fails_a_wrong_expectation_with_a_diff_and_runs_the_other_cases() {
    let cases = PROPORTIONAL_CASES.replace("expect = 10\n", "expect = 11\n").replace("expect = { delay_ms = 960 }", "expect = { delay_ms = 960, stop = true }");
    let tested = rule_test(guests::PROPORTIONAL, &cases);
    assert_eq!(tested.code, Some(1), "{}\n{}", tested.stdout, tested.stderr);
    assert!(tested.stdout.contains("FAIL  a deep queue runs one task per 32 messages\n      - expect: 11\n      + got:    10\n"), "{}", tested.stdout);
    assert!(
        tested.stdout.contains("FAIL  a random of 2^63 and above is read as the u64 it is\n      - expect: { delay_ms = 960, stop = true }\n      + got:    { delay_ms = 960, stop = false }\n"),
        "{}",
        tested.stdout
    );
    assert!(tested.stdout.ends_with("4 passed, 2 failed\n"), "{}", tested.stdout);
    assert!(tested.stderr.contains("2 of 6 cases of cases.toml failed"), "{}", tested.stderr);
}

#[test]
fn rule_test_expects_an_error_from_a_decision_under_the_hosts_limits() {
    let cases = r#"
[[case]]
name = "the loop is stopped by the host's fuel"
decision = "task-count"
expect_error = "ran out of its call fuel"

[[case]]
name = "a decision that faults is a failure when a value was expected"
decision = "queue-empty"
expect = { delay_ms = 100 }
"#;
    let tested = rule_test(guests::LOOP_FOREVER, cases);
    assert_eq!(tested.code, Some(1), "{}\n{}", tested.stdout, tested.stderr);
    assert!(tested.stdout.contains("ok    the loop is stopped by the host's fuel\n"), "{}", tested.stdout);
    assert!(tested.stdout.contains("FAIL  a decision that faults is a failure when a value was expected\n      - expect: { delay_ms = 100 }\n      + got:    the call faulted: ran out of its call fuel"), "{}", tested.stdout);
}

#[test]
fn rule_test_refuses_unknown_keys_naming_the_key_and_the_case() {
    for (cases, expected) in [
        (
            "[[case]]\nname = \"one\"\ndecision = \"task-count\"\nexpect = 1\nfuel = 1000000000000\n",
            "invalid case 1 (\"one\") in cases.toml: unknown field `fuel`",
        ),
        (
            "[[case]]\nname = \"one\"\ndecision = \"task-count\"\nstate = { depth = 5 }\nexpect = 1\n",
            "invalid case 1 (\"one\") in cases.toml: state does not describe a queue-state: unknown field `depth`",
        ),
        ("[limits]\ncall_fuel = 1\n[[case]]\nname = \"one\"\ndecision = \"task-count\"\nexpect = 1\n", "unknown field `limits`, expected `params` or `case`"),
        (
            "[[case]]\nname = \"one\"\ndecision = \"task-count\"\nexpect = 0\n[[case]]\nname = \"two\"\ndecision = \"decide\"\nexpect = 1\n",
            "invalid case 2 (\"two\") in cases.toml: unknown variant `decide`",
        ),
    ] {
        let tested = rule_test(guests::PROPORTIONAL, cases);
        assert_eq!(tested.code, Some(1), "{cases}: {}", tested.stdout);
        assert!(tested.stderr.contains(expected), "{cases}: {}", tested.stderr);
        assert!(tested.stdout.is_empty(), "nothing runs before the whole file is read: {}", tested.stdout);
    }
}

#[test]
fn rule_test_refuses_an_oversized_file_and_too_many_cases() {
    let tested = rule_test(guests::PROPORTIONAL, &format!("# {}\n", "x".repeat(1 << 20)));
    assert_eq!(tested.code, Some(1));
    assert!(tested.stderr.contains("cases file cases.toml is 1048579 bytes, over the limit of 1048576 bytes"), "{}", tested.stderr);
    let many = "[[case]]\nname = \"n\"\ndecision = \"task-count\"\nexpect = 0\n".repeat(1001);
    let tested = rule_test(guests::PROPORTIONAL, &many);
    assert_eq!(tested.code, Some(1));
    assert!(tested.stderr.contains("has 1001 cases, over the limit of 1000: split it into several files"), "{}", tested.stderr);
}

// ---- every error says what to do: one golden file per case ----

/// Compares `stderr` (temp paths and wasm offsets, which move with the toolchain's build, normalized) with `tests/golden/rule-errors/<case>.err`, or
/// writes it there under `EBB_UPDATE_GOLDEN=1`.
fn golden(case: &str, output: &Output, dir: &Path) {
    assert_eq!(output.status.code(), Some(1), "{case}: {}", String::from_utf8_lossy(&output.stdout));
    let mut stderr = String::from_utf8_lossy(&output.stderr).replace(&dir.display().to_string(), "<tmp>");
    while let Some(start) = stderr.find("(at offset 0x") {
        let end = stderr[start..].find(')').map_or(stderr.len(), |e| start + e + 1);
        stderr.replace_range(start..end, "(at offset <n>)");
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/rule-errors").join(format!("{case}.err"));
    if std::env::var_os("EBB_UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &stderr).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (run with EBB_UPDATE_GOLDEN=1 to write it)", path.display()));
    assert_eq!(stderr, expected, "{case}: stderr differs from {} (EBB_UPDATE_GOLDEN=1 rewrites it)", path.display());
    assert!(stderr.contains("hint: "), "{case}: no hint in\n{stderr}");
}

fn golden_check(case: &str, rule: &str, params: &[&str]) {
    let dir = with_rule(rule);
    let mut args = vec!["rule", "check", "rule.wasm"];
    for param in params {
        args.extend(["--param", param]);
    }
    golden(case, &ebb_in(dir.path(), &args), dir.path());
}

#[test]
fn golden_hint_for_a_core_module() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rule.wasm"), CORE_MODULE).unwrap();
    golden("core-module", &ebb_in(dir.path(), &["rule", "check", "rule.wasm"]), dir.path());
}

#[test]
fn golden_hint_for_javascript_built_without_sync() {
    golden_check("js-without-sync", guests::JS_FIXED_NOSYNC, &[]);
}

#[test]
fn golden_hint_for_a_misnamed_javascript_export() {
    golden_check("js-misnamed-export", guests::JS_SNAKE_CASE_EXPORTS, &[]);
}

#[test]
fn golden_hint_for_javascript_console_use() {
    golden_check("js-console", guests::JS_CONSOLE_LOG, &[]);
}

#[test]
fn golden_hint_for_a_python_exception_in_configure() {
    golden_check("py-configure-exception", guests::PY_FAULTY, &["mode=value-error"]);
}

#[test]
fn golden_hint_for_a_python_float_count() {
    golden_check("py-float-count", guests::PY_FAULTY, &["mode=float-count"]);
}

#[test]
fn golden_hint_for_unquoted_rule_params_lists_every_bad_key_of_every_queue() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("rules")).unwrap();
    let config = r#"
[queues.orders]
rule = "proportional.wasm"
rule_params = { per_task = 10, label = "fine", fast = true }
handler = { url = "http://127.0.0.1:9/work" }

[queues.invoices]
rule = "proportional.wasm"
rule_params = { per_task = 2.5 }
handler = { url = "http://127.0.0.1:9/work" }
"#;
    std::fs::write(dir.path().join("ebb.toml"), config).unwrap();
    let output = ebb_in(dir.path(), &["check", "--config", "ebb.toml"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    for key in
        ["queues.orders.rule_params.per_task = 10", "queues.orders.rule_params.fast = true", "queues.invoices.rule_params.per_task = 2.5", r#"per_task = "10""#]
    {
        assert!(stderr.contains(key), "missing {key:?} in\n{stderr}");
    }
    assert!(!stderr.contains("label"), "a string is fine: {stderr}");
    golden("rule-params-unquoted", &output, dir.path());
}

/// Review defect: a rule's configure message reached the log, `/status` and `ebb status` whole
/// (200 KB) and raw (a newline forged a log line; a terminal escape repainted the terminal).
#[test]
fn a_hostile_rejection_message_is_cut_and_escaped() {
    let output = ebb_in(Path::new("."), &["rule", "check", guests::JS_HOSTILE_REJECTION, "--param", "k=v"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.len() < 4_000, "{} bytes", stderr.len());
    assert!(!stderr.contains('\u{1b}') && !stderr.contains("\n2026-11-25T16:20:00"), "{stderr}");
    assert!(stderr.contains(r"nope\n2026-11-25T16:20:00.000000Z ERROR ebb::host: FAKE host line \u{1b}[31mred RRR"), "{stderr}");
    assert!(stderr.contains("bytes cut"), "{stderr}");
}

/// Review defect: case names were printed raw, so a name could forge an `ok` line or send
/// terminal escapes.
#[test]
fn rule_test_prints_case_names_escaped() {
    let cases = "[[case]]\nname = \"\\u001b[31mRED\\nok    FAKE\"\ndecision = \"task-count\"\nstate = { approximate_depth = 320 }\nexpect = 2\n";
    let tested = rule_test(guests::PROPORTIONAL, cases);
    assert_eq!(tested.code, Some(0), "{}\n{}", tested.stdout, tested.stderr);
    assert!(!tested.stdout.contains('\u{1b}') && !tested.stdout.contains("\nok    FAKE"), "{}", tested.stdout);
    assert!(tested.stdout.contains(r"ok    \u{1b}[31mRED\nok    FAKE"), "{}", tested.stdout);
}

// ---- failures (issue 22, defect 2): check, eval --failure and test cases call on-handler-failure ----

/// A failures rule was reported healthy by `ebb rule check` whatever its `on-handler-failure`
/// did: it is now called over a grid of failures (attempts, status classes, elapsed times)
/// under the host's limits, and a trap or a loop there fails the check naming the export.
#[test]
fn rule_check_calls_on_handler_failure_and_fails_a_rule_that_traps_or_loops_there() {
    let ok = check(guests::RETRY_POLICY, &[]);
    assert_eq!(ok.code, Some(0), "{}\n{}", ok.stdout, ok.stderr);
    assert_eq!(row(&ok.stdout, "on-handler-failure", "HTTP 422, first failure"), "poison \"retry-policy: HTTP 422 is not retried\"");
    assert_eq!(row(&ok.stdout, "on-handler-failure", "HTTP 500, last attempt"), "default");
    assert!(row(&ok.stdout, "on-handler-failure", "timeout, first failure").starts_with("retry after "), "{}", ok.stdout);
    let calls = ok.stdout.lines().filter(|l| l.starts_with("on-handler-failure")).count();
    assert!(calls >= 10, "a grid of failures, not one: {calls}\n{}", ok.stdout);
    for (mode, reason) in [("trap", "probe traps on failure"), ("loop", "on-handler-failure did not return within the host's limits")] {
        let checked = check(guests::FAILURE_PROBE, &[&format!("mode={mode}")]);
        assert_fails_with(&checked, &["- on-handler-failure (", reason]);
        assert!(!checked.stderr.contains("- optimal-dequeue-task-count") && !checked.stderr.contains("- on-queue-empty"), "{mode}: {}", checked.stderr);
        assert_eq!(checked.stdout.lines().filter(|l| l.starts_with("on-handler-failure") && l.ends_with("FAULT")).count(), calls, "{mode}: {}", checked.stdout);
    }
    // A rule without the interface is not asked.
    let paper = check(guests::PAPER_DEFAULT, &[]);
    assert_eq!(paper.code, Some(0), "{}", paper.stderr);
    assert!(!paper.stdout.lines().any(|l| l.starts_with("on-handler-failure")), "{}", paper.stdout);
}

fn eval_failure(rule: &str, params: &[&str], ctx: &str) -> Checked {
    run_rule(rule, &["rule", "eval", "rule.wasm", "--failure", ctx], params)
}

#[test]
fn rule_eval_asks_on_handler_failure_with_a_failure_context() {
    let json =
        |checked: &Checked| serde_json::from_str::<serde_json::Value>(&checked.stdout).unwrap_or_else(|e| panic!("{e}: {}{}", checked.stdout, checked.stderr));
    let poisoned = eval_failure(guests::RETRY_POLICY, &[], r#"{"error_class": "http-status", "http_status": 422}"#);
    assert_eq!(poisoned.code, Some(0), "{}", poisoned.stderr);
    assert_eq!(json(&poisoned), serde_json::json!({ "value": { "poison": "retry-policy: HTTP 422 is not retried" }, "source": "rule", "clamped": false }));
    let retried = eval_failure(guests::FAILURE_PROBE, &["mode=retry", "delay_ms=5000"], "{}");
    assert_eq!(json(&retried), serde_json::json!({ "value": { "retry": 5000 }, "source": "rule", "clamped": false }));
    let bounded = eval_failure(guests::FAILURE_PROBE, &["mode=retry", "delay_ms=5000"], r#"{"max_retry_delay_ms": 1000}"#);
    assert_eq!(json(&bounded), serde_json::json!({ "value": { "retry": 1000 }, "source": "rule", "clamped": true }));
    let by_default = eval_failure(guests::FAILURE_PROBE, &[], r#"{"dequeue_count": 3}"#);
    assert_eq!(json(&by_default), serde_json::json!({ "value": "default", "source": "rule", "clamped": false }));

    let faulted = eval_failure(guests::FAILURE_PROBE, &["mode=trap"], "{}");
    assert_eq!(faulted.code, Some(1));
    assert_eq!(json(&faulted), serde_json::json!({ "value": "default", "source": "fallback", "clamped": false }));
    assert!(faulted.stderr.contains("the rule faulted") && faulted.stderr.contains("probe traps on failure 1"), "{}", faulted.stderr);

    let not_asked = eval_failure(guests::PAPER_DEFAULT, &[], "{}");
    assert_eq!(not_asked.code, Some(1));
    assert!(not_asked.stderr.contains("does not export ebb:rules/failures@0.4.0"), "{}", not_asked.stderr);
    assert!(not_asked.stdout.is_empty(), "{}", not_asked.stdout);

    for (ctx, reason) in [
        (r#"{"attempts": 1}"#, "--failure does not describe a failure-context"),
        (r#"{"dequeue_count": 0}"#, "dequeue_count is 0"),
        (r#"{"error_class": "http-status"}"#, "http_status"),
        (r#"{"error_class": "timeout", "http_status": 422}"#, "error_class"),
        (r#"{"http_status": 200}"#, "http_status 200 is not a failure"),
        // Attack pass: these were asked, though no host sends them.
        (r#"{"queue": "NOT VALID NAME \n"}"#, "is not a queue name"),
        (r#"{"queue": ""}"#, "is not a queue name"),
        (r#"{"error": "\u0000\u001b[31m"}"#, "control or reordering characters"),
        (r#"{"item": 4294967295}"#, "at most 10000 items"),
        (r#"{"max_retry_delay_ms": 18446744073709551615}"#, "over 604800000 (7 days)"),
    ] {
        let wrong = eval_failure(guests::RETRY_POLICY, &[], ctx);
        assert_eq!(wrong.code, Some(1), "{ctx}: {}", wrong.stdout);
        assert!(wrong.stderr.contains(reason), "{ctx}: {}", wrong.stderr);
        assert!(wrong.stdout.is_empty(), "{ctx}: the rule was asked: {}", wrong.stdout);
    }
}

#[test]
fn rule_test_runs_failure_cases() {
    let cases = r#"
[[case]]
name = "422 is poisoned at once"
decision = "failure"
context = { error_class = "http-status", http_status = 422 }
expect = { poison = "retry-policy: HTTP 422 is not retried" }

[[case]]
name = "a timeout waits 10 s"
decision = "failure"
context = { error_class = "timeout", random = 9223372036854775808 }
expect = { retry = 10000 }

[[case]]
name = "the last attempt takes the default"
decision = "failure"
context = { dequeue_count = 5, max_dequeue_count = 5 }
expect = "default"

[[case]]
name = "a wrong expectation"
decision = "failure"
context = { error_class = "http-status", http_status = 500 }
expect = "default"
"#;
    let tested = rule_test(guests::RETRY_POLICY, cases);
    assert_eq!(tested.code, Some(1), "{}\n{}", tested.stdout, tested.stderr);
    for line in ["ok    422 is poisoned at once\n", "ok    a timeout waits 10 s\n", "ok    the last attempt takes the default\n", "FAIL  a wrong expectation\n"]
    {
        assert!(tested.stdout.contains(line), "{line:?} in {}", tested.stdout);
    }
    assert!(tested.stdout.contains("- expect: default\n") && tested.stdout.contains("+ got:    retry after "), "{}", tested.stdout);
    assert!(tested.stdout.ends_with("3 passed, 1 failed\n"), "{}", tested.stdout);
    let trapped =
        rule_test(guests::FAILURE_PROBE, "[params]\nmode = \"trap\"\n\n[[case]]\nname = \"t\"\ndecision = \"failure\"\nexpect_error = \"probe traps\"\n");
    assert_eq!(trapped.code, Some(0), "{}\n{}", trapped.stdout, trapped.stderr);
    let wrong = rule_test(guests::RETRY_POLICY, "[[case]]\nname = \"x\"\ndecision = \"failure\"\nstate = {}\nexpect = \"default\"\n");
    assert!(wrong.code == Some(1) && wrong.stderr.contains("a failure case takes `context`"), "{}", wrong.stderr);
    let wrong = rule_test(guests::RETRY_POLICY, "[[case]]\nname = \"x\"\ndecision = \"failure\"\nexpect = { retry = \"soon\" }\n");
    assert!(wrong.code == Some(1) && wrong.stderr.contains("expect:"), "{}", wrong.stderr);
}

/// Attack pass: the Python retry example took any digits for a delay, so a huge one made
/// `on-handler-failure` trap (OverflowError) on every failure, and `٣` passed as a digit.
#[test]
fn the_python_retry_example_refuses_a_delay_the_host_cannot_take() {
    for (value, says) in [("999999999999999999999999999999", "more than 604800000 (7 days)"), ("604800001", "more than 604800000"), ("٣", "not a whole number")]
    {
        let checked = check(guests::PYTHON_RETRY, &[&format!("base_retry_ms={value}")]);
        assert_fails_with(&checked, &["the rule rejected its parameters", "base_retry_ms", says]);
    }
    let fine = check(guests::PYTHON_RETRY, &["base_retry_ms=604800000"]);
    assert_eq!(fine.code, Some(0), "{}{}", fine.stdout, fine.stderr);
}
