//! Hive's files read where they are on HDFS (SPEC §2 "Source files where
//! Hive keeps them: HDFS and S3"), against a real HDFS: Hadoop's mini
//! cluster started by `tests/java/hdfs-launcher` (tests/servers/README.md).
//!
//! The Hive pipeline with its warehouse and change-management root on HDFS
//! and no `--source-map`; the blob store fetching HDFS files by URI, each
//! checked with the HDFS checksum the cluster reports; an INSERT OVERWRITE
//! reusing `000000_0`; a DataNode stopped in the middle of a read; and a
//! NameNode that cannot be reached.

mod servers;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use servers::{free_port, MiniHdfs, MiniHdfsOptions};
use sha2::{Digest, Sha256};
use stagefs::event::{BlobId, FileRef, StateId, Verify};
use stagefs::replicate::{Replica, ReplicaConfig};
use stagefs::source::hive::map::SourceMap;
use stagefs::source::hive::HdfsChecks;
use stagefs::source_file::hdfs::{PARTS_AHEAD, PART_BYTES};
use stagefs::source_file::Location;
use stagefs::stage::{BlobStore, FetchOutcome};
use stagefs::testkit::hive_pipeline::{content, hive_rows_config, native_trees};
use stagefs::workload::hive_export::{HiveWriter, LogConverter, CM_URI, WAREHOUSE_URI};
use stagefs::workload::write_seed_example;

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deterministic bytes that differ per `seed` (xorshift64*).
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The authority of `hdfs://authority` the writer's URIs use.
fn demo_authority() -> &'static str {
    let rest = WAREHOUSE_URI.strip_prefix("hdfs://").expect("hdfs URI");
    &rest[..rest.find('/').expect("a path")]
}

/// The seed example as Hive rows (`json-0.2` messages, so the URIs are
/// plain text in the rows) whose URIs name `authority` instead of the
/// writer's demo NameNode. Returns the rows file.
fn seed_rows(src: &Path, authority: &str) -> PathBuf {
    write_seed_example(src).unwrap();
    let rows = src.join("hive/rows.jsonl");
    let writer = HiveWriter::for_workload(src, &rows, false).unwrap();
    LogConverter::new(&src.join("events"), writer)
        .pump()
        .unwrap();
    let text = std::fs::read_to_string(&rows).unwrap();
    assert!(text.contains(demo_authority()), "rows name no demo URI");
    std::fs::write(&rows, text.replace(demo_authority(), authority)).unwrap();
    rows
}

/// Copies every file below `local` to HDFS below `hdfs_dir`.
fn upload_tree(hdfs: &mut MiniHdfs, local: &Path, hdfs_dir: &str) {
    let mut stack = vec![(local.to_owned(), hdfs_dir.to_owned())];
    while let Some((dir, remote)) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            let remote = format!("{remote}/{name}");
            if entry.file_type().unwrap().is_dir() {
                stack.push((entry.path(), remote));
            } else {
                hdfs.put(&entry.path(), &remote).unwrap();
            }
        }
    }
}

/// The path part of one of the writer's URIs (`/warehouse`).
fn uri_path(uri: &str) -> &str {
    &uri["hdfs://".len() + demo_authority().len()..]
}

fn replica_config(state: &Path, rows: &Path) -> ReplicaConfig {
    // No --source-map: every URI is read on HDFS.
    hive_rows_config(state, rows, SourceMap::default())
}

#[test]
fn hive_pipeline_with_the_warehouse_on_hdfs_gives_the_native_states_verified() {
    let mut hdfs = MiniHdfs::start(1).unwrap();
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let authority = hdfs.uri().strip_prefix("hdfs://").unwrap().to_owned();
    let rows = seed_rows(src.path(), &authority);
    upload_tree(
        &mut hdfs,
        &src.path().join("source"),
        uri_path(WAREHOUSE_URI),
    );
    upload_tree(&mut hdfs, &src.path().join("hive-cm"), uri_path(CM_URI));

    let replica = Replica::start(replica_config(state.path(), &rows)).unwrap();
    wait_for("state 50", Duration::from_secs(60), || {
        replica.catalog().snapshot().visible.state_id == StateId(50)
    });
    let native = native_trees(src.path());
    let snap = replica.catalog().snapshot();
    for (id, tree) in &snap.versions {
        let expected = native.range(..=*id).next_back().map(|(_, t)| content(t));
        assert_eq!(Some(content(tree)), expected, "state {id}");
    }
    assert_eq!(content(&snap.visible), content(&native[&StateId(50)]));
    snap.visible.for_each_file(&mut |f| {
        assert_eq!(f.verified, "hdfs-md5md5crc32c");
        assert!(f.source.starts_with(hdfs.uri()), "{}", f.source);
    });
    let status = replica.status();
    assert_eq!(status.unverified_files, 0);
    assert!(status.stalled.is_none(), "{:?}", status.stalled);
    // 000002_0 is only in change management (on HDFS): fetched from there.
    assert!(status.staging.from_change_management >= 1);
}

/// A Hive file reference to `uri` with its HDFS checksum and, when given,
/// the change-management root it would be copied to.
fn hive_file(uri: &str, checksum: &str, cm_root: Option<&str>) -> FileRef {
    let name = uri.rsplit('/').next().unwrap().to_owned();
    FileRef {
        path: uri.to_owned(),
        name: name.clone(),
        subdir: None,
        verify: Verify::Hdfs {
            checksum: checksum.to_owned(),
        },
        key: Some(BlobId(Sha256::digest(uri.as_bytes()).into())),
        source_dir: None,
        cm_path: cm_root.map(|root| format!("{root}/{name}_{checksum}")),
        cm_dir: None,
        uri: Some(uri.to_owned()),
    }
}

fn sha(data: &[u8]) -> BlobId {
    BlobId(Sha256::digest(data).into())
}

fn store(dir: &Path) -> BlobStore {
    BlobStore::open(dir)
        .unwrap()
        .with_checks(Arc::new(HdfsChecks))
}

#[test]
fn insert_overwrite_reusing_000000_0_stages_each_content_from_where_it_is() {
    let mut hdfs = MiniHdfs::start(1).unwrap();
    let state = tempfile::tempdir().unwrap();
    let store = store(state.path());
    let uri = format!("{}/wh/t/000000_0", hdfs.uri());
    let cm_root = format!("{}/cmroot", hdfs.uri());
    // Same name, same length, other bytes: only the checksum tells them apart.
    let (first, second) = (bytes(3 << 20, 1), bytes(3 << 20, 2));
    hdfs.put_bytes("/wh/t/000000_0", &first, None).unwrap();
    let first_sum = hdfs.checksum("/wh/t/000000_0").unwrap().hex;
    let fetched = store
        .fetch_unsynced(
            &hive_file(&uri, &first_sum, Some(&cm_root)),
            Path::new(""),
            None,
        )
        .unwrap();
    assert_eq!(fetched.outcome, FetchOutcome::FromSource);
    assert_eq!(
        (fetched.blob, fetched.size),
        (sha(&first), first.len() as u64)
    );

    // The overwrite: Hive's cm copy of the old file, the new file in place.
    hdfs.put_bytes(&format!("/cmroot/000000_0_{first_sum}"), &first, None)
        .unwrap();
    hdfs.rm("/wh/t/000000_0").unwrap();
    hdfs.put_bytes("/wh/t/000000_0", &second, None).unwrap();
    let second_sum = hdfs.checksum("/wh/t/000000_0").unwrap().hex;
    assert_ne!(first_sum, second_sum);

    // The old reference: the source no longer matches; its cm copy does.
    let old = store
        .fetch_unsynced(
            &hive_file(&uri, &first_sum, Some(&cm_root)),
            Path::new(""),
            None,
        )
        .unwrap();
    assert_eq!(old.outcome, FetchOutcome::FromChangeManagement);
    assert_eq!(old.blob, sha(&first));
    // The new one: from the source.
    let new = store
        .fetch_unsynced(
            &hive_file(&uri, &second_sum, Some(&cm_root)),
            Path::new(""),
            None,
        )
        .unwrap();
    assert_eq!(new.outcome, FetchOutcome::FromSource);
    assert_eq!(new.blob, sha(&second));
    // Wrong checksum, no cm copy: unusable, with the URI and the reason.
    let err = store
        .fetch_unsynced(&hive_file(&uri, &"0".repeat(32), None), Path::new(""), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&uri), "{err}");
}

#[test]
fn a_datanode_stopped_mid_read_is_read_around_and_the_copy_verifies() {
    let mut opts = MiniHdfsOptions::new(2);
    opts.replication = Some(2);
    opts.block_size = Some(1 << 20);
    let mut hdfs = MiniHdfs::start_with(opts).unwrap();
    // Longer than the parts read ahead after the first, so parts are
    // still to be read (and some in flight) when the DataNode stops.
    let len = (PARTS_AHEAD as u64 + 3) * PART_BYTES + 12345;
    let data = bytes(len as usize, 3);
    hdfs.put_bytes("/dn/000000_0", &data, None).unwrap();
    let sum = hdfs.checksum("/dn/000000_0").unwrap().hex;
    let uri = format!("{}/dn/000000_0", hdfs.uri());

    // Through the reader: the first MiB, a DataNode stopped, the rest.
    let file = Location::remote(&uri).unwrap().unwrap().open().unwrap();
    assert_eq!(file.identity().size, data.len() as u64);
    let mut got = vec![0u8; data.len()];
    let first = 1 << 20;
    let mut at = 0;
    while at < first {
        at += file.read_at(&mut got[at..first], at as u64).unwrap();
    }
    hdfs.stop_datanode(0).unwrap();
    while at < data.len() {
        let n = file.read_at(&mut got[at..], at as u64).unwrap();
        assert!(n > 0, "EOF at {at}");
        at += n;
    }
    assert!(got == data, "the bytes read differ");
    // Past the end: nothing, and no panic (hdfs-native panics unclamped).
    assert_eq!(file.read_at(&mut [0u8; 16], data.len() as u64).unwrap(), 0);
    // Out of order: the tail, then the start again.
    let mut tail = [0u8; 64];
    assert_eq!(file.read_at(&mut tail, data.len() as u64 - 10).unwrap(), 10);
    assert_eq!(&tail[..10], &data[data.len() - 10..]);
    let mut head = [0u8; 64];
    assert_eq!(file.read_at(&mut head, 5).unwrap(), 64);
    assert_eq!(&head[..], &data[5..69]);
    assert_eq!(file.identity_now().unwrap(), *file.identity());

    // Through the store, with one DataNode still down: staged and verified.
    let state = tempfile::tempdir().unwrap();
    let fetched = store(state.path())
        .fetch_unsynced(&hive_file(&uri, &sum, None), Path::new(""), None)
        .unwrap();
    assert_eq!(
        (fetched.blob, fetched.size),
        (sha(&data), data.len() as u64)
    );

    // The last replica stopped in the middle: the read fails with the
    // server named, after giving only true bytes; never a short file.
    let file = Location::remote(&uri).unwrap().unwrap().open().unwrap();
    let mut at = 0;
    while at < first {
        at += file.read_at(&mut got[at..first], at as u64).unwrap();
    }
    hdfs.stop_datanode(1).unwrap();
    let err = loop {
        match file.read_at(&mut got[at..], at as u64) {
            Ok(n) => {
                assert!(n > 0 && at + n < data.len(), "read to {} of {len}", at + n);
                at += n;
            }
            Err(e) => break e.to_string(),
        }
    };
    assert!(
        got[..at] == data[..at],
        "the bytes read before the failure differ"
    );
    assert!(err.contains(&hdfs.uri()[7..]), "{err}");
    let state = tempfile::tempdir().unwrap();
    let failed =
        store(state.path()).fetch_unsynced(&hive_file(&uri, &sum, None), Path::new(""), None);
    assert!(failed.is_err(), "staged with every DataNode down");
}

#[test]
fn an_unreachable_namenode_stalls_naming_file_and_server_and_keeps_the_state() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    // Nothing listens there.
    let authority = format!("127.0.0.1:{}", free_port());
    let rows = seed_rows(src.path(), &authority);
    let replica = Replica::start(replica_config(state.path(), &rows)).unwrap();
    wait_for("the stall", Duration::from_secs(60), || {
        replica.status().stalled.is_some()
    });
    let reason = replica.status().stalled.unwrap().reason;
    assert!(reason.contains(&authority), "{reason}");
    assert!(reason.contains("000001_0"), "{reason}");
    // The last state without files still serves; nothing half-applied.
    let snap = replica.catalog().snapshot();
    assert!(
        snap.visible.state_id < StateId(20),
        "{:?}",
        snap.visible.state_id
    );
    let mut files = 0;
    snap.visible.for_each_file(&mut |_| files += 1);
    assert_eq!(files, 0);
}

#[test]
fn a_missing_file_and_a_directory_are_refused_with_the_reason() {
    let mut hdfs = MiniHdfs::start(1).unwrap();
    hdfs.mkdir("/d/sub").unwrap();
    let missing = Location::remote(&format!("{}/d/nothing", hdfs.uri()))
        .unwrap()
        .unwrap();
    let err = missing.open().err().expect("a missing file opened");
    assert_eq!(err.to_string(), "missing");
    let dir = Location::remote(&format!("{}/d/sub", hdfs.uri()))
        .unwrap()
        .unwrap();
    let err = dir.open().err().expect("a directory opened");
    assert!(err.to_string().contains("directory"), "{err}");
}

#[test]
fn bootstrap_lists_an_hdfs_location_by_hives_rules_and_stages_it_once() {
    use stagefs::bootstrap::listing::{list_remote, FileStager, Staged};
    use stagefs::bootstrap::progress::BootstrapProgress;
    use stagefs::source_file::Remotes;
    let mut hdfs = MiniHdfs::start(1).unwrap();
    let files = [
        ("000000_0", bytes(3 << 20, 11)),
        ("000001_0", bytes(10, 12)),
        ("_SUCCESS", Vec::new()),
        (".000000_0.crc", bytes(8, 13)),
        (".hive-staging_1/000000_0", bytes(9, 14)),
        ("HIVE_UNION_SUBDIR_1/000000_0", bytes(100, 15)),
        ("HIVE_UNION_SUBDIR_1/_tmp/x", bytes(5, 16)),
    ];
    for (rel, data) in &files {
        hdfs.put_bytes(&format!("/wh/t/ds=1/{rel}"), data, None)
            .unwrap();
    }
    hdfs.put_bytes("/wh/t/ds=10/000000_0", b"other", None)
        .unwrap();
    // Settled (written more than a second before the listing): a file
    // staged once is then trusted by its identity (a file listed right
    // after it was written is copied again rather than trusted).
    std::thread::sleep(Duration::from_millis(1200));
    let location = format!("{}/wh/t/ds=1", hdfs.uri());
    let loc = Location::remote(&location).unwrap().unwrap();
    let listed = list_remote(&loc, &location, &Remotes::default()).unwrap();
    let rels: Vec<&str> = listed.iter().map(|f| f.rel.as_str()).collect();
    assert_eq!(
        rels,
        ["000000_0", "000001_0", "HIVE_UNION_SUBDIR_1/000000_0"]
    );
    assert_eq!(listed[0].size, 3 << 20);
    assert!(listed.iter().all(|f| f.source_dir.is_none()));
    let missing = format!("{}/wh/t/ds=2", hdfs.uri());
    let loc2 = Location::remote(&missing).unwrap().unwrap();
    assert!(list_remote(&loc2, &missing, &Remotes::default())
        .unwrap()
        .is_empty());

    let state = tempfile::tempdir().unwrap();
    let blobs = Arc::new(store(state.path()));
    let dir = state.path().join("bootstrap");
    let progress = BootstrapProgress::default();
    let staged = FileStager::open(&dir, Arc::clone(&blobs), 2)
        .unwrap()
        .stage(&listed, &progress);
    let want = |rel: &str| {
        let data = &files.iter().find(|(r, _)| *r == rel).unwrap().1;
        Staged::Stored {
            blob: sha(data),
            size: data.len() as u64,
        }
    };
    for (f, s) in listed.iter().zip(&staged) {
        assert_eq!(*s, want(&f.rel), "{}", f.rel);
    }
    assert_eq!(progress.report().files_copied, 3);
    let progress = BootstrapProgress::default();
    let again = FileStager::open(&dir, blobs, 2)
        .unwrap()
        .stage(&listed, &progress);
    assert_eq!(again, staged);
    assert_eq!(progress.report().files_copied, 0);
}
