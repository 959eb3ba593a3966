//! `ckpt-lock`: the `flock(2)` lock that makes exactly one copy of pod-checkpointer active.
//!
//! Both the DaemonSet copy and the static copy take the same exclusive lock before they
//! create any client; the waiting copy takes over when the holder exits — also when it is
//! SIGKILLed, because the kernel drops a `flock` when its file is closed. Nothing here is
//! specific to pod-checkpointer: any set of processes that must have one active member can
//! use it.
//!
//! - [`LockFile`]: a lock path plus the identity of whoever takes it. Acquire it with
//!   [`acquire`](LockFile::acquire) (async, cancel-safe, does not block the runtime;
//!   feature `tokio`), [`acquire_blocking`](LockFile::acquire_blocking) or
//!   [`try_acquire`](LockFile::try_acquire) (returns [`TryAcquire::Busy`] with the holder
//!   when the lock is taken).
//! - [`LockGuard`]: holds the lock; dropping it releases the lock.
//!   [`confirm`](LockGuard::confirm) checks that the path still names the locked file
//!   ([`Confirmed`]): a lock file deleted or replaced while held is taken again, or given
//!   up when another process locks its replacement.
//! - [`LockHolder`] and [`read_holder`]: the holder writes its pid, identity and start time
//!   into the lock file, so a waiter (or an operator) can tell who is active. This is
//!   diagnostics only; files without a record (bootkube's lock files are empty) read as
//!   `None`.
//! - [`Error`] and [`Result`]. A lock file another user could hold or replace (not ours,
//!   open to group or others, a symlink, in a directory others may write without the
//!   sticky bit) is refused with [`Error::UnsafeLockFile`]/[`Error::UnsafeLockDir`].
//!
//! The lock is `flock(2)` via [`std::fs::File::lock`], not `fcntl` record locks: it belongs
//! to the open file (so two opens in one process exclude each other) and interoperates with
//! bootkube's checkpointer and `flock(1)`. The library only emits `tracing` events.
//!
//! # Features
//!
//! - `tokio` (default): [`LockFile::acquire`], the waiter for a Tokio runtime. Without it
//!   (`default-features = false`) the crate needs no async runtime: a process waits with
//!   [`LockFile::acquire_blocking`] on a thread of its own, or polls
//!   [`LockFile::try_acquire`] (the README has an example).
//!
//! # Example
//!
//! ```
//! use ckpt_lock::{LockFile, TryAcquire};
//!
//! # #[cfg(not(feature = "tokio"))]
//! # fn main() {}
//! # #[cfg(feature = "tokio")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> ckpt_lock::Result<()> {
//! # let dir = std::env::temp_dir().join(format!("ckpt-lock-doc-{}", std::process::id()));
//! # let lock_path = dir.join("my-agent.lock");
//! // In production, e.g. "/run/my-agent/my-agent.lock": a directory only root can write.
//! let lock = LockFile::new(&lock_path, "my-agent node=node-1");
//!
//! // Waits until no other process holds the lock, without blocking the runtime.
//! let guard = lock.acquire().await?;
//! assert_eq!(guard.holder().pid, std::process::id());
//!
//! // A second contender (another process, or another open file in this one) sees the
//! // holder's record.
//! let contender = LockFile::new(&lock_path, "another copy");
//! match contender.try_acquire()? {
//!     TryAcquire::Busy { holder: Some(holder) } => println!("standby: lock held by {holder}"),
//!     TryAcquire::Busy { holder: None } => println!("standby: held by an unknown process"),
//!     TryAcquire::Acquired(_) => unreachable!("the lock is held"),
//! }
//!
//! drop(guard); // released; the contender could take it now
//! assert!(contender.try_acquire()?.into_guard().is_some());
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok(())
//! # }
//! ```

mod error;
mod holder;
mod lock;

pub use error::{Error, Result};
pub use holder::{LockHolder, read_holder};
#[cfg(feature = "tokio")]
pub use lock::DEFAULT_POLL_INTERVAL;
pub use lock::{Confirmed, LockFile, LockGuard, TryAcquire};

/// The README's example, compiled and run with the doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExample;
