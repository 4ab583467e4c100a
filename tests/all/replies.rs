//! Reply queues through the binary on the embedded queue (issue 20, the attack pass's
//! defects): a partitioned queue's replies carry the id its producer got back; each item
//! sent gets an id of its own to wait on, so senders whose items share an envelope never
//! take each other's answers; and `ebb send --wait-reply` outlasts a long poll.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::Value;

const EBB: &str = env!("CARGO_BIN_EXE_ebb-under-test");

use crate::items_binary::Host;

/// A host whose handler answers `re:<body>`, after the number of milliseconds a body
/// `sleep:<ms>` names.
async fn start() -> Result<Host> {
    let app = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let app_addr = app.local_addr()?;
    let router = axum::Router::new().route(
        "/answer",
        axum::routing::post(|body: String| async move {
            if let Some(ms) = body.strip_prefix("sleep:").and_then(|ms| ms.parse().ok()) {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            format!("re:{body}")
        }),
    );
    tokio::spawn(async move { axum::serve(app, router).await });
    let dir = tempfile::tempdir()?;
    let api: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = format!(
        "[api]\nlisten = \"{api}\"\n\n\
         [queues.split]\npartitions = 2\nreply_queue = \"split-answers\"\nhandler = {{ url = \"http://{app_addr}/answer\" }}\n\n\
         [queues.packed]\npack_linger = \"300ms\"\nreply_queue = \"packed-answers\"\nhandler = {{ url = \"http://{app_addr}/answer\" }}\n\n\
         [queues.slow]\nreply_queue = \"slow-answers\"\nhandler = {{ url = \"http://{app_addr}/answer\", timeout = \"60s\" }}\n\n\
         [queues.stage-1]\nreply_queue = \"stage-2\"\nhandler = {{ url = \"http://{app_addr}/answer\" }}\n\n\
         [queues.stage-2]\nhandler = {{ url = \"http://{app_addr}/answer\" }}\n"
    );
    Host::run(dir, api, &config).await
}

/// Attack pass defect 2: on a partitioned queue the reply's correlation id was the
/// partition's own message id (`1`), not the logical id the send answered (`0:1`), so no
/// waiter ever matched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_queues_replies_are_found_by_the_id_the_producer_got() -> Result<()> {
    let host = start().await?;
    // Puts go round robin: two sends land in both partitions.
    for body in ["first", "second"] {
        let out = Command::new(EBB).args(["send", "split", body, "--wait-reply", "--timeout", "20s", "--config"]).arg(host.config()).output()?;
        ensure!(out.status.success(), "ebb send --wait-reply {body}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("re:{body}\n"));
    }
    // Through the API: the id the send answered is the correlation id.
    let http = reqwest::Client::new();
    let sent: Value = serde_json::from_str(&http.post(format!("http://{}/queues/split/messages", host.api)).body("third").send().await?.text().await?)?;
    let id = sent["id"].as_str().unwrap();
    assert!(id.contains(':'), "a partitioned queue's id names its partition: {id}");
    let reply = http.post(format!("http://{}/queues/split/replies/{id}?timeout_ms=20000", host.api)).send().await?;
    assert_eq!(reply.status(), 200);
    let reply: Value = serde_json::from_str(&reply.text().await?)?;
    assert_eq!((reply["correlation_id"].as_str(), reply["body"].as_str()), (Some(id), Some("re:third")));
    Ok(())
}

/// Attack pass defect 4: items of two senders packed into one envelope shared its message
/// id, so a sender waiting by that id could take the other sender's answer. Each item sent
/// now has `{message_id, item}`, and a wait names both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn senders_whose_items_share_an_envelope_each_take_only_their_own_reply() -> Result<()> {
    let host = start().await?;
    let http = reqwest::Client::new();
    let url = format!("http://{}/queues/packed/items", host.api);
    // Two senders within the 300 ms linger: one envelope.
    let (one, two) = tokio::join!(http.post(&url).body(r#"["one", "uno"]"#).send(), http.post(&url).body(r#"["two"]"#).send());
    let one: Value = serde_json::from_str(&one?.text().await?)?;
    let two: Value = serde_json::from_str(&two?.text().await?)?;
    // The existing fields stay.
    assert_eq!((one["items"].as_u64(), two["items"].as_u64()), (Some(2), Some(1)), "{one} {two}");
    assert_eq!(one["messages"], two["messages"], "both senders' items share one envelope: {one} {two}");
    let ids = |answer: &Value| -> Vec<(String, u64)> {
        answer["ids"]
            .as_array()
            .unwrap_or_else(|| panic!("no ids in {answer}"))
            .iter()
            .map(|id| (id["message_id"].as_str().unwrap().to_string(), id["item"].as_u64().unwrap()))
            .collect()
    };
    let (one_ids, two_ids) = (ids(&one), ids(&two));
    assert_eq!((one_ids.len(), two_ids.len()), (2, 1));
    let mut positions: Vec<u64> = one_ids.iter().chain(&two_ids).map(|(_, item)| *item).collect();
    positions.sort_unstable();
    assert_eq!(positions, [0, 1, 2], "each item its own place in the envelope");
    let envelope = &two_ids[0].0;
    // Waiting by the envelope's id alone names no item: no item's answer is handed out.
    let bare = http.post(format!("http://{}/queues/packed/replies/{envelope}?timeout_ms=2000", host.api)).send().await?;
    assert_eq!(bare.status(), 404, "{}", bare.text().await?);
    // Each sender takes exactly its own answers, the second sender first.
    for ((message_id, item), expected) in two_ids.iter().chain(&one_ids).zip(["re:two", "re:one", "re:uno"]) {
        let reply = http.post(format!("http://{}/queues/packed/replies/{message_id}?item={item}&timeout_ms=20000", host.api)).send().await?;
        assert_eq!(reply.status(), 200, "item {item}");
        let reply: Value = serde_json::from_str(&reply.text().await?)?;
        assert_eq!(
            (reply["correlation_id"].as_str(), reply["item"].as_u64(), reply["body"].as_str()),
            (Some(message_id.as_str()), Some(*item), Some(expected))
        );
    }
    // A bad item number is named.
    let bad = http.post(format!("http://{}/queues/packed/replies/{envelope}?item=-1", host.api)).send().await?;
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await?.contains("item"));
    Ok(())
}

/// Attack pass defect 3: every CLI request had a fixed 30 s client timeout, and the long
/// poll for a reply asks the host to wait up to 30 s: `ebb send --wait-reply --timeout 5m`
/// died at the first poll that found nothing. The handler here answers after 35 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebb_send_wait_reply_waits_past_one_long_poll() -> Result<()> {
    let host = start().await?;
    let out = Command::new(EBB).args(["send", "slow", "sleep:35000", "--wait-reply", "--timeout", "90s", "--config"]).arg(host.config()).output()?;
    ensure!(out.status.success(), "ebb send --wait-reply: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "re:sleep:35000\n");
    Ok(())
}

/// `ebb send --items FILE --wait-reply` waits for each item's own answer (by its envelope's
/// id and its index) and prints the replies in the order of the items.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebb_send_items_wait_reply_prints_each_items_answer_in_order() -> Result<()> {
    let host = start().await?;
    let file = host.dir.path().join("asks.ndjson");
    std::fs::write(&file, "\"alpha\"\n\"beta\"\n{\"n\": 3}\n")?;
    let out =
        Command::new(EBB).args(["send", "packed", "--items"]).arg(&file).args(["--wait-reply", "--timeout", "20s", "--config"]).arg(host.config()).output()?;
    ensure!(out.status.success(), "ebb send --items --wait-reply: {}", String::from_utf8_lossy(&out.stderr));
    let replies: Vec<Value> = String::from_utf8(out.stdout)?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let answers: Vec<&str> = replies.iter().map(|r| r["body"].as_str().unwrap_or_default()).collect();
    assert_eq!(answers, ["re:alpha", "re:beta", "re:{\"n\": 3}"]);
    assert!(replies.iter().all(|r| r["item"].is_u64() && r["correlation_id"].is_string()), "{replies:?}");
    Ok(())
}

/// Attack pass defect 10: a reply_queue that another configured queue handles (a pipeline)
/// was waited on like any other, though that queue's listener takes the answers first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_answers_another_queue_handles_is_refused_saying_so_and_nothing_is_sent() -> Result<()> {
    let host = start().await?;
    let out = Command::new(EBB).args(["send", "stage-1", "hello", "--wait-reply", "--timeout", "5s", "--config"]).arg(host.config()).output()?;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("which queue stage-2 handles") && stderr.contains("nothing was sent"), "{stderr}");
    // A timeout no reply could meet, or too long, is refused before sending too (attack,
    // session 13: `--timeout 0s` sent, then failed).
    for timeout in ["0s", "1ms", "999ms", "2h"] {
        let out = Command::new(EBB).args(["send", "slow", "hello", "--wait-reply", "--timeout", timeout, "--config"]).arg(host.config()).output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.code() == Some(1) && stderr.contains("--timeout: 1s to 1h") && stderr.contains("nothing was sent"), "{timeout}: {stderr}");
    }
    let http = reqwest::Client::new();
    let status: Value = serde_json::from_str(&http.get(format!("http://{}/status", host.api)).send().await?.text().await?)?;
    let stage_1 = status["queues"].as_array().unwrap().iter().find(|q| q["queue"] == "stage-1").unwrap().clone();
    assert_eq!(stage_1["processed"], 0, "nothing was sent: {stage_1}");
    let slow = status["queues"].as_array().unwrap().iter().find(|q| q["queue"] == "slow").unwrap().clone();
    assert_eq!(slow["processed"], 0, "nothing was sent: {slow}");
    let wait = http.post(format!("http://{}/queues/stage-1/replies/1?timeout_ms=100", host.api)).send().await?;
    assert_eq!(wait.status(), 409);
    let text = wait.text().await?;
    assert!(text.contains("which queue stage-2 handles"), "{text}");
    Ok(())
}

/// Attack (session 13): the reply queue's calls (answers put, the reader's gets and deletes)
/// were counted nowhere, so status, metrics and the cost estimate left them out. They count
/// as the queue's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_reply_calls_count_as_its_storage_transactions() -> Result<()> {
    let host = start().await?;
    let http = reqwest::Client::new();
    let metric = |text: &str, kind: &str| -> u64 {
        let series = format!("ebb_storage_transactions_total{{queue=\"slow\",logical_queue=\"slow\",kind=\"{kind}\"}} ");
        text.lines().find_map(|line| line.strip_prefix(series.as_str())).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
    };
    for body in ["one", "two", "three"] {
        let sent: Value = serde_json::from_str(&http.post(format!("http://{}/queues/slow/messages", host.api)).body(body).send().await?.text().await?)?;
        let id = sent["id"].as_str().unwrap();
        let reply = http.post(format!("http://{}/queues/slow/replies/{id}?timeout_ms=20000", host.api)).send().await?;
        assert_eq!(reply.status(), 200);
    }
    let metrics = http.get(format!("http://{}/metrics", host.api)).send().await?.text().await?;
    assert_eq!(metric(&metrics, "put"), 6, "three requests and their three answers: {metrics}");
    assert_eq!(metric(&metrics, "delete"), 6, "three requests handled and three answers taken");
    assert!(metric(&metrics, "get") >= 6, "each request and each answer was read: {metrics}");
    Ok(())
}

/// Issue 40, leftover of item 7: `/metrics` and `/status` showed the storage calls of the
/// queue and of its poison queue, but not of its reply queue, whose answers are put, read
/// and deleted there and whose failures went unseen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_queues_storage_calls_are_shown_beside_the_queues_and_its_poison_queues() -> Result<()> {
    let host = start().await?;
    let http = reqwest::Client::new();
    let sent: Value = serde_json::from_str(&http.post(format!("http://{}/queues/slow/messages", host.api)).body("one").send().await?.text().await?)?;
    let id = sent["id"].as_str().unwrap();
    let reply = http.post(format!("http://{}/queues/slow/replies/{id}?timeout_ms=20000", host.api)).send().await?;
    assert_eq!(reply.status(), 200);
    let metrics = http.get(format!("http://{}/metrics", host.api)).send().await?.text().await?;
    for queue in ["slow", "slow-poison", "slow-answers"] {
        let series = format!("ebb_storage_failures_total{{queue=\"{queue}\",kind=\"put\",class=\"connection\"}} 0");
        assert!(metrics.lines().any(|line| line == series), "{series} in:\n{metrics}");
    }
    // The reply queue answered the answer's put and the waiter's reads.
    assert!(metrics.lines().any(|line| line.starts_with("ebb_storage_last_success_age_seconds{queue=\"slow-answers\"}")), "{metrics}");
    let status: Value = serde_json::from_str(&http.get(format!("http://{}/status", host.api)).send().await?.text().await?)?;
    let storage: Vec<&str> = status["storage"].as_array().unwrap().iter().filter_map(|s| s["queue"].as_str()).collect();
    assert!(storage.contains(&"slow-answers"), "{storage:?}");
    // A reply queue that another configured queue handles (a pipeline) is one entry, not two.
    assert_eq!(storage.iter().filter(|q| **q == "stage-2").count(), 1, "{storage:?}");
    Ok(())
}
