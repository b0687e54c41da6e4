//! The HTTP endpoint of the metrics: hyper's HTTP/1.1 server (kept-alive scrapes,
//! requests in any number of packets) on the metrics address; [`respond`] decides each
//! answer (`/metrics`, `/healthz`, `/livez`, `/readyz`) from the method and path alone.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::{Method, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::Metrics;

/// How long a client may take to send a request's headers before its connection is
/// closed (a probe or scrape sends them at once).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long to wait before accepting again after `accept` failed (out of descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serve `/metrics`, `/healthz` and `/readyz` on `addr` until the task is dropped.
/// Returns the bound address (useful with port 0).
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let response = respond(&metrics, req.method(), req.uri().path());
                    async move { Ok::<_, std::convert::Infallible>(response) }
                });
                let _ = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(local)
}

/// The answer to one request. GET and HEAD only (hyper leaves the body out of a HEAD
/// answer); anything else is 405 with the methods allowed.
pub fn respond(metrics: &Metrics, method: &Method, path: &str) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain";
    let (status, body, ctype) = if method != Method::GET && method != Method::HEAD {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".to_string(),
            TEXT,
        )
    } else {
        match path {
            "/metrics" => (
                StatusCode::OK,
                metrics.encode(),
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            ),
            "/healthz" | "/livez" => (StatusCode::OK, "ok\n".to_string(), TEXT),
            "/readyz" if metrics.ready.load(Ordering::Relaxed) => {
                (StatusCode::OK, "ok\n".to_string(), TEXT)
            }
            "/readyz" => (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready\n".to_string(),
                TEXT,
            ),
            _ => (StatusCode::NOT_FOUND, "not found\n".to_string(), TEXT),
        }
    };
    let mut response = Response::builder()
        .status(status)
        .header(CONTENT_TYPE, ctype);
    if status == StatusCode::METHOD_NOT_ALLOWED {
        response = response.header(ALLOW, "GET, HEAD");
    }
    response
        .body(Full::new(Bytes::from(body)))
        .expect("a response from valid parts")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One request, written in `parts` with a pause between them, on a new connection;
    /// the whole answer.
    async fn ask(addr: SocketAddr, parts: &[&str]) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        for part in parts {
            s.write_all(part.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn the_endpoint_answers_probes_and_scrapes_as_http_does() {
        let metrics = Arc::new(Metrics::agent());
        let addr = serve("127.0.0.1:0".parse().unwrap(), metrics.clone())
            .await
            .unwrap();
        let get =
            |path: &str| format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let r = ask(addr, &[&get("/metrics")]).await;
        assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
        assert!(
            r.contains("content-type: application/openmetrics-text"),
            "{r}"
        );
        assert!(r.contains("tessera_build_info"), "{r}");
        // A request that arrives in pieces (the old endpoint read one chunk only and
        // answered 404 to `GET /met`).
        let r = ask(
            addr,
            &[
                "GET /met",
                "rics HTTP/1.1\r\nHost: x\r\n",
                "Connection: close\r\n\r\n",
            ],
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
        let r = ask(addr, &[&get("/healthz")]).await;
        assert!(
            r.starts_with("HTTP/1.1 200 OK") && r.ends_with("ok\n"),
            "{r}"
        );
        let r = ask(addr, &[&get("/readyz")]).await;
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        metrics.set_ready(true);
        let r = ask(addr, &[&get("/readyz")]).await;
        assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
        let r = ask(addr, &[&get("/nothing")]).await;
        assert!(r.starts_with("HTTP/1.1 404"), "{r}");
        // The method counts: a POST is refused, a HEAD has no body.
        let r = ask(addr, &["POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"]).await;
        assert!(r.starts_with("HTTP/1.1 405"), "{r}");
        assert!(r.to_lowercase().contains("allow: get, head"), "{r}");
        let r = ask(
            addr,
            &["HEAD /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"],
        )
        .await;
        assert!(
            r.starts_with("HTTP/1.1 200 OK") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
    }
}
