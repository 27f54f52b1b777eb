//! The Hive notification log as data: the rows the metastore keeps
//! (`NOTIFICATION_LOG`, `TXN_WRITE_NOTIFICATION_LOG`) and what their
//! messages mean once decoded ([`HiveMessage`]).
//!
//! This module is the seam between three parts of the Hive source:
//! - row sources produce [`NotificationRow`]s and [`TxnWriteRow`]s
//!   (`metastore` polls PostgreSQL or MySQL; `--hive-events` reads exported
//!   JSON Lines) behind [`RowSource`];
//! - decoding (`message`, `thrift`, `uri`) turns a row's `MESSAGE` into a
//!   [`HiveMessage`] with raw Hive values (names as Hive wrote them, file
//!   URIs parsed but not mapped to local paths);
//! - the adapter maps a [`HiveMessage`] onto catalog operations, maps URIs
//!   through `--source-map`, and checks ids (gaps, repeats).
//!
//! Nothing here does I/O.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// One row of `NOTIFICATION_LOG`, column for column (HIVE.md).
/// `--hive-events` files hold these as JSON objects keyed by column name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotificationRow {
    #[serde(rename = "NL_ID", default)]
    pub nl_id: Option<i64>,
    #[serde(rename = "EVENT_ID")]
    pub event_id: i64,
    /// Epoch seconds.
    #[serde(rename = "EVENT_TIME", default)]
    pub event_time: Option<i64>,
    #[serde(rename = "EVENT_TYPE")]
    pub event_type: String,
    #[serde(rename = "CAT_NAME", default)]
    pub cat_name: Option<String>,
    #[serde(rename = "DB_NAME", default)]
    pub db_name: Option<String>,
    #[serde(rename = "TBL_NAME", default)]
    pub tbl_name: Option<String>,
    /// Shared, so that handing the row to a decoding thread copies no text.
    #[serde(rename = "MESSAGE", default)]
    pub message: Option<Arc<str>>,
    /// `json-0.2`, `gzip(json-2.0)`, `gzip`, or NULL (plain JSON).
    #[serde(rename = "MESSAGE_FORMAT", default)]
    pub message_format: Option<String>,
}

/// One row of `TXN_WRITE_NOTIFICATION_LOG`: the files one transaction wrote
/// into one table or partition (HIVE.md "Transactional tables").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnWriteRow {
    #[serde(rename = "WNL_ID", default)]
    pub wnl_id: Option<i64>,
    #[serde(rename = "WNL_TXNID")]
    pub txn_id: i64,
    #[serde(rename = "WNL_WRITEID", default)]
    pub write_id: Option<i64>,
    #[serde(rename = "WNL_DATABASE")]
    pub database: String,
    #[serde(rename = "WNL_TABLE")]
    pub table: String,
    /// `k1=v1/k2=v2` (Hive-escaped), or empty / NULL for an unpartitioned table.
    #[serde(rename = "WNL_PARTITION", default)]
    pub partition: Option<String>,
    /// Thrift-JSON Table object.
    #[serde(rename = "WNL_TABLE_OBJ", default)]
    pub table_obj: Option<String>,
    /// Thrift-JSON Partition object, NULL for an unpartitioned table.
    #[serde(rename = "WNL_PARTITION_OBJ", default)]
    pub partition_obj: Option<String>,
    /// Encoded file URIs joined by `]`.
    #[serde(rename = "WNL_FILES", default)]
    pub files: Option<String>,
    #[serde(rename = "WNL_EVENT_TIME", default)]
    pub event_time: Option<i64>,
}

/// Where rows come from: the metastore database or exported files.
/// Implementations are polled by one thread; they never block for long
/// (a network call with its own timeout at most).
pub trait RowSource: Send {
    /// Up to `limit` rows with `EVENT_ID > after`, in `EVENT_ID` order.
    fn poll(&mut self, after: i64, limit: usize) -> Result<Vec<NotificationRow>, RowSourceError>;
    /// Every `TXN_WRITE_NOTIFICATION_LOG` row of transaction `txn_id`, in `WNL_ID` order.
    fn txn_writes(&mut self, txn_id: i64) -> Result<Vec<TxnWriteRow>, RowSourceError>;
    /// Whether the source keeps `TXN_WRITE_NOTIFICATION_LOG` (Hive 3.2 / 4.0
    /// and later). Without it, the files that transactions write into
    /// transactional tables are in no log.
    fn records_txn_writes(&mut self) -> Result<bool, RowSourceError> {
        Ok(true)
    }
    /// The source's newest event id when it can tell (`NEXT_EVENT_ID - 1`), for lag.
    fn newest_event_id(&mut self) -> Result<Option<i64>, RowSourceError>;
    /// What status shows as the source (`postgresql://user@host:port/db`, no password; or a path).
    fn describe(&self) -> String;
    /// After a rejection: true when a row may have been corrected, having
    /// forgotten what was read, so the next poll reads the rows above its
    /// `after` afresh. A database is asked anew at every poll: always true.
    fn rewind(&mut self) -> bool {
        true
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowSourceError {
    /// Worth retrying with backoff: connection refused or lost, timeout, server restarting.
    #[error("the metastore is unavailable: {0}")]
    Unavailable(String),
    /// A row that cannot be read as a row (a column of the wrong type, a
    /// line that is not JSON, an id that does not follow the one before).
    /// `event_id` is the row's `EVENT_ID` when it could be read.
    #[error("{location}: {reason}")]
    BadRow {
        location: String,
        reason: String,
        event_id: Option<i64>,
    },
    /// Configuration that cannot work (bad URL, missing table, permission denied).
    #[error("{0}")]
    Fatal(String),
}

/// One encoded file URI `path#checksum#cmroot#subdir` (`ReplChangeManager.encodeFileUri`),
/// split but not mapped to a local path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileUri {
    /// Full URI of the file at the source (`hdfs://nn:8020/warehouse/.../000000_0`).
    pub path: String,
    /// Lower-case hex of the HDFS file checksum, when the URI carries one.
    pub checksum: Option<String>,
    /// Change-management root URI, when the URI carries one.
    pub cm_root: Option<String>,
    /// Directory below the table or partition (`delta_0000001_0000001_0000`), when any.
    pub subdir: Option<String>,
}

/// A table as Hive describes it in a Thrift-JSON Table object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HiveTable {
    pub db: String,
    pub name: String,
    /// Partition key names in key order (field 8).
    pub partition_keys: Vec<String>,
    /// `sd.location`, when set.
    pub location: Option<String>,
    /// `MANAGED_TABLE`, `EXTERNAL_TABLE`, `VIRTUAL_VIEW`, `MATERIALIZED_VIEW`.
    pub table_type: Option<String>,
    pub parameters: BTreeMap<String, String>,
}

/// A partition as Hive describes it in a Thrift-JSON Partition object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HivePartition {
    /// Raw (unescaped) values in partition-key order.
    pub values: Vec<String>,
    pub location: Option<String>,
}

/// What one notification means, with Hive's raw values. Names are as Hive
/// wrote them (Hive lower-cases db and table names); partition values are
/// raw, in key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HiveMessage {
    CreateDatabase {
        db: String,
    },
    DropDatabase {
        db: String,
    },
    /// `files` is non-empty for CREATE TABLE AS SELECT.
    CreateTable {
        table: HiveTable,
        files: Vec<FileUri>,
    },
    DropTable {
        db: String,
        table: String,
    },
    /// A rename when `before` and `after` name different tables;
    /// `is_truncate` empties the table (an unpartitioned one's files, or every partition's).
    AlterTable {
        before: HiveTable,
        after: HiveTable,
        is_truncate: bool,
    },
    /// Several partitions; `files[i]` are the files of `partitions[i]` (empty when none).
    AddPartition {
        table: HiveTable,
        partitions: Vec<HivePartition>,
        files: Vec<Vec<FileUri>>,
    },
    /// `is_truncate` empties the partition; otherwise metadata only.
    AlterPartition {
        table: HiveTable,
        before: HivePartition,
        after: HivePartition,
        is_truncate: bool,
    },
    /// Each entry: raw values in key order.
    DropPartition {
        table: HiveTable,
        partitions: Vec<Vec<String>>,
    },
    /// `ALTER_PARTITIONS` with `isTruncateOp` (TRUNCATE TABLE of a
    /// partitioned table in Hive 4.x with alter-partitions notifications v2,
    /// one event for all its partitions):
    /// each partition's files are removed. Values raw, in key order.
    TruncatePartitions {
        table: HiveTable,
        partitions: Vec<Vec<String>>,
    },
    /// `replace` = INSERT OVERWRITE. `partition` is None for an unpartitioned table.
    Insert {
        table: HiveTable,
        partition: Option<HivePartition>,
        replace: bool,
        files: Vec<FileUri>,
    },
    /// The files come from the transaction's `TXN_WRITE_NOTIFICATION_LOG` rows.
    CommitTxn {
        txn_id: i64,
    },
    /// Every other event type (OPEN_TXN, ABORT_TXN, ALLOC_WRITE_ID_EVENT,
    /// statistics, functions, compaction, unknown types): no data change.
    NoData {
        event_type: String,
    },
}

/// The files of one `TXN_WRITE_NOTIFICATION_LOG` row, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnWrite {
    pub table: HiveTable,
    /// None for an unpartitioned table.
    pub partition: Option<HivePartition>,
    pub files: Vec<FileUri>,
}
