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
//! A file is read in parts of [`PART_BYTES`]: the part holding the offset
//! asked for, and up to [`PARTS_AHEAD`] parts after it set going at once
//! (each its own DataNode read, on the runtime) while the part before them
//! is copied, so the copy never waits for a round trip to a DataNode once
//! the first part is in. The copy still takes the bytes in order (`read_at`
//! from the start to the end), so the checksum is recomputed on them as
//! they come. A part is kept whole only if exactly its length came; a part
//! that fails (every replica of a block lost, a reset, no answer within
//! [`REQUEST_TIMEOUT`]) is asked again [`PART_ATTEMPTS`] times in all, then
//! the read fails and the stager retries the file. Memory: at most
//! `PARTS_AHEAD + 1` parts (40 MiB) per open file, so per fetch thread. A
//! read out of order (not at the part after the one copied) drops the
//! parts ahead and starts again from there.
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
use std::ops::Range;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use hdfs_native::{Client, ClientBuilder, HdfsError};

use super::{DirTree, Identity, SourceFile, SourceOpenError, Stamp, TreeEntry};

/// How long one request to a NameNode or DataNode may take before it is
/// an error (retried by the stager with backoff). Longer than the fetch
/// timeout's default, which abandons a fetch making no progress first; this
/// bound only ends the abandoned request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Bytes per DataNode read of a large file, and the largest file read in
/// one.
pub const PART_BYTES: u64 = 8 << 20;
/// Parts read ahead of the part being copied.
pub const PARTS_AHEAD: usize = 4;
/// Tries of one part before the read fails.
pub const PART_ATTEMPTS: u32 = 3;

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
    wait_at_most(REQUEST_TIMEOUT, fut)
}

fn wait_at_most<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<T, HdfsError>>,
) -> Result<T, RequestError> {
    let rt = runtime().map_err(RequestError::Runtime)?;
    rt.block_on(async { tokio::time::timeout(timeout, fut).await })
        .map_err(|_| RequestError::TimedOut(timeout))?
        .map_err(RequestError::Hdfs)
}

/// Lists the directory `uri` names, waiting at most `timeout`: the
/// number of entries in it. How `stagefs check` sees that an HDFS file
/// system is reachable with the settings and user a daemon would have.
pub fn list_dir(uri: &str, timeout: Duration) -> Result<usize, String> {
    let uri = HdfsUri::parse(uri)?;
    let client = client(&uri)?;
    wait_at_most(timeout, client.list_status(&uri.path, false))
        .map(|entries| entries.len())
        .map_err(|e| e.into_io(&uri.authority, "listing").to_string())
}

/// Why one request failed.
#[derive(Debug)]
enum RequestError {
    Runtime(String),
    TimedOut(Duration),
    Hdfs(HdfsError),
    /// An answer that is not what was asked for (a part of another length).
    BadAnswer(String),
}

impl RequestError {
    /// Worth asking again: not a file that is gone, nor a runtime that
    /// cannot run.
    fn is_transient(&self) -> bool {
        !matches!(
            self,
            RequestError::Runtime(_) | RequestError::Hdfs(HdfsError::FileNotFound(_))
        )
    }

    /// As an I/O error naming the server (`host:port` or nameservice).
    fn into_io(self, authority: &str, what: &str) -> io::Error {
        let (kind, text) = match self {
            RequestError::Runtime(e) => (io::ErrorKind::Other, e),
            RequestError::TimedOut(after) => (
                io::ErrorKind::TimedOut,
                format!("no answer within {} s", after.as_secs()),
            ),
            RequestError::Hdfs(HdfsError::IOError(e)) => (e.kind(), e.to_string()),
            RequestError::Hdfs(e) => (io::ErrorKind::Other, e.to_string()),
            RequestError::BadAnswer(e) => (io::ErrorKind::InvalidData, e),
        };
        io::Error::new(kind, format!("HDFS {authority}: {what}: {text}"))
    }
}

/// A file on HDFS opened for reading: its blocks as the NameNode listed
/// them at open, the identity it had then, and the parts being read.
pub struct HdfsFile {
    client: Client,
    uri: HdfsUri,
    reader: hdfs_native::file::FileReader,
    identity: Identity,
    parts: Mutex<Parts>,
}

/// One part's bytes as the DataNodes sent them (their packets, in order,
/// not copied into one buffer), exactly the part's length in all.
struct Part {
    chunks: Vec<Bytes>,
}

impl Part {
    /// Copies the part's bytes from `at` on into `buf`: how many (0 at or
    /// past its end).
    fn copy_to(&self, mut at: usize, buf: &mut [u8]) -> usize {
        let mut n = 0;
        for chunk in &self.chunks {
            if n == buf.len() {
                break;
            }
            if at >= chunk.len() {
                at -= chunk.len();
                continue;
            }
            let take = (chunk.len() - at).min(buf.len() - n);
            buf[n..n + take].copy_from_slice(&chunk[at..at + take]);
            n += take;
            at = 0;
        }
        n
    }
}

/// The part being copied and the reads in flight after it.
type Parts = super::parts::PartsAhead<Part, Result<Part, RequestError>>;

/// Reads bytes `range` of the file `reader` opened, as one part: refused
/// unless exactly that many bytes come within [`REQUEST_TIMEOUT`].
fn read_part(
    reader: &hdfs_native::file::FileReader,
    range: Range<usize>,
) -> impl Future<Output = Result<Part, RequestError>> + Send + 'static {
    // The stream owns what it needs (block list, connections): it outlives
    // the borrow of the reader, so it can run ahead on the runtime.
    let mut stream = reader.read_range_stream(range.start, range.len());
    async move {
        let want = range.len();
        let collect = async {
            let mut chunks = Vec::new();
            let mut got = 0usize;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(RequestError::Hdfs)?;
                got += chunk.len();
                if got > want {
                    break;
                }
                if !chunk.is_empty() {
                    chunks.push(chunk);
                }
            }
            if got != want {
                return Err(RequestError::BadAnswer(format!(
                    "bytes {}..{}: {got} bytes came",
                    range.start, range.end
                )));
            }
            Ok(Part { chunks })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, collect)
            .await
            .map_err(|_| RequestError::TimedOut(REQUEST_TIMEOUT))?
    }
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
            parts: Mutex::default(),
        })
    }

    /// Bytes of part `index`, clamped to the length at open.
    fn part_range(&self, index: u64) -> Range<usize> {
        let len = self.reader.file_length();
        let start = usize::try_from(index * PART_BYTES).map_or(len, |s| s.min(len));
        start..start.saturating_add(PART_BYTES as usize).min(len)
    }

    /// Part `index`, from the reads in flight (started here when not), with
    /// up to [`PARTS_AHEAD`] parts after it set going; a part that fails
    /// for a transient reason is asked again.
    fn fetch_part(&self, parts: &mut Parts, index: u64) -> Result<Part, RequestError> {
        let rt = runtime().map_err(RequestError::Runtime)?;
        let count = (self.reader.file_length() as u64).div_ceil(PART_BYTES);
        let ahead = parts.take(index, count, PARTS_AHEAD, |next| {
            Ok::<_, RequestError>(rt.spawn(read_part(&self.reader, self.part_range(next))))
        })?;
        let Some(task) = ahead else {
            return Err(RequestError::BadAnswer(format!(
                "part {index} is past the end"
            )));
        };
        // The task ends within REQUEST_TIMEOUT of its start; the wait is
        // bounded too, in case the runtime is starved.
        let mut outcome = rt
            .block_on(async { tokio::time::timeout(REQUEST_TIMEOUT, task).await })
            .map_err(|_| RequestError::TimedOut(REQUEST_TIMEOUT))
            .and_then(|joined| joined.map_err(|e| RequestError::Runtime(format!("part task: {e}"))))
            .and_then(|part| part);
        let mut attempt = 1;
        while let Err(e) = &outcome {
            if !e.is_transient() || attempt >= PART_ATTEMPTS {
                break;
            }
            tracing::debug!(uri = %self.uri.path, part = index, error = ?e, "HDFS part failed; asking again");
            std::thread::sleep(Duration::from_millis(200) * (1 << attempt));
            attempt += 1;
            outcome = rt.block_on(read_part(&self.reader, self.part_range(index)));
        }
        outcome
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

/// Every file below the directory `uri` (recursively), as its path below
/// the directory and its identity, sorted by path. A directory that does
/// not exist is an empty list.
pub fn list(uri: &str) -> Result<Vec<(String, Identity)>, String> {
    let parsed = HdfsUri::parse(uri.trim_end_matches('/'))?;
    let client = client(&parsed)?;
    let statuses = match wait(client.list_status(&parsed.path, true)) {
        Ok(s) => s,
        Err(RequestError::Hdfs(HdfsError::FileNotFound(_))) => return Ok(Vec::new()),
        Err(e) => {
            return Err(e
                .into_io(&parsed.authority, &format!("listing {}", parsed.path))
                .to_string())
        }
    };
    let below = format!("{}/", parsed.path);
    let mut out = Vec::new();
    for status in statuses.iter().filter(|s| !s.isdir) {
        if let Some(rel) = status.path.strip_prefix(&below) {
            out.push((rel.to_owned(), identity_of(status)));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The directory `uri` and everything below it ([`DirTree`]); None when
/// it does not exist. Each directory's modification time is asked again
/// after the recursive listing, so an entry created, deleted or renamed
/// while it ran moves a time that the caller sees.
pub fn list_tree(uri: &str) -> Result<Option<DirTree>, String> {
    let parsed = HdfsUri::parse(uri.trim_end_matches('/'))?;
    let client = client(&parsed)?;
    let failed = |e: RequestError, what: &str| {
        e.into_io(&parsed.authority, &format!("{what} {}", parsed.path))
            .to_string()
    };
    let statuses = match wait(client.list_status(&parsed.path, true)) {
        Ok(s) => s,
        Err(RequestError::Hdfs(HdfsError::FileNotFound(_))) => return Ok(None),
        Err(e) => return Err(failed(e, "listing")),
    };
    let below = format!("{}/", parsed.path);
    let mut entries = Vec::with_capacity(statuses.len());
    for status in &statuses {
        let Some(rel) = status.path.strip_prefix(&below) else {
            continue;
        };
        entries.push(TreeEntry {
            rel: rel.to_owned(),
            is_dir: status.isdir,
            size: status.length as u64,
            mtime_ms: i64::try_from(status.modification_time).unwrap_or(i64::MAX),
        });
    }
    for entry in entries.iter_mut().filter(|e| e.is_dir) {
        let path = format!("{below}{}", entry.rel);
        match wait(client.get_file_info(&path)) {
            Ok(now) => {
                let now_ms = i64::try_from(now.modification_time).unwrap_or(i64::MAX);
                entry.mtime_ms = entry.mtime_ms.max(now_ms);
            }
            // Gone since it was listed: a change after any event.
            Err(RequestError::Hdfs(HdfsError::FileNotFound(_))) => entry.mtime_ms = i64::MAX,
            Err(e) => return Err(failed(e, "asking the status of")),
        }
    }
    let dir = match wait(client.get_file_info(&parsed.path)) {
        Ok(dir) => dir,
        Err(RequestError::Hdfs(HdfsError::FileNotFound(_))) => return Ok(None),
        Err(e) => return Err(failed(e, "asking the status of")),
    };
    if !dir.isdir {
        return Err(format!("{uri} is not a directory"));
    }
    Ok(Some(DirTree {
        mtime_ms: i64::try_from(dir.modification_time).unwrap_or(i64::MAX),
        entries,
    }))
}

impl SourceFile for HdfsFile {
    fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Copies from the part holding `offset`, fetched (with the parts
    /// after it) when it is not the one in hand: at most up to that part's
    /// end. Clamped to the length at open (hdfs-native panics past it).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let len = self.reader.file_length() as u64;
        if offset >= len || buf.is_empty() {
            return Ok(0);
        }
        let index = offset / PART_BYTES;
        let mut parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
        if !matches!(&parts.current, Some((i, _)) if *i == index) {
            parts.current = None;
            let part = self.fetch_part(&mut parts, index).map_err(|e| {
                e.into_io(
                    &self.uri.authority,
                    &format!("read at {}", index * PART_BYTES),
                )
            })?;
            parts.current = Some((index, part));
        }
        let Some((_, part)) = &parts.current else {
            return Ok(0);
        };
        // Parts are checked to their exact length when they arrive, and
        // `offset` is below the file's length, so some byte is there.
        let n = part.copy_to((offset - index * PART_BYTES) as usize, buf);
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "HDFS {}: part {index} ends before byte {offset}",
                    self.uri.authority
                ),
            ));
        }
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
    fn a_part_copies_across_its_packets_from_any_offset() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let part = Part {
            chunks: vec![
                Bytes::copy_from_slice(&data[..300]),
                Bytes::copy_from_slice(&data[300..301]),
                Bytes::copy_from_slice(&data[301..]),
            ],
        };
        for (at, len) in [
            (0, 1000),
            (0, 10),
            (299, 5),
            (300, 1),
            (301, 699),
            (999, 64),
        ] {
            let mut buf = vec![0u8; len];
            let n = part.copy_to(at, &mut buf);
            let want = len.min(1000 - at);
            assert_eq!(n, want, "at {at}");
            assert_eq!(&buf[..n], &data[at..at + want], "at {at}");
        }
        assert_eq!(part.copy_to(1000, &mut [0u8; 8]), 0);
        assert_eq!(part.copy_to(5000, &mut [0u8; 8]), 0);
    }

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
