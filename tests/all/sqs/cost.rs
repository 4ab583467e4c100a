//! Issue 37, item 7: the cost figures know the backend. `ebb run` prices an SQS queue's
//! requests at SQS's $0.40 per million (FIFO $0.50) beside an embedded queue at the
//! configured price, and `ebb simulate --config --queue` models the queue's backend.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ebb_tests::azurite::unique_queue_name;
use ebb_tests::moto::{Moto, REGION};

const EBB: &str = env!("CARGO_BIN_EXE_ebb-under-test");

/// A config with an SQS queue (moto), an SQS FIFO queue by URL and an embedded queue.
fn config(api: std::net::SocketAddr, data_dir: &std::path::Path, sqs: &str, fifo_url: &str) -> String {
    format!(
        "price_per_10k_transactions = 0.02\ndata_dir = \"{}\"\n[api]\nlisten = \"{api}\"\n\n\
         [aws]\nregion = \"{REGION}\"\nendpoint = \"{}\"\naccess_key_id_env = \"EBB_TEST_SQS_KEY_ID\"\nsecret_access_key_env = \"EBB_TEST_SQS_SECRET\"\n\n\
         [queues.{sqs}]\nbackend = \"sqs\"\nhandler = {{ url = \"http://127.0.0.1:9/none\" }}\n\n\
         [queues.{sqs}-fifo]\nbackend = \"sqs\"\nsqs = {{ queue_url = \"{fifo_url}\" }}\nhandler = {{ url = \"http://127.0.0.1:9/none\" }}\n\n\
         [queues.local]\nhandler = {{ url = \"http://127.0.0.1:9/none\" }}\n",
        data_dir.display(),
        Moto::shared().endpoint()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_prices_sqs_requests_at_sqs_prices_and_other_queues_at_the_configured_price() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let sqs = unique_queue_name("cost");
    let create = "print(sqs.create_queue(QueueName=sys.argv[1], Attributes={'FifoQueue': 'true'})['QueueUrl'])";
    let fifo_url = moto.boto3(create, &[&format!("{sqs}-x.fifo")]).trim().to_string();
    let dir = tempfile::tempdir()?;
    let api = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    std::fs::write(dir.path().join("ebb.toml"), config(api, &dir.path().join("data"), &sqs, &fifo_url))?;
    let log_path = dir.path().join("host.log");
    let mut host = Command::new(EBB)
        .args(["run", "--config"])
        .arg(dir.path().join("ebb.toml"))
        .envs([("EBB_TEST_SQS_KEY_ID", "testing"), ("EBB_TEST_SQS_SECRET", "testing")])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path)?)
        .spawn()?;
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Ok(answer) = reqwest::get(format!("http://{api}/status")).await
            && let Ok(text) = answer.text().await
            && let Ok(status) = serde_json::from_str::<serde_json::Value>(&text)
            && status["queues"].as_array().is_some_and(|queues| queues.len() == 3 && queues.iter().all(|q| q["cost"].is_object()))
        {
            break status;
        }
        assert!(Instant::now() < deadline, "no cost for every queue in /status: {}", log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let metrics = reqwest::get(format!("http://{api}/metrics")).await?.text().await?;
    let _ = Command::new("kill").args(["-TERM", &host.id().to_string()]).status();
    let _ = tokio::task::spawn_blocking(move || host.wait()).await?;

    let price = |queue: &str| {
        let entry = status["queues"].as_array().unwrap().iter().find(|q| q["queue"] == queue).unwrap_or_else(|| panic!("{queue} in {status}"));
        entry["cost"]["price_per_10k_transactions"].as_f64()
    };
    assert_eq!(price(&sqs), Some(0.004), "SQS standard: $0.40 per million requests");
    assert_eq!(price(&format!("{sqs}-fifo")), Some(0.005), "SQS FIFO: $0.50 per million");
    assert_eq!(price("local"), Some(0.02), "the embedded queue at the configured price");
    assert_eq!(status["cost"]["price_per_10k_transactions"].as_f64(), Some(0.02), "mixed prices: the host's total names the configured one");
    assert!(metrics.contains("ebb_projected_usd_per_month"), "{metrics}");

    // The simulator models a configured SQS queue as SQS, at its price.
    let output = Command::new(EBB)
        .args(["simulate", "--scenario", "trickle", "--duration", "10m", "--config"])
        .arg(dir.path().join("ebb.toml"))
        .args(["--queue", &sqs])
        .envs([("EBB_TEST_SQS_KEY_ID", "testing"), ("EBB_TEST_SQS_SECRET", "testing")])
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}{}", String::from_utf8_lossy(&output.stderr));
    assert!(text.contains("backend sqs,") && text.contains("$0.004 per 10,000"), "{text}");
    assert!(text.contains("floor = a delete batch per 10 messages + the fewest receives of at most 10"), "{text}");
    Ok(())
}
