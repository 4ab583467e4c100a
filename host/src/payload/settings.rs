//! A queue's payload settings (`compression`, `pack_linger`, `delivery`, `max_batch_items`,
//! `reply_queue`), validated by `config`; read by the producers' packing task and the
//! listener.

use std::time::Duration;

use super::Codec;

/// How the listener hands an envelope's items to the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Delivery {
    /// Each item in a call of its own, as if it had been a message (Azure Functions' queue
    /// trigger): a handler written for plain messages works unchanged.
    #[default]
    Item,
    /// Up to `max_batch_items` items in one call (a JSON array over HTTP), the handler
    /// answering which failed.
    Batch,
}

/// What a queue's producers and listener do with envelopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadSettings {
    /// The codec new envelopes are compressed with (any codec is read).
    pub compression: Codec,
    /// How long the packing task waits for more items after the first, before it puts.
    pub pack_linger: Duration,
    /// Items one at a time, or in batches.
    pub delivery: Delivery,
    /// Most items in one batch call (`delivery = "batch"`).
    pub max_batch_items: u32,
    /// The largest envelope the queue's backend carries, in bytes.
    pub max_envelope_bytes: usize,
    /// Where handlers' answers go, with the request's message id as correlation id.
    pub reply_queue: Option<String>,
    /// How long an answer nobody took stays on the reply queue.
    pub reply_ttl: Duration,
    /// A plain message sent with a trace context goes as an envelope of one message that
    /// carries it (`trace_envelope`), on a backend without message metadata.
    pub trace_envelope: bool,
}

impl Default for PayloadSettings {
    fn default() -> Self {
        use crate::defaults as d;
        PayloadSettings {
            compression: Codec::default(),
            pack_linger: d::PACK_LINGER,
            delivery: Delivery::default(),
            max_batch_items: d::MAX_BATCH_ITEMS,
            max_envelope_bytes: d::MAX_MESSAGE_BYTES,
            reply_queue: None,
            reply_ttl: d::REPLY_TTL,
            trace_envelope: false,
        }
    }
}
