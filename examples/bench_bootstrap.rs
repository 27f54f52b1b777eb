//! Bootstrap benchmark (issue 12): a Hive warehouse built through the
//! metastore's own tables on a private PostgreSQL or MariaDB
//! (tests/common/hms_warehouse.rs, started by this program as the tests
//! do), then, in the same run and on the same files, repetitions of
//! - `cp -r` of the warehouse followed by `sync` (timed together, after an
//!   untimed `sync`), and
//! - `stagefs bootstrap` into an empty state folder (after an untimed
//!   `sync`),
//!
//! interleaved (the order alternates rep by rep), each with its wall
//! time, CPU seconds (user + system of the child and its descendants,
//! from `wait4`), and the 1-minute load before and after. With
//! `--snapshot-reps N` it also times the metadata snapshot phase alone:
//! the library's `bootstrap::snapshot::read` in a child process of this
//! program, with that child's peak resident set.
//!
//! With `--compare BIN2` every rep also bootstraps with a second stagefs
//! binary (a build before a change, say) into its own fresh state folder,
//! first in even reps and last in odd ones, and prints its figures as
//! `other_seconds` / `other_cpu_seconds` on the rep's line.
//!
//! Prints one `key=value` line per figure (`rep=… cp_seconds=…`), then a
//! `summary` line with medians. Each copy is removed right after it is
//! timed, so at most the warehouse plus one copy are on disk. Driven by
//! scripts/bench/bootstrap.sh; figures in docs/BENCHMARKS.md
//! ("Bootstrap").
//!
//!     bench_bootstrap STAGEFS_BIN [--db postgres|mariadb] [--databases N]
//!         [--tables N] [--partitions N] [--bytes B] [--dir DIR] [--reps N]
//!         [--snapshot-reps N] [--wrap "PROFILER ARGS"] [--compare BIN2]

#[path = "bench_common/mod.rs"]
#[allow(dead_code)] // uses only the argument helper
mod bench_common;
#[path = "../tests/common/dbserver.rs"]
mod dbserver;
#[path = "../tests/common/hms_warehouse.rs"]
mod hms_warehouse;
#[path = "../tests/common/metastore_rows.rs"]
mod metastore_rows;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Instant;

use bench_common::arg;
use dbserver::{DbServer, Kind, TableCase, PASSWORD};
use hms_warehouse::{HmsWarehouse, Shape};

fn opt(args: &[String], name: &str, default: &str) -> String {
    arg(args, name).unwrap_or(default).to_string()
}

fn num(args: &[String], name: &str, default: &str) -> usize {
    let text = opt(args, name, default);
    text.parse().unwrap_or_else(|_| {
        eprintln!("{name} {text}: expected a number");
        std::process::exit(2)
    })
}

/// What one child run cost.
struct Run {
    seconds: f64,
    cpu_seconds: f64,
    peak_rss_kib: u64,
}

/// Runs `cmd` to its end, reaping it with `wait4` for its CPU time and
/// peak resident set (of the child itself; CPU includes the descendants
/// it waited for). stderr goes to `log`; a failure panics with the log.
fn measured(mut cmd: Command, log: &Path) -> Run {
    let started = Instant::now();
    // Reaped by the wait4 below (for its rusage), not by Child::wait.
    #[allow(clippy::zombie_processes)]
    let child = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .unwrap_or_else(|e| panic!("starting {:?}: {e}", cmd.get_program()));
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: plain syscall on our own child; `usage` is written by it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let got = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(got, pid, "wait4: {}", std::io::Error::last_os_error());
    let seconds = started.elapsed().as_secs_f64();
    let st = ExitStatus::from_raw(status);
    if !st.success() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        panic!("{:?} failed ({st}):\n{text}", cmd.get_program());
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Run {
        seconds,
        cpu_seconds: tv(usage.ru_utime) + tv(usage.ru_stime),
        peak_rss_kib: usage.ru_maxrss as u64,
    }
}

fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn sync() {
    let st = Command::new("sync").status().expect("sync");
    assert!(st.success(), "sync failed");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// `cp -r` of `wh` to `copy`, then `sync`: one timed run (a shell runs
/// both, so CPU and wall cover the pair). The copy is removed afterwards
/// when `remove` says so (see [`KEEP_BELOW_BYTES`]).
fn cp_sync(wh: &Path, copy: &Path, log: &Path, remove: bool) -> Run {
    sync();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"cp -r -- "$1" "$2" && sync"#)
        .arg("sh")
        .arg(wh)
        .arg(copy);
    let run = measured(cmd, log);
    if remove {
        std::fs::remove_dir_all(copy).expect("removing the cp copy");
    }
    run
}

/// Data sets smaller than this keep every rep's copy and state folder
/// until the end. ext4's inode allocator skips inodes freed in the last
/// 30 s (`recently_deleted`, `dirty_expire_centisecs`), reading their
/// inode-table blocks to find that out: creating 15,000 files right after
/// deleting 15,000 cost 3–15× more system time (`perf`: 22 %
/// `find_get_block_common`, 16 % `recently_deleted`), growing with every
/// rep, for `cp` and the bootstrap alike. No real copy runs right after
/// deleting the last one, so neither side should pay for that here. A
/// large-file set has few inodes and is removed at once (disk space).
const KEEP_BELOW_BYTES: u64 = 2 << 30;

/// `stagefs bootstrap` of the warehouse into `state` (empty); removed
/// afterwards when `remove` says so. Returns the run and the report the
/// bootstrap wrote.
fn bootstrap(
    bin: &str,
    wrap: &[String],
    server: &DbServer,
    wh: &HmsWarehouse,
    state: &Path,
    log: &Path,
    remove: bool,
) -> (Run, String) {
    sync();
    let mut cmd = match wrap.split_first() {
        Some((tool, tool_args)) => {
            let mut c = Command::new(tool);
            c.args(tool_args).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.arg("bootstrap")
        .arg("--state")
        .arg(state)
        .arg("--hive-metastore")
        .arg(server.url("hive"))
        .env("STAGEFS_METASTORE_PASSWORD", PASSWORD);
    for m in wh.source_map() {
        cmd.arg("--source-map").arg(m);
    }
    let run = measured(cmd, log);
    let report = std::fs::read_to_string(state.join("bootstrap/report.json"))
        .unwrap_or_else(|e| panic!("bootstrap/report.json: {e}"));
    if remove {
        std::fs::remove_dir_all(state).expect("removing the state folder");
    }
    (run, report.trim().to_owned())
}

/// The child side of `--snapshot-reps`: one metadata snapshot, as the
/// bootstrap's first phase reads it.
fn snapshot_child(url: &str) {
    let started = Instant::now();
    match stagefs::bootstrap::snapshot::read(url, "hive") {
        Ok(snap) => eprintln!(
            "snapshot_partitions={} snapshot_tables={} inner_seconds={:.3}",
            snap.partition_count(),
            snap.tables.len(),
            started.elapsed().as_secs_f64()
        ),
        Err(e) => {
            eprintln!("snapshot failed: {e:?}");
            std::process::exit(1);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--snapshot-child") {
        let url = args.get(1).expect("--snapshot-child URL");
        snapshot_child(url);
        return;
    }
    let Some(bin) = args.first().cloned() else {
        eprintln!("usage: bench_bootstrap STAGEFS_BIN [--db postgres|mariadb] [--databases N] [--tables N] [--partitions N] [--bytes B] [--dir DIR] [--reps N] [--snapshot-reps N]");
        std::process::exit(2);
    };
    let kind = match opt(&args, "--db", "postgres").as_str() {
        "postgres" => Kind::Postgres,
        "mariadb" => Kind::MariaDb,
        other => {
            eprintln!("--db {other}: postgres or mariadb");
            std::process::exit(2)
        }
    };
    let shape = Shape {
        databases: num(&args, "--databases", "10"),
        tables_per_db: num(&args, "--tables", "100"),
        partitions_per_table: num(&args, "--partitions", "10"),
        unpartitioned_every: 0,
        file_bytes: num(&args, "--bytes", "4096"),
        seed: 7,
    };
    let reps = num(&args, "--reps", "3");
    let snapshot_reps = num(&args, "--snapshot-reps", "0");
    // A profiler to run the bootstrap under (`--wrap "strace -c -f -o F"`).
    let wrap: Vec<String> = opt(&args, "--wrap", "")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let other = arg(&args, "--compare").map(str::to_owned);
    let base = opt(&args, "--dir", "/tmp");
    std::fs::create_dir_all(&base).expect("--dir");
    let dir = tempfile::tempdir_in(&base).expect("temp dir");
    let root = dir.path();

    let server = DbServer::start(kind);
    server.create_metastore("hive", TableCase::Upper);
    let started = Instant::now();
    let wh = HmsWarehouse::create(&server, "hive", &root.join("hive"), &shape);
    let files = wh.file_count();
    let bytes = files as u64 * shape.file_bytes as u64;
    println!(
        "db={kind:?} tables={} partitions={} files={files} bytes={bytes} build_seconds={:.1}",
        wh.table_names().len(),
        wh.partition_count(),
        started.elapsed().as_secs_f64()
    );
    sync();

    let url = server.url("hive");
    let me = std::env::current_exe().expect("current_exe");
    for rep in 1..=snapshot_reps {
        let load = load1();
        let mut cmd = Command::new(&me);
        cmd.arg("--snapshot-child")
            .arg(&url)
            .env("STAGEFS_METASTORE_PASSWORD", PASSWORD);
        let log = root.join("snapshot.log");
        let run = measured(cmd, &log);
        let inner = std::fs::read_to_string(&log).unwrap_or_default();
        println!(
            "snapshot_rep={rep} snapshot_seconds={:.3} snapshot_cpu_seconds={:.2} snapshot_peak_rss_kib={} load1={load:.2} {}",
            run.seconds,
            run.cpu_seconds,
            run.peak_rss_kib,
            inner.trim()
        );
    }

    let (mut cps, mut boots, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cp_cpu, mut boot_cpu, mut rss) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 1..=reps {
        let load_before = load1();
        let cp_log = root.join("cp.log");
        let boot_log = root.join("bootstrap.log");
        let copy = root.join(format!("cp-copy-{rep}"));
        let state = root.join(format!("state-{rep}"));
        let remove = bytes >= KEEP_BELOW_BYTES;
        let run_other = || {
            other.as_ref().map(|other_bin| {
                let state = root.join(format!("state-other-{rep}"));
                let log = root.join("bootstrap-other.log");
                bootstrap(other_bin, &wrap, &server, &wh, &state, &log, remove).0
            })
        };
        let mut compared = if rep % 2 == 0 { run_other() } else { None };
        // Alternate the order so neither always runs first in the minute.
        let (cp, (boot, report)) = if rep % 2 == 1 {
            let cp = cp_sync(&root.join("hive/wh"), &copy, &cp_log, remove);
            let b = bootstrap(&bin, &wrap, &server, &wh, &state, &boot_log, remove);
            (cp, b)
        } else {
            let b = bootstrap(&bin, &wrap, &server, &wh, &state, &boot_log, remove);
            (cp_sync(&root.join("hive/wh"), &copy, &cp_log, remove), b)
        };
        if rep % 2 == 1 {
            compared = run_other();
        }
        let compared = match compared {
            Some(o) => format!(
                " other_seconds={:.2} other_cpu_seconds={:.2}",
                o.seconds, o.cpu_seconds
            ),
            None => String::new(),
        };
        let load_after = load1();
        let ratio = cp.seconds / boot.seconds;
        println!(
            "rep={rep} cp_sync_seconds={:.2} cp_cpu_seconds={:.2} bootstrap_seconds={:.2} bootstrap_cpu_seconds={:.2} bootstrap_peak_rss_kib={} bootstrap_vs_cp={ratio:.2} load1_before={load_before:.2} load1_after={load_after:.2}{compared}",
            cp.seconds, cp.cpu_seconds, boot.seconds, boot.cpu_seconds, boot.peak_rss_kib
        );
        if rep == 1 {
            println!("report={report}");
        }
        cps.push(cp.seconds);
        boots.push(boot.seconds);
        ratios.push(ratio);
        cp_cpu.push(cp.cpu_seconds);
        boot_cpu.push(boot.cpu_seconds);
        rss.push(boot.peak_rss_kib as f64);
    }
    if reps > 0 {
        println!(
            "summary files={files} bytes={bytes} reps={reps} cp_sync_median={:.2} bootstrap_median={:.2} ratio_median={:.2} cp_cpu_median={:.2} bootstrap_cpu_median={:.2} bootstrap_peak_rss_kib_max={}",
            median(cps),
            median(boots),
            median(ratios),
            median(cp_cpu),
            median(boot_cpu),
            rss.iter().cloned().fold(0.0, f64::max)
        );
    }
    for rep in 1..=reps {
        let names = [
            format!("cp-copy-{rep}"),
            format!("state-{rep}"),
            format!("state-other-{rep}"),
        ];
        for kept in names {
            match std::fs::remove_dir_all(root.join(&kept)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => panic!("removing {kept}: {e}"),
            }
        }
    }
    drop(server);
}
