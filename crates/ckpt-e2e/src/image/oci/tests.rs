use std::collections::BTreeMap;
use std::io::Read;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::*;

/// The archive's files by path (directories as empty entries with a trailing `/`).
fn files(archive: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut reader = tar::Archive::new(archive);
    for entry in reader.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        assert!(out.insert(path.clone(), data).is_none(), "{path} twice");
    }
    out
}

/// `sha256:…` of `data`, computed here rather than by the code under test.
fn digest_of(data: &[u8]) -> String {
    let hex: String = Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn json(data: &[u8]) -> Value {
    serde_json::from_slice(data).unwrap()
}

/// The blob a descriptor points to, checked against the descriptor's digest and size.
fn blob<'a>(files: &'a BTreeMap<String, Vec<u8>>, descriptor: &Value) -> &'a [u8] {
    let digest = descriptor["digest"].as_str().unwrap();
    let hex = digest.strip_prefix("sha256:").unwrap();
    let data = files
        .get(&format!("blobs/sha256/{hex}"))
        .unwrap_or_else(|| panic!("no blob {digest}"));
    assert_eq!(digest_of(data), digest, "blob content matches its name");
    assert_eq!(
        descriptor["size"].as_u64(),
        Some(data.len() as u64),
        "size of {digest}"
    );
    data
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data).read_to_end(&mut out).unwrap();
    out
}

fn sample() -> (ImageConfig, Layer) {
    let mut config = ImageConfig::new("example.test/team/app:1.2.3", &["/app"]);
    config.cmd = vec!["serve".to_owned()];
    config
        .labels
        .insert("org.opencontainers.image.title".to_owned(), "app".to_owned());
    let mut layer = Layer::new();
    layer.file("/app", 0o755, b"#!binary".to_vec()).unwrap();
    layer
        .file("/etc/passwd", 0o644, b"root:x:0:0:root:/:/bin/sh\n".to_vec())
        .unwrap();
    layer.dir("/tmp", 0o1777).unwrap();
    layer.symlink("/bin/sh", "busybox").unwrap();
    (config, layer)
}

#[test]
fn index_manifest_and_config_point_at_the_blobs_with_their_digests_and_sizes() {
    let (config, layer) = sample();
    let image = Image::build(&config, &layer).unwrap();
    let files = files(&image.archive().unwrap());

    assert_eq!(
        json(&files["oci-layout"]),
        serde_json::json!({"imageLayoutVersion": "1.0.0"})
    );
    let index = json(&files["index.json"]);
    assert_eq!(index["schemaVersion"], 2);
    assert_eq!(index["mediaType"], MEDIA_TYPE_INDEX);
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1);
    let descriptor = &manifests[0];
    assert_eq!(descriptor["mediaType"], MEDIA_TYPE_MANIFEST);
    assert_eq!(descriptor["platform"]["architecture"], "amd64");
    assert_eq!(descriptor["platform"]["os"], "linux");
    assert_eq!(
        descriptor["annotations"][ANNOTATION_CONTAINERD_NAME],
        "example.test/team/app:1.2.3"
    );
    assert_eq!(descriptor["annotations"][ANNOTATION_REF_NAME], "1.2.3");
    let manifest_bytes = blob(&files, descriptor);
    assert_eq!(digest_of(manifest_bytes), image.digest());

    let manifest = json(manifest_bytes);
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(manifest["mediaType"], MEDIA_TYPE_MANIFEST);
    assert_eq!(manifest["config"]["mediaType"], MEDIA_TYPE_CONFIG);
    let config_json = json(blob(&files, &manifest["config"]));
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(layers[0]["mediaType"], MEDIA_TYPE_LAYER_GZIP);
    let layer_tar = gunzip(blob(&files, &layers[0]));

    assert_eq!(config_json["architecture"], "amd64");
    assert_eq!(config_json["os"], "linux");
    assert_eq!(config_json["rootfs"]["type"], "layers");
    assert_eq!(
        config_json["rootfs"]["diff_ids"],
        serde_json::json!([digest_of(&layer_tar)]),
        "diff_ids hash the uncompressed layer"
    );
    assert_eq!(image.diff_id, digest_of(&layer_tar));
    assert_eq!(config_json["config"]["Entrypoint"], serde_json::json!(["/app"]));
    assert_eq!(config_json["config"]["Cmd"], serde_json::json!(["serve"]));
    assert_eq!(config_json["config"]["Env"], serde_json::json!(["PATH=/bin"]));
    assert_eq!(
        config_json["config"]["Labels"]["org.opencontainers.image.title"],
        "app"
    );
    // Nothing else: three blobs, two directories, the index and the layout file.
    assert_eq!(files.len(), 7, "{:?}", files.keys().collect::<Vec<_>>());
}

#[test]
fn layer_entries_are_sorted_owned_by_root_undated_and_keep_modes_and_links() {
    let (_, layer) = sample();
    let tar = layer.tar().unwrap();
    let mut reader = tar::Archive::new(tar.as_slice());
    let mut seen = Vec::new();
    for entry in reader.entries().unwrap() {
        let entry = entry.unwrap();
        let header = entry.header();
        assert_eq!(header.uid().unwrap(), 0);
        assert_eq!(header.gid().unwrap(), 0);
        assert_eq!(header.mtime().unwrap(), MTIME);
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let link = entry
            .link_name()
            .unwrap()
            .map(|l| l.to_string_lossy().into_owned());
        seen.push((path, header.entry_type(), header.mode().unwrap(), link));
    }
    let dir = tar::EntryType::Directory;
    let file = tar::EntryType::Regular;
    let expected = vec![
        ("app".to_owned(), file, 0o755, None),
        ("bin/".to_owned(), dir, 0o755, None),
        (
            "bin/sh".to_owned(),
            tar::EntryType::Symlink,
            0o777,
            Some("busybox".to_owned()),
        ),
        ("etc/".to_owned(), dir, 0o755, None),
        ("etc/passwd".to_owned(), file, 0o644, None),
        ("tmp/".to_owned(), dir, 0o1777, None),
    ];
    assert_eq!(seen, expected);
}

#[test]
fn the_same_inputs_give_a_byte_identical_archive_and_other_inputs_another_digest() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (config, layer) = sample();
    let first = dir.join("first.tar");
    let second = dir.join("second.tar");
    Image::build(&config, &layer).unwrap().write(&first).unwrap();
    // Built again from fresh values, in a different insertion order.
    let mut again = Layer::new();
    again.symlink("bin/sh", "busybox").unwrap();
    again.dir("tmp", 0o1777).unwrap();
    again
        .file("etc/passwd", 0o644, b"root:x:0:0:root:/:/bin/sh\n".to_vec())
        .unwrap();
    again.file("app", 0o755, b"#!binary".to_vec()).unwrap();
    Image::build(&config, &again).unwrap().write(&second).unwrap();
    let first = fs::read(first).unwrap();
    assert!(first == fs::read(second).unwrap(), "two builds differ");

    let gz = Image::build(&config, &layer).unwrap().layer.data;
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip");
    assert_eq!(&gz[4..8], &[0, 0, 0, 0], "no timestamp in the gzip header");
    assert_eq!(gz[3] & 0x08, 0, "no file name in the gzip header");

    let mut changed = layer.clone();
    changed.file("app", 0o755, b"#!binary 2".to_vec()).unwrap();
    let other = Image::build(&config, &changed).unwrap();
    assert_ne!(other.digest(), Image::build(&config, &layer).unwrap().digest());
    let mut renamed = config.clone();
    renamed.reference = "example.test/team/app:1.2.4".to_owned();
    let retagged = Image::build(&renamed, &layer).unwrap();
    assert_eq!(
        retagged.digest(),
        Image::build(&config, &layer).unwrap().digest(),
        "the name is not in the manifest"
    );
    assert!(retagged.archive().unwrap() != first, "but it is in the index");
}

#[test]
fn paths_are_relative_and_parents_are_added() {
    let mut layer = Layer::new();
    layer.file("/usr/local/bin/tool", 0o755, Vec::new()).unwrap();
    let paths: Vec<&str> = layer.entries().map(|(path, _)| path).collect();
    assert_eq!(paths, ["usr", "usr/local", "usr/local/bin", "usr/local/bin/tool"]);
    for bad in ["", "/", "a/../b", "a//b", "./a"] {
        assert!(layer.file(bad, 0o644, Vec::new()).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn the_tag_is_what_follows_the_last_colon_of_the_last_path_part() {
    let tag = |reference: &str| ImageConfig::new(reference, &[]).tag().to_owned();
    assert_eq!(tag("k8s.gcr.io/pause:3.2"), "3.2");
    assert_eq!(tag("localhost:5000/app"), "latest");
    assert_eq!(tag("localhost:5000/app:v1"), "v1");
    assert_eq!(tag("busybox"), "latest");
}

/// A platform and the bytes of its `/app`.
type Program = (Platform, &'static [u8]);

/// An image of `sample()`'s config for `platform` whose `/app` holds `program`.
fn image_for(platform: Platform, program: &[u8]) -> Image {
    let (config, mut layer) = sample();
    layer.file("/app", 0o755, program.to_vec()).unwrap();
    Image::build_for(&config, &layer, Compression::fast(), platform).unwrap()
}

/// The per-platform manifests of a multi-platform archive, followed from `index.json`
/// through the index blob, each checked against its descriptor: `(platform descriptor,
/// manifest, config)`.
fn platform_manifests(files: &BTreeMap<String, Vec<u8>>) -> Vec<(Value, Value, Value)> {
    let layout_index = json(&files["index.json"]);
    assert_eq!(layout_index["mediaType"], MEDIA_TYPE_INDEX);
    let named = layout_index["manifests"].as_array().unwrap();
    assert_eq!(named.len(), 1, "index.json names one image");
    assert_eq!(
        named[0]["mediaType"], MEDIA_TYPE_INDEX,
        "and it is an image index"
    );
    let index = json(blob(files, &named[0]));
    assert_eq!(index["schemaVersion"], 2);
    assert_eq!(index["mediaType"], MEDIA_TYPE_INDEX);
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|descriptor| {
            assert_eq!(descriptor["mediaType"], MEDIA_TYPE_MANIFEST);
            assert!(descriptor.get("annotations").is_none(), "only the index is named");
            let manifest = json(blob(files, descriptor));
            let config = json(blob(files, &manifest["config"]));
            for layer in manifest["layers"].as_array().unwrap() {
                let tar = gunzip(blob(files, layer));
                assert_eq!(config["rootfs"]["diff_ids"], serde_json::json!([digest_of(&tar)]));
            }
            (descriptor["platform"].clone(), manifest, config)
        })
        .collect()
}

#[test]
fn an_image_index_lists_each_platforms_manifest_with_its_platform_and_shares_identical_blobs() {
    let amd64 = Platform::LINUX_AMD64;
    let arm64 = Platform::LINUX_ARM64;
    // (platform and program of each image, distinct blobs in the archive: each image's
    // layer, config and manifest, and the index; identical layers stored once).
    let cases: &[(&[Program], usize)] = &[
        (&[(amd64, b"x86 code"), (arm64, b"arm code")], 7),
        // One program for both: one layer; the configs still differ by architecture.
        (&[(amd64, b"script"), (arm64, b"script")], 6),
        (&[(arm64, b"arm code"), (amd64, b"x86 code")], 7),
        (&[(amd64, b"x86 code")], 4),
    ];
    for (images, blobs) in cases {
        let built: Vec<Image> = images
            .iter()
            .map(|(platform, program)| image_for(*platform, program))
            .collect();
        let multi = MultiPlatformImage::build("example.test/team/app:1.2.3", built.clone()).unwrap();
        let files = files(&multi.archive().unwrap());
        let stored = files
            .keys()
            .filter(|path| path.starts_with("blobs/sha256/") && !path.ends_with('/'));
        assert_eq!(stored.count(), *blobs, "{images:?}");
        assert_eq!(files.len(), blobs + 4, "two directories, index.json, oci-layout");
        assert_eq!(
            json(&files["oci-layout"]),
            serde_json::json!({"imageLayoutVersion": "1.0.0"})
        );

        let listed = platform_manifests(&files);
        assert_eq!(listed.len(), images.len());
        for (((platform, _), (descriptor, manifest, config)), image) in images.iter().zip(&listed).zip(&built)
        {
            assert_eq!(
                *descriptor,
                serde_json::json!({"architecture": platform.architecture, "os": platform.os}),
                "in the given order"
            );
            assert_eq!(config["architecture"], platform.architecture);
            assert_eq!(config["os"], platform.os);
            assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/app"]));
            assert_eq!(*manifest, json(&image.manifest.data), "the image's own manifest");
            assert_eq!(multi.image_for(*platform).unwrap().digest(), image.digest());
        }

        let named = &json(&files["index.json"])["manifests"][0];
        assert_eq!(
            named["digest"],
            multi.digest(),
            "the image's digest is the index's"
        );
        assert_eq!(
            named["annotations"][ANNOTATION_CONTAINERD_NAME],
            "example.test/team/app:1.2.3"
        );
        assert_eq!(named["annotations"][ANNOTATION_REF_NAME], "1.2.3");
    }
}

#[test]
fn an_image_index_refuses_no_image_and_two_for_one_platform() {
    let reference = "example.test/app:1";
    let error = MultiPlatformImage::build(reference, Vec::new()).unwrap_err();
    assert!(error.to_string().contains("at least one image"), "{error}");
    let twice = vec![
        image_for(Platform::LINUX_ARM64, b"a"),
        image_for(Platform::LINUX_AMD64, b"b"),
        image_for(Platform::LINUX_ARM64, b"c"),
    ];
    let error = MultiPlatformImage::build(reference, twice).unwrap_err();
    assert!(
        error.to_string().contains("two images for linux/arm64"),
        "{error}"
    );
}

#[test]
fn a_single_platform_image_is_the_amd64_one_and_its_manifest_is_the_indexs_amd64_entry() {
    let (config, layer) = sample();
    let single = Image::build(&config, &layer).unwrap();
    assert_eq!(single.platform, Platform::LINUX_AMD64);
    let amd64 = Image::build_for(&config, &layer, Compression::best(), Platform::LINUX_AMD64).unwrap();
    assert!(
        single.archive().unwrap() == amd64.archive().unwrap(),
        "build is build_for linux/amd64"
    );
    // So the digest `cargo xtask image` prints for a binary is the amd64 entry of a
    // release's index built from the same binary.
    let arm64 = Image::build_for(&config, &layer, Compression::best(), Platform::LINUX_ARM64).unwrap();
    let multi = MultiPlatformImage::build(&config.reference, vec![amd64, arm64.clone()]).unwrap();
    assert_eq!(
        multi.image_for(Platform::LINUX_AMD64).unwrap().digest(),
        single.digest()
    );
    assert_ne!(
        arm64.digest(),
        single.digest(),
        "the config names the architecture"
    );
    assert_eq!(arm64.layer.digest(), single.layer.digest(), "the same files");
    assert_eq!(
        json(&arm64.index)["manifests"][0]["platform"],
        serde_json::json!({"architecture": "arm64", "os": "linux"}),
        "an arm64 image alone says so in its index.json"
    );
}

#[test]
fn a_multi_platform_archive_is_deterministic_and_written_whole() {
    let build = || {
        MultiPlatformImage::build(
            "example.test/app:1",
            vec![
                image_for(Platform::LINUX_AMD64, b"x86"),
                image_for(Platform::LINUX_ARM64, b"arm"),
            ],
        )
        .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("release/app.oci.tar");
    build().write(&out).unwrap();
    assert!(
        fs::read(&out).unwrap() == build().archive().unwrap(),
        "two builds differ"
    );
    assert_eq!(
        fs::read_dir(out.parent().unwrap()).unwrap().count(),
        1,
        "no leftover"
    );
    let renamed = MultiPlatformImage::build("example.test/app:2", build().images).unwrap();
    assert_eq!(
        renamed.digest(),
        build().digest(),
        "the name is not in the index blob"
    );
}
