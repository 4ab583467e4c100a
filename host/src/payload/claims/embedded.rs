//! Claim-check bodies in the embedded queue's own store (`host/src/queue/embedded/claims.rs`):
//! as durable as the messages, committed before the put answers.

use std::time::Duration;

use anyhow::anyhow;
use async_trait::async_trait;
use bytes::Bytes;

use super::{ClaimError, ClaimStore, SweepReport, admitted_digest, check_reference, sha256};
use crate::payload::{AllowedReferences, BlobRef, ClaimCheck};
use crate::queue::QueueError;
use crate::queue::embedded::{ClaimRead, EmbeddedQueue, MAX_CLAIM_BODY_BYTES};

/// A storage queue's claim-check bodies in its embedded store.
pub struct EmbeddedClaims {
    queue: EmbeddedQueue,
    max_bytes: u64,
}

impl EmbeddedClaims {
    /// The bodies of `queue` (created beforehand, like the queue), at most `max_bytes` each.
    pub fn new(queue: EmbeddedQueue, max_bytes: u64) -> Self {
        EmbeddedClaims { queue, max_bytes: max_bytes.min(MAX_CLAIM_BODY_BYTES) }
    }

    /// How many bodies the store keeps for this queue.
    pub fn count(&self) -> Result<u64, ClaimError> {
        self.queue.claim_count().map_err(storage)
    }

    fn key_of(&self, check: &ClaimCheck, max_bytes: u64) -> Result<u64, ClaimError> {
        check_reference(check, &self.allowed(), max_bytes)?;
        match check.location {
            BlobRef::Embedded { key, .. } => Ok(key),
            BlobRef::Azure { .. } | BlobRef::S3 { .. } => unreachable!("check_reference allows only this queue"),
        }
    }
}

fn storage(error: QueueError) -> ClaimError {
    match error {
        QueueError::Transient(error) => ClaimError::Transient(error),
        other => ClaimError::Fatal(anyhow!("{other}")),
    }
}

#[async_trait]
impl ClaimStore for EmbeddedClaims {
    fn describe(&self) -> String {
        format!("embedded bodies of queue {}", crate::queue::QueueClient::name(&self.queue))
    }

    fn allowed(&self) -> AllowedReferences {
        AllowedReferences { azure: None, embedded_queue: Some(crate::queue::QueueClient::name(&self.queue).to_string()), s3_bucket: None }
    }

    fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    async fn put(&self, body: Bytes) -> Result<ClaimCheck, ClaimError> {
        let digest = admitted_digest(&body, self.max_bytes).await?;
        let size = body.len() as u64;
        let key = self.queue.put_claim(body).await.map_err(storage)?;
        Ok(ClaimCheck { location: BlobRef::Embedded { queue: crate::queue::QueueClient::name(&self.queue).to_string(), key }, size, sha256: digest })
    }

    async fn get(&self, check: &ClaimCheck, max_bytes: u64) -> Result<Bytes, ClaimError> {
        let max_bytes = max_bytes.min(self.max_bytes);
        let key = self.key_of(check, max_bytes)?;
        let location = || check.location.clone();
        let body = match self.queue.read_claim(key, check.size).map_err(storage)? {
            ClaimRead::Missing => return Err(ClaimError::Missing { location: location() }),
            ClaimRead::TooLarge(len) => {
                return Err(ClaimError::Corrupt { location: location(), reason: format!("the body has {len} bytes, the claim says {}", check.size) });
            }
            ClaimRead::Damaged(reason) => return Err(ClaimError::Corrupt { location: location(), reason }),
            ClaimRead::Body(body) => Bytes::from(body),
        };
        if body.len() as u64 != check.size {
            return Err(ClaimError::Corrupt { location: location(), reason: format!("the body has {} bytes, the claim says {}", body.len(), check.size) });
        }
        let hashed = body.clone();
        let digest = tokio::task::spawn_blocking(move || sha256(&hashed)).await.map_err(|e| ClaimError::Fatal(anyhow!("hashing the body: {e}")))?;
        if digest != check.sha256 {
            return Err(ClaimError::Corrupt {
                location: location(),
                // The stored body's own hash is not shown: the reference may be a forgery fishing for it.
                reason: format!("its SHA-256 is not the one the claim names ({})", hex::encode(check.sha256)),
            });
        }
        Ok(body)
    }

    async fn delete(&self, check: &ClaimCheck) -> Result<(), ClaimError> {
        let key = self.key_of(check, u64::MAX)?;
        self.queue.delete_claim(key).await.map_err(storage)
    }

    async fn sweep(&self, older_than: Duration) -> Result<SweepReport, ClaimError> {
        let removed = self.queue.sweep_claims(older_than).await.map_err(storage)?;
        Ok(SweepReport { removed, transactions: 0 })
    }
}
