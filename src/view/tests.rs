//! The view without a kernel: layout, attributes, xattr rules, pins,
//! version retention by handles, lookup counting.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use super::*;
use crate::catalog::Pins;
use crate::event::Event;

struct FixedStatus(Mutex<StateId>);

impl StatusSource for FixedStatus {
    fn status_json(&self) -> String {
        r#"{"visible": 0}"#.into()
    }
    fn latest(&self) -> StateId {
        *self.0.lock().unwrap()
    }
}

/// A catalog and a view over it, plus the newest applied tree.
struct Fixture {
    _dir: tempfile::TempDir,
    blobs: PathBuf,
    tree: Mutex<Arc<Tree>>,
    view: View,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let blobs = dir.path().join("blobs");
        std::fs::create_dir(&blobs).unwrap();
        let tree = Arc::new(Tree::empty());
        let catalog = Arc::new(Catalog::new(
            dir.path(),
            Arc::clone(&tree),
            BTreeMap::new(),
            Pins::default(),
            16,
        ));
        let b = blobs.clone();
        let view = View::new(
            catalog,
            Arc::new(move |id: &BlobId| b.join(id.to_hex())),
            Arc::new(FixedStatus(Mutex::new(StateId(99)))),
            ViewConfig {
                uid: 1234,
                gid: 5678,
                mount_time: UNIX_EPOCH + Duration::from_secs(1_000_000),
            },
        );
        Fixture {
            _dir: dir,
            blobs,
            tree: Mutex::new(tree),
            view,
        }
    }

    /// Stores `content` as a blob and returns the event's file object.
    fn file(&self, path: &str, content: &[u8]) -> String {
        let sha = hex(&Sha256::digest(content));
        std::fs::write(self.blobs.join(&sha), content).unwrap();
        format!(
            r#"{{"path": "{path}", "size": {}, "sha256": "{sha}"}}"#,
            content.len()
        )
    }

    /// Applies one event line and commits it.
    fn commit(&self, line: &str) {
        let event = Event::parse_line(line.as_bytes()).unwrap();
        let mut tree = self.tree.lock().unwrap();
        let next = Arc::new(tree.apply(&event).unwrap().0);
        self.view.catalog().commit(Arc::clone(&next)).unwrap();
        *tree = next;
    }

    /// SPEC §1: create db and table, then inserts at 20, 30 and 40.
    fn seed(&self) {
        self.commit(
            r#"{"id": 5, "op": "create_database", "db": "default", "time_ms": 1700000000000}"#,
        );
        self.commit(r#"{"id": 10, "op": "create_table", "db": "default", "table": "blah", "partition_keys": ["p"]}"#);
        self.insert(20, "a", "000001_0", b"5\n");
        self.insert(30, "b", "000002_0", b"10\n");
        self.insert(40, "a", "000003_0", b"15\n");
    }

    fn insert(&self, id: u64, p: &str, name: &str, content: &[u8]) {
        let f = self.file(&format!("default/blah/p={p}/{name}"), content);
        self.commit(&format!(
            r#"{{"id": {id}, "op": "add_files", "db": "default", "table": "blah", "partition": {{"p": "{p}"}}, "files": [{f}]}}"#
        ));
    }

    fn lookup(&self, parent: u64, name: &str) -> Result<Entry> {
        self.view.lookup(parent, OsStr::new(name), Caller::UNKNOWN)
    }

    /// Walks `path` from the root like the kernel would.
    fn walk(&self, path: &str) -> Result<Entry> {
        let mut ino = ROOT;
        let mut entry = None;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            let e = self.lookup(ino, part)?;
            ino = e.attr.ino;
            entry = Some(e);
        }
        Ok(entry.expect("non-empty path"))
    }

    fn ino(&self, path: &str) -> u64 {
        self.walk(path).unwrap().attr.ino
    }

    fn list(&self, ino: u64) -> Vec<String> {
        let dir = self.view.opendir(ino, Caller::UNKNOWN).unwrap();
        let names = self.list_fh(dir.fh);
        self.view.releasedir(dir.fh);
        names
    }

    fn list_fh(&self, fh: u64) -> Vec<String> {
        let mut names = Vec::new();
        self.view
            .readdir(fh, 0, |e| {
                names.push(e.name.to_string());
                false
            })
            .unwrap();
        names.retain(|n| n != "." && n != "..");
        names
    }

    fn read_all(&self, ino: u64) -> Vec<u8> {
        let opened = self
            .view
            .open(ino, libc::O_RDONLY, Caller::UNKNOWN)
            .unwrap();
        let data = self.view.read(opened.fh, 0, 1 << 20).unwrap();
        self.view.release(opened.fh);
        data.to_vec()
    }

    fn xattr(&self, ino: u64, name: &str) -> Result<String> {
        self.view
            .getxattr(ino, OsStr::new(name), Caller::UNKNOWN)
            .map(|v| String::from_utf8(v).unwrap())
    }

    fn set_pin(&self, ino: u64, value: &str) -> Result<()> {
        self.view.setxattr(
            ino,
            OsStr::new(xattr::PIN),
            value.as_bytes(),
            Caller::UNKNOWN,
        )
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn errno<T: std::fmt::Debug>(r: Result<T>) -> i32 {
    r.unwrap_err().errno()
}

#[test]
fn layout_follows_the_visible_state() {
    let fx = Fixture::new();
    fx.seed();
    assert_eq!(fx.list(ROOT), vec!["default"]);
    let db = fx.ino("default");
    assert_eq!(fx.list(db), vec!["blah"]);
    let table = fx.ino("default/blah");
    assert_eq!(fx.list(table), vec!["p=a", "p=b"]);
    let pa = fx.ino("default/blah/p=a");
    assert_eq!(fx.list(pa), vec!["000001_0", "000003_0"]);
    let f = fx.ino("default/blah/p=a/000003_0");
    assert_eq!(fx.read_all(f), b"15\n");
}

#[test]
fn stagefs_is_reachable_but_not_listed() {
    let fx = Fixture::new();
    fx.seed();
    assert!(!fx.list(ROOT).contains(&".stagefs".to_string()));
    assert_eq!(fx.ino(".stagefs"), STAGEFS_DIR);
    assert_eq!(fx.list(STAGEFS_DIR), vec!["status", "snapshots"]);
    let status = fx.ino(".stagefs/status");
    let opened = fx
        .view
        .open(status, libc::O_RDONLY, Caller::UNKNOWN)
        .unwrap();
    assert!(matches!(opened.content, OpenContent::Generated));
    let data = fx.view.read(opened.fh, 0, 4096).unwrap();
    assert_eq!(data.last(), Some(&b'\n'));
    let json: serde_json::Value = serde_json::from_slice(&data).unwrap();
    assert_eq!(json["visible"], 0);
    // The view layer adds its readers and sessions.
    assert_eq!(json["sessions"], serde_json::json!([]));
    assert_eq!(json["readers"]["unattributed_requests"], 1);
}

#[test]
fn attributes_are_read_only_owned_and_exact() {
    let fx = Fixture::new();
    fx.seed();
    let (root, _) = fx.view.getattr(ROOT, Caller::UNKNOWN).unwrap();
    assert_eq!((root.perm, root.uid, root.gid), (0o555, 1234, 5678));
    assert_eq!(root.kind, FileKind::Directory);
    let e = fx.walk("default/blah/p=b/000002_0").unwrap();
    assert_eq!(e.attr.size, 3);
    assert_eq!(e.attr.perm, 0o444);
    assert_eq!(e.attr.kind, FileKind::RegularFile);
    assert_eq!(e.attr.nlink, 1);
    // No time_ms on the insert: mount time.
    assert_eq!(e.attr.mtime, UNIX_EPOCH + Duration::from_secs(1_000_000));
    // Immutable nodes: long TTLs; table names: no entry caching.
    assert!(e.entry_ttl >= Duration::from_secs(3600));
    let t = fx.walk("default/blah").unwrap();
    assert_eq!(t.entry_ttl, Duration::ZERO);
    assert_eq!(t.attr.nlink, 4);
    let db = fx.walk("default").unwrap();
    assert_eq!(db.entry_ttl, Duration::ZERO);
    // The db node last changed at 10 (no time_ms): mount time; at 5 it had
    // the event's time.
    assert_eq!(db.attr.mtime, UNIX_EPOCH + Duration::from_secs(1_000_000));
    let db5 = fx.walk(".stagefs/snapshots/5/default").unwrap();
    assert_eq!(
        db5.attr.mtime,
        UNIX_EPOCH + Duration::from_millis(1_700_000_000_000)
    );
}

#[test]
fn missing_names_and_wrong_kinds_have_their_errno() {
    let fx = Fixture::new();
    fx.seed();
    assert_eq!(errno(fx.walk("nope")), libc::ENOENT);
    assert_eq!(errno(fx.walk("default/nope")), libc::ENOENT);
    assert_eq!(errno(fx.walk(".stagefs/snapshots/7")), libc::ENOENT);
    assert_eq!(errno(fx.walk(".stagefs/snapshots/040")), libc::ENOENT);
    let f = fx.ino("default/blah/p=a/000001_0");
    assert_eq!(errno(fx.lookup(f, "x")), libc::ENOTDIR);
    assert_eq!(errno(fx.view.opendir(f, Caller::UNKNOWN)), libc::ENOTDIR);
    assert_eq!(
        errno(fx.view.open(ROOT, libc::O_RDONLY, Caller::UNKNOWN)),
        libc::EISDIR
    );
    assert_eq!(errno(fx.view.getattr(999, Caller::UNKNOWN)), libc::ESTALE);
}

#[test]
fn every_write_intent_is_erofs() {
    let fx = Fixture::new();
    fx.seed();
    let f = fx.ino("default/blah/p=a/000001_0");
    for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC] {
        assert_eq!(errno(fx.view.open(f, flags, Caller::UNKNOWN)), libc::EROFS);
    }
    assert_eq!(
        errno(fx.view.open(STATUS_FILE, libc::O_WRONLY, Caller::UNKNOWN)),
        libc::EROFS
    );
    assert_eq!(errno(fx.view.access(f, libc::W_OK)), libc::EROFS);
    assert!(fx.view.access(f, libc::R_OK).is_ok());
}

#[test]
fn xattrs_per_node_kind() {
    let fx = Fixture::new();
    fx.seed();
    let list = |ino| {
        let raw = fx.view.listxattr(ino, Caller::UNKNOWN).unwrap();
        String::from_utf8(raw).unwrap().replace('\0', " ")
    };
    assert_eq!(
        list(ROOT),
        "user.stagefs.state_id user.stagefs.visible user.stagefs.latest "
    );
    assert_eq!(fx.xattr(ROOT, xattr::STATE_ID).unwrap(), "40");
    assert_eq!(fx.xattr(ROOT, xattr::VISIBLE).unwrap(), "40");
    assert_eq!(fx.xattr(ROOT, xattr::LATEST).unwrap(), "99");
    let table = fx.ino("default/blah");
    assert_eq!(list(table), "user.stagefs.state_id ");
    assert_eq!(fx.xattr(table, xattr::STATE_ID).unwrap(), "40");
    assert_eq!(
        fx.xattr(fx.ino("default/blah/p=b"), xattr::STATE_ID)
            .unwrap(),
        "30"
    );
    let f = fx.ino("default/blah/p=a/000001_0");
    assert_eq!(
        list(f),
        "user.stagefs.state_id user.stagefs.sha256 user.stagefs.source user.stagefs.verified "
    );
    assert_eq!(fx.xattr(f, xattr::VERIFIED).unwrap(), "sha256");
    assert_eq!(fx.xattr(f, xattr::STATE_ID).unwrap(), "20");
    assert_eq!(
        fx.xattr(f, xattr::SHA256).unwrap(),
        hex(&Sha256::digest(b"5\n"))
    );
    assert_eq!(
        fx.xattr(f, xattr::SOURCE).unwrap(),
        "default/blah/p=a/000001_0"
    );
    assert_eq!(fx.xattr(STAGEFS_DIR, xattr::STATE_ID).unwrap(), "40");
    assert_eq!(
        fx.xattr(fx.ino(".stagefs/snapshots/20"), xattr::STATE_ID)
            .unwrap(),
        "20"
    );
    // Misses and refusals.
    assert_eq!(errno(fx.xattr(f, xattr::VISIBLE)), libc::ENODATA);
    assert_eq!(errno(fx.xattr(ROOT, xattr::PIN)), libc::ENODATA);
    assert_eq!(errno(fx.xattr(table, "security.selinux")), libc::ENODATA);
    assert_eq!(
        errno(
            fx.view
                .setxattr(table, OsStr::new("user.other"), b"1", Caller::UNKNOWN)
        ),
        libc::ENOTSUP
    );
    assert_eq!(errno(fx.set_pin(f, "20")), libc::ENOTSUP);
    assert_eq!(errno(fx.set_pin(fx.ino("default"), "20")), libc::ENOTSUP);
    assert_eq!(
        errno(fx.set_pin(fx.ino("default/blah/p=a"), "20")),
        libc::ENOTSUP
    );
    // A table reached through a snapshot is not a pin target.
    let snap_table = fx.ino(".stagefs/snapshots/30/default/blah");
    assert_ne!(snap_table, table);
    assert_eq!(errno(fx.set_pin(snap_table, "20")), libc::ENOTSUP);
    assert_eq!(errno(fx.set_pin(table, "banana")), libc::EINVAL);
    assert_eq!(errno(fx.set_pin(table, "7")), libc::EINVAL);
    assert_eq!(errno(fx.set_pin(table, "5")), libc::EINVAL); // no table at 5
    assert_eq!(
        errno(
            fx.view
                .removexattr(table, OsStr::new(xattr::PIN), Caller::UNKNOWN)
        ),
        libc::ENODATA
    );
    assert_eq!(
        errno(
            fx.view
                .removexattr(table, OsStr::new(xattr::STATE_ID), Caller::UNKNOWN)
        ),
        libc::ENOTSUP
    );
    assert_eq!(
        errno(
            fx.view
                .removexattr(table, OsStr::new("user.nothing"), Caller::UNKNOWN)
        ),
        libc::ENODATA
    );
}

#[test]
fn table_pin_wins_over_root_pin() {
    let fx = Fixture::new();
    fx.seed();
    let table = fx.ino("default/blah");
    fx.set_pin(table, "20").unwrap();
    assert_eq!(fx.xattr(table, xattr::PIN).unwrap(), "20");
    // The next walk sees the pinned version.
    let pinned = fx.ino("default/blah");
    assert_eq!(fx.list(pinned), vec!["p=a"]);
    assert_eq!(fx.xattr(pinned, xattr::STATE_ID).unwrap(), "20");
    // Root pin at 30 freezes the rest, but the table pin wins.
    fx.set_pin(ROOT, "30").unwrap();
    assert_eq!(fx.xattr(ROOT, xattr::STATE_ID).unwrap(), "30");
    assert_eq!(fx.xattr(ROOT, xattr::PIN).unwrap(), "30");
    fx.insert(50, "c", "000004_0", b"20\n");
    assert_eq!(fx.list(fx.ino("default/blah")), vec!["p=a"]);
    // Unpin the table: the root pin (30) applies.
    fx.view
        .removexattr(
            fx.ino("default/blah"),
            OsStr::new(xattr::PIN),
            Caller::UNKNOWN,
        )
        .unwrap();
    assert_eq!(fx.list(fx.ino("default/blah")), vec!["p=a", "p=b"]);
    // Unpin the root: newest visible.
    fx.view
        .removexattr(ROOT, OsStr::new(xattr::PIN), Caller::UNKNOWN)
        .unwrap();
    assert_eq!(fx.list(fx.ino("default/blah")), vec!["p=a", "p=b", "p=c"]);
    assert_eq!(fx.xattr(ROOT, xattr::STATE_ID).unwrap(), "50");
    // `visible` pins the current visible state.
    fx.set_pin(ROOT, "visible").unwrap();
    assert_eq!(fx.xattr(ROOT, xattr::PIN).unwrap(), "50");
}

#[test]
fn pinned_table_stays_listed_after_drop() {
    let fx = Fixture::new();
    fx.seed();
    fx.set_pin(fx.ino("default/blah"), "40").unwrap();
    fx.commit(r#"{"id": 60, "op": "drop_database", "db": "default"}"#);
    assert_eq!(fx.list(ROOT), vec!["default"]);
    assert_eq!(fx.list(fx.ino("default")), vec!["blah"]);
    assert_eq!(fx.list(fx.ino("default/blah")), vec!["p=a", "p=b"]);
    fx.view
        .removexattr(
            fx.ino("default/blah"),
            OsStr::new(xattr::PIN),
            Caller::UNKNOWN,
        )
        .unwrap();
    assert!(fx.list(ROOT).is_empty());
    assert_eq!(errno(fx.walk("default")), libc::ENOENT);
}

#[test]
fn open_directory_keeps_its_version() {
    let fx = Fixture::new();
    fx.seed();
    let table = fx
        .view
        .opendir(fx.ino("default/blah"), Caller::UNKNOWN)
        .unwrap();
    assert!(table.immutable);
    let pa = fx.ino("default/blah/p=a");
    let file = fx
        .view
        .open(fx.ino("default/blah/p=a/000001_0"), 0, Caller::UNKNOWN)
        .unwrap();
    fx.commit(r#"{"id": 50, "op": "drop_partition", "db": "default", "table": "blah", "partition": {"p": "a"}}"#);
    assert_eq!(fx.list(fx.ino("default/blah")), vec!["p=b"]);
    // The handle and the inode reached before the commit still show 40.
    assert_eq!(fx.list_fh(table.fh), vec!["p=a", "p=b"]);
    assert_eq!(fx.list(pa), vec!["000001_0", "000003_0"]);
    assert_eq!(fx.view.read(file.fh, 0, 10).unwrap(), &b"5\n"[..]);
    fx.view.releasedir(table.fh);
    fx.view.release(file.fh);
    assert_eq!(fx.view.open_handles(), 0);
}

#[test]
fn readdir_resumes_from_its_cursor_and_from_any_offset() {
    let fx = Fixture::new();
    fx.seed();
    let files: Vec<String> = (0..50)
        .map(|i| fx.file(&format!("d/f{i:03}"), format!("{i}").as_bytes()))
        .collect();
    fx.commit(&format!(
        r#"{{"id": 50, "op": "add_files", "db": "default", "table": "blah", "partition": {{"p": "z"}}, "files": [{}]}}"#,
        files.join(",")
    ));
    let dir = fx
        .view
        .opendir(fx.ino("default/blah/p=z"), Caller::UNKNOWN)
        .unwrap();
    // Pages of 7 entries, resuming from the last offset each time.
    let mut all = Vec::new();
    let mut offset = 0;
    loop {
        let mut page = Vec::new();
        fx.view
            .readdir(dir.fh, offset, |e| {
                if page.len() == 7 {
                    return true;
                }
                page.push(e);
                false
            })
            .unwrap();
        let Some(last) = page.last() else { break };
        offset = last.offset;
        all.extend(page.into_iter().map(|e| e.name.to_string()));
    }
    assert_eq!(all.len(), 52);
    assert_eq!(all[2], "f000");
    assert_eq!(all[51], "f049");
    // A seek elsewhere (telldir/seekdir) still works.
    let mut first = None;
    fx.view
        .readdir(dir.fh, 12, |e| {
            first = Some(e.name.to_string());
            true
        })
        .unwrap();
    // The add returned true (full), so nothing was taken; peek instead.
    assert_eq!(first.as_deref(), Some("f010"));
    fx.view.releasedir(dir.fh);
}

#[test]
fn forget_frees_old_versions() {
    let fx = Fixture::new();
    fx.seed();
    let f = fx.walk("default/blah/p=a/000001_0").unwrap().attr.ino;
    fx.walk("default/blah/p=a/000001_0").unwrap();
    assert_eq!(fx.view.lookup_count(f), 2);
    fx.view.forget(f, 1);
    assert_eq!(fx.view.lookup_count(f), 1);
    fx.view.forget(f, 1);
    assert_eq!(fx.view.lookup_count(f), 0);
    assert_eq!(errno(fx.view.getattr(f, Caller::UNKNOWN)), libc::ESTALE);
    // Forgetting every reference empties the table.
    let inos = [fx.ino("default/blah"), fx.ino("default/blah/p=a")];
    for ino in inos {
        fx.view.forget(ino, fx.view.lookup_count(ino));
    }
    let snap = fx.ino(".stagefs/snapshots/30");
    fx.view.forget(snap, fx.view.lookup_count(snap));
    assert_eq!(fx.view.referenced_inodes(), 0);
}

#[test]
fn snapshots_are_browsable_and_stable() {
    let fx = Fixture::new();
    fx.seed();
    assert_eq!(fx.list(SNAPSHOTS_DIR), vec!["5", "10", "20", "30", "40"]);
    let s20 = fx.ino(".stagefs/snapshots/20");
    assert_eq!(fx.ino(".stagefs/snapshots/20"), s20);
    assert_eq!(fx.list(s20), vec!["default"]);
    let pa = fx.ino(".stagefs/snapshots/20/default/blah/p=a");
    assert_eq!(fx.list(pa), vec!["000001_0"]);
    let db = fx.ino(".stagefs/snapshots/20/default");
    assert!(db >= crate::catalog::tree::FIRST_NODE_ID);
    assert_ne!(fx.ino("default"), db);
}

#[test]
fn errno_mapping_is_total() {
    let cases: Vec<(ViewError, i32)> = vec![
        (ViewError::NotFound, libc::ENOENT),
        (ViewError::NoAttr, libc::ENODATA),
        (ViewError::ReadOnly, libc::EROFS),
        (ViewError::Pin(PinError::BadValue), libc::EINVAL),
        (
            ViewError::Pin(PinError::NotRetained(StateId(1))),
            libc::EINVAL,
        ),
        (ViewError::Pin(PinError::NotPinnable), libc::ENOTSUP),
        (
            ViewError::OpenBlob {
                path: Path::new("/x").into(),
                source: std::io::Error::other("x"),
            },
            libc::EIO,
        ),
    ];
    for (e, n) in cases {
        assert_eq!(e.errno(), n, "{e}");
    }
}

impl Fixture {
    /// One `readdirplus` of a fresh handle: (name, inode, entry TTL,
    /// attr TTL) of each entry but `.` and `..`.
    fn list_plus(&self, ino: u64) -> Vec<(String, u64, Duration, Duration)> {
        let dir = self.view.opendir(ino, Caller::UNKNOWN).unwrap();
        let mut out = Vec::new();
        self.view
            .readdirplus(ino, dir.fh, 0, Caller::UNKNOWN, |e, entry| {
                assert_eq!(e.ino, entry.attr.ino);
                if &*e.name != "." && &*e.name != ".." {
                    out.push((
                        e.name.to_string(),
                        entry.attr.ino,
                        entry.entry_ttl,
                        entry.attr_ttl,
                    ));
                }
                false
            })
            .unwrap();
        self.view.releasedir(dir.fh);
        out
    }
}

#[test]
fn readdirplus_answers_what_lookup_answers_and_counts_one_reference_per_entry() {
    let fx = Fixture::new();
    fx.seed();
    let pa = fx.ino("default/blah/p=a");
    let plus = fx.list_plus(pa);
    assert_eq!(
        plus.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(),
        vec!["000001_0", "000003_0"]
    );
    for (name, ino, entry_ttl, attr_ttl) in &plus {
        let looked = fx.lookup(pa, name).unwrap();
        assert_eq!(looked.attr.ino, *ino);
        assert_eq!((looked.entry_ttl, looked.attr_ttl), (*entry_ttl, *attr_ttl));
        assert!(*entry_ttl > Duration::ZERO, "immutable level is cached");
        // One reference from readdirplus, one from the lookup above.
        assert_eq!(fx.view.lookup_count(*ino), 2);
    }
    // Root and database levels: zero entry TTL, like their lookups.
    for (_, _, entry_ttl, _) in fx
        .list_plus(ROOT)
        .iter()
        .chain(&fx.list_plus(fx.ino("default")))
    {
        assert_eq!(*entry_ttl, Duration::ZERO);
    }
}

#[test]
fn readdirplus_of_an_immutable_directory_gives_each_entry_the_attributes_of_its_lookup() {
    let fx = Fixture::new();
    fx.seed();
    for dir in ["default/blah", "default/blah/p=a"] {
        let ino = fx.ino(dir);
        let handle = fx.view.opendir(ino, Caller::UNKNOWN).unwrap();
        let mut plus = Vec::new();
        fx.view
            .readdirplus(ino, handle.fh, 0, Caller::UNKNOWN, |e, entry| {
                if &*e.name != "." && &*e.name != ".." {
                    plus.push((e.name.to_string(), entry.clone()));
                }
                false
            })
            .unwrap();
        fx.view.releasedir(handle.fh);
        assert!(!plus.is_empty(), "{dir} lists something");
        for (name, entry) in plus {
            let looked = fx.lookup(ino, &name).unwrap();
            assert_eq!(looked.attr, entry.attr, "{dir}/{name}");
            assert_eq!(
                (looked.entry_ttl, looked.attr_ttl),
                (entry.entry_ttl, entry.attr_ttl)
            );
        }
    }
}

#[test]
fn a_directory_too_large_for_one_default_getdents_buffer_reports_a_block_size_that_fits_it() {
    let fx = Fixture::new();
    fx.seed();
    let files: Vec<String> = (0..1000)
        .map(|i| fx.file(&format!("default/blah/p=big/f{i:06}"), b"x"))
        .collect();
    fx.commit(&format!(
        r#"{{"id": 50, "op": "add_files", "db": "default", "table": "blah", "partition": {{"p": "big"}}, "files": [{}]}}"#,
        files.join(",")
    ));
    let big = fx.walk("default/blah/p=big").unwrap().attr;
    // 1,002 entries of READDIRPLUS need ~176 KiB: one 256 KiB buffer.
    assert_eq!(big.blksize, 256 << 10);
    // Small directories and files keep the page size.
    assert_eq!(fx.walk("default/blah/p=a").unwrap().attr.blksize, 4096);
    assert_eq!(
        fx.walk("default/blah/p=a/000001_0").unwrap().attr.blksize,
        4096
    );
}

#[test]
fn readdirplus_entry_refused_by_a_full_reply_is_not_counted() {
    let fx = Fixture::new();
    fx.seed();
    let pa = fx.ino("default/blah/p=a");
    let dir = fx.view.opendir(pa, Caller::UNKNOWN).unwrap();
    let mut taken = Vec::new();
    fx.view
        .readdirplus(pa, dir.fh, 0, Caller::UNKNOWN, |e, entry| {
            if taken.len() == 3 {
                return true; // `.`, `..`, the first file fit; the second not
            }
            taken.push((e.name.to_string(), entry.attr.ino));
            false
        })
        .unwrap();
    fx.view.releasedir(dir.fh);
    assert_eq!(taken[2].0, "000001_0");
    assert_eq!(fx.view.lookup_count(taken[2].1), 1);
    // `.` and `..` are never counted.
    assert_eq!(fx.view.lookup_count(pa), 1);
    let second = fx.walk("default/blah/p=a/000003_0").unwrap().attr.ino;
    assert_eq!(fx.view.lookup_count(second), 1, "only the walk's reference");
}

#[test]
fn readdirplus_at_root_and_database_level_follows_commits_and_pins() {
    let fx = Fixture::new();
    fx.seed();
    let db = fx.ino("default");
    let at_40 = fx.list_plus(db);
    assert_eq!(at_40.len(), 1);
    assert_eq!(at_40[0].1, fx.ino("default/blah"));
    fx.insert(50, "c", "000004_0", b"20\n");
    let at_50 = fx.list_plus(db);
    assert_ne!(at_50[0].1, at_40[0].1, "the commit shows at once");
    assert_eq!(at_50[0].1, fx.ino("default/blah"));
    fx.set_pin(fx.ino("default/blah"), "40").unwrap();
    assert_eq!(fx.list_plus(db)[0].1, at_40[0].1, "the pin shows at once");
    // A database dropped at the root disappears from the root's listing,
    // unless a table pin keeps it.
    fx.commit(r#"{"id": 60, "op": "drop_database", "db": "default"}"#);
    assert_eq!(fx.list_plus(ROOT).len(), 1);
    fx.view
        .removexattr(
            fx.ino("default/blah"),
            OsStr::new(xattr::PIN),
            Caller::UNKNOWN,
        )
        .unwrap();
    assert!(fx.list_plus(ROOT).is_empty());
    // A handle opened before a drop leaves out the name that went.
    fx.commit(r#"{"id": 70, "op": "create_database", "db": "other"}"#);
    let root = fx.view.opendir(ROOT, Caller::UNKNOWN).unwrap();
    fx.commit(r#"{"id": 80, "op": "drop_database", "db": "other"}"#);
    let mut names = Vec::new();
    fx.view
        .readdirplus(ROOT, root.fh, 0, Caller::UNKNOWN, |e, _| {
            names.push(e.name.to_string());
            false
        })
        .unwrap();
    fx.view.releasedir(root.fh);
    assert_eq!(names, vec![".", ".."]);
}

#[test]
fn other_users_holds_past_the_limit_are_released_oldest_first_and_owners_are_not() {
    let fx = Fixture::new();
    fx.seed();
    let other = Caller { pid: 0, uid: 4321 };
    let owner = Caller { pid: 0, uid: 1234 };
    // Each insert makes a new p=a; both users hold every one. 16 are
    // retained, so the first LIMIT + 3 go old.
    let total = 16 + HOLD_LIMIT + 3;
    let mut held = Vec::new();
    for i in 0..total {
        fx.insert(
            100 + i as u64,
            "a",
            &format!("f{i}"),
            format!("{i}\n").as_bytes(),
        );
        let pa = fx.ino("default/blah/p=a");
        let theirs = fx.view.opendir(pa, other).unwrap().fh;
        let mine = fx.view.opendir(pa, owner).unwrap().fh;
        held.push((theirs, mine));
    }
    let roots = fx.view.held_dirs();
    // Released: the other user's 3 oldest; everything else is a root.
    assert_eq!(roots.len(), 2 * total - 3);
    let readdir = |fh| fx.view.readdir(fh, 0, |_| false);
    for (i, (theirs, mine)) in held.iter().enumerate() {
        assert!(readdir(*mine).is_ok(), "owner's hold {i} released");
        match readdir(*theirs) {
            Err(e) if i < 3 => assert_eq!(e.errno(), libc::ESTALE),
            Ok(()) if i >= 3 => {}
            got => panic!("hold {i}: {got:?}"),
        }
    }
    let holds = fx.view.holds_report(&fx.view.catalog().snapshot());
    assert_eq!(holds["old_versions_held"], HOLD_LIMIT);
    assert_eq!(holds["released_handles"], 3);
}

/// A table directory at its live name that the visible state moved past
/// is invalidated there only once no reader's view answers it: a process
/// of that reader may have entered it after the maintenance pass read the
/// working directories, and the invalidation would unhash its working
/// directory (`getcwd` fails with `ENOENT`).
#[test]
fn a_live_entry_a_readers_view_still_answers_is_kept_until_the_view_moves() {
    let f = Fixture::new();
    f.seed();
    let me = Caller {
        pid: std::process::id(),
        uid: 0,
    };
    let lookup = |parent: u64, name: &str| {
        f.view
            .lookup(parent, OsStr::new(name), me)
            .unwrap()
            .attr
            .ino
    };
    let db = lookup(ROOT, "default");
    let old = lookup(db, "blah");
    f.insert(50, "c", "000004_0", b"20\n");
    let mount = Path::new("/mnt/stagefs-test");
    let invalidates_blah = |plan: &[DentryAction]| {
        plan.iter()
            .any(|a| matches!(a, DentryAction::Invalidate { name, .. } if &**name == "blah"))
    };
    // This process's view is still at 40, where `blah` is `old`.
    assert_eq!(lookup(db, "blah"), old, "the view keeps its state");
    let plan = f.view.dentry_plan(mount, Vec::new);
    assert!(!invalidates_blah(&plan), "{plan:?}");
    // Read-your-check moves the view to 50: nobody answers `old` there
    // any more.
    f.view
        .getxattr(ROOT, OsStr::new(xattr::VISIBLE), me)
        .unwrap();
    let plan = f.view.dentry_plan(mount, Vec::new);
    assert!(invalidates_blah(&plan), "{plan:?}");
}

/// A directory the kernel opened without a request (file handle 0, a
/// session's own connection) lists what an opened one lists, also when
/// read in pieces: each request resumes where the last one ended.
#[test]
fn a_directory_read_without_a_handle_lists_what_an_opened_one_lists() {
    let fx = Fixture::new();
    fx.seed();
    let pa = fx.ino("default/blah/p=a");
    let opened = fx.list_plus(pa);
    let mut unopened = Vec::new();
    let mut offset = 0;
    loop {
        // One entry per request: the reply is full after it.
        let mut got = None;
        fx.view
            .readdirplus(pa, 0, offset, Caller::UNKNOWN, |e, entry| {
                if got.is_some() {
                    return true;
                }
                got = Some((e.offset, e.name.to_string(), entry.clone()));
                false
            })
            .unwrap();
        let Some((next, name, entry)) = got else {
            break;
        };
        offset = next;
        if name != "." && name != ".." {
            unopened.push((name, entry.attr.ino, entry.entry_ttl, entry.attr_ttl));
        }
    }
    assert_eq!(unopened, opened);
    let mut names = Vec::new();
    fx.view
        .readdir_unopened(pa, 0, Caller::UNKNOWN, |e| {
            names.push(e.name.to_string());
            false
        })
        .unwrap();
    assert_eq!(names, vec![".", "..", "000001_0", "000003_0"]);
}
