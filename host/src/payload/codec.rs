//! How an envelope's item section is compressed (its decompression, within a bound, is
//! `decompress.rs`).

use std::fmt;
use std::str::FromStr;

use anyhow::Context as _;

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

#[cfg(test)]
mod default_tests {
    use super::Codec;

    #[test]
    fn the_default_codec_is_the_one_the_defaults_table_documents() {
        assert_eq!(Codec::default().name(), crate::defaults::COMPRESSION);
    }
}
