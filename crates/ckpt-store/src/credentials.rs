//! The API credentials the agent keeps for its own static copy.
//!
//! The static copy of the checkpointer runs without a service-account token (projected
//! tokens cannot be checkpointed) and, after a reboot, without the service environment.
//! The DaemonSet copy keeps a kubeconfig with a token for the static copy's service
//! account here, so that the static copy can still see the API server, garbage-collect
//! and remove itself when the node is descheduled. Two files, each written atomically,
//! 0600: the token, and a kubeconfig that names it as its `tokenFile` — so a static copy
//! that runs for weeks picks up each refreshed token without restarting.
//!
//! The DaemonSet copy writes them also while it waits for the lock (the static copy holds
//! it after every reboot), through [`KeptCredentials`], which touches no other file.

use crate::error::Result;
use crate::layout::Layout;
use crate::store::Store;

/// The kubeconfig holds a bearer token: root only.
const CREDENTIALS_MODE: u32 = 0o600;

/// Writes the kept credentials without the lock and without opening the store: creates
/// nothing but the checkpoint dir, cleans and reads nothing, so it never disturbs the
/// copy that holds the lock (its temporary files carry this process's tag; a holder's
/// cleanup that removes one only fails this write, which is tried again).
#[derive(Clone, Debug)]
pub struct KeptCredentials {
    store: Store,
}

impl KeptCredentials {
    /// For the checkpoint dir of `layout`.
    ///
    /// # Errors
    ///
    /// If the layout is not usable (the same checks as [`Store::open`]).
    pub fn new(layout: Layout) -> Result<Self> {
        crate::store::check_layout(&layout)?;
        Ok(Self {
            store: Store::unchecked(layout),
        })
    }

    /// [`Store::write_credentials`].
    ///
    /// # Errors
    ///
    /// If a file cannot be written.
    pub fn write(&self, kubeconfig: &[u8], token: &[u8]) -> Result<bool> {
        self.store.write_credentials(kubeconfig, token)
    }
}

impl Store {
    /// Writes the token, then the kubeconfig that reads it, each atomically (mode 0600);
    /// a file that is unchanged is not rewritten. Returns whether anything was written.
    pub fn write_credentials(&self, kubeconfig: &[u8], token: &[u8]) -> Result<bool> {
        self.require_writable()?;
        let agent_dir = self.agent_dir()?;
        // The token first: a kubeconfig is never on disk naming a token file that is not.
        let token_written =
            agent_dir.write_file(Layout::CREDENTIALS_TOKEN_FILE_NAME, token, CREDENTIALS_MODE, None)?;
        let kubeconfig_written =
            agent_dir.write_file(Layout::CREDENTIALS_FILE_NAME, kubeconfig, CREDENTIALS_MODE, None)?;
        let written = token_written || kubeconfig_written;
        if written {
            agent_dir.sync()?;
        }
        Ok(written)
    }

    /// Removes the kept kubeconfig and its token (after self-GC, or on drain). Returns
    /// whether there was either.
    pub fn remove_credentials(&self) -> Result<bool> {
        let legacy = self.remove_checkpoint_dir_files(&Layout::LEGACY_FILE_NAMES[1..])?;
        Ok(self
            .remove_agent_dir_files(&[Layout::CREDENTIALS_FILE_NAME, Layout::CREDENTIALS_TOKEN_FILE_NAME])?
            | legacy)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, symlink};

    use super::*;
    use crate::error::Error;
    use crate::testutil::store;

    #[test]
    fn kept_credentials_are_written_without_opening_the_store() {
        let (tmp, store) = store();
        // An interrupted write of the holder's: only the holder's own open cleans it.
        let stale = store
            .layout()
            .checkpoint_dir()
            .join(".pod-checkpointer-0000000000000000-1.tmp");
        std::fs::write(&stale, b"partial").unwrap();
        let kept = KeptCredentials::new(store.layout().clone()).unwrap();
        assert!(kept.write(b"config", b"token").unwrap());
        assert_eq!(
            std::fs::read(store.layout().credentials_token_path()).unwrap(),
            b"token"
        );
        assert!(stale.exists(), "a writer without the lock cleans nothing");
        drop(tmp);
    }

    #[test]
    fn written_0600_not_rewritten_when_unchanged_and_removed() {
        let (_tmp, store) = store();
        let path = store.layout().credentials_path();
        let token = store.layout().credentials_token_path();
        assert!(!store.remove_credentials().unwrap(), "nothing to remove yet");
        assert!(store.write_credentials(b"config", b"one").unwrap());
        assert!(!store.write_credentials(b"config", b"one").unwrap());
        for file in [&path, &token] {
            assert_eq!(std::fs::metadata(file).unwrap().mode() & 0o777, 0o600, "{file:?}");
        }
        assert!(store.write_credentials(b"config", b"two").unwrap(), "a new token");
        assert_eq!(std::fs::read(&token).unwrap(), b"two");
        assert_eq!(std::fs::read(&path).unwrap(), b"config");
        assert!(store.remove_credentials().unwrap());
        assert!(!path.exists() && !token.exists());
    }

    #[test]
    fn a_symlink_in_its_place_is_replaced_not_followed() {
        let (tmp, store) = store();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, "keep").unwrap();
        std::fs::create_dir_all(store.layout().agent_dir()).unwrap();
        symlink(&outside, store.layout().credentials_path()).unwrap();
        symlink(&outside, store.layout().credentials_token_path()).unwrap();
        assert!(store.write_credentials(b"config", b"token").unwrap());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        assert_eq!(
            std::fs::read(store.layout().credentials_path()).unwrap(),
            b"config"
        );
        assert_eq!(
            std::fs::read(store.layout().credentials_token_path()).unwrap(),
            b"token"
        );
    }

    #[test]
    fn read_only_store_never_writes() {
        let (_tmp, store) = store();
        let read_only = Store::open_read_only(store.layout().clone()).unwrap();
        assert!(matches!(
            read_only.write_credentials(b"x", b"y"),
            Err(Error::ReadOnlyStore { .. })
        ));
    }
}
