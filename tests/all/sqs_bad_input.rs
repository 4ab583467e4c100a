//! Issue 37's bad input that needs SQS itself (moto), beyond the other SQS test files: a
//! wrong endpoint, a wrong region, and a receipt handle whose lease ran out.

use std::time::Duration;

use ebb::queue::sqs::{AwsCredentials, AwsSettings, SqsAccount, SqsOptions, SqsQueue};
use ebb::queue::{FailureClass, QueueClient};
use ebb_tests::azurite::{free_port, unique_queue_name};
use ebb_tests::moto::Moto;

/// An account on `endpoint` in `region`, with moto's test keys.
fn account(endpoint: &str, region: &str) -> SqsAccount {
    let credentials = AwsCredentials::Static { access_key_id: "testing".into(), secret_access_key: "testing".into(), session_token: None };
    SqsAccount::new(AwsSettings { region: Some(region.into()), endpoint: Some(endpoint.into()), credentials, ..AwsSettings::default() })
}

#[tokio::test]
async fn a_wrong_endpoint_is_a_connection_failure_worth_retrying_that_names_it() -> anyhow::Result<()> {
    // Nothing listens there.
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let queue = SqsQueue::new(&account(&endpoint, "us-east-1"), "orders", SqsOptions::default())?;
    let error = queue.create_if_missing().await.unwrap_err();
    assert_eq!((error.failure_class(), error.is_transient()), (Some(FailureClass::Connection), true), "{error}");
    assert!(error.to_string().contains(&endpoint) && error.to_string().contains("queue orders"), "{error}");
    Ok(())
}

#[tokio::test]
async fn a_wrong_region_finds_no_queue_and_the_error_names_the_region() -> anyhow::Result<()> {
    let moto = Moto::shared();
    let name = unique_queue_name("region");
    SqsQueue::new(&moto.account(), &name, SqsOptions::default())?.create_if_missing().await?;
    // The same endpoint, another region: SQS queues are regional.
    let queue = SqsQueue::new(&account(&moto.endpoint(), "eu-west-1"), &name, SqsOptions::default())?;
    let error = queue.put(b"m", Duration::ZERO).await.unwrap_err();
    assert_eq!((error.failure_class(), error.is_transient()), (Some(FailureClass::Missing), false), "{error}");
    assert!(error.to_string().contains(&name) && error.to_string().contains("eu-west-1"), "{error}");
    Ok(())
}

/// SQS takes a receipt handle whose lease ran out without an error (AWS: the delete
/// succeeds but may not delete; moto deletes): a host that handled a message after its lease
/// ran out reports no failure, nor does the host that received it again.
#[tokio::test]
async fn a_receipt_whose_lease_ran_out_is_taken_without_error_by_both_holders() -> anyhow::Result<()> {
    let queue = SqsQueue::new(&Moto::shared().account(), &unique_queue_name("expired"), SqsOptions::default())?;
    queue.create_if_missing().await?;
    queue.put(b"m", Duration::ZERO).await?;
    let first = queue.get(1, Duration::from_secs(1)).await?.remove(0);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = queue.get(1, Duration::from_secs(30)).await?.remove(0);
    assert_eq!((second.id.as_str(), second.dequeue_count), (first.id.as_str(), 2));
    assert_ne!(first.pop_receipt, second.pop_receipt, "each receive issues a handle of its own");
    queue.update_visibility(&first.id, &first.pop_receipt, Duration::from_secs(30)).await?;
    queue.delete(&first.id, &first.pop_receipt).await?;
    queue.delete(&second.id, &second.pop_receipt).await?;
    assert_eq!(queue.approximate_count().await?, 0);
    Ok(())
}
