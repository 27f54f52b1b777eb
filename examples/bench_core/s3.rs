//! `s3-stage`: Hive files staged from S3 by the Replica pipeline, against
//! `rclone copy` of the same objects from the same server (issue 29,
//! docs/BENCHMARKS.md "Staging from S3").
//!
//! One private SeaweedFS (tests/servers/s3.rs) on 127.0.0.1 serves both.
//! Each set (many small files, a few large ones) is written locally,
//! put in the bucket, and described by one Hive INSERT row per file
//! (`json-0.2`) whose URI is `s3a://bench/...` with S3A's ETag checksum.
//! stagefs: `Replica::start` on those rows with no `--source-map`, clock
//! stopped when the last id is visible (every object read, sha256
//! computed, ETag checked, fdatasynced, renamed, commit record fsynced),
//! 4 fetch threads. rclone: `rclone copy` of the bucket's prefix to an
//! empty folder with `--transfers 4` (4 streams per large file), MD5
//! checked against the ETag as rclone does by default, then `sync`.
//! The resident memory the process gains while stagefs stages is sampled
//! every 10 ms.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use md5::{Digest as _, Md5};
use stagefs::event::StateId;
use stagefs::replicate::{Replica, ReplicaConfig};
use stagefs::source::hive::map::SourceMap;
use stagefs::source::hive::{HiveConfig, HiveRows};
use stagefs::source_file::s3::{Credentials, S3Access, S3Settings, Secret};
use stagefs::source_file::Remotes;
use stagefs::workload::hive_export::{HiveWriter, WAREHOUSE_URI};

use super::hive::write_partition_rows;
use super::servers::S3Server;
use super::{
    grouped, load1, measure, median, note, row, rss_bytes, sh, wait_visible, write_random_files,
    Opts, Res,
};

const BUCKET: &str = "bench";

pub fn bench_stage(o: &Opts) -> Res<()> {
    let reps = o.num("reps", 3).max(1);
    let s3 = S3Server::start()?;
    s3.create_bucket(BUCKET, false)?;
    let sets = [
        (
            "small",
            o.num("small", 10_000),
            o.num("small-bytes", 4096),
            1.5,
        ),
        (
            "large",
            o.num("large", 4),
            o.num("large-mib", 256) << 20,
            0.9,
        ),
    ];
    for (label, count, size, goal) in sets {
        if count > 0 {
            stage_set(o, &s3, label, count, size, reps, goal)?;
        }
    }
    Ok(())
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

fn stage_set(
    o: &Opts,
    s3: &S3Server,
    label: &str,
    count: u64,
    size: u64,
    reps: u64,
    goal: f64,
) -> Res<()> {
    let work = o.work(&format!("s3-stage-{label}"))?;
    let root = work.path();
    let src = root.join("src");
    let t = Instant::now();
    let files = write_random_files(&src, count, size)?;
    // Put in the bucket under `<label>/`, 8 at a time; remember the ETags.
    let etags: BTreeMap<String, String> = {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let out = std::sync::Mutex::new(BTreeMap::new());
        std::thread::scope(|scope| -> Res<()> {
            let mut handles = Vec::new();
            for _ in 0..8 {
                handles.push(scope.spawn(|| -> Result<(), String> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(f) = files.get(i) else { return Ok(()) };
                        let data = fs::read(src.join(&f.rel)).map_err(|e| e.to_string())?;
                        let key = format!("{label}/{}", f.rel);
                        let r = s3.request("PUT", &format!("/{BUCKET}/{key}"), &[], &[], &data)?;
                        if r.status != 200 {
                            return Err(format!("PUT {key}: {} {}", r.status, r.text()));
                        }
                        let etag = r.header("ETag").unwrap_or_default().trim_matches('"');
                        if etag != hex(&Md5::digest(&data)) {
                            return Err(format!("PUT {key}: ETag {etag} is not the MD5"));
                        }
                        out.lock()
                            .map_err(|e| e.to_string())?
                            .insert(f.rel.clone(), etag.to_owned());
                    }
                }));
            }
            for h in handles {
                h.join().map_err(|_| "an upload thread panicked")??;
            }
            Ok(())
        })?;
        out.into_inner().map_err(|e| e.to_string())?
    };
    // The rows: as bench_core hive-stage writes them (json-0.2 here, so the
    // URIs are plain text), then each URI moved to the bucket with the
    // ETag checksum S3A records (hex of the quoted ETag).
    let rows = root.join("rows.jsonl");
    let mut writer = HiveWriter::new(&rows, &src, None, &root.join("hive-cm"), false)?;
    write_partition_rows(&mut writer, &files)?;
    drop(writer);
    let text = fs::read_to_string(&rows)?;
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
            let rel = rest[..end].to_owned();
            let after = &rest[end + 1..];
            let sum = after[..after.find('#').ok_or("no cm root")?].to_owned();
            let etag = etags
                .get(&rel)
                .ok_or_else(|| format!("no ETag for {rel}"))?;
            sums.push((sum, hex(format!("\"{etag}\"").as_bytes())));
        }
        for (sum, s3_sum) in sums {
            line = line.replace(&format!("#{sum}#"), &format!("#{s3_sum}#"));
        }
        moved.push_str(&line.replace(WAREHOUSE_URI, &format!("s3a://{BUCKET}/{label}")));
        moved.push('\n');
    }
    fs::write(&rows, moved)?;
    let last = StateId(count + 2);
    let total_mib = (count * size) as f64 / f64::from(1u32 << 20);
    eprintln!(
        "s3-stage {label}: wrote and put {count} × {size} B and their rows in {:.1?}",
        t.elapsed()
    );

    let dest = root.join("dest");
    let state = root.join("state");
    let access = Arc::new(S3Access::new(S3Settings {
        endpoint: Some(s3.endpoint()),
        region: s3.region().to_owned(),
        credentials: Some(Credentials {
            access_key_id: s3.access_key().to_owned(),
            secret_access_key: Secret::new(s3.secret_key()),
            session_token: None,
        }),
        request_timeout: Duration::from_secs(30),
        source: "bench".into(),
    }));
    let (mut rclone, mut stage, mut loads, mut rss) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for rep in 0..reps {
        for which in if rep % 2 == 0 { [0, 1] } else { [1, 0] } {
            for d in [&dest, &state] {
                if d.exists() {
                    fs::remove_dir_all(d)?;
                }
            }
            sh("sync", &[])?;
            if which == 0 {
                let r = measure(total_mib, || {
                    let st = Command::new("rclone")
                        .args(["copy", "--transfers", "4", "--checkers", "8"])
                        .args(["--multi-thread-streams", "4", "-q"])
                        .arg(format!("bench:{BUCKET}/{label}"))
                        .arg(&dest)
                        // rclone's AWS SDK fails on a CA bundle with its own
                        // transport; the endpoint is plain http anyway.
                        .env_remove("AWS_CA_BUNDLE")
                        .env("RCLONE_CONFIG_BENCH_TYPE", "s3")
                        .env("RCLONE_CONFIG_BENCH_PROVIDER", "Other")
                        .env("RCLONE_CONFIG_BENCH_ENDPOINT", s3.endpoint())
                        .env("RCLONE_CONFIG_BENCH_REGION", s3.region())
                        .env("RCLONE_CONFIG_BENCH_ACCESS_KEY_ID", s3.access_key())
                        .env("RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY", s3.secret_key())
                        .env("RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE", "true")
                        .status()?;
                    if !st.success() {
                        return Err(format!("rclone failed: {st}").into());
                    }
                    sh("sync", &[])
                })?;
                rclone.push(r);
            } else {
                let mut cfg = ReplicaConfig::new(&state, Path::new(""), Path::new(""));
                cfg.hive = Some(HiveConfig::new(
                    HiveRows::Files(rows.clone()),
                    SourceMap::default(),
                ));
                cfg.remotes = Remotes::with_s3(Arc::clone(&access));
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
                let r = measure(total_mib, || {
                    let replica = Replica::start(cfg)?;
                    wait_visible(&replica, last, Duration::from_secs(900))?;
                    let status = replica.status();
                    replica.stop();
                    if status.unverified_files != 0 {
                        return Err(format!("{} files unverified", status.unverified_files).into());
                    }
                    Ok(())
                })?;
                done.store(true, Ordering::Relaxed);
                sampler.join().map_err(|_| "the sampler panicked")?;
                rss.push(
                    peak.load(Ordering::Relaxed).saturating_sub(before) as f64
                        / f64::from(1u32 << 20),
                );
                stage.push(r);
            }
        }
        loads.push(load1());
        eprintln!(
            "s3-stage {label} rep {}: rclone+sync {:.1} MiB/s, stagefs {:.1} MiB/s, +{:.0} MiB RSS (load {})",
            rep + 1,
            rclone.last().map_or(0.0, |r| r.0),
            stage.last().map_or(0.0, |r| r.0),
            rss.last().copied().unwrap_or(0.0),
            load1()
        );
    }
    let ratios: Vec<f64> = stage.iter().zip(&rclone).map(|(s, c)| s.0 / c.0).collect();
    let spread = |v: &[f64], d: usize| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{:.*} ({:.*}–{:.*})", d, median(v.to_vec()), d, lo, d, hi)
    };
    let mibs = |v: &[(f64, f64)]| v.iter().map(|r| r.0).collect::<Vec<_>>();
    let files_s = |v: &[(f64, f64)]| {
        v.iter()
            .map(|r| r.0 / total_mib * count as f64)
            .collect::<Vec<_>>()
    };
    let what = format!(
        "{} × {}",
        grouped(count),
        if size >= 1 << 20 {
            format!("{} MiB", size >> 20)
        } else {
            format!("{} KiB", size >> 10)
        }
    );
    row(
        &format!("S1. `rclone copy` (4 transfers) + `sync` from S3, {what}"),
        &format!(
            "{} MiB/s = {} files/s",
            spread(&mibs(&rclone), 1),
            spread(&files_s(&rclone), 0)
        ),
        "baseline",
        None,
    );
    let ratio = median(ratios.clone());
    row(
        &format!("S1. stagefs staging from S3 (Replica pipeline, ETag checked), {what}"),
        &format!(
            "{} MiB/s = {} files/s; / rclone of the same repetition: {}; process RSS gained while staging: {} MiB",
            spread(&mibs(&stage), 1),
            spread(&files_s(&stage), 0),
            spread(&ratios, 2),
            spread(&rss, 0)
        ),
        &format!("≥ {goal}× rclone"),
        Some(ratio >= goal),
    );
    note(&format!(
        "s3-stage {label}: {what} pseudo-random objects on a private SeaweedFS on 127.0.0.1, one Hive INSERT \
         row each; median of {reps} interleaved repetitions (range in parentheses); destination and state \
         removed and `sync` before every run; load average after each repetition: {}",
        loads.join(", ")
    ));
    Ok(())
}
