//! Validation of every name that becomes a path component.
//!
//! Namespaces, pod names and Secret/ConfigMap names come from the API server, which
//! already validates them; checking again means a bug elsewhere (or a hand-edited
//! manifest) can never make the store write `../../etc/passwd`.

use ckpt_core::{PodId, is_dns_label, is_dns_subdomain};

use crate::error::{Error, Result};

/// Longest file name component Linux accepts.
const MAX_COMPONENT_BYTES: usize = 255;
/// Longest relative data file path we accept.
const MAX_DATA_PATH_BYTES: usize = 4096;

fn invalid(what: &'static str, value: &str, reason: &'static str) -> Error {
    Error::InvalidName {
        what,
        value: value.to_owned(),
        reason,
    }
}

/// A namespace: a DNS-1123 label (at most 63 characters).
pub(crate) fn check_namespace(value: &str) -> Result<()> {
    if value.len() > 63 {
        return Err(invalid("namespace", value, "longer than 63 characters"));
    }
    if !is_dns_label(value) {
        return Err(invalid(
            "namespace",
            value,
            "not a DNS label (lowercase letters, digits, '-')",
        ));
    }
    Ok(())
}

/// A pod, Secret, ConfigMap or volume name: a DNS-1123 subdomain (at most 253
/// characters, dot-separated labels).
pub(crate) fn check_subdomain(what: &'static str, value: &str) -> Result<()> {
    if value.len() > 253 {
        return Err(invalid(what, value, "longer than 253 characters"));
    }
    if !is_dns_subdomain(value) {
        return Err(invalid(
            what,
            value,
            "not a DNS subdomain (lowercase letters, digits, '-', '.')",
        ));
    }
    Ok(())
}

/// A pod id whose namespace and name are safe as path components, and short enough
/// for its manifest file name (`<ns>_<name>.json`) to be a valid file name.
pub(crate) fn check_pod_id(id: &PodId) -> Result<()> {
    check_namespace(&id.namespace)?;
    check_subdomain("pod name", &id.name)?;
    if id.manifest_file_name().len() > MAX_COMPONENT_BYTES {
        return Err(invalid(
            "pod name",
            &id.name,
            "too long for a manifest file name (255 bytes with the namespace)",
        ));
    }
    Ok(())
}

/// A data file path (a Secret/ConfigMap key or an `items[].path`), split into its
/// components: relative, no empty, `.` or `..` components, nothing starting with `..`
/// (the kubelet reserves those names), no NUL.
pub(crate) fn data_path_components(value: &str) -> Result<Vec<&str>> {
    const WHAT: &str = "data file path";
    if value.is_empty() {
        return Err(invalid(WHAT, value, "empty"));
    }
    if value.len() > MAX_DATA_PATH_BYTES {
        return Err(invalid(WHAT, value, "longer than 4096 bytes"));
    }
    if value.starts_with('/') {
        return Err(invalid(WHAT, value, "absolute"));
    }
    if value.contains('\0') {
        return Err(invalid(WHAT, value, "contains NUL"));
    }
    let components: Vec<&str> = value.split('/').collect();
    for c in &components {
        if c.is_empty() || *c == "." {
            return Err(invalid(WHAT, value, "empty or '.' component"));
        }
        if c.starts_with("..") {
            return Err(invalid(WHAT, value, "component starts with '..'"));
        }
        if c.len() > MAX_COMPONENT_BYTES {
            return Err(invalid(WHAT, value, "component longer than 255 bytes"));
        }
    }
    Ok(components)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces() {
        let check = |value: &str, ok: bool| assert_eq!(check_namespace(value).is_ok(), ok, "{value:?}");
        let long = "a".repeat(64);
        let max = "a".repeat(63);
        let cases: &[(&str, bool)] = &[
            ("kube-system", true),
            ("a", true),
            ("0a-9", true),
            (&max, true),
            (&long, false),
            ("", false),
            ("-a", false),
            ("a-", false),
            ("A", false),
            ("a.b", false),
            ("a_b", false),
            ("..", false),
            ("a/b", false),
        ];
        for (value, ok) in cases {
            check(value, *ok);
        }
    }

    #[test]
    fn subdomains() {
        let check =
            |value: &str, ok: bool| assert_eq!(check_subdomain("pod name", value).is_ok(), ok, "{value:?}");
        let long = format!("{}.{}", "a".repeat(199), "b".repeat(53));
        let too_long = format!("{long}c");
        let cases: &[(&str, bool)] = &[
            ("kube-apiserver-abc", true),
            ("a.b.c", true),
            (&long, true),
            (&too_long, false),
            ("", false),
            (".", false),
            ("..", false),
            ("a..b", false),
            (".a", false),
            ("a.", false),
            ("a/b", false),
            ("a_b", false),
            ("Upper", false),
            ("a\0b", false),
        ];
        for (value, ok) in cases {
            check(value, *ok);
        }
    }

    #[test]
    fn pod_ids_fit_a_file_name() {
        let check = |ns: &str, name: &str, ok: bool| {
            assert_eq!(check_pod_id(&PodId::new(ns, name)).is_ok(), ok, "{ns}/{name}")
        };
        let name_248 = "a".repeat(248);
        check("a", &name_248, true);
        check("ab", &name_248, false);
        check("kube-system", "kube-apiserver", true);
        check("Kube", "x", false);
        check("kube", "X", false);
    }

    #[test]
    fn data_paths() {
        let check = |value: &str, expected: Option<&[&str]>| {
            let got = data_path_components(value).ok();
            assert_eq!(got.as_deref(), expected, "{value:?}");
        };
        let long_component = "x".repeat(256);
        check("ca.crt", Some(&["ca.crt"]));
        check(".dockerconfigjson", Some(&[".dockerconfigjson"]));
        check("a/b/c", Some(&["a", "b", "c"]));
        check("Key_With-Stuff.1", Some(&["Key_With-Stuff.1"]));
        check("", None);
        check("/etc/passwd", None);
        check("..", None);
        check("../x", None);
        check("a/../../x", None);
        check("..data", None);
        check("a/./b", None);
        check("a//b", None);
        check("a/", None);
        check("a\0b", None);
        check(&long_component, None);
    }
}
