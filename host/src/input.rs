//! Bounded reads of what the command line is given: a file is read only when it is a regular
//! file (a FIFO would hang, a device such as `/dev/zero` never ends), never past a size cap;
//! stdin is read up to a cap. Every error names the path and the limit.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::Path;

use anyhow::{Context as _, Result, bail};

/// Largest config file, in bytes (1 MiB: thousands of queues).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The bytes of `path`, at most `limit` of them. `what` names the file in errors ("config",
/// "--trace"). Opened without blocking (a FIFO would wait for a writer) and checked on the
/// opened handle, so a path swapped after it was looked at is still caught.
pub fn read_file(what: &str, path: &Path, limit: u64) -> Result<Vec<u8>> {
    let shown = path.display();
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {what} {shown}"))?;
    if let Some(reason) = not_regular(what, path, &meta) {
        bail!("{reason}");
    }
    if meta.len() > limit {
        bail!("{what} {shown} is {} bytes, over the limit of {limit} bytes", meta.len());
    }
    let file = std::fs::File::options().read(true).custom_flags(libc::O_NONBLOCK).open(path).with_context(|| format!("cannot read {what} {shown}"))?;
    let opened = file.metadata().with_context(|| format!("cannot read {what} {shown}"))?;
    if let Some(reason) = not_regular(what, path, &opened) {
        bail!("{reason}");
    }
    read_capped(file, limit)
        .with_context(|| format!("cannot read {what} {shown}"))?
        .ok_or_else(|| anyhow::anyhow!("{what} {shown} is over the limit of {limit} bytes"))
}

/// The text of `path` (see [`read_file`]), which must be UTF-8.
pub fn read_text(what: &str, path: &Path, limit: u64) -> Result<String> {
    String::from_utf8(read_file(what, path, limit)?).map_err(|_| anyhow::anyhow!("{what} {} is not UTF-8 text", path.display()))
}

/// Everything on stdin up to `limit` bytes; more is an error. `what` names the content
/// ("the message").
pub fn read_stdin(what: &str, limit: u64) -> Result<Vec<u8>> {
    read_capped(std::io::stdin().lock(), limit)
        .with_context(|| format!("cannot read {what} from stdin"))?
        .ok_or_else(|| anyhow::anyhow!("{what} on stdin is over the limit of {limit} bytes"))
}

/// At most `limit` bytes of `reader`: `None` when it has more.
fn read_capped(reader: impl Read, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    reader.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}

/// What `meta` describes, in words, when it is not a regular file; `None` for a regular file.
pub(crate) fn file_kind(meta: &std::fs::Metadata) -> Option<&'static str> {
    let kind = meta.file_type();
    Some(if kind.is_file() {
        return None;
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "something else"
    })
}

/// Why `meta` (of `path`) is not a file to read, in words; `None` for a regular file.
fn not_regular(what: &str, path: &Path, meta: &std::fs::Metadata) -> Option<String> {
    let described = file_kind(meta)?;
    let shown = path.display();
    Some(match std::fs::read_link(path) {
        Ok(target) => format!("{what} {shown} is a symbolic link to {}, which is {described}, not a regular file", target.display()),
        Err(_) => format!("{what} {shown} is {described}, not a regular file"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh folder for one test (the library has no tempfile dependency).
    fn folder(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ebb-input-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_file_over_the_limit_is_refused_naming_it_and_the_limit() {
        let dir = folder("big");
        let path = dir.join("big.toml");
        std::fs::write(&path, vec![b'#'; 101]).unwrap();
        let error = format!("{:#}", read_file("config", &path, 100).unwrap_err());
        assert!(error.contains("big.toml") && error.contains("over the limit of 100 bytes"), "{error}");
        assert_eq!(read_file("config", &path, 101).unwrap().len(), 101);
    }

    #[test]
    fn a_device_a_link_to_a_device_a_fifo_and_a_folder_are_refused_at_once() {
        let dir = folder("kinds");
        let link = dir.join("zero.toml");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let fifo = dir.join("fifo.toml");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        for (path, expected) in [
            (Path::new("/dev/zero"), "is a character device, not a regular file"),
            (&link, "is a symbolic link to /dev/zero, which is a character device"),
            (&fifo, "is a FIFO (named pipe), not a regular file"),
            (dir.as_path(), "is a directory, not a regular file"),
        ] {
            let error = format!("{:#}", read_file("config", path, 1 << 20).unwrap_err());
            assert!(error.starts_with(&format!("config {}", path.display())) && error.contains(expected), "{error}");
        }
    }

    #[test]
    fn a_reader_longer_than_the_cap_is_cut_after_one_byte_more() {
        assert_eq!(read_capped(std::io::repeat(0), 10).unwrap(), None);
        assert_eq!(read_capped(&b"0123456789"[..], 10).unwrap().map(|b| b.len()), Some(10));
    }
}
