//! Helper for `scripts/bench/readers.sh`: what per-process views
//! (`stagefs::view::readers`, docs/SEMANTICS.md "Readers") cost, and
//! whether readers stay consistent with several processes at once.
//!
//!     bench_readers attribution [--iters N]
//!     bench_readers memory [--views N]
//!     bench_readers mixed STAGEFS_BIN WORK [--seconds S] [--procs N]
//!
//! `attribution` times, in this process, the steps a request that resolves
//! a root- or database-level name goes through: naming the calling thread's
//! process (cached; a miss reads `/proc`), the view lookup, and the run
//! delay read made only when a move is considered.
//!
//! `memory` creates N views (fake processes) and reports the resident
//! memory they add, per view.
//!
//! `mixed` runs a replicating `stagefs mount` (the consistency checker's
//! workload: inserts, overwrites, drops, renames, one event every 4 ms)
//! with the consistency checker's 8 reader threads in this process and N
//! reader processes (Python: list every table's files, then open and read
//! each, as analysts' tools do) at the same time. The daemon inherits this
//! process's environment: run it once as is and once with
//! `STAGEFS_VIEWS=off` to compare.
//!
//! Prints `ROW|name|value|unit` lines (the figures) on stdout and progress
//! on stderr.

#[path = "bench_common/mod.rs"]
#[allow(dead_code)] // uses only the argument helper
mod bench_common;

use bench_common::arg;
use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stagefs::catalog::{Snapshot, Tree};
use stagefs::event::StateId;
use stagefs::testkit::checker::{
    mount_flags, run_readers, CheckConfig, DaemonProcess, Oracle, Target,
};
use stagefs::view::readers::{proc_busy, proc_of_pid, ProcId, Reader, Readers, ViewRule};
use stagefs::workload::{Workload, WorkloadConfig};

fn usage() -> ! {
    eprintln!(
        "usage: bench_readers attribution [--iters N] | memory [--views N] | mixed STAGEFS_BIN WORK [--seconds S] [--procs N]"
    );
    std::process::exit(2)
}

fn opt(args: &[String], name: &str, default: u64) -> u64 {
    arg(args, name)
        .map(|v| v.parse().unwrap_or_else(|_| usage()))
        .unwrap_or(default)
}

fn row(name: &str, value: f64, unit: &str) {
    println!("ROW|{name}|{value:.3}|{unit}");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("attribution") => attribution(opt(&args, "--iters", 1_000_000)),
        Some("memory") => memory(opt(&args, "--views", 100_000) as usize),
        Some("mixed") if args.len() >= 3 => mixed(
            Path::new(&args[1]),
            Path::new(&args[2]),
            Duration::from_secs(opt(&args, "--seconds", 20)),
            opt(&args, "--procs", 8) as usize,
        ),
        _ => usage(),
    }
}

fn snap_at(id: u64) -> Snapshot {
    let tree = Arc::new(Tree {
        state_id: StateId(id),
        ..Tree::empty()
    });
    Snapshot {
        visible: Arc::clone(&tree),
        versions: [(StateId(id), tree)].into_iter().collect(),
        pins: Default::default(),
    }
}

fn ns_per(iters: u64, f: impl FnMut()) -> f64 {
    let mut f = f;
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed().as_nanos() as f64 / iters as f64
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

fn attribution(iters: u64) {
    let readers = Readers::new(ViewRule::default(), true);
    let tid = gettid();
    let snap = snap_at(1);
    // Warm: the thread's process is cached, the view exists.
    let reader = readers.identify(tid);
    assert!(matches!(reader, Reader::Process(_)), "own thread unnamed");
    readers.tree_for(reader, &snap);
    row(
        "identify, cached (thread -> process)",
        ns_per(iters, || {
            std::hint::black_box(readers.identify(tid));
        }),
        "ns",
    );
    row(
        "tree_for, view kept",
        ns_per(iters, || {
            std::hint::black_box(readers.tree_for(reader, &snap));
        }),
        "ns",
    );
    let misses = (iters / 100).max(100);
    row(
        "identify, miss (reads /proc/<tid>/stat, status)",
        ns_per(misses, || {
            let fresh = Readers::new(ViewRule::default(), true);
            std::hint::black_box(fresh.identify(tid));
        }),
        "ns",
    );
    let me = proc_of_pid(std::process::id()).expect("this process");
    row(
        "busy sample read: process, parent, daemon (only when a move is considered)",
        ns_per(misses, || {
            std::hint::black_box(proc_busy(me));
        }),
        "ns",
    );
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

fn memory(n: usize) {
    let readers = Readers::new(ViewRule::default(), true);
    let snap = snap_at(1);
    let before = rss_bytes();
    // Pids above the kernel's maximum: no such process, so the run delay
    // read at a view's creation fails fast, as for an exited process.
    for i in 0..n {
        let proc = ProcId {
            pid: 5_000_000 + i as u32,
            start: 1,
        };
        readers.tree_for(Reader::Process(proc), &snap);
    }
    let after = rss_bytes();
    assert_eq!(readers.summary().views, n);
    row("views", n as f64, "views");
    row(
        "resident memory per view",
        after.saturating_sub(before) as f64 / n as f64,
        "bytes",
    );
}

fn workload_config() -> WorkloadConfig {
    WorkloadConfig::for_readers(21)
}

/// A reader process: for `secs`, lists every table's files (`glob`), then
/// opens and reads each; prints "walks files errors" and the first error.
const LIST_THEN_OPEN: &str = r#"
import glob, sys, time
mnt, secs = sys.argv[1], float(sys.argv[2])
walks = files = errors = 0
first = ""
end = time.monotonic() + secs
while time.monotonic() < end:
    for table in sorted(glob.glob(mnt + "/*/*")):
        walks += 1
        for f in glob.glob(table + "/*/*"):
            try:
                with open(f, "rb") as h:
                    h.read()
                files += 1
            except OSError as e:
                errors += 1
                first = first or f"{f}: {e}"
    time.sleep(0.01)
print(walks, files, errors, first)
"#;

fn vm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn mixed(bin: &Path, work: &Path, secs: Duration, procs: usize) {
    let views = std::env::var("STAGEFS_VIEWS").map_or(true, |v| v != "off" && v != "0");
    let dir = work.join(if views { "views-on" } else { "views-off" });
    let _ = std::fs::remove_dir_all(&dir);
    let src = dir.join("src");
    let oracle = Oracle::new();
    let mut w = Workload::new(&src, workload_config()).expect("workload");
    for _ in 0..60 {
        w.step().expect("workload step");
    }
    oracle.record(&w);
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).expect("mountpoint");
    let flags = mount_flags(
        &dir.join("state"),
        &w.source_root(),
        &w.events_dir(),
        &w.cm_root(),
        Some(4),
    );
    let flags: Vec<&OsStr> = flags.iter().map(|f| f.as_os_str()).collect();
    let mut daemon = DaemonProcess::start(
        bin,
        &mnt,
        &flags,
        &dir.join("daemon.log"),
        Duration::from_secs(30),
    )
    .expect("daemon mounts");
    let daemon_pid = daemon.pid().expect("daemon pid");
    let rss_start = vm_rss_kib(daemon_pid);

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, oracle) = (Arc::clone(&stop), Arc::clone(&oracle));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                w.step().expect("workload step");
                oracle.record(&w);
                std::thread::sleep(Duration::from_millis(4));
            }
            w.latest()
        })
    };
    let children: Vec<_> = (0..procs)
        .map(|_| {
            Command::new("python3")
                .args(["-c", LIST_THEN_OPEN])
                .arg(&mnt)
                .arg(secs.as_secs_f64().to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("python3")
        })
        .collect();
    let rss_peak = {
        let mnt = mnt.clone();
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let (mut peak, mut views) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(vm_rss_kib(daemon_pid));
                let status = std::fs::read_to_string(mnt.join(".stagefs/status"));
                let v: serde_json::Value = status
                    .ok()
                    .and_then(|s| serde_json::from_str(&s).ok())
                    .unwrap_or_default();
                views = views.max(v["readers"]["views"].as_u64().unwrap_or(0));
                std::thread::sleep(Duration::from_millis(200));
            }
            (peak, views)
        })
    };
    let cfg = CheckConfig {
        readers: 8,
        target_observations: u64::MAX,
        min_duration: secs,
        max_duration: secs,
        min_distinct_ids: 0,
        seed: 5,
    };
    let never = AtomicBool::new(false);
    let report = run_readers(
        &Target::Stagefs { mount: mnt.clone() },
        &oracle,
        &cfg,
        &never,
    );
    let (mut walks, mut files, mut errors, mut first) = (0u64, 0u64, 0u64, String::new());
    for c in children {
        let out = c.wait_with_output().expect("reader process");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut parts = text.trim().splitn(4, ' ');
        let mut next = || parts.next().and_then(|v| v.parse::<u64>().ok());
        match (next(), next(), next()) {
            (Some(w), Some(f), Some(e)) => {
                walks += w;
                files += f;
                errors += e;
            }
            _ => {
                errors += 1;
                first = format!("reader failed: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        if first.is_empty() {
            first = text.trim().splitn(4, ' ').nth(3).unwrap_or("").to_owned();
        }
    }
    let status: serde_json::Value = std::fs::read_to_string(mnt.join(".stagefs/status"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    stop.store(true, Ordering::Relaxed);
    let latest = writer.join().expect("writer");
    let (peak, max_views) = rss_peak.join().expect("rss sampler");
    eprintln!("checker: {}", report.summary());
    eprintln!("readers: {}", status["readers"]);
    if !first.is_empty() {
        eprintln!("first reader error: {first}");
    }
    let label = if views { "views on" } else { "views off" };
    let secs_f = report.elapsed.as_secs_f64();
    row(
        &format!("{label}: checker anomalies"),
        report.anomalies as f64,
        "",
    );
    row(
        &format!("{label}: checker observations/s"),
        report.observations as f64 / secs_f,
        "1/s",
    );
    row(
        &format!("{label}: source events written"),
        latest.0 as f64,
        "",
    );
    row(&format!("{label}: reader processes"), procs as f64, "");
    row(
        &format!("{label}: process table walks/s"),
        walks as f64 / secs_f,
        "1/s",
    );
    row(
        &format!("{label}: process files read/s"),
        files as f64 / secs_f,
        "1/s",
    );
    row(
        &format!("{label}: process errors (listed, then gone at open)"),
        errors as f64,
        "",
    );
    row(
        &format!("{label}: most views at once"),
        max_views as f64,
        "",
    );
    let r = &status["readers"];
    for key in ["view_moves", "starved_keeps", "dentry_invalidations"] {
        row(
            &format!("{label}: {key}"),
            r[key].as_u64().unwrap_or(0) as f64,
            "",
        );
    }
    row(
        &format!("{label}: daemon RSS start"),
        rss_start as f64 / 1024.0,
        "MiB",
    );
    row(
        &format!("{label}: daemon RSS peak"),
        peak as f64 / 1024.0,
        "MiB",
    );
    let _ = daemon.terminate(Duration::from_secs(10));
}
