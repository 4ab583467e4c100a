//! Bodies: written once at the put, read at each get, removed at the delete; never
//! rewritten when a lease changes (that writes only the message's header).
//!
//! A body shorter than [`PAGE_PART_BYTES`] is one value of `bodies`. A longer one is cut into
//! parts of exactly [`PAGE_PART_BYTES`] in `body_pages`, and its rest (possibly empty) goes
//! to `bodies`. Why: redb gives a value too big for one 4 KiB page a run of pages rounded up
//! to a power of two, so a 16 KiB body stored whole would take, and write, 32 KiB. A part
//! fills one page exactly, and the short rests of many bodies share pages.

use redb::ReadableTable;

use super::tables::Tables;

/// The largest value that fits alone in one of redb's 4 KiB leaf pages under a
/// `(u32, u64, u32)` key: 4 bytes of page header, 4 of value length, 16 of key. Were redb's
/// page layout to change, each part would take two pages; the bytes-written test in
/// `tests/all/embedded_queue.rs` would fail.
pub(super) const PAGE_PART_BYTES: usize = 4096 - 4 - 4 - 16;

/// Buffers larger than this are not reserved on a header's word alone (a damaged header
/// must not make the writer reserve gigabytes); such a body grows as it is read.
const MOST_RESERVED_BYTES: usize = 16 << 20;

pub(super) fn write(t: &mut Tables<'_>, queue: u32, seq: u64, body: &[u8]) -> anyhow::Result<()> {
    let parts = body.chunks_exact(PAGE_PART_BYTES);
    let rest = parts.remainder();
    for (index, part) in parts.enumerate() {
        t.body_pages.insert((queue, seq, index as u32), part)?;
    }
    t.bodies.insert((queue, seq), rest)?;
    Ok(())
}

/// The body of message `seq`, copied once out of redb into a buffer that becomes the
/// message's `Bytes`. `expected_len` is its header's word (`None`: the header is damaged),
/// which sizes the buffer and says whether there are parts to read. Whatever is stored is
/// returned; whether it is the body that was put is the caller's check.
pub(super) fn read(t: &Tables<'_>, queue: u32, seq: u64, expected_len: Option<usize>) -> anyhow::Result<Vec<u8>> {
    let mut body = Vec::with_capacity(expected_len.unwrap_or(0).min(MOST_RESERVED_BYTES));
    // Most bodies are short: spare them a look into `body_pages`.
    if expected_len.is_none_or(|len| len >= PAGE_PART_BYTES) {
        for part in t.body_pages.range((queue, seq, 0)..=(queue, seq, u32::MAX))? {
            body.extend_from_slice(part?.1.value());
        }
    }
    if let Some(rest) = t.bodies.get((queue, seq))? {
        body.extend_from_slice(rest.value());
    }
    Ok(body)
}

/// Removes the body of message `seq`, `len` bytes long by its header.
pub(super) fn remove(t: &mut Tables<'_>, queue: u32, seq: u64, len: usize) -> anyhow::Result<()> {
    t.bodies.remove((queue, seq))?;
    // Parts by range, not by the count the length implies: a wrong length leaves none
    // behind. A short body (most are) is spared the look into `body_pages`; only a damaged
    // length that claims a short body could leave parts unreclaimed.
    if len >= PAGE_PART_BYTES {
        t.body_pages.retain_in((queue, seq, 0)..=(queue, seq, u32::MAX), |_, _| false)?;
    }
    Ok(())
}
