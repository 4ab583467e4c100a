//! `ebb send` and `ebb status`: talk to the running host's API, or (send) write the store
//! directly when no host is up.

use std::io::Read as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use serde_json::Value;

use crate::config::Config;
use crate::queue::QueueClient;
use crate::queue::embedded::{EmbeddedOptions, EmbeddedStore};

fn api_base(config: &Config) -> String {
    let mut addr = config.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    format!("http://{addr}")
}

fn client(config: &Config) -> Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = &config.token {
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse()?);
    }
    Ok(reqwest::Client::builder().default_headers(headers).timeout(Duration::from_secs(30)).build()?)
}

pub async fn send(config_path: &Path, queue: &str, count: u64, body: Option<String>) -> Result<()> {
    let config = Config::load(config_path)?;
    if !config.queues.iter().any(|q| q.name == queue) {
        bail!("queue {queue} is not configured in {}", config_path.display());
    }
    let body = match body {
        Some(body) => body.into_bytes(),
        None => {
            let mut bytes = Vec::new();
            std::io::stdin().read_to_end(&mut bytes).context("failed to read the message from stdin")?;
            bytes
        }
    };
    let http = client(&config)?;
    let url = format!("{}/queues/{queue}/messages", api_base(&config));
    let first = http.post(&url).body(body.clone()).send().await;
    match first {
        Err(error) if error.is_connect() => {
            let store = EmbeddedStore::open(&config.data_dir, EmbeddedOptions { max_message_bytes: config.max_message_bytes, ..Default::default() })
                .context("no host answers on the API, and the data directory could not be opened")?;
            let target = store.queue(queue);
            target.create_if_missing().await?;
            let puts = futures::stream::iter(0..count).map(|_| target.put(&body, Duration::ZERO)).buffer_unordered(256);
            let results: Vec<_> = puts.collect().await;
            results.into_iter().collect::<Result<Vec<_>, _>>()?;
            println!("sent {count} message{} to {queue} (no host running: written to {})", plural(count), config.data_dir.display());
        }
        first => {
            check_response(first?).await?;
            let rest = futures::stream::iter(1..count)
                .map(|_| {
                    let request = http.post(&url).body(body.clone());
                    async move { check_response(request.send().await?).await }
                })
                .buffer_unordered(64);
            let results: Vec<_> = rest.collect().await;
            results.into_iter().collect::<Result<Vec<_>>>()?;
            println!("sent {count} message{} to {queue} via {}", plural(count), api_base(&config));
        }
    }
    Ok(())
}

async fn check_response(response: reqwest::Response) -> Result<()> {
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        bail!("the host answered {status}: {}", text.trim());
    }
    Ok(())
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

pub async fn status(config_path: &Path, json: bool) -> Result<()> {
    let config = Config::load(config_path)?;
    let url = format!("{}/status", api_base(&config));
    let response = client(&config)?.get(&url).send().await.with_context(|| format!("no host answers at {url}"))?;
    let status = response.status();
    let body: Value = serde_json::from_slice(&response.bytes().await?).context("the host answered with invalid JSON")?;
    if !status.is_success() {
        bail!("the host answered {status}: {body}");
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(());
    }
    println!("{:<20} {:>8} {:>13} {:>9} {:>10} {:>7} {:>8} {:>10} {:>10}  rule", "queue", "depth", "tasks a/t/pk", "in-flight", "processed", "failed", "poisoned", "storage tx", "empty gets");
    for q in body["queues"].as_array().into_iter().flatten() {
        let tx = &q["transactions"];
        let total: u64 = ["puts", "gets_with_messages", "gets_empty", "deletes", "updates", "counts", "creates"].iter().map(|k| tx[k].as_u64().unwrap_or(0)).sum();
        let rule = q["rule"]["file"].as_str().map_or("built-in".to_string(), |f| {
            let sha = q["rule"]["sha256"].as_str().unwrap_or("");
            format!("{f} ({})", &sha[..sha.len().min(12)])
        });
        let source = q["last_task_count"]["source"].as_str().unwrap_or("-");
        println!(
            "{:<20} {:>8} {:>13} {:>9} {:>10} {:>7} {:>8} {:>10} {:>10}  {rule}, last decision: {source}",
            q["queue"].as_str().unwrap_or("?"),
            q["approximate_depth"],
            format!("{}/{}/{}", q["active_tasks"], q["target_tasks"], q["peak_tasks"]),
            q["in_flight"],
            q["processed"],
            q["failed"],
            q["poisoned"],
            total,
            tx["gets_empty"].as_u64().unwrap_or(0),
        );
    }
    Ok(())
}
