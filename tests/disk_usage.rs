//! Disk usage under repeated overwrites: with `--retain 2` the blob store
//! stays within the retained versions' content, while a reader that opened
//! a file early still reads all of it after GC removed its blob.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Read;

use common::daemon::*;
use common::*;
use serde_json::json;

const FILE_BYTES: usize = 64 * 1024;
const PARTITIONS: usize = 4;
const OVERWRITES: u64 = 200;

/// 64 KiB of deterministic bytes for event `id`.
fn content(id: u64) -> Vec<u8> {
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = format!("state {id}\n").into_bytes();
    while out.len() < FILE_BYTES {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(FILE_BYTES);
    out
}

#[test]
fn overwrites_keep_the_blob_store_bounded_and_an_early_reader_intact() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path()).retain(2);
    let state = args.state.clone();
    let w = EventWriter::new(&args);
    w.append(json!({"id": 1, "op": "create_database", "db": "default"}));
    w.append(json!({"id": 2, "op": "create_table", "db": "default", "table": "blah", "partition_keys": ["p"]}));
    // What each partition holds after each id: id → [sha per partition].
    let mut current: Vec<Vec<u8>> = Vec::new();
    let mut history: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let rel = |p: usize| format!("default/blah/p=v{p}/000000_0");
    for p in 0..PARTITIONS {
        let id = 3 + p as u64;
        let bytes = content(id);
        let f = w.put_file(&rel(p), &bytes);
        w.append(json!({"id": id, "op": "add_files", "db": "default", "table": "blah", "partition": {"p": format!("v{p}")}, "files": [f]}));
        current.push(bytes);
        history.insert(id, current.iter().map(|b| sha256_hex(b)).collect());
    }
    let first_id = 2 + PARTITIONS as u64;
    let d = Daemon::start(args);
    d.wait_visible(first_id);

    // A reader opens p=v0 early and reads a little.
    let early = content(3);
    let early_sha = sha256_hex(&early);
    let mut reader = File::open(d.join("default/blah/p=v0/000000_0")).unwrap();
    let mut got = vec![0u8; 4096];
    reader.read_exact(&mut got).unwrap();

    // 200 overwrites of the same names, round robin over the partitions,
    // the replaced file moving to change management as Hive does.
    let mut peak = 0u64;
    for k in 0..OVERWRITES {
        let id = first_id + 1 + k;
        let p = (k as usize) % PARTITIONS;
        w.retire(&rel(p), &current[p]);
        let bytes = content(id);
        let f = w.put_file(&rel(p), &bytes);
        w.append(json!({"id": id, "op": "replace_files", "db": "default", "table": "blah", "partition": {"p": format!("v{p}")}, "files": [f]}));
        current[p] = bytes;
        history.insert(id, current.iter().map(|b| sha256_hex(b)).collect());
        if k % 25 == 24 {
            d.wait_visible(id);
            peak = peak.max(blob_store_bytes(&state));
        }
    }
    let last = first_id + OVERWRITES;
    d.wait_visible(last);
    let early_blob = blob_path(&state, &early_sha);

    // The bound: every distinct file of the retained versions.
    let bound_of = |retained: &[u64]| -> u64 {
        let shas: BTreeSet<&String> = retained
            .iter()
            .flat_map(|r| {
                history
                    .range(..=r)
                    .next_back()
                    .map(|(_, v)| v.iter())
                    .unwrap_or_default()
            })
            .collect();
        (shas.len() * FILE_BYTES) as u64
    };
    let s = d.wait_status("GC brought the store within the retained versions", |s| {
        let bound = bound_of(&retained(s));
        let on_disk = blob_store_bytes(&state);
        !early_blob.exists()
            && retained(s).contains(&last)
            && s["staged_bytes"].as_u64().unwrap() <= bound
            && on_disk <= bound
    });
    let on_disk = blob_store_bytes(&state);
    let bound = bound_of(&retained(&s));
    let written = (PARTITIONS as u64 + OVERWRITES) * FILE_BYTES as u64;
    eprintln!(
        "written {written} B, peak seen {peak} B, now {on_disk} B on disk / {} B staged, bound {bound} B, retained {:?}, gc {}",
        s["staged_bytes"], retained(&s), s["gc"]
    );
    assert!(retained(&s).len() <= 3, "retain 2 (+ visible): {s}");
    assert!(
        on_disk >= (PARTITIONS * FILE_BYTES) as u64,
        "visible files lost"
    );
    assert!(on_disk * 10 < written);
    // The visible version is complete and right.
    let (id, tree) = read_table(&d.join("default/blah"));
    assert_eq!(id, last);
    let want: BTreeMap<String, String> = (0..PARTITIONS)
        .map(|p| (format!("p=v{p}/000000_0"), sha256_hex(&current[p])))
        .collect();
    assert_eq!(tree, want);

    // The early reader reads to the end, intact, its blob long gone.
    assert!(!early_blob.exists());
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).unwrap();
    got.extend(rest);
    assert_eq!(got.len(), FILE_BYTES);
    assert_eq!(sha256_hex(&got), early_sha, "the open file's bytes changed");
}

/// No-open mode reads a file without a handle holding its blob: the blob
/// of a file the kernel still references stays through GC after its
/// version is dropped (read again from the blob, page cache dropped), and
/// goes once the kernel forgets it.
#[test]
fn no_open_file_reads_after_its_version_is_collected() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path())
        .retain(1)
        .env("STAGEFS_NO_OPEN", "1");
    let state = args.state.clone();
    let w = EventWriter::new(&args);
    let rel = "default/blah/p=a/000000_0";
    w.append(json!({"id": 1, "op": "create_database", "db": "default"}));
    w.append(json!({"id": 2, "op": "create_table", "db": "default", "table": "blah", "partition_keys": ["p"]}));
    let old = content(3);
    let f = w.put_file(rel, &old);
    w.append(json!({"id": 3, "op": "add_files", "db": "default", "table": "blah", "partition": {"p": "a"}, "files": [f]}));
    let d = Daemon::start(args);
    d.wait_visible(3);
    let mut reader = File::open(d.join(rel)).unwrap();
    let mut got = vec![0u8; 4096];
    reader.read_exact(&mut got).unwrap();

    // Overwrite it twice: with --retain 1 only state 5 is kept.
    for id in [4, 5] {
        w.retire(rel, &if id == 4 { old.clone() } else { content(4) });
        let f = w.put_file(rel, &content(id));
        w.append(json!({"id": id, "op": "replace_files", "db": "default", "table": "blah", "partition": {"p": "a"}, "files": [f]}));
    }
    let s = d.wait_visible_and_gc(5);
    assert_eq!(retained(&s), vec![5]);
    let old_blob = blob_path(&state, &sha256_hex(&old));
    assert!(
        old_blob.exists(),
        "the referenced file's blob was collected"
    );
    let can_drop_caches = std::fs::write("/proc/sys/vm/drop_caches", "1").is_ok();
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).unwrap();
    got.extend(rest);
    assert_eq!(
        sha256_hex(&got),
        sha256_hex(&old),
        "the file's bytes changed"
    );
    assert_eq!(
        std::fs::read(d.join(rel)).unwrap(),
        content(5),
        "a new walk reads the visible version"
    );

    // Closed and forgotten by the kernel, the blob goes at the next GC.
    drop(reader);
    if !can_drop_caches || std::fs::write("/proc/sys/vm/drop_caches", "2").is_err() {
        eprintln!("skipped the release check: cannot drop caches (needs root)");
        return;
    }
    w.append(json!({"id": 6, "op": "noop"}));
    d.wait_status("GC removed the forgotten file's blob", |s| {
        visible(s) >= 6 && !old_blob.exists()
    });
}

/// The daemon keeps the descriptors of blobs it opened, for the next OPEN
/// of the same file (docs/SEMANTICS.md "What a plain process gets"); once
/// GC removed such a blob, the kept descriptor is closed within a
/// maintenance pass, so a closed file keeps no removed blob's disk space.
#[test]
fn a_closed_file_keeps_no_descriptor_of_its_collected_blob() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path()).retain(1);
    let state = args.state.clone();
    let w = EventWriter::new(&args);
    w.append(json!({"id": 1, "op": "create_database", "db": "default"}));
    w.append(json!({"id": 2, "op": "create_table", "db": "default", "table": "blah"}));
    let rel = "default/blah/000000_0";
    let first = content(3);
    let f = w.put_file(rel, &first);
    w.append(json!({"id": 3, "op": "add_files", "db": "default", "table": "blah", "files": [f]}));
    let d = Daemon::start(args);
    d.wait_visible(3);
    let mut got = Vec::new();
    File::open(d.join(rel))
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    assert_eq!(got, first);
    let blob = blob_path(&state, &sha256_hex(&first));
    let blob = blob.canonicalize().unwrap();
    let fds = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .collect()
    };
    assert!(
        fds().contains(&blob),
        "the daemon keeps the descriptor of the file it opened"
    );
    // Two overwrites: the first content's version leaves retention and
    // GC removes its blob.
    let mut prev = first;
    for id in 4..=5 {
        w.retire(rel, &prev);
        let bytes = content(id);
        let f = w.put_file(rel, &bytes);
        w.append(json!({"id": id, "op": "replace_files", "db": "default", "table": "blah", "files": [f]}));
        prev = bytes;
    }
    d.wait_visible(5);
    d.wait_status("GC removed the first blob", |_| !blob.exists());
    let deleted = std::path::PathBuf::from(format!("{} (deleted)", blob.display()));
    poll(
        "the kept descriptor of the removed blob closed",
        std::time::Duration::from_secs(10),
        || (!fds().iter().any(|p| *p == deleted || *p == blob)).then_some(()),
        || format!("{:?}", fds()),
    );
}
