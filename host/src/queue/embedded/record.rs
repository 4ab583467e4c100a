//! A message's stored form: a fixed header (visibility, insertion time, receipt, dequeue
//! count, body checksum) before the body.

/// The message header stored before the body.
pub(super) struct Header {
    pub(super) visible_at_ms: u64,
    pub(super) inserted_at_ms: u64,
    pub(super) receipt: u64,
    pub(super) dequeue_count: u32,
    pub(super) body_checksum: u32,
}

pub(super) const HEADER_BYTES: usize = 32;

pub(super) fn checksum(body: &[u8]) -> u32 {
    crc32fast::hash(body)
}

impl Header {
    pub(super) fn encode(&self, body: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
        bytes.extend_from_slice(&self.visible_at_ms.to_le_bytes());
        bytes.extend_from_slice(&self.inserted_at_ms.to_le_bytes());
        bytes.extend_from_slice(&self.receipt.to_le_bytes());
        bytes.extend_from_slice(&self.dequeue_count.to_le_bytes());
        bytes.extend_from_slice(&self.body_checksum.to_le_bytes());
        bytes.extend_from_slice(body);
        bytes
    }

    /// The header of a stored record, or `None` if it is too short to hold one.
    pub(super) fn decode(bytes: &[u8]) -> Option<Header> {
        let header = bytes.get(..HEADER_BYTES)?;
        let u64_at = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().unwrap());
        Some(Header { visible_at_ms: u64_at(0), inserted_at_ms: u64_at(8), receipt: u64_at(16), dequeue_count: u32_at(24), body_checksum: u32_at(28) })
    }
}

/// A stored record as a get sees it: its header, its body, and what is wrong with it.
pub(super) struct Record {
    pub(super) header: Header,
    pub(super) body: Vec<u8>,
    pub(super) defect: Option<String>,
}

impl Record {
    pub(super) fn read(stored: &[u8], now_ms: u64) -> Record {
        match Header::decode(stored) {
            Some(header) => {
                let body = stored[HEADER_BYTES..].to_vec();
                let computed = checksum(&body);
                let defect = (computed != header.body_checksum)
                    .then(|| format!("corrupt: the body fails its checksum (stored {:08x}, computed {computed:08x})", header.body_checksum));
                Record { header, body, defect }
            }
            None => Record {
                // Keep the bytes as the body with a checksum that cannot match, so the record
                // stays marked corrupt if it is leased again.
                header: Header { visible_at_ms: now_ms, inserted_at_ms: now_ms, receipt: 0, dequeue_count: 0, body_checksum: !checksum(stored) },
                body: stored.to_vec(),
                defect: Some(format!("corrupt: the record is {} bytes, shorter than its {HEADER_BYTES}-byte header", stored.len())),
            },
        }
    }
}
