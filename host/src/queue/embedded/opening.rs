//! Opening the store's file: refusing one that is damaged or in use, creating the tables,
//! and migrating records to the current format.

use std::io::ErrorKind;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, anyhow};
use redb::{Database, DatabaseError, ReadableTable, StorageError, Table};

use super::record::{HEADER_BYTES, checksum};
use super::store::Opener;
use super::tables::{COUNTS, MESSAGES, META, QUEUES, VISIBLE};
use crate::panics::{panic_message, quietly};

/// Record format: 1 had no body checksum (its records are migrated at open), 2 has one.
const FORMAT: u64 = 2;

/// Opens the database and prepares it (tables, record format), naming the file and what
/// to do when it cannot. A damaged file can make redb panic: that is an error here too.
pub(super) fn open_database(opener: &Opener, file: &Path) -> anyhow::Result<(Arc<Database>, u64)> {
    let opened = match quietly(|| opener()) {
        Ok(opened) => opened,
        Err(panic) => return Err(anyhow!("reading it failed: {}", panic_message(&*panic))).with_context(|| damaged(file)),
    };
    let db = match opened {
        Ok(db) => db,
        Err(DatabaseError::DatabaseAlreadyOpen) => {
            anyhow::bail!("data directory {} is in use by another ebb process (one process owns a data directory)", file.parent().unwrap_or(file).display())
        }
        // redb reports some damage (a wrong magic number) as invalid data.
        Err(DatabaseError::Storage(StorageError::Io(error))) if matches!(error.kind(), ErrorKind::InvalidData | ErrorKind::UnexpectedEof) => {
            return Err(anyhow!(error)).with_context(|| damaged(file));
        }
        Err(DatabaseError::Storage(StorageError::Io(error))) => {
            return Err(anyhow!(error)).with_context(|| format!("failed to open queue store {}", file.display()));
        }
        Err(error) => return Err(anyhow!(error)).with_context(|| damaged(file)),
    };
    let next_seq = match quietly(|| prepare(&db)) {
        Ok(prepared) => prepared.with_context(|| format!("failed to prepare queue store {}", file.display()))?,
        Err(panic) => return Err(anyhow!("reading it failed: {}", panic_message(&*panic))).with_context(|| damaged(file)),
    };
    Ok((Arc::new(db), next_seq))
}

fn damaged(file: &Path) -> String {
    format!(
        "queue store {} is damaged and cannot be opened; stop ebb, move the file aside (keep it for recovery) \
         and start again with an empty store, or restore it from a backup",
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
