//! The changes the writer applies, one function each: create a queue, put, delete. Leasing
//! (get, visibility updates, receipts) is in `leasing`.

use redb::{ReadableTable, ReadableTableMetadata};

use super::bodies;
use super::claims;
use super::leasing::{lease, update_visibility};
use super::ops::{Applied, Op, Reply};
use super::record::{Header, checksum};
use super::tables::Tables;
use crate::queue::QueueError;

/// Applies one change.
pub(super) fn apply(t: &mut Tables<'_>, op: Op, next_seq: &mut u64) -> Applied {
    match op {
        Op::Create { name } => create(t, &name),
        Op::Put { queue, now_ms, body, delay_ms } => put(t, queue, now_ms, body, delay_ms, next_seq),
        Op::Get { queue, now_ms, max, visibility_ms } => lease(t, queue, now_ms, max, visibility_ms),
        Op::Delete { queue, seq, receipt } => delete(t, queue, seq, receipt),
        Op::Update { queue, seq, receipt, now_ms, visibility_ms } => update_visibility(t, queue, seq, receipt, now_ms, visibility_ms),
        Op::PutClaim { queue, now_ms, body } => claims::put(t, queue, now_ms, &body),
        Op::DeleteClaim { queue, key } => claims::delete(t, queue, key),
        Op::SweepClaims { queue, before_ms } => claims::sweep(t, queue, before_ms),
    }
}

/// The queue's id, given at its creation (1, 2, …).
fn create(t: &mut Tables<'_>, name: &str) -> Applied {
    if let Some(id) = t.queues.get(name)? {
        return Ok(Ok(Reply::QueueId(id.value())));
    }
    let id = t.queues.len()? as u32 + 1;
    t.queues.insert(name, id)?;
    Ok(Ok(Reply::QueueId(id)))
}

fn put(t: &mut Tables<'_>, queue: u32, now_ms: u64, body: Vec<u8>, delay_ms: u64, next_seq: &mut u64) -> Applied {
    // The queue's put refuses a body over MAX_BODY_BYTES, so its length fits.
    let body_len = body.len() as u32;
    let seq = *next_seq;
    *next_seq += 1;
    let visible_at_ms = now_ms.saturating_add(delay_ms);
    let header = Header { visible_at_ms, inserted_at_ms: now_ms, receipt: 0, dequeue_count: 0, body_checksum: checksum(&body), body_len };
    t.headers.insert((queue, seq), header.encode().as_slice())?;
    bodies::write(t, queue, seq, &body)?;
    t.visible.insert((queue, visible_at_ms, seq), ())?;
    t.add_count(queue, 1);
    Ok(Ok(Reply::Id(seq.to_string())))
}

fn delete(t: &mut Tables<'_>, queue: u32, seq: u64, receipt: u64) -> Applied {
    // Removed first and put back on a stale receipt (rare): a look-up then a remove cost two
    // walks of the tree for every delete.
    let Some(removed) = t.headers.remove((queue, seq))? else {
        return Ok(Err(QueueError::StaleReceipt { id: seq.to_string().into() }));
    };
    let current = Header::decode(removed.value()).filter(|header| header.receipt == receipt && receipt != 0);
    let Some(header) = current else {
        let stored = removed.value().to_vec();
        drop(removed);
        t.headers.insert((queue, seq), stored.as_slice())?;
        return Ok(Err(QueueError::StaleReceipt { id: seq.to_string().into() }));
    };
    drop(removed);
    bodies::remove(t, queue, seq, header.body_len as usize)?;
    t.visible.remove((queue, header.visible_at_ms, seq))?;
    t.add_count(queue, -1);
    Ok(Ok(Reply::Deleted))
}
