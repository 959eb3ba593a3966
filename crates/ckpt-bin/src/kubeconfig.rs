//! Reading a kubeconfig file as client-go reads it. bootkube's `kubeconfig-in-cluster`
//! (the original's `--kubeconfig`, issue 40) has a context without a name and no
//! `current-context`: client-go takes the missing name for "" and the missing current
//! context for "", which selects that context. kube's reader requires every name, so a
//! drop-in exited 2 on it. A file kube reads is read as it is; one it refuses is read
//! again with the missing names and current context filled in as client-go would.

use std::path::{Path, PathBuf};

use kube::config::Kubeconfig;
use serde_json::Value;

use crate::error::{Error, Result};

/// The lists of named entries of a kubeconfig.
const NAMED_LISTS: [&str; 3] = ["clusters", "users", "contexts"];

/// Reads `path`, for `--kubeconfig`.
///
/// # Errors
/// A file that cannot be read, or that client-go would not read either (kube's error).
pub(crate) fn read(path: &Path) -> Result<Kubeconfig> {
    let refused = match Kubeconfig::read_from(path) {
        Ok(kubeconfig) => return Ok(kubeconfig),
        Err(e) => Error::usage(format!("--kubeconfig: cannot read {}", path.display()), e),
    };
    let Ok(text) = std::fs::read_to_string(path) else {
        return Err(refused);
    };
    let Some(mut kubeconfig) = with_client_go_defaults(&text) else {
        return Err(refused);
    };
    if let Some(dir) = path.parent() {
        absolute_paths(&mut kubeconfig, dir);
    }
    Ok(kubeconfig)
}

/// `text` with a missing name read as "" and a missing current context as "" when a
/// context is named so (client-go's reading); `None` when that changes nothing or kube
/// still refuses it.
fn with_client_go_defaults(text: &str) -> Option<Kubeconfig> {
    let mut value: Value = serde_saphyr::from_str(text).ok()?;
    let object = value.as_object_mut()?;
    let mut changed = false;
    for list in NAMED_LISTS {
        for entry in (object
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten())
        .filter_map(Value::as_object_mut)
        {
            if !entry.contains_key("name") {
                entry.insert("name".to_owned(), Value::String(String::new()));
                changed = true;
            }
        }
    }
    let unnamed_context = (object
        .get("contexts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten())
    .any(|c| c["name"] == "");
    // Absent or null: client-go's "" (a "" already there changes nothing).
    let unset = !matches!(object.get("current-context"), Some(Value::String(_)));
    if unnamed_context && unset {
        object.insert("current-context".to_owned(), Value::String(String::new()));
        changed = true;
    }
    if !changed {
        return None;
    }
    serde_json::from_value(value).ok()
}

/// Files named relative to the kubeconfig's directory, as kube's reader resolves them.
fn absolute_paths(kubeconfig: &mut Kubeconfig, dir: &Path) {
    let resolve = |path: &mut Option<String>| {
        if let Some(p) = path.as_deref()
            && Path::new(p).is_relative()
        {
            *path = Some(PathBuf::from(dir).join(p).display().to_string());
        }
    };
    for cluster in kubeconfig.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
        resolve(&mut cluster.certificate_authority);
    }
    for user in kubeconfig
        .auth_infos
        .iter_mut()
        .filter_map(|u| u.auth_info.as_mut())
    {
        resolve(&mut user.client_certificate);
        resolve(&mut user.client_key);
        resolve(&mut user.token_file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bootkube's `kubeconfig-in-cluster` data, as its template renders it.
    const BOOTKUBE: &str = "apiVersion: v1
clusters:
- name: local
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
users:
- name: service-account
  user:
    # Use service account token
    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
contexts:
- context:
    cluster: local
    user: service-account
";

    /// Each case: the file, then the server and token file of the context the file selects
    /// (`None`: refused).
    fn check(text: &str, expected: Option<(&str, &str)>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, text).unwrap();
        let selected = read(&path).ok().and_then(|k| {
            let context_name = k.current_context.clone()?;
            let context = (k.contexts.iter())
                .find(|c| c.name == context_name)?
                .context
                .clone()?;
            let cluster = (k.clusters.iter().find(|c| c.name == context.cluster))?
                .cluster
                .clone()?;
            let user_name = context.user.clone()?;
            let user = (k.auth_infos.iter().find(|u| u.name == user_name))?
                .auth_info
                .clone()?;
            Some((cluster.server?, user.token_file?))
        });
        let expected = expected.map(|(server, token)| {
            let token = match Path::new(token).is_relative() {
                true => dir.path().join(token).display().to_string(),
                false => token.to_owned(),
            };
            (server.to_owned(), token)
        });
        assert_eq!(selected, expected, "{text}");
    }

    #[test]
    fn missing_names_and_current_context_read_as_client_go_reads_them() {
        let named = BOOTKUBE.replace(
            "    user: service-account\n",
            "    user: service-account\n  name: ours\n",
        ) + "current-context: ours\n";
        let relative = BOOTKUBE.replace("/var/run/secrets/kubernetes.io/serviceaccount/token", "token");
        let cases: &[(&str, Option<(&str, &str)>)] = &[
            (
                BOOTKUBE,
                Some((
                    "https://10.0.0.1:6443",
                    "/var/run/secrets/kubernetes.io/serviceaccount/token",
                )),
            ),
            (
                &named,
                Some((
                    "https://10.0.0.1:6443",
                    "/var/run/secrets/kubernetes.io/serviceaccount/token",
                )),
            ),
            // Read again with defaults: relative files still resolve beside the file.
            (&relative, Some(("https://10.0.0.1:6443", "token"))),
            // What client-go refuses too stays kube's error.
            ("not: [a kubeconfig", None),
        ];
        for (text, expected) in cases {
            check(text, *expected);
        }
    }
}
