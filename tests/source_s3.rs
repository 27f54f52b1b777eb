//! Hive's files read where they are on S3 (SPEC §2 "Source files where
//! Hive keeps them: HDFS and S3"), against a real S3-compatible server:
//! SeaweedFS started privately by each test (tests/servers/README.md).
//!
//! The Hive pipeline with its warehouse and change-management root in a
//! bucket and no `--source-map`, every file checked with the ETag checksum
//! S3A records; an INSERT OVERWRITE reusing `000000_0` in an unversioned
//! and in a versioned bucket (a rewrite in the middle of a read is never a
//! mixed copy); files without a checksum and "not newer than its event"
//! (with the default margin and a wider one; in a versioned bucket, the
//! version current at the event); and faults through a TCP proxy: `503
//! SlowDown`, connections reset in the middle of a file, an outage, a
//! refused credential, a ListObjectVersions answer that is no listing.

mod servers;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use md5::Md5;
use servers::{FaultMode, FaultProxy, S3Server};
use sha2::{Digest, Sha256};
use stagefs::event::{BlobId, Event, FileRef, StateId, Verify};
use stagefs::replicate::{Replica, ReplicaConfig};
use stagefs::source::hive::map::SourceMap;
use stagefs::source::hive::uri::cm_file_name;
use stagefs::source::hive::HdfsChecks;
use stagefs::source_file::s3::{Credentials, S3Access, S3Settings, Secret, PART_BYTES};
use stagefs::source_file::{Location, Remotes};
use stagefs::stage::{BlobStore, EventTimeMargin, FetchOutcome};
use stagefs::testkit::checker::{
    check_stagefs_table, mount_status, run_readers, visible, CheckConfig, DaemonProcess, Oracle,
    Target,
};
use stagefs::testkit::hive_pipeline::{content, hive_rows_config, native_trees};
use stagefs::workload::hive_export::{HiveWriter, LogConverter, CM_URI, WAREHOUSE_URI};
use stagefs::workload::{write_seed_example, Workload, WorkloadConfig};

const BUCKET: &str = "warehouse";

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

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha(data: &[u8]) -> BlobId {
    BlobId(Sha256::digest(data).into())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// What a PUT answered: the ETag (without quotes) and the version id.
struct Put {
    etag: String,
    version: Option<String>,
}

/// Stores `data` at `bucket/key` with one signed PUT.
fn put(s3: &S3Server, bucket: &str, key: &str, data: &[u8]) -> Put {
    let r = s3
        .request("PUT", &format!("/{bucket}/{key}"), &[], &[], data)
        .unwrap();
    assert_eq!(r.status, 200, "PUT {key}: {}", r.text());
    Put {
        etag: r
            .header("ETag")
            .unwrap_or_default()
            .trim_matches('"')
            .to_owned(),
        version: r.header("x-amz-version-id").map(str::to_owned),
    }
}

/// The checksum S3A records for an object with `etag`: the hex of the
/// ETag's text, quoted (Hadoop 3.4) or not (3.3).
fn etag_checksum(etag: &str, quoted: bool) -> String {
    if quoted {
        hex(format!("\"{etag}\"").as_bytes())
    } else {
        hex(etag.as_bytes())
    }
}

/// S3 through `endpoint` (the server or a proxy in front of it) as the
/// server's identity, or with `secret` instead of its secret key.
fn access_with(s3: &S3Server, endpoint: &str, secret: Option<&str>) -> Arc<S3Access> {
    Arc::new(S3Access::new(S3Settings {
        endpoint: Some(endpoint.to_owned()),
        region: s3.region().to_owned(),
        credentials: Some(Credentials {
            access_key_id: s3.access_key().to_owned(),
            secret_access_key: Secret::new(secret.unwrap_or(s3.secret_key())),
            session_token: None,
        }),
        request_timeout: Duration::from_secs(10),
        source: "test".into(),
    }))
}

fn access(s3: &S3Server) -> Arc<S3Access> {
    access_with(s3, &s3.endpoint(), None)
}

fn store(dir: &Path, access: Arc<S3Access>) -> BlobStore {
    BlobStore::open(dir)
        .unwrap()
        .with_checks(Arc::new(HdfsChecks))
        .with_remotes(Remotes::with_s3(access))
}

/// A Hive file reference to `uri` checked by `verify`, with the
/// change-management root its copy would be under.
fn s3_file(uri: &str, verify: Verify, cm_root: Option<&str>) -> FileRef {
    let name = uri.rsplit('/').next().unwrap().to_owned();
    let cm_path = match (&verify, cm_root) {
        (Verify::S3Etag { checksum }, Some(root)) => Some(format!("{root}/{name}_{checksum}")),
        _ => None,
    };
    FileRef {
        path: uri.to_owned(),
        name,
        subdir: None,
        verify,
        key: Some(BlobId(Sha256::digest(uri.as_bytes()).into())),
        source_dir: None,
        cm_path,
        cm_dir: None,
        uri: Some(uri.to_owned()),
    }
}

fn fetch(store: &BlobStore, f: &FileRef) -> Result<(FetchOutcome, BlobId, u64), String> {
    store
        .fetch_unsynced(f, Path::new(""), None)
        .map(|got| (got.outcome, got.blob, got.size))
        .map_err(|e| e.to_string())
}

/// Hive rows (`json-0.2`, URIs as plain text) as they would be with the
/// warehouse and change-management root in `bucket` and S3A's ETag
/// checksums in the URIs (quoted and unquoted in turn). What each row
/// names is put in the bucket first: the bytes its event names (the cm
/// copy the writer made, under `root/hive-cm`) at the file's key, and the
/// same bytes under the cm name the new checksum gives. `renamed` maps the
/// HDFS checksums seen so far to their S3 ones. Without `put_files`, only
/// the cm copies are put (the caller puts the warehouse itself).
fn rows_to_s3(
    s3: &S3Server,
    root: &Path,
    bucket: &str,
    rows: &str,
    renamed: &mut BTreeMap<String, String>,
    put_files: bool,
) -> String {
    let prefix = format!("{WAREHOUSE_URI}/");
    let mut rest = rows;
    while let Some(at) = rest.find(&prefix) {
        rest = &rest[at + prefix.len()..];
        // A file URI (`path#checksum#cmroot#subdir`), not a location.
        let Some(hash_at) = rest.find(['#', '"', '\\', ' ']) else {
            break;
        };
        if rest.as_bytes()[hash_at] != b'#' {
            continue;
        }
        let path = &rest[..hash_at];
        let after = &rest[hash_at + 1..];
        let checksum = &after[..after.find('#').unwrap()];
        if checksum.is_empty() || renamed.contains_key(checksum) {
            continue;
        }
        let base = path.rsplit('/').next().unwrap();
        let cm_copy = root.join("hive-cm").join(cm_file_name(base, checksum));
        let data = std::fs::read(&cm_copy).unwrap();
        let quoted = renamed.len() % 2 == 0;
        let s3_sum = etag_checksum(&hex(&Md5::digest(&data)), quoted);
        let cm_key = format!("cmroot/{}", cm_file_name(base, &s3_sum));
        assert_eq!(
            etag_checksum(&put(s3, bucket, &cm_key, &data).etag, quoted),
            s3_sum
        );
        if put_files {
            put(s3, bucket, &format!("warehouse/{path}"), &data);
        }
        renamed.insert(checksum.to_owned(), s3_sum);
    }
    let mut text = rows.to_owned();
    for (hdfs_sum, s3_sum) in renamed.iter() {
        text = text.replace(&format!("#{hdfs_sum}#"), &format!("#{s3_sum}#"));
    }
    text = text
        .replace(CM_URI, &format!("s3a://{bucket}/cmroot"))
        .replace(WAREHOUSE_URI, &format!("s3a://{bucket}/warehouse"));
    assert!(!text.contains("hdfs://"), "an HDFS URI is left");
    text
}

/// The seed example as Hive rows in `bucket` ([`rows_to_s3`]), with the
/// warehouse as the log leaves it (files overwritten or dropped since
/// their event are only in change management). Returns the rows file.
fn seed_rows_in_bucket(s3: &S3Server, src: &Path, bucket: &str) -> PathBuf {
    write_seed_example(src).unwrap();
    let rows = src.join("hive/rows.jsonl");
    let writer = HiveWriter::for_workload(src, &rows, false).unwrap();
    LogConverter::new(&src.join("events"), writer)
        .pump()
        .unwrap();
    let mut renamed = BTreeMap::new();
    let text = rows_to_s3(
        s3,
        src,
        bucket,
        &std::fs::read_to_string(&rows).unwrap(),
        &mut renamed,
        false,
    );
    assert!(renamed.len() >= 3, "too few files with checksums");
    std::fs::write(&rows, text).unwrap();
    let mut stack = vec![(src.join("source"), "warehouse".to_owned())];
    while let Some((dir, key)) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            let key = format!("{key}/{name}");
            if entry.file_type().unwrap().is_dir() {
                stack.push((entry.path(), key));
            } else {
                put(s3, bucket, &key, &std::fs::read(entry.path()).unwrap());
            }
        }
    }
    rows
}

fn replica_config(state: &Path, rows: &Path, access: Arc<S3Access>) -> ReplicaConfig {
    // No --source-map: every URI is read on S3.
    let mut cfg = hive_rows_config(state, rows, SourceMap::default());
    cfg.remotes = Remotes::with_s3(access);
    cfg
}

/// Every state the replica kept equals the source's at its id.
fn assert_native_states(replica: &Replica, src: &Path, last: StateId) {
    let native = native_trees(src);
    let snap = replica.catalog().snapshot();
    for (id, tree) in &snap.versions {
        let expected = native.range(..=*id).next_back().map(|(_, t)| content(t));
        assert_eq!(Some(content(tree)), expected, "state {id}");
    }
    assert_eq!(content(&snap.visible), content(&native[&last]));
}

#[test]
fn hive_pipeline_with_warehouse_and_cmroot_in_a_bucket_gives_the_native_states_verified_by_etag() {
    let s3 = S3Server::start().unwrap();
    s3.create_bucket(BUCKET, false).unwrap();
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let rows = seed_rows_in_bucket(&s3, src.path(), BUCKET);

    let replica = Replica::start(replica_config(state.path(), &rows, access(&s3))).unwrap();
    wait_for("state 50", Duration::from_secs(60), || {
        replica.catalog().snapshot().visible.state_id == StateId(50)
    });
    assert_native_states(&replica, src.path(), StateId(50));
    let mut files = 0;
    replica
        .catalog()
        .snapshot()
        .visible
        .for_each_file(&mut |f| {
            files += 1;
            assert_eq!(f.verified, "s3-etag");
            assert!(
                f.source.starts_with("s3a://warehouse/warehouse/"),
                "{}",
                f.source
            );
        });
    assert!(files >= 3, "{files} files");
    let status = replica.status();
    assert_eq!(status.unverified_files, 0);
    assert!(status.stalled.is_none(), "{:?}", status.stalled);
    // 000002_0 was overwritten: its first content comes from the cm root
    // in the bucket.
    assert!(status.staging.from_change_management >= 1);
}

#[test]
fn insert_overwrite_reusing_000000_0_in_an_unversioned_bucket_stages_each_content_and_never_a_mix()
{
    let s3 = S3Server::start().unwrap();
    s3.create_bucket(BUCKET, false).unwrap();
    let state = tempfile::tempdir().unwrap();
    let store = store(state.path(), access(&s3));
    let uri = format!("s3a://{BUCKET}/wh/t/000000_0");
    let cm_root = format!("s3a://{BUCKET}/cmroot");
    // Same name, same length, other bytes; larger than one part.
    let len = (PART_BYTES * 2 + 12_345) as usize;
    let (first, second) = (bytes(len, 1), bytes(len, 2));
    let one = put(&s3, BUCKET, "wh/t/000000_0", &first);
    let first_sum = etag_checksum(&one.etag, true);
    let first_ref = s3_file(
        &uri,
        Verify::S3Etag {
            checksum: first_sum.clone(),
        },
        Some(&cm_root),
    );
    assert_eq!(
        fetch(&store, &first_ref).unwrap(),
        (FetchOutcome::FromSource, sha(&first), len as u64)
    );
    let written_first = now_ms();

    // Rewritten in the middle of a read: the read fails, never a mix.
    let remotes = Remotes::with_s3(access(&s3));
    let file = Location::remote(&uri)
        .unwrap()
        .unwrap()
        .open_with(&remotes)
        .unwrap();
    assert_eq!(file.etag(), Some(one.etag.as_str()));
    let mut buf = vec![0u8; 1 << 20];
    assert_eq!(file.read_at(&mut buf, 0).unwrap(), buf.len());
    assert!(buf[..] == first[..1 << 20]);
    // Old enough that the file's last-modified time moves (S3 keeps seconds).
    std::thread::sleep(Duration::from_millis(1100));
    // The overwrite: Hive's cm copy of the old file, the new file in place.
    put(&s3, BUCKET, &format!("cmroot/000000_0_{first_sum}"), &first);
    let two = put(&s3, BUCKET, "wh/t/000000_0", &second);
    assert_ne!(one.etag, two.etag);
    let err = file
        .read_at(&mut buf, PART_BYTES)
        .expect_err("a part of the new content was read");
    eprintln!("rewritten mid-read: {err}");
    assert!(err.to_string().contains("changed while reading"), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("127.0.0.1:{}", s3.port())),
        "{err}"
    );
    drop(file);

    // The old reference: the source no longer has its ETag; its cm copy does.
    assert_eq!(
        fetch(&store, &first_ref).unwrap(),
        (FetchOutcome::FromChangeManagement, sha(&first), len as u64)
    );
    // The new one, recorded by Hadoop 3.3 (unquoted): from the source.
    let second_ref = s3_file(
        &uri,
        Verify::S3Etag {
            checksum: etag_checksum(&two.etag, false),
        },
        Some(&cm_root),
    );
    assert_eq!(
        fetch(&store, &second_ref).unwrap(),
        (FetchOutcome::FromSource, sha(&second), len as u64)
    );
    // Without a checksum: the object now is newer than the first event.
    let old_event = s3_file(
        &uri,
        Verify::NotNewerThanEvent {
            time_ms: Some(written_first - 2_000),
        },
        None,
    );
    let err = fetch(&store, &old_event).unwrap_err();
    assert!(
        err.contains(&uri) && err.contains("after its event"),
        "{err}"
    );
    let new_event = s3_file(
        &uri,
        Verify::NotNewerThanEvent {
            time_ms: Some(now_ms()),
        },
        None,
    );
    assert_eq!(fetch(&store, &new_event).unwrap().1, sha(&second));
    // A wrong checksum and no cm copy: unusable, with the URI and why.
    let wrong = s3_file(
        &uri,
        Verify::S3Etag {
            checksum: etag_checksum(&"0".repeat(32), true),
        },
        None,
    );
    let err = fetch(&store, &wrong).unwrap_err();
    assert!(
        err.contains(&uri) && err.contains("another version"),
        "{err}"
    );
}

#[test]
fn in_a_versioned_bucket_a_read_keeps_to_the_version_it_started_with() {
    let s3 = S3Server::start().unwrap();
    s3.create_bucket(BUCKET, true).unwrap();
    let state = tempfile::tempdir().unwrap();
    let uri = format!("s3://{BUCKET}/wh/t/000000_0");
    let len = (PART_BYTES * 2 + 777) as usize;
    let (first, second) = (bytes(len, 3), bytes(len, 4));
    let one = put(&s3, BUCKET, "wh/t/000000_0", &first);
    assert!(
        one.version.is_some(),
        "a versioned bucket gives version ids"
    );

    let remotes = Remotes::with_s3(access(&s3));
    let file = Location::remote(&uri)
        .unwrap()
        .unwrap()
        .open_with(&remotes)
        .unwrap();
    let mut got = vec![0u8; len];
    let mut at = file.read_at(&mut got[..1 << 20], 0).unwrap();
    let two = put(&s3, BUCKET, "wh/t/000000_0", &second);
    assert_ne!(one.version, two.version);
    // The rest comes from the version opened, pinned by its id.
    while at < len {
        let n = file.read_at(&mut got[at..], at as u64).unwrap();
        assert!(n > 0, "EOF at {at}");
        at += n;
    }
    assert!(got == first, "the bytes read mix two versions");
    assert_eq!(file.read_at(&mut [0u8; 8], len as u64).unwrap(), 0);
    assert_eq!(file.identity_now().unwrap(), *file.identity());
    drop(file);

    // Through the store: the version current now, checked by its ETag.
    let store = store(state.path(), access(&s3));
    let f = s3_file(
        &uri,
        Verify::S3Etag {
            checksum: etag_checksum(&two.etag, true),
        },
        None,
    );
    assert_eq!(
        fetch(&store, &f).unwrap(),
        (FetchOutcome::FromSource, sha(&second), len as u64)
    );
}

#[test]
fn throttling_and_resets_are_retried_and_the_copy_is_whole() {
    let s3 = S3Server::start().unwrap();
    s3.create_bucket(BUCKET, false).unwrap();
    let proxy = FaultProxy::start(s3.addr()).unwrap();
    let state = tempfile::tempdir().unwrap();
    let store = store(state.path(), access_with(&s3, &proxy.endpoint(), None));
    let small = bytes(4096, 5);
    let large = bytes((PART_BYTES * 3 + 5) as usize, 6);
    let small_put = put(&s3, BUCKET, "t/small", &small);
    let large_put = put(&s3, BUCKET, "t/large", &large);
    let small_ref = s3_file(
        &format!("s3a://{BUCKET}/t/small"),
        Verify::S3Etag {
            checksum: etag_checksum(&small_put.etag, true),
        },
        None,
    );
    let large_ref = s3_file(
        &format!("s3a://{BUCKET}/t/large"),
        Verify::S3Etag {
            checksum: etag_checksum(&large_put.etag, true),
        },
        None,
    );

    // 503 SlowDown three times, then served.
    proxy.set_mode(FaultMode::SlowDown { requests: 3 }).unwrap();
    assert_eq!(fetch(&store, &small_ref).unwrap().1, sha(&small));
    assert_eq!(proxy.stats().slowed, 3);

    // Connections reset a few MiB into the body: resumed or asked again,
    // and the copy is whole.
    proxy
        .set_mode(FaultMode::ResetAfter {
            bytes: 3 << 20,
            connections: 3,
        })
        .unwrap();
    let (outcome, blob, size) = fetch(&store, &large_ref).unwrap();
    assert_eq!(
        (outcome, blob, size),
        (FetchOutcome::FromSource, sha(&large), large.len() as u64)
    );
    assert!(proxy.stats().reset >= 1, "{:?}", proxy.stats());
}

#[test]
fn an_outage_and_a_refused_credential_name_file_server_and_error_without_the_secret() {
    let s3 = S3Server::start().unwrap();
    s3.create_bucket(BUCKET, false).unwrap();
    let proxy = FaultProxy::start(s3.addr()).unwrap();
    let state = tempfile::tempdir().unwrap();
    let data = bytes(10_000, 7);
    let p = put(&s3, BUCKET, "t/f", &data);
    let uri = format!("s3a://{BUCKET}/t/f");
    let f = s3_file(
        &uri,
        Verify::S3Etag {
            checksum: etag_checksum(&p.etag, true),
        },
        None,
    );
    let server = proxy.addr().to_string();

    proxy.set_mode(FaultMode::Refuse).unwrap();
    let store_via_proxy = store(state.path(), access_with(&s3, &proxy.endpoint(), None));
    let err = fetch(&store_via_proxy, &f).unwrap_err();
    eprintln!("outage: {err}");
    assert!(err.contains(&uri) && err.contains(&server), "{err}");
    assert!(!err.contains(s3.secret_key()), "{err}");
    proxy.set_mode(FaultMode::Pass).unwrap();
    assert_eq!(fetch(&store_via_proxy, &f).unwrap().1, sha(&data));

    let wrong_secret = "not-the-secret-0123456789";
    let refused = store(
        state.path(),
        access_with(&s3, &s3.endpoint(), Some(wrong_secret)),
    );
    let err = fetch(&refused, &f).unwrap_err();
    eprintln!("refused credential: {err}");
    assert!(err.contains(&uri), "{err}");
    assert!(
        err.contains("403") || err.contains("SignatureDoesNotMatch"),
        "{err}"
    );
    assert!(
        !err.contains(wrong_secret) && !err.contains(s3.secret_key()),
        "{err}"
    );
}

#[test]
fn an_unreachable_endpoint_stalls_replication_which_resumes_when_it_is_back() {
    let s3 = S3Server::start().unwrap();
    s3.create_bucket(BUCKET, false).unwrap();
    let proxy = FaultProxy::start(s3.addr()).unwrap();
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let rows = seed_rows_in_bucket(&s3, src.path(), BUCKET);
    proxy.set_mode(FaultMode::Refuse).unwrap();
    let access = access_with(&s3, &proxy.endpoint(), None);
    let replica = Replica::start(replica_config(state.path(), &rows, access)).unwrap();
    wait_for("the stall", Duration::from_secs(60), || {
        replica.status().stalled.is_some()
    });
    let reason = replica.status().stalled.unwrap().reason;
    eprintln!("stalled: {reason}");
    assert!(reason.contains(&proxy.addr().to_string()), "{reason}");
    assert!(reason.contains("000001_0"), "{reason}");
    assert!(!reason.contains(s3.secret_key()), "{reason}");
    // The last state without files still serves; nothing half-applied.
    let snap = replica.catalog().snapshot();
    let mut files = 0;
    snap.visible.for_each_file(&mut |_| files += 1);
    assert_eq!(files, 0);
    assert!(
        snap.visible.state_id < StateId(20),
        "{:?}",
        snap.visible.state_id
    );

    proxy.set_mode(FaultMode::Pass).unwrap();
    wait_for("state 50", Duration::from_secs(90), || {
        replica.catalog().snapshot().visible.state_id == StateId(50)
    });
    assert_native_states(&replica, src.path(), StateId(50));
    assert!(replica.status().stalled.is_none());
}

#[test]
fn a_missing_object_and_a_bad_uri_are_refused_with_the_reason() {
    let s3 = S3Server::start().unwrap();
    s3.create_bucket(BUCKET, false).unwrap();
    let remotes = Remotes::with_s3(access(&s3));
    let missing = Location::remote(&format!("s3a://{BUCKET}/d/nothing"))
        .unwrap()
        .unwrap();
    let err = missing
        .open_with(&remotes)
        .err()
        .expect("a missing object opened");
    assert_eq!(err.to_string(), "missing");
    // An empty object: read whole, zero bytes.
    put(&s3, BUCKET, "d/empty", b"");
    let empty = Location::remote(&format!("s3a://{BUCKET}/d/empty"))
        .unwrap()
        .unwrap()
        .open_with(&remotes)
        .unwrap();
    assert_eq!(empty.identity().size, 0);
    assert_eq!(empty.read_at(&mut [0u8; 8], 0).unwrap(), 0);
    // A bucket that does not exist.
    let err = Location::remote("s3a://no-such-bucket/k")
        .unwrap()
        .unwrap()
        .open_with(&remotes)
        .err()
        .expect("an object of a missing bucket opened");
    assert!(
        err.to_string() == "missing" || err.to_string().contains("NoSuchBucket"),
        "{err}"
    );
    assert!(Location::remote("s3a://warehouse/a/../b").unwrap().is_err());
}

/// The rubberbanding source for the checker: workload steps converted to
/// Hive rows, their files put in the bucket, then the rows appended to
/// what the daemon reads, then the state recorded in the oracle.
struct S3Feed {
    s3: Arc<S3Server>,
    root: PathBuf,
    workload: Workload,
    converter: LogConverter,
    /// How much of the converter's rows was fed.
    fed: usize,
    renamed: BTreeMap<String, String>,
    rows: std::fs::File,
}

impl S3Feed {
    fn new(s3: Arc<S3Server>, dir: &Path, seed: u64) -> S3Feed {
        let root = dir.join("src");
        let workload = Workload::new(&root, WorkloadConfig::for_readers(seed)).unwrap();
        let writer = HiveWriter::for_workload(&root, &root.join("hive/raw.jsonl"), false).unwrap();
        let converter = LogConverter::new(&root.join("events"), writer);
        let rows = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("rows.jsonl"))
            .unwrap();
        S3Feed {
            s3,
            root,
            workload,
            converter,
            fed: 0,
            renamed: BTreeMap::new(),
            rows,
        }
    }

    fn step(&mut self, oracle: &Oracle) {
        use std::io::Write;
        self.workload.step().unwrap();
        self.workload.flush().unwrap();
        self.converter.pump().unwrap();
        let raw = std::fs::read_to_string(self.root.join("hive/raw.jsonl")).unwrap();
        let end = raw.rfind('\n').map_or(0, |i| i + 1);
        if end > self.fed {
            let text = rows_to_s3(
                &self.s3,
                &self.root,
                BUCKET,
                &raw[self.fed..end],
                &mut self.renamed,
                true,
            );
            self.rows.write_all(text.as_bytes()).unwrap();
            self.fed = end;
        }
        oracle.record(&self.workload);
    }
}

#[test]
fn consistency_checker_over_a_mount_reading_s3_finds_no_anomalies() {
    let s3 = Arc::new(S3Server::start().unwrap());
    s3.create_bucket(BUCKET, false).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let oracle = Oracle::new();
    let mut feed = S3Feed::new(Arc::clone(&s3), dir.path(), 41);
    for _ in 0..40 {
        feed.step(&oracle);
    }
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let endpoint = s3.endpoint();
    let flags: Vec<std::ffi::OsString> = vec![
        "--state".into(),
        dir.path().join("state").into(),
        "--hive-events".into(),
        dir.path().join("rows.jsonl").into(),
        "--hive-poll-ms".into(),
        "20".into(),
        "--retain".into(),
        "4".into(),
        "--s3-endpoint".into(),
        endpoint.clone().into(),
    ];
    let args: Vec<&std::ffi::OsStr> = flags.iter().map(|f| f.as_os_str()).collect();
    let daemon = DaemonProcess::start_with_env(
        Path::new(env!("CARGO_BIN_EXE_stagefs")),
        &mnt,
        &args,
        &dir.path().join("daemon.log"),
        "info",
        &[
            ("AWS_ACCESS_KEY_ID", s3.access_key()),
            ("AWS_SECRET_ACCESS_KEY", s3.secret_key()),
            ("AWS_REGION", s3.region()),
        ],
        Duration::from_secs(20),
    )
    .expect("daemon mounts");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, oracle) = (Arc::clone(&stop), Arc::clone(&oracle));
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                feed.step(&oracle);
                std::thread::sleep(Duration::from_millis(10));
            }
            feed
        })
    };
    let cfg = CheckConfig {
        readers: 6,
        target_observations: 4_000,
        min_duration: Duration::from_secs(4),
        max_duration: Duration::from_secs(40),
        min_distinct_ids: 0,
        seed: 13,
    };
    let never = std::sync::atomic::AtomicBool::new(false);
    let report = run_readers(
        &Target::Stagefs { mount: mnt.clone() },
        &oracle,
        &cfg,
        &never,
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let feed = writer.join().unwrap();
    eprintln!("stagefs over S3: {}", report.summary());
    let why = || {
        format!(
            "{}\nstatus: {}\nlog: {}",
            report.summary(),
            std::fs::read_to_string(mnt.join(".stagefs/status")).unwrap_or_default(),
            daemon.log()
        )
    };
    assert_eq!(report.anomalies, 0, "{}", why());
    assert!(report.distinct_ids >= 5, "{}", why());
    // Caught up: every table equals the oracle, every file proven by ETag.
    let latest = feed.workload.latest();
    let start = Instant::now();
    while visible(&mnt).unwrap_or_default() < latest {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "did not reach {latest}: {}",
            why()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut checked = 0;
    for key in feed.workload.expected(latest).unwrap().keys() {
        assert!(
            check_stagefs_table(&oracle, &mnt, key).unwrap().is_some(),
            "{key}"
        );
        checked += 1;
    }
    assert!(checked > 0);
    let status = mount_status(&mnt).unwrap();
    assert_eq!(status.unverified_files, 0, "{}", why());
    let log = daemon.log();
    assert!(!log.contains(s3.secret_key()), "the secret is in the log");
    assert!(
        log.contains("S3 files"),
        "no S3 settings line in the log: {log}"
    );
    let mut daemon = daemon;
    assert!(
        daemon.terminate(Duration::from_secs(10)).unwrap(),
        "{}",
        daemon.log()
    );
}

#[test]
fn bootstrap_lists_an_s3_location_past_one_page_by_hives_rules_and_stages_it_once() {
    use stagefs::bootstrap::listing::{list_remote, FileStager, Staged};
    use stagefs::bootstrap::progress::BootstrapProgress;
    let s3 = S3Server::start().unwrap();
    s3.create_bucket(BUCKET, false).unwrap();
    let location = format!("s3a://{BUCKET}/wh/sales.db/t/ds=1");
    // More keys than one page of ListObjectsV2 (1,000), in parallel.
    let keys: Vec<String> = (0..1_100).map(|i| format!("{i:06}_0")).collect();
    std::thread::scope(|scope| {
        for part in keys.chunks(275) {
            let s3 = &s3;
            scope.spawn(move || {
                for k in part {
                    put(s3, BUCKET, &format!("wh/sales.db/t/ds=1/{k}"), k.as_bytes());
                }
            });
        }
    });
    // What Hive's readers skip, a subdirectory they read, a directory
    // marker, and a neighbour location sharing the prefix.
    for (key, data) in [
        ("wh/sales.db/t/ds=1/_SUCCESS", &b""[..]),
        ("wh/sales.db/t/ds=1/.000000_0.crc", b"crc"),
        ("wh/sales.db/t/ds=1/.hive-staging_1/000000_0", b"staging"),
        ("wh/sales.db/t/ds=1/HIVE_UNION_SUBDIR_1/000000_0", b"union"),
        ("wh/sales.db/t/ds=1/HIVE_UNION_SUBDIR_1/_tmp/x", b"tmp"),
        ("wh/sales.db/t/ds=1/empty-dir/", b""),
        ("wh/sales.db/t/ds=10/000000_0", b"other partition"),
    ] {
        put(&s3, BUCKET, key, data);
    }
    // Settled: written more than a second before the listing.
    std::thread::sleep(Duration::from_millis(1200));
    let remotes = Remotes::with_s3(access(&s3));
    let loc = Location::remote(&location).unwrap().unwrap();
    let files = list_remote(&loc, &location, &remotes).unwrap();
    let rels: Vec<&str> = files.iter().map(|f| f.rel.as_str()).collect();
    assert_eq!(files.len(), 1_101, "{:?}", &rels[1_095..]);
    assert_eq!(rels[0], "000000_0");
    assert!(rels.contains(&"HIVE_UNION_SUBDIR_1/000000_0"));
    assert!(files.iter().all(|f| f.source_dir.is_none()));
    assert_eq!(files[5].path, PathBuf::from(format!("{location}/000005_0")));
    // A location with nothing below it: empty.
    let none = format!("s3a://{BUCKET}/wh/sales.db/t/ds=2");
    let empty = Location::remote(&none).unwrap().unwrap();
    assert!(list_remote(&empty, &none, &remotes).unwrap().is_empty());

    // Staged from S3, once: a second stager on the same state copies nothing.
    let state = tempfile::tempdir().unwrap();
    let blobs = Arc::new(store(state.path(), access(&s3)));
    let progress = BootstrapProgress::default();
    let stager = FileStager::open(&state.path().join("bootstrap"), Arc::clone(&blobs), 4).unwrap();
    let staged = stager.stage(&files[..200], &progress);
    for (f, s) in files.iter().zip(&staged) {
        let want = if f.rel.starts_with("HIVE") {
            b"union".to_vec()
        } else {
            f.rel.as_bytes().to_vec()
        };
        assert_eq!(
            *s,
            Staged::Stored {
                blob: sha(&want),
                size: want.len() as u64
            },
            "{}",
            f.rel
        );
    }
    assert_eq!(progress.report().files_copied, 200);
    drop(stager);
    let again = FileStager::open(&state.path().join("bootstrap"), blobs, 4).unwrap();
    let progress = BootstrapProgress::default();
    let relisted = list_remote(&loc, &location, &remotes).unwrap();
    assert_eq!(again.stage(&relisted[..200], &progress), staged);
    assert_eq!(progress.report().files_copied, 0);

    // A file rewritten after it was listed is not staged as listed.
    put(
        &s3,
        BUCKET,
        "wh/sales.db/t/ds=1/000201_0",
        b"rewritten after the listing",
    );
    let changed = FileStager::open(
        &state.path().join("bootstrap2"),
        Arc::new(store(state.path(), access(&s3))),
        1,
    )
    .unwrap()
    .stage(&files[201..202], &BootstrapProgress::default());
    assert!(
        matches!(&changed[0], Staged::Changed(why) if why.contains("changed")),
        "{changed:?}"
    );
}

#[test]
fn a_bad_s3_endpoint_is_a_usage_error_that_names_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let rows = dir.path().join("rows.jsonl");
    std::fs::write(&rows, "").unwrap();
    for endpoint in ["ftp://127.0.0.1:9000", "http://KEY:SECRET@127.0.0.1:9000"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_stagefs"))
            .arg("replicate")
            .arg("--state")
            .arg(dir.path().join("state"))
            .arg("--hive-events")
            .arg(&rows)
            .args(["--s3-endpoint", endpoint])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{endpoint}: {err}");
        assert!(
            err.contains("--s3-endpoint must be an http:// or https:// URL"),
            "{err}"
        );
        assert!(!err.contains("SECRET"), "{err}");
    }
}

/// Hive rows (`json-0.2`) in `dir/rows.jsonl` for a database `db1` and an
/// unpartitioned table `t`, then one INSERT at `event_ms` (EVENT_TIME keeps
/// its whole seconds) of `files` (`t`'s file names and their bytes) with
/// no checksum in their URIs (change management off), the warehouse in
/// `bucket`. The files are not put in the bucket.
fn rows_without_checksums(
    dir: &Path,
    bucket: &str,
    event_ms: i64,
    files: &[(&str, &[u8])],
) -> PathBuf {
    let source = dir.join("source");
    let rows = dir.join("rows.jsonl");
    let mut writer = HiveWriter::new(&rows, &source, None, &dir.join("hive-cm"), false).unwrap();
    writer.set_checksums(false);
    let mut listed = Vec::new();
    for (name, data) in files {
        let rel = format!("db1.db/t/{name}");
        std::fs::create_dir_all(source.join("db1.db/t")).unwrap();
        std::fs::write(source.join(&rel), data).unwrap();
        listed.push(serde_json::json!({
            "path": rel, "size": data.len(), "sha256": sha(data).to_hex(),
        }));
    }
    for line in [
        serde_json::json!({"id": 1, "op": "create_database", "db": "db1", "time_ms": event_ms}),
        serde_json::json!({"id": 2, "op": "create_table", "db": "db1", "table": "t", "time_ms": event_ms}),
        serde_json::json!({"id": 3, "op": "add_files", "db": "db1", "table": "t", "files": listed, "time_ms": event_ms}),
    ] {
        writer
            .write_event(&Event::parse_line(line.to_string().as_bytes()).unwrap())
            .unwrap();
    }
    writer.sync().unwrap();
    let text = std::fs::read_to_string(&rows)
        .unwrap()
        .replace(WAREHOUSE_URI, &format!("s3a://{bucket}/warehouse"));
    assert!(!text.contains("hdfs://"), "an HDFS URI is left");
    std::fs::write(&rows, text).unwrap();
    rows
}

/// The files of the visible state: name → (blob, `user.stagefs.verified`).
fn visible_files(replica: &Replica) -> BTreeMap<String, (BlobId, &'static str)> {
    let mut out = BTreeMap::new();
    replica
        .catalog()
        .snapshot()
        .visible
        .for_each_file(&mut |f| {
            let name = f.source.rsplit('/').next().unwrap().to_owned();
            out.insert(name, (f.blob(), f.verified));
        });
    out
}

/// Two files of `t` without checksums, put in `bucket` before their
/// event and overwritten (other bytes, other lengths) 2.5 s or more after
/// its EVENT_TIME, past the default 1 s margin. The small one fits one
/// GET, the large one is read in ranged parts. Returns the rows and the
/// contents at the event.
fn overwritten_after_their_event(
    s3: &S3Server,
    dir: &Path,
    bucket: &str,
) -> (PathBuf, Vec<(&'static str, Vec<u8>)>) {
    let old = vec![
        ("000000_0", bytes(10_000, 21)),
        ("000001_0", bytes((PART_BYTES * 2 + 99) as usize, 22)),
    ];
    for (name, data) in &old {
        put(s3, bucket, &format!("warehouse/db1.db/t/{name}"), data);
    }
    let event_ms = now_ms();
    let files: Vec<(&str, &[u8])> = old.iter().map(|(n, d)| (*n, d.as_slice())).collect();
    let rows = rows_without_checksums(dir, bucket, event_ms, &files);
    let event_time_ms = event_ms / 1000 * 1000;
    while now_ms() < event_time_ms + 2_600 {
        std::thread::sleep(Duration::from_millis(50));
    }
    for (i, (name, data)) in old.iter().enumerate() {
        let new = bytes(data.len() + 7, 30 + i as u64);
        put(s3, bucket, &format!("warehouse/db1.db/t/{name}"), &new);
    }
    (rows, old)
}

#[test]
fn seaweedfs_keeps_versions_lists_them_by_exact_prefix_and_reads_one_by_id() {
    let s3 = S3Server::start().unwrap();
    s3.create_bucket("kept", true).unwrap();
    s3.create_bucket("plain", false).unwrap();
    assert_eq!(s3.versioning("kept").unwrap(), "Enabled");
    let one = put(&s3, "kept", "t/000000_0", b"one");
    let two = put(&s3, "kept", "t/000000_0", b"two");
    put(&s3, "kept", "t/000000_0_copy", b"other key");
    let (Some(v1), Some(v2)) = (one.version.clone(), two.version.clone()) else {
        panic!("a versioned bucket gives version ids")
    };
    assert_ne!(v1, v2);
    let listed = s3.list_object_versions("kept", "t/000000_0", 1000).unwrap();
    eprintln!("ListObjectVersions prefix=t/000000_0: {listed:?}");
    let ids: Vec<&str> = listed
        .iter()
        .filter(|v| v.key == "t/000000_0")
        .map(|v| v.version_id.as_str())
        .collect();
    assert_eq!(ids, [v2.as_str(), v1.as_str()], "newest first");
    let got = s3
        .request("GET", "/kept/t/000000_0", &[("versionId", &v1)], &[], b"")
        .unwrap();
    assert_eq!((got.status, got.body.as_slice()), (200, &b"one"[..]));
    assert_eq!(got.header("x-amz-version-id"), Some(v1.as_str()));
    // What stagefs sees of the current object: its version id, or none
    // in a bucket that never kept versions.
    let remotes = Remotes::with_s3(access(&s3));
    let open = |uri: &str| {
        Location::remote(uri)
            .unwrap()
            .unwrap()
            .open_with(&remotes)
            .unwrap()
    };
    assert_eq!(open("s3a://kept/t/000000_0").version(), Some(v2.as_str()));
    put(&s3, "plain", "t/000000_0", b"plain");
    let plain = open("s3a://plain/t/000000_0");
    eprintln!("unversioned GET: version {:?}", plain.version());
    assert!(
        plain.version().is_none_or(|v| v == "null"),
        "{:?}",
        plain.version()
    );
}

#[test]
fn in_a_versioned_bucket_a_file_without_checksum_overwritten_after_its_event_is_shown_as_it_was_then(
) {
    let s3 = S3Server::start().unwrap();
    s3.create_bucket(BUCKET, true).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let (rows, old) = overwritten_after_their_event(&s3, dir.path(), BUCKET);

    let replica = Replica::start(replica_config(state.path(), &rows, access(&s3))).unwrap();
    wait_for("state 3", Duration::from_secs(60), || {
        replica.catalog().snapshot().visible.state_id == StateId(3)
    });
    let files = visible_files(&replica);
    assert_eq!(files.len(), old.len(), "{files:?}");
    for (name, data) in &old {
        assert_eq!(
            files[*name],
            (sha(data), "not-newer-than-event"),
            "{name}: not the version current at its event"
        );
    }
    assert!(replica.status().stalled.is_none());
}

#[test]
fn in_an_unversioned_bucket_a_file_without_checksum_overwritten_after_its_event_waits_with_the_reason(
) {
    let s3 = S3Server::start().unwrap();
    s3.create_bucket(BUCKET, false).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let (rows, _) = overwritten_after_their_event(&s3, dir.path(), BUCKET);

    let replica = Replica::start(replica_config(state.path(), &rows, access(&s3))).unwrap();
    wait_for("the stall", Duration::from_secs(60), || {
        replica.status().stalled.is_some()
    });
    let stall = replica.status().stalled.unwrap();
    eprintln!("stalled: {}", stall.reason);
    assert_eq!(stall.state_id, Some(StateId(3)));
    assert!(
        stall
            .reason
            .contains("s3a://warehouse/warehouse/db1.db/t/00000")
            && stall.reason.contains("after its event")
            && stall.reason.contains("a later version"),
        "{}",
        stall.reason
    );
    let snap = replica.catalog().snapshot();
    assert!(snap.visible.state_id < StateId(3));
    assert!(visible_files(&replica).is_empty());
}

#[test]
fn a_file_modified_two_seconds_after_its_event_needs_a_margin_of_more_than_one_second() {
    let s3 = S3Server::start().unwrap();
    s3.create_bucket(BUCKET, false).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(5_000, 41);
    put(&s3, BUCKET, "warehouse/db1.db/t/000000_0", &data);
    // Last modified (whole seconds, as a GET gives it) 2 s after EVENT_TIME.
    let modified_ms = Location::remote(&format!("s3a://{BUCKET}/warehouse/db1.db/t/000000_0"))
        .unwrap()
        .unwrap()
        .open_with(&Remotes::with_s3(access(&s3)))
        .unwrap()
        .identity()
        .mtime_ns
        / 1_000_000;
    let rows = rows_without_checksums(
        dir.path(),
        BUCKET,
        modified_ms - 2_000,
        &[("000000_0", &data)],
    );

    // The default 1 s: refused, and status says so.
    let state = tempfile::tempdir().unwrap();
    let replica = Replica::start(replica_config(state.path(), &rows, access(&s3))).unwrap();
    wait_for("the stall", Duration::from_secs(60), || {
        replica.status().stalled.is_some()
    });
    let reason = replica.status().stalled.unwrap().reason;
    eprintln!("stalled: {reason}");
    assert!(
        reason.contains("000000_0")
            && reason.contains("2000 ms after its event")
            && reason.contains("--event-time-margin 1s"),
        "{reason}"
    );
    assert!(visible_files(&replica).is_empty());
    drop(replica);

    // --event-time-margin 3s: accepted.
    let state = tempfile::tempdir().unwrap();
    let mut cfg = replica_config(state.path(), &rows, access(&s3));
    cfg.hive.as_mut().unwrap().event_time_margin = EventTimeMargin::parse("3s").unwrap();
    let replica = Replica::start(cfg).unwrap();
    wait_for("state 3", Duration::from_secs(60), || {
        replica.catalog().snapshot().visible.state_id == StateId(3)
    });
    assert_eq!(
        visible_files(&replica)["000000_0"],
        (sha(&data), "not-newer-than-event")
    );
}

#[test]
fn a_list_object_versions_answer_that_is_no_listing_stalls_with_the_reason_and_shows_nothing() {
    let s3 = S3Server::start().unwrap();
    s3.create_bucket(BUCKET, true).unwrap();
    let proxy = FaultProxy::start(s3.addr()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let (rows, old) = overwritten_after_their_event(&s3, dir.path(), BUCKET);
    proxy
        .set_mode(FaultMode::GarbageVersions {
            body: "<ListVersionsResult><Version><Key>warehouse/db1.db/t/000000_0</Key>",
        })
        .unwrap();
    let access = access_with(&s3, &proxy.endpoint(), None);
    let replica = Replica::start(replica_config(state.path(), &rows, access)).unwrap();
    wait_for("the stall", Duration::from_secs(60), || {
        replica.status().stalled.is_some()
    });
    let reason = replica.status().stalled.unwrap().reason;
    eprintln!("stalled: {reason}");
    assert!(
        reason.contains("s3a://warehouse/warehouse/db1.db/t/00000")
            && reason.contains(&proxy.addr().to_string())
            && reason.contains("not a ListObjectVersions answer"),
        "{reason}"
    );
    assert!(!reason.contains(s3.secret_key()), "{reason}");
    assert!(proxy.stats().garbled >= 1, "{:?}", proxy.stats());
    assert!(visible_files(&replica).is_empty());
    assert!(replica.catalog().snapshot().visible.state_id < StateId(3));

    // A listing again: the versions current at the event.
    proxy.set_mode(FaultMode::Pass).unwrap();
    wait_for("state 3", Duration::from_secs(90), || {
        replica.catalog().snapshot().visible.state_id == StateId(3)
    });
    let files = visible_files(&replica);
    for (name, data) in &old {
        assert_eq!(files[*name], (sha(data), "not-newer-than-event"), "{name}");
    }
}

#[test]
fn in_a_versioned_bucket_a_file_deleted_at_its_event_or_written_after_it_waits_with_the_reason() {
    let s3 = S3Server::start().unwrap();
    s3.create_bucket(BUCKET, true).unwrap();
    let state = tempfile::tempdir().unwrap();
    let store = store(state.path(), access(&s3));
    let key = "wh/t/000000_0";
    let uri = format!("s3a://{BUCKET}/{key}");
    let before_any = now_ms() - 5_000;
    put(&s3, BUCKET, key, b"first");
    // Apart from the first version even if the listing keeps seconds.
    std::thread::sleep(Duration::from_millis(1_100));
    let deleted = s3
        .request("DELETE", &format!("/{BUCKET}/{key}"), &[], &[], b"")
        .unwrap();
    assert_eq!(deleted.status, 204, "{}", deleted.text());
    let event_ms = now_ms();
    let event_time_ms = event_ms / 1000 * 1000;
    while now_ms() < event_time_ms + 2_600 {
        std::thread::sleep(Duration::from_millis(50));
    }
    put(&s3, BUCKET, key, b"written after the event");
    let at = |time_ms| {
        s3_file(
            &uri,
            Verify::NotNewerThanEvent {
                time_ms: Some(time_ms),
            },
            None,
        )
    };

    // Deleted at its event: the delete marker is no version to read.
    let err = fetch(&store, &at(event_time_ms)).unwrap_err();
    eprintln!("deleted at the event: {err}");
    assert!(
        err.contains(&uri) && err.contains("a later version") && err.contains("delete marker"),
        "{err}"
    );
    // An event before any version.
    let err = fetch(&store, &at(before_any / 1000 * 1000)).unwrap_err();
    eprintln!("before any version: {err}");
    assert!(err.contains("none as old as its event"), "{err}");
}
