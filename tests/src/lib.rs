//! Shared helpers for the end-to-end tests in `tests/all`.

pub mod baselines;
pub mod conformance;

/// Paths of the rule components built by `build.rs`, one constant per guest.
pub mod guests {
    include!(concat!(env!("OUT_DIR"), "/guests.rs"));
}

/// A component with an extra custom section: the same rule, a different sha256.
pub fn version_of(bytes: &[u8], version: u64) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let name = b"ebb-test-version";
    let mut content = Vec::new();
    leb(name.len(), &mut content);
    content.extend_from_slice(name);
    content.extend_from_slice(&version.to_le_bytes());
    let mut out = bytes.to_vec();
    out.push(0);
    leb(content.len(), &mut out);
    out.extend_from_slice(&content);
    out
}
