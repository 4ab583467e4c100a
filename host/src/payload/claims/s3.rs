//! Claim-check bodies as objects in an Amazon S3 bucket, for SQS queues, through the official
//! `aws-sdk-s3` on the queue's `[aws]` account (region, endpoint, credentials).
//!
//! - The bucket is configured (`claim_bucket`: S3 names are global, so no name can be made
//!   up per queue as Azure's `<queue>-bodies` is), and created when missing on the first put.
//! - ebb's objects are `<queue>/<32 hex>`: one bucket serves several queues, and each
//!   queue's sweep lists its own prefix only. Objects a foreign producer (the SQS Extended
//!   Client) put are read and, once their message is handled, deleted, but never swept:
//!   nothing says they are orphans.
//! - A plain message offloaded to S3 goes on the queue as the Extended Client's pointer
//!   (`payload/extended.rs`, `queue/sqs/pointer.rs`); a foreign producer's carries no SHA-256:
//!   such a claim check has [`ClaimCheck::NO_SHA256`] and only its size is checked.
//! - Retries: the SDK's standard mode (jittered exponential back-off,
//!   `S3_ATTEMPTS` (queue/sqs/account.rs) attempts of each request, on throttling,
//!   5xx and transport failures). A call failing after that is a transient [`ClaimError`].
//! - Metering: each request's attempts are counted in the queue's [`ClaimRecord`]
//!   (`s3_meter.rs`): answered ones by price class, unanswered ones, retries.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use anyhow::anyhow;
use async_trait::async_trait;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{BucketLocationConstraint, CreateBucketConfiguration};
use bytes::Bytes;

use super::s3_meter::Meter;
use super::{ClaimCall, ClaimError, ClaimRecord, ClaimStore, S3Operation, SweepReport, admitted_digest, check_reference, sha256};
use crate::payload::{AllowedReferences, BlobRef, ClaimCheck};
use crate::queue::sqs::SqsAccount;

/// Objects listed per sweep (the most one ListObjectsV2 call returns).
const LIST_PAGE: i32 = 1000;

/// A storage queue's claim-check bodies in an S3 bucket.
pub struct S3Claims {
    account: SqsAccount,
    bucket: String,
    /// `<queue>/`: the prefix of every key this store writes.
    pub(super) prefix: String,
    max_bytes: u64,
    /// Where the next sweep resumes listing (a continuation token), so a bucket of more
    /// objects than one page is covered over successive sweeps.
    sweep_token: Mutex<Option<String>>,
    /// Where its requests are counted.
    record: Arc<ClaimRecord>,
}

impl S3Claims {
    /// The bodies of storage queue `queue` in `bucket` of `account`, at most `max_bytes`
    /// each. Nothing is called until the first put or get.
    pub fn new(account: &SqsAccount, bucket: &str, queue: &str, max_bytes: u64) -> S3Claims {
        S3Claims::with_record(account, bucket, queue, max_bytes, Arc::new(ClaimRecord::new(queue)))
    }

    /// [`S3Claims::new`], its requests counted in `record` (the queue's, shared with its
    /// other stores).
    pub fn with_record(account: &SqsAccount, bucket: &str, queue: &str, max_bytes: u64, record: Arc<ClaimRecord>) -> S3Claims {
        S3Claims { account: account.clone(), bucket: bucket.to_string(), prefix: format!("{queue}/"), max_bytes, sweep_token: Mutex::new(None), record }
    }

    /// Where its requests are counted.
    pub fn record(&self) -> &Arc<ClaimRecord> {
        &self.record
    }

    /// The meter of one request of `operation`, made for `call`.
    pub(super) fn meter(&self, call: ClaimCall, operation: S3Operation) -> Meter {
        Meter::new(&self.record, call, operation)
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub(super) async fn client(&self) -> Result<&aws_sdk_s3::Client, ClaimError> {
        self.account.s3_client().await.map_err(|e| ClaimError::Fatal(e.context(format!("s3 bucket {}", self.bucket))))
    }

    /// Creates the bucket if it does not exist (in the account's region).
    pub async fn create_if_missing(&self) -> Result<(), ClaimError> {
        let client = self.client().await?;
        let mut create = client.create_bucket().bucket(&self.bucket);
        // us-east-1 is S3's default and refuses being named as a constraint.
        if let Some(region) = client.config().region().map(|r| r.as_ref().to_string()).filter(|r| r != "us-east-1") {
            let constraint = CreateBucketConfiguration::builder().location_constraint(BucketLocationConstraint::from(region.as_str())).build();
            create = create.create_bucket_configuration(constraint);
        }
        match create.customize().interceptor(self.meter(ClaimCall::Upload, S3Operation::Put)).send().await {
            Ok(_) => Ok(()),
            Err(error) if matches!(error.code(), Some("BucketAlreadyOwnedByYou" | "BucketAlreadyExists")) => Ok(()),
            Err(error) => Err(self.classify("create the bucket", &error)),
        }
    }

    /// The keys of every object in the bucket under this queue's prefix (for tests).
    pub async fn list_keys(&self) -> Result<Vec<String>, ClaimError> {
        let client = self.client().await?;
        let (mut keys, mut token) = (Vec::new(), None);
        loop {
            let list = client.list_objects_v2().bucket(&self.bucket).prefix(&self.prefix).set_continuation_token(token);
            let page =
                list.customize().interceptor(self.meter(ClaimCall::Sweep, S3Operation::List)).send().await.map_err(|e| self.classify("list objects", &e))?;
            keys.extend(page.contents.unwrap_or_default().into_iter().filter_map(|object| object.key));
            token = page.next_continuation_token.filter(|t| !t.is_empty());
            if token.is_none() {
                return Ok(keys);
            }
        }
    }

    fn key_of<'c>(&self, check: &'c ClaimCheck, max_bytes: u64) -> Result<&'c str, ClaimError> {
        check_reference(check, &self.allowed(), max_bytes)?;
        match &check.location {
            BlobRef::S3 { key, .. } => Ok(key),
            BlobRef::Azure { .. } | BlobRef::Embedded { .. } => unreachable!("check_reference allows only this bucket"),
        }
    }

    /// A failed request as a transient or fatal [`ClaimError`] (a missing object is the caller's).
    pub(super) fn classify<E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static>(&self, verb: &str, error: &SdkError<E>) -> ClaimError {
        let text = anyhow!("{verb} in s3 bucket {}: {}", self.bucket, DisplayErrorContext(error));
        let transient = match error {
            SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => true,
            SdkError::ServiceError(service) => {
                let status = service.raw().status().as_u16();
                status == 408 || status == 429 || status >= 500 || matches!(error.code(), Some("SlowDown" | "RequestTimeout"))
            }
            _ => false,
        };
        if transient { ClaimError::Transient(text) } else { ClaimError::Fatal(text) }
    }

    async fn upload(&self, client: &aws_sdk_s3::Client, key: &str, body: &Bytes) -> Result<(), SdkError<aws_sdk_s3::operation::put_object::PutObjectError>> {
        let put = client.put_object().bucket(&self.bucket).key(key).body(ByteStream::from(body.clone()));
        put.customize().interceptor(self.meter(ClaimCall::Upload, S3Operation::Put)).send().await.map(drop)
    }
}

/// A fresh object key under `prefix`: 128 random bits in hex, so two producers never
/// collide and a key says nothing of its body.
fn new_key(prefix: &str) -> String {
    format!("{prefix}{:032x}", fastrand::u128(..))
}

#[async_trait]
impl ClaimStore for S3Claims {
    fn describe(&self) -> String {
        format!("s3 bucket {}", self.bucket)
    }

    fn allowed(&self) -> AllowedReferences {
        AllowedReferences { azure: None, embedded_queue: None, s3_bucket: Some(self.bucket.clone()) }
    }

    fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    async fn put(&self, body: Bytes) -> Result<ClaimCheck, ClaimError> {
        let digest = admitted_digest(&body, self.max_bytes).await?;
        let key = new_key(&self.prefix);
        let client = self.client().await?;
        let uploaded = match self.upload(client, &key, &body).await {
            Err(error) if error.code() == Some("NoSuchBucket") => {
                self.create_if_missing().await?;
                self.upload(client, &key, &body).await
            }
            other => other,
        };
        uploaded.map_err(|e| self.classify("put a body", &e))?;
        Ok(ClaimCheck { location: BlobRef::S3 { bucket: self.bucket.clone(), key }, size: body.len() as u64, sha256: digest })
    }

    async fn get(&self, check: &ClaimCheck, max_bytes: u64) -> Result<Bytes, ClaimError> {
        let key = self.key_of(check, max_bytes.min(self.max_bytes))?;
        let client = self.client().await?;
        let get = client.get_object().bucket(&self.bucket).key(key).customize().interceptor(self.meter(ClaimCall::Fetch, S3Operation::Get));
        let object = match get.send().await {
            Ok(object) => object,
            Err(error) if matches!(error.code(), Some("NoSuchKey" | "NoSuchBucket")) => {
                return Err(ClaimError::Missing { location: check.location.clone() });
            }
            Err(error) => return Err(self.classify("get a body", &error)),
        };
        // The length is checked before the body is read: an object longer than its claim is
        // never read into memory.
        let length = object.content_length.and_then(|n| u64::try_from(n).ok());
        if length.is_some_and(|n| n != check.size) {
            return Err(ClaimError::Corrupt {
                location: check.location.clone(),
                reason: format!("the object has {} bytes, the claim says {}", length.unwrap_or_default(), check.size),
            });
        }
        let body = object.body.collect().await.map_err(|e| ClaimError::Transient(anyhow!("get a body in s3 bucket {}: {e}", self.bucket)))?.into_bytes();
        if body.len() as u64 != check.size {
            return Err(ClaimError::Corrupt {
                location: check.location.clone(),
                reason: format!("the object has {} bytes, the claim says {}", body.len(), check.size),
            });
        }
        if !check.has_sha256() {
            return Ok(body);
        }
        let hashed = body.clone();
        let digest = tokio::task::spawn_blocking(move || sha256(&hashed)).await.map_err(|e| ClaimError::Fatal(anyhow!("hashing the body: {e}")))?;
        if digest != check.sha256 {
            return Err(ClaimError::Corrupt {
                location: check.location.clone(),
                // The stored body's own hash is not shown: the reference may be a forgery fishing for it.
                reason: format!("its SHA-256 is not the one the claim names ({})", hex::encode(check.sha256)),
            });
        }
        Ok(body)
    }

    async fn delete(&self, check: &ClaimCheck) -> Result<(), ClaimError> {
        // Any size: deleting a body never reads it. S3 answers a delete of a missing key with success.
        let key = self.key_of(check, u64::MAX)?;
        let client = self.client().await?;
        let delete = client.delete_object().bucket(&self.bucket).key(key).customize().interceptor(self.meter(ClaimCall::Delete, S3Operation::Delete));
        match delete.send().await {
            Ok(_) => Ok(()),
            Err(error) if error.code() == Some("NoSuchBucket") => Ok(()),
            Err(error) => Err(self.classify("delete a body", &error)),
        }
    }

    async fn sweep(&self, older_than: Duration) -> Result<SweepReport, ClaimError> {
        let cutoff = SystemTime::now().checked_sub(older_than).unwrap_or(SystemTime::UNIX_EPOCH);
        let token = self.sweep_token.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let client = self.client().await?;
        let mut report = SweepReport { removed: 0, transactions: 1 };
        let list = client.list_objects_v2().bucket(&self.bucket).prefix(&self.prefix).max_keys(LIST_PAGE).set_continuation_token(token);
        let listed = list.customize().interceptor(self.meter(ClaimCall::Sweep, S3Operation::List)).send().await;
        let page = match listed {
            Ok(page) => page,
            Err(error) if error.code() == Some("NoSuchBucket") => return Ok(report),
            Err(error) => return Err(self.classify("list objects", &error)),
        };
        *self.sweep_token.lock().unwrap_or_else(PoisonError::into_inner) = page.next_continuation_token.filter(|t| !t.is_empty());
        for object in page.contents.unwrap_or_default() {
            let (Some(key), Some(modified)) = (object.key, object.last_modified) else { continue };
            if SystemTime::try_from(modified).is_ok_and(|modified| modified >= cutoff) {
                continue;
            }
            report.transactions += 1;
            let delete = client.delete_object().bucket(&self.bucket).key(&key).customize().interceptor(self.meter(ClaimCall::Sweep, S3Operation::Delete));
            match delete.send().await {
                Ok(_) => report.removed += 1,
                Err(error) => return Err(self.classify("sweep a body", &error)),
            }
        }
        Ok(report)
    }
}
