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
//! consumers still check the body's SHA-256; the libraries ignore it.
//!
//! This file is the wire format only. Inside ebb such a message is the envelope of one
//! offloaded message, which is `crate::payload`'s (above the queue): the queue is handed
//! an [`Offloads`] that turns that envelope into an [`S3Pointer`] on the way out and back
//! on the way in (`payload/extended.rs`), so the listener, the poison queue and
//! `ebb poison requeue` handle it as on any backend.

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

/// What an Extended Client pointer says: where the body is, and how large it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Pointer {
    /// The S3 bucket holding the body.
    pub bucket: String,
    /// Its object key.
    pub key: String,
    /// The body's size in bytes ([`SIZE_ATTRIBUTE`]).
    pub size: u64,
    /// The body's SHA-256 ([`SHA256_ATTRIBUTE`]): ebb's pointers carry it, a foreign
    /// producer's do not.
    pub sha256: Option<[u8; 32]>,
}

/// Turns the bodies ebb puts into pointers and the pointers it gets into bodies: what an
/// offloaded message is inside ebb is the payload format's to say, which sits above the
/// queue, so the queue is handed one ([`super::SqsQueue::with_pointers`]).
pub trait Offloads: Send + Sync + std::fmt::Debug {
    /// The pointer to send instead of `body`, if `body` is a message offloaded to S3.
    fn pointer_of(&self, body: &[u8]) -> Option<S3Pointer>;
    /// The body the listener reads for a pointer received, or why ebb cannot take it.
    fn body_of(&self, pointer: S3Pointer) -> Result<Vec<u8>, String>;
}

impl S3Pointer {
    /// The message body the libraries write for it.
    pub(super) fn to_json(&self) -> String {
        let fields = serde_json::json!({ "s3BucketName": self.bucket, "s3Key": self.key });
        serde_json::to_string(&(POINTER_CLASS, fields)).expect("strings serialize")
    }

    /// The pointer of a message with `text` and the size attribute `size` (either name),
    /// and [`SHA256_ATTRIBUTE`] if it has one, or why it is unusable.
    fn received(text: &str, size: &str, sha256: Option<&str>) -> Result<S3Pointer, String> {
        parse(text, size, sha256).map_err(|reason| cannot_follow(size, &reason))
    }
}

/// The body and defect of a message with `text` that carries the size attribute `size`
/// (either name), so is a pointer: the body `pointers` reads for it, or the text as it came
/// and why ebb cannot follow it (the listener poisons it with that reason).
pub(super) fn received_body(pointers: &dyn Offloads, text: String, size: &str, sha256: Option<&str>) -> (Vec<u8>, Option<String>) {
    let body = S3Pointer::received(&text, size, sha256).and_then(|pointer| pointers.body_of(pointer).map_err(|reason| cannot_follow(size, &reason)));
    match body {
        Ok(body) => (body, None),
        Err(reason) => (text.into_bytes(), Some(reason)),
    }
}

fn cannot_follow(size: &str, reason: &str) -> String {
    format!("an SQS Extended Client pointer ({SIZE_ATTRIBUTE} {size}) that ebb cannot follow: {reason}")
}

fn parse(text: &str, size: &str, sha256: Option<&str>) -> Result<S3Pointer, String> {
    let size: u64 = size.trim().parse().map_err(|_| format!("its size {size:?} is not a whole number of bytes"))?;
    let (class, fields): (String, serde_json::Map<String, serde_json::Value>) =
        serde_json::from_str(text).map_err(|e| format!("the body is not [\"{POINTER_CLASS}\", {{\"s3BucketName\": …, \"s3Key\": …}}] ({e})"))?;
    if class != POINTER_CLASS && class != LEGACY_POINTER_CLASS {
        return Err(format!("the pointer's class is {class:?}, not {POINTER_CLASS:?}"));
    }
    let field = |name: &str| fields.get(name).and_then(|value| value.as_str()).map(str::to_string).ok_or_else(|| format!("the pointer has no string {name:?}"));
    let sha256 = match sha256 {
        None => None,
        Some(hex_text) => {
            let mut digest = [0u8; 32];
            hex::decode_to_slice(hex_text.trim(), &mut digest).map_err(|_| format!("its {SHA256_ATTRIBUTE} {hex_text:?} is not 64 hex digits"))?;
            Some(digest)
        }
    };
    Ok(S3Pointer { bucket: field("s3BucketName")?, key: field("s3Key")?, size, sha256 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointer(sha256: Option<[u8; 32]>) -> S3Pointer {
        S3Pointer { bucket: "ebb-bodies".into(), key: "orders/00ff".into(), size: 300_000, sha256 }
    }

    #[test]
    fn a_pointer_goes_out_as_the_extended_clients_json_and_comes_back_the_same() {
        let sent = pointer(Some([7; 32]));
        assert_eq!(sent.to_json(), r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"ebb-bodies","s3Key":"orders/00ff"}]"#);
        assert_eq!(S3Pointer::received(&sent.to_json(), "300000", Some(&hex::encode([7; 32]))), Ok(sent));
    }

    #[test]
    fn pythons_spacing_and_the_legacy_class_are_read() {
        let text = r#"["com.amazon.sqs.javamessaging.MessageS3Pointer", {"s3BucketName": "ebb-bodies", "s3Key": "orders/00ff"}]"#;
        assert_eq!(S3Pointer::received(text, "300000", None), Ok(pointer(None)));
    }

    #[test]
    fn an_unusable_pointer_says_why() {
        let cases = [
            ("not json", "10", None, "is not ["),
            (r#"["x.Other",{"s3BucketName":"b-ok","s3Key":"k"}]"#, "10", None, "class is \"x.Other\""),
            (r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3Key":"k"}]"#, "10", None, "no string \"s3BucketName\""),
            (r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"b-ok","s3Key":"k"}]"#, "ten", None, "not a whole number"),
            (r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"b-ok","s3Key":"k"}]"#, "10", Some("zz"), "not 64 hex digits"),
        ];
        for (text, size, sha256, expected) in cases {
            let reason = S3Pointer::received(text, size, sha256).unwrap_err();
            assert!(reason.contains(expected), "{text}: {reason}");
            assert!(reason.contains("SQS Extended Client pointer"), "{reason}");
        }
    }
}
