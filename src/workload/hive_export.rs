//! Writes what Hive's `DbNotificationListener` would for a warehouse that
//! changes by native events: `NOTIFICATION_LOG` rows (and
//! `TXN_WRITE_NOTIFICATION_LOG` rows for transactions) as `--hive-events`
//! JSON Lines, with Hive's message JSON, Thrift-JSON table and partition
//! objects, encoded file URIs carrying HDFS checksums and a
//! change-management root.
//!
//! Used by `stagefs demo --hive`, the tests that replay the same warehouse
//! through native events and through Hive rows, and the benchmarks. Not
//! used by replication itself.
//!
//! Besides native events, [`HiveWriter::write_event`] takes what only Hive
//! does: a `create_table` followed by the files a CREATE TABLE AS SELECT
//! wrote (one event, one CREATE_TABLE row), a partition rename
//! ([`Op::RenamePartition`], an ALTER_PARTITION row), external tables
//! (a `create_table` or [`Op::MarkTable`] with `not_in_log` set) and an
//! EXCHANGE PARTITION (one event: [`Op::AddPartition`] of each partition
//! into the destination with its files, then [`Op::DropPartition`] of each
//! from the source; written as Hive's metastore writes it, an
//! ADD_PARTITION row naming the files at their place in the destination,
//! then one DROP_PARTITION row per partition, at the event's id and the
//! ids after it).
//!
//! Layout: the warehouse's files stay where the native workload wrote them
//! (`hdfs://stagefs-demo:8020/warehouse/<path>` maps to the source root);
//! every file named gets a change-management copy (a hard link)
//! `<hive cm>/<name>_<checksum>` as it is written, so later states can
//! still fetch the bytes an earlier state had. Native ids may have gaps,
//! Hive's may not: missing ids become `OPEN_TXN` rows (no data change),
//! so every native state-id names the same content through both sources.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use base64::Engine;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::catalog::{DirKind, Tree};
use crate::event::{escape_path_name, BlobId, Change, Event, FileRef, Op};
use crate::source::hive::checksum::{CrcType, HdfsChecksum, HdfsChecksummer};

/// URI prefix of the warehouse files.
pub const WAREHOUSE_URI: &str = "hdfs://stagefs-demo:8020/warehouse";
/// URI of the change-management root.
pub const CM_URI: &str = "hdfs://stagefs-demo:8020/user/hive/cmroot";

/// The files one transaction writes into one table or partition.
#[derive(Debug, Clone)]
pub struct TxnFiles {
    pub db: String,
    pub table: String,
    /// `key → value`; None for an unpartitioned table.
    pub partition: Option<std::collections::BTreeMap<String, String>>,
    /// Files relative to the source root, with the ACID subdirectory they
    /// sit in (`delta_…`), or None.
    pub files: Vec<(FileRef, Option<String>)>,
}

/// See the module docs.
pub struct HiveWriter {
    out: File,
    source_root: PathBuf,
    /// Where the native workload keeps replaced files (`<name>_<sha256>`).
    native_cm: Option<PathBuf>,
    hive_cm: PathBuf,
    gzip: bool,
    /// Put HDFS checksums (and the cm root) in file URIs; off: `path###subdir`,
    /// as with change management off.
    checksums: bool,
    /// The warehouse after the events written so far (for partition keys).
    tree: Tree,
    next_id: i64,
    next_txn: i64,
    next_wnl: i64,
}

fn other(msg: String) -> io::Error {
    io::Error::other(msg)
}

impl HiveWriter {
    /// The writer for a workload folder `root` as `Workload` lays it out
    /// (`root/source`, its cm copies in `root/cm`), appending rows to `out`
    /// and its own cm copies to `root/hive-cm`.
    pub fn for_workload(root: &Path, out: &Path, gzip: bool) -> io::Result<HiveWriter> {
        HiveWriter::new(
            out,
            &root.join("source"),
            Some(&root.join("cm")),
            &root.join("hive-cm"),
            gzip,
        )
    }

    /// Appends rows to `out`; files are read under `source_root` (or from
    /// `native_cm`), cm copies go to `hive_cm`. `gzip`: messages in
    /// `gzip(json-2.0)`, else `json-0.2`.
    pub fn new(
        out: &Path,
        source_root: &Path,
        native_cm: Option<&Path>,
        hive_cm: &Path,
        gzip: bool,
    ) -> io::Result<HiveWriter> {
        fs::create_dir_all(hive_cm)?;
        if let Some(dir) = out.parent() {
            fs::create_dir_all(dir)?;
        }
        Ok(HiveWriter {
            out: OpenOptions::new().create(true).append(true).open(out)?,
            source_root: source_root.to_owned(),
            native_cm: native_cm.map(Path::to_owned),
            hive_cm: hive_cm.to_owned(),
            gzip,
            checksums: true,
            tree: Tree::empty(),
            next_id: 1,
            next_txn: 1,
            next_wnl: 1,
        })
    }

    /// The `--source-map` arguments that find these files.
    pub fn source_map_args(&self) -> Vec<String> {
        vec![
            format!("{WAREHOUSE_URI}={}", self.source_root.display()),
            format!("{CM_URI}={}", self.hive_cm.display()),
        ]
    }

    /// Whether the next files' URIs carry checksums (default: yes).
    pub fn set_checksums(&mut self, on: bool) {
        self.checksums = on;
    }

    /// The warehouse after the rows written so far: what a replica must
    /// show at the last id (the oracle of tests that write Hive rows).
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// The next EVENT_ID this writer will use.
    pub fn next_id(&self) -> i64 {
        self.next_id
    }

    /// Writes the rows for one native event at its id (filling any gap
    /// before it with `OPEN_TXN` rows). Rows are flushed but not fsynced.
    pub fn write_event(&mut self, e: &Event) -> io::Result<()> {
        let id = e.id.0 as i64;
        if id < self.next_id {
            return Err(other(format!(
                "event {id} comes after event {}",
                self.next_id - 1
            )));
        }
        let secs = e.time_ms.map_or(0, |t| t / 1000);
        let mut text = String::new();
        let exchange = exchange_shape(&e.changes);
        while self.next_id < id {
            let txn = self.next_txn;
            self.next_txn += 1;
            let row = self.row(
                self.next_id,
                secs,
                "OPEN_TXN",
                None,
                None,
                json!({"txnIds": [txn], "timestamp": secs, "server": "", "servicePrincipal": ""}),
            );
            text.push_str(&row);
            self.next_id += 1;
        }
        let (event_type, db, table, message) = match e.changes.as_slice() {
            _ if exchange.is_some() => self.exchange_add(&e.changes, secs)?,
            [] => {
                let txn = self.next_txn;
                self.next_txn += 1;
                (
                    "OPEN_TXN",
                    None,
                    None,
                    json!({"txnIds": [txn], "timestamp": secs, "server": "", "servicePrincipal": ""}),
                )
            }
            [c] => self.message(c, secs)?,
            [create, files @ ..]
                if create.op == Op::CreateTable
                    && files.iter().all(|f| {
                        matches!(f.op, Op::AddFiles | Op::AddPartition)
                            && (&f.db, &f.table) == (&create.db, &create.table)
                    }) =>
            {
                self.ctas_message(create, files, secs)?
            }
            _ => {
                return Err(other(format!(
                    "event {id} has several changes; write transactions with write_txn"
                )))
            }
        };
        text.push_str(&self.row(id, secs, event_type, db, table, message));
        let mut last = id;
        if let Some(k) = exchange {
            for drop in &e.changes[k..] {
                last += 1;
                let (event_type, db, table, message) = self.message(drop, secs)?;
                text.push_str(&self.row(last, secs, event_type, db, table, message));
            }
        }
        self.out.write_all(text.as_bytes())?;
        self.out.flush()?;
        let (tree, _) = self
            .tree
            .apply(e)
            .map_err(|err| other(format!("event {id} does not apply: {err}")))?;
        self.tree = tree;
        self.next_id = last + 1;
        Ok(())
    }

    /// The ADD_PARTITION row of an EXCHANGE PARTITION (`changes` as
    /// [`exchange_shape`] accepts them): every partition added to the
    /// destination, each naming its files where Hive moved them (the
    /// partition's directory below the destination's location; the bytes
    /// are linked there, the native workload's copy is left where it is).
    fn exchange_add(
        &mut self,
        changes: &[Change],
        secs: i64,
    ) -> io::Result<(&'static str, Option<String>, Option<String>, Value)> {
        let adds = &changes[..changes.len() / 2];
        let (db, t) = (adds[0].db.clone(), adds[0].table.clone());
        let keys = self.keys(&db, &t)?;
        let (mut specs, mut objs, mut files) = (Vec::new(), Vec::new(), Vec::new());
        for c in adds {
            let values: Vec<String> = keys
                .iter()
                .map(|k| {
                    c.partition
                        .as_ref()
                        .and_then(|p| p.get(k))
                        .cloned()
                        .unwrap_or_default()
                })
                .collect();
            let name = partition_name(&keys, &values);
            let mut uris = Vec::with_capacity(c.files.len());
            for f in &c.files {
                let below = match &f.subdir {
                    Some(sub) => format!("{sub}/{}", f.name),
                    None => f.name.clone(),
                };
                let rel = format!("{db}.db/{t}/{name}/{below}");
                uris.push(self.file_uri_at(f, f.subdir.as_deref(), &rel)?);
            }
            let spec: serde_json::Map<String, Value> = keys
                .iter()
                .zip(&values)
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            specs.push(Value::Object(spec));
            objs.push(Value::String(partition_obj(&db, &t, &keys, &values)));
            files.push(json!({"partitionName": name, "files": uris}));
        }
        let external = self.external(&db, &t);
        Ok((
            "ADD_PARTITION",
            Some(db.clone()),
            Some(t.clone()),
            json!({
                "server": "thrift://stagefs-demo:9083", "servicePrincipal": "", "db": db,
                "table": t, "tableType": table_type(external),
                "tableObjJson": table_obj(&db, &t, &keys, external),
                "timestamp": secs, "partitions": specs, "partitionListJson": objs,
                "partitionFiles": files,
            }),
        ))
    }

    /// Writes one transaction: a `TXN_WRITE_NOTIFICATION_LOG` row per
    /// table or partition, then its `COMMIT_TXN` row at the next id.
    /// Returns that id.
    pub fn write_txn(&mut self, time_secs: i64, writes: &[TxnFiles]) -> io::Result<i64> {
        let txn = self.next_txn;
        self.next_txn += 1;
        let mut text = String::new();
        let mut changes = Vec::new();
        for (i, w) in writes.iter().enumerate() {
            let keys = self.keys(&w.db, &w.table)?;
            let table_obj = table_obj(&w.db, &w.table, &keys, self.external(&w.db, &w.table));
            let (pname, pobj) = match &w.partition {
                Some(p) => {
                    let values: Vec<String> = keys
                        .iter()
                        .map(|k| p.get(k).cloned().unwrap_or_default())
                        .collect();
                    (
                        partition_name(&keys, &values),
                        Value::String(partition_obj(&w.db, &w.table, &keys, &values)),
                    )
                }
                None => (String::new(), Value::Null),
            };
            let mut uris = Vec::new();
            for (f, subdir) in &w.files {
                uris.push(self.file_uri(f, subdir.as_deref())?);
            }
            let row = json!({
                "WNL_ID": self.next_wnl,
                "WNL_TXNID": txn,
                "WNL_WRITEID": i as i64 + 1,
                "WNL_DATABASE": w.db,
                "WNL_TABLE": w.table,
                "WNL_PARTITION": pname,
                "WNL_TABLE_OBJ": table_obj,
                "WNL_PARTITION_OBJ": pobj,
                "WNL_FILES": uris.join("]"),
                "WNL_EVENT_TIME": time_secs,
            });
            self.next_wnl += 1;
            text.push_str(&row.to_string());
            text.push('\n');
            let mut c = Change::new(Op::AddFiles, &w.db, &w.table);
            c.partition = w.partition.clone();
            c.files = w
                .files
                .iter()
                .map(|(f, subdir)| {
                    let mut f = f.clone();
                    f.subdir = subdir.clone();
                    f
                })
                .collect();
            changes.push(c);
        }
        let id = self.next_id;
        text.push_str(&self.row(
            id,
            time_secs,
            "COMMIT_TXN",
            None,
            None,
            json!({"txnid": txn, "timestamp": time_secs, "server": "", "servicePrincipal": ""}),
        ));
        let event = Event {
            id: crate::event::StateId(id as u64),
            time_ms: Some(time_secs * 1000),
            changes,
        };
        let (tree, _) = self
            .tree
            .apply(&event)
            .map_err(|err| other(format!("transaction {txn} does not apply: {err}")))?;
        self.out.write_all(text.as_bytes())?;
        self.out.flush()?;
        self.tree = tree;
        self.next_id += 1;
        Ok(id)
    }

    /// Makes the rows durable.
    pub fn sync(&mut self) -> io::Result<()> {
        self.out.sync_data()
    }

    /// The CREATE_TABLE message of a CREATE TABLE AS SELECT: the table
    /// and every file the query wrote, below their partition directories.
    fn ctas_message(
        &mut self,
        create: &Change,
        files: &[Change],
        secs: i64,
    ) -> io::Result<(&'static str, Option<String>, Option<String>, Value)> {
        let (db, t) = (create.db.clone(), create.table.clone());
        let keys = &create.partition_keys;
        let mut uris = Vec::new();
        for c in files {
            let values: Vec<String> = keys
                .iter()
                .map(|k| c.partition.as_ref().and_then(|p| p.get(k)).cloned())
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    other(format!(
                        "CTAS into {db}.{t}: a partition does not match its keys"
                    ))
                })?;
            for f in &c.files {
                let mut rel = format!("{db}.db/{t}");
                if !keys.is_empty() {
                    rel = format!("{rel}/{}", partition_name(keys, &values));
                }
                if let Some(sub) = f.subdir.as_deref() {
                    rel = format!("{rel}/{sub}");
                }
                rel = format!("{rel}/{}", f.name);
                uris.push(self.file_uri_at(f, f.subdir.as_deref(), &rel)?);
            }
        }
        Ok((
            "CREATE_TABLE",
            Some(db.clone()),
            Some(t.clone()),
            json!({
                "server": "thrift://stagefs-demo:9083", "servicePrincipal": "", "db": db,
                "table": t, "tableType": "MANAGED_TABLE",
                "tableObjJson": table_obj(&db, &t, keys, false),
                "timestamp": secs, "files": uris,
            }),
        ))
    }

    /// Whether `db.table` is an external table (marked not in the log).
    fn external(&self, db: &str, table: &str) -> bool {
        matches!(
            self.tree.table(db, table).map(|t| &t.kind),
            Some(DirKind::Table {
                not_in_log: Some(_),
                ..
            })
        )
    }

    fn keys(&self, db: &str, table: &str) -> io::Result<Vec<String>> {
        match self.tree.table(db, table).map(|t| &t.kind) {
            Some(DirKind::Table { partition_keys, .. }) => {
                Ok(partition_keys.iter().map(|k| k.to_string()).collect())
            }
            _ => Err(other(format!("table {db}.{table} does not exist"))),
        }
    }

    /// `(EVENT_TYPE, DB_NAME, TBL_NAME, message)` for one native change.
    fn message(
        &mut self,
        c: &Change,
        secs: i64,
    ) -> io::Result<(&'static str, Option<String>, Option<String>, Value)> {
        let (db, t) = (c.db.clone(), c.table.clone());
        let base = |extra: Value| {
            let mut m =
                json!({"server": "thrift://stagefs-demo:9083", "servicePrincipal": "", "db": db});
            if let (Value::Object(m), Value::Object(extra)) = (&mut m, extra) {
                m.extend(extra);
            }
            m
        };
        Ok(match c.op {
            Op::CreateDatabase => (
                "CREATE_DATABASE",
                Some(db.clone()),
                None,
                base(json!({"timestamp": secs})),
            ),
            Op::DropDatabase => (
                "DROP_DATABASE",
                Some(db.clone()),
                None,
                base(json!({"timestamp": secs})),
            ),
            Op::CreateTable => (
                "CREATE_TABLE",
                Some(db.clone()),
                Some(t.clone()),
                base(json!({
                    "table": t, "tableType": table_type(c.not_in_log.is_some()),
                    "tableObjJson": table_obj(&db, &t, &c.partition_keys, c.not_in_log.is_some()),
                    "timestamp": secs, "files": [],
                })),
            ),
            Op::DropTable => {
                let keys = self.keys(&db, &t)?;
                let ext = self.external(&db, &t);
                (
                    "DROP_TABLE",
                    Some(db.clone()),
                    Some(t.clone()),
                    base(json!({
                        "table": t, "tableType": "MANAGED_TABLE",
                        "tableObjJson": table_obj(&db, &t, &keys, ext), "timestamp": secs,
                    })),
                )
            }
            Op::RenameTable => {
                let keys = self.keys(&db, &t)?;
                let ext = self.external(&db, &t);
                (
                    "ALTER_TABLE",
                    Some(c.new_db.clone()),
                    Some(c.new_table.clone()),
                    base(json!({
                        "table": t, "tableType": "MANAGED_TABLE",
                        "tableObjBeforeJson": table_obj(&db, &t, &keys, ext),
                        "tableObjAfterJson": table_obj(&c.new_db, &c.new_table, &keys, ext),
                        "isTruncateOp": "false", "timestamp": secs,
                    })),
                )
            }
            Op::TruncateTable => {
                let keys = self.keys(&db, &t)?;
                let obj = table_obj(&db, &t, &keys, self.external(&db, &t));
                (
                    "ALTER_TABLE",
                    Some(db.clone()),
                    Some(t.clone()),
                    base(json!({
                        "table": t, "tableType": "MANAGED_TABLE",
                        "tableObjBeforeJson": obj, "tableObjAfterJson": obj,
                        "isTruncateOp": "true", "timestamp": secs,
                    })),
                )
            }
            Op::AddPartition | Op::DropPartition | Op::AddFiles | Op::ReplaceFiles => {
                let keys = self.keys(&db, &t)?;
                let values: Option<Vec<String>> = c.partition.as_ref().map(|p| {
                    keys.iter()
                        .map(|k| p.get(k).cloned().unwrap_or_default())
                        .collect()
                });
                let spec = |values: &[String]| {
                    let mut m = serde_json::Map::new();
                    for (k, v) in keys.iter().zip(values) {
                        m.insert(k.clone(), Value::String(v.clone()));
                    }
                    Value::Object(m)
                };
                let mut uris = Vec::with_capacity(c.files.len());
                for f in &c.files {
                    uris.push(self.file_uri(f, f.subdir.as_deref())?);
                }
                let table_json = table_obj(&db, &t, &keys, self.external(&db, &t));
                let message = match (c.op, &values) {
                    (Op::AddPartition, Some(v)) => (
                        "ADD_PARTITION",
                        base(json!({
                            "table": t, "tableType": "MANAGED_TABLE", "tableObjJson": table_json,
                            "timestamp": secs, "partitions": [spec(v)],
                            "partitionListJson": [partition_obj(&db, &t, &keys, v)],
                            "partitionFiles": [{"partitionName": partition_name(&keys, v), "files": uris}],
                        })),
                    ),
                    (Op::DropPartition, Some(v)) => (
                        "DROP_PARTITION",
                        base(json!({
                            "table": t, "tableType": "MANAGED_TABLE", "tableObjJson": table_json,
                            "timestamp": secs, "partitions": [spec(v)],
                        })),
                    ),
                    (Op::AddFiles | Op::ReplaceFiles, v) => (
                        "INSERT",
                        base(json!({
                            "table": t, "tableType": "MANAGED_TABLE", "tableObjJson": table_json,
                            "ptnObjJson": v.as_ref().map(|v| partition_obj(&db, &t, &keys, v)),
                            "timestamp": secs,
                            "replace": if c.op == Op::ReplaceFiles { "true" } else { "false" },
                            "files": uris,
                        })),
                    ),
                    _ => return Err(other(format!("{:?} needs a partition", c.op))),
                };
                (message.0, Some(db.clone()), Some(t.clone()), message.1)
            }
            Op::MarkTable => {
                let keys = self.keys(&db, &t)?;
                let before = table_obj(&db, &t, &keys, self.external(&db, &t));
                let after = table_obj(&db, &t, &keys, c.not_in_log.is_some());
                (
                    "ALTER_TABLE",
                    Some(db.clone()),
                    Some(t.clone()),
                    base(json!({
                        "table": t, "tableType": table_type(c.not_in_log.is_some()),
                        "tableObjBeforeJson": before, "tableObjAfterJson": after,
                        "isTruncateOp": "false", "timestamp": secs,
                    })),
                )
            }
            Op::RenamePartition => {
                let keys = self.keys(&db, &t)?;
                let values = |p: Option<&std::collections::BTreeMap<String, String>>| {
                    keys.iter()
                        .map(|k| p.and_then(|p| p.get(k)).cloned())
                        .collect::<Option<Vec<String>>>()
                        .ok_or_else(|| other(format!("{:?} needs both partitions", c.op)))
                };
                let (before, after) = (
                    values(c.partition.as_ref())?,
                    values(c.new_partition.as_ref())?,
                );
                let key_values: serde_json::Map<String, Value> = keys
                    .iter()
                    .zip(&before)
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect();
                (
                    "ALTER_PARTITION",
                    Some(db.clone()),
                    Some(t.clone()),
                    base(json!({
                        "table": t, "tableType": table_type(self.external(&db, &t)),
                        "tableObjJson": table_obj(&db, &t, &keys, self.external(&db, &t)),
                        "isTruncateOp": "false", "timestamp": secs, "writeId": -1,
                        "keyValues": key_values,
                        "partitionObjBeforeJson": partition_obj(&db, &t, &keys, &before),
                        "partitionObjAfterJson": partition_obj(&db, &t, &keys, &after),
                    })),
                )
            }
            Op::Noop => {
                let txn = self.next_txn;
                self.next_txn += 1;
                (
                    "OPEN_TXN",
                    None,
                    None,
                    json!({"txnIds": [txn], "timestamp": secs}),
                )
            }
        })
    }

    /// One `NOTIFICATION_LOG` row as a JSON line.
    fn row(
        &self,
        id: i64,
        secs: i64,
        event_type: &str,
        db: Option<String>,
        table: Option<String>,
        message: Value,
    ) -> String {
        let text = message.to_string();
        let (message, format) = if self.gzip {
            (gzip_base64(&text), "gzip(json-2.0)")
        } else {
            (text, "json-0.2")
        };
        let mut line = json!({
            "NL_ID": id, "EVENT_ID": id, "EVENT_TIME": secs, "EVENT_TYPE": event_type,
            "CAT_NAME": "hive", "DB_NAME": db, "TBL_NAME": table,
            "MESSAGE": message, "MESSAGE_FORMAT": format,
        })
        .to_string();
        line.push('\n');
        line
    }

    /// `uri#checksum#cmroot#subdir` for a native file: its bytes found at
    /// the source or in the native cm (checked by sha256), its HDFS
    /// checksum computed, and a cm copy linked in place.
    fn file_uri(&mut self, f: &FileRef, subdir: Option<&str>) -> io::Result<String> {
        self.file_uri_at(f, subdir, &f.path.clone())
    }

    /// [`HiveWriter::file_uri`] for the bytes of `f` as Hive wrote them to
    /// `<warehouse>/<rel>` (a CTAS writes the query's files below the new
    /// table); a link to them is put there when `rel` is not where they are.
    fn file_uri_at(&mut self, f: &FileRef, subdir: Option<&str>, rel: &str) -> io::Result<String> {
        let Some((sha, _)) = f.known() else {
            return Err(other(format!("{} has no sha256 to find it by", f.path)));
        };
        let base = f.path.rsplit('/').next().unwrap_or(&f.path);
        if base != f.name {
            return Err(other(format!(
                "{}: Hive names files after their path, not `{}`",
                f.path, f.name
            )));
        }
        let mut places = vec![self.source_root.join(&f.path)];
        if let Some(cm) = &self.native_cm {
            places.push(cm.join(format!("{base}_{}", sha.to_hex())));
        }
        let (place, bytes) = places
            .iter()
            .find_map(|p| {
                let bytes = fs::read(p).ok()?;
                (BlobId(Sha256::digest(&bytes).into()) == sha).then(|| (p.clone(), bytes))
            })
            .ok_or_else(|| other(format!("no copy of {} with sha256 {sha}", f.path)))?;
        let (f_path, place) = if rel == f.path {
            (f.path.clone(), place)
        } else {
            let at = self.source_root.join(rel);
            if let Some(parent) = at.parent() {
                fs::create_dir_all(parent)?;
            }
            if !at.exists() && fs::hard_link(&place, &at).is_err() {
                fs::write(&at, &bytes)?;
            }
            (rel.to_owned(), at)
        };
        let f_path = &f_path;
        if !self.checksums {
            return Ok(format!(
                "{WAREHOUSE_URI}/{f_path}###{}",
                subdir.unwrap_or("")
            ));
        }
        let checksum = hdfs_checksum(&bytes);
        let cm_copy = self
            .hive_cm
            .join(crate::source::hive::uri::cm_file_name(base, &checksum));
        if !cm_copy.exists() && fs::hard_link(&place, &cm_copy).is_err() {
            fs::write(&cm_copy, &bytes)?;
        }
        Ok(format!(
            "{WAREHOUSE_URI}/{f_path}#{checksum}#{CM_URI}#{}",
            subdir.unwrap_or("")
        ))
    }
}

/// The HDFS MD5-of-MD5-of-CRC32C checksum (hex) of a single-block file
/// with Hadoop's default 512 bytes per CRC.
pub fn hdfs_checksum(bytes: &[u8]) -> String {
    let shape = HdfsChecksum::Md5Md5Crc {
        bytes_per_crc: 512,
        crc_per_block: 0,
        md5: [0; 16],
    };
    let mut summer = HdfsChecksummer::new(&shape, &[CrcType::Crc32c]);
    summer.update(bytes);
    summer
        .finish()
        .into_iter()
        .next()
        .map_or_else(|| HdfsChecksum::empty_file().to_hex(), |(_, c)| c.to_hex())
}

fn gzip_base64(text: &str) -> String {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(text.as_bytes());
    let bytes = enc.finish().unwrap_or_default();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `Some(k)` when `changes` are an EXCHANGE PARTITION of `k` partitions:
/// [`Op::AddPartition`] of each into one table, then [`Op::DropPartition`]
/// of the same partitions, in the same order, from another table.
fn exchange_shape(changes: &[Change]) -> Option<usize> {
    let k = changes.len() / 2;
    if k == 0 || changes.len() != 2 * k {
        return None;
    }
    let (adds, drops) = changes.split_at(k);
    let same = |a: &Change, b: &Change| (&a.db, &a.table) == (&b.db, &b.table);
    let ok = adds
        .iter()
        .all(|a| a.op == Op::AddPartition && same(a, &adds[0]))
        && drops
            .iter()
            .all(|d| d.op == Op::DropPartition && d.files.is_empty() && same(d, &drops[0]))
        && !same(&adds[0], &drops[0])
        && adds
            .iter()
            .zip(drops)
            .all(|(a, d)| a.partition.is_some() && a.partition == d.partition);
    ok.then_some(k)
}

fn location(db: &str, table: &str) -> String {
    format!("{WAREHOUSE_URI}/{db}.db/{table}")
}

fn table_type(external: bool) -> &'static str {
    if external {
        "EXTERNAL_TABLE"
    } else {
        "MANAGED_TABLE"
    }
}

/// A Thrift-JSON Table object (TJSONProtocol) with the fields stagefs
/// reads; an external one says so twice, as Hive does (`tableType` and
/// the `EXTERNAL` parameter).
fn table_obj(db: &str, table: &str, keys: &[String], external: bool) -> String {
    let mut key_list = vec![json!("rec"), json!(keys.len())];
    key_list.extend(
        keys.iter()
            .map(|k| json!({"1": {"str": k}, "2": {"str": "string"}})),
    );
    json!({
        "1": {"str": table}, "2": {"str": db}, "3": {"str": "hive"},
        "7": {"rec": {"2": {"str": location(db, table)}}},
        "8": {"lst": key_list},
        "9": if external {
            json!({"map": ["str", "str", 1, {"EXTERNAL": "TRUE"}]})
        } else {
            json!({"map": ["str", "str", 0, {}]})
        },
        "12": {"str": table_type(external)},
    })
    .to_string()
}

/// A Thrift-JSON Partition object.
fn partition_obj(db: &str, table: &str, keys: &[String], values: &[String]) -> String {
    let mut list = vec![json!("str"), json!(values.len())];
    list.extend(values.iter().map(|v| json!(v)));
    json!({
        "1": {"lst": list}, "2": {"str": db}, "3": {"str": table},
        "6": {"rec": {"2": {"str": format!("{}/{}", location(db, table), partition_name(keys, values))}}},
    })
    .to_string()
}

/// `k1=v1/k2=v2` with Hive's escaping.
fn partition_name(keys: &[String], values: &[String]) -> String {
    keys.iter()
        .zip(values)
        .map(|(k, v)| format!("{}={}", escape_path_name(k), escape_path_name(v)))
        .collect::<Vec<_>>()
        .join("/")
}

/// Converts a native events folder into Hive rows as it grows.
pub struct LogConverter {
    log: crate::source::native::SourceLog,
    pub writer: HiveWriter,
}

impl LogConverter {
    pub fn new(events_dir: &Path, writer: HiveWriter) -> LogConverter {
        LogConverter {
            log: crate::source::native::SourceLog::new(
                events_dir,
                crate::source::native::LogPosition::default(),
            ),
            writer,
        }
    }

    /// Converts every complete line written so far; returns how many.
    pub fn pump(&mut self) -> io::Result<usize> {
        let mut n = 0;
        loop {
            let lines = self.log.poll(4096).map_err(|e| other(e.to_string()))?;
            if lines.is_empty() {
                return Ok(n);
            }
            for line in lines {
                let event = Event::parse_line(&line.bytes)
                    .map_err(|e| other(format!("{}:{}: {e}", line.file, line.line)))?;
                self.writer.write_event(&event)?;
                n += 1;
            }
        }
    }
}
