//! Leases and garbage collection at a `file://` URL (SPEC §8 "Retention at
//! URL"), with real `stagefs` processes: a publisher (`replicate
//! --publish --retain 2 --gc-grace 1s`) and a reader host.
//!
//! - `stagefs lease` round trip on a reader host (acquire `visible`,
//!   renew, release): the leased state outlives retention while newer
//!   states are published and collected, stays whole at the URL, and
//!   reads as the source had it through its snapshot path and with
//!   `STAGEFS_STATE_ID` (also on a host started later, which fetches it
//!   on demand); released, its state and every object no kept
//!   state references are deleted, and what kept states reference stays;
//!   meanwhile the reader host, loading states while collection runs,
//!   never misses an object of a state it loads (only whole states that
//!   were condemned before it read them).
//! - A pin on a reader host leases its state (kept while newer states are
//!   collected), and so does a `stagefs run` session while its command
//!   runs (released when it exits); the host killed with SIGKILL, the
//!   pin's lease expires and the state is collected.
//! - `stagefs lease` on a publishing mount (`visible` is HEAD there).
//! - On S3 (the private server of tests/servers/): a leased state is kept
//!   through retention and collected once released.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use object_store::ObjectStoreExt;
use stagefs::event::{BlobId, StateId};
use stagefs::publish::gc::Collector;
use stagefs::publish::layout;
use stagefs::publish::lease;
use stagefs::publish::load::get_record;
use stagefs::publish::record::RecordKind;
use stagefs::publish::{open_store, ObjectStore};
use stagefs::testkit::checker::{read_tree, visible, DaemonProcess};
use stagefs::workload::{Workload, WorkloadConfig};

mod servers;

const BIN: &str = env!("CARGO_BIN_EXE_stagefs");

/// The publisher process: killed and reaped when dropped.
struct Publisher {
    child: Child,
    log: PathBuf,
}

impl Publisher {
    fn start(root: &Path, w: &Workload, url: &str) -> Publisher {
        Publisher::start_with_env(root, w, url, &[])
    }

    fn start_with_env(root: &Path, w: &Workload, url: &str, env: &[(String, String)]) -> Publisher {
        std::fs::create_dir_all(root).unwrap();
        let log = root.join("publisher.log");
        let child = Command::new(BIN)
            .arg("replicate")
            .arg("--state")
            .arg(root.join("state"))
            .arg("--source-root")
            .arg(w.source_root())
            .arg("--events")
            .arg(w.events_dir())
            .arg("--cm-root")
            .arg(w.cm_root())
            .args(["--retain", "2", "--publish", url, "--gc-grace", "1s"])
            .env("STAGEFS_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Publisher { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn workload(root: &Path) -> Workload {
    Workload::new(
        root,
        WorkloadConfig {
            seed: 7,
            min_file_bytes: 1 << 10,
            max_file_bytes: 16 << 10,
            ..WorkloadConfig::default()
        },
    )
    .unwrap()
}

fn advance(w: &mut Workload, steps: usize) -> StateId {
    for _ in 0..steps {
        w.step().unwrap();
    }
    w.flush().unwrap();
    w.latest()
}

/// Polls `f` until it answers Some, for up to a minute.
fn wait_for<T>(what: &str, log: &dyn Fn() -> String, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn head(store: &dyn ObjectStore) -> Option<StateId> {
    rt().block_on(get_record(store, &layout::head(), RecordKind::Head, None))
        .ok()
        .map(|d| d.published.state_id)
}

fn has(store: &dyn ObjectStore, path: &object_store::path::Path) -> bool {
    rt().block_on(store.head(path)).is_ok()
}

/// The published states.
fn states(store: &dyn ObjectStore) -> Vec<StateId> {
    use futures::TryStreamExt;
    let metas: Vec<object_store::ObjectMeta> = rt()
        .block_on(store.list(Some(&"states/".into())).try_collect())
        .unwrap();
    let mut out: Vec<StateId> = metas
        .iter()
        .filter_map(|m| layout::state_of(&m.location))
        .collect();
    out.sort();
    out
}

/// Every blob a published state reaches; panics if one is missing.
fn whole_state_blobs(store: &dyn ObjectStore, state: StateId) -> HashSet<BlobId> {
    rt().block_on(async {
        let rec = get_record(store, &layout::state(state), RecordKind::State, None)
            .await
            .unwrap_or_else(|e| panic!("state {state}: {e}"));
        let marked = Collector::new()
            .mark(store, [rec.published.root])
            .await
            .unwrap_or_else(|e| panic!("state {state}: {e}"));
        for b in &marked.blobs {
            assert!(
                store.head(&layout::blob(b)).await.is_ok(),
                "state {state}: blob {} is missing",
                b.to_hex()
            );
        }
        marked.blobs
    })
}

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
    DaemonProcess::start_with_log_filter(
        Path::new(BIN),
        &mnt,
        &args,
        &root.join("reader.log"),
        "info",
        Duration::from_secs(20),
    )
    .expect("the reader host mounts")
}

/// `stagefs lease ARGS`: its two lines, parsed.
fn lease_cmd(args: &[&str]) -> (StateId, String) {
    let out = Command::new(BIN).arg("lease").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "stagefs lease {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut state = None;
    let mut id = None;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("STAGEFS_STATE_ID=") {
            state = Some(StateId(v.parse().unwrap()));
        } else if let Some(v) = line.strip_prefix("STAGEFS_LEASE=") {
            id = Some(v.to_owned());
        } else {
            panic!("unexpected line {line:?}");
        }
    }
    (state.unwrap(), id.unwrap())
}

/// Every table of `state` read through `dir` (a snapshot path) equals the
/// source's at that state.
fn check_state_reads(w: &Workload, dir: &Path, state: StateId) {
    let expected = w.expected(state).expect("the workload knows the state");
    assert!(!expected.is_empty());
    for (key, content) in expected.iter() {
        let (db, table) = key.split_once('.').unwrap();
        let got = read_tree(&dir.join(db).join(table)).unwrap();
        assert_eq!(
            &got,
            &**content,
            "{key} at {state} through {}",
            dir.display()
        );
    }
}

#[test]
fn a_leased_state_outlives_retention_and_is_collected_once_released() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("published").display());
    let store = open_store(&url).unwrap();
    let mut w = workload(&dir.path().join("src"));
    let first = advance(&mut w, 20);
    let publisher = Publisher::start(&dir.path().join("pub"), &w, &url);
    let plog = || publisher.log();
    wait_for("HEAD reaches the source", &plog, || {
        (head(&*store) == Some(first)).then_some(())
    });
    let host = dir.path().join("host");
    let reader = reader_host(&host, &url, &[]);
    let mnt = host.join("mnt");
    wait_for("the reader host shows the head", &|| reader.log(), || {
        (visible(&mnt).ok() == Some(first)).then_some(())
    });

    // Lease what the host shows; renew it (same state, same id).
    let mnt_s = mnt.to_str().unwrap();
    let (leased, id) = lease_cmd(&[mnt_s, "--at", "visible", "--ttl", "10m"]);
    assert_eq!(leased, first);
    assert_eq!(
        lease_cmd(&[mnt_s, "--renew", &id, "--ttl", "20m"]),
        (leased, id.clone())
    );
    let lease_id = lease::LeaseId::parse(&id).unwrap();
    let l = rt()
        .block_on(lease::read(&*store, lease_id))
        .unwrap()
        .unwrap();
    assert_eq!(l.state, leased);
    let leased_blobs = whole_state_blobs(&*store, leased);

    // Newer states, published and collected: the leased one stays whole.
    let mut newest = first;
    for _ in 0..4 {
        newest = advance(&mut w, 15);
        wait_for("HEAD moves on", &plog, || {
            (head(&*store) == Some(newest)).then_some(())
        });
    }
    wait_for("retention drops the unleased states", &plog, || {
        let s = states(&*store);
        (s.len() == 3 && s.contains(&leased) && s.last() == Some(&newest)).then_some(())
    });
    let newest_blobs = whole_state_blobs(&*store, newest);
    whole_state_blobs(&*store, leased);
    assert!(
        leased_blobs.iter().any(|b| !newest_blobs.contains(b)),
        "the workload changes content the leased state had"
    );
    // Readable on the reader host by its snapshot path and as a job.
    check_state_reads(
        &w,
        &mnt.join(".stagefs/snapshots").join(leased.0.to_string()),
        leased,
    );
    // And on a host that never loaded it: fetched on demand from the URL.
    let late = dir.path().join("late");
    let late_reader = reader_host(&late, &url, &[]);
    wait_for(
        "the late host shows the head",
        &|| late_reader.log(),
        || (visible(&late.join("mnt")).ok() == Some(newest)).then_some(()),
    );
    check_state_reads(
        &w,
        &late
            .join("mnt/.stagefs/snapshots")
            .join(leased.0.to_string()),
        leased,
    );
    assert!(
        late_reader.log().contains("loaded on demand"),
        "{}",
        late_reader.log()
    );
    drop(late_reader);
    let job = Command::new("sh")
        .arg("-c")
        .arg("ls \"$1\" >/dev/null && getfattr --only-values -n user.stagefs.state_id \"$1\"")
        .arg("sh")
        .arg(&mnt)
        .env("STAGEFS_STATE_ID", leased.0.to_string())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&job.stdout).trim(),
        leased.0.to_string(),
        "a job process sees the leased state: {}",
        String::from_utf8_lossy(&job.stderr)
    );

    // A taken lease on a state that was collected is refused (exit 2).
    let gone = states(&*store)[0].0.saturating_sub(1).max(1);
    if !states(&*store).contains(&StateId(gone)) {
        let out = Command::new(BIN)
            .args(["lease", mnt_s, "--at", &gone.to_string()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
    }

    // Released: the state and its unshared content go; kept ones stay whole.
    lease_cmd_release(mnt_s, &id);
    wait_for("the released state is collected", &plog, || {
        (!states(&*store).contains(&leased)).then_some(())
    });
    let kept: HashSet<BlobId> = states(&*store)
        .into_iter()
        .flat_map(|s| whole_state_blobs(&*store, s))
        .collect();
    wait_for("its unshared blobs are swept", &plog, || {
        leased_blobs
            .iter()
            .filter(|b| !kept.contains(b))
            .all(|b| !has(&*store, &layout::blob(b)))
            .then_some(())
    });
    for b in leased_blobs.iter().filter(|b| kept.contains(b)) {
        assert!(has(&*store, &layout::blob(b)), "a shared blob was swept");
    }
    // The reader host loaded states while collection ran: it never missed
    // an object below a state record it had read.
    let log = reader.log();
    for what in ["catalogs/", "pieces/", "blobs/"] {
        assert!(
            !log.lines()
                .any(|l| l.contains(what) && l.contains("missing")),
            "the reader missed an object of a state it loaded:\n{log}"
        );
    }
    drop(reader);
}

fn lease_cmd_release(mnt: &str, id: &str) {
    let out = Command::new(BIN)
        .args(["lease", mnt, "--release", id])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty());
    // Releasing again is fine; renewing a released lease is refused.
    let again = Command::new(BIN)
        .args(["lease", mnt, "--release", id])
        .output()
        .unwrap();
    assert!(again.status.success(), "{again:?}");
    let renew = Command::new(BIN)
        .args(["lease", mnt, "--renew", id])
        .output()
        .unwrap();
    assert_eq!(renew.status.code(), Some(2), "{renew:?}");
}

#[test]
fn a_pin_on_a_reader_host_leases_its_state_until_the_host_dies() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("published").display());
    let store = open_store(&url).unwrap();
    let mut w = workload(&dir.path().join("src"));
    let first = advance(&mut w, 20);
    let publisher = Publisher::start(&dir.path().join("pub"), &w, &url);
    let plog = || publisher.log();
    wait_for("HEAD reaches the source", &plog, || {
        (head(&*store) == Some(first)).then_some(())
    });
    let host = dir.path().join("host");
    let mut reader = reader_host(&host, &url, &["--lease-ttl", "2s"]);
    let mnt = host.join("mnt");
    wait_for("the reader host shows the head", &|| reader.log(), || {
        (visible(&mnt).ok() == Some(first)).then_some(())
    });
    // `stagefs run` on the host leases its session's state while it runs.
    let stop = host.join("stop");
    let run = Command::new(BIN)
        .arg("run")
        .arg(&mnt)
        .args(["--", "sh", "-c"])
        .arg("while [ ! -e \"$1\" ]; do sleep 0.05; done; echo $STAGEFS_STATE_ID")
        .arg("sh")
        .arg(&stop)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let leased_states = || -> Vec<StateId> {
        rt().block_on(lease::list(&*store))
            .unwrap()
            .iter()
            .filter_map(|l| l.lease.as_ref().map(|l| l.state))
            .collect()
    };
    let session = wait_for("the session is leased at the URL", &|| reader.log(), || {
        leased_states().first().copied()
    });
    std::fs::write(&stop, b"").unwrap();
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        session.0.to_string()
    );
    wait_for(
        "the ended session's lease is released",
        &|| reader.log(),
        || (!leased_states().contains(&session)).then_some(()),
    );

    let pin = Command::new("setfattr")
        .args(["-n", "user.stagefs.pin", "-v"])
        .arg(first.0.to_string())
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(pin.success());
    wait_for("the pin is leased at the URL", &|| reader.log(), || {
        let leases = rt().block_on(lease::list(&*store)).unwrap();
        leases
            .iter()
            .any(|l| l.lease.as_ref().is_some_and(|l| l.state == first))
            .then_some(())
    });
    let mut newest = first;
    for _ in 0..3 {
        newest = advance(&mut w, 15);
        wait_for("HEAD moves on", &plog, || {
            (head(&*store) == Some(newest)).then_some(())
        });
    }
    wait_for("retention drops the unpinned states", &plog, || {
        let s = states(&*store);
        (s.len() == 3 && s.contains(&first)).then_some(())
    });
    whole_state_blobs(&*store, first);
    check_state_reads(&w, &mnt, first);

    // The host dies: nobody renews, the lease expires, the state goes.
    reader.kill9();
    wait_for(
        "the dead host's lease expires and its state goes",
        &plog,
        || (!states(&*store).contains(&first)).then_some(()),
    );
    assert_eq!(states(&*store).last(), Some(&newest));
    whole_state_blobs(&*store, newest);
}

#[test]
fn stagefs_lease_on_a_publishing_mount_leases_the_newest_published_state() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("published").display());
    let store = open_store(&url).unwrap();
    let mut w = workload(&dir.path().join("src"));
    let first = advance(&mut w, 20);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let state = dir.path().join("state");
    let (src, events, cm) = (w.source_root(), w.events_dir(), w.cm_root());
    let args: Vec<&std::ffi::OsStr> = vec![
        "--state".as_ref(),
        state.as_os_str(),
        "--source-root".as_ref(),
        src.as_os_str(),
        "--events".as_ref(),
        events.as_os_str(),
        "--cm-root".as_ref(),
        cm.as_os_str(),
        "--retain".as_ref(),
        "2".as_ref(),
        "--publish".as_ref(),
        url.as_ref(),
        "--gc-grace".as_ref(),
        "1s".as_ref(),
    ];
    let publisher = DaemonProcess::start_with_log_filter(
        Path::new(BIN),
        &mnt,
        &args,
        &dir.path().join("mount.log"),
        "info",
        Duration::from_secs(20),
    )
    .expect("the publishing mount mounts");
    wait_for("HEAD reaches the source", &|| publisher.log(), || {
        (head(&*store) == Some(first)).then_some(())
    });
    let mnt_s = mnt.to_str().unwrap();
    let (leased, id) = lease_cmd(&[mnt_s, "--ttl", "5m"]);
    assert_eq!(
        leased, first,
        "`visible` on a publisher is the newest published state"
    );
    // Three publications after it (each waited for: the publisher may
    // skip states), so retention alone would drop it.
    let mut newest = first;
    for _ in 0..3 {
        newest = advance(&mut w, 10);
        wait_for("HEAD moves on", &|| publisher.log(), || {
            (head(&*store) == Some(newest)).then_some(())
        });
    }
    wait_for(
        "retention keeps the leased state only",
        &|| publisher.log(),
        || {
            let s = states(&*store);
            (s.len() == 3 && s.contains(&leased) && s.last() == Some(&newest)).then_some(())
        },
    );
    whole_state_blobs(&*store, leased);
    lease_cmd_release(mnt_s, &id);
    wait_for(
        "the released state is collected",
        &|| publisher.log(),
        || (!states(&*store).contains(&leased)).then_some(()),
    );
    drop(publisher);
}

#[test]
fn on_s3_a_leased_state_is_kept_and_collected_once_released() {
    let server = servers::S3Server::start().expect("start the S3 server");
    server
        .create_bucket("stagefs-leases", false)
        .expect("create the bucket");
    let env: Vec<(String, String)> = vec![
        ("AWS_ENDPOINT_URL".into(), server.endpoint()),
        ("AWS_ACCESS_KEY_ID".into(), server.access_key().into()),
        ("AWS_SECRET_ACCESS_KEY".into(), server.secret_key().into()),
        ("AWS_REGION".into(), server.region().into()),
    ];
    let url = "s3://stagefs-leases/published";
    let s3 = server.store_builder("stagefs-leases").build().unwrap();
    let store: std::sync::Arc<dyn ObjectStore> =
        std::sync::Arc::new(object_store::prefix::PrefixStore::new(s3, "published"));
    let dir = tempfile::tempdir().unwrap();
    let mut w = workload(&dir.path().join("src"));
    let first = advance(&mut w, 20);
    let publisher = Publisher::start_with_env(&dir.path().join("pub"), &w, url, &env);
    let plog = || publisher.log();
    wait_for("HEAD reaches the source", &plog, || {
        (head(&*store) == Some(first)).then_some(())
    });
    let id = rt()
        .block_on(lease::acquire(
            &*store,
            first,
            Duration::from_secs(600),
            "test",
        ))
        .unwrap();
    let leased_blobs = whole_state_blobs(&*store, first);
    let mut newest = first;
    for _ in 0..3 {
        newest = advance(&mut w, 15);
        wait_for("HEAD moves on", &plog, || {
            (head(&*store) == Some(newest)).then_some(())
        });
    }
    wait_for("retention keeps the leased state only", &plog, || {
        let s = states(&*store);
        (s.len() == 3 && s.contains(&first) && s.last() == Some(&newest)).then_some(())
    });
    whole_state_blobs(&*store, first);
    rt().block_on(lease::release(&*store, id)).unwrap();
    wait_for("the released state is collected", &plog, || {
        (!states(&*store).contains(&first)).then_some(())
    });
    let kept: HashSet<BlobId> = states(&*store)
        .into_iter()
        .flat_map(|s| whole_state_blobs(&*store, s))
        .collect();
    wait_for("its unshared blobs are swept", &plog, || {
        leased_blobs
            .iter()
            .filter(|b| !kept.contains(b))
            .all(|b| !has(&*store, &layout::blob(b)))
            .then_some(())
    });
}
