//! `stagefs warm MNT [PATH…]` (SPEC §8): fetches ahead into a reader
//! host's cache — a table, a partition, a snapshot path, or (no PATH) the
//! whole visible state — so the first query on the host does not wait
//! for the storage.
//!
//! The command talks to the daemon through the mount, as `stagefs run`
//! does: it walks each PATH (the listings are the daemon's, at the
//! caller's view) and sets `user.stagefs.warm` on every file; the daemon
//! fetches that file whole (every piece, verified) before it answers. A
//! progress line (files, bytes, rate) is rewritten on stderr.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::daemon::DaemonError;
use crate::run::{xattr_get, xattr_set};
use crate::view::WARM_XATTR;

/// What a warm did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Warmed {
    pub files: u64,
    pub bytes: u64,
    pub failed: u64,
}

struct Progress {
    start: Instant,
    last: Instant,
    done: Warmed,
}

impl Progress {
    fn line(&self) -> String {
        let secs = self.start.elapsed().as_secs_f64().max(1e-3);
        format!(
            "warm: {} files, {:.1} MiB, {:.1} MiB/s{}",
            self.done.files,
            self.done.bytes as f64 / (1 << 20) as f64,
            self.done.bytes as f64 / (1 << 20) as f64 / secs,
            match self.done.failed {
                0 => String::new(),
                n => format!(", {n} failed"),
            }
        )
    }

    fn show(&mut self, force: bool) {
        if force || self.last.elapsed() >= Duration::from_millis(500) {
            self.last = Instant::now();
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{}", self.line());
            let _ = err.flush();
        }
    }
}

/// Warms `paths` (the mount's root when empty) of the mount at `mount`.
/// Exit status: usage errors (not a mount, a path outside it) 2, files
/// that could not be fetched 1.
pub fn warm(mount: &Path, paths: &[PathBuf]) -> Result<Warmed, DaemonError> {
    if let Err(e) = xattr_get(mount, "user.stagefs.visible") {
        return Err(DaemonError::Usage(format!(
            "{} is not a running stagefs mount ({e})",
            mount.display()
        )));
    }
    let roots: Vec<PathBuf> = if paths.is_empty() {
        vec![mount.to_owned()]
    } else {
        paths.to_vec()
    };
    for p in &roots {
        let inside = p
            .canonicalize()
            .ok()
            .zip(mount.canonicalize().ok())
            .is_some_and(|(p, m)| p.starts_with(m));
        if !inside {
            return Err(DaemonError::Usage(format!(
                "{} is not a path under the mount {}",
                p.display(),
                mount.display()
            )));
        }
    }
    let mut progress = Progress {
        start: Instant::now(),
        last: Instant::now(),
        done: Warmed::default(),
    };
    let mut first_error = None;
    for root in &roots {
        walk(root, &mut progress, &mut first_error);
    }
    progress.show(true);
    eprintln!();
    match first_error {
        None => Ok(progress.done),
        Some(e) => Err(DaemonError::Io(format!(
            "{} of {} files could not be fetched (first: {e}); see `stagefs status`: cache.last_error",
            progress.done.failed,
            progress.done.files + progress.done.failed
        ))),
    }
}

/// Warms `path` and, for a folder, everything under it (but the mount's
/// `.stagefs` folder, unless named: snapshots are warmed by their path).
fn walk(path: &Path, progress: &mut Progress, first_error: &mut Option<String>) {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) => {
            progress.done.failed += 1;
            first_error.get_or_insert(format!("{}: {e}", path.display()));
            return;
        }
    };
    if meta.is_dir() {
        let Ok(entries) = std::fs::read_dir(path) else {
            progress.done.failed += 1;
            first_error.get_or_insert(format!("{}: cannot list", path.display()));
            return;
        };
        let mut children: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name() != ".stagefs")
            .map(|e| e.path())
            .collect();
        children.sort();
        for c in children {
            walk(&c, progress, first_error);
        }
        return;
    }
    match xattr_set(path, WARM_XATTR, b"1") {
        Ok(()) => {
            progress.done.files += 1;
            progress.done.bytes += meta.len();
        }
        Err(e) => {
            progress.done.failed += 1;
            first_error.get_or_insert(format!("{}: {e}", path.display()));
        }
    }
    progress.show(false);
}
