//! ebb's offloaded message as the SQS Extended Client's pointer: what the SQS queue is
//! handed ([`crate::queue::sqs::Offloads`]) to send the envelope of one message offloaded to
//! S3 ([`encode_message`]) as a pointer, and to take a pointer in as that envelope.
//!
//! The pointer's wire format (JSON body, size attribute) is the queue's
//! (`queue/sqs/pointer.rs`); what it stands for inside ebb is this format's, so the queue
//! below knows nothing of envelopes and this side nothing of SQS messages.

use std::borrow::Cow;

use super::format::{encode_message, offloaded_message};
use super::item::{BlobRef, ClaimCheck};
use super::text::from_text;
use super::wire::MAGIC;
use crate::queue::sqs::{Offloads, S3Pointer};

/// Offloaded messages as SQS Extended Client pointers, for every SQS queue of a host.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExtendedClientPointers;

impl Offloads for ExtendedClientPointers {
    /// The pointer for `body` if it is the envelope of one message offloaded to S3, raw or
    /// as base64 text (a queue whose envelopes go as text).
    fn pointer_of(&self, body: &[u8]) -> Option<S3Pointer> {
        let raw = if body.starts_with(&MAGIC) { Cow::Borrowed(body) } else { Cow::Owned(from_text(std::str::from_utf8(body).ok()?).ok()??) };
        let check = offloaded_message(&raw)?;
        let sha256 = check.has_sha256().then_some(check.sha256);
        let BlobRef::S3 { bucket, key } = check.location else { return None };
        Some(S3Pointer { bucket, key, size: check.size, sha256 })
    }

    /// The envelope of the offloaded message `pointer` stands for (without a SHA-256,
    /// [`ClaimCheck::NO_SHA256`]: its size alone is checked).
    fn body_of(&self, pointer: S3Pointer) -> Result<Vec<u8>, String> {
        let check = ClaimCheck {
            location: BlobRef::S3 { bucket: pointer.bucket, key: pointer.key },
            size: pointer.size,
            sha256: pointer.sha256.unwrap_or(ClaimCheck::NO_SHA256),
        };
        encode_message(check).map_err(|e| format!("{e:#}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::to_text;

    fn check(sha256: [u8; 32]) -> ClaimCheck {
        ClaimCheck { location: BlobRef::S3 { bucket: "ebb-bodies".into(), key: "orders/00ff".into() }, size: 300_000, sha256 }
    }

    #[test]
    fn an_offloaded_message_goes_out_as_a_pointer_raw_or_as_text() {
        let envelope = encode_message(check([7; 32])).unwrap();
        let pointer = ExtendedClientPointers.pointer_of(&envelope).expect("a pointer");
        assert_eq!(pointer, S3Pointer { bucket: "ebb-bodies".into(), key: "orders/00ff".into(), size: 300_000, sha256: Some([7; 32]) });
        assert_eq!(ExtendedClientPointers.pointer_of(to_text(&envelope).as_bytes()), Some(pointer), "an envelope as text goes out the same");
    }

    #[test]
    fn a_pointer_comes_in_as_the_envelope_it_went_out_as() {
        for sha256 in [[7; 32], ClaimCheck::NO_SHA256] {
            let envelope = encode_message(check(sha256)).unwrap();
            let pointer = ExtendedClientPointers.pointer_of(&envelope).unwrap();
            assert_eq!(ExtendedClientPointers.body_of(pointer), Ok(envelope));
        }
    }

    #[test]
    fn plain_bodies_and_other_stores_claim_checks_go_out_as_they_are() {
        assert!(ExtendedClientPointers.pointer_of(b"{\"order\": 1}").is_none());
        let embedded = ClaimCheck { location: BlobRef::Embedded { queue: "orders".into(), key: 1 }, size: 5, sha256: [1; 32] };
        assert!(ExtendedClientPointers.pointer_of(&encode_message(embedded).unwrap()).is_none(), "only S3 claim checks become pointers");
    }

    #[test]
    fn a_pointer_to_a_bad_bucket_name_is_refused_with_the_reason() {
        let pointer = S3Pointer { bucket: "B_AD".into(), key: "k".into(), size: 10, sha256: None };
        let reason = ExtendedClientPointers.body_of(pointer).unwrap_err();
        assert!(reason.contains("bucket \"B_AD\""), "{reason}");
    }
}
