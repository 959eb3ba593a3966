//! One file of a manifest directory, read and classified: missing, not a checkpoint (and
//! why), or a checkpoint manifest; and what sits at one of a pod's two file names.

use ckpt_core::{CheckpointMeta, PodId};
use k8s_openapi::api::core::v1::Pod;

use crate::error::Result;
use crate::fsops::{Contents, Dir, ReadOutcome};

/// Largest manifest we read. etcd refuses objects above 1.5 MiB, so anything larger
/// cannot be a checkpoint of a real pod.
pub(crate) const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// What sits at one of the two names a checkpoint file can have.
pub(crate) enum Slot {
    Empty,
    /// A checkpoint of the pod asked about.
    Ours(Box<ParsedManifest>),
    /// Anything else: never touched.
    Foreign,
}

/// What one file in a manifest directory holds, read and parsed once for both
/// `scan::load` (reading every file back) and [`slot`] (looking at one pod's names).
pub(crate) enum ManifestFile {
    Missing,
    /// Not a checkpoint, and why: not a regular file, too large, not a JSON Pod, or a
    /// pod without the checkpoint-of annotation.
    NotCheckpoint(String),
    /// A checkpoint manifest.
    Checkpoint(Box<ParsedManifest>),
}

pub(crate) struct ParsedManifest {
    pub(crate) contents: Contents,
    pub(crate) pod: Pod,
    pub(crate) meta: CheckpointMeta,
}

/// Reads and classifies the file at `name` (a read error is the caller's to handle).
pub(crate) fn read_manifest(dir: &Dir, name: &str) -> Result<ManifestFile> {
    let contents = match dir.read_file(name, MAX_MANIFEST_BYTES)? {
        ReadOutcome::Read(contents) => contents,
        ReadOutcome::Missing => return Ok(ManifestFile::Missing),
        ReadOutcome::NotRegular(kind) => {
            return Ok(ManifestFile::NotCheckpoint(format!(
                "a {kind}, not a regular file"
            )));
        }
        ReadOutcome::TooLarge(len) => {
            return Ok(ManifestFile::NotCheckpoint(format!(
                "{len} bytes, too large for a checkpoint"
            )));
        }
    };
    let pod: Pod = match serde_json::from_slice(&contents.bytes) {
        Ok(pod) => pod,
        Err(e) => return Ok(ManifestFile::NotCheckpoint(format!("not a JSON Pod: {e}"))),
    };
    let Some(meta) = CheckpointMeta::from_manifest(&pod) else {
        return Ok(ManifestFile::NotCheckpoint(
            "not a checkpoint (no checkpoint-of annotation)".into(),
        ));
    };
    Ok(ManifestFile::Checkpoint(Box::new(ParsedManifest {
        contents,
        pod,
        meta,
    })))
}

/// What is at `name`: nothing, a checkpoint of `id` (regular file, parses, right id),
/// or something foreign.
pub(crate) fn slot(dir: &Dir, name: &str, id: &PodId) -> Result<Slot> {
    Ok(match read_manifest(dir, name)? {
        ManifestFile::Missing => Slot::Empty,
        ManifestFile::Checkpoint(parsed) if &parsed.meta.parent == id => Slot::Ours(parsed),
        ManifestFile::Checkpoint(_) | ManifestFile::NotCheckpoint(_) => Slot::Foreign,
    })
}
