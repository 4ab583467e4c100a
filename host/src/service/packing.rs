//! The producers' side of payloads: items sent separately within a queue's `pack_linger`
//! are packed into shared envelopes by one task per queue, like a Kafka producer's batch.
//!
//! A sender hands its items to the task and waits for its answer: the task collects the
//! items that arrive within `pack_linger` of the first (or until about an envelope's worth
//! has come), packs them, puts the envelopes side by side, and answers each sender only
//! once every envelope holding one of its items was put. A failed put fails the senders
//! whose items it held. The items waiting (and being put) are bounded by
//! [`LINGER_BUFFER_BYTES`]: a sender waits for room, the buffer never grows without limit.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::payload::claims::{ClaimError, ClaimStore};
use crate::payload::{Body, DEFAULT_MAX_ITEMS, Item, MIN_ITEM_BYTES, Packed, Packer, PayloadSettings};
use crate::queue::{MessageId, QueueError};

/// Most bytes of items waiting for the packing task or being put, per queue: at zstd's
/// ratio on JSON about 80 Azure messages. Senders beyond it wait for room.
pub const LINGER_BUFFER_BYTES: usize = 16 << 20;

/// Most items in one send: what one envelope may hold at most (`payload::Limits`).
pub const MAX_ITEMS_PER_SEND: usize = DEFAULT_MAX_ITEMS as usize;

/// Sends waiting for the task, at most (each also holds its bytes of the buffer).
const QUEUED_SENDS: usize = 4096;

/// What a send of items came to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ItemsSent {
    /// How many items were stored.
    pub items: usize,
    /// The messages (envelopes) that hold them, each once, in the order put.
    pub messages: Vec<MessageId>,
    /// Where each item went, in the order sent: what a sender waits on for the item's
    /// answer ([`crate::QueueHandle::wait_item_reply`]). Other senders' items may share
    /// its envelope, so the message id alone does not name an item.
    pub ids: Vec<ItemId>,
}

/// One item sent: the message (envelope) holding it and its index there, as a reply
/// names it (`correlation_id` and `item`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ItemId {
    /// The envelope's message id.
    pub message_id: MessageId,
    /// The item's index in the envelope, from 0.
    pub item: u32,
}

/// Why a send of items failed. Nothing was stored, except after [`ItemsError::Storage`]
/// when the items spanned envelopes and some were put (at least once: a sender retries).
#[derive(Debug, thiserror::Error)]
pub enum ItemsError {
    /// No items given.
    #[error("no items to send")]
    Empty,
    /// More than [`MAX_ITEMS_PER_SEND`].
    #[error("{count} items in one send, over the limit of {MAX_ITEMS_PER_SEND}")]
    TooMany {
        /// Items given.
        count: usize,
    },
    /// More bytes than the packing buffer holds.
    #[error("{bytes} bytes of items in one send, over the limit of {LINGER_BUFFER_BYTES}")]
    TooManyBytes {
        /// Bytes given.
        bytes: usize,
    },
    /// An item that fits no message of the queue, even alone and compressed.
    #[error(
        "item {index} of {size} bytes does not fit a message of this queue (at most {limit} bytes with its envelope, after compression); claim checks are not enabled"
    )]
    TooLarge {
        /// Its index in the send.
        index: usize,
        /// Its size in bytes.
        size: usize,
        /// The queue's envelope limit in bytes.
        limit: usize,
    },
    /// An item too large for any envelope and over the queue's claim-check limit.
    #[error("item {index} of {size} bytes is over the queue's max_claim_check_bytes of {limit} bytes (too large for a message, and for a claim check)")]
    OverClaimLimit {
        /// Its index in the send.
        index: usize,
        /// Its size in bytes.
        size: usize,
        /// The queue's `max_claim_check_bytes`.
        limit: u64,
    },
    /// A put failed.
    #[error(transparent)]
    Storage(#[from] QueueError),
    /// The packing task is gone (the host is shutting down).
    #[error("the queue's packing task has stopped (shutting down?)")]
    Stopped,
}

impl ItemsError {
    /// Whether the sender's own items were the problem (never worth sending again as they are).
    pub fn is_senders(&self) -> bool {
        matches!(
            self,
            ItemsError::Empty | ItemsError::TooMany { .. } | ItemsError::TooManyBytes { .. } | ItemsError::TooLarge { .. } | ItemsError::OverClaimLimit { .. }
        )
    }
}

/// Puts one envelope; the packing task calls it for each envelope it made.
pub type PutEnvelope = Arc<dyn Fn(Vec<u8>) -> BoxFuture<'static, Result<MessageId, QueueError>> + Send + Sync>;

/// Told after envelopes were put: how many.
pub type Arrived = Arc<dyn Fn(usize) + Send + Sync>;

struct Pending {
    /// Inline until an item is offloaded to the claim store (then its claim check).
    items: Vec<Item>,
    bytes: usize,
    /// Its room in the buffer, given back when it is answered.
    _room: OwnedSemaphorePermit,
    answer: oneshot::Sender<Result<ItemsSent, ItemsError>>,
}

/// A queue's packing task's front: cheap to clone; the task ends when the last clone is dropped.
#[derive(Clone)]
pub struct Packing {
    sends: mpsc::Sender<Pending>,
    room: Arc<Semaphore>,
    room_bytes: usize,
}

impl Packing {
    /// Starts the packing task of a queue with `settings`, putting through `put` and telling
    /// `arrived` after each flush.
    pub fn start(settings: &PayloadSettings, put: PutEnvelope, arrived: Arrived) -> anyhow::Result<Packing> {
        Packing::start_with_room(settings, put, arrived, None, LINGER_BUFFER_BYTES)
    }

    /// [`Packing::start`] offloading items too large for any envelope into `claims` (the
    /// queue's claim store), up to its `max_bytes`: each body is stored durably before the
    /// envelope carrying its claim check is put.
    pub fn start_with_claims(settings: &PayloadSettings, put: PutEnvelope, arrived: Arrived, claims: Arc<dyn ClaimStore>) -> anyhow::Result<Packing> {
        Packing::start_with_room(settings, put, arrived, Some(claims), LINGER_BUFFER_BYTES)
    }

    /// [`Packing::start`] with a buffer of `room` bytes.
    fn start_with_room(
        settings: &PayloadSettings,
        put: PutEnvelope,
        arrived: Arrived,
        claims: Option<Arc<dyn ClaimStore>>,
        room: usize,
    ) -> anyhow::Result<Packing> {
        let packer = Packer::new(settings.compression, settings.max_envelope_bytes)?;
        let (sends, receiver) = mpsc::channel(QUEUED_SENDS);
        let task = Task { packer, linger: settings.pack_linger, put, arrived, claims, ratio: 1.0 };
        tokio::spawn(task.run(receiver));
        Ok(Packing { sends, room: Arc::new(Semaphore::new(room)), room_bytes: room })
    }

    /// Sends `items`, packed with the other senders' items of the same linger; returns once
    /// every envelope holding one of them was put.
    pub async fn send(&self, items: Vec<Bytes>) -> Result<ItemsSent, ItemsError> {
        if items.is_empty() {
            return Err(ItemsError::Empty);
        }
        if items.len() > MAX_ITEMS_PER_SEND {
            return Err(ItemsError::TooMany { count: items.len() });
        }
        // Each item carries the send's trace context, if it has one.
        let context = crate::telemetry::sending();
        // What the items take in the section: the smallest envelope record is 9 bytes, and a
        // context takes its bytes and their 3 bytes of lengths.
        let traced = context.as_ref().map_or(0, |context| context.len() + 3);
        let bytes = items.iter().map(|item| item.len() + MIN_ITEM_BYTES + traced).sum::<usize>();
        if bytes > self.room_bytes {
            return Err(ItemsError::TooManyBytes { bytes });
        }
        let room = self.room.clone().acquire_many_owned(bytes as u32).await.map_err(|_| ItemsError::Stopped)?;
        let (answer, answered) = oneshot::channel();
        let items = items.into_iter().map(|item| Item::inline(item).with_trace(context.clone())).collect();
        self.sends.send(Pending { items, bytes, _room: room, answer }).await.map_err(|_| ItemsError::Stopped)?;
        answered.await.map_err(|_| ItemsError::Stopped)?
    }
}

struct Task {
    packer: Packer,
    linger: Duration,
    put: PutEnvelope,
    arrived: Arrived,
    /// Where items too large for any envelope go, if the queue has a claim store.
    claims: Option<Arc<dyn ClaimStore>>,
    /// Item bytes per envelope byte at the last flush: how many bytes make an envelope full.
    ratio: f64,
}

impl Task {
    async fn run(mut self, mut receiver: mpsc::Receiver<Pending>) {
        while let Some(first) = receiver.recv().await {
            let deadline = Instant::now() + self.linger;
            let full = (self.packer.max_envelope_bytes() as f64 * self.ratio) as usize;
            let (mut bytes, mut count) = (first.bytes, first.items.len());
            let mut sends = vec![first];
            // An envelope's worth (by the last ratio) goes at once: waiting longer would only
            // delay it. `timeout_at` polls the receiver first, so a linger of zero still takes
            // the sends already waiting.
            while bytes < full && count < MAX_ITEMS_PER_SEND {
                match tokio::time::timeout_at(deadline, receiver.recv()).await {
                    Ok(Some(send)) => {
                        bytes += send.bytes;
                        count += send.items.len();
                        sends.push(send);
                    }
                    Ok(None) | Err(_) => break,
                }
            }
            self.flush(sends).await;
        }
    }

    /// Packs the sends' items and puts the envelopes; answers each send.
    async fn flush(&mut self, mut sends: Vec<Pending>) {
        loop {
            let items: Vec<Item> = sends.iter().flat_map(|send| send.items.iter().cloned()).collect();
            let owners: Vec<Owner> = sends.iter().enumerate().flat_map(|(s, send)| (0..send.items.len()).map(move |i| (s, i))).collect();
            let packed = match self.packer.pack(&items) {
                Ok(packed) => packed,
                // Only a failing compressor gets here (inline items always pack).
                Err(error) => return refuse_all(sends, error),
            };
            if packed.needs_claim_check.is_empty() {
                return self.put_envelopes(sends, packed, &owners).await;
            }
            sends = self.offload(sends, &packed.needs_claim_check, &owners).await;
            if sends.is_empty() {
                return;
            }
        }
    }

    /// Offloads the items that fit no envelope into the claim store first (durably), each
    /// replaced by its claim check, and returns the sends to pack again. A send with an item
    /// that cannot be offloaded is refused whole (nothing of its put but orphan bodies, which
    /// the sweeper removes).
    async fn offload(&self, mut sends: Vec<Pending>, needs_claim_check: &[usize], owners: &[Owner]) -> Vec<Pending> {
        let mut refused: Vec<Option<ItemsError>> = sends.iter().map(|_| None).collect();
        let mut offloads = Vec::new();
        for &index in needs_claim_check {
            let (send, item) = owners[index];
            match self.offload_of(&sends[send].items[item], item) {
                Ok((claims, body)) => offloads.push((send, item, claims, body)),
                Err(refusal) => {
                    refused[send].get_or_insert(refusal);
                }
            }
        }
        let stored = futures::future::join_all(offloads.into_iter().map(|(send, item, claims, body)| async move {
            let size = body.len();
            (send, item, size, claims.put(body).await)
        }))
        .await;
        for (send, item, size, result) in stored {
            match result {
                Ok(check) => {
                    let trace = sends[send].items[item].trace.take();
                    sends[send].items[item] = Item::claim_check(check).with_trace(trace);
                }
                Err(error) => {
                    refused[send].get_or_insert(self.claim_refusal(error, item, size));
                }
            }
        }
        answer_refused(sends, refused)
    }

    /// The claim store and the body to offload item `index` of a send, or why it cannot be.
    fn offload_of(&self, item: &Item, index: usize) -> Result<(Arc<dyn ClaimStore>, Bytes), ItemsError> {
        let Body::Inline(body) = &item.body else {
            // A claim check always fits an envelope; refusing keeps the flush's loop finite.
            return Err(ItemsError::TooLarge { index, size: 0, limit: self.packer.max_envelope_bytes() });
        };
        match &self.claims {
            None => Err(ItemsError::TooLarge { index, size: body.len(), limit: self.packer.max_envelope_bytes() }),
            Some(claims) if body.len() as u64 > claims.max_bytes() => Err(ItemsError::OverClaimLimit { index, size: body.len(), limit: claims.max_bytes() }),
            Some(claims) => Ok((claims.clone(), body.clone())),
        }
    }

    /// The send's refusal when the claim store did not take item `index` of `size` bytes.
    fn claim_refusal(&self, error: ClaimError, index: usize, size: usize) -> ItemsError {
        match error {
            ClaimError::Refused(_) => ItemsError::OverClaimLimit { index, size, limit: self.claims.as_ref().map_or(0, |c| c.max_bytes()) },
            error if error.is_retryable() => {
                ItemsError::Storage(QueueError::Transient(anyhow::Error::new(error).context("storing an item's claim-check body")))
            }
            error => ItemsError::Storage(QueueError::Fatal(anyhow::Error::new(error).context("storing an item's claim-check body"))),
        }
    }

    /// Puts the envelopes side by side and answers each send once every envelope holding one
    /// of its items was put (or with the error of one that failed).
    async fn put_envelopes(&mut self, sends: Vec<Pending>, packed: Packed, owners: &[Owner]) {
        let envelope_bytes: usize = packed.envelopes.iter().map(|e| e.bytes.len()).sum();
        let item_bytes: usize = sends.iter().map(|s| s.bytes).sum();
        if envelope_bytes > 0 {
            self.ratio = (item_bytes as f64 / envelope_bytes as f64).clamp(0.1, 100.0);
        }
        // Each envelope's items, as (send, index in that send), in the envelope's order.
        let holders: Vec<Vec<Owner>> = packed.envelopes.iter().map(|e| e.items.iter().map(|&i| owners[i]).collect()).collect();
        let puts = packed.envelopes.into_iter().map(|envelope| (self.put)(envelope.bytes));
        let results = futures::future::join_all(puts).await;
        let (answers, stored) = answers_of(&sends, results, holders);
        if stored > 0 {
            (self.arrived)(stored);
        }
        for (send, answer) in sends.into_iter().zip(answers) {
            let _ = send.answer.send(answer);
        }
    }
}

/// An item of a flush, as (send, index in that send).
type Owner = (usize, usize);

/// Answers every send with the packer's error.
fn refuse_all(sends: Vec<Pending>, error: anyhow::Error) {
    let reason = format!("{:#}", error.context("packing the items"));
    for send in sends {
        let _ = send.answer.send(Err(QueueError::Fatal(anyhow::anyhow!("{reason}")).into()));
    }
}

/// Answers the refused sends; returns the others.
fn answer_refused(sends: Vec<Pending>, refused: Vec<Option<ItemsError>>) -> Vec<Pending> {
    let mut kept = Vec::new();
    for (send, refusal) in sends.into_iter().zip(refused) {
        match refusal {
            Some(refusal) => drop(send.answer.send(Err(refusal))),
            None => kept.push(send),
        }
    }
    kept
}

/// Each send's answer from the envelopes' puts (`holders`: each envelope's items), and how
/// many envelopes were stored.
fn answers_of(sends: &[Pending], results: Vec<Result<MessageId, QueueError>>, holders: Vec<Vec<Owner>>) -> (Vec<Result<ItemsSent, ItemsError>>, usize) {
    let mut answers: Vec<Result<ItemsSent, ItemsError>> =
        sends.iter().map(|s| Ok(ItemsSent { items: s.items.len(), messages: Vec::new(), ids: Vec::new() })).collect();
    let mut places: Vec<Vec<Option<ItemId>>> = sends.iter().map(|s| vec![None; s.items.len()]).collect();
    let mut stored = 0;
    for (result, holders) in results.into_iter().zip(holders) {
        match result {
            Ok(id) => {
                stored += 1;
                for (position, (send, item)) in holders.into_iter().enumerate() {
                    places[send][item] = Some(ItemId { message_id: id.clone(), item: position as u32 });
                    if let Ok(sent) = &mut answers[send]
                        && sent.messages.last() != Some(&id)
                    {
                        sent.messages.push(id.clone());
                    }
                }
            }
            Err(error) => {
                for (send, _) in holders {
                    if answers[send].is_ok() {
                        answers[send] = Err(ItemsError::Storage(copy_of(&error)));
                    }
                }
            }
        }
    }
    for (answer, places) in answers.iter_mut().zip(places) {
        if let Ok(sent) = answer {
            // Every envelope holding one of its items was put: each item has its place.
            sent.ids = places.into_iter().flatten().collect();
        }
    }
    (answers, stored)
}

/// The same error for another sender (`QueueError` holds an `anyhow::Error`, which does
/// not clone): its kind kept, its message as text.
fn copy_of(error: &QueueError) -> QueueError {
    match error {
        QueueError::Transient(e) => QueueError::Transient(anyhow::anyhow!("{e:#}")),
        QueueError::Fatal(e) => QueueError::Fatal(anyhow::anyhow!("{e:#}")),
        QueueError::StaleReceipt { id } => QueueError::StaleReceipt { id: id.clone() },
        QueueError::MessageTooLarge { size, limit } => QueueError::MessageTooLarge { size: *size, limit: *limit },
        QueueError::InvalidBody(reason) => QueueError::InvalidBody(reason.clone()),
        QueueError::BadSend(reason) => QueueError::BadSend(reason.clone()),
        QueueError::BadBatchSize(n) => QueueError::BadBatchSize(*n),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::payload::{Codec, Decoded, Limits, decode};

    /// The envelopes put, with when.
    type Puts = Arc<Mutex<Vec<(Instant, Vec<u8>)>>>;

    /// A put that records envelopes and takes `put_time` (paused clock), failing when told.
    fn recording(put_time: Duration, fail: Arc<std::sync::atomic::AtomicBool>) -> (PutEnvelope, Puts) {
        let puts = Arc::new(Mutex::new(Vec::new()));
        let seen = puts.clone();
        let put: PutEnvelope = Arc::new(move |bytes| {
            let (seen, fail) = (seen.clone(), fail.clone());
            Box::pin(async move {
                tokio::time::sleep(put_time).await;
                if fail.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err(QueueError::Transient(anyhow::anyhow!("storage is down")));
                }
                let mut seen = seen.lock().unwrap();
                seen.push((Instant::now(), bytes));
                Ok(MessageId::from(format!("m{}", seen.len())))
            })
        });
        (put, puts)
    }

    fn settings(linger: Duration) -> PayloadSettings {
        PayloadSettings {
            compression: Codec::Zstd,
            pack_linger: linger,
            max_envelope_bytes: crate::payload::AZURE_MAX_ENVELOPE_BYTES,
            ..PayloadSettings::default()
        }
    }

    fn items_of(bytes: &[u8]) -> Vec<Bytes> {
        match decode(bytes, &Limits::default()).unwrap() {
            Decoded::Envelope(envelope) => envelope.items.into_iter().map(|item| match item.body {
                crate::payload::Body::Inline(bytes) => bytes,
                crate::payload::Body::ClaimCheck(_) => panic!("a claim check"),
            }),
            Decoded::NotAnEnvelope => panic!("not an envelope"),
        }
        .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn items_sent_separately_within_the_linger_share_one_envelope_put_when_it_ends() {
        let (put, puts) = recording(Duration::from_millis(3), Arc::default());
        let arrived = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let told = arrived.clone();
        let packing = Packing::start(
            &settings(Duration::from_millis(10)),
            put,
            Arc::new(move |n| {
                told.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
            }),
        )
        .unwrap();
        let start = Instant::now();
        let senders: Vec<_> = (0..16u64)
            .map(|i| {
                let packing = packing.clone();
                tokio::spawn(async move {
                    // Spread over 8 ms, all within the 10 ms linger of the first.
                    tokio::time::sleep(Duration::from_micros(500 * i)).await;
                    packing.send(vec![Bytes::from(format!("{{\"order\":{i}}}"))]).await
                })
            })
            .collect();
        let mut answers = Vec::new();
        for sender in senders {
            answers.push(sender.await.unwrap().unwrap());
        }
        let puts = puts.lock().unwrap();
        assert_eq!(puts.len(), 1, "one envelope for the 16 items");
        // Put when the linger of the first item ended, plus the put's own time.
        assert_eq!(puts[0].0 - start, Duration::from_millis(13));
        let mut items: Vec<Bytes> = items_of(&puts[0].1);
        items.sort();
        let mut expected: Vec<Bytes> = (0..16).map(|i| Bytes::from(format!("{{\"order\":{i}}}"))).collect();
        expected.sort();
        assert_eq!(items, expected);
        assert!(answers.iter().all(|a| a.items == 1 && a.messages == [MessageId::from("m1")]));
        let mut places: Vec<u32> = answers.iter().map(|a| a.ids[0].item).collect();
        places.sort_unstable();
        assert_eq!(places, (0..16).collect::<Vec<u32>>(), "each sender's item has its own place in the shared envelope");
        assert!(answers.iter().all(|a| a.ids.len() == 1 && a.ids[0].message_id.as_str() == "m1"));
        assert_eq!(arrived.load(std::sync::atomic::Ordering::SeqCst), 1, "told of one message");
    }

    #[tokio::test(start_paused = true)]
    async fn items_after_the_linger_go_in_the_next_envelope() {
        let (put, puts) = recording(Duration::from_millis(1), Arc::default());
        let packing = Packing::start(&settings(Duration::from_millis(10)), put, Arc::new(|_| {})).unwrap();
        let first = packing.send(vec![Bytes::from_static(b"a")]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let second = packing.send(vec![Bytes::from_static(b"b")]).await.unwrap();
        assert_ne!(first.messages, second.messages);
        assert_eq!(puts.lock().unwrap().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_linger_of_zero_puts_at_once() {
        let (put, puts) = recording(Duration::ZERO, Arc::default());
        let packing = Packing::start(&settings(Duration::ZERO), put, Arc::new(|_| {})).unwrap();
        let start = Instant::now();
        packing.send(vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")]).await.unwrap();
        assert_eq!(puts.lock().unwrap()[0].0, start);
        assert_eq!(items_of(&puts.lock().unwrap()[0].1), vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_put_fails_its_senders_and_stores_nothing_of_theirs() {
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (put, puts) = recording(Duration::from_millis(1), fail.clone());
        let packing = Packing::start(&settings(Duration::from_millis(10)), put, Arc::new(|_| {})).unwrap();
        let (a, b) = tokio::join!(packing.send(vec![Bytes::from_static(b"a")]), packing.send(vec![Bytes::from_static(b"b")]));
        assert!(matches!(a, Err(ItemsError::Storage(QueueError::Transient(_)))), "{a:?}");
        assert!(matches!(b, Err(ItemsError::Storage(QueueError::Transient(_)))), "{b:?}");
        assert!(puts.lock().unwrap().is_empty());
        fail.store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(packing.send(vec![Bytes::from_static(b"c")]).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn an_item_too_large_for_any_envelope_refuses_its_send_alone() {
        let (put, puts) = recording(Duration::ZERO, Arc::default());
        let small = PayloadSettings { compression: Codec::None, max_envelope_bytes: 100, ..settings(Duration::from_millis(10)) };
        let packing = Packing::start(&small, put, Arc::new(|_| {})).unwrap();
        let (big, fine) =
            tokio::join!(packing.send(vec![Bytes::from_static(b"ok"), Bytes::from(vec![b'x'; 200])]), packing.send(vec![Bytes::from_static(b"fine")]));
        assert!(matches!(big, Err(ItemsError::TooLarge { index: 1, size: 200, limit: 100 })), "{big:?}");
        assert_eq!(fine.unwrap().items, 1);
        let puts = puts.lock().unwrap();
        assert_eq!(puts.len(), 1);
        assert_eq!(items_of(&puts[0].1), vec![Bytes::from_static(b"fine")], "nothing of the refused send was put");
    }

    #[tokio::test]
    async fn an_item_too_large_for_any_envelope_is_offloaded_before_its_envelope_and_one_over_the_claim_limit_is_refused() {
        use crate::payload::claims::EmbeddedClaims;
        use crate::queue::QueueClient as _;
        use crate::queue::embedded::{EmbeddedOptions, EmbeddedStore};
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
        let queue = store.queue("orders");
        queue.create_if_missing().await.unwrap();
        let claims: Arc<dyn ClaimStore> = Arc::new(EmbeddedClaims::new(store.queue("orders"), 1_000));
        let (put, puts) = recording(Duration::ZERO, Arc::default());
        // The envelope's put looks into the store: the body must already be there.
        let seen_claims = claims.clone();
        let checked: PutEnvelope = Arc::new(move |bytes: Vec<u8>| {
            let (put, claims) = (put.clone(), seen_claims.clone());
            Box::pin(async move {
                if let Decoded::Envelope(envelope) = decode(&bytes, &Limits { references: claims.allowed(), ..Limits::default() }).unwrap() {
                    for item in &envelope.items {
                        if let crate::payload::Body::ClaimCheck(check) = &item.body {
                            assert_eq!(claims.get(check, 1_000).await.unwrap().len(), 500, "the body was stored before its envelope was put");
                        }
                    }
                }
                put(bytes).await
            })
        });
        let small = PayloadSettings { compression: Codec::None, max_envelope_bytes: 100, ..settings(Duration::ZERO) };
        let packing = Packing::start_with_claims(&small, checked, Arc::new(|_| {}), claims.clone()).unwrap();
        let mut rng = fastrand::Rng::with_seed(7);
        let big = Bytes::from((0..500).map(|_| rng.u8(..)).collect::<Vec<u8>>());
        let sent = packing.send(vec![Bytes::from_static(b"ok"), big.clone()]).await.unwrap();
        assert_eq!(sent.items, 2);
        assert_eq!(puts.lock().unwrap().len(), 1, "one envelope: the inline item and the claim check");
        let over = packing.send(vec![Bytes::from(vec![b'x'; 1_001])]).await;
        assert!(matches!(over, Err(ItemsError::OverClaimLimit { index: 0, size: 1_001, limit: 1_000 })), "{over:?}");
        assert!(over.unwrap_err().to_string().contains("max_claim_check_bytes"));
        assert_eq!(puts.lock().unwrap().len(), 1, "nothing of the refused send was put");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_buffer_makes_senders_wait_for_room() {
        // Puts that take a minute hold the buffer's room until they end.
        let (put, puts) = recording(Duration::from_secs(60), Arc::default());
        let packing = Packing::start_with_room(&settings(Duration::ZERO), put, Arc::new(|_| {}), None, 1_000).unwrap();
        let send = |fill: u8| {
            let packing = packing.clone();
            tokio::spawn(async move { packing.send(vec![Bytes::from(vec![fill; 591])]).await })
        };
        let first = send(b'a');
        tokio::time::sleep(Duration::from_millis(1)).await;
        let second = send(b'b');
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!second.is_finished(), "the second send waits for room while the first is put");
        assert_eq!(puts.lock().unwrap().len(), 0);
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
        let puts = puts.lock().unwrap();
        assert_eq!(puts.len(), 2);
        assert_eq!(puts[1].0 - puts[0].0, Duration::from_secs(60), "the second was put only after the first freed its room");
        assert!(matches!(futures::executor::block_on(packing.send(vec![Bytes::from(vec![b'c'; 1_000])])), Err(ItemsError::TooManyBytes { bytes: 1_009 })));
    }
}
