//! `stagefs check`: a good mount setup (a private PostgreSQL metastore, a
//! mapped source folder, an empty mountpoint) passes every check and exits
//! 0, changing nothing; each check, made to fail on its own, is named
//! `FAIL <check>` with a fix while the others stay ok, and the exit status
//! is 1.

#[path = "common/dbserver.rs"]
mod dbserver;

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dbserver::{DbServer, Kind, TableCase, PASSWORD};

/// A good setup's folders: state (not made yet), mountpoint, source map.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::Builder::new()
            .prefix("stagefs-check-")
            .tempdir()
            .expect("temp dir");
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        std::fs::create_dir_all(dir.path().join("warehouse/sales.db")).unwrap();
        Setup { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `check MOUNTPOINT --state … --hive-metastore URL --source-map …`.
    fn args(&self, url: &str) -> Vec<OsString> {
        vec![
            "check".into(),
            self.path("mnt").into(),
            "--state".into(),
            self.path("state").into(),
            "--hive-metastore".into(),
            url.into(),
            "--source-map".into(),
            format!(
                "hdfs://nn1:8020/warehouse={}",
                self.path("warehouse").display()
            )
            .into(),
        ]
    }
}

fn run(args: &[OsString]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stagefs"))
        .args(args)
        .env("STAGEFS_METASTORE_PASSWORD", PASSWORD)
        .output()
        .expect("run stagefs check")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The check's lines that start with `status` (`ok` or `FAIL`) and name
/// `check`.
fn lines<'a>(text: &'a str, status: &str, check: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| {
            let mut words = l.split_whitespace();
            words.next() == Some(status) && words.next() == Some(check)
        })
        .collect()
}

/// Exit status 1, `FAIL <name>` with a fix line after it, and every other
/// check of the run ok.
fn assert_only_failure(out: &Output, name: &str) -> String {
    let text = stdout(out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let failed: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert!(
        !failed.is_empty()
            && failed
                .iter()
                .all(|l| l.split_whitespace().nth(1) == Some(name)),
        "expected only {name} to fail:\n{text}"
    );
    let fix = text
        .lines()
        .skip_while(|l| !l.starts_with("FAIL"))
        .nth(1)
        .unwrap_or("");
    assert!(
        fix.trim_start().starts_with("fix: "),
        "no fix line:\n{text}"
    );
    assert!(!text.contains(PASSWORD), "password in the output:\n{text}");
    text
}

fn metastore() -> DbServer {
    let server = DbServer::start(Kind::Postgres);
    server.create_metastore("metastore", TableCase::Upper);
    server
}

#[test]
fn a_good_setup_passes_every_check_and_changes_nothing() {
    let server = metastore();
    let setup = Setup::new();
    let out = run(&setup.args(&server.url("metastore")));
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["fuse", "mountpoint", "state", "metastore", "sources"] {
        assert_eq!(lines(&text, "ok", name).len(), 1, "{name}:\n{text}");
    }
    assert!(!text.contains("FAIL"), "{text}");
    let metastore = lines(&text, "ok", "metastore")[0];
    assert!(
        metastore.contains("NOTIFICATION_LOG present") && metastore.contains("no event yet"),
        "{metastore}"
    );
    assert!(text.contains("5 checks: 5 ok, 0 failed"), "{text}");
    // Nothing made: the state folder does not exist yet.
    assert!(!setup.path("state").exists());
    assert_eq!(std::fs::read_dir(setup.path("mnt")).unwrap().count(), 0);

    // The same options from a config file (the mount's own) check alike.
    let config = setup.path("stagefs.toml");
    std::fs::write(
        &config,
        format!(
            "mountpoint = \"{}\"\nstate = \"{}\"\nhive-metastore = \"{}\"\n\
             source-map = [\"hdfs://nn1:8020/warehouse={}\"]\nallow-other = false\n",
            setup.path("mnt").display(),
            setup.path("state").display(),
            server.url("metastore"),
            setup.path("warehouse").display()
        ),
    )
    .unwrap();
    let out = run(&["check".into(), "--config".into(), config.into()]);
    assert!(out.status.success(), "{}", stdout(&out));
}

#[test]
fn check_names_the_metastore_it_cannot_reach() {
    let setup = Setup::new();
    // Port 1 on loopback refuses at once.
    let out = run(&setup.args("postgresql://stagefs@127.0.0.1:1/metastore"));
    let text = assert_only_failure(&out, "metastore");
    assert!(text.contains("127.0.0.1:1"), "{text}");
}

#[test]
fn check_names_a_metastore_without_the_notification_log_and_an_unreachable_hdfs() {
    let server = DbServer::start(Kind::Postgres);
    // No Hive tables at all.
    server.create_database("empty");
    let setup = Setup::new();
    let out = run(&setup.args(&server.url("empty")));
    let text = assert_only_failure(&out, "metastore");
    assert!(text.contains("NOTIFICATION_LOG"), "{text}");

    // A metastore whose database lives on an HDFS no map covers, which
    // does not answer.
    server.create_metastore("onhdfs", TableCase::Upper);
    let mut admin = server.admin("onhdfs");
    admin.execute(
        r#"CREATE TABLE "DBS" ("DB_ID" BIGINT PRIMARY KEY, "DB_LOCATION_URI" VARCHAR(4000) NOT NULL, "NAME" VARCHAR(128))"#,
    );
    admin.execute(
        r#"INSERT INTO "DBS" VALUES (1, 'hdfs://127.0.0.1:1/warehouse/sales.db', 'sales')"#,
    );
    let out = run(&setup.args(&server.url("onhdfs")));
    let text = assert_only_failure(&out, "sources");
    assert!(text.contains("HDFS 127.0.0.1:1"), "{text}");
    // The mapped folder itself is still checked ok.
    assert_eq!(lines(&text, "ok", "sources").len(), 1, "{text}");
}

#[test]
fn check_names_a_source_map_folder_that_is_missing() {
    let server = metastore();
    let setup = Setup::new();
    let mut args = setup.args(&server.url("metastore"));
    args.push("--source-map".into());
    args.push(format!("hdfs://nn1:8020/other={}", setup.path("absent").display()).into());
    let text = assert_only_failure(&run(&args), "sources");
    assert!(text.contains("absent"), "{text}");
}

#[test]
fn check_names_a_mountpoint_that_is_not_empty() {
    let server = metastore();
    let setup = Setup::new();
    std::fs::write(setup.path("mnt/leftover"), b"x").unwrap();
    let text = assert_only_failure(&run(&setup.args(&server.url("metastore"))), "mountpoint");
    assert!(text.contains("not empty"), "{text}");
}

#[test]
fn check_names_a_state_folder_another_process_holds() {
    let server = metastore();
    let setup = Setup::new();
    std::fs::create_dir(setup.path("state")).unwrap();
    let _held = stagefs::state_lock::lock_state(&setup.path("state")).expect("take the lock");
    let text = assert_only_failure(&run(&setup.args(&server.url("metastore"))), "state");
    assert!(text.contains("in use"), "{text}");
}

#[test]
fn check_names_a_metrics_address_that_is_taken() {
    let setup = Setup::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let root = setup.path("source");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(setup.path("events")).unwrap();
    // A native-source mount setup.
    let args: Vec<OsString> = vec![
        "check".into(),
        setup.path("mnt").into(),
        "--state".into(),
        setup.path("state").into(),
        "--source-root".into(),
        root.into(),
        "--events".into(),
        setup.path("events").into(),
        "--metrics".into(),
        addr.clone().into(),
    ];
    let text = assert_only_failure(&run(&args), "metrics");
    assert!(text.contains(&addr), "{text}");
}

#[test]
fn check_names_fuse_when_an_ordinary_user_has_no_fusermount3() {
    let setup = Setup::new();
    std::fs::create_dir(setup.path("events")).unwrap();
    let args: Vec<OsString> = vec![
        "check".into(),
        setup.path("mnt").into(),
        "--state".into(),
        setup.path("state").into(),
        "--source-root".into(),
        setup.path("warehouse").into(),
        "--events".into(),
        setup.path("events").into(),
    ];
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stagefs"));
    // No fusermount3 on this PATH.
    cmd.args(&args).env("PATH", setup.path("no-bin"));
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        // As root the check needs no fusermount3: run as the ordinary
        // user scripts/setup.sh makes, owning the setup's folders.
        let (uid, gid) = user("stagefs-test");
        chown_tree(setup.dir.path(), uid, gid);
        cmd.uid(uid).gid(gid);
    }
    let out = cmd.output().expect("run stagefs check");
    let text = assert_only_failure(&out, "fuse");
    assert!(
        text.contains("fusermount3") || text.contains("/dev/fuse"),
        "{text}"
    );
}

fn user(name: &str) -> (u32, u32) {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: getpwnam on a NUL-terminated name; the entry is read at once.
    let pw = unsafe { libc::getpwnam(c.as_ptr()) };
    assert!(!pw.is_null(), "no user {name}: run scripts/setup.sh");
    unsafe { ((*pw).pw_uid, (*pw).pw_gid) }
}

fn chown_tree(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
    if path.is_dir() && !path.is_symlink() {
        for entry in std::fs::read_dir(path).unwrap() {
            chown_tree(&entry.unwrap().path(), uid, gid);
        }
    }
}

#[test]
fn check_names_a_native_events_folder_that_is_missing() {
    let setup = Setup::new();
    let args: Vec<OsString> = vec![
        "check".into(),
        "--state".into(),
        setup.path("state").into(),
        "--source-root".into(),
        setup.path("warehouse").into(),
        "--events".into(),
        setup.path("no-events").into(),
    ];
    let text = assert_only_failure(&run(&args), "events");
    assert!(text.contains("no-events"), "{text}");
    // Without a mountpoint (a `replicate` setup) FUSE is not looked at.
    assert!(lines(&text, "ok", "fuse").is_empty(), "{text}");
    assert!(lines(&text, "ok", "state").len() == 1, "{text}");
}

#[test]
fn check_reads_the_publish_url_and_names_a_corrupt_head() {
    let server = metastore();
    let setup = Setup::new();
    let url = format!("file://{}", setup.path("published").display());
    let mut args = setup.args(&server.url("metastore"));
    args.extend(["--publish".into(), url.clone().into()]);
    // A URL nobody published to yet: reachable, no HEAD, nothing written.
    let out = run(&args);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    let ok = lines(&text, "ok", "publish");
    assert!(ok.len() == 1 && ok[0].contains("no HEAD yet"), "{text}");
    assert!(
        !setup.path("published/HEAD").exists(),
        "check wrote a HEAD:\n{text}"
    );
    // A HEAD that is not one: named, with a fix.
    std::fs::create_dir_all(setup.path("published")).unwrap();
    std::fs::write(setup.path("published/HEAD"), b"not a head\n").unwrap();
    let text = assert_only_failure(&run(&args), "publish");
    assert!(text.contains("HEAD"), "{text}");
    // A signing key that is not one.
    std::fs::remove_file(setup.path("published/HEAD")).unwrap();
    std::fs::write(setup.path("key"), b"garbage").unwrap();
    args.extend(["--signing-key".into(), setup.path("key").into()]);
    let text = assert_only_failure(&run(&args), "publish");
    assert!(text.contains("--signing-key"), "{text}");
}

#[test]
fn check_names_an_unreachable_s3_location() {
    let server = metastore();
    let mut admin = server.admin("metastore");
    admin.execute(
        r#"CREATE TABLE "DBS" ("DB_ID" BIGINT PRIMARY KEY, "DB_LOCATION_URI" VARCHAR(4000) NOT NULL, "NAME" VARCHAR(128))"#,
    );
    admin.execute(r#"INSERT INTO "DBS" VALUES (1, 's3a://wh/warehouse/sales.db', 'sales')"#);
    let setup = Setup::new();
    let mut args = setup.args(&server.url("metastore"));
    // Port 1 on loopback refuses at once.
    args.extend(["--s3-endpoint".into(), "http://127.0.0.1:1".into()]);
    let out = Command::new(env!("CARGO_BIN_EXE_stagefs"))
        .args(&args)
        .env("STAGEFS_METASTORE_PASSWORD", PASSWORD)
        .env("AWS_ACCESS_KEY_ID", "check-key")
        .env("AWS_SECRET_ACCESS_KEY", "check-secret-never-shown")
        .env("AWS_REGION", "us-east-1")
        .output()
        .expect("run stagefs check");
    let text = assert_only_failure(&out, "sources");
    assert!(text.contains("127.0.0.1:1"), "{text}");
    assert!(!text.contains("check-secret-never-shown"), "{text}");
    // The mapped folder itself is still checked ok.
    assert_eq!(lines(&text, "ok", "sources").len(), 1, "{text}");
}

#[test]
fn check_of_a_reader_host_reads_the_from_url_and_names_a_wrong_key() {
    let setup = Setup::new();
    let url = format!("file://{}", setup.path("published").display());
    let mut args: Vec<OsString> = vec![
        "check".into(),
        setup.path("mnt").into(),
        "--from".into(),
        url.into(),
        "--cache".into(),
        setup.path("cache").into(),
    ];
    let out = run(&args);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    for name in ["fuse", "mountpoint", "cache", "from"] {
        assert_eq!(lines(&text, "ok", name).len(), 1, "{name}:\n{text}");
    }
    assert!(text.contains("no HEAD yet"), "{text}");
    assert!(
        !setup.path("cache").exists(),
        "check made the cache:\n{text}"
    );
    assert!(
        !setup.path("published").exists(),
        "check made the URL:\n{text}"
    );
    // A trusted key that is not one.
    std::fs::write(setup.path("k.pub"), b"not a key\n").unwrap();
    args.extend(["--trusted-key".into(), setup.path("k.pub").into()]);
    let text = assert_only_failure(&run(&args), "from");
    assert!(text.contains("--trusted-key"), "{text}");
    // A cache path under a file.
    std::fs::write(setup.path("file"), b"").unwrap();
    args.truncate(6);
    args[5] = setup.path("file").into();
    let text = assert_only_failure(&run(&args), "cache");
    assert!(text.contains("not a directory"), "{text}");
}
