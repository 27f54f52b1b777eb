//! Running stagefs like a service (issue 32): quiet logs for ordinary
//! readers, JSON logs for machines, the config file, `stagefs check`, the
//! systemd readiness message and the fstab mount helper. Each test has its
//! own temp dir; every mount is removed by the harness even on panic.

mod common;

use std::path::Path;
use std::process::Command;

use common::daemon::*;
use serde_json::Value;
use stagefs::workload::write_seed_example;

fn seeded(dir: &Path) -> DaemonArgs {
    let args = DaemonArgs::under(dir);
    write_seed_example(args.mnt.parent().unwrap()).unwrap();
    args
}

/// Opens and reads every table file under the mount with Python's `open()`,
/// which probes each file with `isatty` (ioctl TCGETS) first.
fn python_reads_every_file(mnt: &Path) {
    let script = "import os, sys\n\
                  n = 0\n\
                  for root, dirs, files in os.walk(os.path.join(sys.argv[1], 'default')):\n\
                  \x20   for f in files:\n\
                  \x20       with open(os.path.join(root, f)) as fh:\n\
                  \x20           fh.read()\n\
                  \x20       n += 1\n\
                  assert n > 0, 'no files read'\n";
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(mnt)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "python3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn python_open_writes_no_warning_to_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(seeded(dir.path()));
    d.wait_visible(50);
    python_reads_every_file(d.mnt());
    assert!(d.sigterm().success());
    let log = d.stderr();
    assert!(log.contains("mounted"), "no log at all?\n{log}");
    for line in log.lines() {
        assert!(
            !line.contains("WARN") && !line.contains("ERROR"),
            "a warning for an ordinary read: {line}\n{log}"
        );
        assert!(!line.contains('\x1b'), "colour in a log file: {line:?}");
    }
}

#[test]
fn json_log_lines_parse_and_carry_the_text_fields() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(seeded(dir.path()).arg("--log-format").arg("json"));
    d.wait_visible(50);
    python_reads_every_file(d.mnt());
    assert!(d.sigterm().success());
    let log = d.stderr();
    let mut messages = Vec::new();
    for line in log.lines() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line:?}"));
        assert!(v["timestamp"].is_string(), "no timestamp: {line}");
        let level = v["level"].as_str().expect("a level");
        assert!(
            ["INFO", "DEBUG", "TRACE"].contains(&level),
            "level {level} for an ordinary run: {line}"
        );
        let message = v["fields"]["message"].as_str().expect("a message");
        messages.push(message.to_owned());
    }
    assert!(
        messages.iter().any(|m| m == "mounted"),
        "no `mounted` line: {messages:?}"
    );
    // The same fields as the text form: the mountpoint of `mounted`.
    let mounted: Value = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["fields"]["message"] == "mounted")
        .unwrap();
    assert_eq!(
        mounted["fields"]["mountpoint"].as_str(),
        Some(d.mnt().to_str().unwrap())
    );
}

#[test]
fn an_unknown_log_format_is_a_usage_error() {
    let out = stagefs()
        .args(["--log-format", "xml", "status", "--state", "/nonexistent"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("xml"));
}
