//! Which files of a transactional (ACID or insert-only) table's location a
//! Hive reader at the bootstrap's snapshot reads: Hive's
//! `AcidUtils.getAcidState` with the `ValidWriteIdList` and `ValidTxnList`
//! the snapshot holds (docs/HIVE.md "Bootstrap: transactional tables").
//!
//! Rules (from Hive's `AcidUtils` and `ValidReaderWriteIdList`):
//! - A write id is valid when it is at most the table's high watermark
//!   (`NEXT_WRITE_ID.NWI_NEXT - 1`) and its transaction is neither open nor
//!   aborted (`TXN_TO_WRITE_ID` joined with `TXNS`).
//! - A directory with a visibility suffix (`base_N_vM`, `delta_x_y_vM`,
//!   written by the compactor) is usable only when transaction M is
//!   committed for the reader (`ValidTxnList.isTxnValid`); else it is
//!   ignored altogether.
//! - `base_N`: a compacted base (suffix `_vM`, or `_metadata_acid` saying
//!   `compacted`) is valid when N is below the lowest open write id and at
//!   most the high watermark; a base written by INSERT OVERWRITE when
//!   write id N is valid; an aborted one is ignored. The valid base with the
//!   largest N wins (at equal N the compacted one). With a base, the
//!   original files (outside any `base_`/`delta_` directory) are obsolete.
//!   When bases exist but none is valid and the oldest is compacted, Hive
//!   fails the read ("not enough history"): the table is reported.
//! - `delta_x_y[_s]` / `delete_delta_x_y[_s]`: a range wholly aborted is
//!   skipped, one with no valid write id too. The others, sorted as Hive
//!   sorts them (min ascending, max descending, statement id), are taken
//!   when they reach above what is covered so far (the base's N, then the
//!   last delta taken) and hold a valid write id there; deltas of the same
//!   range with statement ids are all taken; a delta inside one taken
//!   (compacted away) is obsolete.
//! - Names starting with `_` or `.` are skipped at every level (Hive's
//!   `hiddenFileFilter`; `_orc_acid_version` and `_metadata_acid` are
//!   metadata, not data). Other directories hold original files.
//!
//! Where Hive would filter rows instead of files, a file copy cannot be
//! exact, so the table is reported instead of guessed: a chosen delta whose
//! own range holds an invalid write id (an open one; an aborted one unless
//! the delta was written by the compactor, which drops aborted rows), a
//! streaming side file (`*_flush_length`: the readable length is less than
//! the file), a base whose write id is the lowest open one, a visibility
//! transaction the snapshot cannot place, and names that start like an ACID
//! directory but do not parse.
//!
//! [`select`] is pure; [`choose_listed`] wraps it for the bootstrap driver
//! (`bootstrap::list_table`) with the listed files, the snapshot's ids
//! (`bootstrap::snapshot`) and a read of `_metadata_acid` where a base has
//! no visibility suffix.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::listing::ListedFile;

/// The transactions as the snapshot shows them (Hive's `ValidTxnList`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ValidTxns {
    /// Highest transaction id allocated (`NEXT_TXN_ID.NTXN_NEXT - 1`, or
    /// `MAX(TXNS.TXN_ID)` on schemas without `NEXT_TXN_ID`).
    pub high_watermark: i64,
    pub open: BTreeSet<i64>,
    pub aborted: BTreeSet<i64>,
}

impl ValidTxns {
    /// Whether transaction `txn` is committed for the reader. 0 (no
    /// visibility suffix) always is.
    pub fn is_committed(&self, txn: i64) -> bool {
        txn == 0
            || (txn <= self.high_watermark
                && !self.open.contains(&txn)
                && !self.aborted.contains(&txn))
    }
}

/// One table's write ids (Hive's `ValidReaderWriteIdList`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ValidWriteIds {
    /// `NEXT_WRITE_ID.NWI_NEXT - 1` (0 when no write id was allocated).
    pub high_watermark: i64,
    pub open: BTreeSet<i64>,
    pub aborted: BTreeSet<i64>,
}

impl ValidWriteIds {
    pub fn is_valid(&self, id: i64) -> bool {
        id <= self.high_watermark && !self.open.contains(&id) && !self.aborted.contains(&id)
    }

    fn min_open(&self) -> Option<i64> {
        self.open.iter().next().copied()
    }

    /// Write ids in `min..=max`: (valid, open or above the high
    /// watermark, aborted).
    fn count(&self, min: i64, max: i64) -> (u64, u64, u64) {
        if max < min {
            return (0, 0, 0);
        }
        let total = (max - min + 1) as u64;
        let above = (max - self.high_watermark.max(min - 1)).max(0) as u64;
        let top = max.min(self.high_watermark);
        let within = |set: &BTreeSet<i64>| {
            if top < min {
                0
            } else {
                set.range(min..=top).count() as u64
            }
        };
        let (open, aborted) = (within(&self.open), within(&self.aborted));
        (
            total.saturating_sub(above + open + aborted),
            above + open,
            aborted,
        )
    }

    fn any_valid(&self, min: i64, max: i64) -> bool {
        self.count(min, max).0 > 0
    }
}

/// What the snapshot says about one transactional table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcidIds {
    pub write_ids: ValidWriteIds,
    pub txns: std::sync::Arc<ValidTxns>,
}

/// A parsed `base_`/`delta_`/`delete_delta_` directory name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AcidDir {
    Base {
        write_id: i64,
        visibility: i64,
    },
    Delta {
        min: i64,
        max: i64,
        /// -1: none.
        statement: i64,
        visibility: i64,
        delete: bool,
    },
}

fn number(text: &str) -> Option<i64> {
    (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit() || b == b'-'))
        .then(|| text.parse().ok())
        .flatten()
}

/// `name` as Hive's `ParsedBaseLight` / `ParsedDeltaLight` read it: Some(Ok)
/// for an ACID directory, Some(Err) for one that starts like one but does
/// not parse, None for any other directory.
fn parse_dir(name: &str) -> Option<Result<AcidDir, String>> {
    let bad = || {
        Some(Err(format!(
            "directory `{name}` is not a base_/delta_ name Hive reads"
        )))
    };
    let (stem, visibility) = match name.find("_v") {
        Some(at) => match number(&name[at + 2..]) {
            Some(v) => (&name[..at], v),
            None if name.starts_with("base_")
                || name.starts_with("delta_")
                || name.starts_with("delete_delta_") =>
            {
                return bad()
            }
            None => return None,
        },
        None => (name, 0),
    };
    if let Some(rest) = stem.strip_prefix("base_") {
        return match number(rest) {
            Some(write_id) => Some(Ok(AcidDir::Base {
                write_id,
                visibility,
            })),
            None => bad(),
        };
    }
    let (rest, delete) = if let Some(r) = stem.strip_prefix("delete_delta_") {
        (r, true)
    } else if let Some(r) = stem.strip_prefix("delta_") {
        (r, false)
    } else {
        return None;
    };
    let parts: Vec<&str> = rest.split('_').collect();
    let parsed: Option<Vec<i64>> = parts.iter().map(|p| number(p)).collect();
    match parsed.as_deref() {
        Some([min, max]) if min <= max => Some(Ok(AcidDir::Delta {
            min: *min,
            max: *max,
            statement: -1,
            visibility,
            delete,
        })),
        Some([min, max, s]) if min <= max && *s >= 0 => Some(Ok(AcidDir::Delta {
            min: *min,
            max: *max,
            statement: *s,
            visibility,
            delete,
        })),
        _ => bad(),
    }
}

/// The files of one location a Hive reader at the snapshot reads, as
/// indexes into `rels` (paths relative to the location, hidden names
/// already skipped), or why that cannot be decided from files alone.
/// `compacted_marker(dir)` says whether `dir/_metadata_acid` marks a base
/// written by the compactor (bases without a visibility suffix).
pub fn select(
    rels: &[&str],
    ids: &AcidIds,
    compacted_marker: &dyn Fn(&str) -> bool,
) -> Result<Vec<usize>, String> {
    let wids = &ids.write_ids;
    let txns = &ids.txns;
    // Directory name → files in it; originals apart.
    let mut dirs: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut originals = Vec::new();
    for (i, rel) in rels.iter().enumerate() {
        match rel.split_once('/') {
            Some((top, _)) => match parse_dir(top) {
                Some(Ok(_)) => dirs.entry(top).or_default().push(i),
                Some(Err(e)) => return Err(e),
                None => originals.push(i),
            },
            None => originals.push(i),
        }
    }
    for (name, files) in &dirs {
        for &i in files {
            if rels[i].ends_with("_flush_length") {
                return Err(format!(
                    "{name} holds a streaming side file ({}): readers stop at the length it records",
                    rels[i]
                ));
            }
        }
    }
    // Bases (processBaseDir).
    let mut best: Option<(i64, bool, &str)> = None;
    let mut oldest: Option<(i64, bool)> = None;
    let mut deltas = Vec::new();
    for name in dirs.keys() {
        let Some(Ok(dir)) = parse_dir(name) else {
            continue;
        };
        match dir {
            AcidDir::Base {
                write_id,
                visibility,
            } => {
                if !txns.is_committed(visibility) {
                    continue;
                }
                let compacted = visibility > 0 || compacted_marker(name);
                if oldest.is_none_or(|(w, _)| write_id < w) {
                    oldest = Some((write_id, compacted));
                }
                if !compacted && wids.aborted.contains(&write_id) {
                    continue;
                }
                if wids.min_open() == Some(write_id) {
                    return Err(format!(
                        "{name}: its write id {write_id} is the lowest one still open, \
                         which Hive's reader treats inconsistently"
                    ));
                }
                let valid = if write_id == i64::MIN {
                    true
                } else if compacted {
                    write_id < wids.min_open().unwrap_or(i64::MAX)
                        && write_id <= wids.high_watermark
                } else {
                    wids.is_valid(write_id)
                };
                let better = match best {
                    None => true,
                    Some((w, c, _)) => w < write_id || (w == write_id && compacted && !c),
                };
                if valid && better {
                    best = Some((write_id, compacted, name));
                }
            }
            AcidDir::Delta {
                min,
                max,
                statement,
                visibility,
                delete,
            } => {
                if !txns.is_committed(visibility) {
                    continue;
                }
                let (valid, _, aborted) = wids.count(min, max);
                if aborted == (max - min + 1) as u64 || valid == 0 {
                    continue;
                }
                deltas.push((min, max, statement, visibility, delete, *name));
            }
        }
    }
    if best.is_none() {
        if let Some((w, true)) = oldest {
            return Err(format!(
                "no base is valid at the snapshot and the oldest, base_{w}, was written by \
                 the compactor: Hive fails such a read (not enough history)"
            ));
        }
    }
    // findBestWorkingDeltas.
    deltas.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then(b.1.cmp(&a.1))
            .then(a.2.cmp(&b.2))
            .then(a.5.cmp(b.5))
    });
    let mut current = best.map_or(0, |(w, _, _)| w);
    let mut last_statement = -1;
    let mut prev: Option<(i64, i64, i64)> = None;
    let mut chosen: Vec<&str> = Vec::new();
    let mut taken = Vec::new();
    for &(min, max, statement, visibility, _, name) in &deltas {
        let take = if max > current {
            if wids.any_valid(current + 1, max) {
                current = max;
                last_statement = statement;
                true
            } else {
                false
            }
        } else {
            (max == current && last_statement >= 0)
                || prev.is_some_and(|p| p == (min, max, statement))
        };
        if take {
            prev = Some((min, max, statement));
            chosen.push(name);
            taken.push((min, max, visibility, name));
        }
    }
    for (min, max, visibility, name) in taken {
        let (_, open, aborted) = wids.count(min, max);
        if open > 0 {
            return Err(format!(
                "{name} holds write ids still open (or not yet allocated) at the snapshot: \
                 Hive filters their rows, a file copy cannot"
            ));
        }
        if aborted > 0 && visibility == 0 {
            return Err(format!(
                "{name} holds rows of aborted write ids that Hive filters when it reads, \
                 which a file copy cannot"
            ));
        }
    }
    let mut out = Vec::new();
    if let Some((_, _, name)) = best {
        out.extend(&dirs[name]);
    } else {
        out.extend(&originals);
    }
    for name in chosen {
        out.extend(&dirs[name]);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The files of `files` (listed below `location`) that a Hive reader at
/// the snapshot reads; `Err` says why that cannot be decided (no ids:
/// the metastore has no transaction tables).
pub fn choose_listed(
    location: &Path,
    files: Vec<ListedFile>,
    ids: Option<&AcidIds>,
) -> Result<Vec<ListedFile>, String> {
    let ids = ids.ok_or_else(|| {
        "the metastore has no TXNS, TXN_TO_WRITE_ID and NEXT_WRITE_ID tables, so which \
         base_/delta_ directories are valid cannot be decided"
            .to_string()
    })?;
    let rels: Vec<&str> = files.iter().map(|f| f.rel.as_str()).collect();
    let marker = |dir: &str| {
        let path = location.join(dir).join("_metadata_acid");
        // Only a regular file counts (a link could lead anywhere).
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_file() && m.len() <= 4096 => std::fs::read_to_string(&path)
                .map(|t| metadata_says_compacted(&t))
                .unwrap_or(false),
            _ => false,
        }
    };
    let keep = select(&rels, ids, &marker)?;
    let mut keep = keep.into_iter().peekable();
    Ok(files
        .into_iter()
        .enumerate()
        .filter_map(|(i, f)| {
            (keep.peek() == Some(&i)).then(|| {
                keep.next();
                f
            })
        })
        .collect())
}

/// Whether `_metadata_acid` text says the directory was compacted
/// (`{"thisFileVersion":"0","dataFormat":"compacted"}`).
pub fn metadata_says_compacted(text: &str) -> bool {
    let squeezed: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    squeezed.contains("\"dataFormat\":\"compacted\"")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn ids(hwm: i64, open: &[i64], aborted: &[i64], txns: ValidTxns) -> AcidIds {
        AcidIds {
            write_ids: ValidWriteIds {
                high_watermark: hwm,
                open: open.iter().copied().collect(),
                aborted: aborted.iter().copied().collect(),
            },
            txns: Arc::new(txns),
        }
    }

    fn txns(hwm: i64, open: &[i64], aborted: &[i64]) -> ValidTxns {
        ValidTxns {
            high_watermark: hwm,
            open: open.iter().copied().collect(),
            aborted: aborted.iter().copied().collect(),
        }
    }

    fn chosen(rels: &[&str], ids: &AcidIds) -> Result<Vec<String>, String> {
        select(rels, ids, &|_| false).map(|ix| ix.into_iter().map(|i| rels[i].to_owned()).collect())
    }

    #[test]
    fn names_parse_as_hive_parses_them() {
        assert_eq!(
            parse_dir("base_0000005_v0000123"),
            Some(Ok(AcidDir::Base {
                write_id: 5,
                visibility: 123
            }))
        );
        assert_eq!(
            parse_dir("delete_delta_0000002_0000003_0001"),
            Some(Ok(AcidDir::Delta {
                min: 2,
                max: 3,
                statement: 1,
                visibility: 0,
                delete: true
            }))
        );
        assert_eq!(parse_dir("HIVE_UNION_SUBDIR_1"), None);
        assert!(matches!(parse_dir("delta_x_1"), Some(Err(_))));
        assert!(matches!(parse_dir("base_5_vx"), Some(Err(_))));
        assert!(matches!(parse_dir("delta_3_2"), Some(Err(_))));
    }

    #[test]
    fn the_best_base_and_the_deltas_above_it_win_aborted_and_compacted_ones_do_not() {
        let rels = [
            "000000_0",
            "base_0000002/bucket_00000",
            "base_0000004_v0000040/bucket_00000",
            "delta_0000001_0000001_0000/bucket_00000",
            "delta_0000005_0000005_0000/bucket_00000",
            "delete_delta_0000005_0000005_0000/bucket_00000",
            "delta_0000006_0000006_0000/bucket_00000",
            "delta_0000007_0000007_0000/bucket_00000",
            "delta_0000008_0000008_0000/bucket_00000",
            "delta_0000007_0000008_v0000090/bucket_00000",
            "delta_0000009_0000009_0000/bucket_00000",
        ];
        // Write id 6 aborted, 9 open; the compactor's txns 40 and 90 committed.
        let got = chosen(&rels, &ids(9, &[9], &[6], txns(100, &[95], &[50]))).unwrap();
        assert_eq!(
            got,
            vec![
                "base_0000004_v0000040/bucket_00000",
                "delta_0000005_0000005_0000/bucket_00000",
                "delete_delta_0000005_0000005_0000/bucket_00000",
                "delta_0000007_0000008_v0000090/bucket_00000",
            ]
        );
        // The minor compaction not committed yet: its inputs are read.
        let got = chosen(&rels, &ids(9, &[9], &[6], txns(100, &[90], &[]))).unwrap();
        assert!(got.contains(&"delta_0000007_0000007_0000/bucket_00000".to_string()));
        assert!(got.contains(&"delta_0000008_0000008_0000/bucket_00000".to_string()));
        assert!(!got.iter().any(|r| r.contains("_v0000090")));
    }

    #[test]
    fn originals_count_only_without_a_base_and_statements_of_one_txn_are_all_read() {
        let rels = [
            "000000_0",
            "sub/000001_0",
            "delta_0000001_0000001_0000/000000_0",
            "delta_0000001_0000001_0001/000000_0",
        ];
        let got = chosen(&rels, &ids(1, &[], &[], txns(10, &[], &[]))).unwrap();
        assert_eq!(got, rels.to_vec());
        let with_base = ["000000_0", "base_0000001/000000_0"];
        let got = chosen(&with_base, &ids(1, &[], &[], txns(10, &[], &[]))).unwrap();
        assert_eq!(got, vec!["base_0000001/000000_0"]);
    }

    #[test]
    fn an_insert_overwrite_base_follows_its_write_id_a_compacted_one_the_open_ones() {
        let rels = ["delta_0000001_0000001_0000/b", "base_0000003/b"];
        // IOW base 3 valid although write id 2 is open.
        let got = chosen(&rels, &ids(3, &[2], &[], txns(10, &[], &[]))).unwrap();
        assert_eq!(got, vec!["base_0000003/b"]);
        // IOW base aborted: ignored.
        let got = chosen(&rels, &ids(3, &[], &[3], txns(10, &[], &[]))).unwrap();
        assert_eq!(got, vec!["delta_0000001_0000001_0000/b"]);
        // The same base written by the compactor, with 2 open: Hive fails.
        let err = select(&rels, &ids(3, &[2], &[], txns(10, &[], &[])), &|d| {
            d == "base_0000003"
        })
        .unwrap_err();
        assert!(err.contains("not enough history"), "{err}");
    }

    #[test]
    fn what_only_row_filtering_could_read_is_reported() {
        let ids_open = ids(3, &[2], &[], txns(10, &[], &[]));
        let err = chosen(&["delta_0000001_0000003/bucket_00000"], &ids_open).unwrap_err();
        assert!(err.contains("still open"), "{err}");
        let ids_aborted = ids(3, &[], &[2], txns(10, &[], &[]));
        let err = chosen(&["delta_0000001_0000003/bucket_00000"], &ids_aborted).unwrap_err();
        assert!(err.contains("aborted"), "{err}");
        // Written by the compactor: aborted rows were dropped, it is read whole.
        let got = chosen(
            &["delta_0000001_0000003_v0000009/bucket_00000"],
            &ids_aborted,
        )
        .unwrap();
        assert_eq!(got.len(), 1);
        let err = chosen(
            &["delta_0000001_0000003/bucket_00000_flush_length"],
            &ids(3, &[], &[], txns(10, &[], &[])),
        )
        .unwrap_err();
        assert!(err.contains("side file"), "{err}");
        let err = chosen(&["delta_1_x/b"], &ids(3, &[], &[], txns(10, &[], &[]))).unwrap_err();
        assert!(err.contains("delta_1_x"), "{err}");
    }

    #[test]
    fn directories_above_the_high_watermarks_are_not_read() {
        let rels = [
            "delta_0000001_0000001_0000/b",
            "delta_0000002_0000002_0000/b",
            "base_0000001_v0000020/b",
        ];
        let got = chosen(&rels, &ids(1, &[], &[], txns(10, &[], &[]))).unwrap();
        assert_eq!(got, vec!["delta_0000001_0000001_0000/b"]);
    }

    #[test]
    fn compacted_metadata_is_recognised() {
        assert!(metadata_says_compacted(
            "{\"thisFileVersion\":\"0\", \"dataFormat\" : \"compacted\"}"
        ));
        assert!(!metadata_says_compacted(
            "{\"thisFileVersion\":\"0\",\"dataFormat\":\"raw\"}"
        ));
    }
}
