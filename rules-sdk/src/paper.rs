//! The whitepaper's rule, tuned for billed calls: the defaults of [`crate::ScalingRule`],
//! and the host's built-in rule.
//!
//! The shape is the paper's (grow with work, back off exponentially when empty, shrink to
//! one polling task, or none with push notifications); two numbers are not. The paper's
//! table started 10 tasks for any backlog under 100 and 50 under 1,000: at one to four
//! messages a second each of them polls, and most gets come back empty. Here a task is
//! started per batch of backlog. And with push, an idle task stops at once: a notification
//! brings the queue a get, so polling on would only bill empty gets.

use crate::backoff::jittered_geometric;
use crate::{IdleContext, IdleDecision, QueueState};

/// The batch size assumed when the host does not say (a 0.1.0 host): Azure's largest.
const DEFAULT_BATCH: u64 = 32;

/// `GetOptimalDequeueTaskCount` (before the host's clamp): one task per batch of backlog,
/// ⌈depth ÷ batch size⌉, so a backlog a single get can take gets one task.
pub fn optimal_dequeue_task_count(state: &QueueState) -> u32 {
    let batch = if state.batch_size == 0 { DEFAULT_BATCH } else { u64::from(state.batch_size) };
    u32::try_from(state.approximate_depth.div_ceil(batch)).unwrap_or(u32::MAX)
}

/// How much longer each further empty look sleeps than the one before.
pub const BACKOFF_FACTOR: f64 = 1.75;
/// The random spread of each sleep, as a factor.
pub const BACKOFF_JITTER: (f64, f64) = (0.8, 1.2);

/// `QueueEmpty`: the paper's random exponential back-off, with a gentler factor (1.75, not
/// 2) from the queue's `min_polling_interval`:
///
/// ```text
/// interval = clamp(min_interval × 1.75^(idle − 1) × random(0.8 .. 1.2), min_interval, max_interval)
/// stop     = push_enabled or (interval ≥ max_interval and active_tasks > 1)
/// ```
///
/// Tasks reach the maximum interval at different idle counts, so a pull listener shrinks
/// gradually to one polling task; with push notifications an idle task stops at once.
/// (Against Azure Functions' back-off, doubling from 100 ms: starting at the host's default
/// 800 ms and growing by 1.75 makes fewer calls and a lower pickup p99 on every scenario
/// `ebb simulate` has; see docs/benchmarks.md.)
pub fn on_queue_empty(ctx: &IdleContext) -> IdleDecision {
    let delay_ms = jittered_geometric(ctx.idle_count, ctx.min_interval_ms, ctx.max_interval_ms, BACKOFF_FACTOR, BACKOFF_JITTER, ctx.random);
    let stop = ctx.push_enabled || (delay_ms >= ctx.max_interval_ms && ctx.active_tasks > 1);
    IdleDecision { delay_ms, stop }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(idle_count: u32, active_tasks: u32, random: u64) -> IdleContext {
        IdleContext { idle_count, active_tasks, min_interval_ms: 800, max_interval_ms: 60_000, random, ..Default::default() }
    }

    #[test]
    fn one_task_per_batch_of_backlog() {
        for (depth, batch, tasks) in [(0, 32, 0), (1, 32, 1), (32, 32, 1), (33, 32, 2), (95, 10, 10), (1000, 32, 32), (40, 0, 2), (u64::MAX, 1, u32::MAX)] {
            let state = QueueState { approximate_depth: depth, batch_size: batch, ..Default::default() };
            assert_eq!(optimal_dequeue_task_count(&state), tasks, "depth {depth}, batch {batch}");
        }
    }

    #[test]
    fn first_empty_look_sleeps_the_floor_to_1_2_times_it() {
        assert_eq!(on_queue_empty(&idle(1, 1, 0)).delay_ms, 800);
        assert_eq!(on_queue_empty(&idle(1, 1, u64::MAX)).delay_ms, 960);
    }

    #[test]
    fn delay_grows_by_1_75_with_each_idle_look_until_the_cap() {
        let delays: Vec<u64> = (1..=20).map(|n| on_queue_empty(&idle(n, 1, 1 << 63)).delay_ms).collect();
        assert_eq!(&delays[..4], &[800, 1400, 2450, 4288]);
        assert_eq!(*delays.last().unwrap(), 60_000);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn only_a_task_at_the_cap_with_company_stops() {
        assert!(!on_queue_empty(&idle(3, 5, 0)).stop, "below the cap");
        assert!(on_queue_empty(&idle(30, 2, 0)).stop, "at the cap, another task polls");
        assert!(!on_queue_empty(&idle(30, 1, 0)).stop, "the last task keeps polling");
        let push = IdleContext { push_enabled: true, ..idle(1, 1, 0) };
        assert!(on_queue_empty(&push).stop, "with push even the last task stops, at once");
    }

    #[test]
    fn huge_idle_counts_do_not_overflow() {
        assert_eq!(on_queue_empty(&idle(u32::MAX, 1, u64::MAX)).delay_ms, 60_000);
    }
}
