//! Replication lag from a Hive metastore: an INSERT event committed into
//! `NOTIFICATION_LOG` (the way DbNotificationListener commits it) → the
//! mount's `user.stagefs.visible` reaches its id. Method and figures:
//! docs/BENCHMARKS.md ("Hive source (issue 11)"); scripts/bench/hive.sh runs it.
//!
//!     bench_hive_lag STAGEFS_BIN [--db postgres|mariadb] [--rate 100]
//!                    [--seconds 10] [--poll-ms 500] [--bytes 4096]
//!
//! Starts a private database server (tests/common/dbserver.rs), a stagefs
//! daemon on a temp mount with `--hive-metastore` and the given poll
//! interval (default: the daemon's default, 500 ms), creates `lag.t`, then
//! commits one gzip(json-2.0) INSERT of one new file per event at a fixed
//! rate while another thread polls the visible id every 0.5 ms. Prints
//! p50/p90/p99/max of commit → visible. Needs root (FUSE).

#[path = "../tests/common/dbserver.rs"]
mod dbserver;
#[path = "../tests/common/metastore_rows.rs"]
mod metastore_rows;

#[path = "bench_common/mod.rs"]
mod bench_common;

use bench_common::{arg, percentile, visible};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use stagefs::event::Event;
use stagefs::source::hive::model::NotificationRow;
use stagefs::workload::hive_export::HiveWriter;

use dbserver::{DbServer, Kind, TableCase, PASSWORD};
use metastore_rows::MetastoreWriter;

fn opt(args: &[String], name: &str, default: &str) -> String {
    arg(args, name).unwrap_or(default).to_string()
}

/// Native event lines → Hive rows (as `stagefs::workload::hive_export` writes them).
fn hive_rows(
    writer: &mut HiveWriter,
    rows_path: &Path,
    from: usize,
    lines: &[String],
) -> Vec<NotificationRow> {
    for line in lines {
        let event = Event::parse_line(line.as_bytes()).expect("native event");
        writer.write_event(&event).expect("write the Hive row");
    }
    writer.sync().expect("sync rows");
    let text = fs::read_to_string(rows_path).expect("rows");
    text.lines()
        .skip(from)
        .map(|l| serde_json::from_str(l).expect("a notification row"))
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(bin) = args.first().cloned() else {
        eprintln!("usage: bench_hive_lag STAGEFS_BIN [--db postgres|mariadb] [--rate N] [--seconds S] [--poll-ms MS] [--bytes B]");
        std::process::exit(2);
    };
    let kind = match opt(&args, "--db", "postgres").as_str() {
        "postgres" => Kind::Postgres,
        "mariadb" => Kind::MariaDb,
        other => panic!("--db {other}: postgres or mariadb"),
    };
    let rate: u64 = opt(&args, "--rate", "100").parse().expect("--rate");
    let seconds: u64 = opt(&args, "--seconds", "10").parse().expect("--seconds");
    let poll_ms = opt(&args, "--poll-ms", "500");
    let payload: usize = opt(&args, "--bytes", "4096").parse().expect("--bytes");

    let server = DbServer::start(kind);
    server.create_metastore("hive", TableCase::Upper);
    let mut db = MetastoreWriter::new(&server, "hive", TableCase::Upper);
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    let (source, mnt) = (root.join("source"), root.join("mnt"));
    fs::create_dir_all(&mnt).expect("mnt");
    fs::create_dir_all(&source).expect("source");
    let rows_path = root.join("rows.jsonl");
    let mut converter = HiveWriter::new(&rows_path, &source, None, &root.join("hive-cm"), true)
        .expect("hive writer");
    let mut cmd = Command::new(&bin);
    cmd.arg("mount")
        .arg(&mnt)
        .arg("--state")
        .arg(root.join("state"))
        .arg("--hive-metastore")
        .arg(server.url("hive"));
    for m in converter.source_map_args() {
        cmd.arg("--source-map").arg(m);
    }
    if args.iter().any(|a| a == "--poll-ms") {
        cmd.arg("--hive-poll-ms").arg(&poll_ms);
    }
    let mut daemon = cmd
        .env("STAGEFS_METASTORE_PASSWORD", PASSWORD)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(root.join("daemon.log")).expect("log"))
        .spawn()
        .expect("spawn stagefs");

    let mnt_c = CString::new(mnt.as_os_str().as_bytes()).expect("no NUL");
    let name_c = CString::new("user.stagefs.visible").expect("no NUL");
    let setup = [
        r#"{"id":1,"op":"create_database","db":"lag"}"#.to_string(),
        r#"{"id":2,"op":"create_table","db":"lag","table":"t","partition_keys":["p"]}"#.to_string(),
    ];
    for row in hive_rows(&mut converter, &rows_path, 0, &setup) {
        db.append_exported(&row);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while visible(&mnt_c, &name_c) < 2 {
        assert!(Instant::now() < deadline, "the mount never showed state 2");
        std::thread::sleep(Duration::from_millis(5));
    }

    // Files first, then their events (as at a real source), converted
    // before the timed loop so that it only commits rows.
    let n = (rate * seconds) as usize;
    let mut lines = Vec::with_capacity(n);
    let mut content = vec![0u8; payload];
    for k in 0..n {
        let id = 3 + k as u64;
        let p = k % 100;
        let rel = format!("lag/t/p={p}/f_{id:08}");
        let path = source.join(&rel);
        fs::create_dir_all(path.parent().expect("parent")).expect("dir");
        for (i, b) in content.iter_mut().enumerate() {
            *b = (id as usize).wrapping_mul(31).wrapping_add(i) as u8;
        }
        fs::write(&path, &content).expect("file");
        let sha: String = Sha256::digest(&content)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        lines.push(format!(
            r#"{{"id":{id},"op":"add_files","db":"lag","table":"t","partition":{{"p":"{p}"}},"files":[{{"path":"{rel}","size":{payload},"sha256":"{sha}"}}]}}"#
        ));
    }
    let rows = hive_rows(&mut converter, &rows_path, 2, &lines);
    assert_eq!(rows.len(), n, "one row per event");
    let first_id = rows[0].event_id as u64;

    let committed: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));
    let base = Instant::now();
    let poller = {
        let (committed, done) = (Arc::clone(&committed), Arc::clone(&done));
        let (mnt_c, name_c) = (mnt_c.clone(), name_c.clone());
        std::thread::spawn(move || {
            let mut lags = Vec::with_capacity(n);
            let mut cursor = 0usize;
            let mut drain: Option<Instant> = None;
            while cursor < n {
                let v = visible(&mnt_c, &name_c);
                let now = base.elapsed().as_nanos() as u64;
                while cursor < n && first_id + cursor as u64 <= v {
                    let t = committed[cursor].load(Ordering::SeqCst);
                    if t == 0 {
                        // Visible before its commit time was stored: the
                        // commit returned just now.
                        break;
                    }
                    lags.push(now.saturating_sub(t - 1) as f64 / 1e6);
                    cursor += 1;
                }
                if done.load(Ordering::SeqCst)
                    && Instant::now()
                        > *drain.get_or_insert_with(|| Instant::now() + Duration::from_secs(60))
                {
                    break;
                }
                std::thread::sleep(Duration::from_micros(500));
            }
            lags
        })
    };
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let start = Instant::now();
    let mut behind_max = Duration::ZERO;
    for (k, row) in rows.iter().enumerate() {
        let due = start + period * k as u32;
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        } else {
            behind_max = behind_max.max(now - due);
        }
        db.append_exported(row);
        committed[k].store(base.elapsed().as_nanos() as u64 + 1, Ordering::SeqCst);
    }
    let wrote = start.elapsed().as_secs_f64();
    done.store(true, Ordering::SeqCst);
    let mut lags = poller.join().expect("poller");
    lags.sort_by(|a, b| a.total_cmp(b));
    println!(
        "db={kind:?} poll_ms={} rate={rate} events={n} seen={} achieved_rate={:.0} p50_ms={:.1} p90_ms={:.1} p99_ms={:.1} max_ms={:.1} producer_behind_max_ms={:.1}",
        if args.iter().any(|a| a == "--poll-ms") { poll_ms.as_str() } else { "500 (default)" },
        lags.len(),
        n as f64 / wrote,
        percentile(&lags, 50.0),
        percentile(&lags, 90.0),
        percentile(&lags, 99.0),
        lags.last().copied().unwrap_or(f64::NAN),
        behind_max.as_secs_f64() * 1e3,
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let _ = daemon.wait();
    if fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|m| m.contains(mnt.to_str().unwrap_or("-")))
    {
        let _ = Command::new("fusermount3").arg("-uz").arg(&mnt).status();
    }
}
