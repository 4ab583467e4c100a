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
    fn never_exceeds_the_cap() {
        for attempt in 0..200 {
            assert!(jittered_exponential(attempt, 10, 5000, (1.0, 1000.0), u64::MAX) <= 5000);
        }
    }
}
