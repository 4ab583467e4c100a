//! Settings of the parts above the configuration (the API server, the KEDA scaler),
//! defined here so that the configuration never imports them.

use std::net::SocketAddr;
use std::time::Duration;

/// Limits of the HTTP server (config keys `max_message_bytes` and `[api]`'s timeouts and
/// connection counts).
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
    /// How long a client may take to send a request's body once its headers are in; then
    /// 408 and the connection closes (a body sent a byte at a time holds no slot for long).
    /// Default 30 s.
    pub body_read_timeout: Duration,
    /// Most connections open at once, so a flood of connections cannot take the file
    /// descriptors the host needs to call its handlers. When all are open, the one that has
    /// waited longest for a request is closed for the newcomer; all being inside requests,
    /// newcomers wait in the kernel's backlog. Default 256.
    pub max_connections: usize,
    /// Connections kept for the probes (`/healthz`, `/readyz`): other requests are answered
    /// on at most `max_connections - probe_connections` connections at once, and get 503
    /// beyond. Default 8.
    pub probe_connections: usize,
}

impl ApiLimits {
    /// How many requests other than probes are answered at once (at least 1).
    pub fn request_slots(&self) -> usize {
        self.max_connections.saturating_sub(self.probe_connections).max(1)
    }
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            max_body_bytes: crate::defaults::MAX_MESSAGE_BYTES,
            header_read_timeout: crate::defaults::HEADER_READ_TIMEOUT,
            idle_timeout: crate::defaults::IDLE_TIMEOUT,
            body_read_timeout: crate::defaults::BODY_READ_TIMEOUT,
            max_connections: crate::defaults::MAX_CONNECTIONS,
            probe_connections: crate::defaults::PROBE_CONNECTIONS,
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

/// What an API token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ApiRole {
    /// Every `GET` route; nothing that changes state.
    Read,
    /// Every route.
    Admin,
}

impl ApiRole {
    /// As written in the config and in answers: `read` or `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApiRole::Read => "read",
            ApiRole::Admin => "admin",
        }
    }
}

impl std::fmt::Display for ApiRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One API token (`[[api.tokens]]`, or `api.token` / `EBB_API_TOKEN` as the admin `default`).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken {
    /// Who the token's holder is, in the audit log and `GET /whoami`.
    pub name: String,
    /// What it may do.
    pub role: ApiRole,
    /// The secret a request carries (`Authorization: Bearer <secret>`).
    pub secret: String,
}

// Written by hand so that a logged config never shows a secret.
impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiToken").field("name", &self.name).field("role", &self.role).field("secret", &"<redacted>").finish()
    }
}
