//! The state journal: what the planner must remember across restarts (when a parent
//! was first seen absent, per-checkpoint metadata, …).
//!
//! The store does not know the schema (ckpt-core's planner owns it); it keeps any
//! serde value in a small versioned envelope, written atomically like every other file:
//!
//! ```json
//! {"version":1,"state":{…}}
//! ```

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::error::{Error, Result};
use crate::fsops::ReadOutcome;
use crate::layout::Layout;
use crate::store::Store;
use crate::store::scan::quarantine_file;

/// The envelope format version this crate writes and reads.
pub const JOURNAL_FORMAT_VERSION: u32 = 1;
/// Largest journal we read.
const MAX_JOURNAL_BYTES: u64 = 64 << 20;
/// The journal may hold parent UIDs and owners: root only.
const JOURNAL_MODE: u32 = 0o600;

/// The journal file's envelope around the caller's state.
#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    version: u32,
    state: T,
}

/// Only the version, read first so that a newer format is reported as such.
#[derive(Deserialize)]
struct VersionOnly {
    version: u32,
}

impl Store {
    /// Reads the state journal; `None` if there is none yet.
    ///
    /// A journal that cannot be used (not JSON, another format version, a state that
    /// does not deserialize into `T`, a symlink) is moved to the quarantine dir with a
    /// warning and reads as `None`: the planner starts its clocks afresh, which delays
    /// garbage collection rather than hastening it.
    pub fn read_journal<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        let Some(checkpoint_dir) = crate::fsops::Dir::open_trusted(self.layout().checkpoint_dir())? else {
            return Ok(None);
        };
        // Earlier versions kept it directly in the checkpoint dir: read from there until
        // the first write moves it.
        let (source_dir, name) = match self.existing_agent_dir()? {
            Some(agent_dir)
                if !matches!(
                    agent_dir.read_file(Layout::JOURNAL_FILE_NAME, 0)?,
                    ReadOutcome::Missing
                ) =>
            {
                (agent_dir, Layout::JOURNAL_FILE_NAME)
            }
            _ => match crate::fsops::Dir::open_trusted(self.layout().checkpoint_dir())? {
                Some(dir) => (dir, Layout::LEGACY_FILE_NAMES[0]),
                None => return Ok(None),
            },
        };
        let unusable = |reason: String| {
            if self.is_writable() {
                quarantine_file(&checkpoint_dir, &source_dir, name.as_ref(), &reason);
            } else {
                warn!(path = %self.layout().journal_path().display(), reason, "ignoring an unusable state journal");
            }
            Ok(None)
        };
        let contents = match source_dir.read_file(name, MAX_JOURNAL_BYTES)? {
            ReadOutcome::Missing => return Ok(None),
            ReadOutcome::NotRegular(kind) => return unusable(format!("a {kind}, not a regular file")),
            ReadOutcome::TooLarge(len) => return unusable(format!("{len} bytes, too large")),
            ReadOutcome::Read(contents) => contents,
        };
        match serde_json::from_slice::<VersionOnly>(&contents.bytes) {
            Ok(VersionOnly {
                version: JOURNAL_FORMAT_VERSION,
            }) => {}
            Ok(VersionOnly { version }) => {
                return unusable(format!(
                    "format version {version}, this agent reads {JOURNAL_FORMAT_VERSION}"
                ));
            }
            Err(e) => return unusable(format!("not a state journal: {e}")),
        }
        match serde_json::from_slice::<Envelope<T>>(&contents.bytes) {
            Ok(envelope) => Ok(Some(envelope.state)),
            Err(e) => unusable(format!("the state does not match this agent's schema: {e}")),
        }
    }

    /// Writes the state journal atomically (mode 0600); nothing is written when it is
    /// unchanged. Returns whether it wrote.
    pub fn write_journal<T: Serialize>(&self, state: &T) -> Result<bool> {
        self.require_writable()?;
        let path = self.layout().journal_path();
        let envelope = Envelope {
            version: JOURNAL_FORMAT_VERSION,
            state,
        };
        let mut bytes = serde_json::to_vec(&envelope).map_err(|source| Error::Serialize { path, source })?;
        bytes.push(b'\n');
        let agent_dir = self.agent_dir()?;
        let written = agent_dir.write_file(Layout::JOURNAL_FILE_NAME, &bytes, JOURNAL_MODE, None)?;
        if written {
            agent_dir.sync()?;
        }
        // The copy an earlier version kept is superseded.
        self.remove_checkpoint_dir_files(&[Layout::LEGACY_FILE_NAMES[0]])?;
        Ok(written)
    }
}

impl Store {
    /// Removes the state journal (after self-GC and drain: nothing is left to time).
    /// Returns whether there was one.
    pub fn remove_journal(&self) -> Result<bool> {
        let legacy = self.remove_checkpoint_dir_files(&[Layout::LEGACY_FILE_NAMES[0]])?;
        Ok(self.remove_agent_dir_files(&[Layout::JOURNAL_FILE_NAME])? | legacy)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::os::unix::fs::{MetadataExt, symlink};

    use super::*;
    use crate::testutil::store;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct State {
        absent_since: BTreeMap<String, i64>,
    }

    fn state(entries: &[(&str, i64)]) -> State {
        State {
            absent_since: entries.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        }
    }

    #[test]
    fn round_trip_and_unchanged_is_not_rewritten() {
        let (_tmp, store) = store();
        assert_eq!(store.read_journal::<State>().unwrap(), None);
        let first = state(&[("kube-system/a", 1)]);
        assert!(store.write_journal(&first).unwrap());
        assert!(!store.write_journal(&first).unwrap());
        assert_eq!(store.read_journal::<State>().unwrap(), Some(first));
        let second = state(&[("kube-system/a", 1), ("kube-system/b", 2)]);
        assert!(store.write_journal(&second).unwrap());
        assert_eq!(store.read_journal::<State>().unwrap(), Some(second));
        let path = store.layout().journal_path();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(r#"{"version":1,"state":"#), "{text}");
        assert!(text.ends_with('\n'));
        assert!(store.remove_journal().unwrap());
        assert!(!path.exists());
        assert!(!store.remove_journal().unwrap(), "already gone");
        assert_eq!(store.read_journal::<State>().unwrap(), None);
    }

    #[test]
    fn unusable_journals_are_quarantined_and_read_as_none() {
        let check = |content: &str| {
            let (_tmp, store) = store();
            std::fs::create_dir_all(store.layout().agent_dir()).unwrap();
            std::fs::write(store.layout().journal_path(), content).unwrap();
            assert_eq!(store.read_journal::<State>().unwrap(), None, "{content}");
            assert!(!store.layout().journal_path().exists(), "{content}: moved away");
            let quarantined: Vec<_> = std::fs::read_dir(store.layout().quarantine_dir())
                .unwrap()
                .collect();
            assert_eq!(quarantined.len(), 1, "{content}");
            // Writing afresh works.
            assert!(store.write_journal(&state(&[])).unwrap());
        };
        check("");
        check("not json");
        check(r#"{"version":2,"state":{"absent_since":{}}}"#);
        check(r#"{"version":1,"state":{"other":true}}"#);
        check(r#"{"state":{"absent_since":{}}}"#);
    }

    /// The planner's own state: a time no calendar holds (a corrupted or hand-edited
    /// journal) is refused as a whole, with the reason, rather than overflowing later.
    #[test]
    fn planner_state_with_times_beyond_the_calendar_is_quarantined() {
        let check = |since: &str, usable: bool| {
            let (_tmp, store) = store();
            let content = format!(
                r#"{{"version":1,"state":{{"absent_since":[{{"namespace":"ns","name":"p","since":{since}}}]}}}}"#
            );
            std::fs::create_dir_all(store.layout().agent_dir()).unwrap();
            std::fs::write(store.layout().journal_path(), &content).unwrap();
            let read = store.read_journal::<ckpt_core::PersistentState>().unwrap();
            assert_eq!(read.is_some(), usable, "{since}");
            assert_eq!(store.layout().journal_path().exists(), usable, "{since}");
        };
        check("1796213959000", true);
        check("-62135596800000", true);
        check("253402207200999", true);
        check("253402207201000", false);
        check("9223372036854775807", false);
        check("-9223372036854775808", false);
        check("99999999999999999999", false);
        check("1e300", false);
    }

    /// Earlier versions kept the journal at the checkpoint dir's top: it is read from
    /// there until the first write, which moves it into the agent's dir.
    #[test]
    fn a_journal_where_earlier_versions_kept_it_is_read_then_moved() {
        let (_tmp, store) = store();
        let legacy = store
            .layout()
            .checkpoint_dir()
            .join("pod-checkpointer-state.json");
        std::fs::write(&legacy, r#"{"version":1,"state":{"absent_since":{"x":1}}}"#).unwrap();
        assert_eq!(store.read_journal::<State>().unwrap(), Some(state(&[("x", 1)])));
        assert!(store.write_journal(&state(&[("x", 1), ("y", 2)])).unwrap());
        assert!(
            !legacy.exists(),
            "the legacy copy is gone once the new one is written"
        );
        assert_eq!(
            store.read_journal::<State>().unwrap(),
            Some(state(&[("x", 1), ("y", 2)]))
        );
    }

    #[test]
    fn a_symlinked_journal_is_not_followed() {
        let (tmp, store) = store();
        let outside = tmp.path().join("outside.json");
        let original = r#"{"version":1,"state":{"absent_since":{"x":1}}}"#;
        std::fs::write(&outside, original).unwrap();
        std::fs::create_dir_all(store.layout().agent_dir()).unwrap();
        symlink(&outside, store.layout().journal_path()).unwrap();
        assert_eq!(store.read_journal::<State>().unwrap(), None);
        assert!(store.write_journal(&state(&[("y", 2)])).unwrap());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), original);
        assert_eq!(store.read_journal::<State>().unwrap(), Some(state(&[("y", 2)])));
    }

    #[test]
    fn read_only_store_reads_but_never_writes() {
        let (_tmp, store) = store();
        store.write_journal(&state(&[("a", 1)])).unwrap();
        let read_only = Store::open_read_only(store.layout().clone()).unwrap();
        assert_eq!(
            read_only.read_journal::<State>().unwrap(),
            Some(state(&[("a", 1)]))
        );
        assert!(matches!(
            read_only.write_journal(&state(&[])),
            Err(Error::ReadOnlyStore { .. })
        ));
    }
}
