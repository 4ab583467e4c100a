//! Depth → task-count tables, like the paper's `depth < 100 → 10, < 1000 → 50, else 100`.

use std::fmt;

/// The task count for `depth` from `(depth_below, tasks)` rows in increasing depth: the
/// first row whose bound exceeds the depth decides; a last row with bound `u64::MAX` covers
/// every deeper queue.
pub fn tasks_for(rows: &[(u64, u32)], depth: u64) -> u32 {
    rows.iter().find(|(below, _)| depth < *below || *below == u64::MAX).map_or(0, |(_, tasks)| *tasks)
}

/// A table read at run time, e.g. from a rule parameter such as `"100:10, 1000:50, *:100"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynThresholdTable {
    rows: Vec<(u64, u32)>,
}

impl DynThresholdTable {
    /// The task count for a queue of this depth.
    pub fn tasks_for(&self, depth: u64) -> u32 {
        tasks_for(&self.rows, depth)
    }

    /// Parses `depth:tasks` rows separated by commas, depths strictly increasing, ending with
    /// `*:tasks` for deeper queues. The error says which row is wrong and why.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut rows = Vec::new();
        let mut saw_otherwise = false;
        for (index, row) in text.split(',').map(str::trim).enumerate() {
            let n = index + 1;
            if saw_otherwise {
                return Err(format!("row {n} ({row:?}) follows the final `*:tasks` row"));
            }
            let (depth, tasks) = row.split_once(':').ok_or_else(|| format!("row {n} ({row:?}) is not `depth:tasks`"))?;
            let tasks: u32 = tasks.trim().parse().map_err(|_| format!("row {n} ({row:?}): tasks must be a whole number"))?;
            let depth = match depth.trim() {
                "*" => {
                    saw_otherwise = true;
                    u64::MAX
                }
                d => d.parse().map_err(|_| format!("row {n} ({row:?}): depth must be a whole number or `*`"))?,
            };
            if let Some(&(previous, _)) = rows.last()
                && depth <= previous
            {
                return Err(format!("row {n} ({row:?}): depths must increase"));
            }
            rows.push((depth, tasks));
        }
        if !saw_otherwise {
            return Err("the table must end with a `*:tasks` row for deeper queues".into());
        }
        Ok(DynThresholdTable { rows })
    }
}

impl fmt::Display for DynThresholdTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (depth, tasks)) in self.rows.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            if *depth == u64::MAX { write!(f, "{sep}*:{tasks}")? } else { write!(f, "{sep}{depth}:{tasks}")? }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsed_table_matches_rows() {
        let table = DynThresholdTable::parse("10:1, 500:4,*:32").unwrap();
        assert_eq!([0, 9, 10, 499, 500, u64::MAX].map(|d| table.tasks_for(d)), [1, 1, 4, 4, 32, 32]);
        assert_eq!(table.to_string(), "10:1, 500:4, *:32");
    }

    #[test]
    fn parse_errors_name_the_row() {
        for (text, needle) in [
            ("10:1", "must end with"),
            ("10:x, *:2", "row 1"),
            ("10:1, 5:2, *:3", "row 2 (\"5:2\"): depths must increase"),
            ("*:1, 10:2", "follows the final"),
            ("ten", "not `depth:tasks`"),
        ] {
            let err = DynThresholdTable::parse(text).unwrap_err();
            assert!(err.contains(needle), "{text:?} gave {err:?}");
        }
    }
}
