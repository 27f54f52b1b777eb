//! [`MiniHdfs`]: a private HDFS (Hadoop's MiniDFSCluster) run by the
//! launcher in `tests/java/hdfs-launcher`, one JVM per value.
//!
//! The launcher prints one JSON ready line and then answers one JSON line
//! per command on stdin (put, get, checksum, mkdir, rm, ls, stop-datanode,
//! restart-datanode, quit). It exits when its stdin closes, so a test
//! process that dies takes the cluster with it; dropped, the value sends
//! `quit`, waits, kills it if it does not end ([`Launcher`]), and removes
//! the cluster's directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;

use super::launcher::{jvm, Launcher};
use super::repo_root;

/// How long the cluster may take to come up (JVM start, format, DataNodes).
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// How long one command may take (a DataNode restart waits for it to register).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// How to start a [`MiniHdfs`].
#[derive(Debug, Clone)]
pub struct MiniHdfsOptions {
    pub datanodes: usize,
    /// `dfs.blocksize` (default 128 MiB); `put_with` can set it per file.
    pub block_size: Option<u64>,
    /// `dfs.replication` (default min(3, datanodes)).
    pub replication: Option<u32>,
    /// The NameNode's RPC port; 0 picks a free one.
    pub nn_port: u16,
    /// `dfs.checksum.type`: `CRC32C` (default) or `CRC32`.
    pub checksum_type: Option<String>,
}

impl MiniHdfsOptions {
    pub fn new(datanodes: usize) -> MiniHdfsOptions {
        MiniHdfsOptions {
            datanodes,
            block_size: None,
            replication: None,
            nn_port: 0,
            checksum_type: None,
        }
    }
}

/// What `getFileChecksum` returned: `hex` is the first `getLength()` bytes
/// of `getBytes()`, as Hive records it and `hdfs dfs -checksum` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HdfsChecksumReply {
    /// e.g. `MD5-of-0MD5-of-512CRC32C`.
    pub algorithm: String,
    pub hex: String,
}

pub struct MiniHdfs {
    /// Dropped first: the cluster stops before its directory goes.
    launcher: Launcher,
    ready: Value,
    namenode: String,
    conf_dir: PathBuf,
    /// Holds the cluster's base dir and the launcher's log; removed last.
    dir: tempfile::TempDir,
}

static UPLOADS: AtomicU64 = AtomicU64::new(0);

/// The launcher's class path, or why it cannot run.
fn launcher_classpath() -> Result<String, String> {
    let target = repo_root().join("tests/java/hdfs-launcher/target");
    let classes = target.join("classes");
    let deps = std::fs::read_to_string(target.join("classpath.txt"));
    match deps {
        Ok(deps) if classes.join("stagefs/hdfs/Launcher.class").exists() => {
            Ok(format!("{}:{}", classes.display(), deps.trim()))
        }
        _ => Err(format!(
            "the HDFS launcher is not built ({} is missing): run scripts/setup-servers.sh",
            target.join("classpath.txt").display()
        )),
    }
}

impl MiniHdfs {
    /// A cluster of `datanodes` DataNodes with the default options.
    pub fn start(datanodes: usize) -> Result<MiniHdfs, String> {
        MiniHdfs::start_with(MiniHdfsOptions::new(datanodes))
    }

    pub fn start_with(opts: MiniHdfsOptions) -> Result<MiniHdfs, String> {
        let classpath = launcher_classpath()?;
        let dir = tempfile::Builder::new()
            .prefix("stagefs-hdfs-")
            .tempdir()
            .map_err(|e| format!("creating the cluster's temp dir: {e}"))?;
        let base = dir.path().join("cluster");
        let log = dir.path().join("launcher.log");
        let mut cmd = jvm();
        cmd.args(["-cp", &classpath, "stagefs.hdfs.Launcher", "--base-dir"])
            .arg(&base)
            .args(["--datanodes", &opts.datanodes.to_string()])
            .args(["--nn-port", &opts.nn_port.to_string()]);
        if let Some(b) = opts.block_size {
            cmd.args(["--block-size", &b.to_string()]);
        }
        if let Some(r) = opts.replication {
            cmd.args(["--replication", &r.to_string()]);
        }
        if let Some(t) = &opts.checksum_type {
            cmd.args(["--checksum-type", t]);
        }
        // Hadoop reads HADOOP_* from the environment; the test's own
        // settings must not leak into the cluster.
        cmd.env_remove("HADOOP_CONF_DIR")
            .env_remove("HADOOP_USER_NAME");
        let (launcher, ready) =
            Launcher::start(cmd, log, "the HDFS launcher", 4000, START_TIMEOUT)?;
        Ok(MiniHdfs {
            launcher,
            namenode: ready["namenode"].as_str().unwrap_or_default().to_string(),
            conf_dir: PathBuf::from(ready["conf_dir"].as_str().unwrap_or_default()),
            ready,
            dir,
        })
    }

    /// Sends one command (words without spaces) and returns its reply, or
    /// the launcher's error.
    pub fn call(&mut self, words: &[&str]) -> Result<Value, String> {
        self.launcher.call(words, COMMAND_TIMEOUT)
    }

    /// `hdfs://127.0.0.1:PORT`.
    pub fn uri(&self) -> &str {
        &self.namenode
    }

    pub fn nn_port(&self) -> u16 {
        self.ready["nn_port"].as_u64().unwrap_or(0) as u16
    }

    /// A Hadoop conf dir (core-site.xml, hdfs-site.xml) for clients.
    pub fn conf_dir(&self) -> &Path {
        &self.conf_dir
    }

    /// The ready line as the launcher printed it.
    pub fn ready(&self) -> &Value {
        &self.ready
    }

    /// Copies a local file to `hdfs_path` (overwriting, parents created)
    /// with the cluster's block size and replication.
    pub fn put(&mut self, local: &Path, hdfs_path: &str) -> Result<Value, String> {
        let local = local.to_str().ok_or("local path is not UTF-8")?;
        self.call(&["put", local, hdfs_path])
    }

    /// Like [`put`](Self::put) with this file's block size and replication.
    pub fn put_with(
        &mut self,
        local: &Path,
        hdfs_path: &str,
        block_size: u64,
        replication: u32,
    ) -> Result<Value, String> {
        let local = local.to_str().ok_or("local path is not UTF-8")?;
        self.call(&[
            "put",
            local,
            hdfs_path,
            &block_size.to_string(),
            &replication.to_string(),
        ])
    }

    /// Writes `bytes` to `hdfs_path`, with `block_size` if given.
    pub fn put_bytes(
        &mut self,
        hdfs_path: &str,
        bytes: &[u8],
        block_size: Option<u64>,
    ) -> Result<Value, String> {
        let n = UPLOADS.fetch_add(1, Ordering::Relaxed);
        let local = self.dir.path().join(format!("upload-{n}"));
        std::fs::write(&local, bytes).map_err(|e| format!("writing {}: {e}", local.display()))?;
        let reply = match block_size {
            Some(b) => {
                let replication = self.ready["replication"].as_u64().unwrap_or(1) as u32;
                self.put_with(&local, hdfs_path, b, replication)
            }
            None => self.put(&local, hdfs_path),
        };
        let _ = std::fs::remove_file(&local);
        reply
    }

    /// Reads a whole file through Hadoop's own client.
    pub fn get_bytes(&mut self, hdfs_path: &str) -> Result<Vec<u8>, String> {
        let n = UPLOADS.fetch_add(1, Ordering::Relaxed);
        let local = self.dir.path().join(format!("download-{n}"));
        let local_str = local.to_str().ok_or("temp path is not UTF-8")?.to_string();
        self.call(&["get", hdfs_path, &local_str])?;
        let bytes = std::fs::read(&local).map_err(|e| format!("reading {}: {e}", local.display()));
        let _ = std::fs::remove_file(&local);
        bytes
    }

    /// `FileSystem.getFileChecksum` of `hdfs_path`.
    pub fn checksum(&mut self, hdfs_path: &str) -> Result<HdfsChecksumReply, String> {
        let reply = self.call(&["checksum", hdfs_path])?;
        match (reply["algorithm"].as_str(), reply["hex"].as_str()) {
            (Some(algorithm), Some(hex)) => Ok(HdfsChecksumReply {
                algorithm: algorithm.to_string(),
                hex: hex.to_string(),
            }),
            _ => Err(format!("checksum {hdfs_path}: unexpected reply {reply}")),
        }
    }

    pub fn mkdir(&mut self, hdfs_path: &str) -> Result<(), String> {
        self.call(&["mkdir", hdfs_path]).map(|_| ())
    }

    /// Deletes recursively; true when something was deleted.
    pub fn rm(&mut self, hdfs_path: &str) -> Result<bool, String> {
        Ok(self.call(&["rm", hdfs_path])?["deleted"] == Value::Bool(true))
    }

    /// The entries of a directory: `path`, `len`, `is_dir`, `block_size`,
    /// `replication`, `mtime_ms`.
    pub fn ls(&mut self, hdfs_path: &str) -> Result<Vec<Value>, String> {
        match self.call(&["ls", hdfs_path])?["entries"].take() {
            Value::Array(entries) => Ok(entries),
            other => Err(format!("ls {hdfs_path}: unexpected reply {other}")),
        }
    }

    /// Stops DataNode `index` (counted as started, 0-based).
    pub fn stop_datanode(&mut self, index: usize) -> Result<(), String> {
        self.call(&["stop-datanode", &index.to_string()])
            .map(|_| ())
    }

    /// Restarts a stopped DataNode on its old ports and waits for it.
    pub fn restart_datanode(&mut self, index: usize) -> Result<(), String> {
        self.call(&["restart-datanode", &index.to_string()])
            .map(|_| ())
    }
}
