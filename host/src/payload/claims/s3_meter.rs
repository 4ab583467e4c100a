//! The S3 requests of the claim checks, metered as SQS's are: every attempt S3 answered is
//! a billed request, counted by S3's price class; an attempt that got no answer is counted
//! apart (billed or not); a retry is counted under the claim-check call that made it
//! ([`ClaimRecord::record_retry`]), as the Azure store counts its own. The SDK retries S3
//! requests itself (standard mode), so only an interceptor on each request sees its attempts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use aws_sdk_s3::config::interceptors::{BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef};
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_s3::error::BoxError;
use serde::{Deserialize, Serialize};

use super::{ClaimCall, ClaimRecord};

/// An S3 request, by the price class S3 bills it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum S3Operation {
    /// `PutObject` and `CreateBucket` (S3's PUT class).
    Put,
    /// `GetObject` (S3's GET class).
    Get,
    /// `DeleteObject` (free).
    Delete,
    /// `ListObjectsV2`, the sweep's (billed as a PUT).
    List,
}

impl S3Operation {
    /// Every operation, in the order the metrics list them.
    pub const ALL: [S3Operation; 4] = [S3Operation::Put, S3Operation::Get, S3Operation::Delete, S3Operation::List];

    /// The metrics' label: apart from SQS's kinds, so S3's requests never mix into its count.
    pub fn as_str(self) -> &'static str {
        match self {
            S3Operation::Put => "s3_put",
            S3Operation::Get => "s3_get",
            S3Operation::Delete => "s3_delete",
            S3Operation::List => "s3_list",
        }
    }
}

/// Live counters of one storage queue's S3 requests (in its [`ClaimRecord`]).
#[derive(Debug, Default)]
pub struct S3Requests {
    answered: [AtomicU64; 4],
    unanswered: AtomicU64,
}

/// A snapshot of one storage queue's S3 requests, and what they cost (`/status`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct S3RequestCounts {
    /// The storage queue whose claim-check bodies they moved.
    pub queue: String,
    /// `PutObject` and `CreateBucket` requests S3 answered.
    pub puts: u64,
    /// `GetObject` requests answered.
    pub gets: u64,
    /// `DeleteObject` requests answered.
    pub deletes: u64,
    /// `ListObjectsV2` requests answered.
    pub lists: u64,
    /// Attempts that got no answer: in none of the counts above, and billed or not.
    pub unanswered: u64,
    /// Requests tried again after a transient failure (each also counted above when
    /// answered).
    pub retries: u64,
    /// What the answered requests cost at S3 Standard's list price, in US dollars.
    pub usd: f64,
}

impl S3Requests {
    fn record(&self, operation: S3Operation, answered: bool) {
        let counter = if answered { &self.answered[operation as usize] } else { &self.unanswered };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Answered requests of `operation`.
    pub fn of(&self, operation: S3Operation) -> u64 {
        self.answered[operation as usize].load(Ordering::Relaxed)
    }

    /// Attempts that got no answer.
    pub fn unanswered(&self) -> u64 {
        self.unanswered.load(Ordering::Relaxed)
    }

    /// Every answered request and unanswered attempt: 0 for a queue whose bodies never went to S3.
    pub fn attempts(&self) -> u64 {
        S3Operation::ALL.iter().map(|&operation| self.of(operation)).sum::<u64>() + self.unanswered()
    }
}

impl ClaimRecord {
    /// The counts of its S3 requests, priced.
    pub fn s3_counts(&self) -> S3RequestCounts {
        let s3 = self.s3();
        let (puts, gets, lists) = (s3.of(S3Operation::Put), s3.of(S3Operation::Get), s3.of(S3Operation::List));
        S3RequestCounts {
            queue: self.queue().to_string(),
            puts,
            gets,
            deletes: s3.of(S3Operation::Delete),
            lists,
            unanswered: s3.unanswered(),
            retries: ClaimCall::ALL.iter().map(|&call| self.retries(call)).sum(),
            usd: crate::cost::s3_usd(puts + lists, gets),
        }
    }
}

/// Counts one S3 request's attempts in a [`ClaimRecord`]: added to each request the store
/// makes (`.customize().interceptor(…)`), since the client is the account's, shared by
/// every queue.
#[derive(Debug)]
pub(super) struct Meter {
    record: Arc<ClaimRecord>,
    call: ClaimCall,
    operation: S3Operation,
    attempts: AtomicU32,
}

impl Meter {
    /// Counts a request of `operation`, made for `call`, in `record`.
    pub(super) fn new(record: &Arc<ClaimRecord>, call: ClaimCall, operation: S3Operation) -> Meter {
        Meter { record: record.clone(), call, operation, attempts: AtomicU32::new(0) }
    }
}

impl Intercept for Meter {
    fn name(&self) -> &'static str {
        "ebb-s3-meter"
    }

    fn read_before_attempt(&self, _: &BeforeTransmitInterceptorContextRef<'_>, _: &RuntimeComponents, _: &mut ConfigBag) -> Result<(), BoxError> {
        if self.attempts.fetch_add(1, Ordering::Relaxed) > 0 {
            self.record.record_retry(self.call);
        }
        Ok(())
    }

    fn read_after_attempt(&self, context: &FinalizerInterceptorContextRef<'_>, _: &RuntimeComponents, _: &mut ConfigBag) -> Result<(), BoxError> {
        self.record.s3().record(self.operation, context.response().is_some());
        Ok(())
    }
}
