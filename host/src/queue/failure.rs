//! What a failed storage call was: which kind of call, and which class of failure, as
//! operators see them in `/metrics` and `/status` and as the retry decorator decides on them.

use std::io::ErrorKind;

use serde::{Deserialize, Serialize};

use super::QueueError;

/// A kind of storage call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    /// A get (lease) of messages.
    Get,
    /// A put of one message.
    Put,
    /// A delete of a leased message.
    Delete,
    /// A visibility update of a leased message (release, renewal).
    Update,
    /// An approximate count.
    Count,
    /// A create-if-missing of the queue.
    Create,
}

impl CallKind {
    /// Every kind, in the order of [`CallKind::index`].
    pub const ALL: [CallKind; 6] = [CallKind::Get, CallKind::Put, CallKind::Delete, CallKind::Update, CallKind::Count, CallKind::Create];

    /// The label in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Get => "get",
            CallKind::Put => "put",
            CallKind::Delete => "delete",
            CallKind::Update => "update",
            CallKind::Count => "count",
            CallKind::Create => "create",
        }
    }

    /// The position in [`CallKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// What becomes of the call's work when it fails for good, for the log line that says so.
    pub fn after_giving_up(self) -> &'static str {
        match self {
            CallKind::Get => "the caller polls again later",
            CallKind::Put => "the send fails",
            CallKind::Delete => "the message becomes visible again when its lease ends and is handled again",
            CallKind::Update => "the message keeps its current lease",
            CallKind::Count => "the last depth figure stays in use",
            CallKind::Create => "the queue cannot be used until it is created",
        }
    }
}

impl std::fmt::Display for CallKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The class of a failed storage call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// The service refused the call for load (429, 503 ServerBusy): it did not do the work.
    Throttled,
    /// No answer in time (408, 504, 500 OperationTimedOut, our request timeout): the work
    /// may or may not have been done.
    Timeout,
    /// The connection could not be made or broke (refused, reset, closed before the answer):
    /// the work may or may not have been done.
    Connection,
    /// The credential was refused or lacks a permission (401, 403).
    Auth,
    /// Anything else (other statuses, a store that cannot commit, a corrupt answer).
    Other,
    /// The queue does not exist (404 QueueNotFound): deleted while the host ran, or the
    /// account restored empty. [`Retrying`](super::Retrying) creates it again.
    Missing,
}

impl FailureClass {
    /// Every class, in the order of [`FailureClass::index`].
    pub const ALL: [FailureClass; 6] =
        [FailureClass::Throttled, FailureClass::Timeout, FailureClass::Connection, FailureClass::Auth, FailureClass::Other, FailureClass::Missing];

    /// The label in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Throttled => "throttled",
            FailureClass::Timeout => "timeout",
            FailureClass::Connection => "connection",
            FailureClass::Auth => "auth",
            FailureClass::Other => "other",
            FailureClass::Missing => "missing",
        }
    }

    /// The position in [`FailureClass::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether the service may have done the work though the caller heard no answer: then a
    /// retry may find the work already done (a delete answered "not found").
    pub fn may_have_succeeded(self) -> bool {
        matches!(self, FailureClass::Timeout | FailureClass::Connection | FailureClass::Other)
    }

    /// Whether the attempt got no answer from the service (the connection broke, or no
    /// answer came in time, or the service gave up on it): then it is not a known billed
    /// transaction, and [`Metered`](super::Metered) counts it apart from the billed ones.
    pub fn unanswered(self) -> bool {
        matches!(self, FailureClass::Timeout | FailureClass::Connection)
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A storage error's text with its class, for backends that know the class (Azure's status
/// codes). It displays as the text alone.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ClassifiedError {
    /// The class.
    pub class: FailureClass,
    message: String,
}

/// An error reading `message`, carrying `class` for [`QueueError::failure_class`].
pub fn classified(class: FailureClass, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(ClassifiedError { class, message: message.into() })
}

impl QueueError {
    /// The class of a storage failure; `None` when the storage answered and the answer was
    /// "no" for a reason of the call's own (a stale receipt, a body too large): those are
    /// not failures of the storage.
    pub fn failure_class(&self) -> Option<FailureClass> {
        let error = match self {
            QueueError::Transient(error) | QueueError::Fatal(error) => error,
            _ => return None,
        };
        Some(class_of(error))
    }
}

/// The class an error carries, or one read from the I/O errors in its chain.
fn class_of(error: &anyhow::Error) -> FailureClass {
    for cause in error.chain() {
        if let Some(classified) = cause.downcast_ref::<ClassifiedError>() {
            return classified.class;
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            match io.kind() {
                ErrorKind::TimedOut => return FailureClass::Timeout,
                ErrorKind::ConnectionRefused
                | ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::NotConnected
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof
                | ErrorKind::HostUnreachable
                | ErrorKind::NetworkUnreachable => return FailureClass::Connection,
                ErrorKind::PermissionDenied => return FailureClass::Auth,
                _ => {}
            }
        }
    }
    FailureClass::Other
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::anyhow;

    #[test]
    fn a_classified_error_keeps_its_class_and_its_text_under_added_context() {
        let error = QueueError::Transient(classified(FailureClass::Throttled, "queue q: get: ServerBusy (503)"));
        assert_eq!(error.failure_class(), Some(FailureClass::Throttled));
        assert_eq!(error.to_string(), "transient storage error: queue q: get: ServerBusy (503)");
        let wrapped = QueueError::Fatal(classified(FailureClass::Auth, "AuthenticationFailed (403)").context("queue q"));
        assert_eq!(wrapped.failure_class(), Some(FailureClass::Auth));
    }

    #[test]
    fn io_errors_in_the_chain_give_the_class_and_anything_else_is_other() {
        let io = |kind| QueueError::Transient(anyhow!(std::io::Error::new(kind, "x")).context("commit"));
        assert_eq!(io(ErrorKind::TimedOut).failure_class(), Some(FailureClass::Timeout));
        assert_eq!(io(ErrorKind::ConnectionReset).failure_class(), Some(FailureClass::Connection));
        assert_eq!(io(ErrorKind::ConnectionRefused).failure_class(), Some(FailureClass::Connection));
        assert_eq!(io(ErrorKind::StorageFull).failure_class(), Some(FailureClass::Other));
        assert_eq!(QueueError::Fatal(anyhow!("queue gone")).failure_class(), Some(FailureClass::Other));
    }

    #[test]
    fn answers_that_are_the_calls_own_fault_are_not_storage_failures() {
        assert_eq!(QueueError::StaleReceipt { id: "1".into() }.failure_class(), None);
        assert_eq!(QueueError::MessageTooLarge { size: 2, limit: 1 }.failure_class(), None);
        assert_eq!(QueueError::InvalidBody("x".into()).failure_class(), None);
        assert_eq!(QueueError::BadBatchSize(0).failure_class(), None);
    }

    #[test]
    fn only_failures_that_may_have_reached_the_service_may_have_done_the_work() {
        assert!(!FailureClass::Throttled.may_have_succeeded());
        assert!(!FailureClass::Auth.may_have_succeeded());
        assert!(FailureClass::Timeout.may_have_succeeded() && FailureClass::Connection.may_have_succeeded());
    }

    #[test]
    fn only_a_broken_connection_or_no_answer_in_time_is_unanswered() {
        let unanswered: Vec<FailureClass> = FailureClass::ALL.into_iter().filter(|c| c.unanswered()).collect();
        assert_eq!(unanswered, [FailureClass::Timeout, FailureClass::Connection]);
    }

    #[test]
    fn the_index_of_each_kind_and_class_is_its_place_in_all() {
        assert!(CallKind::ALL.iter().enumerate().all(|(i, k)| k.index() == i));
        assert!(FailureClass::ALL.iter().enumerate().all(|(i, c)| c.index() == i));
    }
}
