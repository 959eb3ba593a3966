//! The Helm chart (`charts/pod-checkpointer`): `helm template` of it as objects, compared
//! with render's as data (comments and field order aside), and its package for a release
//! (what `helm package` writes: the chart's directory as a gzipped tar, here with the image
//! pinned in its values). helm itself is built from its Go module into the e2e cache
//! ([`crate::e2e_env::modules::helm`]).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};
use ckpt_render::{KubernetesVersion, Manifest};
use serde_json::Value;

use crate::image::oci::{Compression, Layer};

/// The chart's name, its directory's under `charts/`.
pub const NAME: &str = "pod-checkpointer";

/// The chart's directory in the workspace.
pub fn chart_dir() -> PathBuf {
    crate::project_root().join("charts").join(NAME)
}

/// Each object by `Kind namespace/name`.
pub type Objects = BTreeMap<String, Value>;

fn key(object: &Value) -> String {
    format!(
        "{} {}/{}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["namespace"].as_str().unwrap_or(""),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// render's objects.
pub fn objects_of(manifests: &[Manifest]) -> anyhow::Result<Objects> {
    let mut objects = Objects::new();
    for manifest in manifests {
        let value = serde_json::to_value(manifest)?;
        objects.insert(key(&value), value);
    }
    Ok(objects)
}

/// The objects of multi-document YAML (render's or helm's); documents of comments alone
/// are skipped, an object written twice is an error.
pub fn objects_of_yaml(yaml: &str) -> anyhow::Result<Objects> {
    let mut objects = Objects::new();
    let documents: Vec<Value> = serde_saphyr::from_multiple(yaml).context("not valid YAML")?;
    for value in documents.into_iter().filter(|v| !v.is_null()) {
        let key = key(&value);
        ensure!(
            objects.insert(key.clone(), value).is_none(),
            "{key} is written twice"
        );
    }
    Ok(objects)
}

/// `helm template` of `chart` (a directory or a package) into `namespace`, for an API
/// server of `version`, with `values`: its objects, or helm's refusal (its first line).
pub fn template(
    helm: &Path,
    chart: &Path,
    namespace: &str,
    version: KubernetesVersion,
    values: &Value,
) -> anyhow::Result<Objects> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("values.json");
    std::fs::write(&file, serde_json::to_vec_pretty(values)?)?;
    let output = Command::new(helm)
        .args(["template", NAME])
        .arg(chart)
        .args(["--namespace", namespace])
        .arg(format!("--kube-version=v{version}.0"))
        .arg("--values")
        .arg(&file)
        .output()
        .with_context(|| format!("cannot run {}", helm.display()))?;
    if !output.status.success() {
        // Its first line is the error; the rest is advice about --debug.
        let stderr = String::from_utf8_lossy(&output.stderr);
        bail!("{}", stderr.lines().next().unwrap_or_default());
    }
    objects_of_yaml(&String::from_utf8(output.stdout)?).context("helm template's output")
}

/// Where render's objects and the chart's differ, one line per field; empty if nowhere.
pub fn differences(rendered: &Objects, templated: &Objects) -> Vec<String> {
    let mut out = Vec::new();
    for (key, object) in rendered {
        match templated.get(key) {
            None => out.push(format!("only render writes {key}")),
            Some(other) => fields_differing(key, object, other, &mut out),
        }
    }
    for key in templated.keys().filter(|k| !rendered.contains_key(*k)) {
        out.push(format!("only the chart writes {key}"));
    }
    out
}

/// Where two values differ, by path: `render` is render's, `chart` the chart's.
fn fields_differing(path: &str, render: &Value, chart: &Value, out: &mut Vec<String>) {
    match (render, chart) {
        (Value::Object(a), Value::Object(b)) => {
            for key in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
                let (x, y) = (
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                );
                fields_differing(&format!("{path}.{key}"), x, y, out);
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (index, (x, y)) in a.iter().zip(b).enumerate() {
                fields_differing(&format!("{path}[{index}]"), x, y, out);
            }
        }
        (a, b) if a != b => out.push(format!("{path}: render {a}, chart {b}")),
        _ => {}
    }
}

/// The chart's `version` (its `Chart.yaml`), which its package is named by.
pub fn version(chart: &Path) -> anyhow::Result<String> {
    let file = chart.join("Chart.yaml");
    let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
    let chart: Value =
        serde_saphyr::from_str(&text).with_context(|| format!("{} is not YAML", file.display()))?;
    chart["version"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("{} has no version", file.display()))
}

/// The chart packaged as `helm package` would (`NAME-VERSION.tgz` in `out_dir`: its files
/// under `NAME/`), with `image: IMAGE` as its default image instead of the appVersion's tag.
pub fn package(chart: &Path, out_dir: &Path, image: &str) -> anyhow::Result<PathBuf> {
    let mut layer = Layer::new();
    let mut files = Vec::new();
    collect_files(chart, chart, &mut files)?;
    for relative in &files {
        let mut data = std::fs::read(chart.join(relative))?;
        if relative == Path::new("values.yaml") {
            data = pin_image(&String::from_utf8(data)?, image)?.into_bytes();
        }
        let path = Path::new(NAME).join(relative);
        layer.file(&path.to_string_lossy(), 0o644, data)?;
    }
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), Compression::best());
    encoder.write_all(&layer.tar()?)?;
    let file = out_dir.join(format!("{NAME}-{}.tgz", version(chart)?));
    std::fs::write(&file, encoder.finish()?).with_context(|| format!("cannot write {}", file.display()))?;
    Ok(file)
}

/// `values.yaml` with its one `image: ""` line naming `image`.
fn pin_image(values: &str, image: &str) -> anyhow::Result<String> {
    const DEFAULT: &str = "image: \"\"";
    ensure!(
        values.lines().filter(|line| *line == DEFAULT).count() == 1,
        "the chart's values.yaml has no single `{DEFAULT}` line to pin the image in"
    );
    let pinned = format!("image: {}", Value::from(image));
    Ok(values
        .lines()
        .map(|line| if line == DEFAULT { pinned.as_str() } else { line })
        .map(|line| format!("{line}\n"))
        .collect())
}

/// The files under `dir`, relative to `root`, sorted.
fn collect_files(root: &Path, dir: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect_files(root, &path, files)?;
        } else {
            files.push(path.strip_prefix(root)?.to_path_buf());
        }
    }
    Ok(())
}
