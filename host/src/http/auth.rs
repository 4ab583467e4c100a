//! The bearer token every route but the probes requires.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use super::Api;
use super::errors::error;

/// True when `given` is the token, compared in constant time (both sides hashed first, so
/// neither the content nor the length of the token leaks through timing).
pub(crate) fn token_matches(token: &str, given: Option<&str>) -> bool {
    let expected = Sha256::digest(token.as_bytes());
    let given = Sha256::digest(given.unwrap_or_default().as_bytes());
    bool::from(expected.as_slice().ct_eq(given.as_slice()))
}

/// The token a request carries (`Authorization: Bearer <token>`), if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "))
}

/// True when no token is configured or the request carries it.
pub(super) fn authorized(api: &Api, headers: &HeaderMap) -> bool {
    api.token.as_ref().is_none_or(|token| {
        let given = bearer(headers);
        given.is_some() && token_matches(token, given)
    })
}

pub(super) async fn require_token(State(api): State<Arc<Api>>, request: Request, next: Next) -> Response {
    if !authorized(&api, request.headers()) {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong API token (Authorization: Bearer <token>)");
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_matches_only_itself() {
        assert!(token_matches("s3cret", Some("s3cret")));
        for wrong in [None, Some(""), Some("s3cre"), Some("s3cret "), Some("S3cret"), Some("s3cret-and-more")] {
            assert!(!token_matches("s3cret", wrong), "{wrong:?}");
        }
    }
}
