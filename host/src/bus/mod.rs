//! Push notifications across hosts (the paper's one-way multicast): "messages arrived on
//! queue X" travels over a publish/subscribe engine to every host listening on X, so idle
//! queues can run zero tasks and still pick up a message at once.
//!
//! A notification is only a wake-up: the message itself is already stored. So the bus never
//! blocks a publisher (notifications queue in memory and are dropped, counted, when the
//! engine cannot keep up) and never loses a message: while the engine is unreachable the
//! listeners are told push is unavailable and poll with the rule's back-off, and the bus
//! reconnects by itself.
//!
//! The wire format, for any publisher: on channel `<channel_prefix><queue>` (default
//! `ebb:queue:<queue>`), a JSON object `{"queue": "<queue>", "count": <messages, optional>, "delay_ms": <hidden for, optional>}`
//! of at most `MAX_PAYLOAD_BYTES`.

mod echoes;
pub mod redis;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::log_limit::LogLimiter;

/// Largest notification payload read; longer ones are ignored and counted.
pub(crate) const MAX_PAYLOAD_BYTES: usize = 4096;
/// Notifications waiting to be published; beyond this they are dropped (and counted).
const PUBLISH_BACKLOG: usize = 1024;
/// How long one publish or connection attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest a stopping bus spends publishing what was queued before it stopped.
const FLUSH_BOUND: Duration = Duration::from_secs(2);
/// Reconnection back-off.
const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(10);

/// One notification: messages arrived on `queue`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trigger {
    /// The queue's (logical) name.
    pub queue: String,
    /// How many messages arrived, if the publisher knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// They were put hidden for this long (a delayed send), in milliseconds, at most
    /// `MAX_TRIGGER_DELAY_MS`: a receiver wakes its queue when they become visible, so a
    /// delayed message does not wait for the safety poll if its sender stops first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
}

/// The longest delay a trigger may carry: the longest hidden send (7 days, Azure's limit).
pub(crate) const MAX_TRIGGER_DELAY_MS: u64 = 7 * 24 * 3600 * 1000;

/// A publish/subscribe engine (Redis today; NATS or Service Bus would be another impl).
#[async_trait]
pub trait PubSub: Send + Sync + 'static {
    /// The engine and where it is, for logs and the status; never a password.
    fn describe(&self) -> String;
    /// Publishes `payload` on `channel`: one attempt.
    async fn publish(&self, channel: &str, payload: &[u8]) -> anyhow::Result<()>;
    /// Reaches the engine once (connects and asks it to answer), for `ebb check`.
    async fn reach(&self) -> anyhow::Result<()>;
    /// Subscribes to `channels`: the (channel, payload) pairs that arrive, until the
    /// connection is lost (the stream ends).
    async fn subscribe(&self, channels: &[String]) -> anyhow::Result<BoxStream<'static, (String, Vec<u8>)>>;
}

/// What the bus did, for `/status` and `/metrics`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BusStatus {
    /// The engine and where it is.
    pub engine: String,
    /// Whether the subscription is up (push available to the listeners).
    pub connected: bool,
    /// Notifications received and delivered to listeners.
    pub received: u64,
    /// Notifications published.
    pub published: u64,
    /// Publishes that failed (the message was stored; only the wake-up was lost).
    pub publish_failures: u64,
    /// Notifications dropped because the publish backlog was full.
    pub dropped: u64,
    /// Times the subscription was lost.
    pub outages: u64,
    /// Payloads ignored: not the trigger JSON, too long, or naming another queue.
    pub ignored: u64,
    /// This host's own notifications heard back, not delivered (its send woke its listeners).
    pub echoes: u64,
}

#[derive(Default)]
struct Counters {
    connected: AtomicBool,
    received: AtomicU64,
    published: AtomicU64,
    publish_failures: AtomicU64,
    dropped: AtomicU64,
    outages: AtomicU64,
    ignored: AtomicU64,
    echoes: AtomicU64,
}

/// Called with a queue's trigger as it arrives.
pub(crate) type Deliver = Arc<dyn Fn(&Trigger) + Send + Sync>;
/// Called when push becomes available (subscribed) or unavailable (lost).
pub(crate) type Availability = Arc<dyn Fn(bool) + Send + Sync>;

/// A running bus: a subscriber for this host's queues and a publisher.
pub struct Bus {
    engine: Arc<dyn PubSub>,
    outbox: mpsc::Sender<Trigger>,
    counters: Arc<Counters>,
    stop: CancellationToken,
    tasks: tokio_util::task::TaskTracker,
}

impl Bus {
    /// Starts the subscriber for `queues` (each trigger goes to `deliver`; availability
    /// changes to `available`) and the publisher, until [`Bus::stop`].
    pub fn start(engine: Arc<dyn PubSub>, prefix: &str, queues: Vec<String>, deliver: Deliver, available: Availability) -> Bus {
        let counters = Arc::new(Counters::default());
        let stop = CancellationToken::new();
        let (outbox, inbox) = mpsc::channel(PUBLISH_BACKLOG);
        let span = tracing::info_span!("bus", engine = %engine.describe());
        let tasks = tokio_util::task::TaskTracker::new();
        let own = Arc::new(echoes::OwnTriggers::default());
        let subscriber = Subscriber { engine: engine.clone(), prefix: prefix.to_string(), deliver, available, counters: counters.clone(), own: own.clone() };
        tasks.spawn(subscribe_forever(subscriber, queues, stop.clone()).instrument(span.clone()));
        tasks.spawn(publish_forever(engine.clone(), prefix.to_string(), inbox, counters.clone(), own, stop.clone()).instrument(span));
        tasks.close();
        Bus { engine, outbox, counters, stop, tasks }
    }

    /// Queues a notification for every host listening on `queue` (messages put hidden for
    /// `delay`); never waits.
    pub fn publish(&self, queue: &str, count: Option<u64>, delay: Duration) {
        let delay_ms = (!delay.is_zero()).then(|| u64::try_from(delay.as_millis()).unwrap_or(u64::MAX).min(MAX_TRIGGER_DELAY_MS));
        if self.outbox.try_send(Trigger { queue: queue.to_string(), count, delay_ms }).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What the bus did so far.
    pub fn status(&self) -> BusStatus {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BusStatus {
            engine: self.engine.describe(),
            connected: c.connected.load(Ordering::Relaxed),
            received: load(&c.received),
            published: load(&c.published),
            publish_failures: load(&c.publish_failures),
            dropped: load(&c.dropped),
            outages: load(&c.outages),
            ignored: load(&c.ignored),
            echoes: load(&c.echoes),
        }
    }

    /// Stops subscribing and publishing.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Stops subscribing and publishing, and waits for both to end: the notifications
    /// queued before are published first (within a bound of 2 s).
    pub async fn shutdown(&self) {
        self.stop.cancel();
        self.tasks.wait().await;
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Publishes one trigger right away (for `ebb send` without a running host), bounded.
pub(crate) async fn publish_once(engine: &dyn PubSub, prefix: &str, trigger: &Trigger) -> anyhow::Result<()> {
    let payload = serde_json::to_vec(trigger)?;
    match tokio::time::timeout(ATTEMPT_TIMEOUT, engine.publish(&format!("{prefix}{}", trigger.queue), &payload)).await {
        Ok(result) => result,
        Err(_) => anyhow::bail!("{}: no answer within {ATTEMPT_TIMEOUT:?}", engine.describe()),
    }
}

/// Reaches the engine once, bounded (for `ebb check`).
pub async fn reach(engine: &dyn PubSub) -> anyhow::Result<()> {
    match tokio::time::timeout(ATTEMPT_TIMEOUT, engine.reach()).await {
        Ok(result) => result,
        Err(_) => anyhow::bail!("{}: no answer within {ATTEMPT_TIMEOUT:?}", engine.describe()),
    }
}

/// The trigger in `payload` on `channel`, if it is one for that channel's queue.
pub(crate) fn parse_trigger(prefix: &str, channel: &str, payload: &[u8]) -> Option<Trigger> {
    let queue = channel.strip_prefix(prefix)?;
    if payload.len() > MAX_PAYLOAD_BYTES {
        return None;
    }
    let trigger: Trigger = serde_json::from_slice(payload).ok()?;
    (trigger.queue == queue && trigger.delay_ms.is_none_or(|delay| delay <= MAX_TRIGGER_DELAY_MS)).then_some(trigger)
}

fn back_off(attempt: u32) -> Duration {
    let exponential = RECONNECT_MIN.saturating_mul(1 << attempt.min(10));
    exponential.min(RECONNECT_MAX).mul_f64(0.5 + fastrand::f64() / 2.0)
}

/// What the subscriber works with.
struct Subscriber {
    engine: Arc<dyn PubSub>,
    prefix: String,
    deliver: Deliver,
    available: Availability,
    counters: Arc<Counters>,
    /// This host's triggers whose echo is not delivered.
    own: Arc<echoes::OwnTriggers>,
}

async fn subscribe_forever(subscriber: Subscriber, queues: Vec<String>, stop: CancellationToken) {
    let Subscriber { engine, prefix, deliver, available, counters, own } = subscriber;
    let channels: Vec<String> = queues.iter().map(|q| format!("{prefix}{q}")).collect();
    let ignored_log = LogLimiter::new(3, Duration::from_secs(60));
    let mut failures = 0u32;
    let mut ever_connected = false;
    loop {
        let subscribed = tokio::select! {
            subscribed = tokio::time::timeout(ATTEMPT_TIMEOUT, engine.subscribe(&channels)) => subscribed,
            _ = stop.cancelled() => return,
        };
        match subscribed {
            Ok(Ok(mut stream)) => {
                failures = 0;
                counters.connected.store(true, Ordering::Relaxed);
                available(true);
                if ever_connected {
                    tracing::info!("push notifications are back; idle queues may stop polling again");
                } else {
                    tracing::info!(channels = ?channels, "subscribed to push notifications");
                }
                ever_connected = true;
                loop {
                    let next = tokio::select! {
                        next = stream.next() => next,
                        _ = stop.cancelled() => return,
                    };
                    let Some((channel, payload)) = next else { break };
                    match parse_trigger(&prefix, &channel, &payload) {
                        Some(trigger) if own.is_echo(&trigger) => {
                            counters.echoes.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(trigger) => {
                            counters.received.fetch_add(1, Ordering::Relaxed);
                            deliver(&trigger);
                        }
                        None => {
                            counters.ignored.fetch_add(1, Ordering::Relaxed);
                            if let Some(suppressed) = ignored_log.allow() {
                                let shown: String = String::from_utf8_lossy(&payload[..payload.len().min(80)]).escape_debug().collect();
                                tracing::warn!(%channel, suppressed, "ignored a notification that is not {{\"queue\": \"<this channel's queue>\", \"count\": n}}: {shown}");
                            }
                        }
                    }
                }
                counters.connected.store(false, Ordering::Relaxed);
                counters.outages.fetch_add(1, Ordering::Relaxed);
                own.forget();
                available(false);
                tracing::warn!("push notifications lost; queues poll with their rule's back-off until the bus is back");
            }
            failed => {
                if failures == 0 {
                    counters.connected.store(false, Ordering::Relaxed);
                    available(false);
                    let reason = match failed {
                        Ok(Err(error)) => format!("{error:#}"),
                        _ => format!("no answer within {ATTEMPT_TIMEOUT:?}"),
                    };
                    // Logged once per outage, not once per attempt.
                    tracing::warn!("cannot subscribe to push notifications ({reason}); queues poll until it works, retrying");
                }
                failures = failures.saturating_add(1);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(back_off(failures)) => {}
            _ = stop.cancelled() => return,
        }
    }
}

async fn publish_forever(
    engine: Arc<dyn PubSub>,
    prefix: String,
    mut inbox: mpsc::Receiver<Trigger>,
    counters: Arc<Counters>,
    own: Arc<echoes::OwnTriggers>,
    stop: CancellationToken,
) {
    let failure_log = LogLimiter::new(1, Duration::from_secs(60));
    let publish = async |trigger: Trigger| {
        // Noted before: its echo may come back before the publish's own answer.
        own.publishing(&trigger);
        let published = publish_once(&*engine, &prefix, &trigger).await;
        match published {
            Ok(()) => {
                counters.published.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                own.not_published(&trigger);
                counters.publish_failures.fetch_add(1, Ordering::Relaxed);
                if let Some(suppressed) = failure_log.allow() {
                    tracing::warn!(queue = %trigger.queue, suppressed, "could not publish a push notification (the message is stored; hosts find it by polling): {error:#}");
                }
            }
        }
    };
    loop {
        let trigger = tokio::select! {
            trigger = inbox.recv() => match trigger { Some(t) => t, None => return },
            _ = stop.cancelled() => break,
        };
        publish(trigger).await;
    }
    // Stopping: what was queued before (the messages a shutdown released) still goes out,
    // within FLUSH_BOUND.
    let flush = async {
        while let Ok(trigger) = inbox.try_recv() {
            publish(trigger).await;
        }
    };
    if tokio::time::timeout(FLUSH_BOUND, flush).await.is_err() {
        tracing::warn!(
            "stopped publishing push notifications after {FLUSH_BOUND:?}; the rest are dropped (the messages are stored; hosts find them by polling)"
        );
    }
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_trigger_json_for_the_channels_own_queue_is_taken() {
        let ok = parse_trigger("ebb:queue:", "ebb:queue:orders", br#"{"queue":"orders","count":3}"#);
        assert_eq!(ok, Some(Trigger { queue: "orders".into(), count: Some(3), delay_ms: None }));
        assert_eq!(parse_trigger("ebb:queue:", "ebb:queue:orders", br#"{"queue":"orders"}"#).unwrap().count, None);
        let delayed = parse_trigger("ebb:queue:", "ebb:queue:orders", br#"{"queue":"orders","count":1,"delay_ms":604800000}"#);
        assert_eq!(delayed.unwrap().delay_ms, Some(MAX_TRIGGER_DELAY_MS), "a delayed send's trigger, up to 7 days");
        for (channel, payload) in [
            ("ebb:queue:orders", br#"{"queue":"other"}"#.to_vec()),
            ("ebb:queue:orders", b"orders".to_vec()),
            ("ebb:queue:orders", br#"{"queue":"orders","count":-1}"#.to_vec()),
            ("ebb:queue:orders", br#"{"queue":"orders","extra":1}"#.to_vec()),
            ("ebb:queue:orders", br#"{"queue":"orders","delay_ms":604800001}"#.to_vec()),
            ("elsewhere:orders", br#"{"queue":"orders"}"#.to_vec()),
            ("ebb:queue:orders", format!(r#"{{"queue":"orders","pad":"{}"}}"#, "x".repeat(MAX_PAYLOAD_BYTES)).into_bytes()),
        ] {
            assert_eq!(parse_trigger("ebb:queue:", channel, &payload), None, "{channel} {}", String::from_utf8_lossy(&payload));
        }
    }

    /// An engine that records what is published, and whose subscription never ends.
    #[derive(Default)]
    struct Recording(std::sync::Mutex<Vec<String>>);

    #[async_trait]
    impl PubSub for Recording {
        fn describe(&self) -> String {
            "recording".into()
        }
        async fn publish(&self, channel: &str, _payload: &[u8]) -> anyhow::Result<()> {
            self.0.lock().unwrap().push(channel.to_string());
            Ok(())
        }
        async fn reach(&self) -> anyhow::Result<()> {
            Ok(())
        }
        async fn subscribe(&self, _channels: &[String]) -> anyhow::Result<BoxStream<'static, (String, Vec<u8>)>> {
            Ok(futures::stream::pending().boxed())
        }
    }

    /// A shutdown publishes what was queued just before (the messages a host released as it
    /// stopped) rather than dropping it.
    #[tokio::test(start_paused = true)]
    async fn shutdown_publishes_what_was_queued_before() {
        let engine = Arc::new(Recording::default());
        let bus = Bus::start(engine.clone(), "ebb:queue:", vec!["orders".into()], Arc::new(|_| {}), Arc::new(|_| {}));
        for _ in 0..10 {
            bus.publish("orders", Some(1), Duration::ZERO);
        }
        bus.shutdown().await;
        assert_eq!(*engine.0.lock().unwrap(), ["ebb:queue:orders"; 10]);
        assert_eq!(bus.status().published, 10);
    }

    #[test]
    fn reconnect_back_off_grows_and_is_capped() {
        assert!(back_off(0) <= RECONNECT_MIN && back_off(0) >= RECONNECT_MIN / 2);
        assert!(back_off(40) <= RECONNECT_MAX && back_off(40) >= RECONNECT_MAX / 2);
    }
}
