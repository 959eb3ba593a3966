//! Who is who on the plane, and their credentials: the identities the API server's static
//! token file authenticates, the CA and serving certificate (openssl), and kubeconfigs.

use std::fs;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use anyhow::Context;

use crate::command::run_command;
use crate::process::random_hex;

/// The node the hollow kubelet registers, and whose identity `kubeconfig-node-1` carries.
pub const NODE_NAME: &str = "node-1";

/// The name of node number `index` (from 1) of a LAN: `node-1` ([`NODE_NAME`]), `node-2` …
pub fn node_name(index: usize) -> String {
    format!("node-{index}")
}

/// The user of `kubeconfig-agent`, the only one whose requests are audited.
pub const AGENT_USER: &str = "pod-checkpointer";
/// The users a self-hosted kube-controller-manager and kube-scheduler authenticate as.
pub const CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";
pub const SCHEDULER_USER: &str = "system:kube-scheduler";
/// The group of the fleet bench's agents (`StartOptions::fleet_agents`), audited like the
/// agent's user.
pub const FLEET_GROUP: &str = "pod-checkpointer:fleet";

/// The user of the fleet bench's agent number `i` (from 1): `pod-checkpointer-fleet-0001`.
pub fn fleet_user(i: usize) -> String {
    format!("{AGENT_USER}-fleet-{i:04}")
}

/// What the API server's serving certificate names: `bind_ip`, loopback, the first service
/// address, the node's address if there is a node, and the in-cluster names.
pub(super) fn serving_names(bind_ip: Ipv4Addr, node_ips: &[Ipv4Addr]) -> Vec<String> {
    let mut ips = vec![bind_ip, Ipv4Addr::LOCALHOST, Ipv4Addr::new(10, 96, 0, 1)];
    ips.extend(node_ips);
    ips.dedup();
    let dns = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ];
    ips.iter()
        .map(|ip| format!("IP:{ip}"))
        .chain(dns.iter().map(|name| format!("DNS:{name}")))
        .collect()
}

/// `ca.{crt,key}` and `apiserver.{crt,key}` (signed by that CA for `names`) in `dir`.
pub(super) fn write_pki(dir: &Path, names: &[String]) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dir = dir
        .to_str()
        .with_context(|| format!("{} is not UTF-8", dir.display()))?;
    let extensions = format!("{dir}/apiserver.ext");
    fs::write(
        &extensions,
        format!(
            "subjectAltName={}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
            names.join(",")
        ),
    )?;
    let [ca_key, ca_crt, key, csr, crt] = [
        "ca.key",
        "ca.crt",
        "apiserver.key",
        "apiserver.csr",
        "apiserver.crt",
    ]
    .map(|f| format!("{dir}/{f}"));
    let days = "3650";
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &ca_key,
        "-out",
        &ca_crt,
        "-days",
        days,
        "-subj",
        "/CN=pod-checkpointer-e2e-ca",
    ])?;
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &key,
        "-out",
        &csr,
        "-subj",
        "/CN=kube-apiserver",
    ])?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca_crt,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-out",
        &crt,
        "-days",
        days,
        "-extfile",
        &extensions,
    ])
}

/// `openssl ARGS…`; its stderr is in the error.
pub(super) fn openssl(args: &[&str]) -> anyhow::Result<()> {
    run_command(Command::new("openssl").args(args)).map(drop)
}

/// The identities the API server's token file authenticates, each with a fresh token: admin,
/// the node, the agent (the first three get kubeconfigs, in this order), and those of a
/// self-hosted controller-manager and scheduler; then `fleet` agents of [`FLEET_GROUP`], then
/// the nodes `more_nodes` (`system:node:NAME`, beside [`NODE_NAME`]).
pub(super) fn identities(fleet: usize, more_nodes: &[String]) -> anyhow::Result<Vec<Identity>> {
    let mut identities = vec![
        Identity {
            token: random_hex(16)?,
            user: "admin".into(),
            uid: "uid-admin".into(),
            groups: vec!["system:masters".into()],
        },
        Identity {
            token: random_hex(16)?,
            user: format!("system:node:{NODE_NAME}"),
            uid: format!("uid-{NODE_NAME}"),
            groups: vec!["system:nodes".into()],
        },
        Identity {
            token: random_hex(16)?,
            user: AGENT_USER.into(),
            uid: "uid-agent".into(),
            groups: vec![],
        },
        // A self-hosted controller-manager acts for every controller with its own
        // credentials (no per-controller service accounts), so it needs every right.
        Identity {
            token: random_hex(16)?,
            user: CONTROLLER_MANAGER_USER.into(),
            uid: "uid-kcm".into(),
            groups: vec!["system:masters".into()],
        },
        // The bootstrap RBAC policy's role for the scheduler names this user.
        Identity {
            token: random_hex(16)?,
            user: SCHEDULER_USER.into(),
            uid: "uid-scheduler".into(),
            groups: vec![],
        },
    ];
    for i in 1..=fleet {
        identities.push(Identity {
            token: random_hex(16)?,
            user: fleet_user(i),
            uid: format!("uid-fleet-{i:04}"),
            groups: vec![FLEET_GROUP.into()],
        });
    }
    for name in more_nodes {
        identities.push(Identity {
            token: random_hex(16)?,
            user: format!("system:node:{name}"),
            uid: format!("uid-{name}"),
            groups: vec!["system:nodes".into()],
        });
    }
    Ok(identities)
}

/// One line of the API server's static token file.
pub(super) struct Identity {
    pub(super) token: String,
    pub(super) user: String,
    pub(super) uid: String,
    pub(super) groups: Vec<String>,
}

/// `token,user,uid[,"group1,group2"]` lines for `--token-auth-file`.
pub(super) fn render_tokens_csv(identities: &[Identity]) -> String {
    identities
        .iter()
        .map(|id| {
            let groups = if id.groups.is_empty() {
                String::new()
            } else {
                format!(",\"{}\"", id.groups.join(","))
            };
            format!("{},{},{}{groups}\n", id.token, id.user, id.uid)
        })
        .collect()
}

/// The token of `user` in a token file.
pub(super) fn token_of(tokens_csv: &str, user: &str) -> Option<String> {
    tokens_csv.lines().find_map(|line| {
        let mut fields = line.split(',');
        let token = fields.next()?;
        (fields.next()? == user).then(|| token.to_owned())
    })
}

/// A kubeconfig with one cluster, one token user and one context, all selected.
pub fn render_kubeconfig(server: &str, ca: &Path, user: &str, token: &str) -> String {
    let ca = ca.display().to_string();
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: e2e\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
         users:\n\
         - name: {user}\n  user:\n    token: {token}\n\
         contexts:\n\
         - name: e2e\n  context:\n    cluster: e2e\n    user: {user}\n\
         current-context: e2e\n",
        server = yaml_string(server),
        ca = yaml_string(&ca),
        user = yaml_string(user),
        token = yaml_string(token),
    )
}

/// A double-quoted YAML scalar.
pub(super) fn yaml_string(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(token: &str, user: &str, uid: &str, groups: &[&str]) -> Identity {
        Identity {
            token: token.into(),
            user: user.into(),
            uid: uid.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    #[test]
    fn tokens_csv_has_one_line_per_identity_with_quoted_groups() {
        let csv = render_tokens_csv(&[
            identity("t1", "admin", "uid-admin", &["system:masters"]),
            identity(
                "t2",
                "system:node:node-1",
                "uid-node-1",
                &["system:nodes", "extra"],
            ),
            identity("t3", "pod-checkpointer", "uid-agent", &[]),
        ]);
        assert_eq!(
            csv,
            "t1,admin,uid-admin,\"system:masters\"\n\
             t2,system:node:node-1,uid-node-1,\"system:nodes,extra\"\n\
             t3,pod-checkpointer,uid-agent\n"
        );
        assert_eq!(token_of(&csv, "admin").as_deref(), Some("t1"));
        assert_eq!(token_of(&csv, "pod-checkpointer").as_deref(), Some("t3"));
        assert_eq!(token_of(&csv, "nobody"), None);
    }

    #[test]
    fn kubeconfig_names_server_ca_and_token() {
        let config = render_kubeconfig(
            "https://127.0.0.1:6443",
            Path::new("/w/certs/apiserver.crt"),
            "admin",
            "abc\"d",
        );
        assert_eq!(
            config,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: \"https://127.0.0.1:6443\"\n    \
             certificate-authority: \"/w/certs/apiserver.crt\"\nusers:\n- name: \"admin\"\n  user:\n    token: \"abc\\\"d\"\n\
             contexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: \"admin\"\ncurrent-context: e2e\n"
        );
    }

    #[test]
    fn the_serving_cert_names_the_host_the_node_and_the_service() {
        assert_eq!(
            serving_names(Ipv4Addr::new(10, 213, 0, 1), &[Ipv4Addr::new(10, 213, 0, 2)]),
            [
                "IP:10.213.0.1",
                "IP:127.0.0.1",
                "IP:10.96.0.1",
                "IP:10.213.0.2",
                "DNS:localhost",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local"
            ]
        );
        let loopback = serving_names(Ipv4Addr::LOCALHOST, &[]);
        assert_eq!(loopback[..2], ["IP:127.0.0.1", "IP:10.96.0.1"]);
    }
}
