//! Decoding Hive's notification log: every sample in tests/data/hive-samples/
//! decodes to the message it records (real values asserted), every
//! DecodeError class is reachable from bad input with a message naming the
//! problem, and no input (arbitrary bytes, mutated samples) panics.

use std::collections::BTreeSet;
use std::path::PathBuf;

use base64::Engine;
use proptest::prelude::*;
use stagefs::source::hive::message::{
    decode_message, decode_text_limited, decode_txn_write, DecodeError, MESSAGE_EVENT_TYPES,
};
use stagefs::source::hive::model::{
    FileUri, HiveMessage, HivePartition, NotificationRow, TxnWriteRow,
};
use stagefs::source::hive::thrift;

/// Hive's messages, one per file (tests/data/README.md).
fn samples_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/hive-samples");
    assert!(dir.is_dir(), "Hive samples not found at {}", dir.display());
    dir
}

fn sample(name: &str) -> String {
    let path = samples_dir().join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
        .trim_end()
        .to_string()
}

fn row(event_type: &str, message: &str, format: Option<&str>) -> NotificationRow {
    NotificationRow {
        nl_id: Some(1),
        event_id: 1,
        event_time: Some(1_700_000_000),
        event_type: event_type.into(),
        cat_name: Some("hive".into()),
        db_name: None,
        tbl_name: None,
        message: Some(message.into()),
        message_format: format.map(Into::into),
    }
}

fn decode(event_type: &str, file: &str) -> HiveMessage {
    decode_message(&row(event_type, &sample(file), Some("json-0.2")))
        .unwrap_or_else(|e| panic!("{file} does not decode: {e}"))
}

fn plain(path: &str) -> FileUri {
    FileUri {
        path: path.into(),
        checksum: None,
        cm_root: None,
        subdir: None,
    }
}

const CM: &str = "hdfs://nn1.example.com:8020/user/hive/cmroot";
const CK_A: &str = "0000020000000000000000005d41402abc4b2a76b9719d911017c592";
const CK_B: &str = "0000020000000000000000007d793037a0760186574b0282f2f435e7";
const TMP: &str = "hdfs://hdcluster/warehouse/tablespace/managed/hive/tmp_db.db/notification_test";
const SALES: &str = "hdfs://nn1.example.com:8020/warehouse/tablespace/managed/hive/sales.db";

/// The sample files this test knows; a new sample fails the test until it
/// is given an expectation here.
const KNOWN: &[&str] = &[
    "01_create_database.gzip-json-2.0.txt",
    "01_create_database.json",
    "02_create_table_partitioned.json",
    "03_add_partition.json",
    "04_alter_table_add_column.json",
    "05_drop_partition.json",
    "06_alter_partition.json",
    "07_drop_table.json",
    "08_create_table_ctas_with_files.json",
    "09_insert_overwrite_partition.json",
    "10_insert_into_unpartitioned_cm_off.json",
    "11_alter_table_rename.json",
    "12_alter_table_truncate.json",
    "13_drop_database.json",
    "14_open_txn.json",
    "15_alloc_write_id.json",
    "16_commit_txn_in_notification_log.json",
    "17_abort_txn.json",
    "18_txn_write_notification_log_row.json",
    "19_commit_txn_repl_dump_payload.json",
];

#[test]
fn every_sample_file_has_an_expectation() {
    let present: BTreeSet<String> = std::fs::read_dir(samples_dir())
        .expect("list hive-samples")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let known: BTreeSet<String> = KNOWN.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        present, known,
        "samples without an expectation (or missing)"
    );
}

#[test]
fn create_database_json_and_gzip_forms_agree() {
    let json = decode("CREATE_DATABASE", "01_create_database.json");
    assert_eq!(json, HiveMessage::CreateDatabase { db: "sales".into() });
    let gz = decode_message(&row(
        "CREATE_DATABASE",
        &sample("01_create_database.gzip-json-2.0.txt"),
        Some("gzip(json-2.0)"),
    ))
    .unwrap();
    assert_eq!(gz, json);
    let db_json = thrift::database_from_json(
        serde_json::from_str::<serde_json::Value>(&sample("01_create_database.json")).unwrap()
            ["dbJson"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        db_json.location.as_deref(),
        Some("hdfs://nn1.example.com:8020/warehouse/tablespace/external/hive/sales.db")
    );
    assert_eq!(db_json.managed_location.as_deref(), Some(SALES));
}

#[test]
fn create_table_partitioned_gives_keys_location_and_no_files() {
    let HiveMessage::CreateTable { table, files } =
        decode("CREATE_TABLE", "02_create_table_partitioned.json")
    else {
        panic!("not CreateTable")
    };
    assert_eq!(table.db, "tmp_db");
    assert_eq!(table.name, "notification_test");
    assert_eq!(table.partition_keys, vec!["day"]);
    assert_eq!(table.location.as_deref(), Some(TMP));
    assert_eq!(table.table_type.as_deref(), Some("MANAGED_TABLE"));
    assert_eq!(table.parameters.len(), 2);
    assert_eq!(table.parameters["bucketing_version"], "2");
    assert_eq!(table.parameters["transient_lastDdlTime"], "1616068620");
    assert!(files.is_empty());
}

#[test]
fn add_partition_matches_files_to_the_partition_by_name() {
    let HiveMessage::AddPartition {
        table,
        partitions,
        files,
    } = decode("ADD_PARTITION", "03_add_partition.json")
    else {
        panic!("not AddPartition")
    };
    assert_eq!(
        (table.db.as_str(), table.name.as_str()),
        ("tmp_db", "notification_test")
    );
    assert_eq!(
        partitions,
        vec![HivePartition {
            values: vec!["2021-03-18".into()],
            location: Some(format!("{TMP}/day=2021-03-18")),
        }]
    );
    let expected: Vec<FileUri> = (0..5)
        .map(|i| plain(&format!("{TMP}/day=2021-03-18/00000{i}_0")))
        .collect();
    assert_eq!(files, vec![expected]);
}

#[test]
fn alter_table_add_column_is_neither_rename_nor_truncate() {
    let HiveMessage::AlterTable {
        before,
        after,
        is_truncate,
    } = decode("ALTER_TABLE", "04_alter_table_add_column.json")
    else {
        panic!("not AlterTable")
    };
    assert!(!is_truncate);
    assert_eq!(
        (before.db.as_str(), before.name.as_str()),
        ("tmp_db", "notification_test")
    );
    assert_eq!(
        (after.db.as_str(), after.name.as_str()),
        ("tmp_db", "notification_test")
    );
    assert_eq!(after.partition_keys, vec!["day"]);
    assert_eq!(before.parameters.len(), 2);
    assert_eq!(after.parameters["last_modified_by"], "hive");
    assert_eq!(after.parameters.len(), 4);
}

#[test]
fn drop_partition_gives_values_in_key_order() {
    let HiveMessage::DropPartition { table, partitions } =
        decode("DROP_PARTITION", "05_drop_partition.json")
    else {
        panic!("not DropPartition")
    };
    assert_eq!(table.name, "notification_test");
    assert_eq!(partitions, vec![vec!["2021-03-17".to_string()]]);
}

#[test]
fn alter_partition_gives_before_and_after() {
    let HiveMessage::AlterPartition {
        table,
        before,
        after,
        is_truncate,
    } = decode("ALTER_PARTITION", "06_alter_partition.json")
    else {
        panic!("not AlterPartition")
    };
    assert_eq!(table.partition_keys, vec!["day"]);
    assert!(!is_truncate);
    let p = HivePartition {
        values: vec!["2021-03-18".into()],
        location: Some(format!("{TMP}/day=2021-03-18")),
    };
    assert_eq!(before, p);
    assert_eq!(after, p);
}

#[test]
fn drop_table_names_the_table() {
    assert_eq!(
        decode("DROP_TABLE", "07_drop_table.json"),
        HiveMessage::DropTable {
            db: "tmp_db".into(),
            table: "notification_test".into()
        }
    );
}

#[test]
fn ctas_carries_files_with_checksum_and_cm_root() {
    let HiveMessage::CreateTable { table, files } =
        decode("CREATE_TABLE", "08_create_table_ctas_with_files.json")
    else {
        panic!("not CreateTable")
    };
    assert_eq!(
        (table.db.as_str(), table.name.as_str()),
        ("sales", "orders_ctas")
    );
    assert!(table.partition_keys.is_empty());
    assert_eq!(
        table.location.as_deref(),
        Some(format!("{SALES}/orders_ctas").as_str())
    );
    assert_eq!(
        files,
        vec![
            FileUri {
                path: format!("{SALES}/orders_ctas/000000_0"),
                checksum: Some(CK_A.into()),
                cm_root: Some(CM.into()),
                subdir: None,
            },
            FileUri {
                path: format!("{SALES}/orders_ctas/000001_0"),
                checksum: Some(CK_B.into()),
                cm_root: Some(CM.into()),
                subdir: None,
            },
        ]
    );
    assert_eq!(
        files[0].cm_path().as_deref(),
        Some(format!("{CM}/000000_0_{CK_A}").as_str())
    );
}

#[test]
fn insert_overwrite_into_a_partition_replaces() {
    let HiveMessage::Insert {
        table,
        partition,
        replace,
        files,
    } = decode("INSERT", "09_insert_overwrite_partition.json")
    else {
        panic!("not Insert")
    };
    assert!(replace);
    assert_eq!(
        (table.db.as_str(), table.name.as_str()),
        ("sales", "orders")
    );
    assert_eq!(table.partition_keys, vec!["ds"]);
    assert_eq!(
        partition,
        Some(HivePartition {
            values: vec!["2024-01-01".into()],
            location: Some(format!("{SALES}/orders/ds=2024-01-01")),
        })
    );
    assert_eq!(
        files,
        vec![FileUri {
            path: format!("{SALES}/orders/ds=2024-01-01/000000_0"),
            checksum: Some(CK_A.into()),
            cm_root: Some(CM.into()),
            subdir: None,
        }]
    );
}

#[test]
fn insert_into_unpartitioned_table_has_no_partition_and_appends() {
    let HiveMessage::Insert {
        table,
        partition,
        replace,
        files,
    } = decode("INSERT", "10_insert_into_unpartitioned_cm_off.json")
    else {
        panic!("not Insert")
    };
    assert!(!replace);
    assert_eq!(table.name, "customers");
    assert_eq!(partition, None);
    assert_eq!(
        files,
        vec![plain(&format!("{SALES}/customers/000000_0_copy_1"))]
    );
}

#[test]
fn rename_gives_old_and_new_table() {
    let HiveMessage::AlterTable {
        before,
        after,
        is_truncate,
    } = decode("ALTER_TABLE", "11_alter_table_rename.json")
    else {
        panic!("not AlterTable")
    };
    assert!(!is_truncate);
    assert_eq!(
        (before.db.as_str(), before.name.as_str()),
        ("sales", "orders")
    );
    assert_eq!(
        (after.db.as_str(), after.name.as_str()),
        ("sales", "orders_v2")
    );
    assert_eq!(
        before.location.as_deref(),
        Some(format!("{SALES}/orders").as_str())
    );
    assert_eq!(
        after.location.as_deref(),
        Some(format!("{SALES}/orders_v2").as_str())
    );
    assert_eq!(after.partition_keys, vec!["ds"]);
}

#[test]
fn truncate_is_flagged() {
    let HiveMessage::AlterTable {
        before,
        after,
        is_truncate,
    } = decode("ALTER_TABLE", "12_alter_table_truncate.json")
    else {
        panic!("not AlterTable")
    };
    assert!(is_truncate);
    assert_eq!(before.name, "customers");
    assert_eq!(after.name, "customers");
}

#[test]
fn drop_database_names_it() {
    assert_eq!(
        decode("DROP_DATABASE", "13_drop_database.json"),
        HiveMessage::DropDatabase { db: "sales".into() }
    );
}

#[test]
fn transaction_bookkeeping_is_no_data_and_commit_carries_the_txn_id() {
    for (ty, file) in [
        ("OPEN_TXN", "14_open_txn.json"),
        ("ALLOC_WRITE_ID_EVENT", "15_alloc_write_id.json"),
        ("ABORT_TXN", "17_abort_txn.json"),
    ] {
        assert_eq!(
            decode(ty, file),
            HiveMessage::NoData {
                event_type: ty.into()
            }
        );
    }
    assert_eq!(
        decode("COMMIT_TXN", "16_commit_txn_in_notification_log.json"),
        HiveMessage::CommitTxn { txn_id: 101 }
    );
    assert_eq!(
        decode("COMMIT_TXN", "19_commit_txn_repl_dump_payload.json"),
        HiveMessage::CommitTxn { txn_id: 101 }
    );
}

#[test]
fn txn_write_row_gives_table_partition_and_delta_files() {
    let r: TxnWriteRow =
        serde_json::from_str(&sample("18_txn_write_notification_log_row.json")).unwrap();
    assert_eq!(r.txn_id, 101);
    let w = decode_txn_write(&r).unwrap();
    assert_eq!(
        (w.table.db.as_str(), w.table.name.as_str()),
        ("sales", "orders_acid")
    );
    assert_eq!(w.table.parameters["transactional"], "true");
    assert_eq!(w.table.parameters["transactional_properties"], "default");
    assert_eq!(
        w.partition,
        Some(HivePartition {
            values: vec!["2024-01-01".into()],
            location: Some(format!("{SALES}/orders_acid/ds=2024-01-01")),
        })
    );
    let delta = "delta_0000001_0000001_0000";
    assert_eq!(
        w.files,
        vec![
            FileUri {
                path: format!("{SALES}/orders_acid/ds=2024-01-01/{delta}/bucket_00000_0"),
                checksum: Some(CK_A.into()),
                cm_root: Some(CM.into()),
                subdir: Some(delta.into()),
            },
            FileUri {
                path: format!("{SALES}/orders_acid/ds=2024-01-01/{delta}/_orc_acid_version"),
                checksum: None,
                cm_root: None,
                subdir: Some(delta.into()),
            },
        ]
    );
    // Without the Partition object the values come from WNL_PARTITION.
    let w2 = decode_txn_write(&TxnWriteRow {
        partition_obj: None,
        ..r
    })
    .unwrap();
    assert_eq!(
        w2.partition,
        Some(HivePartition {
            values: vec!["2024-01-01".into()],
            location: None
        })
    );
}

#[test]
fn null_format_and_unknown_fields_and_real_booleans_are_accepted() {
    let mut v: serde_json::Value =
        serde_json::from_str(&sample("09_insert_overwrite_partition.json")).unwrap();
    v["replace"] = serde_json::Value::Bool(false);
    v["cat"] = "hive".into();
    v["locOwner"] = serde_json::json!({"x": [1, 2]});
    let m = decode_message(&row("INSERT", &v.to_string(), None)).unwrap();
    assert!(matches!(m, HiveMessage::Insert { replace: false, .. }));
    v["replace"] = "TRUE".into();
    let m = decode_message(&row("INSERT", &v.to_string(), Some(""))).unwrap();
    assert!(matches!(m, HiveMessage::Insert { replace: true, .. }));
}

#[test]
fn add_partition_with_several_partitions_and_escaped_names() {
    let table = r#"{"1":{"str":"t"},"2":{"str":"d"},"7":{"rec":{"2":{"str":"hdfs://n/d.db/t"}}},"8":{"lst":["rec",2,{"1":{"str":"ds"}},{"1":{"str":"city"}}]}}"#;
    let part = |ds: &str, city: &str, loc: &str| {
        format!(
            r#"{{"1":{{"lst":["str",2,"{ds}","{city}"]}},"6":{{"rec":{{"2":{{"str":"{loc}"}}}}}}}}"#
        )
    };
    let msg = serde_json::json!({
        "db": "d", "table": "t", "tableObjJson": table,
        "partitions": [{"ds": "1", "city": "a/b"}, {"ds": "2", "city": "c"}],
        "partitionListJson": [
            part("1", "a/b", "hdfs://n/d.db/t/ds=1/city=a%2Fb"),
            part("2", "c", "hdfs://n/d.db/t/ds=2/city=c"),
        ],
        "partitionFiles": [
            {"partitionName": "ds=2/city=c", "files": ["hdfs://n/d.db/t/ds=2/city=c/f2###"]},
            {"partitionName": "ds=1/city=a%2Fb", "files": ["hdfs://n/d.db/t/ds=1/city=a%2Fb/f1###"]},
        ],
    });
    let HiveMessage::AddPartition {
        partitions, files, ..
    } = decode_message(&row("ADD_PARTITION", &msg.to_string(), None)).unwrap()
    else {
        panic!("not AddPartition")
    };
    assert_eq!(partitions[0].values, vec!["1", "a/b"]);
    assert_eq!(partitions[1].values, vec!["2", "c"]);
    assert_eq!(files[0], vec![plain("hdfs://n/d.db/t/ds=1/city=a%2Fb/f1")]);
    assert_eq!(files[1], vec![plain("hdfs://n/d.db/t/ds=2/city=c/f2")]);
}

#[test]
fn drop_partition_reorders_spec_values_to_the_table_keys() {
    let table = r#"{"1":{"str":"t"},"2":{"str":"d"},"8":{"lst":["rec",2,{"1":{"str":"z"}},{"1":{"str":"a"}}]}}"#;
    let msg = serde_json::json!({
        "tableObjJson": table,
        // serde_json sorts object keys; the table's key order must win.
        "partitions": [{"z": "1", "a": "2"}, {"a": "4", "z": "3"}],
    });
    assert_eq!(
        decode_message(&row("DROP_PARTITION", &msg.to_string(), None)).unwrap(),
        HiveMessage::DropPartition {
            table: thrift::table_from_json(table).unwrap(),
            partitions: vec![vec!["1".into(), "2".into()], vec!["3".into(), "4".into()]],
        }
    );
}

// ---- bad input: one test per DecodeError class ----

fn gzip_b64(bytes: &[u8]) -> String {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    base64::engine::general_purpose::STANDARD.encode(enc.finish().unwrap())
}

fn err(event_type: &str, message: &str, format: Option<&str>) -> DecodeError {
    match decode_message(&row(event_type, message, format)) {
        Ok(m) => panic!("decoded {m:?} from bad input"),
        Err(e) => e,
    }
}

fn with(file: &str, field: &str, value: serde_json::Value) -> String {
    let mut v: serde_json::Value = serde_json::from_str(&sample(file)).unwrap();
    v[field] = value;
    v.to_string()
}

#[test]
fn unknown_format_is_rejected() {
    let e = err("INSERT", "{}", Some("thrift"));
    assert_eq!(e, DecodeError::UnknownFormat("thrift".into()));
    assert!(e.to_string().contains("unknown MESSAGE_FORMAT \"thrift\""));
}

#[test]
fn bad_base64_is_rejected() {
    let e = err("INSERT", "H4sI***", Some("gzip(json-2.0)"));
    assert!(matches!(e, DecodeError::BadBase64 { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("bad base64 in a gzip(json-2.0) message"),
        "{e}"
    );
}

#[test]
fn bad_gzip_is_rejected() {
    let not_gzip = base64::engine::general_purpose::STANDARD.encode(b"{\"txnid\":1}");
    let e = err("COMMIT_TXN", &not_gzip, Some("gzip"));
    assert!(matches!(e, DecodeError::BadGzip { .. }), "{e:?}");
    // A truncated stream is bad gzip too.
    let full = gzip_b64(sample("09_insert_overwrite_partition.json").as_bytes());
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(full)
        .unwrap();
    let cut = base64::engine::general_purpose::STANDARD.encode(&bytes[..bytes.len() / 2]);
    let e = err("INSERT", &cut, Some("gzip"));
    assert!(matches!(e, DecodeError::BadGzip { .. }), "{e:?}");
}

#[test]
fn gzip_bomb_is_stopped_at_the_limit() {
    let bomb = gzip_b64(&vec![b' '; 8 << 20]);
    assert!(
        bomb.len() < 64 << 10,
        "a real bomb: {} bytes compressed",
        bomb.len()
    );
    let e = decode_text_limited(&bomb, Some("gzip"), 1 << 20).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the gzip message decompresses to more than 1048576 bytes"
    );
}

#[test]
fn non_utf8_after_gzip_is_rejected() {
    let e = err("INSERT", &gzip_b64(&[b'{', 0xff, 0xfe, b'}']), Some("gzip"));
    assert!(matches!(e, DecodeError::BadUtf8 { .. }), "{e:?}");
}

#[test]
fn bad_json_is_rejected() {
    assert!(matches!(
        err("INSERT", "{\"db\":", None),
        DecodeError::BadJson(_)
    ));
    let e = err("INSERT", "[1,2]", None);
    assert_eq!(e.to_string(), "bad JSON: the message is not a JSON object");
    // gzip of bad JSON
    assert!(matches!(
        err("INSERT", &gzip_b64(b"not json"), Some("gzip(json-2.0)")),
        DecodeError::BadJson(_)
    ));
}

#[test]
fn bad_thrift_json_names_the_field() {
    let e = err(
        "INSERT",
        &with(
            "09_insert_overwrite_partition.json",
            "tableObjJson",
            r#"{"1":{"i32":7},"2":{"str":"sales"}}"#.into(),
        ),
        None,
    );
    assert_eq!(
        e.to_string(),
        "bad Thrift-JSON in tableObjJson: field 1 (tableName): expected str, found an integer"
    );
    let e = err(
        "INSERT",
        &with(
            "09_insert_overwrite_partition.json",
            "ptnObjJson",
            r#"{"1":{"lst":["str",3,"2024-01-01"]}}"#.into(),
        ),
        None,
    );
    assert!(
        e.to_string().starts_with(
            "bad Thrift-JSON in ptnObjJson: field 1: the list declares 3 elements but has 1"
        ),
        "{e}"
    );
    let e = err(
        "ALTER_TABLE",
        &with(
            "11_alter_table_rename.json",
            "tableObjAfterJson",
            r#"{"1":{"str":"x"}}"#.into(),
        ),
        None,
    );
    assert_eq!(
        e.to_string(),
        "bad Thrift-JSON in tableObjAfterJson: missing required field 2 (dbName)"
    );
}

#[test]
fn missing_fields_are_named() {
    assert_eq!(
        err("COMMIT_TXN", r#"{"timestamp":1}"#, None),
        DecodeError::MissingField("txnid".into())
    );
    let mut v: serde_json::Value =
        serde_json::from_str(&sample("09_insert_overwrite_partition.json")).unwrap();
    v.as_object_mut().unwrap().remove("tableObjJson");
    assert_eq!(
        err("INSERT", &v.to_string(), None).to_string(),
        "missing field tableObjJson"
    );
    let mut r = row("INSERT", "", None);
    r.message = None;
    assert_eq!(
        decode_message(&r).unwrap_err(),
        DecodeError::MissingField("MESSAGE".into())
    );
    // A no-data event without a message is fine.
    r.event_type = "OPEN_TXN".into();
    assert!(matches!(decode_message(&r), Ok(HiveMessage::NoData { .. })));
}

#[test]
fn bad_field_values_are_named() {
    let e = err(
        "INSERT",
        &with(
            "09_insert_overwrite_partition.json",
            "replace",
            "yes".into(),
        ),
        None,
    );
    assert_eq!(
        e.to_string(),
        "field replace: expected \"true\" or \"false\", found \"yes\""
    );
    let e = err("COMMIT_TXN", r#"{"txnid":"abc"}"#, None);
    assert_eq!(
        e.to_string(),
        "field txnid: \"abc\" is not a 64-bit integer"
    );
    let e = err(
        "INSERT",
        &with(
            "09_insert_overwrite_partition.json",
            "ptnObjJson",
            serde_json::Value::Null,
        ),
        None,
    );
    assert!(
        e.to_string()
            .starts_with("field ptnObjJson: null, but sales.orders is partitioned"),
        "{e}"
    );
    let e = err(
        "INSERT",
        &with(
            "09_insert_overwrite_partition.json",
            "ptnObjJson",
            r#"{"1":{"lst":["str",2,"a","b"]}}"#.into(),
        ),
        None,
    );
    assert!(e.to_string().contains("2 partition values"), "{e}");
    let e = err(
        "DROP_PARTITION",
        &with(
            "05_drop_partition.json",
            "partitions",
            serde_json::json!([{"month": "3"}]),
        ),
        None,
    );
    assert_eq!(
        e.to_string(),
        "field partitions[0]: no value for partition key \"day\""
    );
    let e = err(
        "ADD_PARTITION",
        &with(
            "03_add_partition.json",
            "partitionFiles",
            serde_json::json!([{"partitionName": "day=2099-01-01", "files": []}]),
        ),
        None,
    );
    assert_eq!(
        e.to_string(),
        "field partitionFiles[0].partitionName: \"day=2099-01-01\" is not among the added partitions"
    );
    let e = err(
        "CREATE_TABLE",
        &with(
            "08_create_table_ctas_with_files.json",
            "files",
            "f###".into(),
        ),
        None,
    );
    assert_eq!(
        e.to_string(),
        "field files: expected an array, found a string"
    );
}

#[test]
fn bad_file_uris_and_partition_names_are_named() {
    let e = err(
        "INSERT",
        &with(
            "10_insert_into_unpartitioned_cm_off.json",
            "files",
            serde_json::json!(["#ab#cm#"]),
        ),
        None,
    );
    assert!(matches!(e, DecodeError::BadPath { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "files[0]: file URI \"#ab#cm#\" has no path before '#'"
    );
    let e = err(
        "INSERT",
        &with(
            "10_insert_into_unpartitioned_cm_off.json",
            "files",
            serde_json::json!(["p#zz#cm#"]),
        ),
        None,
    );
    assert!(e.to_string().contains("checksum \"zz\" is not hex"), "{e}");
    let e = err(
        "ADD_PARTITION",
        &with(
            "03_add_partition.json",
            "partitionFiles",
            serde_json::json!([{"partitionName": "day", "files": []}]),
        ),
        None,
    );
    assert!(matches!(e, DecodeError::BadPath { .. }), "{e:?}");
    let mut r: TxnWriteRow =
        serde_json::from_str(&sample("18_txn_write_notification_log_row.json")).unwrap();
    r.files = Some("a#b#c#d#e".into());
    let e = decode_txn_write(&r).unwrap_err();
    assert!(e.to_string().starts_with("WNL_FILES: file URI"), "{e}");
    r.table_obj = None;
    assert_eq!(
        decode_txn_write(&r).unwrap_err(),
        DecodeError::MissingField("WNL_TABLE_OBJ".into())
    );
}

// ---- never panics ----

const FORMATS: &[Option<&str>] = &[None, Some("json-0.2"), Some("gzip(json-2.0)"), Some("gzip")];

fn sample_messages() -> Vec<(String, String)> {
    [
        ("CREATE_DATABASE", "01_create_database.json"),
        ("CREATE_TABLE", "02_create_table_partitioned.json"),
        ("ADD_PARTITION", "03_add_partition.json"),
        ("ALTER_TABLE", "04_alter_table_add_column.json"),
        ("DROP_PARTITION", "05_drop_partition.json"),
        ("ALTER_PARTITION", "06_alter_partition.json"),
        ("DROP_TABLE", "07_drop_table.json"),
        ("CREATE_TABLE", "08_create_table_ctas_with_files.json"),
        ("INSERT", "09_insert_overwrite_partition.json"),
        ("INSERT", "10_insert_into_unpartitioned_cm_off.json"),
        ("ALTER_TABLE", "11_alter_table_rename.json"),
        ("COMMIT_TXN", "16_commit_txn_in_notification_log.json"),
    ]
    .iter()
    .map(|(t, f)| (t.to_string(), sample(f)))
    .collect()
}

/// Inner Thrift-JSON texts of the samples, to mutate directly.
fn sample_thrift_texts() -> Vec<String> {
    let mut out = Vec::new();
    for (_, msg) in sample_messages() {
        let v: serde_json::Value = serde_json::from_str(&msg).unwrap();
        for (k, val) in v.as_object().unwrap() {
            if k.ends_with("Json") {
                if let Some(s) = val.as_str() {
                    out.push(s.to_string());
                }
            }
        }
    }
    out
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Delete(usize, usize),
    Insert(usize, u8),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let special = prop::sample::select(b"{}[]\",:\\#]/=%0123456789-e.tf ".to_vec());
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), 1usize..40).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (any::<usize>(), special).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(text: &str, muts: &[Mutation]) -> String {
    String::from_utf8_lossy(&mutate_bytes(text.as_bytes().to_vec(), muts)).into_owned()
}

fn mutate_bytes(mut b: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        if b.is_empty() {
            break;
        }
        match *m {
            Mutation::Flip(i, x) => {
                let i = i % b.len();
                b[i] ^= x | 1;
            }
            Mutation::Delete(i, n) => {
                let i = i % b.len();
                let end = (i + n).min(b.len());
                b.drain(i..end);
            }
            Mutation::Insert(i, x) => {
                let i = i % (b.len() + 1);
                b.insert(i, x);
            }
            Mutation::Truncate(i) => b.truncate(i % b.len()),
        }
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..400),
        ty in prop::sample::select([&MESSAGE_EVENT_TYPES[..], &["OPEN_TXN"]].concat()),
        format in prop::sample::select(FORMATS),
        gzip in any::<bool>(),
    ) {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let message = if gzip { gzip_b64(&bytes) } else { text.clone() };
        let _ = decode_message(&row(ty, &message, format));
        let _ = thrift::parse_struct(&text);
        let _ = decode_txn_write(&TxnWriteRow {
            wnl_id: None, txn_id: 1, write_id: None, database: "d".into(), table: "t".into(),
            partition: Some(text.clone()), table_obj: Some(text.clone()),
            partition_obj: Some(text.clone()), files: Some(text), event_time: None,
        });
    }

    #[test]
    fn mutated_samples_never_panic(
        which in any::<prop::sample::Index>(),
        muts in prop::collection::vec(mutation(), 1..8),
        gzip in any::<bool>(),
    ) {
        let samples = sample_messages();
        let (ty, msg) = &samples[which.index(samples.len())];
        let mutated = mutate(msg, &muts);
        if gzip {
            let _ = decode_message(&row(ty, &gzip_b64(mutated.as_bytes()), Some("gzip(json-2.0)")));
        } else {
            let _ = decode_message(&row(ty, &mutated, Some("json-0.2")));
        }
    }

    #[test]
    fn mutated_thrift_objects_never_panic(
        which in any::<prop::sample::Index>(),
        muts in prop::collection::vec(mutation(), 1..8),
    ) {
        let texts = sample_thrift_texts();
        let mutated = mutate(&texts[which.index(texts.len())], &muts);
        let _ = thrift::table_from_json(&mutated);
        let _ = thrift::partition_from_json(&mutated);
        let _ = thrift::database_from_json(&mutated);
    }

    #[test]
    fn mutated_gzip_streams_never_panic(
        muts in prop::collection::vec(mutation(), 1..6),
    ) {
        let b64 = sample("01_create_database.gzip-json-2.0.txt");
        let raw = base64::engine::general_purpose::STANDARD.decode(b64.trim()).unwrap();
        let mutated = mutate_bytes(raw, &muts);
        let _ = decode_message(&row(
            "CREATE_DATABASE",
            &base64::engine::general_purpose::STANDARD.encode(mutated),
            Some("gzip(json-2.0)"),
        ));
    }
}

// ---- HDFS checksums ----
//
// Two independent sources of expected values:
// - JuiceFS's HDFS-compatible checksum tests (juicedata/juicefs,
//   sdk/java/src/test/java/io/juicefs/JuiceFileSystemTest.java,
//   testChecksum): "world\n", "world", (128 MiB - 1) zero bytes in one
//   block, and 150 × 1,024,000 zero bytes in two 128 MiB blocks, all CRC32C
//   with 512 bytes per CRC; plus Hadoop's fixed empty-file value
//   (TestDistributedFileSystem: "MD5-of-0MD5-of-0CRC32:70bc8f4b...").
// - tests/data/hdfs_checksums.json, written by
//   scripts/hdfs_checksum_vectors.py (hashlib, zlib and a table CRC32C; it
//   checks itself against the JuiceFS values): one block, several blocks
//   with and without the DataOutputBuffer zero padding, both CRC types,
//   and COMPOSITE-CRC.

use stagefs::source::hive::checksum::{ChecksumVerifier, CrcType, HdfsChecksum, HdfsChecksummer};

/// The data of a vector (see the script).
fn lcg(size: usize) -> Vec<u8> {
    let mut x: u64 = 1;
    (0..size)
        .map(|_| {
            x = (x * 1103515245 + 12345) % (1 << 31);
            ((x >> 16) & 0xff) as u8
        })
        .collect()
}

fn crc_type(name: &str) -> CrcType {
    match name {
        "CRC32C" => CrcType::Crc32c,
        "CRC32" => CrcType::Crc32,
        other => panic!("unknown crc {other}"),
    }
}

fn computed_in_pieces(
    expected: &HdfsChecksum,
    ty: CrcType,
    data: &[u8],
    piece: usize,
) -> HdfsChecksum {
    let mut s = HdfsChecksummer::new(expected, &[ty]);
    for chunk in data.chunks(piece.max(1)) {
        s.update(chunk);
    }
    let mut out = s.finish();
    assert_eq!(out.len(), 1);
    out.remove(0).1
}

#[test]
fn checksums_match_the_independent_script_vectors() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/hdfs_checksums.json");
    let text = std::fs::read_to_string(&path).expect("read tests/data/hdfs_checksums.json");
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let vectors = doc["vectors"].as_array().unwrap();
    assert!(vectors.len() >= 20, "{} vectors", vectors.len());
    for v in vectors {
        let name = v["name"].as_str().unwrap();
        let size = v["size"].as_u64().unwrap() as usize;
        let ty = crc_type(v["crc"].as_str().unwrap());
        let hex = v["hex"].as_str().unwrap();
        let expected = HdfsChecksum::from_hex(hex).unwrap();
        let data = lcg(size);
        for piece in [1, 7, 512, 1 << 20] {
            let got = computed_in_pieces(&expected, ty, &data, piece);
            assert_eq!(got.to_hex(), hex, "{name} fed in pieces of {piece}");
        }
        // The verifier tries both CRC types and names the one that matched
        // (an empty file is always Hadoop's CRC32 fixed value).
        let mut verifier = ChecksumVerifier::from_hex(hex).unwrap();
        verifier.update(&data);
        let want = if size == 0 { CrcType::Crc32 } else { ty };
        assert_eq!(verifier.finish(), Ok(want), "{name}");
    }
}

#[test]
fn checksums_match_published_hdfs_compatible_values() {
    for (data, hex) in [
        (
            &b"world\n"[..],
            "000002000000000000000000a74dcf6d5ba98e50ae0182c9d5d886fe",
        ),
        (
            &b"world"[..],
            "00000200000000000000000005a157db1cc7549c82ec6f31f63fdb46",
        ),
        (
            &b""[..],
            "00000000000000000000000070bc8f4b72a86921468bf8e8441dce51",
        ),
    ] {
        let mut v = ChecksumVerifier::from_hex(hex).unwrap();
        v.update(data);
        let want = if data.is_empty() {
            CrcType::Crc32
        } else {
            CrcType::Crc32c
        };
        assert_eq!(v.finish(), Ok(want), "{data:?}");
    }
    let zeros = vec![0u8; 1 << 20];
    for (size, hex) in [
        // one block: crcPerBlock is reported as 0
        (
            (128u64 << 20) - 1,
            "0000020000000000000000001cf326bae8274fd824ec69ece3e4082f",
        ),
        // two 128 MiB blocks: crcPerBlock 262144
        (
            150 * 1_024_000,
            "0000020000000000000400007d04ac8132ad64988f7ba4d819cbde62",
        ),
    ] {
        let expected = HdfsChecksum::from_hex(hex).unwrap();
        let mut s = HdfsChecksummer::new(&expected, &[CrcType::Crc32c]);
        let mut left = size;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            s.update(&zeros[..n]);
            left -= n as u64;
        }
        assert_eq!(
            s.finish(),
            vec![(CrcType::Crc32c, expected)],
            "{size} zero bytes"
        );
    }
}

#[test]
fn checksum_mismatch_reports_expected_and_computed() {
    let hex = "000002000000000000000000a74dcf6d5ba98e50ae0182c9d5d886fe";
    let mut v = ChecksumVerifier::from_hex(hex).unwrap();
    v.update(b"World\n");
    let e = v.finish().unwrap_err();
    assert_eq!(e.expected, hex);
    assert_eq!(e.size, 6);
    assert_eq!(e.computed.len(), 2);
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!(
            "HDFS checksum mismatch over 6 bytes: expected {hex}, computed "
        )),
        "{msg}"
    );
    assert!(msg.contains("(CRC32C)") && msg.contains("(CRC32)"), "{msg}");
    assert!(ChecksumVerifier::from_hex("0102").is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn checksum_does_not_depend_on_how_bytes_are_fed(
        data in prop::collection::vec(any::<u8>(), 0..3000),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..10),
        bpc in 1u32..70,
        cpb in 0u64..6,
    ) {
        let layout = HdfsChecksum::Md5Md5Crc { bytes_per_crc: bpc, crc_per_block: cpb, md5: [0; 16] };
        let mut whole = HdfsChecksummer::for_expected(&layout);
        whole.update(&data);
        let whole = whole.finish();
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(data.len() + 1)).collect();
        points.sort_unstable();
        let mut pieces = HdfsChecksummer::for_expected(&layout);
        let mut at = 0;
        for p in points {
            pieces.update(&data[at..p]);
            at = p;
        }
        pieces.update(&data[at..]);
        prop_assert_eq!(pieces.finish(), whole);
    }

    #[test]
    fn a_changed_byte_is_detected(
        data in prop::collection::vec(any::<u8>(), 1..3000),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        bpc in 1u32..600,
        cpb in 0u64..6,
    ) {
        let layout = HdfsChecksum::Md5Md5Crc { bytes_per_crc: bpc, crc_per_block: cpb, md5: [0; 16] };
        let mut s = HdfsChecksummer::new(&layout, &[CrcType::Crc32c]);
        s.update(&data);
        let (_, expected) = s.finish().remove(0);
        let mut changed = data.clone();
        changed[at.index(data.len())] ^= flip;
        let mut v = ChecksumVerifier::new(expected);
        v.update(&changed);
        prop_assert!(v.finish().is_err());
    }
}
