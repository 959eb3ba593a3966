//! `cargo xtask release`: everything a release publishes, built here into `dist/` (there is
//! no registry to push to): the agent's image as one OCI archive holding an image index for
//! linux/amd64 and linux/arm64, the static binaries in it, the install manifests pinned to
//! the index's digest, the Helm chart packaged with the same pin, an SBOM of the binary's
//! crates, the release notes, and SHA256SUMS over all of them. docs/release.md says what each file is for.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail, ensure};
use ckpt_render::{KubernetesVersion, ManifestArgs, render, to_yaml};

use crate::cargo_tool::CargoTool;
use crate::command::run_command;
use crate::image::{self, Arch};
use crate::progress::{Progress, human_duration};
use crate::project_root;

/// The SBOM generator, pinned: what `cargo install --locked` builds once into the cache.
pub const SBOM_TOOL: CargoTool = CargoTool {
    krate: "cargo-cyclonedx",
    version: "0.5.9",
    program: "cargo-cyclonedx",
};

/// The file names in `dist/`.
pub const MANIFESTS_FILE: &str = "pod-checkpointer.yaml";
pub const NOTES_FILE: &str = "RELEASE-NOTES.md";
pub const SUMS_FILE: &str = "SHA256SUMS";

/// Build what a release publishes into dist/: the multi-platform image archive, the
/// binaries, the install YAML pinned to the image's digest, the Helm chart with the same
/// pin, an SBOM, the release notes, SHA256SUMS.
#[derive(clap::Args)]
pub struct Release {
    /// The image's name; the install YAML names it by digest [default: the rendered
    /// manifests' image, ghcr.io/pod-checkpointer/pod-checkpointer:<version>]
    #[arg(long, value_name = "NAME")]
    image: Option<String>,
    /// The architectures to ship
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Arch::ALL)]
    arch: Vec<Arch>,
    /// Where to write; replaced whole when it holds a previous release (its SHA256SUMS)
    /// [default: dist/ in the workspace]
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    output: Option<PathBuf>,
}

impl Release {
    pub fn run(&self) -> anyhow::Result<()> {
        let options = ReleaseOptions {
            reference: self
                .image
                .clone()
                .unwrap_or_else(|| ckpt_render::DEFAULT_IMAGE.to_owned()),
            archs: self.arch.clone(),
            output: self.output.clone().unwrap_or_else(|| project_root().join("dist")),
        };
        let artifacts = build_release(&options)?;
        for (path, size) in &artifacts.files {
            println!("{}\t{}", image::human_size(*size), path.display());
        }
        Ok(())
    }
}

/// What to release, and where.
#[derive(Clone, Debug)]
pub struct ReleaseOptions {
    /// The image's name with its tag.
    pub reference: String,
    pub archs: Vec<Arch>,
    pub output: PathBuf,
}

/// What [`build_release`] wrote.
#[derive(Clone, Debug)]
pub struct ReleaseArtifacts {
    /// The image index's digest, the install YAML's pin.
    pub image_digest: String,
    pub archive: PathBuf,
    /// Each architecture's static binary, as shipped in the image.
    pub binaries: Vec<(Arch, PathBuf)>,
    pub manifests: PathBuf,
    /// The Helm chart's package, its default image the same pin.
    pub chart: PathBuf,
    pub sbom: PathBuf,
    pub notes: PathBuf,
    pub sums: PathBuf,
    /// Every file of the output directory with its size, by name.
    pub files: Vec<(PathBuf, u64)>,
}

/// Builds every artifact into a fresh directory beside `options.output`, then puts it in
/// its place, so the output never mixes two releases.
pub fn build_release(options: &ReleaseOptions) -> anyhow::Result<ReleaseArtifacts> {
    let started = Instant::now();
    let progress = Progress::timed("release");
    ensure!(!options.archs.is_empty(), "--arch: no architecture to release");
    let version = env!("CARGO_PKG_VERSION");
    let out = &options.output;
    let staging = sibling(out, ".part")?;
    if staging.exists() {
        std::fs::remove_dir_all(&staging).with_context(|| format!("cannot remove {}", staging.display()))?;
    }
    std::fs::create_dir_all(&staging).with_context(|| format!("cannot create {}", staging.display()))?;
    let phase = |name: &str| Phase {
        progress,
        name: name.to_owned(),
    };

    let mut built = Vec::new();
    for &arch in &options.archs {
        let binary =
            phase(&format!("static agent for {arch}")).run(|| image::build_static_agent_for(arch))?;
        built.push((arch, binary));
    }

    let archive_name = image::archive_name(&options.reference);
    let (agent_image, binaries) = phase("image index").run(|| {
        let agent_image =
            image::agent_multi_platform_image(&built, &options.reference, &staging.join(&archive_name))?;
        let mut binaries = Vec::new();
        for (arch, binary) in &built {
            let name = format!(
                "pod-checkpointer-{version}-{}",
                arch.platform().to_string().replace('/', "-")
            );
            std::fs::copy(binary, staging.join(&name))
                .with_context(|| format!("cannot copy {} into {}", binary.display(), staging.display()))?;
            binaries.push((*arch, out.join(name)));
        }
        Ok((agent_image, binaries))
    })?;

    let pinned = pinned_reference(&options.reference, &agent_image.digest())?;
    phase("install manifests").run(|| {
        let manifests = ManifestArgs {
            image: pinned.clone(),
            ..ManifestArgs::default()
        }
        .options_for(KubernetesVersion::NEWEST, &ckpt_bin::render::BuiltIn)?;
        let yaml = to_yaml(&render(&manifests))?;
        let images = container_images(&yaml)?;
        ensure!(
            !images.is_empty() && images.iter().all(|image| *image == pinned),
            "the manifests run {images:?}, not only {pinned}"
        );
        std::fs::write(staging.join(MANIFESTS_FILE), yaml)?;
        progress.say(&format!("{MANIFESTS_FILE}: image {pinned}"));
        Ok(())
    })?;

    let chart = phase("Helm chart").run(|| {
        let file = crate::chart::package(&crate::chart::chart_dir(), &staging, &pinned)?;
        progress.say(&format!(
            "{}: image {pinned}",
            file.file_name().unwrap_or_default().to_string_lossy()
        ));
        Ok(out.join(file.file_name().unwrap_or_default()))
    })?;

    let sbom_name = format!("pod-checkpointer-{version}.cdx.json");
    phase("SBOM").run(|| write_sbom(&options.archs, &staging.join(&sbom_name), progress))?;

    phase("release notes").run(|| {
        let notes = release_notes(version, &agent_image, &pinned, progress)?;
        Ok(std::fs::write(staging.join(NOTES_FILE), notes)?)
    })?;

    phase(SUMS_FILE).run(|| Ok(std::fs::write(staging.join(SUMS_FILE), sha256sums(&staging)?)?))?;

    replace_dir(&staging, out)?;
    let files = listing(out)?;
    progress.say(&format!(
        "release {version} ({}) in {} in {}",
        agent_image.digest(),
        out.display(),
        human_duration(started.elapsed())
    ));
    Ok(ReleaseArtifacts {
        image_digest: agent_image.digest(),
        archive: out.join(archive_name),
        binaries,
        manifests: out.join(MANIFESTS_FILE),
        chart,
        sbom: out.join(sbom_name),
        notes: out.join(NOTES_FILE),
        sums: out.join(SUMS_FILE),
        files,
    })
}

/// One phase of the release: a progress line when it starts, and one with its time when it
/// is done.
struct Phase {
    progress: Progress,
    name: String,
}

impl Phase {
    fn run<T>(self, work: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
        self.progress.say(&format!("phase {}", self.name));
        let started = Instant::now();
        let result = work().with_context(|| format!("release phase {}", self.name))?;
        self.progress.say(&format!(
            "phase {}: done in {}",
            self.name,
            human_duration(started.elapsed())
        ));
        Ok(result)
    }
}

/// `registry/name:tag` with `sha256:…` → `registry/name@sha256:…`: the tag can move, the
/// digest cannot.
pub fn pinned_reference(reference: &str, digest: &str) -> anyhow::Result<String> {
    let (repository, name) = reference.rsplit_once('/').unwrap_or(("", reference));
    let name = name.split_once('@').map_or(name, |(name, _)| name);
    let name = name.split_once(':').map_or(name, |(name, _)| name);
    ensure!(!name.is_empty(), "the image {reference:?} has no name");
    ensure!(
        digest.strip_prefix("sha256:").is_some_and(|hex| hex.len() == 64),
        "not a sha256 digest: {digest}"
    );
    Ok(if repository.is_empty() {
        format!("{name}@{digest}")
    } else {
        format!("{repository}/{name}@{digest}")
    })
}

/// The `image` of every container in multi-document `yaml`, in order.
pub fn container_images(yaml: &str) -> anyhow::Result<Vec<String>> {
    fn collect(value: &serde_json::Value, images: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(fields) => {
                for (key, field) in fields {
                    match (key.as_str(), field) {
                        ("image", serde_json::Value::String(image)) => images.push(image.clone()),
                        _ => collect(field, images),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|item| collect(item, images)),
            _ => {}
        }
    }
    let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(yaml).context("not valid YAML")?;
    let mut images = Vec::new();
    for document in &documents {
        collect(document, &mut images);
    }
    Ok(images)
}

/// The SBOM of the agent binary's crates (CycloneDX 1.5 JSON, by cargo-cyclonedx): all its
/// normal dependencies for the first of `archs`' targets (the others' are the same
/// crates), no build-time ones. Reproducible: SOURCE_DATE_EPOCH (HEAD's commit time) makes
/// cargo-cyclonedx leave out its random serial number.
fn write_sbom(archs: &[Arch], out: &Path, progress: Progress) -> anyhow::Result<()> {
    let target = archs
        .first()
        .map_or(image::STATIC_TARGET, |arch| arch.rust_target());
    let root = project_root();
    // cargo-cyclonedx writes one file beside the Cargo.toml of each binary of every
    // workspace member: the agent's is taken, the others it wrote are removed.
    let before = sbom_files(&root)?;
    let written = root.join("crates/ckpt-bin/pod-checkpointer_bin.cdx.json");
    let epoch = git(&["log", "-1", "--format=%ct"])?;
    let mut command = SBOM_TOOL.command(progress)?;
    command
        .args(["cyclonedx", "--format", "json", "--spec-version", "1.5"])
        .args(["--describe", "binaries", "--no-build-deps", "--target", target])
        .arg("--manifest-path")
        .arg(root.join("crates/ckpt-bin/Cargo.toml"))
        .env("SOURCE_DATE_EPOCH", epoch.trim())
        .current_dir(&root);
    let ran = run_command(&mut command);
    let moved = ran.and_then(|_| {
        std::fs::rename(&written, out)
            .with_context(|| format!("cargo-cyclonedx wrote no {}", written.display()))
    });
    for stray in sbom_files(&root)?.difference(&before) {
        std::fs::remove_file(stray).with_context(|| format!("cannot remove {}", stray.display()))?;
    }
    moved?;
    let sbom: serde_json::Value = serde_json::from_slice(&std::fs::read(out)?)
        .with_context(|| format!("{} is not JSON", out.display()))?;
    let components = sbom["components"].as_array().map_or(0, Vec::len);
    ensure!(components > 0, "{}: no components", out.display());
    progress.say(&format!("SBOM: {components} crates ({target})"));
    Ok(())
}

/// The `*.cdx.json` files of the workspace members' directories.
fn sbom_files(root: &Path) -> anyhow::Result<std::collections::BTreeSet<PathBuf>> {
    let mut files = std::collections::BTreeSet::new();
    let mut dirs = vec![root.join("xtask")];
    for entry in std::fs::read_dir(root.join("crates"))? {
        dirs.push(entry?.path());
    }
    for dir in dirs.iter().filter(|dir| dir.is_dir()) {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.to_string_lossy().ends_with(".cdx.json") {
                files.insert(path);
            }
        }
    }
    Ok(files)
}

/// `git ARGS…` in the project root: its stdout.
fn git(args: &[&str]) -> anyhow::Result<String> {
    let mut command = Command::new("git");
    command.args(args).current_dir(project_root());
    run_command(&mut command)
}

/// The release notes: what the release is, then CHANGELOG.md's section for `version` (or
/// its Unreleased one); without either, the commits since the last tag, saying so.
fn release_notes(
    version: &str,
    image: &crate::image::oci::MultiPlatformImage,
    pinned: &str,
    progress: Progress,
) -> anyhow::Result<String> {
    let mut notes = format!("# pod-checkpointer {version}\n\n");
    writeln!(notes, "Image: `{pinned}`, tagged `{}`, for", image.reference)?;
    for platform in image.images.iter().map(|i| i.platform) {
        writeln!(notes, "- {platform}")?;
    }
    writeln!(
        notes,
        "\nInstall: `kubectl apply -f {MANIFESTS_FILE}` (see docs/release.md).\n"
    )?;
    let changelog = std::fs::read_to_string(project_root().join("CHANGELOG.md")).ok();
    match changelog
        .as_deref()
        .and_then(|text| changelog_section(text, version))
    {
        Some(section) => {
            progress.say("release notes: CHANGELOG.md's section");
            notes.push_str(section.trim_end());
            notes.push('\n');
        }
        None => {
            let why = if changelog.is_some() {
                format!("CHANGELOG.md has no section for {version} or Unreleased")
            } else {
                "There is no CHANGELOG.md".to_owned()
            };
            progress.say(&format!("release notes: {why}; listing the commits instead"));
            let (since, commits) = commits_since_last_tag()?;
            writeln!(notes, "## Changes\n\n{why}: the commits {since}, newest first.\n")?;
            notes.push_str(&commits);
        }
    }
    Ok(notes)
}

/// CHANGELOG.md's section for `version` (`## [0.1.0] - …`), else its `## [Unreleased]`
/// one, from its heading to the next `## `: Keep a Changelog's layout.
pub fn changelog_section<'a>(changelog: &'a str, version: &str) -> Option<&'a str> {
    let find = |name: &str| {
        let heading = format!("## [{}]", name.to_lowercase());
        let mut offset = 0;
        for line in changelog.split_inclusive('\n') {
            if line.to_lowercase().starts_with(&heading) {
                return Some(offset);
            }
            offset += line.len();
        }
        None
    };
    let start = find(version).or_else(|| find("Unreleased"))?;
    let rest = &changelog[start..];
    let body_start = rest.find('\n').map_or(rest.len(), |n| n + 1);
    let end = rest[body_start..]
        .find("\n## ")
        .map_or(rest.len(), |n| body_start + n + 1);
    Some(&rest[..end])
}

/// `(since what, "- subject (abbreviated hash)\n" lines)` for the commits after the last
/// tag, or all of them when there is none.
fn commits_since_last_tag() -> anyhow::Result<(String, String)> {
    let last_tag = git(&["describe", "--tags", "--abbrev=0"]).ok();
    let (since, range) = match last_tag.as_deref().map(str::trim) {
        Some(tag) if !tag.is_empty() => (format!("since {tag}"), format!("{tag}..HEAD")),
        _ => ("of the whole history (no tag yet)".to_owned(), "HEAD".to_owned()),
    };
    let commits = git(&["log", "--no-merges", "--format=- %s (%h)", &range])?;
    Ok((since, commits))
}

/// `sha256sum`'s format over every file of `dir` by name: `<hex>  <name>`.
pub fn sha256sums(dir: &Path) -> anyhow::Result<String> {
    let mut sums = String::new();
    for (name, path) in files_by_name(dir)? {
        let data = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let digest = image::oci::sha256_digest(&data);
        writeln!(sums, "{}  {name}", digest.trim_start_matches("sha256:"))?;
    }
    Ok(sums)
}

/// The regular files directly in `dir`, by name; anything else there is refused (a
/// release is a flat list of files).
fn files_by_name(dir: &Path) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        ensure!(
            entry.file_type()?.is_file(),
            "{} is not a regular file",
            path.display()
        );
        let name = entry
            .file_name()
            .into_string()
            .map_err(|name| anyhow::anyhow!("{name:?} is not UTF-8"))?;
        files.insert(name, path);
    }
    Ok(files)
}

fn listing(dir: &Path) -> anyhow::Result<Vec<(PathBuf, u64)>> {
    files_by_name(dir)?
        .into_values()
        .map(|path| -> anyhow::Result<(PathBuf, u64)> {
            let size = std::fs::metadata(&path)?.len();
            Ok((path, size))
        })
        .collect()
}

/// `dir` with `suffix` added to its last component.
fn sibling(dir: &Path, suffix: &str) -> anyhow::Result<PathBuf> {
    let name = dir
        .file_name()
        .with_context(|| format!("{} has no directory name", dir.display()))?;
    let mut name = name.to_owned();
    name.push(suffix);
    Ok(dir.with_file_name(name))
}

/// Puts `staging` in `out`'s place. An existing `out` is removed only when it is empty or a
/// previous release (it has a SHA256SUMS): `-o` pointing at a directory of other files
/// fails instead of deleting them.
pub fn replace_dir(staging: &Path, out: &Path) -> anyhow::Result<()> {
    if out.exists() {
        let empty = std::fs::read_dir(out)
            .with_context(|| format!("cannot list {}", out.display()))?
            .next()
            .is_none();
        if !empty && !out.join(SUMS_FILE).is_file() {
            bail!(
                "{} holds files but no {SUMS_FILE}: not a previous release, left as it is",
                out.display()
            );
        }
        std::fs::remove_dir_all(out).with_context(|| format!("cannot remove {}", out.display()))?;
    }
    std::fs::rename(staging, out)
        .with_context(|| format!("cannot move {} to {}", staging.display(), out.display()))
}

#[cfg(test)]
mod tests;
