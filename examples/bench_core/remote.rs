//! What the staging benchmarks from a remote file system share (`s3-stage`
//! in `s3.rs`, `hdfs-stage` in `hdfs.rs`; docs/BENCHMARKS.md "Staging from
//! S3" and "Staging from HDFS"): the two sets, the Hive rows naming a set's
//! files where they were put, and the interleaved comparison of the Replica
//! pipeline with the baselines, with the resident memory stagefs gains.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stagefs::event::StateId;
use stagefs::replicate::{Replica, ReplicaConfig};
use stagefs::source::hive::map::SourceMap;
use stagefs::source::hive::{HiveConfig, HiveRows};
use stagefs::source_file::Remotes;
use stagefs::workload::hive_export::{HiveWriter, WAREHOUSE_URI};

use super::hive::write_partition_rows;
use super::{
    grouped, load1, measure, median, note, row, rss_bytes, sh, staged_verified, write_random_files,
    Opts, Res, SourceFile,
};

/// One set of files: `count` files of `size` bytes, and the goal of
/// stagefs's speed over the baseline's.
pub struct Set {
    pub label: &'static str,
    pub count: u64,
    pub size: u64,
    pub goal: f64,
}

impl Set {
    /// `10,000 × 4 KiB`.
    pub fn what(&self) -> String {
        format!(
            "{} × {}",
            grouped(self.count),
            if self.size >= 1 << 20 {
                format!("{} MiB", self.size >> 20)
            } else {
                format!("{} KiB", self.size >> 10)
            }
        )
    }

    fn total_mib(&self) -> f64 {
        (self.count * self.size) as f64 / f64::from(1u32 << 20)
    }
}

/// The sets of issue 29 (`--small`, `--small-bytes`, `--large`,
/// `--large-mib`): many small files (goal 1.5×), a few large ones (0.9×).
/// A set of 0 files is left out.
pub fn sets(o: &Opts) -> Vec<Set> {
    [
        Set {
            label: "small",
            count: o.num("small", 10_000),
            size: o.num("small-bytes", 4096),
            goal: 1.5,
        },
        Set {
            label: "large",
            count: o.num("large", 4),
            size: o.num("large-mib", 256) << 20,
            goal: 0.9,
        },
    ]
    .into_iter()
    .filter(|s| s.count > 0)
    .collect()
}

/// A set written locally: the files under `src`, and `rows`, one Hive
/// INSERT row (`json-0.2`, so URIs are plain text) per file with the URIs
/// and checksums `HiveWriter` gives local files.
pub struct Written {
    pub work: tempfile::TempDir,
    pub src: PathBuf,
    pub files: Vec<SourceFile>,
    pub rows: PathBuf,
    /// The `--source-map` that reads the rows' URIs from `src`.
    pub source_map: SourceMap,
    /// The last event id of the rows.
    pub last: StateId,
}

impl Written {
    pub fn root(&self) -> &Path {
        self.work.path()
    }
}

/// Writes `set`'s files (pseudo-random) and their rows in a fresh folder.
pub fn write_set(o: &Opts, bench: &str, set: &Set) -> Res<Written> {
    let work = o.work(&format!("{bench}-{}", set.label))?;
    let root = work.path();
    let src = root.join("src");
    let files = write_random_files(&src, set.count, set.size)?;
    let rows = root.join("rows.jsonl");
    let mut writer = HiveWriter::new(&rows, &src, None, &root.join("hive-cm"), false)?;
    write_partition_rows(&mut writer, &files)?;
    let source_map = SourceMap::parse(&writer.source_map_args())?;
    drop(writer);
    Ok(Written {
        src,
        files,
        rows,
        source_map,
        last: StateId(set.count + 2),
        work,
    })
}

/// Rewrites `rows` so that every file URI (`WAREHOUSE_URI/rel#sum#cm#dir`)
/// names `base/rel`, with the checksum `checksum(rel)` in place of the one
/// the writer computed locally.
pub fn move_rows(
    rows: &Path,
    base: &str,
    mut checksum: impl FnMut(&str) -> Res<String>,
) -> Res<()> {
    let text = fs::read_to_string(rows)?;
    let mut moved = String::with_capacity(text.len());
    let prefix = format!("{WAREHOUSE_URI}/");
    for line in text.lines() {
        let mut line = line.to_owned();
        // Each file URI (`path#checksum#cmroot#subdir`; locations have no `#`).
        let mut sums = Vec::new();
        let mut rest = line.as_str();
        while let Some(at) = rest.find(&prefix) {
            rest = &rest[at + prefix.len()..];
            let Some(end) = rest.find(['#', '"', '\\']) else {
                break;
            };
            if !rest[end..].starts_with('#') {
                continue;
            }
            let rel = &rest[..end];
            let after = &rest[end + 1..];
            let sum = after[..after.find('#').ok_or("no cm root")?].to_owned();
            sums.push((sum, checksum(rel)?));
        }
        for (sum, new_sum) in sums {
            line = line.replace(&format!("#{sum}#"), &format!("#{new_sum}#"));
        }
        moved.push_str(&line.replace(WAREHOUSE_URI, base));
        moved.push('\n');
    }
    fs::write(rows, moved)?;
    Ok(())
}

/// Copies the set into an empty folder (the argument).
pub type CopyInto<'a> = Box<dyn FnMut(&Path) -> Res<()> + 'a>;

/// A baseline tool copying the set into an empty folder (the argument);
/// `sync` follows it, inside the clock.
pub struct Baseline<'a> {
    /// As the rows name it, e.g. "`rclone copy` (4 transfers) + `sync`".
    pub name: String,
    /// Short, for the ratio (e.g. "rclone").
    pub short: &'static str,
    pub run: CopyInto<'a>,
}

/// `rclone copy` with 4 transfers, 8 checkers and 4 streams per file into
/// the destination, `source` adding what names the remote (its flags,
/// environment and the source path).
pub fn rclone_baseline<'a>(source: impl Fn(&mut Command) + 'a) -> Baseline<'a> {
    Baseline {
        name: "`rclone copy` (4 transfers) + `sync`".into(),
        short: "rclone",
        run: Box::new(move |dest: &Path| {
            let mut cmd = Command::new("rclone");
            cmd.args(["copy", "--transfers", "4", "--checkers", "8"])
                .args(["--multi-thread-streams", "4", "-q"]);
            source(&mut cmd);
            let st = cmd.arg(dest).status()?;
            if !st.success() {
                return Err(format!("rclone failed: {st}").into());
            }
            Ok(())
        }),
    }
}

/// Where the set was put: `source` ("S3", "HDFS"), what stagefs checks
/// (e.g. "ETag checked"), the row prefix ("S1"), and what reading it
/// takes (`remotes`).
pub struct Place<'a> {
    pub source: &'a str,
    pub checked: &'a str,
    pub prefix: &'a str,
    pub remotes: Remotes,
    /// Told in the note: the server and how the set was put there.
    pub server: &'a str,
}

/// Runs stagefs (a fresh `Replica` on `set`'s moved rows, no
/// `--source-map`, until the last id is visible) and every baseline, in
/// `reps` interleaved repetitions (the order reversed every other one),
/// destination and state removed and `sync` before each; prints the rows.
pub fn compare(
    set: &Set,
    written: &Written,
    place: &Place,
    mut baselines: Vec<Baseline>,
    reps: u64,
) -> Res<()> {
    let root = written.root();
    let (dest, state) = (root.join("dest"), root.join("state"));
    let total_mib = set.total_mib();
    let sides = baselines.len() + 1;
    let mut base_runs: Vec<Vec<f64>> = vec![Vec::new(); baselines.len()];
    let (mut stage, mut rss, mut loads) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..reps {
        let mut order: Vec<usize> = (0..sides).collect();
        if rep % 2 == 1 {
            order.reverse();
        }
        for which in order {
            for d in [&dest, &state] {
                if d.exists() {
                    fs::remove_dir_all(d)?;
                }
            }
            sh("sync", &[])?;
            if let Some(b) = baselines.get_mut(which) {
                fs::create_dir_all(&dest)?;
                let r = measure(total_mib, || {
                    (b.run)(&dest)?;
                    sh("sync", &[])
                })?;
                base_runs[which].push(r.0);
            } else {
                let (mibs, gained) = stage_once(written, place, &state, total_mib)?;
                stage.push(mibs);
                rss.push(gained);
            }
        }
        loads.push(load1());
        eprintln!(
            "{} {} rep {}: {} stagefs {:.1} MiB/s, +{:.0} MiB RSS (load {})",
            place.source,
            set.label,
            rep + 1,
            baselines
                .iter()
                .zip(&base_runs)
                .map(|(b, v)| format!("{} {:.1} MiB/s,", b.short, v.last().unwrap_or(&0.0)))
                .collect::<Vec<_>>()
                .join(" "),
            stage.last().unwrap_or(&0.0),
            rss.last().unwrap_or(&0.0),
            load1()
        );
    }
    let spread = |v: &[f64], d: usize| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{:.*} ({:.*}–{:.*})", d, median(v.to_vec()), d, lo, d, hi)
    };
    let files_s = |v: &[f64]| {
        v.iter()
            .map(|m| m / total_mib * set.count as f64)
            .collect::<Vec<_>>()
    };
    let what = set.what();
    let mut ratios_text = Vec::new();
    let mut met = true;
    for (b, runs) in baselines.iter().zip(&base_runs) {
        row(
            &format!("{}. {} from {}, {what}", place.prefix, b.name, place.source),
            &format!(
                "{} MiB/s = {} files/s",
                spread(runs, 1),
                spread(&files_s(runs), 0)
            ),
            "baseline",
            None,
        );
        let ratios: Vec<f64> = stage.iter().zip(runs).map(|(s, c)| s / c).collect();
        met &= median(ratios.clone()) >= set.goal;
        ratios_text.push(format!(
            "/ {} of the same repetition: {}",
            b.short,
            spread(&ratios, 2)
        ));
    }
    row(
        &format!(
            "{}. stagefs staging from {} (Replica pipeline, {}), {what}",
            place.prefix, place.source, place.checked
        ),
        &format!(
            "{} MiB/s = {} files/s; {}; process RSS gained while staging: {} MiB",
            spread(&stage, 1),
            spread(&files_s(&stage), 0),
            ratios_text.join("; "),
            spread(&rss, 0)
        ),
        &format!(
            "≥ {}× {}",
            set.goal,
            baselines
                .iter()
                .map(|b| b.short)
                .collect::<Vec<_>>()
                .join(" and ")
        ),
        Some(met),
    );
    note(&format!(
        "{} {}: {what} pseudo-random files on {}, one Hive INSERT row each; median of {reps} \
         interleaved repetitions (range in parentheses); destination and state removed and `sync` \
         before every run; load average after each repetition: {}",
        place.source,
        set.label,
        place.server,
        loads.join(", ")
    ));
    Ok(())
}

/// One staging run: MiB/s, and the resident memory the process gained
/// (peak sampled every 10 ms, minus before; MiB).
fn stage_once(written: &Written, place: &Place, state: &Path, total_mib: f64) -> Res<(f64, f64)> {
    let mut cfg = ReplicaConfig::new(state, Path::new(""), Path::new(""));
    cfg.hive = Some(HiveConfig::new(
        HiveRows::Files(written.rows.clone()),
        SourceMap::default(),
    ));
    cfg.remotes = place.remotes.clone();
    let before = rss_bytes();
    let peak = Arc::new(AtomicU64::new(before));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (Arc::clone(&peak), Arc::clone(&done));
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_bytes(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let last = written.last;
    let r = measure(total_mib, || staged_verified(Replica::start(cfg)?, last));
    done.store(true, Ordering::Relaxed);
    sampler.join().map_err(|_| "the sampler panicked")?;
    let gained = peak.load(Ordering::Relaxed).saturating_sub(before) as f64 / f64::from(1u32 << 20);
    Ok((r?.0, gained))
}

/// Runs `put(file)` for every file of `files`, `threads` at a time; the
/// time it took.
pub fn put_all<T: Send>(
    files: &[SourceFile],
    threads: usize,
    put: impl Fn(&SourceFile) -> Result<T, String> + Sync,
) -> Res<(Vec<(String, T)>, Duration)> {
    let t = Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let out = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| -> Res<()> {
        let mut handles = Vec::new();
        for _ in 0..threads {
            handles.push(scope.spawn(|| -> Result<(), String> {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(f) = files.get(i) else { return Ok(()) };
                    let v = put(f)?;
                    out.lock()
                        .map_err(|e| e.to_string())?
                        .push((f.rel.clone(), v));
                }
            }));
        }
        for h in handles {
            h.join().map_err(|_| "an upload thread panicked")??;
        }
        Ok(())
    })?;
    Ok((out.into_inner().map_err(|e| e.to_string())?, t.elapsed()))
}
