//! Why bytes that start like an envelope are not one ebb can deliver.

use super::codec::Codec;
use super::wire::{FORMAT_VERSION, MIN_ITEM_BYTES};

/// An envelope refused: truncated, corrupted, hostile, or from a newer producer. Its
/// message is the reason a poison message carries; every variant is a defect of the
/// message itself, so retrying it cannot help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// Fewer bytes than the header (or the header's lengths) call for.
    #[error("truncated envelope: {length} bytes, it needs {needed}")]
    Truncated {
        /// The message's length in bytes.
        length: usize,
        /// The bytes its header calls for.
        needed: usize,
    },
    /// More bytes than the header's lengths call for.
    #[error("envelope of {length} bytes, its header says {expected}: bytes past its end")]
    TrailingBytes {
        /// The message's length in bytes.
        length: usize,
        /// The bytes its header calls for.
        expected: usize,
    },
    /// Written by a producer that speaks a later version of the format.
    #[error("envelope version {version}: this ebb reads version {}; upgrade the consumer", FORMAT_VERSION)]
    UnsupportedVersion {
        /// The version byte.
        version: u8,
    },
    /// The CRC32 does not match the bytes: changed in transit or in storage.
    #[error("corrupted envelope: its CRC32 is {stored:08x}, its bytes give {computed:08x}")]
    Checksum {
        /// The CRC32 the envelope carries.
        stored: u32,
        /// The CRC32 of the bytes it covers.
        computed: u32,
    },
    /// A codec byte this version does not know.
    #[error("unknown codec {id} in the header")]
    UnknownCodec {
        /// The codec byte.
        id: u8,
    },
    /// Flags this version does not know, which may change how the rest reads.
    #[error("unknown flags {flags:#06x} in the header")]
    UnknownFlags {
        /// The flags field.
        flags: u16,
    },
    /// An envelope of one plain message (`FLAG_MESSAGE`) that is not one claim check or
    /// one inline body with its trace context.
    #[error(
        "a plain message's envelope (flag 0x0001) must be one claim check or one inline body with a trace context, got {count} item(s) or an inline body without one"
    )]
    BadMessage {
        /// Its item count.
        count: u32,
    },
    /// More items than the consumer accepts.
    #[error("{count} items, over the limit of {limit}")]
    TooManyItems {
        /// The header's item count.
        count: u32,
        /// The limit.
        limit: u32,
    },
    /// Items that would take more memory, decoded, than the consumer accepts.
    #[error("the items take {declared} bytes decoded, over the limit of {limit}")]
    DecodedTooLarge {
        /// The header's decoded length.
        declared: u64,
        /// The limit in bytes.
        limit: usize,
    },
    /// A count no section of that length can hold.
    #[error("{count} items cannot fit in {declared} bytes (each takes at least {} bytes)", MIN_ITEM_BYTES)]
    ImpossibleCount {
        /// The header's item count.
        count: u32,
        /// The header's decoded length.
        declared: usize,
    },
    /// The compressed section inflates past the length its header declares.
    #[error("decompression bomb: the {codec} section inflates past its declared {declared} bytes")]
    Bomb {
        /// The section's codec.
        codec: Codec,
        /// The header's decoded length.
        declared: usize,
    },
    /// The section comes to another length than the header declares.
    #[error("the {codec} section comes to {actual} bytes, its header says {declared}")]
    SectionLength {
        /// The section's codec.
        codec: Codec,
        /// The header's decoded length.
        declared: usize,
        /// What the section gave.
        actual: usize,
    },
    /// The codec refused the section.
    #[error("the {codec} section does not decompress: {reason}")]
    Decompress {
        /// The section's codec.
        codec: Codec,
        /// The codec's words.
        reason: String,
    },
    /// An item's fields or body run past the end of the section.
    #[error("item {index} of {count}: it needs {needed} more bytes, {remaining} are left")]
    ItemPastEnd {
        /// The item's index, from 0.
        index: u32,
        /// The header's item count.
        count: u32,
        /// The bytes its next field calls for.
        needed: u64,
        /// The bytes left in the section.
        remaining: usize,
    },
    /// An item that does not read as one.
    #[error("item {index}: {reason}")]
    BadItem {
        /// The item's index, from 0.
        index: u32,
        /// What is wrong.
        reason: String,
    },
    /// Bytes left in the section after the last item.
    #[error("{extra} bytes after the last of {count} items")]
    ExtraBytes {
        /// The header's item count.
        count: u32,
        /// Bytes left over.
        extra: usize,
    },
    /// A claim check that points where this consumer may not read.
    #[error("item {index}: claim check {reference} is not allowed here ({allowed})")]
    ReferenceNotAllowed {
        /// The item's index, from 0.
        index: u32,
        /// Where it points.
        reference: String,
        /// What this consumer allows.
        allowed: String,
    },
    /// Message text that starts like a base64 envelope but is not base64.
    #[error("the message text starts like a base64 envelope but does not decode: {reason}")]
    NotBase64 {
        /// The decoder's words.
        reason: String,
    },
}
