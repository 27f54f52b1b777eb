//! Mounting and unmounting as an ordinary user, through the setuid
//! `fusermount3` (issue 13 item 8). fuser 0.18 only falls back to it when
//! `/dev/fuse` opens but `mount(2)` says `EPERM`; where `/dev/fuse` is mode
//! 0600 the open itself fails and fuser gives up, and its other way there
//! (`AutoUnmount`) hangs on unmount (FUSER-NOTES). So a non-root daemon
//! runs `fusermount3 -o OPTIONS -- MOUNTPOINT` itself, receives the
//! `/dev/fuse` descriptor over a socket (`_FUSE_COMMFD`, `SCM_RIGHTS`), and
//! hands it to `fuser::Session::from_fd`; it unmounts with
//! `fusermount3 -u` (lazily with `-z`). Called by [`crate::fuse`].

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

const BIN: &str = "fusermount3";

/// True when this process must mount through `fusermount3` (not root).
pub fn needed() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() != 0 }
}

/// Mounts with `options` (comma-separated, as for `mount -o`) and returns
/// the FUSE device descriptor of the new mount.
pub fn mount(mountpoint: &Path, options: &str) -> io::Result<OwnedFd> {
    let (ours, theirs) = UnixStream::pair()?;
    let theirs_fd = theirs.as_raw_fd();
    let mut cmd = Command::new(BIN);
    cmd.arg("-o")
        .arg(options)
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only an async-signal-safe fcntl between fork and exec: the
    // child keeps its end of the socket across exec.
    unsafe {
        cmd.pre_exec(move || {
            let flags = libc::fcntl(theirs_fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(theirs_fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("running {BIN}: {e}")))?;
    drop(theirs);
    let received = receive_fd(&ours);
    drop(ours);
    let out = child.wait_with_output()?;
    match received {
        Ok(fd) if out.status.success() => Ok(fd),
        _ => Err(io::Error::other(format!(
            "{BIN} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// `fusermount3 -u [-z] MOUNTPOINT`.
pub fn unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let mut cmd = Command::new(BIN);
    cmd.arg("-u").arg("-q");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd
        .arg("--")
        .arg(mountpoint)
        .stdin(Stdio::null())
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    let msg = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    let errno = if msg.contains("busy") {
        libc::EBUSY
    } else if msg.contains("not mounted") || msg.contains("not found in") {
        libc::EINVAL
    } else {
        return Err(io::Error::other(format!("{BIN} -u: {msg}")));
    };
    Err(io::Error::from_raw_os_error(errno))
}

/// Receives one descriptor sent with `SCM_RIGHTS`.
fn receive_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one cmsghdr carrying one int, suitably aligned.
    let mut space = [0u64; 8];
    // SAFETY: msghdr is plain data; zero is a valid empty value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&space) as _;
    loop {
        // SAFETY: msg points at live buffers of the sizes given.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::other("fusermount3 sent no descriptor"));
        }
        break;
    }
    // SAFETY: walking the control buffer recvmsg filled, with the libc macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                return Ok(OwnedFd::from_raw_fd(fd));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Err(io::Error::other("fusermount3 sent no descriptor"))
}
