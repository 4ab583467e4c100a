//! Issue 37 item 8: `ebb check` probes SQS as it probes Azure. A permission the credential
//! lacks is named by its IAM action (moto enforcing IAM), and a region or endpoint that
//! reaches no SQS, or not the queue, is named by its key. Before, `check` called no SQS at
//! all and said the config was valid.

use std::path::{Path, PathBuf};
use std::process::Command;

use ebb_tests::azurite::{free_port, unique_queue_name};
use ebb_tests::moto::{Moto, REGION};

use crate::binary::EBB;

/// Every call `ebb run` makes on an SQS queue whose URL it looks up.
const RUN_NEEDS: [&str; 7] = [
    "sqs:GetQueueUrl",
    "sqs:CreateQueue",
    "sqs:GetQueueAttributes",
    "sqs:SendMessage",
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibility",
];

/// An `ebb.toml` with one SQS queue `queue` and the `[aws]` table `aws` (keys from the
/// environment variables `EBB_TEST_KEY_ID` and `EBB_TEST_SECRET`), and `own` in the queue's
/// table.
fn sqs_config(dir: &Path, queue: &str, aws: &str, own: &str) -> PathBuf {
    let path = dir.join("ebb.toml");
    let config = format!(
        "[api]\nlisten = \"127.0.0.1:{}\"\n[aws]\n{aws}\naccess_key_id_env = \"EBB_TEST_KEY_ID\"\nsecret_access_key_env = \"EBB_TEST_SECRET\"\n\n\
         [queues.{queue}]\nbackend = \"sqs\"\nhandler = {{ url = \"http://127.0.0.1:9/work\" }}\n{own}",
        free_port()
    );
    std::fs::write(&path, config).unwrap();
    path
}

/// `ebb check` of `config` with the keys `(id, secret)`: its exit code and output.
fn check(config: &Path, (id, secret): (&str, &str)) -> (Option<i32>, String) {
    let output = Command::new(EBB).arg("check").arg("--config").arg(config).env("EBB_TEST_KEY_ID", id).env("EBB_TEST_SECRET", secret).output().unwrap();
    (output.status.code(), format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr)))
}

/// Creates SQS queue `name` on `moto` as its admin.
fn create(moto: &Moto, name: &str) {
    moto.boto3("sqs.create_queue(QueueName=sys.argv[1])", &[name]);
}

#[test]
fn check_names_the_iam_action_a_credential_lacks_on_an_sqs_queue() {
    // A moto of its own: IAM enforced on the shared one would refuse every other test's keys.
    let moto = Moto::start();
    let queue = unique_queue_name("iam");
    for name in [queue.clone(), format!("{queue}-poison")] {
        create(&moto, &name);
    }
    let everything = moto.user_allowed("everything", &RUN_NEEDS);
    let no_receive: Vec<&str> = RUN_NEEDS.iter().copied().filter(|action| *action != "sqs:ReceiveMessage").collect();
    let cannot_receive = moto.user_allowed("cannot-receive", &no_receive);
    moto.enforce_iam();
    let dir = tempfile::tempdir().unwrap();
    let config = sqs_config(dir.path(), &queue, &format!("region = \"{REGION}\"\nendpoint = \"{}\"", moto.endpoint()), "");

    let (code, text) = check(&config, (&cannot_receive.0, &cannot_receive.1));
    assert_eq!(code, Some(1), "a credential without sqs:ReceiveMessage is refused:\n{text}");
    assert!(text.contains(&format!("queue {queue} on SQS in {REGION}")) && text.contains("the credential lacks sqs:ReceiveMessage:"), "{text}");
    assert!(!text.contains("sqs:DeleteMessage"), "only what it lacks is named:\n{text}");
    assert!(!text.contains(&cannot_receive.1), "the secret is never printed");

    let (code, text) = check(&config, (&everything.0, &everything.1));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("queue {queue}: reached SQS in {REGION} at {}, 0 messages;", moto.endpoint())), "{text}");
    assert!(text.contains("may create, read, receive, delete and change visibility"), "{text}");

    let (code, text) = check(&config, ("AKIDNOSUCHKEY", "wrong"));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("check the credentials") && text.contains("region and endpoint in [aws]"), "{text}");
}

#[test]
fn check_of_an_sqs_endpoint_where_nothing_answers_names_the_endpoint_key() {
    let dir = tempfile::tempdir().unwrap();
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let config = sqs_config(dir.path(), &unique_queue_name("nowhere"), &format!("region = \"{REGION}\"\nendpoint = \"{nowhere}\""), "");
    let started = std::time::Instant::now();
    let (code, text) = check(&config, ("testing", "testing"));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains(&format!("at {nowhere}")) && text.contains("no SQS answers there; check region and endpoint in [aws]"), "{text}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30), "within the check's bound: {:?}", started.elapsed());
}

#[test]
fn check_of_a_queue_url_in_another_region_than_the_configured_one_names_queue_url_and_region() {
    let moto = Moto::shared();
    let queue = unique_queue_name("region");
    create(moto, &queue);
    let url = moto.boto3("print(sqs.get_queue_url(QueueName=sys.argv[1])['QueueUrl'])", &[&queue]).trim().to_string();
    let dir = tempfile::tempdir().unwrap();
    let aws = format!("region = \"eu-west-3\"\nendpoint = \"{}\"", moto.endpoint());
    let config = sqs_config(dir.path(), &queue, &aws, &format!("sqs = {{ queue_url = \"{url}\" }}\n"));
    let (code, text) = check(&config, ("testing", "testing"));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("SQS in eu-west-3") && text.contains("the queue does not exist"), "{text}");
    assert!(text.contains(&format!("check sqs.queue_url of [queues.{queue}.sqs], and that the region is the queue's")), "{text}");

    // In its own region the same URL is reached.
    let config =
        sqs_config(dir.path(), &queue, &format!("region = \"{REGION}\"\nendpoint = \"{}\"", moto.endpoint()), &format!("sqs = {{ queue_url = \"{url}\" }}\n"));
    let (code, text) = check(&config, ("testing", "testing"));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("queue {queue}: reached SQS in {REGION}")), "{text}");
}

/// Creates S3 bucket `bucket` on `moto` as its admin.
fn create_bucket(moto: &Moto, bucket: &str) {
    let script = "from botocore.config import Config\n\
                  s3 = boto3.client('s3', region_name=sqs.meta.region_name, endpoint_url=sqs.meta.endpoint_url, aws_access_key_id='testing', aws_secret_access_key='testing', config=Config(s3={'addressing_style': 'path'}))\n\
                  s3.create_bucket(Bucket=sys.argv[1])";
    moto.boto3(script, &[bucket]);
}

/// Issue 37: `ebb check` probes a queue's claim bucket: one that does not exist yet is said
/// so with the action `run` will need to create it; an action the credential lacks on it is
/// named with the bucket (moto enforcing IAM).
#[test]
fn check_probes_the_claim_bucket_naming_the_bucket_and_the_action_it_lacks_or_needs() {
    // A moto of its own: IAM enforced on the shared one would refuse every other test's keys.
    let moto = Moto::start();
    let (queue, missing, bucket) = (unique_queue_name("s3check"), unique_queue_name("ebb-no-bucket"), unique_queue_name("ebb-check-bucket"));
    for name in [queue.clone(), format!("{queue}-poison")] {
        create(&moto, &name);
    }
    create_bucket(&moto, &bucket);
    let s3_reads = ["s3:ListBucket", "s3:GetObject"];
    let everything: Vec<&str> = RUN_NEEDS.iter().chain(&s3_reads).chain(&["s3:DeleteObject", "s3:PutObject"]).copied().collect();
    let everything = moto.user_allowed("everything", &everything);
    let no_delete: Vec<&str> = RUN_NEEDS.iter().chain(&s3_reads).copied().collect();
    let cannot_delete = moto.user_allowed("cannot-delete", &no_delete);
    moto.enforce_iam();
    let dir = tempfile::tempdir().unwrap();
    let aws = |bucket: &str| format!("region = \"{REGION}\"\nendpoint = \"{}\"\nclaim_bucket = \"{bucket}\"", moto.endpoint());

    let (code, text) = check(&sqs_config(dir.path(), &queue, &aws(&missing), ""), (&everything.0, &everything.1));
    assert_eq!(code, Some(0), "a bucket ebb run creates is no problem:\n{text}");
    assert!(text.contains(&format!("s3 bucket {missing} (claim checks of queue {queue}): does not exist yet")) && text.contains("s3:CreateBucket"), "{text}");

    let config = sqs_config(dir.path(), &queue, &aws(&bucket), "");
    let (code, text) = check(&config, (&cannot_delete.0, &cannot_delete.1));
    assert_eq!(code, Some(1), "a credential without s3:DeleteObject is refused:\n{text}");
    assert!(text.contains(&format!("s3 bucket {bucket} (claim checks of queue {queue}): the credential lacks s3:DeleteObject:")), "{text}");
    assert!(!text.contains("lacks s3:GetObject") && !text.contains(&cannot_delete.1), "only what it lacks is named, never the secret:\n{text}");

    let (code, text) = check(&config, (&everything.0, &everything.1));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("s3 bucket {bucket} (claim checks of queue {queue}): reached; may list, get and delete objects")), "{text}");
}
