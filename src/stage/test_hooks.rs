//! Failures injected by the stage tests (compiled in tests only).

use std::cell::{Cell, RefCell};
use std::path::Path;
use std::sync::Mutex;

use crate::event::BlobId;

thread_local! {
    static WRITE_ERRNO: Cell<Option<i32>> = const { Cell::new(None) };
    static AFTER_PIECE: RefCell<Option<Box<dyn FnMut()>>> = const { RefCell::new(None) };
}

/// Runs `f` on this thread after every piece `copy_in_kernel` copies
/// past the first (None: no longer).
pub fn after_each_piece(f: Option<Box<dyn FnMut()>>) {
    AFTER_PIECE.with(|c| *c.borrow_mut() = f);
}

pub fn piece_copied() {
    AFTER_PIECE.with(|c| {
        if let Some(f) = c.borrow_mut().as_mut() {
            f();
        }
    });
}

/// Makes every temp-file write on this thread fail with `errno`.
pub fn inject_write_errno(errno: Option<i32>) {
    WRITE_ERRNO.with(|c| c.set(errno));
}

pub fn injected_write_errno() -> Option<i32> {
    WRITE_ERRNO.with(|c| c.get())
}

/// Every `syncfs` of a blob store fails with the errno while set (all
/// threads: a test running meanwhile takes the per-copy way, with the
/// same result).
static SYNCFS_ERRNO: Mutex<Option<i32>> = Mutex::new(None);

pub fn inject_syncfs_errno(errno: Option<i32>) {
    *SYNCFS_ERRNO.lock().unwrap_or_else(|p| p.into_inner()) = errno;
}

pub fn injected_syncfs_errno() -> Option<i32> {
    *SYNCFS_ERRNO.lock().unwrap_or_else(|p| p.into_inner())
}

/// Temp files of these blobs fail `sync_data` with the errno, on every
/// thread (publish syncs on its own threads). Keyed by blob, so tests
/// running in parallel do not see each other's failures.
static SYNC_ERRNO: Mutex<Vec<(BlobId, i32)>> = Mutex::new(Vec::new());

pub fn inject_sync_errno(id: BlobId, errno: i32) {
    SYNC_ERRNO
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((id, errno));
}

pub fn injected_sync_errno(temp: &Path) -> Option<i32> {
    let name = temp.file_name()?.to_str()?;
    SYNC_ERRNO
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(id, _)| name.starts_with(&id.to_hex()))
        .map(|(_, errno)| *errno)
}
