//! The publisher and the loader together, in process, on a shared folder:
//! what is published loads back as the same trees; a state costs what
//! changed; a second publisher is refused; a restart resumes; storage
//! that was tampered with is detected.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};

use super::layout;
use super::load::{get_pieces, get_record, get_verified, LoadError, Loader};
use super::publisher::{PublishConfig, PublishError, Publisher};
use super::record::RecordKind;
use super::store::open_store;
use crate::catalog::{Node, Tree};
use crate::event::{BlobId, Event, StateId};

struct Source {
    dir: tempfile::TempDir,
    trees: Vec<Arc<Tree>>,
    visible: Arc<Mutex<Arc<Tree>>>,
    /// What this host's pins and sessions hold (the publisher's `held`).
    held: Arc<Mutex<Vec<Arc<Tree>>>>,
}

impl Source {
    fn new() -> Source {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("blobs")).unwrap();
        Source {
            dir,
            trees: vec![Arc::new(Tree::empty())],
            visible: Arc::new(Mutex::new(Arc::new(Tree::empty()))),
            held: Arc::default(),
        }
    }

    fn url(&self) -> String {
        format!("file://{}", self.dir.path().join("published").display())
    }

    fn blobs(&self) -> PathBuf {
        self.dir.path().join("blobs")
    }

    /// A file of `content` for an event: its blob staged, its JSON.
    fn file(&self, path: &str, content: &[u8]) -> String {
        let sha = BlobId(Sha256::digest(content).into());
        std::fs::write(self.blobs().join(sha.to_hex()), content).unwrap();
        format!(
            r#"{{"path": "{path}", "size": {}, "sha256": "{}"}}"#,
            content.len(),
            sha.to_hex()
        )
    }

    /// Applies one event line and makes the result visible.
    fn apply(&mut self, line: &str) -> Arc<Tree> {
        let event = Event::parse_line(line.as_bytes()).unwrap();
        let (tree, _) = self.trees.last().unwrap().apply(&event).unwrap();
        let tree = Arc::new(tree);
        self.trees.push(Arc::clone(&tree));
        *self.visible.lock().unwrap() = Arc::clone(&tree);
        tree
    }

    fn start(&self, state_dir: &Path) -> Result<Publisher, PublishError> {
        self.start_with(
            state_dir,
            super::gc::GcConfig {
                retain: 16,
                grace: super::gc::DEFAULT_GRACE,
            },
        )
    }

    fn start_with(
        &self,
        state_dir: &Path,
        gc: super::gc::GcConfig,
    ) -> Result<Publisher, PublishError> {
        std::fs::create_dir_all(state_dir).unwrap();
        let visible = Arc::clone(&self.visible);
        let blobs = self.blobs();
        let held = Arc::clone(&self.held);
        Publisher::start(
            PublishConfig {
                url: self.url(),
                signing_key: None,
                state_dir: state_dir.to_owned(),
                gc,
                held: Some(Arc::new(move || held.lock().unwrap().clone())),
            },
            Arc::new(move || Arc::clone(&visible.lock().unwrap())),
            Arc::new(move |b: &BlobId| blobs.join(b.to_hex())),
        )
    }
}

fn wait_published(p: &Publisher, state: StateId) {
    let start = Instant::now();
    while p.report().published != Some(state) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not published: {:?}",
            p.report()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Every file of a tree: path, blob, size, state, verified, source.
fn shape(t: &Tree) -> Vec<(String, BlobId, u64, StateId, &'static str, String)> {
    t.root
        .file_nodes_below()
        .into_iter()
        .map(|(p, f)| {
            (
                p,
                f.blob(),
                f.size(),
                f.meta.state_id,
                f.verified,
                f.source.to_string(),
            )
        })
        .collect()
}

/// Loads what HEAD names.
fn load_head(store: &dyn ObjectStore, loader: &mut Loader) -> Result<Tree, LoadError> {
    rt().block_on(async {
        let head = get_record(store, &layout::head(), RecordKind::Head, None).await?;
        let p = head.published;
        loader.load(store, p.state_id, p.time_ms, p.root).await
    })
}

const DB: &str = r#"{"id": 1, "op": "create_database", "db": "d"}"#;
const TABLE: &str =
    r#"{"id": 2, "op": "create_table", "db": "d", "table": "t", "partition_keys": ["p"]}"#;

#[test]
fn published_states_load_back_and_a_state_costs_what_changed() {
    let mut src = Source::new();
    let publisher = src.start(&src.dir.path().join("state")).unwrap();
    src.apply(DB);
    src.apply(TABLE);
    let mut files = Vec::new();
    for i in 0..50 {
        files.push(src.file(&format!("d/t/p=a/f{i}"), format!("row {i}").as_bytes()));
    }
    src.apply(&format!(
        r#"{{"id": 3, "op": "add_files", "db": "d", "table": "t", "partition": {{"p": "a"}}, "files": [{}]}}"#,
        files.join(",")
    ));
    // A large file: published as pieces.
    let big: Vec<u8> = (0..(layout::PIECE_SIZE as usize * 2 + 12345))
        .map(|i| (i % 251) as u8)
        .collect();
    let big_file = src.file("d/t/p=b/big", &big);
    let t4 = src.apply(&format!(
        r#"{{"id": 4, "op": "add_files", "db": "d", "table": "t", "partition": {{"p": "b"}}, "files": [{big_file}]}}"#
    ));
    wait_published(&publisher, StateId(4));
    let store = open_store(&src.url()).unwrap();
    let mut loader = Loader::new();
    let loaded4 = load_head(&*store, &mut loader).unwrap();
    assert_eq!(loaded4.state_id, StateId(4));
    assert_eq!(shape(&loaded4), shape(&t4));

    // The large file's pieces reassemble it, each verified by its name.
    let sha = BlobId(Sha256::digest(&big).into());
    let list_id = loader.pieces_of(&sha).expect("a piece list");
    let bytes = rt().block_on(async {
        let list = get_pieces(&*store, &list_id).await.unwrap();
        assert_eq!(list.pieces.len(), 3);
        let mut all = Vec::new();
        for p in &list.pieces {
            all.extend(
                get_verified(&*store, &layout::blob(p), p, 1 << 30)
                    .await
                    .unwrap(),
            );
        }
        all
    });
    assert!(bytes == big, "pieces do not reassemble the file");

    // One more file in p=c: the root, database, table and new partition
    // objects, and one blob; nothing of p=a or p=b again.
    let before = publisher.report().objects_written;
    let f = src.file("d/t/p=c/x", b"x");
    let t5 = src.apply(&format!(
        r#"{{"id": 5, "op": "add_files", "db": "d", "table": "t", "partition": {{"p": "c"}}, "files": [{f}]}}"#
    ));
    wait_published(&publisher, StateId(5));
    assert_eq!(publisher.report().objects_written - before, 5);
    let loaded5 = load_head(&*store, &mut loader).unwrap();
    assert_eq!(shape(&loaded5), shape(&t5));
    // The reader shares the unchanged partitions' nodes (same inodes).
    let part = |t: &Tree, p: &str| match t.lookup(&["d".into(), "t".into()], p) {
        Some(Node::Dir(d)) => Arc::clone(d),
        other => panic!("{p}: {other:?}"),
    };
    assert!(Arc::ptr_eq(&part(&loaded4, "p=a"), &part(&loaded5, "p=a")));
    assert!(!Arc::ptr_eq(&loaded4.root, &loaded5.root));
    publisher.stop();
}

#[test]
fn a_second_publisher_is_refused_and_a_restart_resumes() {
    let mut src = Source::new();
    let a = src.dir.path().join("a");
    let publisher = src.start(&a).unwrap();
    src.apply(DB);
    wait_published(&publisher, StateId(1));
    match src.start(&src.dir.path().join("b")) {
        Err(e @ PublishError::SecondPublisher { .. }) => {
            assert!(e.to_string().contains("second publisher"), "{e}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a second publisher was let in"),
    }
    publisher.stop();
    // The same state folder resumes: nothing of state 1 is written again.
    let publisher = src.start(&a).unwrap();
    assert_eq!(publisher.report().published, Some(StateId(1)));
    src.apply(TABLE);
    wait_published(&publisher, StateId(2));
    // root, database, table: the new table's directory and its parents.
    assert_eq!(publisher.report().objects_written, 3);
    publisher.stop();
}

#[test]
fn a_publisher_never_moves_head_backwards() {
    let mut src = Source::new();
    let a = src.dir.path().join("a");
    let publisher = src.start(&a).unwrap();
    src.apply(DB);
    src.apply(TABLE);
    wait_published(&publisher, StateId(2));
    publisher.stop();
    // A state folder behind what it published (restored from a backup).
    *src.visible.lock().unwrap() = Arc::clone(&src.trees[1]);
    let publisher = src.start(&a).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(publisher.report().published, Some(StateId(2)));
    assert_eq!(publisher.report().objects_written, 0);
    publisher.stop();
}

#[test]
fn tampered_objects_are_detected_and_never_loaded() {
    let mut src = Source::new();
    let publisher = src.start(&src.dir.path().join("state")).unwrap();
    src.apply(DB);
    src.apply(TABLE);
    let f = src.file("d/t/p=a/f", b"content");
    src.apply(&format!(
        r#"{{"id": 3, "op": "add_files", "db": "d", "table": "t", "partition": {{"p": "a"}}, "files": [{f}]}}"#
    ));
    wait_published(&publisher, StateId(3));
    publisher.stop();
    let store = open_store(&src.url()).unwrap();
    let published = src.dir.path().join("published");
    // Change one byte of each catalog object the head's state reaches (the
    // root, the database, the table, the partition) in turn: each is
    // refused. Objects of earlier states (the publisher may or may not have
    // published states 1 and 2 on their own) are not read by this load.
    let mut loader = Loader::new();
    let tree = load_head(&*store, &mut loader).unwrap();
    let catalogs: Vec<PathBuf> = loader
        .object_ids()
        .map(|id| published.join("catalogs").join(id.to_hex()))
        .collect();
    drop(tree);
    assert_eq!(catalogs.len(), 4);
    for c in &catalogs {
        let good = std::fs::read(c).unwrap();
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        std::fs::write(c, &bad).unwrap();
        match load_head(&*store, &mut Loader::new()) {
            Err(LoadError::Corrupt { detail, .. }) => {
                assert!(detail.contains("does not match its name"), "{detail}")
            }
            other => panic!("tampered {} loaded: {other:?}", c.display()),
        }
        std::fs::write(c, &good).unwrap();
    }
    assert!(load_head(&*store, &mut Loader::new()).is_ok());
    // A missing object and a head cut short.
    std::fs::rename(&catalogs[0], published.join("aside")).unwrap();
    assert!(matches!(
        load_head(&*store, &mut Loader::new()),
        Err(LoadError::Missing { .. })
    ));
    let head = published.join("HEAD");
    let text = std::fs::read(&head).unwrap();
    std::fs::write(&head, &text[..text.len() / 2]).unwrap();
    assert!(matches!(
        load_head(&*store, &mut Loader::new()),
        Err(LoadError::Corrupt { .. })
    ));
    // The blob, read as a reader would, is verified by its name too.
    let sha = BlobId(Sha256::digest(b"content").into());
    let blob = published.join("blobs").join(sha.to_hex());
    std::fs::write(&blob, b"CONTENT").unwrap();
    let got = rt().block_on(get_verified(&*store, &layout::blob(&sha), &sha, 1 << 20));
    assert!(matches!(got, Err(LoadError::Corrupt { .. })));
    let _ = rt().block_on(store.head(&layout::head()));
}

/// Every object a published state reaches is at the URL.
fn state_is_whole(store: &dyn ObjectStore, state: StateId) -> Result<(), String> {
    rt().block_on(async {
        let rec = get_record(store, &layout::state(state), RecordKind::State, None)
            .await
            .map_err(|e| e.to_string())?;
        let mut c = super::gc::Collector::new();
        let m = c
            .mark(store, [rec.published.root])
            .await
            .map_err(|e| e.to_string())?;
        for b in &m.blobs {
            store
                .head(&layout::blob(b))
                .await
                .map_err(|e| format!("blob {}: {e}", b.to_hex()))?;
        }
        Ok(())
    })
}

fn wait_gc_runs(p: &Publisher, runs: u64) {
    let start = Instant::now();
    while p.report().gc.runs < runs {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no collection: {:?}",
            p.report()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn collection_keeps_retained_and_leased_states_whole_and_sweeps_the_rest() {
    use super::lease;
    let mut src = Source::new();
    let publisher = src
        .start_with(
            &src.dir.path().join("state"),
            super::gc::GcConfig {
                retain: 2,
                grace: Duration::ZERO,
            },
        )
        .unwrap();
    let store = open_store(&src.url()).unwrap();
    src.apply(DB);
    src.apply(TABLE);
    // State 3..=12: p=a is replaced every time (its old content becomes
    // garbage), p=s stays (shared by every state).
    let shared = src.file("d/t/p=s/keep", b"shared by all");
    src.apply(&format!(
        r#"{{"id": 3, "op": "add_files", "db": "d", "table": "t", "partition": {{"p": "s"}}, "files": [{shared}]}}"#
    ));
    let mut leased = None;
    for id in 4..=12u64 {
        let f = src.file("d/t/p=a/f", format!("content {id}").as_bytes());
        src.apply(&format!(
            r#"{{"id": {id}, "op": "replace_files", "db": "d", "table": "t", "partition": {{"p": "a"}}, "files": [{f}]}}"#
        ));
        wait_published(&publisher, StateId(id));
        if id == 5 {
            let l = rt()
                .block_on(lease::acquire(
                    &*store,
                    StateId(5),
                    Duration::from_secs(60),
                    "test",
                ))
                .unwrap();
            leased = Some(l);
        }
    }
    let runs = publisher.report().gc.runs;
    wait_gc_runs(&publisher, runs + 2);
    let has = |p: &object_store::path::Path| rt().block_on(store.head(p)).is_ok();
    for s in [5, 11, 12] {
        state_is_whole(&*store, StateId(s)).unwrap_or_else(|e| panic!("state {s}: {e}"));
    }
    for s in [4, 6, 7, 8, 9, 10] {
        assert!(
            !has(&layout::state(StateId(s))),
            "state {s} is still published"
        );
    }
    let content = |id: u64| {
        let bytes = format!("content {id}");
        layout::blob(&BlobId(Sha256::digest(bytes.as_bytes()).into()))
    };
    assert!(!has(&content(7)), "the content only state 7 had is swept");
    assert!(has(&content(5)), "the leased state's content is kept");
    // A taker that comes after the collector condemned a state is refused.
    let refused = rt().block_on(lease::acquire(
        &*store,
        StateId(8),
        Duration::from_secs(60),
        "late",
    ));
    assert!(
        matches!(refused, Err(lease::LeaseError::NotRetained(_))),
        "{refused:?}"
    );

    // Released: the state and what only it reached go; the rest stays.
    rt().block_on(lease::release(&*store, leased.unwrap()))
        .unwrap();
    let runs = publisher.report().gc.runs;
    wait_gc_runs(&publisher, runs + 2);
    assert!(!has(&layout::state(StateId(5))));
    assert!(!has(&content(5)));
    for s in [11, 12] {
        state_is_whole(&*store, StateId(s)).unwrap_or_else(|e| panic!("state {s}: {e}"));
    }
    // Publishing goes on after a sweep: content swept earlier comes back
    // when a new state needs it again.
    let f = src.file("d/t/p=a/f", b"content 7");
    src.apply(&format!(
        r#"{{"id": 13, "op": "replace_files", "db": "d", "table": "t", "partition": {{"p": "a"}}, "files": [{f}]}}"#
    ));
    wait_published(&publisher, StateId(13));
    state_is_whole(&*store, StateId(13)).unwrap();
    assert!(has(&content(7)));
    publisher.stop();
}

/// States `first..=last` of one table whose partition p=a is replaced
/// each time.
fn replace_each_time(src: &mut Source, publisher: &Publisher, first: u64, last: u64) {
    for id in first..=last {
        let f = src.file("d/t/p=a/f", format!("content {id}").as_bytes());
        src.apply(&format!(
            r#"{{"id": {id}, "op": "replace_files", "db": "d", "table": "t", "partition": {{"p": "a"}}, "files": [{f}]}}"#
        ));
        wait_published(publisher, StateId(id));
    }
}

#[test]
fn a_reader_that_read_a_state_record_loads_it_whole_while_collection_condemns_it() {
    let mut src = Source::new();
    let grace = Duration::from_secs(3);
    let publisher = src
        .start_with(
            &src.dir.path().join("state"),
            super::gc::GcConfig { retain: 1, grace },
        )
        .unwrap();
    let store = open_store(&src.url()).unwrap();
    src.apply(DB);
    src.apply(TABLE);
    replace_each_time(&mut src, &publisher, 3, 4);
    // A reader reads HEAD's state record, then is slow...
    let record = rt()
        .block_on(get_record(
            &*store,
            &layout::state(StateId(4)),
            RecordKind::State,
            None,
        ))
        .unwrap()
        .published;
    let condemned_at = Instant::now();
    // ...while newer states push it out and collection condemns it.
    replace_each_time(&mut src, &publisher, 5, 6);
    let runs = publisher.report().gc.runs;
    wait_gc_runs(&publisher, runs + 2);
    assert!(
        rt().block_on(store.head(&layout::state(StateId(4))))
            .is_err(),
        "state 4 is condemned"
    );
    // Within the grace period its catalogs and content are all there.
    if condemned_at.elapsed() < grace {
        let tree = rt()
            .block_on(Loader::new().load(&*store, record.state_id, record.time_ms, record.root))
            .unwrap();
        for (_, f) in tree.root.file_nodes_below() {
            rt().block_on(store.head(&layout::blob(&f.blob()))).unwrap();
        }
    }
    // After it, they go (state 6 stays whole).
    std::thread::sleep(grace);
    let runs = publisher.report().gc.runs;
    wait_gc_runs(&publisher, runs + 2);
    assert!(rt()
        .block_on(store.head(&layout::catalog(&record.root)))
        .is_err());
    state_is_whole(&*store, StateId(6)).unwrap();
    publisher.stop();
}

#[test]
fn states_this_host_holds_are_published_and_kept_though_skipped_and_old() {
    let mut src = Source::new();
    src.apply(DB);
    src.apply(TABLE);
    let f = src.file("d/t/p=a/f", b"held content");
    let held = src.apply(&format!(
        r#"{{"id": 3, "op": "add_files", "db": "d", "table": "t", "partition": {{"p": "a"}}, "files": [{f}]}}"#
    ));
    let f = src.file("d/t/p=a/f", b"newer");
    src.apply(&format!(
        r#"{{"id": 4, "op": "replace_files", "db": "d", "table": "t", "partition": {{"p": "a"}}, "files": [{f}]}}"#
    ));
    // State 3 is held (a pin) but was never visible to the publisher.
    src.held.lock().unwrap().push(Arc::clone(&held));
    let publisher = src
        .start_with(
            &src.dir.path().join("state"),
            super::gc::GcConfig {
                retain: 1,
                grace: Duration::ZERO,
            },
        )
        .unwrap();
    let store = open_store(&src.url()).unwrap();
    wait_published(&publisher, StateId(4));
    replace_each_time(&mut src, &publisher, 5, 8);
    let runs = publisher.report().gc.runs;
    wait_gc_runs(&publisher, runs + 2);
    state_is_whole(&*store, StateId(3)).unwrap();
    assert_eq!(
        rt().block_on(get_record(&*store, &layout::head(), RecordKind::Head, None))
            .unwrap()
            .published
            .state_id,
        StateId(8),
        "HEAD is the newest, not the held state"
    );
    // Unpinned: collected.
    src.held.lock().unwrap().clear();
    let runs = publisher.report().gc.runs;
    wait_gc_runs(&publisher, runs + 2);
    assert!(rt()
        .block_on(store.head(&layout::state(StateId(3))))
        .is_err());
    publisher.stop();
}
