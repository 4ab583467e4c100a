//! Settings of the parts above the configuration (the API server, the KEDA scaler),
//! defined here so that the configuration never imports them.

use std::net::SocketAddr;
use std::time::Duration;

/// Limits of the HTTP server (config keys `max_message_bytes`, `[api] header_read_timeout`
/// and `[api] idle_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiLimits {
    /// Largest request body, in bytes: the largest message (`max_message_bytes`). Default 65536.
    pub max_body_bytes: usize,
    /// How long a client may take to send a request's headers (from the first wait for them,
    /// idle keep-alive time included) before its connection is closed. Default 10 s.
    pub header_read_timeout: Duration,
    /// How long a connection may go without a byte read or written before it is closed (a
    /// request whose body stops coming, a client that stops reading). Default 60 s.
    pub idle_timeout: Duration,
    /// Most connections open at once; further clients wait in the kernel's backlog, so a
    /// flood of idle connections cannot take the file descriptors the host needs to call
    /// its handlers. Default 256.
    pub max_connections: usize,
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            max_body_bytes: crate::defaults::MAX_MESSAGE_BYTES,
            header_read_timeout: crate::defaults::HEADER_READ_TIMEOUT,
            idle_timeout: crate::defaults::IDLE_TIMEOUT,
            max_connections: crate::defaults::MAX_CONNECTIONS,
        }
    }
}

/// `[scaler]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalerSettings {
    /// Where the gRPC service listens.
    pub listen: SocketAddr,
    /// Token every call must carry, if any.
    pub token: Option<String>,
    /// Most instances the metric asks for. Default 100.
    pub max_instances: u32,
    /// `ebb scaler`: how often each storage queue is counted. Default 1 s.
    pub poll_interval: Duration,
}

impl Default for ScalerSettings {
    fn default() -> Self {
        ScalerSettings {
            listen: crate::defaults::SCALER_LISTEN.parse().expect("the default scaler address parses"),
            token: None,
            max_instances: crate::defaults::MAX_INSTANCES,
            poll_interval: crate::defaults::SCALER_POLL_INTERVAL,
        }
    }
}
