//! Keeping our lease on a message while its handler runs: renewed at half the lease,
//! beside the handler (never pausing it), and before it starts when the get was slow.
//! Renewals that fall due together go as one batch call where the backend batches.

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt as _;
use tokio::time::Instant;

use crate::handler::IncomingMessage;
use crate::panics::panic_message;
use crate::queue::{MessageId, PopReceipt, QueueError};

use crate::listener::Shared;
use crate::listener::telemetry::Counters;

/// How handling a message ended.
pub(in crate::listener) enum Outcome {
    /// The handler's result, with its answer for the reply queue.
    Handled(anyhow::Result<Option<bytes::Bytes>>),
    /// Shutdown's drain time ran out while the handler was still working.
    Abandoned,
}

/// Our lease on a message: its latest receipt, when it runs out at the latest, and when to
/// renew it next.
pub(in crate::listener) struct Lease {
    pub(in crate::listener) receipt: PopReceipt,
    until: Instant,
    next_renewal: Instant,
    /// Another lease replaced ours: the service gave the message to someone else.
    lost: bool,
    /// A renewal was answered only after the lease it renewed had run out: meanwhile the
    /// service may have handed the message to another host (SQS then takes the old receipt
    /// handle's renewal without an error, so the success proves nothing).
    lapsed: bool,
}

impl Lease {
    pub(in crate::listener) fn new(receipt: PopReceipt, until: Instant, duration: Duration) -> Self {
        Lease { receipt, until, next_renewal: half_way(until, duration), lost: false, lapsed: false }
    }

    /// Takes in the answer to a renewal sent at `sent`.
    fn renewed(&mut self, message: &IncomingMessage, sent: Instant, duration: Duration, renewed: Result<PopReceipt, QueueError>, counters: &Counters) {
        match renewed {
            Ok(receipt) => {
                if Instant::now() > self.until && !self.lapsed {
                    self.lapsed = true;
                    tracing::warn!(id = %message.id, "a lease renewal was answered after the lease ran out (storage calls slower than half the lease?); the message may be handled elsewhere");
                }
                self.receipt = receipt;
                self.until = sent + duration;
                self.next_renewal = half_way(self.until, duration);
                counters.lease_renewals.fetch_add(1, Ordering::Relaxed);
            }
            Err(QueueError::StaleReceipt { .. }) => {
                self.lose(
                    message,
                    counters,
                    "lease lost before it could be renewed (storage calls slower than half the lease?); the message may be handled elsewhere",
                );
            }
            Err(error) => {
                // Retried (the queue's decorator retried already) well before the lease runs out.
                self.next_renewal = Instant::now() + duration / 10;
                tracing::warn!(id = %message.id, "lease renewal failed: {error}");
            }
        }
    }

    fn lose(&mut self, message: &IncomingMessage, counters: &Counters, why: &str) {
        self.lost = true;
        counters.leases_lost.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(id = %message.id, "{why}");
    }
}

/// Half a lease of `duration` before `until`.
fn half_way(until: Instant, duration: Duration) -> Instant {
    until.checked_sub(duration / 2).unwrap_or(until)
}

/// A renewal on its way: when it was sent, and the answer.
type Renewal<'a> = Pin<Box<dyn Future<Output = (Instant, Result<PopReceipt, QueueError>)> + Send + 'a>>;

impl Shared {
    /// Renews a lease for `duration`: with the other renewals that fall due meanwhile (the
    /// messages of one get are leased together), in one batch call where the backend
    /// batches ([`GroupCommit`](super::group_commit::GroupCommit)); else on its own call.
    async fn renew(&self, id: &MessageId, receipt: &PopReceipt, duration: Duration) -> Result<PopReceipt, QueueError> {
        let limit = self.queue.update_batch_limit();
        if limit < 2 {
            return self.queue.update_visibility(id, receipt, duration).await;
        }
        let what = format!("lease renewal of message {id}");
        let entry = (id.clone(), receipt.clone());
        let batching = super::group_commit::Batching { limit, linger: Duration::ZERO, flush: &self.stopping };
        self.delivery.renewals.run(entry, batching, &what, |batch| async move { self.queue.update_visibility_batch(&batch, duration).await }).await
    }

    /// When the get was slow and most of the lease went by before the message arrived,
    /// renews it before the handler starts, so the handler never runs on a lease about to
    /// lapse. False when the lease turned out to be lost, or had run out already: the
    /// service may have handed the message to another host, and SQS takes an old receipt
    /// handle's renewal without an error, so only our own clock can tell.
    pub(in crate::listener) async fn renew_if_lapsing(&self, message: &IncomingMessage, lease: &mut Lease) -> bool {
        let duration = self.settings.lease_duration;
        if lease.until <= Instant::now() {
            let why = "lease ran out before the handler could start (a slow get, or a long wait for a handler slot); the message is left for the queue to hand out again";
            lease.lose(message, &self.telemetry.counters, why);
            return false;
        }
        if lease.until.saturating_duration_since(Instant::now()) < duration / 2 {
            let sent = Instant::now();
            let renewed = self.renew(&message.id, &lease.receipt, duration).await;
            lease.renewed(message, sent, duration, renewed, &self.telemetry.counters);
        }
        if lease.lapsed && !lease.lost {
            let why = "the lease lapsed before the handler could start; the message is left to whoever holds it now";
            lease.lose(message, &self.telemetry.counters, why);
        }
        !lease.lost
    }

    /// Runs the handler with renewals beside it, counted from when the last renewal was
    /// sent, until the handler ends or shutdown abandons it. A renewal still in flight then
    /// is awaited: its new receipt is the one the delete needs.
    pub(in crate::listener) async fn handle_under_lease(&self, message: &IncomingMessage, lease: &mut Lease) -> Outcome {
        let counters = &self.telemetry.counters;
        let with_reply = self.delivery.reply.is_some();
        // A panicking handler is a failing handler: retried, then poisoned.
        let handling = AssertUnwindSafe(async {
            if with_reply { self.handler.handle_with_reply(message).await } else { self.handler.handle(message).await.map(|()| None) }
        })
        .catch_unwind()
        .map(|result| {
            result.unwrap_or_else(|panic| {
                counters.handler_panics.fetch_add(1, Ordering::Relaxed);
                Err(crate::handler::HandlerPanicked(panic_message(&*panic)).into())
            })
        });
        match self.run_under_lease(message, lease, handling).await {
            Some(result) => Outcome::Handled(result),
            None => Outcome::Abandoned,
        }
    }

    /// Runs `work` (the handler's calls for `message`) with renewals beside it, until it
    /// ends (`Some`) or shutdown abandons it (`None`).
    pub(in crate::listener) async fn run_under_lease<T>(&self, message: &IncomingMessage, lease: &mut Lease, work: impl Future<Output = T>) -> Option<T> {
        let counters = &self.telemetry.counters;
        let duration = self.settings.lease_duration;
        let handling = work;
        tokio::pin!(handling);
        let mut renewal: Option<Renewal<'_>> = None;
        let mut outcome = None;
        loop {
            tokio::select! {
                result = &mut handling, if outcome.is_none() => {
                    outcome = Some(Some(result));
                    if renewal.is_none() {
                        break;
                    }
                }
                (sent, renewed) = async { renewal.as_mut().expect("guarded").await }, if renewal.is_some() => {
                    renewal = None;
                    lease.renewed(message, sent, duration, renewed, counters);
                    if outcome.is_some() {
                        break;
                    }
                }
                _ = tokio::time::sleep_until(lease.next_renewal), if renewal.is_none() && outcome.is_none() && !lease.lost => {
                    let (id, receipt) = (&message.id, lease.receipt.clone());
                    renewal = Some(Box::pin(async move {
                        let sent = Instant::now();
                        (sent, self.renew(id, &receipt, duration).await)
                    }));
                }
                _ = self.abandon.cancelled(), if outcome.is_none() => {
                    outcome = Some(None);
                    if renewal.is_none() {
                        break;
                    }
                }
            }
        }
        outcome.expect("the loop ends with an outcome")
    }
}
