use super::*;
use crate::event::Verify;
use crate::source::hive::file_refs::{premap_files, subdir_below};
use crate::source::Validator;
use std::sync::Arc;

fn table(db: &str, name: &str, keys: &[&str]) -> HiveTable {
    HiveTable {
        db: db.into(),
        name: name.into(),
        partition_keys: keys.iter().map(|k| k.to_string()).collect(),
        location: None,
        table_type: Some("MANAGED_TABLE".into()),
        parameters: BTreeMap::new(),
    }
}

fn part(values: &[&str]) -> HivePartition {
    HivePartition {
        values: values.iter().map(|v| v.to_string()).collect(),
        location: None,
    }
}

fn uri(path: &str, checksum: Option<&str>, subdir: Option<&str>) -> FileUri {
    FileUri {
        path: format!("hdfs://nn/wh/{path}"),
        checksum: checksum.map(Into::into),
        cm_root: checksum.map(|_| "hdfs://nn/cm".into()),
        subdir: subdir.map(Into::into),
    }
}

fn map() -> SourceMap {
    SourceMap::parse(&["hdfs://nn/wh=/srv/wh", "hdfs://nn/cm=/srv/cm"]).unwrap()
}

/// Applies messages in order as events 1, 2, ...; the tree after them.
fn apply_all(msgs: &[HiveMessage]) -> Result<Arc<Tree>, String> {
    apply_all_with(msgs, true)
}

/// [`apply_all`] from a source that has (or lacks) TXN_WRITE_NOTIFICATION_LOG.
fn apply_all_with(msgs: &[HiveMessage], txn_log: bool) -> Result<Arc<Tree>, String> {
    let map = map();
    let mut v = Validator::new(Arc::new(Tree::empty()));
    for (i, msg) in msgs.iter().enumerate() {
        let mut m = Mapper {
            map: &map,
            event_id: i as i64 + 1,
            event_time_ms: None,
            files: 0,
            tree: v.latest(),
            txn_log,
            premapped: None,
        };
        let changes = m.changes(msg)?;
        let event = Event {
            id: StateId(i as u64 + 1),
            time_ms: None,
            changes,
        };
        v.check(event, None, None).map_err(|r| r.to_string())?;
    }
    Ok(Arc::clone(v.latest()))
}

fn paths(tree: &Tree, db: &str, t: &str) -> Vec<String> {
    tree.table(db, t)
        .map(|t| t.files_below().into_iter().map(|(p, _)| p).collect())
        .unwrap_or_default()
}

fn setup() -> Vec<HiveMessage> {
    vec![
        HiveMessage::CreateDatabase { db: "Sales".into() },
        HiveMessage::CreateTable {
            table: table("sales", "Orders", &["ds", "region"]),
            files: vec![],
        },
    ]
}

#[test]
fn names_are_lower_cased_and_values_escaped_into_key_value_directories() {
    let mut msgs = setup();
    msgs.push(HiveMessage::Insert {
        table: table("sales", "orders", &["ds", "region"]),
        partition: Some(part(&["2024/01", ""])),
        replace: false,
        files: vec![uri("sales.db/orders/x/000000_0", None, None)],
    });
    let tree = apply_all(&msgs).unwrap();
    assert_eq!(
        paths(&tree, "sales", "orders"),
        vec!["ds=2024%2F01/region=__HIVE_DEFAULT_PARTITION__/000000_0"]
    );
}

#[test]
fn add_partition_of_several_then_drop_of_several() {
    let mut msgs = setup();
    let t = table("sales", "orders", &["ds", "region"]);
    msgs.push(HiveMessage::AddPartition {
        table: t.clone(),
        partitions: vec![part(&["1", "eu"]), part(&["1", "us"]), part(&["2", "eu"])],
        files: vec![
            vec![uri("o/ds=1/region=eu/a", Some("00"), None)],
            vec![],
            vec![uri("o/ds=2/region=eu/b", None, None)],
        ],
    });
    let tree = apply_all(&msgs).unwrap();
    assert_eq!(
        paths(&tree, "sales", "orders"),
        vec!["ds=1/region=eu/a", "ds=2/region=eu/b"]
    );
    msgs.push(HiveMessage::DropPartition {
        table: t,
        partitions: vec![vec!["1".into(), "eu".into()], vec!["2".into(), "eu".into()]],
    });
    let tree = apply_all(&msgs).unwrap();
    let orders = tree.table("sales", "orders").unwrap();
    assert!(paths(&tree, "sales", "orders").is_empty());
    // ds=1/region=us is still there (empty).
    assert!(orders.child("ds=1").is_some() && orders.child("ds=2").is_none());
}

#[test]
fn insert_overwrite_truncate_partition_and_truncate_table() {
    let mut msgs = setup();
    let t = table("sales", "orders", &["ds", "region"]);
    for (v, f, replace) in [("1", "a", false), ("1", "b", false), ("2", "c", false)] {
        msgs.push(HiveMessage::Insert {
            table: t.clone(),
            partition: Some(part(&[v, "eu"])),
            replace,
            files: vec![uri(&format!("o/{f}"), None, None)],
        });
    }
    msgs.push(HiveMessage::Insert {
        table: t.clone(),
        partition: Some(part(&["1", "eu"])),
        replace: true,
        files: vec![uri("o/d", None, None)],
    });
    let tree = apply_all(&msgs).unwrap();
    assert_eq!(
        paths(&tree, "sales", "orders"),
        vec!["ds=1/region=eu/d", "ds=2/region=eu/c"]
    );
    msgs.push(HiveMessage::AlterPartition {
        table: t.clone(),
        before: part(&["2", "eu"]),
        after: part(&["2", "eu"]),
        is_truncate: true,
    });
    let tree = apply_all(&msgs).unwrap();
    assert_eq!(paths(&tree, "sales", "orders"), vec!["ds=1/region=eu/d"]);
    msgs.push(HiveMessage::AlterTable {
        before: t.clone(),
        after: t,
        is_truncate: true,
    });
    let tree = apply_all(&msgs).unwrap();
    let orders = tree.table("sales", "orders").unwrap();
    assert!(paths(&tree, "sales", "orders").is_empty());
    assert!(orders.child("ds=1").is_some(), "partitions stay");
}

#[test]
fn rename_across_databases_and_ctas_and_drops() {
    let mut msgs = setup();
    msgs.push(HiveMessage::CreateDatabase {
        db: "archive".into(),
    });
    msgs.push(HiveMessage::CreateTable {
        table: table("sales", "summary", &[]),
        files: vec![uri("s/000000_0", Some("ab"), None)],
    });
    msgs.push(HiveMessage::AlterTable {
        before: table("sales", "summary", &[]),
        after: table("archive", "summary_2024", &[]),
        is_truncate: false,
    });
    let tree = apply_all(&msgs).unwrap();
    assert!(tree.table("sales", "summary").is_none());
    assert_eq!(paths(&tree, "archive", "summary_2024"), vec!["000000_0"]);
    msgs.push(HiveMessage::DropTable {
        db: "archive".into(),
        table: "summary_2024".into(),
    });
    msgs.push(HiveMessage::DropDatabase {
        db: "archive".into(),
    });
    let tree = apply_all(&msgs).unwrap();
    assert!(tree.database("archive").is_none());
}

fn with_params(mut t: HiveTable, table_type: &str, params: &[(&str, &str)]) -> HiveTable {
    t.table_type = Some(table_type.into());
    t.parameters = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    t
}

#[test]
fn external_tables_are_marked_not_in_log_and_the_mark_follows_alter_table() {
    let mut msgs = setup();
    let ext = with_params(table("sales", "raw", &[]), "EXTERNAL_TABLE", &[]);
    msgs.push(HiveMessage::CreateTable {
        table: ext.clone(),
        files: vec![],
    });
    // The parameter alone is enough (a table made external by ALTER).
    let by_param = with_params(
        table("sales", "logs", &[]),
        "MANAGED_TABLE",
        &[("external", "TRUE")],
    );
    msgs.push(HiveMessage::CreateTable {
        table: by_param,
        files: vec![],
    });
    let tree = apply_all(&msgs).unwrap();
    let marked: Vec<String> = tree.not_in_log().into_iter().map(|(t, _)| t).collect();
    assert_eq!(marked, vec!["sales.logs", "sales.raw"]);
    assert!(tree.not_in_log()[0].1.starts_with("external table"));
    // Renamed, it stays marked; made managed, the mark goes.
    let renamed = with_params(table("sales", "raw_2024", &[]), "EXTERNAL_TABLE", &[]);
    msgs.push(HiveMessage::AlterTable {
        before: ext,
        after: renamed.clone(),
        is_truncate: false,
    });
    let managed = with_params(renamed.clone(), "MANAGED_TABLE", &[]);
    let tree = apply_all(&msgs).unwrap();
    assert_eq!(tree.not_in_log()[1].0, "sales.raw_2024");
    msgs.push(HiveMessage::AlterTable {
        before: renamed,
        after: managed.clone(),
        is_truncate: false,
    });
    let tree = apply_all(&msgs).unwrap();
    assert_eq!(tree.not_in_log().len(), 1);
    // A managed table altered without a change of kind gets no mark.
    msgs.push(HiveMessage::AlterTable {
        before: managed.clone(),
        after: managed,
        is_truncate: false,
    });
    assert_eq!(apply_all(&msgs).unwrap().not_in_log().len(), 1);
}

#[test]
fn without_txn_write_log_transactional_tables_are_marked_and_commits_change_nothing() {
    let mut msgs = setup();
    let acid = with_params(
        table("sales", "acid", &["ds"]),
        "MANAGED_TABLE",
        &[("transactional", "true")],
    );
    msgs.push(HiveMessage::CreateTable {
        table: acid.clone(),
        files: vec![],
    });
    let old = apply_all_with(&msgs, false).unwrap();
    let marked = old.not_in_log();
    assert_eq!(marked.len(), 1, "{marked:?}");
    assert_eq!(marked[0].0, "sales.acid");
    assert!(
        marked[0].1.contains("TXN_WRITE_NOTIFICATION_LOG"),
        "{}",
        marked[0].1
    );
    // With the log (Hive 3.2 / 4.0), a transactional table is replicated.
    assert!(apply_all_with(&msgs, true).unwrap().not_in_log().is_empty());

    let cfg = HiveConfig::new(HiveRows::Files("x".into()), map());
    let rows = Flaky {
        rows: vec![NotificationRow {
            event_type: "COMMIT_TXN".into(),
            message: Some(r#"{"txnid": 7, "timestamp": 1}"#.into()),
            ..row(1)
        }],
        failures: 0,
        txn_log: false,
    };
    let mut src = HiveSource::new(Box::new(rows), &cfg, 0);
    let got = src.poll(10).unwrap();
    let e = src.decode(&got[0], &old).unwrap();
    assert_eq!((e.id, e.changes.len()), (StateId(1), 0));
}

#[test]
fn partition_rename_moves_the_partition_with_its_files() {
    let mut msgs = setup();
    let t = table("sales", "orders", &["ds", "region"]);
    msgs.push(HiveMessage::AddPartition {
        table: t.clone(),
        partitions: vec![part(&["1", "eu"]), part(&["1", "us"])],
        files: vec![
            vec![uri("o/ds=1/region=eu/a", Some("00"), Some("delta_1_1"))],
            vec![uri("o/ds=1/region=us/b", None, None)],
        ],
    });
    msgs.push(HiveMessage::AlterPartition {
        table: t.clone(),
        before: part(&["1", "eu"]),
        after: part(&["2024/01", "eu"]),
        is_truncate: false,
    });
    let tree = apply_all(&msgs).unwrap();
    assert_eq!(
        paths(&tree, "sales", "orders"),
        vec!["ds=1/region=us/b", "ds=2024%2F01/region=eu/delta_1_1/a"]
    );
    // Onto an existing partition, or from a missing one: rejected.
    for (from, to) in [
        (&["1", "us"], &["2024/01", "eu"]),
        (&["9", "eu"], &["8", "eu"]),
    ] {
        let mut bad = msgs.clone();
        bad.push(HiveMessage::AlterPartition {
            table: t.clone(),
            before: part(from),
            after: part(to),
            is_truncate: false,
        });
        let err = apply_all(&bad).unwrap_err();
        assert!(
            err.contains("already exists") || err.contains("does not exist"),
            "{err}"
        );
    }
    // The last partition below `ds=1` moved away: `ds=1` goes too.
    msgs.push(HiveMessage::AlterPartition {
        table: t,
        before: part(&["1", "us"]),
        after: part(&["3", "us"]),
        is_truncate: false,
    });
    let tree = apply_all(&msgs).unwrap();
    assert!(tree
        .table("sales", "orders")
        .unwrap()
        .child("ds=1")
        .is_none());
    assert_eq!(paths(&tree, "sales", "orders").len(), 2);
}

#[test]
fn ctas_into_a_partitioned_table_adds_each_file_to_the_partition_its_path_names() {
    let mut msgs = setup();
    let mut t = table("sales", "summary", &["ds", "region"]);
    t.location = Some("hdfs://nn/wh/sales.db/summary".into());
    msgs.push(HiveMessage::CreateTable {
        table: t.clone(),
        files: vec![
            uri("sales.db/summary/ds=1/region=eu/000000_0", Some("ab"), None),
            uri(
                "sales.db/summary/ds=2024%2F01/region=us/delta_1_1/000000_0",
                None,
                Some("delta_1_1"),
            ),
            uri("sales.db/summary/ds=1/region=eu/000001_0", None, None),
        ],
    });
    let tree = apply_all(&msgs).unwrap();
    assert_eq!(
        paths(&tree, "sales", "summary"),
        vec![
            "ds=1/region=eu/000000_0",
            "ds=1/region=eu/000001_0",
            "ds=2024%2F01/region=us/delta_1_1/000000_0"
        ]
    );
    // A file outside the table's partition directories is bad input.
    let mut bad = setup();
    bad.push(HiveMessage::CreateTable {
        table: t,
        files: vec![uri("sales.db/summary/000000_0", None, None)],
    });
    let err = apply_all(&bad).unwrap_err();
    assert!(err.contains("is not in a partition directory"), "{err}");
}

#[test]
fn files_carry_mapped_paths_checksums_cm_copies_and_subdirectories() {
    let map = map();
    let tree = Tree::empty();
    let mut m = Mapper {
        map: &map,
        event_id: 9,
        event_time_ms: None,
        files: 0,
        tree: &tree,
        txn_log: true,
        premapped: None,
    };
    let mut file = |u: FileUri| m.files(&[u], None).unwrap().remove(0);
    let f = file(uri("t/delta_1_1/bucket_0", Some("ABCD"), Some("delta_1_1")));
    assert_eq!(f.path, "/srv/wh/t/delta_1_1/bucket_0");
    assert_eq!(f.name, "bucket_0");
    assert_eq!(f.subdir.as_deref(), Some("delta_1_1"));
    assert_eq!(
        f.verify,
        Verify::Hdfs {
            checksum: "abcd".into()
        }
    );
    assert_eq!(f.cm_path.as_deref(), Some("/srv/cm/bucket_0_abcd"));
    assert_eq!(f.source_dir.as_deref(), Some("/srv/wh"));
    assert_eq!(f.cm_dir.as_deref(), Some("/srv/cm"));
    let g = file(uri("t/delta_1_1/bucket_0", None, None));
    assert_eq!(g.verify, Verify::None);
    assert_ne!(f.key, g.key, "every reference has its own key");
}

#[test]
fn files_read_where_they_are_carry_the_etag_checksum_or_their_event_time() {
    let map = map();
    let tree = Tree::empty();
    let mut m = Mapper {
        map: &map,
        event_id: 9,
        event_time_ms: Some(1_700_000_000_000),
        files: 0,
        tree: &tree,
        txn_log: true,
        premapped: None,
    };
    let mut file = |u: &str| {
        m.files(&[FileUri::parse(u).unwrap()], None)
            .unwrap()
            .remove(0)
    };
    // On S3 with the ETag checksum (hex of `"abc"`): its cm copy on S3.
    let f = file("s3a://wh-bucket/t/000000_0#22616263#s3a://wh-bucket/cmroot#");
    assert_eq!(f.path, "s3a://wh-bucket/t/000000_0");
    assert_eq!(
        f.verify,
        Verify::S3Etag {
            checksum: "22616263".into()
        }
    );
    assert_eq!(f.verify.label(), "s3-etag");
    assert_eq!(
        f.cm_path.as_deref(),
        Some("s3a://wh-bucket/cmroot/000000_0_22616263")
    );
    assert_eq!((f.source_dir.as_deref(), f.cm_dir.as_deref()), (None, None));
    // Without a checksum, on S3 or on HDFS unmapped: its event's time.
    for u in [
        "s3://wh-bucket/t/000001_0###",
        "hdfs://other-nn/t/000001_0###",
    ] {
        let g = file(u);
        assert_eq!(
            g.verify,
            Verify::NotNewerThanEvent {
                time_ms: Some(1_700_000_000_000)
            },
            "{u}"
        );
        assert_eq!(g.verify.label(), "not-newer-than-event");
    }
    // Mapped and without a checksum: staged as read.
    assert_eq!(file("hdfs://nn/wh/t/000002_0###").verify, Verify::None);
}

fn json_row(event_type: &str, message: &serde_json::Value) -> NotificationRow {
    super::super::message::tests::row(event_type, &message.to_string())
}

#[test]
fn alter_partitions_with_truncate_empties_each_partition() {
    // Hive 4.x's batched TRUNCATE of a partitioned table: one ALTER_PARTITIONS
    // event (JSONAlterPartitionsMessage), the objects of sample 06.
    let sample = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/hive-samples/06_alter_partition.json"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sample).unwrap()).unwrap();
    let t = table("tmp_db", "notification_test", &["day"]);
    let setup = |days: &[&str]| {
        let mut msgs = vec![
            HiveMessage::CreateDatabase {
                db: "tmp_db".into(),
            },
            HiveMessage::CreateTable {
                table: t.clone(),
                files: vec![],
            },
        ];
        for day in days {
            msgs.push(HiveMessage::AddPartition {
                table: t.clone(),
                partitions: vec![part(&[day])],
                files: vec![vec![uri(
                    &format!("tmp_db.db/notification_test/day={day}/000000_0"),
                    None,
                    None,
                )]],
            });
        }
        msgs
    };
    let with_table = serde_json::json!({
        "server": v["server"], "servicePrincipal": v["servicePrincipal"],
        "db": "tmp_db", "table": "notification_test", "tableType": "MANAGED_TABLE",
        "tableObjJson": v["tableObjJson"], "isTruncateOp": "true",
        "timestamp": 1616071558, "writeId": 0,
        "partitions": [{"day": "2021-03-18"}],
        "partitionListJson": [v["partitionObjAfterJson"]],
    });
    let mut msgs = setup(&["2021-03-18", "2021-03-19"]);
    msgs.push(
        super::super::message::decode_message(&json_row("ALTER_PARTITIONS", &with_table)).unwrap(),
    );
    let tree = apply_all(&msgs).unwrap();
    assert_eq!(
        paths(&tree, "tmp_db", "notification_test"),
        vec!["day=2021-03-19/000000_0"]
    );
    // The form without a table object: keys and value lists.
    let without = serde_json::json!({
        "db": "tmp_db", "table": "notification_test", "tableType": "MANAGED_TABLE",
        "isTruncateOp": "true", "partitionKeys": ["day"],
        "partitionValues": [["2021-03-18"], ["2021-03-19"]],
    });
    let mut msgs = setup(&["2021-03-18", "2021-03-19"]);
    msgs.push(
        super::super::message::decode_message(&json_row("ALTER_PARTITIONS", &without)).unwrap(),
    );
    assert!(paths(&apply_all(&msgs).unwrap(), "tmp_db", "notification_test").is_empty());
    // Not a truncation (statistics, properties): no data change.
    let mut stats = with_table.clone();
    stats["isTruncateOp"] = "false".into();
    assert!(matches!(
        super::super::message::decode_message(&json_row("ALTER_PARTITIONS", &stats)),
        Ok(HiveMessage::NoData { .. })
    ));
    // Values that do not match the keys: rejected, not guessed.
    let mut wrong = without.clone();
    wrong["partitionValues"] = serde_json::json!([["2021-03-18", "x"]]);
    let err =
        super::super::message::decode_message(&json_row("ALTER_PARTITIONS", &wrong)).unwrap_err();
    assert!(err.to_string().contains("partitionValues[0]"), "{err}");
}

#[test]
fn files_below_their_partition_keep_the_directories_between() {
    // INSERT ... UNION ALL on Tez: one directory per branch, named only
    // by the files' paths (Hive encodes no subdir for them).
    let mut msgs = setup();
    let t = table("sales", "orders", &["ds", "region"]);
    let base = "hdfs://nn/wh/sales.db/orders/ds=1/region=eu";
    let mut p = part(&["1", "eu"]);
    p.location = Some(base.into());
    msgs.push(HiveMessage::AddPartition {
        table: t.clone(),
        partitions: vec![p.clone()],
        files: vec![vec![]],
    });
    let union =
        |n: u32| FileUri::parse(&format!("{base}/HIVE_UNION_SUBDIR_{n}/000000_0###")).unwrap();
    msgs.push(HiveMessage::Insert {
        table: t.clone(),
        partition: Some(p.clone()),
        replace: false,
        files: vec![union(1), union(2)],
    });
    // The location written with a port, the file without: same place.
    let mut q = part(&["2", "eu"]);
    q.location = Some("hdfs://nn:8020/wh/sales.db/orders/ds=2/region=eu/".into());
    msgs.push(HiveMessage::AddPartition {
        table: t.clone(),
        partitions: vec![q],
        files: vec![vec![
            FileUri::parse("hdfs://nn/wh/sales.db/orders/ds=2/region=eu/000000_0###").unwrap(),
            FileUri::parse("hdfs://nn/wh/sales.db/orders/ds=2/region=eu/a/b/000001_0###").unwrap(),
        ]],
    });
    // Premapped on a decoding thread, the same as on the ingest thread.
    let map = map();
    let premapped = premap_files(&map, 9, None, &msgs[msgs.len() - 2]).unwrap();
    assert_eq!(
        premapped
            .iter()
            .map(|f| f.as_ref().unwrap().subdir.clone())
            .collect::<Vec<_>>(),
        vec![
            Some("HIVE_UNION_SUBDIR_1".into()),
            Some("HIVE_UNION_SUBDIR_2".into())
        ]
    );
    let tree = apply_all(&msgs).expect("a UNION ALL insert applies");
    assert_eq!(
        paths(&tree, "sales", "orders"),
        vec![
            "ds=1/region=eu/HIVE_UNION_SUBDIR_1/000000_0",
            "ds=1/region=eu/HIVE_UNION_SUBDIR_2/000000_0",
            "ds=2/region=eu/000000_0",
            "ds=2/region=eu/a/b/000001_0",
        ]
    );
    // Not below the location (a partition elsewhere), or no location:
    // the file is shown directly in the partition, as before.
    assert_eq!(subdir_below("hdfs://nn/other", "hdfs://nn/wh/t/x/f"), None);
    assert_eq!(subdir_below("hdfs://nn/wh/t", "hdfs://nn/wh/t/f"), None);
    assert_eq!(subdir_below("hdfs://nn/wh/t", "hdfs://nn/wh/tt/x/f"), None);
    assert_eq!(subdir_below("/wh/t", "/wh/t/x/f").as_deref(), Some("x"));
    // Another bucket or name node is another place; a root location
    // or an odd path between gives no subdirectory.
    assert_eq!(subdir_below("s3a://b1/wh/t", "s3a://b2/wh/t/x/f"), None);
    assert_eq!(
        subdir_below("hdfs://NN:8020/wh/t", "hdfs://nn/wh/t/x/f").as_deref(),
        Some("x")
    );
    assert_eq!(subdir_below("hdfs://nn", "hdfs://nn/wh/t/f"), None);
    assert_eq!(subdir_below("hdfs://nn/wh/t", "hdfs://nn/wh/t//x/f"), None);
    assert_eq!(
        subdir_below("hdfs://nn/wh/t", "hdfs://nn/wh/t/../x/f"),
        None
    );
}

#[test]
fn names_stagefs_cannot_show_and_unmapped_uris_are_rejected_with_a_reason() {
    let err = apply_all(&[HiveMessage::CreateDatabase {
        db: "sales-eu".into(),
    }])
    .unwrap_err();
    assert!(err.contains("database name `sales-eu`"), "{err}");
    let mut msgs = setup();
    msgs.push(HiveMessage::Insert {
        table: table("sales", "orders", &["ds", "region"]),
        partition: Some(part(&["1", "eu"])),
        replace: false,
        files: vec![FileUri {
            path: "abfs://c@elsewhere/x".into(),
            checksum: None,
            cm_root: None,
            subdir: None,
        }],
    });
    let err = apply_all(&msgs).unwrap_err();
    assert!(
        err.contains("no --source-map covers `abfs://c@elsewhere/x`"),
        "{err}"
    );
    let mut msgs = setup();
    msgs.push(HiveMessage::Insert {
        table: table("sales", "orders", &["ds", "region"]),
        partition: Some(part(&["1"])),
        replace: false,
        files: vec![],
    });
    let err = apply_all(&msgs).unwrap_err();
    assert!(err.contains("does not match its partition keys"), "{err}");
}

/// The first `limit` of `rows` with ids above `after` (a poll).
fn rows_after(rows: &[NotificationRow], after: i64, limit: usize) -> Vec<NotificationRow> {
    rows.iter()
        .filter(|r| r.event_id > after)
        .take(limit)
        .cloned()
        .collect()
}

/// Rows that fail as unavailable `failures` times, then come; without
/// `txn_log`, a source older than Hive 3.2 (asking for a transaction's
/// writes is then a mistake).
struct Flaky {
    rows: Vec<NotificationRow>,
    failures: u32,
    txn_log: bool,
}

impl RowSource for Flaky {
    fn poll(&mut self, after: i64, limit: usize) -> Result<Vec<NotificationRow>, RowSourceError> {
        if self.failures > 0 {
            self.failures -= 1;
            return Err(RowSourceError::Unavailable("connection refused".into()));
        }
        Ok(rows_after(&self.rows, after, limit))
    }
    fn txn_writes(
        &mut self,
        _: i64,
    ) -> Result<Vec<super::super::model::TxnWriteRow>, RowSourceError> {
        match self.txn_log {
            true => Ok(Vec::new()),
            false => Err(RowSourceError::Fatal(
                "no TXN_WRITE_NOTIFICATION_LOG".into(),
            )),
        }
    }
    fn records_txn_writes(&mut self) -> Result<bool, RowSourceError> {
        Ok(self.txn_log)
    }
    fn newest_event_id(&mut self) -> Result<Option<i64>, RowSourceError> {
        Ok(self.rows.last().map(|r| r.event_id))
    }
    fn describe(&self) -> String {
        "flaky".into()
    }
}

fn row(id: i64) -> NotificationRow {
    NotificationRow {
        nl_id: Some(id),
        event_id: id,
        event_time: Some(1),
        event_type: "OPEN_TXN".into(),
        cat_name: None,
        db_name: None,
        tbl_name: None,
        message: Some("{}".into()),
        message_format: Some("json-0.2".into()),
    }
}

#[test]
fn an_unavailable_source_is_transient_and_reading_resumes_where_it_was() {
    let rows = Flaky {
        rows: (1..=5).map(row).collect(),
        failures: 2,
        txn_log: true,
    };
    let cfg = HiveConfig::new(HiveRows::Files("x".into()), map());
    let mut src = HiveSource::new(Box::new(rows), &cfg, 2);
    for _ in 0..2 {
        assert!(matches!(src.poll(100), Err(SourceError::Transient(_))));
        assert!(src.report().error.unwrap().contains("connection refused"));
    }
    let got = src.poll(100).unwrap();
    assert_eq!(
        got.iter().map(|r| r.event_id).collect::<Vec<_>>(),
        vec![3, 4, 5]
    );
    let report = src.report();
    assert_eq!((report.error, report.newest), (None, Some(5)));
    let e = src.decode(&got[0], &Tree::empty()).unwrap();
    assert_eq!(
        (e.id, e.time_ms, e.changes.len()),
        (StateId(3), Some(1000), 0)
    );
}

/// Every row's outcome as the ingest loop meets them: decoded in
/// order (against the tree the events before it built) until the
/// first rejection, then re-read from just before it (as after a
/// hold), the rejected row decoded again, and every row after it.
fn outcomes(rows: &[NotificationRow], threads: usize) -> Vec<(i64, Result<Event, DecodeError>)> {
    let mut cfg = HiveConfig::new(HiveRows::Files("x".into()), map());
    cfg.decode_threads = threads;
    cfg.batch = 64;
    let flaky = Flaky {
        rows: rows.to_vec(),
        failures: 0,
        txn_log: true,
    };
    let mut src = HiveSource::new(Box::new(flaky), &cfg, 0);
    let mut v = Validator::new(Arc::new(Tree::empty()));
    let mut out = Vec::new();
    let mut reread = false;
    'poll: loop {
        let got = src.poll(1000).unwrap();
        if got.is_empty() {
            return out;
        }
        for r in &got {
            let decoded = src.decode(r, v.latest());
            out.push((r.event_id, decoded.clone()));
            match decoded {
                Ok(e) => {
                    v.check(e, None, None).unwrap();
                }
                Err(_) if !reread => {
                    // Results of the rows after it were decoded ahead
                    // and are not taken: the re-read must not see them.
                    reread = true;
                    let at = Position::Hive {
                        hive_event_id: r.event_id - 1,
                    };
                    assert!(src.reread_from(&at));
                    continue 'poll;
                }
                Err(_) => {}
            }
        }
    }
}

#[test]
fn insert_files_mapped_ahead_give_the_same_events_and_the_same_rejection_as_mapped_inline() {
    let table = serde_json::to_string(r#"{"1":{"str":"t"},"2":{"str":"d"}}"#).unwrap();
    let mut rows = vec![
        NotificationRow {
            event_type: "CREATE_DATABASE".into(),
            message: Some(r#"{"db": "d"}"#.into()),
            ..row(1)
        },
        NotificationRow {
            event_type: "CREATE_TABLE".into(),
            message: Some(format!(r#"{{"tableObjJson": {table}}}"#).into()),
            ..row(2)
        },
    ];
    let insert = |id: i64, files: &[String]| NotificationRow {
        event_type: "INSERT".into(),
        message: Some(
            format!(
                r#"{{"tableObjJson": {table}, "replace": "false", "files": {}}}"#,
                serde_json::to_string(files).unwrap()
            )
            .into(),
        ),
        ..row(id)
    };
    for id in 3..=200 {
        let files: Vec<String> = (0..2)
            .map(|k| format!("hdfs://nn/wh/d/t/f{id}_{k}#00ab#hdfs://nn/cm#"))
            .collect();
        rows.push(insert(id, &files));
    }
    // A file no --source-map covers (on a file system with no reader: an
    // hdfs:// one would be read on HDFS), after a good one of the same event.
    rows[120] = insert(
        121,
        &[
            "hdfs://nn/wh/d/t/g#00ab#hdfs://nn/cm#".into(),
            "abfs://elsewhere/d/t/h".into(),
        ],
    );
    let inline = outcomes(&rows, 0);
    let Some((121, Err(DecodeError::Rejected(r)))) = inline.get(120) else {
        panic!("{:?}", inline.get(120));
    };
    assert!(
        r.reason
            .contains("no --source-map covers `abfs://elsewhere/d/t/h`"),
        "{r}"
    );
    match &inline[10].1 {
        Ok(e) => {
            let f = &e.changes[0].files[1];
            assert_eq!(f.path, "/srv/wh/d/t/f11_1");
            assert_eq!(f.cm_path.as_deref(), Some("/srv/cm/f11_1_00ab"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(outcomes(&rows, 2), inline, "2 decoding threads");
}

#[test]
fn a_gap_found_while_reading_ahead_comes_after_the_rows_before_it() {
    let rows: Vec<NotificationRow> = (1..=10).chain(13..=20).map(row).collect();
    let flaky = Flaky {
        rows,
        failures: 0,
        txn_log: true,
    };
    let mut cfg = HiveConfig::new(HiveRows::Files("x".into()), map());
    cfg.batch = 4;
    let mut src = HiveSource::new(Box::new(flaky), &cfg, 0);
    let mut seen = Vec::new();
    let rejection = loop {
        match src.poll(100) {
            Ok(got) => {
                // The gap is known with the rows right before it (as
                // without reading ahead), not with the batch before.
                let last = got.last().map(|r| r.event_id);
                let expected = (last == Some(10)).then_some((11, 12));
                assert_eq!(src.gap(), expected, "after a poll ending at {last:?}");
                for r in &got {
                    src.decode(r, &Tree::empty()).unwrap();
                    seen.push(r.event_id);
                }
            }
            Err(SourceError::Fatal(r)) => break r,
            Err(other) => panic!("{other:?}"),
        }
    };
    assert_eq!(seen, (1..=10).collect::<Vec<_>>());
    assert!(
        rejection.reason.contains("events 11..12 are missing"),
        "{rejection}"
    );
    assert_eq!(src.gap(), Some((11, 12)));
    // Stays stopped there.
    assert!(matches!(src.poll(100), Err(SourceError::Fatal(_))));
}

#[test]
fn a_failed_read_ahead_is_read_again_by_the_next_poll() {
    /// Fails every second poll after the first.
    struct Alternating {
        rows: Vec<NotificationRow>,
        polls: u32,
    }
    impl RowSource for Alternating {
        fn poll(
            &mut self,
            after: i64,
            limit: usize,
        ) -> Result<Vec<NotificationRow>, RowSourceError> {
            self.polls += 1;
            if self.polls % 2 == 0 {
                return Err(RowSourceError::Unavailable("connection reset".into()));
            }
            Ok(rows_after(&self.rows, after, limit))
        }
        fn txn_writes(
            &mut self,
            _: i64,
        ) -> Result<Vec<super::super::model::TxnWriteRow>, RowSourceError> {
            Ok(Vec::new())
        }
        fn newest_event_id(&mut self) -> Result<Option<i64>, RowSourceError> {
            Ok(None)
        }
        fn describe(&self) -> String {
            "alternating".into()
        }
    }
    let mut cfg = HiveConfig::new(HiveRows::Files("x".into()), map());
    cfg.batch = 3;
    let rows = Alternating {
        rows: (1..=7).map(row).collect(),
        polls: 0,
    };
    let mut src = HiveSource::new(Box::new(rows), &cfg, 0);
    let mut seen = Vec::new();
    for _ in 0..10 {
        match src.poll(100) {
            Ok(got) => seen.extend(got.iter().map(|r| r.event_id)),
            Err(SourceError::Transient(e)) => assert!(e.contains("connection reset"), "{e}"),
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(seen, (1..=7).collect::<Vec<_>>());
}

#[test]
fn decoding_ahead_keeps_id_order_and_stops_at_the_same_bad_row_as_decoding_inline() {
    let mut rows: Vec<NotificationRow> = (1..=300)
        .map(|id| NotificationRow {
            event_type: "CREATE_DATABASE".into(),
            message: Some(format!(r#"{{"db": "d{id}"}}"#).into()),
            ..row(id)
        })
        .collect();
    // A bad row in the middle of a batch (ids 129..=192).
    rows[149].message = Some("{not json".into());
    let inline = outcomes(&rows, 0);
    let ids: Vec<i64> = inline.iter().map(|(id, _)| *id).collect();
    let expected: Vec<i64> = (1..=150).chain(150..=300).collect();
    assert_eq!(ids, expected);
    let DecodeError::Rejected(r) = inline[149].1.clone().unwrap_err() else {
        panic!("{:?}", inline[149]);
    };
    assert_eq!(r.state_id, Some(StateId(150)));
    assert!(
        r.reason
            .contains("cannot decode the CREATE_DATABASE message: bad JSON"),
        "{r}"
    );
    match &inline[200].1 {
        Ok(e) => assert_eq!(e.changes[0].db, "d200"),
        other => panic!("{other:?}"),
    }
    for threads in [1, 3] {
        assert_eq!(
            outcomes(&rows, threads),
            inline,
            "{threads} decoding threads"
        );
    }
}

/// Rows of a real Hive 4.0.1 metastore (tests/data/hive-real/): the row
/// with `id`, renumbered `new_id`, its `CAT_NAME` set to `cat` (and, in
/// the message, `from` replaced by `to`).
fn real_row(id: i64, new_id: i64, cat: Option<&str>, from: &str, to: &str) -> NotificationRow {
    let text = include_str!("../../../../tests/data/hive-real/postgres-json.jsonl");
    let mut row: NotificationRow = text
        .lines()
        .map(|l| serde_json::from_str::<NotificationRow>(l).unwrap())
        .find(|r| r.event_id == id)
        .unwrap();
    row.event_id = new_id;
    row.nl_id = Some(new_id);
    row.cat_name = cat.map(Into::into);
    let message = row.message.as_deref().unwrap().replace(from, to);
    row.message = Some(message.into());
    row
}

/// Rows and the write rows of one transaction.
struct TwoCatalogs {
    rows: Vec<NotificationRow>,
    writes: Vec<super::super::model::TxnWriteRow>,
}

impl RowSource for TwoCatalogs {
    fn poll(&mut self, after: i64, limit: usize) -> Result<Vec<NotificationRow>, RowSourceError> {
        Ok(rows_after(&self.rows, after, limit))
    }
    fn txn_writes(
        &mut self,
        txn_id: i64,
    ) -> Result<Vec<super::super::model::TxnWriteRow>, RowSourceError> {
        Ok(self
            .writes
            .iter()
            .filter(|w| w.txn_id == txn_id)
            .cloned()
            .collect())
    }
    fn newest_event_id(&mut self) -> Result<Option<i64>, RowSourceError> {
        Ok(self.rows.last().map(|r| r.event_id))
    }
    fn describe(&self) -> String {
        "two catalogs".into()
    }
}

/// The table object of the real CREATE_TABLE of `sales.flat`, in `cat`
/// (field 17), or without a catalog.
fn flat_table_obj(cat: Option<&str>) -> String {
    let row = real_row(9, 9, Some("hive"), "", "");
    let m: serde_json::Value = serde_json::from_str(row.message.as_deref().unwrap()).unwrap();
    let mut obj: serde_json::Value =
        serde_json::from_str(m["tableObjJson"].as_str().unwrap()).unwrap();
    match cat {
        Some(c) => obj["17"] = serde_json::json!({ "str": c }),
        None => {
            obj.as_object_mut().unwrap().remove("17");
        }
    }
    obj.to_string()
}

fn flat_write(txn_id: i64, cat: Option<&str>, name: &str) -> super::super::model::TxnWriteRow {
    let delta = "delta_0000001_0000001_0000";
    super::super::model::TxnWriteRow {
        wnl_id: Some(txn_id),
        txn_id,
        write_id: Some(1),
        database: "sales".into(),
        table: "flat".into(),
        partition: None,
        table_obj: Some(flat_table_obj(cat)),
        partition_obj: None,
        files: Some(format!(
            "hdfs://127.0.0.1:33063/external/sales.db/flat/{delta}/{name}###{delta}"
        )),
        event_time: Some(1),
    }
}

/// Follows `rows` for `catalog`: the files of `sales.flat` at the end.
fn follow_catalog(catalog: &str) -> Result<Vec<String>, String> {
    // The same database and table in `hive` and in `spark`, written
    // alternately; a commit (no catalog) wrote into both.
    let mut rows = vec![
        real_row(1, 1, Some("hive"), "", ""),
        real_row(1, 2, Some("spark"), "", ""),
        real_row(9, 3, Some("hive"), "", ""),
        real_row(9, 4, Some("spark"), "", ""),
        real_row(10, 5, Some("hive"), "", ""),
        real_row(10, 6, Some("spark"), "flat/000000_0", "flat/spark_0"),
        json_row(
            "COMMIT_TXN",
            &serde_json::json!({ "txnid": 7, "timestamp": 1 }),
        ),
    ];
    rows[6].event_id = 7;
    let source = TwoCatalogs {
        rows,
        writes: vec![
            flat_write(7, Some("hive"), "hive_acid"),
            flat_write(7, Some("spark"), "spark_acid"),
        ],
    };
    let mut cfg = HiveConfig::new(
        HiveRows::Files("x".into()),
        SourceMap::parse(&Vec::<String>::new()).unwrap(),
    );
    cfg.decode_threads = 0;
    cfg.catalog = catalog.into();
    let mut src = HiveSource::new(Box::new(source), &cfg, 0);
    let mut v = Validator::new(Arc::new(Tree::empty()));
    for r in src.poll(100).unwrap() {
        let e = src.decode(&r, v.latest()).map_err(|e| format!("{e:?}"))?;
        v.check(e, None, None).map_err(|r| r.to_string())?;
    }
    Ok(paths(v.latest(), "sales", "flat"))
}

#[test]
fn only_the_chosen_catalogs_rows_and_transaction_writes_are_applied() {
    assert_eq!(
        follow_catalog("hive").unwrap(),
        vec!["000000_0", "delta_0000001_0000001_0000/hive_acid"]
    );
    assert_eq!(
        follow_catalog("spark").unwrap(),
        vec!["delta_0000001_0000001_0000/spark_acid", "spark_0"]
    );
    // A catalog no row names: nothing but the commit, whose writes are
    // of other catalogs.
    assert_eq!(follow_catalog("other").unwrap(), Vec::<String>::new());
}

#[test]
fn rows_without_a_catalog_are_kept_and_names_match_in_any_case() {
    let mut r = row(1);
    assert!(row_in_catalog(&r, "hive") && row_in_catalog(&r, "spark"));
    r.cat_name = Some("".into());
    assert!(row_in_catalog(&r, "spark"));
    r.cat_name = Some("HIVE".into());
    assert!(row_in_catalog(&r, "hive"));
    assert!(!row_in_catalog(&r, "spark"));
    // A write row's catalog is its table object's; without one, `hive`.
    let w = flat_write(1, None, "x");
    assert!(write_in_catalog(&w, "hive").unwrap());
    assert!(!write_in_catalog(&w, "spark").unwrap());
    let w = flat_write(1, Some("Spark"), "x");
    assert!(write_in_catalog(&w, "spark").unwrap());
    // Bad input is an error naming the row, never a panic.
    let mut w = flat_write(1, Some("spark"), "x");
    w.table_obj = None;
    let err = write_in_catalog(&w, "spark").unwrap_err();
    assert!(
        err.contains("sales.flat") && err.contains("no WNL_TABLE_OBJ"),
        "{err}"
    );
    w.table_obj = Some("{\"17\":{\"i32\":3}}".into());
    let err = write_in_catalog(&w, "spark").unwrap_err();
    assert!(err.contains("WNL_TABLE_OBJ of sales.flat"), "{err}");
}

#[test]
fn catalog_names_are_checked_and_lower_cased() {
    assert_eq!(catalog_name("Spark").unwrap(), "spark");
    assert_eq!(catalog_name("my_cat-2").unwrap(), "my_cat-2");
    for bad in ["", "a b", "x'y", "a.b", "ü"] {
        assert!(catalog_name(bad).is_err(), "{bad:?}");
    }
    let list = vec!["hive".to_owned(), "spark".to_owned()];
    assert!(crate::source::hive::metastore::catalog_known("spark", Some(&list)).is_ok());
    let err = crate::source::hive::metastore::catalog_known("other", Some(&list))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no such catalog") && err.contains("hive, spark"),
        "{err}"
    );
    // A schema without catalogs (Hive 2): only `hive`.
    assert!(crate::source::hive::metastore::catalog_known("hive", None).is_ok());
    let err = crate::source::hive::metastore::catalog_known("spark", None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("without CTLGS"), "{err}");
}

/// Lists every location as `listing` (or fails as `Err`), counting calls.
struct FakeLister {
    listing: Result<crate::source::hive::partition_listing::PartitionListing, String>,
    calls: Arc<std::sync::atomic::AtomicUsize>,
}

impl ListAtSource for FakeLister {
    fn list(
        &self,
        location: &str,
    ) -> Result<crate::source::hive::partition_listing::PartitionListing, String> {
        assert!(location.ends_with("/day=2021-03-18"), "{location}");
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.listing.clone()
    }
}

/// Which table an ADD_PARTITION without files is of.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Managed,
    /// A plain external table.
    External,
    /// Hive 4's metadata transformer's (`TRANSLATED_TO_EXTERNAL`).
    Translated,
}

/// Sample 03 (ADD_PARTITION day=2021-03-18, at 1616070330 s) with
/// `partitionFiles` empty, its table of `kind`, as row 3 after
/// CREATE_DATABASE and CREATE_TABLE of that table.
fn add_partition_without_files(kind: Kind) -> (Arc<Tree>, NotificationRow) {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/hive-samples/03_add_partition.json"
    ))
    .unwrap();
    let mut m: serde_json::Value = serde_json::from_str(&text).unwrap();
    m["partitionFiles"] = serde_json::json!([]);
    if kind != Kind::Managed {
        m["tableType"] = "EXTERNAL_TABLE".into();
        let mut obj = m["tableObjJson"].as_str().unwrap().replace(
            r#""12":{"str":"MANAGED_TABLE"}"#,
            r#""12":{"str":"EXTERNAL_TABLE"}"#,
        );
        if kind == Kind::Translated {
            obj = obj.replace(
                r#""9":{"map":["str","str",2,{"#,
                r#""9":{"map":["str","str",3,{"TRANSLATED_TO_EXTERNAL":"TRUE","#,
            );
        }
        m["tableObjJson"] = obj.into();
    }
    let tree = apply_all(&[
        HiveMessage::CreateDatabase {
            db: "tmp_db".into(),
        },
        HiveMessage::CreateTable {
            table: table("tmp_db", "notification_test", &["day"]),
            files: vec![],
        },
    ])
    .unwrap();
    let add = NotificationRow {
        event_type: "ADD_PARTITION".into(),
        event_time: Some(1616070330),
        message: Some(m.to_string().into()),
        ..row(3)
    };
    (tree, add)
}

fn decode_with(
    listing: Result<crate::source::hive::partition_listing::PartitionListing, String>,
    kind: Kind,
) -> (Result<Event, DecodeError>, usize) {
    let (tree, add) = add_partition_without_files(kind);
    let cfg = HiveConfig::new(HiveRows::Files("x".into()), map());
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let lister = FakeLister {
        listing,
        calls: Arc::clone(&calls),
    };
    let rows = Flaky {
        rows: vec![add],
        failures: 0,
        txn_log: true,
    };
    let mut src = HiveSource::new(Box::new(rows), &cfg, 2).with_lister(Box::new(lister));
    let got = src.poll(10).unwrap();
    let e = src.decode(&got[0], &tree);
    (e, calls.load(std::sync::atomic::Ordering::Relaxed))
}

#[test]
fn an_external_tables_partition_without_files_is_listed_at_its_event() {
    use crate::source::hive::partition_listing::PartitionListing;
    use crate::source_file::{DirTree, TreeEntry};
    let event_ms = 1_616_070_330_000;
    let entry = |rel: &str, is_dir: bool, mtime_ms: i64| TreeEntry {
        rel: rel.into(),
        is_dir,
        size: 1,
        mtime_ms,
    };
    let unchanged = PartitionListing::Tree(Some(DirTree {
        mtime_ms: event_ms - 100,
        entries: vec![
            entry("part-00000-c000", false, event_ms - 200),
            entry("_SUCCESS", false, event_ms - 100),
        ],
    }));
    // External: the listing's files, each checked again as not newer
    // than the event.
    let (e, calls) = decode_with(Ok(unchanged.clone()), Kind::Translated);
    let e = e.unwrap();
    assert_eq!(calls, 1);
    let files = &e.changes[0].files;
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(files[0].name, "part-00000-c000");
    assert!(files[0]
        .path
        .ends_with("notification_test/day=2021-03-18/part-00000-c000"));
    assert_eq!(
        files[0].verify,
        Verify::NotNewerThanEvent {
            time_ms: Some(event_ms)
        }
    );
    // Managed: an empty partition is what the event says; nothing listed.
    let (e, calls) = decode_with(Ok(unchanged.clone()), Kind::Managed);
    assert!(e.unwrap().changes[0].files.is_empty());
    assert_eq!(calls, 0);
    // Changed since the event: one reference that is never staged, whose
    // reason names the table, the partition and why.
    let changed = PartitionListing::Tree(Some(DirTree {
        mtime_ms: event_ms + 5_000,
        entries: vec![],
    }));
    let (e, _) = decode_with(Ok(changed.clone()), Kind::Translated);
    let files = &e.unwrap().changes[0].files;
    let Verify::Unproven { reason } = &files[0].verify else {
        panic!("{files:?}")
    };
    assert!(
        reason.starts_with(
            "tmp_db.notification_test partition (2021-03-18): its ADD_PARTITION (event 3)"
        ),
        "{reason}"
    );
    assert!(
        reason.contains("the partition directory was modified at 1616070335000 ms since the epoch, 5000 ms after event 3"),
        "{reason}"
    );
    // A plain external table's partition: the listing when proven; else
    // what the events name (nothing), as before listings: files written
    // later by any tool hold no state back.
    let (e, _) = decode_with(Ok(unchanged), Kind::External);
    assert_eq!(e.unwrap().changes[0].files.len(), 1);
    let (e, _) = decode_with(Ok(changed), Kind::External);
    assert!(e.unwrap().changes[0].files.is_empty());
    // A listing that fails is tried again.
    let (e, _) = decode_with(Err("HDFS nn: connection refused".into()), Kind::Translated);
    assert!(
        matches!(&e, Err(DecodeError::Retry(m)) if m.contains("connection refused")),
        "{e:?}"
    );
}

/// The rows of a capture of the real metastore (tests/data/hive-real/).
fn real_rows(name: &str) -> Vec<NotificationRow> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/hive-real")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("row JSON"))
        .collect()
}

/// Each change of `e`: its operation and table.
fn ops_of(e: &Event) -> Vec<(Op, &str)> {
    e.changes.iter().map(|c| (c.op, c.table.as_str())).collect()
}

/// The files of the capture's tables in `tree` (`table/path`).
fn sales(tree: &Tree) -> Vec<String> {
    ["orders", "archive", "flat", "flat2", "gone", "trunc"]
        .iter()
        .flat_map(|t| {
            paths(tree, "sales", t)
                .into_iter()
                .map(move |p| format!("{t}/{p}"))
        })
        .collect()
}

/// Every row of `rows` through the adapter (polls of `limit` rows) and
/// the validator: each row's event, the position after it and the tree
/// after it.
fn follow(
    rows: &[NotificationRow],
    after: i64,
    base: Arc<Tree>,
    limit: usize,
) -> Vec<(Event, Position, Arc<Tree>)> {
    let mut cfg = HiveConfig::new(HiveRows::Files("x".into()), map());
    cfg.batch = limit;
    let flaky = Flaky {
        rows: rows.to_vec(),
        failures: 0,
        txn_log: true,
    };
    let mut src = HiveSource::new(Box::new(flaky), &cfg, after);
    let mut v = Validator::new(base);
    let mut out = Vec::new();
    loop {
        let got = src.poll(limit).unwrap();
        if got.is_empty() {
            return out;
        }
        for r in &got {
            let e = src
                .decode(r, v.latest())
                .unwrap_or_else(|e| panic!("event {}: {e:?}", r.event_id));
            let pos = src.position_after(r);
            v.check(e.clone(), None, None)
                .unwrap_or_else(|e| panic!("event {}: {e}", r.event_id));
            out.push((e, pos, Arc::clone(v.latest())));
        }
    }
}

/// ALTER TABLE archive EXCHANGE PARTITION … WITH TABLE orders as Hive
/// 3.1.3's own DbNotificationListener logged it (the capture's events
/// 19-20: one partition; 23-25: a partial spec, two partitions): an
/// ADD_PARTITION on the destination naming the files at their new place,
/// then one DROP_PARTITION per partition on the source, all in one
/// metastore transaction. stagefs makes them one event at the
/// ADD_PARTITION's id (the drops' events change nothing, the position
/// after it is the last drop's), so no state has the partition in both
/// tables; the same at any batch boundary, and after a restart.
#[test]
fn an_exchange_partitions_rows_are_one_event() {
    let rows = real_rows("hive3-postgres-json.jsonl");
    let kind = |id: i64| {
        let r = rows.iter().find(|r| r.event_id == id).expect("row");
        (r.event_type.as_str(), r.tbl_name.as_deref())
    };
    assert_eq!(kind(19), ("ADD_PARTITION", Some("archive")));
    assert_eq!(kind(20), ("DROP_PARTITION", Some("orders")));
    assert_eq!(kind(23), ("ADD_PARTITION", Some("archive")));
    assert_eq!(kind(24), ("DROP_PARTITION", Some("orders")));
    assert_eq!(kind(25), ("DROP_PARTITION", Some("orders")));
    let parts = |tree: &Tree, t: &str| -> Vec<String> {
        let mut dirs: Vec<String> = paths(tree, "sales", t)
            .iter()
            .map(|p| p.rsplit_once('/').map_or("", |(d, _)| d).to_owned())
            .collect();
        dirs.dedup();
        dirs
    };
    // Batches cut anywhere: the drops are in the batch or in the one read
    // ahead after a full batch.
    for limit in [1000, 19, 23, 24, 2] {
        let events = follow(&rows, 0, Arc::new(Tree::empty()), limit);
        let at = |id: u64| &events[id as usize - 1];
        let (add, pos, tree) = at(19);
        let ops = ops_of(add);
        assert_eq!(
            ops,
            vec![(Op::AddPartition, "archive"), (Op::DropPartition, "orders")],
            "limit {limit}"
        );
        let file = &add.changes[0].files[0];
        assert!(
            file.path
                .ends_with("/warehouse/sales.db/archive/dt=2024-01-01/region=eu/000000_0"),
            "the file at its new place: {file:?}"
        );
        assert!(matches!(file.verify, Verify::Hdfs { .. }), "{file:?}");
        assert_eq!(*pos, Position::Hive { hive_event_id: 20 }, "limit {limit}");
        assert_eq!(parts(tree, "archive"), vec!["dt=2024-01-01/region=eu"]);
        assert!(!parts(tree, "orders").contains(&"dt=2024-01-01/region=eu".to_owned()));
        let (drop, pos, after) = at(20);
        assert!(drop.changes.is_empty(), "{drop:?}");
        assert_eq!(*pos, Position::Hive { hive_event_id: 20 });
        assert_eq!(sales(after), sales(tree));

        let (add, pos, tree) = at(23);
        let ops = ops_of(add);
        assert_eq!(
            ops,
            vec![
                (Op::AddPartition, "archive"),
                (Op::AddPartition, "archive"),
                (Op::DropPartition, "orders"),
                (Op::DropPartition, "orders"),
            ],
            "limit {limit}"
        );
        assert_eq!(*pos, Position::Hive { hive_event_id: 25 });
        assert_eq!(
            parts(tree, "archive"),
            vec![
                "dt=2024-01-01/region=eu",
                "dt=2024-01-03/region=eu",
                "dt=2024-01-03/region=us"
            ]
        );
        assert!(
            parts(tree, "orders").is_empty(),
            "{:?}",
            parts(tree, "orders")
        );
        for id in [24, 25] {
            let (drop, pos, after) = at(id);
            assert!(drop.changes.is_empty(), "{drop:?}");
            assert_eq!(*pos, Position::Hive { hive_event_id: 25 });
            assert_eq!(sales(after), sales(tree));
        }
        // Every other row is its own event.
        assert_eq!(events.len(), rows.len());
        let folded: Vec<u64> = events
            .iter()
            .filter(|(e, _, _)| e.changes.is_empty() && kind(e.id.0 as i64).0 == "DROP_PARTITION")
            .map(|(e, _, _)| e.id.0)
            .collect();
        assert_eq!(folded, vec![20, 24, 25]);
    }
    // Drops beyond the batch read ahead (here two drops after a batch of
    // one row) are not seen with their ADD_PARTITION: separate events, to
    // the same end.
    let whole = follow(&rows, 0, Arc::new(Tree::empty()), 1000);
    let ones = follow(&rows, 0, Arc::new(Tree::empty()), 1);
    assert_eq!(ones[19 - 1].0.changes.len(), 2, "one partition: one event");
    assert!(ones[20 - 1].0.changes.is_empty());
    assert_eq!(
        ones[23 - 1].0.changes.len(),
        2,
        "two partitions: added alone"
    );
    assert_eq!(ones[24 - 1].0.changes[0].op, Op::DropPartition);
    assert_eq!(ones[25 - 1].0.changes[0].op, Op::DropPartition);
    assert_eq!(
        sales(&ones.last().expect("events").2),
        sales(&whole.last().expect("events").2)
    );
    // A restart after the exchange's event (journaled with the position
    // after its last drop) reads on from there, and ends where a run
    // without a restart ends.
    let (_, pos, tree) = &whole[22];
    assert_eq!(*pos, Position::Hive { hive_event_id: 25 });
    let rest = follow(&rows, 25, Arc::clone(tree), 1000);
    assert_eq!(rest.first().map(|(e, _, _)| e.id), Some(StateId(26)));
    let end = |events: &[(Event, Position, Arc<Tree>)]| sales(&events.last().expect("events").2);
    assert_eq!(end(&rest), end(&whole));
    assert!(!end(&whole).is_empty());
}

/// Hive 4.0.1's exchange (our listener writing what the metastore fires,
/// tests/data/hive-real/postgres-json.jsonl) has the same shape: the
/// ADD_PARTITION's partitions (none of their files named: the translated
/// tables are external) are those the DROP_PARTITIONs after it drop from
/// another table with the same keys. Rows of other shapes are no exchange.
#[test]
fn exchange_drops_are_the_drops_of_the_added_partitions_from_another_table() {
    let rows = real_rows("postgres-json.jsonl");
    let msg = |id: i64| {
        super::super::message::decode_message(rows.iter().find(|r| r.event_id == id).expect("row"))
            .expect("decodes")
    };
    let after = |id: i64| -> Vec<NotificationRow> {
        rows.iter().filter(|r| r.event_id > id).cloned().collect()
    };
    let HiveMessage::AddPartition {
        table, partitions, ..
    } = msg(23)
    else {
        panic!("event 23 adds partitions")
    };
    assert_eq!(partitions.len(), 2);
    let (last, sources) = exchange_drops(&table, &partitions, &after(23)).expect("an exchange");
    assert_eq!(last, 25);
    assert_eq!(
        sources
            .iter()
            .map(|(t, v)| format!("{}.{} {}", t.db, t.name, v.join("/")))
            .collect::<Vec<_>>(),
        vec!["sales.orders 2024-01-03/eu", "sales.orders 2024-01-03/us"]
    );
    let (last, _) = exchange_drops(&table, &partitions[..1], &after(23)).expect("one");
    assert_eq!(last, 24);
    // The drops in another order, too few, or of other values: no exchange.
    let mut swapped = after(23);
    swapped.swap(0, 1);
    assert!(exchange_drops(&table, &partitions, &swapped).is_none());
    assert!(exchange_drops(&table, &partitions, &after(24)).is_none());
    // Event 15 adds orders' (2024-01-03, eu); event 17 drops another
    // partition of the same table.
    let HiveMessage::AddPartition {
        table, partitions, ..
    } = msg(15)
    else {
        panic!("event 15 adds a partition")
    };
    assert!(exchange_drops(&table, &partitions, &after(16)).is_none());
    // A drop of the same partition of the same table is no exchange.
    let HiveMessage::AddPartition {
        table, partitions, ..
    } = msg(19)
    else {
        panic!("event 19 adds a partition")
    };
    let mut same = table.clone();
    same.name = "orders".into();
    assert!(exchange_drops(&same, &partitions, &after(19)).is_none());
}
