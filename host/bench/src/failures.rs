//! `ebb bench failures`: what a failure decision costs (issue 22 item 4): a WASM rule that
//! exports `ebb:rules/failures` (through the queue's rule slot, as the listener asks it:
//! locks, fuel and deadline, clamp) against the same policy written in Rust and run in the
//! host, interleaved batch by batch in one run, each decision timed.

use std::path::Path;
use std::time::Instant;

use anyhow::{Result, bail};
use ebb_rules_sdk::{ErrorClass, FailureContext, FailureDecision, IdleContext, IdleDecision, QueueState};
use serde::Serialize;

use crate::shadow::Percentiles;
use ebb::names::DecisionSite;
use ebb::rules::{NativeRule, QueueRuleConfig, RuleEngine, RuleLimits, RuleSet, native_failure};

const BATCH: usize = 1_024;

/// `example-rules/retry-policy`'s policy, in Rust: poison 400 and 422, else a doubling delay.
struct NativeRetryPolicy;

impl NativeRule for NativeRetryPolicy {
    fn name(&self) -> &str {
        "retry-policy (native)"
    }
    fn optimal_dequeue_task_count(&self, state: &QueueState) -> u32 {
        ebb_rules_sdk::paper::optimal_dequeue_task_count(state)
    }
    fn on_queue_empty(&self, ctx: &IdleContext) -> IdleDecision {
        ebb_rules_sdk::paper::on_queue_empty(ctx)
    }
    fn on_handler_failure(&self, ctx: &FailureContext) -> Option<FailureDecision> {
        if matches!(ctx.http_status, Some(400 | 422)) {
            return Some(FailureDecision::Poison(format!("retry-policy: HTTP {} is not retried", ctx.http_status.unwrap_or_default())));
        }
        let base = if matches!(ctx.error_class, ErrorClass::Timeout | ErrorClass::Connect) { 10_000 } else { 1_000 };
        Some(FailureDecision::Retry(ebb_rules_sdk::backoff::jittered_geometric(
            ctx.dequeue_count,
            base,
            ctx.max_retry_delay_ms.max(base),
            2.0,
            (0.9, 1.1),
            ctx.random,
        )))
    }
}

/// What `ebb bench failures` reports.
#[derive(Debug, Serialize)]
pub(crate) struct FailuresReport {
    pub(crate) rule: String,
    pub(crate) decisions: usize,
    pub(crate) wasm: Percentiles,
    pub(crate) native: Percentiles,
    /// The rule's faults during the run (0 for a sound rule).
    pub(crate) wasm_faults: u64,
}

fn percentiles(mut samples: Vec<u64>) -> Percentiles {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize] as f64;
    Percentiles { p50_ns: at(0.50), p99_ns: at(0.99) }
}

/// The contexts decided, in turn: a mix of classes, statuses and attempts.
fn context(i: usize) -> FailureContext {
    let (error_class, http_status) = match i % 4 {
        0 => (ErrorClass::HttpStatus, Some(500)),
        1 => (ErrorClass::Timeout, None),
        2 => (ErrorClass::HttpStatus, Some(422)),
        _ => (ErrorClass::Other, None),
    };
    FailureContext {
        queue: "bench".into(),
        dequeue_count: (i % 5) as u32 + 1,
        max_dequeue_count: 5,
        error_class,
        http_status,
        error: "handler http://127.0.0.1:8080/ answered 500 Internal Server Error: upstream failed".into(),
        max_retry_delay_ms: 600_000,
        default_retry_delay_ms: 30_000,
        random: (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        ..Default::default()
    }
}

/// Times `decisions` failure decisions of the WASM rule at `rule` and of the native policy.
pub(crate) fn run(rule: &Path, decisions: usize) -> Result<FailuresReport> {
    let engine = RuleEngine::new(RuleLimits::default(), None)?;
    let rules = RuleSet::new(engine, [QueueRuleConfig { slot: DecisionSite::new("bench")?, rule: Some(rule.to_path_buf()), params: vec![] }]);
    if let Some(error) = rules.load_all().into_iter().next() {
        bail!("{error:#}");
    }
    let queue = rules.queue("bench").expect("configured above");
    if !queue.rule_decides_failures() {
        bail!("{}: the rule does not export ebb:rules/failures@0.4.0 (build it for the failure-aware-rule world)", rule.display());
    }
    let contexts: Vec<FailureContext> = (0..BATCH).map(context).collect();
    let (mut wasm, mut native) = (Vec::with_capacity(decisions), Vec::with_capacity(decisions));
    while wasm.len() < decisions {
        for ctx in &contexts {
            let started = Instant::now();
            std::hint::black_box(queue.decide_failure(std::hint::black_box(ctx)));
            wasm.push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
        }
        for ctx in &contexts {
            let started = Instant::now();
            std::hint::black_box(native_failure(&NativeRetryPolicy, std::hint::black_box(ctx)));
            native.push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
        }
    }
    Ok(FailuresReport {
        rule: rule.display().to_string(),
        decisions: wasm.len(),
        wasm: percentiles(wasm),
        native: percentiles(native),
        wasm_faults: queue.status().faults_total,
    })
}

/// The report as a table.
pub(crate) fn table(report: &FailuresReport) -> String {
    format!(
        "failure decision cost ({} decisions each; rule {})\n{:<22} {:>10} {:>10}\n{:<22} {:>10.0} {:>10.0}\n{:<22} {:>10.0} {:>10.0}\nrule faults: {}\n",
        report.decisions,
        report.rule,
        "",
        "p50 ns",
        "p99 ns",
        "wasm rule (slot)",
        report.wasm.p50_ns,
        report.wasm.p99_ns,
        "native rule (Rust)",
        report.native.p50_ns,
        report.native.p99_ns,
        report.wasm_faults
    )
}
