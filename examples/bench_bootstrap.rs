//! Bootstrap benchmark (issue 12): a Hive warehouse built through the
//! metastore's own tables on a private PostgreSQL or MariaDB
//! (tests/common/hms_warehouse.rs), then, in the same run and on the same
//! files: `cp -r` of the warehouse followed by `sync`, and `stagefs
//! bootstrap` into an empty state folder, each timed, with the
//! bootstrap's peak memory (`VmHWM` of the child, read by
//! `/usr/bin/time -v` when present). Prints one `key=value` line per
//! figure. Driven by scripts/bench/bootstrap.sh; figures in
//! docs/BENCHMARKS.md ("Bootstrap").
//!
//!     bench_bootstrap STAGEFS_BIN [--db postgres|mariadb] [--databases N]
//!         [--tables N] [--partitions N] [--bytes B] [--dir DIR]

#[path = "../tests/common/dbserver.rs"]
mod dbserver;
#[path = "../tests/common/hive_writer.rs"]
mod hive_writer;
#[path = "../tests/common/hms_warehouse.rs"]
mod hms_warehouse;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use dbserver::{DbServer, Kind, TableCase, PASSWORD};
use hms_warehouse::{HmsWarehouse, Shape};

fn opt(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

fn num(args: &[String], name: &str, default: &str) -> usize {
    opt(args, name, default)
        .parse()
        .unwrap_or_else(|_| panic!("{name}: a number"))
}

/// Runs `cmd`, under `/usr/bin/time -v` when it exists; returns the
/// seconds taken and the peak resident set in KiB (None without time -v).
fn timed(mut cmd: Command, log: &Path) -> (f64, Option<u64>) {
    let time_v = Path::new("/usr/bin/time").exists();
    let mut run = if time_v {
        let mut t = Command::new("/usr/bin/time");
        t.arg("-v").arg(cmd.get_program()).args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => t.env(k, v),
                None => t.env_remove(k),
            };
        }
        t
    } else {
        std::mem::replace(&mut cmd, Command::new("true"))
    };
    let started = Instant::now();
    let st = run
        .stderr(std::fs::File::create(log).expect("log"))
        .status()
        .expect("run");
    let seconds = started.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(st.success(), "{text}");
    let rss = text
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Maximum resident set size (kbytes): ")
        })
        .and_then(|v| v.trim().parse().ok());
    (seconds, rss)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(bin) = args.first().cloned() else {
        eprintln!("usage: bench_bootstrap STAGEFS_BIN [--db postgres|mariadb] [--databases N] [--tables N] [--partitions N] [--bytes B] [--dir DIR]");
        std::process::exit(2);
    };
    let kind = match opt(&args, "--db", "postgres").as_str() {
        "postgres" => Kind::Postgres,
        "mariadb" => Kind::MariaDb,
        other => panic!("--db {other}: postgres or mariadb"),
    };
    let shape = Shape {
        databases: num(&args, "--databases", "10"),
        tables_per_db: num(&args, "--tables", "100"),
        partitions_per_table: num(&args, "--partitions", "10"),
        unpartitioned_every: 0,
        file_bytes: num(&args, "--bytes", "64"),
        seed: 7,
    };
    let base = opt(&args, "--dir", "/var/tmp");
    std::fs::create_dir_all(&base).expect("--dir");
    let dir = tempfile::tempdir_in(&base).expect("temp dir");
    let root = dir.path();

    let server = DbServer::start(kind);
    server.create_metastore("hive", TableCase::Upper);
    let started = Instant::now();
    let wh = HmsWarehouse::create(&server, "hive", &root.join("hive"), &shape);
    let files = wh.file_count();
    let bytes = files as u64 * shape.file_bytes as u64;
    println!("db={kind:?}");
    println!("tables={}", wh.table_names().len());
    println!("partitions={}", wh.partition_count());
    println!("files={files}");
    println!("bytes={bytes}");
    println!("build_seconds={:.1}", started.elapsed().as_secs_f64());

    // The same files, copied the plain way and made durable.
    let _ = Command::new("sync").status();
    let started = Instant::now();
    let st = Command::new("cp")
        .arg("-r")
        .arg(root.join("hive/wh"))
        .arg(root.join("cp-copy"))
        .status()
        .expect("cp");
    assert!(st.success(), "cp -r failed");
    let st = Command::new("sync").status().expect("sync");
    assert!(st.success(), "sync failed");
    let cp = started.elapsed().as_secs_f64();
    println!("cp_sync_seconds={cp:.2}");
    std::fs::remove_dir_all(root.join("cp-copy")).expect("remove the copy");
    let _ = Command::new("sync").status();

    let mut cmd = Command::new(&bin);
    cmd.arg("bootstrap")
        .arg("--state")
        .arg(root.join("state"))
        .arg("--hive-metastore")
        .arg(server.url("hive"))
        .env("STAGEFS_METASTORE_PASSWORD", PASSWORD);
    for m in wh.source_map() {
        cmd.arg("--source-map").arg(m);
    }
    let (seconds, rss) = timed(cmd, &root.join("bootstrap.log"));
    println!("bootstrap_seconds={seconds:.2}");
    if let Some(kib) = rss {
        println!("bootstrap_peak_rss_kib={kib}");
    }
    println!("bootstrap_vs_cp={:.2}", cp / seconds);
    let report =
        std::fs::read_to_string(root.join("state/bootstrap/report.json")).expect("report.json");
    println!("report={}", report.trim());
    drop(server);
}
