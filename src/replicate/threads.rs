//! How the pipeline's threads run: supervised (a panic stops the pipeline
//! and shows in status, never silently) and at their CPU priority
//! ([`Cpu`]: ingest in the foreground, staging, fetches and GC below it,
//! checkpoints lowest).
//!
//! Used by [`super::Replica::start`] for every pipeline thread and by the
//! fetch pool for its workers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use tracing::{error, warn};

use crate::status::{Progress, Stall};

/// Starts a pipeline thread whose panic is never silent: it is logged, the
/// status shows it as `stalled` for good, and the whole pipeline stops
/// (`stop`), so replication rests at the visible state (the mount keeps
/// serving it) until a restart, rather than running on with a part missing.
pub(super) fn spawn_supervised(
    name: &str,
    cpu: Cpu,
    f: Box<dyn FnOnce() + Send>,
    progress: &Arc<Progress>,
    stop: &Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    let (progress, stop, thread) = (Arc::clone(progress), Arc::clone(stop), name.to_owned());
    std::thread::Builder::new().name(name.to_owned()).spawn(move || {
        cpu.apply(&thread);
        let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) else {
            return;
        };
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_owned());
        let reason = format!(
            "internal error: the {thread} thread panicked ({what}); replication stopped at the visible state until stagefs is restarted"
        );
        error!(%reason, "a replication thread panicked");
        progress.set_failure(Stall {
            state_id: None,
            reason,
            file: None,
            line: None,
        });
        stop.store(true, Ordering::SeqCst);
    })
}

/// How a pipeline thread shares the CPU with the process's other threads.
#[derive(Clone, Copy, Debug)]
pub(super) enum Cpu {
    /// Ingest: what the source logged is journaled first, at the source's
    /// pace (a Hive backlog before the metastore's cleaner drops it).
    Foreground,
    /// Work that can wait a moment: the stager, its fetch threads and GC
    /// ([`BACKGROUND_NICE`] above the thread that started the replica),
    /// checkpoints (19). While ingest catches up on a backlog, or the FUSE
    /// threads serve readers, they take the CPU left over; on an idle CPU
    /// they run as fast as ever. Nice values are per thread on Linux;
    /// under autogroups (the default) or a cgroup of its own they weigh
    /// only against stagefs's own threads.
    Background(libc::c_int),
}

/// How much lower the background threads' priority is: nice +10 gives a
/// thread ~1/10 of a normal thread's share of a CPU both want (CFS
/// weights 110 vs 1,024), never none.
pub(super) const BACKGROUND_NICE: libc::c_int = 10;

impl Cpu {
    /// [`Cpu::Background`] `by` above the calling thread's nice value
    /// (at most 19, the lowest priority).
    pub(super) fn below(by: libc::c_int) -> Cpu {
        // SAFETY: `__errno_location` is this thread's errno; `getpriority`
        // returns -1 both for nice -1 and for an error, which errno tells
        // apart. With `who` 0 it reads the calling thread (per thread on
        // Linux).
        let now = unsafe {
            *libc::__errno_location() = 0;
            let n = libc::getpriority(libc::PRIO_PROCESS, 0);
            if n == -1 && *libc::__errno_location() != 0 {
                0
            } else {
                n
            }
        };
        Cpu::Background((now + by).min(19))
    }

    /// Gives the calling thread this priority. Failing (a sandbox that
    /// forbids it) only costs speed: logged, not fatal.
    fn apply(self, thread: &str) {
        let Cpu::Background(nice) = self else {
            return;
        };
        // SAFETY: with `who` 0, setpriority changes only the calling
        // thread's nice value (Linux keeps it per thread).
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
            let e = std::io::Error::last_os_error();
            warn!(thread, nice, error = %e, "could not lower the thread's CPU priority; it competes with ingest as an equal");
        }
    }
}
