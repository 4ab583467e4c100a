//! Issue 35 item 6, the data directory's edges through the binary: a directory another
//! process holds a moment, an audit log that cannot take an entry, a pauses file that cannot
//! be written.

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use ebb::queue::embedded::{EmbeddedOptions, EmbeddedStore};
use ebb_raw_http::{get, raw};
use tokio::time::Instant;

use crate::binary::EBB;
use crate::tokens::Host;

/// `ebb run` exited at once when an `ebb send` with no host running held the data directory
/// for a moment. It waits for the directory (a few seconds, logged) before giving up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebb_run_waits_for_a_data_directory_another_process_holds_a_moment() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let held = EmbeddedStore::open(&data, EmbeddedOptions::default())?;
    let port = ebb_tests::azurite::free_port();
    let config = dir.path().join("ebb.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\n[api]\nlisten = \"127.0.0.1:{port}\"\n[queues.orders]\nhandler = {{ url = \"http://127.0.0.1:9/work\" }}\n",
            data.display()
        ),
    )?;
    let log = dir.path().join("host.log");
    let mut child = Command::new(EBB).arg("run").arg("--config").arg(&config).stdout(Stdio::null()).stderr(std::fs::File::create(&log)?).spawn()?;
    let let_go_at = Instant::now() + Duration::from_millis(1500);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut held = Some(held);
    let answered = loop {
        if Instant::now() >= let_go_at {
            held.take();
        }
        if let Some(status) = child.try_wait()? {
            break Err(format!("ebb run exited with {status}"));
        }
        if raw(([127, 0, 0, 1], port).into(), &get("/healthz", None)).await.map(|a| a.status).ok() == Some(200) {
            break Ok(());
        }
        if Instant::now() > deadline {
            break Err("the host never answered".to_string());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log)?;
    if let Err(why) = answered {
        bail!("{why}:\n{text}");
    }
    ensure!(text.contains("is in use by another ebb process") && text.contains("waiting up to 5s"), "the wait is logged:\n{text}");
    Ok(())
}

/// With `audit.log` a folder, a pause and a resume were made with no entry, and `/audit`
/// answered 503 without naming the file. A change that cannot be recorded is refused, naming
/// the file, and not made; `/audit` names it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_the_audit_log_cannot_record_is_refused_naming_the_file() -> Result<()> {
    let host = Host::start("", &[]).await?;
    let audit_log = host.dir.path().join("ebb-data").join("audit.log");
    std::fs::create_dir_all(audit_log.join("in-the-way"))?;
    let named = audit_log.display().to_string();
    for path in ["/queues/orders/pause", "/queues/orders/resume", "/queues/orders/poison/purge?confirm=orders"] {
        let answer = host.call("POST", path, None).await?;
        ensure!(answer.status == 503 && answer.body.contains(&named) && answer.body.contains("the change was not made"), "{path}: {answer:?}");
    }
    let status: serde_json::Value = serde_json::from_str(&host.call("GET", "/status", None).await?.body)?;
    let orders = status["queues"].as_array().and_then(|qs| qs.iter().find(|q| q["queue"] == "orders")).context("no orders in /status")?;
    ensure!(orders["paused"].is_null(), "the refused pause was not made: {orders}");
    let answer = host.call("GET", "/audit", None).await?;
    ensure!(answer.status == 503 && answer.body.contains(&named), "/audit: {answer:?}");
    Ok(())
}

/// A paused queue could not be resumed on a full disk (`paused.json` could not be written),
/// so it could not drain to free space. The resume holds on the host, and the answer says it
/// is not kept across a restart yet, naming the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_resumes_when_its_pauses_file_cannot_be_written_and_says_so() -> Result<()> {
    let host = Host::start("", &[]).await?;
    ensure!(host.call("POST", "/queues/orders/pause", None).await?.status == 200);
    // The file cannot be replaced, as on a full disk (where its new copy cannot be written).
    let pauses = host.dir.path().join("ebb-data").join("paused.json");
    std::fs::remove_file(&pauses)?;
    std::fs::create_dir_all(pauses.join("in-the-way"))?;
    let answer = host.call("POST", "/queues/orders/resume", None).await?;
    ensure!(answer.status == 200, "{answer:?}");
    let body: serde_json::Value = serde_json::from_str(&answer.body)?;
    let warning = body["warning"].as_str().unwrap_or_default();
    ensure!(warning.contains("not kept across a restart yet") && warning.contains(&pauses.display().to_string()), "{body}");
    let status: serde_json::Value = serde_json::from_str(&host.call("GET", "/status", None).await?.body)?;
    let orders = status["queues"].as_array().and_then(|qs| qs.iter().find(|q| q["queue"] == "orders")).context("no orders in /status")?;
    ensure!(orders["paused"].is_null(), "resumed on the host: {orders}");
    let audit: serde_json::Value = serde_json::from_str(&host.call("GET", "/audit", None).await?.body)?;
    let last = &audit["entries"].as_array().and_then(|e| e.last().cloned()).unwrap_or_default();
    ensure!(last["action"] == "resume" && last["result"].as_str().is_some_and(|r| r.contains("not kept")), "audit: {audit}");
    Ok(())
}
