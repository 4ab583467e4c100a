//! Claim checks: bodies too large for any envelope kept outside the queue, the message
//! carrying a [`ClaimCheck`] (where, how long, SHA-256) instead (issue 20, item 3).
//!
//! Three stores, one per backend, behind [`ClaimStore`]:
//! - [`AzureClaims`]: block blobs in a container of the queue's own
//!   (`container_for_queue`: `<queue>-bodies`, created when missing), on the queue's
//!   account and credential, through the official `azure_storage_blob` SDK (its partitioned
//!   upload, and its download into one buffer of the claimed size).
//! - [`S3Claims`]: objects in the S3 bucket an SQS queue names (`claim_bucket`), through
//!   the official `aws-sdk-s3` on the queue's `[aws]` account; a whole message offloaded
//!   travels as the SQS Extended Client's pointer (`host/src/payload/extended.rs`).
//! - [`EmbeddedClaims`]: the embedded queue's own redb store, in a table of its own
//!   (`host/src/queue/embedded/claims.rs`), keyed by a u64 that is never given twice.
//!
//! # The seam (for the producers and the listener)
//!
//! Build one store per storage queue ([`ClaimStore`] is object-safe: hold an
//! `Arc<dyn ClaimStore>`), and give the envelope decoder its references
//! (`Limits { references: store.allowed(), max_claim_check_bytes: settings.max_bytes, .. }`).
//!
//! - **Producer**: `let check = store.put(body).await?` *before* the message that carries
//!   it is put (both stores commit the body durably before answering); then pack
//!   `Item::claim_check(check)`. A crash between the two leaves an orphan body: the sweeper
//!   removes it after `claim_check_retention`.
//! - **Consumer**: `store.get(&check, limit).await` gives the body, its size and SHA-256
//!   checked. On error, branch on [`ClaimError::is_retryable`]: a transient storage error is
//!   retried like a failed handler call (the message comes back); anything else
//!   ([`ClaimError::Missing`], [`ClaimError::Foreign`], [`ClaimError::Corrupt`],
//!   [`ClaimError::Refused`]) is a poison reason (the error's text), never a retry loop.
//! - **After the handler succeeded**: delete the *message* first, then
//!   `store.delete(&check)` (deleting a body that is already gone succeeds). The other order
//!   would lose the body of a message whose delete failed and that comes back. A crash in
//!   between, or a failed body delete, leaves an orphan for the sweeper. An item put back
//!   in a new envelope (a failed item) keeps its claim check and its body.
//! - **Sweeper**: `sweeper_task` once per storage queue that offloads bodies.
//! - **Metrics**: the service's stores are `Recorded`: every call (upload, fetch, delete,
//!   sweep) is counted in the queue's [`ClaimRecord`], with the requests the Azure store
//!   retried (each block, commit, range or delete on its own: [`BLOB_RETRY`]; each S3
//!   request) and the calls that failed for good; the S3 store's requests are metered as
//!   SQS's are, by price class, and priced (`s3_meter`).
//!
//! Every reference is checked before any request is made (`check_reference`): one into
//! another account, container or embedded queue is [`ClaimError::Foreign`]; a malformed
//! blob name (`..`, control characters, a query) or a size over the limit is
//! [`ClaimError::Refused`].

mod azure;
mod embedded;
mod record;
mod s3;
mod s3_meter;
mod s3_probe;
mod sweeper;

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::{AllowedReferences, BlobRef, ClaimCheck, DEFAULT_MAX_CLAIM_CHECK_BYTES};

pub(crate) use azure::container_for_queue;
pub use azure::{AzureClaims, BLOB_RETRY};
pub use embedded::EmbeddedClaims;
pub(crate) use record::Recorded;
pub use record::{ClaimCall, ClaimRecord, ClaimRecords};
pub use s3::S3Claims;
pub(crate) use s3_meter::S3Requests;
pub use s3_meter::{S3Operation, S3RequestCounts};
#[cfg(test)]
pub(crate) use sweeper::spawn_sweeper;
pub(crate) use sweeper::sweeper_task;

/// `claim_check_retention` by default: 14 days, twice Azure's default message time-to-live
/// and its longest visibility timeout (7 days each, so the longest `max_retry_delay`). See
/// [`ClaimSettings::retention`] for why it must outlast messages.
pub(crate) const DEFAULT_RETENTION: Duration = Duration::from_secs(14 * 24 * 3600);
/// Shortest `claim_check_retention`: a body younger than an hour may belong to a message
/// being put right now.
pub(crate) const MIN_RETENTION: Duration = Duration::from_secs(3600);
/// Longest `claim_check_retention`: a year (365.25 days, what humantime calls `1year`).
pub(crate) const MAX_RETENTION: Duration = Duration::from_secs(31_557_600);
/// `claim_sweep_interval` by default: one list call an hour (about 720 billed
/// transactions a month per queue on Azure).
pub(crate) const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(3600);
/// Shortest `claim_sweep_interval`.
pub(crate) const MIN_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// Longest `claim_sweep_interval`.
pub(crate) const MAX_SWEEP_INTERVAL: Duration = Duration::from_secs(24 * 3600);
/// Largest `max_claim_check_bytes`: 4 GiB. A body is read into memory whole (a handler
/// gets it as one request body).
pub(crate) const MAX_CLAIM_CHECK_BYTES_LIMIT: u64 = 4 << 30;

/// A queue's claim-check settings (`[queues.<name>]` keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSettings {
    /// `max_claim_check_bytes`: the largest body offloaded or fetched, in bytes.
    pub max_bytes: u64,
    /// `claim_check_retention`: how old a body must be before the sweeper removes it.
    ///
    /// It must exceed the longest time a message can wait in the queue (and in its poison
    /// queue, to be requeued), because the sweeper cannot tell an orphan from a body whose
    /// message still waits: it removes any body older than this. A message that outlives its
    /// body is poisoned with "missing" when it is finally read. ebb puts messages with no
    /// expiry, so this is about backlogs: set it above the oldest backlog you keep.
    pub retention: Duration,
    /// `claim_sweep_interval`: how often the sweeper looks (one list call on Azure).
    pub sweep_interval: Duration,
}

impl Default for ClaimSettings {
    fn default() -> Self {
        ClaimSettings { max_bytes: DEFAULT_MAX_CLAIM_CHECK_BYTES, retention: DEFAULT_RETENTION, sweep_interval: DEFAULT_SWEEP_INTERVAL }
    }
}

/// Why a claim-check call failed. Only [`ClaimError::Transient`] is worth retrying; the
/// others are poison reasons (their text says why).
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The body is not there: never put, deleted, or swept (its message outlived
    /// `claim_check_retention`).
    #[error("claim check {location} is missing: the body was deleted or swept, or never put")]
    Missing {
        /// Where it should have been.
        location: BlobRef,
    },
    /// The reference points outside this queue's store.
    #[error("claim check {location} is not allowed here ({allowed})")]
    Foreign {
        /// Where it points.
        location: BlobRef,
        /// What this store takes, in words.
        allowed: String,
    },
    /// The stored body is not the one the reference names.
    #[error("claim check {location} is corrupt: {reason}")]
    Corrupt {
        /// Where it is.
        location: BlobRef,
        /// What does not match.
        reason: String,
    },
    /// The reference or body is refused before any request: a malformed name, a size
    /// over the limit.
    #[error("claim check refused: {0}")]
    Refused(String),
    /// The storage failed for now (timeouts, throttling, 5xx, the store reopening): retry.
    #[error("claim check storage: {0:#}")]
    Transient(anyhow::Error),
    /// The storage refused for good (authorization, a bad request): needs a human.
    #[error("claim check storage: {0:#}")]
    Fatal(anyhow::Error),
}

impl ClaimError {
    /// Whether retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ClaimError::Transient(_))
    }
}

/// What one sweep found and removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Bodies removed (older than the retention).
    pub removed: u64,
    /// Billed storage transactions the sweep made (on Azure: the list call and each
    /// delete; 0 on the embedded store).
    pub transactions: u64,
}

/// A store for claim-check bodies of one storage queue. Object-safe: hold an
/// `Arc<dyn ClaimStore>`.
#[async_trait]
pub trait ClaimStore: Send + Sync + 'static {
    /// Where its bodies go, in words (for logs and errors).
    fn describe(&self) -> String;

    /// The references a consumer of this queue may follow (for
    /// [`Limits::references`](super::Limits::references)).
    fn allowed(&self) -> AllowedReferences;

    /// The largest body it keeps or fetches, in bytes.
    fn max_bytes(&self) -> u64;

    /// Keeps `body` durably and gives its claim check (size and SHA-256 computed here).
    async fn put(&self, body: Bytes) -> Result<ClaimCheck, ClaimError>;

    /// The body `check` names, at most `max_bytes` (and [`ClaimStore::max_bytes`]) long,
    /// its size and SHA-256 verified. The reference is checked before any request.
    async fn get(&self, check: &ClaimCheck, max_bytes: u64) -> Result<Bytes, ClaimError>;

    /// Deletes the body `check` names; a body already gone is no error.
    async fn delete(&self, check: &ClaimCheck) -> Result<(), ClaimError>;

    /// Removes the bodies put more than `older_than` ago (orphans of a crash between the
    /// body's put and its message's, or of a missed delete). Cheap: on Azure one list call
    /// (of at most 5,000 blobs, resuming where the last sweep stopped) and a delete per
    /// body removed.
    async fn sweep(&self, older_than: Duration) -> Result<SweepReport, ClaimError>;
}

/// Why an empty body is not offloaded: it fits any envelope.
pub(crate) const EMPTY_BODY: &str = "an empty body: it fits any envelope, nothing to offload";

/// The SHA-256 of a body a store may take (neither empty nor over `max_bytes`), hashed off
/// the async threads: every store's `put` starts here.
pub(crate) async fn admitted_digest(body: &Bytes, max_bytes: u64) -> Result<[u8; 32], ClaimError> {
    if body.is_empty() {
        return Err(ClaimError::Refused(EMPTY_BODY.to_string()));
    }
    if body.len() as u64 > max_bytes {
        return Err(ClaimError::Refused(format!("a body of {} bytes, over the limit of {max_bytes} (max_claim_check_bytes)", body.len())));
    }
    let hashed = body.clone();
    tokio::task::spawn_blocking(move || sha256(&hashed)).await.map_err(|e| ClaimError::Fatal(anyhow::anyhow!("hashing the body: {e}")))
}

/// SHA-256 of `body`.
pub fn sha256(body: &[u8]) -> [u8; 32] {
    Sha256::digest(body).into()
}

/// Why `check` may not be followed by a store that takes `allowed`, with bodies of 1 to
/// `max_bytes` bytes (nothing offloads an empty body): checked before any request is made.
pub(crate) fn check_reference(check: &ClaimCheck, allowed: &AllowedReferences, max_bytes: u64) -> Result<(), ClaimError> {
    if let Some(defect) = check.location.defect() {
        return Err(ClaimError::Refused(format!("{}: {defect}", check.location)));
    }
    if let BlobRef::Azure { blob: name, .. } | BlobRef::S3 { key: name, .. } = &check.location
        && let Some(defect) = blob_name_defect(name)
    {
        return Err(ClaimError::Refused(format!("{}: {defect}", check.location)));
    }
    if !allowed.allows(&check.location) {
        return Err(ClaimError::Foreign { location: check.location.clone(), allowed: allowed.describe() });
    }
    if check.size == 0 {
        return Err(ClaimError::Refused(format!("{}: a claim of 0 bytes (an empty body fits any envelope)", check.location)));
    }
    if check.size > max_bytes {
        return Err(ClaimError::Refused(format!("{}: {} bytes, over the limit of {max_bytes}", check.location, check.size)));
    }
    Ok(())
}

/// Why `blob` is not a name a claim store follows, beyond Azure's own rules (1 to 1,024
/// bytes, no control characters: [`BlobRef`]'s check): a name is one or more segments of
/// letters, digits, `-`, `_` and `.` separated by single `/`, none of them `.` or `..`.
/// A URL would resolve `..` (`bodies/../other-container/x` is a blob of another container)
/// and carry `?`, `#` or `%` as a query, a fragment or an escape; ebb's own names are hex.
pub(crate) fn blob_name_defect(blob: &str) -> Option<String> {
    if let Some(bad) = blob.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))) {
        return Some(format!("blob name has the character {bad:?} (only letters, digits, '-', '_', '.' and '/')"));
    }
    if blob.split('/').any(|segment| segment.is_empty() || segment == "." || segment == "..") {
        return Some("blob name has an empty, '.' or '..' segment".to_string());
    }
    None
}

#[cfg(test)]
mod tests;
