//! `cargo xtask image`: the agent's OCI image archive, built without a container engine, and
//! the two other images a real node needs (the pause image and a busybox for test pods).
//!
//! The agent is a static, stripped release binary for the musl target (rustls + ring: no
//! libc at run time, no NSS), alone at `/pod-checkpointer` with `/etc/passwd`, `/etc/group`,
//! `/etc/hosts`, Debian's CA bundle and `/tmp`. The archive ([`oci`]) is deterministic: the
//! same binary gives the same image digest. It loads with `ctr images import`, `podman load`
//! and `skopeo copy oci-archive:…`.

pub mod oci;
mod static_binary;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;

use crate::apt::Apt;
use crate::progress::Progress;
use crate::progress::human_duration;

pub(crate) use static_binary::nested_cargo;
pub use static_binary::{
    Arch, STATIC_TARGET, build_static_agent, build_static_agent_for, elf_machine, is_static_elf,
    static_build, static_toolchain,
};

/// The kubelet's default sandbox image (`--pod-infra-container-image`), which a node without
/// a registry must have imported.
pub const PAUSE_IMAGE: &str = "k8s.gcr.io/pause:3.2";
/// The test pods' image: Debian's busybox-static (1.35 in bookworm). `localhost/` says it
/// is built here and never pulled.
pub const BUSYBOX_IMAGE: &str = "localhost/busybox:1.35-static";
/// The self-hosted control plane's image, hyperkube-style (bootkube ran hyperkube): the
/// static kube-apiserver, kube-controller-manager and kube-scheduler of the release the
/// plane runs in `/usr/local/bin`, each pod naming its program in `command`. `localhost/`:
/// never pulled; the tag says it is the end-to-end build, whichever release that is.
pub const CONTROL_PLANE_IMAGE: &str = "localhost/kube-control-plane:e2e";
/// Where [`control_plane_image`] puts the programs.
pub const CONTROL_PLANE_BIN_DIR: &str = "/usr/local/bin";
/// Debian's statically linked busybox (package busybox-static).
const BUSYBOX_BINARY: &str = "/bin/busybox";
/// The busybox applets the test image links in `/bin`: a shell and what test pods use.
pub const BUSYBOX_APPLETS: &[&str] = &[
    "[", "cat", "chmod", "cp", "date", "echo", "env", "false", "grep", "head", "hostname", "id", "kill",
    "ln", "ls", "mkdir", "mv", "nc", "printf", "ps", "rm", "sed", "sh", "sleep", "stat", "su", "tail",
    "test", "touch", "true", "wc", "wget", "whoami",
];

/// root and nobody, for images whose programs look users up (`id`, a pod's `runAsUser`).
const PASSWD: &str =
    "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnobody:x:65534:\n";
/// musl resolves names from /etc/hosts, then DNS; without this file `localhost` would need a
/// name server. In a pod the kubelet mounts its own /etc/hosts over it.
const HOSTS: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";

/// The CA bundle, where rustls-platform-verifier looks for it. kube's client needs one
/// whenever a kubeconfig names no CA, even with `insecure-skip-tls-verify` (and so does the
/// kubelet client with `--kubelet-insecure`): without one the agent cannot build its client.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

const PROGRESS: Progress = Progress::new("image");

/// Build the agent's OCI image archive (a static binary in a minimal image), without a
/// container engine; prints the archive's path and the image's digest.
#[derive(clap::Args)]
pub struct Image {
    /// The image's full name [default: the rendered manifests' image,
    /// ghcr.io/pod-checkpointer/pod-checkpointer:<version>]
    #[arg(long, value_name = "NAME", conflicts_with = "tag")]
    image: Option<String>,
    /// Only the tag of the default name
    #[arg(long, value_name = "TAG")]
    tag: Option<String>,
    /// Where to write the archive [default: <target dir>/image/<name>-<tag>.oci.tar]
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// A static agent binary to ship instead of building this workspace's: e.g. a custom
    /// binary with extra strategies (docs/development.md, "A strategy of your own"), built for the musl
    /// target. A dynamically linked one is refused: the image has no libc
    #[arg(long, value_name = "PATH")]
    binary: Option<PathBuf>,
}

impl Image {
    pub fn run(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        let reference = match (&self.image, &self.tag) {
            (Some(image), _) => image.clone(),
            (None, Some(tag)) => with_tag(ckpt_render::DEFAULT_IMAGE, tag),
            (None, None) => ckpt_render::DEFAULT_IMAGE.to_owned(),
        };
        let output = self
            .output
            .clone()
            .unwrap_or_else(|| target_dir().join("image").join(archive_name(&reference)));
        let binary = match &self.binary {
            Some(path) => {
                let elf = std::fs::read(path)
                    .with_context(|| format!("--binary: cannot read {}", path.display()))?;
                anyhow::ensure!(
                    is_static_elf(&elf).with_context(|| format!("--binary {}", path.display()))?,
                    "--binary {}: dynamically linked; the image has no libc (build it with --target {STATIC_TARGET})",
                    path.display()
                );
                path.clone()
            }
            None => build_static_agent()?,
        };
        let image = agent_image(&binary, &reference, &output)?;
        PROGRESS.say(&format!(
            "{reference}: {} ({}; the binary {}) in {}",
            output.display(),
            human_size(std::fs::metadata(&output)?.len()),
            human_size(std::fs::metadata(&binary)?.len()),
            human_duration(started.elapsed())
        ));
        println!("{}", output.display());
        println!("{}", image.digest());
        Ok(())
    }
}

/// `reference` with its tag replaced (or added).
fn with_tag(reference: &str, tag: &str) -> String {
    let (repository, name) = reference.rsplit_once('/').unwrap_or(("", reference));
    let name = name.split_once(':').map_or(name, |(name, _)| name);
    if repository.is_empty() {
        format!("{name}:{tag}")
    } else {
        format!("{repository}/{name}:{tag}")
    }
}

/// The tag of `reference` (`…/pod-checkpointer:0.1.0` → `0.1.0`), else the crate's version.
fn version_of(reference: &str) -> &str {
    let name = reference.rsplit('/').next().unwrap_or(reference);
    name.split_once(':')
        .map_or(env!("CARGO_PKG_VERSION"), |(_, tag)| tag)
}

/// `ghcr.io/x/pod-checkpointer:0.1.0` → `pod-checkpointer-0.1.0.oci.tar`.
pub fn archive_name(reference: &str) -> String {
    let name = reference.rsplit('/').next().unwrap_or(reference);
    format!("{}.oci.tar", name.replace(':', "-"))
}

/// `$CARGO_TARGET_DIR`, or the workspace's `target/`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| crate::project_root().join("target"), PathBuf::from)
}

pub fn human_size(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The agent's image: `binary` (a static build, see [`build_static_agent`]) at
/// `/pod-checkpointer`, its entry point, with Debian's CA bundle; named `reference`, written
/// to `out`.
pub fn agent_image(binary: &Path, reference: &str, out: &Path) -> anyhow::Result<oci::Image> {
    let data = std::fs::read(binary).with_context(|| format!("cannot read {}", binary.display()))?;
    let (config, layer) = agent(data, ca_bundle()?, reference)?;
    write(&config, &layer, out)
}

/// The agent's image for several architectures, as one image index: each of `binaries` (a
/// static build for its architecture, see [`build_static_agent_for`]; a binary of another
/// CPU is refused) in [`agent_image`]'s files, under one name, written to `out`. The amd64
/// manifest is the very one [`agent_image`] builds from the same binary and name.
pub fn agent_multi_platform_image(
    binaries: &[(Arch, PathBuf)],
    reference: &str,
    out: &Path,
) -> anyhow::Result<oci::MultiPlatformImage> {
    let ca_bundle = ca_bundle()?;
    let mut images = Vec::new();
    for (arch, binary) in binaries {
        let data = std::fs::read(binary).with_context(|| format!("cannot read {}", binary.display()))?;
        let machine = elf_machine(&data).with_context(|| binary.display().to_string())?;
        anyhow::ensure!(
            machine == arch.elf_machine(),
            "{} is not an {arch} program (its ELF machine is {machine}, not {})",
            binary.display(),
            arch.elf_machine()
        );
        let (config, layer) = agent(data, ca_bundle.clone(), reference)?;
        images.push(oci::Image::build_for(
            &config,
            &layer,
            oci::Compression::best(),
            arch.platform(),
        )?);
    }
    let image = oci::MultiPlatformImage::build(reference, images)?;
    image.write(out)?;
    let platforms: Vec<String> = image.images.iter().map(|i| i.platform.to_string()).collect();
    PROGRESS.say(&format!(
        "{reference} ({}): {} ({})",
        platforms.join(", "),
        out.display(),
        image.digest()
    ));
    Ok(image)
}

/// The agent's image around the binary's and the CA bundle's bytes.
fn agent(
    binary: Vec<u8>,
    ca_bundle: Vec<u8>,
    reference: &str,
) -> anyhow::Result<(oci::ImageConfig, oci::Layer)> {
    anyhow::ensure!(
        is_static_elf(&binary)?,
        "the agent binary is dynamically linked: the image has no libc"
    );
    let mut layer = base_layer()?;
    layer.file("/pod-checkpointer", 0o755, binary)?;
    // The original's command path: its DaemonSet runs `/checkpoint --lock-file=…`, and the
    // binary runs such a command line as `run` (a drop-in by swapping the image alone).
    layer.symlink("/checkpoint", "pod-checkpointer")?;
    layer.file(CA_BUNDLE, 0o644, ca_bundle)?;
    let mut config = oci::ImageConfig::new(reference, &["/pod-checkpointer"]);
    // The one program is at the root.
    config.env = vec!["PATH=/".to_owned()];
    // What the Containerfile's image runs without arguments; the DaemonSet passes its own.
    config.cmd = ["run", "--config", "/etc/pod-checkpointer/config.yaml"]
        .map(str::to_owned)
        .to_vec();
    config.labels = labels(&[
        ("title", "pod-checkpointer"),
        (
            "description",
            "Keeps a self-hosted Kubernetes control plane bootable",
        ),
        ("source", "https://github.com/pod-checkpointer/pod-checkpointer"),
        ("licenses", "Apache-2.0"),
        // The tag: two tags of one binary are two images (a runtime names a container's
        // image by its ID, so an upgrade to a new tag shows as one).
        ("version", version_of(reference)),
    ]);
    Ok((config, layer))
}

/// Debian's CA bundle (package ca-certificates, installed if missing).
fn ca_bundle() -> anyhow::Result<Vec<u8>> {
    if !Path::new(CA_BUNDLE).is_file() {
        Apt::new(apt_log(), PROGRESS).install(&["ca-certificates"])?;
    }
    std::fs::read(CA_BUNDLE).with_context(|| format!("cannot read {CA_BUNDLE}"))
}

pub(crate) fn apt_log() -> PathBuf {
    target_dir().join("image").join("apt.log")
}

/// The pause image the kubelet runs as every pod's sandbox ([`PAUSE_IMAGE`]): `binary` (a
/// static build of Kubernetes' `build/pause/linux/pause.c`) at `/pause`, its entry point.
pub fn pause_image(binary: &Path, out: &Path) -> anyhow::Result<oci::Image> {
    let data = std::fs::read(binary).with_context(|| format!("cannot read {}", binary.display()))?;
    anyhow::ensure!(
        is_static_elf(&data)?,
        "{} is dynamically linked: the pause image has no libc",
        binary.display()
    );
    let mut layer = oci::Layer::new();
    layer.file("/pause", 0o755, data)?;
    write(&oci::ImageConfig::new(PAUSE_IMAGE, &["/pause"]), &layer, out)
}

/// The self-hosted control plane's image ([`CONTROL_PLANE_IMAGE`]): each of `binaries`
/// (static builds; a dynamic one is refused) in [`CONTROL_PLANE_BIN_DIR`] under its file
/// name; a binary that is a link to a multi-call binary (the Go modules' `kube`) becomes
/// the same link beside one copy of its target. ~150-250 MB of programs: compressed at
/// the fastest level, since it is only imported on this machine.
pub fn control_plane_image(binaries: &[PathBuf], out: &Path) -> anyhow::Result<oci::Image> {
    let mut layer = base_layer()?;
    let mut written = std::collections::BTreeSet::new();
    let file_name = |path: &Path| {
        path.file_name()
            .and_then(|n| n.to_str())
            .map(str::to_owned)
            .with_context(|| format!("{} has no file name", path.display()))
    };
    for binary in binaries {
        let name = file_name(binary)?;
        let target =
            std::fs::canonicalize(binary).with_context(|| format!("cannot resolve {}", binary.display()))?;
        let target_name = file_name(&target)?;
        if target_name != name {
            layer.symlink(&format!("{CONTROL_PLANE_BIN_DIR}/{name}"), &target_name)?;
        }
        if !written.insert(target_name.clone()) {
            continue;
        }
        let data = std::fs::read(&target).with_context(|| format!("cannot read {}", target.display()))?;
        anyhow::ensure!(
            is_static_elf(&data)?,
            "{} is dynamically linked: the control plane's image has no libc",
            target.display()
        );
        layer.file(&format!("{CONTROL_PLANE_BIN_DIR}/{target_name}"), 0o755, data)?;
    }
    let mut config = oci::ImageConfig::new(CONTROL_PLANE_IMAGE, &[]);
    config.env = vec![format!("PATH={CONTROL_PLANE_BIN_DIR}:/bin")];
    let image = oci::Image::build_with(&config, &layer, oci::Compression::fast())?;
    image.write(out)?;
    PROGRESS.say(&format!(
        "{CONTROL_PLANE_IMAGE}: {} ({})",
        out.display(),
        image.digest()
    ));
    Ok(image)
}

/// The test pods' image ([`BUSYBOX_IMAGE`]): Debian's static busybox (installed if missing)
/// at `/bin/busybox`, [`BUSYBOX_APPLETS`] linked to it, users root and nobody, `sh` as the
/// command.
pub fn busybox_image(out: &Path) -> anyhow::Result<oci::Image> {
    Apt::new(apt_log(), PROGRESS).install(&["busybox-static"])?;
    let data = std::fs::read(BUSYBOX_BINARY).with_context(|| format!("cannot read {BUSYBOX_BINARY}"))?;
    let (config, layer) = busybox(data)?;
    write(&config, &layer, out)
}

/// The busybox image around `binary`'s bytes.
fn busybox(binary: Vec<u8>) -> anyhow::Result<(oci::ImageConfig, oci::Layer)> {
    anyhow::ensure!(
        is_static_elf(&binary)?,
        "{BUSYBOX_BINARY} is dynamically linked: is it busybox-static's?"
    );
    let mut layer = base_layer()?;
    layer.file("/bin/busybox", 0o755, binary)?;
    for applet in BUSYBOX_APPLETS {
        layer.symlink(&format!("/bin/{applet}"), "busybox")?;
    }
    let mut config = oci::ImageConfig::new(BUSYBOX_IMAGE, &[]);
    config.cmd = vec!["sh".to_owned()];
    Ok((config, layer))
}

/// What every image with programs that look up users or names carries.
fn base_layer() -> anyhow::Result<oci::Layer> {
    let mut layer = oci::Layer::new();
    layer
        .file("/etc/passwd", 0o644, PASSWD.into())?
        .file("/etc/group", 0o644, GROUP.into())?
        .file("/etc/hosts", 0o644, HOSTS.into())?
        .dir("/tmp", 0o1777)?;
    Ok(layer)
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| (format!("org.opencontainers.image.{key}"), (*value).to_owned()))
        .collect()
}

fn write(config: &oci::ImageConfig, layer: &oci::Layer, out: &Path) -> anyhow::Result<oci::Image> {
    let image = oci::Image::build(config, layer)?;
    image.write(out)?;
    PROGRESS.say(&format!(
        "{}: {} ({})",
        config.reference,
        out.display(),
        image.digest()
    ));
    Ok(image)
}

#[cfg(test)]
mod tests;
