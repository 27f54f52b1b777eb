//! The metastore row source against real servers: a private PostgreSQL and
//! a private MariaDB (tests/common/dbserver.rs), with rows written the way
//! Hive's DbNotificationListener writes them (tests/common/metastore_rows.rs).
//!
//! Starting a server costs seconds, so each server runs once and one test
//! per server walks through the cases, each in its own database; the
//! server is stopped when that test ends, also on panic. The restart case
//! runs last because it stops and restarts the server.

#[path = "common/dbserver.rs"]
mod dbserver;
#[path = "common/metastore_rows.rs"]
mod metastore_rows;

use std::time::{Duration, Instant};

use dbserver::{DbServer, Kind, TableCase, PASSWORD};
use metastore_rows::{gzip_json, sample, MetastoreWriter, NewEvent};
use stagefs::source::hive::metastore::{MetastoreSource, Timeouts};
use stagefs::source::hive::model::{NotificationRow, RowSource, RowSourceError, TxnWriteRow};

fn timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(3),
        statement: Duration::from_secs(10),
    }
}

fn open(server: &DbServer, db: &str) -> MetastoreSource {
    MetastoreSource::open(&server.url(db), Some(PASSWORD.into()), timeouts())
        .unwrap_or_else(|e| panic!("open {}: {e}", server.url(db)))
}

fn fresh(server: &DbServer, db: &str) -> (MetastoreWriter, MetastoreSource) {
    server.create_metastore(db, TableCase::Upper);
    (
        MetastoreWriter::new(server, db, TableCase::Upper),
        open(server, db),
    )
}

fn ids(rows: &[NotificationRow]) -> Vec<i64> {
    rows.iter().map(|r| r.event_id).collect()
}

/// Every error text, in every form, must be free of the password.
fn assert_no_password(error: &RowSourceError, password: &str) {
    let forms = [error.to_string(), format!("{error:?}")];
    for form in forms {
        assert!(!form.contains(password), "password leaked: {form}");
    }
}

fn fatal_reason(result: Result<MetastoreSource, RowSourceError>, password: &str) -> String {
    match result {
        Err(e @ RowSourceError::Fatal(_)) => {
            assert_no_password(&e, password);
            e.to_string()
        }
        Err(other) => panic!("expected Fatal, got {other:?}"),
        Ok(source) => panic!("expected Fatal, opened {source:?}"),
    }
}

/// A json-0.2 message big enough to matter: an INSERT with `files` file
/// URIs whose checksums do not compress away.
fn large_insert_message(files: usize) -> String {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut uris = Vec::with_capacity(files);
    for i in 0..files {
        let mut checksum = String::new();
        for _ in 0..7 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            checksum.push_str(&format!("{:08x}", state >> 32));
        }
        uris.push(format!(
            "\"hdfs://nn1.example.com:8020/warehouse/sales.db/orders/ds=2024-01-01/{i:06}_0#{checksum}#hdfs://nn1.example.com:8020/cmroot#\""
        ));
    }
    format!(
        r#"{{"server":"thrift://hms1.example.com:9083","servicePrincipal":"","db":"sales","table":"orders","tableType":"MANAGED_TABLE","tableObjJson":"{{}}","ptnObjJson":null,"timestamp":1700000100,"replace":"false","files":[{}]}}"#,
        uris.join(",")
    )
}

fn rows_come_back_in_event_id_order_with_exact_values(server: &DbServer) {
    let (mut writer, mut source) = fresh(server, "exact");
    // Text latin1 can hold (MariaDB's Hive tables are latin1); PostgreSQL
    // also gets characters outside it.
    let comment = match server.kind {
        Kind::Postgres => "Prüfung café € — ü 日本語 ✓",
        Kind::MariaDb => "Prüfung café € — ü",
    };
    // Over 1 MB once compressed, whatever the gzip backend achieves on it
    // (zlib-rs packs 20,000 file URIs into 0.96 MB, miniz_oxide into more).
    let large = gzip_json(&large_insert_message(24_000));
    assert!(large.len() > 1_000_000, "{} bytes", large.len());
    let mut expected = vec![
        writer.append(&NewEvent::json(
            "CREATE_TABLE",
            "default",
            "sample_partitioned",
            &sample("02_create_table_partitioned.json"),
        )),
        writer.append(&NewEvent {
            message: Some(large),
            message_format: Some("gzip(json-2.0)".into()),
            ..NewEvent::json("INSERT", "sales", "orders", "")
        }),
        writer.append(&NewEvent::json(
            "ALTER_TABLE",
            "sales",
            "orders",
            &format!(r#"{{"comment":"{comment}"}}"#),
        )),
        writer.append(&NewEvent {
            cat_name: None,
            db_name: None,
            tbl_name: None,
            ..NewEvent::json(
                "COMMIT_TXN",
                "",
                "",
                &sample("16_commit_txn_in_notification_log.json"),
            )
        }),
        writer.append(&NewEvent {
            message_format: None,
            tbl_name: None,
            ..NewEvent::json(
                "CREATE_DATABASE",
                "sales",
                "",
                &sample("01_create_database.json"),
            )
        }),
        writer.append(&NewEvent {
            message: None,
            message_format: None,
            ..NewEvent::gzip("CREATE_DATABASE", "sales", "", "")
        }),
        writer.append(&NewEvent::gzip(
            "CREATE_DATABASE",
            "sales",
            "",
            &sample("01_create_database.json"),
        )),
    ];
    assert_eq!(
        ids(&expected),
        (1..=7).collect::<Vec<_>>(),
        "ids from the sequence"
    );
    // Stored out of EVENT_ID order, with NL_IDs running the other way:
    // the source orders by EVENT_ID, never by NL_ID or storage order.
    for (event_id, nl_id) in [(10, 3), (8, 2), (9, 1)] {
        let row = NotificationRow {
            nl_id: Some(nl_id),
            event_id,
            event_time: Some(1_700_000_000 + event_id),
            event_type: "OPEN_TXN".into(),
            cat_name: None,
            db_name: None,
            tbl_name: None,
            message: Some(sample("14_open_txn.json").into()),
            message_format: Some("json-0.2".into()),
        };
        writer.insert_row(&row);
        expected.push(row);
    }
    expected.sort_by_key(|r| r.event_id);
    let got = source.poll(0, 100).expect("poll");
    assert_eq!(ids(&got), ids(&expected));
    for (got, want) in got.iter().zip(&expected) {
        assert_eq!(got, want, "event {}", want.event_id);
    }
    assert_eq!(source.poll(10, 100).expect("poll"), vec![]);
}

fn batches_respect_the_limit(server: &DbServer) {
    let (mut writer, mut source) = fresh(server, "batches");
    for i in 0..25 {
        writer.append(&NewEvent::json("INSERT", "db", &format!("t{i}"), "{}"));
    }
    assert_eq!(
        ids(&source.poll(0, 10).unwrap()),
        (1..=10).collect::<Vec<_>>()
    );
    assert_eq!(
        ids(&source.poll(10, 10).unwrap()),
        (11..=20).collect::<Vec<_>>()
    );
    assert_eq!(
        ids(&source.poll(20, 10).unwrap()),
        (21..=25).collect::<Vec<_>>()
    );
    assert_eq!(source.poll(25, 10).unwrap(), vec![]);
    assert_eq!(source.poll(3, 0).unwrap(), vec![]);
    assert_eq!(ids(&source.poll(-5, 2).unwrap()), vec![1, 2]);
}

fn txn_writes_of_one_transaction_in_wnl_id_order(server: &DbServer) {
    let (mut writer, mut source) = fresh(server, "txn_writes");
    let template: TxnWriteRow =
        serde_json::from_str(&sample("18_txn_write_notification_log_row.json")).expect("sample 18");
    let row = |txn_id: i64, table: &str, partition: Option<&str>, files: &str| TxnWriteRow {
        wnl_id: None,
        txn_id,
        table: table.into(),
        partition: partition.map(str::to_string),
        partition_obj: partition.and(template.partition_obj.clone()),
        files: Some(files.into()),
        ..template.clone()
    };
    let first = writer.append_txn_write(&row(
        41,
        "orders_acid",
        Some("ds=2024-01-01"),
        "a#1##delta_1",
    ));
    let other = writer.append_txn_write(&row(42, "orders_acid", Some("ds=2024-01-01"), "x###"));
    let second =
        writer.append_txn_write(&row(41, "orders_acid", Some("ds=2024-01-02"), "b###]c###"));
    let third = writer.append_txn_write(&row(41, "customers", None, "d#2#cm#base_5"));
    assert_eq!(
        source.txn_writes(41).expect("txn 41"),
        vec![first, second, third]
    );
    assert_eq!(source.txn_writes(42).expect("txn 42"), vec![other]);
    assert_eq!(source.txn_writes(99).expect("txn 99"), vec![]);
}

/// A metastore older than Hive 3.2 has no TXN_WRITE_NOTIFICATION_LOG: the
/// source opens and polls, says it records no transactional writes, and
/// asking for a transaction's writes names what is missing.
fn a_metastore_without_the_txn_write_log_says_so(server: &DbServer) {
    let (mut writer, _) = fresh(server, "hive31");
    let drop = match server.kind {
        Kind::Postgres => "DROP TABLE \"TXN_WRITE_NOTIFICATION_LOG\"",
        Kind::MariaDb => "DROP TABLE `TXN_WRITE_NOTIFICATION_LOG`",
    };
    server.admin("hive31").execute(drop);
    let row = writer.append(&NewEvent::json("COMMIT_TXN", "db", "t", "{\"txnid\": 1}"));
    let mut source = open(server, "hive31");
    assert_eq!(source.poll(0, 10).unwrap(), vec![row]);
    assert!(!source.records_txn_writes().unwrap());
    let err = source.txn_writes(1).unwrap_err().to_string();
    assert!(
        err.contains("TXN_WRITE_NOTIFICATION_LOG does not exist"),
        "{err}"
    );
    assert!(err.contains("older than Hive 3.2"), "{err}");
    let (_, mut with_log) = fresh(server, "hive4");
    assert!(with_log.records_txn_writes().unwrap());
}

fn newest_event_id_follows_the_sequence(server: &DbServer) {
    let (mut writer, mut source) = fresh(server, "newest");
    assert_eq!(source.newest_event_id().unwrap(), Some(0));
    for _ in 0..3 {
        writer.append(&NewEvent::json("INSERT", "db", "t", "{}"));
    }
    assert_eq!(source.newest_event_id().unwrap(), Some(3));
    writer.delete_events(1, 3);
    assert_eq!(
        source.newest_event_id().unwrap(),
        Some(3),
        "the cleaner keeps the sequence"
    );
    writer.set_next_event_id(1_000_000_001);
    assert_eq!(source.newest_event_id().unwrap(), Some(1_000_000_000));
}

fn cleaner_gap_is_returned_as_stored(server: &DbServer) {
    let (mut writer, mut source) = fresh(server, "gap");
    for _ in 0..6 {
        writer.append(&NewEvent::json("INSERT", "db", "t", "{}"));
    }
    writer.delete_events(2, 4);
    assert_eq!(ids(&source.poll(0, 10).unwrap()), vec![1, 5, 6]);
    assert_eq!(ids(&source.poll(1, 1).unwrap()), vec![5]);
}

/// Several writers at once: each commit takes the next id under the
/// sequence lock, so a reader polling meanwhile only ever sees a
/// contiguous prefix, and in the end every id exactly once.
fn concurrent_writers_commit_ids_in_order(server: &DbServer) {
    let (_, mut source) = fresh(server, "concurrent");
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let mut writer = MetastoreWriter::new(server, "concurrent", TableCase::Upper);
            std::thread::spawn(move || {
                for i in 0..25 {
                    writer.append(&NewEvent::json("INSERT", "db", &format!("w{w}_{i}"), "{}"));
                }
            })
        })
        .collect();
    let mut seen: Vec<i64> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < 100 {
        assert!(
            Instant::now() < deadline,
            "only {} events after 60 s",
            seen.len()
        );
        let after = seen.last().copied().unwrap_or(0);
        for row in source.poll(after, 7).expect("poll") {
            assert_eq!(row.event_id, seen.len() as i64 + 1, "gap or repeat");
            seen.push(row.event_id);
        }
    }
    for writer in writers {
        writer.join().expect("writer thread");
    }
    assert_eq!(seen, (1..=100).collect::<Vec<_>>());
    assert_eq!(source.poll(100, 10).unwrap(), vec![]);
}

fn bad_configuration_is_fatal_without_the_password(server: &DbServer) {
    server.create_metastore("config", TableCase::Upper);
    server.create_database("empty");
    let url = server.url("config");

    let wrong = "Wrong-pw-4711";
    let reason = fatal_reason(
        MetastoreSource::open(&url, Some(wrong.into()), timeouts()),
        wrong,
    );
    assert!(reason.contains(&url), "names the source: {reason}");
    assert!(!reason.contains(PASSWORD), "{reason}");
    let reason = fatal_reason(MetastoreSource::open(&url, None, timeouts()), PASSWORD);
    assert!(reason.contains(&url), "{reason}");

    let reason = fatal_reason(
        MetastoreSource::open(&server.url("no_such_db"), Some(PASSWORD.into()), timeouts()),
        PASSWORD,
    );
    assert!(reason.contains("no_such_db"), "{reason}");

    let reason = fatal_reason(
        MetastoreSource::open(&server.url("empty"), Some(PASSWORD.into()), timeouts()),
        PASSWORD,
    );
    assert!(
        reason.to_ascii_uppercase().contains("NOTIFICATION_LOG"),
        "{reason}"
    );

    let url_with_password = url.replacen("stagefs@", &format!("stagefs:{PASSWORD}@"), 1);
    let reason = fatal_reason(
        MetastoreSource::open(&url_with_password, None, timeouts()),
        PASSWORD,
    );
    assert!(reason.contains("STAGEFS_METASTORE_PASSWORD"), "{reason}");

    // ?password_file= works without the caller's password, and wins over it.
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    std::fs::write(&good, format!("{PASSWORD}\n")).unwrap();
    let bad = dir.path().join("bad");
    std::fs::write(&bad, format!("{wrong}\n")).unwrap();
    let mut source = MetastoreSource::open(
        &format!("{url}?password_file={}", good.display()),
        None,
        timeouts(),
    )
    .expect("password file");
    assert_eq!(source.poll(0, 10).unwrap(), vec![]);
    assert_eq!(source.describe(), url);
    assert!(!format!("{source:?}").contains(PASSWORD));
    fatal_reason(
        MetastoreSource::open(
            &format!("{url}?password_file={}", bad.display()),
            Some(PASSWORD.into()),
            timeouts(),
        ),
        wrong,
    );

    // Nobody listens on a fresh free port: the source opens disconnected
    // and every call is Unavailable, quickly.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let refused = url.replace(&format!(":{}/", server.port()), &format!(":{port}/"));
    let mut source = MetastoreSource::open(&refused, Some(PASSWORD.into()), timeouts())
        .expect("an unreachable server is not fatal");
    assert!(!source.is_connected());
    let started = Instant::now();
    match source.poll(0, 10) {
        Err(e @ RowSourceError::Unavailable(_)) => {
            assert_no_password(&e, PASSWORD);
            assert!(e.to_string().contains(&refused), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// Row 1 is read first (the rows before a bad one are replicated), then
/// row 2 is a bad row naming its id, at `location`, for `reason`.
fn bad_row_after_row_1(source: &mut MetastoreSource, location: &str, reason: &str) {
    assert_eq!(
        ids(&source.poll(0, 10).unwrap()),
        vec![1],
        "rows before it still read"
    );
    match source.poll(1, 10) {
        Err(RowSourceError::BadRow {
            location: got,
            reason: why,
            event_id,
        }) => {
            assert!(got.ends_with(location), "{got}");
            assert!(why.contains(reason), "{why}");
            assert_eq!(event_id, Some(2));
        }
        other => panic!("{other:?}"),
    }
}

fn unreadable_column_is_a_bad_row(server: &DbServer) {
    let (mut writer, mut source) = fresh(server, "badrow");
    writer.append(&NewEvent::json("INSERT", "db", "t", "{}"));
    writer.execute(match server.kind {
        Kind::Postgres => {
            r#"ALTER TABLE "NOTIFICATION_LOG" ALTER COLUMN "EVENT_TYPE" DROP NOT NULL"#
        }
        Kind::MariaDb => "ALTER TABLE `NOTIFICATION_LOG` MODIFY `EVENT_TYPE` varchar(32) NULL",
    });
    writer.execute(match server.kind {
        Kind::Postgres => {
            r#"INSERT INTO "NOTIFICATION_LOG" ("NL_ID", "EVENT_ID", "EVENT_TIME", "EVENT_TYPE") VALUES (500, 2, 0, NULL)"#
        }
        Kind::MariaDb => {
            "INSERT INTO `NOTIFICATION_LOG` (`NL_ID`, `EVENT_ID`, `EVENT_TIME`, `EVENT_TYPE`) VALUES (500, 2, 0, NULL)"
        }
    });
    // The rows before the bad one come first (they are replicated), then
    // the bad one is reported with its id.
    bad_row_after_row_1(
        &mut source,
        "NOTIFICATION_LOG EVENT_ID 2, column EVENT_TYPE",
        "NULL",
    );
    assert!(source.is_connected(), "a bad row is no reason to reconnect");
}

/// PostgreSQL only: a SQL_ASCII database holds bytes that are not UTF-8;
/// the server cannot send them, and the row is named, not skipped.
fn non_utf8_text_is_a_bad_row(server: &DbServer) {
    server
        .admin("postgres")
        .execute(r#"CREATE DATABASE "ascii" ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'"#);
    let mut admin = server.admin("ascii");
    for statement in dbserver::schema(Kind::Postgres, TableCase::Upper) {
        admin.execute(&statement);
    }
    admin.execute(
        r#"INSERT INTO "NOTIFICATION_LOG" ("NL_ID", "EVENT_ID", "EVENT_TIME", "EVENT_TYPE", "MESSAGE") VALUES (1, 1, 0, 'INSERT', '{}'), (2, 2, 0, 'INSERT', E'{"x":"\xff\xfe"}'), (3, 3, 0, 'INSERT', '{}')"#,
    );
    let mut source = open(server, "ascii");
    bad_row_after_row_1(&mut source, "NOTIFICATION_LOG EVENT_ID 2", "0xff");
}

/// MariaDB only: Hive's tables spelled in lower case are found.
fn lower_case_tables_are_found(server: &DbServer) {
    server.create_metastore("lower", TableCase::Lower);
    let mut writer = MetastoreWriter::new(server, "lower", TableCase::Lower);
    let rows: Vec<_> = (0..3)
        .map(|_| writer.append(&NewEvent::json("INSERT", "db", "t", "{}")))
        .collect();
    let template: TxnWriteRow =
        serde_json::from_str(&sample("18_txn_write_notification_log_row.json")).expect("sample 18");
    let write = writer.append_txn_write(&template);
    let mut source = open(server, "lower");
    assert_eq!(source.poll(0, 10).unwrap(), rows);
    assert_eq!(source.newest_event_id().unwrap(), Some(3));
    assert_eq!(source.txn_writes(template.txn_id).unwrap(), vec![write]);
}

/// The server stops mid-run: calls are Unavailable (not Fatal, no hang);
/// after the restart polling resumes where it was, nothing lost or
/// repeated, on the old source (it reconnects) and on one opened while the
/// server was down.
fn stopped_server_is_unavailable_then_polling_resumes(server: &mut DbServer) {
    let (mut writer, mut source) = fresh(server, "restart");
    for _ in 0..5 {
        writer.append(&NewEvent::json("INSERT", "db", "t", "{}"));
    }
    let mut seen = ids(&source.poll(0, 3).unwrap());
    assert_eq!(seen, vec![1, 2, 3]);
    drop(writer);

    server.stop();
    let started = Instant::now();
    for call in 0..3 {
        let result = match call {
            0 => source.poll(3, 10).map(|_| ()),
            1 => source.newest_event_id().map(|_| ()),
            _ => source.txn_writes(1).map(|_| ()),
        };
        match result {
            Err(e @ RowSourceError::Unavailable(_)) => assert_no_password(&e, PASSWORD),
            other => panic!("call {call} while stopped: {other:?}"),
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(!source.is_connected());
    let mut opened_while_down =
        MetastoreSource::open(&server.url("restart"), Some(PASSWORD.into()), timeouts())
            .expect("a stopped server is not fatal");
    assert!(!opened_while_down.is_connected());

    server.restart();
    let mut writer = MetastoreWriter::new(server, "restart", TableCase::Upper);
    for _ in 0..5 {
        writer.append(&NewEvent::json("INSERT", "db", "t", "{}"));
    }
    let after = *seen.last().unwrap();
    seen.extend(ids(&source
        .poll(after, 100)
        .expect("poll after the restart")));
    assert_eq!(seen, (1..=10).collect::<Vec<_>>());
    assert_eq!(
        ids(&opened_while_down.poll(0, 100).unwrap()),
        (1..=10).collect::<Vec<_>>()
    );
    assert_eq!(source.newest_event_id().unwrap(), Some(10));
}

fn run_cases(kind: Kind) {
    let mut server = DbServer::start(kind);
    rows_come_back_in_event_id_order_with_exact_values(&server);
    batches_respect_the_limit(&server);
    txn_writes_of_one_transaction_in_wnl_id_order(&server);
    a_metastore_without_the_txn_write_log_says_so(&server);
    newest_event_id_follows_the_sequence(&server);
    cleaner_gap_is_returned_as_stored(&server);
    concurrent_writers_commit_ids_in_order(&server);
    bad_configuration_is_fatal_without_the_password(&server);
    unreadable_column_is_a_bad_row(&server);
    match kind {
        Kind::Postgres => non_utf8_text_is_a_bad_row(&server),
        Kind::MariaDb => lower_case_tables_are_found(&server),
    }
    stopped_server_is_unavailable_then_polling_resumes(&mut server);
}

#[test]
fn postgres_metastore_rows_batches_errors_and_restart() {
    run_cases(Kind::Postgres);
}

#[test]
fn mariadb_metastore_rows_batches_errors_and_restart() {
    run_cases(Kind::MariaDb);
}
