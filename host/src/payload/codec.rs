//! How an envelope's item section is compressed, and decompressed within a bound.
//!
//! Every decoder writes into a buffer sized from the length the header declares (already
//! checked against the limit), never one that grows with the input: a compression bomb
//! fills the buffer and is refused, it cannot make the decoder allocate more.

use std::fmt;
use std::str::FromStr;

use anyhow::Context as _;

use super::error::EnvelopeError;

/// The compression of an envelope's item section, chosen per queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// Stored as it is.
    None,
    /// Raw DEFLATE (RFC 1951, no zlib or gzip wrapper), level 6: what Python reads with
    /// its standard library (`zlib.decompressobj(-15)`).
    Deflate,
    /// A Zstandard frame (RFC 8878), level 3.
    Zstd,
    /// One LZ4 block (no frame), whose decoded length is the header's.
    Lz4,
}

/// DEFLATE's level: zlib's default, the usual balance of ratio and speed.
const DEFLATE_LEVEL: u32 = 6;
/// Zstandard's level: the library's default.
const ZSTD_LEVEL: i32 = 3;

impl Codec {
    /// Every codec, in the order of their ids.
    pub const ALL: [Codec; 4] = [Codec::None, Codec::Deflate, Codec::Zstd, Codec::Lz4];

    /// The byte that names the codec in an envelope's header.
    pub fn id(self) -> u8 {
        match self {
            Codec::None => 0,
            Codec::Deflate => 1,
            Codec::Zstd => 2,
            Codec::Lz4 => 3,
        }
    }

    /// The codec a header's byte names, if any.
    pub fn from_id(id: u8) -> Option<Codec> {
        Codec::ALL.into_iter().find(|codec| codec.id() == id)
    }

    /// The codec's name, as the configuration and the docs spell it.
    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Deflate => "deflate",
            Codec::Zstd => "zstd",
            Codec::Lz4 => "lz4",
        }
    }
}

impl Default for Codec {
    /// Zstandard, by `ebb bench codecs` (`docs/reference/envelope.md`): on 1 KiB JSON items it packs
    /// 90 % of deflate's items per envelope for a fifteenth of deflate's CPU, and decodes
    /// twice as fast. Deflate stays for consumers that must read with a standard library.
    fn default() -> Codec {
        Codec::ALL.into_iter().find(|c| c.name() == crate::defaults::COMPRESSION).expect("defaults::COMPRESSION names a codec")
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Codec {
    type Err = anyhow::Error;

    fn from_str(name: &str) -> anyhow::Result<Codec> {
        Codec::ALL.into_iter().find(|codec| codec.name() == name).with_context(|| format!("unknown codec {name:?}: one of none, deflate, zstd, lz4"))
    }
}

/// A codec's compressor, kept across the packer's tries at one envelope: setting up a
/// compressor's tables costs more than compressing a few kilobytes.
pub(super) enum Compressor {
    None,
    Deflate(Box<flate2::Compress>),
    Zstd(zstd::bulk::Compressor<'static>),
    Lz4,
}

impl Compressor {
    pub(super) fn new(codec: Codec) -> anyhow::Result<Compressor> {
        Ok(match codec {
            Codec::None => Compressor::None,
            Codec::Deflate => Compressor::Deflate(Box::new(flate2::Compress::new(flate2::Compression::new(DEFLATE_LEVEL), false))),
            Codec::Zstd => Compressor::Zstd(zstd::bulk::Compressor::new(ZSTD_LEVEL).context("zstd compressor")?),
            Codec::Lz4 => Compressor::Lz4,
        })
    }

    /// Appends `section`, compressed, to `out`.
    pub(super) fn compress(&mut self, section: &[u8], out: &mut Vec<u8>) -> anyhow::Result<()> {
        match self {
            Compressor::None => out.extend_from_slice(section),
            Compressor::Deflate(deflate) => {
                deflate.reset();
                out.reserve(section.len() + section.len() / 64 + 64);
                loop {
                    let consumed = usize::try_from(deflate.total_in()).context("deflate input length")?;
                    match deflate.compress_vec(&section[consumed..], out, flate2::FlushCompress::Finish).context("deflate")? {
                        flate2::Status::StreamEnd => break,
                        // The output is full: room for more, then go on.
                        flate2::Status::Ok | flate2::Status::BufError => out.reserve(out.capacity().max(64)),
                    }
                }
            }
            Compressor::Zstd(zstd) => out.extend_from_slice(&zstd.compress(section).context("zstd")?),
            Compressor::Lz4 => out.extend_from_slice(&lz4_flex::block::compress(section)),
        }
        Ok(())
    }
}

/// The item section `stored` with `codec`, which must come to exactly `declared` bytes.
/// Allocates `declared` bytes (plus one, to see a stream that would go on), nothing that
/// depends on what the stream says.
pub(super) fn decompress(codec: Codec, stored: &[u8], declared: usize) -> Result<Vec<u8>, EnvelopeError> {
    let short = |actual: usize| EnvelopeError::SectionLength { codec, declared, actual };
    let bomb = || EnvelopeError::Bomb { codec, declared };
    let failed = |reason: String| EnvelopeError::Decompress { codec, reason };
    match codec {
        Codec::None if stored.len() == declared => Ok(stored.to_vec()),
        Codec::None => Err(short(stored.len())),
        Codec::Deflate => {
            let mut out = Vec::with_capacity(declared + 1);
            let mut inflate = flate2::Decompress::new(false);
            let status = inflate.decompress_vec(stored, &mut out, flate2::FlushDecompress::Finish).map_err(|e| failed(e.to_string()))?;
            if out.len() > declared {
                return Err(bomb());
            }
            if status != flate2::Status::StreamEnd {
                return Err(failed(format!("the stream stops after {} bytes, before its final block", out.len())));
            }
            // The stream ended: what the input holds past its end is not part of it.
            let consumed = usize::try_from(inflate.total_in()).unwrap_or(usize::MAX);
            if consumed != stored.len() {
                return Err(failed(format!("{} bytes follow the end of the stream", stored.len().saturating_sub(consumed))));
            }
            if out.len() != declared {
                return Err(short(out.len()));
            }
            Ok(out)
        }
        Codec::Zstd => {
            // Decompressing in one call writes straight into `out`: zstd needs no window
            // buffer of the frame's (attacker-chosen) window size.
            let mut out = Vec::with_capacity(declared + 1);
            let mut zstd = zstd::bulk::Decompressor::new().map_err(|e| failed(e.to_string()))?;
            match zstd.decompress_to_buffer(stored, &mut out) {
                Ok(written) if written > declared => Err(bomb()),
                Ok(written) if written < declared => Err(short(written)),
                Ok(_) => Ok(out),
                Err(error) if is_zstd_output_full(&error) => Err(bomb()),
                Err(error) => Err(failed(error.to_string())),
            }
        }
        Codec::Lz4 => {
            let mut out = vec![0; declared];
            match lz4_flex::block::decompress_into(stored, &mut out) {
                Ok(written) if written == declared => Ok(out),
                Ok(written) => Err(short(written)),
                Err(lz4_flex::block::DecompressError::OutputTooSmall { .. }) => Err(bomb()),
                Err(error) => Err(failed(error.to_string())),
            }
        }
    }
}

/// Whether zstd stopped because the output buffer was full: the frame decodes to more than
/// was declared.
fn is_zstd_output_full(error: &std::io::Error) -> bool {
    use zstd::zstd_safe::zstd_sys::ZSTD_ErrorCode;
    error.get_ref().and_then(|e| e.downcast_ref::<zstd::Error>()).is_some_and(|e| e.is(ZSTD_ErrorCode::ZSTD_error_dstSize_tooSmall))
}

#[cfg(test)]
mod default_tests {
    use super::Codec;

    #[test]
    fn the_default_codec_is_the_one_the_defaults_table_documents() {
        assert_eq!(Codec::default().name(), crate::defaults::COMPRESSION);
    }
}
