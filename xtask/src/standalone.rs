//! `cargo xtask test`'s check that each crate stands alone: `cargo check -p <crate>` for
//! every crate under `crates/` (a crate that builds only thanks to a feature another
//! workspace member turns on fails here), then `cargo package` of the publishable ones
//! (versioned internal dependencies, complete metadata, nothing outside the package).
//!
//! The crates come from `cargo metadata`, so a new crate is covered without editing this.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use ckpt_e2e::command::{run_command, run_on_terminal};
use serde_json::Value;

/// Library crates do not choose k8s-openapi's Kubernetes version (only the binary does);
/// built without their dev-dependencies they get it from this variable, as k8s-openapi
/// asks. It must name the binary's version: k8s-openapi refuses two.
const K8S_OPENAPI_VERSION: (&str, &str) = ("K8S_OPENAPI_ENABLED_VERSION", "1.37");

/// Which crates the phase checks and packages.
#[derive(Debug, PartialEq, Eq)]
struct Crates {
    /// Every crate under `crates/`: checked alone.
    check: Vec<String>,
    /// Those not marked `publish = false` (test doubles): packaged.
    package: Vec<String>,
}

/// Reads the workspace's crates from `cargo metadata --no-deps` output.
fn crates_of(metadata: &Value) -> anyhow::Result<Crates> {
    let root = metadata["workspace_root"]
        .as_str()
        .context("cargo metadata has no workspace_root")?;
    let crates_dir = Path::new(root).join("crates");
    let packages = metadata["packages"]
        .as_array()
        .context("cargo metadata has no packages")?;
    let mut crates = Crates {
        check: Vec::new(),
        package: Vec::new(),
    };
    for package in packages {
        let name = package["name"].as_str().context("a package without a name")?;
        let manifest = package["manifest_path"].as_str().unwrap_or_default();
        if !Path::new(manifest).starts_with(&crates_dir) {
            continue;
        }
        crates.check.push(name.to_owned());
        // `publish = false` is an empty list of registries; `null` means any.
        let unpublishable = package["publish"].as_array().is_some_and(Vec::is_empty);
        if !unpublishable {
            crates.package.push(name.to_owned());
        }
    }
    crates.check.sort();
    crates.package.sort();
    Ok(crates)
}

/// Runs the phase; returns how long it took.
pub(crate) fn run(root: &Path) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let output = run_command(
        Command::new("cargo")
            .args(["metadata", "--no-deps", "--format-version", "1", "--locked"])
            .current_dir(root),
    )?;
    let metadata: Value = serde_json::from_str(&output).context("cargo metadata's JSON")?;
    let crates = crates_of(&metadata)?;
    anyhow::ensure!(!crates.check.is_empty(), "no crates found under crates/");
    // A target dir of its own: each crate alone resolves other features of shared
    // dependencies (kube, rustls) than the workspace does, and in one target dir the two
    // builds would keep replacing each other's artifacts (a minute per run, each way).
    let target_dir = Path::new(
        metadata["target_directory"]
            .as_str()
            .context("cargo metadata has no target_directory")?,
    )
    .join("standalone");
    for name in &crates.check {
        cargo(root, &target_dir, &["check", "-p", name, "--locked"])?;
    }
    // Without verification: that would build every crate again from its package (minutes);
    // the checks above build each one alone already.
    let mut args = vec!["package", "--no-verify", "--locked", "--allow-dirty"];
    for name in &crates.package {
        args.extend(["-p", name.as_str()]);
    }
    cargo(root, &target_dir, &args)?;
    Ok(started.elapsed())
}

/// `cargo args…` in the workspace root with the Kubernetes version and `target_dir` set,
/// echoed first.
fn cargo(root: &Path, target_dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let (variable, version) = K8S_OPENAPI_VERSION;
    eprintln!(
        "$ {variable}={version} CARGO_TARGET_DIR={} cargo {}",
        target_dir.display(),
        args.join(" ")
    );
    run_on_terminal(
        Command::new("cargo")
            .args(args)
            .env(variable, version)
            .env("CARGO_TARGET_DIR", target_dir)
            .current_dir(root),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn check(packages: Value, expected: (&[&str], &[&str])) {
        let metadata = json!({"workspace_root": "/ws", "packages": packages});
        let crates = crates_of(&metadata).expect("readable metadata");
        let (check, package) = expected;
        assert_eq!(
            (crates.check.as_slice(), crates.package.as_slice()),
            (
                check.iter().map(|s| s.to_string()).collect::<Vec<_>>().as_slice(),
                package
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .as_slice()
            ),
            "{metadata}"
        );
    }

    fn package(name: &str, dir: &str, publish: Value) -> Value {
        json!({
            "name": name,
            "manifest_path": format!("/ws/{dir}/Cargo.toml"),
            "publish": publish,
        })
    }

    #[test]
    fn crates_under_crates_dir_are_checked_and_publishable_ones_packaged() {
        check(
            json!([
                package("ckpt-core", "crates/ckpt-core", Value::Null),
                package("ckpt-bin", "crates/ckpt-bin", Value::Null),
                // A publish = false test crate: checked, not packaged.
                package("ckpt-testkit", "crates/ckpt-testkit", json!([])),
                // Published to a named registry only: still packaged.
                package("ckpt-cri", "crates/ckpt-cri", json!(["internal"])),
                // The workspace's tool is not a crate of the product.
                package("xtask", "xtask", json!([])),
                // A directory that merely starts like crates/ is not under it.
                package("other", "crates-old/other", Value::Null),
            ]),
            (
                &["ckpt-bin", "ckpt-core", "ckpt-cri", "ckpt-testkit"],
                &["ckpt-bin", "ckpt-core", "ckpt-cri"],
            ),
        );
        check(json!([]), (&[], &[]));
    }

    #[test]
    fn unreadable_metadata_is_an_error() {
        assert!(crates_of(&json!({"packages": []})).is_err());
        assert!(crates_of(&json!({"workspace_root": "/ws"})).is_err());
    }

    /// The license every crate declares (`[workspace.package]`) is the one in LICENSE.
    #[test]
    fn the_license_file_is_the_declared_license() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the workspace");
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
        assert!(
            manifest.contains("\nlicense = \"Apache-2.0\"\n"),
            "the workspace's license changed"
        );
        let license = std::fs::read_to_string(root.join("LICENSE")).expect("LICENSE");
        let words: Vec<&str> = license.split_whitespace().take(5).collect();
        assert_eq!(words, ["Apache", "License", "Version", "2.0,", "January"]);
    }
}
