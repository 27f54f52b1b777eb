//! Private PostgreSQL and MariaDB servers for the Hive metastore tests.
//!
//! Each [`DbServer`] is a fresh instance: its own data directory in a temp
//! dir, its own loopback port and socket directory, started from the
//! distribution's binaries (scripts/setup.sh installs them) and stopped in
//! `Drop`, also when the test panics. A server already running on the
//! machine is never used or touched. The server process also gets a
//! parent-death signal, so a test process killed outright does not leave it
//! behind.
//!
//! PostgreSQL refuses to run as root: when the tests run as root, initdb
//! and postgres run as the `postgres` system user the package creates.
//! MariaDB runs as the current user (`--user=root` when that is root).
//!
//! [`DbServer::create_metastore`] creates a database with Hive's
//! notification tables, with the column types of Hive's schema scripts
//! (`standalone-metastore/metastore-server/src/main/sql/{postgres,mysql}/hive-schema-4.0.0.*.sql`).
#![allow(dead_code)]

use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Password of the test user on every server.
pub const PASSWORD: &str = "s3cret-Metastore-pw";
/// The user the metastore URLs name.
pub const USER: &str = "stagefs";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Postgres,
    MariaDb,
}

/// How the Hive tables are spelled in a MySQL database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableCase {
    Upper,
    Lower,
}

pub struct DbServer {
    pub kind: Kind,
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    /// uid/gid the server runs as (PostgreSQL under root).
    run_as: Option<(u32, u32)>,
    bin: PathBuf,
    /// Certificate and key (copied into the server's directory) when the
    /// server speaks TLS.
    tls: Option<(PathBuf, PathBuf)>,
}

/// A server certificate (PEM, with its chain) and its private key, for
/// [`DbServer::start_with_tls`].
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A connection for setting up and writing rows, as the server's admin.
pub enum Admin {
    Postgres(Box<postgres::Client>),
    MariaDb(mysql::Conn),
}

impl DbServer {
    pub fn start(kind: Kind) -> DbServer {
        Self::start_inner(kind, None)
    }

    /// A server that offers TLS with `tls`'s certificate (clients may
    /// still connect without).
    pub fn start_with_tls(kind: Kind, tls: ServerTls) -> DbServer {
        Self::start_inner(kind, Some(tls))
    }

    fn start_inner(kind: Kind, tls: Option<ServerTls>) -> DbServer {
        let dir = tempfile::Builder::new()
            .prefix("stagefs-db-")
            .tempdir()
            .expect("temp dir");
        // The postgres user must reach its directories below ours.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut server = match kind {
            Kind::Postgres => {
                let bin = postgres_bin_dir();
                let run_as = if unsafe { libc::geteuid() } == 0 {
                    Some(system_user("postgres"))
                } else {
                    None
                };
                DbServer {
                    kind,
                    dir,
                    port: 0,
                    child: None,
                    run_as,
                    bin,
                    tls: None,
                }
            }
            Kind::MariaDb => DbServer {
                kind,
                dir,
                port: 0,
                child: None,
                run_as: None,
                bin: PathBuf::from(which("mariadbd")),
                tls: None,
            },
        };
        server.init();
        if let Some(tls) = tls {
            // The server's own copies: PostgreSQL wants its key owned by
            // the user it runs as and closed to others.
            let (cert, key) = (server.path("server.crt"), server.path("server.key"));
            fs::copy(&tls.cert, &cert).expect("copy the server certificate");
            fs::copy(&tls.key, &key).expect("copy the server key");
            fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).expect("chmod key");
            server.chown(&cert);
            server.chown(&key);
            server.tls = Some((cert, key));
        }
        // A port chosen free can be taken before the server binds it: try a few.
        let mut last = String::new();
        for _ in 0..5 {
            server.port = free_port();
            match server.try_start() {
                Ok(()) => {
                    server.setup_user();
                    return server;
                }
                Err(why) => last = why,
            }
        }
        panic!("{kind:?} did not start: {last}");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The metastore URL of database `db` (no password in it).
    pub fn url(&self, db: &str) -> String {
        match self.kind {
            Kind::Postgres => format!("postgresql://{USER}@127.0.0.1:{}/{db}", self.port),
            Kind::MariaDb => format!("mysql://{USER}@127.0.0.1:{}/{db}", self.port),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn data_dir(&self) -> PathBuf {
        self.path("db").join("data")
    }

    fn socket_dir(&self) -> PathBuf {
        self.path("run")
    }

    /// MariaDB's temporary tables: its own, not the shared `/tmp`, where
    /// instances set up at the same moment (tests run in parallel) collide
    /// on `#sql-temptable-…` names and `mariadb-install-db` fails ("Unknown
    /// table 'mysql.tmp_user_sys'"; reproduced with 6 concurrent installs).
    fn tmp_dir(&self) -> PathBuf {
        self.path("tmp")
    }

    fn mariadb_socket(&self) -> PathBuf {
        self.socket_dir().join("mysqld.sock")
    }

    fn log_path(&self) -> PathBuf {
        self.path("server.log")
    }

    fn command(&self, program: impl AsRef<Path>) -> Command {
        let mut cmd = Command::new(program.as_ref());
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    fn chown(&self, path: &Path) {
        if let Some((uid, gid)) = self.run_as {
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown");
        }
    }

    fn init(&mut self) {
        for dir in [self.socket_dir(), self.path("db"), self.tmp_dir()] {
            fs::create_dir(&dir).expect("server dir");
            self.chown(&dir);
        }
        let output = match self.kind {
            Kind::Postgres => {
                let pwfile = self.path("pwfile");
                fs::write(&pwfile, format!("{PASSWORD}\n")).expect("pwfile");
                self.chown(&pwfile);
                self.command(self.bin.join("initdb"))
                    .arg("-D")
                    .arg(self.data_dir())
                    .args(["-U", USER, "-A", "scram-sha-256", "-E", "UTF8"])
                    .args(["--no-locale", "--no-sync"])
                    .arg(format!("--pwfile={}", pwfile.display()))
                    .output()
            }
            Kind::MariaDb => {
                let mut cmd = Command::new(which("mariadb-install-db"));
                cmd.arg("--no-defaults")
                    .arg(format!("--datadir={}", self.data_dir().display()))
                    .arg(format!("--tmpdir={}", self.tmp_dir().display()))
                    .args([
                        "--auth-root-authentication-method=normal",
                        "--skip-test-db",
                        "--skip-name-resolve",
                    ]);
                if unsafe { libc::geteuid() } == 0 {
                    cmd.arg("--user=root");
                }
                cmd.output()
            }
        }
        .expect("run the database init tool");
        assert!(
            output.status.success(),
            "{:?} init failed: {}{}",
            self.kind,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn try_start(&mut self) -> Result<(), String> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| e.to_string())?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = match self.kind {
            Kind::Postgres => {
                let mut cmd = self.command(self.bin.join("postgres"));
                cmd.arg("-D")
                    .arg(self.data_dir())
                    .args(["-p", &self.port.to_string(), "-h", "127.0.0.1", "-k"])
                    .arg(self.socket_dir())
                    .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
                    .args(["-c", "full_page_writes=off", "-c", "shared_buffers=16MB"])
                    .args(["-c", "max_connections=40", "-c", "logging_collector=off"]);
                if let Some((cert, key)) = &self.tls {
                    cmd.args(["-c", "ssl=on", "-c"])
                        .arg(format!("ssl_cert_file={}", cert.display()))
                        .arg("-c")
                        .arg(format!("ssl_key_file={}", key.display()));
                }
                cmd
            }
            Kind::MariaDb => {
                let mut cmd = Command::new(&self.bin);
                cmd.arg("--no-defaults")
                    .arg(format!("--datadir={}", self.data_dir().display()))
                    .arg(format!("--socket={}", self.mariadb_socket().display()))
                    .arg(format!("--tmpdir={}", self.tmp_dir().display()))
                    .arg(format!("--port={}", self.port))
                    .arg(format!("--pid-file={}", self.path("mysqld.pid").display()))
                    .args(["--bind-address=127.0.0.1", "--skip-name-resolve"])
                    .args(["--skip-log-bin", "--innodb-buffer-pool-size=32M"])
                    .args([
                        "--innodb-flush-log-at-trx-commit=0",
                        "--lower-case-table-names=0",
                    ]);
                if let Some((cert, key)) = &self.tls {
                    cmd.arg(format!("--ssl-cert={}", cert.display()))
                        .arg(format!("--ssl-key={}", key.display()));
                }
                if unsafe { libc::geteuid() } == 0 {
                    cmd.arg("--user=root");
                }
                cmd
            }
        };
        let death_signal = match self.kind {
            // Immediate shutdown: the postmaster takes its backends along.
            Kind::Postgres => libc::SIGQUIT,
            Kind::MariaDb => libc::SIGKILL,
        };
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, death_signal as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!("exited with {status}: {}", self.log_tail()));
            }
            if self.try_admin(self.admin_db()).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.stop();
                return Err(format!("not ready after 60 s: {}", self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// The MariaDB test user (PostgreSQL's comes from initdb -U).
    fn setup_user(&self) {
        if self.kind == Kind::MariaDb {
            let mut admin = self.admin(self.admin_db());
            admin.execute(&format!(
                "CREATE USER IF NOT EXISTS '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'"
            ));
            admin.execute(&format!("GRANT ALL ON *.* TO '{USER}'@'%'"));
        }
    }

    fn try_admin(&self, db: &str) -> Result<Admin, String> {
        match self.kind {
            Kind::Postgres => postgres::Config::new()
                .host_path(self.socket_dir())
                .port(self.port)
                .user(USER)
                .password(PASSWORD)
                .dbname(db)
                .connect_timeout(Duration::from_secs(5))
                .connect(postgres::NoTls)
                .map(|c| Admin::Postgres(Box::new(c)))
                .map_err(|e| e.to_string()),
            Kind::MariaDb => {
                let opts = mysql::OptsBuilder::new()
                    .socket(Some(self.mariadb_socket().display().to_string()))
                    .user(Some("root"))
                    .db_name(Some(db))
                    .init(vec!["SET NAMES utf8mb4"]);
                mysql::Conn::new(opts)
                    .map(Admin::MariaDb)
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// The database that exists on a fresh server.
    pub fn admin_db(&self) -> &'static str {
        match self.kind {
            Kind::Postgres => "postgres",
            Kind::MariaDb => "mysql",
        }
    }

    /// An admin connection to `db` over the server's socket.
    pub fn admin(&self, db: &str) -> Admin {
        self.try_admin(db)
            .unwrap_or_else(|e| panic!("{:?} admin connection to {db}: {e}", self.kind))
    }

    /// A database with NOTIFICATION_LOG, NOTIFICATION_SEQUENCE (NEXT_EVENT_ID
    /// 1) and TXN_WRITE_NOTIFICATION_LOG as Hive's schema scripts create them.
    pub fn create_metastore(&self, db: &str, case: TableCase) {
        self.create_database(db);
        let mut admin = self.admin(db);
        for statement in schema(self.kind, case) {
            admin.execute(&statement);
        }
    }

    /// An empty database (for the "missing table" cases).
    pub fn create_database(&self, db: &str) {
        let mut admin = self.admin(self.admin_db());
        match self.kind {
            Kind::Postgres => admin.execute(&format!("CREATE DATABASE \"{db}\"")),
            Kind::MariaDb => admin.execute(&format!("CREATE DATABASE `{db}` CHARACTER SET latin1")),
        }
    }

    /// Stops the server (fast shutdown) and waits for it to exit.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let signal = match self.kind {
            Kind::Postgres => libc::SIGINT,
            Kind::MariaDb => libc::SIGTERM,
        };
        unsafe {
            libc::kill(child.id() as libc::pid_t, signal);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
            }
        }
    }

    /// Starts the stopped server again on the same port and data.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart of a running server");
        let mut last = String::new();
        for _ in 0..3 {
            match self.try_start() {
                Ok(()) => return,
                Err(why) => last = why,
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!(
            "{:?} did not restart on port {}: {last}",
            self.kind, self.port
        );
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for DbServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Admin {
    /// Runs one statement; panics with the server's error.
    pub fn execute(&mut self, sql: &str) {
        match self {
            Admin::Postgres(c) => {
                c.batch_execute(sql)
                    .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
            }
            Admin::MariaDb(c) => {
                use mysql::prelude::Queryable;
                c.query_drop(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
        }
    }
}

/// Hive 4.0.0's definitions of the three tables (see the module doc).
pub fn schema(kind: Kind, case: TableCase) -> Vec<String> {
    let name = |upper: &str| match case {
        TableCase::Upper => upper.to_string(),
        TableCase::Lower => upper.to_ascii_lowercase(),
    };
    let (log, seq, txn) = (
        name("NOTIFICATION_LOG"),
        name("NOTIFICATION_SEQUENCE"),
        name("TXN_WRITE_NOTIFICATION_LOG"),
    );
    match kind {
        Kind::Postgres => vec![
            format!(
                r#"CREATE TABLE "{log}" (
    "NL_ID" BIGINT NOT NULL,
    "EVENT_ID" BIGINT NOT NULL,
    "EVENT_TIME" INTEGER NOT NULL,
    "EVENT_TYPE" VARCHAR(32) NOT NULL,
    "CAT_NAME" VARCHAR(256),
    "DB_NAME" VARCHAR(128),
    "TBL_NAME" VARCHAR(256),
    "MESSAGE" text,
    "MESSAGE_FORMAT" VARCHAR(16),
    PRIMARY KEY ("NL_ID")
)"#
            ),
            format!(
                r#"CREATE UNIQUE INDEX "{log}_EVENT_ID" ON "{log}" USING btree ("EVENT_ID")"#
            ),
            format!(
                r#"CREATE TABLE "{seq}" (
    "NNI_ID" BIGINT NOT NULL,
    "NEXT_EVENT_ID" BIGINT NOT NULL,
    PRIMARY KEY ("NNI_ID")
)"#
            ),
            format!(
                r#"INSERT INTO "{seq}" ("NNI_ID", "NEXT_EVENT_ID") SELECT 1,1 WHERE NOT EXISTS ( SELECT "NEXT_EVENT_ID" FROM "{seq}")"#
            ),
            format!(
                r#"CREATE TABLE "{txn}" (
  "WNL_ID" bigint NOT NULL,
  "WNL_TXNID" bigint NOT NULL,
  "WNL_WRITEID" bigint NOT NULL,
  "WNL_DATABASE" varchar(128) NOT NULL,
  "WNL_TABLE" varchar(256) NOT NULL,
  "WNL_PARTITION" varchar(767) NOT NULL,
  "WNL_TABLE_OBJ" text NOT NULL,
  "WNL_PARTITION_OBJ" text,
  "WNL_FILES" text,
  "WNL_EVENT_TIME" integer NOT NULL,
  PRIMARY KEY ("WNL_TXNID", "WNL_DATABASE", "WNL_TABLE", "WNL_PARTITION")
)"#
            ),
        ],
        Kind::MariaDb => vec![
            format!(
                r#"CREATE TABLE IF NOT EXISTS `{log}`
(
    `NL_ID` BIGINT(20) NOT NULL,
    `EVENT_ID` BIGINT(20) NOT NULL,
    `EVENT_TIME` INT(11) NOT NULL,
    `EVENT_TYPE` varchar(32) NOT NULL,
    `CAT_NAME` varchar(256),
    `DB_NAME` varchar(128),
    `TBL_NAME` varchar(256),
    `MESSAGE` longtext,
    `MESSAGE_FORMAT` varchar(16),
    PRIMARY KEY (`NL_ID`)
) ENGINE=InnoDB DEFAULT CHARSET=latin1"#
            ),
            format!("CREATE UNIQUE INDEX `NOTIFICATION_LOG_EVENT_ID` ON `{log}` (`EVENT_ID`) USING BTREE"),
            format!(
                r#"CREATE TABLE IF NOT EXISTS `{seq}`
(
    `NNI_ID` BIGINT(20) NOT NULL,
    `NEXT_EVENT_ID` BIGINT(20) NOT NULL,
    PRIMARY KEY (`NNI_ID`)
) ENGINE=InnoDB DEFAULT CHARSET=latin1"#
            ),
            format!(
                "INSERT INTO `{seq}` (`NNI_ID`, `NEXT_EVENT_ID`) SELECT * from (select 1 as `NNI_ID`, 1 as `NOTIFICATION_SEQUENCE`) a WHERE (SELECT COUNT(*) FROM `{seq}`) = 0"
            ),
            format!(
                r#"CREATE TABLE {txn} (
  WNL_ID bigint NOT NULL,
  WNL_TXNID bigint NOT NULL,
  WNL_WRITEID bigint NOT NULL,
  WNL_DATABASE varchar(128) NOT NULL,
  WNL_TABLE varchar(256) NOT NULL,
  WNL_PARTITION varchar(767) NOT NULL,
  WNL_TABLE_OBJ longtext NOT NULL,
  WNL_PARTITION_OBJ longtext,
  WNL_FILES longtext,
  WNL_EVENT_TIME INT(11) NOT NULL,
  PRIMARY KEY (WNL_TXNID, WNL_DATABASE, WNL_TABLE, WNL_PARTITION)
) ENGINE=InnoDB DEFAULT CHARSET=latin1"#
            ),
        ],
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn which(program: &str) -> String {
    for dir in [
        "/usr/sbin",
        "/usr/bin",
        "/usr/local/sbin",
        "/usr/local/bin",
        "/sbin",
        "/bin",
    ] {
        let path = Path::new(dir).join(program);
        if path.exists() {
            return path.display().to_string();
        }
    }
    panic!("{program} not found: run scripts/setup.sh (installs mariadb-server)");
}

/// The newest /usr/lib/postgresql/N/bin.
fn postgres_bin_dir() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .expect("no /usr/lib/postgresql/*/bin/postgres: run scripts/setup.sh (installs postgresql)")
}

fn system_user(name: &str) -> (u32, u32) {
    let cname = std::ffi::CString::new(name).expect("user name");
    let pw = unsafe { libc::getpwnam(cname.as_ptr()) };
    assert!(
        !pw.is_null(),
        "no {name} user: PostgreSQL cannot run as root; run scripts/setup.sh"
    );
    unsafe { ((*pw).pw_uid, (*pw).pw_gid) }
}
