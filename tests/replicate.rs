//! End-to-end replication without a mount: source log → journal → blobs →
//! commits, checked against the workload's oracle.

use std::path::Path;
use std::time::{Duration, Instant};

use stagefs::catalog::Tree;
use stagefs::event::StateId;
use stagefs::replicate::{Replica, ReplicaConfig};
use stagefs::workload::{write_seed_example, Workload, WorkloadConfig};

fn config(state: &Path, root: &Path) -> ReplicaConfig {
    let mut cfg = ReplicaConfig::new(state, &root.join("source"), &root.join("events"));
    cfg.cm_root = Some(root.join("cm"));
    cfg.gc_interval = Duration::from_millis(100);
    cfg
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn table_files(tree: &Tree, db: &str, t: &str) -> Vec<(String, String)> {
    tree.table(db, t)
        .map(|table| {
            table
                .files_below()
                .into_iter()
                .map(|(p, b)| (p, b.to_hex()))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn seed_example_reaches_state_50_through_change_management() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_seed_example(src.path()).unwrap();
    let replica = Replica::start(config(state.path(), src.path())).unwrap();
    wait_for("state 50", Duration::from_secs(10), || {
        replica.catalog().snapshot().visible.state_id == StateId(50)
    });
    let snap = replica.catalog().snapshot();
    let files = table_files(&snap.visible, "default", "blah");
    assert_eq!(files.len(), 3);
    let status = replica.status();
    assert_eq!(status.latest, StateId(50));
    assert_eq!(status.lag_events, 0);
    assert!(status.stalled.is_none());
    for (_, hex) in files {
        let blob = stagefs::event::BlobId::from_hex(&hex).unwrap();
        assert!(replica.blobs().contains(&blob));
    }
}

#[test]
fn missing_file_stalls_until_it_arrives() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_seed_example(src.path()).unwrap();
    // Hold back the cm copy of 000002_0 and stop the log at 40.
    let cm = src.path().join("cm");
    let held = std::fs::read_dir(&cm)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let aside = src.path().join("held");
    std::fs::rename(&held, &aside).unwrap();
    let log = src.path().join("events/log-000001.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(&log, lines[..5].join("\n") + "\n").unwrap();

    let replica = Replica::start(config(state.path(), src.path())).unwrap();
    // The stall on 30 can be reported before state 20's commit lands (its
    // file may still be in flight): wait for both, then check they hold.
    wait_for(
        "a stall on 30 with 20 visible",
        Duration::from_secs(10),
        || {
            replica
                .status()
                .stalled
                .is_some_and(|s| s.state_id == Some(StateId(30)))
                && replica.catalog().snapshot().visible.state_id == StateId(20)
        },
    );
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(replica.catalog().snapshot().visible.state_id, StateId(20));
    let reason = replica.status().stalled.unwrap().reason;
    assert!(reason.contains("000002_0"), "{reason}");
    std::fs::rename(&aside, &held).unwrap();
    wait_for("state 40", Duration::from_secs(15), || {
        replica.catalog().snapshot().visible.state_id == StateId(40)
    });
    assert!(replica.status().stalled.is_none());
}

#[test]
fn random_workload_replicates_exactly_and_survives_restart() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut w = Workload::new(
        src.path(),
        WorkloadConfig {
            seed: 7,
            ..Default::default()
        },
    )
    .unwrap();
    for _ in 0..300 {
        w.step().unwrap();
    }
    let latest = w.latest();
    {
        let replica = Replica::start(config(state.path(), src.path())).unwrap();
        wait_for("latest", Duration::from_secs(20), || {
            replica.catalog().snapshot().visible.state_id == latest
        });
        replica.stop();
    }
    for _ in 0..100 {
        w.step().unwrap();
    }
    let latest = w.latest();
    let replica = Replica::start(config(state.path(), src.path())).unwrap();
    wait_for("latest after restart", Duration::from_secs(20), || {
        replica.catalog().snapshot().visible.state_id == latest
    });
    let snap = replica.catalog().snapshot();
    let expected = w.expected(latest).unwrap();
    for (key, content) in expected.iter() {
        let (db, t) = key.split_once('.').unwrap();
        let got = table_files(&snap.visible, db, t);
        let want: Vec<(String, String)> = content
            .iter()
            .map(|(p, b)| (p.clone(), b.to_hex()))
            .collect();
        assert_eq!(got, want, "{key}");
    }
    // Every retained version is one of the source's states.
    for (id, tree) in &snap.versions {
        let expected = w.expected(*id).unwrap();
        for (key, content) in expected.iter() {
            let (db, t) = key.split_once('.').unwrap();
            let want: Vec<(String, String)> = content
                .iter()
                .map(|(p, b)| (p.clone(), b.to_hex()))
                .collect();
            assert_eq!(table_files(tree, db, t), want, "{key} at {id}");
        }
    }
}

/// Every file below `dir` with its bytes.
fn files_below(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            out.extend(files_below(&p));
        } else {
            let bytes = std::fs::read(&p).unwrap();
            out.push((p, bytes));
        }
    }
    out.sort();
    out
}

#[test]
fn damaged_committed_journal_record_stops_start_and_keeps_every_file() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_seed_example(src.path()).unwrap();
    {
        let replica = Replica::start(config(state.path(), src.path())).unwrap();
        wait_for("state 50", Duration::from_secs(10), || {
            replica.catalog().snapshot().visible.state_id == StateId(50)
        });
        replica.stop();
    }
    // Flip the last payload byte of the last record (state 50, committed):
    // its CRC no longer matches, as if the disk had damaged it.
    let journal = state.path().join("journal");
    let segment = std::fs::read_dir(&journal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .max()
        .unwrap();
    let mut bytes = std::fs::read(&segment).unwrap();
    *bytes.last_mut().unwrap() ^= 0x20;
    std::fs::write(&segment, &bytes).unwrap();
    let before = files_below(state.path());

    let err = Replica::start(config(state.path(), src.path()))
        .err()
        .expect("start must refuse to drop committed state 50");
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            stagefs::replicate::ReplicaError::Journal(
                stagefs::journal::JournalError::CutBelowCommit { durable, .. }
            ) if durable == StateId(50)
        ),
        "{msg}"
    );
    assert!(msg.contains(&segment.display().to_string()), "{msg}");
    assert!(msg.contains("offset"), "{msg}");
    // Only the lock file may differ (it is created empty and stays so).
    assert_eq!(
        files_below(state.path()),
        before,
        "start changed the state folder"
    );
}

#[test]
fn a_panicking_pipeline_thread_stops_replication_with_a_stalled_reason() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_seed_example(src.path()).unwrap();
    let replica = Replica::start(config(state.path(), src.path())).unwrap();
    wait_for("state 50", Duration::from_secs(10), || {
        replica.catalog().snapshot().visible.state_id == StateId(50)
    });
    // GC calls what readers hold on its next pass: make that panic, then
    // commit something so that a pass runs.
    replica.set_held_dirs(std::sync::Arc::new(|| panic!("held dirs exploded")));
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(src.path().join("events/log-000001.jsonl"))
        .unwrap();
    std::io::Write::write_all(
        &mut log,
        b"{\"id\": 60, \"op\": \"create_database\", \"db\": \"other\"}\n",
    )
    .unwrap();
    wait_for("the panic to be reported", Duration::from_secs(10), || {
        replica.status().stalled.is_some()
    });
    let stall = replica.status().stalled.unwrap();
    assert!(
        stall.reason.contains("gc thread panicked") && stall.reason.contains("held dirs exploded"),
        "{stall:?}"
    );
    // Stopped for good: it stays reported, and nothing moves any more.
    let visible = replica.catalog().snapshot().visible.state_id;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(replica.catalog().snapshot().visible.state_id, visible);
    assert_eq!(replica.status().stalled, Some(stall));
    replica.stop();
}

/// The nice value of each thread of this process whose name is in `names`
/// (`/proc/self/task/*/stat`, field 19).
fn thread_nices(names: &[&str]) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let (Ok(comm), Ok(stat)) = (
            std::fs::read_to_string(task.path().join("comm")),
            std::fs::read_to_string(task.path().join("stat")),
        ) else {
            continue; // ended meanwhile
        };
        let comm = comm.trim().to_owned();
        let matches = names
            .iter()
            .any(|n| comm == *n || (n.ends_with('-') && comm.starts_with(n)));
        if matches {
            out.push((comm, nice_in_stat(&stat)));
        }
    }
    out
}

/// The nice value in a `/proc/…/stat` line: after "pid (comm) ", the
/// state is field 3 and nice field 19.
fn nice_in_stat(stat: &str) -> i64 {
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    fields[16].parse().unwrap()
}

/// Staging gives way to ingest: the stager, its fetch threads and GC run
/// 10 nice levels below the thread that started the replica, checkpoints
/// at the lowest priority, ingest at that thread's own.
#[test]
fn staging_threads_run_at_a_lower_cpu_priority_than_ingest() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_seed_example(src.path()).unwrap();
    let own = nice_in_stat(&std::fs::read_to_string("/proc/thread-self/stat").unwrap());
    let replica = Replica::start(config(state.path(), src.path())).unwrap();
    wait_for("state 50", Duration::from_secs(10), || {
        replica.catalog().snapshot().visible.state_id == StateId(50)
    });
    let expected = |name: &str| match name {
        "ingest" => own,
        "checkpoint" => 19,
        _ => (own + 10).min(19),
    };
    let names = ["ingest", "stager", "gc", "checkpoint", "fetch-"];
    // Other tests' replicas share the names and the rule; a thread that
    // has just started may not have set its priority yet.
    let start = Instant::now();
    loop {
        let seen = thread_nices(&names);
        let wrong: Vec<_> = seen.iter().filter(|(n, v)| *v != expected(n)).collect();
        let all_there = names.iter().all(|n| {
            seen.iter()
                .any(|(s, _)| s == n || s.starts_with(n) && n.ends_with('-'))
        });
        if wrong.is_empty() && all_there {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "thread priorities (own nice {own}): {seen:?}; wrong: {wrong:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    replica.stop();
}

/// Appends `events` (one JSON object per line) to the source log in one write.
fn append_log(root: &Path, events: &[serde_json::Value]) {
    use std::io::Write;
    let dir = root.join("events");
    std::fs::create_dir_all(&dir).unwrap();
    let text: String = events.iter().map(|e| format!("{e}\n")).collect();
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("log-000001.jsonl"))
        .unwrap();
    log.write_all(text.as_bytes()).unwrap();
}

/// Writes `bytes` at `source/rel`; returns the event's file object.
fn source_file(root: &Path, rel: &str, bytes: &[u8]) -> serde_json::Value {
    let p = root.join("source").join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, bytes).unwrap();
    file_object(rel, bytes)
}

fn file_object(rel: &str, bytes: &[u8]) -> serde_json::Value {
    use sha2::Digest;
    let sha = sha2::Sha256::digest(bytes);
    let hex: String = sha.iter().map(|b| format!("{b:02x}")).collect();
    serde_json::json!({"path": rel, "size": bytes.len(), "sha256": hex})
}

fn add_files(id: u64, table: &str, p: &str, files: Vec<serde_json::Value>) -> serde_json::Value {
    serde_json::json!({"id": id, "op": "add_files", "db": "d", "table": table, "partition": {"p": p}, "files": files})
}

/// Issue 13, item 1: only the first file entry of a blob used to be
/// fetched. X is nowhere; Y, added later with the same bytes, is at the
/// source: the blob is read through Y, so the state with both commits, and
/// so does a later one that drops X.
#[test]
fn a_missing_file_is_staged_from_another_path_with_the_same_bytes() {
    let root = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("cm")).unwrap();
    let bytes = b"same bytes\n";
    let x = file_object("d/t/p=a/x_0", bytes);
    append_log(
        root.path(),
        &[
            serde_json::json!({"id": 1, "op": "create_database", "db": "d"}),
            serde_json::json!({"id": 2, "op": "create_table", "db": "d", "table": "t", "partition_keys": ["p"]}),
            add_files(3, "t", "a", vec![x]),
        ],
    );
    let replica = Replica::start(config(state.path(), root.path())).unwrap();
    wait_for("the stall on X", Duration::from_secs(10), || {
        replica.status().stalled.is_some()
    });
    assert_eq!(replica.catalog().snapshot().visible.state_id, StateId(2));

    let y = source_file(root.path(), "d/t/p=b/y_0", bytes);
    append_log(root.path(), &[add_files(4, "t", "b", vec![y])]);
    wait_for("state 4, staged through Y", Duration::from_secs(10), || {
        replica.catalog().snapshot().visible.state_id == StateId(4)
    });
    let visible = replica.catalog().snapshot().visible.clone();
    assert_eq!(table_files(&visible, "d", "t").len(), 2);

    append_log(
        root.path(),
        &[
            serde_json::json!({"id": 5, "op": "drop_partition", "db": "d", "table": "t", "partition": {"p": "a"}}),
        ],
    );
    wait_for("state 5, without X", Duration::from_secs(10), || {
        replica.catalog().snapshot().visible.state_id == StateId(5)
    });
    wait_for("the stall to clear", Duration::from_secs(10), || {
        replica.status().stalled.is_none()
    });
    let visible = replica.catalog().snapshot().visible.clone();
    let files = table_files(&visible, "d", "t");
    assert_eq!(files.len(), 1);
    let blob = stagefs::event::BlobId::from_hex(&files[0].1).unwrap();
    assert!(replica.blobs().contains(&blob));
}

/// Issue 13, item 2: with at most 4 pending states kept, a state blocked
/// on a missing file used to stop the stager for good once 4 states
/// waited: the event that unblocks it (here the 30th after it, past a
/// rename) was never read. Now the newest state absorbs the events past
/// the bound and the unblocking event is read.
#[test]
fn a_blocked_state_past_the_pending_bound_is_unblocked_by_a_later_event() {
    let root = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("cm")).unwrap();
    let mut events = vec![
        serde_json::json!({"id": 1, "op": "create_database", "db": "d"}),
        serde_json::json!({"id": 2, "op": "create_table", "db": "d", "table": "t", "partition_keys": ["p"]}),
        add_files(
            3,
            "t",
            "a",
            vec![file_object("d/t/p=a/never", b"nowhere\n")],
        ),
    ];
    let mut id = 3;
    for i in 0..30 {
        id += 1;
        if i == 15 {
            events.push(serde_json::json!({"id": id, "op": "rename_table", "db": "d", "table": "t", "new_db": "d", "new_table": "u"}));
            continue;
        }
        let table = if i < 15 { "t" } else { "u" };
        let rel = format!("d/t/p=b/f_{i}");
        let f = source_file(root.path(), &rel, format!("file {i}\n").as_bytes());
        events.push(add_files(id, table, "b", vec![f]));
    }
    append_log(root.path(), &events);
    let mut cfg = config(state.path(), root.path());
    cfg.max_pending = 4;
    let replica = Replica::start(cfg).unwrap();
    wait_for("ingest of every event", Duration::from_secs(10), || {
        replica.status().latest == StateId(id) && replica.status().stalled.is_some()
    });
    assert_eq!(replica.catalog().snapshot().visible.state_id, StateId(2));

    id += 1;
    append_log(
        root.path(),
        &[
            serde_json::json!({"id": id, "op": "drop_partition", "db": "d", "table": "u", "partition": {"p": "a"}}),
        ],
    );
    wait_for(
        "the unblocking event's state",
        Duration::from_secs(10),
        || replica.catalog().snapshot().visible.state_id == StateId(id),
    );
    let visible = replica.catalog().snapshot().visible.clone();
    let files = table_files(&visible, "d", "u");
    assert_eq!(files.len(), 29);
    for (_, hex) in files {
        let blob = stagefs::event::BlobId::from_hex(&hex).unwrap();
        assert!(replica.blobs().contains(&blob));
    }
    wait_for("the stall to clear", Duration::from_secs(10), || {
        replica.status().stalled.is_none()
    });
}
