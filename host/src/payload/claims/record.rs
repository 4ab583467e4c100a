//! What became of a queue's claim-check calls, for `/metrics`: calls made, requests tried
//! again after a transient failure, and calls that failed for good, by call (upload, fetch,
//! delete, sweep). A queue's producer, listeners and sweeper each hold a store of their
//! own; they share one [`ClaimRecord`] per storage queue through [`ClaimRecords`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use super::{ClaimError, ClaimStore, S3Requests, SweepReport};
use crate::payload::{AllowedReferences, ClaimCheck};

/// A claim-check call, as the metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimCall {
    /// [`ClaimStore::put`]: a body stored (on Azure its blocks, their commit, the container's creation).
    Upload,
    /// [`ClaimStore::get`]: a body fetched.
    Fetch,
    /// [`ClaimStore::delete`]: a handled message's body deleted.
    Delete,
    /// [`ClaimStore::sweep`]: old bodies listed and removed.
    Sweep,
}

impl ClaimCall {
    /// Every call, in the order the metrics list them.
    pub const ALL: [ClaimCall; 4] = [ClaimCall::Upload, ClaimCall::Fetch, ClaimCall::Delete, ClaimCall::Sweep];

    /// The metrics' label.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimCall::Upload => "upload",
            ClaimCall::Fetch => "fetch",
            ClaimCall::Delete => "delete",
            ClaimCall::Sweep => "sweep",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The claim-check calls of one storage queue.
#[derive(Debug)]
pub struct ClaimRecord {
    queue: String,
    calls: [AtomicU64; 4],
    retries: [AtomicU64; 4],
    failed: [AtomicU64; 4],
    /// The S3 store's requests (`s3_meter`): none on another store.
    s3: S3Requests,
}

impl ClaimRecord {
    /// An empty record for storage queue `queue`.
    pub fn new(queue: &str) -> Self {
        ClaimRecord { queue: queue.to_string(), calls: Default::default(), retries: Default::default(), failed: Default::default(), s3: S3Requests::default() }
    }

    /// The storage queue whose bodies these calls moved.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Counts a call made.
    pub fn record_call(&self, call: ClaimCall) {
        self.calls[call.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one request of `call` tried again after a transient failure.
    pub fn record_retry(&self, call: ClaimCall) {
        self.retries[call.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a call the storage failed for good (out of retries, or not worth one).
    pub fn record_failed(&self, call: ClaimCall) {
        self.failed[call.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// The S3 requests its calls made.
    pub fn s3(&self) -> &S3Requests {
        &self.s3
    }

    /// Calls of `call` made.
    pub fn calls(&self, call: ClaimCall) -> u64 {
        self.calls[call.index()].load(Ordering::Relaxed)
    }

    /// Requests of `call` tried again.
    pub fn retries(&self, call: ClaimCall) -> u64 {
        self.retries[call.index()].load(Ordering::Relaxed)
    }

    /// Calls of `call` the storage failed for good.
    pub fn failed(&self, call: ClaimCall) -> u64 {
        self.failed[call.index()].load(Ordering::Relaxed)
    }
}

/// One [`ClaimRecord`] per storage queue, shared by every store built with it (clones share).
#[derive(Debug, Clone, Default)]
pub struct ClaimRecords(Arc<Mutex<Vec<Arc<ClaimRecord>>>>);

impl ClaimRecords {
    /// The record of storage queue `queue`, made on first use.
    pub fn for_queue(&self, queue: &str) -> Arc<ClaimRecord> {
        let mut records = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(record) = records.iter().find(|r| r.queue() == queue) {
            return record.clone();
        }
        let record = Arc::new(ClaimRecord::new(queue));
        records.push(record.clone());
        record
    }

    /// Every record, in the order they were made.
    pub fn all(&self) -> Vec<Arc<ClaimRecord>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// A store whose calls are counted in a [`ClaimRecord`] (its retries are the store's to
/// count: only it sees its requests). A call fails for good when the storage failed it
/// ([`ClaimError::Transient`] after the store's retries, or [`ClaimError::Fatal`]); a missing,
/// corrupt or refused body is the message's problem, not the storage's.
pub(crate) struct Recorded {
    inner: Arc<dyn ClaimStore>,
    record: Arc<ClaimRecord>,
}

impl Recorded {
    /// `inner`, its calls counted in `record`.
    pub fn new(inner: Arc<dyn ClaimStore>, record: Arc<ClaimRecord>) -> Self {
        Recorded { inner, record }
    }

    fn counted<T>(&self, call: ClaimCall, result: Result<T, ClaimError>) -> Result<T, ClaimError> {
        if matches!(result, Err(ClaimError::Transient(_) | ClaimError::Fatal(_))) {
            self.record.record_failed(call);
        }
        result
    }
}

#[async_trait]
impl ClaimStore for Recorded {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn allowed(&self) -> AllowedReferences {
        self.inner.allowed()
    }

    fn max_bytes(&self) -> u64 {
        self.inner.max_bytes()
    }

    async fn put(&self, body: Bytes) -> Result<ClaimCheck, ClaimError> {
        self.record.record_call(ClaimCall::Upload);
        self.counted(ClaimCall::Upload, self.inner.put(body).await)
    }

    async fn get(&self, check: &ClaimCheck, max_bytes: u64) -> Result<Bytes, ClaimError> {
        self.record.record_call(ClaimCall::Fetch);
        self.counted(ClaimCall::Fetch, self.inner.get(check, max_bytes).await)
    }

    async fn delete(&self, check: &ClaimCheck) -> Result<(), ClaimError> {
        self.record.record_call(ClaimCall::Delete);
        self.counted(ClaimCall::Delete, self.inner.delete(check).await)
    }

    async fn sweep(&self, older_than: Duration) -> Result<SweepReport, ClaimError> {
        self.record.record_call(ClaimCall::Sweep);
        self.counted(ClaimCall::Sweep, self.inner.sweep(older_than).await)
    }
}
