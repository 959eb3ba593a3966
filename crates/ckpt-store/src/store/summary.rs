//! What a write or a removal changed, as [`Store::write_inactive`] and [`Store::remove`]
//! report it.
//!
//! [`Store::write_inactive`]: crate::Store::write_inactive
//! [`Store::remove`]: crate::Store::remove

/// What [`Store::write_inactive`](crate::Store::write_inactive) changed; all zero when the checkpoint was on disk
/// already (steady state writes nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteSummary {
    /// The inactive manifest was (re)written.
    pub manifest_written: bool,
    /// Data files written: every file of each volume that got a new version.
    pub files_written: usize,
    /// Key links (`<key> -> ..data/<key>`) created or replaced.
    pub links_written: usize,
    /// Stale data entries removed (previous versions, keys, volume directories).
    pub entries_removed: usize,
    /// An adopted bootkube inactive manifest was replaced by ours.
    pub legacy_removed: bool,
}

impl WriteSummary {
    /// Whether anything on disk changed.
    pub fn changed(&self) -> bool {
        self.manifest_written
            || self.files_written > 0
            || self.links_written > 0
            || self.entries_removed > 0
            || self.legacy_removed
    }
}

/// What [`Store::remove`](crate::Store::remove) removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoveSummary {
    /// Per-pod data directories removed (secrets, configmaps, projected).
    pub data_dirs_removed: usize,
    /// An inactive manifest was removed.
    pub inactive_removed: bool,
    /// An active manifest was removed (the static pod stops).
    pub active_removed: bool,
}

impl RemoveSummary {
    /// Whether anything existed.
    pub fn removed_anything(&self) -> bool {
        self.data_dirs_removed > 0 || self.inactive_removed || self.active_removed
    }
}
