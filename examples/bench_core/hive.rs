//! Hive source benchmarks of issue 11 (docs/BENCHMARKS.md, "Hive source
//! (issue 11)"), subcommands of `bench_core`:
//!
//! - `hive-ingest`: gzip(json-2.0) INSERT rows read from a `--hive-events`
//!   file, decoded, mapped, validated and journaled (group fsync) by a real
//!   [`Replica`]; the clock stops when the last event is durable in the
//!   journal (`Progress::latest`). Then the same rows once more through the
//!   same steps on one thread, each step timed on its own (the breakdown).
//! - `hive-stage`: files named by Hive rows with HDFS checksums staged by
//!   the pipeline (sha256 and MD5-of-MD5-of-CRC32C/CRC32 in one pass, every
//!   blob durable) against `cp -r` + `sync` of the same files, interleaved
//!   in the same run; plus the single-thread speed of each hash.
//!
//! Inputs (files and rows, written by `stagefs::workload::hive_export::HiveWriter`, the
//! project's DbNotificationListener stand-in) are generated before any clock
//! starts.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use stagefs::catalog::Tree;
use stagefs::event::{Event, StateId};
use stagefs::journal::{journal_payload, Journal, JournalConfig, JournalEntry, SyncTicket};
use stagefs::replicate::{Replica, ReplicaConfig};
use stagefs::source::hive::ahead;
use stagefs::source::hive::checksum::ChecksumVerifier;
use stagefs::source::hive::files::FileRows;
use stagefs::source::hive::map::SourceMap;
use stagefs::source::hive::message::{decode_message, decode_text};
use stagefs::source::hive::model::{NotificationRow, RowSource};
use stagefs::source::hive::{HiveConfig, HiveRows, HiveSource};
use stagefs::source::{Source, Validator, Verdict};
use stagefs::workload::hive_export::HiveWriter;

use super::{
    cpu_seconds, grouped, load1, measure, median, note, row, sh, staged_verified, thread_times,
    wait_visible, write_random_files, Opts, Res, SourceFile,
};

/// Median and range of `v`, formatted `median (min–max)` with `digits`.
fn spread(v: &[f64], digits: usize) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{:.*} ({:.*}–{:.*})",
        digits,
        median(v.to_vec()),
        digits,
        lo,
        digits,
        hi
    )
}

/// Converts native event lines into Hive rows appended to `rows`.
fn write_rows(writer: &mut HiveWriter, lines: impl Iterator<Item = String>) -> Res<()> {
    for line in lines {
        writer.write_event(&Event::parse_line(line.as_bytes())?)?;
    }
    writer.sync()?;
    Ok(())
}

/// The rows of table `bench.t` with file `i` of `files` added to its
/// partition `p=i` (where write_random_files puts it), event ids 1..=n+2.
pub fn write_partition_rows(writer: &mut HiveWriter, files: &[SourceFile]) -> Res<()> {
    let setup = [
        r#"{"id":1,"op":"create_database","db":"bench"}"#.to_string(),
        r#"{"id":2,"op":"create_table","db":"bench","table":"t","partition_keys":["p"]}"#
            .to_string(),
    ];
    let lines = files.iter().enumerate().map(|(i, f)| {
        format!(
            r#"{{"id":{},"op":"add_files","db":"bench","table":"t","partition":{{"p":"{i}"}},"files":[{{"path":"{}","size":{},"sha256":"{}"}}]}}"#,
            i + 3,
            f.rel,
            f.size,
            f.sha
        )
    });
    write_rows(writer, setup.into_iter().chain(lines))
}

fn hive_config(rows: &Path, writer: &HiveWriter) -> Res<HiveConfig> {
    let map = SourceMap::parse(&writer.source_map_args())?;
    Ok(HiveConfig::new(HiveRows::Files(rows.to_owned()), map))
}

/// A replica following `hive` with a fresh state folder `state`.
fn hive_replica(state: &Path, source: &Path, hive: HiveConfig) -> Res<Replica> {
    let events = state.with_extension("unused-events");
    fs::create_dir_all(&events)?;
    let mut cfg = ReplicaConfig::new(state, source, &events);
    cfg.hive = Some(hive);
    Ok(Replica::start(cfg)?)
}

// ---------------------------------------------------------------------------
// hive-ingest

pub fn bench_ingest(o: &Opts) -> Res<()> {
    let n = o.num("events", 200_000);
    let reps = o.num("reps", 3).max(1);
    let payload = o.num("bytes", 1024) as usize;
    let work = o.work("hive-ingest")?;
    let root = work.path();
    let source = root.join("source");
    fs::create_dir_all(&source)?;
    let rows = root.join("rows.jsonl");
    let mut writer = HiveWriter::new(&rows, &source, None, &root.join("hive-cm"), true)?;

    // A content of its own per file (the id in its first 8 bytes), as in a
    // warehouse: with one content for all, every fetch after the first
    // copied a duplicate and unlinked it, and on a no-journal ext4 each
    // create then scanned past those freshly freed inodes.
    let t = Instant::now();
    let base: Vec<u8> = (0..payload).map(|i| (i * 31 % 251) as u8).collect();
    let content_of = |id: u64| {
        let mut c = base.clone();
        let n = c.len().min(8);
        c[..n].copy_from_slice(&id.to_le_bytes()[..n]);
        c
    };
    const PARTS: u64 = 100;
    for p in 0..PARTS {
        fs::create_dir_all(source.join(format!("ing/t/p={p}")))?;
    }
    let setup = [
        r#"{"id":1,"op":"create_database","db":"ing"}"#.to_string(),
        r#"{"id":2,"op":"create_table","db":"ing","table":"t","partition_keys":["p"]}"#.to_string(),
    ];
    write_rows(&mut writer, setup.into_iter())?;
    let mut lines = Vec::with_capacity(n as usize);
    for k in 0..n {
        let (id, p) = (k + 3, k % PARTS);
        let rel = format!("ing/t/p={p}/f_{id:08}");
        let content = content_of(id);
        fs::write(source.join(&rel), &content)?;
        let sha: String = Sha256::digest(&content)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        lines.push(format!(
            r#"{{"id":{id},"op":"add_files","db":"ing","table":"t","partition":{{"p":"{p}"}},"files":[{{"path":"{rel}","size":{payload},"sha256":"{sha}"}}]}}"#
        ));
    }
    write_rows(&mut writer, lines.into_iter())?;
    let last = StateId(n + 2);
    let rows_bytes = fs::metadata(&rows)?.len();
    eprintln!(
        "hive-ingest: wrote {} rows ({} MiB) in {:.1?}",
        grouped(last.0),
        rows_bytes >> 20,
        t.elapsed()
    );
    sh("sync", &[])?;
    // Warm the rows file: the clock sees stagefs, not the first disk read.
    std::io::copy(&mut File::open(&rows)?, &mut std::io::sink())?;

    let (mut rates, mut states) = (Vec::new(), Vec::new());
    for rep in 0..reps.min(o.num("pipeline-reps", reps)) {
        let state = root.join(format!("state-{rep}"));
        let before = thread_times();
        let cpu = cpu_seconds();
        let started = Instant::now();
        let replica = hive_replica(&state, &source, hive_config(&rows, &writer)?)?;
        let progress = Arc::clone(replica.progress());
        loop {
            if progress.latest.load(Ordering::Relaxed) >= last.0 {
                break;
            }
            if let Some(stall) = replica.status().stalled {
                return Err(format!("replication stalled: {stall:?}").into());
            }
            if started.elapsed() > Duration::from_secs(600) {
                return Err("the journal did not reach the last event in 600 s".into());
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        let secs = started.elapsed().as_secs_f64();
        let cpu_us = (cpu_seconds() - cpu) * 1e6 / last.0 as f64;
        let threads = thread_cpu_by_name(&before, last.0);
        let status = replica.status();
        // The other half of the work: every file staged and the last state
        // visible, so a faster ingest is not bought with slower staging.
        let cpu_journaled = cpu_seconds();
        let all_visible =
            secs + wait_visible(&replica, last, Duration::from_secs(600))?.as_secs_f64();
        let staging_cpu = cpu_seconds() - cpu_journaled;
        let staging_threads = thread_cpu_by_name(&before, last.0);
        replica.stop();
        let rate = last.0 as f64 / secs;
        eprintln!(
            "hive-ingest rep {}: {} events journaled in {secs:.2} s = {rate:.0}/s, process CPU {cpu_us:.1} µs/event \
             with the stager (visible then {}, all visible after {all_visible:.2} s, {staging_cpu:.2} CPU s after journaled; load {}); by thread \
             (CPU µs/event): {threads}; at all visible: {staging_threads}",
            rep + 1,
            grouped(last.0),
            status.visible,
            load1()
        );
        rates.push(rate);
        states.push(state);
    }
    // Removed only now: on an ext4 without a journal (this VM's root),
    // every file created within ~30 s of thousands of deletions scans past
    // the freed inodes (`recently_deleted`), which made the fetch threads'
    // creates cost more CPU than ingest in the next repetition.
    for state in states {
        fs::remove_dir_all(&state)?;
    }
    let decode_threads = o.num("decode-threads", ahead::default_threads() as u64) as usize;
    ingest_thread(&rows, &writer, root, last, decode_threads)?;
    if o.num("breakdown", 1) == 0 {
        return Ok(());
    }
    if rates.is_empty() {
        return breakdown(&rows, &writer, root, last);
    }
    let med = median(rates.clone());
    row(
        "H1. gzip(json-2.0) INSERT rows decoded + validated + journaled (Replica, --hive-events)",
        &format!(
            "{} events/s, median of {reps} (range {}–{}); {} events each",
            grouped(med as u64),
            grouped(rates.iter().copied().fold(f64::INFINITY, f64::min) as u64),
            grouped(rates.iter().copied().fold(0.0, f64::max) as u64),
            grouped(last.0)
        ),
        "≥ 50,000/s",
        Some(med >= 50_000.0),
    );
    breakdown(&rows, &writer, root, last)?;
    note(&format!(
        "hive-ingest: {} rows ({} MiB of JSON Lines) written by HiveWriter: 2 setup rows then INSERT rows \
         (gzip(json-2.0), Thrift-JSON table and partition objects, one {payload}-byte file with an HDFS \
         checksum and cm root each) into 100 partitions of one table; clock from Replica::start until \
         Progress::latest (set after the journal's group fsync) is the last id; the stager runs as in the \
         daemon (4 fetch threads) and competes for the CPU",
        grouped(last.0),
        rows_bytes >> 20
    ));
    Ok(())
}

/// CPU µs per event of each thread name since `before` ([`thread_times`];
/// the fetch threads summed), largest first, each with the µs per event it
/// waited on the run queue (ready but not running: CPU taken by the others).
fn thread_cpu_by_name(before: &BTreeMap<String, (u64, u64)>, events: u64) -> String {
    let mut by_name: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (name, (ns, wait)) in thread_times() {
        let (was, waited) = before.get(&name).copied().unwrap_or((0, 0));
        let name = if name.starts_with("fetch-") {
            "fetch".to_owned()
        } else {
            name
        };
        let e = by_name.entry(name).or_default();
        e.0 += ns.saturating_sub(was);
        e.1 += wait.saturating_sub(waited);
    }
    let mut v: Vec<(String, (u64, u64))> =
        by_name.into_iter().filter(|(_, (ns, _))| *ns > 0).collect();
    v.sort_by_key(|b| std::cmp::Reverse(b.1 .0));
    let per = |ns: u64| ns as f64 / 1e3 / events as f64;
    v.iter()
        .map(|(name, (ns, wait))| format!("{name} {:.1} (waited {:.1})", per(*ns), per(*wait)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// CPU seconds the calling thread has used.
fn thread_cpu_seconds() -> f64 {
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime fills the struct it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// The loop of `replicate::run_ingest` without a stager: `HiveSource::poll`
/// (rows read ahead on their own thread, `rows_ahead`; it hands the rows
/// to its decoding threads, `--decode-threads`,
/// default one per core up to 4), decode + map, validate (one
/// serialisation, hashed and journaled), append, group fsync per poll.
/// Reports events/s and the CPU per event of the ingest thread and of the
/// whole process (decoding threads included).
fn ingest_thread(
    rows: &Path,
    writer: &HiveWriter,
    root: &Path,
    last: StateId,
    decode_threads: usize,
) -> Res<()> {
    let mut cfg = hive_config(rows, writer)?;
    cfg.decode_threads = decode_threads;
    let dir = root.join("ingest-thread-journal");
    let _ = fs::remove_dir_all(&dir);
    let (mut journal, _) = Journal::open(JournalConfig::new(dir.clone()))?;
    let (cpu, thread_cpu, t) = (cpu_seconds(), thread_cpu_seconds(), Instant::now());
    // As the daemon opens it: rows read ahead on their own thread.
    let mut source = HiveSource::open(&cfg, 0)?;
    let mut validator = Validator::new(Arc::new(Tree::empty()));
    let mut n = 0u64;
    let mut syncing = Syncing::new();
    let (mut tpoll, mut tsync, mut tdec) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    loop {
        let t0 = Instant::now();
        if !source.more_ready() {
            syncing.settle(&mut journal)?;
        }
        tsync += t0.elapsed();
        let t0 = Instant::now();
        let batch = source.poll(4096).map_err(|e| format!("{e:?}"))?;
        tpoll += t0.elapsed();
        if batch.is_empty() {
            break;
        }
        for r in &batch {
            let t0 = Instant::now();
            let event = source
                .decode(r, validator.latest())
                .map_err(|e| format!("{e:?}"))?;
            tdec += t0.elapsed();
            let canonical = serde_json::to_vec(&event)?;
            let Verdict::Accepted(acc) = validator
                .check_canonical(event, &canonical, None, None)
                .map_err(|r| r.to_string())?
            else {
                return Err("a duplicate in the generated rows".into());
            };
            let payload = journal_payload(&canonical, &source.position_after(r))?;
            journal.append(acc.event.id, &payload)?;
            n += 1;
        }
        // As run_ingest (replicate::syncer): the batch before is settled,
        // this one's fdatasync runs while the next batch is read.
        let t0 = Instant::now();
        syncing.settle(&mut journal)?;
        syncing.start(&mut journal)?;
        tsync += t0.elapsed();
    }
    syncing.settle(&mut journal)?;
    let secs = t.elapsed().as_secs_f64();

    let per = |s: f64| s * 1e6 / n as f64;
    let (thread_us, process_us) = (
        per(thread_cpu_seconds() - thread_cpu),
        per(cpu_seconds() - cpu),
    );
    drop(source);
    if n != last.0 {
        return Err(format!("ingested {n} events, expected {}", last.0).into());
    }
    let share = |d: Duration| 100.0 * d.as_secs_f64() / secs;
    let text = format!(
        "{} events/s; CPU per event: ingest thread {thread_us:.1} µs, whole process {process_us:.1} µs \
         ({decode_threads} decoding threads; load {}); ingest thread's wall time in poll {:.0} %, \
         decode (waiting for the decoding threads included) {:.0} %, group fsync {:.0} %",
        grouped((n as f64 / secs) as u64),
        load1(),
        share(tpoll),
        share(tdec),
        share(tsync)
    );
    eprintln!("hive-ingest ingest thread + decoding threads, no stager: {text}");
    row(
        "H1. ↳ ingest loop, decoding ahead, no stager",
        &text,
        "≥ 50,000/s",
        None,
    );
    fs::remove_dir_all(&dir)?;
    Ok(())
}

/// The journal fdatasyncs of the ingest loop on their own thread, one batch
/// in flight (what `replicate::syncer` does for `run_ingest`).
struct Syncing {
    jobs: Option<std::sync::mpsc::Sender<SyncTicket>>,
    done: std::sync::mpsc::Receiver<(SyncTicket, std::io::Result<()>)>,
    in_flight: bool,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Syncing {
    fn new() -> Syncing {
        let (jobs, rx) = std::sync::mpsc::channel::<SyncTicket>();
        let (tx, done) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            for t in rx {
                let r = t.sync_data();
                if tx.send((t, r)).is_err() {
                    return;
                }
            }
        });
        Syncing {
            jobs: Some(jobs),
            done,
            in_flight: false,
            thread: Some(thread),
        }
    }

    fn start(&mut self, journal: &mut Journal) -> Res<()> {
        if let (Some(t), Some(jobs)) = (journal.begin_sync()?, &self.jobs) {
            jobs.send(t)?;
            self.in_flight = true;
        }
        Ok(())
    }

    fn settle(&mut self, journal: &mut Journal) -> Res<()> {
        if std::mem::take(&mut self.in_flight) {
            let (t, r) = self.done.recv()?;
            journal.finish_sync(t, r)?;
        }
        Ok(())
    }
}

impl Drop for Syncing {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The ingest steps of `replicate::run_ingest`, on one thread, each timed.
fn breakdown(rows: &Path, writer: &HiveWriter, root: &Path, last: StateId) -> Res<()> {
    let mut file_rows = FileRows::open(rows)?;
    let t = Instant::now();
    let mut all: Vec<NotificationRow> = Vec::with_capacity(last.0 as usize);
    loop {
        let after = all.last().map_or(0, |r| r.event_id);
        let batch = file_rows.poll(after, 4096)?;
        if batch.is_empty() {
            break;
        }
        all.extend(batch);
    }
    let read = t.elapsed();

    let t = Instant::now();
    for r in &all {
        decode_message(r)?;
    }
    let message = t.elapsed();
    let t = Instant::now();
    for r in &all {
        decode_text(
            r.message.as_deref().unwrap_or(""),
            r.message_format.as_deref(),
        )?;
    }
    let gunzip = t.elapsed();

    let cfg = hive_config(rows, writer)?;
    let mut source = HiveSource::new(Box::new(FileRows::open(rows)?), &cfg, 0);
    let mut validator = Validator::new(Arc::new(Tree::empty()));
    let (mut journal, _) = Journal::open(JournalConfig::new(root.join("breakdown-journal")))?;
    let (mut decode, mut validate, mut encode, mut append, mut sync) = (
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
    );
    let total = Instant::now();
    for (i, r) in all.iter().enumerate() {
        let t0 = Instant::now();
        let event = source
            .decode(r, validator.latest())
            .map_err(|e| format!("{e:?}"))?;
        let t1 = Instant::now();
        let Verdict::Accepted(acc) = validator
            .check(event, None, None)
            .map_err(|r| r.to_string())?
        else {
            return Err("a duplicate in the generated rows".into());
        };
        let t2 = Instant::now();
        let entry = JournalEntry {
            event: acc.event,
            next: source.position_after(r),
        };
        let payload = serde_json::to_vec(&entry)?;
        let t3 = Instant::now();
        journal.append(entry.event.id, &payload)?;
        let t4 = Instant::now();
        if (i + 1) % 4096 == 0 || i + 1 == all.len() {
            journal.sync()?;
        }
        let t5 = Instant::now();
        decode += t1 - t0;
        validate += t2 - t1;
        encode += t3 - t2;
        append += t4 - t3;
        sync += t5 - t4;
    }
    let pipeline = total.elapsed();
    let us = |d: Duration| d.as_secs_f64() * 1e6 / all.len() as f64;
    let rate = all.len() as f64 / (read + pipeline).as_secs_f64();
    let text = format!(
        "per event: read+parse row {:.2} µs, decode+map {:.2} µs (of which message decode {:.2} µs, base64+gunzip of it {:.2} µs), \
         validate (Tree::apply) {:.2} µs, journal encode {:.2} µs, append {:.2} µs, group fsync {:.2} µs; \
         one thread, no stager: {} events/s",
        us(read),
        us(decode),
        us(message),
        us(gunzip),
        us(validate),
        us(encode),
        us(append),
        us(sync),
        grouped(rate as u64)
    );
    eprintln!("hive-ingest breakdown: {text}");
    row("H1. ↳ breakdown (one thread)", &text, "—", None);
    Ok(())
}

// ---------------------------------------------------------------------------
// hive-stage

pub fn bench_stage(o: &Opts) -> Res<()> {
    let reps = o.num("reps", 3).max(1);
    let sets = [
        ("small", o.num("small", 10_000), o.num("small-bytes", 4096)),
        ("large", o.num("large", 4), o.num("large-mib", 256) << 20),
    ];
    hash_speeds()?;
    for (label, count, size) in sets {
        if count > 0 {
            stage_set(o, label, count, size, reps)?;
        }
    }
    Ok(())
}

/// Single-thread speed of each hash the stager computes, on 256 MiB in memory.
fn hash_speeds() -> Res<()> {
    let data: Vec<u8> = (0..256u64 << 20)
        .map(|i| ((i * 2_654_435_761) >> 13) as u8)
        .collect();
    let gib = data.len() as f64 / f64::from(1u32 << 30);
    let hex = stagefs::workload::hive_export::hdfs_checksum(&data);
    let time = |f: &dyn Fn()| {
        let t = Instant::now();
        f();
        gib / t.elapsed().as_secs_f64()
    };
    let sha = time(&|| {
        Sha256::digest(&data);
    });
    let hdfs = time(&|| {
        let mut v = ChecksumVerifier::from_hex(&hex).expect("own checksum");
        for c in data.chunks(1 << 20) {
            v.update(c);
        }
        v.finish().expect("matches");
    });
    let crc32c = time(&|| {
        crc32c::crc32c(&data);
    });
    let crc32 = time(&|| {
        crc32fast::hash(&data);
    });
    let text = format!(
        "sha256 {sha:.2} GiB/s, HDFS MD5-of-MD5-of-CRC (CRC32C and CRC32 lanes, 512-byte chunks) {hdfs:.2} GiB/s; \
         whole-buffer CRC32C {crc32c:.2} GiB/s, CRC32 {crc32:.2} GiB/s"
    );
    eprintln!("hive-stage hashes: {text}");
    row(
        "H3. ↳ hash speed, one thread, 256 MiB in memory",
        &text,
        "—",
        None,
    );
    Ok(())
}

fn stage_set(o: &Opts, label: &str, count: u64, size: u64, reps: u64) -> Res<()> {
    let work = o.work(&format!("hive-stage-{label}"))?;
    let root = work.path();
    let src = root.join("src");
    let t = Instant::now();
    let files = write_random_files(&src, count, size)?;
    let rows = root.join("rows.jsonl");
    let mut writer = HiveWriter::new(&rows, &src, None, &root.join("hive-cm"), true)?;
    write_partition_rows(&mut writer, &files)?;
    let last = StateId(count + 2);
    let total_mib = (count * size) as f64 / f64::from(1u32 << 20);
    sh("sync", &[])?;
    eprintln!(
        "hive-stage {label}: wrote {count} × {size} B and their rows in {:.1?}",
        t.elapsed()
    );
    let dest = root.join("dest");
    let state = root.join("state");
    let prepare = || -> Res<()> {
        for d in [&dest, &state] {
            if d.exists() {
                fs::remove_dir_all(d)?;
            }
        }
        sh("sync", &[])?;
        super::warm(&src, &files)?;
        Ok(())
    };
    let (mut cp, mut stage, mut loads) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..reps {
        // Alternate which goes first, so drift hits both alike.
        for which in if rep % 2 == 0 { [0, 1] } else { [1, 0] } {
            prepare()?;
            if which == 0 {
                let r = measure(total_mib, || {
                    sh("cp", &[Path::new("-r"), &src, &dest])?;
                    sh("sync", &[])
                })?;
                cp.push(r);
            } else {
                let cfg = hive_config(&rows, &writer)?;
                let r = measure(total_mib, || {
                    staged_verified(hive_replica(&state, &src, cfg)?, last)
                })?;
                stage.push(r);
            }
        }
        loads.push(load1());
        eprintln!(
            "hive-stage {label} rep {}: cp+sync {:.0} MiB/s, pipeline {:.0} MiB/s (load {})",
            rep + 1,
            cp.last().map_or(0.0, |r| r.0),
            stage.last().map_or(0.0, |r| r.0),
            load1()
        );
    }
    let ratios: Vec<f64> = stage.iter().zip(&cp).map(|(s, c)| s.0 / c.0).collect();
    let mibs = |v: &[(f64, f64)]| v.iter().map(|r| r.0).collect::<Vec<_>>();
    let cpu = |v: &[(f64, f64)]| median(v.iter().map(|r| r.1).collect());
    let files_s = |v: &[(f64, f64)]| {
        v.iter()
            .map(|r| r.0 / total_mib * count as f64)
            .collect::<Vec<_>>()
    };
    let what = format!("{} × {}", grouped(count), human(size));
    row(
        &format!("H3. `cp -r` + `sync`, {what}"),
        &format!(
            "{} MiB/s = {} files/s ({:.2} CPU-s/GiB)",
            spread(&mibs(&cp), 0),
            spread(&files_s(&cp), 0),
            cpu(&cp)
        ),
        "baseline",
        None,
    );
    let ratio = median(ratios.clone());
    row(
        &format!("H3. Hive staging with sha256 + HDFS checksum (Replica pipeline), {what}"),
        &format!(
            "{} MiB/s = {} files/s ({:.2} CPU-s/GiB); per run / cp+sync of the same repetition: {}",
            spread(&mibs(&stage), 0),
            spread(&files_s(&stage), 0),
            cpu(&stage),
            spread(&ratios, 2)
        ),
        "≥ 0.8× cp+sync",
        Some(ratio >= 0.8),
    );
    note(&format!(
        "hive-stage {label}: {what} pseudo-random files, one INSERT row each (gzip(json-2.0), HDFS checksum \
         and cm root in the URI); median of {reps} interleaved repetitions (range in parentheses); before every \
         run the destination and state are removed, `sync`, and every source file read once; the pipeline's \
         clock runs from Replica::start until visible is the last id (every file copied, sha256 and HDFS \
         checksum verified, fdatasynced, renamed, commit record fsynced); load average after each repetition: {}",
        loads.join(", ")
    ));
    Ok(())
}

fn human(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}
