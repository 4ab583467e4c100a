//! The API's routes, one file per family.

mod control;
mod health;
mod messages;
mod metrics;
mod poison;
mod status;

pub(crate) use messages::parse_items;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Extension, Request, State};
use axum::handler::Handler;
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Json, Response};
use axum::routing::{MethodFilter, MethodRouter, get, on};

use tokio_util::sync::CancellationToken;

use super::auth::{Caller, Gate, require_token};
use super::body_limit::{BodyGate, limit_bodies};
use super::console;
use super::errors::json_errors;
use super::{Api, ApiLimits};

/// One route that needs a token: its method, its path pattern, the query parameters it
/// takes and its handler.
struct Route {
    method: Method,
    path: &'static str,
    handler: MethodRouter<Arc<Api>>,
}

/// A route taking the query parameters `query` (each at most once) and no other: the rest get
/// 400 before the handler runs ([`only_query`]).
fn route<H: Handler<T, Arc<Api>>, T: 'static>(method: Method, path: &'static str, query: &'static [&'static str], handler: H) -> Route {
    let filter = MethodFilter::try_from(method.clone()).expect("a route's method is a standard one");
    Route { method, path, handler: takes_query(query, on(filter, handler)) }
}

/// `handler`, behind the check that its request's query holds only `query`'s parameters. The
/// check runs only for a method the route takes: another method gets 405 (with `Allow`),
/// whatever its query.
fn takes_query(query: &'static [&'static str], handler: MethodRouter<Arc<Api>>) -> MethodRouter<Arc<Api>> {
    handler.route_layer(middleware::from_fn_with_state(query, only_query))
}

/// Every route but the probes: all need a token, and all but `GET` need an admin's.
fn authenticated_routes() -> Vec<Route> {
    vec![
        route(Method::GET, "/status", &[], status::status),
        route(Method::GET, "/metrics", &[], metrics::metrics),
        route(Method::GET, "/whoami", &[], whoami),
        route(Method::POST, "/queues/{name}/messages", &["delay_ms", "group", "dedup_id"], messages::send),
        route(Method::POST, "/queues/{name}/items", &[], messages::send_items),
        route(Method::POST, "/queues/{name}/replies/{id}", &["timeout_ms", "item"], messages::take_reply),
        route(Method::POST, "/queues/{name}/notify", &[], messages::notify),
        route(Method::POST, "/queues/{name}/pause", &["for"], control::pause),
        route(Method::POST, "/queues/{name}/resume", &[], control::resume),
        route(Method::GET, "/queues/{name}/poison", &["limit"], poison::list),
        route(Method::POST, "/queues/{name}/poison/requeue", &["ids", "all"], poison::requeue),
        route(Method::POST, "/queues/{name}/poison/purge", &["confirm"], poison::purge),
        route(Method::GET, "/audit", &["limit"], audit_entries),
        route(Method::GET, "/events", &[], console::events),
    ]
}

/// Why `query` is refused by a route taking the parameters `allowed`: a parameter it does not
/// take, or one given twice. `None`: every parameter is one it takes, once.
pub(crate) fn refused_query(query: Option<&str>, allowed: &[&str]) -> Option<String> {
    let mut seen: Vec<std::borrow::Cow<'_, str>> = Vec::new();
    for (key, _) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if !allowed.contains(&key.as_ref()) {
            let takes = match allowed {
                [] => "none".to_string(),
                [one] => format!("only {one}"),
                many => many.join(", "),
            };
            return Some(format!("unknown query parameter {:?} (this route takes {takes})", super::errors::echoed(&key)));
        }
        if seen.contains(&key) {
            return Some(format!("{key}: given more than once"));
        }
        seen.push(key);
    }
    None
}

/// The value of the query parameter `key`, if given. Only the parameters a route takes, each
/// at most once, reach its handler ([`only_query`]): the handler reads values, not keys.
pub(super) fn query_value(query: Option<&str>, key: &str) -> Option<String> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes()).find(|(k, _)| k == key).map(|(_, value)| value.into_owned())
}

/// 400 naming the first query parameter the route does not take (or takes once and got twice).
async fn only_query(State(allowed): State<&'static [&'static str]>, request: Request, next: Next) -> Response {
    match refused_query(request.uri().query(), allowed) {
        Some(reason) => super::errors::error(StatusCode::BAD_REQUEST, reason),
        None => next.run(request).await,
    }
}

/// The method and path pattern of every route that needs a token, as [`router`] serves them
/// (read from the same table), so a test can try each with each role.
pub fn authenticated_route_table() -> Vec<(Method, &'static str)> {
    authenticated_routes().into_iter().map(|r| (r.method, r.path)).collect()
}

/// The API's routes, with the body limit of `limits` (the probes read no body, so no
/// declared length turns them away). The console's streams end when the router is dropped.
#[cfg(test)]
pub fn router(api: Arc<Api>, limits: ApiLimits) -> Router {
    router_until(api, limits, CancellationToken::new())
}

/// [`router`], whose console streams end when `closing` is cancelled (a server's graceful
/// shutdown waits for every answer to end, and a stream would not on its own).
pub(crate) fn router_until(api: Arc<Api>, limits: ApiLimits, closing: CancellationToken) -> Router {
    let console = console::Console::start(api.clone(), closing);
    let routes = authenticated_routes();
    let gate = Gate { api: api.clone(), routes: Arc::new(routes.iter().map(|r| r.path).collect()) };
    let authenticated = routes
        .into_iter()
        .fold(Router::new(), |router, r| router.route(r.path, r.handler))
        .layer(Extension(console))
        .layer(middleware::from_fn_with_state(gate, require_token))
        // Each request's limit is set by `limit_bodies` (a send to a queue with a claim store
        // takes larger bodies than the rest).
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(BodyGate::new(limits, api.clone()), limit_bodies));
    Router::new()
        .route("/healthz", takes_query(&[], get(health::healthz)))
        .route("/readyz", takes_query(&[], get(health::readyz)))
        // The console's files hold no data: no token, so the page can load and ask for one.
        .route("/", takes_query(&[], get(console::index)))
        .route("/console/app.js", takes_query(&[], get(console::app_js)))
        .route("/console/app.css", takes_query(&[], get(console::app_css)))
        .merge(authenticated)
        .with_state(api)
        .layer(Extension(limits))
        .layer(middleware::from_fn(json_errors))
}

/// `GET /whoami`: the caller's token name and role, `{"name": "ops", "role": "read"}` (a page
/// hides what the role may not do).
async fn whoami(Extension(caller): Extension<Caller>) -> Json<Caller> {
    Json(caller)
}

/// Records an operator's change in the audit log, if the host keeps one, under the name of
/// the caller's token.
fn audit(api: &Api, caller: &Caller, action: &str, target: &str, result: &str) {
    if let Some(log) = &api.audit {
        log.record(&caller.name, action, target, result);
    }
}

/// The answer refusing an operator's change when the audit log cannot take its entry (503,
/// naming the file), checked before the change is made: a change is made recorded or not at
/// all. (A disk that fills between the check and the entry still loses the entry: it is
/// logged.)
fn unauditable(api: &Api) -> Option<axum::response::Response> {
    let log = api.audit.as_ref()?;
    let error = log.writable().err()?;
    tracing::warn!("an operator's change was refused: {error:#}");
    Some(super::errors::error(axum::http::StatusCode::SERVICE_UNAVAILABLE, format!("{error:#}; the change was not made")))
}

/// Most entries `GET /audit` returns.
const MAX_AUDIT_ENTRIES: usize = 1_000;

/// `GET /audit?limit=N`: the last operators' changes, oldest first (1 to 1,000; default 100).
async fn audit_entries(
    axum::extract::State(api): axum::extract::State<Arc<Api>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse as _;
    let limit = match query_value(query.as_deref(), "limit").map(|value| value.parse::<usize>()) {
        None => None,
        Some(Ok(n)) if (1..=MAX_AUDIT_ENTRIES).contains(&n) => Some(n),
        Some(_) => return super::errors::error(StatusCode::BAD_REQUEST, format!("limit: a count from 1 to {MAX_AUDIT_ENTRIES}")),
    };
    let tail = match &api.audit {
        Some(log) => match log.tail(limit.unwrap_or(100)) {
            Ok(tail) => tail,
            Err(e) => return super::errors::error(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}")),
        },
        None => crate::service::AuditTail { entries: Vec::new(), skipped: 0 },
    };
    axum::response::Json(serde_json::json!({ "entries": tail.entries, "skipped": tail.skipped })).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_holds_only_the_parameters_its_route_takes_each_once() {
        assert_eq!(refused_query(None, &[]), None);
        assert_eq!(refused_query(Some(""), &[]), None);
        assert_eq!(refused_query(Some("delay_ms=250"), &["delay_ms"]), None);
        assert_eq!(refused_query(Some("ids=a,b"), &["ids", "all"]), None);
        for (query, allowed, reason) in [
            ("x=1", &[][..], "unknown query parameter \"x\" (this route takes none)"),
            ("x", &[], "unknown query parameter \"x\" (this route takes none)"),
            ("delay=1", &["delay_ms"], "unknown query parameter \"delay\" (this route takes only delay_ms)"),
            // Percent-encoded keys are decoded before they are compared.
            ("delay_%6Ds=1&x", &["delay_ms"], "unknown query parameter \"x\" (this route takes only delay_ms)"),
            ("until=1m", &["for"], "unknown query parameter \"until\" (this route takes only for)"),
            ("all=true&what=1", &["ids", "all"], "unknown query parameter \"what\" (this route takes ids, all)"),
            ("delay_ms=1&delay_ms=1", &["delay_ms"], "delay_ms: given more than once"),
            ("for=1m&for=2m", &["for"], "for: given more than once"),
        ] {
            assert_eq!(refused_query(Some(query), allowed).as_deref(), Some(reason), "{query}");
        }
        let long_key = format!("{}=1", "x".repeat(60_000));
        let refused = refused_query(Some(&long_key), &["for"]).unwrap();
        assert!(refused.len() < 200 && refused.contains('…'), "an unknown key is echoed cut short: {refused}");
    }

    #[test]
    fn a_handler_reads_the_value_of_its_parameter() {
        assert_eq!(query_value(Some("limit=5"), "limit").as_deref(), Some("5"));
        assert_eq!(query_value(Some("confirm=a%20b"), "confirm").as_deref(), Some("a b"));
        assert_eq!(query_value(Some("ids=1"), "all"), None);
        assert_eq!(query_value(None, "limit"), None);
    }
}
