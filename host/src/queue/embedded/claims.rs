//! Claim-check bodies: large bodies offloaded from envelopes (`ebb::payload::claims`), kept
//! in the store's own tables so they are as durable as the messages that point at them.
//!
//! A body is one record in `claims (queue, key)`: when it was put and its length (16 bytes),
//! and its bytes in `claim_parts (queue, key, part)`, cut into parts that each fill one
//! 4 KiB redb page (as message bodies are, `bodies`). Keys are 64 random bits: a sender
//! cannot guess another message's body, and a stale reference finds nothing rather than
//! another body (but for a 2^-64 chance).
//!
//! The put commits durably (like every change) before it answers, so the producer puts the
//! message that points at the body only once the body is on disk.

use redb::ReadableTable;

use super::bodies::PAGE_PART_BYTES;
use super::ops::{Applied, Reply};
use super::tables::Tables;

/// A claim record: put time (ms since the Unix epoch) and length, little-endian.
const RECORD_BYTES: usize = 16;

pub(super) struct ClaimRecord {
    pub(super) put_at_ms: u64,
    pub(super) len: u64,
}

impl ClaimRecord {
    fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut bytes = [0; RECORD_BYTES];
        bytes[..8].copy_from_slice(&self.put_at_ms.to_le_bytes());
        bytes[8..].copy_from_slice(&self.len.to_le_bytes());
        bytes
    }

    pub(super) fn decode(bytes: &[u8]) -> Option<ClaimRecord> {
        let bytes: &[u8; RECORD_BYTES] = bytes.try_into().ok()?;
        Some(ClaimRecord { put_at_ms: u64::from_le_bytes(bytes[..8].try_into().ok()?), len: u64::from_le_bytes(bytes[8..].try_into().ok()?) })
    }
}

pub(super) fn put(t: &mut Tables<'_>, queue: u32, now_ms: u64, body: &[u8]) -> Applied {
    // Random, so a sender cannot name another message's body in a forged reference (keys
    // from the message sequence were the message's id minus one); 64 bits make a key given
    // twice, even after its body is gone, as likely as not at all.
    let key = loop {
        let key = fastrand::u64(..);
        if t.claims.get((queue, key))?.is_none() {
            break key;
        }
    };
    for (index, part) in body.chunks(PAGE_PART_BYTES).enumerate() {
        // The queue's put_claim refuses bodies whose part count would not fit a u32.
        t.claim_parts.insert((queue, key, index as u32), part)?;
    }
    t.claims.insert((queue, key), ClaimRecord { put_at_ms: now_ms, len: body.len() as u64 }.encode().as_slice())?;
    Ok(Ok(Reply::ClaimKey(key)))
}

pub(super) fn delete(t: &mut Tables<'_>, queue: u32, key: u64) -> Applied {
    t.claims.remove((queue, key))?;
    t.claim_parts.retain_in((queue, key, 0)..=(queue, key, u32::MAX), |_, _| false)?;
    Ok(Ok(Reply::Deleted))
}

/// Removes every body of `queue` put before `before_ms`, and any part whose record is gone
/// (none should be: a put and a delete each change both in one transaction).
pub(super) fn sweep(t: &mut Tables<'_>, queue: u32, before_ms: u64) -> Applied {
    let mut old = Vec::new();
    for entry in t.claims.range((queue, 0)..=(queue, u64::MAX))? {
        let (key, record) = entry?;
        // A record that does not decode is damaged: it goes too, it can serve no reader.
        if ClaimRecord::decode(record.value()).is_none_or(|r| r.put_at_ms < before_ms) {
            old.push(key.value().1);
        }
    }
    for key in &old {
        t.claims.remove((queue, *key))?;
        t.claim_parts.retain_in((queue, *key, 0)..=(queue, *key, u32::MAX), |_, _| false)?;
    }
    Ok(Ok(Reply::Swept(old.len() as u64)))
}
