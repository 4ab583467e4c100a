//! The changes the writer applies, as the store sends them, and what each gives back: the
//! words shared by the callers (`store`, `queue`), the `writer` and the code that applies
//! them (`changes`, `leasing`, `claims`).

use crate::queue::{Message, QueueError};

/// A change, carrying the caller's clock reading (the writer thread has no tokio clock).
pub(super) enum Op {
    Create { name: String },
    Put { queue: u32, now_ms: u64, body: Vec<u8>, delay_ms: u64 },
    Get { queue: u32, now_ms: u64, max: u32, visibility_ms: u64 },
    Delete { queue: u32, seq: u64, receipt: u64 },
    Update { queue: u32, seq: u64, receipt: u64, now_ms: u64, visibility_ms: u64 },
    PutClaim { queue: u32, now_ms: u64, body: bytes::Bytes },
    DeleteClaim { queue: u32, key: u64 },
    SweepClaims { queue: u32, before_ms: u64 },
}

pub(super) enum Reply {
    QueueId(u32),
    Id(String),
    Messages(Vec<Message>),
    Deleted,
    Receipt(String),
    ClaimKey(u64),
    Swept(u64),
}

/// What applying a change gives: the outer error is a storage failure (abort the
/// transaction); the inner one is this change's own (a stale receipt), which leaves the
/// others of its group to commit.
pub(super) type Applied = anyhow::Result<Result<Reply, QueueError>>;
