//! The operator console: `GET /` and its assets (`/console/app.js`, `/console/app.css`),
//! embedded in the binary and served without a token (they hold no data), and
//! `GET /events`, the server push the page reads (authenticated like every data route).
//!
//! The page asks for everything else through the JSON API with the token it keeps in
//! `sessionStorage`: no cookie is ever set, so no other site can act with the operator's
//! rights. Its content security policy allows its own scripts and styles only, so a message
//! body that holds markup cannot run, even if it reached the DOM as markup (it does not: the
//! page writes data with `textContent` only).
//!
//! - `events`: the push stream, the last hour's samples of every queue, and the bounds that
//!   keep both cheap.

pub(super) mod events;

use std::sync::LazyLock;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest as _, Sha256};

pub(super) use events::{Console, events};

/// The policy of every console answer: the page's own files only, no inline script or
/// style, no framing, no form posting anywhere, no plugin.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
     object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One embedded file, with the ETag of its content.
struct Asset {
    content_type: &'static str,
    body: &'static [u8],
    etag: String,
}

impl Asset {
    fn new(content_type: &'static str, body: &'static [u8]) -> Asset {
        let etag = format!("\"{}\"", &hex::encode(Sha256::digest(body))[..16]);
        Asset { content_type, body, etag }
    }
}

static INDEX: LazyLock<Asset> = LazyLock::new(|| Asset::new("text/html; charset=utf-8", include_bytes!("assets/index.html")));
static APP_JS: LazyLock<Asset> = LazyLock::new(|| Asset::new("text/javascript; charset=utf-8", include_bytes!("assets/app.js")));
static APP_CSS: LazyLock<Asset> = LazyLock::new(|| Asset::new("text/css; charset=utf-8", include_bytes!("assets/app.css")));

/// The headers every console answer carries (the page, its assets, the event stream).
pub(super) fn protect(headers: &mut HeaderMap) {
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
}

/// An asset: revalidated on every load (`no-cache`: a new binary may serve new files under
/// the same name), answered with 304 when the browser's copy is current.
fn serve(asset: &Asset, request_headers: &HeaderMap) -> Response {
    let fresh = request_headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()).is_some_and(|tags| tags.split(',').any(|t| t.trim() == asset.etag));
    let mut response = if fresh { StatusCode::NOT_MODIFIED.into_response() } else { asset.body.into_response() };
    let headers = response.headers_mut();
    protect(headers);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(etag) = HeaderValue::from_str(&asset.etag) {
        headers.insert(header::ETAG, etag);
    }
    response
}

pub(super) async fn index(headers: HeaderMap) -> Response {
    serve(&INDEX, &headers)
}

pub(super) async fn app_js(headers: HeaderMap) -> Response {
    serve(&APP_JS, &headers)
}

pub(super) async fn app_css(headers: HeaderMap) -> Response {
    serve(&APP_CSS, &headers)
}

#[cfg(test)]
mod tests {
    /// The console's goal (docs/benchmarks.md): the page and its assets under 64 KiB.
    #[test]
    fn the_console_weighs_under_64_kib() {
        let weight = super::INDEX.body.len() + super::APP_JS.body.len() + super::APP_CSS.body.len();
        assert!(weight < 64 * 1024, "the console weighs {weight} bytes");
    }
}
