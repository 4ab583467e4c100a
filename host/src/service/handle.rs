//! A queue handle: the one code path for "a message was sent" and "messages were put
//! straight into storage", whatever the host's role (`run`, `ebb scaler`, demo). The API,
//! the bus and the CLI call it; it wakes this host's listeners, tells watchers (the KEDA
//! scaler) that work arrived, and publishes the news on the bus for every other host.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::bus::Bus;
use crate::listener::{Listener, Pause};
use crate::payload::PayloadSettings;
use crate::payload::claims::{ClaimRecords, ClaimStore};
use crate::queue::{GroupedSend, MessageId, QueueClient, QueueError};
use crate::record::{QueueRecording, Seen};

use super::packing::{ItemsError, ItemsSent, Packing};
use super::replies::ReplyReader;

/// The longest a send waits for storage before giving up with a transient error (storage
/// that stalls must still get the sender an answer).
pub const SEND_DEADLINE: Duration = Duration::from_secs(20);

/// A send that storage did not answer within `deadline`: worth trying again.
fn storage_timed_out(deadline: Duration) -> QueueError {
    QueueError::Transient(anyhow::anyhow!("storage did not answer within {}", humantime::format_duration(deadline)))
}

/// A logical queue's handle. Cheap to clone.
#[derive(Clone)]
pub struct QueueHandle {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    sender: Arc<dyn QueueClient>,
    listeners: Vec<Listener>,
    /// Set once, after the handles: the bus delivers to them, so it starts after them.
    bus: std::sync::OnceLock<Arc<Bus>>,
    work: watch::Sender<u64>,
    /// Where pauses are kept across restarts (none: a handle outside a service).
    pauses: Option<Arc<super::pauses::Pauses>>,
    /// The queue's pause, for this host's listeners and watchers (the KEDA scaler).
    paused: watch::Sender<Option<Pause>>,
    /// The queue's poison queue, for an operator's work on it (none: a handle outside a service).
    poison: Option<Arc<dyn QueueClient>>,
    /// One poison operation at a time on this host: each leases what it looks at, so two at
    /// once would each see only part of the poison queue.
    poison_operations: tokio::sync::Mutex<()>,
    /// The queue's payload settings (the defaults for a handle outside a service) and
    /// whether its messages are text (an Azure queue with `encoding = "none"`).
    payload: (PayloadSettings, bool),
    /// The queue's claim store, for items too large for any envelope (none: they are refused).
    claims: Option<Arc<dyn ClaimStore>>,
    /// Where the claim-check calls of the queue's stores (its producer's, its listeners',
    /// its sweepers') are counted, for `/metrics`.
    claim_records: Option<ClaimRecords>,
    /// The packing task of items sent through this host, started at the first send of items.
    packing: tokio::sync::OnceCell<Packing>,
    /// The reader of the queue's reply queue, if it has one.
    reply: Option<Arc<ReplyReader>>,
    /// Where sends and notifications are counted as arrivals (none: not recorded).
    recording: Option<Arc<QueueRecording>>,
}

/// Builds a [`QueueHandle`] whole: all a handle has besides its queue is given here, before
/// its first send; only the bus comes later ([`QueueHandle::attach_bus`]). The service's
/// assembly starts one from a queue's configuration (`QueueStack::producer`).
#[must_use]
pub struct QueueHandleBuilder {
    name: String,
    sender: Arc<dyn QueueClient>,
    listeners: Vec<Listener>,
    pauses: Option<Arc<super::pauses::Pauses>>,
    poison: Option<Arc<dyn QueueClient>>,
    payload: (PayloadSettings, bool),
    claims: Option<Arc<dyn ClaimStore>>,
    claim_records: Option<ClaimRecords>,
    reply: Option<Arc<ReplyReader>>,
    recording: Option<Arc<QueueRecording>>,
}

impl QueueHandleBuilder {
    /// Wakes `listeners` (one per partition; none on a host that does not process).
    pub fn listeners(mut self, listeners: Vec<Listener>) -> Self {
        self.listeners = listeners;
        self
    }

    /// Keeps the queue's pauses in `pauses`, and starts under the one kept there.
    pub(crate) fn pauses(mut self, pauses: Arc<super::pauses::Pauses>) -> Self {
        self.pauses = Some(pauses);
        self
    }

    /// The queue's poison queue is `poison` (see [`crate::service::poison`]).
    pub(crate) fn poison(mut self, poison: Arc<dyn QueueClient>) -> Self {
        self.poison = Some(poison);
        self
    }

    /// Items are packed and put with `settings`; `text`: the queue's messages are text, so
    /// an envelope goes as base64 text. Without it: the default settings, binary.
    pub(crate) fn payload(mut self, settings: PayloadSettings, text: bool) -> Self {
        self.payload = (settings, text);
        self
    }

    /// Bodies and items too large for any envelope are offloaded into `claims`; without it
    /// they are refused.
    pub(crate) fn claims(mut self, claims: Arc<dyn ClaimStore>) -> Self {
        self.claims = Some(claims);
        self
    }

    /// The queue's claim-check calls are counted in `records` (the service's, for `/metrics`).
    pub(crate) fn claim_records(mut self, records: ClaimRecords) -> Self {
        self.claim_records = Some(records);
        self
    }

    /// Handlers' answers to this queue's messages are read from `reply` (its `reply_queue`),
    /// and those nobody took within `ttl` deleted.
    pub(crate) fn reply(mut self, reply: Arc<dyn QueueClient>, ttl: Duration) -> Self {
        self.reply = Some(ReplyReader::new(reply, ttl, None));
        self
    }

    /// The queue's answers go to `reply`, which configured queue `handled_by` handles (a
    /// pipeline): nobody waits for them here, and waits are refused saying so.
    pub(crate) fn handled_reply(mut self, reply: Arc<dyn QueueClient>, handled_by: &str) -> Self {
        self.reply = Some(ReplyReader::new(reply, Duration::MAX, Some(handled_by.to_string())));
        self
    }

    /// Sends and notifications are counted in `recording` (the listeners count what their
    /// gets see first; see [`crate::record`]).
    pub fn recording(mut self, recording: Arc<QueueRecording>) -> Self {
        self.recording = Some(recording);
        self
    }

    /// The handle, under the pause kept for it, if any.
    pub fn build(self) -> QueueHandle {
        let (work, _) = watch::channel(0);
        let kept = self.pauses.as_ref().and_then(|pauses| pauses.get(&self.name));
        let inner = Inner {
            name: self.name,
            sender: self.sender,
            listeners: self.listeners,
            bus: std::sync::OnceLock::new(),
            work,
            pauses: self.pauses,
            paused: watch::Sender::new(None),
            poison: self.poison,
            poison_operations: tokio::sync::Mutex::new(()),
            payload: self.payload,
            claims: self.claims,
            claim_records: self.claim_records,
            packing: tokio::sync::OnceCell::new(),
            reply: self.reply,
            recording: self.recording,
        };
        let handle = QueueHandle { inner: Arc::new(inner) };
        handle.apply_pause(kept);
        handle
    }
}

impl QueueHandle {
    /// A handle sending through `sender` (the logical queue) and waking `listeners` (none
    /// on a host that does not process), with nothing else: see [`QueueHandle::builder`].
    pub fn new(name: &str, sender: Arc<dyn QueueClient>, listeners: Vec<Listener>) -> QueueHandle {
        QueueHandle::builder(name, sender).listeners(listeners).build()
    }

    /// Starts a handle sending through `sender` (the logical queue): no listener, the
    /// default payload settings, no claim store, reply queue, poison queue, pauses kept or
    /// recording until the builder is given them.
    pub fn builder(name: &str, sender: Arc<dyn QueueClient>) -> QueueHandleBuilder {
        QueueHandleBuilder {
            name: name.to_string(),
            sender,
            listeners: Vec::new(),
            pauses: None,
            poison: None,
            payload: (PayloadSettings::default(), false),
            claims: None,
            claim_records: None,
            reply: None,
            recording: None,
        }
    }

    fn record(&self, what: Seen) {
        if let Some(recording) = self.inner.recording.as_ref() {
            recording.record(what, 1);
        }
    }

    /// The clients whose storage calls `/metrics` and `/status` report: the queue (each
    /// partition), its poison queue and its reply queue.
    pub fn storage_clients(&self) -> impl Iterator<Item = &Arc<dyn QueueClient>> {
        std::iter::once(&self.inner.sender).chain(self.inner.poison.as_ref()).chain(self.inner.reply.as_ref().map(|reader| reader.queue()))
    }

    /// The queue's poison queue, when the handle belongs to a service: the dead-letter queue
    /// its service moves its messages to (SQS's RedrivePolicy), else `<queue>-poison`.
    pub fn poison_queue(&self) -> Option<Arc<dyn QueueClient>> {
        let poison = self.inner.poison.as_ref()?;
        Some(self.inner.sender.dead_letter().map_or_else(|| poison.clone(), |dead_letter| dead_letter.queue))
    }

    /// Waits for this host's other poison operations on the queue to end; holds them off
    /// until the guard drops.
    pub async fn poison_operation(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.inner.poison_operations.lock().await
    }

    /// Pauses the queue on this host (`for_`: until then, else until resumed): no get is
    /// made; calls that run finish. Kept across restarts when the handle belongs to a
    /// service. Returns the pause.
    pub fn pause(&self, for_: Option<Duration>) -> anyhow::Result<Pause> {
        let now_ms = now_ms();
        let pause = Pause::from_now(now_ms, for_);
        let until_ms = pause.until_ms;
        if let Some(pauses) = self.inner.pauses.as_ref() {
            pauses.set(&self.inner.name, Some(pause), now_ms)?;
        }
        self.apply_pause(Some(pause));
        tracing::info!(queue = %self.inner.name, until_ms, "queue paused");
        Ok(pause)
    }

    /// Resumes the queue on this host; gets start again at once. Returns why the resume is
    /// not kept across a restart yet, if it is not: the pauses file could not be written (a
    /// full disk). It holds here all the same, so the queue drains and frees space; the next
    /// pause or resume written keeps it, and a restart before that pauses the queue again.
    pub fn resume(&self) -> Option<String> {
        let unkept = self.inner.pauses.as_ref().and_then(|pauses| pauses.set(&self.inner.name, None, now_ms()).err()).map(|error| format!("{error:#}"));
        self.apply_pause(None);
        match &unkept {
            None => tracing::info!(queue = %self.inner.name, "queue resumed"),
            Some(reason) => tracing::warn!(queue = %self.inner.name, "queue resumed on this host, not kept across a restart yet: {reason}"),
        }
        // Messages may have piled up: look now, rather than at the next poll.
        self.wake(Duration::ZERO);
        unkept
    }

    /// The pause that holds now, if any.
    pub fn paused(&self) -> Option<Pause> {
        (*self.inner.paused.borrow()).filter(|pause| pause.holds_at(now_ms()))
    }

    /// Every change of the queue's pause, for watchers (the KEDA scaler).
    pub fn pause_changes(&self) -> watch::Receiver<Option<Pause>> {
        self.inner.paused.subscribe()
    }

    fn apply_pause(&self, pause: Option<Pause>) {
        for listener in &self.inner.listeners {
            listener.set_pause(pause);
        }
        self.inner.paused.send_replace(pause);
    }

    /// From now on, sends and notifications are published on `bus` too (set once: the bus
    /// delivers to the handles, so it starts after them).
    pub(crate) fn attach_bus(&self, bus: Arc<Bus>) {
        let _ = self.inner.bus.set(bus);
    }

    /// The queue's (logical) name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The client sends go through (the logical queue: its partitions as one).
    pub fn client(&self) -> &Arc<dyn QueueClient> {
        &self.inner.sender
    }

    /// This host's listeners on the queue (one per partition; none on `ebb scaler`).
    pub fn listeners(&self) -> &[Listener] {
        &self.inner.listeners
    }

    /// Puts `body`, hidden for `delay`, within `deadline` (at most [`SEND_DEADLINE`]); then
    /// the queue learns of it at once: nobody waits for a poll.
    ///
    /// A body too large for a message of the queue goes to the queue's claim store (up to its
    /// `max_claim_check_bytes`; the deadline is then [`SEND_DEADLINE`] per step, a body of
    /// megabytes takes its time) and a small envelope referencing it is put instead; the
    /// listener delivers it as the plain message it was sent as. Without a claim store it is
    /// refused ([`QueueError::MessageTooLarge`]).
    pub async fn send(&self, body: &[u8], delay: Duration, deadline: Duration) -> Result<MessageId, QueueError> {
        self.send_in(None, body, delay, deadline).await
    }

    /// [`QueueHandle::send`] into `group` of a FIFO queue (`None`: a plain send, which a FIFO
    /// queue refuses, naming the group id it needs).
    pub async fn send_in(&self, group: Option<&GroupedSend>, body: &[u8], delay: Duration, deadline: Duration) -> Result<MessageId, QueueError> {
        let deadline = deadline.min(SEND_DEADLINE);
        let put = match tokio::time::timeout(deadline, self.put(group, body, delay)).await {
            Ok(put) => put,
            Err(_) => return Err(storage_timed_out(deadline)),
        };
        let id = match (put, self.inner.claims.as_ref()) {
            (Ok(id), _) => id,
            // The backends measure a body before any request: nothing was billed.
            (Err(QueueError::MessageTooLarge { .. }), Some(claims)) => self.send_offloaded(claims, group, body, delay).await?,
            (Err(error), _) => return Err(error),
        };
        self.count_arrival();
        self.record(Seen::Put);
        self.wake(delay);
        self.publish(Some(1), delay);
        Ok(id)
    }

    /// One put of `body`, into `group` if given: with `trace_envelope`, as the envelope that
    /// carries the send's trace context, if it has one, as much of it as fits (see
    /// [`crate::payload::put_carrying`]). A body too large alone is then offloaded, its
    /// context in the envelope that references it.
    async fn put(&self, group: Option<&GroupedSend>, body: &[u8], delay: Duration) -> Result<MessageId, QueueError> {
        let context = crate::telemetry::sending().filter(|_| self.inner.payload.0.trace_envelope);
        let Some(context) = context else { return self.put_as_is(group, body, delay).await };
        crate::payload::put_carrying(body, context, self.inner.payload.1, |bytes| async move { self.put_as_is(group, &bytes, delay).await }).await
    }

    /// One put of `body` as it is.
    async fn put_as_is(&self, group: Option<&GroupedSend>, body: &[u8], delay: Duration) -> Result<MessageId, QueueError> {
        match group {
            Some(group) => self.inner.sender.put_in_group(body, delay, group).await,
            None => self.inner.sender.put(body, delay).await,
        }
    }

    /// Stores `body` in `claims` and puts the envelope referencing it (the body is left for
    /// the sweeper if that put fails: a send that failed may still have stored it).
    async fn send_offloaded(&self, claims: &Arc<dyn ClaimStore>, group: Option<&GroupedSend>, body: &[u8], delay: Duration) -> Result<MessageId, QueueError> {
        if body.len() as u64 > claims.max_bytes() {
            return Err(QueueError::MessageTooLarge { size: body.len(), limit: usize::try_from(claims.max_bytes()).unwrap_or(usize::MAX) });
        }
        let stored = tokio::time::timeout(SEND_DEADLINE * 3, claims.put(bytes::Bytes::copy_from_slice(body))).await;
        let check = match stored {
            Ok(Ok(check)) => check,
            Ok(Err(error)) if error.is_retryable() => {
                return Err(QueueError::Transient(anyhow::Error::new(error).context("storing the message's body in the claim store")));
            }
            Ok(Err(error)) => return Err(QueueError::Fatal(anyhow::Error::new(error).context("storing the message's body in the claim store"))),
            Err(_) => {
                return Err(QueueError::Transient(anyhow::anyhow!(
                    "the claim store did not take the body within {}",
                    humantime::format_duration(SEND_DEADLINE * 3)
                )));
            }
        };
        let item = crate::payload::Item::claim_check(check).with_trace(crate::telemetry::sending());
        let envelope = crate::payload::encode_message_item(&item).map_err(QueueError::Fatal)?;
        let text = self.inner.payload.1;
        let envelope = if text { crate::payload::to_text(&envelope).into_bytes() } else { envelope };
        let put = self.put_as_is(group, &envelope, delay);
        match tokio::time::timeout(SEND_DEADLINE, put).await {
            Ok(put) => put,
            Err(_) => Err(storage_timed_out(SEND_DEADLINE)),
        }
    }

    /// Where the queue's claim-check calls are counted, if anywhere.
    pub fn claim_records(&self) -> Option<&ClaimRecords> {
        self.inner.claim_records.as_ref()
    }

    /// The queue's claim store, if a producer offloads into it (a queue of one storage queue).
    pub(crate) fn claim_store(&self) -> Option<&Arc<dyn ClaimStore>> {
        self.inner.claims.as_ref()
    }

    /// The largest body a send takes when the queue has a claim store (its
    /// `max_claim_check_bytes`); none: a body must fit a message.
    pub fn claim_limit(&self) -> Option<usize> {
        self.inner.claims.as_ref().map(|claims| usize::try_from(claims.max_bytes()).unwrap_or(usize::MAX))
    }

    /// The reader of the queue's reply queue, for the host's sweep.
    pub(crate) fn reply_reader(&self) -> Option<&Arc<ReplyReader>> {
        self.inner.reply.as_ref()
    }

    /// Whether the queue has a reply queue whose answers a producer can wait for (not one
    /// whose answers another configured queue handles).
    pub fn has_reply_queue(&self) -> bool {
        self.inner.reply.as_ref().is_some_and(|reader| reader.handled_by().is_none())
    }

    /// Waits up to `timeout` for the answer to message `id` (a message sent with
    /// [`QueueHandle::send`]) on the queue's reply queue: takes it (deleted once read) and
    /// leaves every other answer (released at once), items' answers included. `None` when
    /// none came in time. Fails when the queue has no reply queue.
    pub async fn wait_reply(&self, id: &MessageId, timeout: Duration) -> anyhow::Result<Option<crate::listener::Reply>> {
        self.wait_answer(id, None, timeout).await
    }

    /// [`QueueHandle::wait_reply`] for an item sent with [`QueueHandle::send_items`]: its
    /// answer only, never that of another item of its envelope (another sender's, maybe).
    pub async fn wait_item_reply(&self, item: &super::packing::ItemId, timeout: Duration) -> anyhow::Result<Option<crate::listener::Reply>> {
        self.wait_answer(&item.message_id, Some(item.item), timeout).await
    }

    /// Waits for the reply whose `correlation_id` is `id` and whose `item` is `item`.
    pub(crate) async fn wait_answer(&self, id: &MessageId, item: Option<u32>, timeout: Duration) -> anyhow::Result<Option<crate::listener::Reply>> {
        use anyhow::Context as _;
        let reply = self.inner.reply.as_ref().with_context(|| format!("queue {} has no reply_queue", self.inner.name))?;
        reply.wait(id, item, timeout).await
    }

    /// Sends work items: packed with the items this host's other senders send within the
    /// queue's `pack_linger` into envelopes (compressed with its `compression`), put, and the
    /// queue woken. Returns once every envelope holding one of them was put (within
    /// [`SEND_DEADLINE`]); a failed put fails the send.
    pub async fn send_items(&self, items: Vec<bytes::Bytes>) -> Result<ItemsSent, ItemsError> {
        let packing =
            self.inner.packing.get_or_try_init(|| async { self.start_packing() }).await.map_err(|error| ItemsError::Storage(QueueError::Fatal(error)))?;
        match tokio::time::timeout(SEND_DEADLINE, packing.send(items)).await {
            Ok(sent) => sent,
            Err(_) => Err(storage_timed_out(SEND_DEADLINE).into()),
        }
    }

    fn start_packing(&self) -> anyhow::Result<Packing> {
        let (settings, text) = self.inner.payload.clone();
        let sender = self.inner.sender.clone();
        let put: super::packing::PutEnvelope = std::sync::Arc::new(move |envelope: Vec<u8>| {
            let sender = sender.clone();
            Box::pin(async move {
                if text { sender.put(crate::payload::to_text(&envelope).as_bytes(), Duration::ZERO).await } else { sender.put(&envelope, Duration::ZERO).await }
            })
        });
        // The task must not keep the handle alive: it ends when the handle is dropped.
        let handle = std::sync::Arc::downgrade(&self.inner);
        // Rules see messages, not items: an envelope is one arrival.
        let arrived: super::packing::Arrived = std::sync::Arc::new(move |messages| {
            if let Some(inner) = handle.upgrade() {
                let handle = QueueHandle { inner };
                handle.count_arrivals(messages as u64);
                handle.wake_for(messages as u64, Duration::ZERO);
                handle.publish(Some(messages as u64), Duration::ZERO);
            }
        });
        match self.inner.claims.as_ref() {
            Some(claims) => Packing::start_with_claims(&settings, put, arrived, claims.clone()),
            None => Packing::start(&settings, put, arrived),
        }
    }

    /// Messages were put straight into storage (by another program): wake this host's
    /// listeners and tell every other host.
    pub fn notify(&self) {
        self.count_arrival();
        self.record(Seen::Notification);
        self.wake(Duration::ZERO);
        self.publish(None, Duration::ZERO);
    }

    /// Shuts this host's listeners on the queue down (see [`Listener::shutdown`]). A message
    /// still in flight when `drain_timeout` runs out is released, visible again at once, and
    /// no one else would know: then every other host is told (the bus, as for a send), so one
    /// picks it up now rather than at its safety poll. Returns how many were released.
    pub async fn shutdown_listeners(&self, drain_timeout: Duration) -> u64 {
        let released = |listeners: &[Listener]| listeners.iter().map(Listener::released_on_shutdown).sum::<u64>();
        let before = released(&self.inner.listeners);
        futures::future::join_all(self.inner.listeners.iter().map(|l| l.shutdown(drain_timeout))).await;
        let now = released(&self.inner.listeners).saturating_sub(before);
        if now > 0 {
            tracing::info!(queue = %self.name(), released = now, "telling the other hosts of the messages released at shutdown");
            self.inner.work.send_modify(|n| *n = n.wrapping_add(1));
            self.publish(Some(now), Duration::ZERO);
        }
        now
    }

    /// Another host said `count` messages arrived (a bus trigger; one when it does not say):
    /// wake this host only. This host's own triggers are not delivered back to it (see
    /// `bus::echoes`): its send woke its listeners already.
    pub fn delivered(&self, count: Option<u64>, delay: Duration) {
        self.wake_for(count.unwrap_or(1), delay);
    }

    /// Every work-detected event of this handle (sends, notifications, bus triggers), as a
    /// counter that goes up: for watchers like the KEDA scaler.
    pub fn work_events(&self) -> watch::Receiver<u64> {
        self.inner.work.subscribe()
    }

    fn wake(&self, delay: Duration) {
        self.wake_for(1, delay);
    }

    /// Wakes the listeners for `messages` arrived (spread over the partitions): once they
    /// make a batch, a listener gets them without its pickup delay.
    fn wake_for(&self, messages: u64, delay: Duration) {
        let each = messages.div_ceil(self.inner.listeners.len().max(1) as u64);
        for listener in &self.inner.listeners {
            listener.work_detected_after(each, delay);
        }
        self.inner.work.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A put through this host, or a notification made to it, counts one arrival for the
    /// rules' `arrivals_per_sec` (on a partitioned queue, in every partition's listener: the
    /// logical queue's rate). A bus trigger does not: the sending host counted it.
    fn count_arrival(&self) {
        self.count_arrivals(1);
    }

    fn count_arrivals(&self, count: u64) {
        for listener in &self.inner.listeners {
            listener.record_arrivals(count);
        }
    }

    fn publish(&self, count: Option<u64>, delay: Duration) {
        if let Some(bus) = self.inner.bus.get() {
            bus.publish(&self.inner.name, count, delay);
        }
    }
}

/// The system time in milliseconds since the Unix epoch (the listeners' default clock).
fn now_ms() -> u64 {
    crate::queue::Clock::now_ms(&crate::queue::SystemClock)
}
