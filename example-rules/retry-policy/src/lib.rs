//! A per-error retry policy (contract 0.4.0, world `failure-aware-rule`): the scaling
//! decisions are the paper's; what happens to a failed message depends on how it failed.
//!
//! - HTTP 400 and 422 (and any status in `poison_statuses`): the message will never succeed,
//!   so it is poisoned at the first failure, with the status as the reason.
//! - A timeout, or a connection the app refused (it is restarting, or overloaded): retried
//!   after `slow_retry_ms` × 2^(attempt − 1), jittered, so a struggling app gets air.
//! - Anything else: retried after `base_retry_ms` × 2^(attempt − 1), jittered; from
//!   `max_dequeue_count` on, the host's default (poison).
//!
//! Parameters (`rule_params`, all optional): `base_retry_ms` (default 1000),
//! `slow_retry_ms` (default 10000), `poison_statuses` (comma-separated, default `400,422`).
use ebb_rules_sdk::backoff::jittered_geometric;
use ebb_rules_sdk::{ErrorClass, FailureContext, FailureDecision, FailureRule, Params, ParamsExt, ScalingRule, export_rule};

/// The policy and its parameters.
pub struct RetryPolicy {
    base_retry_ms: u64,
    slow_retry_ms: u64,
    poison_statuses: Vec<u16>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { base_retry_ms: 1_000, slow_retry_ms: 10_000, poison_statuses: vec![400, 422] }
    }
}

impl ScalingRule for RetryPolicy {
    fn configure(&mut self, params: &Params) -> Result<(), String> {
        let mut reader = params.reader();
        self.base_retry_ms = reader.get_or("base_retry_ms", self.base_retry_ms)?;
        self.slow_retry_ms = reader.get_or("slow_retry_ms", self.slow_retry_ms)?;
        if let Some(list) = reader.raw("poison_statuses") {
            self.poison_statuses = list
                .split(',')
                .filter(|s| !s.trim().is_empty())
                .map(|s| s.trim().parse::<u16>().map_err(|_| format!("poison_statuses: {s:?} is not an HTTP status")))
                .collect::<Result<_, _>>()?;
        }
        reader.finish()
    }
}

impl FailureRule for RetryPolicy {
    fn on_handler_failure(&self, ctx: &FailureContext) -> FailureDecision {
        if let Some(status) = ctx.http_status.filter(|s| self.poison_statuses.contains(s)) {
            return FailureDecision::Poison(format!("retry-policy: HTTP {status} is not retried"));
        }
        if ctx.dequeue_count >= ctx.max_dequeue_count {
            return FailureDecision::Default;
        }
        let base = match ctx.error_class {
            ErrorClass::Timeout | ErrorClass::Connect => self.slow_retry_ms,
            _ => self.base_retry_ms,
        };
        FailureDecision::Retry(jittered_geometric(ctx.dequeue_count, base, ctx.max_retry_delay_ms.max(base), 2.0, (0.9, 1.1), ctx.random))
    }
}

export_rule!(RetryPolicy, failures);

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(class: ErrorClass, status: Option<u16>, attempt: u32) -> FailureContext {
        FailureContext { error_class: class, http_status: status, dequeue_count: attempt, max_dequeue_count: 5, max_retry_delay_ms: 600_000, random: u64::MAX / 2, ..Default::default() }
    }

    #[test]
    fn an_unprocessable_message_is_poisoned_at_once_and_others_back_off() {
        let rule = RetryPolicy::default();
        assert!(matches!(rule.on_handler_failure(&failure(ErrorClass::HttpStatus, Some(422), 1)), FailureDecision::Poison(_)));
        assert_eq!(rule.on_handler_failure(&failure(ErrorClass::HttpStatus, Some(500), 1)), FailureDecision::Retry(1_000));
        assert_eq!(rule.on_handler_failure(&failure(ErrorClass::HttpStatus, Some(500), 3)), FailureDecision::Retry(4_000));
        assert_eq!(rule.on_handler_failure(&failure(ErrorClass::Timeout, None, 1)), FailureDecision::Retry(10_000));
        assert_eq!(rule.on_handler_failure(&failure(ErrorClass::Other, None, 5)), FailureDecision::Default);
    }
}
