//! Signs of progress of the copies on a thread, for whoever watches that
//! thread: the fetch pool abandons an attempt that gave none for its
//! timeout (`replicate::fetch`). The copy loops call [`heartbeat`]
//! after every chunk read, copied or hashed, so a large file read slowly
//! but steadily never times out.

use std::sync::Arc;

/// Whoever watches the copies on a thread for signs of progress (the
/// fetch pool's deadline, `replicate::fetch`).
pub trait ProgressWatch: Send + Sync {
    /// A chunk was read, copied or hashed.
    fn beat(&self);
}

thread_local! {
    /// The watch of the copies on this thread, if any.
    static WATCH: std::cell::RefCell<Option<Arc<dyn ProgressWatch>>> =
        const { std::cell::RefCell::new(None) };
}

/// Makes `watch` hear the [`heartbeat`]s of the copies on this thread
/// (`None`: nobody).
pub fn watch_this_thread(watch: Option<Arc<dyn ProgressWatch>>) {
    WATCH.with(|w| *w.borrow_mut() = watch);
}

/// Tells the watch of this thread that the copy is making progress (a
/// chunk was read, copied or hashed). A no-op on a thread nobody watches.
pub fn heartbeat() {
    WATCH.with(|w| {
        if let Some(watch) = w.borrow().as_ref() {
            watch.beat();
        }
    });
}
