//! The knee benchmark (issue 24): an app whose latency grows past a concurrency knee, a
//! sweep of fixed handler concurrencies against an adaptive rule. The best fixed setting is
//! what an operator who knew the knee would configure; a fixed high setting collapses (the
//! app spends its time queueing); the adaptive rule should find the knee by itself.

use std::time::Duration;

use anyhow::{Result, bail};
use serde::Serialize;

use super::{HandlerTime, RuleChoice, Scenario, SimOptions};

/// Fixed concurrencies of the sweep.
pub const FIXED: &[u32] = &[4, 8, 12, 16, 20, 24, 32, 48, 64, 128, 256];
/// Goal: the adaptive rule's throughput at least this share of the best fixed setting's.
pub const THROUGHPUT_GOAL: f64 = 0.9;
/// Goal: the adaptive rule's handler latency p99 at most this many times the latency at
/// the knee.
pub const LATENCY_GOAL: f64 = 1.5;

/// One run of the sweep.
#[derive(Debug, Clone, Serialize)]
pub struct KneeRun {
    /// `fixed` or the adaptive rule's name.
    pub rule: String,
    /// The queue's `max_concurrent_calls`.
    pub max_concurrent_calls: u32,
    /// Handler calls per second.
    pub throughput_per_sec: f64,
    /// Handler latency median and 99th percentile, in milliseconds.
    pub handler_p50_ms: u64,
    /// 99th percentile.
    pub handler_p99_ms: u64,
    /// Most calls at once.
    pub peak_calls: u32,
    /// The limit at the end of the run.
    pub final_limit: u32,
}

/// The sweep, the adaptive run, and the goals.
#[derive(Debug, Clone, Serialize)]
pub struct KneeReport {
    /// Calls at once past which the app slows down.
    pub knee: u32,
    /// The app's latency up to the knee, in milliseconds.
    pub knee_latency_ms: u64,
    /// The fixed settings, in order.
    pub fixed: Vec<KneeRun>,
    /// The adaptive rule, with the highest fixed setting as its ceiling.
    pub adaptive: Option<KneeRun>,
    /// The best fixed setting's throughput.
    pub best_fixed_per_sec: f64,
    /// The adaptive rule's throughput ÷ the best fixed setting's.
    pub throughput_ratio: Option<f64>,
    /// The adaptive rule's handler p99 ÷ the latency at the knee.
    pub latency_ratio: Option<f64>,
    /// The highest fixed setting's throughput ÷ the best's: how far it collapsed.
    pub highest_fixed_ratio: f64,
    /// Both goals met.
    pub met: bool,
}

fn run_one(template: &SimOptions, rule: RuleChoice, limit: u32) -> Result<KneeRun> {
    let options = SimOptions { rules: vec![rule], max_concurrent_calls: Some(limit), ..template.clone() };
    let report = super::run(&options)?;
    let r = &report.rules[0];
    Ok(KneeRun {
        rule: r.rule.clone(),
        max_concurrent_calls: limit,
        throughput_per_sec: r.throughput_per_sec,
        handler_p50_ms: r.handler_p50_ms.unwrap_or(0),
        handler_p99_ms: r.handler_p99_ms.unwrap_or(0),
        peak_calls: r.peak_handler_calls,
        final_limit: r.final_concurrency_limit,
    })
}

/// Runs the knee scenario for each of `fixed` (the built-in rule, which decides no
/// concurrency) and for `adaptive` with the highest of them as its ceiling.
pub fn run(knee: u32, handler_time: Duration, fixed: &[u32], adaptive: Option<RuleChoice>, seed: u64) -> Result<KneeReport> {
    let Some(&highest) = fixed.iter().max() else { bail!("the sweep needs at least one fixed concurrency") };
    let workload = Scenario::Knee.workload(None, seed)?;
    let template =
        SimOptions { handler_time: HandlerTime::Fixed(handler_time), handler_knee: Some(knee), seed, ..SimOptions::new(workload, vec![RuleChoice::Paper]) };
    let fixed: Vec<KneeRun> = fixed.iter().map(|&limit| run_one(&template, RuleChoice::Paper, limit)).collect::<Result<_>>()?;
    let adaptive = adaptive.map(|rule| run_one(&template, rule, highest)).transpose()?;
    let best = fixed.iter().map(|r| r.throughput_per_sec).fold(0.0, f64::max);
    let highest_run = fixed.iter().find(|r| r.max_concurrent_calls == highest).expect("the highest is in the sweep");
    let knee_latency_ms = handler_time.as_millis() as u64;
    let throughput_ratio = adaptive.as_ref().map(|a| a.throughput_per_sec / best);
    let latency_ratio = adaptive.as_ref().map(|a| a.handler_p99_ms as f64 / knee_latency_ms.max(1) as f64);
    let met = throughput_ratio.is_some_and(|r| r >= THROUGHPUT_GOAL) && latency_ratio.is_some_and(|r| r <= LATENCY_GOAL);
    Ok(KneeReport {
        knee,
        knee_latency_ms,
        highest_fixed_ratio: highest_run.throughput_per_sec / best,
        fixed,
        adaptive,
        best_fixed_per_sec: best,
        throughput_ratio,
        latency_ratio,
        met,
    })
}

/// The report as a table.
pub fn table(report: &KneeReport) -> String {
    let mut out = format!(
        "knee: {} calls at once, {} ms each up to it (latency × (calls ÷ knee)² beyond)\n{:<28} {:>6} {:>10} {:>8} {:>8} {:>6} {:>6}\n",
        report.knee, report.knee_latency_ms, "rule", "limit", "calls/s", "p50 ms", "p99 ms", "peak", "final"
    );
    for run in report.fixed.iter().chain(&report.adaptive) {
        out.push_str(&format!(
            "{:<28} {:>6} {:>10.1} {:>8} {:>8} {:>6} {:>6}\n",
            run.rule, run.max_concurrent_calls, run.throughput_per_sec, run.handler_p50_ms, run.handler_p99_ms, run.peak_calls, run.final_limit
        ));
    }
    let ratio = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.2}"));
    out.push_str(&format!(
        "adaptive ÷ best fixed: {} (goal ≥ {THROUGHPUT_GOAL}); adaptive p99 ÷ knee latency: {} (goal ≤ {LATENCY_GOAL}); highest fixed ÷ best: {:.2}; {}\n",
        ratio(report.throughput_ratio),
        ratio(report.latency_ratio),
        report.highest_fixed_ratio,
        if report.met { "goals met" } else { "goals NOT met" }
    ));
    out
}
