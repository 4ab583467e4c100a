//! Where a queue's messages live: the embedded store or an Azure account (`[azure]`,
//! `[queues.<name>.azure]`), and how the account's keys are checked.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;

use super::checks::{MAX_CA_FILE_BYTES, read_bounded};
use crate::queue::azure::{AzureAccount, Encoding, EntraMethod, EntraOptions};

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
