//! The whitepaper's rule: the defaults of [`crate::ScalingRule`], and the host's built-in rule.

use crate::backoff::{PAPER_JITTER_MS, jittered_exponential};
use crate::thresholds::tasks_for;
use crate::{IdleContext, IdleDecision, QueueState};

/// The paper's deliberately simple task table: depth < 100 → 10, < 1000 → 50, otherwise 100.
pub const TASK_TABLE: &[(u64, u32)] = &[(100, 10), (1000, 50), (u64::MAX, 100)];

/// `GetOptimalDequeueTaskCount` as the paper writes it (before the host's clamp).
pub fn optimal_dequeue_task_count(state: &QueueState) -> u32 {
    tasks_for(TASK_TABLE, state.approximate_depth)
}

/// `QueueEmpty` as the paper writes it:
///
/// ```text
/// delta    = (2^idle − 1) × random(80 ms .. 120 ms)
/// interval = min(min_interval + delta, max_interval)
/// stop     = interval ≥ max_interval and (active_tasks > 1 or push_enabled)
/// ```
///
/// Tasks reach the maximum interval at different idle counts, so a listener shrinks
/// gradually to one polling task, or to none when push notifications can wake it.
pub fn on_queue_empty(ctx: &IdleContext) -> IdleDecision {
    let delay_ms = jittered_exponential(ctx.idle_count, ctx.min_interval_ms, ctx.max_interval_ms, PAPER_JITTER_MS, ctx.random);
    let stop = delay_ms >= ctx.max_interval_ms && (ctx.active_tasks > 1 || ctx.push_enabled);
    IdleDecision { delay_ms, stop }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(idle_count: u32, active_tasks: u32, random: u64) -> IdleContext {
        IdleContext { idle_count, active_tasks, min_interval_ms: 100, max_interval_ms: 60_000, random, ..Default::default() }
    }

    #[test]
    fn task_count_follows_the_paper_table() {
        for (depth, tasks) in [(0, 10), (99, 10), (100, 50), (999, 50), (1000, 100), (u64::MAX, 100)] {
            let state = QueueState { approximate_depth: depth, ..Default::default() };
            assert_eq!(optimal_dequeue_task_count(&state), tasks, "depth {depth}");
        }
    }

    #[test]
    fn first_empty_get_sleeps_min_plus_80_to_120_ms() {
        assert_eq!(on_queue_empty(&idle(1, 1, 0)).delay_ms, 180);
        assert_eq!(on_queue_empty(&idle(1, 1, u64::MAX)).delay_ms, 220);
    }

    #[test]
    fn delay_doubles_roughly_with_each_idle_get_until_the_cap() {
        let delays: Vec<u64> = (1..=20).map(|n| on_queue_empty(&idle(n, 1, 1 << 63)).delay_ms).collect();
        // (2^n − 1) × 100 ms at mid jitter, plus the 100 ms floor.
        assert_eq!(&delays[..4], &[200, 400, 800, 1600]);
        assert_eq!(*delays.last().unwrap(), 60_000);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn only_a_task_at_the_cap_with_company_stops() {
        assert!(!on_queue_empty(&idle(3, 5, 0)).stop, "below the cap");
        assert!(on_queue_empty(&idle(30, 2, 0)).stop, "at the cap, another task polls");
        assert!(!on_queue_empty(&idle(30, 1, 0)).stop, "the last task keeps polling");
        let push = IdleContext { push_enabled: true, ..idle(30, 1, 0) };
        assert!(on_queue_empty(&push).stop, "with push even the last task stops");
    }

    #[test]
    fn huge_idle_counts_do_not_overflow() {
        assert_eq!(on_queue_empty(&idle(u32::MAX, 1, u64::MAX)).delay_ms, 60_000);
    }
}
