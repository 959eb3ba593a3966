//! `ckpt-store`: crash-safe on-disk storage of pod checkpoints.
//!
//! Inactive and active manifests, the Secrets and ConfigMaps they mount, and the state
//! journal, written atomically under the configured checkpoint and manifests directories.
