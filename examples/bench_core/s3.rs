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
//! every 10 ms (`remote.rs`, shared with `hdfs-stage`).

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use md5::{Digest as _, Md5};
use stagefs::event::StateId;
use stagefs::replicate::{Replica, ReplicaConfig};
use stagefs::source::hive::map::SourceMap;
use stagefs::source::hive::{HiveConfig, HiveRows};
use stagefs::source_file::s3::{Credentials, S3Access, S3Settings, Secret};
use stagefs::source_file::Remotes;

use super::bench_common::percentile;
use super::remote::{self, rclone_baseline, Place};
use super::servers::S3Server;
use super::{grouped, load1, median, note, row, wait_visible, Opts, Res, SourceFile};

pub const BUCKET: &str = "bench";

pub fn bench_stage(o: &Opts) -> Res<()> {
    let reps = o.num("reps", 3).max(1);
    let s3 = S3Server::start()?;
    s3.create_bucket(BUCKET, false)?;
    let access = access(&s3);
    for set in remote::sets(o) {
        let written = remote::write_set(o, "s3-stage", &set)?;
        let (etags, took) = put_objects(&s3, &written.src, &written.files, set.label)?;
        move_rows_to_s3(&written.rows, set.label, &etags)?;
        eprintln!(
            "s3-stage {}: wrote and put {} and their rows ({took:.1?} putting)",
            set.label,
            set.what()
        );
        let rclone = rclone_baseline(|cmd: &mut Command| {
            cmd.arg(format!("bench:{BUCKET}/{}", set.label))
                // rclone's AWS SDK fails on a CA bundle with its own
                // transport; the endpoint is plain http anyway.
                .env_remove("AWS_CA_BUNDLE")
                .env("RCLONE_CONFIG_BENCH_TYPE", "s3")
                .env("RCLONE_CONFIG_BENCH_PROVIDER", "Other")
                .env("RCLONE_CONFIG_BENCH_ENDPOINT", s3.endpoint())
                .env("RCLONE_CONFIG_BENCH_REGION", s3.region())
                .env("RCLONE_CONFIG_BENCH_ACCESS_KEY_ID", s3.access_key())
                .env("RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY", s3.secret_key())
                .env("RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE", "true");
        });
        let place = Place {
            source: "S3",
            checked: "ETag checked",
            prefix: "S1",
            remotes: Remotes::with_s3(Arc::clone(&access)),
            server: "a private SeaweedFS on 127.0.0.1",
        };
        remote::compare(&set, &written, &place, vec![rclone], reps)?;
    }
    Ok(())
}

/// stagefs's access to the private server.
pub fn access(s3: &S3Server) -> Arc<S3Access> {
    Arc::new(S3Access::new(S3Settings {
        endpoint: Some(s3.endpoint()),
        region: s3.region().to_owned(),
        credentials: Some(Credentials {
            access_key_id: s3.access_key().to_owned(),
            secret_access_key: Secret::new(s3.secret_key()),
            session_token: None,
        }),
        request_timeout: Duration::from_secs(30),
        source: "bench".into(),
    }))
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

/// Puts every file of `files` (below `src`) in the bucket under
/// `<prefix>/`, 8 at a time; their ETags by path, and the time it took.
pub fn put_objects(
    s3: &S3Server,
    src: &Path,
    files: &[SourceFile],
    prefix: &str,
) -> Res<(BTreeMap<String, String>, Duration)> {
    let (etags, took) = remote::put_all(files, 8, |f| {
        let data = fs::read(src.join(&f.rel)).map_err(|e| e.to_string())?;
        let key = format!("{prefix}/{}", f.rel);
        let r = s3.request("PUT", &format!("/{BUCKET}/{key}"), &[], &[], &data)?;
        if r.status != 200 {
            return Err(format!("PUT {key}: {} {}", r.status, r.text()));
        }
        let etag = r.header("ETag").unwrap_or_default().trim_matches('"');
        if etag != hex(&Md5::digest(&data)) {
            return Err(format!("PUT {key}: ETag {etag} is not the MD5"));
        }
        Ok(etag.to_owned())
    })?;
    Ok((etags.into_iter().collect(), took))
}

/// The rows moved to the bucket under `<prefix>/`, each with the ETag
/// checksum S3A records (hex of the quoted ETag).
pub fn move_rows_to_s3(rows: &Path, prefix: &str, etags: &BTreeMap<String, String>) -> Res<()> {
    remote::move_rows(rows, &format!("s3a://{BUCKET}/{prefix}"), |rel| {
        let etag = etags.get(rel).ok_or_else(|| format!("no ETag for {rel}"))?;
        Ok(hex(format!("\"{etag}\"").as_bytes()))
    })
}

/// `s3-lag`: event → visible with the files on S3, beside the same with
/// the files on the local disk, at `--rate` events/s (issue 29,
/// docs/BENCHMARKS.md "Staging from S3").
///
/// Both sides follow Hive INSERT rows (`--hive-events`, one new 4 KiB
/// file per row, `--hive-poll-ms 5`: the native source's poll) in a fresh
/// `Replica`; they differ only in where the files are: on the private
/// SeaweedFS (`s3a://` URIs with S3A's ETag checksum, no `--source-map`)
/// or in a local folder (the writer's URIs and HDFS checksums,
/// `--source-map` to it). Every file is put before the clock starts; the
/// rows are appended at the rate, each timed from its `write(2)` until the
/// catalog's visible state reaches its id (polled every 0.5 ms). The sides
/// alternate, `--reps` runs each.
pub fn bench_lag(o: &Opts) -> Res<()> {
    let rate = o.num("rate", 100).max(1);
    let seconds = o.num("seconds", 20).max(1);
    let reps = o.num("reps", 2).max(1);
    let poll = Duration::from_millis(o.num("poll-ms", 5).max(1));
    let s3 = S3Server::start()?;
    s3.create_bucket(BUCKET, false)?;
    let set = remote::Set {
        label: "lag",
        count: rate * seconds,
        size: o.num("small-bytes", 4096),
        goal: 0.0,
    };
    let written = remote::write_set(o, "s3-lag", &set)?;
    let root = written.root();
    let local_lines: Vec<String> = fs::read_to_string(&written.rows)?
        .lines()
        .map(str::to_owned)
        .collect();
    let (etags, _) = put_objects(&s3, &written.src, &written.files, set.label)?;
    move_rows_to_s3(&written.rows, set.label, &etags)?;
    let s3_lines: Vec<String> = fs::read_to_string(&written.rows)?
        .lines()
        .map(str::to_owned)
        .collect();
    if local_lines.len() as u64 != set.count + 2 || s3_lines.len() != local_lines.len() {
        return Err("expected one row per event".into());
    }
    let sides = [
        (
            "local folder (`--source-map`)",
            &local_lines,
            written.source_map.clone(),
            Remotes::default(),
        ),
        (
            "S3 (SeaweedFS on 127.0.0.1)",
            &s3_lines,
            SourceMap::default(),
            Remotes::with_s3(access(&s3)),
        ),
    ];
    let mut runs: Vec<Vec<String>> = vec![Vec::new(); sides.len()];
    let mut p99s: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    for rep in 0..reps {
        for (i, (name, lines, map, remotes)) in sides.iter().enumerate() {
            let dir = root.join(format!("run-{rep}-{i}"));
            fs::create_dir_all(&dir)?;
            let mut hive = HiveConfig::new(HiveRows::Files(dir.join("rows.jsonl")), map.clone());
            hive.poll_interval = poll;
            let mut cfg = ReplicaConfig::new(&dir.join("state"), Path::new(""), Path::new(""));
            cfg.hive = Some(hive);
            cfg.remotes = remotes.clone();
            let (mut lags, behind) = lag_run(cfg, &dir.join("rows.jsonl"), lines, rate)?;
            fs::remove_dir_all(&dir)?;
            lags.sort_by(f64::total_cmp);
            let pct = |p| percentile(&lags, p);
            let text = format!(
                "{:.1} / {:.1} / {:.1} / {:.1} ms (producer ≤ {:.1} ms behind; load {})",
                pct(50.0),
                pct(90.0),
                pct(99.0),
                lags.last().copied().unwrap_or(f64::NAN),
                behind.as_secs_f64() * 1e3,
                load1()
            );
            eprintln!("s3-lag rep {} {name}: p50/p90/p99/max {text}", rep + 1);
            runs[i].push(text);
            p99s[i].push(pct(99.0));
        }
    }
    for (i, (name, ..)) in sides.iter().enumerate() {
        row(
            &format!(
                "Event → visible at {rate} events/s, files in a {name}: p50 / p90 / p99 / max"
            ),
            &runs[i].join("; "),
            if i == 0 {
                "baseline"
            } else {
                "p99 ≤ 2× local's"
            },
            (i > 0).then(|| median(p99s[i].clone()) <= 2.0 * median(p99s[0].clone())),
        );
    }
    note(&format!(
        "s3-lag: {} INSERT rows of one {} B file each per run, appended at {rate}/s; \
         `--hive-poll-ms {}`; {reps} runs per side, alternated",
        grouped(set.count),
        set.size,
        poll.as_millis()
    ));
    Ok(())
}

/// Writes the first two rows (database, table), starts the replica, waits
/// until they are visible, then appends the other rows at `rate` per
/// second while a thread polls the visible state: each row's lag (ms) and
/// how far the producer fell behind its schedule at worst.
fn lag_run(
    cfg: ReplicaConfig,
    rows: &Path,
    lines: &[String],
    rate: u64,
) -> Res<(Vec<f64>, Duration)> {
    let mut log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(rows)?;
    for line in &lines[..2] {
        log.write_all(format!("{line}\n").as_bytes())?;
    }
    let replica = Replica::start(cfg)?;
    wait_visible(&replica, StateId(2), Duration::from_secs(60))?;
    let timed = &lines[2..];
    let base = Instant::now();
    let appended: Vec<AtomicU64> = timed.iter().map(|_| AtomicU64::new(0)).collect();
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let result = std::thread::scope(|scope| -> Res<(Vec<f64>, Duration)> {
        let poller = scope.spawn(|| -> Result<Vec<f64>, String> {
            let mut lags = Vec::with_capacity(timed.len());
            let deadline = Duration::from_secs(60 + timed.len() as u64 / rate);
            while lags.len() < timed.len() {
                let visible = replica.catalog().snapshot().visible.state_id.0;
                let now = base.elapsed().as_nanos() as u64;
                // Row k has id k + 3.
                while lags.len() < timed.len() && lags.len() as u64 + 3 <= visible {
                    let t = appended[lags.len()]
                        .load(Ordering::SeqCst)
                        .saturating_sub(1);
                    lags.push(now.saturating_sub(t) as f64 / 1e6);
                }
                if let Some(stall) = replica.status().stalled {
                    return Err(format!("replication stalled: {stall:?}"));
                }
                if base.elapsed() > deadline {
                    return Err(format!(
                        "only {} of {} rows visible",
                        lags.len(),
                        timed.len()
                    ));
                }
                std::thread::sleep(Duration::from_micros(500));
            }
            Ok(lags)
        });
        let start = Instant::now();
        let mut behind = Duration::ZERO;
        for (k, line) in timed.iter().enumerate() {
            let due = start + period * k as u32;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            } else {
                behind = behind.max(now - due);
            }
            // The time is stored before the line is written (+1: 0 is unset).
            appended[k].store(base.elapsed().as_nanos() as u64 + 1, Ordering::SeqCst);
            log.write_all(format!("{line}\n").as_bytes())?;
        }
        let lags = poller.join().map_err(|_| "the poller panicked")??;
        Ok((lags, behind))
    });
    replica.stop();
    result
}

/// `s3-serve`: a private SeaweedFS with the bucket `bench` for a script
/// (scripts/bench/reader.py with `STORAGE=s3`): prints the environment
/// a stagefs process reaches it with (`AWS_…=…` lines, then `READY`) and
/// serves until its stdin closes.
pub fn serve(_o: &Opts) -> Res<()> {
    let s3 = S3Server::start()?;
    s3.create_bucket(BUCKET, false)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "AWS_ENDPOINT_URL={}", s3.endpoint())?;
    writeln!(out, "AWS_ACCESS_KEY_ID={}", s3.access_key())?;
    writeln!(out, "AWS_SECRET_ACCESS_KEY={}", s3.secret_key())?;
    writeln!(out, "AWS_REGION={}", s3.region())?;
    writeln!(out, "READY")?;
    out.flush()?;
    drop(out);
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin(), &mut rest)?;
    Ok(())
}

/// `s3-get --url URL --prefix P`: GETs every object under `P` at the
/// publication `URL`, one after the other, through the store a reader
/// host opens (`stagefs::publish::open_store`, the same S3 client), and
/// prints `first <s>` (the first object's GET) and `all <s> <bytes>`.
pub fn get_all(o: &Opts) -> Res<()> {
    use futures::TryStreamExt;
    use object_store::ObjectStoreExt;
    use stagefs::publish::ObjectStore;
    let store = stagefs::publish::open_store(&o.str("url", ""))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let prefix = object_store::path::Path::from(o.str("prefix", "blobs"));
    let mut paths: Vec<_> = rt
        .block_on(store.list(Some(&prefix)).try_collect::<Vec<_>>())?
        .into_iter()
        .map(|m| m.location)
        .collect();
    paths.sort();
    let t = Instant::now();
    let mut first = None;
    let mut bytes = 0;
    for p in &paths {
        bytes += rt
            .block_on(async { store.get(p).await?.bytes().await })?
            .len();
        first.get_or_insert(t.elapsed());
    }
    let all = t.elapsed();
    println!("first {:.6}", first.unwrap_or_default().as_secs_f64());
    println!("all {:.6} {bytes} {}", all.as_secs_f64(), paths.len());
    Ok(())
}
