//! Puts the host makes itself (a poisoning, an answer) with a message's trace context, which
//! the queue's own limit may refuse to carry.

use std::future::Future;

use super::QueueError;
use crate::telemetry::{TraceContext, with_sending};

/// Runs `put` as a send with `context` (SQS puts it in the message's attributes); when the
/// message is then too large, runs it again without (counted in
/// `ebb_trace_context_dropped_total`): a context is dropped, never a message (one made by the
/// host, an answer or a poisoning, which no producer could send again).
pub(crate) async fn with_sending_if_it_fits<T, F: Future<Output = Result<T, QueueError>>>(
    context: Option<TraceContext>,
    put: impl Fn() -> F,
) -> Result<T, QueueError> {
    let traced = context.is_some();
    match with_sending(context, put()).await {
        Err(QueueError::MessageTooLarge { .. }) if traced => {
            crate::telemetry::uncarried().inc();
            with_sending(None, put()).await
        }
        done => done,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::sending;

    #[tokio::test]
    async fn a_put_too_large_only_with_its_context_goes_without_it() {
        let context = TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None);
        let too_large = || QueueError::MessageTooLarge { size: 2, limit: 1 };
        let attributes_too_large = || async { if sending().is_some() { Err(too_large()) } else { Ok(()) } };
        assert!(with_sending_if_it_fits(context.clone(), attributes_too_large).await.is_ok());
        let body_too_large = || async { Err::<(), _>(too_large()) };
        assert!(matches!(with_sending_if_it_fits(context, body_too_large).await, Err(QueueError::MessageTooLarge { .. })));
    }
}
