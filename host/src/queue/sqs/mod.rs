//! Amazon SQS, over the official `aws-sdk-sqs`.
//!
//! - The seam, SQS-shaped: a get is a `ReceiveMessage` of at most [`MAX_GET`] (a get of 32
//!   returns at most 10), `ApproximateReceiveCount` is the dequeue count and `SentTimestamp`
//!   the insertion time; a put is a `SendMessage`, its initial visibility `DelaySeconds` (at
//!   most [`MAX_DELAY`], 15 minutes); visibilities saturate at [`MAX_VISIBILITY`] (12 hours).
//!   The count is `GetQueueAttributes`: visible, in flight and delayed messages.
//! - Receipts: the pop receipt is `<message id> <first receive, ms> <receipt handle>` (the
//!   first receive bounds a visibility: 12 hours from it), so a receipt given with
//!   another message's id is refused as stale without a call (SQS addresses a message by its
//!   handle alone). `ChangeMessageVisibility` issues no new handle: an update returns the
//!   receipt it was given. SQS keeps a message's earlier handles valid (moto deletes and
//!   updates with them; AWS documents that a delete with an old handle succeeds but may not
//!   delete): a stale receipt is [`QueueError::StaleReceipt`] only when SQS refuses it
//!   (`ReceiptHandleIsInvalid`, `MessageNotInflight`), and a message deleted twice is deleted.
//! - The message limit is the queue's `MaximumMessageSize` (up to 1 MiB), read at
//!   [`QueueClient::create_if_missing`]; bodies SQS cannot carry as text go as base64, marked
//!   ([`Encoding`]).
//! - Retries: the SDK's are off; [`Retrying`](super::Retrying) retries our
//!   [`QueueError::Transient`] errors (throttling, 5xx, timeouts, lost connections).
//!   `AccessDenied` names the IAM action the call needs; a queue that does not exist is
//!   [`FailureClass::Missing`] (the retry decorator creates it again).
//! - Long polling: [`QueueClient::server_wait`] offers up to [`MAX_WAIT`] (20 s) of an idle
//!   delay, so the listener's get after an idle sleep waits in `WaitTimeSeconds` and answers
//!   as soon as a message comes. Other gets are short polls (`WaitTimeSeconds` 0): on AWS a
//!   short poll samples some of the queue's servers, so it may return fewer messages than the
//!   queue holds, or none; the message comes with a later get.
//! - Deletes: the listener's go through [`QueueClient::delete_batch`], one
//!   `DeleteMessageBatch` per [`MAX_DELETE_BATCH`] entries, each entry's failure its own;
//!   renewals likewise as `ChangeMessageVisibilityBatch` (`batch`).
//! - Poison: a `RedrivePolicy` naming a dead-letter queue, read at create, leaves poisoning
//!   to SQS ([`QueueClient::dead_letter`], `redrive`).
//! - Metering: [`Metered`](super::Metered) counts one request per call, which is SQS's bill
//!   for a receive (one request however many messages it returns), a delete, an update and a
//!   count, and a send as [`BILLED_CHUNK_BYTES`] chunks of its payload as sent
//!   ([`QueueClient::put_requests`]). The requests no call stands for, the attribute read
//!   after `CreateQueue` and a queue URL's `GetQueueUrl`, are counted as creates
//!   ([`QueueClient::take_setup_requests`]).
//!
//! - FIFO queues (a `.fifo` URL or name; `fifo.rs`): receives carry the group, deduplication
//!   id and sequence number ([`Message::fifo`]); sends go through
//!   [`QueueClient::put_in_group`], a plain put is refused naming the group id.
//!
//! - Claim checks: a message offloaded to S3 goes as the SQS Extended Client's pointer and
//!   such a pointer (ebb's or a foreign producer's) comes in as ebb's offloaded message,
//!   through the [`Offloads`] the queue is given ([`SqsQueue::with_pointers`]; `pointer`).
//!
//! Tested against moto 5.2.5 (`tests/all/sqs/queue.rs`, `tests/all/sqs/faults.rs`).

mod account;
mod batch;
mod encoding;
mod fifo;
mod pointer;
mod probe;
mod redrive;
mod trace;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::anyhow;
use async_trait::async_trait;
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::operation::send_message::builders::SendMessageFluentBuilder;
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};
use tokio::sync::OnceCell;

pub use account::{AwsCredentials, AwsSettings, SqsAccount};
pub(crate) use encoding::ENCODING_ATTRIBUTE;
pub use encoding::Encoding;
pub(crate) use pointer::{Offloads, S3Pointer};

use crate::telemetry::TraceContext;

use super::{DeadLetter, FailureClass, GroupedSend, MAX_BATCH, Message, MessageId, PopReceipt, QueueClient, QueueError, classified};

/// SQS's limit on a receive: at most 10 messages.
pub(crate) const MAX_GET: u32 = 10;

/// SQS's limit on a batch delete (and every batch call): 10 entries.
pub(crate) const MAX_DELETE_BATCH: usize = 10;

/// SQS's limit on a visibility timeout: 12 hours.
pub(crate) const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

/// SQS's limit on a send's delay: 15 minutes.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(15 * 60);

/// SQS's largest message (and the default MaximumMessageSize of a queue created since
/// 2025): 1 MiB. The limit until the queue's own is read.
pub(crate) const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// SQS bills a payload by the chunk: each 64 KiB is one request.
pub(crate) const BILLED_CHUNK_BYTES: usize = 64 * 1024;

/// SQS's longest wait of a receive for a first message (long polling): 20 seconds.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(20);

/// What a long poll leaves of the request timeout for sending the call and reading its
/// answer: a wait never runs into the timeout.
const WAIT_MARGIN: Duration = Duration::from_secs(5);

/// How long one call may take before it counts as a transient failure.
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Options of an SQS queue.
#[derive(Debug, Clone, Default)]
pub struct SqsOptions {
    /// How bodies are written as SQS message bodies.
    pub encoding: Encoding,
    /// The queue's URL, for a queue not named like the ebb queue (or in another account);
    /// `None`: resolved from the name (`CreateQueue`, or `GetQueueUrl`).
    pub queue_url: Option<String>,
}

/// One SQS queue.
pub struct SqsQueue {
    name: String,
    account: SqsAccount,
    options: SqsOptions,
    url: OnceCell<String>,
    /// The queue's MaximumMessageSize, once read.
    max_message_bytes: AtomicUsize,
    /// Answered requests no call of the trait stands for, not yet taken by the meter.
    setup_requests: AtomicU64,
    /// The dead-letter queue its RedrivePolicy names, once read.
    dead_letter: std::sync::Mutex<Option<DeadLetter>>,
    /// A FIFO queue's ContentBasedDeduplication, once read ([`fifo::ContentDeduplication`]).
    content_deduplication: fifo::ContentDeduplication,
    /// What turns offloaded messages into SQS Extended Client pointers and back (the host
    /// gives `payload::ExtendedClientPointers`); `None`: bodies go and come as they are.
    pointers: Option<Arc<dyn Offloads>>,
}

impl std::fmt::Debug for SqsQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsQueue").field("name", &self.name).field("account", &self.account).field("options", &self.options).finish()
    }
}

/// Which call failed, for classifying its error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Create,
    Resolve,
    Attributes,
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
            Call::Resolve => "look up the queue URL",
            Call::Attributes => "read the queue's attributes",
            Call::Put => "put",
            Call::Get => "get",
            Call::Delete => "delete",
            Call::Update => "update visibility",
            Call::Count => "read the message count",
        }
    }

    /// The IAM action the call needs.
    fn action(self) -> &'static str {
        match self {
            Call::Create => "sqs:CreateQueue (or create the queue beforehand)",
            Call::Resolve => "sqs:GetQueueUrl",
            Call::Attributes | Call::Count => "sqs:GetQueueAttributes",
            Call::Put => "sqs:SendMessage",
            Call::Get => "sqs:ReceiveMessage",
            Call::Delete => "sqs:DeleteMessage",
            Call::Update => "sqs:ChangeMessageVisibility",
        }
    }
}

impl SqsQueue {
    /// A handle on SQS queue `name` of `account` (create it with
    /// [`QueueClient::create_if_missing`]). Fails if the name is not a valid SQS queue name.
    pub fn new(account: &SqsAccount, name: &str, options: SqsOptions) -> anyhow::Result<Self> {
        check_queue_name(name)?;
        let url = OnceCell::new_with(options.queue_url.clone());
        Ok(SqsQueue {
            name: name.to_string(),
            account: account.clone(),
            options,
            url,
            max_message_bytes: AtomicUsize::new(MAX_MESSAGE_BYTES),
            setup_requests: AtomicU64::new(0),
            dead_letter: std::sync::Mutex::new(None),
            pointers: None,
            content_deduplication: fifo::ContentDeduplication::default(),
        })
    }

    /// The queue, turning offloaded messages into SQS Extended Client pointers and back
    /// through `pointers`.
    pub(crate) fn with_pointers(mut self, pointers: Option<Arc<dyn Offloads>>) -> Self {
        self.pointers = pointers;
        self
    }

    /// The queue's MaximumMessageSize in bytes, as read at create (1 MiB before).
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes.load(Ordering::Relaxed)
    }

    /// The largest body of any bytes the queue takes (less than
    /// [`SqsQueue::max_message_bytes`] with [`Encoding::Auto`], which may send base64).
    pub fn max_body_bytes(&self) -> usize {
        self.options.encoding.max_body_bytes(self.max_message_bytes())
    }

    fn context(&self, call: Call) -> String {
        format!("queue {} ({}): {}", self.name, self.account.describe(), call.verb())
    }

    async fn client(&self, call: Call) -> Result<&aws_sdk_sqs::Client, QueueError> {
        self.account.client().await.map_err(|e| QueueError::Fatal(classified(FailureClass::Other, format!("{}: {e:#}", self.context(call)))))
    }

    /// The queue's URL: configured, or looked up once by name.
    async fn url(&self) -> Result<&str, QueueError> {
        let url = self
            .url
            .get_or_try_init(|| async {
                let client = self.client(Call::Resolve).await?;
                let answer = self.setup_call(self.call(Call::Resolve, None, client.get_queue_url().queue_name(&self.name).send()).await)?;
                answer.queue_url.ok_or_else(|| QueueError::Fatal(anyhow!("{}: the answer has no queue URL", self.context(Call::Resolve))))
            })
            .await?;
        Ok(url)
    }

    /// Counts a request no call of the trait stands for, once SQS answered it (an attempt
    /// with no answer is not a known billed request, as in the meter).
    fn setup_call<T>(&self, result: Result<T, QueueError>) -> Result<T, QueueError> {
        if !result.as_ref().err().and_then(QueueError::failure_class).is_some_and(|class| class.unanswered()) {
            self.setup_requests.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Sends an offloaded message as the SQS Extended Client's pointer (`pointer`), in
    /// `group` on a FIFO queue (the Extended Client keeps a send's group and deduplication ids).
    async fn put_pointer(&self, pointer: S3Pointer, initial_visibility: Duration, group: Option<&GroupedSend>) -> Result<MessageId, QueueError> {
        let attribute = |data_type: &str, value: String| {
            MessageAttributeValue::builder()
                .data_type(data_type)
                .string_value(value)
                .build()
                .map_err(|e| QueueError::Fatal(anyhow!("{}: the pointer's attribute: {e}", self.context(Call::Put))))
        };
        let url = self.url().await?;
        let client = self.client(Call::Put).await?;
        let mut send = client
            .send_message()
            .queue_url(url)
            .message_body(pointer.to_json())
            .message_attributes(pointer::SIZE_ATTRIBUTE, attribute("Number", pointer.size.to_string())?);
        send = match group {
            Some(group) => send.message_group_id(&group.group).set_message_deduplication_id(group.dedup_id.clone()),
            None => send.delay_seconds(seconds_up(initial_visibility, MAX_DELAY)),
        };
        if let Some(sha256) = pointer.sha256 {
            send = send.message_attributes(pointer::SHA256_ATTRIBUTE, attribute("String", hex::encode(sha256))?);
        }
        send = self.with_trace(send, crate::telemetry::sending().as_ref())?;
        let sent = self.call(Call::Put, None, send.send()).await?;
        sent.message_id.map(MessageId::from).ok_or_else(|| QueueError::Fatal(anyhow!("{}: the answer has no message id", self.context(Call::Put))))
    }

    /// Runs one call and classifies its failure.
    async fn call<T, E>(&self, call: Call, id: Option<&MessageId>, work: impl Future<Output = Result<T, SdkError<E>>>) -> Result<T, QueueError>
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        work.await.map_err(|error| self.classify(call, id, &error))
    }

    fn classify<E>(&self, call: Call, id: Option<&MessageId>, error: &SdkError<E>) -> QueueError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let context = self.context(call);
        let status = error.raw_response().map(|response| response.status().as_u16());
        let (class, transient) = match error {
            SdkError::ServiceError(_) | SdkError::ResponseError(_) => {
                // moto answers an IAM refusal in the query protocol's XML, which the JSON
                // protocol's parser reads as no code: read the code from the body then.
                let body = error.raw_response().and_then(|response| response.body().bytes());
                let xml = || body.and_then(|body| xml_element(body, "Code").map(|code| (code, xml_element(body, "Message"))));
                if error.code().is_none()
                    && let Some((code, message)) = xml()
                {
                    return self.classify_answer(call, id, status.unwrap_or(0), Some(&code), message.as_deref());
                }
                return self.classify_answer(call, id, status.unwrap_or(0), error.code(), error.message());
            }
            SdkError::TimeoutError(_) => (FailureClass::Timeout, true),
            SdkError::DispatchFailure(failure) if failure.is_timeout() => (FailureClass::Timeout, true),
            SdkError::DispatchFailure(failure) if failure.is_user() => (FailureClass::Other, false),
            SdkError::DispatchFailure(_) => (FailureClass::Connection, true),
            _ => (FailureClass::Other, false),
        };
        // Transport errors may quote what a proxy or a hostile server sent: cut them.
        let text = crate::health::truncate_reason(&DisplayErrorContext(error).to_string());
        let error = classified(class, format!("{context}: {text}"));
        if transient { QueueError::Transient(error) } else { QueueError::Fatal(error) }
    }

    /// An answer of SQS that is not success: its HTTP status, error code and message.
    fn classify_answer(&self, call: Call, id: Option<&MessageId>, status: u16, code: Option<&str>, message: Option<&str>) -> QueueError {
        let code = crate::health::truncate_reason(code.unwrap_or("no error code"));
        let message = crate::health::truncate_reason(message.unwrap_or_default());
        let context = self.context(call);
        let described =
            |class| classified(class, format!("{context}: {code} ({status}){}", if message.is_empty() { String::new() } else { format!(": {message}") }));
        // The legacy (query protocol) codes come first, the JSON protocol's second.
        let code_is = |names: &[&str]| names.iter().any(|name| code == *name || code.ends_with(&format!(".{name}")));
        let receipt_call = matches!(call, Call::Delete | Call::Update);
        if receipt_call
            && (code_is(&["ReceiptHandleIsInvalid", "MessageNotInflight"])
                || (code_is(&["InvalidParameterValue"]) && message.to_ascii_lowercase().contains("receipt")))
        {
            return QueueError::StaleReceipt { id: id.cloned().unwrap_or_else(|| MessageId::from("")) };
        }
        if call == Call::Put
            && let Some(refused) = fifo::refused_send(&code, &message)
        {
            return refused;
        }
        if call == Call::Put && (code_is(&["MessageTooLong"]) || (code_is(&["InvalidParameterValue"]) && message.contains("shorter than"))) {
            let limit = self.max_message_bytes();
            return QueueError::MessageTooLarge { size: limit + 1, limit };
        }
        if call == Call::Put && code_is(&["InvalidMessageContents"]) {
            return QueueError::InvalidBody(format!("SQS refused it: {message}"));
        }
        if code_is(&["NonExistentQueue", "QueueDoesNotExist"]) {
            return QueueError::Fatal(classified(FailureClass::Missing, format!("{context}: {code} ({status}): the queue does not exist")));
        }
        if code_is(&["QueueDeletedRecently"]) {
            // SQS refuses to create a queue of a name deleted less than 60 s ago.
            return QueueError::Transient(classified(
                FailureClass::Other,
                format!("{context}: {code} ({status}): it can be created again once SQS has deleted it (60 s after the delete)"),
            ));
        }
        let throttled = code_is(&["RequestThrottled", "ThrottlingException", "Throttling", "KmsThrottled", "OverLimit"]) || matches!(status, 429 | 503);
        let auth = code_is(&[
            "AccessDenied",
            "AccessDeniedException",
            "InvalidClientTokenId",
            "UnrecognizedClientException",
            "SignatureDoesNotMatch",
            "IncompleteSignature",
            "InvalidSecurity",
            "ExpiredToken",
            "MissingAuthenticationToken",
            "KmsAccessDenied",
        ]) || matches!(status, 401 | 403);
        if throttled {
            return QueueError::Transient(described(FailureClass::Throttled));
        }
        if auth {
            let check = match code_is(&["AccessDenied", "AccessDeniedException", "KmsAccessDenied"]) {
                true => format!("the credential lacks the permission: it needs {}", call.action()),
                false => "check the credentials (keys, session token, their expiry) and the region".to_string(),
            };
            return QueueError::Fatal(classified(FailureClass::Auth, format!("{context}: {code} ({status}): {check}")));
        }
        match status {
            408 | 504 => QueueError::Transient(described(FailureClass::Timeout)),
            500..=599 => QueueError::Transient(described(FailureClass::Other)),
            // An answer that could not be read (no status): a proxy or a cut connection.
            0 => QueueError::Transient(described(FailureClass::Other)),
            _ => QueueError::Fatal(described(FailureClass::Other)),
        }
    }

    /// Reads MaximumMessageSize and the RedrivePolicy.
    async fn read_limits(&self) -> Result<(), QueueError> {
        let url = self.url().await?;
        let client = self.client(Call::Attributes).await?;
        let mut names = vec![QueueAttributeName::MaximumMessageSize, QueueAttributeName::RedrivePolicy];
        if self.is_fifo() {
            names.push(QueueAttributeName::ContentBasedDeduplication);
        }
        let read = client.get_queue_attributes().queue_url(url).set_attribute_names(Some(names)).send();
        let answer = self.setup_call(self.call(Call::Attributes, None, read).await)?;
        if self.is_fifo() {
            self.content_deduplication.set(answer.attributes.as_ref().and_then(|a| a.get(&QueueAttributeName::ContentBasedDeduplication)).map(String::as_str));
        }
        self.take_redrive_policy(answer.attributes.as_ref().and_then(|a| a.get(&QueueAttributeName::RedrivePolicy)).map(String::as_str));
        let size = answer.attributes.as_ref().and_then(|a| a.get(&QueueAttributeName::MaximumMessageSize)).and_then(|size| size.parse::<usize>().ok());
        match size {
            Some(size) => self.max_message_bytes.store(size, Ordering::Relaxed),
            None => tracing::warn!(queue = %self.name, "queue {}: no MaximumMessageSize in its attributes; assuming {MAX_MESSAGE_BYTES} bytes", self.name),
        }
        Ok(())
    }

    /// Whether it is a FIFO queue (its URL's or name's `.fifo`).
    fn is_fifo(&self) -> bool {
        fifo::is_fifo(self.options.queue_url.as_deref(), &self.name)
    }

    /// A `SendMessage` of `body`, in `group` on a FIFO queue.
    async fn send(&self, body: &[u8], initial_visibility: Duration, group: Option<&GroupedSend>) -> Result<MessageId, QueueError> {
        let encoded = self.options.encoding.encode(body)?;
        let limit = self.max_message_bytes();
        let context = crate::telemetry::sending();
        if encoded.size() + context.as_ref().map_or(0, trace::attribute_bytes) > limit {
            let limit = if encoded.base64 { self.options.encoding.max_body_bytes(limit) } else { limit };
            return Err(QueueError::MessageTooLarge { size: body.len(), limit });
        }
        let url = self.url().await?;
        let client = self.client(Call::Put).await?;
        let mut send = client.send_message().queue_url(url).message_body(encoded.text);
        send = match group {
            // A FIFO queue refuses a per-message delay, even of zero on some implementations.
            Some(group) => send.message_group_id(&group.group).set_message_deduplication_id(group.dedup_id.clone()),
            None => send.delay_seconds(seconds_up(initial_visibility, MAX_DELAY)),
        };
        if encoded.base64 {
            let marked = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(encoding::BASE64)
                .build()
                .map_err(|e| QueueError::Fatal(anyhow!("{}: the encoding attribute: {e}", self.context(Call::Put))))?;
            send = send.message_attributes(ENCODING_ATTRIBUTE, marked);
        }
        send = self.with_trace(send, context.as_ref())?;
        let sent = match self.call(Call::Put, None, send.send()).await {
            Err(QueueError::MessageTooLarge { limit, .. }) => return Err(QueueError::MessageTooLarge { size: body.len(), limit }),
            other => other?,
        };
        sent.message_id.map(MessageId::from).ok_or_else(|| QueueError::Fatal(anyhow!("{}: the answer has no message id", self.context(Call::Put))))
    }

    /// `send` with `context`'s attributes, if any.
    fn with_trace(&self, send: SendMessageFluentBuilder, context: Option<&TraceContext>) -> Result<SendMessageFluentBuilder, QueueError> {
        let Some(context) = context else { return Ok(send) };
        let attributes =
            trace::attributes(context).map_err(|e| QueueError::Fatal(anyhow!("{}: the trace context's attributes: {e}", self.context(Call::Put))))?;
        Ok(attributes.into_iter().fold(send, |send, (name, value)| send.message_attributes(name, value)))
    }

    /// The receipt handle a pop receipt of message `id` holds, or a stale receipt when it is
    /// not one of `id`'s.
    fn handle<'a>(id: &MessageId, pop_receipt: &'a PopReceipt) -> Result<&'a str, QueueError> {
        Self::receipt_parts(id, pop_receipt).map(|(_, handle)| handle)
    }

    /// A pop receipt's parts: `<id> [<first receive, ms since 1970>] <handle>`. The first
    /// receive bounds the visibility SQS allows (12 hours from it); a handle has no spaces.
    fn receipt_parts<'a>(id: &MessageId, pop_receipt: &'a PopReceipt) -> Result<(Option<SystemTime>, &'a str), QueueError> {
        let stale = || QueueError::StaleReceipt { id: id.clone() };
        let (of, rest) = pop_receipt.split_once(' ').filter(|(of, _)| *of == id.as_str()).ok_or_else(stale)?;
        let (first, handle) = match rest.split_once(' ') {
            Some((millis, handle)) if !millis.is_empty() && millis.bytes().all(|b| b.is_ascii_digit()) => {
                (millis.parse::<u64>().ok().map(|millis| SystemTime::UNIX_EPOCH + Duration::from_millis(millis)), handle)
            }
            _ => (None, rest),
        };
        match handle.is_empty() || handle.contains(' ') || of.is_empty() {
            true => Err(stale()),
            false => Ok((first, handle)),
        }
    }

    /// The most visibility SQS allows a message first received at `first` now: up to 12 hours
    /// from its first receive (a longer one SQS refuses), in whole seconds rounded down.
    fn visibility_left(first: Option<SystemTime>, visibility: Duration) -> Duration {
        let Some(first) = first else { return visibility };
        let age = SystemTime::now().duration_since(first).unwrap_or_default();
        let left = MAX_VISIBILITY.saturating_sub(age);
        visibility.min(Duration::from_secs(left.as_secs()))
    }
}

impl SqsQueue {
    /// One `DeleteMessageBatch` of at most [`MAX_DELETE_BATCH`] entries, each named by its
    /// place in `chunk`; a receipt that is not its message's is stale without a call.
    async fn delete_chunk(&self, chunk: &[(MessageId, PopReceipt)]) -> Vec<Result<(), QueueError>> {
        let mut results: Vec<Result<(), QueueError>> = Vec::with_capacity(chunk.len());
        let mut batch = Vec::new();
        for (index, (id, pop_receipt)) in chunk.iter().enumerate() {
            match Self::handle(id, pop_receipt) {
                Ok(handle) => {
                    let entry = DeleteMessageBatchRequestEntry::builder().id(index.to_string()).receipt_handle(handle).build();
                    match entry {
                        Ok(entry) => {
                            batch.push(entry);
                            // Until SQS's answer names the entry.
                            results.push(Err(QueueError::Fatal(anyhow!("{}: message {id}: the answer does not name its entry", self.context(Call::Delete)))));
                        }
                        Err(e) => results.push(Err(QueueError::Fatal(anyhow!("{}: the batch entry of message {id}: {e}", self.context(Call::Delete))))),
                    }
                }
                Err(stale) => results.push(Err(stale)),
            }
        }
        if batch.is_empty() {
            return results;
        }
        let sent = async {
            let url = self.url().await?;
            let client = self.client(Call::Delete).await?;
            Ok::<_, QueueError>(client.delete_message_batch().queue_url(url).set_entries(Some(batch.clone())).send().await)
        };
        let answer = match sent.await {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => {
                for entry in &batch {
                    let index: usize = entry.id().parse().unwrap_or_default();
                    results[index] = Err(self.classify(Call::Delete, Some(&chunk[index].0), &error));
                }
                return results;
            }
            Err(error) => {
                // No URL or no client: the same reason for each entry.
                let text = error.to_string();
                let transient = error.is_transient();
                let class = error.failure_class().unwrap_or(FailureClass::Other);
                for entry in &batch {
                    let index: usize = entry.id().parse().unwrap_or_default();
                    let again = classified(class, text.clone());
                    results[index] = Err(if transient { QueueError::Transient(again) } else { QueueError::Fatal(again) });
                }
                return results;
            }
        };
        for deleted in answer.successful() {
            if let Some(index) = deleted.id().parse::<usize>().ok().filter(|index| *index < chunk.len()) {
                results[index] = Ok(());
            }
        }
        for failed in answer.failed() {
            let Some(index) = failed.id().parse::<usize>().ok().filter(|index| *index < chunk.len()) else {
                tracing::warn!(queue = %self.name, "queue {}: DeleteMessageBatch reported an entry it was not sent: {}", self.name, failed.id());
                continue;
            };
            // SQS's fault (not the sender's) is a server error, worth retrying.
            let status = if failed.sender_fault() { 400 } else { 500 };
            results[index] = Err(self.classify_answer(Call::Delete, Some(&chunk[index].0), status, Some(failed.code()), failed.message()));
        }
        results
    }
}

/// SQS's rules for queue names: 1 to 80 letters, digits, hyphens and underscores, and a
/// FIFO queue's `.fifo` suffix.
fn check_queue_name(name: &str) -> anyhow::Result<()> {
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    let valid = !stem.is_empty() && name.len() <= 80 && stem.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if valid {
        Ok(())
    } else {
        Err(anyhow!("{name:?} is not a valid SQS queue name: 1 to 80 letters, digits, hyphens and underscores (and .fifo at the end of a FIFO queue's)"))
    }
}

/// The text of the first `<name>` element of an XML error body, if any.
fn xml_element(body: &[u8], name: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let start = text.find(&format!("<{name}>"))? + name.len() + 2;
    let end = start + text[start..].find(&format!("</{name}>"))?;
    Some(text[start..end].to_string())
}

/// Whole seconds for the service, rounded up, at most `max`.
fn seconds_up(duration: Duration, max: Duration) -> i32 {
    let capped = duration.min(max);
    let seconds = capped.as_secs() + u64::from(capped.subsec_nanos() > 0);
    seconds.min(max.as_secs()) as i32
}

#[async_trait]
impl QueueClient for SqsQueue {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_if_missing(&self) -> Result<(), QueueError> {
        if self.options.queue_url.is_none() {
            let client = self.client(Call::Create).await?;
            // SQS refuses a `.fifo` name without the attribute (moto makes a standard queue).
            let create = client.create_queue().queue_name(&self.name).set_attributes(fifo::create_attributes(&self.name));
            match self.call(Call::Create, None, create.send()).await {
                Ok(answer) => {
                    if let Some(url) = answer.queue_url {
                        let _ = self.url.set(url);
                    }
                }
                // A credential may lack sqs:CreateQueue on a queue that exists: a queue that
                // exists needs no create (the URL look-up below says whether it does).
                Err(error) if error.failure_class() == Some(FailureClass::Auth) => {
                    tracing::info!(queue = %self.name, "queue {}: the credential may not create it ({error}); looking it up instead", self.name);
                }
                Err(error) => return Err(error),
            }
        }
        self.read_limits().await
    }

    async fn put(&self, body: &[u8], initial_visibility: Duration) -> Result<MessageId, QueueError> {
        if self.is_fifo() {
            return Err(fifo::group_needed(&self.name));
        }
        if let Some(pointer) = self.pointers.as_ref().and_then(|pointers| pointers.pointer_of(body)) {
            return self.put_pointer(pointer, initial_visibility, None).await;
        }
        self.send(body, initial_visibility, None).await
    }

    fn fifo(&self) -> bool {
        self.is_fifo()
    }

    /// A fresh id for a FIFO queue known to lack content-based deduplication (SQS refuses a
    /// send there without one); none while that is unknown (before the create's attribute
    /// read), so such a queue's refusal still names `dedup_id`.
    fn generated_dedup_id(&self) -> Option<String> {
        (self.is_fifo() && self.content_deduplication.is_off()).then(fifo::new_dedup_id)
    }

    /// A `SendMessage` with `MessageGroupId` (and `MessageDeduplicationId`, if given).
    async fn put_in_group(&self, body: &[u8], initial_visibility: Duration, send: &GroupedSend) -> Result<MessageId, QueueError> {
        if !self.is_fifo() {
            return Err(QueueError::BadSend(format!(
                "queue {} is not a FIFO queue (an SQS queue whose name ends in .fifo): it takes no message group id",
                self.name
            )));
        }
        if let Some(refused) = fifo::refusal(send, initial_visibility) {
            return Err(refused);
        }
        if let Some(pointer) = self.pointers.as_ref().and_then(|pointers| pointers.pointer_of(body)) {
            return self.put_pointer(pointer, initial_visibility, Some(send)).await;
        }
        self.send(body, initial_visibility, Some(send)).await
    }

    async fn get(&self, max: u32, visibility: Duration) -> Result<Vec<Message>, QueueError> {
        self.get_waiting(max, visibility, Duration::ZERO).await
    }

    /// Whole seconds of `idle`, at most [`MAX_WAIT`] and short enough of the request
    /// timeout that the answer fits in it.
    fn server_wait(&self, idle: Duration) -> Duration {
        let most = MAX_WAIT.min(self.account.settings().request_timeout.saturating_sub(WAIT_MARGIN));
        Duration::from_secs(idle.min(most).as_secs())
    }

    /// A `ReceiveMessage` with `WaitTimeSeconds`: SQS answers as soon as a message is
    /// there, or empty after `wait`.
    async fn get_waiting(&self, max: u32, visibility: Duration, wait: Duration) -> Result<Vec<Message>, QueueError> {
        if max == 0 || max > MAX_BATCH {
            return Err(QueueError::BadBatchSize(max));
        }
        let url = self.url().await?;
        let client = self.client(Call::Get).await?;
        let seconds = seconds_up(visibility, MAX_VISIBILITY).max(1);
        // The lease ends `seconds` after SQS took the message from the queue: after the
        // call was sent, and, when it waited, up to `wait` later. Counted from before the
        // call, the host's figure errs early; a long poll's, from its answer
        // ([`super::lease_offset`]).
        let asked_at = SystemTime::now();
        let fifo_attributes = if self.is_fifo() { fifo::RECEIVED.to_vec() } else { Vec::new() };
        let receive = client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(max.min(MAX_GET) as i32)
            .visibility_timeout(seconds)
            .wait_time_seconds(wait.min(MAX_WAIT).as_secs() as i32)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateFirstReceiveTimestamp)
            .message_system_attribute_names(MessageSystemAttributeName::AwsTraceHeader)
            .message_attribute_names(trace::TRACEPARENT_ATTRIBUTE)
            .message_attribute_names(trace::TRACESTATE_ATTRIBUTE)
            .message_attribute_names(ENCODING_ATTRIBUTE)
            .message_attribute_names(pointer::SIZE_ATTRIBUTE)
            .message_attribute_names(pointer::LEGACY_SIZE_ATTRIBUTE)
            .message_attribute_names(pointer::SHA256_ATTRIBUTE);
        let receive = fifo_attributes.into_iter().fold(receive, |receive, name| receive.message_system_attribute_names(name));
        let received = self.call(Call::Get, None, receive.send()).await?;
        let leased_at = asked_at + super::lease_offset(asked_at.elapsed().unwrap_or_default(), wait);
        let mut messages = Vec::new();
        for item in received.messages.unwrap_or_default() {
            let (Some(id), Some(handle)) = (item.message_id, item.receipt_handle) else {
                return Err(QueueError::Fatal(anyhow!("{}: a message came without its id or receipt handle", self.context(Call::Get))));
            };
            let attribute = |name| item.attributes.as_ref().and_then(|a| a.get(&name)).and_then(|value| value.parse::<u64>().ok());
            let text_attribute = |name| item.message_attributes.as_ref().and_then(|a| a.get(name)).and_then(|value| value.string_value());
            let size = text_attribute(pointer::SIZE_ATTRIBUTE).or(text_attribute(pointer::LEGACY_SIZE_ATTRIBUTE));
            let text = item.body.clone().unwrap_or_default();
            let (body, defect) = match self.pointers.as_ref().zip(size) {
                None => Encoding::decode(text, text_attribute(ENCODING_ATTRIBUTE)),
                Some((pointers, size)) => pointer::received_body(pointers.as_ref(), text, size, text_attribute(pointer::SHA256_ATTRIBUTE)),
            };
            // SQS counts the 12 hours a visibility may reach from the first receive.
            let first = attribute(MessageSystemAttributeName::ApproximateFirstReceiveTimestamp)
                .unwrap_or_else(|| asked_at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64));
            messages.push(Message {
                pop_receipt: PopReceipt::from(format!("{id} {first} {handle}")),
                id: id.into(),
                dequeue_count: attribute(MessageSystemAttributeName::ApproximateReceiveCount).unwrap_or(1).min(u64::from(u32::MAX)) as u32,
                inserted_at: attribute(MessageSystemAttributeName::SentTimestamp)
                    .map_or(SystemTime::UNIX_EPOCH, |millis| SystemTime::UNIX_EPOCH + Duration::from_millis(millis)),
                next_visible_at: leased_at + Duration::from_secs(seconds as u64),
                body: body.into(),
                defect,
                fifo: fifo::fields(item.attributes.as_ref()),
                trace: trace::received(item.message_attributes.as_ref(), item.attributes.as_ref()),
            });
        }
        Ok(messages)
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), QueueError> {
        let handle = Self::handle(id, pop_receipt)?;
        let url = self.url().await?;
        let client = self.client(Call::Delete).await?;
        self.call(Call::Delete, Some(id), client.delete_message().queue_url(url).receipt_handle(handle).send()).await?;
        Ok(())
    }

    /// `DeleteMessageBatch` of up to [`MAX_DELETE_BATCH`] per call; each entry SQS reports
    /// failed is classed by its code as a delete's error would be, and a call that fails
    /// fails each of its entries.
    async fn delete_batch(&self, entries: &[(MessageId, PopReceipt)]) -> Vec<Result<(), QueueError>> {
        let mut results = Vec::with_capacity(entries.len());
        for chunk in entries.chunks(MAX_DELETE_BATCH) {
            results.extend(self.delete_chunk(chunk).await);
        }
        results
    }

    fn delete_batch_limit(&self) -> usize {
        MAX_DELETE_BATCH
    }

    fn take_setup_requests(&self) -> u64 {
        self.setup_requests.swap(0, Ordering::Relaxed)
    }

    /// A `ChangeMessageVisibility`, saturating at what SQS allows the message: 12 hours from
    /// its first receive (a retry delay of 12 hours, asked after the handler ran, would
    /// otherwise be refused and the message come back when its lease ran out).
    async fn update_visibility(&self, id: &MessageId, pop_receipt: &PopReceipt, visibility: Duration) -> Result<PopReceipt, QueueError> {
        let (first, handle) = Self::receipt_parts(id, pop_receipt)?;
        let url = self.url().await?;
        let client = self.client(Call::Update).await?;
        let seconds = seconds_up(Self::visibility_left(first, visibility), MAX_VISIBILITY);
        let change = client.change_message_visibility().queue_url(url).receipt_handle(handle).visibility_timeout(seconds);
        self.call(Call::Update, Some(id), change.send()).await?;
        // SQS issues no new handle for a visibility change: the lease's receipt holds.
        Ok(pop_receipt.clone())
    }

    /// `ChangeMessageVisibilityBatch` of up to [`MAX_DELETE_BATCH`] per call
    /// ([`SqsQueue::update_chunk`]).
    async fn update_visibility_batch(&self, entries: &[(MessageId, PopReceipt)], visibility: Duration) -> Vec<Result<PopReceipt, QueueError>> {
        let mut results = Vec::with_capacity(entries.len());
        for chunk in entries.chunks(MAX_DELETE_BATCH) {
            results.extend(self.update_chunk(chunk, visibility).await);
        }
        results
    }

    fn update_batch_limit(&self) -> usize {
        MAX_DELETE_BATCH
    }

    fn dead_letter(&self) -> Option<DeadLetter> {
        self.dead_letter.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// SQS bills each 64 KiB of a payload (the body as sent, and its attributes) as one request.
    fn put_requests(&self, body: &[u8]) -> u64 {
        let size = self.options.encoding.encode(body).map_or(body.len(), |encoded| encoded.size());
        size.div_ceil(BILLED_CHUNK_BYTES).max(1) as u64
    }

    async fn approximate_count(&self) -> Result<u64, QueueError> {
        let url = self.url().await?;
        let client = self.client(Call::Count).await?;
        let names = [
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            QueueAttributeName::ApproximateNumberOfMessagesDelayed,
        ];
        let answer = self.call(Call::Count, None, client.get_queue_attributes().queue_url(url).set_attribute_names(Some(names.to_vec())).send()).await?;
        let attributes = answer.attributes.unwrap_or_default();
        let mut total = 0u64;
        for name in names {
            let Some(count) = attributes.get(&name).and_then(|value| value.parse::<u64>().ok()) else {
                return Err(QueueError::Fatal(anyhow!("{}: the answer has no {name}", self.context(Call::Count))));
            };
            total += count;
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> SqsQueue {
        SqsQueue::new(&SqsAccount::new(AwsSettings::default()), "orders", SqsOptions::default()).unwrap()
    }

    #[test]
    fn answers_are_classed_by_code_and_status() {
        let queue = queue();
        let cases = [
            (400, "RequestThrottled", FailureClass::Throttled, true),
            (400, "ThrottlingException", FailureClass::Throttled, true),
            (503, "ServiceUnavailable", FailureClass::Throttled, true),
            (403, "OverLimit", FailureClass::Throttled, true),
            (500, "InternalFailure", FailureClass::Other, true),
            (504, "no code", FailureClass::Timeout, true),
            (400, "AccessDenied", FailureClass::Auth, false),
            (403, "InvalidClientTokenId", FailureClass::Auth, false),
            (400, "AWS.SimpleQueueService.NonExistentQueue", FailureClass::Missing, false),
            (400, "QueueDoesNotExist", FailureClass::Missing, false),
            (400, "AWS.SimpleQueueService.QueueDeletedRecently", FailureClass::Other, true),
            (400, "InvalidParameterValue", FailureClass::Other, false),
        ];
        for (status, code, class, transient) in cases {
            let error = queue.classify_answer(Call::Get, None, status, Some(code), Some("m"));
            assert_eq!((error.failure_class(), error.is_transient()), (Some(class), transient), "{status} {code}: {error}");
        }
        let hostile = queue.classify_answer(Call::Get, None, 503, Some(&"X".repeat(100_000)), Some(&"Y".repeat(100_000))).to_string();
        assert!(hostile.len() < 2_000, "a huge code or message is cut: {} bytes", hostile.len());
    }

    #[test]
    fn access_denied_names_the_iam_action_of_the_call() {
        let queue = queue();
        for (call, action) in [(Call::Get, "sqs:ReceiveMessage"), (Call::Delete, "sqs:DeleteMessage"), (Call::Count, "sqs:GetQueueAttributes")] {
            let error = queue.classify_answer(call, None, 400, Some("AccessDenied"), Some("not authorized")).to_string();
            assert!(error.contains(action) && error.contains("queue orders"), "{error}");
        }
    }

    #[test]
    fn an_xml_error_body_gives_its_code_and_message() {
        let body = b"<ErrorResponse><Errors><Error><Code>AccessDenied</Code><Message>not authorized to perform: sqs:ReceiveMessage</Message></Error></Errors></ErrorResponse>";
        assert_eq!(xml_element(body, "Code").as_deref(), Some("AccessDenied"));
        assert_eq!(xml_element(body, "Message").as_deref(), Some("not authorized to perform: sqs:ReceiveMessage"));
        assert_eq!(xml_element(b"{\"__type\":\"x\"}", "Code"), None);
        assert_eq!(xml_element(b"<Code>unterminated", "Code"), None);
    }

    #[test]
    fn a_refused_receipt_is_stale_on_delete_and_update_only() {
        let queue = queue();
        let id = MessageId::from("m");
        for call in [Call::Delete, Call::Update] {
            for (code, message) in [
                ("ReceiptHandleIsInvalid", ""),
                ("AWS.SimpleQueueService.MessageNotInflight", ""),
                ("InvalidParameterValue", "Value x for parameter ReceiptHandle is invalid."),
            ] {
                let error = queue.classify_answer(call, Some(&id), 400, Some(code), Some(message));
                assert!(matches!(&error, QueueError::StaleReceipt { id } if id == "m"), "{call:?} {code}: {error}");
            }
        }
        let error = queue.classify_answer(Call::Update, Some(&id), 400, Some("InvalidParameterValue"), Some("Total VisibilityTimeout beyond the limit"));
        assert!(matches!(error, QueueError::Fatal(_)), "a visibility SQS refuses is not a lost lease: {error}");
        let error = queue.classify_answer(Call::Get, None, 400, Some("ReceiptHandleIsInvalid"), None);
        assert!(matches!(error, QueueError::Fatal(_)), "{error}");
    }

    #[test]
    fn a_receipt_of_another_message_or_malformed_is_stale_without_a_call() {
        let id = MessageId::from("id-1");
        assert_eq!(SqsQueue::handle(&id, &PopReceipt::from("id-1 AQEB+x/y==")).unwrap(), "AQEB+x/y==");
        for receipt in ["id-2 AQEB", "AQEB", "id-1 ", ""] {
            assert!(matches!(SqsQueue::handle(&id, &PopReceipt::from(receipt)), Err(QueueError::StaleReceipt { .. })), "{receipt:?}");
        }
    }

    #[test]
    fn durations_round_up_to_whole_seconds_and_saturate_at_the_limit() {
        assert_eq!(seconds_up(Duration::ZERO, MAX_DELAY), 0);
        assert_eq!(seconds_up(Duration::from_millis(1500), MAX_DELAY), 2);
        assert_eq!(seconds_up(Duration::from_secs(3600), MAX_DELAY), 900);
        assert_eq!(seconds_up(Duration::MAX, MAX_VISIBILITY), 43_200);
    }

    #[test]
    fn a_get_waits_whole_seconds_of_the_idle_delay_up_to_20_and_within_the_request_timeout() {
        let queue = queue();
        let s = Duration::from_secs;
        for (idle, wait) in [(Duration::from_millis(900), Duration::ZERO), (Duration::from_millis(1_500), s(1)), (s(10), s(10)), (s(30), s(20))] {
            assert_eq!(queue.server_wait(idle), wait, "idle {idle:?}");
        }
        let settings = AwsSettings { request_timeout: s(8), ..AwsSettings::default() };
        let hurried = SqsQueue::new(&SqsAccount::new(settings), "orders", SqsOptions::default()).unwrap();
        assert_eq!(hurried.server_wait(s(30)), s(3), "an 8 s request timeout leaves 5 s for the call around the wait");
    }

    #[test]
    fn queue_names_follow_sqs_rules() {
        for good in ["orders", "a", "A_b-1", "orders.fifo", &"a".repeat(80)] {
            assert!(check_queue_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".fifo", "a.b", "a b", "ö", &"a".repeat(81)] {
            assert!(check_queue_name(bad).unwrap_err().to_string().contains("not a valid SQS queue name"), "{bad}");
        }
    }
}
