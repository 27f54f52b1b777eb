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
//! files from the start and resumes after the last journaled event.

use std::collections::{HashMap, VecDeque};
use std::path::Path;

use super::model::{NotificationRow, RowSource, RowSourceError, TxnWriteRow};
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
}

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
        })
    }

    /// Reads what the files hold now into `ready` / `txns`, stopping at
    /// `want` ready rows above `after`.
    fn read(&mut self, after: i64, want: usize) -> Result<(), RowSourceError> {
        let FileRows {
            log,
            ready,
            txns,
            bad,
            ..
        } = self;
        while bad.is_none() && ready.len() < want {
            // Each line parsed straight from the read buffer (no copy).
            let read = log.poll_each(LINES_PER_READ, |line| {
                match parse_line(line.bytes) {
                    Ok(Row::Notification(row)) if row.event_id > after => ready.push_back(row),
                    Ok(Row::Notification(_)) => {}
                    Ok(Row::TxnWrite(row)) => txns.entry(row.txn_id).or_default().push(row),
                    Err(reason) => {
                        let location = format!("{}:{}", line.next.file, line.next.line);
                        *bad = Some(RowSourceError::BadRow { location, reason });
                        return false;
                    }
                }
                true
            });
            let read = read.map_err(|e| match e {
                crate::source::native::IngestError::LineTooLong { file, line, max } => {
                    RowSourceError::BadRow {
                        location: format!("{file}:{line}"),
                        reason: format!("the line is longer than {max} bytes"),
                    }
                }
                other => RowSourceError::Unavailable(other.to_string()),
            })?;
            if read == 0 {
                return Ok(());
            }
        }
        Ok(())
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
        self.log = SourceLog::follow(&self.path, LogPosition::default());
        self.ready.clear();
        self.txns.clear();
        self.bad = None;
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
