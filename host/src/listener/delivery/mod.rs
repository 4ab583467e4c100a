//! Delivery: a batch's messages through the handler and each one's outcome. A plain
//! message's way reads top to bottom in `process` (handled, then deleted, retried or
//! released), `lease` (kept leased while the handler runs), `failures` (retry or poison
//! after a failure) and `poison` (moved aside); an envelope's items go through `items`, handlers'
//! answers through `replies`. On a FIFO queue, `groups` gives each group's messages their
//! turns.

mod deletes;
mod failures;
mod group_commit;
mod groups;
mod items;
mod lease;
mod poison;
mod process;
mod replies;

use std::sync::Arc;

use crate::payload::claims::ClaimStore;
use crate::payload::{MIN_ENVELOPE_BYTES, Packer, PayloadSettings};
use crate::queue::{MessageId, PopReceipt, QueueClient};

pub(crate) use poison::PoisonEnvelope;
pub use replies::Reply;

/// Where delivered messages' outcomes go besides their own queue, and how envelopes are read.
pub(in crate::listener) struct Delivery {
    /// Where messages that cannot be handled go.
    poison: Arc<dyn QueueClient>,
    /// How envelopes' items are delivered, and put back when they fail.
    payload: PayloadSettings,
    /// Packs failed items into a new envelope.
    packer: Packer,
    /// Envelopes go as base64 text (an Azure queue with `encoding = "none"`).
    text_envelopes: bool,
    /// Where handlers' answers go, if anywhere.
    reply: Option<Arc<dyn QueueClient>>,
    /// Where claim-check items' bodies are, if the queue has a claim store.
    claims: Option<Arc<dyn ClaimStore>>,
    /// Which partition of its logical queue the queue is, if it is one: replies carry the
    /// logical ids producers know.
    partition: Option<usize>,
    /// Deletes waiting for the next batch call.
    deletes: group_commit::GroupCommit<(MessageId, PopReceipt), ()>,
    /// Lease renewals waiting for the next batch call.
    renewals: group_commit::GroupCommit<(MessageId, PopReceipt), PopReceipt>,
    /// A FIFO queue's groups being handled, one message of each at a time.
    groups: Arc<groups::GroupGate>,
}

impl Delivery {
    /// Delivery to `poison` and `reply`, with envelopes as `payload` says (`text`: the
    /// queue's messages are text), claims from `claims`, for partition `partition`.
    pub(in crate::listener) fn new(
        poison: Arc<dyn QueueClient>,
        payload: PayloadSettings,
        text: bool,
        reply: Option<Arc<dyn QueueClient>>,
        claims: Option<Arc<dyn ClaimStore>>,
        partition: Option<usize>,
    ) -> Delivery {
        let packer = Packer::new(payload.compression, payload.max_envelope_bytes.max(MIN_ENVELOPE_BYTES)).expect("the limit is at least the smallest envelope");
        Delivery {
            poison,
            payload,
            packer,
            text_envelopes: text,
            reply,
            claims,
            partition,
            deletes: Default::default(),
            renewals: Default::default(),
            groups: Arc::default(),
        }
    }
}
