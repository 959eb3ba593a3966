use std::io::Read;

use serde_json::Value;

use super::*;

/// A minimal 64-bit ELF header with one program header of type `segment`.
fn elf_with_segment(segment: u32) -> Vec<u8> {
    let mut elf = vec![0u8; 64 + 56];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[4] = 2; // 64-bit
    elf[5] = 1; // little-endian
    elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
    elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
    elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
    elf[64..68].copy_from_slice(&segment.to_le_bytes());
    elf
}

const PT_LOAD: u32 = 1;
const PT_INTERP: u32 = 3;

#[test]
fn a_binary_is_static_when_it_has_no_program_interpreter() {
    assert!(is_static_elf(&elf_with_segment(PT_LOAD)).unwrap());
    assert!(!is_static_elf(&elf_with_segment(PT_INTERP)).unwrap());
    // This test executable is linked against glibc dynamically.
    let own = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    assert!(!is_static_elf(&own).unwrap());
    assert!(is_static_elf(b"#!/bin/sh\n").is_err());
    let mut truncated = elf_with_segment(PT_LOAD);
    truncated.truncate(66);
    assert!(is_static_elf(&truncated).is_err());
}

/// The image's config, its index annotations and its layer's entries.
struct Unpacked {
    config: Value,
    annotations: Value,
    entries: Vec<LayerEntry>,
}

struct LayerEntry {
    path: String,
    kind: tar::EntryType,
    mode: u32,
    link: Option<String>,
    data: Vec<u8>,
}

fn unpack(image: &oci::Image) -> Unpacked {
    let config: Value = serde_json::from_slice(&image.config.data).unwrap();
    let index: Value = serde_json::from_slice(&image.index).unwrap();
    let mut tar_bytes = Vec::new();
    flate2::read::GzDecoder::new(image.layer.data.as_slice())
        .read_to_end(&mut tar_bytes)
        .unwrap();
    let mut entries = Vec::new();
    for entry in tar::Archive::new(tar_bytes.as_slice()).entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let kind = entry.header().entry_type();
        let mode = entry.header().mode().unwrap();
        let link = entry
            .link_name()
            .unwrap()
            .map(|l| l.to_string_lossy().into_owned());
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        entries.push(LayerEntry {
            path,
            kind,
            mode,
            link,
            data,
        });
    }
    Unpacked {
        config,
        annotations: index["manifests"][0]["annotations"].clone(),
        entries,
    }
}

fn paths(unpacked: &Unpacked) -> Vec<&str> {
    unpacked.entries.iter().map(|e| e.path.as_str()).collect()
}

#[test]
fn the_agent_image_runs_the_binary_at_the_root_among_users_hosts_cas_and_tmp() {
    let elf = elf_with_segment(PT_LOAD);
    let bundle = b"-----BEGIN CERTIFICATE-----\n".to_vec();
    let (config, layer) = agent(elf.clone(), bundle.clone(), "registry.test/agent:v9").unwrap();
    let unpacked = unpack(&oci::Image::build(&config, &layer).unwrap());
    assert_eq!(
        unpacked.annotations[oci::ANNOTATION_CONTAINERD_NAME],
        "registry.test/agent:v9"
    );
    assert_eq!(unpacked.annotations[oci::ANNOTATION_REF_NAME], "v9");
    assert_eq!(
        paths(&unpacked),
        [
            "checkpoint",
            "etc/",
            "etc/group",
            "etc/hosts",
            "etc/passwd",
            "etc/ssl/",
            "etc/ssl/certs/",
            "etc/ssl/certs/ca-certificates.crt",
            "pod-checkpointer",
            "tmp/",
        ]
    );
    let entry = |path: &str| unpacked.entries.iter().find(|e| e.path == path).unwrap();
    let text = |path: &str| String::from_utf8(entry(path).data.clone()).unwrap();
    let binary = entry("pod-checkpointer");
    assert_eq!((binary.mode, &binary.data), (0o755, &elf));
    // The original's command path runs the same binary.
    assert_eq!(entry("checkpoint").link.as_deref(), Some("pod-checkpointer"));
    let cas = entry("etc/ssl/certs/ca-certificates.crt");
    assert_eq!((cas.mode, &cas.data), (0o644, &bundle));
    assert_eq!(entry("tmp/").mode, 0o1777, "/tmp is sticky and world-writable");
    let passwd = text("etc/passwd");
    assert!(passwd.starts_with("root:x:0:0:"), "{passwd}");
    assert!(passwd.contains("\nnobody:x:65534:65534:"), "{passwd}");
    assert!(text("etc/group").contains("\nnobody:x:65534:"));
    assert!(text("etc/hosts").starts_with("127.0.0.1\tlocalhost\n"));

    let config = &unpacked.config["config"];
    assert_eq!(config["Entrypoint"], serde_json::json!(["/pod-checkpointer"]));
    assert_eq!(
        config["Cmd"],
        serde_json::json!(["run", "--config", "/etc/pod-checkpointer/config.yaml"])
    );
    assert_eq!(config["Labels"]["org.opencontainers.image.version"], "v9");
    // Two tags of one binary are two images: a runtime tells them apart by ID.
    let (other_tag, _) = agent(elf.clone(), bundle.clone(), "registry.test/agent:v10").unwrap();
    assert_ne!(
        oci::Image::build(&other_tag, &layer).unwrap().digest(),
        oci::Image::build(&config_of(&elf, &bundle, "registry.test/agent:v9"), &layer)
            .unwrap()
            .digest()
    );

    // A dynamically linked binary would not start in an image without a libc.
    let refused = agent(elf_with_segment(PT_INTERP), bundle, "registry.test/agent:v9").unwrap_err();
    assert!(refused.to_string().contains("dynamically linked"), "{refused}");
}

#[test]
fn images_are_written_where_asked() {
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("pause");
    std::fs::write(&binary, elf_with_segment(PT_LOAD)).unwrap();
    let out = dir.path().join("new/dir/pause.tar");
    let image = pause_image(&binary, &out).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), image.archive().unwrap());
    assert_eq!(
        std::fs::read_dir(out.parent().unwrap()).unwrap().count(),
        1,
        "no leftover"
    );
}

#[test]
fn the_pause_image_holds_only_pause_under_the_kubelets_default_name() {
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("pause");
    std::fs::write(&binary, elf_with_segment(PT_LOAD)).unwrap();
    let image = pause_image(&binary, &dir.path().join("pause.tar")).unwrap();
    let unpacked = unpack(&image);
    assert_eq!(
        unpacked.annotations[oci::ANNOTATION_CONTAINERD_NAME],
        "k8s.gcr.io/pause:3.2"
    );
    assert_eq!(unpacked.annotations[oci::ANNOTATION_REF_NAME], "3.2");
    assert_eq!(paths(&unpacked), ["pause"]);
    assert_eq!(unpacked.entries[0].mode, 0o755);
    assert_eq!(
        unpacked.config["config"]["Entrypoint"],
        serde_json::json!(["/pause"])
    );
}

#[test]
fn the_busybox_image_links_its_applets_to_busybox() {
    let (config, layer) = busybox(elf_with_segment(PT_LOAD)).unwrap();
    let image = oci::Image::build(&config, &layer).unwrap();
    let unpacked = unpack(&image);
    assert_eq!(
        unpacked.annotations[oci::ANNOTATION_CONTAINERD_NAME],
        BUSYBOX_IMAGE
    );
    assert_eq!(unpacked.config["config"]["Cmd"], serde_json::json!(["sh"]));
    assert_eq!(unpacked.config["config"]["Env"], serde_json::json!(["PATH=/bin"]));
    assert!(unpacked.config["config"].get("Entrypoint").is_none());
    let links: Vec<&str> = unpacked
        .entries
        .iter()
        .filter(|e| e.kind == tar::EntryType::Symlink)
        .inspect(|e| assert_eq!(e.link.as_deref(), Some("busybox"), "{}", e.path))
        .map(|e| e.path.as_str())
        .collect();
    for applet in ["sh", "sleep", "cat", "ls", "echo", "date", "id", "wget"] {
        assert!(
            links.contains(&format!("bin/{applet}").as_str()),
            "no {applet}: {links:?}"
        );
    }
    assert_eq!(links.len(), BUSYBOX_APPLETS.len());
    let binary = unpacked.entries.iter().find(|e| e.path == "bin/busybox").unwrap();
    assert_eq!(binary.mode, 0o755);
    assert!(paths(&unpacked).contains(&"etc/passwd"));
    assert!(
        busybox(elf_with_segment(PT_INTERP)).is_err(),
        "a dynamic busybox is refused"
    );
}

fn config_of(elf: &[u8], bundle: &[u8], reference: &str) -> oci::ImageConfig {
    agent(elf.to_vec(), bundle.to_vec(), reference).unwrap().0
}

#[test]
fn names_tags_and_archive_names() {
    assert_eq!(
        version_of("ghcr.io/pod-checkpointer/pod-checkpointer:0.1.0"),
        "0.1.0"
    );
    assert_eq!(version_of("localhost:5000/agent"), env!("CARGO_PKG_VERSION"));
    assert_eq!(version_of("agent:v1-rc"), "v1-rc");
    assert_eq!(
        with_tag("ghcr.io/pod-checkpointer/pod-checkpointer:0.1.0", "dev"),
        "ghcr.io/pod-checkpointer/pod-checkpointer:dev"
    );
    assert_eq!(with_tag("localhost:5000/agent", "v2"), "localhost:5000/agent:v2");
    assert_eq!(with_tag("agent:v1", "v2"), "agent:v2");
    assert_eq!(
        archive_name("ghcr.io/pod-checkpointer/pod-checkpointer:0.1.0"),
        "pod-checkpointer-0.1.0.oci.tar"
    );
    assert!(ckpt_render::DEFAULT_IMAGE.ends_with(&format!(":{}", env!("CARGO_PKG_VERSION"))));
}

/// The Containerfile builds the same binary the same way into the same files; what both
/// spell out must not drift apart.
#[test]
fn the_containerfile_lays_out_the_same_image() {
    let containerfile = std::fs::read_to_string(crate::project_root().join("Containerfile")).unwrap();
    let printf = |text: &str| text.replace('\n', "\\n").replace('\t', "\\t");
    for (content, path) in [
        (PASSWD, "/etc/passwd"),
        (GROUP, "/etc/group"),
        (HOSTS, "/etc/hosts"),
    ] {
        let line = format!("printf '{}' > /rootfs{path}", printf(content));
        assert!(containerfile.contains(&line), "the Containerfile lacks {line}");
    }
    // Each architecture: TARGETARCH's name picks its Rust target, and the build has the
    // same compiler, archiver and linker as xtask's, and the same Debian packages.
    for arch in Arch::ALL {
        let target = format!("{}) echo {} > /rust-target;", arch.name(), arch.rust_target());
        assert!(
            containerfile.contains(&target),
            "the Containerfile lacks {target}"
        );
        for (name, value) in arch.build_env() {
            let line = format!("{name}={value} ");
            assert!(containerfile.contains(&line), "the Containerfile lacks {line}");
        }
        let packages = format!("tools=\"{}", arch.build_packages().join(" "));
        assert!(
            containerfile.contains(&packages),
            "the Containerfile lacks {packages}"
        );
    }
    for line in [
        "--target \"$target\"",
        "ARG TARGETARCH",
        "CARGO_PROFILE_RELEASE_STRIP=symbols",
        "cargo build --release --locked -p ckpt-bin --bin pod-checkpointer",
        &format!(
            "cp /etc/ssl/certs/ca-certificates.crt /rootfs{}",
            CA_BUNDLE.trim_end_matches("ca-certificates.crt")
        ),
        "chmod 1777 /rootfs/tmp",
        "FROM scratch",
        "ENV PATH=/\n",
        "ENTRYPOINT [\"/pod-checkpointer\"]",
        "CMD [\"run\", \"--config\", \"/etc/pod-checkpointer/config.yaml\"]",
        &format!(
            "org.opencontainers.image.version=\"{}\"",
            env!("CARGO_PKG_VERSION")
        ),
    ] {
        assert!(containerfile.contains(line), "the Containerfile lacks {line}");
    }
}
