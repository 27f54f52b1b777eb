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
//! once the session's state is known, mounts a FUSE connection of the
//! session's own on MOUNT there and hands its descriptor to the daemon
//! (`user.stagefs.connection`), which serves state N on it: every name
//! immutable with a long kernel TTL, and in no-open mode, so repeated
//! walks and opens never reach the daemon. Where the daemon cannot take
//! the descriptor (it does not run as root), the state's snapshot
//! directory (`MOUNT/.stagefs/snapshots/N`) is bind-mounted onto MOUNT
//! instead: the same names, but each open asks the daemon. The host and
//! every other process keep the live mount. The namespace's mounts are
//! slaves of the host's: nothing mounted here leaks out.
//!
//! Called by the binary's `run` subcommand only.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use crate::daemon::DaemonError;

const SESSION: &str = "user.stagefs.session";
const CONNECTION: &str = "user.stagefs.connection";

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
        if let Err(e) = show_state(mount, state.trim()) {
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

/// Shows the session's state `state` at `mount` in this process's
/// (private) namespace: on a connection of the session's own, else by a
/// bind mount of the snapshot directory. A working directory inside the
/// mount is entered again so it too shows the state.
fn show_state(mount: &Path, state: &str) -> io::Result<()> {
    let mount = mount.canonicalize()?;
    let cwd = std::env::current_dir().ok();
    if let Err(e) = own_connection(&mount) {
        eprintln!(
            "stagefs: run --private-mount: the daemon cannot serve this session on a \
             connection of its own ({e}); showing state {state} by a bind mount of its \
             snapshot (each open asks the daemon)"
        );
        let snapshot = mount.join(".stagefs").join("snapshots").join(state);
        mount_at(Some(&snapshot), &mount, None, libc::MS_BIND, None)?;
    }
    if let Some(cwd) = cwd.filter(|c| c.starts_with(&mount)) {
        std::env::set_current_dir(cwd)?;
    }
    Ok(())
}

/// Mounts a new FUSE connection on `mount` (this namespace only) with the
/// live mount's owner and `allow_other`, and hands its descriptor to the
/// daemon through the live root, opened before the new mount covers it.
/// Returns once the daemon serves it; on failure nothing stays mounted.
fn own_connection(mount: &Path) -> io::Result<()> {
    let live_root = std::fs::File::open(mount)?;
    let (user_id, group_id, allow_other) = fuse_owner(mount)?;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let data = format!(
        "fd={},rootmode=40000,user_id={user_id},group_id={group_id}{}",
        dev.as_raw_fd(),
        if allow_other { ",allow_other" } else { "" }
    );
    mount_at(
        None,
        mount,
        Some("fuse.stagefs"),
        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_NOATIME,
        Some(&data),
    )?;
    let handed = fxattr_set(
        &live_root,
        CONNECTION,
        dev.as_raw_fd().to_string().as_bytes(),
    );
    // The daemon holds its own copy of the descriptor now (or none).
    drop(dev);
    if let Err(e) = handed {
        let path = cstr(mount.as_os_str().as_bytes())?;
        // SAFETY: NUL-terminated path. Detached: nothing has used it.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        return Err(e);
    }
    if let Ok(md) = std::fs::metadata(mount) {
        crate::fuse::raise_readahead(md.dev());
    }
    Ok(())
}

/// The `user_id`, `group_id` and `allow_other` of the FUSE mount at
/// `mount` (the newest mount there), from `/proc/self/mountinfo`.
fn fuse_owner(mount: &Path) -> io::Result<(u32, u32, bool)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let want = mount.as_os_str().as_bytes();
    let line = info
        .lines()
        .rfind(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|p| unescape_mountinfo(p) == want)
        })
        .ok_or_else(|| io::Error::other(format!("{} is not in mountinfo", mount.display())))?;
    // After the separator: fs type, source, super options.
    let options = line
        .split(" - ")
        .nth(1)
        .and_then(|rest| rest.split(' ').nth(2))
        .unwrap_or("");
    let (mut user, mut group, mut allow_other) = (None, None, false);
    for option in options.split(',') {
        match option.split_once('=') {
            Some(("user_id", v)) => user = v.parse().ok(),
            Some(("group_id", v)) => group = v.parse().ok(),
            _ => allow_other |= option == "allow_other",
        }
    }
    match (user, group) {
        (Some(u), Some(g)) => Ok((u, g, allow_other)),
        _ => Err(io::Error::other(format!(
            "{} is not a FUSE mount (options {options:?})",
            mount.display()
        ))),
    }
}

/// A mountinfo path field: space, tab, newline and backslash are octal
/// escapes there.
fn unescape_mountinfo(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// `mount(2)` with optional source, type and data.
fn mount_at(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = source.map(|s| cstr(s.as_os_str().as_bytes())).transpose()?;
    let target = cstr(target.as_os_str().as_bytes())?;
    let fstype = fstype.map(|t| cstr(t.as_bytes())).transpose()?;
    let data = data.map(|d| cstr(d.as_bytes())).transpose()?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: NUL-terminated strings or null, as mount(2) allows for each.
    let rc = unsafe {
        libc::mount(
            source.as_ref().map_or(c"stagefs".as_ptr(), |s| s.as_ptr()),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
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

fn fxattr_set(file: &std::fs::File, name: &str, value: &[u8]) -> io::Result<()> {
    let n = cstr(name.as_bytes())?;
    // SAFETY: an open descriptor, a NUL-terminated name and `value.len()`
    // readable bytes.
    let rc = unsafe {
        libc::fsetxattr(
            file.as_raw_fd(),
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

#[cfg(test)]
mod tests {
    use super::unescape_mountinfo;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mountinfo("/mnt/a\\040b"), b"/mnt/a b");
        assert_eq!(unescape_mountinfo("/m\\134n\\011t\\012"), b"/m\\n\tt\n");
        // Not an escape: kept as it is.
        assert_eq!(unescape_mountinfo("/a\\09x\\"), b"/a\\09x\\");
    }
}
