//! The mount checks of the real-metastore tests (tests/real_hive.rs,
//! tests/real_hive_spark.rs): the oracle's tables as the mount lays them
//! out, readers walking the mount while the source changes, and the check
//! of each walk against the oracle at its state-id. Include with
//! `#[path = "common/real_hive_mount.rs"] mod real_hive_mount;` beside
//! `mod common;`, `mod dbserver;` and `mod servers;`.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::Value;

use crate::common;
use crate::common::daemon::read_tree;
use crate::dbserver::{DbServer, Kind, PASSWORD, USER};
use crate::servers::hms::{Encoder, MetastoreDb, RealMetastore};
use crate::servers::MiniHdfs;
use stagefs::source::hive::metastore::{MetastoreSource, Timeouts};
use stagefs::source::hive::model::{NotificationRow, RowSource};

/// Every `NOTIFICATION_LOG` row of the metastore database `hive` on
/// `server`, read through stagefs's own metastore source (returned too,
/// for further questions), in pages of 100.
pub fn all_rows(server: &DbServer) -> (MetastoreSource, Vec<NotificationRow>) {
    let mut source = MetastoreSource::open(
        &server.url("hive"),
        Some(PASSWORD.into()),
        Timeouts::default(),
    )
    .expect("metastore source");
    let mut rows: Vec<NotificationRow> = Vec::new();
    loop {
        let after = rows.last().map(|r| r.event_id).unwrap_or(0);
        let page = source.poll(after, 100).expect("poll");
        if page.is_empty() {
            break;
        }
        rows.extend(page);
    }
    (source, rows)
}

/// What most real-metastore tests start from: a private database server
/// of `kind` with a database `hive`, a MiniDFSCluster of one DataNode and
/// Hive 4.0.1's metastore on them (JSON encoder, Hive 4's default
/// translation of managed tables). Bind the fields to locals
/// (`let RealHive { server, hdfs, hms } = RealHive::start(kind);`): they
/// stop when dropped, the metastore first, then HDFS, then the database
/// (also when a test fails; a failed start stops what started before it).
pub struct RealHive {
    pub server: DbServer,
    pub hdfs: MiniHdfs,
    pub hms: RealMetastore,
}

impl RealHive {
    pub fn start(kind: Kind) -> RealHive {
        let server = DbServer::start(kind);
        server.create_database("hive");
        let hdfs = MiniHdfs::start(1).unwrap_or_else(|e| panic!("{e}"));
        let hms = RealMetastore::start(&metastore_db(kind, &server), hdfs.uri(), Encoder::Json)
            .unwrap_or_else(|e| panic!("{e}"));
        RealHive { server, hdfs, hms }
    }
}

/// `db.table` → path below the table (`k=v/…/name`) → sha256 hex.
pub type Tables = BTreeMap<String, BTreeMap<String, String>>;

/// The metastore database on one of the tests' private servers.
pub fn metastore_db(kind: Kind, server: &DbServer) -> MetastoreDb {
    match kind {
        Kind::Postgres => MetastoreDb {
            db_type: "postgres",
            jdbc_url: format!("jdbc:postgresql://127.0.0.1:{}/hive", server.port()),
            user: USER.into(),
            password: PASSWORD.into(),
        },
        Kind::MariaDb => MetastoreDb {
            db_type: "mysql",
            jdbc_url: format!("jdbc:mariadb://127.0.0.1:{}/hive", server.port()),
            user: USER.into(),
            password: PASSWORD.into(),
        },
    }
}

/// The oracle's tables (the launcher's `source`), as the mount lays them
/// out: a partition's files under its `k1=v1/k2=v2` directory, each file
/// where it lies below its partition's (or the table's) location.
pub fn oracle_tables(source: &Value) -> Tables {
    let below = |loc: &str, path: &str| -> String {
        path.strip_prefix(loc)
            .and_then(|r| r.strip_prefix('/'))
            .unwrap_or_else(|| panic!("{path} is not below {loc}"))
            .to_owned()
    };
    let mut out = Tables::new();
    for (key, t) in source.as_object().expect("source object") {
        let mut files = BTreeMap::new();
        let add = |files: &mut BTreeMap<String, String>, dir: &str, loc: &str, list: &Value| {
            for f in list.as_array().expect("files") {
                let rel = below(loc, f["path"].as_str().expect("path"));
                let rel = if dir.is_empty() {
                    rel
                } else {
                    format!("{dir}/{rel}")
                };
                files.insert(rel, f["sha256"].as_str().expect("sha256").to_owned());
            }
        };
        match t.get("partitions") {
            None => add(
                &mut files,
                "",
                t["location"].as_str().expect("location"),
                &t["files"],
            ),
            Some(parts) => {
                let keys: Vec<&str> = t["partition_keys"]
                    .as_array()
                    .expect("keys")
                    .iter()
                    .map(|k| k.as_str().expect("key"))
                    .collect();
                for p in parts.as_array().expect("partitions") {
                    let dir: Vec<String> = keys
                        .iter()
                        .zip(p["values"].as_array().expect("values"))
                        .map(|(k, v)| format!("{k}={}", v.as_str().expect("value")))
                        .collect();
                    add(
                        &mut files,
                        &dir.join("/"),
                        p["location"].as_str().expect("location"),
                        &p["files"],
                    );
                }
            }
        }
        out.insert(key.clone(), files);
    }
    out
}

/// One walk of the mount by a reader: the state its view showed (the
/// root's `user.stagefs.state_id`, the same before and after the walk) and
/// every `db.table` in it with its content.
pub struct Walk {
    pub state: u64,
    pub tables: Tables,
}

fn root_state(mnt: &Path) -> u64 {
    common::getxattr(mnt, "user.stagefs.state_id")
        .expect("state_id of the root")
        .parse()
        .expect("decimal state_id")
}

/// Walks every `db/table` of the mount, each table read through one
/// directory handle. `None` when the view moved during the walk (the walk
/// then spans two states and is not checked).
pub fn walk_mount(mnt: &Path) -> Option<Walk> {
    let state = root_state(mnt);
    let mut tables = Tables::new();
    for db in std::fs::read_dir(mnt).expect("read the mount").flatten() {
        let db_name = db.file_name().to_string_lossy().into_owned();
        if db_name.starts_with('.') {
            continue;
        }
        let Ok(list) = std::fs::read_dir(db.path()) else {
            continue;
        };
        for t in list.flatten() {
            let Ok(dir) = std::fs::File::open(t.path()) else {
                continue;
            };
            use std::os::unix::io::AsRawFd;
            let at = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
            let changed: u64 = common::getxattr(&at, "user.stagefs.state_id")
                .unwrap_or_else(|e| panic!("state_id of {}: errno {e}", t.path().display()))
                .parse()
                .expect("decimal state_id");
            if changed > state {
                // The other reader thread moved this process's view.
                return None;
            }
            let key = format!("{db_name}.{}", t.file_name().to_string_lossy());
            tables.insert(key, read_tree(&at));
        }
    }
    (root_state(mnt) == state).then_some(Walk { state, tables })
}

/// Reader threads walking the mount until [`Walkers::finish`].
pub struct Walkers {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<(Vec<Walk>, usize)>>,
}

impl Walkers {
    /// `n` threads, each walking the whole mount every 5 ms.
    pub fn start(mnt: &Path, n: usize) -> Walkers {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = Arc::clone(&stop);
                let mnt = mnt.to_owned();
                std::thread::spawn(move || {
                    let (mut seen, mut moved) = (Vec::new(), 0usize);
                    while !stop.load(Ordering::Relaxed) {
                        // Reading `user.stagefs.visible` moves this process's
                        // view to the newest state at once (docs/SEMANTICS.md,
                        // "The view rule"): each walk sees a fresh state.
                        let _ = common::getxattr(&mnt, "user.stagefs.visible");
                        match walk_mount(&mnt) {
                            Some(w) => seen.push(w),
                            None => moved += 1,
                        }
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    (seen, moved)
                })
            })
            .collect();
        Walkers { stop, threads }
    }

    /// Stops the readers: every checked walk, and how many walks spanned a
    /// view move.
    pub fn finish(self) -> (Vec<Walk>, usize) {
        self.stop.store(true, Ordering::Relaxed);
        let (mut seen, mut moved) = (Vec::new(), 0);
        for r in self.threads {
            let (w, m) = r.join().expect("reader");
            seen.extend(w);
            moved += m;
        }
        (seen, moved)
    }
}

/// How finely a walk inside an operation of several events is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Within {
    /// Each table equals the oracle before or after the operation (each
    /// table changes once within one operation).
    Table,
    /// Each partition (the leading `k=v` directories of a path; the whole
    /// table when it is unpartitioned) equals the oracle before or after
    /// it: an operation that writes several partitions of a table one
    /// event each (a dynamic partition insert); a table the operation
    /// creates may be empty in between (CREATE_TABLE, then the files).
    Partition,
}

/// The files of one partition of a table's content.
fn partition_of(path: &str) -> String {
    let mut parts: Vec<&str> = path.split('/').collect();
    parts.pop();
    parts
        .into_iter()
        .take_while(|c| c.contains('='))
        .collect::<Vec<_>>()
        .join("/")
}

fn by_partition(files: &BTreeMap<String, String>) -> BTreeMap<String, BTreeMap<&str, &str>> {
    let mut out: BTreeMap<String, BTreeMap<&str, &str>> = BTreeMap::new();
    for (path, sha) in files {
        out.entry(partition_of(path))
            .or_default()
            .insert(path.as_str(), sha.as_str());
    }
    out
}

/// Whether a table as the mount showed it can be the source's inside an
/// operation from `lo` to `hi`, compared partition by partition.
fn between_by_partition(
    lo: Option<&BTreeMap<String, String>>,
    hi: Option<&BTreeMap<String, String>>,
    got: Option<&BTreeMap<String, String>>,
) -> bool {
    let empty = BTreeMap::new();
    // A table created within the step (CREATE_TABLE, then its files: a
    // CTAS) is empty in between.
    if lo == got || hi == got {
        return true;
    }
    let lo = lo.or(hi.map(|_| &empty));
    let (Some(lo), Some(hi), Some(got)) = (lo, hi, got) else {
        return false;
    };
    let (lo, hi, got) = (by_partition(lo), by_partition(hi), by_partition(got));
    let keys: BTreeSet<String> = got
        .keys()
        .chain(lo.keys())
        .chain(hi.keys())
        .cloned()
        .collect();
    keys.iter()
        .all(|k| got.get(k) == lo.get(k) || got.get(k) == hi.get(k))
}

/// Whether a walk shows what the oracle says at its state, table by
/// table (present or not, and content): exactly the oracle after the
/// operation that ended at that id, or, for an id inside an operation of
/// several events (a truncate's two rows, a cascading drop, a Spark
/// statement), the oracle before or after it, compared as `within` says.
/// Returns the anomalies.
pub fn check_walk(oracles: &[(u64, Tables)], w: &Walk, within: Within) -> Vec<String> {
    let k = match oracles.binary_search_by_key(&w.state, |(id, _)| *id) {
        Ok(k) => Ok(k),
        Err(0) => return vec![format!("view {} before the first oracle", w.state)],
        Err(k) if k == oracles.len() => {
            return vec![format!("view {} after the last operation", w.state)]
        }
        Err(k) => Err(k),
    };
    let mut names: BTreeSet<&String> = w.tables.keys().collect();
    match k {
        Ok(k) => names.extend(oracles[k].1.keys()),
        Err(k) => {
            names.extend(oracles[k - 1].1.keys());
            names.extend(oracles[k].1.keys());
        }
    }
    let mut bad = Vec::new();
    for name in names {
        let got = w.tables.get(name);
        let ok = match k {
            Ok(k) => oracles[k].1.get(name) == got,
            Err(k) => {
                let (lo, hi) = (oracles[k - 1].1.get(name), oracles[k].1.get(name));
                match within {
                    Within::Table => lo == got || hi == got,
                    Within::Partition => between_by_partition(lo, hi, got),
                }
            }
        };
        if !ok {
            let (lo, hi) = match k {
                Ok(k) => (k, k),
                Err(k) => (k - 1, k),
            };
            bad.push(format!(
                "{name} in view {}: mount {got:?}, source at {} {:?}, at {} {:?}",
                w.state,
                oracles[lo].0,
                oracles[lo].1.get(name),
                oracles[hi].0,
                oracles[hi].1.get(name)
            ));
        }
    }
    bad
}
