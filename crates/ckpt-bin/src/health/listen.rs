//! hyper's HTTP/1.1 for every health endpoint: [`answer_one`] for `--metrics-addr` and
//! `--health-socket`, and `--metrics-listen`: `/metrics`, `/healthz` and `/readyz` for
//! Prometheus on an address beyond loopback (the node's IP), with keep-alive and write
//! deadlines, only by the copy that holds the lock: both copies share the host network,
//! so the one that answers on the node's address is always the active one.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::CONTENT_TYPE;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use super::{ACCEPT_BACKOFF, Health, MAX_CONNECTIONS, REQUEST_TIMEOUT, Server, route_off_thread};

/// How long a bind that failed (the previous holder's socket not closed yet, the address
/// not yet on the node) waits before the next try.
const BIND_RETRY: Duration = Duration::from_secs(2);

/// How long an answer may wait for the client to read it once the socket's buffers are
/// full: a client that never reads would otherwise hold its slot for good (32 of them,
/// every slot). An answer is a few kB; a scraper reads it at once.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves on `addr` until the returned [`Server`] is dropped, binding in the background
/// (and again every [`BIND_RETRY`] while that fails, warning once).
pub(crate) fn serve(addr: SocketAddr, health: Health) -> Server {
    Server(tokio::spawn(async move {
        let mut warned = false;
        let listener = loop {
            match TcpListener::bind(addr).await {
                Ok(listener) => break listener,
                Err(e) => {
                    if !warned {
                        warn!(%addr, error = %e, "cannot listen for Prometheus yet; retrying");
                        warned = true;
                    }
                    tokio::time::sleep(BIND_RETRY).await;
                }
            }
        };
        info!(%addr, "serving /metrics, /healthz and /readyz for Prometheus");
        serve_listener(listener, health, REQUEST_TIMEOUT, WRITE_TIMEOUT).await;
    }))
}

/// Answers connections on `listener`, at most [`MAX_CONNECTIONS`] at once; a connection
/// that sends no complete request head within `header_timeout` (the first, from the
/// connection's start, or the next on a kept-alive connection: an idle one), or whose
/// answer is not read within `write_timeout` of its socket blocking, is closed.
pub(super) async fn serve_listener(
    listener: TcpListener,
    health: Health,
    header_timeout: Duration,
    write_timeout: Duration,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut failing = false;
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                failing = false;
                stream
            }
            Err(e) => {
                if !failing {
                    warn!(error = %e, "cannot accept Prometheus connections; retrying");
                    failing = true;
                }
                drop(slot);
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let health = health.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let health = health.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(&request, &health).await) }
            });
            let served = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(WriteDeadline::new(stream, write_timeout)), service);
            if let Err(e) = served.await {
                debug!(error = %e, "Prometheus connection ended");
            }
            drop(slot);
        });
    }
}

/// A connection whose answers must be read: once a write or flush cannot proceed, the
/// answer must be out within `timeout`, or the write fails (`TimedOut`) and hyper closes
/// the connection. hyper has a timeout for reading a request head, none for writing.
struct WriteDeadline<S> {
    inner: S,
    timeout: Duration,
    /// Running from the first write that blocked until a flush completes.
    blocked: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    fn new(inner: S, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            blocked: None,
        }
    }

    /// `result` of a write (`done`: a flush that completed ends the answer), failed once
    /// the answer has waited too long.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<std::io::Result<T>>,
        done: bool,
    ) -> Poll<std::io::Result<T>> {
        match result {
            Poll::Ready(result) => {
                if done {
                    self.blocked = None;
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                let timeout = self.timeout;
                let blocked = (self.blocked).get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match blocked.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client has not read its answer",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(cx, result, false)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(cx, result, false)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_flush(cx);
        this.watch(cx, result, true)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.watch(cx, result, true)
    }
}

/// One request on `stream` (`--metrics-addr`, `--health-socket`), then the connection is
/// closed: `pod-checkpointer health` reads its answer to the end. `/metrics` only
/// `with_metrics` (not on the socket, which only the pod's probes ask).
pub(super) async fn answer_one<S>(stream: S, health: &Health, with_metrics: bool)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let health = health.clone();
    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
        let health = health.clone();
        async move {
            let response = if !with_metrics && request.uri().path().starts_with("/metrics") {
                let mut response = Response::new(Full::new(Bytes::from_static(b"not found\n")));
                *response.status_mut() = StatusCode::NOT_FOUND;
                response
            } else {
                answer(&request, &health).await
            };
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let served = http1::Builder::new()
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    if let Err(e) = served.await {
        debug!(error = %e, "health connection ended");
    }
}

async fn answer(request: &Request<hyper::body::Incoming>, health: &Health) -> Response<Full<Bytes>> {
    let (status, content_type, body) =
        route_off_thread(request.method().as_str(), request.uri().path(), health).await;
    let status = status
        .get(..3)
        .and_then(|code| code.parse::<u16>().ok())
        .and_then(|code| StatusCode::from_u16(code).ok())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn started(header_timeout: Duration) -> (SocketAddr, Server) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let health = Health::new(Duration::from_secs(90));
        health.record_views("synced", true, None);
        let task = tokio::spawn(serve_listener(listener, health, header_timeout, header_timeout));
        (addr, Server(task))
    }

    /// Reads until the peer closes or `n` responses (by their status lines) arrived.
    async fn read_responses(stream: &mut tokio::net::TcpStream, n: usize) -> String {
        let mut text = String::new();
        let mut buf = [0u8; 65536];
        while text.matches("HTTP/1.1 ").count() < n || !text.ends_with('\n') {
            let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
                .await
                .expect("answered in time")
                .unwrap();
            if read == 0 {
                break;
            }
            text.push_str(&String::from_utf8_lossy(&buf[..read]));
        }
        text
    }

    #[tokio::test]
    async fn metrics_and_probes_over_a_kept_alive_connection() {
        let (addr, _server) = started(Duration::from_secs(5)).await;
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\nPOST /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let text = read_responses(&mut stream, 4).await;
        let statuses: Vec<&str> = text.lines().filter(|l| l.starts_with("HTTP/1.1 ")).collect();
        assert_eq!(
            statuses,
            [
                "HTTP/1.1 200 OK",
                "HTTP/1.1 200 OK",
                "HTTP/1.1 405 Method Not Allowed",
                "HTTP/1.1 404 Not Found"
            ],
            "{text}"
        );
        assert!(text.contains("content-type: text/plain; version=0.0.4"), "{text}");
        assert!(
            text.contains("pod_checkpointer_api_state{state=\"synced\"} 1"),
            "{text}"
        );
    }

    /// A client that connects and sends nothing (or half a request) is closed after the
    /// header timeout instead of holding one of the slots forever.
    #[tokio::test]
    async fn a_silent_connection_is_closed() {
        let (addr, _server) = started(Duration::from_millis(300)).await;
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        silent.write_all(b"GET /metr").await.unwrap();
        let mut buf = [0u8; 1024];
        let closed = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
            .await
            .expect("closed in time");
        // Closed, possibly after a 408: no further request is served on it.
        match closed {
            Ok(0) | Err(_) => {}
            Ok(n) => assert!(
                String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"),
                "{:?}",
                &buf[..n]
            ),
        }
        let mut other = tokio::net::TcpStream::connect(addr).await.unwrap();
        other
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        assert!(read_responses(&mut other, 1).await.starts_with("HTTP/1.1 "));
    }

    /// Whether the server closed `stream` within `within` (a 408 first is a close too).
    async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 65536];
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
                Err(_) => return false,
                Ok(Ok(0) | Err(_)) => return true,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Every slot held by a client that connected and sends nothing: each is closed after
    /// the header (idle) timeout, which runs from the connection's start, and a new client
    /// is served then.
    #[tokio::test]
    async fn silent_clients_in_every_slot_are_closed_and_a_new_one_is_served() {
        let (addr, _server) = started(Duration::from_millis(300)).await;
        let mut silent = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        for stream in &mut silent {
            assert!(
                closed_within(stream, Duration::from_secs(5)).await,
                "a silent connection is closed"
            );
        }
        let mut other = tokio::net::TcpStream::connect(addr).await.unwrap();
        other
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let text = tokio::time::timeout(Duration::from_secs(5), read_responses(&mut other, 1))
            .await
            .expect("a new client served");
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    }

    /// A client that asks for `/metrics` again and again and never reads an answer: once
    /// its socket's buffers are full, the connection is closed after the write timeout.
    #[tokio::test]
    async fn a_client_that_never_reads_is_closed() {
        let (addr, _server) = started(Duration::from_millis(300)).await;
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut reader, mut writer) = stream.into_split();
        let request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(64);
        // Writes until the server stops reading (its answers are stuck) or closes.
        let asking = tokio::spawn(async move {
            for _ in 0..10_000 {
                if writer.write_all(&request).await.is_err() {
                    return;
                }
            }
        });
        // Some time to fill the buffers, then not a byte read for longer than the timeout.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let mut buf = vec![0u8; 1 << 20];
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match reader.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        asking.abort();
        assert!(closed.is_ok(), "the stuck connection is closed");
    }

    #[tokio::test]
    async fn a_taken_address_is_retried_until_free() {
        let blocker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = blocker.local_addr().unwrap();
        let _server = serve(addr, Health::new(Duration::from_secs(90)));
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(blocker);
        let answered = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await {
                    stream
                        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                        .await
                        .unwrap();
                    let text = read_responses(&mut stream, 1).await;
                    if text.starts_with("HTTP/1.1 ") {
                        return text;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await
        .expect("served once the address is free");
        assert!(answered.contains("standby"), "{answered}");
    }
}
