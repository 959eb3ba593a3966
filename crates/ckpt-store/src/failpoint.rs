//! Failpoints for fault tests: the store's file operations pass named points, and a test
//! makes a point sleep (a slow disk), fail with an errno (a failing disk) or abort the
//! process (a crash between two steps). Compiled in only with the `failpoints` feature;
//! without it every point is an empty inline function.
//!
//! The points, each just before the step it names: `fsops.read` (reading a file),
//! `fsops.fsync` (a written file's fsync), `fsops.rename` (renaming a written file into
//! place), `fsops.dirsync` (a directory's fsync) and `fsops.unlink` (removing a file, or
//! each entry of a tree being removed).
//!
//! A test sets a point for the paths under one directory with [`set`] (so tests of one
//! process do not meet each other's faults), or for a whole process with the environment
//! variable `CKPT_FAILPOINTS=name=action;…`, read once. Actions: `sleep(MS)`,
//! `error(ERRNO)`, `abort` and `abort@N` (abort on the N-th pass of the point, counted
//! per process, so a crash test can stop a run at every pass in turn).

use std::io;
use std::path::Path;
#[cfg(feature = "failpoints")]
use std::path::PathBuf;
#[cfg(feature = "failpoints")]
use std::sync::{Mutex, OnceLock};
#[cfg(feature = "failpoints")]
use std::time::Duration;

/// What a failpoint does when it is passed.
#[cfg(feature = "failpoints")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Block the calling thread this long (a slow disk), then go on.
    Sleep(Duration),
    /// Fail the step with this errno (`5` EIO, `28` ENOSPC, `30` EROFS).
    Error(i32),
    /// Abort the process on the N-th pass of the point (counting from 1), as a crash or
    /// SIGKILL between two steps would end it; earlier passes go on.
    AbortAt(u64),
}

#[cfg(feature = "failpoints")]
impl std::str::FromStr for Action {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let arg = |prefix: &str| s.strip_prefix(prefix).and_then(|r| r.strip_suffix(')'));
        if s == "abort" {
            Ok(Action::AbortAt(1))
        } else if let Some(n) = s.strip_prefix("abort@") {
            match n.parse() {
                Ok(n) if n > 0 => Ok(Action::AbortAt(n)),
                _ => Err(format!("bad pass number in {s:?}")),
            }
        } else if let Some(ms) = arg("sleep(") {
            ms.parse()
                .map(|ms| Action::Sleep(Duration::from_millis(ms)))
                .map_err(|_| format!("bad milliseconds in {s:?}"))
        } else if let Some(errno) = arg("error(") {
            errno
                .parse()
                .map(Action::Error)
                .map_err(|_| format!("bad errno in {s:?}"))
        } else {
            Err(format!(
                "unknown failpoint action {s:?}: sleep(MS), error(ERRNO) or abort"
            ))
        }
    }
}

#[cfg(feature = "failpoints")]
static SET: Mutex<Vec<(String, PathBuf, Action)>> = Mutex::new(Vec::new());

/// Makes `name` do `action` for the paths under `under` (replacing what it did there).
#[cfg(feature = "failpoints")]
pub fn set(name: &str, under: &Path, action: Action) {
    let mut set = SET.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    set.retain(|(n, u, _)| !(n == name && u == under));
    set.push((name.to_owned(), under.to_owned(), action));
}

/// Makes `name` do nothing again for the paths under `under`.
#[cfg(feature = "failpoints")]
pub fn clear(name: &str, under: &Path) {
    let mut set = SET.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    set.retain(|(n, u, _)| !(n == name && u == under));
}

/// `CKPT_FAILPOINTS`, parsed once; a malformed entry is reported and ignored.
#[cfg(feature = "failpoints")]
fn from_env() -> &'static [(String, Action)] {
    static FROM_ENV: OnceLock<Vec<(String, Action)>> = OnceLock::new();
    FROM_ENV.get_or_init(|| {
        let spec = std::env::var("CKPT_FAILPOINTS").unwrap_or_default();
        spec.split(';')
            .filter(|entry| !entry.trim().is_empty())
            .filter_map(|entry| {
                let parsed = entry
                    .split_once('=')
                    .ok_or_else(|| format!("no `=` in {entry:?}"))
                    .and_then(|(name, action)| Ok((name.trim().to_owned(), action.trim().parse()?)));
                parsed
                    .inspect_err(|e| tracing::warn!(error = %e, "CKPT_FAILPOINTS: entry ignored"))
                    .ok()
            })
            .collect()
    })
}

/// How often each point was passed in this process.
#[cfg(feature = "failpoints")]
static PASSES: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

/// Passes the failpoint `name` for an operation on `path` (public for the agent's own
/// file reads outside the store, e.g. the kept token its metrics report).
#[cfg(feature = "failpoints")]
pub fn hit(name: &str, path: &Path) -> io::Result<()> {
    let pass = {
        let mut passes = PASSES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match passes.iter_mut().find(|(n, _)| n == name) {
            Some((_, count)) => {
                *count += 1;
                *count
            }
            None => {
                passes.push((name.to_owned(), 1));
                1
            }
        }
    };
    let action = {
        let set = SET.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        set.iter()
            .find(|(n, under, _)| n == name && path.starts_with(under))
            .map(|(_, _, action)| action.clone())
    }
    .or_else(|| from_env().iter().find(|(n, _)| n == name).map(|(_, a)| a.clone()));
    match action {
        None => Ok(()),
        Some(Action::Sleep(pause)) => {
            std::thread::sleep(pause);
            Ok(())
        }
        Some(Action::Error(errno)) => Err(io::Error::from_raw_os_error(errno)),
        Some(Action::AbortAt(n)) if n == pass => std::process::abort(),
        Some(Action::AbortAt(_)) => Ok(()),
    }
}

/// Without the `failpoints` feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str, _path: &Path) -> io::Result<()> {
    Ok(())
}

#[cfg(all(test, feature = "failpoints"))]
mod tests {
    use super::*;

    fn check(text: &str, expected: Result<Action, ()>) {
        assert_eq!(text.parse::<Action>().map_err(|_| ()), expected, "{text}");
    }

    #[test]
    fn actions() {
        check("abort", Ok(Action::AbortAt(1)));
        check("abort@3", Ok(Action::AbortAt(3)));
        check("abort@0", Err(()));
        check("sleep(250)", Ok(Action::Sleep(Duration::from_millis(250))));
        check("error(28)", Ok(Action::Error(28)));
        check("sleep(x)", Err(()));
        check("error(5", Err(()));
        check("explode", Err(()));
    }

    #[test]
    fn a_point_set_under_a_directory_fires_there_only() {
        let dir = Path::new("/failpoint-test/a");
        set("fsops.unlink", dir, Action::Error(5));
        let e = hit("fsops.unlink", &dir.join("x/y.json")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(5));
        assert!(hit("fsops.unlink", Path::new("/failpoint-test/b/y.json")).is_ok());
        assert!(hit("fsops.fsync", &dir.join("y.json")).is_ok());
        clear("fsops.unlink", dir);
        assert!(hit("fsops.unlink", &dir.join("y.json")).is_ok());
    }
}
