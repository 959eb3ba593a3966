//! `ckpt-lock`: the `flock(2)` lock that makes exactly one copy of pod-checkpointer active.
//!
//! Both the DaemonSet copy and the static copy take the same exclusive lock before they
//! create any client; the waiting copy takes over when the holder exits.
