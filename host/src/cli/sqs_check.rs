//! `ebb check`'s probes of Amazon SQS: each SQS queue of the config (its partitions and its
//! poison queue) probed as [`SqsQueue::probe`] says, without changing anything but one
//! message's receive count. A permission the credential lacks is named by its IAM action;
//! a region or endpoint that reaches no SQS is named by its key. A queue's claim bucket is
//! probed too ([`S3Claims::probe`]), a refusal named by the bucket and the S3 action.

use std::time::Duration;

use anyhow::{Result, anyhow};

use crate::config::{Backend, Config, QueueConfig};
use crate::payload::claims::S3Claims;
use crate::queue::sqs::{SqsAccount, SqsOptions, SqsQueue};
use crate::queue::{FailureClass, QueueClient, QueueError, RetryPolicy};

/// The longest `ebb check` spends on one SQS queue, retries of transient errors included
/// (the queues are checked at once, so this bounds the whole SQS check).
const CHECK_SQS_DEADLINE: Duration = Duration::from_secs(20);

/// How a transient error (throttling, a dropped connection) is retried, as `run` does.
const CHECK_RETRY: RetryPolicy = RetryPolicy { max_attempts: 4, base_delay: Duration::from_millis(200), max_delay: Duration::from_secs(2) };

/// Every SQS queue of the config probed: a line printed for each queue reached, the
/// problems returned.
pub(super) fn check_sqs_queues(config: &Config) -> Vec<anyhow::Error> {
    let mut problems = Vec::new();
    let mut probes = Vec::new();
    let mut buckets = Vec::new();
    for queue in &config.queues {
        let Backend::Sqs { account, encoding, queue_url, claim_bucket } = &queue.backend else { continue };
        if let (Some(bucket), Some(first)) = (claim_bucket, queue.storage_queues().first()) {
            buckets.push(probe_bucket(S3Claims::new(account, bucket, first, queue.claims.max_bytes), &queue.name));
        }
        let names = queue.storage_queues().into_iter().map(|name| name.to_string()).chain([queue.poison_queue().to_string()]);
        for name in names {
            let url = queue_url.as_ref().filter(|(of, _)| *of == name).map(|(_, url)| url.clone());
            match SqsQueue::new(account, &name, SqsOptions { encoding: *encoding, queue_url: url.clone() }) {
                Ok(sqs) => probes.push(probe_bounded(sqs, queue, account, url)),
                Err(error) => problems.push(error.context(format!("queue {}", queue.name))),
            }
        }
    }
    if probes.is_empty() {
        return problems;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return vec![error.into()],
    };
    let (queues, buckets) = runtime.block_on(futures::future::join(futures::future::join_all(probes), futures::future::join_all(buckets)));
    for checked in queues.into_iter().chain(buckets) {
        match checked {
            Ok(line) => println!("{line}"),
            Err(error) => problems.push(error),
        }
    }
    problems
}

/// One SQS queue within [`CHECK_SQS_DEADLINE`], transient errors retried: the line to
/// print, or what is wrong, naming the key to look at.
async fn probe_bounded(sqs: SqsQueue, queue: &QueueConfig, account: &SqsAccount, queue_url: Option<String>) -> Result<String> {
    let name = sqs.name().to_string();
    let where_ = account.describe();
    let retried = async {
        let mut attempt = 1;
        loop {
            match sqs.probe().await {
                Err(error) if error.is_transient() && attempt < CHECK_RETRY.max_attempts => {
                    tokio::time::sleep(CHECK_RETRY.delay(attempt)).await;
                    attempt += 1;
                }
                probed => return probed,
            }
        }
    };
    let probe = match tokio::time::timeout(CHECK_SQS_DEADLINE, retried).await {
        Ok(Ok(probe)) => probe,
        Ok(Err(error)) => return Err(explained(&error, &queue.name, queue_url.as_deref())),
        Err(_) => {
            return Err(anyhow!(
                "queue {name} (of {}): {where_} did not answer within {}: check region and endpoint in [aws] (or [queues.{}.sqs])",
                queue.name,
                humantime::format_duration(CHECK_SQS_DEADLINE),
                queue.name
            ));
        }
    };
    if !probe.refused.is_empty() {
        let actions: Vec<_> = probe.refused.iter().map(|(action, _)| *action).collect();
        let first = &probe.refused[0].1;
        return Err(anyhow!("queue {name} on {where_}: the credential lacks {}: ebb run needs them ({first})", actions.join(", ")));
    }
    let Some(count) = probe.count else {
        return Ok(format!("queue {name}: reached {where_}; it does not exist yet (ebb run creates it: sqs:CreateQueue)"));
    };
    let messages = if count == 1 { "message" } else { "messages" };
    let (create, may_not_create) = match probe.may_create {
        Some(true) => ("create, ", ""),
        Some(false) => ("", "; may not create (ebb run needs not: it exists)"),
        None => ("", ""),
    };
    let took = if probe.took_a_message { "; the receive probe took one message (visible again at once, its receive count one higher)" } else { "" };
    Ok(format!(
        "queue {name}: reached {where_}, {count} {messages}; may {create}read, receive, delete and change visibility{may_not_create} (send not probed: it cannot be without sending){took}"
    ))
}

/// The claim bucket of queue `queue` within [`CHECK_SQS_DEADLINE`] (the SDK retries
/// transient errors): the line to print, or what is wrong, naming the bucket and the action.
async fn probe_bucket(claims: S3Claims, queue: &str) -> Result<String> {
    let bucket = format!("s3 bucket {} (claim checks of queue {queue})", claims.bucket());
    let probe = match tokio::time::timeout(CHECK_SQS_DEADLINE, claims.probe()).await {
        Ok(Ok(probe)) => probe,
        Ok(Err(error)) => return Err(anyhow!("{bucket}: {error}; check claim_bucket and region and endpoint in [aws] (or [queues.{queue}.sqs])")),
        Err(_) => return Err(anyhow!("{bucket}: S3 did not answer within {}", humantime::format_duration(CHECK_SQS_DEADLINE))),
    };
    if !probe.refused.is_empty() {
        let actions: Vec<_> = probe.refused.iter().map(|(action, _)| *action).collect();
        return Err(anyhow!("{bucket}: the credential lacks {}: ebb run needs them ({})", actions.join(", "), probe.refused[0].1));
    }
    Ok(match probe.exists {
        true => format!("{bucket}: reached; may list, get and delete objects (put not probed: it cannot be without writing)"),
        false => format!("{bucket}: does not exist yet (ebb run creates it with the first body it offloads: s3:CreateBucket)"),
    })
}

/// `error` of queue `queue` with the key to look at: the endpoint or region for a call
/// that reached nothing, `queue_url` (or the region) for a queue that is not there.
fn explained(error: &QueueError, queue: &str, queue_url: Option<&str>) -> anyhow::Error {
    let keys = format!("region and endpoint in [aws] (or [queues.{queue}.sqs])");
    match error.failure_class() {
        Some(FailureClass::Connection | FailureClass::Timeout) => anyhow!("{error}: no SQS answers there; check {keys}"),
        Some(FailureClass::Missing) if queue_url.is_some() => {
            anyhow!("{error}: check sqs.queue_url of [queues.{queue}.sqs], and that the region is the queue's ({keys})")
        }
        Some(FailureClass::Auth) => anyhow!("{error}; a key valid in another region or endpoint is refused too: check {keys}"),
        _ => anyhow!("{error}"),
    }
}
