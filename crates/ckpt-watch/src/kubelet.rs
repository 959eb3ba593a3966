//! The kubelet's `/pods` API: which pods the kubelet knows (and, with the CRI off, which
//! run).

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use http::HeaderValue;
use http::header::AUTHORIZATION;
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use tracing::{debug, info, warn};

use crate::error::{Error, Result};
use crate::reflect::lock;

/// Settings of [`KubeletClient`].
#[derive(Clone, Debug)]
pub struct KubeletConfig {
    /// The kubelet API, e.g. `https://10.0.0.5:10250`; plain `http://` is allowed.
    pub url: String,
    /// A fallback, typically the read-only port `http://10.0.0.5:10255` (no token sent).
    pub readonly_url: Option<String>,
    /// The service-account token sent as `Authorization: Bearer` to `url` (not to the
    /// read-only URL); re-read whenever the file changes (tokens are rotated).
    pub token_file: Option<PathBuf>,
    /// The CA bundle that signed the kubelet's serving certificate.
    pub ca_file: Option<PathBuf>,
    /// Without a CA, do not verify the kubelet's certificate (one warning is logged). When
    /// false, an https URL without a CA is refused if a token would be sent to it: the
    /// token never goes to an unverified server unless asked.
    pub insecure_skip_tls_verify: bool,
    /// Bound on each request, connection included.
    pub timeout: Duration,
}

/// One kubelet URL with its HTTP client.
struct Target {
    url: String,
    client: kube::Client,
    send_token: bool,
}

#[derive(Default)]
struct CachedToken {
    /// Modification time and length of the file when read.
    stamp: Option<(SystemTime, u64)>,
    header: Option<HeaderValue>,
}

/// Reads the kubelet's `GET /pods/` (a `v1` PodList), falling back to the read-only URL.
///
/// It remembers which URL answered last and asks that one first, so a dead or
/// mismatched port is not retried on every pass (bootkube made a doomed TLS handshake
/// to a plain-HTTP kubelet 12 times a minute). The other URL is tried only when the
/// remembered one fails.
pub struct KubeletClient {
    primary: Target,
    readonly: Option<Target>,
    timeout: Duration,
    token_file: Option<PathBuf>,
    token: Mutex<CachedToken>,
    prefer_readonly: AtomicBool,
}

impl std::fmt::Debug for KubeletClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletClient")
            .field("url", &self.primary.url)
            .field("readonly_url", &self.readonly.as_ref().map(|t| &t.url))
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct PodList {
    #[serde(default)]
    items: Vec<Pod>,
}

impl KubeletClient {
    /// Builds the HTTP clients (nothing is requested yet).
    ///
    /// Fails on a malformed URL, an unreadable CA file, or outside a Tokio runtime.
    pub fn new(config: KubeletConfig) -> Result<Self> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime {
                what: "KubeletClient",
            });
        }
        if let Some(ca) = &config.ca_file {
            std::fs::read(ca).map_err(|source| Error::ReadFile {
                what: "kubelet CA file",
                path: ca.clone(),
                source,
            })?;
        }
        let primary = target(&config.url, &config, true)?;
        let readonly = config
            .readonly_url
            .as_deref()
            .filter(|u| !u.is_empty())
            .map(|u| target(u, &config, false))
            .transpose()?;
        Ok(Self {
            primary,
            readonly,
            timeout: config.timeout,
            token_file: config.token_file,
            token: Mutex::new(CachedToken::default()),
            prefer_readonly: AtomicBool::new(false),
        })
    }

    /// The URL that answered last (the primary until the fallback was needed).
    pub fn current_url(&self) -> &str {
        match (&self.readonly, self.prefer_readonly.load(Ordering::Relaxed)) {
            (Some(ro), true) => &ro.url,
            _ => &self.primary.url,
        }
    }

    /// The kubelet's pods.
    pub async fn pods(&self) -> Result<Vec<Pod>> {
        let Some(readonly) = &self.readonly else {
            return self.pods_from(&self.primary).await;
        };
        let prefer_readonly = self.prefer_readonly.load(Ordering::Relaxed);
        let (first, second) = if prefer_readonly {
            (readonly, &self.primary)
        } else {
            (&self.primary, readonly)
        };
        let first_err = match self.pods_from(first).await {
            Ok(pods) => return Ok(pods),
            Err(e) => e,
        };
        match self.pods_from(second).await {
            Ok(pods) => {
                self.prefer_readonly.store(!prefer_readonly, Ordering::Relaxed);
                info!(
                    url = %second.url,
                    failed = %first.url,
                    problem = %first_err.chain(),
                    "kubelet: switched to the other URL, which answers"
                );
                Ok(pods)
            }
            Err(e) => Err(Error::KubeletBoth {
                primary: first_err.chain(),
                fallback: Box::new(e),
            }),
        }
    }

    async fn pods_from(&self, target: &Target) -> Result<Vec<Pod>> {
        let mut request = http::Request::get("/pods/");
        if target.send_token
            && let Some(token) = self.token()?
        {
            request = request.header(AUTHORIZATION, token);
        }
        let request = request.body(Vec::new()).map_err(|_| Error::KubeletUrl {
            url: target.url.clone(),
            source: None,
        })?;
        let attempt = target.client.request::<PodList>(request);
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(list)) => Ok(list.items),
            Ok(Err(source)) => {
                if let kube::Error::Api(status) = &source
                    && status.code == 403
                {
                    warn_forbidden_once(&target.url);
                }
                Err(Error::KubeletRequest {
                    url: target.url.clone(),
                    source,
                })
            }
            Err(_) => Err(Error::KubeletTimeout {
                url: target.url.clone(),
                timeout: self.timeout,
            }),
        }
    }

    /// The bearer header from the token file, re-read when its mtime or size changed.
    fn token(&self) -> Result<Option<HeaderValue>> {
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        let read_err = |source| Error::ReadFile {
            what: "service-account token file",
            path: path.clone(),
            source,
        };
        // A token not written yet (the kept one, before the DaemonSet copy first mints it)
        // is none: the request goes without, as with no token file.
        let meta = match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            other => other.map_err(read_err)?,
        };
        let stamp = (meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), meta.len());
        let mut cached = lock(&self.token);
        if cached.stamp != Some(stamp) || cached.header.is_none() {
            let token = std::fs::read_to_string(path).map_err(read_err)?;
            let header = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
                .map_err(|_| Error::BadToken { path: path.clone() })?;
            debug!(path = %path.display(), "service-account token (re)read");
            cached.stamp = Some(stamp);
            cached.header = Some(header);
        }
        Ok(cached.header.clone())
    }
}

fn warn_forbidden_once(url: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        warn!(
            %url,
            "kubelet answered 403 to GET /pods/: the service account needs get on nodes/proxy \
             (or nodes/pods where the kubelet has fine-grained authorization)"
        );
    }
}

fn target(url: &str, config: &KubeletConfig, send_token: bool) -> Result<Target> {
    let trimmed = url.trim_end_matches('/');
    let bad = |source| Error::KubeletUrl {
        url: url.to_owned(),
        source,
    };
    let uri: http::Uri = trimmed.parse().map_err(|e| bad(Some(e)))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(bad(None)),
    };
    if uri.host().is_none() {
        return Err(bad(None));
    }
    let mut kc = kube::Config::new(uri);
    kc.connect_timeout = Some(config.timeout);
    kc.read_timeout = Some(config.timeout);
    kc.write_timeout = Some(config.timeout);
    kc.reset_reader_on_write = true;
    kc.default_retry = false;
    if https {
        match &config.ca_file {
            Some(ca) => kc.root_cert_file = Some(ca.clone()),
            None if send_token && config.token_file.is_some() && !config.insecure_skip_tls_verify => {
                return Err(Error::KubeletUnverified {
                    url: trimmed.to_owned(),
                });
            }
            None => {
                static WARNED: AtomicBool = AtomicBool::new(false);
                if !WARNED.swap(true, Ordering::Relaxed) {
                    warn!(url = %trimmed, "no kubelet CA file given: the kubelet's TLS certificate is not verified");
                }
                kc.accept_invalid_certs = true;
            }
        }
    }
    let client = kube::Client::try_from(kc).map_err(|source| Error::KubeletClient {
        url: trimmed.to_owned(),
        source,
    })?;
    Ok(Target {
        url: trimmed.to_owned(),
        client,
        send_token,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testkit::{FakeKubelet, TEST_CA_PEM};

    fn config(url: &str) -> KubeletConfig {
        KubeletConfig {
            url: url.to_owned(),
            readonly_url: None,
            token_file: None,
            ca_file: None,
            insecure_skip_tls_verify: false,
            timeout: Duration::from_secs(2),
        }
    }

    fn names(pods: &[Pod]) -> Vec<String> {
        pods.iter().filter_map(|p| p.metadata.name.clone()).collect()
    }

    fn set_pods(fake: &FakeKubelet, names: &[&str]) {
        lock(&fake.state).pods = names
            .iter()
            .map(|n| json!({"metadata": {"name": n, "namespace": "kube-system"}}))
            .collect();
    }

    /// A port nothing listens on.
    async fn closed_url() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        format!("http://127.0.0.1:{port}")
    }

    #[tokio::test]
    async fn lists_pods_over_plain_http_with_the_token() {
        let fake = FakeKubelet::start(false).await;
        set_pods(&fake, &["a", "b"]);
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "first-token\n").unwrap();
        let client = KubeletClient::new(KubeletConfig {
            token_file: Some(token.clone()),
            ..config(&format!("{}/", fake.url))
        })
        .unwrap();
        assert_eq!(names(&client.pods().await.unwrap()), ["a", "b"]);

        // A rotated token is picked up.
        std::fs::write(&token, "second-token-longer\n").unwrap();
        client.pods().await.unwrap();
        let st = lock(&fake.state);
        assert_eq!(st.paths, ["/pods/", "/pods/"]);
        assert_eq!(
            st.auth,
            [
                Some("Bearer first-token".to_owned()),
                Some("Bearer second-token-longer".to_owned())
            ]
        );
    }

    #[tokio::test]
    async fn tls_with_the_ca_and_without_verification() {
        let fake = FakeKubelet::start(true).await;
        set_pods(&fake, &["secure"]);
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, TEST_CA_PEM).unwrap();
        let verified = KubeletClient::new(KubeletConfig {
            ca_file: Some(ca),
            ..config(&fake.url)
        })
        .unwrap();
        assert_eq!(names(&verified.pods().await.unwrap()), ["secure"]);
        let unverified = KubeletClient::new(config(&fake.url)).unwrap();
        assert_eq!(names(&unverified.pods().await.unwrap()), ["secure"]);

        // A token is never sent to an unverified kubelet unless that is asked for.
        let token = dir.path().join("token");
        std::fs::write(&token, "secret-token\n").unwrap();
        let with_token = || KubeletConfig {
            token_file: Some(token.clone()),
            ..config(&fake.url)
        };
        let refused = KubeletClient::new(with_token()).unwrap_err();
        assert!(matches!(refused, Error::KubeletUnverified { .. }), "{refused}");
        let insecure = KubeletClient::new(KubeletConfig {
            insecure_skip_tls_verify: true,
            ..with_token()
        })
        .unwrap();
        assert_eq!(names(&insecure.pods().await.unwrap()), ["secure"]);

        // Plain HTTP to a TLS port fails (and says where).
        let wrong = KubeletClient::new(config(&fake.url.replace("https://", "http://"))).unwrap();
        let err = wrong.pods().await.unwrap_err();
        assert!(err.to_string().contains("/pods/"), "{err}");
    }

    #[tokio::test]
    async fn falls_back_to_the_readonly_url_and_remembers_it() {
        let secure = FakeKubelet::start(false).await;
        lock(&secure.state).status = 403;
        let readonly = FakeKubelet::start(false).await;
        set_pods(&readonly, &["ro"]);
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "t").unwrap();
        let client = KubeletClient::new(KubeletConfig {
            readonly_url: Some(readonly.url.clone()),
            token_file: Some(token),
            ..config(&secure.url)
        })
        .unwrap();
        assert_eq!(client.current_url(), secure.url);
        assert_eq!(names(&client.pods().await.unwrap()), ["ro"]);
        assert_eq!(client.current_url(), readonly.url);
        assert_eq!(names(&client.pods().await.unwrap()), ["ro"]);
        assert_eq!(secure.requests(), 1, "the failing URL is not retried every time");
        assert_eq!(readonly.requests(), 2);
        assert_eq!(lock(&secure.state).auth, [Some("Bearer t".to_owned())]);
        assert_eq!(
            lock(&readonly.state).auth,
            [None, None],
            "no token to the read-only port"
        );

        // The read-only port fails: back to the secure one, which now answers.
        lock(&readonly.state).status = 500;
        lock(&secure.state).status = 200;
        set_pods(&secure, &["secure"]);
        assert_eq!(names(&client.pods().await.unwrap()), ["secure"]);
        assert_eq!(client.current_url(), secure.url);
    }

    #[tokio::test]
    async fn both_failing_is_one_error_naming_both() {
        let primary = closed_url().await;
        let fallback = closed_url().await;
        let client = KubeletClient::new(KubeletConfig {
            readonly_url: Some(fallback.clone()),
            ..config(&primary)
        })
        .unwrap();
        let err = client.pods().await.unwrap_err();
        assert!(matches!(err, Error::KubeletBoth { .. }), "{err}");
        let text = err.chain();
        assert!(text.contains(&primary) && text.contains(&fallback), "{text}");
    }

    #[tokio::test]
    async fn a_kubelet_that_never_answers_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let client = KubeletClient::new(KubeletConfig {
            timeout: Duration::from_millis(200),
            ..config(&url)
        })
        .unwrap();
        let started = tokio::time::Instant::now();
        let err = client.pods().await.unwrap_err();
        assert!(
            matches!(err, Error::KubeletTimeout { .. } | Error::KubeletRequest { .. }),
            "{}",
            err.chain()
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        drop(listener);
    }

    #[tokio::test]
    async fn bad_configuration_is_reported() {
        for bad in ["", "127.0.0.1:10250", "ftp://x", "http://"] {
            let err = KubeletClient::new(config(bad)).unwrap_err();
            assert!(matches!(err, Error::KubeletUrl { .. }), "{bad}: {err}");
        }
        let err = KubeletClient::new(KubeletConfig {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..config("https://127.0.0.1:10250")
        })
        .unwrap_err();
        assert!(matches!(err, Error::ReadFile { .. }), "{err}");
    }

    #[test]
    fn needs_a_runtime() {
        let err = KubeletClient::new(config("http://127.0.0.1:1")).unwrap_err();
        assert!(matches!(err, Error::NoRuntime { .. }), "{err}");
    }
}
