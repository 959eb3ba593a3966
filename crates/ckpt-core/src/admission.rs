//! Local admission: whether this node's kubelet would run a checkpoint's manifest as a
//! static pod, checked before the manifest is written.
//!
//! A kubelet trusts the pods it gets from the API server, but it validates a static-pod
//! file: it names the pod `<name>-<node>`, applies the API's defaults and validates it as
//! the API server validates a pod create (`ValidatePodCreate`, with its own version's
//! rules); a pod that fails is logged by the kubelet and never runs. Since 1.34 it also
//! refuses static pods that reference API objects. Sanitization rewrites the parent
//! (volumes, env, metadata), and the API server may be newer than the kubelet, so a parent
//! that runs can give a checkpoint the kubelet refuses: a name too long once the node's
//! name is appended, an env name the newer API server accepts and the kubelet does not, a
//! mount left without its volume, an owner reference without a UID. [`admit`] checks
//! those rules.
//!
//! [`dropped_fields`] names the fields a kubelet older than the field drops when it reads
//! the pod. It drops them from the parent too (the same kubelet runs it), so the checkpoint
//! still does what the parent does: a warning, not a refusal, which would take the node's
//! protection away for nothing.
//!
//! The reference for the version-independent rules is the real v1.20 API server: the
//! end-to-end suite creates sanitized pods with `dryRun` and compares its verdict with
//! [`admit`]'s.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use serde_json::Value;

use crate::identity::{PodId, is_dns_label, is_dns_subdomain};
use crate::references::references_api_objects;

/// A kubelet's `major.minor` version, from the Node's `status.nodeInfo.kubeletVersion`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubeletVersion {
    /// `1`.
    pub major: u32,
    /// `20` for v1.20.2.
    pub minor: u32,
}

impl KubeletVersion {
    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// Kubelets from 1.34 on refuse static pods that reference API objects.
    pub const REFUSES_API_REFERENCES: KubeletVersion = KubeletVersion::new(1, 34);
    /// Env var names other than C-like identifiers in a static pod. The API server takes
    /// them from 1.32 (RelaxedEnvironmentVariableValidation, on by default), but kubelets
    /// before 1.35 validate a manifest file with no validation options, so with the strict
    /// rule whatever the gate: the real v1.34.4 kubelet refuses `1ST`, which its API server
    /// accepts (the kubelet scenario found it).
    pub const RELAXED_ENV_NAMES: KubeletVersion = KubeletVersion::new(1, 35);
    /// A host-network port whose hostPort differs from its containerPort is reported on
    /// `hostPort` from 1.28 on, on `containerPort` before (the same refusal).
    const NAMES_HOST_PORT: KubeletVersion = KubeletVersion::new(1, 28);
}

impl fmt::Display for KubeletVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}", self.major, self.minor)
    }
}

impl FromStr for KubeletVersion {
    type Err = String;

    /// `v1.20.2`, `1.33`, `v1.30.4+k3s1`, `v1.29.0-gke.1`.
    fn from_str(text: &str) -> Result<Self, String> {
        let invalid = || format!("not a kubelet version: {text:?}");
        let rest = text.strip_prefix('v').unwrap_or(text);
        let mut parts = rest.splitn(3, '.');
        let number = |part: Option<&str>| -> Result<u32, String> {
            let digits: &str = part.ok_or_else(invalid)?;
            let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
            digits[..end].parse().map_err(|_| invalid())
        };
        let major = number(parts.next())?;
        let minor = number(parts.next())?;
        Ok(KubeletVersion { major, minor })
    }
}

/// One rule a manifest breaks: the field and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inadmissible {
    /// The field path, e.g. `spec.containers[0].volumeMounts[1].name`.
    pub field: String,
    /// What the kubelet would say.
    pub reason: String,
}

impl fmt::Display for Inadmissible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

/// The fields of a pod a kubelet older than the version that introduced them drops when
/// it decodes a pod (`[]` stands for every item of a list). Fields known to every kubelet
/// the project supports (≥1.20) are not listed; neither are those added after the API
/// level the agent is built for (it never reads them, so never writes them).
const NEWER_FIELDS: &[(&str, KubeletVersion)] = &[
    ("spec.os", KubeletVersion::new(1, 23)),
    ("spec.hostUsers", KubeletVersion::new(1, 25)),
    ("spec.schedulingGates", KubeletVersion::new(1, 26)),
    ("spec.containers[].resizePolicy", KubeletVersion::new(1, 27)),
    ("spec.initContainers[].resizePolicy", KubeletVersion::new(1, 27)),
    ("spec.initContainers[].restartPolicy", KubeletVersion::new(1, 28)),
    (
        "spec.containers[].lifecycle.postStart.sleep",
        KubeletVersion::new(1, 29),
    ),
    (
        "spec.containers[].lifecycle.preStop.sleep",
        KubeletVersion::new(1, 29),
    ),
    ("spec.securityContext.appArmorProfile", KubeletVersion::new(1, 30)),
    (
        "spec.containers[].securityContext.appArmorProfile",
        KubeletVersion::new(1, 30),
    ),
    (
        "spec.initContainers[].securityContext.appArmorProfile",
        KubeletVersion::new(1, 30),
    ),
    (
        "spec.containers[].volumeMounts[].recursiveReadOnly",
        KubeletVersion::new(1, 30),
    ),
    (
        "spec.initContainers[].volumeMounts[].recursiveReadOnly",
        KubeletVersion::new(1, 30),
    ),
    (
        "spec.securityContext.supplementalGroupsPolicy",
        KubeletVersion::new(1, 31),
    ),
    ("spec.volumes[].image", KubeletVersion::new(1, 31)),
    ("spec.resources", KubeletVersion::new(1, 32)),
    (
        "spec.securityContext.seLinuxChangePolicy",
        KubeletVersion::new(1, 32),
    ),
    (
        "spec.containers[].lifecycle.stopSignal",
        KubeletVersion::new(1, 33),
    ),
];

/// The volume sources a pod's volume may name; exactly one per volume.
const VOLUME_SOURCES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "gitRepo",
    "glusterfs",
    "hostPath",
    "image",
    "iscsi",
    "nfs",
    "persistentVolumeClaim",
    "photonPersistentDisk",
    "portworxVolume",
    "projected",
    "quobyte",
    "rbd",
    "scaleIO",
    "secret",
    "storageos",
    "vsphereVolume",
];

const HOST_PATH_TYPES: &[&str] = &[
    "",
    "DirectoryOrCreate",
    "Directory",
    "FileOrCreate",
    "File",
    "Socket",
    "CharDevice",
    "BlockDevice",
];

/// The most a pod's annotations may hold, keys and values together.
const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

/// Checks `pod`, a checkpoint's manifest, against what the kubelet of `node` (version
/// `kubelet`) accepts as a static pod; every rule it breaks, in field order. With the
/// version unknown (the Node not read yet), the version-independent rules and the
/// strictest version rules apply (references to API objects are refused, env var names
/// must be C-like).
///
/// ```
/// use ckpt_core::{KubeletVersion, admit};
///
/// let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
///     "metadata": { "name": "kube-apiserver", "namespace": "kube-system" },
///     "spec": {
///         "containers": [{
///             "name": "apiserver",
///             "image": "kube-apiserver:v1.20.2",
///             "env": [{ "name": "1ST", "value": "x" }]
///         }]
///     }
/// })).unwrap();
/// // An env name newer kubelets accept in a static pod (and older ones refuse).
/// assert_eq!(admit(&pod, "node-1", Some(KubeletVersion::new(1, 35))), Ok(()));
/// let refused = admit(&pod, "node-1", Some(KubeletVersion::new(1, 34))).unwrap_err();
/// assert_eq!(refused[0].field, "spec.containers[0].env[0].name");
/// ```
pub fn admit(pod: &Pod, node: &str, kubelet: Option<KubeletVersion>) -> Result<(), Vec<Inadmissible>> {
    let mut found = Findings::default();
    metadata(pod, node, &mut found);
    match pod.spec.as_ref() {
        None => found.add("spec", "Required value"),
        Some(spec) => {
            let strict_env = kubelet.is_none_or(|v| v < KubeletVersion::RELAXED_ENV_NAMES);
            let names_host_port = kubelet.is_none_or(|v| v >= KubeletVersion::NAMES_HOST_PORT);
            let volumes = volumes(spec.volumes.as_deref().unwrap_or_default(), &mut found);
            tokens_without_service_account(spec, &mut found);
            if spec.containers.is_empty() {
                found.add("spec.containers", "Required value");
            }
            let mut names = BTreeSet::new();
            // The API server reports a duplicate at the init container: containers first.
            let lists = [
                ("containers", spec.containers.as_slice()),
                (
                    "initContainers",
                    spec.init_containers.as_deref().unwrap_or_default(),
                ),
            ];
            for (list, containers) in lists {
                for (i, c) in containers.iter().enumerate() {
                    let at = format!("spec.{list}[{i}]");
                    if !names.insert(c.name.as_str()) {
                        found.add(format!("{at}.name"), format!("Duplicate value: {:?}", c.name));
                    }
                    let host_network = spec.host_network == Some(true);
                    let rules = ContainerRules {
                        host_network,
                        strict_env,
                        names_host_port,
                    };
                    container(&at, c, &volumes, rules, &mut found);
                }
            }
            for (field, value, allowed) in [
                (
                    "restartPolicy",
                    &spec.restart_policy,
                    &["Always", "OnFailure", "Never"][..],
                ),
                (
                    "dnsPolicy",
                    &spec.dns_policy,
                    &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"][..],
                ),
            ] {
                if let Some(v) = value.as_deref().filter(|v| !allowed.contains(v)) {
                    found.add(format!("spec.{field}"), format!("Unsupported value: {v:?}"));
                }
            }
        }
    }
    let refuses_references = kubelet.is_none_or(|v| v >= KubeletVersion::REFUSES_API_REFERENCES);
    if refuses_references {
        for reference in references_api_objects(pod) {
            let (field, what) = reference
                .split_once(": ")
                .unwrap_or((&reference, "an API object"));
            found.add(
                field,
                format!("references {what}: kubelets from v1.34 on refuse it in a static pod"),
            );
        }
    }
    found.finish()
}

/// The fields of `pod` that a kubelet of version `kubelet` does not know and drops when it
/// reads the pod, as it does for the parent (see the module doc); none when the version is
/// unknown.
///
/// ```
/// use ckpt_core::{KubeletVersion, dropped_fields};
///
/// let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
///     "metadata": { "name": "kube-proxy", "namespace": "kube-system" },
///     "spec": {
///         "containers": [{ "name": "proxy", "image": "kube-proxy:v1.29.0" }],
///         "initContainers": [{ "name": "wait", "image": "busybox", "restartPolicy": "Always" }]
///     }
/// })).unwrap();
/// assert!(dropped_fields(&pod, Some(KubeletVersion::new(1, 28))).is_empty());
/// let dropped = dropped_fields(&pod, Some(KubeletVersion::new(1, 27)));
/// assert_eq!(dropped[0].field, "spec.initContainers[0].restartPolicy");
/// ```
pub fn dropped_fields(pod: &Pod, kubelet: Option<KubeletVersion>) -> Vec<Inadmissible> {
    let Some(kubelet) = kubelet else {
        return Vec::new();
    };
    // A kubelet that knows every field drops none: no need to look (every pass, every parent).
    if NEWER_FIELDS.iter().all(|(_, since)| kubelet >= *since) {
        return Vec::new();
    }
    let json = serde_json::to_value(pod).unwrap_or(Value::Null);
    let mut found = Findings::default();
    for (path, since) in NEWER_FIELDS.iter().filter(|(_, since)| kubelet < *since) {
        for field in present(&json, path) {
            found.add(field, format!("needs a kubelet ≥{since}; {kubelet} drops it"));
        }
    }
    found.0
}

#[derive(Default)]
struct Findings(Vec<Inadmissible>);

impl Findings {
    fn add(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.0.push(Inadmissible {
            field: field.into(),
            reason: reason.into(),
        });
    }

    fn finish(self) -> Result<(), Vec<Inadmissible>> {
        if self.0.is_empty() { Ok(()) } else { Err(self.0) }
    }
}

fn metadata(pod: &Pod, node: &str, found: &mut Findings) {
    let meta = &pod.metadata;
    match meta.name.as_deref() {
        None | Some("") => found.add("metadata.name", "Required value"),
        Some(name) => {
            let static_name = PodId::new("", name).static_pod_name(node);
            if !is_dns_subdomain(&static_name) {
                found.add(
                    "metadata.name",
                    format!(
                        "the static pod's name {static_name:?} ({} characters) is not a DNS-1123 subdomain of at most 253",
                        static_name.len()
                    ),
                );
            }
        }
    }
    // The kubelet puts a static pod without a namespace into `default`.
    if let Some(ns) = meta
        .namespace
        .as_deref()
        .filter(|ns| !ns.is_empty() && !is_dns_label(ns))
    {
        found.add(
            "metadata.namespace",
            format!("Invalid value: {ns:?}: not a DNS-1123 label"),
        );
    }
    for (key, value) in meta.labels.iter().flatten() {
        if let Err(why) = qualified_name(key) {
            found.add(format!("metadata.labels[{key:?}]"), why);
        }
        if !is_label_value(value) {
            found.add(
                format!("metadata.labels[{key:?}]"),
                format!("Invalid value: {value:?}: a label value has at most 63 characters, [-A-Za-z0-9_.], alphanumeric at both ends"),
            );
        }
    }
    let mut size = 0;
    for (key, value) in meta.annotations.iter().flatten() {
        if let Err(why) = qualified_name(key) {
            found.add(format!("metadata.annotations[{key:?}]"), why);
        }
        size += key.len() + value.len();
    }
    if size > ANNOTATIONS_MAX_BYTES {
        found.add(
            "metadata.annotations",
            format!("Too long: {size} bytes, at most {ANNOTATIONS_MAX_BYTES}"),
        );
    }
    for (i, owner) in meta.owner_references.iter().flatten().enumerate() {
        for (field, value) in [
            ("apiVersion", &owner.api_version),
            ("kind", &owner.kind),
            ("name", &owner.name),
            ("uid", &owner.uid),
        ] {
            if value.is_empty() {
                found.add(format!("metadata.ownerReferences[{i}].{field}"), "Required value");
            }
        }
    }
}

/// The volume names, after checking each volume.
fn volumes<'a>(volumes: &'a [k8s_openapi::api::core::v1::Volume], found: &mut Findings) -> BTreeSet<&'a str> {
    let mut names = BTreeSet::new();
    for (i, volume) in volumes.iter().enumerate() {
        let at = format!("spec.volumes[{i}]");
        if !is_dns_label(&volume.name) {
            found.add(
                format!("{at}.name"),
                format!("Invalid value: {:?}: not a DNS-1123 label", volume.name),
            );
        }
        if !names.insert(volume.name.as_str()) {
            found.add(
                format!("{at}.name"),
                format!("Duplicate value: {:?}", volume.name),
            );
        }
        let json = serde_json::to_value(volume).unwrap_or(Value::Null);
        let sources: Vec<&str> = VOLUME_SOURCES
            .iter()
            .copied()
            .filter(|s| !json[*s].is_null())
            .collect();
        // None is fine: the API's defaults (the kubelet applies them too) make it an emptyDir.
        match sources.len() {
            0 | 1 => {}
            _ => found.add(
                at.clone(),
                format!("may not specify more than 1 volume type: {}", sources.join(", ")),
            ),
        }
        if let Some(host_path) = &volume.host_path {
            if host_path.path.is_empty() {
                found.add(format!("{at}.hostPath.path"), "Required value");
            } else if has_backsteps(&host_path.path) {
                found.add(format!("{at}.hostPath.path"), "must not contain '..'");
            }
            if let Some(t) = host_path
                .type_
                .as_deref()
                .filter(|t| !HOST_PATH_TYPES.contains(t))
            {
                found.add(format!("{at}.hostPath.type"), format!("Unsupported value: {t:?}"));
            }
        }
    }
    names
}

/// A pod (not a template) may project a service-account token only with a service account
/// named: the API server names `default` on create, a static pod names none unless its
/// manifest does (ValidatePodCreate, every version from 1.20 to 1.37).
fn tokens_without_service_account(spec: &k8s_openapi::api::core::v1::PodSpec, found: &mut Findings) {
    if spec
        .service_account_name
        .as_deref()
        .is_some_and(|n| !n.is_empty())
    {
        return;
    }
    for (vi, volume) in spec.volumes.iter().flatten().enumerate() {
        let sources = volume.projected.iter().flat_map(|p| p.sources.iter().flatten());
        for (si, source) in sources.enumerate() {
            if source.service_account_token.is_some() {
                found.add(
                    format!("spec.volumes[{vi}].projected.sources[{si}].serviceAccountToken"),
                    "Forbidden: must not be specified when serviceAccountName is not set",
                );
            }
        }
    }
}

/// What a container's rules depend on besides the container: its pod and the kubelet.
#[derive(Clone, Copy)]
struct ContainerRules {
    host_network: bool,
    /// Env var names must be C identifiers (kubelets before 1.35).
    strict_env: bool,
    /// A host-network port mismatch is reported on `hostPort` (kubelets from 1.28).
    names_host_port: bool,
}

fn container(at: &str, c: &Container, volumes: &BTreeSet<&str>, rules: ContainerRules, found: &mut Findings) {
    if !is_dns_label(&c.name) {
        found.add(
            format!("{at}.name"),
            format!("Invalid value: {:?}: not a DNS-1123 label", c.name),
        );
    }
    if c.image.as_deref().is_none_or(str::is_empty) {
        found.add(format!("{at}.image"), "Required value");
    }
    let mut mount_paths = BTreeSet::new();
    for (i, mount) in c.volume_mounts.iter().flatten().enumerate() {
        let m = format!("{at}.volumeMounts[{i}]");
        if !volumes.contains(mount.name.as_str()) {
            found.add(format!("{m}.name"), format!("Not found: {:?}", mount.name));
        }
        if mount.mount_path.is_empty() {
            found.add(format!("{m}.mountPath"), "Required value");
        } else if !mount_paths.insert(mount.mount_path.as_str()) {
            found.add(
                format!("{m}.mountPath"),
                format!("must be unique: {:?}", mount.mount_path),
            );
        }
        if let Some(sub) = mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
            if sub.starts_with('/') {
                found.add(format!("{m}.subPath"), "must be a relative path");
            } else if has_backsteps(sub) {
                found.add(format!("{m}.subPath"), "must not contain '..'");
            }
        }
    }
    for (i, env) in c.env.iter().flatten().enumerate() {
        let ok = if rules.strict_env {
            is_c_identifier_like(&env.name)
        } else {
            is_relaxed_env_name(&env.name)
        };
        if !ok {
            found.add(
                format!("{at}.env[{i}].name"),
                format!(
                    "Invalid value: {:?}: not a valid environment variable name",
                    env.name
                ),
            );
        }
    }
    let mut port_names = BTreeSet::new();
    for (i, port) in c.ports.iter().flatten().enumerate() {
        let p = format!("{at}.ports[{i}]");
        if !(1..=65535).contains(&port.container_port) {
            found.add(
                format!("{p}.containerPort"),
                format!(
                    "Invalid value: {}: must be between 1 and 65535",
                    port.container_port
                ),
            );
        }
        if let Some(host_port) = port.host_port {
            if !(0..=65535).contains(&host_port) {
                found.add(
                    format!("{p}.hostPort"),
                    format!("Invalid value: {host_port}: must be between 0 and 65535"),
                );
            } else if rules.host_network && host_port != 0 && host_port != port.container_port {
                if rules.names_host_port {
                    found.add(
                        format!("{p}.hostPort"),
                        "must match containerPort when hostNetwork is true",
                    );
                } else {
                    found.add(
                        format!("{p}.containerPort"),
                        "must match hostPort when hostNetwork is true",
                    );
                }
            }
        }
        if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            if !is_port_name(name) {
                found.add(
                    format!("{p}.name"),
                    format!("Invalid value: {name:?}: not an IANA service name"),
                );
            } else if !port_names.insert(name) {
                found.add(format!("{p}.name"), format!("Duplicate value: {name:?}"));
            }
        }
        if let Some(protocol) = port
            .protocol
            .as_deref()
            .filter(|p| !["TCP", "UDP", "SCTP"].contains(p))
        {
            found.add(
                format!("{p}.protocol"),
                format!("Unsupported value: {protocol:?}"),
            );
        }
    }
    for (name, probe) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ] {
        if let Some(probe) = probe {
            let handlers = probe_handlers(probe);
            if handlers != 1 {
                found.add(
                    format!("{at}.{name}"),
                    format!("must have exactly one handler, has {handlers}"),
                );
            }
        }
    }
}

fn probe_handlers(probe: &Probe) -> usize {
    [
        probe.exec.is_some(),
        probe.http_get.is_some(),
        probe.tcp_socket.is_some(),
        probe.grpc.is_some(),
    ]
    .into_iter()
    .filter(|&h| h)
    .count()
}

/// Whether a path has a `..` element (the API's `validatePathNoBacksteps`).
fn has_backsteps(path: &str) -> bool {
    path.split('/').any(|part| part == "..")
}

/// A label or annotation key: `[prefix/]name`, the prefix a DNS-1123 subdomain, the name
/// at most 63 characters of `[-A-Za-z0-9_.]`, alphanumeric at both ends.
fn qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && (prefix.is_empty() || !is_dns_subdomain(prefix))
    {
        return Err(format!(
            "Invalid value: {key:?}: the prefix must be a DNS-1123 subdomain"
        ));
    }
    if name.is_empty() || name.len() > 63 || !is_label_value(name) {
        return Err(format!(
            "Invalid value: {key:?}: the name part must have 1 to 63 characters, [-A-Za-z0-9_.], alphanumeric at both ends"
        ));
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters of `[-A-Za-z0-9_.]`, alphanumeric at
/// both ends.
fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    value.len() <= 63
        && match (bytes.first(), bytes.last()) {
            (None, _) | (_, None) => true,
            (Some(first), Some(last)) => {
                alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || b"-_.".contains(b))
            }
        }
}

/// `[-._a-zA-Z][-._a-zA-Z0-9]*`, what kubelets before 1.35 accept as an env var name.
fn is_c_identifier_like(name: &str) -> bool {
    let bytes = name.as_bytes();
    let ok = |b: &u8| b.is_ascii_alphanumeric() || b"-._".contains(b);
    bytes.first().is_some_and(|b| !b.is_ascii_digit() && ok(b)) && bytes.iter().all(ok)
}

/// Printable ASCII except `=`, what later kubelets accept.
fn is_relaxed_env_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'=')
}

/// An IANA service name: at most 15 characters of `[-a-z0-9]`, at least one letter, no
/// hyphen at either end or twice in a row.
fn is_port_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    name.len() <= 15
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.iter().any(u8::is_ascii_lowercase)
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

/// The concrete paths of `path` (`[]`: every item) that hold a value in `json`; an empty
/// list or object counts as absent, like an unset field.
fn present(json: &Value, path: &str) -> Vec<String> {
    let mut at = vec![(String::new(), json)];
    for segment in path.split('.') {
        let (key, every) = match segment.strip_suffix("[]") {
            Some(key) => (key, true),
            None => (segment, false),
        };
        let mut next = Vec::new();
        for (prefix, value) in at {
            let field = if prefix.is_empty() {
                key.to_owned()
            } else {
                format!("{prefix}.{key}")
            };
            let Some(child) = value.get(key) else { continue };
            if every {
                for (i, item) in child.as_array().into_iter().flatten().enumerate() {
                    next.push((format!("{field}[{i}]"), item));
                }
            } else {
                next.push((field, child));
            }
        }
        at = next;
    }
    at.into_iter()
        .filter(|(_, v)| match v {
            Value::Null => false,
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
            _ => true,
        })
        .map(|(field, _)| field)
        .collect()
}

#[cfg(test)]
mod tests;
