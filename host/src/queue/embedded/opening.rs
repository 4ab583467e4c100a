//! Opening the store's file: refusing one that is damaged or in use, creating the tables,
//! and migrating records to the current format.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, anyhow};
use redb::{Database, DatabaseError, ReadableTable, StorageError, Table};

use super::record::{HEADER_BYTES, checksum};
use super::store::Opener;
use super::tables::{COUNTS, MESSAGES, META, QUEUES, VISIBLE};
use crate::panics::{panic_message, quietly};

/// Record format: 1 had no body checksum (its records are migrated at open), 2 has one.
const FORMAT: u64 = 2;

/// The first bytes of every redb file.
const REDB_SIGNATURE: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

/// Creates a new, empty store at `file` if no file is there. The store is made in a
/// temporary file beside it and linked into place whole, so a crash while creating it never
/// leaves a partial store file behind (which the next start would refuse).
pub(super) fn create_if_absent(opener: &Opener, file: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(file) {
        Ok(_) => return Ok(()),
        Err(error) if error.kind() == ErrorKind::NotFound => {}
        Err(error) => return Err(anyhow!(error)).with_context(|| format!("failed to read queue store {}", file.display())),
    }
    let mut fresh = file.as_os_str().to_owned();
    fresh.push(".new");
    let fresh = PathBuf::from(fresh);
    let creating = || -> anyhow::Result<()> {
        // A leftover of a creation that crashed: it never held a message.
        match std::fs::remove_file(&fresh) {
            Err(error) if error.kind() != ErrorKind::NotFound => return Err(error.into()),
            _ => {}
        }
        let db = opener(&fresh)?;
        prepare(&db)?;
        db.close()?;
        // A link fails if the name exists: a store file made meanwhile is never replaced.
        match std::fs::hard_link(&fresh, file) {
            Ok(()) => {}
            Err(error) if error.kind() == ErrorKind::AlreadyExists => {}
            // A file system without hard links: the name was free a moment ago.
            Err(_) if !file.exists() => std::fs::rename(&fresh, file)?,
            Err(error) => return Err(error.into()),
        }
        let _ = std::fs::remove_file(&fresh);
        if let Some(dir) = file.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    };
    creating().with_context(|| format!("failed to create queue store {}", file.display()))
}

/// `ebb check`'s question: can a host open the store in `dir`? No file yet is fine (a host
/// creates it); a file that is not a valid store is refused as `ebb run` refuses it. Reads only.
pub fn check_store(dir: &Path) -> anyhow::Result<()> {
    let file = dir.join(super::STORE_FILE);
    match std::fs::symlink_metadata(&file) {
        Err(error) if error.kind() == ErrorKind::NotFound => Ok(()),
        _ => check_store_file(&file),
    }
}

/// Checks, reading only, that `file` is a store this host can open: not empty, a redb file,
/// and one redb can read (or repair, after a crash). Anything else is refused before redb
/// writes a byte to it.
fn check_store_file(file: &Path) -> anyhow::Result<()> {
    let metadata = match std::fs::metadata(file) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == ErrorKind::NotFound => {
            anyhow::bail!("queue store {} has disappeared; restore it from a backup, or stop ebb and start again to begin with an empty store", file.display())
        }
        Err(error) => return Err(anyhow!(error)).with_context(|| format!("failed to read queue store {}", file.display())),
    };
    if !metadata.is_file() {
        return Err(refused(file, "it is not a regular file"));
    }
    if metadata.len() == 0 {
        return Err(refused(file, "it is empty (0 bytes): a crash or a bad copy cut it"));
    }
    let mut head = [0u8; REDB_SIGNATURE.len()];
    let read = std::fs::File::open(file).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head));
    match read {
        Err(error) if error.kind() == ErrorKind::UnexpectedEof => {
            return Err(refused(file, &format!("it is {} bytes, too short to be a store", metadata.len())));
        }
        Err(error) => return Err(anyhow!(error)).with_context(|| format!("failed to read queue store {}", file.display())),
        Ok(()) if head != REDB_SIGNATURE => return Err(refused(file, "it does not begin with a redb store's signature")),
        Ok(()) => {}
    }
    // redb opens read-only without writing; a store a crash left open needs a repair (done
    // by the writable open that follows), anything else it cannot read is damage.
    match quietly(|| Database::builder().open_read_only(file).map(drop)) {
        Ok(Ok(()) | Err(DatabaseError::RepairAborted | DatabaseError::DatabaseAlreadyOpen)) => Ok(()),
        Ok(Err(error)) => Err(refused(file, &format!("reading it failed: {error}"))),
        Err(panic) => Err(refused(file, &format!("reading it failed: {}", panic_message(&*panic)))),
    }
}

/// Checks the file, opens the database and prepares it (tables, record format), naming the
/// file and what to do when it cannot. A damaged file can make redb panic: that is an error
/// here too.
pub(super) fn open_database(opener: &Opener, file: &Path) -> anyhow::Result<(Arc<Database>, u64)> {
    check_store_file(file)?;
    let opened = match quietly(|| opener(file)) {
        Ok(opened) => opened,
        Err(panic) => return Err(refused(file, &format!("reading it failed: {}", panic_message(&*panic)))),
    };
    let db = match opened {
        Ok(db) => db,
        Err(DatabaseError::DatabaseAlreadyOpen) => {
            anyhow::bail!("data directory {} is in use by another ebb process (one process owns a data directory)", file.parent().unwrap_or(file).display())
        }
        // redb reports some damage (a wrong magic number) as invalid data.
        Err(DatabaseError::Storage(StorageError::Io(error))) if matches!(error.kind(), ErrorKind::InvalidData | ErrorKind::UnexpectedEof) => {
            return Err(refused(file, &format!("reading it failed: {error}")));
        }
        Err(DatabaseError::Storage(StorageError::Io(error))) => {
            return Err(anyhow!(error)).with_context(|| format!("failed to open queue store {}", file.display()));
        }
        Err(error) => return Err(refused(file, &format!("opening it failed: {error}"))),
    };
    let next_seq = match quietly(|| prepare(&db)) {
        Ok(prepared) => prepared.with_context(|| format!("failed to prepare queue store {}", file.display()))?,
        Err(panic) => return Err(refused(file, &format!("reading it failed: {}", panic_message(&*panic)))),
    };
    Ok((Arc::new(db), next_seq))
}

/// The error for a store file this host will not open: what is wrong, that the file was
/// left as it is, and the two ways on.
fn refused(file: &Path, why: &str) -> anyhow::Error {
    anyhow!(
        "queue store {} is damaged or not a queue store ({why}); it was left as it is. Restore it from a backup, \
         or stop ebb and move the file aside (keep it for recovery) to start again with an empty store",
        file.display()
    )
}

/// Creates the tables, migrates records to the current format, and returns the next sequence number.
fn prepare(db: &Database) -> anyhow::Result<u64> {
    let txn = db.begin_write()?;
    txn.open_table(QUEUES)?;
    txn.open_table(VISIBLE)?;
    txn.open_table(COUNTS)?;
    let next_seq;
    {
        let mut meta = txn.open_table(META)?;
        next_seq = meta.get("next_seq")?.map_or(1, |v| v.value());
        let format = meta.get("format")?.map(|v| v.value());
        match format {
            Some(FORMAT) => {}
            Some(newer) if newer > FORMAT => anyhow::bail!("its records are in format {newer}, written by a newer ebb (this one reads up to {FORMAT})"),
            _ => {
                add_checksums(&mut txn.open_table(MESSAGES)?)?;
                meta.insert("format", FORMAT)?;
            }
        }
    }
    txn.commit()?;
    Ok(next_seq)
}

/// Rewrites format-1 records (a 28-byte header, no checksum) with a checksum of their body.
fn add_checksums(messages: &mut Table<'_, (u32, u64), &'static [u8]>) -> anyhow::Result<()> {
    const OLD_HEADER_BYTES: usize = 28;
    let mut rewritten = Vec::new();
    for entry in messages.iter()? {
        let (key, value) = entry?;
        let old = value.value();
        // A record too short for the old header stays as it is: a get reports it corrupt.
        if old.len() >= OLD_HEADER_BYTES {
            let body = &old[OLD_HEADER_BYTES..];
            let mut record = Vec::with_capacity(HEADER_BYTES + body.len());
            record.extend_from_slice(&old[..OLD_HEADER_BYTES]);
            record.extend_from_slice(&checksum(body).to_le_bytes());
            record.extend_from_slice(body);
            rewritten.push((key.value(), record));
        }
    }
    for (key, record) in rewritten {
        messages.insert(key, record.as_slice())?;
    }
    Ok(())
}
