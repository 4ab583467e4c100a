//! The knee benchmark's goals (issue 24), on the real listener in simulated time: an app
//! whose latency grows with the square of its calls past 16 at once. A fixed high
//! concurrency collapses; the adaptive example rule finds the knee by itself.

use std::time::Duration;

use ebb::simulate::knee;
use ebb::simulate::{RuleChoice, RuleFile};
use ebb_tests::guests;

#[test]
fn the_adaptive_rule_holds_throughput_near_the_best_fixed_concurrency_where_a_fixed_high_one_collapses() {
    let adaptive = RuleChoice::Wasm(RuleFile::from(guests::ADAPTIVE_CONCURRENCY));
    let report = knee::run(16, Duration::from_millis(50), &[8, 16, 24, 64, 256], Some(adaptive), 1).unwrap();
    println!("{}", knee::table(&report));
    assert!(report.highest_fixed_ratio < 0.2, "a fixed 256 calls at once collapses past the knee: {report:#?}");
    let throughput = report.throughput_ratio.unwrap();
    let latency = report.latency_ratio.unwrap();
    assert!(throughput >= knee::THROUGHPUT_GOAL, "adaptive throughput {throughput:.2} × the best fixed");
    assert!(latency <= knee::LATENCY_GOAL, "adaptive handler p99 {latency:.2} × the latency at the knee");
}
