//! What `ebb check` asks of a claim bucket: each S3 call `ebb run` makes on it but the put,
//! made so that nothing changes, and a refused one named by the IAM action it needs.
//!
//! - `ListObjectsV2` of at most one key under the queue's prefix (`s3:ListBucket`, the
//!   sweep's): a bucket that does not exist is said so (`run` creates it with the first body
//!   it offloads: `s3:CreateBucket`), and nothing else is probed.
//! - `GetObject` and `DeleteObject` of a key that is no object's: "no such key" and a
//!   deleted nothing when allowed, `AccessDenied` when not. (S3 answers a get of a missing
//!   key `AccessDenied` to a caller without `s3:ListBucket` too, so with that refused
//!   `s3:GetObject` may be named as well.)
//! - `PutObject` is not probed: a put cannot be made without writing.

use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};

use super::{ClaimCall, ClaimError, S3Claims, S3Operation};

/// The key the get and delete probes name (under the queue's prefix): no object's.
const NO_OBJECT: &str = "ebb-check-probe-of-no-object";

/// What the probes of one claim bucket found.
#[derive(Debug, Default)]
pub(crate) struct S3Probe {
    /// Whether the bucket exists.
    pub exists: bool,
    /// The IAM actions refused, each with the error that says so.
    pub refused: Vec<(&'static str, String)>,
}

impl S3Claims {
    /// Probes the bucket as the module says; any failure but a refusal ends the probe.
    pub(crate) async fn probe(&self) -> Result<S3Probe, ClaimError> {
        let mut probe = S3Probe::default();
        let client = self.client().await?;
        let list = client.list_objects_v2().bucket(self.bucket()).prefix(&self.prefix).max_keys(1);
        match list.customize().interceptor(self.meter(ClaimCall::Sweep, S3Operation::List)).send().await {
            Err(error) if error.code() == Some("NoSuchBucket") => return Ok(probe),
            listed => probe.refused.extend(self.refused("s3:ListBucket", "list objects", listed.map(drop))?),
        }
        probe.exists = true;
        let key = format!("{}{NO_OBJECT}", self.prefix);
        let get = client.get_object().bucket(self.bucket()).key(&key).customize().interceptor(self.meter(ClaimCall::Fetch, S3Operation::Get));
        let got = match get.send().await {
            Err(error) if error.code() == Some("NoSuchKey") => Ok(()),
            other => other.map(drop),
        };
        probe.refused.extend(self.refused("s3:GetObject", "get a body", got)?);
        let delete = client.delete_object().bucket(self.bucket()).key(&key).customize().interceptor(self.meter(ClaimCall::Delete, S3Operation::Delete));
        probe.refused.extend(self.refused("s3:DeleteObject", "delete a body", delete.send().await.map(drop))?);
        Ok(probe)
    }

    /// `None` when `result` is allowed; `action` and why when the credential lacks it; any
    /// other failure as the store's error (`verb`: what the call does).
    fn refused<E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static>(
        &self,
        action: &'static str,
        verb: &str,
        result: Result<(), SdkError<E>>,
    ) -> Result<Option<(&'static str, String)>, ClaimError> {
        match result {
            Ok(()) => Ok(None),
            Err(error) if error.code() == Some("AccessDenied") => Ok(Some((action, self.classify(verb, &error).to_string()))),
            Err(error) => Err(self.classify(verb, &error)),
        }
    }
}
