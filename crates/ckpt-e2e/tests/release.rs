//! `cargo xtask release` as it runs, into a temporary directory: the image archive holds an
//! index of an amd64 and an arm64 image whose binaries are the ones shipped beside it (the
//! arm64 one runs under qemu-user), the install YAML names the index by digest, the SBOM
//! lists the binary's crates, the chart's package templates the same objects as that YAML,
//! the notes say what the release is, and `sha256sum -c` accepts SHA256SUMS.
//!
//! Needs root for what it installs from Debian when missing (musl-tools, clang, llvm,
//! qemu-user-static) and builds both static agents (minutes cold; the image test builds
//! the same ones) and cargo-cyclonedx once into the cache. Not in a plain `cargo test`
//! (`test = false`); `cargo xtask test` runs it.

use std::collections::BTreeMap;
use std::io::Read;
use std::process::Command;

use ckpt_e2e::chart;
use ckpt_e2e::image::{self, Arch, oci};
use ckpt_e2e::release::{self, ReleaseOptions};
use serde_json::Value;

#[test]
fn a_release_is_a_two_platform_image_its_binaries_pinned_manifests_an_sbom_notes_and_sums() {
    if !ckpt_e2e::root_or_skip("installing the cross toolchain and qemu-user (apt-get)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("dist");
    let reference = ckpt_render::DEFAULT_IMAGE;
    let artifacts = release::build_release(&ReleaseOptions {
        reference: reference.to_owned(),
        archs: Arch::ALL.to_vec(),
        output: out.clone(),
    })
    .unwrap();
    let version = env!("CARGO_PKG_VERSION");

    // Every file is summed, and the sums hold.
    let names: Vec<String> = artifacts
        .files
        .iter()
        .map(|(path, _)| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let expected = [
        format!("pod-checkpointer-{version}-linux-amd64"),
        format!("pod-checkpointer-{version}-linux-arm64"),
        format!("pod-checkpointer-{version}.cdx.json"),
        format!("pod-checkpointer-{version}.oci.tar"),
        format!("pod-checkpointer-{version}.tgz"),
        release::MANIFESTS_FILE.to_owned(),
        release::NOTES_FILE.to_owned(),
        release::SUMS_FILE.to_owned(),
    ];
    let mut sorted_expected = expected.to_vec();
    sorted_expected.sort();
    assert_eq!(names, sorted_expected);
    let check = Command::new("sha256sum")
        .args(["--check", "--strict", release::SUMS_FILE])
        .current_dir(&out)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert_eq!(said.lines().count(), names.len() - 1, "{said}");

    // The archive: one image index, one image per platform, each the binary shipped beside it.
    let files = tar_files(&std::fs::read(&artifacts.archive).unwrap());
    let blob = |descriptor: &Value| {
        let hex = descriptor["digest"]
            .as_str()
            .unwrap()
            .strip_prefix("sha256:")
            .unwrap();
        let data = files[&format!("blobs/sha256/{hex}")].clone();
        assert_eq!(oci::sha256_digest(&data), descriptor["digest"].as_str().unwrap());
        data
    };
    let layout_index: Value = serde_json::from_slice(&files["index.json"]).unwrap();
    let named = &layout_index["manifests"][0];
    assert_eq!(named["digest"], artifacts.image_digest.as_str());
    assert_eq!(named["annotations"][oci::ANNOTATION_CONTAINERD_NAME], reference);
    let index: Value = serde_json::from_slice(&blob(named)).unwrap();
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 2);
    for ((arch, binary), descriptor) in artifacts.binaries.iter().zip(manifests) {
        let platform = arch.platform();
        assert_eq!(descriptor["platform"]["architecture"], platform.architecture);
        assert_eq!(descriptor["platform"]["os"], platform.os);
        let manifest: Value = serde_json::from_slice(&blob(descriptor)).unwrap();
        let config: Value = serde_json::from_slice(&blob(&manifest["config"])).unwrap();
        assert_eq!(config["architecture"], platform.architecture);
        let mut layer = Vec::new();
        flate2::read::GzDecoder::new(blob(&manifest["layers"][0]).as_slice())
            .read_to_end(&mut layer)
            .unwrap();
        let shipped = std::fs::read(binary).unwrap();
        assert!(
            tar_files(&layer)["pod-checkpointer"] == shipped,
            "the {arch} image holds {}",
            binary.display()
        );
        assert_eq!(image::elf_machine(&shipped).unwrap(), arch.elf_machine());
        assert!(image::is_static_elf(&shipped).unwrap());
        // Under qemu-user for arm64.
        let version_line = arch.command(binary).unwrap().arg("--version").output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&version_line.stdout).trim(),
            format!("pod-checkpointer {version}"),
            "{arch}"
        );
    }

    // The manifests name the index by digest.
    let yaml = std::fs::read_to_string(&artifacts.manifests).unwrap();
    let pinned = format!(
        "ghcr.io/pod-checkpointer/pod-checkpointer@{}",
        artifacts.image_digest
    );
    let images = release::container_images(&yaml).unwrap();
    assert!(
        !images.is_empty() && images.iter().all(|image| *image == pinned),
        "{images:?}"
    );
    assert!(!yaml.contains(reference), "no tag left: {yaml}");

    // The chart's package templates what the manifests hold (helm, cached by the chart's
    // phase of `cargo xtask test`, or built here).
    let helm = ckpt_e2e::e2e_env::modules::helm().unwrap();
    let templated = chart::template(
        &helm,
        &artifacts.chart,
        ckpt_render::DEFAULT_NAMESPACE,
        ckpt_render::KubernetesVersion::NEWEST,
        &serde_json::json!({}),
    )
    .unwrap();
    let differences = chart::differences(&chart::objects_of_yaml(&yaml).unwrap(), &templated);
    assert!(differences.is_empty(), "{}", differences.join("\n"));

    // The SBOM: CycloneDX, the binary's crates (what it links) and not the build tools.
    let sbom: Value = serde_json::from_slice(&std::fs::read(&artifacts.sbom).unwrap()).unwrap();
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    let components: BTreeMap<&str, &str> = sbom["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["version"].as_str().unwrap_or("")))
        .collect();
    for linked in ["ring", "rustls", "kube-client", "tokio", "ckpt-core"] {
        assert!(components.contains_key(linked), "no {linked}: {components:?}");
    }
    assert!(!components.contains_key("cc"), "a build dependency is listed");

    let notes = std::fs::read_to_string(&artifacts.notes).unwrap();
    for line in [
        format!("# pod-checkpointer {version}"),
        pinned,
        "- linux/arm64".to_owned(),
    ] {
        assert!(notes.contains(&line), "{line} not in:\n{notes}");
    }
}

/// A tar's regular files by path.
fn tar_files(archive: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for entry in tar::Archive::new(archive).entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        files.insert(path, data);
    }
    files
}
