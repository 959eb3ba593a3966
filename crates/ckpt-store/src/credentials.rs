//! The API credentials the agent keeps for its own static copy.
//!
//! The static copy of the checkpointer runs without a service-account token (projected
//! tokens cannot be checkpointed) and, after a reboot, without the service environment.
//! The copy that is connected keeps a kubeconfig with a token of its own service account
//! here, so that the static copy can still see the API server, garbage-collect and
//! remove itself when the node is descheduled. One file, written atomically, 0600.

use crate::error::Result;
use crate::layout::Layout;
use crate::store::Store;

/// The kubeconfig holds a bearer token: root only.
const CREDENTIALS_MODE: u32 = 0o600;

impl Store {
    /// Writes the credentials kubeconfig atomically (mode 0600); nothing is written when
    /// it is unchanged. Returns whether it wrote.
    pub fn write_credentials(&self, kubeconfig: &[u8]) -> Result<bool> {
        self.require_writable()?;
        let checkpoint_dir = self.checkpoint_dir()?;
        let written =
            checkpoint_dir.write_file(Layout::CREDENTIALS_FILE_NAME, kubeconfig, CREDENTIALS_MODE, None)?;
        if written {
            checkpoint_dir.sync()?;
        }
        Ok(written)
    }

    /// Removes the credentials kubeconfig (after self-GC, or on drain). Returns whether
    /// there was one.
    pub fn remove_credentials(&self) -> Result<bool> {
        self.require_writable()?;
        let Some(checkpoint_dir) = crate::fsops::Dir::open_trusted(self.layout().checkpoint_dir())? else {
            return Ok(false);
        };
        let removed = checkpoint_dir.remove_file(Layout::CREDENTIALS_FILE_NAME)?;
        if removed {
            checkpoint_dir.sync()?;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, symlink};

    use super::*;
    use crate::error::Error;

    fn store() -> (tempfile::TempDir, Store) {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout::new(tmp.path().join("k8s"), tmp.path().join("k8s/manifests"));
        (tmp, Store::open(layout).unwrap())
    }

    #[test]
    fn written_0600_not_rewritten_when_unchanged_and_removed() {
        let (_tmp, store) = store();
        let path = store.layout().credentials_path();
        assert!(!store.remove_credentials().unwrap(), "nothing to remove yet");
        assert!(store.write_credentials(b"one").unwrap());
        assert!(!store.write_credentials(b"one").unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert!(store.write_credentials(b"two").unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert!(store.remove_credentials().unwrap());
        assert!(!path.exists());
    }

    #[test]
    fn a_symlink_in_its_place_is_replaced_not_followed() {
        let (tmp, store) = store();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, "keep").unwrap();
        symlink(&outside, store.layout().credentials_path()).unwrap();
        assert!(store.write_credentials(b"token").unwrap());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        assert_eq!(
            std::fs::read(store.layout().credentials_path()).unwrap(),
            b"token"
        );
    }

    #[test]
    fn read_only_store_never_writes() {
        let (_tmp, store) = store();
        let read_only = Store::open_read_only(store.layout().clone()).unwrap();
        assert!(matches!(
            read_only.write_credentials(b"x"),
            Err(Error::ReadOnlyStore { .. })
        ));
    }
}
