//! `cargo xtask deploy` against a real kube-apiserver v1.20.2 (the end-to-end environment's,
//! without a hollow node and on ports of its own, so it never clashes with the e2e suite):
//! the server validates and stores every object, a second deploy changes nothing, a dry run
//! persists nothing, the rollout wait times out cleanly without a controller-manager, and
//! the rendered RBAC lets the agent's identity do what the agent does, and no more.
//!
//! With `CI=true` a control plane that cannot start fails the test; elsewhere the test is
//! skipped (with a note) until `cargo xtask e2e-env build` has cached the binaries.

use std::path::Path;
use std::process::{Command, Output};

use ckpt_e2e::e2e_env::{BinDir, ControlPlane, StartOptions, ensure_built};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Pod, Secret};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Not the e2e suite's 2379/6443, nor e2e-env's lifecycle test's 22379/16443.
const ETCD_PORT: u16 = 32379;
const APISERVER_PORT: u16 = 26443;
/// The user of the environment's `kubeconfig-agent`, which has no rights of its own.
const AGENT_USER: &str = "pod-checkpointer";

/// The flags of every deploy here: the strategy the issue names, and the environment's
/// agent identity bound beside the ServiceAccount (no controller-manager mints SA tokens).
const MANIFEST_FLAGS: &[&str] = &["--gc-strategy", "owner-reference", "--bind-user", AGENT_USER];

#[test]
fn deploy_against_a_real_api_server() {
    let Some(plane) = start_plane() else {
        return;
    };
    let admin = plane.kubeconfig();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let admin_client = runtime.block_on(client(&admin));
    let rendered = rendered_objects();

    // An unknown strategy is refused before anything is sent.
    let refused = xtask(&["deploy", "--gc-strategy", "nope", "--kubeconfig", path(&admin)]);
    assert!(!refused.status.success());
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("unknown strategy \"nope\"") && stderr.contains("owner-reference"),
        "{stderr}"
    );
    assert!(!stderr.contains("[deploy]"), "nothing was sent: {stderr}");

    // A dry run: the server checks everything and keeps nothing.
    let dry_run = deploy(&admin, &["--dry-run"]);
    assert!(dry_run.contains("nothing was persisted"), "{dry_run}");
    assert!(dry_run.contains("would be created"), "{dry_run}");
    let dry_run_elsewhere = deploy(&admin, &["--dry-run", "--namespace", "ckpt-dry-run"]);
    assert!(
        dry_run_elsewhere.contains("Namespace ckpt-dry-run: would be created")
            && dry_run_elsewhere.contains("ServiceAccount ckpt-dry-run/pod-checkpointer: not checked"),
        "{dry_run_elsewhere}"
    );
    for object in &rendered {
        assert_eq!(
            runtime.block_on(resource_version(&admin_client, object)),
            None,
            "a dry run created {}",
            describe(object)
        );
    }
    assert!(
        runtime
            .block_on(
                Api::<k8s_openapi::api::core::v1::Namespace>::all(admin_client.clone())
                    .get_opt("ckpt-dry-run")
            )
            .unwrap()
            .is_none(),
        "a dry run created the namespace"
    );

    // The first deploy creates every object; the server's own validation accepts them.
    let first = deploy(&admin, &["--no-wait"]);
    assert!(
        first.contains("manifests for Kubernetes 1.20"),
        "read from the server: {first}"
    );
    let versions: Vec<String> = rendered
        .iter()
        .map(|object| {
            assert!(
                first.contains(&format!("{}: created", describe(object))),
                "{}: {first}",
                describe(object)
            );
            runtime
                .block_on(resource_version(&admin_client, object))
                .unwrap_or_else(|| panic!("{} was not stored", describe(object)))
        })
        .collect();
    let daemonset = runtime
        .block_on(Api::<DaemonSet>::namespaced(admin_client.clone(), "kube-system").get("pod-checkpointer"))
        .unwrap();
    let update = daemonset.spec.update_strategy.unwrap().rolling_update.unwrap();
    assert_eq!(
        (update.max_surge, update.max_unavailable),
        (
            None,
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
        ),
        "a 1.20 API server gets the update strategy it knows"
    );

    // A second deploy is a no-op: nothing is written, so no resourceVersion moves.
    let second = deploy(&admin, &["--no-wait"]);
    for (object, before) in rendered.iter().zip(&versions) {
        assert!(
            second.contains(&format!("{}: unchanged", describe(object))),
            "{}: {second}",
            describe(object)
        );
        assert_eq!(
            runtime.block_on(resource_version(&admin_client, object)).as_ref(),
            Some(before),
            "{} was rewritten",
            describe(object)
        );
    }

    // Without a controller-manager the DaemonSet never rolls out: the wait says so and
    // gives up at the timeout.
    let waited = xtask(&deploy_args(&admin, &["--timeout", "3s"]));
    assert!(!waited.status.success());
    let stderr = text(&waited.stderr);
    assert!(
        stderr.contains("did not finish within 3s")
            && stderr.contains("waiting for the DaemonSet controller to observe generation 1"),
        "{stderr}"
    );

    runtime.block_on(check_agent_rbac(&plane.agent_kubeconfig()));
    runtime.block_on(check_service_accounts(&admin_client));

    // Why the version is read from the cluster: a 1.20 API server refuses maxSurge.
    let too_new = xtask(&deploy_args(
        &admin,
        &["--kubernetes-version", "1.33", "--dry-run"],
    ));
    assert!(!too_new.status.success());
    let stderr = text(&too_new.stderr);
    assert!(
        stderr.contains("maxSurge: field not declared in schema"),
        "{stderr}"
    );

    // --prometheus on a cluster without the Prometheus operator: refused before anything
    // is applied (the DaemonSet keeps its generation).
    let generation = |client: &kube::Client| {
        let api: kube::Api<k8s_openapi::api::apps::v1::DaemonSet> =
            kube::Api::namespaced(client.clone(), "kube-system");
        runtime
            .block_on(api.get("pod-checkpointer"))
            .unwrap()
            .metadata
            .generation
    };
    let before = generation(&admin_client);
    let no_operator = xtask(&deploy_args(&admin, &["--prometheus", "--no-wait"]));
    assert!(!no_operator.status.success());
    let stderr = text(&no_operator.stderr);
    assert!(
        stderr.contains(
            "does not serve PodMonitor (monitoring.coreos.com/v1): install the Prometheus operator's CRDs"
        ),
        "{stderr}"
    );
    assert_eq!(generation(&admin_client), before, "nothing applied");
}

/// What the agent does, as the agent's identity: allowed in its namespace, refused beyond.
async fn check_agent_rbac(agent_kubeconfig: &Path) {
    let agent = client(agent_kubeconfig).await;
    let ns = "kube-system";

    // The real requests the agent makes.
    let pods: Api<Pod> = Api::namespaced(agent.clone(), ns);
    pods.list(&ListParams::default().fields("spec.nodeName=node-1"))
        .await
        .expect("list pods on its node");
    let secrets: Api<Secret> = Api::namespaced(agent.clone(), ns);
    secrets
        .list(&ListParams::default().fields("metadata.name=some-secret"))
        .await
        .expect("list a secret by name");
    let config_maps: Api<ConfigMap> = Api::namespaced(agent.clone(), ns);
    config_maps
        .get("pod-checkpointer")
        .await
        .expect("get a configmap");
    let daemonsets: Api<DaemonSet> = Api::namespaced(agent.clone(), ns);
    daemonsets
        .get("pod-checkpointer")
        .await
        .expect("get its owner kind");
    let jobs: Api<Job> = Api::namespaced(agent.clone(), ns);
    assert!(
        jobs.get_opt("no-such-job")
            .await
            .expect("a missing owner is a 404, not a 403")
            .is_none()
    );
    // Events as the agent publishes them: created, then patched when repeated.
    let recorder = Recorder::new(
        agent.clone(),
        Reporter {
            controller: "pod-checkpointer".into(),
            instance: Some("node-1".into()),
        },
    );
    let parent = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(ns.into()),
        name: Some("kube-apiserver-abcde".into()),
        ..ObjectReference::default()
    };
    let event = Event {
        type_: EventType::Normal,
        reason: "CheckpointRemoved".into(),
        note: Some("deploy test".into()),
        action: "Remove".into(),
        secondary: None,
    };
    for _ in 0..2 {
        recorder.publish(&event, &parent).await.expect("publish an Event");
    }

    // Refused: secrets elsewhere, any cluster-wide list.
    let forbidden = |result: Result<_, kube::Error>, what: &str| match result {
        Err(kube::Error::Api(status)) if status.code == 403 => {}
        other => panic!("{what}: expected 403, got {other:?}"),
    };
    let default_secrets: Api<Secret> = Api::namespaced(agent.clone(), "default");
    forbidden(
        default_secrets.list(&ListParams::default()).await.map(drop),
        "secrets in default",
    );
    forbidden(
        Api::<Secret>::all(agent.clone())
            .list(&ListParams::default())
            .await
            .map(drop),
        "secrets in all namespaces",
    );
    forbidden(
        pods.create(&PostParams::default(), &Pod::default())
            .await
            .map(drop),
        "create a pod",
    );

    // The rest, asked of the authorizer.
    let allowed = [
        ("watch", "", "pods", None, Some(ns)),
        ("get", "", "secrets", None, Some(ns)),
        ("watch", "", "configmaps", None, Some(ns)),
        ("create", "events.k8s.io", "events", None, Some(ns)),
        ("patch", "events.k8s.io", "events", None, Some(ns)),
        ("get", "apps", "replicasets", None, Some(ns)),
        ("get", "apps", "statefulsets", None, Some(ns)),
        ("get", "", "replicationcontrollers", None, Some(ns)),
        // Its own DaemonSet and its node, read when its own pod is gone: a rollout, or a
        // descheduling?
        ("get", "apps", "daemonsets", None, Some(ns)),
        ("get", "", "nodes", None, None),
    ];
    let refused = [
        ("delete", "", "pods", None, Some(ns)),
        ("update", "", "secrets", None, Some(ns)),
        ("get", "", "secrets", None, Some("default")),
        ("list", "", "pods", None, Some("default")),
        ("patch", "apps", "daemonsets", None, Some(ns)),
        ("get", "apps", "deployments", None, Some(ns)),
        ("create", "", "events", None, Some(ns)),
        ("list", "", "nodes", None, None),
        ("get", "", "nodes", Some("pods"), None),
        ("create", "", "nodes", Some("proxy"), None),
        // With the CRI (the default) the kubelet API is not used: no nodes/proxy at all.
        ("get", "", "nodes", Some("proxy"), None),
    ];
    // Tokens: only for the static copy's account, by name.
    for (name, expected) in [("pod-checkpointer-static", true), ("pod-checkpointer", false)] {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some("create".into()),
                    resource: Some("serviceaccounts".into()),
                    subresource: Some("token".into()),
                    name: Some(name.into()),
                    namespace: Some(ns.into()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let answer = Api::<SelfSubjectAccessReview>::all(agent.clone())
            .create(&PostParams::default(), &review)
            .await
            .expect("a self-review");
        assert_eq!(
            answer.status.map(|s| s.allowed),
            Some(expected),
            "a token of {name}"
        );
    }
    for (attributes, expected) in allowed
        .iter()
        .map(|a| (a, true))
        .chain(refused.iter().map(|a| (a, false)))
    {
        let &(verb, group, resource, subresource, namespace) = attributes;
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    group: Some(group.into()),
                    resource: Some(resource.into()),
                    subresource: subresource.map(Into::into),
                    namespace: namespace.map(Into::into),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let answer = Api::<SelfSubjectAccessReview>::all(agent.clone())
            .create(&PostParams::default(), &review)
            .await
            .expect("a self-review");
        assert_eq!(
            answer.status.map(|s| s.allowed),
            Some(expected),
            "{verb} {group}/{resource}{} in {namespace:?}",
            subresource.map(|s| format!("/{s}")).unwrap_or_default()
        );
    }
}

/// The deployed ServiceAccounts, asked of the authorizer: both read alike; the agent's
/// mints tokens for the static copy's account alone, the static copy's mints none.
async fn check_service_accounts(admin: &kube::Client) {
    let can = |account: &str, verb: &str, resource: &str, subresource: Option<&str>, name: Option<&str>| {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(format!("system:serviceaccount:kube-system:{account}")),
                groups: Some(vec![
                    "system:serviceaccounts".into(),
                    "system:serviceaccounts:kube-system".into(),
                ]),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    resource: Some(resource.into()),
                    subresource: subresource.map(Into::into),
                    name: name.map(Into::into),
                    namespace: Some("kube-system".into()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let admin = admin.clone();
        async move {
            Api::<SubjectAccessReview>::all(admin)
                .create(&PostParams::default(), &review)
                .await
                .expect("a review")
                .status
                .is_some_and(|s| s.allowed)
        }
    };
    for account in ["pod-checkpointer", "pod-checkpointer-static"] {
        assert!(
            can(account, "watch", "pods", None, None).await,
            "{account} watches pods"
        );
        assert!(
            can(account, "get", "secrets", None, None).await,
            "{account} reads secrets"
        );
        assert!(
            !can(account, "update", "secrets", None, None).await,
            "{account} writes no secret"
        );
    }
    let token = |account| {
        can(
            account,
            "create",
            "serviceaccounts",
            Some("token"),
            Some("pod-checkpointer-static"),
        )
    };
    assert!(
        token("pod-checkpointer").await,
        "the agent mints the static copy's tokens"
    );
    assert!(
        !token("pod-checkpointer-static").await,
        "the static copy mints none"
    );
    assert!(
        !can(
            "pod-checkpointer",
            "create",
            "serviceaccounts",
            Some("token"),
            Some("pod-checkpointer")
        )
        .await,
        "the agent mints no token of its own account"
    );
}

/// The control plane on this test's ports, or `None` (skip) off CI when its binaries are
/// not built yet.
fn start_plane() -> Option<ControlPlane> {
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let bins = if in_ci { ensure_built() } else { BinDir::cached() };
    let bins = match bins {
        Ok(bins) => bins,
        Err(e) if !in_ci => {
            eprintln!("skipping the deploy test against a real API server: {e:#}");
            return None;
        }
        Err(e) => panic!("the control plane's binaries: {e:#}"),
    };
    let options = StartOptions {
        etcd_port: ETCD_PORT,
        apiserver_port: APISERVER_PORT,
        hollow_node: false,
        ..StartOptions::new(bins)
    };
    Some(ControlPlane::start(&options).unwrap_or_else(|e| panic!("cannot start the control plane: {e:#}")))
}

/// The objects the deploys here apply, as `render` writes them for a 1.20 cluster.
fn rendered_objects() -> Vec<serde_json::Value> {
    let mut args = vec!["render", "--kubernetes-version", "1.20", "-o", "-"];
    args.extend(MANIFEST_FLAGS);
    let output = xtask(&args);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let objects: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text(&output.stdout)).unwrap();
    assert_eq!(objects.len(), 11, "{objects:?}");
    objects
}

fn deploy_args<'a>(kubeconfig: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["deploy", "--kubeconfig", path(kubeconfig)];
    args.extend(MANIFEST_FLAGS);
    args.extend(extra);
    args
}

/// Runs `xtask deploy …`, which must succeed; returns its progress output.
fn deploy(kubeconfig: &Path, extra: &[&str]) -> String {
    let output = xtask(&deploy_args(kubeconfig, extra));
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "deploy {extra:?} failed:\n{stderr}");
    stderr
}

fn xtask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .output()
        .expect("cannot run xtask")
}

async fn client(kubeconfig: &Path) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// The stored object's resourceVersion, `None` when there is none.
async fn resource_version(client: &kube::Client, object: &serde_json::Value) -> Option<String> {
    let (group, version) = match object["apiVersion"].as_str().unwrap().split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", object["apiVersion"].as_str().unwrap()),
    };
    let kind = object["kind"].as_str().unwrap();
    let resource = ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(group, version, kind));
    let name = object["metadata"]["name"].as_str().unwrap();
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let stored = api.get_opt(name).await.unwrap();
    stored.map(|o| o.metadata.resource_version.unwrap())
}

/// `DaemonSet kube-system/pod-checkpointer`, as deploy prints it.
fn describe(object: &serde_json::Value) -> String {
    let kind = object["kind"].as_str().unwrap();
    let name = object["metadata"]["name"].as_str().unwrap();
    match object["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

fn path(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
