//! TLS to the metastore database against a private PostgreSQL and a
//! private MariaDB (tests/common/dbserver.rs) that offer TLS with a
//! certificate this test makes: a CA of its own signs a server certificate
//! issued for `localhost` only (not for the address 127.0.0.1), and a
//! second CA signs nothing.
//!
//! Each server kind: `verify-full` to `localhost` succeeds; `verify-ca`
//! to 127.0.0.1 succeeds (the chain is right, the name is not checked);
//! `verify-full` to 127.0.0.1 is refused naming the host, the other CA is
//! refused naming the CA file; `require` without a CA succeeds; and
//! `require` against a server started without TLS is refused saying the
//! server offers none, while `prefer` falls back to a plain connection.
//! The binary's own error (a `stagefs replicate` that cannot start) names
//! the refusal and never the password.
//!
//! The certificates come from the `openssl` command (scripts/setup.sh
//! installs it); the servers are stopped when each test ends, also on
//! panic.

#[path = "common/dbserver.rs"]
mod dbserver;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use dbserver::{DbServer, Kind, ServerTls, TableCase, PASSWORD, USER};
use stagefs::source::hive::metastore::{MetastoreSource, Timeouts};
use stagefs::source::hive::model::{RowSource, RowSourceError};

/// The test's CA, the server certificate it signed, and a CA that signed
/// nothing, as PEM files in a temp dir.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn make() -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("stagefs-pki-")
            .tempdir()
            .expect("temp dir");
        let pki = Pki { dir };
        pki.make_ca("ca");
        pki.make_ca("other-ca");
        let p = |name: &str| pki.path(name).display().to_string();
        openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &p("server.key"),
            "-subj",
            "/CN=localhost",
            "-out",
            &p("server.csr"),
        ]);
        std::fs::write(
            pki.path("server.ext"),
            "subjectAltName=DNS:localhost\nbasicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .expect("extensions file");
        openssl(&[
            "x509",
            "-req",
            "-in",
            &p("server.csr"),
            "-CA",
            &p("ca.pem"),
            "-CAkey",
            &p("ca.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &p("server.ext"),
            "-out",
            &p("server.pem"),
        ]);
        pki
    }

    fn make_ca(&self, name: &str) {
        let p = |file: String| self.path(&file).display().to_string();
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &p(format!("{name}.key")),
            "-out",
            &p(format!("{name}.pem")),
            "-days",
            "2",
            "-subj",
            &format!("/CN=stagefs test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn server(&self) -> ServerTls {
        ServerTls {
            cert: self.path("server.pem"),
            key: self.path("server.key"),
        }
    }
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("run openssl (scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const DB: &str = "metastore";

fn url(server: &DbServer, host: &str, params: &str) -> String {
    let scheme = match server.kind {
        Kind::Postgres => "postgresql",
        Kind::MariaDb => "mysql",
    };
    format!("{scheme}://{USER}@{host}:{}/{DB}?{params}", server.port())
}

/// The TLS parameters in each client's words.
fn params(kind: Kind, mode: &str, ca: Option<&Path>) -> String {
    let (mode_key, ca_key, mode) = match kind {
        Kind::Postgres => ("sslmode", "sslrootcert", mode.to_string()),
        Kind::MariaDb => (
            "ssl-mode",
            "ssl-ca",
            match mode {
                "disable" => "DISABLED",
                "prefer" => "PREFERRED",
                "require" => "REQUIRED",
                "verify-ca" => "VERIFY_CA",
                "verify-full" => "VERIFY_IDENTITY",
                other => panic!("{other}"),
            }
            .to_string(),
        ),
    };
    match ca {
        Some(ca) => format!("{mode_key}={mode}&{ca_key}={}", ca.display()),
        None => format!("{mode_key}={mode}"),
    }
}

fn open(url: &str) -> Result<MetastoreSource, RowSourceError> {
    MetastoreSource::open(
        url,
        Some(PASSWORD.into()),
        Timeouts {
            connect: Duration::from_secs(5),
            statement: Duration::from_secs(10),
        },
    )
}

/// Opens and reads the newest event id: the connection really works.
fn works(url: &str) {
    let mut source = open(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    assert!(source.is_connected(), "{url}: not connected");
    assert_eq!(
        source
            .newest_event_id()
            .unwrap_or_else(|e| panic!("{url}: {e}")),
        Some(0),
        "{url}"
    );
}

/// Opening fails at once as Fatal; the message (without the password).
fn refused(url: &str) -> String {
    match open(url) {
        Err(e @ RowSourceError::Fatal(_)) => {
            let text = format!("{e} {e:?}");
            assert!(!text.contains(PASSWORD), "password in: {text}");
            e.to_string()
        }
        Err(other) => panic!("{url}: expected a fatal refusal, got {other:?}"),
        Ok(source) => panic!("{url}: connected ({source:?})"),
    }
}

fn tls_matrix(kind: Kind) {
    let pki = Pki::make();
    let ca = pki.path("ca.pem");
    let other_ca = pki.path("other-ca.pem");
    let server = DbServer::start_with_tls(kind, pki.server());
    server.create_metastore(DB, TableCase::Upper);

    // The certificate names localhost: verify-full there works.
    works(&url(
        &server,
        "localhost",
        &params(kind, "verify-full", Some(&ca)),
    ));
    // verify-ca checks the chain only: the address works too.
    works(&url(
        &server,
        "127.0.0.1",
        &params(kind, "verify-ca", Some(&ca)),
    ));
    // require (and the default, prefer) encrypt without checking.
    works(&url(&server, "127.0.0.1", &params(kind, "require", None)));
    works(&url(&server, "127.0.0.1", &params(kind, "prefer", None)));
    works(&url(&server, "127.0.0.1", &params(kind, "disable", None)));

    // Wrong host name: the certificate is not issued for 127.0.0.1.
    let text = refused(&url(
        &server,
        "127.0.0.1",
        &params(kind, "verify-full", Some(&ca)),
    ));
    assert!(
        text.contains("certificate refused") && text.contains("not issued for \"127.0.0.1\""),
        "{text}"
    );
    // Wrong CA: named in the message.
    for host in ["localhost", "127.0.0.1"] {
        let text = refused(&url(
            &server,
            host,
            &params(kind, "verify-ca", Some(&other_ca)),
        ));
        assert!(
            text.contains("not signed by a CA in") && text.contains("other-ca.pem"),
            "{text}"
        );
    }
    let text = refused(&url(
        &server,
        "localhost",
        &params(kind, "verify-full", Some(&other_ca)),
    ));
    assert!(text.contains("not signed by a CA in"), "{text}");

    // The binary: its error names the refusal, and never the password.
    let state = tempfile::tempdir().expect("state dir");
    let out = Command::new(env!("CARGO_BIN_EXE_stagefs"))
        .args(["replicate", "--state"])
        .arg(state.path())
        .arg("--hive-metastore")
        .arg(url(
            &server,
            "127.0.0.1",
            &params(kind, "verify-full", Some(&other_ca)),
        ))
        .env("STAGEFS_METASTORE_PASSWORD", PASSWORD)
        .env("STAGEFS_LOG", "debug")
        .output()
        .expect("run stagefs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "replicate started: {stderr}");
    assert!(stderr.contains("certificate refused"), "{stderr}");
    assert!(
        !stderr.contains(PASSWORD) && !stdout.contains(PASSWORD),
        "password in the output: {stderr}{stdout}"
    );
}

fn without_tls(kind: Kind) {
    let server = DbServer::start(kind);
    server.create_metastore(DB, TableCase::Upper);
    let text = refused(&url(&server, "127.0.0.1", &params(kind, "require", None)));
    assert!(
        text.contains("does not offer TLS") && text.contains("requires it"),
        "{text}"
    );
    let pki = Pki::make();
    let text = refused(&url(
        &server,
        "localhost",
        &params(kind, "verify-full", Some(&pki.path("ca.pem"))),
    ));
    assert!(text.contains("does not offer TLS"), "{text}");
    // prefer (the default) falls back to a plain connection.
    works(&url(&server, "127.0.0.1", &params(kind, "prefer", None)));
    works(&server.url(DB));
}

#[test]
fn postgres_tls_verify_full_works_and_wrong_ca_or_host_is_refused() {
    tls_matrix(Kind::Postgres);
}

#[test]
fn mariadb_tls_verify_identity_works_and_wrong_ca_or_host_is_refused() {
    tls_matrix(Kind::MariaDb);
}

#[test]
fn postgres_require_against_a_server_without_tls_is_refused() {
    without_tls(Kind::Postgres);
}

#[test]
fn mariadb_require_against_a_server_without_tls_is_refused() {
    without_tls(Kind::MariaDb);
}
