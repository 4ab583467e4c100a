//! Where and how to reach Amazon SQS: the region, an endpoint (moto, LocalStack), and the
//! credentials. The SDK's configuration is loaded once, on the first call, and shared by
//! every queue of the account.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_sqs::config::Credentials;
use tokio::sync::OnceCell;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Attempts of each S3 request of the claim checks (the first and its retries).
pub(crate) const S3_ATTEMPTS: u32 = 4;

/// Where the credentials come from.
#[derive(Clone, Default)]
pub enum AwsCredentials {
    /// The SDK's default chain: the environment (`AWS_ACCESS_KEY_ID`, …), the shared
    /// profile, web identity (EKS), container and instance metadata.
    #[default]
    DefaultChain,
    /// Static keys (read from environment variables the config names).
    Static {
        /// The access key id (not secret, but not printed either).
        access_key_id: String,
        /// The secret access key; never printed.
        secret_access_key: String,
        /// A session token, for temporary keys; never printed.
        session_token: Option<String>,
    },
}

impl std::fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AwsCredentials::DefaultChain => "DefaultChain",
            AwsCredentials::Static { .. } => "Static { <redacted> }",
        })
    }
}

/// The settings of an SQS account.
#[derive(Debug, Clone)]
pub struct AwsSettings {
    /// The region; `None`: the SDK's (`AWS_REGION`, the shared profile).
    pub region: Option<String>,
    /// The endpoint; `None`: the SDK's (`AWS_ENDPOINT_URL_SQS`, `AWS_ENDPOINT_URL`, or AWS's).
    pub endpoint: Option<String>,
    /// The credentials.
    pub credentials: AwsCredentials,
    /// Longest a call may take (connect, send, read the answer) before it fails as transient.
    pub request_timeout: Duration,
}

impl Default for AwsSettings {
    fn default() -> Self {
        AwsSettings { region: None, endpoint: None, credentials: AwsCredentials::DefaultChain, request_timeout: super::DEFAULT_REQUEST_TIMEOUT }
    }
}

/// An SQS account: its settings and, once loaded, the SDK client every queue of it shares.
/// Cheap to clone.
#[derive(Clone)]
pub struct SqsAccount {
    settings: Arc<AwsSettings>,
    client: Arc<OnceCell<aws_sdk_sqs::Client>>,
    /// The S3 client of the queues' claim checks (`payload::claims::S3Claims`).
    s3: Arc<OnceCell<aws_sdk_s3::Client>>,
}

impl std::fmt::Debug for SqsAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsAccount").field("settings", &self.settings).finish()
    }
}

impl SqsAccount {
    /// An account with `settings`; nothing is read or called until its first queue call.
    pub fn new(settings: AwsSettings) -> SqsAccount {
        SqsAccount { settings: Arc::new(settings), client: Arc::default(), s3: Arc::default() }
    }

    /// Its settings.
    pub fn settings(&self) -> &AwsSettings {
        &self.settings
    }

    /// Where it calls, for errors and logs: the region and the endpoint as configured.
    pub fn describe(&self) -> String {
        let region = self.settings.region.as_deref().unwrap_or("the SDK's region");
        match &self.settings.endpoint {
            Some(endpoint) => format!("SQS in {region} at {endpoint}"),
            None => format!("SQS in {region}"),
        }
    }

    /// The SDK client, loading the configuration on first use: the SDK's own retries are
    /// off ([`Retrying`](crate::queue::Retrying) retries ours), every call is bounded by the
    /// request timeout.
    pub(crate) async fn client(&self) -> anyhow::Result<&aws_sdk_sqs::Client> {
        self.client.get_or_try_init(|| load(&self.settings)).await
    }

    /// The S3 client of the account's claim checks, loaded on first use like the SQS one's
    /// configuration, but with the SDK's standard retries (a claim store has no retrying
    /// decorator) and no limit on a whole attempt (a 100 MiB upload takes its time; a
    /// connection that stops answering still fails on the read timeout). An endpoint
    /// (moto, LocalStack) is addressed path-style: they serve no bucket host names.
    pub(crate) async fn s3_client(&self) -> anyhow::Result<&aws_sdk_s3::Client> {
        self.s3
            .get_or_try_init(|| async {
                let timeouts = TimeoutConfig::builder()
                    .connect_timeout(CONNECT_TIMEOUT.min(self.settings.request_timeout))
                    .read_timeout(self.settings.request_timeout)
                    .build();
                let retry = RetryConfig::standard().with_max_attempts(S3_ATTEMPTS);
                let config = sdk_config(&self.settings, retry, timeouts).await?;
                let s3 = aws_sdk_s3::config::Builder::from(&config).force_path_style(self.settings.endpoint.is_some()).build();
                Ok(aws_sdk_s3::Client::from_conf(s3))
            })
            .await
    }
}

async fn load(settings: &AwsSettings) -> anyhow::Result<aws_sdk_sqs::Client> {
    let timeouts =
        TimeoutConfig::builder().connect_timeout(CONNECT_TIMEOUT.min(settings.request_timeout)).operation_attempt_timeout(settings.request_timeout).build();
    Ok(aws_sdk_sqs::Client::new(&sdk_config(settings, RetryConfig::disabled(), timeouts).await?))
}

/// The SDK's configuration for `settings`, with `retry` and `timeouts`.
async fn sdk_config(settings: &AwsSettings, retry: RetryConfig, timeouts: TimeoutConfig) -> anyhow::Result<aws_config::SdkConfig> {
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).retry_config(retry).timeout_config(timeouts);
    if let Some(region) = &settings.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(endpoint) = &settings.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    if let AwsCredentials::Static { access_key_id, secret_access_key, session_token } = &settings.credentials {
        loader = loader.credentials_provider(Credentials::new(access_key_id, secret_access_key, session_token.clone(), None, "ebb-config"));
    }
    let config = loader.load().await;
    config.region().context("no AWS region: set region in [aws], or AWS_REGION").map_err(|e| anyhow!("{e:#}"))?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_keys_are_never_printed() {
        let credentials = AwsCredentials::Static {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG".into(),
            session_token: Some("TOKEN".into()),
        };
        let account = SqsAccount::new(AwsSettings { credentials, ..AwsSettings::default() });
        let printed = format!("{account:?} {}", account.describe());
        for secret in ["AKIDEXAMPLE", "wJalrXUtnFEMI", "TOKEN"] {
            assert!(!printed.contains(secret), "{printed}");
        }
    }
}
