//! What the Hive pipeline tests share (tests/hive_pipeline.rs, with the
//! source files in a local folder, on HDFS and on S3): the replication
//! config that follows exported notification rows, and the states to
//! compare with — the native trees of the same warehouse's event log.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::catalog::Tree;
use crate::event::{BlobId, Event, StateId};
use crate::replicate::ReplicaConfig;
use crate::source::hive::map::SourceMap;
use crate::source::hive::{HiveConfig, HiveRows};

/// Replication of the Hive rows exported under `rows` into `state`, the
/// files where `map` says (an empty map: every URI is read where it
/// is): rows polled every 20 ms, GC every 100 ms, every version retained
/// so each can be compared.
pub fn hive_rows_config(state: &Path, rows: &Path, map: SourceMap) -> ReplicaConfig {
    let mut cfg = ReplicaConfig::new(state, Path::new(""), Path::new(""));
    let mut hive = HiveConfig::new(HiveRows::Files(rows.to_owned()), map);
    hive.poll_interval = Duration::from_millis(20);
    cfg.hive = Some(hive);
    cfg.gc_interval = Duration::from_millis(100);
    cfg.retain = 10_000;
    cfg
}

/// The native trees at every id of the log under `root/events`.
pub fn native_trees(root: &Path) -> BTreeMap<StateId, Arc<Tree>> {
    let mut names: Vec<_> = std::fs::read_dir(root.join("events"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    let mut tree = Arc::new(Tree::empty());
    let mut out = BTreeMap::new();
    for p in names {
        for line in std::fs::read_to_string(p).unwrap().lines() {
            let e = Event::parse_line(line.as_bytes()).unwrap();
            tree = Arc::new(tree.apply(&e).unwrap().0);
            out.insert(e.id, Arc::clone(&tree));
        }
    }
    out
}

/// `db.table` → (path, sha256) of every file, for comparing states.
pub fn content(tree: &Tree) -> BTreeMap<String, Vec<(String, BlobId)>> {
    let mut out = BTreeMap::new();
    for (db, d) in tree.root.children.iter() {
        for (t, table) in d.as_dir().unwrap().children.iter() {
            out.insert(format!("{db}.{t}"), table.as_dir().unwrap().files_below());
        }
    }
    out
}
