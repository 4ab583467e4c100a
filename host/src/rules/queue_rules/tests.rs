//! A panic on the host side of a rule call, raised by the call this module can hand to
//! [`QueueRules::decide`]: contained as a fault, never a crash.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::*;
use crate::rules::{QueueRuleConfig, RuleLimits, RuleSet};

/// The paper's rule as a component: the one `ebb demo` carries in the binary.
fn paper_rule() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src/demo/rules/paper_default.wasm"))
}

fn state(depth: u64) -> QueueState {
    QueueState { queue: "orders".into(), approximate_depth: depth, min_tasks: 1, max_tasks: 100, active_tasks: 1, ..Default::default() }
}

/// A panic on the host side of a rule call is contained: a fault, the built-in decides, and
/// the instance is rebuilt so the rule decides again.
#[test]
fn a_host_panic_while_calling_a_rule_is_a_fault_not_a_crash() -> Result<()> {
    let engine = RuleEngine::new(RuleLimits::default(), None)?;
    let rules = RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::new("orders")?, rule: Some(paper_rule()), params: vec![] }]);
    let errors = rules.load_all();
    assert!(errors.is_empty(), "the paper's rule loads: {errors:?}");
    let handle = rules.queue("orders").expect("configured");
    let built_in = paper::optimal_dequeue_task_count(&state(500));
    let decided = handle.decide(Export::OptimalDequeueTaskCount, &(), |_| -> Result<u32> { panic!("a bug on the host side") }, || built_in);
    assert_eq!(decided, (built_in, DecisionSource::Fallback));
    let status = handle.status();
    assert_eq!(status.faults, 1);
    assert!(status.last_error.unwrap().contains("host panicked"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while handle.decide_task_count(&state(5)).source != DecisionSource::Rule {
        assert!(Instant::now() < deadline, "timed out waiting for the rebuild");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(handle.decide_task_count(&state(5)).value, paper::optimal_dequeue_task_count(&state(5)));
    Ok(())
}
