//! Tries every capability a rule must not have. `configure` fails naming any that worked;
//! `on-queue-empty` tries to exit the host process.
use ebb_rules_sdk::{IdleContext, IdleDecision, Params, ScalingRule, export_rule};

#[derive(Default)]
struct CapabilityProbe;

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
    fn configure(&mut self, _: &Params) -> Result<(), String> {
        match leaks().as_slice() {
            [] => Ok(()),
            leaks => Err(format!("capabilities leaked: {}", leaks.join("; "))),
        }
    }

    fn on_queue_empty(&self, _: &IdleContext) -> IdleDecision {
        std::process::exit(3)
    }
}

export_rule!(CapabilityProbe);
