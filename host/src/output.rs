//! Files the host and the command line write whole: never seen half-written.

use std::path::Path;

/// Writes `bytes` to `file` through a temporary file in the same folder, synced and renamed
/// over it: a reader (or a crash) sees the old content or the new, never a part.
pub fn write_atomically(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt as _;
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let mut temp = tempfile::NamedTempFile::new_in(dir)?;
    // The temporary file is made 0600: the file keeps the mode it had, a new one gets 0644.
    let mode = std::fs::metadata(file).map_or(0o644, |meta| meta.permissions().mode());
    temp.as_file().set_permissions(std::fs::Permissions::from_mode(mode))?;
    temp.write_all(bytes)?;
    temp.as_file().sync_all()?;
    temp.persist(file).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()
}
