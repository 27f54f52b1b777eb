//! `stagefs` as a mount helper, so that an `/etc/fstab` line mounts it:
//!
//! ```text
//! /etc/stagefs/replica.toml  /mnt/warehouse  fuse.stagefs  allow_other,metrics=127.0.0.1:9464,_netdev  0 0
//! ```
//!
//! `mount` runs `/sbin/mount.fuse.stagefs` when there is one (a symlink to
//! `stagefs`), else fuse3's `mount.fuse`, which runs `stagefs SOURCE
//! MOUNTPOINT -o OPTIONS`; both end here as `SOURCE MOUNTPOINT [-o OPTIONS]`
//! (the `stagefs#SOURCE` form of type `fuse` too). The SOURCE is the config
//! file (`--config`), or `stagefs` / `none` for a line that gives every
//! option itself.
//!
//! Options map to `stagefs mount` flags: `key=value` is `--key=value`, a
//! bare `key` is the switch `--key`, `_` and `-` alike (`allow_other`,
//! `source-map=…` repeated for each map). The generic mount options
//! (`rw`, `noauto`, `_netdev`, `nofail`, `x-systemd.*`, …) are for mount
//! and systemd and are left out; an option that is neither is refused,
//! naming it. One option is the helper's own: `log=FILE`, where the
//! daemon's log goes once it runs detached (else nowhere).
//!
//! Daemonizing: the helper starts `stagefs mount` in a session of its own
//! and waits for its `READY=1` (the systemd readiness message, sent to a
//! socket of the helper's) — the mount answers then — and exits 0, the
//! daemon left running; if the daemon exits first, the helper relays its
//! error and exits with its status, so `mount -a` reports the failure.
//! Until ready the daemon's stderr is relayed; it switches to `log=FILE`
//! (or `/dev/null`) just before `READY=1` ([`detach_stderr`]), so nothing is
//! ever written to a pipe nobody reads.
//!
//! Called by the binary before its own parsing ([`invoked_as_helper`]);
//! the daemon calls [`detach_stderr`].

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Where the daemon's stderr goes once it is ready (set by the helper).
pub const STDERR_AFTER_READY_ENV: &str = "STAGEFS_STDERR_AFTER_READY";

/// Options that concern mount(8), fuse3's helper or systemd, not stagefs.
const GENERIC: &[&str] = &[
    "rw",
    "ro",
    "defaults",
    "auto",
    "noauto",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "_netdev",
    "nofail",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "atime",
    "noatime",
    "diratime",
    "nodiratime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "lazytime",
    "nolazytime",
    "sync",
    "async",
    "dirsync",
    "silent",
    "loud",
    "mand",
    "nomand",
];

/// Why a helper invocation was refused.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error("mount helper: {0}")]
    Usage(String),
    #[error("mount helper: {0}")]
    Io(String),
}

/// True when `argv` is a mount helper's call: the program is named
/// `mount.stagefs` / `mount.fuse.stagefs`, or the first argument is no
/// subcommand and no flag, and `-o` or an existing config file follows
/// (`stagefs SOURCE MOUNTPOINT -o …` from fuse3's `mount.fuse`).
pub fn invoked_as_helper(argv: &[OsString], subcommands: &[&str]) -> bool {
    let program = argv
        .first()
        .and_then(|p| Path::new(p).file_name())
        .map(|n| n.as_bytes().starts_with(b"mount."))
        .unwrap_or(false);
    if program {
        return true;
    }
    let Some(first) = argv.get(1) else {
        return false;
    };
    let first_str = first.to_string_lossy();
    if first_str.starts_with('-') || subcommands.contains(&first_str.as_ref()) {
        return false;
    }
    argv.len() >= 3 && (argv.iter().any(|a| a == "-o") || Path::new(first).is_file())
}

/// A parsed helper call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperCall {
    /// `stagefs mount …` arguments (without the program).
    pub mount_args: Vec<OsString>,
    /// `log=FILE`.
    pub log: Option<PathBuf>,
}

/// Parses `SOURCE MOUNTPOINT [-o OPTS]... [-t TYPE] [-n] [-s] [-f] [-v]`
/// (after the program name). `is_flag(key)` says whether `--key` is a
/// `stagefs mount` option.
pub fn parse(args: &[OsString], is_flag: &dyn Fn(&str) -> bool) -> Result<HelperCall, HelperError> {
    let usage = |why: String| HelperError::Usage(why);
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let bytes = arg.as_bytes();
        match bytes {
            b"-o" => {
                let value = it
                    .next()
                    .ok_or_else(|| usage("-o without options".into()))?;
                options.push(value.to_string_lossy().into_owned());
            }
            _ if bytes.starts_with(b"-o") => {
                options.push(String::from_utf8_lossy(&bytes[2..]).into_owned())
            }
            // mount(8)'s: the type (known), no mtab, sloppy, fake, verbose.
            b"-t" => {
                it.next();
            }
            b"-n" | b"-s" | b"-f" | b"-v" | b"-r" | b"-w" => {}
            _ if bytes.starts_with(b"-") => {
                return Err(usage(format!("unknown argument {}", arg.to_string_lossy())))
            }
            _ => positional.push(arg.clone()),
        }
    }
    let [source, mountpoint] = positional.as_slice() else {
        return Err(usage(
            "expected SOURCE MOUNTPOINT [-o OPTIONS] (SOURCE: a config file, or `stagefs`)".into(),
        ));
    };
    let mut mount_args: Vec<OsString> = vec!["mount".into(), mountpoint.clone()];
    // `stagefs#SOURCE` (type `fuse`): the part after `#`.
    let source = match source.as_bytes().iter().position(|&b| b == b'#') {
        Some(at) => OsStr::from_bytes(&source.as_bytes()[at + 1..]).to_owned(),
        None => source.clone(),
    };
    if !["", "stagefs", "none"].contains(&source.to_string_lossy().as_ref()) {
        if !Path::new(&source).is_file() {
            return Err(usage(format!(
                "SOURCE {} is no config file (give one, or `stagefs` with every option in -o)",
                source.to_string_lossy()
            )));
        }
        mount_args.push("--config".into());
        mount_args.push(source);
    }
    let mut log = None;
    for option in options.iter().flat_map(|o| o.split(',')) {
        let (key, value) = match option.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (option, None),
        };
        if key.is_empty() || GENERIC.contains(&key) || key.starts_with("x-") || key == "comment" {
            continue;
        }
        if key == "log" {
            let file = value.filter(|v| !v.is_empty());
            log = Some(PathBuf::from(
                file.ok_or_else(|| usage("log= needs a file".into()))?,
            ));
            continue;
        }
        let flag = key.replace('_', "-");
        if !is_flag(&flag) {
            return Err(usage(format!(
                "option `{option}` is neither a `stagefs mount` flag (--{flag}) nor a generic mount option"
            )));
        }
        mount_args.push(match value {
            Some(v) => format!("--{flag}={v}").into(),
            None => format!("--{flag}").into(),
        });
    }
    Ok(HelperCall { mount_args, log })
}

/// Starts `stagefs mount` detached and waits until it is mounted (Ok) or
/// has exited (Err with its status). `exe` is this program.
pub fn run(exe: &Path, call: &HelperCall) -> Result<(), (i32, HelperError)> {
    let io = |what: &str, e: std::io::Error| (1, HelperError::Io(format!("{what}: {e}")));
    let dir = tempfile::Builder::new()
        .prefix("stagefs-mount-")
        .tempdir()
        .map_err(|e| io("a temp dir for the readiness socket", e))?;
    let socket_path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&socket_path).map_err(|e| io("the readiness socket", e))?;
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .map_err(|e| io("the readiness socket", e))?;
    let after_ready = call
        .log
        .clone()
        .unwrap_or_else(|| PathBuf::from("/dev/null"));
    let mut command = Command::new(exe);
    command
        .args(&call.mount_args)
        .env("NOTIFY_SOCKET", &socket_path)
        .env(STDERR_AFTER_READY_ENV, &after_ready)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only setsid between fork and exec: the daemon leaves the
    // caller's session, so a hang-up of mount's terminal does not end it.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| io(&format!("starting {}", exe.display()), e))?;
    // Relay the daemon's stderr until it detaches it (or exits).
    let relay = child.stderr.take().map(|mut pipe| {
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let _ = std::io::stderr().write_all(&buf[..n]);
            }
        })
    });
    let mut buf = [0u8; 1024];
    loop {
        match socket.recv(&mut buf) {
            Ok(n) if buf[..n].split(|&b| b == b'\n').any(|l| l == b"READY=1") => {
                // The daemon stays: its stderr is the log file now.
                return Ok(());
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(io("the readiness socket", e)),
        }
        if let Some(status) = child
            .try_wait()
            .map_err(|e| io("waiting for the daemon", e))?
        {
            if let Some(relay) = relay {
                let _ = relay.join();
            }
            let code = status.code().unwrap_or(1).max(1);
            return Err((
                code,
                HelperError::Io(format!("stagefs mount exited ({status}) before mounting")),
            ));
        }
    }
}

/// In a daemon a mount helper started: points stderr at the file the
/// helper named, before `READY=1` lets the helper exit. A file that cannot
/// be opened leaves stderr as it is (and says so there).
pub fn detach_stderr() {
    let Some(target) = std::env::var_os(STDERR_AFTER_READY_ENV) else {
        return;
    };
    let opened = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&target);
    match opened {
        Ok(file) => {
            // SAFETY: dup2 of an open descriptor onto stderr.
            if unsafe { libc::dup2(file.as_raw_fd(), libc::STDERR_FILENO) } < 0 {
                tracing::warn!(
                    "cannot send the log to {}: {}",
                    Path::new(&target).display(),
                    std::io::Error::last_os_error()
                );
            }
        }
        Err(e) => tracing::warn!(
            "cannot open the log file {}: {e}",
            Path::new(&target).display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn flags(key: &str) -> bool {
        ["allow-other", "metrics", "source-map", "state", "retain"].contains(&key)
    }

    #[test]
    fn options_map_to_flags_and_generic_ones_are_left_out() {
        let call = parse(
            &os(&[
                "stagefs",
                "/mnt/w",
                "-o",
                "rw,noauto,_netdev,x-systemd.automount,allow_other,state=/var/lib/s",
                "-o",
                "source-map=hdfs://nn/w=/srv/w,source_map=hdfs://nn/x=/srv/x,log=/var/log/s.log",
                "-n",
            ]),
            &flags,
        )
        .unwrap();
        assert_eq!(
            call.mount_args,
            os(&[
                "mount",
                "/mnt/w",
                "--allow-other",
                "--state=/var/lib/s",
                "--source-map=hdfs://nn/w=/srv/w",
                "--source-map=hdfs://nn/x=/srv/x",
            ])
        );
        assert_eq!(call.log, Some(PathBuf::from("/var/log/s.log")));
    }

    #[test]
    fn the_source_is_a_config_file_and_unknown_options_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("r.toml");
        std::fs::write(&conf, "").unwrap();
        let source = format!("stagefs#{}", conf.display());
        let call = parse(&os(&[&source, "/mnt/w"]), &flags).unwrap();
        assert_eq!(
            call.mount_args,
            vec![
                OsString::from("mount"),
                "/mnt/w".into(),
                "--config".into(),
                conf.clone().into()
            ]
        );
        let err = parse(&os(&["stagefs", "/mnt/w", "-o", "colour=red"]), &flags).unwrap_err();
        assert!(err.to_string().contains("`colour=red`"), "{err}");
        let err = parse(&os(&["/nowhere.toml", "/mnt/w"]), &flags).unwrap_err();
        assert!(err.to_string().contains("/nowhere.toml"), "{err}");
        assert!(parse(&os(&["stagefs"]), &flags).is_err());
    }

    #[test]
    fn helper_calls_are_told_from_ordinary_ones() {
        let subs = ["mount", "check"];
        assert!(invoked_as_helper(
            &os(&["/sbin/mount.fuse.stagefs", "x", "/m"]),
            &subs
        ));
        assert!(invoked_as_helper(
            &os(&["stagefs", "stagefs", "/m", "-o", "rw"]),
            &subs
        ));
        assert!(!invoked_as_helper(
            &os(&["stagefs", "mount", "/m", "-o", "rw"]),
            &subs
        ));
        assert!(!invoked_as_helper(&os(&["stagefs", "--help"]), &subs));
        assert!(!invoked_as_helper(&os(&["stagefs", "mout", "/m"]), &subs));
    }
}
