//! `ebb bench sqs`: throughput on Amazon SQS (issue 37's goal: ebb at least 0.9 × a
//! hand-written loop with the same SDK). It starts nothing: it calls the SQS endpoint and
//! region the flags or the SDK's standard environment name (`AWS_ENDPOINT_URL`, `AWS_REGION`,
//! the credential variables), e.g. a moto server. Each run fills the queue with the messages
//! (SendMessageBatch), then drains it, by one of:
//!
//! - the loop: T tasks, each receiving 10 (`WaitTimeSeconds` 1), handling them (a no-op) and
//!   deleting them with one `DeleteMessageBatch`, as a user of `aws-sdk-sqs` would write it;
//! - ebb: the listener over ebb's SQS backend with T dequeue tasks (`min_tasks = max_tasks`),
//!   batches of 10 and a no-op handler, metered.
//!
//! The two alternate (loop, ebb; then ebb, loop) so that the drift of a shared machine hits
//! both alike. Reported: msg/s from the first receive to the last delete (medians), ebb's
//! ratio to the loop, and requests per message (receives and deletes; the floor is 0.2).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use async_trait::async_trait;
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, SendMessageBatchRequestEntry};
use serde::Serialize;

use crate::contenders::wait_until_processed;
use crate::report::median;
use ebb::handler::{Handler, IncomingMessage};
use ebb::listener::{Listener, QueueSettings};
use ebb::queue::Metered;
use ebb::queue::sqs::{AwsCredentials, AwsSettings, SqsAccount, SqsOptions, SqsQueue};

/// SQS's most messages per receive and entries per batch call.
const SQS_BATCH: usize = 10;
/// The goal: ebb's msg/s at least this share of the loop's.
pub(crate) const GOAL_RATIO: f64 = 0.9;
/// How long the loop's receives wait for a first message: short, so a task that finds the
/// queue drained ends soon after (the run's time ends at the last delete regardless).
const LOOP_WAIT_SECONDS: i32 = 1;
/// The loop's visibility timeout: far longer than a run, so nothing is received twice.
const LOOP_VISIBILITY_SECONDS: i32 = 300;
/// Longest ebb's run may take, once every message was handled, to empty the queue.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct SqsBench {
    /// `None`: the SDK's (`AWS_REGION`, the shared profile).
    pub(crate) region: Option<String>,
    /// `None`: the SDK's (`AWS_ENDPOINT_URL_SQS`, `AWS_ENDPOINT_URL`, or AWS's).
    pub(crate) endpoint: Option<String>,
    /// The queue, created when missing; its `-poison` queue too.
    pub(crate) queue: String,
    pub(crate) messages: u64,
    /// The loop's tasks and ebb's dequeue tasks.
    pub(crate) tasks: u32,
    pub(crate) body_bytes: u32,
    pub(crate) rounds: u32,
}

/// Who drains the queue in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Drainer {
    Loop,
    Ebb,
}

/// One run's figures.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct SqsRun {
    pub(crate) round: u32,
    pub(crate) drainer: Drainer,
    pub(crate) seconds: f64,
    pub(crate) msg_per_s: f64,
    /// Receives (empty ones included) and delete calls until the last delete.
    pub(crate) requests: u64,
    pub(crate) requests_per_message: f64,
    /// ebb's requests by kind (its meter's; the loop counts only its total).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ebb_requests: Option<RequestKinds>,
}

/// ebb's requests in a run, by kind: where it pays beyond the floor's full receives and
/// full delete batches.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct RequestKinds {
    pub(crate) receives: u64,
    pub(crate) empty_receives: u64,
    pub(crate) delete_batches: u64,
    /// ChangeMessageVisibility(Batch): renewals and releases.
    pub(crate) visibility: u64,
    /// GetQueueAttributes for the scaler's counts.
    pub(crate) counts: u64,
    /// Setting the queue up (its attributes read at start).
    pub(crate) setup: u64,
}

impl RequestKinds {
    fn of(counts: &ebb::queue::TransactionCounts) -> RequestKinds {
        RequestKinds {
            receives: counts.gets_with_messages,
            empty_receives: counts.gets_empty,
            delete_batches: counts.deletes,
            visibility: counts.updates,
            counts: counts.counts,
            setup: counts.creates,
        }
    }
}

/// One drainer's medians.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct SqsFigures {
    pub(crate) msg_per_s: f64,
    pub(crate) requests_per_message: f64,
}

/// The whole result.
#[derive(Debug, Serialize)]
pub(crate) struct SqsReport {
    /// Where it ran: the endpoint as given, or the SDK's.
    pub(crate) endpoint: String,
    pub(crate) queue: String,
    pub(crate) messages: u64,
    pub(crate) tasks: u32,
    pub(crate) body_bytes: u32,
    pub(crate) rounds: u32,
    #[serde(rename = "loop")]
    pub(crate) sdk_loop: SqsFigures,
    pub(crate) ebb: SqsFigures,
    /// ebb's msg/s over the loop's.
    pub(crate) ratio: f64,
    pub(crate) goal_ratio: f64,
    pub(crate) goal_met: bool,
    pub(crate) runs: Vec<SqsRun>,
}

/// Runs the bench on a runtime of its own.
pub(crate) fn run(bench: &SqsBench) -> anyhow::Result<SqsReport> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("failed to start the bench's runtime")?;
    runtime.block_on(run_async(bench))
}

async fn run_async(bench: &SqsBench) -> anyhow::Result<SqsReport> {
    let client = sdk_client(bench).await;
    let queue_url = create_queue(&client, &bench.queue).await?;
    let poison_url = create_queue(&client, &format!("{}-poison", bench.queue)).await?;
    let account = SqsAccount::new(AwsSettings {
        region: bench.region.clone(),
        endpoint: bench.endpoint.clone(),
        credentials: AwsCredentials::DefaultChain,
        ..AwsSettings::default()
    });
    let body = "x".repeat(bench.body_bytes as usize);
    let mut runs = Vec::new();
    for round in 1..=bench.rounds {
        let order = if round % 2 == 1 { [Drainer::Loop, Drainer::Ebb] } else { [Drainer::Ebb, Drainer::Loop] };
        for drainer in order {
            let left = approximate_count(&client, &queue_url).await?;
            if left > 0 {
                bail!("queue {} holds {left} messages before a run: the bench needs it empty (purge it, or name another with --queue)", bench.queue);
            }
            fill(&client, &queue_url, &body, bench.messages, bench.tasks).await.with_context(|| format!("failed to fill queue {}", bench.queue))?;
            let (elapsed, requests, ebb_requests) = match drainer {
                Drainer::Loop => sdk_loop(&client, &queue_url, bench.messages, bench.tasks).await.map(|(elapsed, requests)| (elapsed, requests, None)),
                Drainer::Ebb => ebb_listener(&account, &client, bench, &queue_url, &poison_url).await.map(|(elapsed, kinds)| {
                    let requests = kinds.receives + kinds.empty_receives + kinds.delete_batches + kinds.visibility + kinds.counts + kinds.setup;
                    (elapsed, requests, Some(kinds))
                }),
            }
            .with_context(|| format!("round {round}, {drainer:?}"))?;
            let run = SqsRun {
                round,
                drainer,
                seconds: elapsed.as_secs_f64(),
                msg_per_s: bench.messages as f64 / elapsed.as_secs_f64().max(1e-9),
                requests,
                requests_per_message: requests as f64 / bench.messages.max(1) as f64,
                ebb_requests,
            };
            let kinds = ebb_requests.map_or(String::new(), |k| format!(" ({k:?})"));
            eprintln!("round {round}/{}: {drainer:?}: {:.0} msg/s, {:.3} requests per message{kinds}", bench.rounds, run.msg_per_s, run.requests_per_message);
            runs.push(run);
        }
    }
    let figures = |drainer: Drainer| {
        let of = |figure: fn(&SqsRun) -> f64| median(runs.iter().filter(|r| r.drainer == drainer).map(figure).collect());
        SqsFigures { msg_per_s: of(|r| r.msg_per_s), requests_per_message: of(|r| r.requests_per_message) }
    };
    let (sdk_loop, ebb) = (figures(Drainer::Loop), figures(Drainer::Ebb));
    let ratio = ebb.msg_per_s / sdk_loop.msg_per_s;
    Ok(SqsReport {
        endpoint: bench.endpoint.clone().or_else(sdk_endpoint).unwrap_or_else(|| "AWS (the SDK's endpoint)".to_string()),
        queue: bench.queue.clone(),
        messages: bench.messages,
        tasks: bench.tasks,
        body_bytes: bench.body_bytes,
        rounds: bench.rounds,
        sdk_loop,
        ebb,
        ratio,
        goal_ratio: GOAL_RATIO,
        goal_met: ratio >= GOAL_RATIO,
        runs,
    })
}

/// The endpoint the SDK's environment names, for the report.
fn sdk_endpoint() -> Option<String> {
    ["AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL"].into_iter().find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
}

/// The client a user would make: the SDK's defaults (its retries included), the flags over them.
async fn sdk_client(bench: &SqsBench) -> aws_sdk_sqs::Client {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(region) = &bench.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some(endpoint) = &bench.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    aws_sdk_sqs::Client::new(&loader.load().await)
}

async fn create_queue(client: &aws_sdk_sqs::Client, name: &str) -> anyhow::Result<String> {
    let answer = client.create_queue().queue_name(name).send().await.with_context(|| format!("failed to create queue {name}"))?;
    answer.queue_url.with_context(|| format!("the answer to creating queue {name} has no URL"))
}

async fn approximate_count(client: &aws_sdk_sqs::Client, url: &str) -> anyhow::Result<u64> {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let names = [A::ApproximateNumberOfMessages, A::ApproximateNumberOfMessagesNotVisible, A::ApproximateNumberOfMessagesDelayed];
    let answer = client.get_queue_attributes().queue_url(url).set_attribute_names(Some(names.to_vec())).send().await.context("failed to count the queue")?;
    let attributes = answer.attributes.unwrap_or_default();
    Ok(names.iter().filter_map(|name| attributes.get(name)?.parse::<u64>().ok()).sum())
}

/// Sends `messages` bodies in batches of 10, `tasks` batches at a time.
async fn fill(client: &aws_sdk_sqs::Client, url: &str, body: &str, messages: u64, tasks: u32) -> anyhow::Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let senders: Vec<_> = (0..tasks.max(1))
        .map(|_| {
            let (client, url, body, next) = (client.clone(), url.to_string(), body.to_string(), next.clone());
            tokio::spawn(async move {
                loop {
                    let first = next.fetch_add(SQS_BATCH as u64, Ordering::Relaxed);
                    if first >= messages {
                        return anyhow::Ok(());
                    }
                    let entries = (first..messages.min(first + SQS_BATCH as u64))
                        .map(|n| SendMessageBatchRequestEntry::builder().id(n.to_string()).message_body(&body).build())
                        .collect::<Result<Vec<_>, _>>()?;
                    let sent = client.send_message_batch().queue_url(&url).set_entries(Some(entries)).send().await?;
                    if let Some(failed) = sent.failed.first() {
                        bail!("SendMessageBatch refused entry {}: {} {}", failed.id, failed.code, failed.message.as_deref().unwrap_or_default());
                    }
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.context("a sending task panicked")??;
    }
    Ok(())
}

/// The hand-written loop: `tasks` tasks receiving 10, handling them (nothing to do) and
/// deleting them in one batch, until `messages` are deleted. Returns the time from the
/// start to the last delete, and the requests made by then.
async fn sdk_loop(client: &aws_sdk_sqs::Client, url: &str, messages: u64, tasks: u32) -> anyhow::Result<(Duration, u64)> {
    let deleted = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let finished = Arc::new(std::sync::Mutex::new(None::<(Duration, u64)>));
    let workers: Vec<_> = (0..tasks.max(1))
        .map(|_| {
            let (client, url, deleted, requests, finished) = (client.clone(), url.to_string(), deleted.clone(), requests.clone(), finished.clone());
            tokio::spawn(async move {
                while deleted.load(Ordering::Relaxed) < messages {
                    let received = client
                        .receive_message()
                        .queue_url(&url)
                        .max_number_of_messages(SQS_BATCH as i32)
                        .visibility_timeout(LOOP_VISIBILITY_SECONDS)
                        .wait_time_seconds(LOOP_WAIT_SECONDS)
                        .send()
                        .await?;
                    requests.fetch_add(1, Ordering::Relaxed);
                    let batch = received.messages.unwrap_or_default();
                    if batch.is_empty() {
                        continue;
                    }
                    // Handling is a no-op: the bench measures the queue's path.
                    let entries = batch
                        .iter()
                        .enumerate()
                        .map(|(i, m)| DeleteMessageBatchRequestEntry::builder().id(i.to_string()).set_receipt_handle(m.receipt_handle.clone()).build())
                        .collect::<Result<Vec<_>, _>>()?;
                    let answer = client.delete_message_batch().queue_url(&url).set_entries(Some(entries)).send().await?;
                    let requests_now = requests.fetch_add(1, Ordering::Relaxed) + 1;
                    if let Some(failed) = answer.failed.first() {
                        bail!("DeleteMessageBatch refused entry {}: {}", failed.id, failed.code);
                    }
                    let now = deleted.fetch_add(answer.successful.len() as u64, Ordering::Relaxed) + answer.successful.len() as u64;
                    if now >= messages {
                        finished.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert((started.elapsed(), requests_now));
                    }
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for worker in workers {
        worker.await.context("a loop task panicked")??;
    }
    let finished = *finished.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    finished.context("the loop ended before every message was deleted")
}

/// A handler with nothing to do.
struct NoOp;

#[async_trait]
impl Handler for NoOp {
    async fn handle(&self, _message: &IncomingMessage) -> anyhow::Result<()> {
        Ok(())
    }
}

/// ebb's listener on the queue (metered) with `tasks` dequeue tasks, from its start until
/// the queue is empty; the requests are its meter's (the bench's own counts not included).
async fn ebb_listener(
    account: &SqsAccount,
    client: &aws_sdk_sqs::Client,
    bench: &SqsBench,
    queue_url: &str,
    poison_url: &str,
) -> anyhow::Result<(Duration, RequestKinds)> {
    let with_url = |url: &str| SqsOptions { queue_url: Some(url.to_string()), ..SqsOptions::default() };
    let queue = Arc::new(Metered::new(SqsQueue::new(account, &bench.queue, with_url(queue_url))?));
    let poison = Arc::new(SqsQueue::new(account, &format!("{}-poison", bench.queue), with_url(poison_url))?);
    let transactions = queue.transactions();
    let settings = QueueSettings {
        batch_size: SQS_BATCH as u32,
        min_tasks: bench.tasks,
        max_tasks: bench.tasks,
        // As many calls at once as the loop's tasks handle.
        max_concurrent_calls: bench.tasks * SQS_BATCH as u32,
        ..QueueSettings::default()
    };
    let listener = Listener::builder(queue.clone(), poison, Arc::new(NoOp)).settings(settings).build();
    let started = Instant::now();
    listener.start();
    // Handled is not yet deleted: the run ends when the queue is empty.
    let finished = match wait_until_processed(&listener, bench.messages).await {
        Ok(_) => wait_until_empty(client, queue_url).await,
        Err(error) => Err(error),
    };
    let (elapsed, requests) = (started.elapsed(), RequestKinds::of(&transactions.snapshot()));
    listener.shutdown(Duration::from_secs(10)).await;
    finished?;
    Ok((elapsed, requests))
}

/// Waits until the queue holds no message, visible or in flight, asking every 100 ms.
async fn wait_until_empty(client: &aws_sdk_sqs::Client, url: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    loop {
        let left = approximate_count(client, url).await?;
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("every message was handled, but {left} were still in the queue {DRAIN_TIMEOUT:?} later");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The report as a table.
pub(crate) fn table(report: &SqsReport) -> String {
    let line = |name: &str, f: &SqsFigures| format!("{name:<6} {:>10.0} {:>18.3}\n", f.msg_per_s, f.requests_per_message);
    let kinds: Vec<RequestKinds> = report.runs.iter().filter_map(|r| r.ebb_requests).collect();
    let sum = |kind: fn(&RequestKinds) -> u64| kinds.iter().map(kind).sum::<u64>();
    let floor = (report.messages.div_ceil(SQS_BATCH as u64) * 2) * kinds.len() as u64;
    let by_kind = format!(
        "ebb's requests over its {} runs (floor {floor}): receives {} (+{} empty), delete batches {}, visibility {}, counts {}, setup {}\n",
        kinds.len(),
        sum(|k| k.receives),
        sum(|k| k.empty_receives),
        sum(|k| k.delete_batches),
        sum(|k| k.visibility),
        sum(|k| k.counts),
        sum(|k| k.setup)
    );
    let table = format!(
        "{} messages of {} B on {} ({}), T = {}, {} rounds (medians)\n{:<6} {:>10} {:>18}\n{}{}ebb / loop: {:.2} (goal ≥ {GOAL_RATIO}: {})\n",
        report.messages,
        report.body_bytes,
        report.queue,
        report.endpoint,
        report.tasks,
        report.rounds,
        "",
        "msg/s",
        "requests/message",
        line("loop", &report.sdk_loop),
        line("ebb", &report.ebb),
        report.ratio,
        if report.goal_met { "met" } else { "not met" }
    );
    table + &by_kind
}
