//! A message's stored form: a small fixed header (visibility, insertion time, receipt,
//! dequeue count, body checksum, body length) that every change of its lease rewrites, apart
//! from its body, which is written once (`bodies`).

/// A message's header, stored under its key in `headers`.
#[derive(Clone, Copy)]
pub(super) struct Header {
    pub(super) visible_at_ms: u64,
    pub(super) inserted_at_ms: u64,
    pub(super) receipt: u64,
    pub(super) dequeue_count: u32,
    pub(super) body_checksum: u32,
    pub(super) body_len: u32,
}

pub(super) const HEADER_BYTES: usize = 36;

pub(super) fn checksum(body: &[u8]) -> u32 {
    crc32fast::hash(body)
}

impl Header {
    pub(super) fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut bytes = [0; HEADER_BYTES];
        bytes[0..8].copy_from_slice(&self.visible_at_ms.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.inserted_at_ms.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.receipt.to_le_bytes());
        bytes[24..28].copy_from_slice(&self.dequeue_count.to_le_bytes());
        bytes[28..32].copy_from_slice(&self.body_checksum.to_le_bytes());
        bytes[32..36].copy_from_slice(&self.body_len.to_le_bytes());
        bytes
    }

    /// The header stored as `bytes`, or `None` if they are not one (a damaged file).
    pub(super) fn decode(bytes: &[u8]) -> Option<Header> {
        let bytes: &[u8; HEADER_BYTES] = bytes.try_into().ok()?;
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        Some(Header {
            visible_at_ms: u64_at(0),
            inserted_at_ms: u64_at(8),
            receipt: u64_at(16),
            dequeue_count: u32_at(24),
            body_checksum: u32_at(28),
            body_len: u32_at(32),
        })
    }

    /// A header for a message whose stored header cannot be read (a damaged file): visible now, with a checksum its body cannot match, so it stays marked corrupt at
    /// every lease.
    pub(super) fn replacing_damaged(body: &[u8], now_ms: u64) -> Header {
        Header {
            visible_at_ms: now_ms,
            inserted_at_ms: now_ms,
            receipt: 0,
            dequeue_count: 0,
            body_checksum: !checksum(body),
            body_len: u32::try_from(body.len()).unwrap_or(u32::MAX),
        }
    }
}

/// What is wrong with `body`, read back for `header`, if anything: the one check of a body,
/// made at the get that reads it.
pub(super) fn body_defect(header: &Header, body: &[u8]) -> Option<String> {
    if body.len() != header.body_len as usize {
        return Some(format!("corrupt: {} bytes of the body are stored, its header says {}", body.len(), header.body_len));
    }
    let computed = checksum(body);
    (computed != header.body_checksum).then(|| format!("corrupt: the body fails its checksum (stored {:08x}, computed {computed:08x})", header.body_checksum))
}
