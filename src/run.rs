//! `stagefs run MOUNT [--at STATE|visible] -- COMMAND [ARGS...]` (SPEC §6):
//! COMMAND and every process it starts see one state of the whole mount.
//!
//! The wrapper asks the daemon for a session by setting the root's
//! `user.stagefs.session` to the state (the daemon names this process as
//! the session's leader by pid and start time, holds the state durably
//! like a pin, and answers this process's `user.stagefs.state_id` with
//! it), puts `STAGEFS_STATE_ID` in the environment and then *executes*
//! COMMAND in its own place: COMMAND keeps the leader's pid, so stdin,
//! stdout, stderr, signals and the exit status are COMMAND's own, with
//! nothing in between. The daemon ends the session when that process has
//! exited (killed with -9 included), at its next maintenance pass.
//!
//! With `--private-mount` the wrapper first moves into a mount namespace
//! of its own (`unshare(CLONE_NEWNS)`, root or `CAP_SYS_ADMIN` only) and,
//! once the session's state is known, bind-mounts the state's snapshot
//! directory (`MOUNT/.stagefs/snapshots/N`) onto MOUNT there. Every name
//! COMMAND resolves from MOUNT is then an immutable snapshot name with a
//! long kernel TTL, so repeated walks never reach the daemon; the host and
//! every other process keep the live mount. The namespace's mounts are
//! slaves of the host's: nothing mounted here leaks out, and an unmount of
//! the host's mount reaches in.
//!
//! Called by the binary's `run` subcommand only.

use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use crate::daemon::DaemonError;

const SESSION: &str = "user.stagefs.session";

/// Opens a session on `mount` at `at` (`"visible"` or a decimal state-id)
/// and executes `command`; returns only on a usage or mount error (exit 2).
/// When COMMAND cannot be executed, exits 127 (not found) or 126.
pub fn run(mount: &Path, at: &str, private_mount: bool, command: &[OsString]) -> DaemonError {
    let Some((program, args)) = command.split_first() else {
        return DaemonError::Usage("run: give a COMMAND after `--`".into());
    };
    if at != "visible" && (at.is_empty() || !at.bytes().all(|b| b.is_ascii_digit())) {
        return DaemonError::Usage(format!(
            "run: --at takes a decimal state-id or `visible`, not {at:?}"
        ));
    }
    if let Err(e) = xattr_get(mount, "user.stagefs.visible") {
        return DaemonError::Usage(format!(
            "{} is not a running stagefs mount ({e})",
            mount.display()
        ));
    }
    // Before the session exists, so a caller that may not do this gets a
    // usage error and no session.
    if private_mount {
        if let Err(e) = own_mount_namespace() {
            return DaemonError::Usage(format!(
                "run --private-mount: a mount namespace of its own needs root or \
                 CAP_SYS_ADMIN ({e})"
            ));
        }
    }
    if let Err(e) = xattr_set(mount, SESSION, at.as_bytes()) {
        return DaemonError::Usage(match e.raw_os_error() {
            Some(libc::EINVAL) => format!(
                "state {at} is not retained at {} (see `stagefs status`: retained)",
                mount.display()
            ),
            Some(libc::EPERM) => format!(
                "the stagefs daemon of {} cannot see this process (another pid namespace?)",
                mount.display()
            ),
            _ => format!("opening a session on {}: {e}", mount.display()),
        });
    }
    let state = match xattr_get(mount, "user.stagefs.state_id") {
        Ok(s) => s,
        Err(e) => return DaemonError::Io(format!("reading the session's state: {e}")),
    };
    if private_mount {
        if let Err(e) = show_snapshot(mount, state.trim()) {
            return DaemonError::Io(format!(
                "run --private-mount: showing state {} at {}: {e}",
                state.trim(),
                mount.display()
            ));
        }
    }
    let err = Command::new(program)
        .args(args)
        .env("STAGEFS_STATE_ID", state.trim())
        .exec();
    // As a shell does: 127 for a command not found, 126 for one that
    // cannot be executed (the session ends with this process).
    eprintln!("stagefs: running {}: {err}", program.to_string_lossy());
    let code = if err.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    std::process::exit(code)
}

/// Moves this process into a new mount namespace whose mounts are slaves
/// of the host's (mounts made here never propagate out).
fn own_mount_namespace() -> io::Result<()> {
    // SAFETY: plain syscalls with constant arguments.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let root = cstr(b"/")?;
    // SAFETY: NUL-terminated path; null source, type and data are allowed
    // for a propagation change.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Bind-mounts state `state`'s snapshot directory onto `mount` in this
/// process's (private) namespace; a working directory inside the mount is
/// entered again so it too shows the snapshot.
fn show_snapshot(mount: &Path, state: &str) -> io::Result<()> {
    let mount = mount.canonicalize()?;
    let snapshot = mount.join(".stagefs").join("snapshots").join(state);
    let cwd = std::env::current_dir().ok();
    let (src, dst) = (
        cstr(snapshot.as_os_str().as_bytes())?,
        cstr(mount.as_os_str().as_bytes())?,
    );
    // SAFETY: NUL-terminated paths; a bind mount takes no type or data.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if let Some(cwd) = cwd.filter(|c| c.starts_with(&mount)) {
        std::env::set_current_dir(cwd)?;
    }
    Ok(())
}

fn cstr(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

pub(crate) fn xattr_get(path: &Path, name: &str) -> io::Result<String> {
    let (p, n) = (cstr(path.as_os_str().as_bytes())?, cstr(name.as_bytes())?);
    let mut buf = vec![0u8; 64];
    // SAFETY: NUL-terminated strings and a buffer of `len` writable bytes.
    let rc = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(rc as usize);
    String::from_utf8(buf).map_err(io::Error::other)
}

pub(crate) fn xattr_set(path: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let (p, n) = (cstr(path.as_os_str().as_bytes())?, cstr(name.as_bytes())?);
    // SAFETY: NUL-terminated strings and `value.len()` readable bytes.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
