//! Who calls: the bearer token every route but the probes requires, resolved to a named
//! [`Caller`] with a role. A `read` token may use every `GET` route and nothing else: any other
//! method needs `admin`, decided here for every route (one added later included), not route
//! by route.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use subtle::{ConditionallySelectable as _, ConstantTimeEq as _};

use super::Api;
use super::errors::error;
use crate::config::{ApiRole, ApiToken};

/// The name of the caller when no token is configured (the API then listens on loopback only).
pub(crate) const ANONYMOUS: &str = "anonymous";

/// Who made a request, in its extensions once the token is checked (`GET /whoami` answers it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Caller {
    /// The token's name (`default` for `api.token`), or `anonymous` without tokens.
    pub name: String,
    /// What it may do.
    pub role: ApiRole,
}

/// True when `given` is the token, compared in constant time (both sides hashed first, so
/// neither the content nor the length of the token leaks through timing).
pub(crate) fn token_matches(token: &str, given: Option<&str>) -> bool {
    let expected = Sha256::digest(token.as_bytes());
    let given = Sha256::digest(given.unwrap_or_default().as_bytes());
    bool::from(expected.as_slice().ct_eq(given.as_slice()))
}

/// The token `given` is, if any. Every token is hashed and compared, and the match is picked
/// without a branch, so the time taken tells neither whether nor which token matched.
fn identify<'a>(tokens: &'a [ApiToken], given: &str) -> Option<&'a ApiToken> {
    let given = Sha256::digest(given.as_bytes());
    // The index of the match plus one; 0: none.
    let mut found = 0u32;
    for (i, token) in tokens.iter().enumerate() {
        let expected = Sha256::digest(token.secret.as_bytes());
        let index = u32::try_from(i + 1).unwrap_or(u32::MAX);
        found.conditional_assign(&index, expected.as_slice().ct_eq(given.as_slice()));
    }
    found.checked_sub(1).and_then(|i| tokens.get(i as usize))
}

/// The token a request carries (`Authorization: Bearer <token>`), if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    // The scheme is case-insensitive (RFC 9110, section 11.1): `bearer` and `BEARER` are Bearer.
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next()?.to_str().ok()?;
    // Two credentials: which one the caller meant is not ours to pick (the first one won,
    // so a read token behind an admin one acted as the admin).
    if values.next().is_some() {
        return None;
    }
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

/// Who calls: the holder of the token the request carries; the admin `anonymous` when no
/// token is configured; `None` for a missing or wrong token.
pub(super) fn caller(tokens: &[ApiToken], headers: &HeaderMap) -> Option<Caller> {
    if tokens.is_empty() {
        return Some(Caller { name: ANONYMOUS.into(), role: ApiRole::Admin });
    }
    let token = identify(tokens, bearer(headers)?)?;
    Some(Caller { name: token.name.clone(), role: token.role })
}

/// True when no token is configured or the request carries one of them (any role).
pub(super) fn authorized(api: &Api, headers: &HeaderMap) -> bool {
    caller(&api.tokens, headers).is_some()
}

/// Whether `method` only reads: what a `read` token may do.
fn reads_only(method: &Method) -> bool {
    method == Method::GET || method == Method::HEAD
}

/// The route `path` is, as its pattern (`/queues/{name}/pause`) when it is one of `routes`,
/// else the path cut short: a 403 never echoes unbounded input.
fn shown_route(routes: &[&'static str], path: &str) -> String {
    let segments: Vec<&str> = path.split('/').collect();
    let matches = |pattern: &str| {
        let parts: Vec<&str> = pattern.split('/').collect();
        parts.len() == segments.len() && parts.iter().zip(&segments).all(|(p, s)| p == s || (p.starts_with('{') && !s.is_empty()))
    };
    if let Some(pattern) = routes.iter().find(|p| matches(p)) {
        return (*pattern).to_string();
    }
    super::errors::echoed(path)
}

/// What [`require_token`] needs: the API (its tokens) and the routes' patterns, for the 403.
#[derive(Clone)]
pub(super) struct Gate {
    pub(super) api: Arc<Api>,
    pub(super) routes: Arc<Vec<&'static str>>,
}

/// 401 without a configured token; 403 for a `read` token on anything but `GET`/`HEAD`;
/// else the request goes on with its [`Caller`] in its extensions.
pub(super) async fn require_token(State(gate): State<Gate>, mut request: Request, next: Next) -> Response {
    let Some(caller) = caller(&gate.api.tokens, request.headers()) else {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong API token (Authorization: Bearer <token>)");
    };
    if caller.role == ApiRole::Read && !reads_only(request.method()) {
        let method: String = request.method().as_str().chars().take(16).collect();
        let route = shown_route(&gate.routes, request.uri().path());
        return error(StatusCode::FORBIDDEN, format!("token {:?} has role read; {method} {route} needs admin", caller.name));
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(name: &str, role: ApiRole, secret: &str) -> ApiToken {
        ApiToken { name: name.into(), role, secret: secret.into() }
    }

    fn with_bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
        headers
    }

    #[test]
    fn the_token_matches_only_itself() {
        assert!(token_matches("s3cret", Some("s3cret")));
        for wrong in [None, Some(""), Some("s3cre"), Some("s3cret "), Some("S3cret"), Some("s3cret-and-more")] {
            assert!(!token_matches("s3cret", wrong), "{wrong:?}");
        }
    }

    #[test]
    fn each_token_resolves_to_its_own_caller_and_a_wrong_one_to_none() {
        let tokens = [token("default", ApiRole::Admin, "adm1n"), token("ops", ApiRole::Read, "r3ad"), token("bot", ApiRole::Admin, "b0t")];
        for (given, expected) in [("adm1n", Some(("default", ApiRole::Admin))), ("r3ad", Some(("ops", ApiRole::Read))), ("b0t", Some(("bot", ApiRole::Admin)))]
        {
            let caller = caller(&tokens, &with_bearer(given));
            assert_eq!(caller.as_ref().map(|c| (c.name.as_str(), c.role)), expected, "{given}");
        }
        for wrong in ["r3a", "r3ad ", "R3AD", "adm1nr3ad", ""] {
            assert_eq!(caller(&tokens, &with_bearer(wrong)), None, "{wrong:?}");
        }
        assert_eq!(caller(&tokens, &HeaderMap::new()), None, "no Authorization header");
        for scheme in ["bearer", "BEARER", "BeArEr"] {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, format!("{scheme} r3ad").parse().unwrap());
            assert_eq!(caller(&tokens, &headers).map(|c| c.name), Some("ops".to_string()), "the scheme {scheme} is Bearer");
        }
        let mut basic = HeaderMap::new();
        basic.insert(header::AUTHORIZATION, "Basic r3ad".parse().unwrap());
        assert_eq!(caller(&tokens, &basic), None, "only the Bearer scheme");
    }

    /// Attack pass (session 11): with two Authorization headers the first one was used.
    #[test]
    fn two_authorization_headers_are_no_credential() {
        let tokens = [token("ops", ApiRole::Read, "r3ad"), token("bot", ApiRole::Admin, "b0t")];
        for (first, second) in [("b0t", "r3ad"), ("r3ad", "b0t"), ("b0t", "b0t")] {
            let mut headers = with_bearer(first);
            headers.append(header::AUTHORIZATION, format!("Bearer {second}").parse().unwrap());
            assert_eq!(caller(&tokens, &headers), None, "{first} then {second}");
        }
    }

    #[test]
    fn without_tokens_everyone_is_the_admin_anonymous() {
        assert_eq!(caller(&[], &HeaderMap::new()), Some(Caller { name: ANONYMOUS.into(), role: ApiRole::Admin }));
        assert_eq!(caller(&[], &with_bearer("anything")), Some(Caller { name: ANONYMOUS.into(), role: ApiRole::Admin }));
    }

    #[test]
    fn a_forbidden_route_shows_as_its_pattern_or_cut_short() {
        let routes = ["/status", "/queues/{name}/pause", "/queues/{name}/poison/requeue"];
        assert_eq!(shown_route(&routes, "/queues/orders/pause"), "/queues/{name}/pause");
        assert_eq!(shown_route(&routes, "/queues/orders/poison/requeue"), "/queues/{name}/poison/requeue");
        assert_eq!(shown_route(&routes, "/queues//pause"), "/queues//pause", "an empty segment is no name");
        assert_eq!(shown_route(&routes, "/nowhere"), "/nowhere");
        let long = format!("/{}", "é".repeat(10_000));
        let shown = shown_route(&routes, &long);
        assert!(shown.len() <= super::super::errors::MAX_ECHO_BYTES + '…'.len_utf8() && shown.ends_with('…'), "{shown}");
    }
}
