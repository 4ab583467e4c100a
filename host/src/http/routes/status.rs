//! `GET /status`: every queue's state and cost, as JSON.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Json;
use serde_json::json;

use crate::cost::CostStatus;
use crate::http::{Api, queue_cost};
use crate::listener::{Listener, ListenerStatus};

pub(super) fn statuses(api: &Api) -> Vec<ListenerStatus> {
    api.listeners.values().flatten().map(Listener::status).collect()
}

/// The sums over a partitioned queue's partitions.
fn partitioned_status(queue: &str, listeners: &[Listener], price: f64) -> serde_json::Value {
    let statuses: Vec<ListenerStatus> = listeners.iter().map(Listener::status).collect();
    let costs: Vec<CostStatus> = statuses.iter().filter_map(|s| queue_cost(s, price)).collect();
    let sum = |f: fn(&ListenerStatus) -> u64| statuses.iter().map(f).fold(0u64, u64::saturating_add);
    json!({
        "queue": queue,
        "partitions": statuses.iter().map(|s| s.queue.clone()).collect::<Vec<_>>(),
        "approximate_depth": sum(|s| s.approximate_depth),
        "active_tasks": sum(|s| s.active_tasks.into()),
        "in_flight": sum(|s| s.in_flight.into()),
        "handler_calls": sum(|s| s.handler_calls.into()),
        "processed": sum(|s| s.processed),
        "failed": sum(|s| s.failed),
        "poisoned": sum(|s| s.poisoned),
        "cost": CostStatus::total(&costs, price),
    })
}

pub(super) async fn status(State(api): State<Arc<Api>>) -> Json<serde_json::Value> {
    let price = api.price_per_10k_transactions;
    let partitioned: Vec<_> = api.listeners.iter().filter(|(_, l)| l.len() > 1).map(|(queue, l)| partitioned_status(queue, l, price)).collect();
    let mut costs = Vec::new();
    let queues: Vec<serde_json::Value> = statuses(&api)
        .into_iter()
        .map(|s| {
            let cost = queue_cost(&s, price);
            costs.extend(cost);
            let mut value = serde_json::to_value(&s).unwrap_or_default();
            value["cost"] = json!(cost);
            value
        })
        .collect();
    let bus = api.bus.as_ref().map(|b| b.status());
    let storage = crate::http::storage_metrics::status(api.handles.values().flat_map(|h| h.storage_clients()));
    Json(json!({ "queues": queues, "partitioned": partitioned, "cost": CostStatus::total(&costs, price), "bus": bus, "storage": storage }))
}
