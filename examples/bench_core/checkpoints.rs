//! Checkpoint benchmarks of `bench_core` (docs/BENCHMARKS.md, "Checkpoints
//! and restart"; `scripts/bench/core.sh checkpoints` runs them):
//!
//! - `checkpoint --files N`: time and bytes of one checkpoint of a catalog
//!   of N files (16 retained versions sharing their nodes, as a daemon with
//!   the default `--retain 16` holds), and its load in a fresh process
//!   (time, resident memory);
//! - `restart --events N`: the same log replicated into two state folders,
//!   one with the default checkpoints and one with checkpoint writing off
//!   (which replays the whole journal from record 0, as main does), then
//!   each restarted in the same minute: restart time, records replayed,
//!   journal and checkpoint bytes on disk;
//! - `lag --files N --seconds D`: commit lag (event appended to the source
//!   log → visible) at `--rate` events/s on top of a catalog of N files,
//!   once with checkpoint writing off and once with a checkpoint every
//!   `--every` state-ids, so checkpoints of the whole catalog are being
//!   written during most of the run; then the daemon's resident memory per
//!   million files, built by events and restored from a checkpoint, each
//!   in a fresh process.
//!
//! The replicas of `lag` run in child processes of this binary
//! (`lag-child`, `load-child`), so each resident-memory figure is a fresh
//! process's and no allocator state leaks between them.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stagefs::checkpoint::{self, CheckpointData};
use stagefs::event::StateId;
use stagefs::replicate::{Replica, ReplicaConfig};
use stagefs::workload::Rng;

use super::{
    add_files, build_tree, file_ref, grouped, load1, note, row, rss_bytes, thread_times,
    wait_visible, write_metadata_log, Opts, Res, Timings,
};

/// A config whose checkpoint thread never writes (restart still loads any
/// checkpoint there is; with none it replays the whole journal).
fn no_checkpoints(mut cfg: ReplicaConfig) -> ReplicaConfig {
    cfg.checkpoint_events = 0;
    cfg.checkpoint_interval = Duration::from_secs(u64::MAX / 4);
    cfg
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / f64::from(1 << 20))
}

fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// `KV|key|value` lines of a child process's stdout.
fn child(args: &[&str]) -> Res<BTreeMap<String, String>> {
    let out = Command::new(std::env::current_exe()?).args(args).output()?;
    if !out.status.success() {
        return Err(format!(
            "bench_core {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.strip_prefix("KV|")?.splitn(2, '|');
            Some((it.next()?.to_owned(), it.next()?.to_owned()))
        })
        .collect())
}

fn kv(m: &BTreeMap<String, String>, key: &str) -> Res<f64> {
    m.get(key)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("child did not report {key}").into())
}

// ---------------------------------------------------------------------------
// checkpoint cost

pub fn bench_checkpoint(o: &Opts) -> Res<()> {
    let files = o.num("files", 1_000_000).max(1000);
    let work = o.work("checkpoint")?;
    let parts = files / 1000;
    let files = parts * 1000;
    // 16 retained versions: the tree, then 15 one-file inserts on top,
    // sharing every unchanged node (the checkpoint writes a node once).
    let mut versions = BTreeMap::new();
    let mut tree = Arc::new(build_tree(parts, 1000));
    let mut rng = Rng::new(3);
    for i in 0..16u64 {
        versions.insert(tree.state_id, Arc::clone(&tree));
        if i == 15 {
            break;
        }
        let part = rng.below(parts as usize) as u64;
        let e = add_files(
            tree.state_id.0 + 1,
            part,
            vec![file_ref(part, 800_000_000 + i, 1 << 41 | i)],
        );
        tree = Arc::new(tree.apply(&e)?.0);
    }
    let data = CheckpointData {
        state: tree.state_id,
        created_ms: 0,
        resume: None,
        window: Vec::new(),
        versions,
    };
    let load_before = load1();
    let (t, cpu) = (Instant::now(), thread_cpu_s());
    let (path, size) = checkpoint::write(work.path(), &data, None, None)?;
    let (write_s, write_cpu) = (t.elapsed().as_secs_f64(), thread_cpu_s() - cpu);
    let (t, cpu) = (Instant::now(), thread_cpu_s());
    let rate = checkpoint::DEFAULT_CHECKPOINT_RATE_MIB;
    checkpoint::write(work.path(), &data, None, Some(rate << 20))?;
    let (paced_s, paced_cpu) = (t.elapsed().as_secs_f64(), thread_cpu_s() - cpu);
    drop(data);
    drop(tree);
    let loaded = child(&[
        "load-child",
        "--dir",
        &work.path().to_string_lossy(),
        "--files",
        &(files + 15).to_string(),
    ])?;
    let load_s = kv(&loaded, "load_s")?;
    let rss = kv(&loaded, "rss_delta")? as u64;
    row(
        &format!(
            "C1a. Checkpoint of {} files, 16 retained versions (write + fsync + rename)",
            grouped(files)
        ),
        &format!(
            "{write_s:.2} s at full speed, {paced_s:.2} s at the default {rate} MiB/s (CPU of the writing thread \
             {write_cpu:.2} s / {paced_cpu:.2} s); {} ({:.0} B/file)",
            mib(size),
            size as f64 / files as f64
        ),
        "—",
        None,
    );
    row(
        "C1b. ↳ load of that checkpoint in a fresh process",
        &format!(
            "{load_s:.2} s; resident memory +{} ({:.0} B/file)",
            mib(rss),
            rss as f64 / files as f64
        ),
        "—",
        None,
    );
    note(&format!(
        "checkpoint: one table of {parts} partitions × 1,000 native files (sha256, size, source path), plus 15 \
         versions of one more file each; written by `checkpoint::write` from this process (the checkpoint thread \
         calls the same), loaded by `checkpoint::load_newest` in a child process; file {}; load (1 min) \
         {load_before} → {}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        load1()
    ));
    Ok(())
}

/// CPU time (user + system) of the calling thread, in seconds.
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// `load-child --dir D --files N`: loads the newest checkpoint of D.
pub fn load_child(o: &Opts) -> Res<()> {
    let dir = PathBuf::from(o.str("dir", ""));
    let rss0 = rss_bytes();
    let t = Instant::now();
    let found = checkpoint::load_newest(&dir, StateId(u64::MAX))?;
    let load_s = t.elapsed().as_secs_f64();
    let loaded = found.loaded.ok_or("no readable checkpoint")?;
    let newest = loaded
        .data
        .versions
        .values()
        .next_back()
        .ok_or("empty checkpoint")?;
    let mut n = 0u64;
    newest.for_each_file(&mut |_| n += 1);
    let want = o.num("files", 0);
    if n != want {
        return Err(format!("restored {n} files, wrote {want}").into());
    }
    println!("KV|load_s|{load_s}");
    println!("KV|rss_delta|{}", rss_bytes().saturating_sub(rss0));
    Ok(())
}

// ---------------------------------------------------------------------------
// restart after many events

/// The log files of `log` (sorted), hard-linked into `events`.
fn link_logs(log: &Path, events: &Path, files: &[PathBuf]) -> Res<()> {
    for f in files {
        fs::hard_link(log.join(f), events.join(f))?;
    }
    Ok(())
}

pub fn bench_restart(o: &Opts) -> Res<()> {
    const LINES_PER_FILE: u64 = 100_000;
    let n = o.num("events", 10_000_000).max(4 * LINES_PER_FILE);
    let work = o.work("restart")?;
    let log = work.path().join("log");
    let source = work.path().join("source");
    fs::create_dir_all(&log)?;
    fs::create_dir_all(&source)?;
    let t = Instant::now();
    let last = write_metadata_log(&log, n, o.num("seed", 7))?;
    let mut files: Vec<PathBuf> = fs::read_dir(&log)?
        .map(|e| e.map(|e| PathBuf::from(e.file_name())))
        .collect::<Result<_, _>>()?;
    files.sort();
    let log_bytes = dir_bytes(&log);
    eprintln!(
        "restart: wrote {} events ({}) in {:.1?}",
        grouped(last),
        mib(log_bytes),
        t.elapsed()
    );
    Command::new("sync").status()?;
    let defaults = ReplicaConfig::new(&work.path().join("unused"), &source, &log);
    let every = defaults.checkpoint_events;

    // With checkpoints: the log but its last two files (100,000 events
    // each) with the default checkpoints, then those two with checkpoint
    // writing off, so the restart has at least 200,000 records after its
    // newest checkpoint (the most a default daemon leaves is ~250,000 plus what
    // arrives while one is written).
    let ckpt_events = work.path().join("ckpt-events");
    fs::create_dir_all(&ckpt_events)?;
    let split = files.len() - 2;
    link_logs(&log, &ckpt_events, &files[..split])?;
    let mut tail_events = 0u64;
    for f in &files[split..] {
        tail_events += fs::read(log.join(f))?
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
    }
    let ckpt_state = work.path().join("ckpt");
    let ckpt_cfg = ReplicaConfig::new(&ckpt_state, &source, &ckpt_events);
    let first_last = last - tail_events;
    let started = Instant::now();
    let replica = Replica::start(ckpt_cfg.clone())?;
    wait_visible(&replica, StateId(first_last), Duration::from_secs(3600))?;
    let ckpt_ingest_s = started.elapsed().as_secs_f64();
    // The checkpoint of the last count trigger, then compaction.
    let deadline = Instant::now() + Duration::from_secs(120);
    while replica
        .status()
        .checkpoint
        .last_id
        .is_none_or(|c| c.0 + every < first_last)
    {
        if Instant::now() > deadline {
            return Err("no checkpoint after ingest".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let during = replica.status();
    replica.stop();
    eprintln!(
        "restart: ingested {} events with checkpoints in {ckpt_ingest_s:.1} s ({} written, journal {})",
        grouped(first_last),
        during.checkpoint.written,
        mib(during.journal.bytes)
    );
    link_logs(&log, &ckpt_events, &files[split..])?;
    let replica = Replica::start(no_checkpoints(ckpt_cfg.clone()))?;
    wait_visible(&replica, StateId(last), Duration::from_secs(600))?;
    replica.stop();

    // Without: the whole log, checkpoint writing off.
    let full_state = work.path().join("full");
    let full_cfg = no_checkpoints(ReplicaConfig::new(&full_state, &source, &log));
    let started = Instant::now();
    let replica = Replica::start(full_cfg.clone())?;
    wait_visible(&replica, StateId(last), Duration::from_secs(3600))?;
    let full_ingest_s = started.elapsed().as_secs_f64();
    replica.stop();
    eprintln!(
        "restart: ingested {} events without checkpoints in {full_ingest_s:.1} s",
        grouped(last)
    );
    Command::new("sync").status()?;

    // The restarts, back to back: checkpoints, full replay, checkpoints.
    let load_before = load1();
    let restart = |cfg: &ReplicaConfig| -> Res<(f64, u64)> {
        let t = Instant::now();
        let replica = Replica::start(cfg.clone())?;
        let s = t.elapsed().as_secs_f64();
        let st = replica.status();
        let visible = replica.catalog().snapshot().visible.state_id.0;
        replica.stop();
        if visible != last {
            return Err(format!("restart came back at {visible}, not {last}").into());
        }
        Ok((s, st.checkpoint.replayed_records))
    };
    let (ckpt_s, ckpt_replayed) = restart(&no_checkpoints(ckpt_cfg.clone()))?;
    let (full_s, full_replayed) = restart(&full_cfg)?;
    let (ckpt_s2, _) = restart(&no_checkpoints(ckpt_cfg))?;
    let load_after = load1();
    let ckpt_journal = dir_bytes(&ckpt_state.join("journal"));
    let ckpt_bytes = dir_bytes(&checkpoint::dir(&ckpt_state));
    let full_journal = dir_bytes(&full_state.join("journal"));
    eprintln!(
        "restart: checkpoints {ckpt_s:.2} s / {ckpt_s2:.2} s ({ckpt_replayed} replayed), full {full_s:.2} s ({full_replayed} replayed)"
    );
    let events = grouped(last);
    row(
        &format!("C4a. Restart after {events} metadata events, default checkpoints"),
        &format!(
            "{ckpt_s:.2} s and {ckpt_s2:.2} s ({} records replayed); journal {}, checkpoints {}",
            grouped(ckpt_replayed),
            mib(ckpt_journal),
            mib(ckpt_bytes)
        ),
        "≤ 2 s + catalog load; journal bounded by the interval",
        Some(ckpt_s.max(ckpt_s2) <= 2.0),
    );
    row(
        &format!(
            "C4b. Restart after {events} metadata events, no checkpoints (full replay, as main)"
        ),
        &format!(
            "{full_s:.2} s ({} records replayed); journal {}",
            grouped(full_replayed),
            mib(full_journal)
        ),
        "—",
        None,
    );
    row(
        "C4c. ↳ ingest of the log (events/s), with / without checkpoints",
        &format!(
            "{:.0} / {:.0}",
            first_last as f64 / ckpt_ingest_s,
            last as f64 / full_ingest_s
        ),
        "—",
        None,
    );
    note(&format!(
        "restart: log of {events} events ({}); with checkpoints: default `--checkpoint-events {every}`, the \
         first {} events ingested with checkpoints ({} written, journal {} at the end of it), the last {} \
         with checkpoint writing off so the restart replays at least that many; without: checkpoint writing off \
         (the same binary; a start with no checkpoint replays from record 0 as main does); \
         restart = `Replica::start` until it returns (journal scan, checkpoint load, replay), page cache warm; \
         the three restarts back to back, load (1 min) {load_before} → {load_after}",
        mib(log_bytes),
        grouped(first_last),
        during.checkpoint.written,
        mib(during.journal.bytes),
        grouped(tail_events)
    ));
    Ok(())
}

// ---------------------------------------------------------------------------
// commit lag while checkpoints are written; memory per million files

/// The one source file every file of the big catalog names (one blob).
const ONE: &[u8] = b"x";

/// Events 1..: `db` with a table `t` of `files` files (1,000 per
/// partition, one `add_files` per partition, all naming the same source
/// file), and an empty table `lag` the timed events add partitions to.
/// Returns the last id.
fn write_catalog_log(events: &Path, source: &Path, files: u64) -> Res<u64> {
    use sha2::{Digest, Sha256};
    fs::create_dir_all(source.join("data"))?;
    fs::write(source.join("data/one"), ONE)?;
    let sha: String = Sha256::digest(ONE)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut out = BufWriter::new(File::create(events.join("log-000000.jsonl"))?);
    writeln!(out, r#"{{"id":1,"op":"create_database","db":"db"}}"#)?;
    writeln!(
        out,
        r#"{{"id":2,"op":"create_table","db":"db","table":"t","partition_keys":["p"]}}"#
    )?;
    writeln!(
        out,
        r#"{{"id":3,"op":"create_table","db":"db","table":"lag","partition_keys":["p"]}}"#
    )?;
    let mut id = 3;
    for part in 0..files.div_ceil(1000) {
        id += 1;
        write!(
            out,
            r#"{{"id":{id},"op":"add_files","db":"db","table":"t","partition":{{"p":"v{part}"}},"files":["#
        )?;
        for f in 0..1000.min(files - part * 1000) {
            if f > 0 {
                write!(out, ",")?;
            }
            write!(
                out,
                r#"{{"path":"data/one","size":{},"sha256":"{sha}","name":"{f:06}_0"}}"#,
                ONE.len()
            )?;
        }
        writeln!(out, "]}}")?;
    }
    out.flush()?;
    Ok(id)
}

pub fn bench_lag(o: &Opts) -> Res<()> {
    let files = o.num("files", 1_000_000);
    let seconds = o.num("seconds", 20);
    let rate = o.num("rate", 1000);
    let every = o.num("every", 2000);
    let work = o.work("lag")?;
    let events = work.path().join("events");
    let source = work.path().join("source");
    let state = work.path().join("state");
    fs::create_dir_all(&events)?;
    let setup = write_catalog_log(&events, &source, files)?;
    Command::new("sync").status()?;
    let dir = |p: &Path| p.to_string_lossy().into_owned();
    let run_at =
        |label: &str, every: u64, from: u64, rate_mib: u64| -> Res<BTreeMap<String, String>> {
            eprintln!("lag: {label}");
            child(&[
                "lag-child",
                "--state",
                &dir(&state),
                "--source",
                &dir(&source),
                "--events",
                &dir(&events),
                "--setup",
                &setup.to_string(),
                "--first",
                &from.to_string(),
                "--seconds",
                &seconds.to_string(),
                "--rate",
                &rate.to_string(),
                "--every",
                &every.to_string(),
                "--ckpt-rate-mib",
                &rate_mib.to_string(),
            ])
        };
    let default_rate = o.num("ckpt-rate-mib", checkpoint::DEFAULT_CHECKPOINT_RATE_MIB);
    let run = |label: &str, every: u64, from: u64| run_at(label, every, from, default_rate);
    let load_before = load1();
    let n = seconds * rate;
    // The first child builds the catalog by events (its memory is C3's
    // "built by events"); its lag is not compared: it includes the
    // writeback of that whole build. Then off, on, off again: the two
    // variants in the same minutes, each on the catalog already built.
    let built = run("building the catalog (lag not compared)", 0, setup + 1)?;
    let off = run("checkpoint writing off", 0, setup + 1 + n)?;
    let on = run(
        &format!("a checkpoint every {every} ids"),
        every,
        setup + 1 + 2 * n,
    )?;
    let off2 = run("checkpoint writing off, again", 0, setup + 1 + 3 * n)?;
    let on_full = run_at(
        &format!("a checkpoint every {every} ids, written at full speed"),
        every,
        setup + 1 + 4 * n,
        0,
    )?;
    let load_after = load1();
    // A fresh start restored from the newest checkpoint (no timed events).
    let restored = run("restart from the checkpoint", 0, 0)?;
    let ms = |m: &BTreeMap<String, String>, k: &str| -> Res<String> {
        Ok(format!("{:.1} ms", kv(m, k)? * 1e3))
    };
    let lag = |m: &BTreeMap<String, String>| -> Res<String> {
        Ok(format!(
            "p50 {} / p99 {} / max {}",
            ms(m, "p50")?,
            ms(m, "p99")?,
            ms(m, "max")?
        ))
    };
    // Against the steadier of the two runs without (the first one may
    // still pay for the writeback of the catalog's build).
    let grew = kv(&on, "p99")? > 1.5 * kv(&off, "p99")?.min(kv(&off2, "p99")?);
    row(
        &format!(
            "C2a. Commit lag at {} events/s on {} files, checkpoint writing off",
            grouped(rate),
            grouped(files)
        ),
        &format!(
            "{} (again after: {}; the run that built the catalog: {})",
            lag(&off)?,
            lag(&off2)?,
            lag(&built)?
        ),
        "—",
        None,
    );
    row(
        &format!(
            "C2b. ↳ the same with a checkpoint every {} ids ({:.0} written during the run)",
            grouped(every),
            kv(&on, "written")?
        ),
        &format!("{}, checkpoints written at {default_rate} MiB/s", lag(&on)?),
        "p99 does not grow",
        Some(!grew),
    );
    row(
        &format!(
            "C2c. ↳ the same with checkpoints written at full speed (`--checkpoint-rate 0`, {:.0} written)",
            kv(&on_full, "written")?
        ),
        &lag(&on_full)?,
        "—",
        None,
    );
    let per_m = |b: f64| b * 1e6 / files as f64 / f64::from(1 << 20);
    let built_rss = kv(&built, "rss_delta")?;
    let back = kv(&restored, "rss_delta")?;
    row(
        "C3. Daemon resident memory per 1,000,000 files in the catalog",
        &format!(
            "{:.0} MiB built by events (process VmRSS {}), {:.0} MiB restored from a checkpoint (VmRSS {})",
            per_m(built_rss),
            mib(kv(&built, "rss")? as u64),
            per_m(back),
            mib(kv(&restored, "rss")? as u64)
        ),
        "—",
        None,
    );
    row(
        &format!(
            "C4d. ↳ restart of a catalog of {} files from its checkpoint",
            grouped(files)
        ),
        &format!(
            "{:.2} s ({} records replayed; catalog load is most of it)",
            kv(&restored, "start_s")?,
            kv(&restored, "replayed")?
        ),
        "—",
        None,
    );
    let threads = |m: &BTreeMap<String, String>| -> Res<String> {
        let mut parts = Vec::new();
        for name in THREADS {
            parts.push(format!(
                "{name} {:.2} / {:.2} s",
                kv(m, &format!("cpu_{name}"))?,
                kv(m, &format!("wait_{name}"))?
            ));
        }
        Ok(parts.join(", "))
    };
    note(&format!(
        "lag, CPU time / run-queue wait per thread over each child's timed events (schedstat): off {}; on {}; \
         off again {}; full speed {}",
        threads(&off)?,
        threads(&on)?,
        threads(&off2)?,
        threads(&on_full)?
    ));
    note(&format!(
        "lag: table `db.t` of {} files (1,000 per partition, one blob), then {} `add_partition` events per run on \
         `db.lag`, appended one line at a time at {} events/s; lag = append → visible (seen by polling the \
         catalog every 200 µs; ingest polls the log every 5 ms); each run a fresh child process on the same state \
         folder (one that builds the catalog, then off, on, off); checkpoint sizes {}; resident memory = VmRSS after the catalog is visible minus \
         VmRSS before `Replica::start` (journal ring and hand-off included, each bounded to 64 MiB); load (1 min) \
         {load_before} → {load_after}",
        grouped(files),
        grouped(n),
        grouped(rate),
        mib(kv(&on, "ckpt_bytes")? as u64)
    ));
    Ok(())
}

/// `lag-child`: starts a replica on `--state`, waits for the catalog of
/// `--setup`, then (when `--first` > 0) appends `--seconds` × `--rate`
/// events from id `--first` and reports the lag percentiles.
pub fn lag_child(o: &Opts) -> Res<()> {
    let state = PathBuf::from(o.str("state", ""));
    let source = PathBuf::from(o.str("source", ""));
    let events = PathBuf::from(o.str("events", ""));
    let setup = o.num("setup", 0);
    let first = o.num("first", 0);
    let every = o.num("every", 0);
    let mut cfg = no_checkpoints(ReplicaConfig::new(&state, &source, &events));
    if every > 0 {
        cfg.checkpoint_events = every;
    }
    cfg.checkpoint_rate = o.num("ckpt-rate-mib", checkpoint::DEFAULT_CHECKPOINT_RATE_MIB) << 20;
    let rss0 = rss_bytes();
    let t = Instant::now();
    let replica = Replica::start(cfg)?;
    let start_s = t.elapsed().as_secs_f64();
    let at = replica.catalog().snapshot().visible.state_id.0.max(setup);
    wait_visible(&replica, StateId(at), Duration::from_secs(1800))?;
    let st = replica.status();
    println!("KV|start_s|{start_s}");
    println!("KV|replayed|{}", st.checkpoint.replayed_records);
    println!("KV|rss|{}", rss_bytes());
    println!("KV|rss_delta|{}", rss_bytes().saturating_sub(rss0));
    if first == 0 {
        replica.stop();
        return Ok(());
    }
    let n = o.num("seconds", 20) * o.num("rate", 1000);
    let rate = o.num("rate", 1000);
    let written_before = st.checkpoint.written;
    let threads_before = thread_times();
    let lags = timed_events(&replica, &events, first, n, rate)?;
    let threads_after = thread_times();
    let st = replica.status();
    replica.stop();
    for name in THREADS {
        let (cpu0, wait0) = threads_before.get(name).copied().unwrap_or_default();
        let (cpu1, wait1) = threads_after.get(name).copied().unwrap_or_default();
        println!("KV|cpu_{name}|{}", cpu1.saturating_sub(cpu0) as f64 / 1e9);
        println!(
            "KV|wait_{name}|{}",
            wait1.saturating_sub(wait0) as f64 / 1e9
        );
    }
    println!("KV|p50|{}", lags.pct(0.5).as_secs_f64());
    println!("KV|p99|{}", lags.pct(0.99).as_secs_f64());
    println!("KV|max|{}", lags.pct(1.0).as_secs_f64());
    println!("KV|written|{}", st.checkpoint.written - written_before);
    println!("KV|ckpt_bytes|{}", st.checkpoint.size_bytes);
    Ok(())
}

/// The daemon threads whose CPU time and run-queue wait the lag children
/// report over their timed events (`ckpt-write`: the checkpoint thread's
/// writer, where a build has one).
const THREADS: [&str; 4] = ["ingest", "stager", "checkpoint", "ckpt-write"];

/// Every 5 ms until `done`: the disk's counters (`/sys/block/vda/stat`:
/// write ios, sectors, ms; in flight; discard ios, sectors; flush ios, ms)
/// and the state and wait channel of the daemon's main threads, as `s`
/// lines in ms from `base` (STAGEFS_BENCH_SERIES).
fn sample_io(base: Instant, done: &AtomicBool) -> String {
    let mut tids: Vec<(String, String)> = Vec::new();
    if let Ok(tasks) = fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            let dir = task.path();
            let comm = fs::read_to_string(dir.join("comm")).unwrap_or_default();
            let comm = comm.trim();
            if ["ingest", "stager", "checkpoint"].contains(&comm) {
                tids.push((comm.to_owned(), dir.to_string_lossy().into_owned()));
            }
        }
    }
    let mut out = String::new();
    while !done.load(Ordering::Acquire) {
        let t = base.elapsed().as_secs_f64() * 1e3;
        let stat = fs::read_to_string("/sys/block/vda/stat").unwrap_or_default();
        let f: Vec<&str> = stat.split_whitespace().collect();
        let pick = |i: usize| f.get(i).copied().unwrap_or("0");
        out.push_str(&format!(
            "s {t:.1} {} {} {} {} {} {} {} {}",
            pick(4),
            pick(6),
            pick(7),
            pick(8),
            pick(11),
            pick(13),
            pick(15),
            pick(16)
        ));
        for (name, dir) in &tids {
            let st = fs::read_to_string(format!("{dir}/stat")).unwrap_or_default();
            let state = st
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next())
                .unwrap_or("?");
            let wchan = fs::read_to_string(format!("{dir}/wchan")).unwrap_or_default();
            out.push_str(&format!(
                " {name}:{state}:{}",
                if wchan.is_empty() { "-" } else { &wchan }
            ));
        }
        out.push('\n');
        std::thread::sleep(Duration::from_millis(5));
    }
    out
}

/// Appends `n` `add_partition` events from id `first` at `rate` per
/// second, one line per write, and returns each one's append → visible lag.
fn timed_events(replica: &Replica, events: &Path, first: u64, n: u64, rate: u64) -> Res<Timings> {
    let base = Instant::now();
    let appended: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));
    let path = events.join(format!("log-{first:012}.jsonl"));
    let writer = {
        let (appended, done) = (Arc::clone(&appended), Arc::clone(&done));
        std::thread::spawn(move || -> std::io::Result<()> {
            let mut f = OpenOptions::new().create(true).append(true).open(path)?;
            for i in 0..n {
                let due = Duration::from_nanos(i * 1_000_000_000 / rate);
                let now = base.elapsed();
                if due > now {
                    std::thread::sleep(due - now);
                }
                let id = first + i;
                let line = format!(
                    "{{\"id\":{id},\"op\":\"add_partition\",\"db\":\"db\",\"table\":\"lag\",\"partition\":{{\"p\":\"v{id}\"}}}}\n"
                );
                appended[i as usize].store(base.elapsed().as_nanos() as u64 + 1, Ordering::Release);
                f.write_all(line.as_bytes())?;
            }
            done.store(true, Ordering::Release);
            Ok(())
        })
    };
    let mut lags = Vec::with_capacity(n as usize);
    let mut next = 0u64; // index of the first event not seen visible
    let deadline = Instant::now() + Duration::from_secs(n / rate + 600);
    let mut polls = 0u64;
    // STAGEFS_BENCH_SERIES=DIR: every event's (appended, lag) and every
    // checkpoint's (start, end), in ms from the first append, to a file.
    let series = std::env::var_os("STAGEFS_BENCH_SERIES").map(PathBuf::from);
    let epoch_ms = stagefs::status::now_ms() - base.elapsed().as_millis() as i64;
    let mut ckpts: Vec<(i64, f64)> = Vec::new();
    let mut last_written = replica
        .progress()
        .checkpoint_written_ms
        .load(Ordering::Relaxed);
    let sampler = series.as_ref().map(|_| {
        let done = Arc::clone(&done);
        std::thread::spawn(move || sample_io(base, &done))
    });
    while next < n {
        polls += 1;
        let visible = replica.catalog().snapshot().visible.state_id.0;
        let now = base.elapsed().as_nanos() as u64;
        let written = replica
            .progress()
            .checkpoint_written_ms
            .load(Ordering::Relaxed);
        if written != last_written {
            last_written = written;
            ckpts.push((written - epoch_ms, now as f64 / 1e6));
        }
        while next < n && first + next <= visible {
            let at = appended[next as usize].load(Ordering::Acquire);
            if at == 0 {
                return Err(format!("event {} visible before it was written", first + next).into());
            }
            lags.push(Duration::from_nanos(now.saturating_sub(at - 1)));
            next += 1;
        }
        if polls % 1000 == 0 {
            if let Some(stall) = replica.status().stalled {
                return Err(format!("replication stalled: {stall:?}").into());
            }
        }
        if Instant::now() > deadline {
            return Err(format!("only {next} of {n} timed events became visible").into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    writer.join().map_err(|_| "writer panicked")??;
    debug_assert!(done.load(Ordering::Acquire));
    if let Some(dir) = series {
        let mut out = sampler
            .map(|s| s.join().unwrap_or_default())
            .unwrap_or_default();
        for (i, lag) in lags.iter().enumerate() {
            let at = (appended[i].load(Ordering::Acquire) - 1) as f64 / 1e6;
            out.push_str(&format!("e {at:.3} {:.3}\n", lag.as_secs_f64() * 1e3));
        }
        for (start, end) in &ckpts {
            out.push_str(&format!("c {start} {end:.3}\n"));
        }
        fs::write(dir.join(format!("series-{first}.txt")), out)?;
    }
    Ok(Timings(lags))
}
