//! Building the current components from their Go modules (issue 37): Kubernetes v1.37
//! (and v1.34 for `--long`) as one multi-call binary (as hyperkube was), etcd 3.6, containerd 2 with its runc shim,
//! runc and the CNI plugins, each an ordinary `go build` of a small module committed in
//! the repository's `go/` dir (go.mod and go.sum pinned; the Kubernetes one pins every
//! `k8s.io/*` staging module with a `replace` line, since k8s.io/kubernetes lists them at
//! v0.0.0).
//!
//! Each component is cached by version under `$E2E_CACHE_DIR/modules/NAME-VERSION`, with a
//! stamp naming the hash of its module's files: editing a go.mod, go.sum or main.go
//! rebuilds that component, nothing else does. Go's build cache is kept beside them
//! (`modules/go-build`), so a rebuild after a bump compiles only what changed. The
//! machine's Go (1.26, `/usr/local/go/bin` first on PATH) builds them all; a module that
//! named a newer Go would need `GOTOOLCHAIN` (none does).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use super::build::{BinDir, NodeRuntime};
use super::release::Release;
use crate::apt::{Apt, missing_packages};
use crate::process;
use crate::progress::{Progress, human_duration};

const PROGRESS: Progress = Progress::new("e2e-env modules");

/// Bump when the recipe (this file's commands) changes, so components built the old way
/// are rebuilt; a change of the module files themselves is seen by their hash.
const RECIPE_REVISION: u32 = 4;

const STAMP_FILE: &str = "build-info.txt";

/// A one-line change to a dependency's source, made at build time: the module is copied out
/// of the module cache into the build's dir, the line replaced there, and a generated
/// `go.work` replaces the module with the copy (go refuses `-overlay` of files in the module
/// cache). Nothing of Kubernetes is copied into the repository; a line that is not there
/// exactly once fails the build.
#[derive(Clone, Copy, Debug)]
pub struct SourcePatch {
    /// The module whose file it changes.
    pub module: &'static str,
    /// The file, relative to the module's root.
    pub file: &'static str,
    /// The text replaced, and by what.
    pub from: &'static str,
    pub to: &'static str,
    /// Why, for the build log.
    pub why: &'static str,
}

/// The changes the end-to-end environment needs in kubemark's hollow kubelet, as the v1.20
/// build makes them in Debian's source (`build::patch_hollow_host_util`).
const HOLLOW_NODE_PATCHES: [SourcePatch; 2] = [
    SourcePatch {
        module: "k8s.io/kubernetes",
        file: "pkg/kubemark/hollow_kubelet.go",
        from: "HostUtil:                  hostutil.NewFakeHostUtil(nil),",
        to: "HostUtil:                  hostutil.NewHostUtil(),",
        why: "the hollow kubelet checks hostPath types on the real host, as a kubelet does \
              (the fake one calls every path missing, and checkpoints mount `type: Directory`)",
    },
    SourcePatch {
        module: "k8s.io/cri-client",
        file: "pkg/fake/endpoint.go",
        from: "return fmt.Sprintf(defaultUnixEndpoint, rand.Int()), nil",
        to: "return fmt.Sprintf(defaultUnixEndpoint, 0*rand.Int()), nil",
        why: "the fake CRI listens on a fixed socket, /tmp/kubelet_remote_0.sock, that the \
              harness links at /tmp/kubelet_remote.sock (kubemark 1.20's fixed one)",
    },
];

/// A C program of a dependency's source, compiled statically beside a component's Go
/// binaries with the flags of its own Makefile (without its container).
#[derive(Clone, Copy, Debug)]
pub struct CProgram {
    pub binary: &'static str,
    /// The module holding its source, and the file, relative to the module's root.
    pub module: &'static str,
    pub source: &'static str,
    /// The `-D` its Makefile passes (the version the program prints).
    pub define: &'static str,
}

/// The real node's sandbox ("pause") binary, as the v1.20 build compiles it from Debian's
/// source (`build::compile_pause`), with the tag of the release's build/pause/Makefile.
const fn pause_program(define: &'static str) -> CProgram {
    CProgram {
        binary: "pause",
        module: "k8s.io/kubernetes",
        source: "build/pause/linux/pause.c",
        define,
    }
}

/// One component: a module under `go/` and the binaries built from it.
#[derive(Clone, Copy, Debug)]
pub struct GoComponent {
    /// The cache dir's name, with `version`.
    pub name: &'static str,
    /// The module's dir under the repository's `go/`.
    pub module_dir: &'static str,
    /// The upstream version it pins.
    pub version: &'static str,
    /// Each binary and the package it is built from (`.`: the module's own main).
    pub binaries: &'static [(&'static str, &'static str)],
    /// Names linked to the first binary (a multi-call binary's commands).
    pub links: &'static [&'static str],
    /// cgo is needed (runc's seccomp through libseccomp).
    pub cgo: bool,
    /// Build tags.
    pub tags: &'static [&'static str],
    /// Debian packages the build needs besides Go.
    pub build_packages: &'static [&'static str],
    /// Changes to its dependencies' sources, overlaid at build time.
    pub patches: &'static [SourcePatch],
    /// C programs of its dependencies built with it.
    pub c_programs: &'static [CProgram],
}

/// One release's Kubernetes components, as one multi-call binary `kube` (`go/<module_dir>`).
const fn kubernetes(release: Release, module_dir: &'static str, pause: &'static [CProgram]) -> GoComponent {
    GoComponent {
        name: "kubernetes",
        module_dir,
        version: release.version(),
        binaries: &[("kube", ".")],
        links: &[
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubelet",
            "kubemark",
        ],
        cgo: false,
        tags: &[],
        // The pause binary: static, so libc6-dev's libc.a.
        build_packages: &["gcc", "libc6-dev"],
        patches: &HOLLOW_NODE_PATCHES,
        c_programs: pause,
    }
}

/// Kubernetes v1.37.2: its build/pause/Makefile says `TAG ?= 3.10.2`.
const KUBERNETES_1_37: GoComponent = kubernetes(
    Release::V1_37,
    "kubernetes-1.37",
    &[pause_program("VERSION=v3.10.2-local")],
);

/// Kubernetes v1.34.4 (`--long`): `TAG ?= 3.10.1`. Its module's main.go is a link to 1.37's:
/// the same multi-call command builds against both (a release that differs gets its own file).
const KUBERNETES_1_34: GoComponent = kubernetes(
    Release::V1_34,
    "kubernetes-1.34",
    &[pause_program("VERSION=v3.10.1-local")],
);

/// What the real node and the control plane of `release` run, in build order (the longest
/// first): the release's Kubernetes, and the same etcd and node runtime for each.
pub fn components(release: Release) -> anyhow::Result<[GoComponent; 5]> {
    let kubernetes = match release {
        Release::V1_34 => KUBERNETES_1_34,
        Release::V1_37 => KUBERNETES_1_37,
        Release::V1_20 => bail!("{release} is built from Debian's source (`build`), not from Go modules"),
    };
    let [etcd, containerd, runc, cni] = RUNTIME;
    Ok([kubernetes, etcd, containerd, runc, cni])
}

/// etcd and the node's runtime, the same for every release built from modules.
const RUNTIME: [GoComponent; 4] = [
    GoComponent {
        name: "etcd",
        module_dir: "etcd-3.6",
        version: "3.6.16",
        binaries: &[("etcd", ".")],
        links: &[],
        cgo: false,
        tags: &[],
        build_packages: &[],
        patches: &[],
        c_programs: &[],
    },
    GoComponent {
        name: "containerd",
        module_dir: "containerd-2.4",
        version: "2.4.2",
        binaries: &[
            ("containerd", "github.com/containerd/containerd/v2/cmd/containerd"),
            (
                "containerd-shim-runc-v2",
                "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
            ),
            ("ctr", "github.com/containerd/containerd/v2/cmd/ctr"),
        ],
        links: &[],
        cgo: false,
        // btrfs snapshots need its C headers; the node uses overlayfs.
        tags: &["no_btrfs"],
        build_packages: &[],
        patches: &[],
        c_programs: &[],
    },
    GoComponent {
        name: "runc",
        module_dir: "runc-1.5",
        version: "1.5.3",
        binaries: &[("runc", "github.com/opencontainers/runc")],
        links: &[],
        cgo: true,
        tags: &["seccomp"],
        build_packages: &["gcc", "libc6-dev", "pkg-config", "libseccomp-dev"],
        patches: &[],
        c_programs: &[],
    },
    GoComponent {
        name: "cni",
        module_dir: "cni-1.10",
        version: "1.10.0",
        binaries: &[
            (
                "bridge",
                "github.com/containernetworking/plugins/plugins/main/bridge",
            ),
            (
                "host-local",
                "github.com/containernetworking/plugins/plugins/ipam/host-local",
            ),
            (
                "loopback",
                "github.com/containernetworking/plugins/plugins/main/loopback",
            ),
            (
                "portmap",
                "github.com/containernetworking/plugins/plugins/meta/portmap",
            ),
        ],
        links: &[],
        cgo: false,
        tags: &[],
        build_packages: &[],
        patches: &[],
        c_programs: &[],
    },
];

/// helm, for the test that the Helm chart renders what `render` renders (tests/chart.rs):
/// built like the components, cached beside them, never part of a release's set.
const HELM: GoComponent = GoComponent {
    name: "helm",
    module_dir: "helm-4.3",
    version: "4.3.2",
    binaries: &[("helm", "helm.sh/helm/v4/cmd/helm")],
    links: &[],
    cgo: false,
    tags: &[],
    build_packages: &[],
    patches: &[],
    c_programs: &[],
};

/// The cached helm, built from its module on first use (a few minutes on 2 cores).
pub fn helm() -> anyhow::Result<PathBuf> {
    // Tests of one process ask at once: one builds, the others then find it cached.
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _building = BUILD.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let root = super::build::cache_root().join("modules");
    fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    ensure_component(&HELM, &root.join("build.log"))?;
    Ok(HELM.binary("helm"))
}

impl GoComponent {
    /// Its cache dir.
    pub fn dir(&self) -> PathBuf {
        super::build::cache_root()
            .join("modules")
            .join(format!("{}-{}", self.name, self.version))
    }

    /// The path of one of its binaries (or links).
    pub fn binary(&self, name: &str) -> PathBuf {
        self.dir().join(name)
    }

    fn module_path(&self) -> PathBuf {
        crate::project_root().join("go").join(self.module_dir)
    }

    /// The stamp's first line: recipe, name, version and the hash of the module's files.
    fn stamp_header(&self) -> anyhow::Result<String> {
        let patches: Vec<String> = (self.patches.iter())
            .map(|p| format!("{}/{}: {} => {}", p.module, p.file, p.from, p.to))
            .collect();
        Ok(format!(
            "pod-checkpointer e2e-env modules recipe {RECIPE_REVISION}: {} {} {} {}",
            self.name,
            self.version,
            module_hash(&self.module_path())?,
            short_hash(patches.join("\n").as_bytes())
        ))
    }

    /// Copies each module it patches out of the module cache into `dir` (go refuses an
    /// overlay of files there), applies the patches, and writes a `go.work` that uses its
    /// module with those copies replacing the originals; `None` without patches.
    fn write_patched_workspace(&self, go: &Path, dir: &Path) -> anyhow::Result<Option<PathBuf>> {
        if self.patches.is_empty() {
            return Ok(None);
        }
        let mut replaces = Vec::new();
        let modules: std::collections::BTreeSet<&str> = self.patches.iter().map(|p| p.module).collect();
        for module in modules {
            let original = module_dir(go, &self.module_path(), module)?;
            let name = original
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let version = name
                .rsplit_once('@')
                .map(|(_, v)| v.to_owned())
                .unwrap_or_default();
            let copy = dir.join("patched").join(name.replace('/', "_"));
            fs::create_dir_all(copy.parent().unwrap_or(dir))?;
            crate::command::run_command(Command::new("cp").arg("-r").arg(&original).arg(&copy))?;
            // The module cache is read-only.
            crate::command::run_command(Command::new("chmod").args(["-R", "u+w"]).arg(&copy))?;
            for patch in self.patches.iter().filter(|p| p.module == module) {
                let file = copy.join(patch.file);
                let text =
                    fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
                anyhow::ensure!(
                    text.matches(patch.from).count() == 1,
                    "{module}/{} does not have `{}` once: the patch ({}) needs a look",
                    patch.file,
                    patch.from,
                    patch.why
                );
                fs::write(&file, text.replace(patch.from, patch.to))
                    .with_context(|| format!("cannot write {}", file.display()))?;
                PROGRESS.say(&format!("  {module}/{} patched: {}", patch.file, patch.why));
            }
            // Every version: the module's own go.mod maps a staging module's v0.0.0 to the
            // release, and a versioned replace here would match neither.
            replaces.push(format!("replace {module} => {} // {version}\n", copy.display()));
        }
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let work = dir.join("go.work");
        let go_version = fs::read_to_string(self.module_path().join("go.mod"))?
            .lines()
            .find_map(|l| l.strip_prefix("go ").map(str::to_owned))
            .unwrap_or_else(|| "1.26.0".into());
        fs::write(
            &work,
            format!(
                "go {go_version}\n\nuse {}\n\n{}",
                self.module_path().display(),
                replaces.concat()
            ),
        )?;
        Ok(Some(work))
    }

    fn is_complete(&self) -> anyhow::Result<bool> {
        let dir = self.dir();
        let header = self.stamp_header()?;
        let stamp_ok = fs::read_to_string(dir.join(STAMP_FILE))
            .is_ok_and(|stamp| stamp.lines().next() == Some(header.as_str()));
        Ok(stamp_ok && self.outputs().all(|bin| dir.join(bin).is_file()))
    }

    /// Every file it builds: the Go binaries, the links, the C programs.
    fn outputs(&self) -> impl Iterator<Item = &'static str> {
        (self.binaries.iter().map(|(b, _)| *b))
            .chain(self.links.iter().copied())
            .chain(self.c_programs.iter().map(|p| p.binary))
    }

    /// The `-ldflags`: stripped, and for Kubernetes the version its components report
    /// (without it they say v0.0.0-master, and whatever decides by version is misled).
    fn ldflags(&self) -> String {
        let mut flags = String::from("-s -w");
        if self.name == "kubernetes" {
            let minor = self.version.split('.').nth(1).unwrap_or_default();
            for package in ["k8s.io/component-base/version", "k8s.io/client-go/pkg/version"] {
                flags.push_str(&format!(
                    " -X {package}.gitVersion=v{v} -X {package}.gitMajor=1 -X {package}.gitMinor={minor} \
                     -X {package}.gitTreeState=clean",
                    v = self.version
                ));
            }
        }
        flags
    }
}

/// The dir of `module` as the module in `module_dir` resolves it (its `replace` honoured),
/// downloaded into the module cache first: `go list -m` names no dir for a module not
/// downloaded yet, which on a fresh machine is every one (a cold CI run found it).
fn module_dir(go: &Path, module_dir: &Path, module: &str) -> anyhow::Result<PathBuf> {
    let mut download = Command::new(go);
    download
        .current_dir(module_dir)
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=readonly")
        .env("GOWORK", "off")
        .args(["mod", "download", "-json", module]);
    let info = crate::command::run_command(&mut download)?;
    downloaded_dir(module, &info)
}

/// The `Dir` of `go mod download -json`'s answer for `module`.
fn downloaded_dir(module: &str, json: &str) -> anyhow::Result<PathBuf> {
    let info: serde_json::Value =
        serde_json::from_str(json).with_context(|| format!("go mod download -json {module}: {json}"))?;
    if let Some(error) = info["Error"].as_str() {
        bail!("go mod download {module}: {error}");
    }
    match info["Dir"].as_str() {
        Some(dir) if !dir.is_empty() => Ok(PathBuf::from(dir)),
        _ => bail!("go mod download -json {module} named no dir: {json}"),
    }
}

fn short_hash(bytes: &[u8]) -> String {
    hex8(&Sha256::digest(bytes))
}

/// The first 8 bytes of a digest, in hex: enough to tell builds apart.
fn hex8(digest: &[u8]) -> String {
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// sha256 over the module's go.mod, go.sum and Go files, by name.
fn module_hash(module: &Path) -> anyhow::Result<String> {
    let mut files: Vec<PathBuf> = fs::read_dir(module)
        .with_context(|| format!("cannot read {}", module.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n == "go.mod" || n == "go.sum" || n.ends_with(".go")
            })
        })
        .collect();
    files.sort();
    let mut hash = Sha256::new();
    for file in &files {
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        hash.update(name.as_bytes());
        hash.update([0]);
        hash.update(fs::read(file).with_context(|| format!("cannot read {}", file.display()))?);
        hash.update([0]);
    }
    Ok(hex8(&hash.finalize()))
}

/// Debian packages a running environment needs besides the components: the clients of the
/// control plane (openssl, curl), the static busybox of the real node's test image, and
/// socat, the node-local API server of the install-from-dist scenario, and gnuplot, which
/// draws the self-hosted scenario's power-cut timeline.
const RUNTIME_PACKAGES: [&str; 5] = ["openssl", "curl", "busybox-static", "socat", "gnuplot-nox"];

/// Builds every component of `release` that is not cached (installing what its build needs
/// first), and prints each one's time.
pub fn ensure_built(release: Release) -> anyhow::Result<BinDir> {
    let started = Instant::now();
    let root = super::build::cache_root().join("modules");
    fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let log = root.join("build.log");
    if !missing_packages(&RUNTIME_PACKAGES)?.is_empty() {
        let mut apt = Apt::new(log.clone(), PROGRESS);
        apt.update()?;
        apt.install(&RUNTIME_PACKAGES)?;
    }
    for component in &components(release)? {
        ensure_component(component, &log)?;
    }
    PROGRESS.say(&format!(
        "Go module components ready in {}: {}",
        human_duration(started.elapsed()),
        root.display()
    ));
    cached(release)
}

/// The components built from the modules, without building: fails with a hint when one is
/// missing.
pub fn cached(release: Release) -> anyhow::Result<BinDir> {
    let components = components(release)?;
    for component in &components {
        if !component.is_complete()? {
            bail!(
                "no complete {} v{} build in {}: run `cargo xtask e2e-env build --kubernetes {}` first",
                component.name,
                component.version,
                component.dir().display(),
                release.name()
            );
        }
    }
    let [kubernetes, etcd, containerd, runc, cni] = &components;
    Ok(BinDir::of_release(
        kubernetes.dir(),
        release,
        etcd.binary("etcd"),
        NodeRuntime::built(containerd.dir(), runc.binary("runc"), cni.dir()),
    ))
}

fn ensure_component(component: &GoComponent, log: &Path) -> anyhow::Result<()> {
    let label = format!("{} v{}", component.name, component.version);
    if component.is_complete()? {
        PROGRESS.say(&format!("{label}: cached in {}", component.dir().display()));
        return Ok(());
    }
    let packages = missing_packages(component.build_packages)?;
    if !packages.is_empty() {
        let mut apt = Apt::new(log.to_path_buf(), PROGRESS);
        apt.update()?;
        apt.install(component.build_packages)?;
    }
    let go = go_binary()?;
    let started = Instant::now();
    let dir = component.dir();
    // Built into a fresh dir beside the cache entry, which is swapped in once complete: an
    // interrupted build never leaves a stamp beside missing or partial binaries.
    let partial = dir.with_file_name(format!(
        "{}.partial",
        dir.file_name().unwrap_or_default().to_string_lossy()
    ));
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
    PROGRESS.say(&format!(
        "{label}: go build in {} (log: {})",
        component.module_path().display(),
        log.display()
    ));
    // The patched copies and their go.work are needed by the build alone: they name paths
    // under `.partial`, and a copy of k8s.io/kubernetes is 124 MB.
    let scratch = partial.join("workspace");
    let workspace = component.write_patched_workspace(&go, &scratch)?;
    for (binary, package) in component.binaries {
        let mut build = Command::new(&go);
        build
            .current_dir(component.module_path())
            .env("GOCACHE", super::build::cache_root().join("modules/go-build"))
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-mod=readonly")
            .env("CGO_ENABLED", if component.cgo { "1" } else { "0" })
            .args(["build", "-trimpath", "-ldflags"])
            .arg(component.ldflags());
        if !component.tags.is_empty() {
            build.arg(format!("-tags={}", component.tags.join(",")));
        }
        // The patched copies replace their modules through a workspace; without one, go
        // must not pick up a go.work from above the module.
        build.env("GOWORK", workspace.as_deref().unwrap_or(Path::new("off")));
        build.arg("-o").arg(partial.join(binary)).arg(package);
        process::run_logged(
            &format!("go build {binary}"),
            &mut build,
            log,
            PROGRESS,
            &super::build::compiling_heartbeat,
        )?;
    }
    for program in component.c_programs {
        let source = module_dir(&go, &component.module_path(), program.module)?.join(program.source);
        let output = partial.join(program.binary);
        let mut gcc = Command::new("gcc");
        gcc.args(["-Os", "-Wall", "-Werror", "-static"])
            .arg(format!("-D{}", program.define))
            .arg("-o")
            .arg(&output)
            .arg(&source);
        process::run_logged(
            &format!("gcc {}", program.source),
            &mut gcc,
            log,
            PROGRESS,
            &super::build::compiling_heartbeat,
        )?;
        process::run_logged(
            &format!("strip {}", program.binary),
            Command::new("strip").arg(&output),
            log,
            PROGRESS,
            &super::build::compiling_heartbeat,
        )?;
    }
    if scratch.exists() {
        fs::remove_dir_all(&scratch).with_context(|| format!("cannot remove {}", scratch.display()))?;
    }
    if let Some((first, _)) = component.binaries.first() {
        for link in component.links {
            std::os::unix::fs::symlink(first, partial.join(link))
                .with_context(|| format!("cannot link {link} to {first}"))?;
        }
    }
    fs::write(
        partial.join(STAMP_FILE),
        format!(
            "{}\nbuilt in {}\n",
            component.stamp_header()?,
            human_duration(started.elapsed())
        ),
    )?;
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&partial, &dir).with_context(|| format!("cannot move the build into {}", dir.display()))?;
    PROGRESS.say(&format!(
        "{label}: built in {} ({})",
        human_duration(started.elapsed()),
        component.outputs().collect::<Vec<_>>().join(", ")
    ));
    Ok(())
}

/// The machine's Go: `/usr/local/go/bin/go`, else the first `go` on PATH.
fn go_binary() -> anyhow::Result<PathBuf> {
    let local = Path::new("/usr/local/go/bin/go");
    if local.is_file() {
        return Ok(local.to_path_buf());
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("go"))
        .find(|go| go.is_file());
    match on_path {
        Some(go) => Ok(go),
        None => bail!("no Go toolchain: /usr/local/go/bin/go is missing and no `go` is on PATH"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RELEASES: [Release; 2] = [Release::V1_34, Release::V1_37];

    #[test]
    fn every_module_dir_is_committed_with_its_sums() {
        for component in RELEASES
            .iter()
            .flat_map(|&r| components(r).expect("from modules"))
            .chain([HELM])
        {
            let module = component.module_path();
            for file in ["go.mod", "go.sum"] {
                assert!(module.join(file).is_file(), "{} has no {file}", module.display());
            }
            let go_mod = fs::read_to_string(module.join("go.mod")).expect("go.mod");
            assert!(
                go_mod.contains(&format!("v{}", component.version)),
                "{}'s go.mod does not pin v{}",
                component.name,
                component.version
            );
        }
    }

    #[test]
    fn every_staging_module_is_pinned_to_the_release() {
        for release in RELEASES {
            let [kubernetes, ..] = components(release).expect("from modules");
            let go_mod = fs::read_to_string(kubernetes.module_path().join("go.mod")).expect("go.mod");
            let minor = release.version().trim_start_matches('1');
            let replaces: Vec<&str> = go_mod.lines().filter(|l| l.contains("=>")).collect();
            assert!(
                replaces.len() >= 30,
                "{release}: the staging modules are pinned: {replaces:?}"
            );
            for line in replaces {
                assert!(
                    line.trim_end().ends_with(&format!("v0{minor}")),
                    "{release}: {line}"
                );
            }
        }
    }

    #[test]
    fn the_downloaded_dir_is_read_from_go_mod_download() {
        let json = r#"{"Path": "k8s.io/cri-client", "Version": "v0.37.2",
            "Dir": "/root/go/pkg/mod/k8s.io/cri-client@v0.37.2"}"#;
        assert_eq!(
            downloaded_dir("k8s.io/cri-client", json).expect("a dir"),
            Path::new("/root/go/pkg/mod/k8s.io/cri-client@v0.37.2")
        );
        let failed = r#"{"Path": "k8s.io/nope", "Error": "module lookup disabled"}"#;
        let error = downloaded_dir("k8s.io/nope", failed).expect_err("an error");
        assert!(format!("{error}").contains("module lookup disabled"), "{error}");
        assert!(downloaded_dir("k8s.io/cri-client", r#"{"Path": "k8s.io/cri-client"}"#).is_err());
        assert!(downloaded_dir("k8s.io/cri-client", "not json").is_err());
    }

    #[test]
    fn each_release_has_its_own_module_and_cache_dir() {
        let [a, ..] = components(Release::V1_34).expect("from modules");
        let [b, ..] = components(Release::V1_37).expect("from modules");
        assert_ne!(a.module_path(), b.module_path());
        assert_ne!(a.dir(), b.dir());
        assert!(components(Release::V1_20).is_err());
    }

    #[test]
    fn the_kubernetes_version_is_stamped() {
        for (release, version, minor) in [
            (Release::V1_37, "v1.37.2", "37"),
            (Release::V1_34, "v1.34.4", "34"),
        ] {
            let components = components(release).expect("from modules");
            let flags = components[0].ldflags();
            assert!(
                flags.contains(&format!("k8s.io/component-base/version.gitVersion={version}")),
                "{flags}"
            );
            assert!(
                flags.contains(&format!("k8s.io/component-base/version.gitMinor={minor}")),
                "{flags}"
            );
            assert!(!components[1].ldflags().contains("-X"));
        }
    }
}
