//! Real-mount tests of the view through the kernel: layout, versioned
//! directories and files, xattrs and their errnos, read-only refusals,
//! pins. Each test mounts its own temp dir (parallel-safe).

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use common::*;

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The whole table as `p=x/name=content` lines.
fn table_content(table: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for p in names(table) {
        for f in names(&table.join(&p)) {
            out.push(format!("{p}/{f}={}", read(&table.join(&p).join(&f)).trim()));
        }
    }
    out
}

fn fd_path(f: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

#[test]
fn example_states_switch_per_commit() {
    let m = TestMount::new();
    m.seed_example(10);
    let table = m.join("default/blah");
    assert_eq!(names(m.path()), vec!["default"]);
    assert!(names(&table).is_empty());
    m.put(20, "add_files", "a", "000001_0", b"5\n");
    assert_eq!(table_content(&table), vec!["p=a/000001_0=5"]);
    m.put(30, "add_files", "b", "000002_0", b"10\n");
    assert_eq!(
        table_content(&table),
        vec!["p=a/000001_0=5", "p=b/000002_0=10"]
    );
    m.put(40, "add_files", "a", "000003_0", b"15\n");
    assert_eq!(
        table_content(&table),
        vec!["p=a/000001_0=5", "p=a/000003_0=15", "p=b/000002_0=10"]
    );
    assert_eq!(getxattr(&table, "user.stagefs.state_id").unwrap(), "40");
    let md = fs::metadata(table.join("p=b/000002_0")).unwrap();
    assert_eq!(md.len(), 3);
    assert_eq!(md.permissions().mode() & 0o7777, 0o444);
    assert_eq!(
        fs::metadata(&table).unwrap().permissions().mode() & 0o7777,
        0o555
    );
}

#[test]
fn open_table_directory_keeps_its_version() {
    let m = TestMount::new();
    m.seed_example(40);
    let dir = File::open(m.join("default/blah")).unwrap();
    let at = fd_path(&dir);
    m.commit(r#"{"id": 50, "op": "drop_partition", "db": "default", "table": "blah", "partition": {"p": "a"}}"#);
    m.put(60, "add_files", "c", "000004_0", b"20\n");
    // A fresh walk sees the new state ...
    assert_eq!(names(&m.join("default/blah")), vec!["p=b", "p=c"]);
    // ... the directory reached before still shows 40, files included.
    assert_eq!(names(&at), vec!["p=a", "p=b"]);
    assert_eq!(
        table_content(&at),
        vec!["p=a/000001_0=5", "p=a/000003_0=15", "p=b/000002_0=10"]
    );
    assert_eq!(getxattr(&at, "user.stagefs.state_id").unwrap(), "40");
}

#[test]
fn open_file_keeps_its_bytes_after_overwrite() {
    let m = TestMount::new();
    m.seed_example(20);
    let path = m.join("default/blah/p=a/000001_0");
    let mut old = File::open(&path).unwrap();
    m.put(30, "replace_files", "a", "000001_0", b"overwritten\n");
    assert_eq!(read(&path), "overwritten\n");
    let mut buf = String::new();
    old.read_to_string(&mut buf).unwrap();
    assert_eq!(buf, "5\n");
}

#[test]
fn stagefs_is_hidden_but_reachable() {
    let m = TestMount::new();
    m.seed_example(30);
    assert_eq!(names(m.path()), vec!["default"]);
    assert!(fs::metadata(m.join(".stagefs")).unwrap().is_dir());
    assert_eq!(names(&m.join(".stagefs")), vec!["snapshots", "status"]);
    let status = read(&m.join(".stagefs/status"));
    assert!(status.contains(r#""visible": 30"#), "{status}");
    m.put(40, "add_files", "a", "000003_0", b"15\n");
    let status = read(&m.join(".stagefs/status"));
    assert!(status.contains(r#""visible": 40"#), "{status}");
}

#[test]
fn snapshots_are_browsable() {
    let m = TestMount::new();
    m.seed_example(40);
    assert_eq!(
        names(&m.join(".stagefs/snapshots")),
        vec!["10", "20", "30", "40", "5"]
    );
    let s20 = m.join(".stagefs/snapshots/20/default/blah");
    assert_eq!(table_content(&s20), vec!["p=a/000001_0=5"]);
    assert_eq!(
        getxattr(&m.join(".stagefs/snapshots/20"), "user.stagefs.state_id").unwrap(),
        "20"
    );
    assert_eq!(
        os_err(fs::metadata(m.join(".stagefs/snapshots/25"))),
        libc::ENOENT
    );
}

#[test]
fn xattrs_and_their_errnos() {
    let m = TestMount::new();
    m.seed_example(40);
    let root = m.path();
    let table = m.join("default/blah");
    let file = m.join("default/blah/p=a/000001_0");
    assert_eq!(
        listxattr(root).unwrap(),
        vec![
            "user.stagefs.state_id",
            "user.stagefs.visible",
            "user.stagefs.latest"
        ]
    );
    assert_eq!(getxattr(root, "user.stagefs.visible").unwrap(), "40");
    assert_eq!(getxattr(root, "user.stagefs.latest").unwrap(), "40");
    assert_eq!(listxattr(&table).unwrap(), vec!["user.stagefs.state_id"]);
    assert_eq!(
        listxattr(&file).unwrap(),
        vec![
            "user.stagefs.state_id",
            "user.stagefs.sha256",
            "user.stagefs.source",
            "user.stagefs.verified"
        ]
    );
    assert_eq!(getxattr(&file, "user.stagefs.verified").unwrap(), "sha256");
    assert_eq!(getxattr(&file, "user.stagefs.state_id").unwrap(), "20");
    assert_eq!(
        getxattr(&file, "user.stagefs.sha256").unwrap(),
        sha256_hex(b"5\n")
    );
    assert_eq!(
        getxattr(&file, "user.stagefs.source").unwrap(),
        "default/blah/p=a/000001_0"
    );
    // Size probe answers the size; a short buffer is ERANGE.
    assert_eq!(
        getxattr_sized(&file, "user.stagefs.sha256", 0).unwrap().1,
        64
    );
    assert_eq!(
        getxattr_sized(&file, "user.stagefs.sha256", 10),
        Err(libc::ERANGE)
    );
    let (_, list_len) = listxattr_sized(&table, 0).unwrap();
    assert_eq!(list_len, "user.stagefs.state_id\0".len());
    assert_eq!(listxattr_sized(&table, 5), Err(libc::ERANGE));
    // Misses.
    assert_eq!(getxattr(&file, "user.stagefs.visible"), Err(libc::ENODATA));
    assert_eq!(getxattr(&table, "user.stagefs.pin"), Err(libc::ENODATA));
    assert_eq!(getxattr(root, "user.stagefs.pin"), Err(libc::ENODATA));
    assert_eq!(removexattr(&table, "user.stagefs.pin"), Err(libc::ENODATA));
    // Refusals.
    assert_eq!(setxattr(&table, "user.other", b"1"), Err(libc::ENOTSUP));
    assert_eq!(
        setxattr(&file, "user.stagefs.pin", b"20"),
        Err(libc::ENOTSUP)
    );
    assert_eq!(
        setxattr(&m.join("default/blah/p=a"), "user.stagefs.pin", b"20"),
        Err(libc::ENOTSUP)
    );
    assert_eq!(
        setxattr(&m.join("default"), "user.stagefs.pin", b"20"),
        Err(libc::ENOTSUP)
    );
    assert_eq!(
        removexattr(&table, "user.stagefs.state_id"),
        Err(libc::ENOTSUP)
    );
    // Bad values.
    for bad in [&b"banana"[..], b"-1", b"", b"25", b"5"] {
        assert_eq!(
            setxattr(&table, "user.stagefs.pin", bad),
            Err(libc::EINVAL),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    assert_eq!(
        setxattr(root, "user.stagefs.pin", b"12x"),
        Err(libc::EINVAL)
    );
}

#[test]
fn writes_are_erofs() {
    let m = TestMount::new();
    m.seed_example(20);
    let table = m.join("default/blah");
    let file = table.join("p=a/000001_0");
    assert_eq!(os_err(File::create(table.join("p=a/new"))), libc::EROFS);
    assert_eq!(
        os_err(OpenOptions::new().write(true).open(&file)),
        libc::EROFS
    );
    assert_eq!(
        os_err(OpenOptions::new().append(true).open(&file)),
        libc::EROFS
    );
    assert_eq!(os_err(fs::remove_file(&file)), libc::EROFS);
    assert_eq!(
        os_err(fs::rename(&file, table.join("p=a/renamed"))),
        libc::EROFS
    );
    assert_eq!(os_err(fs::create_dir(table.join("p=z"))), libc::EROFS);
    assert_eq!(os_err(fs::remove_dir(table.join("p=a"))), libc::EROFS);
    assert_eq!(
        os_err(fs::set_permissions(
            &file,
            fs::Permissions::from_mode(0o644)
        )),
        libc::EROFS
    );
    let c = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
    // SAFETY: valid path string.
    assert_eq!(unsafe { libc::truncate(c.as_ptr(), 0) }, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EROFS)
    );
    assert_eq!(
        os_err(std::os::unix::fs::symlink("x", table.join("link"))),
        libc::EROFS
    );
    assert_eq!(os_err(fs::hard_link(&file, table.join("hl"))), libc::EROFS);
    assert_eq!(read(&file), "5\n");
}

#[test]
fn pin_changes_the_next_walk_and_table_pin_wins() {
    let m = TestMount::new();
    m.seed_example(40);
    let root = m.path();
    let table = m.join("default/blah");
    setxattr(&table, "user.stagefs.pin", b"20").unwrap();
    assert_eq!(getxattr(&table, "user.stagefs.pin").unwrap(), "20");
    assert_eq!(table_content(&table), vec!["p=a/000001_0=5"]);
    assert_eq!(getxattr(&table, "user.stagefs.state_id").unwrap(), "20");
    // Root pin at 30 freezes the mount; the table pin still wins.
    setxattr(root, "user.stagefs.pin", b"30").unwrap();
    m.put(50, "add_files", "c", "000004_0", b"20\n");
    assert_eq!(getxattr(root, "user.stagefs.state_id").unwrap(), "30");
    assert_eq!(getxattr(root, "user.stagefs.visible").unwrap(), "50");
    assert_eq!(table_content(&table), vec!["p=a/000001_0=5"]);
    // Unpinning the table falls back to the root pin ...
    removexattr(&table, "user.stagefs.pin").unwrap();
    assert_eq!(
        table_content(&table),
        vec!["p=a/000001_0=5", "p=b/000002_0=10"]
    );
    // ... and unpinning the root jumps to the newest visible state.
    removexattr(root, "user.stagefs.pin").unwrap();
    assert_eq!(names(&table), vec!["p=a", "p=b", "p=c"]);
    setxattr(root, "user.stagefs.pin", b"visible").unwrap();
    assert_eq!(getxattr(root, "user.stagefs.pin").unwrap(), "50");
    assert!(listxattr(root)
        .unwrap()
        .contains(&"user.stagefs.pin".to_string()));
}

#[test]
fn unmount_with_an_open_file_does_not_hang_or_leave_a_dead_mount() {
    let m = TestMount::new();
    m.seed_example(20);
    let mnt = m.path().to_owned();
    let f = File::open(m.join("default/blah/p=a/000001_0")).unwrap();
    let started = std::time::Instant::now();
    m.unmount();
    assert!(started.elapsed() < std::time::Duration::from_secs(6));
    assert!(!is_mountpoint(&mnt));
    drop(f);
}

#[test]
fn same_table_version_through_live_and_snapshot_paths() {
    let m = TestMount::new();
    m.seed_example(40);
    let live = m.join("default/blah");
    let snap = m.join(".stagefs/snapshots/40/default/blah");
    // The same immutable node (one inode) reachable by two paths.
    let live_dir = File::open(&live).unwrap();
    for _ in 0..3 {
        assert_eq!(names(&live), vec!["p=a", "p=b"]);
        assert_eq!(names(&snap), vec!["p=a", "p=b"]);
        assert_eq!(read(&snap.join("p=b/000002_0")), "10\n");
        assert_eq!(read(&live.join("p=a/000003_0")), "15\n");
    }
    assert_eq!(names(&fd_path(&live_dir)), vec!["p=a", "p=b"]);
    // A pin through the live path still works after the snapshot walk.
    setxattr(&live, "user.stagefs.pin", b"30").unwrap();
    assert_eq!(names(&live), vec!["p=a", "p=b"]);
    assert_eq!(getxattr(&live, "user.stagefs.state_id").unwrap(), "30");
    // The snapshot path still shows 40: the pin acts on the live name only.
    assert_eq!(getxattr(&snap, "user.stagefs.state_id").unwrap(), "40");
    assert_eq!(names(&snap), vec!["p=a", "p=b"]);
}

#[test]
fn external_umount_ends_the_session() {
    let m = TestMount::new();
    m.seed_example(20);
    assert!(!m.mounted().is_ended());
    let c = std::ffi::CString::new(m.path().to_str().unwrap()).unwrap();
    // SAFETY: valid path string.
    assert_eq!(unsafe { libc::umount2(c.as_ptr(), 0) }, 0);
    assert!(m
        .mounted()
        .wait_unmounted_timeout(std::time::Duration::from_secs(2)));
    assert!(!is_mountpoint(m.path()));
}

#[test]
fn kernel_forget_frees_old_versions() {
    let m = TestMount::new();
    m.seed_example(40);
    let old = m.join("default/blah/p=a/000001_0");
    assert_eq!(read(&old), "5\n");
    // Held open across the commit, so the kernel surely references the
    // old version (another process dropping the machine's caches, or
    // memory pressure, cannot take it first).
    let open = File::open(&old).unwrap();
    m.commit(r#"{"id": 50, "op": "drop_table", "db": "default", "table": "blah"}"#);
    assert!(m.view().referenced_inodes() > 0);
    drop(open);
    // Dropping the dentry cache makes the kernel forget every inode it no
    // longer uses; the view must then hold nothing.
    if let Err(e) = fs::write("/proc/sys/vm/drop_caches", "2") {
        eprintln!("skipped: cannot drop caches ({e}); needs root");
        return;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while m.view().referenced_inodes() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(m.view().referenced_inodes(), 0);
}

/// Waits (up to 2 s) for the view to hold no handle: directory releases
/// reach the daemon asynchronously.
fn no_handles_left(m: &TestMount) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while m.view().open_handles() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    m.view().open_handles() == 0
}

fn no_open_mount() -> TestMount {
    TestMount::with_options(stagefs::fuse::MountOptions {
        no_open: true,
        ..stagefs::fuse::MountOptions::default()
    })
}

#[test]
fn no_open_mode_reads_every_file_without_handles_and_status_per_walk() {
    let m = no_open_mount();
    m.seed_example(40);
    let table = m.join("default/blah");
    assert_eq!(
        table_content(&table),
        vec!["p=a/000001_0=5", "p=a/000003_0=15", "p=b/000002_0=10"]
    );
    // The first open was answered ENOSYS; no handle is left behind.
    assert!(no_handles_left(&m));
    let status = m.join(".stagefs/status");
    assert!(read(&status).contains(r#""visible": 40"#));
    let early = File::open(&status).unwrap();
    m.put(50, "add_files", "c", "000004_0", b"20\n");
    // A new walk renders a fresh copy; an open one keeps its bytes.
    assert!(read(&status).contains(r#""visible": 50"#));
    assert!(read(&fd_path(&early)).contains(r#""visible": 40"#));
    assert_eq!(read(&table.join("p=c/000004_0")), "20\n");
    // An open file keeps its version across the commit.
    let f = File::open(table.join("p=a/000001_0")).unwrap();
    m.commit(r#"{"id": 60, "op": "drop_partition", "db": "default", "table": "blah", "partition": {"p": "a"}}"#);
    assert_eq!(read(&fd_path(&f)), "5\n");
    assert_eq!(names(&table), vec!["p=b", "p=c"]);
    assert!(no_handles_left(&m), "files were opened without handles");
}

#[test]
fn no_open_mode_still_refuses_writes_with_erofs_as_root() {
    let m = no_open_mount();
    m.seed_example(20);
    let table = m.join("default/blah");
    let file = table.join("p=a/000001_0");
    assert_eq!(read(&file), "5\n");
    assert_eq!(os_err(File::create(table.join("p=a/new"))), libc::EROFS);
    // Truncating opens go through setattr: refused.
    assert_eq!(
        os_err(OpenOptions::new().write(true).truncate(true).open(&file)),
        libc::EROFS
    );
    // Without open requests the kernel decides a write open by the mode
    // bits (0444): root may open, but every write is refused.
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } == 0 {
        use std::io::Write;
        let mut w = OpenOptions::new().append(true).open(&file).unwrap();
        assert_eq!(os_err(w.write_all(b"x").and(w.flush())), libc::EROFS);
    } else {
        assert_eq!(
            os_err(OpenOptions::new().write(true).open(&file)),
            libc::EACCES
        );
    }
    assert_eq!(os_err(fs::remove_file(&file)), libc::EROFS);
    assert_eq!(
        os_err(fs::set_permissions(
            &file,
            fs::Permissions::from_mode(0o644)
        )),
        libc::EROFS
    );
    assert_eq!(read(&file), "5\n");
}
