//! Issue 37 item 8: what works on Azure works on SQS (moto), through the binary: hosts
//! competing for one queue with kill -9 of one of them, a pause across a restart, push
//! across hosts over Redis (an idle host woken, polling through an outage), the KEDA
//! scaler counting an SQS queue, the console's poison list and requeue on an SQS queue
//! (headless Chromium), a shadow rule in `/status` and `ebb rule promote`. Each runs the
//! Azure (or embedded) test's own body with the queue on SQS.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebb::queue::QueueClient;
use ebb::queue::sqs::{SqsOptions, SqsQueue};
use ebb_tests::azurite::unique_queue_name;
use ebb_tests::fault_proxy::FaultProxy;
use ebb_tests::moto::{Moto, REGION};

use crate::azure_hosts::{QUEUE, Storage, two_hosts_share_a_queue_and_a_killed_one_loses_nothing};
use crate::binary::{App, Site, aws_table, pause_holds_across_a_restart_until_resumed, push_across_hosts};
use crate::scaler::scaler_counts_work_sent_around_it;

/// The storage of a host on `moto`: `[aws]` with its region and endpoint, and moto's test
/// keys in the SDK's own environment variables.
pub(crate) fn on_moto(moto: &Moto) -> Storage {
    let env = vec![("AWS_ACCESS_KEY_ID", "testing".to_string()), ("AWS_SECRET_ACCESS_KEY", "testing".to_string())];
    Storage { backend: "sqs", table: aws_table(moto), env }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hosts_on_one_sqs_queue_share_it_without_overlap_and_a_killed_host_loses_nothing() -> anyhow::Result<()> {
    // A moto of its own: the queue is named QUEUE, as the hosts' config says.
    let moto = Moto::start();
    let queue: Arc<dyn QueueClient> = Arc::new(SqsQueue::new(&moto.account(), QUEUE, SqsOptions::default())?);
    queue.create_if_missing().await?;
    // The hosts reach moto through the proxy (with no faults), which notes what each receive
    // was given. moto's ReceiveMessage takes no lock: two receives that run at once may both
    // take one visible message (a boto3 script, 6 receivers draining 500 messages leased for
    // 60 s: 4 received twice). That overlap is moto's (SQS standard queues deliver at least
    // once too), not a lease's: sqsburst's failures under load, "skipping the duplicate
    // lease" with no renewal made, all gets short polls, 3 receives in flight at most.
    let proxy = FaultProxy::start(moto.port(), 0.0, 1).await;
    let storage = Storage { table: format!("[aws]\nregion = \"{REGION}\"\nendpoint = \"http://127.0.0.1:{}\"\n", proxy.port()), ..on_moto(&moto) };
    // A 10 s lease: moto, one Python process, answered renewals after more than 2.5 s when
    // the whole suite ran on two cores, so a 5 s lease lapsed under running handlers.
    let lease = Duration::from_secs(10);
    let handed_twice = || received_twice_within(&proxy.sqs_received(), lease / 2);
    two_hosts_share_a_queue_and_a_killed_one_loses_nothing(queue, &storage, None, lease, &handed_twice).await;
    Ok(())
}

/// The ids of messages that two receives were given less than `within` apart: sooner than
/// any lease of the hosts could lapse, so the storage handed them out twice at once.
fn received_twice_within(received: &[(Instant, Vec<String>)], within: Duration) -> BTreeSet<String> {
    let mut last: BTreeMap<&str, Instant> = BTreeMap::new();
    let mut twice = BTreeSet::new();
    for (at, ids) in received {
        for id in ids {
            if last.insert(id, *at).is_some_and(|before| at.duration_since(before) < within) {
                twice.insert(id.clone());
            }
        }
    }
    twice
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sqs_queue_holds_its_messages_across_a_restart_until_resumed() -> anyhow::Result<()> {
    let moto = Moto::start();
    let (app, app_addr) = App::start(Duration::from_millis(1)).await;
    pause_holds_across_a_restart_until_resumed(&Site::on_sqs(app_addr, "30s", &moto), &app).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_across_hosts_wakes_an_idle_sqs_host_and_it_polls_through_a_bus_outage() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let queue = unique_queue_name("pushed");
    let (app, app_addr) = App::start(Duration::ZERO).await;
    let direct = SqsQueue::new(&moto.account(), &queue, SqsOptions::default())?;
    direct.create_if_missing().await?;
    let site = Site::new(app_addr, "30s").with_moto_keys();
    push_across_hosts(&site, &app, &queue, ("sqs", &aws_table(moto)), &direct).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebb_scaler_counts_sqs_queues_to_find_work_sent_around_it() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let queue = unique_queue_name("scaler");
    let (app, app_addr) = App::start(Duration::from_millis(1)).await;
    let site = crate::scaler::Site::with_poll_interval(app_addr, "100ms").on(&queue, ("sqs", &aws_table(moto)), on_moto(moto).env);
    let partition = SqsQueue::new(&moto.account(), &ebb::names::QueueName::new(&queue)?.partition(1), SqsOptions::default())?;
    // The built-in rule at 101 queued, a batch of 10 on SQS: ceil(ceil(101 / 10) / 4).
    scaler_counts_work_sent_around_it(&site, &app, &queue, &partition, 3).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_an_sqs_queues_hostile_poison_body_as_text_and_requeues_from_the_page() -> anyhow::Result<()> {
    // A moto of its own: the console test's queue is named orders.
    let moto = Moto::start();
    let storage = on_moto(&moto);
    let env: Vec<(&str, String)> = storage.env.clone();
    crate::console::hostile_poison_as_text_and_requeue_from_the_page(("backend = \"sqs\"\n", &storage.table), &env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_rule_on_an_sqs_queue_shows_in_status_and_metrics_and_promote_makes_it_live() -> anyhow::Result<()> {
    // A moto of its own: the shadow test's queues are named orders and plain.
    let moto = Moto::start();
    let storage = on_moto(&moto);
    crate::shadow::shadow_shows_and_promote_makes_it_live(("backend = \"sqs\"\n", &storage.table), &storage.env).await
}
