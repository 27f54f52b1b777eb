//! `stagefs mount --metrics ADDR`: a real daemon is scraped during a run and
//! each page is parsed by the Prometheus client's own text-format parser
//! (Python `prometheus_client.parser`, through tests/scrape_metrics.py;
//! scripts/setup.sh installs it). The values must move as the run does:
//! on a replicating mount, and on a publisher (`--publish file://…`) with
//! a reader host (`mount --from URL --metrics ADDR`) through an outage of
//! the storage.

mod common;

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use common::daemon::*;
use serde_json::{json, Value};

/// One parsed scrape.
struct Scrape {
    content_type: String,
    families: serde_json::Map<String, Value>,
    /// (sample name, labels, value).
    samples: Vec<(String, serde_json::Map<String, Value>, f64)>,
}

impl Scrape {
    /// The value of the sample `name` whose labels include `labels`.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).and_then(Value::as_str) == Some(*v))
            })
            .map(|(_, _, v)| *v)
    }

    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no sample {name}{labels:?} in the scrape"))
    }

    fn family_type(&self, name: &str) -> &str {
        self.families
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no family {name}"))
    }
}

fn scrape(url: &str) -> Scrape {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scrape_metrics.py");
    let out = Command::new("/usr/bin/python3")
        .arg(script)
        .arg(url)
        .output()
        .expect("run /usr/bin/python3 (scripts/setup.sh installs python3-prometheus-client)");
    assert!(
        out.status.success(),
        "scraping {url} failed (is python3-prometheus-client installed? scripts/setup.sh installs it):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("scraper JSON");
    Scrape {
        content_type: v["content_type"].as_str().unwrap_or("").to_owned(),
        families: v["families"].as_object().cloned().unwrap_or_default(),
        samples: v["samples"]
            .as_array()
            .expect("samples")
            .iter()
            .map(|s| {
                (
                    s[0].as_str().expect("sample name").to_owned(),
                    s[1].as_object().cloned().unwrap_or_default(),
                    s[2].as_f64().expect("sample value"),
                )
            })
            .collect(),
    }
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Polls scrapes until `pred` holds.
fn scrape_until(d: &Daemon, url: &str, what: &str, pred: impl Fn(&Scrape) -> bool) -> Scrape {
    scrape_until_or(url, what, pred, || d.diag())
}

/// Polls scrapes until `pred` holds; `diag` explains a timeout.
fn scrape_until_or(
    url: &str,
    what: &str,
    pred: impl Fn(&Scrape) -> bool,
    diag: impl Fn() -> String,
) -> Scrape {
    poll(
        what,
        WAIT,
        || {
            let s = scrape(url);
            pred(&s).then_some(s)
        },
        diag,
    )
}

const STALL_REASONS: [&str; 4] = ["failed", "rejected_event", "source_unreadable", "staging"];

#[test]
fn metrics_follow_commits_reads_and_a_rejected_event() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let args = DaemonArgs::under(dir.path())
        .arg("--metrics")
        .arg(&format!("127.0.0.1:{port}"));
    let w = EventWriter::new(&args);
    w.append(json!({"id": 1, "op": "create_database", "db": "default"}));
    w.append(
        json!({"id": 2, "op": "create_table", "db": "default", "table": "t", "partition_keys": []}),
    );
    let f1 = w.put_file("default/t/000000_0", b"one\n");
    w.append(json!({"id": 3, "op": "add_files", "db": "default", "table": "t", "files": [f1]}));
    let d = Daemon::start(args);
    d.wait_visible(3);

    let first = scrape_until(&d, &url, "visible 3 in metrics", |s| {
        s.get("stagefs_visible_state_id", &[]) == Some(3.0)
    });
    assert!(
        first.content_type.starts_with("text/plain; version=0.0.4"),
        "{}",
        first.content_type
    );
    assert_eq!(first.family_type("stagefs_commits"), "counter");
    assert_eq!(
        first.family_type("stagefs_commit_duration_seconds"),
        "histogram"
    );
    assert_eq!(
        first.family_type("stagefs_fuse_request_duration_seconds"),
        "histogram"
    );
    assert_eq!(first.family_type("stagefs_stalled"), "gauge");
    assert_eq!(first.value("stagefs_latest_state_id", &[]), 3.0);
    assert_eq!(first.value("stagefs_lag_events", &[]), 0.0);
    assert_eq!(first.value("stagefs_lag_seconds", &[]), 0.0);
    assert_eq!(first.value("stagefs_events_accepted_total", &[]), 3.0);
    assert_eq!(first.value("stagefs_events_rejected_total", &[]), 0.0);
    let commits = first.value("stagefs_commits_total", &[]);
    assert!(commits >= 1.0, "commits {commits}");
    assert_eq!(
        first.value("stagefs_commit_duration_seconds_count", &[]),
        commits,
        "every commit is timed"
    );
    assert_eq!(
        first.value("stagefs_fetches_total", &[("outcome", "source")]),
        1.0
    );
    assert_eq!(
        first.value("stagefs_fetches_total", &[("outcome", "cm")]),
        0.0
    );
    assert_eq!(first.value("stagefs_staged_bytes_total", &[]), 4.0);
    assert_eq!(first.value("stagefs_stored_blobs", &[]), 1.0);
    assert_eq!(first.value("stagefs_stored_bytes", &[]), 4.0);
    for r in STALL_REASONS {
        assert_eq!(first.value("stagefs_stalled", &[("reason", r)]), 0.0, "{r}");
    }
    let fuse_count = |s: &Scrape, op: &str| {
        s.value("stagefs_fuse_request_duration_seconds_count", &[("op", op)])
    };
    let reads_before = fuse_count(&first, "read");
    let lookups_before = fuse_count(&first, "lookup");

    // Reads through the mount are counted by operation.
    assert_eq!(
        std::fs::read(d.join("default/t/000000_0")).unwrap(),
        b"one\n"
    );
    let after_read = scrape(&url);
    assert!(
        fuse_count(&after_read, "read") > reads_before,
        "read requests {reads_before} -> {}",
        fuse_count(&after_read, "read")
    );
    assert!(fuse_count(&after_read, "lookup") > lookups_before);
    assert_eq!(
        after_read.value(
            "stagefs_fuse_request_duration_seconds_bucket",
            &[("op", "read"), ("le", "+Inf")]
        ),
        fuse_count(&after_read, "read")
    );

    // A `--private-mount` session's own connection counts while it lives.
    assert_eq!(after_read.value("stagefs_session_connections", &[]), 0.0);
    let mut session = std::process::Command::new(env!("CARGO_BIN_EXE_stagefs"))
        .args(["run", "--private-mount"])
        .arg(d.mnt())
        .args(["--", "sleep", "60"])
        .spawn()
        .expect("stagefs run");
    scrape_until(&d, &url, "a session connection", |s| {
        s.get("stagefs_session_connections", &[]) == Some(1.0)
    });
    let _ = session.kill();
    let _ = session.wait();
    scrape_until(&d, &url, "the connection ended", |s| {
        s.get("stagefs_session_connections", &[]) == Some(0.0)
    });

    // A new state: visible and commits move on.
    let f2 = w.put_file("default/t/000001_0", b"two\n");
    w.append(json!({"id": 4, "op": "add_files", "db": "default", "table": "t", "files": [f2]}));
    d.wait_visible(4);
    let second = scrape_until(&d, &url, "visible 4 in metrics", |s| {
        s.get("stagefs_visible_state_id", &[]) == Some(4.0)
    });
    let commits2 = second.value("stagefs_commits_total", &[]);
    assert!(commits2 > commits, "commits {commits} -> {commits2}");
    assert_eq!(
        second.value("stagefs_commit_duration_seconds_count", &[]),
        commits2
    );
    assert_eq!(second.value("stagefs_events_accepted_total", &[]), 4.0);
    assert_eq!(second.value("stagefs_stored_blobs", &[]), 2.0);

    // A bad event: stalled goes 1 on the rejected_event series only.
    w.append(json!({"id": 5, "op": "explode", "db": "default"}));
    let stalled = scrape_until(&d, &url, "stalled on the bad event", |s| {
        s.get("stagefs_stalled", &[("reason", "rejected_event")]) == Some(1.0)
    });
    assert_eq!(stalled.value("stagefs_events_rejected_total", &[]), 1.0);
    for r in STALL_REASONS.iter().filter(|r| **r != "rejected_event") {
        assert_eq!(
            stalled.value("stagefs_stalled", &[("reason", r)]),
            0.0,
            "{r}"
        );
    }
    assert_eq!(stalled.value("stagefs_visible_state_id", &[]), 4.0);
    let status = d.status();
    assert!(status["stalled"].is_object(), "status agrees: {status}");
}

#[test]
fn metrics_address_that_cannot_be_bound_exits_2_before_mounting() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    for addr in [taken_addr.as_str(), "no-port-here"] {
        let dir = tempfile::tempdir().unwrap();
        let args = DaemonArgs::under(dir.path()).arg("--metrics").arg(addr);
        let mut d = Daemon::spawn(args);
        let st = d
            .wait_exit(Duration::from_secs(10))
            .expect("stagefs exits on a bad --metrics address");
        assert_eq!(st.code(), Some(2), "{}", d.stderr());
        let err = d.stderr();
        assert!(err.contains("--metrics"), "{err}");
        assert!(err.contains(addr), "{err}");
        assert!(!mounted(d.mnt()), "nothing mounted");
    }
}

// ---------------------------------------------------------------------------
// Many hosts: a publisher and a reader host, both with --metrics.

const BIN: &str = env!("CARGO_BIN_EXE_stagefs");

/// The sum of a family's samples whose name is `name` (over its labels).
fn sum(s: &Scrape, name: &str) -> f64 {
    s.samples
        .iter()
        .filter(|(n, _, _)| n == name)
        .map(|(_, _, v)| *v)
        .sum()
}

fn pin(path: &std::path::Path, value: &str) {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let name = c"user.stagefs.pin";
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "pin {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

fn unpin(path: &std::path::Path) {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid NUL-terminated strings.
    let rc = unsafe { libc::removexattr(p.as_ptr(), c"user.stagefs.pin".as_ptr()) };
    assert_eq!(
        rc,
        0,
        "unpin {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

#[test]
fn publisher_and_reader_host_metrics_move_and_show_an_outage() {
    use stagefs::testkit::checker::DaemonProcess;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let published = root.join("published");
    let url = format!("file://{}", published.display());

    // The publisher: a replicating mount publishing to `url`.
    let pub_port = free_port();
    let pub_metrics = format!("http://127.0.0.1:{pub_port}/metrics");
    std::fs::create_dir_all(root.join("publisher")).unwrap();
    let args = DaemonArgs::under(&root.join("publisher"))
        .arg("--publish")
        .arg(&url)
        .arg("--gc-grace")
        .arg("1s")
        .arg("--metrics")
        .arg(&format!("127.0.0.1:{pub_port}"));
    let w = EventWriter::new(&args);
    w.append(json!({"id": 1, "op": "create_database", "db": "default"}));
    w.append(
        json!({"id": 2, "op": "create_table", "db": "default", "table": "t", "partition_keys": []}),
    );
    let f1 = w.put_file("default/t/000000_0", b"one\n");
    w.append(json!({"id": 3, "op": "add_files", "db": "default", "table": "t", "files": [f1]}));
    let publisher = Daemon::start(args);
    publisher.wait_visible(3);
    let p1 = scrape_until(&publisher, &pub_metrics, "state 3 published", |s| {
        s.get("stagefs_publish_state_id", &[]) == Some(3.0)
    });
    assert_eq!(p1.family_type("stagefs_publish_states"), "counter");
    assert_eq!(p1.family_type("stagefs_publish_failures"), "counter");
    let states1 = p1.value("stagefs_publish_states_total", &[]);
    assert!(states1 >= 1.0, "{states1}");
    assert!(p1.value("stagefs_publish_objects_written_total", &[]) >= 4.0);
    assert!(p1.value("stagefs_publish_bytes_written_total", &[]) > 4.0);
    assert!(p1.value("stagefs_publish_age_seconds", &[]) < 60.0);
    assert_eq!(p1.value("stagefs_publish_failing", &[]), 0.0);
    assert_eq!(sum(&p1, "stagefs_publish_failures_total"), 0.0);
    // The replication metrics are there too.
    assert_eq!(p1.value("stagefs_visible_state_id", &[]), 3.0);
    // `stagefs status` shows what is published.
    let out = Command::new(BIN)
        .arg("status")
        .arg(publisher.mnt())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["publish"]["url"], url.as_str(), "{status}");
    assert_eq!(status["publish"]["published"], 3, "{status}");
    assert_eq!(status["publish"]["failures"], 0, "{status}");
    assert!(status["publish"]["age_ms"].as_i64().is_some(), "{status}");

    // A reader host on the URL.
    let host = root.join("host");
    let mnt = host.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let read_port = free_port();
    let read_metrics = format!("http://127.0.0.1:{read_port}/metrics");
    let cache = host.join("cache");
    let reader_args: Vec<std::ffi::OsString> = vec![
        "--from".into(),
        url.clone().into(),
        "--cache".into(),
        cache.into_os_string(),
        "--poll-ms".into(),
        "100".into(),
        "--metrics".into(),
        format!("127.0.0.1:{read_port}").into(),
    ];
    let reader = DaemonProcess::start(
        std::path::Path::new(BIN),
        &mnt,
        &reader_args
            .iter()
            .map(std::ffi::OsString::as_os_str)
            .collect::<Vec<_>>(),
        &host.join("reader.log"),
        Duration::from_secs(20),
    )
    .expect("the reader host mounts");
    let diag = || format!("{}\n{}", reader.log(), publisher.diag());
    let r1 = scrape_until_or(
        &read_metrics,
        "the reader host at 3",
        |s| s.get("stagefs_visible_state_id", &[]) == Some(3.0),
        diag,
    );
    assert_eq!(r1.family_type("stagefs_head_age_seconds"), "gauge");
    assert_eq!(r1.family_type("stagefs_cache_fetch_failures"), "counter");
    assert!(r1.value("stagefs_head_age_seconds", &[]) < 60.0);
    assert!(r1.value("stagefs_head_read_age_seconds", &[]) < 60.0);
    assert_eq!(r1.value("stagefs_behind_states", &[]), 0.0);
    assert_eq!(r1.value("stagefs_latest_state_id", &[]), 3.0);
    assert!(r1.value("stagefs_head_polls_total", &[]) >= 1.0);
    assert!(r1.value("stagefs_catalog_fetches_total", &[]) >= 4.0);
    assert!(r1.value("stagefs_catalog_fetched_bytes_total", &[]) > 0.0);
    assert_eq!(
        r1.value("stagefs_cache_limit_bytes", &[]),
        10.0 * (1u64 << 30) as f64
    );
    assert_eq!(sum(&r1, "stagefs_stalled"), 0.0);
    assert_eq!(r1.value("stagefs_cache_unreachable", &[]), 0.0);
    let fetched0 = r1.value("stagefs_cache_fetched_bytes_total", &[]);

    // A read fetches the file's bytes, and the FUSE request is counted.
    let lookups0 = r1.value(
        "stagefs_fuse_request_duration_seconds_count",
        &[("op", "lookup")],
    );
    assert_eq!(
        std::fs::read(mnt.join("default/t/000000_0")).unwrap(),
        b"one\n"
    );
    let r2 = scrape(&read_metrics);
    assert_eq!(
        r2.value("stagefs_cache_fetched_bytes_total", &[]),
        fetched0 + 4.0
    );
    assert!(r2.value("stagefs_cache_fetches_total", &[]) >= 1.0);
    assert!(r2.value("stagefs_cache_bytes", &[]) >= 4.0);
    assert!(
        r2.value(
            "stagefs_fuse_request_duration_seconds_count",
            &[("op", "lookup")]
        ) > lookups0
    );

    // A pin on the reader host leases its state; the publisher's
    // collection sees the lease.
    pin(&mnt.join("default/t"), "visible");
    scrape_until_or(
        &read_metrics,
        "the pin's lease held",
        |s| s.get("stagefs_leases_held", &[]) == Some(1.0),
        diag,
    );
    assert_eq!(scrape(&read_metrics).value("stagefs_pins", &[]), 1.0);
    let p2 = scrape_until(
        &publisher,
        &pub_metrics,
        "the lease seen by a GC run",
        |s| s.get("stagefs_publish_leases_live", &[]) == Some(1.0),
    );
    assert!(p2.value("stagefs_publish_gc_runs_total", &[]) >= 1.0);
    unpin(&mnt.join("default/t"));
    scrape_until_or(
        &read_metrics,
        "the pin's lease released",
        |s| s.get("stagefs_leases_held", &[]) == Some(0.0),
        diag,
    );

    // A new state: published, then followed.
    let f2 = w.put_file("default/t/000001_0", b"two\n");
    w.append(json!({"id": 4, "op": "add_files", "db": "default", "table": "t", "files": [f2]}));
    let p3 = scrape_until(&publisher, &pub_metrics, "state 4 published", |s| {
        s.get("stagefs_publish_state_id", &[]) == Some(4.0)
    });
    assert!(p3.value("stagefs_publish_states_total", &[]) > states1);
    scrape_until_or(
        &read_metrics,
        "the reader host at 4",
        |s| s.get("stagefs_visible_state_id", &[]) == Some(4.0),
        diag,
    );

    // The storage goes away (a file where its folder was): the reader
    // host stalls, says why, and a read of bytes it lacks fails; the
    // publisher fails to publish the next state.
    std::fs::rename(&published, root.join("away")).unwrap();
    std::fs::write(&published, b"not a folder").unwrap();
    let stalled = scrape_until_or(
        &read_metrics,
        "the reader host stalled",
        |s| sum(s, "stagefs_stalled") == 1.0,
        diag,
    );
    assert!(stalled.value("stagefs_head_poll_failures_total", &[]) >= 1.0);
    assert!(sum(&stalled, "stagefs_stalls_total") >= 1.0);
    assert_eq!(stalled.value("stagefs_visible_state_id", &[]), 4.0);
    // Through the snapshot: this process's own view may still be an
    // older state (SPEC §3.8), where the file does not exist yet.
    let eio = std::fs::read(mnt.join(".stagefs/snapshots/4/default/t/000001_0")).unwrap_err();
    assert_eq!(eio.raw_os_error(), Some(libc::EIO), "{eio}");
    let failed = scrape(&read_metrics);
    assert!(sum(&failed, "stagefs_cache_fetch_failures_total") >= 1.0);
    assert_eq!(failed.value("stagefs_cache_unreachable", &[]), 1.0);
    let f3 = w.put_file("default/t/000002_0", b"three\n");
    w.append(json!({"id": 5, "op": "add_files", "db": "default", "table": "t", "files": [f3]}));
    publisher.wait_visible(5);
    let failing = scrape_until(&publisher, &pub_metrics, "publishing fails", |s| {
        s.get("stagefs_publish_failing", &[]) == Some(1.0)
    });
    assert!(sum(&failing, "stagefs_publish_failures_total") >= 1.0);
    assert_eq!(failing.value("stagefs_publish_state_id", &[]), 4.0);
    let s = publisher.status();
    assert!(s["publish"]["error"].is_string(), "{s}");

    // Back: published and followed again, nothing stalled.
    std::fs::remove_file(&published).unwrap();
    std::fs::rename(root.join("away"), &published).unwrap();
    let p4 = scrape_until(&publisher, &pub_metrics, "state 5 published", |s| {
        s.get("stagefs_publish_state_id", &[]) == Some(5.0)
    });
    assert_eq!(p4.value("stagefs_publish_failing", &[]), 0.0);
    let r4 = scrape_until_or(
        &read_metrics,
        "the reader host at 5",
        |s| s.get("stagefs_visible_state_id", &[]) == Some(5.0),
        diag,
    );
    assert_eq!(sum(&r4, "stagefs_stalled"), 0.0);
    assert_eq!(r4.value("stagefs_behind_states", &[]), 0.0);
    assert_eq!(
        std::fs::read(mnt.join(".stagefs/snapshots/5/default/t/000001_0")).unwrap(),
        b"two\n"
    );
    assert_eq!(
        scrape(&read_metrics).value("stagefs_cache_unreachable", &[]),
        0.0
    );
    drop(reader);
}

#[test]
fn replicate_serves_metrics_without_a_mount() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let args = DaemonArgs::under(&root);
    let w = EventWriter::new(&args);
    w.append(json!({"id": 1, "op": "create_database", "db": "default"}));
    w.append(
        json!({"id": 2, "op": "create_table", "db": "default", "table": "t", "partition_keys": []}),
    );
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let log = root.join("replicate.log");
    let mut child = Command::new(BIN)
        .arg("replicate")
        .arg("--state")
        .arg(root.join("state"))
        .arg("--source-root")
        .arg(root.join("source"))
        .arg("--events")
        .arg(root.join("events"))
        .arg("--metrics")
        .arg(format!("127.0.0.1:{port}"))
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let diag = || std::fs::read_to_string(&log).unwrap_or_default();
    let s = scrape_until_or(
        &url,
        "replicate at 2",
        |s| s.get("stagefs_visible_state_id", &[]) == Some(2.0),
        diag,
    );
    assert_eq!(s.value("stagefs_events_accepted_total", &[]), 2.0);
    // No mount: no FUSE or view metrics; no --publish: no publisher's.
    assert!(!s
        .families
        .contains_key("stagefs_fuse_request_duration_seconds"));
    assert!(!s.families.contains_key("stagefs_reader_views"));
    assert!(!s.families.contains_key("stagefs_publish_states"));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    assert!(st.success(), "{st:?}\n{}", diag());
}
