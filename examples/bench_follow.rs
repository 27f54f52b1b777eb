//! Many hosts (docs/BENCHMARKS.md, "Many hosts"): how fast a reader host
//! follows a publisher, and what a large published state costs a reader.
//!
//!     bench_follow latency --bin target/release/stagefs --work DIR
//!                  [--poll-ms 1000] [--rate 100] [--seconds 30]
//!
//! A publishing mount (`stagefs mount … --publish file://DIR/published`)
//! replicates a workload written at `--rate` events/s (one state each);
//! a reader host (`stagefs mount --from URL --poll-ms N`) follows it. Two
//! threads read `user.stagefs.visible` of both mounts every 2 ms; a state's
//! latency is the first time the reader shows it (or a newer one) minus
//! the first time the publisher showed it.
//!
//!     bench_follow catalog --bin target/release/stagefs --work DIR
//!                  [--parts 1000] [--files 1000]
//!
//! A state of parts × files files (one table): the catalog's resident
//! memory per file as the publisher holds it (built from events, as
//! replication does; the same method as `bench_core memory`), published
//! to `file://` in this process, then a reader's: the loader of a reader
//! host in a child process of this binary (`load-probe`, RSS growth per
//! file and load time), and a real reader host (`stagefs mount --from`):
//! time from its start to the state visible, and its whole resident
//! memory. Then one file is added to one partition and published: the
//! bytes the reader host reads from the URL to show it (its status
//! `catalog.fetched_bytes`, state record and catalog objects) and when
//! the new file is read (`cache.fetched_bytes`). Every file of the big
//! state has the same 1-byte content (one blob at the URL instead of
//! a million): the catalog, which is what is measured, names each file
//! with its own entry all the same.
//!
//! Prints `ROW|figure|value|goal|met` and `NOTE|…` lines.

#[path = "bench_common/mod.rs"]
mod bench_common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bench_common::{arg, percentile};
use sha2::{Digest, Sha256};
use stagefs::catalog::Tree;
use stagefs::event::{BlobId, Change, Event, FileRef, Op, StateId};
use stagefs::publish::gc::GcConfig;
use stagefs::publish::load::{get_record, Loader};
use stagefs::publish::record::RecordKind;
use stagefs::publish::{layout, open_store, PublishConfig, Publisher};
use stagefs::workload::{Workload, WorkloadConfig};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("latency") => latency(&args[2..]),
        Some("catalog") => catalog(&args[2..]),
        Some("load-probe") => load_probe(&args[2..]),
        _ => Err("usage: bench_follow latency|catalog --bin STAGEFS --work DIR [...]".into()),
    };
    if let Err(e) = result {
        eprintln!("bench_follow: {e}");
        std::process::exit(1);
    }
}

fn num(args: &[String], name: &str, default: u64) -> Res<u64> {
    arg(args, name).map_or(Ok(default), |v| {
        v.parse()
            .map_err(|_| format!("{name} {v}: not a number").into())
    })
}

fn required<'a>(args: &'a [String], name: &str) -> Res<&'a str> {
    arg(args, name).ok_or_else(|| format!("{name} is required").into())
}

fn row(figure: &str, value: &str, goal: &str, met: Option<bool>) {
    let met = met.map_or("—", |m| if m { "yes" } else { "no" });
    println!("ROW|{figure}|{value}|{goal}|{met}");
}

fn note(s: &str) {
    println!("NOTE|{s}");
}

/// `user.stagefs.visible` of a mount root, or 0 when unreadable.
fn visible(mnt: &CString) -> u64 {
    bench_common::visible(mnt, &CString::from(c"user.stagefs.visible"))
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).expect("a path without NUL")
}

/// A `stagefs mount` child: SIGTERM (it unmounts) and reaped on drop.
struct Mount {
    child: Child,
    mnt: PathBuf,
}

impl Mount {
    fn start(bin: &str, mnt: &Path, args: &[String], log: &Path) -> Res<Mount> {
        std::fs::create_dir_all(mnt)?;
        let child = Command::new(bin)
            .arg("mount")
            .arg(mnt)
            .args(args)
            .env("STAGEFS_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()?;
        let m = Mount {
            child,
            mnt: mnt.to_owned(),
        };
        let start = Instant::now();
        while !mounted(mnt) {
            if start.elapsed() > Duration::from_secs(60) {
                return Err(
                    format!("{} did not mount; see {}", mnt.display(), log.display()).into(),
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(m)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_visible(&self, id: u64, timeout: Duration) -> Res<Duration> {
        let c = cpath(&self.mnt);
        let start = Instant::now();
        while visible(&c) < id {
            if start.elapsed() > timeout {
                return Err(format!("{} did not reach {id}", self.mnt.display()).into());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(start.elapsed())
    }

    fn status(&self) -> Res<serde_json::Value> {
        Ok(serde_json::from_slice(&std::fs::read(
            self.mnt.join(".stagefs/status"),
        )?)?)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn mounted(mnt: &Path) -> bool {
    let Ok(canon) = mnt.canonicalize() else {
        return false;
    };
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| {
        m.lines().any(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|p| Path::new(&stagefs::daemon::unescape_mountinfo(p)) == canon)
        })
    })
}

/// Records the first time a mount showed each visible state-id.
fn watch(mnt: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<(u64, Instant)>> {
    std::thread::spawn(move || {
        let c = cpath(&mnt);
        let mut seen = Vec::new();
        let mut last = 0;
        while !stop.load(Ordering::Relaxed) {
            let v = visible(&c);
            if v > last {
                seen.push((v, Instant::now()));
                last = v;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        seen
    })
}

/// When a mount first showed `id` or a newer state.
fn first_at_least(seen: &[(u64, Instant)], id: u64) -> Option<Instant> {
    seen.iter().find(|(v, _)| *v >= id).map(|(_, t)| *t)
}

fn latency(args: &[String]) -> Res<()> {
    let bin = required(args, "--bin")?;
    let work = PathBuf::from(required(args, "--work")?);
    let poll_ms = num(args, "--poll-ms", 1000)?;
    let rate = num(args, "--rate", 100)?.max(1);
    let seconds = num(args, "--seconds", 30)?;
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let mut w = Workload::new(
        &work.join("src"),
        WorkloadConfig {
            seed: 7,
            min_file_bytes: 64,
            max_file_bytes: 4096,
            ..WorkloadConfig::default()
        },
    )?;
    for _ in 0..20 {
        w.step()?;
    }
    let url = format!("file://{}", work.join("published").display());
    let s = |p: PathBuf| p.display().to_string();
    let publisher = Mount::start(
        bin,
        &work.join("pub/mnt"),
        &[
            "--state".into(),
            s(work.join("pub/state")),
            "--source-root".into(),
            s(w.source_root()),
            "--events".into(),
            s(w.events_dir()),
            "--cm-root".into(),
            s(w.cm_root()),
            "--publish".into(),
            url.clone(),
        ],
        &work.join("publisher.log"),
    )?;
    publisher.wait_visible(w.latest().0, Duration::from_secs(60))?;
    let reader = Mount::start(
        bin,
        &work.join("reader/mnt"),
        &[
            "--from".into(),
            url,
            "--cache".into(),
            s(work.join("reader/cache")),
            "--poll-ms".into(),
            poll_ms.to_string(),
        ],
        &work.join("reader.log"),
    )?;
    reader.wait_visible(w.latest().0, Duration::from_secs(60))?;

    let stop = Arc::new(AtomicBool::new(false));
    let pub_watch = watch(publisher.mnt.clone(), Arc::clone(&stop));
    let reader_watch = watch(reader.mnt.clone(), Arc::clone(&stop));
    let first = w.latest().0 + 1;
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let start = Instant::now();
    let n = seconds * rate;
    for i in 0..n {
        let due = start + period * i as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        w.step()?;
    }
    let written = start.elapsed();
    let last = w.latest().0;
    publisher.wait_visible(last, Duration::from_secs(120))?;
    reader.wait_visible(last, Duration::from_secs(120))?;
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    let pub_seen = pub_watch.join().map_err(|_| "watcher panicked")?;
    let reader_seen = reader_watch.join().map_err(|_| "watcher panicked")?;
    let mut lat = Vec::new();
    for id in first..=last {
        let (Some(p), Some(r)) = (
            first_at_least(&pub_seen, id),
            first_at_least(&reader_seen, id),
        ) else {
            continue;
        };
        lat.push(r.saturating_duration_since(p).as_secs_f64() * 1000.0);
    }
    lat.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&lat, 50.0), percentile(&lat, 99.0));
    let max = lat.last().copied().unwrap_or(f64::NAN);
    let pub_states = pub_seen.iter().filter(|(v, _)| *v >= first).count();
    let reader_states = reader_seen.iter().filter(|(v, _)| *v >= first).count();
    note(&format!(
        "{} events in {:.1} s ({:.0}/s); states {first}..={last}; the publisher's mount showed {pub_states} distinct states, the reader host {reader_states}; {} latencies",
        n,
        written.as_secs_f64(),
        n as f64 / written.as_secs_f64(),
        lat.len()
    ));
    row(
        &format!("publisher visible → reader visible, --poll-ms {poll_ms}, {rate} events/s: p50 / p99 / max"),
        &format!("{p50:.0} / {p99:.0} / {max:.0} ms"),
        &format!("p50 ≤ {} ms", poll_ms + 50),
        Some(p50 <= (poll_ms + 50) as f64),
    );
    drop(reader);
    drop(publisher);
    Ok(())
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    pages * page
}

/// A field of `/proc/<pid>/status` given in kB (`VmRSS`, `RssAnon`,
/// `RssFile`), bytes.
fn status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// VmRSS of process `pid`, bytes.
fn rss_of(pid: u32) -> u64 {
    status_kb(pid, "VmRSS")
}

const CONTENT: &[u8] = b"x";

fn content_id() -> BlobId {
    BlobId(Sha256::digest(CONTENT).into())
}

fn event(id: u64, op: Op) -> Event {
    Event {
        id: StateId(id),
        time_ms: Some(1_700_000_000_000 + id as i64),
        changes: vec![Change::new(op, "db", "t")],
    }
}

fn add_files(id: u64, part: u64, files: impl Iterator<Item = u64>) -> Event {
    let mut e = event(id, Op::AddFiles);
    e.changes[0].partition = Some(BTreeMap::from([("p".to_owned(), format!("v{part}"))]));
    e.changes[0].files = files
        .map(|f| {
            let name = format!("{f:06}_0");
            FileRef::native(
                &format!("db/t/p=v{part}/{name}"),
                &name,
                CONTENT.len() as u64,
                content_id(),
            )
        })
        .collect();
    e
}

/// One table `db.t` of `parts` partitions × `files` files, built in
/// events of at most 1000 files (as replication builds it).
fn build_tree(parts: u64, files: u64) -> Res<Tree> {
    let mut tree = Tree::empty();
    let mut id = 1;
    tree = tree.apply(&event(id, Op::CreateDatabase))?.0;
    id += 1;
    let mut ct = event(id, Op::CreateTable);
    ct.changes[0].partition_keys = vec!["p".into()];
    tree = tree.apply(&ct)?.0;
    for p in 0..parts {
        let mut f = 0;
        while f < files {
            let batch = (files - f).min(1000);
            id += 1;
            tree = tree.apply(&add_files(id, p, f..f + batch))?.0;
            f += batch;
        }
    }
    Ok(tree)
}

/// Waits until the publisher's HEAD names `id`.
fn wait_published(p: &Publisher, id: StateId) -> Res<Duration> {
    let start = Instant::now();
    loop {
        let r = p.report();
        if r.published == Some(id) {
            return Ok(start.elapsed());
        }
        if r.fatal || start.elapsed() > Duration::from_secs(1800) {
            return Err(format!("publishing {id}: {:?}", r.error).into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn catalog(args: &[String]) -> Res<()> {
    let bin = required(args, "--bin")?;
    let work = PathBuf::from(required(args, "--work")?);
    let parts = num(args, "--parts", 1000)?;
    let files = num(args, "--files", 1000)?;
    let n = parts * files;
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("pubstate"))?;
    let blob = work.join("blob");
    std::fs::write(&blob, CONTENT)?;

    // The publisher's catalog.
    let before = rss_bytes();
    let t = Instant::now();
    let tree = Arc::new(build_tree(parts, files)?);
    let built = t.elapsed();
    let publisher_per_file = rss_bytes().saturating_sub(before) as f64 / n as f64;
    note(&format!(
        "{n} files built in {:.1} s; publisher catalog {publisher_per_file:.0} B/file",
        built.as_secs_f64()
    ));

    // Published to file://.
    let url = format!("file://{}", work.join("published").display());
    let current = Arc::new(Mutex::new(Arc::clone(&tree)));
    let publisher = {
        let current = Arc::clone(&current);
        Publisher::start(
            PublishConfig {
                url: url.clone(),
                signing_key: None,
                state_dir: work.join("pubstate"),
                gc: GcConfig {
                    retain: 16,
                    grace: Duration::from_secs(600),
                },
                held: None,
            },
            Arc::new(move || Arc::clone(&current.lock().unwrap_or_else(|p| p.into_inner()))),
            Arc::new(move |_: &BlobId| blob.clone()),
        )?
    };
    let took = wait_published(&publisher, tree.state_id)?;
    let r = publisher.report();
    note(&format!(
        "published state {} in {:.1} s: {} objects, {} bytes",
        tree.state_id,
        took.as_secs_f64(),
        r.objects_written,
        r.bytes_written
    ));
    let catalog_bytes = r.bytes_written - CONTENT.len() as u64;

    // A reader's loader, in a process of its own (its RSS growth alone).
    let out = Command::new(std::env::current_exe()?)
        .args(["load-probe", "--url", &url, "--files", &n.to_string()])
        .output()?;
    if !out.status.success() {
        return Err(format!("load-probe: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let probe = String::from_utf8(out.stdout)?;
    let field = |k: &str| -> Res<f64> {
        probe
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("load-probe printed no {k}: {probe}").into())
    };
    let (load_s, reader_per_file) = (field("load_s")?, field("bytes_per_file")?);
    let trimmed = field("trimmed_per_file")?;
    let ratio = reader_per_file / publisher_per_file;
    row(
        &format!("reader catalog load of {n} files (the reader's loader alone, objects in the page cache)"),
        &format!("{load_s:.2} s"),
        "—",
        None,
    );
    row(
        &format!("reader memory per file, {parts} × {files} files, vs the publisher's catalog"),
        &format!(
            "{reader_per_file:.0} B vs {publisher_per_file:.0} B ({ratio:.2}×; after malloc_trim {trimmed:.0} B)"
        ),
        "≤ 2×",
        Some(ratio <= 2.0),
    );
    note(&format!(
        "published catalog objects: {catalog_bytes} bytes ({:.0} B/file)",
        catalog_bytes as f64 / n as f64
    ));

    // A real reader host.
    let t = Instant::now();
    let reader = Mount::start(
        bin,
        &work.join("reader/mnt"),
        &[
            "--from".into(),
            url.clone(),
            "--cache".into(),
            work.join("reader/cache").display().to_string(),
            "--poll-ms".into(),
            "100".into(),
        ],
        &work.join("reader.log"),
    )?;
    reader.wait_visible(tree.state_id.0, Duration::from_secs(600))?;
    let to_visible = t.elapsed();
    let host_rss = rss_of(reader.pid());
    // The load's transient memory, freed by then, is returned to the
    // system after the allocator's purge delay (mimalloc's, ~1 s): what
    // the host keeps is measured once that has passed.
    std::thread::sleep(Duration::from_secs(3));
    let settled = |field| status_kb(reader.pid(), field) >> 20;
    row(
        &format!("reader host: start → state of {n} files visible (--poll-ms 100)"),
        &format!(
            "{:.2} s; resident {} MiB when it shows, {} MiB 3 s later ({} MiB anonymous, {} MiB of mapped files)",
            to_visible.as_secs_f64(),
            host_rss >> 20,
            settled("VmRSS"),
            settled("RssAnon"),
            settled("RssFile")
        ),
        "—",
        None,
    );
    let s0 = reader.status()?;

    // One file added to one partition.
    let part = parts / 2;
    let next_id = tree.state_id.0 + 1;
    let (next, _) = tree.apply(&add_files(next_id, part, std::iter::once(900_000)))?;
    let next = Arc::new(next);
    let written_before = publisher.report();
    *current.lock().unwrap_or_else(|p| p.into_inner()) = Arc::clone(&next);
    wait_published(&publisher, next.state_id)?;
    let written_after = publisher.report();
    let t = Instant::now();
    reader.wait_visible(next_id, Duration::from_secs(120))?;
    let followed = t.elapsed();
    let s1 = reader.status()?;
    let delta = |a: &serde_json::Value, b: &serde_json::Value, k: &str, f: &str| {
        b[k][f].as_u64().unwrap_or(0) - a[k][f].as_u64().unwrap_or(0)
    };
    let cat_objects = delta(&s0, &s1, "catalog", "fetched");
    let cat_bytes = delta(&s0, &s1, "catalog", "fetched_bytes");
    let new_file = reader.mnt.join(format!("db/t/p=v{part}/{:06}_0", 900_000));
    let read = std::fs::read(&new_file)?;
    assert_eq!(read, CONTENT);
    let s2 = reader.status()?;
    let content_bytes = delta(&s1, &s2, "cache", "fetched_bytes");
    row(
        &format!("bytes a reader host reads for a commit adding 1 file to 1 of {parts} partitions ({n} files)"),
        &format!(
            "{:.1} KB in {cat_objects} objects (state record + catalogs), + {content_bytes} B of content when the file is read; the publisher wrote {} objects, {} bytes",
            cat_bytes as f64 / 1000.0,
            written_after.objects_written - written_before.objects_written,
            written_after.bytes_written - written_before.bytes_written,
        ),
        "O(change): ≪ the state's catalog",
        Some(cat_bytes * 20 < catalog_bytes),
    );
    note(&format!(
        "the whole state's catalog is {:.1} MB; followed in {} ms after publishing",
        catalog_bytes as f64 / 1e6,
        followed.as_millis()
    ));
    drop(reader);
    publisher.stop();
    Ok(())
}

/// Loads the state HEAD names at `--url` and prints its load time and the
/// resident memory it grew by, per file.
fn load_probe(args: &[String]) -> Res<()> {
    let url = required(args, "--url")?;
    let files = num(args, "--files", 1)?.max(1);
    let store = open_store(url)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let head = rt
        .block_on(get_record(&*store, &layout::head(), RecordKind::Head, None))?
        .published;
    let before = rss_bytes();
    let t = Instant::now();
    let mut loader = Loader::new();
    let tree = rt.block_on(loader.load(&*store, head.state_id, head.time_ms, head.root))?;
    let took = t.elapsed();
    let grown = rss_bytes().saturating_sub(before);
    // SAFETY: malloc_trim only returns free heap memory to the kernel.
    unsafe { libc::malloc_trim(0) };
    let trimmed = rss_bytes().saturating_sub(before);
    let mut count = 0u64;
    tree.for_each_file(&mut |_| count += 1);
    if count != files {
        return Err(format!("loaded {count} files, expected {files}").into());
    }
    println!(
        "load_s={:.3} bytes_per_file={:.1} trimmed_per_file={:.1}",
        took.as_secs_f64(),
        grown as f64 / files as f64,
        trimmed as f64 / files as f64
    );
    Ok(())
}
