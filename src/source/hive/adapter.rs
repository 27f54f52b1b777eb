//! The Hive adapter: a [`Source`] over any [`RowSource`] (the metastore
//! database or `--hive-events` files) that turns notification rows into
//! stagefs [`Event`]s.
//!
//! Owns:
//! - id checks: ids are contiguous; a jump stops replication at the last
//!   good state with "events A..B are missing from the metastore:
//!   re-bootstrap", a repeated (or decreasing) id stops it as corruption;
//! - polling: `EVENT_ID > last` with a batch limit, every poll interval,
//!   at once again while a batch comes back full (the ingest loop polls
//!   again without waiting whenever it got records); an unavailable row
//!   source is retried with backoff by the ingest loop;
//! - the mapping of every [`HiveMessage`] onto catalog changes (SPEC §2,
//!   docs/HIVE.md "What is replicated"): names lower-cased and checked
//!   against stagefs's name rules, partition values put in key order,
//!   file URIs mapped through `--source-map` into [`FileRef`]s with their
//!   checksum, change-management copy, subdirectory and a reference key.
//!   A `COMMIT_TXN` becomes one event holding every file of the
//!   transaction's `TXN_WRITE_NOTIFICATION_LOG` rows.
//!
//! Decoding of the rows themselves (encodings, Thrift-JSON, URIs) is the
//! `message`/`thrift`/`uri` modules'.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::map::SourceMap;
use super::model::{
    FileUri, HiveMessage, HivePartition, HiveTable, NotificationRow, RowSource, RowSourceError,
};
use crate::catalog::{DirKind, Tree};
use crate::event::{
    is_valid_file_name, is_valid_name, is_valid_source_path, BlobId, Change, Event, FileRef, Op,
    StateId, Verify,
};
use crate::source::{DecodeError, Position, Rejection, Source, SourceError, SourceReport};

/// Where the rows come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HiveRows {
    /// `--hive-events PATH`.
    Files(PathBuf),
    /// `--hive-metastore URL` (the password comes from the environment or
    /// the URL's `password_file`, never from here).
    Metastore(String),
}

/// How to follow Hive.
#[derive(Debug, Clone)]
pub struct HiveConfig {
    pub rows: HiveRows,
    pub source_map: SourceMap,
    /// `--hive-poll-ms`.
    pub poll_interval: Duration,
    /// Most rows asked for per poll.
    pub batch: usize,
}

impl HiveConfig {
    pub fn new(rows: HiveRows, source_map: SourceMap) -> HiveConfig {
        HiveConfig {
            rows,
            source_map,
            poll_interval: Duration::from_millis(500),
            batch: 1000,
        }
    }
}

/// Hive's value for a NULL or empty partition value.
pub const DEFAULT_PARTITION: &str = "__HIVE_DEFAULT_PARTITION__";

/// See the module docs.
pub struct HiveSource {
    rows: Box<dyn RowSource>,
    map: SourceMap,
    poll_interval: Duration,
    batch: usize,
    /// The last id read from the row source.
    last_read: i64,
    /// The last id decoded into an event.
    last_decoded: i64,
    newest: Option<i64>,
    error: Option<String>,
    /// A gap or repeat found after good rows: reported at the next poll.
    broken: Option<Rejection>,
}

impl HiveSource {
    /// Opens the row source of `cfg`, to continue after event `after`.
    pub fn open(cfg: &HiveConfig, after: i64) -> Result<HiveSource, RowSourceError> {
        let rows: Box<dyn RowSource> = match &cfg.rows {
            HiveRows::Files(path) => Box::new(super::files::FileRows::open(path)?),
            HiveRows::Metastore(url) => {
                super::metastore::connect(url, std::env::var(super::metastore::PASSWORD_ENV).ok())?
            }
        };
        Ok(HiveSource::new(rows, cfg, after))
    }

    /// Follows `rows` after event `after`.
    pub fn new(rows: Box<dyn RowSource>, cfg: &HiveConfig, after: i64) -> HiveSource {
        HiveSource {
            rows,
            map: cfg.source_map.clone(),
            poll_interval: cfg.poll_interval,
            batch: cfg.batch.max(1),
            last_read: after,
            last_decoded: after,
            newest: None,
            error: None,
            broken: None,
        }
    }
}

fn row_error(e: RowSourceError) -> SourceError {
    match e {
        RowSourceError::Unavailable(_) => SourceError::Transient(e.to_string()),
        RowSourceError::BadRow { location, reason } => SourceError::Fatal(Rejection {
            state_id: None,
            file: Some(location),
            line: None,
            reason,
        }),
        RowSourceError::Fatal(reason) => SourceError::Fatal(Rejection {
            state_id: None,
            file: None,
            line: None,
            reason,
        }),
    }
}

impl Source for HiveSource {
    type Record = NotificationRow;

    fn poll(&mut self, max: usize) -> Result<Vec<NotificationRow>, SourceError> {
        if let Some(r) = &self.broken {
            return Err(SourceError::Fatal(r.clone()));
        }
        let limit = self.batch.min(max.max(1));
        let rows = match self.rows.poll(self.last_read, limit) {
            Ok(rows) => rows,
            Err(e) => {
                self.error = Some(e.to_string());
                return Err(row_error(e));
            }
        };
        self.error = None;
        if let Ok(newest) = self.rows.newest_event_id() {
            self.newest = newest;
        }
        let mut good = Vec::with_capacity(rows.len());
        for row in rows {
            let expected = self.last_read + 1;
            if row.event_id != expected {
                let reason = if row.event_id > expected {
                    format!(
                        "events {expected}..{} are missing from the metastore: re-bootstrap",
                        row.event_id - 1
                    )
                } else {
                    format!(
                        "event {} was read again after event {} (a repeated id: the notification log is corrupt)",
                        row.event_id, self.last_read
                    )
                };
                let state_id = u64::try_from(row.event_id)
                    .ok()
                    .filter(|&i| i > 0)
                    .map(StateId);
                self.broken = Some(Rejection {
                    state_id,
                    file: None,
                    line: None,
                    reason,
                });
                break;
            }
            self.last_read = row.event_id;
            good.push(row);
        }
        match (&self.broken, good.is_empty()) {
            (Some(r), true) => Err(SourceError::Fatal(r.clone())),
            _ => Ok(good),
        }
    }

    fn decode(&mut self, row: &NotificationRow, latest: &Tree) -> Result<Event, DecodeError> {
        let id = StateId(row.event_id as u64);
        let reject = |reason: String| DecodeError::Rejected(Rejection::of_event(id, reason));
        let message = super::message::decode_message(row)
            .map_err(|e| reject(format!("cannot decode the {} message: {e}", row.event_type)))?;
        let mut mapper = Mapper {
            map: &self.map,
            event_id: row.event_id,
            files: 0,
            tree: latest,
        };
        let changes = match &message {
            &HiveMessage::CommitTxn { txn_id } => {
                let writes = match self.rows.txn_writes(txn_id) {
                    Ok(w) => w,
                    Err(RowSourceError::Unavailable(msg)) => {
                        self.error = Some(msg.clone());
                        return Err(DecodeError::Retry(format!(
                            "reading the writes of transaction {txn_id}: {msg}"
                        )));
                    }
                    Err(e) => {
                        return Err(reject(format!(
                            "reading the writes of transaction {txn_id}: {e}"
                        )))
                    }
                };
                let mut changes = Vec::new();
                for w in &writes {
                    let write = super::message::decode_txn_write(w).map_err(|e| {
                        reject(format!(
                            "cannot decode the TXN_WRITE_NOTIFICATION_LOG row of {}.{} (transaction {txn_id}): {e}",
                            w.database, w.table
                        ))
                    })?;
                    let change = mapper
                        .files_change(
                            Op::AddFiles,
                            &write.table,
                            write.partition.as_ref(),
                            &write.files,
                        )
                        .map_err(&reject)?;
                    changes.push(change);
                }
                changes
            }
            other => mapper.changes(other).map_err(&reject)?,
        };
        if row.event_id <= 0 {
            return Err(reject("EVENT_ID must be > 0".into()));
        }
        self.last_decoded = row.event_id;
        Ok(Event {
            id,
            time_ms: row.event_time.map(|s| s.saturating_mul(1000)),
            changes,
        })
    }

    fn position_after(&self, row: &NotificationRow) -> Position {
        Position::Hive {
            hive_event_id: row.event_id,
        }
    }

    fn locate(&self, _row: &NotificationRow) -> (Option<String>, Option<u64>) {
        (None, None)
    }

    fn report(&mut self) -> SourceReport {
        SourceReport {
            kind: "hive".into(),
            location: self.rows.describe(),
            position: Some(self.last_decoded),
            newest: self.newest,
            error: self.error.clone(),
        }
    }

    fn idle_wait(&self) -> Duration {
        self.poll_interval
    }

    fn reread_from(&mut self, at: &Position) -> bool {
        let &Position::Hive { hive_event_id } = at else {
            return false;
        };
        if !self.rows.rewind() {
            return false;
        }
        self.last_read = hive_event_id;
        self.broken = None;
        true
    }
}

/// Maps one message onto changes against the newest accepted tree.
struct Mapper<'a> {
    map: &'a SourceMap,
    event_id: i64,
    /// Files mapped so far in this event (each gets its own key).
    files: usize,
    tree: &'a Tree,
}

/// Hive's db and table names, lower-cased, as stagefs directory names.
fn name(raw: &str, what: &str) -> Result<String, String> {
    let lower = raw.to_ascii_lowercase();
    if is_valid_name(&lower) {
        Ok(lower)
    } else {
        Err(format!(
            "{what} name `{raw}` is not 1-128 characters of [A-Za-z0-9_], which stagefs requires"
        ))
    }
}

impl Mapper<'_> {
    fn changes(&mut self, msg: &HiveMessage) -> Result<Vec<Change>, String> {
        Ok(match msg {
            HiveMessage::CreateDatabase { db } => {
                vec![Change::new(Op::CreateDatabase, &name(db, "database")?, "")]
            }
            HiveMessage::DropDatabase { db } => {
                vec![Change::new(Op::DropDatabase, &name(db, "database")?, "")]
            }
            HiveMessage::CreateTable { table, files } => {
                let (db, t) = (name(&table.db, "database")?, name(&table.name, "table")?);
                let mut create = Change::new(Op::CreateTable, &db, &t);
                create.partition_keys = table
                    .partition_keys
                    .iter()
                    .map(|k| name(k, "partition key"))
                    .collect::<Result<_, _>>()?;
                let mut changes = vec![create];
                if !files.is_empty() {
                    if !table.partition_keys.is_empty() {
                        return Err(format!(
                            "CREATE TABLE AS SELECT into the partitioned table {db}.{t} names files without their partitions"
                        ));
                    }
                    let mut add = Change::new(Op::AddFiles, &db, &t);
                    add.files = self.files(files)?;
                    changes.push(add);
                }
                changes
            }
            HiveMessage::DropTable { db, table } => vec![Change::new(
                Op::DropTable,
                &name(db, "database")?,
                &name(table, "table")?,
            )],
            HiveMessage::AlterTable {
                before,
                after,
                is_truncate,
            } => {
                let from = (name(&before.db, "database")?, name(&before.name, "table")?);
                let to = (name(&after.db, "database")?, name(&after.name, "table")?);
                if from != to {
                    let mut rename = Change::new(Op::RenameTable, &from.0, &from.1);
                    rename.new_db = to.0;
                    rename.new_table = to.1;
                    vec![rename]
                } else if *is_truncate {
                    vec![Change::new(Op::TruncateTable, &from.0, &from.1)]
                } else {
                    Vec::new() // properties, columns, statistics: no data change
                }
            }
            HiveMessage::AddPartition {
                table,
                partitions,
                files,
            } => {
                if files.len() > partitions.len() {
                    return Err(format!(
                        "names files for {} partitions but adds {}",
                        files.len(),
                        partitions.len()
                    ));
                }
                let mut changes = Vec::with_capacity(partitions.len());
                for (i, p) in partitions.iter().enumerate() {
                    let empty = Vec::new();
                    let f = files.get(i).unwrap_or(&empty);
                    changes.push(self.files_change(Op::AddPartition, table, Some(p), f)?);
                }
                changes
            }
            HiveMessage::AlterPartition {
                table,
                before,
                after,
                is_truncate,
            } => {
                if before.values != after.values {
                    let (db, t) = (name(&table.db, "database")?, name(&table.name, "table")?);
                    return Err(format!(
                        "renaming partition ({}) of {db}.{t} to ({}) is not supported",
                        before.values.join(", "),
                        after.values.join(", ")
                    ));
                }
                if *is_truncate {
                    vec![self.files_change(Op::ReplaceFiles, table, Some(after), &[])?]
                } else {
                    Vec::new()
                }
            }
            HiveMessage::DropPartition { table, partitions } => partitions
                .iter()
                .map(|values| {
                    let p = HivePartition {
                        values: values.clone(),
                        location: None,
                    };
                    self.files_change(Op::DropPartition, table, Some(&p), &[])
                })
                .collect::<Result<_, _>>()?,
            HiveMessage::Insert {
                table,
                partition,
                replace,
                files,
            } => {
                let op = if *replace {
                    Op::ReplaceFiles
                } else {
                    Op::AddFiles
                };
                vec![self.files_change(op, table, partition.as_ref(), files)?]
            }
            // Mapped by the caller, which reads the transaction's writes.
            HiveMessage::CommitTxn { .. } => Vec::new(),
            HiveMessage::NoData { .. } => Vec::new(),
        })
    }

    /// A change `op` on `table`'s `partition` naming `files`.
    fn files_change(
        &mut self,
        op: Op,
        table: &HiveTable,
        partition: Option<&HivePartition>,
        files: &[FileUri],
    ) -> Result<Change, String> {
        let (db, t) = (name(&table.db, "database")?, name(&table.name, "table")?);
        let mut change = Change::new(op, &db, &t);
        if let Some(p) = partition {
            change.partition = Some(self.partition_spec(&db, &t, table, p)?);
        }
        change.files = self.files(files)?;
        Ok(change)
    }

    /// `key → raw value` for a partition, keyed by the table's partition
    /// keys: the replica's when it has the table, else the message's.
    fn partition_spec(
        &self,
        db: &str,
        t: &str,
        table: &HiveTable,
        p: &HivePartition,
    ) -> Result<BTreeMap<String, String>, String> {
        let keys: Vec<String> = match self.tree.table(db, t).map(|d| &d.kind) {
            Some(DirKind::Table { partition_keys }) => {
                partition_keys.iter().map(|k| k.to_string()).collect()
            }
            _ => table
                .partition_keys
                .iter()
                .map(|k| name(k, "partition key"))
                .collect::<Result<_, _>>()?,
        };
        if keys.len() != p.values.len() {
            return Err(format!(
                "partition ({}) of {db}.{t} does not match its partition keys ({})",
                p.values.join(", "),
                keys.join(", ")
            ));
        }
        let mut spec = BTreeMap::new();
        for (key, value) in keys.into_iter().zip(&p.values) {
            let value = if value.is_empty() {
                DEFAULT_PARTITION
            } else {
                value.as_str()
            };
            if value.contains('\0') || value.len() > 1024 {
                return Err(format!(
                    "partition value of `{key}` in {db}.{t} must be at most 1024 bytes without NUL"
                ));
            }
            spec.insert(key, value.to_owned());
        }
        Ok(spec)
    }

    fn files(&mut self, uris: &[FileUri]) -> Result<Vec<FileRef>, String> {
        uris.iter().map(|u| self.file(u)).collect()
    }

    /// A file reference for `uri`: its local path and cm copy through
    /// `--source-map`, its checksum, its subdirectory and a key unique to
    /// this place in this event.
    fn file(&mut self, uri: &FileUri) -> Result<FileRef, String> {
        let path = self.map.local(&uri.path)?;
        let file_name = uri
            .path
            .rsplit('/')
            .next()
            .filter(|n| is_valid_file_name(n))
            .ok_or_else(|| format!("file URI `{}` does not end in a file name", uri.path))?;
        let subdir = match uri.subdir.as_deref() {
            None | Some("") => None,
            Some(s) if is_valid_source_path(s) => Some(s.to_owned()),
            Some(s) => {
                return Err(format!(
                    "subdirectory `{s}` of `{}` must be relative, without `..`",
                    uri.path
                ))
            }
        };
        let checksum = uri
            .checksum
            .as_deref()
            .filter(|c| !c.is_empty())
            .map(str::to_ascii_lowercase);
        if let Some(c) = &checksum {
            if !c.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("checksum `{c}` of `{}` is not hex", uri.path));
            }
        }
        let cm_path = match (&checksum, uri.cm_root.as_deref().filter(|c| !c.is_empty())) {
            (Some(c), Some(root)) => Some(
                self.map
                    .local(root)?
                    .join(format!("{file_name}_{c}"))
                    .to_string_lossy()
                    .into_owned(),
            ),
            _ => None,
        };
        let mut h = Sha256::new();
        h.update(b"stagefs hive file\0");
        h.update(self.event_id.to_le_bytes());
        h.update((self.files as u64).to_le_bytes());
        h.update(uri.path.as_bytes());
        self.files += 1;
        Ok(FileRef {
            path: path.to_string_lossy().into_owned(),
            name: file_name.to_owned(),
            subdir,
            verify: match checksum {
                Some(checksum) => Verify::Hdfs { checksum },
                None => Verify::None,
            },
            key: Some(BlobId(h.finalize().into())),
            cm_path,
            uri: Some(uri.path.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Validator;
    use std::sync::Arc;

    fn table(db: &str, name: &str, keys: &[&str]) -> HiveTable {
        HiveTable {
            db: db.into(),
            name: name.into(),
            partition_keys: keys.iter().map(|k| k.to_string()).collect(),
            location: None,
            table_type: Some("MANAGED_TABLE".into()),
            parameters: BTreeMap::new(),
        }
    }

    fn part(values: &[&str]) -> HivePartition {
        HivePartition {
            values: values.iter().map(|v| v.to_string()).collect(),
            location: None,
        }
    }

    fn uri(path: &str, checksum: Option<&str>, subdir: Option<&str>) -> FileUri {
        FileUri {
            path: format!("hdfs://nn/wh/{path}"),
            checksum: checksum.map(Into::into),
            cm_root: checksum.map(|_| "hdfs://nn/cm".into()),
            subdir: subdir.map(Into::into),
        }
    }

    fn map() -> SourceMap {
        SourceMap::parse(&["hdfs://nn/wh=/srv/wh", "hdfs://nn/cm=/srv/cm"]).unwrap()
    }

    /// Applies messages in order as events 1, 2, ...; the tree after them.
    fn apply_all(msgs: &[HiveMessage]) -> Result<Arc<Tree>, String> {
        let map = map();
        let mut v = Validator::new(Arc::new(Tree::empty()));
        for (i, msg) in msgs.iter().enumerate() {
            let mut m = Mapper {
                map: &map,
                event_id: i as i64 + 1,
                files: 0,
                tree: v.latest(),
            };
            let changes = m.changes(msg)?;
            let event = Event {
                id: StateId(i as u64 + 1),
                time_ms: None,
                changes,
            };
            v.check(event, None, None).map_err(|r| r.to_string())?;
        }
        Ok(Arc::clone(v.latest()))
    }

    fn paths(tree: &Tree, db: &str, t: &str) -> Vec<String> {
        tree.table(db, t)
            .map(|t| t.files_below().into_iter().map(|(p, _)| p).collect())
            .unwrap_or_default()
    }

    fn setup() -> Vec<HiveMessage> {
        vec![
            HiveMessage::CreateDatabase { db: "Sales".into() },
            HiveMessage::CreateTable {
                table: table("sales", "Orders", &["ds", "region"]),
                files: vec![],
            },
        ]
    }

    #[test]
    fn names_are_lower_cased_and_values_escaped_into_key_value_directories() {
        let mut msgs = setup();
        msgs.push(HiveMessage::Insert {
            table: table("sales", "orders", &["ds", "region"]),
            partition: Some(part(&["2024/01", ""])),
            replace: false,
            files: vec![uri("sales.db/orders/x/000000_0", None, None)],
        });
        let tree = apply_all(&msgs).unwrap();
        assert_eq!(
            paths(&tree, "sales", "orders"),
            vec!["ds=2024%2F01/region=__HIVE_DEFAULT_PARTITION__/000000_0"]
        );
    }

    #[test]
    fn add_partition_of_several_then_drop_of_several() {
        let mut msgs = setup();
        let t = table("sales", "orders", &["ds", "region"]);
        msgs.push(HiveMessage::AddPartition {
            table: t.clone(),
            partitions: vec![part(&["1", "eu"]), part(&["1", "us"]), part(&["2", "eu"])],
            files: vec![
                vec![uri("o/ds=1/region=eu/a", Some("00"), None)],
                vec![],
                vec![uri("o/ds=2/region=eu/b", None, None)],
            ],
        });
        let tree = apply_all(&msgs).unwrap();
        assert_eq!(
            paths(&tree, "sales", "orders"),
            vec!["ds=1/region=eu/a", "ds=2/region=eu/b"]
        );
        msgs.push(HiveMessage::DropPartition {
            table: t,
            partitions: vec![vec!["1".into(), "eu".into()], vec!["2".into(), "eu".into()]],
        });
        let tree = apply_all(&msgs).unwrap();
        let orders = tree.table("sales", "orders").unwrap();
        assert!(paths(&tree, "sales", "orders").is_empty());
        // ds=1/region=us is still there (empty).
        assert!(orders.child("ds=1").is_some() && orders.child("ds=2").is_none());
    }

    #[test]
    fn insert_overwrite_truncate_partition_and_truncate_table() {
        let mut msgs = setup();
        let t = table("sales", "orders", &["ds", "region"]);
        for (v, f, replace) in [("1", "a", false), ("1", "b", false), ("2", "c", false)] {
            msgs.push(HiveMessage::Insert {
                table: t.clone(),
                partition: Some(part(&[v, "eu"])),
                replace,
                files: vec![uri(&format!("o/{f}"), None, None)],
            });
        }
        msgs.push(HiveMessage::Insert {
            table: t.clone(),
            partition: Some(part(&["1", "eu"])),
            replace: true,
            files: vec![uri("o/d", None, None)],
        });
        let tree = apply_all(&msgs).unwrap();
        assert_eq!(
            paths(&tree, "sales", "orders"),
            vec!["ds=1/region=eu/d", "ds=2/region=eu/c"]
        );
        msgs.push(HiveMessage::AlterPartition {
            table: t.clone(),
            before: part(&["2", "eu"]),
            after: part(&["2", "eu"]),
            is_truncate: true,
        });
        let tree = apply_all(&msgs).unwrap();
        assert_eq!(paths(&tree, "sales", "orders"), vec!["ds=1/region=eu/d"]);
        msgs.push(HiveMessage::AlterTable {
            before: t.clone(),
            after: t,
            is_truncate: true,
        });
        let tree = apply_all(&msgs).unwrap();
        let orders = tree.table("sales", "orders").unwrap();
        assert!(paths(&tree, "sales", "orders").is_empty());
        assert!(orders.child("ds=1").is_some(), "partitions stay");
    }

    #[test]
    fn rename_across_databases_and_ctas_and_drops() {
        let mut msgs = setup();
        msgs.push(HiveMessage::CreateDatabase {
            db: "archive".into(),
        });
        msgs.push(HiveMessage::CreateTable {
            table: table("sales", "summary", &[]),
            files: vec![uri("s/000000_0", Some("ab"), None)],
        });
        msgs.push(HiveMessage::AlterTable {
            before: table("sales", "summary", &[]),
            after: table("archive", "summary_2024", &[]),
            is_truncate: false,
        });
        let tree = apply_all(&msgs).unwrap();
        assert!(tree.table("sales", "summary").is_none());
        assert_eq!(paths(&tree, "archive", "summary_2024"), vec!["000000_0"]);
        msgs.push(HiveMessage::DropTable {
            db: "archive".into(),
            table: "summary_2024".into(),
        });
        msgs.push(HiveMessage::DropDatabase {
            db: "archive".into(),
        });
        let tree = apply_all(&msgs).unwrap();
        assert!(tree.database("archive").is_none());
    }

    #[test]
    fn files_carry_mapped_paths_checksums_cm_copies_and_subdirectories() {
        let map = map();
        let tree = Tree::empty();
        let mut m = Mapper {
            map: &map,
            event_id: 9,
            files: 0,
            tree: &tree,
        };
        let f = m
            .file(&uri(
                "t/delta_1_1/bucket_0",
                Some("ABCD"),
                Some("delta_1_1"),
            ))
            .unwrap();
        assert_eq!(f.path, "/srv/wh/t/delta_1_1/bucket_0");
        assert_eq!(f.name, "bucket_0");
        assert_eq!(f.subdir.as_deref(), Some("delta_1_1"));
        assert_eq!(
            f.verify,
            Verify::Hdfs {
                checksum: "abcd".into()
            }
        );
        assert_eq!(f.cm_path.as_deref(), Some("/srv/cm/bucket_0_abcd"));
        let g = m.file(&uri("t/delta_1_1/bucket_0", None, None)).unwrap();
        assert_eq!(g.verify, Verify::None);
        assert_ne!(f.key, g.key, "every reference has its own key");
    }

    #[test]
    fn names_stagefs_cannot_show_and_unmapped_uris_are_rejected_with_a_reason() {
        let err = apply_all(&[HiveMessage::CreateDatabase {
            db: "sales-eu".into(),
        }])
        .unwrap_err();
        assert!(err.contains("database name `sales-eu`"), "{err}");
        let mut msgs = setup();
        msgs.push(HiveMessage::Insert {
            table: table("sales", "orders", &["ds", "region"]),
            partition: Some(part(&["1", "eu"])),
            replace: false,
            files: vec![FileUri {
                path: "s3a://elsewhere/x".into(),
                checksum: None,
                cm_root: None,
                subdir: None,
            }],
        });
        let err = apply_all(&msgs).unwrap_err();
        assert!(
            err.contains("no --source-map covers `s3a://elsewhere/x`"),
            "{err}"
        );
        let mut msgs = setup();
        msgs.push(HiveMessage::Insert {
            table: table("sales", "orders", &["ds", "region"]),
            partition: Some(part(&["1"])),
            replace: false,
            files: vec![],
        });
        let err = apply_all(&msgs).unwrap_err();
        assert!(err.contains("does not match its partition keys"), "{err}");
    }

    /// Rows that fail as unavailable `failures` times, then come.
    struct Flaky {
        rows: Vec<NotificationRow>,
        failures: u32,
    }

    impl RowSource for Flaky {
        fn poll(
            &mut self,
            after: i64,
            limit: usize,
        ) -> Result<Vec<NotificationRow>, RowSourceError> {
            if self.failures > 0 {
                self.failures -= 1;
                return Err(RowSourceError::Unavailable("connection refused".into()));
            }
            Ok(self
                .rows
                .iter()
                .filter(|r| r.event_id > after)
                .take(limit)
                .cloned()
                .collect())
        }
        fn txn_writes(
            &mut self,
            _: i64,
        ) -> Result<Vec<super::super::model::TxnWriteRow>, RowSourceError> {
            Ok(Vec::new())
        }
        fn newest_event_id(&mut self) -> Result<Option<i64>, RowSourceError> {
            Ok(self.rows.last().map(|r| r.event_id))
        }
        fn describe(&self) -> String {
            "flaky".into()
        }
    }

    fn row(id: i64) -> NotificationRow {
        NotificationRow {
            nl_id: Some(id),
            event_id: id,
            event_time: Some(1),
            event_type: "OPEN_TXN".into(),
            cat_name: None,
            db_name: None,
            tbl_name: None,
            message: Some("{}".into()),
            message_format: Some("json-0.2".into()),
        }
    }

    #[test]
    fn an_unavailable_source_is_transient_and_reading_resumes_where_it_was() {
        let rows = Flaky {
            rows: (1..=5).map(row).collect(),
            failures: 2,
        };
        let cfg = HiveConfig::new(HiveRows::Files("x".into()), map());
        let mut src = HiveSource::new(Box::new(rows), &cfg, 2);
        for _ in 0..2 {
            assert!(matches!(src.poll(100), Err(SourceError::Transient(_))));
            assert!(src.report().error.unwrap().contains("connection refused"));
        }
        let got = src.poll(100).unwrap();
        assert_eq!(
            got.iter().map(|r| r.event_id).collect::<Vec<_>>(),
            vec![3, 4, 5]
        );
        let report = src.report();
        assert_eq!((report.error, report.newest), (None, Some(5)));
        let e = src.decode(&got[0], &Tree::empty()).unwrap();
        assert_eq!(
            (e.id, e.time_ms, e.changes.len()),
            (StateId(3), Some(1000), 0)
        );
    }
}
