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
//!   carry a `not_in_log` mark in the catalog, which status lists;
//! - EXCHANGE PARTITION: the metastore writes, in one transaction, an
//!   ADD_PARTITION on the destination table followed by one DROP_PARTITION
//!   per partition on the source table. Those rows become one event (at
//!   the ADD_PARTITION's id, the source's position after the last drop),
//!   the drops' own events changing nothing, so no state shows the
//!   partition in both tables; see [`exchange_drops`].
//!
//! Decoding of the rows themselves (encodings, Thrift-JSON, URIs) is the
//! `message`/`thrift`/`uri` modules'; mapping a file URI to a [`FileRef`]
//! is `file_refs`'s (shared with the decoding threads of `ahead`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::ahead::{DecodeAhead, Decoded};
use super::file_refs::{files_dir, map_file};
use super::map::SourceMap;
use super::model::{
    FileUri, HiveMessage, HivePartition, HiveTable, NotificationRow, RowSource, RowSourceError,
};
use super::partition_listing::{
    listed_refs, prove_at_event, unproven_ref, AtEvent, ListAtSource, SourceLister,
};
use crate::catalog::{DirKind, Tree};
use crate::event::{is_valid_name, Change, Event, FileRef, Op, StateId};
use crate::source::{DecodeError, Position, Rejection, Source, SourceError};
use crate::status::SourceReport;

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
    /// `--event-time-margin`: how much later than its event a file without
    /// a checksum, read from HDFS or S3, may have been modified (the blob
    /// store applies it: `stage::EventTimeMargin`).
    pub event_time_margin: crate::stage::EventTimeMargin,
    /// `--catalog`: the metastore catalog replicated (lower-case).
    pub catalog: String,
}

impl HiveConfig {
    pub fn new(rows: HiveRows, source_map: SourceMap) -> HiveConfig {
        HiveConfig {
            rows,
            source_map,
            poll_interval: Duration::from_millis(500),
            batch: 1000,
            decode_threads: super::ahead::default_threads(),
            event_time_margin: crate::stage::EventTimeMargin::DEFAULT,
            catalog: DEFAULT_CATALOG.to_owned(),
        }
    }
}

/// Hive's default catalog, the only one of a metastore without `CTLGS`.
pub const DEFAULT_CATALOG: &str = "hive";

/// A `--catalog` name, checked and lower-cased as Hive stores catalog
/// names (`CTLGS.NAME`, `NOTIFICATION_LOG.CAT_NAME`).
pub fn catalog_name(name: &str) -> Result<String, String> {
    let ok = !name.is_empty()
        && name.len() <= 256
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !ok {
        return Err(format!(
            "--catalog {name:?}: a catalog name is 1 to 256 letters, digits, `_` or `-`"
        ));
    }
    Ok(name.to_ascii_lowercase())
}

/// Whether a `NOTIFICATION_LOG` row belongs to catalog `ours` (lower-case):
/// its `CAT_NAME`, any case. A row without one is kept: Hive writes none
/// on transaction events (OPEN_TXN, COMMIT_TXN, ABORT_TXN, ALLOC_WRITE_ID),
/// which serve every catalog, nor on any row of a schema without catalogs
/// (Hive 2, where everything is `hive`).
pub fn row_in_catalog(row: &NotificationRow, ours: &str) -> bool {
    match row.cat_name.as_deref().map(str::trim) {
        Some(cat) if !cat.is_empty() => cat.eq_ignore_ascii_case(ours),
        _ => true,
    }
}

/// Whether a `TXN_WRITE_NOTIFICATION_LOG` row (which has no catalog
/// column) wrote into a table of catalog `ours`: the `catName` of its
/// `WNL_TABLE_OBJ`, `hive` when the object carries none (Hive before 3).
pub fn write_in_catalog(row: &super::model::TxnWriteRow, ours: &str) -> Result<bool, String> {
    let Some(obj) = row.table_obj.as_deref().filter(|t| !t.trim().is_empty()) else {
        return Err(format!(
            "the TXN_WRITE_NOTIFICATION_LOG row of {}.{} (transaction {}) has no WNL_TABLE_OBJ to tell its catalog by",
            row.database, row.table, row.txn_id
        ));
    };
    let cat = super::thrift::table_catalog_from_json(obj).map_err(|e| {
        format!(
            "the WNL_TABLE_OBJ of {}.{} (transaction {}): {e}",
            row.database, row.table, row.txn_id
        )
    })?;
    Ok(cat
        .as_deref()
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .unwrap_or(DEFAULT_CATALOG)
        .eq_ignore_ascii_case(ours))
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
    /// `--catalog`: rows of other catalogs change nothing.
    catalog: String,
    /// The batch after the one the last poll returned, read (and handed to
    /// the decoding threads) at that poll: the next poll returns it.
    next: Option<Batch>,
    /// Lists the partitions of external tables whose ADD_PARTITION names
    /// no files (`partition_listing`).
    lister: Box<dyn ListAtSource>,
    /// `--event-time-margin`, for the proof of such a listing.
    margin: crate::stage::EventTimeMargin,
    /// The DROP_PARTITION rows read right after an ADD_PARTITION row (by
    /// the ADD_PARTITION's id): an EXCHANGE PARTITION's, when
    /// [`exchange_drops`] says so at its decoding.
    exchange_rows: BTreeMap<i64, Vec<NotificationRow>>,
    /// `(add, last)`: the ADD_PARTITION `add` was decoded as an exchange
    /// with the DROP_PARTITION rows after it up to `last`, which decode to
    /// events without changes.
    folded: Option<(i64, i64)>,
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
                let password = std::env::var(super::metastore::PASSWORD_ENV).ok();
                super::metastore::check_catalog(url, password.clone(), &cfg.catalog)?;
                super::metastore::connect(url, password)?
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
            catalog: cfg.catalog.clone(),
            next: None,
            lister: Box::new(SourceLister {
                map: cfg.source_map.clone(),
            }),
            margin: cfg.event_time_margin,
            exchange_rows: BTreeMap::new(),
            folded: None,
        }
    }

    /// Keeps, for each ADD_PARTITION row of `rows`, the DROP_PARTITION rows
    /// that follow it at once (in `rows`, then in the batch read ahead): an
    /// EXCHANGE PARTITION's drops, when its decoding says so. The rows of
    /// one metastore transaction are committed together, so a batch cut
    /// between them has the rest in the batch read ahead (a full batch);
    /// when that read failed, the exchange is decoded as separate events.
    fn note_exchanges(&mut self, rows: &[NotificationRow]) {
        let ahead: &[NotificationRow] = self.next.as_ref().map_or(&[], |b| &b.rows);
        for (i, add) in rows.iter().enumerate() {
            if add.event_type != "ADD_PARTITION" {
                continue;
            }
            let drops: Vec<NotificationRow> = rows[i + 1..]
                .iter()
                .chain(ahead)
                .take_while(|r| r.event_type == "DROP_PARTITION" && r.cat_name == add.cat_name)
                .cloned()
                .collect();
            if !drops.is_empty() {
                self.exchange_rows.insert(add.event_id, drops);
            }
        }
    }

    /// Lists partitions with `lister` instead of at the source.
    pub fn with_lister(mut self, lister: Box<dyn ListAtSource>) -> HiveSource {
        self.lister = lister;
        self
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

    /// Fills the partitions an external table's ADD_PARTITION adds without
    /// naming their files (`changes[i]` adds `partitions[i]`) from a
    /// listing of their locations, or with an unproven reference when the
    /// listing cannot be proven to be their content at the event
    /// (`partition_listing`). A listing that fails is tried again, with
    /// backoff, by the caller (`Retry`); status shows it as the source's
    /// error meanwhile.
    fn list_unnamed_partitions(
        &mut self,
        at: AtEvent,
        table: &HiveTable,
        partitions: &[HivePartition],
        files: &[Vec<FileUri>],
        changes: &mut [Change],
    ) -> Result<(), DecodeError> {
        if !is_external(table) {
            return Ok(());
        }
        // A translated table is written by Hive and Spark, with events, as
        // a managed one: content that cannot be proven waits. A plain
        // external table's files may be written by any tool, long after
        // the partition was added and without an event: there the
        // partition keeps what the events name (the table is in
        // `not_in_log`), as it always did, rather than holding every later
        // state back.
        let waits = param(table, "TRANSLATED_TO_EXTERNAL");
        let mut mapped: usize = changes.iter().map(|c| c.files.len()).sum();
        for (i, (p, change)) in partitions.iter().zip(changes.iter_mut()).enumerate() {
            if files.get(i).is_some_and(|f| !f.is_empty()) {
                continue;
            }
            let shown = format!(
                "{}.{} partition ({})",
                change.db,
                change.table,
                p.values.join(", ")
            );
            let Some(location) = p.location.as_deref().filter(|l| !l.trim().is_empty()) else {
                let why = format!(
                    "{shown}: its ADD_PARTITION (event {}) names no files and no location to list",
                    at.event_id
                );
                if waits {
                    change.files = vec![unproven_ref(at.event_id, mapped, &shown, why)];
                    mapped += 1;
                } else {
                    tracing::info!(%why, "a plain external table's partition: shown as its events name it");
                }
                continue;
            };
            let listing = self.lister.list(location).map_err(|e| {
                let msg = format!("listing {location}, {shown} at event {}: {e}", at.event_id);
                self.error = Some(msg.clone());
                DecodeError::Retry(msg)
            })?;
            change.files = match prove_at_event(&listing, at) {
                Ok(found) => listed_refs(&self.map, at, location, mapped, &found).map_err(|e| {
                    DecodeError::Rejected(Rejection::of_event(
                        StateId(at.event_id as u64),
                        format!("{shown}: a file listed at {location}: {e}"),
                    ))
                })?,
                Err(why) if !waits => {
                    tracing::info!(
                        partition = %shown,
                        %why,
                        "a plain external table's partition whose listing is unproven: shown as its events name it"
                    );
                    Vec::new()
                }
                Err(why) => {
                    let reason = format!(
                        "{shown}: its ADD_PARTITION (event {}) names no files (an external table) and its listing at {location} cannot be proven to be its content at the event: {why}",
                        at.event_id
                    );
                    tracing::warn!(%reason, "a partition's content is unproven; states holding it wait");
                    vec![unproven_ref(at.event_id, mapped, location, reason)]
                }
            };
            mapped += change.files.len();
        }
        Ok(())
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
        self.note_exchanges(&batch.rows);
        Ok(batch.rows)
    }

    fn decode(&mut self, row: &NotificationRow, latest: &Tree) -> Result<Event, DecodeError> {
        let id = StateId(row.event_id as u64);
        let reject = |reason: String| DecodeError::Rejected(Rejection::of_event(id, reason));
        let decoded = self.ahead.take(row);
        // Rows up to an exchange's ADD_PARTITION are decoded: forget the
        // drops kept for those before it.
        self.exchange_rows = self.exchange_rows.split_off(&row.event_id);
        if let Some((add, last)) = self.folded {
            if row.event_id > add && row.event_id <= last {
                // A drop of the exchange decoded at `add`: applied there.
                if row.event_type != "DROP_PARTITION" {
                    return Err(reject(format!(
                        "event {} was read as a DROP_PARTITION of the EXCHANGE PARTITION at event {add}, and is now {}",
                        row.event_id, row.event_type
                    )));
                }
                if row.event_id == last {
                    self.folded = None;
                }
                self.last_decoded = row.event_id;
                return Ok(Event {
                    id,
                    time_ms: row.event_time.map(|s| s.saturating_mul(1000)),
                    changes: Vec::new(),
                });
            }
            self.folded = None;
        }
        if !row_in_catalog(row, &self.catalog) {
            // Another catalog's row: not ours, whatever it holds.
            if row.event_id <= 0 {
                return Err(reject("EVENT_ID must be > 0".into()));
            }
            self.last_decoded = row.event_id;
            return Ok(Event {
                id,
                time_ms: row.event_time.map(|s| s.saturating_mul(1000)),
                changes: Vec::new(),
            });
        }
        let Decoded { message, files } = decoded
            .map_err(|e| reject(format!("cannot decode the {} message: {e}", row.event_type)))?;
        let txn_log = match &message {
            HiveMessage::CreateTable { .. }
            | HiveMessage::AlterTable { .. }
            | HiveMessage::CommitTxn { .. } => self.txn_log()?,
            _ => true,
        };
        let mut mapper = Mapper::of_row(&self.map, row, latest, txn_log, files);
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
                    if !write_in_catalog(w, &self.catalog).map_err(&reject)? {
                        continue;
                    }
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
        let mut changes = changes;
        if let HiveMessage::AddPartition {
            table,
            partitions,
            files,
        } = &message
        {
            let at = AtEvent {
                event_id: row.event_id,
                time_ms: row.event_time.map(|s| s.saturating_mul(1000)),
                margin: self.margin,
            };
            self.list_unnamed_partitions(at, table, partitions, files, &mut changes)?;
            if let Some(drops) = self.exchange_rows.remove(&row.event_id) {
                if let Some((last, sources)) = exchange_drops(table, partitions, &drops) {
                    let mut mapper = Mapper::of_row(&self.map, row, latest, txn_log, None);
                    for (source, values) in &sources {
                        let drop = mapper
                            .each_partition(Op::DropPartition, source, std::slice::from_ref(values))
                            .map_err(|e| {
                                reject(format!(
                                    "the EXCHANGE PARTITION's DROP_PARTITION rows (events {}..{last}): {e}",
                                    row.event_id + 1
                                ))
                            })?;
                        changes.extend(drop);
                    }
                    self.folded = Some((row.event_id, last));
                }
            }
        }
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
        // An exchange's rows are one event: after any of them the source
        // continues after its last drop.
        let hive_event_id = match self.folded {
            Some((add, last)) if (add..last).contains(&row.event_id) => last,
            _ => row.event_id,
        };
        Position::Hive { hive_event_id }
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
        self.exchange_rows.clear();
        self.folded = None;
        true
    }
}

/// Maps one message onto changes against the newest accepted tree.
struct Mapper<'a> {
    map: &'a SourceMap,
    event_id: i64,
    /// The event's time (`EVENT_TIME` × 1000), for files without a checksum.
    event_time_ms: Option<i64>,
    /// Files mapped so far in this event (each gets its own key).
    files: usize,
    tree: &'a Tree,
    /// Whether the source keeps `TXN_WRITE_NOTIFICATION_LOG`.
    txn_log: bool,
    /// An INSERT's files mapped already by a decoding thread
    /// ([`super::file_refs::premap_files`]): taken by the first [`Mapper::files`] call when it
    /// maps the same number of files from the event's first.
    premapped: Option<Vec<Result<FileRef, String>>>,
}

impl<'a> Mapper<'a> {
    /// A mapper for the changes of `row`, applied to `tree`.
    fn of_row(
        map: &'a SourceMap,
        row: &NotificationRow,
        tree: &'a Tree,
        txn_log: bool,
        premapped: Option<Vec<Result<FileRef, String>>>,
    ) -> Mapper<'a> {
        Mapper {
            map,
            event_id: row.event_id,
            event_time_ms: row.event_time.map(|s| s.saturating_mul(1000)),
            files: 0,
            tree,
            txn_log,
            premapped,
        }
    }
}

/// A partition an exchange moves: its source table and its values.
type ExchangedFrom = (HiveTable, Vec<String>);

/// When the DROP_PARTITION rows `drops`, read right after an ADD_PARTITION
/// of `partitions` into `table`, are an EXCHANGE PARTITION's (ALTER TABLE
/// `table` EXCHANGE PARTITION … WITH TABLE source): the id of its last
/// drop, and for each partition the source table and its values. Hive's
/// `exchange_partitions` adds the partitions to the destination and drops
/// them from the source in one metastore transaction and writes, in it,
/// one ADD_PARTITION (every partition, in order) and then one
/// DROP_PARTITION per partition (the same values, in the same order) on
/// the source table, a table other than `table` with the same partition
/// keys. Anything else (another number of drops, other values, a drop of
/// several partitions or of the same table) is not an exchange: None, and
/// the rows are separate events. (Two unrelated changes shaped exactly
/// like it would only lose the state between them, which no reader needs.)
fn exchange_drops(
    table: &HiveTable,
    partitions: &[HivePartition],
    drops: &[NotificationRow],
) -> Option<(i64, Vec<ExchangedFrom>)> {
    if partitions.is_empty() || drops.len() < partitions.len() {
        return None;
    }
    let lower =
        |keys: &[String]| -> Vec<String> { keys.iter().map(|k| k.to_ascii_lowercase()).collect() };
    let mut out = Vec::with_capacity(partitions.len());
    for (p, row) in partitions.iter().zip(drops) {
        let HiveMessage::DropPartition {
            table: source,
            partitions: dropped,
        } = super::message::decode_message(row).ok()?
        else {
            return None;
        };
        let same_table = source.db.eq_ignore_ascii_case(&table.db)
            && source.name.eq_ignore_ascii_case(&table.name);
        if same_table
            || dropped.len() != 1
            || dropped[0] != p.values
            || lower(&source.partition_keys) != lower(&table.partition_keys)
        {
            return None;
        }
        if let Some((first, _)) = out.first() {
            let first: &HiveTable = first;
            if !(first.db.eq_ignore_ascii_case(&source.db)
                && first.name.eq_ignore_ascii_case(&source.name))
            {
                return None;
            }
        }
        out.push((source, p.values.clone()));
    }
    Some((drops[partitions.len() - 1].event_id, out))
}

/// Why the log does not carry `table`'s data, or None:
/// - external tables (`tableType` EXTERNAL_TABLE, or the table parameter
///   `EXTERNAL`=TRUE) other than those Hive 4's metadata transformer made
///   of managed ones (`TRANSLATED_TO_EXTERNAL`=TRUE, written by Hive and
///   Spark with their events, as managed tables are): whoever writes their
///   files may write no event;
/// - transactional tables (parameter `transactional`=true) when the source
///   has no `TXN_WRITE_NOTIFICATION_LOG` (`txn_log` false, Hive before
///   3.2 / 4.0): the files their transactions write are in no log.
fn not_in_log(table: &HiveTable, txn_log: bool) -> Option<String> {
    if is_external(table) && !param(table, "TRANSLATED_TO_EXTERNAL") {
        return Some(
            "external table: files written into it without a Hive event are in no log; the mount \
             shows the files events name, and those of a partition an event adds as listed at the \
             source (when provably unchanged since the event)"
                .to_owned(),
        );
    }
    (!txn_log && param(table, "transactional")).then(|| {
        "transactional table on a metastore without TXN_WRITE_NOTIFICATION_LOG (Hive before 3.2 / 4.0): \
         the files its transactions write are in no log; the mount shows only the files an event names"
            .to_owned()
    })
}

/// Whether `table`'s parameter `key` (any case) is `true` (any case).
fn param(table: &HiveTable, key: &str) -> bool {
    table
        .parameters
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case(key) && v.trim().eq_ignore_ascii_case("true"))
}

/// An external table (`tableType` EXTERNAL_TABLE, or the table parameter
/// `EXTERNAL`=TRUE): Hive's listener names none of its partitions' files
/// in ADD_PARTITION.
fn is_external(table: &HiveTable) -> bool {
    table
        .table_type
        .as_deref()
        .is_some_and(|t| t.eq_ignore_ascii_case("EXTERNAL_TABLE"))
        || param(table, "EXTERNAL")
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

    /// The event's next files, in the directory `dir` (see
    /// [`super::file_refs::map_file`]).
    fn files(&mut self, uris: &[FileUri], dir: Option<&str>) -> Result<Vec<FileRef>, String> {
        if let Some(pre) = self.premapped.take() {
            if self.files == 0 && pre.len() == uris.len() {
                self.files = pre.len();
                return pre.into_iter().collect();
            }
        }
        uris.iter()
            .map(|uri| {
                let f = map_file(
                    self.map,
                    self.event_id,
                    self.event_time_ms,
                    self.files,
                    uri,
                    dir,
                );
                self.files += 1;
                f
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
