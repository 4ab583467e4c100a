//! Tries every capability a rule must not have. `configure` fails naming any that worked;
//! `on-queue-empty` tries to exit the host process; `optimal-dequeue-task-count` returns
//! what the rule reads from the source named by its `read` parameter (`wall-clock`,
//! `monotonic-clock`, `random` or `hash-seed`), so a test can tell whether it moves.
use std::hash::{BuildHasher, RandomState};
use std::time::{Instant, SystemTime};

use ebb_rules_sdk::{IdleContext, IdleDecision, Params, QueueState, ScalingRule, export_rule};

#[derive(Default)]
struct CapabilityProbe {
    read: Option<String>,
    configured_at: Option<Instant>,
}

// `wasi:random/random.get-random-u64`, imported by hand (as the `getrandom` crate does):
// std has no public way to reach it.
#[link(wasm_import_module = "wasi:random/random@0.2.0")]
unsafe extern "C" {
    #[link_name = "get-random-u64"]
    safe fn get_random_u64() -> u64;
}

fn leaks() -> Vec<String> {
    let mut leaks = Vec::new();
    for path in ["/", ".", "/etc/passwd", "/proc/self/environ"] {
        if std::fs::read_dir(path).is_ok() || std::fs::read(path).is_ok() {
            leaks.push(format!("file system: {path}"));
        }
    }
    if std::fs::write("ebb-probe.txt", b"x").is_ok() {
        leaks.push("file system: write".into());
    }
    for addr in ["127.0.0.1:1", "127.0.0.1:80", "[::1]:80"] {
        if std::net::TcpStream::connect(addr).is_ok() {
            leaks.push(format!("tcp connect {addr}"));
        }
    }
    if std::net::TcpListener::bind("127.0.0.1:0").is_ok() {
        leaks.push("tcp listen".into());
    }
    if std::net::UdpSocket::bind("127.0.0.1:0").is_ok() {
        leaks.push("udp bind".into());
    }
    if std::env::vars().next().is_some() {
        leaks.push("environment variables".into());
    }
    if std::env::args().next().is_some() {
        leaks.push("arguments".into());
    }
    leaks
}

impl ScalingRule for CapabilityProbe {
    fn configure(&mut self, params: &Params) -> Result<(), String> {
        self.read = params.iter().find(|(key, _)| key == "read").map(|(_, value)| value.clone());
        self.configured_at = Some(Instant::now());
        match leaks().as_slice() {
            [] => Ok(()),
            leaks => Err(format!("capabilities leaked: {}", leaks.join("; "))),
        }
    }

    fn optimal_dequeue_task_count(&self, _: &QueueState) -> u32 {
        let read: u64 = match self.read.as_deref() {
            Some("wall-clock") => SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(u64::MAX, |t| t.as_nanos() as u64),
            Some("monotonic-clock") => self.configured_at.map_or(u64::MAX, |at| at.elapsed().as_nanos() as u64),
            Some("random") => get_random_u64(),
            Some("hash-seed") => RandomState::new().hash_one(1u8),
            _ => 0,
        };
        // Every bit counts: fold the high half into the low one.
        (read ^ (read >> 32)) as u32
    }

    fn on_queue_empty(&self, _: &IdleContext) -> IdleDecision {
        std::process::exit(3)
    }
}

export_rule!(CapabilityProbe);
