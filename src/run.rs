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
pub fn run(mount: &Path, at: &str, command: &[OsString]) -> DaemonError {
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
