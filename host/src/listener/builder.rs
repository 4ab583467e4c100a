//! Building a listener: what it requires, and what it may be given instead of the defaults.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::handler::Handler;
use crate::payload::PayloadSettings;
use crate::queue::{Clock, QueueClient, SystemClock, Transactions};
use crate::record::QueueRecording;
use crate::rules::{BuiltInRule, Decider};

use super::delivery::Delivery;
use super::pool::Pool;
use super::rule::Rule;
use super::telemetry::Telemetry;
use super::work::Events;
use super::{Listener, QueueSettings, Shared};

/// Builds a [`Listener`]: the queue, its poison queue and the handler are required; the
/// rule (default: the built-in one), the settings (default: [`QueueSettings::default`]) and
/// the transaction counters shown in the status (default: none) are not.
pub struct ListenerBuilder {
    queue: Arc<dyn QueueClient>,
    poison: Arc<dyn QueueClient>,
    handler: Arc<dyn Handler>,
    decider: Arc<dyn Decider>,
    clock: Arc<dyn Clock>,
    settings: QueueSettings,
    transactions: Option<Arc<Transactions>>,
    payload: PayloadSettings,
    text_envelopes: bool,
    reply: Option<Arc<dyn QueueClient>>,
    recording: Option<Arc<QueueRecording>>,
    claims: Option<Arc<dyn crate::payload::claims::ClaimStore>>,
    partition: Option<usize>,
}

impl Listener {
    /// A builder for a listener on `queue`, whose poisoned messages go to `poison`.
    pub fn builder(queue: Arc<dyn QueueClient>, poison: Arc<dyn QueueClient>, handler: Arc<dyn Handler>) -> ListenerBuilder {
        ListenerBuilder {
            queue,
            poison,
            handler,
            decider: Arc::new(BuiltInRule),
            clock: Arc::new(SystemClock),
            settings: QueueSettings::default(),
            transactions: None,
            payload: PayloadSettings::default(),
            text_envelopes: false,
            reply: None,
            recording: None,
            claims: None,
            partition: None,
        }
    }
}

impl ListenerBuilder {
    /// The clock whose time the rules are told (default: the system's; a simulation gives
    /// its paused clock, so a time-of-day rule sees simulated time).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// What decides the task count and the idle sleeps: the queue's WASM rules (from
    /// [`crate::rules::RuleSet::queue`]), a rule in Rust ([`crate::rules::NativeRule`]), or
    /// by default the built-in rule.
    pub fn decider(mut self, decider: Arc<dyn Decider>) -> Self {
        self.decider = decider;
        self
    }

    /// The queue's settings.
    pub fn settings(mut self, settings: QueueSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Storage counters to report in the status.
    pub fn transactions(mut self, transactions: Arc<Transactions>) -> Self {
        self.transactions = Some(transactions);
        self
    }

    /// How envelopes' items are delivered and put back (default: [`PayloadSettings::default`]);
    /// `text`: the queue's messages are text, so envelopes go as base64 text.
    pub fn payload(mut self, payload: PayloadSettings, text: bool) -> Self {
        self.payload = payload;
        self.text_envelopes = text;
        self
    }

    /// The queue handlers' answers are put on, with the request's id as correlation id.
    pub fn reply_queue(mut self, reply: Arc<dyn QueueClient>) -> Self {
        self.reply = Some(reply);
        self
    }

    /// Where messages its gets see for the first time are counted as arrivals (see
    /// [`crate::record`]); default: nowhere.
    pub fn recording(mut self, recording: Arc<QueueRecording>) -> Self {
        self.recording = Some(recording);
        self
    }

    /// The queue's claim store: claim-check items are fetched from it, and their bodies
    /// deleted once handled (default: none, such items are poisoned).
    pub fn claims(mut self, claims: Arc<dyn crate::payload::claims::ClaimStore>) -> Self {
        self.claims = Some(claims);
        self
    }

    /// The queue is partition `index` of a partitioned queue: replies name their requests
    /// by the logical queue's ids (`<index>:<id>`), the ids its producers got back from
    /// their sends (default: the queue's own ids).
    pub fn partition(mut self, index: usize) -> Self {
        self.partition = Some(index);
        self
    }

    /// The listener; no task runs until [`Listener::start`].
    pub fn build(self) -> Listener {
        let ListenerBuilder { queue, poison, handler, decider, clock, settings, transactions, payload, text_envelopes, reply, recording, claims, partition } =
            self;
        let seed = settings.random_seed.unwrap_or_else(|| fastrand::u64(..));
        let pool = Pool::new(settings.max_concurrent_calls);
        Listener {
            shared: Arc::new(Shared {
                queue,
                handler,
                settings,
                stopping: CancellationToken::new(),
                abandon: CancellationToken::new(),
                tasks: TaskTracker::new(),
                started: AtomicBool::new(false),
                paused: tokio::sync::watch::Sender::new(None),
                rule: Rule::new(decider, clock, seed),
                events: Events::default(),
                pool,
                delivery: Delivery::new(poison, payload, text_envelopes, reply, claims, partition),
                telemetry: Telemetry::new(recording, transactions),
            }),
        }
    }
}
