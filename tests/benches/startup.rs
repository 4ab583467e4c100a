//! Start-up: `exec` of `ebb run` to the first message delivered, printed as JSON:
//! `cargo bench -p ebb-tests --bench startup` (`EBB_BENCH_STARTUP_SAMPLES`, default 3).
//!
//! One message waits on the embedded queue (sent with `ebb send` before the host starts);
//! the host's handler is a local HTTP app that notes when the message arrives. For the
//! built-in rule and the Rust, Python and JavaScript example rules, each sample starts on an
//! empty compile cache (a fresh data folder); then once more on the cache that start left
//! (`cached`). Also: `exec` to the rule in use (`/status` names it), which for a slow rule
//! comes long after the first delivery (the built-in rule decides while the rule compiles).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ebb_tests::guests;
use serde_json::json;

const EBB: &str = env!("CARGO_BIN_EXE_ebb-under-test");
const TOKEN: &str = "t";

type Arrival = Arc<Mutex<Option<Instant>>>;

async fn handler_app() -> (Arrival, SocketAddr) {
    let arrival: Arrival = Arc::default();
    let record = arrival.clone();
    let app = axum::Router::new().route(
        "/work",
        axum::routing::post(move || {
            let record = record.clone();
            async move {
                record.lock().unwrap().get_or_insert_with(Instant::now);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (arrival, addr)
}

/// A host's folder: config, rules folder with `rule` (if any) as orders.wasm, data folder.
fn site(dir: &Path, rule: Option<&str>, app: SocketAddr) -> (std::path::PathBuf, SocketAddr) {
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    let rule_line = match rule {
        Some(rule) => {
            std::fs::copy(rule, rules.join("orders.wasm")).unwrap();
            "rule = \"orders.wasm\"\n"
        }
        None => "",
    };
    let api = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let config = dir.join("ebb.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\nrules_dir = \"{}\"\n[api]\nlisten = \"{api}\"\ntoken = \"{TOKEN}\"\n\n[queues.orders]\n{rule_line}handler = {{ url = \"http://{app}/work\" }}\n",
            dir.join("data").display(),
            rules.display()
        ),
    )
    .unwrap();
    (config, api)
}

struct Host(Child);

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One start: (exec → first delivery, exec → rule in use), in ms.
async fn start_once(config: &Path, api: SocketAddr, arrival: &Arrival, has_rule: bool) -> (f64, Option<f64>) {
    let sent = Command::new(EBB).args(["send", "orders", "first"]).arg("--config").arg(config).output().unwrap();
    assert!(sent.status.success(), "ebb send: {}", String::from_utf8_lossy(&sent.stderr));
    *arrival.lock().unwrap() = None;
    let started = Instant::now();
    let _host = Host(Command::new(EBB).arg("run").arg("--config").arg(config).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap());
    let deadline = started + Duration::from_secs(120);
    let delivered = loop {
        if let Some(at) = *arrival.lock().unwrap() {
            break at.duration_since(started);
        }
        assert!(Instant::now() < deadline, "no delivery within 120 s");
        tokio::time::sleep(Duration::from_micros(200)).await;
    };
    if !has_rule {
        return (ms(delivered), None);
    }
    let client = reqwest::Client::new();
    let in_use = loop {
        let status = client.get(format!("http://{api}/status")).bearer_auth(TOKEN).send().await;
        if let Ok(response) = status
            && let Ok(body) = response.bytes().await
            && let Ok(status) = serde_json::from_slice::<serde_json::Value>(&body)
            && status["queues"][0]["rule"]["file"] == "orders.wasm"
        {
            break started.elapsed();
        }
        assert!(Instant::now() < deadline, "the rule not in use within 120 s");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    (ms(delivered), Some(ms(in_use)))
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let samples: usize = std::env::var("EBB_BENCH_STARTUP_SAMPLES").ok().and_then(|s| s.parse().ok()).unwrap_or(3).clamp(1, 100);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let rules: [(&str, Option<&str>); 4] = [
        ("built_in", None),
        ("rust_paper_default", Some(guests::PAPER_DEFAULT)),
        ("python_drain_time", Some(guests::PYTHON_DRAIN_TIME)),
        ("javascript_spare_capacity", Some(guests::JAVASCRIPT_SPARE_CAPACITY)),
    ];
    let mut report = json!({ "samples": samples, "build": if cfg!(debug_assertions) { "debug" } else { "release" } });
    runtime.block_on(async {
        let (arrival, app) = handler_app().await;
        for (name, rule) in rules {
            let size = rule.map(|r| std::fs::metadata(r).unwrap().len());
            let (mut delivered, mut in_use) = (Vec::new(), Vec::new());
            let mut cached = None;
            for sample in 0..samples {
                let dir = tempfile::tempdir().unwrap();
                let (config, api) = site(dir.path(), rule, app);
                let (d, u) = start_once(&config, api, &arrival, rule.is_some()).await;
                delivered.push(d);
                in_use.extend(u);
                if sample == 0 {
                    // Again, on the cache the first start left.
                    cached = Some(start_once(&config, api, &arrival, rule.is_some()).await);
                }
            }
            let (cached_delivered, cached_in_use) = cached.unwrap();
            report[name] = json!({
                "rule_bytes": size,
                "empty_cache": {
                    "exec_to_first_delivery_ms": { "median": median(delivered.clone()), "all": delivered },
                    "exec_to_rule_in_use_ms": if in_use.is_empty() { json!(null) } else { json!({ "median": median(in_use.clone()), "all": in_use }) },
                },
                "cached": { "exec_to_first_delivery_ms": cached_delivered, "exec_to_rule_in_use_ms": cached_in_use },
            });
        }
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}
