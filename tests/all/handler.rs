//! The HTTP handler against real local servers: redirects, huge error bodies, credentials.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use ebb::handler::{Handler, HttpHandler, IncomingMessage, PushedBack, RetryAfter};
use futures::StreamExt;

async fn serve(router: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

fn message() -> IncomingMessage {
    IncomingMessage {
        queue: "orders".into(),
        id: "1".into(),
        dequeue_count: 1,
        inserted_at: SystemTime::now(),
        body: b"{\"order\":42}"[..].into(),
        item: None,
        trace: None,
    }
}

/// Review defect: a 301 was followed as a GET without the body, and the 200 of that GET
/// deleted the message as handled.
#[tokio::test]
async fn a_redirect_is_a_failure_not_followed() {
    let landed = Arc::new(AtomicU64::new(0));
    let counter = landed.clone();
    let router = axum::Router::new().route("/old", axum::routing::post(|| async { (StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, "/landing")]) })).route(
        "/landing",
        axum::routing::get(move || {
            counter.fetch_add(1, Ordering::Relaxed);
            async { "hi" }
        }),
    );
    let addr = serve(router).await;
    let handler = HttpHandler::new(format!("http://{addr}/old").parse().unwrap(), Duration::from_secs(5)).unwrap();
    let error = format!("{:#}", handler.handle(&message()).await.unwrap_err());
    assert!(error.contains("301") && error.contains("does not follow redirects"), "{error}");
    assert_eq!(landed.load(Ordering::Relaxed), 0, "the redirect was not followed");
}

/// Review defect: a failing handler's whole answer was read into memory (a 2 GB error page
/// took the host to 8.6 GB).
#[tokio::test]
async fn only_the_start_of_a_huge_error_answer_is_read() {
    const CHUNK: usize = 64 << 10;
    const CHUNKS: u64 = 4096; // 256 MiB
    let produced = Arc::new(AtomicU64::new(0));
    let counter = produced.clone();
    let router = axum::Router::new().route(
        "/work",
        axum::routing::post(move || {
            let counter = counter.clone();
            async move {
                let chunks = futures::stream::iter(0..CHUNKS).map(move |_| {
                    counter.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, std::io::Error>(vec![b'x'; CHUNK])
                });
                (StatusCode::INTERNAL_SERVER_ERROR, Body::from_stream(chunks)).into_response()
            }
        }),
    );
    let addr = serve(router).await;
    let handler = HttpHandler::new(format!("http://{addr}/work").parse().unwrap(), Duration::from_secs(60)).unwrap();
    let error = format!("{:#}", handler.handle(&message()).await.unwrap_err());
    assert!(error.contains("500") && error.contains("xxxx"), "{error}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let read_mib = (produced.load(Ordering::Relaxed) * CHUNK as u64) >> 20;
    assert!(read_mib < 32, "{read_mib} MiB of the answer were produced: it was read far past its start");
}

/// Review defect: the password of a handler URL was in every failure line.
#[tokio::test]
async fn a_handler_urls_password_never_reaches_an_error() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let handler = HttpHandler::new(format!("http://user:hunter2@{closed}/work").parse().unwrap(), Duration::from_secs(5)).unwrap();
    let error = format!("{:#} / {:?}", handler.handle(&message()).await.unwrap_err(), handler.handle(&message()).await.unwrap_err());
    assert!(!error.contains("hunter2"), "{error}");
    assert!(error.contains("user:***@"), "the URL is still named: {error}");
    let router = axum::Router::new().route("/work", axum::routing::post(|| async { (StatusCode::BAD_GATEWAY, "down") }));
    let addr = serve(router).await;
    let handler = HttpHandler::new(format!("http://user:hunter2@{addr}/work").parse().unwrap(), Duration::from_secs(5)).unwrap();
    let error = format!("{:#}", handler.handle(&message()).await.unwrap_err());
    assert!(error.contains("502") && !error.contains("hunter2"), "{error}");
}

/// Second review: CR and LF in a failing answer were written into the log as they were,
/// so an app could forge log lines.
#[tokio::test]
async fn a_failing_answer_cannot_write_lines_into_the_log() {
    let router = axum::Router::new()
        .route("/work", axum::routing::post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "oops\r\n2026-01-01T00:00:00Z  INFO ebb: fake line\n") }));
    let addr = serve(router).await;
    let handler = HttpHandler::new(format!("http://{addr}/work").parse().unwrap(), Duration::from_secs(5)).unwrap();
    let error = format!("{:#}", handler.handle(&message()).await.unwrap_err());
    assert!(!error.contains('\n') && !error.contains('\r'), "{error:?}");
    assert!(error.contains("oops\\r\\n2026"), "escaped, still readable: {error}");
}

/// 429 and 503 are the app pushing back, with its `Retry-After` (seconds or an HTTP date);
/// other errors stay failures.
#[tokio::test]
async fn too_many_requests_and_unavailable_push_back_with_the_apps_retry_after() {
    let date = httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000));
    let answer_date = date.clone();
    let router = axum::Router::new()
        .route("/busy", axum::routing::post(|| async { (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, "7")]) }))
        .route("/down", axum::routing::post(|| async { StatusCode::SERVICE_UNAVAILABLE }))
        .route("/later", axum::routing::post(move || async move { (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, answer_date)]) }))
        .route("/junk", axum::routing::post(|| async { (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, "in a while")]) }))
        .route("/broken", axum::routing::post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, [(header::RETRY_AFTER, "7")]) }));
    let addr = serve(router).await;
    let call = |path: &'static str| async move {
        let handler = HttpHandler::new(format!("http://{addr}{path}").parse().unwrap(), Duration::from_secs(5)).unwrap();
        handler.handle(&message()).await.unwrap_err()
    };
    let retry_after = |error: anyhow::Error| error.downcast::<PushedBack>().map(|p| p.retry_after).map_err(|e| format!("{e:#}"));
    assert_eq!(retry_after(call("/busy").await), Ok(RetryAfter::Seconds(7)));
    assert_eq!(retry_after(call("/down").await), Ok(RetryAfter::Unspecified));
    assert_eq!(retry_after(call("/later").await), Ok(RetryAfter::At(httpdate::parse_http_date(&date).unwrap())));
    assert_eq!(retry_after(call("/junk").await), Ok(RetryAfter::Malformed("in a while".into())));
    let junk = format!("{:#}", call("/junk").await);
    assert!(junk.contains("429") && junk.contains("unusable Retry-After \"in a while\""), "{junk}");
    let broken = retry_after(call("/broken").await).unwrap_err();
    assert!(broken.contains("500"), "{broken}");
}

/// Attack pass defect 5: a batch answer that is not `{"failed": [indexes]}` (text, malformed
/// JSON, wrong types, no `failed`) counted as success for every item. It now fails the
/// whole batch with a reason quoting the answer; a 2xx with an empty body, or `failed`
/// empty, is still "all succeeded", and the named items still fail alone.
#[tokio::test]
async fn a_batch_answer_that_is_not_the_documented_form_fails_the_whole_batch() {
    let router = axum::Router::new().route(
        "/batch",
        axum::routing::post(|headers: axum::http::HeaderMap| async move {
            // The test names the answer in the first item's message id.
            let answer = headers.get("ebb-message-id").unwrap().to_str().unwrap().to_string();
            match answer.as_str() {
                "empty" => String::new(),
                "blank" => " \n".to_string(),
                "none-failed" => r#"{"failed": []}"#.to_string(),
                "one-failed" => r#"{"failed": [1], "note": "kept for later"}"#.to_string(),
                "text" => "OK".to_string(),
                "truncated" => r#"{"failed": [1"#.to_string(),
                "strings" => r#"{"failed": ["1"]}"#.to_string(),
                "negative" => r#"{"failed": [-1]}"#.to_string(),
                "no-failed" => r#"{"ok": true}"#.to_string(),
                "null" => r#"{"failed": null}"#.to_string(),
                "array" => "[1]".to_string(),
                "out-of-range" => r#"{"failed": [7]}"#.to_string(),
                other => panic!("unknown case {other}"),
            }
        }),
    );
    let addr = serve(router).await;
    let handler = HttpHandler::new(format!("http://{addr}/batch").parse().unwrap(), Duration::from_secs(5)).unwrap();
    let batch = |case: &str| -> Vec<IncomingMessage> { (0..3).map(|_| IncomingMessage { id: case.into(), ..message() }).collect() };
    for case in ["empty", "blank", "none-failed"] {
        let results = handler.handle_batch(&batch(case)).await;
        assert!(results.iter().all(Result::is_ok), "{case}: all succeeded");
    }
    let results = handler.handle_batch(&batch("one-failed")).await;
    assert_eq!(results.iter().map(Result::is_ok).collect::<Vec<_>>(), [true, false, true], "only the named item fails");
    for case in ["text", "truncated", "strings", "negative", "no-failed", "null", "array", "out-of-range"] {
        let results = handler.handle_batch(&batch(case)).await;
        assert_eq!(results.len(), 3, "{case}");
        for result in results {
            let error = format!("{:#}", result.expect_err(case));
            assert!(error.contains(&format!("http://{addr}/batch")), "{case}: {error}");
            if case != "out-of-range" {
                assert!(error.contains(r#"not {"failed": [indexes]}"#), "{case}: {error}");
            }
        }
    }
    // The answer is quoted, its control characters escaped.
    let error = format!("{:#}", handler.handle_batch(&batch("text")).await.remove(0).unwrap_err());
    assert!(error.contains("\"OK\""), "{error}");
}
