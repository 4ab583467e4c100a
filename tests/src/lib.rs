//! Shared helpers for the end-to-end tests in `tests/all`.

pub mod azurite;
pub mod baselines;
pub mod conformance;
pub mod fault_proxy;
pub mod moto;
pub mod otlp;
pub mod redis;

/// Paths of the rule components built by `build.rs`, one constant per guest.
/// The official Azure Storage Queues SDK for Python and `tests/azure-sdk/interop.py`.
pub mod azure_sdk {
    include!(concat!(env!("OUT_DIR"), "/azure_sdk.rs"));

    /// Deletes queue `queue` of the account of `connection_string` with the official SDK,
    /// as an operator (or an account restored empty) removes it under a running host.
    pub fn delete_queue(connection_string: &str, queue: &str) {
        let output = std::process::Command::new(AZURE_SDK_PYTHON).arg(AZURE_SDK_INTEROP).args(["delete", connection_string, queue, "none"]).output().unwrap();
        assert!(output.status.success(), "interop.py delete {queue}: {}", String::from_utf8_lossy(&output.stderr));
    }
}

/// Debian's headless browser and its WebDriver server, for the console's browser tests.
pub mod chromium {
    include!(concat!(env!("OUT_DIR"), "/chromium.rs"));
}

pub mod guests {
    include!(concat!(env!("OUT_DIR"), "/guests.rs"));
}

/// Python with grpcio (pinned in `tests/scaler/requirements.txt`) and the stubs grpcio-tools
/// generated from `host/proto/externalscaler.proto`.
pub mod python_grpc {
    include!(concat!(env!("OUT_DIR"), "/python_grpc.rs"));
}

/// A component with an extra custom section: the same rule, a different sha256.
pub fn version_of(bytes: &[u8], version: u64) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let name = b"ebb-test-version";
    let mut content = Vec::new();
    leb(name.len(), &mut content);
    content.extend_from_slice(name);
    content.extend_from_slice(&version.to_le_bytes());
    let mut out = bytes.to_vec();
    out.push(0);
    leb(content.len(), &mut out);
    out.extend_from_slice(&content);
    out
}

/// Collects what is logged while it is the thread's default subscriber, as text.
#[derive(Clone, Default)]
pub struct LogCapture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogCapture {
    /// Captures events at `level` and above on this thread until the guard is dropped.
    pub fn start(&self, level: tracing::Level) -> tracing::subscriber::DefaultGuard {
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt().with_max_level(level).with_ansi(false).with_writer(move || writer.clone()).finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// Everything captured so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
