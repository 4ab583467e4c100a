//! `POST /queues/{name}/pause[?for=10m]` and `POST /queues/{name}/resume`: an operator
//! holds a queue (no get; calls that run finish) and lets it go again.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use serde_json::json;

use crate::http::Api;
use crate::http::auth::Caller;
use crate::http::errors::error;
use crate::service::check_pause_length;

/// The query of a pause: `for`, a duration (`90s`, `10m`, `2h`) from 1 s to 365 days; none
/// pauses until resumed (the route table lets no other parameter through).
fn parse_pause_query(query: Option<&str>) -> Result<Option<Duration>, String> {
    let Some(value) = super::query_value(query, "for") else { return Ok(None) };
    // Bounded before parsing: humantime reads any length.
    let parsed = (value.len() <= 64).then(|| humantime::parse_duration(&value).ok()).flatten();
    let duration = parsed.ok_or_else(|| format!("for: {:?} is not a duration such as 90s, 10m or 2h", crate::http::errors::echoed(&value)))?;
    check_pause_length(duration).map(Some).map_err(|reason| format!("for: {reason}"))
}

pub(super) async fn pause(State(api): State<Arc<Api>>, Extension(caller): Extension<Caller>, Path(name): Path<String>, RawQuery(query): RawQuery) -> Response {
    let Some(queue) = api.handles.get(&name) else {
        return crate::http::errors::no_queue(&name);
    };
    let for_ = match parse_pause_query(query.as_deref()) {
        Ok(for_) => for_,
        Err(reason) => return error(StatusCode::BAD_REQUEST, reason),
    };
    if let Some(refused) = super::unauditable(&api) {
        return refused;
    }
    match queue.pause(for_) {
        Ok(pause) => {
            let until = for_.map_or_else(|| "until resumed".to_string(), |d| format!("for {}", humantime::format_duration(d)));
            super::audit(&api, &caller, "pause", &name, &format!("ok: paused {until}"));
            Json(json!({ "queue": name, "paused": pause })).into_response()
        }
        Err(e) => {
            super::audit(&api, &caller, "pause", &name, &format!("failed: {e:#}"));
            error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}"))
        }
    }
}

pub(super) async fn resume(State(api): State<Arc<Api>>, Extension(caller): Extension<Caller>, Path(name): Path<String>) -> Response {
    let Some(queue) = api.handles.get(&name) else {
        return crate::http::errors::no_queue(&name);
    };
    if let Some(refused) = super::unauditable(&api) {
        return refused;
    }
    match queue.resume() {
        None => {
            super::audit(&api, &caller, "resume", &name, "ok: resumed");
            Json(json!({ "queue": name, "paused": null })).into_response()
        }
        // Resumed all the same: on a full disk the queue must drain to free space.
        Some(reason) => {
            let warning = format!("resumed on this host, not kept across a restart yet: {reason}");
            super::audit(&api, &caller, "resume", &name, &format!("ok: {warning}"));
            Json(json!({ "queue": name, "paused": null, "warning": warning })).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_query_is_bounded() {
        assert_eq!(parse_pause_query(None), Ok(None));
        assert_eq!(parse_pause_query(Some("for=10m")), Ok(Some(Duration::from_secs(600))));
        for (query, reason) in [("for=0s", "outside 1s"), ("for=400days", "outside 1s"), ("for=soon", "is not a duration")] {
            let refused = parse_pause_query(Some(query)).unwrap_err();
            assert!(refused.contains(reason), "{query}: {refused}");
        }
        let long = format!("for={}", "9".repeat(10_000));
        assert!(parse_pause_query(Some(&long)).unwrap_err().contains("is not a duration"));
    }
}
