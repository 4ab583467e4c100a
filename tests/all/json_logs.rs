//! JSON logs through the binary (issue 39, item 1): with `EBB_LOG_FORMAT=json` or
//! `[log] format = "json"`, every line `ebb run` writes to stderr is one JSON object, the
//! listener's lines carry their span (the queue), a failing handler's error and a fatal
//! multi-line config error stay one line each, and so do a TOML syntax error under the file's
//! `[log] format`, a refused command line and a panic whatever the filter; a bad format is a
//! config error.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use ebb_raw_http::{get, raw, request};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::binary::EBB;

const TOKEN: &str = "t0ken";

/// The variables of the log, removed so that the caller's environment does not choose.
const LOG_VARIABLES: [&str; 4] = ["RUST_LOG", "EBB_LOG", "EBB_LOG_FORMAT", "EBB_API_TOKEN"];

/// A handler app that fails every message with an answer of two lines.
async fn failing_app() -> Result<SocketAddr> {
    let app = TcpListener::bind("127.0.0.1:0").await?;
    let addr = app.local_addr()?;
    let router =
        axum::Router::new().route("/work", axum::routing::post(|| async { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "first line\nsecond line") }));
    tokio::spawn(async move { axum::serve(app, router).await });
    Ok(addr)
}

/// Every line of `log`, each parsed as JSON, or the first that is not JSON.
fn json_lines(log: &str) -> Result<Vec<Value>> {
    log.lines().map(|line| serde_json::from_str(line).with_context(|| format!("a stderr line is not JSON: {line:?}\nthe whole log:\n{log}"))).collect()
}

/// `ebb run` with `log_table` in its file and `env` added to a clean environment: one message
/// sent, failed twice by the handler and poisoned, then SIGTERM; its stderr.
async fn run_failing_host(log_table: &str, env: &[(&str, &str)]) -> Result<String> {
    let app = failing_app().await?;
    let host = Host::start(
        &format!("{log_table}\n[queues.orders]\nmax_dequeue_count = 2\nvisibility_timeout = \"100ms\"\nhandler = {{ url = \"http://{app}/work\" }}\n"),
        env,
    )
    .await?;
    let sent = raw(host.api, &request("POST", "/queues/orders/messages", Some(TOKEN), b"hello")).await?;
    ensure!((200..300).contains(&sent.status), "the send was refused: {sent:?}");
    host.wait_for_log("poison queue").await?;
    host.stop()
}

/// An `ebb run` whose stderr goes to a file, its API up.
struct Host {
    child: KillOnDrop,
    api: SocketAddr,
    dir: tempfile::TempDir,
}

impl Host {
    /// `ebb run` on `queues` (text) with an `[api]` table added, and `env` added to a clean
    /// environment; returns once its API answers.
    async fn start(queues: &str, env: &[(&str, &str)]) -> Result<Host> {
        let dir = tempfile::tempdir()?;
        let api: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        std::fs::write(dir.path().join("ebb.toml"), format!("[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n\n{queues}"))?;
        let mut command = Command::new(EBB);
        let stderr = std::fs::File::create(dir.path().join("host.log"))?;
        command.arg("run").arg("--config").arg(dir.path().join("ebb.toml")).current_dir(dir.path()).stdout(Stdio::null()).stderr(stderr);
        for variable in LOG_VARIABLES {
            command.env_remove(variable);
        }
        let mut host = Host { child: KillOnDrop(command.envs(env.iter().copied()).spawn()?), api, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        while raw(api, &get("/healthz", None)).await.map(|a| a.status).ok() != Some(200) {
            if let Some(status) = host.child.0.try_wait()? {
                bail!("ebb run exited with {status}: {}", host.log());
            }
            ensure!(Instant::now() < deadline, "the host's API did not come up: {}", host.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(host)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("host.log")).unwrap_or_default()
    }

    /// Waits up to 60 s for `text` in the log.
    async fn wait_for_log(&self, text: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.log().contains(text) {
            ensure!(Instant::now() < deadline, "no {text:?} in the log: {}", self.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// SIGTERM, a graceful exit expected; the log.
    fn stop(mut self) -> Result<String> {
        ensure!(Command::new("kill").args(["-TERM", &self.child.0.id().to_string()]).status()?.success());
        let status = self.child.0.wait()?;
        ensure!(status.success(), "graceful shutdown exits 0, got {status}: {}", self.log());
        Ok(self.log())
    }
}

/// Kills and reaps the host if a test fails before it stops it.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every line parses, the listener's lines name their queue in their span, and the handler's
/// two-line answer is inside one line.
fn check_json_run(log: &str) -> Result<()> {
    let lines = json_lines(log)?;
    ensure!(lines.len() >= 4, "too few lines:\n{log}");
    for line in &lines {
        for key in ["timestamp", "level", "message", "target"] {
            ensure!(line.get(key).is_some_and(Value::is_string), "no {key} in {line}");
        }
    }
    let failure = lines
        .iter()
        .find(|line| line["message"].as_str().is_some_and(|m| m.starts_with("handler failed")))
        .with_context(|| format!("no handler failure line:\n{log}"))?;
    let message = failure["message"].as_str().unwrap_or_default();
    ensure!(message.contains("first line") && message.contains("second line"), "the handler's answer is not in its failure line: {failure}");
    ensure!(failure["level"] == "WARN" && failure["id"].is_string(), "the failure line has no level or message id: {failure}");
    let spans = failure["spans"].as_array().with_context(|| format!("the failure line has no spans: {failure}"))?;
    ensure!(spans.iter().any(|span| span["queue"] == "orders"), "the failure line's spans do not name the queue: {failure}");
    ensure!(lines.iter().any(|line| line["message"].as_str().is_some_and(|m| m.contains("poison queue"))), "no poison line:\n{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_ebb_log_format_json_every_line_of_a_host_run_is_one_json_object_with_its_spans() -> Result<()> {
    let log = run_failing_host("", &[("EBB_LOG_FORMAT", "json")]).await?;
    check_json_run(&log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_log_format_json_in_the_file_every_line_of_a_host_run_is_one_json_object_from_the_first() -> Result<()> {
    let log = run_failing_host("[log]\nformat = \"json\"\n", &[]).await?;
    check_json_run(&log)?;
    let first: Value = serde_json::from_str(log.lines().next().unwrap_or_default())?;
    ensure!(first["message"] == "API listening", "the first line is in JSON too: {first}");
    Ok(())
}

/// `ebb run` on `config` (text) with `env` added to a clean environment, expected to fail at start.
fn failed_start(config: &str, env: &[(&str, &str)]) -> Result<Output> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("ebb.toml"), config)?;
    let mut command = Command::new(EBB);
    command.arg("run").arg("--config").arg(dir.path().join("ebb.toml")).current_dir(dir.path());
    for variable in LOG_VARIABLES {
        command.env_remove(variable);
    }
    let output = command.envs(env.iter().copied()).output()?;
    ensure!(!output.status.success(), "ebb run should fail on {config}");
    Ok(output)
}

/// Two unquoted `rule_params`: an error of several lines.
const MULTI_LINE_ERROR: &str = "[queues.orders]\nrule_params = { a = 1, b = 2 }\nhandler = { url = \"http://127.0.0.1:8080/work\" }\n";

#[test]
fn a_fatal_multi_line_config_error_in_json_is_one_json_line() -> Result<()> {
    for (log_table, env) in [("", &[("EBB_LOG_FORMAT", "json")][..]), ("[log]\nformat = \"json\"\n", &[][..])] {
        let output = failed_start(&format!("{log_table}{MULTI_LINE_ERROR}"), env)?;
        let stderr = String::from_utf8(output.stderr)?;
        let lines = json_lines(&stderr)?;
        ensure!(lines.len() == 1, "one line expected:\n{stderr}");
        let message = lines[0]["message"].as_str().unwrap_or_default();
        ensure!(lines[0]["level"] == "ERROR" && lines[0]["timestamp"].is_string(), "not an error line: {}", lines[0]);
        ensure!(message.contains("integer)\n  queues.orders.rule_params.b = 2"), "the error's lines are inside its one line: {message:?}");
    }
    Ok(())
}

#[test]
fn ebb_log_format_wins_over_the_file() -> Result<()> {
    let output = failed_start(&format!("[log]\nformat = \"json\"\n{MULTI_LINE_ERROR}"), &[("EBB_LOG_FORMAT", "human")])?;
    let stderr = String::from_utf8(output.stderr)?;
    ensure!(stderr.starts_with("error: invalid config") && serde_json::from_str::<Value>(&stderr).is_err(), "human expected:\n{stderr}");
    Ok(())
}

#[test]
fn a_log_format_other_than_human_or_json_is_a_config_error_naming_log_format() -> Result<()> {
    for command in ["run", "check"] {
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("ebb.toml");
        std::fs::write(&config, "[log]\nformat = \"xml\"\n\n[queues.orders]\nhandler = { url = \"http://127.0.0.1:8080/work\" }\n")?;
        let output = ebb_on(command, &config)?;
        let stderr = String::from_utf8(output.stderr)?;
        ensure!(!output.status.success(), "ebb {command} accepted format = \"xml\"");
        ensure!(stderr.contains("log.format: must be \"human\" or \"json\", got \"xml\""), "ebb {command}: {stderr}");
    }
    Ok(())
}

fn ebb_on(command: &str, config: &Path) -> Result<Output> {
    let mut ebb = Command::new(EBB);
    ebb.arg(command).arg("--config").arg(config);
    for variable in LOG_VARIABLES {
        ebb.env_remove(variable);
    }
    Ok(ebb.output()?)
}

#[test]
fn a_toml_syntax_error_elsewhere_keeps_the_files_json_format_and_is_one_json_line() -> Result<()> {
    for command in ["check", "run"] {
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("ebb.toml");
        std::fs::write(&config, "[log]\nformat=\"json\"\n[queues.a")?;
        let output = ebb_on(command, &config)?;
        let stderr = String::from_utf8(output.stderr)?;
        ensure!(!output.status.success(), "ebb {command} accepted a file that is not TOML");
        let lines = json_lines(&stderr).with_context(|| format!("ebb {command}"))?;
        ensure!(lines.len() == 1, "ebb {command}: one line expected:\n{stderr}");
        let message = lines[0]["message"].as_str().unwrap_or_default();
        ensure!(lines[0]["level"] == "ERROR", "ebb {command}: not an error line: {}", lines[0]);
        ensure!(message.contains("[queues.a") && message.contains('^'), "ebb {command}: toml's caret diagram is inside the one line: {message:?}");
    }
    Ok(())
}

/// `ebb` with `args` and `EBB_LOG_FORMAT=json` in a clean environment.
fn ebb_in_json(args: &[&str]) -> Result<Output> {
    let mut ebb = Command::new(EBB);
    ebb.args(args).stdin(Stdio::null());
    for variable in LOG_VARIABLES {
        ebb.env_remove(variable);
    }
    Ok(ebb.env("EBB_LOG_FORMAT", "json").output()?)
}

#[test]
fn with_ebb_log_format_json_a_command_line_error_is_one_json_line_and_exits_2() -> Result<()> {
    let refused = [
        (&["--bogus"][..], "unexpected argument '--bogus'"),
        (&["send"][..], "the following required arguments were not provided"),
        (&["send", "orders", "hello", "--count", "0"][..], "--count"),
    ];
    for (args, says) in refused {
        let output = ebb_in_json(args)?;
        let stderr = String::from_utf8(output.stderr)?;
        ensure!(output.status.code() == Some(2), "ebb {args:?}: exit 2 expected, got {:?}: {stderr}", output.status);
        let lines = json_lines(&stderr).with_context(|| format!("ebb {args:?}"))?;
        ensure!(lines.len() == 1, "ebb {args:?}: one line expected:\n{stderr}");
        let message = lines[0]["message"].as_str().unwrap_or_default();
        ensure!(lines[0]["level"] == "ERROR" && lines[0]["timestamp"].is_string(), "ebb {args:?}: not an error line: {}", lines[0]);
        ensure!(message.contains(says) && message.ends_with("try '--help'."), "ebb {args:?}: clap's error is the message: {message:?}");
        ensure!(output.stdout.is_empty(), "ebb {args:?} wrote to stdout");
    }
    Ok(())
}

#[test]
fn with_ebb_log_format_json_help_and_version_stay_text_on_stdout() -> Result<()> {
    for (args, says) in [(&["--help"][..], "Usage:"), (&["--version"][..], env!("CARGO_PKG_VERSION"))] {
        let output = ebb_in_json(args)?;
        ensure!(output.status.success() && output.stderr.is_empty(), "ebb {args:?}: {output:?}");
        let stdout = String::from_utf8(output.stdout)?;
        ensure!(stdout.contains(says) && serde_json::from_str::<Value>(&stdout).is_err(), "ebb {args:?}: text expected: {stdout}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_json_is_one_error_line_whatever_the_filter() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let trigger = dir.path().join("panic");
    let trigger_text = trigger.to_str().context("the trigger's path is not UTF-8")?;
    let env = [("EBB_LOG_FORMAT", "json"), ("EBB_LOG", "off"), ("EBB_UNDER_TEST_PANIC_WHEN", trigger_text)];
    let host = Host::start("[queues.orders]\nhandler = { url = \"http://127.0.0.1:9/work\" }\n", &env).await?;
    std::fs::write(&trigger, "")?;
    host.wait_for_log("provoked by the test").await?;
    let log = host.stop()?;
    let lines = json_lines(&log)?;
    ensure!(lines.len() == 1, "the panic alone expected (EBB_LOG=off):\n{log}");
    let panic = &lines[0];
    ensure!(panic["level"] == "ERROR" && panic["message"] == "panicked: provoked by the test", "not the panic's line: {panic}");
    ensure!(
        panic["thread"] == "provoked-panic" && panic["location"].as_str().is_some_and(|l| l.contains("ebb_under_test.rs")),
        "no thread or location: {panic}"
    );
    Ok(())
}
