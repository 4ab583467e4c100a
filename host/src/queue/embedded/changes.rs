//! The changes the writer applies: create a queue, put, lease (get), delete, update a
//! lease's visibility.

use redb::{ReadableTable, ReadableTableMetadata};

use super::record::{HEADER_BYTES, Header, Record, checksum};
use super::tables::{Tables, add_count};
use crate::queue::clock::system_time;
use crate::queue::{Message, QueueError};

/// A change, carrying the caller's clock reading (the writer thread has no tokio clock).
pub(super) enum Op {
    Create { name: String },
    Put { queue: u32, now_ms: u64, body: Vec<u8>, delay_ms: u64 },
    Get { queue: u32, now_ms: u64, max: u32, visibility_ms: u64 },
    Delete { queue: u32, seq: u64, receipt: u64 },
    Update { queue: u32, seq: u64, receipt: u64, now_ms: u64, visibility_ms: u64 },
}

pub(super) enum Reply {
    QueueId(u32),
    Id(String),
    Messages(Vec<Message>),
    Deleted,
    Receipt(String),
}

/// Applies one op. The outer error is a storage failure (abort the transaction); the inner
/// one is this op's own (a stale receipt), which leaves the others to commit.
pub(super) fn apply(t: &mut Tables<'_>, op: Op, next_seq: &mut u64) -> anyhow::Result<Result<Reply, QueueError>> {
    match op {
        Op::Create { name } => {
            if let Some(id) = t.queues.get(name.as_str())? {
                return Ok(Ok(Reply::QueueId(id.value())));
            }
            let id = t.queues.len()? as u32 + 1;
            t.queues.insert(name.as_str(), id)?;
            Ok(Ok(Reply::QueueId(id)))
        }
        Op::Put { queue, now_ms, body, delay_ms } => {
            let seq = *next_seq;
            *next_seq += 1;
            let visible_at_ms = now_ms.saturating_add(delay_ms);
            let header = Header { visible_at_ms, inserted_at_ms: now_ms, receipt: 0, dequeue_count: 0, body_checksum: checksum(&body) };
            t.messages.insert((queue, seq), header.encode(&body).as_slice())?;
            t.visible.insert((queue, visible_at_ms, seq), ())?;
            add_count(&mut t.counts, queue, 1)?;
            Ok(Ok(Reply::Id(seq.to_string())))
        }
        Op::Get { queue, now_ms, max, visibility_ms } => {
            let due: Vec<(u64, u64)> = t
                .visible
                .range((queue, 0, 0)..=(queue, now_ms, u64::MAX))?
                .take(max as usize)
                .map(|entry| entry.map(|(key, _)| (key.value().1, key.value().2)))
                .collect::<Result<_, _>>()?;
            let mut leased = Vec::with_capacity(due.len());
            for (visible_at_ms, seq) in due {
                t.visible.remove((queue, visible_at_ms, seq))?;
                let Some(stored) = t.messages.get((queue, seq))?.map(|v| v.value().to_vec()) else {
                    // An index entry without its message (a damaged file): drop the entry.
                    tracing::warn!(queue, seq, "dropping an index entry whose message is missing");
                    continue;
                };
                let Record { header: old, body, defect } = Record::read(&stored, now_ms);
                let header = Header {
                    visible_at_ms: now_ms.saturating_add(visibility_ms),
                    receipt: new_receipt(old.receipt),
                    dequeue_count: old.dequeue_count.saturating_add(1),
                    ..old
                };
                t.messages.insert((queue, seq), header.encode(&body).as_slice())?;
                t.visible.insert((queue, header.visible_at_ms, seq), ())?;
                leased.push(Message {
                    id: seq.to_string().into(),
                    pop_receipt: format!("{:016x}", header.receipt).into(),
                    dequeue_count: header.dequeue_count,
                    inserted_at: system_time(header.inserted_at_ms),
                    next_visible_at: system_time(header.visible_at_ms),
                    body,
                    defect,
                });
            }
            Ok(Ok(Reply::Messages(leased)))
        }
        Op::Delete { queue, seq, receipt } => {
            let header = match leased_header(t, queue, seq, receipt)? {
                Ok(header) => header,
                Err(stale) => return Ok(Err(stale)),
            };
            t.messages.remove((queue, seq))?;
            t.visible.remove((queue, header.visible_at_ms, seq))?;
            add_count(&mut t.counts, queue, -1)?;
            Ok(Ok(Reply::Deleted))
        }
        Op::Update { queue, seq, receipt, now_ms, visibility_ms } => {
            let header = match leased_header(t, queue, seq, receipt)? {
                Ok(header) => header,
                Err(stale) => return Ok(Err(stale)),
            };
            let stored = t.messages.get((queue, seq))?.map(|v| v.value().to_vec()).unwrap_or_default();
            t.visible.remove((queue, header.visible_at_ms, seq))?;
            let updated = Header { visible_at_ms: now_ms.saturating_add(visibility_ms), receipt: new_receipt(receipt), ..header };
            t.messages.insert((queue, seq), updated.encode(&stored[HEADER_BYTES..]).as_slice())?;
            t.visible.insert((queue, updated.visible_at_ms, seq), ())?;
            Ok(Ok(Reply::Receipt(format!("{:016x}", updated.receipt))))
        }
    }
}

/// The header of a message whose current receipt is `receipt`, or (inner) a stale-receipt error.
fn leased_header(t: &Tables<'_>, queue: u32, seq: u64, receipt: u64) -> anyhow::Result<Result<Header, QueueError>> {
    let stale = || QueueError::StaleReceipt { id: seq.to_string().into() };
    let Some(stored) = t.messages.get((queue, seq))? else { return Ok(Err(stale())) };
    match Header::decode(stored.value()) {
        Some(header) if header.receipt == receipt && receipt != 0 => Ok(Ok(header)),
        _ => Ok(Err(stale())),
    }
}

fn new_receipt(previous: u64) -> u64 {
    loop {
        let receipt = fastrand::u64(1..);
        if receipt != previous {
            return receipt;
        }
    }
}
