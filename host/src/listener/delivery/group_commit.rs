//! A group commit: calls that fall due together go out together, on a backend that takes
//! them in batches (SQS: `DeleteMessageBatch`, `ChangeMessageVisibilityBatch` of up to 10).
//! A call when no batch call is in flight leads: it sends at once what waits, itself
//! included. Calls that arrive while a batch call is in flight wait, and when it answers the
//! first of them leads the next call with the others. A full batch waiting does not wait for
//! that answer: its first call leads a call of its own at once, so calls go side by side as
//! long as each carries a full batch (at load, deletes keep pace with as many receives in
//! flight as the listener's tasks). A batch of messages handled side by side goes in one
//! request (at most the backend's batch limit), and each leader makes one (no message carries
//! the others' for long). A leader may *linger* (`run`'s `linger`): a short batch then waits
//! up to that long for others to fill it, and goes at once when it fills, when a caller that
//! does not linger joins, or when `flush` is cancelled (shutdown).

use std::sync::Mutex;

use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use crate::queue::QueueError;

/// What a waiting call is told.
enum Turn<E, R> {
    /// Its entry went in a batch: its result.
    Done(Result<R, QueueError>),
    /// It leads the next batch call with its entry, given back unsent.
    Lead(E),
}

/// A call waiting for the next batch call.
struct Waiting<E, R> {
    entry: E,
    turn: oneshot::Sender<Turn<E, R>>,
}

/// The calls of entries `E` (with results `R`) waiting for the next batch call, and whether
/// one is in flight.
pub(in crate::listener) struct GroupCommit<E, R> {
    pending: Mutex<Pending<E, R>>,
    /// Tells lingering leaders to send now (their batch filled, or a caller will not wait).
    send_now: Notify,
}

struct Pending<E, R> {
    waiting: Vec<Waiting<E, R>>,
    /// Batch calls in flight (or their leaders about to send them).
    in_flight: usize,
    /// Of those, leaders that have not yet taken their batch from `waiting`.
    gathering: usize,
}

impl<E, R> Pending<E, R> {
    /// While `waiting` holds a full batch beyond what the gathering leaders will take, its
    /// first call leads a call of its own (`limit`: the backend's batch limit).
    fn lead_full_batches(&mut self, limit: usize) {
        while self.waiting.len() >= self.gathering * limit.saturating_sub(1) + limit {
            let Waiting { entry, turn } = self.waiting.remove(0);
            if turn.send(Turn::Lead(entry)).is_ok() {
                self.in_flight += 1;
                self.gathering += 1;
            }
        }
    }
}

impl<E, R> Default for GroupCommit<E, R> {
    fn default() -> Self {
        GroupCommit { pending: Mutex::new(Pending { waiting: Vec::new(), in_flight: 0, gathering: 0 }), send_now: Notify::new() }
    }
}

impl<E, R> GroupCommit<E, R> {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending<E, R>> {
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A call ended (answered, or its leader was dropped, `gathering` if before it took its
    /// batch): the first call still waiting leads the next one, or one call fewer is in
    /// flight (also when the leaders gathering will take every call that waits: two calls
    /// answered together would otherwise split what waits between two leaders).
    fn hand_on(&self, gathering: bool, limit: usize) {
        let mut pending = self.pending();
        pending.gathering -= usize::from(gathering);
        if pending.in_flight > 1 {
            // Another call in flight hands on what waits when it ends: what waits meanwhile
            // fills one batch rather than going out in pieces (a full one leads at once).
            pending.in_flight -= 1;
            pending.lead_full_batches(limit);
            return;
        }
        while pending.waiting.len() > pending.gathering * limit.saturating_sub(1) {
            let Waiting { entry, turn } = pending.waiting.remove(0);
            if turn.send(Turn::Lead(entry)).is_ok() {
                pending.gathering += 1;
                return;
            }
            // That call is no longer awaited (its settling was dropped at shutdown).
        }
        pending.in_flight -= 1;
    }

    /// `entry`'s result, sent with the others that fall due meanwhile in one `send` of at
    /// most `limit` entries (`send` gives one result per entry, in order). Leading a short
    /// batch, it waits up to `linger` for others to fill it (not once `flush` is cancelled).
    /// `what` names the entry in an error.
    pub(in crate::listener) async fn run<F, Fut>(&self, entry: E, batching: Batching<'_>, what: &str, send: F) -> Result<R, QueueError>
    where
        F: FnOnce(Vec<E>) -> Fut,
        Fut: Future<Output = Vec<Result<R, QueueError>>>,
    {
        let limit = batching.limit;
        let (turn, told) = oneshot::channel();
        let mut entry = Some(entry);
        {
            let mut pending = self.pending();
            if pending.in_flight > 0 {
                pending.waiting.push(Waiting { entry: entry.take().expect("not yet given"), turn });
                pending.lead_full_batches(limit);
                // A leader lingering for this batch sends once it is full, or at once for
                // a caller that would not have waited.
                if batching.linger.is_zero() || pending.waiting.len() + 1 >= limit {
                    self.send_now.notify_waiters();
                }
            } else {
                pending.in_flight = 1;
                pending.gathering = 1;
            }
        }
        let entry = match entry {
            Some(entry) => entry,
            None => match told.await {
                Ok(Turn::Done(result)) => return result,
                Ok(Turn::Lead(entry)) => entry,
                Err(_) => return Err(QueueError::Transient(anyhow::anyhow!("{what}: the batch call ended without its result"))),
            },
        };
        self.lead(entry, batching, what, send).await
    }

    /// Waits up to `batching.linger` while fewer than a full batch wait with this leader.
    async fn linger(&self, batching: &Batching<'_>) {
        if batching.linger.is_zero() || batching.flush.is_cancelled() {
            return;
        }
        let deadline = tokio::time::Instant::now() + batching.linger;
        loop {
            // Registered before looking, so a join between the look and the wait is not missed.
            let told = self.send_now.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            if self.pending().waiting.len() + 1 >= batching.limit {
                return;
            }
            tokio::select! {
                _ = told => {}
                _ = tokio::time::sleep_until(deadline) => return,
                _ = batching.flush.cancelled() => return,
            }
        }
    }

    /// Sends `entry` and up to `limit - 1` waiting entries in one call, and tells each its result.
    async fn lead<F, Fut>(&self, entry: E, batching: Batching<'_>, what: &str, send: F) -> Result<R, QueueError>
    where
        F: FnOnce(Vec<E>) -> Fut,
        Fut: Future<Output = Vec<Result<R, QueueError>>>,
    {
        let limit = batching.limit;
        let mut leading = Leading { commit: self, limit, gathering: true };
        // Messages handled side by side fall due in one poll of their batch: let the others
        // of it join before sending.
        tokio::task::yield_now().await;
        self.linger(&batching).await;
        // One request's worth: the rest wait for the next leader.
        let others: Vec<Waiting<E, R>> = {
            let mut pending = self.pending();
            let take = pending.waiting.len().min(limit.saturating_sub(1));
            let others = pending.waiting.drain(..take).collect();
            pending.gathering -= 1;
            leading.gathering = false;
            // What arrived while it gathered may be a full batch of its own.
            pending.lead_full_batches(limit);
            others
        };
        let mut batch = Vec::with_capacity(others.len() + 1);
        batch.push(entry);
        let mut turns = Vec::with_capacity(others.len());
        for waiting in others {
            batch.push(waiting.entry);
            turns.push(waiting.turn);
        }
        let mut results = send(batch).await.into_iter();
        let own = results.next().unwrap_or_else(|| Err(QueueError::Fatal(anyhow::anyhow!("{what}: the batch call returned no result for it"))));
        for (turn, result) in turns.into_iter().zip(results) {
            // A call whose settling was dropped (shutdown) no longer waits.
            let _ = turn.send(Turn::Done(result));
        }
        drop(leading);
        own
    }
}

/// How a call's entry may go: at most `limit` in one request, its leader waiting up to
/// `linger` for a short batch to fill unless `flush` is cancelled.
pub(in crate::listener) struct Batching<'a> {
    pub(in crate::listener) limit: usize,
    pub(in crate::listener) linger: std::time::Duration,
    pub(in crate::listener) flush: &'a CancellationToken,
}

/// Hands the lead on however the leader ends, so no waiting call is stranded.
struct Leading<'a, E, R> {
    commit: &'a GroupCommit<E, R>,
    /// The backend's batch limit.
    limit: usize,
    /// It has not taken its batch yet.
    gathering: bool,
}

impl<E, R> Drop for Leading<'_, E, R> {
    fn drop(&mut self) {
        self.commit.hand_on(self.gathering, self.limit);
    }
}
