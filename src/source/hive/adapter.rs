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
//!   transaction's `TXN_WRITE_NOTIFICATION_LOG` rows (none on a metastore
//!   without that table, Hive before 3.2). Tables whose data the log does
//!   not carry (external tables; transactional ones on such a metastore)
//!   carry a `not_in_log` mark in the catalog, which status lists.
//!
//! Decoding of the rows themselves (encodings, Thrift-JSON, URIs) is the
//! `message`/`thrift`/`uri` modules'.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::ahead::{DecodeAhead, Decoded};
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
    /// Most rows asked for per poll (also the most decoded ahead).
    pub batch: usize,
    /// Threads decoding messages ahead of the ingest thread (`ahead`);
    /// 0 decodes on the ingest thread.
    pub decode_threads: usize,
}

impl HiveConfig {
    pub fn new(rows: HiveRows, source_map: SourceMap) -> HiveConfig {
        HiveConfig {
            rows,
            source_map,
            poll_interval: Duration::from_millis(500),
            batch: 1000,
            decode_threads: super::ahead::default_threads(),
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
    /// The missing ids `(from, to)` when `broken` is a gap.
    gap: Option<(i64, i64)>,
    /// Whether the source keeps `TXN_WRITE_NOTIFICATION_LOG`, once asked.
    txn_log: Option<bool>,
    /// Decodes the polled rows' messages on other threads.
    ahead: DecodeAhead,
    /// The batch after the one the last poll returned, read (and handed to
    /// the decoding threads) at that poll: the next poll returns it.
    next: Option<Batch>,
}

/// Rows read from the row source and checked, not returned by a poll yet.
struct Batch {
    /// `last_read` before these rows.
    after: i64,
    /// The poll's limit they were read for.
    limit: usize,
    /// Rows with consecutive ids after `after`.
    rows: Vec<NotificationRow>,
    /// A gap or repeated id right after `rows` (and the missing ids of a gap).
    broken: Option<(Rejection, Option<(i64, i64)>)>,
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
        // The next batch is read while this one is decoded and journaled.
        let rows = match super::rows_ahead::RowsAhead::spawn(rows) {
            Ok(ahead) => Box::new(ahead),
            Err(rows) => rows,
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
            gap: None,
            txn_log: None,
            ahead: DecodeAhead::new(cfg.decode_threads, &cfg.source_map),
            next: None,
        }
    }

    /// Reads the rows after `last_read`, checks their ids (stopping at a
    /// gap or a repeat) and starts decoding them.
    fn read_batch(&mut self, limit: usize) -> Result<Batch, SourceError> {
        let after = self.last_read;
        let rows = match self.rows.poll(after, limit) {
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
        let mut broken = None;
        for row in rows {
            let expected = self.last_read + 1;
            if row.event_id != expected {
                let mut gap = None;
                let reason = if row.event_id > expected {
                    gap = Some((expected, row.event_id - 1));
                    format!(
                        "events {expected}..{} are missing from the metastore: re-bootstrap \
                         (restart with --bootstrap, or stop the daemon and run `stagefs bootstrap` \
                         with the same flags)",
                        row.event_id - 1
                    )
                } else {
                    format!(
                        "event {} was read again after event {} (a repeated id: the notification log is corrupt)",
                        row.event_id, self.last_read
                    )
                };
                let rejection = Rejection {
                    state_id: state_id_of(row.event_id),
                    file: None,
                    line: None,
                    reason,
                };
                broken = Some((rejection, gap));
                break;
            }
            self.last_read = row.event_id;
            good.push(row);
        }
        self.ahead.submit(&good);
        Ok(Batch {
            after,
            limit,
            rows: good,
            broken,
        })
    }

    /// Forgets the batch read ahead (and what was decoded of it): the next
    /// poll reads from the row source again.
    fn forget_next(&mut self) {
        if let Some(next) = self.next.take() {
            self.last_read = next.after;
            self.ahead.discard();
        }
    }

    /// The missing ids `(from, to)` once the source stopped at a gap
    /// (the notification log's cleaner purged events not read yet).
    pub fn gap(&self) -> Option<(i64, i64)> {
        self.gap
    }

    /// Whether the source keeps `TXN_WRITE_NOTIFICATION_LOG` (asked once).
    fn txn_log(&mut self) -> Result<bool, DecodeError> {
        if let Some(known) = self.txn_log {
            return Ok(known);
        }
        match self.rows.records_txn_writes() {
            Ok(known) => {
                if !known {
                    tracing::warn!(
                        "the metastore has no TXN_WRITE_NOTIFICATION_LOG (Hive before 3.2 / 4.0): \
                         transactional tables are not replicated"
                    );
                }
                self.txn_log = Some(known);
                Ok(known)
            }
            Err(RowSourceError::Unavailable(msg)) => {
                self.error = Some(msg.clone());
                Err(DecodeError::Retry(format!(
                    "asking whether the metastore has TXN_WRITE_NOTIFICATION_LOG: {msg}"
                )))
            }
            Err(e) => Err(DecodeError::Rejected(Rejection {
                state_id: None,
                file: None,
                line: None,
                reason: format!("asking whether the metastore has TXN_WRITE_NOTIFICATION_LOG: {e}"),
            })),
        }
    }
}

/// The state of Hive event `event_id`, when it is a valid one (> 0).
fn state_id_of(event_id: i64) -> Option<StateId> {
    u64::try_from(event_id).ok().filter(|&i| i > 0).map(StateId)
}

fn row_error(e: RowSourceError) -> SourceError {
    match e {
        RowSourceError::Unavailable(_) => SourceError::Transient(e.to_string()),
        RowSourceError::BadRow {
            location,
            reason,
            event_id,
        } => SourceError::Fatal(Rejection {
            state_id: event_id.and_then(state_id_of),
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
        if self.next.as_ref().is_some_and(|b| b.limit != limit) {
            self.forget_next();
        }
        let batch = match self.next.take() {
            Some(batch) => batch,
            None => self.read_batch(limit)?,
        };
        if let Some((rejection, gap)) = batch.broken {
            // Reported now when nothing good came before it, else at the
            // next poll, after the good rows are journaled.
            self.broken = Some(rejection);
            self.gap = gap;
        }
        if batch.rows.is_empty() {
            return match &self.broken {
                Some(r) => Err(SourceError::Fatal(r.clone())),
                None => Ok(Vec::new()),
            };
        }
        // A full batch: the next one is read now and decoded while this one
        // is validated and journaled. A failure to read it is not reported
        // here: the next poll reads again and reports what it gets.
        if self.broken.is_none() && batch.rows.len() >= limit {
            match self.read_batch(limit) {
                Ok(next) if !next.rows.is_empty() || next.broken.is_some() => {
                    self.next = Some(next)
                }
                // Nothing more yet: the next poll asks the source afresh.
                _ => {}
            }
        }
        Ok(batch.rows)
    }

    fn decode(&mut self, row: &NotificationRow, latest: &Tree) -> Result<Event, DecodeError> {
        let id = StateId(row.event_id as u64);
        let reject = |reason: String| DecodeError::Rejected(Rejection::of_event(id, reason));
        let Decoded { message, files } = self
            .ahead
            .take(row)
            .map_err(|e| reject(format!("cannot decode the {} message: {e}", row.event_type)))?;
        let txn_log = match &message {
            HiveMessage::CreateTable { .. }
            | HiveMessage::AlterTable { .. }
            | HiveMessage::CommitTxn { .. } => self.txn_log()?,
            _ => true,
        };
        let mut mapper = Mapper {
            map: &self.map,
            event_id: row.event_id,
            files: 0,
            tree: latest,
            txn_log,
            premapped: files,
        };
        let changes = match &message {
            // Hive before 3.2 records the files of transactional writes
            // nowhere: those tables are marked not in the log (at create),
            // and a commit changes nothing that the log shows.
            HiveMessage::CommitTxn { .. } if !txn_log => Vec::new(),
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

    fn more_ready(&self) -> bool {
        self.next.as_ref().is_some_and(|b| !b.rows.is_empty())
    }

    fn reread_from(&mut self, at: &Position) -> bool {
        let &Position::Hive { hive_event_id } = at else {
            return false;
        };
        if !self.rows.rewind() {
            return false;
        }
        self.next = None;
        self.last_read = hive_event_id;
        self.broken = None;
        self.ahead.discard();
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
    /// Whether the source keeps `TXN_WRITE_NOTIFICATION_LOG`.
    txn_log: bool,
    /// An INSERT's files mapped already by a decoding thread
    /// ([`premap_files`]): taken by the first [`Mapper::files`] call when it
    /// maps the same number of files from the event's first.
    premapped: Option<Vec<Result<FileRef, String>>>,
}

/// Why the log does not carry `table`'s data, or None:
/// - external tables (`tableType` EXTERNAL_TABLE, or the table parameter
///   `EXTERNAL`=TRUE): Hive's events name none of their files;
/// - transactional tables (parameter `transactional`=true) when the source
///   has no `TXN_WRITE_NOTIFICATION_LOG` (`txn_log` false, Hive before
///   3.2 / 4.0): the files their transactions write are in no log.
fn not_in_log(table: &HiveTable, txn_log: bool) -> Option<String> {
    let param = |key: &str| {
        table
            .parameters
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case(key) && v.trim().eq_ignore_ascii_case("true"))
    };
    let external = table
        .table_type
        .as_deref()
        .is_some_and(|t| t.eq_ignore_ascii_case("EXTERNAL_TABLE"))
        || param("EXTERNAL");
    if external {
        return Some(
            "external table: Hive's events do not name its files; the mount shows only the files an event names"
                .to_owned(),
        );
    }
    (!txn_log && param("transactional")).then(|| {
        "transactional table on a metastore without TXN_WRITE_NOTIFICATION_LOG (Hive before 3.2 / 4.0): \
         the files its transactions write are in no log; the mount shows only the files an event names"
            .to_owned()
    })
}

/// The files of a CREATE TABLE AS SELECT into a partitioned table, grouped
/// by partition (in the order they first appear): each file lies below the
/// table's location at `k1=v1/…/kN=vN/[subdir/]name`.
fn ctas_partitions(
    table: &HiveTable,
    files: &[FileUri],
) -> Result<Vec<(HivePartition, Vec<FileUri>)>, String> {
    let shown = format!("{}.{}", table.db, table.name);
    let location = table
        .location
        .as_deref()
        .map(|l| l.trim_end_matches('/'))
        .filter(|l| !l.is_empty())
        .ok_or_else(|| {
            format!("CREATE TABLE AS SELECT into the partitioned table {shown}: the table has no location to find the files' partitions by")
        })?;
    let keys = table.partition_keys.len();
    let mut out: Vec<(HivePartition, Vec<FileUri>)> = Vec::new();
    for f in files {
        let below = f
            .path
            .strip_prefix(location)
            .and_then(|rest| rest.strip_prefix('/'))
            .map(|rest| rest.split('/').collect::<Vec<_>>())
            .filter(|parts| parts.len() > keys)
            .ok_or_else(|| {
                format!(
                    "CREATE TABLE AS SELECT into the partitioned table {shown}: `{}` is not in a partition directory below the table's location {location}",
                    f.path
                )
            })?;
        let partition_name = below[..keys].join("/");
        let values =
            super::uri::partition_values_in_key_order(&partition_name, &table.partition_keys)
                .map_err(|e| {
                    format!(
                        "CREATE TABLE AS SELECT into the partitioned table {shown}: `{}`: {e}",
                        f.path
                    )
                })?;
        match out.iter_mut().find(|(p, _)| p.values == values) {
            Some((_, group)) => group.push(f.clone()),
            None => out.push((
                HivePartition {
                    values,
                    location: Some(format!("{location}/{partition_name}")),
                },
                vec![f.clone()],
            )),
        }
    }
    Ok(out)
}

/// Hive's db and table names, lower-cased, as stagefs directory names.
pub(crate) fn name(raw: &str, what: &str) -> Result<String, String> {
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
                create.not_in_log = not_in_log(table, self.txn_log);
                let mut changes = vec![create];
                if files.is_empty() {
                    return Ok(changes);
                }
                if table.partition_keys.is_empty() {
                    let mut add = Change::new(Op::AddFiles, &db, &t);
                    add.files = self.files(files, files_dir(table, None))?;
                    changes.push(add);
                } else {
                    // CTAS into a partitioned table: each file's partition
                    // is the `key=value` part of its path below the table.
                    for (p, files) in ctas_partitions(table, files)? {
                        changes.push(self.files_change(
                            Op::AddPartition,
                            table,
                            Some(&p),
                            &files,
                        )?);
                    }
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
                let mut changes = Vec::new();
                if from != to {
                    let mut rename = Change::new(Op::RenameTable, &from.0, &from.1);
                    rename.new_db = to.0.clone();
                    rename.new_table = to.1.clone();
                    changes.push(rename);
                }
                if *is_truncate {
                    changes.push(Change::new(Op::TruncateTable, &to.0, &to.1));
                }
                // Made external or managed (`EXTERNAL`, `tableType`): the
                // mark follows. Properties, columns, statistics: no change.
                let mark = not_in_log(after, self.txn_log);
                if let Some(DirKind::Table { not_in_log, .. }) =
                    self.tree.table(&from.0, &from.1).map(|d| &d.kind)
                {
                    if mark.as_deref() != not_in_log.as_deref() {
                        let mut change = Change::new(Op::MarkTable, &to.0, &to.1);
                        change.not_in_log = mark;
                        changes.push(change);
                    }
                }
                changes
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
                let mut changes = Vec::new();
                if before.values != after.values {
                    // A rename: Hive moves the partition's directory, files
                    // and all, to the new values' place.
                    let mut rename =
                        self.files_change(Op::RenamePartition, table, Some(before), &[])?;
                    let (db, t) = (rename.db.clone(), rename.table.clone());
                    rename.new_partition = Some(self.partition_spec(&db, &t, table, after)?);
                    changes.push(rename);
                }
                if *is_truncate {
                    changes.push(self.files_change(Op::ReplaceFiles, table, Some(after), &[])?);
                }
                changes
            }
            HiveMessage::DropPartition { table, partitions } => {
                self.each_partition(Op::DropPartition, table, partitions)?
            }
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
            HiveMessage::TruncatePartitions { table, partitions } => {
                // Each partition's files become none.
                self.each_partition(Op::ReplaceFiles, table, partitions)?
            }
            HiveMessage::NoData { .. } => Vec::new(),
        })
    }

    /// A change `op` without files on each of `table`'s partitions
    /// (values in key order).
    fn each_partition(
        &mut self,
        op: Op,
        table: &HiveTable,
        partitions: &[Vec<String>],
    ) -> Result<Vec<Change>, String> {
        partitions
            .iter()
            .map(|values| {
                let p = HivePartition {
                    values: values.clone(),
                    location: None,
                };
                self.files_change(op, table, Some(&p), &[])
            })
            .collect()
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
        change.files = self.files(files, files_dir(table, partition))?;
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
            Some(DirKind::Table { partition_keys, .. }) => {
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

    /// The event's next files, in the directory `dir` (see [`map_file`]).
    fn files(&mut self, uris: &[FileUri], dir: Option<&str>) -> Result<Vec<FileRef>, String> {
        if let Some(pre) = self.premapped.take() {
            if self.files == 0 && pre.len() == uris.len() {
                self.files = pre.len();
                return pre.into_iter().collect();
            }
        }
        uris.iter()
            .map(|uri| {
                let f = map_file(self.map, self.event_id, self.files, uri, dir);
                self.files += 1;
                f
            })
            .collect()
    }
}

/// Where Hive keeps the files of `table`'s `partition` (the table's own
/// location when unpartitioned), when the message says.
fn files_dir<'a>(table: &'a HiveTable, partition: Option<&'a HivePartition>) -> Option<&'a str> {
    match partition {
        Some(p) => p.location.as_deref(),
        None => table.location.as_deref(),
    }
}

/// A URI split into its scheme and host (lower-cased, the port left out,
/// so `hdfs://nn` and `hdfs://NN:8020` are one file system) and its path
/// (`hdfs://nn:8020/a/b` → `("hdfs://nn", "/a/b")`); a bare path has no
/// file system.
fn split_uri(uri: &str) -> (Option<String>, &str) {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return (None, uri);
    };
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let host = authority.rsplit('@').next().unwrap_or(authority);
    let host = host.split(':').next().unwrap_or(host);
    (
        Some(format!("{scheme}://{host}").to_ascii_lowercase()),
        path,
    )
}

/// The directories between `dir` and the file at `path` (`a/b` for
/// `dir/a/b/name`); None when the file is directly in `dir`, not below it
/// (another file system, another directory, `dir` the root), or the
/// directories between are not a plain relative path.
fn subdir_below(dir: &str, path: &str) -> Option<String> {
    let (dir_fs, dir) = split_uri(dir);
    let (file_fs, file) = split_uri(path);
    if dir_fs.is_some() && file_fs.is_some() && dir_fs != file_fs {
        return None;
    }
    let dir = dir.trim_end_matches('/');
    if dir.is_empty() {
        return None;
    }
    let rest = file.strip_prefix(dir)?.strip_prefix('/')?;
    let (subdir, _name) = rest.rsplit_once('/')?;
    is_valid_source_path(subdir).then(|| subdir.to_owned())
}

/// What [`Mapper::files`] gives for an INSERT's files, computed without the
/// tree (on a decoding thread): each file mapped as the event's file 0, 1,
/// ... in order. None for other messages, whose files are mapped on the
/// ingest thread.
pub(crate) fn premap_files(
    map: &SourceMap,
    event_id: i64,
    message: &HiveMessage,
) -> Option<Vec<Result<FileRef, String>>> {
    let HiveMessage::Insert {
        table,
        partition,
        files,
        ..
    } = message
    else {
        return None;
    };
    let dir = files_dir(table, partition.as_ref());
    Some(
        files
            .iter()
            .enumerate()
            .map(|(i, uri)| map_file(map, event_id, i, uri, dir))
            .collect(),
    )
}

/// A file reference for `uri`, file number `index` of event `event_id`:
/// its local path and cm copy through `--source-map`, its checksum, its
/// subdirectory and a key unique to this place in this event. A pure
/// function of its arguments (no tree), so decoding threads can run it.
///
/// The subdirectory is the URI's own (`#subdir`, what Hive encodes for
/// ACID files) or else where the file lies below `dir`, the location of
/// its partition or table: the `HIVE_UNION_SUBDIR_n` directories of an
/// INSERT … UNION ALL on Tez are named only by the files' paths.
fn map_file(
    map: &SourceMap,
    event_id: i64,
    index: usize,
    uri: &FileUri,
    dir: Option<&str>,
) -> Result<FileRef, String> {
    let (source_dir, rest) = map.resolve(&uri.path)?;
    let path = source_dir.join(rest);
    let file_name = uri
        .path
        .rsplit('/')
        .next()
        .filter(|n| is_valid_file_name(n))
        .ok_or_else(|| format!("file URI `{}` does not end in a file name", uri.path))?;
    let below = match uri.subdir.as_deref() {
        None | Some("") => dir.and_then(|d| subdir_below(d, &uri.path)),
        Some(s) => Some(s.to_owned()),
    };
    let subdir = match below.as_deref() {
        None => None,
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
    let (cm_path, cm_dir) = match (&checksum, uri.cm_root.as_deref().filter(|c| !c.is_empty())) {
        (Some(c), Some(root)) => {
            let (dir, rest) = map.resolve(root)?;
            let cm = dir.join(rest).join(super::uri::cm_file_name(file_name, c));
            (
                Some(cm.to_string_lossy().into_owned()),
                Some(dir.to_string_lossy().into_owned()),
            )
        }
        _ => (None, None),
    };
    let mut h = Sha256::new();
    h.update(b"stagefs hive file\0");
    h.update(event_id.to_le_bytes());
    h.update((index as u64).to_le_bytes());
    h.update(uri.path.as_bytes());
    Ok(FileRef {
        path: path.to_string_lossy().into_owned(),
        name: file_name.to_owned(),
        subdir,
        verify: match checksum {
            Some(checksum) => Verify::Hdfs { checksum },
            None => Verify::None,
        },
        key: Some(BlobId(h.finalize().into())),
        source_dir: Some(source_dir.to_string_lossy().into_owned()),
        cm_path,
        cm_dir,
        uri: Some(uri.path.clone()),
    })
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
        apply_all_with(msgs, true)
    }

    /// [`apply_all`] from a source that has (or lacks) TXN_WRITE_NOTIFICATION_LOG.
    fn apply_all_with(msgs: &[HiveMessage], txn_log: bool) -> Result<Arc<Tree>, String> {
        let map = map();
        let mut v = Validator::new(Arc::new(Tree::empty()));
        for (i, msg) in msgs.iter().enumerate() {
            let mut m = Mapper {
                map: &map,
                event_id: i as i64 + 1,
                files: 0,
                tree: v.latest(),
                txn_log,
                premapped: None,
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

    fn with_params(mut t: HiveTable, table_type: &str, params: &[(&str, &str)]) -> HiveTable {
        t.table_type = Some(table_type.into());
        t.parameters = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        t
    }

    #[test]
    fn external_tables_are_marked_not_in_log_and_the_mark_follows_alter_table() {
        let mut msgs = setup();
        let ext = with_params(table("sales", "raw", &[]), "EXTERNAL_TABLE", &[]);
        msgs.push(HiveMessage::CreateTable {
            table: ext.clone(),
            files: vec![],
        });
        // The parameter alone is enough (a table made external by ALTER).
        let by_param = with_params(
            table("sales", "logs", &[]),
            "MANAGED_TABLE",
            &[("external", "TRUE")],
        );
        msgs.push(HiveMessage::CreateTable {
            table: by_param,
            files: vec![],
        });
        let tree = apply_all(&msgs).unwrap();
        let marked: Vec<String> = tree.not_in_log().into_iter().map(|(t, _)| t).collect();
        assert_eq!(marked, vec!["sales.logs", "sales.raw"]);
        assert!(tree.not_in_log()[0].1.starts_with("external table"));
        // Renamed, it stays marked; made managed, the mark goes.
        let renamed = with_params(table("sales", "raw_2024", &[]), "EXTERNAL_TABLE", &[]);
        msgs.push(HiveMessage::AlterTable {
            before: ext,
            after: renamed.clone(),
            is_truncate: false,
        });
        let managed = with_params(renamed.clone(), "MANAGED_TABLE", &[]);
        let tree = apply_all(&msgs).unwrap();
        assert_eq!(tree.not_in_log()[1].0, "sales.raw_2024");
        msgs.push(HiveMessage::AlterTable {
            before: renamed,
            after: managed.clone(),
            is_truncate: false,
        });
        let tree = apply_all(&msgs).unwrap();
        assert_eq!(tree.not_in_log().len(), 1);
        // A managed table altered without a change of kind gets no mark.
        msgs.push(HiveMessage::AlterTable {
            before: managed.clone(),
            after: managed,
            is_truncate: false,
        });
        assert_eq!(apply_all(&msgs).unwrap().not_in_log().len(), 1);
    }

    #[test]
    fn without_txn_write_log_transactional_tables_are_marked_and_commits_change_nothing() {
        let mut msgs = setup();
        let acid = with_params(
            table("sales", "acid", &["ds"]),
            "MANAGED_TABLE",
            &[("transactional", "true")],
        );
        msgs.push(HiveMessage::CreateTable {
            table: acid.clone(),
            files: vec![],
        });
        let old = apply_all_with(&msgs, false).unwrap();
        let marked = old.not_in_log();
        assert_eq!(marked.len(), 1, "{marked:?}");
        assert_eq!(marked[0].0, "sales.acid");
        assert!(
            marked[0].1.contains("TXN_WRITE_NOTIFICATION_LOG"),
            "{}",
            marked[0].1
        );
        // With the log (Hive 3.2 / 4.0), a transactional table is replicated.
        assert!(apply_all_with(&msgs, true).unwrap().not_in_log().is_empty());

        let cfg = HiveConfig::new(HiveRows::Files("x".into()), map());
        let rows = Flaky {
            rows: vec![NotificationRow {
                event_type: "COMMIT_TXN".into(),
                message: Some(r#"{"txnid": 7, "timestamp": 1}"#.into()),
                ..row(1)
            }],
            failures: 0,
            txn_log: false,
        };
        let mut src = HiveSource::new(Box::new(rows), &cfg, 0);
        let got = src.poll(10).unwrap();
        let e = src.decode(&got[0], &old).unwrap();
        assert_eq!((e.id, e.changes.len()), (StateId(1), 0));
    }

    #[test]
    fn partition_rename_moves_the_partition_with_its_files() {
        let mut msgs = setup();
        let t = table("sales", "orders", &["ds", "region"]);
        msgs.push(HiveMessage::AddPartition {
            table: t.clone(),
            partitions: vec![part(&["1", "eu"]), part(&["1", "us"])],
            files: vec![
                vec![uri("o/ds=1/region=eu/a", Some("00"), Some("delta_1_1"))],
                vec![uri("o/ds=1/region=us/b", None, None)],
            ],
        });
        msgs.push(HiveMessage::AlterPartition {
            table: t.clone(),
            before: part(&["1", "eu"]),
            after: part(&["2024/01", "eu"]),
            is_truncate: false,
        });
        let tree = apply_all(&msgs).unwrap();
        assert_eq!(
            paths(&tree, "sales", "orders"),
            vec!["ds=1/region=us/b", "ds=2024%2F01/region=eu/delta_1_1/a"]
        );
        // Onto an existing partition, or from a missing one: rejected.
        for (from, to) in [
            (&["1", "us"], &["2024/01", "eu"]),
            (&["9", "eu"], &["8", "eu"]),
        ] {
            let mut bad = msgs.clone();
            bad.push(HiveMessage::AlterPartition {
                table: t.clone(),
                before: part(from),
                after: part(to),
                is_truncate: false,
            });
            let err = apply_all(&bad).unwrap_err();
            assert!(
                err.contains("already exists") || err.contains("does not exist"),
                "{err}"
            );
        }
        // The last partition below `ds=1` moved away: `ds=1` goes too.
        msgs.push(HiveMessage::AlterPartition {
            table: t,
            before: part(&["1", "us"]),
            after: part(&["3", "us"]),
            is_truncate: false,
        });
        let tree = apply_all(&msgs).unwrap();
        assert!(tree
            .table("sales", "orders")
            .unwrap()
            .child("ds=1")
            .is_none());
        assert_eq!(paths(&tree, "sales", "orders").len(), 2);
    }

    #[test]
    fn ctas_into_a_partitioned_table_adds_each_file_to_the_partition_its_path_names() {
        let mut msgs = setup();
        let mut t = table("sales", "summary", &["ds", "region"]);
        t.location = Some("hdfs://nn/wh/sales.db/summary".into());
        msgs.push(HiveMessage::CreateTable {
            table: t.clone(),
            files: vec![
                uri("sales.db/summary/ds=1/region=eu/000000_0", Some("ab"), None),
                uri(
                    "sales.db/summary/ds=2024%2F01/region=us/delta_1_1/000000_0",
                    None,
                    Some("delta_1_1"),
                ),
                uri("sales.db/summary/ds=1/region=eu/000001_0", None, None),
            ],
        });
        let tree = apply_all(&msgs).unwrap();
        assert_eq!(
            paths(&tree, "sales", "summary"),
            vec![
                "ds=1/region=eu/000000_0",
                "ds=1/region=eu/000001_0",
                "ds=2024%2F01/region=us/delta_1_1/000000_0"
            ]
        );
        // A file outside the table's partition directories is bad input.
        let mut bad = setup();
        bad.push(HiveMessage::CreateTable {
            table: t,
            files: vec![uri("sales.db/summary/000000_0", None, None)],
        });
        let err = apply_all(&bad).unwrap_err();
        assert!(err.contains("is not in a partition directory"), "{err}");
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
            txn_log: true,
            premapped: None,
        };
        let mut file = |u: FileUri| m.files(&[u], None).unwrap().remove(0);
        let f = file(uri("t/delta_1_1/bucket_0", Some("ABCD"), Some("delta_1_1")));
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
        assert_eq!(f.source_dir.as_deref(), Some("/srv/wh"));
        assert_eq!(f.cm_dir.as_deref(), Some("/srv/cm"));
        let g = file(uri("t/delta_1_1/bucket_0", None, None));
        assert_eq!(g.verify, Verify::None);
        assert_ne!(f.key, g.key, "every reference has its own key");
    }

    fn json_row(event_type: &str, message: &serde_json::Value) -> NotificationRow {
        super::super::message::tests::row(event_type, &message.to_string())
    }

    #[test]
    fn alter_partitions_with_truncate_empties_each_partition() {
        // Hive 4.x's batched TRUNCATE of a partitioned table: one ALTER_PARTITIONS
        // event (JSONAlterPartitionsMessage), the objects of sample 06.
        let sample = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/hive-samples/06_alter_partition.json"
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(sample).unwrap()).unwrap();
        let t = table("tmp_db", "notification_test", &["day"]);
        let setup = |days: &[&str]| {
            let mut msgs = vec![
                HiveMessage::CreateDatabase {
                    db: "tmp_db".into(),
                },
                HiveMessage::CreateTable {
                    table: t.clone(),
                    files: vec![],
                },
            ];
            for day in days {
                msgs.push(HiveMessage::AddPartition {
                    table: t.clone(),
                    partitions: vec![part(&[day])],
                    files: vec![vec![uri(
                        &format!("tmp_db.db/notification_test/day={day}/000000_0"),
                        None,
                        None,
                    )]],
                });
            }
            msgs
        };
        let with_table = serde_json::json!({
            "server": v["server"], "servicePrincipal": v["servicePrincipal"],
            "db": "tmp_db", "table": "notification_test", "tableType": "MANAGED_TABLE",
            "tableObjJson": v["tableObjJson"], "isTruncateOp": "true",
            "timestamp": 1616071558, "writeId": 0,
            "partitions": [{"day": "2021-03-18"}],
            "partitionListJson": [v["partitionObjAfterJson"]],
        });
        let mut msgs = setup(&["2021-03-18", "2021-03-19"]);
        msgs.push(
            super::super::message::decode_message(&json_row("ALTER_PARTITIONS", &with_table))
                .unwrap(),
        );
        let tree = apply_all(&msgs).unwrap();
        assert_eq!(
            paths(&tree, "tmp_db", "notification_test"),
            vec!["day=2021-03-19/000000_0"]
        );
        // The form without a table object: keys and value lists.
        let without = serde_json::json!({
            "db": "tmp_db", "table": "notification_test", "tableType": "MANAGED_TABLE",
            "isTruncateOp": "true", "partitionKeys": ["day"],
            "partitionValues": [["2021-03-18"], ["2021-03-19"]],
        });
        let mut msgs = setup(&["2021-03-18", "2021-03-19"]);
        msgs.push(
            super::super::message::decode_message(&json_row("ALTER_PARTITIONS", &without)).unwrap(),
        );
        assert!(paths(&apply_all(&msgs).unwrap(), "tmp_db", "notification_test").is_empty());
        // Not a truncation (statistics, properties): no data change.
        let mut stats = with_table.clone();
        stats["isTruncateOp"] = "false".into();
        assert!(matches!(
            super::super::message::decode_message(&json_row("ALTER_PARTITIONS", &stats)),
            Ok(HiveMessage::NoData { .. })
        ));
        // Values that do not match the keys: rejected, not guessed.
        let mut wrong = without.clone();
        wrong["partitionValues"] = serde_json::json!([["2021-03-18", "x"]]);
        let err = super::super::message::decode_message(&json_row("ALTER_PARTITIONS", &wrong))
            .unwrap_err();
        assert!(err.to_string().contains("partitionValues[0]"), "{err}");
    }

    #[test]
    fn files_below_their_partition_keep_the_directories_between() {
        // INSERT ... UNION ALL on Tez: one directory per branch, named only
        // by the files' paths (Hive encodes no subdir for them).
        let mut msgs = setup();
        let t = table("sales", "orders", &["ds", "region"]);
        let base = "hdfs://nn/wh/sales.db/orders/ds=1/region=eu";
        let mut p = part(&["1", "eu"]);
        p.location = Some(base.into());
        msgs.push(HiveMessage::AddPartition {
            table: t.clone(),
            partitions: vec![p.clone()],
            files: vec![vec![]],
        });
        let union =
            |n: u32| FileUri::parse(&format!("{base}/HIVE_UNION_SUBDIR_{n}/000000_0###")).unwrap();
        msgs.push(HiveMessage::Insert {
            table: t.clone(),
            partition: Some(p.clone()),
            replace: false,
            files: vec![union(1), union(2)],
        });
        // The location written with a port, the file without: same place.
        let mut q = part(&["2", "eu"]);
        q.location = Some("hdfs://nn:8020/wh/sales.db/orders/ds=2/region=eu/".into());
        msgs.push(HiveMessage::AddPartition {
            table: t.clone(),
            partitions: vec![q],
            files: vec![vec![
                FileUri::parse("hdfs://nn/wh/sales.db/orders/ds=2/region=eu/000000_0###").unwrap(),
                FileUri::parse("hdfs://nn/wh/sales.db/orders/ds=2/region=eu/a/b/000001_0###")
                    .unwrap(),
            ]],
        });
        // Premapped on a decoding thread, the same as on the ingest thread.
        let map = map();
        let premapped = premap_files(&map, 9, &msgs[msgs.len() - 2]).unwrap();
        assert_eq!(
            premapped
                .iter()
                .map(|f| f.as_ref().unwrap().subdir.clone())
                .collect::<Vec<_>>(),
            vec![
                Some("HIVE_UNION_SUBDIR_1".into()),
                Some("HIVE_UNION_SUBDIR_2".into())
            ]
        );
        let tree = apply_all(&msgs).expect("a UNION ALL insert applies");
        assert_eq!(
            paths(&tree, "sales", "orders"),
            vec![
                "ds=1/region=eu/HIVE_UNION_SUBDIR_1/000000_0",
                "ds=1/region=eu/HIVE_UNION_SUBDIR_2/000000_0",
                "ds=2/region=eu/000000_0",
                "ds=2/region=eu/a/b/000001_0",
            ]
        );
        // Not below the location (a partition elsewhere), or no location:
        // the file is shown directly in the partition, as before.
        assert_eq!(subdir_below("hdfs://nn/other", "hdfs://nn/wh/t/x/f"), None);
        assert_eq!(subdir_below("hdfs://nn/wh/t", "hdfs://nn/wh/t/f"), None);
        assert_eq!(subdir_below("hdfs://nn/wh/t", "hdfs://nn/wh/tt/x/f"), None);
        assert_eq!(subdir_below("/wh/t", "/wh/t/x/f").as_deref(), Some("x"));
        // Another bucket or name node is another place; a root location
        // or an odd path between gives no subdirectory.
        assert_eq!(subdir_below("s3a://b1/wh/t", "s3a://b2/wh/t/x/f"), None);
        assert_eq!(
            subdir_below("hdfs://NN:8020/wh/t", "hdfs://nn/wh/t/x/f").as_deref(),
            Some("x")
        );
        assert_eq!(subdir_below("hdfs://nn", "hdfs://nn/wh/t/f"), None);
        assert_eq!(subdir_below("hdfs://nn/wh/t", "hdfs://nn/wh/t//x/f"), None);
        assert_eq!(
            subdir_below("hdfs://nn/wh/t", "hdfs://nn/wh/t/../x/f"),
            None
        );
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

    /// The first `limit` of `rows` with ids above `after` (a poll).
    fn rows_after(rows: &[NotificationRow], after: i64, limit: usize) -> Vec<NotificationRow> {
        rows.iter()
            .filter(|r| r.event_id > after)
            .take(limit)
            .cloned()
            .collect()
    }

    /// Rows that fail as unavailable `failures` times, then come; without
    /// `txn_log`, a source older than Hive 3.2 (asking for a transaction's
    /// writes is then a mistake).
    struct Flaky {
        rows: Vec<NotificationRow>,
        failures: u32,
        txn_log: bool,
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
            Ok(rows_after(&self.rows, after, limit))
        }
        fn txn_writes(
            &mut self,
            _: i64,
        ) -> Result<Vec<super::super::model::TxnWriteRow>, RowSourceError> {
            match self.txn_log {
                true => Ok(Vec::new()),
                false => Err(RowSourceError::Fatal(
                    "no TXN_WRITE_NOTIFICATION_LOG".into(),
                )),
            }
        }
        fn records_txn_writes(&mut self) -> Result<bool, RowSourceError> {
            Ok(self.txn_log)
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
            txn_log: true,
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

    /// Every row's outcome as the ingest loop meets them: decoded in
    /// order (against the tree the events before it built) until the
    /// first rejection, then re-read from just before it (as after a
    /// hold), the rejected row decoded again, and every row after it.
    fn outcomes(
        rows: &[NotificationRow],
        threads: usize,
    ) -> Vec<(i64, Result<Event, DecodeError>)> {
        let mut cfg = HiveConfig::new(HiveRows::Files("x".into()), map());
        cfg.decode_threads = threads;
        cfg.batch = 64;
        let flaky = Flaky {
            rows: rows.to_vec(),
            failures: 0,
            txn_log: true,
        };
        let mut src = HiveSource::new(Box::new(flaky), &cfg, 0);
        let mut v = Validator::new(Arc::new(Tree::empty()));
        let mut out = Vec::new();
        let mut reread = false;
        'poll: loop {
            let got = src.poll(1000).unwrap();
            if got.is_empty() {
                return out;
            }
            for r in &got {
                let decoded = src.decode(r, v.latest());
                out.push((r.event_id, decoded.clone()));
                match decoded {
                    Ok(e) => {
                        v.check(e, None, None).unwrap();
                    }
                    Err(_) if !reread => {
                        // Results of the rows after it were decoded ahead
                        // and are not taken: the re-read must not see them.
                        reread = true;
                        let at = Position::Hive {
                            hive_event_id: r.event_id - 1,
                        };
                        assert!(src.reread_from(&at));
                        continue 'poll;
                    }
                    Err(_) => {}
                }
            }
        }
    }

    #[test]
    fn insert_files_mapped_ahead_give_the_same_events_and_the_same_rejection_as_mapped_inline() {
        let table = serde_json::to_string(r#"{"1":{"str":"t"},"2":{"str":"d"}}"#).unwrap();
        let mut rows = vec![
            NotificationRow {
                event_type: "CREATE_DATABASE".into(),
                message: Some(r#"{"db": "d"}"#.into()),
                ..row(1)
            },
            NotificationRow {
                event_type: "CREATE_TABLE".into(),
                message: Some(format!(r#"{{"tableObjJson": {table}}}"#).into()),
                ..row(2)
            },
        ];
        let insert = |id: i64, files: &[String]| NotificationRow {
            event_type: "INSERT".into(),
            message: Some(
                format!(
                    r#"{{"tableObjJson": {table}, "replace": "false", "files": {}}}"#,
                    serde_json::to_string(files).unwrap()
                )
                .into(),
            ),
            ..row(id)
        };
        for id in 3..=200 {
            let files: Vec<String> = (0..2)
                .map(|k| format!("hdfs://nn/wh/d/t/f{id}_{k}#00ab#hdfs://nn/cm#"))
                .collect();
            rows.push(insert(id, &files));
        }
        // A file no --source-map covers, after a good one of the same event.
        rows[120] = insert(
            121,
            &[
                "hdfs://nn/wh/d/t/g#00ab#hdfs://nn/cm#".into(),
                "hdfs://elsewhere/d/t/h".into(),
            ],
        );
        let inline = outcomes(&rows, 0);
        let Some((121, Err(DecodeError::Rejected(r)))) = inline.get(120) else {
            panic!("{:?}", inline.get(120));
        };
        assert!(
            r.reason
                .contains("no --source-map covers `hdfs://elsewhere/d/t/h`"),
            "{r}"
        );
        match &inline[10].1 {
            Ok(e) => {
                let f = &e.changes[0].files[1];
                assert_eq!(f.path, "/srv/wh/d/t/f11_1");
                assert_eq!(f.cm_path.as_deref(), Some("/srv/cm/f11_1_00ab"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(outcomes(&rows, 2), inline, "2 decoding threads");
    }

    #[test]
    fn a_gap_found_while_reading_ahead_comes_after_the_rows_before_it() {
        let rows: Vec<NotificationRow> = (1..=10).chain(13..=20).map(row).collect();
        let flaky = Flaky {
            rows,
            failures: 0,
            txn_log: true,
        };
        let mut cfg = HiveConfig::new(HiveRows::Files("x".into()), map());
        cfg.batch = 4;
        let mut src = HiveSource::new(Box::new(flaky), &cfg, 0);
        let mut seen = Vec::new();
        let rejection = loop {
            match src.poll(100) {
                Ok(got) => {
                    // The gap is known with the rows right before it (as
                    // without reading ahead), not with the batch before.
                    let last = got.last().map(|r| r.event_id);
                    let expected = (last == Some(10)).then_some((11, 12));
                    assert_eq!(src.gap(), expected, "after a poll ending at {last:?}");
                    for r in &got {
                        src.decode(r, &Tree::empty()).unwrap();
                        seen.push(r.event_id);
                    }
                }
                Err(SourceError::Fatal(r)) => break r,
                Err(other) => panic!("{other:?}"),
            }
        };
        assert_eq!(seen, (1..=10).collect::<Vec<_>>());
        assert!(
            rejection.reason.contains("events 11..12 are missing"),
            "{rejection}"
        );
        assert_eq!(src.gap(), Some((11, 12)));
        // Stays stopped there.
        assert!(matches!(src.poll(100), Err(SourceError::Fatal(_))));
    }

    #[test]
    fn a_failed_read_ahead_is_read_again_by_the_next_poll() {
        /// Fails every second poll after the first.
        struct Alternating {
            rows: Vec<NotificationRow>,
            polls: u32,
        }
        impl RowSource for Alternating {
            fn poll(
                &mut self,
                after: i64,
                limit: usize,
            ) -> Result<Vec<NotificationRow>, RowSourceError> {
                self.polls += 1;
                if self.polls % 2 == 0 {
                    return Err(RowSourceError::Unavailable("connection reset".into()));
                }
                Ok(rows_after(&self.rows, after, limit))
            }
            fn txn_writes(
                &mut self,
                _: i64,
            ) -> Result<Vec<super::super::model::TxnWriteRow>, RowSourceError> {
                Ok(Vec::new())
            }
            fn newest_event_id(&mut self) -> Result<Option<i64>, RowSourceError> {
                Ok(None)
            }
            fn describe(&self) -> String {
                "alternating".into()
            }
        }
        let mut cfg = HiveConfig::new(HiveRows::Files("x".into()), map());
        cfg.batch = 3;
        let rows = Alternating {
            rows: (1..=7).map(row).collect(),
            polls: 0,
        };
        let mut src = HiveSource::new(Box::new(rows), &cfg, 0);
        let mut seen = Vec::new();
        for _ in 0..10 {
            match src.poll(100) {
                Ok(got) => seen.extend(got.iter().map(|r| r.event_id)),
                Err(SourceError::Transient(e)) => assert!(e.contains("connection reset"), "{e}"),
                Err(other) => panic!("{other:?}"),
            }
        }
        assert_eq!(seen, (1..=7).collect::<Vec<_>>());
    }

    #[test]
    fn decoding_ahead_keeps_id_order_and_stops_at_the_same_bad_row_as_decoding_inline() {
        let mut rows: Vec<NotificationRow> = (1..=300)
            .map(|id| NotificationRow {
                event_type: "CREATE_DATABASE".into(),
                message: Some(format!(r#"{{"db": "d{id}"}}"#).into()),
                ..row(id)
            })
            .collect();
        // A bad row in the middle of a batch (ids 129..=192).
        rows[149].message = Some("{not json".into());
        let inline = outcomes(&rows, 0);
        let ids: Vec<i64> = inline.iter().map(|(id, _)| *id).collect();
        let expected: Vec<i64> = (1..=150).chain(150..=300).collect();
        assert_eq!(ids, expected);
        let DecodeError::Rejected(r) = inline[149].1.clone().unwrap_err() else {
            panic!("{:?}", inline[149]);
        };
        assert_eq!(r.state_id, Some(StateId(150)));
        assert!(
            r.reason
                .contains("cannot decode the CREATE_DATABASE message: bad JSON"),
            "{r}"
        );
        match &inline[200].1 {
            Ok(e) => assert_eq!(e.changes[0].db, "d200"),
            other => panic!("{other:?}"),
        }
        for threads in [1, 3] {
            assert_eq!(
                outcomes(&rows, threads),
                inline,
                "{threads} decoding threads"
            );
        }
    }
}
