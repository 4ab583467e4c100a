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

use super::Shared;

impl Shared {
    pub(super) fn spawn_scaler(self: &Arc<Self>) {
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
                _ = self.work.notified() => {}
                _ = self.stopping.cancelled() => return,
            }
            self.scale().await;
            // Coalesce raises: at most one decision per scale interval.
            tokio::select! {
                _ = tokio::time::sleep(self.settings.scale_interval) => {}
                _ = self.stopping.cancelled() => return,
            }
        }
    }

    async fn scale(self: &Arc<Self>) {
        let (depth, depth_source) = self.count_depth().await;
        let decision = self.decide_task_count(depth, depth_source).await;
        let target = decision.value;
        self.counters.target_tasks.store(target, Ordering::Relaxed);
        // Idle tasks asleep in their back-off count as active: wake as many as the backlog
        // can keep busy, then start the rest.
        let busy_enough = depth.div_ceil(self.settings.batch_size as u64).min(target as u64);
        for _ in 0..busy_enough {
            self.wake.notify_one();
        }
        let active = self.counters.active_tasks.load(Ordering::Relaxed);
        if target > active {
            tracing::debug!(depth, active, target, source = ?decision.source, "starting dequeue tasks");
            self.start_tasks(target - active);
        }
    }

    /// The queue's approximate depth, remembered for the status; the last known one
    /// (inferred) if the count fails.
    async fn count_depth(&self) -> (u64, DepthSource) {
        let depth = match self.queue.approximate_count().await {
            Ok(depth) => (depth, DepthSource::Measured),
            Err(error) => {
                tracing::warn!("approximate count failed, scaling on the last known depth: {error}");
                (self.counters.last_depth.load(Ordering::Relaxed), DepthSource::Inferred)
            }
        };
        self.counters.record_depth(depth.0, SystemTime::now());
        *self.depth_counted.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(tokio::time::Instant::now());
        depth
    }
}
