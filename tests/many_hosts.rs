//! Many hosts (SPEC §8), with real `stagefs` processes on a `file://`
//! publication:
//! - a publisher killed with SIGKILL at random moments (≥ 20 cuts) and
//!   restarted: after every cut HEAD names a whole state (every catalog
//!   and blob it references is there and verifies), equal to the source
//!   at that id, never behind the one before; the last run reaches the
//!   source's newest state;
//! - a second publisher on the same URL is refused with a clear error
//!   (exit 2) while the first goes on;
//! - `stagefs keygen` and `--signing-key`: the head verifies with the
//!   public key and with no other.
//!
//! `STAGEFS_LONG_TESTS=1` runs 100 cuts instead of 20.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use stagefs::catalog::Tree;
use stagefs::event::StateId;
use stagefs::publish::keys;
use stagefs::publish::layout;
use stagefs::publish::load::{get_pieces, get_record, get_verified, Loader};
use stagefs::publish::record::{Decoded, RecordKind};
use stagefs::publish::{open_store, ObjectStore};
use stagefs::workload::{Rng, Workload, WorkloadConfig};

const BIN: &str = env!("CARGO_BIN_EXE_stagefs");

/// A child process killed (SIGKILL) and reaped when dropped, so a failing
/// test leaves nothing running.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn kill9(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }

    fn sigterm(&mut self) -> std::process::ExitStatus {
        // SAFETY: as above.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill9();
        }
    }
}

struct Host {
    root: PathBuf,
    runs: usize,
}

impl Host {
    fn new(root: &Path) -> Host {
        std::fs::create_dir_all(root).unwrap();
        Host {
            root: root.to_owned(),
            runs: 0,
        }
    }

    /// `stagefs replicate` of the workload under `src`, publishing to `url`.
    fn replicate(&mut self, src: &Workload, url: &str, extra: &[&str]) -> Proc {
        self.runs += 1;
        let log = self.root.join(format!("stderr-{}.log", self.runs));
        let child = Command::new(BIN)
            .arg("replicate")
            .arg("--state")
            .arg(self.root.join("state"))
            .arg("--source-root")
            .arg(src.source_root())
            .arg("--events")
            .arg(src.events_dir())
            .arg("--cm-root")
            .arg(src.cm_root())
            .args(["--retain", "3", "--publish", url])
            .args(extra)
            .env("STAGEFS_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Proc { child, log }
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn read_head(
    store: &dyn ObjectStore,
    trusted: Option<&ed25519_dalek::VerifyingKey>,
) -> Option<Decoded> {
    rt().block_on(async {
        match get_record(store, &layout::head(), RecordKind::Head, trusted).await {
            Ok(d) => Some(d),
            Err(stagefs::publish::load::LoadError::Missing { .. }) => None,
            Err(e) => panic!("HEAD: {e}"),
        }
    })
}

/// Loads the state HEAD names and checks it whole: its state object, every
/// catalog, every file's bytes (pieces included) verified by name, and the
/// tables equal to the source at that id.
fn check_published(store: &dyn ObjectStore, head: &Decoded, w: &Workload, when: &str) -> Tree {
    let p = &head.published;
    rt().block_on(async {
        let state = get_record(store, &layout::state(p.state_id), RecordKind::State, None)
            .await
            .unwrap_or_else(|e| panic!("{when}: the state object of {}: {e}", p.state_id));
        assert_eq!(
            state.published.root, p.root,
            "{when}: state object and HEAD differ"
        );
        let mut loader = Loader::new();
        let tree = loader
            .load(store, p.state_id, p.time_ms, p.root)
            .await
            .unwrap_or_else(|e| panic!("{when}: state {} does not load: {e}", p.state_id));
        let expected = w.expected(p.state_id).unwrap();
        let mut tables = 0;
        for (db, dnode) in tree.root.children.iter() {
            for (t, tnode) in dnode.as_dir().unwrap().children.iter() {
                tables += 1;
                let want = expected.get(&format!("{db}.{t}")).unwrap_or_else(|| {
                    panic!("{when}: {db}.{t} is not in the source at {}", p.state_id)
                });
                let want: Vec<_> = want.iter().map(|(p, b)| (p.clone(), *b)).collect();
                let dir = tnode.as_dir().unwrap();
                assert_eq!(
                    dir.files_below(),
                    want,
                    "{when}: {db}.{t} at {}",
                    p.state_id
                );
                for (path, f) in dir.file_nodes_below() {
                    let sha = f.blob();
                    match loader.pieces_of(&sha) {
                        None => {
                            get_verified(store, &layout::blob(&sha), &sha, 1 << 30)
                                .await
                                .unwrap_or_else(|e| panic!("{when}: {db}.{t}/{path}: {e}"));
                        }
                        Some(list) => {
                            for piece in get_pieces(store, &list).await.unwrap().pieces {
                                get_verified(store, &layout::blob(&piece), &piece, 1 << 30)
                                    .await
                                    .unwrap_or_else(|e| panic!("{when}: {db}.{t}/{path}: {e}"));
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(tables, expected.len(), "{when}: tables at {}", p.state_id);
        tree
    })
}

fn workload(root: &Path, seed: u64) -> Workload {
    Workload::new(
        root,
        WorkloadConfig {
            seed,
            min_file_bytes: 1 << 10,
            max_file_bytes: 64 << 10,
            ..WorkloadConfig::default()
        },
    )
    .unwrap()
}

fn wait_head(store: &dyn ObjectStore, state: StateId, p: &Proc) -> Decoded {
    let start = Instant::now();
    loop {
        if let Some(h) = read_head(store, None) {
            if h.published.state_id == state {
                return h;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "HEAD did not reach {state}\n{}",
            p.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_publisher_killed_anywhere_leaves_a_whole_state_and_resumes() {
    let long = std::env::var("STAGEFS_LONG_TESTS").is_ok_and(|v| v == "1");
    let cuts = if long { 100 } else { 20 };
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("published").display());
    let store = open_store(&url).unwrap();
    let mut w = workload(&dir.path().join("src"), 5);
    let mut host = Host::new(&dir.path().join("publisher"));
    let mut rng = Rng::new(77);
    let mut last = StateId(0);
    let mut publisher = None;
    let mut moved = 0;
    for cut in 0..cuts {
        for _ in 0..(3 + rng.below(20)) {
            w.step().unwrap();
        }
        let mut p = host.replicate(&w, &url, &[]);
        let deadline = Instant::now() + Duration::from_millis(50 + rng.below(700) as u64);
        while Instant::now() < deadline {
            if rng.below(2) == 0 {
                w.step().unwrap();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        p.kill9();
        let Some(head) = read_head(&*store, None) else {
            continue; // killed before its first publication
        };
        let state = head.published.state_id;
        assert!(
            state >= last,
            "cut {cut}: HEAD went back from {last} to {state}"
        );
        moved += usize::from(state > last);
        assert_eq!(
            *publisher.get_or_insert(head.published.publisher),
            head.published.publisher,
            "cut {cut}: a restart changed the publisher's identity"
        );
        check_published(&*store, &head, &w, &format!("cut {cut}"));
        last = state;
    }
    assert!(
        moved >= cuts / 4,
        "HEAD moved in only {moved} of {cuts} runs"
    );
    // Left alone, it publishes the source's newest state.
    let mut p = host.replicate(&w, &url, &[]);
    let head = wait_head(&*store, w.latest(), &p);
    check_published(&*store, &head, &w, "final run");
    assert!(p.sigterm().success(), "{}", p.stderr());
    eprintln!("{cuts} cuts; HEAD moved in {moved} runs, reached {last} before the final run");
}

#[test]
fn a_second_publisher_on_one_url_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("published").display());
    let store = open_store(&url).unwrap();
    let mut w = workload(&dir.path().join("src"), 6);
    for _ in 0..10 {
        w.step().unwrap();
    }
    let mut first = Host::new(&dir.path().join("first")).replicate(&w, &url, &[]);
    wait_head(&*store, w.latest(), &first);
    let mut second = Host::new(&dir.path().join("second")).replicate(&w, &url, &[]);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = second.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the second publisher runs on"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(2), "{}", second.stderr());
    assert!(
        second
            .stderr()
            .contains("a second publisher on one URL is refused"),
        "{}",
        second.stderr()
    );
    // The first goes on publishing.
    for _ in 0..5 {
        w.step().unwrap();
    }
    let head = wait_head(&*store, w.latest(), &first);
    check_published(&*store, &head, &w, "after the refusal");
    assert!(first.sigterm().success(), "{}", first.stderr());
}

#[test]
fn signed_heads_verify_with_the_published_key_only() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    let out = Command::new(BIN).arg("keygen").arg(&key).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = Command::new(BIN).arg("keygen").arg(&key).output().unwrap();
    assert_eq!(again.status.code(), Some(2), "keygen overwrote a key");
    let other = dir.path().join("other");
    keys::keygen(&other).unwrap();

    let url = format!("file://{}", dir.path().join("published").display());
    let store = open_store(&url).unwrap();
    let mut w = workload(&dir.path().join("src"), 7);
    for _ in 0..5 {
        w.step().unwrap();
    }
    let mut p = Host::new(&dir.path().join("publisher")).replicate(
        &w,
        &url,
        &["--signing-key", key.to_str().unwrap()],
    );
    wait_head(&*store, w.latest(), &p);
    let trusted = keys::load_trusted(&keys::public_path(&key)).unwrap();
    let head = read_head(&*store, Some(&trusted)).unwrap();
    assert!(head.signed);
    let wrong = keys::load_trusted(&keys::public_path(&other)).unwrap();
    let refused = rt().block_on(get_record(
        &*store,
        &layout::head(),
        RecordKind::Head,
        Some(&wrong),
    ));
    assert!(
        refused.is_err_and(|e| e.to_string().contains("signature does not verify")),
        "a head verified with another key"
    );
    assert!(p.sigterm().success(), "{}", p.stderr());
}
