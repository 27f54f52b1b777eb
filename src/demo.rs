//! `stagefs demo`: a self-contained tour. It writes a source warehouse in a
//! temporary folder (the SPEC §1 example, then a steady stream of inserts,
//! overwrites, partition drops and table churn with real files), mounts it,
//! prints what to try, and on Ctrl-C unmounts and removes its temporary
//! folders.
//!
//! `--hive`: the same warehouse reaches stagefs as Hive would write it:
//! every native event is converted (`workload::hive_export`) into `NOTIFICATION_LOG`
//! rows with `gzip(json-2.0)` messages, file URIs with HDFS checksums and
//! a change-management root, and replicated through `--hive-events` and
//! `--source-map`.

use std::path::PathBuf;
use std::time::Instant;

use tracing::info;

use crate::daemon::{self, DaemonError, MountArgs, ReplicateArgs};
use crate::replicate::{Replica, ReplicaConfig};
use crate::source::hive::map::SourceMap;
use crate::source::hive::{HiveConfig, HiveRows};
use crate::workload::hive_export::{HiveWriter, LogConverter};
use crate::workload::{write_seed_example, Workload, WorkloadConfig};

/// Events the demo source produces per second after the example.
const EVENTS_PER_SECOND: u64 = 2;

pub fn run(mountpoint: Option<PathBuf>, hive: bool) -> Result<(), DaemonError> {
    let io = |what: &str| {
        let what = what.to_owned();
        move |e: std::io::Error| DaemonError::Io(format!("{what}: {e}"))
    };
    let work = tempfile::Builder::new()
        .prefix("stagefs-demo-")
        .tempdir()
        .map_err(io("creating the demo folder"))?;
    let (mountpoint, made_mountpoint) = match mountpoint {
        Some(m) => {
            if !m.exists() {
                std::fs::create_dir_all(&m).map_err(io("creating the mountpoint"))?;
                (m, true)
            } else {
                (m, false)
            }
        }
        None => {
            let m = work.path().join("mnt");
            std::fs::create_dir(&m).map_err(io("creating the mountpoint"))?;
            (m, false)
        }
    };
    let src = work.path().join("warehouse");
    let state = work.path().join("state");
    write_seed_example(&src).map_err(io("writing the example warehouse"))?;
    let mut workload = Workload::new(
        &src,
        WorkloadConfig {
            seed: crate::status::now_ms() as u64,
            databases: 1,
            tables_per_db: 3,
            partitions: 4,
            max_files_per_insert: 2,
            min_file_bytes: 64,
            max_file_bytes: 4096,
            events_per_log_file: 500,
            // Tables stay put, so the paths the tour prints keep working;
            // inserts, overwrites and partition drops keep them changing.
            table_churn: false,
            start_id: 50,
        },
    )
    .map_err(io("starting the demo workload"))?;
    // A first few events, so that db0's tables exist when the tour is shown.
    while (0..3).any(|t| {
        workload
            .expected_table(workload.latest(), "db0", &format!("t{t}"))
            .is_none()
    }) {
        workload.step().map_err(io("writing the demo warehouse"))?;
    }

    let args = MountArgs {
        mountpoint: mountpoint.clone(),
        replicate: ReplicateArgs {
            cm_root: Some(src.join("cm")),
            ..ReplicateArgs::native(&state, &src.join("source"), &src.join("events"))
        },
        allow_other: false,
        metrics: None,
    };
    let mut cfg = ReplicaConfig::new(&state, &src.join("source"), &src.join("events"));
    cfg.cm_root = args.replicate.cm_root.clone();
    let mut converter = None;
    if hive {
        let rows = src.join("hive-events/rows.jsonl");
        let writer = HiveWriter::for_workload(&src, &rows, true)
            .map_err(io("starting the Hive row writer"))?;
        let map = SourceMap::parse(&writer.source_map_args()).map_err(DaemonError::Io)?;
        let mut c = LogConverter::new(&src.join("events"), writer);
        c.pump().map_err(io("writing Hive rows"))?;
        cfg.cm_root = None;
        cfg.hive = Some(HiveConfig::new(HiveRows::Files(rows.clone()), map.clone()));
        converter = Some(c);
    }
    daemon::install_signal_handlers();
    let replica = std::sync::Arc::new(Replica::start(cfg)?);
    print_tour(&mountpoint, &src, hive);

    let started = Instant::now();
    let mut produced = 0u64;
    let mut workload_error = None;
    let result = daemon::serve(&args, &replica, None, daemon::stop_requested, |_| {
        let due = started.elapsed().as_millis() as u64 * EVENTS_PER_SECOND / 1000;
        while produced < due && workload_error.is_none() {
            let step = workload.step().and_then(|_| match converter.as_mut() {
                Some(c) => c.pump().map(|_| ()),
                None => Ok(()),
            });
            match step {
                Ok(()) => produced += 1,
                Err(e) => workload_error = Some(e),
            }
        }
    });
    if let Some(e) = workload_error {
        tracing::warn!(error = %e, "the demo source stopped producing events");
    }
    match std::sync::Arc::try_unwrap(replica) {
        Ok(r) => r.stop(),
        Err(_) => tracing::warn!("replication still referenced at exit"),
    }
    if made_mountpoint {
        let _ = std::fs::remove_dir(&mountpoint);
    }
    info!(folder = %work.path().display(), "removing the demo folder");
    drop(work);
    println!(
        "\nstagefs demo stopped; unmounted {} and removed its temporary folders.",
        mountpoint.display()
    );
    result
}

fn print_tour(mnt: &std::path::Path, src: &std::path::Path, hive: bool) {
    let m = mnt.display();
    let have_attr = std::process::Command::new("getfattr")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    println!(
        "\nstagefs demo: mounted at {m}\n\
         source warehouse (changing {EVENTS_PER_SECOND} events/s): {}\n\n\
         Try, in another terminal:\n\
         \x20 ls -R {m}                                   # tables as directories, partitions as key=value\n\
         \x20 cat {m}/default/blah/p=*/*                  # the SPEC example at state 50: 5, 15, 20\n\
         \x20 getfattr -d -m - {m}                        # visible / latest / state_id of the mount\n\
         \x20 getfattr -d -m - {m}/db0/t0                 # the state a table directory shows\n\
         \x20 setfattr -n user.stagefs.pin -v visible {m}/db0/t0   # hold that table still\n\
         \x20 getfattr -n user.stagefs.pin {m}/db0/t0\n\
         \x20 setfattr -x user.stagefs.pin {m}/db0/t0     # jump to the newest state again\n\
         \x20 ls {m}/.stagefs/snapshots/                  # every retained version, browsable\n\
         \x20 cat {m}/.stagefs/status                     # visible, latest, lag, pins, retained\n\
         \x20 stagefs status {m} --watch                  # (or: cargo run --release -- status {m} --watch)\n\n\
         Press Ctrl-C to unmount and clean up.",
        src.display()
    );
    if hive {
        println!(
            "\nFed through Hive notification rows (gzip(json-2.0)): {}/hive-events/rows.jsonl\n\
             \x20 getfattr -n user.stagefs.verified {m}/default/blah/p=a/000001_0   # hdfs-md5md5crc32c",
            src.display()
        );
    }
    if !have_attr {
        println!("(getfattr/setfattr come from the `attr` package: apt-get install -y attr)");
    }
}
