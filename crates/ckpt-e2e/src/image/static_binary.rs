//! The agent as a static binary: the musl target (its libc is linked in, and it resolves
//! names without NSS modules), release profile, stripped, built in a cargo target dir of its
//! own so its profile settings never invalidate the everyday builds.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail, ensure};

use super::{PROGRESS, target_dir};
use crate::apt::Apt;
use crate::command::run_on_terminal;
use crate::progress::human_duration;
use crate::project_root;

pub const STATIC_TARGET: &str = "x86_64-unknown-linux-musl";

/// ring (rustls' crypto) compiles C: with musl's headers and start files, from Debian's
/// musl-tools. cc-rs looks for a cross compiler named after the target otherwise.
const MUSL_CC: &str = "musl-gcc";

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
    let started = Instant::now();
    ensure_rust_target()?;
    Apt::new(super::apt_log(), PROGRESS).install(&["musl-tools"])?;

    let cargo_target = target_dir().join("static");
    PROGRESS.say(&format!(
        "building pod-checkpointer for {STATIC_TARGET} (release, stripped) in {}; ~5 min cold on 2 cores",
        cargo_target.display()
    ));
    let args = [
        "build",
        "--release",
        "--locked",
        "-p",
        "ckpt-bin",
        "--bin",
        "pod-checkpointer",
        "--target",
        STATIC_TARGET,
    ];
    eprintln!("$ cargo {}", args.join(" "));
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    // What `cargo run` and `cargo test` set for xtask itself. ring's build script watches
    // CARGO_MANIFEST_DIR: with it inherited, a build from xtask and one from a shell (or
    // from the test) would each make the other rebuild ring and everything above it.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if CARGO_SET_FOR_CRATES.contains(&name.as_ref())
            || name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_EXE_")
        {
            cargo.env_remove(name.as_ref());
        }
    }
    run_on_terminal(
        cargo
            .args(args)
            .current_dir(project_root())
            .env("CARGO_TARGET_DIR", &cargo_target)
            .env(format!("CC_{}", STATIC_TARGET.replace('-', "_")), MUSL_CC)
            .env("CARGO_PROFILE_RELEASE_STRIP", "symbols"),
    )
    .context("building the static agent failed")?;

    let binary = cargo_target.join(STATIC_TARGET).join("release/pod-checkpointer");
    let data = std::fs::read(&binary).with_context(|| format!("cannot read {}", binary.display()))?;
    ensure!(
        is_static_elf(&data)?,
        "{} has a program interpreter: not static",
        binary.display()
    );
    let version = Command::new(&binary)
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
    check_failpoints_compiled_out(&binary)?;
    PROGRESS.say(&format!(
        "static agent: {} ({:.1} MiB, {version}) in {}",
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
fn check_failpoints_compiled_out(binary: &std::path::Path) -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("cannot make a temporary directory")?;
    let data = dir.path().join("ck/checkpoint-secrets/ns/p/s/k");
    std::fs::create_dir_all(dir.path().join("ck/checkpoint-secrets/ns/p/s"))?;
    std::fs::write(&data, "v")?;
    let path = |rel: &str| dir.path().join(rel).display().to_string();
    let out = Command::new(binary)
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

/// `rustup target add` when the toolchain lacks the musl standard library.
fn ensure_rust_target() -> anyhow::Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .current_dir(project_root())
        .output()
        .context("cannot run rustup: the static build needs the musl target's standard library")?;
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|line| line.trim() == STATIC_TARGET)
    {
        return Ok(());
    }
    PROGRESS.say(&format!("rustup target add {STATIC_TARGET}"));
    run_on_terminal(
        Command::new("rustup")
            .args(["target", "add", STATIC_TARGET])
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
