//! The local admission check (`ckpt_core::admit`) against its references: the real API
//! server's validation, and the real kubelet.
//!
//! The kubelet validates a static pod as the API server validates a pod create. Two
//! parents, as the API server stores them (a `dryRun` create, with its defaults and
//! admission), are sanitized as the agent does; their checkpoints must be admitted and
//! accepted. Then each case breaks one rule of the first checkpoint (or none). Every
//! manifest is created with `dryRun` as the kubelet names it (`<name>-<node>`): `admit` for
//! the plane's release must give the API server's verdict, and a refusal must name a field
//! the API server's message names too ([`agrees_with_the_api_server`]).
//!
//! What only the kubelet judges (from 1.34 it refuses static pods that reference API
//! objects, which the API server accepts) is judged by the real node's kubelet: the same
//! manifests, plus references the sanitizer cannot inline, are written into its manifest
//! dir, and each is either run (listed on its read-only port) or refused (its log names the
//! file); `admit` must give the same verdict ([`agrees_with_the_kubelet`]).

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use ckpt_core::{ApiObjects, Inadmissible, KubeletVersion, SanitizeOptions, Timestamp, admit, sanitize};
use ckpt_e2e::command::run_command;
use ckpt_e2e::e2e_env::{NODE_NAME, Release};
use ckpt_e2e::harness::kubectl::Kubectl;
use ckpt_e2e::wait::{Probe, wait_for};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use serde_json::{Value, json};

use crate::real_node::{NodeRun, write_manifest};
use crate::suite::Scenario;

/// The Secret and ConfigMap the parents use.
fn api_objects(ns: &str) -> anyhow::Result<ApiObjects> {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "admission-certs", "namespace": ns },
        "data": { "tls.crt": "Y2VydA==", "tls.key": "a2V5" }
    }))?;
    let config: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "admission-config", "namespace": ns },
        "data": { "etcd-servers": "https://127.0.0.1:2379", "log-level": "2" }
    }))?;
    let mut objects = ApiObjects::default();
    objects.secrets.insert("admission-certs".into(), secret.into());
    objects
        .config_maps
        .insert("admission-config".into(), config.into());
    Ok(objects)
}

/// A host-network API server and a pod-network scheduler, with what sanitization rewrites:
/// Secret and projected volumes, env from a ConfigMap, named ports in probes.
fn parents(ns: &str) -> [Value; 2] {
    let checkpointed = json!({ "checkpointer.alpha.coreos.com/checkpoint": "true" });
    [
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "kube-apiserver-x7k2p",
                "namespace": ns,
                "labels": { "k8s-app": "kube-apiserver", "tier": "control-plane" },
                "annotations": checkpointed
            },
            "spec": {
                "nodeName": NODE_NAME,
                // A plane with ServiceAccount admission would add a token volume and the
                // kube-root-ca.crt ConfigMap, which the sanitizer needs to find.
                "automountServiceAccountToken": false,
                "hostNetwork": true,
                "containers": [{
                    "name": "kube-apiserver",
                    "image": "localhost/kube-control-plane:v1.20.2",
                    "command": ["kube-apiserver", "--secure-port=6443"],
                    "env": [
                        { "name": "ETCD_SERVERS", "valueFrom": { "configMapKeyRef": { "name": "admission-config", "key": "etcd-servers" } } },
                        { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } }
                    ],
                    "envFrom": [{ "configMapRef": { "name": "admission-config" }, "prefix": "CFG_" }],
                    "ports": [{ "name": "https", "containerPort": 6443 }],
                    "livenessProbe": { "httpGet": { "path": "/livez", "port": "https", "scheme": "HTTPS" } },
                    "volumeMounts": [
                        { "name": "certs", "mountPath": "/etc/kubernetes/secrets" },
                        { "name": "bundle", "mountPath": "/etc/kubernetes/bundle" }
                    ]
                }],
                "volumes": [
                    { "name": "certs", "secret": { "secretName": "admission-certs" } },
                    { "name": "bundle", "projected": { "sources": [
                        { "secret": { "name": "admission-certs", "items": [{ "key": "tls.crt", "path": "tls.crt" }] } },
                        { "configMap": { "name": "admission-config" } },
                        { "downwardAPI": { "items": [{ "path": "labels", "fieldRef": { "fieldPath": "metadata.labels" } }] } }
                    ] } }
                ]
            }
        }),
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "kube-scheduler-5d8f9",
                "namespace": ns,
                "labels": { "k8s-app": "kube-scheduler" },
                "annotations": checkpointed
            },
            "spec": {
                "nodeName": NODE_NAME,
                "automountServiceAccountToken": false,
                "containers": [{
                    "name": "kube-scheduler",
                    "image": "localhost/kube-control-plane:v1.20.2",
                    "ports": [{ "name": "metrics", "containerPort": 10259 }],
                    "readinessProbe": { "tcpSocket": { "port": "metrics" } },
                    "volumeMounts": [
                        { "name": "kubeconfig", "mountPath": "/etc/kubernetes/kubeconfig" },
                        { "name": "tmp", "mountPath": "/tmp" }
                    ]
                }],
                "volumes": [
                    { "name": "kubeconfig", "secret": { "secretName": "admission-certs", "defaultMode": 0o400 } },
                    { "name": "tmp", "emptyDir": {} }
                ]
            }
        }),
    ]
}

/// Each parent as the API server would store it (a `dryRun` create), sanitized.
fn sanitized_parents(kubectl: &Kubectl, ns: &str) -> anyhow::Result<Vec<(String, Value)>> {
    let objects = api_objects(ns)?;
    let options = SanitizeOptions {
        checkpoint_dir: "/etc/kubernetes/checkpoint".into(),
        checkpointed_at: Timestamp::now(),
    };
    parents(ns)
        .into_iter()
        .map(|parent| {
            let stored = kubectl.run(
                &["create", "--dry-run=server", "-f", "-", "-o", "json"],
                Some(&parent.to_string()),
            )?;
            let pod: Pod = serde_json::from_str(&stored).context("the stored pod")?;
            let name = pod.metadata.name.clone().unwrap_or_default();
            let sanitized = sanitize(&pod, &objects, &options)
                .with_context(|| format!("sanitizing {name} as the API server stores it"))?;
            Ok((name, serde_json::to_value(&sanitized.checkpoint.manifest)?))
        })
        .collect()
}

type Edit = fn(&mut Value);

/// One rule of the API server's checkpoint broken per case (or none, where the API's
/// defaults make a manifest valid).
const CASES: &[(&str, Edit)] = &[
    ("name too long once the node's is appended", |p| {
        p["metadata"]["name"] = json!("a".repeat(254 - NODE_NAME.len() - 1));
    }),
    ("longest name that fits", |p| {
        p["metadata"]["name"] = json!("a".repeat(253 - NODE_NAME.len() - 1));
    }),
    ("container name not a DNS label", |p| {
        p["spec"]["containers"][0]["name"] = json!("Kube_APIServer");
    }),
    ("an init container named like a container", |p| {
        p["spec"]["initContainers"] = json!([{ "name": "kube-apiserver", "image": "busybox" }]);
    }),
    ("volume name not a DNS label", |p| {
        p["spec"]["volumes"][0]["name"] = json!("certs.d");
        p["spec"]["containers"][0]["volumeMounts"][0]["name"] = json!("certs.d");
    }),
    ("two volumes of one name", |p| {
        let volume = p["spec"]["volumes"][0].clone();
        if let Some(volumes) = p["spec"]["volumes"].as_array_mut() {
            volumes.push(volume);
        }
    }),
    ("a mount without its volume", |p| p["spec"]["volumes"] = json!([])),
    ("two volume sources", |p| {
        p["spec"]["volumes"][0]["emptyDir"] = json!({})
    }),
    ("no volume source (the defaults make it an emptyDir)", |p| {
        p["spec"]["volumes"][0] = json!({ "name": "certs" })
    }),
    ("hostPath with ..", |p| {
        p["spec"]["volumes"][0]["hostPath"]["path"] = json!("/etc/kubernetes/../x");
    }),
    ("hostPath of an unknown type", |p| {
        p["spec"]["volumes"][0]["hostPath"]["type"] = json!("Dir");
    }),
    ("hostPath of a known type", |p| {
        p["spec"]["volumes"][0]["hostPath"]["type"] = json!("DirectoryOrCreate");
    }),
    ("empty mountPath", |p| {
        p["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] = json!("");
    }),
    ("one mountPath twice", |p| {
        let mount = p["spec"]["containers"][0]["volumeMounts"][0].clone();
        if let Some(mounts) = p["spec"]["containers"][0]["volumeMounts"].as_array_mut() {
            mounts.push(mount);
        }
    }),
    ("absolute subPath", |p| {
        p["spec"]["containers"][0]["volumeMounts"][0]["subPath"] = json!("/etc");
    }),
    ("subPath with ..", |p| {
        p["spec"]["containers"][0]["volumeMounts"][0]["subPath"] = json!("a/../b");
    }),
    ("relative subPath", |p| {
        p["spec"]["containers"][0]["volumeMounts"][0]["subPath"] = json!("tls/crt");
    }),
    ("no image", |p| p["spec"]["containers"][0]["image"] = json!("")),
    ("containerPort 0", |p| {
        p["spec"]["containers"][0]["ports"] = json!([{ "containerPort": 0 }]);
    }),
    ("hostPort unlike containerPort on the host network", |p| {
        p["spec"]["containers"][0]["ports"] = json!([{ "containerPort": 6443, "hostPort": 443 }]);
    }),
    ("hostPort equal to containerPort", |p| {
        p["spec"]["containers"][0]["ports"] = json!([{ "containerPort": 6443, "hostPort": 6443 }]);
    }),
    ("port name longer than 15", |p| {
        let port = json!({ "name": "kube-apiserver-https", "containerPort": 6443 });
        p["spec"]["containers"][0]["ports"] = json!([port]);
    }),
    ("two ports of one name", |p| {
        let ports =
            json!([{ "name": "https", "containerPort": 6443 }, { "name": "https", "containerPort": 8443 }]);
        p["spec"]["containers"][0]["ports"] = ports;
    }),
    ("unknown protocol", |p| {
        p["spec"]["containers"][0]["ports"] = json!([{ "containerPort": 6443, "protocol": "HTTP" }]);
    }),
    ("env name starting with a digit", |p| {
        p["spec"]["containers"][0]["env"][0]["name"] = json!("1ST");
    }),
    ("env name with dots and dashes", |p| {
        p["spec"]["containers"][0]["env"][0]["name"] = json!("my.var-1");
    }),
    ("a probe with two handlers", |p| {
        p["spec"]["containers"][0]["livenessProbe"]["tcpSocket"] = json!({ "port": 6443 });
    }),
    ("unknown restartPolicy", |p| {
        p["spec"]["restartPolicy"] = json!("Sometimes")
    }),
    ("unknown dnsPolicy", |p| p["spec"]["dnsPolicy"] = json!("Cluster")),
    ("label value with a space", |p| {
        p["metadata"]["labels"]["tier"] = json!("control plane");
    }),
    ("label key with a bad prefix", |p| {
        p["metadata"]["labels"]["Bad_Prefix/x"] = json!("y");
    }),
    ("empty label value", |p| {
        p["metadata"]["labels"]["tier"] = json!("")
    }),
    ("annotations over 256 KiB", |p| {
        p["metadata"]["annotations"]["big"] = json!("x".repeat(256 * 1024));
    }),
    ("owner reference without a uid", |p| {
        p["metadata"]["ownerReferences"][0]["uid"] = json!("");
    }),
];

/// What only the kubelet judges: references to API objects that the sanitizer would inline
/// or cannot (a kubelet from 1.34 on refuses each; the API server accepts them all).
const KUBELET_CASES: &[(&str, Edit)] = &[
    ("a serviceAccountName", |p| {
        p["spec"]["serviceAccountName"] = json!("default")
    }),
    ("an imagePullSecret", |p| {
        p["spec"]["imagePullSecrets"] = json!([{ "name": "registry" }])
    }),
    (
        "a Secret volume",
        |p| {
            p["spec"]["volumes"][0] =
                json!({ "name": "certs", "secret": { "secretName": "admission-certs" } })
        },
    ),
    ("a ConfigMap in env", |p| {
        let from = json!({ "configMapKeyRef": { "name": "admission-config", "key": "log-level" } });
        p["spec"]["containers"][0]["env"] = json!([{ "name": "LOG_LEVEL", "valueFrom": from }]);
    }),
    ("a projected service-account token", |p| {
        let token = json!({ "serviceAccountToken": { "path": "token", "expirationSeconds": 3600 } });
        p["spec"]["volumes"][0] = json!({ "name": "certs", "projected": { "sources": [token] } });
    }),
    (
        "a PersistentVolumeClaim",
        |p| {
            p["spec"]["volumes"][0] =
                json!({ "name": "certs", "persistentVolumeClaim": { "claimName": "data" } })
        },
    ),
    (
        "a CSI volume",
        |p| {
            p["spec"]["volumes"][0] =
                json!({ "name": "certs", "csi": { "driver": "secrets-store.csi.k8s.io" } })
        },
    ),
];

/// The two parents' checkpoints, then the first one with each of `cases` applied.
fn judged_manifests(
    kubectl: &Kubectl,
    ns: &str,
    cases: &[&[(&str, Edit)]],
) -> anyhow::Result<Vec<(String, Value)>> {
    let sanitized = sanitized_parents(kubectl, ns)?;
    let base = sanitized[0].1.clone();
    Ok((sanitized.into_iter())
        .map(|(name, manifest)| (format!("the checkpoint of {name}"), manifest))
        .chain(cases.iter().copied().flatten().map(|(what, edit)| {
            let mut manifest = base.clone();
            edit(&mut manifest);
            ((*what).to_owned(), manifest)
        }))
        .collect())
}

/// The kubelet of the plane's release: admit's version rules (relaxed env names from 1.32,
/// API references from 1.34, say) are judged by the release they were written for.
fn plane_kubelet() -> anyhow::Result<(Release, KubeletVersion)> {
    let release = Release::from_env()?;
    let version = release.name().parse().map_err(anyhow::Error::msg)?;
    Ok((release, version))
}

pub(crate) fn agrees_with_the_api_server(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    ctx.step("sanitize two parents as the API server stores them");
    let manifests = judged_manifests(&ctx.suite.kubectl, &ctx.ns, &[CASES])?;
    let (release, kubelet_version) = plane_kubelet()?;
    ctx.step(&format!(
        "{} manifests: admit (kubelet {kubelet_version}) against the {release} API server's dry-run create",
        manifests.len()
    ));
    let kubelet = Some(kubelet_version);
    let mut refused = 0;
    let mut kubelet_alone = 0;
    let mut disagreements = Vec::new();
    for (what, manifest) in &manifests {
        let pod: Pod = serde_json::from_value(manifest.clone())?;
        let verdict = admit(&pod, NODE_NAME, kubelet);

        // What the kubelet hands to validation: the pod under its name for it, bound to the
        // node; marked as a mirror pod, so that admission plugins (service accounts) leave
        // it alone.
        let mut as_kubelet_names_it = manifest.clone();
        let name = as_kubelet_names_it["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        as_kubelet_names_it["metadata"]["name"] = json!(format!("{name}-{NODE_NAME}"));
        as_kubelet_names_it["metadata"]["annotations"]["kubernetes.io/config.mirror"] = json!("e2e");
        as_kubelet_names_it["spec"]["nodeName"] = json!(NODE_NAME);
        let api = ctx.suite.kubectl.run(
            &[
                "create",
                "--dry-run=server",
                "--validate=false",
                "-f",
                "-",
                "-o",
                "name",
            ],
            Some(&as_kubelet_names_it.to_string()),
        );
        if what.starts_with("the checkpoint of ") && verdict.is_err() {
            disagreements.push(format!("{what} as sanitized must run: {verdict:?}"));
        }
        let agreed = match (&verdict, &api) {
            (Ok(()), Ok(_)) => true,
            (Err(problems), Ok(_)) if kubelet_alone_refuses(kubelet_version, problems) => {
                kubelet_alone += 1;
                true
            }
            (Err(problems), Err(message)) => {
                refused += 1;
                let message = without_selectors(&format!("{message:#}"));
                let named = problems
                    .iter()
                    .any(|p| message.contains(&without_selectors(&p.field)));
                if !named {
                    disagreements.push(format!(
                        "{what}: both refuse, but the API server names none of {problems:?}: {message}"
                    ));
                }
                named
            }
            _ => {
                disagreements.push(format!(
                    "{what}: admit says {verdict:?}, the API server {}",
                    api.as_ref()
                        .map_or_else(|e| format!("refuses: {e:#}"), |_| "accepts".to_owned())
                ));
                false
            }
        };
        print_row(what, verdict.is_ok(), agreed, "API server");
    }
    anyhow::ensure!(
        disagreements.is_empty(),
        "admit and the API server disagree:\n{}",
        disagreements.join("\n")
    );
    ctx.step(&format!(
        "admit agrees with the API server on all {} manifests ({refused} refused; {kubelet_alone} \
         refused by the kubelet alone, which the real-node scenario judges)",
        manifests.len()
    ));
    Ok(())
}

/// Whether every rule `admit` found broken is one the kubelet of `version` applies to a
/// static pod while its API server does not: before 1.35 the kubelet validates a manifest
/// file with the strict env name rule, the API server with the relaxed one from 1.32. The
/// real kubelet's verdict on those is checked by [`agrees_with_the_kubelet`].
fn kubelet_alone_refuses(version: KubeletVersion, problems: &[Inadmissible]) -> bool {
    version >= KubeletVersion::new(1, 32)
        && version < KubeletVersion::RELAXED_ENV_NAMES
        && problems
            .iter()
            .all(|p| p.field.contains(".env[") && p.field.ends_with("].name"))
}

/// One manifest's line: admit's verdict, and whether `judge` agreed.
fn print_row(what: &str, admitted: bool, agreed: bool, judge: &str) {
    eprintln!(
        "    {:<52} {:<8} {} {judge}",
        what,
        if admitted { "admitted" } else { "refused" },
        if agreed { "=" } else { "≠" }
    );
}

/// `text` without the index and map-key selectors of field paths (`[0]`, `["tier"]`): the
/// API server writes some paths without them (`metadata.ownerReferences.uid`,
/// `metadata.labels`). Other brackets (the API server's list of errors) stay.
fn without_selectors(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let selector = after.find(']').map(|close| &after[..close]).filter(|inside| {
            let quoted = inside.len() >= 2 && inside.starts_with('"') && inside.ends_with('"');
            quoted || (!inside.is_empty() && inside.bytes().all(|b| b.is_ascii_digit()))
        });
        match selector {
            Some(inside) => rest = &after[inside.len() + 1..],
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The namespace of the kubelet scenario's manifests (the dry-run creates need it).
const KUBELET_NAMESPACE: &str = "e2e-admission";
/// The manifests' file names in the node's manifest dir: `admission-NN.json`.
const KUBELET_FILE_PREFIX: &str = "admission-";

/// How the real kubelet judged one manifest.
#[derive(Debug)]
enum KubeletVerdict {
    /// Its pod is listed on the read-only port.
    Runs,
    /// Its log names the file, with this message.
    Refuses(String),
}

pub(crate) fn agrees_with_the_kubelet(run: &mut NodeRun) -> anyhow::Result<()> {
    let (release, kubelet_version) = plane_kubelet()?;
    let kubectl = &run.kubectl;
    kubectl.run(&["create", "namespace", KUBELET_NAMESPACE], None)?;
    let result = judge_on_the_node(run, release, kubelet_version);
    let cleaned = clean_up_the_node(run);
    // The mirror pods of static pods that are gone: 1.20's kubelet leaves them Terminating
    // once their namespace is being deleted, which then never finishes.
    run.kubectl.run(
        &[
            "delete",
            "pods",
            "--all",
            "-n",
            KUBELET_NAMESPACE,
            "--force",
            "--grace-period=0",
        ],
        None,
    )?;
    run.kubectl.run(
        &[
            "delete",
            "namespace",
            KUBELET_NAMESPACE,
            "--wait=true",
            "--timeout=120s",
        ],
        None,
    )?;
    result.and(cleaned)
}

fn judge_on_the_node(run: &NodeRun, release: Release, kubelet_version: KubeletVersion) -> anyhow::Result<()> {
    let mut manifests = judged_manifests(&run.kubectl, KUBELET_NAMESPACE, &[CASES, KUBELET_CASES])?;
    let base_name = manifests[0].1["metadata"]["name"].clone();
    // One name per manifest (the kubelet refuses a second pod of the same name), unless
    // the case is about the name.
    for (i, (_, manifest)) in manifests.iter_mut().enumerate() {
        if manifest["metadata"]["name"] == base_name {
            manifest["metadata"]["name"] = json!(format!("adm-{i:02}"));
        }
    }
    run.progress.say(&format!(
        "{} manifests into the {release} kubelet's manifest dir, and admit (kubelet {kubelet_version}) on each",
        manifests.len()
    ));
    let log = run.node.kubelet_log();
    let log_offset = fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let dir = run.node.manifests_dir();
    for (i, (_, manifest)) in manifests.iter().enumerate() {
        write_manifest(&dir, &format!("{KUBELET_FILE_PREFIX}{i:02}"), manifest)?;
    }
    let pods_url = format!("{}/pods", run.node.kubelet_read_only_url());
    let (verdicts, _) = wait_for(
        "the kubelet to run or refuse every manifest",
        Duration::from_secs(120),
        || {
            let listed = kubelet_pod_names(&pods_url)?;
            let logged = fs::read(&log).unwrap_or_default();
            let logged = String::from_utf8_lossy(logged.get(log_offset as usize..).unwrap_or_default());
            let verdicts: Vec<Option<KubeletVerdict>> = (manifests.iter().enumerate())
                .map(|(i, (_, manifest))| {
                    let name = manifest["metadata"]["name"].as_str().unwrap_or_default();
                    if listed.contains(&format!("{KUBELET_NAMESPACE}/{name}-{NODE_NAME}")) {
                        return Some(KubeletVerdict::Runs);
                    }
                    refusal(&logged, &format!("{KUBELET_FILE_PREFIX}{i:02}.json"))
                        .map(KubeletVerdict::Refuses)
                })
                .collect();
            let undecided = verdicts.iter().filter(|v| v.is_none()).count();
            Ok(if undecided == 0 {
                Probe::Ready(verdicts.into_iter().flatten().collect::<Vec<_>>())
            } else {
                Probe::Waiting(format!("{undecided} manifest(s) neither run nor refused"))
            })
        },
    )?;
    let mut disagreements = Vec::new();
    let mut refused = 0;
    for ((what, manifest), kubelet) in manifests.iter().zip(&verdicts) {
        let pod: Pod = serde_json::from_value(manifest.clone())?;
        let verdict = admit(&pod, NODE_NAME, Some(kubelet_version));
        if what.starts_with("the checkpoint of ") && !matches!(kubelet, KubeletVerdict::Runs) {
            disagreements.push(format!("{what}: the kubelet must run it: {kubelet:?}"));
        }
        let agreed = match (&verdict, kubelet) {
            (Ok(()), KubeletVerdict::Runs) => true,
            (Err(problems), KubeletVerdict::Refuses(message)) => {
                refused += 1;
                let message = without_selectors(message);
                // A reference is refused as `static pods may not reference <resource>`;
                // anything else as validation, naming the field.
                let resource = message
                    .split("may not reference ")
                    .nth(1)
                    .and_then(|rest| rest.split(|c: char| !c.is_ascii_alphanumeric()).next());
                let named = problems.iter().any(|p| {
                    message.contains(&without_selectors(&p.field))
                        || resource.is_some_and(|r| p.reason.contains(&format!("references {r}")))
                });
                if !named {
                    disagreements.push(format!(
                        "{what}: both refuse, but the kubelet names none of {problems:?}: {message}"
                    ));
                }
                named
            }
            _ => {
                disagreements.push(format!("{what}: admit says {verdict:?}, the kubelet {kubelet:?}"));
                false
            }
        };
        print_row(what, verdict.is_ok(), agreed, "kubelet");
    }
    anyhow::ensure!(
        disagreements.is_empty(),
        "admit and the kubelet disagree:\n{}",
        disagreements.join("\n")
    );
    run.progress.say(&format!(
        "admit agrees with the {release} kubelet on all {} manifests ({refused} refused)",
        manifests.len()
    ));
    Ok(())
}

/// `namespace/name` of every pod the kubelet lists on its read-only port.
fn kubelet_pod_names(url: &str) -> anyhow::Result<Vec<String>> {
    let body = run_command(Command::new("curl").args(["-sf", "--max-time", "5", url]))?;
    let pods: Value = serde_json::from_str(&body).context("the kubelet's /pods")?;
    Ok(pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|pod| {
            let meta = &pod["metadata"];
            format!(
                "{}/{}",
                meta["namespace"].as_str().unwrap_or_default(),
                meta["name"].as_str().unwrap_or_default()
            )
        })
        .collect())
}

/// The kubelet's last complaint about manifest `file` in `log`: 1.20 writes
/// `Can't process manifest file "<path>": <error>`, 1.37 `"Could not process manifest
/// file" err="<error>" path="<path>"`.
fn refusal(log: &str, file: &str) -> Option<String> {
    let path = Path::new(ckpt_e2e::e2e_env::real_node::MANIFESTS_DIR).join(file);
    let path = path.display().to_string();
    log.lines()
        .rev()
        .find(|line| line.contains("process manifest file") && line.contains(&path))
        .map(str::to_owned)
}

/// Removes the manifests and waits until the kubelet has let their pods go.
fn clean_up_the_node(run: &NodeRun) -> anyhow::Result<()> {
    let dir = run.node.manifests_dir();
    for entry in fs::read_dir(&dir)?.flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(KUBELET_FILE_PREFIX)
        {
            fs::remove_file(entry.path())?;
        }
    }
    let pods_url = format!("{}/pods", run.node.kubelet_read_only_url());
    wait_for(
        "the kubelet to let the manifests' pods go",
        Duration::from_secs(120),
        || {
            let left = kubelet_pod_names(&pods_url)?
                .into_iter()
                .filter(|name| name.starts_with(&format!("{KUBELET_NAMESPACE}/")))
                .count();
            Ok(if left == 0 {
                Probe::Ready(())
            } else {
                Probe::Waiting(format!("{left} pod(s) left"))
            })
        },
    )?;
    Ok(())
}
