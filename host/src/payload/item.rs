//! One work item of an envelope: its body inline, or a claim check pointing at it.

use std::fmt;

use bytes::Bytes;

/// One work item: what a handler gets, and how often it has failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// Deliveries of this item that failed before this envelope was written: 0 for a new
    /// item. The listener compares it with the queue's `max_dequeue_count`.
    pub attempts: u32,
    /// The item's bytes, or where they are.
    pub body: Body,
    /// Where its producer's send put it, once it was put back in another envelope (none in
    /// the envelope it was sent in: that envelope's id and the item's index there).
    pub origin: Option<Origin>,
    /// The trace context of its producer's send, if it had one (see
    /// `docs/reference/envelope.md`): its handling joins that trace.
    pub trace: Option<crate::telemetry::TraceContext>,
}

/// The message id and index its producer got for an item put back after failing: what a
/// poison entry and a reply name, whatever envelope carries the item now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The id of the message (envelope) it was sent in, as its storage queue gave it: 1 to
    /// 255 bytes of UTF-8.
    pub message_id: String,
    /// Its index in that envelope.
    pub index: u32,
}

/// Where an item's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// In the envelope.
    Inline(Bytes),
    /// Offloaded, too large for any envelope.
    ClaimCheck(ClaimCheck),
}

/// A reference to an item's bytes kept outside the queue (the claim-check pattern).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimCheck {
    /// Where the bytes are.
    pub location: BlobRef,
    /// Their length in bytes.
    pub size: u64,
    /// Their SHA-256, so the consumer knows it fetched what the producer put.
    pub sha256: [u8; 32],
}

/// Where an offloaded body is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobRef {
    /// A blob in Azure Blob Storage.
    Azure {
        /// The storage account: 3 to 24 lowercase letters and digits.
        account: String,
        /// The container: 3 to 63 lowercase letters, digits and single dashes, starting
        /// and ending with a letter or digit.
        container: String,
        /// The blob's name: 1 to 1,024 bytes of UTF-8 without control characters.
        blob: String,
    },
    /// A body kept in the embedded store.
    Embedded {
        /// The storage queue whose store holds it: 1 to 63 lowercase letters, digits and
        /// dashes.
        queue: String,
        /// Its key in that store.
        key: u64,
    },
    /// An object in Amazon S3 (a claim check of an SQS queue, in the SQS Extended Client's
    /// pointer when it is a whole message: `host/src/payload/extended.rs`).
    S3 {
        /// The bucket: 3 to 63 lowercase letters, digits, dots and dashes, starting and
        /// ending with a letter or digit.
        bucket: String,
        /// The object's key: 1 to 1,024 bytes of UTF-8 without control characters.
        key: String,
    },
}

/// The one Azure container claim checks may point into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AzureContainer {
    /// The storage account.
    pub account: String,
    /// The container.
    pub container: String,
}

impl ClaimCheck {
    /// The SHA-256 of a claim check whose producer gave none: an SQS Extended Client's
    /// pointer carries the size alone. Only the size of such a body is checked. (A real
    /// digest of all zeros would take 2^256 tries to find.)
    pub const NO_SHA256: [u8; 32] = [0; 32];

    /// Whether its producer gave the body's SHA-256 (see [`ClaimCheck::NO_SHA256`]).
    pub fn has_sha256(&self) -> bool {
        self.sha256 != ClaimCheck::NO_SHA256
    }
}

impl Item {
    /// A new item (no attempt yet) whose bytes travel in the envelope.
    pub fn inline(body: impl Into<Bytes>) -> Item {
        Item { attempts: 0, body: Body::Inline(body.into()), origin: None, trace: None }
    }

    /// A new item whose bytes were offloaded.
    pub fn claim_check(check: ClaimCheck) -> Item {
        Item { attempts: 0, body: Body::ClaimCheck(check), origin: None, trace: None }
    }

    /// The same item, counted as failed `attempts` times.
    pub fn with_attempts(self, attempts: u32) -> Item {
        Item { attempts, ..self }
    }

    /// The same item, carrying its producer's trace `context`.
    pub fn with_trace(self, context: Option<crate::telemetry::TraceContext>) -> Item {
        Item { trace: context, ..self }
    }

    /// Where its producer's send put it: its origin, or else `message_id` and `index`, the
    /// envelope carrying it now.
    pub fn origin_or(&self, message_id: &str, index: u32) -> Origin {
        self.origin.clone().unwrap_or_else(|| Origin { message_id: message_id.to_string(), index })
    }
}

impl fmt::Display for BlobRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlobRef::Azure { account, container, blob } => write!(f, "azure blob {account}/{container}/{blob:?}"),
            BlobRef::Embedded { queue, key } => write!(f, "embedded body {key} of queue {queue}"),
            BlobRef::S3 { bucket, key } => write!(f, "s3 object {bucket}/{key:?}"),
        }
    }
}

impl fmt::Display for AzureContainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.account, self.container)
    }
}

/// Longest blob name Azure takes, in bytes.
const MAX_BLOB_NAME_BYTES: usize = 1024;
/// Longest storage queue name.
const MAX_QUEUE_NAME_BYTES: usize = 63;

/// Why `account` is not an Azure storage account name, if it is not.
fn account_defect(account: &str) -> Option<String> {
    let ok = (3..=24).contains(&account.len()) && account.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    (!ok).then(|| format!("account {account:?} is not 3 to 24 lowercase letters and digits"))
}

/// Why `container` is not an Azure container name, if it is not.
fn container_defect(container: &str) -> Option<String> {
    let chars_ok = container.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let dashes_ok = !container.starts_with('-') && !container.ends_with('-') && !container.contains("--");
    let ok = (3..=63).contains(&container.len()) && chars_ok && dashes_ok;
    (!ok).then(|| format!("container {container:?} is not 3 to 63 lowercase letters, digits and single dashes"))
}

/// Why `blob` is not a blob name ebb writes or reads, if it is not.
fn blob_defect(blob: &str) -> Option<String> {
    let ok = (1..=MAX_BLOB_NAME_BYTES).contains(&blob.len()) && !blob.chars().any(char::is_control);
    (!ok).then(|| format!("blob name of {} bytes is not 1 to {MAX_BLOB_NAME_BYTES} bytes without control characters", blob.len()))
}

/// Why `bucket` is not an S3 bucket name, if it is not (AWS's general purpose bucket rules,
/// less the rarer ones: no IP addresses, no `xn--` prefix, which S3 refuses anyway).
pub(crate) fn bucket_defect(bucket: &str) -> Option<String> {
    let chars_ok = bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    let ends_ok = bucket.starts_with(|c: char| c.is_ascii_alphanumeric()) && bucket.ends_with(|c: char| c.is_ascii_alphanumeric());
    let ok = (3..=63).contains(&bucket.len()) && chars_ok && ends_ok && !bucket.contains("..");
    (!ok).then(|| format!("bucket {bucket:?} is not 3 to 63 lowercase letters, digits, dots and dashes"))
}

/// Why `queue` is not a storage queue name, if it is not.
fn queue_defect(queue: &str) -> Option<String> {
    let ok = (1..=MAX_QUEUE_NAME_BYTES).contains(&queue.len()) && queue.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    (!ok).then(|| format!("queue {queue:?} is not 1 to {MAX_QUEUE_NAME_BYTES} lowercase letters, digits and dashes"))
}

impl BlobRef {
    /// What makes this reference one no envelope may carry, if anything.
    pub(super) fn defect(&self) -> Option<String> {
        match self {
            BlobRef::Azure { account, container, blob } => account_defect(account).or_else(|| container_defect(container)).or_else(|| blob_defect(blob)),
            BlobRef::Embedded { queue, .. } => queue_defect(queue),
            BlobRef::S3 { bucket, key } => bucket_defect(bucket).or_else(|| blob_defect(key).map(|defect| defect.replace("blob name", "object key"))),
        }
    }
}
