//! A reader for Thrift's TJSONProtocol as Hive writes it inside notification
//! messages (`tableObjJson`, `ptnObjJson`, `partitionListJson[]`,
//! `tableObj{Before,After}Json`, `partitionObj{Before,After}Json`, `dbJson`)
//! and in `TXN_WRITE_NOTIFICATION_LOG` (`WNL_TABLE_OBJ`, `WNL_PARTITION_OBJ`).
//!
//! The encoding (docs/HIVE.md "Message formats"): a struct is
//! `{"<field id>":{"<type>":value},…}` with types `tf i8 i16 i32 i64 dbl str
//! rec lst set map`; a list or set is `["<elem type>",count,e1,…]`; a map is
//! `["<key type>","<value type>",count,{k:v,…}]`.
//!
//! This is a hand-written parser rather than serde_json because
//! TJSONProtocol is not always JSON: a map whose keys are lists or structs
//! (Hive's `SkewedInfo.skewedColValueLocationMaps` is `map<list<string>,string>`)
//! is written with bare `[…]` keys. Every element is checked against its
//! declared type and every count against the elements present; nesting is
//! bounded ([`MAX_DEPTH`]) so hostile input cannot overflow the stack.
//!
//! [`parse_struct`] gives the generic tree; [`table_from_json`],
//! [`partition_from_json`] and [`database_from_json`] pick out the fields the
//! Hive source uses. Called by `message` (and the adapter for bootstrap
//! objects); does no I/O.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use super::model::{HivePartition, HiveTable};

/// Deepest nesting of structs, lists and maps accepted (Hive's objects nest
/// about six levels).
pub const MAX_DEPTH: usize = 64;

/// A Thrift type tag as TJSONProtocol writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThriftType {
    Bool,
    I8,
    I16,
    I32,
    I64,
    Double,
    Str,
    Struct,
    List,
    Set,
    Map,
}

impl ThriftType {
    fn from_tag(tag: &str) -> Option<ThriftType> {
        Some(match tag {
            "tf" => ThriftType::Bool,
            "i8" => ThriftType::I8,
            "i16" => ThriftType::I16,
            "i32" => ThriftType::I32,
            "i64" => ThriftType::I64,
            "dbl" => ThriftType::Double,
            "str" => ThriftType::Str,
            "rec" => ThriftType::Struct,
            "lst" => ThriftType::List,
            "set" => ThriftType::Set,
            "map" => ThriftType::Map,
            _ => return None,
        })
    }

    pub fn tag(self) -> &'static str {
        match self {
            ThriftType::Bool => "tf",
            ThriftType::I8 => "i8",
            ThriftType::I16 => "i16",
            ThriftType::I32 => "i32",
            ThriftType::I64 => "i64",
            ThriftType::Double => "dbl",
            ThriftType::Str => "str",
            ThriftType::Struct => "rec",
            ThriftType::List => "lst",
            ThriftType::Set => "set",
            ThriftType::Map => "map",
        }
    }
}

/// One decoded Thrift value.
#[derive(Debug, Clone, PartialEq)]
pub enum ThriftValue {
    Bool(bool),
    /// Any of i8, i16, i32, i64 (range-checked against its declared type).
    Int(i64),
    Double(f64),
    Str(String),
    Struct(ThriftStruct),
    /// A list or a set.
    List {
        elem: ThriftType,
        items: Vec<ThriftValue>,
    },
    Map {
        key: ThriftType,
        value: ThriftType,
        entries: Vec<(ThriftValue, ThriftValue)>,
    },
}

impl ThriftValue {
    fn type_name(&self) -> &'static str {
        match self {
            ThriftValue::Bool(_) => "tf",
            ThriftValue::Int(_) => "an integer",
            ThriftValue::Double(_) => "dbl",
            ThriftValue::Str(_) => "str",
            ThriftValue::Struct(_) => "rec",
            ThriftValue::List { .. } => "lst",
            ThriftValue::Map { .. } => "map",
        }
    }
}

/// A Thrift struct: field id → value.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ThriftStruct {
    pub fields: BTreeMap<i16, ThriftValue>,
}

/// What is wrong with a Thrift-JSON text, where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ThriftError {
    /// Byte offset into the text, when the error is a syntax error.
    pub offset: Option<usize>,
    /// Field ids from the outermost struct inwards (`7.2` = field 2 of field 7).
    pub path: Vec<String>,
    pub reason: String,
}

impl fmt::Display for ThriftError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.path.is_empty() {
            write!(f, "field {}: ", self.path.join("."))?;
        }
        f.write_str(&self.reason)?;
        if let Some(offset) = self.offset {
            write!(f, " (at byte {offset})")?;
        }
        Ok(())
    }
}

impl ThriftError {
    fn in_field(mut self, segment: String) -> ThriftError {
        self.path.insert(0, segment);
        self
    }

    fn semantic(path: &[&str], reason: String) -> ThriftError {
        ThriftError {
            offset: None,
            path: path.iter().map(|s| s.to_string()).collect(),
            reason,
        }
    }
}

/// Parses one Thrift-JSON struct (the whole text).
pub fn parse_struct(text: &str) -> Result<ThriftStruct, ThriftError> {
    let mut p = Parser {
        s: text.as_bytes(),
        text,
        pos: 0,
        depth: 0,
    };
    p.skip_ws();
    let st = p.parse_struct_body()?;
    p.skip_ws();
    if p.pos != p.s.len() {
        return Err(p.err("unexpected text after the struct".into()));
    }
    Ok(st)
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, reason: String) -> ThriftError {
        ThriftError {
            offset: Some(self.pos),
            path: Vec::new(),
            reason,
        }
    }

    fn skip_ws(&mut self) {
        while let Some(b) = self.s.get(self.pos) {
            if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.pos).copied()
    }

    fn expect(&mut self, c: u8) -> Result<(), ThriftError> {
        match self.peek() {
            Some(b) if b == c => {
                self.pos += 1;
                Ok(())
            }
            Some(b) => Err(self.err(format!(
                "expected '{}', found '{}'",
                c as char,
                char::from(b).escape_default()
            ))),
            None => Err(self.err(format!("expected '{}', found the end", c as char))),
        }
    }

    fn enter(&mut self) -> Result<(), ThriftError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    /// A JSON string, unescaped.
    fn string(&mut self) -> Result<String, ThriftError> {
        Ok(self.str_ref()?.into_owned())
    }

    /// A JSON string, unescaped; borrowed from the text when it has no
    /// escape (type tags, field ids and most values), so reading it does
    /// not allocate.
    fn str_ref(&mut self) -> Result<Cow<'a, str>, ThriftError> {
        if self.peek() != Some(b'"') {
            return Err(self.err("expected a string".into()));
        }
        let start = self.pos;
        let mut i = start + 1;
        let mut escaped = false;
        loop {
            match self.s.get(i) {
                None => return Err(self.err("unterminated string".into())),
                Some(b'\\') => {
                    escaped = true;
                    i += 2;
                }
                Some(b'"') => break,
                Some(_) => i += 1,
            }
        }
        // Quotes and backslashes are ASCII, so `start..=i` lies on char boundaries.
        let text: &'a str = self.text;
        let raw = &text[start..=i];
        let out = if escaped {
            Cow::Owned(
                serde_json::from_str::<String>(raw)
                    .map_err(|e| self.err(format!("bad string escape: {e}")))?,
            )
        } else {
            Cow::Borrowed(&raw[1..raw.len() - 1])
        };
        self.pos = i + 1;
        Ok(out)
    }

    /// The raw text of a JSON number (or of a quoted number).
    fn number_text(&mut self) -> Result<Cow<'a, str>, ThriftError> {
        if self.peek() == Some(b'"') {
            return self.str_ref();
        }
        let start = self.pos;
        while let Some(b) = self.s.get(self.pos) {
            if matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                self.pos += 1;
            } else {
                break;
            }
        }
        if start == self.pos {
            return Err(self.err("expected a number".into()));
        }
        let text: &'a str = self.text;
        Ok(Cow::Borrowed(&text[start..self.pos]))
    }

    fn integer(&mut self, ty: ThriftType) -> Result<i64, ThriftError> {
        let at = self.pos;
        let text = self.number_text()?;
        let v: i64 = text.parse().map_err(|_| ThriftError {
            offset: Some(at),
            path: Vec::new(),
            reason: format!("{text:?} is not an integer"),
        })?;
        let (lo, hi) = match ty {
            ThriftType::I8 => (i8::MIN as i64, i8::MAX as i64),
            ThriftType::I16 => (i16::MIN as i64, i16::MAX as i64),
            ThriftType::I32 => (i32::MIN as i64, i32::MAX as i64),
            _ => (i64::MIN, i64::MAX),
        };
        if v < lo || v > hi {
            return Err(ThriftError {
                offset: Some(at),
                path: Vec::new(),
                reason: format!("{v} is out of range for {}", ty.tag()),
            });
        }
        Ok(v)
    }

    fn count(&mut self) -> Result<usize, ThriftError> {
        let at = self.pos;
        let n = self.integer(ThriftType::I32)?;
        usize::try_from(n).map_err(|_| ThriftError {
            offset: Some(at),
            path: Vec::new(),
            reason: format!("negative element count {n}"),
        })
    }

    fn type_tag(&mut self) -> Result<ThriftType, ThriftError> {
        let at = self.pos;
        let tag = self.str_ref()?;
        ThriftType::from_tag(&tag).ok_or_else(|| ThriftError {
            offset: Some(at),
            path: Vec::new(),
            reason: format!("unknown type tag {tag:?}"),
        })
    }

    fn value(&mut self, ty: ThriftType) -> Result<ThriftValue, ThriftError> {
        Ok(match ty {
            ThriftType::Bool => {
                let at = self.pos;
                match self.peek() {
                    Some(b't') | Some(b'f') => {
                        let word = self.word();
                        match word.as_str() {
                            "true" => ThriftValue::Bool(true),
                            "false" => ThriftValue::Bool(false),
                            _ => {
                                return Err(ThriftError {
                                    offset: Some(at),
                                    path: Vec::new(),
                                    reason: format!("{word:?} is not a tf value"),
                                })
                            }
                        }
                    }
                    _ => match self.integer(ThriftType::I64)? {
                        0 => ThriftValue::Bool(false),
                        1 => ThriftValue::Bool(true),
                        n => {
                            return Err(ThriftError {
                                offset: Some(at),
                                path: Vec::new(),
                                reason: format!("{n} is not a tf value (0 or 1)"),
                            })
                        }
                    },
                }
            }
            ThriftType::I8 | ThriftType::I16 | ThriftType::I32 | ThriftType::I64 => {
                ThriftValue::Int(self.integer(ty)?)
            }
            ThriftType::Double => {
                let at = self.pos;
                let text = self.number_text()?;
                let v = match &*text {
                    "NaN" => f64::NAN,
                    "Infinity" => f64::INFINITY,
                    "-Infinity" => f64::NEG_INFINITY,
                    _ => text.parse().map_err(|_| ThriftError {
                        offset: Some(at),
                        path: Vec::new(),
                        reason: format!("{text:?} is not a dbl"),
                    })?,
                };
                ThriftValue::Double(v)
            }
            ThriftType::Str => ThriftValue::Str(self.string()?),
            ThriftType::Struct => ThriftValue::Struct(self.parse_struct_body()?),
            ThriftType::List | ThriftType::Set => self.list()?,
            ThriftType::Map => self.map()?,
        })
    }

    fn word(&mut self) -> String {
        let start = self.pos;
        while let Some(b) = self.s.get(self.pos) {
            if b.is_ascii_alphabetic() {
                self.pos += 1;
            } else {
                break;
            }
        }
        self.text[start..self.pos].to_string()
    }

    fn list(&mut self) -> Result<ThriftValue, ThriftError> {
        self.enter()?;
        self.expect(b'[')?;
        let elem = self.type_tag()?;
        self.expect(b',')?;
        let count = self.count()?;
        let mut items = Vec::with_capacity(count.min(1024));
        for i in 0..count {
            if self.peek() != Some(b',') {
                return Err(self.err(format!("the list declares {count} elements but has {i}")));
            }
            self.pos += 1;
            items.push(self.value(elem).map_err(|e| e.in_field(format!("[{i}]")))?);
        }
        if self.peek() == Some(b',') {
            return Err(self.err(format!("the list declares {count} elements but has more")));
        }
        self.expect(b']')?;
        self.leave();
        Ok(ThriftValue::List { elem, items })
    }

    fn map(&mut self) -> Result<ThriftValue, ThriftError> {
        self.enter()?;
        self.expect(b'[')?;
        let key = self.type_tag()?;
        self.expect(b',')?;
        let value = self.type_tag()?;
        self.expect(b',')?;
        let count = self.count()?;
        self.expect(b',')?;
        self.expect(b'{')?;
        let mut entries = Vec::with_capacity(count.min(1024));
        if self.peek() != Some(b'}') {
            loop {
                let k = self.map_key(key)?;
                self.expect(b':')?;
                let v = self
                    .value(value)
                    .map_err(|e| e.in_field(format!("[{k:?}]")))?;
                entries.push((k, v));
                if self.peek() == Some(b',') {
                    self.pos += 1;
                } else {
                    break;
                }
            }
        }
        self.expect(b'}')?;
        if entries.len() != count {
            return Err(self.err(format!(
                "the map declares {count} entries but has {}",
                entries.len()
            )));
        }
        self.expect(b']')?;
        self.leave();
        Ok(ThriftValue::Map {
            key,
            value,
            entries,
        })
    }

    /// Map keys: strings as strings, numbers and booleans quoted, lists and
    /// structs written bare (not valid JSON, but what TJSONProtocol writes).
    fn map_key(&mut self, ty: ThriftType) -> Result<ThriftValue, ThriftError> {
        match ty {
            ThriftType::Str => Ok(ThriftValue::Str(self.string()?)),
            ThriftType::Bool if self.peek() == Some(b'"') => {
                let at = self.pos;
                match self.string()?.as_str() {
                    "1" | "true" => Ok(ThriftValue::Bool(true)),
                    "0" | "false" => Ok(ThriftValue::Bool(false)),
                    other => Err(ThriftError {
                        offset: Some(at),
                        path: Vec::new(),
                        reason: format!("{other:?} is not a tf key"),
                    }),
                }
            }
            _ => self.value(ty),
        }
    }

    fn parse_struct_body(&mut self) -> Result<ThriftStruct, ThriftError> {
        self.enter()?;
        self.expect(b'{')?;
        let mut st = ThriftStruct::default();
        if self.peek() != Some(b'}') {
            loop {
                let at = self.pos;
                let id_text = self.str_ref()?;
                let id: i16 = id_text.parse().map_err(|_| ThriftError {
                    offset: Some(at),
                    path: Vec::new(),
                    reason: format!("field id {id_text:?} is not an i16"),
                })?;
                self.expect(b':')?;
                let v = self.typed_value().map_err(|e| e.in_field(id.to_string()))?;
                if st.fields.insert(id, v).is_some() {
                    return Err(ThriftError {
                        offset: Some(at),
                        path: Vec::new(),
                        reason: format!("field {id} appears twice"),
                    });
                }
                if self.peek() == Some(b',') {
                    self.pos += 1;
                } else {
                    break;
                }
            }
        }
        self.expect(b'}')?;
        self.leave();
        Ok(st)
    }

    /// `{"<type>":value}`
    fn typed_value(&mut self) -> Result<ThriftValue, ThriftError> {
        self.expect(b'{')?;
        let ty = self.type_tag()?;
        self.expect(b':')?;
        let v = self.value(ty)?;
        self.expect(b'}')?;
        Ok(v)
    }
}

/// Typed access to the fields of a struct, with errors naming the field.
struct Fields<'a> {
    st: &'a ThriftStruct,
    /// Path of this struct from the outermost one (`7` for a table's sd).
    path: Vec<&'a str>,
}

impl<'a> Fields<'a> {
    fn path_with(&self, field: &'a str) -> Vec<&'a str> {
        let mut p = self.path.clone();
        p.push(field);
        p
    }

    fn wrong_type(&self, field: &'a str, want: &str, got: &ThriftValue) -> ThriftError {
        ThriftError::semantic(
            &self.path_with(field),
            format!("expected {want}, found {}", got.type_name()),
        )
    }

    fn get(&self, id: i16) -> Option<&'a ThriftValue> {
        self.st.fields.get(&id)
    }

    fn opt_str(&self, id: i16, field: &'a str) -> Result<Option<String>, ThriftError> {
        match self.get(id) {
            None => Ok(None),
            Some(ThriftValue::Str(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.wrong_type(field, "str", other)),
        }
    }

    fn req_str(&self, id: i16, field: &'a str) -> Result<String, ThriftError> {
        self.opt_str(id, field)?.ok_or_else(|| {
            ThriftError::semantic(&self.path, format!("missing required field {field}"))
        })
    }

    fn opt_struct(&self, id: i16, field: &'a str) -> Result<Option<Fields<'a>>, ThriftError> {
        match self.get(id) {
            None => Ok(None),
            Some(ThriftValue::Struct(st)) => Ok(Some(Fields {
                st,
                path: self.path_with(field),
            })),
            Some(other) => Err(self.wrong_type(field, "rec", other)),
        }
    }

    fn opt_str_list(&self, id: i16, field: &'a str) -> Result<Option<Vec<String>>, ThriftError> {
        match self.get(id) {
            None => Ok(None),
            Some(ThriftValue::List { items, .. }) => items
                .iter()
                .map(|v| match v {
                    ThriftValue::Str(s) => Ok(s.clone()),
                    other => Err(self.wrong_type(field, "a list of str", other)),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => Err(self.wrong_type(field, "lst", other)),
        }
    }

    fn opt_str_map(
        &self,
        id: i16,
        field: &'a str,
    ) -> Result<Option<BTreeMap<String, String>>, ThriftError> {
        match self.get(id) {
            None => Ok(None),
            Some(ThriftValue::Map { entries, .. }) => entries
                .iter()
                .map(|(k, v)| match (k, v) {
                    (ThriftValue::Str(k), ThriftValue::Str(v)) => Ok((k.clone(), v.clone())),
                    (ThriftValue::Str(_), other) | (other, _) => {
                        Err(self.wrong_type(field, "a map of str to str", other))
                    }
                })
                .collect::<Result<BTreeMap<_, _>, _>>()
                .map(Some),
            Some(other) => Err(self.wrong_type(field, "map", other)),
        }
    }
}

/// A database as Hive describes it in `dbJson`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HiveDatabase {
    pub name: String,
    /// `locationUri` (field 3).
    pub location: Option<String>,
    /// `managedLocationUri` (field 10, Hive 4).
    pub managed_location: Option<String>,
}

/// Database: 1 name, 3 locationUri, 10 managedLocationUri.
pub fn database_from_json(text: &str) -> Result<HiveDatabase, ThriftError> {
    let st = parse_struct(text)?;
    let f = Fields {
        st: &st,
        path: Vec::new(),
    };
    Ok(HiveDatabase {
        name: f.req_str(1, "1 (name)")?,
        location: f.opt_str(3, "3 (locationUri)")?,
        managed_location: f.opt_str(10, "10 (managedLocationUri)")?,
    })
}

/// Table: 1 tableName, 2 dbName, 7 sd (2 location), 8 partitionKeys (list of
/// FieldSchema, 1 name), 9 parameters, 12 tableType.
pub fn table_from_json(text: &str) -> Result<HiveTable, ThriftError> {
    let st = parse_struct(text)?;
    table_from_struct(&st)
}

pub fn table_from_struct(st: &ThriftStruct) -> Result<HiveTable, ThriftError> {
    let f = Fields {
        st,
        path: Vec::new(),
    };
    let location = match f.opt_struct(7, "7 (sd)")? {
        Some(sd) => sd.opt_str(2, "2 (location)")?,
        None => None,
    };
    let mut partition_keys = Vec::new();
    match f.get(8) {
        None => {}
        Some(ThriftValue::List { items, .. }) => {
            for (i, item) in items.iter().enumerate() {
                let ThriftValue::Struct(schema) = item else {
                    return Err(f.wrong_type("8 (partitionKeys)", "a list of rec", item));
                };
                let index = format!("8 (partitionKeys)[{i}]");
                let key = Fields {
                    st: schema,
                    path: vec![index.as_str()],
                };
                partition_keys.push(key.req_str(1, "1 (name)")?);
            }
        }
        Some(other) => return Err(f.wrong_type("8 (partitionKeys)", "lst", other)),
    }
    Ok(HiveTable {
        name: f.req_str(1, "1 (tableName)")?,
        db: f.req_str(2, "2 (dbName)")?,
        partition_keys,
        location,
        table_type: f.opt_str(12, "12 (tableType)")?,
        parameters: f.opt_str_map(9, "9 (parameters)")?.unwrap_or_default(),
    })
}

/// A Thrift-JSON Table object's catalog: field 17 (`catName`, Hive 3 and
/// later), None when absent.
pub fn table_catalog_from_json(text: &str) -> Result<Option<String>, ThriftError> {
    let st = parse_struct(text)?;
    let f = Fields {
        st: &st,
        path: Vec::new(),
    };
    f.opt_str(17, "17 (catName)")
}

/// Partition: 1 values (list of str, in key order), 6 sd (2 location).
pub fn partition_from_json(text: &str) -> Result<HivePartition, ThriftError> {
    let st = parse_struct(text)?;
    let f = Fields {
        st: &st,
        path: Vec::new(),
    };
    let values = f.opt_str_list(1, "1 (values)")?.ok_or_else(|| {
        ThriftError::semantic(&[], "missing required field 1 (values)".to_string())
    })?;
    let location = match f.opt_struct(6, "6 (sd)")? {
        Some(sd) => sd.opt_str(2, "2 (location)")?,
        None => None,
    };
    Ok(HivePartition { values, location })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = r#"{"1":{"str":"orders"},"2":{"str":"sales"},"4":{"i32":1700000000},"7":{"rec":{"1":{"lst":["rec",1,{"1":{"str":"id"},"2":{"str":"bigint"}}]},"2":{"str":"hdfs://nn/w/sales.db/orders"},"5":{"tf":0},"11":{"rec":{"3":{"map":["lst","str",0,{}]}}}}},"8":{"lst":["rec",2,{"1":{"str":"ds"},"2":{"str":"string"}},{"1":{"str":"hr"},"2":{"str":"int"}}]},"9":{"map":["str","str",1,{"transactional":"true"}]},"12":{"str":"MANAGED_TABLE"},"19":{"i64":0}}"#;

    #[test]
    fn table_fields_are_extracted() {
        let t = table_from_json(TABLE).unwrap();
        assert_eq!(t.name, "orders");
        assert_eq!(t.db, "sales");
        assert_eq!(t.partition_keys, vec!["ds", "hr"]);
        assert_eq!(t.location.as_deref(), Some("hdfs://nn/w/sales.db/orders"));
        assert_eq!(t.table_type.as_deref(), Some("MANAGED_TABLE"));
        assert_eq!(
            t.parameters.get("transactional").map(String::as_str),
            Some("true")
        );
    }

    #[test]
    fn partition_values_and_location_are_extracted() {
        let p = partition_from_json(
            r#"{"1":{"lst":["str",2,"2024-01-01","a\"b\u00e9"]},"6":{"rec":{"2":{"str":"hdfs://x/p"}}}}"#,
        )
        .unwrap();
        assert_eq!(p.values, vec!["2024-01-01", "a\"bé"]);
        assert_eq!(p.location.as_deref(), Some("hdfs://x/p"));
    }

    #[test]
    fn map_with_bare_list_keys_is_read_as_tjsonprotocol_writes_it() {
        let st =
            parse_struct(r#"{"3":{"map":["lst","str",1,{["str",1,"a"]:"hdfs://x/a"}]}}"#).unwrap();
        let ThriftValue::Map { entries, .. } = &st.fields[&3] else {
            panic!("not a map")
        };
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].1, ThriftValue::Str("hdfs://x/a".into()));
    }

    #[test]
    fn all_scalar_types_parse() {
        let st = parse_struct(
            r#"{"1":{"tf":1},"2":{"i8":-128},"3":{"i16":32767},"4":{"i32":-5},"5":{"i64":9007199254740993},"6":{"dbl":1.5},"7":{"dbl":"NaN"},"8":{"set":["i32",2,1,2]},"9":{"map":["i32","tf",1,{"7":0}]}}"#,
        )
        .unwrap();
        assert_eq!(st.fields[&1], ThriftValue::Bool(true));
        assert_eq!(st.fields[&5], ThriftValue::Int(9007199254740993));
        assert_eq!(st.fields[&6], ThriftValue::Double(1.5));
        assert!(matches!(st.fields[&7], ThriftValue::Double(d) if d.is_nan()));
    }

    #[test]
    fn wrong_type_tag_is_named() {
        let e = table_from_json(r#"{"1":{"i32":5},"2":{"str":"s"}}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "field 1 (tableName): expected str, found an integer"
        );
        let e = parse_struct(r#"{"1":{"text":"x"}}"#).unwrap_err();
        assert!(e.to_string().contains("unknown type tag \"text\""), "{e}");
        assert_eq!(e.path, vec!["1"]);
    }

    #[test]
    fn bad_counts_are_rejected() {
        let e = parse_struct(r#"{"1":{"lst":["str",2,"a"]}}"#).unwrap_err();
        assert!(
            e.to_string().contains("declares 2 elements but has 1"),
            "{e}"
        );
        let e = parse_struct(r#"{"1":{"lst":["str",1,"a","b"]}}"#).unwrap_err();
        assert!(
            e.to_string().contains("declares 1 elements but has more"),
            "{e}"
        );
        let e = parse_struct(r#"{"1":{"map":["str","str",2,{"a":"b"}]}}"#).unwrap_err();
        assert!(
            e.to_string().contains("declares 2 entries but has 1"),
            "{e}"
        );
        let e = parse_struct(r#"{"1":{"lst":["str",-1]}}"#).unwrap_err();
        assert!(e.to_string().contains("negative element count"), "{e}");
    }

    #[test]
    fn out_of_range_integers_are_rejected() {
        let e = parse_struct(r#"{"1":{"i8":128}}"#).unwrap_err();
        assert!(e.to_string().contains("out of range for i8"), "{e}");
        let e = parse_struct(r#"{"1":{"tf":2}}"#).unwrap_err();
        assert!(e.to_string().contains("not a tf value"), "{e}");
    }

    #[test]
    fn missing_required_fields_are_named() {
        let e = table_from_json(r#"{"1":{"str":"t"}}"#).unwrap_err();
        assert_eq!(e.to_string(), "missing required field 2 (dbName)");
        let e = partition_from_json(r#"{"2":{"str":"db"}}"#).unwrap_err();
        assert_eq!(e.to_string(), "missing required field 1 (values)");
        let e = table_from_json(
            r#"{"1":{"str":"t"},"2":{"str":"d"},"8":{"lst":["rec",1,{"2":{"str":"string"}}]}}"#,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "field 8 (partitionKeys)[0]: missing required field 1 (name)"
        );
        let e = table_from_json(r#"{"1":{"str":"t"},"2":{"str":"d"},"7":{"rec":{"2":{"i32":1}}}}"#)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "field 7 (sd).2 (location): expected str, found an integer"
        );
    }

    #[test]
    fn syntax_errors_carry_an_offset() {
        let e = parse_struct(r#"{"1":{"str":"a"}"#).unwrap_err();
        assert_eq!(e.offset, Some(16));
        assert!(parse_struct("").is_err());
        assert!(parse_struct(r#"{"1":{"str":"a"}} x"#).is_err());
        assert!(parse_struct(r#"{"1":{"str":"a"},"1":{"str":"b"}}"#).is_err());
        assert!(parse_struct(r#"{"x":{"str":"a"}}"#).is_err());
        assert!(parse_struct(r#"{"1":{"str":"a\"}}"#).is_err());
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let mut s = String::new();
        for _ in 0..10_000 {
            s.push_str(r#"{"1":{"rec":"#);
        }
        let e = parse_struct(&s).unwrap_err();
        assert!(e.reason.contains("nested deeper"), "{e}");
    }

    #[test]
    fn database_name_and_locations() {
        let d = database_from_json(
            r#"{"1":{"str":"sales"},"3":{"str":"hdfs://x/ext/sales.db"},"4":{"map":["str","str",0,{}]},"10":{"str":"hdfs://x/managed/sales.db"}}"#,
        )
        .unwrap();
        assert_eq!(d.name, "sales");
        assert_eq!(d.location.as_deref(), Some("hdfs://x/ext/sales.db"));
        assert_eq!(
            d.managed_location.as_deref(),
            Some("hdfs://x/managed/sales.db")
        );
    }
}
