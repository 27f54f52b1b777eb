//! `--hive-events PATH`: Hive's notification log exported as JSON Lines, a
//! [`RowSource`] for offline replay, tests and the demo.
//!
//! PATH is one file or a folder of `*.jsonl` files read in name order,
//! followed as it grows exactly like `--events` (the native
//! [`SourceLog`] tails it: a line counts once it ends with a newline).
//! Each line is one row, a JSON object keyed by column name:
//! - a `NOTIFICATION_LOG` row (`EVENT_ID`, `EVENT_TIME`, `EVENT_TYPE`,
//!   `DB_NAME`, `TBL_NAME`, `MESSAGE`, `MESSAGE_FORMAT`, ...);
//! - a `TXN_WRITE_NOTIFICATION_LOG` row, recognised by its `WNL_TXNID`
//!   key (`WNL_DATABASE`, `WNL_TABLE`, `WNL_PARTITION`, `WNL_FILES`, ...).
//!   It must come before the `COMMIT_TXN` row of its transaction, as Hive
//!   writes it before the commit.
//!
//! Rows with `EVENT_ID <= after` are skipped, so a restart re-reads the
//! files from the start and resumes after the last journaled event. Ids
//! must increase down the files: a row whose id is not above the row
//! before it (a repeated or out-of-order id) is a bad row, and so is a
//! write row that comes after its transaction's commit was read (the
//! commit was applied without it).

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;

use super::message::decode_message;
use super::model::{HiveMessage, NotificationRow, RowSource, RowSourceError, TxnWriteRow};
use crate::source::native::{LogPosition, SourceLog};

/// Reads rows from exported JSON Lines.
pub struct FileRows {
    log: SourceLog,
    /// Notification rows read and not returned yet.
    ready: VecDeque<NotificationRow>,
    /// Write rows by transaction, until the transaction's commit asks.
    txns: HashMap<i64, Vec<TxnWriteRow>>,
    /// A bad line, reported after the good rows before it.
    bad: Option<RowSourceError>,
    /// What the files looked like at the last rewind, to re-read only
    /// after a change.
    rewound_at: Option<Vec<(String, u64, Option<std::time::SystemTime>)>>,
    path: std::path::PathBuf,
    /// The highest `EVENT_ID` read since the files were opened or rewound
    /// (skipped rows included).
    highest: Option<i64>,
    /// Transactions whose writes a commit has taken (the newest
    /// `COMMITTED_REMEMBERED`), to report a write row that comes too late.
    committed: HashSet<i64>,
    committed_order: VecDeque<i64>,
    /// The `after` of the first poll since the files were opened or
    /// rewound: the last journaled event, so the commits up to it are
    /// decoded already (a later poll's `after` may count rows read ahead,
    /// not decoded yet).
    journaled: Option<i64>,
}

/// How many committed transactions are remembered to catch a write row
/// that comes after its commit (8 bytes each, twice).
const COMMITTED_REMEMBERED: usize = 65_536;

const LINES_PER_READ: usize = 4096;

impl FileRows {
    pub fn open(path: &Path) -> Result<FileRows, RowSourceError> {
        if !path.exists() {
            return Err(RowSourceError::Fatal(format!(
                "--hive-events {}: no such file or folder",
                path.display()
            )));
        }
        Ok(FileRows {
            log: SourceLog::follow(path, LogPosition::default()),
            ready: VecDeque::new(),
            txns: HashMap::new(),
            bad: None,
            rewound_at: None,
            path: path.to_owned(),
            highest: None,
            committed: HashSet::new(),
            committed_order: VecDeque::new(),
            journaled: None,
        })
    }

    /// Reads what the files hold now into `ready` / `txns`, stopping at
    /// `want` ready rows above `after`.
    fn read(&mut self, after: i64, want: usize) -> Result<(), RowSourceError> {
        while self.bad.is_none() && self.ready.len() < want {
            if self.read_lines(after)? > 0 {
                continue;
            }
            // At the end: an export replaced by a new one (or cut short) is
            // read again from its start, as at a restart.
            if !self.log.replaced() {
                break;
            }
            tracing::warn!(
                path = %self.path.display(),
                "--hive-events was replaced or truncated: reading it again from the start \
                 (rows up to the last one read are skipped)"
            );
            self.restart_reading();
        }
        Ok(())
    }

    /// Reads the next lines (up to `LINES_PER_READ`) into `ready` / `txns`;
    /// how many were read, 0 at the end of the files.
    fn read_lines(&mut self, after: i64) -> Result<usize, RowSourceError> {
        let journaled = self.journaled.unwrap_or(i64::MIN);
        let FileRows {
            log,
            ready,
            txns,
            bad,
            highest,
            committed,
            ..
        } = self;
        // Each line parsed straight from the read buffer (no copy).
        let read = log.poll_each(LINES_PER_READ, |line| {
            let location = || format!("{}:{}", line.next.file, line.next.line);
            let (reason, event_id) = match parse_line(line.bytes) {
                Ok(Row::Notification(row)) => match *highest {
                    Some(before) if row.event_id == before => (
                        format!(
                            "event {before} was read again after event {before} (a repeated id: \
                             the export is corrupt)"
                        ),
                        Some(row.event_id),
                    ),
                    Some(before) if row.event_id < before => (
                        format!(
                            "event {} comes after event {before} (ids must increase: an \
                             out-of-order id, the export is corrupt)",
                            row.event_id
                        ),
                        Some(row.event_id),
                    ),
                    _ => {
                        *highest = Some(row.event_id);
                        if row.event_id > after {
                            ready.push_back(row);
                        } else if row.event_id <= journaled && row.event_type == "COMMIT_TXN" {
                            // Journaled before a restart: its write rows,
                            // read above, are not asked for again. (Not
                            // remembered as committed: whether a write row
                            // after it was taken with it then is unknown.)
                            if let Ok(HiveMessage::CommitTxn { txn_id }) = decode_message(&row) {
                                txns.remove(&txn_id);
                            }
                        }
                        return true;
                    }
                },
                Ok(Row::TxnWrite(row)) if committed.contains(&row.txn_id) => (
                    format!(
                        "a write row of transaction {} after its COMMIT_TXN, which was \
                         applied without it (write rows must come before their commit, \
                         as Hive writes them): correct the export and re-bootstrap",
                        row.txn_id
                    ),
                    None,
                ),
                Ok(Row::TxnWrite(row)) => {
                    txns.entry(row.txn_id).or_default().push(row);
                    return true;
                }
                Err(reason) => (reason, None),
            };
            *bad = Some(RowSourceError::BadRow {
                location: location(),
                reason,
                event_id,
            });
            false
        });
        let read = read.map_err(|e| match e {
            crate::source::native::IngestError::LineTooLong { file, line, max } => {
                RowSourceError::BadRow {
                    location: format!("{file}:{line}"),
                    reason: format!("the line is longer than {max} bytes"),
                    event_id: None,
                }
            }
            other => RowSourceError::Unavailable(other.to_string()),
        })?;
        Ok(read)
    }

    /// Reads the files again from their start; what was read of them is
    /// forgotten (rows up to the caller's `after` are skipped again; the
    /// write rows of commits after [`FileRows::journaled`] are kept, as
    /// those commits may be read ahead and not decoded yet).
    fn restart_reading(&mut self) {
        self.log = SourceLog::follow(&self.path, LogPosition::default());
        self.ready.clear();
        self.txns.clear();
        self.bad = None;
        self.highest = None;
        self.committed.clear();
        self.committed_order.clear();
    }
}

enum Row {
    Notification(NotificationRow),
    TxnWrite(TxnWriteRow),
}

fn parse_line(bytes: &[u8]) -> Result<Row, String> {
    // Fast path for the common line, a notification row: straight into the
    // struct, no `Value` in between. Only taken when the result is the
    // same as below: an object (a struct also reads from an array), and no
    // `WNL_TXNID` key, which without `\u` escapes must appear literally.
    // Anything else, errors included, takes the general path.
    let object = bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if object && !contains(bytes, b"WNL_TXNID") && !contains(bytes, b"\\u") {
        if let Ok(row) = serde_json::from_slice::<NotificationRow>(bytes) {
            return Ok(Row::Notification(row));
        }
    }
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not a JSON row: {e}"))?;
    let is_write = value.get("WNL_TXNID").is_some();
    if !value.is_object() {
        return Err("a row must be a JSON object keyed by column name".into());
    }
    if is_write {
        serde_json::from_value(value)
            .map(Row::TxnWrite)
            .map_err(|e| format!("not a TXN_WRITE_NOTIFICATION_LOG row: {e}"))
    } else {
        serde_json::from_value(value)
            .map(Row::Notification)
            .map_err(|e| format!("not a NOTIFICATION_LOG row: {e}"))
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    // Rows are UTF-8 (JSON): std's substring search (SIMD for short
    // needles) instead of a byte-at-a-time scan.
    if let (Ok(h), Ok(n)) = (std::str::from_utf8(haystack), std::str::from_utf8(needle)) {
        return h.contains(n);
    }
    let Some(&first) = needle.first() else {
        return true;
    };
    haystack
        .iter()
        .enumerate()
        .any(|(i, &b)| b == first && haystack[i..].starts_with(needle))
}

impl RowSource for FileRows {
    fn poll(&mut self, after: i64, limit: usize) -> Result<Vec<NotificationRow>, RowSourceError> {
        self.journaled.get_or_insert(after);
        while self.ready.front().is_some_and(|r| r.event_id <= after) {
            self.ready.pop_front();
        }
        self.read(after, limit)?;
        if self.ready.is_empty() {
            if let Some(bad) = self.bad.clone() {
                return Err(bad);
            }
        }
        let n = self.ready.len().min(limit);
        Ok(self.ready.drain(..n).collect())
    }

    fn txn_writes(&mut self, txn_id: i64) -> Result<Vec<TxnWriteRow>, RowSourceError> {
        let mut rows = self.txns.remove(&txn_id).unwrap_or_default();
        rows.sort_by_key(|r| r.wnl_id);
        // Remembered (the newest COMMITTED_REMEMBERED) to report a write
        // row of it that comes later.
        if self.committed.insert(txn_id) {
            self.committed_order.push_back(txn_id);
            if self.committed_order.len() > COMMITTED_REMEMBERED {
                if let Some(old) = self.committed_order.pop_front() {
                    self.committed.remove(&old);
                }
            }
        }
        Ok(rows)
    }

    fn newest_event_id(&mut self) -> Result<Option<i64>, RowSourceError> {
        Ok(None)
    }

    fn describe(&self) -> String {
        self.log.describe()
    }

    /// Re-reads the files from their start (rows up to `after` are skipped
    /// as at a restart) once they changed since the last rewind.
    fn rewind(&mut self) -> bool {
        let now = self.log.fingerprint();
        if self.rewound_at.as_ref() == Some(&now) {
            return false;
        }
        self.rewound_at = Some(now);
        self.restart_reading();
        // The next poll resumes after the last journaled event.
        self.journaled = None;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn append(path: &Path, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn rows_are_followed_as_the_file_grows_and_write_rows_wait_for_their_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.jsonl");
        append(&path, "{\"EVENT_ID\":1,\"EVENT_TYPE\":\"OPEN_TXN\"}\n");
        append(
            &path,
            "{\"WNL_ID\":1,\"WNL_TXNID\":7,\"WNL_DATABASE\":\"d\",\"WNL_TABLE\":\"t\",\"WNL_FILES\":\"x###\"}\n",
        );
        append(
            &path,
            "{\"EVENT_ID\":2,\"EVENT_TYPE\":\"COMMIT_TXN\"}\n{\"EVENT_ID\":3,",
        );
        let mut rows = FileRows::open(&path).unwrap();
        let got = rows.poll(0, 10).unwrap();
        assert_eq!(
            got.iter().map(|r| r.event_id).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(rows.txn_writes(7).unwrap().len(), 1);
        assert!(rows.poll(2, 10).unwrap().is_empty());
        append(&path, "\"EVENT_TYPE\":\"ABORT_TXN\"}\n");
        assert_eq!(rows.poll(2, 10).unwrap()[0].event_id, 3);
    }

    #[test]
    fn restart_skips_rows_already_read_and_a_bad_line_comes_after_the_good_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.jsonl");
        append(
            &path,
            "{\"EVENT_ID\":1,\"EVENT_TYPE\":\"X\"}\n{\"EVENT_ID\":2,\"EVENT_TYPE\":\"X\"}\nnot json\n",
        );
        let mut rows = FileRows::open(&path).unwrap();
        let got = rows.poll(1, 10).unwrap();
        assert_eq!(got.iter().map(|r| r.event_id).collect::<Vec<_>>(), vec![2]);
        match rows.poll(2, 10) {
            Err(RowSourceError::BadRow { location, .. }) => assert!(location.ends_with(":3")),
            other => panic!("{other:?}"),
        }
    }

    fn row(id: i64) -> String {
        format!("{{\"EVENT_ID\":{id},\"EVENT_TYPE\":\"X\"}}\n")
    }

    /// A write row (WNL_ID `wnl`) of transaction `txn`.
    fn write_row(wnl: i64, txn: i64) -> String {
        format!(
            "{{\"WNL_ID\":{wnl},\"WNL_TXNID\":{txn},\"WNL_DATABASE\":\"d\",\"WNL_TABLE\":\"t\",\"WNL_FILES\":\"x###\"}}\n"
        )
    }

    /// Event `id`, the COMMIT_TXN of transaction `txn`.
    fn commit_row(id: i64, txn: i64) -> String {
        format!(
            "{{\"EVENT_ID\":{id},\"EVENT_TYPE\":\"COMMIT_TXN\",\"MESSAGE\":\"{{\\\"txnid\\\":{txn}}}\"}}\n"
        )
    }

    fn bad_row(got: Result<Vec<NotificationRow>, RowSourceError>) -> (String, String, Option<i64>) {
        match got {
            Err(RowSourceError::BadRow {
                location,
                reason,
                event_id,
            }) => (location, reason, event_id),
            other => panic!("expected a bad row, got {other:?}"),
        }
    }

    #[test]
    fn an_id_that_does_not_increase_is_a_bad_row_also_across_polls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.jsonl");
        append(&path, &(1..=3).map(row).collect::<String>());
        let mut rows = FileRows::open(&path).unwrap();
        assert_eq!(rows.poll(0, 3).unwrap().len(), 3);
        // Event 3 again, after the batch that ended with it.
        append(&path, &row(3));
        let (location, reason, id) = bad_row(rows.poll(3, 3));
        assert!(location.ends_with(":4"), "{location}");
        assert!(
            reason.contains("event 3 was read again after event 3"),
            "{reason}"
        );
        assert_eq!(id, Some(3));

        // Out of order: 1, 2, 4, 3 is a bad row at 3 once the 3 is read
        // (the adapter sees the 4 first, as a gap).
        let path = dir.path().join("order.jsonl");
        append(&path, &[1, 2, 4, 3].map(row).concat());
        let mut rows = FileRows::open(&path).unwrap();
        let got = rows.poll(0, 10).unwrap();
        assert_eq!(
            got.iter().map(|r| r.event_id).collect::<Vec<_>>(),
            vec![1, 2, 4]
        );
        let (_, reason, id) = bad_row(rows.poll(4, 10));
        assert!(reason.contains("event 3 comes after event 4"), "{reason}");
        assert_eq!(id, Some(3));

        // A restart skips the rows journaled before, silently, and a
        // rewind reads everything again without calling it a repeat.
        let mut rows = FileRows::open(&path).unwrap();
        assert_eq!(rows.poll(2, 10).unwrap()[0].event_id, 4);
        std::fs::write(&path, [1, 2, 3].map(row).concat()).unwrap();
        assert!(rows.rewind());
        let got = rows.poll(1, 10).unwrap();
        assert_eq!(
            got.iter().map(|r| r.event_id).collect::<Vec<_>>(),
            vec![2, 3]
        );
    }

    #[test]
    fn write_rows_of_commits_before_a_restart_are_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.jsonl");
        let write = |txn: i64| write_row(txn, txn);
        append(
            &path,
            &format!(
                "{}{}{}{}",
                write(7),
                commit_row(1, 7),
                write(8),
                commit_row(2, 8)
            ),
        );
        // Resumed after event 1: transaction 7's write row is dropped,
        // transaction 8's waits for its commit.
        let mut rows = FileRows::open(&path).unwrap();
        assert_eq!(rows.poll(1, 10).unwrap()[0].event_id, 2);
        assert!(!rows.txns.contains_key(&7));
        assert_eq!(rows.txn_writes(8).unwrap().len(), 1);
        assert!(rows.txns.is_empty());
    }

    #[test]
    fn a_replaced_or_truncated_export_is_read_again_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.jsonl");
        let padded = |id: i64| {
            format!(
                "{{\"EVENT_ID\":{id},\"EVENT_TYPE\":\"X\",\"DB_NAME\":\"{}\"}}\n",
                "d".repeat(60)
            )
        };
        append(&path, &(1..=3).map(padded).collect::<String>());
        let mut rows = FileRows::open(&path).unwrap();
        assert_eq!(rows.poll(0, 10).unwrap().len(), 3);
        // Written aside and renamed into place, with two more rows.
        let aside = dir.path().join("rows.tmp");
        std::fs::write(&aside, (1..=5).map(padded).collect::<String>()).unwrap();
        std::fs::rename(&aside, &path).unwrap();
        let got = rows.poll(3, 10).unwrap();
        assert_eq!(
            got.iter().map(|r| r.event_id).collect::<Vec<_>>(),
            vec![4, 5]
        );
        // Rewritten in place, shorter than what was read of it.
        std::fs::write(&path, (1..=6).map(row).collect::<String>()).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() < 5 * padded(1).len() as u64);
        let got = rows.poll(5, 10).unwrap();
        assert_eq!(got.iter().map(|r| r.event_id).collect::<Vec<_>>(), vec![6]);
        // Unchanged: nothing read again.
        assert!(rows.poll(6, 10).unwrap().is_empty());
    }

    #[test]
    fn a_replaced_export_keeps_the_writes_of_commits_read_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.jsonl");
        let (write, commit) = (write_row(1, 7), commit_row(1, 7));
        append(&path, &format!("{write}{commit}"));
        let mut rows = FileRows::open(&path).unwrap();
        // The commit is returned (a full batch) ...
        assert_eq!(rows.poll(0, 1).unwrap()[0].event_id, 1);
        // ... the export is replaced (the same rows and one more) ...
        let aside = dir.path().join("rows.tmp");
        std::fs::write(&aside, format!("{write}{commit}{}", row(2))).unwrap();
        std::fs::rename(&aside, &path).unwrap();
        // ... the next batch is read ahead before the commit is decoded ...
        assert_eq!(rows.poll(1, 1).unwrap()[0].event_id, 2);
        // ... and decoding the commit still finds its write row.
        assert_eq!(rows.txn_writes(7).unwrap().len(), 1);
    }

    #[test]
    fn a_write_row_taken_by_its_commit_is_no_bad_row_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.jsonl");
        // Read in one go with its commit before it was decoded: taken.
        append(
            &path,
            &format!("{}{}{}", commit_row(1, 7), write_row(1, 7), row(2)),
        );
        let mut rows = FileRows::open(&path).unwrap();
        assert_eq!(rows.poll(0, 10).unwrap().len(), 2);
        assert_eq!(rows.txn_writes(7).unwrap().len(), 1);
        // A restart after event 2 reads the same file without a stop.
        let mut rows = FileRows::open(&path).unwrap();
        assert!(rows.poll(2, 10).unwrap().is_empty());
    }

    #[test]
    fn a_write_row_after_its_commit_was_read_is_a_bad_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.jsonl");
        let write = |txn: i64| write_row(1, txn);
        append(&path, &format!("{}{}", row(1), row(2)));
        let mut rows = FileRows::open(&path).unwrap();
        assert_eq!(rows.poll(0, 10).unwrap().len(), 2);
        // Event 2 was transaction 7's commit: it found no write rows.
        assert!(rows.txn_writes(7).unwrap().is_empty());
        // A write row of another transaction is fine; one of 7 is not.
        append(&path, &format!("{}{}{}", write(8), row(3), write(7)));
        assert_eq!(rows.poll(2, 10).unwrap()[0].event_id, 3);
        let (location, reason, id) = bad_row(rows.poll(3, 10));
        assert!(location.ends_with(":5"), "{location}");
        assert!(
            reason.contains("transaction 7 after its COMMIT_TXN"),
            "{reason}"
        );
        assert_eq!(id, None);
        assert_eq!(rows.txn_writes(8).unwrap().len(), 1);
    }

    #[test]
    fn lines_read_the_same_through_the_fast_path_and_the_general_one() {
        let as_event = |line: &str| match parse_line(line.as_bytes()) {
            Ok(Row::Notification(r)) => Ok(Some(r.event_id)),
            Ok(Row::TxnWrite(_)) => Ok(None),
            Err(e) => Err(e),
        };
        assert_eq!(
            as_event(r#" {"EVENT_ID":4,"EVENT_TYPE":"X","MESSAGE":null}"#),
            Ok(Some(4))
        );
        // A write row, also when its key is spelled with an escape.
        let write =
            r#"{"EVENT_ID":5,"EVENT_TYPE":"X","WNL_TXNID":7,"WNL_DATABASE":"d","WNL_TABLE":"t"}"#;
        assert_eq!(as_event(write), Ok(None));
        let escaped = write.replace("WNL_TXNID", "WNL\\u005fTXNID");
        assert_eq!(as_event(&escaped), Ok(None));
        // Not an object: refused, though a struct could be read from an array.
        let array = as_event(r#"[null,6,null,"X"]"#).unwrap_err();
        assert!(array.contains("JSON object"), "{array}");
        // A repeated key: the last one wins, as in the general path.
        assert_eq!(
            as_event(r#"{"EVENT_ID":1,"EVENT_ID":8,"EVENT_TYPE":"X"}"#),
            Ok(Some(8))
        );
        assert!(as_event(r#"{"EVENT_TYPE":"X"}"#).is_err());
    }
}
