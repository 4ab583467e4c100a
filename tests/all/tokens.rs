//! Named API tokens through the binary: a `read` token sees every GET route and gets 403 on
//! every other route of the API (read from the router's own table, so a route added later is
//! tried too), an admin token changes things and the audit log names it, a token from a named
//! environment variable works, `GET /whoami` answers the caller, no answer sets a cookie and a
//! cookie is no credential, and the CLI says when its token is a read token.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use ebb_raw_http::{Answer, get, raw, request};
use tokio::net::TcpListener;
use tokio::time::Instant;

const EBB: &str = env!("CARGO_BIN_EXE_ebb-under-test");
/// The admin `default` token, given as `EBB_API_TOKEN`.
const DEFAULT_TOKEN: &str = "d3fault-admin";
/// The read token `viewer`, given through the variable its `token_env` names.
const VIEWER_TOKEN: &str = "v1ewer-read";
const VIEWER_ENV: &str = "EBB_TEST_VIEWER_TOKEN";
/// The admin token `deployer`, written in the file.
const DEPLOYER_TOKEN: &str = "d3ployer-admin";

/// An `ebb run` on a temporary folder with one queue, `orders`, whose handler answers 200.
pub(crate) struct Host {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) api: SocketAddr,
    handler: SocketAddr,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Host {
    /// `api` is the inside of `[api]` after `listen`; `env` is added to a clean environment.
    pub(crate) async fn start(api: &str, env: &[(&str, &str)]) -> Result<Host> {
        Host::start_with(api, "", None, env).await
    }

    /// [`Host::start`] with `queue` added to `[queues.orders]` and `rule` copied to
    /// `rules/orders.wasm`.
    pub(crate) async fn start_with(api: &str, queue: &str, rule: Option<&str>, env: &[(&str, &str)]) -> Result<Host> {
        let app = TcpListener::bind("127.0.0.1:0").await?;
        let handler = app.local_addr()?;
        let router = axum::Router::new().route("/work", axum::routing::post(|| async { "ok" }));
        tokio::spawn(async move { axum::serve(app, router).await });
        let dir = tempfile::tempdir()?;
        let api_addr: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        if let Some(rule) = rule {
            std::fs::create_dir_all(dir.path().join("rules"))?;
            std::fs::copy(rule, dir.path().join("rules/orders.wasm"))?;
        }
        let config = format!("[api]\nlisten = \"{api_addr}\"\n{api}\n\n[queues.orders]\n{queue}\nhandler = {{ url = \"http://{handler}/work\" }}\n");
        std::fs::write(dir.path().join("ebb.toml"), config)?;
        let log = std::fs::File::create(dir.path().join("host.log"))?;
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut command = Command::new(EBB);
        command.arg("run").arg("--config").arg(dir.path().join("ebb.toml")).stdout(Stdio::null()).stderr(log);
        clean_env(&mut command, &env);
        let mut host = Host { child: Some(command.spawn()?), dir, api: api_addr, handler, env };
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

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("host.log")).unwrap_or_default()
    }

    pub(crate) async fn call(&self, method: &str, path: &str, token: Option<&str>) -> Result<Answer> {
        let body: &[u8] = match method {
            // The items route takes an array of items.
            "POST" if path.contains("/items") => b"[{\"order\": 1}]",
            "POST" => b"{\"order\": 1}",
            _ => b"",
        };
        raw(self.api, &request(method, path, token, body)).await.with_context(|| format!("{method} {path}"))
    }

    /// Runs `ebb ARGS` in the host's environment plus `env`.
    fn cli(&self, args: &[&str], config: &Path, env: &[(&str, &str)]) -> Result<Output> {
        let mut command = Command::new(EBB);
        command.args(args).arg("--config").arg(config);
        let mut all = self.env.clone();
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        clean_env(&mut command, &all);
        Ok(command.output()?)
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

/// The environment of a test's `ebb`: none of the caller's token or log variables, then `env`.
fn clean_env(command: &mut Command, env: &[(String, String)]) {
    for variable in ["RUST_LOG", "EBB_LOG", "EBB_API_TOKEN", "EBB_TOKEN_NAME", VIEWER_ENV] {
        command.env_remove(variable);
    }
    command.envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
}

/// The path and query an admin's call to each state-changing route takes to succeed. A route
/// missing here fails the test: a new route must say how it is called.
fn admin_call(method: &str, pattern: &str) -> Option<String> {
    let path = pattern.replace("{name}", "orders");
    let query = match (method, pattern) {
        ("POST", "/queues/{name}/messages" | "/queues/{name}/items" | "/queues/{name}/notify" | "/queues/{name}/pause" | "/queues/{name}/resume") => "",
        // The test's queue has no reply_queue: an admin gets past the gate to the route's 409.
        ("POST", "/queues/{name}/replies/{id}") => return Some("/queues/orders/replies/m1?timeout_ms=1".to_string()),
        ("POST", "/queues/{name}/poison/requeue") => "?all=true",
        ("POST", "/queues/{name}/poison/purge") => "?confirm=orders",
        _ => return None,
    };
    Some(format!("{path}{query}"))
}

fn named_tokens() -> String {
    format!(
        "[[api.tokens]]\nname = \"viewer\"\nrole = \"read\"\ntoken_env = \"{VIEWER_ENV}\"\n\n\
         [[api.tokens]]\nname = \"deployer\"\nrole = \"admin\"\ntoken = \"{DEPLOYER_TOKEN}\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_token_reads_everything_and_changes_nothing_and_the_audit_log_names_the_admin() -> Result<()> {
    let host = Host::start(&named_tokens(), &[("EBB_API_TOKEN", DEFAULT_TOKEN), (VIEWER_ENV, VIEWER_TOKEN)]).await?;
    let routes = ebb::api::authenticated_route_table();
    ensure!(routes.iter().any(|(m, _)| m.as_str() != "GET") && routes.iter().any(|(m, _)| m.as_str() == "GET"), "the table has both kinds: {routes:?}");

    // whoami, for each token; the read token from its environment variable.
    for (token, name, role) in [(VIEWER_TOKEN, "viewer", "read"), (DEPLOYER_TOKEN, "deployer", "admin"), (DEFAULT_TOKEN, "default", "admin")] {
        let answer = host.call("GET", "/whoami", Some(token)).await?;
        ensure!(answer.status == 200, "whoami as {name}: {answer:?}");
        let who: serde_json::Value = serde_json::from_str(&answer.body)?;
        ensure!(who == serde_json::json!({"name": name, "role": role}), "whoami as {name}: {who}");
    }

    let mut forbidden = 0;
    for (method, pattern) in &routes {
        let method = method.as_str();
        if method == "GET" {
            let path = pattern.replace("{name}", "orders");
            let answer = host.call(method, &path, Some(VIEWER_TOKEN)).await?;
            ensure!(answer.status == 200, "the read token may GET {path}: {answer:?}");
            continue;
        }
        let path = admin_call(method, pattern).with_context(|| format!("{method} {pattern} is new: add to admin_call how an admin calls it"))?;
        let answer = host.call(method, &path, Some(VIEWER_TOKEN)).await?;
        ensure!(answer.status == 403, "read token, {method} {path}: {answer:?}");
        let expected = format!("token \"viewer\" has role read; {method} {pattern} needs admin");
        ensure!(answer.error()? == expected, "read token, {method} {path}: {:?}, expected {expected:?}", answer.error()?);
        forbidden += 1;
    }
    ensure!(forbidden >= 6, "only {forbidden} state-changing routes were tried");
    let audit: serde_json::Value = serde_json::from_str(&host.call("GET", "/audit", Some(VIEWER_TOKEN)).await?.body)?;
    ensure!(audit["entries"].as_array().is_some_and(Vec::is_empty), "a refused call changes nothing and is not recorded: {audit}");
    let status: serde_json::Value = serde_json::from_str(&host.call("GET", "/status", Some(VIEWER_TOKEN)).await?.body)?;
    ensure!(status.to_string().contains("\"paused\":null"), "the read token's pause did not pause: {status}");

    // Every state-changing route answers an admin with 2xx.
    for (method, pattern) in routes.iter().filter(|(m, _)| m.as_str() != "GET") {
        let path = admin_call(method.as_str(), pattern).unwrap();
        let answer = host.call(method.as_str(), &path, Some(DEPLOYER_TOKEN)).await?;
        if *pattern == "/queues/{name}/replies/{id}" {
            ensure!(answer.status == 409 && answer.error()?.contains("reply"), "admin, {method} {path}: {answer:?}");
            continue;
        }
        ensure!((200..300).contains(&answer.status), "admin, {method} {path}: {answer:?}");
    }
    // The CLI keeps working with EBB_API_TOKEN (the host's config and environment).
    let out = host.cli(&["queue", "pause", "orders"], &host.config(), &[])?;
    ensure!(out.status.success(), "ebb queue pause with EBB_API_TOKEN: {}", String::from_utf8_lossy(&out.stderr));

    let audit: serde_json::Value = serde_json::from_str(&host.call("GET", "/audit", Some(VIEWER_TOKEN)).await?.body)?;
    let actors: Vec<(&str, &str)> =
        audit["entries"].as_array().unwrap().iter().map(|e| (e["actor"].as_str().unwrap_or("?"), e["action"].as_str().unwrap_or("?"))).collect();
    ensure!(
        actors == [("deployer", "pause"), ("deployer", "resume"), ("deployer", "requeue"), ("deployer", "purge"), ("default", "pause")],
        "audit actors: {actors:?}"
    );

    // A CLI whose config gives the read token as its api.token hears why it was refused.
    let cli_config = host.dir.path().join("viewer.toml");
    std::fs::write(
        &cli_config,
        format!("[api]\nlisten = \"{}\"\ntoken = \"{VIEWER_TOKEN}\"\n[queues.orders]\nhandler = {{ url = \"http://{}/work\" }}\n", host.api, host.handler),
    )?;
    let out = host.cli(&["queue", "resume", "orders"], &cli_config, &[("EBB_API_TOKEN", "")])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "a read token cannot resume: {stderr}");
    ensure!(
        stderr.contains("403 Forbidden: token \"viewer\" has role read; POST /queues/{name}/resume needs admin")
            && stderr.contains("has role read on that host: use an admin token"),
        "the CLI's refusal: {stderr}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_sets_a_cookie_and_a_cookie_alone_is_no_credential() -> Result<()> {
    let host = Host::start(&named_tokens(), &[(VIEWER_ENV, VIEWER_TOKEN)]).await?;
    let mut paths = BTreeSet::new();
    for (method, pattern) in ebb::api::authenticated_route_table() {
        let path = match method.as_str() {
            "GET" => pattern.replace("{name}", "orders"),
            other => admin_call(other, pattern).with_context(|| format!("{other} {pattern}: add to admin_call"))?,
        };
        paths.insert(format!("{method} {path}"));
    }
    for probe in ["GET /healthz", "GET /readyz", "GET /nowhere", "DELETE /status"] {
        paths.insert(probe.to_string());
    }
    let mut answers = 0;
    for call in &paths {
        let (method, path) = call.split_once(' ').unwrap();
        for token in [None, Some(VIEWER_TOKEN), Some(DEPLOYER_TOKEN)] {
            let answer = host.call(method, path, token).await?;
            ensure!(!answer.headers.contains_key("set-cookie"), "{call} with {token:?} set a cookie: {answer:?}");
            answers += 1;
        }
    }
    ensure!(answers >= 30, "only {answers} answers looked at");

    // A browser's cookie (even one holding a valid token) does not authenticate.
    for (method, path) in [("GET", "/status"), ("GET", "/whoami"), ("POST", "/queues/orders/pause")] {
        let bytes = format!(
            "{method} {path} HTTP/1.1\r\nHost: ebb\r\nCookie: token={DEPLOYER_TOKEN}; session={DEPLOYER_TOKEN}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let answer = raw(host.api, bytes.as_bytes()).await?;
        ensure!(answer.status == 401, "{method} {path} with only a cookie: {answer:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_the_caller_is_the_admin_anonymous_and_the_audit_log_says_so() -> Result<()> {
    let host = Host::start("", &[]).await?;
    let who: serde_json::Value = serde_json::from_str(&host.call("GET", "/whoami", None).await?.body)?;
    ensure!(who == serde_json::json!({"name": "anonymous", "role": "admin"}), "whoami: {who}");
    ensure!(host.call("POST", "/queues/orders/pause", None).await?.status == 200);
    let audit: serde_json::Value = serde_json::from_str(&host.call("GET", "/audit", None).await?.body)?;
    ensure!(audit["entries"][0]["actor"] == "anonymous" && audit["entries"][0]["action"] == "pause", "audit: {audit}");
    Ok(())
}

#[test]
fn ebb_check_lists_the_tokens_by_name_and_role_and_never_their_secrets() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let queue = "[queues.orders]\nhandler = { url = \"http://127.0.0.1:8080/work\" }\n";
    let check = |api: &str, env: &[(String, String)]| -> Result<String> {
        std::fs::write(dir.path().join("ebb.toml"), format!("{api}\n{queue}"))?;
        let mut command = Command::new(EBB);
        command.args(["check", "--config"]).arg(dir.path().join("ebb.toml"));
        clean_env(&mut command, env);
        let out = command.output()?;
        ensure!(out.status.success(), "ebb check: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8(out.stdout)?)
    };
    let out = check(
        &format!("[api]\nlisten = \"127.0.0.1:7070\"\n{}", named_tokens()),
        &[("EBB_API_TOKEN".into(), DEFAULT_TOKEN.into()), (VIEWER_ENV.into(), VIEWER_TOKEN.into())],
    )?;
    ensure!(out.contains("api: on 127.0.0.1:7070, tokens default (admin), viewer (read), deployer (admin)"), "{out}");
    ensure!(![DEFAULT_TOKEN, VIEWER_TOKEN, DEPLOYER_TOKEN].iter().any(|secret| out.contains(secret)), "a secret shown: {out}");
    let out = check("", &[])?;
    ensure!(out.contains("api: on 127.0.0.1:7070, no token (every caller is the admin anonymous)"), "{out}");
    Ok(())
}

#[test]
fn a_public_listen_with_only_named_tokens_is_accepted_and_without_any_refused() {
    let queue = "[queues.orders]\nhandler = { url = \"http://127.0.0.1:8080/work\" }\n";
    let named = format!("[api]\nlisten = \"0.0.0.0:7070\"\n[[api.tokens]]\nname = \"ops\"\nrole = \"read\"\ntoken = \"r3ad\"\n{queue}");
    let config = ebb::Config::parse(&named, Path::new("/srv"), None).unwrap();
    assert_eq!(config.default_token(), None, "named tokens are not the CLI's");
    assert_eq!(config.tokens.len(), 1);
    let error = format!("{:#}", ebb::Config::parse(&format!("[api]\nlisten = \"0.0.0.0:7070\"\n{queue}"), Path::new("/srv"), None).unwrap_err());
    assert!(error.contains("is not a loopback address, so a token is required"), "{error}");
}

/// Attack pass, defect 9: a client command sent only the token named `default`, and
/// `EBB_API_TOKEN` set to a named token's secret was refused as a duplicate before anything
/// was sent: a holder of a named token could not use the CLI. A client command sends
/// `EBB_API_TOKEN` as it is (the host judges it), or the configured token it is told to by name
/// (`--token-name`, `EBB_TOKEN_NAME`), and the audit log names who acted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_acts_as_the_token_it_is_given_or_the_configured_token_it_names() -> Result<()> {
    let host = Host::start(&named_tokens(), &[("EBB_API_TOKEN", DEFAULT_TOKEN), (VIEWER_ENV, VIEWER_TOKEN)]).await?;
    let config = host.config();
    let run = |args: &[&str], env: &[(&str, &str)]| -> Result<(bool, String)> {
        let out = host.cli(args, &config, env)?;
        Ok((out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))))
    };
    // A read token's secret in EBB_API_TOKEN: the commands that read work.
    for args in [&["status"][..], &["poison", "list", "orders"]] {
        let (ok, out) = run(args, &[("EBB_API_TOKEN", VIEWER_TOKEN)])?;
        ensure!(ok, "ebb {args:?} with the read token in EBB_API_TOKEN: {out}");
    }
    let (ok, out) = run(&["queue", "pause", "orders"], &[("EBB_API_TOKEN", VIEWER_TOKEN)])?;
    ensure!(!ok && out.contains("403 Forbidden") && out.contains("token \"viewer\" has role read"), "a read token cannot pause: {out}");
    // An admin token's secret in EBB_API_TOKEN.
    let (ok, out) = run(&["queue", "pause", "orders"], &[("EBB_API_TOKEN", DEPLOYER_TOKEN)])?;
    ensure!(ok, "pause with the deployer's secret in EBB_API_TOKEN: {out}");
    // A configured token by name, over EBB_API_TOKEN (the host's environment still has the default's).
    let (ok, out) = run(&["queue", "resume", "orders", "--token-name", "deployer"], &[])?;
    ensure!(ok, "resume --token-name deployer: {out}");
    let (ok, out) = run(&["queue", "pause", "orders"], &[("EBB_TOKEN_NAME", "deployer")])?;
    ensure!(ok, "pause with EBB_TOKEN_NAME=deployer: {out}");
    // The read token by name: its secret comes from the variable its token_env names.
    let (ok, out) = run(&["status", "--token-name", "viewer"], &[])?;
    ensure!(ok, "status --token-name viewer: {out}");
    let (ok, out) = run(&["poison", "purge", "orders", "--yes", "--token-name", "viewer"], &[])?;
    ensure!(!ok && out.contains("token \"viewer\" has role read"), "purge as viewer: {out}");
    let (ok, out) = run(&["queue", "resume", "orders", "--token-name", "default"], &[])?;
    ensure!(ok, "resume --token-name default: {out}");
    // A name the config does not hold, or whose secret is not at hand, is refused before sending.
    let (ok, out) = run(&["status", "--token-name", "nobody"], &[])?;
    ensure!(!ok && out.contains("--token-name nobody") && out.contains("viewer") && out.contains("deployer"), "an unknown name: {out}");
    let (ok, out) = run(&["status", "--token-name", "viewer"], &[(VIEWER_ENV, "")])?;
    ensure!(!ok && out.contains(VIEWER_ENV), "viewer's variable unset: {out}");

    let audit: serde_json::Value = serde_json::from_str(&host.call("GET", "/audit", Some(VIEWER_TOKEN)).await?.body)?;
    let actors: Vec<(&str, &str)> =
        audit["entries"].as_array().unwrap().iter().map(|e| (e["actor"].as_str().unwrap_or("?"), e["action"].as_str().unwrap_or("?"))).collect();
    ensure!(actors == [("deployer", "pause"), ("deployer", "resume"), ("deployer", "pause"), ("default", "resume")], "audit actors: {actors:?}");
    // The host itself still refuses EBB_API_TOKEN equal to a named token's secret: it would
    // not know whom a call came from.
    let mut command = Command::new(EBB);
    command.args(["check", "--config"]).arg(&config);
    clean_env(&mut command, &[("EBB_API_TOKEN".into(), DEPLOYER_TOKEN.into()), (VIEWER_ENV.into(), VIEWER_TOKEN.into())]);
    let out = command.output()?;
    ensure!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("the same token as EBB_API_TOKEN"), "ebb check: {out:?}");
    Ok(())
}

/// Attack pass, defect 17: a token of megabytes passed `ebb check`. A token (the file's, an
/// environment variable's, a named one's, the scaler's) is at most 4 KiB, and the error
/// names where it came from without showing it.
#[test]
fn a_token_over_4_kib_is_refused_naming_where_it_came_from() {
    let queue = "[queues.orders]\nhandler = { url = \"http://127.0.0.1:8080/work\" }\n";
    let base = Path::new("/srv");
    let long = "a".repeat(4097);
    let fits = "a".repeat(4096);
    let error = |result: Result<ebb::Config>| format!("{:#}", result.unwrap_err());
    let from_env = error(ebb::Config::parse(queue, base, Some(long.clone())));
    assert!(from_env.starts_with("EBB_API_TOKEN: is 4097 bytes; a token may be at most 4096"), "{from_env}");
    let from_scaler_env = error(ebb::Config::parse_with_env(&format!("[scaler]\nlisten = \"127.0.0.1:7071\"\n{queue}"), base, None, Some(long.clone())));
    assert!(from_scaler_env.starts_with("EBB_SCALER_TOKEN: is 4097 bytes"), "{from_scaler_env}");
    let huge = "a".repeat(3 << 20);
    let from_env = error(ebb::Config::parse(queue, base, Some(huge)));
    assert!(from_env.len() < 200, "the token is not shown: {} bytes", from_env.len());
    assert!(ebb::Config::parse(queue, base, Some(fits.clone())).is_ok(), "4 KiB is a token");
    let named = format!("[[api.tokens]]\nname = \"ops\"\nrole = \"read\"\ntoken = \"{fits}\"\n{queue}");
    assert!(ebb::Config::parse(&named, base, None).is_ok(), "4 KiB is a named token");
}

/// Issue 38, item 6: a 401 said only "401 Unauthorized" (and `ebb status` printed the host's
/// JSON as it was). Each API command's 401 names the ways to give a token, as the 403 does,
/// and `ebb status` says the host's reason as a sentence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_is_answered_with_the_ways_to_give_one() -> Result<()> {
    let host = Host::start(&named_tokens(), &[(VIEWER_ENV, VIEWER_TOKEN)]).await?;
    let config = host.config();
    let commands: [&[&str]; 4] = [&["send", "orders", "hello"], &["status"], &["poison", "list", "orders"], &["queue", "pause", "orders"]];
    for args in commands {
        let out = host.cli(args, &config, &[("EBB_API_TOKEN", "not-a-token")])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success(), "ebb {args:?} with a wrong token succeeded");
        for named in ["401 Unauthorized", "--token-name", "EBB_TOKEN_NAME", "EBB_API_TOKEN"] {
            ensure!(stderr.contains(named), "ebb {args:?} with a wrong token does not name {named}: {stderr}");
        }
        ensure!(!stderr.contains("{\""), "ebb {args:?} printed raw JSON: {stderr}");
    }
    Ok(())
}
