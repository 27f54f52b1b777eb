//! `stagefs demo`: a self-contained tour. It writes a source warehouse in a
//! temporary folder (the SPEC §1 example, then a steady stream of inserts,
//! overwrites, partition drops and table churn with real files), mounts it,
//! prints what to try, and on Ctrl-C unmounts and removes its temporary
//! folders.

use std::path::PathBuf;
use std::time::Instant;

use tracing::info;

use crate::daemon::{self, DaemonError, MountArgs, ReplicateArgs};
use crate::replicate::{Replica, ReplicaConfig};
use crate::workload::{write_seed_example, Workload, WorkloadConfig};

/// Events the demo source produces per second after the example.
const EVENTS_PER_SECOND: u64 = 2;

pub fn run(mountpoint: Option<PathBuf>) -> Result<(), DaemonError> {
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
            state: state.clone(),
            source_root: src.join("source"),
            events: src.join("events"),
            cm_root: Some(src.join("cm")),
            retain: 16,
        },
        allow_other: false,
    };
    let mut cfg = ReplicaConfig::new(&state, &args.replicate.source_root, &args.replicate.events);
    cfg.cm_root = args.replicate.cm_root.clone();
    daemon::install_signal_handlers();
    let replica = std::sync::Arc::new(Replica::start(cfg)?);
    print_tour(&mountpoint, &src);

    let started = Instant::now();
    let mut produced = 0u64;
    let mut workload_error = None;
    let result = daemon::serve(&args, &replica, daemon::stop_requested, |_| {
        let due = started.elapsed().as_millis() as u64 * EVENTS_PER_SECOND / 1000;
        while produced < due && workload_error.is_none() {
            match workload.step() {
                Ok(_) => produced += 1,
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

fn print_tour(mnt: &std::path::Path, src: &std::path::Path) {
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
    if !have_attr {
        println!("(getfattr/setfattr come from the `attr` package: apt-get install -y attr)");
    }
}
