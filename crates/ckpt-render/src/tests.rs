//! Render tests: the YAML reads back into the same objects, and the manifests are what the
//! docs/install.md promises. What needs the agent itself (its config parser,
//! command line and metrics) is checked in ckpt-bin's `render` module.

use std::time::Duration;

use k8s_openapi::api::apps::v1::RollingUpdateDaemonSet;
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::objects::{CHECKPOINT_ANNOTATION, CONFIG_HASH_ANNOTATION, KUBECONFIG_KEY, KUBECONFIG_NAME};
use super::*;
use crate::testing::*;

/// The agent's checks as far as this crate can make them: the strategies registered in
/// this program (ckpt-gc's built-ins), any config accepted. The tests that need the agent's
/// own config parser and command line are ckpt-bin's (its `render` module).
struct RegisteredStrategies;

impl AgentChecks for RegisteredStrategies {
    fn strategies(&self) -> Result<Vec<String>> {
        Ok(ckpt_gc::names().into_iter().map(str::to_owned).collect())
    }

    fn check_config(&self, _yaml: &str) -> Result<()> {
        Ok(())
    }
}

/// `ManifestArgs::options` as the agent's library offers it, with these checks.
trait CheckedOptions {
    fn options(&self, version: KubernetesVersion) -> Result<ManifestOptions>;
}

impl CheckedOptions for ManifestArgs {
    fn options(&self, version: KubernetesVersion) -> Result<ManifestOptions> {
        self.options_for(version, &RegisteredStrategies)
    }
}

fn options(args: &ManifestArgs) -> ManifestOptions {
    args.options(KubernetesVersion::NEWEST).unwrap()
}

fn default_options() -> ManifestOptions {
    options(&ManifestArgs::default())
}

fn legacy_options() -> ManifestOptions {
    ManifestArgs::default()
        .options(KubernetesVersion::new(1, 20))
        .unwrap()
}

/// The agent checks the config with its own namespace (the pod's, at run time), so a
/// config that leaves it out of `namespaces` would be refused before rendering: its pod
/// never checkpointed, nothing restarts it after a reboot (issue 36).
#[test]
fn the_agent_checks_the_config_knowing_its_own_namespace() {
    struct Recording(std::cell::RefCell<Vec<String>>);
    impl AgentChecks for Recording {
        fn strategies(&self) -> Result<Vec<String>> {
            RegisteredStrategies.strategies()
        }
        fn check_config(&self, yaml: &str) -> Result<()> {
            self.0.borrow_mut().push(yaml.to_owned());
            Ok(())
        }
    }
    let recording = Recording(Default::default());
    let args = ManifestArgs {
        namespace: "checkpointer".into(),
        namespaces: vec!["kube-system".into()],
        ..ManifestArgs::default()
    };
    let options = args.options_for(KubernetesVersion::NEWEST, &recording).unwrap();
    let checked = recording.0.into_inner();
    assert_eq!(checked.len(), 1);
    assert_eq!(
        checked[0],
        format!("{}pod-namespace: checkpointer\n", options.agent_config())
    );
    assert_eq!(options.namespaces, ["checkpointer", "kube-system"]);
}

#[test]
fn yaml_reads_back_into_the_same_objects() {
    let variants = [
        ManifestArgs::default(),
        ManifestArgs {
            gc_strategy: "owner-reference".into(),
            grace_period: "5m".into(),
            namespaces: vec!["monitoring".into(), "kube-system".into()],
            namespace: "pod-checkpointer".into(),
            image: "registry.example/pod-checkpointer:dev".into(),
            runtime_endpoint: String::new(),
            kubelet_ca: Some("/etc/kubernetes/pki/kubelet-ca.crt".into()),
            api_server: IN_CLUSTER.into(),
            kubernetes_version: Some(KubernetesVersion::new(1, 20)),
            bind_user: vec!["pod-checkpointer".into()],
            ..ManifestArgs::default()
        },
        kubelet_args(),
    ];
    for args in variants {
        let objects = render(&options(&args));
        let yaml = to_yaml(&objects).unwrap();
        let parsed = from_yaml(&yaml).unwrap();
        assert_eq!(parsed, objects, "{yaml}");
        assert_eq!(to_yaml(&parsed).unwrap(), yaml, "rendering is deterministic");
    }
}

#[test]
fn the_config_names_strategy_grace_period_namespaces_paths_and_metrics() {
    let args = ManifestArgs {
        gc_strategy: "immediate".into(),
        grace_period: "90s".into(),
        namespaces: vec!["b".into(), "a".into(), "b".into()],
        runtime_endpoint: "unix:///var/run/crio/crio.sock".into(),
        metrics_port: 9999,
        ..ManifestArgs::default()
    };
    let kubelet = render(&options(&ManifestArgs {
        kubelet_ca: Some("/etc/kubernetes/pki/ca.crt".into()),
        kubelet_insecure: false,
        ..kubelet_args()
    }));
    let parsed: serde_json::Value = serde_saphyr::from_str(config_of(&kubelet)).unwrap();
    assert_eq!(parsed["kubelet-ca"], "/etc/kubernetes/pki/ca.crt");
    assert_eq!(parsed.get("kubelet-insecure"), None);
    let parsed: serde_json::Value =
        serde_saphyr::from_str(config_of(&render(&options(&kubelet_args())))).unwrap();
    assert_eq!(parsed["kubelet-insecure"], true);
    let objects = render(&options(&args));
    let parsed: serde_json::Value = serde_saphyr::from_str(config_of(&objects)).unwrap();
    assert_eq!(
        parsed,
        serde_json::json!({
            "apiVersion": "pod-checkpointer.github.io/v1alpha1",
            "kind": "AgentConfig",
            "gc-strategy": "immediate",
            "checkpoint-grace-period": "90s",
            "revisions": 2,
            "handoff-timeout": "2m",
            "namespaces": ["a", "b", "kube-system"],
            "checkpoint-dir": "/etc/kubernetes",
            "manifests-dir": "/etc/kubernetes/manifests",
            "lock-file": "/run/pod-checkpointer/pod-checkpointer.lock",
            "runtime-endpoint": "unix:///var/run/crio/crio.sock",
            "metrics-addr": "127.0.0.1:9999",
            "health-socket": "/run/pod-checkpointer-health/health.sock",
            "log-level": "info",
            "log-format": "text",
        })
    );
}

#[test]
fn an_unknown_strategy_is_rejected_naming_the_registered_ones() {
    let args = ManifestArgs {
        gc_strategy: "sometimes".into(),
        ..ManifestArgs::default()
    };
    let error = args.options(KubernetesVersion::NEWEST).unwrap_err().to_string();
    assert!(
        error.starts_with("--gc-strategy: unknown strategy \"sometimes\""),
        "{error}"
    );
    for name in ckpt_gc::names() {
        assert!(error.contains(name), "{error}");
    }
}

#[test]
fn the_default_grace_period_is_the_agents() {
    assert_eq!(ckpt_gc::DEFAULT_GRACE_PERIOD, Duration::from_secs(60));
    assert_eq!(DEFAULT_GRACE_PERIOD, "1m");
}

#[test]
fn objects_come_in_apply_order_with_a_role_per_checkpointed_namespace() {
    let in_kube_system = render(&default_options());
    assert_eq!(
        kinds_and_names(&in_kube_system),
        [
            "ServiceAccount kube-system/pod-checkpointer",
            "ServiceAccount kube-system/pod-checkpointer-static",
            "ConfigMap kube-system/pod-checkpointer",
            "ConfigMap kube-system/pod-checkpointer-kubeconfig",
            "ClusterRole pod-checkpointer",
            "ClusterRoleBinding pod-checkpointer",
            "Role kube-system/pod-checkpointer",
            "RoleBinding kube-system/pod-checkpointer",
            "Role kube-system/pod-checkpointer-token",
            "RoleBinding kube-system/pod-checkpointer-token",
            "DaemonSet kube-system/pod-checkpointer",
        ]
    );
    let elsewhere = render(&options(&ManifestArgs {
        namespace: "checkpointer".into(),
        namespaces: vec!["kube-system".into()],
        api_server: IN_CLUSTER.into(),
        ..kubelet_args()
    }));
    assert_eq!(
        kinds_and_names(&elsewhere),
        [
            "Namespace checkpointer",
            "ServiceAccount checkpointer/pod-checkpointer",
            "ServiceAccount checkpointer/pod-checkpointer-static",
            "ConfigMap checkpointer/pod-checkpointer",
            "ClusterRole pod-checkpointer",
            "ClusterRoleBinding pod-checkpointer",
            "ClusterRole pod-checkpointer-kubelet",
            "ClusterRoleBinding pod-checkpointer-kubelet",
            "Role checkpointer/pod-checkpointer",
            "RoleBinding checkpointer/pod-checkpointer",
            "Role kube-system/pod-checkpointer",
            "RoleBinding kube-system/pod-checkpointer",
            "Role checkpointer/pod-checkpointer-token",
            "RoleBinding checkpointer/pod-checkpointer-token",
            "DaemonSet checkpointer/pod-checkpointer",
        ],
        "the install namespace is always checkpointed (the agent checkpoints itself); \
         in-cluster needs no kubeconfig; the kubelet role only with the kubelet API"
    );
}

/// Both copies get the read-only roles; only the agent's account mints tokens.
#[test]
fn bindings_name_both_accounts_but_tokens_are_minted_by_the_agents_alone() {
    let objects = render(&options(&ManifestArgs {
        bind_user: vec!["pod-checkpointer".into()],
        ..kubelet_args()
    }));
    let mut seen = 0;
    for object in &objects {
        let (role_ref, subjects) = match object {
            Manifest::ClusterRoleBinding(b) => (&b.role_ref, b.subjects.as_ref().unwrap()),
            Manifest::RoleBinding(b) => (&b.role_ref, b.subjects.as_ref().unwrap()),
            _ => continue,
        };
        seen += 1;
        assert_eq!(role_ref.name, object.name());
        let subjects: Vec<_> = subjects
            .iter()
            .map(|s| (s.kind.as_str(), s.name.as_str(), s.namespace.as_deref()))
            .collect();
        let mut expected = vec![("ServiceAccount", NAME, Some("kube-system"))];
        if object.name() != "pod-checkpointer-token" {
            expected.push(("ServiceAccount", STATIC_NAME, Some("kube-system")));
        }
        expected.push(("User", "pod-checkpointer", None));
        assert_eq!(subjects, expected, "{}", object.describe());
    }
    assert_eq!(seen, 4);
}

#[test]
fn rbac_is_least_privilege_and_every_rule_says_why() {
    for args in [ManifestArgs::default(), kubelet_args()] {
        let objects = render(&options(&args));
        for object in &objects {
            for rule in object.rules().unwrap_or_default() {
                assert!(objects::why(rule).is_some(), "no reason for {rule:?}");
                let resources = rule.resources.as_ref().unwrap();
                let everything = [rule.api_groups.as_ref().unwrap(), resources, &rule.verbs];
                assert!(
                    everything.iter().all(|list| !list.iter().any(|s| s == "*")),
                    "no wildcards: {rule:?}"
                );
                let writes: Vec<_> = rule
                    .verbs
                    .iter()
                    .filter(|v| !["get", "list", "watch"].contains(&v.as_str()))
                    .collect();
                let static_token = resources == &["serviceaccounts/token"]
                    && rule.resource_names.as_deref() == Some(&[STATIC_NAME.to_owned()][..])
                    && object.namespace() == Some("kube-system");
                assert!(
                    writes.is_empty() || resources == &["events"] || static_token,
                    "only Events are written, and tokens of the static copy's account minted: {rule:?}"
                );
            }
        }
        // Each rule's reason is the comment right above it in the YAML.
        let yaml = to_yaml(&objects).unwrap();
        let rules = objects.iter().flat_map(|o| o.rules().unwrap_or_default()).count();
        let lines: Vec<&str> = yaml.lines().collect();
        let items: Vec<usize> = (0..lines.len()).filter(|&i| lines[i] == "- apiGroups:").collect();
        assert_eq!(items.len(), rules, "{yaml}");
        for i in items {
            assert!(
                lines[i - 1].starts_with("# ") && lines[i - 1].len() > 30,
                "{}",
                lines[i - 1]
            );
        }
    }
}

#[test]
fn tokens_only_for_the_static_account_in_its_own_namespace() {
    let mut options = default_options();
    options.namespaces = vec!["kube-system".into(), "cni".into()];
    let objects = render(&options);
    let token_rules: Vec<(String, &PolicyRule)> = objects
        .iter()
        .flat_map(|o| {
            o.rules()
                .unwrap_or_default()
                .iter()
                .map(move |r| (o.describe(), r))
        })
        .filter(|(_, r)| {
            r.resources
                .iter()
                .flatten()
                .any(|res| res.contains("serviceaccounts"))
        })
        .collect();
    assert_eq!(token_rules.len(), 1, "{token_rules:?}");
    let (role, rule) = &token_rules[0];
    assert_eq!(role, "Role kube-system/pod-checkpointer-token");
    assert_eq!(rule.verbs, ["create"]);
    assert_eq!(
        rule.resource_names.as_deref(),
        Some(&[STATIC_NAME.to_owned()][..])
    );
}

#[test]
fn the_kubelet_api_role_exists_only_with_the_kubelet_api_and_follows_the_version() {
    assert_eq!(
        cluster_rules(&render(&default_options()), "pod-checkpointer-kubelet"),
        None
    );
    let current = render(&options(&kubelet_args()));
    let legacy = render(&kubelet_args().options(KubernetesVersion::new(1, 20)).unwrap());
    let subresource = |objects: &[Manifest]| {
        cluster_rules(objects, "pod-checkpointer-kubelet").unwrap()[0]
            .resources
            .clone()
            .unwrap()
    };
    assert_eq!(subresource(&current), ["nodes/pods"]);
    assert_eq!(subresource(&legacy), ["nodes/proxy"]);
    for objects in [&current, &legacy] {
        let node = cluster_rules(objects, NAME).unwrap();
        assert_eq!(node.len(), 1);
        assert_eq!(node[0].resources.as_deref().unwrap(), ["nodes"]);
    }
}

#[test]
fn the_rolling_update_follows_the_kubernetes_version() {
    let current = render(&default_options());
    let legacy = render(&legacy_options());
    let rolling = |objects: &[Manifest]| {
        let strategy = daemonset_of(objects).spec.clone().update_strategy.unwrap();
        assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
        strategy.rolling_update.unwrap()
    };
    assert_eq!(
        rolling(&current),
        RollingUpdateDaemonSet {
            max_surge: Some(IntOrString::Int(1)),
            max_unavailable: Some(IntOrString::Int(0)),
        }
    );
    assert_eq!(
        rolling(&legacy),
        RollingUpdateDaemonSet {
            max_surge: None,
            max_unavailable: Some(IntOrString::Int(1)),
        }
    );
    assert!(
        !to_yaml(&legacy).unwrap().contains("maxSurge"),
        "an API server before 1.21 refuses the field in a server-side apply"
    );
}

/// The kubeconfig names the server chosen at render time, the pod's token and CA, and is
/// passed to the agent; in-cluster needs neither.
#[test]
fn the_api_server_is_chosen_at_render_time() {
    let check = |args: ManifestArgs, server: Option<(&str, Option<&str>)>| {
        let objects = render(&options(&args));
        let kubeconfig = config_map_of(&objects, KUBECONFIG_NAME, KUBECONFIG_KEY);
        let container = container_of(&objects);
        let args = container.args.clone().unwrap();
        let Some((url, name)) = server else {
            assert_eq!(kubeconfig, None);
            assert_eq!(args, ["run", "--config", "/etc/pod-checkpointer/config.yaml"]);
            return;
        };
        let parsed: kube::config::Kubeconfig = serde_saphyr::from_str(kubeconfig.unwrap()).unwrap();
        let cluster = parsed.clusters[0].cluster.clone().unwrap();
        assert_eq!(cluster.server.as_deref(), Some(url));
        assert_eq!(cluster.tls_server_name.as_deref(), name);
        assert_eq!(
            cluster.certificate_authority.as_deref(),
            Some("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
        );
        let user = parsed.auth_infos[0].auth_info.clone().unwrap();
        assert_eq!(
            user.token_file.as_deref(),
            Some("/var/run/secrets/kubernetes.io/serviceaccount/token")
        );
        assert_eq!(
            args,
            [
                "run",
                "--config",
                "/etc/pod-checkpointer/config.yaml",
                "--kubeconfig",
                "/etc/pod-checkpointer-kubeconfig/kubeconfig"
            ]
        );
    };
    check(
        ManifestArgs::default(),
        Some(("https://127.0.0.1:6443", Some("kubernetes"))),
    );
    check(
        ManifestArgs {
            api_server: "https://10.0.0.1:6443/".into(),
            api_server_name: String::new(),
            ..ManifestArgs::default()
        },
        Some(("https://10.0.0.1:6443", None)),
    );
    check(
        ManifestArgs {
            api_server: IN_CLUSTER.into(),
            ..ManifestArgs::default()
        },
        None,
    );
}

#[test]
fn the_daemonset_runs_the_agent_on_control_plane_nodes_and_checkpoints_itself() {
    let objects = render(&default_options());
    let template = &daemonset_of(&objects).spec.template;
    let annotations = template.metadata.as_ref().unwrap().annotations.as_ref().unwrap();
    assert_eq!(annotations[CHECKPOINT_ANNOTATION], "true");
    assert!(annotations.contains_key(CONFIG_HASH_ANNOTATION));

    let spec = pod_spec_of(&objects);
    assert_eq!(spec.host_network, Some(true));
    assert_eq!(spec.service_account_name.as_deref(), Some(NAME));
    assert_eq!(spec.priority_class_name.as_deref(), Some("system-node-critical"));
    let terms = &spec
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms;
    assert_eq!(
        node_terms(terms),
        [
            "node-role.kubernetes.io/control-plane Exists",
            "node-role.kubernetes.io/master Exists",
            "node.kubernetes.io/controller In true",
        ]
    );

    let container = container_of(&objects);
    assert_eq!(container.image.as_deref(), Some(DEFAULT_IMAGE));
    assert_eq!(container.image_pull_policy.as_deref(), Some("IfNotPresent"));
    let env: Vec<_> = container
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| {
            let field = e.value_from.as_ref().unwrap().field_ref.as_ref().unwrap();
            (e.name.as_str(), field.field_path.as_str())
        })
        .collect();
    assert_eq!(
        env,
        [
            ("NODE_NAME", "spec.nodeName"),
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
            ("HOST_IP", "status.hostIP"),
        ]
    );
}

/// Each node-affinity term as `KEY OPERATOR [VALUE]`.
fn node_terms(terms: &[k8s_openapi::api::core::v1::NodeSelectorTerm]) -> Vec<String> {
    terms
        .iter()
        .map(|t| {
            let [expr] = t.match_expressions.as_deref().unwrap() else {
                panic!("one expression per term: {t:?}");
            };
            let values = expr.values.as_deref().unwrap_or_default().join(",");
            format!("{} {} {values}", expr.key, expr.operator)
                .trim_end()
                .to_owned()
        })
        .collect()
}

/// Typhoon labels its controllers `node.kubernetes.io/controller=true` only: such nodes are
/// in the default set. `--node-label` adds nodes, `--only-node-labels` replaces the set.
#[test]
fn node_labels_add_to_or_replace_the_control_plane_nodes() {
    fn check(node_label: &[&str], only_node_labels: bool, expected: Result<&[&str], &str>) {
        let args = ManifestArgs {
            node_label: node_label.iter().map(|s| (*s).to_owned()).collect(),
            only_node_labels,
            ..ManifestArgs::default()
        };
        let got = args.options(KubernetesVersion::NEWEST).map(|options| {
            let objects = render(&options);
            let affinity = pod_spec_of(&objects).affinity.clone().unwrap();
            let selector = affinity
                .node_affinity
                .unwrap()
                .required_during_scheduling_ignored_during_execution
                .unwrap();
            node_terms(&selector.node_selector_terms)
        });
        match (got, expected) {
            (Ok(terms), Ok(expected)) => assert_eq!(terms, expected, "{node_label:?}"),
            (Err(e), Err(expected)) => assert!(e.to_string().contains(expected), "{node_label:?}: {e}"),
            (got, expected) => panic!("{node_label:?}: got {got:?}, expected {expected:?}"),
        }
    }
    const DEFAULTS: [&str; 3] = [
        "node-role.kubernetes.io/control-plane Exists",
        "node-role.kubernetes.io/master Exists",
        "node.kubernetes.io/controller In true",
    ];
    check(&[], false, Ok(&DEFAULTS));
    check(
        &["example.com/etcd", "tier=control"],
        false,
        Ok(&[
            DEFAULTS[0],
            DEFAULTS[1],
            DEFAULTS[2],
            "example.com/etcd Exists",
            "tier In control",
        ]),
    );
    // Already there: once.
    check(&["node.kubernetes.io/controller=true"], false, Ok(&DEFAULTS));
    check(
        &["node.kubernetes.io/controller=true"],
        true,
        Ok(&["node.kubernetes.io/controller In true"]),
    );
    check(&["empty="], true, Ok(&["empty In"]));
    check(&[" "], true, Err("is not a label key"));
    check(&["bad key"], false, Err("is not a label key"));
    check(&["-x"], false, Err("is not a label key"));
    check(&["Not_A_Domain!/x"], false, Err("is not a label key"));
    check(&["k=v v"], false, Err("is not a label value"));
    check(
        &[&format!("k={}", "v".repeat(64))],
        false,
        Err("is not a label value"),
    );
}

#[test]
fn the_image_may_be_pinned_by_digest_and_a_bad_one_is_refused() {
    fn check(image: &str, expected: Result<(), &str>) {
        let args = ManifestArgs {
            image: image.to_owned(),
            ..ManifestArgs::default()
        };
        match (args.options(KubernetesVersion::NEWEST), expected) {
            (Ok(options), Ok(())) => {
                let objects = render(&options);
                assert_eq!(container_of(&objects).image.as_deref(), Some(image.trim()));
            }
            (Err(e), Err(expected)) => assert!(e.to_string().contains(expected), "{image}: {e}"),
            (got, expected) => panic!("{image}: got {got:?}, expected {expected:?}"),
        }
    }
    let digest = "a".repeat(64);
    check("registry.local/ckpt:1", Ok(()));
    check(&format!("registry.local/ckpt@sha256:{digest}"), Ok(()));
    check(&format!("registry.local/ckpt:1@sha256:{digest}"), Ok(()));
    check("", Err("is not an image reference"));
    check("two words", Err("is not an image reference"));
    check("registry.local/ckpt@sha256:abc", Err("has no valid digest"));
    check(
        &format!("registry.local/ckpt@sha256:{}", "A".repeat(64)),
        Err("has no valid digest"),
    );
    check(
        &format!("registry.local/ckpt@md5:{digest}"),
        Err("has no valid digest"),
    );
    check(&format!("@sha256:{digest}"), Err("has no valid digest"));
}

#[test]
fn priority_pull_secrets_memory_limit_and_logs_are_the_operators_to_choose() {
    let objects = render(&default_options());
    let spec = pod_spec_of(&objects);
    assert_eq!(spec.priority_class_name.as_deref(), Some(DEFAULT_PRIORITY_CLASS));
    assert_eq!(spec.image_pull_secrets, None);
    let config: serde_json::Value = serde_saphyr::from_str(config_of(&objects)).unwrap();
    assert_eq!(
        (&config["log-level"], &config["log-format"]),
        (&"info".into(), &"text".into())
    );

    let args = ManifestArgs {
        priority_class: "ckpt-critical".into(),
        image_pull_secret: vec!["regcred".into(), "mirror".into(), "regcred".into()],
        memory_limit: Some("256Mi".into()),
        log_format: LogFormat::Json,
        log_level: "info,ckpt_watch=debug".into(),
        ..ManifestArgs::default()
    };
    let objects = render(&options(&args));
    let spec = pod_spec_of(&objects);
    assert_eq!(spec.priority_class_name.as_deref(), Some("ckpt-critical"));
    let secrets: Vec<_> = spec
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(secrets, ["mirror", "regcred"]);
    let limits = container_of(&objects).resources.as_ref().unwrap().limits.clone();
    assert_eq!(limits.unwrap()["memory"].0, "256Mi");
    let config: serde_json::Value = serde_saphyr::from_str(config_of(&objects)).unwrap();
    assert_eq!(config["log-level"], "info,ckpt_watch=debug");
    assert_eq!(config["log-format"], "json");
    let yaml = to_yaml(&objects).unwrap();
    assert!(yaml.contains("# A memory limit (--memory-limit)"), "{yaml}");
    assert!(!yaml.contains("no memory limit"), "{yaml}");

    let none = options(&ManifestArgs {
        priority_class: String::new(),
        ..ManifestArgs::default()
    });
    assert_eq!(pod_spec_of(&render(&none)).priority_class_name, None);

    fn refused(args: ManifestArgs, expected: &str) {
        let error = args.options(KubernetesVersion::NEWEST).unwrap_err().to_string();
        assert!(error.contains(expected), "{error}");
    }
    let memory = |limit: &str| ManifestArgs {
        memory_limit: Some(limit.into()),
        ..ManifestArgs::default()
    };
    for ok in ["32Mi", "1Gi", "100M", "1073741824"] {
        assert_eq!(options(&memory(ok)).memory_limit.as_deref(), Some(ok));
    }
    refused(memory("16Mi"), "below the container's request (32Mi)");
    refused(memory("33554431"), "below the container's request");
    for bad in ["", "Mi", "1.5Gi", "256mb", "-1Gi", "99999999999999999999Ti"] {
        refused(memory(bad), "is not a memory quantity");
    }
    refused(
        ManifestArgs {
            priority_class: "Not Valid".into(),
            ..ManifestArgs::default()
        },
        "--priority-class",
    );
    refused(
        ManifestArgs {
            image_pull_secret: vec!["a/b".into()],
            ..ManifestArgs::default()
        },
        "--image-pull-secret",
    );
    refused(
        ManifestArgs {
            log_level: " ".into(),
            ..ManifestArgs::default()
        },
        "--log-level must not be empty",
    );
}

#[test]
fn the_pod_is_hardened() {
    let objects = render(&default_options());
    let spec = pod_spec_of(&objects);
    let tolerations = spec.tolerations.clone().unwrap();
    assert_eq!(tolerations.len(), 1);
    assert_eq!(tolerations[0].operator.as_deref(), Some("Exists"));
    assert_eq!(
        (&tolerations[0].key, &tolerations[0].effect, &tolerations[0].value),
        (&None, &None, &None),
        "every taint"
    );
    let seccomp = spec
        .security_context
        .as_ref()
        .unwrap()
        .seccomp_profile
        .as_ref()
        .unwrap();
    assert_eq!(seccomp.type_, "RuntimeDefault");
    let container = container_of(&objects);
    let security = container.security_context.as_ref().unwrap();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.privileged, None);
    let capabilities = security.capabilities.as_ref().unwrap();
    assert_eq!(capabilities.drop.as_deref().unwrap(), ["ALL"]);
    assert_eq!(
        capabilities.add.as_deref().unwrap(),
        ["CHOWN", "DAC_OVERRIDE", "FOWNER"]
    );
    let resources = container.resources.as_ref().unwrap();
    assert_eq!(resources.limits, None, "no memory limit");
    let yaml = to_yaml(&objects).unwrap();
    for comment in [
        "# Requests only, no memory limit",
        "# Root, with every capability dropped",
        "# LOCK DIR",
    ] {
        assert!(yaml.contains(comment), "{comment}");
    }
}

#[test]
fn only_the_directories_the_agent_writes_are_mounted() {
    let mounted = |options: &ManifestOptions| -> Vec<(String, bool)> {
        let objects = render(options);
        let spec = pod_spec_of(&objects);
        let volumes = spec.volumes.as_ref().unwrap();
        container_of(&objects)
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .filter_map(|m| {
                let volume = volumes.iter().find(|v| v.name == m.name).unwrap();
                let host = volume.host_path.as_ref()?;
                assert_eq!(
                    host.path, m.mount_path,
                    "same path inside as on the host: {}",
                    m.name
                );
                Some((host.path.clone(), m.read_only == Some(true)))
            })
            .collect()
    };
    let expected = |extra: &[(&str, bool)]| -> Vec<(String, bool)> {
        [
            ("/etc/kubernetes/manifests", false),
            ("/etc/kubernetes/inactive-manifests", false),
            ("/etc/kubernetes/checkpoint-secrets", false),
            ("/etc/kubernetes/checkpoint-configmaps", false),
            ("/etc/kubernetes/checkpoint-projected", false),
            ("/etc/kubernetes/checkpoint-quarantine", false),
            ("/etc/kubernetes/pod-checkpointer", false),
            ("/run/pod-checkpointer", false),
        ]
        .iter()
        .chain(extra)
        .map(|(p, ro)| ((*p).to_owned(), *ro))
        .collect()
    };
    assert_eq!(
        mounted(&default_options()),
        expected(&[("/run/containerd", true)])
    );
    assert_eq!(mounted(&options(&kubelet_args())), expected(&[]));
    let with_ca = options(&ManifestArgs {
        kubelet_ca: Some("/etc/kubernetes/pki/ca.crt".into()),
        kubelet_insecure: false,
        ..kubelet_args()
    });
    assert_eq!(
        mounted(&with_ca),
        expected(&[("/etc/kubernetes/pki/ca.crt", true)]),
        "the CA file alone, read-only"
    );
    // Migrating from bootkube's checkpointer: its lock, in its directory.
    let migrating = options(&ManifestArgs {
        lock_file: "/var/run/lock/pod-checkpointer.lock".into(),
        ..ManifestArgs::default()
    });
    let mut with_bootkube_lock = expected(&[("/run/containerd", true)]);
    with_bootkube_lock.retain(|(p, _)| p != "/run/pod-checkpointer");
    with_bootkube_lock.insert(7, ("/var/run/lock".to_owned(), false));
    assert_eq!(mounted(&migrating), with_bootkube_lock);
    let objects = render(&migrating);
    let config: serde_json::Value = serde_saphyr::from_str(config_of(&objects)).unwrap();
    assert_eq!(config["lock-file"], "/var/run/lock/pod-checkpointer.lock");
    let yaml = to_yaml(&objects).unwrap();
    assert!(
        yaml.contains("# LOCK DIR: the directory of the lock file both copies share"),
        "{yaml}"
    );
    // A wrong --manifests-dir fails the pod rather than filling a directory no kubelet reads;
    // the agent's own directories are created on a fresh node.
    let types: Vec<(String, String)> = (pod_spec_of(&render(&default_options())).volumes.iter().flatten())
        .filter_map(|v| Some((v.name.clone(), v.host_path.as_ref()?.type_.clone()?)))
        .collect();
    let type_of = |name: &str| types.iter().find(|(n, _)| n == name).map(|(_, t)| t.as_str());
    assert_eq!(type_of("manifests-dir"), Some("Directory"), "{types:?}");
    assert_eq!(type_of("cri-socket-dir"), Some("Directory"), "{types:?}");
    assert_eq!(type_of("agent-state"), Some("DirectoryOrCreate"), "{types:?}");
    for options in [default_options(), with_ca] {
        for (path, read_only) in mounted(&options) {
            assert!(
                path != "/etc/kubernetes" && path != "/etc" && path != "/",
                "{path}"
            );
            assert!(read_only || !path.contains("pki"), "{path}");
        }
    }
}

#[test]
fn a_changed_config_changes_the_pod_template() {
    let hash = |args: &ManifestArgs| {
        let objects = render(&options(args));
        let template = daemonset_of(&objects).spec.clone().template;
        template.metadata.unwrap().annotations.unwrap()[CONFIG_HASH_ANNOTATION].clone()
    };
    let default = hash(&ManifestArgs::default());
    assert_eq!(default, hash(&ManifestArgs::default()));
    assert_ne!(
        default,
        hash(&ManifestArgs {
            grace_period: "5m".into(),
            ..ManifestArgs::default()
        })
    );
}

#[test]
fn kubernetes_versions_parse_as_operators_and_servers_write_them() {
    for (text, expected) in [
        ("1.20", (1, 20)),
        ("v1.20.2", (1, 20)),
        ("1.33", (1, 33)),
        ("v1.33.1+k3s1", (1, 33)),
        ("1.30-eks", (1, 30)),
    ] {
        let version: KubernetesVersion = text.parse().unwrap();
        assert_eq!((version.major, version.minor), expected, "{text}");
    }
    for bad in ["", "1", "one.two", "1."] {
        assert!(bad.parse::<KubernetesVersion>().is_err(), "{bad:?}");
    }
    assert_eq!(
        KubernetesVersion::from_version_info("1", "20+").unwrap(),
        KubernetesVersion::new(1, 20)
    );
    assert!(KubernetesVersion::new(1, 24) < KubernetesVersion::new(1, 25));
    assert!(!KubernetesVersion::new(1, 24).has_daemonset_max_surge());
    assert!(KubernetesVersion::new(1, 25).has_daemonset_max_surge());
    assert!(!KubernetesVersion::new(1, 32).kubelet_authorizes_nodes_pods());
    assert!(KubernetesVersion::NEWEST.kubelet_authorizes_nodes_pods());
}

/// Issue 37: `--prometheus` declares the metrics port, which reserves it on a host-network
/// pod's node, so a surge pod could never schedule beside the old one and every upgrade
/// hung on 1.25+; it rolls the old pod out first instead (the static copy holds the node).
#[test]
fn a_declared_metrics_port_rolls_without_a_surge_pod() {
    let objects = render(&options(&ManifestArgs {
        prometheus: true,
        ..ManifestArgs::default()
    }));
    assert!(container_of(&objects).ports.is_some());
    let update = daemonset_of(&objects).spec.clone().update_strategy.unwrap();
    assert_eq!(
        update.rolling_update.unwrap(),
        RollingUpdateDaemonSet {
            max_surge: None,
            max_unavailable: Some(IntOrString::Int(1)),
        }
    );
}

/// Issue 37: a namespace render creates lets the agent's privileged pods past Pod Security
/// admission; kube-system (not created) is left as the cluster has it.
#[test]
fn a_created_namespace_is_labelled_privileged_for_pod_security() {
    let objects = render(&options(&ManifestArgs {
        namespace: "checkpointer".into(),
        ..ManifestArgs::default()
    }));
    let Some(Manifest::Namespace(namespace)) = objects.first() else {
        panic!(
            "the namespace comes first: {:?}",
            objects.first().map(Manifest::describe)
        );
    };
    let labels = namespace.metadata.labels.clone().unwrap_or_default();
    for mode in ["enforce", "audit", "warn"] {
        assert_eq!(
            labels[&format!("pod-security.kubernetes.io/{mode}")],
            "privileged"
        );
    }
    let default = render(&default_options());
    assert!(!default.iter().any(|o| matches!(o, Manifest::Namespace(_))));
}

#[test]
fn prometheus_adds_the_node_port_the_pod_monitor_and_the_rules() {
    let plain = render(&default_options());
    assert!(!plain.iter().any(|o| matches!(o, Manifest::Monitoring(_))));
    assert_eq!(container_of(&plain).ports, None);
    assert!(
        !container_of(&plain)
            .args
            .iter()
            .flatten()
            .any(|a| a.starts_with("--metrics-listen"))
    );

    let options = options(&ManifestArgs {
        prometheus: true,
        prometheus_port: 9777,
        namespace: "checkpointer".into(),
        ..ManifestArgs::default()
    });
    let objects = render(&options);
    let container = container_of(&objects);
    assert!(
        container
            .args
            .iter()
            .flatten()
            .any(|a| a == "--metrics-listen=$(HOST_IP):9777"),
        "{:?}",
        container.args
    );
    let port = &container.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some("metrics"), 9777)
    );
    let kinds: Vec<String> = objects[objects.len() - 2..]
        .iter()
        .map(Manifest::describe)
        .collect();
    assert_eq!(
        kinds,
        [
            "PodMonitor checkpointer/pod-checkpointer",
            "PrometheusRule checkpointer/pod-checkpointer"
        ]
    );
    let resource = objects.last().unwrap().api_resource();
    assert_eq!(
        (
            resource.group.as_str(),
            resource.version.as_str(),
            resource.plural.as_str()
        ),
        ("monitoring.coreos.com", "v1", "prometheusrules")
    );
    let yaml = to_yaml(&objects).unwrap();
    assert!(yaml.contains("job=\"checkpointer/pod-checkpointer\""), "{yaml}");
    assert!(yaml.contains("targetLabel: node"), "{yaml}");
}

/// Each alert carries a `runbook_url` to its section of docs/operations.md, and that
/// section exists (a renamed alert or heading fails here, not in an operator's pager).
#[test]
fn every_alert_links_a_runbook_that_exists() {
    let operations = include_str!("../../../docs/operations.md");
    let headings: Vec<String> = operations
        .lines()
        .filter_map(|line| line.strip_prefix("#### "))
        .map(|title| title.trim().to_ascii_lowercase())
        .collect();
    for alert in ALERTS {
        let url = alert.runbook_url();
        let anchor = url.rsplit_once('#').map(|(_, a)| a).unwrap_or_default();
        assert!(
            url.starts_with(
                "https://github.com/pod-checkpointer/pod-checkpointer/blob/main/docs/operations.md#"
            ),
            "{url}"
        );
        assert!(
            headings.iter().any(|h| h == anchor),
            "no runbook section for {}",
            alert.name
        );
    }
    let objects = render(&options(&ManifestArgs {
        prometheus: true,
        ..ManifestArgs::default()
    }));
    let yaml = to_yaml(&objects).unwrap();
    for alert in ALERTS {
        assert!(yaml.contains(&alert.runbook_url()), "{}", alert.name);
    }
}
