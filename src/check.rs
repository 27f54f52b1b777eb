//! `stagefs check`: the pre-flight checks of a `mount` or `replicate`
//! configuration (issue 32), run before a daemon is started so that what
//! would stall it at run time is named at once, all of it, with a fix.
//!
//! The checks run in a fixed order, each whatever the others found, and
//! each gives ok or fail with a hint:
//! 1. `fuse` (with a mountpoint): `/dev/fuse` opens; as an ordinary user,
//!    the setuid `fusermount3` is there, and `user_allow_other` is in
//!    `/etc/fuse.conf` when `--allow-other` is asked;
//! 2. `mountpoint`: an existing empty directory, not mounted on;
//! 3. `state`: the state folder (or the folder it would be made in) is
//!    writable, has free space, and no stagefs process holds its lock;
//! 4. `metrics` (with `--metrics`): the address can be bound;
//! 5. `metastore` (`--hive-metastore`): reachable, TLS as the URL asks,
//!    the credentials, `NOTIFICATION_LOG` and its sequence, the newest event
//!    id (none yet: perhaps no listener writes them); or the
//!    `--hive-events` / `--events` files;
//! 6. `sources`: each `--source-map` directory (or `--source-root`) exists
//!    and lists; the HDFS file systems the metastore's databases live on
//!    (those no map covers, read where they are) answer a listing.
//!
//! Invariant: it changes nothing. No folder is created, no lock taken,
//! nothing written; a socket bound for the metrics check is closed at
//! once, and the metastore sees read-only statements.
//!
//! Called by the binary (`stagefs check`).

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::daemon::{PublishArgs, ReplicateArgs};
use crate::source::hive::map::SourceMap;
use crate::source::hive::metastore::{Endpoint, MetastoreSource, Session, Timeouts, PASSWORD_ENV};
use crate::source::hive::model::{RowSource, RowSourceError};
use crate::source::hive::HiveRows;
use crate::source_file::hdfs::HdfsUri;
use crate::source_file::s3::{S3Access, S3Settings, S3Uri};

/// Free space below which the state folder fails the check: staged copies
/// of the source's files live there.
pub const MIN_FREE_BYTES: u64 = 1 << 30;

/// How long one remote look (metastore, HDFS) may take.
const REMOTE_TIMEOUT: Duration = Duration::from_secs(10);

/// What `stagefs check` is asked to look at: `mount`'s or `replicate`'s
/// options.
#[derive(Debug, Clone)]
pub struct CheckArgs {
    /// The mountpoint (`mount`); None checks a `replicate` setup.
    pub mountpoint: Option<PathBuf>,
    pub allow_other: bool,
    pub metrics: Option<String>,
    /// What the mount serves: a source it replicates, or the states a
    /// publisher writes (a reader host, `--from`).
    pub serves: Serves,
}

/// The two kinds of setup `check` looks at.
#[derive(Debug, Clone)]
pub enum Serves {
    Source(Box<ReplicateArgs>),
    /// A reader host: `--from URL --cache DIR`.
    Published(FollowCheck),
}

/// A reader host's options, as `mount --from` takes them.
#[derive(Debug, Clone)]
pub struct FollowCheck {
    pub url: String,
    pub cache: PathBuf,
    pub cache_size: u64,
    pub trusted_key: Option<PathBuf>,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// What was found.
    Ok(String),
    /// What is wrong, and how to fix it.
    Fail { problem: String, fix: String },
}

/// A named check and its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub name: &'static str,
    pub outcome: Outcome,
}

impl Finding {
    fn ok(name: &'static str, found: impl Into<String>) -> Finding {
        Finding {
            name,
            outcome: Outcome::Ok(found.into()),
        }
    }

    fn fail(name: &'static str, problem: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding {
            name,
            outcome: Outcome::Fail {
                problem: problem.into(),
                fix: fix.into(),
            },
        }
    }

    pub fn passed(&self) -> bool {
        matches!(self.outcome, Outcome::Ok(_))
    }
}

/// Runs every check in order, writing each as it finishes to `out`, and
/// returns them all.
pub fn run(args: &CheckArgs, out: &mut dyn Write) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut report = |f: Finding| {
        // A closed stdout must not stop the checks; the exit code still tells.
        let _ = write_finding(out, &f);
        findings.push(f);
    };
    if let Some(mountpoint) = &args.mountpoint {
        report(check_fuse(args.allow_other));
        report(check_mountpoint(mountpoint));
    }
    let replicate = match &args.serves {
        Serves::Source(replicate) => replicate,
        Serves::Published(follow) => {
            report(check_cache(follow));
            report(check_from(follow));
            return summarize(findings, out);
        }
    };
    report(check_state(&replicate.state));
    if let Some(addr) = &args.metrics {
        report(check_metrics(addr));
    }
    let mut hdfs_roots = Vec::new();
    report(check_events(replicate, &mut hdfs_roots));
    for f in check_sources(replicate, &hdfs_roots) {
        report(f);
    }
    if let Some(publish) = &replicate.publish {
        report(check_publish(publish));
    }
    summarize(findings, out)
}

/// The last line (how many passed), and the findings.
fn summarize(findings: Vec<Finding>, out: &mut dyn Write) -> Vec<Finding> {
    let failed = findings.iter().filter(|f| !f.passed()).count();
    let _ = writeln!(
        out,
        "{} checks: {} ok, {failed} failed",
        findings.len(),
        findings.len() - failed
    );
    findings
}

fn write_finding(out: &mut dyn Write, f: &Finding) -> std::io::Result<()> {
    match &f.outcome {
        Outcome::Ok(found) => writeln!(out, "ok    {:<10} {found}", f.name),
        Outcome::Fail { problem, fix } => {
            writeln!(out, "FAIL  {:<10} {problem}", f.name)?;
            writeln!(out, "      {:<10} fix: {fix}", "")
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn check_fuse(allow_other: bool) -> Finding {
    const NAME: &str = "fuse";
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        let fix = if e.kind() == std::io::ErrorKind::NotFound {
            "load the fuse module (modprobe fuse); in a container, pass the device \
             (docker run --device /dev/fuse --cap-add SYS_ADMIN)"
        } else {
            "make /dev/fuse mode 0666 (udev does so on Debian), or run as root"
        };
        return Finding::fail(NAME, format!("/dev/fuse: {e}"), fix);
    }
    if is_root() {
        return Finding::ok(NAME, "/dev/fuse opens; mounting as root");
    }
    let Some(fusermount) = find_on_path("fusermount3") else {
        return Finding::fail(
            NAME,
            "fusermount3 is not on PATH (an ordinary user mounts through it)",
            "install fuse3 (apt-get install fuse3), or run as root",
        );
    };
    let setuid = std::fs::metadata(&fusermount)
        .is_ok_and(|m| m.uid() == 0 && m.permissions().mode() & 0o4000 != 0);
    if !setuid {
        return Finding::fail(
            NAME,
            format!("{} is not setuid root", fusermount.display()),
            format!("chown root {0} && chmod u+s {0}", fusermount.display()),
        );
    }
    if allow_other && !fuse_conf_allows_other(Path::new("/etc/fuse.conf")) {
        return Finding::fail(
            NAME,
            "--allow-other is asked, and /etc/fuse.conf lacks user_allow_other",
            "add the line user_allow_other to /etc/fuse.conf (as root), or drop --allow-other",
        );
    }
    Finding::ok(
        NAME,
        format!("/dev/fuse opens; {} is setuid root", fusermount.display()),
    )
}

/// Whether fuse.conf has an uncommented `user_allow_other` line.
fn fuse_conf_allows_other(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| {
        text.lines()
            .any(|l| l.split('#').next().unwrap_or("").trim() == "user_allow_other")
    })
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

fn check_mountpoint(path: &Path) -> Finding {
    const NAME: &str = "mountpoint";
    let shown = path.display();
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Finding::fail(
                NAME,
                format!("{shown}: a dead FUSE mount (the daemon is gone)"),
                format!("fusermount3 -u {shown} (or umount -l {shown} as root)"),
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Finding::fail(
                NAME,
                format!("{shown} does not exist"),
                format!("mkdir -p {shown}"),
            )
        }
        Err(e) => {
            return Finding::fail(
                NAME,
                format!("{shown}: {e}"),
                "give a directory this user can reach",
            )
        }
    };
    if !meta.is_dir() {
        return Finding::fail(
            NAME,
            format!("{shown} is not a directory"),
            "mount on an empty directory",
        );
    }
    if crate::daemon::is_mount_point(path) {
        return Finding::fail(
            NAME,
            format!("{shown} is already a mount point"),
            format!("unmount it first (umount {shown}), or choose another directory"),
        );
    }
    match std::fs::read_dir(path) {
        Ok(entries) => {
            let n = entries.count();
            if n > 0 {
                return Finding::fail(
                    NAME,
                    format!("{shown} is not empty ({n} entries in it)"),
                    "mount on an empty directory (a mount would hide what is there)",
                );
            }
        }
        Err(e) => {
            return Finding::fail(
                NAME,
                format!("{shown}: cannot list: {e}"),
                "give this user read and search rights on it",
            )
        }
    }
    Finding::ok(NAME, format!("{shown}: an empty directory, not mounted on"))
}

fn check_state(state: &Path) -> Finding {
    const NAME: &str = "state";
    let shown = state.display();
    // A missing folder is made by the daemon in its nearest existing parent.
    let (existing, exists) = match std::fs::metadata(state) {
        Ok(m) if m.is_dir() => (state.to_owned(), true),
        Ok(_) => {
            return Finding::fail(
                NAME,
                format!("--state {shown} is not a directory"),
                "give a directory (or a path where one can be made)",
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match state.ancestors().skip(1).find(|a| a.is_dir()) {
                Some(parent) => (parent.to_owned(), false),
                None => {
                    return Finding::fail(
                        NAME,
                        format!("--state {shown}: no existing parent folder"),
                        "give an absolute path",
                    )
                }
            }
        }
        Err(e) => {
            return Finding::fail(
                NAME,
                format!("--state {shown}: {e}"),
                "give a folder this user can reach",
            )
        }
    };
    if !writable(&existing) {
        let what = if exists {
            format!("--state {shown} is not writable by this user")
        } else {
            format!(
                "--state {shown} does not exist, and {} (where it would be made) is not writable",
                existing.display()
            )
        };
        return Finding::fail(
            NAME,
            what,
            format!(
                "chown the folder to the user the daemon runs as, or choose another \
                 (mkdir -p {shown} && chown USER {shown})"
            ),
        );
    }
    if exists && crate::state_lock::state_in_use(state) {
        return Finding::fail(
            NAME,
            format!("--state {shown} is in use: another stagefs process holds its lock"),
            "stop that daemon first (systemctl stop, or umount its mountpoint), or use another folder",
        );
    }
    let free = match free_bytes(&existing) {
        Ok(free) => free,
        Err(e) => {
            return Finding::fail(
                NAME,
                format!("--state {shown}: statvfs: {e}"),
                "give a folder on a local file system",
            )
        }
    };
    if free < MIN_FREE_BYTES {
        return Finding::fail(
            NAME,
            format!(
                "--state {shown}: only {} MiB free (at least {} MiB needed: staged copies live there)",
                free >> 20,
                MIN_FREE_BYTES >> 20
            ),
            "free space on that file system, or put --state on a larger one",
        );
    }
    let made = if exists {
        "writable"
    } else {
        "does not exist yet, will be made (parent writable)"
    };
    Finding::ok(
        NAME,
        format!("{shown}: {made}, {} GiB free, not in use", free >> 30),
    )
}

fn writable(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access on a NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs into a zeroed struct on a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

fn check_metrics(addr: &str) -> Finding {
    const NAME: &str = "metrics";
    match std::net::TcpListener::bind(addr) {
        Ok(listener) => {
            drop(listener);
            Finding::ok(NAME, format!("{addr} can be bound"))
        }
        Err(e) => Finding::fail(
            NAME,
            format!("--metrics {addr}: {e}"),
            "choose a free HOST:PORT (is another daemon serving there?)",
        ),
    }
}

/// The notification source: the metastore, or the event files. The
/// metastore's HDFS database locations go to `hdfs_roots`.
fn check_events(args: &ReplicateArgs, hdfs_roots: &mut Vec<String>) -> Finding {
    match &args.hive.rows {
        Some(HiveRows::Metastore(url)) => check_metastore(url, &args.hive.catalog, hdfs_roots),
        Some(HiveRows::Files(path)) => {
            check_listable("events", "--hive-events", path, true).unwrap_or_else(|| {
                Finding::ok("events", format!("--hive-events {}: readable", path.display()))
            })
        }
        None => match &args.events {
            Some(dir) => check_listable("events", "--events", dir, false).unwrap_or_else(|| {
                Finding::ok("events", format!("--events {}: a readable folder", dir.display()))
            }),
            None => Finding::fail(
                "events",
                "no source of events is given",
                "give --hive-metastore URL (Hive), --hive-events PATH, or --events DIR with --source-root",
            ),
        },
    }
}

/// None when `path` is a listable folder (or, with `file_ok`, a readable
/// file); else the failure.
fn check_listable(name: &'static str, flag: &str, path: &Path, file_ok: bool) -> Option<Finding> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => match std::fs::read_dir(path) {
            Ok(_) => None,
            Err(e) => Some(Finding::fail(
                name,
                format!("{flag} {shown}: cannot list: {e}"),
                "give the daemon's user read and search rights on it",
            )),
        },
        Ok(_) if file_ok => match std::fs::File::open(path) {
            Ok(_) => None,
            Err(e) => Some(Finding::fail(
                name,
                format!("{flag} {shown}: {e}"),
                "give the daemon's user read rights on it",
            )),
        },
        Ok(_) => Some(Finding::fail(
            name,
            format!("{flag} {shown} is not a directory"),
            "give a directory",
        )),
        Err(e) => Some(Finding::fail(
            name,
            format!("{flag} {shown}: {e}"),
            "create it, mount it, or correct the path",
        )),
    }
}

fn check_metastore(url: &str, catalog: &str, hdfs_roots: &mut Vec<String>) -> Finding {
    const NAME: &str = "metastore";
    let timeouts = Timeouts {
        connect: REMOTE_TIMEOUT,
        statement: REMOTE_TIMEOUT,
    };
    let password = std::env::var(PASSWORD_ENV).ok();
    let endpoint = match Endpoint::parse(url, password.clone()) {
        Ok(e) => e,
        Err(e) => return Finding::fail(NAME, e.to_string(), metastore_fix(&e)),
    };
    let shown = endpoint.describe();
    // The polling connection as the daemon opens it: login, tables, and
    // each statement run once.
    let mut source = match MetastoreSource::open(url, password.clone(), timeouts) {
        Ok(source) => source,
        Err(e) => return Finding::fail(NAME, e.to_string(), metastore_fix(&e)),
    };
    let newest = match source.newest_event_id() {
        Ok(newest) => newest,
        Err(e) => return Finding::fail(NAME, e.to_string(), metastore_fix(&e)),
    };
    let txn = match source.records_txn_writes() {
        Ok(true) => "TXN_WRITE_NOTIFICATION_LOG present",
        Ok(false) => "no TXN_WRITE_NOTIFICATION_LOG (a metastore older than Hive 3.2)",
        Err(e) => return Finding::fail(NAME, e.to_string(), metastore_fix(&e)),
    };
    drop(source);
    let catalog = if catalog.is_empty() {
        crate::source::hive::adapter::DEFAULT_CATALOG
    } else {
        catalog
    };
    let known = crate::source::hive::metastore::catalogs(url, password.clone(), timeouts)
        .and_then(|list| crate::source::hive::metastore::catalog_known(catalog, list.as_deref()));
    if let Err(e) = known {
        let fix = match &e {
            RowSourceError::Fatal(_) => "give --catalog one of the catalogs named".to_owned(),
            other => metastore_fix(other),
        };
        return Finding::fail(NAME, e.to_string(), fix);
    }
    let mut session = match Session::open(&endpoint, timeouts, "stagefs check") {
        Ok(s) => s,
        Err(e) => {
            let e = endpoint.scrub(e);
            return Finding::fail(NAME, e.to_string(), metastore_fix(&e));
        }
    };
    let tls = match session.tls_version() {
        Ok(Some(version)) => format!("TLS {version} ({})", endpoint.tls()),
        Ok(None) => format!("not encrypted ({})", endpoint.tls()),
        Err(e) => {
            let e = endpoint.scrub(e);
            return Finding::fail(NAME, e.to_string(), metastore_fix(&e));
        }
    };
    hdfs_roots.extend(database_locations(&mut session));
    let newest = match newest {
        Some(id) if id > 0 => format!("newest event id {id}"),
        _ => "no event yet (if Hive changed anything since it was set up, its \
              metastore lacks hive.metastore.transactional.event.listeners = \
              org.apache.hive.hcatalog.listener.DbNotificationListener)"
            .to_string(),
    };
    Finding::ok(
        NAME,
        format!(
            "{shown}: logged in, {tls}, NOTIFICATION_LOG present, {txn}, catalog {catalog}, {newest}"
        ),
    )
}

/// The hdfs:// locations of the metastore's databases (`DBS`), when it
/// has that table and this user may read it; none otherwise.
fn database_locations(session: &mut Session) -> Vec<String> {
    let Ok(tables) = session.tables() else {
        return Vec::new();
    };
    let Some(dbs) = session.table(&tables, "DBS") else {
        return Vec::new();
    };
    let sql = format!(
        "SELECT DISTINCT {} FROM {}",
        session.quote("DB_LOCATION_URI"),
        session.quote(&dbs)
    );
    let Ok(rows) = session.query(&sql) else {
        return Vec::new();
    };
    let mut roots: Vec<String> = rows
        .into_iter()
        .filter_map(|row| row.into_iter().next().flatten())
        .filter(|uri| HdfsUri::is_hdfs(uri) || S3Uri::is_s3(uri))
        .collect();
    roots.sort();
    roots.dedup();
    roots
}

fn metastore_fix(error: &RowSourceError) -> String {
    let text = error.to_string();
    let fix = if text.contains("bad metastore URL") {
        "write the URL as postgresql://USER@HOST:PORT/DB or mysql://USER@HOST:PORT/DB, \
         TLS options as sslmode=/sslrootcert= (PostgreSQL) or ssl-mode=/ssl-ca= (MySQL)"
    } else if text.contains("CA file") {
        "give sslrootcert= (PostgreSQL) or ssl-ca= (MySQL) the path of a readable PEM file \
         holding the CA certificate that signed the server's"
    } else if text.contains("TLS") {
        "match the URL's TLS options to the server: the CA that signed its certificate \
         (sslrootcert= / ssl-ca=), the host name the certificate names, or TLS on the server"
    } else if text.contains("password")
        || text.contains("authentication")
        || text.contains("Access denied")
    {
        "check the user in the URL and the password (STAGEFS_METASTORE_PASSWORD, or \
         ?password_file= / --metastore-password-file)"
    } else if text.contains("does not exist") || text.contains("doesn't exist") {
        "point the URL at Hive's metastore database (the one with NOTIFICATION_LOG), \
         and grant the user SELECT on it"
    } else if matches!(error, RowSourceError::Unavailable(_)) {
        "check that the database server runs and that this host reaches HOST:PORT \
         (firewall, listen_addresses / bind-address)"
    } else {
        "see the message above"
    };
    fix.to_string()
}

fn check_sources(args: &ReplicateArgs, hdfs_roots: &[String]) -> Vec<Finding> {
    const NAME: &str = "sources";
    if args.hive.rows.is_none() {
        return vec![match &args.source_root {
            Some(root) => check_listable(NAME, "--source-root", root, false).unwrap_or_else(|| {
                Finding::ok(
                    NAME,
                    format!("--source-root {}: a readable folder", root.display()),
                )
            }),
            None => Finding::fail(
                NAME,
                "no --source-root is given for native events",
                "give --source-root DIR (the source warehouse's files)",
            ),
        }];
    }
    let map = match SourceMap::parse(&args.hive.source_map) {
        Ok(map) => map,
        Err(e) => {
            return vec![Finding::fail(
                NAME,
                e,
                "write each map as PREFIX=DIR, e.g. hdfs://nn1:8020/warehouse=/srv/warehouse",
            )]
        }
    };
    let mut findings = Vec::new();
    for dir in map.dirs() {
        findings.push(
            check_listable(NAME, "--source-map", dir, false).unwrap_or_else(|| {
                Finding::ok(
                    NAME,
                    format!("--source-map {}: a readable folder", dir.display()),
                )
            }),
        );
    }
    // Databases on HDFS or S3 that no map covers are read where they are.
    let s3 = S3Access::new(S3Settings::from_environment(
        args.s3_endpoint.as_deref(),
        REMOTE_TIMEOUT,
    ));
    for root in hdfs_roots {
        if map.resolve(root).is_ok() {
            continue;
        }
        if S3Uri::is_s3(root) {
            findings.push(match crate::source_file::s3::probe(&s3, root) {
                Ok(n) => Finding::ok(
                    NAME,
                    format!(
                        "{root}: lists ({n} entries on its first page) at {}",
                        s3.settings().server()
                    ),
                ),
                Err(e) => Finding::fail(
                    NAME,
                    e,
                    "check the endpoint (--s3-endpoint, AWS_ENDPOINT_URL), the region \
                 (AWS_REGION) and the credentials (AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY, or the AWS_PROFILE profile); or map the prefix \
                 to a local copy with --source-map PREFIX=DIR",
                ),
            });
            continue;
        }
        findings.push(
            match crate::source_file::hdfs::list_dir(root, REMOTE_TIMEOUT) {
                Ok(n) => Finding::ok(NAME, format!("{root}: lists ({n} entries)")),
                Err(e) => Finding::fail(
                    NAME,
                    e,
                    "check the NameNode address and HADOOP_CONF_DIR (core-site.xml, \
                 hdfs-site.xml), the user (HADOOP_USER_NAME or a Kerberos ticket); or map \
                 the prefix to a local copy with --source-map PREFIX=DIR",
                ),
            },
        );
    }
    if findings.is_empty() {
        findings.push(Finding::ok(
            NAME,
            "no --source-map and no HDFS or S3 database location to look at",
        ));
    }
    findings
}

/// `--publish URL`: the storage opens, its HEAD reads (or there is none
/// yet), and a HEAD there was written by this state folder's publisher;
/// the signing key loads. Nothing is written.
fn check_publish(p: &PublishArgs) -> Finding {
    const NAME: &str = "publish";
    if let Some(key) = &p.signing_key {
        if let Err(e) = crate::publish::keys::load_signing(key) {
            return Finding::fail(
                NAME,
                format!("--signing-key {}: {e}", key.display()),
                "make a key pair with `stagefs keygen FILE` and give FILE (the secret half)",
            );
        }
    }
    let fix = "check the URL (s3://bucket/prefix or file:///dir), and for S3 the endpoint \
               (AWS_ENDPOINT_URL), region and credentials; for a folder, that it is mounted \
               and readable here";
    match crate::publish::read_head(&p.url, REMOTE_TIMEOUT, None) {
        Ok(None) => Finding::ok(
            NAME,
            format!(
                "{}: reachable, no HEAD yet (the first publish starts it)",
                p.url
            ),
        ),
        Ok(Some(head)) => Finding::ok(
            NAME,
            format!(
                "{}: HEAD at state {} by publisher {}",
                p.url, head.state_id.0, head.publisher
            ),
        ),
        Err(e) => Finding::fail(NAME, format!("{}: {e}", p.url), fix),
    }
}

/// A reader host's cache folder: a directory (or a path where one can be
/// made) that is writable, on a file system with room for `--cache-size`.
fn check_cache(f: &FollowCheck) -> Finding {
    const NAME: &str = "cache";
    let shown = f.cache.display();
    let existing = match std::fs::metadata(&f.cache) {
        Ok(m) if m.is_dir() => f.cache.clone(),
        Ok(_) => {
            return Finding::fail(
                NAME,
                format!("--cache {shown} is not a directory"),
                "give a directory (or a path where one can be made)",
            )
        }
        Err(_) => match f.cache.ancestors().skip(1).find(|a| a.is_dir()) {
            Some(parent) => parent.to_owned(),
            None => {
                return Finding::fail(
                    NAME,
                    format!("--cache {shown}: no existing parent folder"),
                    "give an absolute path",
                )
            }
        },
    };
    if !writable(&existing) {
        return Finding::fail(
            NAME,
            format!("--cache {shown}: {} is not writable", existing.display()),
            "run as a user who may write there, or choose another folder",
        );
    }
    let held = std::fs::read_dir(&f.cache)
        .map(|d| d.flatten().count() > 0)
        .unwrap_or(false);
    match free_bytes(&existing) {
        // What the cache holds already counts towards its size.
        Ok(free) if free < f.cache_size && !held => Finding::fail(
            NAME,
            format!(
                "--cache {shown}: {} GiB free, less than --cache-size {} GiB",
                free >> 30,
                f.cache_size >> 30
            ),
            "free space there, or give a smaller --cache-size",
        ),
        Ok(free) => Finding::ok(
            NAME,
            format!(
                "{shown}: writable, {} GiB free for a {} GiB cache",
                free >> 30,
                f.cache_size >> 30
            ),
        ),
        Err(e) => Finding::fail(
            NAME,
            format!("--cache {shown}: {e}"),
            "give a folder on a mounted file system",
        ),
    }
}

/// A reader host's `--from URL`: the storage opens and its HEAD reads,
/// decodes and, with `--trusted-key`, verifies.
fn check_from(f: &FollowCheck) -> Finding {
    const NAME: &str = "from";
    let trusted = match f
        .trusted_key
        .as_deref()
        .map(crate::publish::keys::load_trusted)
    {
        None => None,
        Some(Ok(key)) => Some(key),
        Some(Err(e)) => {
            return Finding::fail(
                NAME,
                format!(
                    "--trusted-key {}: {e}",
                    f.trusted_key.as_ref().unwrap().display()
                ),
                "give the publisher's public key (the FILE.pub `stagefs keygen` wrote)",
            )
        }
    };
    match crate::publish::read_head(&f.url, REMOTE_TIMEOUT, trusted.as_ref()) {
        Ok(None) => Finding::ok(
            NAME,
            format!(
                "{}: reachable, no HEAD yet (the mount waits for the first)",
                f.url
            ),
        ),
        Ok(Some(head)) => Finding::ok(
            NAME,
            format!(
                "{}: HEAD at state {} by publisher {}{}",
                f.url,
                head.state_id.0,
                head.publisher,
                if trusted.is_some() {
                    ", signed by the trusted key"
                } else {
                    ""
                }
            ),
        ),
        Err(e) => Finding::fail(
            NAME,
            format!("{}: {e}", f.url),
            "check the URL the publisher writes (--publish), the S3 endpoint, region and \
             credentials, and that --trusted-key is the publisher's public key",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuse_conf_needs_an_uncommented_user_allow_other() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("fuse.conf");
        std::fs::write(&conf, "# user_allow_other\nmount_max = 1000\n").unwrap();
        assert!(!fuse_conf_allows_other(&conf));
        std::fs::write(&conf, "mount_max = 1000\n  user_allow_other  # yes\n").unwrap();
        assert!(fuse_conf_allows_other(&conf));
        assert!(!fuse_conf_allows_other(&dir.path().join("absent")));
    }

    #[test]
    fn a_missing_state_folder_is_checked_where_it_would_be_made() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("a/b/state");
        let f = check_state(&state);
        assert!(f.passed(), "{f:?}");
        assert!(!dir.path().join("a").exists(), "check made a folder");
    }
}
