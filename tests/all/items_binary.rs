//! Issue 20 through the binary on the embedded queue: items posted to
//! `POST /queues/{name}/items` (a JSON array, NDJSON) and sent by `ebb send --items` are
//! packed within `pack_linger`, each reaches the HTTP handler with its item headers, and
//! `delivery = "batch"` posts JSON arrays whose answer names the failed items; answers reach
//! the reply queue (`ebb send --wait-reply`, and on Azurite read by the Python SDK).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, bail, ensure};
use axum::http::HeaderMap;
use serde_json::{Value, json};
use tokio::time::Instant;

const EBB: &str = env!("CARGO_BIN_EXE_ebb-under-test");

/// What the app saw: each call's body and item headers.
#[derive(Default)]
struct Seen {
    items: Mutex<Vec<(String, Option<String>)>>,
    batches: Mutex<Vec<Value>>,
}

/// `ebb run` in a folder of its own, killed when dropped.
pub(crate) struct Host {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) api: SocketAddr,
    child: Child,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start(seen: Arc<Seen>) -> Result<Host> {
    let app = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let app_addr = app.local_addr()?;
    let (items, batches) = (seen.clone(), seen);
    let router = axum::Router::new()
        .route(
            "/work",
            axum::routing::post(move |headers: HeaderMap, body: String| async move {
                let index = headers.get("ebb-item-index").map(|v| v.to_str().unwrap().to_string());
                items.items.lock().unwrap().push((body, index));
                "ok"
            }),
        )
        .route(
            "/batch",
            axum::routing::post(move |body: String| async move {
                let array: Value = serde_json::from_str(&body).unwrap();
                let failed: Vec<usize> = array.as_array().unwrap().iter().enumerate().filter(|(_, v)| v.get("fail").is_some()).map(|(i, _)| i).collect();
                batches.batches.lock().unwrap().push(array);
                axum::Json(json!({ "failed": failed }))
            }),
        )
        .route("/answer", axum::routing::post(|body: String| async move { format!("re:{body}") }));
    tokio::spawn(async move { axum::serve(app, router).await });
    let dir = tempfile::tempdir()?;
    let api: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = format!(
        "[api]\nlisten = \"{api}\"\n\n[queues.orders]\npack_linger = \"300ms\"\nhandler = {{ url = \"http://{app_addr}/work\" }}\n\n\
         [queues.batched]\ndelivery = \"batch\"\nmax_batch_items = 4\nmax_dequeue_count = 2\nvisibility_timeout = \"100ms\"\nmin_polling_interval = \"100ms\"\n\
         handler = {{ url = \"http://{app_addr}/batch\" }}\n\n\
         [queues.asks]\nreply_queue = \"answers\"\nhandler = {{ url = \"http://{app_addr}/answer\" }}\n"
    );
    Host::run(dir, api, &config).await
}

impl Host {
    /// Its configuration file.
    pub(crate) fn config(&self) -> std::path::PathBuf {
        self.dir.path().join("ebb.toml")
    }

    /// Writes `config` (the API at `api`) into `dir`, starts `ebb run` on it (its log in
    /// `dir/host.log`) and waits until it is ready.
    pub(crate) async fn run(dir: tempfile::TempDir, api: SocketAddr, config: &str) -> Result<Host> {
        std::fs::write(dir.path().join("ebb.toml"), config)?;
        let log = std::fs::File::create(dir.path().join("host.log"))?;
        let child = Command::new(EBB)
            .arg("run")
            .arg("--config")
            .arg(dir.path().join("ebb.toml"))
            .env_remove("EBB_API_TOKEN")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        let host = Host { dir, api, child };
        let deadline = Instant::now() + Duration::from_secs(60);
        while reqwest::get(format!("http://{api}/readyz")).await.map(|r| r.status().as_u16()).ok() != Some(200) {
            ensure!(Instant::now() < deadline, "the host did not come up: {}", std::fs::read_to_string(host.dir.path().join("host.log"))?);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(host)
    }
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_sent_separately_through_the_api_share_envelopes_and_each_reaches_the_handler() -> Result<()> {
    let seen = Arc::new(Seen::default());
    let host = start(seen.clone()).await?;
    let http = reqwest::Client::new();
    let url = format!("http://{}/queues/orders/items", host.api);
    // 16 producers, one item each, at once: within one linger.
    let sends = (0..16).map(|i| {
        let (http, url) = (http.clone(), url.clone());
        async move { Ok::<Value, anyhow::Error>(serde_json::from_str(&http.post(&url).body(format!("[{{\"n\": {i}}}]")).send().await?.text().await?)?) }
    });
    let answers: Vec<Value> = futures::future::try_join_all(sends).await?;
    let mut messages: Vec<String> = answers.iter().flat_map(|a| a["messages"].as_array().unwrap().iter().map(|m| m.as_str().unwrap().to_string())).collect();
    assert!(answers.iter().all(|a| a["items"] == 1), "{answers:?}");
    messages.sort();
    messages.dedup();
    assert!(messages.len() <= 2, "16 items sent within the linger landed in {} messages", messages.len());
    // NDJSON: strings are their text, other values as written.
    let ndjson = http.post(&url).header("content-type", "application/x-ndjson").body("\"plain text\"\n{\"a\":  1}\n\n[2]\n").send().await?;
    assert_eq!(ndjson.status(), 201);
    // The CLI, from a file.
    let file = host.dir.path().join("items.ndjson");
    std::fs::write(&file, (0..100).map(|i| format!("{{\"cli\": {i}}}\n")).collect::<String>())?;
    let out = Command::new(EBB).args(["send", "orders", "--items"]).arg(&file).arg("--config").arg(host.dir.path().join("ebb.toml")).output()?;
    ensure!(out.status.success(), "ebb send --items: {}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.starts_with("sent 100 items in 1 message to orders via"), "{printed}");
    wait_for("119 items handled", || seen.items.lock().unwrap().len() >= 119).await?;
    let items = seen.items.lock().unwrap().clone();
    assert_eq!(items.len(), 119, "each item once");
    for i in 0..16 {
        assert!(items.iter().any(|(body, index)| body == &format!("{{\"n\": {i}}}") && index.is_some()), "item {i} missing");
    }
    for body in ["plain text", "{\"a\":  1}", "[2]"] {
        assert!(items.iter().any(|(b, _)| b == body), "{body} missing: {items:?}");
    }
    assert_eq!(items.iter().filter(|(b, _)| b.starts_with("{\"cli\"")).count(), 100);
    // Bad input names the reason.
    for (body, status, reason) in [("[]", 400, "no items"), ("{\"a\":1}", 400, "not a JSON array of items"), ("[1,", 400, "not a JSON array")] {
        let answer = http.post(&url).body(body).send().await?;
        assert_eq!(answer.status().as_u16(), status, "{body}");
        assert!(answer.text().await?.contains(reason), "{body}");
    }
    let status: Value = serde_json::from_str(&http.get(format!("http://{}/status", host.api)).send().await?.text().await?)?;
    let orders = status["queues"].as_array().unwrap().iter().find(|q| q["queue"] == "orders").cloned().unwrap_or_default();
    assert_eq!(orders["items_delivered"], 119, "{orders}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_delivery_posts_json_arrays_and_retries_only_the_items_the_answer_names() -> Result<()> {
    let seen = Arc::new(Seen::default());
    let host = start(seen.clone()).await?;
    let http = reqwest::Client::new();
    let url = format!("http://{}/queues/batched/items", host.api);
    let answer = http.post(&url).body(r#"[{"id":1}, {"id":2, "fail": true}, "three", {"id":4}, {"id":5}]"#).send().await?;
    assert_eq!(answer.status(), 201);
    wait_for("the failed item tried twice", || seen.batches.lock().unwrap().len() >= 3).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let batches = seen.batches.lock().unwrap().clone();
    // 5 items, at most 4 per call; the failing one again alone, then poisoned (2 tries).
    // The first two calls go side by side, in either order.
    let mut first_two = batches[..2].to_vec();
    first_two.sort_by_key(|b| std::cmp::Reverse(b.as_array().unwrap().len()));
    assert_eq!(first_two, [json!([{"id":1}, {"id":2, "fail": true}, "three", {"id":4}]), json!([{"id":5}])]);
    assert_eq!(batches[2..], [json!([{"id":2, "fail": true}])]);
    let poison: Value = serde_json::from_str(&http.get(format!("http://{}/queues/batched/poison", host.api)).send().await?.text().await?)?;
    let poisoned = poison["messages"].as_array().unwrap();
    assert_eq!(poisoned.len(), 1, "only the failing item: {poison}");
    assert_eq!(poisoned[0]["preview"], r#"{"id":2, "fail": true}"#);
    let reason = poisoned[0]["reason"].as_str().unwrap();
    assert!(reason.contains("answered that item 0 of the batch failed") && reason.ends_with("2 failed deliveries)"), "{reason}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebb_send_wait_reply_prints_the_answer_to_its_own_message_and_leaves_the_others() -> Result<()> {
    let host = start(Arc::default()).await?;
    let http = reqwest::Client::new();
    // Someone else's question, answered first.
    let other: Value = serde_json::from_str(&http.post(format!("http://{}/queues/asks/messages", host.api)).body("other").send().await?.text().await?)?;
    let out =
        Command::new(EBB).args(["send", "asks", "hello", "--wait-reply", "--timeout", "20s", "--config"]).arg(host.dir.path().join("ebb.toml")).output()?;
    ensure!(out.status.success(), "ebb send --wait-reply: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "re:hello\n");
    // The other answer is still there for its own waiter, with its correlation id.
    let id = other["id"].as_str().unwrap();
    let reply = http.post(format!("http://{}/queues/asks/replies/{id}?timeout_ms=10000", host.api)).send().await?;
    assert_eq!(reply.status(), 200);
    let reply: Value = serde_json::from_str(&reply.text().await?)?;
    assert_eq!((reply["correlation_id"].as_str(), reply["body"].as_str(), reply["queue"].as_str()), (Some(id), Some("re:other"), Some("asks")));
    // Taken: a second wait finds nothing.
    let again = http.post(format!("http://{}/queues/asks/replies/{id}?timeout_ms=200", host.api)).send().await?;
    assert_eq!(again.status(), 404);
    // A queue without a reply queue says so.
    let none = http.post(format!("http://{}/queues/orders/replies/{id}?timeout_ms=10", host.api)).send().await?;
    assert_eq!(none.status(), 409);
    Ok(())
}

/// On Azurite: items sent by 16 producers at once land in shared envelopes, each item
/// reaches the Rust handler, and every answer reaches the reply queue with its envelope's
/// id as correlation id, readable by the official Python SDK (`tests/azure-sdk/replies.py`);
/// `QueueHandle::wait_reply` takes the answer to a plain message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_and_replies_round_trip_through_azurite_and_the_python_sdk_reads_the_replies() -> Result<()> {
    use ebb::handler::{Handler, IncomingMessage};
    use ebb_tests::azurite::{Azurite, unique_queue_name};

    struct Answers(Arc<Mutex<Vec<String>>>);
    #[async_trait::async_trait]
    impl Handler for Answers {
        async fn handle(&self, message: &IncomingMessage) -> Result<()> {
            self.0.lock().unwrap().push(String::from_utf8_lossy(&message.body).into_owned());
            Ok(())
        }
        async fn handle_with_reply(&self, message: &IncomingMessage) -> Result<Option<bytes::Bytes>> {
            self.handle(message).await?;
            Ok(Some(format!("re:{}", String::from_utf8_lossy(&message.body)).into()))
        }
    }

    let azurite = Azurite::shared();
    let dir = tempfile::tempdir()?;
    let queue = unique_queue_name("items");
    let replies = format!("{queue}-replies");
    let text = format!(
        "[azure]\nconnection_string = \"{}\"\n[api]\nlisten = \"127.0.0.1:0\"\n[queues.{queue}]\nbackend = \"azure\"\npack_linger = \"200ms\"\nreply_queue = \"{replies}\"\n",
        azurite.connection_string()
    );
    let config = ebb::Config::parse(&text, dir.path(), None)?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let host = ebb::Host::builder(&config).handler(&queue, Answers(seen.clone())).start().await?;
    let handle = host.queue(&queue).unwrap();
    let question = handle.send(b"question", Duration::ZERO, Duration::from_secs(10)).await?;
    let reply = handle.wait_reply(&question, Duration::from_secs(20)).await?.expect("an answer within 20 s");
    assert_eq!((reply.correlation_id.as_str(), reply.bytes()), (question.as_str(), b"re:question".to_vec()));
    let sends = (0..16).map(|i| {
        let handle = handle.clone();
        async move { handle.send_items(vec![bytes::Bytes::from(format!("{{\"n\":{i}}}"))]).await }
    });
    let sent = futures::future::try_join_all(sends).await?;
    let mut envelopes: Vec<String> = sent.iter().flat_map(|s| s.messages.iter().map(|m| m.to_string())).collect();
    envelopes.sort();
    envelopes.dedup();
    assert!(envelopes.len() <= 2, "16 items in {} messages", envelopes.len());
    wait_for("16 items handled", || seen.lock().unwrap().len() >= 17).await?;
    let out = Command::new(ebb_tests::azure_sdk::AZURE_SDK_PYTHON)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/azure-sdk/replies.py"))
        .args([azurite.connection_string().as_str(), replies.as_str(), "16"])
        .output()?;
    ensure!(out.status.success(), "replies.py: {}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = String::from_utf8(out.stdout)?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    assert_eq!(lines.len(), 16);
    for i in 0..16 {
        let line = lines.iter().find(|l| l["answer"] == format!("re:{{\"n\":{i}}}")).unwrap_or_else(|| panic!("no answer to item {i}: {lines:?}"));
        assert!(envelopes.iter().any(|e| line["correlation_id"] == e.as_str()), "{line}");
        assert!(line["item"].is_u64(), "{line}");
    }
    host.shutdown().await;
    Ok(())
}

/// Issue 35, the review's repro through the binary: `["small-bad", "BIG-" + 70,000 × "b"]`
/// posted to a queue whose handler always answers 500. The large item was never poisoned
/// (its bytes alone are over the poison queue's limit), and the small one was poisoned again
/// at each return of the envelope. Now: one entry each, naming the id and index the
/// producer got, and no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_that_always_fail_are_poisoned_once_each_under_the_id_their_producer_got() -> Result<()> {
    let app = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let app_addr = app.local_addr()?;
    let router = axum::Router::new().route("/fail", axum::routing::post(|| async { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "no") }));
    tokio::spawn(async move { axum::serve(app, router).await });
    let dir = tempfile::tempdir()?;
    let api: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = format!(
        "[api]\nlisten = \"{api}\"\n\n[queues.failing]\nmax_dequeue_count = 3\nvisibility_timeout = \"100ms\"\nmin_polling_interval = \"50ms\"\n\
         max_polling_interval = \"200ms\"\nhandler = {{ url = \"http://{app_addr}/fail\" }}\n"
    );
    let host = Host::run(dir, api, &config).await?;
    let http = reqwest::Client::new();
    let items = json!(["small-bad", format!("BIG-{}", "b".repeat(70_000))]);
    let sent: Value = serde_json::from_str(&http.post(format!("http://{api}/queues/failing/items")).body(items.to_string()).send().await?.text().await?)?;
    let ids = sent["ids"].as_array().cloned().unwrap_or_default();
    ensure!(ids.len() == 2, "{sent}");
    let listing =
        || async { Ok::<Value, anyhow::Error>(serde_json::from_str(&http.get(format!("http://{api}/queues/failing/poison")).send().await?.text().await?)?) };
    // Poisoned within a second (retry delays of 100 and 200 ms).
    let deadline = Instant::now() + Duration::from_secs(60);
    while listing().await?["messages"].as_array().map_or(0, Vec::len) < 2 {
        ensure!(Instant::now() < deadline, "not poisoned: {}", std::fs::read_to_string(host.dir.path().join("host.log"))?);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Were the envelope still coming back, the small item would be poisoned again by now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let entries = listing().await?;
    let entries = entries["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(entries.len(), 2, "one entry per item: {entries:?}");
    let mut named: Vec<(String, u64)> =
        entries.iter().map(|e| (e["original_id"].as_str().unwrap_or_default().to_string(), e["item"].as_u64().unwrap_or(99))).collect();
    named.sort();
    let expected: Vec<(String, u64)> =
        ids.iter().map(|i| (i["message_id"].as_str().unwrap_or_default().to_string(), i["item"].as_u64().unwrap_or(99))).collect();
    assert_eq!(named, expected, "{entries:?}");
    let log = std::fs::read_to_string(host.dir.path().join("host.log"))?;
    assert!(!log.contains("ERROR"), "no poisoning failed: {log}");
    Ok(())
}
