//! Issue 10, push across hosts: the bus over a real Redis (Debian's `redis-server`, started
//! by the test). Every host subscribed to a queue's channel hears a trigger, whoever
//! publishes it; anything else on the channel is ignored and counted; an outage tells the
//! listeners push is unavailable, and the bus comes back by itself.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ebb::bus::redis::RedisPubSub;
use ebb::bus::{Bus, PubSub, Trigger};
use ebb_tests::redis::RedisServer;

struct Host {
    bus: Bus,
    delivered: Arc<Mutex<Vec<Trigger>>>,
    availability: Arc<Mutex<Vec<bool>>>,
}

fn host(url: &str) -> Host {
    let delivered = Arc::new(Mutex::new(Vec::new()));
    let availability = Arc::new(Mutex::new(Vec::new()));
    let (d, a) = (delivered.clone(), availability.clone());
    let engine: Arc<dyn PubSub> = Arc::new(RedisPubSub::new(url).unwrap());
    let bus = Bus::start(
        engine,
        "ebb:queue:",
        vec!["orders".into(), "invoices".into()],
        Arc::new(move |t: &Trigger| d.lock().unwrap().push(t.clone())),
        Arc::new(move |up| a.lock().unwrap().push(up)),
    );
    Host { bus, delivered, availability }
}

async fn wait_for(what: &str, limit: Duration, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_reach_every_host_and_an_outage_falls_back_to_polling_then_recovers() {
    let mut redis = RedisServer::start();
    let hosts = [host(&redis.url()), host(&redis.url())];
    wait_for("both hosts subscribed", Duration::from_secs(10), || hosts.iter().all(|h| h.bus.status().connected)).await;
    assert!(hosts.iter().all(|h| *h.availability.lock().unwrap() == [true]));

    // A host publishes (as the API does after a send): every other host hears it (see
    // a_hosts_own_trigger_is_not_delivered_back_to_it for the publisher itself).
    hosts[0].bus.publish("orders", Some(2), Duration::from_secs(3));
    wait_for("the trigger on the other host", Duration::from_secs(5), || hosts[1].delivered.lock().unwrap().len() == 1).await;
    assert_eq!(hosts[1].delivered.lock().unwrap()[0], Trigger { queue: "orders".into(), count: Some(2), delay_ms: Some(3000) });
    assert_eq!(hosts[0].bus.status().published, 1);
    wait_for("the echo heard back", Duration::from_secs(5), || hosts[0].bus.status().echoes == 1).await;

    // Any app may publish the documented JSON on the queue's channel.
    let app = RedisPubSub::new(&redis.url()).unwrap();
    app.publish("ebb:queue:invoices", br#"{"queue": "invoices"}"#).await.unwrap();
    wait_for("the app's trigger", Duration::from_secs(5), || hosts.iter().zip([1, 2]).all(|(h, n)| h.delivered.lock().unwrap().len() == n)).await;
    // Anything else on a channel is ignored and counted, never delivered.
    for junk in [&b"wake up"[..], br#"{"queue": "orders"}"#, &vec![b'{'; 10_000]] {
        app.publish("ebb:queue:invoices", junk).await.unwrap();
    }
    wait_for("the junk counted", Duration::from_secs(5), || hosts.iter().all(|h| h.bus.status().ignored == 3)).await;
    assert!(hosts.iter().zip([1, 2]).all(|(h, n)| h.delivered.lock().unwrap().len() == n));

    // An outage: the listeners are told push is unavailable (so they poll).
    redis.stop();
    wait_for("the outage noticed", Duration::from_secs(10), || hosts.iter().all(|h| h.availability.lock().unwrap().last() == Some(&false))).await;
    assert!(hosts.iter().all(|h| !h.bus.status().connected && h.bus.status().outages == 1));
    // Publishing during the outage never waits; the failure is counted.
    let started = Instant::now();
    for _ in 0..100 {
        hosts[0].bus.publish("orders", None, Duration::ZERO);
    }
    assert!(started.elapsed() < Duration::from_secs(1), "publish waited on a dead bus: {:?}", started.elapsed());
    wait_for("publish failures counted", Duration::from_secs(10), || hosts[0].bus.status().publish_failures >= 1).await;

    // Back by itself.
    redis.resume();
    wait_for("both hosts subscribed again", Duration::from_secs(30), || hosts.iter().all(|h| h.bus.status().connected)).await;
    assert!(hosts.iter().all(|h| h.availability.lock().unwrap().last() == Some(&true)));
    let before: Vec<usize> = hosts.iter().map(|h| h.delivered.lock().unwrap().len()).collect();
    app.publish("ebb:queue:orders", br#"{"queue": "orders", "count": 1}"#).await.unwrap();
    wait_for("a trigger after the outage", Duration::from_secs(5), || hosts.iter().zip(&before).all(|(h, n)| h.delivered.lock().unwrap().len() > *n)).await;
}

/// Sqsburst's review: a host that sent `n` messages told its listeners `n` arrived, and then
/// heard its own trigger back over the bus and told them again: 4 messages sent one by one
/// made 8 announced, a batch, got at once without the pickup delay. The engine echoes a
/// publish to its publisher; the bus does not deliver it (counted as an echo), while an
/// equal trigger from another host is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosts_own_trigger_is_not_delivered_back_to_it() {
    let redis = RedisServer::start();
    let hosts = [host(&redis.url()), host(&redis.url())];
    wait_for("both hosts subscribed", Duration::from_secs(10), || hosts.iter().all(|h| h.bus.status().connected)).await;
    for _ in 0..4 {
        hosts[0].bus.publish("orders", Some(1), Duration::ZERO);
    }
    wait_for("the other host hears all four", Duration::from_secs(5), || hosts[1].delivered.lock().unwrap().len() == 4).await;
    let heard_back = || hosts[0].bus.status().echoes as usize + hosts[0].delivered.lock().unwrap().len();
    wait_for("the publisher hears its four back", Duration::from_secs(5), || heard_back() == 4).await;
    assert_eq!(hosts[0].delivered.lock().unwrap().len(), 0, "the publisher's own triggers were delivered back to it");
    // The other host's equal trigger is not an echo for the first.
    hosts[1].bus.publish("orders", Some(1), Duration::ZERO);
    wait_for("the first host hears the other's", Duration::from_secs(5), || hosts[0].delivered.lock().unwrap().len() == 1).await;
    assert_eq!(hosts[0].bus.status().received, 1);
}

/// Review (session 4): a stalled Redis (SIGSTOP; or a route that drops packets silently)
/// never ended the subscription, so the bus said "connected" for ever while push queues
/// idled at zero tasks and nothing found new messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_is_an_outage_within_seconds() {
    let redis = RedisServer::start();
    let h = host(&redis.url());
    wait_for("subscribed", Duration::from_secs(10), || h.bus.status().connected).await;
    redis.freeze();
    wait_for("the stall seen as an outage", Duration::from_secs(15), || !h.bus.status().connected).await;
    assert_eq!(h.availability.lock().unwrap().last(), Some(&false), "the listeners are told to poll");
    redis.thaw();
    wait_for("subscribed again", Duration::from_secs(30), || h.bus.status().connected).await;
}

#[tokio::test]
async fn a_bus_that_never_connects_keeps_the_listeners_polling_and_logs_once() {
    let capture = ebb_tests::LogCapture::default();
    let _guard = capture.start(tracing::Level::WARN);
    let url = format!("redis://127.0.0.1:{}/", ebb_tests::azurite::free_port());
    let h = host(&url);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(*h.availability.lock().unwrap(), [false], "told once that push is unavailable");
    assert!(!h.bus.status().connected);
    let text = capture.text();
    assert_eq!(text.matches("cannot subscribe to push notifications").count(), 1, "one line per outage, not per attempt:\n{text}");
}

/// Issue 35 item 7: a push queue's listener was told "push unavailable until the bus is
/// subscribed" as it was built, which started a polling task there and then: its first get
/// came before the queue was created ("queue work does not exist", a WARN and a counted
/// storage error at every start).
#[tokio::test]
async fn a_push_queue_with_a_bus_creates_its_queue_before_its_first_get() -> anyhow::Result<()> {
    let capture = ebb_tests::LogCapture::default();
    let _guard = capture.start(tracing::Level::WARN);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir()?;
    let text = format!(
        "[api]\nlisten = \"127.0.0.1:0\"\n[bus]\nredis_url = \"{}\"\n\
         [queues.work]\npush = true\nmin_tasks = 0\nhandler = {{ url = \"http://127.0.0.1:9/work\" }}\n",
        redis.url()
    );
    let config = ebb::Config::parse(&text, dir.path(), None)?;
    let host = ebb::Host::start(&config, ebb::Role::Worker).await?;
    // A first task ran and ended (a safety poll's probe, or the polling floor's until the
    // bus was subscribed): its get was made.
    let polled = |host: &ebb::Host| host.status().iter().all(|s| s.peak_tasks >= 1 && s.active_tasks == 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !polled(&host) {
        assert!(Instant::now() < deadline, "no start-up poll ended: {:?}", host.status());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let errors: u64 = host.status().iter().map(|s| s.storage_errors).sum();
    let text = capture.text();
    assert_eq!(errors, 0, "storage errors at start:\n{text}");
    assert!(!text.contains("does not exist"), "{text}");
    host.shutdown().await;
    Ok(())
}
