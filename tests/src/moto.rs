//! moto's server, an Amazon SQS implementation, for the SQS tests: on 127.0.0.1 on a free
//! port, in memory. `tests/build.rs` installs the pinned version (with boto3) in a venv.
//!
//! Without Python 3 and its `venv` the build fails (the tests never skip), saying what is missing.

use std::io::{Read, Seek};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ebb::queue::sqs::{AwsCredentials, AwsSettings, SqsAccount};

use crate::azurite::free_port;

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
        // Its output goes to a file (a pipe nobody reads could fill and stall it).
        let log = tempfile::tempfile().expect("a temporary file for moto's output");
        // `sh` starts moto in the background and waits on its stdin; when this process
        // closes the pipe (on drop, or by exiting, even killed), it stops moto.
        let guard = r#""$@" & moto=$!; read _; kill $moto 2>/dev/null; wait $moto"#;
        let mut child = Command::new("sh")
            .args(["-c", guard, "moto-guard", MOTO_PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log.try_clone().expect("a second handle on the log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start moto under sh: {e}"));
        let guard = child.stdin.take();
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
                return Moto { port, child, guard };
            }
            if let Ok(Some(status)) = child.try_wait() {
                let mut output = String::new();
                let mut log = log;
                let _ = log.rewind();
                let _ = log.read_to_string(&mut output);
                panic!("moto exited ({status}) before answering on port {port}. Its output:\n{output}");
            }
            assert!(Instant::now() < deadline, "moto did not answer on port {port} within {START_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
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
