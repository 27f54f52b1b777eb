//! Writes notification rows the way Hive's `DbNotificationListener` does,
//! into a test metastore database ([`super::dbserver`]).
//!
//! [`MetastoreWriter::append`] takes the id as the listener does: in one
//! database transaction it locks the `NOTIFICATION_SEQUENCE` row with
//! `SELECT … FOR UPDATE`, inserts the `NOTIFICATION_LOG` row with that
//! `EVENT_ID`, bumps `NEXT_EVENT_ID` and commits, so ids commit in order
//! even with several writers. `NL_ID` comes from its own counter, as Hive's
//! does (DataNucleus' SEQUENCE_TABLE), so it differs from `EVENT_ID`.
//! [`MetastoreWriter::delete_events`] is the cleaner that purges old events and
//! leaves a gap. [`gzip_json`] is the `gzip(json-2.0)` encoding.
//! [`ExportPump`] copies rows exported as JSON Lines (by
//! `stagefs::workload::hive_export`, which turns a native workload into Hive rows)
//! into the database as they are written.
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;

use base64::Engine;
use stagefs::source::hive::model::{NotificationRow, TxnWriteRow};

use crate::dbserver::{Admin, DbServer, Kind, TableCase};

/// What a caller of the listener supplies; the writer assigns the ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    pub event_time: i64,
    pub event_type: String,
    pub cat_name: Option<String>,
    pub db_name: Option<String>,
    pub tbl_name: Option<String>,
    pub message: Option<String>,
    pub message_format: Option<String>,
}

impl NewEvent {
    /// A json-0.2 event on `db.tbl`.
    pub fn json(event_type: &str, db: &str, tbl: &str, message: &str) -> NewEvent {
        NewEvent {
            event_time: 1_700_000_000,
            event_type: event_type.into(),
            cat_name: Some("hive".into()),
            db_name: Some(db.into()),
            tbl_name: Some(tbl.into()),
            message: Some(message.into()),
            message_format: Some("json-0.2".into()),
        }
    }

    /// A gzip(json-2.0) event on `db.tbl` carrying `json`.
    pub fn gzip(event_type: &str, db: &str, tbl: &str, json: &str) -> NewEvent {
        NewEvent {
            message: Some(gzip_json(json)),
            message_format: Some("gzip(json-2.0)".into()),
            ..NewEvent::json(event_type, db, tbl, "")
        }
    }
}

/// `gzip(json-2.0)`: standard padded base64 of gzip of the UTF-8 JSON.
pub fn gzip_json(json: &str) -> String {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(json.as_bytes()).expect("gzip");
    let bytes = gz.finish().expect("gzip");
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The text of one file of tests/data/hive-samples/.
pub fn sample(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/hive-samples")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim_end()
        .to_string()
}

pub struct MetastoreWriter {
    admin: Admin,
    log: String,
    seq: String,
    txn: String,
}

impl MetastoreWriter {
    pub fn new(server: &DbServer, db: &str, case: TableCase) -> MetastoreWriter {
        let name = |upper: &str| match case {
            TableCase::Upper => upper.to_string(),
            TableCase::Lower => upper.to_ascii_lowercase(),
        };
        assert!(
            server.kind == Kind::MariaDb || case == TableCase::Upper,
            "Hive's PostgreSQL tables are upper case"
        );
        MetastoreWriter {
            admin: server.admin(db),
            log: name("NOTIFICATION_LOG"),
            seq: name("NOTIFICATION_SEQUENCE"),
            txn: name("TXN_WRITE_NOTIFICATION_LOG"),
        }
    }

    /// Appends an exported row (`--hive-events` JSON Lines, e.g. from
    /// `stagefs::workload::hive_export`) the listener's way; its `EVENT_ID` must be
    /// the sequence's next id.
    pub fn append_exported(&mut self, row: &NotificationRow) {
        let event = NewEvent {
            event_time: row.event_time.unwrap_or(0),
            event_type: row.event_type.clone(),
            cat_name: row.cat_name.clone(),
            db_name: row.db_name.clone(),
            tbl_name: row.tbl_name.clone(),
            message: row.message.as_deref().map(str::to_owned),
            message_format: row.message_format.clone(),
        };
        let stored = self.append(&event);
        assert_eq!(
            stored.event_id, row.event_id,
            "exported ids must follow the sequence"
        );
    }

    /// What `DbNotificationListener.addNotificationLog` does; returns the
    /// row as stored.
    pub fn append(&mut self, event: &NewEvent) -> NotificationRow {
        let (log, seq) = (self.log.clone(), self.seq.clone());
        match &mut self.admin {
            Admin::Postgres(client) => {
                let mut tx = client.transaction().expect("begin");
                let next: i64 = tx
                    .query_one(
                        &format!(
                            r#"SELECT "NEXT_EVENT_ID" FROM "{seq}" WHERE "NNI_ID" = 1 FOR UPDATE"#
                        ),
                        &[],
                    )
                    .expect("lock the sequence")
                    .get(0);
                let nl_id: i64 = tx
                    .query_one(
                        &format!(r#"SELECT COALESCE(MAX("NL_ID"), 99) + 1 FROM "{log}""#),
                        &[],
                    )
                    .expect("next NL_ID")
                    .get(0);
                let row = stored(event, next, nl_id);
                insert_pg(&mut tx, &log, &row);
                tx.execute(
                    &format!(r#"UPDATE "{seq}" SET "NEXT_EVENT_ID" = $1 WHERE "NNI_ID" = 1"#),
                    &[&(next + 1)],
                )
                .expect("bump the sequence");
                tx.commit().expect("commit");
                row
            }
            Admin::MariaDb(conn) => {
                use mysql::prelude::Queryable;
                let mut tx = conn
                    .start_transaction(mysql::TxOpts::default())
                    .expect("begin");
                let next: i64 = tx
                    .query_first(format!(
                        "SELECT `NEXT_EVENT_ID` FROM `{seq}` WHERE `NNI_ID` = 1 FOR UPDATE"
                    ))
                    .expect("lock the sequence")
                    .expect("the sequence row");
                let nl_id: i64 = tx
                    .query_first(format!(
                        "SELECT COALESCE(MAX(`NL_ID`), 99) + 1 FROM `{log}`"
                    ))
                    .expect("next NL_ID")
                    .expect("a row");
                let row = stored(event, next, nl_id);
                insert_mysql(&mut tx, &log, &row);
                tx.exec_drop(
                    format!("UPDATE `{seq}` SET `NEXT_EVENT_ID` = ? WHERE `NNI_ID` = 1"),
                    (next + 1,),
                )
                .expect("bump the sequence");
                tx.commit().expect("commit");
                row
            }
        }
    }

    /// Inserts `row` verbatim, bypassing the sequence (odd rows, any order).
    pub fn insert_row(&mut self, row: &NotificationRow) {
        let log = self.log.clone();
        match &mut self.admin {
            Admin::Postgres(client) => {
                let mut tx = client.transaction().expect("begin");
                insert_pg(&mut tx, &log, row);
                tx.commit().expect("commit");
            }
            Admin::MariaDb(conn) => {
                let mut tx = conn
                    .start_transaction(mysql::TxOpts::default())
                    .expect("begin");
                insert_mysql(&mut tx, &log, row);
                tx.commit().expect("commit");
            }
        }
    }

    /// Sets `NEXT_EVENT_ID` (as after events written by [`Self::insert_row`]).
    pub fn set_next_event_id(&mut self, next: i64) {
        let seq = self.seq.clone();
        match &mut self.admin {
            Admin::Postgres(c) => {
                c.execute(
                    &format!(r#"UPDATE "{seq}" SET "NEXT_EVENT_ID" = $1"#),
                    &[&next],
                )
                .expect("set the sequence");
            }
            Admin::MariaDb(c) => {
                use mysql::prelude::Queryable;
                c.exec_drop(format!("UPDATE `{seq}` SET `NEXT_EVENT_ID` = ?"), (next,))
                    .expect("set the sequence");
            }
        }
    }

    /// One `TXN_WRITE_NOTIFICATION_LOG` row, as `addWriteNotificationLog`
    /// writes it before the transaction commits; `WNL_ID` is assigned here.
    pub fn append_txn_write(&mut self, row: &TxnWriteRow) -> TxnWriteRow {
        let txn = self.txn.clone();
        let mut row = row.clone();
        match &mut self.admin {
            Admin::Postgres(client) => {
                let mut tx = client.transaction().expect("begin");
                let wnl_id: i64 = tx
                    .query_one(
                        &format!(r#"SELECT COALESCE(MAX("WNL_ID"), 0) + 1 FROM "{txn}""#),
                        &[],
                    )
                    .expect("next WNL_ID")
                    .get(0);
                row.wnl_id = Some(wnl_id);
                tx.execute(
                    &format!(
                        r#"INSERT INTO "{txn}" ("WNL_ID", "WNL_TXNID", "WNL_WRITEID", "WNL_DATABASE", "WNL_TABLE", "WNL_PARTITION", "WNL_TABLE_OBJ", "WNL_PARTITION_OBJ", "WNL_FILES", "WNL_EVENT_TIME") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"#
                    ),
                    &[
                        &wnl_id,
                        &row.txn_id,
                        &row.write_id.unwrap_or(0),
                        &row.database,
                        &row.table,
                        &row.partition.clone().unwrap_or_default(),
                        &row.table_obj.clone().unwrap_or_default(),
                        &row.partition_obj,
                        &row.files,
                        &(row.event_time.unwrap_or(0) as i32),
                    ],
                )
                .expect("insert the write row");
                tx.commit().expect("commit");
            }
            Admin::MariaDb(conn) => {
                use mysql::prelude::Queryable;
                let mut tx = conn
                    .start_transaction(mysql::TxOpts::default())
                    .expect("begin");
                let wnl_id: i64 = tx
                    .query_first(format!(
                        "SELECT COALESCE(MAX(`WNL_ID`), 0) + 1 FROM `{txn}`"
                    ))
                    .expect("next WNL_ID")
                    .expect("a row");
                row.wnl_id = Some(wnl_id);
                tx.exec_drop(
                    format!(
                        "INSERT INTO `{txn}` (WNL_ID, WNL_TXNID, WNL_WRITEID, WNL_DATABASE, WNL_TABLE, WNL_PARTITION, WNL_TABLE_OBJ, WNL_PARTITION_OBJ, WNL_FILES, WNL_EVENT_TIME) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    ),
                    mysql::Params::Positional(vec![
                        wnl_id.into(),
                        row.txn_id.into(),
                        row.write_id.unwrap_or(0).into(),
                        row.database.clone().into(),
                        row.table.clone().into(),
                        row.partition.clone().unwrap_or_default().into(),
                        row.table_obj.clone().unwrap_or_default().into(),
                        row.partition_obj.clone().into(),
                        row.files.clone().into(),
                        row.event_time.unwrap_or(0).into(),
                    ]),
                )
                .expect("insert the write row");
                tx.commit().expect("commit");
            }
        }
        // The columns are NOT NULL: what was stored for a None.
        row.write_id = Some(row.write_id.unwrap_or(0));
        row.partition = Some(row.partition.unwrap_or_default());
        row.table_obj = Some(row.table_obj.unwrap_or_default());
        row.event_time = Some(row.event_time.unwrap_or(0));
        row
    }

    /// The cleaner: deletes the events with `from <= EVENT_ID <= to`.
    pub fn delete_events(&mut self, from: i64, to: i64) {
        let log = self.log.clone();
        match &mut self.admin {
            Admin::Postgres(c) => {
                c.execute(
                    &format!(r#"DELETE FROM "{log}" WHERE "EVENT_ID" BETWEEN $1 AND $2"#),
                    &[&from, &to],
                )
                .expect("delete events");
            }
            Admin::MariaDb(c) => {
                use mysql::prelude::Queryable;
                c.exec_drop(
                    format!("DELETE FROM `{log}` WHERE `EVENT_ID` BETWEEN ? AND ?"),
                    (from, to),
                )
                .expect("delete events");
            }
        }
    }

    /// Runs one statement on the writer's connection.
    pub fn execute(&mut self, sql: &str) {
        self.admin.execute(sql);
    }
}

fn stored(event: &NewEvent, event_id: i64, nl_id: i64) -> NotificationRow {
    NotificationRow {
        nl_id: Some(nl_id),
        event_id,
        event_time: Some(event.event_time),
        event_type: event.event_type.clone(),
        cat_name: event.cat_name.clone(),
        db_name: event.db_name.clone(),
        tbl_name: event.tbl_name.clone(),
        message: event.message.as_deref().map(Into::into),
        message_format: event.message_format.clone(),
    }
}

fn insert_pg(tx: &mut postgres::Transaction<'_>, log: &str, row: &NotificationRow) {
    tx.execute(
        &format!(
            r#"INSERT INTO "{log}" ("NL_ID", "EVENT_ID", "EVENT_TIME", "EVENT_TYPE", "CAT_NAME", "DB_NAME", "TBL_NAME", "MESSAGE", "MESSAGE_FORMAT") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"#
        ),
        &[
            &row.nl_id.unwrap_or(row.event_id),
            &row.event_id,
            &(row.event_time.unwrap_or(0) as i32),
            &row.event_type,
            &row.cat_name,
            &row.db_name,
            &row.tbl_name,
            &row.message.as_deref(),
            &row.message_format,
        ],
    )
    .expect("insert the notification row");
}

fn insert_mysql(tx: &mut mysql::Transaction<'_>, log: &str, row: &NotificationRow) {
    use mysql::prelude::Queryable;
    tx.exec_drop(
        format!(
            "INSERT INTO `{log}` (`NL_ID`, `EVENT_ID`, `EVENT_TIME`, `EVENT_TYPE`, `CAT_NAME`, `DB_NAME`, `TBL_NAME`, `MESSAGE`, `MESSAGE_FORMAT`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        ),
        mysql::Params::Positional(vec![
            row.nl_id.unwrap_or(row.event_id).into(),
            row.event_id.into(),
            row.event_time.unwrap_or(0).into(),
            row.event_type.clone().into(),
            row.cat_name.clone().into(),
            row.db_name.clone().into(),
            row.tbl_name.clone().into(),
            row.message.as_deref().map(str::to_owned).into(),
            row.message_format.clone().into(),
        ]),
    )
    .expect("insert the notification row");
}

/// Copies the rows of a `--hive-events` JSON Lines file into a metastore
/// database, from where the last pump stopped.
pub struct ExportPump {
    path: PathBuf,
    offset: usize,
    /// The last EVENT_ID copied.
    pub last: i64,
}

impl ExportPump {
    pub fn new(path: &std::path::Path) -> ExportPump {
        ExportPump {
            path: path.to_owned(),
            offset: 0,
            last: 0,
        }
    }

    /// Copies every complete line written since the last call.
    pub fn pump(&mut self, writer: &mut MetastoreWriter) -> usize {
        let text = std::fs::read_to_string(&self.path)
            .unwrap_or_else(|e| panic!("{}: {e}", self.path.display()));
        let mut copied = 0;
        while let Some(end) = text[self.offset..].find('\n') {
            let line = &text[self.offset..self.offset + end];
            self.offset += end + 1;
            if line.trim().is_empty() {
                continue;
            }
            let value: serde_json::Value = serde_json::from_str(line).expect("JSON row");
            if value.get("WNL_TXNID").is_some() {
                let row: TxnWriteRow = serde_json::from_value(value).expect("write row");
                writer.append_txn_write(&row);
            } else {
                let row: NotificationRow = serde_json::from_value(value).expect("notification row");
                writer.append_exported(&row);
                self.last = row.event_id;
            }
            copied += 1;
        }
        copied
    }
}
