//! Shared Key authorization: a per-try pipeline policy that stamps `x-ms-date` and signs
//! each request (HMAC-SHA256 of the canonical string, keyed with the account key).
//! <https://learn.microsoft.com/rest/api/storageservices/authorize-with-shared-key>
//!
//! A SAS needs no policy: it rides in the queue URL's query (see `connection.rs`).

use std::sync::Arc;

use async_trait::async_trait;
use azure_core::credentials::Secret;
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{Context, Request, Url};
use azure_core::time::{OffsetDateTime, to_rfc7231};

/// Signs every try of a request with the account's Shared Key.
pub(crate) struct SharedKeyPolicy {
    account: String,
    key: Secret,
}

impl std::fmt::Debug for SharedKeyPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedKeyPolicy").field("account", &self.account).field("key", &"<redacted>").finish()
    }
}

impl SharedKeyPolicy {
    pub(crate) fn new(account: &str, key: Secret) -> Self {
        SharedKeyPolicy { account: account.to_string(), key }
    }
}

#[async_trait]
impl Policy for SharedKeyPolicy {
    async fn send(&self, ctx: &Context, request: &mut Request, next: &[Arc<dyn Policy>]) -> PolicyResult {
        // Per try: a retried request needs a fresh date (the service allows 15 minutes of skew).
        request.insert_header("x-ms-date", to_rfc7231(&OffsetDateTime::now_utc()));
        let headers: Vec<(String, String)> = request.headers().iter().map(|(n, v)| (n.as_str().to_string(), v.as_str().to_string())).collect();
        let content_length = request.body().len().unwrap_or(0);
        let to_sign = string_to_sign(&self.account, request.method().as_ref(), request.url(), &headers, content_length);
        let signature = azure_core::hmac::hmac_sha256(&to_sign, &self.key)?;
        request.insert_header("authorization", format!("SharedKey {}:{signature}", self.account));
        next[0].send(ctx, request, &next[1..]).await
    }
}

/// The account SAS version we sign (its string to sign ends with the encryption scope).
const ACCOUNT_SAS_VERSION: &str = "2020-12-06";

/// An account SAS for the queue service (`ss=q`, `srt=co`), as the query to append.
pub(crate) fn account_sas(account: &str, key: &Secret, permissions: &str, expiry: std::time::SystemTime) -> anyhow::Result<String> {
    if permissions.is_empty() || !permissions.chars().all(|c| "raupcl".contains(c)) {
        anyhow::bail!("SAS permissions {permissions:?}: use the letters r, a, u, p, c, l");
    }
    let expiry = humantime::format_rfc3339_seconds(expiry).to_string();
    let (services, resource_types, protocols) = ("q", "co", "https,http");
    // Account name, permissions, services, resource types, start, expiry, IP, protocols,
    // version, encryption scope, each followed by a newline.
    let to_sign = format!("{account}\n{permissions}\n{services}\n{resource_types}\n\n{expiry}\n\n{protocols}\n{ACCOUNT_SAS_VERSION}\n\n");
    let signature = azure_core::hmac::hmac_sha256(&to_sign, key).map_err(|e| anyhow::anyhow!("signing the SAS: {e}"))?;
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("sv", ACCOUNT_SAS_VERSION)
        .append_pair("ss", services)
        .append_pair("srt", resource_types)
        .append_pair("sp", permissions)
        .append_pair("se", &expiry)
        .append_pair("spr", protocols)
        .append_pair("sig", &signature)
        .finish();
    Ok(query)
}

/// The string a Shared Key signature covers (service version 2009-09-19 and later).
/// `headers` are the request's headers (names case-insensitive); `content_length` is the
/// body's length (written as the empty string when zero).
pub(crate) fn string_to_sign(account: &str, method: &str, url: &Url, headers: &[(String, String)], content_length: u64) -> String {
    let header = |name: &str| headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map_or("", |(_, v)| v.as_str());
    let length = if content_length == 0 { String::new() } else { content_length.to_string() };
    let mut out = String::new();
    for part in [
        method,
        header("content-encoding"),
        header("content-language"),
        &length,
        header("content-md5"),
        header("content-type"),
        header("date"),
        header("if-modified-since"),
        header("if-match"),
        header("if-none-match"),
        header("if-unmodified-since"),
        header("range"),
    ] {
        out.push_str(part);
        out.push('\n');
    }
    // Canonicalized headers: every x-ms-* header, lower-cased, sorted, value trimmed.
    let mut ms: Vec<(String, &str)> = headers.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.trim())).filter(|(n, _)| n.starts_with("x-ms-")).collect();
    ms.sort();
    for (name, value) in ms {
        out.push_str(&format!("{name}:{value}\n"));
    }
    // Canonicalized resource: /account + the URL's (encoded) path, then each query
    // parameter lower-cased and sorted, its values decoded, sorted and comma-joined.
    out.push('/');
    out.push_str(account);
    out.push_str(url.path());
    let mut params: Vec<(String, Vec<String>)> = Vec::new();
    for (name, value) in url.query_pairs() {
        let name = name.to_ascii_lowercase();
        match params.iter_mut().find(|(n, _)| *n == name) {
            Some((_, values)) => values.push(value.into_owned()),
            None => params.push((name, vec![value.into_owned()])),
        }
    }
    params.sort();
    for (name, mut values) in params {
        values.sort();
        out.push_str(&format!("\n{name}:{}", values.join(",")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    /// The example in Microsoft's "Authorize with Shared Key" page (Blob service, version
    /// 2015-02-21): a GET of a container's metadata.
    #[test]
    fn string_to_sign_matches_the_documented_example() {
        let url = Url::parse("https://myaccount.blob.core.windows.net/mycontainer?restype=container&comp=metadata&timeout=20").unwrap();
        let headers = headers(&[("x-ms-version", "2015-02-21"), ("x-ms-date", "Fri, 26 Jun 2015 23:39:12 GMT"), ("user-agent", "ebb")]);
        assert_eq!(
            string_to_sign("myaccount", "GET", &url, &headers, 0),
            "GET\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:Fri, 26 Jun 2015 23:39:12 GMT\nx-ms-version:2015-02-21\n/myaccount/mycontainer\ncomp:metadata\nrestype:container\ntimeout:20"
        );
    }

    #[test]
    fn path_style_urls_repeat_the_account_and_the_body_length_and_type_are_signed() {
        let url = Url::parse("http://127.0.0.1:10001/devstoreaccount1/orders/messages?visibilitytimeout=30&popreceipt=a%2Bb%3D").unwrap();
        let headers = headers(&[("Content-Type", "application/xml"), ("X-MS-Version", " 2026-04-06 "), ("x-ms-date", "Mon, 01 Jan 2024 00:00:00 GMT")]);
        assert_eq!(
            string_to_sign("devstoreaccount1", "POST", &url, &headers, 42),
            "POST\n\n\n42\n\napplication/xml\n\n\n\n\n\n\nx-ms-date:Mon, 01 Jan 2024 00:00:00 GMT\nx-ms-version:2026-04-06\n\
             /devstoreaccount1/devstoreaccount1/orders/messages\npopreceipt:a+b=\nvisibilitytimeout:30"
        );
    }

    #[test]
    fn the_signature_is_hmac_sha256_of_the_string_under_the_decoded_key() {
        // azure_core's own vector, so a change of HMAC backend cannot go unnoticed.
        let key = Secret::new("FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF");
        assert_eq!(azure_core::hmac::hmac_sha256("create hmac signature for data", &key).unwrap(), "D/y9XyIEdUzEbdV570h8dou/mfkbMA1lKCOPqPDPAd0=");
    }

    #[test]
    fn debug_never_shows_the_key() {
        let policy = SharedKeyPolicy::new("acct", Secret::new("c2VjcmV0LWtleQ=="));
        let shown = format!("{policy:?}");
        assert!(!shown.contains("c2VjcmV0LWtleQ") && shown.contains("acct"), "{shown}");
    }
}
