//! Pinning through the real daemon (SPEC §5): a pinned table keeps its
//! version through hundreds of commits, GC, restarts and crashes; unpin,
//! root pins, pins of dropped tables, and every errno of the pin attribute.

mod common;

use std::fs;
use std::time::Duration;

use common::daemon::*;
use common::*;
use serde_json::json;
use stagefs::event::StateId;
use stagefs::workload::{write_seed_example, Workload, WorkloadConfig};

const PIN: &str = "user.stagefs.pin";
const STATE_ID: &str = "user.stagefs.state_id";

fn workload(root: &std::path::Path, seed: u64, churn: bool) -> Workload {
    Workload::new(
        root,
        WorkloadConfig {
            seed,
            table_churn: churn,
            ..WorkloadConfig::default()
        },
    )
    .unwrap()
}

fn steps(w: &mut Workload, n: usize) -> u64 {
    for _ in 0..n {
        w.step().unwrap();
    }
    w.flush().unwrap();
    w.latest().0
}

/// Waits until everything the workload wrote is visible (long runs).
fn catch_up(d: &Daemon, w: &Workload) -> serde_json::Value {
    let last = w.latest().0;
    d.wait_status_for(&format!("visible = {last}"), Duration::from_secs(20), |s| {
        visible(s) >= last
    })
}

/// A table of the oracle at `state` never renamed into its name (`tN`),
/// with content: its name.
fn plain_table(w: &Workload, state: u64) -> Option<String> {
    w.expected(StateId(state))
        .unwrap()
        .iter()
        .filter(|(k, c)| !k.contains('_') && !c.is_empty())
        .map(|(k, _)| k.split_once('.').unwrap().1.to_owned())
        .next()
}

/// The pinned table shows exactly the oracle's content at `pin`, its
/// `state_id` is its last change at or before `pin`, and its blobs are kept.
fn check_pinned(d: &Daemon, w: &Workload, db: &str, t: &str, pin: u64) {
    let table = d.join(&format!("{db}/{t}"));
    assert_eq!(getxattr(&table, PIN).unwrap(), pin.to_string());
    let (id, content) = read_table(&table);
    let want = w
        .expected_table(StateId(pin), db, t)
        .unwrap_or_else(|| panic!("{db}.{t} absent at {pin}"));
    assert_eq!(content, expected_tree(want), "{db}.{t} pinned at {pin}");
    assert_eq!(id, last_change(w, db, t, pin), "state_id of {db}.{t}");
    for sha in content.values() {
        assert!(
            blob_path(&d.args().state, sha).exists(),
            "blob of a pinned file was collected"
        );
    }
    let s = d.status();
    assert_eq!(s["pins"][format!("{db}.{t}")], pin, "{s}");
    assert!(
        retained(&s).contains(&pin),
        "pinned {pin} not retained: {s}"
    );
}

/// A workload running under `--retain 2`, one plain table pinned at the
/// visible state after 30 events, then 300 more events replicated and GC
/// having removed blobs. Returns (pin, table name).
fn pinned_run(d: &Daemon, w: &mut Workload) -> (u64, String) {
    for _ in 0..10 {
        if plain_table(w, w.latest().0).is_some() {
            break;
        }
        steps(w, 3);
    }
    let s = catch_up(d, w);
    let pin = visible(&s);
    let t = plain_table(w, pin).expect("a plain table with content");
    let table = d.join(&format!("db0/{t}"));
    setxattr(&table, PIN, pin.to_string().as_bytes()).unwrap();
    check_pinned(d, w, "db0", &t, pin);
    steps(w, 300);
    catch_up(d, w);
    let s = d.wait_status("GC removed blobs", |s| {
        s["gc"]["removed_blobs"].as_u64().unwrap() > 0
    });
    assert!(retained(&s).len() <= 4, "retain 2 + visible + pin: {s}");
    (pin, t)
}

#[test]
fn pin_holds_through_hundreds_of_commits_and_gc() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path()).retain(2);
    let mut w = workload(args.mnt.parent().unwrap(), 25, true);
    steps(&mut w, 30);
    let d = Daemon::start(args);
    let (pin, t) = pinned_run(&d, &mut w);
    assert!(w.latest().0 > pin + 300);
    check_pinned(&d, &w, "db0", &t, pin);
    // Old, unpinned, unretained states are gone from snapshots.
    assert!(
        names(&d.join(".stagefs/snapshots")).len() <= 4,
        "{:?}",
        names(&d.join(".stagefs/snapshots"))
    );
    assert!(d.join(&format!(".stagefs/snapshots/{pin}")).exists());
}

#[test]
fn pin_survives_restart_and_kill9() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path()).retain(2);
    let mut w = workload(args.mnt.parent().unwrap(), 22, true);
    steps(&mut w, 30);
    let mut d = Daemon::start(args);
    let (pin, t) = pinned_run(&d, &mut w);
    // Clean restart.
    let st = d.sigterm();
    assert_eq!(st.code(), Some(0));
    d.restart();
    check_pinned(&d, &w, "db0", &t, pin);
    // Crash while commits go on, then the same command again.
    steps(&mut w, 40);
    std::thread::sleep(Duration::from_millis(20));
    d.kill9();
    detach(d.mnt()); // the dead FUSE mount a kill -9 leaves behind
    steps(&mut w, 10);
    d.restart();
    catch_up(&d, &w);
    check_pinned(&d, &w, "db0", &t, pin);
}

#[test]
fn unpin_shows_the_newest_visible_state() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path()).retain(2);
    let mut w = workload(args.mnt.parent().unwrap(), 23, false);
    steps(&mut w, 30);
    let d = Daemon::start(args);
    let pin = visible(&catch_up(&d, &w));
    let t = plain_table(&w, pin).unwrap();
    let table = d.join(&format!("db0/{t}"));
    setxattr(&table, PIN, b"visible").unwrap();
    assert_eq!(getxattr(&table, PIN).unwrap(), pin.to_string());
    let last = steps(&mut w, 60);
    catch_up(&d, &w);
    // Make sure the table changed after the pin, so the check means something.
    assert_ne!(
        w.expected_table(StateId(pin), "db0", &t),
        w.expected_table(StateId(last), "db0", &t),
        "pick another seed: {t} did not change"
    );
    check_pinned(&d, &w, "db0", &t, pin);
    removexattr(&table, PIN).unwrap();
    assert_eq!(getxattr(&table, PIN), Err(libc::ENODATA));
    let (id, content) = read_table(&table);
    let want = w.expected_table(StateId(last), "db0", &t).unwrap();
    assert_eq!(content, expected_tree(want));
    assert_eq!(id, last_change(&w, "db0", &t, last));
    assert!(d.status()["pins"].as_object().unwrap().is_empty());
}

#[test]
fn root_pin_freezes_every_table_and_a_table_pin_wins() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path());
    let mut w = workload(args.mnt.parent().unwrap(), 24, false);
    steps(&mut w, 30);
    let d = Daemon::start(args);
    let root = d.mnt().to_owned();
    let l1 = visible(&catch_up(&d, &w));
    setxattr(&root, PIN, b"visible").unwrap();
    assert_eq!(getxattr(&root, PIN).unwrap(), l1.to_string());
    steps(&mut w, 40);
    let l2 = visible(&catch_up(&d, &w));
    // Pin one table at the newer state: it wins over the root pin.
    let tables: Vec<String> = w
        .expected(StateId(l2))
        .unwrap()
        .keys()
        .map(|k| k.split_once('.').unwrap().1.to_owned())
        .collect();
    let special = tables.last().unwrap().clone();
    setxattr(
        &d.join(&format!("db0/{special}")),
        PIN,
        l2.to_string().as_bytes(),
    )
    .unwrap();
    let l3 = steps(&mut w, 30);
    catch_up(&d, &w);
    assert_eq!(getxattr(&root, STATE_ID).unwrap(), l1.to_string());
    assert_eq!(
        getxattr(&root, "user.stagefs.visible").unwrap(),
        l3.to_string()
    );
    let mut listed_want: Vec<String> = w
        .expected(StateId(l1))
        .unwrap()
        .keys()
        .map(|k| k.split_once('.').unwrap().1.to_owned())
        .collect();
    if !listed_want.contains(&special) {
        listed_want.push(special.clone());
        listed_want.sort();
    }
    assert_eq!(names(&d.join("db0")), listed_want);
    for t in &listed_want {
        let at = if *t == special { l2 } else { l1 };
        let (id, content) = read_table(&d.join(&format!("db0/{t}")));
        let want = w.expected_table(StateId(at), "db0", t).unwrap();
        assert_eq!(content, expected_tree(want), "db0.{t} should show {at}");
        assert_eq!(id, last_change(&w, "db0", t, at), "state_id of db0.{t}");
    }
    let s = d.status();
    assert_eq!(s["pins"]["/"], l1);
    assert_eq!(s["pins"][format!("db0.{special}")], l2);
    // Unpin the table: back under the root pin.
    removexattr(&d.join(&format!("db0/{special}")), PIN).unwrap();
    if let Some(want) = w.expected_table(StateId(l1), "db0", &special) {
        let (_, content) = read_table(&d.join(&format!("db0/{special}")));
        assert_eq!(content, expected_tree(want));
    }
    // Unpin the root: everything at the newest state.
    removexattr(&root, PIN).unwrap();
    assert_eq!(getxattr(&root, STATE_ID).unwrap(), l3.to_string());
    for (key, want) in w.expected(StateId(l3)).unwrap().iter() {
        let t = key.split_once('.').unwrap().1;
        let (id, content) = read_table(&d.join(&format!("db0/{t}")));
        assert_eq!(content, expected_tree(want), "{key} at {l3}");
        assert_eq!(id, last_change(&w, "db0", t, l3));
    }
}

#[test]
fn pinned_version_of_a_dropped_table_stays_readable() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path()).retain(1);
    let w = EventWriter::new(&args);
    w.append(json!({"id": 1, "op": "create_database", "db": "default"}));
    w.append(json!({"id": 2, "op": "create_table", "db": "default", "table": "blah", "partition_keys": ["p"]}));
    let fa = w.put_file("default/blah/p=a/000000_0", b"kept a\n");
    let fb = w.put_file("default/blah/p=b/000000_0", b"kept b\n");
    w.append(json!({"id": 3, "op": "add_files", "db": "default", "table": "blah", "partition": {"p": "a"}, "files": [fa]}));
    w.append(json!({"id": 4, "op": "add_files", "db": "default", "table": "blah", "partition": {"p": "b"}, "files": [fb]}));
    let mut d = Daemon::start(args);
    d.wait_visible(4);
    let table = d.join("default/blah");
    setxattr(&table, PIN, b"4").unwrap();
    let want = std::collections::BTreeMap::from([
        ("p=a/000000_0".to_owned(), sha256_hex(b"kept a\n")),
        ("p=b/000000_0".to_owned(), sha256_hex(b"kept b\n")),
    ]);
    // Dropped at the source (its files leave for change management), and
    // another table appears; several commits so GC runs with --retain 1.
    w.retire("default/blah/p=a/000000_0", b"kept a\n");
    w.retire("default/blah/p=b/000000_0", b"kept b\n");
    w.append(json!({"id": 5, "op": "drop_table", "db": "default", "table": "blah"}));
    w.append(json!({"id": 6, "op": "create_table", "db": "default", "table": "other"}));
    // "other" is overwritten each time, so GC has garbage to collect.
    let mut prev: Option<Vec<u8>> = None;
    for id in 7..10u64 {
        if let Some(p) = &prev {
            w.retire("default/other/f", p);
        }
        let bytes = format!("{id}\n").into_bytes();
        let f = w.put_file("default/other/f", &bytes);
        w.append(json!({"id": id, "op": "replace_files", "db": "default", "table": "other", "files": [f]}));
        d.wait_visible(id);
        prev = Some(bytes);
    }
    let first_other = blob_path(&d.args().state, &sha256_hex(b"7\n"));
    d.wait_status("GC collected the first version of other", |_| {
        !first_other.exists()
    });
    assert_eq!(names(&d.join("default")), vec!["blah", "other"]);
    assert_eq!(read_table(&table), (4, want.clone()));
    assert!(!d.join(".stagefs/snapshots/9/default/blah").exists());
    // Even with the whole database dropped, the pinned table is reachable.
    w.append(json!({"id": 10, "op": "drop_database", "db": "default"}));
    w.retire("default/other/f", b"9\n");
    w.append(json!({"id": 11, "op": "create_database", "db": "fresh"}));
    d.wait_visible(11);
    let last_other = blob_path(&d.args().state, &sha256_hex(b"9\n"));
    d.wait_status("GC collected the dropped database's other table", |_| {
        !last_other.exists()
    });
    assert_eq!(names(d.mnt()), vec!["default", "fresh"]);
    assert_eq!(names(&d.join("default")), vec!["blah"]);
    assert_eq!(read_table(&table), (4, want.clone()));
    // Across a restart too.
    assert_eq!(d.sigterm().code(), Some(0));
    d.restart();
    assert_eq!(read_table(&table), (4, want));
    // Unpinned, it is gone.
    removexattr(&table, PIN).unwrap();
    assert_eq!(names(d.mnt()), vec!["fresh"]);
    assert!(fs::metadata(&table).is_err());
}

#[test]
fn pin_errnos_through_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path()).retain(3);
    let w = EventWriter::new(&args);
    let d = Daemon::start(args);
    let add = |id: u64, event: serde_json::Value| {
        w.append(event);
        d.wait_visible(id);
    };
    add(
        1,
        json!({"id": 1, "op": "create_database", "db": "default"}),
    );
    add(
        2,
        json!({"id": 2, "op": "create_table", "db": "default", "table": "blah", "partition_keys": ["p"]}),
    );
    for (id, p) in [(3u64, "a"), (4, "b"), (5, "a")] {
        let f = w.put_file(&format!("default/blah/p={p}/f{id}"), b"x\n");
        add(
            id,
            json!({"id": id, "op": "add_files", "db": "default", "table": "blah", "partition": {"p": p}, "files": [f]}),
        );
    }
    add(
        6,
        json!({"id": 6, "op": "create_table", "db": "default", "table": "late"}),
    );
    let f = w.put_file("default/late/f7", b"late\n");
    add(
        7,
        json!({"id": 7, "op": "add_files", "db": "default", "table": "late", "files": [f]}),
    );
    let s = d.wait_status("retained 5, 6, 7", |s| retained(s) == vec![5, 6, 7]);
    let root = d.mnt().to_owned();
    let blah = d.join("default/blah");
    let late = d.join("default/late");

    // ENODATA: reading or removing a pin that is not set.
    for p in [&root, &blah, &late] {
        assert_eq!(getxattr(p, PIN), Err(libc::ENODATA), "{}", p.display());
        assert_eq!(removexattr(p, PIN), Err(libc::ENODATA), "{}", p.display());
        assert!(!listxattr(p).unwrap().contains(&PIN.to_owned()));
    }
    // EINVAL: not an id, not retained, table absent at that state.
    for bad in [
        "abc",
        "-1",
        "",
        "6x",
        "6 7",
        "0x6",
        "+6",
        "99999999999999999999999",
    ] {
        assert_eq!(
            setxattr(&blah, PIN, bad.as_bytes()),
            Err(libc::EINVAL),
            "{bad:?}"
        );
        assert_eq!(
            setxattr(&root, PIN, bad.as_bytes()),
            Err(libc::EINVAL),
            "root {bad:?}"
        );
    }
    for not_retained in ["3", "4", "8", "100"] {
        assert_eq!(
            setxattr(&blah, PIN, not_retained.as_bytes()),
            Err(libc::EINVAL),
            "{not_retained}"
        );
        assert_eq!(
            setxattr(&root, PIN, not_retained.as_bytes()),
            Err(libc::EINVAL),
            "root {not_retained}"
        );
    }
    assert_eq!(setxattr(&late, PIN, b"5"), Err(libc::EINVAL), "late at 5");
    // ENOTSUP: not the root or a table directory reached through it, or
    // another attribute name.
    let enotsup = [
        d.join("default"),
        d.join("default/blah/p=a"),
        d.join("default/blah/p=a/f3"),
        d.join("default/late/f7"),
        d.join(".stagefs"),
        d.join(".stagefs/status"),
        d.join(".stagefs/snapshots"),
        d.join(".stagefs/snapshots/7"),
        // An older version of `late` (not the live one).
        d.join(".stagefs/snapshots/6/default/late"),
    ];
    for p in &enotsup {
        assert_eq!(
            setxattr(p, PIN, b"7"),
            Err(libc::ENOTSUP),
            "{}",
            p.display()
        );
        assert_eq!(
            setxattr(p, PIN, b"visible"),
            Err(libc::ENOTSUP),
            "{}",
            p.display()
        );
    }
    for p in [&root, &blah] {
        assert_eq!(setxattr(p, "user.stagefs.other", b"7"), Err(libc::ENOTSUP));
        assert_eq!(setxattr(p, STATE_ID, b"7"), Err(libc::ENOTSUP));
        assert_eq!(removexattr(p, STATE_ID), Err(libc::ENOTSUP));
    }
    // Nothing got pinned by all that.
    assert!(d.status()["pins"].as_object().unwrap().is_empty(), "{s}");

    // Valid pins, and the status shows their scopes.
    setxattr(&blah, PIN, b"5").unwrap();
    setxattr(&late, PIN, b"6").unwrap();
    setxattr(&root, PIN, b"visible").unwrap();
    assert_eq!(getxattr(&blah, PIN).unwrap(), "5");
    assert_eq!(getxattr(&late, PIN).unwrap(), "6");
    assert_eq!(getxattr(&root, PIN).unwrap(), "7");
    assert!(listxattr(&blah).unwrap().contains(&PIN.to_owned()));
    assert_eq!(
        d.status()["pins"],
        json!({"/": 7, "default.blah": 5, "default.late": 6})
    );
    assert!(names(&late).is_empty(), "late at 6 is empty");
    // Re-pinning replaces; a bad value leaves the old pin in place.
    assert_eq!(setxattr(&blah, PIN, b"abc"), Err(libc::EINVAL));
    assert_eq!(getxattr(&blah, PIN).unwrap(), "5");
    setxattr(&blah, PIN, b"7").unwrap();
    assert_eq!(getxattr(&blah, PIN).unwrap(), "7");
    removexattr(&blah, PIN).unwrap();
    removexattr(&late, PIN).unwrap();
    removexattr(&root, PIN).unwrap();
    assert_eq!(removexattr(&root, PIN), Err(libc::ENODATA));
    assert!(d.status()["pins"].as_object().unwrap().is_empty());
}

/// SEMANTICS: `pin` on a node that is not the mount root or a table
/// directory reached through it is `ENOTSUP`. A table reached through
/// `.stagefs/snapshots/<id>/` whose version is also the live one shares the
/// live table's inode, so the pin is accepted there and pins the live
/// table (see the report).
#[test]
fn pin_through_a_snapshot_path_that_is_the_live_version_pins_that_table() {
    // Inode identity: a table version is one inode wherever it is reached,
    // so `.stagefs/snapshots/50/default/blah` *is* the live `default/blah`
    // directory while 50 is visible. Pinning it pins the table by the name
    // it was reached through from the mount root (docs/SEMANTICS.md); a
    // snapshot-only table version answers ENOTSUP (see
    // `pin_errnos_through_the_daemon`).
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path());
    write_seed_example(args.mnt.parent().unwrap()).unwrap();
    let d = Daemon::start(args);
    d.wait_visible(50);
    assert_eq!(getxattr(&d.join("default/blah"), PIN), Err(libc::ENODATA));
    let snap = d.join(".stagefs/snapshots/50/default/blah");
    assert_eq!(getxattr(&snap, STATE_ID).unwrap(), "50");
    assert_eq!(setxattr(&snap, PIN, b"50"), Ok(()));
    assert_eq!(d.status()["pins"]["default.blah"], 50);
    assert_eq!(getxattr(&d.join("default/blah"), PIN).unwrap(), "50");
}
