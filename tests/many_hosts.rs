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
//!   public key and with no other;
//! - two reader hosts (`stagefs mount --from URL --cache DIR`) under the
//!   consistency checker while the source changes: 0 anomalies, visible
//!   never backwards, both reach the newest state;
//! - a job (rule 10): processes with `STAGEFS_STATE_ID=N` on three reader
//!   hosts, each in its own mount namespace at the same path, read state
//!   N while the source moves on; `ESTALE` for a state not served;
//! - faults on a reader host: a head that goes back (refused, also after a
//!   restart), corrupted content (`EIO`, never served), an outage and a
//!   restart with a warm cache during it (cached content still served).
//!
//! - on S3 (the private SeaweedFS server of tests/servers/, installed by
//!   scripts/setup-servers.sh): a publisher killed and restarted, a second
//!   publisher refused by S3's conditional writes, and a reader host that
//!   reaches the newest state.
//!
//! `STAGEFS_LONG_TESTS=1` runs 100 cuts instead of 20.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use stagefs::catalog::Tree;
use stagefs::event::StateId;
use stagefs::publish::keys;
use stagefs::publish::layout;
use stagefs::publish::load::{get_pieces, get_record, get_verified, Loader};
use stagefs::publish::record::{Decoded, RecordKind};
use stagefs::publish::{open_store, ObjectStore};
use stagefs::workload::{Rng, Workload, WorkloadConfig};

mod common;
mod servers;

use common::daemon::BIN;
use common::hosts::{Host, NsHost, Proc};

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
        // Every other run is cut at a random time after its start (during
        // recovery, the first upload, anywhere); the others once HEAD has
        // moved in this run, a random time later, so that cuts also land
        // while the publisher is busy publishing whatever machine speed is.
        let started = Instant::now();
        let mut deadline = started + Duration::from_millis(50 + rng.below(700) as u64);
        let mut wait_for_move = cut % 2 == 1;
        while Instant::now() < deadline || wait_for_move {
            if rng.below(2) == 0 {
                w.step().unwrap();
            }
            std::thread::sleep(Duration::from_millis(10));
            if wait_for_move
                && read_head(&*store, None).is_some_and(|h| h.published.state_id > last)
            {
                wait_for_move = false;
                deadline = Instant::now() + Duration::from_millis(rng.below(300) as u64);
            }
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "cut {cut}: HEAD did not move past {last}\n{}",
                p.stderr()
            );
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
        moved >= cuts / 2,
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

// ---------------------------------------------------------------------------
// Reader hosts: `stagefs mount MNT --from URL --cache DIR`

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use stagefs::testkit::checker::{
    run_readers, visible, CheckConfig, DaemonProcess, Oracle, Report, Target,
};

/// Mount tests share 2 cores: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// A reader host on `url` at `root/mnt` with its cache in `root/cache`;
/// unmounted (and killed if need be) when dropped.
fn reader_host(root: &Path, url: &str, extra: &[&str]) -> DaemonProcess {
    let mnt = root.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let cache = root.join("cache");
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "--from".as_ref(),
        url.as_ref(),
        "--cache".as_ref(),
        cache.as_os_str(),
        "--poll-ms".as_ref(),
        "100".as_ref(),
    ];
    args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
    DaemonProcess::start(
        Path::new(BIN),
        &mnt,
        &args,
        &root.join("reader.log"),
        Duration::from_secs(20),
    )
    .expect("the reader host mounts")
}

fn status_of(mnt: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(mnt.join(".stagefs/status")).unwrap()).unwrap()
}

fn wait_visible(mnt: &Path, state: StateId, reader: &DaemonProcess) {
    let start = Instant::now();
    while visible(mnt).ok() != Some(state) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} did not reach {state}: {}\n{}",
            mnt.display(),
            status_of(mnt),
            reader.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Samples a mount's visible state until stopped; panics (at join) if it
/// ever went back.
fn watch_ratchet(mnt: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut last = StateId(0);
        let mut moves = 0;
        while !stop.load(Ordering::Relaxed) {
            if let Ok(v) = visible(&mnt) {
                assert!(
                    v >= last,
                    "{}: visible went back from {last} to {v}",
                    mnt.display()
                );
                moves += u64::from(v > last);
                last = v;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        moves
    })
}

#[test]
fn reader_hosts_show_only_published_source_states_and_reach_the_newest() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("published").display());
    let store = open_store(&url).unwrap();
    let oracle = Oracle::new();
    let mut w = Workload::new(&dir.path().join("src"), WorkloadConfig::for_readers(31)).unwrap();
    for _ in 0..40 {
        w.step().unwrap();
    }
    oracle.record(&w);
    let mut publisher = Host::new(&dir.path().join("publisher")).replicate(&w, &url, &[]);
    wait_head(&*store, w.latest(), &publisher);
    let hosts: Vec<PathBuf> = (1..=2)
        .map(|i| dir.path().join(format!("host{i}")))
        .collect();
    let readers: Vec<DaemonProcess> = hosts.iter().map(|h| reader_host(h, &url, &[])).collect();

    // The source keeps changing; a writer records each state it wrote.
    let stop_writer = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, oracle) = (Arc::clone(&stop_writer), Arc::clone(&oracle));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                w.step().unwrap();
                oracle.record(&w);
                std::thread::sleep(Duration::from_millis(20));
            }
            w
        })
    };
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watchers: Vec<_> = hosts
        .iter()
        .map(|h| watch_ratchet(h.join("mnt"), Arc::clone(&stop_watch)))
        .collect();
    let cfg = CheckConfig {
        readers: 3,
        target_observations: 3_000,
        min_duration: Duration::from_secs(5),
        max_duration: Duration::from_secs(60),
        min_distinct_ids: 0,
        seed: 9,
    };
    let reports: Vec<Report> = std::thread::scope(|s| {
        let runs: Vec<_> = hosts
            .iter()
            .map(|h| {
                let (oracle, cfg) = (&oracle, &cfg);
                s.spawn(move || {
                    let never = AtomicBool::new(false);
                    run_readers(
                        &Target::Stagefs {
                            mount: h.join("mnt"),
                        },
                        oracle,
                        cfg,
                        &never,
                    )
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    stop_writer.store(true, Ordering::Relaxed);
    let w = writer.join().unwrap();
    for (h, (report, reader)) in hosts.iter().zip(reports.iter().zip(&readers)) {
        eprintln!("{}: {}", h.display(), report.summary());
        assert_eq!(
            report.anomalies,
            0,
            "{}\n{}",
            report.summary(),
            reader.log()
        );
        assert!(report.observations >= 1_000, "{}", report.summary());
        assert!(
            report.last_visible > report.first_visible,
            "the host never moved: {}",
            report.summary()
        );
    }
    // Every host reaches the source's newest state, never going back.
    wait_head(&*store, w.latest(), &publisher);
    for (h, reader) in hosts.iter().zip(&readers) {
        wait_visible(&h.join("mnt"), w.latest(), reader);
        let s = status_of(&h.join("mnt"));
        assert_eq!(s["stalled"], serde_json::Value::Null, "{s}");
        assert_eq!(s["lag_events"], 0, "{s}");
        assert!(s["head"]["age_ms"].as_i64().is_some(), "{s}");
        assert!(s["cache"]["fetched"].as_u64().unwrap() > 0, "{s}");
        let out = Command::new(BIN)
            .arg("status")
            .arg(h.join("mnt"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(printed["role"], "reader", "{printed}");
    }
    stop_watch.store(true, Ordering::Relaxed);
    for (h, watcher) in hosts.iter().zip(watchers) {
        let moves = watcher.join().expect("visible never went back");
        eprintln!("{}: visible moved {moves} times", h.display());
    }
    assert!(publisher.sigterm().success(), "{}", publisher.stderr());
}

/// A job process (rule 10): prints the root's state and every table's
/// files with their sha256 (reading a little of each), as JSON.
const JOB: &str = r#"
import os, sys, json
mnt = sys.argv[1]
out = {}
state = os.getxattr(mnt, "user.stagefs.state_id").decode()
for db in sorted(os.listdir(mnt)):
    for t in sorted(os.listdir(os.path.join(mnt, db))):
        base = os.path.join(mnt, db, t)
        files = {}
        for top, dirs, fs in os.walk(base):
            for f in fs:
                p = os.path.join(top, f)
                files[os.path.relpath(p, base)] = os.getxattr(p, "user.stagefs.sha256").decode()
                with open(p, "rb") as fh:
                    fh.read(16)
        out[db + "." + t] = files
print(json.dumps({"state": state, "tables": out}))
"#;

/// The job script on `h`, with `STAGEFS_STATE_ID=state` if given.
fn run_job(h: &NsHost, state: Option<StateId>) -> std::process::Output {
    let mut cmd = h.command("python3");
    cmd.args(["-c", JOB]).arg(&h.mnt);
    if let Some(s) = state {
        cmd.env("STAGEFS_STATE_ID", s.to_string());
    }
    cmd.output().unwrap()
}

#[test]
fn a_job_with_stagefs_state_id_reads_that_state_on_every_host() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mount namespaces (unshare, nsenter) need root");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("published").display());
    let store = open_store(&url).unwrap();
    let oracle = Oracle::new();
    let mut w = Workload::new(&dir.path().join("src"), WorkloadConfig::for_readers(41)).unwrap();
    for _ in 0..40 {
        w.step().unwrap();
    }
    oracle.record(&w);
    let mut publisher = Host::new(&dir.path().join("publisher")).replicate(&w, &url, &[]);
    let n = w.latest();
    wait_head(&*store, n, &publisher);
    // Three hosts, one mountpoint path.
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let hosts: Vec<NsHost> = (1..=3)
        .map(|i| NsHost::start(&dir.path().join(format!("host{i}")), &mnt, &url))
        .collect();
    // One table pinned at N keeps the state retained on each host (what a
    // lease at the URL is for; leases are not built yet); the other
    // tables show the newest state to every process but the job's.
    let pinned = oracle.table_names(n).1[0].replacen('.', "/", 1);
    for h in &hosts {
        h.wait_visible(n);
        h.pin(&pinned, n);
    }
    // The source moves on while the job reads.
    let stop_writer = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, oracle) = (Arc::clone(&stop_writer), Arc::clone(&oracle));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                w.step().unwrap();
                oracle.record(&w);
                std::thread::sleep(Duration::from_millis(20));
            }
            w
        })
    };
    let (_, tables_at_n) = oracle.table_names(n);
    let start = Instant::now();
    let mut runs = 0;
    while start.elapsed() < Duration::from_secs(6) {
        for (i, h) in hosts.iter().enumerate() {
            let out = run_job(h, Some(n));
            assert!(
                out.status.success(),
                "host {i}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(got["state"], n.to_string(), "host {i}: {got}");
            let tables = got["tables"].as_object().unwrap();
            let mut keys: Vec<&String> = tables.keys().collect();
            keys.sort();
            let mut want_keys: Vec<&String> = tables_at_n.iter().collect();
            want_keys.sort();
            assert_eq!(keys, want_keys, "host {i}: tables at {n}");
            for (key, files) in tables {
                let want = oracle.table_at(key, n).unwrap();
                let got: Vec<(String, String)> = files
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(p, s)| (p.clone(), s.as_str().unwrap().to_owned()))
                    .collect();
                let want: Vec<(String, String)> =
                    want.iter().map(|(p, b)| (p.clone(), b.to_hex())).collect();
                assert_eq!(got, want, "host {i}: {key} at {n}");
            }
            runs += 1;
        }
    }
    stop_writer.store(true, Ordering::Relaxed);
    let w = writer.join().unwrap();
    // Every host moved on meanwhile: the job's state was not the newest.
    wait_head(&*store, w.latest(), &publisher);
    for (i, h) in hosts.iter().enumerate() {
        h.wait_visible(w.latest());
        // A process without the variable sees the newest state.
        let out = run_job(h, None);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(got["state"], w.latest().to_string(), "host {i}: {got}");
        // A state this host does not serve: ESTALE, never another state.
        let out = run_job(h, Some(StateId(1)));
        assert!(!out.status.success(), "host {i}: state 1 was served");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("Stale file handle"), "host {i}: {err}");
    }
    eprintln!(
        "{runs} job runs over 3 hosts (one mountpoint, three mount namespaces) read state {n} while the source reached {}",
        w.latest()
    );
    assert!(publisher.sigterm().success(), "{}", publisher.stderr());
}

/// The files of a mount with their content's sha256.
fn files_with_sha(mnt: &Path) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                walk(&p, out);
            } else {
                let sha =
                    stagefs::testkit::checker::getxattr_string(&p, "user.stagefs.sha256").unwrap();
                out.push((p, sha));
            }
        }
    }
    let mut out = Vec::new();
    walk(mnt, &mut out);
    out
}

fn wait_reason(mnt: &Path, what: &str, reader: &DaemonProcess) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let s = status_of(mnt);
        if s["stalled"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains(what))
        {
            return s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no stall reason {what:?}: {s}\n{}",
            reader.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_reader_host_refuses_a_head_that_goes_back_detects_corruption_and_rides_out_an_outage() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let published = dir.path().join("published");
    let url = format!("file://{}", published.display());
    let store = open_store(&url).unwrap();
    let mut w = workload(&dir.path().join("src"), 8);
    for _ in 0..10 {
        w.step().unwrap();
    }
    let mut host = Host::new(&dir.path().join("publisher"));
    let mut publisher = host.replicate(&w, &url, &[]);
    wait_head(&*store, w.latest(), &publisher);
    let old_head = std::fs::read(published.join("HEAD")).unwrap();
    let host_dir = dir.path().join("host");
    let mnt = host_dir.join("mnt");
    let mut reader = reader_host(&host_dir, &url, &[]);
    wait_visible(&mnt, w.latest(), &reader);
    for _ in 0..5 {
        w.step().unwrap();
    }
    let newest = w.latest();
    wait_head(&*store, newest, &publisher);
    wait_visible(&mnt, newest, &reader);
    assert!(publisher.sigterm().success(), "{}", publisher.stderr());
    let good_head = std::fs::read(published.join("HEAD")).unwrap();

    // A head that goes back is refused; the host stays where it is.
    std::fs::write(published.join("HEAD"), &old_head).unwrap();
    let s = wait_reason(&mnt, "went back", &reader);
    assert_eq!(s["visible"], newest.0, "{s}");
    assert_eq!(visible(&mnt).unwrap(), newest);
    std::fs::write(published.join("HEAD"), &good_head).unwrap();

    // Read one file (now cached), then corrupt every blob at the URL.
    let files = files_with_sha(&mnt);
    assert!(files.len() >= 2, "{files:?}");
    let (cached, cached_sha) = &files[0];
    let bytes = std::fs::read(cached).unwrap();
    let sha = stagefs::event::BlobId(<sha2::Sha256 as sha2::Digest>::digest(&bytes).into());
    assert_eq!(sha.to_hex(), *cached_sha);
    for e in std::fs::read_dir(published.join("blobs")).unwrap() {
        let p = e.unwrap().path();
        let mut b = std::fs::read(&p).unwrap();
        b.push(b'!');
        std::fs::write(&p, b).unwrap();
    }
    let in_cache = |sha: &str| host_dir.join("cache/blobs").join(sha).exists();
    let (uncached, _) = files
        .iter()
        .find(|(_, sha)| !in_cache(sha))
        .expect("a file not read yet");
    // Never wrong bytes: EIO, and status says why.
    let err = std::fs::read(uncached).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let s = status_of(&mnt);
    let last = s["cache"]["last_error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(last.contains("does not match its name"), "{s}");
    // What is cached is still served.
    assert_eq!(std::fs::read(cached).unwrap(), bytes);

    // The storage goes away: the host keeps serving what it has.
    std::fs::rename(&published, dir.path().join("away")).unwrap();
    wait_reason(&mnt, "HEAD cannot be used", &reader);
    assert_eq!(std::fs::read(cached).unwrap(), bytes);
    assert_eq!(visible(&mnt).unwrap(), newest);
    // Restarted during the outage with its warm cache: same state, same bytes.
    assert!(
        reader.terminate(Duration::from_secs(10)).unwrap(),
        "{}",
        reader.log()
    );
    drop(reader);
    let reader = reader_host(&host_dir, &url, &[]);
    assert_eq!(visible(&mnt).unwrap(), newest);
    assert_eq!(std::fs::read(cached).unwrap(), bytes);
    wait_reason(&mnt, "HEAD cannot be used", &reader);
    // Back, and with the old head: still refused after the restart.
    std::fs::rename(dir.path().join("away"), &published).unwrap();
    std::fs::write(published.join("HEAD"), &old_head).unwrap();
    wait_reason(&mnt, "went back", &reader);
    assert_eq!(visible(&mnt).unwrap(), newest);
    std::fs::write(published.join("HEAD"), &good_head).unwrap();
    let start = Instant::now();
    while status_of(&mnt)["stalled"] != serde_json::Value::Null {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{}",
            status_of(&mnt)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn on_s3_a_publisher_resumes_a_second_is_refused_and_a_reader_host_follows() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let server = servers::S3Server::start().expect("start the S3 server");
    server
        .create_bucket("stagefs-wh", false)
        .expect("create the bucket");
    let env: Vec<(String, String)> = vec![
        ("AWS_ENDPOINT_URL".into(), server.endpoint()),
        ("AWS_ACCESS_KEY_ID".into(), server.access_key().into()),
        ("AWS_SECRET_ACCESS_KEY".into(), server.secret_key().into()),
        ("AWS_REGION".into(), server.region().into()),
    ];
    let url = "s3://stagefs-wh/published/warehouse";
    let s3 = server.store_builder("stagefs-wh").build().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::prefix::PrefixStore::new(
        s3,
        "published/warehouse",
    ));
    let dir = tempfile::tempdir().unwrap();
    let mut w = workload(&dir.path().join("src"), 9);
    let mut host = Host::new(&dir.path().join("publisher"));
    host.env = env.clone();
    for round in 0..3 {
        for _ in 0..10 {
            w.step().unwrap();
        }
        let mut p = host.replicate(&w, url, &[]);
        std::thread::sleep(Duration::from_millis(300 + 200 * round));
        p.kill9();
    }
    let mut p = host.replicate(&w, url, &[]);
    let head = wait_head(&*store, w.latest(), &p);
    check_published(&*store, &head, &w, "on S3");

    let mut second = Host::new(&dir.path().join("second"));
    second.env = env.clone();
    let mut refused = second.replicate(&w, url, &[]);
    let status = refused.child.wait().unwrap();
    assert_eq!(status.code(), Some(2), "{}", refused.stderr());
    assert!(
        refused.stderr().contains("second publisher"),
        "{}",
        refused.stderr()
    );

    let reader_dir = dir.path().join("reader");
    let mnt = reader_dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let cache = reader_dir.join("cache");
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let args: Vec<&std::ffi::OsStr> = vec![
        "--from".as_ref(),
        url.as_ref(),
        "--cache".as_ref(),
        cache.as_os_str(),
        "--poll-ms".as_ref(),
        "100".as_ref(),
    ];
    let reader = DaemonProcess::start_with_env(
        Path::new(BIN),
        &mnt,
        &args,
        &reader_dir.join("reader.log"),
        "warn",
        &env_refs,
        Duration::from_secs(20),
    )
    .expect("the reader host mounts");
    for _ in 0..5 {
        w.step().unwrap();
    }
    wait_head(&*store, w.latest(), &p);
    wait_visible(&mnt, w.latest(), &reader);
    // Every file reads back with the content the source had.
    let files = files_with_sha(&mnt);
    assert!(!files.is_empty());
    for (path, sha) in &files {
        let bytes = std::fs::read(path).unwrap();
        let got = stagefs::event::BlobId(<sha2::Sha256 as sha2::Digest>::digest(&bytes).into());
        assert_eq!(got.to_hex(), *sha, "{}", path.display());
    }
    assert!(p.sigterm().success(), "{}", p.stderr());
    eprintln!(
        "on S3: {} files read through the reader host at state {}",
        files.len(),
        w.latest()
    );
}
