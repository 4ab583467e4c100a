//! Opening the store's file: refusing one that is damaged or in use, creating the tables,
//! and migrating records to the current format.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, anyhow};
use redb::{Database, DatabaseError, ReadableTable, StorageError, TableDefinition, WriteTransaction};

use super::bodies;
use super::record::{Header, checksum};
use super::tables::{META, open_tables};
use crate::panics::{panic_message, quietly};

/// Opens the database in a file, initialising it if the file is empty: at start, and again
/// after a failed commit (only ever on a file [`open_database`] has checked), and to create
/// a new store in a fresh file. With `true`, the open runs redb's integrity check (at start).
pub(super) type Opener = Arc<dyn Fn(&Path, bool) -> Result<Database, DatabaseError> + Send + Sync>;

/// Record format: 1 had no body checksum; 2 had one, and kept each message's header and body
/// together (every lease rewrote the body); 3 keeps them apart. Older stores are migrated at open.
const FORMAT: u64 = 3;

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
        let db = opener(&fresh, false)?;
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
pub(crate) fn check_store(dir: &Path) -> anyhow::Result<()> {
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
///
/// With `check_pages` (at start), the open runs redb's integrity check: every page of the
/// committed trees against the checksum its parent keeps, before anything is written. A plain
/// open trusts a file that was closed cleanly, so pages damaged inside it (overwritten,
/// zeroed) showed only when a get or a commit reached them, as a panic in the writer after
/// the host had reported ready. The check reads the whole file (see docs/reference/config.md for what
/// it costs); a reopen after a failed commit skips it (the file was checked at start).
pub(super) fn open_database(opener: &Opener, file: &Path, check_pages: bool) -> anyhow::Result<(Arc<Database>, u64)> {
    check_store_file(file)?;
    let started = Instant::now();
    let opened = match quietly(|| opener(file, check_pages)) {
        Ok(opened) => opened,
        Err(panic) => return Err(refused(file, &format!("reading it failed: {}", panic_message(&*panic)))),
    };
    let db = match opened {
        Ok(db) => db,
        Err(DatabaseError::DatabaseAlreadyOpen) => return Err(InUse(file.parent().unwrap_or(file).to_path_buf()).into()),
        // redb reports some damage (a wrong magic number) as invalid data.
        Err(DatabaseError::Storage(StorageError::Io(error))) if matches!(error.kind(), ErrorKind::InvalidData | ErrorKind::UnexpectedEof) => {
            return Err(refused(file, &format!("reading it failed: {error}")));
        }
        Err(DatabaseError::Storage(StorageError::Io(error))) => {
            return Err(anyhow!(error)).with_context(|| format!("failed to open queue store {}", file.display()));
        }
        Err(DatabaseError::Storage(StorageError::Corrupted(error))) => {
            return Err(refused(file, &format!("its pages failed redb's integrity check: {error}")));
        }
        Err(error) => return Err(refused(file, &format!("opening it failed: {error}"))),
    };
    if check_pages {
        tracing::debug!(file = %file.display(), elapsed_ms = started.elapsed().as_millis(), "queue store opened, its pages checked");
    }
    let next_seq = match quietly(|| prepare(&db)) {
        Ok(prepared) => prepared.with_context(|| format!("failed to prepare queue store {}", file.display()))?,
        Err(panic) => return Err(refused(file, &format!("reading it failed: {}", panic_message(&*panic)))),
    };
    Ok((Arc::new(db), next_seq))
}

/// The error of a data directory whose store another process holds open.
#[derive(Debug)]
pub(super) struct InUse(PathBuf);

impl std::fmt::Display for InUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "data directory {} is in use by another ebb process (one process owns a data directory)", self.0.display())
    }
}

impl std::error::Error for InUse {}

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
    let (next_seq, format) = {
        let meta = txn.open_table(META)?;
        let next_seq = meta.get("next_seq")?.map_or(1, |v| v.value());
        (next_seq, meta.get("format")?.map(|v| v.value()))
    };
    match format {
        Some(FORMAT) => drop(open_tables(&txn)?),
        Some(newer) if newer > FORMAT => anyhow::bail!("its records are in format {newer}, written by a newer ebb (this one reads up to {FORMAT})"),
        // A store without a format is new, or from before formats were recorded (format 1).
        Some(2) => migrate(&txn, 2)?,
        _ => migrate(&txn, 1)?,
    }
    txn.commit()?;
    Ok(next_seq)
}

/// Where formats 1 and 2 kept each message: its header, then its body, rewritten together at
/// every change of its lease.
const OLD_MESSAGES: TableDefinition<(u32, u64), &[u8]> = TableDefinition::new("messages");

/// Moves every message of a format-1 or format-2 store into the current tables, keeping its
/// visibility, receipt and dequeue count (the `visible` index and the counts stay as they
/// are), and records the current format. One transaction: a crash leaves the old store.
fn migrate(txn: &WriteTransaction, old_format: u64) -> anyhow::Result<()> {
    let mut migrated = 0u64;
    {
        let mut tables = open_tables(txn)?;
        let old = txn.open_table(OLD_MESSAGES)?;
        for entry in old.iter()? {
            let (key, value) = entry?;
            let (queue, seq) = key.value();
            let stored = value.value();
            match old_header(stored, old_format) {
                Some((header, body)) => {
                    tables.headers.insert((queue, seq), header.encode().as_slice())?;
                    bodies::write(&mut tables, queue, seq, body)?;
                }
                // Too short for its header (a damaged file): kept as a header that is not one,
                // so a get reports it corrupt, with its bytes as the body for the poison queue.
                None => {
                    tables.headers.insert((queue, seq), stored)?;
                    bodies::write(&mut tables, queue, seq, stored)?;
                }
            }
            migrated += 1;
        }
    }
    txn.delete_table(OLD_MESSAGES)?;
    txn.open_table(META)?.insert("format", FORMAT)?;
    if migrated > 0 {
        tracing::info!(messages = migrated, "queue store migrated from record format {old_format} to {FORMAT} (headers apart from bodies)");
    }
    Ok(())
}

/// The header and body of a format-1 record (a 28-byte header without a body checksum) or a
/// format-2 one (32 bytes, with it), or `None` if it is too short to hold its header.
fn old_header(stored: &[u8], old_format: u64) -> Option<(Header, &[u8])> {
    let header_bytes = if old_format == 1 { 28 } else { 32 };
    let (head, body) = stored.split_at_checked(header_bytes)?;
    let u64_at = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().unwrap());
    let u32_at = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().unwrap());
    let header = Header {
        visible_at_ms: u64_at(0),
        inserted_at_ms: u64_at(8),
        receipt: u64_at(16),
        dequeue_count: u32_at(24),
        body_checksum: if old_format == 1 { checksum(body) } else { u32_at(28) },
        // Bodies were under the put's limit, far below 4 GiB.
        body_len: u32::try_from(body.len()).ok()?,
    };
    Some((header, body))
}
