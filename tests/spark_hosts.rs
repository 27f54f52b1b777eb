//! A real Spark job across reader hosts reads one source state (SPEC §3
//! rule 10, §8; issue 30), with real processes:
//!
//! - a publisher (`stagefs replicate --publish file://…`) of two tables,
//!   `wh.facts` (partitions p=a..f) and `wh.dims` (d=x..z), whose files a
//!   writer keeps overwriting under the same names while the jobs run;
//! - three reader hosts, each `stagefs mount --from URL` in a mount
//!   namespace of its own at the same path with its own cache
//!   (`tests/common/hosts.rs`);
//! - a Spark standalone master, and one worker inside host 1 and one
//!   inside host 2, so each executor reads through its host's mount;
//! - the driver on host 0, started with `stagefs run` (which sets
//!   `STAGEFS_STATE_ID` and leases its state at the URL), passing
//!   `spark.executorEnv.STAGEFS_STATE_ID` to the executors.
//!
//! Each job's queries join the two tables (`tests/data/spark_hosts_job.py`);
//! every result must equal the join of the source's tables at the
//! session's state, computed here from the writer's history and the
//! variants' rows. The negative control runs the same job without
//! `spark.executorEnv.STAGEFS_STATE_ID`: the executors then read the state
//! their own host shows, and at least one run must fail or give a wrong
//! result, or this test could not tell the defect.
//!
//! Needs root (mount namespaces), pyspark and pyarrow
//! (`scripts/setup-readers.sh`) and Java 17 on PATH; a missing one fails
//! the test with what to run. Default: 2 jobs of 3 queries and up to 3
//! negative runs (it stops at the first that goes wrong);
//! `STAGEFS_LONG_TESTS=1`: 6 jobs of 10 queries and 10 negative runs.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stagefs::event::StateId;

use common::daemon::{DaemonArgs, EventWriter, StopOnDrop};
use common::hosts::{Host, NsHost, Source};
use common::{drain, require, tail};

const JOB: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/spark_hosts_job.py");

const FACT_PARTS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
const DIM_PARTS: [&str; 3] = ["x", "y", "z"];
/// The event that completes the first layout (events 1-3 create the
/// database and the tables, 4-12 write every partition once).
const FIRST_FULL: u64 = 12;
/// One overwrite every so often while the jobs run.
const EVERY: Duration = Duration::from_millis(80);
/// A job (JVM starts included) on a loaded 2-core machine.
const JOB_TIMEOUT: Duration = Duration::from_secs(600);

fn long() -> bool {
    std::env::var("STAGEFS_LONG_TESTS").is_ok_and(|v| v == "1")
}

/// The Parquet variants of both tables and their rows, made by the job
/// script with pyarrow.
struct Variants {
    facts: Vec<Vec<u8>>,
    dims: Vec<Vec<u8>>,
    /// `(key, v)` of each facts variant.
    facts_rows: Vec<Vec<(i64, i64)>>,
    /// `(key, w)` of each dims variant.
    dims_rows: Vec<Vec<(i64, i64)>>,
}

impl Variants {
    fn make(dir: &Path) -> Variants {
        let out = Command::new("python3")
            .arg(JOB)
            .arg("make")
            .arg(dir)
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "making the Parquet variants: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows: Value =
            serde_json::from_slice(&fs::read(dir.join("rows.json")).unwrap()).expect("rows.json");
        let parse = |name: &str| -> Vec<Vec<(i64, i64)>> {
            rows[name]
                .as_array()
                .unwrap()
                .iter()
                .map(|variant| {
                    variant
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|r| (r[0].as_i64().unwrap(), r[1].as_i64().unwrap()))
                        .collect()
                })
                .collect()
        };
        let (facts_rows, dims_rows) = (parse("facts"), parse("dims"));
        let read = |name: &str, n: usize| -> Vec<Vec<u8>> {
            (0..n)
                .map(|k| fs::read(dir.join(format!("{name}-{k}.parquet"))).unwrap())
                .collect()
        };
        Variants {
            facts: read("facts", facts_rows.len()),
            dims: read("dims", dims_rows.len()),
            facts_rows,
            dims_rows,
        }
    }

    /// The query's result on a layout: per (p, d), count(*) and
    /// sum(v * w) of the join on key; groups without a match are absent.
    fn join(&self, layout: &Layout) -> Vec<(String, String, i64, i64)> {
        let mut out = Vec::new();
        for (p, &k) in FACT_PARTS.iter().zip(&layout.facts) {
            for (d, &j) in DIM_PARTS.iter().zip(&layout.dims) {
                let (mut count, mut sum) = (0, 0);
                for &(key, v) in &self.facts_rows[k] {
                    for &(key2, w) in &self.dims_rows[j] {
                        if key == key2 {
                            count += 1;
                            sum += v * w;
                        }
                    }
                }
                if count > 0 {
                    out.push((p.to_string(), d.to_string(), count, sum));
                }
            }
        }
        out.sort();
        out
    }
}

/// Which variant each partition holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    facts: [usize; 6],
    dims: [usize; 3],
}

/// The source side: both tables, their overwrites and their history
/// (the layout after every event from [`FIRST_FULL`] on; the state-id of
/// a native event is its id).
struct Tables {
    w: EventWriter,
    v: Arc<Variants>,
    layout: Layout,
    history: Arc<Mutex<BTreeMap<u64, Layout>>>,
}

impl Tables {
    fn new(args: &DaemonArgs, v: Arc<Variants>) -> Tables {
        let w = EventWriter::new(args);
        w.append(json!({"id": 1, "op": "create_database", "db": "wh"}));
        w.append(json!({"id": 2, "op": "create_table", "db": "wh", "table": "facts", "partition_keys": ["p"]}));
        w.append(json!({"id": 3, "op": "create_table", "db": "wh", "table": "dims", "partition_keys": ["d"]}));
        let mut t = Tables {
            w,
            v,
            layout: Layout {
                facts: [usize::MAX; 6],
                dims: [usize::MAX; 3],
            },
            history: Arc::new(Mutex::new(BTreeMap::new())),
        };
        for e in 4..=FIRST_FULL {
            t.write(e);
        }
        t
    }

    /// Event `e`: INSERT OVERWRITE of one partition, same file name. Of
    /// every three events two overwrite a facts partition, one a dims
    /// partition; the variant follows from `e`.
    fn write(&mut self, e: u64) {
        let (table, key, part, slot, files) = if e % 3 == 0 {
            let i = (e / 3 % 3) as usize;
            let k = (e as usize * 7) % self.v.dims.len();
            (
                "dims",
                "d",
                DIM_PARTS[i],
                &mut self.layout.dims[i],
                (k, &self.v.dims),
            )
        } else {
            let i = ((e - e / 3) % 6) as usize;
            let k = (e as usize * 11) % self.v.facts.len();
            (
                "facts",
                "p",
                FACT_PARTS[i],
                &mut self.layout.facts[i],
                (k, &self.v.facts),
            )
        };
        let (k, bytes) = files;
        let rel = format!("wh/{table}/{key}={part}/000000_0");
        if *slot != usize::MAX {
            self.w.retire(&rel, &bytes[*slot]);
        }
        let file = self.w.put_file(&rel, &bytes[k]);
        *slot = k;
        self.w.append(json!({
            "id": e, "op": "replace_files", "db": "wh", "table": table,
            "partition": {key: part}, "files": [file],
        }));
        if e >= FIRST_FULL {
            self.history.lock().unwrap().insert(e, self.layout.clone());
        }
    }
}

/// The layout at state `state`: after the newest event up to it.
fn layout_at(history: &Mutex<BTreeMap<u64, Layout>>, state: u64) -> Option<Layout> {
    history
        .lock()
        .unwrap()
        .range(..=state)
        .next_back()
        .map(|(_, l)| l.clone())
}

/// A Spark process (and everything it starts) in a process group of its
/// own: killed as a group when dropped, so no JVM outlives the test.
struct Group {
    child: Child,
    log: PathBuf,
}

impl Group {
    fn spawn(mut cmd: Command, log: PathBuf) -> Group {
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn");
        Group { child, log }
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling the process group this test created.
        unsafe { libc::kill(-(self.child.id() as i32), sig) };
    }

    /// SIGKILL to the group: the process and every JVM it started (a
    /// worker's executors are in its group).
    fn stop(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.stop();
    }
}

fn spark_class() -> PathBuf {
    let out = Command::new("python3")
        .args([
            "-c",
            "import os, pyspark; print(os.path.dirname(pyspark.__file__))",
        ])
        .output()
        .expect("python3");
    assert!(out.status.success(), "pyspark: {out:?}");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join("bin/spark-class")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for(what: &str, timeout: Duration, diag: &dyn Fn() -> String, f: &dyn Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "{what}\n{}", diag());
        thread::sleep(Duration::from_millis(200));
    }
}

/// One driver run's queries.
struct JobRun {
    state: Option<u64>,
    lines: Vec<Value>,
    stderr: String,
}

/// Runs the driver on `host` under `stagefs run`; its output lines.
fn run_job(host: &NsHost, dir: &Path, master: &str, queries: u32, executor_env: bool) -> JobRun {
    let mut cmd = host.command(common::daemon::BIN);
    cmd.arg("run")
        .arg(&host.mnt)
        .args(["--", "python3", JOB, "job", master])
        .arg(&host.mnt)
        .arg(queries.to_string())
        .args(if executor_env {
            &[][..]
        } else {
            &["--no-executor-env"][..]
        })
        .env("SPARK_LOCAL_DIRS", dir.join("driver-local"))
        .env("STAGEFS_LOG", "warn")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("stagefs run");
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + JOB_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            // SAFETY: the driver's own process group.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            let err = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
            panic!("the job exceeded {JOB_TIMEOUT:?}:\n{}", tail(&err, 4000));
        }
        thread::sleep(Duration::from_millis(100));
    };
    // SAFETY: as above; the driver's JVM, should it linger.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let stdout = String::from_utf8_lossy(&out.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
    let lines: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        status.success() && lines.len() == queries as usize,
        "the job ended with {status} after {} of {queries} queries:\n{}",
        lines.len(),
        tail(&stderr, 4000)
    );
    let states: Vec<u64> = lines.iter().filter_map(|l| l["state"].as_u64()).collect();
    assert!(
        states.windows(2).all(|w| w[0] == w[1]),
        "one job, several session states: {states:?}"
    );
    JobRun {
        state: states.first().copied(),
        lines,
        stderr,
    }
}

fn head(s: &str, n: usize) -> &str {
    let mut end = s.len().min(n);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// How a query went against the source at the job's state.
#[derive(Debug, PartialEq)]
enum Outcome {
    Correct,
    Wrong(String),
    Failed(String),
}

fn judge(line: &Value, v: &Variants, history: &Mutex<BTreeMap<u64, Layout>>) -> Outcome {
    if let Some(why) = line["failed"].as_str() {
        return Outcome::Failed(why.to_owned());
    }
    let state = line["state"].as_u64().expect("state");
    let layout = layout_at(history, state)
        .unwrap_or_else(|| panic!("state {state} is not one the writer made"));
    let want = v.join(&layout);
    let got: Vec<(String, String, i64, i64)> = line["result"]
        .as_array()
        .expect("result")
        .iter()
        .map(|r| {
            (
                r[0].as_str().unwrap().to_owned(),
                r[1].as_str().unwrap().to_owned(),
                r[2].as_i64().unwrap(),
                r[3].as_i64().unwrap(),
            )
        })
        .collect();
    if got == want {
        Outcome::Correct
    } else {
        Outcome::Wrong(format!(
            "at {state} ({layout:?}): got {got:?}, want {want:?}"
        ))
    }
}

#[test]
fn a_spark_job_across_three_hosts_reads_the_drivers_state() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mount namespaces (unshare, nsenter) need root");
        return;
    }
    require(&["pyspark", "pyarrow"], true);
    let (jobs, queries, negative_runs) = if long() { (6, 10, 10) } else { (2, 3, 3) };
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let v = Arc::new(Variants::make(&root.join("variants")));

    // The source and its publisher.
    fs::create_dir_all(root.join("source")).unwrap();
    let args = DaemonArgs::under(&root.join("source"));
    let mut tables = Tables::new(&args, Arc::clone(&v));
    let history = Arc::clone(&tables.history);
    let url = format!("file://{}", root.join("published").display());
    let mut publisher = Host::new(&root.join("publisher")).replicate_source(
        &Source {
            source_root: args.source_root.clone(),
            events: args.events.clone(),
            cm_root: args.cm_root.clone().unwrap(),
        },
        &url,
        &["--retain", "3", "--gc-grace", "2s"],
        &[],
    );

    // Three reader hosts, one mountpoint path.
    let mnt = root.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let hosts: Vec<NsHost> = (0..3)
        .map(|i| NsHost::start(&root.join(format!("host{i}")), &mnt, &url))
        .collect();
    for h in &hosts {
        h.wait_visible(StateId(FIRST_FULL));
    }

    // Spark standalone: the master on this host, a worker in hosts 1, 2.
    let spark_class = spark_class();
    let port = free_port();
    let master_url = format!("spark://127.0.0.1:{port}");
    let mut master_cmd = Command::new(&spark_class);
    master_cmd
        .args([
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
        ])
        .args(["--port", &port.to_string(), "--webui-port", "0"])
        .env("SPARK_DAEMON_MEMORY", "256m")
        .env("SPARK_MASTER_OPTS", "-Dspark.master.rest.enabled=false");
    let master = Group::spawn(master_cmd, root.join("master.log"));
    let workers: Vec<Group> = hosts[1..]
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host_dir = root.join(format!("host{}", i + 1));
            let mut cmd = h.command(spark_class.to_str().unwrap());
            cmd.args([
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
            ])
            .args(["--cores", "1", "--memory", "768m", "--webui-port", "0"])
            .arg("--work-dir")
            .arg(host_dir.join("work"))
            .arg(&master_url)
            .env("SPARK_DAEMON_MEMORY", "256m")
            .env("SPARK_LOCAL_DIRS", host_dir.join("local"));
            Group::spawn(cmd, host_dir.join("worker.log"))
        })
        .collect();
    wait_for(
        "two workers registered with the master",
        Duration::from_secs(180),
        &|| master.log(),
        &|| master.log().matches("Registering worker").count() >= 2,
    );

    // The source keeps changing from here on.
    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_panic = StopOnDrop(Arc::clone(&stop));
    let writer = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let mut e = FIRST_FULL + 1;
            while !stop.load(Ordering::Relaxed) {
                tables.write(e);
                e += 1;
                thread::sleep(EVERY);
            }
            e - 1
        })
    };

    // Jobs start while the tables change, not on the first layout.
    wait_for(
        "host 0 following the writer",
        Duration::from_secs(60),
        &|| format!("{:?}\n{}", hosts[0].status(), publisher.stderr()),
        &|| {
            hosts[0]
                .status()
                .and_then(|s| s["visible"].as_u64())
                .is_some_and(|v| v > FIRST_FULL + 10)
        },
    );
    let diag = |run: &JobRun| {
        format!(
            "{}\nworker logs:\n{}\n{}",
            tail(&run.stderr, 3000),
            tail(&workers[0].log(), 1500),
            tail(&workers[1].log(), 1500)
        )
    };
    // The jobs, with the executors told the driver's state.
    let (mut correct, mut total) = (0, 0);
    let mut job_states = Vec::new();
    for job in 0..jobs {
        let t = Instant::now();
        let run = run_job(&hosts[0], &root, &master_url, queries, true);
        let state = run.state.expect("a state");
        for line in &run.lines {
            total += 1;
            match judge(line, &v, &history) {
                Outcome::Correct => correct += 1,
                bad => panic!(
                    "job {job}, query {}: {bad:?} (session state {state})\n{}",
                    line["q"],
                    diag(&run)
                ),
            }
        }
        // The source moved on during the job: executors that read what
        // their host shows would have read another state.
        let shown: Vec<u64> = hosts[1..]
            .iter()
            .map(|h| h.status().and_then(|s| s["visible"].as_u64()).unwrap_or(0))
            .collect();
        assert!(
            shown.iter().all(|&s| s > state),
            "job {job} at {state}: the worker hosts show {shown:?}, the source did not move on"
        );
        eprintln!(
            "job {job}: {queries} queries at state {state}, all equal to the source's join (worker hosts now show {shown:?}) in {:.1?}",
            t.elapsed()
        );
        job_states.push(state);
    }
    // The executors read through hosts 1 and 2.
    for (i, h) in hosts.iter().enumerate().skip(1) {
        let s = h.status().expect("status");
        assert!(
            s["cache"]["fetched"].as_u64().unwrap_or(0) > 0,
            "host {i} fetched nothing: its executor did not read through it: {s}"
        );
    }

    // The negative control: no spark.executorEnv.STAGEFS_STATE_ID.
    let (mut bad_runs, mut runs, mut first_bad) = (0, 0, None);
    for _ in 0..negative_runs {
        let run = run_job(&hosts[0], &root, &master_url, queries, false);
        runs += 1;
        let outcomes: Vec<Outcome> = run.lines.iter().map(|l| judge(l, &v, &history)).collect();
        let bad: Vec<&Outcome> = outcomes
            .iter()
            .filter(|o| **o != Outcome::Correct)
            .collect();
        let failed = bad
            .iter()
            .filter(|o| matches!(o, Outcome::Failed(_)))
            .count();
        eprintln!(
            "negative run {runs}: {} of {queries} queries went wrong ({failed} failed, {} wrong results) at session state {:?}",
            bad.len(),
            bad.len() - failed,
            run.state
        );
        if let Some(b) = bad.first() {
            bad_runs += 1;
            first_bad.get_or_insert_with(|| format!("{b:?}"));
            if !long() {
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().expect("writer");
    assert!(
        bad_runs > 0,
        "{runs} runs without spark.executorEnv.STAGEFS_STATE_ID all read the driver's state: the test cannot tell the defect"
    );
    eprintln!(
        "spark across 3 hosts: {correct}/{total} queries correct over {jobs} jobs at states {job_states:?}; \
         without executorEnv {bad_runs}/{runs} runs went wrong (first: {}); source wrote up to {written}; {:.1?} in all",
        first_bad.as_deref().map_or("", |s| head(s, 300)),
        started.elapsed()
    );
    drop(workers);
    drop(master);
    assert!(publisher.sigterm().success(), "{}", publisher.stderr());
}
