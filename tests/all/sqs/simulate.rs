//! Issue 37's goals that the simulator gives (`ebb simulate --backend sqs`): requests per
//! message at load on SQS and on Azure, the idle cost of long polling and of push with the
//! pickup after idle hours, and the push default's requests and pickup p99 between
//! (paper-billing, bursty-day). `simulate::bench` states them all, on SQS in its
//! `the_sqs_bench_checks_issue_37s_goals` test.

use std::time::Duration;

use ebb::simulate::{self, Arrival, RuleChoice, Scenario, SimBackend, SimOptions, Workload};

fn rules(names: &[&str]) -> Vec<RuleChoice> {
    names.iter().map(|name| RuleChoice::parse(name).unwrap()).collect()
}

/// `workload` on `backend` for `rules`, with an app that takes every call the batches bring
/// (as the bench's): the figures are the listener's.
fn run(backend: SimBackend, workload: Workload, names: &[&str]) -> simulate::SimReport {
    let options =
        SimOptions { backend, price_per_10k: backend.default_price_per_10k(), max_concurrent_calls: Some(1024), ..SimOptions::new(workload, rules(names)) };
    simulate::run(&options).unwrap()
}

/// Consumer requests from `from` to `to` simulated seconds, from the run's samples.
fn calls_between(report: &simulate::RuleReport, from: f64, to: f64) -> u64 {
    let at = |t: f64| report.samples.iter().find(|s| s.t_secs >= t).map_or(0, |s| s.consumer_calls);
    at(to) - at(from)
}

#[test]
fn at_load_sqs_bills_at_most_0_22_requests_per_message_and_azure_at_most_1_035() {
    // A backlog of 20,000 drained, and the minute after it.
    let workload = Workload { name: "backlog".into(), arrivals: vec![Arrival { at: Duration::ZERO, count: 20_000 }], duration: Duration::from_secs(60) };
    let sqs = run(SimBackend::Sqs, workload.clone(), &["paper", "paper-push"]);
    for rule in &sqs.rules {
        let per_message = rule.calls_per_message.unwrap();
        assert_eq!(rule.handled, 20_000, "{}", rule.rule);
        assert!(per_message <= 0.22, "{} on SQS: {per_message:.3} requests per message ({:?})", rule.rule, rule.transactions);
    }
    assert_eq!(sqs.floor_calls, 2_000 + 2_000, "receives of 10, delete batches of 10: 0.2 a message");
    let azure = run(SimBackend::Azure, workload, &["paper", "paper-push"]);
    for rule in &azure.rules {
        let per_message = rule.calls_per_message.unwrap();
        assert!(per_message <= 1.035, "{} on Azure: {per_message:.4} transactions per message ({:?})", rule.rule, rule.transactions);
    }
}

#[test]
fn idle_on_sqs_long_polling_costs_at_most_180_requests_an_hour_and_push_at_most_one_and_both_pick_up_within_a_second() {
    // Two idle hours, then a message every 97 s for an hour: each finds the listener idle.
    let arrivals = (0..37).map(|k| Arrival { at: Duration::from_secs(7200 + 97 * k), count: 1 }).collect();
    let workload = Workload { name: "idle-then-singles".into(), arrivals, duration: Duration::from_secs(3 * 3600) };
    let report = run(SimBackend::Sqs, workload, &["paper", "paper-push", "lambda-esm"]);
    let rule = |name: &str| report.rules.iter().find(|r| r.rule == name).unwrap();
    // The second idle hour: what an idle hour costs once the back-off has settled.
    let (pull, push, lambda) =
        (calls_between(rule("paper"), 3600.0, 7200.0), calls_between(rule("paper-push"), 3600.0, 7200.0), calls_between(rule("lambda-esm"), 3600.0, 7200.0));
    assert!(pull <= 180, "pull with long polling: {pull} requests in an idle hour");
    assert!(push <= 1, "push: {push} requests in an idle hour");
    assert!((355..=365).contains(&lambda), "Lambda's two idle pollers long-poll 20 s each: {lambda} requests an hour");
    for name in ["paper", "paper-push"] {
        let p99 = rule(name).pickup_p99_ms.unwrap();
        assert!(p99 <= 1000, "{name}: pickup p99 {p99} ms after idle hours");
    }
}

#[test]
fn between_on_sqs_the_push_default_bills_at_most_1_25_times_the_floor_and_picks_up_within_a_second() {
    for name in ["paper-billing", "bursty-day"] {
        let workload = Scenario::named(name).unwrap().workload(None, 1).unwrap();
        let report = run(SimBackend::Sqs, workload, &["paper-push"]);
        let push = &report.rules[0];
        let ratio = push.ratio_to_floor.unwrap();
        assert!(ratio <= 1.25, "{name}: {ratio:.3} × the floor ({} requests, {:?})", report.floor_calls, push.transactions);
        // On bursty-day, two dumps of 20,000 (41 % of the day's messages): drained within a
        // second (4.2 s when the pickup waited its delay and tasks waited for their batches).
        let p99 = push.pickup_p99_ms.unwrap();
        assert!(p99 <= 1000, "{name}: pickup p99 {p99} ms");
    }
}
