//! What a consumer accepts from an envelope, checked before anything is allocated for it.

use super::item::{AzureContainer, BlobRef};

/// [`Limits::max_items`] by default: 10,000 items of a few bytes each still fit one
/// compressed Azure message; far more would only be an attack on the consumer.
pub(crate) const DEFAULT_MAX_ITEMS: u32 = 10_000;
/// [`Limits::max_decoded_bytes`] by default: 4 MiB, about 85 times an Azure envelope, more
/// than JSON compresses (5 to 20 times, `docs/reference/envelope.md`).
pub(crate) const DEFAULT_MAX_DECODED_BYTES: usize = 4 << 20;
/// [`Limits::max_claim_check_bytes`] by default: 100 MiB (issue 20's limit per body).
pub const DEFAULT_MAX_CLAIM_CHECK_BYTES: u64 = 100 << 20;

/// What a consumer accepts. A packer given the same limits only writes envelopes that
/// pass them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most items in one envelope.
    pub max_items: u32,
    /// Largest item section once decompressed, in bytes: the most that decoding one
    /// envelope allocates for its items.
    pub max_decoded_bytes: usize,
    /// Largest body a claim check may name, in bytes.
    pub max_claim_check_bytes: u64,
    /// Where claim checks may point.
    pub references: AllowedReferences,
}

/// Where claim checks may point: a consumer fetches only from its own queue's store, so
/// a producer cannot make it read (and hand to a handler) someone else's blob.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedReferences {
    /// The Azure container blobs may be in; none refuses every blob reference.
    pub azure: Option<AzureContainer>,
    /// The storage queue whose embedded store may hold bodies; none refuses them.
    pub embedded_queue: Option<String>,
    /// The S3 bucket objects may be in; none refuses every S3 reference.
    pub s3_bucket: Option<String>,
}

impl Default for Limits {
    /// The defaults above; no claim check allowed.
    fn default() -> Self {
        Limits {
            max_items: DEFAULT_MAX_ITEMS,
            max_decoded_bytes: DEFAULT_MAX_DECODED_BYTES,
            max_claim_check_bytes: DEFAULT_MAX_CLAIM_CHECK_BYTES,
            references: AllowedReferences::default(),
        }
    }
}

impl AllowedReferences {
    /// Whether a claim check may point at `location`.
    pub fn allows(&self, location: &BlobRef) -> bool {
        match location {
            BlobRef::Azure { account, container, .. } => self.azure.as_ref().is_some_and(|a| a.account == *account && a.container == *container),
            BlobRef::Embedded { queue, .. } => self.embedded_queue.as_deref() == Some(queue.as_str()),
            BlobRef::S3 { bucket, .. } => self.s3_bucket.as_deref() == Some(bucket.as_str()),
        }
    }

    /// What is allowed, in words, for a refusal.
    pub(super) fn describe(&self) -> String {
        if let Some(bucket) = &self.s3_bucket {
            return format!("only objects in s3 bucket {bucket}");
        }
        match (&self.azure, &self.embedded_queue) {
            (None, None) => "this consumer takes no claim checks".to_string(),
            (Some(azure), None) => format!("only blobs in {azure}"),
            (None, Some(queue)) => format!("only embedded bodies of queue {queue}"),
            (Some(azure), Some(queue)) => format!("only blobs in {azure} and embedded bodies of queue {queue}"),
        }
    }
}
