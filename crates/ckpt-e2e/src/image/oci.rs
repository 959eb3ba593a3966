//! A small, deterministic writer of single-layer OCI image archives (an OCI image layout in
//! a tar: `oci-layout`, `index.json`, `blobs/sha256/…`), what `ctr images import`,
//! `podman load` and `skopeo copy oci-archive:…` read. No container engine is involved. An
//! archive holds one image ([`Image`], for one platform) or one image for several platforms
//! ([`MultiPlatformImage`]: an image index of per-platform manifests).
//!
//! Deterministic: the layer's entries are sorted by path, owned by 0:0, dated [`MTIME`]; the
//! gzip stream has no timestamp or file name; every JSON document has a fixed key order.
//! The same inputs give a byte-identical archive, so the image digest names the inputs.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, bail, ensure};
pub use flate2::Compression;
use flate2::GzBuilder;
use serde_json::json;
use sha2::{Digest, Sha256};

/// The modification time of every entry, the layer's and the archive's: the epoch, since
/// nothing in an image should depend on when it was built.
pub const MTIME: u64 = 0;

pub const MEDIA_TYPE_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_TYPE_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_TYPE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_TYPE_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// What containerd names an imported image after.
pub const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";
/// The image layout's own name for a manifest (the tag): what `skopeo copy
/// oci-archive:FILE:TAG` picks.
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The `oci-layout` file: which version of the image layout the archive is.
pub const OCI_LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;

/// One entry of a layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    Dir { mode: u32 },
    File { mode: u32, data: Vec<u8> },
    Symlink { target: String },
}

/// A layer's file tree, kept sorted by path (a parent sorts before its children, since a
/// path sorts after each of its prefixes).
#[derive(Clone, Debug, Default)]
pub struct Layer {
    entries: BTreeMap<String, Entry>,
}

impl Layer {
    pub fn new() -> Layer {
        Layer::default()
    }

    /// A directory (and its missing parents, 0755).
    pub fn dir(&mut self, path: &str, mode: u32) -> anyhow::Result<&mut Layer> {
        let path = normalize(path)?;
        self.parents(&path);
        self.entries.insert(path, Entry::Dir { mode });
        Ok(self)
    }

    /// A regular file (and its missing parent directories, 0755).
    pub fn file(&mut self, path: &str, mode: u32, data: Vec<u8>) -> anyhow::Result<&mut Layer> {
        let path = normalize(path)?;
        self.parents(&path);
        self.entries.insert(path, Entry::File { mode, data });
        Ok(self)
    }

    /// A symbolic link to `target` (and its missing parent directories, 0755).
    pub fn symlink(&mut self, path: &str, target: &str) -> anyhow::Result<&mut Layer> {
        let path = normalize(path)?;
        self.parents(&path);
        self.entries.insert(
            path,
            Entry::Symlink {
                target: target.to_owned(),
            },
        );
        Ok(self)
    }

    /// The entries, sorted by path (relative, no leading `/`).
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().map(|(path, entry)| (path.as_str(), entry))
    }

    fn parents(&mut self, path: &str) {
        let mut end = 0;
        while let Some(slash) = path[end..].find('/') {
            end += slash;
            self.entries
                .entry(path[..end].to_owned())
                .or_insert(Entry::Dir { mode: 0o755 });
            end += 1;
        }
    }

    /// The layer as an uncompressed tar (what the config's `diff_ids` hash).
    pub fn tar(&self) -> anyhow::Result<Vec<u8>> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, entry) in &self.entries {
            let mut header = tar::Header::new_ustar();
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(MTIME);
            match entry {
                Entry::Dir { mode } => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(*mode);
                    header.set_size(0);
                    builder.append_data(&mut header, format!("{path}/"), std::io::empty())?;
                }
                Entry::File { mode, data } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(data.len() as u64);
                    builder.append_data(&mut header, path, data.as_slice())?;
                }
                Entry::Symlink { target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    builder.append_link(&mut header, path, target)?;
                }
            }
        }
        Ok(builder.into_inner()?)
    }
}

/// A path inside the layer, without its leading `/`; refuses `.`, `..` and empty parts.
fn normalize(path: &str) -> anyhow::Result<String> {
    let relative = path.trim_start_matches('/').trim_end_matches('/');
    ensure!(!relative.is_empty(), "an image entry needs a path, not {path:?}");
    if relative
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        bail!("image entry path {path:?} has an empty, `.` or `..` component");
    }
    Ok(relative.to_owned())
}

/// What the image runs and how it is named.
#[derive(Clone, Debug)]
pub struct ImageConfig {
    /// The full reference, `registry/repository:tag`: containerd's name for the image.
    pub reference: String,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: String,
    pub labels: BTreeMap<String, String>,
}

impl ImageConfig {
    /// An image named `reference` that runs `entrypoint`, with `PATH=/bin` and `/` as its
    /// working directory.
    pub fn new(reference: &str, entrypoint: &[&str]) -> ImageConfig {
        ImageConfig {
            reference: reference.to_owned(),
            entrypoint: entrypoint.iter().map(|s| (*s).to_owned()).collect(),
            cmd: Vec::new(),
            env: vec!["PATH=/bin".to_owned()],
            working_dir: "/".to_owned(),
            labels: BTreeMap::new(),
        }
    }

    /// The tag: what follows the last `:` after the last `/` (`latest` when there is none).
    pub fn tag(&self) -> &str {
        tag_of(&self.reference)
    }
}

/// See [`ImageConfig::tag`].
fn tag_of(reference: &str) -> &str {
    let name = reference.rsplit('/').next().unwrap_or(reference);
    name.rsplit_once(':').map_or("latest", |(_, tag)| tag)
}

/// A content-addressed blob: its bytes and their descriptor fields.
#[derive(Clone, Debug)]
pub struct Blob {
    pub media_type: &'static str,
    pub data: Vec<u8>,
}

impl Blob {
    fn new(media_type: &'static str, data: Vec<u8>) -> Blob {
        Blob { media_type, data }
    }

    /// `sha256:<hex>`.
    pub fn digest(&self) -> String {
        sha256_digest(&self.data)
    }

    fn descriptor(&self) -> serde_json::Value {
        json!({
            "mediaType": self.media_type,
            "digest": self.digest(),
            "size": self.data.len(),
        })
    }
}

/// The OS and CPU an image's programs run on: its manifest's `platform` in an index and its
/// config's `os` and `architecture` (Go's GOOS and GOARCH names, as the image spec says).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Platform {
    pub os: &'static str,
    pub architecture: &'static str,
}

impl Platform {
    pub const LINUX_AMD64: Platform = Platform {
        os: "linux",
        architecture: "amd64",
    };
    pub const LINUX_ARM64: Platform = Platform {
        os: "linux",
        architecture: "arm64",
    };

    fn to_json(self) -> serde_json::Value {
        json!({ "architecture": self.architecture, "os": self.os })
    }
}

impl std::fmt::Display for Platform {
    /// `linux/amd64`, as `--platform` flags spell it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)
    }
}

/// A built image: its blobs and the documents that tie them together.
#[derive(Clone, Debug)]
pub struct Image {
    pub reference: String,
    pub platform: Platform,
    /// sha256 of the uncompressed layer: the config's `rootfs.diff_ids[0]`.
    pub diff_id: String,
    pub layer: Blob,
    pub config: Blob,
    pub manifest: Blob,
    /// `index.json`: not a blob, the layout's entry point.
    pub index: Vec<u8>,
}

impl Image {
    /// Builds the layer blob (gzip of `layer`'s tar, at the best compression), the config,
    /// the manifest and the index, for linux/amd64.
    pub fn build(config: &ImageConfig, layer: &Layer) -> anyhow::Result<Image> {
        Image::build_with(config, layer, Compression::best())
    }

    /// [`build`](Image::build) at another compression level: the fastest is for large layers
    /// that never leave the machine.
    pub fn build_with(
        config: &ImageConfig,
        layer: &Layer,
        compression: Compression,
    ) -> anyhow::Result<Image> {
        Image::build_for(config, layer, compression, Platform::LINUX_AMD64)
    }

    /// [`build_with`](Image::build_with) for programs of `platform`: one image of a
    /// [`MultiPlatformImage`], or one alone.
    pub fn build_for(
        config: &ImageConfig,
        layer: &Layer,
        compression: Compression,
        platform: Platform,
    ) -> anyhow::Result<Image> {
        let tar = layer.tar()?;
        let diff_id = sha256_digest(&tar);
        let layer_blob = Blob::new(MEDIA_TYPE_LAYER_GZIP, gzip(&tar, compression)?);

        let mut image_config = json!({
            "Env": config.env,
            "WorkingDir": config.working_dir,
        });
        if !config.entrypoint.is_empty() {
            image_config["Entrypoint"] = json!(config.entrypoint);
        }
        if !config.cmd.is_empty() {
            image_config["Cmd"] = json!(config.cmd);
        }
        if !config.labels.is_empty() {
            image_config["Labels"] = json!(config.labels);
        }
        let config_blob = Blob::new(
            MEDIA_TYPE_CONFIG,
            to_json(&json!({
                "architecture": platform.architecture,
                "os": platform.os,
                "config": image_config,
                "rootfs": { "type": "layers", "diff_ids": [diff_id] },
                "history": [{ "created_by": "cargo xtask image" }],
            }))?,
        );
        let manifest = Blob::new(
            MEDIA_TYPE_MANIFEST,
            to_json(&json!({
                "schemaVersion": 2,
                "mediaType": MEDIA_TYPE_MANIFEST,
                "config": config_blob.descriptor(),
                "layers": [layer_blob.descriptor()],
            }))?,
        );
        let mut manifest_descriptor = manifest.descriptor();
        manifest_descriptor["platform"] = platform.to_json();
        manifest_descriptor["annotations"] = name_annotations(&config.reference);
        let index = to_json(&json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_TYPE_INDEX,
            "manifests": [manifest_descriptor],
        }))?;
        Ok(Image {
            reference: config.reference.clone(),
            platform,
            diff_id,
            layer: layer_blob,
            config: config_blob,
            manifest,
            index,
        })
    }

    /// The image's digest: its manifest's (what `ctr images ls` and registries show).
    pub fn digest(&self) -> String {
        self.manifest.digest()
    }

    /// The OCI image layout as a tar: `blobs/sha256/…` in digest order, `index.json`,
    /// `oci-layout`.
    pub fn archive(&self) -> anyhow::Result<Vec<u8>> {
        layout_archive([&self.layer, &self.config, &self.manifest], &self.index)
    }

    /// Writes the archive to `out` (through a temporary file beside it, so a reader never
    /// sees half an archive).
    pub fn write(&self, out: &Path) -> anyhow::Result<()> {
        write_atomically(out, &self.archive()?)
    }
}

/// One image for several platforms: an image index blob that lists each platform's
/// manifest, named in `index.json` as a single image is. Its digest is the index blob's:
/// what a registry shows for a multi-platform tag, and what a pinned reference names (a
/// runtime then pulls the manifest of its own platform).
#[derive(Clone, Debug)]
pub struct MultiPlatformImage {
    pub reference: String,
    /// One per platform, in the index's order.
    pub images: Vec<Image>,
    /// The image index blob.
    pub index: Blob,
    /// `index.json`: the layout's entry point, naming [`index`](MultiPlatformImage::index).
    pub layout_index: Vec<u8>,
}

impl MultiPlatformImage {
    /// Ties `images` (see [`Image::build_for`]), one per platform, together as `reference`.
    /// Their own names and `index.json`s are not used.
    pub fn build(reference: &str, images: Vec<Image>) -> anyhow::Result<MultiPlatformImage> {
        ensure!(!images.is_empty(), "an image index needs at least one image");
        let mut platforms = std::collections::BTreeSet::new();
        for image in &images {
            ensure!(
                platforms.insert(image.platform),
                "two images for {}: a runtime could not choose",
                image.platform
            );
        }
        let manifests: Vec<serde_json::Value> = images
            .iter()
            .map(|image| {
                let mut descriptor = image.manifest.descriptor();
                descriptor["platform"] = image.platform.to_json();
                descriptor
            })
            .collect();
        let index = Blob::new(
            MEDIA_TYPE_INDEX,
            to_json(&json!({
                "schemaVersion": 2,
                "mediaType": MEDIA_TYPE_INDEX,
                "manifests": manifests,
            }))?,
        );
        let mut index_descriptor = index.descriptor();
        index_descriptor["annotations"] = name_annotations(reference);
        let layout_index = to_json(&json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_TYPE_INDEX,
            "manifests": [index_descriptor],
        }))?;
        Ok(MultiPlatformImage {
            reference: reference.to_owned(),
            images,
            index,
            layout_index,
        })
    }

    /// The image's digest: its index blob's.
    pub fn digest(&self) -> String {
        self.index.digest()
    }

    /// The image for `platform`, if the index has one.
    pub fn image_for(&self, platform: Platform) -> Option<&Image> {
        self.images.iter().find(|image| image.platform == platform)
    }

    /// The OCI image layout as a tar, as [`Image::archive`]: each blob once, so a layer or a
    /// config that two platforms share is stored once.
    pub fn archive(&self) -> anyhow::Result<Vec<u8>> {
        let blobs = self
            .images
            .iter()
            .flat_map(|image| [&image.layer, &image.config, &image.manifest])
            .chain([&self.index]);
        layout_archive(blobs, &self.layout_index)
    }

    /// Writes the archive to `out`, as [`Image::write`].
    pub fn write(&self, out: &Path) -> anyhow::Result<()> {
        write_atomically(out, &self.archive()?)
    }
}

/// What names an image in `index.json`: containerd's name and the layout's tag.
fn name_annotations(reference: &str) -> serde_json::Value {
    json!({
        ANNOTATION_CONTAINERD_NAME: reference,
        ANNOTATION_REF_NAME: tag_of(reference),
    })
}

/// An OCI image layout as a tar: `blobs/sha256/…` once each, in digest order, then
/// `index.json` and `oci-layout`.
fn layout_archive<'a>(
    blobs: impl IntoIterator<Item = &'a Blob>,
    index_json: &[u8],
) -> anyhow::Result<Vec<u8>> {
    let blobs: BTreeMap<String, &Blob> = blobs.into_iter().map(|blob| (blob.digest(), blob)).collect();
    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |path: &str, kind: tar::EntryType, data: &[u8]| -> anyhow::Result<()> {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(kind);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(MTIME);
        header.set_mode(if kind.is_dir() { 0o755 } else { 0o644 });
        header.set_size(data.len() as u64);
        builder.append_data(&mut header, path, data)?;
        Ok(())
    };
    add("blobs/", tar::EntryType::Directory, &[])?;
    add("blobs/sha256/", tar::EntryType::Directory, &[])?;
    for (digest, blob) in blobs {
        let hex = digest.trim_start_matches("sha256:");
        add(
            &format!("blobs/sha256/{hex}"),
            tar::EntryType::Regular,
            &blob.data,
        )?;
    }
    add("index.json", tar::EntryType::Regular, index_json)?;
    add("oci-layout", tar::EntryType::Regular, OCI_LAYOUT)?;
    Ok(builder.into_inner()?)
}

/// Writes `data` to `out` through a temporary file beside it, so a reader never sees half
/// of it.
fn write_atomically(out: &Path, data: &[u8]) -> anyhow::Result<()> {
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut tmp = out.as_os_str().to_owned();
    tmp.push(".part");
    fs::write(&tmp, data).with_context(|| format!("cannot write {}", Path::new(&tmp).display()))?;
    fs::rename(&tmp, out).with_context(|| format!("cannot write {}", out.display()))
}

/// `sha256:<lowercase hex>`.
pub fn sha256_digest(data: &[u8]) -> String {
    let hash = Sha256::digest(data);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for byte in hash.iter() {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// gzip with no timestamp, no file name and a fixed OS byte: the same bytes each time.
fn gzip(data: &[u8], compression: Compression) -> anyhow::Result<Vec<u8>> {
    let mut encoder = GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), compression);
    encoder.write_all(data)?;
    Ok(encoder.finish()?)
}

fn to_json(value: &serde_json::Value) -> anyhow::Result<Vec<u8>> {
    Ok(serde_json::to_vec(value)?)
}

#[cfg(test)]
mod tests;
