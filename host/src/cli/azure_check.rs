//! `ebb check`'s probes of Azure storage: what `ebb run` will need of every storage queue
//! (create, read, add, process, update) and of the blob endpoint its claim checks use,
//! found without changing anything.
//!
//! - A SAS says what it allows (`sp`, `ss`, `srt`): read, nothing sent. That is the only
//!   side-effect-free way to know that a queue not created yet may be created, and that
//!   messages may be added (an add cannot be probed without adding one).
//! - On the service: the message count (read); a delete and an update of a message that
//!   does not exist (process, update: "not found" when allowed, 403 when not); a create of a
//!   queue that exists (idempotent: the answer says whether it is allowed). A queue that
//!   does not exist is never created: that is `run`'s first act, not `check`'s.
//! - The blob container of each storage queue with claim checks: one read of its
//!   properties, bounded by [`CHECK_BLOB_DEADLINE`].

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use azure_core::error::ErrorKind;
use azure_core::http::StatusCode;

use crate::config::{Backend, Config, QueueConfig};
use crate::queue::azure::{AzureAccount, QueuePermission};
use crate::queue::{FailureClass, MessageId, PopReceipt, QueueClient, QueueError, RetryPolicy, Retrying};
use crate::service::{QueueStack, StackOptions, storage_queue};

/// How `ebb check` retries a transient storage error (503 ServerBusy, a dropped connection),
/// as `run` does, within [`CHECK_STORAGE_DEADLINE`] per storage queue.
const CHECK_RETRY: RetryPolicy = RetryPolicy { max_attempts: 8, base_delay: Duration::from_millis(200), max_delay: Duration::from_secs(3) };

/// The longest `ebb check` spends reaching one storage queue, retries included (the queues are
/// checked at once, so this bounds the whole storage check).
const CHECK_STORAGE_DEADLINE: Duration = Duration::from_secs(20);

/// The longest `ebb check` waits for the blob endpoint of a queue's claim checks.
const CHECK_BLOB_DEADLINE: Duration = Duration::from_secs(10);

/// Every Azure queue of the config probed as the module says: a line printed for each
/// storage queue and container reached, the problems returned.
pub(super) fn check_azure_queues(config: &Config) -> Vec<anyhow::Error> {
    let azure: Vec<_> = config.queues.iter().filter(|q| matches!(q.backend, Backend::Azure { .. })).collect();
    if azure.is_empty() {
        return Vec::new();
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return vec![error.into()],
    };
    let mut problems = Vec::new();
    let mut probes = Vec::new();
    for queue in azure {
        let Backend::Azure { account, .. } = &queue.backend else { continue };
        let may_create = match check_sas(queue, account) {
            SasVerdict::Lacks(problem) => {
                problems.push(problem);
                true
            }
            SasVerdict::MayNotCreate => false,
            SasVerdict::Enough => true,
        };
        match probing_clients(queue) {
            Ok(clients) => probes.extend(clients.into_iter().map(|client| probe_bounded(client, queue.name.to_string(), may_create))),
            Err(error) => problems.push(error),
        }
    }
    let containers: Vec<_> = config
        .queues
        .iter()
        .filter_map(|queue| match &queue.backend {
            Backend::Azure { account, .. } if account.blob_endpoint().is_some() => Some((queue, account)),
            _ => None,
        })
        .flat_map(|(queue, account)| queue.storage_queues().into_iter().map(move |storage| check_claim_container(account, storage.to_string(), queue)))
        .collect();
    let (queues, containers) = runtime.block_on(futures::future::join(futures::future::join_all(probes), futures::future::join_all(containers)));
    for checked in queues.into_iter().chain(containers) {
        match checked {
            Ok(line) => println!("{line}"),
            Err(error) => problems.push(error),
        }
    }
    problems
}

/// Each storage queue of `queue` (its partitions, its poison queue, its reply queue), as
/// `run` assembles it but retrying as a probe: a missing queue is an answer, never created.
fn probing_clients(queue: &QueueConfig) -> Result<Vec<Arc<dyn QueueClient>>> {
    let open = |name: &str| storage_queue(&queue.backend, None, name);
    let stack = QueueStack::assemble(queue, &open, &StackOptions { metered: false, retry: None, readiness: None })?;
    let probing = |client: Arc<dyn QueueClient>| -> Arc<dyn QueueClient> { Arc::new(Retrying::new(client, CHECK_RETRY).probing()) };
    Ok(stack.partitions.into_iter().map(|p| p.client).chain([stack.poison]).chain(stack.reply).map(probing).collect())
}

/// What a SAS allows of what `run` needs.
enum SasVerdict {
    /// All of it (or no SAS: a key, an identity).
    Enough,
    /// All but create: enough where every storage queue exists (`run` creates nothing then).
    MayNotCreate,
    /// Not enough: what it lacks.
    Lacks(anyhow::Error),
}

/// What the account's SAS does not allow of what `run` needs, read from the SAS itself.
fn check_sas(queue: &QueueConfig, account: &AzureAccount) -> SasVerdict {
    let Some(grant) = account.sas_grant() else { return SasVerdict::Enough };
    let lacking = grant.lacks(&QueuePermission::RUN);
    match lacking.as_slice() {
        [] => return SasVerdict::Enough,
        [QueuePermission::Create] => return SasVerdict::MayNotCreate,
        _ => {}
    }
    let names: Vec<_> = lacking.iter().map(|p| p.as_str()).collect();
    let queue_sas = if grant.account.is_none() && lacking.contains(&QueuePermission::Create) {
        "; a queue (service) SAS can never create a queue: use an account SAS (ss=q, srt=co)"
    } else {
        ""
    };
    SasVerdict::Lacks(anyhow!(
        "queue {} on account {}: the shared access signature (sp={}) lacks {}: ebb run needs c (create), r (read), a (add), p (process) and u (update) on every storage queue{queue_sas}",
        queue.name,
        account.name(),
        grant.permissions,
        names.join(", "),
    ))
}

/// [`probe_queue`] within [`CHECK_STORAGE_DEADLINE`].
async fn probe_bounded(client: Arc<dyn QueueClient>, logical: String, may_create: bool) -> Result<String> {
    let name = client.name().to_string();
    match tokio::time::timeout(CHECK_STORAGE_DEADLINE, probe_queue(client.as_ref(), may_create)).await {
        Ok(probed) => probed,
        Err(_) => Err(anyhow!(
            "queue {name} (of {logical}): storage did not answer within {} (transient errors retried)",
            humantime::format_duration(CHECK_STORAGE_DEADLINE)
        )),
    }
}

/// Whether `error` says the queue does not exist.
fn is_missing(error: &QueueError) -> bool {
    error.failure_class() == Some(FailureClass::Missing)
}

/// One storage queue: the line to print, or what is wrong. Without `may_create` (a SAS
/// without `c`) the queue must exist already.
async fn probe_queue(client: &dyn QueueClient, may_create: bool) -> Result<String> {
    let name = client.name();
    let count = match client.approximate_count().await {
        Ok(count) => Some(count),
        Err(error) if is_missing(&error) => None,
        Err(error) => return Err(error.into()),
    };
    // Process and update, on a message that does not exist: nothing changes.
    let (nobody, no_receipt) = (MessageId::from("00000000-0000-0000-0000-000000000000"), PopReceipt::from("AAAAAAAAAAAAAAAAAAAAAA=="));
    for probe in [client.delete(&nobody, &no_receipt).await.map(|_| ()), client.update_visibility(&nobody, &no_receipt, Duration::ZERO).await.map(|_| ())] {
        match probe {
            Ok(()) | Err(QueueError::StaleReceipt { .. }) => {}
            Err(error) if is_missing(&error) => {}
            Err(error) => return Err(error.into()),
        }
    }
    let messages = if count == Some(1) { "message" } else { "messages" };
    let Some(count) = count else {
        if !may_create {
            bail!(
                "queue {name}: it does not exist, and the shared access signature lacks c (create): ebb run cannot create it; create it, or use a SAS with c"
            );
        }
        return Ok(format!("queue {name}: reached on Azure; it does not exist yet (ebb run creates it); may process and update"));
    };
    if !may_create {
        return Ok(format!(
            "queue {name}: reached on Azure, {count} {messages}; may read, process and update; may not create (ebb run needs not: it exists; one deleted under a running host is not recreated)"
        ));
    }
    // A create of a queue that exists changes nothing, and `run` makes it at every start.
    client.create_if_missing().await?;
    Ok(format!("queue {name}: reached on Azure, {count} {messages}; may create, read, process and update"))
}

/// The blob container of storage queue `storage`'s claim checks: one read of its
/// properties (a container not created yet is fine: the first large body creates it),
/// within [`CHECK_BLOB_DEADLINE`].
async fn check_claim_container(account: &AzureAccount, storage: String, queue: &QueueConfig) -> Result<String> {
    use azure_storage_blob::{BlobContainerClient, BlobContainerClientOptions};
    let endpoint = account.blob_endpoint().map(ToString::to_string).unwrap_or_default();
    let container = crate::payload::claims::container_for_queue(&storage)?;
    let context = format!("queue {}: claim checks in blob container {container} at {endpoint}", queue.name);
    let what = format!("claim-check container {container}");
    // The client's own timeout a little later than the bound: an endpoint that never
    // answers is named as such, not as a failed request.
    let client_timeout = CHECK_BLOB_DEADLINE + Duration::from_secs(1);
    let (client_options, entra) = crate::queue::azure::sdk_client_options(account, client_timeout, crate::queue::azure::DEFAULT_POOL_IDLE_TIMEOUT, &what)?;
    let options = BlobContainerClientOptions { client_options, version: crate::queue::azure::API_VERSION.to_string() };
    let client = BlobContainerClient::new(account.container_url(&container)?, entra, Some(options)).map_err(|e| anyhow!("{context}: {e}"))?;
    let answer = match tokio::time::timeout(CHECK_BLOB_DEADLINE, client.get_properties(None)).await {
        Ok(answer) => answer,
        Err(_) => {
            return Err(anyhow!(
                "{context}: no answer within {}: a body too large for a message could not be offloaded",
                humantime::format_duration(CHECK_BLOB_DEADLINE)
            ));
        }
    };
    match answer {
        Ok(_) => Ok(format!("{context}: reached")),
        Err(error) => match error.kind() {
            ErrorKind::HttpResponse { status: StatusCode::NotFound, error_code, .. } if error_code.as_deref() == Some("ContainerNotFound") => {
                Ok(format!("{context}: reached; the container does not exist yet (the first large body creates it)"))
            }
            ErrorKind::HttpResponse { status, error_code, .. } => Err(anyhow!(
                "{context}: {} ({status}): a body too large for a message could not be offloaded",
                error_code.as_deref().unwrap_or("no error code")
            )),
            _ => Err(anyhow!(
                "{context}: {}: a body too large for a message could not be offloaded",
                crate::health::truncate_reason(&crate::queue::azure::redact_signatures(&error.to_string()))
            )),
        },
    }
}
