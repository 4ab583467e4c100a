//! `ebb simulate --bench`: the cost benchmark of issue 19 (on SQS, issue 37's) in one
//! command. Every named traffic scenario (and the idle day) for the rules given (default: the
//! backend's four), each against the backend's floor, and the goals checked on the shipped
//! default (`paper` pull, `paper-push` push) where the rules they compare are in the run:
//! pull against Azure Functions' trigger on Azure, against Lambda's event source mapping on SQS.

use std::time::Duration;

use anyhow::{Context as _, Result};
use serde::Serialize;

use super::{RuleReport, Scenario, SimOptions, SimReport};

/// The scenarios of the benchmark, in order.
pub(crate) const SCENARIOS: &[&str] = &["paper-billing", "burst", "trickle", "bursty-day", "idle"];
/// Push goal: at most this many times the floor's consumer calls.
pub(crate) const PUSH_RATIO_GOAL: f64 = 1.25;
/// Push goal: the pickup p99 at most this (and at most the wait budget).
pub(crate) const PUSH_P99_GOAL: Duration = Duration::from_secs(1);
/// Idle goal for push: transactions an hour beyond the safety polls.
pub(crate) const IDLE_PUSH_PER_HOUR_GOAL: f64 = 1.0;
/// Idle goal for pull: transactions an hour.
pub(crate) const IDLE_PULL_PER_HOUR_GOAL: f64 = 60.0;
/// Idle goal for pull on SQS: requests an hour (half of Lambda's two idle long-pollers).
pub(crate) const SQS_IDLE_PULL_PER_HOUR_GOAL: f64 = 180.0;
/// Pull goal on SQS: the pickup p99 at most this (Lambda's model's long poll).
pub(crate) const SQS_PULL_P99_GOAL: Duration = Duration::from_secs(20);
/// The scenarios issue 37 sets goals for (between idle and load, and idle).
const SQS_GOAL_SCENARIOS: &[&str] = &["paper-billing", "bursty-day", "idle"];

/// What the goals compare on a backend.
struct Targets {
    /// Idle pull: transactions an hour at most.
    idle_pull_per_hour: f64,
    /// The baseline pull is set against.
    baseline: &'static str,
    /// Pull's pickup p99 at most this; `None`: at most the baseline's.
    pull_p99: Option<Duration>,
    /// The scenarios the issue sets goals for; `None`: every one. The others' rows are
    /// shown for information, not as goals missed.
    goal_scenarios: Option<&'static [&'static str]>,
}

impl Targets {
    fn of(backend: super::SimBackend) -> Targets {
        if backend.is_sqs() {
            Targets {
                idle_pull_per_hour: SQS_IDLE_PULL_PER_HOUR_GOAL,
                baseline: "lambda-esm",
                pull_p99: Some(SQS_PULL_P99_GOAL),
                goal_scenarios: Some(SQS_GOAL_SCENARIOS),
            }
        } else {
            Targets { idle_pull_per_hour: IDLE_PULL_PER_HOUR_GOAL, baseline: "functions", pull_p99: None, goal_scenarios: None }
        }
    }
}

/// One goal, measured.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    /// The scenario.
    pub scenario: String,
    /// The rule the goal is for.
    pub rule: String,
    /// What it must do, in words.
    pub goal: String,
    /// What it did, in words.
    pub measured: String,
    /// Whether it did.
    pub met: bool,
    /// The issue sets no goal for this scenario: shown for information only.
    pub informative: bool,
}

/// The benchmark's result.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The floor's wait budget W, in milliseconds.
    pub wait_budget_ms: u64,
    /// The backend modelled.
    pub backend: super::SimBackend,
    /// The simulated app's handler time per message.
    pub handler_time: String,
    /// The queue's `max_concurrent_calls` in every run (see `scaled_out_calls`).
    pub max_concurrent_calls: u32,
    /// One run per scenario.
    pub scenarios: Vec<SimReport>,
    /// The goals that the rules in the run let it check.
    pub goals: Vec<Goal>,
}

/// Runs every scenario of `SCENARIOS` with `template`'s rules and settings (its workload
/// is replaced by each scenario's own, drawn from its seed).
pub fn run(template: &SimOptions) -> Result<BenchReport> {
    run_scenarios(template, SCENARIOS)
}

/// [`run`] over these named scenarios only.
pub fn run_scenarios(template: &SimOptions, names: &[&str]) -> Result<BenchReport> {
    let max_concurrent_calls = template.max_concurrent_calls.unwrap_or_else(scaled_out_calls);
    let mut scenarios = Vec::new();
    for name in names {
        let workload = Scenario::named(name)?.workload(None, template.seed)?;
        let options = SimOptions { workload, max_concurrent_calls: Some(max_concurrent_calls), ..template.clone() };
        scenarios.push(super::run(&options).with_context(|| format!("scenario {name}"))?);
    }
    let goals = scenarios.iter().flat_map(goals).collect();
    Ok(BenchReport {
        wait_budget_ms: template.wait_budget.as_millis() as u64,
        backend: template.backend,
        handler_time: template.handler_time.to_string(),
        max_concurrent_calls,
        scenarios,
        goals,
    })
}

/// The bench's handler bound unless one is given: every call the default queue's tasks'
/// batches bring (`max_tasks × batch_size`, an app that scales out). The goals are the
/// listener's (how soon a get fetches a message), and the pickup latency counts the wait for
/// a free call: at the host's default of 32 calls of 20 ms, a burst of 5,000 waits 3 s for
/// the app whatever the listener does.
pub(crate) fn scaled_out_calls() -> u32 {
    let queue = crate::listener::QueueSettings::default();
    queue.max_tasks.saturating_mul(queue.batch_size).clamp(1, crate::config::MAX_CONCURRENT_CALLS)
}

/// The goals one scenario's run lets us check.
fn goals(report: &SimReport) -> Vec<Goal> {
    let rule = |name: &str| report.rules.iter().find(|r| r.rule == name);
    let targets = Targets::of(report.backend);
    let informative = targets.goal_scenarios.is_some_and(|names| !names.contains(&report.scenario.as_str()));
    let goal = |rule: &RuleReport, goal: String, measured: String, met: bool| Goal {
        scenario: report.scenario.clone(),
        rule: rule.rule.clone(),
        goal,
        measured,
        met,
        informative,
    };
    let p99 = |r: &RuleReport| r.pickup_p99_ms.map_or("-".to_string(), |ms| format!("{ms} ms"));
    let idle_goal = targets.idle_pull_per_hour;
    let mut goals = Vec::new();
    if report.messages == 0 {
        let hours = report.duration_secs / 3600.0;
        if let Some(push) = rule("paper-push") {
            let beyond = push.idle_transactions.saturating_sub(push.safety_polls) as f64 / hours;
            goals.push(goal(
                push,
                format!("idle: ≤ {IDLE_PUSH_PER_HOUR_GOAL} transaction/h beyond the safety polls"),
                format!("{beyond:.2}/h beyond {} safety polls", push.safety_polls),
                beyond <= IDLE_PUSH_PER_HOUR_GOAL,
            ));
        }
        if let Some(pull) = rule("paper") {
            // After the first hour: the back-off's fast polls at start-up are not the idle rate.
            let (first, last) = (pull.samples.iter().find(|s| s.t_secs >= 3600.0), pull.samples.last());
            let per_hour = match (first, last) {
                (Some(first), Some(last)) if last.t_secs > first.t_secs => {
                    (last.transactions - first.transactions) as f64 / ((last.t_secs - first.t_secs) / 3600.0)
                }
                _ => pull.idle_transactions as f64 / hours,
            };
            goals.push(goal(
                pull,
                format!("idle: ≤ {idle_goal} transactions/h (after the first hour)"),
                format!("{per_hour:.1}/h ({} in all)", pull.idle_transactions),
                per_hour <= idle_goal,
            ));
        }
        return goals;
    }
    let p99_goal_ms = PUSH_P99_GOAL.as_millis().min(u128::from(report.wait_budget_ms)) as u64;
    if let Some(push) = rule("paper-push") {
        let ratio = push.ratio_to_floor.unwrap_or(f64::INFINITY);
        let p99_ms = push.pickup_p99_ms.unwrap_or(u64::MAX);
        goals.push(goal(
            push,
            format!("≤ {PUSH_RATIO_GOAL} × floor and pickup p99 ≤ {p99_goal_ms} ms"),
            format!("{ratio:.2} × floor, p99 {}", p99(push)),
            ratio <= PUSH_RATIO_GOAL && p99_ms <= p99_goal_ms,
        ));
    }
    if let (Some(pull), Some(baseline)) = (rule("paper"), rule(targets.baseline)) {
        let (calls, p99_ms) = (pull.consumer_calls, pull.pickup_p99_ms.unwrap_or(u64::MAX));
        let their_calls = baseline.consumer_calls;
        let (p99_words, p99_goal_ms) = match targets.pull_p99 {
            Some(most) => (format!("p99 ≤ {}", humantime::format_duration(most)), most.as_millis() as u64),
            None => (format!("p99 ({})", p99(baseline)), baseline.pickup_p99_ms.unwrap_or(u64::MAX)),
        };
        goals.push(goal(
            pull,
            format!("≤ {}'s consumer calls ({their_calls}) and {p99_words}, both at once", targets.baseline),
            format!("{calls} consumer calls, p99 {}", p99(pull)),
            calls <= their_calls && p99_ms <= p99_goal_ms,
        ));
    }
    goals
}

/// The benchmark as text: a line per scenario and rule, then the goals.
pub fn table(report: &BenchReport) -> String {
    let budget = humantime::format_duration(Duration::from_millis(report.wait_budget_ms));
    let mut out = format!("floor on {}: {} that fetch each message within W = {budget}\n", report.backend.name(), report.backend.floor_words());
    out.push_str(&format!(
        "app: handler time {}, at most {} calls at once (the goals are the listener's, not the app's pool)\n",
        report.handler_time, report.max_concurrent_calls
    ));
    let mut rows = vec![["scenario", "messages", "rule", "consumer calls", "per message", "× floor", "p50 ms", "p99 ms", "max ms"].map(String::from).to_vec()];
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    let ms = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    for scenario in &report.scenarios {
        for rule in &scenario.rules {
            rows.push(vec![
                scenario.scenario.clone(),
                scenario.messages.to_string(),
                rule.rule.clone(),
                rule.consumer_calls.to_string(),
                show(rule.calls_per_message),
                show(rule.ratio_to_floor),
                ms(rule.pickup_p50_ms),
                ms(rule.pickup_p99_ms),
                ms(rule.pickup_max_ms),
            ]);
        }
        let per_message = (scenario.messages > 0).then(|| scenario.floor_calls as f64 / scenario.messages as f64);
        rows.push(vec![
            scenario.scenario.clone(),
            scenario.messages.to_string(),
            "floor".into(),
            scenario.floor_calls.to_string(),
            show(per_message),
            if scenario.floor_calls > 0 { "1.00".into() } else { "-".into() },
            "-".into(),
            format!("≤ {}", report.wait_budget_ms),
            format!("≤ {}", report.wait_budget_ms),
        ]);
    }
    out.push_str(&columns(&rows));
    if !report.goals.is_empty() {
        out.push_str(if report.backend.is_sqs() { "\ngoals (issue 37):\n" } else { "\ngoals (issue 19):\n" });
        let mut rows = vec![["scenario", "rule", "goal", "measured", "met"].map(String::from).to_vec()];
        for goal in &report.goals {
            let met = match (goal.informative, goal.met) {
                (false, true) => "yes",
                (false, false) => "NO",
                (true, true) => "(yes)",
                (true, false) => "(no)",
            };
            rows.push(vec![goal.scenario.clone(), goal.rule.clone(), goal.goal.clone(), goal.measured.clone(), met.into()]);
        }
        out.push_str(&columns(&rows));
        if report.goals.iter().any(|goal| goal.informative) {
            out.push_str("(yes), (no): a scenario the issue sets no goal for, for information\n");
        }
    }
    out
}

/// Rows as columns two spaces apart, each as wide as its widest cell.
fn columns(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows[0].len()).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, width)| format!("{cell}{}", " ".repeat(width - cell.chars().count()))).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::simulate::{RuleChoice, Scenario, SimBackend, SimOptions};

    #[test]
    fn the_bench_checks_the_goals_it_states_on_each_scenario() {
        let rules = ["functions", "paper", "paper-push"].iter().map(|r| RuleChoice::parse(r).unwrap()).collect();
        let template = SimOptions::new(Scenario::Idle.workload(Some(Duration::from_secs(1)), 1).unwrap(), rules);
        let report = run_scenarios(&template, &["burst", "trickle"]).unwrap();
        assert_eq!(report.scenarios.iter().map(|s| s.scenario.as_str()).collect::<Vec<_>>(), ["burst", "trickle"]);
        assert_eq!(report.goals.len(), 4, "{:?}", report.goals);
        for goal in &report.goals {
            let scenario = report.scenarios.iter().find(|s| s.scenario == goal.scenario).unwrap();
            let rule = |name: &str| scenario.rules.iter().find(|r| r.rule == name).unwrap();
            let expected = match goal.rule.as_str() {
                "paper-push" => rule("paper-push").ratio_to_floor.unwrap() <= 1.25 && rule("paper-push").pickup_p99_ms.unwrap() <= 1000,
                "paper" => {
                    rule("paper").consumer_calls <= rule("functions").consumer_calls
                        && rule("paper").pickup_p99_ms.unwrap() <= rule("functions").pickup_p99_ms.unwrap()
                }
                other => panic!("a goal for {other}"),
            };
            assert_eq!(goal.met, expected, "{goal:?}");
        }
        let text = table(&report);
        assert!(text.contains("goals (issue 19)") && text.lines().filter(|l| l.split_whitespace().nth(2) == Some("floor")).count() == 2, "{text}");
        // The goals are the listener's: its app takes every call the batches bring (32 tasks ×
        // 32), else a pool of 32 calls of 20 ms holds a burst of 5,000 for 3 s whatever the
        // listener does (push p99 4.3 s on burst when the bench took the host's default).
        assert_eq!(report.max_concurrent_calls, 1024);
        assert!(text.contains("app: handler time exp:20ms, at most 1024 calls at once"), "{text}");
        assert!(report.goals.iter().all(|goal| goal.met), "the shipped defaults meet every goal: {text}");
    }

    /// Issue 37's goals between idle and load, priced for SQS: pull at most Lambda's event
    /// source mapping's requests with p99 ≤ 20 s; push ≤ 1.25 × SQS's floor with p99 ≤ 1 s
    /// (bursty-day's two dumps of 20,000 included). All met.
    #[test]
    fn the_sqs_bench_checks_issue_37s_goals_against_lambdas_model() {
        let rules = ["lambda-esm", "paper", "paper-push"].iter().map(|r| RuleChoice::parse(r).unwrap()).collect();
        let template = SimOptions {
            backend: SimBackend::Sqs,
            price_per_10k: SimBackend::Sqs.default_price_per_10k(),
            ..SimOptions::new(Scenario::Idle.workload(Some(Duration::from_secs(1)), 1).unwrap(), rules)
        };
        let report = run_scenarios(&template, &["paper-billing", "bursty-day"]).unwrap();
        let text = table(&report);
        assert!(
            text.contains("floor on sqs: a delete batch per 10 messages + the fewest receives of at most 10") && text.contains("goals (issue 37)"),
            "{text}"
        );
        assert_eq!(report.goals.len(), 4, "{text}");
        for goal in &report.goals {
            let scenario = report.scenarios.iter().find(|s| s.scenario == goal.scenario).unwrap();
            let rule = |name: &str| scenario.rules.iter().find(|r| r.rule == name).unwrap();
            let expected = match goal.rule.as_str() {
                "paper-push" => rule("paper-push").ratio_to_floor.unwrap() <= 1.25 && rule("paper-push").pickup_p99_ms.unwrap() <= 1000,
                "paper" => rule("paper").consumer_calls <= rule("lambda-esm").consumer_calls && rule("paper").pickup_p99_ms.unwrap() <= 20_000,
                other => panic!("a goal for {other}"),
            };
            assert_eq!(goal.met, expected, "{goal:?}");
            assert!(goal.met && !goal.informative, "issue 37's goals on its scenarios: {text}");
        }
    }

    /// Issue 37 sets goals on paper-billing, bursty-day and idle only: burst's and trickle's
    /// rows are information, never a "NO" for a goal nobody set (on Azure, issue 19 sets
    /// goals on every scenario).
    #[test]
    fn on_sqs_the_scenarios_issue_37_sets_no_goal_for_are_shown_for_information() {
        let rules = ["lambda-esm", "paper", "paper-push"].iter().map(|r| RuleChoice::parse(r).unwrap()).collect();
        let template = SimOptions {
            backend: SimBackend::Sqs,
            price_per_10k: SimBackend::Sqs.default_price_per_10k(),
            ..SimOptions::new(Scenario::Idle.workload(Some(Duration::from_secs(1)), 1).unwrap(), rules)
        };
        let report = run_scenarios(&template, &["burst", "trickle"]).unwrap();
        let text = table(&report);
        assert!(report.goals.len() == 4 && report.goals.iter().all(|goal| goal.informative), "{text}");
        let rows: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("goals")).skip(2).take(4).collect();
        assert!(rows.iter().all(|row| row.ends_with("(yes)") || row.ends_with("(no)")), "{text}");
        assert!(!text.contains(" NO") && text.contains("(yes), (no): a scenario the issue sets no goal for"), "{text}");
    }
}
