//! `ebb run` on an SQS queue (moto): messages sent by boto3 reach the app and are deleted
//! once it answered 2xx; one whose first try fails comes back and is deleted after its
//! retry succeeds. The keys come from environment variables the config names, and never
//! appear in the host's output.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::StatusCode;
use ebb_tests::azurite::unique_queue_name;
use ebb_tests::moto::{Moto, REGION};

const EBB: &str = env!("CARGO_BIN_EXE_ebb-under-test");
const SECRET: &str = "moto-secret-never-printed";

/// Tries per body; the first try of `fail-once` fails.
#[derive(Clone, Default)]
struct App {
    tries: Arc<Mutex<BTreeMap<String, u32>>>,
}

impl App {
    async fn start(&self) -> SocketAddr {
        let tries = self.tries.clone();
        let router = axum::Router::new().route(
            "/work",
            axum::routing::post(move |body: Bytes| {
                let tries = tries.clone();
                async move {
                    let body = String::from_utf8_lossy(&body).into_owned();
                    let mut tries = tries.lock().unwrap();
                    let n = tries.entry(body.clone()).or_default();
                    *n += 1;
                    if body == "fail-once" && *n == 1 { StatusCode::INTERNAL_SERVER_ERROR } else { StatusCode::OK }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        address
    }
}

/// Messages in the queue, visible, in flight or delayed, as boto3 reads them.
fn messages_in(moto: &Moto, queue: &str) -> u64 {
    let script = "url = sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl']\n\
                  a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=['All'])['Attributes']\n\
                  print(sum(int(a[k]) for k in ['ApproximateNumberOfMessages', 'ApproximateNumberOfMessagesNotVisible', 'ApproximateNumberOfMessagesDelayed']))";
    moto.boto3(script, &[queue]).trim().parse().unwrap()
}

/// Runs `ebb run` on a fresh SQS queue of moto, with `aws` (the config's `[aws]` table, or
/// nothing) and `env`; boto3 sends 21 messages, one of which fails once; returns once every
/// one was handled and the queue is empty, with the host's log.
async fn handles_what_boto3_sent(aws: &str, env: &[(&str, &str)]) -> anyhow::Result<String> {
    let moto = Moto::shared();
    let queue = unique_queue_name("run");
    let app = App::default();
    let app_address = app.start().await;
    let dir = tempfile::tempdir()?;
    let api = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = format!(
        "drain_timeout = \"5s\"\n[api]\nlisten = \"{api}\"\n\n\
         [queues.{queue}]\nbackend = \"sqs\"\nmin_polling_interval = \"100ms\"\nmax_polling_interval = \"500ms\"\nvisibility_timeout = \"1s\"\nmax_retry_delay = \"1s\"\n\
         handler = {{ url = \"http://{app_address}/work\" }}\n\n{aws}"
    );
    std::fs::write(dir.path().join("ebb.toml"), config)?;
    let log_path = dir.path().join("host.log");
    let mut host = Command::new(EBB)
        .arg("run")
        .arg("--config")
        .arg(dir.path().join("ebb.toml"))
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path)?)
        .spawn()?;
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    // The host creates the queue at start; boto3 sends once it exists.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(reqwest::get(format!("http://{api}/readyz")).await, Ok(answer) if answer.status().is_success()) {
        assert!(Instant::now() < deadline, "the host did not become ready: {}", log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bodies: Vec<String> = (0..20).map(|i| format!("order-{i}")).chain(["fail-once".to_string()]).collect();
    let send = "url = sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl']\nfor body in sys.argv[2:]: sqs.send_message(QueueUrl=url, MessageBody=body)";
    let args: Vec<&str> = std::iter::once(queue.as_str()).chain(bodies.iter().map(String::as_str)).collect();
    moto.boto3(send, &args);

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let handled = app.tries.lock().unwrap().clone();
        if bodies.iter().all(|body| handled.contains_key(body)) && handled["fail-once"] >= 2 && messages_in(moto, &queue) == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "handled {handled:?}, {} left in the queue; host log:\n{}", messages_in(moto, &queue), log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(Command::new("kill").args(["-TERM", &host.id().to_string()]).status()?.success());
    let exit = tokio::task::spawn_blocking(move || host.wait()).await??;
    assert!(exit.success(), "graceful shutdown exits 0: {exit:?}\n{}", log());
    let tries = app.tries.lock().unwrap().clone();
    assert_eq!(tries["fail-once"], 2, "retried once after its failure, then deleted");
    Ok(log())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebb_run_on_an_sqs_queue_handles_what_boto3_sent_and_deletes_it_after_success() -> anyhow::Result<()> {
    let aws = format!(
        "[aws]\nregion = \"{REGION}\"\nendpoint = \"{}\"\naccess_key_id_env = \"EBB_TEST_SQS_KEY_ID\"\nsecret_access_key_env = \"EBB_TEST_SQS_SECRET\"\n",
        Moto::shared().endpoint()
    );
    let log = handles_what_boto3_sent(&aws, &[("EBB_TEST_SQS_KEY_ID", "testing"), ("EBB_TEST_SQS_SECRET", SECRET)]).await?;
    assert!(!log.contains(SECRET), "the secret key is never printed");
    Ok(())
}

/// With no `[aws]` table the SDK's standard environment decides: region, endpoint and keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_aws_table_the_sdks_standard_environment_finds_the_queue() -> anyhow::Result<()> {
    let endpoint = Moto::shared().endpoint();
    let env = [("AWS_REGION", REGION), ("AWS_ENDPOINT_URL_SQS", &endpoint), ("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", SECRET)];
    let log = handles_what_boto3_sent("", &env).await?;
    assert!(!log.contains(SECRET), "the secret key is never printed");
    Ok(())
}
