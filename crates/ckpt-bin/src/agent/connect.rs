//! Connecting to the API server: which credentials (named, in-cluster, or the ones kept
//! for the static copy), the [`ApiLink`] made from them, and keeping the static copy's
//! credentials fresh ([`CredentialKeeper`]) — while connected, and while waiting for the
//! lock.

use std::time::{Duration, Instant};

use ckpt_store::KeptCredentials;
use ckpt_watch::jitter::equal_jitter;
use ckpt_watch::{ApiWatch, ApiWatchConfig, Observer};
use tracing::{debug, info, warn};

use ckpt_core::error_chain;

use crate::config::{KubeconfigSource, RunSettings};
use crate::credentials::{
    ServerAccess, ServiceAccountRef, mint_token, refresh_after, render_kubeconfig, retry_after,
};
use crate::error::{Error, Result};
use crate::events::EventSink;

use super::REQUEST_TIMEOUT;

/// Where the agent's API client comes from.
#[derive(Clone)]
pub enum ApiSource {
    /// `--kubeconfig`, in-cluster, or `/etc/kubernetes/kubeconfig`: what the binary does.
    Kubeconfig,
    /// A ready client (the in-process tests' fake API server). The agent never goes
    /// offline with one: an API server that does not answer is unreachable, as usual.
    Client(kube::Client),
}

impl std::fmt::Debug for ApiSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ApiSource::Kubeconfig => "ApiSource::Kubeconfig",
            ApiSource::Client(_) => "ApiSource::Client",
        })
    }
}

/// How the API client is made once the lock is held (the credentials are checked before
/// waiting for it, the client made after).
pub(super) enum Connect {
    Client(kube::Client),
    Config(Box<kube::Config>, Credentials),
}

/// Whose credentials a configuration carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Credentials {
    /// The copy's own (`--kubeconfig`, in-cluster): it mints the static copy's tokens.
    Own,
    /// The ones kept for the static copy: they cannot mint (ARCHITECTURE.md, Credentials).
    Kept,
}

impl Connect {
    /// Checks the credentials before the lock is waited for: a bad named kubeconfig is a
    /// usage error, not a crash loop that starts only after the other copy exits. Without
    /// a named kubeconfig the agent may be the static copy after a reboot (no
    /// service-account token, no service environment): `None`, it runs offline rather
    /// than leave the node without checkpoints.
    pub(super) async fn prepare(api: ApiSource, settings: &RunSettings) -> Result<Option<Connect>> {
        Ok(match api {
            ApiSource::Client(client) => Some(Connect::Client(client)),
            ApiSource::Kubeconfig => match load_api_config(settings).await {
                Ok((config, credentials)) => Some(Connect::Config(Box::new(config), credentials)),
                Err(e) if !is_explicit(&settings.kubeconfig) => {
                    warn!(error = %error_chain(&e), "no API credentials: running offline, the API server counts as unreachable");
                    None
                }
                Err(e) => return Err(e),
            },
        })
    }

    /// The link (starts the watches).
    pub(super) fn link(self, settings: &RunSettings) -> Result<ApiLink> {
        Ok(match self {
            Connect::Client(client) => ApiLink::new(client, None, settings),
            Connect::Config(config, credentials) => {
                let server = (credentials == Credentials::Own)
                    .then(|| server_access(&config))
                    .flatten();
                ApiLink::new(client_from(*config)?, server, settings)
            }
        })
    }

    /// What keeps the static copy's credentials fresh while this copy waits for the lock:
    /// only a copy with credentials of its own (the DaemonSet copy; after a reboot the
    /// static copy holds the lock, possibly for weeks, on the token this refreshes).
    pub(super) fn standby_keeper(&self, settings: &RunSettings) -> Option<CredentialKeeper> {
        let Connect::Config(config, Credentials::Own) = self else {
            return None;
        };
        let server = server_access(config)?;
        let client = client_from((**config).clone())
            .inspect_err(
                |e| warn!(error = %error_chain(e), "cannot keep the static copy's credentials while waiting"),
            )
            .ok()?;
        CredentialKeeper::new(client, server, settings)
    }
}

/// While offline: the link, once credentials can be loaded.
pub(super) async fn reconnect(settings: &RunSettings) -> Option<ApiLink> {
    let (config, credentials) = load_api_config(settings)
        .await
        .inspect_err(|e| debug!(error = %error_chain(e), "still offline"))
        .ok()?;
    let server = (credentials == Credentials::Own)
        .then(|| server_access(&config))
        .flatten();
    let client = client_from(config)
        .inspect_err(|e| debug!(error = %error_chain(e), "still offline"))
        .ok()?;
    info!("API credentials available: connecting to the API server");
    Some(ApiLink::new(client, server, settings))
}

/// The `/readyz` probe of a copy without credentials ([`ApiWatch::spawn_anonymous`]), to
/// the server of the kept kubeconfig or else of the configured one: without it such a copy
/// would count a healthy API server as unreachable and activate checkpoints beside it.
/// `None` when no kubeconfig names a server (the copy then counts the API as unreachable).
pub(super) async fn anonymous_probe(settings: &RunSettings) -> Option<ApiWatch> {
    let kept = settings.disk.layout().credentials_path();
    let configured = match &settings.kubeconfig {
        KubeconfigSource::File(path) | KubeconfigSource::Default(path) => Some(path.clone()),
        KubeconfigSource::InCluster => None,
    };
    let mut found = None;
    for path in [Some(kept), configured].into_iter().flatten() {
        match anonymous_config(&path).await {
            Ok(config) => {
                found = Some((path, config));
                break;
            }
            Err(e) => {
                debug!(kubeconfig = %path.display(), error = %error_chain(&e), "no server to probe anonymously")
            }
        }
    }
    let Some((path, config)) = found else {
        warn!("no API credentials and no kubeconfig naming the API server: it counts as unreachable");
        return None;
    };
    let server = config.cluster_url.to_string();
    let unverified = config.accept_invalid_certs;
    let client = client_from(config)
        .inspect_err(|e| warn!(error = %error_chain(e), "cannot probe the API server anonymously"))
        .ok()?;
    warn!(
        kubeconfig = %path.display(),
        %server,
        certificate_checked = !unverified,
        "no API credentials: probing the API server's /readyz anonymously; checkpoints are activated only while it does not answer"
    );
    let allowed = ckpt_core::NamespaceAllowList::new(settings.namespaces.iter().cloned());
    Some(ApiWatch::spawn_anonymous(
        client,
        ApiWatchConfig::new(settings.node_name.clone(), allowed),
    ))
}

/// `path`'s server without its user. A CA file that is absent (the pod's service-account
/// CA, in the static copy) leaves the server's certificate unchecked: the probe sends
/// nothing secret and learns only whether an answer came, so an impostor could at worst
/// keep checkpoints inactive, as one holding the API server's port already does.
async fn anonymous_config(path: &std::path::Path) -> Result<kube::Config> {
    let mut kubeconfig = crate::kubeconfig::read(path)?;
    kubeconfig.auth_infos.clear();
    for cluster in kubeconfig.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
        if (cluster.certificate_authority.as_ref()).is_some_and(|ca| !std::path::Path::new(ca).exists()) {
            cluster.certificate_authority = None;
            if cluster.certificate_authority_data.is_none() {
                cluster.insecure_skip_tls_verify = Some(true);
            }
        }
    }
    kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| Error::usage(format!("--kubeconfig: {}", path.display()), e))
}

/// How a configuration reaches the API server, for the static copy's kubeconfig.
fn server_access(config: &kube::Config) -> Option<ServerAccess> {
    ServerAccess::of(config)
        .inspect_err(|e| warn!(error = %error_chain(e), "cannot keep API credentials for the static copy"))
        .ok()
}

fn client_from(config: kube::Config) -> Result<kube::Client> {
    kube::Client::try_from(config).map_err(|e| Error::runtime("cannot create the API client", e))
}

/// The API configuration to run with: the named or in-cluster one, and for a copy
/// without either (the static copy) the kubeconfig the DaemonSet copy keeps for it.
async fn load_api_config(settings: &RunSettings) -> Result<(kube::Config, Credentials)> {
    let primary = if uses_absent_service_account(&settings.kubeconfig) {
        Err(Error::usage_message(
            "--kubeconfig: it uses the pod's service account, which this copy has not (a static pod)",
        ))
    } else {
        load_kube_config(&settings.kubeconfig).await
    };
    let primary_error = match primary {
        Ok(config) => return Ok((config, Credentials::Own)),
        Err(e) => e,
    };
    if is_explicit(&settings.kubeconfig) {
        return Err(primary_error);
    }
    let kept = settings.disk.layout().credentials_path();
    if !kept.exists() {
        return Err(primary_error);
    }
    match load_kube_config(&KubeconfigSource::File(kept.clone())).await {
        Ok(config) => {
            info!(kubeconfig = %kept.display(), "using the API credentials kept for the static copy");
            Ok((config, Credentials::Kept))
        }
        Err(kept_error) => Err(Error::usage(
            format!("{}; and the kept credentials", error_chain(&primary_error)),
            kept_error,
        )),
    }
}

/// Whether a failure to load `source` is the operator's mistake (a usage error). The
/// rendered kubeconfig names the pod's service-account token and CA; in the static copy
/// (no service account: static pods get none) those files are absent, and that copy must
/// run like one without a named kubeconfig: on the kept credentials, else offline.
fn is_explicit(source: &KubeconfigSource) -> bool {
    source.is_explicit() && !uses_absent_service_account(source)
}

fn uses_absent_service_account(source: &KubeconfigSource) -> bool {
    let KubeconfigSource::File(path) = source else {
        return false;
    };
    std::fs::read_to_string(path).is_ok_and(|text| {
        text.contains(SERVICE_ACCOUNT_DIR)
            && !std::path::Path::new(crate::config::SERVICE_ACCOUNT_TOKEN).exists()
    })
}

/// Where the kubelet mounts a pod's service-account token and CA.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount/";

async fn load_kube_config(source: &KubeconfigSource) -> Result<kube::Config> {
    match source {
        KubeconfigSource::Default(path) => {
            Box::pin(load_kube_config(&KubeconfigSource::File(path.clone()))).await
        }
        KubeconfigSource::InCluster => kube::Config::incluster()
            .map_err(|e| Error::usage("--kubeconfig: in-cluster configuration failed", e)),
        KubeconfigSource::File(path) => {
            let kubeconfig = crate::kubeconfig::read(path)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| Error::usage(format!("--kubeconfig: {}", path.display()), e))
        }
    }
}

/// The agent's connection to the API server, once it has credentials.
pub(super) struct ApiLink {
    pub(super) observer: Observer,
    pub(super) events: EventSink,
    /// `None` for the kept credentials (they cannot mint) and an injected client.
    keeper: Option<CredentialKeeper>,
}

impl ApiLink {
    fn new(client: kube::Client, server: Option<ServerAccess>, settings: &RunSettings) -> Self {
        let allowed = ckpt_core::NamespaceAllowList::new(settings.namespaces.iter().cloned());
        // The crate's defaults: a 500 ms probe with a 1 s timeout, unreachable after two
        // misses, so a hung server is detected within ~2 s.
        let config = ApiWatchConfig::new(settings.node_name.clone(), allowed);
        Self {
            observer: Observer::spawn(client.clone(), config, REQUEST_TIMEOUT),
            events: EventSink::new(client.clone(), &settings.node_name),
            keeper: server.and_then(|server| CredentialKeeper::new(client, server, settings)),
        }
    }

    /// Keeps the static copy's credentials fresh (hourly; see [`crate::credentials`]).
    pub(super) async fn keep_credentials(&mut self) {
        if let Some(keeper) = &mut self.keeper {
            keeper.keep_if_due().await;
        }
    }
}

/// Mints tokens for the static copy's service account (`--static-service-account`, which
/// may not mint tokens itself) and keeps them with their kubeconfig in the checkpoint dir.
pub(super) struct CredentialKeeper {
    client: kube::Client,
    server: ServerAccess,
    account: ServiceAccountRef,
    kept: KeptCredentials,
    token_file: std::path::PathBuf,
    due: Instant,
    /// Failed attempts in a row: the retry's back-off.
    failures: u32,
}

impl CredentialKeeper {
    fn new(client: kube::Client, server: ServerAccess, settings: &RunSettings) -> Option<Self> {
        let layout = settings.disk.layout();
        let token_file = layout.credentials_token_path();
        let kept = KeptCredentials::new(layout)
            .inspect_err(
                |e| warn!(error = %error_chain(e), "cannot keep API credentials for the static copy"),
            )
            .ok()?;
        Some(Self {
            client,
            server,
            account: ServiceAccountRef {
                namespace: settings.pod_namespace.clone(),
                name: settings.static_service_account.clone(),
            },
            kept,
            token_file,
            due: Instant::now(),
            failures: 0,
        })
    }

    /// Mints and writes if it is time.
    pub(super) async fn keep_if_due(&mut self) {
        if Instant::now() < self.due {
            return;
        }
        let account = &self.account;
        let minted = tokio::time::timeout(REQUEST_TIMEOUT, mint_token(&self.client, account))
            .await
            .unwrap_or_else(|_| {
                Err(Error::runtime(
                    "cannot mint a token for the static copy",
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer within 5 s"),
                ))
            });
        let written = match minted {
            Ok(minted) => {
                let kubeconfig = render_kubeconfig(&self.server, account, &self.token_file);
                let kept = self.kept.clone();
                // Off the runtime thread: the write fsyncs, and a slow disk must not stall
                // the health endpoints of a copy on standby.
                crate::blocking_pool::blocking(move || kept.write(&kubeconfig, minted.token.as_bytes()))
                    .await
                    .map_err(|e| Error::runtime("cannot store the static copy's API credentials", e))
                    .map(|_| minted.lifetime)
            }
            Err(e) => Err(e),
        };
        self.failures = if written.is_ok() {
            0
        } else {
            self.failures.saturating_add(1)
        };
        self.due = Instant::now() + credentials_refresh(written, account, self.failures);
    }

    /// Keeps them fresh for as long as it is polled (while waiting for the lock).
    pub(super) async fn keep_forever(mut self) {
        loop {
            self.keep_if_due().await;
            tokio::time::sleep_until(self.due.into()).await;
        }
    }
}
/// When to mint again: logs the outcome.
fn credentials_refresh(
    written: Result<Option<Duration>>,
    account: &ServiceAccountRef,
    failures: u32,
) -> Duration {
    match written {
        Ok(lifetime) => {
            let next = refresh_after(lifetime);
            info!(
                service_account = %format!("{}/{}", account.namespace, account.name),
                lifetime_s = lifetime.map(|l| l.as_secs()),
                next_refresh_s = next.as_secs(),
                "kept fresh API credentials for the static copy"
            );
            next
        }
        Err(e) => {
            // Jittered: every node's mint fails together when the API server does.
            let retry = equal_jitter(retry_after(failures));
            warn!(error = %error_chain(&e), retry_s = retry.as_secs(), "the static copy's API credentials are not refreshed");
            retry
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The anonymous probe's configuration keeps the server, drops the user, and checks
    /// the certificate whenever a CA is at hand.
    #[tokio::test]
    async fn an_anonymous_configuration_keeps_the_server_and_drops_the_user() {
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, PEM).unwrap();
        let absent = dir.path().join("absent/ca.crt");
        // (the cluster's CA line, whether the certificate goes unchecked)
        let cases = [
            (format!("certificate-authority: {}", absent.display()), true),
            (format!("certificate-authority: {}", ca_file.display()), false),
            (format!("certificate-authority-data: {}", base64_of(PEM)), false),
            ("insecure-skip-tls-verify: true".to_owned(), true),
        ];
        for (ca, unchecked) in cases {
            let path = dir.path().join("kubeconfig");
            std::fs::write(
                &path,
                format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    {ca}\n\
                     users:\n- name: u\n  user:\n    tokenFile: /absent/token\n    username: admin\n    password: secret\n\
                     contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
                ),
            )
            .unwrap();
            let config = anonymous_config(&path).await.expect(&ca);
            assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/", "{ca}");
            assert_eq!(config.accept_invalid_certs, unchecked, "{ca}");
            let user = &config.auth_info;
            assert!(
                user.token_file.is_none() && user.username.is_none() && user.password.is_none(),
                "{ca}: no credentials"
            );
        }
    }

    fn base64_of(text: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(text)
    }

    /// A CA certificate (the probe never connects here).
    const PEM: &str = include_str!("../../../ckpt-testkit/src/testdata/ca.pem");

    /// The rendered kubeconfig in a copy without a service account (the static copy) is
    /// not the operator's mistake: that copy falls back to the kept credentials.
    #[test]
    fn a_kubeconfig_of_the_absent_service_account_is_not_explicit() {
        if std::path::Path::new(crate::config::SERVICE_ACCOUNT_TOKEN).exists() {
            eprintln!("skipped: this process has a service-account token");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let check = |text: &str, explicit: bool| {
            let path = dir.path().join("kubeconfig");
            std::fs::write(&path, text).unwrap();
            assert_eq!(is_explicit(&KubeconfigSource::File(path)), explicit, "{text}");
        };
        check(
            "users:\n- name: sa\n  user:\n    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
            false,
        );
        check(
            "users:\n- name: u\n  user:\n    tokenFile: /etc/kubernetes/token\n",
            true,
        );
        assert!(is_explicit(&KubeconfigSource::File(dir.path().join("missing"))));
        assert!(!is_explicit(&KubeconfigSource::InCluster));
    }
}
