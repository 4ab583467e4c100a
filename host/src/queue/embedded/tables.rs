//! The tables: `messages (queue, seq) → record`, the index `visible (queue, visible_at_ms,
//! seq)`, queue ids by name, message counts by queue, and meta values.

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

pub(super) const QUEUES: TableDefinition<&str, u32> = TableDefinition::new("queues");
pub(super) const MESSAGES: TableDefinition<(u32, u64), &[u8]> = TableDefinition::new("messages");
pub(super) const VISIBLE: TableDefinition<(u32, u64, u64), ()> = TableDefinition::new("visible");
pub(super) const COUNTS: TableDefinition<u32, u64> = TableDefinition::new("counts");
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

pub(super) struct Tables<'t> {
    pub(super) queues: Table<'t, &'static str, u32>,
    pub(super) messages: Table<'t, (u32, u64), &'static [u8]>,
    pub(super) visible: Table<'t, (u32, u64, u64), ()>,
    pub(super) counts: Table<'t, u32, u64>,
}

pub(super) fn open_tables(txn: &WriteTransaction) -> anyhow::Result<Tables<'_>> {
    Ok(Tables { queues: txn.open_table(QUEUES)?, messages: txn.open_table(MESSAGES)?, visible: txn.open_table(VISIBLE)?, counts: txn.open_table(COUNTS)? })
}

pub(super) fn add_count(counts: &mut Table<'_, u32, u64>, queue: u32, delta: i64) -> anyhow::Result<()> {
    let current = counts.get(queue)?.map_or(0, |v| v.value());
    counts.insert(queue, current.saturating_add_signed(delta))?;
    Ok(())
}
