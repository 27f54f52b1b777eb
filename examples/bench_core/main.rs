//! Core replication benchmarks (docs/BENCHMARKS.md, "Core replication").
//!
//! One subcommand per measurement, each run in its own process so that RSS
//! and allocator state do not leak between them:
//!
//! - `ingest`  metadata-only events ingested, journaled and committed per second
//! - `commit`  time to commit a one-file insert vs catalog size
//! - `memory`  resident bytes per file entry of a catalog tree
//! - `stage`   staging throughput vs `cp -r` (+ `sync`)
//! - `checkpoint`, `restart`, `lag`: checkpoint cost, restart after many
//!   events, commit lag while checkpoints are written and memory per
//!   million files (module [`checkpoints`], docs/BENCHMARKS.md
//!   "Checkpoints and restart")
//! - `hive-ingest`, `hive-stage`  the Hive source's figures (issue 11; see
//!   `hive.rs` beside this file)
//! - `s3-stage`  staging from S3 vs `rclone copy` (issue 29; `s3.rs`)
//! - `s3-lag`  event → visible with the files on S3 vs on the local disk
//!   (issue 29; `s3.rs`)
//! - `s3-serve`, `s3-get`: a private SeaweedFS for scripts/bench/reader.py
//!   and its baseline, GETs through the reader hosts' store (issue 30)
//! - `hdfs-stage`  staging from HDFS vs `rclone copy` and `hdfs dfs -get`
//!   (issue 29; `hdfs.rs`; what it shares with `s3-stage` is in `remote.rs`)
//!
//! Every subcommand prints progress to stderr and, on stdout, lines of the
//! form `ROW|<benchmark>|<figure>|<target>|<met>` (the figure table) and
//! `NOTE|<text>` (details); `scripts/bench/core.sh` collects them. All
//! inputs are generated before any clock starts.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use stagefs::catalog::{Catalog, FileNode, Pending, Pins, Tree};
use stagefs::durable::write_atomic;
use stagefs::event::{BlobId, Change, Event, FileRef, Op, StateId};
use stagefs::replicate::{Replica, ReplicaConfig};
use stagefs::stage::BlobStore;

/// The daemon's allocator (see src/main.rs), so figures match `stagefs`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use stagefs::workload::Rng;

#[path = "../bench_common/mod.rs"]
#[allow(dead_code)] // uses only the percentile
mod bench_common;
mod checkpoints;
mod hdfs;
mod hive;
mod remote;
mod s3;
#[path = "../../tests/servers/mod.rs"]
mod servers;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        usage();
    };
    let opts = Opts::parse(&args[1..]);
    let result = match cmd.as_str() {
        "ingest" => bench_ingest(&opts),
        "commit" => bench_commit(&opts),
        "memory" => bench_memory(&opts),
        "stage" => bench_stage(&opts),
        "checkpoint" => checkpoints::bench_checkpoint(&opts),
        "restart" => checkpoints::bench_restart(&opts),
        "lag" => checkpoints::bench_lag(&opts),
        // Child processes of `checkpoint` and `lag`.
        "load-child" => checkpoints::load_child(&opts),
        "lag-child" => checkpoints::lag_child(&opts),
        "hive-ingest" => hive::bench_ingest(&opts),
        "hive-stage" => hive::bench_stage(&opts),
        "s3-stage" => s3::bench_stage(&opts),
        "s3-lag" => s3::bench_lag(&opts),
        // Helpers of scripts/bench/reader.py (`STORAGE=s3`).
        "s3-serve" => s3::serve(&opts),
        "s3-get" => s3::get_all(&opts),
        "hdfs-stage" => hdfs::bench_stage(&opts),
        _ => usage(),
    };
    if let Err(e) = result {
        eprintln!("bench_core {cmd}: {e}");
        std::process::exit(1);
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: bench_core (ingest|commit|memory|stage|checkpoint|restart|lag|hive-ingest|hive-stage|s3-stage|s3-lag|hdfs-stage) \
         [--work DIR] [--events N] [--inserts N] [--shape PxF] [--files N] [--mib N] [--threads N] \
         [--reps N] [--seconds N] [--rate N] [--every N] [--bytes N] [--small N] [--small-bytes N] \
         [--large N] [--large-mib N] [--decode-threads N] [--poll-ms N]"
    );
    std::process::exit(2)
}

/// `--key value` options; every benchmark reads the ones it knows.
struct Opts(BTreeMap<String, String>);

impl Opts {
    fn parse(args: &[String]) -> Opts {
        let mut m = BTreeMap::new();
        let mut it = args.iter();
        while let Some(k) = it.next() {
            let Some(k) = k.strip_prefix("--") else {
                usage()
            };
            let Some(v) = it.next() else { usage() };
            m.insert(k.to_owned(), v.clone());
        }
        Opts(m)
    }

    fn num(&self, key: &str, default: u64) -> u64 {
        self.0
            .get(key)
            .map(|v| v.replace('_', "").parse().unwrap_or_else(|_| usage()))
            .unwrap_or(default)
    }

    fn str(&self, key: &str, default: &str) -> String {
        self.0
            .get(key)
            .cloned()
            .unwrap_or_else(|| default.to_owned())
    }

    /// A fresh scratch folder under `--work` (default: $TMPDIR, i.e. the
    /// same disk as everything else).
    fn work(&self, name: &str) -> Res<tempfile::TempDir> {
        let base = PathBuf::from(self.str("work", &std::env::temp_dir().to_string_lossy()));
        fs::create_dir_all(&base)?;
        Ok(tempfile::Builder::new()
            .prefix(&format!("stagefs-bench-{name}-"))
            .tempdir_in(base)?)
    }
}

fn row(bench: &str, figure: &str, target: &str, met: Option<bool>) {
    let met = match met {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "—",
    };
    row_text(bench, figure, target, met);
}

fn row_text(bench: &str, figure: &str, target: &str, met: &str) {
    println!("ROW|{bench}|{figure}|{target}|{met}");
}

fn note(text: &str) {
    println!("NOTE|{text}");
}

/// Thousands separators, for figures people read.
fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn wait_visible(replica: &Replica, last: StateId, limit: Duration) -> Res<Duration> {
    let started = Instant::now();
    loop {
        if replica.catalog().snapshot().visible.state_id >= last {
            return Ok(started.elapsed());
        }
        if let Some(stall) = replica.status().stalled {
            return Err(format!("replication stalled: {stall:?}").into());
        }
        if started.elapsed() > limit {
            return Err(format!("visible did not reach {last} within {limit:?}").into());
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// Waits until `replica` shows `last`, stops it, and fails if any file
/// was staged without a proof (the staging benchmarks' clock stop).
fn staged_verified(replica: Replica, last: StateId) -> Res<()> {
    wait_visible(&replica, last, Duration::from_secs(900))?;
    let status = replica.status();
    replica.stop();
    if status.unverified_files != 0 {
        return Err(format!("{} files unverified", status.unverified_files).into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// 1. ingest: metadata-only events per second

/// A table slot of the generated log: exists or not, and its partitions.
struct Slot {
    db: String,
    table: String,
    exists: bool,
    parts: Vec<u64>,
    next_part: u64,
}

/// Writes a valid metadata-only log of `n` events after a small setup
/// (databases, tables), in files of 100,000 lines. Returns the last id.
fn write_metadata_log(dir: &Path, n: u64, seed: u64) -> Res<u64> {
    const DBS: usize = 4;
    const TABLES: usize = 8;
    const LINES_PER_FILE: u64 = 100_000;
    let mut rng = Rng::new(seed);
    let mut id = 0u64;
    let mut lines_in_file = 0u64;
    let mut file_no = 0u64;
    let open = |no: u64| -> io::Result<BufWriter<File>> {
        Ok(BufWriter::with_capacity(
            1 << 20,
            File::create(dir.join(format!("log-{no:06}.jsonl")))?,
        ))
    };
    let mut out = open(file_no)?;
    let base_ms: i64 = 1_700_000_000_000;
    let emit = |out: &mut BufWriter<File>, id: &mut u64, body: String| -> io::Result<()> {
        *id += 1;
        writeln!(
            out,
            "{{\"id\":{},\"time_ms\":{},{body}}}",
            *id,
            base_ms + *id as i64
        )
    };
    let mut slots = Vec::new();
    for d in 0..DBS {
        emit(
            &mut out,
            &mut id,
            format!("\"op\":\"create_database\",\"db\":\"db{d}\""),
        )?;
        for t in 0..TABLES {
            slots.push(Slot {
                db: format!("db{d}"),
                table: format!("t{t}"),
                exists: false,
                parts: Vec::new(),
                next_part: 0,
            });
        }
    }
    let create = |s: &Slot| {
        format!(
            "\"op\":\"create_table\",\"db\":\"{}\",\"table\":\"{}\",\"partition_keys\":[\"p\"]",
            s.db, s.table
        )
    };
    for s in &mut slots {
        emit(&mut out, &mut id, create(s))?;
        s.exists = true;
    }
    let setup = id;
    while id - setup < n {
        if lines_in_file >= LINES_PER_FILE {
            out.flush()?;
            file_no += 1;
            out = open(file_no)?;
            lines_in_file = 0;
        }
        lines_in_file += 1;
        let r = rng.below(100);
        let s = &mut slots[rng.below(DBS * TABLES)];
        let body = if r < 90 && !s.exists {
            // Keep most tables alive: a missing table is re-created.
            s.exists = true;
            create(s)
        } else if r < 40 {
            let v = s.next_part;
            s.next_part += 1;
            s.parts.push(v);
            format!(
                "\"op\":\"add_partition\",\"db\":\"{}\",\"table\":\"{}\",\"partition\":{{\"p\":\"v{v}\"}}",
                s.db, s.table
            )
        } else if r < 65 && !s.parts.is_empty() {
            let i = rng.below(s.parts.len());
            let v = s.parts.swap_remove(i);
            format!(
                "\"op\":\"drop_partition\",\"db\":\"{}\",\"table\":\"{}\",\"partition\":{{\"p\":\"v{v}\"}}",
                s.db, s.table
            )
        } else if r < 98 || !s.exists {
            "\"op\":\"noop\"".to_owned()
        } else {
            s.exists = false;
            s.parts.clear();
            format!(
                "\"op\":\"drop_table\",\"db\":\"{}\",\"table\":\"{}\"",
                s.db, s.table
            )
        };
        emit(&mut out, &mut id, body)?;
    }
    out.flush()?;
    Ok(id)
}

fn bench_ingest(o: &Opts) -> Res<()> {
    let n = o.num("events", 1_000_000);
    let work = o.work("ingest")?;
    let events = work.path().join("events");
    let source = work.path().join("source");
    fs::create_dir_all(&events)?;
    fs::create_dir_all(&source)?;
    let t = Instant::now();
    let last = write_metadata_log(&events, n, o.num("seed", 7))?;
    let bytes: u64 = fs::read_dir(&events)?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    eprintln!(
        "ingest: wrote {last} events ({} MiB) in {:.1?}",
        bytes >> 20,
        t.elapsed()
    );
    // Page cache warm, writes settled: the clock sees stagefs only.
    Command::new("sync").status()?;

    let cfg = ReplicaConfig::new(&work.path().join("state"), &source, &events);
    let started = Instant::now();
    let replica = Replica::start(cfg)?;
    wait_visible(&replica, StateId(last), Duration::from_secs(240))?;
    let elapsed = started.elapsed();
    let status = replica.status();
    replica.stop();
    let rate = last as f64 / elapsed.as_secs_f64();
    eprintln!("ingest: {last} events visible after {elapsed:.2?}: {rate:.0} events/s");
    row(
        "1. Metadata-only events ingested + journaled + committed",
        &format!(
            "{} events/s ({} events in {:.2} s)",
            grouped(rate as u64),
            grouped(last),
            elapsed.as_secs_f64()
        ),
        "≥ 100,000/s",
        Some(rate >= 100_000.0),
    );
    row(
        "1. ↳ journal counters",
        &format!(
            "records {}, ring_reads {}, file_reads {}; commits {}",
            grouped(status.journal.records),
            grouped(status.journal.ring_reads),
            grouped(status.journal.file_reads),
            grouped(status.commits)
        ),
        "—",
        None,
    );
    note(&format!(
        "ingest: log of {} events ({} MiB JSONL, {} setup events then add_partition/drop_partition/noop/create_table/drop_table mix); \
         clock from Replica::start until visible == {last}",
        grouped(last),
        bytes >> 20,
        last - n
    ));
    Ok(())
}

// ---------------------------------------------------------------------------
// Catalog trees built directly through Tree::apply.

fn blob_for(n: u64) -> BlobId {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b[8] = 0x5a;
    BlobId(b)
}

/// The file `000123_0` of partition `p=v<part>` of db.t.
fn file_ref(part: u64, file: u64, blob: u64) -> FileRef {
    let name = format!("{file:06}_0");
    FileRef::native(
        &format!("db/table/p=v{part}/{name}"),
        &name,
        1,
        blob_for(blob),
    )
}

fn event(id: u64, op: Op) -> Event {
    Event {
        id: StateId(id),
        time_ms: Some(1_700_000_000_000 + id as i64),
        changes: vec![Change::new(op, "db", "t")],
    }
}

fn add_files(id: u64, part: u64, files: Vec<FileRef>) -> Event {
    let mut e = event(id, Op::AddFiles);
    e.changes[0].partition = Some(BTreeMap::from([("p".to_owned(), format!("v{part}"))]));
    e.changes[0].files = files;
    e
}

/// A catalog with one table `db.t` holding `parts` partitions of
/// `files_per_part` files each, built in events of at most 1000 files, so
/// each event's inputs are freed before the next.
fn build_tree(parts: u64, files_per_part: u64) -> Tree {
    let mut tree = Tree::empty();
    let mut id = 0;
    let step = |tree: &mut Tree, e: Event| {
        let (next, _added) = tree.apply(&e).expect("generated events apply");
        *tree = next;
    };
    id += 1;
    step(&mut tree, event(id, Op::CreateDatabase));
    id += 1;
    let mut ct = event(id, Op::CreateTable);
    ct.changes[0].partition_keys = vec!["p".into()];
    step(&mut tree, ct);
    let mut blob = 0;
    for p in 0..parts {
        let mut f = 0;
        while f < files_per_part {
            let batch = (files_per_part - f).min(1000);
            let files = (f..f + batch)
                .map(|i| {
                    blob += 1;
                    file_ref(p, i, blob)
                })
                .collect();
            id += 1;
            step(&mut tree, add_files(id, p, files));
            f += batch;
        }
    }
    tree
}

fn parse_shape(s: &str) -> (u64, u64) {
    let (p, f) = s.split_once('x').unwrap_or_else(|| usage());
    let num = |t: &str| {
        t.replace('_', "")
            .parse::<u64>()
            .unwrap_or_else(|_| usage())
    };
    (num(p), num(f))
}

// ---------------------------------------------------------------------------
// 2. commit time vs catalog size

struct Timings(Vec<Duration>);

impl Timings {
    fn pct(&self, p: f64) -> Duration {
        let mut v = self.0.clone();
        v.sort_unstable();
        let i = ((v.len() as f64 - 1.0) * p).round() as usize;
        v[i]
    }

    fn fmt(&self) -> String {
        format!("{} / {}", us(self.pct(0.5)), us(self.pct(0.99)))
    }
}

fn us(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 10.0 {
        format!("{us:.1} µs")
    } else {
        format!("{us:.0} µs")
    }
}

struct CommitRun {
    /// Pending::apply + newest_complete + Pending::committed
    pending: Timings,
    /// Catalog::commit (publish + commit record)
    commit: Timings,
    /// Both
    total: Timings,
}

/// Times `inserts` one-file inserts on top of `tree`, committing each, with
/// the state folder in `state_dir`.
fn time_commits(
    tree: &Tree,
    (parts, files_per_part): (u64, u64),
    state_dir: &Path,
    inserts: u64,
    seed: u64,
) -> Res<CommitRun> {
    let tree = Arc::new(tree.clone());
    let catalog = Catalog::new(
        state_dir,
        Arc::clone(&tree),
        BTreeMap::new(),
        Pins::default(),
        16,
    );
    let mut pending = Pending::new(Arc::clone(&tree));
    let mut rng = Rng::new(seed);
    let (mut tp, mut tc, mut tt) = (Vec::new(), Vec::new(), Vec::new());
    let warmup = 20;
    for i in 0..inserts + warmup {
        let id = tree.state_id.0 + 1 + i;
        let part = rng.below(parts as usize) as u64;
        // A new name at a random place among the partition's files
        // (`000123_0` exists; `000123_0_copy_7` sorts right after it).
        let mut f = file_ref(part, rng.below(files_per_part as usize) as u64, 1 << 40 | i);
        f.name = format!("{}_copy_{i}", f.name);
        f.path = format!("{}_copy_{i}", f.path);
        let e = add_files(id, part, vec![f]);
        let t0 = Instant::now();
        let fetch = pending.apply(&e, |_| true)?;
        let newest = pending.newest_complete().ok_or("state not complete")?;
        let t1 = Instant::now();
        catalog.commit(newest)?;
        let t2 = Instant::now();
        pending.committed(StateId(id));
        let t3 = Instant::now();
        assert!(fetch.is_empty());
        if i >= warmup {
            tp.push((t1 - t0) + (t3 - t2));
            tc.push(t2 - t1);
            tt.push(t3 - t0);
        }
    }
    assert_eq!(
        catalog.snapshot().visible.state_id.0,
        tree.state_id.0 + inserts + warmup
    );
    Ok(CommitRun {
        pending: Timings(tp),
        commit: Timings(tc),
        total: Timings(tt),
    })
}

fn bench_commit(o: &Opts) -> Res<()> {
    let inserts = o.num("inserts", 300);
    let shm = PathBuf::from(o.str("tmpfs", "/dev/shm"));
    let shapes = [(1u64, 10u64), (1000, 1000), (1, 1_000_000)];
    let mut results = Vec::new();
    for (parts, files) in shapes {
        let t = Instant::now();
        let tree = build_tree(parts, files);
        eprintln!("commit: built {parts}x{files} in {:.1?}", t.elapsed());
        let mem_dir = tempfile::Builder::new()
            .prefix("stagefs-bench-commit-")
            .tempdir_in(&shm)?;
        let disk_dir = o.work("commit")?;
        let mem = time_commits(&tree, (parts, files), mem_dir.path(), inserts, 11)?;
        let disk = time_commits(&tree, (parts, files), disk_dir.path(), inserts, 11)?;
        eprintln!(
            "commit {parts}x{files}: in-memory total {} | durable total {}",
            mem.total.fmt(),
            disk.total.fmt()
        );
        results.push(((parts, files), mem, disk));
    }
    // The commit record write alone, on the disk and on tmpfs, and the floor
    // of one durable write: an in-place overwrite + fdatasync.
    let bytes = br#"{ "visible": 123456, "retained": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16] }"#;
    let time_writes = |dir: &Path| -> Res<Timings> {
        let record = dir.join("commit.json");
        let mut w = Vec::new();
        for _ in 0..inserts {
            let t = Instant::now();
            write_atomic(&record, bytes)?;
            w.push(t.elapsed());
        }
        Ok(Timings(w))
    };
    let disk_dir = o.work("fsync")?;
    let write = time_writes(disk_dir.path())?;
    let shm_dir = tempfile::Builder::new()
        .prefix("stagefs-bench-fsync-")
        .tempdir_in(&shm)?;
    let write_shm = time_writes(shm_dir.path())?;
    let floor = {
        use std::os::unix::fs::FileExt;
        let f = File::options()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(disk_dir.path().join("overwrite"))?;
        f.write_all_at(&[0u8; 4096], 0)?;
        f.sync_all()?;
        let mut w = Vec::new();
        for _ in 0..inserts {
            let t = Instant::now();
            f.write_all_at(bytes, 0)?;
            f.sync_data()?;
            w.push(t.elapsed());
        }
        Timings(w)
    };

    let label = |(p, f): (u64, u64)| {
        if p == 1 {
            format!("1 partition × {} files", grouped(f))
        } else {
            format!("{} partitions × {} files", grouped(p), grouped(f))
        }
    };
    let small = &results[0];
    for r in &results {
        let ((p, f), mem, disk) = r;
        let within =
            |a: &Timings, b: &Timings| a.pct(0.5).as_secs_f64() <= 2.0 * b.pct(0.5).as_secs_f64();
        let mem_ok =
            mem.total.pct(0.99) < Duration::from_millis(1) && within(&mem.total, &small.1.total);
        let target = if (p, f) == (&1, &10) {
            "< 1 ms".to_owned()
        } else {
            "< 1 ms, ≤ 2× the 10-file median".to_owned()
        };
        row(
            &format!(
                "2a. Commit one-file insert, in memory — {} (median / p99)",
                label((*p, *f))
            ),
            &format!(
                "{} (apply+newest_complete {}, Catalog::commit on tmpfs {})",
                mem.total.fmt(),
                mem.pending.fmt(),
                mem.commit.fmt()
            ),
            &target,
            Some(mem_ok),
        );
        let ms = Duration::from_millis(1);
        let disk_met = match (
            within(&disk.total, &small.2.total),
            disk.total.pct(0.5) < ms,
            disk.total.pct(0.99) < ms,
        ) {
            (true, true, true) => "yes".to_owned(),
            (true, true, false) => "median yes, p99 **no**".to_owned(),
            (within, _, _) => format!("**no**{}", if within { "" } else { " (not within 2×)" }),
        };
        row_text(
            &format!(
                "2b. Commit one-file insert, durable — {} (median / p99)",
                label((*p, *f))
            ),
            &format!(
                "{} (of which Catalog::commit {})",
                disk.total.fmt(),
                disk.commit.fmt()
            ),
            &target,
            &disk_met,
        );
    }
    row(
        "2c. durable::write_atomic of the commit record alone, disk (median / p99)",
        &format!("{} (same on tmpfs: {})", write.fmt(), write_shm.fmt()),
        "— (disk-bound)",
        None,
    );
    row(
        "2d. floor: overwrite 100 B in place + fdatasync, disk (median / p99)",
        &floor.fmt(),
        "— (disk-bound)",
        None,
    );
    note(&format!(
        "commit: {inserts} timed inserts (+20 warm-up) per size, each into a random partition; retain 16; \
         in-memory = state folder on tmpfs ({}), where fsync is a no-op; durable = state folder on the disk",
        shm.display()
    ));
    Ok(())
}

/// The 1-minute load average as /proc/loadavg prints it ("?" unread).
fn load1() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

// ---------------------------------------------------------------------------
// 3. resident memory per file entry

fn rss_bytes() -> u64 {
    let statm = fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    pages * page
}

fn trim() {
    // SAFETY: malloc_trim only returns free heap memory to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn bench_memory(o: &Opts) -> Res<()> {
    let (parts, files) = parse_shape(&o.str("shape", "1000x1000"));
    let n = parts * files;
    let before = rss_bytes();
    let t = Instant::now();
    let tree = build_tree(parts, files);
    let built = t.elapsed();
    let after = rss_bytes();
    trim();
    let after_trim = rss_bytes();
    let mut count = 0u64;
    tree.for_each_file(&mut |_| count += 1);
    assert_eq!(count, n);

    // 15 more versions, each a one-file insert into a random partition,
    // all retained: they share every unchanged node with each other.
    let mut versions = vec![Arc::new(tree)];
    let mut rng = Rng::new(3);
    for i in 0..15u64 {
        let last = versions.last().expect("one version");
        let part = rng.below(parts as usize) as u64;
        let e = add_files(
            last.state_id.0 + 1,
            part,
            vec![file_ref(part, 800_000_000 + i, 1 << 41 | i)],
        );
        let (next, _) = last.apply(&e)?;
        versions.push(Arc::new(next));
    }
    let after16 = rss_bytes();
    trim();
    let after16_trim = rss_bytes();
    let per = |b: u64| (b.saturating_sub(before)) as f64 / n as f64;
    eprintln!(
        "memory {parts}x{files}: built in {built:.1?}; {:.0} B/file (after trim {:.0}); 16 versions {:.0} B/file (after trim {:.0})",
        per(after),
        per(after_trim),
        per(after16),
        per(after16_trim)
    );
    let shape = if parts == 1 {
        format!("1 partition × {}", grouped(files))
    } else {
        format!("{} partitions × {}", grouped(parts), grouped(files))
    };
    row(
        &format!("3. RSS per file entry — {shape} files, 1 version"),
        &format!(
            "{:.0} B (after malloc_trim {:.0} B)",
            per(after),
            per(after_trim)
        ),
        "≤ 300 B",
        Some(per(after) <= 300.0),
    );
    row(
        &format!("3. RSS per file entry — {shape} files, 16 retained versions"),
        &format!(
            "{:.0} B (after malloc_trim {:.0} B)",
            per(after16),
            per(after16_trim)
        ),
        "≤ 300 B",
        Some(per(after16) <= 300.0),
    );
    if o.num("sizes", 0) == 1 {
        note(&format!(
            "memory: size_of FileNode {} B (+16 B Arc header), Node {} B, (Name, Node) map entry {} B; \
             per file also a heap name (`000123_0`) and source path (`db/table/p=v123/000123_0`)",
            std::mem::size_of::<FileNode>(),
            std::mem::size_of::<stagefs::catalog::Node>(),
            std::mem::size_of::<(stagefs::catalog::Name, stagefs::catalog::Node)>(),
        ));
    }
    drop(versions);
    Ok(())
}

// ---------------------------------------------------------------------------
// 4. staging throughput vs cp

struct SourceFile {
    rel: String,
    size: u64,
    sha: BlobId,
}

/// `count` files of `size` pseudo-random bytes under `root/warehouse/...`.
fn write_random_files(root: &Path, count: u64, size: u64) -> Res<Vec<SourceFile>> {
    let mut rng = Rng::new(99);
    let mut buf = vec![0u8; 1 << 20];
    let mut out = Vec::new();
    for i in 0..count {
        let rel = format!("warehouse/bench/t/p={i}/000000_0");
        let path = root.join(&rel);
        fs::create_dir_all(path.parent().ok_or("no parent")?)?;
        let mut f = BufWriter::new(File::create(&path)?);
        let mut h = Sha256::new();
        let mut left = size;
        while left > 0 {
            for w in buf.chunks_exact_mut(8) {
                w.copy_from_slice(&rng.next_u64().to_le_bytes());
            }
            let n = left.min(buf.len() as u64) as usize;
            f.write_all(&buf[..n])?;
            h.update(&buf[..n]);
            left -= n as u64;
        }
        f.flush()?;
        out.push(SourceFile {
            rel,
            size,
            sha: BlobId(h.finalize().into()),
        });
    }
    Ok(out)
}

fn sh(cmd: &str, args: &[&Path]) -> Res<()> {
    let st = Command::new(cmd).args(args).status()?;
    if !st.success() {
        return Err(format!("{cmd} failed: {st}").into());
    }
    Ok(())
}

/// Reads every source file, so both sides start from a warm page cache.
fn warm(root: &Path, files: &[SourceFile]) -> Res<()> {
    for f in files {
        io::copy(&mut File::open(root.join(&f.rel))?, &mut io::sink())?;
    }
    Ok(())
}

/// User + system CPU seconds of this process and its waited-for children.
fn cpu_seconds() -> f64 {
    let get = |who| {
        // SAFETY: getrusage fills the struct it is given.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut ru) };
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    };
    get(libc::RUSAGE_SELF) + get(libc::RUSAGE_CHILDREN)
}

/// CPU time and run-queue wait (ns, from `/proc/self/task/*/schedstat`)
/// per thread name of this process, summed over threads of one name.
fn thread_times() -> BTreeMap<String, (u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let Ok(tasks) = fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in tasks.flatten() {
        let dir = task.path();
        let (Ok(comm), Ok(stat)) = (
            fs::read_to_string(dir.join("comm")),
            fs::read_to_string(dir.join("schedstat")),
        ) else {
            continue;
        };
        let mut it = stat
            .split_whitespace()
            .map(|v| v.parse::<u64>().unwrap_or(0));
        let (cpu, wait) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        let e = out.entry(comm.trim().to_owned()).or_default();
        e.0 += cpu;
        e.1 += wait;
    }
    out
}

/// Runs `f` and returns (MiB/s, CPU seconds per GiB).
fn measure(total_mib: f64, f: impl FnOnce() -> Res<()>) -> Res<(f64, f64)> {
    let cpu = cpu_seconds();
    let t = Instant::now();
    f()?;
    let secs = t.elapsed().as_secs_f64();
    Ok((
        total_mib / secs,
        (cpu_seconds() - cpu) / (total_mib / 1024.0),
    ))
}

/// The staging variant suggested for the store (now `src/stage/copy.rs`): copy in the kernel
/// (`copy_file_range`), then hash what was stored by reading the temp file
/// back from the page cache; `sync_data`, rename, fsync the directory.
fn stage_by_copy_file_range(f: &FileRef, src: &Path, dest: &Path, n: usize) -> Res<()> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let input = File::open(src.join(&f.path))?;
    let tmp = dest.join(format!("tmp.{n}"));
    let out = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&tmp)?;
    let mut left = f.known().map_or(0, |(_, size)| size) as usize;
    while left > 0 {
        // SAFETY: both descriptors are open; null offsets use the file positions.
        let done = unsafe {
            libc::copy_file_range(
                input.as_raw_fd(),
                std::ptr::null_mut(),
                out.as_raw_fd(),
                std::ptr::null_mut(),
                left,
                0,
            )
        };
        if done <= 0 {
            return Err(format!("copy_file_range: {}", io::Error::last_os_error()).into());
        }
        left -= done as usize;
    }
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut back = File::open(&tmp)?;
    loop {
        let k = back.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
    }
    if BlobId(h.finalize().into()) != f.key() {
        return Err("sha mismatch".into());
    }
    out.sync_data()?;
    fs::rename(&tmp, dest.join(f.key().to_hex()))?;
    File::open(dest)?.sync_all()?;
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn bench_stage(o: &Opts) -> Res<()> {
    let count = o.num("files", 64);
    let mib = o.num("mib", 32);
    let reps = o.num("reps", 3).max(1);
    let threads: Vec<usize> = o
        .str("threads", "1,2,4")
        .split(',')
        .map(|t| t.parse().unwrap_or_else(|_| usage()))
        .collect();
    let pipeline_threads = o.num("pipeline-threads", 4) as usize;
    let work = o.work("stage")?;
    let src = work.path().join("src");
    let t = Instant::now();
    let files = write_random_files(&src, count, mib << 20)?;
    let total = count * (mib << 20);
    let total_mib = total as f64 / (1 << 20) as f64;
    sh("sync", &[])?;
    eprintln!("stage: wrote {total_mib:.0} MiB in {:.1?}", t.elapsed());

    // The pipeline's event log: one add_files event per file.
    let events = work.path().join("events");
    fs::create_dir_all(&events)?;
    {
        let mut log = BufWriter::new(File::create(events.join("log-000000.jsonl"))?);
        writeln!(log, r#"{{"id":1,"op":"create_database","db":"bench"}}"#)?;
        writeln!(
            log,
            r#"{{"id":2,"op":"create_table","db":"bench","table":"t","partition_keys":["p"]}}"#
        )?;
        for (i, f) in files.iter().enumerate() {
            writeln!(
                log,
                r#"{{"id":{},"op":"add_files","db":"bench","table":"t","partition":{{"p":"{i}"}},"files":[{{"path":"{}","size":{},"sha256":"{}"}}]}}"#,
                i + 3,
                f.rel,
                f.size,
                f.sha
            )?;
        }
        log.flush()?;
    }
    let last = StateId(count + 2);
    let dest = work.path().join("dest");

    // Each run: warm sources, clean destination, settled disk; then the clock.
    let prepare = || -> Res<()> {
        if dest.exists() {
            fs::remove_dir_all(&dest)?;
        }
        sh("sync", &[])?;
        warm(&src, &files)?;
        Ok(())
    };
    let runs = o.str("runs", "cp_sync,cp_fsync,cp,fetch,prototype,pipeline");
    let runs: Vec<&str> = runs.split(',').collect();
    let mut results: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let refs: Arc<Vec<FileRef>> = Arc::new(
        files
            .iter()
            .map(|f| FileRef::native(&f.rel, "000000_0", f.size, f.sha))
            .collect(),
    );
    for rep in 0..reps {
        if runs.contains(&"cp_sync") {
            prepare()?;
            let r = measure(total_mib, || {
                sh("cp", &[Path::new("-r"), &src, &dest])?;
                sh("sync", &[])
            })?;
            results.entry("cp_sync".into()).or_default().push(r);
        }
        if runs.contains(&"cp_fsync") {
            // Like for like with stagefs: fsync every copied file and
            // directory (not the whole filesystem, so other processes'
            // dirty data does not count).
            prepare()?;
            let r = measure(total_mib, || {
                sh("cp", &[Path::new("-r"), &src, &dest])?;
                let mut paths = vec![dest.clone()];
                let mut i = 0;
                while i < paths.len() {
                    if paths[i].is_dir() {
                        for e in fs::read_dir(&paths[i])? {
                            paths.push(e?.path());
                        }
                    }
                    i += 1;
                }
                let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
                sh("sync", &refs)
            })?;
            results.entry("cp_fsync".into()).or_default().push(r);
        }
        if runs.contains(&"cp") {
            // Reference only: the page cache absorbs the writes.
            prepare()?;
            let r = measure(total_mib, || sh("cp", &[Path::new("-r"), &src, &dest]))?;
            results.entry("cp".into()).or_default().push(r);
        }
        for n in threads.iter().filter(|_| runs.contains(&"fetch")) {
            prepare()?;
            fs::create_dir_all(&dest)?;
            let store = Arc::new(BlobStore::open(&dest)?);
            let next = Arc::new(AtomicUsize::new(0));
            let r = measure(total_mib, || {
                let workers: Vec<_> = (0..*n)
                    .map(|_| {
                        let (store, next, refs, src) = (
                            Arc::clone(&store),
                            Arc::clone(&next),
                            Arc::clone(&refs),
                            src.clone(),
                        );
                        std::thread::spawn(move || -> Result<(), String> {
                            loop {
                                let i = next.fetch_add(1, Ordering::Relaxed);
                                let Some(f) = refs.get(i) else { return Ok(()) };
                                store.fetch(f, &src, None).map_err(|e| e.to_string())?;
                            }
                        })
                    })
                    .collect();
                for w in workers {
                    w.join().map_err(|_| "fetch thread panicked")??;
                }
                Ok(())
            })?;
            results.entry(format!("fetch{n}")).or_default().push(r);
        }
        for n in threads.iter().filter(|_| runs.contains(&"prototype")) {
            // Not the library: the copy_file_range variant suggested in
            // docs/benchmarks/HISTORY.md, to size the gain before anyone builds it.
            prepare()?;
            fs::create_dir_all(&dest)?;
            let next = Arc::new(AtomicUsize::new(0));
            let r = measure(total_mib, || {
                let workers: Vec<_> = (0..*n)
                    .map(|_| {
                        let (next, refs, src, dest) = (
                            Arc::clone(&next),
                            Arc::clone(&refs),
                            src.clone(),
                            dest.clone(),
                        );
                        std::thread::spawn(move || -> Result<(), String> {
                            loop {
                                let i = next.fetch_add(1, Ordering::Relaxed);
                                let Some(f) = refs.get(i) else { return Ok(()) };
                                stage_by_copy_file_range(f, &src, &dest, i)
                                    .map_err(|e| e.to_string())?;
                            }
                        })
                    })
                    .collect();
                for w in workers {
                    w.join().map_err(|_| "prototype thread panicked")??;
                }
                Ok(())
            })?;
            results.entry(format!("prototype{n}")).or_default().push(r);
        }
        if runs.contains(&"pipeline") {
            // The real pipeline: Replica until visible == latest.
            prepare()?;
            let mut cfg = ReplicaConfig::new(&dest, &src, &events);
            cfg.fetch_threads = pipeline_threads;
            let mut fetched = 0;
            let r = measure(total_mib, || {
                let replica = Replica::start(cfg)?;
                wait_visible(&replica, last, Duration::from_secs(300))?;
                fetched = replica.status().staging.bytes_fetched;
                replica.stop();
                Ok(())
            })?;
            if fetched != total {
                return Err(format!("pipeline staged {fetched} bytes, expected {total}").into());
            }
            results.entry("pipeline".into()).or_default().push(r);
        }
        eprintln!("stage rep {rep}: {results:?}");
    }
    if dest.exists() {
        fs::remove_dir_all(&dest)?;
    }

    let m = |k: &str| {
        results
            .get(k)
            .map(|v| median(v.iter().map(|r| r.0).collect()))
    };
    let cpu = |k: &str| {
        results
            .get(k)
            .map_or(0.0, |v| median(v.iter().map(|r| r.1).collect()))
    };
    let shape = format!("{count} × {mib} MiB");
    let base = m("cp_sync");
    if let Some(b) = base {
        row(
            &format!("4. `cp -r` + `sync` ({shape})"),
            &format!("{b:.0} MiB/s ({:.2} CPU-s/GiB)", cpu("cp_sync")),
            "baseline",
            None,
        );
    }
    let per_file = m("cp_fsync");
    if let Some(c) = per_file {
        row(
            &format!("4. `cp -r` + fsync of every copied file and directory ({shape}, reference)"),
            &format!("{c:.0} MiB/s ({:.2} CPU-s/GiB)", cpu("cp_fsync")),
            "—",
            None,
        );
    }
    if let Some(c) = m("cp") {
        row(
            &format!("4. plain `cp -r`, no sync ({shape}, reference)"),
            &format!("{c:.0} MiB/s ({:.2} CPU-s/GiB)", cpu("cp")),
            "—",
            None,
        );
    }
    let mut staged: Vec<(String, String)> = Vec::new();
    if m("pipeline").is_some() {
        staged.push((
            format!("Staging via Replica pipeline, {pipeline_threads} fetch threads"),
            "pipeline".into(),
        ));
    }
    for n in &threads {
        if m(&format!("fetch{n}")).is_some() {
            staged.push((
                format!("BlobStore::fetch, {n} thread(s)"),
                format!("fetch{n}"),
            ));
        }
    }
    for n in &threads {
        if m(&format!("prototype{n}")).is_some() {
            staged.push((
                format!(
                    "prototype (not the library): copy_file_range + hash the temp, {n} thread(s)"
                ),
                format!("prototype{n}"),
            ));
        }
    }
    for (label, key) in &staged {
        let v = m(key).unwrap_or(0.0);
        let (mut figure, met) = match base {
            Some(b) => (
                format!("{v:.0} MiB/s = {:.2}× cp+sync", v / b),
                Some(v / b >= 0.8),
            ),
            None => (format!("{v:.0} MiB/s"), None),
        };
        if let Some(p) = per_file {
            figure.push_str(&format!(", {:.2}× cp+fsync per file", v / p));
        }
        row(
            &format!("4. {label}"),
            &format!("{figure} ({:.2} CPU-s/GiB)", cpu(key)),
            "≥ 0.8× cp+sync",
            met,
        );
    }
    note(&format!(
        "stage: {shape} of pseudo-random bytes; median of {reps} runs; source page cache warm before every run, \
         destination removed and `sync` before every run; all on one filesystem ({}); \
         CPU-s/GiB = user+system CPU of the process (and of `cp`/`sync`) per GiB copied, excluding kernel flusher threads",
        work.path().display()
    ));
    Ok(())
}
