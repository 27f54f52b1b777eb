//! The native event format of the source notification log (SPEC §2).
//!
//! Owns parsing and *syntactic* validation of one log line into an [`Event`]:
//! field types, names, paths, file names. Whether an event can *apply* to the
//! current tree (does the table exist, ...) is the catalog's decision
//! (`catalog::Tree::apply`). Called by `ingest` for every source line and by
//! `journal` replay (journal payloads are events serialised by this module).

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use serde::{Deserialize, Serialize};

/// A source state-id: the state after applying events 1..=id.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct StateId(pub u64);

impl fmt::Display for StateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Content address of a staged file: its sha256.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlobId(pub [u8; 32]);

impl BlobId {
    /// Parses 64 hex digits (either case).
    pub fn from_hex(hex: &str) -> Option<BlobId> {
        let bytes = hex.as_bytes();
        if bytes.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            out[i] = (hi * 16 + lo) as u8;
        }
        Some(BlobId(out))
    }

    /// Lower-case hex, as used for blob file names and the `sha256` xattr.
    pub fn to_hex(&self) -> String {
        self.hex_digits().iter().map(|&d| char::from(d)).collect()
    }

    /// The 64 lower-case hex digits, without allocating.
    fn hex_digits(&self) -> [u8; 64] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 64];
        for (i, b) in self.0.iter().enumerate() {
            out[2 * i] = DIGITS[usize::from(b >> 4)];
            out[2 * i + 1] = DIGITS[usize::from(b & 15)];
        }
        out
    }
}

impl fmt::Debug for BlobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlobId({})", &self.to_hex()[..12])
    }
}

impl fmt::Display for BlobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for BlobId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Hex digits are ASCII, so the buffer is always UTF-8.
        let digits = self.hex_digits();
        match std::str::from_utf8(&digits) {
            Ok(hex) => s.serialize_str(hex),
            Err(_) => s.serialize_str(&self.to_hex()),
        }
    }
}

impl<'de> Deserialize<'de> for BlobId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        BlobId::from_hex(&s).ok_or_else(|| serde::de::Error::custom("sha256 must be 64 hex digits"))
    }
}

/// The operations of SPEC §2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    CreateDatabase,
    DropDatabase,
    CreateTable,
    DropTable,
    RenameTable,
    AddPartition,
    DropPartition,
    AddFiles,
    ReplaceFiles,
    Noop,
    /// Empties a table: an unpartitioned table's files, or every partition
    /// of a partitioned one (the partitions stay). Hive's `TRUNCATE TABLE`;
    /// not part of the native format.
    TruncateTable,
    /// Moves `partition` with its files to `new_partition` (Hive's
    /// partition rename); not part of the native format.
    RenamePartition,
    /// Sets the table's `not_in_log` mark (or clears it when None): Hive's
    /// `ALTER TABLE` that makes a table external or managed; not part of
    /// the native format.
    MarkTable,
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "create_database" => Op::CreateDatabase,
            "drop_database" => Op::DropDatabase,
            "create_table" => Op::CreateTable,
            "drop_table" => Op::DropTable,
            "rename_table" => Op::RenameTable,
            "add_partition" => Op::AddPartition,
            "drop_partition" => Op::DropPartition,
            "add_files" => Op::AddFiles,
            "replace_files" => Op::ReplaceFiles,
            "noop" => Op::Noop,
            _ => return None,
        })
    }

    fn needs_table(self) -> bool {
        !matches!(self, Op::CreateDatabase | Op::DropDatabase | Op::Noop)
    }

    fn needs_db(self) -> bool {
        !matches!(self, Op::Noop)
    }
}

/// How a file's content is checked when it is staged (SPEC §3 rule 2,
/// `user.stagefs.verified`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verify {
    /// Native events: size and sha256 are known before fetching.
    Sha256 { size: u64, sha256: BlobId },
    /// Hive: the HDFS file checksum the URI carries (lower-case hex of
    /// `getFileChecksum().getBytes()`), recomputed from the bytes.
    Hdfs { checksum: String },
    /// Hive: the S3 ETag checksum the URI of a file on S3 carries (what
    /// S3A reports with `fs.s3a.etag.checksum.enabled`: the hex of the
    /// ETag's text, quoted by Hadoop 3.4, unquoted by 3.3), compared with
    /// the ETag of the object version read.
    S3Etag { checksum: String },
    /// Hive: a file read where it is (HDFS, S3) whose URI carries no
    /// checksum: accepted only if the version read is not newer than its
    /// event (`time_ms`: the event's time; None when the event has none,
    /// and the file can then never be accepted this way).
    NotNewerThanEvent { time_ms: Option<i64> },
    /// Hive without a checksum, read through `--source-map`: staged as
    /// read, reported as unverified.
    None,
    /// Hive: what stands in a partition whose files no event names and
    /// whose listing at the source cannot be proven to be its content at
    /// the event (`source::hive::partition_listing`). It is never staged:
    /// every state holding it waits, with `reason` in status, and a later
    /// state without it (the partition dropped or overwritten) may be
    /// shown (SPEC §3 rule 2).
    Unproven { reason: String },
}

impl Verify {
    /// The `user.stagefs.verified` value of a file checked this way.
    pub fn label(&self) -> &'static str {
        match self {
            Verify::Sha256 { .. } => "sha256",
            Verify::Hdfs { .. } => "hdfs-md5md5crc32c",
            Verify::S3Etag { .. } => "s3-etag",
            Verify::NotNewerThanEvent { .. } => "not-newer-than-event",
            Verify::None => "none",
            Verify::Unproven { .. } => "unproven",
        }
    }
}

/// One file an event names.
///
/// Native files are known by content before they are fetched (`Verify::Sha256`).
/// Hive files are not: their sha256 and size become known when the stager
/// reads them, so they carry a `key` instead, a stable identity of this
/// reference (derived from the event id and the file's place in the event)
/// that the catalog resolves to a blob once the file is staged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    /// Native: relative to the source root; no `..`, not absolute.
    /// Hive: the absolute local path the URI maps to (`--source-map`).
    pub path: String,
    /// The file's name in its directory: one path component.
    pub name: String,
    /// Directories below the partition (or unpartitioned table) the file
    /// sits in: Hive's `delta_…`/`base_…` (relative, no `..`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subdir: Option<String>,
    pub verify: Verify,
    /// Hive: identity of this reference until its content is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<BlobId>,
    /// Hive: the `--source-map` directory that `path` lies in; the file is
    /// opened beneath it, so no symlink in the source leads out of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_dir: Option<String>,
    /// Hive: local path of the change-management copy
    /// (`<cmroot>/<name>_<checksum>`), tried when the source does not verify.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cm_path: Option<String>,
    /// Hive: the `--source-map` directory that `cm_path` lies in (opened
    /// beneath it, like `source_dir`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cm_dir: Option<String>,
    /// Hive: the URI the source wrote (`user.stagefs.source`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
}

impl FileRef {
    /// A native file of known content.
    pub fn native(path: &str, name: &str, size: u64, sha256: BlobId) -> FileRef {
        FileRef {
            path: path.to_owned(),
            name: name.to_owned(),
            subdir: None,
            verify: Verify::Sha256 { size, sha256 },
            key: None,
            source_dir: None,
            cm_path: None,
            cm_dir: None,
            uri: None,
        }
    }

    /// What identifies this file's content in the catalog before it is
    /// staged: the sha256 when known, else the reference key.
    pub fn key(&self) -> BlobId {
        match (&self.verify, self.key) {
            (Verify::Sha256 { sha256, .. }, _) => *sha256,
            (_, Some(key)) => key,
            // A Hive file without a key cannot be built by the adapter;
            // the all-zero id is never a real blob.
            (_, None) => BlobId([0; 32]),
        }
    }

    /// The blob and size when known before fetching (native files).
    pub fn known(&self) -> Option<(BlobId, u64)> {
        match &self.verify {
            Verify::Sha256 { size, sha256 } => Some((*sha256, *size)),
            Verify::Hdfs { .. }
            | Verify::S3Etag { .. }
            | Verify::NotNewerThanEvent { .. }
            | Verify::Unproven { .. }
            | Verify::None => None,
        }
    }

    /// What `user.stagefs.source` shows: the URI for Hive files, the path otherwise.
    pub fn source_label(&self) -> &str {
        self.uri.as_deref().unwrap_or(&self.path)
    }
}

/// One operation of an event (SPEC §2 "Operations"). A native event is
/// exactly one; a Hive event may be several (a `COMMIT_TXN` writing several
/// tables, an `ADD_PARTITION` of several partitions), applied as one state.
/// Partition values are in the order of the `partition` object; the catalog
/// matches them against the table's partition keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub op: Op,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub db: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub table: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partition_keys: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileRef>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub new_db: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub new_table: String,
    /// `rename_partition` only: the partition it becomes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_partition: Option<BTreeMap<String, String>>,
    /// `create_table` and `mark_table` (Hive only): why the source's log
    /// does not carry the table's data (an external table), or None.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_in_log: Option<String>,
}

impl Change {
    /// An operation on `db`.`table` with nothing else set.
    pub fn new(op: Op, db: &str, table: &str) -> Change {
        Change {
            op,
            db: db.to_owned(),
            table: table.to_owned(),
            partition_keys: Vec::new(),
            partition: None,
            files: Vec::new(),
            new_db: String::new(),
            new_table: String::new(),
            new_partition: None,
            not_in_log: None,
        }
    }
}

/// A validated source event: one state-id and what it changes (all or
/// nothing). `changes` is empty for events that change no data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub id: StateId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<Change>,
}

impl Event {
    /// Every file the event names, in order.
    pub fn files(&self) -> impl Iterator<Item = &FileRef> {
        self.changes.iter().flat_map(|c| c.files.iter())
    }
}

/// Why a line is not a valid event. The id is included where it could be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("malformed JSON: {0}")]
    Json(String),
    #[error("the line is not valid UTF-8")]
    NotUtf8,
    #[error("the line is longer than {max} bytes")]
    TooLong { max: usize },
    #[error("an event must be a JSON object")]
    NotObject,
    #[error("missing field `{0}`")]
    Missing(&'static str),
    #[error("field `{field}` {problem}")]
    Invalid { field: String, problem: String },
    #[error("unknown op `{0}`")]
    UnknownOp(String),
}

impl EventError {
    fn invalid(field: impl Into<String>, problem: impl Into<String>) -> Self {
        EventError::Invalid {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// Longest source line accepted (a `files` array of ~40k entries).
pub const MAX_LINE_BYTES: usize = 16 << 20;
/// Most files one event may name.
pub const MAX_FILES_PER_EVENT: usize = 100_000;
/// Most partition keys a table may have (and entries a `partition` may
/// name). Hive's own metastore schema holds far fewer in practice; the
/// bound keeps every walk of the tree (one level per key) shallow.
pub const MAX_PARTITION_KEYS: usize = 64;
/// Most directory levels a file's `subdir` may have (Hive's
/// `delta_…`/`base_…` and union subdirectories are one or two).
pub const MAX_SUBDIR_DEPTH: usize = 64;

impl Event {
    /// The structural bounds every event must keep, whatever its source:
    /// at most [`MAX_PARTITION_KEYS`] partition keys and partition
    /// entries, at most [`MAX_SUBDIR_DEPTH`] subdirectory levels per file,
    /// and no partition key named twice (ignoring ASCII case). Checked in
    /// time linear in the event's size.
    pub fn check_bounds(&self) -> Result<(), EventError> {
        for c in &self.changes {
            check_partition_keys(c.partition_keys.iter().map(String::as_str))?;
            check_key_count("partition", c.partition.as_ref().map_or(0, BTreeMap::len))?;
            for f in &c.files {
                let depth = f.subdir.as_deref().map_or(0, |s| s.split('/').count());
                if depth > MAX_SUBDIR_DEPTH {
                    return Err(EventError::invalid(
                        "files",
                        format!(
                            "`{}` sits more than {MAX_SUBDIR_DEPTH} subdirectories deep",
                            f.name
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// At most [`MAX_PARTITION_KEYS`] keys in `field`.
fn check_key_count(field: &str, count: usize) -> Result<(), EventError> {
    if count > MAX_PARTITION_KEYS {
        return Err(EventError::invalid(
            field,
            format!("names more than {MAX_PARTITION_KEYS} partition keys"),
        ));
    }
    Ok(())
}

/// At most [`MAX_PARTITION_KEYS`] keys, none twice (ASCII case ignored, as
/// Hive's names are): one pass over the keys.
fn check_partition_keys<'a>(
    keys: impl ExactSizeIterator<Item = &'a str>,
) -> Result<(), EventError> {
    check_key_count("partition_keys", keys.len())?;
    let mut seen = HashSet::with_capacity(keys.len());
    for key in keys {
        if !seen.insert(key.to_ascii_lowercase()) {
            return Err(EventError::invalid(
                "partition_keys",
                format!("names `{key}` twice"),
            ));
        }
    }
    Ok(())
}

/// True for a database or table name: 1–128 of `[A-Za-z0-9_]`.
pub fn is_valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// True for a file name: one non-empty path component, not `.` or `..`, no NUL.
pub fn is_valid_file_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s != "."
        && s != ".."
        && !s.contains('/')
        && !s.contains('\0')
}

/// True for a relative source path with no `..`, `.` or empty component.
pub fn is_valid_source_path(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('/')
        && !s.contains('\0')
        && s.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Reads the id of a line if it has one, for error reports on lines that
/// fail later validation.
pub fn peek_id(line: &[u8]) -> Option<StateId> {
    let v: serde_json::Value = serde_json::from_slice(line).ok()?;
    v.get("id")?.as_u64().filter(|&id| id > 0).map(StateId)
}

impl Event {
    /// Parses and validates one native log line (without its newline).
    pub fn parse_line(line: &[u8]) -> Result<Event, EventError> {
        if line.len() > MAX_LINE_BYTES {
            return Err(EventError::TooLong {
                max: MAX_LINE_BYTES,
            });
        }
        let text = std::str::from_utf8(line).map_err(|_| EventError::NotUtf8)?;
        // serde_json bounds nesting depth (128) itself, so deeply nested
        // input is an error, never a stack overflow.
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| EventError::Json(e.to_string()))?;
        Event::from_value(&value)
    }

    fn from_value(v: &serde_json::Value) -> Result<Event, EventError> {
        use serde_json::Value;
        let obj = v.as_object().ok_or(EventError::NotObject)?;
        let id = match obj.get("id") {
            None | Some(Value::Null) => return Err(EventError::Missing("id")),
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0)
                .ok_or_else(|| EventError::invalid("id", "must be an integer > 0"))?,
        };
        let op_text = match obj.get("op") {
            None | Some(Value::Null) => return Err(EventError::Missing("op")),
            Some(Value::String(s)) => s.as_str(),
            Some(_) => return Err(EventError::invalid("op", "must be a string")),
        };
        let op = Op::parse(op_text).ok_or_else(|| EventError::UnknownOp(op_text.to_owned()))?;
        let time_ms = match obj.get("time_ms") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_i64()
                    .ok_or_else(|| EventError::invalid("time_ms", "must be an integer"))?,
            ),
        };
        let name_field = |field: &'static str, required: bool| -> Result<String, EventError> {
            match obj.get(field) {
                None | Some(Value::Null) if required => Err(EventError::Missing(field)),
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(s)) if is_valid_name(s) => Ok(s.clone()),
                Some(Value::String(_)) => Err(EventError::invalid(
                    field,
                    "must be 1-128 characters of [A-Za-z0-9_]",
                )),
                Some(_) => Err(EventError::invalid(field, "must be a string")),
            }
        };
        let db = name_field("db", op.needs_db())?;
        let table = name_field("table", op.needs_table())?;
        let is_rename = op == Op::RenameTable;
        let new_db = name_field("new_db", is_rename)?;
        let new_table = name_field("new_table", is_rename)?;

        let partition_keys = match obj.get("partition_keys") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => {
                // The count first: a huge list is refused before any work
                // per key.
                check_key_count("partition_keys", items.len())?;
                let mut keys = Vec::with_capacity(items.len());
                for item in items {
                    let key = item.as_str().filter(|k| is_valid_name(k)).ok_or_else(|| {
                        EventError::invalid(
                            "partition_keys",
                            "must hold names of 1-128 characters of [A-Za-z0-9_]",
                        )
                    })?;
                    keys.push(key.to_owned());
                }
                check_partition_keys(keys.iter().map(String::as_str))?;
                keys
            }
            Some(_) => return Err(EventError::invalid("partition_keys", "must be an array")),
        };

        let partition = match obj.get("partition") {
            None | Some(Value::Null) => None,
            Some(Value::Object(map)) => {
                check_key_count("partition", map.len())?;
                let mut out = BTreeMap::new();
                for (k, val) in map {
                    if !is_valid_name(k) {
                        return Err(EventError::invalid(
                            "partition",
                            format!("key `{k}` is not a valid name"),
                        ));
                    }
                    let val = val.as_str().ok_or_else(|| {
                        EventError::invalid("partition", format!("value of `{k}` must be a string"))
                    })?;
                    if val.is_empty() || val.contains('\0') || val.len() > 1024 {
                        return Err(EventError::invalid(
                            "partition",
                            format!("value of `{k}` must be 1-1024 bytes without NUL"),
                        ));
                    }
                    out.insert(k.clone(), val.to_owned());
                }
                Some(out)
            }
            Some(_) => return Err(EventError::invalid("partition", "must be an object")),
        };

        let files = match obj.get("files") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => {
                if items.len() > MAX_FILES_PER_EVENT {
                    return Err(EventError::invalid(
                        "files",
                        format!("names more than {MAX_FILES_PER_EVENT} files"),
                    ));
                }
                items
                    .iter()
                    .enumerate()
                    .map(|(i, f)| parse_file(i, f))
                    .collect::<Result<Vec<_>, _>>()?
            }
            Some(_) => return Err(EventError::invalid("files", "must be an array")),
        };

        match op {
            Op::AddFiles | Op::ReplaceFiles if !obj.contains_key("files") => {
                return Err(EventError::Missing("files"))
            }
            Op::CreateTable if partition.is_some() => {
                return Err(EventError::invalid(
                    "partition",
                    "is not allowed on create_table",
                ));
            }
            _ => {}
        }
        let carries_files = matches!(op, Op::AddPartition | Op::AddFiles | Op::ReplaceFiles);
        if !carries_files && !files.is_empty() {
            return Err(EventError::invalid(
                "files",
                format!("is not allowed on {op_text}"),
            ));
        }
        if op != Op::CreateTable && !partition_keys.is_empty() {
            return Err(EventError::invalid(
                "partition_keys",
                format!("is not allowed on {op_text}"),
            ));
        }
        if matches!(op, Op::AddPartition | Op::DropPartition) && partition.is_none() {
            return Err(EventError::Missing("partition"));
        }

        let op = if op == Op::Noop { None } else { Some(op) };
        Ok(Event {
            id: StateId(id),
            time_ms,
            changes: op
                .map(|op| Change {
                    op,
                    db,
                    table,
                    partition_keys,
                    partition,
                    files,
                    new_db,
                    new_table,
                    new_partition: None,
                    not_in_log: None,
                })
                .into_iter()
                .collect(),
        })
    }
}

fn parse_file(index: usize, v: &serde_json::Value) -> Result<FileRef, EventError> {
    let field = |name: &str| format!("files[{index}].{name}");
    let obj = v
        .as_object()
        .ok_or_else(|| EventError::invalid(format!("files[{index}]"), "must be an object"))?;
    let path = obj
        .get("path")
        .ok_or_else(|| EventError::invalid(field("path"), "is missing"))?
        .as_str()
        .ok_or_else(|| EventError::invalid(field("path"), "must be a string"))?;
    if !is_valid_source_path(path) {
        return Err(EventError::invalid(
            field("path"),
            format!("`{path}` must be relative, without `..`, `.` or empty components"),
        ));
    }
    let size = obj
        .get("size")
        .ok_or_else(|| EventError::invalid(field("size"), "is missing"))?
        .as_u64()
        .ok_or_else(|| EventError::invalid(field("size"), "must be an integer >= 0"))?;
    let sha = obj
        .get("sha256")
        .ok_or_else(|| EventError::invalid(field("sha256"), "is missing"))?
        .as_str()
        .ok_or_else(|| EventError::invalid(field("sha256"), "must be a string"))?;
    let sha256 = BlobId::from_hex(sha)
        .ok_or_else(|| EventError::invalid(field("sha256"), "must be 64 hex digits"))?;
    let name = match obj.get("name") {
        None | Some(serde_json::Value::Null) => path.rsplit('/').next().unwrap_or(path).to_owned(),
        Some(serde_json::Value::String(n)) => n.clone(),
        Some(_) => return Err(EventError::invalid(field("name"), "must be a string")),
    };
    if !is_valid_file_name(&name) {
        return Err(EventError::invalid(
            field("name"),
            format!("`{name}` must be a single path component"),
        ));
    }
    Ok(FileRef::native(path, &name, size, sha256))
}

/// Hive's partition path escaping: `%XX` (upper-case hex) for control
/// characters, `"#%'*/:=?\^{[]` and DEL.
pub fn escape_path_name(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        let needs = (c as u32) < 0x20
            || c as u32 == 0x7f
            || matches!(
                c,
                '"' | '#' | '%' | '\'' | '*' | '/' | ':' | '=' | '?' | '\\' | '^' | '{' | '[' | ']'
            );
        if needs {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "f0b5c2c2211c8d67ed15e75e656c7862d086e9245420892a7de62cd9ec582a06";

    fn parse(s: &str) -> Result<Event, EventError> {
        Event::parse_line(s.as_bytes())
    }

    fn create_table_with_keys(keys: &[String]) -> String {
        let keys = serde_json::to_string(keys).unwrap();
        format!(
            r#"{{"id": 3, "op": "create_table", "db": "d", "table": "t", "partition_keys": {keys}}}"#
        )
    }

    #[test]
    fn partition_keys_past_the_bound_are_refused_naming_the_bound() {
        let keys = |n: usize| (0..n).map(|i| format!("k{i}")).collect::<Vec<_>>();
        let at_bound = parse(&create_table_with_keys(&keys(MAX_PARTITION_KEYS))).unwrap();
        assert_eq!(at_bound.changes[0].partition_keys.len(), 64);
        for n in [MAX_PARTITION_KEYS + 1, 100_000] {
            let err = parse(&create_table_with_keys(&keys(n))).unwrap_err();
            assert_eq!(
                err.to_string(),
                "field `partition_keys` names more than 64 partition keys"
            );
        }
        let partition: BTreeMap<String, String> =
            keys(100_000).into_iter().map(|k| (k, "v".into())).collect();
        let line = format!(
            r#"{{"id": 4, "op": "add_partition", "db": "d", "table": "t", "partition": {}}}"#,
            serde_json::to_string(&partition).unwrap()
        );
        assert_eq!(
            parse(&line).unwrap_err().to_string(),
            "field `partition` names more than 64 partition keys"
        );
    }

    #[test]
    fn a_partition_key_named_twice_is_refused_ignoring_case() {
        let mut keys: Vec<String> = (0..63).map(|i| format!("k{i}")).collect();
        keys.push("K17".into());
        let err = parse(&create_table_with_keys(&keys)).unwrap_err();
        assert_eq!(err.to_string(), "field `partition_keys` names `K17` twice");
    }

    #[test]
    fn bounds_hold_for_events_built_by_other_sources() {
        // The Hive source builds events without `parse_line`: the
        // validator checks them with `check_bounds`.
        let mut create = Change::new(Op::CreateTable, "d", "t");
        create.partition_keys = (0..65).map(|i| format!("k{i}")).collect();
        let event = |c: Change| Event {
            id: StateId(1),
            time_ms: None,
            changes: vec![c],
        };
        assert!(event(create.clone()).check_bounds().is_err());
        create.partition_keys = vec!["a".into(), "A".into()];
        assert!(event(create.clone()).check_bounds().is_err());
        create.partition_keys = vec!["a".into(), "b".into()];
        assert!(event(create).check_bounds().is_ok());
        let mut add = Change::new(Op::AddFiles, "d", "t");
        let mut file = FileRef::native("x/f", "f", 1, BlobId([0; 32]));
        file.subdir = Some(vec!["s"; 65].join("/"));
        add.files.push(file.clone());
        assert!(event(add.clone()).check_bounds().is_err());
        file.subdir = Some("delta_1_1".into());
        add.files = vec![file];
        assert!(event(add).check_bounds().is_ok());
    }

    #[test]
    fn parses_the_seed_example_line() {
        let e = parse(&format!(
            r#"{{"id": 20, "time_ms": 1, "op": "add_files", "db": "default", "table": "blah", "files": [{{"path": "default/blah/p=a/000001_0", "size": 2, "sha256": "{SHA}"}}], "partition": {{"p": "a"}}}}"#
        ))
        .unwrap();
        assert_eq!(e.id, StateId(20));
        assert_eq!(e.changes.len(), 1);
        assert_eq!(e.changes[0].op, Op::AddFiles);
        let f = &e.changes[0].files[0];
        assert_eq!(f.name, "000001_0");
        assert_eq!(f.key().to_hex(), SHA);
        assert_eq!(f.verify.label(), "sha256");
    }

    #[test]
    fn rejects_malformed_json() {
        assert!(matches!(parse("{\"id\": 1,"), Err(EventError::Json(_))));
    }

    #[test]
    fn rejects_invalid_utf8() {
        assert_eq!(
            Event::parse_line(b"{\"id\":\xff}"),
            Err(EventError::NotUtf8)
        );
    }

    #[test]
    fn rejects_deeply_nested_json_without_overflow() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(matches!(parse(&deep), Err(EventError::Json(_))));
    }

    #[test]
    fn rejects_unknown_op() {
        assert_eq!(
            parse(r#"{"id": 1, "op": "explode", "db": "d"}"#),
            Err(EventError::UnknownOp("explode".into()))
        );
    }

    #[test]
    fn rejects_missing_fields() {
        assert_eq!(parse(r#"{"op": "noop"}"#), Err(EventError::Missing("id")));
        assert_eq!(parse(r#"{"id": 1}"#), Err(EventError::Missing("op")));
        assert_eq!(
            parse(r#"{"id": 1, "op": "create_database"}"#),
            Err(EventError::Missing("db"))
        );
        assert_eq!(
            parse(r#"{"id": 1, "op": "drop_table", "db": "d"}"#),
            Err(EventError::Missing("table"))
        );
        assert_eq!(
            parse(r#"{"id": 1, "op": "add_files", "db": "d", "table": "t"}"#),
            Err(EventError::Missing("files"))
        );
        assert_eq!(
            parse(r#"{"id": 1, "op": "rename_table", "db": "d", "table": "t", "new_db": "d"}"#),
            Err(EventError::Missing("new_table"))
        );
    }

    #[test]
    fn rejects_bad_ids() {
        for line in [
            r#"{"id": 0, "op": "noop"}"#,
            r#"{"id": -3, "op": "noop"}"#,
            r#"{"id": "7", "op": "noop"}"#,
            r#"{"id": 1.5, "op": "noop"}"#,
        ] {
            assert!(
                matches!(parse(line), Err(EventError::Invalid { .. })),
                "{line}"
            );
        }
    }

    #[test]
    fn rejects_invalid_names() {
        for db in ["", "a-b", "a b", "é", &"x".repeat(129)] {
            let line = format!(r#"{{"id": 1, "op": "create_database", "db": "{db}"}}"#);
            assert!(
                matches!(parse(&line), Err(EventError::Invalid { .. })),
                "{db}"
            );
        }
    }

    fn add_file_line(path: &str, name: Option<&str>) -> String {
        let name = name
            .map(|n| format!(r#", "name": "{n}""#))
            .unwrap_or_default();
        format!(
            r#"{{"id": 1, "op": "add_files", "db": "d", "table": "t", "files": [{{"path": "{path}", "size": 1, "sha256": "{SHA}"{name}}}]}}"#
        )
    }

    #[test]
    fn rejects_absolute_and_dotdot_paths() {
        for path in ["/etc/passwd", "a/../b", "..", "a//b", "./a", ""] {
            assert!(
                matches!(
                    parse(&add_file_line(path, None)),
                    Err(EventError::Invalid { .. })
                ),
                "{path}"
            );
        }
    }

    #[test]
    fn rejects_file_names_that_are_not_one_component() {
        for name in ["a/b", "..", ".", ""] {
            assert!(
                matches!(
                    parse(&add_file_line("x/y", Some(name))),
                    Err(EventError::Invalid { .. })
                ),
                "{name}"
            );
        }
    }

    #[test]
    fn rejects_bad_sha_and_size() {
        let line = add_file_line("x", None).replace(SHA, "abc");
        assert!(matches!(parse(&line), Err(EventError::Invalid { .. })));
        let line = add_file_line("x", None).replace("\"size\": 1", "\"size\": -1");
        assert!(matches!(parse(&line), Err(EventError::Invalid { .. })));
    }

    #[test]
    fn escapes_partition_values_like_hive() {
        assert_eq!(escape_path_name("a/b=c"), "a%2Fb%3Dc");
        assert_eq!(escape_path_name("x\u{1}y\u{7f}"), "x%01y%7F");
        assert_eq!(escape_path_name("plain value-1.2"), "plain value-1.2");
    }

    #[test]
    fn blob_id_round_trips_hex() {
        let b = BlobId::from_hex(SHA).unwrap();
        assert_eq!(b.to_hex(), SHA);
        assert_eq!(BlobId::from_hex(&SHA.to_uppercase()), Some(b));
    }

    #[test]
    fn serialises_back_to_the_same_event() {
        let e = parse(&add_file_line("x/y", None)).unwrap();
        let json = serde_json::to_vec(&e).unwrap();
        assert_eq!(serde_json::from_slice::<Event>(&json).unwrap(), e);
    }
}
