//! `pod-checkpointer run`: take the lock, then observe → GC verdicts → plan → execute →
//! report, triggered by API events, reachability changes, the local runtime poll, GC
//! deadlines and a slow resync. Bursts are coalesced into one pass.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ckpt_core::{
    ApiObjects, Checkpoint, CheckpointState, ControllerOwner, DiskCheckpoint, GcDecision, GcVerdict,
    LocalView, NamespaceAllowList, PersistentState, PlanInputs, PodId, RequiredObjects, SanitizeOptions,
    SelfIdentity, StoredCopy, Timestamp, is_parent, required_objects, sanitize,
};
use ckpt_gc::{GcContext, GcPolicy, OwnerStatus, Sibling};
use ckpt_lock::LockFile;
use ckpt_store::{Store, StoredCheckpoint};
use ckpt_watch::{
    ApiSnapshot, ApiState, ApiWatch, ApiWatchConfig, CriClient, KubeletClient, KubeletConfig, LocalObserver,
    ObjectWatch, OwnerLookup, OwnerPresence,
};
use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, info, warn};

use ckpt_core::{LockIdentity, error_chain};

use crate::config::{KubeconfigSource, RunSettings};
use crate::credentials::{
    RETRY, ServerAccess, ServiceAccountRef, mint_token, refresh_after, render_kubeconfig,
};
use crate::error::{Error, Result};
use crate::events::{EventKind, EventSink};
use crate::executor::{Reporting, execute};
use crate::health::{self, Health, Phase};

/// How often the local runtime is polled.
const LOCAL_POLL: Duration = Duration::from_secs(1);
/// Passes run at once after a pass that changed the disk, at most (one is enough for
/// any plan today; the bound keeps a planner that never settles from spinning).
const MAX_FOLLOW_UPS: u32 = 3;
/// A full pass at least this often, whatever else happens.
const RESYNC: Duration = Duration::from_secs(30);
/// Events arriving within this window after a trigger are folded into the same pass.
const COALESCE: Duration = Duration::from_millis(20);
/// Timeout for every request the agent makes itself.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The service-account token the kubelet API is called with, when running in a pod.
const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// Where the agent's API client comes from.
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

/// `run` until `shutdown` resolves (the binary passes SIGTERM/SIGINT) or self-GC.
pub(crate) async fn run(
    settings: RunSettings,
    api: ApiSource,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    // Check the kubeconfig before waiting: a bad one is a usage error, not a crash loop
    // that starts only after the other copy exits. Without a named kubeconfig the agent
    // may be the static copy after a reboot (no service-account token, no service
    // environment): it runs offline rather than leave the node without checkpoints.
    let api = match api {
        ApiSource::Client(client) => Some(Connect::Client(client)),
        ApiSource::Kubeconfig => match load_api_config(&settings).await {
            Ok(config) => Some(Connect::Config(Box::new(config))),
            Err(e) if !settings.kubeconfig.is_explicit() => {
                warn!(error = %error_chain(&e), "no API credentials: running offline, the API server counts as unreachable");
                None
            }
            Err(e) => return Err(e),
        },
    };
    let policy = ckpt_gc::build(
        &settings.gc_strategy,
        &ckpt_gc::GcConfig::new(settings.grace_period).with_gc_section(settings.gc_section.clone()),
    )
    .map_err(|e| Error::usage("--gc-strategy", e))?;

    let health = Health::new();
    // Held until `run` returns: an in-process agent stops serving when it stops.
    let _server = match &settings.metrics_addr {
        Some(addr) => Some(
            health::serve(addr, health.clone())
                .await
                .map_err(|e| Error::usage(format!("--metrics-addr: cannot listen on {addr}"), e))?,
        ),
        None => None,
    };

    let identity = LockIdentity::new(&settings.pod_namespace, &settings.pod_name, &settings.node_name);
    let lock = LockFile::new(&settings.disk.lock_file, identity.to_string());
    info!(lock = %settings.disk.lock_file.display(), "waiting for the lock");
    let mut shutdown = std::pin::pin!(shutdown);
    let _guard = tokio::select! {
        guard = lock.acquire() => guard.map_err(|e| Error::runtime(format!("cannot take the lock {}", settings.disk.lock_file.display()), e))?,
        () = &mut shutdown => {
            info!("signal received while on standby; exiting");
            return Ok(());
        }
    };
    info!("lock taken: this copy is active");
    health.set_phase(Phase::Starting);

    // Only now: clients (DESIGN §3.5, both copies lock before creating any client).
    let store = Store::open(settings.disk.layout())
        .map_err(|e| Error::runtime("cannot open the checkpoint store", e))?;
    let mut agent = Agent::new(settings, store, health, policy)?;
    match api {
        Some(Connect::Client(client)) => {
            agent.link = Some(ApiLink::new(client, None, &agent.settings, &agent.allowed));
        }
        Some(Connect::Config(config)) => {
            let server = server_access(&config);
            let client = client_from(*config)?;
            agent.link = Some(ApiLink::new(client, server, &agent.settings, &agent.allowed));
        }
        // The credentials the other copy keeps may have appeared while this one waited.
        None => {
            agent.reconnect().await;
        }
    }
    agent.run(shutdown).await
}

/// How the API client is made once the lock is held.
enum Connect {
    Client(kube::Client),
    Config(Box<kube::Config>),
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
/// without either (the static copy) the kubeconfig the connected copy keeps for it.
async fn load_api_config(settings: &RunSettings) -> Result<kube::Config> {
    let primary = load_kube_config(&settings.kubeconfig).await;
    let Err(primary_error) = primary else {
        return primary;
    };
    if settings.kubeconfig.is_explicit() {
        return Err(primary_error);
    }
    let kept = settings.disk.layout().credentials_path();
    if !kept.exists() {
        return Err(primary_error);
    }
    match load_kube_config(&KubeconfigSource::File(kept.clone())).await {
        Ok(config) => {
            info!(kubeconfig = %kept.display(), "using the API credentials kept for the static copy");
            Ok(config)
        }
        Err(kept_error) => Err(Error::usage(
            format!("{}; and the kept credentials", error_chain(&primary_error)),
            kept_error,
        )),
    }
}

async fn load_kube_config(source: &KubeconfigSource) -> Result<kube::Config> {
    match source {
        KubeconfigSource::Default(path) => {
            Box::pin(load_kube_config(&KubeconfigSource::File(path.clone()))).await
        }
        KubeconfigSource::InCluster => kube::Config::incluster()
            .map_err(|e| Error::usage("--kubeconfig: in-cluster configuration failed", e)),
        KubeconfigSource::File(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| Error::usage(format!("--kubeconfig: cannot read {}", path.display()), e))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| Error::usage(format!("--kubeconfig: {}", path.display()), e))
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
pub(crate) async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// The agent's connection to the API server, once it has credentials.
struct ApiLink {
    api: ApiWatch,
    objects: ObjectWatch,
    owners: OwnerLookup,
    events: EventSink,
    client: kube::Client,
    /// How this copy reaches the API server, for the static copy's kubeconfig.
    server: Option<ServerAccess>,
}

impl ApiLink {
    /// `server`: how the client reaches the API server, when known (not for an injected
    /// client); without it no credentials are kept for the static copy.
    fn new(
        client: kube::Client,
        server: Option<ServerAccess>,
        settings: &RunSettings,
        allowed: &NamespaceAllowList,
    ) -> Self {
        // The crate's defaults: a 500 ms probe with a 1 s timeout, unreachable after two
        // misses, so a hung server is detected within ~2 s.
        let api = ApiWatch::spawn(
            client.clone(),
            ApiWatchConfig::new(settings.node_name.clone(), allowed.clone()),
        );
        Self {
            objects: ObjectWatch::new(client.clone(), api.notifier()),
            owners: OwnerLookup::new(client.clone(), REQUEST_TIMEOUT),
            events: EventSink::new(client.clone(), &settings.node_name),
            api,
            client,
            server,
        }
    }
}

/// How often an offline agent tries to load its API credentials again.
const RECONNECT: Duration = Duration::from_secs(10);

struct Agent {
    settings: RunSettings,
    allowed: NamespaceAllowList,
    store: Store,
    health: Health,
    policy: Box<dyn GcPolicy>,
    link: Option<ApiLink>,
    /// Never bumped: what the loop waits on while offline.
    offline_changes: tokio::sync::watch::Sender<u64>,
    local: LocalObserver,
    me: SelfIdentity,
    state: PersistentState,
    last_local: Option<LocalView>,
    last_api_state: Option<ApiState>,
    refusals: BTreeMap<PodId, String>,
    /// Parents whose Secrets/ConfigMaps the agent may not read, with the logged reason.
    waiting_for_access: BTreeMap<PodId, String>,
    next_deadline: Option<Timestamp>,
    /// When to mint the static copy's token again.
    credentials_due: Instant,
}

impl Agent {
    fn new(settings: RunSettings, store: Store, health: Health, policy: Box<dyn GcPolicy>) -> Result<Self> {
        let allowed = NamespaceAllowList::new(settings.namespaces.iter().cloned());
        let cri = match &settings.runtime_endpoint {
            Some(endpoint) => Some(
                CriClient::new(endpoint, REQUEST_TIMEOUT)
                    .map_err(|e| Error::usage("--runtime-endpoint", e))?,
            ),
            None => None,
        };
        let token = std::path::Path::new(SERVICE_ACCOUNT_TOKEN);
        let kubelet = KubeletClient::new(KubeletConfig {
            url: settings.kubelet_url.clone(),
            readonly_url: settings.kubelet_readonly_url.clone(),
            token_file: token.exists().then(|| token.to_path_buf()),
            ca_file: None,
            timeout: REQUEST_TIMEOUT,
        })
        .map_err(|e| Error::usage("--kubelet-url", e))?;
        // With the CRI on, the kubelet's `/pods` would only name parents the kubelet knows
        // (informational: content always comes from the API), so it is not polled every
        // second; with the CRI off it is the source of "running" (DESIGN §3.6).
        let kubelet = cri.is_none().then_some(kubelet);
        let local = LocalObserver::new(cri, kubelet, allowed.clone());
        let me = SelfIdentity::new(&settings.pod_namespace, &settings.pod_name, &settings.node_name);
        let state = match store.read_journal::<PersistentState>() {
            Ok(state) => state.unwrap_or_default(),
            Err(e) => {
                warn!(error = %error_chain(&e), "the state journal is unreadable; starting with empty GC timers");
                PersistentState::default()
            }
        };
        Ok(Self {
            settings,
            allowed,
            store,
            health,
            policy,
            link: None,
            offline_changes: tokio::sync::watch::channel(0).0,
            local,
            me,
            state,
            last_local: None,
            last_api_state: None,
            refusals: BTreeMap::new(),
            waiting_for_access: BTreeMap::new(),
            next_deadline: None,
            credentials_due: Instant::now(),
        })
    }

    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        match &self.link {
            Some(link) => link.api.subscribe(),
            None => self.offline_changes.subscribe(),
        }
    }

    /// While offline: tries the credentials again; true once connected.
    async fn reconnect(&mut self) -> bool {
        let config = match load_api_config(&self.settings).await {
            Ok(config) => config,
            Err(e) => {
                debug!(error = %error_chain(&e), "still offline");
                return false;
            }
        };
        let server = server_access(&config);
        match client_from(config) {
            Ok(client) => {
                info!("API credentials available: connecting to the API server");
                self.link = Some(ApiLink::new(client, server, &self.settings, &self.allowed));
                true
            }
            Err(e) => {
                debug!(error = %error_chain(&e), "still offline");
                false
            }
        }
    }

    async fn run(&mut self, mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>) -> Result<()> {
        let mut api_changes = self.subscribe();
        let mut reconnect = tokio::time::interval(RECONNECT);
        reconnect.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut local_tick = tokio::time::interval(LOCAL_POLL);
        local_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut resync = tokio::time::interval(RESYNC);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut local = self.local.observe().await;
        let mut follow_ups = 0;
        loop {
            let started = Instant::now();
            let result = self.pass(local).await?;
            debug!(elapsed_ms = started.elapsed().as_millis() as u64, "pass complete");
            match result {
                PassResult::Changed if follow_ups < MAX_FOLLOW_UPS => {
                    follow_ups += 1;
                    local = self.local.observe().await;
                    continue;
                }
                PassResult::Changed | PassResult::Settled => follow_ups = 0,
                PassResult::SelfGcComplete => {
                    // Nothing is left for a static copy to use them on, nor any timer to keep:
                    // an uninstalled node keeps no file of ours.
                    if let Err(e) = self.store.remove_credentials() {
                        warn!(error = %error_chain(&e), "cannot remove the kept API credentials");
                    }
                    if let Err(e) = self.store.remove_journal() {
                        warn!(error = %error_chain(&e), "cannot remove the state journal");
                    }
                    info!("self-GC complete: every checkpoint removed, this one last; exiting");
                    return Ok(());
                }
            }
            // Wait for the next reason to look again.
            let deadline = self.next_deadline.map(|t| {
                let wait = t.since(Timestamp::now());
                tokio::time::Instant::now() + wait
            });
            local = loop {
                tokio::select! {
                    biased;
                    () = &mut shutdown => {
                        info!("signal received; released the lock and exiting");
                        return Ok(());
                    }
                    changed = api_changes.changed() => {
                        if changed.is_err() {
                            return Err(Error::runtime("the API watch stopped", std::io::Error::other("watch channel closed")));
                        }
                        tokio::time::sleep(COALESCE).await;
                        api_changes.borrow_and_update();
                        break self.local.observe().await;
                    }
                    _ = resync.tick() => break self.local.observe().await,
                    _ = reconnect.tick(), if self.link.is_none() => {
                        if self.reconnect().await {
                            api_changes = self.subscribe();
                            break self.local.observe().await;
                        }
                    }
                    () = sleep_until(deadline) => break self.local.observe().await,
                    _ = local_tick.tick() => {
                        let observed = self.local.observe().await;
                        if self.last_local.as_ref() != Some(&observed) {
                            break observed;
                        }
                    }
                }
            };
        }
    }

    /// One pass: observe, decide GC, plan, execute, report.
    async fn pass(&mut self, local: LocalView) -> Result<PassResult> {
        let started = Instant::now();
        let now = Timestamp::now();
        let snapshot = match &self.link {
            Some(link) => link.api.snapshot(),
            None => offline_snapshot(),
        };
        self.log_api_state(&snapshot);
        let stored = match self.store.read_all() {
            Ok(stored) => stored,
            Err(e) => {
                warn!(error = %error_chain(&e), "cannot read the checkpoints; retrying on the next pass");
                self.health.write_error();
                self.last_local = Some(local);
                return Ok(PassResult::Settled);
            }
        };
        let disk: BTreeMap<PodId, DiskCheckpoint> = stored
            .iter()
            .map(|(id, s)| (id.clone(), disk_checkpoint(s)))
            .collect();
        self.learn_own_owner(&snapshot, &disk);

        let parents: BTreeMap<PodId, Arc<Pod>> = snapshot
            .pods
            .iter()
            .filter(|(_, pod)| is_parent(pod, &self.allowed))
            .map(|(id, pod)| (id.clone(), Arc::clone(pod)))
            .collect();
        let api_view = snapshot.api_view(&self.allowed);
        let checkpoints = if snapshot.state == ApiState::Synced {
            self.sanitize_parents(&parents, now)
        } else {
            BTreeMap::new()
        };
        let desired: BTreeMap<PodId, String> = checkpoints
            .iter()
            .map(|(id, c)| (id.clone(), c.spec_hash.clone()))
            .collect();

        let mut inputs = PlanInputs {
            api: &api_view,
            local: &local,
            disk: &disk,
            desired: &desired,
            verdicts: &BTreeMap::new(),
            state: &self.state,
            me: &self.me,
        };
        let orphans = ckpt_core::orphans(&inputs, now);
        let context = AgentGcContext {
            now,
            owners: self.link.as_ref().map(|l| &l.owners),
            parents: &parents,
            disk: &disk,
            desired: &desired,
        };
        let mut verdicts: BTreeMap<PodId, GcDecision> = BTreeMap::new();
        for orphan in &orphans {
            verdicts.insert(orphan.id.clone(), self.policy.decide(orphan, &context).await);
        }
        inputs.verdicts = &verdicts;
        let plan = ckpt_core::plan(&inputs, now);

        let parent_uids: BTreeMap<PodId, String> = disk
            .iter()
            .filter_map(|(id, d)| {
                let uid = d
                    .inactive
                    .as_ref()
                    .or(d.active.as_ref())?
                    .meta
                    .parent_uid
                    .clone()?;
                Some((id.clone(), uid))
            })
            .chain(
                parents
                    .iter()
                    .filter_map(|(id, p)| Some((id.clone(), p.metadata.uid.clone()?))),
            )
            .collect();
        let outcome = if plan.is_noop() {
            Default::default()
        } else {
            info!(
                writes = plan.writes.len(),
                stops = plan.stops.len(),
                starts = plan.starts.len(),
                removes = plan.removes.len(),
                self_gc = plan.self_gc,
                api = snapshot.state.as_str(),
                "executing plan"
            );
            execute(
                &self.store,
                &plan,
                &checkpoints,
                &Reporting {
                    health: &self.health,
                    events: self.link.as_ref().map(|l| &l.events),
                    api_reachable: snapshot.state != ApiState::Unreachable,
                    strategy: &self.settings.gc_strategy,
                    parent_uids: &parent_uids,
                },
            )
            .await
        };
        if plan.state != self.state {
            match self.store.write_journal(&plan.state) {
                Ok(_) => self.state = plan.state.clone(),
                Err(e) => {
                    warn!(error = %error_chain(&e), "cannot save the state journal");
                    self.health.write_error();
                }
            }
        }
        self.next_deadline = verdicts
            .values()
            .filter_map(|v| match v.verdict {
                GcVerdict::RemoveAt(t) if t > now => Some(t),
                _ => None,
            })
            .min();

        let mut by_state: BTreeMap<&'static str, u64> = BTreeMap::new();
        for state in plan.states.values() {
            let name = match state {
                CheckpointState::Inactive => "inactive",
                CheckpointState::InactiveGrace(_) => "inactive-grace",
                CheckpointState::Active => "active",
                CheckpointState::ActiveGrace(_) => "active-grace",
                CheckpointState::SelfActive => "self",
                CheckpointState::Removed => continue,
            };
            *by_state.entry(name).or_default() += 1;
        }
        let synced_now = (snapshot.state == ApiState::Synced).then_some(now);
        self.health
            .record_views(snapshot.state.as_str(), local != LocalView::Unknown, synced_now);
        self.health.record_pass(started.elapsed(), by_state);
        if self.health.phase() == Phase::Starting {
            self.health.set_phase(Phase::Ready);
            info!(checkpoints = disk.len(), "first pass complete: ready");
        }
        if local == LocalView::Unknown && self.last_local.as_ref() != Some(&LocalView::Unknown) {
            warn!("the local runtime is unavailable: treating what runs here as unknown");
        }
        self.last_local = Some(local);
        if outcome.self_gc_complete {
            return Ok(PassResult::SelfGcComplete);
        }
        if snapshot.state == ApiState::Synced {
            self.keep_credentials(&snapshot).await;
        }
        Ok(if !plan.is_noop() && outcome.failures == 0 {
            PassResult::Changed
        } else {
            PassResult::Settled
        })
    }

    /// Sanitizes every parent whose Secrets and ConfigMaps are loaded; refusals are
    /// logged (once per change), counted and reported as Events.
    fn sanitize_parents(
        &mut self,
        parents: &BTreeMap<PodId, Arc<Pod>>,
        now: Timestamp,
    ) -> BTreeMap<PodId, Checkpoint> {
        let Some(link) = &self.link else {
            return BTreeMap::new();
        };
        let mut required_by_ns: BTreeMap<String, RequiredObjects> = BTreeMap::new();
        let mut required: BTreeMap<PodId, RequiredObjects> = BTreeMap::new();
        for (id, pod) in parents {
            let req = required_objects(pod);
            let ns = required_by_ns.entry(id.namespace.clone()).or_default();
            ns.secrets.extend(req.secrets.iter().cloned());
            ns.config_maps.extend(req.config_maps.iter().cloned());
            required.insert(id.clone(), req);
        }
        for ns in self.allowed.namespaces() {
            link.objects
                .ensure(ns, required_by_ns.get(ns).unwrap_or(&RequiredObjects::default()));
        }
        let options = SanitizeOptions {
            checkpoint_dir: self.settings.disk.checkpoint_dir.display().to_string(),
            checkpointed_at: now,
        };
        let mut out = BTreeMap::new();
        let mut still_refused = BTreeSet::new();
        let mut still_waiting = BTreeSet::new();
        for (id, pod) in parents {
            let view = link.objects.objects(&id.namespace);
            let req = &required[id];
            let unresolved = view.unresolved(req);
            let waiting: Vec<String> = unresolved
                .iter()
                .filter(|(r, _)| !view.failed.contains_key(r))
                .map(|(r, why)| format!("{r} ({why})"))
                .collect();
            if !waiting.is_empty() {
                debug!(pod = %id, ?waiting, "waiting for Secrets/ConfigMaps before checkpointing");
                continue;
            }
            // A Secret/ConfigMap we may not read (RBAC) is not a pod that cannot be
            // represented: wait for the permission (the watch retries), say so once, and keep
            // whatever checkpoint exists — no refusal Event, no refusal metric.
            let forbidden: Vec<String> = unresolved.iter().map(|(r, why)| format!("{r}: {why}")).collect();
            if !forbidden.is_empty() {
                let message = format!("cannot read what the pod mounts: {}", forbidden.join("; "));
                if self.waiting_for_access.get(id) != Some(&message) {
                    warn!(pod = %id, reason = %message, "not checkpointing until the agent may read it");
                    self.waiting_for_access.insert(id.clone(), message);
                }
                still_waiting.insert(id.clone());
                continue;
            }
            let objects = ApiObjects {
                secrets: view
                    .objects
                    .secrets
                    .iter()
                    .filter(|(n, _)| req.secrets.contains(*n))
                    .map(|(n, s)| (n.clone(), s.clone()))
                    .collect(),
                config_maps: view
                    .objects
                    .config_maps
                    .iter()
                    .filter(|(n, _)| req.config_maps.contains(*n))
                    .map(|(n, c)| (n.clone(), c.clone()))
                    .collect(),
            };
            match sanitize(pod, &objects, &options) {
                Ok(sanitized) => {
                    for warning in &sanitized.warnings {
                        if self.refusals.get(id) != Some(warning) {
                            info!(pod = %id, "{warning}");
                        }
                    }
                    out.insert(id.clone(), sanitized.checkpoint);
                }
                Err(e) => {
                    let message = e.to_string();
                    still_refused.insert(id.clone());
                    if self.refusals.get(id) != Some(&message) {
                        warn!(pod = %id, reason = %message, "refusing to checkpoint");
                        self.health.refused();
                        link.events.publish(
                            true,
                            id,
                            pod.metadata.uid.as_deref(),
                            EventKind::Refused,
                            message.clone(),
                        );
                        self.refusals.insert(id.clone(), message);
                    }
                }
            }
        }
        self.refusals.retain(|id, _| still_refused.contains(id));
        self.waiting_for_access.retain(|id, _| still_waiting.contains(id));
        out
    }

    /// The agent's controller owner, from its own pod in the API or its own checkpoint:
    /// it recognises the agent's rolled pods (same DaemonSet, new name).
    fn learn_own_owner(&mut self, snapshot: &ApiSnapshot, disk: &BTreeMap<PodId, DiskCheckpoint>) {
        let own = self.me.parent_id();
        let owner = snapshot
            .pods
            .get(&own)
            .and_then(|p| ControllerOwner::of(p))
            .or_else(|| {
                disk.get(&own)
                    .and_then(|d| d.inactive.as_ref().or(d.active.as_ref()))
                    .and_then(|c| c.meta.owner.clone())
            });
        if owner.is_some() && owner != self.me.owner {
            info!(owner = ?owner, "recognised the agent's own controller");
            self.me.owner = owner;
        }
    }

    /// Mints a token for the agent's own service account and keeps the static copy's
    /// kubeconfig with it, hourly while the API is synced (see [`crate::credentials`]).
    async fn keep_credentials(&mut self, snapshot: &ApiSnapshot) {
        if Instant::now() < self.credentials_due {
            return;
        }
        let Some(link) = &self.link else { return };
        let Some(server) = &link.server else { return };
        let own = self.me.parent_id();
        let own_pod = snapshot.pods.get(&own).or_else(|| {
            snapshot
                .pods
                .iter()
                .find(|(id, pod)| self.me.is_self(id, ControllerOwner::of(pod).as_ref()))
                .map(|(_, pod)| pod)
        });
        // Descheduled (or not created yet): keep what is stored, it is what self-GC needs.
        let Some(account) = own_pod.and_then(|p| ServiceAccountRef::of(p)) else {
            return;
        };
        let minted = tokio::time::timeout(REQUEST_TIMEOUT, mint_token(&link.client, &account))
            .await
            .unwrap_or_else(|_| {
                Err(Error::runtime(
                    "cannot mint a token for the static copy",
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer within 5 s"),
                ))
            });
        let written = minted.and_then(|minted| {
            let token_file = self.store.layout().credentials_token_path();
            let kubeconfig = render_kubeconfig(server, &account, &token_file);
            self.store
                .write_credentials(&kubeconfig, minted.token.as_bytes())
                .map_err(|e| Error::runtime("cannot store the static copy's API credentials", e))?;
            Ok(minted.lifetime)
        });
        match written {
            Ok(lifetime) => {
                let next = refresh_after(lifetime);
                info!(
                    service_account = %format!("{}/{}", account.namespace, account.name),
                    lifetime_s = lifetime.map(|l| l.as_secs()),
                    next_refresh_s = next.as_secs(),
                    "kept fresh API credentials for the static copy"
                );
                self.credentials_due = Instant::now() + next;
            }
            Err(e) => {
                warn!(error = %error_chain(&e), retry_s = RETRY.as_secs(), "the static copy's API credentials are not refreshed");
                self.credentials_due = Instant::now() + RETRY;
            }
        }
    }

    fn log_api_state(&mut self, snapshot: &ApiSnapshot) {
        if self.last_api_state != Some(snapshot.state) {
            info!(
                api = snapshot.state.as_str(),
                error = snapshot.last_error.as_deref().unwrap_or(""),
                "API server view changed"
            );
            self.last_api_state = Some(snapshot.state);
        }
    }
}

enum PassResult {
    /// Nothing changed on disk, or a step failed (retried on the next trigger, not in a
    /// tight loop): wait for the next reason to look.
    Settled,
    /// The plan changed the disk and every step succeeded: plan again at once. Some
    /// steps wait for an earlier one to be on disk — a rolled pod supersedes the old
    /// checkpoint only once its own is written — and would otherwise wait for the resync.
    Changed,
    /// Self-GC removed everything: exit.
    SelfGcComplete,
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn disk_checkpoint(stored: &StoredCheckpoint) -> DiskCheckpoint {
    let copy = |m: &ckpt_store::StoredManifest| StoredCopy {
        meta: m.meta.clone(),
        digest: m.digest.clone(),
    };
    DiskCheckpoint {
        inactive: stored.inactive.as_ref().map(copy),
        active: stored.active.as_ref().map(copy),
    }
}

/// What a GC strategy may look up, answered from this pass's observations.
struct AgentGcContext<'a> {
    now: Timestamp,
    owners: Option<&'a OwnerLookup>,
    parents: &'a BTreeMap<PodId, Arc<Pod>>,
    disk: &'a BTreeMap<PodId, DiskCheckpoint>,
    desired: &'a BTreeMap<PodId, String>,
}

#[async_trait]
impl GcContext for AgentGcContext<'_> {
    fn now(&self) -> Timestamp {
        self.now
    }

    async fn owner_status(&self, namespace: &str, owner: &ControllerOwner) -> OwnerStatus {
        let Some(owners) = self.owners else {
            return OwnerStatus::Unknown;
        };
        match owners.owner_status(namespace, owner).await {
            OwnerPresence::Present => OwnerStatus::Present,
            OwnerPresence::Absent => OwnerStatus::Absent,
            OwnerPresence::Unknown(reason) => {
                debug!(owner = %owner.to_annotation(), %reason, "owner lookup failed");
                OwnerStatus::Unknown
            }
        }
    }

    async fn siblings(&self, namespace: &str, owner: &ControllerOwner) -> Vec<Sibling> {
        // Only parents we can actually checkpoint count (desired holds the sanitizable
        // ones): a pod that can never be checkpointed must not supersede anything.
        self.parents
            .iter()
            .filter(|(id, pod)| {
                id.namespace == namespace
                    && self.desired.contains_key(*id)
                    && ControllerOwner::of(pod).is_some_and(|o| o.same_controller(owner))
            })
            .map(|(id, _)| {
                let stored = self
                    .disk
                    .get(id)
                    .and_then(|d| d.inactive.as_ref())
                    .and_then(|c| c.meta.spec_hash.as_ref());
                Sibling::new(id.clone(), stored.is_some() && stored == self.desired.get(id))
            })
            .collect()
    }
}

/// What an agent without API credentials sees: an unreachable API server.
fn offline_snapshot() -> ApiSnapshot {
    ApiSnapshot {
        state: ApiState::Unreachable,
        pods: BTreeMap::new(),
        synced_at: None,
        last_error: Some("no API credentials (running offline)".into()),
        namespaces: BTreeMap::new(),
        outages: 0,
    }
}
