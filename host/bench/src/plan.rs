//! What `ebb bench http` runs (body sizes, concurrencies, contenders, rounds) and what it
//! gathers for the report: each cell's runs.

use anyhow::bail;

use crate::contenders::{Contender, Run};

/// Most bytes one store of the bench may hold (messages × body), so that a typo in a flag
/// does not fill the disk.
pub(crate) const MAX_STORE_BYTES: u64 = 2 << 30;

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct HttpBench {
    /// Body sizes in bytes, in the order given, without repeats.
    pub(crate) sizes: Vec<u32>,
    /// Concurrencies (T), likewise.
    pub(crate) concurrency: Vec<u32>,
    /// Messages per run of the reqwest loop and of ebb.
    pub(crate) messages: u64,
    /// Messages per run of the redb loop (its two durable commits per message make it slow;
    /// its rate hardly depends on the count).
    pub(crate) redb_messages: u64,
    pub(crate) rounds: u32,
    /// Which contenders run, in the order each round runs them (all by default; fewer to
    /// profile one of them).
    pub(crate) contenders: Vec<Contender>,
}

impl HttpBench {
    /// Refuses a combination the flags' own ranges let through: a store too large.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        let largest = u64::from(self.sizes.iter().copied().max().unwrap_or(0));
        let bytes = self.messages.max(self.redb_messages) * largest;
        if bytes > MAX_STORE_BYTES {
            bail!(
                "--messages {} × a body of {largest} bytes is {:.1} GiB per store; at most {} GiB: fewer messages or a smaller size",
                self.messages.max(self.redb_messages),
                bytes as f64 / f64::from(1 << 30),
                MAX_STORE_BYTES >> 30
            );
        }
        if self.sizes.is_empty() || self.concurrency.is_empty() || self.contenders.is_empty() {
            bail!("--sizes, --concurrency and --contenders each need at least one value");
        }
        Ok(())
    }
}

/// One body size at one concurrency: every contender's runs, in round order.
#[derive(Debug)]
pub(crate) struct Cell {
    pub(crate) body_bytes: u32,
    pub(crate) concurrency: u32,
    pub(crate) runs: Vec<(Contender, Vec<Run>)>,
}
