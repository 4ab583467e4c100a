//! FIFO queues (a queue whose name ends in `.fifo`): what a receive carries of a message's
//! group, and what a send must carry. SQS gives out a group's next message only once the one
//! before it is deleted or visible again, to any consumer; the listener's group gate keeps a
//! group's messages of one receive in order on this host.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};

use crate::queue::{FifoFields, GroupedSend, QueueError};

/// SQS's limit on a group id and a deduplication id: 128 characters.
const MAX_ID_CHARS: usize = 128;

/// Whether the queue at `url` (or named `name`, its URL not configured) is a FIFO queue.
pub(super) fn is_fifo(url: Option<&str>, name: &str) -> bool {
    url.unwrap_or(name).trim_end_matches('/').ends_with(".fifo")
}

/// The attributes a `CreateQueue` of queue `name` sets: `FifoQueue` for a `.fifo` name
/// (deduplication left to each send's id, or to the queue's setting if it exists).
pub(super) fn create_attributes(name: &str) -> Option<HashMap<QueueAttributeName, String>> {
    is_fifo(None, name).then(|| HashMap::from([(QueueAttributeName::FifoQueue, "true".to_string())]))
}

/// The system attributes a receive of a FIFO queue asks for besides the others.
pub(super) const RECEIVED: [MessageSystemAttributeName; 3] =
    [MessageSystemAttributeName::MessageGroupId, MessageSystemAttributeName::MessageDeduplicationId, MessageSystemAttributeName::SequenceNumber];

/// A received message's FIFO fields, from its system attributes: `None` without a group id.
pub(super) fn fields(attributes: Option<&HashMap<MessageSystemAttributeName, String>>) -> Option<FifoFields> {
    let attributes = attributes?;
    let group = attributes.get(&MessageSystemAttributeName::MessageGroupId)?.clone();
    Some(FifoFields {
        group,
        deduplication_id: attributes.get(&MessageSystemAttributeName::MessageDeduplicationId).cloned(),
        sequence_number: attributes.get(&MessageSystemAttributeName::SequenceNumber).cloned(),
    })
}

/// Whether a FIFO queue deduplicates by content (its `ContentBasedDeduplication`), as far
/// as known: unknown until its attributes are read at create.
#[derive(Debug, Default)]
pub(super) struct ContentDeduplication(AtomicU8);

impl ContentDeduplication {
    const OFF: u8 = 1;
    const ON: u8 = 2;

    /// Takes the attribute's value as read (`None`: not in the answer, so off).
    pub(super) fn set(&self, attribute: Option<&str>) {
        let on = attribute.is_some_and(|value| value.eq_ignore_ascii_case("true"));
        self.0.store(if on { Self::ON } else { Self::OFF }, Ordering::Relaxed);
    }

    /// Whether it is known to be off: a send then needs a deduplication id.
    pub(super) fn is_off(&self) -> bool {
        self.0.load(Ordering::Relaxed) == Self::OFF
    }
}

/// A deduplication id for one send: 128 random bits in hex (32 characters, within SQS's 128
/// and its character set), so two sends never share one.
pub(super) fn new_dedup_id() -> String {
    format!("{:032x}", fastrand::u128(..))
}

/// A plain put to a FIFO queue: refused, naming the parameter it lacks.
pub(super) fn group_needed(queue: &str) -> QueueError {
    QueueError::BadSend(format!("queue {queue} is a FIFO queue: a send needs a message group id (`group`; `ebb send --group`)"))
}

/// Why `send` with `delay` cannot go to a FIFO queue, if it cannot: ids SQS would refuse
/// (checked here so the refusal names ebb's parameter), or a per-message delay, which FIFO
/// queues do not take (the queue's own `DelaySeconds` applies).
pub(super) fn refusal(send: &GroupedSend, delay: std::time::Duration) -> Option<QueueError> {
    let bad_id = |value: &str| value.is_empty() || value.chars().count() > MAX_ID_CHARS || !value.chars().all(|c| c.is_ascii_graphic());
    let refused = if bad_id(&send.group) {
        "group: 1 to 128 of the printable ASCII characters (no spaces)"
    } else if send.dedup_id.as_deref().is_some_and(bad_id) {
        "dedup_id: 1 to 128 of the printable ASCII characters (no spaces)"
    } else if !delay.is_zero() {
        "a FIFO queue takes no per-message delay (delay_ms): set the queue's DelaySeconds instead"
    } else {
        return None;
    };
    Some(QueueError::BadSend(refused.to_string()))
}

/// SQS's refusal of a FIFO send (a parameter it lacks or will not take), if `message` is one,
/// as a [`QueueError::BadSend`] naming ebb's parameter.
pub(super) fn refused_send(code: &str, message: &str) -> Option<QueueError> {
    let about = |word: &str| message.contains(word);
    if !(code.ends_with("MissingParameter") || code.ends_with("InvalidParameterValue")) {
        return None;
    }
    let reason = if about("Deduplication") {
        format!("the queue has no content-based deduplication: a send needs a deduplication id (`dedup_id`; `ebb send --dedup-id`); SQS: {message}")
    } else if about("MessageGroupId") {
        format!("a send needs a message group id (`group`; `ebb send --group`); SQS: {message}")
    } else {
        return None;
    };
    Some(QueueError::BadSend(reason))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_queue_is_fifo_by_its_url_or_else_its_name() {
        assert!(is_fifo(None, "orders.fifo"));
        assert!(is_fifo(Some("http://127.0.0.1:5000/123456789012/orders.fifo"), "orders"));
        assert!(!is_fifo(Some("http://127.0.0.1:5000/123456789012/orders"), "orders.fifo"), "the URL names the queue");
        assert!(!is_fifo(None, "orders"));
    }

    #[test]
    fn a_fifo_send_names_the_parameter_it_gets_wrong() {
        let send = |group: &str, dedup: Option<&str>| GroupedSend { group: group.into(), dedup_id: dedup.map(String::from) };
        let reason = |send: &GroupedSend, delay| refusal(send, delay).map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(reason(&send("g-1", Some("d")), Duration::ZERO), "");
        assert!(reason(&send("", None), Duration::ZERO).contains("group:"));
        assert!(reason(&send("a b", None), Duration::ZERO).contains("group:"));
        assert!(reason(&send(&"g".repeat(129), None), Duration::ZERO).contains("group:"));
        assert!(reason(&send("g", Some("")), Duration::ZERO).contains("dedup_id:"));
        assert!(reason(&send("g", None), Duration::from_secs(1)).contains("delay_ms"));
    }

    #[test]
    fn an_id_is_generated_only_where_content_deduplication_is_known_to_be_off() {
        let known = ContentDeduplication::default();
        assert!(!known.is_off(), "unknown before the attributes are read");
        for (attribute, off) in [(Some("false"), true), (None, true), (Some("true"), false)] {
            known.set(attribute);
            assert_eq!(known.is_off(), off, "{attribute:?}");
        }
        let (first, second) = (new_dedup_id(), new_dedup_id());
        assert!(first != second && first.len() == 32 && refusal(&GroupedSend { group: "g".into(), dedup_id: Some(first) }, Duration::ZERO).is_none());
    }

    #[test]
    fn sqs_refusals_of_a_fifo_send_name_ebbs_parameter() {
        let dedup = "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly";
        assert!(refused_send("InvalidParameterValue", dedup).unwrap().to_string().contains("`dedup_id`"));
        let group = "The request must contain the parameter MessageGroupId.";
        assert!(refused_send("MissingParameter", group).unwrap().to_string().contains("`group`"));
        assert!(refused_send("InvalidParameterValue", "Value 2 for parameter DelaySeconds is invalid").is_none());
        assert!(refused_send("AccessDenied", group).is_none());
    }
}
