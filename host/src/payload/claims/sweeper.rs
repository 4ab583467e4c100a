//! The sweeper: removes claim-check bodies older than the queue's retention, orphans of a
//! crash between a body's put and its message's, or of a delete that failed.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::{ClaimSettings, ClaimStore};

/// What a sweeper has done since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SweepCounts {
    /// Sweeps run (successful or not).
    pub sweeps: u64,
    /// Bodies removed.
    pub removed: u64,
    /// Billed storage transactions made (list calls and deletes, on Azure).
    pub transactions: u64,
    /// Sweeps that failed (logged; the next period tries again).
    pub failures: u64,
}

/// One sweep of `store`: removes bodies older than `retention`, logging what it did.
pub(crate) async fn sweep_once(store: &dyn ClaimStore, retention: Duration, counts: &mut SweepCounts) {
    counts.sweeps += 1;
    match store.sweep(retention).await {
        Ok(report) => {
            counts.removed += report.removed;
            counts.transactions += report.transactions;
            if report.removed > 0 {
                tracing::info!(
                    removed = report.removed,
                    transactions = report.transactions,
                    "claim-check sweep removed orphaned bodies older than {}",
                    humantime::format_duration(retention)
                );
            } else {
                tracing::debug!(transactions = report.transactions, "claim-check sweep found nothing to remove");
            }
        }
        Err(error) => {
            counts.failures += 1;
            tracing::warn!("claim-check sweep of {} failed (tried again next period): {error}", store.describe());
        }
    }
}

/// [`sweeper_task`] spawned, for the unit tests (the service tracks its own tasks).
#[cfg(test)]
pub(crate) fn spawn_sweeper(
    queue: &str,
    store: Arc<dyn ClaimStore>,
    settings: &ClaimSettings,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<SweepCounts> {
    tokio::spawn(sweeper_task(queue, store, settings, stop))
}

/// Sweeps `store` once per `settings.sweep_interval` (the first right away: a host that
/// restarts often still sweeps) until `stop` is cancelled, under a span that carries the
/// queue's name; the future gives the sweeper's final counts.
pub(crate) fn sweeper_task(
    queue: &str,
    store: Arc<dyn ClaimStore>,
    settings: &ClaimSettings,
    stop: CancellationToken,
) -> impl Future<Output = SweepCounts> + Send + 'static {
    let (retention, interval) = (settings.retention, settings.sweep_interval);
    let span = tracing::info_span!("claim_sweeper", queue = %queue, store = %store.describe());
    {
        async move {
            let mut counts = SweepCounts::default();
            let mut ticks = tokio::time::interval(interval);
            // A sweep that ran long (thousands of deletes) is not followed by a burst.
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return counts,
                    _ = ticks.tick() => {}
                }
                tokio::select! {
                    _ = stop.cancelled() => return counts,
                    _ = sweep_once(&*store, retention, &mut counts) => {}
                }
            }
        }
        .instrument(span)
    }
}
