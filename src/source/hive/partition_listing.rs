//! The files of a partition that its ADD_PARTITION event does not name,
//! listed at the source and accepted only when the listing proves that
//! they are the partition's content at the event.
//!
//! Why: Hive's listener writes an empty `partitionFiles` for every
//! partition of an external table, and Hive 4's default metadata
//! transformer makes a plain managed table external
//! (`TRANSLATED_TO_EXTERNAL`). A load that creates a partition (Spark,
//! HiveServer2) moves its files in *before* `add_partitions`, so those
//! files are in no event; shown as the event says, the partition would be
//! empty, a state the source never had (SPEC §3 rule 1).
//!
//! The proof rule ([`prove_at_event`], a pure function of the listing, the
//! event's time and `--event-time-margin`): on HDFS and local file systems
//! a directory's modification time moves with every create, delete and
//! rename inside it, and a file's with every write, so when the partition
//! directory, every subdirectory read and every file read are all last
//! modified no later than `EVENT_TIME` + margin, nothing in the directory
//! changed since the event, and the listing is its content then. Anything
//! later, a directory that is gone, an event without a time, or a place
//! without directory times (S3: an unversioned bucket's last-modified
//! times do not show deletions; a versioned bucket's versions under a
//! prefix are not read yet) is *unproven*: the partition gets one
//! [`Verify::Unproven`] reference instead of files, which is never staged,
//! so every state that holds the partition's unproven content waits with
//! the reason, and a later state without it (the partition dropped or
//! overwritten by an event naming files, the table dropped) may be shown
//! (SPEC §3 rule 2).
//!
//! What is read follows Hive's readers, as the bootstrap listing does:
//! regular files in the partition directory and in its subdirectories
//! (the union and ACID directories), names starting with `_` or `.`
//! skipped at every level (`_SUCCESS`, `.hive-staging…`), and with them
//! whatever lies below such a directory. Each accepted file is checked
//! again when staged, as not newer than its event
//! ([`Verify::NotNewerThanEvent`]).
//!
//! Called by the Hive adapter on the ingest thread (and by bootstrap's
//! merge of events), *before* the event is journaled: the files a
//! partition holds are part of the event's tree, which recovery must
//! rebuild identically from the journal, while the stager only resolves
//! the content of files the tree already names.

use sha2::{Digest, Sha256};

use super::file_refs::map_file;
use super::map::{Place, SourceMap};
use super::model::FileUri;
use crate::event::{BlobId, FileRef, Verify};
use crate::source_file::{hdfs, local, DirTree, Location, TreeEntry};
use crate::stage::EventTimeMargin;

/// What listing a partition's location gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionListing {
    /// A file system with directory times (HDFS, local): the directory and
    /// everything below it, or None when it does not exist.
    Tree(Option<DirTree>),
    /// A place whose listing cannot prove its content at a past moment,
    /// and why.
    Unprovable(String),
}

/// Lists a partition's location at the source. A trait so the adapter's
/// tests can list without a file system.
pub trait ListAtSource: Send {
    /// The listing of `location` (a partition's location URI); `Err` for a
    /// failure worth trying again (the file system unreachable).
    fn list(&self, location: &str) -> Result<PartitionListing, String>;
}

/// Lists where the stager reads: below a `--source-map` directory, or on
/// HDFS through the native client.
#[derive(Debug, Clone)]
pub struct SourceLister {
    pub map: SourceMap,
}

impl ListAtSource for SourceLister {
    fn list(&self, location: &str) -> Result<PartitionListing, String> {
        let place = match self.map.place(location) {
            Ok(place) => place,
            Err(why) => return Ok(PartitionListing::Unprovable(why)),
        };
        match place {
            Place::Mapped(dir, rest) => {
                local::list_tree(&dir.join(rest)).map(PartitionListing::Tree)
            }
            Place::Remote(Location::Hdfs { .. }) => {
                hdfs::list_tree(location).map(PartitionListing::Tree)
            }
            Place::Remote(Location::S3 { .. }) => Ok(PartitionListing::Unprovable(
                "S3 keeps no directory times: an unversioned bucket's listing cannot show that \
                 nothing was deleted since the event, and a versioned bucket's versions under a \
                 prefix are not read for this yet"
                    .to_owned(),
            )),
            Place::Remote(Location::Local { .. }) => Ok(PartitionListing::Unprovable(format!(
                "{location} is not a place stagefs lists"
            ))),
        }
    }
}

/// The event a listing must stand for.
#[derive(Debug, Clone, Copy)]
pub struct AtEvent {
    pub event_id: i64,
    /// `EVENT_TIME` × 1000; None when the row has none.
    pub time_ms: Option<i64>,
    pub margin: EventTimeMargin,
}

/// Whether Hive's readers skip `rel`: a component starting with `_` or `.`.
fn hidden(rel: &str) -> bool {
    rel.split('/')
        .any(|c| c.is_empty() || c.starts_with('_') || c.starts_with('.'))
}

/// The files of `listing` that are the partition's content at `at`
/// (sorted by path), or why the listing cannot be proven to be it (see
/// the module docs for the rule).
pub fn prove_at_event(listing: &PartitionListing, at: AtEvent) -> Result<Vec<TreeEntry>, String> {
    let tree = match listing {
        PartitionListing::Unprovable(why) => return Err(why.clone()),
        PartitionListing::Tree(None) => {
            return Err(
                "the partition directory does not exist now, so what it held at the event cannot be told"
                    .to_owned(),
            )
        }
        PartitionListing::Tree(Some(tree)) => tree,
    };
    let Some(time_ms) = at.time_ms else {
        return Err("the event has no time to check the listing against".to_owned());
    };
    let limit_ms = time_ms.saturating_add(at.margin.as_millis());
    let later = |what: &str, mtime_ms: i64| {
        format!(
            "{what} modified at {mtime_ms} ms since the epoch, {} ms after event {} (at {time_ms}; {} ms allowed by --event-time-margin {})",
            mtime_ms.saturating_sub(time_ms),
            at.event_id,
            at.margin.as_millis(),
            at.margin
        )
    };
    if tree.mtime_ms > limit_ms {
        return Err(later("the partition directory was", tree.mtime_ms));
    }
    let mut files = Vec::new();
    for entry in tree.entries.iter().filter(|e| !hidden(&e.rel)) {
        if entry.mtime_ms > limit_ms {
            let what = if entry.is_dir {
                format!("its subdirectory {} was", entry.rel)
            } else {
                format!("its file {} was", entry.rel)
            };
            return Err(later(&what, entry.mtime_ms));
        }
        if !entry.is_dir {
            files.push(entry.clone());
        }
    }
    files.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(files)
}

/// References for the files proven at the event below `location`: mapped
/// as the event's files `first`, `first + 1`, … (their keys), each checked
/// again when staged as not newer than the event.
pub fn listed_refs(
    map: &SourceMap,
    at: AtEvent,
    location: &str,
    first: usize,
    files: &[TreeEntry],
) -> Result<Vec<FileRef>, String> {
    let base = location.trim_end_matches('/');
    files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let uri = FileUri {
                path: format!("{base}/{}", f.rel),
                checksum: None,
                cm_root: None,
                subdir: None,
            };
            let mut file = map_file(map, at.event_id, at.time_ms, first + i, &uri, Some(base))?;
            file.verify = Verify::NotNewerThanEvent {
                time_ms: at.time_ms,
            };
            Ok(file)
        })
        .collect()
}

/// What stands in for a partition whose content at the event is unproven:
/// one reference that is never staged (its `reason` is the stall's).
pub fn unproven_ref(event_id: i64, index: usize, location: &str, reason: String) -> FileRef {
    let mut h = Sha256::new();
    h.update(b"stagefs hive unproven partition\0");
    h.update(event_id.to_le_bytes());
    h.update((index as u64).to_le_bytes());
    h.update(location.as_bytes());
    FileRef {
        path: location.to_owned(),
        name: UNPROVEN_NAME.to_owned(),
        subdir: None,
        verify: Verify::Unproven { reason },
        key: Some(BlobId(h.finalize().into())),
        source_dir: None,
        cm_path: None,
        cm_dir: None,
        uri: Some(location.to_owned()),
    }
}

/// The name of [`unproven_ref`]'s reference in its partition: hidden from
/// Hive's readers, so no listed file can have it (and no state holding it
/// is ever shown).
pub const UNPROVEN_NAME: &str = "_stagefs_unproven_listing";

#[cfg(test)]
mod tests {
    use super::*;

    const EVENT_MS: i64 = 1_700_000_000_000;

    fn at() -> AtEvent {
        AtEvent {
            event_id: 7,
            time_ms: Some(EVENT_MS),
            margin: EventTimeMargin::DEFAULT,
        }
    }

    fn entry(rel: &str, is_dir: bool, mtime_ms: i64) -> TreeEntry {
        TreeEntry {
            rel: rel.to_owned(),
            is_dir,
            size: 3,
            mtime_ms,
        }
    }

    fn tree(mtime_ms: i64, entries: Vec<TreeEntry>) -> PartitionListing {
        PartitionListing::Tree(Some(DirTree { mtime_ms, entries }))
    }

    fn rels(files: &[TreeEntry]) -> Vec<&str> {
        files.iter().map(|f| f.rel.as_str()).collect()
    }

    #[test]
    fn a_directory_unchanged_since_its_event_gives_its_files_hidden_ones_left_out() {
        let listing = tree(
            EVENT_MS - 5,
            vec![
                entry("part-00001-c000", false, EVENT_MS - 10),
                entry("part-00000-c000", false, EVENT_MS - 20),
                entry("_SUCCESS", false, EVENT_MS + 60_000),
                entry(".part-00000-c000.crc", false, EVENT_MS + 60_000),
                entry("HIVE_UNION_SUBDIR_1", true, EVENT_MS - 30),
                entry("HIVE_UNION_SUBDIR_1/000000_0", false, EVENT_MS - 40),
                entry("_temporary", true, EVENT_MS + 60_000),
                entry("_temporary/0/part-x", false, EVENT_MS + 60_000),
            ],
        );
        let files = prove_at_event(&listing, at()).unwrap();
        assert_eq!(
            rels(&files),
            vec![
                "HIVE_UNION_SUBDIR_1/000000_0",
                "part-00000-c000",
                "part-00001-c000"
            ]
        );
    }

    #[test]
    fn changes_within_the_margin_are_taken_for_the_event_and_later_ones_are_not() {
        // EVENT_TIME is whole seconds, truncated, recorded after the move.
        let within = tree(EVENT_MS + 1_000, vec![entry("a", false, EVENT_MS + 999)]);
        assert_eq!(rels(&prove_at_event(&within, at()).unwrap()), vec!["a"]);
        let dir_later = tree(EVENT_MS + 1_001, vec![entry("a", false, EVENT_MS)]);
        let why = prove_at_event(&dir_later, at()).unwrap_err();
        assert!(
            why.starts_with("the partition directory was modified at 1700000001001 ms since the epoch, 1001 ms after event 7"),
            "{why}"
        );
        let wider = AtEvent {
            margin: EventTimeMargin::new(std::time::Duration::from_secs(2)).unwrap(),
            ..at()
        };
        assert!(prove_at_event(&dir_later, wider).is_ok());
    }

    #[test]
    fn a_later_file_or_subdirectory_leaves_the_content_unproven() {
        let file_later = tree(EVENT_MS, vec![entry("000000_0", false, EVENT_MS + 4_000)]);
        let why = prove_at_event(&file_later, at()).unwrap_err();
        assert!(
            why.starts_with("its file 000000_0 was modified at"),
            "{why}"
        );
        let sub_later = tree(
            EVENT_MS,
            vec![
                entry("sub", true, EVENT_MS + 4_000),
                entry("sub/000000_0", false, EVENT_MS),
            ],
        );
        let why = prove_at_event(&sub_later, at()).unwrap_err();
        assert!(
            why.starts_with("its subdirectory sub was modified at"),
            "{why}"
        );
    }

    #[test]
    fn a_missing_directory_an_event_without_time_or_s3_is_unproven() {
        let missing = PartitionListing::Tree(None);
        assert!(prove_at_event(&missing, at())
            .unwrap_err()
            .contains("does not exist now"));
        let no_time = AtEvent {
            time_ms: None,
            ..at()
        };
        assert!(prove_at_event(&tree(0, vec![]), no_time)
            .unwrap_err()
            .contains("no time"));
        let s3 = SourceLister {
            map: SourceMap::default(),
        }
        .list("s3a://bucket/external/db.db/t/ds=1")
        .unwrap();
        assert!(prove_at_event(&s3, at())
            .unwrap_err()
            .starts_with("S3 keeps no directory times"));
    }

    #[test]
    fn an_empty_directory_unchanged_since_its_event_is_an_empty_partition() {
        assert_eq!(
            prove_at_event(&tree(EVENT_MS, vec![]), at()).unwrap(),
            vec![]
        );
    }

    #[test]
    fn a_local_partition_directory_is_listed_and_its_later_change_seen() {
        let root = tempfile::tempdir().unwrap();
        let part = root.path().join("t/ds=1");
        std::fs::create_dir_all(part.join("sub")).unwrap();
        std::fs::write(part.join("000000_0"), b"a").unwrap();
        std::fs::write(part.join("sub/000001_0"), b"b").unwrap();
        std::fs::write(part.join("_SUCCESS"), b"").unwrap();
        let map = SourceMap::parse(&[format!("hdfs://nn/wh={}", root.path().display())]).unwrap();
        let lister = SourceLister { map: map.clone() };
        let listing = lister.list("hdfs://nn/wh/t/ds=1").unwrap();
        let now_ms = crate::source_file::identity_of(&std::fs::metadata(&part).unwrap())
            .mtime_ns
            .div_euclid(1_000_000);
        let at_now = AtEvent {
            event_id: 3,
            time_ms: Some(now_ms),
            margin: EventTimeMargin::DEFAULT,
        };
        let files = prove_at_event(&listing, at_now).unwrap();
        assert_eq!(rels(&files), vec!["000000_0", "sub/000001_0"]);
        let refs = listed_refs(&map, at_now, "hdfs://nn/wh/t/ds=1", 0, &files).unwrap();
        assert_eq!(refs[1].subdir.as_deref(), Some("sub"));
        assert_eq!(refs[1].name, "000001_0");
        assert!(
            matches!(refs[0].verify, Verify::NotNewerThanEvent { time_ms: Some(t) } if t == now_ms)
        );
        // The same directory against an event 10 s before its last change.
        let before = AtEvent {
            time_ms: Some(now_ms - 10_000),
            ..at_now
        };
        assert!(prove_at_event(&listing, before).is_err());
        let gone = lister.list("hdfs://nn/wh/t/ds=2").unwrap();
        assert_eq!(gone, PartitionListing::Tree(None));
    }
}
