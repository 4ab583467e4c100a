//! The app the bench posts to: 200 with an empty body for any request, once its body is read.
//!
//! It runs in a process of its own (this binary, `ebb-bench serve`), so that the bench's CPU
//! figures count the client side only. The bench holds the server's stdin: the server ends
//! when it reads end-of-file there, so a bench killed outright does not leave it running.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// How long the server may take to write its port.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Serves on 127.0.0.1 (a free port, written to `port_file` once listening) until stdin
/// closes. One thread: the client side is what is measured, and on a small machine a
/// server of many threads would only crowd it.
pub(crate) fn serve(port_file: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("failed to start the bench server's runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("failed to bind the bench server to 127.0.0.1")?;
        let port = listener.local_addr()?.port();
        // Written aside and renamed, so the bench never reads half a number.
        let mut partial = port_file.as_os_str().to_owned();
        partial.push(".partial");
        std::fs::write(&partial, port.to_string()).with_context(|| format!("failed to write port file {}", port_file.display()))?;
        std::fs::rename(&partial, port_file).with_context(|| format!("failed to write port file {}", port_file.display()))?;
        // The body is read whole: an unread body would cost the connection its keep-alive.
        let app = axum::Router::new().fallback(|body: bytes::Bytes| async move {
            drop(body);
            axum::http::StatusCode::OK
        });
        let parent_gone = async {
            let mut sink = tokio::io::sink();
            let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut sink).await;
        };
        tokio::select! {
            served = axum::serve(listener, app) => served.context("the bench server failed"),
            () = parent_gone => Ok(()),
        }
    })
}

/// The server process, started by [`ServerProcess::start`]; killed and reaped when dropped,
/// however the bench ends.
pub(crate) struct ServerProcess {
    child: Child,
    address: SocketAddr,
    /// Holds the port file.
    _dir: tempfile::TempDir,
}

impl ServerProcess {
    /// Starts `serve` from this process's own executable, after the arguments that select
    /// the bench in it (`leading`, see [`crate::main`]), and waits for its port.
    pub(crate) fn start(leading: &[&str]) -> anyhow::Result<ServerProcess> {
        let exe = std::env::current_exe().context("failed to find this executable to start the bench server")?;
        let dir = tempfile::tempdir().context("failed to create a temporary folder for the bench server's port file")?;
        let port_file = dir.path().join("port");
        let child = Command::new(&exe)
            .args(leading)
            .args(["serve", "--port-file"])
            .arg(&port_file)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("failed to start the bench server {}", exe.display()))?;
        // From here the drop kills it, whatever fails.
        let mut server = ServerProcess { child, address: SocketAddr::from(([127, 0, 0, 1], 0)), _dir: dir };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(text) = std::fs::read_to_string(&port_file) {
                let port: u16 = text.trim().parse().with_context(|| format!("the bench server wrote port {text:?}"))?;
                server.address.set_port(port);
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait().context("failed to watch the bench server")? {
                bail!("the bench server ended at start ({status})");
            }
            if Instant::now() > deadline {
                bail!("the bench server wrote no port within {START_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub(crate) fn address(&self) -> SocketAddr {
        self.address
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's CPU time so far, every thread; `None` where that cannot be read. For
    /// context only: none of the figures includes it.
    pub(crate) fn cpu(&self) -> Option<Duration> {
        crate::measure::threads_cpu(Some(self.pid()), |_| true)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
