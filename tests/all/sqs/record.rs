//! Issue 37 item 8: recordings and replay on SQS (moto), through the binary: the Azure
//! test's body (tests/all/replay.rs) with the queue on SQS, simulated and priced as SQS.
//!
//! Ignored until the simulator's SQS model and the binary on moto agree: in the first run
//! (2026-11-29, debug build, 2 cores) every message was handled and recorded once, the
//! simulation modelled `sqs` at the host's price, and puts, receives with messages, counts and
//! creates agreed, but the binary made 329 delete batches against 416 simulated and 30 empty
//! receives against 43. Likely: moto on a loaded machine answers slower than the model's 10 ms
//! per request (`simulate::backend::REQUEST_TIME`), so more deletes settle while a batch is in
//! flight and join the next; the empty receives are not explained yet.

use std::time::Duration;

use ebb::queue::QueueClient;
use ebb::queue::sqs::{SqsOptions, SqsQueue};
use ebb_tests::moto::Moto;

use super::hosts::on_moto;
use crate::binary::{App, signal, wait_until};
use crate::replay::{QUEUE, Site, TOKEN, a_ten_minute_trace_replayed_bills_what_the_simulator_says};

/// As `rollout::trace_export_gives_each_arrival_once_while_the_host_runs_and_after` on the
/// embedded queue: a message sent around the host (straight to SQS) is recorded at its first
/// receive, one sent through the API when put and not again when received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sqs_hosts_recording_exports_each_arrival_once() -> anyhow::Result<()> {
    // A moto of its own: the queue is named QUEUE, as the host's config says.
    let moto = Moto::start();
    let direct = SqsQueue::new(&moto.account(), QUEUE, SqsOptions::default())?;
    direct.create_if_missing().await?;
    for i in 0..5 {
        direct.put(format!("around-{i}").as_bytes(), Duration::ZERO).await?;
    }
    let (app, app_addr) = App::start(Duration::from_millis(1)).await;
    let site = Site::new(app_addr, Some(&on_moto(&moto)));
    let host = site.start_host().await;
    let http = reqwest::Client::new();
    for i in 0..20 {
        let answer = http.post(format!("http://{}/queues/{QUEUE}/messages", site.api)).bearer_auth(TOKEN).body(format!("api-{i}")).send().await?;
        assert_eq!(answer.status(), reqwest::StatusCode::CREATED);
    }
    wait_until("every message handled", || async { app.seen.lock().unwrap().len() >= 25 }).await;
    signal(&host, "-TERM");
    let mut host = host;
    assert!(tokio::task::spawn_blocking(move || host.wait()).await??.success());
    assert_eq!(app.seen.lock().unwrap().len(), 25, "each message handled once");
    assert_eq!(site.exported_arrivals(), 25, "each arrival recorded once");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the simulator's SQS model bills 26 % more deletes and 43 % more empty receives than the binary on moto (see the module's doc)"]
async fn a_ten_minute_trace_replayed_into_the_binary_on_sqs_is_recorded_and_bills_what_the_simulator_says() -> anyhow::Result<()> {
    // The replay's queue is named `replayed`, as no other test's on the shared moto.
    let sqs = on_moto(Moto::shared());
    a_ten_minute_trace_replayed_bills_what_the_simulator_says(&[("sqs", Some(&sqs), "sqs")]).await;
    Ok(())
}
