//! Reading a file on HDFS where it is (SPEC §2 "Source files where Hive
//! keeps them: HDFS and S3"): `hdfs://host:port/path` or the nameservice
//! form `hdfs://ns1/path`, through the native client `hdfs-native` (no
//! JVM, no libhdfs).
//!
//! Cluster settings come from where Hadoop clients take them: the client
//! reads `core-site.xml` and `hdfs-site.xml` from `HADOOP_CONF_DIR` (else
//! `$HADOOP_HOME/etc/hadoop`), so nameservices and NameNode HA resolve as
//! they do for `hdfs dfs`; the user is `HADOOP_USER_NAME` (else the login
//! user). Kerberos (`hadoop.security.authentication=kerberos`) goes through
//! the system's GSSAPI library (`libgssapi_krb5.so.2`, loaded when first
//! needed) with the ticket cache, as Hadoop clients do.
//!
//! One client per file system (scheme and authority), made on first use
//! and shared by every file read from it afterwards: a client holds the
//! NameNode connection. The client is asynchronous; it runs on a small
//! runtime owned by this module, and the store's fetch threads (plain
//! threads) wait on each request with `block_on`, each request bounded by
//! [`REQUEST_TIMEOUT`].
//!
//! Every read is clamped to the file's length as the NameNode gave it when
//! the file was opened: `hdfs-native` panics on a range past the end. The
//! identity is the length, the modification time and the block size; the
//! store compares it before and after the copy (`identity_now` asks the
//! NameNode again), so a file rewritten while it was read (an INSERT
//! OVERWRITE reusing `000000_0`) is not a usable copy, and a read cut short
//! is an error, never a short file.
//!
//! Called through [`super::Location::open`] by the blob store's fetch.

use std::collections::HashMap;
use std::fs::File;
use std::future::Future;
use std::io;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use hdfs_native::{Client, ClientBuilder, HdfsError};

use super::{Identity, SourceFile, SourceOpenError, Stamp};

/// How long one request to a NameNode or DataNode may take before it is
/// an error (retried by the stager with backoff). Longer than the fetch
/// timeout's default, which abandons a fetch making no progress first; this
/// bound only ends the abandoned request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A file URI on HDFS, split into the file system the client is made for
/// (`hdfs://host:port` or `hdfs://ns1`) and the path in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HdfsUri {
    /// `hdfs://` and the authority as written (host and port, or a
    /// nameservice): what one client serves.
    pub file_system: String,
    /// The authority alone (`host:port` or the nameservice), for messages.
    pub authority: String,
    /// Absolute path, no empty, `.` or `..` component.
    pub path: String,
}

impl HdfsUri {
    /// True when `uri` names a file on HDFS (`hdfs://`, any case), well
    /// formed or not ([`HdfsUri::parse`] says).
    pub fn is_hdfs(uri: &str) -> bool {
        uri.get(..7)
            .is_some_and(|s| s.eq_ignore_ascii_case("hdfs://"))
    }

    /// Splits `hdfs://authority/path`. Refused: another scheme, no
    /// authority, user info in it (the user comes from `HADOOP_USER_NAME`),
    /// a query or fragment, a path that is not absolute or has an empty,
    /// `.` or `..` component.
    pub fn parse(uri: &str) -> Result<HdfsUri, String> {
        if !HdfsUri::is_hdfs(uri) {
            return Err(format!("`{uri}` is not an hdfs:// URI"));
        }
        let rest = &uri[7..];
        let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
        if authority.is_empty() {
            return Err(format!("`{uri}` names no NameNode or nameservice"));
        }
        if authority.contains('@') {
            return Err(format!(
                "`{uri}` has user info; the HDFS user comes from HADOOP_USER_NAME"
            ));
        }
        if path.contains(['?', '#', '\0']) {
            return Err(format!("`{uri}` has a query, fragment or NUL in its path"));
        }
        if path.is_empty()
            || path[1..]
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(format!(
                "`{uri}`: the path must be absolute, without empty, `.` or `..` components"
            ));
        }
        Ok(HdfsUri {
            file_system: format!("hdfs://{authority}"),
            authority: authority.to_owned(),
            path: path.to_owned(),
        })
    }
}

/// The runtime every HDFS client runs on: two workers, enough for the
/// connections of a few fetch threads (the work is I/O).
fn runtime() -> Result<&'static tokio::runtime::Runtime, String> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("stagefs-hdfs")
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the HDFS client runtime: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The client for `uri`'s file system: made once, then shared. A client
/// that cannot be made (bad settings) is not kept, so a corrected
/// `HADOOP_CONF_DIR` is seen at the next try after a restart.
fn client(uri: &HdfsUri) -> Result<Client, String> {
    static CLIENTS: OnceLock<Mutex<HashMap<String, Client>>> = OnceLock::new();
    let clients = CLIENTS.get_or_init(Mutex::default);
    let mut clients = clients.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = clients.get(&uri.file_system) {
        return Ok(c.clone());
    }
    let rt = runtime()?;
    let made = ClientBuilder::new()
        .with_url(&uri.file_system)
        .with_io_runtime(rt.handle().clone())
        .build()
        .map_err(|e| format!("HDFS {}: cannot make a client: {e}", uri.authority))?;
    clients.insert(uri.file_system.clone(), made.clone());
    Ok(made)
}

/// Runs one request on the HDFS runtime, waiting at most
/// [`REQUEST_TIMEOUT`].
fn wait<T>(fut: impl Future<Output = Result<T, HdfsError>>) -> Result<T, RequestError> {
    let rt = runtime().map_err(RequestError::Runtime)?;
    rt.block_on(async { tokio::time::timeout(REQUEST_TIMEOUT, fut).await })
        .map_err(|_| RequestError::TimedOut)?
        .map_err(RequestError::Hdfs)
}

/// Why one request failed.
#[derive(Debug)]
enum RequestError {
    Runtime(String),
    TimedOut,
    Hdfs(HdfsError),
}

impl RequestError {
    /// As an I/O error naming the server (`host:port` or nameservice).
    fn into_io(self, authority: &str, what: &str) -> io::Error {
        let (kind, text) = match self {
            RequestError::Runtime(e) => (io::ErrorKind::Other, e),
            RequestError::TimedOut => (
                io::ErrorKind::TimedOut,
                format!("no answer within {} s", REQUEST_TIMEOUT.as_secs()),
            ),
            RequestError::Hdfs(HdfsError::IOError(e)) => (e.kind(), e.to_string()),
            RequestError::Hdfs(e) => (io::ErrorKind::Other, e.to_string()),
        };
        io::Error::new(kind, format!("HDFS {authority}: {what}: {text}"))
    }
}

/// A file on HDFS opened for reading: its blocks as the NameNode listed
/// them at open, and the identity it had then.
pub struct HdfsFile {
    client: Client,
    uri: HdfsUri,
    reader: hdfs_native::file::FileReader,
    identity: Identity,
}

impl std::fmt::Debug for HdfsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HdfsFile")
            .field("uri", &self.uri)
            .field("identity", &self.identity)
            .finish()
    }
}

impl HdfsFile {
    /// Opens `uri`: its status (a regular file, else refused), then its
    /// block list. A file whose length changed between the two is
    /// refused (it is being written).
    pub fn open(uri: &str) -> Result<HdfsFile, SourceOpenError> {
        let uri = HdfsUri::parse(uri)
            .map_err(|e| SourceOpenError::Io(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        let client = client(&uri).map_err(|e| SourceOpenError::Io(io::Error::other(e)))?;
        let status = match wait(client.get_file_info(&uri.path)) {
            Ok(status) => status,
            Err(RequestError::Hdfs(HdfsError::FileNotFound(_))) => {
                return Err(SourceOpenError::Missing)
            }
            Err(e) => return Err(SourceOpenError::Io(e.into_io(&uri.authority, "stat"))),
        };
        if status.isdir {
            return Err(SourceOpenError::NotRegular("directory"));
        }
        let identity = identity_of(&status);
        let reader = match wait(client.read(&uri.path)) {
            Ok(reader) => reader,
            Err(RequestError::Hdfs(HdfsError::FileNotFound(_))) => {
                return Err(SourceOpenError::Missing)
            }
            Err(e) => return Err(SourceOpenError::Io(e.into_io(&uri.authority, "open"))),
        };
        if reader.file_length() as u64 != identity.size {
            return Err(SourceOpenError::Io(io::Error::other(format!(
                "HDFS {}: the length changed while opening ({} then {}): being written",
                uri.authority,
                identity.size,
                reader.file_length()
            ))));
        }
        Ok(HdfsFile {
            client,
            uri,
            reader,
            identity,
        })
    }
}

/// The identity of a file from its HDFS status.
fn identity_of(status: &hdfs_native::client::FileStatus) -> Identity {
    Identity {
        size: status.length as u64,
        mtime_ns: i64::try_from(status.modification_time)
            .unwrap_or(i64::MAX)
            .saturating_mul(1_000_000),
        stamp: Stamp::Hdfs {
            block_size: status.blocksize.unwrap_or(0),
        },
    }
}

impl SourceFile for HdfsFile {
    fn identity(&self) -> &Identity {
        &self.identity
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        // Clamped to the length at open: hdfs-native panics past the end.
        let len = self.reader.file_length() as u64;
        if offset >= len || buf.is_empty() {
            return Ok(0);
        }
        let n = (len - offset).min(buf.len() as u64) as usize;
        let offset = usize::try_from(offset).map_err(io::Error::other)?;
        wait(self.reader.read_range_buf(&mut buf[..n], offset))
            .map_err(|e| e.into_io(&self.uri.authority, &format!("read at {offset}")))?;
        Ok(n)
    }

    fn identity_now(&self) -> io::Result<Identity> {
        wait(self.client.get_file_info(&self.uri.path))
            .map(|status| identity_of(&status))
            .map_err(|e| e.into_io(&self.uri.authority, "stat"))
    }

    fn local_file(&self) -> Option<&File> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_split_into_file_system_and_path() {
        let u = HdfsUri::parse("hdfs://nn1:8020/warehouse/t/000000_0").unwrap();
        assert_eq!(u.file_system, "hdfs://nn1:8020");
        assert_eq!(u.authority, "nn1:8020");
        assert_eq!(u.path, "/warehouse/t/000000_0");
        let ns = HdfsUri::parse("HDFS://ns1/wh/f").unwrap();
        assert_eq!(ns.file_system, "hdfs://ns1");
        assert_eq!(ns.path, "/wh/f");
    }

    #[test]
    fn malformed_hdfs_uris_are_refused() {
        for uri in [
            "s3a://b/k",
            "hdfs:///wh/f",
            "hdfs://nn",
            "hdfs://nn/",
            "hdfs://nn/wh/../etc/passwd",
            "hdfs://nn/wh//f",
            "hdfs://nn/wh/./f",
            "hdfs://hive@nn/wh/f",
            "hdfs://nn/wh/f?x=1",
        ] {
            assert!(HdfsUri::parse(uri).is_err(), "{uri}");
        }
    }
}
