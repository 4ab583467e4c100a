//! A Redis server for the push-notification bus tests: Debian's `redis-server` (installed by
//! `tests/build.rs`) on a free 127.0.0.1 port, in memory, stopped on drop. It can be stopped
//! and started again on the same port, for outage tests.

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::azurite::free_port;

include!(concat!(env!("OUT_DIR"), "/redis.rs"));

/// A running (or stopped) Redis server on its own port.
pub struct RedisServer {
    port: u16,
    /// `sh` running the server; it stops the server when its stdin closes (on `stop`, on
    /// drop, or when the test process exits however it exits).
    child: Option<(Child, ChildStdin)>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers.
    pub fn start() -> RedisServer {
        let mut server = RedisServer { port: free_port(), child: None };
        server.resume();
        server
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (clients see their connections reset).
    pub fn stop(&mut self) {
        if let Some((mut child, guard)) = self.child.take() {
            drop(guard);
            let _ = child.wait();
        }
    }

    /// Stops the server's process without closing anything (SIGSTOP): connections stay open
    /// and nothing answers, like a stalled server or a silently dropped route.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server go on (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        // The server's process title (it sets its own), never the guard shell's command line.
        let pattern = format!("redis-server 127.0.0.1:{}$", self.port);
        let status = Command::new("pkill").args([signal, "-f", &pattern]).status().expect("pkill runs");
        assert!(status.success(), "no redis-server on port {} to signal", self.port);
    }

    /// Starts it again on the same port.
    pub fn resume(&mut self) {
        self.stop();
        let port = self.port.to_string();
        let guard = r#""$@" & server=$!; read _; kill -9 $server 2>/dev/null; wait $server"#;
        let mut child = Command::new("sh")
            .args(["-c", guard, "redis-guard", REDIS_SERVER])
            .args(["--port", &port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode", "yes", "--daemonize", "no"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start {REDIS_SERVER}: {e}"));
        let stdin = child.stdin.take().unwrap();
        self.child = Some((child, stdin));
        let address = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&address, Duration::from_millis(100)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not answer on port {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
