//! The HTTP API: `GET /status`, `GET /metrics`, `GET /healthz`, `GET /readyz`,
//! `POST /queues/{name}/messages`, `POST /queues/{name}/notify`, `POST /queues/{name}/pause`,
//! `POST /queues/{name}/resume`, the poison routes, `GET /audit`, and the console: `GET /`
//! with its assets under `/console/` (no token: they hold no data) and `GET /events`.
//! `GET /whoami` answers the caller's token name and role. When tokens are configured, every
//! route but the probes and the console's files requires `Authorization: Bearer <token>` (401
//! without a known one; without one `/readyz` shows no reasons), and a `read` token gets 403
//! on every method but `GET`.
//!
//! Every route takes only the query parameters the route table names for it, each once (400
//! otherwise, checked before the handler runs). Every error answer is JSON,
//! `{"error": "<reason>"}`, repeating at most 64 bytes of anything the request sent. [`serve_once_started`] runs the API on hyper with
//! the limits of [`ApiLimits`] (header and body deadlines, an idle timeout, a connection limit
//! that keeps room for the probes), so slow or idle clients cannot hold the API.
//!
//! - `server`: connections and their limits;
//! - `auth`: the bearer tokens and their roles;
//! - `errors`: the JSON error answer;
//! - `body_limit`: the 413 for bodies over the limit;
//! - `console`: the operator's web page (`GET /`, its assets, the `GET /events` push);
//! - `routes`: one file per route family (messages and notify, pause and resume, status,
//!   metrics, the probes).

mod auth;
mod body_limit;
mod console;
#[cfg(test)]
mod console_tests;
mod errors;
#[cfg(test)]
mod fuzz;
mod routes;
mod server;
mod storage_metrics;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) use auth::token_matches;
pub(crate) use auth::{ANONYMOUS, Caller};
pub use routes::authenticated_route_table;
pub(crate) use routes::parse_items;
#[cfg(test)]
pub use routes::router;
#[cfg(test)]
pub(crate) use server::serve;
pub(crate) use server::{bind, serve_once_started};

pub use crate::config::ApiLimits;
use crate::cost::CostStatus;
use crate::health::{Health, Readiness};
use crate::listener::{Listener, ListenerStatus};
use crate::service::QueueHandle;

/// What the API serves.
pub struct Api {
    /// Listeners by (logical) queue name: one, or one per partition.
    pub listeners: BTreeMap<String, Vec<Listener>>,
    /// Queue handles by (logical) queue name: sends and notifications go through them.
    pub handles: BTreeMap<String, QueueHandle>,
    /// The tokens a request may carry, each with its name and role; none: every request is
    /// the admin `anonymous`.
    pub tokens: Vec<crate::config::ApiToken>,
    /// The host's health, answered by `/healthz`.
    pub health: Health,
    /// Whether each queue can work now, answered by `/readyz`.
    pub readiness: Readiness,
    /// Push notifications to the other hosts, if a bus is configured.
    pub bus: Option<Arc<crate::bus::Bus>>,
    /// Where operators' changes (pause, resume, requeue, purge) are recorded, if anywhere.
    pub audit: Option<Arc<crate::service::AuditLog>>,
    /// US dollars per 10,000 storage transactions, for the cost figures of `/status` and
    /// `/metrics` (config `price_per_10k_transactions`), of queues whose backend is not
    /// priced by [`Api::queue_prices`].
    pub price_per_10k_transactions: f64,
    /// The price of each (logical) queue whose backend bills at a price of its own (SQS's
    /// per request, [`crate::cost::Billing`]).
    pub queue_prices: BTreeMap<String, f64>,
}

impl Api {
    /// The price of `queue`'s transactions, US dollars per 10,000.
    pub(crate) fn price_of(&self, queue: &str) -> f64 {
        self.queue_prices.get(queue).copied().unwrap_or(self.price_per_10k_transactions)
    }

    /// The price the host's totals name: its queues' when they share one, else the configured
    /// one (each queue's cost names its own).
    pub(crate) fn host_price(&self) -> f64 {
        let mut prices = self.listeners.keys().map(|queue| self.price_of(queue));
        match prices.next() {
            Some(first) if prices.all(|price| price == first) => first,
            _ => self.price_per_10k_transactions,
        }
    }

    /// The prices of `config`'s queues whose backend has a price of its own.
    pub(crate) fn queue_prices_of(config: &crate::config::Config) -> BTreeMap<String, f64> {
        config
            .queues
            .iter()
            .filter_map(|queue| {
                let billing = queue.billing();
                (billing != crate::cost::Billing::Configured).then(|| (queue.name.to_string(), billing.price_per_10k(config.price_per_10k_transactions)))
            })
            .collect()
    }
}

/// A queue's live cost figures (`None` when its transactions are not metered), as `/status`,
/// `/metrics` and the console's events show them.
pub(crate) fn queue_cost(status: &ListenerStatus, price: f64) -> Option<CostStatus> {
    status.transaction_rates.map(|rates| CostStatus::new(rates, price))
}
