//! [`RealMetastore`]: Hive's own standalone metastore (4.0.1, or 3.1.3 with
//! HCatalog's DbNotificationListener: [`Hive`]) run by the launcher in
//! `tests/java/hms-launcher` (or `hms3-launcher`), one JVM per value, on a database
//! of one of the tests' private servers (tests/common/dbserver.rs) and with
//! its warehouse and cmroot on a private HDFS ([`MiniHdfs`]).
//!
//! The launcher runs Hive's schematool on the database, starts the Thrift
//! metastore with our `NotificationLogListener` as transactional listener
//! (HCatalog's DbNotificationListener is not served for 4.0.x), DML
//! events and change management on, prints one JSON ready line, then
//! answers one JSON line per driver command (create-db, create-table,
//! add-partition, insert, drop-partition, rename, truncate, drop-table,
//! state). Each answer carries the metastore's current event id and the
//! source's content as the metastore API and an HDFS listing show it: the
//! oracle. It exits when its stdin closes; dropped, the value sends `quit`,
//! waits, kills it if it does not end ([`Launcher`]), and removes its
//! directory.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::launcher::{jvm, Launcher};
use super::repo_root;

/// schematool + DataNucleus + Thrift server start.
const START_TIMEOUT: Duration = Duration::from_secs(240);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Which message encoder the metastore writes `NOTIFICATION_LOG` with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoder {
    /// `JSONMessageEncoder`: `MESSAGE_FORMAT` `json-0.2`.
    Json,
    /// `GzipJSONMessageEncoder`: `MESSAGE_FORMAT` `gzip(json-2.0)`.
    Gzip,
}

/// Which Hive metastore the launcher runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hive {
    /// Hive 4.0.1 (tests/java/hms-launcher) with our `NotificationLogListener`
    /// (HCatalog's is not served for 4.0.x).
    V4,
    /// Hive 3.1.3 (tests/java/hms3-launcher, the same launcher source) with
    /// HCatalog's own `DbNotificationListener` 3.1.3, transaction events
    /// included. Its only message format is `json-0.2`.
    V3,
}

impl Hive {
    fn module(self) -> &'static str {
        match self {
            Hive::V4 => "hms-launcher",
            Hive::V3 => "hms3-launcher",
        }
    }

    fn bin_dir(self) -> &'static str {
        match self {
            Hive::V4 => "apache-hive-metastore-4.0.1-bin",
            Hive::V3 => "apache-hive-metastore-3.1.3-bin",
        }
    }

    fn listener(self) -> &'static str {
        match self {
            Hive::V4 => "stagefs.hms.NotificationLogListener",
            Hive::V3 => "org.apache.hive.hcatalog.listener.DbNotificationListener",
        }
    }
}

/// What the metastore makes of a non-ACID `MANAGED_TABLE` a client creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManagedTables {
    /// Hive 4's default metadata transformer (`MetastoreDefaultTransformer`):
    /// an `EXTERNAL_TABLE` with `TRANSLATED_TO_EXTERNAL`=`TRUE`, under the
    /// external warehouse (`/external`).
    Translated,
    /// No metadata transformer (`metastore.metadata.transformer.class`
    /// empty): the table stays managed, under `/warehouse`.
    Kept,
}

/// The metastore's database.
#[derive(Debug, Clone)]
pub struct MetastoreDb {
    /// `postgres` or `mysql` (schematool's `-dbType`).
    pub db_type: &'static str,
    /// A JDBC URL (`jdbc:postgresql://127.0.0.1:PORT/DB`, `jdbc:mariadb://…`).
    pub jdbc_url: String,
    pub user: String,
    pub password: String,
}

pub struct RealMetastore {
    /// Dropped first: the metastore stops before its directory goes.
    launcher: Launcher,
    ready: Value,
    dir: tempfile::TempDir,
}

fn launcher_dir(hive: Hive) -> PathBuf {
    repo_root()
        .join("tests/java")
        .join(hive.module())
        .join("target")
}

/// The newest modification time of a file below `dir`.
fn newest_mtime(dir: &std::path::Path) -> Option<std::time::SystemTime> {
    let mut newest = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let t = if path.is_dir() {
            newest_mtime(&path)
        } else {
            entry.metadata().and_then(|m| m.modified()).ok()
        };
        newest = newest.max(t);
    }
    newest
}

/// The launcher's class path and schematool's script dir, or why it cannot run.
fn launcher_paths(hive: Hive) -> Result<(String, PathBuf), String> {
    let target = launcher_dir(hive);
    let classes = target.join("classes");
    let scripts = target.join("metastore-home").join(hive.bin_dir());
    let deps = std::fs::read_to_string(target.join("classpath.txt"));
    let built = std::fs::metadata(classes.join("stagefs/hms/Launcher.class"))
        .and_then(|m| m.modified())
        .ok();
    let sources = repo_root().join("tests/java/hms-launcher/src");
    if let (Some(built), Some(newest)) = (built, newest_mtime(&sources)) {
        if newest > built {
            return Err(format!(
                "the metastore launcher in {} is older than its sources in {}: run scripts/setup-servers.sh",
                target.display(),
                sources.display()
            ));
        }
    }
    match deps {
        Ok(deps)
            if classes.join("stagefs/hms/Launcher.class").exists()
                && scripts.join("scripts/metastore/upgrade").is_dir() =>
        {
            Ok((format!("{}:{}", classes.display(), deps.trim()), scripts))
        }
        _ => Err(format!(
            "the metastore launcher is not built ({} is missing): run scripts/setup-servers.sh",
            target.join("classpath.txt").display()
        )),
    }
}

impl RealMetastore {
    /// Runs schematool on `db` and starts the metastore with its warehouse
    /// and cmroot on `hdfs_uri` (`hdfs://127.0.0.1:PORT`).
    pub fn start(db: &MetastoreDb, hdfs_uri: &str, encoder: Encoder) -> Result<Self, String> {
        Self::start_hive(Hive::V4, db, hdfs_uri, encoder)
    }

    /// [`RealMetastore::start`] with the metastore of `hive`.
    pub fn start_hive(
        hive: Hive,
        db: &MetastoreDb,
        hdfs_uri: &str,
        encoder: Encoder,
    ) -> Result<Self, String> {
        Self::start_with(hive, db, hdfs_uri, encoder, ManagedTables::Translated)
    }

    /// [`RealMetastore::start_hive`] with managed tables treated as `managed`
    /// says (Hive 4.0.1 only: 3.1.3 has no metadata transformer).
    pub fn start_with(
        hive: Hive,
        db: &MetastoreDb,
        hdfs_uri: &str,
        encoder: Encoder,
        managed: ManagedTables,
    ) -> Result<Self, String> {
        let (classpath, scripts) = launcher_paths(hive)?;
        let dir = tempfile::Builder::new()
            .prefix("stagefs-hms-")
            .tempdir()
            .map_err(|e| format!("creating the metastore's temp dir: {e}"))?;
        let log = dir.path().join("launcher.log");
        let mut cmd = jvm();
        cmd.args(["-cp", &classpath, "stagefs.hms.Launcher", "--base-dir"])
            .arg(dir.path().join("hms"))
            .args(["--hdfs", hdfs_uri])
            .args(["--db-type", db.db_type])
            .args(["--jdbc-url", &db.jdbc_url])
            .args(["--db-user", &db.user])
            .args(["--db-password", &db.password])
            .arg("--scripts")
            .arg(&scripts)
            .args(["--listener", hive.listener()])
            .args([
                "--encoder",
                match encoder {
                    Encoder::Json => "json",
                    Encoder::Gzip => "gzip",
                },
            ]);
        if managed == ManagedTables::Kept {
            cmd.args(["--translate-managed", "false"]);
        }
        cmd.env_remove("HADOOP_CONF_DIR")
            .env_remove("HADOOP_USER_NAME")
            .env_remove("HIVE_CONF_DIR");
        let (launcher, ready) =
            Launcher::start(cmd, log, "the metastore launcher", 6000, START_TIMEOUT)?;
        Ok(RealMetastore {
            launcher,
            ready,
            dir,
        })
    }

    /// The ready line: `thrift_uri`, `hdfs`, `warehouse`, `cmroot`,
    /// `conf_dir`, `encoder`, `hive_version`, `event_id`.
    pub fn ready(&self) -> &Value {
        &self.ready
    }

    pub fn thrift_uri(&self) -> &str {
        self.ready["thrift_uri"].as_str().unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        self.launcher.log_tail()
    }

    /// Sends one driver command (words without spaces) and returns its
    /// reply (`event_id`, `source`), or the launcher's error with the end
    /// of its log.
    pub fn call(&mut self, words: &[&str]) -> Result<Value, String> {
        self.launcher
            .call(words, COMMAND_TIMEOUT)
            .map_err(|e| format!("{e}\n{}", self.log_tail()))
    }

    /// A scratch directory of this metastore's (for files to insert).
    pub fn scratch(&self) -> PathBuf {
        self.dir.path().to_owned()
    }
}
