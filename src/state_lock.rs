//! The state folder's lock: one stagefs process per state folder.
//!
//! A `lock` file in the state folder, held with `flock(LOCK_EX)` for as long
//! as the [`StateLock`] lives (the kernel releases it when the process
//! dies, so a killed daemon leaves no stale lock). Taken by
//! `Replica::start` and by the bootstrap before either writes anything;
//! [`state_in_use`] asks without taking it (`stagefs status`).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum StateLockError {
    /// Another process holds it.
    #[error("state folder {0} is in use by another stagefs process")]
    InUse(PathBuf),
    #[error("opening {path}: {1}", path = .0.display())]
    Open(PathBuf, std::io::Error),
}

/// The held lock; released when dropped.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

/// Takes the state folder's lock, or fails at once if another process
/// holds it.
pub fn lock_state(dir: &Path) -> Result<StateLock, StateLockError> {
    let path = dir.join("lock");
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| StateLockError::Open(path, e))?;
    // SAFETY: flock on a valid, owned descriptor.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(StateLockError::InUse(dir.to_owned()));
    }
    Ok(StateLock { _file: f })
}

/// True when a process holds the state folder's lock.
pub fn state_in_use(dir: &Path) -> bool {
    let Ok(f) = File::open(dir.join("lock")) else {
        return false;
    };
    // SAFETY: flock on a valid, owned descriptor; released when `f` drops.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) != 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_refuses_a_second_holder_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!state_in_use(dir.path()));
        let held = lock_state(dir.path()).unwrap();
        assert!(state_in_use(dir.path()));
        assert!(matches!(
            lock_state(dir.path()),
            Err(StateLockError::InUse(p)) if p == dir.path()
        ));
        drop(held);
        assert!(!state_in_use(dir.path()));
        lock_state(dir.path()).unwrap();
    }

    #[test]
    fn a_folder_that_cannot_hold_the_lock_file_is_an_open_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent");
        let err = lock_state(&missing).unwrap_err();
        assert!(matches!(err, StateLockError::Open(..)), "{err}");
        assert!(err
            .to_string()
            .starts_with(&format!("opening {}", missing.join("lock").display())));
    }
}
