//! The agent as a static binary: the musl target (its libc is linked in, and it resolves
//! names without NSS modules), release profile, stripped, built in a cargo target dir of its
//! own so its profile settings never invalidate the everyday builds. For amd64 natively, for
//! arm64 cross-compiled (ring's C by clang, linked by rust-lld) and run under qemu-user.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail, ensure};

use super::{PROGRESS, oci, target_dir};
use crate::apt::Apt;
use crate::command::run_on_terminal;
use crate::progress::human_duration;
use crate::project_root;

/// The amd64 agent's target, what `cargo xtask image` builds.
pub const STATIC_TARGET: &str = "x86_64-unknown-linux-musl";

/// A CPU the agent ships for (an image index has one manifest per architecture).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    /// Every architecture a release ships, in the image index's order.
    pub const ALL: [Arch; 2] = [Arch::Amd64, Arch::Arm64];

    /// Go's name, as image platforms and the Containerfile's `TARGETARCH` spell it.
    pub fn name(self) -> &'static str {
        self.platform().architecture
    }

    pub fn platform(self) -> oci::Platform {
        match self {
            Arch::Amd64 => oci::Platform::LINUX_AMD64,
            Arch::Arm64 => oci::Platform::LINUX_ARM64,
        }
    }

    pub fn rust_target(self) -> &'static str {
        match self {
            Arch::Amd64 => STATIC_TARGET,
            Arch::Arm64 => "aarch64-unknown-linux-musl",
        }
    }

    /// The ELF header's `e_machine` of its programs.
    pub fn elf_machine(self) -> u16 {
        match self {
            Arch::Amd64 => 62,
            Arch::Arm64 => 183,
        }
    }

    /// The architecture of this machine's own programs, if the agent ships for it.
    pub fn host() -> Option<Arch> {
        match std::env::consts::ARCH {
            "x86_64" => Some(Arch::Amd64),
            "aarch64" => Some(Arch::Arm64),
            _ => None,
        }
    }

    /// The variables that make cargo build ring's C and link for this target; the
    /// Containerfile sets the same (a test compares them).
    ///
    /// ring compiles C (and assembly): for amd64 with musl's headers and start files, from
    /// Debian's musl-tools (cc-rs looks for a cross compiler named after the target
    /// otherwise). For arm64 Debian has no musl cross compiler, and needs none: ring builds
    /// its C without a libc's headers when clang compiles it for a musl target other than
    /// x86_64 (`-nostdlibinc`); llvm-ar indexes the aarch64 objects (binutils' ar cannot);
    /// Rust's musl target brings its own libc and start files, so rust-lld links alone.
    pub fn build_env(self) -> Vec<(String, &'static str)> {
        let target = self.rust_target().replace('-', "_");
        match self {
            Arch::Amd64 => vec![(format!("CC_{target}"), "musl-gcc")],
            Arch::Arm64 => vec![
                (format!("CC_{target}"), "clang"),
                (format!("AR_{target}"), "llvm-ar"),
                (
                    format!("CARGO_TARGET_{}_LINKER", target.to_uppercase()),
                    "rust-lld",
                ),
            ],
        }
    }

    /// The Debian packages [`build_env`](Arch::build_env) needs, and what runs the binary
    /// here when this is not the machine's own architecture.
    pub fn build_packages(self) -> &'static [&'static str] {
        match self {
            Arch::Amd64 => &["musl-tools"],
            Arch::Arm64 => &["clang", "llvm"],
        }
    }

    /// Debian's qemu-user-static program for this architecture (it needs no binfmt_misc
    /// registration: it is given the program to run).
    fn qemu_user(self) -> &'static str {
        match self {
            Arch::Amd64 => "qemu-x86_64-static",
            Arch::Arm64 => "qemu-aarch64-static",
        }
    }

    /// A command that runs `binary`, a program of this architecture: directly on a machine of
    /// it, else under qemu-user (Debian's qemu-user-static, installed if missing).
    pub fn command(self, binary: &Path) -> anyhow::Result<Command> {
        if Arch::host() == Some(self) {
            return Ok(Command::new(binary));
        }
        Apt::new(super::apt_log(), PROGRESS).install(&["qemu-user-static"])?;
        let mut command = Command::new(self.qemu_user());
        command.arg(binary);
        Ok(command)
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The variables cargo sets for the crate it runs (besides `CARGO_PKG_*` and
/// `CARGO_BIN_EXE_*`), which a nested build must not inherit.
const CARGO_SET_FOR_CRATES: &[&str] = &[
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_MANIFEST_LINKS",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_NAME",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
    "OUT_DIR",
];

/// Builds `pod-checkpointer` for [`STATIC_TARGET`] (installing the Rust target and musl-gcc
/// when missing), checks that it is static and runs, and returns its path.
pub fn build_static_agent() -> anyhow::Result<PathBuf> {
    build_static_agent_for(Arch::Amd64)
}

/// Builds `pod-checkpointer` for `arch`'s musl target (installing the Rust target and the
/// Debian packages of [`Arch::build_packages`] when missing), checks that it is a static ELF
/// of that architecture, that it runs (under qemu-user on another architecture) and has no
/// failpoints, and returns its path.
pub fn build_static_agent_for(arch: Arch) -> anyhow::Result<PathBuf> {
    let started = Instant::now();
    let target = arch.rust_target();
    static_toolchain(arch)?;

    let cargo_target = static_target_dir();
    PROGRESS.say(&format!(
        "building pod-checkpointer for {target} (release, stripped) in {}; ~5 min cold on 2 cores",
        cargo_target.display()
    ));
    let (mut cargo, binary) = static_build(arch, &project_root());
    run_on_terminal(&mut cargo).with_context(|| format!("building the static agent for {arch} failed"))?;

    let data = std::fs::read(&binary).with_context(|| format!("cannot read {}", binary.display()))?;
    ensure!(
        is_static_elf(&data)?,
        "{} has a program interpreter: not static",
        binary.display()
    );
    let machine = elf_machine(&data)?;
    ensure!(
        machine == arch.elf_machine(),
        "{} is an ELF for machine {machine}, not {arch}'s {}",
        binary.display(),
        arch.elf_machine()
    );
    let version = arch
        .command(&binary)?
        .arg("--version")
        .output()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    let expected = format!("pod-checkpointer {}", env!("CARGO_PKG_VERSION"));
    ensure!(
        version == expected,
        "{} --version says {version:?}, not {expected:?}",
        binary.display()
    );
    check_failpoints_compiled_out(arch, &binary)?;
    PROGRESS.say(&format!(
        "static agent for {arch}: {} ({:.1} MiB, {version}) in {}",
        binary.display(),
        data.len() as f64 / (1024.0 * 1024.0),
        human_duration(started.elapsed())
    ));
    Ok(binary)
}

/// Fails unless `binary` ignores `CKPT_FAILPOINTS`: the store's failpoints (feature
/// `failpoints`, which only test builds enable) must be compiled out of what ships, or
/// anyone who can set the agent's environment could make its disk fail. The probe is a
/// `drain` of one data directory with every unlink set to fail with EIO; a build with the
/// failpoints fails it (ckpt-bin's `a_test_build_honours_ckpt_failpoints` runs the same on
/// its test build), this one must drain.
fn check_failpoints_compiled_out(arch: Arch, binary: &Path) -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("cannot make a temporary directory")?;
    let data = dir.path().join("ck/checkpoint-secrets/ns/p/s/k");
    std::fs::create_dir_all(dir.path().join("ck/checkpoint-secrets/ns/p/s"))?;
    std::fs::write(&data, "v")?;
    let path = |rel: &str| dir.path().join(rel).display().to_string();
    let out = arch
        .command(binary)?
        .args(["drain", "--force", "--checkpoint-dir", &path("ck")])
        .args([
            "--manifests-dir",
            &path("manifests"),
            "--lock-file",
            &path("lock"),
        ])
        .env("CKPT_FAILPOINTS", "fsops.unlink=error(5)")
        .output()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    ensure!(
        out.status.success() && !data.exists(),
        "{} honours CKPT_FAILPOINTS (drain with failing unlinks: {}, the data {}): the failpoints are compiled into a release build\n{}",
        binary.display(),
        out.status,
        if data.exists() { "kept" } else { "removed" },
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// cargo, for a build of its own from within a cargo-run program (xtask, a test), without
/// what `cargo run` and `cargo test` set for that program. ring's build script watches
/// CARGO_MANIFEST_DIR: with it inherited, a build from xtask and one from a shell (or from
/// the test) would each make the other rebuild ring and everything above it.
pub(crate) fn nested_cargo() -> Command {
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if CARGO_SET_FOR_CRATES.contains(&name.as_ref())
            || name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_EXE_")
        {
            cargo.env_remove(name.as_ref());
        }
    }
    cargo
}

/// What [`static_build`] needs for `arch`: the Rust target and Debian's packages, installed
/// when missing.
pub fn static_toolchain(arch: Arch) -> anyhow::Result<()> {
    ensure_rust_target(arch.rust_target())?;
    Apt::new(super::apt_log(), PROGRESS).install(arch.build_packages())
}

/// The target dir of the static builds (dependencies shared by every source tree built there).
fn static_target_dir() -> PathBuf {
    target_dir().join("static")
}

/// The cargo command that builds the static agent for `arch` from the workspace at `source`
/// (the project, or a worktree of another commit), and where it leaves the binary. Needs
/// [`static_toolchain`].
pub fn static_build(arch: Arch, source: &Path) -> (Command, PathBuf) {
    let target = arch.rust_target();
    let args = [
        "build",
        "--release",
        "--locked",
        "-p",
        "ckpt-bin",
        "--bin",
        "pod-checkpointer",
        "--target",
        target,
    ];
    eprintln!("$ cargo {}", args.join(" "));
    let mut cargo = nested_cargo();
    cargo
        .args(args)
        .current_dir(source)
        .env("CARGO_TARGET_DIR", static_target_dir())
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols");
    for (name, value) in arch.build_env() {
        cargo.env(name, value);
    }
    (
        cargo,
        static_target_dir().join(target).join("release/pod-checkpointer"),
    )
}

/// `rustup target add` when the toolchain lacks `target`'s standard library.
fn ensure_rust_target(target: &str) -> anyhow::Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .current_dir(project_root())
        .output()
        .context("cannot run rustup: the static build needs the musl targets' standard library")?;
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|line| line.trim() == target)
    {
        return Ok(());
    }
    PROGRESS.say(&format!("rustup target add {target}"));
    run_on_terminal(
        Command::new("rustup")
            .args(["target", "add", target])
            .current_dir(project_root()),
    )
}

const PT_INTERP: u32 = 3;

/// Whether `elf` is a 64-bit little-endian ELF without a program interpreter (`PT_INTERP`):
/// the kernel runs it without a dynamic loader, so it needs no library from the image.
pub fn is_static_elf(elf: &[u8]) -> anyhow::Result<bool> {
    ensure!(elf.starts_with(b"\x7fELF"), "not an ELF file");
    ensure!(
        elf.get(4) == Some(&2) && elf.get(5) == Some(&1),
        "not a 64-bit little-endian ELF file"
    );
    let u16_at = |at: usize| elf.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else {
        bail!("truncated ELF header");
    };
    for index in 0..usize::from(phnum) {
        let at = usize::try_from(phoff)? + index * usize::from(phentsize);
        let Some(kind) = elf.get(at..at + 4) else {
            bail!("truncated ELF program header {index}");
        };
        if u32::from_le_bytes([kind[0], kind[1], kind[2], kind[3]]) == PT_INTERP {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The `e_machine` of a 64-bit little-endian ELF file: which CPU its code is for.
pub fn elf_machine(elf: &[u8]) -> anyhow::Result<u16> {
    ensure!(elf.starts_with(b"\x7fELF"), "not an ELF file");
    ensure!(
        elf.get(4) == Some(&2) && elf.get(5) == Some(&1),
        "not a 64-bit little-endian ELF file"
    );
    let Some(machine) = elf.get(0x12..0x14) else {
        bail!("truncated ELF header");
    };
    Ok(u16::from_le_bytes([machine[0], machine[1]]))
}
