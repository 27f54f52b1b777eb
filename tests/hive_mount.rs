//! The Hive source through a real mount: `stagefs mount --hive-events
//! ROWS --source-map ...` as a user runs it. Transactional subdirectories
//! as read-only directories, `user.stagefs.verified`, the source in status,
//! the consistency checker with concurrent readers over a Hive-fed mount,
//! and kill -9 / restart.

use stagefs::testkit::source_files;

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use source_files::{event, put_file};
use stagefs::event::StateId;
use stagefs::testkit::checker::{
    check_stagefs_table, getxattr_string, mount_status, run_readers, visible, CheckConfig,
    DaemonProcess, Oracle, Target,
};
use stagefs::workload::hive_export::{HiveWriter, LogConverter, TxnFiles};
use stagefs::workload::{Workload, WorkloadConfig};

/// The mount tests share 2 cores: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn long() -> bool {
    std::env::var("STAGEFS_LONG_TESTS").is_ok_and(|v| v == "1")
}

fn writer(root: &Path) -> HiveWriter {
    HiveWriter::for_workload(root, &root.join("hive/rows.jsonl"), true).unwrap()
}

fn start(dir: &Path, w: &HiveWriter, retain: usize) -> DaemonProcess {
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mut flags: Vec<OsString> = vec![
        "--state".into(),
        dir.join("state").into(),
        "--hive-events".into(),
        dir.join("src/hive/rows.jsonl").into(),
        "--hive-poll-ms".into(),
        "20".into(),
        "--retain".into(),
        retain.to_string().into(),
    ];
    for m in w.source_map_args() {
        flags.push("--source-map".into());
        flags.push(m.into());
    }
    let args: Vec<&OsStr> = flags.iter().map(|f| f.as_os_str()).collect();
    DaemonProcess::start(
        Path::new(env!("CARGO_BIN_EXE_stagefs")),
        &mnt,
        &args,
        &dir.join("daemon.log"),
        Duration::from_secs(20),
    )
    .expect("daemon mounts")
}

fn wait_visible(mnt: &Path, state: StateId, timeout: Duration) {
    let start = Instant::now();
    while visible(mnt).unwrap_or_default() < state {
        assert!(
            start.elapsed() < timeout,
            "did not reach {state}: {}",
            std::fs::read_to_string(mnt.join(".stagefs/status")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn transactional_subdirectories_are_read_only_directories_with_verified_files() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("src");
    let mut w = writer(&root);
    w.write_event(&event(
        r#"{"id": 1, "op": "create_database", "db": "sales"}"#,
    ))
    .unwrap();
    w.write_event(&event(
        r#"{"id": 2, "op": "create_table", "db": "sales", "table": "orders", "partition_keys": ["ds"]}"#,
    ))
    .unwrap();
    let delta = "delta_0000001_0000001_0000";
    let bucket = put_file(
        &root,
        &format!("sales.db/orders/ds=2024-01-01/{delta}/bucket_00000"),
        b"acid rows\n",
    );
    w.write_txn(
        1_700_000_000,
        &[TxnFiles {
            db: "sales".into(),
            table: "orders".into(),
            partition: Some([("ds".to_owned(), "2024-01-01".to_owned())].into()),
            files: vec![(bucket, Some(delta.into()))],
        }],
    )
    .unwrap();
    // An INSERT whose URI carries no checksum (change management off).
    w.set_checksums(false);
    let plain = put_file(&root, "sales.db/orders/ds=2024-01-02/000000_0", b"plain\n");
    let sha = plain.key().to_hex();
    w.write_event(&event(&format!(
        r#"{{"id": 4, "op": "add_files", "db": "sales", "table": "orders", "partition": {{"ds": "2024-01-02"}}, "files": [{{"path": "sales.db/orders/ds=2024-01-02/000000_0", "size": 6, "sha256": "{sha}"}}]}}"#
    )))
    .unwrap();
    let daemon = start(dir.path(), &w, 16);
    let mnt = dir.path().join("mnt");
    wait_visible(&mnt, StateId(4), Duration::from_secs(20));

    let part = mnt.join("sales/orders/ds=2024-01-01");
    let names: Vec<String> = std::fs::read_dir(&part)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![delta.to_owned()]);
    let delta_dir = part.join(delta);
    let meta = std::fs::metadata(&delta_dir).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o777, 0o555);
    let file = delta_dir.join("bucket_00000");
    assert_eq!(std::fs::read(&file).unwrap(), b"acid rows\n");
    assert_eq!(
        getxattr_string(&file, "user.stagefs.verified").unwrap(),
        "hdfs-md5md5crc32c"
    );
    assert!(getxattr_string(&file, "user.stagefs.source")
        .unwrap()
        .starts_with("hdfs://stagefs-demo:8020/warehouse/sales.db/orders/"));
    let err = std::fs::write(delta_dir.join("new"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    assert_eq!(
        std::fs::create_dir(delta_dir.join("sub"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EROFS)
    );
    let plain = mnt.join("sales/orders/ds=2024-01-02/000000_0");
    assert_eq!(std::fs::read(&plain).unwrap(), b"plain\n");
    assert_eq!(
        getxattr_string(&plain, "user.stagefs.verified").unwrap(),
        "none"
    );
    let status = mount_status(&mnt).unwrap();
    assert_eq!(status.source.kind, "hive");
    assert_eq!(status.source.position, Some(4));
    assert_eq!(status.unverified_files, 1);
    let mut daemon = daemon;
    assert!(
        daemon.terminate(Duration::from_secs(10)).unwrap(),
        "{}",
        daemon.log()
    );
}

/// The source: workload steps converted to Hive rows, recorded in the oracle.
struct Source {
    workload: Workload,
    converter: LogConverter,
}

impl Source {
    fn new(dir: &Path, seed: u64) -> Source {
        let root = dir.join("src");
        let workload = Workload::new(&root, WorkloadConfig::for_readers(seed)).unwrap();
        let converter = LogConverter::new(&root.join("events"), writer(&root));
        Source {
            workload,
            converter,
        }
    }

    fn step(&mut self, oracle: &Oracle) {
        self.workload.step().unwrap();
        self.workload.flush().unwrap();
        self.converter.pump().unwrap();
        oracle.record(&self.workload);
    }
}

#[test]
fn consistency_checker_over_a_hive_fed_mount_finds_no_anomalies() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let oracle = Oracle::new();
    let mut source = Source::new(dir.path(), 31);
    for _ in 0..60 {
        source.step(&oracle);
    }
    let daemon = start(dir.path(), &source.converter.writer, 4);
    let mnt = dir.path().join("mnt");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, oracle) = (Arc::clone(&stop), Arc::clone(&oracle));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                source.step(&oracle);
                std::thread::sleep(Duration::from_millis(5));
            }
            source
        })
    };
    let cfg = CheckConfig {
        readers: 8,
        target_observations: if long() { 1_000_000 } else { 5_000 },
        min_duration: Duration::from_secs(if long() { 300 } else { 4 }),
        max_duration: Duration::from_secs(if long() { 600 } else { 30 }),
        min_distinct_ids: 0,
        seed: 9,
    };
    let never = AtomicBool::new(false);
    let report = run_readers(
        &Target::Stagefs { mount: mnt.clone() },
        &oracle,
        &cfg,
        &never,
    );
    stop.store(true, Ordering::SeqCst);
    let source = writer.join().unwrap();
    eprintln!("stagefs over Hive rows: {}", report.summary());
    let why = || {
        format!(
            "{}\nstatus: {}\nlog: {}",
            report.summary(),
            std::fs::read_to_string(mnt.join(".stagefs/status")).unwrap_or_default(),
            daemon.log()
        )
    };
    assert_eq!(report.anomalies, 0, "{}", why());
    // The readers must have seen states move under them (a run with one
    // id checks nothing); how many depends on the machine's load.
    assert!(report.distinct_ids >= 5, "{}", why());
    let latest = source.workload.latest();
    wait_visible(&mnt, latest, Duration::from_secs(30));
    for key in source.workload.expected(latest).unwrap().keys() {
        assert!(
            check_stagefs_table(&oracle, &mnt, key).unwrap().is_some(),
            "{key}"
        );
    }
    let mut daemon = daemon;
    assert!(
        daemon.terminate(Duration::from_secs(10)).unwrap(),
        "{}",
        daemon.log()
    );
}

#[test]
fn kill_9_while_following_and_restart_lose_nothing_and_apply_nothing_twice() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let oracle = Oracle::new();
    let mut source = Source::new(dir.path(), 47);
    for _ in 0..40 {
        source.step(&oracle);
    }
    let mnt: PathBuf = dir.path().join("mnt");
    for round in 0..3 {
        let mut daemon = start(dir.path(), &source.converter.writer, 4);
        for _ in 0..40 {
            source.step(&oracle);
            std::thread::sleep(Duration::from_millis(10));
        }
        // Killed while rows keep coming: some read, some journaled, some staged.
        daemon.kill9();
        for _ in 0..10 {
            source.step(&oracle);
        }
        eprintln!("round {round}: killed at {}", source.workload.latest());
    }
    let mut daemon = start(dir.path(), &source.converter.writer, 4);
    let latest = source.workload.latest();
    wait_visible(&mnt, latest, Duration::from_secs(30));
    let status = mount_status(&mnt).unwrap();
    assert!(status.stalled.is_none(), "{:?}", status.stalled);
    assert_eq!(status.source.position, Some(latest.0 as i64));
    for key in source.workload.expected(latest).unwrap().keys() {
        let checked = check_stagefs_table(&oracle, &mnt, key);
        assert!(
            matches!(checked, Ok(Some(_))),
            "{key}: {checked:?}\nlog: {}",
            daemon.log()
        );
    }
    assert!(
        daemon.terminate(Duration::from_secs(10)).unwrap(),
        "{}",
        daemon.log()
    );
}
