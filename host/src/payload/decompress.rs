//! An envelope's item section decompressed within a bound.
//!
//! Every decoder writes into a buffer sized from the length the header declares (already
//! checked against the limit), never one that grows with the input: a compression bomb
//! fills the buffer and is refused, it cannot make the decoder allocate more.

use super::codec::Codec;
use super::error::EnvelopeError;

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
