//! Taking answers off a reply queue for the producers waiting on this host. One reader per
//! reply queue runs while anyone here waits: it reads the queue a batch at a time, hands each
//! answer to its waiter, and deletes those older than the queue's `reply_ttl` (nobody is
//! coming for them: without this, unclaimed answers pile up and every wait reads past them).
//! The answers nobody here waits for (another host's producer may) are left leased for a
//! moment, [`PASS_OVER`]: they come back on their own, so passing over one costs no storage
//! call (a release per answer made a backlog of unclaimed answers cost a billed call each on
//! every look), and the next get reaches past them. A full batch is followed by the next at
//! once, so a wait reads through a long queue in one go; a short one means the queue was
//! read through, and the next look waits a pause.
//!
//! The host also sweeps each reply queue every `reply_ttl` ([`ReplyReader::sweep`]), so
//! answers nobody ever waits for do not stay.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, oneshot};

use crate::listener::Reply;
use crate::queue::clock::{Clock, SystemClock, system_time};
use crate::queue::{MAX_BATCH, Message, MessageId, PopReceipt, QueueClient};

/// The first pause between two looks at a reply queue read through, doubled up to
/// [`POLL_MAX`] while nothing new is found.
const POLL_MIN: Duration = Duration::from_millis(50);
/// The longest pause between two looks at a reply queue.
const POLL_MAX: Duration = Duration::from_secs(1);
/// How long a look leases what it reads: the answers it hands over are deleted at once, the
/// others stay hidden this long and come back by themselves. The next look must get past
/// them (a queue's order is not reliable enough to count on released ones going to the
/// back); another host's waiter may wait this much longer for its answer.
const PASS_OVER: Duration = Duration::from_secs(2);
/// Most answers passed over that a reader remembers (with their lease) for a waiter that comes
/// while they are hidden, and most bytes of their bodies.
const REMEMBERED_MAX: usize = 4096;
const REMEMBERED_MAX_BYTES: usize = 16 << 20;
/// A remembered answer is given up this long before its lease ends (the lease was counted from
/// before the get was sent): a delete must not race the answer coming back for another reader.
const LEASE_MARGIN_MS: u64 = 200;
/// How long a wait whose time ran out as its answer was being taken waits for it.
const HANDOVER_GRACE: Duration = Duration::from_secs(10);
/// Most messages one sweep reads: a sweep is bounded work, the next one goes on.
const SWEEP_MAX_MESSAGES: usize = 100_000;

/// An answer's key: the request's message id, and the item for an item's answer.
type Key = (String, Option<u32>);

/// What a waiter is handed: the answer, or why the reader stopped.
type Handed = Result<Reply, String>;

/// The reader of one reply queue for this host's waiters.
pub(crate) struct ReplyReader {
    queue: Arc<dyn QueueClient>,
    ttl: Duration,
    /// The configured queue that handles the answers (a pipeline), if one does.
    handled_by: Option<String>,
    /// What an answer's age is measured by (against its insertion time).
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    /// A new waiter: look now, not after the pause.
    waiter_came: Notify,
}

#[derive(Default)]
struct State {
    waiters: HashMap<Key, oneshot::Sender<Handed>>,
    reading: bool,
    /// Why waits end now, once the host shuts down ([`ReplyReader::close`]).
    closed: Option<String>,
    expired: u64,
    /// Answers passed over while their lease holds: a waiter that comes for one meanwhile (the
    /// next item of a producer waiting item by item) takes it at once with that lease, rather
    /// than waiting for it to come back.
    remembered: Remembered,
}

/// An answer passed over, with the lease the look took on it.
struct Passed {
    id: MessageId,
    pop_receipt: PopReceipt,
    reply: Reply,
    /// Its message's length, counted against [`REMEMBERED_MAX_BYTES`].
    bytes: usize,
    /// When the lease ends (clock milliseconds): after that, the next look finds it again.
    until_ms: u64,
}

/// Bounded memory of the answers passed over, oldest forgotten first.
#[derive(Default)]
struct Remembered {
    /// Each answer with the number it was remembered under.
    by_key: HashMap<Key, (u64, Passed)>,
    /// Keys in the order they were remembered, with that number (a key remembered again
    /// leaves a stale place here, skipped).
    order: std::collections::VecDeque<(Key, u64)>,
    bytes: usize,
    next: u64,
}

impl Remembered {
    fn remember(&mut self, key: Key, passed: Passed, now_ms: u64) {
        self.forget_expired(now_ms);
        let number = self.next;
        self.next += 1;
        self.bytes += passed.bytes;
        if let Some((_, old)) = self.by_key.insert(key.clone(), (number, passed)) {
            self.bytes -= old.bytes;
        }
        self.order.push_back((key, number));
        while self.by_key.len() > REMEMBERED_MAX || self.bytes > REMEMBERED_MAX_BYTES {
            let Some((key, number)) = self.order.pop_front() else { break };
            if self.by_key.get(&key).is_some_and(|(current, _)| *current == number)
                && let Some((_, forgotten)) = self.by_key.remove(&key)
            {
                self.bytes -= forgotten.bytes;
            }
        }
        // Keys remembered again leave stale places in the order: keep it bounded.
        if self.order.len() > 2 * REMEMBERED_MAX {
            let by_key = &self.by_key;
            self.order.retain(|(key, number)| by_key.get(key).is_some_and(|(current, _)| current == number));
        }
    }

    /// Forgets the oldest answers whose lease has ended (a look finds them again): what is
    /// kept is what was passed over in the last [`PASS_OVER`].
    fn forget_expired(&mut self, now_ms: u64) {
        while let Some((key, number)) = self.order.front() {
            match self.by_key.get(key) {
                Some((current, passed)) if current == number && passed.until_ms > now_ms => break,
                Some((current, _)) if current == number => {
                    if let Some((_, forgotten)) = self.by_key.remove(key) {
                        self.bytes -= forgotten.bytes;
                    }
                }
                // A stale place: the key was remembered again later, or taken.
                _ => {}
            }
            self.order.pop_front();
        }
    }

    /// The answer for `key`, if one was passed over and its lease still holds.
    fn take(&mut self, key: &Key, now_ms: u64) -> Option<Passed> {
        let (_, passed) = self.by_key.remove(key)?;
        self.bytes -= passed.bytes;
        (passed.until_ms > now_ms).then_some(passed)
    }
}

/// What one look at the queue found.
struct Look {
    /// A whole batch came: more may be waiting behind it.
    full: bool,
    /// How many messages it read.
    read: usize,
}

impl ReplyReader {
    /// A reader of `queue`, deleting answers older than `ttl`; `handled_by`: the configured
    /// queue whose listener takes the answers instead (waits are refused).
    pub(crate) fn new(queue: Arc<dyn QueueClient>, ttl: Duration, handled_by: Option<String>) -> Arc<ReplyReader> {
        Self::with_clock(queue, ttl, handled_by, Arc::new(SystemClock))
    }

    fn with_clock(queue: Arc<dyn QueueClient>, ttl: Duration, handled_by: Option<String>, clock: Arc<dyn Clock>) -> Arc<ReplyReader> {
        Arc::new(ReplyReader { queue, ttl, handled_by, clock, state: Mutex::default(), waiter_came: Notify::new() })
    }

    /// The reply queue's client.
    pub(crate) fn queue(&self) -> &Arc<dyn QueueClient> {
        &self.queue
    }

    /// The configured queue that handles the answers, if one does.
    pub(crate) fn handled_by(&self) -> Option<&str> {
        self.handled_by.as_deref()
    }

    /// The reply queue's name.
    pub(crate) fn name(&self) -> &str {
        self.queue.name()
    }

    /// Answers deleted because they outlived `reply_ttl`, since the host started.
    pub(crate) fn expired(&self) -> u64 {
        self.state.lock().unwrap().expired
    }

    /// Waits up to `timeout` for the answer to message `id` (item `item`), and takes it
    /// (deleted once read). `None` when none came in time. One wait per answer on this
    /// host at a time.
    pub(crate) async fn wait(self: &Arc<Self>, id: &MessageId, item: Option<u32>, timeout: Duration) -> anyhow::Result<Option<Reply>> {
        if let Some(queue) = &self.handled_by {
            anyhow::bail!(
                "the answers go to reply queue {}, which queue {queue} handles (a pipeline): its listener takes them, so there is no answer to wait for here",
                self.name()
            );
        }
        let key: Key = (id.to_string(), item);
        let passed = self.state.lock().unwrap().remembered.take(&key, self.clock.now_ms());
        if let Some(passed) = passed {
            // Passed over a moment ago, still under that look's lease: take it now (else the
            // next look finds it once the lease ends).
            if self.queue.delete(&passed.id, &passed.pop_receipt).await.is_ok() {
                return Ok(Some(passed.reply));
            }
        }
        let (handing, handed) = oneshot::channel();
        let start_reading = {
            let mut state = self.state.lock().unwrap();
            if let Some(reason) = &state.closed {
                anyhow::bail!("{reason}");
            }
            if state.waiters.get(&key).is_some_and(|waiter| !waiter.is_closed()) {
                anyhow::bail!("another request on this host waits for this answer already");
            }
            state.waiters.insert(key.clone(), handing);
            !std::mem::replace(&mut state.reading, true)
        };
        if start_reading {
            let reader = self.clone();
            tokio::spawn(async move { reader.read_while_waited_for().await });
        } else {
            self.waiter_came.notify_one();
        }
        let mut handed = handed;
        let outcome = match tokio::time::timeout(timeout, &mut handed).await {
            Ok(outcome) => outcome,
            Err(_) => {
                if self.state.lock().unwrap().waiters.remove(&key).is_some() {
                    return Ok(None);
                }
                // The reader took this answer as the time ran out, and hands it over as soon
                // as its delete returns: wait for that, rather than lose the answer.
                match tokio::time::timeout(HANDOVER_GRACE, &mut handed).await {
                    Ok(outcome) => outcome,
                    Err(_) => {
                        self.state.lock().unwrap().waiters.remove(&key);
                        return Ok(None);
                    }
                }
            }
        };
        match outcome {
            Ok(Ok(reply)) => Ok(Some(reply)),
            Ok(Err(reason)) => anyhow::bail!("{reason}"),
            Err(_) => anyhow::bail!("the reader of reply queue {} stopped", self.name()),
        }
    }

    /// Ends every wait with `reason` and refuses new ones: a shutting-down host answers its
    /// waiters at once rather than holding their requests open (an answer being handed over
    /// is still handed).
    pub(crate) fn close(&self, reason: &str) {
        let mut state = self.state.lock().unwrap();
        state.closed = Some(reason.to_string());
        for (_, waiter) in state.waiters.drain() {
            let _ = waiter.send(Err(reason.to_string()));
        }
    }

    /// Looks at the queue until nobody waits; a failed look fails every waiter.
    async fn read_while_waited_for(self: Arc<Self>) {
        let mut pause = POLL_MIN;
        loop {
            {
                let mut state = self.state.lock().unwrap();
                state.waiters.retain(|_, waiter| !waiter.is_closed());
                if state.waiters.is_empty() {
                    state.reading = false;
                    return;
                }
            }
            match self.look().await {
                Ok(look) if look.full => {
                    pause = POLL_MIN;
                    // A long queue read without pause: let the other tasks run between batches.
                    tokio::task::yield_now().await;
                }
                Ok(_) => {
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = self.waiter_came.notified() => {}
                    }
                    pause = (pause * 2).min(POLL_MAX);
                }
                Err(error) => {
                    let reason = format!("reading reply queue {}: {error:#}", self.name());
                    let mut state = self.state.lock().unwrap();
                    for (_, waiter) in state.waiters.drain() {
                        let _ = waiter.send(Err(reason.clone()));
                    }
                    state.reading = false;
                    return;
                }
            }
        }
    }

    /// Reads through the queue once (up to [`SWEEP_MAX_MESSAGES`]): answers outlived their
    /// `reply_ttl` deleted, answers this host waits for handed over, the rest released.
    pub(crate) async fn sweep(&self) -> anyhow::Result<()> {
        // Answers remembered by the last wait, long past their lease, are let go.
        self.state.lock().unwrap().remembered.forget_expired(self.clock.now_ms());
        let mut read = 0;
        while read < SWEEP_MAX_MESSAGES {
            let look = self.look().await?;
            read += look.read;
            if !look.full {
                break;
            }
        }
        Ok(())
    }

    /// One batch: each message handed to its waiter, deleted as expired, or passed over.
    async fn look(&self) -> anyhow::Result<Look> {
        let leased_at_ms = self.clock.now_ms();
        let got = self.queue.get(MAX_BATCH, PASS_OVER).await?;
        let look = Look { full: got.len() == MAX_BATCH as usize, read: got.len() };
        let now = system_time(self.clock.now_ms());
        for message in got {
            self.settle(message, now, leased_at_ms).await;
        }
        Ok(look)
    }

    async fn settle(&self, message: Message, now: SystemTime, leased_at_ms: u64) {
        let expired = now.duration_since(message.inserted_at).unwrap_or_default() > self.ttl;
        let Some(reply) = serde_json::from_slice::<Reply>(&message.body).ok() else {
            if expired {
                self.delete_expired(&message).await;
            }
            return;
        };
        let key: Key = (reply.correlation_id.clone(), reply.item);
        // One look at the waiters and the memory together: a wait that comes meanwhile finds
        // the answer in one or the other.
        let waiter = {
            let mut state = self.state.lock().unwrap();
            let waiter = state.waiters.remove(&key).filter(|waiter| !waiter.is_closed());
            if waiter.is_none() && !expired {
                // Another waiter's, maybe on another host, or one of ours to come: its lease
                // runs out in PASS_OVER; until then a wait here takes it from memory (while
                // anyone waits: a sweep's answers are not kept for nobody).
                if state.reading {
                    let until_ms = leased_at_ms.saturating_add(PASS_OVER.as_millis() as u64).saturating_sub(LEASE_MARGIN_MS);
                    let bytes = message.body.len();
                    state.remembered.remember(key, Passed { id: message.id, pop_receipt: message.pop_receipt, reply, bytes, until_ms }, leased_at_ms);
                }
                return;
            }
            waiter
        };
        let Some(waiter) = waiter else {
            self.delete_expired(&message).await;
            return;
        };
        match self.queue.delete(&message.id, &message.pop_receipt).await {
            Ok(()) => {
                if let Err(Ok(reply)) = waiter.send(Ok(reply)) {
                    // Its waiter gave up between the two: the answer is gone with it.
                    tracing::warn!(reply_queue = %self.name(), correlation_id = %reply.correlation_id, "an answer was taken as its waiter gave up: it is lost");
                }
            }
            Err(error) => {
                // Not taken (another reader leased it meanwhile): wait for the next look.
                tracing::debug!(reply_queue = %self.name(), id = %message.id, "answer not taken: {error}");
                self.state.lock().unwrap().waiters.insert(key, waiter);
            }
        }
    }

    async fn delete_expired(&self, message: &Message) {
        if self.queue.delete(&message.id, &message.pop_receipt).await.is_ok() {
            self.state.lock().unwrap().expired += 1;
        }
    }
}

/// Sweeps `reader`'s reply queue every `interval` (its `reply_ttl`: an answer is deleted at
/// most twice that long after it was put) until `stop`.
pub(crate) async fn sweeper_task(queue: String, reader: Arc<ReplyReader>, interval: Duration, stop: tokio_util::sync::CancellationToken) {
    use tracing::Instrument as _;
    let span = tracing::info_span!("reply_sweeper", queue = %queue, reply_queue = %reader.name());
    async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let before = reader.expired();
            tokio::select! {
                _ = stop.cancelled() => return,
                swept = reader.sweep() => match swept {
                    Ok(()) => {
                        let expired = reader.expired() - before;
                        if expired > 0 {
                            tracing::info!(expired, "deleted answers nobody took within reply_ttl");
                        }
                    }
                    Err(error) => tracing::warn!("sweeping the reply queue failed (tried again in {}): {error:#}", humantime::format_duration(interval)),
                },
            }
        }
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::Metered;
    use crate::queue::clock::TokioClock;
    use crate::queue::memory::MemoryQueue;

    fn answer(id: &str, item: Option<u32>) -> Vec<u8> {
        serde_json::to_vec(&Reply {
            correlation_id: id.into(),
            queue: "asks".into(),
            item,
            replied_at: "2026-11-27T00:00:00Z".into(),
            body: Some(format!("re:{id}")),
            body_base64: None,
        })
        .unwrap()
    }

    fn reader(ttl: Duration) -> (Arc<ReplyReader>, Arc<crate::queue::Transactions>) {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
        let queue = Metered::new(MemoryQueue::new("answers", clock.clone(), 65_536));
        let transactions = queue.transactions();
        (ReplyReader::with_clock(Arc::new(queue), ttl, None, clock), transactions)
    }

    /// Review defect: each wait slept between full batches and released what it read at
    /// once, so with ~1,500 unclaimed answers a wait took 40 s and past ~5,000 none was found.
    #[tokio::test(start_paused = true)]
    async fn a_wait_reads_through_thousands_of_unclaimed_answers_to_its_own() {
        let (reader, transactions) = reader(Duration::from_secs(3600));
        for n in 0..5_000 {
            reader.queue.put(&answer(&format!("other-{n}"), None), Duration::ZERO).await.unwrap();
        }
        reader.queue.put(&answer("mine", None), Duration::ZERO).await.unwrap();
        let started = tokio::time::Instant::now();
        let got = reader.wait(&MessageId::from("mine"), None, Duration::from_secs(30)).await.unwrap();
        assert_eq!(got.map(|r| r.correlation_id), Some("mine".to_string()));
        assert!(started.elapsed() < Duration::from_secs(1), "read through without pauses: {:?}", started.elapsed());
        let counts = transactions.snapshot();
        assert!(counts.gets_with_messages <= 5_001 / 32 + 2, "one pass: {counts:?}");
        assert_eq!(counts.deletes, 1, "only its own answer was taken");
    }

    /// Review defect: each look released every answer it passed over, one billed call per
    /// answer per look, so 1,000 unclaimed answers cost thousands of calls a minute of waiting.
    #[tokio::test(start_paused = true)]
    async fn passing_over_unclaimed_answers_costs_no_call_per_answer() {
        let (reader, transactions) = reader(Duration::from_secs(3600));
        for n in 0..1_000 {
            reader.queue.put(&answer(&format!("other-{n}"), None), Duration::ZERO).await.unwrap();
        }
        let before = transactions.snapshot();
        let late = {
            let queue = reader.queue.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(10)).await;
                queue.put(&answer("mine", None), Duration::ZERO).await.unwrap();
            })
        };
        let got = reader.wait(&MessageId::from("mine"), None, Duration::from_secs(30)).await.unwrap();
        late.await.unwrap();
        assert_eq!(got.map(|r| r.correlation_id), Some("mine".to_string()));
        let counts = transactions.snapshot();
        let (updates, calls) = (counts.updates - before.updates, counts.total() - before.total() - 1);
        assert_eq!(updates, 0, "an answer passed over is left to come back by itself: {counts:?}");
        // Ten seconds of waiting: a pass over the 1,000 (32 gets) each time they come back.
        assert!(calls <= 250, "{calls} calls (181 when written; 5,340 when each was released): {counts:?}");
    }

    /// Attack (session 13): once answers were passed over with their lease, a producer waiting
    /// for its items one after another (`ebb send --items --wait-reply`) waited out the lease
    /// of each next item's answer: 10 items took 19 s, and with a short reply_ttl some expired.
    #[tokio::test(start_paused = true)]
    async fn a_producer_waiting_item_by_item_takes_each_answer_at_once_from_the_reader_s_memory() {
        let (reader, transactions) = reader(Duration::from_secs(3600));
        for item in 0..10 {
            reader.queue.put(&answer("batch", Some(item)), Duration::ZERO).await.unwrap();
        }
        let started = tokio::time::Instant::now();
        for item in 0..10 {
            let got = reader.wait(&MessageId::from("batch"), Some(item), Duration::from_secs(30)).await.unwrap();
            assert_eq!(got.and_then(|r| r.item), Some(item));
        }
        assert!(started.elapsed() < Duration::from_millis(500), "each answer at once: {:?}", started.elapsed());
        let counts = transactions.snapshot();
        assert_eq!((counts.deletes, counts.updates), (10, 0), "{counts:?}");
        assert_eq!(reader.queue.approximate_count().await.unwrap(), 0);
        // Remembered answers are taken only under their lease: once it ran out they are looked
        // for again (another reader may have them now).
        reader.queue.put(&answer("late", Some(0)), Duration::ZERO).await.unwrap();
        reader.queue.put(&answer("late", Some(1)), Duration::ZERO).await.unwrap();
        assert!(reader.wait(&MessageId::from("late"), Some(0), Duration::from_secs(5)).await.unwrap().is_some());
        tokio::time::advance(PASS_OVER).await;
        assert!(reader.wait(&MessageId::from("late"), Some(1), Duration::from_secs(5)).await.unwrap().is_some());
    }

    #[test]
    fn the_memory_of_passed_over_answers_is_bounded_by_count_and_bytes() {
        let passed = |n: usize, bytes: usize| Passed {
            id: MessageId::from(n.to_string().as_str()),
            pop_receipt: PopReceipt::from("r"),
            reply: serde_json::from_slice(&answer(&n.to_string(), None)).unwrap(),
            bytes,
            until_ms: u64::MAX,
        };
        let mut memory = Remembered::default();
        for n in 0..REMEMBERED_MAX + 100 {
            memory.remember((n.to_string(), None), passed(n, 10), 0);
        }
        assert_eq!(memory.by_key.len(), REMEMBERED_MAX);
        assert!(memory.take(&("0".to_string(), None), 0).is_none(), "the oldest are forgotten first");
        let mut memory = Remembered::default();
        for n in 0..100 {
            memory.remember((n.to_string(), None), passed(n, 1 << 20), 0);
        }
        assert!(memory.bytes <= REMEMBERED_MAX_BYTES && memory.by_key.len() == REMEMBERED_MAX_BYTES >> 20, "{}", memory.bytes);
        // The same answer read again replaces its entry, counted once.
        let mut memory = Remembered::default();
        for _ in 0..3 * REMEMBERED_MAX {
            memory.remember(("same".to_string(), None), passed(1, 100), 0);
        }
        assert_eq!((memory.by_key.len(), memory.bytes), (1, 100));
        assert!(memory.order.len() <= 2 * REMEMBERED_MAX + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_on_one_host_share_one_reader_and_each_gets_its_own_answer_items_apart() {
        let (reader, transactions) = reader(Duration::from_secs(3600));
        let waits: Vec<_> = (0..16)
            .map(|n| {
                let reader = reader.clone();
                tokio::spawn(async move { reader.wait(&MessageId::from(format!("m{}", n / 2).as_str()), Some(n % 2), Duration::from_secs(30)).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        for n in (0..16u32).rev() {
            reader.queue.put(&answer(&format!("m{}", n / 2), Some(n % 2)), Duration::ZERO).await.unwrap();
        }
        for (n, wait) in waits.into_iter().enumerate() {
            let reply = wait.await.unwrap().unwrap().expect("answered");
            assert_eq!((reply.correlation_id, reply.item), (format!("m{}", n / 2), Some(n as u32 % 2)));
        }
        let counts = transactions.snapshot();
        assert_eq!(counts.deletes, 16);
        assert!(counts.gets_with_messages <= 2, "one reader took the 16 answers in one or two gets: {counts:?}");
        // Past its longest pause, the reader sees nobody waits and stops.
        tokio::time::sleep(POLL_MAX * 2).await;
        assert!(!reader.state.lock().unwrap().reading, "the reader stops once nobody waits");
        // The same answer cannot be waited for twice at once on one host.
        let first = {
            let reader = reader.clone();
            tokio::spawn(async move { reader.wait(&MessageId::from("x"), None, Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        let second = reader.wait(&MessageId::from("x"), None, Duration::from_secs(5)).await;
        assert!(second.unwrap_err().to_string().contains("waits for this answer already"));
        assert_eq!(first.await.unwrap().unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn answers_nobody_took_within_reply_ttl_are_deleted_by_the_sweep_and_younger_ones_kept() {
        let (reader, _) = reader(Duration::from_secs(60));
        for n in 0..40 {
            reader.queue.put(&answer(&format!("old-{n}"), None), Duration::ZERO).await.unwrap();
        }
        reader.queue.put(b"not an answer at all", Duration::ZERO).await.unwrap();
        tokio::time::advance(Duration::from_secs(61)).await;
        reader.queue.put(&answer("young", None), Duration::ZERO).await.unwrap();
        reader.sweep().await.unwrap();
        assert_eq!(reader.expired(), 41, "the 40 old answers and the old stray message");
        assert_eq!(reader.queue.approximate_count().await.unwrap(), 1, "the young answer stays");
        // Passed over by the sweep, it is back within PASS_OVER.
        let got = reader.wait(&MessageId::from("young"), None, PASS_OVER + Duration::from_secs(1)).await.unwrap();
        assert!(got.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_on_answers_another_queue_handles_is_refused_saying_so() {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
        let queue = Arc::new(MemoryQueue::new("stage-2", clock.clone(), 65_536));
        let reader = ReplyReader::with_clock(queue, Duration::from_secs(60), Some("stage-2".into()), clock);
        let refused = reader.wait(&MessageId::from("1"), None, Duration::from_secs(1)).await.unwrap_err();
        assert!(refused.to_string().contains("which queue stage-2 handles"), "{refused}");
    }
}
