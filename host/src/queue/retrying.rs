//! Retries transient errors with jittered exponential back-off, bounded, and records what
//! became of every call ([`CallRecord`]): failures by kind and class, retries, calls given
//! up. Log lines say what failed and what happens next, a few per minute.
//!
//! A delete whose attempt may have reached the service (it timed out, or the connection
//! broke) and whose retry then hears "not found" was done by that attempt: it succeeds,
//! counted as already done, rather than failing as a lost lease.
//!
//! With [`Retrying::with_readiness`], a call that fails for good marks the queue's storage
//! not ready (its credential, when the storage refused it: that fails `/healthz` too), and
//! the next answer clears it.
//!
//! With readiness (the running host's stack), a queue found missing (deleted while the host
//! ran, or the account restored empty) is created again, once per call and once for all the calls that find it missing together,
//! and the call tried again: counted ([`CallRecord`]'s `recreated`) and logged. Where the
//! credential may not create it, the call fails and the readiness says so; the creation is
//! tried again no sooner than [`RECREATE_REFUSED_BACKOFF`] after a refusal.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tracing::Instrument as _;

use super::call_record::{CallRecord, short_duration};
use super::failure::{CallKind, FailureClass, classified};
use super::{GroupedSend, Message, MessageId, PopReceipt, QueueClient, QueueError};
use crate::health::{Readiness, ReadinessPart, truncate_reason};
use crate::log_limit::LogLimiter;

/// Lines per minute and queue about retried or failed calls: an outage fails every call.
const LOG_LINES_PER_MINUTE: u32 = 6;

/// Calls that find the queue missing within this long of its creation again retry without
/// creating it once more: the dequeue tasks all find it missing at once.
const RECREATE_SHARED: Duration = Duration::from_secs(1);

/// After the storage refused to create a missing queue (the credential may not), calls fail
/// with that refusal for this long before the creation is tried again: an operator creates
/// the queue or grants the permission, and the host picks it up within this long.
pub const RECREATE_REFUSED_BACKOFF: Duration = Duration::from_secs(10);

/// How transient errors are retried.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// Delay before the first retry; doubles with each retry, with ±50% jitter.
    pub base_delay: Duration,
    /// Cap on one delay.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { max_attempts: 5, base_delay: Duration::from_millis(100), max_delay: Duration::from_secs(5) }
    }
}

impl RetryPolicy {
    /// The delay before retry number `retry` (1 for the first retry).
    pub fn delay(&self, retry: u32) -> Duration {
        let exponential = self.base_delay.saturating_mul(1u32 << retry.saturating_sub(1).min(20));
        exponential.min(self.max_delay).mul_f64(0.5 + fastrand::f64())
    }
}

/// A backend whose transient errors are retried and whose calls are recorded.
pub struct Retrying<Q> {
    inner: Q,
    policy: RetryPolicy,
    record: Arc<CallRecord>,
    /// Where a call that fails for good marks the storage not ready, and under which queue.
    readiness: Option<(Readiness, String)>,
    log: LogLimiter,
    /// The last creation of the queue after it was found missing, one at a time.
    recreation: tokio::sync::Mutex<Recreation>,
    /// Probing (`ebb check`): a missing queue is an answer, not created again, and a call
    /// given up is the caller's to report, not logged.
    probing: bool,
}

/// When the queue was last created again, or refused to be.
#[derive(Default)]
struct Recreation {
    created_at: Option<Instant>,
    refused: Option<(Instant, String)>,
}

/// An attempt in flight: dropped before [`PendingAttempt::answered`], it was abandoned
/// (its caller stopped waiting), and the record says so. Without this, a fault the service
/// (or a proxy) made on an attempt the host then abandoned was counted by the service and
/// not by the host.
struct PendingAttempt<'a> {
    record: &'a CallRecord,
    answered: bool,
}

impl PendingAttempt<'_> {
    fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for PendingAttempt<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.record.record_abandoned();
        }
    }
}

/// How one call went, across its attempts.
struct Attempts {
    /// An attempt failed in a way that leaves open whether the service did the work.
    maybe_done: bool,
}

impl<Q: QueueClient> Retrying<Q> {
    /// Wraps `inner`.
    pub fn new(inner: Q, policy: RetryPolicy) -> Self {
        let record = Arc::new(CallRecord::new(inner.name()));
        Retrying {
            inner,
            policy,
            record,
            readiness: None,
            log: LogLimiter::new(LOG_LINES_PER_MINUTE, Duration::from_secs(60)),
            recreation: tokio::sync::Mutex::default(),
            probing: false,
        }
    }

    /// For probes (`ebb check`): a queue found missing is not created (the call fails with
    /// [`FailureClass::Missing`]), and a call given up is not logged: the caller reports it.
    pub fn probing(mut self) -> Self {
        self.probing = true;
        self
    }

    /// Reports the storage's reachability as part [`ReadinessPart::Storage`] of `queue` (the
    /// logical queue, as the readiness lists it): a call that fails for good sets a problem
    /// naming the call and the error; the next call the storage answers clears it.
    pub fn with_readiness(mut self, readiness: Readiness, queue: &str) -> Self {
        readiness.add_queue(queue);
        self.readiness = Some((readiness, queue.to_string()));
        self
    }

    /// Retries made so far.
    pub fn retries(&self) -> u64 {
        self.record.snapshot().total_retries()
    }

    /// The record of this queue's calls.
    pub fn call_record(&self) -> Arc<CallRecord> {
        self.record.clone()
    }

    /// The span of a storage call, its retries and how it ended recorded by [`Self::attempts`].
    fn call_span(&self, kind: CallKind) -> tracing::Span {
        let empty = tracing::field::Empty;
        tracing::debug_span!(target: crate::telemetry::TARGET, "storage", otel.name = kind.as_str(), queue = self.inner.name(), retries = empty, messages = empty, gave_up = empty, otel.status_code = empty)
    }

    async fn run<'a, T, F>(&'a self, kind: CallKind, call: impl FnMut(&'a Q) -> F) -> (Result<T, QueueError>, Attempts)
    where
        F: Future<Output = Result<T, QueueError>>,
    {
        self.attempts(kind, call).instrument(self.call_span(kind)).await
    }

    /// A get, its span saying how many messages it returned.
    async fn run_get<'a, F>(&'a self, call: impl FnMut(&'a Q) -> F) -> Result<Vec<Message>, QueueError>
    where
        F: Future<Output = Result<Vec<Message>, QueueError>>,
    {
        let span = self.call_span(CallKind::Get);
        let got = self.attempts(CallKind::Get, call).instrument(span.clone()).await.0;
        if let Ok(messages) = &got {
            span.record("messages", messages.len());
        }
        got
    }

    async fn attempts<'a, T, F>(&'a self, kind: CallKind, mut call: impl FnMut(&'a Q) -> F) -> (Result<T, QueueError>, Attempts)
    where
        F: Future<Output = Result<T, QueueError>>,
    {
        let mut attempts = Attempts { maybe_done: false };
        let mut attempt = 1;
        let mut recreate_tried = false;
        loop {
            // Counted abandoned if this future is dropped before the attempt answers.
            let pending = PendingAttempt { record: &self.record, answered: false };
            let mut result = call(&self.inner).await;
            pending.answered();
            let error = match &result {
                Err(error) => error,
                Ok(_) => {
                    self.answered(kind);
                    record_retries(attempt);
                    return (result, attempts);
                }
            };
            let Some(class) = error.failure_class() else {
                // The storage answered; the answer was "no" for the call's own reasons.
                self.answered(kind);
                record_retries(attempt);
                return (result, attempts);
            };
            let mut text = error.to_string();
            self.record.record_failure(kind, class, &text);
            let mut transient = error.is_transient();
            // Only the running host's stack (the one reporting readiness) creates a missing
            // queue again: `ebb check` and `ebb send` create no queue as a side effect.
            if class == FailureClass::Missing && kind != CallKind::Create && !recreate_tried && self.readiness.is_some() && !self.probing {
                recreate_tried = true;
                match self.recreate().await {
                    Ok(()) => {
                        self.record.record_retry(kind);
                        continue;
                    }
                    Err(refused) => {
                        text = format!("{text}; creating it again failed: {refused}");
                        transient = false;
                        result = Err(QueueError::Fatal(classified(FailureClass::Missing, text.clone())));
                    }
                }
            }
            if transient && attempt < self.policy.max_attempts {
                attempts.maybe_done |= class.may_have_succeeded();
                let delay = self.policy.delay(attempt);
                attempt += 1;
                self.record.record_retry(kind);
                self.log_retry(kind, class, delay, attempt, &text);
                tokio::time::sleep(delay).await;
                continue;
            }
            let span = tracing::Span::current();
            span.record("gave_up", class.to_string());
            span.record("otel.status_code", "ERROR");
            record_retries(attempt);
            self.give_up(kind, class, attempt, &text);
            return (result, attempts);
        }
    }

    fn log_retry(&self, kind: CallKind, class: FailureClass, delay: Duration, attempt: u32, text: &str) {
        let queue = self.inner.name();
        if let Some(suppressed) = self.log.allow() {
            tracing::warn!(
                queue,
                suppressed,
                "{kind} on {queue} failed ({class}): retrying in {}, attempt {attempt} of {}: {}",
                short_duration(delay),
                self.policy.max_attempts,
                truncate_reason(text)
            );
        }
    }

    /// Records and logs a call given up after `attempt` attempts, and reports the queue not
    /// ready.
    fn give_up(&self, kind: CallKind, class: FailureClass, attempt: u32, text: &str) {
        let queue = self.inner.name();
        self.record.record_gave_up(kind);
        let tries = if attempt == 1 { "at once (not worth retrying)".to_string() } else { format!("after {attempt} attempts") };
        let problem = format!("{kind} on {queue} failed ({class}) {tries}: {}", truncate_reason(text));
        if !self.probing
            && let Some(suppressed) = self.log.allow()
        {
            tracing::warn!(queue, suppressed, "{problem}; {}", kind.after_giving_up());
        }
        let Some((readiness, logical)) = &self.readiness else { return };
        // A refused credential is the liveness's too: a restart reads a renewed secret.
        let part = if class == FailureClass::Auth { ReadinessPart::Credential } else { ReadinessPart::Storage };
        if readiness.set_problem(logical, part, &problem) {
            match part {
                ReadinessPart::Credential => tracing::error!(
                    queue = logical.as_str(),
                    "queue {logical} is not ready and the host not live: its storage refuses the credential; a restart reads the secret again"
                ),
                _ => tracing::warn!(queue = logical.as_str(), "queue {logical} is not ready: its storage fails ({class})"),
            }
        }
    }

    fn answered(&self, kind: CallKind) {
        self.record.record_answer(kind);
        if let Some((readiness, logical)) = &self.readiness {
            let storage = readiness.clear_problem(logical, ReadinessPart::Storage);
            let credential = readiness.clear_problem(logical, ReadinessPart::Credential);
            if storage || credential {
                tracing::info!(queue = logical.as_str(), "queue {logical} is ready: its storage answers");
            }
        }
    }

    /// Creates the queue, found missing, again, unless another call just did; fails with the
    /// storage's refusal (remembered for [`RECREATE_REFUSED_BACKOFF`]).
    async fn recreate(&self) -> Result<(), String> {
        let mut recreation = self.recreation.lock().await;
        if recreation.created_at.is_some_and(|at| at.elapsed() < RECREATE_SHARED) {
            return Ok(());
        }
        if let Some((at, refusal)) = &recreation.refused
            && at.elapsed() < RECREATE_REFUSED_BACKOFF
        {
            return Err(refusal.clone());
        }
        let queue = self.inner.name();
        match self.inner.create_if_missing().await {
            Ok(()) => {
                self.record.record_answer(CallKind::Create);
                self.record.record_recreated();
                *recreation = Recreation { created_at: Some(Instant::now()), refused: None };
                tracing::warn!(queue, "queue {queue} did not exist (deleted while the host ran, or the account restored empty): created it again");
                Ok(())
            }
            Err(error) => {
                let reason = truncate_reason(&error.to_string());
                if let Some(class) = error.failure_class() {
                    self.record.record_failure(CallKind::Create, class, &reason);
                }
                self.record.record_gave_up(CallKind::Create);
                tracing::warn!(queue, "queue {queue} does not exist and creating it again failed: {reason}");
                // A transient refusal (Azure's QueueBeingDeleted) is tried again at the next call.
                if !error.is_transient() {
                    recreation.refused = Some((Instant::now(), reason.clone()));
                }
                Err(reason)
            }
        }
    }
}

/// Records on the current storage call's span how many times it was tried again (once: a
/// field recorded twice is exported twice).
fn record_retries(attempt: u32) {
    if attempt > 1 {
        tracing::Span::current().record("retries", attempt - 1);
    }
}

#[async_trait]
impl<Q: QueueClient> QueueClient for Retrying<Q> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn create_if_missing(&self) -> Result<(), QueueError> {
        self.run(CallKind::Create, |q| q.create_if_missing()).await.0
    }

    async fn put(&self, body: &[u8], initial_visibility: Duration) -> Result<MessageId, QueueError> {
        self.run(CallKind::Put, |q| q.put(body, initial_visibility)).await.0
    }

    fn fifo(&self) -> bool {
        self.inner.fifo()
    }

    fn generated_dedup_id(&self) -> Option<String> {
        self.inner.generated_dedup_id()
    }

    /// Retried as a put: a FIFO send's retry carries the same deduplication id (the
    /// caller's, or one made here once for the send), or the same body under content-based
    /// deduplication, so SQS keeps one copy.
    async fn put_in_group(&self, body: &[u8], initial_visibility: Duration, send: &GroupedSend) -> Result<MessageId, QueueError> {
        let generated = send.dedup_id.is_none().then(|| self.inner.generated_dedup_id()).flatten();
        let send = match generated {
            Some(dedup_id) => &GroupedSend { group: send.group.clone(), dedup_id: Some(dedup_id) },
            None => send,
        };
        self.run(CallKind::Put, |q| q.put_in_group(body, initial_visibility, send)).await.0
    }

    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
        self.run_get(|q| q.get(max, visibility)).await
    }

    fn server_wait(&self, idle: Duration) -> Duration {
        self.inner.server_wait(idle)
    }

    async fn get_waiting(&self, max: u32, visibility: Duration, wait: Duration) -> Result<Vec<Message>, QueueError> {
        self.run_get(|q| q.get_waiting(max, visibility, wait)).await
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), QueueError> {
        match self.run(CallKind::Delete, |q| q.delete(id, pop_receipt)).await {
            (Err(QueueError::StaleReceipt { .. }), Attempts { maybe_done: true }) => {
                self.record.record_already_done();
                tracing::debug!(queue = self.inner.name(), %id, "a retried delete found the message gone: an earlier attempt had deleted it");
                Ok(())
            }
            (result, _) => result,
        }
    }

    /// Each request of the batch retried alone ([`Retrying::delete_request`]).
    async fn delete_batch(&self, entries: &[(MessageId, PopReceipt)]) -> Vec<Result<(), QueueError>> {
        let mut results = Vec::with_capacity(entries.len());
        for request in entries.chunks(self.inner.delete_batch_limit().max(1)) {
            results.extend(self.delete_request(request).await);
        }
        results
    }

    fn delete_batch_limit(&self) -> usize {
        self.inner.delete_batch_limit()
    }

    async fn update_visibility(&self, id: &MessageId, pop_receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError> {
        self.run(CallKind::Update, |q| q.update_visibility(id, pop_receipt, visibility)).await.0
    }

    /// Each request of the batch retried alone ([`Retrying::update_request`]).
    async fn update_visibility_batch(&self, entries: &[(MessageId, PopReceipt)], visibility: Duration) -> Vec<Result<PopReceipt, QueueError>> {
        let mut results = Vec::with_capacity(entries.len());
        for request in entries.chunks(self.inner.update_batch_limit().max(1)) {
            results.extend(self.update_request(request, visibility).await);
        }
        results
    }

    fn update_batch_limit(&self) -> usize {
        self.inner.update_batch_limit()
    }

    fn dead_letter(&self) -> Option<super::DeadLetter> {
        self.inner.dead_letter()
    }

    async fn approximate_count(&self) -> Result<u64, QueueError> {
        self.run(CallKind::Count, |q| q.approximate_count()).await.0
    }

    fn local_count(&self) -> Option<u64> {
        let count = self.inner.local_count();
        if count.is_some() {
            self.record.record_local_count();
        }
        count
    }

    fn call_records(&self) -> Vec<Arc<CallRecord>> {
        vec![self.record.clone()]
    }
}

/// A batch call's results, or its error when every entry failed transiently (the request
/// as a whole failed: a lost connection, throttling), so it is retried as one.
fn failed_as_a_whole<T>(mut results: Vec<Result<T, QueueError>>) -> Result<Vec<Result<T, QueueError>>, QueueError> {
    let whole = !results.is_empty() && results.iter().all(|result| result.as_ref().is_err_and(QueueError::is_transient));
    match whole {
        true => Err(results.swap_remove(0).err().expect("every entry failed")),
        false => Ok(results),
    }
}

/// `entries` results, each failed for the reason the batch call was given up.
fn each_failed<T>(entries: usize, error: &QueueError) -> Vec<Result<T, QueueError>> {
    let (class, text) = (error.failure_class().unwrap_or(FailureClass::Other), error.to_string());
    (0..entries).map(|_| Err(QueueError::Transient(classified(class, text.clone())))).collect()
}

impl<Q: QueueClient> Retrying<Q> {
    /// One request of a batch delete (at most [`QueueClient::delete_batch_limit`] entries),
    /// retried as one when it failed as a whole (every entry with a transient error: a lost
    /// connection, throttling); then an entry the service failed transiently on its own is
    /// retried as a delete of its own. A stale receipt after an attempt that may have
    /// deleted it is a delete done.
    async fn delete_request(&self, entries: &[(MessageId, PopReceipt)]) -> Vec<Result<(), QueueError>> {
        let (outcome, attempts) = self.run(CallKind::Delete, |q| async move { failed_as_a_whole(q.delete_batch(entries).await) }).await;
        let mut results = match outcome {
            Ok(results) => results,
            // Given up: each entry fails for the call's reason.
            Err(error) => return each_failed(entries.len(), &error),
        };
        for ((id, pop_receipt), result) in entries.iter().zip(results.iter_mut()) {
            let Err(error) = result else {
                continue;
            };
            if matches!(error, QueueError::StaleReceipt { .. }) && attempts.maybe_done {
                self.record.record_already_done();
                *result = Ok(());
                continue;
            }
            if !error.is_transient() {
                continue;
            }
            let maybe_done = error.failure_class().is_some_and(FailureClass::may_have_succeeded);
            *result = match self.delete(id, pop_receipt).await {
                Err(QueueError::StaleReceipt { .. }) if maybe_done => Ok(()),
                retried => retried,
            };
        }
        results
    }
}

impl<Q: QueueClient> Retrying<Q> {
    /// One request of a batch update (at most [`QueueClient::update_batch_limit`] entries),
    /// retried as one when it failed as a whole (every entry with a transient error); then an
    /// entry the service failed transiently on its own is retried as an update of its own.
    async fn update_request(&self, entries: &[(MessageId, PopReceipt)], visibility: Duration) -> Vec<Result<PopReceipt, QueueError>> {
        let (outcome, _) = self.run(CallKind::Update, |q| async move { failed_as_a_whole(q.update_visibility_batch(entries, visibility).await) }).await;
        let mut results = match outcome {
            Ok(results) => results,
            Err(error) => return each_failed(entries.len(), &error),
        };
        for ((id, pop_receipt), result) in entries.iter().zip(results.iter_mut()) {
            if result.as_ref().is_err_and(QueueError::is_transient) {
                *result = self.update_visibility(id, pop_receipt, visibility).await;
            }
        }
        results
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::queue::failure::{FailureClass, classified};

    /// A queue whose deletes answer from a script, one entry per attempt.
    struct Scripted {
        deletes: Mutex<Vec<Result<(), QueueError>>>,
        attempts: AtomicU32,
    }

    impl Scripted {
        fn new(deletes: Vec<Result<(), QueueError>>) -> Self {
            Scripted { deletes: Mutex::new(deletes.into_iter().rev().collect()), attempts: AtomicU32::new(0) }
        }
    }

    #[async_trait]
    impl QueueClient for Scripted {
        fn name(&self) -> &str {
            "orders"
        }
        async fn create_if_missing(&self) -> Result<(), QueueError> {
            Ok(())
        }
        async fn put(&self, _: &[u8], _: Duration) -> Result<MessageId, QueueError> {
            Err(QueueError::Transient(classified(FailureClass::Connection, "connection refused")))
        }
        async fn get(&self, _: u32, _: Duration) -> Result<Vec<Message>, QueueError> {
            Ok(Vec::new())
        }
        async fn delete(&self, _: &MessageId, _: &PopReceipt) -> Result<(), QueueError> {
            self.attempts.fetch_add(1, Ordering::Relaxed);
            let answer = self.deletes.lock().unwrap().pop();
            // Past the script, an attempt that never answers.
            match answer {
                Some(answer) => answer,
                None => std::future::pending().await,
            }
        }
        async fn update_visibility(&self, _: &MessageId, receipt: &PopReceipt, _: Duration) -> Result<PopReceipt, QueueError> {
            Ok(receipt.clone())
        }
        async fn approximate_count(&self) -> Result<u64, QueueError> {
            Ok(0)
        }
    }

    const POLICY: RetryPolicy = RetryPolicy { max_attempts: 4, base_delay: Duration::from_millis(10), max_delay: Duration::from_millis(100) };

    fn transient(class: FailureClass) -> Result<(), QueueError> {
        Err(QueueError::Transient(classified(class, format!("delete: {class}"))))
    }

    fn stale() -> Result<(), QueueError> {
        Err(QueueError::StaleReceipt { id: "m".into() })
    }

    async fn delete(script: Vec<Result<(), QueueError>>) -> (Result<(), QueueError>, Arc<CallRecord>) {
        let queue = Retrying::new(Scripted::new(script), POLICY);
        let result = queue.delete(&"m".into(), &"r".into()).await;
        (result, queue.call_record())
    }

    #[tokio::test(start_paused = true)]
    async fn a_delete_whose_timed_out_attempt_had_succeeded_is_done_not_a_lost_lease() {
        for class in [FailureClass::Timeout, FailureClass::Connection] {
            let (result, record) = delete(vec![transient(class), stale()]).await;
            assert!(result.is_ok(), "{class}: {result:?}");
            let s = record.snapshot();
            assert_eq!((s.already_done, s.failed_attempts(), s.total_retries()), (1, 1, 1), "{class}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_delete_refused_for_load_and_then_stale_lost_its_lease() {
        // A throttled attempt never reached the work: "not found" afterwards is a real loss.
        let (result, record) = delete(vec![transient(FailureClass::Throttled), stale()]).await;
        assert!(matches!(result, Err(QueueError::StaleReceipt { .. })), "{result:?}");
        assert_eq!(record.snapshot().already_done, 0);
        // And a first attempt that hears "not found" is a lost lease too.
        let (result, record) = delete(vec![stale()]).await;
        assert!(matches!(result, Err(QueueError::StaleReceipt { .. })), "{result:?}");
        assert_eq!(record.snapshot().already_done, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn every_failed_attempt_is_counted_by_kind_and_class_and_the_last_one_gives_up() {
        let (result, record) = delete(vec![transient(FailureClass::Throttled), transient(FailureClass::Timeout), Ok(())]).await;
        assert!(result.is_ok());
        let s = record.snapshot();
        assert_eq!(s.failed_attempts(), 2);
        assert!(s.gave_up.is_empty());
        assert!(s.last_success_age_secs.is_some());

        let queue = Retrying::new(Scripted::new(vec![]), POLICY);
        assert!(queue.put(b"x", Duration::ZERO).await.is_err());
        let s = queue.call_record().snapshot();
        assert_eq!(s.failures[0].kind, CallKind::Put);
        assert_eq!((s.failures[0].class, s.failures[0].count), (FailureClass::Connection, 4), "every attempt of four");
        assert_eq!((s.total_retries(), s.gave_up[0].count), (3, 1));
    }

    /// The race behind `azure_faults::the_failures_the_host_counts_are_the_ones_the_proxy_made`
    /// (166 counted, 167 made): the listener stopping mid-get drops an attempt the service had
    /// already failed; the host never heard of it, so it counted nothing. Now it counts the
    /// attempt abandoned (neither failed nor answered: its outcome is unknown).
    #[tokio::test(start_paused = true)]
    async fn an_attempt_dropped_before_its_answer_is_counted_abandoned_not_failed() {
        let queue = Retrying::new(Scripted::new(vec![transient(FailureClass::Throttled)]), POLICY);
        // The first attempt fails and is retried; the second never answers, and the caller
        // stops waiting (as `select!` on the listener's stop token does).
        let stopped = tokio::time::timeout(Duration::from_secs(5), queue.delete(&"m".into(), &"r".into())).await;
        assert!(stopped.is_err(), "the second attempt never answers");
        let s = queue.call_record().snapshot();
        assert_eq!((s.failed_attempts(), s.abandoned, s.total_retries()), (1, 1, 1), "{s:?}");
        assert!(s.gave_up.is_empty() && s.last_success_age_secs.is_none(), "{s:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fatal_error_is_not_retried_and_is_counted_once() {
        let (result, record) = delete(vec![Err(QueueError::Fatal(classified(FailureClass::Auth, "AuthenticationFailed (403)")))]).await;
        assert!(matches!(result, Err(QueueError::Fatal(_))));
        let s = record.snapshot();
        assert_eq!((s.failed_attempts(), s.total_retries(), s.gave_up[0].count), (1, 0, 1));
        assert_eq!(s.failures[0].class, FailureClass::Auth);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_fails_for_good_marks_the_storage_not_ready_until_the_next_answer() {
        let readiness = Readiness::default();
        let queue = Retrying::new(Scripted::new(vec![]), POLICY).with_readiness(readiness.clone(), "orders");
        assert!(readiness.is_ready());
        assert!(queue.put(b"x", Duration::ZERO).await.is_err());
        let problem = readiness.snapshot()["orders"].problems[&ReadinessPart::Storage].clone();
        assert!(problem.contains("put on orders failed (connection) after 4 attempts"), "{problem}");
        queue.get(1, Duration::from_secs(1)).await.unwrap();
        assert!(readiness.is_ready(), "the next answer clears it");
    }
}
