//! Counts storage transactions: every call to the backend, by kind and by whether it
//! returned work. These are what the paper's cost model bills (empty gets included).
//!
//! An attempt that got no answer (the connection broke, or no answer came in time) is not
//! a known billed transaction: the service may never have seen it, or done it and billed it
//! without our hearing. It is counted apart, by kind ([`UnansweredCounts`]), so the billed
//! counts and the cost are the answered attempts and the unanswered ones say how much more
//! the bill may be. The retry that follows is an attempt of its own.
//!
//! Besides the totals, the counters keep the last [`RATE_WINDOW`] in buckets of
//! [`RATE_BUCKET`] (on tokio's clock, so a simulation's paused clock drives them), for the
//! live rates: all transactions per hour, and idle ones (empty gets, and counts that found
//! the queue empty).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::failure::CallKind;
use super::{GroupedSend, Message, MessageId, PopReceipt, QueueClient, QueueError};

/// Width of one bucket of the rate window.
pub const RATE_BUCKET: Duration = Duration::from_secs(10);
/// How far back the live rates look.
pub const RATE_WINDOW: Duration = Duration::from_secs(600);
const BUCKETS: u64 = RATE_WINDOW.as_secs() / RATE_BUCKET.as_secs();
/// The shortest time a rate is divided by.
const MIN_RATE_SPAN: Duration = Duration::from_secs(60);

/// Live counters, shared with whoever reports them.
#[derive(Debug)]
pub struct Transactions {
    puts: AtomicU64,
    gets_with_messages: AtomicU64,
    gets_empty: AtomicU64,
    deletes: AtomicU64,
    updates: AtomicU64,
    counts: AtomicU64,
    counts_empty: AtomicU64,
    creates: AtomicU64,
    failed: AtomicU64,
    unanswered: [AtomicU64; CallKind::ALL.len()],
    recent: Mutex<Recent>,
}

impl Default for Transactions {
    fn default() -> Self {
        let zero = || AtomicU64::new(0);
        Transactions {
            puts: zero(),
            gets_with_messages: zero(),
            gets_empty: zero(),
            deletes: zero(),
            updates: zero(),
            counts: zero(),
            counts_empty: zero(),
            creates: zero(),
            failed: zero(),
            unanswered: Default::default(),
            recent: Mutex::new(Recent { start: tokio::time::Instant::now(), buckets: VecDeque::new() }),
        }
    }
}

/// Calls per bucket since `start`, oldest first, only buckets that saw a call, none older
/// than the window.
#[derive(Debug)]
struct Recent {
    start: tokio::time::Instant,
    buckets: VecDeque<Bucket>,
}

/// One bucket's calls: billed ones (all, and of those the idle), and unanswered attempts.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    index: u64,
    all: u64,
    idle: u64,
    unanswered: u64,
}

/// What one attempt was, for the rates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// Answered, so billed; `idle` when it found no work.
    Billed { idle: bool },
    /// No answer: not a known billed transaction.
    Unanswered,
}

impl Recent {
    fn index(&self, now: tokio::time::Instant) -> u64 {
        (now.saturating_duration_since(self.start).as_millis() / RATE_BUCKET.as_millis()) as u64
    }

    fn record(&mut self, attempt: Attempt) {
        let index = self.index(tokio::time::Instant::now());
        if self.buckets.back().is_none_or(|bucket| bucket.index != index) {
            self.buckets.push_back(Bucket { index, ..Bucket::default() });
        }
        if let Some(bucket) = self.buckets.back_mut() {
            match attempt {
                Attempt::Billed { idle } => {
                    bucket.all += 1;
                    bucket.idle += u64::from(idle);
                }
                Attempt::Unanswered => bucket.unanswered += 1,
            }
        }
        while self.buckets.front().is_some_and(|b| b.index + BUCKETS <= index) {
            self.buckets.pop_front();
        }
    }

    fn rates(&self) -> TransactionRates {
        let now = tokio::time::Instant::now();
        let elapsed = now.saturating_duration_since(self.start);
        let index = self.index(now);
        let first = (index + 1).saturating_sub(BUCKETS);
        // Whole buckets `first..index`, and the current one up to now.
        let window = elapsed.saturating_sub(RATE_BUCKET.saturating_mul(first as u32));
        let (all, idle, unanswered) =
            self.buckets.iter().filter(|b| b.index >= first).fold((0, 0, 0), |(a, i, u), b| (a + b.all, i + b.idle, u + b.unanswered));
        // At least a minute, so the first seconds after a start (a create, a few fast polls)
        // are not projected into a huge hourly rate.
        let hours = window.max(MIN_RATE_SPAN).as_secs_f64() / 3600.0;
        let per_hour = |n: u64| if hours > 0.0 { n as f64 / hours } else { 0.0 };
        TransactionRates {
            window_secs: window.as_secs_f64(),
            all_per_hour: per_hour(all),
            idle_per_hour: per_hour(idle),
            unanswered_per_hour: per_hour(unanswered),
        }
    }
}

/// Transactions per hour over the last [`RATE_WINDOW`] (or since the counters were made,
/// when that is shorter, but divided by at least a minute).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TransactionRates {
    /// The time the rates are taken over, in seconds.
    pub window_secs: f64,
    /// Every billed transaction, per hour.
    pub all_per_hour: f64,
    /// Idle ones per hour: empty gets, and counts that found the queue empty.
    pub idle_per_hour: f64,
    /// Attempts that got no answer, per hour: not in `all_per_hour`, and billed or not.
    pub unanswered_per_hour: f64,
}

/// A snapshot of [`Transactions`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TransactionCounts {
    /// Puts.
    pub puts: u64,
    /// Gets that returned at least one message.
    pub gets_with_messages: u64,
    /// Gets that returned nothing: the idle transactions.
    pub gets_empty: u64,
    /// Deletes.
    pub deletes: u64,
    /// Visibility updates (releases and lease renewals).
    pub updates: u64,
    /// Approximate-count queries.
    pub counts: u64,
    /// Of those, the ones that found the queue empty (idle transactions).
    pub counts_empty: u64,
    /// Create-if-missing calls, and the requests that set a queue up besides them (SQS: the
    /// attribute read at create, a queue URL's look-up).
    pub creates: u64,
    /// Answered calls that failed (also counted under their kind: the service answered,
    /// so the call is billed).
    pub failed: u64,
    /// Attempts that got no answer (a broken connection, no answer in time), by kind: in
    /// none of the counts above, and billed or not (the service may have done them).
    pub unanswered: UnansweredCounts,
}

/// Attempts that got no answer, by kind of call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct UnansweredCounts {
    /// Gets.
    pub gets: u64,
    /// Puts.
    pub puts: u64,
    /// Deletes.
    pub deletes: u64,
    /// Visibility updates.
    pub updates: u64,
    /// Approximate-count queries.
    pub counts: u64,
    /// Create-if-missing calls.
    pub creates: u64,
}

impl UnansweredCounts {
    /// Of `kind`.
    pub fn of(&self, kind: CallKind) -> u64 {
        match kind {
            CallKind::Get => self.gets,
            CallKind::Put => self.puts,
            CallKind::Delete => self.deletes,
            CallKind::Update => self.updates,
            CallKind::Count => self.counts,
            CallKind::Create => self.creates,
        }
    }

    /// Of every kind: at most this many more transactions may have been billed.
    pub fn total(&self) -> u64 {
        CallKind::ALL.iter().map(|&kind| self.of(kind)).sum()
    }
}

impl TransactionCounts {
    /// Every billed transaction.
    pub fn total(&self) -> u64 {
        self.puts + self.gets_with_messages + self.gets_empty + self.deletes + self.updates + self.counts + self.creates
    }

    /// The transactions that did no useful work: empty gets, and counts that found the
    /// queue empty.
    pub fn idle(&self) -> u64 {
        self.gets_empty + self.counts_empty
    }
}

impl Transactions {
    /// The counts so far.
    pub fn snapshot(&self) -> TransactionCounts {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TransactionCounts {
            puts: load(&self.puts),
            gets_with_messages: load(&self.gets_with_messages),
            gets_empty: load(&self.gets_empty),
            deletes: load(&self.deletes),
            updates: load(&self.updates),
            counts: load(&self.counts),
            counts_empty: load(&self.counts_empty),
            creates: load(&self.creates),
            failed: load(&self.failed),
            unanswered: UnansweredCounts {
                gets: load(&self.unanswered[CallKind::Get.index()]),
                puts: load(&self.unanswered[CallKind::Put.index()]),
                deletes: load(&self.unanswered[CallKind::Delete.index()]),
                updates: load(&self.unanswered[CallKind::Update.index()]),
                counts: load(&self.unanswered[CallKind::Count.index()]),
                creates: load(&self.unanswered[CallKind::Create.index()]),
            },
        }
    }

    /// All and idle transactions per hour over the last [`RATE_WINDOW`].
    pub(crate) fn rates(&self) -> TransactionRates {
        self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner).rates()
    }

    /// Counts one attempt of `kind` that ended with `error` (none: it succeeded); `idle`
    /// when it found no work (an empty get or count).
    fn record(&self, kind: CallKind, idle: bool, error: Option<&QueueError>) {
        self.record_requests(kind, idle, error, 1);
    }

    /// Counts one attempt of `kind` that, answered, the service bills as `requests` (SQS: a
    /// send per 64 KiB of its payload); unanswered, it is one unanswered attempt.
    fn record_requests(&self, kind: CallKind, idle: bool, error: Option<&QueueError>, requests: u64) {
        if error.and_then(QueueError::failure_class).is_some_and(|class| class.unanswered()) {
            self.unanswered[kind.index()].fetch_add(1, Ordering::Relaxed);
            self.record_recent(Attempt::Unanswered);
            return;
        }
        let counter = match kind {
            CallKind::Get if idle => &self.gets_empty,
            CallKind::Get => &self.gets_with_messages,
            CallKind::Put => &self.puts,
            CallKind::Delete => &self.deletes,
            CallKind::Update => &self.updates,
            CallKind::Count => &self.counts,
            CallKind::Create => &self.creates,
        };
        counter.fetch_add(requests, Ordering::Relaxed);
        if kind == CallKind::Count && idle {
            self.counts_empty.fetch_add(1, Ordering::Relaxed);
        }
        if error.is_some() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        for _ in 0..requests {
            self.record_recent(Attempt::Billed { idle });
        }
    }

    fn record_recent(&self, attempt: Attempt) {
        self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner).record(attempt);
    }
}

/// A backend whose calls are counted.
pub struct Metered<Q> {
    inner: Q,
    transactions: Arc<Transactions>,
}

impl<Q: QueueClient> Metered<Q> {
    /// Wraps `inner`, counting into fresh counters.
    pub fn new(inner: Q) -> Self {
        Metered { inner, transactions: Arc::default() }
    }

    /// Wraps `inner`, counting into `transactions` (shared with another client: a queue's
    /// reply queue counted as that queue's calls).
    pub fn sharing(inner: Q, transactions: Arc<Transactions>) -> Self {
        Metered { inner, transactions }
    }

    /// The live counters.
    pub fn transactions(&self) -> Arc<Transactions> {
        self.transactions.clone()
    }

    fn count<T>(&self, kind: CallKind, result: Result<T, QueueError>) -> Result<T, QueueError> {
        self.count_as(kind, false, result)
    }

    fn count_as<T>(&self, kind: CallKind, idle: bool, result: Result<T, QueueError>) -> Result<T, QueueError> {
        self.transactions.record(kind, idle, result.as_ref().err());
        self.count_setup();
        result
    }

    /// Counts the requests the backend made besides the call (SQS: a queue URL's look-up,
    /// the attribute read at create) as creates: billed, and counted once.
    fn count_setup(&self) {
        let requests = self.inner.take_setup_requests();
        if requests > 0 {
            self.transactions.record_requests(CallKind::Create, false, None, requests);
        }
    }
}

#[async_trait]
impl<Q: QueueClient> QueueClient for Metered<Q> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn create_if_missing(&self) -> Result<(), QueueError> {
        let result = self.inner.create_if_missing().await;
        self.count(CallKind::Create, result)
    }

    async fn put(&self, body: &[u8], initial_visibility: Duration) -> Result<MessageId, QueueError> {
        let result = self.inner.put(body, initial_visibility).await;
        self.transactions.record_requests(CallKind::Put, false, result.as_ref().err(), self.inner.put_requests(body));
        self.count_setup();
        result
    }

    fn fifo(&self) -> bool {
        self.inner.fifo()
    }

    fn generated_dedup_id(&self) -> Option<String> {
        self.inner.generated_dedup_id()
    }

    async fn put_in_group(&self, body: &[u8], initial_visibility: Duration, send: &GroupedSend) -> Result<MessageId, QueueError> {
        let result = self.inner.put_in_group(body, initial_visibility, send).await;
        self.transactions.record_requests(CallKind::Put, false, result.as_ref().err(), self.inner.put_requests(body));
        result
    }

    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
        let result = self.inner.get(max, visibility).await;
        let idle = !matches!(&result, Ok(messages) if !messages.is_empty());
        self.count_as(CallKind::Get, idle, result)
    }

    fn server_wait(&self, idle: Duration) -> Duration {
        self.inner.server_wait(idle)
    }

    /// One request however long it waits: an empty long poll is billed as one empty receive.
    async fn get_waiting(&self, max: u32, visibility: Duration, wait: Duration) -> Result<Vec<Message>, QueueError> {
        let result = self.inner.get_waiting(max, visibility, wait).await;
        let idle = !matches!(&result, Ok(messages) if !messages.is_empty());
        self.count_as(CallKind::Get, idle, result)
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), QueueError> {
        let result = self.inner.delete(id, pop_receipt).await;
        self.count(CallKind::Delete, result)
    }

    /// Billed as the service bills the batch; a batch every entry of which failed counts as
    /// its calls failed, with the first entry's error.
    async fn delete_batch(&self, entries: &[(MessageId, PopReceipt)]) -> Vec<Result<(), QueueError>> {
        let results = self.inner.delete_batch(entries).await;
        let all_failed = results.iter().all(Result::is_err);
        let error = results.first().and_then(|result| result.as_ref().err()).filter(|_| all_failed);
        self.transactions.record_requests(CallKind::Delete, false, error, entries.len().div_ceil(self.inner.delete_batch_limit().max(1)) as u64);
        self.count_setup();
        results
    }

    fn delete_batch_limit(&self) -> usize {
        self.inner.delete_batch_limit()
    }

    async fn update_visibility(&self, id: &MessageId, pop_receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError> {
        let result = self.inner.update_visibility(id, pop_receipt, visibility).await;
        self.count(CallKind::Update, result)
    }

    /// Billed as the service bills the batch: one request per
    /// [`QueueClient::update_batch_limit`] entries, as [`Metered::delete_batch`] is.
    async fn update_visibility_batch(&self, entries: &[(MessageId, PopReceipt)], visibility: Duration) -> Vec<Result<PopReceipt, QueueError>> {
        let results = self.inner.update_visibility_batch(entries, visibility).await;
        let all_failed = results.iter().all(Result::is_err);
        let error = results.first().and_then(|result| result.as_ref().err()).filter(|_| all_failed);
        self.transactions.record_requests(CallKind::Update, false, error, entries.len().div_ceil(self.inner.update_batch_limit().max(1)) as u64);
        results
    }

    fn update_batch_limit(&self) -> usize {
        self.inner.update_batch_limit()
    }

    fn dead_letter(&self) -> Option<super::DeadLetter> {
        self.inner.dead_letter()
    }

    async fn approximate_count(&self) -> Result<u64, QueueError> {
        let result = self.inner.approximate_count().await;
        let empty = matches!(result, Ok(0));
        self.count_as(CallKind::Count, empty, result)
    }

    fn local_count(&self) -> Option<u64> {
        // Free by definition: not a billed transaction, so not counted.
        self.inner.local_count()
    }

    fn call_records(&self) -> Vec<Arc<super::CallRecord>> {
        self.inner.call_records()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rates_cover_the_last_ten_minutes_and_split_idle_from_all() {
        let t = Transactions::default();
        // One idle transaction per minute for an hour, and 30 useful ones in the last minute.
        for _ in 0..60 {
            tokio::time::advance(Duration::from_secs(60)).await;
            t.record_recent(Attempt::Billed { idle: true });
        }
        for _ in 0..30 {
            t.record_recent(Attempt::Billed { idle: false });
        }
        let rates = t.rates();
        // The window is the last 59 whole buckets and the current one so far.
        assert!((590.0..=600.0).contains(&rates.window_secs), "{rates:?}");
        // 10 idle in the window (one per minute) → about 60/h; 40 in all → about 240/h.
        let per_hour = |n: f64| n / rates.window_secs * 3600.0;
        assert!((rates.idle_per_hour - per_hour(10.0)).abs() < 1e-9, "{rates:?}");
        assert!((rates.all_per_hour - per_hour(40.0)).abs() < 1e-9, "{rates:?}");
        // Ten quiet minutes later the window is empty.
        tokio::time::advance(Duration::from_secs(600)).await;
        assert_eq!(t.rates().all_per_hour, 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_transactions_are_empty_gets_and_counts_that_found_nothing() {
        let clock = Arc::new(crate::queue::TokioClock::new());
        let queue = Metered::new(crate::queue::memory::MemoryQueue::new("metered", clock, 1024));
        let t = queue.transactions();
        assert_eq!(queue.approximate_count().await.unwrap(), 0);
        assert!(queue.get(32, Duration::from_secs(30)).await.unwrap().is_empty());
        queue.put(b"work", Duration::ZERO).await.unwrap();
        assert_eq!(queue.approximate_count().await.unwrap(), 1);
        let got = queue.get(32, Duration::from_secs(30)).await.unwrap();
        queue.delete(&got[0].id, &got[0].pop_receipt).await.unwrap();
        let counts = t.snapshot();
        assert_eq!((counts.counts, counts.counts_empty, counts.gets_empty, counts.gets_with_messages), (2, 1, 1, 1));
        assert_eq!((counts.idle(), counts.total()), (2, 6));
        // The rates see the same split.
        tokio::time::advance(Duration::from_secs(60)).await;
        let rates = t.rates();
        assert!((rates.idle_per_hour - 120.0).abs() < 1e-9 && (rates.all_per_hour - 360.0).abs() < 1e-9, "{rates:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_that_got_no_answer_is_counted_apart_and_an_answered_failure_is_billed() {
        let t = Transactions::default();
        let reset = QueueError::Transient(anyhow::Error::new(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset")));
        let busy = QueueError::Transient(crate::queue::classified(crate::queue::FailureClass::Throttled, "ServerBusy (503)"));
        t.record(CallKind::Put, false, Some(&reset));
        t.record(CallKind::Put, false, Some(&busy));
        t.record(CallKind::Put, false, None);
        t.record(CallKind::Get, true, Some(&reset));
        let counts = t.snapshot();
        assert_eq!((counts.puts, counts.failed, counts.gets_empty, counts.total()), (2, 1, 0, 2), "{counts:?}");
        assert_eq!((counts.unanswered.puts, counts.unanswered.gets, counts.unanswered.total()), (1, 1, 2), "{counts:?}");
        let rates = t.rates();
        assert!((rates.all_per_hour - 120.0).abs() < 1e-9 && (rates.unanswered_per_hour - 120.0).abs() < 1e-9, "{rates:?}");
        assert_eq!(rates.idle_per_hour, 0.0, "an unanswered get is not an empty one");
    }

    #[tokio::test(start_paused = true)]
    async fn early_rates_are_taken_over_the_time_since_start_but_at_least_a_minute() {
        let t = Transactions::default();
        tokio::time::advance(Duration::from_secs(36)).await;
        t.record_recent(Attempt::Billed { idle: true });
        let rates = t.rates();
        assert_eq!(rates.window_secs, 36.0);
        assert!((rates.idle_per_hour - 60.0).abs() < 1e-9, "one in (at least) a minute: {rates:?}");
        tokio::time::advance(Duration::from_secs(84)).await;
        t.record_recent(Attempt::Billed { idle: false });
        let rates = t.rates();
        assert!((rates.all_per_hour - 60.0).abs() < 1e-9 && (rates.idle_per_hour - 30.0).abs() < 1e-9, "two in two minutes: {rates:?}");
    }
}
