//! `hdfs-stage`: Hive files staged from HDFS by the Replica pipeline,
//! against `rclone copy` (its HDFS backend) and `hdfs dfs -get` of the
//! same files from the same cluster (issue 29, docs/BENCHMARKS.md
//! "Staging from HDFS").
//!
//! One private HDFS (Hadoop 3.4.2's MiniDFSCluster, tests/servers/hdfs.rs:
//! one NameNode and one DataNode on 127.0.0.1, replication 1, 128 MiB
//! blocks) serves all three. Each set is written locally, put on HDFS with
//! Hadoop's own shell (`FsShell -put -t 4`), and described by one Hive
//! INSERT row per file (`json-0.2`) whose URI is `hdfs://127.0.0.1:PORT/...`
//! with the checksum the cluster reports for it (`getFileChecksum`, as Hive
//! records it; `FsShell -checksum`). stagefs: `Replica::start` on those rows
//! with no `--source-map` (4 fetch threads, each file read with
//! hdfs-native, sha256 and the HDFS checksum computed in one pass and
//! checked, fdatasynced, renamed, commit record fsynced), clock stopped when
//! the last id is visible. rclone: `rclone copy :hdfs:/bench/<set>` with
//! `--transfers 4` (4 streams per file of 250 MiB or more), then `sync`;
//! its HDFS backend has no hash, so only sizes are compared. `hdfs dfs
//! -get -t 4`: `java org.apache.hadoop.fs.FsShell` with the Hadoop client
//! jars of the Maven cache (the launcher's class path), which verifies
//! every chunk's CRC as it reads, then `sync`; its time includes the JVM's
//! start, which is timed alone (`FsShell -test -d /`) and told in a note.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

use stagefs::source_file::Remotes;

use super::remote::{self, rclone_baseline, Baseline, Place};
use super::servers::{repo_root, MiniHdfs, MiniHdfsOptions};
use super::{median, note, Opts, Res};

pub fn bench_stage(o: &Opts) -> Res<()> {
    let reps = o.num("reps", 3).max(1);
    let mut opts = MiniHdfsOptions::new(1);
    opts.replication = Some(1);
    let hdfs = MiniHdfs::start_with(opts)?;
    let shell = FsShell::new(&hdfs)?;
    let jvm: Vec<f64> = (0..3)
        .map(|_| -> Res<f64> {
            let t = Instant::now();
            shell.run(&["-test", "-d", "/"])?;
            Ok(t.elapsed().as_secs_f64())
        })
        .collect::<Res<_>>()?;
    let jvm = median(jvm);
    for set in remote::sets(o) {
        let written = remote::write_set(o, "hdfs-stage", &set)?;
        let dir = format!("/bench/{}", set.label);
        let t = Instant::now();
        shell.run(&["-mkdir", "-p", &dir])?;
        let local = written.src.join("warehouse");
        let local = local.to_str().ok_or("the work folder is not UTF-8")?;
        shell.run(&["-put", "-d", "-t", "4", local, &dir])?;
        let sums = shell.run(&["-checksum", &format!("{dir}/warehouse/bench/t/*/*")])?;
        let sums = String::from_utf8(sums.stdout)?;
        let mut checksums = std::collections::BTreeMap::new();
        for line in sums.lines() {
            // `PATH\tALGORITHM\tHEX`
            let mut f = line.split('\t');
            if let (Some(path), Some(_), Some(hex)) = (f.next(), f.next(), f.next()) {
                let rel = path
                    .rsplit_once(&format!("{dir}/"))
                    .map_or(path, |(_, rel)| rel);
                checksums.insert(rel.to_owned(), hex.to_owned());
            }
        }
        if checksums.len() as u64 != set.count {
            return Err(format!(
                "HDFS reports {} checksums for {} files",
                checksums.len(),
                set.count
            )
            .into());
        }
        remote::move_rows(&written.rows, &format!("{}{dir}", hdfs.uri()), |rel| {
            checksums
                .get(rel)
                .cloned()
                .ok_or_else(|| format!("no checksum for {rel}").into())
        })?;
        eprintln!(
            "hdfs-stage {}: wrote {} and their rows, put on HDFS in {:.1?}",
            set.label,
            set.what(),
            t.elapsed()
        );
        let rclone = rclone_baseline(|cmd: &mut Command| {
            cmd.args(["--hdfs-namenode", &format!("127.0.0.1:{}", hdfs.nn_port())])
                .args(["--hdfs-username", &shell.user])
                .arg(format!(":hdfs:{dir}"));
        });
        let get = Baseline {
            name: "`hdfs dfs -get -t 4` (JVM start included) + `sync`".into(),
            short: "hdfs dfs -get",
            run: Box::new(|dest: &Path| {
                let dest = dest.to_str().ok_or("the work folder is not UTF-8")?;
                shell.run(&["-get", "-t", "4", &dir, dest]).map(drop)
            }),
        };
        let place = Place {
            source: "HDFS",
            checked: "HDFS checksum checked",
            prefix: "S2",
            remotes: Remotes::default(),
            server: "a private MiniDFSCluster (1 DataNode) on 127.0.0.1",
        };
        remote::compare(&set, &written, &place, vec![rclone, get], reps)?;
    }
    note(&format!(
        "hdfs-stage: starting the JVM of `hdfs dfs` and asking the NameNode once \
         (`FsShell -test -d /`) takes {jvm:.2} s (median of 3), included in every `hdfs dfs -get` time"
    ));
    Ok(())
}

/// `hdfs dfs` as `java org.apache.hadoop.fs.FsShell`, with the cluster's
/// client configuration and the Hadoop client jars (the launcher's class
/// path without the cluster and test jars).
struct FsShell {
    classpath: String,
    user: String,
}

impl FsShell {
    fn new(hdfs: &MiniHdfs) -> Res<FsShell> {
        let launcher = repo_root().join("tests/java/hdfs-launcher/target/classpath.txt");
        let jars = std::fs::read_to_string(&launcher)
            .map_err(|e| format!("{}: {e} (run scripts/setup-servers.sh)", launcher.display()))?;
        let client: Vec<&str> = jars
            .trim()
            .split(':')
            .filter(|j| {
                !["minicluster", "junit", "hamcrest"]
                    .iter()
                    .any(|n| j.contains(n))
            })
            .collect();
        Ok(FsShell {
            classpath: format!("{}:{}", hdfs.conf_dir().display(), client.join(":")),
            user: std::env::var("USER").unwrap_or_else(|_| "root".into()),
        })
    }

    fn run(&self, args: &[&str]) -> Res<Output> {
        let out = Command::new(super::servers::launcher::java())
            .args(["-Djava.net.preferIPv4Stack=true", "-cp", &self.classpath])
            .arg("org.apache.hadoop.fs.FsShell")
            .args(args)
            .env_remove("HADOOP_CONF_DIR")
            .env("HADOOP_USER_NAME", &self.user)
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "hdfs dfs {}: {}: {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .filter(|l| !l.starts_with("log4j:"))
                    .collect::<Vec<_>>()
                    .join(" / ")
            )
            .into());
        }
        Ok(out)
    }
}
