//! The Helm chart (`charts/pod-checkpointer`) renders what `pod-checkpointer render` renders
//! for the same settings: for each row of a table of flags, `helm template` with the values
//! those flags map to gives the same objects (compared as data, not text: comments and
//! field order aside), the config hash on the pod template included; and what render
//! refuses, the chart refuses. `helm lint --strict` passes, the chart's version is the
//! agent's, and its package (as `cargo xtask release` writes it, the image pinned) templates
//! what render renders for that image. helm is built from its Go module (`go/helm-4.3`) into
//! the e2e cache on first use (`ckpt_e2e::e2e_env::modules::helm`).
//!
//! `test = false`: it runs in its own phase of `cargo xtask test` (it may build helm, a few
//! minutes the first time).

use std::path::{Path, PathBuf};
use std::process::Command;

use ckpt_bin::render::BuiltInOptions as _;
use ckpt_e2e::chart::{self, Objects};
use ckpt_render::{AgentChecks as _, DEFAULT_IMAGE, KubernetesVersion, ManifestArgs, render};
use clap::Parser;
use serde_json::{Value, json};

/// `pod-checkpointer render`'s flags, parsed as the binary parses them.
#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    args: ManifestArgs,
}

/// Rows render accepts: the chart must render the same objects.
const SAME: &[&[&str]] = &[
    &[],
    &[
        "--namespace",
        "pod-checkpointer",
        "--namespaces",
        "monitoring,kube-system, ,ops",
    ],
    &[
        "--gc-strategy",
        "owner-reference",
        "--grace-period",
        "5m",
        "--revisions",
        "1",
    ],
    &["--handoff-timeout", "1h30m", "--checkpoint-grace-period", "0"],
    &[
        "--image",
        "registry.example/pod-checkpointer@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ],
    &["--image", " registry.example/pod-checkpointer:dev "],
    &[
        "--runtime-endpoint",
        "",
        "--kubelet-ca",
        "/etc/kubernetes/pki/kubelet-ca.crt",
    ],
    &[
        "--runtime-endpoint",
        "",
        "--kubelet-insecure",
        "--kubernetes-version",
        "1.32",
    ],
    &[
        "--runtime-endpoint",
        "unix:///var/run/crio/crio.sock",
        "--manifests-dir",
        "/srv/manifests",
    ],
    &["--lock-file", "/var/run/lock/pod-checkpointer.lock"],
    &["--prometheus"],
    &[
        "--prometheus",
        "--prometheus-port",
        "9100",
        "--metrics-port",
        "10300",
        "--namespace",
        "monitoring",
    ],
    &["--api-server", "in-cluster"],
    &["--api-server", "https://10.0.0.1:6443//", "--api-server-name", ""],
    &[
        "--api-server",
        "https://api.example:443/",
        "--api-server-name",
        "api.example",
    ],
    &["--kubernetes-version", "1.20"],
    &["--kubernetes-version", "v1.24.3"],
    &[
        "--bind-user",
        "zeta",
        "--bind-user",
        "alpha",
        "--bind-user",
        "zeta",
    ],
    &[
        "--node-label",
        "node.kubernetes.io/controller=true",
        "--node-label",
        "example.com/etcd",
    ],
    &[
        "--node-label",
        "role=",
        "--node-label",
        "a.b/c_d.e=x-y",
        "--only-node-labels",
    ],
    &["--priority-class", ""],
    &["--priority-class", "cluster-critical-plus"],
    &[
        "--image-pull-secret",
        "regcred",
        "--image-pull-secret",
        "a-cred",
        "--image-pull-secret",
        "regcred",
    ],
    &["--memory-limit", "256Mi"],
    &["--memory-limit", "32Mi"],
    &["--memory-limit", "1G"],
    &["--log-format", "json", "--log-level", "info,ckpt_watch=debug"],
    &["--log-level", "debug"],
    &["--namespaces", "true,123", "--log-level", "yes"],
    &["--namespace", "123"],
];

/// Rows render refuses: the chart must refuse them too.
const REFUSED: &[&[&str]] = &[
    &["--gc-strategy", "keep-nothing"],
    &["--namespaces", "Not_A_Namespace"],
    &["--namespace", "UPPER"],
    &["--grace-period", "5 minutes"],
    &["--handoff-timeout", "1.5m"],
    &["--revisions", "0"],
    &["--image", "registry.example/pod-checkpointer@sha256:abc"],
    &["--image", "a b"],
    &["--manifests-dir", "etc/kubernetes/manifests"],
    &["--lock-file", "/pod-checkpointer.lock"],
    &["--lock-file", "run/x.lock"],
    &["--runtime-endpoint", "tcp://127.0.0.1:1234"],
    &["--runtime-endpoint", "unix:///containerd.sock"],
    &["--runtime-endpoint", ""],
    &["--runtime-endpoint", "", "--kubelet-ca", "ca.crt"],
    &["--runtime-endpoint", "", "--kubelet-ca", "/ca.crt"],
    &["--kubelet-insecure"],
    &["--api-server", "http://127.0.0.1:8080"],
    &["--api-server", "https://"],
    &["--node-label=-bad-"],
    &["--node-label", "a=b c"],
    &["--node-label", "Not_A_Domain/x"],
    &["--priority-class", "Not-Valid"],
    &["--image-pull-secret", "Bad_Secret"],
    &["--memory-limit", "16Mi"],
    &["--memory-limit", "lots"],
    &["--memory-limit", "1.5Gi"],
    &["--log-level", " "],
];

/// Values no flags map to (render's parser refuses them first), each with what the chart
/// must refuse it for.
const VALUES_REFUSED: &[(&str, &str)] = &[
    (r#"{"kubernetesVersion": "1"}"#, "invalid Kubernetes version"),
    (
        r#"{"kubernetesVersion": "one.two"}"#,
        "invalid Kubernetes version",
    ),
    (r#"{"logFormat": "xml"}"#, "logFormat"),
    (r#"{"onlyNodeLabels": true}"#, "onlyNodeLabels needs at least one"),
    (r#"{"revisions": -1}"#, "-1 would keep no checkpoint"),
    (
        r#"{"memoryLimit": "99999999999999999999Mi"}"#,
        "is not a memory quantity",
    ),
];

/// The chart's values for render's flags: each flag camelCased, the namespace the release's.
/// Destructured whole, so a new flag does not compile until it has its value.
fn values(args: &ManifestArgs) -> Value {
    let ManifestArgs {
        gc_strategy,
        grace_period,
        revisions,
        handoff_timeout,
        namespaces,
        namespace: _,
        image,
        runtime_endpoint,
        manifests_dir,
        lock_file,
        prometheus,
        prometheus_port,
        metrics_port,
        api_server,
        api_server_name,
        kubelet_ca,
        kubelet_insecure,
        kubernetes_version: _,
        bind_user,
        node_label,
        only_node_labels,
        priority_class,
        image_pull_secret,
        memory_limit,
        log_format,
        log_level,
    } = args;
    json!({
        "gcStrategy": gc_strategy,
        "gracePeriod": grace_period,
        "revisions": revisions,
        "handoffTimeout": handoff_timeout,
        "namespaces": namespaces,
        // The chart's default is its appVersion, which must be the agent's version.
        "image": if image == DEFAULT_IMAGE { "" } else { image.as_str() },
        "runtimeEndpoint": runtime_endpoint,
        "manifestsDir": manifests_dir,
        "lockFile": lock_file,
        "prometheus": prometheus,
        "prometheusPort": prometheus_port,
        "metricsPort": metrics_port,
        "apiServer": api_server,
        "apiServerName": api_server_name,
        "kubeletCa": kubelet_ca.clone().unwrap_or_default(),
        "kubeletInsecure": kubelet_insecure,
        "bindUsers": bind_user,
        "nodeLabels": node_label,
        "onlyNodeLabels": only_node_labels,
        "priorityClass": priority_class,
        "imagePullSecrets": image_pull_secret,
        "memoryLimit": memory_limit.clone().unwrap_or_default(),
        "logFormat": log_format.as_str(),
        "logLevel": log_level,
    })
}

/// How a row's Kubernetes version reaches the chart: render's `--kubernetes-version` (or
/// its default) as the API server's version helm is told, or as the value.
#[derive(Clone, Copy, Debug)]
enum VersionFrom {
    ApiServer,
    Value,
}

/// `render`'s objects for the flags, or its refusal.
fn rendered(args: &ManifestArgs) -> anyhow::Result<Objects> {
    chart::objects_of(&render(&args.options(KubernetesVersion::NEWEST)?))
}

/// `helm template`'s objects for the flags' values, or helm's refusal.
fn templated(helm: &Path, args: &ManifestArgs, version: VersionFrom) -> anyhow::Result<Objects> {
    templated_with(helm, args, version, &json!({}))
}

/// [`templated`], with some values given over those of the flags.
fn templated_with(
    helm: &Path,
    args: &ManifestArgs,
    version: VersionFrom,
    overrides: &Value,
) -> anyhow::Result<Objects> {
    let mut values = values(args);
    let kubernetes = args.kubernetes_version.unwrap_or(KubernetesVersion::NEWEST);
    let api_server_version = match version {
        VersionFrom::ApiServer => kubernetes,
        VersionFrom::Value => {
            values["kubernetesVersion"] = json!(kubernetes.to_string());
            // An API server newer than what the value says: the value wins.
            KubernetesVersion::NEWEST
        }
    };
    for (key, value) in overrides.as_object().into_iter().flatten() {
        values[key] = value.clone();
    }
    chart::template(
        helm,
        &chart::chart_dir(),
        &args.namespace,
        api_server_version,
        &values,
    )
}

fn parse(row: &[&str]) -> ManifestArgs {
    let argv = std::iter::once("render").chain(row.iter().copied());
    Flags::try_parse_from(argv)
        .unwrap_or_else(|e| panic!("{row:?} are not render's flags: {e}"))
        .args
}

fn helm() -> PathBuf {
    ckpt_e2e::e2e_env::modules::helm().expect("helm, built from its Go module")
}

#[test]
fn the_chart_renders_what_render_renders() {
    let helm = helm();
    let strategies = ckpt_bin::render::BuiltIn
        .strategies()
        .expect("the agent's strategies");
    let strategy_rows: Vec<Vec<String>> = (strategies.iter())
        .map(|s| vec!["--gc-strategy".to_owned(), s.clone()])
        .collect();
    let rows = (SAME
        .iter()
        .map(|row| row.iter().map(|s| (*s).to_owned()).collect()))
    .chain(strategy_rows)
    .collect::<Vec<Vec<String>>>();
    let mut failures = Vec::new();
    for row in &rows {
        let row: Vec<&str> = row.iter().map(String::as_str).collect();
        let args = parse(&row);
        let expected = rendered(&args).unwrap_or_else(|e| panic!("render refuses {row:?}: {e}"));
        for version in [VersionFrom::ApiServer, VersionFrom::Value] {
            match templated(&helm, &args, version) {
                Ok(got) => {
                    let differences = chart::differences(&expected, &got);
                    if differences.is_empty() {
                        println!("same objects ({}): {row:?} (version from {version:?})", got.len());
                    } else {
                        failures.push(format!("{row:?} ({version:?}):\n{}", differences.join("\n")));
                    }
                }
                Err(e) => failures.push(format!("{row:?} ({version:?}): the chart refuses: {e:#}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_chart_refuses_what_render_refuses() {
    let helm = helm();
    let mut failures = Vec::new();
    for row in REFUSED {
        let args = parse(row);
        let Err(refusal) = rendered(&args) else {
            failures.push(format!("{row:?}: render accepts it (the row is wrong)"));
            continue;
        };
        match templated(&helm, &args, VersionFrom::Value) {
            Ok(_) => failures.push(format!(
                "{row:?}: render refuses ({refusal}), the chart renders it"
            )),
            Err(e) => println!("both refuse {row:?}:\n  render: {refusal}\n  chart:  {e}"),
        }
    }
    let defaults = parse(&[]);
    for (given, why) in VALUES_REFUSED {
        let mut args = defaults.clone();
        args.namespace = "kube-system".to_owned();
        let overrides: Value = serde_json::from_str(given).expect("a row's JSON");
        match templated_with(&helm, &args, VersionFrom::ApiServer, &overrides) {
            Ok(_) => failures.push(format!("{given}: the chart renders it")),
            Err(e) if e.to_string().contains(why) => println!("the chart refuses {given}: {e}"),
            Err(e) => failures.push(format!("{given}: the chart refuses it, but not for {why:?}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_chart_is_the_agents_version_and_lints_clean() {
    let file = chart::chart_dir().join("Chart.yaml");
    let chart: Value = serde_saphyr::from_str(&std::fs::read_to_string(file).expect("Chart.yaml"))
        .expect("Chart.yaml is YAML");
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(chart["version"], version, "Chart.yaml's version");
    assert_eq!(
        chart["appVersion"], version,
        "Chart.yaml's appVersion (the image's tag)"
    );
    let lint = Command::new(helm())
        .args(["lint", "--strict"])
        .arg(chart::chart_dir())
        .output()
        .expect("helm lint");
    assert!(
        lint.status.success(),
        "helm lint --strict:\n{}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );
}

#[test]
fn the_package_templates_what_render_renders_for_its_pinned_image() {
    let pinned = "registry.example/pod-checkpointer@sha256:89abcdef0123456789abcdef0123456789abcdef0123456789abcdef01234567";
    let dir = tempfile::tempdir().unwrap();
    let package = chart::package(&chart::chart_dir(), dir.path(), pinned).unwrap();
    assert_eq!(
        package.file_name().unwrap().to_string_lossy(),
        format!("pod-checkpointer-{}.tgz", env!("CARGO_PKG_VERSION"))
    );
    let expected = rendered(&parse(&["--image", pinned])).unwrap();
    let templated = chart::template(
        &helm(),
        &package,
        ckpt_render::DEFAULT_NAMESPACE,
        KubernetesVersion::NEWEST,
        &json!({}),
    )
    .unwrap();
    let differences = chart::differences(&expected, &templated);
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}
