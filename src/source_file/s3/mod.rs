//! Reading a file on S3 (or an S3-compatible store) where it is (SPEC §2
//! "Source files where Hive keeps them: HDFS and S3"): `s3a://bucket/key`
//! and `s3://bucket/key`, through Apache Arrow's `object_store`
//! (`AmazonS3`).
//!
//! Settings ([`S3Settings::from_environment`]) come from where AWS clients
//! take them: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`; else the static keys of the profile `AWS_PROFILE`
//! (else `default`) in `~/.aws/credentials` and `~/.aws/config`
//! (`AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`); else whatever
//! `object_store` finds itself (web identity, ECS container credentials,
//! EC2 instance metadata). The region from `AWS_REGION`, then
//! `AWS_DEFAULT_REGION`, then the profile, else `us-east-1`. The endpoint
//! from `--s3-endpoint`, then `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the
//! profile's `endpoint_url`; a custom endpoint is addressed path-style and
//! may be `http://`. No secret is ever part of a message: the settings'
//! `Debug` hides them and errors name only the server (`host:port`).
//!
//! One client per bucket of an [`S3Access`], made on first use. The client
//! is asynchronous; it runs on a small runtime owned by this module, and
//! the store's fetch threads (plain threads) wait on each request with
//! `block_on`, each request bounded by the settings' `request_timeout`
//! (the daemon's `--fetch-timeout`).
//!
//! A file is read as one object version, never a mix:
//! - the first GET (no range) gives the object's size, last-modified time,
//!   ETag and version id (the [`Identity`]); an object of at most
//!   [`PART_BYTES`] comes whole in that one response;
//! - a larger one is read in parts of [`PART_BYTES`], up to [`PARTS_AHEAD`]
//!   ranged GETs in flight ahead of the part being copied, each
//!   conditional on the ETag (`If-Match`) and, in a versioned bucket,
//!   pinned to the version id read first; a part that comes back with
//!   another ETag or length is refused. An object rewritten while read (an
//!   INSERT OVERWRITE reusing `000000_0`) makes the read fail (412), never a
//!   copy of two contents. Memory: at most `PARTS_AHEAD + 1` parts
//!   (40 MiB) per open file, so per fetch thread.
//! - `object_store` retries a request that fails with `503 SlowDown`, 5xx,
//!   a reset or an unreachable endpoint (backoff from 100 ms, at most
//!   [`CLIENT_RETRIES`] times, within the request timeout) and resumes a
//!   body cut short; a part that still fails is asked again
//!   [`PART_ATTEMPTS`] times in all, then the read fails naming the server
//!   and the error, and the stager retries the file with its own backoff.
//!
//! A file without a checksum whose current object is newer than its event
//! may still be read as it was at the event when the bucket keeps
//! versions ([`S3File::open_as_of`]): the versions of its key are listed
//! ([`versions`], ListObjectVersions, which `object_store` does not
//! offer), the one current at the moment chosen, and that version read
//! exactly as above, every part pinned to its version id.
//!
//! Called through [`super::Location::open_with`] and
//! [`super::Location::open_as_of`] by the blob store's fetch.

pub mod versions;

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::future::Future;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::client::HttpClient;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectMeta, ObjectStore, RetryConfig,
};
use sha2::{Digest, Sha256};

use super::{Identity, SourceFile, SourceOpenError, Stamp};

/// Bytes per ranged GET of a large object, and the largest object read in
/// one response.
pub const PART_BYTES: u64 = 8 << 20;
/// Ranged GETs in flight ahead of the part being copied.
pub const PARTS_AHEAD: usize = 4;
/// Tries of one part (each itself retried by the client).
pub const PART_ATTEMPTS: u32 = 3;
/// Retries of one request inside `object_store` (503, 5xx, resets,
/// connection refused), with backoff from 100 ms doubling to 2 s.
pub const CLIENT_RETRIES: usize = 4;
/// The request timeout when none is given (the fetch timeout's default).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A file URI on S3: `s3a://bucket/key` or `s3://bucket/key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Uri {
    pub bucket: String,
    /// The object key: no leading `/`, no empty, `.` or `..` component.
    pub key: String,
}

impl S3Uri {
    /// True when `uri` names an object on S3 (`s3://` or `s3a://`, any
    /// case), well formed or not ([`S3Uri::parse`] says).
    pub fn is_s3(uri: &str) -> bool {
        let lower = |n: usize| uri.get(..n).map(str::to_ascii_lowercase);
        lower(5).as_deref() == Some("s3://") || lower(6).as_deref() == Some("s3a://")
    }

    /// Splits `s3a://bucket/key`. Refused: another scheme, no bucket, a
    /// bucket name with characters S3 does not allow, user info (old
    /// Hadoop put secrets there: never echoed), a query, fragment or
    /// control character, a key with an empty, `.` or `..` component or
    /// ending in `/` (a directory marker, not a file).
    pub fn parse(uri: &str) -> Result<S3Uri, String> {
        if !S3Uri::is_s3(uri) {
            return Err(format!("`{uri}` is not an s3:// or s3a:// URI"));
        }
        let rest = &uri[uri.find("://").map_or(0, |i| i + 3)..];
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.contains('@') {
            // The part before `@` may be an access key and its secret.
            return Err("an s3 URI with user info (credentials in the URI are refused and not shown; use the AWS environment or profile)".into());
        }
        // AWS wants 3 to 63 characters; S3-compatible stores are laxer.
        if bucket.is_empty()
            || bucket.len() > 255
            || !bucket
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        {
            return Err(format!("`{uri}`: `{bucket}` is not a bucket name"));
        }
        if key.contains(['?', '#']) || key.chars().any(|c| c.is_control()) {
            return Err(format!(
                "`{uri}` has a query, fragment or control character in its key"
            ));
        }
        if key.is_empty()
            || key
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(format!(
                "`{uri}`: the key must name a file, without empty, `.` or `..` components"
            ));
        }
        Ok(S3Uri {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        })
    }
}

/// A secret (key or token): shown nowhere, not even in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<secret>")
    }
}

/// Static credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
}

/// Where and as whom S3 is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Settings {
    /// A custom endpoint (`http://host:port` or `https://…`), addressed
    /// path-style; None: AWS itself, virtual-hosted style.
    pub endpoint: Option<String>,
    pub region: String,
    /// None: `object_store`'s own providers (web identity, container,
    /// instance metadata).
    pub credentials: Option<Credentials>,
    /// Bound on one request, retries included (`--fetch-timeout`).
    pub request_timeout: Duration,
    /// Where the settings came from, for messages (`environment`,
    /// `profile NAME`): never a value.
    pub source: String,
}

/// The environment variables that may be read, as a function (tests pass
/// their own).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

impl S3Settings {
    /// The settings an AWS client would use here (module docs), with
    /// `endpoint` (`--s3-endpoint`) first when given.
    pub fn from_environment(endpoint: Option<&str>, request_timeout: Duration) -> S3Settings {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        S3Settings::from_env_with(&env, endpoint, request_timeout)
    }

    /// [`S3Settings::from_environment`] reading variables through `env`.
    pub fn from_env_with(
        env: Env<'_>,
        endpoint: Option<&str>,
        request_timeout: Duration,
    ) -> S3Settings {
        let profile_name = env("AWS_PROFILE").unwrap_or_else(|| "default".to_owned());
        let home = env("HOME").map(PathBuf::from);
        let file = |var: &str, default: &str| {
            env(var)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(".aws").join(default)))
        };
        let profile = Profile::read(
            &profile_name,
            file("AWS_SHARED_CREDENTIALS_FILE", "credentials").as_deref(),
            file("AWS_CONFIG_FILE", "config").as_deref(),
        );
        let (credentials, source) = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            (Some(id), Some(secret)) => (
                Some(Credentials {
                    access_key_id: id,
                    secret_access_key: Secret(secret),
                    session_token: env("AWS_SESSION_TOKEN").map(Secret),
                }),
                "environment".to_owned(),
            ),
            _ => match (
                profile.get("aws_access_key_id"),
                profile.get("aws_secret_access_key"),
            ) {
                (Some(id), Some(secret)) => (
                    Some(Credentials {
                        access_key_id: id.clone(),
                        secret_access_key: Secret(secret.clone()),
                        session_token: profile.get("aws_session_token").cloned().map(Secret),
                    }),
                    format!("profile {profile_name}"),
                ),
                _ => (None, "object_store's credential providers".to_owned()),
            },
        };
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| profile.get("region").cloned())
            .unwrap_or_else(|| "us-east-1".to_owned());
        let endpoint = endpoint
            .map(str::to_owned)
            .or_else(|| env("AWS_ENDPOINT_URL_S3"))
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .or_else(|| profile.get("endpoint_url").cloned());
        S3Settings {
            endpoint,
            region,
            credentials,
            request_timeout,
            source,
        }
    }

    /// The server requests go to, for messages: the endpoint's `host:port`,
    /// or AWS's regional endpoint.
    pub fn server(&self) -> String {
        match &self.endpoint {
            Some(e) => {
                let rest = e.split_once("://").map_or(e.as_str(), |(_, r)| r);
                let host = rest.split('/').next().unwrap_or(rest);
                // Never a user-info part (`user:secret@host`).
                host.rsplit('@').next().unwrap_or(host).to_owned()
            }
            None => format!("s3.{}.amazonaws.com:443", self.region),
        }
    }
}

/// The keys of one profile in the AWS shared files: the credentials file
/// (`[NAME]`) first, the config file (`[profile NAME]`, or `[default]`)
/// after. Only plain `key = value` lines; a missing file is no profile.
struct Profile(HashMap<String, String>);

impl Profile {
    fn read(name: &str, credentials: Option<&Path>, config: Option<&Path>) -> Profile {
        let mut keys = HashMap::new();
        let config_section = if name == "default" {
            "default".to_owned()
        } else {
            format!("profile {name}")
        };
        for (path, section) in [(credentials, name.to_owned()), (config, config_section)] {
            let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
                continue;
            };
            let mut inside = false;
            for line in text.lines() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                    continue;
                }
                if let Some(head) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                    inside = head.trim() == section;
                    continue;
                }
                if let (true, Some((k, v))) = (inside, line.split_once('=')) {
                    keys.entry(k.trim().to_ascii_lowercase())
                        .or_insert_with(|| v.trim().to_owned());
                }
            }
        }
        Profile(keys)
    }

    fn get(&self, key: &str) -> Option<&String> {
        self.0.get(key).filter(|v| !v.is_empty())
    }
}

/// S3 as one set of [`S3Settings`] reaches it: the settings and a client
/// per bucket, made on first use and shared by every file read afterwards.
#[derive(Debug)]
pub struct S3Access {
    settings: S3Settings,
    clients: Mutex<HashMap<String, Arc<AmazonS3>>>,
    /// For the requests `object_store` does not make ([`versions`]).
    http: Mutex<Option<HttpClient>>,
}

impl S3Access {
    pub fn new(settings: S3Settings) -> S3Access {
        S3Access {
            settings,
            clients: Mutex::default(),
            http: Mutex::default(),
        }
    }

    /// The access of the process's own environment, with the default
    /// request timeout: for a caller given no settings.
    pub fn from_process_environment() -> Arc<S3Access> {
        static DEFAULT: OnceLock<Arc<S3Access>> = OnceLock::new();
        Arc::clone(DEFAULT.get_or_init(|| {
            Arc::new(S3Access::new(S3Settings::from_environment(
                None,
                DEFAULT_REQUEST_TIMEOUT,
            )))
        }))
    }

    pub fn settings(&self) -> &S3Settings {
        &self.settings
    }

    /// The client of `bucket`. One that cannot be made (bad settings) is
    /// not kept.
    pub fn client(&self, bucket: &str) -> Result<Arc<AmazonS3>, String> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = clients.get(bucket) {
            return Ok(Arc::clone(c));
        }
        let s = &self.settings;
        let timeout = s.request_timeout.max(Duration::from_millis(100));
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_region(&s.region)
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(2),
                    base: 2.0,
                },
                max_retries: CLIENT_RETRIES,
                retry_timeout: timeout,
            });
        if let Some(endpoint) = &s.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_virtual_hosted_style_request(false);
        }
        if let Some(c) = &s.credentials {
            builder = builder
                .with_access_key_id(&c.access_key_id)
                .with_secret_access_key(&c.secret_access_key.0);
            if let Some(token) = &c.session_token {
                builder = builder.with_token(&token.0);
            }
        }
        let made = Arc::new(
            builder
                .with_client_options(self.client_options())
                .build()
                .map_err(|e| format!("S3 {}: cannot make a client: {e}", s.server()))?,
        );
        clients.insert(bucket.to_owned(), Arc::clone(&made));
        Ok(made)
    }
}

impl S3Access {
    /// The HTTP options of every request: the request timeout (at least
    /// 100 ms), a connect timeout of at most 10 s, `http://` for an
    /// endpoint that says so.
    fn client_options(&self) -> ClientOptions {
        let s = &self.settings;
        let timeout = s.request_timeout.max(Duration::from_millis(100));
        let options = ClientOptions::new()
            .with_timeout(timeout)
            .with_connect_timeout(timeout.min(Duration::from_secs(10)));
        match &s.endpoint {
            Some(endpoint) => options.with_allow_http(endpoint.starts_with("http://")),
            None => options,
        }
    }
}

/// The runtime every S3 client runs on: two workers, enough for the
/// requests of a few fetch threads (the work is I/O).
fn runtime() -> Result<&'static tokio::runtime::Runtime, String> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("stagefs-s3")
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the S3 client runtime: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Why one request failed.
#[derive(Debug)]
enum RequestError {
    Runtime(String),
    TimedOut(Duration),
    /// The object no longer has the ETag or version read first.
    Changed(String),
    /// The answer is not what was asked for (length, range, a listing
    /// that cannot be read).
    BadAnswer(String),
    Store(object_store::Error),
    /// A request made here rather than by `object_store` ([`versions`])
    /// got no answer: the connection failed, was reset or timed out.
    Http(String),
    /// A request made here was answered with an error: its HTTP status
    /// and S3 error code (empty when the body has none).
    Status {
        status: u16,
        code: String,
    },
}

impl RequestError {
    /// Worth asking again: not an answer that will stay the same.
    fn is_transient(&self) -> bool {
        match self {
            RequestError::TimedOut(_) | RequestError::BadAnswer(_) | RequestError::Http(_) => true,
            RequestError::Status { status, .. } => *status >= 500 || matches!(status, 408 | 429),
            RequestError::Runtime(_) | RequestError::Changed(_) => false,
            RequestError::Store(e) => !matches!(
                e,
                object_store::Error::NotFound { .. }
                    | object_store::Error::Precondition { .. }
                    | object_store::Error::NotModified { .. }
                    | object_store::Error::InvalidPath { .. }
            ),
        }
    }

    /// As an I/O error naming the server (`host:port`).
    fn into_io(self, server: &str, what: &str) -> io::Error {
        let (kind, text) = match self {
            RequestError::Runtime(e) => (io::ErrorKind::Other, e),
            RequestError::TimedOut(after) => (
                io::ErrorKind::TimedOut,
                format!("no answer within {} s", after.as_secs_f64()),
            ),
            RequestError::Changed(e) => {
                (io::ErrorKind::Other, format!("changed while reading: {e}"))
            }
            RequestError::BadAnswer(e) => (io::ErrorKind::InvalidData, e),
            RequestError::Http(e) => (io::ErrorKind::Other, e),
            RequestError::Status { status, code } => (
                match status {
                    401 | 403 => io::ErrorKind::PermissionDenied,
                    404 => io::ErrorKind::NotFound,
                    _ => io::ErrorKind::Other,
                },
                match code.as_str() {
                    "" => format!("answered {status}"),
                    code => format!("answered {status} {code}"),
                },
            ),
            RequestError::Store(object_store::Error::Precondition { .. }) => (
                io::ErrorKind::Other,
                "changed while reading: the ETag read first no longer matches (412)".to_owned(),
            ),
            RequestError::Store(e @ object_store::Error::NotFound { .. }) => {
                (io::ErrorKind::NotFound, with_causes(&e))
            }
            RequestError::Store(e @ object_store::Error::PermissionDenied { .. })
            | RequestError::Store(e @ object_store::Error::Unauthenticated { .. }) => {
                (io::ErrorKind::PermissionDenied, with_causes(&e))
            }
            RequestError::Store(e) => (io::ErrorKind::Other, with_causes(&e)),
        };
        io::Error::new(kind, format!("S3 {server}: {what}: {text}"))
    }
}

/// An error and the causes below it (`error sending request: … :
/// Connection refused`), each once, on one line.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Runs `fut` on the S3 runtime, waiting at most `timeout`.
fn wait<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<T, RequestError>>,
) -> Result<T, RequestError> {
    let rt = runtime().map_err(RequestError::Runtime)?;
    rt.block_on(async { tokio::time::timeout(timeout, fut).await })
        .map_err(|_| RequestError::TimedOut(timeout))?
}

/// An ETag without quotes or weak prefix, for comparing.
pub fn bare_etag(etag: &str) -> &str {
    let e = etag.trim();
    let e = e.strip_prefix("W/").unwrap_or(e);
    e.trim_matches('"')
}

/// What pins one object version: the ETag (as the server wrote it, for
/// `If-Match`) and the version id in a versioned bucket.
#[derive(Debug, Clone)]
struct Pin {
    etag: Option<String>,
    version: Option<String>,
}

impl Pin {
    /// Checks that `meta` (of an answer) is the pinned version.
    fn check(&self, meta: &ObjectMeta) -> Result<(), RequestError> {
        if let (Some(want), Some(got)) = (&self.etag, &meta.e_tag) {
            if bare_etag(want) != bare_etag(got) {
                return Err(RequestError::Changed(format!(
                    "ETag {} then {}",
                    bare_etag(want),
                    bare_etag(got)
                )));
            }
        }
        if let (Some(want), Some(got)) = (&self.version, &meta.version) {
            if want != got {
                return Err(RequestError::Changed(format!("version {want} then {got}")));
            }
        }
        Ok(())
    }
}

/// GETs bytes `range` of the pinned version, checking what comes back.
async fn get_part(
    store: Arc<AmazonS3>,
    path: ObjectPath,
    pin: Pin,
    range: Range<u64>,
) -> Result<Bytes, RequestError> {
    let options = GetOptions {
        if_match: pin.etag.clone(),
        version: pin.version.clone(),
        range: Some(GetRange::Bounded(range.clone())),
        ..GetOptions::default()
    };
    let result = store
        .get_opts(&path, options)
        .await
        .map_err(RequestError::Store)?;
    pin.check(&result.meta)?;
    if result.range != range {
        return Err(RequestError::BadAnswer(format!(
            "asked for bytes {}..{}, got {}..{}",
            range.start, range.end, result.range.start, result.range.end
        )));
    }
    let bytes = result.bytes().await.map_err(RequestError::Store)?;
    if bytes.len() as u64 != range.end - range.start {
        return Err(RequestError::BadAnswer(format!(
            "bytes {}..{}: {} bytes came",
            range.start,
            range.end,
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// The part of a large object being copied and the ranged GETs in
/// flight after it.
type Parts = super::parts::PartsAhead<Bytes, Result<Bytes, RequestError>>;

/// An object on S3 opened for reading: the version read first and what
/// it takes to read the rest of it.
pub struct S3File {
    store: Arc<AmazonS3>,
    uri: S3Uri,
    path: ObjectPath,
    server: String,
    pin: Pin,
    identity: Identity,
    request_timeout: Duration,
    parts: Mutex<Parts>,
}

impl fmt::Debug for S3File {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3File")
            .field("uri", &self.uri)
            .field("server", &self.server)
            .field("identity", &self.identity)
            .finish()
    }
}

/// The identity of an object as a GET or a listing gives it: its size,
/// its last-modified time in whole seconds (a GET's `Last-Modified`
/// header has no more; a listing has milliseconds) and a digest of its
/// ETag. The version id is not part of it (a listing has none); a read
/// pins it separately.
fn identity_of(meta: &ObjectMeta) -> Identity {
    let etag = meta.e_tag.as_deref().map(bare_etag).unwrap_or("");
    let digest = Sha256::digest(etag.as_bytes());
    let mut tag = [0u8; 16];
    tag.copy_from_slice(&digest[..16]);
    Identity {
        size: meta.size,
        mtime_ns: meta.last_modified.timestamp().saturating_mul(1_000_000_000),
        stamp: Stamp::S3 { tag },
    }
}

/// Every object below the "directory" `uri` (`s3a://bucket/prefix`, a
/// trailing `/` or none), as its key below the prefix and its identity,
/// sorted by key. Listed one level at a time (ListObjectsV2 with `/` as
/// delimiter, following its pages of 1,000 keys to the end), so a
/// directory marker (a key ending in `/`, which S3A writes) is a directory
/// and never a file; a level whose name starts with `_` or `.` is not
/// descended into (Hive's readers skip it). No object is an empty list.
pub fn list(access: &S3Access, uri: &str) -> Result<Vec<(String, Identity)>, String> {
    let parsed = S3Uri::parse(uri.trim_end_matches('/'))?;
    let server = access.settings().server();
    let store = access.client(&parsed.bucket)?;
    let top = ObjectPath::parse(&parsed.key).map_err(|e| format!("`{uri}`: {e}"))?;
    let timeout = access.settings().request_timeout;
    let mut out = Vec::new();
    let mut dirs = vec![top];
    while let Some(dir) = dirs.pop() {
        let level = wait(timeout, async {
            store
                .list_with_delimiter(Some(&dir))
                .await
                .map_err(RequestError::Store)
        })
        .map_err(|e| e.into_io(&server, &format!("listing {uri}")).to_string())?;
        for sub in level.common_prefixes {
            let hidden = sub
                .filename()
                .is_some_and(|n| n.starts_with('_') || n.starts_with('.'));
            if !hidden && sub != dir {
                dirs.push(sub);
            }
        }
        for meta in level.objects {
            // The directory's own marker (`dir/`, read as `dir`).
            if meta.location == dir {
                continue;
            }
            let key: &str = meta.location.as_ref();
            let below = format!("{}/", parsed.key);
            if let Some(rel) = key.strip_prefix(&below).filter(|r| !r.is_empty()) {
                out.push((rel.to_owned(), identity_of(&meta)));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The entries of the first page of the "directory" `uri`'s listing
/// (one ListObjectsV2 request with `/` as delimiter): that the server
/// answers, the bucket exists and the credentials may list it. For
/// `stagefs check`.
pub fn probe(access: &S3Access, uri: &str) -> Result<usize, String> {
    let parsed = S3Uri::parse(uri.trim_end_matches('/'))?;
    let server = access.settings().server();
    let store = access.client(&parsed.bucket)?;
    let dir = ObjectPath::parse(&parsed.key).map_err(|e| format!("`{uri}`: {e}"))?;
    let level = wait(access.settings().request_timeout, async {
        store
            .list_with_delimiter(Some(&dir))
            .await
            .map_err(RequestError::Store)
    })
    .map_err(|e| e.into_io(&server, &format!("listing {uri}")).to_string())?;
    Ok(level.common_prefixes.len() + level.objects.len())
}

impl S3File {
    /// Opens `uri` with `access`: one GET that brings the object's
    /// identity and, for an object of at most [`PART_BYTES`], all of it;
    /// for a larger one its first part (the rest of that response is not
    /// read).
    pub fn open(access: &S3Access, uri: &str) -> Result<S3File, SourceOpenError> {
        S3File::open_version(access, uri, None)
    }

    /// Opens `uri` as it was at `at_ms` (ms since the epoch), in a bucket
    /// that keeps versions: the newest version of its key last modified no
    /// later than that ([`versions::version_at`]), read as [`S3File::open`]
    /// reads the current one, every request pinned to that version id.
    /// `Err` says why there is none to read (deleted by then, no version
    /// that old, the listing failed), naming the server.
    pub fn open_as_of(access: &S3Access, uri: &str, at_ms: i64) -> Result<S3File, String> {
        let parsed = S3Uri::parse(uri)?;
        let server = access.settings().server();
        let listed = versions::versions_of(access, &parsed.bucket, &parsed.key).map_err(|e| {
            e.into_io(&server, "listing the versions (ListObjectVersions)")
                .to_string()
        })?;
        match versions::version_at(&listed, &parsed.key, at_ms) {
            versions::AtMoment::Version(v) => {
                let file = S3File::open_version(access, uri, Some(&v.version_id)).map_err(|e| {
                    format!("the version current at its event ({}): {e}", v.version_id)
                })?;
                Ok(file)
            }
            versions::AtMoment::Deleted(marker) => Err(format!(
                "the bucket keeps versions, and at its event ({at_ms} ms with the margin) the object was deleted (delete marker {} at {} ms)",
                marker.version_id, marker.last_modified_ms
            )),
            versions::AtMoment::Nothing { oldest_ms: Some(oldest) } => Err(format!(
                "the bucket keeps versions, but none as old as its event ({at_ms} ms with the margin): the oldest listed is from {oldest} ms"
            )),
            versions::AtMoment::Nothing { oldest_ms: None } => Err(format!(
                "the bucket keeps versions, but lists none of this key as old as its event ({at_ms} ms with the margin)"
            )),
        }
    }

    /// Opens `uri`: the current object, or the version `version` of it.
    fn open_version(
        access: &S3Access,
        uri: &str,
        version: Option<&str>,
    ) -> Result<S3File, SourceOpenError> {
        let uri = S3Uri::parse(uri)
            .map_err(|e| SourceOpenError::Io(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        let settings = access.settings();
        let server = settings.server();
        let store = access
            .client(&uri.bucket)
            .map_err(|e| SourceOpenError::Io(io::Error::other(e)))?;
        let path = ObjectPath::parse(&uri.key).map_err(|e| {
            SourceOpenError::Io(io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
        })?;
        let timeout = settings.request_timeout;
        let mut attempt = 0;
        let (meta, first) = loop {
            let fetched = wait(
                timeout,
                first_get(Arc::clone(&store), path.clone(), version.map(str::to_owned)),
            );
            match fetched {
                Ok(got) => break got,
                Err(RequestError::Store(object_store::Error::NotFound { .. })) => {
                    return Err(SourceOpenError::Missing)
                }
                Err(e) if e.is_transient() && attempt + 1 < PART_ATTEMPTS => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(200) * (1 << attempt));
                }
                Err(e) => return Err(SourceOpenError::Io(e.into_io(&server, "GET"))),
            }
        };
        if let (Some(want), Some(got)) = (version, meta.version.as_deref()) {
            if want != got {
                return Err(SourceOpenError::Io(io::Error::other(format!(
                    "S3 {server}: asked for version {want}, the answer is version {got}"
                ))));
            }
        }
        let pin = Pin {
            etag: meta.e_tag.clone(),
            // The version asked for, even if the answer did not name it.
            version: meta.version.clone().or_else(|| version.map(str::to_owned)),
        };
        if meta.size > PART_BYTES && pin.etag.is_none() && pin.version.is_none() {
            return Err(SourceOpenError::Io(io::Error::other(format!(
                "S3 {server}: the server gives neither an ETag nor a version id, so the parts of a {} byte object cannot be pinned to one version",
                meta.size
            ))));
        }
        Ok(S3File {
            store,
            uri,
            path,
            server,
            pin,
            identity: identity_of(&meta),
            request_timeout: timeout,
            parts: Mutex::new(Parts::holding(0, first)),
        })
    }

    /// The ETag of the version read, without quotes.
    pub fn etag(&self) -> Option<&str> {
        self.pin.etag.as_deref().map(bare_etag)
    }

    /// The version id read, in a versioned bucket.
    pub fn version(&self) -> Option<&str> {
        self.pin.version.as_deref()
    }

    fn part_range(&self, index: u64) -> Range<u64> {
        let start = index * PART_BYTES;
        start..(start + PART_BYTES).min(self.identity.size)
    }

    fn spawn_part(
        &self,
        index: u64,
    ) -> Result<tokio::task::JoinHandle<Result<Bytes, RequestError>>, RequestError> {
        let rt = runtime().map_err(RequestError::Runtime)?;
        Ok(rt.spawn(get_part(
            Arc::clone(&self.store),
            self.path.clone(),
            self.pin.clone(),
            self.part_range(index),
        )))
    }

    /// Part `index`, from the parts in flight (started here when not),
    /// with up to [`PARTS_AHEAD`] parts after it set going; a part that
    /// fails for a transient reason is asked again.
    fn fetch_part(&self, parts: &mut Parts, index: u64) -> Result<Bytes, RequestError> {
        let count = self.identity.size.div_ceil(PART_BYTES);
        let Some(task) = parts.take(index, count, PARTS_AHEAD, |next| self.spawn_part(next))?
        else {
            return Err(RequestError::BadAnswer(format!(
                "part {index} is past the end"
            )));
        };
        let timeout = self.request_timeout;
        let mut outcome = wait(timeout, async {
            task.await
                .map_err(|e| RequestError::Runtime(format!("part task: {e}")))?
        });
        let mut attempt = 1;
        while let Err(e) = &outcome {
            if !e.is_transient() || attempt >= PART_ATTEMPTS {
                break;
            }
            tracing::debug!(uri = %self, part = index, error = ?e, "S3 part failed; asking again");
            std::thread::sleep(Duration::from_millis(200) * (1 << attempt));
            attempt += 1;
            outcome = wait(
                timeout,
                get_part(
                    Arc::clone(&self.store),
                    self.path.clone(),
                    self.pin.clone(),
                    self.part_range(index),
                ),
            );
        }
        outcome
    }
}

impl fmt::Display for S3File {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.uri.bucket, self.uri.key)
    }
}

/// The first GET of an object: its metadata, and its bytes up to
/// [`PART_BYTES`] (all of it when it is no larger).
async fn first_get(
    store: Arc<AmazonS3>,
    path: ObjectPath,
    version: Option<String>,
) -> Result<(ObjectMeta, Bytes), RequestError> {
    let options = GetOptions {
        version,
        ..GetOptions::default()
    };
    let result = store
        .get_opts(&path, options)
        .await
        .map_err(RequestError::Store)?;
    let meta = result.meta.clone();
    let want = meta.size.min(PART_BYTES);
    let mut stream = result.into_stream();
    let mut buf = Vec::with_capacity(want as usize);
    while (buf.len() as u64) < want {
        match stream.next().await {
            Some(chunk) => {
                let chunk = chunk.map_err(RequestError::Store)?;
                let room = (want - buf.len() as u64) as usize;
                buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            None => break,
        }
    }
    if meta.size <= PART_BYTES && stream.next().await.is_some() {
        return Err(RequestError::BadAnswer(format!(
            "more than the {} bytes the object is said to have came",
            meta.size
        )));
    }
    if (buf.len() as u64) != want {
        return Err(RequestError::BadAnswer(format!(
            "{} of {want} bytes came",
            buf.len()
        )));
    }
    Ok((meta, Bytes::from(buf)))
}

impl SourceFile for S3File {
    fn identity(&self) -> &Identity {
        &self.identity
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let size = self.identity.size;
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let index = offset / PART_BYTES;
        let mut parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
        let have = matches!(&parts.current, Some((i, _)) if *i == index);
        if !have {
            parts.current = None;
            let bytes = self.fetch_part(&mut parts, index).map_err(|e| {
                e.into_io(
                    &self.server,
                    &format!("GET bytes from {}", index * PART_BYTES),
                )
            })?;
            parts.current = Some((index, bytes));
        }
        let Some((_, part)) = &parts.current else {
            return Ok(0);
        };
        let at = (offset - index * PART_BYTES) as usize;
        // Parts are checked to their exact length when they arrive.
        let Some(rest) = part.get(at..).filter(|r| !r.is_empty()) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("S3 {}: part {index} ends before byte {offset}", self.server),
            ));
        };
        let n = buf.len().min(rest.len());
        buf[..n].copy_from_slice(&rest[..n]);
        Ok(n)
    }

    /// The identity read first: every byte came from that version (one
    /// response, or GETs conditional on its ETag and version id, each
    /// checked), so the copy stands for it whatever happened since.
    fn identity_now(&self) -> io::Result<Identity> {
        Ok(self.identity)
    }

    fn local_file(&self) -> Option<&File> {
        None
    }

    fn etag(&self) -> Option<&str> {
        S3File::etag(self)
    }

    fn version(&self) -> Option<&str> {
        S3File::version(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_split_into_bucket_and_key() {
        let u = S3Uri::parse("s3a://warehouse/sales.db/t/p=a%3Ab/000000_0").unwrap();
        assert_eq!(u.bucket, "warehouse");
        assert_eq!(u.key, "sales.db/t/p=a%3Ab/000000_0");
        let u = S3Uri::parse("S3://my-bucket.x/k").unwrap();
        assert_eq!((u.bucket.as_str(), u.key.as_str()), ("my-bucket.x", "k"));
        assert!(S3Uri::is_s3("S3A://b/k") && !S3Uri::is_s3("hdfs://nn/f"));
    }

    #[test]
    fn malformed_s3_uris_are_refused_and_credentials_are_never_echoed() {
        for uri in [
            "hdfs://nn/f",
            "s3a://",
            "s3a://bucket",
            "s3a://bucket/",
            "s3a://bucket/dir/",
            "s3a://bucket/a//b",
            "s3a://bucket/a/../b",
            "s3a://bucket/./b",
            "s3a://bucket/k?versionId=1",
            "s3a://bucket/k\n",
            "s3a://bad_bucket!/k",
        ] {
            assert!(S3Uri::parse(uri).is_err(), "{uri}");
        }
        let err = S3Uri::parse("s3a://AKIAEXAMPLE:topsecret@bucket/k").unwrap_err();
        assert!(
            !err.contains("topsecret") && !err.contains("AKIAEXAMPLE"),
            "{err}"
        );
    }

    #[test]
    fn settings_come_from_the_environment_then_the_profile_and_hide_secrets() {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".aws")).unwrap();
        std::fs::write(
            home.path().join(".aws/credentials"),
            "[default]\naws_access_key_id = DEFKEY\naws_secret_access_key = defsecret\n\
             [etl]\naws_access_key_id=ETLKEY\naws_secret_access_key=etlsecret\naws_session_token=etltoken\n",
        )
        .unwrap();
        std::fs::write(
            home.path().join(".aws/config"),
            "[default]\nregion = eu-west-1\n[profile etl]\nregion = eu-north-1\nendpoint_url = http://minio:9000\n",
        )
        .unwrap();
        let vars = |pairs: Vec<(&'static str, String)>| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        };
        let h = home.path().to_string_lossy().into_owned();
        let t = Duration::from_secs(5);

        let env = vars(vec![("HOME", h.clone())]);
        let s = S3Settings::from_env_with(&env, None, t);
        assert_eq!(s.credentials.as_ref().unwrap().access_key_id, "DEFKEY");
        assert_eq!(
            (s.region.as_str(), s.endpoint.as_deref()),
            ("eu-west-1", None)
        );
        assert_eq!(s.source, "profile default");
        assert_eq!(s.server(), "s3.eu-west-1.amazonaws.com:443");

        let env = vars(vec![("HOME", h.clone()), ("AWS_PROFILE", "etl".into())]);
        let s = S3Settings::from_env_with(&env, None, t);
        let c = s.credentials.as_ref().unwrap();
        assert_eq!(c.access_key_id, "ETLKEY");
        assert_eq!(c.session_token, Some(Secret::new("etltoken")));
        assert_eq!(s.endpoint.as_deref(), Some("http://minio:9000"));
        assert_eq!(s.server(), "minio:9000");
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("etlsecret") && !shown.contains("etltoken"),
            "{shown}"
        );

        // The environment wins over the profile, the flag over both.
        let env = vars(vec![
            ("HOME", h),
            ("AWS_PROFILE", "etl".into()),
            ("AWS_ACCESS_KEY_ID", "ENVKEY".into()),
            ("AWS_SECRET_ACCESS_KEY", "envsecret".into()),
            ("AWS_REGION", "ap-south-1".into()),
            (
                "AWS_ENDPOINT_URL",
                "https://user:pw@s3.example:8443/".into(),
            ),
        ]);
        let s = S3Settings::from_env_with(&env, None, t);
        assert_eq!(s.credentials.as_ref().unwrap().access_key_id, "ENVKEY");
        assert_eq!(s.region, "ap-south-1");
        assert_eq!(s.server(), "s3.example:8443");
        let s = S3Settings::from_env_with(&env, Some("http://127.0.0.1:9"), t);
        assert_eq!(s.endpoint.as_deref(), Some("http://127.0.0.1:9"));
    }

    #[test]
    fn etags_compare_without_quotes() {
        assert_eq!(bare_etag("\"abc-2\""), "abc-2");
        assert_eq!(bare_etag("W/\"abc\""), "abc");
        assert_eq!(bare_etag("abc"), "abc");
    }
}
