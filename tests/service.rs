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
    // The reads' log, before the shutdown's own lines.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let log = d.stderr();
    assert!(d.sigterm().success());
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
    std::thread::sleep(std::time::Duration::from_millis(200));
    let log = d.stderr();
    assert!(d.sigterm().success());
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

/// The mount's options as a config file (native source).
fn config_file(args: &DaemonArgs, mountpoint: &Path) -> String {
    format!(
        "# test config\nmountpoint = {:?}\nstate = {:?}\nsource-root = {:?}\nevents = {:?}\ncm-root = {:?}\nretain = 4\nlog-format = \"json\"\n",
        mountpoint,
        args.state,
        args.source_root,
        args.events,
        args.cm_root.as_ref().unwrap()
    )
}

/// A `stagefs` process started by hand: SIGKILLed on drop (the mount is
/// detached by the [`common::MountGuard`] next to it).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_mount_runs_from_a_config_file_and_flags_override_it() {
    let dir = tempfile::tempdir().unwrap();
    let args = seeded(dir.path());
    let conf = dir.path().join("stagefs.toml");
    // The file names a mountpoint that does not exist; the flag wins.
    std::fs::write(&conf, config_file(&args, &dir.path().join("nowhere"))).unwrap();
    let log = dir.path().join("stderr.log");
    let _guard = common::MountGuard(args.mnt.clone());
    let mut child = Child(
        stagefs()
            .arg("mount")
            .arg(&args.mnt)
            .arg("--config")
            .arg(&conf)
            .stdin(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    // Wait by the state folder's status, not through the mount: a process
    // that reads the mount early keeps seeing that state (SPEC, readers).
    let status = args.state.join("status.json");
    poll(
        "state 50 visible",
        WAIT,
        || {
            let v: Value = serde_json::from_slice(&std::fs::read(&status).ok()?).ok()?;
            (visible(&v) == 50).then_some(())
        },
        || std::fs::read_to_string(&log).unwrap_or_default(),
    );
    assert!(mounted(&args.mnt), "not mounted at the flag's mountpoint");
    let table = args.mnt.join("default/blah");
    assert!(
        std::fs::read_dir(&table).unwrap().next().is_some(),
        "the seed's table is empty"
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    assert!(child.0.wait().unwrap().success());
    // log-format came from the file: every line is JSON.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.is_empty());
    for line in text.lines() {
        serde_json::from_str::<Value>(line)
            .unwrap_or_else(|e| panic!("log-format from the file not used ({e}): {line}"));
    }
}

#[test]
fn an_unknown_config_key_names_the_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("stagefs.toml");
    std::fs::write(&conf, "state = \"/tmp/x\"\n\nsource_root = \"/tmp/y\"\n").unwrap();
    let out = stagefs()
        .args(["replicate", "--config"])
        .arg(&conf)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 3") && err.contains("`source_root`"),
        "{err}"
    );
}

/// systemd `Type=notify`: `READY=1` arrives on $NOTIFY_SOCKET only once the
/// mount answers, and `STOPPING=1` on SIGTERM.
#[test]
fn systemd_hears_ready_once_mounted_and_stopping_on_sigterm() {
    use std::os::unix::net::UnixDatagram;
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let args = seeded(dir.path()).env("NOTIFY_SOCKET", sock_path.to_str().unwrap());
    let mut d = Daemon::spawn(args);
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).expect("READY=1 within the deadline");
    let ready = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    // Ready means mounted: the root answers now, without waiting.
    assert!(mounted(d.mnt()), "READY=1 before the mount: {ready:?}");
    std::fs::read_dir(d.mnt()).expect("the mount answers at READY=1");
    assert!(d.sigterm().success());
    let n = sock.recv(&mut buf).expect("STOPPING=1 on SIGTERM");
    assert_eq!(&buf[..n], b"STOPPING=1");
}

#[test]
fn completions_are_produced_for_bash_zsh_and_fish() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef stagefs"),
        ("fish", "complete -c stagefs"),
    ] {
        let out = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains(marker), "{shell} script lacks {marker:?}");
        // The script knows every subcommand and a long flag of `mount`.
        let cli = <stagefs::cli::Cli as clap::CommandFactory>::command();
        for sub in cli.get_subcommands() {
            assert!(
                text.contains(sub.get_name()),
                "{shell}: no {}",
                sub.get_name()
            );
        }
        assert!(text.contains("source-map"), "{shell}: no --source-map");
    }
    let out = Command::new(BIN)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "an unknown shell is refused");
}

#[test]
fn the_man_page_names_every_subcommand() {
    let out = Command::new(BIN).arg("manpage").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(
        page.starts_with(".ie") || page.contains(".TH stagefs"),
        "not roff:\n{page}"
    );
    let cli = <stagefs::cli::Cli as clap::CommandFactory>::command();
    let names: Vec<String> = cli
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    assert!(names.len() >= 8, "{names:?}");
    for name in &names {
        assert!(
            page.contains(&format!("stagefs\\-{name}")),
            "the man page does not name `{name}`"
        );
    }
    // Each option of `mount` is documented.
    assert!(page.contains("\\-\\-source\\-map"), "no --source-map");
    assert!(page.contains("\\-\\-allow\\-other"), "no --allow-other");
}
