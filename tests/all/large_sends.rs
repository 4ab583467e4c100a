//! Issue 20, item 3 for plain sends, through the binary on the embedded queue: a body too
//! large for a message, posted to `POST /queues/{name}/messages` or piped to `ebb send`,
//! goes to the queue's claim store and reaches the handler byte-identical as the plain
//! message it was sent as (no item headers), its answer correlated by the id the send gave;
//! a body over `max_claim_check_bytes`, or any body too large for a message of a
//! partitioned queue (no claim store for a producer that cannot know the partition), is
//! refused with 413 naming the limit that applies.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::{Result, ensure};
use axum::http::HeaderMap;
use sha2::Digest as _;

use crate::items_binary::Host;

const EBB: &str = env!("CARGO_BIN_EXE_ebb-under-test");

/// Each call's body SHA-256 and whether it came with item headers.
type Calls = Arc<Mutex<Vec<([u8; 32], bool)>>>;

async fn start(calls: Calls) -> Result<Host> {
    let app = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let app_addr = app.local_addr()?;
    let router = axum::Router::new()
        .route(
            "/work",
            axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| async move {
                calls.lock().unwrap().push((sha2::Sha256::digest(&body).into(), headers.contains_key("ebb-item-index")));
                "ok"
            }),
        )
        .route("/answer", axum::routing::post(|body: axum::body::Bytes| async move { format!("got {} bytes", body.len()) }))
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20));
    tokio::spawn(async move { axum::serve(app, router).await });
    let dir = tempfile::tempdir()?;
    let api = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = format!(
        "[api]\nlisten = \"{api}\"\n\n[queues.orders]\nmax_claim_check_bytes = 8388608\nhandler = {{ url = \"http://{app_addr}/work\" }}\n\n\
         [queues.asks]\nreply_queue = \"answers\"\nhandler = {{ url = \"http://{app_addr}/answer\" }}\n\n\
         [queues.parts]\npartitions = 2\nhandler = {{ url = \"http://{app_addr}/work\" }}\n"
    );
    Host::run(dir, api, &config).await
}

/// Posts `mib` MiB of zeros to `path` with no declared length (chunked); the status.
async fn chunked_post(api: std::net::SocketAddr, path: &str, mib: usize) -> Result<u16> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(api).await?;
    stream.write_all(format!("POST {path} HTTP/1.1\r\nHost: {api}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..mib {
        // The host may answer and close before the last chunk: what it answered counts.
        if stream.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).await.is_err()
            || stream.write_all(&chunk).await.is_err()
            || stream.write_all(b"\r\n").await.is_err()
        {
            break;
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer);
    let status = text.split(' ').nth(1).and_then(|code| code.parse().ok());
    status.ok_or_else(|| anyhow::anyhow!("no HTTP answer: {text:?}"))
}

/// Waits up to 30 s for the handler's first call.
async fn first_call(calls: &Calls, what: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while calls.lock().unwrap().is_empty() {
        ensure!(tokio::time::Instant::now() < deadline, "{what} never reached the handler");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Ok(())
}

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(..)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_send_too_large_for_a_message_reaches_the_handler_whole_and_one_over_the_limit_gets_413_naming_it() -> Result<()> {
    let calls = Calls::default();
    let host = start(calls.clone()).await?;
    let http = reqwest::Client::new();
    let big = random(3 << 20, 1);
    let sent = http.post(format!("http://{}/queues/orders/messages", host.api)).body(big.clone()).send().await?;
    ensure!(sent.status() == 201, "a 3 MiB body is taken: {} {}", sent.status(), sent.text().await?);
    first_call(&calls, "the 3 MiB message").await?;
    let expected: [u8; 32] = sha2::Sha256::digest(&big).into();
    assert_eq!(calls.lock().unwrap().as_slice(), &[(expected, false)], "byte-identical, as a plain message (no item headers)");

    // Over the queue's max_claim_check_bytes: refused, declared or chunked.
    let over = http.post(format!("http://{}/queues/orders/messages", host.api)).body(vec![0u8; (8 << 20) + 1]).send().await?;
    assert_eq!(over.status(), 413);
    let text = over.text().await?;
    assert!(text.contains("max_claim_check_bytes (8388608 bytes)"), "{text}");
    assert_eq!(chunked_post(host.api, "/queues/orders/messages", 9).await?, 413, "a chunked body is cut at the limit too");
    assert_eq!(chunked_post(host.api, "/queues/orders/messages", 1).await?, 201, "a chunked body within the limit is taken");

    // A partitioned queue has no claim store for producers: the message limit holds.
    let parts = http.post(format!("http://{}/queues/parts/messages", host.api)).body(vec![1u8; 100_000]).send().await?;
    assert_eq!(parts.status(), 413);
    let text = parts.text().await?;
    assert!(text.contains("max_message_bytes") && text.contains("no claim store"), "{text}");
    // And `ebb send` from stdin says so too (attack, session 13: it named only the limit).
    let mut child = Command::new(EBB).args(["send", "parts", "--config"]).arg(host.config()).stdin(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let _ = child.stdin.take().unwrap().write_all(&vec![1u8; 100_000]);
    let out = child.wait_with_output()?;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("a partitioned queue has no claim store"), "{said}");
    // Other routes keep the API's limit.
    let notify = http.post(format!("http://{}/queues/orders/notify", host.api)).body(vec![1u8; 100_000]).send().await?;
    assert_eq!(notify.status(), 413);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebb_send_pipes_a_large_body_and_waits_for_its_answer() -> Result<()> {
    let host = start(Calls::default()).await?;
    let mut child = Command::new(EBB)
        .args(["send", "asks", "--wait-reply", "--timeout", "60s", "--config"])
        .arg(host.config())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let body = random(2 << 20, 2);
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(&body));
    let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
    writer.join().unwrap()?;
    ensure!(out.status.success(), "ebb send --wait-reply of 2 MiB: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("got {} bytes\n", 2 << 20), "the answer to the large message, correlated by its id");
    Ok(())
}

/// Attack pass: any chunked send counted as a large body, so two slow uploads of a few bytes
/// took both places and every large send got 503 (and a 5-byte chunked send got 503 behind
/// two large ones). A chunked body takes a place only once it is larger than a message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_bodies_larger_than_a_message_wait_for_a_large_body_place() -> Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let host = start(Calls::default()).await?;
    let api = host.api;
    let open = |head: String| async move {
        let mut stream = tokio::net::TcpStream::connect(api).await?;
        stream.write_all(head.as_bytes()).await?;
        anyhow::Ok(stream)
    };
    // Two chunked uploads of a few bytes, left open: no place taken.
    let mut small = Vec::new();
    for _ in 0..2 {
        let mut stream = open(format!("POST /queues/orders/messages HTTP/1.1\r\nHost: {api}\r\nTransfer-Encoding: chunked\r\n\r\n")).await?;
        stream.write_all(b"5\r\nhello\r\n").await?;
        small.push(stream);
    }
    let http = reqwest::Client::new();
    let big = http.post(format!("http://{api}/queues/orders/messages")).body(vec![7u8; 200_000]).send().await?;
    assert_eq!(big.status(), 201, "two small chunked uploads hold no large-body place");
    // Two large uploads, declared and left unfinished, take both places.
    let mut large = Vec::new();
    for _ in 0..2 {
        let mut stream = open(format!("POST /queues/orders/messages HTTP/1.1\r\nHost: {api}\r\nContent-Length: 3000000\r\n\r\n")).await?;
        stream.write_all(&[1u8; 1000]).await?;
        large.push(stream);
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let refused = http.post(format!("http://{api}/queues/orders/messages")).body(vec![7u8; 200_000]).send().await?;
    assert_eq!(refused.status(), 503, "a third large body waits");
    assert_eq!(refused.headers().get("retry-after").map(|v| v.as_bytes().to_vec()), Some(b"1".to_vec()));
    let mut tiny = open(format!("POST /queues/orders/messages HTTP/1.1\r\nHost: {api}\r\nTransfer-Encoding: chunked\r\n\r\n")).await?;
    tiny.write_all(b"5\r\nhello\r\n0\r\n\r\n").await?;
    let mut answer = vec![0u8; 12];
    tiny.read_exact(&mut answer).await?;
    assert_eq!(&answer, b"HTTP/1.1 201", "a small chunked send does not: {}", String::from_utf8_lossy(&answer));
    drop(large);
    for mut stream in small {
        stream.write_all(b"0\r\n\r\n").await?;
        let mut answer = vec![0u8; 12];
        stream.read_exact(&mut answer).await?;
        assert_eq!(&answer, b"HTTP/1.1 201", "{}", String::from_utf8_lossy(&answer));
    }
    Ok(())
}

/// Attack pass: `ebb send --count N` sent large copies 64 at a time, so the host's two
/// large-body places turned most away (503) and the CLI stopped, or died of SIGPIPE as the
/// host answered early and closed; and `ebb send --items` refused an item over
/// max_message_bytes that the host takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebb_send_sends_every_large_copy_and_a_large_item() -> Result<()> {
    let calls = Calls::default();
    let host = start(calls.clone()).await?;
    let mut child = Command::new(EBB)
        .args(["send", "orders", "--count", "6", "--config"])
        .arg(host.config())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let body = random(300_000, 3);
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(&body));
    let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
    writer.join().unwrap()?;
    ensure!(out.status.success(), "ebb send --count 6 of 300 KB: {:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
    let items = host.dir.path().join("items.ndjson");
    std::fs::write(&items, format!("\"{}\"\n\"small\"\n", "x".repeat(1_000_000)))?;
    let out = Command::new(EBB).args(["send", "orders", "--items"]).arg(&items).arg("--config").arg(host.config()).output()?;
    ensure!(out.status.success(), "ebb send --items with a 1 MB item: {}", String::from_utf8_lossy(&out.stderr));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while calls.lock().unwrap().len() < 8 {
        ensure!(tokio::time::Instant::now() < deadline, "{} of 8 calls", calls.lock().unwrap().len());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Attack (session 13): with `max_message_bytes = 1` a 2-byte send was stored in the claim
/// store, then its reference (87 bytes) refused with "message of 87 bytes is over the limit".
/// The smallest limit is now 256 (refused below it at load, golden
/// `max_message_bytes_under_an_envelope`); at 256 a larger body goes through its reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_smallest_message_limit_a_larger_body_is_offloaded_and_delivered_whole() -> Result<()> {
    let calls = Calls::default();
    let app = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let app_addr = app.local_addr()?;
    let seen = calls.clone();
    let router = axum::Router::new().route(
        "/work",
        axum::routing::post(move |body: axum::body::Bytes| async move {
            seen.lock().unwrap().push((sha2::Sha256::digest(&body).into(), false));
            "ok"
        }),
    );
    tokio::spawn(async move { axum::serve(app, router).await });
    let dir = tempfile::tempdir()?;
    let api = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = format!(
        "max_message_bytes = 256\n[api]\nlisten = \"{api}\"\n\n[queues.the-longest-queue-name-ebb-takes-xxxxxxxxxxxxxxxxxxxxxxx]\nhandler = {{ url = \"http://{app_addr}/work\" }}\n"
    );
    let host = Host::run(dir, api, &config).await?;
    let body = random(1000, 7);
    let sent = reqwest::Client::new()
        .post(format!("http://{}/queues/the-longest-queue-name-ebb-takes-xxxxxxxxxxxxxxxxxxxxxxx/messages", host.api))
        .body(body.clone())
        .send()
        .await?;
    ensure!(sent.status() == 201, "{} {}", sent.status(), sent.text().await?);
    first_call(&calls, "the message").await?;
    let expected: [u8; 32] = sha2::Sha256::digest(&body).into();
    assert_eq!(calls.lock().unwrap().as_slice(), &[(expected, false)]);
    Ok(())
}
