//! moto's server, an Amazon SQS implementation, for the SQS tests: on 127.0.0.1 on a free
//! port, in memory. `tests/build.rs` installs the pinned version (with boto3) in a venv.
//!
//! Without Python 3 and its `venv` the build fails (the tests never skip), saying what is missing.

use std::process::{Child, ChildStdin, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ebb::queue::sqs::{AwsCredentials, AwsSettings, SqsAccount};

use crate::azurite::{free_port, start_guarded};

include!(concat!(env!("OUT_DIR"), "/moto.rs"));

/// The region the tests use.
pub const REGION: &str = "us-east-1";

/// How long moto may take to answer on its port (it imports every service's models).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running moto server; stopped on drop, and when the test process exits (however it
/// exits: the process holds the write end of a pipe that moto's guard reads).
pub struct Moto {
    port: u16,
    child: Child,
    guard: Option<ChildStdin>,
}

impl Moto {
    /// Starts moto on a free port and waits until it answers. Panics, saying why, if it cannot.
    pub fn start() -> Moto {
        let port = free_port();
        let args = [MOTO_PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()].map(String::from);
        let (child, guard) = start_guarded("moto", &args, port, START_TIMEOUT, "is its venv installed (tests/build.rs)?");
        Moto { port, child, guard }
    }

    /// One moto for the whole test process, started on first use. Give each test its own
    /// queue ([`unique_queue_name`](crate::azurite::unique_queue_name)).
    pub fn shared() -> &'static Moto {
        static SHARED: OnceLock<Moto> = OnceLock::new();
        SHARED.get_or_init(Moto::start)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// An account on the endpoint `endpoint` (moto's, or a proxy's in front of it) with
    /// moto's test keys.
    pub fn account_at(endpoint: &str) -> SqsAccount {
        let credentials = AwsCredentials::Static { access_key_id: "testing".into(), secret_access_key: "testing".into(), session_token: None };
        SqsAccount::new(AwsSettings { region: Some(REGION.into()), endpoint: Some(endpoint.into()), credentials, ..AwsSettings::default() })
    }

    /// An account on this moto.
    pub fn account(&self) -> SqsAccount {
        Moto::account_at(&self.endpoint())
    }

    /// An IAM user of this moto allowed `actions` (e.g. `sqs:GetQueueUrl`) on every
    /// resource and nothing else: its access key id and secret. Moto checks them only once
    /// [`Moto::enforce_iam`] was called: use a moto of your own ([`Moto::start`]).
    pub fn user_allowed(&self, user: &str, actions: &[&str]) -> (String, String) {
        let script = "import json\n\
                      iam = boto3.client('iam', region_name=sqs.meta.region_name, endpoint_url=sqs.meta.endpoint_url, aws_access_key_id='testing', aws_secret_access_key='testing')\n\
                      iam.create_user(UserName=sys.argv[1])\n\
                      policy = {'Version': '2012-10-17', 'Statement': [{'Effect': 'Allow', 'Action': sys.argv[2:], 'Resource': '*'}]}\n\
                      iam.put_user_policy(UserName=sys.argv[1], PolicyName='ebb-test', PolicyDocument=json.dumps(policy))\n\
                      key = iam.create_access_key(UserName=sys.argv[1])['AccessKey']\n\
                      print(key['AccessKeyId'], key['SecretAccessKey'])";
        let args: Vec<&str> = std::iter::once(user).chain(actions.iter().copied()).collect();
        let printed = self.boto3(script, &args);
        let (id, secret) = printed.trim().split_once(' ').expect("an access key id and its secret");
        (id.to_string(), secret.to_string())
    }

    /// From now on this moto authenticates every request and authorizes it by the caller's
    /// IAM policies (moto's `INITIAL_NO_AUTH_ACTION_COUNT`, set to 0 through its
    /// `/moto-api/reset-auth`). Never on [`Moto::shared`]: every other test's keys would be
    /// refused.
    pub fn enforce_iam(&self) {
        let script = "import urllib.request\n\
                      request = urllib.request.Request(sqs.meta.endpoint_url + '/moto-api/reset-auth', data=b'0', method='POST', headers={'Content-Type': 'text/plain'})\n\
                      print(urllib.request.urlopen(request).read().decode())";
        let answer = self.boto3(script, &[]);
        assert!(answer.contains("\"ok\""), "moto did not turn IAM on: {answer}");
    }

    /// Runs `script` under moto's Python with boto3, an SQS client on this moto in the
    /// variable `sqs`; its arguments are in `sys.argv[1:]`. Returns what it printed; panics
    /// with its error output if it fails.
    pub fn boto3(&self, script: &str, args: &[&str]) -> String {
        let prelude = format!(
            "import sys, boto3\nsqs = boto3.client('sqs', region_name='{REGION}', endpoint_url='{}', aws_access_key_id='testing', aws_secret_access_key='testing')\n",
            self.endpoint()
        );
        let output = Command::new(MOTO_PYTHON).arg("-c").arg(format!("{prelude}{script}")).args(args).output().expect("moto's Python runs");
        assert!(output.status.success(), "boto3 script failed: {}\n{script}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.guard.take(); // EOF: the guard stops moto
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
