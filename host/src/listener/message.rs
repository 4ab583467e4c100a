//! Processing one message: the handler, lease renewal while it runs, then delete on
//! success, release with a retry delay on failure, or poison after `max_dequeue_count`.

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use anyhow::anyhow;
use futures::FutureExt as _;

use crate::handler::{HostError, IncomingMessage};
use crate::panics::panic_message;
use crate::queue::{Message, MessageId, PopReceipt, QueueError};

use super::Shared;
use super::state::{Counters, PoisonForm};

/// Our lease on a message: its latest receipt, when it runs out at the latest, and when to
/// renew it next.
struct Lease {
    receipt: PopReceipt,
    until: Instant,
    next_renewal: Instant,
    /// Another lease replaced ours: the service gave the message to someone else.
    lost: bool,
}

impl Lease {
    fn new(receipt: PopReceipt, until: Instant, duration: Duration) -> Self {
        Lease { receipt, until, next_renewal: half_way(until, duration), lost: false }
    }

    /// Takes in the answer to a renewal sent at `sent`.
    fn renewed(&mut self, message: &IncomingMessage, sent: Instant, duration: Duration, renewed: Result<PopReceipt, QueueError>, counters: &Counters) {
        match renewed {
            Ok(receipt) => {
                self.receipt = receipt;
                self.until = sent + duration;
                self.next_renewal = half_way(self.until, duration);
                counters.lease_renewals.fetch_add(1, Ordering::Relaxed);
            }
            Err(QueueError::StaleReceipt { .. }) => {
                self.lost = true;
                counters.leases_lost.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(id = %message.id, "lease lost before it could be renewed (storage calls slower than half the lease?); the message may be handled elsewhere");
            }
            Err(error) => {
                // Retried (the queue's decorator retried already) well before the lease runs out.
                self.next_renewal = Instant::now() + duration / 10;
                tracing::warn!(id = %message.id, "lease renewal failed: {error}");
            }
        }
    }
}

/// Half a lease of `duration` before `until`.
fn half_way(until: Instant, duration: Duration) -> Instant {
    until.checked_sub(duration / 2).unwrap_or(until)
}

enum Outcome {
    Handled(anyhow::Result<()>),
    /// Shutdown's drain time ran out while the handler was still working.
    Abandoned,
}

impl Shared {
    /// Processes one leased message; `leased_until` is when its lease runs out at the
    /// latest, counted from when the get was sent.
    pub(super) async fn process(self: &Arc<Self>, message: Message, leased_until: Instant) {
        let counters = &self.counters;
        // Released when processing ends, however it ends (a panic, a drop at shutdown).
        let Some(_claim) = counters.claim(&message.id) else {
            // Our own lease on it expired and we leased it again: it is already being handled
            // here. Leave this lease to run out rather than handling it twice at once.
            tracing::warn!(id = %message.id, "message is already being handled on this host; skipping the duplicate lease");
            return;
        };
        let incoming = IncomingMessage {
            queue: self.queue.name().to_string(),
            id: message.id.clone(),
            dequeue_count: message.dequeue_count,
            inserted_at: message.inserted_at,
            body: message.body,
        };
        let duration = self.settings.lease_duration;
        let mut lease = Lease::new(message.pop_receipt, leased_until, duration);
        if let Some(defect) = message.defect {
            // A body the store cannot vouch for never reaches the handler.
            self.poison(&incoming, &lease.receipt, &defect).await;
            return;
        }
        if lease.until.saturating_duration_since(Instant::now()) < duration / 2 {
            // The get was slow: most of the lease went by before the message arrived. Renew
            // before the handler starts, so it never runs on a lease about to lapse.
            let sent = Instant::now();
            let renewed = self.queue.update_visibility(&incoming.id, &lease.receipt, duration).await;
            lease.renewed(&incoming, sent, duration, renewed, counters);
            if lease.lost {
                return;
            }
        }
        let started = Instant::now();
        // A panicking handler is a failing handler: retried, then poisoned.
        let handling = AssertUnwindSafe(self.handler.handle(&incoming)).catch_unwind().map(|result| {
            result.unwrap_or_else(|panic| {
                counters.handler_panics.fetch_add(1, Ordering::Relaxed);
                Err(anyhow!("handler panicked: {}", panic_message(&*panic)))
            })
        });
        tokio::pin!(handling);
        // Renewals run beside the handler (never pausing it) at half the lease, counted from
        // when the last renewal was sent. One still in flight when the handler ends is awaited:
        // its new receipt is the one the delete needs.
        let mut renewal: Option<Pin<Box<dyn Future<Output = (Instant, Result<PopReceipt, QueueError>)> + Send + '_>>> = None;
        let mut outcome = None;
        loop {
            tokio::select! {
                result = &mut handling, if outcome.is_none() => {
                    outcome = Some(Outcome::Handled(result));
                    if renewal.is_none() {
                        break;
                    }
                }
                (sent, renewed) = async { renewal.as_mut().expect("guarded").await }, if renewal.is_some() => {
                    renewal = None;
                    lease.renewed(&incoming, sent, duration, renewed, counters);
                    if outcome.is_some() {
                        break;
                    }
                }
                _ = tokio::time::sleep_until(lease.next_renewal), if renewal.is_none() && outcome.is_none() && !lease.lost => {
                    let (queue, id, receipt) = (&self.queue, &incoming.id, lease.receipt.clone());
                    renewal = Some(Box::pin(async move {
                        let sent = Instant::now();
                        (sent, queue.update_visibility(id, &receipt, duration).await)
                    }));
                }
                _ = self.abandon.cancelled(), if outcome.is_none() => {
                    outcome = Some(Outcome::Abandoned);
                    if renewal.is_none() {
                        break;
                    }
                }
            }
        }
        let outcome = outcome.expect("the loop ends with an outcome");
        let receipt = lease.receipt;
        let latency = started.elapsed();
        match outcome {
            Outcome::Handled(Ok(())) => {
                // Counted once the delete has returned: `processed` means handled and deleted.
                let deleted = self.queue.delete(&incoming.id, &receipt).await;
                counters.record_success(latency);
                if let Err(error) = deleted {
                    // The work was done; the message may be handled again (at least once).
                    tracing::warn!(id = %incoming.id, "handled, but the delete failed: {error}");
                }
            }
            Outcome::Handled(Err(error)) if error.is::<HostError>() => {
                // Not the message's fault: retried later, never poisoned for it.
                counters.host_errors.fetch_add(1, Ordering::Relaxed);
                let delay = self.settings.retry_delay(1);
                if let Some(suppressed) = self.failure_log.allow() {
                    tracing::warn!(id = %incoming.id, ?delay, suppressed, "{error:#}; the message is retried later and this try does not count towards poisoning");
                }
                match self.queue.update_visibility(&incoming.id, &receipt, delay).await {
                    Ok(_) => self.wake_after(delay),
                    Err(error) => {
                        tracing::warn!(id = %incoming.id, "could not set the retry delay (the lease will run out instead): {error}");
                        self.wake_after(self.settings.lease_duration);
                    }
                }
            }
            Outcome::Handled(Err(error)) => {
                counters.record_failure(latency);
                let reason = format!("{error:#}");
                if incoming.dequeue_count >= self.settings.max_dequeue_count {
                    self.poison(&incoming, &receipt, &reason).await;
                } else {
                    let delay = self.settings.retry_delay(incoming.dequeue_count);
                    if let Some(suppressed) = self.failure_log.allow() {
                        tracing::warn!(id = %incoming.id, dequeue_count = incoming.dequeue_count, ?delay, suppressed, "handler failed, retrying later: {reason}");
                    }
                    match self.queue.update_visibility(&incoming.id, &receipt, delay).await {
                        Ok(_) => self.wake_after(delay),
                        Err(error) => {
                            tracing::warn!(id = %incoming.id, "could not set the retry delay (the lease will run out instead): {error}");
                            self.wake_after(self.settings.lease_duration);
                        }
                    }
                }
            }
            Outcome::Abandoned => {
                counters.released_on_shutdown.fetch_add(1, Ordering::Relaxed);
                if let Err(error) = self.queue.update_visibility(&incoming.id, &receipt, Duration::ZERO).await {
                    tracing::warn!(id = %incoming.id, "could not release on shutdown (visible again when the lease runs out): {error}");
                }
            }
        }
    }

    /// Moves a message that cannot be handled (failed `max_dequeue_count` times, or
    /// corrupt) to the poison queue: put there first, delete here after, so a crash in
    /// between duplicates rather than loses it. The poison queue gets a JSON envelope with
    /// the reason; when that does not fit its size limit, the body as it is (as Azure
    /// Functions moves it), and the reason stays in the log, the status and the metrics.
    async fn poison(self: &Arc<Self>, message: &IncomingMessage, receipt: &PopReceipt, reason: &str) {
        let (mut form, mut put) = (PoisonForm::Body, None);
        if self.settings.poison_envelope {
            let envelope = serde_json::to_vec(&PoisonEnvelope::new(message, reason)).expect("the envelope serialises");
            match self.poison.put(&envelope, Duration::ZERO).await {
                Err(QueueError::MessageTooLarge { .. }) => {}
                other => (form, put) = (PoisonForm::Envelope, Some(other)),
            }
        }
        let put = match put {
            Some(put) => put,
            None => self.poison.put(&message.body, Duration::ZERO).await,
        };
        match put {
            Ok(_) => {
                self.counters.record_poison(&message.id, reason, form);
                if let Some(suppressed) = self.poison_log.allow() {
                    tracing::warn!(
                        id = %message.id,
                        dequeue_count = message.dequeue_count,
                        poison_queue = %self.poison.name(),
                        form = form.as_str(),
                        suppressed,
                        "message moved to the poison queue: {reason}"
                    );
                }
                if let Err(error) = self.queue.delete(&message.id, receipt).await {
                    tracing::warn!(id = %message.id, "poisoned, but the delete failed (it may be poisoned twice): {error}");
                }
            }
            Err(error) => {
                // Left in place, but out of the way for the longest retry delay: a message the
                // poison queue refuses (too large once encoded, the queue gone) would
                // otherwise come back at every lease, and with it this line.
                self.counters.poison_failures.fetch_add(1, Ordering::Relaxed);
                let delay = self.settings.max_retry_delay;
                if let Some(suppressed) = self.poison_log.allow() {
                    tracing::error!(id = %message.id, ?delay, suppressed, "cannot poison ({reason}), leaving the message in place, tried again after {delay:?}: {error}");
                }
                match self.queue.update_visibility(&message.id, receipt, delay).await {
                    Ok(_) => self.wake_after(delay),
                    Err(error) => {
                        tracing::debug!(id = %message.id, "could not set the delay before the next poisoning try (it comes back after its lease): {error}");
                        self.wake_after(self.settings.lease_duration);
                    }
                }
            }
        }
    }
}

/// What `<queue>-poison` holds for each poisoned message (JSON).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct PoisonEnvelope {
    /// The queue the message came from.
    pub queue: String,
    /// Its id there.
    pub original_id: MessageId,
    /// Times it was leased.
    pub dequeue_count: u32,
    /// The last handler error.
    pub error: String,
    /// When it was put, RFC 3339.
    pub inserted_at: String,
    /// When it was poisoned, RFC 3339.
    pub poisoned_at: String,
    /// The body, if it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The body as hex, if it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_hex: Option<String>,
}

impl PoisonEnvelope {
    fn new(message: &IncomingMessage, reason: &str) -> Self {
        let text = String::from_utf8(message.body.clone()).ok();
        PoisonEnvelope {
            queue: message.queue.clone(),
            original_id: message.id.clone(),
            dequeue_count: message.dequeue_count,
            error: reason.to_string(),
            inserted_at: humantime::format_rfc3339_millis(message.inserted_at).to_string(),
            poisoned_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            body_hex: text.is_none().then(|| hex::encode(&message.body)),
            body: text,
        }
    }
}
