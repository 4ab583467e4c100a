//! What happens to a delivery whose handler failed: the queue's `max_dequeue_count` and
//! doubling retry delay, unless its rule exports `ebb:rules/failures@0.4.0`, which is then
//! asked (`on-handler-failure`) under the same limits as its other decisions. Host errors and
//! push-backs never come here (see `process`): they are not failures of the message.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::handler::{HandlerPanicked, HandlerStatus, IncomingMessage, PUSHED_BACK_POISON_DEQUEUES};
use crate::rules::{Decider, Decision, ErrorClass, FailureContext, FailureDecision};
use ebb_rules_sdk::MAX_FAILURE_TEXT_BYTES;

use crate::listener::Shared;

/// What to do with a failed delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::listener) enum FailureVerdict {
    /// Hide it (or put its item back) for this long.
    Retry(Duration),
    /// Move it to the poison queue with this reason.
    Poison(String),
}

/// One failed delivery: of `message`, or of its item `item` (then `tries` counts the
/// item's own deliveries).
pub(in crate::listener) struct FailedDelivery<'a> {
    pub message: &'a IncomingMessage,
    pub error: &'a anyhow::Error,
    pub tries: u32,
    pub item: Option<u32>,
    pub latency: Duration,
}

/// How a handler call failed, and its HTTP status when it answered one.
pub(in crate::listener) fn classify(error: &anyhow::Error) -> (ErrorClass, Option<u16>) {
    if let Some(status) = error.downcast_ref::<HandlerStatus>() {
        return (ErrorClass::HttpStatus, Some(status.status));
    }
    if error.downcast_ref::<HandlerPanicked>().is_some() {
        return (ErrorClass::Panic, None);
    }
    for cause in error.chain() {
        if let Some(http) = cause.downcast_ref::<reqwest::Error>() {
            if http.is_timeout() {
                return (ErrorClass::Timeout, None);
            }
            if http.is_connect() {
                return (ErrorClass::Connect, None);
            }
        }
    }
    (ErrorClass::Other, None)
}

impl Shared {
    /// What the queue does without a failure rule: retry after the doubling delay, poison
    /// once `tries` reaches `max_dequeue_count` with the handler's error as the reason.
    fn default_verdict(&self, failed: &FailedDelivery<'_>, reason: String) -> FailureVerdict {
        if failed.tries >= self.max_dequeue_count() { FailureVerdict::Poison(reason) } else { FailureVerdict::Retry(self.settings.retry_delay(failed.tries)) }
    }

    /// Deliveries after which a message is poisoned: the queue's `max_dequeue_count`, or the
    /// `maxReceiveCount` of the dead-letter queue its service moves it to.
    pub(in crate::listener) fn max_dequeue_count(&self) -> u32 {
        self.queue.dead_letter().map_or(self.settings.max_dequeue_count, |dead_letter| dead_letter.max_receive_count)
    }

    /// Decides a failed delivery. `reason` is the poison reason the default would give.
    pub(in crate::listener) async fn failure_verdict(&self, failed: FailedDelivery<'_>, reason: String) -> FailureVerdict {
        if !self.rule.decider.may_decide_failures() {
            return self.default_verdict(&failed, reason);
        }
        let ctx = self.failure_context(&failed);
        let decision = self.ask_rule(ctx, |rule: &dyn Decider, ctx| rule.decide_failure(ctx), |_| None).await;
        let counters = &self.telemetry.counters;
        match decision {
            Some(Decision { value: FailureDecision::Retry(delay_ms), .. }) => {
                // A rule may retry past max_dequeue_count, but nothing is retried forever.
                let ceiling = PUSHED_BACK_POISON_DEQUEUES.max(self.settings.max_dequeue_count);
                if failed.tries >= ceiling {
                    counters.failure_rule_defaults.fetch_add(1, Ordering::Relaxed);
                    return FailureVerdict::Poison(format!(
                        "{reason} (the rule retried it, but it was delivered {} times, the most a rule's retries may take)",
                        failed.tries
                    ));
                }
                counters.failure_rule_retries.fetch_add(1, Ordering::Relaxed);
                FailureVerdict::Retry(Duration::from_millis(delay_ms))
            }
            Some(Decision { value: FailureDecision::Poison(why), .. }) => {
                counters.failure_rule_poisons.fetch_add(1, Ordering::Relaxed);
                FailureVerdict::Poison(format!("poisoned by the queue's rule: {why} (the handler: {reason})"))
            }
            // The rule said `default`, or could not answer (its fault is counted with the rule's).
            Some(Decision { value: FailureDecision::Default, .. }) => {
                counters.failure_rule_defaults.fetch_add(1, Ordering::Relaxed);
                self.default_verdict(&failed, reason)
            }
            // Not decided: a native rule without the decision, or a call that panicked
            // (counted in rule_call_panics).
            None => self.default_verdict(&failed, reason),
        }
    }

    fn failure_context(&self, failed: &FailedDelivery<'_>) -> FailureContext {
        let (error_class, http_status) = classify(failed.error);
        let now_ms = self.rule.clock.now_ms();
        let inserted_ms = failed.message.inserted_at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let error = format!("{:#}", failed.error);
        let error = crate::health::escaped_text(crate::rules::cut(&error, MAX_FAILURE_TEXT_BYTES));
        FailureContext {
            queue: self.queue.name().to_string(),
            dequeue_count: failed.tries,
            max_dequeue_count: self.max_dequeue_count(),
            error_class,
            http_status,
            error: crate::rules::cut(&error, MAX_FAILURE_TEXT_BYTES).to_string(),
            item: failed.item,
            elapsed_ms: now_ms.saturating_sub(inserted_ms),
            handler_latency_ms: failed.latency.as_millis().min(u128::from(u64::MAX)) as u64,
            default_retry_delay_ms: self.settings.retry_delay(failed.tries).as_millis() as u64,
            max_retry_delay_ms: self.settings.max_retry_delay.as_millis().min(u128::from(u64::MAX)) as u64,
            timestamp_ms: now_ms,
            random: self.rule.failure_random(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_classed_by_its_typed_error_anywhere_in_its_chain() {
        let status: anyhow::Error = HandlerStatus { status: 422, detail: "handler answered 422".into() }.into();
        assert_eq!(classify(&status), (ErrorClass::HttpStatus, Some(422)));
        let panicked: anyhow::Error = HandlerPanicked("bug".into()).into();
        assert_eq!(classify(&panicked), (ErrorClass::Panic, None));
        assert_eq!(classify(&anyhow::anyhow!("the app's own error")), (ErrorClass::Other, None));
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_failure() {
        // A port nothing listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let error = reqwest::Client::new().post(format!("http://127.0.0.1:{port}/")).send().await.unwrap_err();
        let error = anyhow::Error::new(error).context("handler did not answer");
        assert_eq!(classify(&error), (ErrorClass::Connect, None));
    }
}
