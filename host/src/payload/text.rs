//! An envelope as message text, for Azure queues whose messages are plain text.
//!
//! An Azure queue with `encoding = "base64"` (the default) writes a body's bytes as base64
//! and reads them back (`queue/azure/encoding.rs`): the envelope goes as it is, and its
//! limit is the 49,152 bytes such a queue takes. With `encoding = "none"` the backend
//! sends the body as text and refuses bytes that are not UTF-8, which an envelope never
//! is: [`to_text`] makes the base64 itself, and [`decode_text`] reads it back. The limit is
//! the same either way: 65,536 characters of base64 hold 49,152 bytes.

use super::error::EnvelopeError;
use super::format::{Decoded, decode};
use super::limits::Limits;

/// The base64 of [`MAGIC`](super::MAGIC)'s first six bytes: how every envelope's text
/// begins.
const MAGIC_TEXT: &str = "wUVCQg0K";

/// `envelope` as standard base64 (RFC 4648, padded), as the Azure SDKs write bytes.
pub fn to_text(envelope: &[u8]) -> String {
    azure_core::base64::encode(envelope)
}

/// A message's text: [`Decoded::NotAnEnvelope`] unless it is the base64 of an envelope
/// (line breaks and spaces in it are ignored, as MIME-style writers add them).
pub fn decode_text(text: &str, limits: &Limits) -> Result<Decoded, EnvelopeError> {
    match from_text(text)? {
        Some(bytes) => decode(&bytes, limits),
        None => Ok(Decoded::NotAnEnvelope),
    }
}

/// The bytes `text` is the base64 of, if it begins as an envelope's text does; `None` for
/// any other text.
pub(super) fn from_text(text: &str) -> Result<Option<Vec<u8>>, EnvelopeError> {
    if !text.trim_start().starts_with(MAGIC_TEXT) {
        return Ok(None);
    }
    let compact: String = text.split_ascii_whitespace().collect();
    azure_core::base64::decode(compact).map(Some).map_err(|error| EnvelopeError::NotBase64 { reason: error.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::{Codec, Item, MAGIC, encode};

    #[test]
    fn the_text_marker_is_the_base64_of_the_magic() {
        assert_eq!(to_text(&MAGIC[..6]), MAGIC_TEXT);
    }

    #[test]
    fn an_envelope_round_trips_through_text_even_broken_into_lines() -> anyhow::Result<()> {
        let items = vec![Item::inline("one"), Item::inline(vec![0xff, 0, 0xc1]).with_attempts(2)];
        let text = to_text(&encode(&items, Codec::Deflate)?);
        let mime: String = text.as_bytes().chunks(76).map(|line| format!("{}\r\n", std::str::from_utf8(line).unwrap())).collect();
        for text in [text, mime] {
            let Decoded::Envelope(envelope) = decode_text(&text, &Limits::default())? else { panic!("not an envelope: {text}") };
            assert_eq!(envelope.items, items);
        }
        Ok(())
    }

    #[test]
    fn plain_text_is_not_an_envelope_and_broken_base64_after_the_marker_is_refused() {
        assert_eq!(decode_text("{\"order\": 1}", &Limits::default()), Ok(Decoded::NotAnEnvelope));
        assert_eq!(decode_text("aGVsbG8=", &Limits::default()), Ok(Decoded::NotAnEnvelope));
        let error = decode_text("wUVCQg0K!!", &Limits::default()).unwrap_err();
        assert!(matches!(error, EnvelopeError::NotBase64 { .. }), "{error}");
    }
}
