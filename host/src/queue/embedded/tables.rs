//! The tables: each message's small record `headers (queue, seq)`, its body written once
//! (`bodies (queue, seq)`, and `body_pages (queue, seq, part)` for the page-sized parts of a
//! long body), the index `visible (queue, visible_at_ms, seq)`, queue ids by name, message
//! counts by queue, meta values, and claim-check bodies (`claims`, `claim_parts`).

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

pub(super) const QUEUES: TableDefinition<&str, u32> = TableDefinition::new("queues");
pub(super) const HEADERS: TableDefinition<(u32, u64), &[u8]> = TableDefinition::new("headers");
pub(super) const BODIES: TableDefinition<(u32, u64), &[u8]> = TableDefinition::new("bodies");
pub(super) const BODY_PAGES: TableDefinition<(u32, u64, u32), &[u8]> = TableDefinition::new("body_pages");
pub(super) const VISIBLE: TableDefinition<(u32, u64, u64), ()> = TableDefinition::new("visible");
pub(super) const COUNTS: TableDefinition<u32, u64> = TableDefinition::new("counts");
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Claim-check bodies (`claims`): each body's record by `(queue, key)`, its bytes in
/// page-sized parts by `(queue, key, part)`.
pub(super) const CLAIMS: TableDefinition<(u32, u64), &[u8]> = TableDefinition::new("claims");
pub(super) const CLAIM_PARTS: TableDefinition<(u32, u64, u32), &[u8]> = TableDefinition::new("claim_parts");

pub(super) struct Tables<'t> {
    pub(super) queues: Table<'t, &'static str, u32>,
    pub(super) headers: Table<'t, (u32, u64), &'static [u8]>,
    pub(super) bodies: Table<'t, (u32, u64), &'static [u8]>,
    pub(super) body_pages: Table<'t, (u32, u64, u32), &'static [u8]>,
    pub(super) visible: Table<'t, (u32, u64, u64), ()>,
    pub(super) counts: Table<'t, u32, u64>,
    pub(super) claims: Table<'t, (u32, u64), &'static [u8]>,
    pub(super) claim_parts: Table<'t, (u32, u64, u32), &'static [u8]>,
    /// Changes to `counts` made by this transaction's ops, written once by
    /// [`Tables::write_counts`]: a count rewritten at every put and delete cost two B-tree
    /// operations per message.
    count_changes: Vec<(u32, i64)>,
}

pub(super) fn open_tables(txn: &WriteTransaction) -> anyhow::Result<Tables<'_>> {
    Ok(Tables {
        queues: txn.open_table(QUEUES)?,
        headers: txn.open_table(HEADERS)?,
        bodies: txn.open_table(BODIES)?,
        body_pages: txn.open_table(BODY_PAGES)?,
        visible: txn.open_table(VISIBLE)?,
        counts: txn.open_table(COUNTS)?,
        claims: txn.open_table(CLAIMS)?,
        claim_parts: txn.open_table(CLAIM_PARTS)?,
        count_changes: Vec::new(),
    })
}

impl Tables<'_> {
    /// Adds `delta` to `queue`'s message count when the transaction's counts are written.
    pub(super) fn add_count(&mut self, queue: u32, delta: i64) {
        match self.count_changes.iter_mut().find(|(q, _)| *q == queue) {
            Some((_, total)) => *total = total.saturating_add(delta),
            None => self.count_changes.push((queue, delta)),
        }
    }

    /// Writes the counts changed since the last call; before the transaction commits.
    pub(super) fn write_counts(&mut self) -> anyhow::Result<()> {
        for (queue, delta) in std::mem::take(&mut self.count_changes) {
            if delta != 0 {
                let current = self.counts.get(queue)?.map_or(0, |v| v.value());
                self.counts.insert(queue, current.saturating_add_signed(delta))?;
            }
        }
        Ok(())
    }
}
