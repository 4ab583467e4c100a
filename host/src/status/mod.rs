//! What `GET /status` answers, as types: the host serialises a [`HostStatus`], `ebb status`
//! reads one back, and so can an embedder or a test (`serde_json::from_slice::<HostStatus>`).
//!
//! The wire form is JSON, times in RFC 3339. A reader ignores the fields it does not know,
//! so an older `ebb status` reads a newer host; and most records take a missing field as its
//! default (0, `null`, empty), so a newer one reads an older host. `example.json` beside this
//! file is a full answer, every optional part filled: a test reads it and writes it back
//! unchanged, so a field renamed, added or removed is seen (update the example with it, and
//! the console, `host/src/http/console/`, and `deploy/grafana/` if they read it).

use std::ops::Deref;

use serde::{Deserialize, Serialize};

pub use crate::bus::BusStatus;
pub use crate::cost::CostStatus;
pub use crate::listener::{DecisionWithInputs, ListenerStatus, Pause, PoisonForm, PoisonRecord, RecordedDecision, TaskCountInputs};
pub use crate::payload::claims::S3RequestCounts;
pub use crate::queue::{CallSnapshot, FailureClass, FailureCount, KindCount, LastFailure, TransactionCounts, TransactionRates, UnansweredCounts};
pub use crate::rules::{
    ConsecutiveFaults, Decision, DecisionKind, DecisionSource, Disagreement, Export, Quarantine, RefusedFile, RuleState, RuleStatus, RuleSwap, ShadowCounts,
    ShadowStatus,
};

/// `GET /status`: every queue partition, the sums of each partitioned queue, the host's
/// cost, its bus and its storage calls.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct HostStatus {
    /// One entry per storage queue the host works (each partition of a partitioned queue).
    pub queues: Vec<QueueStatus>,
    /// The sums over each partitioned queue's partitions (empty without one).
    pub partitioned: Vec<PartitionedStatus>,
    /// Every metered queue's cost, summed. Always sent by this host; a reader takes
    /// `null` or no `cost` as none (and shows no total).
    pub cost: Option<CostStatus>,
    /// Push notifications between hosts, if a bus is configured.
    pub bus: Option<BusStatus>,
    /// Storage calls by storage queue (each partition, poison queue and reply queue).
    pub storage: Vec<CallSnapshot>,
    /// The S3 requests of claim checks, by storage queue (only queues that made any),
    /// apart from SQS's transactions and cost.
    pub s3: Vec<S3RequestCounts>,
}

/// One storage queue: its listener's status, and its cost beside it (in the same JSON
/// object). Reads as a [`ListenerStatus`] (`status.queues[0].processed`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct QueueStatus {
    /// What the listener tells of itself.
    #[serde(flatten)]
    pub listener: ListenerStatus,
    /// The queue's cost at its recent transaction rate; `None` when it is not metered.
    #[serde(default)]
    pub cost: Option<CostStatus>,
}

impl Deref for QueueStatus {
    type Target = ListenerStatus;

    fn deref(&self) -> &ListenerStatus {
        &self.listener
    }
}

/// The sums over a partitioned queue's partitions.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PartitionedStatus {
    /// The (logical) queue's name.
    pub queue: String,
    /// Its partitions' storage queues, in order.
    pub partitions: Vec<String>,
    /// The partitions' approximate depths, summed.
    pub approximate_depth: u64,
    /// Dequeue tasks running, over all partitions.
    pub active_tasks: u64,
    /// Messages leased and not yet settled, over all partitions.
    pub in_flight: u64,
    /// Handler calls running, over all partitions.
    pub handler_calls: u64,
    /// Messages handled and deleted.
    pub processed: u64,
    /// Handler failures.
    pub failed: u64,
    /// Messages moved to the poison queues.
    pub poisoned: u64,
    /// The partitions' cost, summed.
    pub cost: CostStatus,
}

impl PartitionedStatus {
    /// The sums of `partitions` (each a partition's status) of the queue `queue`, at
    /// `price` US dollars per 10,000 transactions.
    pub fn of(queue: &str, partitions: &[QueueStatus], price: f64) -> PartitionedStatus {
        let sum = |f: fn(&QueueStatus) -> u64| partitions.iter().map(f).fold(0u64, u64::saturating_add);
        PartitionedStatus {
            queue: queue.to_string(),
            partitions: partitions.iter().map(|p| p.queue.clone()).collect(),
            approximate_depth: sum(|p| p.approximate_depth),
            active_tasks: sum(|p| p.active_tasks.into()),
            in_flight: sum(|p| p.in_flight.into()),
            handler_calls: sum(|p| p.handler_calls.into()),
            processed: sum(|p| p.processed),
            failed: sum(|p| p.failed),
            poisoned: sum(|p| p.poisoned),
            cost: CostStatus::total(partitions.iter().filter_map(|p| p.cost.as_ref()), price),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("example.json");

    /// The wire form cannot drift silently: a full answer (every optional part filled) reads
    /// into the types and writes back the same JSON, so each of its fields is one the types
    /// write, under the same name and of the same type, and the types write no other.
    #[test]
    fn a_full_status_reads_and_writes_back_unchanged() -> anyhow::Result<()> {
        let wire: serde_json::Value = serde_json::from_str(EXAMPLE)?;
        let status: HostStatus = serde_json::from_value(wire.clone())?;
        let written = serde_json::to_value(&status)?;
        assert_eq!(written, wire, "example.json and what HostStatus writes differ");
        Ok(())
    }

    /// An older reader meets a newer host: fields it does not know are skipped, at every level.
    #[test]
    fn fields_a_reader_does_not_know_are_ignored() -> anyhow::Result<()> {
        let mut wire: serde_json::Value = serde_json::from_str(EXAMPLE)?;
        wire["added_later"] = serde_json::json!({"x": 1});
        wire["queues"][0]["added_later"] = serde_json::json!([1, 2]);
        wire["queues"][0]["rule"]["added_later"] = serde_json::json!("x");
        wire["queues"][0]["rule"]["contract"] = serde_json::json!("9.9.9");
        wire["queues"][0]["cost"]["added_later"] = serde_json::json!(1.5);
        wire["storage"][0]["added_later"] = serde_json::json!(null);
        let status: HostStatus = serde_json::from_value(wire)?;
        assert_eq!(status.queues[0].rule.as_ref().and_then(|r| r.contract), Some("9.9.9"));
        assert_eq!(status.queues[0].poisoned, 3);
        Ok(())
    }

    /// A newer reader meets an older host: a counter or record it does not send reads as its
    /// default.
    #[test]
    fn fields_an_older_host_does_not_send_read_as_their_defaults() -> anyhow::Result<()> {
        let old = serde_json::json!({
            "queues": [{"queue": "orders", "processed": 4, "rule": {"file": "a.wasm", "sha256": "ff"}, "transactions": {"puts": 1}}],
            "cost": {"transactions_per_hour": 1.0},
        });
        let status: HostStatus = serde_json::from_value(old)?;
        let queue = &status.queues[0];
        assert_eq!((queue.queue.as_str(), queue.processed, queue.failed, queue.cost), ("orders", 4, 0, None));
        assert_eq!(queue.rule.as_ref().map(|r| (r.state, r.file.as_deref(), r.faults)), Some((RuleState::BuiltIn, Some("a.wasm"), 0)));
        assert_eq!(queue.transactions.map(|t| (t.puts, t.gets_empty)), Some((1, 0)));
        assert!(status.bus.is_none() && status.partitioned.is_empty() && status.storage.is_empty());
        assert_eq!(status.cost.map(|c| (c.transactions_per_hour, c.usd_per_month)), Some((1.0, 0.0)));
        let without_cost: HostStatus = serde_json::from_value(serde_json::json!({"queues": [], "cost": null}))?;
        assert!(without_cost.cost.is_none());
        Ok(())
    }
}
