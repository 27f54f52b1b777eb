//! Helper for `scripts/bench/run.sh` (the mount benchmarks): generates the
//! benchmark data set, times open+read of many small files, and measures
//! replication lag (event appended → visible through the mount).
//!
//!     bench_mount gen ROOT [--big-mib N] [--small N] [--small-bytes B]
//!                          [--small-per-dir N] [--meta N] [--meta-per-dir N]
//!     bench_mount readfiles BASE LIST [--at DIR]  prints "secs files bytes"
//!     bench_mount lag MNT EVENTS SOURCE [--rates 100,1000] [--seconds S]
//!                                        [--poll-us U]
//!
//! `gen` writes ROOT/source/bench/{big,small,meta}/..., the event log
//! ROOT/events/log-000001.jsonl that describes exactly those files (one
//! `add_files` per directory), ROOT/lists/small.txt (paths of the small
//! files relative to a mount root) and ROOT/big.sha256. The source tree has
//! the same layout as the mount (db/table/p=value/file), so other
//! filesystems mount ROOT/source and serve the same paths.
//!
//! `lag` expects a stagefs daemon already mounted at MNT following EVENTS
//! (empty) with SOURCE as its source root. It creates database `lag`, table
//! `t`, then for each rate appends one `add_files` event (one fresh small
//! file) at that pace for S seconds, while a second thread polls the root's
//! `user.stagefs.visible` with getxattr every U µs. Lag of an event = time
//! its line was appended → first poll that sees visible ≥ its id.

#[path = "bench_common/mod.rs"]
mod bench_common;

use bench_common::{arg, percentile, visible};
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

fn usage() -> ! {
    eprintln!(
        "usage: bench_mount gen ROOT [opts] | readfiles BASE LIST | lag MNT EVENTS SOURCE [opts]"
    );
    std::process::exit(2)
}

/// `--name value` options after the positional arguments.
fn opt(args: &[String], name: &str, default: u64) -> u64 {
    arg(args, name)
        .map(|v| v.parse().unwrap_or_else(|_| usage()))
        .unwrap_or(default)
}

fn opt_str(args: &[String], name: &str, default: &str) -> String {
    arg(args, name).unwrap_or(default).to_string()
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// xorshift64*: deterministic filler bytes.
struct Rng(u64);
impl Rng {
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

fn file_json(path: &str, size: u64, sha: &str) -> String {
    format!(r#"{{"path":"{path}","size":{size},"sha256":"{sha}"}}"#)
}

fn gen(args: &[String]) -> std::io::Result<()> {
    let root = PathBuf::from(args.first().unwrap_or_else(|| usage()));
    let big_mib = opt(args, "--big-mib", 1024);
    let small = opt(args, "--small", 10_000);
    let small_bytes = opt(args, "--small-bytes", 4096) as usize;
    let small_per_dir = opt(args, "--small-per-dir", 100).max(1);
    let meta = opt(args, "--meta", 100_000);
    let meta_per_dir = opt(args, "--meta-per-dir", 1000).max(1);
    let src = root.join("source");
    for d in ["source", "events", "lists"] {
        fs::create_dir_all(root.join(d))?;
    }
    let mut log = File::create(root.join("events/log-000001.jsonl"))?;
    let mut id = 0u64;
    let mut emit = |line: String| -> std::io::Result<()> {
        id += 1;
        writeln!(log, r#"{{"id":{id},{line}}}"#)
    };
    emit(r#""op":"create_database","db":"bench""#.into())?;
    emit(r#""op":"create_table","db":"bench","table":"big""#.into())?;
    emit(r#""op":"create_table","db":"bench","table":"small","partition_keys":["p"]"#.into())?;
    emit(r#""op":"create_table","db":"bench","table":"meta","partition_keys":["p"]"#.into())?;

    // One big file of pseudo-random bytes.
    let rel = "bench/big/data.bin";
    fs::create_dir_all(src.join("bench/big"))?;
    let mut f = File::create(src.join(rel))?;
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..big_mib {
        rng.fill(&mut buf);
        hasher.update(&buf);
        f.write_all(&buf)?;
    }
    f.sync_all()?;
    let big_sha = hex(&hasher.finalize());
    fs::write(root.join("big.sha256"), format!("{big_sha}\n"))?;
    emit(format!(
        r#""op":"add_files","db":"bench","table":"big","files":[{}]"#,
        file_json(rel, big_mib << 20, &big_sha)
    ))?;

    // Small files, each with distinct content (distinct blobs when staged).
    let mut list = String::new();
    let mut content = vec![0u8; small_bytes];
    let mut batch: Vec<String> = Vec::new();
    let mut dir_no = 0u64;
    let flush = |batch: &mut Vec<String>,
                 table: &str,
                 dir_no: u64,
                 emit: &mut dyn FnMut(String) -> std::io::Result<()>|
     -> std::io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let line = format!(
            r#""op":"add_files","db":"bench","table":"{table}","partition":{{"p":"{dir_no:04}"}},"files":[{}]"#,
            batch.join(",")
        );
        batch.clear();
        emit(line)
    };
    for i in 0..small {
        let d = i / small_per_dir;
        if d != dir_no && !batch.is_empty() {
            flush(&mut batch, "small", dir_no, &mut emit)?;
        }
        dir_no = d;
        let rel = format!("bench/small/p={d:04}/f{i:07}");
        let path = src.join(&rel);
        if i % small_per_dir == 0 {
            fs::create_dir_all(path.parent().expect("has a parent"))?;
        }
        rng.fill(&mut content);
        let head = format!("small file {i}\n");
        let n = head.len().min(content.len());
        content[..n].copy_from_slice(&head.as_bytes()[..n]);
        fs::write(&path, &content)?;
        batch.push(file_json(
            &rel,
            small_bytes as u64,
            &hex(&Sha256::digest(&content)),
        ));
        list.push_str(&rel);
        list.push('\n');
    }
    flush(&mut batch, "small", dir_no, &mut emit)?;
    fs::write(root.join("lists/small.txt"), list)?;

    // Metadata files: identical content (one blob), many names.
    let meta_content = b"stagefs metadata benchmark file\n";
    let meta_sha = hex(&Sha256::digest(meta_content));
    dir_no = 0;
    for i in 0..meta {
        let d = i / meta_per_dir;
        if d != dir_no && !batch.is_empty() {
            flush(&mut batch, "meta", dir_no, &mut emit)?;
        }
        dir_no = d;
        let rel = format!("bench/meta/p={d:04}/m{i:07}");
        let path = src.join(&rel);
        if i % meta_per_dir == 0 {
            fs::create_dir_all(path.parent().expect("has a parent"))?;
        }
        fs::write(&path, meta_content)?;
        batch.push(file_json(&rel, meta_content.len() as u64, &meta_sha));
    }
    flush(&mut batch, "meta", dir_no, &mut emit)?;
    log.sync_all()?;
    println!("{id}");
    Ok(())
}

fn readfiles(args: &[String]) -> std::io::Result<()> {
    let (Some(base), Some(list)) = (args.first(), args.get(1)) else {
        usage()
    };
    // `--at DIR`: open DIR (relative to BASE) once and every file with
    // openat relative to it, as a reader working inside a table does.
    let at = opt_str(args, "--at", "");
    let base = PathBuf::from(base);
    let lines: Vec<String> = fs::read_to_string(list)?
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    let prefix = format!("{}/", at.trim_end_matches('/'));
    let rel: Vec<CString> = if at.is_empty() {
        Vec::new()
    } else {
        lines
            .iter()
            .map(|l| {
                let r = l.strip_prefix(&prefix).unwrap_or_else(|| {
                    eprintln!("{l} is not under {at}");
                    std::process::exit(2)
                });
                CString::new(r).expect("path without NUL")
            })
            .collect()
    };
    let paths: Vec<PathBuf> = lines.iter().map(|l| base.join(l)).collect();
    let dir = if at.is_empty() {
        None
    } else {
        Some(File::open(base.join(&at))?)
    };
    let mut buf = vec![0u8; 1 << 16];
    let start = Instant::now();
    let mut bytes = 0u64;
    for (i, p) in paths.iter().enumerate() {
        let mut f = match &dir {
            None => File::open(p)?,
            Some(d) => {
                use std::os::unix::io::{AsRawFd, FromRawFd};
                // SAFETY: a valid directory fd and NUL-terminated path.
                let fd = unsafe { libc::openat(d.as_raw_fd(), rel[i].as_ptr(), libc::O_RDONLY) };
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // SAFETY: fd was just opened and is owned here.
                unsafe { File::from_raw_fd(fd) }
            }
        };
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            bytes += n as u64;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!("{secs:.6} {} {bytes}", paths.len());
    Ok(())
}

fn wait_visible(mnt: &CString, name: &CString, id: u64, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if visible(mnt, name) >= id {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

fn lag(args: &[String]) -> std::io::Result<()> {
    let (Some(mnt), Some(events), Some(source)) = (args.first(), args.get(1), args.get(2)) else {
        usage()
    };
    let rates: Vec<u64> = opt_str(args, "--rates", "100,1000")
        .split(',')
        .map(|r| r.parse().unwrap_or_else(|_| usage()))
        .collect();
    let seconds = opt(args, "--seconds", 10);
    let poll = Duration::from_micros(opt(args, "--poll-us", 500));
    let payload = opt(args, "--bytes", 4096) as usize;
    // Per-event timeline: "rate k append_ms lag_ms" lines (for analysis).
    let mut dump = args
        .iter()
        .position(|a| a == "--dump")
        .and_then(|i| args.get(i + 1))
        .map(File::create)
        .transpose()?;
    let mnt_c = CString::new(Path::new(mnt).as_os_str().as_bytes()).expect("no NUL");
    let name_c = CString::new("user.stagefs.visible").expect("no NUL");
    let source = PathBuf::from(source);
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(Path::new(events).join("log-000001.jsonl"))?;
    let mut id = 0u64;
    for line in [
        r#""op":"create_database","db":"lag""#,
        r#""op":"create_table","db":"lag","table":"t","partition_keys":["p"]"#,
    ] {
        id += 1;
        log.write_all(format!("{{\"id\":{id},{line}}}\n").as_bytes())?;
    }
    if !wait_visible(&mnt_c, &name_c, id, Duration::from_secs(30)) {
        eprintln!("lag: the mount never showed state {id}");
        std::process::exit(1);
    }
    let mut rng = Rng(0xfeed_beef_0000_0001);
    let mut content = vec![0u8; payload];
    for rate in rates {
        let n = (rate * seconds) as usize;
        let first_id = id + 1;
        // The source files exist before their events (as at a real source:
        // files first, then the metastore commit), so the timed loop only
        // appends lines.
        let mut lines = Vec::with_capacity(n);
        for k in 0..n {
            id += 1;
            let p = k % 100;
            let rel = format!("lag/t/p={p}/r{rate}_{id:08}");
            let path = source.join(&rel);
            if k < 100 {
                fs::create_dir_all(path.parent().expect("has a parent"))?;
            }
            rng.fill(&mut content);
            fs::write(&path, &content)?;
            let sha = hex(&Sha256::digest(&content));
            lines.push(format!(
                "{{\"id\":{id},\"op\":\"add_files\",\"db\":\"lag\",\"table\":\"t\",\"partition\":{{\"p\":\"{p}\"}},\"files\":[{}]}}\n",
                file_json(&rel, payload as u64, &sha)
            ));
        }
        // Append time of each event, ns since `base` (+1 so 0 = not yet).
        let appended: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
        let done = Arc::new(AtomicBool::new(false));
        let base = Instant::now();
        let poller = {
            let appended = Arc::clone(&appended);
            let done = Arc::clone(&done);
            let (mnt_c, name_c) = (mnt_c.clone(), name_c.clone());
            std::thread::spawn(move || {
                let mut lags = Vec::with_capacity(n);
                let mut timeline = Vec::with_capacity(n);
                let mut cursor = 0usize;
                let mut polls = 0u64;
                let mut drain_deadline: Option<Instant> = None;
                while cursor < n {
                    let v = visible(&mnt_c, &name_c);
                    polls += 1;
                    let now = base.elapsed().as_nanos() as u64;
                    while cursor < n && first_id + cursor as u64 <= v {
                        let t = appended[cursor].load(Ordering::SeqCst);
                        // t == 0 cannot happen: the time is stored before
                        // the line is written.
                        let t = t.saturating_sub(1);
                        lags.push(now.saturating_sub(t) as f64 / 1e6);
                        timeline.push((t as f64 / 1e6, now.saturating_sub(t) as f64 / 1e6));
                        cursor += 1;
                    }
                    if done.load(Ordering::SeqCst) {
                        let d = *drain_deadline
                            .get_or_insert_with(|| Instant::now() + Duration::from_secs(60));
                        if Instant::now() > d {
                            break;
                        }
                    }
                    std::thread::sleep(poll);
                }
                (lags, polls, timeline)
            })
        };
        let period = Duration::from_secs_f64(1.0 / rate as f64);
        let start = Instant::now();
        let mut behind_max = Duration::ZERO;
        for k in 0..n {
            let due = start + period * k as u32;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            } else {
                behind_max = behind_max.max(now - due);
            }
            let line = &lines[k];
            appended[k].store(base.elapsed().as_nanos() as u64 + 1, Ordering::SeqCst);
            log.write_all(line.as_bytes())?;
        }
        let wrote = start.elapsed().as_secs_f64();
        done.store(true, Ordering::SeqCst);
        let (mut lags, polls, timeline) = poller.join().expect("poller");
        if let Some(f) = dump.as_mut() {
            for (k, (at, lag)) in timeline.iter().enumerate() {
                writeln!(f, "{rate} {k} {at:.3} {lag:.3}")?;
            }
        }
        let seen = lags.len();
        lags.sort_by(|a, b| a.total_cmp(b));
        println!(
            "rate={rate} events={n} seen={seen} achieved_rate={:.0} p50_ms={:.1} p90_ms={:.1} p99_ms={:.1} max_ms={:.1} producer_behind_max_ms={:.1} polls={polls}",
            n as f64 / wrote,
            percentile(&lags, 50.0),
            percentile(&lags, 90.0),
            percentile(&lags, 99.0),
            lags.last().copied().unwrap_or(f64::NAN),
            behind_max.as_secs_f64() * 1e3,
        );
        // Let the daemon settle between rates.
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else { usage() };
    let rest = &args[1..];
    let r = match cmd.as_str() {
        "gen" => gen(rest),
        "readfiles" => readfiles(rest),
        "lag" => lag(rest),
        _ => usage(),
    };
    if let Err(e) = r {
        eprintln!("bench_mount {cmd}: {e}");
        std::process::exit(1);
    }
}
