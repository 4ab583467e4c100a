//! Claim-check bodies as block blobs in a container of the queue's own, through the
//! official `azure_storage_blob` SDK on the queue's account and credential.
//!
//! Why the SDK: it is Microsoft's, pinned on the same `azure_core` as the queue SDK, and its
//! partitioned transfers are what a 100 MiB body needs: the upload sends 4 MiB blocks from
//! slices of the caller's `Bytes` (no second copy), and the download writes ranges
//! straight into one buffer of the claimed size (what is verified is what is handed on).
//! Requests are signed by the queue code's Shared Key policy, or carry its SAS or Entra ID
//! token; the SDK's retries are off (a failed call is a transient [`ClaimError`], retried
//! by the listener like a failed handler).

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail};
use async_trait::async_trait;
use azure_core::error::ErrorKind;
use azure_core::http::{NoFormat, RequestContent, StatusCode};
use azure_storage_blob::models::{BlobClientDownloadOptions, BlobContainerClientListBlobsOptions, HttpRange};
use azure_storage_blob::{BlobContainerClient, BlobContainerClientOptions};
use bytes::Bytes;
use futures::StreamExt;

use super::{ClaimError, ClaimStore, SweepReport, admitted_digest, check_reference, sha256};
use crate::payload::{AllowedReferences, AzureContainer, BlobRef, ClaimCheck};
use crate::queue::azure::{API_VERSION, AzureAccount, AzureOptions, Credential, sdk_client_options};

/// Blobs listed per sweep (the most one List Blobs call returns).
const LIST_PAGE: i32 = 5000;
/// What container names end with.
const CONTAINER_SUFFIX: &str = "-bodies";
/// Longest container name Azure takes.
const MAX_CONTAINER_NAME: usize = 63;

/// The container that holds queue `queue`'s bodies: `<queue>-bodies`, or for a queue name
/// too long for that, its first letters, 8 hex digits of its SHA-256 (so two long names
/// that share a start still differ) and `-bodies`. `queue` must be an Azure queue name
/// (3 to 63 lowercase letters, digits and single dashes), which makes the result a
/// container name.
pub fn container_for_queue(queue: &str) -> anyhow::Result<String> {
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
    /// [`AzureClaims::create_if_missing`] creates the container.
    pub fn new(account: &AzureAccount, queue: &str, max_bytes: u64, options: &AzureOptions) -> anyhow::Result<Self> {
        let container_name = container_for_queue(queue)?;
        let what = format!("claim-check container {container_name}");
        let (client_options, entra) = sdk_client_options(account, options.request_timeout, options.pool_idle_timeout, &what)?;
        let sas = match account.credential() {
            Credential::Sas(token) => Some(token.secret().to_string()),
            _ => None,
        };
        let sdk_options = BlobContainerClientOptions { client_options, version: API_VERSION.to_string() };
        let container = BlobContainerClient::new(account.container_url(&container_name)?, entra, Some(sdk_options))
            .map_err(|e| anyhow!("{what} on account {}: {e}", account.name()))?;
        Ok(AzureClaims { account: account.name().to_string(), container_name, container, max_bytes, sas, sweep_marker: Mutex::new(None) })
    }

    /// The container's name.
    pub fn container_name(&self) -> &str {
        &self.container_name
    }

    /// Creates the container if it does not exist.
    pub async fn create_if_missing(&self) -> Result<(), ClaimError> {
        match self.container.create(None).await {
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
            BlobRef::Embedded { .. } => unreachable!("check_reference allows only this container"),
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
        self.container.blob_client(name).upload(<RequestContent<Bytes, NoFormat> as From<Bytes>>::from(body.clone()), None).await.map(drop)
    }
}

/// The service's error code (`BlobNotFound`, `ContainerNotFound`, …), if it gave one.
fn error_code(error: &azure_core::Error) -> Option<String> {
    match error.kind() {
        ErrorKind::HttpResponse { error_code, .. } => error_code.clone(),
        _ => None,
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
        AllowedReferences { azure: Some(AzureContainer { account: self.account.clone(), container: self.container_name.clone() }), embedded_queue: None }
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
        let options = BlobClientDownloadOptions { range: Some(HttpRange::new(0, check.size + 1)), ..Default::default() };
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
        match self.container.blob_client(blob).delete(None).await {
            Ok(_) => Ok(()),
            Err(error) if error.http_status() == Some(StatusCode::NotFound) => Ok(()),
            Err(error) => Err(self.classify("delete a body", &error)),
        }
    }

    async fn sweep(&self, older_than: Duration) -> Result<SweepReport, ClaimError> {
        let cutoff = SystemTime::now().checked_sub(older_than).unwrap_or(SystemTime::UNIX_EPOCH);
        let marker = self.sweep_marker.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let options = BlobContainerClientListBlobsOptions { maxresults: Some(LIST_PAGE), marker, ..Default::default() };
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
            match self.container.blob_client(&name).delete(None).await {
                Ok(_) => report.removed += 1,
                Err(error) if error.http_status() == Some(StatusCode::NotFound) => {}
                Err(error) => return Err(self.classify("sweep a body", &error)),
            }
        }
        Ok(report)
    }
}
