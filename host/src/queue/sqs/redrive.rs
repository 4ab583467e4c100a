//! Poison the SQS way: a queue whose `RedrivePolicy` names a dead-letter queue has SQS move a
//! message there once it has been received `maxReceiveCount` times. ebb then leaves
//! poisoning to SQS ([`QueueClient::dead_letter`]) and `ebb poison` works on that queue.
//!
//! The policy is read with the queue's other attributes at
//! [`QueueClient::create_if_missing`] (the same `GetQueueAttributes`, no request more). SQS
//! keeps a dead-letter queue in the account and region of its source queue, so it is opened
//! by the name its ARN ends with.

use std::sync::Arc;

use anyhow::{Context as _, anyhow};

use super::{SqsOptions, SqsQueue};
use crate::queue::{DeadLetter, RetryPolicy, Retrying};

/// What a `RedrivePolicy` says: the dead-letter queue's ARN and the receives before a move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RedrivePolicy {
    pub arn: String,
    pub max_receive_count: u32,
}

impl RedrivePolicy {
    /// Reads the attribute's JSON (`maxReceiveCount` a number, or a string as some SQS
    /// versions write it).
    pub(super) fn parse(json: &str) -> anyhow::Result<RedrivePolicy> {
        let value: serde_json::Value = serde_json::from_str(json).context("the RedrivePolicy is not JSON")?;
        let arn = value.get("deadLetterTargetArn").and_then(|arn| arn.as_str()).context("the RedrivePolicy has no deadLetterTargetArn")?;
        let count = value.get("maxReceiveCount").context("the RedrivePolicy has no maxReceiveCount")?;
        let max_receive_count = match count {
            serde_json::Value::Number(n) => n.as_u64(),
            serde_json::Value::String(s) => s.parse().ok(),
            _ => None,
        }
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n >= 1)
        .ok_or_else(|| anyhow!("the RedrivePolicy's maxReceiveCount {count} is not a count from 1"))?;
        Ok(RedrivePolicy { arn: arn.to_string(), max_receive_count })
    }

    /// The dead-letter queue's name: the ARN's last part (`arn:aws:sqs:REGION:ACCOUNT:NAME`).
    pub(super) fn queue_name(&self) -> anyhow::Result<&str> {
        match self.arn.split(':').collect::<Vec<_>>().as_slice() {
            ["arn", _, "sqs", _, _, name] if !name.is_empty() => Ok(name),
            _ => Err(anyhow!("the RedrivePolicy's deadLetterTargetArn {:?} is not an SQS queue's ARN", self.arn)),
        }
    }
}

impl SqsQueue {
    /// The dead-letter queue `policy` names, opened on this queue's account with its
    /// encoding and pointers (SQS moves a message with its attributes), its calls retried.
    pub(super) fn open_dead_letter(&self, policy: &RedrivePolicy) -> anyhow::Result<DeadLetter> {
        let name = policy.queue_name()?;
        let options = SqsOptions { queue_url: None, ..self.options.clone() };
        let queue = SqsQueue::new(&self.account, name, options)?.with_pointers(self.pointers.clone());
        Ok(DeadLetter {
            name: name.to_string(),
            arn: policy.arn.clone(),
            max_receive_count: policy.max_receive_count,
            queue: Arc::new(Retrying::new(queue, RetryPolicy::default())),
        })
    }

    /// Takes in the queue's `RedrivePolicy` attribute (`None`: it has none), logging once
    /// which way the queue is poisoned when that changes.
    pub(super) fn take_redrive_policy(&self, attribute: Option<&str>) {
        let read = match attribute.filter(|json| !json.trim().is_empty()) {
            None => None,
            Some(json) => match RedrivePolicy::parse(json).and_then(|policy| self.open_dead_letter(&policy)) {
                Ok(dead_letter) => Some(dead_letter),
                Err(error) => {
                    tracing::warn!(queue = %self.name, "queue {}: {error:#}; ebb's poison queue is used", self.name);
                    None
                }
            },
        };
        let mut held = self.dead_letter.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let before = held.as_ref().map(|d| (d.arn.clone(), d.max_receive_count));
        let after = read.as_ref().map(|d| (d.arn.clone(), d.max_receive_count));
        if before != after {
            match &read {
                Some(dead_letter) => tracing::info!(
                    queue = %self.name,
                    dead_letter_queue = %dead_letter.arn,
                    max_receive_count = dead_letter.max_receive_count,
                    "queue {}: SQS's dead-letter queue {} (maxReceiveCount {}) does the poisoning; ebb moves nothing to {}-poison",
                    self.name,
                    dead_letter.arn,
                    dead_letter.max_receive_count,
                    self.name
                ),
                None if before.is_some() => {
                    tracing::info!(queue = %self.name, "queue {}: its RedrivePolicy is gone; ebb's poison queue is used again", self.name)
                }
                None => {}
            }
        }
        *held = read;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redrive_policy_names_its_queue_and_count_or_says_what_is_wrong() {
        let arn = "arn:aws:sqs:us-east-1:123456789012:orders-dlq";
        for json in [format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":2}}"#), format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"2"}}"#)]
        {
            let policy = RedrivePolicy::parse(&json).unwrap();
            assert_eq!((policy.arn.as_str(), policy.max_receive_count, policy.queue_name().unwrap()), (arn, 2, "orders-dlq"), "{json}");
        }
        let cases = [
            ("not json", "not JSON"),
            (r#"{"maxReceiveCount":2}"#, "no deadLetterTargetArn"),
            (r#"{"deadLetterTargetArn":"x"}"#, "no maxReceiveCount"),
            (r#"{"deadLetterTargetArn":"x","maxReceiveCount":0}"#, "not a count"),
        ];
        for (json, says) in cases {
            assert!(RedrivePolicy::parse(json).unwrap_err().to_string().contains(says), "{json}");
        }
        let policy = RedrivePolicy { arn: "arn:aws:sns:us-east-1:1:topic".into(), max_receive_count: 1 };
        assert!(policy.queue_name().unwrap_err().to_string().contains("not an SQS queue's ARN"));
    }
}
