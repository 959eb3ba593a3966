//! Sanitization: an API pod plus the Secrets/ConfigMaps it uses → a [`Checkpoint`].
//!
//! Keeps bootkube's rules (metadata reduced to name, namespace, labels, our annotations
//! and one owner reference to the parent; status, service account, affinity and node
//! selector cleared; secret/configMap volumes become hostPath directories) and makes the
//! result acceptable to kubelets ≥1.34, which refuse static pods that reference API
//! objects (see [`references_api_objects`]), and to a kubelet that runs the parent too
//! (a host-network checkpoint declares no host ports).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeFile, EnvVar, HTTPGetAction, HostPathVolumeSource, KeyToPath, Pod,
    PodSpec, Secret, TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;

use crate::checkpoint::{Checkpoint, DataDir, DataFile, DataKind, FileOwner, MaterializedDir, sha256_hex};
use crate::error::{Error, Result};
use crate::identity::{
    ANNOTATION_CHECKPOINT_OF, ANNOTATION_CHECKPOINTED_AT, ANNOTATION_HANDOFF, ANNOTATION_OWNER,
    ANNOTATION_PARENT_UID, ANNOTATION_SPEC_HASH, ControllerOwner, HANDOFF_WHEN_READY, PodId, is_dns_label,
    is_dns_subdomain, retires_when_ready,
};
use crate::references::references_api_objects;
use crate::time::Timestamp;

/// File mode when the pod sets neither `defaultMode` nor `items[].mode`. (The API server
/// defaults `defaultMode` to 0644 on every pod it stores, so this only applies to pods
/// that did not come through it; we choose the private default.)
pub(crate) const DEFAULT_FILE_MODE: u32 = 0o600;

/// The Secrets and ConfigMaps of the pod's namespace, by name, as fetched from the API.
/// Shared (`Arc`), not owned: every pass hands the watched objects to the planner, and a
/// copy of each (up to a MiB apiece) per pass and per pod would cost more than the rest
/// of the pass.
#[derive(Clone, Debug, Default)]
pub struct ApiObjects {
    /// Secrets by name.
    pub secrets: BTreeMap<String, Arc<Secret>>,
    /// ConfigMaps by name.
    pub config_maps: BTreeMap<String, Arc<ConfigMap>>,
}

/// Settings for [`sanitize`].
#[derive(Clone, Debug)]
pub struct SanitizeOptions {
    /// `--checkpoint-dir`: the hostPath volumes point below it.
    pub checkpoint_dir: String,
    /// When this content is checkpointed; callers pass the stored time when the spec hash
    /// is unchanged, so an unchanged pod gives byte-identical output.
    pub checkpointed_at: Timestamp,
}

/// The result of [`sanitize`]: the checkpoint, and what the operator should know about
/// how it differs from the parent.
#[derive(Clone, Debug, PartialEq)]
pub struct Sanitized {
    /// The checkpoint.
    pub checkpoint: Checkpoint,
    /// Deliberate differences worth a log line (a dropped service-account token, …).
    pub warnings: Vec<String>,
    /// The content split by how the parent's containers see it: what proves it differs
    /// (ARCHITECTURE.md, Known-good content).
    pub parts: ContentParts,
}

/// A checkpoint's content in two parts, each with its own hash; the spec hash covers both.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContentParts {
    /// What a container reads when it starts: the sanitized spec (resolved `env` and
    /// `envFrom` included) and the data of volumes mounted with `subPath`/`subPathExpr` or
    /// by an init container. A running container never sees a change to it.
    pub read_at_start: String,
    /// What the kubelet updates in place in a running pod: the data of Secret, ConfigMap
    /// and projected volumes mounted only by containers and only without `subPath`.
    pub updated_in_place: String,
}

/// Sanitizes a parent pod into a checkpoint. Pure and deterministic: the same inputs give
/// a byte-identical manifest. Fails, naming the field, for a pod that cannot be a static
/// pod; never returns a half-working checkpoint.
pub fn sanitize(pod: &Pod, objects: &ApiObjects, options: &SanitizeOptions) -> Result<Sanitized> {
    let id = PodId::of(pod).ok_or(Error::MissingName)?;
    // The API server guarantees these; they become path components of the checkpoint's
    // data, so a pod from anywhere else is checked here too (found by the fuzz run).
    for (field, what, value, valid) in [
        (
            "metadata.namespace",
            "namespace",
            &*id.namespace,
            is_dns_label(&id.namespace),
        ),
        ("metadata.name", "pod name", &*id.name, is_dns_subdomain(&id.name)),
    ] {
        if !valid {
            return Err(Error::Invalid {
                field: field.into(),
                what,
                value: value.to_owned(),
            });
        }
    }
    let mut spec = pod.spec.clone().ok_or_else(|| Error::Unrepresentable {
        field: "spec".into(),
        reason: "the pod has no spec".into(),
    })?;
    let mut cx = Sanitizer {
        id: &id,
        pod,
        objects,
        options,
        dirs: BTreeMap::new(),
        materialized_volumes: BTreeMap::new(),
        group_read: spec
            .security_context
            .as_ref()
            .is_some_and(|s| s.fs_group.is_some()),
        warnings: Vec::new(),
        secrets_in_manifest: false,
    };

    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err(Error::Unrepresentable {
            field: "spec.resourceClaims".into(),
            reason: "resource claims need the API server".into(),
        });
    }
    let owner = file_owner(&spec, &mut cx.warnings);
    if let Some(volumes) = spec.volumes.as_mut() {
        for (i, volume) in volumes.iter_mut().enumerate() {
            cx.volume(i, volume)?;
        }
    }
    for (list, containers) in [
        ("initContainers", spec.init_containers.as_mut()),
        ("containers", Some(&mut spec.containers)),
    ] {
        for (i, c) in containers.into_iter().flatten().enumerate() {
            cx.container(&format!("spec.{list}[{i}]"), c)?;
            // Read-only like the kubelet's own secret/configMap/projected mounts: the
            // data is the checkpoint's, and the pod must not change it for its next run.
            for mount in c.volume_mounts.iter_mut().flatten() {
                if cx.materialized_volumes.contains_key(&mount.name) {
                    mount.read_only = Some(true);
                }
            }
        }
    }
    strip_spec(&mut spec);

    let mut annotations = BTreeMap::from([(ANNOTATION_CHECKPOINT_OF.to_owned(), id.name.to_string())]);
    if let Some(uid) = pod.metadata.uid.as_ref().filter(|u| !u.is_empty()) {
        annotations.insert(ANNOTATION_PARENT_UID.to_owned(), uid.clone());
    }
    if let Some(owner) = ControllerOwner::of(pod) {
        annotations.insert(ANNOTATION_OWNER.to_owned(), owner.to_annotation());
    }
    // Kept with the checkpoint: it decides the handoff while the API server is down too.
    if retires_when_ready(pod) {
        annotations.insert(ANNOTATION_HANDOFF.to_owned(), HANDOFF_WHEN_READY.to_owned());
    }
    let mut manifest = Pod {
        metadata: ObjectMeta {
            name: Some(id.name.to_string()),
            namespace: Some(id.namespace.to_string()),
            labels: pod.metadata.labels.clone().filter(|l| !l.is_empty()),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: id.name.to_string(),
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    };

    if let Some(reference) = references_api_objects(&manifest).into_iter().next() {
        // A volume type we do not know how to convert, left as it was.
        return Err(Error::Unrepresentable {
            field: reference,
            reason: "static pods may not reference API objects".into(),
        });
    }

    let (dirs, warnings, manifest_holds_secrets) = (cx.dirs, cx.warnings, cx.secrets_in_manifest);
    let dirs: Vec<MaterializedDir> = dirs.into_values().collect();
    let spec_hash = spec_hash(&manifest, &dirs, owner);
    let parts = content_parts(&manifest, &dirs, &cx.materialized_volumes, owner);
    let annotations = manifest.metadata.annotations.get_or_insert_default();
    annotations.insert(ANNOTATION_SPEC_HASH.to_owned(), spec_hash.clone());
    annotations.insert(
        ANNOTATION_CHECKPOINTED_AT.to_owned(),
        options.checkpointed_at.to_rfc3339(),
    );
    Ok(Sanitized {
        checkpoint: Checkpoint {
            parent: id,
            manifest,
            dirs,
            owner,
            manifest_holds_secrets,
            spec_hash,
        },
        warnings,
        parts,
    })
}

/// Splits the content hashed by [`spec_hash`] into [`ContentParts`]. A directory shared by
/// a volume read at start and one updated in place counts as read at start: a change to it
/// needs a restart to be proven.
fn content_parts(
    manifest: &Pod,
    dirs: &[MaterializedDir],
    volume_dirs: &BTreeMap<String, DataDir>,
    owner: FileOwner,
) -> ContentParts {
    let Some(spec) = manifest.spec.as_ref() else {
        return ContentParts::default();
    };
    fn mounts(containers: &[Container]) -> impl Iterator<Item = &VolumeMount> {
        containers.iter().flat_map(|c| c.volume_mounts.iter().flatten())
    }
    let has_sub_path = |m: &&VolumeMount| {
        let set = |p: &Option<String>| p.as_ref().is_some_and(|p| !p.is_empty());
        set(&m.sub_path) || set(&m.sub_path_expr)
    };
    // The kubelet bind-mounts a subPath once, at start; an init container reads what it
    // reads before the pod runs, once.
    let read_at_start: BTreeSet<&DataDir> = (mounts(spec.init_containers.as_deref().unwrap_or_default()))
        .chain(mounts(&spec.containers).filter(has_sub_path))
        .filter_map(|m| volume_dirs.get(&m.name))
        .collect();
    let (at_start, in_place): (Vec<MaterializedDir>, Vec<MaterializedDir>) =
        (dirs.iter().cloned()).partition(|d| read_at_start.contains(&d.dir));
    // Serializing plain values cannot fail (as in `spec_hash`).
    let in_place_bytes = serde_json::to_vec(&in_place).unwrap_or_default();
    ContentParts {
        read_at_start: spec_hash(manifest, &at_start, owner),
        updated_in_place: sha256_hex(&in_place_bytes),
    }
}

/// Hash over everything that would be written, except the checkpoint time.
fn spec_hash(manifest: &Pod, dirs: &[MaterializedDir], owner: FileOwner) -> String {
    #[derive(Serialize)]
    struct Hashed<'a> {
        manifest: &'a Pod,
        dirs: &'a [MaterializedDir],
        owner: FileOwner,
    }
    // Serializing these plain values cannot fail; an empty input would only make the
    // hash less useful, never wrong in a way that loses data.
    let bytes = serde_json::to_vec(&Hashed {
        manifest,
        dirs,
        owner,
    })
    .unwrap_or_default();
    sha256_hex(&bytes)
}

/// Pod-level rules: nothing that needs the API server or the scheduler, nothing that
/// needs a registry when the node restarts offline.
fn strip_spec(spec: &mut PodSpec) {
    spec.service_account_name = None;
    spec.service_account = None;
    spec.automount_service_account_token = Some(false);
    spec.image_pull_secrets = None;
    spec.affinity = None;
    spec.node_selector = None;
    spec.node_name = None;
    spec.scheduling_gates = None;
    spec.ephemeral_containers = None;
    for c in spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
    {
        if c.image_pull_policy.as_deref() == Some("Always") {
            c.image_pull_policy = Some("IfNotPresent".into());
        }
        if spec.host_network == Some(true) {
            drop_host_ports(c);
        }
    }
}

/// A host-network container's `ports` claim host ports (defaulting sets `hostPort` to
/// `containerPort`), and the kubelet refuses a static pod whose host ports an admitted pod
/// already claims (its `NodePorts` admission). The agent's own static copy always runs
/// beside its DaemonSet copy, and a checkpoint may start while its parent is still
/// admitted: so a host-network checkpoint declares no ports. They are declarations only
/// (the process binds what it binds); named ports in probes and lifecycle handlers are
/// resolved to their numbers first, as the kubelet would resolve them.
fn drop_host_ports(c: &mut Container) {
    let Some(ports) = c.ports.take() else {
        return;
    };
    let number = |port: &mut IntOrString| {
        if let IntOrString::String(name) = port
            && let Some(p) = ports.iter().find(|p| p.name.as_deref() == Some(name.as_str()))
        {
            *port = IntOrString::Int(p.container_port);
        }
    };
    let resolve = |http: Option<&mut HTTPGetAction>, tcp: Option<&mut TCPSocketAction>| {
        if let Some(h) = http {
            number(&mut h.port);
        }
        if let Some(t) = tcp {
            number(&mut t.port);
        }
    };
    for probe in [
        &mut c.liveness_probe,
        &mut c.readiness_probe,
        &mut c.startup_probe,
    ]
    .into_iter()
    .flatten()
    {
        resolve(probe.http_get.as_mut(), probe.tcp_socket.as_mut());
    }
    if let Some(lifecycle) = c.lifecycle.as_mut() {
        for handler in [&mut lifecycle.post_start, &mut lifecycle.pre_stop]
            .into_iter()
            .flatten()
        {
            resolve(handler.http_get.as_mut(), handler.tcp_socket.as_mut());
        }
    }
}

/// Owner of the materialized files: bootkube's rule (`runAsUser`, overridden per
/// container; `fsGroup` for the group), over the containers that mount a materialized
/// volume, init containers included. Containers that disagree get root ownership with
/// `fsGroup` as group — what the kubelet itself does for secret volumes — and a warning,
/// instead of bootkube's silent "no secrets at all".
fn file_owner(spec: &PodSpec, warnings: &mut Vec<String>) -> FileOwner {
    let pod_sc = spec.security_context.as_ref();
    let gid = pod_sc
        .and_then(|s| s.fs_group)
        .and_then(|g| u32::try_from(g).ok())
        .unwrap_or(0);
    let materialized: Vec<&str> = spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.secret.is_some() || v.config_map.is_some() || needs_materializing(v))
        .map(|v| v.name.as_str())
        .collect();
    let pod_uid = pod_sc.and_then(|s| s.run_as_user);
    let mut uids = BTreeMap::<i64, Vec<&str>>::new();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        let mounts = c.volume_mounts.iter().flatten();
        if !mounts.clone().any(|m| materialized.contains(&m.name.as_str())) {
            continue;
        }
        let uid = c
            .security_context
            .as_ref()
            .and_then(|s| s.run_as_user)
            .or(pod_uid)
            .unwrap_or(0);
        uids.entry(uid).or_default().push(c.name.as_str());
    }
    let uid = match uids.len() {
        0 => pod_uid.unwrap_or(0),
        1 => uids.keys().next().copied().unwrap_or(0),
        _ => {
            let who: Vec<String> = uids
                .iter()
                .map(|(uid, names)| format!("{} as {uid}", names.join(",")))
                .collect();
            warnings.push(format!(
                "containers run as different users ({}); checkpointed secrets and configmaps are owned by uid 0, gid {gid}",
                who.join("; ")
            ));
            0
        }
    };
    FileOwner {
        uid: u32::try_from(uid).unwrap_or(0),
        gid,
    }
}

/// A projected volume with any source besides downwardAPI needs its files written.
fn needs_materializing(v: &Volume) -> bool {
    v.projected
        .as_ref()
        .is_some_and(|p| p.sources.iter().flatten().any(|s| s.downward_api.is_none()))
}

struct Sanitizer<'a> {
    id: &'a PodId,
    pod: &'a Pod,
    objects: &'a ApiObjects,
    options: &'a SanitizeOptions,
    dirs: BTreeMap<DataDir, MaterializedDir>,
    /// Volumes that became hostPath directories of ours (mounted read-only), with the
    /// directory each holds.
    materialized_volumes: BTreeMap<String, DataDir>,
    /// The pod sets `fsGroup`: files get group read, as the kubelet adds it.
    group_read: bool,
    warnings: Vec<String>,
    secrets_in_manifest: bool,
}

/// Where a key's bytes come from.
#[derive(Clone, Copy)]
enum Source<'a> {
    Secret(&'a Secret),
    ConfigMap(&'a ConfigMap),
}

impl Source<'_> {
    fn kind(self) -> &'static str {
        match self {
            Source::Secret(_) => "Secret",
            Source::ConfigMap(_) => "ConfigMap",
        }
    }

    /// Every key and its bytes, sorted (configMap `data` and `binaryData` together).
    fn all(self) -> Vec<(String, Vec<u8>)> {
        match self {
            Source::Secret(s) => s
                .data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect(),
            Source::ConfigMap(cm) => {
                let text = cm
                    .data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()));
                let binary = cm
                    .binary_data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.0.clone()));
                let mut all: Vec<_> = text.chain(binary).collect();
                all.sort();
                all
            }
        }
    }

    /// The keys the kubelet turns into environment variables, sorted: a Secret's `data`,
    /// a ConfigMap's `data` only (never `binaryData`).
    fn env_all(self) -> Vec<(String, Vec<u8>)> {
        match self {
            Source::Secret(_) => self.all(),
            Source::ConfigMap(cm) => cm
                .data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
                .collect(),
        }
    }

    /// One key as the kubelet reads it for `env[].valueFrom` (`data` only, like
    /// [`Source::env_all`]).
    fn env_get(self, key: &str) -> Option<Vec<u8>> {
        match self {
            Source::Secret(_) => self.get(key),
            Source::ConfigMap(cm) => cm.data.as_ref()?.get(key).map(|v| v.as_bytes().to_vec()),
        }
    }

    fn get(self, key: &str) -> Option<Vec<u8>> {
        match self {
            Source::Secret(s) => s.data.as_ref()?.get(key).map(|v| v.0.clone()),
            Source::ConfigMap(cm) => cm
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|v| v.as_bytes().to_vec())
                .or_else(|| cm.binary_data.as_ref()?.get(key).map(|v| v.0.clone())),
        }
    }
}

impl<'a> Sanitizer<'a> {
    /// Looks up a Secret/ConfigMap; `Ok(None)` when missing and optional.
    fn source(&self, field: &str, kind: DataKind, name: &str, optional: bool) -> Result<Option<Source<'a>>> {
        let found = match kind {
            DataKind::Secret => self.objects.secrets.get(name).map(|s| Source::Secret(s)),
            _ => self.objects.config_maps.get(name).map(|c| Source::ConfigMap(c)),
        };
        match found {
            Some(s) => Ok(Some(s)),
            None if optional => Ok(None),
            None => Err(Error::MissingObject {
                field: field.to_owned(),
                kind: if kind == DataKind::Secret {
                    "Secret"
                } else {
                    "ConfigMap"
                },
                name: name.to_owned(),
            }),
        }
    }

    fn volume(&mut self, i: usize, volume: &mut Volume) -> Result<()> {
        let field = format!("spec.volumes[{i}] ({})", volume.name);
        // A volume's name names its data dir.
        if !is_dns_label(&volume.name) {
            return Err(Error::Invalid {
                field: format!("spec.volumes[{i}].name"),
                what: "volume name",
                value: volume.name.clone(),
            });
        }
        let refuse = |reason: &str| {
            Err(Error::Unrepresentable {
                field: field.clone(),
                reason: reason.to_owned(),
            })
        };
        if volume.persistent_volume_claim.is_some() || volume.ephemeral.is_some() {
            return refuse("a persistentVolumeClaim needs the API server to bind and attach");
        }
        if volume.csi.is_some() {
            return refuse("CSI volumes need the CSIDriver object from the API server");
        }
        if volume.glusterfs.is_some() {
            return refuse("glusterfs volumes need an Endpoints object from the API server");
        }
        if volume.azure_file.is_some() || volume.scale_io.is_some() {
            return refuse("the volume needs a Secret for its credentials");
        }
        let secret_ref = volume.cephfs.as_ref().is_some_and(|s| s.secret_ref.is_some())
            || volume.cinder.as_ref().is_some_and(|s| s.secret_ref.is_some())
            || volume
                .flex_volume
                .as_ref()
                .is_some_and(|s| s.secret_ref.is_some())
            || volume.iscsi.as_ref().is_some_and(|s| s.secret_ref.is_some())
            || volume.rbd.as_ref().is_some_and(|s| s.secret_ref.is_some())
            || volume.storageos.as_ref().is_some_and(|s| s.secret_ref.is_some());
        if secret_ref {
            return refuse("the volume's secretRef needs a Secret from the API server");
        }

        let dir = if let Some(secret) = volume.secret.take() {
            let Some(name) = secret.secret_name.filter(|n| !n.is_empty()) else {
                return refuse("secret volume without secretName");
            };
            let default_mode = mode(&field, secret.default_mode)?;
            let optional = secret.optional.unwrap_or(false);
            let source = self.source(&field, DataKind::Secret, &name, optional)?;
            let files = self.files(&field, source, secret.items.as_deref(), default_mode, optional)?;
            self.place(&field, DataKind::Secret, &name, &volume.name, files)?
        } else if let Some(cm) = volume.config_map.take() {
            let default_mode = mode(&field, cm.default_mode)?;
            let optional = cm.optional.unwrap_or(false);
            let source = self.source(&field, DataKind::ConfigMap, &cm.name, optional)?;
            let files = self.files(&field, source, cm.items.as_deref(), default_mode, optional)?;
            self.place(&field, DataKind::ConfigMap, &cm.name, &volume.name, files)?
        } else if volume
            .projected
            .as_ref()
            .is_some_and(|_| needs_materializing(volume))
        {
            let Some(projected) = volume.projected.take() else {
                return Ok(());
            };
            let default_mode = mode(&field, projected.default_mode)?;
            let mut files = Vec::new();
            for (j, s) in projected.sources.iter().flatten().enumerate() {
                let field = format!("{field}.projected.sources[{j}]");
                if let Some(secret) = &s.secret {
                    let optional = secret.optional.unwrap_or(false);
                    let source = self.source(&field, DataKind::Secret, &secret.name, optional)?;
                    files.extend(self.files(
                        &field,
                        source,
                        secret.items.as_deref(),
                        default_mode,
                        optional,
                    )?);
                } else if let Some(cm) = &s.config_map {
                    let optional = cm.optional.unwrap_or(false);
                    let source = self.source(&field, DataKind::ConfigMap, &cm.name, optional)?;
                    files.extend(self.files(&field, source, cm.items.as_deref(), default_mode, optional)?);
                } else if let Some(downward) = &s.downward_api {
                    for (k, item) in downward.items.iter().flatten().enumerate() {
                        files.push(self.downward_file(
                            &format!("{field}.downwardAPI.items[{k}]"),
                            item,
                            default_mode,
                        )?);
                    }
                } else if let Some(token) = &s.service_account_token {
                    self.warnings.push(format!(
                        "{field}: dropped the service account token {:?}; the checkpoint runs without API credentials",
                        token.path
                    ));
                } else {
                    return Err(Error::Unrepresentable {
                        field,
                        reason: "this projected source needs the API server".into(),
                    });
                }
            }
            files.sort_by(|a, b| a.path.cmp(&b.path));
            if let Some(w) = files.windows(2).find(|w| w[0].path == w[1].path) {
                return Err(Error::Invalid {
                    field,
                    what: "duplicate path",
                    value: w[0].path.clone(),
                });
            }
            self.place(&field, DataKind::Projected, &volume.name, &volume.name, files)?
        } else {
            return Ok(());
        };
        let path = format!(
            "{}/{}",
            self.options.checkpoint_dir.trim_end_matches('/'),
            dir.relative_path().display()
        );
        // `type: Directory`: a checkpoint whose data directory is missing must fail to
        // start (the kubelet reports it) instead of running with an empty directory the
        // runtime created, which would look like a pod without its certificates.
        volume.host_path = Some(HostPathVolumeSource {
            path,
            type_: Some("Directory".into()),
        });
        self.materialized_volumes.insert(volume.name.clone(), dir);
        Ok(())
    }

    /// Files of one Secret/ConfigMap source, honouring `items`, modes and `optional`.
    fn files(
        &self,
        field: &str,
        source: Option<Source<'_>>,
        items: Option<&[KeyToPath]>,
        default_mode: u32,
        optional: bool,
    ) -> Result<Vec<DataFile>> {
        let Some(source) = source else {
            return Ok(Vec::new());
        };
        let mut files = Vec::new();
        match items {
            Some(items) if !items.is_empty() => {
                for (k, item) in items.iter().enumerate() {
                    let field = format!("{field}.items[{k}]");
                    let Some(bytes) = source.get(&item.key) else {
                        if optional {
                            continue;
                        }
                        return Err(Error::MissingKey {
                            field,
                            kind: source.kind(),
                            name: source_name(source),
                            key: item.key.clone(),
                        });
                    };
                    let path = file_path(&field, &item.path)?;
                    let mode = item.mode.map_or(Ok(default_mode), |m| mode(&field, Some(m)))?;
                    files.push(DataFile { path, bytes, mode });
                }
            }
            _ => {
                for (key, bytes) in source.all() {
                    let path = file_path(field, &key)?;
                    files.push(DataFile {
                        path,
                        bytes,
                        mode: default_mode,
                    });
                }
            }
        }
        Ok(files)
    }

    /// A downward API file, computed from the parent (the checkpoint has no API object).
    fn downward_file(
        &self,
        field: &str,
        item: &DownwardAPIVolumeFile,
        default_mode: u32,
    ) -> Result<DataFile> {
        let path = file_path(field, &item.path)?;
        let mode = item.mode.map_or(Ok(default_mode), |m| mode(field, Some(m)))?;
        let Some(field_ref) = &item.field_ref else {
            return Err(Error::Unrepresentable {
                field: field.to_owned(),
                reason: "resourceFieldRef in a projected volume is not supported in checkpoints".into(),
            });
        };
        let meta = &self.pod.metadata;
        let empty = BTreeMap::new();
        let labels = meta.labels.as_ref().unwrap_or(&empty);
        let annotations = meta.annotations.as_ref().unwrap_or(&empty);
        let fp = field_ref.field_path.as_str();
        let keyed = |prefix: &str| {
            fp.strip_prefix(prefix)
                .and_then(|r| r.strip_prefix("['"))
                .and_then(|r| r.strip_suffix("']"))
        };
        let value = match fp {
            "metadata.name" => self.id.name.to_string(),
            "metadata.namespace" => self.id.namespace.to_string(),
            "metadata.uid" => meta.uid.clone().unwrap_or_default(),
            "metadata.labels" => format_map(labels),
            "metadata.annotations" => format_map(annotations),
            _ => match (keyed("metadata.labels"), keyed("metadata.annotations")) {
                (Some(k), _) => labels.get(k).cloned().unwrap_or_default(),
                (_, Some(k)) => annotations.get(k).cloned().unwrap_or_default(),
                _ => {
                    return Err(Error::Unrepresentable {
                        field: field.to_owned(),
                        reason: format!("unsupported downward API field {fp:?}"),
                    });
                }
            },
        };
        Ok(DataFile {
            path,
            bytes: value.into_bytes(),
            mode,
        })
    }

    /// Registers a materialized directory. The directory is named after the object
    /// (bootkube's layout); a second volume projecting the same object differently gets
    /// `<object>.<volume>` instead of silently sharing files.
    fn place(
        &mut self,
        field: &str,
        kind: DataKind,
        object: &str,
        volume: &str,
        mut files: Vec<DataFile>,
    ) -> Result<DataDir> {
        // The API server checks a referenced name only for being non-empty, and an optional
        // object that does not exist still gets its (empty) dir: its name must be safe as
        // a path component (found by the fuzz run: `secretName: /etc/passwd`, optional).
        if !is_dns_subdomain(object) {
            return Err(Error::Invalid {
                field: field.to_owned(),
                what: "object name",
                value: object.to_owned(),
            });
        }
        if self.group_read {
            // The kubelet's SetVolumeOwnership on a read-only volume: group fsGroup, and
            // read for owner and group added to every file.
            for file in &mut files {
                file.mode |= 0o440;
            }
        }
        let dir = |name: String| DataDir {
            kind,
            namespace: self.id.namespace.to_string(),
            pod: self.id.name.to_string(),
            name,
        };
        for candidate in [dir(object.to_owned()), dir(format!("{object}.{volume}"))] {
            match self.dirs.get(&candidate) {
                Some(existing) if existing.files == files => return Ok(candidate),
                Some(_) => continue,
                None => {
                    self.dirs.insert(
                        candidate.clone(),
                        MaterializedDir {
                            dir: candidate.clone(),
                            files,
                        },
                    );
                    return Ok(candidate);
                }
            }
        }
        Err(Error::Invalid {
            field: field.to_owned(),
            what: "directory name (collides)",
            value: object.to_owned(),
        })
    }

    /// Resolves `env[].valueFrom` secret/configMap refs and `envFrom` into literal values,
    /// building the environment the kubelet would (`makeEnvironmentVariables`): every
    /// `envFrom` source in order (later ones win), then `env` in order. The kubelet keeps
    /// the variables in one map, so a later `env` entry replaces an `envFrom` value only
    /// when it resolves to something, and `$(VAR)` in an earlier literal sees the
    /// `envFrom` value; the static pod keeps both entries, in that order, to mean the same.
    fn container(&mut self, field: &str, c: &mut Container) -> Result<()> {
        if c.env_from.is_none() && !c.env.iter().flatten().any(needs_resolving) {
            return Ok(());
        }
        let mut from_sources: BTreeMap<String, String> = BTreeMap::new();
        let mut order: Vec<String> = Vec::new();
        for (j, from) in c.env_from.iter().flatten().enumerate() {
            let field = format!("{field}.envFrom[{j}]");
            let (kind, name, optional) = match (&from.secret_ref, &from.config_map_ref) {
                (Some(s), _) => (DataKind::Secret, s.name.as_str(), s.optional.unwrap_or(false)),
                (None, Some(cm)) => (
                    DataKind::ConfigMap,
                    cm.name.as_str(),
                    cm.optional.unwrap_or(false),
                ),
                (None, None) => continue,
            };
            let Some(source) = self.source(&field, kind, name, optional)? else {
                continue;
            };
            let prefix = from.prefix.as_deref().unwrap_or("");
            let mut skipped = Vec::new();
            for (key, bytes) in source.env_all() {
                let var = format!("{prefix}{key}");
                // Kubelets before relaxed env var validation skip these (with an Event),
                // and validate static pods with the strict rule, so one such name would
                // get the whole checkpoint refused.
                if !is_env_var_name(&var) {
                    skipped.push(var);
                    continue;
                }
                let value = env_value(&field, source, &key, bytes)?;
                self.secrets_in_manifest |= kind == DataKind::Secret;
                if from_sources.insert(var.clone(), value).is_none() {
                    order.push(var);
                }
            }
            if !skipped.is_empty() {
                self.warnings.push(format!(
                    "{field}: skipped keys of {} {name:?} that are not valid environment variable names: {}",
                    source.kind(),
                    skipped.join(", ")
                ));
            }
        }
        let mut env: Vec<EnvVar> = order
            .into_iter()
            .filter_map(|name| {
                from_sources.remove(&name).map(|value| EnvVar {
                    name,
                    value: Some(value),
                    value_from: None,
                })
            })
            .collect();
        for (j, e) in c.env.take().into_iter().flatten().enumerate() {
            let field = format!("{field}.env[{j}]");
            let from = e.value_from.as_ref();
            let key_ref = match (
                from.and_then(|f| f.secret_key_ref.as_ref()),
                from.and_then(|f| f.config_map_key_ref.as_ref()),
            ) {
                (Some(s), _) => Some((
                    DataKind::Secret,
                    s.name.as_str(),
                    s.key.as_str(),
                    s.optional.unwrap_or(false),
                )),
                (None, Some(cm)) => Some((
                    DataKind::ConfigMap,
                    cm.name.as_str(),
                    cm.key.as_str(),
                    cm.optional.unwrap_or(false),
                )),
                (None, None) => None,
            };
            let Some((kind, name, key, optional)) = key_ref else {
                env.push(e);
                continue;
            };
            let Some(source) = self.source(&field, kind, name, optional)? else {
                continue;
            };
            let Some(bytes) = source.env_get(key) else {
                if optional {
                    continue;
                }
                return Err(Error::MissingKey {
                    field,
                    kind: source.kind(),
                    name: name.to_owned(),
                    key: key.to_owned(),
                });
            };
            let value = env_value(&field, source, key, bytes)?;
            self.secrets_in_manifest |= kind == DataKind::Secret;
            env.push(EnvVar {
                name: e.name,
                value: Some(value),
                value_from: None,
            });
        }
        c.env = (!env.is_empty()).then_some(env);
        c.env_from = None;
        Ok(())
    }
}

fn needs_resolving(e: &EnvVar) -> bool {
    e.value_from
        .as_ref()
        .is_some_and(|f| f.secret_key_ref.is_some() || f.config_map_key_ref.is_some())
}

fn source_name(source: Source<'_>) -> String {
    match source {
        Source::Secret(s) => s.metadata.name.clone().unwrap_or_default(),
        Source::ConfigMap(cm) => cm.metadata.name.clone().unwrap_or_default(),
    }
}

/// A resolved value as a literal env value: UTF-8, and `$` doubled so the kubelet's
/// `$(VAR)` expansion gives back exactly the original (values from Secrets/ConfigMaps
/// are never expanded by the kubelet; literal `value`s are).
fn env_value(field: &str, source: Source<'_>, key: &str, bytes: Vec<u8>) -> Result<String> {
    let text = String::from_utf8(bytes).map_err(|_| Error::Invalid {
        field: field.to_owned(),
        what: "env value (not UTF-8)",
        value: format!("{} {:?} key {key:?}", source.kind(), source_name(source)),
    })?;
    Ok(text.replace('$', "$$"))
}

/// The kubelet's relaxed env var name rule: `[-._a-zA-Z][-._a-zA-Z0-9]*`.
fn is_env_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || "-._".contains(c))
        && chars.all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
}

/// A file mode from the pod (`defaultMode`, `mode`), checked to be permission bits only.
fn mode(field: &str, value: Option<i32>) -> Result<u32> {
    match value {
        None => Ok(DEFAULT_FILE_MODE),
        Some(m) if (0..=0o777).contains(&m) => Ok(m.unsigned_abs()),
        Some(m) => Err(Error::Invalid {
            field: field.to_owned(),
            what: "mode",
            value: format!("{m:o}"),
        }),
    }
}

/// A relative file path inside a volume: no absolute paths, no `..`, no empty components.
fn file_path(field: &str, path: &str) -> Result<String> {
    let ok = !path.is_empty()
        && !path.starts_with('/')
        && path.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
        && !path.contains('\0');
    if ok {
        Ok(path.to_owned())
    } else {
        Err(Error::Invalid {
            field: field.to_owned(),
            what: "path",
            value: path.to_owned(),
        })
    }
}

/// The kubelet's format for a whole labels/annotations map in a downward API file.
fn format_map(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use serde_json::{Value, json};

    use super::*;

    const DIR: &str = "/etc/kubernetes";

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "kube-apiserver-abc", "namespace": "kube-system", "uid": "uid-1",
                "resourceVersion": "42", "creationTimestamp": "2026-12-01T00:00:00Z",
                "labels": {"k8s-app": "kube-apiserver"},
                "annotations": {"checkpointer.alpha.coreos.com/checkpoint": "true", "other": "x"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "kube-apiserver",
                                     "uid": "ds-uid", "controller": true}]
            },
            "spec": spec,
            "status": {"phase": "Running", "podIP": "10.0.0.1"}
        }))
        .expect("test pod")
    }

    fn objects() -> ApiObjects {
        let secret = |name: &str, data: &[(&str, &[u8])]| {
            let mut s = Secret::default();
            s.metadata.name = Some(name.into());
            s.data = Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
                    .collect(),
            );
            (name.to_owned(), Arc::new(s))
        };
        let cm = |name: &str, data: &[(&str, &str)], binary: &[(&str, &[u8])]| {
            let mut c = ConfigMap::default();
            c.metadata.name = Some(name.into());
            c.data = Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            );
            c.binary_data = Some(
                binary
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
                    .collect(),
            );
            (name.to_owned(), Arc::new(c))
        };
        ApiObjects {
            secrets: [
                secret("tls", &[("tls.crt", b"CERT"), ("tls.key", b"KEY")]),
                secret("token", &[("password", b"pa$(ss)"), ("binary", &[0xff, 0xfe])]),
            ]
            .into(),
            config_maps: [
                cm(
                    "config",
                    &[("a.yaml", "a: 1"), ("BAD KEY", "x"), ("LOG_LEVEL", "debug")],
                    &[("blob", &[0, 1, 2])],
                ),
                cm("kube-root-ca.crt", &[("ca.crt", "CA")], &[]),
                cm("mixed", &[("MODE", "fast")], &[("blob", &[0xff, 0x00])]),
            ]
            .into(),
        }
    }

    fn options() -> SanitizeOptions {
        SanitizeOptions {
            checkpoint_dir: DIR.into(),
            checkpointed_at: Timestamp(1_796_213_959_000),
        }
    }

    fn container(extra: Value) -> Value {
        let mut c = json!({"name": "c", "image": "registry.k8s.io/kube-apiserver:v1.33.0"});
        if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
            c.extend(extra.clone());
        }
        c
    }

    /// A data dir as `(relative path, [(file path, bytes, mode)])`.
    type ExpectedDir<'a> = (&'a str, &'a [(&'a str, &'a [u8], u32)]);
    type OwnedDir = (String, Vec<(String, Vec<u8>, u32)>);

    /// Sanitizes `spec` and compares the resulting spec, data dirs and warnings.
    fn check(spec: Value, expected_spec: Value, expected_dirs: &[ExpectedDir<'_>], expected_warnings: usize) {
        let sanitized = sanitize(&pod(spec), &objects(), &options()).expect("sanitizes");
        let cp = &sanitized.checkpoint;
        assert_eq!(
            serde_json::to_value(cp.manifest.spec.as_ref()).expect("json"),
            expected_spec
        );
        let dirs: Vec<OwnedDir> = cp
            .dirs
            .iter()
            .map(|d| {
                let files = d
                    .files
                    .iter()
                    .map(|f| (f.path.clone(), f.bytes.clone(), f.mode))
                    .collect();
                (d.dir.relative_path().display().to_string(), files)
            })
            .collect();
        let expected_dirs: Vec<OwnedDir> = expected_dirs
            .iter()
            .map(|(d, files)| {
                (
                    (*d).to_owned(),
                    files
                        .iter()
                        .map(|(p, b, m)| ((*p).to_owned(), b.to_vec(), *m))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(dirs, expected_dirs);
        assert_eq!(
            sanitized.warnings.len(),
            expected_warnings,
            "{:?}",
            sanitized.warnings
        );
        assert_eq!(references_api_objects(&cp.manifest), Vec::<String>::new());
    }

    fn check_err(spec: Value, expected: &str) {
        let err = sanitize(&pod(spec), &objects(), &options()).expect_err("refused");
        assert_eq!(err.to_string(), expected);
    }

    #[test]
    fn pod_level_rules() {
        check(
            json!({
                "containers": [container(json!({"imagePullPolicy": "Always"}))],
                "initContainers": [container(json!({"name": "init", "imagePullPolicy": "Never"}))],
                "ephemeralContainers": [{"name": "debug", "image": "busybox"}],
                "serviceAccountName": "kube-apiserver", "serviceAccount": "kube-apiserver",
                "automountServiceAccountToken": true,
                "imagePullSecrets": [{"name": "regcred"}],
                "nodeName": "node-1", "nodeSelector": {"node-role.kubernetes.io/master": ""},
                "affinity": {"nodeAffinity": {}}, "schedulingGates": [{"name": "g"}],
                "hostNetwork": true, "priorityClassName": "system-node-critical",
                "tolerations": [{"operator": "Exists"}]
            }),
            json!({
                "automountServiceAccountToken": false,
                "containers": [container(json!({"imagePullPolicy": "IfNotPresent"}))],
                "hostNetwork": true,
                "initContainers": [container(json!({"name": "init", "imagePullPolicy": "Never"}))],
                "priorityClassName": "system-node-critical",
                "tolerations": [{"operator": "Exists"}]
            }),
            &[],
            0,
        );
    }

    /// Issue 37: fields added to the pod in Kubernetes 1.34–1.37 survive checkpointing (with
    /// k8s-openapi's `v1_33` the typed model dropped them without a word: a checkpoint of a
    /// current pod was a different pod).
    #[test]
    fn fields_of_current_kubernetes_survive() {
        let rules = json!([{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]);
        check(
            json!({
                "containers": [container(json!({"restartPolicy": "Never", "restartPolicyRules": rules}))],
                "hostnameOverride": "apiserver-1",
                "hostNetwork": true
            }),
            json!({
                "automountServiceAccountToken": false,
                "containers": [container(json!({"restartPolicy": "Never", "restartPolicyRules": rules}))],
                "hostNetwork": true,
                "hostnameOverride": "apiserver-1"
            }),
            &[],
            0,
        );
    }

    #[test]
    fn host_network_checkpoints_declare_no_ports() {
        let declared = json!({
            "ports": [{"name": "metrics", "containerPort": 10267},
                      {"name": "https", "containerPort": 6443, "hostPort": 6443}],
            "livenessProbe": {"httpGet": {"port": "metrics", "path": "/healthz"}},
            "readinessProbe": {"tcpSocket": {"port": "https"}},
            "startupProbe": {"httpGet": {"port": "elsewhere"}},
            "lifecycle": {"preStop": {"httpGet": {"port": "metrics"}}}
        });
        // On the host network: no ports; named ones resolved (an unknown name stays, as
        // the parent has it).
        check(
            json!({"hostNetwork": true, "containers": [container(declared.clone())]}),
            json!({
                "automountServiceAccountToken": false,
                "hostNetwork": true,
                "containers": [container(json!({
                    "livenessProbe": {"httpGet": {"port": 10267, "path": "/healthz"}},
                    "readinessProbe": {"tcpSocket": {"port": 6443}},
                    "startupProbe": {"httpGet": {"port": "elsewhere"}},
                    "lifecycle": {"preStop": {"httpGet": {"port": 10267}}}
                }))]
            }),
            &[],
            0,
        );
        // In the pod's own network the runtime maps host ports: kept as they are.
        check(
            json!({"containers": [container(declared.clone())]}),
            json!({"automountServiceAccountToken": false, "containers": [container(declared)]}),
            &[],
            0,
        );
    }

    #[test]
    fn metadata_is_reduced_and_annotated() {
        let sanitized = sanitize(
            &pod(json!({"containers": [container(json!({}))]})),
            &objects(),
            &options(),
        )
        .expect("ok");
        let cp = sanitized.checkpoint;
        let mut meta = serde_json::to_value(&cp.manifest.metadata).expect("json");
        let hash = meta["annotations"][ANNOTATION_SPEC_HASH].take();
        assert_eq!(hash, json!(cp.spec_hash));
        assert_eq!(
            meta,
            json!({
                "name": "kube-apiserver-abc", "namespace": "kube-system",
                "labels": {"k8s-app": "kube-apiserver"},
                "annotations": {
                    ANNOTATION_CHECKPOINT_OF: "kube-apiserver-abc",
                    ANNOTATION_PARENT_UID: "uid-1",
                    ANNOTATION_OWNER: "apps/v1/DaemonSet/kube-apiserver/ds-uid",
                    ANNOTATION_SPEC_HASH: null,
                    ANNOTATION_CHECKPOINTED_AT: "2026-12-02T12:19:19.000Z",
                },
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "kube-apiserver-abc",
                                     "uid": "uid-1", "controller": true}]
            })
        );
        assert!(cp.manifest.status.is_none());
        assert_eq!(cp.parent, PodId::new("kube-system", "kube-apiserver-abc"));
        assert!(!cp.manifest_holds_secrets);
        let bytes = cp.manifest_bytes();
        assert!(
            bytes.starts_with(br#"{"apiVersion":"v1","kind":"Pod","metadata":"#),
            "{}",
            String::from_utf8_lossy(&bytes)
        );
        assert_eq!(bytes.last(), Some(&b'\n'));
        let meta = CheckpointMetaCheck::from(&cp.manifest);
        assert_eq!(meta.0.owner.map(|o| o.name), Some("kube-apiserver".to_owned()));
    }

    #[test]
    fn the_handoff_annotation_goes_with_the_checkpoint() {
        let check = |value: &str, kept: bool| {
            let mut parent = pod(json!({"containers": [container(json!({}))]}));
            (parent.metadata.annotations.get_or_insert_default())
                .insert(ANNOTATION_HANDOFF.to_owned(), value.to_owned());
            let cp = sanitize(&parent, &objects(), &options()).expect("ok").checkpoint;
            let annotations = cp.manifest.metadata.annotations.clone().unwrap_or_default();
            assert_eq!(annotations.contains_key(ANNOTATION_HANDOFF), kept, "{value}");
            assert_eq!(
                CheckpointMetaCheck::from(&cp.manifest).0.retires_when_ready,
                kept,
                "{value}"
            );
        };
        check(HANDOFF_WHEN_READY, true);
        check("at-once", false);
        check("", false);
    }

    /// A checkpoint records its pod's template generation (what orders a DaemonSet's
    /// revisions) through the labels it keeps.
    #[test]
    fn the_template_generation_goes_with_the_checkpoint() {
        let mut parent = pod(json!({"containers": [container(json!({}))]}));
        (parent.metadata.labels.get_or_insert_default()).insert(
            crate::identity::LABEL_POD_TEMPLATE_GENERATION.to_owned(),
            "3".to_owned(),
        );
        let cp = sanitize(&parent, &objects(), &options()).expect("ok").checkpoint;
        assert_eq!(
            CheckpointMetaCheck::from(&cp.manifest).0.template_generation,
            Some(3)
        );
    }

    struct CheckpointMetaCheck(crate::checkpoint::CheckpointMeta);
    impl From<&Pod> for CheckpointMetaCheck {
        fn from(p: &Pod) -> Self {
            Self(crate::checkpoint::CheckpointMeta::from_manifest(p).expect("is a checkpoint"))
        }
    }

    #[test]
    fn secret_and_configmap_volumes() {
        let mount = json!({"volumeMounts": [{"name": "tls", "mountPath": "/tls"}, {"name": "cfg", "mountPath": "/cfg"},
                                            {"name": "some", "mountPath": "/some"}, {"name": "gone", "mountPath": "/gone"},
                                            {"name": "scratch", "mountPath": "/scratch"}]});
        // Read-only like the kubelet's own mounts of these volumes; the emptyDir stays writable.
        let read_only_mount = json!({"volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": true},
                                                      {"name": "cfg", "mountPath": "/cfg", "readOnly": true},
                                                      {"name": "some", "mountPath": "/some", "readOnly": true},
                                                      {"name": "gone", "mountPath": "/gone", "readOnly": true},
                                                      {"name": "scratch", "mountPath": "/scratch"}]});
        check(
            json!({
                "containers": [container(mount.clone())],
                "volumes": [
                    {"name": "tls", "secret": {"secretName": "tls", "defaultMode": 0o640}},
                    {"name": "cfg", "configMap": {"name": "config"}},
                    {"name": "some", "secret": {"secretName": "tls", "items": [{"key": "tls.key", "path": "keys/server.key", "mode": 0o400}]}},
                    {"name": "gone", "configMap": {"name": "missing", "optional": true}},
                    {"name": "scratch", "emptyDir": {}}
                ]
            }),
            json!({
                "automountServiceAccountToken": false,
                "containers": [container(read_only_mount)],
                "volumes": [
                    {"name": "tls", "hostPath": {"path": "/etc/kubernetes/checkpoint-secrets/kube-system/kube-apiserver-abc/tls", "type": "Directory"}},
                    {"name": "cfg", "hostPath": {"path": "/etc/kubernetes/checkpoint-configmaps/kube-system/kube-apiserver-abc/config", "type": "Directory"}},
                    {"name": "some", "hostPath": {"path": "/etc/kubernetes/checkpoint-secrets/kube-system/kube-apiserver-abc/tls.some", "type": "Directory"}},
                    {"name": "gone", "hostPath": {"path": "/etc/kubernetes/checkpoint-configmaps/kube-system/kube-apiserver-abc/missing", "type": "Directory"}},
                    {"name": "scratch", "emptyDir": {}}
                ]
            }),
            &[
                (
                    "checkpoint-secrets/kube-system/kube-apiserver-abc/tls",
                    &[("tls.crt", b"CERT", 0o640), ("tls.key", b"KEY", 0o640)],
                ),
                (
                    "checkpoint-secrets/kube-system/kube-apiserver-abc/tls.some",
                    &[("keys/server.key", b"KEY", 0o400)],
                ),
                (
                    "checkpoint-configmaps/kube-system/kube-apiserver-abc/config",
                    &[
                        ("BAD KEY", b"x", 0o600),
                        ("LOG_LEVEL", b"debug", 0o600),
                        ("a.yaml", b"a: 1", 0o600),
                        ("blob", &[0, 1, 2], 0o600),
                    ],
                ),
                (
                    "checkpoint-configmaps/kube-system/kube-apiserver-abc/missing",
                    &[],
                ),
            ],
            0,
        );
    }

    #[test]
    fn projected_volumes() {
        let mounts = json!({"volumeMounts": [{"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]});
        let read_only_mounts = json!({"volumeMounts": [{"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]});
        check(
            json!({
                "containers": [container(mounts.clone())],
                "volumes": [
                    {"name": "kube-api-access-x", "projected": {"defaultMode": 0o644, "sources": [
                        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}},
                                                   {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                                                   {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['k8s-app']"}}]}}
                    ]}},
                    {"name": "podinfo", "projected": {"sources": [
                        {"downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}
                    ]}}
                ]
            }),
            json!({
                "automountServiceAccountToken": false,
                "containers": [container(read_only_mounts)],
                "volumes": [
                    {"name": "kube-api-access-x", "hostPath": {"path": "/etc/kubernetes/checkpoint-projected/kube-system/kube-apiserver-abc/kube-api-access-x", "type": "Directory"}},
                    // Downward-API-only projections need no API object: the kubelet fills them in.
                    {"name": "podinfo", "projected": {"sources": [
                        {"downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}
                    ]}}
                ]
            }),
            &[(
                "checkpoint-projected/kube-system/kube-apiserver-abc/kube-api-access-x",
                &[
                    ("app", b"kube-apiserver", 0o644),
                    ("ca.crt", b"CA", 0o644),
                    ("labels", b"k8s-app=\"kube-apiserver\"", 0o644),
                    ("namespace", b"kube-system", 0o644),
                ],
            )],
            1,
        );
    }

    #[test]
    fn env_is_resolved_to_literals() {
        let env = json!({
            "envFrom": [{"configMapRef": {"name": "config"}, "prefix": "CFG_"},
                        {"secretRef": {"name": "gone", "optional": true}}],
            "env": [
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "token", "key": "password"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "CFG_LOG_LEVEL", "value": "info"},
                {"name": "MAYBE", "valueFrom": {"configMapKeyRef": {"name": "config", "key": "nope", "optional": true}}}
            ]
        });
        let sanitized = sanitize(
            &pod(json!({"containers": [container(env)]})),
            &objects(),
            &options(),
        )
        .expect("ok");
        let cp = &sanitized.checkpoint;
        let c = &cp.manifest.spec.as_ref().expect("spec").containers[0];
        assert_eq!(
            serde_json::to_value(&c.env).expect("json"),
            json!([
                // envFrom first (only `data`, keys that are not variable names skipped)…
                {"name": "CFG_LOG_LEVEL", "value": "debug"},
                {"name": "CFG_a.yaml", "value": "a: 1"},
                // …then env in order (a later entry overrides); `$` doubled so the
                // kubelet does not expand it.
                {"name": "PASSWORD", "value": "pa$$(ss)"},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "CFG_LOG_LEVEL", "value": "info"}
            ])
        );
        assert!(c.env_from.is_none());
        assert!(cp.manifest_holds_secrets);
        assert_eq!(cp.manifest_mode(), 0o600);
        assert!(references_api_objects(&cp.manifest).is_empty());
    }

    /// The environment the kubelet builds (`makeEnvironmentVariables`): `envFrom` takes a
    /// ConfigMap's `data` only, prefixed; later sources win; `env` overrides `envFrom`
    /// only when it resolves to a value; `configMapKeyRef` looks in `data` only.
    #[test]
    fn env_follows_the_kubelet() {
        let spec = |env: Value| json!({"containers": [container(env)]});
        let cases = [
            // binaryData is not env: a ConfigMap that has some is still checkpointed.
            (
                json!({"envFrom": [{"configMapRef": {"name": "mixed"}}]}),
                json!({"env": [{"name": "MODE", "value": "fast"}]}),
                0,
            ),
            // The prefix comes first; names that are not variable names are skipped with
            // a warning, as the kubelet skips them with an Event.
            (
                json!({"envFrom": [{"configMapRef": {"name": "config"}, "prefix": "X_"}]}),
                json!({"env": [{"name": "X_LOG_LEVEL", "value": "debug"}, {"name": "X_a.yaml", "value": "a: 1"}]}),
                1,
            ),
            (
                json!({"envFrom": [{"configMapRef": {"name": "config"}, "prefix": "1"}]}),
                json!({}),
                1,
            ),
            // A later source wins.
            (
                json!({"envFrom": [{"configMapRef": {"name": "mixed"}},
                                   {"configMapRef": {"name": "mixed"}, "prefix": ""},
                                   {"secretRef": {"name": "tls"}, "prefix": "MO"}]}),
                json!({"env": [{"name": "MODE", "value": "fast"}, {"name": "MOtls.crt", "value": "CERT"},
                               {"name": "MOtls.key", "value": "KEY"}]}),
                0,
            ),
            // An `env` entry that resolves to nothing (optional, absent) leaves the
            // envFrom value in place; one that resolves overrides it.
            (
                json!({"envFrom": [{"configMapRef": {"name": "mixed"}}],
                       "env": [{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "mixed", "key": "nope", "optional": true}}}]}),
                json!({"env": [{"name": "MODE", "value": "fast"}]}),
                0,
            ),
            (
                json!({"envFrom": [{"configMapRef": {"name": "mixed"}}],
                       "env": [{"name": "EARLIER", "value": "$(MODE)"}, {"name": "MODE", "value": "slow"}]}),
                // The kubelet expands `$(MODE)` against the envFrom value: so does this.
                json!({"env": [{"name": "MODE", "value": "fast"}, {"name": "EARLIER", "value": "$(MODE)"},
                               {"name": "MODE", "value": "slow"}]}),
                0,
            ),
            // `configMapKeyRef` sees `data` only: an optional binaryData key is absent.
            (
                json!({"env": [{"name": "B", "valueFrom": {"configMapKeyRef": {"name": "mixed", "key": "blob", "optional": true}}}]}),
                json!({}),
                0,
            ),
        ];
        for (env, expected_env, warnings) in cases {
            let mut expected = container(json!({}));
            if let (Some(c), Some(env)) = (expected.as_object_mut(), expected_env.as_object()) {
                c.extend(env.clone());
            }
            check(
                spec(env),
                json!({"automountServiceAccountToken": false, "containers": [expected]}),
                &[],
                warnings,
            );
        }
    }

    #[test]
    fn refusals_name_the_field() {
        let c = container(json!({}));
        let cases = [
            (
                json!({"containers": [c.clone()], "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]}),
                "spec.volumes[0] (data): cannot be checkpointed: a persistentVolumeClaim needs the API server to bind and attach",
            ),
            (
                json!({"containers": [c.clone()], "volumes": [{"name": "v", "csi": {"driver": "x"}}]}),
                "spec.volumes[0] (v): cannot be checkpointed: CSI volumes need the CSIDriver object from the API server",
            ),
            (
                json!({"containers": [c.clone()], "volumes": [{"name": "v", "rbd": {"monitors": [], "image": "i", "secretRef": {"name": "s"}}}]}),
                "spec.volumes[0] (v): cannot be checkpointed: the volume's secretRef needs a Secret from the API server",
            ),
            (
                json!({"containers": [c.clone()], "volumes": [{"name": "v", "secret": {"secretName": "absent"}}]}),
                "spec.volumes[0] (v): Secret \"absent\" not found",
            ),
            (
                json!({"containers": [c.clone()], "volumes": [{"name": "v", "secret": {"secretName": "tls", "items": [{"key": "nope", "path": "p"}]}}]}),
                "spec.volumes[0] (v).items[0]: key \"nope\" not found in Secret \"tls\"",
            ),
            (
                json!({"containers": [c.clone()], "volumes": [{"name": "v", "secret": {"secretName": "tls", "items": [{"key": "tls.key", "path": "../../etc/shadow"}]}}]}),
                "spec.volumes[0] (v).items[0]: invalid path: \"../../etc/shadow\"",
            ),
            (
                json!({"containers": [c.clone()], "volumes": [{"name": "v", "secret": {"secretName": "tls", "defaultMode": 0o4755}}]}),
                "spec.volumes[0] (v): invalid mode: \"4755\"",
            ),
            (
                json!({"containers": [container(json!({"env": [{"name": "B", "valueFrom": {"secretKeyRef": {"name": "token", "key": "binary"}}}]}))]}),
                "spec.containers[0].env[0]: invalid env value (not UTF-8): \"Secret \\\"token\\\" key \\\"binary\\\"\"",
            ),
            (
                json!({"containers": [container(json!({"env": [{"name": "B", "valueFrom": {"configMapKeyRef": {"name": "mixed", "key": "blob"}}}]}))]}),
                "spec.containers[0].env[0]: key \"blob\" not found in ConfigMap \"mixed\"",
            ),
            (
                json!({"containers": [c.clone()], "volumes": [{"name": "v", "projected": {"sources": [{"clusterTrustBundle": {"path": "b"}}]}}]}),
                "spec.volumes[0] (v).projected.sources[0]: cannot be checkpointed: this projected source needs the API server",
            ),
            (
                json!({"containers": [c.clone()], "resourceClaims": [{"name": "gpu"}]}),
                "spec.resourceClaims: cannot be checkpointed: resource claims need the API server",
            ),
            // Names that become path components (the fuzz run's findings): the API server
            // checks a referenced name only for being non-empty, and an optional object
            // that does not exist still gets its empty dir.
            (
                json!({"containers": [c.clone()], "volumes": [{"name": "v", "secret": {"secretName": "/etc/passwd", "optional": true}}]}),
                "spec.volumes[0] (v): invalid object name: \"/etc/passwd\"",
            ),
            (
                json!({"containers": [c.clone()], "volumes": [{"name": "v", "configMap": {"name": "..", "optional": true}}]}),
                "spec.volumes[0] (v): invalid object name: \"..\"",
            ),
            (
                json!({"containers": [c.clone()], "volumes": [{"name": "../v", "emptyDir": {}}]}),
                "spec.volumes[0].name: invalid volume name: \"../v\"",
            ),
        ];
        for (spec, expected) in cases {
            check_err(spec, expected);
        }
        assert_eq!(
            sanitize(&Pod::default(), &objects(), &options()),
            Err(Error::MissingName)
        );
        for (namespace, name, expected) in [
            ("/", "p", "metadata.namespace: invalid namespace: \"/\""),
            ("kube-system", "../p", "metadata.name: invalid pod name: \"../p\""),
        ] {
            let mut odd = pod(json!({"containers": [c.clone()]}));
            odd.metadata.namespace = Some(namespace.into());
            odd.metadata.name = Some(name.into());
            let refused = sanitize(&odd, &objects(), &options()).map(drop);
            assert_eq!(refused.map_err(|e| e.to_string()), Err(expected.to_owned()));
        }
    }

    #[test]
    fn file_owner_follows_the_mounting_containers() {
        let check_owner = |spec: Value, expected: FileOwner, warnings: usize| {
            let s = sanitize(&pod(spec), &objects(), &options()).expect("ok");
            assert_eq!(
                (s.checkpoint.owner, s.warnings.len()),
                (expected, warnings),
                "{:?}",
                s.warnings
            );
        };
        let tls = json!([{"name": "tls", "secret": {"secretName": "tls"}}]);
        let mounting = |name: &str, uid: Option<i64>| {
            let mut extra = json!({"name": name, "volumeMounts": [{"name": "tls", "mountPath": "/tls"}]});
            if let Some(uid) = uid {
                extra["securityContext"] = json!({"runAsUser": uid});
            }
            container(extra)
        };
        check_owner(
            json!({"containers": [container(json!({}))]}),
            FileOwner { uid: 0, gid: 0 },
            0,
        );
        check_owner(
            json!({"securityContext": {"runAsUser": 65534, "fsGroup": 1000}, "containers": [mounting("a", None)], "volumes": tls}),
            FileOwner {
                uid: 65534,
                gid: 1000,
            },
            0,
        );
        check_owner(
            json!({"securityContext": {"runAsUser": 1}, "containers": [mounting("a", Some(2)), container(json!({"name": "b"}))], "volumes": tls}),
            FileOwner { uid: 2, gid: 0 },
            0,
        );
        // bootkube skipped all secrets here; we own them by root and say so.
        check_owner(
            json!({"securityContext": {"fsGroup": 7}, "initContainers": [mounting("i", Some(5))], "containers": [mounting("a", Some(2))], "volumes": tls}),
            FileOwner { uid: 0, gid: 7 },
            1,
        );
    }

    #[test]
    fn fs_group_adds_group_read_as_the_kubelet_does() {
        let modes = |security_context: Value| {
            let spec = json!({
                "securityContext": security_context,
                "containers": [container(json!({"volumeMounts": [{"name": "tls", "mountPath": "/tls"}, {"name": "cfg", "mountPath": "/cfg"}]}))],
                "volumes": [
                    {"name": "tls", "secret": {"secretName": "tls", "items": [
                        {"key": "tls.key", "path": "tls.key", "mode": 0o400},
                        {"key": "tls.crt", "path": "tls.crt", "mode": 0o604}]}},
                    {"name": "cfg", "configMap": {"name": "config", "defaultMode": 0o644, "items": [{"key": "a.yaml", "path": "a.yaml"}]}}
                ]
            });
            let cp = sanitize(&pod(spec), &objects(), &options())
                .expect("ok")
                .checkpoint;
            cp.dirs
                .iter()
                .flat_map(|d| d.files.iter().map(|f| (f.path.clone(), f.mode)))
                .collect::<Vec<_>>()
        };
        let owned = |m: &[(&str, u32)]| m.iter().map(|(p, m)| ((*p).to_owned(), *m)).collect::<Vec<_>>();
        assert_eq!(
            modes(json!({"runAsUser": 1000})),
            owned(&[("tls.key", 0o400), ("tls.crt", 0o604), ("a.yaml", 0o644)])
        );
        // Owner and group read added (SetVolumeOwnership of a read-only volume), fsGroup 0 too.
        for fs_group in [2000, 0] {
            assert_eq!(
                modes(json!({"runAsUser": 1000, "fsGroup": fs_group})),
                owned(&[("tls.key", 0o440), ("tls.crt", 0o644), ("a.yaml", 0o644)]),
                "fsGroup {fs_group}"
            );
        }
    }

    #[test]
    fn deterministic_and_idempotent() {
        let spec = json!({
            "containers": [container(json!({"env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "token", "key": "password"}}}],
                                            "volumeMounts": [{"name": "tls", "mountPath": "/tls"}]}))],
            "volumes": [{"name": "tls", "secret": {"secretName": "tls"}}],
            "serviceAccountName": "sa"
        });
        let first = sanitize(&pod(spec.clone()), &objects(), &options())
            .expect("ok")
            .checkpoint;
        let again = sanitize(&pod(spec.clone()), &objects(), &options())
            .expect("ok")
            .checkpoint;
        assert_eq!(first.manifest_bytes(), again.manifest_bytes());
        // A later checkpoint time changes the bytes but not the spec hash.
        let later = SanitizeOptions {
            checkpointed_at: Timestamp(2_000_000_000_000),
            ..options()
        };
        let later = sanitize(&pod(spec), &objects(), &later).expect("ok").checkpoint;
        assert_eq!(first.spec_hash, later.spec_hash);
        assert_ne!(first.manifest_bytes(), later.manifest_bytes());
        // Sanitizing a checkpoint changes nothing in its spec or data.
        let twice = sanitize(&first.manifest, &ApiObjects::default(), &options())
            .expect("ok")
            .checkpoint;
        assert_eq!(twice.manifest.spec, first.manifest.spec);
        assert!(twice.dirs.is_empty());
        // Changing a secret changes the hash.
        let mut changed = objects();
        changed
            .secrets
            .get_mut("tls")
            .and_then(|s| Arc::make_mut(s).data.as_mut())
            .map(|d| d.insert("tls.crt".into(), ByteString(b"NEW".to_vec())));
        let spec = pod(
            json!({"containers": [container(json!({}))], "volumes": [{"name": "tls", "secret": {"secretName": "tls"}}]}),
        );
        let before = sanitize(&spec, &objects(), &options()).expect("ok").checkpoint;
        let after = sanitize(&spec, &changed, &options()).expect("ok").checkpoint;
        assert_ne!(before.spec_hash, after.spec_hash);
    }

    /// What a case changes between two sanitizations of the same pod.
    #[derive(Clone, Copy, Debug)]
    enum Change {
        /// The Secret `tls` rotated.
        Secret,
        /// The ConfigMap `config` edited.
        ConfigMap,
        /// The first container's image.
        Image,
    }

    /// Which part of a checkpoint's content a change lands in: what proves it differs
    /// (issue 36, Known-good content).
    #[test]
    fn a_change_lands_in_the_part_its_containers_read_it_by() {
        fn check(what: &str, spec: Value, change: Change, read_at_start: bool) {
            let mut after_objects = objects();
            let mut after_spec = spec.clone();
            match change {
                Change::Secret => {
                    let tls = after_objects.secrets.get_mut("tls").expect("tls");
                    let data = Arc::make_mut(tls).data.get_or_insert_default();
                    data.insert("tls.crt".into(), ByteString(b"NEW".to_vec()));
                }
                Change::ConfigMap => {
                    let config = after_objects.config_maps.get_mut("config").expect("config");
                    let data = Arc::make_mut(config).data.get_or_insert_default();
                    data.insert("a.yaml".into(), "a: 2".into());
                    data.insert("LOG_LEVEL".into(), "info".into());
                }
                Change::Image => {
                    after_spec["containers"][0]["image"] = json!("registry.k8s.io/kube-apiserver:v1.34.0")
                }
            }
            let before = sanitize(&pod(spec), &objects(), &options()).expect("sanitizes");
            let after = sanitize(&pod(after_spec), &after_objects, &options()).expect("sanitizes");
            assert_ne!(
                before.checkpoint.spec_hash, after.checkpoint.spec_hash,
                "{what}: spec hash"
            );
            let changed = (
                before.parts.read_at_start != after.parts.read_at_start,
                before.parts.updated_in_place != after.parts.updated_in_place,
            );
            assert_eq!(
                changed,
                (read_at_start, !read_at_start),
                "{what}: (read at start, updated in place) changed"
            );
        }
        let tls = json!([{"name": "tls", "secret": {"secretName": "tls"}}]);
        let config = json!([{"name": "config", "configMap": {"name": "config"}}]);
        let mount = |name: &str, extra: Value| {
            let mut m = json!({"name": name, "mountPath": "/m"});
            if let (Some(m), Some(extra)) = (m.as_object_mut(), extra.as_object()) {
                m.extend(extra.clone());
            }
            json!({"volumeMounts": [m]})
        };
        let cases = [
            (
                "a Secret volume: the kubelet updates it in place",
                json!({"containers": [container(mount("tls", json!({})))], "volumes": tls}),
                Change::Secret,
                false,
            ),
            (
                "a Secret volume mounted with subPath: bound once, at start",
                json!({"containers": [container(mount("tls", json!({"subPath": "tls.crt"})))], "volumes": tls}),
                Change::Secret,
                true,
            ),
            (
                "a ConfigMap volume mounted with subPath",
                json!({"containers": [container(mount("config", json!({"subPath": "a.yaml"})))], "volumes": config}),
                Change::ConfigMap,
                true,
            ),
            (
                "a ConfigMap volume mounted with subPathExpr",
                json!({"containers": [container(mount("config", json!({"subPathExpr": "$(X)"})))], "volumes": config}),
                Change::ConfigMap,
                true,
            ),
            (
                "a ConfigMap volume mounted with an empty subPath is the whole volume",
                json!({"containers": [container(mount("config", json!({"subPath": ""})))], "volumes": config}),
                Change::ConfigMap,
                false,
            ),
            (
                "a volume mounted with subPath by one container and whole by another",
                json!({"containers": [
                    container(mount("tls", json!({}))),
                    {"name": "d", "image": "busybox", "volumeMounts": [{"name": "tls", "mountPath": "/m", "subPath": "tls.crt"}]}
                ], "volumes": tls}),
                Change::Secret,
                true,
            ),
            (
                "a volume an init container mounts: read once, before the pod runs",
                json!({"initContainers": [{"name": "i", "image": "busybox", "volumeMounts": [{"name": "tls", "mountPath": "/m"}]}],
                       "containers": [container(mount("tls", json!({})))], "volumes": tls}),
                Change::Secret,
                true,
            ),
            (
                "a projected volume's Secret: updated in place",
                json!({"containers": [container(mount("p", json!({})))],
                       "volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": "tls"}}]}}]}),
                Change::Secret,
                false,
            ),
            (
                "a volume no container mounts is nobody's start",
                json!({"containers": [container(json!({}))], "volumes": tls}),
                Change::Secret,
                false,
            ),
            (
                "a Secret in env: resolved into the spec",
                json!({"containers": [container(json!({"env": [{"name": "CRT", "valueFrom": {"secretKeyRef": {"name": "tls", "key": "tls.crt"}}}]}))]}),
                Change::Secret,
                true,
            ),
            (
                "a ConfigMap in envFrom",
                json!({"containers": [container(json!({"envFrom": [{"configMapRef": {"name": "config"}}]}))]}),
                Change::ConfigMap,
                true,
            ),
            (
                "the spec itself",
                json!({"containers": [container(mount("tls", json!({})))], "volumes": tls}),
                Change::Image,
                true,
            ),
        ];
        for (what, spec, change, read_at_start) in cases {
            check(what, spec, change, read_at_start);
        }
    }

    #[test]
    fn references_of_unsanitized_pods_are_found() {
        let p = pod(json!({
            "serviceAccountName": "sa",
            "imagePullSecrets": [{"name": "r"}],
            "containers": [container(json!({"envFrom": [{"configMapRef": {"name": "config"}}]}))],
            // "e" has no source: the defaults the kubelet applies first make it an emptyDir.
            "volumes": [
                {"name": "t", "secret": {"secretName": "tls"}},
                {"name": "h", "hostPath": {"path": "/x"}},
                {"name": "e"}
            ]
        }));
        assert_eq!(
            references_api_objects(&p),
            vec![
                "spec.serviceAccountName: serviceaccounts",
                "spec.imagePullSecrets: secrets",
                "spec.containers[0].envFrom[0].configMapRef: configmaps",
                "spec.volumes[0] (t): secrets (via secret volumes)",
            ]
        );
        let req = crate::references::required_objects(&p);
        assert_eq!(req.secrets.into_iter().collect::<Vec<_>>(), vec!["tls"]);
        assert_eq!(req.config_maps.into_iter().collect::<Vec<_>>(), vec!["config"]);
    }
}
