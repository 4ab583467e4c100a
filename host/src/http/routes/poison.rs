//! A queue's poison messages: `GET /queues/{name}/poison?limit=N`,
//! `POST /queues/{name}/poison/requeue?ids=ID,ID` (or `?all=true`) and
//! `POST /queues/{name}/poison/purge?confirm=NAME`. See [`crate::service::poison`].

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use serde_json::json;

use crate::http::Api;
use crate::http::auth::Caller;
use crate::http::errors::error;
use crate::service::QueueHandle;
use crate::service::poison::{MAX_PER_OPERATION, Selection};

/// Listed when `limit` is not given.
const DEFAULT_LIMIT: u32 = 100;
/// Most ids one requeue names.
const MAX_IDS: usize = 1_000;

/// The queue's handle and poison queue, or why not (a 404's reason).
fn queue<'a>(api: &'a Api, name: &str) -> Result<(&'a QueueHandle, Arc<dyn crate::queue::QueueClient>), String> {
    let Some(handle) = api.handles.get(name) else {
        return Err(format!("no queue named {} on this host", crate::http::errors::echoed(name)));
    };
    let Some(poison) = handle.poison_queue() else {
        return Err(format!("queue {name} has no poison queue on this host"));
    };
    Ok((handle, poison))
}

fn failed(reason: anyhow::Error) -> Response {
    error(StatusCode::SERVICE_UNAVAILABLE, format!("{reason:#}"))
}

pub(super) async fn list(State(api): State<Arc<Api>>, Path(name): Path<String>, RawQuery(query): RawQuery) -> Response {
    let limit = match super::query_value(query.as_deref(), "limit") {
        None => DEFAULT_LIMIT,
        Some(value) => match value.parse::<u32>().ok().filter(|n| (1..=MAX_PER_OPERATION).contains(n)) {
            Some(limit) => limit,
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("limit: {:?} is not a count from 1 to {MAX_PER_OPERATION}", crate::http::errors::echoed(&value)),
                );
            }
        },
    };
    let (handle, poison) = match queue(&api, &name) {
        Ok(found) => found,
        Err(reason) => return error(StatusCode::NOT_FOUND, reason),
    };
    let _one_at_a_time = handle.poison_operation().await;
    match crate::service::poison::list(&poison, handle.claim_store(), limit).await {
        Ok(messages) => Json(json!({ "queue": name, "poison_queue": poison.name(), "messages": messages })).into_response(),
        Err(reason) => failed(reason),
    }
}

pub(super) async fn requeue(
    State(api): State<Arc<Api>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let (ids, all) = (super::query_value(query.as_deref(), "ids"), super::query_value(query.as_deref(), "all"));
    let selection = match (ids, all.as_deref()) {
        (None, Some("true")) => Selection::All,
        (Some(value), None) => {
            let ids: BTreeSet<String> = value.split(',').map(str::trim).filter(|id| !id.is_empty()).map(str::to_owned).collect();
            if ids.is_empty() || ids.len() > MAX_IDS {
                return error(StatusCode::BAD_REQUEST, format!("ids: 1 to {MAX_IDS} ids, comma-separated"));
            }
            Selection::Ids(ids)
        }
        _ => return error(StatusCode::BAD_REQUEST, "say which, one of: ?ids=ID,ID or ?all=true"),
    };
    let (handle, poison) = match queue(&api, &name) {
        Ok(found) => found,
        Err(reason) => return error(StatusCode::NOT_FOUND, reason),
    };
    let _one_at_a_time = handle.poison_operation().await;
    let which = match &selection {
        Selection::All => "every message".to_string(),
        Selection::Ids(ids) => format!("ids {}", ids.iter().cloned().collect::<Vec<_>>().join(",")),
    };
    if let Some(refused) = super::unauditable(&api) {
        return refused;
    }
    match crate::service::poison::requeue(&poison, handle, &selection).await {
        Ok(taken) => {
            super::audit(&api, &caller, "requeue", &name, &format!("ok: {} requeued, {} skipped, of {which}", taken.count, taken.skipped.len()));
            Json(json!({ "queue": name, "requeued": taken.count, "skipped": taken.skipped, "not_found": taken.not_found })).into_response()
        }
        Err(reason) => {
            super::audit(&api, &caller, "requeue", &name, &format!("failed: {reason:#} (of {which})"));
            failed(reason)
        }
    }
}

pub(super) async fn purge(State(api): State<Arc<Api>>, Extension(caller): Extension<Caller>, Path(name): Path<String>, RawQuery(query): RawQuery) -> Response {
    if super::query_value(query.as_deref(), "confirm").is_none_or(|confirm| confirm != name) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("purging deletes every poison message of {0}: confirm with ?confirm={0}", crate::http::errors::echoed(&name)),
        );
    }
    let (handle, poison) = match queue(&api, &name) {
        Ok(found) => found,
        Err(reason) => return error(StatusCode::NOT_FOUND, reason),
    };
    let _one_at_a_time = handle.poison_operation().await;
    if let Some(refused) = super::unauditable(&api) {
        return refused;
    }
    match crate::service::poison::purge(&poison, handle.claim_store()).await {
        Ok(taken) => {
            super::audit(&api, &caller, "purge", &name, &format!("ok: {} purged", taken.count));
            Json(json!({ "queue": name, "purged": taken.count })).into_response()
        }
        Err(reason) => {
            super::audit(&api, &caller, "purge", &name, &format!("failed: {reason:#}"));
            failed(reason)
        }
    }
}
