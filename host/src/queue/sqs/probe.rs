//! What `ebb check` asks of an SQS queue: each call `ebb run` makes, made so that nothing
//! changes, and a refused one named by the IAM action it needs.
//!
//! - The URL: `GetQueueUrl` (or the configured `queue_url`). A queue that does not exist is
//!   never created: that is `run`'s first act (`sqs:CreateQueue`), not `check`'s.
//! - `CreateQueue` of the queue that exists, as `run` does at every start: it changes
//!   nothing; refused, `run` goes on with the queue that exists.
//! - `GetQueueAttributes`: the message count and `MaximumMessageSize`.
//! - `ReceiveMessage` of at most one message, visibility 0, no wait: a message it takes
//!   is visible again at once, but its receive count (SQS's `ApproximateReceiveCount`)
//!   goes up by one, and the probe says so. There is no receive that takes nothing.
//! - `DeleteMessage` and `ChangeMessageVisibility` of a receipt handle that is no
//!   message's: "invalid handle" when allowed, `AccessDenied` when not.
//! - `SendMessage` is not probed: a send cannot be made without sending.

use super::{Call, QueueError, SqsQueue};
use crate::queue::{FailureClass, QueueClient};

/// A receipt handle of no message, for the delete and visibility probes.
const NO_HANDLE: &str = "ebb-check-probe-of-no-message";

/// What the probes of one queue found.
#[derive(Debug, Default)]
pub(crate) struct SqsProbe {
    /// The messages in it (visible, in flight, delayed); `None`: it does not exist.
    pub count: Option<u64>,
    /// The IAM actions refused, each with the error that says so.
    pub refused: Vec<(&'static str, String)>,
    /// A message the receive probe took (its receive count went up by one).
    pub took_a_message: bool,
    /// Whether `CreateQueue` of the queue that exists was allowed (`run` needs it not);
    /// `None`: not probed (a configured `queue_url`: `run` creates nothing).
    pub may_create: Option<bool>,
}

impl SqsQueue {
    /// Probes every call `run` makes on the queue but the send, as the module says. A
    /// refused call is in [`SqsProbe::refused`]; any other failure ends the probe.
    pub(crate) async fn probe(&self) -> Result<SqsProbe, QueueError> {
        let mut probe = SqsProbe::default();
        match self.url().await {
            Ok(_) => {}
            Err(error) if error.failure_class() == Some(FailureClass::Missing) && self.options.queue_url.is_none() => return Ok(probe),
            Err(error) => return Err(error),
        }
        if self.options.queue_url.is_none() {
            let client = self.client(Call::Create).await?;
            let created = self.call(Call::Create, None, client.create_queue().queue_name(&self.name).send()).await;
            probe.may_create = Some(refused(Call::Create, created.map(|_| ()))?.is_none());
        }
        match self.approximate_count().await {
            Ok(count) => probe.count = Some(count),
            Err(error) => probe.refused.extend(refused(Call::Count, Err(error))?),
        }
        let received = self.receive_nothing_held().await.map(|took| probe.took_a_message = took);
        probe.refused.extend(refused(Call::Get, received)?);
        let url = self.url().await?;
        let client = self.client(Call::Delete).await?;
        let deleted = self.call(Call::Delete, None, client.delete_message().queue_url(url).receipt_handle(NO_HANDLE).send()).await.map(|_| ());
        probe.refused.extend(refused(Call::Delete, no_message(deleted))?);
        let change = client.change_message_visibility().queue_url(url).receipt_handle(NO_HANDLE).visibility_timeout(0);
        let changed = self.call(Call::Update, None, change.send()).await.map(|_| ());
        probe.refused.extend(refused(Call::Update, no_message(changed))?);
        Ok(probe)
    }

    /// A receive of at most one message, visible again at once: whether it took one.
    async fn receive_nothing_held(&self) -> Result<bool, QueueError> {
        let url = self.url().await?;
        let client = self.client(Call::Get).await?;
        let receive = client.receive_message().queue_url(url).max_number_of_messages(1).visibility_timeout(0).wait_time_seconds(0);
        let answer = self.call(Call::Get, None, receive.send()).await?;
        Ok(answer.messages.is_some_and(|messages| !messages.is_empty()))
    }
}

/// A delete or update of [`NO_HANDLE`]: refused as an invalid handle is allowed.
fn no_message(result: Result<(), QueueError>) -> Result<(), QueueError> {
    match result {
        Err(QueueError::StaleReceipt { .. }) => Ok(()),
        // A handle SQS cannot parse may come back as a bad parameter of the call.
        Err(QueueError::Fatal(error)) if error.to_string().contains("InvalidParameterValue") => Ok(()),
        other => other,
    }
}

/// `None` when `result` is allowed; the action and why when the credential lacks it; any
/// other failure as it is.
fn refused(call: Call, result: Result<(), QueueError>) -> Result<Option<(&'static str, String)>, QueueError> {
    match result {
        Ok(()) => Ok(None),
        Err(error) if error.failure_class() == Some(FailureClass::Auth) && is_denied(&error) => Ok(Some((call.action(), error.to_string()))),
        Err(error) => Err(error),
    }
}

/// Whether an auth failure is a permission refused (not a credential refused): the call's
/// error names the action only then ([`SqsQueue::classify_answer`]).
fn is_denied(error: &QueueError) -> bool {
    error.to_string().contains("the credential lacks the permission")
}
