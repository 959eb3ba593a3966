//! The Secrets and ConfigMaps that checkpointed pods mount: one watch per object.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Debug};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ckpt_core::RequiredObjects;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::reflect::{Driver, SharedSlot, Slot, lock};

pub use ckpt_core::{ObjectKind, ObjectRef, ObjectsView};

enum Watched {
    Secret(SharedSlot<Secret>),
    ConfigMap(SharedSlot<ConfigMap>),
}

struct Entry {
    watched: Watched,
    task: JoinHandle<()>,
}

/// Watches individual Secrets and ConfigMaps by name (`fieldSelector=metadata.name=<name>`),
/// as the kubelet does, instead of caching every Secret of a namespace or re-fetching
/// them on a timer (bootkube GETs each one every 60 s).
///
/// Call [`ObjectWatch::ensure`] each pass with the union of what the namespace's
/// checkpointed pods need: watches start for new names and stop for names no longer
/// needed. A change of any watched object bumps the `notify` counter. RBAC: `list` and
/// `watch` on the resource in the namespace (which a Role may restrict to these names
/// with `resourceNames`). With `get` alone (bootkube's Role), each object is read by GET
/// every minute instead, as bootkube did, and its watch tried again every five minutes.
pub struct ObjectWatch {
    client: kube::Client,
    notify: watch::Sender<u64>,
    request_timeout: Duration,
    relist: Option<watch::Receiver<u64>>,
    gate: Option<watch::Receiver<bool>>,
    entries: Mutex<BTreeMap<(String, ObjectRef), Entry>>,
}

impl fmt::Debug for ObjectWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectWatch")
            .field("watched", &lock(&self.entries).keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl ObjectWatch {
    /// A watcher with nothing watched yet; changes bump `notify` (e.g.
    /// [`crate::ApiWatch::notifier`]). The initial list of each object must complete
    /// within 10 s, else it is retried (see [`ObjectWatch::with_request_timeout`]).
    pub fn new(client: kube::Client, notify: watch::Sender<u64>) -> Self {
        Self {
            client,
            notify,
            request_timeout: Duration::from_secs(10),
            relist: None,
            gate: None,
            entries: Mutex::new(BTreeMap::new()),
        }
    }

    /// Sets the deadline of each initial list.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Restarts every watch (a fresh list on a new connection) when `relist` is bumped,
    /// e.g. by [`crate::ApiWatch::relists`].
    pub fn with_relists(mut self, relist: watch::Receiver<u64>) -> Self {
        self.relist = Some(relist);
        self
    }

    /// Stops every watch while `gate` is down and restarts it (a fresh list) when it is up
    /// again, e.g. [`crate::ApiWatch::gate`]: while the API server is unreachable a watch
    /// would only add its own retries to the probe's, and a fleet's would all meet the
    /// server when it returns. A watch whose gate's sender is gone stops for good.
    pub fn with_gate(mut self, gate: watch::Receiver<bool>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Makes the watched set of `namespace` exactly `required`: starts watches for new
    /// names, stops those no longer listed.
    ///
    /// # Panics
    /// Outside a Tokio runtime when a watch must be started.
    pub fn ensure(&self, namespace: &str, required: &RequiredObjects) {
        let wanted: BTreeSet<ObjectRef> = ObjectRef::all(required).collect();
        let mut entries = lock(&self.entries);
        entries.retain(|(ns, r), entry| {
            let keep = ns != namespace || wanted.contains(r);
            if !keep {
                debug!(namespace = %ns, object = %r, "no longer needed: watch stopped");
                entry.task.abort();
            }
            keep
        });
        for r in wanted {
            let key = (namespace.to_owned(), r);
            if entries.contains_key(&key) {
                continue;
            }
            let entry = self.start(namespace, &key.1);
            entries.insert(key, entry);
        }
    }

    /// Like [`ObjectWatch::ensure`] for every namespace at once: namespaces missing from
    /// `required` stop all their watches.
    pub fn ensure_all(&self, required: &BTreeMap<String, RequiredObjects>) {
        let stale: BTreeSet<String> = lock(&self.entries)
            .keys()
            .map(|(ns, _)| ns.clone())
            .filter(|ns| !required.contains_key(ns))
            .collect();
        for ns in stale {
            self.ensure(&ns, &RequiredObjects::default());
        }
        for (ns, req) in required {
            self.ensure(ns, req);
        }
    }

    /// What is known about the watched objects of `namespace`.
    pub fn objects(&self, namespace: &str) -> ObjectsView {
        let entries = lock(&self.entries);
        let mut view = ObjectsView::default();
        for ((ns, r), entry) in entries.iter() {
            if ns != namespace {
                continue;
            }
            let (known, error) = match &entry.watched {
                Watched::Secret(slot) => read_slot(slot, &r.name, &mut view.objects.secrets),
                Watched::ConfigMap(slot) => read_slot(slot, &r.name, &mut view.objects.config_maps),
            };
            let present = match r.kind {
                ObjectKind::Secret => view.objects.secrets.contains_key(&r.name),
                ObjectKind::ConfigMap => view.objects.config_maps.contains_key(&r.name),
            };
            match (known, error) {
                (true, _) if !present => {
                    view.absent.insert(r.clone());
                }
                (true, _) => {}
                (false, Some(why)) => {
                    view.failed.insert(r.clone(), why);
                }
                (false, None) => {
                    view.loading.insert(r.clone());
                }
            }
        }
        view
    }

    /// Stops all watches (same as dropping).
    pub fn shutdown(self) {}

    fn start(&self, namespace: &str, r: &ObjectRef) -> Entry {
        match r.kind {
            ObjectKind::Secret => self.start_typed(namespace, r, Watched::Secret),
            ObjectKind::ConfigMap => self.start_typed(namespace, r, Watched::ConfigMap),
        }
    }

    /// Starts the watch of one object of kind `K`; `watched` wraps its slot.
    fn start_typed<K>(&self, namespace: &str, r: &ObjectRef, watched: fn(SharedSlot<K>) -> Watched) -> Entry
    where
        K: Resource<Scope = NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + Sync
            + 'static,
        K::DynamicType: Default,
    {
        let notify = self.notify.clone();
        let on_change: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            notify.send_modify(|n| *n = n.wrapping_add(1));
        });
        let config = watcher::Config::default().fields(&format!("metadata.name={}", r.name));
        let what = format!("{} {namespace}/{}", r.kind.resource(), r.name);
        let rbac_hint = format!("get/list/watch on {} in namespace {namespace}", r.kind.resource());
        debug!(%namespace, object = %r, "watch started");
        let slot: SharedSlot<K> = Arc::new(Mutex::new(Slot::default()));
        let driver = Driver {
            api: Api::<K>::namespaced(self.client.clone(), namespace),
            config,
            slot: Arc::clone(&slot),
            on_change,
            request_timeout: self.request_timeout,
            gate: self.gate.clone(),
            gate_check: None,
            relist: self.relist.clone(),
            what,
            rbac_hint,
            modify: |o: &mut K| o.meta_mut().managed_fields = None,
            get_fallback: Some(r.name.clone()),
        };
        Entry {
            watched: watched(slot),
            task: tokio::spawn(driver.run()),
        }
    }
}

/// Copies the object `name` from a watch's slot into `into` once the watch has listed
/// (the slot keeps the last complete view); returns whether it has, and its problem.
fn read_slot<K>(
    slot: &SharedSlot<K>,
    name: &str,
    into: &mut BTreeMap<String, Arc<K>>,
) -> (bool, Option<String>) {
    let slot = lock(slot);
    if let Some(obj) = slot.known.then(|| slot.objects.get(name)).flatten() {
        into.insert(name.to_owned(), Arc::clone(obj));
    }
    (slot.known, slot.error.clone())
}

impl Drop for ObjectWatch {
    fn drop(&mut self) {
        for entry in lock(&self.entries).values() {
            entry.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testkit::{FakeApi, Reply, wait_until};

    fn secret(name: &str, value: &str, rv: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": name, "namespace": "ks", "resourceVersion": rv},
               "data": {"key": value}})
    }

    /// The `key` of the Secret `name` in `view`, if it is there.
    fn secret_key(view: &ObjectsView, name: &str) -> Option<Vec<u8>> {
        Some(
            view.objects
                .secrets
                .get(name)?
                .data
                .as_ref()?
                .get("key")?
                .0
                .clone(),
        )
    }

    fn required(secrets: &[&str], config_maps: &[&str]) -> RequiredObjects {
        RequiredObjects {
            secrets: secrets.iter().map(|s| (*s).to_owned()).collect(),
            config_maps: config_maps.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[tokio::test]
    async fn watches_each_object_reports_absent_and_forbidden_and_follows_changes() {
        let (client, fake, _server) = FakeApi::start();
        fake.set_objects(
            "secrets",
            "ks",
            vec![secret("tls", "b25l", "5"), secret("unrelated", "eA==", "6")],
        );
        fake.set_list("configmaps", "ks", Reply::Status(403));
        fake.set_object_get("configmaps", "ks", Reply::Status(403));
        let (notify, _) = watch::channel(0);
        let mut rx = notify.subscribe();
        let objects = ObjectWatch::new(client, notify);
        let need = required(&["tls", "missing"], &["cfg"]);
        objects.ensure("ks", &need);
        assert_eq!(
            objects.objects("ks").unresolved(&need).len(),
            3,
            "all loading at first"
        );

        wait_until(5, "every object resolved or failed", rx.clone(), || {
            let v = objects.objects("ks");
            v.loading.is_empty()
        })
        .await;
        let view = objects.objects("ks");
        assert_eq!(view.objects.secrets.keys().collect::<Vec<_>>(), ["tls"]);
        assert!(view.absent.contains(&ObjectRef::secret("missing")), "{view:?}");
        let why = &view.failed[&ObjectRef::config_map("cfg")];
        assert!(
            why.starts_with("forbidden: needs get/list/watch on configmaps in namespace ks"),
            "{why}"
        );
        assert_eq!(
            view.unresolved(&need),
            vec![(ObjectRef::config_map("cfg"), why.clone())]
        );
        assert_eq!(
            view.unresolved(&required(&["other"], &[])),
            vec![(ObjectRef::secret("other"), "not watched".to_owned())]
        );
        // One watch per name, by field selector; nothing else of the namespace is cached.
        for s in fake
            .log()
            .iter()
            .filter(|s| s.path == "/api/v1/namespaces/ks/secrets")
        {
            assert!(
                s.query.contains("fieldSelector=metadata.name%3Dtls")
                    || s.query.contains("fieldSelector=metadata.name%3Dmissing"),
                "{s:?}"
            );
        }
        assert!(objects.objects("other-ns").objects.secrets.is_empty());

        // A change arrives by watch, and notifies.
        fake.wait_requests(1, "the secret's watch", |s| {
            s.is_watch() && s.query.contains("metadata.name%3Dtls")
        })
        .await;
        rx.borrow_and_update();
        assert_eq!(
            fake.push_event("secrets", "ks", "MODIFIED", &secret("tls", "dHdv", "7")),
            1
        );
        wait_until(5, "the new content", rx.clone(), || {
            secret_key(&objects.objects("ks"), "tls").as_deref() == Some(b"two".as_slice())
        })
        .await;
        assert!(rx.has_changed().unwrap() || *rx.borrow() > 0);
        // The missing secret is created.
        assert_eq!(
            fake.push_event("secrets", "ks", "ADDED", &secret("missing", "eA==", "8")),
            1
        );
        wait_until(5, "the created secret", rx.clone(), || {
            objects.objects("ks").objects.secrets.contains_key("missing")
        })
        .await;

        // No longer needed: watches stop, the view is empty.
        let lists_before = fake.count(|s| !s.is_watch());
        objects.ensure("ks", &RequiredObjects::default());
        let view = objects.objects("ks");
        assert!(view.objects.secrets.is_empty() && view.failed.is_empty() && view.absent.is_empty());
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(
            fake.count(|s| !s.is_watch()),
            lists_before,
            "the failing configmap watch stopped retrying"
        );
    }

    /// bootkube's Role: `get` on Secrets, no `list` or `watch`.
    #[tokio::test]
    async fn an_object_that_cannot_be_listed_is_read_by_get() {
        let (client, fake, _server) = FakeApi::start();
        fake.set_objects("secrets", "ks", vec![secret("tls", "b25l", "5")]);
        fake.set_list("secrets", "ks", Reply::Status(403));
        let (notify, _) = watch::channel(0);
        let (relist_tx, relist_rx) = watch::channel(0u64);
        let rx = notify.subscribe();
        let objects = ObjectWatch::new(client, notify).with_relists(relist_rx);
        let need = required(&["tls", "missing"], &[]);
        objects.ensure("ks", &need);
        wait_until(5, "both read by GET", rx.clone(), || {
            let v = objects.objects("ks");
            v.loading.is_empty() && v.failed.is_empty()
        })
        .await;
        let view = objects.objects("ks");
        assert_eq!(secret_key(&view, "tls").as_deref(), Some(b"one".as_slice()));
        assert!(view.absent.contains(&ObjectRef::secret("missing")), "{view:?}");
        assert!(view.unresolved(&need).is_empty(), "{view:?}");
        let gets = |fake: &FakeApi| {
            fake.count(|s| s.path.starts_with("/api/v1/namespaces/ks/secrets/") && !s.is_watch())
        };
        assert_eq!(gets(&fake), 2, "{:#?}", fake.log());
        assert_eq!(fake.count(|s| s.is_watch()), 0, "no watch after a forbidden list");

        // The next read (here at once, by a relist signal; else within a minute) sees a
        // change and notifies.
        fake.set_objects("secrets", "ks", vec![secret("tls", "dHdv", "9")]);
        relist_tx.send_modify(|n| *n += 1);
        wait_until(5, "the new content", rx.clone(), || {
            secret_key(&objects.objects("ks"), "tls").as_deref() == Some(b"two".as_slice())
        })
        .await;

        // A GET that fails keeps the last value, as a failed watch keeps its last list (a
        // GET forbidden from the start is the first test's ConfigMap).
        let before = gets(&fake);
        fake.set_object_get("secrets", "ks", Reply::Status(500));
        relist_tx.send_modify(|n| *n += 1);
        fake.wait_requests(before + 2, "the failed GETs", |s| {
            s.path.starts_with("/api/v1/namespaces/ks/secrets/")
        })
        .await;
        let view = objects.objects("ks");
        assert_eq!(secret_key(&view, "tls").as_deref(), Some(b"two".as_slice()));
        assert!(view.unresolved(&need).is_empty(), "{view:?}");
    }

    #[tokio::test]
    async fn ensure_all_stops_namespaces_that_need_nothing() {
        let (client, _fake, _server) = FakeApi::start();
        let (notify, _) = watch::channel(0);
        let objects = ObjectWatch::new(client, notify).with_request_timeout(Duration::from_secs(1));
        objects.ensure("a", &required(&["s"], &[]));
        objects.ensure("b", &required(&[], &["c"]));
        objects.ensure_all(&BTreeMap::from([("b".to_owned(), required(&[], &["c"]))]));
        assert!(objects.objects("a").loading.is_empty());
        assert_eq!(
            objects.objects("b").loading.len() + objects.objects("b").absent.len(),
            1
        );
    }
}
