//! The envelope, byte by byte (version 1; `docs/reference/envelope.md` draws it). Integers are
//! little-endian.
//!
//! ```text
//! header   0..8    magic            C1 45 42 42 0D 0A 1A 0A
//!          8       version          1
//!          9       codec            0 none, 1 deflate, 2 zstd, 3 lz4
//!          10..12  flags            bit 0: one plain message offloaded (below); a reader
//!                                   refuses flags it does not know
//!          12..16  item count       u32
//!          16..20  decoded length   u32: the item section's bytes once decompressed
//!          20..24  stored length    u32: the item section's bytes as they follow
//! section  24..24+stored            the item section, compressed with the codec
//! trailer  last 4  CRC32            u32 (IEEE, as zlib's crc32) of every byte before it
//! ```
//!
//! The item section is the items one after another:
//!
//! ```text
//! kind u8 (0 inline, 1 claim check; bit 7 set: an origin follows; bit 6: a trace
//!   context follows), attempts u32,
//!   origin (bit 7 only): message id (u8 length 1 to 255, UTF-8), item index u32,
//!   trace (bit 6 only): traceparent (u8 length, ASCII), tracestate (u16 length, ASCII), then
//!   inline:       length u32, the bytes
//!   claim check:  size u64, sha256 [32], location u8, then
//!                   1 azure blob:    account (u8 length, bytes), container (u8, bytes), blob (u16, bytes)
//!                   2 embedded body: queue (u8 length, bytes), key u64
//!                   3 s3 object:     bucket (u8 length, bytes), key (u16, bytes)
//! ```
//!
//! With flag bit 0 ([`FLAG_MESSAGE`]) the envelope is one plain message whose body was too
//! large for the queue: exactly one item, a claim check. It is delivered as the plain
//! message it was sent as (no item position, answered and retried as a message).

use bytes::Bytes;

use super::codec::{Codec, Compressor};
use super::decompress::decompress;
use super::error::EnvelopeError;
use super::item::{BlobRef, Body, ClaimCheck, Item, Origin};
use super::limits::Limits;
use crate::telemetry::TraceContext;

use super::wire::{ENVELOPE_OVERHEAD_BYTES, FLAG_MESSAGE, FORMAT_VERSION, HEADER_BYTES, MAGIC, MIN_ITEM_BYTES, TRAILER_BYTES};

const INLINE: u8 = 0;
const CLAIM_CHECK: u8 = 1;
/// Bit 7 of an item's kind: its origin (where its producer put it) follows its attempts.
const HAS_ORIGIN: u8 = 0x80;
/// Bit 6 of an item's kind: its producer's trace context follows its origin. An envelope
/// without it reads as before; a reader that predates it refuses the kind.
const HAS_TRACE: u8 = 0x40;
const AZURE_BLOB: u8 = 1;
const EMBEDDED_BODY: u8 = 2;
const S3_OBJECT: u8 = 3;

/// What a message turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// No envelope marker: a plain message, delivered as it is.
    NotAnEnvelope,
    /// An envelope and its items.
    Envelope(Envelope),
}

/// The items of one envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// How its item section was compressed.
    pub codec: Codec,
    /// Its items, in the order they were packed.
    pub items: Vec<Item>,
    /// One plain message, offloaded (`FLAG_MESSAGE`): its only item is a claim check,
    /// delivered as the message it was sent as.
    pub message: bool,
}

/// Appends an item's kind, attempts, origin and trace context.
fn write_head(kind: u8, item: &Item, out: &mut Vec<u8>) -> anyhow::Result<()> {
    let flags = if item.origin.is_some() { HAS_ORIGIN } else { 0 } | if item.trace.is_some() { HAS_TRACE } else { 0 };
    out.push(kind | flags);
    out.extend_from_slice(&item.attempts.to_le_bytes());
    if let Some(origin) = &item.origin {
        let id = origin.message_id.as_bytes();
        anyhow::ensure!((1..=255).contains(&id.len()), "an origin's message id of {} bytes: 1 to 255", id.len());
        out.push(id.len() as u8);
        out.extend_from_slice(id);
        out.extend_from_slice(&origin.index.to_le_bytes());
    }
    if let Some(trace) = &item.trace {
        let parent = trace.traceparent().as_bytes();
        let state = trace.tracestate().unwrap_or_default().as_bytes();
        // A parsed context is 55 bytes and a tracestate at most 8 KiB: both fit their lengths.
        anyhow::ensure!(parent.len() <= 255 && state.len() <= usize::from(u16::MAX), "a trace context of {} bytes", trace.len());
        out.push(parent.len() as u8);
        out.extend_from_slice(parent);
        out.extend_from_slice(&(state.len() as u16).to_le_bytes());
        out.extend_from_slice(state);
    }
    Ok(())
}

/// Appends `item`'s record to an item section.
pub(super) fn write_record(item: &Item, out: &mut Vec<u8>) -> anyhow::Result<()> {
    match &item.body {
        Body::Inline(bytes) => {
            let length = u32::try_from(bytes.len()).map_err(|_| anyhow::anyhow!("an inline item of {} bytes: at most 4 GiB", bytes.len()))?;
            write_head(INLINE, item, out)?;
            out.extend_from_slice(&length.to_le_bytes());
            out.extend_from_slice(bytes);
        }
        Body::ClaimCheck(check) => {
            if let Some(defect) = check.location.defect() {
                anyhow::bail!("claim check {}: {defect}", check.location);
            }
            write_head(CLAIM_CHECK, item, out)?;
            out.extend_from_slice(&check.size.to_le_bytes());
            out.extend_from_slice(&check.sha256);
            match &check.location {
                BlobRef::Azure { account, container, blob } => {
                    out.push(AZURE_BLOB);
                    // The defect check bounds each length to its field's width.
                    out.push(account.len() as u8);
                    out.extend_from_slice(account.as_bytes());
                    out.push(container.len() as u8);
                    out.extend_from_slice(container.as_bytes());
                    out.extend_from_slice(&(blob.len() as u16).to_le_bytes());
                    out.extend_from_slice(blob.as_bytes());
                }
                BlobRef::Embedded { queue, key } => {
                    out.push(EMBEDDED_BODY);
                    out.push(queue.len() as u8);
                    out.extend_from_slice(queue.as_bytes());
                    out.extend_from_slice(&key.to_le_bytes());
                }
                BlobRef::S3 { bucket, key } => {
                    out.push(S3_OBJECT);
                    out.push(bucket.len() as u8);
                    out.extend_from_slice(bucket.as_bytes());
                    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
                    out.extend_from_slice(key.as_bytes());
                }
            }
        }
    }
    Ok(())
}

/// Appends a whole envelope of `count` items whose section is `section` to `out`.
pub(super) fn seal(codec: Codec, count: usize, section: &[u8], compressor: &mut Compressor, out: &mut Vec<u8>) -> anyhow::Result<()> {
    seal_with_flags(codec, 0, count, section, compressor, out)
}

fn seal_with_flags(codec: Codec, flags: u16, count: usize, section: &[u8], compressor: &mut Compressor, out: &mut Vec<u8>) -> anyhow::Result<()> {
    let count = u32::try_from(count).map_err(|_| anyhow::anyhow!("{count} items in one envelope: at most {}", u32::MAX))?;
    let decoded = u32::try_from(section.len()).map_err(|_| anyhow::anyhow!("an item section of {} bytes: at most 4 GiB", section.len()))?;
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    out.push(FORMAT_VERSION);
    out.push(codec.id());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&decoded.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // the stored length, known once compressed
    compressor.compress(section, out)?;
    let stored = out.len() - start - HEADER_BYTES;
    let stored = u32::try_from(stored).map_err(|_| anyhow::anyhow!("a compressed section of {stored} bytes: at most 4 GiB"))?;
    out[start + 20..start + 24].copy_from_slice(&stored.to_le_bytes());
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// One envelope holding `items`, with no limit but the format's (see [`super::Packer`]
/// for envelopes that fit a queue).
pub fn encode(items: &[Item], codec: Codec) -> anyhow::Result<Vec<u8>> {
    let mut section = Vec::new();
    for (index, item) in items.iter().enumerate() {
        write_record(item, &mut section).map_err(|e| e.context(format!("item {index}")))?;
    }
    let mut envelope = Vec::with_capacity(ENVELOPE_OVERHEAD_BYTES + section.len());
    seal(codec, items.len(), &section, &mut Compressor::new(codec)?, &mut envelope)?;
    Ok(envelope)
}

/// The envelope of one plain message whose body was offloaded to `check` (see
/// `FLAG_MESSAGE`); a few hundred bytes, whatever the body's size.
pub fn encode_message(check: ClaimCheck) -> anyhow::Result<Vec<u8>> {
    encode_message_item(&Item::claim_check(check))
}

/// The envelope of one plain message (`FLAG_MESSAGE`): its only item a claim check (the
/// body offloaded), or an inline body with its trace context (a queue whose messages have
/// no metadata to carry it in). Refuses an inline item without a trace context: that is
/// the plain message itself.
pub(crate) fn encode_message_item(item: &Item) -> anyhow::Result<Vec<u8>> {
    anyhow::ensure!(is_message_item(item), "an envelope of one plain message holds a claim check, or an inline body with its trace context");
    let mut section = Vec::new();
    write_record(item, &mut section)?;
    let mut envelope = Vec::with_capacity(ENVELOPE_OVERHEAD_BYTES + section.len());
    // A reference does not compress, and a message's body was sent as it is: stored as it
    // is, readable with no codec at all.
    seal_with_flags(Codec::None, FLAG_MESSAGE, 1, &section, &mut Compressor::new(Codec::None)?, &mut envelope)?;
    Ok(envelope)
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// A message's items if it is an envelope; [`Decoded::NotAnEnvelope`] if it does not
/// start with `MAGIC`; the reason if it starts like one but is not one `limits` accept.
///
/// Never panics. Allocates at most `limits.max_decoded_bytes` (plus one byte) for the
/// section and one [`Item`] per declared item, both checked against `limits` first.
pub fn decode(bytes: &[u8], limits: &Limits) -> Result<Decoded, EnvelopeError> {
    decode_with(bytes, limits, false)
}

/// The claim check of `bytes` if they are the envelope of one plain message offloaded
/// ([`encode_message`]), whatever store it points into: for a backend that writes such a
/// message in a format of its own (SQS's Extended Client pointer, `extended.rs`). Nothing
/// is fetched: which references a consumer follows is still its [`Limits`]' to say.
pub(super) fn offloaded_message(bytes: &[u8]) -> Option<ClaimCheck> {
    let limits = Limits { max_claim_check_bytes: u64::MAX, ..Limits::default() };
    match decode_with(bytes, &limits, true) {
        Ok(Decoded::Envelope(Envelope { message: true, mut items, .. })) => match items.pop().map(|item| item.body) {
            Some(Body::ClaimCheck(check)) => Some(check),
            _ => None,
        },
        _ => None,
    }
}

/// [`decode`], following any reference when `any_reference` (else `limits.references` only).
fn decode_with(bytes: &[u8], limits: &Limits, any_reference: bool) -> Result<Decoded, EnvelopeError> {
    if !bytes.starts_with(&MAGIC) {
        return Ok(Decoded::NotAnEnvelope);
    }
    if bytes.len() < ENVELOPE_OVERHEAD_BYTES {
        return Err(EnvelopeError::Truncated { length: bytes.len(), needed: ENVELOPE_OVERHEAD_BYTES });
    }
    // The version first: a later one may lay out the rest differently.
    let version = bytes[8];
    if version != FORMAT_VERSION {
        return Err(EnvelopeError::UnsupportedVersion { version });
    }
    let stored = u32_at(bytes, 20) as usize;
    let expected = ENVELOPE_OVERHEAD_BYTES + stored;
    if bytes.len() < expected {
        return Err(EnvelopeError::Truncated { length: bytes.len(), needed: expected });
    }
    if bytes.len() > expected {
        return Err(EnvelopeError::TrailingBytes { length: bytes.len(), expected });
    }
    let (covered, trailer) = bytes.split_at(bytes.len() - TRAILER_BYTES);
    let stored_crc = u32_at(trailer, 0);
    let computed = crc32fast::hash(covered);
    if stored_crc != computed {
        return Err(EnvelopeError::Checksum { stored: stored_crc, computed });
    }
    let codec = Codec::from_id(bytes[9]).ok_or(EnvelopeError::UnknownCodec { id: bytes[9] })?;
    let flags = u16_at(bytes, 10);
    if flags & !FLAG_MESSAGE != 0 {
        return Err(EnvelopeError::UnknownFlags { flags });
    }
    let message = flags & FLAG_MESSAGE != 0;
    let count = u32_at(bytes, 12);
    if count > limits.max_items {
        return Err(EnvelopeError::TooManyItems { count, limit: limits.max_items });
    }
    let declared = u32_at(bytes, 16);
    if u64::from(declared) > limits.max_decoded_bytes as u64 {
        return Err(EnvelopeError::DecodedTooLarge { declared: u64::from(declared), limit: limits.max_decoded_bytes });
    }
    let declared = declared as usize;
    if count as usize > declared / MIN_ITEM_BYTES {
        return Err(EnvelopeError::ImpossibleCount { count, declared });
    }
    let section = Bytes::from(decompress(codec, &covered[HEADER_BYTES..], declared)?);
    let mut fields = Fields { section: &section, at: 0, index: 0, count, any_reference };
    let mut items = Vec::with_capacity(count as usize);
    for index in 0..count {
        fields.index = index;
        items.push(fields.item(limits)?);
    }
    if fields.at != section.len() {
        return Err(EnvelopeError::ExtraBytes { count, extra: section.len() - fields.at });
    }
    if message && !matches!(items.as_slice(), [item] if is_message_item(item)) {
        return Err(EnvelopeError::BadMessage { count });
    }
    Ok(Decoded::Envelope(Envelope { codec, items, message }))
}

/// Whether `item` may be the only item of an envelope of one plain message.
fn is_message_item(item: &Item) -> bool {
    matches!(item.body, Body::ClaimCheck(_)) || item.trace.is_some()
}

/// A reader of one item's fields, each checked against what is left of the section.
struct Fields<'a> {
    section: &'a Bytes,
    at: usize,
    index: u32,
    count: u32,
    /// Any reference is read (see [`offloaded_message`]), not only `limits.references`.
    any_reference: bool,
}

impl Fields<'_> {
    fn take(&mut self, needed: u64) -> Result<Bytes, EnvelopeError> {
        let remaining = self.section.len() - self.at;
        if needed > remaining as u64 {
            return Err(EnvelopeError::ItemPastEnd { index: self.index, count: self.count, needed, remaining });
        }
        let taken = self.section.slice(self.at..self.at + needed as usize);
        self.at += needed as usize;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], EnvelopeError> {
        let bytes = self.take(N as u64)?;
        let mut array = [0; N];
        array.copy_from_slice(&bytes);
        Ok(array)
    }

    fn u8(&mut self) -> Result<u8, EnvelopeError> {
        Ok(self.array::<1>()?[0])
    }

    fn bad(&self, reason: String) -> EnvelopeError {
        EnvelopeError::BadItem { index: self.index, reason }
    }

    /// A length-prefixed UTF-8 field.
    fn text(&mut self, length: u64, what: &str) -> Result<String, EnvelopeError> {
        let bytes = self.take(length)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.bad(format!("its {what} is not UTF-8")))
    }

    fn item(&mut self, limits: &Limits) -> Result<Item, EnvelopeError> {
        let kind = self.u8()?;
        let attempts = u32::from_le_bytes(self.array()?);
        let origin = if kind & HAS_ORIGIN != 0 {
            let length = self.u8()?;
            if length == 0 {
                return Err(self.bad("its origin's message id is empty".into()));
            }
            let message_id = self.text(u64::from(length), "origin's message id")?;
            Some(Origin { message_id, index: u32::from_le_bytes(self.array()?) })
        } else {
            None
        };
        let trace = if kind & HAS_TRACE != 0 { self.trace()? } else { None };
        let body = match kind & !(HAS_ORIGIN | HAS_TRACE) {
            INLINE => {
                let length = u32::from_le_bytes(self.array()?);
                Body::Inline(self.take(u64::from(length))?)
            }
            CLAIM_CHECK => Body::ClaimCheck(self.claim_check(limits)?),
            other => return Err(self.bad(format!("unknown kind {other} (0 inline, 1 claim check)"))),
        };
        Ok(Item { attempts, body, origin, trace })
    }

    /// An item's trace context: a malformed one is counted and dropped (the item starts a
    /// new trace), not a broken envelope.
    fn trace(&mut self) -> Result<Option<TraceContext>, EnvelopeError> {
        let length = self.u8()?;
        let parent = self.take(u64::from(length))?;
        let length = u16::from_le_bytes(self.array()?);
        let state = self.take(u64::from(length))?;
        let parent = String::from_utf8_lossy(&parent);
        let state = String::from_utf8_lossy(&state);
        Ok(TraceContext::parse(&parent, Some(state.as_ref()).filter(|state| !state.is_empty())))
    }

    fn claim_check(&mut self, limits: &Limits) -> Result<ClaimCheck, EnvelopeError> {
        let size = u64::from_le_bytes(self.array()?);
        let sha256 = self.array()?;
        let location = match self.u8()? {
            AZURE_BLOB => {
                let length = self.u8()?;
                let account = self.text(u64::from(length), "account")?;
                let length = self.u8()?;
                let container = self.text(u64::from(length), "container")?;
                let length = u16::from_le_bytes(self.array()?);
                let blob = self.text(u64::from(length), "blob name")?;
                BlobRef::Azure { account, container, blob }
            }
            EMBEDDED_BODY => {
                let length = self.u8()?;
                let queue = self.text(u64::from(length), "queue")?;
                let key = u64::from_le_bytes(self.array()?);
                BlobRef::Embedded { queue, key }
            }
            S3_OBJECT => {
                let length = self.u8()?;
                let bucket = self.text(u64::from(length), "bucket")?;
                let length = u16::from_le_bytes(self.array()?);
                let key = self.text(u64::from(length), "object key")?;
                BlobRef::S3 { bucket, key }
            }
            other => return Err(self.bad(format!("claim check with unknown location kind {other} (1 azure blob, 2 embedded body, 3 s3 object)"))),
        };
        if let Some(defect) = location.defect() {
            return Err(self.bad(format!("claim check: {defect}")));
        }
        if !self.any_reference && !limits.references.allows(&location) {
            return Err(EnvelopeError::ReferenceNotAllowed { index: self.index, reference: location.to_string(), allowed: limits.references.describe() });
        }
        if size > limits.max_claim_check_bytes {
            return Err(self.bad(format!("claim check of {size} bytes, over the limit of {}", limits.max_claim_check_bytes)));
        }
        Ok(ClaimCheck { location, size, sha256 })
    }
}

#[cfg(test)]
pub(super) mod layout {
    //! The header's offsets, for tests that forge envelopes.
    pub const CODEC: usize = 9;
    pub const FLAGS: usize = 10;
    pub const COUNT: usize = 12;
    pub const DECODED: usize = 16;
    pub const HEADER: usize = super::HEADER_BYTES;
}
