//! stagefs mounted by an ordinary user keeps its contract (issue 13 item 8,
//! docs/SEMANTICS.md "Permissions"): the mount goes through `fusermount3`
//! (here `/dev/fuse` is 0600), the mounting user pins, creating a file is
//! `EROFS` (not the kernel's `EACCES` from the modes), another user may read
//! with `--allow-other` but not pin (`EPERM`), and SIGTERM unmounts and exits 0.
//!
//! Runs as root (CI) and starts the daemon as the user `stagefs-test`, which
//! scripts/setup.sh creates (with `user_allow_other` in /etc/fuse.conf);
//! the other user is `nobody`.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use stagefs::testkit::checker::{detach, is_mounted};

struct User {
    uid: u32,
    gid: u32,
}

fn user(name: &str) -> User {
    let c = CString::new(name).unwrap();
    // SAFETY: a valid NUL-terminated name; the result is read at once.
    let pw = unsafe { libc::getpwnam(c.as_ptr()) };
    assert!(
        !pw.is_null(),
        "user {name} is missing: run scripts/setup.sh (as root) first"
    );
    // SAFETY: non-null getpwnam result.
    unsafe {
        User {
            uid: (*pw).pw_uid,
            gid: (*pw).pw_gid,
        }
    }
}

fn chown_tree(path: &Path, u: &User) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::lchown(c.as_ptr(), u.uid, u.gid) }, 0);
    if path.is_dir() && !path.is_symlink() {
        for e in std::fs::read_dir(path).unwrap() {
            chown_tree(&e.unwrap().path(), u);
        }
    }
}

/// Runs `cmd args` as `u`, returning its output.
fn run_as(u: &User, cmd: &str, args: &[&std::ffi::OsStr]) -> Output {
    Command::new(cmd)
        .args(args)
        .uid(u.uid)
        .gid(u.gid)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {cmd}: {e}"))
}

/// `setfattr -n user.stagefs.pin -v VALUE PATH` as `u`.
fn set_pin(u: &User, path: &Path, value: &str) -> Output {
    run_as(
        u,
        "setfattr",
        &[
            os("-n"),
            os("user.stagefs.pin"),
            os("-v"),
            os(value),
            path.as_os_str(),
        ],
    )
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The daemon run as the ordinary user; dropping it stops it and detaches
/// whatever mount is left (root may).
struct Daemon {
    child: Option<Child>,
    mnt: PathBuf,
    log: PathBuf,
}

impl Daemon {
    fn start(u: &User, mnt: &Path, flags: &[&str], log: &Path) -> Daemon {
        let out = std::fs::File::create(log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_stagefs"))
            .arg("mount")
            .arg(mnt)
            .args(flags)
            .uid(u.uid)
            .gid(u.gid)
            .env("STAGEFS_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap();
        let mut d = Daemon {
            child: Some(child),
            mnt: mnt.to_owned(),
            log: log.to_owned(),
        };
        let start = Instant::now();
        while !is_mounted(mnt) {
            if let Some(status) = d.child.as_mut().unwrap().try_wait().unwrap() {
                d.child = None;
                panic!(
                    "the daemon exited with {status} before mounting:\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no mount after 20 s:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    /// SIGTERM; true when it exited 0 within 10 s with the mount gone.
    fn terminate(&mut self) -> bool {
        let mut child = self.child.take().unwrap();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.success() && !is_mounted(&self.mnt);
            }
            if start.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            std::thread::sleep(Duration::from_millis(500));
            let _ = c.kill();
            let _ = c.wait();
        }
        if is_mounted(&self.mnt) {
            detach(&self.mnt);
        }
    }
}

/// A warehouse with one table holding one file, owned by `u`.
struct Warehouse {
    dir: tempfile::TempDir,
    content: Vec<u8>,
}

impl Warehouse {
    fn new(u: &User) -> Warehouse {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in ["source/db/t/p=a", "events", "cm", "mnt"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let content = b"rows written by the source\n".to_vec();
        std::fs::write(root.join("source/db/t/p=a/f"), &content).unwrap();
        let sha: String = Sha256::digest(&content)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let log = [
            r#"{"id": 1, "op": "create_database", "db": "db"}"#.to_owned(),
            r#"{"id": 2, "op": "create_table", "db": "db", "table": "t", "partition_keys": ["p"]}"#
                .to_owned(),
            format!(
                r#"{{"id": 3, "op": "add_files", "db": "db", "table": "t", "partition": {{"p": "a"}}, "files": [{{"path": "db/t/p=a/f", "size": {}, "sha256": "{sha}"}}]}}"#,
                content.len()
            ),
        ];
        std::fs::write(root.join("events/log-000001.jsonl"), log.join("\n") + "\n").unwrap();
        chown_tree(root, u);
        Warehouse { dir, content }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn flags(&self) -> Vec<String> {
        let p = |r: &str| self.path(r).to_string_lossy().into_owned();
        vec![
            "--state".into(),
            p("state"),
            "--source-root".into(),
            p("source"),
            "--events".into(),
            p("events"),
            "--cm-root".into(),
            p("cm"),
        ]
    }
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

/// The daemon of `w` as `owner` with `--allow-other`, once it shows
/// state 3.
fn start_allowing_others(owner: &User, w: &Warehouse) -> Daemon {
    let mut flags = w.flags();
    flags.push("--allow-other".into());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mnt = w.path("mnt");
    let d = Daemon::start(owner, &mnt, &flags, &w.path("daemon.log"));
    wait_visible_as(owner, &mnt, &d);
    d
}

/// Waits until `u` reads `user.stagefs.visible` = 3 on the mount root.
fn wait_visible_as(u: &User, mnt: &Path, d: &Daemon) {
    let start = Instant::now();
    loop {
        let o = run_as(
            u,
            "getfattr",
            &[
                os("--only-values"),
                os("-n"),
                os("user.stagefs.visible"),
                mnt.as_os_str(),
            ],
        );
        if o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "3" {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "visible never reached 3: {}\n{}",
            stderr(&o),
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ordinary_user_mounts_pins_gets_erofs_and_stops_cleanly_on_sigterm() {
    let owner = user("stagefs-test");
    let w = Warehouse::new(&owner);
    let mnt = w.path("mnt");
    let flags = w.flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut d = Daemon::start(&owner, &mnt, &flags, &w.path("daemon.log"));
    wait_visible_as(&owner, &mnt, &d);
    let file = mnt.join("db/t/p=a/f");
    let cat = run_as(&owner, "cat", &[file.as_os_str()]);
    assert!(cat.status.success(), "{}", stderr(&cat));
    assert_eq!(cat.stdout, w.content);

    // The mounting user pins (no default_permissions: the daemon decides).
    let table = mnt.join("db/t");
    let pin = set_pin(&owner, &table, "visible");
    assert!(
        pin.status.success(),
        "pin by the mounting user: {}",
        stderr(&pin)
    );
    let unpin = run_as(
        &owner,
        "setfattr",
        &[os("-x"), os("user.stagefs.pin"), table.as_os_str()],
    );
    assert!(unpin.status.success(), "unpin: {}", stderr(&unpin));

    // Creating a file is EROFS, as for root, not EACCES from the modes.
    let created = table.join("new");
    let touch = run_as(&owner, "touch", &[created.as_os_str()]);
    assert!(!touch.status.success());
    assert!(
        stderr(&touch).contains("Read-only file system"),
        "touch: {}",
        stderr(&touch)
    );
    let mkdir = run_as(&owner, "mkdir", &[mnt.join("db/x").as_os_str()]);
    assert!(
        stderr(&mkdir).contains("Read-only file system"),
        "mkdir: {}",
        stderr(&mkdir)
    );
    // Without --allow-other no other user gets in at all.
    let nobody = user("nobody");
    let other = run_as(&nobody, "cat", &[file.as_os_str()]);
    assert!(
        !other.status.success(),
        "another user read without --allow-other"
    );

    assert!(
        d.terminate(),
        "SIGTERM: clean exit 0 and unmounted:\n{}",
        d.log()
    );
}

#[test]
fn with_allow_other_another_user_reads_but_cannot_pin() {
    let owner = user("stagefs-test");
    let nobody = user("nobody");
    let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
    assert!(
        conf.lines().any(|l| l.trim() == "user_allow_other"),
        "/etc/fuse.conf lacks user_allow_other: run scripts/setup.sh (as root) first"
    );
    let w = Warehouse::new(&owner);
    let mnt = w.path("mnt");
    // `nobody` must be able to reach the mountpoint.
    for p in [w.dir.path().to_owned(), mnt.clone()] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut d = start_allowing_others(&owner, &w);
    let file = mnt.join("db/t/p=a/f");
    let cat = run_as(&nobody, "cat", &[file.as_os_str()]);
    assert!(cat.status.success(), "another user reads: {}", stderr(&cat));
    assert_eq!(cat.stdout, w.content);
    let table = mnt.join("db/t");
    for target in [&table, &mnt] {
        let pin = set_pin(&nobody, target, "visible");
        assert!(!pin.status.success(), "another user pinned");
        assert!(
            stderr(&pin).contains("Operation not permitted"),
            "pin by another user: {}",
            stderr(&pin)
        );
    }
    let touch = run_as(&nobody, "touch", &[table.join("new").as_os_str()]);
    assert!(
        stderr(&touch).contains("Read-only file system"),
        "touch: {}",
        stderr(&touch)
    );
    // The owner still pins, and nobody's attempt changed nothing.
    let pins = run_as(
        &owner,
        "getfattr",
        &[os("-n"), os("user.stagefs.pin"), table.as_os_str()],
    );
    assert!(!pins.status.success(), "a pin was set by another user");
    let pin = set_pin(&owner, &mnt, "visible");
    assert!(pin.status.success(), "owner pin: {}", stderr(&pin));
    assert!(
        d.terminate(),
        "SIGTERM: clean exit 0 and unmounted:\n{}",
        d.log()
    );
}

/// `stagefs run --private-mount` by root on a mount whose daemon is an
/// ordinary user: the daemon may not take the session's FUSE descriptor
/// out of a root process, so the wrapper says so and shows the state by a
/// bind mount of its snapshot instead; the job still reads its state.
#[test]
fn a_private_session_on_an_ordinary_users_mount_falls_back_to_a_bind_mount() {
    let owner = user("stagefs-test");
    let w = Warehouse::new(&owner);
    let mnt = w.path("mnt");
    // Root is another user of this mount: it gets in with --allow-other.
    let mut d = start_allowing_others(&owner, &w);
    let file = mnt.join("db/t/p=a/f");
    let out = Command::new(env!("CARGO_BIN_EXE_stagefs"))
        .args(["run", "--private-mount"])
        .arg(&mnt)
        .args(["--", "sh", "-c"])
        .arg(format!(
            "cat '{}' && grep -c ' {} ' /proc/self/mountinfo",
            file.display(),
            mnt.display()
        ))
        .stdin(Stdio::null())
        .output()
        .expect("stagefs run");
    let err = stderr(&out);
    assert!(out.status.success(), "stagefs run: {err}\n{}", d.log());
    assert!(
        err.contains("bind mount of its snapshot"),
        "the fallback is named: {err}"
    );
    let stdout = out.stdout;
    assert!(stdout.starts_with(&w.content), "the job read its state");
    // The live mount and the bind mount of the snapshot over it.
    assert_eq!(
        String::from_utf8_lossy(&stdout[w.content.len()..]).trim(),
        "2"
    );
    let s = status_as(&owner, &mnt);
    assert_eq!(s["session_connections"], serde_json::json!([]));
    // Handing over a connection is root's only, even the mounting user's.
    let handed = run_as(
        &owner,
        "setfattr",
        &[
            os("-n"),
            os("user.stagefs.connection"),
            os("-v"),
            os("0"),
            mnt.as_os_str(),
        ],
    );
    assert!(
        stderr(&handed).contains("Operation not permitted"),
        "{}",
        stderr(&handed)
    );
    assert!(
        d.terminate(),
        "SIGTERM: clean exit 0 and unmounted:\n{}",
        d.log()
    );
}

/// `bash` as `u` reading commands from a pipe: each `exec N<DIR` keeps a
/// directory handle open until the shell is killed (on drop).
struct Holder {
    shell: Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Holder {
    fn new(u: &User) -> Holder {
        let mut shell = Command::new("bash")
            .uid(u.uid)
            .gid(u.gid)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(shell.stdout.take().unwrap());
        Holder { shell, out }
    }

    /// Opens `dir` on descriptor `fd` and keeps it open.
    fn hold(&mut self, fd: u32, dir: &Path) {
        use std::io::{BufRead, Write};
        // Quiet past the readers' quiet gap, the shell's view takes the
        // newest visible state (docs/SEMANTICS.md "Readers").
        std::thread::sleep(Duration::from_millis(300));
        let stdin = self.shell.stdin.as_mut().unwrap();
        writeln!(
            stdin,
            "exec {fd}<'{}' && echo held || echo failed",
            dir.display()
        )
        .unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "held", "opening {} as a holder", dir.display());
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.shell.kill();
        let _ = self.shell.wait();
    }
}

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The mount's status JSON, read by `u`.
fn status_as(u: &User, mnt: &Path) -> serde_json::Value {
    let o = run_as(u, "cat", &[mnt.join(".stagefs/status").as_os_str()]);
    assert!(o.status.success(), "status: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn blob_count(state: &Path) -> usize {
    let mut n = 0;
    for shard in std::fs::read_dir(state.join("blobs")).unwrap() {
        let shard = shard.unwrap();
        if shard.file_name().len() == 2 && shard.path().is_dir() {
            n += std::fs::read_dir(shard.path()).unwrap().count();
        }
    }
    n
}

/// Replaces the partition's files with one new file (state `id`) and waits
/// until the owner sees it visible.
fn next_state(w: &Warehouse, owner: &User, id: u64, d: &Daemon) {
    use std::io::Write;
    let content = format!("rows of state {id}\n");
    let rel = format!("db/t/p=a/f{id}");
    std::fs::write(w.path("source").join(&rel), &content).unwrap();
    chown_tree(&w.path("source").join(&rel), owner);
    let line = format!(
        r#"{{"id": {id}, "op": "replace_files", "db": "db", "table": "t", "partition": {{"p": "a"}}, "files": [{{"path": "{rel}", "size": {}, "sha256": "{}"}}]}}"#,
        content.len(),
        sha256_hex(content.as_bytes())
    );
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(w.path("events/log-000001.jsonl"))
        .unwrap();
    writeln!(log, "{line}").unwrap();
    let mnt = w.path("mnt");
    let start = Instant::now();
    loop {
        let o = run_as(
            owner,
            "getfattr",
            &[
                os("--only-values"),
                os("-n"),
                os("user.stagefs.visible"),
                mnt.as_os_str(),
            ],
        );
        if String::from_utf8_lossy(&o.stdout).trim() == id.to_string() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "state {id} never visible:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls the status (as the owner) until `ok` holds, for up to 20 s.
fn wait_status(
    owner: &User,
    mnt: &Path,
    d: &Daemon,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) {
    let start = Instant::now();
    loop {
        let s = status_as(owner, mnt);
        if ok(&s) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what}: status {}\n{}",
            s["holds"],
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn another_users_directory_handles_keep_at_most_the_hold_limit_of_old_versions() {
    const LIMIT: u64 = stagefs::view::HOLD_LIMIT as u64;
    let owner = user("stagefs-test");
    let nobody = user("nobody");
    let w = Warehouse::new(&owner);
    let mnt = w.path("mnt");
    for p in [w.dir.path().to_owned(), mnt.clone()] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut flags = w.flags();
    flags.extend(["--allow-other".into(), "--retain".into(), "1".into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let d = Daemon::start(&owner, &mnt, &flags, &w.path("daemon.log"));
    wait_visible_as(&owner, &mnt, &d);
    let partition = mnt.join("db/t/p=a");

    // `nobody` holds the partition of every state from 3 to 3 + LIMIT + 3:
    // LIMIT + 3 of them go old, each with its own blob.
    let mut other = Holder::new(&nobody);
    let mut id = 3;
    for fd in 10..10 + LIMIT + 4 {
        if id > 3 {
            next_state(&w, &owner, id, &d);
        }
        other.hold(fd as u32, &partition);
        id += 1;
    }
    wait_status(&owner, &mnt, &d, "nobody's holds bounded", |s| {
        s["holds"]["old_versions_held"] == LIMIT && s["holds"]["released_handles"] == 3
    });

    // The owner's holds are not limited: each old version it holds keeps
    // its blob, and nobody's count stays at the limit.
    let mut mine = Holder::new(&owner);
    let owner_states = LIMIT + 2;
    for fd in 10..10 + owner_states {
        next_state(&w, &owner, id, &d);
        mine.hold(fd as u32, &partition);
        id += 1;
    }
    // Blobs kept: nobody's newest LIMIT versions (the newest also by its
    // shell's view), the owner's holds (the newest of which is visible).
    // Released holds keep nothing.
    let want = (LIMIT + owner_states) as usize;
    let start = Instant::now();
    while blob_count(&w.path("state")) != want {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "blobs: {} want {want}; status {}\n{}",
            blob_count(&w.path("state")),
            status_as(&owner, &mnt)["holds"],
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // State 3 + LIMIT + 3 went old too: one more of nobody's released.
    let s = status_as(&owner, &mnt);
    assert_eq!(s["holds"]["old_versions_held"], LIMIT, "{}", s["holds"]);
    assert_eq!(s["holds"]["released_handles"], 4, "{}", s["holds"]);

    drop(mine);
    drop(d);
}
