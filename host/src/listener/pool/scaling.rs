//! The scaler: on work detected (coalesced to one decision per `scale_interval`), count the
//! queue, ask the rule for a task count, and move toward it: wake idle tasks the backlog
//! can keep busy, start the rest. Tasks beyond the count retire themselves (`tasks`).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use futures::FutureExt as _;
use tracing::Instrument as _;

use crate::rules::DepthSource;

use crate::listener::Shared;

impl Shared {
    pub(in crate::listener) fn spawn_scaler(self: &Arc<Self>) {
        let shared = self.clone();
        let span = tracing::info_span!("scaler", queue = %self.queue.name());
        self.tasks.spawn(
            async move {
                // A panic ends one decision, not scaling: count it, pause, start over.
                while let Err(panic) = AssertUnwindSafe(shared.clone().run_scaler()).catch_unwind().await {
                    shared.task_panicked("the scaler", &*panic);
                    tokio::select! {
                        _ = tokio::time::sleep(shared.settings.scale_interval) => {}
                        _ = shared.stopping.cancelled() => return,
                    }
                }
            }
            .instrument(span),
        );
    }

    async fn run_scaler(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = self.events.work.notified() => {}
                _ = self.stopping.cancelled() => return,
            }
            // Coalesce raises: at most one count (a billed call on Azure) per scale interval.
            // A decision on an inferred depth costs nothing and waits for nothing: a burst
            // after a trickle is met at once.
            if self.scale().await == DepthSource::Measured && !self.wait_out_the_count().await {
                return;
            }
        }
    }

    /// After a count, waits out the scale interval before the next one; meanwhile a raise
    /// whose get found the queue drained is decided at once, on the inferred depth: a
    /// backlog drained within the interval (tasks no longer wait for their batches) lets
    /// its tasks retire before they back off further, each wake-up a get. Other raises are
    /// decided after it. False when the listener stops.
    async fn wait_out_the_count(self: &Arc<Self>) -> bool {
        let until = tokio::time::Instant::now() + self.settings.scale_interval;
        let mut raised = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => break,
                _ = self.events.work.notified() => {
                    if self.last_get_drained() {
                        self.scale().await;
                    } else {
                        raised = true;
                    }
                }
                _ = self.stopping.cancelled() => return false,
            }
        }
        if raised {
            self.events.work.notify_one();
        }
        true
    }

    /// The last get came back with fewer messages than it asked for: the queue was drained.
    fn last_get_drained(&self) -> bool {
        let last_get = self.telemetry.counters.last_get();
        last_get.messages < last_get.asked.max(1)
    }

    /// One decision; says whether the depth was counted for it.
    async fn scale(self: &Arc<Self>) -> DepthSource {
        // A get that came back with fewer messages than it asked for found the queue
        // drained: no count is needed to know the backlog is (about) gone.
        let (depth, depth_source) = if self.last_get_drained() {
            (0, DepthSource::Inferred)
        } else if self.settings.min_tasks >= self.settings.max_tasks {
            // The bounds fix the count whatever the depth: a count would be a billed
            // request for nothing.
            (self.telemetry.counters.last_depth.load(Ordering::Relaxed), DepthSource::Inferred)
        } else {
            self.count_depth().await
        };
        let decision = self.decide_task_count(depth, depth_source).await;
        let target = decision.value;
        self.telemetry.counters.target_tasks.store(target, Ordering::Relaxed);
        // Tasks resting in their back-off count as active: wake as many as the backlog can
        // keep busy, then start the rest.
        let resting = self.pickup().resting();
        let busy_enough = depth.div_ceil(self.settings.batch_size as u64).min(target as u64).min(resting as u64);
        for _ in 0..busy_enough {
            self.pool.wake.notify_one();
        }
        let active = self.telemetry.counters.active_tasks.load(Ordering::Relaxed);
        if target > active {
            tracing::debug!(depth, active, target, source = ?decision.source, "starting dequeue tasks");
            self.start_tasks_up_to(target);
        }
        depth_source
    }

    /// The queue's approximate depth, remembered for the status; the last known one
    /// (inferred) if the count fails, or 0 if the queue does not exist (it holds nothing:
    /// the scaler must not keep asking for instances on a stale figure).
    async fn count_depth(&self) -> (u64, DepthSource) {
        let depth = match self.queue.approximate_count().await {
            Ok(depth) => (depth, DepthSource::Measured),
            Err(error) if error.failure_class() == Some(crate::queue::FailureClass::Missing) => {
                tracing::warn!("approximate count failed: the queue does not exist, scaling on a depth of 0: {error}");
                (0, DepthSource::Measured)
            }
            Err(error) => {
                tracing::warn!("approximate count failed, scaling on the last known depth: {error}");
                (self.telemetry.counters.last_depth.load(Ordering::Relaxed), DepthSource::Inferred)
            }
        };
        self.telemetry.counters.record_depth(depth.0, SystemTime::now());
        *self.telemetry.depth_counted.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(tokio::time::Instant::now());
        depth
    }
}
