//! Decoding one notification: a [`NotificationRow`]'s `MESSAGE` (in its
//! `MESSAGE_FORMAT`) into a [`HiveMessage`], and a [`TxnWriteRow`] into a
//! [`TxnWrite`].
//!
//! Formats (docs/HIVE.md "Message formats"): `json-0.2` and NULL are
//! JSON text; `gzip(json-2.0)` and `gzip` are standard base64 of gzip of the
//! same JSON, decompressed to at most [`MAX_DECOMPRESSED`] bytes so a gzip
//! bomb is an error, not an exhausted machine. Any other format is an error.
//!
//! The JSON is read leniently where Hive varies (unknown fields ignored,
//! booleans as `"true"`/`"false"` strings or JSON booleans, `null` for an
//! absent value) and strictly where a wrong reading would replicate the wrong
//! data (Thrift-JSON objects, partition values against the table's keys,
//! file URIs). Values stay raw: names as Hive wrote them, URIs not mapped.
//!
//! Invariant: no input makes these functions panic; every failure is a
//! [`DecodeError`] naming what is wrong. Called by the Hive adapter for each
//! row it polls; does no I/O.

use std::borrow::Cow;
use std::cell::RefCell;
use std::io::{Cursor, Read};

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use flate2::bufread::GzDecoder;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::model::{
    FileUri, HiveMessage, HivePartition, HiveTable, NotificationRow, TxnWrite, TxnWriteRow,
};
use super::thrift::{self, ThriftError};
use super::uri::{self, UriError, DEFAULT_PARTITION_NAME};

/// The most a compressed message may expand to.
pub const MAX_DECOMPRESSED: u64 = 256 << 20;

/// Why a row could not be decoded. Messages name the part that is wrong;
/// the caller adds the event id and type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("unknown MESSAGE_FORMAT {0:?} (stagefs reads json-0.2, gzip(json-2.0), gzip, and NULL for JSON)")]
    UnknownFormat(String),
    #[error("bad base64 in a {format} message: {reason}")]
    BadBase64 { format: String, reason: String },
    #[error("bad gzip in a {format} message: {reason}")]
    BadGzip { format: String, reason: String },
    #[error("the {format} message decompresses to more than {limit} bytes")]
    TooLarge { format: String, limit: u64 },
    #[error("the decompressed {format} message is not UTF-8: {reason}")]
    BadUtf8 { format: String, reason: String },
    #[error("bad JSON: {0}")]
    BadJson(String),
    #[error("bad Thrift-JSON in {field}: {source}")]
    BadThrift { field: String, source: ThriftError },
    #[error("missing field {0}")]
    MissingField(String),
    #[error("field {field}: {reason}")]
    BadField { field: String, reason: String },
    #[error("{field}: {source}")]
    BadPath { field: String, source: UriError },
}

type Result<T> = std::result::Result<T, DecodeError>;

/// The event types whose message is read (every other type advances the
/// state-id only): a row of one of them without a `MESSAGE` is an error.
pub const MESSAGE_EVENT_TYPES: [&str; 11] = [
    "CREATE_DATABASE",
    "DROP_DATABASE",
    "CREATE_TABLE",
    "DROP_TABLE",
    "ALTER_TABLE",
    "ADD_PARTITION",
    "ALTER_PARTITION",
    "DROP_PARTITION",
    "ALTER_PARTITIONS",
    "INSERT",
    "COMMIT_TXN",
];

/// What one `NOTIFICATION_LOG` row means.
///
/// The message's top-level fields are read without building a JSON tree
/// (values stay raw text until a field is asked for; a table object seen
/// on this thread just before is not parsed again, see `LAST_TABLE`).
/// Any failure there decodes the message again through a
/// `serde_json::Value`, whose error is the one reported: the two readings
/// differ in cost, never in what they report.
pub fn decode_message(row: &NotificationRow) -> Result<HiveMessage> {
    let event_type = row.event_type.as_str();
    let Some(message) = row.message.as_deref() else {
        return if MESSAGE_EVENT_TYPES.contains(&event_type) {
            Err(DecodeError::MissingField("MESSAGE".into()))
        } else {
            Ok(HiveMessage::NoData {
                event_type: row.event_type.clone(),
            })
        };
    };
    let text = decode_text(message, row.message_format.as_deref())?;
    if let Ok(RawFields(fields)) = serde_json::from_str::<RawFields>(&text) {
        let m = Msg {
            obj: Obj::Raw(&fields),
        };
        if let Ok(decoded) = decode_fields(row, &m) {
            return Ok(decoded);
        }
    }
    decode_tree(row, &text)
}

/// [`decode_message`] of the JSON `text` through a `serde_json::Value`
/// (the reading whose errors are reported).
fn decode_tree(row: &NotificationRow, text: &str) -> Result<HiveMessage> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| DecodeError::BadJson(e.to_string()))?;
    let Value::Object(obj) = value else {
        return Err(DecodeError::BadJson(
            "the message is not a JSON object".into(),
        ));
    };
    decode_fields(
        row,
        &Msg {
            obj: Obj::Tree(&obj),
        },
    )
}

/// The message of `row` from its fields.
fn decode_fields(row: &NotificationRow, m: &Msg<'_>) -> Result<HiveMessage> {
    let event_type = row.event_type.as_str();
    Ok(match event_type {
        "CREATE_DATABASE" => HiveMessage::CreateDatabase {
            db: m.db_name(row)?,
        },
        "DROP_DATABASE" => HiveMessage::DropDatabase {
            db: m.db_name(row)?,
        },
        "CREATE_TABLE" => HiveMessage::CreateTable {
            table: m.table("tableObjJson")?,
            files: m.files("files")?,
        },
        "DROP_TABLE" => {
            let (db, table) = match (m.opt_str("db")?, m.opt_str("table")?) {
                (Some(db), Some(table)) => (db.into_owned(), table.into_owned()),
                _ => match m.opt_str("tableObjJson")? {
                    Some(_) => {
                        let t = m.table("tableObjJson")?;
                        (t.db, t.name)
                    }
                    None => return Err(DecodeError::MissingField("table".into())),
                },
            };
            HiveMessage::DropTable { db, table }
        }
        "ALTER_TABLE" => HiveMessage::AlterTable {
            before: m.table("tableObjBeforeJson")?,
            after: m.table("tableObjAfterJson")?,
            is_truncate: m.bool("isTruncateOp")?,
        },
        "ADD_PARTITION" => m.add_partition()?,
        "ALTER_PARTITION" => {
            let table = m.table("tableObjJson")?;
            let before = m.partition("partitionObjBeforeJson", &table)?;
            let after = m.partition("partitionObjAfterJson", &table)?;
            HiveMessage::AlterPartition {
                table,
                before,
                after,
                is_truncate: m.bool("isTruncateOp")?,
            }
        }
        "DROP_PARTITION" => {
            let table = m.table("tableObjJson")?;
            let partitions = m.partition_specs("partitions", &table)?;
            HiveMessage::DropPartition { table, partitions }
        }
        "INSERT" => {
            let table = m.table("tableObjJson")?;
            let partition = match m.opt_str("ptnObjJson")? {
                Some(_) => Some(m.partition("ptnObjJson", &table)?),
                None if table.partition_keys.is_empty() => None,
                None => {
                    return Err(DecodeError::BadField {
                        field: "ptnObjJson".into(),
                        reason: format!(
                            "null, but {}.{} is partitioned by {:?}",
                            table.db, table.name, table.partition_keys
                        ),
                    })
                }
            };
            HiveMessage::Insert {
                table,
                partition,
                replace: m.bool("replace")?,
                files: m.files("files")?,
            }
        }
        // A batch of partitions altered at once; only a truncation changes
        // data (anything else: statistics, properties, no data change).
        "ALTER_PARTITIONS" if m.bool("isTruncateOp")? => m.truncate_partitions()?,
        "COMMIT_TXN" => HiveMessage::CommitTxn {
            txn_id: m.req_i64("txnid")?,
        },
        _ => HiveMessage::NoData {
            event_type: row.event_type.clone(),
        },
    })
}

/// The files one `TXN_WRITE_NOTIFICATION_LOG` row names, with their table
/// and partition. Without `WNL_PARTITION_OBJ` the partition's values come
/// from `WNL_PARTITION` (its location is then unknown).
pub fn decode_txn_write(row: &TxnWriteRow) -> Result<TxnWrite> {
    let table_obj = non_empty(row.table_obj.as_deref())
        .ok_or_else(|| DecodeError::MissingField("WNL_TABLE_OBJ".into()))?;
    let table = cached_table(TableText::Json, table_obj, || {
        thrift::table_from_json(table_obj).map_err(|source| DecodeError::BadThrift {
            field: "WNL_TABLE_OBJ".into(),
            source,
        })
    })?;
    let partition = match (
        non_empty(row.partition_obj.as_deref()),
        non_empty(row.partition.as_deref()),
    ) {
        (Some(obj), _) => {
            Some(
                thrift::partition_from_json(obj).map_err(|source| DecodeError::BadThrift {
                    field: "WNL_PARTITION_OBJ".into(),
                    source,
                })?,
            )
        }
        (None, Some(name)) => Some(HivePartition {
            values: uri::partition_values_in_key_order(name, &table.partition_keys).map_err(
                |source| DecodeError::BadPath {
                    field: "WNL_PARTITION".into(),
                    source,
                },
            )?,
            location: None,
        }),
        (None, None) => None,
    };
    match &partition {
        Some(p) => check_partition(&table, p, "WNL_PARTITION_OBJ")?,
        None if !table.partition_keys.is_empty() => {
            return Err(DecodeError::BadField {
                field: "WNL_PARTITION".into(),
                reason: format!(
                    "empty, but {}.{} is partitioned by {:?}",
                    table.db, table.name, table.partition_keys
                ),
            })
        }
        None => {}
    }
    let files = match row.files.as_deref() {
        Some(joined) => uri::split_files(joined).map_err(|source| DecodeError::BadPath {
            field: "WNL_FILES".into(),
            source,
        })?,
        None => Vec::new(),
    };
    Ok(TxnWrite {
        table,
        partition,
        files,
    })
}

/// The JSON text of a message in `format` (NULL and empty mean JSON).
pub fn decode_text<'a>(message: &'a str, format: Option<&str>) -> Result<Cow<'a, str>> {
    decode_text_limited(message, format, MAX_DECOMPRESSED)
}

/// [`decode_text`] with a chosen limit on the decompressed size.
pub fn decode_text_limited<'a>(
    message: &'a str,
    format: Option<&str>,
    limit: u64,
) -> Result<Cow<'a, str>> {
    match format.map(str::trim) {
        None | Some("") | Some("json-0.2") => Ok(Cow::Borrowed(message)),
        Some(f @ ("gzip(json-2.0)" | "gzip")) => gunzip_base64(message, f, limit).map(Cow::Owned),
        Some(other) => Err(DecodeError::UnknownFormat(other.to_string())),
    }
}

/// Standard alphabet; padding optional (Hive pads, exports may not).
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A gzip decoder over a reusable input buffer. One per thread (see
/// [`GUNZIP`]): creating a decoder allocates (and zeroes) zlib's inflate
/// state and its 32 KiB window, which costs more than inflating a typical
/// message; [`GzDecoder::reset`] keeps them.
type Gunzip = GzDecoder<Cursor<Vec<u8>>>;

thread_local! {
    /// This thread's [`Gunzip`], created at its first gzip message.
    static GUNZIP: RefCell<Option<Gunzip>> = const { RefCell::new(None) };
}

/// The decoded base64 of a message kept for the next one only up to this
/// capacity (a rare huge message does not pin its buffer to the thread).
const KEEP_INPUT_CAPACITY: usize = 1 << 20;

fn gunzip_base64(message: &str, format: &str, limit: u64) -> Result<String> {
    GUNZIP.with(|slot| match slot.try_borrow_mut() {
        Ok(mut slot) => {
            let gz = slot.get_or_insert_with(|| GzDecoder::new(Cursor::new(Vec::new())));
            gunzip_base64_with(gz, message, format, limit)
        }
        // Not reentrant; a fresh decoder if it ever were.
        Err(_) => gunzip_base64_with(
            &mut GzDecoder::new(Cursor::new(Vec::new())),
            message,
            format,
            limit,
        ),
    })
}

fn gunzip_base64_with(gz: &mut Gunzip, message: &str, format: &str, limit: u64) -> Result<String> {
    let trimmed = message.trim();
    let compact: Cow<str> = if trimmed.bytes().any(|b| b.is_ascii_whitespace()) {
        Cow::Owned(trimmed.split_ascii_whitespace().collect())
    } else {
        Cow::Borrowed(trimmed)
    };
    let mut compressed = std::mem::take(gz.get_mut()).into_inner();
    compressed.clear();
    if compressed.capacity() > KEEP_INPUT_CAPACITY {
        compressed = Vec::new();
    }
    BASE64
        .decode_vec(compact.as_bytes(), &mut compressed)
        .map_err(|e| DecodeError::BadBase64 {
            format: format.to_string(),
            reason: e.to_string(),
        })?;
    let mut out = Vec::with_capacity(compressed.len().saturating_mul(4).min(limit as usize));
    // The buffer is the decoder's input (no 32 KiB BufReader per message).
    gz.reset(Cursor::new(compressed));
    Members(gz)
        .take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| DecodeError::BadGzip {
            format: format.to_string(),
            reason: e.to_string(),
        })?;
    if out.len() as u64 > limit {
        return Err(DecodeError::TooLarge {
            format: format.to_string(),
            limit,
        });
    }
    String::from_utf8(out).map_err(|e| DecodeError::BadUtf8 {
        format: format.to_string(),
        reason: e.utf8_error().to_string(),
    })
}

/// Every gzip member of the decoder's input in turn, exactly as
/// `flate2::bufread::MultiGzDecoder` reads them (which cannot be reset):
/// after a member whose trailer (CRC32, ISIZE) checked, the end of the
/// input ends the stream; anything else must be the next member, whose
/// header is parsed afresh (a reset keeps the position in the input).
struct Members<'a>(&'a mut Gunzip);

impl Read for Members<'_> {
    fn read(&mut self, into: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let n = self.0.read(into)?;
            if n > 0 || into.is_empty() {
                return Ok(n);
            }
            let input = self.0.get_ref();
            if input.position() >= input.get_ref().len() as u64 {
                return Ok(0);
            }
            let rest = std::mem::take(self.0.get_mut());
            self.0.reset(rest);
        }
    }
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.trim().is_empty())
}

/// Partition values must match the table's partition keys one for one.
fn check_partition(table: &HiveTable, p: &HivePartition, field: &str) -> Result<()> {
    if p.values.len() != table.partition_keys.len() {
        return Err(DecodeError::BadField {
            field: field.to_string(),
            reason: format!(
                "{} partition values {:?}, but {}.{} has {} partition keys {:?}",
                p.values.len(),
                p.values,
                table.db,
                table.name,
                table.partition_keys.len(),
                table.partition_keys
            ),
        });
    }
    Ok(())
}

/// Field access on a message object, with errors naming the field.
struct Msg<'a> {
    obj: Obj<'a>,
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn bad(field: &str, reason: String) -> DecodeError {
    DecodeError::BadField {
        field: field.to_string(),
        reason,
    }
}

fn str_of<'v>(v: &'v Value, field: &str) -> Result<Option<&'v str>> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s)),
        other => Err(bad(
            field,
            format!("expected a string, found {}", kind(other)),
        )),
    }
}

fn array_of<'v>(v: Option<&'v Value>, field: &str) -> Result<&'v [Value]> {
    match v {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(bad(
            field,
            format!("expected an array, found {}", kind(other)),
        )),
    }
}

/// File URIs of a `files` array; an element holding several URIs joined
/// by `]` (as REPL DUMP writes them) is split.
fn files_of(items: &[Value], field: &str) -> Result<Vec<FileUri>> {
    let mut strs = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        strs.push(str_of(item, &format!("{field}[{i}]"))?);
    }
    file_uris(strs.into_iter(), field)
}

/// [`files_of`] for elements read as strings (None for a JSON null).
fn file_uris<'s>(
    items: impl ExactSizeIterator<Item = Option<&'s str>>,
    field: &str,
) -> Result<Vec<FileUri>> {
    let mut files = Vec::with_capacity(items.len());
    for (i, item) in items.enumerate() {
        let at = || format!("{field}[{i}]");
        let Some(s) = item else {
            return Err(bad(&at(), "null instead of a file URI".into()));
        };
        files.extend(uri::split_files(s).map_err(|source| DecodeError::BadPath {
            field: at(),
            source,
        })?);
    }
    Ok(files)
}

/// A message object's fields: the tree, or each top-level value's raw
/// text (in order; a repeated key's last value counts, as in the tree).
#[derive(Clone, Copy)]
enum Obj<'a> {
    Tree(&'a Map<String, Value>),
    Raw(&'a [(Cow<'a, str>, &'a RawValue)]),
}

/// The top-level fields of a JSON object, values unparsed (but checked to
/// be JSON).
struct RawFields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for RawFields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = RawFields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<RawFields<'de>, A::Error> {
                let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(12));
                while let Some((Text(key), value)) = map.next_entry::<Text, &RawValue>()? {
                    fields.push((key, value));
                }
                Ok(RawFields(fields))
            }
        }
        d.deserialize_map(Fields)
    }
}

/// A JSON string, borrowed from the input unless it has escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Str;
        impl<'de> Visitor<'de> for Str {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                s: &'de str,
            ) -> std::result::Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> std::result::Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(Str)
    }
}

/// A field's raw value (the last, if the key repeats).
fn raw_field<'a>(fields: &[(Cow<'a, str>, &'a RawValue)], name: &str) -> Option<&'a RawValue> {
    fields
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| *v)
}

fn parse_raw(raw: &RawValue) -> Result<Value> {
    serde_json::from_str(raw.get()).map_err(|e| DecodeError::BadJson(e.to_string()))
}

/// How the text a table is cached by writes the table object.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum TableText {
    /// A JSON string literal holding the Thrift-JSON (a message field's
    /// raw text, escapes and all).
    Literal,
    /// The Thrift-JSON itself (`WNL_TABLE_OBJ`).
    Json,
}

thread_local! {
    /// The table object this thread decoded last, by its text and how that
    /// text writes it, with what it decoded to: the rows of one table
    /// repeat its object, and parsing it is a third of a typical INSERT's
    /// decoding. A pure function of the two, so a hit is exactly a parse.
    static LAST_TABLE: RefCell<Option<(TableText, String, HiveTable)>> = const { RefCell::new(None) };
}

/// Table objects longer than this are not kept.
const KEEP_TABLE_TEXT: usize = 256 << 10;

/// The table `key` (written as `kind`) decodes to: this thread's last one
/// if it was decoded from the same, else `parse()` (kept for the next call
/// when it succeeds).
fn cached_table(
    kind: TableText,
    key: &str,
    parse: impl FnOnce() -> Result<HiveTable>,
) -> Result<HiveTable> {
    let hit = LAST_TABLE.with(|last| match last.try_borrow() {
        Ok(last) => last
            .as_ref()
            .filter(|(k, text, _)| *k == kind && text == key)
            .map(|(_, _, t)| t.clone()),
        Err(_) => None,
    });
    if let Some(t) = hit {
        return Ok(t);
    }
    let table = parse()?;
    if key.len() <= KEEP_TABLE_TEXT {
        LAST_TABLE.with(|last| {
            if let Ok(mut last) = last.try_borrow_mut() {
                match last.as_mut() {
                    Some((k, text, t)) => {
                        *k = kind;
                        text.clear();
                        text.push_str(key);
                        t.clone_from(&table);
                    }
                    None => *last = Some((kind, key.to_owned(), table.clone())),
                }
            }
        });
    }
    Ok(table)
}

impl<'a> Msg<'a> {
    /// A field's value (parsed from its raw text when the fields are raw).
    fn value(&self, field: &str) -> Result<Option<Cow<'a, Value>>> {
        match self.obj {
            Obj::Tree(m) => Ok(m.get(field).map(Cow::Borrowed)),
            Obj::Raw(fields) => match raw_field(fields, field) {
                None => Ok(None),
                Some(raw) => parse_raw(raw).map(|v| Some(Cow::Owned(v))),
            },
        }
    }

    fn opt_str(&self, field: &str) -> Result<Option<Cow<'a, str>>> {
        match self.obj {
            Obj::Tree(m) => match m.get(field) {
                None => Ok(None),
                Some(v) => Ok(str_of(v, field)?.map(Cow::Borrowed)),
            },
            Obj::Raw(fields) => match raw_field(fields, field) {
                None => Ok(None),
                Some(raw) if raw.get().starts_with('"') => serde_json::from_str::<Text>(raw.get())
                    .map(|Text(s)| Some(s))
                    .map_err(|e| DecodeError::BadJson(e.to_string())),
                Some(raw) => Ok(str_of(&parse_raw(raw)?, field)?.map(|s| Cow::Owned(s.to_owned()))),
            },
        }
    }

    fn req_str(&self, field: &str) -> Result<Cow<'a, str>> {
        self.opt_str(field)?
            .ok_or_else(|| DecodeError::MissingField(field.to_string()))
    }

    /// Hive writes `"true"`/`"false"`; newer writers real booleans; absent is false.
    fn bool(&self, field: &str) -> Result<bool> {
        match self.value(field)?.as_deref() {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
            Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
            Some(other) => Err(bad(
                field,
                format!("expected \"true\" or \"false\", found {other}"),
            )),
        }
    }

    fn req_i64(&self, field: &str) -> Result<i64> {
        match self.value(field)?.as_deref() {
            None | Some(Value::Null) => Err(DecodeError::MissingField(field.to_string())),
            Some(Value::Number(n)) => n
                .as_i64()
                .ok_or_else(|| bad(field, format!("{n} is not a 64-bit integer"))),
            Some(Value::String(s)) => s
                .trim()
                .parse()
                .map_err(|_| bad(field, format!("{s:?} is not a 64-bit integer"))),
            Some(other) => Err(bad(
                field,
                format!("expected an integer, found {}", kind(other)),
            )),
        }
    }

    fn table(&self, field: &str) -> Result<HiveTable> {
        let parse = || {
            let text = self.req_str(field)?;
            thrift::table_from_json(&text).map_err(|source| DecodeError::BadThrift {
                field: field.to_string(),
                source,
            })
        };
        match self.obj {
            Obj::Raw(fields) => match raw_field(fields, field) {
                Some(raw) => cached_table(TableText::Literal, raw.get(), parse),
                None => parse(),
            },
            Obj::Tree(_) => parse(),
        }
    }

    fn partition(&self, field: &str, table: &HiveTable) -> Result<HivePartition> {
        let text = self.req_str(field)?;
        let p = thrift::partition_from_json(&text).map_err(|source| DecodeError::BadThrift {
            field: field.to_string(),
            source,
        })?;
        check_partition(table, &p, field)?;
        Ok(p)
    }

    fn files(&self, field: &str) -> Result<Vec<FileUri>> {
        if let Obj::Raw(fields) = self.obj {
            // Usually an array of strings: read without a tree.
            if let Some(raw) = raw_field(fields, field) {
                if let Ok(items) = serde_json::from_str::<Vec<Text>>(raw.get()) {
                    return file_uris(items.iter().map(|Text(s)| Some(&**s)), field);
                }
            }
        }
        let v = self.value(field)?;
        files_of(array_of(v.as_deref(), field)?, field)
    }

    fn db_name(&self, row: &NotificationRow) -> Result<String> {
        if let Some(db) = self.opt_str("db")? {
            return Ok(db.to_string());
        }
        if let Some(text) = self.opt_str("dbJson")? {
            return thrift::database_from_json(&text)
                .map(|d| d.name)
                .map_err(|source| DecodeError::BadThrift {
                    field: "dbJson".into(),
                    source,
                });
        }
        row.db_name
            .clone()
            .ok_or_else(|| DecodeError::MissingField("db".into()))
    }

    /// `partitions`: one `{key: value}` object per partition, values raw;
    /// returned in the table's key order.
    fn partition_specs(&self, field: &str, table: &HiveTable) -> Result<Vec<Vec<String>>> {
        let v = self.value(field)?;
        let items = array_of(v.as_deref(), field)?;
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let at = format!("{field}[{i}]");
            let Value::Object(spec) = item else {
                return Err(bad(
                    &at,
                    format!("expected an object, found {}", kind(item)),
                ));
            };
            let mut pairs = Vec::with_capacity(spec.len());
            for (k, v) in spec {
                let Some(v) = str_of(v, &format!("{at}.{k}"))? else {
                    return Err(bad(&format!("{at}.{k}"), "null partition value".into()));
                };
                pairs.push((k.clone(), v.to_string()));
            }
            out.push(
                uri::order_by_keys(&table.partition_keys, pairs.into_iter())
                    .map_err(|reason| bad(&at, reason))?,
            );
        }
        Ok(out)
    }

    /// `ALTER_PARTITIONS` as `JSONAlterPartitionsMessage` writes it: the
    /// table in `tableObjJson` and the partitions as `partitions`
    /// (`{key: value}` objects), or, in the form without a table object,
    /// `db`, `table`, `partitionKeys` and `partitionValues` (value lists in
    /// key order).
    fn truncate_partitions(&self) -> Result<HiveMessage> {
        if self.opt_str("tableObjJson")?.is_some() {
            let table = self.table("tableObjJson")?;
            let partitions = self.partition_specs("partitions", &table)?;
            return Ok(HiveMessage::TruncatePartitions { table, partitions });
        }
        let strings = |v: &Value, at: &str| -> Result<Vec<String>> {
            array_of(Some(v), at)?
                .iter()
                .enumerate()
                .map(|(i, item)| match str_of(item, &format!("{at}[{i}]"))? {
                    Some(s) => Ok(s.to_string()),
                    None => Err(bad(&format!("{at}[{i}]"), "null".into())),
                })
                .collect()
        };
        let keys = self
            .value("partitionKeys")?
            .ok_or_else(|| DecodeError::MissingField("partitionKeys".into()))?;
        let table = HiveTable {
            db: self.req_str("db")?.into_owned(),
            name: self.req_str("table")?.into_owned(),
            partition_keys: strings(&keys, "partitionKeys")?,
            location: None,
            table_type: self.opt_str("tableType")?.map(Cow::into_owned),
            parameters: Default::default(),
        };
        let lists = self
            .value("partitionValues")?
            .ok_or_else(|| DecodeError::MissingField("partitionValues".into()))?;
        let mut partitions = Vec::new();
        for (i, list) in array_of(Some(&lists), "partitionValues")?
            .iter()
            .enumerate()
        {
            let at = format!("partitionValues[{i}]");
            let values = strings(list, &at)?;
            if values.len() != table.partition_keys.len() {
                return Err(bad(
                    &at,
                    format!(
                        "{} values for the {} partition keys {:?}",
                        values.len(),
                        table.partition_keys.len(),
                        table.partition_keys
                    ),
                ));
            }
            partitions.push(values);
        }
        Ok(HiveMessage::TruncatePartitions { table, partitions })
    }

    fn add_partition(&self) -> Result<HiveMessage> {
        let table = self.table("tableObjJson")?;
        let list = self.value("partitionListJson")?;
        let partitions: Vec<HivePartition> = match list.as_deref() {
            None | Some(Value::Null) => self
                .partition_specs("partitions", &table)?
                .into_iter()
                .map(|values| HivePartition {
                    values,
                    location: None,
                })
                .collect(),
            Some(v) => {
                let items = array_of(Some(v), "partitionListJson")?;
                let mut parts = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let at = format!("partitionListJson[{i}]");
                    let Some(text) = str_of(item, &at)? else {
                        return Err(bad(&at, "null instead of a Partition".into()));
                    };
                    let p = thrift::partition_from_json(text).map_err(|source| {
                        DecodeError::BadThrift {
                            field: at.clone(),
                            source,
                        }
                    })?;
                    check_partition(&table, &p, &at)?;
                    parts.push(p);
                }
                parts
            }
        };
        let mut files: Vec<Vec<FileUri>> = vec![Vec::new(); partitions.len()];
        let same = |a: &str, b: &str| {
            a == b
                || (a.is_empty() && b == DEFAULT_PARTITION_NAME)
                || (b.is_empty() && a == DEFAULT_PARTITION_NAME)
        };
        let partition_files = self.value("partitionFiles")?;
        for (j, entry) in array_of(partition_files.as_deref(), "partitionFiles")?
            .iter()
            .enumerate()
        {
            let at = format!("partitionFiles[{j}]");
            let Value::Object(entry) = entry else {
                return Err(bad(
                    &at,
                    format!("expected an object, found {}", kind(entry)),
                ));
            };
            let name_field = format!("{at}.partitionName");
            let Some(name) = entry
                .get("partitionName")
                .map(|v| str_of(v, &name_field))
                .transpose()?
                .flatten()
            else {
                return Err(DecodeError::MissingField(name_field));
            };
            let values = uri::partition_values_in_key_order(name, &table.partition_keys).map_err(
                |source| DecodeError::BadPath {
                    field: name_field.clone(),
                    source,
                },
            )?;
            let Some(i) = partitions.iter().position(|p| {
                p.values.len() == values.len()
                    && p.values.iter().zip(&values).all(|(a, b)| same(a, b))
            }) else {
                return Err(bad(
                    &name_field,
                    format!("{name:?} is not among the added partitions"),
                ));
            };
            let files_field = format!("{at}.files");
            files[i].extend(files_of(
                array_of(entry.get("files"), &files_field)?,
                &files_field,
            )?);
        }
        Ok(HiveMessage::AddPartition {
            table,
            partitions,
            files,
        })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn gzip_vector_from_hive_md_decodes_to_test() {
        let text = decode_text("H4sIAAAAAAAA/ytJLS4BAAx+f9gEAAAA", Some("gzip(json-2.0)")).unwrap();
        assert_eq!(text, "test");
        let text = decode_text("H4sIAAAAAAAA/ytJLS4BAAx+f9gEAAAA", Some("gzip")).unwrap();
        assert_eq!(text, "test");
    }

    #[test]
    fn decompression_stops_at_the_limit() {
        use flate2::write::GzEncoder;
        use std::io::Write;
        let mut enc = GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&vec![b' '; 4 << 20]).unwrap();
        let b64 = BASE64.encode(enc.finish().unwrap());
        let e = decode_text_limited(&b64, Some("gzip"), 1 << 20).unwrap_err();
        assert_eq!(
            e,
            DecodeError::TooLarge {
                format: "gzip".into(),
                limit: 1 << 20
            }
        );
        assert!(decode_text_limited(&b64, Some("gzip"), 4 << 20).is_ok());
    }

    /// What `flate2::bufread::MultiGzDecoder` gives for `gz` (a fresh
    /// decoder per message, as before decoders were reused per thread).
    fn multi_gz_reference(gz: &[u8]) -> std::result::Result<Vec<u8>, String> {
        let mut out = Vec::new();
        flate2::bufread::MultiGzDecoder::new(gz)
            .read_to_end(&mut out)
            .map(|_| out)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn reused_decoder_reads_members_headers_and_corruption_as_multigzdecoder() {
        use flate2::{Compression, GzBuilder};
        use std::io::Write;
        let member = |data: &[u8], b: GzBuilder| {
            let mut enc = b.write(Vec::new(), Compression::default());
            enc.write_all(data).unwrap();
            enc.finish().unwrap()
        };
        let one = member(br#"{"a":"first"}"#, GzBuilder::new());
        let flagged = member(
            br#"{"b":2}"#,
            GzBuilder::new()
                .filename("m.json")
                .comment("c")
                .extra(vec![1, 2]),
        );
        let two = [one.clone(), flagged.clone()].concat();
        let mut inputs = vec![
            one.clone(),
            flagged.clone(),
            two.clone(),
            [two.clone(), member(b"", GzBuilder::new())].concat(),
            [one.clone(), vec![0]].concat(),
            [one.clone(), b"garbage".to_vec()].concat(),
            [one.clone(), vec![0x1f, 0x8b, 8, 0]].concat(),
            Vec::new(),
        ];
        for i in 0..two.len() {
            inputs.push(two[..i].to_vec());
            let mut flipped = two.clone();
            flipped[i] ^= 0x21;
            inputs.push(flipped);
        }
        // Good and bad messages alternate on this thread's one decoder.
        for gz in inputs.iter().flat_map(|bad| [bad, &two]) {
            let b64 = BASE64.encode(gz);
            let got = decode_text(&b64, Some("gzip"));
            let want = multi_gz_reference(gz);
            match (got, want) {
                (Ok(text), Ok(bytes)) => assert_eq!(text.as_bytes(), bytes, "{gz:?}"),
                (Err(DecodeError::BadGzip { reason, .. }), Err(want)) => {
                    assert_eq!(reason, want, "{gz:?}")
                }
                (Err(DecodeError::BadUtf8 { .. }), Ok(bytes)) => {
                    assert!(std::str::from_utf8(&bytes).is_err())
                }
                (got, want) => panic!("{gz:?}: {got:?} but MultiGzDecoder gives {want:?}"),
            }
        }
    }

    /// A row of `event_type` with a json-0.2 `message` (event 1).
    pub(in crate::source::hive) fn row(event_type: &str, message: &str) -> NotificationRow {
        NotificationRow {
            nl_id: None,
            event_id: 1,
            event_time: None,
            event_type: event_type.into(),
            cat_name: None,
            db_name: Some("row_db".into()),
            tbl_name: None,
            message: Some(message.into()),
            message_format: Some("json-0.2".into()),
        }
    }

    /// The messages of tests/data/hive-samples/ (JSON objects), each with
    /// every top-level field removed, null, or of each other JSON kind,
    /// repeated with another value, and cut short.
    fn sample_variants() -> Vec<String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/hive-samples");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("tests/data/hive-samples") {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            out.push(text.clone());
            for cut in [1, text.len() / 2, text.len() - 1] {
                out.push(text[..cut].to_string());
            }
            let others = [
                Value::Null,
                Value::Bool(true),
                serde_json::json!(7),
                serde_json::json!(1e300),
                serde_json::json!("x"),
                serde_json::json!("true"),
                serde_json::json!([]),
                serde_json::json!(["hdfs://nn/w/a.db/t/f"]),
                serde_json::json!([null]),
                serde_json::json!({}),
            ];
            for key in obj.keys() {
                let mut without = obj.clone();
                without.remove(key);
                out.push(Value::Object(without).to_string());
                for v in &others {
                    let mut with = obj.clone();
                    with.insert(key.clone(), v.clone());
                    out.push(Value::Object(with).to_string());
                }
                // The key again, with another value, after the rest.
                let body = text.trim_end().trim_end_matches('}');
                out.push(format!(
                    "{body}, {}: \"again\"}}",
                    Value::from(key.as_str())
                ));
            }
        }
        out.extend(
            [
                "",
                "[]",
                "\"a\"",
                "{}",
                "{\"db\":\"d\\u0062\"}",
                "{\"d\\u0062\":\"escaped key\"}",
                "{\"db\":\"d\"} x",
                "{\"txnid\":\"12\"}",
                "{\"txnid\":1.5}",
            ]
            .map(String::from),
        );
        out
    }

    #[test]
    fn raw_fields_decode_exactly_as_the_json_tree() {
        let variants = sample_variants();
        assert!(variants.len() > 500, "{} variants", variants.len());
        let mut differ = Vec::new();
        // Twice: the second pass meets each table object in the cache.
        for _ in 0..2 {
            for text in &variants {
                for t in MESSAGE_EVENT_TYPES
                    .into_iter()
                    .chain(["OPEN_TXN", "ABORT_TXN"])
                {
                    let r = row(t, text);
                    let raw = decode_message(&r);
                    let tree = decode_tree(&r, text);
                    if raw != tree {
                        differ.push(format!("{t} {text}: {raw:?} != {tree:?}"));
                    }
                }
            }
        }
        assert!(differ.is_empty(), "{}", differ.join("\n"));
    }

    #[test]
    fn a_cached_table_is_the_table_of_its_text() {
        let a = r#"{"1":{"str":"a"},"2":{"str":"d"},"8":{"lst":["rec",0]}}"#;
        let b = r#"{"1":{"str":"b"},"2":{"str":"d"},"8":{"lst":["rec",1,{"1":{"str":"k"},"2":{"str":"string"}}]}}"#;
        for text in [a, b, a, a, b] {
            let got = cached_table(TableText::Json, text, || {
                Ok(thrift::table_from_json(text).unwrap())
            })
            .unwrap();
            assert_eq!(got, thrift::table_from_json(text).unwrap());
        }
        // A failed parse is not kept.
        let e = cached_table(TableText::Json, "{", || {
            Err(DecodeError::MissingField("x".into()))
        });
        assert!(e.is_err());
        assert_eq!(
            cached_table(TableText::Json, b, || {
                Err(DecodeError::MissingField("not parsed".into()))
            })
            .unwrap(),
            thrift::table_from_json(b).unwrap()
        );
    }

    #[test]
    fn a_table_object_as_a_message_field_is_not_taken_for_a_txn_write_one() {
        let table = r#"{"1":{"str":"t"},"2":{"str":"d"},"8":{"lst":["rec",0]}}"#;
        let literal = Value::from(table).to_string();
        let message = format!(r#"{{"db":"d","table":"t","tableObjJson":{literal},"files":[]}}"#);
        let HiveMessage::CreateTable { .. } =
            decode_message(&row("CREATE_TABLE", &message)).unwrap()
        else {
            panic!("not a create table");
        };
        // The same text as WNL_TABLE_OBJ is a string, not a Table object.
        let write: TxnWriteRow = serde_json::from_value(serde_json::json!({
            "WNL_TXNID": 1, "WNL_DATABASE": "d", "WNL_TABLE": "t", "WNL_TABLE_OBJ": literal,
        }))
        .unwrap();
        assert!(matches!(
            decode_txn_write(&write),
            Err(DecodeError::BadThrift { .. })
        ));
    }

    #[test]
    fn unknown_format_is_an_error() {
        assert_eq!(
            decode_text("{}", Some("avro")).unwrap_err(),
            DecodeError::UnknownFormat("avro".into())
        );
    }
}
