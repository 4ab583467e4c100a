//! The target scenario, natively: a closed-loop model of a handler whose latency is `base`
//! up to `knee` calls at once and `base × (calls / knee)²` beyond (so its throughput,
//! calls ÷ latency, peaks at the knee and falls as knee² ÷ calls past it), driven window by
//! window by a concurrency decision as the listener drives a rule: every 250 ms, the state of
//! the window that ended in, the limit for the next one out, clamped to `[1, max_limit]`.
//!
//! The model is a fluid one: the queue always has more work than the limit lets in, so
//! every window runs at its limit; calls end at `limit × window ÷ latency` a window (the
//! fraction carried over), each with the window's latency, which varies ±5 % from window to
//! window (a fixed pseudo-random sequence, so every run is the same).

use ebb_rules_sdk::{HandlerState, Params, ScalingRule};

use super::AdaptiveConcurrency;

const WINDOW_MS: u64 = 250;
const BASE_MS: f64 = 50.0;
const MAX_LIMIT: u32 = 256;
/// A minute of windows.
const WINDOWS: usize = 240;

/// The app: its latency at `calls` at once.
#[derive(Clone, Copy)]
struct Handler {
    base_ms: f64,
    knee: u32,
}

impl Handler {
    fn latency_ms(self, calls: u32) -> f64 {
        if calls <= self.knee { self.base_ms } else { self.base_ms * (f64::from(calls) / f64::from(self.knee)).powi(2) }
    }
}

/// What a run showed.
struct Run {
    /// Calls ended per second, over the run.
    throughput: f64,
    /// The 99th percentile of the calls' latencies, in milliseconds.
    p99_ms: f64,
    /// The limit of each window.
    limits: Vec<u32>,
}

/// Runs `windows` windows of `handler` from a limit of `max_limit` (where the host starts a
/// queue), asking `decide` for the next limit after each.
fn drive(handler: Handler, windows: usize, mut decide: impl FnMut(&HandlerState) -> Option<u32>) -> Run {
    let mut limit = MAX_LIMIT;
    let mut carried = 0.0;
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut ended_by_latency: Vec<(f64, u64)> = Vec::new();
    let mut limits = Vec::new();
    for window in 0..windows {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let noise = 1.0 + 0.05 * (2.0 * ((seed >> 11) as f64 / (1u64 << 53) as f64) - 1.0);
        let latency = handler.latency_ms(limit) * noise;
        let ending = f64::from(limit) * WINDOW_MS as f64 / latency + carried;
        let completed = ending.floor();
        carried = ending - completed;
        ended_by_latency.push((latency, completed as u64));
        limits.push(limit);
        let ended = |ms: f64| if completed > 0.0 { ms } else { 0.0 };
        let state = HandlerState {
            queue: "orders".into(),
            current_limit: limit,
            max_limit: MAX_LIMIT,
            in_flight: limit,
            peak_in_flight: limit,
            waiting_tasks: 4,
            window_ms: WINDOW_MS,
            completed: completed as u32,
            latency_mean_ms: ended(latency),
            latency_min_ms: ended(latency * 0.9),
            latency_max_ms: ended(latency * 1.1),
            timestamp_ms: 1_800_000_000_000 + window as u64 * WINDOW_MS,
            random: seed,
            ..Default::default()
        };
        // As the host does: none keeps the bound in force, a value is clamped.
        if let Some(next) = decide(&state) {
            limit = next.clamp(1, MAX_LIMIT);
        }
    }
    let calls: u64 = ended_by_latency.iter().map(|(_, n)| n).sum();
    ended_by_latency.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut counted = 0;
    let p99_ms = ended_by_latency
        .iter()
        .find(|(_, n)| {
            counted += n;
            counted * 100 >= calls * 99
        })
        .map_or(0.0, |(ms, _)| *ms);
    Run { throughput: calls as f64 / (windows as f64 * WINDOW_MS as f64 / 1000.0), p99_ms, limits }
}

fn fixed(handler: Handler, calls: u32) -> Run {
    drive(handler, WINDOWS, |_| Some(calls))
}

fn adaptive(handler: Handler, params: &[(&str, &str)]) -> Run {
    let params: Vec<(String, String)> = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let mut rule = AdaptiveConcurrency::default();
    rule.configure(&params as &Params).expect("the parameters are valid");
    drive(handler, WINDOWS, |state| rule.max_concurrent_calls(state))
}

/// The best fixed limit's throughput, trying every limit up to the ceiling.
fn best_fixed(handler: Handler) -> (u32, f64) {
    (1..=MAX_LIMIT).map(|calls| (calls, fixed(handler, calls).throughput)).max_by(|a, b| a.1.total_cmp(&b.1)).expect("limits were tried")
}

#[test]
fn the_adaptive_limit_keeps_the_throughput_of_the_best_fixed_limit_at_the_latency_of_the_knee() {
    for knee in [16, 40] {
        let handler = Handler { base_ms: BASE_MS, knee };
        let (best_calls, best) = best_fixed(handler);
        let at_knee = handler.latency_ms(knee);
        for (start, params) in [("max_limit", &[("initial", "256")][..]), ("1", &[][..])] {
            let run = adaptive(handler, params);
            let (throughput, p99) = (run.throughput / best, run.p99_ms / at_knee);
            println!(
                "knee {knee}, from {start}: throughput {:.1}/s = {throughput:.3} x the best fixed ({best:.1}/s at {best_calls}); p99 {:.1} ms = {p99:.3} x the knee's; limits {:?} .. {:?}",
                run.throughput,
                run.p99_ms,
                &run.limits[..12],
                &run.limits[WINDOWS - 12..]
            );
            assert!(throughput >= 0.9, "knee {knee}, from {start}: throughput {throughput:.3} x the best fixed");
            assert!(p99 <= 1.5, "knee {knee}, from {start}: p99 {p99:.3} x the knee's latency");
            let settled = &run.limits[WINDOWS / 4..];
            let (low, high) = (settled.iter().min().unwrap(), settled.iter().max().unwrap());
            assert!(
                *low as f64 >= 0.8 * knee as f64 && *high as f64 <= 1.25 * knee as f64,
                "knee {knee}, from {start}: after 15 s the limit stays near the knee, in {low}..={high}"
            );
        }
    }
}

#[test]
fn a_fixed_high_limit_collapses_where_the_adaptive_one_does_not() {
    for knee in [16, 40] {
        let handler = Handler { base_ms: BASE_MS, knee };
        let (_, best) = best_fixed(handler);
        let high = fixed(handler, 256);
        let (throughput, p99) = (high.throughput / best, high.p99_ms / handler.latency_ms(knee));
        println!(
            "knee {knee}, fixed 256: throughput {:.1}/s = {throughput:.3} x the best fixed; p99 {:.0} ms = {p99:.1} x the knee's",
            high.throughput, high.p99_ms
        );
        assert!(throughput < 0.2 && p99 > 10.0, "knee {knee}: a fixed 256 should collapse: {throughput:.3}, {p99:.1}");
    }
}

/// Past the knee, throughput falls as the limit grows: the model is the one meant.
#[test]
fn the_model_peaks_at_the_knee() {
    let handler = Handler { base_ms: BASE_MS, knee: 16 };
    let (best_calls, best) = best_fixed(handler);
    assert!((15..=17).contains(&best_calls), "{best_calls}");
    assert!((best - 320.0).abs() < 20.0, "16 calls of 50 ms: 320 a second, not {best}");
    assert!(fixed(handler, 32).throughput < 0.55 * best);
}
