//! The operator console in a real browser: Debian's headless Chromium driven through
//! WebDriver (chromedriver, started by each test on a free port) against the real binary.
//! The page loads with no console error (the browser's own log, which also has content
//! security policy violations), a chart moves as messages flow, the pause button stops
//! processing and resume restarts it, requeue from the page reaches the handler, and a
//! hostile poison body shows as text and runs nothing.
//!
//! `EBB_SCREENSHOT=1` also saves `docs/console.png` from the first test, with traffic on a
//! few queues. `console_goals` (ignored, run by hand) measures the page's goals.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use axum::body::Bytes;
use axum::http::StatusCode;
use ebb_tests::chromium::{CHROMEDRIVER, CHROMIUM};
use ebb_tests::guests;
use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::binary::{EBB, wait_until};

const TOKEN: &str = "c0nsole";

/// The handler app: fails (500) bodies that contain `poison` until healed; records the bodies
/// it handled.
#[derive(Clone, Default)]
struct App {
    handled: Arc<Mutex<Vec<String>>>,
    healed: Arc<AtomicBool>,
}

impl App {
    async fn start(delay: Duration) -> (App, SocketAddr) {
        let app = App::default();
        let state = app.clone();
        let router = axum::Router::new().route(
            "/work",
            axum::routing::post(move |body: Bytes| {
                let state = state.clone();
                async move {
                    tokio::time::sleep(delay).await;
                    let body = String::from_utf8_lossy(&body).into_owned();
                    if body.contains("poison") && !state.healed.load(Ordering::Relaxed) {
                        return StatusCode::INTERNAL_SERVER_ERROR;
                    }
                    state.handled.lock().unwrap().push(body);
                    StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        (app, addr)
    }

    fn handled(&self) -> Vec<String> {
        self.handled.lock().unwrap().clone()
    }
}

/// The binary, running with `queues` (TOML of `[queues.*]` tables) and a token.
struct Host {
    dir: tempfile::TempDir,
    api: SocketAddr,
    child: Child,
}

impl Host {
    async fn start(queues: &str) -> Result<Host> {
        Host::start_with(&format!("token = \"{TOKEN}\"\n"), queues).await
    }

    /// The host with `api` as the rest of its `[api]` table (its tokens).
    async fn start_with(api_tokens: &str, queues: &str) -> Result<Host> {
        Host::start_with_env(api_tokens, queues, &[]).await
    }

    /// [`Host::start_with`], the host given the environment variables `env`.
    async fn start_with_env(api_tokens: &str, queues: &str, env: &[(&str, String)]) -> Result<Host> {
        let dir = tempfile::tempdir()?;
        let api: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        std::fs::create_dir_all(dir.path().join("rules"))?;
        std::fs::copy(guests::PAPER_DEFAULT, dir.path().join("rules/paper.wasm"))?;
        // A rule that traps at every call, for the queues that need a faulting rule.
        std::fs::copy(guests::TRAP, dir.path().join("rules/trap.wasm"))?;
        std::fs::write(dir.path().join("ebb.toml"), format!("drain_timeout = \"5s\"\n[api]\nlisten = \"{api}\"\n{api_tokens}\n{queues}"))?;
        let log = std::fs::File::create(dir.path().join("host.log"))?;
        // `EBB_CONSOLE_HOST_BINARY` lets the goals harness measure a release build.
        let binary = std::env::var("EBB_CONSOLE_HOST_BINARY").unwrap_or_else(|_| EBB.to_string());
        let child = Command::new(binary)
            .arg("run")
            .arg("--config")
            .arg(dir.path().join("ebb.toml"))
            .envs(env.iter().map(|(name, value)| (name, value)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        let host = Host { dir, api, child };
        let url = format!("http://{api}/healthz");
        wait_until("the host's API", || async { reqwest::get(&url).await.is_ok_and(|r| r.status().is_success()) }).await;
        Ok(host)
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.api)
    }

    async fn send(&self, queue: &str, body: &str) -> Result<()> {
        let status =
            reqwest::Client::new().post(self.url(&format!("/queues/{queue}/messages"))).bearer_auth(TOKEN).body(body.to_string()).send().await?.status();
        ensure!(status.is_success(), "send to {queue}: {status}");
        Ok(())
    }

    async fn get(&self, path: &str) -> Result<Value> {
        let response = reqwest::Client::new().get(self.url(path)).bearer_auth(TOKEN).send().await?;
        ensure!(response.status().is_success(), "GET {path}: {}", response.status());
        Ok(serde_json::from_slice(&response.bytes().await?)?)
    }

    async fn queue_status(&self, queue: &str) -> Result<Value> {
        let status = self.get("/status").await?;
        status["queues"].as_array().and_then(|qs| qs.iter().find(|q| q["queue"] == queue).cloned()).with_context(|| format!("no {queue} in /status"))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("host.log")).unwrap_or_default()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// chromedriver and a headless Chromium session.
struct Browser {
    driver: Child,
    client: Client,
}

/// chromedriver's command for the browser's log (its console, network errors, CSP reports),
/// which WebDriver itself does not define.
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(&self, base_url: &url::Url, session_id: Option<&str>) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!("session/{}/se/log", session_id.unwrap_or_default()))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (axum::http::Method, Option<String>) {
        (axum::http::Method::POST, Some(json!({ "type": "browser" }).to_string()))
    }
}

impl Browser {
    async fn start() -> Result<Browser> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("failed to start {CHROMEDRIVER}"))?;
        let webdriver = format!("http://127.0.0.1:{port}");
        let status = format!("{webdriver}/status");
        wait_until("chromedriver", || async { reqwest::get(&status).await.is_ok_and(|r| r.status().is_success()) }).await;
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000", "--hide-scrollbars"],
            }),
        );
        capabilities.insert("goog:loggingPrefs".into(), json!({ "browser": "ALL" }));
        let client = ClientBuilder::rustls()?.capabilities(capabilities).connect(&webdriver).await.context("failed to open a Chromium session")?;
        Ok(Browser { driver, client })
    }

    /// The browser log's entries since the last call.
    async fn log(&self) -> Result<Vec<Value>> {
        let entries = self.client.issue_cmd(BrowserLog).await?;
        Ok(entries.as_array().cloned().unwrap_or_default())
    }

    /// The log's errors since the last call, but for the 404 of `/whoami` from a host
    /// without named tokens (the page then takes its one token as admin).
    async fn errors(&self) -> Result<Vec<String>> {
        let entries = self.log().await?;
        Ok(entries
            .iter()
            .filter(|e| e["level"] == "SEVERE" || e["source"] == "security")
            .map(|e| e["message"].as_str().unwrap_or_default().to_string())
            .filter(|m| !(m.contains("/whoami") && m.contains("404")))
            .collect())
    }

    async fn script(&self, script: &str) -> Result<Value> {
        Ok(self.client.execute(script, Vec::new()).await?)
    }

    /// Waits up to 60 s for `script` to return true.
    async fn until(&self, what: &str, script: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.script(script).await? == json!(true) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("timed out waiting for {what} ({script})");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Opens the console of `host` as an operator would: the page asks for the token on the
    /// first 401, and shows the queues once it has it. The log is checked to be clean after.
    async fn open(&self, host: &Host) -> Result<()> {
        self.open_as(host, TOKEN).await
    }

    /// [`Browser::open`], giving `token`.
    async fn open_as(&self, host: &Host, token: &str) -> Result<()> {
        self.client.goto(&host.url("/")).await?;
        self.client.wait().for_element(Locator::Css("#login:not([hidden]) #token")).await?.send_keys(token).await?;
        // The 401 that made the page ask is in the log as a failed load: expected.
        let before: Vec<String> = self.errors().await?;
        ensure!(before.iter().all(|m| m.contains("401")), "errors before the token was given: {before:?}");
        self.client.find(Locator::Css("#login-form button")).await?.click().await?;
        self.until("the queue table", "return document.querySelectorAll('#queues tbody tr').length > 0").await?;
        Ok(())
    }

    async fn text(&self, css: &str) -> Result<String> {
        Ok(self.client.find(Locator::Css(css)).await?.text().await?)
    }

    async fn close(mut self) -> Result<()> {
        let client = self.client.clone();
        client.close().await?;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        Ok(())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn row(queue: &str, cell: &str) -> String {
    format!("tr[data-queue=\"{queue}\"] td.{cell}")
}

fn spark(queue: &str) -> String {
    format!("return document.querySelector('tr[data-queue=\"{queue}\"] canvas').toDataURL()")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_loads_without_error_and_its_chart_moves_as_messages_flow() -> Result<()> {
    let (_app, app_addr) = App::start(Duration::from_millis(20)).await;
    let handler = format!("handler = {{ url = \"http://{app_addr}/work\" }}\n");
    let host =
        Host::start(&format!("[queues.orders]\nrule = \"paper.wasm\"\n{handler}\n[queues.emails]\n{handler}\n[queues.invoices]\npartitions = 2\n{handler}"))
            .await?;
    let browser = Browser::start().await?;
    browser.open(&host).await?;
    let rows: Vec<String> =
        serde_json::from_value(browser.script("return [...document.querySelectorAll('#queues tbody tr[data-queue]')].map(r => r.dataset.queue)").await?)?;
    assert_eq!(rows, ["emails", "invoices-0", "invoices-1", "orders"], "one row per queue partition");
    // The partitions of invoices are under its row: shown, their charts are drawn.
    browser.script("document.querySelector('tr.group[data-logical=\"invoices\"]').click(); return null").await?;
    browser.until("the rule of orders", &format!("return document.querySelector('{}').textContent.startsWith('paper.wasm ')", row("orders", "rule"))).await?;

    let idle_chart = browser.script(&spark("orders")).await?;
    for i in 0..200 {
        host.send("orders", &format!("message {i}")).await?;
    }
    browser.until("a throughput on the orders row", &format!("return document.querySelector('{}').textContent !== '0'", row("orders", "tput"))).await?;
    let busy_chart = browser.script(&spark("orders")).await?;
    assert_ne!(idle_chart, busy_chart, "the orders chart did not change with traffic");
    assert_eq!(browser.script(&spark("emails")).await?, browser.script(&spark("invoices-0")).await?, "two idle queues draw the same chart");

    // A new content of the rule file: the detail shows both swaps and the last decisions.
    std::fs::copy(guests::PADDED, host.dir.path().join("rules/paper.wasm"))?;
    wait_until("the second swap", || async { host.queue_status("orders").await.is_ok_and(|q| q["rule"]["swaps"].as_array().is_some_and(|s| s.len() == 2)) })
        .await;
    let sha = host.queue_status("orders").await?["rule"]["sha256"].as_str().context("no sha256")?.to_string();
    browser.client.find(Locator::Css(&row("orders", "name"))).await?.click().await?;
    browser.until("two swaps in the detail", "return document.querySelectorAll('#swaps tbody tr').length === 2").await?;
    assert_eq!(browser.text("#swaps tbody tr:first-child td:nth-child(3)").await?, sha[..12], "the newest swap first");
    browser.until("the decisions with their inputs", "return document.querySelectorAll('#decisions tbody tr td').length >= 10").await?;

    if std::env::var_os("EBB_SCREENSHOT").is_some_and(|v| v == "1") {
        screenshot(&host, &browser).await?;
    }
    let errors = browser.errors().await?;
    assert!(errors.is_empty(), "the browser logged errors: {errors:?}");
    // The log is read for real: an error the page makes now is in it.
    browser.script("console.error('a probe of the log'); return null").await?;
    let probe = browser.errors().await?;
    assert!(probe.iter().any(|m| m.contains("a probe of the log")), "the browser's log missed an error: {probe:?}");
    browser.close().await
}

/// Traffic on a few queues for a few minutes (the charts fill), the orders detail open,
/// then `docs/console.png`.
async fn screenshot(host: &Host, browser: &Browser) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(150);
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let wave = ((n as f64) / 40.0).sin().abs();
        for _ in 0..(1 + (wave * 12.0) as u64) {
            host.send("orders", &format!("order {n}")).await?;
        }
        if n.is_multiple_of(3) {
            host.send("emails", &format!("email {n}")).await?;
        }
        if n.is_multiple_of(2) {
            host.send("invoices", &format!("invoice {n}")).await?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    browser.client.find(Locator::Css(&row("orders", "name"))).await?.click().await?;
    browser.until("the rule of the detail", "return document.querySelectorAll('#rule dd').length > 0").await?;
    browser.until("the decisions", "return document.querySelectorAll('#decisions tbody tr').length > 0").await?;
    let png = browser.client.screenshot().await?;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/console.png");
    std::fs::write(&path, png).with_context(|| format!("failed to write {}", path.display()))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pause_button_stops_processing_and_resume_restarts_it() -> Result<()> {
    let (app, app_addr) = App::start(Duration::ZERO).await;
    let host = Host::start(&format!("[queues.orders]\nmax_polling_interval = \"1s\"\nhandler = {{ url = \"http://{app_addr}/work\" }}\n")).await?;
    let browser = Browser::start().await?;
    browser.open(&host).await?;
    browser.client.find(Locator::Css(&row("orders", "name"))).await?.click().await?;
    browser.client.wait().for_element(Locator::Css("#detail:not([hidden]) #pause")).await?.click().await?;
    browser.until("the row to say paused", &format!("return document.querySelector('{}').textContent === 'paused'", row("orders", "state"))).await?;
    ensure!(!host.queue_status("orders").await?["paused"].is_null(), "the page said paused, /status does not");

    for i in 0..5 {
        host.send("orders", &format!("held {i}")).await?;
    }
    browser.until("the depth of 5", &format!("return document.querySelector('{}').textContent === '5'", row("orders", "depth"))).await?;
    // Several polling intervals pass: a queue that was not paused would have been emptied.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(app.handled().is_empty(), "the handler was called while paused: {:?}", app.handled());
    assert_eq!(host.queue_status("orders").await?["approximate_depth"], 5);

    browser.client.find(Locator::Css("#resume")).await?.click().await?;
    wait_until("the held messages to be handled", || async { app.handled().len() == 5 }).await;
    // They waited out the pause: the pickup latency says so, on the page too.
    let pickup = host.queue_status("orders").await?["pickup_latency_ms"].as_u64().context("no pickup latency")?;
    assert!(pickup >= 3_000, "pickup latency {pickup} ms after a pause of more than 3 s");
    browser.until("the pickup latency on the row", &format!("return document.querySelector('{}').textContent !== '–'", row("orders", "pickup"))).await?;
    browser.until("the row to say running", &format!("return document.querySelector('{}').textContent === 'running'", row("orders", "state"))).await?;
    browser
        .until(
            "the audit log to show both",
            "return [...document.querySelectorAll('#audit tbody td:nth-child(3)')].map(t => t.textContent).join() === 'resume,pause'",
        )
        .await?;
    let errors = browser.errors().await?;
    assert!(errors.is_empty(), "the browser logged errors: {errors:?}");
    browser.close().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_poison_body_shows_as_text_and_requeue_from_the_page_reaches_the_handler() -> Result<()> {
    hostile_poison_as_text_and_requeue_from_the_page(("", ""), &[]).await
}

/// The body of [`a_hostile_poison_body_shows_as_text_and_requeue_from_the_page_reaches_the_handler`]
/// with `storage` in queue `orders`'s table (its `backend`) and after it (the backend's
/// table), the host given `env`.
pub(crate) async fn hostile_poison_as_text_and_requeue_from_the_page((backend, table): (&str, &str), env: &[(&str, String)]) -> Result<()> {
    const HOSTILE: &str = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\">poison";
    const FIXABLE: &str = "poison until the app is fixed";
    let (app, app_addr) = App::start(Duration::ZERO).await;
    let queues =
        format!("[queues.orders]\n{backend}max_dequeue_count = 1\nmax_polling_interval = \"1s\"\nhandler = {{ url = \"http://{app_addr}/work\" }}\n{table}");
    let host = Host::start_with_env(&format!("token = \"{TOKEN}\"\n"), &queues, env).await?;
    host.send("orders", HOSTILE).await?;
    host.send("orders", FIXABLE).await?;
    wait_until("both messages poisoned", || async { host.queue_status("orders").await.is_ok_and(|q| q["poisoned"] == 2) }).await;

    let browser = Browser::start().await?;
    browser.open(&host).await?;
    browser.client.find(Locator::Css(&row("orders", "name"))).await?.click().await?;
    browser.until("two poison rows", "return document.querySelectorAll('#poison tbody tr').length === 2").await?;
    let bodies: BTreeSet<String> =
        serde_json::from_value(browser.script("return [...document.querySelectorAll('#poison tbody td.body')].map(t => t.textContent)").await?)?;
    assert_eq!(bodies, BTreeSet::from([HOSTILE.to_string(), FIXABLE.to_string()]), "the bodies, as text");
    let markup = browser.script("return document.querySelectorAll('#poison tbody script, #poison tbody img').length").await?;
    assert_eq!(markup, json!(0), "the body became elements");
    assert_eq!(browser.script("return typeof window.__pwned").await?, json!("undefined"), "the body's script ran");

    app.healed.store(true, Ordering::Relaxed);
    let requeue = format!(
        "const row = [...document.querySelectorAll('#poison tbody tr')].find(r => r.querySelector('td.body').textContent === {}); row.querySelector('button.requeue-one').click(); return true",
        json!(FIXABLE)
    );
    browser.script(&requeue).await?;
    wait_until("the requeued message to reach the handler", || async { app.handled() == [FIXABLE] }).await;
    browser.until("the poison list to hold the hostile body only", "return document.querySelectorAll('#poison tbody tr').length === 1").await?;
    assert_eq!(browser.text("#poison tbody td.body").await?, HOSTILE);
    browser.until("the audit log to show the requeue", "return document.querySelector('#audit tbody td:nth-child(3)')?.textContent === 'requeue'").await?;
    assert_eq!(browser.script("return typeof window.__pwned").await?, json!("undefined"), "the body's script ran");
    let errors = browser.errors().await?;
    assert!(errors.is_empty(), "the browser logged errors: {errors:?}\nhost log:\n{}", host.log());
    browser.close().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_token_sees_the_queues_but_no_control_that_changes_them_and_its_calls_get_403() -> Result<()> {
    const VIEWER: &str = "v1ewer-token";
    let (app, app_addr) = App::start(Duration::ZERO).await;
    let tokens = format!(
        "[[api.tokens]]\nname = \"viewer\"\nrole = \"read\"\ntoken = \"{VIEWER}\"\n\n[[api.tokens]]\nname = \"ops\"\nrole = \"admin\"\ntoken = \"{TOKEN}\"\n"
    );
    let host = Host::start_with(
        &tokens,
        &format!("[queues.orders]\nmax_dequeue_count = 1\nmax_polling_interval = \"1s\"\nhandler = {{ url = \"http://{app_addr}/work\" }}\n"),
    )
    .await?;
    host.send("orders", "poison for the list").await?;
    wait_until("the message poisoned", || async { host.queue_status("orders").await.is_ok_and(|q| q["poisoned"] == 1) }).await;

    let browser = Browser::start().await?;
    browser.open_as(&host, VIEWER).await?;
    browser.until("the role shown", "return document.getElementById('who').textContent === 'viewer · read only'").await?;
    browser.client.find(Locator::Css(&row("orders", "name"))).await?.click().await?;
    browser.until("the poison row", "return document.querySelectorAll('#poison tbody tr').length === 1").await?;
    // Every control that changes something is on the page but not shown; what only reads is.
    let shown = |id: &str| format!("return (e => !!e && e.getClientRects().length > 0)(document.querySelector('{id}'))");
    for control in ["#pause", "#resume", "#requeue-selected", "#requeue-all", "#purge", "#purge-confirm", "#poison tbody button.requeue-one"] {
        ensure!(browser.script(&shown(control)).await? == json!(false), "{control} is shown to a read token");
    }
    for control in ["#poison-refresh", "#poison tbody td.body", "#queues tbody tr"] {
        ensure!(browser.script(&shown(control)).await? == json!(true), "{control} is hidden from a read token");
    }
    // The page's own fetch, with the token it holds, is refused by the host.
    let answer = browser
        .script(
            "const token = sessionStorage.getItem('ebb-token'); \
             return fetch('/queues/orders/pause', { method: 'POST', headers: { authorization: 'Bearer ' + token } }).then(r => r.status)",
        )
        .await?;
    ensure!(answer == json!(403), "a read token's pause from the page: {answer}");
    ensure!(host.queue_status("orders").await?["paused"].is_null(), "the read token paused the queue");
    ensure!(app.handled().is_empty(), "nothing was requeued: {:?}", app.handled());
    // A 403 in the log is the one the test caused.
    let errors: Vec<String> = browser.errors().await?.into_iter().filter(|m| !m.contains("403")).collect();
    ensure!(errors.is_empty(), "the browser logged errors: {errors:?}");
    browser.close().await
}

/// The host's CPU time so far (user + system), from `/proc`.
fn cpu_time(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name (which may hold spaces) start after its ')'.
    let fields: Vec<&str> = stat.rsplit_once(')').context("a /proc stat without ')'")?.1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf has no precondition.
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Ok(Duration::from_millis(ticks * 1000 / per_sec.max(1)))
}

/// The host's CPU use over `window`, in % of one core.
async fn cpu_percent(pid: u32, window: Duration) -> Result<f64> {
    let before = cpu_time(pid)?;
    tokio::time::sleep(window).await;
    Ok((cpu_time(pid)? - before).as_secs_f64() / window.as_secs_f64() * 100.0)
}

impl Browser {
    /// Loads the page with the token already in the tab and waits for `rows` rows; returns
    /// (first paint, first contentful paint, the page's clock once all rows are there) in ms.
    async fn load(&self, host: &Host, rows: usize) -> Result<(f64, f64, f64)> {
        self.client.goto(&host.url("/")).await?;
        self.until("the rows", &format!("return document.querySelectorAll('#queues tbody tr').length === {rows}")).await?;
        let paint = self
            .script(
                "const p = Object.fromEntries(performance.getEntriesByType('paint').map(e => [e.name, e.startTime]));
                 return [p['first-paint'], p['first-contentful-paint'], performance.now()]",
            )
            .await?;
        Ok((paint[0].as_f64().unwrap_or(f64::NAN), paint[1].as_f64().unwrap_or(f64::NAN), paint[2].as_f64().unwrap_or(f64::NAN)))
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The console's goals: page weight, first paint, host CPU with the page open at idle (vs
/// closed, same run), and 1,000 queues (time to render, longest main-thread task while
/// updates flow, host CPU). Prints JSON. Run by hand (it takes about 5 minutes):
/// `cargo test -p ebb-tests --test all console::console_goals -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand (docs/benchmarks.md)"]
async fn console_goals() -> Result<()> {
    let window = Duration::from_secs(std::env::var("EBB_CONSOLE_WINDOW_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60));
    let (_app, app_addr) = App::start(Duration::ZERO).await;
    let handler = format!("handler = {{ url = \"http://{app_addr}/work\" }}\n");
    let host = Host::start(&format!("[queues.orders]\n{handler}\n[queues.emails]\n{handler}\n[queues.invoices]\n{handler}")).await?;
    let mut weight = 0;
    for path in ["/", "/console/app.js", "/console/app.css"] {
        weight += reqwest::get(host.url(path)).await?.bytes().await?.len();
    }
    let browser = Browser::start().await?;
    browser.open(&host).await?;
    let (mut first_paint, mut contentful, mut rows_ms) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..7 {
        let (fp, fcp, rows) = browser.load(&host, 3).await?;
        first_paint.push(fp);
        contentful.push(fcp);
        rows_ms.push(rows);
    }
    // Idle CPU: the page closed (a blank tab), then open, the same host in the same run.
    let pid = host.child.id();
    browser.client.goto("about:blank").await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let closed = cpu_percent(pid, window).await?;
    browser.load(&host, 3).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let open = cpu_percent(pid, window).await?;
    drop(host);

    // 1,000 queues, push-driven so that idle queues run no task.
    let queues: String = (0..1000).map(|i| format!("[queues.q{i:04}]\npush = true\nmin_tasks = 0\n{handler}\n")).collect();
    let started = Instant::now();
    let big = Host::start(&queues).await?;
    let host_start_s = started.elapsed().as_secs_f64();
    let hello_bytes = {
        let mut response = reqwest::Client::new().get(big.url("/events")).bearer_auth(TOKEN).send().await?;
        let mut hello = Vec::new();
        while let Some(chunk) = response.chunk().await? {
            hello.extend_from_slice(&chunk);
            if hello.windows(2).any(|w| w == b"\n\n") {
                break;
            }
        }
        hello.len()
    };
    // The token is kept per origin: give it to this host's page, then time a fresh load.
    browser.client.goto(&big.url("/")).await?;
    browser.script(&format!("sessionStorage.setItem('ebb-token', {}); return null", json!(TOKEN))).await?;
    let load_started = Instant::now();
    browser.client.goto(&big.url("/")).await?;
    browser.until("1,000 rows", "return document.querySelectorAll('#queues tbody tr').length === 1000").await?;
    let render_1000_ms = load_started.elapsed().as_secs_f64() * 1000.0;
    browser
        .script("window.__longest = 0; new PerformanceObserver(l => { for (const e of l.getEntries()) window.__longest = Math.max(window.__longest, e.duration); }).observe({ type: 'longtask', buffered: true }); return null")
        .await?;
    let big_pid = big.child.id();
    // Traffic on 100 of the queues while the page watches.
    let sender = {
        let url = big.url("");
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            for n in 0..3000 {
                let _ = client.post(format!("{url}/queues/q{:04}/messages", n % 100)).bearer_auth(TOKEN).body("x").send().await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let busy_open = cpu_percent(big_pid, Duration::from_secs(30)).await?;
    sender.abort();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let longest_task_ms = browser.script("return window.__longest").await?;
    let idle_open_1000 = cpu_percent(big_pid, window).await?;
    browser.client.goto("about:blank").await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_closed_1000 = cpu_percent(big_pid, window).await?;
    let healthz = {
        let started = Instant::now();
        reqwest::get(big.url("/healthz")).await?;
        started.elapsed().as_secs_f64() * 1000.0
    };
    let figures = json!({
        "page_weight_bytes": weight,
        "first_paint_ms_median_of_7": median(first_paint),
        "first_contentful_paint_ms_median_of_7": median(contentful),
        "three_queues": { "host_cpu_pct_page_closed": closed, "host_cpu_pct_page_open": open, "window_s": window.as_secs() },
        "thousand_queues": {
            "host_start_s": host_start_s,
            "hello_event_bytes": hello_bytes,
            "render_ms": render_1000_ms,
            "longest_main_thread_task_ms": longest_task_ms,
            "host_cpu_pct_traffic_page_open": busy_open,
            "host_cpu_pct_idle_page_open": idle_open_1000,
            "host_cpu_pct_idle_page_closed": idle_closed_1000,
            "healthz_ms_after": healthz,
        },
    });
    println!("{}", serde_json::to_string_pretty(&figures)?);
    browser.close().await
}

/// Phone width (issue 38's at 390 px) and a laptop's.
const WIDTHS: [u32; 2] = [1280, 390];

impl Browser {
    /// Sets the window to `width` px wide (and a screen's height for it).
    async fn at_width(&self, width: u32) -> Result<()> {
        let height = if width < 600 { 844 } else { 900 };
        self.client.set_window_size(width, height).await?;
        Ok(())
    }

    /// Saves the page as `NAME-WIDTH.png` in `console-screenshots/` beside the test binary's
    /// target folder: the artefacts a reviewer looks at.
    async fn keep_screenshot(&self, name: &str, width: u32) -> Result<()> {
        let dir = std::path::Path::new(EBB).parent().and_then(std::path::Path::parent).context("no target folder")?.join("console-screenshots");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{name}-{width}.png"));
        std::fs::write(&path, self.client.screenshot().await?).with_context(|| format!("failed to write {}", path.display()))
    }

    /// Whether the element at `css` is shown and lies within the window's width (no sideways
    /// scrolling needed to see it).
    async fn in_view(&self, css: &str) -> Result<bool> {
        let script = format!(
            "const e = document.querySelector({}); if (!e) return false; const r = e.getBoundingClientRect(); \
             return e.getClientRects().length > 0 && r.left >= 0 && r.right <= window.innerWidth",
            json!(css)
        );
        Ok(self.script(&script).await? == json!(true))
    }
}

/// A port nothing listens on: storage there refuses every connection.
fn refused_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_points_at_poison_pauses_faulting_rules_and_unready_storage_at_1280_and_390_px() -> Result<()> {
    let (_app, app_addr) = App::start(Duration::ZERO).await;
    let handler = format!("handler = {{ url = \"http://{app_addr}/work\" }}\n");
    let storage = ebb_tests::azurite::Azurite::connection_string_for(refused_port()?);
    // A rule that traps at every call, never quarantined: it keeps faulting.
    let queues = format!(
        "[rule_limits]\nquarantine_after = 0\n\n\
         [queues.orders]\nmax_dequeue_count = 1\nmax_polling_interval = \"1s\"\n{handler}\n\
         [queues.emails]\n{handler}\n\
         [queues.invoices]\npartitions = 2\n{handler}\n\
         [queues.reports]\nrule = \"trap.wasm\"\nmax_polling_interval = \"1s\"\n{handler}\n\
         [queues.archive]\nbackend = \"azure\"\n{handler}[queues.archive.azure]\nconnection_string = \"{storage}\"\n"
    );
    let host = Host::start_with_env(&format!("token = \"{TOKEN}\"\n"), &queues, &[]).await?;
    host.send("orders", "poison one").await?;
    host.send("orders", "poison two").await?;
    wait_until("both messages poisoned", || async { host.queue_status("orders").await.is_ok_and(|q| q["poisoned"] == 2) }).await;

    let browser = Browser::start().await?;
    for (i, width) in WIDTHS.into_iter().enumerate() {
        browser.at_width(width).await?;
        if i == 0 {
            browser.open(&host).await?;
            browser.until("the empty audit log to say so", "return document.querySelector('#audit tbody').textContent === 'No operator action yet.'").await?;
            reqwest::Client::new().post(host.url("/queues/emails/pause")).bearer_auth(TOKEN).send().await?.error_for_status()?;
        } else {
            // The page without the poison link's fragment (the token stays in the tab).
            browser.client.goto(&host.url("/")).await?;
            browser.until("the queue table", "return document.querySelectorAll('#queues tbody tr').length > 0").await?;
        }
        // Five logical queues (invoices has two partitions), grouped.
        browser.until("five queues in the header", "return document.getElementById('queue-count').textContent.startsWith('5 ')").await?;
        ensure!(browser.text("#queue-count").await?.contains("6 partitions"), "the header: {}", browser.text("#queue-count").await?);
        let group = "tr.group[data-logical=\"invoices\"]";
        ensure!(browser.in_view(&format!("{group} td.name")).await?, "no group row of invoices at {width} px");
        ensure!(!browser.in_view("tr[data-queue=\"invoices-0\"] td.name").await?, "a partition shown before its queue was expanded at {width} px");
        browser.script(&format!("document.querySelector('{group} button.expand').click(); return null")).await?;
        browser.until("the partitions shown", "return document.querySelector('tr[data-queue=\"invoices-1\"]').getClientRects().length > 0").await?;

        // Each trouble is in its row, in view without scrolling sideways.
        let poison = "tr[data-queue=\"orders\"] a.trouble.poison";
        browser.until("the poison count of orders", &format!("return document.querySelector('{poison}')?.textContent === '2 poisoned'")).await?;
        ensure!(browser.in_view(poison).await?, "the poison count is out of view at {width} px");
        let href = browser.script(&format!("return document.querySelector('{poison}').getAttribute('href')")).await?;
        ensure!(href == json!("#poison/orders"), "the poison link's target: {href}");
        for (queue, trouble) in [("emails", "paused"), ("reports", "rule faulting"), ("archive", "storage not ready")] {
            let css = format!("tr[data-queue=\"{queue}\"] .trouble");
            browser
                .until(
                    &format!("{queue} to say {trouble}"),
                    &format!("return [...document.querySelectorAll('{css}')].some(t => t.textContent.startsWith({}))", json!(trouble)),
                )
                .await?;
            ensure!(browser.in_view(&css).await?, "{queue}'s trouble is out of view at {width} px");
        }
        browser.script("window.scrollTo(0, 0); return null").await?;
        browser.keep_screenshot("overview-trouble", width).await?;
        // A queue whose storage never answered has made no decision: its list says so.
        browser.script("document.querySelector('tr[data-queue=\"archive\"] td.name').click(); return null").await?;
        browser.until("the empty decisions to say so", "return document.querySelector('#decisions tbody').textContent === 'No decision yet.'").await?;
        // The poison link opens the queue's poison list.
        browser.script(&format!("document.querySelector('{poison}').click(); return null")).await?;
        browser.until("the poison list of orders", "return document.querySelectorAll('#poison tbody tr').length === 2").await?;
        ensure!(browser.text("#detail-title").await?.starts_with("orders"), "the link opened {}", browser.text("#detail-title").await?);
        browser.keep_screenshot("poison-link", width).await?;

        // A filter that matches nothing says so.
        browser.script("const f = document.getElementById('filter'); f.value = 'zzz'; f.dispatchEvent(new Event('input')); return null").await?;
        browser.until("the filter's note", "return document.getElementById('filter-empty').textContent === 'No queue matches \"zzz\".'").await?;
        ensure!(browser.in_view("#filter-empty").await?, "the filter's note is hidden at {width} px");
        browser.keep_screenshot("overview-filter", width).await?;
        browser.script("const f = document.getElementById('filter'); f.value = ''; f.dispatchEvent(new Event('input')); return null").await?;
    }
    let errors: Vec<String> = browser.errors().await?.into_iter().filter(|m| !m.contains("401")).collect();
    ensure!(errors.is_empty(), "the browser logged errors: {errors:?}\nhost log:\n{}", host.log());
    browser.close().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_says_in_words_when_the_token_is_wrong_or_the_host_is_down_at_1280_and_390_px() -> Result<()> {
    let (_app, app_addr) = App::start(Duration::ZERO).await;
    for width in WIDTHS {
        let host = Host::start(&format!("[queues.orders]\nhandler = {{ url = \"http://{app_addr}/work\" }}\n")).await?;
        let browser = Browser::start().await?;
        browser.at_width(width).await?;
        browser.client.goto(&host.url("/")).await?;
        browser.until("the chip to ask for a token", "return document.getElementById('link').textContent === 'needs a token'").await?;
        ensure!(browser.in_view("#link").await?, "the connection chip is out of view at {width} px");
        browser.client.wait().for_element(Locator::Css("#login:not([hidden]) #token")).await?.send_keys("wrong").await?;
        browser.client.find(Locator::Css("#login-form button")).await?.click().await?;
        browser.until("the refusal", "return document.getElementById('login-error').textContent === 'That token was refused.'").await?;
        ensure!(browser.text("#link").await? == "needs a token", "the chip after a wrong token: {}", browser.text("#link").await?);
        browser.keep_screenshot("token-refused", width).await?;
        browser.open_as(&host, TOKEN).await?;
        browser.until("the chip to say live", "return document.getElementById('link').textContent === 'live'").await?;
        browser.script("document.querySelector('tr[data-queue=\"orders\"] td.name').click(); return null").await?;
        browser.until("the detail", "return !document.getElementById('detail').hidden").await?;

        // A timed pause ends by itself: the audit log says so as it says a manual resume.
        reqwest::Client::new().post(host.url("/queues/orders/pause?for=1s")).bearer_auth(TOKEN).send().await?.error_for_status()?;
        browser
            .until(
                "the audit log to show the timed resume",
                "return [...document.querySelectorAll('#audit tbody tr')].map(r => [...r.cells].slice(1, 3).map(c => c.textContent).join(' ')).join() === 'timer resume,default pause'",
            )
            .await?;

        drop(host);
        browser
            .until("the page to say the host is down", "return document.getElementById('down').textContent.startsWith('The host does not answer since ')")
            .await?;
        ensure!(browser.in_view("#down").await?, "the host-down note is out of view at {width} px");
        ensure!(browser.text("#link").await? == "host down", "the chip: {}", browser.text("#link").await?);
        let opacity = browser.script("return Number(getComputedStyle(document.querySelector('#queues tbody')).opacity)").await?;
        ensure!(opacity.as_f64().is_some_and(|o| o < 1.0), "the stale figures are not greyed: opacity {opacity}");
        // An action tried meanwhile says why it failed in words.
        browser.script("document.getElementById('poison-refresh').click(); return null").await?;
        // Read where it is waited for: the toast hides itself after a while.
        browser
            .until("the toast saying the host does not answer", "return document.getElementById('toast').textContent.startsWith('The host does not answer')")
            .await?;
        let page = browser.script("return document.body.innerText").await?;
        ensure!(!page.as_str().unwrap_or_default().contains("Failed to fetch"), "the page says 'Failed to fetch': {page}");
        browser.keep_screenshot("host-down", width).await?;
        browser.close().await?;
    }
    Ok(())
}

/// The elements at `css` that are shown but reach past the window's sides (sideways
/// scrolling needed to see them), named by id, class or text.
const OUT_OF_VIEW: &str = "return [...document.querySelectorAll(arguments[0])].filter(e => e.getClientRects().length > 0) \
     .filter(e => { const r = e.getBoundingClientRect(); return r.left < 0 || r.right > window.innerWidth; }) \
     .map(e => e.id || e.className || e.textContent)";

impl Browser {
    /// [`OUT_OF_VIEW`] of `css`.
    async fn out_of_view(&self, css: &str) -> Result<Vec<String>> {
        Ok(serde_json::from_value(self.client.execute(OUT_OF_VIEW, vec![json!(css)]).await?)?)
    }

    /// Clicks the first element at `css` (through the page: it may be under the sticky header).
    async fn click(&self, css: &str) -> Result<()> {
        self.client.execute("document.querySelector(arguments[0]).click(); return null", vec![json!(css)]).await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_detail_chart_has_clock_times_units_on_separate_axes_and_says_no_pickups_at_1280_and_390_px() -> Result<()> {
    let (_app, app_addr) = App::start(Duration::ZERO).await;
    let handler = format!("handler = {{ url = \"http://{app_addr}/work\" }}\n");
    let started = Instant::now();
    let host = Host::start(&format!("[queues.orders]\nmax_polling_interval = \"1s\"\n{handler}\n[queues.emails]\n{handler}")).await?;
    let browser = Browser::start().await?;
    for (i, width) in WIDTHS.into_iter().enumerate() {
        browser.at_width(width).await?;
        if i == 0 {
            browser.open(&host).await?;
        }
        // emails never had a message: its pickup latency says so, not a zero.
        browser.click(&row("emails", "name")).await?;
        browser.until("four panels", "return document.querySelectorAll('#detail-chart svg g.panel').length === 4").await?;
        browser
            .until(
                "clock times on every panel's time axis",
                "return [...document.querySelectorAll('#detail-chart g.panel')].every(g => [...g.querySelectorAll('text.x')].filter(t => /^\\d{1,2}:\\d{2}/.test(t.textContent)).length >= 2)",
            )
            .await?;
        let titles: Vec<String> =
            serde_json::from_value(browser.script("return [...document.querySelectorAll('#detail-chart text.title')].map(t => t.textContent)").await?)?;
        for (title, (name, unit)) in titles.iter().zip([("Depth", "messages"), ("Throughput", "msg/s"), ("Pickup latency", "ms"), ("Dequeue tasks", "tasks")]) {
            ensure!(title.starts_with(&format!("{name} ({unit})")), "a panel's title without its unit at {width} px: {title}");
        }
        ensure!(titles.len() == 4 && titles[2].ends_with("now no pickups"), "an idle queue's pickup latency at {width} px: {titles:?}");
        ensure!(
            browser.script("return document.querySelector('#detail-chart text.none')?.textContent").await? == json!("no pickups"),
            "the idle pickup panel says nothing at {width} px"
        );
        ensure!(browser.text(&row("emails", "pickup")).await? == "no pickups", "the idle row's pickup at {width} px");
        // Each panel has its own value axis (0, half, top), not one grid for four scales.
        let axes = browser.script("return [...document.querySelectorAll('#detail-chart g.panel')].map(g => g.querySelectorAll('text.y').length)").await?;
        ensure!(axes == json!([3, 3, 3, 3]), "value labels per panel at {width} px: {axes}");
        // The chart says the window it holds: the host started moments ago, not an hour.
        let window = browser.text("#chart-window").await?;
        let held = window.strip_prefix("Last ").and_then(|w| w.split(':').next()).with_context(|| format!("the window: {window}"))?;
        let (n, unit) = held.split_once(' ').with_context(|| format!("the window: {window}"))?;
        let held_s = n.parse::<u64>()? * if unit == "min" { 60 } else { 1 };
        ensure!(unit == "s" || unit == "min", "the window's unit: {window}");
        ensure!(held_s <= started.elapsed().as_secs() + 60, "the chart says it holds {window}, the host is {:?} old", started.elapsed());
        let sparks = browser.text("#spark-window").await?;
        ensure!(!sparks.contains("hour"), "the rows' charts say they hold {sparks}");
        // No label is cut: each lies inside the chart and the window.
        let cut = browser
            .script(
                "const s = document.querySelector('#detail-chart svg').getBoundingClientRect(); \
                 return [...document.querySelectorAll('#detail-chart text')].filter(t => { const r = t.getBoundingClientRect(); \
                 return r.left < s.left - 1 || r.right > s.right + 1 || r.top < s.top - 1 || r.bottom > s.bottom + 1 || r.left < 0 || r.right > window.innerWidth; }).map(t => t.textContent)",
            )
            .await?;
        ensure!(cut == json!([]), "labels cut at {width} px: {cut}");
        browser.script("document.getElementById('detail').scrollIntoView(); return null").await?;
        browser.keep_screenshot("chart-idle", width).await?;

        // Messages flow, then stop: the pickup latency is shown while they flow, then says
        // "no pickups" again (the last value is not carried forward).
        browser.click(&row("orders", "name")).await?;
        if i == 0 {
            for n in 0..30 {
                host.send("orders", &format!("message {n}")).await?;
            }
            browser
                .until("a pickup latency on the orders row", &format!("return /\\d/.test(document.querySelector('{}').textContent)", row("orders", "pickup")))
                .await?;
        }
        browser
            .until(
                "the orders row to say no pickups once they stopped",
                &format!("return document.querySelector('{}').textContent === 'no pickups'", row("orders", "pickup")),
            )
            .await?;
        browser
            .until(
                "the pickups drawn where they were",
                "return document.querySelectorAll('#detail-chart g.panel')[2].querySelectorAll('path, circle').length > 0",
            )
            .await?;
        let pickup = browser.script("return document.querySelectorAll('#detail-chart text.title')[2].textContent").await?;
        ensure!(pickup.as_str().is_some_and(|t| t.ends_with("now no pickups")), "the pickup panel after the traffic at {width} px: {pickup}");
        browser.script("document.getElementById('detail').scrollIntoView(); return null").await?;
        browser.keep_screenshot("chart-traffic", width).await?;
    }
    let errors: Vec<String> = browser.errors().await?.into_iter().filter(|m| !m.contains("401")).collect();
    ensure!(errors.is_empty(), "the browser logged errors: {errors:?}\nhost log:\n{}", host.log());
    browser.close().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_state_button_and_poison_body_is_reached_without_scrolling_sideways_at_1280_and_390_px() -> Result<()> {
    let (_app, app_addr) = App::start(Duration::ZERO).await;
    let handler = format!("handler = {{ url = \"http://{app_addr}/work\" }}\n");
    let queues = format!(
        "[queues.orders]\nmax_dequeue_count = 1\nmax_polling_interval = \"1s\"\nrule = \"paper.wasm\"\n{handler}\n\
         [queues.emails]\n{handler}\n[queues.invoices]\npartitions = 2\n{handler}"
    );
    let host = Host::start(&queues).await?;
    host.send("orders", "poison: a long body that does not fit a phone's width, 0123456789012345678901234567890123456789").await?;
    host.send("orders", "poison two").await?;
    wait_until("both messages poisoned", || async { host.queue_status("orders").await.is_ok_and(|q| q["poisoned"] == 2) }).await;
    reqwest::Client::new().post(host.url("/queues/emails/pause")).bearer_auth(TOKEN).send().await?.error_for_status()?;
    let browser = Browser::start().await?;
    for (i, width) in WIDTHS.into_iter().enumerate() {
        browser.at_width(width).await?;
        if i == 0 {
            browser.open(&host).await?;
        } else {
            browser.client.goto(&host.url("/")).await?;
            browser.until("the queue table", "return document.querySelectorAll('#queues tbody tr').length > 0").await?;
        }
        browser.click("tr.group[data-logical=\"invoices\"] button.expand").await?;
        browser.until("the partitions shown", "return document.querySelector('tr[data-queue=\"invoices-1\"]').getClientRects().length > 0").await?;
        browser.until("the paused emails", &format!("return document.querySelector('{}').textContent === 'paused'", row("emails", "state"))).await?;
        let header = browser.script("return document.querySelector('header').getBoundingClientRect().height / window.innerHeight").await?;
        ensure!(header.as_f64().is_some_and(|h| h <= 0.2), "the sticky header takes {header} of the screen's height at {width} px");
        let wide = browser.script("return [document.documentElement.scrollWidth, window.innerWidth]").await?;
        ensure!(wide[0].as_f64() <= wide[1].as_f64(), "the page scrolls sideways at {width} px: {wide}");
        let out = browser.out_of_view("#queues td.state, #queues td.name, #queues .trouble, #queues button, #queues td.pickup").await?;
        ensure!(out.is_empty(), "out of view at {width} px: {out:?}");
        browser.script("window.scrollTo(0, 0); return null").await?;
        browser.keep_screenshot("layout-overview", width).await?;

        browser.click(&row("orders", "name")).await?;
        browser.until("two poison rows", "return document.querySelectorAll('#poison tbody td.body').length === 2").await?;
        browser
            .until(
                "the rule and decisions",
                "return document.querySelectorAll('#rule dd').length > 0 && document.querySelectorAll('#decisions tbody td').length > 0",
            )
            .await?;
        let out =
            browser.out_of_view("#detail button, #detail input, #poison td.body, #poison td, #detail-chart text, #decisions td, #swaps td, #audit td").await?;
        ensure!(out.is_empty(), "out of view in the detail at {width} px: {out:?}");
        let wide = browser.script("return [document.documentElement.scrollWidth, window.innerWidth]").await?;
        ensure!(wide[0].as_f64() <= wide[1].as_f64(), "the detail scrolls sideways at {width} px: {wide}");
        // Scrolled to the poison list, the sticky header still leaves the screen to it.
        browser.script("document.getElementById('poison').scrollIntoView(); return null").await?;
        let header = browser.script("return document.querySelector('header').getBoundingClientRect().height / window.innerHeight").await?;
        ensure!(header.as_f64().is_some_and(|h| h <= 0.2), "the sticky header takes {header} of the screen's height at {width} px");
        ensure!(browser.in_view("#poison button.requeue-one").await?, "a requeue button is out of view at {width} px");
        browser.keep_screenshot("layout-poison", width).await?;
    }
    let errors: Vec<String> = browser.errors().await?.into_iter().filter(|m| !m.contains("401")).collect();
    ensure!(errors.is_empty(), "the browser logged errors: {errors:?}\nhost log:\n{}", host.log());
    browser.close().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poison_list_follows_the_stream_newest_first_and_requeue_all_asks_naming_the_count_at_1280_and_390_px() -> Result<()> {
    let (app, app_addr) = App::start(Duration::ZERO).await;
    let handler = format!("handler = {{ url = \"http://{app_addr}/work\" }}\n");
    let queues = format!("[queues.orders]\nmax_dequeue_count = 1\nmax_polling_interval = \"1s\"\n{handler}\n[queues.invoices]\npartitions = 2\n{handler}");
    let host = Host::start(&queues).await?;
    let browser = Browser::start().await?;
    let mut poisoned = 0;
    for (i, width) in WIDTHS.into_iter().enumerate() {
        app.healed.store(false, Ordering::Relaxed);
        let first = format!("poison 1 at {width}");
        host.send("orders", &first).await?;
        poisoned += 1;
        wait_until("the first poisoned", || async { host.queue_status("orders").await.is_ok_and(|q| q["poisoned"] == poisoned) }).await;
        browser.at_width(width).await?;
        if i == 0 {
            browser.open(&host).await?;
        }
        browser.click(&row("orders", "name")).await?;
        browser.until("one poison row", "return document.querySelectorAll('#poison tbody td.body').length === 1").await?;

        // Two more are poisoned while the list is open: it shows them without a click.
        for n in [2, 3] {
            host.send("orders", &format!("poison {n} at {width}")).await?;
            poisoned += 1;
            wait_until("the next poisoned", || async { host.queue_status("orders").await.is_ok_and(|q| q["poisoned"] == poisoned) }).await;
        }
        browser.until("three poison rows, with no click", "return document.querySelectorAll('#poison tbody td.body').length === 3").await?;
        let bodies: Vec<String> =
            serde_json::from_value(browser.script("return [...document.querySelectorAll('#poison tbody td.body')].map(t => t.textContent)").await?)?;
        ensure!(bodies == [3, 2, 1].map(|n| format!("poison {n} at {width}")), "the list is not newest first at {width} px: {bodies:?}");
        ensure!(browser.text("#poison-note").await?.contains("newest first"), "the note: {}", browser.text("#poison-note").await?);

        // Requeue all asks first, naming the count; nothing moves until confirmed.
        browser.click("#requeue-all").await?;
        browser.until("the question", "return !document.getElementById('requeue-all-ask').hidden").await?;
        let ask = browser.text("#requeue-all-text").await?;
        ensure!(ask.contains("all 3 poison messages of orders"), "the question at {width} px: {ask}");
        ensure!(browser.text("#requeue-all-yes").await? == "Requeue 3", "the confirming button: {}", browser.text("#requeue-all-yes").await?);
        ensure!(
            browser.in_view("#requeue-all-yes").await? && browser.in_view("#requeue-all-no").await?,
            "the question's buttons are out of view at {width} px"
        );
        browser.script("document.getElementById('requeue-all-ask').scrollIntoView({ block: 'center' }); return null").await?;
        browser.keep_screenshot("requeue-all-ask", width).await?;
        browser.click("#requeue-all-no").await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let listed = host.get("/queues/orders/poison").await?["messages"].as_array().map_or(0, Vec::len);
        ensure!(listed == 3, "cancel moved messages: {listed} left");
        ensure!(browser.script("return document.getElementById('requeue-all-ask').hidden").await? == json!(true), "the question stayed");
        app.healed.store(true, Ordering::Relaxed);
        browser.click("#requeue-all").await?;
        browser.click("#requeue-all-yes").await?;
        wait_until("the requeued messages handled", || async { app.handled().iter().filter(|b| b.ends_with(&format!(" at {width}"))).count() == 3 }).await;
        browser.until("the emptied list to say so", "return document.querySelector('#poison tbody').textContent === 'No poison message.'").await?;

        // A partition's detail pauses its whole queue, and says so.
        browser.click("tr.group[data-logical=\"invoices\"] button.expand").await?;
        browser.click(&row("invoices-1", "name")).await?;
        browser.until("the pause of all partitions", "return document.getElementById('pause').textContent === 'Pause all 2 partitions'").await?;
        ensure!(browser.text("#pause-scope").await?.contains("invoices as a whole"), "the scope: {}", browser.text("#pause-scope").await?);
        browser.click("#pause").await?;
        for part in ["invoices-0", "invoices-1"] {
            browser.until(&format!("{part} paused"), &format!("return document.querySelector('{}').textContent === 'paused'", row(part, "state"))).await?;
        }
        browser.script("window.scrollTo(0, 0); return null").await?;
        browser.keep_screenshot("partition-pause", width).await?;
        browser.click("#resume").await?;
        browser.until("invoices running", &format!("return document.querySelector('{}').textContent === 'running'", row("invoices-0", "state"))).await?;
        browser.click("tr.group[data-logical=\"invoices\"] button.expand").await?;
    }
    let errors: Vec<String> = browser.errors().await?.into_iter().filter(|m| !m.contains("401")).collect();
    ensure!(errors.is_empty(), "the browser logged errors: {errors:?}\nhost log:\n{}", host.log());
    browser.close().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_counts_a_paused_partitioned_queue_once_as_it_counts_queues_at_1280_and_390_px() -> Result<()> {
    let (_app, app_addr) = App::start(Duration::ZERO).await;
    let handler = format!("handler = {{ url = \"http://{app_addr}/work\" }}\n");
    let host = Host::start(&format!("[queues.orders]\n{handler}\n[queues.invoices]\npartitions = 3\n{handler}")).await?;
    // A queue is paused whole: its three partitions are paused.
    reqwest::Client::new().post(host.url("/queues/invoices/pause")).bearer_auth(TOKEN).send().await?.error_for_status()?;
    let browser = Browser::start().await?;
    for (i, width) in WIDTHS.into_iter().enumerate() {
        browser.at_width(width).await?;
        if i == 0 {
            browser.open(&host).await?;
        }
        browser.until("the pause in the header", "return document.getElementById('queue-count').textContent.includes('paused')").await?;
        let header = browser.text("#queue-count").await?;
        ensure!(header == "2 (4 partitions), 1 paused", "the header at {width} px: {header}");
        ensure!(browser.in_view("#queue-count").await?, "the header's count is out of view at {width} px");
        browser.keep_screenshot("header-paused", width).await?;
    }
    browser.close().await
}
