//! Payloads (issue 20): many work items packed into one queue message, an **envelope**.
//!
//! A queue transaction is billed per message, not per byte, so packing small items costs a
//! fraction of sending them one by one. This module is the format and nothing else: the
//! backends learn nothing of envelopes, and the producers and the listener (which pack and
//! unpack) sit on top of it.
//!
//! - [`encode`] and [`decode`]: the versioned binary format, byte by byte in
//!   `docs/reference/envelope.md` (readable without ebb: `tests/azure-sdk/unpack.py`). A message that
//!   does not start with `MAGIC` is [`Decoded::NotAnEnvelope`] and is delivered as it is,
//!   so old producers keep working. Hostile input is an [`EnvelopeError`] with its reason,
//!   bounded by [`Limits`] before anything is allocated.
//! - [`Packer`]: items into as few envelopes as fit a backend's message limit, compressed
//!   with a [`Codec`] chosen per queue (by default zstd, chosen by `ebb bench codecs`:
//!   `docs/reference/envelope.md`); an item too large for any envelope is handed back to
//!   be offloaded (a [`ClaimCheck`]). [`Packer::repack_failed`] puts the items that failed
//!   back into a new envelope, each counted one more attempt.
//! - [`to_text`] and `decode_text`: an envelope as base64 text, for an Azure queue whose
//!   messages are plain text (`encoding = "none"`). An Azure queue with the default
//!   `encoding = "base64"` already writes any bytes as base64, so the envelope goes as it is.
//! - [`ExtendedClientPointers`]: an offloaded message as the SQS Extended Client's pointer,
//!   handed to the SQS backend (which knows the pointer's wire format, not envelopes).
//!
//! ```
//! use ebb::payload::{Codec, Decoded, Item, Limits, Packer, decode};
//!
//! let items: Vec<Item> = (0..100).map(|i| Item::inline(format!("{{\"order\": {i}}}"))).collect();
//! let packed = Packer::new(Codec::default(), ebb::payload::AZURE_MAX_ENVELOPE_BYTES)?.pack(&items)?;
//! assert_eq!(packed.envelopes.len(), 1);
//! let Decoded::Envelope(envelope) = decode(&packed.envelopes[0].bytes, &Limits::default())? else { unreachable!() };
//! assert_eq!(envelope.items, items);
//! # Ok::<(), anyhow::Error>(())
//! ```

mod carry;
pub mod claims;
mod codec;
mod decompress;
mod error;
mod extended;
mod format;
mod item;
mod limits;
mod pack;
mod settings;
mod text;
mod wire;

pub(crate) use carry::put_carrying;
pub use codec::Codec;
pub use error::EnvelopeError;
pub(crate) use extended::ExtendedClientPointers;
pub(crate) use format::encode_message_item;
pub use format::{Decoded, Envelope, decode, encode, encode_message};
pub(crate) use item::bucket_defect;
pub use item::{AzureContainer, BlobRef, Body, ClaimCheck, Item, Origin};

pub(crate) use limits::DEFAULT_MAX_ITEMS;
pub use limits::{AllowedReferences, DEFAULT_MAX_CLAIM_CHECK_BYTES, Limits};
pub use pack::MIN_ENVELOPE_BYTES;
pub(crate) use pack::Packed;
pub use pack::Packer;
pub use settings::{Delivery, PayloadSettings};
pub use text::decode_text;
pub use text::to_text;
pub use wire::MAGIC;
pub use wire::{ENVELOPE_OVERHEAD_BYTES, MIN_ITEM_BYTES};

/// The largest envelope an Azure queue carries, in bytes: 64 KiB of message text holds
/// 49,152 bytes once base64-encoded, whether the queue's backend encodes them
/// (`encoding = "base64"`) or [`to_text`] does (`encoding = "none"`).
pub const AZURE_MAX_ENVELOPE_BYTES: usize = 49_152;

#[cfg(test)]
mod tests;
