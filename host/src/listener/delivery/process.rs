//! Processing a batch: each message goes to the handler under its lease, then its outcome
//! settles it: deleted on success, hidden for a retry delay on failure, poisoned after
//! `max_dequeue_count`, released at once when shutdown's drain time runs out.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt as _;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::handler::{AnswerTooLarge, HostError, IncomingMessage, PUSHED_BACK_POISON_DEQUEUES, PushedBack, RetryAfterAdjustment};
use crate::queue::{Message, MessageId, PopReceipt, QueueError};

use super::failures::{FailedDelivery, FailureVerdict};
use super::groups::{self, Entry, Turn, Verdict};
use super::items::{ItemResult, Unpacked};
use super::lease::{Lease, Outcome};
use super::replies::ReplyNotPut;
use crate::listener::Shared;
use crate::listener::pool::{CallPermit, PermitGrant};
use crate::listener::telemetry::CallEnd;
use crate::payload::Envelope;

/// How a handler call ended, for the concurrency decision.
fn call_end<T>(result: &anyhow::Result<T>) -> CallEnd {
    match result {
        Ok(_) => CallEnd::Succeeded,
        Err(error) if error.is::<PushedBack>() => CallEnd::PushedBack,
        Err(_) => CallEnd::Failed,
    }
}

/// The message's offloaded body could not be fetched for now (the claim store failed after
/// its retries): neither the message's fault nor the host's, so it is retried like a
/// [`HostError`] without counting towards poisoning, and counted with the claim-check calls
/// (`ebb_claim_gave_up_total{call="fetch"}`), not as a handler call the host could not make.
#[derive(Debug, thiserror::Error)]
#[error("fetching the message's offloaded body: {0:#}")]
struct BodyNotFetched(anyhow::Error);

/// The message an envelope of one plain message stands for, with the trace context its item
/// carries (the backend's own first), which the handling joins; its body too, when inline
/// (the envelope was only there to carry the context).
fn plain_message(incoming: IncomingMessage, envelope: Envelope) -> (IncomingMessage, Option<Envelope>) {
    let [item] = envelope.items.as_slice() else { unreachable!("the decoder refuses a plain message's envelope of more than one item") };
    let trace = incoming.trace.clone().or_else(|| item.trace.clone());
    if incoming.trace.is_none() {
        crate::telemetry::join(&tracing::Span::current(), trace.as_ref());
    }
    match &item.body {
        crate::payload::Body::Inline(body) => (IncomingMessage { body: body.clone(), trace, ..incoming }, None),
        crate::payload::Body::ClaimCheck(_) => (IncomingMessage { trace, ..incoming }, Some(envelope)),
    }
}

impl Shared {
    /// Processes a batch's messages side by side; `leased_until` is when their lease runs
    /// out at the latest, counted from when the get was sent.
    /// Each message takes one of the `grant`'s handler slots; those left over (a short get)
    /// are given back at once.
    pub(in crate::listener) async fn process_batch(self: &Arc<Self>, messages: Vec<Message>, mut grant: PermitGrant<'_>, leased_until: Instant) {
        let processing: Vec<_> = messages
            .into_iter()
            .map(|message| {
                let span = crate::telemetry::handle_span(self.queue.name(), &message.id, message.dequeue_count);
                crate::telemetry::join(&span, message.trace.as_ref());
                self.process(message, grant.take_one(), leased_until).instrument(span)
            })
            .collect();
        drop(grant);
        futures::future::join_all(processing).await;
    }

    /// [`Shared::process_batch`] on a task of its own (tracked: shutdown waits for it), so
    /// the dequeue task goes on getting as soon as handler slots are free, rather than
    /// waiting for its batch's slowest call.
    pub(in crate::listener) fn process_batch_apart(self: &Arc<Self>, messages: Vec<Message>, grant: PermitGrant<'_>, leased_until: Instant) {
        let (shared, slots) = (self.clone(), grant.into_count());
        let processing = async move {
            let grant = shared.pool.slots.adopt(slots);
            if let Err(panic) = AssertUnwindSafe(shared.process_batch(messages, grant, leased_until)).catch_unwind().await {
                shared.task_panicked("a batch's processing", &*panic);
            }
        };
        self.tasks.spawn(processing.in_current_span());
    }

    /// `slot` is the message's handler slot, given back as soon as the handler call ends
    /// (the delete that follows is storage's work, not the app's).
    async fn process(self: &Arc<Self>, message: Message, slot: Option<CallPermit<'_>>, leased_until: Instant) {
        let ahead = slot.is_none().then(|| self.pool.fetched_ahead());
        // Released when processing ends, however it ends (a panic, a drop at shutdown).
        let Some(_claim) = self.telemetry.counters.claim(&message.id) else {
            // Our own lease on it expired and we leased it again: it is already being handled
            // here. Leave this lease to run out rather than handling it twice at once.
            tracing::warn!(id = %message.id, "message is already being handled on this host; skipping the duplicate lease");
            return;
        };
        // Entered before any await: a batch's messages of one group take their turns in its order.
        let entry = message.fifo.as_ref().map(|fifo| self.delivery.groups.enter(&fifo.group, &message.id));
        let Message { id, pop_receipt, dequeue_count, inserted_at, body, defect, trace, .. } = message;
        let incoming = IncomingMessage { queue: self.queue.name().to_string(), id, dequeue_count, inserted_at, body, item: None, trace };
        let mut lease = Lease::new(pop_receipt, leased_until, self.settings.lease_duration);
        let (_turn, slot) = match entry {
            None => (None, slot),
            Some(Entry::Now(turn)) => (Some(turn), slot),
            Some(Entry::Wait(told)) => {
                // Its slot goes to other work meanwhile; it takes one when its turn comes.
                drop(slot);
                match self.wait_for_turn(&incoming, &mut lease, told).await {
                    Some(turn) => (Some(turn), None),
                    None => return,
                }
            }
        };
        if let Some(defect) = defect {
            drop(slot);
            // A body the store cannot vouch for never reaches the handler.
            self.poison(&incoming, &lease.receipt, &defect).await;
            return;
        }
        let envelope = match self.unpack(&incoming.body) {
            Unpacked::Plain => None,
            Unpacked::Envelope(envelope) => Some(envelope),
            Unpacked::Broken(reason) => {
                drop(slot);
                self.poison(&incoming, &lease.receipt, &reason).await;
                return;
            }
        };
        let (incoming, envelope) = match envelope {
            Some(envelope) if envelope.message => plain_message(incoming, envelope),
            other => (incoming, other),
        };
        // A message fetched ahead of the free slots (a fast app) waits here for one, briefly,
        // its lease renewed should the wait be long.
        let slot = match slot {
            Some(slot) => slot,
            None => {
                let waited = self.run_under_lease(&incoming, &mut lease, self.pool.slots.acquire(1)).await;
                let Some(mut grant) = waited else {
                    self.settle(&incoming, &lease.receipt, Outcome::Abandoned, Duration::ZERO).await;
                    return;
                };
                grant.take_one().expect("a grant holds at least one slot")
            }
        };
        drop(ahead);
        if !self.renew_if_lapsing(&incoming, &mut lease).await {
            return;
        }
        self.deliver(&incoming, &mut lease, envelope, slot).await;
    }

    /// Hands the message to the app under its lease (an offloaded body fetched first, an
    /// envelope's items one by one), gives its handler slot back when the call ends, and
    /// settles it.
    async fn deliver(self: &Arc<Self>, incoming: &IncomingMessage, lease: &mut Lease, envelope: Option<Envelope>, slot: CallPermit<'_>) {
        let started = Instant::now();
        if let Some(envelope) = envelope.as_ref().filter(|envelope| envelope.message) {
            self.process_offloaded_message(incoming, lease, envelope, started).await;
            drop(slot);
            return;
        }
        if let Some(envelope) = envelope {
            let delivered = self.run_under_lease(incoming, lease, self.deliver_items(incoming, &envelope)).await;
            let latency = started.elapsed();
            drop(slot);
            self.record_call_latency(latency);
            match delivered {
                Some(results) => {
                    let all_ok = results.iter().all(|(r, _)| matches!(r, ItemResult::Handled));
                    self.telemetry.counters.calls.lock().unwrap().record(if all_ok { CallEnd::Succeeded } else { CallEnd::Failed }, latency);
                    self.settle_envelope(incoming, &lease.receipt, &envelope, results, latency).await;
                }
                None => {
                    self.settle(incoming, &lease.receipt, Outcome::Abandoned, latency).await;
                }
            }
            return;
        }
        let outcome = self.handle_under_lease(incoming, lease).await;
        let latency = started.elapsed();
        drop(slot);
        self.record_call_latency(latency);
        if let Outcome::Handled(result) = &outcome {
            self.telemetry.counters.calls.lock().unwrap().record(call_end(result), latency);
        }
        self.settle(incoming, &lease.receipt, outcome, latency).await;
    }

    /// Waits, its lease renewed meanwhile, for the turn of a message whose group is busy:
    /// `None` when it was released instead (the one before it is to come back, or shutdown).
    async fn wait_for_turn(self: &Arc<Self>, message: &IncomingMessage, lease: &mut Lease, told: oneshot::Receiver<Verdict>) -> Option<Turn> {
        match self.run_under_lease(message, lease, groups::wait(told)).await {
            Some(Verdict::Go(turn)) => Some(turn),
            Some(Verdict::Released) => {
                tracing::debug!(id = %message.id, "released unhandled: the message before it in its group is to come back, and must not be overtaken");
                if let Err(error) = self.queue.update_visibility(&message.id, &lease.receipt, Duration::ZERO).await {
                    tracing::warn!(id = %message.id, "could not release it (visible again when the lease runs out): {error}");
                }
                None
            }
            None => {
                self.settle(message, &lease.receipt, Outcome::Abandoned, Duration::ZERO).await;
                None
            }
        }
    }

    /// A plain message whose body was offloaded ([`crate::payload::FLAG_MESSAGE`]): its body
    /// fetched from the claim store and handled as the message it was sent as. Retried and
    /// poisoned as the envelope (the reference: its body stays in the store until the
    /// message is handled and deleted, and the sweeper's retention outlives a poison copy).
    async fn process_offloaded_message(self: &Arc<Self>, incoming: &IncomingMessage, lease: &mut Lease, envelope: &crate::payload::Envelope, started: Instant) {
        let [crate::payload::Item { body: crate::payload::Body::ClaimCheck(check), .. }] = envelope.items.as_slice() else {
            unreachable!("the decoder refuses an offloaded message that is not one claim check")
        };
        let fetched = self.run_under_lease(incoming, lease, self.claim_body(0, check)).await;
        let outcome = match fetched {
            None => Outcome::Abandoned,
            Some(Err(ItemResult::Refused(reason))) => {
                self.poison(incoming, &lease.receipt, &format!("the message's offloaded body: {reason}")).await;
                return;
            }
            // Storage's failure, not the message's: retried without counting towards poisoning.
            Some(Err(ItemResult::Failed(error))) => Outcome::Handled(Err(BodyNotFetched(error).into())),
            Some(Err(ItemResult::Handled)) => unreachable!("a fetch does not handle"),
            Some(Ok(body)) => {
                let delivered = IncomingMessage { body, ..incoming.clone() };
                self.handle_under_lease(&delivered, lease).await
            }
        };
        let latency = started.elapsed();
        self.record_call_latency(latency);
        if let Outcome::Handled(result) = &outcome {
            self.telemetry.counters.calls.lock().unwrap().record(call_end(result), latency);
        }
        if self.settle(incoming, &lease.receipt, outcome, latency).await
            && let Some(claims) = &self.delivery.claims
            && let Err(error) = claims.delete(check).await
        {
            tracing::warn!(id = %incoming.id, location = %check.location, "offloaded body not deleted (the sweeper removes it later): {error}");
        }
    }

    /// Acts on how handling ended, with the latest receipt. True when the message was
    /// handled and deleted.
    async fn settle(self: &Arc<Self>, message: &IncomingMessage, receipt: &PopReceipt, outcome: Outcome, latency: Duration) -> bool {
        match outcome {
            Outcome::Handled(Ok(reply)) => return self.settle_handled(message, receipt, reply, latency).await,
            Outcome::Handled(Err(error)) if error.is::<AnswerTooLarge>() => {
                // Handling it again would give an answer as large (and redo the work).
                self.telemetry.counters.record_failure(latency);
                self.poison(message, receipt, &format!("{error:#}")).await;
            }
            Outcome::Handled(Err(error)) if error.is::<HostError>() || error.is::<BodyNotFetched>() => {
                // Not the message's fault: retried later, never poisoned for it.
                if error.is::<HostError>() {
                    self.telemetry.counters.host_errors.fetch_add(1, Ordering::Relaxed);
                }
                let delay = self.settings.retry_delay(1);
                if let Some(suppressed) = self.telemetry.failure_log.allow() {
                    tracing::warn!(id = %message.id, ?delay, suppressed, "{error:#}; the message is retried later and this try does not count towards poisoning");
                }
                crate::telemetry::outcome("retried");
                self.retry_later(message, receipt, delay).await;
            }
            Outcome::Handled(Err(error)) if error.is::<PushedBack>() => self.settle_pushed_back(message, receipt, &error).await,
            Outcome::Handled(Err(error)) => {
                self.telemetry.counters.record_failure(latency);
                let reason = format!("{error:#}");
                let failed = FailedDelivery { message, error: &error, tries: message.dequeue_count, item: None, latency };
                match self.failure_verdict(failed, reason.clone()).await {
                    FailureVerdict::Poison(reason) => self.poison(message, receipt, &reason).await,
                    FailureVerdict::Retry(delay) => {
                        if let Some(suppressed) = self.telemetry.failure_log.allow() {
                            tracing::warn!(id = %message.id, dequeue_count = message.dequeue_count, ?delay, suppressed, "handler failed, retrying later: {reason}");
                        }
                        crate::telemetry::outcome("retried");
                        self.retry_later(message, receipt, delay).await;
                    }
                }
            }
            Outcome::Abandoned => {
                crate::telemetry::outcome("released");
                self.telemetry.counters.released_on_shutdown.fetch_add(1, Ordering::Relaxed);
                if let Err(error) = self.queue.update_visibility(&message.id, receipt, Duration::ZERO).await {
                    tracing::warn!(id = %message.id, "could not release on shutdown (visible again when the lease runs out): {error}");
                }
            }
        }
        false
    }

    /// A handled message: its answer put on the reply queue (retried, or poisoned when it
    /// can never be put), then the message deleted. True when it was deleted (or its delete
    /// lingers in the background, where nothing waits on it: see `deletes_linger`).
    async fn settle_handled(self: &Arc<Self>, message: &IncomingMessage, receipt: &PopReceipt, reply: Option<bytes::Bytes>, latency: Duration) -> bool {
        if let Some(reply) = reply
            && let Err(refusal) = self.put_reply(message, None, &reply).await
        {
            // The answer must reach the reply queue before the request goes: retried,
            // or poisoned at once when it can never be put.
            self.telemetry.counters.record_failure(latency);
            let delay = self.settings.retry_delay(message.dequeue_count);
            match refusal {
                ReplyNotPut::Never(reason) => self.poison(message, receipt, &reason).await,
                ReplyNotPut::NotNow(error) if message.dequeue_count >= self.max_dequeue_count() => self.poison(message, receipt, &format!("{error:#}")).await,
                ReplyNotPut::NotNow(error) => {
                    if let Some(suppressed) = self.telemetry.failure_log.allow() {
                        tracing::warn!(id = %message.id, ?delay, suppressed, "{error:#}; retrying later");
                    }
                    crate::telemetry::outcome("retried");
                    self.retry_later(message, receipt, delay).await;
                }
            }
            return false;
        }
        crate::telemetry::outcome("deleted");
        if self.deletes_linger() {
            // Nothing waits on this delete: it may wait for the next ones to share a batch.
            self.delete_handled_later(&message.id, receipt, latency);
            return true;
        }
        // Counted once the delete has returned: `processed` means handled and deleted.
        let deleted = self.delete_settled(&message.id, receipt).await;
        if deleted.is_ok() {
            self.delivery.groups.deleted(&message.id);
        }
        self.telemetry.counters.record_success(latency);
        if let Err(error) = deleted {
            // The work was done; the message may be handled again (at least once).
            tracing::warn!(id = %message.id, "handled, but the delete failed: {error}");
            return false;
        }
        true
    }

    /// The app pushed back (HTTP 429 or 503): retried after its `Retry-After`, not counted
    /// as a failure, poisoned only after many deliveries.
    async fn settle_pushed_back(self: &Arc<Self>, message: &IncomingMessage, receipt: &PopReceipt, error: &anyhow::Error) {
        let pushed = error.downcast_ref::<PushedBack>().expect("settled as a push back");
        self.telemetry.counters.pushed_back.fetch_add(1, Ordering::Relaxed);
        let now = std::time::UNIX_EPOCH + Duration::from_millis(self.rule.clock.now_ms());
        let (delay, adjustment) = pushed.retry_after.delay(now, self.settings.retry_delay(1), self.settings.max_retry_delay);
        match adjustment {
            Some(RetryAfterAdjustment::Capped) => self.telemetry.counters.retry_after_capped.fetch_add(1, Ordering::Relaxed),
            Some(RetryAfterAdjustment::Malformed | RetryAfterAdjustment::Past) => self.telemetry.counters.retry_after_unusable.fetch_add(1, Ordering::Relaxed),
            None => 0,
        };
        if message.dequeue_count >= PUSHED_BACK_POISON_DEQUEUES.max(self.settings.max_dequeue_count) {
            self.poison(message, receipt, &format!("{error:#} (dequeued {} times)", message.dequeue_count)).await;
            return;
        }
        if let Some(suppressed) = self.telemetry.failure_log.allow() {
            tracing::info!(id = %message.id, ?delay, ?adjustment, suppressed, "{error:#}; the message is retried then (not counted as a failure)");
        }
        crate::telemetry::outcome("pushed_back");
        self.retry_later(message, receipt, delay).await;
    }

    /// Hides a failed message for its retry delay.
    async fn retry_later(self: &Arc<Self>, message: &IncomingMessage, receipt: &PopReceipt, delay: Duration) {
        if let Err(error) = self.hide_for(&message.id, receipt, delay).await {
            tracing::warn!(id = %message.id, "could not set the retry delay (the lease will run out instead): {error}");
        }
    }

    /// Hides a message for `delay`, and (with push) wakes the queue when it is visible again.
    /// If the delay cannot be set, the message comes back when our lease runs out: the wake
    /// waits for that instead.
    pub(in crate::listener) async fn hide_for(self: &Arc<Self>, id: &MessageId, receipt: &PopReceipt, delay: Duration) -> Result<(), QueueError> {
        let hidden = self.queue.update_visibility(id, receipt, delay).await;
        self.wake_after(if hidden.is_ok() { delay } else { self.settings.lease_duration });
        hidden.map(drop)
    }
}
