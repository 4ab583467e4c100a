//! The envelope's fixed numbers: its magic, version and flags, and the sizes of its header,
//! its trailer and its smallest item (`format.rs` draws the envelope byte by byte).

/// The first bytes of every envelope. `C1` never starts UTF-8 text, so no text message
/// (JSON, XML, plain words) begins with it; `EBB` names the format; CR LF, Ctrl-Z and LF
/// (PNG's trick) show at once a transfer that rewrote line endings or stopped at an
/// end-of-file character.
pub const MAGIC: [u8; 8] = [0xC1, b'E', b'B', b'B', b'\r', b'\n', 0x1A, b'\n'];
/// The version this ebb writes and reads.
pub(crate) const FORMAT_VERSION: u8 = 1;
/// The header's length.
pub(super) const HEADER_BYTES: usize = 24;
/// Flag bit 0: the envelope carries one plain message's body, offloaded (one claim check).
pub(crate) const FLAG_MESSAGE: u16 = 1;
/// The CRC32 after the section.
pub(super) const TRAILER_BYTES: usize = 4;
/// Header and trailer: an envelope's bytes besides its item section.
pub const ENVELOPE_OVERHEAD_BYTES: usize = HEADER_BYTES + TRAILER_BYTES;
/// The smallest item: an empty inline body (kind, attempts, length).
pub const MIN_ITEM_BYTES: usize = 9;
