//! `ebb bench sqs` through the binary, small, on moto: both drainers run, alternating, and
//! every figure is reported.

use std::process::Command;

use serde_json::Value;

use crate::binary::EBB;
use ebb_tests::azurite::unique_queue_name;
use ebb_tests::moto::{Moto, REGION};

#[test]
fn bench_sqs_reports_both_drainers_their_ratio_and_requests_per_message() {
    let moto = Moto::shared();
    let queue = unique_queue_name("bench");
    let output = Command::new(EBB)
        .args(["bench", "sqs", "--json", "--messages", "100", "--rounds", "2", "--tasks", "2", "--queue", &queue])
        // The SDK's standard environment names moto: the bench starts nothing itself.
        .env("AWS_ENDPOINT_URL", moto.endpoint())
        .env("AWS_REGION", REGION)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env_remove("AWS_ENDPOINT_URL_SQS")
        .env_remove("AWS_PROFILE")
        .output()
        .unwrap();
    assert!(output.status.success(), "ebb bench sqs failed: {}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&output.stdout)));
    assert_eq!(report["endpoint"].as_str(), Some(moto.endpoint().as_str()));
    let mut msg_per_s = Vec::new();
    for drainer in ["loop", "ebb"] {
        let rate = report[drainer]["msg_per_s"].as_f64().unwrap_or(0.0);
        assert!(rate.is_finite() && rate > 0.0, "{drainer} msg_per_s: {report:#}");
        msg_per_s.push(rate);
        // At least one receive and one delete batch per 10 messages; batching keeps it far
        // below a request per message.
        let requests = report[drainer]["requests_per_message"].as_f64().unwrap_or(0.0);
        assert!((0.2..0.5).contains(&requests), "{drainer} requests_per_message {requests}: {report:#}");
    }
    let ratio = report["ratio"].as_f64().expect("the ratio");
    assert!((ratio - msg_per_s[1] / msg_per_s[0]).abs() < 1e-9, "ebb's msg/s over the loop's: {report:#}");
    assert_eq!(report["goal_met"].as_bool(), Some(ratio >= 0.9), "{report:#}");
    let order: Vec<&str> = report["runs"].as_array().expect("runs").iter().map(|r| r["drainer"].as_str().unwrap()).collect();
    assert_eq!(order, ["loop", "ebb", "ebb", "loop"], "the order alternates so drift hits both alike");
}
