//! Checking a checkpoint before anything of it is written: its names, which become
//! paths, and its data paths, which become each volume's file tree.

use std::collections::{BTreeMap, BTreeSet};

use ckpt_core::{Checkpoint, CheckpointMeta, DataFile};

use super::volume::Node;
use crate::error::{Error, Result};
use crate::names::{check_pod_id, check_subdomain, data_path_components};

/// Checks everything that becomes a path and builds each directory's file tree.
pub(crate) fn validate(checkpoint: &Checkpoint) -> Result<Vec<Node<'_>>> {
    let id = &checkpoint.parent;
    let invalid = |reason: String| Error::InvalidCheckpoint {
        id: id.clone(),
        reason,
    };
    check_pod_id(id)?;
    match CheckpointMeta::from_manifest(&checkpoint.manifest) {
        Some(meta) if &meta.parent == id => {}
        Some(meta) => {
            return Err(invalid(format!(
                "the manifest is a checkpoint of {}",
                meta.parent
            )));
        }
        None => return Err(invalid("the manifest has no checkpoint-of annotation".into())),
    }
    let mut seen = BTreeSet::new();
    let mut trees = Vec::with_capacity(checkpoint.dirs.len());
    for dir in &checkpoint.dirs {
        let d = &dir.dir;
        if *d.namespace != *id.namespace || *d.pod != *id.name {
            return Err(invalid(format!(
                "data directory {} belongs to {}/{}",
                d.name, d.namespace, d.pod
            )));
        }
        check_subdomain("data directory name", &d.name)?;
        if !seen.insert((d.kind, d.name.as_str())) {
            return Err(invalid(format!("data directory {} appears twice", d.name)));
        }
        let mut tree = Node::Dir(BTreeMap::new());
        for file in &dir.files {
            insert(&mut tree, &data_path_components(&file.path)?, file)
                .map_err(|()| invalid(format!("data path {:?} clashes with another", file.path)))?;
        }
        trees.push(tree);
    }
    Ok(trees)
}

/// Inserts a file into a tree; `Err` if the path is taken, or one of its parents is a file.
fn insert<'a>(tree: &mut Node<'a>, components: &[&'a str], file: &'a DataFile) -> Result<(), ()> {
    let Node::Dir(children) = tree else { return Err(()) };
    match components {
        [] => Err(()),
        [last] => match children.insert(last, Node::File(file)) {
            None => Ok(()),
            Some(_) => Err(()),
        },
        [first, rest @ ..] => insert(
            children
                .entry(first)
                .or_insert_with(|| Node::Dir(BTreeMap::new())),
            rest,
            file,
        ),
    }
}

#[cfg(test)]
mod tests {
    use ckpt_core::DataKind::Secret;

    use super::*;
    use crate::testutil::{checkpoint, id, store, tree};

    #[test]
    fn invalid_checkpoints_are_refused_before_anything_is_written() {
        let (_tmp, store) = store();
        let layout = store.layout().clone();
        let check = |cp: Checkpoint, expected: &str| {
            let error = store.write_inactive(&cp).expect_err(expected).to_string();
            assert!(error.contains(expected), "{error:?} should contain {expected:?}");
            assert!(
                tree(layout.checkpoint_dir()).is_empty(),
                "{expected}: nothing written"
            );
        };
        let ok = id("ns", "p");
        let with =
            |version: &str, dirs: &[crate::testutil::DirSpec<'_>]| checkpoint(&layout, &ok, version, dirs);
        check(
            checkpoint(&layout, &id("Bad", "p"), "1", &[]),
            "invalid namespace \"Bad\"",
        );
        check(
            checkpoint(&layout, &id("ns", "../x"), "1", &[]),
            "invalid pod name \"../x\"",
        );
        check(
            checkpoint(&layout, &id("ns", ""), "1", &[]),
            "invalid pod name \"\"",
        );
        check(
            with("1", &[(Secret, "../../etc", &[])]),
            "invalid data directory name",
        );
        check(
            with("1", &[(Secret, "s", &[("../../x", "", 0o600)])]),
            "invalid data file path",
        );
        check(
            with("1", &[(Secret, "s", &[("/etc/passwd", "", 0o600)])]),
            "absolute",
        );
        check(
            with("1", &[(Secret, "s", &[("a//b", "", 0o600)])]),
            "empty or '.' component",
        );
        check(
            with("1", &[(Secret, "s", &[("a", "", 0o600), ("a/b", "", 0o600)])]),
            "clashes",
        );
        check(
            with("1", &[(Secret, "s", &[("a/b", "", 0o600), ("a", "", 0o600)])]),
            "clashes",
        );
        check(
            with("1", &[(Secret, "s", &[("a", "", 0o600), ("a", "", 0o600)])]),
            "clashes",
        );
        check(
            with("1", &[(Secret, "s", &[]), (Secret, "s", &[])]),
            "appears twice",
        );
        let mut other_pod = with("1", &[(Secret, "s", &[])]);
        other_pod.dirs[0].dir.pod = "q".into();
        check(other_pod, "belongs to ns/q");
        let mut not_a_checkpoint = with("1", &[]);
        not_a_checkpoint.manifest.metadata.annotations = None;
        check(not_a_checkpoint, "no checkpoint-of annotation");
        let mut mismatch = with("1", &[]);
        mismatch.manifest.metadata.name = Some("other".into());
        check(mismatch, "the manifest is a checkpoint of ns/other");
    }
}
