//! Claim-check bodies as block blobs in a container of the queue's own, through the
//! official `azure_storage_blob` SDK on the queue's account and credential.
//!
//! Why the SDK: it is Microsoft's, pinned on the same `azure_core` as the queue SDK, and its
//! partitioned transfers are what a 100 MiB body needs: the upload sends 4 MiB blocks from
//! slices of the caller's `Bytes` (no second copy), and the download writes ranges
//! straight into one buffer of the claimed size (what is verified is what is handed on).
//! Requests are signed by the queue code's Shared Key policy, or carry its SAS or Entra ID
//! token.
//!
//! Retries: each request (a block, the commit, a range of a download, a delete, a list) is
//! tried again on a transient failure (408, 429, 5xx, a broken connection, a timeout) with
//! jittered exponential back-off, at most [`BLOB_RETRY`]'s attempts, through the SDK's retry
//! loop with our delays ([`BlobRetry`]). The queue's client keeps the SDK's retries
//! off (its `Retrying` decorator retries whole calls), and this store once inherited that:
//! a 50 MB body is 13 blocks and a commit, and one 503 on any of them failed the whole
//! send. Each retry is counted in the store's [`ClaimRecord`] under the call that made it.
//! A call still failing after that is a transient [`ClaimError`]: a send answers 503 with
//! `Retry-After`, a listener retries the message like a failed handler.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail};
use async_trait::async_trait;
use azure_core::error::ErrorKind;
use azure_core::http::headers::RETRY_AFTER;
use azure_core::http::pager::PagerOptions;
use azure_core::http::policies::{Policy, PolicyResult, RetryHeaders, RetryPolicyCount};
use azure_core::http::{ClientMethodOptions, Context, NoFormat, Request, RequestContent, RetryOptions, StatusCode};
use azure_storage_blob::models::{
    BlobClientDeleteOptions, BlobClientDownloadOptions, BlobClientUploadOptions, BlobContainerClientCreateOptions, BlobContainerClientListBlobsOptions,
    HttpRange,
};
use azure_storage_blob::{BlobContainerClient, BlobContainerClientOptions};
use bytes::Bytes;
use futures::StreamExt;

use super::{ClaimCall, ClaimError, ClaimRecord, ClaimStore, SweepReport, admitted_digest, check_reference, sha256};
use crate::payload::{AllowedReferences, AzureContainer, BlobRef, ClaimCheck};
use crate::queue::RetryPolicy;
use crate::queue::azure::{API_VERSION, AzureAccount, AzureOptions, Credential, sdk_client_options};

/// Blobs listed per sweep (the most one List Blobs call returns).
const LIST_PAGE: i32 = 5000;
/// How each blob request is retried: the queue's delays (100 ms doubling to 5 s, ±50 %
/// jitter), with 8 attempts rather than 5 because one block that fails for good fails its
/// whole body (a 50 MB body is 13 blocks and a commit). At most about 11 s of waiting.
pub const BLOB_RETRY: RetryPolicy = RetryPolicy { max_attempts: 8, base_delay: Duration::from_millis(100), max_delay: Duration::from_secs(5) };
/// What container names end with.
const CONTAINER_SUFFIX: &str = "-bodies";
/// Longest container name Azure takes.
const MAX_CONTAINER_NAME: usize = 63;

/// The container that holds queue `queue`'s bodies: `<queue>-bodies`, or for a queue name
/// too long for that, its first letters, 8 hex digits of its SHA-256 (so two long names
/// that share a start still differ) and `-bodies`. `queue` must be an Azure queue name
/// (3 to 63 lowercase letters, digits and single dashes), which makes the result a
/// container name.
pub(crate) fn container_for_queue(queue: &str) -> anyhow::Result<String> {
    let chars_ok = queue.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let dashes_ok = !queue.starts_with('-') && !queue.ends_with('-') && !queue.contains("--");
    if !((3..=MAX_CONTAINER_NAME).contains(&queue.len()) && chars_ok && dashes_ok) {
        bail!("queue {queue:?} is not an Azure queue name (3 to 63 lowercase letters, digits and single dashes): no container can be named after it");
    }
    if queue.len() + CONTAINER_SUFFIX.len() <= MAX_CONTAINER_NAME {
        return Ok(format!("{queue}{CONTAINER_SUFFIX}"));
    }
    let hash = hex::encode(&sha256(queue.as_bytes())[..4]);
    let keep = MAX_CONTAINER_NAME - CONTAINER_SUFFIX.len() - hash.len() - 1;
    let start = queue[..keep].trim_end_matches('-');
    Ok(format!("{start}-{hash}{CONTAINER_SUFFIX}"))
}

/// A queue's claim-check bodies in Azure Blob Storage.
pub struct AzureClaims {
    account: String,
    container_name: String,
    container: BlobContainerClient,
    max_bytes: u64,
    /// The SAS, scrubbed from errors (the SDK quotes URLs).
    sas: Option<String>,
    /// Where the next sweep's list call starts (the last one's continuation), so a
    /// container of more than one page is covered over several periods.
    sweep_marker: Mutex<Option<String>>,
    /// Where its retries are counted.
    record: Arc<ClaimRecord>,
}

impl std::fmt::Debug for AzureClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureClaims").field("account", &self.account).field("container", &self.container_name).field("max_bytes", &self.max_bytes).finish()
    }
}

impl AzureClaims {
    /// The store of queue `queue` on `account` (its blob endpoint, its credential), for
    /// bodies of at most `max_bytes`; each request is bounded by `options.request_timeout`
    /// (a large body travels in 4 MiB requests). Nothing is sent until the first call;
    /// [`AzureClaims::create_if_missing`] creates the container. Its retries are counted in
    /// a record of its own ([`AzureClaims::record`]).
    pub fn new(account: &AzureAccount, queue: &str, max_bytes: u64, options: &AzureOptions) -> anyhow::Result<Self> {
        AzureClaims::with_record(account, queue, max_bytes, options, Arc::new(ClaimRecord::new(queue)))
    }

    /// [`AzureClaims::new`], its retries counted in `record` (shared with the queue's other stores).
    pub fn with_record(account: &AzureAccount, queue: &str, max_bytes: u64, options: &AzureOptions, record: Arc<ClaimRecord>) -> anyhow::Result<Self> {
        let container_name = container_for_queue(queue)?;
        let what = format!("claim-check container {container_name}");
        let (mut client_options, entra) = sdk_client_options(account, options.request_timeout, options.pool_idle_timeout, &what)?;
        client_options.retry = RetryOptions::custom(Arc::new(BlobRetry::new(BLOB_RETRY)));
        client_options.per_try_policies.push(Arc::new(CountRetries(record.clone())));
        let sas = match account.credential() {
            Credential::Sas(token) => Some(token.secret().to_string()),
            _ => None,
        };
        let sdk_options = BlobContainerClientOptions { client_options, version: API_VERSION.to_string() };
        let container = BlobContainerClient::new(account.container_url(&container_name)?, entra, Some(sdk_options))
            .map_err(|e| anyhow!("{what} on account {}: {e}", account.name()))?;
        Ok(AzureClaims { account: account.name().to_string(), container_name, container, max_bytes, sas, sweep_marker: Mutex::new(None), record })
    }

    /// Where its retries are counted.
    pub fn record(&self) -> &Arc<ClaimRecord> {
        &self.record
    }

    /// The container's name.
    pub fn container_name(&self) -> &str {
        &self.container_name
    }

    /// Creates the container if it does not exist.
    pub async fn create_if_missing(&self) -> Result<(), ClaimError> {
        let options = BlobContainerClientCreateOptions { method_options: tagged(ClaimCall::Upload), ..Default::default() };
        match self.container.create(Some(options)).await {
            Ok(_) => Ok(()),
            Err(error) if error_code(&error).as_deref() == Some("ContainerAlreadyExists") => Ok(()),
            Err(error) => Err(self.classify("create the container", &error)),
        }
    }

    /// The names of every blob in the container (for tests and `ebb bench claims`; pages
    /// through all of them).
    pub async fn list_names(&self) -> Result<Vec<String>, ClaimError> {
        let mut pages = self.container.list_blobs(None).map_err(|e| self.classify("list blobs", &e))?.into_pages();
        let mut names = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| self.classify("list blobs", &e))?.into_model().map_err(|e| self.classify("list blobs", &e))?;
            names.extend(page.blob_items.into_iter().filter_map(|b| b.name));
        }
        Ok(names)
    }

    fn location(&self, blob: &str) -> BlobRef {
        BlobRef::Azure { account: self.account.clone(), container: self.container_name.clone(), blob: blob.to_string() }
    }

    /// The blob name a reference names, once checked.
    fn blob_of<'c>(&self, check: &'c ClaimCheck, max_bytes: u64) -> Result<&'c str, ClaimError> {
        check_reference(check, &self.allowed(), max_bytes)?;
        match &check.location {
            BlobRef::Azure { blob, .. } => Ok(blob),
            BlobRef::Embedded { .. } | BlobRef::S3 { .. } => unreachable!("check_reference allows only this container"),
        }
    }

    fn scrub(&self, text: String) -> String {
        match &self.sas {
            Some(sas) if !sas.is_empty() => text.replace(sas.as_str(), "<sas>"),
            _ => text,
        }
    }

    /// A storage error as a transient or fatal [`ClaimError`] (404s are the caller's).
    fn classify(&self, verb: &str, error: &azure_core::Error) -> ClaimError {
        let text = self.scrub(format!("{verb} in container {}/{}: {error}", self.account, self.container_name));
        let transient = match error.http_status() {
            Some(status) => status == StatusCode::RequestTimeout || status == StatusCode::TooManyRequests || u16::from(status) >= 500,
            None => matches!(error.kind(), ErrorKind::Io | ErrorKind::Connection | ErrorKind::Other),
        };
        if transient { ClaimError::Transient(anyhow!(text)) } else { ClaimError::Fatal(anyhow!(text)) }
    }

    async fn upload(&self, name: &str, body: &Bytes) -> azure_core::Result<()> {
        let options = BlobClientUploadOptions { method_options: tagged(ClaimCall::Upload), ..Default::default() };
        self.container.blob_client(name).upload(<RequestContent<Bytes, NoFormat> as From<Bytes>>::from(body.clone()), Some(options)).await.map(drop)
    }
}

/// The service's error code (`BlobNotFound`, `ContainerNotFound`, …), if it gave one.
fn error_code(error: &azure_core::Error) -> Option<String> {
    match error.kind() {
        ErrorKind::HttpResponse { error_code, .. } => error_code.clone(),
        _ => None,
    }
}

/// The SDK options of a request made for `call`: its retries are counted under it.
fn tagged(call: ClaimCall) -> ClientMethodOptions<'static> {
    ClientMethodOptions { context: Context::new().with_value(call) }
}

/// The SDK's retry loop with our policy: [`RetryPolicy`]'s attempts and jittered
/// exponential delays (the queue's, ±50 % jitter), on the SDK's transient statuses (408,
/// 429, 500, 502, 503, 504) and transport failures. A `Retry-After` the service gives is
/// waited for, up to the policy's longest delay.
#[derive(Debug)]
struct BlobRetry {
    policy: RetryPolicy,
    headers: RetryHeaders,
}

impl BlobRetry {
    fn new(policy: RetryPolicy) -> Self {
        BlobRetry { policy, headers: RetryHeaders { retry_headers: vec![RETRY_AFTER] } }
    }
}

#[async_trait]
impl azure_core::http::policies::RetryPolicy for BlobRetry {
    fn is_expired(&self, _since_start: azure_core::time::Duration, retries: u32) -> bool {
        retries + 1 >= self.policy.max_attempts
    }

    fn retry_headers(&self) -> Option<&RetryHeaders> {
        Some(&self.headers)
    }

    fn retry_status_codes(&self) -> &[StatusCode] {
        // Empty: the SDK's own list of transient statuses.
        &[]
    }

    fn sleep_duration(&self, retry: u32) -> azure_core::time::Duration {
        azure_core::time::Duration::try_from(self.policy.delay(retry)).unwrap_or(azure_core::time::Duration::MAX)
    }

    async fn wait(&self, retry: u32, retry_after: Option<azure_core::time::Duration>) {
        let asked = retry_after.and_then(|d| Duration::try_from(d).ok()).unwrap_or_default().min(self.policy.max_delay);
        tokio::time::sleep(self.policy.delay(retry).max(asked)).await;
    }
}

/// Counts each request the SDK's retry loop sends again, under the call its context names.
#[derive(Debug)]
struct CountRetries(Arc<ClaimRecord>);

#[async_trait]
impl Policy for CountRetries {
    async fn send(&self, ctx: &Context, request: &mut Request, next: &[Arc<dyn Policy>]) -> PolicyResult {
        if let (Some(retry), Some(call)) = (ctx.value::<RetryPolicyCount>(), ctx.value::<ClaimCall>())
            && **retry > 0
        {
            self.0.record_retry(*call);
            tracing::debug!(queue = %self.0.queue(), call = call.as_str(), retry = **retry, "claim-check request tried again");
        }
        next[0].send(ctx, request, &next[1..]).await
    }
}

/// A fresh blob name: 128 random bits in hex, so two producers never collide and a name
/// says nothing of its body.
fn new_blob_name() -> String {
    format!("{:032x}", fastrand::u128(..))
}

#[async_trait]
impl ClaimStore for AzureClaims {
    fn describe(&self) -> String {
        format!("azure container {}/{}", self.account, self.container_name)
    }

    fn allowed(&self) -> AllowedReferences {
        AllowedReferences {
            azure: Some(AzureContainer { account: self.account.clone(), container: self.container_name.clone() }),
            embedded_queue: None,
            s3_bucket: None,
        }
    }

    fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    async fn put(&self, body: Bytes) -> Result<ClaimCheck, ClaimError> {
        let digest = admitted_digest(&body, self.max_bytes).await?;
        let name = new_blob_name();
        let uploaded = match self.upload(&name, &body).await {
            Err(error) if error_code(&error).as_deref() == Some("ContainerNotFound") => {
                self.create_if_missing().await?;
                self.upload(&name, &body).await
            }
            other => other,
        };
        uploaded.map_err(|e| self.classify("put a body", &e))?;
        Ok(ClaimCheck { location: self.location(&name), size: body.len() as u64, sha256: digest })
    }

    async fn get(&self, check: &ClaimCheck, max_bytes: u64) -> Result<Bytes, ClaimError> {
        let blob = self.blob_of(check, max_bytes.min(self.max_bytes))?;
        let size = check.size as usize;
        // One byte more than claimed is asked for and room made for it, so a blob longer than
        // its claim shows as such rather than being cut to fit (or failing as a short buffer).
        let mut buffer = vec![0u8; size + 1];
        let options =
            BlobClientDownloadOptions { range: Some(HttpRange::new(0, check.size + 1)), method_options: tagged(ClaimCall::Fetch), ..Default::default() };
        let read = match self.container.blob_client(blob).download_into(&mut buffer, Some(options)).await {
            Ok(result) => result.len,
            Err(error) => match (error.http_status(), error_code(&error).as_deref()) {
                (Some(StatusCode::NotFound), Some("BlobNotFound" | "ContainerNotFound")) => {
                    return Err(ClaimError::Missing { location: check.location.clone() });
                }
                // No byte at offset 0: the blob is empty (claims name at least one byte).
                (Some(StatusCode::RequestedRangeNotSatisfiable), _) => 0,
                _ => return Err(self.classify("get a body", &error)),
            },
        };
        if read != size {
            let found = if read > size { "more than".to_string() } else { read.to_string() };
            return Err(ClaimError::Corrupt { location: check.location.clone(), reason: format!("the blob has {found} bytes, the claim says {size}") });
        }
        buffer.truncate(size);
        let body = Bytes::from(buffer);
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
        // Any size: deleting a body never reads it.
        let blob = self.blob_of(check, u64::MAX)?;
        let options = BlobClientDeleteOptions { method_options: tagged(ClaimCall::Delete), ..Default::default() };
        match self.container.blob_client(blob).delete(Some(options)).await {
            Ok(_) => Ok(()),
            Err(error) if error.http_status() == Some(StatusCode::NotFound) => Ok(()),
            Err(error) => Err(self.classify("delete a body", &error)),
        }
    }

    async fn sweep(&self, older_than: Duration) -> Result<SweepReport, ClaimError> {
        let cutoff = SystemTime::now().checked_sub(older_than).unwrap_or(SystemTime::UNIX_EPOCH);
        let marker = self.sweep_marker.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let method_options = PagerOptions { context: tagged(ClaimCall::Sweep).context, ..Default::default() };
        let options = BlobContainerClientListBlobsOptions { maxresults: Some(LIST_PAGE), marker, method_options, ..Default::default() };
        let mut report = SweepReport { removed: 0, transactions: 1 };
        let page = match self.container.list_blobs(Some(options)).map_err(|e| self.classify("list blobs", &e))?.into_pages().next().await {
            None => return Ok(report),
            Some(Err(error)) if error_code(&error).as_deref() == Some("ContainerNotFound") => return Ok(report),
            Some(page) => page.map_err(|e| self.classify("list blobs", &e))?.into_model().map_err(|e| self.classify("list blobs", &e))?,
        };
        *self.sweep_marker.lock().unwrap_or_else(PoisonError::into_inner) = page.next_marker.filter(|m| !m.is_empty());
        for item in page.blob_items {
            let (Some(name), Some(properties)) = (item.name, item.properties) else { continue };
            let Some(modified) = properties.last_modified else { continue };
            if SystemTime::from(modified) >= cutoff {
                continue;
            }
            report.transactions += 1;
            let options = BlobClientDeleteOptions { method_options: tagged(ClaimCall::Sweep), ..Default::default() };
            match self.container.blob_client(&name).delete(Some(options)).await {
                Ok(_) => report.removed += 1,
                Err(error) if error.http_status() == Some(StatusCode::NotFound) => {}
                Err(error) => return Err(self.classify("sweep a body", &error)),
            }
        }
        Ok(report)
    }
}
