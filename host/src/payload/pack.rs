//! Items into as few envelopes as fit a message limit, compressed size counted.

use std::ops::Range;

use anyhow::{Context as _, bail, ensure};

use super::codec::{Codec, Compressor};
use super::format::{Envelope, seal, write_record};
use super::item::Item;
use super::limits::{DEFAULT_MAX_DECODED_BYTES, DEFAULT_MAX_ITEMS, Limits};
use super::wire::{ENVELOPE_OVERHEAD_BYTES, MIN_ITEM_BYTES};

/// The smallest message limit a packer takes: an envelope of one empty item.
pub const MIN_ENVELOPE_BYTES: usize = ENVELOPE_OVERHEAD_BYTES + MIN_ITEM_BYTES;

/// Tries at one envelope that aim by the compression ratio seen; after them the search
/// halves what is left, so a codec that compresses unevenly still ends in a few tries.
const AIMED_TRIES: u32 = 4;

/// Packs items into envelopes for one queue: its codec, its backend's message limit, and
/// what its consumers accept.
#[derive(Debug, Clone)]
pub struct Packer {
    codec: Codec,
    max_envelope_bytes: usize,
    max_items: u32,
    max_decoded_bytes: usize,
}

/// What [`Packer::pack`] made of a list of items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    /// The envelopes, in the order of their first items.
    pub envelopes: Vec<PackedEnvelope>,
    /// The indices of the items that fit no envelope, even alone and compressed: the
    /// caller offloads each and packs its [`ClaimCheck`](super::ClaimCheck) instead.
    pub needs_claim_check: Vec<usize>,
}

/// One envelope, and which of the given items it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedEnvelope {
    /// The message body: at most the packer's limit.
    pub bytes: Vec<u8>,
    /// Indices into the items given, ascending: the envelope's items in its order.
    pub items: Vec<usize>,
}

impl Packer {
    /// A packer writing envelopes of at most `max_envelope_bytes` (the backend's message
    /// limit: [`AZURE_MAX_ENVELOPE_BYTES`](super::AZURE_MAX_ENVELOPE_BYTES) on Azure, the
    /// store's `max_message_bytes` on the embedded queue) that the default [`Limits`] accept.
    pub fn new(codec: Codec, max_envelope_bytes: usize) -> anyhow::Result<Packer> {
        ensure!(
            max_envelope_bytes >= MIN_ENVELOPE_BYTES,
            "max_envelope_bytes {max_envelope_bytes}: at least {MIN_ENVELOPE_BYTES}, an envelope of one empty item"
        );
        Ok(Packer { codec, max_envelope_bytes, max_items: DEFAULT_MAX_ITEMS, max_decoded_bytes: DEFAULT_MAX_DECODED_BYTES })
    }

    /// The same packer, writing only envelopes that consumers with `limits` accept.
    pub fn within(self, limits: &Limits) -> Packer {
        Packer { max_items: limits.max_items.max(1), max_decoded_bytes: limits.max_decoded_bytes.max(MIN_ITEM_BYTES), ..self }
    }

    /// The codec it compresses with.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// The most bytes an envelope takes.
    pub fn max_envelope_bytes(&self) -> usize {
        self.max_envelope_bytes
    }

    /// `items` in order, as few envelopes as fit; no item is split. An item that fits no
    /// envelope alone is left out and named in [`Packed::needs_claim_check`]. Fails only
    /// on an item no envelope can carry at all (a claim check with a malformed name) or a
    /// compressor that fails.
    pub fn pack(&self, items: &[Item]) -> anyhow::Result<Packed> {
        let mut records = Vec::new();
        let mut spans = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let start = records.len();
            write_record(item, &mut records).with_context(|| format!("item {index}"))?;
            spans.push(start..records.len());
        }
        let (candidates, mut needs_claim_check): (Vec<usize>, Vec<usize>) = (0..items.len()).partition(|&i| spans[i].len() <= self.max_decoded_bytes);
        let mut sealer = Sealer {
            codec: self.codec,
            compressor: Compressor::new(self.codec)?,
            records: &records,
            spans: &spans,
            section: Vec::new(),
            stored_per_record_byte: None,
        };
        let mut envelopes = Vec::new();
        let mut next = 0;
        while next < candidates.len() {
            let rest = &candidates[next..];
            let upper = self.most_items_decoded(rest, &spans);
            match self.largest_fit(&rest[..upper], &mut sealer)? {
                Some((count, bytes)) => {
                    envelopes.push(PackedEnvelope { bytes, items: rest[..count].to_vec() });
                    next += count;
                }
                None => {
                    needs_claim_check.push(rest[0]);
                    next += 1;
                }
            }
        }
        needs_claim_check.sort_unstable();
        Ok(Packed { envelopes, needs_claim_check })
    }

    /// The items of `envelope` (the message `message_id`) at the indices `failed`, each
    /// counted one more attempt and keeping where its producer put it (its origin, or
    /// `message_id` and its index), packed anew (items fail one by one; the others were
    /// handled). One envelope in practice: the items fitted together before (an origin adds
    /// at most 260 bytes to an item). An item that filled its message with no origin (a
    /// foreign producer's, or one packed to the limit) may not fit once it carries one: it
    /// goes back as it came, its origin then read as the new envelope's id and index (a
    /// wrong name is better than a lost item). Indices in the result are the envelope's.
    /// Refuses an index out of range or named twice, and an item that fits no message of
    /// this packer even as it came (another codec packed it): nothing is put back, so the
    /// envelope comes back whole rather than losing it.
    pub fn repack_failed(&self, envelope: &Envelope, failed: &[usize], message_id: &str) -> anyhow::Result<Packed> {
        let mut is_failed = vec![false; envelope.items.len()];
        for &index in failed {
            ensure!(index < envelope.items.len(), "failed item {index}: the envelope holds {} items", envelope.items.len());
            ensure!(!std::mem::replace(&mut is_failed[index], true), "failed item {index} is named twice");
        }
        let kept: Vec<usize> = (0..envelope.items.len()).filter(|&i| is_failed[i]).collect();
        let mut items: Vec<Item> = kept
            .iter()
            .map(|&i| {
                let item = &envelope.items[i];
                Item {
                    attempts: item.attempts.saturating_add(1),
                    body: item.body.clone(),
                    origin: Some(item.origin_or(message_id, i as u32)),
                    trace: item.trace.clone(),
                }
            })
            .collect();
        let mut packed = self.pack(&items)?;
        if !packed.needs_claim_check.is_empty() {
            for &k in &packed.needs_claim_check {
                items[k].origin = envelope.items[kept[k]].origin.clone();
            }
            packed = self.pack(&items)?;
        }
        if let Some(&k) = packed.needs_claim_check.first() {
            bail!("failed item {}: it fits no message of {} bytes alone, even as it came", kept[k], self.max_envelope_bytes);
        }
        for envelope in &mut packed.envelopes {
            envelope.items.iter_mut().for_each(|i| *i = kept[*i]);
        }
        packed.needs_claim_check.iter_mut().for_each(|i| *i = kept[*i]);
        Ok(packed)
    }

    /// How many of `candidates`, from the first, stay within the item count and the
    /// decoded-bytes limit: at least one (each alone is within it).
    fn most_items_decoded(&self, candidates: &[usize], spans: &[Range<usize>]) -> usize {
        let mut bytes = 0;
        let most = candidates.len().min(self.max_items as usize);
        candidates[..most]
            .iter()
            .position(|&i| {
                bytes += spans[i].len();
                bytes > self.max_decoded_bytes
            })
            .unwrap_or(most)
            .max(1)
    }

    /// The most of `candidates`, from the first, whose envelope fits, and that envelope;
    /// none if not even the first fits alone.
    fn largest_fit(&self, candidates: &[usize], sealer: &mut Sealer<'_>) -> anyhow::Result<Option<(usize, Vec<u8>)>> {
        let limit = self.max_envelope_bytes;
        // raw[k]: the record bytes of the first k candidates.
        let raw: Vec<usize> = std::iter::once(0)
            .chain(candidates.iter().scan(0, |sum, &i| {
                *sum += sealer.spans[i].len();
                Some(*sum)
            }))
            .collect();
        if self.codec == Codec::None {
            // Sizes add up: no search.
            let count = raw.partition_point(|&bytes| ENVELOPE_OVERHEAD_BYTES + bytes <= limit).saturating_sub(1);
            return Ok(if count == 0 { None } else { Some((count, sealer.seal(&candidates[..count])?)) });
        }
        // Search the count between `fits` (known to fit, with its envelope) and
        // `too_many` (known not to, or past the candidates), aiming by the size per
        // record byte measured so far: sizes grow about linearly with the records.
        let mut fits: (usize, usize, Option<Vec<u8>>) = (0, ENVELOPE_OVERHEAD_BYTES, None);
        let mut too_many: (usize, Option<usize>) = (candidates.len() + 1, None);
        let aim = |per_byte: f64, from_count: usize, from_size: usize| {
            let target = raw[from_count] as f64 + (limit as f64 - from_size as f64) / per_byte.max(1e-6);
            raw.partition_point(|&bytes| (bytes as f64) <= target).saturating_sub(1)
        };
        let mut guess = aim(sealer.stored_per_record_byte.unwrap_or(1.0), 0, ENVELOPE_OVERHEAD_BYTES);
        for tries in 1.. {
            guess = guess.clamp(fits.0 + 1, too_many.0 - 1);
            let envelope = sealer.seal(&candidates[..guess])?;
            let size = envelope.len();
            if size <= limit {
                fits = (guess, size, Some(envelope));
            } else {
                too_many = (guess, Some(size));
            }
            if too_many.0 - fits.0 <= 1 {
                break;
            }
            guess = match too_many.1 {
                _ if tries >= AIMED_TRIES => fits.0 + (too_many.0 - fits.0) / 2,
                // Both sides measured: the slope between them.
                Some(over) => aim((over - fits.1) as f64 / (raw[too_many.0] - raw[fits.0]).max(1) as f64, fits.0, fits.1),
                None => aim((size - ENVELOPE_OVERHEAD_BYTES) as f64 / raw[guess].max(1) as f64, guess, size),
            };
        }
        if fits.0 > 0 {
            sealer.stored_per_record_byte = Some((fits.1 - ENVELOPE_OVERHEAD_BYTES) as f64 / raw[fits.0].max(1) as f64);
        }
        Ok(match fits {
            (count, _, Some(envelope)) => Some((count, envelope)),
            _ => None,
        })
    }
}

/// What one `pack` call reuses across envelopes: the compressor, a section buffer, and
/// the compressed bytes per record byte of the last envelope (the first guess at the next).
struct Sealer<'a> {
    codec: Codec,
    compressor: Compressor,
    records: &'a [u8],
    spans: &'a [Range<usize>],
    section: Vec<u8>,
    stored_per_record_byte: Option<f64>,
}

impl Sealer<'_> {
    fn seal(&mut self, items: &[usize]) -> anyhow::Result<Vec<u8>> {
        self.section.clear();
        for &i in items {
            self.section.extend_from_slice(&self.records[self.spans[i].clone()]);
        }
        let mut envelope = Vec::with_capacity(ENVELOPE_OVERHEAD_BYTES + self.section.len() / 2);
        seal(self.codec, items.len(), &self.section, &mut self.compressor, &mut envelope)?;
        Ok(envelope)
    }
}
