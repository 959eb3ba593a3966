use super::*;

const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

#[test]
fn a_pinned_reference_keeps_the_repository_and_swaps_the_tag_for_the_digest() {
    let hex = DIGEST.trim_start_matches("sha256:");
    for (reference, expected) in [
        (
            "ghcr.io/pod-checkpointer/pod-checkpointer:0.1.0",
            format!("ghcr.io/pod-checkpointer/pod-checkpointer@sha256:{hex}"),
        ),
        (
            "localhost:5000/agent",
            format!("localhost:5000/agent@sha256:{hex}"),
        ),
        (
            "localhost:5000/agent:v2",
            format!("localhost:5000/agent@sha256:{hex}"),
        ),
        ("agent:v1", format!("agent@sha256:{hex}")),
        // A digest already there is replaced, not doubled.
        (
            "registry.test/agent@sha256:ffff",
            format!("registry.test/agent@sha256:{hex}"),
        ),
    ] {
        assert_eq!(
            pinned_reference(reference, DIGEST).unwrap(),
            expected,
            "{reference}"
        );
    }
    assert!(pinned_reference("registry.test/:v1", DIGEST).is_err());
    assert!(pinned_reference("agent:v1", "sha256:abc").is_err());
}

#[test]
fn the_pinned_reference_is_one_the_manifests_accept() {
    let pinned = pinned_reference(ckpt_render::DEFAULT_IMAGE, DIGEST).unwrap();
    let options = ManifestArgs {
        image: pinned.clone(),
        ..ManifestArgs::default()
    }
    .options_for(KubernetesVersion::NEWEST, &ckpt_bin::render::BuiltIn)
    .unwrap();
    let yaml = to_yaml(&render(&options)).unwrap();
    // Every container's image, wherever the YAML folds the long name.
    let images = container_images(&yaml).unwrap();
    assert!(
        !images.is_empty() && images.iter().all(|image| *image == pinned),
        "{images:?}"
    );
    let tagged = container_images(
        &to_yaml(&render(
            &ManifestArgs::default()
                .options_for(KubernetesVersion::NEWEST, &ckpt_bin::render::BuiltIn)
                .unwrap(),
        ))
        .unwrap(),
    )
    .unwrap();
    assert!(
        tagged.iter().all(|image| image == ckpt_render::DEFAULT_IMAGE),
        "{tagged:?}"
    );
}

const CHANGELOG: &str = "# Changelog\n\nIntro.\n\n## [Unreleased]\n\n### Added\n- next thing\n\n\
                         ## [0.2.0] - 2026-12-01\n\n### Fixed\n- a bug\n\n## [0.1.0] - 2026-11-01\n\n- first\n";

#[test]
fn the_changelog_section_is_the_versions_else_unreleased() {
    for (changelog, version, expected) in [
        (
            CHANGELOG,
            "0.2.0",
            Some("## [0.2.0] - 2026-12-01\n\n### Fixed\n- a bug\n\n"),
        ),
        // The last section runs to the end.
        (CHANGELOG, "0.1.0", Some("## [0.1.0] - 2026-11-01\n\n- first\n")),
        (
            CHANGELOG,
            "0.3.0",
            Some("## [Unreleased]\n\n### Added\n- next thing\n\n"),
        ),
        // `## [0.1.0]` is not the section of 0.1.
        ("## [0.1.0]\n- x\n", "0.1", None),
        ("# Changelog\n\nNothing yet.\n", "0.1.0", None),
        (
            "## [unreleased]\n- lower case\n",
            "0.1.0",
            Some("## [unreleased]\n- lower case\n"),
        ),
        // `### ` inside a section does not end it.
        (
            "## [1.0.0]\n### A\n- a\n### B\n- b\n",
            "1.0.0",
            Some("## [1.0.0]\n### A\n- a\n### B\n- b\n"),
        ),
    ] {
        assert_eq!(
            changelog_section(changelog, version),
            expected,
            "{version} of {changelog:?}"
        );
    }
}

#[test]
fn sha256sums_list_every_file_by_name_in_sha256sums_format() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.txt"), "hello\n").unwrap();
    std::fs::write(dir.path().join("a.bin"), "").unwrap();
    let sums = sha256sums(dir.path()).unwrap();
    assert_eq!(
        sums,
        // `printf '' | sha256sum`, `echo hello | sha256sum`
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  a.bin\n\
         5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03  b.txt\n"
    );
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    assert!(sha256sums(dir.path()).is_err(), "a release is flat");
}

#[test]
fn the_output_directory_is_replaced_only_when_empty_or_a_previous_release() {
    let root = tempfile::tempdir().unwrap();
    let staging = |content: &str| {
        let dir = root.path().join("dist.part");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(SUMS_FILE), content).unwrap();
        dir
    };
    let out = root.path().join("dist");
    // Missing: created.
    replace_dir(&staging("first"), &out).unwrap();
    assert_eq!(std::fs::read_to_string(out.join(SUMS_FILE)).unwrap(), "first");
    // A previous release: replaced whole.
    std::fs::write(out.join("stale.tar"), "").unwrap();
    replace_dir(&staging("second"), &out).unwrap();
    assert_eq!(std::fs::read_to_string(out.join(SUMS_FILE)).unwrap(), "second");
    assert!(!out.join("stale.tar").exists());
    assert!(!root.path().join("dist.part").exists());
    // Someone else's files: kept, and the release fails.
    let other = root.path().join("home");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "mine").unwrap();
    let error = replace_dir(&staging("third"), &other).unwrap_err().to_string();
    assert!(error.contains("not a previous release"), "{error}");
    assert_eq!(std::fs::read_to_string(other.join("notes.txt")).unwrap(), "mine");
    // Empty: replaced.
    let empty = root.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    replace_dir(&root.path().join("dist.part"), &empty).unwrap();
    assert_eq!(std::fs::read_to_string(empty.join(SUMS_FILE)).unwrap(), "third");
}
