//! HTTP/1.1 spoken byte by byte: requests as bytes, sent on a connection of their own, and
//! one answer read back. For the tests of ebb's API that a well-behaved client cannot make
//! (slow, half-sent, oversized or malformed requests).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// An HTTP answer read off a raw connection.
#[derive(Debug)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The headers, names in lower case.
    pub headers: BTreeMap<String, String>,
    /// The body, as text.
    pub body: String,
}

impl Answer {
    /// The `error` of a JSON error answer; fails unless the answer is one.
    pub fn error(&self) -> Result<String> {
        ensure!(self.headers.get("content-type").is_some_and(|t| t.starts_with("application/json")), "not JSON: {self:?}");
        let value: serde_json::Value = serde_json::from_str(&self.body).with_context(|| format!("not JSON: {self:?}"))?;
        let reason = value["error"].as_str().with_context(|| format!("no error string: {self:?}"))?;
        ensure!(!reason.trim().is_empty(), "an empty reason: {self:?}");
        Ok(reason.to_string())
    }
}

/// Sends `request` as is on a new connection and reads one answer (headers, then a body of
/// its Content-Length, or up to the end of the stream).
pub async fn raw(addr: SocketAddr, request: &[u8]) -> Result<Answer> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(request).await?;
    tokio::time::timeout(Duration::from_secs(30), read_answer(&mut stream)).await.context("no answer within 30 s")?
}

/// Reads one answer off `stream` (see [`raw`]).
pub async fn read_answer(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> Result<Answer> {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 8192];
    {
        loop {
            if let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&bytes[..end]).to_string();
                let mut lines = head.lines();
                let status: u16 = lines.next().and_then(|l| l.split(' ').nth(1)).context("no status line")?.parse()?;
                let headers: BTreeMap<String, String> =
                    lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string())).collect();
                let length: Option<usize> = headers.get("content-length").map(|l| l.parse()).transpose()?;
                if length.is_none_or(|length| bytes.len() >= end + 4 + length) {
                    let body = &bytes[end + 4..];
                    let body = String::from_utf8_lossy(&body[..length.unwrap_or(body.len()).min(body.len())]).to_string();
                    return Ok(Answer { status, headers, body });
                }
            }
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                bail!("the connection closed before a whole answer: {:?}", String::from_utf8_lossy(&bytes));
            }
            bytes.extend_from_slice(&chunk[..n]);
        }
    }
}

/// A GET of `path`, with `token` as its bearer token.
pub fn get(path: &str, token: Option<&str>) -> Vec<u8> {
    request("GET", path, token, b"")
}

/// A request with `body` and its Content-Length; the connection closes after it.
pub fn request(method: &str, path: &str, token: Option<&str>, body: &[u8]) -> Vec<u8> {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let mut bytes = format!("{method} {path} HTTP/1.1\r\nHost: ebb\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n", body.len()).into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// A POST with a chunked body (no Content-Length), in chunks of 10 bytes.
pub fn chunked(path: &str, token: &str, body: &[u8]) -> Vec<u8> {
    let mut bytes =
        format!("POST {path} HTTP/1.1\r\nHost: ebb\r\nAuthorization: Bearer {token}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").into_bytes();
    for chunk in body.chunks(10) {
        bytes.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        bytes.extend_from_slice(chunk);
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"0\r\n\r\n");
    bytes
}

/// Waits until the server closes `stream` (end of stream or reset), discarding what it sends.
pub async fn closed(stream: &mut (impl tokio::io::AsyncRead + Unpin)) {
    let mut buf = [0u8; 1024];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}

/// The head of a POST to `path` whose body of `length` bytes is still to come.
pub fn post_head(path: &str, token: &str, length: usize) -> Vec<u8> {
    format!("POST {path} HTTP/1.1\r\nHost: ebb\r\nAuthorization: Bearer {token}\r\nContent-Length: {length}\r\n\r\n").into_bytes()
}
