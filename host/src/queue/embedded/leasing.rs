//! Leases: a get takes the oldest visible messages and hides them for the visibility
//! timeout under a new receipt; only the latest receipt can delete a message or change its
//! visibility. A change of a lease rewrites the message's header and its index entry, never
//! its body.

use bytes::Bytes;
use redb::ReadableTable;

use super::bodies;
use super::ops::{Applied, Reply};
use super::record::{HEADER_BYTES, Header, body_defect};
use super::tables::Tables;
use crate::queue::clock::system_time;
use crate::queue::{Message, QueueError};

/// Leases up to `max` messages visible at `now_ms`, oldest visibility first.
pub(super) fn lease(t: &mut Tables<'_>, queue: u32, now_ms: u64, max: u32, visibility_ms: u64) -> Applied {
    let due: Vec<(u64, u64)> = t
        .visible
        .range((queue, 0, 0)..=(queue, now_ms, u64::MAX))?
        .take(max as usize)
        .map(|entry| entry.map(|(key, _)| (key.value().1, key.value().2)))
        .collect::<Result<_, _>>()?;
    let mut leased = Vec::with_capacity(due.len());
    for (visible_at_ms, seq) in due {
        t.visible.remove((queue, visible_at_ms, seq))?;
        let Some(stored) = t.headers.get((queue, seq))?.map(|v| Header::decode(v.value()).ok_or(v.value().len())) else {
            // An index entry without its message (a damaged file): drop the entry.
            tracing::warn!(queue, seq, "dropping an index entry whose message is missing");
            continue;
        };
        let body = bodies::read(t, queue, seq, stored.ok().map(|header| header.body_len as usize))?;
        let (old, defect) = match stored {
            Ok(header) => (header, body_defect(&header, &body)),
            Err(stored_len) => {
                (Header::replacing_damaged(&body, now_ms), Some(format!("corrupt: its header is {stored_len} bytes, not a header's {HEADER_BYTES}")))
            }
        };
        let header = Header {
            visible_at_ms: now_ms.saturating_add(visibility_ms),
            receipt: new_receipt(old.receipt),
            dequeue_count: old.dequeue_count.saturating_add(1),
            ..old
        };
        t.headers.insert((queue, seq), header.encode().as_slice())?;
        t.visible.insert((queue, header.visible_at_ms, seq), ())?;
        leased.push(Message {
            id: seq.to_string().into(),
            pop_receipt: format!("{:016x}", header.receipt).into(),
            dequeue_count: header.dequeue_count,
            inserted_at: system_time(header.inserted_at_ms),
            next_visible_at: system_time(header.visible_at_ms),
            body: Bytes::from(body),
            defect,
            fifo: None,
            trace: None,
        });
    }
    Ok(Ok(Reply::Messages(leased)))
}

/// Makes a leased message visible `visibility_ms` after `now_ms`, under a new receipt.
pub(super) fn update_visibility(t: &mut Tables<'_>, queue: u32, seq: u64, receipt: u64, now_ms: u64, visibility_ms: u64) -> Applied {
    let header = match leased_header(t, queue, seq, receipt)? {
        Ok(header) => header,
        Err(stale) => return Ok(Err(stale)),
    };
    t.visible.remove((queue, header.visible_at_ms, seq))?;
    let updated = Header { visible_at_ms: now_ms.saturating_add(visibility_ms), receipt: new_receipt(receipt), ..header };
    t.headers.insert((queue, seq), updated.encode().as_slice())?;
    t.visible.insert((queue, updated.visible_at_ms, seq), ())?;
    Ok(Ok(Reply::Receipt(format!("{:016x}", updated.receipt))))
}

/// The header of a message whose current receipt is `receipt`, or (inner) a stale-receipt error.
fn leased_header(t: &Tables<'_>, queue: u32, seq: u64, receipt: u64) -> anyhow::Result<Result<Header, QueueError>> {
    let stale = || QueueError::StaleReceipt { id: seq.to_string().into() };
    let Some(stored) = t.headers.get((queue, seq))? else { return Ok(Err(stale())) };
    match Header::decode(stored.value()) {
        Some(header) if header.receipt == receipt && receipt != 0 => Ok(Ok(header)),
        _ => Ok(Err(stale())),
    }
}

/// A receipt other than `previous` (and never 0, which no lease has).
fn new_receipt(previous: u64) -> u64 {
    loop {
        let receipt = fastrand::u64(1..);
        if receipt != previous {
            return receipt;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use redb::ReadableTableMetadata;

    use super::super::bodies::PAGE_PART_BYTES;
    use super::super::tables::{BODIES, BODY_PAGES, HEADERS};
    use super::super::{EmbeddedOptions, EmbeddedStore};
    use crate::queue::QueueClient;

    /// A header that is not one (a damaged file) says neither the body's length nor its
    /// checksum: the message is still delivered, with the bytes stored, marked corrupt at
    /// every lease (the listener poisons it), and its delete removes every part of it.
    #[tokio::test]
    async fn a_message_whose_header_is_damaged_is_delivered_marked_corrupt_at_every_lease() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default())?;
        let queue = store.queue("work");
        queue.create_if_missing().await?;
        let body: Vec<u8> = (0..2 * PAGE_PART_BYTES + 10).map(|at| at as u8).collect();
        let id = queue.put(&body, Duration::ZERO).await?;
        let db = store.database()?;
        let txn = db.begin_write()?;
        txn.open_table(HEADERS)?.insert((1, id.parse::<u64>()?), &b"damaged"[..])?;
        txn.commit()?;

        let first = queue.get(32, Duration::ZERO).await?;
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].body, body, "the bytes stored, every part");
        let defect = first[0].defect.as_deref().unwrap_or_default();
        assert!(defect.starts_with("corrupt: its header is 7 bytes"), "{defect:?}");
        let again = queue.get(32, Duration::from_secs(30)).await?;
        assert_eq!(again.len(), 1, "a lease of zero makes it visible again at once");
        let defect = again[0].defect.as_deref().unwrap_or_default();
        assert!(defect.starts_with("corrupt: the body fails its checksum"), "still marked: {defect:?}");

        queue.delete(&again[0].id, &again[0].pop_receipt).await?;
        let txn = redb::ReadableDatabase::begin_read(&*db)?;
        let left = (txn.open_table(HEADERS)?.len()?, txn.open_table(BODIES)?.len()?, txn.open_table(BODY_PAGES)?.len()?);
        assert_eq!(left, (0, 0, 0), "headers, bodies and body pages left");
        Ok(())
    }
}
