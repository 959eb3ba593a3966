//! The fake kubelet.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::lock;

/// What the fake kubelet answers and saw.
#[derive(Default)]
pub struct KubeletState {
    /// Status to answer `/pods/` with (200 = the pod list).
    pub status: u16,
    /// The pods `/pods/` lists.
    pub pods: Vec<Value>,
    /// `Authorization` headers seen, one per request (`None` when absent).
    pub auth: Vec<Option<String>>,
    /// Paths requested.
    pub paths: Vec<String>,
    /// When set, `/pods/` answers 401 to a request without `Authorization: Bearer <this>`,
    /// as a kubelet with webhook authentication does.
    pub required_token: Option<String>,
}

/// A kubelet on `127.0.0.1:<random port>`, plain HTTP or TLS with the test certificate.
pub struct FakeKubelet {
    /// `http://127.0.0.1:<port>` or `https://…`.
    pub url: String,
    /// What it answers and saw; change it at will.
    pub state: Arc<Mutex<KubeletState>>,
    task: JoinHandle<()>,
    connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

/// The CA that signed the fake kubelet's certificate (PEM).
pub const TEST_CA_PEM: &str = include_str!("testdata/ca.pem");
const TEST_CERT_PEM: &str = include_str!("testdata/kubelet.pem");
const TEST_KEY_PEM: &str = include_str!("testdata/kubelet.key");

fn tls_acceptor() -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = vec![CertificateDer::from_pem_slice(TEST_CERT_PEM.as_bytes()).expect("test cert")];
    let key = PrivateKeyDer::from_pem_slice(TEST_KEY_PEM.as_bytes()).expect("test key");
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

impl FakeKubelet {
    /// A kubelet on a random port; with `tls`, its certificate is signed by
    /// [`TEST_CA_PEM`].
    pub async fn start(tls: bool) -> FakeKubelet {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(Mutex::new(KubeletState {
            status: 200,
            ..Default::default()
        }));
        let shared = Arc::clone(&state);
        let acceptor = tls.then(tls_acceptor);
        let connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let conns = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = Arc::clone(&shared);
                let acceptor = acceptor.clone();
                let conn = tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let shared = Arc::clone(&shared);
                        async move { Ok::<_, Infallible>(kubelet_handle(&shared, &req)) }
                    });
                    let builder = hyper::server::conn::http1::Builder::new();
                    match acceptor {
                        Some(acceptor) => {
                            if let Ok(tls) = acceptor.accept(stream).await {
                                let _ = builder
                                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                                    .await;
                            }
                        }
                        None => {
                            let _ = builder
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
                lock(&conns).push(conn.abort_handle());
            }
        });
        let scheme = if tls { "https" } else { "http" };
        FakeKubelet {
            url: format!("{scheme}://127.0.0.1:{port}"),
            state,
            task,
            connections,
        }
    }

    /// How many requests it got.
    pub fn requests(&self) -> usize {
        lock(&self.state).paths.len()
    }

    /// Stops listening and closes the open connections (the kubelet went away).
    pub fn stop(&self) {
        self.task.abort();
        for conn in lock(&self.connections).drain(..) {
            conn.abort();
        }
    }

    /// From now on `/pods/` answers 401 unless the request carries this bearer token.
    pub fn require_token(&self, token: &str) {
        lock(&self.state).required_token = Some(token.to_owned());
    }

    /// Answers `/pods/` with this status from now on (200 = the pod list).
    pub fn set_status(&self, status: u16) {
        lock(&self.state).status = status;
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.stop();
    }
}

fn kubelet_handle(
    state: &Mutex<KubeletState>,
    req: &Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let mut st = lock(state);
    st.paths.push(req.uri().path().to_owned());
    st.auth.push(
        req.headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    );
    let authorized = match &st.required_token {
        Some(token) => st.auth.last().cloned().flatten() == Some(format!("Bearer {token}")),
        None => true,
    };
    let (code, body) = if req.uri().path() != "/pods/" {
        (404, "404 page not found".to_owned())
    } else if !authorized {
        (401, "Unauthorized".to_owned())
    } else if st.status == 200 {
        (
            200,
            json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": st.pods}).to_string(),
        )
    } else {
        (
            st.status,
            "Forbidden (user=system:serviceaccount:kube-system:pod-checkpointer, verb=get, resource=nodes, subresource=proxy)"
                .to_owned(),
        )
    };
    Response::builder()
        .status(code)
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}
