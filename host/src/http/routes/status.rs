//! `GET /status`: every queue's state and cost, as JSON ([`HostStatus`]).

use std::sync::Arc;

use axum::extract::State;
use axum::response::Json;

use crate::cost::CostStatus;
use crate::http::{Api, queue_cost};
use crate::listener::Listener;
use crate::status::{HostStatus, PartitionedStatus, QueueStatus};

/// A listener's status with its cost at `price` US dollars per 10,000 transactions.
fn queue_status(listener: &Listener, price: f64) -> QueueStatus {
    let listener = listener.status();
    QueueStatus { cost: queue_cost(&listener, price), listener }
}

/// Every queue partition's status, in the order of the API's listeners.
pub(super) fn queue_statuses(api: &Api) -> Vec<QueueStatus> {
    api.listeners.iter().flat_map(|(queue, listeners)| listeners.iter().map(move |l| queue_status(l, api.price_of(queue)))).collect()
}

/// What `/status` answers for `api`: each listener's status read once.
fn host_status(api: &Api) -> HostStatus {
    let price = api.host_price();
    let mut queues = Vec::new();
    let mut partitioned = Vec::new();
    for (queue, listeners) in &api.listeners {
        let price = api.price_of(queue);
        let group: Vec<QueueStatus> = listeners.iter().map(|l| queue_status(l, price)).collect();
        if group.len() > 1 {
            partitioned.push(PartitionedStatus::of(queue, &group, price));
        }
        queues.extend(group);
    }
    let cost = Some(CostStatus::total(queues.iter().filter_map(|q| q.cost.as_ref()), price));
    let bus = api.bus.as_ref().map(|b| b.status());
    let storage = crate::http::storage_metrics::status(api.handles.values().flat_map(|h| h.storage_clients()));
    let s3 = crate::http::storage_metrics::s3_status(api.handles.values().filter_map(|h| h.claim_records()));
    HostStatus { queues, partitioned, cost, bus, storage, s3 }
}

pub(super) async fn status(State(api): State<Arc<Api>>) -> Json<HostStatus> {
    Json(host_status(&api))
}
