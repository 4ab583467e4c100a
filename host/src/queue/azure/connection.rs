//! Where the account is and how to authenticate to it: parsed from a connection string, or
//! built from an account name, key and optional endpoint. Secrets are never printed.

use std::sync::Arc;

use anyhow::{Context as _, anyhow, bail};
use azure_core::credentials::{Secret, TokenCredential};
use azure_core::http::Url;

/// Azurite's well-known development account (public, documented by Microsoft).
pub const DEVELOPMENT_ACCOUNT: &str = "devstoreaccount1";
/// Azurite's well-known development account key (public, documented by Microsoft).
pub const DEVELOPMENT_KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// Azurite's default queue endpoint.
pub const DEVELOPMENT_QUEUE_ENDPOINT: &str = "http://127.0.0.1:10001/devstoreaccount1";
/// Azurite's default blob endpoint.
pub const DEVELOPMENT_BLOB_ENDPOINT: &str = "http://127.0.0.1:10000/devstoreaccount1";

/// How requests prove who they are.
#[derive(Clone)]
pub(crate) enum Credential {
    /// The account key (base64): every request is signed with it.
    SharedKey(Secret),
    /// A shared access signature (the query string, without `?`): appended to every URL.
    Sas(Secret),
    /// An Entra ID (Azure AD) token, from the identity `EntraMethod` names (https only).
    Entra(EntraMethod, Arc<dyn TokenCredential>),
}

/// Where an Entra ID token comes from (the `azure_identity` credentials).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum EntraMethod {
    /// The VM's, App Service's or container's managed identity (a user-assigned one with `client_id`).
    ManagedIdentity,
    /// Kubernetes workload identity (`AZURE_CLIENT_ID`, `AZURE_TENANT_ID`, `AZURE_FEDERATED_TOKEN_FILE`).
    WorkloadIdentity,
    /// The signed-in Azure CLI (`az account get-access-token`), for development.
    AzureCli,
    /// The Azure CLI, then the Azure Developer CLI, for development.
    DeveloperTools,
    /// A service principal's secret (`tenant_id`, `client_id`, and the secret).
    ClientSecret,
}

impl EntraMethod {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            EntraMethod::ManagedIdentity => "managed-identity",
            EntraMethod::WorkloadIdentity => "workload-identity",
            EntraMethod::AzureCli => "azure-cli",
            EntraMethod::DeveloperTools => "developer-tools",
            EntraMethod::ClientSecret => "client-secret",
        }
    }
}

/// What an Entra identity needs beyond its method.
#[derive(Debug, Clone, Default)]
pub(crate) struct EntraOptions {
    /// A user-assigned managed identity's, a workload identity's or a service principal's client id.
    pub client_id: Option<String>,
    /// The tenant (directory) id.
    pub tenant_id: Option<String>,
    /// A service principal's secret (`client-secret` only).
    pub client_secret: Option<Secret>,
}

/// A storage account's queue service and the credential to use.
#[derive(Clone)]
pub struct AzureAccount {
    name: String,
    endpoint: Url,
    credential: Credential,
    /// An extra trusted root for an https endpoint (PEM), e.g. a private CA.
    root_certificate: Option<Arc<[u8]>>,
    /// The blob service (claim checks, `ebb::payload::claims`): a connection string's
    /// `BlobEndpoint`, or the queue endpoint's host with `.queue.` read as `.blob.`; `None`
    /// when neither gives one (Azurite on a port of the caller's: set it). Boxed: the
    /// account sits in every Azure queue's configuration.
    blob_endpoint: Option<Box<Url>>,
}

impl std::fmt::Debug for AzureAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let credential = match self.credential {
            Credential::SharedKey(_) => "SharedKey(<redacted>)",
            Credential::Sas(_) => "Sas(<redacted>)",
            Credential::Entra(method, _) => method.as_str(),
        };
        f.debug_struct("AzureAccount")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint.as_str())
            .field("blob_endpoint", &self.blob_endpoint.as_deref().map(Url::as_str))
            .field("credential", &credential)
            .finish()
    }
}

impl AzureAccount {
    /// An account with its key. `endpoint` is the queue service URL (for Azurite,
    /// `http://127.0.0.1:10001/devstoreaccount1`); `None` means
    /// `https://<account>.queue.core.windows.net`.
    pub fn with_key(account: &str, key: &str, endpoint: Option<&str>) -> anyhow::Result<Self> {
        check_account(account)?;
        let key = parse_key(key)?;
        let endpoint = match endpoint {
            Some(endpoint) => parse_endpoint(endpoint)?,
            None => parse_endpoint(&format!("https://{account}.queue.core.windows.net"))?,
        };
        let blob_endpoint = blob_endpoint_beside(&endpoint);
        Ok(AzureAccount { name: account.to_string(), endpoint, credential: Credential::SharedKey(key), root_certificate: None, blob_endpoint })
    }

    /// An account reached with an Entra ID token from `method`. The endpoint must be https
    /// (tokens never travel in the clear); `None` means `https://<account>.queue.core.windows.net`.
    /// The identity needs a data role on the account, e.g. "Storage Queue Data Message Processor"
    /// (get, delete, update), "Storage Queue Data Message Sender" (add) or "Storage Queue Data
    /// Contributor" (all, and create).
    pub(crate) fn with_entra(account: &str, method: EntraMethod, options: EntraOptions, endpoint: Option<&str>) -> anyhow::Result<Self> {
        use azure_identity::{
            AzureCliCredential, ClientSecretCredential, DeveloperToolsCredential, ManagedIdentityCredential, ManagedIdentityCredentialOptions, UserAssignedId,
            WorkloadIdentityCredential, WorkloadIdentityCredentialOptions,
        };
        check_account(account)?;
        let endpoint = match endpoint {
            Some(endpoint) => parse_endpoint(endpoint)?,
            None => parse_endpoint(&format!("https://{account}.queue.core.windows.net"))?,
        };
        if endpoint.scheme() != "https" {
            bail!("queue endpoint {endpoint} must be https with an Entra ID credential (tokens never travel in the clear)");
        }
        let unused = |what: &str, given: bool| if given { Err(anyhow!("{what} does not go with credential = \"{}\"", method.as_str())) } else { Ok(()) };
        let made = match method {
            EntraMethod::ManagedIdentity => {
                unused("tenant_id", options.tenant_id.is_some())?;
                unused("client_secret", options.client_secret.is_some())?;
                let user_assigned_id = options.client_id.map(UserAssignedId::ClientId);
                ManagedIdentityCredential::new(Some(ManagedIdentityCredentialOptions { user_assigned_id, ..Default::default() }))
                    .map(|c| c as Arc<dyn TokenCredential>)
            }
            EntraMethod::WorkloadIdentity => {
                unused("client_secret", options.client_secret.is_some())?;
                let options = WorkloadIdentityCredentialOptions { client_id: options.client_id, tenant_id: options.tenant_id, ..Default::default() };
                WorkloadIdentityCredential::new(Some(options)).map(|c| c as Arc<dyn TokenCredential>)
            }
            EntraMethod::AzureCli | EntraMethod::DeveloperTools => {
                unused("client_id", options.client_id.is_some())?;
                unused("client_secret", options.client_secret.is_some())?;
                if method == EntraMethod::AzureCli {
                    let options = azure_identity::AzureCliCredentialOptions { tenant_id: options.tenant_id, ..Default::default() };
                    AzureCliCredential::new(Some(options)).map(|c| c as Arc<dyn TokenCredential>)
                } else {
                    unused("tenant_id", options.tenant_id.is_some())?;
                    DeveloperToolsCredential::new(None).map(|c| c as Arc<dyn TokenCredential>)
                }
            }
            EntraMethod::ClientSecret => {
                let (Some(tenant), Some(client), Some(secret)) = (options.tenant_id, options.client_id, options.client_secret) else {
                    bail!("credential = \"client-secret\" needs tenant_id, client_id and the secret");
                };
                ClientSecretCredential::new(&tenant, client, secret, None).map(|c| c as Arc<dyn TokenCredential>)
            }
        };
        let token = made.map_err(|e| anyhow!("Entra ID credential {}: {e}", method.as_str()))?;
        let blob_endpoint = blob_endpoint_beside(&endpoint);
        Ok(AzureAccount { name: account.to_string(), endpoint, credential: Credential::Entra(method, token), root_certificate: None, blob_endpoint })
    }

    /// Trusts `pem` (one or more certificates) as an extra root for this account's https
    /// endpoint, besides the system's roots.
    pub fn with_root_certificate(mut self, pem: &[u8]) -> anyhow::Result<Self> {
        let certificates = azure_reqwest::Certificate::from_pem_bundle(pem).map_err(|e| anyhow!("not a PEM certificate: {e}"))?;
        if certificates.is_empty() {
            bail!("no PEM certificate in it (-----BEGIN CERTIFICATE----- …)");
        }
        // Parsed once more the way the client is built, so a damaged certificate fails here.
        certificates
            .into_iter()
            .try_fold(azure_reqwest::Client::builder(), |builder, c| Ok::<_, anyhow::Error>(builder.add_root_certificate(c)))?
            .build()
            .map_err(|e| anyhow!("not a usable certificate: {e}"))?;
        self.root_certificate = Some(Arc::from(pem));
        Ok(self)
    }

    /// The extra trusted root, if any (PEM).
    pub(crate) fn root_certificate(&self) -> Option<&[u8]> {
        self.root_certificate.as_deref()
    }

    /// Azurite's development account on its default endpoint.
    pub fn development_storage() -> Self {
        Self::with_key(DEVELOPMENT_ACCOUNT, DEVELOPMENT_KEY, Some(DEVELOPMENT_QUEUE_ENDPOINT)).expect("the development account is valid")
    }

    /// Parses an Azure Storage connection string: `AccountName=…;AccountKey=…` (with
    /// `DefaultEndpointsProtocol`, `EndpointSuffix` or `QueueEndpoint`),
    /// `SharedAccessSignature=…` with `QueueEndpoint` (or `AccountName`), or
    /// `UseDevelopmentStorage=true`. Errors name the missing or bad part, never a secret.
    pub fn from_connection_string(text: &str) -> anyhow::Result<Self> {
        let (account, blob_endpoint) = ConnectionParts::parse(text)?.account()?;
        match blob_endpoint {
            Some(endpoint) => account.with_blob_endpoint(&endpoint),
            None => Ok(account),
        }
    }

    /// The account's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The queue service endpoint (no secret in it).
    pub fn endpoint(&self) -> &Url {
        &self.endpoint
    }

    /// The same account with its blob service at `endpoint` (for claim checks).
    pub fn with_blob_endpoint(mut self, endpoint: &str) -> anyhow::Result<Self> {
        let url = parse_endpoint(endpoint).map_err(|e| anyhow!("BlobEndpoint: {e:#}"))?;
        if matches!(self.credential, Credential::Entra(..)) && url.scheme() != "https" {
            bail!("blob endpoint {url} must be https with an Entra ID credential (tokens never travel in the clear)");
        }
        self.blob_endpoint = Some(Box::new(url));
        Ok(self)
    }

    /// The blob service endpoint, if known (no secret in it).
    pub fn blob_endpoint(&self) -> Option<&Url> {
        self.blob_endpoint.as_deref()
    }

    /// The URL of blob container `name`, with the SAS in its query if the credential is
    /// one; an error if the account has no blob endpoint.
    pub fn container_url(&self, name: &str) -> anyhow::Result<Url> {
        let mut url = self
            .blob_endpoint
            .as_deref()
            .cloned()
            .ok_or_else(|| anyhow!("account {}: no blob endpoint for claim checks: add BlobEndpoint=… to the connection string", self.name))?;
        let path = format!("{}/{name}", url.path().trim_end_matches('/'));
        url.set_path(&path);
        if let Credential::Sas(sas) = &self.credential {
            url.set_query(Some(sas.secret()));
        }
        Ok(url)
    }

    /// The credential.
    pub(crate) fn credential(&self) -> &Credential {
        &self.credential
    }

    /// An account SAS for the queue service, signed with the account's key, valid until
    /// `expiry`: `permissions` are Azure's letters (`r` read/peek, `a` add, `u` update,
    /// `p` process: get and delete, `c` create, `l` list), for containers and objects, https
    /// and http. The answer is the SAS query (no leading `?`), for `SharedAccessSignature=`.
    pub fn account_sas(&self, permissions: &str, expiry: std::time::SystemTime) -> anyhow::Result<String> {
        let Credential::SharedKey(key) = &self.credential else {
            bail!("account {}: signing a SAS needs the account key", self.name);
        };
        super::auth::account_sas(&self.name, key, permissions, expiry)
    }

    /// The URL of queue `name`, with the SAS in its query if the credential is one.
    pub(crate) fn queue_url(&self, name: &str) -> anyhow::Result<Url> {
        let mut url = self.endpoint.clone();
        let path = format!("{}/{name}", url.path().trim_end_matches('/'));
        url.set_path(&path);
        if let Credential::Sas(sas) = &self.credential {
            url.set_query(Some(sas.secret()));
        }
        Ok(url)
    }
}

fn check_account(account: &str) -> anyhow::Result<()> {
    if account.is_empty() || !account.chars().all(|c| c.is_ascii_alphanumeric()) {
        bail!("storage account name {account:?} is invalid: use lowercase letters and digits");
    }
    Ok(())
}

fn parse_key(key: &str) -> anyhow::Result<Secret> {
    if key.is_empty() {
        bail!("the account key is empty");
    }
    azure_core::base64::decode(key).map_err(|_| anyhow!("the account key is not valid base64 (copy it from the portal's Access keys page)"))?;
    Ok(Secret::new(key.to_string()))
}

fn parse_endpoint(endpoint: &str) -> anyhow::Result<Url> {
    let url = Url::parse(endpoint).with_context(|| format!("queue endpoint {endpoint:?} is not a URL"))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        bail!("queue endpoint {endpoint:?} must be http or https");
    }
    if url.query().is_some() {
        bail!("queue endpoint must not carry a query: put a SAS in SharedAccessSignature");
    }
    if !url.username().is_empty() || url.password().is_some() {
        bail!("queue endpoint must not carry a user name or password: give the credential as a key, a SAS or an Entra ID identity");
    }
    if url.cannot_be_a_base() || url.host().is_none() {
        bail!("queue endpoint {endpoint:?} has no host");
    }
    Ok(url)
}

/// `https://acct.queue.core.windows.net` → `https://acct.blob.core.windows.net`; nothing
/// for an endpoint whose host does not name the queue service (Azurite's `127.0.0.1`).
fn blob_endpoint_beside(queue: &Url) -> Option<Box<Url>> {
    let host = queue.host_str()?;
    let (first, rest) = host.split_once('.')?;
    let rest = rest.strip_prefix("queue.")?;
    let mut url = queue.clone();
    url.set_host(Some(&format!("{first}.blob.{rest}"))).ok()?;
    Some(Box::new(url))
}

/// `https://acct.queue.core.windows.net` → `acct`; `http://127.0.0.1:10001/acct` → `acct`.
fn account_from_endpoint(url: &Url) -> Option<String> {
    let host = url.host_str()?;
    if let Some((first, rest)) = host.split_once('.')
        && rest.starts_with("queue.")
    {
        return Some(first.to_string());
    }
    url.path_segments()?.find(|s| !s.is_empty()).map(str::to_string)
}

/// The settings of a connection string, as given.
#[derive(Default)]
struct ConnectionParts {
    protocol: Option<String>,
    name: Option<String>,
    key: Option<String>,
    sas: Option<String>,
    queue_endpoint: Option<String>,
    blob_endpoint: Option<String>,
    suffix: Option<String>,
    development: bool,
}

impl ConnectionParts {
    fn parse(text: &str) -> anyhow::Result<ConnectionParts> {
        let mut parts = ConnectionParts::default();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((setting, value)) = part.split_once('=') else {
                // Never echo the part: it may be a secret pasted without its name.
                bail!("connection string: a part has no '=' (expected Name=value pairs separated by ';')");
            };
            parts.set(setting.trim(), value.trim())?;
        }
        Ok(parts)
    }

    /// Takes one `Name=value` setting.
    fn set(&mut self, setting: &str, value: &str) -> anyhow::Result<()> {
        match setting.to_ascii_lowercase().as_str() {
            "defaultendpointsprotocol" => self.protocol = Some(value.to_string()),
            "accountname" => self.name = Some(value.to_string()),
            "accountkey" => self.key = Some(value.to_string()),
            "sharedaccesssignature" => self.sas = Some(value.to_string()),
            "queueendpoint" => self.queue_endpoint = Some(value.to_string()),
            "blobendpoint" => self.blob_endpoint = Some(value.to_string()),
            "endpointsuffix" => self.suffix = Some(value.to_string()),
            "usedevelopmentstorage" => match value.to_ascii_lowercase().as_str() {
                "true" => self.development = true,
                "false" => {}
                _ => bail!("connection string: UseDevelopmentStorage must be true or false"),
            },
            // Other services' settings: allowed in a shared connection string, unused here.
            "tableendpoint"
            | "fileendpoint"
            | "blobsecondaryendpoint"
            | "queuesecondaryendpoint"
            | "tablesecondaryendpoint"
            | "filesecondaryendpoint"
            | "developmentstorageproxyuri" => {}
            // Name it only if it looks like a setting name: a bare secret ending in '='
            // splits like one.
            other if other.len() <= 32 && other.chars().all(|c| c.is_ascii_alphabetic()) => {
                bail!("connection string: unknown setting {other:?}")
            }
            _ => bail!("connection string: a part is not a known Name=value setting (not shown: it may be a secret)"),
        }
        Ok(())
    }

    /// The account and the `BlobEndpoint` if the connection string gives one (or, for
    /// development storage, Azurite's default).
    fn account(self) -> anyhow::Result<(AzureAccount, Option<String>)> {
        if self.development {
            return self.development_account();
        }
        let protocol = self.protocol.clone().unwrap_or_else(|| "https".into());
        if protocol != "https" && protocol != "http" {
            bail!("connection string: DefaultEndpointsProtocol must be https or http, not {protocol:?}");
        }
        let default_endpoint = |name: &str| format!("{protocol}://{name}.queue.{}", self.suffix.as_deref().unwrap_or("core.windows.net"));
        match (&self.key, &self.sas) {
            (Some(_), Some(_)) => bail!("connection string: give AccountKey or SharedAccessSignature, not both"),
            (Some(key), None) => {
                let name = self.name.as_deref().ok_or_else(|| anyhow!("connection string: AccountKey needs an AccountName"))?;
                let endpoint = self.queue_endpoint.clone().unwrap_or_else(|| default_endpoint(name));
                Ok((AzureAccount::with_key(name, key, Some(&endpoint))?, self.blob_endpoint))
            }
            (None, Some(sas)) => {
                let endpoint = match (&self.queue_endpoint, &self.name) {
                    (Some(endpoint), _) => endpoint.clone(),
                    (None, Some(name)) => default_endpoint(name),
                    (None, None) => bail!("connection string: SharedAccessSignature needs a QueueEndpoint (or an AccountName)"),
                };
                Ok((sas_account(self.name.clone(), &endpoint, sas)?, self.blob_endpoint))
            }
            (None, None) => bail!("connection string: no credential: give AccountKey, SharedAccessSignature or UseDevelopmentStorage=true"),
        }
    }

    /// Azurite's development account, at the given endpoints or its defaults.
    fn development_account(self) -> anyhow::Result<(AzureAccount, Option<String>)> {
        if self.name.is_some() || self.key.is_some() || self.sas.is_some() {
            bail!("connection string: UseDevelopmentStorage=true takes no AccountName, AccountKey or SharedAccessSignature");
        }
        let endpoint = self.queue_endpoint.as_deref().unwrap_or(DEVELOPMENT_QUEUE_ENDPOINT);
        let blob = self.blob_endpoint.unwrap_or_else(|| DEVELOPMENT_BLOB_ENDPOINT.to_string());
        Ok((AzureAccount::with_key(DEVELOPMENT_ACCOUNT, DEVELOPMENT_KEY, Some(endpoint))?, Some(blob)))
    }
}

/// An account signed by a shared access signature at `endpoint`; its name from the
/// connection string or, when not given, from the endpoint.
fn sas_account(name: Option<String>, endpoint: &str, sas: &str) -> anyhow::Result<AzureAccount> {
    let endpoint = parse_endpoint(endpoint)?;
    let name = match name {
        Some(name) => name,
        None => account_from_endpoint(&endpoint)
            .ok_or_else(|| anyhow!("connection string: cannot tell the account from QueueEndpoint {endpoint}; add AccountName"))?,
    };
    check_account(&name)?;
    let sas = sas.trim_start_matches('?');
    if !sas.contains("sig=") {
        bail!("connection string: SharedAccessSignature has no sig= part");
    }
    super::sas::check_query(sas).map_err(|e| anyhow!("connection string: {e}"))?;
    let blob_endpoint = blob_endpoint_beside(&endpoint);
    Ok(AzureAccount { name, endpoint, credential: Credential::Sas(Secret::new(sas.to_string())), root_certificate: None, blob_endpoint })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "c2VjcmV0LWtleS1ieXRlcw==";

    fn parse(text: &str) -> Result<AzureAccount, String> {
        AzureAccount::from_connection_string(text).map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn connection_strings_parse() {
        struct Case {
            name: &'static str,
            text: String,
            account: &'static str,
            endpoint: &'static str,
            sas: bool,
        }
        let cases = [
            Case {
                name: "account and key: the public endpoint",
                text: format!("DefaultEndpointsProtocol=https;AccountName=orders;AccountKey={KEY};EndpointSuffix=core.windows.net"),
                account: "orders",
                endpoint: "https://orders.queue.core.windows.net/",
                sas: false,
            },
            Case {
                name: "explicit queue endpoint (Azurite)",
                text: format!(
                    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
                ),
                account: "devstoreaccount1",
                endpoint: "http://127.0.0.1:10001/devstoreaccount1",
                sas: false,
            },
            Case {
                name: "another cloud's suffix",
                text: format!("AccountName=orders;AccountKey={KEY};EndpointSuffix=core.chinacloudapi.cn"),
                account: "orders",
                endpoint: "https://orders.queue.core.chinacloudapi.cn/",
                sas: false,
            },
            Case {
                name: "development storage",
                text: "UseDevelopmentStorage=true".into(),
                account: "devstoreaccount1",
                endpoint: "http://127.0.0.1:10001/devstoreaccount1",
                sas: false,
            },
            Case {
                name: "SAS with a queue endpoint",
                text: "QueueEndpoint=https://orders.queue.core.windows.net;SharedAccessSignature=?sv=2022-11-02&ss=q&sig=abc%3D".into(),
                account: "orders",
                endpoint: "https://orders.queue.core.windows.net/",
                sas: true,
            },
        ];
        for case in cases {
            let account = parse(&case.text).unwrap_or_else(|e| panic!("{}: {e}", case.name));
            assert_eq!(account.name(), case.account, "{}", case.name);
            assert_eq!(account.endpoint().as_str(), case.endpoint, "{}", case.name);
            assert_eq!(matches!(account.credential(), Credential::Sas(_)), case.sas, "{}", case.name);
        }
    }

    #[test]
    fn bad_connection_strings_name_the_part_and_never_the_secret() {
        let cases = [
            ("no credential", "AccountName=orders".to_string(), "no credential"),
            ("key without account", format!("AccountKey={KEY}"), "needs an AccountName"),
            ("key not base64", "AccountName=orders;AccountKey=not*base64!secretvalue".into(), "not valid base64"),
            ("both credentials", format!("AccountName=orders;AccountKey={KEY};SharedAccessSignature=sig=x"), "not both"),
            ("SAS without endpoint", "SharedAccessSignature=sv=1&sig=secretvalue".into(), "needs a QueueEndpoint"),
            ("unknown setting", format!("AccountName=orders;AccountKey={KEY};Colour=blue"), "unknown setting \"colour\""),
            ("bare secret", format!("AccountName=orders;{KEY}x"), "not a known Name=value setting"),
            ("bare secret without padding", "AccountName=orders;c2VjcmV0dmFsdWU".into(), "has no '='"),
            ("bad protocol", format!("DefaultEndpointsProtocol=ftp;AccountName=orders;AccountKey={KEY}"), "https or http"),
            ("bad endpoint", format!("AccountName=orders;AccountKey={KEY};QueueEndpoint=nowhere"), "QueueEndpoint"),
            ("bad account", format!("AccountName=Or_ders;AccountKey={KEY}"), "account name"),
            // Review (session 4): user info was taken and ended as a misleading 403.
            ("user info", format!("AccountName=orders;AccountKey={KEY};QueueEndpoint=http://bob:secretvalue@127.0.0.1:1/orders"), "user name or password"),
        ];
        for (name, text, expected) in cases {
            let error = parse(&text).err().unwrap_or_else(|| panic!("{name}: parsed"));
            assert!(error.contains(expected) || (name == "bad endpoint" && error.contains("not a URL")), "{name}: {error}");
            for secret in [KEY, "secretvalue", "not*base64"] {
                assert!(!error.contains(secret), "{name}: the error shows a secret: {error}");
            }
        }
    }

    /// Review (session 4): an empty file, text that is not a certificate, or a PEM block of
    /// garbage passed as `ca_file` and failed only later, as an opaque TLS or builder error.
    #[test]
    fn a_root_certificate_must_hold_a_certificate() {
        let account = parse(&format!("AccountName=orders;AccountKey={KEY}")).unwrap();
        for (name, pem) in [
            ("empty", String::new()),
            ("not PEM", "just some text\n".into()),
            ("garbage in a PEM block", "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n".into()),
        ] {
            assert!(account.clone().with_root_certificate(pem.as_bytes()).is_err(), "{name} was taken");
        }
    }

    #[test]
    fn debug_redacts_the_key_and_the_sas() {
        let keyed = parse(&format!("AccountName=orders;AccountKey={KEY}")).unwrap();
        let sas = parse("QueueEndpoint=https://orders.queue.core.windows.net;SharedAccessSignature=sv=1&sig=secretvalue").unwrap();
        for account in [keyed, sas] {
            let shown = format!("{account:?}");
            assert!(!shown.contains(KEY) && !shown.contains("secretvalue") && shown.contains("<redacted>"), "{shown}");
        }
    }

    #[test]
    fn the_blob_endpoint_is_given_or_found_beside_the_queue_endpoint() {
        let cases = [
            ("the public endpoint", format!("AccountName=orders;AccountKey={KEY}"), Some("https://orders.blob.core.windows.net/")),
            (
                "another cloud",
                format!("AccountName=orders;AccountKey={KEY};EndpointSuffix=core.chinacloudapi.cn"),
                Some("https://orders.blob.core.chinacloudapi.cn/"),
            ),
            (
                "given",
                format!(
                    "AccountName=devstoreaccount1;AccountKey={KEY};QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;BlobEndpoint=http://127.0.0.1:20000/devstoreaccount1"
                ),
                Some("http://127.0.0.1:20000/devstoreaccount1"),
            ),
            ("development storage", "UseDevelopmentStorage=true".to_string(), Some("http://127.0.0.1:10000/devstoreaccount1")),
            ("Azurite's queue alone", format!("AccountName=devstoreaccount1;AccountKey={KEY};QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1"), None),
        ];
        for (name, text, expected) in cases {
            let account = parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(account.blob_endpoint().map(Url::as_str), expected, "{name}");
        }
        let error = parse(&format!("AccountName=orders;AccountKey={KEY};BlobEndpoint=nowhere")).unwrap_err();
        assert!(error.contains("BlobEndpoint"), "{error}");
        let sas = parse("QueueEndpoint=https://acct.queue.core.windows.net/;SharedAccessSignature=sv=1&sig=abc").unwrap();
        assert_eq!(sas.container_url("orders-bodies").unwrap().as_str(), "https://acct.blob.core.windows.net/orders-bodies?sv=1&sig=abc");
        let without = parse(&format!("AccountName=devstoreaccount1;AccountKey={KEY};QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1")).unwrap();
        assert!(format!("{:#}", without.container_url("orders-bodies").unwrap_err()).contains("BlobEndpoint"));
    }

    #[test]
    fn queue_urls_are_path_style_for_azurite_and_carry_the_sas() {
        let azurite = AzureAccount::development_storage();
        assert_eq!(azurite.queue_url("orders").unwrap().as_str(), "http://127.0.0.1:10001/devstoreaccount1/orders");
        let public = AzureAccount::with_key("acct", KEY, None).unwrap();
        assert_eq!(public.queue_url("orders").unwrap().as_str(), "https://acct.queue.core.windows.net/orders");
        let sas = parse("QueueEndpoint=https://acct.queue.core.windows.net/;SharedAccessSignature=sv=1&sig=abc").unwrap();
        assert_eq!(sas.queue_url("orders").unwrap().as_str(), "https://acct.queue.core.windows.net/orders?sv=1&sig=abc");
    }
}
