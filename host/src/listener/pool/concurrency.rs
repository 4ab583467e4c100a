//! The concurrency decision: every [`CONCURRENCY_WINDOW`] while handler calls run, the rule
//! is told how the window's calls went (latency, failures, push backs, calls in flight and
//! tasks waiting for a slot) and may set the limit of the queue's handler slots within
//! `[1, max_concurrent_calls]`. A rule that does not decide it (the built-in rule, rules of
//! contracts before 0.3.0, a fault) leaves the limit at `max_concurrent_calls`. An idle
//! queue asks nothing: no call ran, so there is nothing to decide on.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use futures::FutureExt as _;
use tracing::Instrument as _;

use crate::rules::{Decision, HandlerState};

use crate::listener::Shared;
use crate::listener::telemetry::RecordedDecision;

/// How often the rule is asked while handler calls run: a quarter of a second holds enough
/// calls of a fast app to measure, and lets a controller that moves one step per window
/// find a knee of a few dozen calls within seconds.
pub const CONCURRENCY_WINDOW: Duration = Duration::from_millis(250);

/// How long, on average, a message fetched ahead of the free handler slots may wait for
/// one: a task asks for as many more messages than it has slots as the calls in flight end
/// within this time (by the recent mean latency), up to a batch. A fast app so gets full
/// batches (few gets and commits) however small its limit; a slow one gets no more than its
/// free slots.
pub const PREFETCH_WAIT: Duration = Duration::from_millis(5);

/// A message fetched ahead of the free slots, counted in `fetched_ahead` until it has its
/// slot or its processing ends (however it ends).
pub(in crate::listener) struct FetchedAhead<'a>(pub(super) &'a std::sync::atomic::AtomicU32);

impl Drop for FetchedAhead<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn millis(micros: u64) -> f64 {
    micros as f64 / 1e3
}

impl Shared {
    /// Keeps the recent mean handler latency (an exponential average over about 8 calls).
    pub(in crate::listener) fn record_call_latency(&self, latency: Duration) {
        let sample = latency.as_micros().clamp(1, u128::from(u32::MAX)) as u64;
        let _ = self
            .pool
            .latency_micros
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mean| Some(if mean == 0 { sample } else { mean - mean / 8 + sample / 8 }));
    }

    /// Messages the queue may hold fetched ahead of its free slots, all tasks together: those
    /// the calls now allowed finish within [`PREFETCH_WAIT`] at the recent mean latency (none
    /// before the first call).
    fn prefetch_allowance(&self) -> u32 {
        let mean = self.pool.latency_micros.load(Ordering::Relaxed);
        if mean == 0 {
            return 0;
        }
        let ends_within = u64::from(self.pool.slots.limit()).saturating_mul(PREFETCH_WAIT.as_micros() as u64) / mean;
        ends_within.min(u64::from(u32::MAX)) as u32
    }

    /// Reserves up to `most` messages to fetch ahead of the free slots, within what the
    /// queue may hold ahead less what it holds already; returns how many.
    pub(in crate::listener) fn reserve_prefetch(&self, most: u32) -> u32 {
        let allowance = self.prefetch_allowance();
        let mut taken = 0;
        let _ = self.pool.fetched_ahead.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            taken = allowance.saturating_sub(held).min(most);
            Some(held + taken)
        });
        taken
    }

    /// Gives back reserved places a get did not fill.
    pub(in crate::listener) fn release_prefetch(&self, unused: u32) {
        if unused > 0 {
            self.pool.fetched_ahead.fetch_sub(unused, Ordering::AcqRel);
        }
    }

    /// Starts the loop that asks the rule for the handler concurrency while calls run.
    pub(in crate::listener) fn spawn_concurrency(self: &Arc<Self>) {
        let shared = self.clone();
        let span = tracing::info_span!("concurrency", queue = %self.queue.name());
        self.tasks.spawn(
            async move {
                // A panic ends one decision, not the loop: count it, pause, start over.
                while let Err(panic) = AssertUnwindSafe(shared.clone().run_concurrency()).catch_unwind().await {
                    shared.task_panicked("the concurrency decision", &*panic);
                    tokio::select! {
                        _ = tokio::time::sleep(CONCURRENCY_WINDOW) => {}
                        _ = shared.stopping.cancelled() => return,
                    }
                }
            }
            .instrument(span),
        );
    }

    async fn run_concurrency(self: Arc<Self>) {
        loop {
            let idle = self.pool.slots.in_use() == 0 && self.pool.slots.waiting() == 0 && self.telemetry.counters.calls.lock().unwrap().is_empty();
            if idle {
                // Nothing runs: wait for a call to start rather than ticking through an idle
                // day (a simulated one included).
                tokio::select! {
                    _ = self.pool.calls_started.notified() => {}
                    _ = self.stopping.cancelled() => return,
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(CONCURRENCY_WINDOW) => {}
                _ = self.stopping.cancelled() => return,
            }
            self.decide_concurrency().await;
        }
    }

    /// Asks the rule for the limit with the window that just ended, and applies it.
    pub(in crate::listener) async fn decide_concurrency(&self) {
        let window = std::mem::take(&mut *self.telemetry.counters.calls.lock().unwrap());
        let max_limit = self.settings.max_concurrent_calls;
        if !self.rule.decider.may_decide_concurrency() {
            // Back to the configured bound (a rule that decided it may have been swapped
            // for one that does not).
            self.pool.slots.set_limit(max_limit);
            return;
        }
        let state = HandlerState {
            queue: self.queue.name().to_string(),
            current_limit: self.pool.slots.limit(),
            max_limit,
            in_flight: self.pool.slots.in_use(),
            peak_in_flight: self.pool.slots.take_peak(),
            waiting_tasks: self.pool.slots.waiting(),
            window_ms: CONCURRENCY_WINDOW.as_millis() as u64,
            completed: window.completed,
            failed: window.failed,
            pushed_back: window.pushed_back,
            latency_mean_ms: if window.completed > 0 { millis(window.total_micros) / f64::from(window.completed) } else { 0.0 },
            latency_min_ms: window.min_micros.map_or(0.0, millis),
            latency_max_ms: millis(window.max_micros),
            timestamp_ms: self.rule.clock.now_ms(),
            random: self.rule.concurrency_random(),
        };
        let decision: Option<Decision<u32>> = self.ask_rule(state, |rule, state| rule.decide_concurrency(state), |_| None).await;
        let limit = decision.map_or(max_limit, |d| d.value.clamp(1, max_limit));
        if limit != self.pool.slots.limit() {
            tracing::debug!(limit, previous = self.pool.slots.limit(), "handler concurrency changed");
        }
        self.pool.slots.set_limit(limit);
        if let Some(decision) = decision {
            *self.telemetry.counters.last_concurrency.lock().unwrap() = Some(RecordedDecision { decision, at: SystemTime::now() });
        }
    }
}
