//! Where a queue's messages live: the embedded store, an Azure account (`[azure]`,
//! `[queues.<name>.azure]`) or Amazon SQS (`[aws]`, `[queues.<name>.sqs]`), and how the
//! account's keys are checked.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;

use super::checks::{MAX_CA_FILE_BYTES, read_bounded};
use crate::queue::azure::{AzureAccount, Encoding, EntraMethod, EntraOptions};
use crate::queue::sqs::{AwsCredentials, AwsSettings, SqsAccount};

/// `[azure]` or `[queues.<name>.azure]`: one way to reach the account, and the encoding.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AzureFile {
    /// A connection string (`AccountName=…;AccountKey=…;…`, `UseDevelopmentStorage=true`, or
    /// with `SharedAccessSignature=…`).
    pub connection_string: Option<String>,
    /// The environment variable holding the connection string (keeps the secret out of the file).
    pub connection_string_env: Option<String>,
    /// The account name (with `key` or `key_env`).
    pub account: Option<String>,
    /// The account key.
    pub key: Option<String>,
    /// The environment variable holding the account key.
    pub key_env: Option<String>,
    /// The queue endpoint, e.g. `https://myaccount.queue.core.windows.net` (default from the account name).
    pub endpoint: Option<String>,
    /// With `account`, instead of a key: an Entra ID identity (`managed-identity`,
    /// `workload-identity`, `azure-cli`, `developer-tools`, `client-secret`).
    pub credential: Option<EntraMethod>,
    /// The identity's client id (a user-assigned managed identity, a workload identity, a service principal).
    pub client_id: Option<String>,
    /// The tenant id (`client-secret`; optional for `workload-identity` and `azure-cli`).
    pub tenant_id: Option<String>,
    /// The environment variable holding a service principal's secret (`client-secret`).
    pub client_secret_env: Option<String>,
    /// A PEM file of extra trusted root certificates for an https endpoint (a private CA;
    /// relative to the config file).
    pub ca_file: Option<PathBuf>,
    /// How bodies are written as message text: `base64` (default: Azure Functions' and the
    /// SDKs' convention) or `none` (UTF-8 text).
    pub message_encoding: Option<MessageEncoding>,
}

/// `message_encoding`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum MessageEncoding {
    /// Base64 of the bytes.
    Base64,
    /// The bytes as UTF-8 text.
    None,
}

/// Where a queue's messages live.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The embedded store in `data_dir`.
    #[default]
    Embedded,
    /// An Azure Storage account.
    Azure,
    /// Amazon SQS.
    Sqs,
}

/// A validated backend.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The embedded store in `data_dir`.
    Embedded,
    /// An Azure Storage account; the `Debug` form of the account hides its secret.
    Azure {
        /// The account and its credential.
        account: AzureAccount,
        /// How bodies are written.
        encoding: Encoding,
    },
    /// Amazon SQS; the `Debug` form of the account hides its keys.
    Sqs {
        /// The region, the endpoint and the credentials.
        account: SqsAccount,
        /// How bodies are written.
        encoding: crate::queue::sqs::Encoding,
        /// The configured URL of one storage queue: (its name, its URL). Other storage
        /// queues (partitions, poison, replies) are found by name.
        queue_url: Option<(String, String)>,
        /// The S3 bucket of its claim checks (`claim_bucket`); none: no claim checks.
        claim_bucket: Option<String>,
    },
}

impl AzureFile {
    /// The account these keys name, or the key and the reason they do not.
    pub(super) fn account(&self, key: &str, base: &Path) -> Result<(AzureAccount, Encoding)> {
        let env = |var_key: &str, var: &str| -> Result<String> {
            std::env::var(var).map_err(|_| anyhow::anyhow!("{key}.{var_key}: the environment variable {var} is not set"))
        };
        let sources = [self.connection_string.is_some(), self.connection_string_env.is_some(), self.account.is_some()];
        let account = match sources {
            [true, false, false] => AzureAccount::from_connection_string(self.connection_string.as_deref().unwrap_or_default())
                .with_context(|| format!("{key}.connection_string"))?,
            [false, true, false] => {
                let var = self.connection_string_env.as_deref().unwrap_or_default();
                AzureAccount::from_connection_string(&env("connection_string_env", var)?)
                    .with_context(|| format!("{key}.connection_string_env: the connection string in {var}"))?
            }
            [false, false, true] if self.credential.is_some() => {
                let name = self.account.as_deref().unwrap_or_default();
                let method = self.credential.unwrap_or(EntraMethod::ManagedIdentity);
                if self.key.is_some() || self.key_env.is_some() {
                    bail!("{key}.credential: give an account key or an Entra ID credential, not both");
                }
                let client_secret = match &self.client_secret_env {
                    Some(var) => Some(azure_core::credentials::Secret::new(env("client_secret_env", var)?)),
                    None => None,
                };
                let options = EntraOptions { client_id: self.client_id.clone(), tenant_id: self.tenant_id.clone(), client_secret };
                AzureAccount::with_entra(name, method, options, self.endpoint.as_deref()).with_context(|| format!("{key}.credential"))?
            }
            [false, false, true] => {
                let name = self.account.as_deref().unwrap_or_default();
                let secret = match (&self.key, &self.key_env) {
                    (Some(secret), None) => secret.clone(),
                    (None, Some(var)) => env("key_env", var)?,
                    _ => bail!("{key}.account: give the account key as exactly one of key or key_env, or an Entra ID credential"),
                };
                AzureAccount::with_key(name, &secret, self.endpoint.as_deref()).with_context(|| format!("{key}.account"))?
            }
            [false, false, false] => bail!("{key}: give one of connection_string, connection_string_env, or account with key, key_env or credential"),
            _ => bail!("{key}: give only one of connection_string, connection_string_env, or account"),
        };
        if (self.key.is_some() || self.key_env.is_some()) && self.account.is_none() {
            bail!("{key}.key: goes with account, not with a connection string");
        }
        if self.credential.is_none() {
            for (name, given) in
                [("client_id", self.client_id.is_some()), ("tenant_id", self.tenant_id.is_some()), ("client_secret_env", self.client_secret_env.is_some())]
            {
                if given {
                    bail!("{key}.{name}: goes with credential (an Entra ID identity)");
                }
            }
        }
        let account = match &self.ca_file {
            Some(file) => {
                let path = base.join(file);
                let pem = read_bounded(&path, MAX_CA_FILE_BYTES).with_context(|| format!("{key}.ca_file: {}", path.display()))?;
                account.with_root_certificate(&pem).with_context(|| format!("{key}.ca_file: {}", path.display()))?
            }
            None => account,
        };
        if self.endpoint.is_some() && self.account.is_none() {
            bail!("{key}.endpoint: goes with account (a connection string carries its own QueueEndpoint)");
        }
        let encoding = match self.message_encoding.unwrap_or(MessageEncoding::Base64) {
            MessageEncoding::Base64 => Encoding::Base64,
            MessageEncoding::None => Encoding::None,
        };
        Ok((account, encoding))
    }
}

/// `[aws]` (every SQS queue's) or `[queues.<name>.sqs]` (one queue's, over `[aws]` key by
/// key): where SQS is and how calls are signed. With neither, the SDK's standard
/// environment decides (`AWS_REGION`, `AWS_ENDPOINT_URL_SQS`, `AWS_ENDPOINT_URL`, the
/// credential chain).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqsFile {
    /// The region, e.g. `eu-west-1`. Default: the SDK's (`AWS_REGION`, the shared profile).
    pub region: Option<String>,
    /// The endpoint, e.g. `http://127.0.0.1:5000` (moto, LocalStack). Default: the SDK's
    /// (`AWS_ENDPOINT_URL_SQS`, `AWS_ENDPOINT_URL`), else AWS's for the region.
    pub endpoint: Option<String>,
    /// The environment variable holding a static access key id (with
    /// `secret_access_key_env`). Default: the SDK's credential chain.
    pub access_key_id_env: Option<String>,
    /// The environment variable holding the secret access key.
    pub secret_access_key_env: Option<String>,
    /// The environment variable holding a session token (temporary keys).
    pub session_token_env: Option<String>,
    /// How bodies are written: `auto` (default: text as it is, other bodies base64 marked
    /// by the `ebb-encoding` attribute) or `text` (refuse bodies SQS cannot carry).
    pub message_encoding: Option<SqsMessageEncoding>,
    /// `[queues.<name>.sqs]` only: the queue's URL, for an SQS queue not named like the
    /// ebb queue (or of another account). Default: looked up by the queue's name.
    pub queue_url: Option<String>,
    /// The S3 bucket that holds bodies too large for a message (claim checks, in the SQS
    /// Extended Client's format), created when missing. Default: none, such bodies refused.
    pub claim_bucket: Option<String>,
}

/// `message_encoding` of an SQS queue.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SqsMessageEncoding {
    /// Text as it is, other bodies as marked base64.
    Auto,
    /// Text only.
    Text,
}

impl SqsFile {
    /// The backend of a queue with its own keys `own` (`[queues.<name>.sqs]`) over the
    /// host's `host` (`[aws]`).
    pub(super) fn backend(queue: &str, own: Option<&SqsFile>, host: Option<&SqsFile>) -> Result<Backend> {
        if host.is_some_and(|host| host.queue_url.is_some()) {
            bail!("[aws].queue_url: a queue's own, in [queues.<name>.sqs]");
        }
        let (own, host) = (own.cloned().unwrap_or_default(), host.cloned().unwrap_or_default());
        // Each key from the queue's table, else from [aws]; errors name where it came from.
        let (region, endpoint) = (own.region.clone().or(host.region.clone()), own.endpoint.clone().or(host.endpoint.clone()));
        if region.as_deref().is_some_and(|region| region.trim().is_empty()) {
            let table = if own.region.is_some() { "sqs" } else { "[aws]" };
            bail!("{table}.region: empty; give a region such as \"eu-west-1\", or leave it out for the SDK's (AWS_REGION)");
        }
        if let Some(url) = &own.queue_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            bail!("sqs.queue_url: {url:?} is not an http:// or https:// URL");
        }
        if let Some(endpoint) = &endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            let table = if own.endpoint.is_some() { "sqs" } else { "[aws]" };
            bail!("{table}.endpoint: {endpoint:?} is not an http:// or https:// URL");
        }
        // The keys come as a set, from the queue's table or from [aws], never mixed.
        let own_keys = own.access_key_id_env.is_some() || own.secret_access_key_env.is_some() || own.session_token_env.is_some();
        let (keys, table) = if own_keys { (&own, "sqs") } else { (&host, "[aws]") };
        let env = |var_key: &str, var: &str| -> Result<String> {
            std::env::var(var).map_err(|_| anyhow::anyhow!("{table}.{var_key}: the environment variable {var} is not set"))
        };
        let credentials = match (&keys.access_key_id_env, &keys.secret_access_key_env) {
            (Some(id), Some(secret)) => AwsCredentials::Static {
                access_key_id: env("access_key_id_env", id)?,
                secret_access_key: env("secret_access_key_env", secret)?,
                session_token: keys.session_token_env.as_deref().map(|var| env("session_token_env", var)).transpose()?,
            },
            (None, None) if keys.session_token_env.is_some() => bail!("{table}.session_token_env: goes with access_key_id_env and secret_access_key_env"),
            (None, None) => AwsCredentials::DefaultChain,
            _ => bail!("{table}.access_key_id_env: give both access_key_id_env and secret_access_key_env, or neither (the SDK's credential chain)"),
        };
        let encoding = match own.message_encoding.or(host.message_encoding).unwrap_or(SqsMessageEncoding::Auto) {
            SqsMessageEncoding::Auto => crate::queue::sqs::Encoding::Auto,
            SqsMessageEncoding::Text => crate::queue::sqs::Encoding::Text,
        };
        let claim_bucket = own.claim_bucket.clone().or(host.claim_bucket.clone());
        if let Some(defect) = claim_bucket.as_deref().and_then(crate::payload::bucket_defect) {
            let table = if own.claim_bucket.is_some() { "sqs" } else { "[aws]" };
            bail!("{table}.claim_bucket: {defect}");
        }
        let account = SqsAccount::new(AwsSettings { region, endpoint, credentials, ..AwsSettings::default() });
        Ok(Backend::Sqs { account, encoding, queue_url: own.queue_url.map(|url| (queue.to_string(), url)), claim_bucket })
    }
}
