//! The state journal: what the planner must remember across restarts (when a parent
//! was first seen absent, per-checkpoint metadata, …).
//!
//! The store does not know the schema (ckpt-core's planner owns it); it keeps any
//! serde value in a small versioned envelope, written atomically like every other file:
//!
//! ```json
//! {"version":1,"state":{…}}
//! ```

use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::error::{Error, Result};
use crate::fsops::{Dir, ReadOutcome};
use crate::layout::Layout;
use crate::store::Store;
use crate::store::scan::{move_to_quarantine, quarantine_file};

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

/// What [`Store::load_journal`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum LoadedJournal<T> {
    /// There is no journal yet.
    Missing,
    /// The journal's state.
    Read(T),
    /// A journal that exists but cannot be used (why): kept for a human, never read as
    /// "no journal". `set_aside` is where it was moved (the quarantine dir); `None` when
    /// it could not be moved or the store is read-only: it is still at its place then, and
    /// a write would replace it ([`Store::set_journal_aside`] first).
    Unusable {
        /// Why it cannot be used.
        reason: String,
        /// Its path in the quarantine dir, if it was moved there.
        set_aside: Option<PathBuf>,
    },
}

impl Store {
    /// Reads the state journal; `None` if there is none yet, or it cannot be used
    /// ([`Store::load_journal`] tells the two apart).
    pub fn read_journal<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        Ok(match self.load_journal()? {
            LoadedJournal::Read(state) => Some(state),
            LoadedJournal::Missing | LoadedJournal::Unusable { .. } => None,
        })
    }

    /// Reads the state journal.
    ///
    /// A journal that cannot be used (not JSON, another format version, a state that
    /// does not deserialize into `T`, a symlink, a read that fails) is moved to the
    /// quarantine dir (as unusable manifests are) with a warning and reported as
    /// [`LoadedJournal::Unusable`]: what it held is lost to the agent, which must say so
    /// rather than start as on a new node.
    pub fn load_journal<T: DeserializeOwned>(&self) -> Result<LoadedJournal<T>> {
        let Some((checkpoint_dir, source_dir, name)) = self.journal_source()? else {
            return Ok(LoadedJournal::Missing);
        };
        let unusable = |reason: String| {
            let set_aside = if self.is_writable() {
                quarantine_file(&checkpoint_dir, &source_dir, name.as_ref(), &reason)
            } else {
                warn!(path = %source_dir.child_path(name).display(), reason, "ignoring an unusable state journal");
                None
            };
            Ok(LoadedJournal::Unusable { reason, set_aside })
        };
        let contents = match source_dir.read_file(name, MAX_JOURNAL_BYTES) {
            Ok(ReadOutcome::Missing) => return Ok(LoadedJournal::Missing),
            Ok(ReadOutcome::NotRegular(kind)) => return unusable(format!("a {kind}, not a regular file")),
            Ok(ReadOutcome::TooLarge(len)) => return unusable(format!("{len} bytes, too large")),
            Ok(ReadOutcome::Read(contents)) => contents,
            // A file that is there but cannot be read (EIO) holds what it held: set aside
            // like one that reads as garbage, never written over.
            Err(e) => return unusable(ckpt_core::error_chain(&e)),
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
            Ok(envelope) => Ok(LoadedJournal::Read(envelope.state)),
            Err(e) => unusable(format!("the state does not match this agent's schema: {e}")),
        }
    }

    /// Moves the state journal, as it is, to the quarantine dir: for a journal
    /// [`Store::load_journal`] found unusable but could not move. Returns its new path;
    /// `None` if there is no journal any more.
    pub fn set_journal_aside(&self) -> Result<Option<PathBuf>> {
        self.require_writable()?;
        let Some((checkpoint_dir, source_dir, name)) = self.journal_source()? else {
            return Ok(None);
        };
        if source_dir.kind_of(name)?.is_none() {
            return Ok(None);
        }
        move_to_quarantine(&checkpoint_dir, &source_dir, name.as_ref()).map(Some)
    }

    /// The checkpoint dir, and the directory and name of the journal to read: the agent's
    /// dir, or where earlier versions kept it directly in the checkpoint dir (read from
    /// there until the first write moves it). `None` without a checkpoint dir.
    fn journal_source(&self) -> Result<Option<(Dir, Dir, &'static str)>> {
        let Some(checkpoint_dir) = Dir::open_trusted(self.layout().checkpoint_dir())? else {
            return Ok(None);
        };
        let source = match self.existing_agent_dir()? {
            Some(agent_dir) if agent_dir.kind_of(Layout::JOURNAL_FILE_NAME)?.is_some() => {
                (agent_dir, Layout::JOURNAL_FILE_NAME)
            }
            _ => match Dir::open_trusted(self.layout().checkpoint_dir())? {
                Some(dir) => (dir, Layout::LEGACY_FILE_NAMES[0]),
                None => return Ok(None),
            },
        };
        Ok(Some((checkpoint_dir, source.0, source.1)))
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

    /// An unusable journal is reported as such (never as no journal), kept byte for byte
    /// in the quarantine dir; a read-only store leaves it in place, and
    /// `set_journal_aside` moves it before anything is written over it.
    #[test]
    fn unusable_journals_are_reported_and_kept_as_they_were() {
        let torn = r#"{"version":1,"state":{"absent_since":["#;
        let (_tmp, store) = store();
        std::fs::create_dir_all(store.layout().agent_dir()).unwrap();
        std::fs::write(store.layout().journal_path(), torn).unwrap();

        let read_only = Store::open_read_only(store.layout().clone()).unwrap();
        match read_only.load_journal::<State>().unwrap() {
            LoadedJournal::Unusable { reason, set_aside } => {
                assert!(reason.starts_with("not a state journal"), "{reason}");
                assert_eq!(set_aside, None, "a read-only store moves nothing");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            std::fs::read_to_string(store.layout().journal_path()).unwrap(),
            torn
        );
        let moved = store.set_journal_aside().unwrap().expect("moved");
        assert!(
            moved.starts_with(store.layout().quarantine_dir()),
            "{}",
            moved.display()
        );
        assert_eq!(std::fs::read_to_string(&moved).unwrap(), torn);
        assert!(!store.layout().journal_path().exists());
        assert_eq!(store.set_journal_aside().unwrap(), None, "nothing left to move");
        assert_eq!(store.load_journal::<State>().unwrap(), LoadedJournal::Missing);

        std::fs::write(store.layout().journal_path(), torn).unwrap();
        let LoadedJournal::Unusable {
            set_aside: Some(kept),
            ..
        } = store.load_journal::<State>().unwrap()
        else {
            panic!("set aside by a writable store");
        };
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), torn);
        assert_ne!(kept, moved, "a name of its own");
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
