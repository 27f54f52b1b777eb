//! A Hive warehouse kept the way Hive keeps one, for the bootstrap tests:
//! files under `<root>/wh/<db>.db/<table>/p=<v>/`, the metastore's own
//! tables (`DBS`, `TBLS`, `SDS`, `PARTITIONS`, `PARTITION_KEYS`,
//! `PARTITION_KEY_VALS`, `TABLE_PARAMS`, with the column types of Hive's
//! schema scripts) and the notification log, on a private PostgreSQL or
//! MariaDB ([`super::dbserver`]).
//!
//! [`HmsWarehouse::create`] builds a warehouse whose history is gone (the
//! cleaner purged its events: the log is empty, `NEXT_EVENT_ID` is past
//! them). [`HmsWarehouse::step`] then changes it the way Hive does: files
//! are put in place first (an overwrite renames new bytes over the old
//! name), then ONE database transaction changes the metadata, writes the
//! notification row (`stagefs::workload::hive_export` writes the message, with HDFS
//! checksums and change-management copies) and bumps the sequence; a
//! dropped partition's directory is deleted after the commit. Tables are
//! renamed with their directory. [`HmsWarehouse::expected`] is the oracle:
//! every table's content at every id since creation.
//!
//! Transactional tables: [`HmsWarehouse::create_acid_table`] makes one
//! with the `base_`/`delta_` directories a test names (and the oracle the
//! test works out from Hive's rules), [`HmsWarehouse::set_txns`] fills
//! Hive's transaction tables (`TXNS`, `TXN_TO_WRITE_ID`, `NEXT_WRITE_ID`,
//! and `NEXT_TXN_ID` on the Hive 3 schema), and
//! [`HmsWarehouse::commit_acid`] commits an open transaction as Hive does:
//! its `TXN_WRITE_NOTIFICATION_LOG` row, then in one transaction the
//! `TXNS` row removed and the `COMMIT_TXN` event.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use stagefs::event::{BlobId, Change, Event, FileRef, Op, StateId};
use stagefs::source::hive::model::NotificationRow;
use stagefs::workload::hive_export::{HiveWriter, WAREHOUSE_URI};
use stagefs::workload::{Rng, TableContent, WarehouseContent};

use crate::dbserver::{Admin, DbServer, Kind, TableCase};
use crate::metastore_rows::MetastoreWriter;

/// Shape of the warehouse.
#[derive(Debug, Clone)]
pub struct Shape {
    pub databases: usize,
    pub tables_per_db: usize,
    pub partitions_per_table: usize,
    /// Every n-th table is unpartitioned (0: none).
    pub unpartitioned_every: usize,
    pub file_bytes: usize,
    pub seed: u64,
}

struct Partition {
    part_id: i64,
    sd_id: i64,
    /// name → sha256
    files: BTreeMap<String, BlobId>,
}

struct Table {
    tbl_id: i64,
    sd_id: i64,
    partitioned: bool,
    /// value → partition (an unpartitioned table has one, under "").
    partitions: BTreeMap<String, Partition>,
}

pub struct HmsWarehouse {
    kind: Kind,
    admin: Admin,
    root: PathBuf,
    writer: HiveWriter,
    rows: std::io::BufReader<std::fs::File>,
    next_id: i64,
    next_meta_id: i64,
    next_file: u64,
    db_ids: BTreeMap<String, i64>,
    tables: BTreeMap<(String, String), Table>,
    rng: Rng,
    file_bytes: usize,
    current: WarehouseContent,
    history: BTreeMap<i64, WarehouseContent>,
    renames: u64,
    /// Writes `TXN_WRITE_NOTIFICATION_LOG` rows.
    txn_rows: MetastoreWriter,
}

/// Hive 4's definitions of the metadata tables the bootstrap reads.
pub fn metadata_schema(kind: Kind) -> Vec<String> {
    let (q, int) = match kind {
        Kind::Postgres => ("\"", "integer"),
        Kind::MariaDb => ("`", "int(11)"),
    };
    let t = |body: &str| body.replace('"', q);
    vec![
        t(
            r#"CREATE TABLE "DBS" ("DB_ID" bigint NOT NULL, "DESC" varchar(4000), "DB_LOCATION_URI" varchar(4000) NOT NULL, "NAME" varchar(128), "OWNER_NAME" varchar(128), "OWNER_TYPE" varchar(10), "CTLG_NAME" varchar(256) DEFAULT 'hive', PRIMARY KEY ("DB_ID"))"#,
        ),
        t(
            r#"CREATE TABLE "SDS" ("SD_ID" bigint NOT NULL, "CD_ID" bigint, "INPUT_FORMAT" varchar(4000), "IS_COMPRESSED" boolean NOT NULL, "LOCATION" varchar(4000), "NUM_BUCKETS" bigint NOT NULL, "OUTPUT_FORMAT" varchar(4000), "SERDE_ID" bigint, PRIMARY KEY ("SD_ID"))"#,
        ),
        t(&format!(
            r#"CREATE TABLE "TBLS" ("TBL_ID" bigint NOT NULL, "CREATE_TIME" {int} NOT NULL, "DB_ID" bigint, "LAST_ACCESS_TIME" {int} NOT NULL, "OWNER" varchar(767), "RETENTION" {int} NOT NULL, "SD_ID" bigint, "TBL_NAME" varchar(256), "TBL_TYPE" varchar(128), PRIMARY KEY ("TBL_ID"))"#
        )),
        t(&format!(
            r#"CREATE TABLE "PARTITION_KEYS" ("TBL_ID" bigint NOT NULL, "PKEY_COMMENT" varchar(4000), "PKEY_NAME" varchar(128) NOT NULL, "PKEY_TYPE" varchar(767) NOT NULL, "INTEGER_IDX" {int} NOT NULL, PRIMARY KEY ("TBL_ID", "PKEY_NAME"))"#
        )),
        t(&format!(
            r#"CREATE TABLE "PARTITIONS" ("PART_ID" bigint NOT NULL, "CREATE_TIME" {int} NOT NULL, "LAST_ACCESS_TIME" {int} NOT NULL, "PART_NAME" varchar(767), "SD_ID" bigint, "TBL_ID" bigint, PRIMARY KEY ("PART_ID"))"#
        )),
        t(&format!(
            r#"CREATE TABLE "PARTITION_KEY_VALS" ("PART_ID" bigint NOT NULL, "PART_KEY_VAL" varchar(256), "INTEGER_IDX" {int} NOT NULL, PRIMARY KEY ("PART_ID", "INTEGER_IDX"))"#
        )),
        t(
            r#"CREATE TABLE "TABLE_PARAMS" ("TBL_ID" bigint NOT NULL, "PARAM_KEY" varchar(256) NOT NULL, "PARAM_VALUE" text, PRIMARY KEY ("TBL_ID", "PARAM_KEY"))"#,
        ),
    ]
}

/// Hive's transaction tables as its schema scripts define them: Hive 4
/// on PostgreSQL (`TXN_ID` from a sequence, no `NEXT_TXN_ID`), Hive 3.1
/// on MariaDB (`NEXT_TXN_ID`).
pub fn acid_schema(kind: Kind) -> Vec<String> {
    let t2w = r#"CREATE TABLE "TXN_TO_WRITE_ID" ("T2W_TXNID" bigint NOT NULL, "T2W_DATABASE" varchar(128) NOT NULL, "T2W_TABLE" varchar(256) NOT NULL, "T2W_WRITEID" bigint NOT NULL)"#;
    let nwi = r#"CREATE TABLE "NEXT_WRITE_ID" ("NWI_DATABASE" varchar(128) NOT NULL, "NWI_TABLE" varchar(256) NOT NULL, "NWI_NEXT" bigint NOT NULL)"#;
    let indexes = [
        r#"CREATE UNIQUE INDEX "TBL_TO_TXN_ID_IDX" ON "TXN_TO_WRITE_ID" ("T2W_DATABASE", "T2W_TABLE", "T2W_TXNID")"#,
        r#"CREATE UNIQUE INDEX "TBL_TO_WRITE_ID_IDX" ON "TXN_TO_WRITE_ID" ("T2W_DATABASE", "T2W_TABLE", "T2W_WRITEID")"#,
        r#"CREATE UNIQUE INDEX "NEXT_WRITE_ID_IDX" ON "NEXT_WRITE_ID" ("NWI_DATABASE", "NWI_TABLE")"#,
    ];
    match kind {
        Kind::Postgres => {
            let mut out = vec![
                r#"CREATE TABLE "TXNS" ("TXN_ID" bigserial PRIMARY KEY, "TXN_STATE" char(1) NOT NULL, "TXN_STARTED" bigint NOT NULL, "TXN_LAST_HEARTBEAT" bigint NOT NULL, "TXN_USER" varchar(128) NOT NULL, "TXN_HOST" varchar(128) NOT NULL, "TXN_AGENT_INFO" varchar(128), "TXN_META_INFO" varchar(128), "TXN_HEARTBEAT_COUNT" integer, "TXN_TYPE" integer)"#.to_string(),
                t2w.to_string(),
                nwi.to_string(),
            ];
            out.extend(indexes.iter().map(|s| s.to_string()));
            out
        }
        Kind::MariaDb => {
            let my = |s: &str| {
                format!(
                    "{} ENGINE=InnoDB DEFAULT CHARSET=latin1",
                    s.replace('"', "")
                )
            };
            let mut out = vec![
                my("CREATE TABLE TXNS (TXN_ID bigint PRIMARY KEY, TXN_STATE char(1) NOT NULL, TXN_STARTED bigint NOT NULL, TXN_LAST_HEARTBEAT bigint NOT NULL, TXN_USER varchar(128) NOT NULL, TXN_HOST varchar(128) NOT NULL, TXN_AGENT_INFO varchar(128), TXN_META_INFO varchar(128), TXN_HEARTBEAT_COUNT int, TXN_TYPE int)"),
                my("CREATE TABLE NEXT_TXN_ID (NTXN_NEXT bigint NOT NULL)"),
                "INSERT INTO NEXT_TXN_ID VALUES(1)".to_string(),
                my(t2w),
                my(nwi),
            ];
            out.extend(indexes.iter().map(|s| s.replace('"', "")));
            out
        }
    }
}

/// Bytes of random filler per file; larger files repeat them.
const FILLER_BLOCK: usize = 64 << 10;

fn sha(bytes: &[u8]) -> BlobId {
    BlobId(Sha256::digest(bytes).into())
}

impl HmsWarehouse {
    /// Builds the warehouse under `root` in metastore database `db` (which
    /// must have the notification tables): files, metadata, and
    /// `NEXT_EVENT_ID` past the purged history.
    pub fn create(server: &DbServer, db: &str, root: &Path, shape: &Shape) -> HmsWarehouse {
        let mut admin = server.admin(db);
        for s in metadata_schema(server.kind)
            .into_iter()
            .chain(acid_schema(server.kind))
        {
            admin.execute(&s);
        }
        let wh = root.join("wh");
        std::fs::create_dir_all(&wh).unwrap();
        std::fs::create_dir_all(root.join("hive-cm")).unwrap();
        let rows_path = root.join("rows.jsonl");
        let writer = HiveWriter::new(&rows_path, &wh, None, &root.join("hive-cm"), false)
            .expect("hive writer");
        let rows = std::io::BufReader::new(std::fs::File::open(&rows_path).unwrap());
        let mut w = HmsWarehouse {
            kind: server.kind,
            admin,
            root: wh,
            writer,
            rows,
            next_id: 1,
            next_meta_id: 1,
            next_file: 0,
            db_ids: BTreeMap::new(),
            tables: BTreeMap::new(),
            rng: Rng::new(shape.seed),
            file_bytes: shape.file_bytes,
            current: WarehouseContent::new(),
            history: BTreeMap::new(),
            renames: 0,
            txn_rows: MetastoreWriter::new(server, db, TableCase::Upper),
        };
        w.build(shape);
        w
    }

    fn q(&self, name: &str) -> String {
        match self.kind {
            Kind::Postgres => format!("\"{name}\""),
            Kind::MariaDb => format!("`{name}`"),
        }
    }

    fn meta_id(&mut self) -> i64 {
        self.next_meta_id += 1;
        self.next_meta_id
    }

    /// `(root-relative path, uri)` of a table or partition directory.
    fn dir(db: &str, t: &str, value: Option<&str>) -> (String, String) {
        let rel = match value {
            Some(v) => format!("{db}.db/{t}/p={v}"),
            None => format!("{db}.db/{t}"),
        };
        let uri = format!("{WAREHOUSE_URI}/{rel}");
        (rel, uri)
    }

    fn write_file(&mut self, rel_dir: &str, name: &str) -> FileRef {
        let dir = self.root.join(rel_dir);
        std::fs::create_dir_all(&dir).unwrap();
        self.next_file += 1;
        let mut bytes = format!("file {} of {rel_dir} ", self.next_file).into_bytes();
        // Random letters; past 64 KiB (the benchmark's large files) the
        // first 64 KiB repeat, which keeps writing GiBs fast.
        while bytes.len() < self.file_bytes.min(FILLER_BLOCK) {
            bytes.push(b'a' + (self.rng.below(26) as u8));
        }
        while bytes.len() < self.file_bytes {
            let n = (self.file_bytes - bytes.len()).min(bytes.len());
            bytes.extend_from_within(..n);
        }
        // New bytes go in under a hidden name and are renamed over the
        // old name (Hive moves finished files into place).
        let tmp = dir.join(format!(".tmp-{}", self.next_file));
        std::fs::write(&tmp, &bytes).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
        FileRef::native(
            &format!("{rel_dir}/{name}"),
            name,
            bytes.len() as u64,
            sha(&bytes),
        )
    }

    /// The lines the writer appended since the last call.
    fn new_lines(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            let pos = self.rows.stream_position().unwrap();
            let n = self.rows.read_line(&mut line).unwrap();
            if n == 0 || !line.ends_with('\n') {
                self.rows.seek(std::io::SeekFrom::Start(pos)).unwrap();
                return out;
            }
            out.push(line.clone());
        }
    }

    /// The notification rows the writer appended since the last call.
    fn new_rows(&mut self) -> Vec<NotificationRow> {
        self.new_lines()
            .iter()
            .map(|l| serde_json::from_str(l).expect("row JSON"))
            .collect()
    }

    fn build(&mut self, shape: &Shape) {
        let mut sql = Vec::new();
        let mut events = Vec::new();
        let mut n_table = 0;
        for d in 0..shape.databases {
            let db = format!("db{d}");
            let db_id = self.meta_id();
            self.db_ids.insert(db.clone(), db_id);
            sql.push(format!(
                "INSERT INTO {} ({}, {}, {}) VALUES ({db_id}, '{WAREHOUSE_URI}/{db}.db', '{db}')",
                self.q("DBS"),
                self.q("DB_ID"),
                self.q("DB_LOCATION_URI"),
                self.q("NAME")
            ));
            events.push(vec![Change::new(Op::CreateDatabase, &db, "")]);
            for t in 0..shape.tables_per_db {
                n_table += 1;
                let name = format!("t{t}");
                let partitioned =
                    shape.unpartitioned_every == 0 || n_table % shape.unpartitioned_every != 0;
                let mut create = Change::new(Op::CreateTable, &db, &name);
                if partitioned {
                    create.partition_keys = vec!["p".into()];
                }
                events.push(vec![create]);
                let (tbl_id, sd_id) = (self.meta_id(), self.meta_id());
                let (rel, uri) = Self::dir(&db, &name, None);
                sql.extend(self.table_rows(tbl_id, sd_id, db_id, &name, &uri, partitioned));
                let mut table = Table {
                    tbl_id,
                    sd_id,
                    partitioned,
                    partitions: BTreeMap::new(),
                };
                let values: Vec<Option<String>> = if partitioned {
                    (0..shape.partitions_per_table)
                        .map(|v| Some(format!("v{v}")))
                        .collect()
                } else {
                    vec![None]
                };
                for value in values {
                    let (prel, puri) = match &value {
                        Some(v) => Self::dir(&db, &name, Some(v)),
                        None => (rel.clone(), uri.clone()),
                    };
                    let files = 1 + self.rng.below(2);
                    let refs: Vec<FileRef> = (0..files)
                        .map(|i| self.write_file(&prel, &format!("00000{i}_0")))
                        .collect();
                    let mut c = match &value {
                        Some(v) => {
                            let mut c = Change::new(Op::AddPartition, &db, &name);
                            c.partition = Some([("p".to_string(), v.clone())].into());
                            c
                        }
                        None => Change::new(Op::AddFiles, &db, &name),
                    };
                    c.files = refs.clone();
                    events.push(vec![c]);
                    let (part_id, psd) = match &value {
                        Some(v) => {
                            let (part_id, psd) = (self.meta_id(), self.meta_id());
                            sql.extend(self.partition_rows(part_id, psd, tbl_id, v, &puri));
                            (part_id, psd)
                        }
                        None => (0, sd_id),
                    };
                    table.partitions.insert(
                        value.clone().unwrap_or_default(),
                        Partition {
                            part_id,
                            sd_id: psd,
                            files: refs
                                .iter()
                                .map(|f| (f.name.clone(), f.known().unwrap().0))
                                .collect(),
                        },
                    );
                }
                self.tables.insert((db.clone(), name), table);
            }
        }
        // The history as Hive wrote it; its rows were purged since.
        for changes in events {
            let e = Event {
                id: StateId(self.next_id as u64),
                time_ms: Some(1_700_000_000_000),
                changes,
            };
            self.writer.write_event(&e).expect("hive row");
            self.next_id += 1;
        }
        self.new_rows();
        sql.push(format!(
            "UPDATE {} SET {} = {}",
            self.q("NOTIFICATION_SEQUENCE"),
            self.q("NEXT_EVENT_ID"),
            self.next_id
        ));
        self.run_in_transaction(&sql, None);
        self.record();
    }

    /// The `SDS` row of a table or partition at `uri`.
    fn sds_row(&self, sd_id: i64, uri: &str) -> String {
        let q = |n: &str| self.q(n);
        format!(
            "INSERT INTO {} ({}, {}, {}, {}) VALUES ({sd_id}, false, '{uri}', -1)",
            q("SDS"),
            q("SD_ID"),
            q("IS_COMPRESSED"),
            q("LOCATION"),
            q("NUM_BUCKETS")
        )
    }

    fn table_rows(
        &self,
        tbl_id: i64,
        sd_id: i64,
        db_id: i64,
        name: &str,
        uri: &str,
        partitioned: bool,
    ) -> Vec<String> {
        let q = |n: &str| self.q(n);
        let mut out = vec![
            self.sds_row(sd_id, uri),
            format!(
                "INSERT INTO {} ({}, {}, {}, {}, {}, {}, {}, {}) VALUES ({tbl_id}, 0, {db_id}, 0, 0, {sd_id}, '{name}', 'MANAGED_TABLE')",
                q("TBLS"),
                q("TBL_ID"),
                q("CREATE_TIME"),
                q("DB_ID"),
                q("LAST_ACCESS_TIME"),
                q("RETENTION"),
                q("SD_ID"),
                q("TBL_NAME"),
                q("TBL_TYPE")
            ),
            format!(
                "INSERT INTO {} ({}, {}, {}) VALUES ({tbl_id}, 'transient_lastDdlTime', '0')",
                q("TABLE_PARAMS"),
                q("TBL_ID"),
                q("PARAM_KEY"),
                q("PARAM_VALUE")
            ),
        ];
        if partitioned {
            out.push(format!(
                "INSERT INTO {} ({}, {}, {}, {}) VALUES ({tbl_id}, 'p', 'string', 0)",
                q("PARTITION_KEYS"),
                q("TBL_ID"),
                q("PKEY_NAME"),
                q("PKEY_TYPE"),
                q("INTEGER_IDX")
            ));
        }
        out
    }

    fn partition_rows(
        &self,
        part_id: i64,
        sd_id: i64,
        tbl_id: i64,
        v: &str,
        uri: &str,
    ) -> Vec<String> {
        let q = |n: &str| self.q(n);
        vec![
            self.sds_row(sd_id, uri),
            format!(
                "INSERT INTO {} ({}, {}, {}, {}, {}, {}) VALUES ({part_id}, 0, 0, 'p={v}', {sd_id}, {tbl_id})",
                q("PARTITIONS"),
                q("PART_ID"),
                q("CREATE_TIME"),
                q("LAST_ACCESS_TIME"),
                q("PART_NAME"),
                q("SD_ID"),
                q("TBL_ID")
            ),
            format!(
                "INSERT INTO {} ({}, {}, {}) VALUES ({part_id}, '{v}', 0)",
                q("PARTITION_KEY_VALS"),
                q("PART_ID"),
                q("PART_KEY_VAL"),
                q("INTEGER_IDX")
            ),
        ]
    }

    fn delete_partition_rows(&self, p: &Partition) -> Vec<String> {
        let q = |n: &str| self.q(n);
        vec![
            format!(
                "DELETE FROM {} WHERE {} = {}",
                q("PARTITION_KEY_VALS"),
                q("PART_ID"),
                p.part_id
            ),
            format!(
                "DELETE FROM {} WHERE {} = {}",
                q("PARTITIONS"),
                q("PART_ID"),
                p.part_id
            ),
            format!(
                "DELETE FROM {} WHERE {} = {}",
                q("SDS"),
                q("SD_ID"),
                p.sd_id
            ),
        ]
    }

    /// Runs `sql` in one transaction, with the notification `row` (and the
    /// sequence bump past it) when given.
    fn run_in_transaction(&mut self, sql: &[String], row: Option<&NotificationRow>) {
        let (log, seq) = (self.q("NOTIFICATION_LOG"), self.q("NOTIFICATION_SEQUENCE"));
        let (eid, nid) = (self.q("EVENT_ID"), self.q("NEXT_EVENT_ID"));
        match &mut self.admin {
            Admin::Postgres(client) => {
                let mut tx = client.transaction().expect("begin");
                for chunk in sql.chunks(500) {
                    tx.batch_execute(&chunk.join(";\n")).expect("metadata");
                }
                if let Some(r) = row {
                    tx.execute(
                        &format!(
                            r#"INSERT INTO {log} ("NL_ID", {eid}, "EVENT_TIME", "EVENT_TYPE", "CAT_NAME", "DB_NAME", "TBL_NAME", "MESSAGE", "MESSAGE_FORMAT") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"#
                        ),
                        &[
                            &(r.event_id + 100),
                            &r.event_id,
                            &(r.event_time.unwrap_or(0) as i32),
                            &r.event_type,
                            &r.cat_name,
                            &r.db_name,
                            &r.tbl_name,
                            &r.message.as_deref(),
                            &r.message_format,
                        ],
                    )
                    .expect("insert the notification");
                    tx.execute(
                        &format!("UPDATE {seq} SET {nid} = $1"),
                        &[&(r.event_id + 1)],
                    )
                    .expect("bump the sequence");
                }
                tx.commit().expect("commit");
            }
            Admin::MariaDb(conn) => {
                use mysql::prelude::Queryable;
                let mut tx = conn
                    .start_transaction(mysql::TxOpts::default())
                    .expect("begin");
                for s in sql {
                    tx.query_drop(s).unwrap_or_else(|e| panic!("{s}: {e}"));
                }
                if let Some(r) = row {
                    tx.exec_drop(
                        format!(
                            "INSERT INTO {log} (`NL_ID`, {eid}, `EVENT_TIME`, `EVENT_TYPE`, `CAT_NAME`, `DB_NAME`, `TBL_NAME`, `MESSAGE`, `MESSAGE_FORMAT`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                        ),
                        (
                            r.event_id + 100,
                            r.event_id,
                            r.event_time.unwrap_or(0),
                            r.event_type.clone(),
                            r.cat_name.clone(),
                            r.db_name.clone(),
                            r.tbl_name.clone(),
                            r.message.clone(),
                            r.message_format.clone(),
                        ),
                    )
                    .expect("insert the notification");
                    tx.exec_drop(format!("UPDATE {seq} SET {nid} = ?"), (r.event_id + 1,))
                        .expect("bump the sequence");
                }
                tx.commit().expect("commit");
            }
        }
    }

    fn content_of(&self, key: &(String, String)) -> Arc<TableContent> {
        let table = &self.tables[key];
        let mut content = TableContent::new();
        for (v, p) in &table.partitions {
            for (name, blob) in &p.files {
                let path = if table.partitioned {
                    format!("p={v}/{name}")
                } else {
                    name.clone()
                };
                content.insert(path, *blob);
            }
        }
        Arc::new(content)
    }

    /// The oracle entry at the last id, every table rebuilt.
    fn record(&mut self) {
        let keys: Vec<(String, String)> = self.tables.keys().cloned().collect();
        let mut all = WarehouseContent::new();
        for key in keys {
            all.insert(format!("{}.{}", key.0, key.1), self.content_of(&key));
        }
        self.current = all.clone();
        self.history.insert(self.next_id - 1, all);
    }

    /// The oracle entry at the last id: the current content with
    /// `changed` updated (and `gone`, a renamed table's old name, removed).
    fn record_change(&mut self, changed: &(String, String), gone: Option<&(String, String)>) {
        if let Some(g) = gone {
            self.current.remove(&format!("{}.{}", g.0, g.1));
        }
        let content = self.content_of(changed);
        self.current
            .insert(format!("{}.{}", changed.0, changed.1), content);
        self.history.insert(self.next_id - 1, self.current.clone());
    }

    /// The last event id written.
    pub fn latest(&self) -> i64 {
        self.next_id - 1
    }

    /// Every table at `id` (`"db.table"` → content).
    pub fn expected(&self, id: i64) -> &WarehouseContent {
        self.history
            .range(..=id)
            .next_back()
            .map(|(_, c)| c)
            .expect("an oracle state")
    }

    /// `--source-map` arguments for this warehouse.
    pub fn source_map(&self) -> Vec<String> {
        self.writer.source_map_args()
    }

    /// The tables now, for tests that aim at one.
    pub fn table_names(&self) -> Vec<(String, String)> {
        self.tables.keys().cloned().collect()
    }

    /// One Hive-like change on a random table; returns its event id.
    pub fn step(&mut self) -> i64 {
        let keys: Vec<(String, String)> = self.tables.keys().cloned().collect();
        let key = keys[self.rng.below(keys.len())].clone();
        let roll = self.rng.below(100);
        self.change(&key, roll)
    }

    /// An INSERT into `db.table` (a random partition).
    pub fn insert_into(&mut self, db: &str, table: &str) -> i64 {
        self.change(&(db.to_owned(), table.to_owned()), 0)
    }

    fn change(&mut self, key: &(String, String), roll: usize) -> i64 {
        let (db, t) = key.clone();
        let partitioned = self.tables[key].partitioned;
        let values: Vec<String> = self.tables[key].partitions.keys().cloned().collect();
        let value = values[self.rng.below(values.len().max(1))].clone();
        let id = self.next_id;
        let mut sql = Vec::new();
        let mut after_commit: Option<PathBuf> = None;
        let spec = || Some([("p".to_string(), value.clone())].into());
        let (rel, _) = Self::dir(&db, &t, partitioned.then_some(value.as_str()));
        let change = if roll < 40 || (!partitioned && roll < 85) {
            // INSERT INTO: a new file name.
            let name = format!("{:06}_{}", self.next_file + 1, id % 7);
            let f = self.write_file(&rel, &name);
            let p = self
                .tables
                .get_mut(key)
                .unwrap()
                .partitions
                .get_mut(&value)
                .unwrap();
            p.files.insert(f.name.clone(), f.known().unwrap().0);
            let mut c = Change::new(Op::AddFiles, &db, &t);
            c.partition = if partitioned { spec() } else { None };
            c.files = vec![f];
            c
        } else if roll < 60 || !partitioned {
            // INSERT OVERWRITE, reusing the name 000000_0.
            let f = self.write_file(&rel, "000000_0");
            let p = self
                .tables
                .get_mut(key)
                .unwrap()
                .partitions
                .get_mut(&value)
                .unwrap();
            for old in p.files.keys().filter(|n| *n != "000000_0") {
                let _ = std::fs::remove_file(self.root.join(&rel).join(old));
            }
            p.files = [(f.name.clone(), f.known().unwrap().0)].into();
            let mut c = Change::new(Op::ReplaceFiles, &db, &t);
            c.partition = if partitioned { spec() } else { None };
            c.files = vec![f];
            c
        } else if roll < 75 {
            // A new partition with a file.
            let v = format!("n{id}");
            let (prel, puri) = Self::dir(&db, &t, Some(&v));
            let f = self.write_file(&prel, "000000_0");
            let (part_id, sd_id) = (self.meta_id(), self.meta_id());
            let tbl_id = self.tables[key].tbl_id;
            sql.extend(self.partition_rows(part_id, sd_id, tbl_id, &v, &puri));
            self.tables.get_mut(key).unwrap().partitions.insert(
                v.clone(),
                Partition {
                    part_id,
                    sd_id,
                    files: [(f.name.clone(), f.known().unwrap().0)].into(),
                },
            );
            let mut c = Change::new(Op::AddPartition, &db, &t);
            c.partition = Some([("p".to_string(), v)].into());
            c.files = vec![f];
            c
        } else if roll < 90 && values.len() > 1 {
            // DROP PARTITION: metadata first, the directory after commit.
            let p = self
                .tables
                .get_mut(key)
                .unwrap()
                .partitions
                .remove(&value)
                .unwrap();
            sql.extend(self.delete_partition_rows(&p));
            after_commit = Some(self.root.join(&rel));
            let mut c = Change::new(Op::DropPartition, &db, &t);
            c.partition = spec();
            c
        } else {
            // RENAME: the directory moves inside the metastore transaction.
            self.renames += 1;
            let new_name = format!("{}_r{}", t.split("_r").next().unwrap_or(&t), self.renames);
            let (old_rel, _) = Self::dir(&db, &t, None);
            let (new_rel, new_uri) = Self::dir(&db, &new_name, None);
            let table = self.tables.remove(key).unwrap();
            let q = |n: &str| self.q(n);
            sql.push(format!(
                "UPDATE {} SET {} = '{new_name}' WHERE {} = {}",
                q("TBLS"),
                q("TBL_NAME"),
                q("TBL_ID"),
                table.tbl_id
            ));
            sql.push(format!(
                "UPDATE {} SET {} = '{new_uri}' WHERE {} = {}",
                q("SDS"),
                q("LOCATION"),
                q("SD_ID"),
                table.sd_id
            ));
            for (v, p) in &table.partitions {
                if table.partitioned {
                    sql.push(format!(
                        "UPDATE {} SET {} = '{new_uri}/p={v}' WHERE {} = {}",
                        q("SDS"),
                        q("LOCATION"),
                        q("SD_ID"),
                        p.sd_id
                    ));
                }
            }
            self.tables.insert((db.clone(), new_name.clone()), table);
            let renamed = (db.clone(), new_name.clone());
            let mut c = Change::new(Op::RenameTable, &db, &t);
            c.new_db = db.clone();
            c.new_table = new_name;
            // Hive writes the row after moving the directory, inside the
            // same transaction; the files' paths change with it.
            let e = Event {
                id: StateId(id as u64),
                time_ms: Some(1_700_000_000_000),
                changes: vec![c],
            };
            self.writer.write_event(&e).expect("hive row");
            let rows = self.new_rows();
            let from = self.root.join(&old_rel);
            let to = self.root.join(&new_rel);
            std::fs::rename(&from, &to).unwrap();
            self.run_in_transaction(&sql, rows.last());
            self.next_id += 1;
            self.record_change(&renamed, Some(key));
            return id;
        };
        let e = Event {
            id: StateId(id as u64),
            time_ms: Some(1_700_000_000_000),
            changes: vec![change],
        };
        self.writer.write_event(&e).expect("hive row");
        let rows = self.new_rows();
        assert_eq!(rows.len(), 1, "one row per event");
        self.run_in_transaction(&sql, rows.last());
        if let Some(dir) = after_commit {
            let _ = std::fs::remove_dir_all(dir);
        }
        self.next_id += 1;
        self.record_change(key, None);
        id
    }

    /// Creates the unpartitioned transactional table `db.name` through its
    /// CREATE_TABLE event: every path of `files` (below the table,
    /// `delta_…/bucket_00000`) is written first, with `_orc_acid_version`
    /// beside it in its directory (and `_metadata_acid` in `base_` ones:
    /// neither is data). The oracle holds the files `visible` names: what
    /// the test worked out a Hive reader reads. Returns the event id.
    pub fn create_acid_table(
        &mut self,
        db: &str,
        name: &str,
        files: &[&str],
        visible: &[&str],
    ) -> i64 {
        let (rel, uri) = Self::dir(db, name, None);
        let mut written = BTreeMap::new();
        for path in files {
            let (sub, file) = path.rsplit_once('/').unwrap_or(("", path));
            let dir = if sub.is_empty() {
                rel.clone()
            } else {
                format!("{rel}/{sub}")
            };
            let f = self.write_file(&dir, file);
            let acid_dir = self.root.join(&dir);
            if !sub.is_empty() {
                std::fs::write(acid_dir.join("_orc_acid_version"), "2").unwrap();
            }
            if sub.starts_with("base_") {
                std::fs::write(
                    acid_dir.join("_metadata_acid"),
                    r#"{"thisFileVersion":"0","dataFormat":"compacted"}"#,
                )
                .unwrap();
            }
            written.insert(path.to_string(), f.known().unwrap().0);
        }
        let (tbl_id, sd_id) = (self.meta_id(), self.meta_id());
        let db_id = self.db_ids[db];
        let mut sql = self.table_rows(tbl_id, sd_id, db_id, name, &uri, false);
        sql.push(format!(
            "INSERT INTO {} ({}, {}, {}) VALUES ({tbl_id}, 'transactional', 'true')",
            self.q("TABLE_PARAMS"),
            self.q("TBL_ID"),
            self.q("PARAM_KEY"),
            self.q("PARAM_VALUE")
        ));
        let files: BTreeMap<String, BlobId> = visible
            .iter()
            .map(|v| (v.to_string(), written[*v]))
            .collect();
        let key = (db.to_owned(), name.to_owned());
        self.tables.insert(
            key.clone(),
            Table {
                tbl_id,
                sd_id,
                partitioned: false,
                partitions: [(
                    String::new(),
                    Partition {
                        part_id: 0,
                        sd_id,
                        files,
                    },
                )]
                .into(),
            },
        );
        let id = self.next_id;
        let e = Event {
            id: StateId(id as u64),
            time_ms: Some(1_700_000_000_000),
            changes: vec![Change::new(Op::CreateTable, db, name)],
        };
        self.writer.write_event(&e).expect("hive row");
        let rows = self.new_rows();
        self.run_in_transaction(&sql, rows.last());
        self.next_id += 1;
        self.record_change(&key, None);
        id
    }

    /// Sets Hive's transaction tables: `txns` (id, state `o`/`a`; a
    /// committed transaction has no row), `write_ids` (db, table, write id,
    /// txn) and each table's next write id; the transaction sequence goes
    /// past every id named. No event: Hive's OPEN_TXN and ALLOC_WRITE_ID
    /// change no data.
    pub fn set_txns(
        &mut self,
        txns: &[(i64, char)],
        write_ids: &[(&str, &str, i64, i64)],
        next_write_id: &[(&str, &str, i64)],
    ) {
        let q = |n: &str| self.q(n);
        let mut sql = vec![
            format!("DELETE FROM {}", q("TXNS")),
            format!("DELETE FROM {}", q("TXN_TO_WRITE_ID")),
            format!("DELETE FROM {}", q("NEXT_WRITE_ID")),
        ];
        for (id, state) in txns {
            sql.push(format!(
                "INSERT INTO {} ({}, {}, {}, {}, {}, {}) VALUES ({id}, '{state}', 0, 0, 'hive', 'localhost')",
                q("TXNS"),
                q("TXN_ID"),
                q("TXN_STATE"),
                q("TXN_STARTED"),
                q("TXN_LAST_HEARTBEAT"),
                q("TXN_USER"),
                q("TXN_HOST")
            ));
        }
        for (db, t, wid, txn) in write_ids {
            sql.push(format!(
                "INSERT INTO {} ({}, {}, {}, {}) VALUES ({txn}, '{db}', '{t}', {wid})",
                q("TXN_TO_WRITE_ID"),
                q("T2W_TXNID"),
                q("T2W_DATABASE"),
                q("T2W_TABLE"),
                q("T2W_WRITEID")
            ));
        }
        for (db, t, next) in next_write_id {
            sql.push(format!(
                "INSERT INTO {} ({}, {}, {}) VALUES ('{db}', '{t}', {next})",
                q("NEXT_WRITE_ID"),
                q("NWI_DATABASE"),
                q("NWI_TABLE"),
                q("NWI_NEXT")
            ));
        }
        let top = txns.iter().map(|t| t.0).max().unwrap_or(0);
        if self.kind == Kind::MariaDb {
            sql.push(format!("UPDATE NEXT_TXN_ID SET NTXN_NEXT = {}", top + 1));
        }
        self.run_in_transaction(&sql, None);
    }

    /// Commits open transaction `txn`, which wrote `files` (paths below
    /// the unpartitioned table `db.table`, already in place): its
    /// `TXN_WRITE_NOTIFICATION_LOG` row, then in one transaction its `TXNS`
    /// row removed and the `COMMIT_TXN` event. The oracle gains the files.
    /// Returns the event id.
    pub fn commit_acid(&mut self, db: &str, table: &str, txn: i64, files: &[&str]) -> i64 {
        let (rel, _) = Self::dir(db, table, None);
        let mut refs = Vec::new();
        let key = (db.to_owned(), table.to_owned());
        for path in files {
            let bytes = std::fs::read(self.root.join(&rel).join(path)).unwrap();
            let (sub, name) = path.rsplit_once('/').expect("an ACID subdirectory");
            let blob = sha(&bytes);
            refs.push((
                FileRef::native(&format!("{rel}/{path}"), name, bytes.len() as u64, blob),
                Some(sub.to_owned()),
            ));
            let p = self
                .tables
                .get_mut(&key)
                .unwrap()
                .partitions
                .get_mut("")
                .unwrap();
            p.files.insert(path.to_string(), blob);
        }
        let id = self
            .writer
            .write_txn(
                1_700_000_000,
                &[stagefs::workload::hive_export::TxnFiles {
                    db: db.to_owned(),
                    table: table.to_owned(),
                    partition: None,
                    files: refs,
                }],
            )
            .expect("transaction rows");
        let mut commit = None;
        for line in self.new_lines() {
            let v: serde_json::Value = serde_json::from_str(&line).expect("row JSON");
            if v.get("WNL_TXNID").is_some() {
                let row = serde_json::from_value(v).expect("a write row");
                self.txn_rows.append_txn_write(&row);
            } else {
                commit = Some(serde_json::from_value::<NotificationRow>(v).expect("a row"));
            }
        }
        let sql = vec![format!(
            "DELETE FROM {} WHERE {} = {txn}",
            self.q("TXNS"),
            self.q("TXN_ID")
        )];
        self.run_in_transaction(&sql, commit.as_ref());
        assert_eq!(self.next_id, id);
        self.next_id += 1;
        self.record_change(&key, None);
        id
    }

    /// Files in the warehouse now.
    pub fn file_count(&self) -> usize {
        self.current.values().map(|t| t.len()).sum()
    }

    pub fn partition_count(&self) -> usize {
        self.tables
            .values()
            .filter(|t| t.partitioned)
            .map(|t| t.partitions.len())
            .sum()
    }

    /// Deletes notification rows `from..=to` (the cleaner: a gap).
    pub fn purge_events(&mut self, from: i64, to: i64) {
        let (log, eid) = (self.q("NOTIFICATION_LOG"), self.q("EVENT_ID"));
        self.admin.execute(&format!(
            "DELETE FROM {log} WHERE {eid} BETWEEN {from} AND {to}"
        ));
    }
}
