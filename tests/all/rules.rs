//! The rules engine: hostile guests, limits, clamps, hot reload, and agreement with the paper.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use ebb::names::DecisionSite;
use ebb::rules::{
    ContractVersion, DecisionSource, DepthSource, Export, HandlerState, IdleContext, QueueRuleConfig, QueueState, RuleEngine, RuleLimits, RuleLoad, RuleSet,
};
use ebb_rules_sdk::paper;
use ebb_tests::guests;

pub(crate) const QUEUE: &str = "orders";

pub(crate) fn engine(limits: RuleLimits) -> Arc<RuleEngine> {
    RuleEngine::new(limits, None).expect("engine starts")
}

pub(crate) fn rules_for(engine: Arc<RuleEngine>, rule: Option<&Path>, params: &[(&str, &str)]) -> RuleSet {
    let params = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::new(QUEUE).unwrap(), rule: rule.map(Path::to_path_buf), params }])
}

/// A rule set whose one queue uses `guest`, loaded; panics if it does not load.
pub(crate) fn loaded(guest: &str, limits: RuleLimits) -> RuleSet {
    let rules = rules_for(engine(limits), Some(Path::new(guest)), &[]);
    let errors = rules.load_all();
    assert!(errors.is_empty(), "{guest} should load: {errors:?}");
    rules
}

pub(crate) fn state(depth: u64) -> QueueState {
    QueueState { queue: QUEUE.into(), approximate_depth: depth, min_tasks: 1, max_tasks: 100, active_tasks: 1, ..Default::default() }
}

/// A window of handler calls as the listener reports it: `limit` calls allowed of a
/// ceiling of 256, all taken and tasks waiting, `completed` ended in `latency_ms` on average.
pub(crate) fn handler_window(limit: u32, completed: u32, latency_ms: f64) -> HandlerState {
    HandlerState {
        queue: QUEUE.into(),
        current_limit: limit,
        max_limit: 256,
        in_flight: limit,
        peak_in_flight: limit,
        waiting_tasks: 3,
        window_ms: 250,
        completed,
        latency_mean_ms: latency_ms,
        latency_min_ms: latency_ms,
        latency_max_ms: latency_ms,
        ..Default::default()
    }
}

pub(crate) fn idle(idle_count: u32, random: u64) -> IdleContext {
    IdleContext { queue: QUEUE.into(), idle_count, active_tasks: 2, min_interval_ms: 100, max_interval_ms: 60_000, random, ..Default::default() }
}

fn load_error(guest: &str) -> String {
    let rules = rules_for(engine(RuleLimits::default()), Some(Path::new(guest)), &[]);
    let errors = rules.load_all();
    assert_eq!(errors.len(), 1, "{guest} must not load");
    let status = rules.status(QUEUE).unwrap();
    assert_eq!(status.file, None, "a rule that failed to load is not in use");
    format!("{:#}", errors[0])
}

/// Asserts that a faulting rule's decision came from the built-in rule and was counted.
fn assert_falls_back(rules: &RuleSet, reason: &str) {
    let started = Instant::now();
    let decision = rules.decide_task_count(QUEUE, &state(500));
    assert!(started.elapsed() < Duration::from_secs(2), "the fault was stopped promptly ({:?})", started.elapsed());
    assert_eq!(decision.source, DecisionSource::Fallback);
    assert_eq!(decision.value, paper::optimal_dequeue_task_count(&state(500)));
    let status = rules.status(QUEUE).unwrap();
    assert_eq!(status.faults, 1);
    let error = status.last_error.unwrap();
    assert!(error.contains(reason), "fault reason {error:?} should mention {reason:?}");
}

#[test]
fn infinite_loop_is_stopped_by_the_deadline() {
    let limits = RuleLimits { call_fuel: u64::MAX / 2, ..RuleLimits::default() };
    assert_falls_back(&loaded(guests::LOOP_FOREVER, limits), "deadline");
}

#[test]
fn infinite_loop_is_stopped_by_fuel() {
    let limits = RuleLimits { call_deadline: Duration::from_secs(30), call_fuel: 1_000_000, ..RuleLimits::default() };
    assert_falls_back(&loaded(guests::LOOP_FOREVER, limits), "fuel");
}

#[test]
fn memory_bomb_is_stopped_by_the_memory_cap() {
    let limits = RuleLimits { call_deadline: Duration::from_secs(5), ..RuleLimits::default() };
    assert_falls_back(&loaded(guests::MEMORY_BOMB, limits), "memory limit");
}

#[test]
fn deep_recursion_is_stopped_by_the_stack_limit() {
    let limits = RuleLimits { call_fuel: u64::MAX / 2, call_deadline: Duration::from_secs(5), ..RuleLimits::default() };
    assert_falls_back(&loaded(guests::DEEP_RECURSION, limits), "stack");
}

#[test]
fn a_quarantine_after_of_zero_never_quarantines() {
    let rules = loaded(guests::TRAP, RuleLimits { quarantine_after: 0, ..RuleLimits::default() });
    for _ in 0..3 {
        assert_eq!(rules.decide_task_count(QUEUE, &state(5)).source, DecisionSource::Fallback, "the rule is tried, and faults");
        wait_for("the rebuild", || !rules.status(QUEUE).unwrap().rebuilding);
    }
    let status = rules.status(QUEUE).unwrap();
    assert!(!status.quarantined, "quarantine_after = 0 means never");
    assert_eq!(status.faults, 3);
}

#[test]
fn trapping_rule_falls_back_and_is_quarantined_after_repeated_faults() {
    let limits = RuleLimits { quarantine_after: 3, ..RuleLimits::default() };
    let rules = loaded(guests::TRAP, limits);
    for _ in 0..3 {
        assert_eq!(rules.decide_task_count(QUEUE, &state(5)).source, DecisionSource::Fallback);
        // The instance is rebuilt off the decision path; let it finish before the next call.
        wait_for("the rebuild", || !rules.status(QUEUE).unwrap().rebuilding);
    }
    let status = rules.status(QUEUE).unwrap();
    assert!(status.quarantined);
    assert!(status.last_error.unwrap().contains("trapped"));
    // Quarantined: the built-in decides without calling the rule, so faults stop growing.
    let decision = rules.decide_task_count(QUEUE, &state(5));
    assert_eq!(decision.source, DecisionSource::BuiltIn);
    assert_eq!(rules.status(QUEUE).unwrap().faults, 3);
}

/// What `f` logs at `level` and above, as text.
fn captured_log(level: tracing::Level, f: impl FnOnce()) -> String {
    let log = ebb_tests::LogCapture::default();
    {
        let _guard = log.start(level);
        f();
    }
    log.text()
}

#[test]
fn rule_output_goes_to_the_info_log_with_the_queue_and_rule_name() {
    let rules = loaded(guests::TRAP, RuleLimits::default());
    let text = captured_log(tracing::Level::INFO, || {
        rules.decide_task_count(QUEUE, &state(42));
    });
    let line = text.lines().find(|l| l.contains("rule output: about to fail at depth 42")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("INFO") && line.contains("rule=\"trap.wasm\"") && line.contains("queue=\"orders\""), "{line}");
}

#[test]
fn absurd_values_are_clamped_and_counted() {
    let rules = loaded(guests::ABSURD_VALUES, RuleLimits::default());
    let count = rules.decide_task_count(QUEUE, &state(5));
    assert_eq!((count.value, count.source, count.clamped), (100, DecisionSource::Rule, true));
    let empty = rules.decide_queue_empty(QUEUE, &idle(1, 0));
    assert_eq!((empty.value.delay_ms, empty.source, empty.clamped), (60_000, DecisionSource::Rule, true));
    let calls = rules.decide_concurrency(QUEUE, &handler_window(8, 40, 50.0)).expect("a 0.3.0 rule decides concurrency");
    assert_eq!((calls.value, calls.source, calls.clamped), (256, DecisionSource::Rule, true), "u32::MAX calls, bounded by max_limit");
    let status = rules.status(QUEUE).unwrap();
    assert_eq!((status.clamps, status.faults, status.decisions), (3, 0, 3));
}

#[test]
fn wrong_export_type_is_rejected_at_load() {
    let error = load_error(guests::WRONG_EXPORT_TYPE);
    assert!(error.contains("its function optimal-dequeue-task-count does not have the type of contract 0.1.0"), "{error}");
    assert!(error.contains("expected `u32` found `string`"), "{error}");
}

#[test]
fn missing_export_is_rejected_at_load() {
    let error = load_error(guests::MISSING_EXPORT);
    assert!(error.contains("on-queue-empty"), "{error}");
}

#[test]
fn contract_version_mismatch_names_its_version_and_the_hosts() {
    let error = load_error(guests::FUTURE_VERSION);
    assert!(
        error.contains(
            "it exports ebb:rules/decisions@0.9.0, but this host speaks ebb:rules/decisions@0.4.0 or ebb:rules/decisions@0.3.0 or ebb:rules/decisions@0.2.0 or ebb:rules/decisions@0.1.0"
        ),
        "{error}"
    );
}

/// A 0.2.0 state with every field 0.2.0 added set away from its default.
fn state_with_0_2_fields(depth: u64) -> QueueState {
    QueueState {
        in_flight: 3,
        recent_failures: 2,
        throughput_per_sec: 12.5,
        random: 0x1234_5678_9abc_def0,
        last_get_messages: 7,
        batch_size: 16,
        arrivals_per_sec: 4.25,
        oldest_message_age_ms: Some(1500),
        depth_source: DepthSource::Inferred,
        ..state(depth)
    }
}

/// Contract 0.2.0: a rule built against 0.1.0 keeps loading, is reported as 0.1.0, is told
/// every 0.1.0 field as before (the fields 0.2.0 added are left out), and decides as it did.
#[test]
fn a_rule_built_against_contract_0_1_0_still_loads_and_decides_unchanged() -> Result<()> {
    let engine = engine(RuleLimits::default());
    let rule = engine.load_file(Path::new(guests::CONTRACT_0_1))?;
    assert_eq!(rule.contract, ContractVersion::V0_1);
    assert!(rule.exports.contains(&"ebb:rules/decisions@0.1.0".to_string()), "{:?}", rule.exports);
    let full = state_with_0_2_fields(5);
    for (field, expected) in [
        ("approximate_depth", 5),
        ("in_flight", 3),
        ("active_tasks", 1),
        ("min_tasks", 1),
        ("max_tasks", 100),
        ("recent_failures", 2),
        ("throughput_per_sec", 12_500),
        ("random", 0x9abc_def0),
    ] {
        let mut instance = engine.instantiate(&rule, &[("field".into(), field.into())])?;
        assert_eq!(instance.optimal_dequeue_task_count(&full)?, expected, "{field}");
    }

    // Its decisions, through a queue's rule set, are the paper's (what it computes) whatever
    // the 0.2.0 fields say.
    let rules = loaded(guests::CONTRACT_0_1, RuleLimits::default());
    for depth in [0, 99, 100, 999, 1000, 50_000] {
        let decision = rules.decide_task_count(QUEUE, &state_with_0_2_fields(depth));
        // (Clamped by the host into the state's 1..=100 tasks.)
        let paper = paper::optimal_dequeue_task_count(&state(depth)).clamp(1, 100);
        assert_eq!((decision.value, decision.source), (paper, DecisionSource::Rule), "depth {depth}");
    }
    for idle_count in [1, 3, 30] {
        for random in [0, u64::MAX] {
            let decision = rules.decide_queue_empty(QUEUE, &idle(idle_count, random));
            assert_eq!((decision.value, decision.source), (paper::on_queue_empty(&idle(idle_count, random)), DecisionSource::Rule));
        }
    }
    assert_keeps_the_configured_concurrency(&rules);
    Ok(())
}

/// A rule of a contract before 0.3.0 is not asked for the concurrency: its queue keeps its
/// configured bound, and nothing is called or counted.
fn assert_keeps_the_configured_concurrency(rules: &RuleSet) {
    let before = rules.status(QUEUE).unwrap();
    for window in [handler_window(32, 0, 0.0), handler_window(32, 160, 50.0), handler_window(4, 20, 5_000.0)] {
        assert_eq!(rules.decide_concurrency(QUEUE, &window), None);
    }
    let after = rules.status(QUEUE).unwrap();
    assert_eq!((after.decisions, after.faults, after.consecutive_faults.max_concurrent_calls), (before.decisions, 0, 0));
}

/// Contract 0.3.0: a rule built against 0.2.0 (as SDK rules were before) keeps loading, is
/// reported as 0.2.0, is told every 0.2.0 field, decides as it did, and decides no handler
/// concurrency.
#[test]
fn a_rule_built_against_contract_0_2_0_still_loads_and_decides_unchanged() -> Result<()> {
    let engine = engine(RuleLimits::default());
    let rule = engine.load_file(Path::new(guests::CONTRACT_0_2))?;
    assert_eq!(rule.contract, ContractVersion::V0_2);
    assert!(rule.exports.contains(&"ebb:rules/decisions@0.2.0".to_string()), "{:?}", rule.exports);
    let full = state_with_0_2_fields(5);
    for (field, state, expected) in [
        ("approximate_depth", &full, 5),
        ("last_get_messages", &full, 7),
        ("batch_size", &full, 16),
        ("arrivals_per_sec", &full, 4250),
        ("oldest_message_age_ms", &full, 1501),
        ("oldest_message_age_ms", &state(5), 0),
        ("depth_source", &full, 2),
    ] {
        let mut instance = engine.instantiate(&rule, &[("field".into(), field.into())])?;
        assert_eq!(instance.optimal_dequeue_task_count(state)?, expected, "{field} of {state:?}");
        assert_eq!(instance.max_concurrent_calls(&handler_window(8, 40, 50.0))?, None, "a 0.2.0 instance is never called for it");
    }

    let rules = loaded(guests::CONTRACT_0_2, RuleLimits::default());
    for depth in [0, 99, 100, 999, 1000, 50_000] {
        let decision = rules.decide_task_count(QUEUE, &state_with_0_2_fields(depth));
        let paper = paper::optimal_dequeue_task_count(&state(depth)).clamp(1, 100);
        assert_eq!((decision.value, decision.source), (paper, DecisionSource::Rule), "depth {depth}");
    }
    for idle_count in [1, 3, 30] {
        for random in [0, u64::MAX] {
            let decision = rules.decide_queue_empty(QUEUE, &idle(idle_count, random));
            assert_eq!((decision.value, decision.source), (paper::on_queue_empty(&idle(idle_count, random)), DecisionSource::Rule));
        }
    }
    assert_keeps_the_configured_concurrency(&rules);
    assert_eq!(rules.status(QUEUE).unwrap().contract, Some("0.2.0"));
    Ok(())
}

/// Contract 0.2.0: each field it added reaches a rule built with the SDK (0.4.0 now), as the
/// host set it.
#[test]
fn a_rule_built_with_the_sdk_is_told_every_field_contract_0_2_0_added() -> Result<()> {
    let engine = engine(RuleLimits::default());
    let rule = engine.load_file(Path::new(guests::ECHO_STATE))?;
    assert_eq!(rule.contract, ContractVersion::V0_4);
    let full = state_with_0_2_fields(5);
    let cases: [(&str, &QueueState, u32); 9] = [
        ("approximate_depth", &full, 5),
        ("in_flight", &full, 3),
        ("recent_failures", &full, 2),
        ("last_get_messages", &full, 7),
        ("batch_size", &full, 16),
        ("arrivals_per_sec", &full, 4250),
        ("oldest_message_age_ms", &full, 1501),
        ("oldest_message_age_ms", &state(5), 0),
        ("depth_source", &full, 2),
    ];
    for (field, state, expected) in cases {
        let mut instance = engine.instantiate(&rule, &[("field".into(), field.into())])?;
        assert_eq!(instance.optimal_dequeue_task_count(state)?, expected, "{field} of {state:?}");
    }
    let mut instance = engine.instantiate(&rule, &[("field".into(), "depth_source".into())])?;
    assert_eq!(instance.optimal_dequeue_task_count(&state(5))?, 1, "measured by default");
    Ok(())
}

/// Contract 0.3.0: every field of `handler-state` reaches a rule built with the SDK as the
/// host set it, and its answer comes back whole (none included).
#[test]
fn a_0_3_0_rule_is_told_every_field_of_the_handler_state() -> Result<()> {
    let engine = engine(RuleLimits::default());
    let rule = engine.load_file(Path::new(guests::ECHO_STATE))?;
    let state = HandlerState {
        queue: "orders-eu".into(),
        current_limit: 12,
        max_limit: 64,
        in_flight: 9,
        peak_in_flight: 11,
        waiting_tasks: 5,
        window_ms: 251,
        completed: 40,
        failed: 3,
        pushed_back: 2,
        latency_mean_ms: 52.25,
        latency_min_ms: 30.5,
        latency_max_ms: 99.125,
        timestamp_ms: (1 << 40) + 77,
        random: (1 << 40) + 0x1234,
    };
    for (field, expected) in [
        ("current_limit", 12),
        ("max_limit", 64),
        ("in_flight", 9),
        ("peak_in_flight", 11),
        ("waiting_tasks", 5),
        ("window_ms", 251),
        ("completed", 40),
        ("failed", 3),
        ("pushed_back", 2),
        ("latency_mean_ms", 52_250),
        ("latency_min_ms", 30_500),
        ("latency_max_ms", 99_125),
        ("timestamp_ms", 77),
        ("random", 0x1234),
        ("queue_len", 9),
    ] {
        let mut instance = engine.instantiate(&rule, &[("handler_field".into(), field.into())])?;
        assert_eq!(instance.max_concurrent_calls(&state)?, Some(expected), "{field}");
    }
    assert_eq!(engine.instantiate(&rule, &[])?.max_concurrent_calls(&state)?, None, "none, unless a field is named");
    Ok(())
}

/// Contract 0.3.0: a rule's concurrency decision is clamped to [1, max_limit] and counted
/// like the others; its none keeps the configured bound, still counted as a decision.
#[test]
fn a_concurrency_decision_is_clamped_into_one_to_max_limit_and_counted() {
    let rules = rules_for(engine(RuleLimits::default()), Some(Path::new(guests::ECHO_STATE)), &[("handler_field", "completed")]);
    assert!(rules.load_all().is_empty());
    let decide = |completed| rules.decide_concurrency(QUEUE, &handler_window(8, completed, 50.0)).map(|d| (d.value, d.source, d.clamped));
    assert_eq!(decide(40), Some((40, DecisionSource::Rule, false)));
    assert_eq!(decide(0), Some((1, DecisionSource::Rule, true)), "at least one call runs");
    assert_eq!(decide(1000), Some((256, DecisionSource::Rule, true)), "never more than max_limit");
    let status = rules.status(QUEUE).unwrap();
    assert_eq!((status.decisions, status.clamps, status.faults), (3, 2, 0));

    let none = loaded(guests::PAPER_DEFAULT, RuleLimits::default());
    assert_eq!(none.decide_concurrency(QUEUE, &handler_window(8, 40, 50.0)), None, "the SDK's default: the configured bound");
    assert_eq!(none.status(QUEUE).unwrap().decisions, 1, "asked, and counted");
    let built_in = rules_for(none.engine().clone(), None, &[]);
    assert_eq!(built_in.decide_concurrency(QUEUE, &handler_window(8, 40, 50.0)), None, "no rule: the configured bound");
}

/// Contract 0.3.0: a fault in max-concurrent-calls keeps the configured bound (not a decision
/// of the paper's rule, which has none), is counted as that export's, and quarantines the rule
/// like the faults of the other exports; `/status` names the export.
#[test]
fn a_fault_deciding_concurrency_keeps_the_configured_bound_and_quarantines_by_its_export() {
    let rules = loaded(guests::TRAPS_DECIDING_CONCURRENCY, RuleLimits { quarantine_after: 3, ..RuleLimits::default() });
    for round in 1..=3 {
        // The task count succeeds between the faults without ending their run.
        assert_eq!(rules.decide_task_count(QUEUE, &state(5)).value, 2, "round {round}");
        assert_eq!(rules.decide_concurrency(QUEUE, &handler_window(8, 40, 50.0)), None, "round {round}");
        let status = rules.status(QUEUE).unwrap();
        assert_eq!((status.faults, status.consecutive_faults.max_concurrent_calls), (round, round as u32));
        assert!(status.last_error.as_deref().is_some_and(|e| e.contains("max-concurrent-calls always fails")), "{:?}", status.last_error);
        wait_for("the rebuild", || !rules.status(QUEUE).unwrap().rebuilding);
    }
    let status = rules.status(QUEUE).unwrap();
    assert!(status.quarantined, "{status:?}");
    assert_eq!(status.quarantine.as_ref().and_then(|q| q.export), Some(Export::MaxConcurrentCalls));
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["quarantine"]["export"], "max-concurrent-calls", "{json}");
    assert_eq!(json["consecutive_faults"]["max_concurrent_calls"], 3, "{json}");
    // Quarantined: the built-in rule decides the tasks, the queue keeps its bound, no more faults.
    assert_eq!(rules.decide_task_count(QUEUE, &state(5)).source, DecisionSource::BuiltIn);
    assert_eq!(rules.decide_concurrency(QUEUE, &handler_window(8, 40, 50.0)), None);
    assert_eq!(rules.status(QUEUE).unwrap().faults, 3);
}

/// Contract 0.3.0: the concurrency decision runs under the same limits as the others.
#[test]
fn a_concurrency_decision_that_never_returns_is_stopped_by_fuel_and_keeps_the_bound() {
    let limits = RuleLimits { call_deadline: Duration::from_secs(30), call_fuel: 1_000_000, ..RuleLimits::default() };
    let rules = loaded(guests::LOOP_FOREVER, limits);
    let started = Instant::now();
    assert_eq!(rules.decide_concurrency(QUEUE, &handler_window(8, 40, 50.0)), None);
    assert!(started.elapsed() < Duration::from_secs(5), "stopped promptly ({:?})", started.elapsed());
    let status = rules.status(QUEUE).unwrap();
    assert_eq!((status.faults, status.consecutive_faults.max_concurrent_calls), (1, 1));
    assert!(status.last_error.unwrap().contains("fuel"));
}

/// The adaptive example through the host: a queue starting at its ceiling is taken to the
/// rule's `initial` and grows in slow start while latency stays flat; the instance remembers
/// between calls.
#[test]
fn the_adaptive_concurrency_example_decides_through_the_host_and_remembers_between_calls() {
    let rules = rules_for(engine(RuleLimits::default()), Some(Path::new(guests::ADAPTIVE_CONCURRENCY)), &[("initial", "2")]);
    assert!(rules.load_all().is_empty());
    let mut limit = 256;
    let mut limits = vec![];
    for _ in 0..5 {
        let decision = rules.decide_concurrency(QUEUE, &handler_window(limit, limit * 5, 50.0)).expect("it decides");
        assert_eq!(decision.source, DecisionSource::Rule);
        limit = decision.value;
        limits.push(limit);
    }
    assert_eq!(limits, [2, 4, 8, 16, 32]);
    // Latency four times the baseline at 32: cut back toward the knee.
    let cut = rules.decide_concurrency(QUEUE, &handler_window(32, 40, 200.0)).unwrap().value;
    assert!((15..=17).contains(&cut), "{cut}");
    assert_eq!(rules.status(QUEUE).unwrap().decisions, 6);
}

#[test]
fn rule_gets_no_files_sockets_env_or_args_and_cannot_exit_the_host() {
    // The probe's configure fails, naming the capability, if any attempt succeeds.
    let rules = loaded(guests::CAPABILITY_PROBE, RuleLimits::default());
    let decision = rules.decide_queue_empty(QUEUE, &idle(1, 0));
    assert_eq!(decision.source, DecisionSource::Fallback);
    assert!(rules.status(QUEUE).unwrap().last_error.unwrap().contains("called exit("));
}

/// An instance of the capability probe whose task count is what it reads from `source`.
fn probe_reading(engine: &RuleEngine, source: &str) -> Result<ebb::rules::RuleInstance> {
    let rule = engine.load_file(Path::new(guests::CAPABILITY_PROBE))?;
    engine.instantiate(&rule, &[("read".to_string(), source.to_string())])
}

/// Hole (issue 18): rules could read the host's clocks, so a rule's decisions depended on
/// when it ran, and a simulation could not replay them. Now both clocks stand still.
#[test]
fn the_clocks_a_rule_reads_stand_still() -> Result<()> {
    let engine = engine(RuleLimits::default());
    for clock in ["wall-clock", "monotonic-clock"] {
        let mut instance = probe_reading(&engine, clock)?;
        let first = instance.optimal_dequeue_task_count(&state(5))?;
        std::thread::sleep(Duration::from_millis(20));
        let second = instance.optimal_dequeue_task_count(&state(5))?;
        assert_eq!(first, second, "the {clock} moved between two calls 20 ms apart");
        let other = probe_reading(&engine, clock)?.optimal_dequeue_task_count(&state(5))?;
        assert_eq!(first, other, "another instance reads another {clock}");
    }
    Ok(())
}

/// Hole (issue 18): rules could read the host's random source, so two runs of a simulation
/// with the same seed differed. Now every instance reads the same bytes (the randomness a
/// rule should use comes in each call's `random`).
#[test]
fn every_rule_instance_reads_the_same_random_bytes() -> Result<()> {
    let engine = engine(RuleLimits::default());
    for source in ["random", "hash-seed"] {
        let mut one = probe_reading(&engine, source)?;
        let mut two = probe_reading(&engine, source)?;
        let (a, b) = (one.optimal_dequeue_task_count(&state(5))?, two.optimal_dequeue_task_count(&state(5))?);
        assert_eq!(a, b, "two instances read different {source} values");
    }
    Ok(())
}

#[test]
fn non_wasm_truncated_and_oversized_files_are_rejected_with_the_reason() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let bytes = std::fs::read(guests::PAPER_DEFAULT)?;
    let cases: [(&str, Vec<u8>, &str); 3] = [
        ("text.wasm", b"not wasm at all".to_vec(), "not a WebAssembly file"),
        ("truncated.wasm", bytes[..bytes.len() / 2].to_vec(), "not a valid component"),
        ("empty.wasm", Vec::new(), "not a WebAssembly file"),
    ];
    for (name, content, reason) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, content)?;
        let error = format!("{:#}", engine(RuleLimits::default()).load_file(&path).err().expect("must fail"));
        assert!(error.contains(name) && error.contains(reason), "{name}: {error}");
    }
    let small = RuleLimits { max_file_bytes: 1000, ..RuleLimits::default() };
    let error = format!("{:#}", engine(small).load_file(Path::new(guests::PAPER_DEFAULT)).err().expect("must fail"));
    assert!(error.contains("over the limit of 1000 bytes"), "{error}");
    Ok(())
}

#[test]
fn rejected_parameters_keep_the_queue_on_the_built_in_rule() {
    let rules = rules_for(engine(RuleLimits::default()), Some(Path::new(guests::THRESHOLD_TABLE)), &[("table", "10:1")]);
    let errors = rules.load_all();
    let error = format!("{:#}", errors[0]);
    assert!(error.contains("cannot serve queue orders") && error.contains("parameter \"table\""), "{error}");
    assert_eq!(rules.decide_task_count(QUEUE, &state(5)).source, DecisionSource::BuiltIn);
}

#[test]
fn parameters_reach_the_rule() {
    let rules = rules_for(engine(RuleLimits::default()), Some(Path::new(guests::THRESHOLD_TABLE)), &[("table", "10:2, *:42")]);
    assert!(rules.load_all().is_empty());
    assert_eq!(rules.decide_task_count(QUEUE, &state(5)).value, 2);
    assert_eq!(rules.decide_task_count(QUEUE, &state(5000)).value, 42);
}

#[test]
fn built_in_and_paper_default_wasm_rule_agree() {
    let rules = loaded(guests::PAPER_DEFAULT, RuleLimits::default());
    let built_in = rules_for(rules.engine().clone(), None, &[]);
    for depth in [0, 1, 50, 99, 100, 101, 500, 999, 1000, 1001, 10_000, u64::MAX] {
        let wasm = rules.decide_task_count(QUEUE, &state(depth));
        let native = built_in.decide_task_count(QUEUE, &state(depth));
        assert_eq!(wasm.source, DecisionSource::Rule);
        assert_eq!(native.source, DecisionSource::BuiltIn);
        assert_eq!(wasm.value, native.value, "depth {depth}");
    }
    for idle_count in 0..=20 {
        for random in [0, 1 << 20, 1 << 62, 1 << 63, u64::MAX / 3, u64::MAX] {
            for active_tasks in [1, 2] {
                let ctx = IdleContext { active_tasks, ..idle(idle_count, random) };
                let wasm = rules.decide_queue_empty(QUEUE, &ctx);
                let native = built_in.decide_queue_empty(QUEUE, &ctx);
                assert_eq!(wasm.value, native.value, "idle {idle_count}, random {random}, tasks {active_tasks}");
            }
        }
        // And the back-off range is the documented one: min × 1.75^(n − 1) × [0.8, 1.2],
        // within [min, max].
        let low = rules.decide_queue_empty(QUEUE, &idle(idle_count, 0)).value.delay_ms;
        let high = rules.decide_queue_empty(QUEUE, &idle(idle_count, u64::MAX)).value.delay_ms;
        let grown = 100.0 * 1.75f64.powi(idle_count.saturating_sub(1) as i32);
        assert_eq!(low, (grown * 0.8).round().clamp(100.0, 60_000.0) as u64, "idle {idle_count}");
        assert_eq!(high, (grown * 1.2).round().clamp(100.0, 60_000.0) as u64, "idle {idle_count}");
    }
}

// ---- hot reload ----

pub(crate) struct Watched {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) rules: Arc<RuleSet>,
    _watcher: ebb::rules::RuleWatcher,
}

impl Watched {
    pub(crate) fn rule_path(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap().join("rule.wasm")
    }

    /// Replaces the rule file the way a deploy should: write aside, then rename.
    pub(crate) fn deploy(&self, guest: &str) {
        let staging = self.dir.path().join("rule.wasm.partial");
        std::fs::copy(guest, &staging).unwrap();
        std::fs::rename(&staging, self.rule_path()).unwrap();
    }

    fn sha(&self) -> Option<String> {
        self.rules.status(QUEUE).unwrap().sha256
    }
}

fn watched(initial: &str) -> Watched {
    watched_with(initial, RuleLimits::default(), Duration::from_millis(20))
}

fn watched_with(initial: &str, limits: RuleLimits, debounce: Duration) -> Watched {
    watched_with_params(initial, limits, debounce, &[])
}

/// A rule set whose queue uses the file `rule.wasm` (a copy of `initial`) with `params`,
/// loaded and watched.
pub(crate) fn watched_with_params(initial: &str, limits: RuleLimits, debounce: Duration, params: &[(&str, &str)]) -> Watched {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().canonicalize().unwrap().join("rule.wasm");
    std::fs::copy(initial, &path).unwrap();
    let rules = Arc::new(rules_for(engine(limits), Some(&path), params));
    assert!(rules.load_all().is_empty(), "{initial} loads");
    let watcher = rules.watch(dir.path(), debounce).unwrap();
    Watched { dir, rules, _watcher: watcher }
}

pub(crate) fn sha_of(guest: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(std::fs::read(guest).unwrap()))
}

pub(crate) fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn swaps_under_concurrent_decisions_fail_no_decision() {
    // A generous deadline: this is about swaps, and on a loaded machine a 10 ms call can be
    // descheduled past its deadline (a fault, rightly, but not the one tested here).
    let limits = RuleLimits { call_deadline: Duration::from_secs(1), ..RuleLimits::default() };
    let w = watched_with(guests::PAPER_DEFAULT, limits, Duration::from_millis(20));
    let stop = Arc::new(AtomicBool::new(false));
    let not_from_rule = Arc::new(AtomicU64::new(0));
    let deciders: Vec<_> = (0..3)
        .map(|_| {
            let (rules, stop, not_from_rule) = (w.rules.clone(), stop.clone(), not_from_rule.clone());
            std::thread::spawn(move || {
                let mut made = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let decision = rules.decide_task_count(QUEUE, &state(5));
                    if decision.source != DecisionSource::Rule || ![7, 1].contains(&decision.value) {
                        not_from_rule.fetch_add(1, Ordering::Relaxed);
                    }
                    made += 1;
                }
                made
            })
        })
        .collect();
    for round in 0..10 {
        let (guest, tasks) = if round % 2 == 0 { (guests::FIXED_TASKS, 7) } else { (guests::PAPER_DEFAULT, 1) };
        w.deploy(guest);
        wait_for("the new rule to decide", || w.rules.decide_task_count(QUEUE, &state(5)).value == tasks);
        assert_eq!(w.sha(), Some(sha_of(guest)));
    }
    stop.store(true, Ordering::Relaxed);
    let made: u64 = deciders.into_iter().map(|d| d.join().unwrap()).sum();
    assert!(made > 100, "the deciders ran ({made} decisions)");
    assert_eq!(not_from_rule.load(Ordering::Relaxed), 0);
}

#[test]
fn half_written_file_is_ignored_then_picked_up_when_complete() {
    let w = watched(guests::PAPER_DEFAULT);
    let bytes = std::fs::read(guests::FIXED_TASKS).unwrap();
    std::fs::write(w.rule_path(), &bytes[..bytes.len() / 3]).unwrap();
    wait_for("the half-written file to be rejected", || w.rules.status(QUEUE).unwrap().last_error.is_some());
    assert_eq!(w.sha(), Some(sha_of(guests::PAPER_DEFAULT)), "the old rule stays");
    assert_eq!(w.rules.decide_task_count(QUEUE, &state(5)).source, DecisionSource::Rule);
    std::fs::write(w.rule_path(), &bytes).unwrap();
    wait_for("the complete file to be used", || w.sha() == Some(sha_of(guests::FIXED_TASKS)));
    assert_eq!(w.rules.decide_task_count(QUEUE, &state(5)).value, 7);
}

#[test]
fn broken_file_keeps_the_old_rule() {
    let w = watched(guests::FIXED_TASKS);
    w.deploy(guests::WRONG_EXPORT_TYPE);
    wait_for("the broken file to be rejected", || w.rules.status(QUEUE).unwrap().last_error.is_some());
    let decision = w.rules.decide_task_count(QUEUE, &state(5));
    assert_eq!((decision.value, decision.source), (7, DecisionSource::Rule));
}

#[test]
fn deleted_rule_puts_its_queue_on_the_built_in_rule() {
    let w = watched(guests::FIXED_TASKS);
    std::fs::remove_file(w.rule_path()).unwrap();
    wait_for("the queue to fall back to the built-in rule", || w.sha().is_none());
    let decision = w.rules.decide_task_count(QUEUE, &state(5));
    assert_eq!((decision.value, decision.source), (1, DecisionSource::BuiltIn));
    w.deploy(guests::FIXED_TASKS);
    wait_for("the restored rule to be used", || w.sha().is_some());
}

#[test]
fn a_new_file_lifts_quarantine() {
    let limits = RuleLimits { quarantine_after: 1, ..RuleLimits::default() };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().canonicalize().unwrap().join("rule.wasm");
    std::fs::copy(guests::TRAP, &path).unwrap();
    let rules = Arc::new(rules_for(engine(limits), Some(&path), &[]));
    assert!(rules.load_all().is_empty());
    let _watcher = rules.watch(dir.path(), Duration::from_millis(20)).unwrap();
    rules.decide_task_count(QUEUE, &state(5));
    assert!(rules.status(QUEUE).unwrap().quarantined);
    std::fs::copy(guests::FIXED_TASKS, &path).unwrap();
    wait_for("the new rule to replace the quarantined one", || rules.decide_task_count(QUEUE, &state(5)).value == 7);
    assert!(!rules.status(QUEUE).unwrap().quarantined);
}

// ---- hardening (issue 8, items 7–12) ----

/// Item 7: the watcher's own reads raised events, so an unchanged file was re-read and
/// re-applied every debounce window, forever.
#[test]
fn an_unchanged_rule_file_is_not_read_again() {
    let w = watched(guests::PAPER_DEFAULT);
    w.deploy(guests::FIXED_TASKS);
    wait_for("the new rule", || w.sha() == Some(sha_of(guests::FIXED_TASKS)));
    std::thread::sleep(Duration::from_millis(200)); // let the burst settle
    let (reads, swaps, loaded_at) = (w.rules.file_reads(), w.rules.swaps(), w.rules.status(QUEUE).unwrap().loaded_at);
    // 25 debounce windows with nothing changing in the folder.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(w.rules.file_reads(), reads, "no reads while nothing changes");
    assert_eq!(w.rules.swaps(), swaps);
    assert_eq!(w.rules.status(QUEUE).unwrap().loaded_at, loaded_at, "the rule was not re-applied");
}

/// Item 7: a rewrite with the same bytes is read once and changes nothing.
#[test]
fn rewriting_the_same_bytes_does_not_reapply_the_rule() {
    let w = watched(guests::FIXED_TASKS);
    let (swaps, loaded_at) = (w.rules.swaps(), w.rules.status(QUEUE).unwrap().loaded_at);
    let reads = w.rules.file_reads();
    w.deploy(guests::FIXED_TASKS);
    wait_for("the event to be handled", || w.rules.file_reads() > reads);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(w.rules.file_reads(), reads + 1, "one event burst, one read");
    assert_eq!(w.rules.swaps(), swaps);
    assert_eq!(w.rules.status(QUEUE).unwrap().loaded_at, loaded_at);
}

/// Item 7: a folder written every 20 ms never went quiet for the debounce, so no change
/// was ever applied. The wait is bounded by MAX_DEBOUNCE_DELAY, so it is applied while the
/// writes go on. (How soon is a figure for a benchmark, not a timed test: compiling the rule
/// takes seconds on a loaded machine.)
#[test]
fn a_folder_written_without_pause_is_still_applied() {
    // A quiet period as long as the bound: writes every 20 ms never leave one.
    let debounce = ebb::rules::MAX_DEBOUNCE_DELAY;
    let w = watched_with(guests::PAPER_DEFAULT, RuleLimits::default(), debounce);
    let staging = w.dir.path().join("rule.wasm.partial");
    let bytes = std::fs::read(guests::FIXED_TASKS).unwrap();
    let started = Instant::now();
    let mut last_write = Instant::now();
    let mut longest_gap = Duration::ZERO;
    while w.sha() != Some(sha_of(guests::FIXED_TASKS)) {
        assert!(started.elapsed() < Duration::from_secs(60), "never applied while the folder was busy");
        std::fs::write(&staging, &bytes).unwrap();
        std::fs::rename(&staging, w.rule_path()).unwrap();
        longest_gap = longest_gap.max(last_write.elapsed());
        last_write = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
    }
    // Otherwise the folder did go quiet, and the plain debounce could have applied it.
    assert!(longest_gap < debounce / 2, "the writes paused for {longest_gap:?}: inconclusive");
}

/// Item 8: every re-apply reset the quarantine (a trapping rule faulted 791 times in 20 s).
#[test]
fn quarantine_holds_until_the_file_content_changes() {
    let limits = RuleLimits { quarantine_after: 1, ..RuleLimits::default() };
    let w = watched_with(guests::TRAP, limits, Duration::from_millis(20));
    assert_eq!(w.rules.decide_task_count(QUEUE, &state(5)).source, DecisionSource::Fallback);
    assert!(w.rules.status(QUEUE).unwrap().quarantined);
    // Time passes, and the same bytes are written again: still quarantined.
    std::thread::sleep(Duration::from_millis(300));
    let reads = w.rules.file_reads();
    std::fs::copy(guests::TRAP, w.rule_path()).unwrap();
    wait_for("the rewrite to be seen", || w.rules.file_reads() > reads);
    std::thread::sleep(Duration::from_millis(100));
    for _ in 0..50 {
        assert_eq!(w.rules.decide_task_count(QUEUE, &state(5)).source, DecisionSource::BuiltIn);
    }
    let status = w.rules.status(QUEUE).unwrap();
    assert!(status.quarantined);
    assert_eq!(status.faults, 1);
    // New content lifts it.
    w.deploy(guests::FIXED_TASKS);
    wait_for("the new rule", || w.rules.decide_task_count(QUEUE, &state(5)).value == 7);
    assert!(!w.rules.status(QUEUE).unwrap().quarantined);
}

/// Item 9: a rule whose configure takes 1.5 s and whose calls trap was re-instantiated
/// inline after each fault, holding the slot: decisions fell to 2/s and status waited.
#[test]
fn a_slow_to_instantiate_faulty_rule_stalls_neither_decisions_nor_status() {
    let limits = RuleLimits { quarantine_after: 1000, ..RuleLimits::default() };
    let rules = Arc::new(rules_for(engine(limits), Some(Path::new(guests::SLOW_SETUP)), &[("setup_ms", "1500"), ("trap", "1")]));
    assert!(rules.load_all().is_empty());
    let stop = Arc::new(AtomicBool::new(false));
    let decider = {
        let (rules, stop) = (rules.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut made, mut slowest) = (0u64, Duration::ZERO);
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let decision = rules.decide_task_count(QUEUE, &state(500));
                slowest = slowest.max(started.elapsed());
                assert_eq!(decision.value, paper::optimal_dequeue_task_count(&state(500)));
                made += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            (made, slowest)
        })
    };
    let mut slowest_status = Duration::ZERO;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        let asked = Instant::now();
        let _ = rules.status(QUEUE).unwrap();
        slowest_status = slowest_status.max(asked.elapsed());
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let (made, slowest) = decider.join().unwrap();
    assert!(slowest < Duration::from_millis(300), "slowest decision {slowest:?}");
    assert!(slowest_status < Duration::from_millis(300), "slowest status {slowest_status:?}");
    assert!(made > 100, "{made} decisions in 4 s");
    // Each rebuild takes 1.5 s, so only a few faults could happen: one per rebuilt instance.
    let faults = rules.status(QUEUE).unwrap().faults;
    assert!((1..=4).contains(&faults), "{faults} faults");
}

fn cache_files(dir: &Path) -> Vec<(String, u64)> {
    std::fs::read_dir(dir).unwrap().flatten().map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap().len())).collect()
}

/// Item 10: every version ever loaded stayed compiled in memory and on disk.
#[test]
fn old_rule_versions_are_evicted_from_memory_and_disk() -> Result<()> {
    let cache = tempfile::tempdir()?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("rule.wasm");
    let engine = RuleEngine::new(RuleLimits::default(), Some(cache.path().into()))?;
    let rules = rules_for(engine.clone(), Some(&path), &[]);
    let bytes = std::fs::read(guests::FIXED_TASKS)?;
    for version in 0..8 {
        std::fs::write(&path, ebb_tests::version_of(&bytes, version))?;
        rules.apply_file(&path)?;
        assert_eq!(rules.decide_task_count(QUEUE, &state(5)).value, 7);
    }
    assert!(engine.compiled_in_memory() <= 2, "in use + one small one for a swap back, not {}", engine.compiled_in_memory());
    let files = cache_files(cache.path());
    assert!(files.len() <= 4, "in use + three recent: {files:?}");
    // The previous version comes back from memory, without compiling.
    std::fs::write(&path, ebb_tests::version_of(&bytes, 6))?;
    assert!(rules.apply_file(&path)?.unwrap().from_cache);
    Ok(())
}

/// Item 10: the disk cache stays within `cache_max_bytes`, except for the rule in use.
#[test]
fn the_disk_cache_is_bounded_in_bytes() -> Result<()> {
    let cache = tempfile::tempdir()?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("rule.wasm");
    let bytes = std::fs::read(guests::FIXED_TASKS)?;
    // Learn one artifact's size, then allow about two.
    RuleEngine::new(RuleLimits::default(), Some(cache.path().into()))?.load_bytes("probe.wasm", &ebb_tests::version_of(&bytes, 999))?;
    let artifact = cache_files(cache.path())[0].1;
    std::fs::remove_dir_all(cache.path())?;
    let limits = RuleLimits { cache_max_bytes: artifact * 2 + artifact / 2, ..RuleLimits::default() };
    let rules = rules_for(RuleEngine::new(limits, Some(cache.path().into()))?, Some(&path), &[]);
    for version in 0..6 {
        std::fs::write(&path, ebb_tests::version_of(&bytes, version))?;
        rules.apply_file(&path)?;
        let total: u64 = cache_files(cache.path()).iter().map(|f| f.1).sum();
        assert!(total <= artifact * 2 + artifact / 2, "cache holds {total} bytes after version {version}");
    }
    let current = rules.status(QUEUE).unwrap().sha256.unwrap();
    assert!(cache_files(cache.path()).iter().any(|(name, _)| name.starts_with(&current)), "the rule in use stays cached");
    Ok(())
}

/// Item 11: each queue held its own instance (1,000 queues on the Python rule: 4.9 GiB).
#[test]
fn queues_with_the_same_rule_and_parameters_share_one_instance() {
    let engine = engine(RuleLimits::default());
    let mut queues: Vec<QueueRuleConfig> = (0..50)
        .map(|i| QueueRuleConfig {
            slot: DecisionSite::new(&format!("queue-{i}")).unwrap(),
            rule: Some(guests::FIXED_TASKS.into()),
            params: vec![("tasks".into(), "9".into())],
        })
        .collect();
    queues.push(QueueRuleConfig { slot: DecisionSite::new("other").unwrap(), rule: Some(guests::FIXED_TASKS.into()), params: vec![] });
    let rules = RuleSet::new(engine, queues);
    assert!(rules.load_all().is_empty());
    let state_of = |queue: &str| QueueState { queue: queue.into(), ..state(5) };
    for i in 0..50 {
        assert_eq!(rules.decide_task_count(&format!("queue-{i}"), &state_of(&format!("queue-{i}"))).value, 9);
    }
    assert_eq!(rules.decide_task_count("other", &state_of("other")).value, 7);
    let shared = rules.status("queue-7").unwrap();
    assert_eq!(shared.shared_by, 50);
    assert!(shared.instance_memory_bytes > 0, "the status reports the instance's memory");
    assert_eq!(shared.decisions, 1, "counters stay per queue");
    assert_eq!(rules.status("other").unwrap().shared_by, 1);
}

/// The listener's typed handle: no name lookup that panics on an unknown queue.
#[test]
fn queue_handles_decide_and_unknown_queues_get_the_built_in_rule() {
    let rules = loaded(guests::FIXED_TASKS, RuleLimits::default());
    let handle = rules.queue(QUEUE).expect("configured");
    assert_eq!(handle.decide_task_count(&state(5)).value, 7);
    assert_eq!(handle.status().decisions, 1);
    assert!(rules.queue("nope").is_none());
    assert!(rules.status("nope").is_none());
    let decision = rules.decide_task_count("nope", &state(5));
    assert_eq!((decision.value, decision.source), (1, DecisionSource::BuiltIn));
}

/// Item 12: a 2 s setup deadline was reported as "ran past its deadline of 10ms".
#[test]
fn setup_faults_name_the_setup_limit() {
    let limits = RuleLimits { setup_deadline: Duration::from_millis(300), ..RuleLimits::default() };
    let rules = rules_for(engine(limits), Some(Path::new(guests::SLOW_SETUP)), &[("setup_ms", "60000")]);
    let errors = rules.load_all();
    let error = format!("{:#}", errors[0]);
    assert!(error.contains("setup (instantiation and configure) deadline of 300ms"), "{error}");
    assert!(!error.contains("10ms"), "{error}");
}

/// Item 12: a memory-limit fault printed seven lines of wasm backtrace before its cause.
#[test]
fn a_memory_limit_fault_gives_its_reason_first() {
    let limits = RuleLimits { call_deadline: Duration::from_secs(5), ..RuleLimits::default() };
    let rules = loaded(guests::MEMORY_BOMB, limits);
    rules.decide_task_count(QUEUE, &state(5));
    let error = rules.status(QUEUE).unwrap().last_error.unwrap();
    assert!(error.starts_with("memory limit"), "{error}");
    // One line of reason, then the hint's line: no backtrace.
    let (reason, hint) = error.split_once("\n  hint: ").unwrap_or_else(|| panic!("{error}"));
    assert!(!error.contains("backtrace") && !reason.contains('\n') && !hint.contains('\n'), "{error}");
    assert!(hint.contains("rule_limits.memory_mib"), "{error}");
}

/// Item 12: a rule's panic message was only at DEBUG; the WARN line said "unreachable".
#[test]
fn a_rules_panic_message_is_in_its_warn_line() {
    let rules = loaded(guests::TRAP, RuleLimits::default());
    let text = captured_log(tracing::Level::WARN, || {
        rules.decide_task_count(QUEUE, &state(42));
    });
    let line = text.lines().find(|l| l.contains("rule faulted")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("WARN") && line.contains("this rule always fails"), "{line}");
    // And a panic in configure is quoted in the load error.
    let rules = rules_for(engine(RuleLimits::default()), Some(Path::new(guests::SLOW_SETUP)), &[("panic_in_configure", "1")]);
    let error = format!("{:#}", rules.load_all()[0]);
    assert!(error.contains("configure exploded on purpose"), "{error}");
}

/// An unreadable rule file was reported as "does not exist".
#[test]
fn an_unreadable_rule_file_is_reported_with_its_reason() -> Result<()> {
    let dir = tempfile::tempdir()?;
    type Make = dyn Fn(&Path) -> std::io::Result<()>;
    let cases: [(&str, &Make, &str); 4] = [
        ("looping-link.wasm", &|p| std::os::unix::fs::symlink(p, p), "symbolic links"),
        ("a-directory.wasm", &|p| std::fs::create_dir(p), "is a directory"),
        ("dangling-link.wasm", &|p| std::os::unix::fs::symlink(p.with_extension("gone"), p), "which does not exist"),
        ("missing.wasm", &|_| Ok(()), "does not exist"),
    ];
    for (name, make, reason) in cases {
        let path = dir.path().join(name);
        make(&path)?;
        let rules = rules_for(engine(RuleLimits::default()), Some(&path), &[]);
        let error = format!("{:#}", rules.load_all().pop().expect("must fail"));
        assert!(error.contains(reason), "{name}: {error}");
        assert_eq!(rules.status(QUEUE).unwrap().last_error.as_deref(), Some(error.as_str()), "{name}");
    }
    Ok(())
}

/// Defect 1 (hostile review of the binary): a damaged compiled-rule cache file was
/// deserialised as is. Random bytes in its middle made `ebb run` segfault on every start;
/// one flipped byte went unnoticed and the corrupted machine code ran (`from_cache` true).
/// Now each cache file carries a sha256 that is checked before deserialising: a damaged
/// file is deleted with a WARN naming it, and the rule is recompiled (and cached again).
#[test]
fn a_damaged_cache_file_is_detected_deleted_and_recompiled() -> Result<()> {
    let cache = tempfile::tempdir()?;
    let bytes = std::fs::read(guests::FIXED_TASKS)?;
    let new_engine = || RuleEngine::new(RuleLimits::default(), Some(cache.path().into()));
    assert!(!new_engine()?.load_bytes("rule.wasm", &bytes)?.from_cache, "first load compiles");
    assert!(new_engine()?.load_bytes("rule.wasm", &bytes)?.from_cache, "an intact cache file is used");
    let files = cache_files(cache.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let file = cache.path().join(&files[0].0);
    // The single flipped byte first: on unchecked code it is the one that does not crash.
    type Damage = dyn Fn(&mut Vec<u8>);
    let damages: [(&str, &Damage); 3] = [
        ("one flipped byte", &|b| {
            let at = b.len() / 2;
            b[at] ^= 0x01;
        }),
        ("random bytes over n/4..n/2", &|b| {
            let mut rng = fastrand::Rng::with_seed(7);
            let n = b.len();
            b[n / 4..n / 2].iter_mut().for_each(|x| *x = rng.u8(..));
        }),
        ("truncated", &|b| b.truncate(b.len() / 3)),
    ];
    for (what, damage) in damages {
        let mut stored = std::fs::read(&file)?;
        damage(&mut stored);
        std::fs::write(&file, &stored)?;
        let engine = new_engine()?;
        let mut loaded = None;
        let log = captured_log(tracing::Level::WARN, || loaded = Some(engine.load_bytes("rule.wasm", &bytes)));
        let rule = loaded.unwrap()?;
        assert!(!rule.from_cache, "{what}: recompiled, not loaded from the damaged file");
        let warns: Vec<&str> = log.lines().filter(|l| l.contains("WARN")).collect();
        assert_eq!(warns.len(), 1, "{what}: one WARN: {log}");
        assert!(warns[0].contains(&file.display().to_string()) && warns[0].contains("recompiling"), "{what}: {log}");
        // The recompiled rule works, and the rewritten cache file is intact.
        let rules =
            RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::new(QUEUE).unwrap(), rule: Some(PathBuf::from(guests::FIXED_TASKS)), params: vec![] }]);
        assert!(rules.load_all().is_empty());
        assert_eq!(rules.decide_task_count(QUEUE, &state(5)), ebb::rules::Decision { value: 7, source: DecisionSource::Rule, clamped: false });
        assert!(new_engine()?.load_bytes("rule.wasm", &bytes)?.from_cache, "{what}: the cache file was written again");
    }
    Ok(())
}

/// Makes a FIFO at `path` (with the `mkfifo` tool: the tests do not link libc).
fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo").arg(path).status().expect("mkfifo runs");
    assert!(status.success(), "mkfifo {}", path.display());
}

/// Defect 2 (rules review): the size check trusted the metadata length, 0 for FIFOs and
/// devices. A FIFO named `rule.wasm` blocked the watcher thread forever in `open` (no later
/// file was ever applied), and a link to `/dev/zero` was read until memory ran out (15 GB).
/// Now anything that is not a regular file (after following links) is refused with the
/// reason, without blocking and without reading it, and the watcher carries on.
#[test]
fn fifos_and_links_to_devices_are_refused_and_the_watcher_keeps_working() {
    let w = watched(guests::PAPER_DEFAULT);
    let last_error = || w.rules.status(QUEUE).unwrap().last_error.unwrap_or_default();
    // FIFO first: on code that opens it blocking, this fails by timing out, not by eating memory.
    let staged = w.dir.path().join("staged");
    mkfifo(&staged);
    std::fs::rename(&staged, w.rule_path()).unwrap();
    wait_for("the FIFO to be refused", || last_error().contains("FIFO"));
    let error = last_error();
    assert!(error.contains(&w.rule_path().display().to_string()) && error.contains("not a regular file"), "{error}");
    assert_eq!(w.sha(), Some(sha_of(guests::PAPER_DEFAULT)), "the old rule stays");
    w.deploy(guests::FIXED_TASKS);
    wait_for("a valid file written after the FIFO to be applied", || w.sha() == Some(sha_of(guests::FIXED_TASKS)));

    std::os::unix::fs::symlink("/dev/zero", &staged).unwrap();
    std::fs::rename(&staged, w.rule_path()).unwrap();
    wait_for("the link to /dev/zero to be refused", || last_error().contains("character device"));
    let error = last_error();
    assert!(error.contains("symbolic link to /dev/zero") && error.contains("not a regular file"), "{error}");
    assert_eq!(w.rules.decide_task_count(QUEUE, &state(5)).value, 7, "the old rule stays");
    w.deploy(guests::PAPER_DEFAULT);
    wait_for("a valid file written after the link to be applied", || w.sha() == Some(sha_of(guests::PAPER_DEFAULT)));

    // And straight through a rule set's load, as `ebb check` and `ebb rule eval` do it.
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.wasm");
    mkfifo(&fifo);
    let zero = dir.path().join("zero.wasm");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    for (path, reason) in [(&fifo, "is a FIFO (named pipe), not a regular file"), (&zero, "which is a character device, not a regular file")] {
        let rules = rules_for(engine(RuleLimits::default()), Some(path), &[]);
        let error = format!("{:#}", rules.load_all().pop().expect("must fail"));
        assert!(error.contains(&path.display().to_string()) && error.contains(reason), "{error}");
    }
}

/// Defect 3 (rules review): every `*.wasm` dropped into the rules folder was read and
/// compiled, used or not; with 300 unused files there, a swap of the rule in use took
/// effect ~49 s later. Now files no queue uses are neither read nor compiled.
#[test]
fn files_no_queue_uses_are_neither_read_nor_compiled() {
    let w = watched(guests::PAPER_DEFAULT);
    let (reads, compilations) = (w.rules.file_reads(), w.rules.engine().compilations());
    let bytes = std::fs::read(guests::FIXED_TASKS).unwrap();
    for version in 0..40 {
        // Named to sort before rule.wasm: the order a burst's files are handled in.
        std::fs::write(w.dir.path().join(format!("copy-{version}.wasm")), ebb_tests::version_of(&bytes, version)).unwrap();
    }
    w.deploy(guests::FIXED_TASKS);
    wait_for("the rule in use to swap", || w.sha() == Some(sha_of(guests::FIXED_TASKS)));
    std::thread::sleep(Duration::from_millis(300)); // any straggling burst
    let read = w.rules.file_reads() - reads;
    assert!(read <= 2, "{read} file reads: only the rule in use is read (once, maybe twice if its events were split)");
    assert_eq!(w.rules.engine().compilations() - compilations, 1, "only the rule in use is compiled");
    assert_eq!(w.rules.decide_task_count(QUEUE, &state(5)).value, 7);
}

/// Defect 4 (rules review): with `quarantine_after = 4294967295`, a trapping rule polled
/// every millisecond logged ~270 "rule faulted" WARN lines a second. The line is now rate
/// limited per rule (10 a minute); the fault counters stay exact.
#[test]
fn a_rule_faulting_on_every_call_does_not_flood_the_log() {
    let rules = loaded(guests::TRAP, RuleLimits { quarantine_after: u32::MAX, ..RuleLimits::default() });
    let mut fallbacks = 0;
    let log = captured_log(tracing::Level::WARN, || {
        while fallbacks < 1000 {
            // Between faults the instance is rebuilt off the decision path (the built-in decides).
            if rules.decide_task_count(QUEUE, &state(5)).source == DecisionSource::Fallback {
                fallbacks += 1;
            }
            wait_for("the rebuild", || !rules.status(QUEUE).unwrap().rebuilding);
        }
    });
    let warns = log.lines().filter(|l| l.contains("WARN")).count();
    assert!(warns <= 11, "{warns} WARN lines for 1,000 faults:\n{}", log.lines().take(20).collect::<Vec<_>>().join("\n"));
    assert!(warns >= 1 && log.contains("rule faulted") && log.contains("reason="), "the first faults are still logged, with the reason: {log}");
    let status = rules.status(QUEUE).unwrap();
    assert_eq!(status.faults, 1000, "every fault is counted");
    assert!(!status.quarantined);
}

/// Defect 5 (rules review): `/status` showed `rule.loaded_at` as
/// `{"secs_since_epoch": …, "nanos_since_epoch": …}` while its other times are RFC 3339.
#[test]
fn a_rules_load_time_is_serialised_as_rfc_3339() {
    let rules = loaded(guests::FIXED_TASKS, RuleLimits::default());
    let status = rules.status(QUEUE).unwrap();
    let json = serde_json::to_value(&status).unwrap();
    let text = json["loaded_at"].as_str().unwrap_or_else(|| panic!("loaded_at is not a string: {json}"));
    let parsed = humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{text:?} is not RFC 3339: {e}"));
    let loaded_at = status.loaded_at.unwrap();
    let apart = parsed.duration_since(loaded_at).or_else(|_| loaded_at.duration_since(parsed)).unwrap();
    assert!(apart < Duration::from_secs(1), "{text} is the load time");
    // No rule in use: null, as before.
    let built_in = rules_for(rules.engine().clone(), None, &[]);
    assert_eq!(serde_json::to_value(built_in.status(QUEUE).unwrap()).unwrap()["loaded_at"], serde_json::Value::Null);
}

/// Second review: a FIFO or a link to /dev/zero in place of a compiled rule in the cache
/// hung the host at start or took gigabytes; the cache gets the rule files' refusal.
#[test]
fn a_cache_file_that_is_not_a_regular_file_is_refused_and_the_rule_recompiled() -> Result<()> {
    let cache = tempfile::tempdir()?;
    let bytes = std::fs::read(guests::FIXED_TASKS)?;
    let new_engine = || RuleEngine::new(RuleLimits::default(), Some(cache.path().into()));
    assert!(!new_engine()?.load_bytes("rule.wasm", &bytes)?.from_cache);
    let file = cache.path().join(&cache_files(cache.path())[0].0);
    for replace in ["fifo", "/dev/zero"] {
        std::fs::remove_file(&file)?;
        if replace == "fifo" {
            assert!(std::process::Command::new("mkfifo").arg(&file).status()?.success());
        } else {
            std::os::unix::fs::symlink(replace, &file)?;
        }
        let (done, finished) = std::sync::mpsc::channel();
        let engine = new_engine()?;
        let source = bytes.clone();
        let loader = std::thread::spawn(move || {
            let loaded = engine.load_bytes("rule.wasm", &source).map(|r| r.from_cache);
            let _ = done.send(());
            loaded
        });
        finished.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("{replace}: loading hung"));
        assert!(!loader.join().unwrap()?, "{replace}: recompiled, not read from the cache");
        let _ = std::fs::remove_file(&file);
        // Put an intact cache file back for the next case.
        assert!(!new_engine()?.load_bytes("rule.wasm", &bytes)?.from_cache);
    }
    Ok(())
}

/// Issue 25 (start fast whatever the rule): a host waited for every rule's compile before
/// anything answered. Now loading runs in the background: a queue decides with the built-in
/// rule meanwhile (source `compiling`, counted), then takes its rule as a hot swap does.
#[test]
fn while_its_rule_loads_a_queue_decides_with_the_built_in_rule_then_takes_it() {
    let rules = Arc::new(rules_for(engine(RuleLimits::default()), Some(Path::new(guests::SLOW_SETUP)), &[("setup_ms", "1000"), ("tasks", "9")]));
    let started = Instant::now();
    rules.load_all_in_background();
    assert!(started.elapsed() < Duration::from_millis(500), "loading blocked for {:?}", started.elapsed());
    assert_eq!(rules.load_state(QUEUE), Some(RuleLoad::Compiling));
    let decision = rules.decide_task_count(QUEUE, &state(500));
    assert_eq!((decision.value, decision.source), (paper::optimal_dequeue_task_count(&state(500)), DecisionSource::Compiling));
    let status = rules.status(QUEUE).unwrap();
    assert!(status.compiling && status.file.is_none(), "{status:?}");
    assert_eq!(status.decisions_while_compiling, 1);

    wait_for("the rule to load", || rules.load_state(QUEUE) == Some(RuleLoad::Loaded));
    assert_eq!(rules.decide_task_count(QUEUE, &state(500)).source, DecisionSource::Rule);
    assert_eq!(rules.decide_task_count(QUEUE, &state(500)).value, 9);
    let status = rules.status(QUEUE).unwrap();
    assert!(!status.compiling && status.file.is_some(), "{status:?}");
    assert_eq!(status.decisions_while_compiling, 1, "decisions by the rule are not counted as made while compiling");
}

/// What readiness (`/readyz`) reads: a rule that fails in the background says why, and a
/// queue without a rule file is on the built-in rule by choice.
#[test]
fn a_rule_that_fails_to_load_in_the_background_says_why() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let broken = dir.path().join("broken.wasm");
    std::fs::write(&broken, b"not wasm at all")?;
    let engine = engine(RuleLimits::default());
    let configs = [
        QueueRuleConfig { slot: DecisionSite::new("broken").unwrap(), rule: Some(broken), params: vec![] },
        QueueRuleConfig { slot: DecisionSite::new("missing").unwrap(), rule: Some(dir.path().join("missing.wasm")), params: vec![] },
        QueueRuleConfig { slot: DecisionSite::new("plain").unwrap(), rule: None, params: vec![] },
    ];
    let rules = Arc::new(RuleSet::new(engine, configs));
    rules.load_all_in_background();
    wait_for("both loads to end", || ["broken", "missing"].iter().all(|q| rules.load_state(q) != Some(RuleLoad::Compiling)));
    let reason = |queue: &str| match rules.load_state(queue) {
        Some(RuleLoad::Failed(reason)) => reason,
        other => panic!("{queue}: {other:?}"),
    };
    assert!(reason("broken").contains("not a WebAssembly file"), "{}", reason("broken"));
    assert!(reason("missing").contains("does not exist"), "{}", reason("missing"));
    assert_eq!(rules.load_state("plain"), Some(RuleLoad::BuiltIn));
    assert_eq!(rules.load_state("nope"), None);
    assert_eq!(rules.decide_task_count("broken", &state(5)).source, DecisionSource::BuiltIn);
    Ok(())
}

/// Issue 25: an artifact compiled ahead (`ebb rule compile --out`) and shipped beside the rule
/// is used, so a host with an empty cache compiles nothing; a damaged one, or one made by
/// another engine, is ignored with a warning and the rule compiled as if it were not there.
#[test]
fn a_compiled_artifact_shipped_beside_the_rule_is_used_unless_damaged_or_foreign() -> Result<()> {
    let rules_dir = tempfile::tempdir()?;
    let rule = rules_dir.path().join("rule.wasm");
    std::fs::copy(guests::FIXED_TASKS, &rule)?;
    // Ahead of time: compile into the rules folder, as `ebb rule compile --out` does.
    RuleEngine::new(RuleLimits::default(), Some(rules_dir.path().into()))?.load_file(&rule)?;
    let shipped: Vec<PathBuf> =
        cache_files(rules_dir.path()).into_iter().filter(|(name, _)| name.ends_with(".cwasm")).map(|(name, _)| rules_dir.path().join(name)).collect();
    assert_eq!(shipped.len(), 1, "{shipped:?}");
    let intact = std::fs::read(&shipped[0])?;
    let start = |cache: &Path| -> Result<(bool, u64)> {
        let engine = RuleEngine::new(RuleLimits::default(), Some(cache.into()))?;
        let loaded = engine.load_file(&rule)?;
        Ok((loaded.from_cache, engine.compilations()))
    };
    assert_eq!(start(tempfile::tempdir()?.path())?, (true, 0), "the shipped artifact is used");

    let mut damaged = intact.clone();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 1;
    std::fs::write(&shipped[0], &damaged)?;
    let log = ebb_tests::LogCapture::default();
    let _guard = log.start(tracing::Level::WARN);
    assert_eq!(start(tempfile::tempdir()?.path())?, (false, 1), "a damaged artifact is ignored");
    assert!(log.text().contains("damaged"), "{}", log.text());
    assert_eq!(std::fs::read(&shipped[0])?, damaged, "a shipped artifact is not the host's to delete");

    // Another engine's artifact of the same rule: its fingerprint (in the name) differs.
    std::fs::remove_file(&shipped[0])?;
    let name = shipped[0].file_name().unwrap().to_string_lossy().into_owned();
    let sha = name.split('-').next().unwrap();
    std::fs::write(rules_dir.path().join(format!("{sha}-0123456789abcdef.cwasm")), &intact)?;
    assert_eq!(start(tempfile::tempdir()?.path())?, (false, 1), "a foreign artifact is ignored");
    assert!(log.text().contains("another build of ebb or wasmtime"), "{}", log.text());
    Ok(())
}

/// `ebb rule compile`: into a folder shipped with the rules (`--out`), then used by a host
/// with an empty cache; or into the configuration's cache (`<data_dir>/rule-cache`).
#[test]
fn rule_compile_prepares_artifacts_a_host_with_an_empty_cache_uses() -> Result<()> {
    let ebb = |args: &[&std::ffi::OsStr]| {
        let output = std::process::Command::new(crate::binary::EBB).arg("rule").arg("compile").args(args).output().unwrap();
        assert!(output.status.success(), "ebb rule compile {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let dir = tempfile::tempdir()?;
    let rules_dir = dir.path().join("rules");
    std::fs::create_dir_all(&rules_dir)?;
    assert!(ebb(&[rules_dir.as_os_str(), "--out".as_ref(), rules_dir.as_os_str()]).contains("no rule"), "an empty folder is not a failure");
    let rule = rules_dir.join("orders.wasm");
    std::fs::copy(guests::FIXED_TASKS, &rule)?;
    let printed = ebb(&[rules_dir.as_os_str(), "--out".as_ref(), rules_dir.as_os_str()]);
    assert!(printed.contains("orders.wasm: compiled"), "{printed}");
    assert!(ebb(&[rule.as_os_str(), "--out".as_ref(), rules_dir.as_os_str()]).contains("already compiled"));
    let engine = RuleEngine::new(RuleLimits::default(), Some(dir.path().join("empty-cache")))?;
    assert!(engine.load_file(&rule)?.from_cache, "the shipped artifact is used");
    assert_eq!(engine.compilations(), 0);

    let config = dir.path().join("ebb.toml");
    let data = dir.path().join("data");
    std::fs::write(&config, format!("data_dir = \"{}\"\n[queues.orders]\nhandler = {{ url = \"http://127.0.0.1:1/\" }}\n", data.display()))?;
    let printed = ebb(&[rule.as_os_str(), "--config".as_ref(), config.as_os_str()]);
    assert!(printed.contains(&data.join("rule-cache").display().to_string()), "{printed}");
    assert_eq!(cache_files(&data.join("rule-cache")).len(), 1);
    Ok(())
}
