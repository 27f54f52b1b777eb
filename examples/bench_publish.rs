//! Group durability cost of `BlobStore::publish` (docs/BENCHMARKS.md,
//! "Blob group durability"): the time from "N verified copies wait in
//! `blobs/tmp/`" to "all N are durably at their blob paths".
//!
//! Compares, in the same run and interleaved rep by rep (so both see the
//! same machine load):
//! - `syncfs`: the strategy main used — one `syncfs` for the data of every
//!   temp file, the renames, a second `syncfs` for the renames (reproduced
//!   here on the same layout, as the library no longer has it);
//! - `fdatasync`: the library's `BlobStore::publish` — `fdatasync` of each
//!   temp file through its own descriptor on up to `PUBLISH_SYNC_THREADS`
//!   threads, the renames, one fsync per touched fan-out directory.
//!
//! With `--noise`, a background thread keeps ~64 MiB of unrelated dirty data
//! on the same filesystem (rewriting a file without syncing it), as another
//! writer on a shared disk would: `syncfs` must flush it, `fdatasync` not.
//!
//!     cargo run --release --example bench_publish -- --work DIR [--reps 7] [--noise]
//!
//! Prints `ROW|…` lines like bench_core and a median per configuration.

use std::fs::{self, File};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use stagefs::event::{BlobId, FileRef};
use stagefs::stage::BlobStore;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    if let Err(e) = run() {
        eprintln!("bench_publish: {e}");
        std::process::exit(1);
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn run() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let work = PathBuf::from(arg(&args, "--work").unwrap_or_else(|| "/tmp".to_owned()));
    let reps: usize = arg(&args, "--reps").map_or(Ok(7), |r| r.parse())?;
    let noise = args.iter().any(|a| a == "--noise");
    let dir = tempfile::tempdir_in(&work)?;
    let _noise = noise.then(|| Noise::start(dir.path()));
    // (files, bytes per file): a commit's worth of small files up to a few
    // large ones.
    let shapes: [(usize, usize); 4] = [(1, 4 << 10), (64, 4 << 10), (1024, 4 << 10), (16, 4 << 20)];
    println!(
        "NOTE|load before: {}; noise writer: {}",
        loadavg(),
        if noise { "on" } else { "off" }
    );
    for (files, bytes) in shapes {
        let mut old = Vec::new();
        let mut new = Vec::new();
        let mut sweep: Vec<Vec<Duration>> = SWEEP.iter().map(|_| Vec::new()).collect();
        let (mut early_old, mut early_new): (Vec<Duration>, Vec<Duration>) =
            (Vec::new(), Vec::new());
        for rep in 0..reps {
            let case = dir.path().join(format!("case-{files}-{bytes}-{rep}"));
            fs::create_dir(&case)?;
            let src = case.join("src");
            fs::create_dir(&src)?;
            let refs = make_sources(&src, files, bytes, rep)?;
            old.push(time_syncfs(&case.join("old"), &src, &refs, false)?);
            new.push(time_publish(&case.join("new"), &src, &refs)?);
            for (i, threads) in SWEEP.iter().enumerate() {
                let d = time_fdatasync_threads(
                    &case.join(format!("t{threads}")),
                    &src,
                    &refs,
                    *threads,
                    false,
                )?;
                sweep[i].push(d);
            }
            early_old.push(time_syncfs(&case.join("eo"), &src, &refs, true)?);
            early_new.push(time_fdatasync_threads(
                &case.join("en"),
                &src,
                &refs,
                8,
                true,
            )?);
            fs::remove_dir_all(&case)?;
        }
        let (o, n) = (median(&mut old), median(&mut new));
        let label = format!("{files} × {} KiB", bytes >> 10);
        println!(
            "ROW|publish {label}{}: syncfs (main) vs per-file fdatasync|{:.2} ms vs {:.2} ms ({:.2}×)|—|—",
            if noise { ", with a background writer" } else { "" },
            ms(o),
            ms(n),
            n.as_secs_f64() / o.as_secs_f64()
        );
        let swept: Vec<String> = SWEEP
            .iter()
            .zip(sweep.iter_mut())
            .map(|(t, v)| format!("{t} threads {:.2} ms", ms(median(v))))
            .collect();
        println!(
            "NOTE|{label}: per-file fdatasync by thread count: {}",
            swept.join(", ")
        );
        println!(
            "NOTE|{label}: with writeback started as each copy is made (sync_file_range WRITE, untimed): syncfs {:.2} ms, fdatasync on 8 threads {:.2} ms",
            ms(median(&mut early_old)),
            ms(median(&mut early_new))
        );
    }
    println!("NOTE|load after: {}; {reps} reps per shape", loadavg());
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn make_sources(src: &Path, files: usize, bytes: usize, rep: usize) -> Res<Vec<FileRef>> {
    let mut refs = Vec::with_capacity(files);
    for i in 0..files {
        let mut content = vec![0u8; bytes];
        let tag = format!("{rep}/{i}/{bytes}");
        for (j, b) in content.iter_mut().enumerate() {
            *b = tag.as_bytes()[j % tag.len()].wrapping_add((j / tag.len()) as u8);
        }
        let name = format!("f{i}");
        fs::write(src.join(&name), &content)?;
        let sha256 = BlobId(Sha256::digest(&content).into());
        refs.push(FileRef::native(&name, &name, bytes as u64, sha256));
    }
    // The sources' own writeback must not be charged to either strategy.
    File::open(src)?.sync_all()?;
    sync_all_files(src)?;
    Ok(refs)
}

fn sync_all_files(dir: &Path) -> Res<()> {
    for e in fs::read_dir(dir)? {
        File::open(e?.path())?.sync_all()?;
    }
    Ok(())
}

/// The library's publish, timed from "copies verified in tmp/".
fn time_publish(state: &Path, src: &Path, refs: &[FileRef]) -> Res<Duration> {
    fs::create_dir(state)?;
    let store = BlobStore::open(state)?;
    let mut batch = Vec::with_capacity(refs.len());
    for f in refs {
        if let Some(copy) = store.fetch_unsynced(f, src, None)?.copy {
            batch.push(copy);
        }
    }
    let start = Instant::now();
    store
        .publish(batch)
        .map_err(|(e, failed)| format!("publish: {e} ({} failed)", failed.len()))?;
    Ok(start.elapsed())
}

/// One temp copy in the bench's own `blobs/tmp/`.
struct Temp {
    file: File,
    path: PathBuf,
    hex: String,
}

/// Copies the sources into `state/blobs/tmp/` (untimed), starting their
/// writeback when `early_writeback`; returns `blobs/` and the copies.
fn write_temps(
    state: &Path,
    src: &Path,
    refs: &[FileRef],
    early_writeback: bool,
) -> Res<(PathBuf, Vec<Temp>)> {
    let root = state.join("blobs");
    let tmp = root.join("tmp");
    fs::create_dir_all(&tmp)?;
    let mut temps = Vec::with_capacity(refs.len());
    for f in refs {
        let path = tmp.join(format!("{}.tmp", f.key().to_hex()));
        fs::copy(src.join(&f.path), &path)?;
        let file = File::open(&path)?;
        if early_writeback {
            // What a fetch worker could do as it finishes a copy: queue the
            // data for writeback without waiting.
            // SAFETY: a valid descriptor; the call only queues writeback.
            unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
        }
        temps.push(Temp {
            file,
            path,
            hex: f.key().to_hex(),
        });
    }
    Ok((root, temps))
}

/// Renames every copy to `blobs/<2 hex>/<hex>`, creating fan-out
/// directories (and syncing `blobs/` for each new one when `sync_new`);
/// returns the fan-out directories touched.
fn rename_into_place(
    root: &Path,
    temps: &[Temp],
    sync_new: bool,
) -> Res<std::collections::BTreeSet<PathBuf>> {
    let mut touched = std::collections::BTreeSet::new();
    for t in temps {
        let fan = root.join(&t.hex[..2]);
        if !fan.is_dir() {
            fs::create_dir(&fan)?;
            if sync_new {
                File::open(root)?.sync_all()?;
            }
        }
        fs::rename(&t.path, fan.join(&t.hex))?;
        touched.insert(fan);
    }
    Ok(touched)
}

/// Main's strategy on the same layout: the copies are written into
/// `blobs/tmp/` (untimed), then syncfs, renames, syncfs.
fn time_syncfs(state: &Path, src: &Path, refs: &[FileRef], early_writeback: bool) -> Res<Duration> {
    let (root, temps) = write_temps(state, src, refs, early_writeback)?;
    let start = Instant::now();
    syncfs(&root.join("tmp"))?;
    rename_into_place(&root, &temps, false)?;
    syncfs(&root)?;
    Ok(start.elapsed())
}

/// Thread counts tried for the per-file fdatasync strategy (to choose
/// `PUBLISH_SYNC_THREADS`).
const SWEEP: [usize; 3] = [8, 32, 128];

/// The library's strategy with a given number of sync threads, on the
/// same layout as [`time_syncfs`].
fn time_fdatasync_threads(
    state: &Path,
    src: &Path,
    refs: &[FileRef],
    threads: usize,
    early_writeback: bool,
) -> Res<Duration> {
    let (root, temps) = write_temps(state, src, refs, early_writeback)?;
    let start = Instant::now();
    let chunk = temps.len().div_ceil(threads.max(1));
    std::thread::scope(|scope| -> Res<()> {
        let workers: Vec<_> = temps
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().try_for_each(|t| t.file.sync_data())))
            .collect();
        for w in workers {
            w.join().map_err(|_| "sync thread panicked")??;
        }
        Ok(())
    })?;
    for d in rename_into_place(&root, &temps, true)? {
        File::open(d)?.sync_all()?;
    }
    Ok(start.elapsed())
}

fn syncfs(dir: &Path) -> Res<()> {
    let f = File::open(dir)?;
    // SAFETY: syncfs on a valid open descriptor.
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// Keeps unrelated dirty data on the filesystem until dropped.
struct Noise {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Noise {
    fn start(dir: &Path) -> Noise {
        let stop = Arc::new(AtomicBool::new(false));
        let path = dir.join("noise");
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let chunk = vec![0x5au8; 1 << 20];
            while !flag.load(Ordering::Relaxed) {
                let Ok(mut f) = File::create(&path) else {
                    return;
                };
                for _ in 0..64 {
                    if flag.load(Ordering::Relaxed) || f.write_all(&chunk).is_err() {
                        break;
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Noise {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Noise {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
