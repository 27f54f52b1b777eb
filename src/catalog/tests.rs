use super::*;
use crate::event::Event;

const SHA1: &str = "f0b5c2c2211c8d67ed15e75e656c7862d086e9245420892a7de62cd9ec582a06";
const SHA2: &str = "917df3320d778ddbaa5c5c7742bc4046bf803c36ed2b050f30844ed206783469";
const SHA3: &str = "238903180cc104ec2c5d8b3f20c5bc61b389ec0a967df8cc208cdc7cd454174f";
const SHA4: &str = "5378796307535df3ec8d8b15a2e2dc5641419c3d3060cfe32238c0fa973f7aa3";

fn ev(s: &str) -> Event {
    Event::parse_line(s.as_bytes()).unwrap()
}

fn seed_events() -> Vec<Event> {
    let f = |id: u32, op: &str, p: &str, name: &str, sha: &str| {
        ev(&format!(
            r#"{{"id": {id}, "op": "{op}", "db": "default", "table": "blah", "partition": {{"p": "{p}"}}, "files": [{{"path": "default/blah/p={p}/{name}", "size": 2, "sha256": "{sha}"}}]}}"#
        ))
    };
    vec![
        ev(r#"{"id": 5, "op": "create_database", "db": "default"}"#),
        ev(
            r#"{"id": 10, "op": "create_table", "db": "default", "table": "blah", "partition_keys": ["p"]}"#,
        ),
        f(20, "add_files", "a", "000001_0", SHA1),
        f(30, "add_files", "b", "000002_0", SHA2),
        f(40, "add_files", "a", "000003_0", SHA3),
        f(50, "replace_files", "b", "000004_0", SHA4),
    ]
}

fn listing(tree: &Tree) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(prefix: &str, dir: &DirNode, out: &mut Vec<String>) {
        for (name, child) in dir.children.iter() {
            let path = format!("{prefix}/{name}");
            match child {
                Node::Dir(d) => {
                    out.push(format!("{path}/"));
                    walk(&path, d, out)
                }
                Node::File(f) => out.push(format!("{path}={}", &f.blob().to_hex()[..4])),
            }
        }
    }
    walk("", &tree.root, &mut out);
    out
}

#[test]
fn seed_example_builds_each_state() {
    let mut tree = Tree::empty();
    let mut states = Vec::new();
    for e in seed_events() {
        tree = tree.apply(&e).unwrap().0;
        states.push(listing(&tree));
    }
    assert_eq!(states[1], vec!["/default/", "/default/blah/"]);
    assert_eq!(
        states[4],
        vec![
            "/default/",
            "/default/blah/",
            "/default/blah/p=a/",
            "/default/blah/p=a/000001_0=f0b5",
            "/default/blah/p=a/000003_0=2389",
            "/default/blah/p=b/",
            "/default/blah/p=b/000002_0=917d"
        ]
    );
    assert_eq!(states[5].last().unwrap(), "/default/blah/p=b/000004_0=5378");
}

#[test]
fn unchanged_subtrees_keep_their_node_ids() {
    let events = seed_events();
    let mut tree = Tree::empty();
    for e in &events[..4] {
        tree = tree.apply(e).unwrap().0;
    }
    let before_a = tree
        .lookup(&["default".into(), "blah".into()], "p=a")
        .unwrap()
        .id();
    let before_b = tree
        .lookup(&["default".into(), "blah".into()], "p=b")
        .unwrap()
        .id();
    let after = tree.apply(&events[4]).unwrap().0;
    assert_ne!(
        after
            .lookup(&["default".into(), "blah".into()], "p=a")
            .unwrap()
            .id(),
        before_a
    );
    assert_eq!(
        after
            .lookup(&["default".into(), "blah".into()], "p=b")
            .unwrap()
            .id(),
        before_b
    );
    let table = after.table("default", "blah").unwrap();
    assert_eq!(table.meta.state_id, StateId(40));
}

#[test]
fn missing_file_blocks_every_state_that_references_it() {
    let events = seed_events();
    let mut pending = Pending::new(Arc::new(Tree::empty()));
    let held_back = BlobId::from_hex(SHA2).unwrap();
    for e in &events[..5] {
        pending.apply(e, |f| f.blob != held_back).unwrap();
    }
    // 30 and 40 reference the held-back file: 20 is the newest complete.
    assert_eq!(pending.newest_complete().unwrap().state_id, StateId(20));
    assert_eq!(pending.first_blocked().unwrap().0, StateId(30));
    // 50 replaces p=b without it: 50 may commit even though 30/40 never do.
    pending.apply(&events[5], |f| f.blob != held_back).unwrap();
    assert_eq!(pending.newest_complete().unwrap().state_id, StateId(50));
    pending.committed(StateId(50));
    assert!(!pending.is_missing(&held_back));
}

#[test]
fn staged_file_unblocks_its_state() {
    let events = seed_events();
    let mut pending = Pending::new(Arc::new(Tree::empty()));
    let held_back = BlobId::from_hex(SHA2).unwrap();
    for e in &events[..5] {
        pending.apply(e, |f| f.blob != held_back).unwrap();
    }
    pending.staged(&held_back);
    assert_eq!(pending.newest_complete().unwrap().state_id, StateId(40));
}

#[test]
fn events_that_cannot_apply_are_rejected_and_change_nothing() {
    let mut tree = Tree::empty();
    for e in &seed_events()[..3] {
        tree = tree.apply(e).unwrap().0;
    }
    let before = listing(&tree);
    let bad = [
        (
            r#"{"id": 99, "op": "create_database", "db": "default"}"#,
            "already exists",
        ),
        (
            r#"{"id": 99, "op": "drop_database", "db": "nope"}"#,
            "does not exist",
        ),
        (
            r#"{"id": 99, "op": "create_table", "db": "default", "table": "blah"}"#,
            "already exists",
        ),
        (
            r#"{"id": 99, "op": "drop_table", "db": "default", "table": "nope"}"#,
            "does not exist",
        ),
        (
            r#"{"id": 99, "op": "add_files", "db": "nope", "table": "t", "files": []}"#,
            "does not exist",
        ),
        (
            r#"{"id": 99, "op": "drop_partition", "db": "default", "table": "blah", "partition": {"p": "zz"}}"#,
            "does not exist",
        ),
        (
            r#"{"id": 99, "op": "add_files", "db": "default", "table": "blah", "partition": {"q": "a"}, "files": []}"#,
            "partition keys",
        ),
        (
            r#"{"id": 99, "op": "add_files", "db": "default", "table": "blah", "files": []}"#,
            "partition keys",
        ),
        (
            r#"{"id": 99, "op": "rename_table", "db": "default", "table": "blah", "new_db": "default", "new_table": "blah"}"#,
            "already exists",
        ),
        (r#"{"id": 19, "op": "noop"}"#, "does not increase"),
        (r#"{"id": 20, "op": "noop"}"#, "does not increase"),
    ];
    for (line, why) in bad {
        let err = tree.apply(&ev(line)).unwrap_err().to_string();
        assert!(err.contains(why), "{line}: {err}");
    }
    let dup = format!(
        r#"{{"id": 99, "op": "add_files", "db": "default", "table": "blah", "partition": {{"p": "a"}}, "files": [{{"path": "x/000001_0", "size": 1, "sha256": "{SHA3}"}}]}}"#
    );
    assert!(tree
        .apply(&ev(&dup))
        .unwrap_err()
        .to_string()
        .contains("already exists"));
    assert_eq!(listing(&tree), before);
}

#[test]
fn nested_partitions_are_escaped_and_pruned_on_drop() {
    let mut tree = Tree::empty();
    for line in [
        r#"{"id": 1, "op": "create_database", "db": "d"}"#.to_string(),
        r#"{"id": 2, "op": "create_table", "db": "d", "table": "t", "partition_keys": ["y", "m"]}"#
            .to_string(),
        format!(
            r#"{{"id": 3, "op": "add_partition", "db": "d", "table": "t", "partition": {{"m": "a/b", "y": "2024"}}, "files": [{{"path": "f1", "size": 1, "sha256": "{SHA1}"}}]}}"#
        ),
    ] {
        tree = tree.apply(&ev(&line)).unwrap().0;
    }
    assert!(listing(&tree).contains(&"/d/t/y=2024/m=a%2Fb/f1=f0b5".to_string()));
    tree = tree
        .apply(&ev(r#"{"id": 4, "op": "drop_partition", "db": "d", "table": "t", "partition": {"y": "2024", "m": "a/b"}}"#))
        .unwrap()
        .0;
    assert_eq!(listing(&tree), vec!["/d/", "/d/t/"]);
}

#[test]
fn rename_moves_the_table_node_unchanged() {
    let mut tree = Tree::empty();
    for e in &seed_events()[..3] {
        tree = tree.apply(e).unwrap().0;
    }
    let id = tree.table("default", "blah").unwrap().meta.id;
    tree = tree
        .apply(&ev(r#"{"id": 60, "op": "create_database", "db": "other"}"#))
        .unwrap()
        .0;
    tree = tree
        .apply(&ev(r#"{"id": 70, "op": "rename_table", "db": "default", "table": "blah", "new_db": "other", "new_table": "moved"}"#))
        .unwrap()
        .0;
    assert!(tree.table("default", "blah").is_none());
    assert_eq!(tree.table("other", "moved").unwrap().meta.id, id);
}

#[test]
fn replace_with_empty_list_truncates() {
    let mut tree = Tree::empty();
    for e in &seed_events()[..3] {
        tree = tree.apply(e).unwrap().0;
    }
    tree = tree
        .apply(&ev(r#"{"id": 60, "op": "replace_files", "db": "default", "table": "blah", "partition": {"p": "a"}, "files": []}"#))
        .unwrap()
        .0;
    assert_eq!(
        listing(&tree),
        vec!["/default/", "/default/blah/", "/default/blah/p=a/"]
    );
}

fn catalog_with_states(dir: &Path, ids: &[u64], retain: usize) -> Catalog {
    let mut tree = Tree::empty();
    for e in &seed_events()[..2] {
        tree = tree.apply(e).unwrap().0;
    }
    let cat = Catalog::new(
        dir,
        Arc::new(tree.clone()),
        BTreeMap::new(),
        Pins::default(),
        retain,
    );
    for &id in ids {
        tree = tree
            .apply(&ev(&format!(r#"{{"id": {id}, "op": "noop"}}"#)))
            .unwrap()
            .0;
        cat.commit(Arc::new(tree.clone())).unwrap();
    }
    cat
}

#[test]
fn retention_keeps_newest_n_and_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let cat = catalog_with_states(dir.path(), &[11, 12, 13], 2);
    let snap = cat.snapshot();
    assert_eq!(
        snap.versions.keys().map(|s| s.0).collect::<Vec<_>>(),
        vec![12, 13]
    );
    cat.set_pin(
        &PinScope::Table {
            db: "default".into(),
            table: "blah".into(),
        },
        "12",
    )
    .unwrap();
    let mut tree = (*cat.snapshot().visible).clone();
    for id in [14, 15, 16] {
        tree = tree
            .apply(&ev(&format!(r#"{{"id": {id}, "op": "noop"}}"#)))
            .unwrap()
            .0;
        cat.commit(Arc::new(tree.clone())).unwrap();
    }
    let snap = cat.snapshot();
    assert_eq!(
        snap.versions.keys().map(|s| s.0).collect::<Vec<_>>(),
        vec![12, 15, 16]
    );
    let (record, pins) = load_durable(dir.path()).unwrap();
    assert_eq!(record.visible, StateId(16));
    assert_eq!(record.retained, vec![StateId(12), StateId(15), StateId(16)]);
    assert_eq!(pins.tables.get("default.blah"), Some(&StateId(12)));
    assert_eq!(snap.table_tree("default", "blah").state_id, StateId(12));
    assert_eq!(snap.root_tree().state_id, StateId(16));
}

#[test]
fn pin_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cat = catalog_with_states(dir.path(), &[11, 12], 4);
    let table = PinScope::Table {
        db: "default".into(),
        table: "blah".into(),
    };
    assert_eq!(cat.set_pin(&PinScope::Root, "abc"), Err(PinError::BadValue));
    assert_eq!(cat.set_pin(&PinScope::Root, "-1"), Err(PinError::BadValue));
    assert_eq!(
        cat.set_pin(&PinScope::Root, "3"),
        Err(PinError::NotRetained(StateId(3)))
    );
    let nope = PinScope::Table {
        db: "default".into(),
        table: "nope".into(),
    };
    assert!(matches!(
        cat.set_pin(&nope, "12"),
        Err(PinError::NoTableAtState(..))
    ));
    assert_eq!(cat.set_pin(&table, "visible"), Ok(StateId(12)));
    assert_eq!(cat.set_pin(&PinScope::Root, "11\n"), Ok(StateId(11)));
    assert_eq!(cat.remove_pin(&table), Ok(true));
    assert_eq!(cat.remove_pin(&table), Ok(false));
}

#[test]
fn commit_never_goes_backwards() {
    let dir = tempfile::tempdir().unwrap();
    let cat = catalog_with_states(dir.path(), &[11, 12], 4);
    let old = cat.snapshot().versions[&StateId(11)].clone();
    cat.commit(old).unwrap();
    assert_eq!(cat.snapshot().visible.state_id, StateId(12));
}

#[test]
fn rename_keeps_a_missing_file_blocking() {
    // Found by the commit-rule property test: a file added before a rename
    // sits under the new name afterwards and still blocks the commit.
    let events = seed_events();
    let mut pending = Pending::new(Arc::new(Tree::empty()));
    let held_back = BlobId::from_hex(SHA1).unwrap();
    for e in &events[..3] {
        pending.apply(e, |f| f.blob != held_back).unwrap();
    }
    let rename = ev(
        r#"{"id": 21, "op": "rename_table", "db": "default", "table": "blah", "new_db": "default", "new_table": "moved"}"#,
    );
    pending.apply(&rename, |_| true).unwrap();
    assert_eq!(pending.newest_complete().unwrap().state_id, StateId(10));
    assert_eq!(pending.first_blocked().unwrap().0, StateId(20));
    pending.staged(&held_back);
    assert_eq!(pending.newest_complete().unwrap().state_id, StateId(21));
}

#[test]
fn commit_is_one_record_in_the_commit_log() {
    let dir = tempfile::tempdir().unwrap();
    let cat = catalog_with_states(dir.path(), &[11, 12, 13], 4);
    let log = crate::durable::read_log(&dir.path().join(COMMIT_LOG))
        .unwrap()
        .unwrap();
    assert_eq!(log.records.len(), 3);
    let (record, _) = load_durable(dir.path()).unwrap();
    assert_eq!(record.visible, StateId(13));
    assert_eq!(
        record.retained,
        cat.snapshot().versions.keys().copied().collect::<Vec<_>>()
    );
    assert!(!dir.path().join(LEGACY_COMMIT_FILE).exists());
}

#[test]
fn torn_commit_log_tail_falls_back_to_the_previous_commit_then_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(COMMIT_LOG);
    drop(catalog_with_states(dir.path(), &[11, 12], 4));
    let whole = std::fs::read(&path).unwrap();
    // A crash in the middle of appending the record of 12.
    std::fs::write(&path, &whole[..whole.len() - 5]).unwrap();
    let (record, _) = load_durable(dir.path()).unwrap();
    assert_eq!(record.visible, StateId(11));
    // The next writer cuts the tail and appends after the last whole record.
    let cat = catalog_with_states(dir.path(), &[11, 12, 13], 4);
    let log = crate::durable::read_log(&path).unwrap().unwrap();
    assert!(log.torn.is_none());
    let (record, _) = load_durable(dir.path()).unwrap();
    assert_eq!(record.visible, cat.snapshot().visible.state_id);
}

#[test]
fn state_folder_with_commit_json_keeps_its_ratchet_and_migrates() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(LEGACY_COMMIT_FILE),
        r#"{ "visible": 12, "retained": [11, 12] }"#,
    )
    .unwrap();
    let (record, _) = load_durable(dir.path()).unwrap();
    assert_eq!(record.visible, StateId(12));
    assert_eq!(record.retained, vec![StateId(11), StateId(12)]);
    assert!(has_commit_record(dir.path()));
    let cat = catalog_with_states(dir.path(), &[11, 12, 13], 4);
    assert_eq!(cat.snapshot().visible.state_id, StateId(13));
    let (record, _) = load_durable(dir.path()).unwrap();
    assert_eq!(record.visible, StateId(13));
    assert!(!dir.path().join(LEGACY_COMMIT_FILE).exists());
    assert!(has_commit_record(dir.path()));
}

#[test]
fn commit_log_is_compacted_to_its_last_record_when_large() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(COMMIT_LOG);
    {
        // Records of a real shape, padded, until the log passes the limit.
        let (mut log, _) = crate::durable::RecordLog::open(&path).unwrap();
        let mut rec = br#"{"visible": 5, "retained": [5]}"#.to_vec();
        rec.resize(64 << 10, b' ');
        while log.len() <= COMMIT_LOG_COMPACT_AT {
            log.append(&rec).unwrap();
        }
    }
    assert_eq!(load_durable(dir.path()).unwrap().0.visible, StateId(5));
    catalog_with_states(dir.path(), &[11], 4);
    let log = crate::durable::read_log(&path).unwrap().unwrap();
    assert_eq!(log.records.len(), 1);
    assert!(std::fs::metadata(&path).unwrap().len() < 1024);
    assert_eq!(load_durable(dir.path()).unwrap().0.visible, StateId(11));
}

fn add_file(id: u32, op: &str, table: &str, p: &str, path: &str, sha: &str) -> Event {
    ev(&format!(
        r#"{{"id": {id}, "op": "{op}", "db": "default", "table": "{table}", "partition": {{"p": "{p}"}}, "files": [{{"path": "{path}", "size": 2, "sha256": "{sha}"}}]}}"#
    ))
}

/// A `Pending` keeping `max_states` states, after the seed example's
/// database and table (states 5 and 10, pending).
fn with_table(max_states: usize) -> Pending {
    let mut pending = Pending::bounded(Arc::new(Tree::empty()), max_states);
    for e in &seed_events()[..2] {
        pending.apply(e, |_| true).unwrap();
    }
    pending
}

/// The paths the next attempt to read `blob` tries.
fn source_paths(pending: &mut Pending, blob: &BlobId) -> Vec<String> {
    pending
        .next_sources(blob)
        .into_iter()
        .map(|f| f.path)
        .collect()
}

#[test]
fn every_entry_naming_a_missing_blob_is_a_source_and_the_blob_unblocks_all() {
    let mut pending = with_table(usize::MAX);
    let blob = BlobId::from_hex(SHA1).unwrap();
    // X at 20 and Y at 25: two paths, the same bytes.
    let x = add_file(20, "add_files", "blah", "a", "x/000001_0", SHA1);
    let y = add_file(25, "add_files", "blah", "b", "y/000001_0", SHA1);
    let fetch = pending.apply(&x, |_| false).unwrap();
    assert_eq!(fetch.len(), 1);
    let fetch = pending.apply(&y, |_| false).unwrap();
    assert_eq!(
        fetch
            .iter()
            .map(|f| f.file.path.as_str())
            .collect::<Vec<_>>(),
        ["y/000001_0"],
        "Y is a new source for the blob X waits for"
    );
    // The same path again is no new source.
    let again = add_file(26, "add_files", "blah", "c", "y/000001_0", SHA1);
    assert!(pending.apply(&again, |_| false).unwrap().is_empty());
    let paths = source_paths(&mut pending, &blob);
    assert_eq!(paths, ["x/000001_0", "y/000001_0"]);
    pending.try_newest_source_next(&blob);
    assert_eq!(pending.next_sources(&blob)[0].path, "y/000001_0");
    assert_eq!(pending.newest_complete().unwrap().state_id, StateId(10));
    // Staged through Y: every state naming the blob may commit.
    pending.staged(&blob);
    assert_eq!(pending.newest_complete().unwrap().state_id, StateId(26));
}

#[test]
fn committed_states_stop_being_sources() {
    let mut pending = with_table(usize::MAX);
    let blob = BlobId::from_hex(SHA1).unwrap();
    pending
        .apply(&add_file(20, "add_files", "blah", "a", "x/f", SHA1), |_| {
            false
        })
        .unwrap();
    let drop = ev(
        r#"{"id": 21, "op": "drop_partition", "db": "default", "table": "blah", "partition": {"p": "a"}}"#,
    );
    pending.apply(&drop, |_| false).unwrap();
    pending
        .apply(&add_file(22, "add_files", "blah", "b", "y/f", SHA1), |_| {
            false
        })
        .unwrap();
    // 21 dropped X: it commits without the blob; Y (22) still needs it.
    assert_eq!(pending.newest_complete().unwrap().state_id, StateId(21));
    assert!(pending.committed(StateId(21)).is_empty());
    let paths = source_paths(&mut pending, &blob);
    assert_eq!(paths, ["y/f"], "only entries of pending states are sources");
}

/// A `Pending` keeping `max_states` states, with the table committed and
/// state 20 waiting for X (`x/f`, content SHA1, nowhere).
fn waiting_for_x(max_states: usize) -> (Pending, BlobId) {
    let mut pending = with_table(max_states);
    let held_back = BlobId::from_hex(SHA1).unwrap();
    let id = pending.newest_complete().unwrap().state_id;
    pending.committed(id);
    pending
        .apply(&add_file(20, "add_files", "blah", "a", "x/f", SHA1), |f| {
            f.blob != held_back
        })
        .unwrap();
    (pending, held_back)
}

#[test]
fn past_its_bound_the_newest_pending_state_absorbs_later_events() {
    // 20 waits for X; then twenty more events, among them a rename.
    let (mut pending, held_back) = waiting_for_x(3);
    for i in 0..20u32 {
        let e = if i == 10 {
            ev(
                r#"{"id": 40, "op": "rename_table", "db": "default", "table": "blah", "new_db": "default", "new_table": "moved"}"#,
            )
        } else {
            let table = if i < 10 { "blah" } else { "moved" };
            add_file(30 + i, "add_files", table, "b", &format!("b/{i}"), SHA2)
        };
        pending.apply(&e, |f| f.blob != held_back).unwrap();
        assert!(pending.len() <= 3);
    }
    assert_eq!(pending.len(), 3);
    assert!(pending.newest_complete().is_none(), "X still blocks");
    assert_eq!(pending.first_blocked().unwrap().0, StateId(20));
    // X was carried through the merged rename: dropping p=a of the moved
    // table unblocks the newest state.
    let drop = ev(
        r#"{"id": 60, "op": "drop_partition", "db": "default", "table": "moved", "partition": {"p": "a"}}"#,
    );
    pending.apply(&drop, |_| true).unwrap();
    let newest = pending.newest_complete().unwrap();
    assert_eq!(newest.state_id, StateId(60));
    assert_eq!(
        newest
            .table("default", "moved")
            .unwrap()
            .files_below()
            .len(),
        19
    );
    assert_eq!(pending.committed(StateId(60)), vec![held_back]);
    assert!(pending.is_empty());
}

#[test]
fn a_merged_state_still_waits_for_a_file_added_before_a_rename() {
    let (mut pending, held_back) = waiting_for_x(1);
    let rename = ev(
        r#"{"id": 21, "op": "rename_table", "db": "default", "table": "blah", "new_db": "default", "new_table": "moved"}"#,
    );
    pending.apply(&rename, |_| true).unwrap();
    let overwrite = ev(
        r#"{"id": 22, "op": "replace_files", "db": "default", "table": "moved", "partition": {"p": "b"}, "files": []}"#,
    );
    pending.apply(&overwrite, |_| true).unwrap();
    assert_eq!(pending.len(), 1);
    assert!(
        pending.newest_complete().is_none(),
        "moved/p=a/f is missing"
    );
    pending.staged(&held_back);
    assert_eq!(pending.newest_complete().unwrap().state_id, StateId(22));
}

#[test]
fn pending_refs_name_the_files_of_the_states_not_committed() {
    let mut pending = with_table(usize::MAX);
    let (x, y) = (
        BlobId::from_hex(SHA1).unwrap(),
        BlobId::from_hex(SHA2).unwrap(),
    );
    let refs = |p: &Pending| p.refs().blobs().collect::<std::collections::HashSet<_>>();
    pending
        .apply(&add_file(20, "add_files", "blah", "a", "x/f", SHA1), |_| {
            true
        })
        .unwrap();
    pending
        .apply(&add_file(21, "add_files", "blah", "b", "y/f", SHA2), |_| {
            true
        })
        .unwrap();
    pending
        .apply(&add_file(22, "add_files", "blah", "c", "z/f", SHA1), |_| {
            true
        })
        .unwrap();
    assert_eq!(refs(&pending), [x, y].into());
    pending.committed(StateId(21));
    assert_eq!(refs(&pending), [x].into(), "22 still names x");
    pending.committed(StateId(22));
    assert!(pending.refs().is_empty());
}

/// State 20 waits for X with every later event merged into it (bound 1):
/// 21 drops X's partition, then 2,100 files are added (X's entry pruned).
fn x_dropped_and_pruned() -> (Pending, BlobId) {
    let (mut pending, held_back) = waiting_for_x(1);
    let drop = ev(
        r#"{"id": 21, "op": "drop_partition", "db": "default", "table": "blah", "partition": {"p": "a"}}"#,
    );
    pending.apply(&drop, |_| true).unwrap();
    assert!(pending.is_missing(&held_back), "not pruned yet");
    for i in 0..2100u32 {
        let e = add_file(22 + i, "add_files", "blah", "b", &format!("b/{i}"), SHA2);
        pending.apply(&e, |_| true).unwrap();
    }
    (pending, held_back)
}

#[test]
fn a_merged_state_that_drops_a_waiting_file_abandons_it_when_pruned() {
    let (mut pending, held_back) = x_dropped_and_pruned();
    assert!(
        !pending.is_missing(&held_back),
        "pruning dropped its only entry"
    );
    assert!(!pending.refs().blobs().any(|b| b == held_back));
    let newest = pending.newest_complete().unwrap().state_id;
    assert_eq!(newest, StateId(2121));
    assert_eq!(pending.committed(newest), vec![held_back]);
    assert!(pending.committed(newest).is_empty(), "reported once");
}

#[test]
fn a_blob_abandoned_at_a_merge_and_named_again_is_not_reported_abandoned() {
    let (mut pending, held_back) = x_dropped_and_pruned();
    assert!(!pending.is_missing(&held_back), "abandoned when pruned");
    // X named again: missing again, wanted by the newest state.
    let again = add_file(3000, "add_files", "blah", "c", "x/again", SHA1);
    let fetch = pending.apply(&again, |f| f.blob != held_back).unwrap();
    assert_eq!(fetch.len(), 1);
    assert!(pending.is_missing(&held_back));
    assert!(pending.committed(StateId(20)).is_empty(), "wanted again");
    assert_eq!(source_paths(&mut pending, &held_back), ["x/again"]);
}
