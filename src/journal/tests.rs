use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::segment::{HEADER_LEN, RECORD_HEADER_LEN};
use super::*;

/// Deterministic payload of a length that varies with the id.
fn payload(id: u64) -> Vec<u8> {
    let len = 20 + (id * 7 % 50) as usize;
    (0..len)
        .map(|i| (id as u8).wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

fn framed_len(id: u64) -> u64 {
    (RECORD_HEADER_LEN + payload(id).len()) as u64
}

fn config(dir: &Path, segment_bytes: u64, ring_capacity: usize) -> JournalConfig {
    JournalConfig {
        dir: dir.to_path_buf(),
        segment_bytes,
        ring_capacity,
        ring_bytes: super::DEFAULT_RING_BYTES,
        durable_through: StateId(0),
        cancel: None,
    }
}

fn write_ids(journal: &mut Journal, ids: impl IntoIterator<Item = u64>) {
    for id in ids {
        journal.append(StateId(id), &payload(id)).unwrap();
    }
    journal.sync().unwrap();
}

/// Drains a follower without waiting, checking every payload.
fn drain(follower: &mut Follower) -> Vec<u64> {
    let mut ids = Vec::new();
    while let Some(r) = follower.try_next().unwrap() {
        assert_eq!(r.payload, payload(r.id.0), "payload of {}", r.id);
        ids.push(r.id.0);
    }
    ids
}

fn segment_files(dir: &Path) -> Vec<std::path::PathBuf> {
    segment::list_segments(dir)
        .unwrap()
        .into_iter()
        .map(|(_, p)| p)
        .collect()
}

#[test]
fn records_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut j, report) = Journal::open(config(dir.path(), 1 << 20, 16)).unwrap();
        assert_eq!(report, RecoveryReport::default());
        write_ids(&mut j, 1..=50);
        write_ids(&mut j, 51..=100);
        assert_eq!(j.last_id(), Some(StateId(100)));
    }
    let (j, report) = Journal::open(config(dir.path(), 1 << 20, 16)).unwrap();
    assert_eq!(report.records, 100);
    assert_eq!(report.last_id, Some(StateId(100)));
    assert_eq!(report.truncated_bytes, 0);
    assert_eq!(report.reason, None);
    assert_eq!(j.last_id(), Some(StateId(100)));

    let mut f = j.follower(StateId(0));
    assert!(f.reading_from_files());
    assert_eq!(drain(&mut f), (1..=100).collect::<Vec<_>>());
    assert_eq!(f.position(), StateId(100));
    let stats = j.stats();
    assert_eq!(stats.file_reads.load(Ordering::Relaxed), 100);
    assert_eq!(stats.ring_reads.load(Ordering::Relaxed), 0);
}

#[test]
fn torn_journal_tail_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let segment_bytes = 600;
    {
        let (mut j, _) = Journal::open(config(dir.path(), segment_bytes, 16)).unwrap();
        write_ids(&mut j, 1..=20);
    }
    let segments = segment_files(dir.path());
    assert!(segments.len() >= 2, "the test needs a rotated journal");
    let last = segments.last().unwrap();
    assert_ne!(
        last,
        &segment::segment_path(dir.path(), StateId(20)),
        "record 20 must not start a segment"
    );
    let len = fs::metadata(last).unwrap().len();
    // Cut the last record in half, as a crash mid-write would.
    let cut_at = len - framed_len(20) / 2;
    OpenOptions::new()
        .write(true)
        .open(last)
        .unwrap()
        .set_len(cut_at)
        .unwrap();

    let (mut j, report) = Journal::open(config(dir.path(), segment_bytes, 16)).unwrap();
    assert_eq!(report.records, 19);
    assert_eq!(report.last_id, Some(StateId(19)));
    assert_eq!(report.truncated_bytes, cut_at - (len - framed_len(20)));
    assert!(
        report.reason.as_deref().unwrap().contains("torn"),
        "{report:?}"
    );
    assert_eq!(fs::metadata(last).unwrap().len(), len - framed_len(20));
    assert_eq!(j.last_id(), Some(StateId(19)));

    // The writer continues where the intact prefix ends.
    write_ids(&mut j, 20..=25);
    let mut f = j.follower(StateId(0));
    assert_eq!(drain(&mut f), (1..=25).collect::<Vec<_>>());
    drop(j);
    let (j, report) = Journal::open(config(dir.path(), segment_bytes, 16)).unwrap();
    assert_eq!((report.records, report.truncated_bytes), (25, 0));
    assert_eq!(
        drain(&mut j.follower(StateId(0))),
        (1..=25).collect::<Vec<_>>()
    );
}

#[test]
fn corrupt_record_crc_truncates_from_there() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 16)).unwrap();
        write_ids(&mut j, 1..=10);
    }
    let seg = segment::segment_path(dir.path(), StateId(1));
    let mut bytes = fs::read(&seg).unwrap();
    let original_len = bytes.len() as u64;
    let offset_of_5 = HEADER_LEN + (1..5).map(framed_len).sum::<u64>();
    // Flip a payload byte of record 5.
    bytes[(offset_of_5 as usize) + RECORD_HEADER_LEN + 3] ^= 0x40;
    fs::write(&seg, &bytes).unwrap();

    let (mut j, report) = Journal::open(config(dir.path(), 1 << 20, 16)).unwrap();
    assert_eq!(report.records, 4);
    assert_eq!(report.last_id, Some(StateId(4)));
    assert_eq!(report.truncated_bytes, original_len - offset_of_5);
    assert!(
        report.reason.as_deref().unwrap().contains("CRC"),
        "{report:?}"
    );
    assert_eq!(fs::metadata(&seg).unwrap().len(), offset_of_5);

    write_ids(&mut j, 5..=12);
    assert_eq!(
        drain(&mut j.follower(StateId(0))),
        (1..=12).collect::<Vec<_>>()
    );
}

/// Every segment file with its bytes, to show recovery changed nothing.
fn snapshot_files(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let bytes = fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    files.sort();
    files
}

fn durable_through(mut c: JournalConfig, id: u64) -> JournalConfig {
    c.durable_through = StateId(id);
    c
}

#[test]
fn corrupt_record_in_an_earlier_segment_stops_recovery_and_keeps_every_file() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut j, _) = Journal::open(config(dir.path(), 300, 16)).unwrap();
        write_ids(&mut j, 1..=40);
    }
    let segments = segment_files(dir.path());
    assert!(segments.len() >= 3);
    // Damage the first record's id in the second segment: not a torn tail,
    // since the writer synced that segment before starting the third.
    let mut bytes = fs::read(&segments[1]).unwrap();
    bytes[HEADER_LEN as usize + 8] ^= 1;
    fs::write(&segments[1], &bytes).unwrap();
    let before = snapshot_files(dir.path());

    let err = Journal::open(config(dir.path(), 300, 16)).err().unwrap();
    match &err {
        JournalError::CorruptBeforeTail { path, offset, .. } => {
            assert_eq!(path, &segments[1]);
            assert_eq!(*offset, HEADER_LEN);
        }
        other => panic!("expected CorruptBeforeTail, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(&segments[1].display().to_string()), "{msg}");
    assert!(msg.contains(&format!("offset {HEADER_LEN}")), "{msg}");
    assert_eq!(snapshot_files(dir.path()), before, "recovery changed files");
    // And it keeps refusing: nothing was "repaired" by the first attempt.
    assert!(Journal::open(config(dir.path(), 300, 16)).is_err());
    assert_eq!(snapshot_files(dir.path()), before);
}

#[test]
fn record_less_segment_before_the_last_stops_recovery() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 16)).unwrap();
        write_ids(&mut j, 1..=3);
    }
    // A header-only segment that is not the last cannot come from a crash.
    let empty = segment::segment_path(dir.path(), StateId(0));
    fs::write(&empty, segment::encode_header()).unwrap();
    let before = snapshot_files(dir.path());
    match Journal::open(config(dir.path(), 1 << 20, 16))
        .err()
        .unwrap()
    {
        JournalError::CorruptBeforeTail { path, .. } => assert_eq!(path, empty),
        other => panic!("expected CorruptBeforeTail, got {other:?}"),
    }
    assert_eq!(snapshot_files(dir.path()), before);
}

#[test]
fn torn_tail_that_would_drop_a_committed_record_stops_recovery() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 16)).unwrap();
        write_ids(&mut j, 1..=10);
    }
    let seg = segment::segment_path(dir.path(), StateId(1));
    let offset_of_8 = HEADER_LEN + (1..8).map(framed_len).sum::<u64>();
    let mut bytes = fs::read(&seg).unwrap();
    bytes[(offset_of_8 as usize) + RECORD_HEADER_LEN + 1] ^= 0x10;
    fs::write(&seg, &bytes).unwrap();
    let before = snapshot_files(dir.path());

    // State 8 is committed: cutting at record 8 would drop it.
    for committed in [8, 10] {
        let cfg = durable_through(config(dir.path(), 1 << 20, 16), committed);
        let err = Journal::open(cfg).err().unwrap();
        match &err {
            JournalError::CutBelowCommit {
                path,
                offset,
                last_intact,
                durable,
                ..
            } => {
                assert_eq!(path, &seg);
                assert_eq!(*offset, offset_of_8);
                assert_eq!((*last_intact, *durable), (StateId(7), StateId(committed)));
            }
            other => panic!("expected CutBelowCommit, got {other:?}"),
        }
        assert!(err.to_string().contains(&seg.display().to_string()));
        assert_eq!(snapshot_files(dir.path()), before, "recovery changed files");
    }

    // Committed only through 7: the damaged tail is not committed, so it is cut.
    let cfg = durable_through(config(dir.path(), 1 << 20, 16), 7);
    let (j, report) = Journal::open(cfg).unwrap();
    assert_eq!(report.last_id, Some(StateId(7)));
    assert_eq!(fs::metadata(&seg).unwrap().len(), offset_of_8);
    assert_eq!(
        drain(&mut j.follower(StateId(0))),
        (1..=7).collect::<Vec<_>>()
    );
}

#[test]
fn torn_header_of_the_last_segment_below_the_commit_stops_recovery() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 16)).unwrap();
        write_ids(&mut j, 1..=3);
    }
    let torn = segment::segment_path(dir.path(), StateId(4));
    fs::write(&torn, b"STGF").unwrap();
    let before = snapshot_files(dir.path());
    let cfg = durable_through(config(dir.path(), 1 << 20, 16), 4);
    match Journal::open(cfg).err().unwrap() {
        JournalError::CutBelowCommit { path, offset, .. } => {
            assert_eq!((path, offset), (torn, 0));
        }
        other => panic!("expected CutBelowCommit, got {other:?}"),
    }
    assert_eq!(snapshot_files(dir.path()), before);
}

#[test]
fn header_only_last_segment_is_removed_and_appending_continues() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 16)).unwrap();
        write_ids(&mut j, 1..=3);
    }
    // A crash right after creating the segment for record 9 leaves only its
    // header; the records are then re-appended from 4.
    fs::write(
        segment::segment_path(dir.path(), StateId(9)),
        segment::encode_header(),
    )
    .unwrap();
    let (mut j, report) = Journal::open(config(dir.path(), 1 << 20, 16)).unwrap();
    assert_eq!(
        (report.records, report.last_id, report.truncated_bytes),
        (3, Some(StateId(3)), 0)
    );
    assert_eq!(segment_files(dir.path()).len(), 1);
    write_ids(&mut j, 4..=6);
    drop(j);
    let (j, report) = Journal::open(config(dir.path(), 1 << 20, 16)).unwrap();
    assert_eq!(report.records, 6);
    assert_eq!(
        drain(&mut j.follower(StateId(0))),
        (1..=6).collect::<Vec<_>>()
    );
}

#[test]
fn torn_segment_header_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 16)).unwrap();
        write_ids(&mut j, 1..=3);
    }
    fs::write(segment::segment_path(dir.path(), StateId(4)), b"STGF").unwrap();
    let (j, report) = Journal::open(config(dir.path(), 1 << 20, 16)).unwrap();
    assert_eq!((report.records, report.truncated_bytes), (3, 4));
    assert!(report.reason.is_some());
    assert_eq!(segment_files(dir.path()).len(), 1);
    assert_eq!(j.last_id(), Some(StateId(3)));
}

#[test]
fn non_increasing_id_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 16)).unwrap();
    assert!(matches!(
        j.append(StateId(0), b"x"),
        Err(JournalError::NotIncreasing {
            last: StateId(0),
            got: StateId(0)
        })
    ));
    j.append(StateId(5), b"a").unwrap();
    // Checked against buffered records too, not just durable ones.
    assert!(matches!(
        j.append(StateId(5), b"b"),
        Err(JournalError::NotIncreasing {
            last: StateId(5),
            got: StateId(5)
        })
    ));
    j.sync().unwrap();
    assert!(matches!(
        j.append(StateId(3), b"c"),
        Err(JournalError::NotIncreasing {
            last: StateId(5),
            got: StateId(3)
        })
    ));
    j.append(StateId(9), b"d").unwrap();
    j.sync().unwrap();
    drop(j);
    // And across a restart.
    let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 16)).unwrap();
    assert!(matches!(
        j.append(StateId(9), b"e"),
        Err(JournalError::NotIncreasing { .. })
    ));
    j.append(StateId(10), b"f").unwrap();
}

#[test]
fn oversized_payload_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 16)).unwrap();
    let big = vec![0u8; MAX_PAYLOAD + 1];
    assert!(matches!(
        j.append(StateId(1), &big),
        Err(JournalError::PayloadTooLarge { .. })
    ));
    // The rejected id was not consumed.
    j.append(StateId(1), b"ok").unwrap();
}

#[test]
fn unsynced_records_are_invisible_to_followers() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 4)).unwrap();
    write_ids(&mut j, 1..=10);
    let mut from_ring = j.follower(StateId(8));
    let mut from_files = j.follower(StateId(0));
    assert!(from_files.reading_from_files());

    for id in 11..=20 {
        j.append(StateId(id), &payload(id)).unwrap();
    }
    assert_eq!(j.last_id(), Some(StateId(10)));
    assert_eq!(drain(&mut from_ring), vec![9, 10]);
    // The unsynced bytes are not even in the file yet, and a file reader
    // stops at the durable end regardless.
    assert_eq!(drain(&mut from_files), (1..=10).collect::<Vec<_>>());
    assert!(from_ring
        .next_timeout(Duration::from_millis(20))
        .unwrap()
        .is_none());

    j.sync().unwrap();
    assert_eq!(drain(&mut from_ring), (11..=20).collect::<Vec<_>>());
    assert_eq!(drain(&mut from_files), (11..=20).collect::<Vec<_>>());

    // Records never synced are lost on reopen, not half-kept.
    j.append(StateId(21), &payload(21)).unwrap();
    drop(j);
    let (j, report) = Journal::open(config(dir.path(), 1 << 20, 4)).unwrap();
    assert_eq!(
        (report.last_id, report.truncated_bytes),
        (Some(StateId(20)), 0)
    );
    assert_eq!(drain(&mut j.follower(StateId(0))).len(), 20);
}

#[test]
fn follower_reading_files_stops_at_the_durable_end() {
    let dir = tempfile::tempdir().unwrap();
    // Ring of 0: every read goes through the files, including live ones.
    let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 0)).unwrap();
    write_ids(&mut j, 1..=5);
    let mut f = j.follower(StateId(0));
    assert_eq!(drain(&mut f), vec![1, 2, 3, 4, 5]);
    // Bytes written past the published length (as by a write that has not
    // been synced yet) must not be read.
    let seg = segment::segment_path(dir.path(), StateId(1));
    let mut garbage = Vec::new();
    segment::encode_record(&mut garbage, StateId(6), b"not durable");
    let mut file = OpenOptions::new().append(true).open(&seg).unwrap();
    std::io::Write::write_all(&mut file, &garbage).unwrap();
    assert_eq!(drain(&mut f), Vec::<u64>::new());
    assert_eq!(j.stats().ring_reads.load(Ordering::Relaxed), 0);
}

#[test]
fn segments_rotate_and_follower_crosses_them() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(config(dir.path(), 200, 3)).unwrap();
    let mut live = j.follower(StateId(0));
    let mut seen = Vec::new();
    for batch in 0..20u64 {
        // Gaps in the ids: segments are found by binary search, not arithmetic.
        write_ids(&mut j, (batch * 10 + 1..=batch * 10 + 7).step_by(2));
        if batch % 3 == 0 {
            seen.extend(drain(&mut live));
        }
    }
    seen.extend(drain(&mut live));
    let expected: Vec<u64> = (0..20u64)
        .flat_map(|b| (b * 10 + 1..=b * 10 + 7).step_by(2))
        .collect();
    assert_eq!(seen, expected);

    let segments = segment_files(dir.path());
    assert!(segments.len() > 10, "only {} segments", segments.len());
    for p in &segments {
        // A segment exceeds the limit by at most one record.
        assert!(fs::metadata(p).unwrap().len() < 200 + framed_len(0) + 100);
    }
    // Starting in the middle of any segment, or on a gap, yields the rest.
    for (k, &start) in expected.iter().enumerate().step_by(5) {
        let mut f = j.follower(StateId(start));
        assert_eq!(drain(&mut f), expected[k + 1..].to_vec(), "after {start}");
        let mut f = j.follower(StateId(start + 1));
        let rest: Vec<u64> = expected
            .iter()
            .copied()
            .filter(|&id| id > start + 1)
            .collect();
        assert_eq!(drain(&mut f), rest, "after gap {}", start + 1);
    }
    drop(j);
    let (j, report) = Journal::open(config(dir.path(), 200, 3)).unwrap();
    assert_eq!(report.records, expected.len() as u64);
    assert_eq!(drain(&mut j.follower(StateId(0))), expected);
}

#[test]
fn follower_falls_behind_tiny_ring_reads_files_then_reattaches() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(config(dir.path(), 4096, 8)).unwrap();
    let stats = j.stats();
    let mut follower = j.follower(StateId(0));

    // Phase 1: keeping up, the follower reads the ring.
    write_ids(&mut j, 1..=5);
    assert_eq!(drain(&mut follower), vec![1, 2, 3, 4, 5]);
    assert_eq!(stats.ring_reads.load(Ordering::Relaxed), 5);
    assert_eq!(stats.file_reads.load(Ordering::Relaxed), 0);

    // Phase 2: a follower thread that starts late (so it must read files)
    // and lags, while the writer races ahead in small batches.
    let (go, wait_for_go) = std::sync::mpsc::channel::<()>();
    let reader = thread::spawn(move || {
        wait_for_go.recv().unwrap();
        let mut ids = Vec::new();
        while ids.len() < 995 {
            let r = follower
                .next_timeout(Duration::from_secs(10))
                .unwrap()
                .expect("record before timeout");
            assert_eq!(r.payload, payload(r.id.0));
            ids.push(r.id.0);
            if ids.len() % 50 == 0 {
                thread::sleep(Duration::from_millis(2));
            }
        }
        (follower, ids)
    });
    let ids: Vec<u64> = (6..=1000).collect();
    for (n, batch) in ids.chunks(10).enumerate() {
        write_ids(&mut j, batch.iter().copied());
        if n == 10 {
            go.send(()).unwrap();
        }
    }
    let (mut follower, seen) = reader.join().unwrap();
    assert_eq!(seen, ids, "every id once, in order");
    assert!(
        stats.file_reads.load(Ordering::Relaxed) >= 100,
        "the lagging follower read files"
    );

    // Phase 3: caught up, it is back on the ring.
    assert!(!follower.reading_from_files());
    let ring_before = stats.ring_reads.load(Ordering::Relaxed);
    let files_before = stats.file_reads.load(Ordering::Relaxed);
    write_ids(&mut j, 1001..=1003);
    assert_eq!(drain(&mut follower), vec![1001, 1002, 1003]);
    assert_eq!(stats.ring_reads.load(Ordering::Relaxed), ring_before + 3);
    assert_eq!(stats.file_reads.load(Ordering::Relaxed), files_before);
    assert!(!follower.reading_from_files());
    let total = stats.ring_reads.load(Ordering::Relaxed) + stats.file_reads.load(Ordering::Relaxed);
    assert_eq!(total, 1003);
}

#[test]
fn follower_switches_from_files_to_ring_exactly_at_the_ring_base() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 8)).unwrap();
    write_ids(&mut j, 1..=100);
    let stats = j.stats();
    let mut f = j.follower(StateId(0));
    let mut sources = Vec::new();
    while let Some(r) = f.try_next().unwrap() {
        sources.push((r.id.0, f.reading_from_files()));
    }
    // Ring holds 93..=100; 1..=92 come from files, the switch happens once.
    assert_eq!(sources.len(), 100);
    assert_eq!(stats.file_reads.load(Ordering::Relaxed), 92);
    assert_eq!(stats.ring_reads.load(Ordering::Relaxed), 8);
    assert!(sources[..91].iter().all(|&(_, files)| files));
    assert!(sources[91..].iter().all(|&(_, files)| !files));
}

#[test]
fn follower_wakes_on_sync_and_close_ends_waits() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 8)).unwrap();
    let mut f = j.follower(StateId(0));
    let (got_first, first_seen) = std::sync::mpsc::channel();
    let waiter = thread::spawn(move || {
        let first = f
            .next_timeout(Duration::from_secs(10))
            .unwrap()
            .map(|r| r.id);
        let _ = got_first.send(());
        let started = Instant::now();
        let after_close = f.next_timeout(Duration::from_secs(10)).unwrap();
        (first, after_close.is_none(), started.elapsed())
    });
    thread::sleep(Duration::from_millis(20));
    write_ids(&mut j, 1..=1);
    // Close only once the record was read (a closed journal ends reads,
    // so a waiter starved until after the close would see none), and
    // while the waiter is (usually) waiting for the next one.
    first_seen.recv_timeout(Duration::from_secs(10)).unwrap();
    thread::sleep(Duration::from_millis(20));
    j.close();
    let (first, ended, waited) = waiter.join().unwrap();
    assert_eq!(first, Some(StateId(1)));
    assert!(ended);
    assert!(
        waited < Duration::from_secs(5),
        "close must end the wait, waited {waited:?}"
    );
    assert!(j.follower(StateId(0)).try_next().unwrap().is_none());
}

#[test]
fn writer_fails_closed_after_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 8)).unwrap();
    write_ids(&mut j, 1..=2);
    // A segment file appearing under the name the writer wants is an error
    // (two writers); afterwards the writer refuses to continue.
    let (mut j2, _) = Journal::open(config(dir.path(), 64, 8)).unwrap();
    fs::write(segment::segment_path(dir.path(), StateId(3)), b"squatter").unwrap();
    j2.append(StateId(3), &payload(3)).unwrap();
    assert!(matches!(j2.sync(), Err(JournalError::Io { .. })));
    assert!(matches!(
        j2.append(StateId(4), b"x"),
        Err(JournalError::Failed(_))
    ));
    assert!(matches!(j2.sync(), Err(JournalError::Failed(_))));
    drop(j);
}

#[test]
fn writer_resumes_after_a_failure_once_reset_to_the_durable_end() {
    let dir = tempfile::tempdir().unwrap();
    // Tiny segments: record 3 starts a new segment.
    let (mut j, _) = Journal::open(config(dir.path(), 64, 8)).unwrap();
    write_ids(&mut j, 1..=2);
    let squatter = segment::segment_path(dir.path(), StateId(3));
    fs::write(&squatter, b"squatter").unwrap();
    j.append(StateId(3), &payload(3)).unwrap();
    assert!(j.sync().is_err());
    assert!(matches!(
        j.append(StateId(3), b"x"),
        Err(JournalError::Failed(_))
    ));

    // Not ours: reset leaves the squatter, and the retry fails the same way.
    j.reset_after_failure().unwrap();
    assert!(squatter.exists());
    j.append(StateId(3), &payload(3)).unwrap();
    assert!(j.sync().is_err());

    // Cleared (space freed, say): reset, append the same records again.
    fs::remove_file(&squatter).unwrap();
    j.reset_after_failure().unwrap();
    assert_eq!(j.last_id(), Some(StateId(2)));
    write_ids(&mut j, 3..=6);
    let mut f = j.follower(StateId(0));
    assert_eq!(drain(&mut f), (1..=6).collect::<Vec<_>>());
    drop((f, j));
    let (j, report) = Journal::open(config(dir.path(), 64, 8)).unwrap();
    assert_eq!((report.records, report.truncated_bytes), (6, 0));
    assert_eq!(
        drain(&mut j.follower(StateId(0))),
        (1..=6).collect::<Vec<_>>()
    );
}

#[test]
fn a_sync_in_two_steps_publishes_only_its_records_once_finished() {
    let dir = tempfile::tempdir().unwrap();
    // Small segments: the records rotate through several files.
    let (mut j, _) = Journal::open(config(dir.path(), 200, 64)).unwrap();
    write_ids(&mut j, 1..=2);
    let mut f = j.follower(StateId(0));
    assert_eq!(drain(&mut f), vec![1, 2]);
    for id in 3..=9 {
        j.append(StateId(id), &payload(id)).unwrap();
    }
    let ticket = j.begin_sync().unwrap().expect("records to sync");
    assert_eq!(ticket.last_id(), StateId(9));
    // Appending goes on while the fdatasync runs on another thread; a
    // second sync must wait for this one.
    let syncing = thread::spawn(move || {
        let synced = ticket.sync_data();
        (ticket, synced)
    });
    j.append(StateId(10), &payload(10)).unwrap();
    assert!(matches!(j.sync(), Err(JournalError::Failed(_))));
    assert!(
        drain(&mut f).is_empty(),
        "nothing published before the sync"
    );
    let (ticket, synced) = syncing.join().unwrap();
    j.finish_sync(ticket, synced).unwrap();
    assert_eq!(j.last_id(), Some(StateId(9)));
    assert_eq!(drain(&mut f), (3..=9).collect::<Vec<_>>());
    j.sync().unwrap();
    assert_eq!(drain(&mut f), vec![10]);
    drop((f, j));
    let (j, report) = Journal::open(config(dir.path(), 200, 64)).unwrap();
    assert_eq!((report.records, report.truncated_bytes), (10, 0));
    assert_eq!(
        drain(&mut j.follower(StateId(0))),
        (1..=10).collect::<Vec<_>>()
    );
}

#[test]
fn a_failed_two_step_sync_loses_nothing_once_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 64)).unwrap();
    write_ids(&mut j, 1..=2);
    for id in 3..=5 {
        j.append(StateId(id), &payload(id)).unwrap();
    }
    let ticket = j.begin_sync().unwrap().unwrap();
    // Records appended while the sync was out, then the sync fails.
    j.append(StateId(6), &payload(6)).unwrap();
    let failed = std::io::Error::other("simulated fdatasync failure");
    assert!(j.finish_sync(ticket, Err(failed)).is_err());
    assert!(matches!(
        j.append(StateId(7), b"x"),
        Err(JournalError::Failed(_))
    ));
    assert_eq!(j.last_id(), Some(StateId(2)));
    let mut f = j.follower(StateId(0));
    assert_eq!(drain(&mut f), vec![1, 2]);
    // What the ingest loop does: reset, write the group and what followed.
    j.reset_after_failure().unwrap();
    write_ids(&mut j, 3..=6);
    assert_eq!(drain(&mut f), (3..=6).collect::<Vec<_>>());
    drop((f, j));
    let (j, report) = Journal::open(config(dir.path(), 1 << 20, 64)).unwrap();
    assert_eq!((report.records, report.truncated_bytes), (6, 0));
    assert_eq!(
        drain(&mut j.follower(StateId(0))),
        (1..=6).collect::<Vec<_>>()
    );
    // A lost ticket fails the writer the same way.
    let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 64)).unwrap();
    j.append(StateId(7), &payload(7)).unwrap();
    drop(j.begin_sync().unwrap());
    assert!(matches!(j.sync_lost(), JournalError::Failed(_)));
    j.reset_after_failure().unwrap();
    write_ids(&mut j, 7..=7);
    assert_eq!(j.last_id(), Some(StateId(7)));
}

#[test]
fn reset_after_a_failure_truncates_unsynced_bytes_of_the_last_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(config(dir.path(), 1 << 20, 8)).unwrap();
    write_ids(&mut j, 1..=3);
    let seg = segment::segment_path(dir.path(), StateId(1));
    let durable_len = fs::metadata(&seg).unwrap().len();
    // A write that reached the file only in part before failing.
    OpenOptions::new()
        .append(true)
        .open(&seg)
        .unwrap()
        .write_all(b"half a record")
        .unwrap();
    j.failed = Some("simulated write failure".to_owned());
    j.reset_after_failure().unwrap();
    assert_eq!(fs::metadata(&seg).unwrap().len(), durable_len);
    write_ids(&mut j, 4..=5);
    drop(j);
    let (j, report) = Journal::open(config(dir.path(), 1 << 20, 8)).unwrap();
    assert_eq!((report.records, report.truncated_bytes), (5, 0));
    assert_eq!(
        drain(&mut j.follower(StateId(0))),
        (1..=5).collect::<Vec<_>>()
    );
}

#[test]
fn journal_and_followers_are_send() {
    fn send<T: Send>() {}
    send::<Journal>();
    send::<Follower>();
    fn sync<T: Send + Sync>() {}
    sync::<JournalStats>();
}

#[test]
fn concurrent_writer_and_followers_never_skip_or_repeat() {
    for (ring_capacity, segment_bytes) in [(0, 700), (1, 1500), (3, 4000), (64, 1 << 20)] {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open(config(dir.path(), segment_bytes, ring_capacity)).unwrap();
        let n = 1500u64;
        let readers: Vec<_> = [(0u64, 0u64), (100, 7), (700, 101)]
            .into_iter()
            .map(|(start, lag_every)| {
                let mut f = j.follower(StateId(start));
                thread::spawn(move || {
                    let mut ids = Vec::new();
                    while f.position().0 < n {
                        let Some(r) = f.next_timeout(Duration::from_secs(10)).unwrap() else {
                            panic!("timed out at {}", f.position());
                        };
                        assert_eq!(r.payload, payload(r.id.0));
                        ids.push(r.id.0);
                        if lag_every > 0 && r.id.0 % lag_every == 0 {
                            thread::yield_now();
                            thread::sleep(Duration::from_micros(200));
                        }
                    }
                    (start, ids)
                })
            })
            .collect();
        let mut next = 1u64;
        let mut batch = 1u64;
        while next <= n {
            let end = (next + batch % 37).min(n);
            write_ids(&mut j, next..=end);
            next = end + 1;
            batch += 1;
        }
        for r in readers {
            let (start, ids) = r.join().unwrap();
            assert_eq!(
                ids,
                (start + 1..=n).collect::<Vec<_>>(),
                "ring {ring_capacity}, start {start}"
            );
        }
    }
}

/// Not a benchmark harness, just a smoke figure: `cargo test --release --lib
/// journal::tests::throughput -- --ignored --nocapture`.
#[test]
#[ignore]
fn throughput_of_batched_appends_with_a_live_follower() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(JournalConfig::new(dir.path())).unwrap();
    let n = 300_000u64;
    let mut f = j.follower(StateId(0));
    let reader = thread::spawn(move || {
        let mut count = 0u64;
        while count < n {
            if f.next_timeout(Duration::from_secs(10)).unwrap().is_some() {
                count += 1;
            }
        }
        count
    });
    let body = vec![b'e'; 200];
    let started = Instant::now();
    for batch in 0..n / 1000 {
        for i in 0..1000 {
            j.append(StateId(batch * 1000 + i + 1), &body).unwrap();
        }
        j.sync().unwrap();
    }
    assert_eq!(reader.join().unwrap(), n);
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{n} records in {secs:.3}s: {:.0} records/s",
        n as f64 / secs
    );
}

/// A reference model for the property test: what a follower must see.
fn expected_after(all: &[u64], start: u64) -> Vec<u64> {
    all.iter().copied().filter(|&id| id > start).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn followers_see_exactly_the_durable_sequence(
        batches in prop::collection::vec(prop::collection::vec((1u64..4, 0usize..120), 0..25), 1..12),
        ring_capacity in 0usize..20,
        segment_bytes in 32u64..1500,
        starts in prop::collection::vec(0u64..400, 1..4),
        reads_per_step in prop::collection::vec(0usize..30, 1..8),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open(config(dir.path(), segment_bytes, ring_capacity)).unwrap();
        let mut followers: Vec<(u64, Follower, Vec<u64>)> =
            starts.iter().map(|&s| (s, j.follower(StateId(s)), Vec::new())).collect();
        let mut durable = Vec::new();
        let mut next_id = 0u64;
        for (b, batch) in batches.iter().enumerate() {
            let mut appended = Vec::new();
            for &(gap, len) in batch {
                next_id += gap;
                j.append(StateId(next_id), &vec![next_id as u8; len]).unwrap();
                appended.push(next_id);
            }
            j.sync().unwrap();
            durable.extend(appended);
            // Followers read a random amount after each batch, so some lag
            // behind the ring and some keep up.
            for (k, (_, f, seen)) in followers.iter_mut().enumerate() {
                let reads = reads_per_step[(b + k) % reads_per_step.len()];
                for _ in 0..reads {
                    match f.try_next().unwrap() {
                        Some(r) => {
                            prop_assert!(r.payload.iter().all(|&x| x == r.id.0 as u8));
                            seen.push(r.id.0);
                        }
                        None => break,
                    }
                }
            }
        }
        for (start, f, seen) in followers.iter_mut() {
            while let Some(r) = f.try_next().unwrap() {
                seen.push(r.id.0);
            }
            prop_assert_eq!(&*seen, &expected_after(&durable, *start)[..]);
            prop_assert!(!f.reading_from_files());
        }
        drop(j);
        let (j, report) = Journal::open(config(dir.path(), segment_bytes, ring_capacity)).unwrap();
        prop_assert_eq!(report.records, durable.len() as u64);
        prop_assert_eq!(report.truncated_bytes, 0);
        for &start in &starts {
            let mut f = j.follower(StateId(start));
            let mut seen = Vec::new();
            while let Some(r) = f.try_next().unwrap() {
                seen.push(r.id.0);
            }
            prop_assert_eq!(seen, expected_after(&durable, start));
        }
    }
}

#[test]
fn ring_is_bounded_by_payload_bytes_and_followers_still_read_everything() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), 1 << 20, 1000);
    c.ring_bytes = 3 * payload(1).len();
    let (mut j, _) = Journal::open(c).unwrap();
    write_ids(&mut j, 1..=50);
    {
        let st = j.shared.lock();
        assert!(st.ring.len() <= 3, "ring holds {} records", st.ring.len());
        assert!(st.ring_bytes <= 3 * payload(1).len());
        assert_eq!(st.ring.front().map(|r| r.id.0 - 1), Some(st.ring_base.0));
    }
    let mut f = j.follower(StateId(0));
    for id in 1..=50 {
        assert_eq!(f.try_next().unwrap().unwrap().id, StateId(id));
    }
    assert!(f.try_next().unwrap().is_none());
}

#[test]
fn compaction_removes_only_segments_wholly_at_or_below_the_id_and_never_the_last() {
    let dir = tempfile::tempdir().unwrap();
    // One record per segment.
    let seg = 1;
    let (mut j, _) = Journal::open(config(dir.path(), seg, 16)).unwrap();
    for id in 1..=10 {
        write_ids(&mut j, [id]);
    }
    let compactor = j.compactor();
    assert_eq!(compactor.size().segments, 10);
    assert_eq!(super::compacted_through(dir.path()).unwrap(), None);
    assert_eq!(compactor.remove_through(StateId(5), None).unwrap(), 5);
    assert_eq!(compactor.size().first_id, Some(StateId(6)));
    assert_eq!(
        super::compacted_through(dir.path()).unwrap(),
        Some(StateId(5))
    );
    assert_eq!(compactor.remove_through(StateId(100), None).unwrap(), 4);
    let size = compactor.size();
    assert_eq!((size.segments, size.first_id), (1, Some(StateId(10))));
    // The survivors still read back, and a reopened journal agrees.
    let mut f = j.follower(StateId(9));
    assert_eq!(f.try_next().unwrap().unwrap().id, StateId(10));
    drop(f);
    drop(j);
    let (j, report) = Journal::open(config(dir.path(), seg, 16)).unwrap();
    assert_eq!((report.records, report.last_id), (1, Some(StateId(10))));
    let mut f = j.follower(StateId(0));
    assert_eq!(f.try_next().unwrap().unwrap().id, StateId(10));
}

#[test]
fn compaction_cuts_unread_segments_away_and_unlinks_one_a_follower_holds() {
    let dir = tempfile::tempdir().unwrap();
    let seg = 1;
    // A ring of 2: a follower from 0 reads the first records from files.
    let (mut j, _) = Journal::open(config(dir.path(), seg, 2)).unwrap();
    for id in 1..=10 {
        write_ids(&mut j, [id]);
    }
    let mut f = j.follower(StateId(2));
    assert_eq!(f.try_next().unwrap().unwrap().id, StateId(3));
    assert_eq!(
        j.shared.lock().open_readers.get(&StateId(3)),
        Some(&1),
        "the follower holds segment 3"
    );
    let compactor = j.compactor();
    assert_eq!(compactor.remove_through(StateId(3), None).unwrap(), 3);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".seg"))
        .collect();
    assert_eq!(
        names.len(),
        7,
        "segments 4..=10 stay, nothing else: {names:?}"
    );
    assert!(names.iter().all(|n| !n.ends_with(".removing")), "{names:?}");
    // The follower goes on past the segment it held.
    for id in 4..=10 {
        assert_eq!(f.try_next().unwrap().unwrap().id, StateId(id));
    }
    drop(f);
    assert!(j.shared.lock().open_readers.is_empty());
}

#[test]
fn opening_removes_segments_an_interrupted_compaction_left_and_keeps_stray_files() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(config(dir.path(), 1, 16)).unwrap();
    for id in 1..=3 {
        write_ids(&mut j, [id]);
    }
    drop(j);
    // As if compaction through 1 renamed segment 1 and then the process died.
    let first = super::segment::segment_path(dir.path(), StateId(1));
    let removing = super::segment::removing_path(&first);
    std::fs::rename(&first, &removing).unwrap();
    let stray = dir.path().join("notes.removing");
    std::fs::write(&stray, b"not ours").unwrap();
    let (j, report) = Journal::open(config(dir.path(), 1, 16)).unwrap();
    assert!(!removing.exists(), "the interrupted removal is finished");
    assert!(
        stray.exists(),
        "a file that is not a segment's is left alone"
    );
    assert_eq!(report.last_id, Some(StateId(3)));
    let mut f = j.follower(StateId(1));
    assert_eq!(f.try_next().unwrap().unwrap().id, StateId(2));
}
