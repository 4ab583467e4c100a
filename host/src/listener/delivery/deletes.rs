//! Deletes that settle together go out together, on a backend that deletes in batches
//! (SQS: `DeleteMessageBatch` of up to 10): a group commit. A delete when no batch call is
//! in flight leads: it sends at once what waits, itself included. Deletes that arrive while
//! a call is in flight wait, and when it answers the first of them leads the next call with
//! the others. A full batch waiting does not wait for that answer: its first delete leads a
//! call of its own at once, so calls go side by side as long as each carries a full batch
//! (at load, deletes keep pace with as many receives in flight as the listener's tasks).
//! Nothing waits on a timer, a batch of messages handled side by side is deleted in one
//! request (at most the backend's batch limit), and each leader makes one (no message
//! carries the others' for long).
//! A backend without batches deletes each message on its own call, side by side, as before.

use std::sync::Mutex;

use tokio::sync::oneshot;

use crate::listener::Shared;
use crate::queue::{MessageId, PopReceipt, QueueError};

/// What a waiting delete is told.
enum Turn {
    /// Its entry went in a batch: its result.
    Done(Result<(), QueueError>),
    /// It leads the next batch call (its entry was not sent).
    Lead,
}

/// A delete waiting for the next batch call.
struct Waiting {
    entry: (MessageId, PopReceipt),
    turn: oneshot::Sender<Turn>,
}

/// The deletes waiting for the next batch call, and whether one is in flight.
#[derive(Default)]
pub(in crate::listener) struct Deletes {
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    waiting: Vec<Waiting>,
    /// Batch calls in flight (or their leaders about to send them).
    in_flight: usize,
    /// Of those, leaders that have not yet taken their batch from `waiting`.
    gathering: usize,
}

impl Pending {
    /// While `waiting` holds a full batch beyond what the gathering leaders will take, its
    /// first delete leads a call of its own (`limit`: the backend's batch limit).
    fn lead_full_batches(&mut self, limit: usize) {
        while self.waiting.len() >= self.gathering * (limit - 1) + limit {
            let next = self.waiting.remove(0);
            if next.turn.send(Turn::Lead).is_ok() {
                self.in_flight += 1;
                self.gathering += 1;
            }
        }
    }
}

impl Deletes {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A call ended (answered, or its leader was dropped, `gathering` if before it took its
    /// batch): the first delete still waiting leads the next one, or one call fewer is in
    /// flight (also when the leaders gathering will take every delete that waits: two calls
    /// answered together would otherwise split what waits between two leaders).
    fn hand_on(&self, gathering: bool, limit: usize) {
        let mut pending = self.pending();
        pending.gathering -= usize::from(gathering);
        while pending.waiting.len() > pending.gathering * (limit - 1) {
            let next = pending.waiting.remove(0);
            if next.turn.send(Turn::Lead).is_ok() {
                pending.gathering += 1;
                return;
            }
            // That delete is no longer awaited (its settling was dropped at shutdown).
        }
        pending.in_flight -= 1;
    }
}

/// Hands the lead on however the leader ends, so no waiting delete is stranded.
struct Leading<'a> {
    deletes: &'a Deletes,
    /// The backend's batch limit.
    limit: usize,
    /// It has not taken its batch yet.
    gathering: bool,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        self.deletes.hand_on(self.gathering, self.limit);
    }
}

impl Shared {
    /// Deletes a settled message: with the others that settle meanwhile, in one batch call,
    /// where the backend batches; else on its own call.
    pub(in crate::listener) async fn delete_settled(&self, id: &MessageId, receipt: &PopReceipt) -> Result<(), QueueError> {
        let limit = self.queue.delete_batch_limit();
        if limit < 2 {
            return self.queue.delete(id, receipt).await;
        }
        let deletes = &self.delivery.deletes;
        let (turn, told) = oneshot::channel();
        let leads = {
            let mut pending = deletes.pending();
            if pending.in_flight > 0 {
                pending.waiting.push(Waiting { entry: (id.clone(), receipt.clone()), turn });
                pending.lead_full_batches(limit);
                false
            } else {
                pending.in_flight = 1;
                pending.gathering = 1;
                true
            }
        };
        if !leads {
            match told.await {
                Ok(Turn::Done(result)) => return result,
                Ok(Turn::Lead) => {}
                Err(_) => return Err(QueueError::Transient(anyhow::anyhow!("message {id}: the batch delete ended without its result"))),
            }
        }
        let mut leading = Leading { deletes, limit, gathering: true };
        // Messages handled side by side settle in one poll of their batch: let the others
        // of it join before sending.
        tokio::task::yield_now().await;
        // One request's worth: the rest wait for the next leader.
        let others: Vec<Waiting> = {
            let mut pending = deletes.pending();
            let take = pending.waiting.len().min(limit - 1);
            let others = pending.waiting.drain(..take).collect();
            pending.gathering -= 1;
            leading.gathering = false;
            // What arrived while it gathered may be a full batch of its own.
            pending.lead_full_batches(limit);
            others
        };
        let mut batch = Vec::with_capacity(others.len() + 1);
        batch.push((id.clone(), receipt.clone()));
        let mut turns = Vec::with_capacity(others.len());
        for waiting in others {
            batch.push(waiting.entry);
            turns.push(waiting.turn);
        }
        let mut results = self.queue.delete_batch(&batch).await.into_iter();
        let own = results.next().unwrap_or_else(|| Err(QueueError::Fatal(anyhow::anyhow!("message {id}: the batch delete returned no result for it"))));
        for (turn, result) in turns.into_iter().zip(results) {
            // A delete whose settling was dropped (shutdown) no longer waits.
            let _ = turn.send(Turn::Done(result));
        }
        drop(leading);
        own
    }
}
