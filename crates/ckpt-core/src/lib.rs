//! `ckpt-core`: the pure domain model of pod-checkpointer.
