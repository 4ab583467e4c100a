//! How a body becomes an SQS message body, and back.
//!
//! SQS bodies are text of a restricted set of Unicode characters (tab, line feed, carriage
//! return, U+0020 to U+D7FF, U+E000 to U+FFFD, U+10000 up). ebb's bodies are bytes (an
//! envelope may be compressed), so a body SQS cannot carry is sent as base64 and says so in
//! a message attribute, [`ENCODING_ATTRIBUTE`] = `base64`: any SQS consumer can tell the two
//! apart, and text bodies (JSON, the common case) stay readable by every other SQS client.

use crate::queue::QueueError;

/// The message attribute that marks a base64 body (String, value `base64`).
pub const ENCODING_ATTRIBUTE: &str = "ebb-encoding";

/// The attribute's value on a base64 body.
pub const BASE64: &str = "base64";

/// What the attribute adds to a message's size as SQS counts it (its name, its data type
/// `String` and its value), in bytes.
pub const ATTRIBUTE_BYTES: usize = ENCODING_ATTRIBUTE.len() + "String".len() + BASE64.len();

/// How bodies are written as SQS message bodies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Encoding {
    /// A body SQS can carry as text goes as it is; any other goes as base64 with the
    /// [`ENCODING_ATTRIBUTE`] attribute. Any bytes round-trip.
    #[default]
    Auto,
    /// Every body as text, as it is: one SQS cannot carry is refused, naming the first byte
    /// or character it cannot (for consumers that read only the body).
    Text,
}

/// A body as SQS will carry it: its text and whether it is base64.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Encoded {
    pub text: String,
    pub base64: bool,
}

impl Encoded {
    /// Its size as SQS counts it against the queue's MaximumMessageSize.
    pub fn size(&self) -> usize {
        self.text.len() + if self.base64 { ATTRIBUTE_BYTES } else { 0 }
    }
}

/// Whether SQS carries `c` in a message body.
fn allowed_in_sqs(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | ' '..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

impl Encoding {
    /// The largest body of any bytes that fits a queue whose MaximumMessageSize is `limit`.
    pub fn max_body_bytes(self, limit: usize) -> usize {
        match self {
            Encoding::Auto => limit.saturating_sub(ATTRIBUTE_BYTES) / 4 * 3,
            Encoding::Text => limit,
        }
    }

    /// The message body for `body`, or why it cannot be sent.
    pub(crate) fn encode(self, body: &[u8]) -> Result<Encoded, QueueError> {
        let refusal = match std::str::from_utf8(body) {
            Ok(text) => match text.chars().find(|&c| !allowed_in_sqs(c)) {
                None => return Ok(Encoded { text: text.to_string(), base64: false }),
                Some(c) => format!("it holds the character U+{:04X}, which an SQS message body cannot carry", c as u32),
            },
            Err(error) => format!("it is not valid UTF-8 ({error}), and an SQS message body is text"),
        };
        match self {
            Encoding::Auto => Ok(Encoded { text: azure_core::base64::encode(body), base64: true }),
            Encoding::Text => {
                Err(QueueError::InvalidBody(format!("{refusal}; a queue with encoding \"text\" sends bodies as they are: use \"auto\" for such bodies")))
            }
        }
    }

    /// The body of a message with `text` and the [`ENCODING_ATTRIBUTE`] value it came
    /// with, and its defect if it does not decode.
    pub(crate) fn decode(text: String, marked: Option<&str>) -> (Vec<u8>, Option<String>) {
        match marked {
            None => (text.into_bytes(), None),
            Some(BASE64) => match azure_core::base64::decode(text.split_ascii_whitespace().collect::<String>()) {
                Ok(body) => (body, None),
                Err(error) => (text.into_bytes(), Some(format!("undecodable: the body is marked {ENCODING_ATTRIBUTE}=base64 but is not base64 ({error})"))),
            },
            Some(other) => {
                let other = crate::health::truncate_reason(other);
                (text.into_bytes(), Some(format!("undecodable: the body is marked {ENCODING_ATTRIBUTE}={other:?}, an encoding ebb does not know")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_sqs_can_carry_goes_as_it_is_and_round_trips() {
        for text in ["hello", "{\"a\": 1}\t\r\n", "héllo ✓ \u{10000}", "\u{E000}\u{FFFD}"] {
            let encoded = Encoding::Auto.encode(text.as_bytes()).unwrap();
            assert_eq!(encoded, Encoded { text: text.to_string(), base64: false });
            assert_eq!(Encoding::decode(encoded.text, None), (text.as_bytes().to_vec(), None));
        }
    }

    #[test]
    fn auto_sends_bodies_sqs_cannot_carry_as_marked_base64_and_they_round_trip() {
        let binary: Vec<u8> = (0..=255).collect();
        for body in [binary.as_slice(), b"a\0b", "\u{FFFE}".as_bytes(), b"\x1f"] {
            let encoded = Encoding::Auto.encode(body).unwrap();
            assert!(encoded.base64, "{body:?}");
            assert_eq!(encoded.size(), encoded.text.len() + ATTRIBUTE_BYTES);
            assert_eq!(Encoding::decode(encoded.text, Some(BASE64)), (body.to_vec(), None));
        }
    }

    #[test]
    fn text_refuses_what_sqs_cannot_carry_naming_the_character_or_the_utf8_error() {
        let error = Encoding::Text.encode(b"a\0b").unwrap_err();
        assert!(matches!(&error, QueueError::InvalidBody(reason) if reason.contains("U+0000")), "{error}");
        let error = Encoding::Text.encode(&[0xff, 0xfe]).unwrap_err();
        assert!(matches!(&error, QueueError::InvalidBody(reason) if reason.contains("not valid UTF-8")), "{error}");
    }

    #[test]
    fn a_marked_body_that_does_not_decode_is_kept_with_a_defect() {
        let (body, defect) = Encoding::decode("<not base64>".into(), Some(BASE64));
        assert_eq!(body, b"<not base64>");
        assert!(defect.unwrap().starts_with("undecodable: "));
        let (_, defect) = Encoding::decode("x".into(), Some("rot13"));
        assert!(defect.unwrap().contains("rot13"));
    }

    #[test]
    fn the_largest_body_of_any_bytes_leaves_room_for_base64_and_its_attribute() {
        let limit = 1024 * 1024;
        let largest = Encoding::Auto.max_body_bytes(limit);
        assert!(Encoding::Auto.encode(&vec![0; largest]).unwrap().size() <= limit);
        assert!(Encoding::Auto.encode(&vec![0; largest + 3]).unwrap().size() > limit);
        assert_eq!(Encoding::Text.max_body_bytes(limit), limit);
    }
}
