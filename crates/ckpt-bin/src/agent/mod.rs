//! `pod-checkpointer run`: take the lock, then pass after pass — observe (ckpt-watch) →
//! decide (ckpt-core, pure, with the GC strategy's verdicts) → apply (the executor) →
//! report — triggered by API events, reachability changes, the local runtime poll, GC
//! deadlines and a slow resync. Bursts are coalesced into one pass. This module is
//! plumbing: every decision is made in `ckpt_core::decide`.

mod connect;
mod pass;
mod report;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ckpt_core::backoff::nth_delay;
use ckpt_core::{DecideConfig, LocalView, NamespaceAllowList, PersistentState, SelfIdentity, Timestamp};
use ckpt_gc::GcPolicy;
use ckpt_lock::{Confirmed, LockFile, LockGuard};
use ckpt_store::{LoadedJournal, Store};
use ckpt_watch::jitter::equal_jitter;
use ckpt_watch::{CriClient, KubeletClient, KubeletConfig, LocalObserver};
use tracing::{debug, error, info, warn};

pub use connect::ApiSource;
use connect::{ApiLink, Connect, CredentialKeeper};
use report::Reporter;

use ckpt_core::{LockIdentity, error_chain};

use crate::blocking_pool::blocking;
use crate::config::{KubeletTrust, RunSettings};
use crate::error::{Error, Result};
use crate::health::{self, Health, Phase};

/// How often the local runtime is polled.
const LOCAL_POLL: Duration = Duration::from_secs(1);
/// Passes run at once after a pass that changed the disk, at most (one is enough for
/// any plan today; the bound keeps a planner that never settles from spinning).
const MAX_FOLLOW_UPS: u32 = 3;
/// A full pass at least this often, whatever else happens.
const RESYNC: Duration = Duration::from_secs(30);
/// After a pass in which a step failed (a failing or full disk), the first retry comes
/// this soon (each delay jittered between half and all of it), then twice as late after
/// each failed retry ([`nth_delay`]), up to [`RESYNC`] (passes that
/// events bring meanwhile keep the delay): a transient error must not
/// hold an activation back for a resync, nor a lasting one retry in a tight loop.
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// Events arriving within this window after a trigger are folded into the same pass.
const COALESCE: Duration = Duration::from_millis(20);
/// Timeout for every request the agent makes itself.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the agent reads its DaemonSet and node again while its own pod is gone
/// (jittered: a DaemonSet deleted for good is read again by every node of the fleet).
const SCHEDULING_RECHECK: Duration = Duration::from_secs(10);
/// How often an offline agent tries to load its API credentials again.
const RECONNECT: Duration = Duration::from_secs(10);
/// After handing the lock over, a copy waits this long before it waits for the lock
/// again, so the other copy (which polls every 250 ms) takes it first.
const HANDOVER_PAUSE: Duration = Duration::from_secs(2);
/// The holder passes at least once per [`RESYNC`]; this many intervals without a
/// completed pass and it is no longer live (its probes fail, the kubelet restarts it).
const MISSED_PASSES: u32 = 3;

/// `run` until `shutdown` resolves (the binary passes SIGTERM/SIGINT) or self-GC.
pub(crate) async fn run(
    settings: RunSettings,
    api: ApiSource,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let connect = Connect::prepare(api.clone(), &settings).await?;
    let policy = ckpt_gc::build(
        &settings.gc_strategy,
        &ckpt_gc::GcConfig::new(settings.grace_period).with_gc_section(settings.gc_section.clone()),
    )
    .map_err(|e| Error::usage("--gc-strategy", e))?;

    let health =
        Health::new(RESYNC * MISSED_PASSES).with_kept_token(settings.disk.layout().credentials_token_path());
    // Held until `run` returns: an in-process agent stops serving when it stops.
    let _server = match &settings.metrics_addr {
        Some(addr) => Some(
            health::serve(addr, health.clone())
                .await
                .map_err(|e| Error::usage(format!("--metrics-addr: cannot listen on {addr}"), e))?,
        ),
        None => None,
    };
    let _socket_server =
        match &settings.health_socket {
            Some(path) => Some(health::serve_unix(path, health.clone()).await.map_err(|e| {
                Error::usage(format!("--health-socket: cannot listen on {}", path.display()), e)
            })?),
            None => None,
        };
    let result = hold_and_run(settings, api, policy, connect, health.clone(), shutdown).await;
    // Neither holding nor waiting any more, whatever the outcome.
    health.set_phase(Phase::Stopping);
    result
}

/// Waits for the lock, then runs the agent until a signal or self-GC.
async fn hold_and_run(
    settings: RunSettings,
    api: ApiSource,
    mut policy: Box<dyn GcPolicy>,
    mut connect: Option<Connect>,
    health: Health,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let identity = LockIdentity::new(&settings.pod_namespace, &settings.pod_name, &settings.node_name);
    let lock = LockFile::new(&settings.disk.lock_file, identity.to_string());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        info!(lock = %settings.disk.lock_file.display(), "waiting for the lock");
        health.set_phase(Phase::Standby);
        // The static copy that holds the lock after a reboot runs on the token this copy keeps.
        let keeper = connect.as_ref().and_then(|c| c.standby_keeper(&settings));
        let guard = tokio::select! {
            guard = lock.acquire() => guard.map_err(|e| Error::runtime(format!("cannot take the lock {}", settings.disk.lock_file.display()), e))?,
            () = &mut shutdown => {
                info!("signal received while on standby; exiting");
                return Ok(());
            }
            () = keep_while_waiting(keeper) => unreachable!("keeps going until the lock is taken"),
        };
        info!("lock taken: this copy is active");
        health.set_phase(Phase::Starting);
        // Only the holder answers on the node's address; dropped with the lock.
        let _prometheus = settings
            .metrics_listen
            .map(|addr| health::serve_for_prometheus(addr, health.clone()));

        // Only now: the clients of the active copy (both copies lock before watching).
        // On the blocking pool: opening reads and tidies the whole store, and the journal
        // with it, which on a disk slow after a power cut takes long enough for the
        // liveness probe, answered on this thread, to fail and restart the agent.
        let layout = settings.disk.layout();
        let manifests_dir = settings.disk.manifests_dir.clone();
        let (store, journal, manifests_dir_created) = blocking(move || {
            let existed = manifests_dir.is_dir();
            Store::open(layout).map(|store| {
                let journal = store.load_journal::<PersistentState>();
                (store, journal, !existed)
            })
        })
        .await
        .map_err(|e| Error::runtime("cannot open the checkpoint store", e))?;
        if manifests_dir_created {
            // Nothing silent: a kubelet reading another directory would never run a
            // checkpoint, and nothing else would say so before the next power cut.
            warn!(
                dir = %settings.disk.manifests_dir.display(),
                "the kubelet's manifests dir did not exist and was created: unless the kubelet's staticPodPath names it, no checkpoint written there will ever run (check --manifests-dir)"
            );
        }
        let (state, journal_in_place) = loaded_state(journal, &health);
        let link = match connect.take() {
            Some(connect) => Some(connect.link(&settings)?),
            // The credentials the other copy keeps may have appeared while this one waited.
            None => connect::reconnect(&settings).await,
        };
        let mut agent = Agent::new(
            settings.clone(),
            store,
            state,
            health.clone(),
            policy,
            link,
            guard,
        )?;
        agent.journal_in_place = journal_in_place;
        if agent.link.is_none() {
            agent.anonymous = connect::anonymous_probe(&settings).await;
        }
        let exit = agent.run(shutdown.as_mut()).await?;
        if exit == Exit::Done {
            return Ok(());
        }
        policy = agent.policy;
        // Releases the lock and stops the watches.
        drop(agent.guard);
        drop(agent.link);
        health.set_phase(Phase::Standby);
        if exit == Exit::HandOver {
            health.handover();
            warn!(
                after_s = settings.unauthorized_handover.as_secs(),
                "the API server keeps rejecting this copy's credentials or forbidding its own reads: handed the lock over to the other copy; checkpoints stay as they are"
            );
            tokio::select! {
                () = tokio::time::sleep(HANDOVER_PAUSE) => {}
                () = &mut shutdown => {
                    info!("signal received; exiting");
                    return Ok(());
                }
            }
        }
        // Fresh credentials: the other copy may have renewed the kept ones.
        connect = Connect::prepare(api.clone(), &settings).await?;
    }
}

/// The state to start from, and whether an unusable journal is still where a save would
/// write over it. A journal that cannot be used is never read as a new node's: its
/// known-good and rejected marks are unknown (`marks_unknown`, which the planner heeds)
/// until parents prove their content again, and it is said (a warning, a metric).
fn loaded_state(
    journal: ckpt_store::Result<LoadedJournal<PersistentState>>,
    health: &Health,
) -> (PersistentState, bool) {
    let (reason, set_aside) = match journal {
        Ok(LoadedJournal::Read(state)) => return (state, false),
        Ok(LoadedJournal::Missing) => return (PersistentState::default(), false),
        Ok(LoadedJournal::Unusable { reason, set_aside }) => (reason, set_aside),
        // Not even its directory could be read: it may be there, so it is set aside (or
        // found gone) before the first save.
        Err(e) => (error_chain(&e), None),
    };
    health.journal_unusable();
    warn!(
        reason,
        set_aside = ?set_aside.as_ref().map(|p| p.display().to_string()),
        "the state journal is unusable and kept aside: GC timers start afresh, and known-good and \
         rejected marks are unknown until parents prove their content again (an active older \
         revision serves on, no handoff, no set-aside)"
    );
    let state = PersistentState {
        marks_unknown: true,
        ..PersistentState::default()
    };
    (state, set_aside.is_none())
}

/// Keeps the static copy's credentials fresh while this copy waits; never ends.
async fn keep_while_waiting(keeper: Option<CredentialKeeper>) {
    match keeper {
        Some(keeper) => keeper.keep_forever().await,
        None => std::future::pending().await,
    }
}

/// Why [`Agent::run`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Exit {
    /// A signal, or self-GC: the process exits.
    Done,
    /// The API server rejected this copy's credentials for `--unauthorized-handover`: it
    /// releases the lock for the other copy and waits for it again.
    HandOver,
    /// The lock file was replaced while held and another process locks the new one: this
    /// copy steps down and waits for the lock again, so that one copy acts.
    LockLost,
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

struct Agent {
    settings: RunSettings,
    config: DecideConfig,
    /// Shared with the blocking pool, where all disk work runs
    /// ([`on_disk`](crate::blocking_pool::on_disk)).
    store: Arc<Store>,
    health: Health,
    policy: Box<dyn GcPolicy>,
    link: Option<ApiLink>,
    /// Never bumped: what the loop waits on while offline without a probe.
    offline_changes: tokio::sync::watch::Sender<u64>,
    /// While offline: the anonymous `/readyz` probe, so that a healthy API server is not
    /// taken for a dead one (`None` without a server to probe).
    anonymous: Option<ckpt_watch::ApiWatch>,
    local: LocalObserver,
    /// The GC timers. They advance in memory whether or not the journal could be saved
    /// (a full or read-only disk must not restart every timer, nor stop the GC that
    /// would free space).
    state: PersistentState,
    /// The journal on disk is behind `state`: the last save failed.
    journal_behind: bool,
    /// An unusable journal could not be moved to the quarantine dir at start: it is moved
    /// before the first save, which never writes over it.
    journal_in_place: bool,
    /// The last check of the lock failed (said once per streak).
    lock_unconfirmed: bool,
    last_local: Option<LocalView>,
    reporter: Reporter,
    next_deadline: Option<Timestamp>,
    /// Held while this copy is active; its record says when the credentials are rejected.
    guard: LockGuard,
    /// Since when the API server rejects this copy's credentials, without a break.
    unauthorized_since: Option<Timestamp>,
}

impl Agent {
    fn new(
        settings: RunSettings,
        store: Store,
        state: PersistentState,
        health: Health,
        policy: Box<dyn GcPolicy>,
        link: Option<ApiLink>,
        guard: LockGuard,
    ) -> Result<Self> {
        let allowed = NamespaceAllowList::new(settings.namespaces.iter().cloned());
        let cri = match &settings.runtime_endpoint {
            Some(endpoint) => Some(
                CriClient::new(endpoint, REQUEST_TIMEOUT)
                    .map_err(|e| Error::usage("--runtime-endpoint", e))?,
            ),
            None => None,
        };
        // With the CRI on, the kubelet's `/pods` would only name parents the kubelet knows
        // (informational: content always comes from the API), so it is not read at all;
        // with the CRI off it is the source of "running".
        let kubelet = match cri {
            Some(_) => None,
            None => Some(kubelet_client(&settings)?),
        };
        let local = LocalObserver::new(cri, kubelet, allowed.clone());
        let config = DecideConfig {
            allowed,
            me: SelfIdentity::new(&settings.pod_namespace, &settings.pod_name, &settings.node_name),
            checkpoint_dir: settings.disk.checkpoint_dir.display().to_string(),
            grace: settings.grace_period,
            revisions: settings.revisions,
        };
        Ok(Self {
            settings,
            config,
            store: Arc::new(store),
            health,
            policy,
            link,
            offline_changes: tokio::sync::watch::channel(0).0,
            anonymous: None,
            local,
            state,
            journal_behind: false,
            journal_in_place: false,
            lock_unconfirmed: false,
            last_local: None,
            reporter: Reporter::default(),
            next_deadline: None,
            guard,
            unauthorized_since: None,
        })
    }

    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        match (&self.link, &self.anonymous) {
            (Some(link), _) => link.observer.subscribe(),
            (None, Some(probe)) => probe.subscribe(),
            (None, None) => self.offline_changes.subscribe(),
        }
    }

    async fn run(&mut self, mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>) -> Result<Exit> {
        let mut api_changes = self.subscribe();
        let mut reconnect = tokio::time::interval(RECONNECT);
        reconnect.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut local_tick = tokio::time::interval(LOCAL_POLL);
        local_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut resync = tokio::time::interval(RESYNC);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut local = self.local.observe().await;
        let mut follow_ups = 0;
        // How many retries of a failed pass failed in turn: the step of the retry delay
        // (`None`: the last pass did not fail).
        let mut failed_retries: Option<u32> = None;
        // Whether this pass is the retry of a failed one (not a pass some event brought).
        let mut retrying = false;
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
                PassResult::Changed | PassResult::Settled => {
                    follow_ups = 0;
                    failed_retries = None;
                }
                PassResult::Failed => {
                    follow_ups = 0;
                    // Only a failed retry backs off further: the passes that events bring
                    // meanwhile (an outage brings several) would otherwise reach the
                    // resync's pace within seconds.
                    failed_retries = Some(match failed_retries {
                        Some(n) if retrying => n.saturating_add(1),
                        Some(n) => n,
                        None => 0,
                    });
                }
                PassResult::SelfGcComplete => {
                    // Nothing is left for a static copy to use them on, nor any timer to keep:
                    // an uninstalled node keeps no file of ours.
                    if let Err(e) = self.store.remove_credentials() {
                        warn!(error = %error_chain(&e), "cannot remove the kept API credentials");
                    }
                    if let Err(e) = self.store.remove_journal() {
                        warn!(error = %error_chain(&e), "cannot remove the state journal");
                    }
                    if let Err(e) = self.store.remove_empty_dirs() {
                        warn!(error = %error_chain(&e), "cannot remove the checkpoint dir's empty directories");
                    }
                    info!("self-GC complete: every checkpoint removed, this one last; exiting");
                    return Ok(Exit::Done);
                }
                PassResult::HandOver => return Ok(Exit::HandOver),
                PassResult::LockLost => return Ok(Exit::LockLost),
            }
            // Wait for the next reason to look again.
            let deadline = self.next_deadline.map(|t| {
                let wait = t.since(Timestamp::now());
                tokio::time::Instant::now() + wait
            });
            // Jittered: a fault shared by many nodes (a storage backend) must not bring their
            // retries in step.
            let retry = failed_retries
                .map(|n| tokio::time::Instant::now() + equal_jitter(nth_delay(RETRY_FIRST, RESYNC, n)));
            retrying = false;
            local = loop {
                tokio::select! {
                    biased;
                    () = &mut shutdown => {
                        info!("signal received; released the lock and exiting");
                        return Ok(Exit::Done);
                    }
                    changed = api_changes.changed() => {
                        if changed.is_err() {
                            return Err(Error::runtime("the API watch stopped", std::io::Error::other("watch channel closed")));
                        }
                        tokio::time::sleep(COALESCE).await;
                        api_changes.borrow_and_update();
                        break self.local.observe().await;
                    }
                    // The local view is the runtime's last answer (at most one poll old:
                    // a different answer would have run a pass), so timers cost no CRI call.
                    _ = resync.tick() => break self.latest_local().await,
                    _ = reconnect.tick(), if self.link.is_none() => {
                        if let Some(link) = connect::reconnect(&self.settings).await {
                            self.link = Some(link);
                            self.anonymous = None;
                            api_changes = self.subscribe();
                            break self.local.observe().await;
                        }
                    }
                    () = sleep_until(deadline) => break self.latest_local().await,
                    () = sleep_until(retry) => {
                        retrying = true;
                        break self.latest_local().await;
                    }
                    _ = local_tick.tick() => {
                        if !self.confirm_lock() {
                            return Ok(Exit::LockLost);
                        }
                        let observed = self.local.observe().await;
                        if self.last_local.as_ref() != Some(&observed) {
                            break observed;
                        }
                    }
                }
            };
        }
    }

    /// The last local view, as the runtime last answered, or a fresh one if there is none.
    async fn latest_local(&self) -> LocalView {
        match &self.last_local {
            Some(local) => local.clone(),
            None => self.local.observe().await,
        }
    }
}

impl Agent {
    /// Whether this copy still holds the lock (see [`LockGuard::confirm`]): `false` once
    /// the lock file was replaced while held and another process locks the new one.
    fn confirm_lock(&mut self) -> bool {
        let confirmed = self.guard.confirm();
        if confirmed.is_ok() && std::mem::take(&mut self.lock_unconfirmed) {
            info!("the lock can be checked again");
        }
        match confirmed {
            Ok(Confirmed::Held | Confirmed::Retaken) => true,
            Ok(Confirmed::Lost { holder }) => {
                error!(
                    lock = %self.guard.path().display(),
                    holder = holder.map(|h| h.to_string()).unwrap_or_default(),
                    "the lock file was replaced while this copy held it, and another process locks the new one: stepping down so that one copy acts"
                );
                false
            }
            Err(e) => {
                if !std::mem::replace(&mut self.lock_unconfirmed, true) {
                    warn!(error = %error_chain(&e), "cannot check the lock file; going on as its holder");
                }
                true
            }
        }
    }

    /// Follows how long the API server has rejected this copy's credentials, says so in
    /// the lock's holder record, and returns when to hand the lock over (`None` while
    /// they are accepted).
    fn credentials_rejected(&mut self, api: ckpt_core::ApiState, now: Timestamp) -> Option<Timestamp> {
        let rejected = api == ckpt_core::ApiState::Unauthorized;
        if rejected == self.unauthorized_since.is_some() {
            return self
                .unauthorized_since
                .map(|since| since.saturating_add(self.settings.unauthorized_handover));
        }
        self.unauthorized_since = rejected.then_some(now);
        let status = rejected.then(|| {
            format!(
                "api=unauthorized since {}: the API server rejects this copy's credentials (401) or forbids its pod reads (403)",
                now.to_rfc3339()
            )
        });
        if let Err(e) = self.guard.set_status(status.as_deref()) {
            debug!(error = %error_chain(&e), "cannot update the lock's holder record");
        }
        if rejected {
            warn!(
                handover_in_s = self.settings.unauthorized_handover.as_secs(),
                "the API server rejects this copy's credentials (401) or forbids its own reads (403 on every pod list or watch): nothing is activated or removed; the lock goes to the other copy if this lasts"
            );
        } else {
            info!("the API server accepts this copy's credentials again");
        }
        self.unauthorized_since
            .map(|since| since.saturating_add(self.settings.unauthorized_handover))
    }
}

/// The token file the kubelet API is called with: the pod's service-account token; without
/// one (the static copy: a static pod mounts no service-account token) the kept token of
/// the static copy's account, which the rendered RBAC lets read `/pods`, but only to a
/// kubelet whose certificate `--kubelet-ca` verifies. Without it a kubelet with webhook
/// authentication answered the static copy 401, its local view stayed unknown for as long
/// as it held the lock, and checkpoints it activated were never stopped (issue 36). The
/// kept token is read when it exists (the DaemonSet copy writes it, and renews it hourly).
fn kubelet_token(
    trust: &KubeletTrust,
    sa_token_exists: bool,
    sa_token: &std::path::Path,
    kept_token: &std::path::Path,
) -> Option<std::path::PathBuf> {
    if sa_token_exists {
        Some(sa_token.to_path_buf())
    } else {
        matches!(trust, KubeletTrust::Ca(_)).then(|| kept_token.to_path_buf())
    }
}

/// The kubelet `/pods` client: the service-account token, sent only to a kubelet whose
/// certificate `--kubelet-ca` verifies, or to any with `--kubelet-insecure` (the settings
/// refuse https with a token and neither).
fn kubelet_client(settings: &RunSettings) -> Result<KubeletClient> {
    let sa_token = std::path::Path::new(crate::config::SERVICE_ACCOUNT_TOKEN);
    let kept_token = settings.disk.layout().credentials_token_path();
    let token_file = kubelet_token(&settings.kubelet_trust, sa_token.exists(), sa_token, &kept_token);
    let (ca_file, insecure) = match &settings.kubelet_trust {
        KubeletTrust::Ca(path) => (Some(path.clone()), false),
        KubeletTrust::Unverified => (None, true),
    };
    KubeletClient::new(KubeletConfig {
        url: settings.kubelet_url.clone(),
        readonly_url: settings.kubelet_readonly_url.clone(),
        token_file,
        ca_file,
        insecure_skip_tls_verify: insecure,
        timeout: REQUEST_TIMEOUT,
    })
    .map_err(|e| match &settings.kubelet_trust {
        KubeletTrust::Ca(path) => Error::usage(format!("--kubelet-ca {}", path.display()), e),
        KubeletTrust::Unverified => Error::usage("--kubelet-url", e),
    })
}

enum PassResult {
    /// Nothing changed on disk: wait for the next reason to look.
    Settled,
    /// A step failed: wait for the next reason to look, or the retry (see [`RETRY_FIRST`]).
    Failed,
    /// The plan changed the disk and every step succeeded: plan again at once. Some
    /// steps wait for an earlier one to be on disk — a rolled pod supersedes the old
    /// checkpoint only once its own is written — and would otherwise wait for the resync.
    Changed,
    /// Self-GC removed everything: exit.
    SelfGcComplete,
    /// The credentials were rejected for too long: hand the lock over.
    HandOver,
    /// Another process locks the lock file now at the path: step down.
    LockLost,
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
