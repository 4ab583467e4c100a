//! The storage figures of `/metrics` and `/status`: failed calls by storage queue (each
//! partition, poison queue and reply queue), kind and class,
//! retries, calls given up, deletes found already done, and how old each queue's last
//! answer and depth figure are. Read from the [`CallRecord`]s the queue clients keep; the
//! claim-check calls (large bodies in their own store) from the queues' [`ClaimRecords`].

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::SystemTime;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::listener::ListenerStatus;
use crate::payload::claims::{ClaimCall, ClaimRecords, S3Operation, S3RequestCounts};
use crate::queue::{CallKind, CallRecord, CallSnapshot, FailureClass, QueueClient};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabel {
    queue: String,
    kind: &'static str,
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    queue: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimLabel {
    queue: String,
    call: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct S3Label {
    queue: String,
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

/// The call records of `queues` (every partition of a partitioned queue, and each poison
/// and reply queue given), each once.
pub fn call_records<'a>(queues: impl IntoIterator<Item = &'a Arc<dyn QueueClient>>) -> Vec<Arc<CallRecord>> {
    let mut records: Vec<Arc<CallRecord>> = Vec::new();
    for record in queues.into_iter().flat_map(|q| q.call_records()) {
        if !records.iter().any(|r| Arc::ptr_eq(r, &record)) {
            records.push(record);
        }
    }
    records
}

/// Adds the storage series to `registry`: from the call records of `queues`, and the age of
/// each listener's depth figure (beside `ebb_queue_depth`).
pub fn register<'a, 'b>(
    registry: &mut Registry,
    queues: impl IntoIterator<Item = &'a Arc<dyn QueueClient>>,
    statuses: impl IntoIterator<Item = &'b ListenerStatus>,
) {
    let failures = Family::<FailureLabel, Counter>::default();
    registry.register(
        "storage_failures",
        "Failed storage call attempts by kind (get, put, delete, update, count, create) and class (throttled, timeout, connection, auth, other, missing)",
        failures.clone(),
    );
    let retries = Family::<KindLabel, Counter>::default();
    registry.register("storage_retries", "Storage calls tried again after a transient failure, by kind", retries.clone());
    let gave_up = Family::<KindLabel, Counter>::default();
    registry.register("storage_gave_up", "Storage calls that failed for good (not worth retrying, or out of attempts), by kind", gave_up.clone());
    let already_done = Family::<QueueLabel, Counter>::default();
    registry.register(
        "storage_already_done",
        "Deletes whose retry found the message gone after an attempt that may have reached the service: done by that attempt",
        already_done.clone(),
    );
    let recreated = Family::<QueueLabel, Counter>::default();
    registry.register("storage_recreated", "Times the queue was found missing (deleted while the host ran) and created again", recreated.clone());
    let last_success = Family::<QueueLabel, Gauge<f64, AtomicU64>>::default();
    registry.register("storage_last_success_age_seconds", "Seconds since the storage last answered a call of the queue", last_success.clone());
    let depth_age = Family::<QueueLabel, Gauge<f64, AtomicU64>>::default();
    registry.register("queue_depth_age_seconds", "Seconds since the figure in ebb_queue_depth was measured", depth_age.clone());

    for snapshot in status(queues) {
        let queue = snapshot.queue.clone();
        for kind in CallKind::ALL {
            for class in FailureClass::ALL {
                failures
                    .get_or_create(&FailureLabel { queue: queue.clone(), kind: kind.as_str(), class: class.as_str() })
                    .inc_by(snapshot.failures_of(kind, class));
            }
            retries.get_or_create(&KindLabel { queue: queue.clone(), kind: kind.as_str() }).inc_by(snapshot.retries_of(kind));
            gave_up.get_or_create(&KindLabel { queue: queue.clone(), kind: kind.as_str() }).inc_by(snapshot.gave_up_of(kind));
        }
        already_done.get_or_create(&QueueLabel { queue: queue.clone() }).inc_by(snapshot.already_done);
        recreated.get_or_create(&QueueLabel { queue: queue.clone() }).inc_by(snapshot.recreated);
        if let Some(age) = snapshot.last_success_age_secs {
            last_success.get_or_create(&QueueLabel { queue }).set(age);
        }
    }
    let now = SystemTime::now();
    for status in statuses {
        if let Some(at) = status.depth_as_of {
            let age = now.duration_since(at).unwrap_or_default().as_secs_f64();
            depth_age.get_or_create(&QueueLabel { queue: status.queue.clone() }).set(age);
        }
    }
}

/// Adds the claim-check series to `registry`: calls, retried requests and calls failed for
/// good, by storage queue and call (upload, fetch, delete, sweep), from `records` (each
/// queue's; a queue without claim checks has none).
pub fn register_claims<'a>(registry: &mut Registry, records: impl IntoIterator<Item = &'a ClaimRecords>) {
    let calls = Family::<ClaimLabel, Counter>::default();
    registry.register("claim_calls", "Claim-check calls (large bodies in the queue's claim store) by call: upload, fetch, delete, sweep", calls.clone());
    let retries = Family::<ClaimLabel, Counter>::default();
    registry.register(
        "claim_retries",
        "Claim-check requests (a block, the commit, a range, a delete, a list) tried again after a transient failure, by call",
        retries.clone(),
    );
    let failed = Family::<ClaimLabel, Counter>::default();
    registry.register(
        "claim_gave_up",
        "Claim-check calls the storage failed for good (out of retries, or not worth one), by call: a send answered 503, a fetch retried with its message",
        failed.clone(),
    );
    let s3 = Family::<S3Label, Counter>::default();
    registry.register("s3_requests", "S3 requests of claim checks S3 answered (billed), by operation: s3_put, s3_get, s3_delete, s3_list", s3.clone());
    let s3_unanswered = Family::<QueueLabel, Counter>::default();
    registry.register("s3_unanswered", "S3 request attempts of claim checks that got no answer (billed or not)", s3_unanswered.clone());
    for record in records.into_iter().flat_map(ClaimRecords::all) {
        for call in ClaimCall::ALL {
            let label = ClaimLabel { queue: record.queue().to_string(), call: call.as_str() };
            calls.get_or_create(&label).inc_by(record.calls(call));
            retries.get_or_create(&label).inc_by(record.retries(call));
            failed.get_or_create(&label).inc_by(record.failed(call));
        }
        // Only a queue whose bodies went to S3 has S3 series.
        if record.s3().attempts() > 0 {
            for operation in S3Operation::ALL {
                s3.get_or_create(&S3Label { queue: record.queue().to_string(), operation: operation.as_str() }).inc_by(record.s3().of(operation));
            }
            s3_unanswered.get_or_create(&QueueLabel { queue: record.queue().to_string() }).inc_by(record.s3().unanswered());
        }
    }
}

/// The S3 requests of `/status`: one entry per storage queue whose claim checks made any.
pub fn s3_status<'a>(records: impl IntoIterator<Item = &'a ClaimRecords>) -> Vec<S3RequestCounts> {
    records.into_iter().flat_map(ClaimRecords::all).filter(|record| record.s3().attempts() > 0).map(|record| record.s3_counts()).collect()
}

/// The storage figures of `/status`: one entry per storage queue. A storage queue two
/// clients call (a reply queue that another configured queue handles) is one entry, the
/// sum of both.
pub fn status<'a>(queues: impl IntoIterator<Item = &'a Arc<dyn QueueClient>>) -> Vec<CallSnapshot> {
    let mut merged: Vec<CallSnapshot> = Vec::new();
    for snapshot in call_records(queues).iter().map(|r| r.snapshot()) {
        match merged.iter_mut().find(|m| m.queue == snapshot.queue) {
            Some(entry) => entry.merge(&snapshot),
            None => merged.push(snapshot),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::queue::memory::MemoryQueue;
    use crate::queue::partitioned::Partitioned;
    use crate::queue::{RetryPolicy, Retrying, TokioClock};

    #[tokio::test(start_paused = true)]
    async fn every_partition_shows_its_failures_retries_and_ages() {
        let clock = Arc::new(TokioClock::new());
        let partition = |name: &str| -> Arc<dyn QueueClient> { Arc::new(Retrying::new(MemoryQueue::new(name, clock.clone(), 1024), RetryPolicy::default())) };
        let (first, second) = (partition("orders-0"), partition("orders-1"));
        let queue: Arc<dyn QueueClient> = Arc::new(Partitioned::new("orders", vec![first.clone(), second]));
        first.get(1, Duration::from_secs(1)).await.unwrap();
        first.call_records()[0].record_failure(CallKind::Delete, FailureClass::Timeout, "no answer");
        tokio::time::advance(Duration::from_secs(4)).await;

        let mut registry = Registry::with_prefix("ebb");
        register(&mut registry, [&queue], []);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"ebb_storage_failures_total{queue="orders-0",kind="delete",class="timeout"} 1"#,
            r#"ebb_storage_failures_total{queue="orders-1",kind="get",class="throttled"} 0"#,
            r#"ebb_storage_retries_total{queue="orders-0",kind="get"} 0"#,
            r#"ebb_storage_last_success_age_seconds{queue="orders-0"} 4.0"#,
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
        assert!(!text.contains(r#"ebb_storage_last_success_age_seconds{queue="orders-1"}"#), "never answered: no age");
        let status = status([&queue]);
        assert_eq!(status.len(), 2);
        assert_eq!(status[0].failed_attempts(), 1);
    }
}
