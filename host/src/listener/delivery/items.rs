//! Messages that are envelopes (issue 20): their items go to the handler one by one (or in
//! batches), and fail one by one. The failed items are put back as a new envelope, each
//! counted one more attempt, and an item out of attempts goes to the poison queue alone,
//! both BEFORE the envelope is deleted: a crash in between duplicates items, never loses one.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::anyhow;
use bytes::Bytes;
use futures::{FutureExt as _, StreamExt as _};
use tracing::Instrument as _;

use crate::handler::{IncomingMessage, ItemPosition};
use crate::panics::panic_message;
use crate::payload::{AllowedReferences, Body, ClaimCheck, Decoded, Delivery, Envelope, Item, Limits, decode, decode_text};
use crate::queue::{MessageId, PopReceipt, QueueError};

use super::failures::{FailedDelivery, FailureVerdict};
use super::replies::ReplyNotPut;
use crate::listener::Shared;
use crate::listener::telemetry::PoisonForm;

/// What a message turned out to be.
pub(in crate::listener) enum Unpacked {
    /// Not an envelope: delivered as it is.
    Plain,
    /// An envelope and its items.
    Envelope(Envelope),
    /// A broken envelope: the poison reason.
    Broken(String),
}

/// The base64 of the envelope's magic: how an envelope written as text starts.
const TEXT_MAGIC: &[u8] = b"wUVCQg0K";

/// How one item's delivery ended.
pub(in crate::listener) enum ItemResult {
    /// Handled, and its answer (if any) put on the reply queue.
    Handled,
    /// The handler failed (or panicked): retried alone, or poisoned once out of attempts.
    Failed(anyhow::Error),
    /// It can never be delivered here: poisoned alone with this reason.
    Refused(String),
}

impl Shared {
    /// Whether `body` is an envelope (raw, or as base64 text from a queue of text).
    pub(in crate::listener) fn unpack(&self, body: &[u8]) -> Unpacked {
        // Claim checks into this queue's own store are read (without a store, refused item
        // by item); any other reference is a hostile envelope.
        let limits = match &self.delivery.claims {
            Some(claims) => Limits { references: claims.allowed(), max_claim_check_bytes: claims.max_bytes(), ..Limits::default() },
            None => Limits {
                references: AllowedReferences { azure: None, embedded_queue: Some(self.queue.name().to_string()), s3_bucket: None },
                ..Limits::default()
            },
        };
        let decoded = match decode(body, &limits) {
            Ok(Decoded::NotAnEnvelope) if body.starts_with(TEXT_MAGIC) => match std::str::from_utf8(body) {
                Ok(text) => decode_text(text, &limits),
                Err(_) => Ok(Decoded::NotAnEnvelope),
            },
            other => other,
        };
        match decoded {
            Ok(Decoded::NotAnEnvelope) => Unpacked::Plain,
            Ok(Decoded::Envelope(envelope)) => Unpacked::Envelope(envelope),
            Err(error) => Unpacked::Broken(format!("broken envelope: {error}")),
        }
    }

    /// The handler's message for item `index` of `envelope`, carried by `message`.
    fn item_message(message: &IncomingMessage, envelope: &Envelope, index: usize, body: Bytes) -> IncomingMessage {
        let attempts = envelope.items[index].attempts;
        IncomingMessage {
            body,
            dequeue_count: attempts.saturating_add(message.dequeue_count),
            item: Some(ItemPosition { index: index as u32, count: envelope.items.len() as u32, attempts }),
            trace: envelope.items[index].trace.clone().or_else(|| message.trace.clone()),
            ..message.clone()
        }
    }

    /// Delivers the envelope's items: up to `max_concurrent_calls` at once, each in its own
    /// span, or in batches of `max_batch_items`, each call in one span. One result per item,
    /// in order, with the item's own span (none in a batch) to record its settling in.
    pub(in crate::listener) async fn deliver_items(&self, message: &IncomingMessage, envelope: &Envelope) -> Vec<(ItemResult, tracing::Span)> {
        let mut results: Vec<Option<(ItemResult, tracing::Span)>> = envelope.items.iter().map(|_| None).collect();
        let width = self.settings.max_concurrent_calls.max(1) as usize;
        let mut single = Vec::new();
        let mut batchable = Vec::new();
        for (index, item) in envelope.items.iter().enumerate() {
            match &item.body {
                // Fetched in its own call's turn, so at most `width` bodies are in memory;
                // and alone, never in a batch.
                Body::ClaimCheck(check) => single.push((index, Err(check.clone()))),
                // A batch is a JSON array: an item that is not UTF-8 goes alone.
                Body::Inline(body) if self.delivery.payload.delivery == Delivery::Batch && std::str::from_utf8(body).is_ok() => {
                    batchable.push((index, body.clone()))
                }
                Body::Inline(body) => single.push((index, Ok(body.clone()))),
            }
        }
        let singles = futures::stream::iter(single)
            .map(|(index, body)| {
                // Made here, within the envelope's span: its child or link.
                let item = &envelope.items[index];
                let span = crate::telemetry::handle_item_span(self.queue.name(), &message.id, index, item.attempts, item.trace.as_ref());
                let delivered = self.deliver_item(message, envelope, index, body).instrument(span.clone());
                async move { (index, delivered.await, span) }
            })
            .buffer_unordered(width)
            .collect::<Vec<_>>();
        let batches = futures::stream::iter(batchable.chunks(self.delivery.payload.max_batch_items.max(1) as usize).map(<[_]>::to_vec).collect::<Vec<_>>())
            .map(|batch| {
                let items: Vec<IncomingMessage> = batch.iter().map(|(index, body)| Self::item_message(message, envelope, *index, body.clone())).collect();
                let carried = batch.iter().map(|(index, _)| envelope.items[*index].trace.as_ref());
                let span = crate::telemetry::handle_batch_span(self.queue.name(), &message.id, carried);
                async move {
                    let answers = match AssertUnwindSafe(self.handler.handle_batch(&items)).catch_unwind().await {
                        Ok(answers) if answers.len() == items.len() => answers,
                        Ok(answers) => {
                            let reason = format!("the handler answered {} results for a batch of {}", answers.len(), items.len());
                            items.iter().map(|_| Err(anyhow!("{reason}"))).collect()
                        }
                        Err(panic) => {
                            self.telemetry.counters.handler_panics.fetch_add(1, Ordering::Relaxed);
                            let message = panic_message(&*panic);
                            items.iter().map(|_| Err(crate::handler::HandlerPanicked(message.clone()).into())).collect()
                        }
                    };
                    batch.iter().map(|(index, _)| *index).zip(answers).collect::<Vec<_>>()
                }
                .instrument(span)
            })
            .buffer_unordered(width)
            .collect::<Vec<_>>();
        let (singles, batches) = tokio::join!(singles, batches);
        for (index, result, span) in singles {
            results[index] = Some((result, span));
        }
        for (index, result) in batches.into_iter().flatten() {
            let result = match result {
                Ok(()) => ItemResult::Handled,
                Err(error) => ItemResult::Failed(error),
            };
            results[index] = Some((result, tracing::Span::none()));
        }
        results.into_iter().map(|result| result.expect("every item has a result")).collect()
    }

    /// Delivers item `index` alone: its body (`Err`: fetched from the claim store first) to
    /// the handler, and its answer, if any, to the reply queue.
    async fn deliver_item(&self, message: &IncomingMessage, envelope: &Envelope, index: usize, body: Result<Bytes, ClaimCheck>) -> ItemResult {
        let body = match body {
            Ok(body) => body,
            Err(check) => match self.claim_body(index, &check).await {
                Ok(body) => body,
                Err(result) => return result,
            },
        };
        let item = Self::item_message(message, envelope, index, body);
        let with_reply = self.delivery.reply.is_some();
        let call =
            AssertUnwindSafe(async { if with_reply { self.handler.handle_with_reply(&item).await } else { self.handler.handle(&item).await.map(|()| None) } });
        // The answer goes at once, so at most `width` answers are in memory, not one per
        // item of the envelope.
        match self.contained(call.catch_unwind().await) {
            Ok(Some(reply)) => match self.put_reply(message, Some(envelope.items[index].origin_or(&message.id, index as u32)), &reply).await {
                Ok(()) => ItemResult::Handled,
                Err(ReplyNotPut::Never(reason)) => ItemResult::Refused(format!("{reason} (item {index})")),
                Err(ReplyNotPut::NotNow(error)) => ItemResult::Failed(error),
            },
            Ok(None) => ItemResult::Handled,
            Err(error) if error.is::<crate::handler::AnswerTooLarge>() => ItemResult::Refused(format!("{error:#} (item {index})")),
            Err(error) => ItemResult::Failed(error),
        }
    }

    /// Item `index`'s body from the claim store, at most `max_claim_check_bytes`. A fetch
    /// that fails for now makes the item a failed delivery (retried with its attempts); any
    /// other failure poisons it alone.
    pub(in crate::listener) async fn claim_body(&self, index: usize, check: &ClaimCheck) -> Result<Bytes, ItemResult> {
        let Some(claims) = &self.delivery.claims else {
            return Err(ItemResult::Refused(format!(
                "claim checks not enabled (item {index} is a claim check for {} bytes at {})",
                check.size, check.location
            )));
        };
        match claims.get(check, claims.max_bytes()).await {
            Ok(body) => Ok(body),
            Err(error) if error.is_retryable() => Err(ItemResult::Failed(anyhow::Error::new(error).context(format!("fetching item {index}'s body")))),
            Err(error) => Err(ItemResult::Refused(format!("{error} (item {index})"))),
        }
    }

    /// A handler call's result, a panic made a failure.
    fn contained(&self, result: std::thread::Result<anyhow::Result<Option<Bytes>>>) -> anyhow::Result<Option<Bytes>> {
        result.unwrap_or_else(|panic| {
            self.telemetry.counters.handler_panics.fetch_add(1, Ordering::Relaxed);
            Err(crate::handler::HandlerPanicked(panic_message(&*panic)).into())
        })
    }

    /// Settles an envelope whose items were delivered (and whose handled items' answers
    /// were put): failed items put back (a new envelope, hidden for the retry delay), then
    /// those out of attempts poisoned alone, and only then the envelope deleted. If the put
    /// back fails, nothing is deleted: the envelope comes back after the retry delay and all
    /// its items are delivered again (at least once). An item the poison queue refuses is put
    /// back alone for `max_retry_delay`; the others are not poisoned again for it. An item
    /// whose answer the reply queue refused is a failed item like any other (poisoned at once
    /// when it can never fit). Each item's span is told how it was settled.
    pub(in crate::listener) async fn settle_envelope(
        self: &Arc<Self>,
        message: &IncomingMessage,
        receipt: &PopReceipt,
        envelope: &Envelope,
        results: Vec<(ItemResult, tracing::Span)>,
        latency: Duration,
    ) {
        let (results, spans): (Vec<_>, Vec<_>) = results.into_iter().unzip();
        let items = &self.telemetry.counters.items;
        items.envelopes.fetch_add(1, Ordering::Relaxed);
        let mut retry = Vec::new();
        let mut poison = Vec::new();
        let mut retry_delay = Duration::ZERO;
        let mut handled_claims = Vec::new();
        for (index, result) in results.into_iter().enumerate() {
            match result {
                ItemResult::Handled => {
                    items.delivered.fetch_add(1, Ordering::Relaxed);
                    if let Body::ClaimCheck(check) = &envelope.items[index].body {
                        handled_claims.push(check);
                    }
                }
                ItemResult::Failed(error) => {
                    items.failed.fetch_add(1, Ordering::Relaxed);
                    let tries = envelope.items[index].attempts.saturating_add(message.dequeue_count);
                    let failed = FailedDelivery { message, error: &error, tries, item: Some(index as u32), latency };
                    match self.failure_verdict(failed, format!("{error:#} (item {index}, {tries} failed deliveries)")).await {
                        FailureVerdict::Poison(reason) => poison.push((index, reason)),
                        FailureVerdict::Retry(delay) => {
                            // One envelope carries the items put back: the longest delay asked.
                            retry_delay = retry_delay.max(delay);
                            if let Some(suppressed) = self.telemetry.failure_log.allow() {
                                tracing::warn!(id = %message.id, item = index, tries, ?delay, suppressed, "item failed, retried alone later: {error:#}");
                            }
                            retry.push(index);
                        }
                    }
                }
                ItemResult::Refused(reason) => {
                    items.failed.fetch_add(1, Ordering::Relaxed);
                    poison.push((index, reason));
                }
            }
        }
        // The items to retry are put back first: if that fails, nothing has moved yet and
        // the envelope comes back whole.
        if !retry.is_empty() && !self.put_back(message, envelope, &retry, retry_delay).await {
            self.hide_envelope(message, receipt).await;
            record_settled(&spans, |_| Settled::Retried);
            return;
        }
        // An item the poison queue refuses does not keep the envelope: the others would be
        // poisoned again at each return. It is put back alone, out of the way for the longest
        // retry delay (as a plain message the poison queue refuses is left in place).
        let (mut refused, mut unpackable) = (Vec::new(), Vec::new());
        for (index, reason) in &poison {
            match self.poison_item(message, envelope, *index, reason).await {
                ItemPoisoning::Moved => {}
                ItemPoisoning::Refused => refused.push(*index),
                ItemPoisoning::FitsNoMessage(reason) => unpackable.push(reason),
            }
        }
        if !unpackable.is_empty() {
            // No packing of ours fits such an item (a foreign producer's codec packed it
            // smaller than ours can): the envelope moves as it came, once, the items it still
            // holds with it (a requeue delivers them again: at least once, never lost).
            let reason = unpackable.join("; ");
            self.poison(message, receipt, &reason).await;
            record_settled(&spans, |_| Settled::Poisoned(&reason));
            return;
        }
        if !refused.is_empty() && !self.put_back(message, envelope, &refused, self.settings.max_retry_delay).await {
            // The queue refused a put just after taking one: the envelope comes back whole,
            // and what was put back or poisoned from it may be so again (at least once).
            self.hide_envelope(message, receipt).await;
            record_settled(&spans, |_| Settled::Retried);
            return;
        }
        self.delete_envelope(message, receipt, handled_claims, latency).await;
        record_settled(&spans, |index| match poison.iter().find(|(poisoned, _)| *poisoned == index) {
            Some(_) if refused.contains(&index) => Settled::Retried,
            Some((_, reason)) => Settled::Poisoned(reason),
            None if retry.contains(&index) => Settled::Retried,
            None => Settled::Deleted,
        });
    }

    /// Deletes a settled envelope, then the claim-check bodies of its handled items (only
    /// theirs: the items put back or poisoned still reference their bodies).
    async fn delete_envelope(&self, message: &IncomingMessage, receipt: &PopReceipt, handled_claims: Vec<&ClaimCheck>, latency: Duration) {
        crate::telemetry::outcome("deleted");
        let deleted = self.delete_settled(&message.id, receipt).await;
        self.telemetry.counters.record_success(latency);
        if let Err(error) = deleted {
            // The envelope comes back and its claim checks are followed again: keep their bodies.
            tracing::warn!(id = %message.id, "envelope settled, but the delete failed (its items may be delivered again): {error}");
            return;
        }
        self.delivery.groups.deleted(&message.id);
        if let Some(claims) = &self.delivery.claims {
            for check in handled_claims {
                if let Err(error) = claims.delete(check).await {
                    tracing::warn!(id = %message.id, location = %check.location, "claim-check body not deleted (the sweeper removes it later): {error}");
                }
            }
        }
    }

    /// Puts the items `failed` of `envelope` back as a new envelope (each one more attempt),
    /// hidden for `delay`. False when a put failed.
    async fn put_back(self: &Arc<Self>, message: &IncomingMessage, envelope: &Envelope, failed: &[usize], delay: Duration) -> bool {
        let packed = match self.delivery.packer.repack_failed(envelope, failed, &message.id) {
            Ok(packed) => packed,
            Err(error) => {
                tracing::error!(id = %message.id, "could not pack the failed items again: {error:#}");
                return false;
            }
        };
        for envelope in packed.envelopes {
            let put = if self.delivery.text_envelopes {
                self.queue.put(crate::payload::to_text(&envelope.bytes).as_bytes(), delay).await
            } else {
                self.queue.put(&envelope.bytes, delay).await
            };
            if let Err(error) = put {
                tracing::warn!(id = %message.id, "could not put the failed items back; the envelope is delivered again later: {error}");
                return false;
            }
            self.wake_after(delay);
        }
        true
    }

    /// Hides an envelope that could not be settled for its retry delay: it comes back whole.
    async fn hide_envelope(self: &Arc<Self>, message: &IncomingMessage, receipt: &PopReceipt) {
        let delay = self.settings.retry_delay(message.dequeue_count);
        crate::telemetry::outcome("retried");
        if let Err(error) = self.hide_for(&message.id, receipt, delay).await {
            tracing::warn!(id = %message.id, "could not set the retry delay (the lease will run out instead): {error}");
        }
    }

    /// Moves item `index` of `envelope` to the poison queue alone, with its bytes; a claim
    /// check, or bytes too large for a poison message (an item may fit an envelope only
    /// compressed), as a one-item envelope, which a requeue delivers again.
    async fn poison_item(self: &Arc<Self>, message: &IncomingMessage, envelope: &Envelope, index: usize, reason: &str) -> ItemPoisoning {
        let origin = envelope.items[index].origin_or(&message.id, index as u32);
        let put = match &envelope.items[index].body {
            Body::Inline(body) => match self.put_poison(&Self::item_message(message, envelope, index, body.clone()), Some(&origin), reason).await {
                Err(QueueError::MessageTooLarge { .. } | QueueError::InvalidBody(_)) => self.poison_packed(message, envelope, index, reason).await,
                other => other.map_err(anyhow::Error::new),
            },
            // Its reference, the body kept: the sweeper's retention outlives the poison copy.
            Body::ClaimCheck(_) => self.poison_packed(message, envelope, index, reason).await,
        };
        let put = match put {
            Err(error) if error.is::<FitsNoMessage>() => {
                return ItemPoisoning::FitsNoMessage(format!("item {index} fits no message packed again ({error:#}): {reason}"));
            }
            other => other,
        };
        let shown = format!("{}#{}", self.producer_id(&MessageId::from(origin.message_id.as_str())), origin.index);
        match put {
            Ok(form) => {
                self.telemetry.counters.items.poisoned.fetch_add(1, Ordering::Relaxed);
                self.telemetry.counters.record_poison(&shown, reason, form);
                if let Some(suppressed) = self.telemetry.poison_log.allow() {
                    tracing::warn!(id = %shown, poison_queue = %self.delivery.poison.name(), suppressed, "item moved to the poison queue alone: {reason}");
                }
                ItemPoisoning::Moved
            }
            Err(error) => {
                self.telemetry.counters.poison_failures.fetch_add(1, Ordering::Relaxed);
                if let Some(suppressed) = self.telemetry.poison_log.allow() {
                    let delay = self.settings.max_retry_delay;
                    tracing::error!(id = %shown, ?delay, suppressed, "cannot poison an item ({reason}); put back alone, tried again after {delay:?}: {error:#}");
                }
                ItemPoisoning::Refused
            }
        }
    }

    /// Item `index` into the poison queue as an envelope of it alone, its attempts from 0
    /// (a requeue starts them again, as it does a message's dequeue count); as text on a
    /// queue of text.
    async fn poison_packed(self: &Arc<Self>, message: &IncomingMessage, envelope: &Envelope, index: usize, reason: &str) -> anyhow::Result<PoisonForm> {
        let origin = envelope.items[index].origin_or(&message.id, index as u32);
        let item = Item { attempts: 0, origin: Some(origin.clone()), ..envelope.items[index].clone() };
        let packed = self.delivery.packer.pack(std::slice::from_ref(&item)).map_err(|error| anyhow::Error::new(FitsNoMessage).context(format!("{error:#}")))?;
        let Some(packed) = packed.envelopes.into_iter().next() else {
            return Err(anyhow::Error::new(FitsNoMessage).context("the item fits no envelope alone"));
        };
        let body = if self.delivery.text_envelopes { Bytes::from(crate::payload::to_text(&packed.bytes)) } else { Bytes::from(packed.bytes) };
        Ok(self.put_poison(&Self::item_message(message, envelope, index, body), Some(&origin), reason).await?)
    }
}

/// How an envelope's settling left one of its items.
enum Settled<'a> {
    Deleted,
    /// Put back (alone, or with the whole envelope).
    Retried,
    /// Moved to the poison queue, for this reason.
    Poisoned(&'a str),
}

/// Records on each item's span (none for an item of a batch, or without export) how the
/// envelope's settling left it, as the envelope's `handle` span records its own.
fn record_settled<'a>(spans: &[tracing::Span], settled: impl Fn(usize) -> Settled<'a>) {
    for (index, span) in spans.iter().enumerate().filter(|(_, span)| !span.is_disabled()) {
        span.in_scope(|| match settled(index) {
            Settled::Deleted => crate::telemetry::outcome("deleted"),
            Settled::Retried => crate::telemetry::outcome("retried"),
            Settled::Poisoned(reason) => crate::telemetry::poisoned(reason),
        });
    }
}

/// What became of a failed item sent to the poison queue.
enum ItemPoisoning {
    Moved,
    /// The poison queue refused it: put back alone.
    Refused,
    /// No packing of ours fits it alone (the reason given).
    FitsNoMessage(String),
}

/// Marks a packing error: the item fits no message of this queue packed again.
#[derive(Debug)]
struct FitsNoMessage;

impl std::fmt::Display for FitsNoMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fits no message")
    }
}

impl std::error::Error for FitsNoMessage {}
