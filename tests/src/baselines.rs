//! Baselines for the benchmarks: the same work done directly on the store, no ebb.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use redb::{Durability, ReadableTable, TableDefinition};

/// Bodies used by the benchmarks.
pub const BODY: [u8; 64] = [b'x'; 64];
const LEASE_MS: u64 = 60_000;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// The raw table: sequence number → visible-at (8 bytes LE) + body.
pub const RAW: TableDefinition<u64, &[u8]> = TableDefinition::new("raw");

/// A raw redb loop: take 32 visible (a scan from the low-water mark), mark them leased in
/// one commit, delete them in a second.
pub fn raw_redb_processing(depth: usize, processed: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("raw.redb")).unwrap();
    for chunk in (0..depth as u64).collect::<Vec<_>>().chunks(10_000) {
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(RAW).unwrap();
            for seq in chunk {
                table.insert(seq, [&0u64.to_le_bytes()[..], &BODY].concat().as_slice()).unwrap();
            }
        }
        txn.commit().unwrap();
    }
    let target = processed.min(depth);
    let (mut done, mut low_water) = (0, 0u64);
    let started = Instant::now();
    while done < target {
        let mut txn = db.begin_write().unwrap();
        txn.set_durability(Durability::Immediate).unwrap();
        let leased: Vec<u64> = {
            let mut table = txn.open_table(RAW).unwrap();
            let now = now_ms();
            let visible: Vec<(u64, Vec<u8>)> = table
                .range(low_water..)
                .unwrap()
                .map(Result::unwrap)
                .filter(|(_, v)| u64::from_le_bytes(v.value()[..8].try_into().unwrap()) <= now)
                .take(32)
                .map(|(k, v)| (k.value(), v.value().to_vec()))
                .collect();
            for (seq, mut value) in visible.iter().cloned() {
                value[..8].copy_from_slice(&(now + LEASE_MS).to_le_bytes());
                table.insert(seq, value.as_slice()).unwrap();
            }
            visible.into_iter().map(|(k, _)| k).collect()
        };
        txn.commit().unwrap();
        let mut txn = db.begin_write().unwrap();
        txn.set_durability(Durability::Immediate).unwrap();
        {
            let mut table = txn.open_table(RAW).unwrap();
            for seq in &leased {
                table.remove(seq).unwrap();
            }
        }
        txn.commit().unwrap();
        low_water = leased.last().map_or(low_water, |l| l + 1);
        done += leased.len();
    }
    done as f64 / started.elapsed().as_secs_f64()
}
