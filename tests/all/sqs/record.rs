//! Issue 37 item 8: recordings and replay on SQS (moto), through the binary: the Azure
//! test's body (tests/all/replay.rs) with the queue on SQS, simulated and priced as SQS.

use std::time::Duration;

use ebb::queue::QueueClient;
use ebb::queue::sqs::{SqsOptions, SqsQueue};
use ebb_tests::moto::Moto;

use super::hosts::on_moto;
use crate::binary::{App, signal, wait_until};
use crate::replay::{Leeway, QUEUE, Site, TOKEN, a_ten_minute_trace_replayed_bills_what_the_simulator_says};

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

/// The ten-minute trace (a burst of 300 as 30 arrivals of 10, 100 ms apart; a trickle of
/// one a second; silence) through the binary on moto and through `ebb simulate` as SQS.
///
/// Every kind within 10 %, but the burst's empty receives, which may be fewer on moto than
/// simulated, not more, and after the burst 3 calls apart for empty receives (the trickle
/// replayed late on a loaded machine; real 16 and 19 in two runs, simulated 16) and counts
/// (the scaler counts while moto's backlog lasts, and reading the status after the burst
/// costs one: 6 against 3). Each burst arrival fills a receive of 10; the listener's next
/// receive is empty when it answers before the next arrival, as on SQS, whose requests take
/// about the model's 10 ms (`simulate::backend::REQUEST_TIME`), but finds a backlog on moto:
/// its receive copies each message and reads the queue's attributes once per message
/// returned, so it slows with the queue's depth (measured inside moto during a replayed
/// burst on 2026-11-29, 2 cores at load 11: receives of 10 took 0.2 to 1.5 s, against 21 ms
/// for one from a queue of 10), the queue held a backlog through the burst and nearly every
/// receive was full. Real against simulated, that day, before: empty receives 21 against
/// 45 (5 against 29 in the burst), with messages 296 against 288, delete batches 74 against
/// 74; after (a woken receive answers at once in the model): empty 23 against 46 (4 against
/// 30), with messages 292 against 292, delete batches 74 against 74, puts 563 against 563.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "moto is not SQS (docs/guides/sqs.md): under load two of three runs had a message handled twice (moto's concurrent receives can both return one message) and one 8 counts against 3 (the scaler counts while moto's slow backlog lasts); receives, empty receives and deletes agreed in all"]
async fn a_ten_minute_trace_replayed_into_the_binary_on_sqs_is_recorded_and_bills_what_the_simulator_says() -> anyhow::Result<()> {
    // The replay's queue is named `replayed`, as no other test's on the shared moto.
    let sqs = on_moto(Moto::shared());
    a_ten_minute_trace_replayed_bills_what_the_simulator_says(
        &[("sqs", Some(&sqs), "sqs")],
        &Leeway { burst_empty_gets_fewer: true, calls: vec![("gets_empty", 3), ("counts", 3)] },
    )
    .await;
    Ok(())
}
