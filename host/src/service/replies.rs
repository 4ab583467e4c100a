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
use crate::queue::{MAX_BATCH, Message, MessageId, QueueClient};

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
    expired: u64,
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
        let (handing, handed) = oneshot::channel();
        let start_reading = {
            let mut state = self.state.lock().unwrap();
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
        let got = self.queue.get(MAX_BATCH, PASS_OVER).await?;
        let look = Look { full: got.len() == MAX_BATCH as usize, read: got.len() };
        let now = system_time(self.clock.now_ms());
        for message in got {
            self.settle(message, now).await;
        }
        Ok(look)
    }

    async fn settle(&self, message: Message, now: SystemTime) {
        let reply = serde_json::from_slice::<Reply>(&message.body).ok();
        let waiter = reply.as_ref().and_then(|reply| {
            let mut state = self.state.lock().unwrap();
            state.waiters.remove(&(reply.correlation_id.clone(), reply.item)).filter(|waiter| !waiter.is_closed())
        });
        if let (Some(reply), Some(waiter)) = (reply, waiter) {
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
                    let key = (reply.correlation_id, reply.item);
                    self.state.lock().unwrap().waiters.insert(key, waiter);
                }
            }
            return;
        }
        let age = now.duration_since(message.inserted_at).unwrap_or_default();
        if age > self.ttl && self.queue.delete(&message.id, &message.pop_receipt).await.is_ok() {
            self.state.lock().unwrap().expired += 1;
        }
        // Another waiter's, maybe on another host: its lease runs out in PASS_OVER.
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
