//! `ckpt-gc`: pluggable garbage-collection strategies for pod checkpoints.
//!
//! A strategy decides what happens to a checkpoint whose parent is absent from a synced
//! API view: keep it, remove it now, or remove it at a deadline.
