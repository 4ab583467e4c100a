//! Delivery: a batch's messages through the handler and each one's outcome. A plain
//! message's way reads top to bottom in `process` (handled, then deleted, retried or
//! released), `lease` (kept leased while the handler runs), `failures` (retry or poison
//! after a failure) and `poison` (moved aside); an envelope's items go through `items`.

mod failures;
mod items;
mod lease;
mod poison;
mod process;

use std::sync::Arc;

use crate::payload::claims::ClaimStore;
use crate::payload::{Packer, PayloadSettings};
use crate::queue::QueueClient;

pub use items::Reply;
pub(crate) use poison::PoisonEnvelope;

/// Where delivered messages' outcomes go besides their own queue, and how envelopes are read.
pub(in crate::listener) struct Delivery {
    /// Where messages that cannot be handled go.
    pub(in crate::listener) poison: Arc<dyn QueueClient>,
    /// How envelopes' items are delivered, and put back when they fail.
    pub(in crate::listener) payload: PayloadSettings,
    /// Packs failed items into a new envelope.
    pub(in crate::listener) packer: Packer,
    /// Envelopes go as base64 text (an Azure queue with `encoding = "none"`).
    pub(in crate::listener) text_envelopes: bool,
    /// Where handlers' answers go, if anywhere.
    pub(in crate::listener) reply: Option<Arc<dyn QueueClient>>,
    /// Where claim-check items' bodies are, if the queue has a claim store.
    pub(in crate::listener) claims: Option<Arc<dyn ClaimStore>>,
    /// Which partition of its logical queue the queue is, if it is one: replies carry the
    /// logical ids producers know.
    pub(in crate::listener) partition: Option<usize>,
}
