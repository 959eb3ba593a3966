//! The agent's image as `cargo xtask image` builds it: the static binary runs alone in the
//! image's root filesystem and resolves `localhost` there; the archives (agent, busybox,
//! pause) import into containerd, are listed under their names and digests, and run. Then
//! the release's image (`cargo xtask release`): the arm64 agent, cross-compiled, runs under
//! qemu-user from its image's root filesystem, and the image index of both platforms
//! imports under its index's digest and runs this machine's.
//!
//! Needs root (chroot, a mount namespace) and installs what it uses from Debian when missing
//! (musl-tools, clang, llvm, qemu-user-static, busybox-static, containerd, runc): it fails
//! rather than skips. The
//! containerd is private: its root, state and sockets are in a temporary directory, and it
//! runs in a mount namespace of its own with a tmpfs over /run, because containerd 1.6 puts
//! shim sockets and `ctr`'s fifos under /run/containerd whatever its config says. No CRI, no
//! network: `ctr run` gives each container a network namespace with loopback only.
//!
//! Not in a plain `cargo test` (`test = false`: minutes for the static release build, root);
//! `cargo xtask test` runs it.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ckpt_e2e::apt::Apt;
use ckpt_e2e::image::{self, Arch, oci};
use ckpt_e2e::process::Managed;
use ckpt_e2e::progress::Progress;
use serde_json::Value;

const PROGRESS: Progress = Progress::new("image test");
const NAMESPACE: &str = "k8s.io";

#[test]
fn the_agent_image_runs_alone_resolves_localhost_and_imports_into_containerd() {
    // With CI=true nothing is skipped (ARCHITECTURE.md, Testing): CI runs as root.
    if !ckpt_e2e::root_or_skip("chroot, mount namespaces, containerd") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();

    let binary = image::build_static_agent().unwrap();
    let reference = ckpt_render::DEFAULT_IMAGE;
    let agent = image::agent_image(&binary, reference, &dir.join("agent.tar")).unwrap();
    let busybox = image::busybox_image(&dir.join("busybox.tar")).unwrap();
    // Any static binary stands in for pause.c here: the pause image is only imported.
    let pause = image::pause_image(Path::new("/bin/busybox"), &dir.join("pause.tar")).unwrap();

    // The release's: both architectures in one image index, under the same name.
    let arm64 = image::build_static_agent_for(Arch::Arm64).unwrap();
    let both = [(Arch::Amd64, binary.clone()), (Arch::Arm64, arm64.clone())];
    let multi = image::agent_multi_platform_image(&both, reference, &dir.join("multi.tar")).unwrap();
    assert_eq!(
        multi.image_for(oci::Platform::LINUX_AMD64).unwrap().digest(),
        agent.digest(),
        "the index's amd64 image is `cargo xtask image`'s"
    );

    // The image's root filesystem, unpacked from the archive as a runtime would.
    let rootfs = dir.join("rootfs");
    unpack_rootfs(
        &std::fs::read(dir.join("agent.tar")).unwrap(),
        oci::Platform::LINUX_AMD64,
        &rootfs,
    );
    let version = run(Command::new("chroot")
        .arg(&rootfs)
        .args(["/pod-checkpointer", "--version"]));
    assert_eq!(
        stdout(&version),
        format!("pod-checkpointer {}", env!("CARGO_PKG_VERSION"))
    );
    connects_to_localhost_from(&rootfs);

    // The arm64 image's files, its agent run under qemu-user (no binfmt_misc needed).
    let arm64_rootfs = dir.join("rootfs-arm64");
    let multi_archive = std::fs::read(dir.join("multi.tar")).unwrap();
    unpack_rootfs(&multi_archive, oci::Platform::LINUX_ARM64, &arm64_rootfs);
    let arm64_agent = arm64_rootfs.join("pod-checkpointer");
    let elf = std::fs::read(&arm64_agent).unwrap();
    assert_eq!(elf, std::fs::read(&arm64).unwrap());
    assert_eq!(image::elf_machine(&elf).unwrap(), Arch::Arm64.elf_machine());
    assert!(image::is_static_elf(&elf).unwrap());
    let version = run(Arch::Arm64.command(&arm64_agent).unwrap().arg("--version"));
    PROGRESS.say(&format!("arm64 agent under qemu-user: {}", stdout(&version)));
    assert_eq!(
        stdout(&version),
        format!("pod-checkpointer {}", env!("CARGO_PKG_VERSION"))
    );
    let strategies = run(Arch::Arm64.command(&arm64_agent).unwrap().arg("strategies"));
    assert!(
        stdout(&strategies).contains("grace-period"),
        "{}",
        stdout(&strategies)
    );

    let apt_log = image::target_dir().join("image").join("apt.log");
    Apt::new(apt_log, PROGRESS)
        .install(&["containerd", "runc"])
        .unwrap();
    let containerd = Containerd::start(&dir.join("containerd"));
    for (built, archive) in [
        (&agent, "agent.tar"),
        (&busybox, "busybox.tar"),
        (&pause, "pause.tar"),
    ] {
        containerd.ctr(&["images", "import", &dir.join(archive).to_string_lossy()]);
        let listed = containerd.images();
        assert_eq!(
            listed.get(&built.reference),
            Some(&built.digest()),
            "{} is listed under its name with its manifest's digest: {listed:?}",
            built.reference
        );
    }

    let version = containerd.run(reference, "agent-version", &["/pod-checkpointer", "--version"]);
    assert_eq!(version, format!("pod-checkpointer {}", env!("CARGO_PKG_VERSION")));
    let strategies = containerd.run(
        reference,
        "agent-strategies",
        &["/pod-checkpointer", "strategies"],
    );
    assert!(strategies.contains("grace-period"), "{strategies}");

    let script = "id -un; ls -ld /tmp; wget -q -O - http://127.0.0.1:1/ 2>&1; echo exit=$?";
    let as_root = containerd.run(image::BUSYBOX_IMAGE, "busybox-root", &["sh", "-c", script]);
    let mut lines = as_root.lines();
    assert_eq!(lines.next(), Some("root"), "{as_root}");
    assert!(
        lines.next().is_some_and(|l| l.starts_with("drwxrwxrwt")),
        "{as_root}"
    );
    assert!(
        as_root.contains("Connection refused") && as_root.ends_with("exit=1"),
        "{as_root}"
    );
    // ctr 1.6 has no --user; su asks root for no password.
    let su = ["su", "-s", "/bin/sh", "-c", "id", "nobody"];
    let as_nobody = containerd.run(image::BUSYBOX_IMAGE, "busybox-nobody", &su);
    assert_eq!(
        as_nobody,
        "uid=65534(nobody) gid=65534(nobody) groups=65534(nobody)"
    );

    // The image index replaces the single image under the name; containerd lists the
    // index's digest and runs this machine's platform from it.
    containerd.ctr(&["images", "import", &dir.join("multi.tar").to_string_lossy()]);
    let listed = containerd.images();
    assert_eq!(listed.get(reference), Some(&multi.digest()), "{listed:?}");
    let version = containerd.run(reference, "agent-multi", &["/pod-checkpointer", "--version"]);
    assert_eq!(version, format!("pod-checkpointer {}", env!("CARGO_PKG_VERSION")));
    drop(containerd);
}

/// Runs the agent in the image's root filesystem against `https://localhost:PORT`: with no
/// NSS and no name server, musl must find `localhost` in the image's /etc/hosts; the
/// listener sees the agent's TLS ClientHello once the name resolved and the connection was
/// made.
fn connects_to_localhost_from(rootfs: &Path) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::fs::write(
        rootfs.join("tmp/kubeconfig"),
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://localhost:{port}\n    insecure-skip-tls-verify: true\n\
             users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    let log = rootfs.join("tmp/agent.log");
    let mut agent = Managed::spawn(
        "pod-checkpointer",
        Command::new("chroot").arg(rootfs).args([
            "/pod-checkpointer",
            "run",
            "--kubeconfig",
            "/tmp/kubeconfig",
            "--node-name",
            "node-1",
            "--pod-name",
            "pod-checkpointer-x",
            "--pod-namespace",
            "kube-system",
            "--runtime-endpoint",
            "",
            "--metrics-addr",
            "",
            "--kubelet-url",
            &format!("https://localhost:{port}"),
        ]),
        &log,
        rootfs,
    )
    .unwrap();
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                agent.ensure_running("the agent in the image's rootfs").unwrap();
                assert!(
                    Instant::now() < deadline,
                    "no connection to localhost:{port} in 60 s; agent log:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut record = [0u8; 3];
    stream.read_exact(&mut record).unwrap();
    agent.terminate("TERM", Duration::from_secs(10)).unwrap();
    // A TLS handshake record (22), TLS 1.x.
    assert_eq!(record[..2], [22, 3], "not a TLS ClientHello: {record:?}");
}

/// Unpacks the image's one layer for `platform` into `rootfs`, following `index.json` to
/// the manifest (through the image index, in a multi-platform archive) and the manifest to
/// the layer.
fn unpack_rootfs(archive: &[u8], platform: oci::Platform, rootfs: &Path) {
    let mut files = BTreeMap::new();
    for entry in tar::Archive::new(archive).entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        files.insert(path, data);
    }
    let blob = |digest: &Value| {
        let hex = digest.as_str().unwrap().strip_prefix("sha256:").unwrap();
        files[&format!("blobs/sha256/{hex}")].clone()
    };
    let layout_index: Value = serde_json::from_slice(&files["index.json"]).unwrap();
    let mut descriptor = layout_index["manifests"][0].clone();
    if descriptor["mediaType"] == oci::MEDIA_TYPE_INDEX {
        let index: Value = serde_json::from_slice(&blob(&descriptor["digest"])).unwrap();
        descriptor = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["platform"]["architecture"] == platform.architecture)
            .unwrap_or_else(|| panic!("no {platform} manifest in {index}"))
            .clone();
    }
    assert_eq!(descriptor["platform"]["architecture"], platform.architecture);
    let manifest: Value = serde_json::from_slice(&blob(&descriptor["digest"])).unwrap();
    let config: Value = serde_json::from_slice(&blob(&manifest["config"]["digest"])).unwrap();
    assert_eq!(config["architecture"], platform.architecture);
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(layers[0]["mediaType"], oci::MEDIA_TYPE_LAYER_GZIP);
    let gz = blob(&layers[0]["digest"]);
    let mut layer = tar::Archive::new(flate2::read::GzDecoder::new(gz.as_slice()));
    layer.set_preserve_permissions(true);
    layer.unpack(rootfs).unwrap();
    let tmp = std::fs::metadata(rootfs.join("tmp")).unwrap();
    assert_eq!(tmp.permissions().mode() & 0o7777, 0o1777);
}

/// A containerd of this test's own (see the module's documentation).
struct Containerd {
    process: Managed,
    socket: PathBuf,
}

impl Containerd {
    fn start(dir: &Path) -> Containerd {
        std::fs::create_dir_all(dir).unwrap();
        let socket = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
        std::fs::write(
            &config,
            format!(
                "version = 2\nroot = {:?}\nstate = {:?}\n\
                 disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
                 [grpc]\n  address = {:?}\n[ttrpc]\n  address = {:?}\n\
                 [plugins.\"io.containerd.internal.v1.opt\"]\n  path = {:?}\n",
                path("root"),
                path("state"),
                socket.to_string_lossy(),
                format!("{}.ttrpc", socket.to_string_lossy()),
                path("opt"),
            ),
        )
        .unwrap();
        let log = dir.join("containerd.log");
        // `exec`: containerd keeps unshare's pid, the one nsenter enters.
        let script = format!(
            "mount -t tmpfs -o mode=0755 tmpfs /run && mkdir -p /run/containerd && exec containerd --config {}",
            config.display()
        );
        let process = Managed::spawn(
            "containerd",
            Command::new("unshare").args(["--mount", "--propagation", "private", "--", "sh", "-c", &script]),
            &log,
            dir,
        )
        .unwrap();
        let mut containerd = Containerd { process, socket };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            containerd.process.ensure_running("containerd").unwrap();
            let ready = containerd
                .command(&["version"])
                .output()
                .is_ok_and(|o| o.status.success());
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "containerd not ready in 30 s:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        PROGRESS.say(&format!(
            "private containerd ready (pid {})",
            containerd.process.pid()
        ));
        containerd
    }

    /// `ctr` in containerd's mount namespace (where `ctr run` makes its fifos).
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--target={}", self.process.pid()))
            .args(["--mount", "--", "ctr", "--address"])
            .arg(&self.socket)
            .args(["--namespace", NAMESPACE])
            .args(args);
        command
    }

    fn ctr(&self, args: &[&str]) -> Output {
        let shown: Vec<&str> = args
            .iter()
            .map(|a| if a.is_empty() { "\"\"" } else { a })
            .collect();
        PROGRESS.say(&format!("ctr {}", shown.join(" ")));
        run(&mut self.command(args))
    }

    /// `ctr run --rm IMAGE ID ARGS…`: its trimmed stdout. Without a cgroup path runc makes
    /// `/<id>` and removes it with the container, where ctr's default `/k8s.io/<id>` would
    /// leave the empty `/k8s.io` parents behind in every hierarchy.
    fn run(&self, image: &str, id: &str, args: &[&str]) -> String {
        let mut all = vec!["run", "--rm", "--cgroup", "", image, id];
        all.extend(args);
        stdout(&self.ctr(&all))
    }

    /// Image name → digest, from `ctr images ls`.
    fn images(&self) -> BTreeMap<String, String> {
        let listed = self.ctr(&["images", "ls"]);
        stdout(&listed)
            .lines()
            .skip(1)
            .filter_map(|line| {
                let mut columns = line.split_whitespace();
                let name = columns.next()?;
                let digest = columns.nth(1)?;
                Some((name.to_owned(), digest.to_owned()))
            })
            .collect()
    }
}

impl Drop for Containerd {
    /// Stops containerd, then whatever else still runs in its mount namespace (shims of a
    /// test that failed mid-run); the namespace and its mounts go with its last process.
    fn drop(&mut self) {
        let namespace = std::fs::read_link(format!("/proc/{}/ns/mnt", self.process.pid())).ok();
        let _ = self.process.terminate("TERM", Duration::from_secs(10));
        let Some(namespace) = namespace else {
            return;
        };
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if std::fs::read_link(entry.path().join("ns/mnt")).ok().as_ref() == Some(&namespace) {
                let _ = ckpt_e2e::process::send_signal(pid, "KILL");
            }
        }
    }
}

/// Runs `command`, failing with its output unless it succeeds.
fn run(command: &mut Command) -> Output {
    let output = command.stdin(Stdio::null()).output().unwrap();
    assert!(
        output.status.success(),
        "{command:?}: {}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::io::stderr().flush();
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}
