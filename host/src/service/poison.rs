//! An operator's work on a queue's poison messages: list them, requeue some or all to the
//! queue they came from (a new message there, so its dequeue count starts again), purge them.
//!
//! A queue service has no cursor to page with (Azure's peek sees only the first 32), so each
//! operation leases the poison messages it looks at, a batch at a time, and gives back at
//! the end (visible again at once) those it leaves. Nobody else consumes a poison queue, so
//! the leases hold nothing up. A requeued message is put on its queue before it is deleted
//! from the poison queue: a failure in between duplicates, never loses it.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result};
use serde::Serialize;

use super::QueueHandle;
use crate::listener::PoisonEnvelope;
use crate::queue::{Message, QueueClient};

/// How long an operation holds the poison messages it looked at (it gives them back sooner).
const LOOK_LEASE: Duration = Duration::from_secs(60);
/// Most poison messages one operation looks at.
pub const MAX_PER_OPERATION: u32 = 10_000;
/// Characters of a body shown in a listing.
const PREVIEW_CHARS: usize = 512;

/// A poison message as a listing shows it.
#[derive(Debug, Clone, Serialize)]
pub struct PoisonEntry {
    /// Its id in the poison queue (what requeue takes).
    pub id: String,
    /// When it was poisoned (put in the poison queue).
    #[serde(with = "humantime_serde")]
    pub poisoned_at: SystemTime,
    /// Why it was poisoned (none for a bare body: the envelope did not fit).
    pub reason: Option<String>,
    /// Its id in its own queue.
    pub original_id: Option<String>,
    /// Times it had been leased in its own queue.
    pub dequeue_count: Option<u32>,
    /// Its body's length in bytes.
    pub body_bytes: usize,
    /// The body's first characters, as text (non-UTF-8 bodies as hex).
    pub preview: String,
    /// `envelope` (with the reason) or `body` (the bare body).
    pub form: &'static str,
}

/// A poison message decoded: its original body and what the envelope said.
struct Poisoned {
    body: Vec<u8>,
    envelope: Option<PoisonEnvelope>,
}

fn decode(message: &Message) -> Poisoned {
    let envelope = serde_json::from_slice::<PoisonEnvelope>(&message.body).ok();
    let body = envelope.as_ref().and_then(|e| match (&e.body, &e.body_hex) {
        (Some(text), _) => Some(text.clone().into_bytes()),
        (None, Some(hex)) => hex::decode(hex).ok(),
        (None, None) => None,
    });
    match (envelope, body) {
        (Some(envelope), Some(body)) => Poisoned { body, envelope: Some(envelope) },
        // Not one of ours (a bare body, or JSON that only looks like an envelope).
        _ => Poisoned { body: message.body.to_vec(), envelope: None },
    }
}

fn entry(message: &Message) -> PoisonEntry {
    let Poisoned { body, envelope } = decode(message);
    let preview = match std::str::from_utf8(&body) {
        Ok(text) => text.chars().take(PREVIEW_CHARS).collect(),
        Err(_) => hex::encode(&body[..body.len().min(PREVIEW_CHARS / 2)]),
    };
    PoisonEntry {
        id: message.id.to_string(),
        poisoned_at: message.inserted_at,
        reason: envelope.as_ref().map(|e| e.error.clone()),
        original_id: envelope.as_ref().map(|e| e.original_id.to_string()),
        dequeue_count: envelope.as_ref().map(|e| e.dequeue_count),
        body_bytes: body.len(),
        preview,
        form: if envelope.is_some() { "envelope" } else { "body" },
    }
}

/// Poison messages leased a batch at a time, up to a most; those left (not taken by the
/// operation) are given back, visible at once, by [`Looking::finish`].
struct Looking<'a> {
    poison: &'a dyn QueueClient,
    most: u32,
    seen: u32,
    left: Vec<Message>,
}

impl<'a> Looking<'a> {
    fn new(poison: &'a dyn QueueClient, most: u32) -> Self {
        Looking { poison, most: most.min(MAX_PER_OPERATION), seen: 0, left: Vec::new() }
    }

    /// The next batch (empty when done).
    async fn next_batch(&mut self) -> Result<Vec<Message>> {
        if self.seen >= self.most {
            return Ok(Vec::new());
        }
        let batch = self
            .poison
            .get((self.most - self.seen).min(32), LOOK_LEASE)
            .await
            .with_context(|| format!("failed to read poison queue {}", self.poison.name()))?;
        self.seen += batch.len() as u32;
        Ok(batch)
    }

    /// Gives back every message left, and passes `outcome` on.
    async fn finish<T>(self, outcome: Result<T>) -> Result<T> {
        for message in self.left {
            // Not given back, it comes back when the lease runs out: nothing is lost.
            let _ = self.poison.update_visibility(&message.id, &message.pop_receipt, Duration::ZERO).await;
        }
        outcome
    }
}

/// The first `limit` poison messages (at most [`MAX_PER_OPERATION`]), oldest first.
pub async fn list(poison: &dyn QueueClient, limit: u32) -> Result<Vec<PoisonEntry>> {
    let mut looking = Looking::new(poison, limit);
    let mut entries = Vec::new();
    let outcome = loop {
        match looking.next_batch().await {
            Ok(batch) if batch.is_empty() => break Ok(()),
            Ok(batch) => {
                entries.extend(batch.iter().map(entry));
                looking.left.extend(batch);
            }
            Err(error) => break Err(error),
        }
    };
    looking.finish(outcome).await.map(|()| entries)
}

/// Which poison messages to requeue.
pub enum Selection {
    All,
    Ids(BTreeSet<String>),
}

/// Puts the selected poison messages' bodies back on `queue` (new messages: their dequeue
/// count starts again) and deletes them from the poison queue; returns how many. At most
/// [`MAX_PER_OPERATION`] are looked at per call.
pub async fn requeue(poison: &dyn QueueClient, queue: &QueueHandle, selection: &Selection) -> Result<u64> {
    take(poison, selection, Some(queue)).await
}

/// Deletes every poison message (at most [`MAX_PER_OPERATION`] per call); returns how many.
pub async fn purge(poison: &dyn QueueClient) -> Result<u64> {
    take(poison, &Selection::All, None).await
}

/// Deletes the selected poison messages, each after putting its body on `requeue_to` if
/// given; returns how many.
async fn take(poison: &dyn QueueClient, selection: &Selection, requeue_to: Option<&QueueHandle>) -> Result<u64> {
    let mut looking = Looking::new(poison, MAX_PER_OPERATION);
    let mut taken = 0;
    let outcome = 'batches: loop {
        let batch = match looking.next_batch().await {
            Ok(batch) if batch.is_empty() => break Ok(()),
            Ok(batch) => batch,
            Err(error) => break Err(error),
        };
        let mut batch = batch.into_iter();
        while let Some(message) = batch.next() {
            if let Selection::Ids(ids) = selection
                && !ids.contains(message.id.as_str())
            {
                looking.left.push(message);
                continue;
            }
            if let Some(queue) = requeue_to
                && let Err(error) = queue.send(&decode(&message).body, Duration::ZERO, super::handle::SEND_DEADLINE).await
            {
                looking.left.push(message);
                looking.left.extend(batch);
                break 'batches Err(anyhow::Error::new(error).context(format!("failed to requeue poison messages to {}", queue.name())));
            }
            if let Err(error) = poison.delete(&message.id, &message.pop_receipt).await {
                looking.left.extend(batch);
                let done = if requeue_to.is_some() { "requeued it, but" } else { "" };
                break 'batches Err(
                    anyhow::Error::new(error).context(format!("{done} failed to delete poison message {}", message.id).trim_start().to_string())
                );
            }
            taken += 1;
        }
    };
    looking.finish(outcome).await.map(|()| taken)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::queue::TokioClock;
    use crate::queue::memory::MemoryQueue;

    fn envelope(id: &str, body: &[u8]) -> Vec<u8> {
        let text = std::str::from_utf8(body).ok().map(str::to_owned);
        let envelope = PoisonEnvelope {
            queue: "work".into(),
            original_id: id.to_string().into(),
            dequeue_count: 5,
            error: format!("handler failed on {id}"),
            inserted_at: "2026-11-27T10:00:00.000Z".into(),
            poisoned_at: "2026-11-27T10:01:00.000Z".into(),
            body_hex: text.is_none().then(|| hex::encode(body)),
            body: text,
        };
        serde_json::to_vec(&envelope).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn list_requeue_and_purge_keep_every_message_they_do_not_take() {
        let clock = Arc::new(TokioClock::new());
        let work = Arc::new(MemoryQueue::new("work", clock.clone(), 65536));
        let poison = MemoryQueue::new("work-poison", clock, 65536);
        let handle = QueueHandle::new("work", work.clone(), Vec::new());
        poison.put(&envelope("a", b"<script>alert(1)</script>"), Duration::ZERO).await.unwrap();
        poison.put(&envelope("b", &[0xff, 0x00, 0x01]), Duration::ZERO).await.unwrap();
        poison.put(b"a bare body", Duration::ZERO).await.unwrap();
        for _ in 0..40 {
            poison.put(&envelope("n", b"{}"), Duration::ZERO).await.unwrap();
        }

        let listed = list(&poison, 100).await.unwrap();
        assert_eq!(listed.len(), 43, "more than one batch");
        assert_eq!((listed[0].preview.as_str(), listed[0].reason.as_deref()), ("<script>alert(1)</script>", Some("handler failed on a")));
        assert_eq!((listed[1].preview.as_str(), listed[1].body_bytes), ("ff0001", 3));
        assert_eq!((listed[2].form, listed[2].reason.as_deref()), ("body", None));
        assert_eq!(poison.approximate_count().await.unwrap(), 43);
        assert_eq!(list(&poison, 5).await.unwrap().len(), 5, "listed again at once: every message was given back");

        let picked = Selection::Ids([listed[1].id.clone(), listed[2].id.clone()].into());
        assert_eq!(requeue(&poison, &handle, &picked).await.unwrap(), 2);
        let back = work.get(32, Duration::from_secs(30)).await.unwrap();
        let mut bodies: Vec<Vec<u8>> = back.iter().map(|m| m.body.to_vec()).collect();
        bodies.sort();
        assert_eq!(bodies, [b"a bare body".to_vec(), vec![0xff, 0x00, 0x01]], "the original bodies, not the envelopes");
        assert!(back.iter().all(|m| m.dequeue_count == 1), "a fresh dequeue count");
        assert_eq!(poison.approximate_count().await.unwrap(), 41);

        assert_eq!(requeue(&poison, &handle, &Selection::All).await.unwrap(), 41);
        assert_eq!(poison.approximate_count().await.unwrap(), 0);
        poison.put(b"x", Duration::ZERO).await.unwrap();
        assert_eq!(purge(&poison).await.unwrap(), 1);
        assert_eq!(poison.approximate_count().await.unwrap(), 0);
    }
}
