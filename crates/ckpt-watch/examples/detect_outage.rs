//! Measures how fast [`ApiWatch`] notices an API server that hangs or goes away, with the
//! default settings (probe every 500 ms, 1 s timeout, unreachable after 2 failures), over
//! real sockets: a tiny HTTP server on 127.0.0.1 that answers `/readyz`, pod lists and
//! watches, then either stops answering (like a SIGSTOPped kube-apiserver: connections are
//! accepted, nothing comes back) or closes its port (connection refused).
//!
//! `cargo run -p ckpt-watch --example detect_outage [REPETITIONS]`

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ckpt_core::NamespaceAllowList;
use ckpt_watch::{ApiState, ApiWatch, ApiWatchConfig};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

type Body = BoxBody<Bytes, Infallible>;

async fn answer(hung: Arc<AtomicBool>, req: http::Request<hyper::body::Incoming>) -> http::Response<Body> {
    if hung.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    let query = req.uri().query().unwrap_or("");
    let body: Body = if req.uri().path() == "/readyz" {
        Full::new(Bytes::from_static(b"ok")).boxed()
    } else if query.contains("watch=true") {
        // An open watch that never sends anything.
        StreamBody::new(futures::stream::pending::<Result<Frame<Bytes>, Infallible>>()).boxed()
    } else {
        let list = r#"{"apiVersion":"v1","kind":"PodList","metadata":{"resourceVersion":"1"},"items":[]}"#;
        Full::new(Bytes::from_static(list.as_bytes())).boxed()
    };
    http::Response::new(body)
}

/// Serves until the returned set is dropped or aborted.
async fn serve(listener: TcpListener, hung: Arc<AtomicBool>) -> JoinSet<()> {
    let mut set = JoinSet::new();
    let connections = Arc::new(tokio::sync::Mutex::new(JoinSet::new()));
    let conns = Arc::clone(&connections);
    set.spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let hung = Arc::clone(&hung);
            conns.lock().await.spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let hung = Arc::clone(&hung);
                    async move { Ok::<_, Infallible>(answer(hung, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
        // Keep the connection set alive with the accept loop; aborting it drops both.
        drop(connections);
    });
    set
}

async fn wait_for(api: &ApiWatch, state: ApiState) -> Duration {
    let started = Instant::now();
    let mut rx = api.subscribe();
    while api.state() != state {
        let _ = tokio::time::timeout(Duration::from_millis(5), rx.changed()).await;
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never reached {state:?}"
        );
    }
    started.elapsed()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reps: usize = std::env::args().nth(1).map_or(Ok(5), |s| s.parse())?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    let hung = Arc::new(AtomicBool::new(false));
    let mut server = serve(listener, Arc::clone(&hung)).await;

    let config = kube::Config::new(format!("http://{addr}").parse()?);
    let client = kube::Client::try_from(config)?;
    let api = ApiWatch::spawn(
        client,
        ApiWatchConfig::new("node-1", NamespaceAllowList::new(["kube-system"])),
    );
    wait_for(&api, ApiState::Synced).await;

    let mut hung_ms = Vec::new();
    let mut refused_ms = Vec::new();
    for _ in 0..reps {
        // Desynchronise from the probe's 1 s rhythm.
        tokio::time::sleep(Duration::from_millis(137 + 311 * hung_ms.len() as u64 % 1000)).await;
        hung.store(true, Ordering::SeqCst);
        hung_ms.push(wait_for(&api, ApiState::Unreachable).await.as_millis());
        hung.store(false, Ordering::SeqCst);
        let back = wait_for(&api, ApiState::Synced).await;
        println!(
            "hung:    unreachable after {} ms, synced again {} ms after resuming",
            hung_ms.last().unwrap(),
            back.as_millis()
        );

        tokio::time::sleep(Duration::from_millis(137 + 311 * refused_ms.len() as u64 % 1000)).await;
        server.abort_all();
        while server.join_next().await.is_some() {}
        refused_ms.push(wait_for(&api, ApiState::Unreachable).await.as_millis());
        let listener = TcpListener::bind(addr).await?;
        server = serve(listener, Arc::clone(&hung)).await;
        let back = wait_for(&api, ApiState::Synced).await;
        println!(
            "refused: unreachable after {} ms, synced again {} ms after restarting",
            refused_ms.last().unwrap(),
            back.as_millis()
        );
    }
    hung_ms.sort_unstable();
    refused_ms.sort_unstable();
    println!(
        "hung API    -> unreachable: min {} ms, median {} ms, max {} ms (n={reps})",
        hung_ms[0],
        hung_ms[reps / 2],
        hung_ms[reps - 1]
    );
    println!(
        "refused API -> unreachable: min {} ms, median {} ms, max {} ms (n={reps})",
        refused_ms[0],
        refused_ms[reps / 2],
        refused_ms[reps - 1]
    );
    Ok(())
}
