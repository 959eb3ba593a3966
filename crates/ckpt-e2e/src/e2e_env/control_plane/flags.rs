//! The command lines of the plane's Kubernetes processes (kube-apiserver,
//! kube-controller-manager, kube-scheduler) and the API server's audit policy.

use std::net::Ipv4Addr;
use std::path::Path;

use super::credentials::yaml_string;
use crate::e2e_env::release::Release;

pub(super) const AUDIT_POLICY_FILE: &str = "audit-policy.yaml";
pub(super) const AUDIT_LOG_FILE: &str = "audit.log";

/// Audits every request of `user` and of the members of `group` (the fleet bench's agents) at
/// `Metadata` level (verb, URI, status; no bodies) and nothing else, so `cargo xtask bench` can count the agent's API load without slowing the API
/// server down with everybody else's requests. `RequestReceived` is omitted: one event per
/// request, plus `ResponseStarted` for watches.
pub(super) fn audit_policy(user: &str, group: &str) -> String {
    format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
         - level: Metadata\n  users: [{user}]\n- level: Metadata\n  userGroups: [{group}]\n\
         - level: None\n",
        user = yaml_string(user),
        group = yaml_string(group),
    )
}

/// What kube-apiserver's flags depend on.
pub(super) struct ApiserverFlags<'a> {
    pub(super) release: Release,
    pub(super) workdir: &'a Path,
    /// `--etcd-servers`: the plane's etcd, or a LAN's members.
    pub(super) etcd_servers: String,
    pub(super) apiserver_port: u16,
    pub(super) bind_ip: Ipv4Addr,
    pub(super) service_accounts: bool,
}

/// kube-apiserver's flags: the recipe's, which stand in for a missing controller-manager, or
/// with the controllers ServiceAccount admission and bound tokens.
pub(super) fn apiserver_args(flags: &ApiserverFlags<'_>) -> Vec<String> {
    let w = flags.workdir.display();
    let mut args = vec![
        format!("--etcd-servers={}", flags.etcd_servers),
        // The serving cert names this address (see `serving_names`).
        format!("--bind-address={}", flags.bind_ip),
        format!("--advertise-address={}", flags.bind_ip),
        format!("--secure-port={}", flags.apiserver_port),
        format!("--tls-cert-file={w}/certs/apiserver.crt"),
        format!("--tls-private-key-file={w}/certs/apiserver.key"),
        format!("--token-auth-file={w}/tokens.csv"),
        "--authorization-mode=Node,RBAC".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
    ];
    if flags.service_accounts {
        // Pods get projected tokens the kubelet requests (TokenRequest) and refreshes, and
        // kube-root-ca.crt for the CA, as from 1.21 on; 1.20 has this behind an alpha gate.
        args.extend(flags.release.bound_token_gates().map(str::to_owned));
        // A real kubelet reports its InternalIP (the node end of the veth) and a hostname
        // that does not resolve: logs and exec must use the former (wall 3).
        args.push("--kubelet-preferred-address-types=InternalIP,Hostname".into());
    } else {
        // No controller-manager creates ServiceAccounts, so Pod admission would fail.
        args.push("--disable-admission-plugins=ServiceAccount".into());
    }
    args.extend([
        format!("--service-account-key-file={w}/sa.key"),
        format!("--service-account-signing-key-file={w}/sa.key"),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        "--service-cluster-ip-range=10.96.0.0/16".into(),
        // Loopback addresses are invalid in Endpoints, and nothing here needs that object.
        "--endpoint-reconciler-type=none".into(),
        "--allow-privileged=true".into(),
        format!("--audit-policy-file={w}/{AUDIT_POLICY_FILE}"),
        format!("--audit-log-path={w}/{AUDIT_LOG_FILE}"),
    ]);
    args
}

/// kube-controller-manager's flags: every default controller but the legacy token Secrets
/// (pods get bound tokens), acting as admin; nothing written outside the work dir.
pub(super) fn controller_manager_args(
    release: Release,
    workdir: &Path,
    kubeconfig: &Path,
    ca: &Path,
    port: u16,
) -> Vec<String> {
    let mut args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        // On a Lease: a self-hosted copy (see `crate::self_hosted`) waits on it while this
        // one runs, instead of acting beside it.
        "--leader-elect=true".into(),
        "--leader-elect-resource-lock=leases".into(),
        "--use-service-account-credentials=false".into(),
        format!("--controllers=*,-{}", release.token_controller()),
        // Published in every namespace as kube-root-ca.crt, the CA of the projected volumes.
        format!("--root-ca-file={}", ca.display()),
        // Its default is under /usr/libexec, which it would create.
        format!("--flex-volume-plugin-dir={}/kcm-flex-volumes", workdir.display()),
    ];
    args.extend(release.bound_token_gates().map(str::to_owned));
    if release.has_insecure_port_flag() {
        args.push("--port=0".into());
    }
    args
}

pub(super) fn scheduler_args(release: Release, kubeconfig: &Path, port: u16) -> Vec<String> {
    let mut args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        "--leader-elect=true".into(),
        "--leader-elect-resource-lock=leases".into(),
    ];
    if release.has_insecure_port_flag() {
        args.push("--port=0".into());
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apiserver_args_point_into_the_workdir() {
        let flags = ApiserverFlags {
            release: Release::V1_20,
            workdir: Path::new("/w"),
            etcd_servers: "http://127.0.0.1:22379".into(),
            apiserver_port: 16443,
            bind_ip: Ipv4Addr::LOCALHOST,
            service_accounts: false,
        };
        let args = apiserver_args(&flags);
        assert!(args.contains(&"--etcd-servers=http://127.0.0.1:22379".to_owned()));
        assert!(args.contains(&"--bind-address=127.0.0.1".to_owned()));
        assert!(args.contains(&"--disable-admission-plugins=ServiceAccount".to_owned()));
        assert!(args.contains(&"--secure-port=16443".to_owned()));
        assert!(args.contains(&"--tls-cert-file=/w/certs/apiserver.crt".to_owned()));
        assert!(args.contains(&"--tls-private-key-file=/w/certs/apiserver.key".to_owned()));
        assert!(args.contains(&"--token-auth-file=/w/tokens.csv".to_owned()));
        assert!(args.contains(&"--audit-log-path=/w/audit.log".to_owned()));
        assert_eq!(
            audit_policy("pod-checkpointer", "pod-checkpointer:fleet"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
             - level: Metadata\n  users: [\"pod-checkpointer\"]\n\
             - level: Metadata\n  userGroups: [\"pod-checkpointer:fleet\"]\n- level: None\n"
        );
    }

    #[test]
    fn with_the_controllers_pods_get_service_accounts_and_bound_tokens() {
        let flags = ApiserverFlags {
            release: Release::V1_20,
            workdir: Path::new("/w"),
            etcd_servers: "http://127.0.0.1:12379".into(),
            apiserver_port: 17443,
            bind_ip: Ipv4Addr::new(10, 213, 0, 1),
            service_accounts: true,
        };
        let args = apiserver_args(&flags);
        assert!(args.contains(&"--bind-address=10.213.0.1".to_owned()));
        assert!(args.contains(&"--advertise-address=10.213.0.1".to_owned()));
        assert!(args.contains(&"--feature-gates=BoundServiceAccountTokenVolume=true".to_owned()));
        assert!(!args.iter().any(|a| a.starts_with("--disable-admission-plugins")));
        let kcm = controller_manager_args(
            Release::V1_20,
            Path::new("/w"),
            Path::new("/w/kubeconfig"),
            Path::new("/w/certs/apiserver.crt"),
            20257,
        );
        assert!(kcm.contains(&"--root-ca-file=/w/certs/apiserver.crt".to_owned()));
        assert!(kcm.contains(&"--controllers=*,-serviceaccount-token".to_owned()));
        assert!(kcm.contains(&"--flex-volume-plugin-dir=/w/kcm-flex-volumes".to_owned()));
        assert_eq!(
            scheduler_args(Release::V1_20, Path::new("/w/kubeconfig"), 20259),
            [
                "--kubeconfig=/w/kubeconfig",
                "--bind-address=127.0.0.1",
                "--secure-port=20259",
                "--leader-elect=true",
                "--leader-elect-resource-lock=leases",
                "--port=0"
            ]
        );
    }

    /// v1.37 has neither the bound-token gate nor `--port`, and names its controllers
    /// `…-controller`: each would stop the process at start.
    #[test]
    fn current_releases_get_no_removed_flags() {
        let flags = ApiserverFlags {
            release: Release::V1_37,
            workdir: Path::new("/w"),
            etcd_servers: "http://127.0.0.1:12379".into(),
            apiserver_port: 17443,
            bind_ip: Ipv4Addr::LOCALHOST,
            service_accounts: true,
        };
        let kcm = controller_manager_args(
            Release::V1_37,
            Path::new("/w"),
            Path::new("/w/kubeconfig"),
            Path::new("/w/ca.crt"),
            20257,
        );
        let scheduler = scheduler_args(Release::V1_37, Path::new("/w/kubeconfig"), 20259);
        for args in [apiserver_args(&flags), kcm.clone(), scheduler] {
            assert!(
                !args
                    .iter()
                    .any(|a| a.starts_with("--feature-gates") || a == "--port=0"),
                "{args:?}"
            );
        }
        assert!(kcm.contains(&"--controllers=*,-serviceaccount-token-controller".to_owned()));
    }
}
