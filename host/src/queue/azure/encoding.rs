//! How a body becomes a message's text, and back.

use crate::queue::QueueError;

/// Azure's limit on a message's text (after encoding), in bytes.
pub const MAX_ENCODED_BYTES: usize = 64 * 1024;

/// Characters XML 1.0 can carry: tab, line feed, carriage return, and U+0020 up, less
/// U+FFFE and U+FFFF (a Rust string holds no surrogates).
fn allowed_in_xml(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{FFFE}' && c != '\u{FFFF}')
}

/// How bodies are written as message text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Encoding {
    /// Base64 of the bytes: what Azure Functions and the Azure SDKs write and expect. Any
    /// bytes round-trip; bodies up to 48 KiB (49,152 bytes).
    #[default]
    Base64,
    /// The body as text (XML-escaped on the wire): must be valid UTF-8; up to 64 KiB.
    None,
}

impl Encoding {
    /// The largest body that fits, in bytes.
    pub fn max_body_bytes(self) -> usize {
        match self {
            Encoding::Base64 => MAX_ENCODED_BYTES / 4 * 3,
            Encoding::None => MAX_ENCODED_BYTES,
        }
    }

    /// The message text for `body`, or why it cannot be sent.
    pub(crate) fn encode(self, body: &[u8]) -> Result<String, QueueError> {
        let encoded_len = match self {
            Encoding::Base64 => body.len().div_ceil(3) * 4,
            Encoding::None => body.len(),
        };
        if encoded_len > MAX_ENCODED_BYTES {
            return Err(QueueError::MessageTooLarge { size: body.len(), limit: self.max_body_bytes() });
        }
        match self {
            Encoding::Base64 => Ok(azure_core::base64::encode(body)),
            Encoding::None => match std::str::from_utf8(body) {
                Ok(text) => match text.chars().find(|&c| !allowed_in_xml(c)) {
                    None => Ok(text.to_string()),
                    Some(c) => Err(QueueError::InvalidBody(format!(
                        "it holds the character U+{:04X}, which XML (the message text) cannot carry; a queue with message encoding \"none\" sends text: use base64 for such bodies",
                        c as u32
                    ))),
                },
                Err(error) => Err(QueueError::InvalidBody(format!(
                    "it is not valid UTF-8 ({error}); a queue with message encoding \"none\" sends text: use base64 for binary bodies"
                ))),
            },
        }
    }

    /// The body of a message with `text`, and its defect if the text does not decode.
    pub(crate) fn decode(self, text: String) -> (Vec<u8>, Option<String>) {
        match self {
            Encoding::None => (text.into_bytes(), None),
            // MIME-style base64 (line breaks every 76 characters) is what some writers send.
            Encoding::Base64 => match azure_core::base64::decode(text.split_ascii_whitespace().collect::<String>()) {
                Ok(body) => (body, None),
                Err(error) => {
                    let defect = format!("undecodable: the message text is not base64 ({error}); was it put with another encoding?");
                    (text.into_bytes(), Some(defect))
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_any_bytes() {
        let body: Vec<u8> = (0..=255).collect();
        let text = Encoding::Base64.encode(&body).unwrap();
        assert_eq!(Encoding::Base64.decode(text), (body, None));
    }

    #[test]
    fn text_that_is_not_base64_is_kept_with_a_defect() {
        let (body, defect) = Encoding::Base64.decode("<a & b>".into());
        assert_eq!(body, b"<a & b>");
        assert!(defect.unwrap().starts_with("undecodable: "));
    }

    /// Review (session 4): invalid UTF-8 was a fatal storage error (the API answered 503, a
    /// retryable status), and control characters were accepted, then every get of the
    /// message failed on the service (Azurite answers 500), so it was never delivered.
    #[test]
    fn none_refuses_bytes_that_are_not_utf8_or_not_xml_characters_as_an_invalid_body() {
        assert!(matches!(Encoding::None.encode(&[0xff, 0xfe]), Err(QueueError::InvalidBody(_))));
        for bad in ["a\u{0}b", "\u{b}", "x\u{1f}", "\u{fffe}"] {
            let error = Encoding::None.encode(bad.as_bytes()).unwrap_err();
            assert!(matches!(error, QueueError::InvalidBody(ref reason) if reason.contains("U+")), "{bad:?}: {error}");
        }
        assert_eq!(Encoding::None.encode(b"<a & b>\t\r\n").unwrap(), "<a & b>\t\r\n");
        assert_eq!(Encoding::None.encode("héllo ✓ \u{10000}".as_bytes()).unwrap(), "héllo ✓ \u{10000}");
    }

    /// Review (session 4): base64 broken into lines (MIME style, as Python's
    /// `base64.encodebytes` writes it) went to poison as undecodable.
    #[test]
    fn base64_with_line_breaks_decodes() {
        let body: Vec<u8> = (0..=255).cycle().take(200).collect();
        let text = Encoding::Base64.encode(&body).unwrap();
        let mime: String = text.as_bytes().chunks(76).map(|line| format!("{}\n", std::str::from_utf8(line).unwrap())).collect();
        assert_eq!(Encoding::Base64.decode(mime), (body, None));
    }

    #[test]
    fn the_limit_is_on_the_encoded_text() {
        assert_eq!(Encoding::Base64.max_body_bytes(), 49_152);
        assert!(Encoding::Base64.encode(&vec![0; 49_152]).is_ok());
        assert!(matches!(Encoding::Base64.encode(&vec![0; 49_153]), Err(QueueError::MessageTooLarge { size: 49_153, limit: 49_152 })));
        assert!(Encoding::None.encode(&vec![b'x'; 65_536]).is_ok());
        assert!(matches!(Encoding::None.encode(&vec![b'x'; 65_537]), Err(QueueError::MessageTooLarge { size: 65_537, limit: 65_536 })));
    }
}
