//! The HTTP API: `GET /status`, `GET /metrics`, `GET /healthz`, `GET /readyz`,
//! `POST /queues/{name}/messages`, `POST /queues/{name}/notify`, `POST /queues/{name}/pause`,
//! `POST /queues/{name}/resume`, the poison routes and `GET /audit`.
//! When a token is configured, every route but the probes (`/healthz`, `/readyz`) requires
//! `Authorization: Bearer <token>`; without it `/readyz` shows no reasons.
//!
//! Every error answer is JSON, `{"error": "<reason>"}`. [`serve`] runs the API on hyper with
//! the limits of [`ApiLimits`] (header and body deadlines, an idle timeout, a connection limit
//! that keeps room for the probes), so slow or idle clients cannot hold the API.
//!
//! - `server`: connections and their limits;
//! - `auth`: the bearer token;
//! - `errors`: the JSON error answer;
//! - `body_limit`: the 413 for bodies over the limit;
//! - `routes`: one file per route family (messages and notify, pause and resume, status,
//!   metrics, the probes).

mod auth;
mod body_limit;
mod errors;
mod routes;
mod server;
mod storage_metrics;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) use auth::token_matches;
pub(crate) use routes::parse_items;
pub use routes::router;
pub(crate) use server::{bind, serve};

pub use crate::config::ApiLimits;
use crate::health::{Health, Readiness};
use crate::listener::Listener;
use crate::service::QueueHandle;

/// What the API serves.
pub struct Api {
    /// Listeners by (logical) queue name: one, or one per partition.
    pub listeners: BTreeMap<String, Vec<Listener>>,
    /// Queue handles by (logical) queue name: sends and notifications go through them.
    pub handles: BTreeMap<String, QueueHandle>,
    /// Required bearer token, if any.
    pub token: Option<String>,
    /// The host's health, answered by `/healthz`.
    pub health: Health,
    /// Whether each queue can work now, answered by `/readyz`.
    pub readiness: Readiness,
    /// Push notifications to the other hosts, if a bus is configured.
    pub bus: Option<Arc<crate::bus::Bus>>,
    /// Where operators' changes (pause, resume, requeue, purge) are recorded, if anywhere.
    pub audit: Option<Arc<crate::service::AuditLog>>,
    /// US dollars per 10,000 storage transactions, for the cost figures of `/status` and
    /// `/metrics` (config `price_per_10k_transactions`).
    pub price_per_10k_transactions: f64,
}
