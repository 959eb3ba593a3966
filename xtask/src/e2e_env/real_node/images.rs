//! The node's two built-in images, written as OCI image-layout archives without a container
//! engine and imported into containerd's `k8s.io` namespace (the one its CRI plugin serves):
//!
//! - [`PAUSE_IMAGE`]: the pause binary the build compiles from the Kubernetes source, the
//!   sandbox of every pod;
//! - [`BUSYBOX_IMAGE`]: Debian's static busybox with a link per applet, for test pods.
//!
//! TO BE REPLACED: [`write_oci_archive`] is a minimal stand-in until the image helper's OCI
//! archive writer (`cargo xtask image`, branch wave4-image) is merged; the import step
//! ([`import`]) takes any archive path and stays.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use ckpt_core::sha256_hex;
use serde_json::json;

use crate::e2e_env::process::run_command;

/// The kubelet's default sandbox image name, so both the kubelet and containerd find it.
pub const PAUSE_IMAGE: &str = "k8s.gcr.io/pause:3.2";
/// Debian bookworm's busybox-static (1.35), under a name no registry serves.
pub const BUSYBOX_IMAGE: &str = "localhost/pod-checkpointer/busybox:1.35-static";
/// Where busybox-static installs the binary.
pub(super) const BUSYBOX_BINARY: &str = "/bin/busybox";

/// One entry of an image's single layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum LayerEntry {
    Dir {
        path: String,
        mode: u32,
    },
    File {
        path: String,
        mode: u32,
        contents: Vec<u8>,
    },
    Symlink {
        path: String,
        target: String,
    },
}

/// What a minimal image holds besides its programs: the usual top-level dirs, a world-writable
/// /tmp, and root and nobody in /etc/passwd and /etc/group.
fn base_entries() -> Vec<LayerEntry> {
    let mut entries: Vec<LayerEntry> = ["bin", "dev", "etc", "proc", "root", "sys", "var"]
        .into_iter()
        .map(|path| LayerEntry::Dir {
            path: path.into(),
            mode: 0o755,
        })
        .collect();
    entries.push(LayerEntry::Dir {
        path: "tmp".into(),
        mode: 0o1777,
    });
    entries.push(LayerEntry::File {
        path: "etc/passwd".into(),
        mode: 0o644,
        contents: b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
            .to_vec(),
    });
    entries.push(LayerEntry::File {
        path: "etc/group".into(),
        mode: 0o644,
        contents: b"root:x:0:\nnogroup:x:65534:\n".to_vec(),
    });
    entries
}

/// The pause image: `/pause` as its entrypoint.
pub(super) fn pause_image(pause_binary: &Path) -> anyhow::Result<Image> {
    let mut entries = base_entries();
    entries.push(LayerEntry::File {
        path: "pause".into(),
        mode: 0o755,
        contents: fs::read(pause_binary)
            .with_context(|| format!("cannot read {}", pause_binary.display()))?,
    });
    Ok(Image {
        reference: PAUSE_IMAGE.into(),
        entrypoint: vec!["/pause".into()],
        entries,
    })
}

/// The busybox image: `/bin/busybox`, a link in /bin for each applet it lists, `/bin/sh` as
/// its entrypoint.
pub(super) fn busybox_image() -> anyhow::Result<Image> {
    let binary = Path::new(BUSYBOX_BINARY);
    let applets = run_command(Command::new(binary).arg("--list"))
        .with_context(|| format!("{BUSYBOX_BINARY} (busybox-static) cannot list its applets"))?;
    let mut entries = base_entries();
    entries.push(LayerEntry::File {
        path: "bin/busybox".into(),
        mode: 0o755,
        contents: fs::read(binary).with_context(|| format!("cannot read {BUSYBOX_BINARY}"))?,
    });
    let mut names: Vec<&str> = applets
        .lines()
        .map(str::trim)
        .filter(|name| !name.is_empty() && *name != "busybox" && !name.contains('/'))
        .collect();
    names.sort_unstable();
    names.dedup();
    entries.extend(names.into_iter().map(|name| LayerEntry::Symlink {
        path: format!("bin/{name}"),
        target: "busybox".into(),
    }));
    Ok(Image {
        reference: BUSYBOX_IMAGE.into(),
        entrypoint: vec!["/bin/sh".into()],
        entries,
    })
}

/// A single-layer linux/amd64 image.
#[derive(Clone, Debug)]
pub(super) struct Image {
    pub(super) reference: String,
    pub(super) entrypoint: Vec<String>,
    pub(super) entries: Vec<LayerEntry>,
}

/// Writes `image` as an OCI image-layout tar at `path`: `oci-layout`, `index.json` (with the
/// `io.containerd.image.name` annotation `ctr images import` names the image by) and the
/// blobs. The layer is an uncompressed tar with fixed times and owners, so the same input
/// gives the same digests.
pub(super) fn write_oci_archive(image: &Image, path: &Path) -> anyhow::Result<String> {
    let mut layer = TarWriter::default();
    for entry in &image.entries {
        layer.append(entry)?;
    }
    let layer = layer.finish();
    let layer_digest = format!("sha256:{}", sha256_hex(&layer));
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": image.entrypoint,
            "Env": ["PATH=/bin"],
            "WorkingDir": "/"
        },
        "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
        "history": [{ "created_by": "cargo xtask e2e-env (real node)" }]
    }))?;
    let config_digest = format!("sha256:{}", sha256_hex(&config));
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config.len()
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": layer.len()
        }]
    }))?;
    let manifest_digest = format!("sha256:{}", sha256_hex(&manifest));
    let tag = image.reference.rsplit_once(':').map_or("latest", |(_, tag)| tag);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest.len(),
            "platform": { "architecture": "amd64", "os": "linux" },
            "annotations": {
                "io.containerd.image.name": image.reference,
                "org.opencontainers.image.ref.name": tag
            }
        }]
    }))?;

    let mut archive = TarWriter::default();
    let file = |path: String, contents: Vec<u8>| LayerEntry::File {
        path,
        mode: 0o644,
        contents,
    };
    archive.append(&file(
        "oci-layout".into(),
        br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
    ))?;
    archive.append(&LayerEntry::Dir {
        path: "blobs".into(),
        mode: 0o755,
    })?;
    archive.append(&LayerEntry::Dir {
        path: "blobs/sha256".into(),
        mode: 0o755,
    })?;
    for blob in [layer, config, manifest] {
        archive.append(&file(format!("blobs/sha256/{}", sha256_hex(&blob)), blob))?;
    }
    archive.append(&file("index.json".into(), index))?;
    fs::write(path, archive.finish()).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(manifest_digest)
}

/// `ctr images import` of an OCI (or Docker) archive into the `k8s.io` namespace of the
/// containerd at `socket` (a host path), unpacked for the default snapshotter.
pub(super) fn import(socket: &Path, archive: &Path) -> anyhow::Result<()> {
    run_command(
        Command::new("ctr")
            .arg("--address")
            .arg(socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(archive),
    )
    .with_context(|| format!("cannot import {}", archive.display()))
    .map(drop)
}

/// Writes the built-in images into `dir`; returns their archives.
pub(super) fn write_builtin(dir: &Path, pause_binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut archives = Vec::new();
    for (name, image) in [
        ("pause", pause_image(pause_binary)?),
        ("busybox", busybox_image()?),
    ] {
        let path = dir.join(format!("{name}.tar"));
        write_oci_archive(&image, &path)?;
        archives.push(path);
    }
    Ok(archives)
}

const BLOCK: usize = 512;

/// A POSIX ustar writer for names of up to 100 bytes, owned by root with time 0.
#[derive(Default)]
struct TarWriter {
    out: Vec<u8>,
}

impl TarWriter {
    fn append(&mut self, entry: &LayerEntry) -> anyhow::Result<()> {
        let (path, mode, type_flag, link, contents): (String, u32, u8, &str, &[u8]) = match entry {
            // Directory names end in a slash, as tar writes them.
            LayerEntry::Dir { path, mode } => (format!("{path}/"), *mode, b'5', "", &[]),
            LayerEntry::File { path, mode, contents } => (path.clone(), *mode, b'0', "", contents),
            LayerEntry::Symlink { path, target } => (path.clone(), 0o777, b'2', target, &[]),
        };
        anyhow::ensure!(path.len() < 100 && link.len() < 100, "tar name too long: {path}");
        let mut header = [0u8; BLOCK];
        header[..path.len()].copy_from_slice(path.as_bytes());
        octal(&mut header[100..108], u64::from(mode));
        octal(&mut header[108..116], 0);
        octal(&mut header[116..124], 0);
        octal(&mut header[124..136], contents.len() as u64);
        octal(&mut header[136..148], 0);
        header[156] = type_flag;
        header[157..157 + link.len()].copy_from_slice(link.as_bytes());
        header[257..263].copy_from_slice(b"ustar\0");
        header[263..265].copy_from_slice(b"00");
        header[265..269].copy_from_slice(b"root");
        header[297..301].copy_from_slice(b"root");
        // The checksum is computed with its own field as spaces.
        header[148..156].fill(b' ');
        let sum: u32 = header.iter().map(|b| u32::from(*b)).sum();
        let text = format!("{sum:06o}\0 ");
        header[148..156].copy_from_slice(text.as_bytes());
        self.out.extend_from_slice(&header);
        self.out.extend_from_slice(contents);
        let padding = (BLOCK - contents.len() % BLOCK) % BLOCK;
        self.out.extend(std::iter::repeat_n(0, padding));
        Ok(())
    }

    /// The archive with its end-of-archive marker (two zero blocks).
    fn finish(mut self) -> Vec<u8> {
        self.out.extend(std::iter::repeat_n(0, 2 * BLOCK));
        self.out
    }
}

/// A zero-padded octal number filling `field` but its last byte (NUL).
fn octal(field: &mut [u8], value: u64) {
    let width = field.len() - 1;
    let text = format!("{value:0width$o}");
    field[..width].copy_from_slice(text.as_bytes());
    field[width] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tar -tvf` reads back what the writer wrote.
    #[test]
    fn tar_lists_the_entries() {
        let dir = tempfile_dir();
        let mut tar = TarWriter::default();
        for entry in [
            LayerEntry::Dir {
                path: "bin".into(),
                mode: 0o755,
            },
            LayerEntry::File {
                path: "bin/hello".into(),
                mode: 0o755,
                contents: b"#!/bin/sh\necho hi\n".to_vec(),
            },
            LayerEntry::Symlink {
                path: "bin/hi".into(),
                target: "hello".into(),
            },
        ] {
            tar.append(&entry).unwrap();
        }
        let path = dir.join("t.tar");
        fs::write(&path, tar.finish()).unwrap();
        let listing = run_command(Command::new("tar").arg("-tvf").arg(&path)).unwrap();
        let lines: Vec<&str> = listing.lines().collect();
        assert_eq!(lines.len(), 3, "{listing}");
        assert!(lines[0].starts_with("drwxr-xr-x root/root") && lines[0].ends_with(" bin/"));
        assert!(lines[1].contains(" 18 ") && lines[1].ends_with(" bin/hello"));
        assert!(lines[2].starts_with("lrwxrwxrwx") && lines[2].ends_with("bin/hi -> hello"));
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn an_oci_archive_is_deterministic_and_names_its_image() {
        let dir = tempfile_dir();
        let image = Image {
            reference: "localhost/test:1".into(),
            entrypoint: vec!["/x".into()],
            entries: base_entries(),
        };
        let (a, b) = (dir.join("a.tar"), dir.join("b.tar"));
        let digest = write_oci_archive(&image, &a).unwrap();
        assert_eq!(write_oci_archive(&image, &b).unwrap(), digest);
        assert_eq!(fs::read(&a).unwrap(), fs::read(&b).unwrap());
        let listing = run_command(Command::new("tar").arg("-tf").arg(&a)).unwrap();
        assert!(listing.lines().any(|l| l == "index.json"));
        assert!(
            listing
                .lines()
                .any(|l| l == format!("blobs/sha256/{}", &digest[7..]))
        );
        let index = run_command(Command::new("tar").arg("-xOf").arg(&a).arg("index.json")).unwrap();
        let index: serde_json::Value = serde_json::from_str(&index).unwrap();
        let annotations = &index["manifests"][0]["annotations"];
        assert_eq!(annotations["io.containerd.image.name"], "localhost/test:1");
        assert_eq!(annotations["org.opencontainers.image.ref.name"], "1");
        let _ = fs::remove_dir_all(dir);
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "xtask-images-{}",
            crate::e2e_env::process::random_hex(4).unwrap()
        ));
        fs::create_dir_all(&dir).unwrap();
        dir
    }
}
