//! Azure Storage Queues, over the official `azure_storage_queue` SDK.
//!
//! - Auth: Shared Key, signed per try by our own pipeline policy ([`auth`]: the SDK has
//!   none), or a SAS in the URL. Settings come from a connection string or an account, key
//!   and endpoint ([`AzureAccount`]); secrets are never printed.
//! - Retries: the SDK's are off. [`Retrying`](super::Retrying) retries our
//!   [`QueueError::Transient`] errors; every call is bounded by a request timeout, so a hung
//!   connection is a transient error, not a stuck task.
//! - Errors by HTTP status: 408/429/5xx and connection failures are transient; a lost
//!   lease (404 `MessageNotFound`, 400 `PopReceiptMismatch`, or 400 `InvalidQueryParameterValue`
//!   for a receipt never issued) on delete or update is
//!   [`QueueError::StaleReceipt`]; 413 is [`QueueError::MessageTooLarge`]; 404 `QueueNotFound`
//!   is fatal of class [`FailureClass::Missing`] (the retry decorator creates the queue
//!   again); 409 `QueueBeingDeleted` (a create too soon after a delete) is transient; any
//!   other 4xx is fatal, naming the queue, the account and the service's error code.
//! - Bodies: base64 by default (what Azure Functions and the SDKs write), or plain text
//!   ([`Encoding`]). Azure's 64 KiB limit applies to the encoded text. A message whose
//!   text does not decode is delivered with a [`Message::defect`], never dropped.
//! - Messages are put with no expiry (`messagettl=-1`): a worker queue must not lose
//!   unprocessed messages after Azure's default of 7 days.
//!
//! Tested against Azurite 3.37 (`tests/all/azure_queue.rs`).

mod auth;
mod connection;
mod encoding;
mod sas;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::anyhow;
use async_trait::async_trait;
use azure_core::error::ErrorKind;
use azure_core::http::headers::HeaderName;
use azure_core::http::{ClientOptions, RetryOptions, StatusCode, Transport};
use azure_storage_queue::models::{QueueClientGetPropertiesResultHeaders, QueueClientReceiveMessagesOptions, QueueClientSendMessageOptions, QueueMessage};
use azure_storage_queue::{QueueClient as SdkQueueClient, QueueClientOptions};

pub use connection::{AzureAccount, DEVELOPMENT_ACCOUNT, DEVELOPMENT_KEY};
pub(crate) use connection::{Credential, EntraMethod, EntraOptions};
pub use encoding::Encoding;
pub(crate) use sas::QueuePermission;

use super::{FailureClass, MAX_BATCH, MAX_VISIBILITY, Message, MessageId, PopReceipt, QueueClient, QueueError, classified};

/// The storage service version every request asks for (`x-ms-version`): the SDK's own
/// default, which Azurite supports from 3.37.0.
pub const API_VERSION: &str = "2026-04-06";

/// How long one storage call may take before it counts as a transient failure.
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long an idle connection stays in the pool: under the 5 s keep-alive of Node's HTTP
/// server (Azurite), so a poll after a pause never picks a connection the server is closing
/// (which fails the call). Real Azure keeps idle connections longer; raise it there.
pub(crate) const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

const POP_RECEIPT: HeaderName = HeaderName::from_static("x-ms-popreceipt");

/// Options of an Azure queue.
#[derive(Debug, Clone)]
pub struct AzureOptions {
    /// How bodies are written as message text.
    pub encoding: Encoding,
    /// Longest a storage call may take (connect, send, read the answer) before it fails
    /// as transient.
    pub request_timeout: Duration,
    /// How long an idle connection is kept for reuse.
    pub pool_idle_timeout: Duration,
}

impl Default for AzureOptions {
    fn default() -> Self {
        AzureOptions { encoding: Encoding::default(), request_timeout: DEFAULT_REQUEST_TIMEOUT, pool_idle_timeout: DEFAULT_POOL_IDLE_TIMEOUT }
    }
}

/// One queue of an Azure Storage account.
pub struct AzureQueue {
    name: String,
    account: String,
    client: SdkQueueClient,
    options: AzureOptions,
    /// The SAS, to scrub from transport errors (which quote the URL).
    sas: Option<String>,
    /// What a 403 should tell the user to check.
    credential: CredentialKind,
}

#[derive(Debug, Clone, Copy)]
enum CredentialKind {
    SharedKey,
    Sas,
    Entra(EntraMethod),
}

impl std::fmt::Debug for AzureQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureQueue").field("name", &self.name).field("account", &self.account).field("options", &self.options).finish()
    }
}

/// Which call failed, for classifying its error.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    Create,
    Put,
    Get,
    Delete,
    Update,
    Count,
}

impl Call {
    fn verb(self) -> &'static str {
        match self {
            Call::Create => "create",
            Call::Put => "put",
            Call::Get => "get",
            Call::Delete => "delete",
            Call::Update => "update visibility",
            Call::Count => "read the message count",
        }
    }

    /// The permission the call needs, as a SAS `sp` letter and its name.
    fn permission(self) -> &'static str {
        match self {
            Call::Create => {
                "c (create; ebb run creates a queue that does not exist: create it beforehand, or use an account SAS with c; a queue SAS never may)"
            }
            Call::Put => "a (add)",
            Call::Get | Call::Delete => "p (process)",
            Call::Update => "u (update)",
            Call::Count => "r (read)",
        }
    }

    /// The Entra ID data role that allows the call.
    fn role(self) -> &'static str {
        match self {
            Call::Create => "the Storage Queue Data Contributor role (or create the queue beforehand)",
            Call::Put => "the Storage Queue Data Message Sender (or Contributor) role",
            Call::Get | Call::Delete | Call::Update => "the Storage Queue Data Message Processor (or Contributor) role",
            Call::Count => "the Storage Queue Data Reader (or Contributor) role",
        }
    }
}

/// The SDK's client options for `account` (our HTTP client with its timeouts and extra
/// root, the SDK's retries off, Shared Key signing) and the Entra ID credential if that is
/// the account's; a SAS rides in the URL. `what` names the client in errors.
pub fn sdk_client_options(
    account: &AzureAccount,
    request_timeout: Duration,
    pool_idle_timeout: Duration,
    what: &str,
) -> anyhow::Result<(ClientOptions, Option<Arc<dyn azure_core::credentials::TokenCredential>>)> {
    let http = azure_reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT.min(request_timeout))
        .timeout(request_timeout)
        .pool_idle_timeout(pool_idle_timeout)
        .redirect(azure_reqwest::redirect::Policy::none());
    let http = match account.root_certificate() {
        Some(pem) => azure_reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| anyhow!("{what} on account {}: the extra root certificate: {e}", account.name()))?
            .into_iter()
            .fold(http, |builder, certificate| builder.add_root_certificate(certificate)),
        None => http,
    };
    let http = http.build().map_err(|e| anyhow!("{what} on account {}: cannot build the HTTP client: {e}", account.name()))?;
    let mut client_options = ClientOptions { retry: RetryOptions::none(), transport: Some(Transport::new(Arc::new(http))), ..ClientOptions::default() };
    let mut entra = None;
    match account.credential() {
        Credential::SharedKey(key) => client_options.per_try_policies.push(Arc::new(auth::SharedKeyPolicy::new(account.name(), key.clone()))),
        Credential::Sas(_) => {}
        Credential::Entra(_, token) => entra = Some(token.clone()),
    }
    Ok((client_options, entra))
}

impl AzureQueue {
    /// A handle on queue `name` of `account` (create it with
    /// [`QueueClient::create_if_missing`]). Fails if the name is not a valid queue name.
    pub fn new(account: &AzureAccount, name: &str, options: AzureOptions) -> anyhow::Result<Self> {
        check_queue_name(name)?;
        let (client_options, entra) = sdk_client_options(account, options.request_timeout, options.pool_idle_timeout, &format!("queue {name}"))?;
        let sas = match account.credential() {
            Credential::Sas(token) => Some(token.secret().to_string()),
            _ => None,
        };
        let sdk_options = QueueClientOptions { client_options, version: API_VERSION.to_string() };
        let client =
            SdkQueueClient::new(account.queue_url(name)?, entra, Some(sdk_options)).map_err(|e| anyhow!("queue {name} on account {}: {e}", account.name()))?;
        let credential = match account.credential() {
            Credential::SharedKey(_) => CredentialKind::SharedKey,
            Credential::Sas(_) => CredentialKind::Sas,
            Credential::Entra(method, _) => CredentialKind::Entra(*method),
        };
        Ok(AzureQueue { name: name.to_string(), account: account.name().to_string(), client, options, sas, credential })
    }

    /// The storage account's name.
    pub fn account(&self) -> &str {
        &self.account
    }

    /// Runs one storage call under the request timeout and classifies its failure.
    async fn call<T>(&self, call: Call, id: Option<&MessageId>, work: impl Future<Output = azure_core::Result<T>>) -> Result<T, QueueError> {
        match tokio::time::timeout(self.options.request_timeout, work).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(self.classify(call, id, &error)),
            Err(_) => Err(QueueError::Transient(classified(
                FailureClass::Timeout,
                format!("queue {} on account {}: {}: no answer within {:?}", self.name, self.account, call.verb(), self.options.request_timeout),
            ))),
        }
    }

    /// The queue's error for a failed call: what the answer's status and code (or the
    /// transport's failure) mean for the caller.
    fn classify(&self, call: Call, id: Option<&MessageId>, error: &azure_core::Error) -> QueueError {
        let context = format!("queue {} on account {}: {}", self.name, self.account, call.verb());
        let ErrorKind::HttpResponse { status, error_code, .. } = error.kind() else {
            return self.transport_error(&context, error);
        };
        let code = error_code.as_deref().map(crate::health::truncate_reason);
        let code = code.as_deref().unwrap_or("no error code");
        let status_number = u16::from(*status);
        let class = http_failure_class(*status, code);
        let described = classified(class, format!("{context}: {code} ({status_number})"));
        match (*status, code) {
            // The visibility we send is always in range (`seconds_up`), so a bad query
            // parameter on a delete or an update is the receipt: one never issued is a lost lease.
            (StatusCode::NotFound, "MessageNotFound") | (StatusCode::BadRequest, "PopReceiptMismatch" | "InvalidQueryParameterValue")
                if matches!(call, Call::Delete | Call::Update) =>
            {
                QueueError::StaleReceipt { id: id.cloned().unwrap_or_else(|| MessageId::from("")) }
            }
            (StatusCode::PayloadTooLarge, _) | (_, "RequestBodyTooLarge") => {
                let limit = self.options.encoding.max_body_bytes();
                QueueError::MessageTooLarge { size: limit + 1, limit }
            }
            (StatusCode::RequestTimeout | StatusCode::TooManyRequests, _)
            | (StatusCode::InternalServerError | StatusCode::BadGateway | StatusCode::ServiceUnavailable | StatusCode::GatewayTimeout, _) => {
                QueueError::Transient(described)
            }
            (StatusCode::Forbidden, "AuthenticationFailed") => {
                let what = match self.credential {
                    CredentialKind::SharedKey => "the account key".to_string(),
                    CredentialKind::Sas => "the shared access signature".to_string(),
                    CredentialKind::Entra(method) => format!("the Entra ID token from {} (its tenant and audience)", method.as_str()),
                };
                QueueError::Fatal(classified(class, format!("queue {} on account {}: AuthenticationFailed (403): check {what}", self.name, self.account)))
            }
            (StatusCode::Forbidden, "AuthorizationPermissionMismatch" | "AuthorizationFailure") => {
                let needs = match self.credential {
                    CredentialKind::Entra(_) => call.role(),
                    _ => call.permission(),
                };
                QueueError::Fatal(classified(
                    class,
                    format!(
                        "queue {} on account {}: {code} (403): the credential lacks the permission to {}: it needs {needs}",
                        self.name,
                        self.account,
                        call.verb(),
                    ),
                ))
            }
            (StatusCode::NotFound, "QueueNotFound") => QueueError::Fatal(classified(
                FailureClass::Missing,
                format!("queue {} on account {}: {}: QueueNotFound (404): the queue does not exist", self.name, self.account, call.verb()),
            )),
            // Azure refuses to create a queue of a name deleted less than about 30 s ago: it
            // can be created later.
            (StatusCode::Conflict, "QueueBeingDeleted") => QueueError::Transient(classified(
                FailureClass::Other,
                format!(
                    "queue {} on account {}: {}: QueueBeingDeleted (409): it can be created again once Azure has deleted it",
                    self.name,
                    self.account,
                    call.verb()
                ),
            )),
            _ => QueueError::Fatal(described),
        }
    }

    /// A call that got no answer: transient when the connection failed, its text cut and
    /// scrubbed of secrets.
    fn transport_error(&self, context: &str, error: &azure_core::Error) -> QueueError {
        let transient = matches!(error.kind(), ErrorKind::Io | ErrorKind::Connection);
        let mut text = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        // Transport errors quote what a proxy or a hostile server sent: cut them.
        let text = crate::health::truncate_reason(&self.scrub(&text));
        let class = match transient {
            true if text.contains("timed out") || text.contains("deadline has elapsed") => FailureClass::Timeout,
            true => FailureClass::Connection,
            false => FailureClass::Other,
        };
        let error = classified(class, format!("{context}: {text}"));
        if transient { QueueError::Transient(error) } else { QueueError::Fatal(error) }
    }

    /// `text` with the SAS, if any, replaced, and any `sig=` value (the SAS's secret part,
    /// wherever the URL's query order put it) redacted.
    fn scrub(&self, text: &str) -> String {
        let text = match &self.sas {
            Some(sas) if !sas.is_empty() => text.replace(sas.as_str(), "<sas redacted>"),
            _ => text.to_string(),
        };
        redact_signatures(&text)
    }
}

/// What kind of failure an answer's status and error code are, for health and metrics.
fn http_failure_class(status: StatusCode, code: &str) -> FailureClass {
    match (status, code) {
        (StatusCode::TooManyRequests | StatusCode::ServiceUnavailable, _) => FailureClass::Throttled,
        (StatusCode::RequestTimeout | StatusCode::GatewayTimeout, _) | (_, "OperationTimedOut") => FailureClass::Timeout,
        (StatusCode::Unauthorized | StatusCode::Forbidden, _) => FailureClass::Auth,
        _ => FailureClass::Other,
    }
}

/// Replaces the value of every `sig=` query parameter in `text` with `<redacted>`.
pub(crate) fn redact_signatures(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("sig=") {
        let starts_param = at == 0 || rest[..at].ends_with(['?', '&', ';', ' ', '(']);
        out.push_str(&rest[..at + 4]);
        rest = &rest[at + 4..];
        if starts_param {
            let end = rest.find(|c: char| matches!(c, '&' | ';' | ')' | '"' | '\'' | ' ') || c.is_whitespace()).unwrap_or(rest.len());
            out.push_str("<redacted>");
            rest = &rest[end..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod redaction_tests {
    use super::redact_signatures;

    #[test]
    fn every_sig_value_is_redacted_wherever_it_stands() {
        let url = "error sending request (http://127.0.0.1:1/a/q?comp=metadata&sig=SECRET%2BSIG&sv=2020) then sig=OTHER;x";
        let redacted = redact_signatures(url);
        assert!(!redacted.contains("SECRET") && !redacted.contains("OTHER"), "{redacted}");
        assert!(redacted.contains("comp=metadata&sig=<redacted>&sv=2020)"), "{redacted}");
        assert_eq!(redact_signatures("design=1"), "design=1", "only a parameter named sig");
    }
}

/// Azure's rules for queue names: 3–63 characters, lowercase letters, digits and single
/// hyphens, starting and ending with a letter or digit.
fn check_queue_name(name: &str) -> anyhow::Result<()> {
    let valid = (3..=63).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    if valid {
        Ok(())
    } else {
        Err(anyhow!(
            "{name:?} is not a valid Azure queue name: 3 to 63 lowercase letters, digits and single hyphens, starting and ending with a letter or digit"
        ))
    }
}

/// Whole seconds for the service, rounded up, at most 7 days.
fn seconds_up(duration: Duration) -> i32 {
    let capped = duration.min(MAX_VISIBILITY);
    let seconds = capped.as_secs() + u64::from(capped.subsec_nanos() > 0);
    seconds.min(MAX_VISIBILITY.as_secs()) as i32
}

fn system_time(time: Option<azure_core::time::OffsetDateTime>) -> SystemTime {
    time.map_or(SystemTime::UNIX_EPOCH, SystemTime::from)
}

#[async_trait]
impl QueueClient for AzureQueue {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_if_missing(&self) -> Result<(), QueueError> {
        let refusal = match self.call(Call::Create, None, self.client.create(None)).await {
            Ok(_) => return Ok(()),
            // It exists with other metadata: still a queue we can use.
            Err(QueueError::Fatal(error)) if error.to_string().contains("QueueAlreadyExists") => return Ok(()),
            Err(error) if error.failure_class() == Some(FailureClass::Auth) => error,
            Err(error) => return Err(error),
        };
        // Azure refuses a create the credential may not make even of a queue that exists (a
        // SAS without `c`, a role without create): a queue that exists needs no create.
        match self.call(Call::Count, None, self.client.get_properties(None)).await {
            Ok(_) => {
                tracing::info!(queue = %self.name, "queue {} exists; the credential may not create it (refused), and need not", self.name);
                Ok(())
            }
            // Not known yet: the create is tried again.
            Err(error) if error.is_transient() => Err(error),
            // Missing, or not readable either: the refusal is the answer.
            Err(_) => Err(refusal),
        }
    }

    async fn put(&self, body: &[u8], initial_visibility: Duration) -> Result<MessageId, QueueError> {
        let text = self.options.encoding.encode(body)?;
        let content = QueueMessage { message_text: Some(text) }
            .try_into()
            .map_err(|e: azure_core::Error| QueueError::Fatal(anyhow!("queue {}: cannot write the message as XML: {e}", self.name)))?;
        let options = QueueClientSendMessageOptions {
            visibility_timeout: (!initial_visibility.is_zero()).then(|| seconds_up(initial_visibility)),
            message_time_to_live: Some(-1),
            ..Default::default()
        };
        let sent = match self.call(Call::Put, None, self.client.send_message(content, Some(options))).await {
            Err(QueueError::MessageTooLarge { .. }) => {
                return Err(QueueError::MessageTooLarge { size: body.len(), limit: self.options.encoding.max_body_bytes() });
            }
            other => other?,
        };
        let sent = sent.into_model().and_then(|list| list.into_message()).map_err(|e| self.classify(Call::Put, None, &e))?;
        sent.message_id
            .map(MessageId::from)
            .ok_or_else(|| QueueError::Fatal(anyhow!("queue {} on account {}: put: the answer has no message id", self.name, self.account)))
    }

    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
        if max == 0 || max > MAX_BATCH {
            return Err(QueueError::BadBatchSize(max));
        }
        let options = QueueClientReceiveMessagesOptions {
            number_of_messages: Some(max as i32),
            visibility_timeout: Some(seconds_up(visibility).max(1)),
            ..Default::default()
        };
        let received = self.call(Call::Get, None, self.client.receive_messages(Some(options))).await?;
        let received = received.into_model().map_err(|e| self.classify(Call::Get, None, &e))?;
        let mut messages = Vec::new();
        for item in received.items.unwrap_or_default() {
            let (Some(id), Some(pop_receipt)) = (item.message_id, item.pop_receipt) else {
                return Err(QueueError::Fatal(anyhow!("queue {} on account {}: get: a message came without its id or pop receipt", self.name, self.account)));
            };
            let (body, defect) = self.options.encoding.decode(item.message_text.unwrap_or_default());
            messages.push(Message {
                id: id.into(),
                pop_receipt: pop_receipt.into(),
                dequeue_count: item.dequeue_count.unwrap_or(1).clamp(0, i64::from(u32::MAX)) as u32,
                inserted_at: system_time(item.insertion_time),
                next_visible_at: system_time(item.time_next_visible),
                body: body.into(),
                defect,
                fifo: None,
                trace: None,
            });
        }
        Ok(messages)
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), QueueError> {
        self.call(Call::Delete, Some(id), self.client.delete_message(id, pop_receipt, None)).await?;
        Ok(())
    }

    async fn update_visibility(&self, id: &MessageId, pop_receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError> {
        let seconds = seconds_up(visibility);
        let response = self.call(Call::Update, Some(id), self.client.update_message(id, pop_receipt, seconds, None)).await?;
        match response.headers().get_optional_str(&POP_RECEIPT) {
            Some(receipt) => Ok(PopReceipt::from(receipt)),
            None => {
                Err(QueueError::Fatal(anyhow!("queue {} on account {}: update visibility: the answer has no x-ms-popreceipt header", self.name, self.account)))
            }
        }
    }

    async fn approximate_count(&self) -> Result<u64, QueueError> {
        let response = self.call(Call::Count, None, self.client.get_properties(None)).await?;
        match response.approximate_messages_count() {
            Ok(Some(count)) => Ok(count.max(0) as u64),
            Ok(None) => {
                Err(QueueError::Fatal(anyhow!("queue {} on account {}: the answer has no x-ms-approximate-messages-count header", self.name, self.account)))
            }
            Err(error) => Err(self.classify(Call::Count, None, &error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Azure answers a receipt it never issued with 400 `InvalidQueryParameterValue`
    /// (Azurite answers `MessageNotFound`, so the conformance suite cannot show this one).
    #[test]
    fn a_receipt_the_service_calls_invalid_is_a_lost_lease_on_delete_and_update_only() {
        let queue = AzureQueue::new(&AzureAccount::development_storage(), "orders", AzureOptions::default()).unwrap();
        let error = |status, code: &str| {
            azure_core::Error::with_message(ErrorKind::HttpResponse { status, error_code: Some(code.into()), raw_response: None }, "answer")
        };
        let id = MessageId::from("m");
        for call in [Call::Delete, Call::Update] {
            let classified = queue.classify(call, Some(&id), &error(StatusCode::BadRequest, "InvalidQueryParameterValue"));
            assert!(matches!(classified, QueueError::StaleReceipt { .. }), "{classified}");
        }
        let classified = queue.classify(Call::Get, None, &error(StatusCode::BadRequest, "InvalidQueryParameterValue"));
        assert!(matches!(classified, QueueError::Fatal(_)), "a get's bad parameter is ours to fix: {classified}");
    }

    #[test]
    fn failures_are_classed_by_status_and_code() {
        let queue = AzureQueue::new(&AzureAccount::development_storage(), "orders", AzureOptions::default()).unwrap();
        let answer = |status, code: &str| {
            let error = azure_core::Error::with_message(ErrorKind::HttpResponse { status, error_code: Some(code.into()), raw_response: None }, "answer");
            queue.classify(Call::Get, None, &error)
        };
        let cases = [
            (StatusCode::ServiceUnavailable, "ServerBusy", FailureClass::Throttled, true),
            (StatusCode::TooManyRequests, "TooManyRequests", FailureClass::Throttled, true),
            (StatusCode::InternalServerError, "OperationTimedOut", FailureClass::Timeout, true),
            (StatusCode::GatewayTimeout, "no code", FailureClass::Timeout, true),
            (StatusCode::RequestTimeout, "no code", FailureClass::Timeout, true),
            (StatusCode::InternalServerError, "InternalError", FailureClass::Other, true),
            (StatusCode::Forbidden, "AuthenticationFailed", FailureClass::Auth, false),
            (StatusCode::Forbidden, "AuthorizationPermissionMismatch", FailureClass::Auth, false),
            (StatusCode::Unauthorized, "InvalidAuthenticationInfo", FailureClass::Auth, false),
            (StatusCode::NotFound, "QueueNotFound", FailureClass::Missing, false),
            (StatusCode::Conflict, "QueueBeingDeleted", FailureClass::Other, true),
        ];
        for (status, code, class, transient) in cases {
            let error = answer(status, code);
            assert_eq!((error.failure_class(), error.is_transient()), (Some(class), transient), "{status} {code}: {error}");
            assert!(error.to_string().contains(code) || code == "no code" || class == FailureClass::Other, "{error}");
        }
        let hostile = answer(StatusCode::ServiceUnavailable, &"X".repeat(100_000)).to_string();
        assert!(hostile.len() < 1_000, "a huge error code is cut: {} bytes", hostile.len());
        let io = |kind, text: &str| queue.classify(Call::Delete, None, &azure_core::Error::with_message(kind, text.to_string()));
        assert!(io(ErrorKind::Io, &"connection reset ".repeat(10_000)).to_string().len() < 1_000, "a huge transport error is cut");
        assert_eq!(io(ErrorKind::Io, "connection closed before message completed").failure_class(), Some(FailureClass::Connection));
        assert_eq!(io(ErrorKind::Io, "error sending request: operation timed out").failure_class(), Some(FailureClass::Timeout));
    }

    #[test]
    fn durations_round_up_to_whole_seconds_and_saturate_at_seven_days() {
        assert_eq!(seconds_up(Duration::ZERO), 0);
        assert_eq!(seconds_up(Duration::from_millis(1)), 1);
        assert_eq!(seconds_up(Duration::from_millis(1500)), 2);
        assert_eq!(seconds_up(Duration::from_secs(30)), 30);
        assert_eq!(seconds_up(MAX_VISIBILITY), 604_800);
        assert_eq!(seconds_up(Duration::MAX), 604_800);
    }

    #[test]
    fn queue_names_follow_azure_rules() {
        for good in ["orders", "a-1", "abc", &"a".repeat(63)] {
            assert!(check_queue_name(good).is_ok(), "{good}");
        }
        for bad in ["ab", "Orders", "-ab", "ab-", "a--b", "a_b", &"a".repeat(64)] {
            let error = check_queue_name(bad).unwrap_err().to_string();
            assert!(error.contains("not a valid Azure queue name"), "{bad}: {error}");
        }
    }
}
