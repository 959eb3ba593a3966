//! `ckpt-watch`: observing the world for pod-checkpointer.
//!
//! The API server (watch + health probe), the kubelet's pod list and the container
//! runtime, reduced to one snapshot that says explicitly when a source is unavailable.
