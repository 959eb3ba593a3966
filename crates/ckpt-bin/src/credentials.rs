//! API credentials for the agent's own static copy.
//!
//! The static copy cannot use a service-account token: projected tokens are bound to the
//! DaemonSet pod and are dropped from checkpoints (static pods may not reference API
//! objects), and after a reboot there is no service environment either. Without
//! credentials the static copy — which holds the lock after a reboot and whenever the
//! DaemonSet copy is gone — could never checkpoint, garbage-collect or remove itself when
//! the node is descheduled (ARCHITECTURE.md, Self-checkpoint, lock and self-GC, seed scenario C).
//!
//! So the DaemonSet copy (the one with credentials of its own) mints tokens for a separate
//! service account, `--static-service-account` (default `pod-checkpointer-static`), with
//! the TokenRequest API, and keeps the newest in the checkpoint dir with a kubeconfig that
//! names it as its `tokenFile` (both 0600, see `ckpt_store::KeptCredentials`). That account
//! reads what the agent reads but may not mint tokens, so a copy of the disk gives access
//! only until the kept token expires: it cannot renew itself (ARCHITECTURE.md, Credentials).
//! The DaemonSet copy refreshes the token every hour, whether it holds the lock or waits
//! for it; kube clients re-read a token file every minute, so a static copy that holds the
//! lock for weeks keeps using the tokens the waiting DaemonSet copy writes. The token is
//! not bound to the pod: a token bound to the DaemonSet pod stops validating exactly when
//! that pod is deleted, which is when the static copy needs it to self-GC. It asks for 7
//! days (the API server may grant less; it is then refreshed at half its lifetime), so a
//! static copy alone — its DaemonSet deleted while the node was off — can still self-GC
//! within that time. Deleting (and re-creating) the static account revokes every kept
//! token at once. The copy started without a named kubeconfig falls back to this file.

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD as BASE64, URL_SAFE_NO_PAD as BASE64_URL};
use ckpt_core::backoff::nth_delay;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::config::{AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};

use crate::error::{Error, Result};

/// The token lifetime asked for: long enough to outlive a long outage.
pub(crate) const TOKEN_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often a connected copy mints a fresh token.
pub(crate) const REFRESH: Duration = Duration::from_secs(3600);
/// After a failed attempt (no permission yet, the API server not back yet after a power
/// cut), try again this soon, doubling with each failure up to [`RETRY`].
pub(crate) const RETRY_FIRST: Duration = Duration::from_secs(10);
/// The longest wait between failed attempts.
pub(crate) const RETRY: Duration = Duration::from_secs(300);

/// The wait after `failures` failed attempts in a row (≥ 1): [`RETRY_FIRST`] doubling to
/// [`RETRY`]. A copy whose first mint after a power cut failed (the API server not serving
/// yet) used to wait the full 5 minutes, while the static copy's kept token might be
/// revoked or close to expiry.
pub(crate) fn retry_after(failures: u32) -> Duration {
    nth_delay(RETRY_FIRST, RETRY, failures.saturating_sub(1))
}

/// Who the kept credentials are for: the agent's own service account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServiceAccountRef {
    pub(crate) namespace: String,
    pub(crate) name: String,
}

/// What the kubeconfig needs to say about the API server: how the agent reached it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServerAccess {
    pub(crate) url: String,
    /// The CA bundle, PEM.
    pub(crate) ca_pem: Option<Vec<u8>>,
    pub(crate) insecure: bool,
    pub(crate) tls_server_name: Option<String>,
}

impl ServerAccess {
    /// From the configuration the agent is connected with. In a cluster the CA is the
    /// service account's `ca.crt` (a file kube re-reads); otherwise the loaded roots.
    pub(crate) fn of(config: &kube::Config) -> Result<Self> {
        let ca_pem = match (&config.root_cert_file, &config.root_cert) {
            (Some(path), _) => Some(std::fs::read(path).map_err(|e| {
                Error::runtime(format!("cannot read the API server's CA {}", path.display()), e)
            })?),
            (None, Some(ders)) => Some(ders.iter().flat_map(|der| pem_certificate(der)).collect()),
            (None, None) => None,
        };
        Ok(Self {
            url: config.cluster_url.to_string().trim_end_matches('/').to_owned(),
            ca_pem,
            insecure: config.accept_invalid_certs,
            tls_server_name: config.tls_server_name.clone(),
        })
    }
}

/// A DER certificate as PEM text.
fn pem_certificate(der: &[u8]) -> Vec<u8> {
    let encoded = BASE64.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in encoded.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem.into_bytes()
}

/// The kubeconfig the static copy reads: one cluster, one user whose bearer token is in
/// `token_file` (kube clients re-read it every minute, so a long-running static copy uses
/// each refreshed token). kube's own [`Kubeconfig`] serialized as JSON, which every
/// kubeconfig reader accepts as YAML; deterministic, so it is rewritten only when the server or its CA change.
pub(crate) fn render_kubeconfig(
    server: &ServerAccess,
    account: &ServiceAccountRef,
    token_file: &Path,
) -> Vec<u8> {
    let user = format!("system:serviceaccount:{}:{}", account.namespace, account.name);
    let config = Kubeconfig {
        api_version: Some("v1".to_owned()),
        kind: Some("Config".to_owned()),
        clusters: vec![NamedCluster {
            name: "api".to_owned(),
            cluster: Some(Cluster {
                server: Some(server.url.clone()),
                certificate_authority_data: server.ca_pem.as_ref().map(|ca| BASE64.encode(ca)),
                insecure_skip_tls_verify: server.insecure.then_some(true),
                tls_server_name: server.tls_server_name.clone(),
                ..Cluster::default()
            }),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: user.clone(),
            auth_info: Some(AuthInfo {
                token_file: Some(token_file.display().to_string()),
                ..AuthInfo::default()
            }),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: "pod-checkpointer".to_owned(),
            context: Some(Context {
                cluster: "api".to_owned(),
                user: Some(user),
                namespace: Some(account.namespace.clone()),
                ..Context::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some("pod-checkpointer".to_owned()),
        ..Kubeconfig::default()
    };
    let mut bytes = serde_json::to_vec_pretty(&config).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// When a kept token expires (its JWT `exp`, Unix seconds), for `inspect`. `None` for
/// anything else: a token that is not a JWT, a file that is not what this agent writes.
pub(crate) fn token_expiry(token: &[u8]) -> Option<i64> {
    let token = std::str::from_utf8(token).ok()?.trim();
    let payload = token.split('.').nth(1)?;
    let claims: serde_json::Value = serde_json::from_slice(&BASE64_URL.decode(payload).ok()?).ok()?;
    claims["exp"].as_i64()
}

/// A minted token and how long the API server says it is valid.
pub(crate) struct MintedToken {
    pub(crate) token: String,
    pub(crate) lifetime: Option<Duration>,
}

/// Asks the API server for a token of `account` (TokenRequest, not bound to any object).
pub(crate) async fn mint_token(client: &kube::Client, account: &ServiceAccountRef) -> Result<MintedToken> {
    let api: kube::Api<ServiceAccount> = kube::Api::namespaced(client.clone(), &account.namespace);
    let request = TokenRequest {
        // `audiences: []` as before k8s-openapi's v1_37 made it optional: the API server's own.
        spec: Some(TokenRequestSpec {
            audiences: Some(Vec::new()),
            expiration_seconds: Some(TOKEN_LIFETIME.as_secs() as i64),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let answer = api
        .create_token_request(&account.name, &PostParams::default(), &request)
        .await
        .map_err(|e| {
            Error::runtime(
                format!(
                    "cannot mint a token for service account {}/{} (needs create on serviceaccounts/token)",
                    account.namespace, account.name
                ),
                e,
            )
        })?;
    let status = answer.status.ok_or_else(|| {
        Error::runtime(
            "the TokenRequest answer has no status",
            std::io::Error::other("empty TokenRequest status"),
        )
    })?;
    let token = status.token.ok_or_else(|| {
        Error::runtime(
            "the TokenRequest answer has no token",
            std::io::Error::other("TokenRequest status without a token"),
        )
    })?;
    let lifetime = (answer.spec.and_then(|s| s.expiration_seconds))
        .and_then(|s| u64::try_from(s).ok())
        .map(Duration::from_secs);
    Ok(MintedToken { token, lifetime })
}

/// When to mint again after a token valid for `lifetime`: hourly, or at half the
/// lifetime when the API server granted less than two hours.
pub(crate) fn refresh_after(lifetime: Option<Duration>) -> Duration {
    match lifetime {
        Some(l) => REFRESH.min(l / 2),
        None => REFRESH,
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn a_failed_mint_is_retried_from_ten_seconds_doubling_to_five_minutes() {
        let check = |failures: u32, secs: u64| {
            assert_eq!(
                retry_after(failures),
                Duration::from_secs(secs),
                "after {failures} failures"
            );
        };
        for (failures, secs) in [(1, 10), (2, 20), (3, 40), (5, 160), (6, 300), (40, 300)] {
            check(failures, secs);
        }
    }

    fn account() -> ServiceAccountRef {
        ServiceAccountRef {
            namespace: "kube-system".into(),
            name: "pod-checkpointer".into(),
        }
    }

    const TOKEN_FILE: &str = "/etc/kubernetes/pod-checkpointer/token";

    /// The rendered kubeconfig, read back the way the static copy reads it.
    fn check(server: ServerAccess, expected: (&str, bool, Option<&str>, bool)) {
        let bytes = render_kubeconfig(&server, &account(), Path::new(TOKEN_FILE));
        let text = String::from_utf8(bytes).expect("utf-8");
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).expect("a kubeconfig");
        let cluster = kubeconfig.clusters[0].cluster.as_ref().expect("cluster");
        let (url, insecure, tls_name, has_ca) = expected;
        assert_eq!(cluster.server.as_deref(), Some(url), "{text}");
        assert_eq!(
            cluster.insecure_skip_tls_verify.unwrap_or(false),
            insecure,
            "{text}"
        );
        assert_eq!(cluster.tls_server_name.as_deref(), tls_name, "{text}");
        assert_eq!(cluster.certificate_authority_data.is_some(), has_ca, "{text}");
        let user = kubeconfig.auth_infos[0].auth_info.as_ref().expect("a user");
        assert_eq!(user.token_file.as_deref(), Some(TOKEN_FILE), "{text}");
        assert!(user.token.is_none(), "no inline token: {text}");
        assert_eq!(kubeconfig.current_context.as_deref(), Some("pod-checkpointer"));
        assert!(text.ends_with('\n'));
        // Deterministic: the same server renders the same bytes (no rewrite).
        assert_eq!(
            render_kubeconfig(&server, &account(), Path::new(TOKEN_FILE)),
            text.into_bytes()
        );
    }

    #[test]
    fn kubeconfigs_read_back() {
        let ca = pem_certificate(b"not really DER");
        let cases = [
            (
                ServerAccess {
                    url: "https://10.96.0.1".into(),
                    ca_pem: Some(ca.clone()),
                    insecure: false,
                    tls_server_name: None,
                },
                ("https://10.96.0.1", false, None, true),
            ),
            (
                ServerAccess {
                    url: "https://192.0.2.10:6443".into(),
                    ca_pem: Some(ca),
                    insecure: false,
                    tls_server_name: Some("kubernetes.default.svc".into()),
                },
                (
                    "https://192.0.2.10:6443",
                    false,
                    Some("kubernetes.default.svc"),
                    true,
                ),
            ),
            (
                ServerAccess {
                    url: "https://127.0.0.1:6443".into(),
                    ca_pem: None,
                    insecure: true,
                    tls_server_name: None,
                },
                ("https://127.0.0.1:6443", true, None, false),
            ),
        ];
        for (server, expected) in cases {
            check(server, expected);
        }
    }

    /// A client from the kept kubeconfig reads the token from the token file.
    #[tokio::test]
    async fn the_rendered_kubeconfig_loads_as_a_client() {
        let server = ServerAccess {
            url: "https://127.0.0.1:6443".into(),
            ca_pem: None,
            insecure: true,
            tls_server_name: None,
        };
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("kubeconfig");
        let token = tmp.path().join("token");
        std::fs::write(&path, render_kubeconfig(&server, &account(), &token)).unwrap();
        let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert_eq!(config.default_namespace, "kube-system");
        assert!(config.accept_invalid_certs);
        assert!(
            kube::Client::try_from(config.clone()).is_err(),
            "no token file yet: the client cannot be made"
        );
        std::fs::write(&token, "tok").unwrap();
        assert!(kube::Client::try_from(config).is_ok());
    }

    #[test]
    fn pem_lines_are_64_characters() {
        let pem = String::from_utf8(pem_certificate(&[7u8; 100])).unwrap();
        let lines: Vec<&str> = pem.lines().collect();
        assert_eq!(lines.first(), Some(&"-----BEGIN CERTIFICATE-----"));
        assert_eq!(lines.last(), Some(&"-----END CERTIFICATE-----"));
        assert!(lines[1..lines.len() - 1].iter().all(|l| l.len() <= 64));
        assert_eq!(lines[1].len(), 64);
    }

    #[test]
    fn token_expiry_of_kept_tokens() {
        let jwt = |claims: &str| {
            format!(
                "{}.{}.signature",
                BASE64_URL.encode(r#"{"alg":"RS256"}"#),
                BASE64_URL.encode(claims)
            )
        };
        let cases: [(String, Option<i64>); 6] = [
            (jwt(r#"{"exp":1767225600,"sub":"x"}"#), Some(1_767_225_600)),
            (format!("{}\n", jwt(r#"{"exp":1}"#)), Some(1)),
            (jwt(r#"{"sub":"no expiry"}"#), None),
            ("not-a-jwt".into(), None),
            ("a.!!!.c".into(), None),
            (String::new(), None),
        ];
        for (token, expected) in cases {
            assert_eq!(token_expiry(token.as_bytes()), expected, "{token}");
        }
    }

    #[test]
    fn refresh_schedule() {
        let cases = [
            (None, REFRESH),
            (Some(TOKEN_LIFETIME), REFRESH),
            (Some(Duration::from_secs(3600)), Duration::from_secs(1800)),
            (Some(Duration::from_secs(600)), Duration::from_secs(300)),
        ];
        for (lifetime, expected) in cases {
            assert_eq!(refresh_after(lifetime), expected, "{lifetime:?}");
        }
    }
}
