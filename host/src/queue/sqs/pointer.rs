//! A whole message offloaded to S3, on the queue in the format of Amazon's SQS Extended
//! Client Library, so ebb and a producer or consumer using that library read each other's
//! large messages.
//!
//! The format, as the libraries write and read it (awslabs/amazon-sqs-java-extended-client-lib,
//! `SQSExtendedClientConstants` and `AmazonSQSExtendedClient.storeMessageInS3`; the
//! payload-offloading library's `PayloadS3Pointer.toJson`; and the Python port
//! awslabs/amazon-sqs-python-extended-client-lib, `src/sqs_extended_client/client.py`,
//! `_store_message_in_s3` and `_receive_message_decorator`, PyPI `amazon-sqs-extended-client`
//! 1.0.1):
//! - the body is the JSON array `["software.amazon.payloadoffloading.PayloadS3Pointer",
//!   {"s3BucketName":"<bucket>","s3Key":"<key>"}]` (Java's Jackson writes it compact, Python's
//!   `json.dumps` with spaces; older clients name the class
//!   `com.amazon.sqs.javamessaging.MessageS3Pointer`);
//! - the message attribute `ExtendedPayloadSize` (`Number`; older clients
//!   `SQSLargePayloadSize`) holds the original body's size in bytes (UTF-8). A reader takes a
//!   message as a pointer when it carries either attribute, and only then;
//! - the object holds the body as it was; the consumer deletes it when it deletes the message.
//!
//! ebb adds the attribute [`SHA256_ATTRIBUTE`] (hex) to the pointers it writes, so its own
//! consumers still check the body's SHA-256; the libraries ignore it. A pointer without it
//! (a foreign producer's) is checked by size alone ([`ClaimCheck::NO_SHA256`]).
//!
//! Inside ebb such a message is the envelope of one offloaded message
//! ([`crate::payload::encode_message`]): [`outgoing`] turns that envelope into a pointer
//! on the way out, [`incoming`] a pointer into that envelope on the way in, so the listener,
//! the poison queue and `ebb poison requeue` handle it as on any backend.

use crate::payload::{BlobRef, ClaimCheck, encode_message, offloaded_message};

/// The attribute holding the original size (the libraries' `RESERVED_ATTRIBUTE_NAME`).
pub const SIZE_ATTRIBUTE: &str = "ExtendedPayloadSize";
/// The attribute older clients use instead (`LEGACY_RESERVED_ATTRIBUTE_NAME`).
pub const LEGACY_SIZE_ATTRIBUTE: &str = "SQSLargePayloadSize";
/// ebb's own attribute on the pointers it writes: the body's SHA-256 in hex.
pub const SHA256_ATTRIBUTE: &str = "ebb-sha256";
/// The pointer's class name (`MESSAGE_POINTER_CLASS`).
const POINTER_CLASS: &str = "software.amazon.payloadoffloading.PayloadS3Pointer";
/// The class name older clients write (`LEGACY_MESSAGE_POINTER_CLASS`).
const LEGACY_POINTER_CLASS: &str = "com.amazon.sqs.javamessaging.MessageS3Pointer";

/// A pointer to send: its body and attributes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Pointer {
    /// The JSON body.
    pub body: String,
    /// The original size ([`SIZE_ATTRIBUTE`]).
    pub size: u64,
    /// The SHA-256 in hex ([`SHA256_ATTRIBUTE`]), when ebb knows it.
    pub sha256: Option<String>,
}

/// The pointer to send for `body`, if it is the envelope of one message offloaded to S3
/// (raw or as base64 text).
pub(crate) fn outgoing(body: &[u8]) -> Option<Pointer> {
    let check = offloaded_message(body)?;
    let BlobRef::S3 { bucket, key } = &check.location else { return None };
    let body = serde_json::to_string(&(POINTER_CLASS, serde_json::json!({ "s3BucketName": bucket, "s3Key": key }))).expect("strings serialize");
    Some(Pointer { body, size: check.size, sha256: check.has_sha256().then(|| hex::encode(check.sha256)) })
}

/// The body ebb's listener reads for a message with `text` and, if it carries them, the
/// size attribute (either name) and [`SHA256_ATTRIBUTE`]: `None` when it is no pointer (no
/// size attribute); else the envelope of the offloaded message, or why the pointer is
/// unusable (the message is poisoned with it).
pub(crate) fn incoming(text: &str, size: Option<&str>, sha256: Option<&str>) -> Option<Result<Vec<u8>, String>> {
    let size = size?;
    Some(parse(text, size, sha256).map_err(|reason| format!("an SQS Extended Client pointer ({SIZE_ATTRIBUTE} {size}) that ebb cannot follow: {reason}")))
}

fn parse(text: &str, size: &str, sha256: Option<&str>) -> Result<Vec<u8>, String> {
    let size: u64 = size.trim().parse().map_err(|_| format!("its size {size:?} is not a whole number of bytes"))?;
    let (class, fields): (String, serde_json::Map<String, serde_json::Value>) =
        serde_json::from_str(text).map_err(|e| format!("the body is not [\"{POINTER_CLASS}\", {{\"s3BucketName\": …, \"s3Key\": …}}] ({e})"))?;
    if class != POINTER_CLASS && class != LEGACY_POINTER_CLASS {
        return Err(format!("the pointer's class is {class:?}, not {POINTER_CLASS:?}"));
    }
    let field = |name: &str| fields.get(name).and_then(|value| value.as_str()).map(str::to_string).ok_or_else(|| format!("the pointer has no string {name:?}"));
    let location = BlobRef::S3 { bucket: field("s3BucketName")?, key: field("s3Key")? };
    let sha256 = match sha256 {
        None => ClaimCheck::NO_SHA256,
        Some(hex_text) => {
            let mut digest = [0u8; 32];
            hex::decode_to_slice(hex_text.trim(), &mut digest).map_err(|_| format!("its {SHA256_ATTRIBUTE} {hex_text:?} is not 64 hex digits"))?;
            digest
        }
    };
    encode_message(ClaimCheck { location, size, sha256 }).map_err(|e| format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::to_text;

    fn check(sha256: [u8; 32]) -> ClaimCheck {
        ClaimCheck { location: BlobRef::S3 { bucket: "ebb-bodies".into(), key: "orders/00ff".into() }, size: 300_000, sha256 }
    }

    #[test]
    fn an_offloaded_message_goes_out_as_the_extended_clients_pointer() {
        let envelope = encode_message(check([7; 32])).unwrap();
        let pointer = outgoing(&envelope).expect("a pointer");
        assert_eq!(pointer.body, r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"ebb-bodies","s3Key":"orders/00ff"}]"#);
        assert_eq!(pointer.size, 300_000);
        assert_eq!(pointer.sha256.as_deref(), Some(hex::encode([7; 32]).as_str()));
        assert_eq!(outgoing(to_text(&envelope).as_bytes()), Some(pointer), "an envelope as text goes out the same");
    }

    #[test]
    fn a_pointer_comes_in_as_the_envelope_it_went_out_as() {
        for sha256 in [[7; 32], ClaimCheck::NO_SHA256] {
            let envelope = encode_message(check(sha256)).unwrap();
            let pointer = outgoing(&envelope).unwrap();
            let back = incoming(&pointer.body, Some(&pointer.size.to_string()), pointer.sha256.as_deref()).unwrap().unwrap();
            assert_eq!(back, envelope);
        }
    }

    #[test]
    fn pythons_spacing_and_the_legacy_class_are_read() {
        let text = r#"["com.amazon.sqs.javamessaging.MessageS3Pointer", {"s3BucketName": "ebb-bodies", "s3Key": "orders/00ff"}]"#;
        let back = incoming(text, Some("300000"), None).unwrap().unwrap();
        assert_eq!(offloaded_message(&back), Some(check(ClaimCheck::NO_SHA256)));
    }

    #[test]
    fn a_body_without_the_size_attribute_is_no_pointer_and_plain_bodies_go_out_as_they_are() {
        assert!(incoming(r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{}]"#, None, None).is_none());
        assert!(outgoing(b"{\"order\": 1}").is_none());
        let azure = ClaimCheck { location: BlobRef::Embedded { queue: "orders".into(), key: 1 }, size: 5, sha256: [1; 32] };
        assert!(outgoing(&encode_message(azure).unwrap()).is_none(), "only S3 claim checks become pointers");
    }

    #[test]
    fn an_unusable_pointer_says_why() {
        let cases = [
            ("not json", "10", None, "is not ["),
            (r#"["x.Other",{"s3BucketName":"b-ok","s3Key":"k"}]"#, "10", None, "class is \"x.Other\""),
            (r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3Key":"k"}]"#, "10", None, "no string \"s3BucketName\""),
            (r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"b-ok","s3Key":"k"}]"#, "ten", None, "not a whole number"),
            (r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"B_AD","s3Key":"k"}]"#, "10", None, "bucket \"B_AD\""),
            (r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"b-ok","s3Key":"k"}]"#, "10", Some("zz"), "not 64 hex digits"),
        ];
        for (text, size, sha256, expected) in cases {
            let reason = incoming(text, Some(size), sha256).unwrap().unwrap_err();
            assert!(reason.contains(expected), "{text}: {reason}");
            assert!(reason.contains("SQS Extended Client pointer"), "{reason}");
        }
    }
}
