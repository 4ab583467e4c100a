//! Reading a rule file: regular files only, bounded, never blocking.

use std::path::Path;

use anyhow::{Context as _, Result, bail};

pub(super) fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// Reads a rule file: `None` if nothing is there, an error with the real reason if
/// something is there but cannot be read (a directory, a dangling or looping link, no
/// permission, too large, or anything else that is not a regular file: a FIFO, a device,
/// a socket, or a link to one).
///
/// Never blocks and never reads more than `max_bytes + 1` bytes: the file is opened with
/// `O_NONBLOCK` (opening a FIFO would otherwise wait for a writer), checked again with
/// `fstat` on the opened handle (the path may have been replaced since it was looked at),
/// and read through a bound (a device's reported size says nothing of what it yields).
pub(crate) fn read_rule_file(path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;

    let shown = path.display();
    let link = match std::fs::symlink_metadata(path) {
        Ok(link) => link,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => bail!("cannot read rule file {shown}: {e}"),
    };
    let target = || std::fs::read_link(path).map(|t| t.display().to_string()).unwrap_or_default();
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if link.file_type().is_symlink() && e.kind() == std::io::ErrorKind::NotFound => {
            bail!("rule file {shown} is a symbolic link to {}, which does not exist", target())
        }
        Err(e) => bail!("cannot read rule file {shown}: {e}"),
    };
    if meta.is_dir() {
        bail!("rule file {shown} is a directory, not a file");
    }
    let not_regular = |meta: &std::fs::Metadata| -> Option<String> {
        let kind = crate::input::file_kind(meta)?;
        Some(if link.file_type().is_symlink() {
            format!("rule file {shown} is a symbolic link to {}, which is {kind}, not a regular file", target())
        } else {
            format!("rule file {shown} is {kind}, not a regular file")
        })
    };
    if let Some(reason) = not_regular(&meta) {
        bail!("{reason}");
    }
    if meta.len() > max_bytes {
        bail!("rule {} is {} bytes, over the limit of {max_bytes} bytes", file_name(path), meta.len());
    }
    let file = match std::fs::File::options().read(true).custom_flags(libc::O_NONBLOCK).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => bail!("cannot read rule file {shown}: {e}"),
    };
    // The path may name something else by now: what counts is what was opened.
    let opened = file.metadata().with_context(|| format!("cannot read rule file {shown}"))?;
    if let Some(reason) = not_regular(&opened) {
        bail!("{reason}");
    }
    let mut bytes = Vec::with_capacity(opened.len().min(max_bytes) as usize);
    file.take(max_bytes.saturating_add(1)).read_to_end(&mut bytes).with_context(|| format!("cannot read rule file {shown}"))?;
    if bytes.len() as u64 > max_bytes {
        bail!("rule {} is over the limit of {max_bytes} bytes", file_name(path));
    }
    Ok(Some(bytes))
}
