//! Files the host and the command line write whole: never seen half-written.

use std::path::Path;

/// Writes `bytes` to `file` through a temporary file in the same folder, synced and renamed
/// over it: a reader (or a crash) sees the old content or the new, never a part.
pub fn write_atomically(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let mut temp = tempfile::NamedTempFile::new_in(dir)?;
    temp.write_all(bytes)?;
    temp.as_file().sync_all()?;
    temp.persist(file).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()
}
