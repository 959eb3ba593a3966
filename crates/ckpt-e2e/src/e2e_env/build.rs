//! Building and caching Kubernetes v1.20.2 from Debian bookworm's `kubernetes` source package
//! (ARCHITECTURE.md, Testing): kube-apiserver and kubemark for the hollow node, kubelet,
//! kube-controller-manager and kube-scheduler for the real node, and the pause binary of the
//! sandbox image. The recipe: deb-src entries, Build-Depends from apt, `apt-get source`, the
//! reflect2 1.0.2 swap (the vendored 1.0.1 segfaults with Go ≥ 1.18), the hollow kubelet
//! given real host utilities (it checks hostPath types), and Debian's own GOPATH-mode
//! `make WHAT=…`, all targets in one run.
//!
//! The binaries are cached outside the clone (`$E2E_CACHE_DIR`, by default
//! `/var/cache/pod-checkpointer-e2e`) and a complete cache is recognised by its stamp file, so
//! a second run only checks that the runtime packages are installed. The source tree stays
//! in the cache (`build/`, with Go's build cache in `_output/local/go/cache`), so a recipe
//! bump rebuilds incrementally; deleting it costs the next bump a cold build.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

use super::release::Release;
use crate::apt::{Apt, missing_packages};
use crate::command::run_on_terminal;
use crate::process;
use crate::progress::{Progress, human_duration};

const PROGRESS: Progress = Progress::new("e2e-env build");

/// The Kubernetes version the source package builds (it is `1.20.5+really1.20.2`).
pub const KUBERNETES_VERSION: &str = Release::V1_20.version();

/// Bump when the recipe changes, so cached binaries built the old way are rebuilt.
const RECIPE_REVISION: u32 = 3;

/// What `make WHAT=…` builds; the binaries are named after the last path element.
const BUILD_TARGETS: [&str; 5] = [
    "cmd/kube-apiserver",
    "cmd/kubemark",
    "cmd/kubelet",
    "cmd/kube-controller-manager",
    "cmd/kube-scheduler",
];

/// The sandbox ("pause") binary, compiled from the source's `build/pause/linux/pause.c`.
const PAUSE_BINARY: &str = "pause";
const PAUSE_SOURCE: &str = "build/pause/linux/pause.c";
/// The version the pause binary prints (`pause -v`): the source's, marked as built here.
const PAUSE_VERSION: &str = "v3.4.1-local";

/// Debian packages a running environment needs: the control plane's etcd and the clients
/// (openssl, curl), and the real node's runtime (containerd with `ctr`, runc, the CNI
/// plugins in /usr/lib/cni, and the static busybox of the test image), socat, the
/// node-local API server of the install-from-dist scenario, and gnuplot, which draws the
/// self-hosted scenario's power-cut timeline.
const RUNTIME_PACKAGES: [&str; 9] = [
    "etcd-server",
    "openssl",
    "curl",
    "containerd",
    "runc",
    "containernetworking-plugins",
    "busybox-static",
    "socat",
    "gnuplot-nox",
];

/// `Build-Depends` of src:kubernetes, `apt-get source` itself, the fixed reflect2 and a C
/// compiler for the pause binary (static, so libc6-dev's libc.a).
const BUILD_PACKAGES: [&str; 8] = [
    "dpkg-dev",
    "golang-go",
    "rsync",
    "jq",
    "golang-github-modern-go-reflect2-dev",
    "gcc",
    "libc6-dev",
    "binutils",
];

/// Debian's reflect2 1.0.2, compatible with Go ≥ 1.18's map iterator.
const REFLECT2_DEBIAN: &str = "/usr/share/gocode/src/github.com/modern-go/reflect2";
const REFLECT2_VENDORED: &str = "vendor/github.com/modern-go/reflect2";

const STAMP_FILE: &str = "build-info.txt";
const SOURCE_READY_FILE: &str = ".source-ready";

/// The cache root: `$E2E_CACHE_DIR` or `/var/cache/pod-checkpointer-e2e`.
pub fn cache_root() -> PathBuf {
    std::env::var_os("E2E_CACHE_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/pod-checkpointer-e2e"))
}

/// A directory holding a complete build: the Kubernetes binaries and `pause`, the release
/// they are, and the etcd and the real node's runtime that go with them.
#[derive(Clone, Debug)]
pub struct BinDir {
    dir: PathBuf,
    release: Release,
    etcd: PathBuf,
    runtime: NodeRuntime,
}

/// The real node's container runtime: containerd (with its runc shim and `ctr`), runc and the
/// CNI plugins. v1.20 runs Debian's (containerd 1.6, on PATH and in /usr/lib/cni); v1.37 the
/// Go modules' builds (containerd 2, runc 1.5), by absolute path.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct NodeRuntime {
    /// The dir of `containerd`, `containerd-shim-runc-v2` and `ctr`; none: the machine's PATH.
    containerd_dir: Option<PathBuf>,
    /// `runc`; none: the machine's PATH.
    runc: Option<PathBuf>,
    cni_bin_dir: PathBuf,
    /// containerd 2 reads configuration version 3 (its CRI plugin split in three); 1.6 reads 2.
    containerd_major: u8,
}

impl NodeRuntime {
    /// Debian's packages (`RUNTIME_PACKAGES`).
    pub fn debian() -> NodeRuntime {
        NodeRuntime {
            containerd_dir: None,
            runc: None,
            cni_bin_dir: PathBuf::from("/usr/lib/cni"),
            containerd_major: 1,
        }
    }

    /// Builds of containerd 2 in `containerd_dir`, runc and the CNI plugins in `cni_bin_dir`.
    pub(crate) fn built(containerd_dir: PathBuf, runc: PathBuf, cni_bin_dir: PathBuf) -> NodeRuntime {
        NodeRuntime {
            containerd_dir: Some(containerd_dir),
            runc: Some(runc),
            cni_bin_dir,
            containerd_major: 2,
        }
    }

    fn containerd_tool(&self, name: &str) -> PathBuf {
        match &self.containerd_dir {
            Some(dir) => dir.join(name),
            None => PathBuf::from(name),
        }
    }

    pub fn containerd(&self) -> PathBuf {
        self.containerd_tool("containerd")
    }

    pub fn ctr(&self) -> PathBuf {
        self.containerd_tool("ctr")
    }

    pub fn runc(&self) -> PathBuf {
        self.runc.clone().unwrap_or_else(|| PathBuf::from("runc"))
    }

    /// The CNI plugins' dir (`bridge`, `host-local`, `loopback`, `portmap`).
    pub fn cni_bin_dir(&self) -> &Path {
        &self.cni_bin_dir
    }

    pub fn containerd_major(&self) -> u8 {
        self.containerd_major
    }

    /// The dirs put first on containerd's PATH: where it finds its shim (and the shim runc).
    pub fn path_dirs(&self) -> Vec<PathBuf> {
        let runc_dir = self.runc.as_deref().and_then(Path::parent);
        self.containerd_dir
            .iter()
            .map(PathBuf::as_path)
            .chain(runc_dir)
            .map(Path::to_path_buf)
            .collect()
    }
}

impl BinDir {
    /// The cached binaries, without building: fails with a hint when they are missing.
    pub fn cached() -> anyhow::Result<BinDir> {
        let dir = cache_root().join(format!("k8s-{KUBERNETES_VERSION}"));
        if !is_complete(&dir) {
            bail!(
                "no complete Kubernetes {KUBERNETES_VERSION} build in {}: run `cargo xtask e2e-env build` first",
                dir.display()
            );
        }
        Ok(BinDir {
            dir,
            release: Release::V1_20,
            // Debian's etcd-server, from PATH.
            etcd: PathBuf::from("etcd"),
            runtime: NodeRuntime::debian(),
        })
    }

    /// A build of another release (the Go modules' one, [`super::modules`]).
    pub(crate) fn of_release(dir: PathBuf, release: Release, etcd: PathBuf, runtime: NodeRuntime) -> BinDir {
        BinDir {
            dir,
            release,
            etcd,
            runtime,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The release these binaries are.
    pub fn release(&self) -> Release {
        self.release
    }

    /// The etcd server to run with them.
    pub fn etcd(&self) -> &Path {
        &self.etcd
    }

    /// The real node's container runtime.
    pub fn runtime(&self) -> &NodeRuntime {
        &self.runtime
    }

    pub fn kube_apiserver(&self) -> PathBuf {
        self.dir.join("kube-apiserver")
    }

    pub fn kubemark(&self) -> PathBuf {
        self.dir.join("kubemark")
    }

    pub fn kubelet(&self) -> PathBuf {
        self.dir.join("kubelet")
    }

    pub fn kube_controller_manager(&self) -> PathBuf {
        self.dir.join("kube-controller-manager")
    }

    pub fn kube_scheduler(&self) -> PathBuf {
        self.dir.join("kube-scheduler")
    }

    /// The statically linked pause binary, the one file of the sandbox image.
    pub fn pause(&self) -> PathBuf {
        self.dir.join(PAUSE_BINARY)
    }
}

/// Installs the runtime packages if needed and builds the binaries unless they are cached.
pub fn ensure_built() -> anyhow::Result<BinDir> {
    let started = Instant::now();
    let root = cache_root();
    fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let log = root.join(format!("build-k8s-{KUBERNETES_VERSION}.log"));
    let mut apt = Apt::new(log.clone(), PROGRESS);

    if let Ok(bins) = BinDir::cached() {
        // The runtime packages are needed even when the binaries are cached.
        if !missing_packages(&RUNTIME_PACKAGES)?.is_empty() {
            append_log_header(&log)?;
            apt.install(&RUNTIME_PACKAGES)?;
        }
        PROGRESS.say(&format!(
            "cached: {} (Kubernetes v{KUBERNETES_VERSION}: {}, pause), checked in {}",
            bins.dir().display(),
            binary_names().collect::<Vec<_>>().join(", "),
            human_duration(started.elapsed())
        ));
        return Ok(bins);
    }

    PROGRESS.say(&format!(
        "building Kubernetes v{KUBERNETES_VERSION} ({}) from Debian's source package; ~15 min cold on 2 cores (more under load), ~2 min after a recipe bump; log: {}",
        BUILD_TARGETS.join(" "),
        log.display()
    ));
    append_log_header(&log)?;
    let added_sources = phase("deb-src entries", add_deb_src_entries)?;
    // One update serves both the new source index and the packages to install.
    if added_sources || !has_source_index() {
        apt.update()?;
    }
    let mut packages = BUILD_PACKAGES.to_vec();
    packages.extend(RUNTIME_PACKAGES);
    apt.install(&packages)?;

    let build_dir = root.join("build");
    let source_dir = phase("kubernetes source + reflect2 fix", || {
        let source_dir = prepare_source(&build_dir, &log)?;
        patch_hollow_host_util(&source_dir)?;
        Ok(source_dir)
    })?;
    phase(&format!("make WHAT=\"{}\"", BUILD_TARGETS.join(" ")), || {
        make(&source_dir, &log)
    })?;
    phase("pause binary (gcc -static)", || compile_pause(&source_dir, &log))?;
    let bin_dir = root.join(format!("k8s-{KUBERNETES_VERSION}"));
    let version = phase("install into the cache", || install(&source_dir, &bin_dir))?;
    PROGRESS.say(&format!(
        "built {version} in {}: {}; source and Go build cache kept in {} ({}) for incremental rebuilds",
        human_duration(started.elapsed()),
        bin_dir.display(),
        build_dir.display(),
        disk_usage(&build_dir)
    ));
    BinDir::cached()
}

fn binary_names() -> impl Iterator<Item = &'static str> {
    BUILD_TARGETS.iter().map(|t| t.rsplit('/').next().unwrap_or(t))
}

/// The stamp's first line; binaries without it (or from an older recipe) are rebuilt.
fn stamp_header() -> String {
    format!("pod-checkpointer e2e-env recipe {RECIPE_REVISION}: kubernetes {KUBERNETES_VERSION}")
}

fn is_complete(dir: &Path) -> bool {
    let stamp_ok = fs::read_to_string(dir.join(STAMP_FILE))
        .is_ok_and(|stamp| stamp.lines().next() == Some(stamp_header().as_str()));
    stamp_ok
        && binary_names()
            .chain([PAUSE_BINARY])
            .all(|bin| dir.join(bin).is_file())
}

/// Runs one build phase, printing its name and then its duration.
fn phase<T>(label: &str, work: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    PROGRESS.say(&format!("{label} …"));
    let started = Instant::now();
    let out = work()?;
    PROGRESS.say(&format!("{label}: done in {}", human_duration(started.elapsed())));
    Ok(out)
}

fn append_log_header(log: &Path) -> anyhow::Result<()> {
    let mut file = OpenOptions::new().create(true).append(true).open(log)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    writeln!(
        file,
        "\n=== cargo xtask e2e-env build, unix time {} ===",
        now.as_secs()
    )?;
    Ok(())
}

/// Adds a `deb-src` twin of each `deb` source (deb822 `.sources` files and the one-line
/// `sources.list`); true when a file was written, i.e. the lists need an update.
fn add_deb_src_entries() -> anyhow::Result<bool> {
    let dir = Path::new("/etc/apt/sources.list.d");
    let mut added = false;
    let mut write_once = |target: PathBuf, content: String| -> anyhow::Result<()> {
        if !target.exists() {
            fs::write(&target, content).with_context(|| format!("cannot write {}", target.display()))?;
            PROGRESS.say(&format!("  added {}", target.display()));
            added = true;
        }
        Ok(())
    };
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".sources") || name.starts_with("src-") {
                continue;
            }
            let content = fs::read_to_string(entry.path())?;
            if let Some(src) = deb822_to_deb_src(&content) {
                write_once(dir.join(format!("src-{name}")), src)?;
            }
        }
    }
    if let Ok(content) = fs::read_to_string("/etc/apt/sources.list")
        && let Some(src) = one_line_to_deb_src(&content)
    {
        write_once(dir.join("src-sources.list"), src)?;
    }
    Ok(added)
}

/// A deb822 sources file with each `Types: deb` stanza turned into `deb-src`; `None` when it
/// has no binary-only stanza.
fn deb822_to_deb_src(content: &str) -> Option<String> {
    let mut changed = false;
    let mut out = String::with_capacity(content.len() + 8);
    for line in content.lines() {
        if line.trim_end() == "Types: deb" {
            out.push_str("Types: deb-src\n");
            changed = true;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    changed.then_some(out)
}

/// The `deb …` lines of a one-line-style `sources.list` as `deb-src …` lines.
fn one_line_to_deb_src(content: &str) -> Option<String> {
    let lines: Vec<String> = content
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("deb "))
        .map(|rest| format!("deb-src {rest}\n"))
        .collect();
    (!lines.is_empty()).then(|| lines.concat())
}

/// Whether apt has downloaded any source index (needed by `apt-get source`).
fn has_source_index() -> bool {
    fs::read_dir("/var/lib/apt/lists").is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().contains("_source_Sources"))
    })
}

/// The hollow kubelet's file-type checks, in `pkg/kubemark/hollow_kubelet.go`.
const HOLLOW_KUBELET_GO: &str = "pkg/kubemark/hollow_kubelet.go";
const FAKE_HOST_UTIL: &str = "HostUtil:             hostutil.NewFakeHostUtil(nil),";
const REAL_HOST_UTIL: &str = "HostUtil:             hostutil.NewHostUtil(),";

/// Gives kubemark's hollow kubelet the real host utilities instead of a fake that calls
/// every path missing: the checkpoints' hostPath volumes are `type: Directory`, and the
/// hollow kubelet (root, on this host, where the checkpoint dirs are real) must check
/// them as a kubelet does. Idempotent, for a source tree reused from an earlier run.
fn patch_hollow_host_util(source_dir: &Path) -> anyhow::Result<()> {
    let path = source_dir.join(HOLLOW_KUBELET_GO);
    let text = fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    if text.contains(REAL_HOST_UTIL) {
        return Ok(());
    }
    anyhow::ensure!(
        text.matches(FAKE_HOST_UTIL).count() == 1,
        "{} does not set `{FAKE_HOST_UTIL}` once: the hollow kubelet's recipe needs a look",
        path.display()
    );
    fs::write(&path, text.replace(FAKE_HOST_UTIL, REAL_HOST_UTIL))
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Downloads and unpacks the source package, swaps in reflect2 1.0.2 and lays out the GOPATH;
/// reuses a tree prepared by an earlier, interrupted build.
fn prepare_source(build_dir: &Path, log: &Path) -> anyhow::Result<PathBuf> {
    let ready_marker = build_dir.join(SOURCE_READY_FILE);
    if let Ok(name) = fs::read_to_string(&ready_marker) {
        let source_dir = build_dir.join(name.trim());
        if source_dir.is_dir() {
            PROGRESS.say(&format!("  reusing {} from an earlier run", source_dir.display()));
            return Ok(source_dir);
        }
    }
    if build_dir.exists() {
        fs::remove_dir_all(build_dir).with_context(|| format!("cannot remove {}", build_dir.display()))?;
    }
    fs::create_dir_all(build_dir)?;
    run_logged(
        "apt-get source kubernetes",
        Apt::command(&["source", "kubernetes"]).current_dir(build_dir),
        log,
    )?;
    let source_dir = fs::read_dir(build_dir)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.is_dir()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("kubernetes-1.20"))
        })
        .with_context(|| {
            format!(
                "apt-get source unpacked no kubernetes-1.20* in {}",
                build_dir.display()
            )
        })?;

    let vendored = source_dir.join(REFLECT2_VENDORED);
    fs::remove_dir_all(&vendored).with_context(|| format!("cannot remove {}", vendored.display()))?;
    run_on_terminal(Command::new("cp").args(["-r", REFLECT2_DEBIAN]).arg(&vendored))?;
    // GOPATH mode: a go.mod inside vendor/ would make it a separate module.
    let _ = fs::remove_file(vendored.join("go.mod"));

    // Debian's rules build in GOPATH mode from $GOPATH/src/k8s.io/kubernetes.
    let gopath_k8s = source_dir.join(".go/src/k8s.io");
    fs::create_dir_all(&gopath_k8s)?;
    std::os::unix::fs::symlink("../../..", gopath_k8s.join("kubernetes"))
        .context("cannot link the GOPATH to the source tree")?;

    let name = source_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    fs::write(&ready_marker, name)?;
    Ok(source_dir)
}

/// `make WHAT=…` as debian/rules runs it: GOPATH mode, CGO off, no module proxy.
fn make(source_dir: &Path, log: &Path) -> anyhow::Result<()> {
    let mut command = Command::new("make");
    command
        .current_dir(source_dir)
        .env("GOPATH", source_dir.join(".go"))
        .env("CGO_ENABLED", "0")
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .env("GOTOOLCHAIN", "local")
        // Cargo's jobserver settings would confuse the nested make.
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .arg(format!("WHAT={}", BUILD_TARGETS.join(" ")))
        .arg("GOLDFLAGS=-s -w");
    run_logged("make", &mut command, log)
}

/// `gcc -Os -Wall -Werror -static` of the source's pause.c into `_output/bin/pause`, stripped
/// (the flags of the source's own build/pause/Makefile, without its container).
fn compile_pause(source_dir: &Path, log: &Path) -> anyhow::Result<()> {
    let output = source_dir.join("_output/bin").join(PAUSE_BINARY);
    let mut gcc = Command::new("gcc");
    gcc.current_dir(source_dir)
        .args(["-Os", "-Wall", "-Werror", "-static"])
        .arg(format!("-DVERSION={PAUSE_VERSION}"))
        .arg("-o")
        .arg(&output)
        .arg(PAUSE_SOURCE);
    run_logged("gcc pause.c", &mut gcc, log)?;
    run_logged("strip pause", Command::new("strip").arg(&output), log)
}

/// `2.4G`, from `du -sh`; `?` when du fails.
fn disk_usage(path: &Path) -> String {
    Command::new("du")
        .arg("-sh")
        .arg(path)
        .stderr(Stdio::null())
        .output()
        .ok()
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "?".to_owned())
}

/// Copies the binaries into `bin_dir` (atomically, one rename each), checks the versions and
/// writes the stamp that marks the cache complete; returns the version line.
fn install(source_dir: &Path, bin_dir: &Path) -> anyhow::Result<String> {
    fs::create_dir_all(bin_dir).with_context(|| format!("cannot create {}", bin_dir.display()))?;
    let _ = fs::remove_file(bin_dir.join(STAMP_FILE));
    for bin in binary_names().chain([PAUSE_BINARY]) {
        let built = source_dir.join("_output/bin").join(bin);
        let partial = bin_dir.join(format!(".{bin}.partial"));
        fs::copy(&built, &partial).with_context(|| format!("cannot copy {}", built.display()))?;
        fs::set_permissions(&partial, fs::Permissions::from_mode(0o755))?;
        fs::rename(&partial, bin_dir.join(bin))?;
    }
    let mut version = String::new();
    for bin in binary_names().filter(|bin| *bin != "kubemark") {
        let output = Command::new(bin_dir.join(bin)).arg("--version").output()?;
        let reported = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        anyhow::ensure!(
            reported.contains(&format!("v{KUBERNETES_VERSION}")),
            "built {bin} reports {reported:?}, expected v{KUBERNETES_VERSION}"
        );
        version = reported;
    }
    let output = Command::new(bin_dir.join(PAUSE_BINARY)).arg("-v").output()?;
    let pause_version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    anyhow::ensure!(
        pause_version.contains(PAUSE_VERSION),
        "built pause reports {pause_version:?}, expected {PAUSE_VERSION}"
    );
    let source = source_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stamp = format!(
        "{}\nsource: {source}\nreflect2: Debian golang-github-modern-go-reflect2-dev\ntargets: {} {PAUSE_SOURCE}\n{version}\n{pause_version}\n",
        stamp_header(),
        BUILD_TARGETS.join(" ")
    );
    fs::write(bin_dir.join(STAMP_FILE), stamp)?;
    Ok(version)
}

/// Runs `command` with its output appended to `log`; its heartbeat also names the Go
/// package being compiled.
fn run_logged(label: &str, command: &mut Command, log: &Path) -> anyhow::Result<()> {
    process::run_logged(label, command, log, PROGRESS, &compiling_heartbeat)
}

/// The heartbeat of a silent Go build: the packages being compiled right now.
pub(crate) fn compiling_heartbeat() -> String {
    match go_packages_compiling().as_slice() {
        [] => String::new(),
        [one] => format!(" [compiling {one}]"),
        [first, rest @ ..] => format!(" [compiling {first} +{}]", rest.len()),
    }
}

/// Import paths of the Go packages being compiled right now (the `-p` argument of running
/// `compile` processes): `make` itself is silent for minutes while Go builds.
fn go_packages_compiling() -> Vec<String> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| fs::read(e.path().join("cmdline")).ok())
        .filter_map(|cmdline| {
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let is_compile = args.first().is_some_and(|a| a.ends_with("/compile"));
            let package = args.iter().position(|a| a == "-p").and_then(|i| args.get(i + 1));
            if is_compile { package.cloned() } else { None }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deb822_binary_stanzas_become_source_stanzas() {
        let sources =
            "Types: deb\nURIs: http://deb.example/debian\nSuites: bookworm\n\nTypes: deb deb-src\nURIs: x\n";
        let src = deb822_to_deb_src(sources).unwrap();
        assert_eq!(
            src,
            "Types: deb-src\nURIs: http://deb.example/debian\nSuites: bookworm\n\nTypes: deb deb-src\nURIs: x\n"
        );
        assert_eq!(deb822_to_deb_src("Types: deb-src\nURIs: x\n"), None);
    }

    #[test]
    fn one_line_deb_entries_become_deb_src_entries() {
        let list = "# comment\ndeb http://deb.example/debian bookworm main\ndeb-src http://x y z\n";
        assert_eq!(
            one_line_to_deb_src(list).unwrap(),
            "deb-src http://deb.example/debian bookworm main\n"
        );
        assert_eq!(one_line_to_deb_src("# nothing\n"), None);
    }

    #[test]
    fn binaries_are_named_after_their_targets() {
        assert_eq!(
            binary_names().collect::<Vec<_>>(),
            [
                "kube-apiserver",
                "kubemark",
                "kubelet",
                "kube-controller-manager",
                "kube-scheduler"
            ]
        );
    }
}
