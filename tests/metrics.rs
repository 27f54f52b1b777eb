//! `stagefs mount --metrics ADDR`: a real daemon is scraped during a run and
//! each page is parsed by the Prometheus client's own text-format parser
//! (Python `prometheus_client.parser`, through tests/scrape_metrics.py;
//! scripts/setup.sh installs it). The values must move as the run does.

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
    poll(
        what,
        WAIT,
        || {
            let s = scrape(url);
            pred(&s).then_some(s)
        },
        || d.diag(),
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
