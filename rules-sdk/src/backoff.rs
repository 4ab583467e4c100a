//! Jittered exponential back-off, driven by the host's random value.

/// The paper's jitter range for one back-off step, in milliseconds: `random(80 .. 120)`.
pub const PAPER_JITTER_MS: (f64, f64) = (80.0, 120.0);

/// Maps the host's random value uniformly onto `[low, high]`.
pub fn uniform(random: u64, low: f64, high: f64) -> f64 {
    let unit = random as f64 / (u64::MAX as f64 + 1.0);
    low + unit * (high - low)
}

/// `min(min_ms + (2^attempt − 1) × random(jitter), max_ms)`, in whole milliseconds.
///
/// `attempt` 0 gives `min_ms`; large attempts saturate at `max_ms` without overflow.
/// The result never exceeds `max_ms` (unless `min_ms` does).
pub fn jittered_exponential(attempt: u32, min_ms: u64, max_ms: u64, jitter_ms: (f64, f64), random: u64) -> u64 {
    let step = uniform(random, jitter_ms.0, jitter_ms.1);
    let growth = 2f64.powi(attempt.min(1024) as i32) - 1.0;
    let delay = min_ms as f64 + growth * step;
    if delay >= max_ms as f64 { max_ms.max(min_ms) } else { delay.round() as u64 }
}

/// `min(min_ms × factor^(attempt − 1) × random(jitter), max_ms)`, at least `min_ms`, in
/// whole milliseconds: a geometric back-off whose first step is `min_ms`.
///
/// Attempts 0 and 1 give `min_ms` (before jitter); large attempts saturate at `max_ms`
/// without overflow. The result stays within `[min_ms, max_ms]` (unless `min_ms > max_ms`).
/// The power is taken by repeated multiplication (at most 200 times), so a rule in another
/// language computes the same milliseconds with the same loop.
pub fn jittered_geometric(attempt: u32, min_ms: u64, max_ms: u64, factor: f64, jitter: (f64, f64), random: u64) -> u64 {
    let mut grown = min_ms as f64;
    for _ in 1..attempt.min(200) {
        grown *= factor;
    }
    let grown = grown * uniform(random, jitter.0, jitter.1);
    if grown >= max_ms as f64 { max_ms.max(min_ms) } else { (grown.round() as u64).max(min_ms) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_spans_the_whole_range() {
        assert_eq!(uniform(0, 80.0, 120.0), 80.0);
        assert!(uniform(u64::MAX, 80.0, 120.0) <= 120.0);
        assert_eq!(uniform(1 << 63, 80.0, 120.0), 100.0);
    }

    #[test]
    fn attempt_zero_is_the_floor() {
        assert_eq!(jittered_exponential(0, 250, 1000, PAPER_JITTER_MS, 12345), 250);
    }

    #[test]
    fn geometric_starts_at_the_floor_grows_by_the_factor_and_stops_at_the_cap() {
        let mid = 1u64 << 63;
        let delays: Vec<u64> = (1..=4).map(|n| jittered_geometric(n, 800, 60_000, 1.75, (0.8, 1.2), mid)).collect();
        assert_eq!(delays, [800, 1400, 2450, 4288]);
        assert_eq!(jittered_geometric(1, 800, 60_000, 1.75, (0.8, 1.2), 0), 800, "never below the floor");
        assert_eq!(jittered_geometric(u32::MAX, 800, 60_000, 1.75, (0.8, 1.2), u64::MAX), 60_000);
        assert_eq!(jittered_geometric(0, 800, 60_000, 1.75, (0.8, 1.2), mid), 800);
    }

    #[test]
    fn never_exceeds_the_cap() {
        for attempt in 0..200 {
            assert!(jittered_exponential(attempt, 10, 5000, (1.0, 1000.0), u64::MAX) <= 5000);
        }
    }
}
