//! Azurite, the Azure Storage emulator, for the Azure queue tests: the queue service on a
//! free port with in-memory storage. `tests/build.rs` installs the pinned version.
//!
//! Without Node.js the tests fail (they never skip) with a message saying what is missing.

use std::io::{Read, Seek};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ebb::queue::azure::{AzureAccount, DEVELOPMENT_ACCOUNT, DEVELOPMENT_KEY};

include!(concat!(env!("OUT_DIR"), "/azurite.rs"));

/// How long Azurite may take to answer on its port.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running Azurite queue service; stopped on drop, and when the test process exits
/// (however it exits: the process holds the write end of a pipe that Azurite's guard reads).
pub struct Azurite {
    port: u16,
    child: Child,
    guard: Option<ChildStdin>,
    /// Its https certificate (PEM file), when it serves https.
    certificate: Option<std::path::PathBuf>,
}

impl Azurite {
    /// Starts Azurite on a free port and waits until it answers. Panics, saying why, if it
    /// cannot (no Node.js, or it exits).
    pub fn start() -> Azurite {
        Azurite::start_with(free_port(), &[], None)
    }

    /// Starts Azurite's blob service (claim checks) on a free port, in memory.
    pub fn start_blob() -> Azurite {
        Azurite::launch(AZURITE_BLOB, &["--blobHost", "127.0.0.1", "--blobPort"], free_port(), &[], None)
    }

    /// One blob service for the whole test process, started on first use. Give each test
    /// its own queue, so its own container.
    pub fn shared_blob() -> &'static Azurite {
        static SHARED: OnceLock<Azurite> = OnceLock::new();
        SHARED.get_or_init(Azurite::start_blob)
    }

    /// The development account with its queues on this Azurite and its blobs on `blob`'s
    /// (a blob service started with [`Azurite::start_blob`]).
    pub fn account_with_blobs(&self, blob: &Azurite) -> AzureAccount {
        AzureAccount::from_connection_string(&format!("{};BlobEndpoint={}", self.connection_string(), blob.endpoint()))
            .expect("the development connection string parses")
    }

    /// Starts Azurite on `port` (a host may have been pointed at it before it ran).
    pub fn start_on(port: u16) -> Azurite {
        Azurite::start_with(port, &[], None)
    }

    /// A connection string for the development account on an Azurite at `port` over http,
    /// whether or not one runs there.
    pub fn connection_string_for(port: u16) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={DEVELOPMENT_ACCOUNT};AccountKey={DEVELOPMENT_KEY};QueueEndpoint=http://127.0.0.1:{port}/{DEVELOPMENT_ACCOUNT}"
        )
    }

    /// Starts Azurite over https (a fresh self-signed certificate for 127.0.0.1, written
    /// into `dir`) with Entra ID (OAuth) tokens accepted: Azurite checks a token's issuer,
    /// audience and times, not its signature (`--oauth basic`).
    pub fn start_https_oauth(dir: &std::path::Path) -> Azurite {
        let key = rcgen::KeyPair::generate().expect("a key pair");
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("certificate parameters");
        params.subject_alt_names.push(rcgen::SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])));
        let certificate = params.self_signed(&key).expect("a self-signed certificate");
        let (cert_path, key_path) = (dir.join("azurite-cert.pem"), dir.join("azurite-key.pem"));
        std::fs::write(&cert_path, certificate.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        let (cert, key) = (cert_path.to_str().unwrap(), key_path.to_str().unwrap());
        Azurite::start_with(free_port(), &["--oauth", "basic", "--cert", cert, "--key", key], Some(cert_path.clone()))
    }

    fn start_with(port: u16, extra: &[&str], certificate: Option<std::path::PathBuf>) -> Azurite {
        Azurite::launch(AZURITE_QUEUE, &["--queueHost", "127.0.0.1", "--queuePort"], port, extra, certificate)
    }

    /// Starts `tool` (an Azurite service) with `listen` (its host flag, its value, its port
    /// flag) and `port`, in memory.
    fn launch(tool: &str, listen: &[&str; 3], port: u16, extra: &[&str], certificate: Option<std::path::PathBuf>) -> Azurite {
        let mut args = vec![tool.to_string()];
        args.extend(listen.iter().map(|s| s.to_string()));
        args.extend([port.to_string(), "--inMemoryPersistence".into(), "--disableTelemetry".into(), "--silent".into()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let (child, guard) = start_guarded("Azurite", &args, port, START_TIMEOUT, "it needs Node.js 20+ on PATH");
        Azurite { port, child, guard, certificate }
    }

    /// One Azurite for the whole test process, started on first use. Give each test its
    /// own queue ([`unique_queue_name`]).
    pub fn shared() -> &'static Azurite {
        static SHARED: OnceLock<Azurite> = OnceLock::new();
        SHARED.get_or_init(Azurite::start)
    }

    /// The port the queue service listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The queue endpoint (path style: `http://127.0.0.1:<port>/devstoreaccount1`, or https).
    pub fn endpoint(&self) -> String {
        let scheme = if self.certificate.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}/{DEVELOPMENT_ACCOUNT}", self.port)
    }

    /// The https certificate's PEM file, when it serves https (trust it with `ca_file`).
    pub fn certificate(&self) -> Option<&std::path::Path> {
        self.certificate.as_deref()
    }

    /// A connection string for the development account on this Azurite.
    pub fn connection_string(&self) -> String {
        format!("DefaultEndpointsProtocol=http;AccountName={DEVELOPMENT_ACCOUNT};AccountKey={DEVELOPMENT_KEY};QueueEndpoint={}", self.endpoint())
    }

    /// The development account on this Azurite.
    pub fn account(&self) -> AzureAccount {
        AzureAccount::from_connection_string(&self.connection_string()).expect("the development connection string parses")
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        self.guard.take(); // EOF: the guard stops Azurite
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

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free local port")
}

/// A valid Azure queue name, unique in this process and across processes: `<stem>-<pid>-<n>`
/// with the stem reduced to lowercase letters, digits and single hyphens.
pub fn unique_queue_name(stem: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let mut clean = String::new();
    for c in stem.chars().map(|c| c.to_ascii_lowercase()) {
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() { c } else { '-' };
        if !(c == '-' && (clean.is_empty() || clean.ends_with('-'))) {
            clean.push(c);
        }
    }
    clean.truncate(40);
    let clean = clean.trim_end_matches('-');
    let clean = if clean.is_empty() { "q" } else { clean };
    format!("{clean}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Starts `args` (a program and its arguments) as `name`, listening on `port`, and waits
/// until it answers there. It runs under `sh`, which stops it when our end of its stdin
/// (the returned guard) closes: on drop, or when this process exits, even killed. Panics,
/// saying why and `hint`, if it exits or does not answer within `timeout`.
pub(crate) fn start_guarded(name: &str, args: &[String], port: u16, timeout: Duration, hint: &str) -> (Child, Option<ChildStdin>) {
    // Its output goes to a file (a pipe nobody reads could fill and stall it).
    let mut log = tempfile::tempfile().unwrap_or_else(|e| panic!("a temporary file for {name}'s output: {e}"));
    let guard = r#""$@" & server=$!; read _; kill $server 2>/dev/null; wait $server"#;
    let mut child = Command::new("sh")
        .args(["-c", guard, "guard"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(log.try_clone().expect("a second handle on the log file"))
        .spawn()
        .unwrap_or_else(|e| panic!("failed to start {name} under sh: {e}"));
    let guard = child.stdin.take();
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
            return (child, guard);
        }
        if let Ok(Some(status)) = child.try_wait() {
            let mut output = String::new();
            let _ = log.rewind();
            let _ = log.read_to_string(&mut output);
            panic!("{name} exited ({status}) before answering on port {port}; {hint}. Its output:\n{output}");
        }
        assert!(Instant::now() < deadline, "{name} did not answer on port {port} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
