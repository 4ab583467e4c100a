//! One assembly of a queue's client stack, for every caller (run, `ebb scaler`, demo,
//! simulate, check, `ebb send` without a host): the backend, then metering (every call a
//! counted, billed transaction), then retries of transient errors, then the partitions as
//! one logical queue. Each caller says what differs in [`StackOptions`]. A queue's producer
//! (its [`QueueHandle`]) starts here too, for the service and `ebb send` without a host alike
//! ([`QueueStack::producer`]).

use std::sync::Arc;

use anyhow::{Context as _, Result};

use crate::config::{Backend, QueueConfig};
use crate::health::Readiness;
use crate::names::{PartitionName, PoisonQueueName, QueueName};
use crate::payload::ExtendedClientPointers;
use crate::payload::claims::{AzureClaims, ClaimRecords, ClaimSettings, ClaimStore, EmbeddedClaims, Recorded, S3Claims};
use crate::queue::azure::{AzureOptions, AzureQueue};
use crate::queue::embedded::EmbeddedStore;
use crate::queue::partitioned::Partitioned;
use crate::queue::sqs::{Offloads, SqsOptions, SqsQueue};
use crate::queue::{Metered, QueueClient, RetryPolicy, Retrying, Transactions};

use super::handle::{QueueHandle, QueueHandleBuilder};

/// Opens a storage queue of some backend by name, undecorated.
pub type OpenQueue<'a> = dyn Fn(&str) -> Result<Arc<dyn QueueClient>> + 'a;

/// Queue `name` of a backend, undecorated (`store`: the open embedded store, needed only
/// by the embedded backend).
pub fn storage_queue(backend: &Backend, store: Option<&EmbeddedStore>, name: &str) -> Result<Arc<dyn QueueClient>> {
    Ok(match backend {
        Backend::Embedded => Arc::new(store.context("the embedded store is not open")?.queue(name)),
        Backend::Azure { account, encoding } => {
            let options = AzureOptions { encoding: *encoding, ..AzureOptions::default() };
            Arc::new(AzureQueue::new(account, name, options).with_context(|| format!("queue {name} on Azure account {}", account.name()))?)
        }
        Backend::Sqs { account, encoding, queue_url, .. } => {
            let queue_url = queue_url.as_ref().filter(|(of, _)| of == name).map(|(_, url)| url.clone());
            // Pointers are read with or without a claim bucket: one into no bucket of ours is
            // then poisoned naming why, not handed on as its JSON.
            let pointers = Some(Arc::new(ExtendedClientPointers) as Arc<dyn Offloads>);
            Arc::new(
                SqsQueue::new(account, name, SqsOptions { encoding: *encoding, queue_url })
                    .with_context(|| format!("queue {name} on {}", account.describe()))?
                    .with_pointers(pointers),
            )
        }
    })
}

/// The claim-check store of storage queue `name` (`ebb::payload::claims`): a blob container
/// on the queue's Azure account, the SQS queue's `claim_bucket` in S3, or the embedded
/// store's claims table, for bodies of at
/// most `settings.max_bytes`, its calls counted in `records` (under `name`). The seam for
/// producers and the listener; the host's sweeper uses it too.
pub fn claim_store(
    backend: &Backend,
    store: Option<&EmbeddedStore>,
    name: &str,
    settings: &ClaimSettings,
    records: &ClaimRecords,
) -> Result<Arc<dyn ClaimStore>> {
    let record = records.for_queue(name);
    let inner: Arc<dyn ClaimStore> = match backend {
        Backend::Embedded => Arc::new(EmbeddedClaims::new(store.context("the embedded store is not open")?.queue(name), settings.max_bytes)),
        Backend::Azure { account, encoding } => {
            let options = AzureOptions { encoding: *encoding, ..AzureOptions::default() };
            Arc::new(
                AzureClaims::with_record(account, name, settings.max_bytes, &options, record.clone())
                    .with_context(|| format!("claim checks of queue {name} on Azure account {}", account.name()))?,
            )
        }
        Backend::Sqs { account, claim_bucket, .. } => {
            let bucket = claim_bucket.as_deref().with_context(|| format!("claim checks of queue {name}: no claim_bucket in [aws] or [queues.<name>.sqs]"))?;
            Arc::new(S3Claims::with_record(account, bucket, name, settings.max_bytes, record.clone()))
        }
    };
    Ok(Arc::new(Recorded::new(inner, record)))
}

/// The claim store of storage queue `name` of `queue`, if it can have one (an Azure account
/// without a blob endpoint cannot: its items too large for a message are refused).
pub(crate) fn store_of_claims(queue: &QueueConfig, store: Option<&EmbeddedStore>, name: &str, records: &ClaimRecords) -> Option<Arc<dyn ClaimStore>> {
    match claim_store(&queue.backend, store, name, &queue.claims, records) {
        Ok(claims) => Some(claims),
        Err(error) => {
            tracing::info!(queue = %name, "no claim checks (items too large for a message are refused): {error:#}");
            None
        }
    }
}

/// The claim store a producer offloads `queue`'s large items into: only for a queue of one
/// storage queue, because a listener follows references into its own partition's store
/// only, and the producer does not know which partition an envelope lands in.
fn producer_claims(queue: &QueueConfig, store: Option<&EmbeddedStore>, records: &ClaimRecords) -> Option<Arc<dyn ClaimStore>> {
    match queue.storage_queues().as_slice() {
        [only] => store_of_claims(queue, store, only.as_str(), records),
        _ => None,
    }
}

/// Whether envelopes go as base64 text on `backend` (an Azure queue with `encoding = "none"`
/// stores text only).
pub(crate) fn text_envelopes(backend: &Backend) -> bool {
    matches!(backend, Backend::Azure { encoding: crate::queue::azure::Encoding::None, .. } | Backend::Sqs { encoding: crate::queue::sqs::Encoding::Text, .. })
}

/// What differs between callers.
#[derive(Debug, Clone, Default)]
pub struct StackOptions {
    /// Count every storage call by kind (the partitions' transactions, for status, metrics
    /// and cost). The poison queue is never metered: it is not the queue's traffic.
    pub metered: bool,
    /// Retry transient errors with this policy; `None`: one try.
    pub retry: Option<RetryPolicy>,
    /// With retries: report whether the storage answers as the queue's readiness (a call
    /// that fails for good makes it not ready, the next answer ready again).
    pub readiness: Option<Readiness>,
}

/// One partition's client, decorated, and its transaction counters when metered.
#[derive(Clone)]
pub struct PartitionClient {
    /// The decorated client.
    pub client: Arc<dyn QueueClient>,
    /// Its counters, when the stack is metered.
    pub transactions: Option<Arc<Transactions>>,
}

/// A queue's assembled clients.
#[derive(Clone)]
pub struct QueueStack {
    /// One per storage queue (the queue itself, or each partition), in partition order.
    pub partitions: Vec<PartitionClient>,
    /// The poison queue, decorated as the partitions are (but never metered).
    pub poison: Arc<dyn QueueClient>,
    /// The logical queue: the only partition, or all of them as one ([`Partitioned`]).
    pub logical: Arc<dyn QueueClient>,
    /// The queue handlers' answers go to (`reply_queue`), decorated as the poison queue and
    /// counted as this queue's calls when the stack is metered.
    pub reply: Option<Arc<dyn QueueClient>>,
}

impl QueueStack {
    /// Assembles `queue`'s stack over the storage queues `open` gives.
    pub fn assemble(queue: &QueueConfig, open: &OpenQueue<'_>, options: &StackOptions) -> Result<QueueStack> {
        let mut stack = QueueStack::assemble_named(&queue.name, &queue.storage_queues(), &queue.poison_queue(), open, options)?;
        if let Some(reply) = &queue.payload.reply_queue {
            let mut client = open(reply)?;
            // Its calls are this queue's (answers put, waits read, sweeps) and billed as much:
            // counted with its first storage queue's, so status, metrics and cost include them.
            if let Some(transactions) = stack.partitions.first().and_then(|p| p.transactions.clone()) {
                client = Arc::new(Metered::sharing(client, transactions));
            }
            stack.reply = Some(match &options.retry {
                Some(policy) => Arc::new(Retrying::new(client, policy.clone())),
                None => client,
            });
        }
        Ok(stack)
    }

    /// Assembles the stack of logical queue `name` over storage queues `storage` and poison
    /// queue `poison` (for callers without a [`QueueConfig`], like the simulator).
    pub fn assemble_named(
        name: &QueueName,
        storage: &[PartitionName],
        poison: &PoisonQueueName,
        open: &OpenQueue<'_>,
        options: &StackOptions,
    ) -> Result<QueueStack> {
        let retrying = |client: Arc<dyn QueueClient>| -> Arc<dyn QueueClient> {
            match (&options.retry, &options.readiness) {
                (Some(policy), Some(readiness)) => Arc::new(Retrying::new(client, policy.clone()).with_readiness(readiness.clone(), name)),
                (Some(policy), None) => Arc::new(Retrying::new(client, policy.clone())),
                (None, _) => client,
            }
        };
        let mut partitions = Vec::new();
        for storage_name in storage {
            let backend = open(storage_name)?;
            let (client, transactions) = if options.metered {
                let metered = Metered::new(backend);
                let transactions = metered.transactions();
                (Arc::new(metered) as Arc<dyn QueueClient>, Some(transactions))
            } else {
                (backend, None)
            };
            partitions.push(PartitionClient { client: retrying(client), transactions });
        }
        let poison = retrying(open(poison)?);
        let logical = match partitions.as_slice() {
            [only] => only.client.clone(),
            all => Arc::new(Partitioned::new(name, all.iter().map(|p| p.client.clone()).collect())),
        };
        Ok(QueueStack { partitions, poison, logical, reply: None })
    }

    /// The producer of `queue` over this stack: its handle's builder, sending through the
    /// logical queue with the queue's payload settings and (a queue of one storage queue) its
    /// claim store, whose calls are counted in `claim_records`. Every producer starts here:
    /// the service adds the listeners, pauses, poison and reply queues and recording; `ebb
    /// send` without a host builds it as it is.
    pub fn producer(&self, queue: &QueueConfig, store: Option<&EmbeddedStore>, claim_records: &ClaimRecords) -> QueueHandleBuilder {
        let builder = QueueHandle::builder(&queue.name, self.logical.clone())
            .payload(queue.payload.clone(), text_envelopes(&queue.backend))
            .claim_records(claim_records.clone());
        match producer_claims(queue, store, claim_records) {
            Some(claims) => builder.claims(claims),
            None => builder,
        }
    }

    /// Creates every partition, the reply queue and the poison queue where missing; not the
    /// poison queue when the queue's service has a dead-letter queue for it (SQS's
    /// RedrivePolicy, read as the partition is created): that queue takes its place.
    pub async fn create_if_missing(&self) -> Result<(), crate::queue::QueueError> {
        for partition in &self.partitions {
            partition.client.create_if_missing().await?;
        }
        if let Some(reply) = &self.reply {
            reply.create_if_missing().await?;
        }
        if self.partitions.iter().all(|partition| partition.client.dead_letter().is_none()) {
            self.poison.create_if_missing().await?;
        }
        Ok(())
    }
}
