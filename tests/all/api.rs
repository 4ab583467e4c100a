//! The HTTP API through the binary: every error answer is JSON with a reason, the body
//! limit comes from the config, slow clients are closed, the log filter from `RUST_LOG`,
//! and the `ebb status` table. (The API served in process, on tokio's paused clock, is
//! tested in `host/src/http/tests.rs`.)

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use ebb_raw_http::{closed, get, raw, request};
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

const EBB: &str = env!("CARGO_BIN_EXE_ebb-under-test");
const TOKEN: &str = "t0ken";

/// An `ebb run` on a temporary folder, with a handler app that answers 200.
struct Host {
    dir: tempfile::TempDir,
    api: SocketAddr,
    child: Option<Child>,
}

impl Host {
    /// `top` goes before `[api]`, `api` inside it; `env` is added to a clean environment.
    async fn start(top: &str, api: &str, env: &[(&str, &str)]) -> Result<Host> {
        let app = TcpListener::bind("127.0.0.1:0").await?;
        let app_addr = app.local_addr()?;
        let router = axum::Router::new().route("/work", axum::routing::post(|| async { "ok" }));
        tokio::spawn(async move { axum::serve(app, router).await });
        let dir = tempfile::tempdir()?;
        let api_addr: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let config =
            format!("{top}\n[api]\nlisten = \"{api_addr}\"\ntoken = \"{TOKEN}\"\n{api}\n\n[queues.orders]\nhandler = {{ url = \"http://{app_addr}/work\" }}\n");
        std::fs::write(dir.path().join("ebb.toml"), config)?;
        let log = std::fs::File::create(dir.path().join("host.log"))?;
        let mut command = Command::new(EBB);
        command.arg("run").arg("--config").arg(dir.path().join("ebb.toml")).stdout(Stdio::null()).stderr(log);
        for variable in ["RUST_LOG", "EBB_LOG", "EBB_LOG_FORMAT", "EBB_API_TOKEN"] {
            command.env_remove(variable);
        }
        command.envs(env.iter().copied());
        let mut host = Host { child: Some(command.spawn()?), dir, api: api_addr };
        let deadline = Instant::now() + Duration::from_secs(60);
        while raw(host.api, &get("/healthz", None)).await.map(|a| a.status).ok() != Some(200) {
            if let Some(status) = host.child.as_mut().unwrap().try_wait()? {
                bail!("ebb run exited with {status}: {}", host.log());
            }
            ensure!(Instant::now() < deadline, "the host's API did not come up: {}", host.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(host)
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("ebb.toml")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("host.log")).unwrap_or_default()
    }

    /// SIGTERM, then waits for a clean exit; returns the log.
    async fn stop(mut self) -> Result<String> {
        // The child stays ours until the signal is sent: if sending fails, Drop kills and reaps it.
        let pid = self.child.as_ref().map(|c| c.id()).unwrap_or_default();
        ensure!(Command::new("kill").args(["-TERM", &pid.to_string()]).status()?.success());
        let mut child = self.child.take().unwrap();
        let status = tokio::task::spawn_blocking(move || child.wait()).await??;
        ensure!(status.success(), "graceful shutdown exits 0, got {status}: {}", self.log());
        Ok(self.log())
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_answer_of_the_api_is_json_with_a_reason() -> Result<()> {
    let host = Host::start("max_message_bytes = 1000", "", &[]).await?;
    let post = |query: &str, body: &[u8]| request("POST", &format!("/queues/orders/messages{query}"), Some(TOKEN), body);
    // A send to this queue may carry up to its max_claim_check_bytes (the body too large for a
    // message goes to its claim store: tests/all/large_sends.rs); every other route keeps
    // max_message_bytes.
    let too_large_headers_only =
        format!("POST /queues/orders/notify HTTP/1.1\r\nHost: ebb\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 3000000\r\n\r\n").into_bytes();
    let cases = [
        (get("/nope", Some(TOKEN)), 404, "no route GET /nope"),
        (request("POST", "/queues/nope/messages", Some(TOKEN), b"x"), 404, "no queue named nope"),
        (get("/queues/orders/messages", Some(TOKEN)), 405, "allowed: POST"),
        (get("/status", None), 401, "token"),
        (get("/status", Some("wrong")), 401, "token"),
        (request("POST", "/queues/orders/notify", Some(TOKEN), &[b'x'; 1001]), 413, "max_message_bytes (1000 bytes)"),
        (too_large_headers_only, 413, "max_message_bytes (1000 bytes)"),
        (post("?delay_ms=abc", b"x"), 400, "delay_ms: \"abc\" is not a whole number"),
        (post("?delay_ms=-1", b"x"), 400, "delay_ms"),
        (post("?delay_ms=18446744073709551615", b"x"), 400, "7 days"),
        (post("?delay_ms=604800001", b"x"), 400, "7 days"),
        (post("?delay_ms=18446744073709551616", b"x"), 400, "delay_ms"),
        (post("?delay=5", b"x"), 400, "unknown query parameter \"delay\""),
        (post("?delay_ms=1&delay_ms=2", b"x"), 400, "more than once"),
        // Review defects: a sign was taken as a number, and /notify ignored its query.
        (post("?delay_ms=+1", b"x"), 400, "delay_ms"),
        (request("POST", "/queues/orders/notify?now=1", Some(TOKEN), b""), 400, "unknown query parameter \"now\""),
    ];
    for (request, status, reason) in cases {
        let answer = raw(host.api, &request).await?;
        let shown = String::from_utf8_lossy(&request[..request.len().min(120)]).to_string();
        ensure!(answer.status == status, "{shown}: expected {status}, got {answer:?}");
        let error = answer.error().with_context(|| shown.clone())?;
        ensure!(error.contains(reason), "{shown}: {error:?} should say {reason:?}");
    }
    // The largest allowed message and delay are taken; the host still works afterwards.
    ensure!(raw(host.api, &post("?delay_ms=604800000", &[b'x'; 1000])).await?.status == 201);
    // Percent-encoded digits are digits.
    ensure!(raw(host.api, &post("?delay_ms=%31", b"x")).await?.status == 201);
    ensure!(raw(host.api, &post("", b"x")).await?.status == 201);
    ensure!(raw(host.api, &get("/healthz", None)).await?.status == 200);
    host.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_slow_clients_are_closed_within_the_header_read_timeout() -> Result<()> {
    let host = Host::start("", "header_read_timeout = \"1s\"\nidle_timeout = \"3s\"", &[]).await?;
    let started = Instant::now();
    let mut clients = Vec::new();
    for i in 0..100 {
        let mut stream = TcpStream::connect(host.api).await?;
        clients.push(tokio::spawn(async move {
            // Headers, one line every 200 ms, never finished.
            let _ = stream.write_all(format!("GET /status HTTP/1.1\r\nHost: ebb\r\nX-Client: {i}\r\n").as_bytes()).await;
            let (mut read, mut write) = stream.into_split();
            let trickle = async {
                loop {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if write.write_all(b"X-Slow: 1\r\n").await.is_err() {
                        break;
                    }
                }
            };
            let closed = closed(&mut read);
            tokio::select! { () = trickle => {}, () = closed => {} }
            started.elapsed()
        }));
    }
    // Meanwhile the API answers others.
    ensure!(raw(host.api, &get("/healthz", None)).await?.status == 200);
    for client in clients {
        let elapsed = tokio::time::timeout(Duration::from_secs(15), client).await.context("a slow client was never closed")??;
        ensure!(elapsed < Duration::from_secs(6), "a slow client was closed only after {elapsed:?} (header_read_timeout is 1s)");
    }
    // A request whose body never comes is closed by the idle timeout.
    let mut stream = TcpStream::connect(host.api).await?;
    let started = Instant::now();
    stream
        .write_all(format!("POST /queues/orders/messages HTTP/1.1\r\nHost: ebb\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 10\r\n\r\n").as_bytes())
        .await?;
    tokio::time::timeout(Duration::from_secs(15), closed(&mut stream)).await.context("a stalled body was never closed")?;
    let elapsed = started.elapsed();
    ensure!(elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(8), "a stalled body was closed after {elapsed:?} (idle_timeout is 3s)");
    host.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_filter_is_read_from_rust_log_and_ebb_log_wins() -> Result<()> {
    let default = Host::start("", "", &[]).await?.stop().await?;
    ensure!(default.contains("API listening"), "ebb run logs at info by default:\n{default}");
    let quiet = Host::start("", "", &[("RUST_LOG", "warn")]).await?.stop().await?;
    ensure!(!quiet.contains("API listening") && !quiet.contains(" INFO "), "RUST_LOG=warn still logged INFO:\n{quiet}");
    let alias = Host::start("", "", &[("RUST_LOG", "warn"), ("EBB_LOG", "info")]).await?.stop().await?;
    ensure!(alias.contains("API listening"), "EBB_LOG=info should win over RUST_LOG=warn:\n{alias}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_table_lines_up_with_its_header() -> Result<()> {
    let host = Host::start("", "", &[]).await?;
    for _ in 0..3 {
        ensure!(raw(host.api, &request("POST", "/queues/orders/messages", Some(TOKEN), b"hello")).await?.status == 201);
    }
    let output = Command::new(EBB).arg("status").arg("--config").arg(host.config()).env_remove("RUST_LOG").env_remove("EBB_LOG").output()?;
    ensure!(output.status.success(), "ebb status failed: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout)?;
    let mut lines = text.lines();
    let header = lines.next().context("no header")?;
    let row = lines.next().context("no row")?;
    // Where each header title ends (right-aligned columns) or starts (left-aligned ones).
    let titles = [
        "queue",
        "depth",
        "tasks a/t/pk",
        "in-flight",
        "calls/limit",
        "processed",
        "failed",
        "poisoned",
        "storage tx",
        "empty gets",
        "tx/h all/idle",
        "$/month",
        "rule",
    ];
    let title_at: Vec<usize> = titles.iter().map(|t| header.find(t).unwrap_or_else(|| panic!("no {t} in {header:?}"))).collect();
    // The row's cells: the first twelve have no spaces; the rule column is the rest.
    let mut cells = Vec::new();
    let mut from = 0;
    for _ in 0..12 {
        let start = from + row[from..].find(|c: char| c != ' ').context("a short row")?;
        let end = row[start..].find(' ').map_or(row.len(), |n| start + n);
        cells.push((start, end));
        from = end;
    }
    let rule_start = from + row[from..].find(|c: char| c != ' ').context("no rule column")?;
    ensure!(cells[0].0 == title_at[0], "queue is not under its title:\n{text}");
    for i in 1..12 {
        ensure!(cells[i].1 == title_at[i] + titles[i].len(), "{} does not end under its title:\n{text}", titles[i]);
    }
    ensure!(rule_start == title_at[12], "rule is not under its title:\n{text}");
    ensure!(row.starts_with("orders ") && row[rule_start..].starts_with("built-in"), "{text}");
    host.stop().await?;
    Ok(())
}
