//! The version of an object that was current at a moment, in a bucket
//! that keeps versions (SPEC §2: "for a versioned bucket, the version
//! current at the event").
//!
//! `object_store` has no ListObjectVersions, so it is asked here: `GET
//! /?versions&prefix=KEY` (path-style on a custom endpoint, virtual-hosted
//! on AWS), signed with `object_store`'s own SigV4 authorizer
//! ([`AwsAuthorizer`]) with the credentials the bucket's client uses, sent
//! through an HTTP client made from the same [`ClientOptions`] (timeouts,
//! `http://`), each request bounded by the settings' request timeout and
//! retried on a transient failure (5xx, `503 SlowDown`, 429, a connection
//! error, an answer that is not a well-formed listing) [`CLIENT_RETRIES`]
//! times with backoff from 100 ms doubling to 2 s, as the client retries
//! GETs. Pages are followed with `key-marker` and `version-id-marker`
//! until the listing is done or has passed the key; a listing that does
//! not advance, or runs past [`MAX_PAGES`], is an error, never a loop.
//!
//! The answer is bucket input: read with quick-xml into [`ListedVersion`]s,
//! anything unexpected (another root element, a missing field, a bad
//! timestamp, a truncated page without its next markers, more than
//! [`MAX_PAGE_BYTES`]) is a [`RequestError::BadAnswer`] naming what, never
//! a panic. Only entries whose key is exactly the object's count.
//!
//! [`version_at`] picks, among them, the newest entry (version or delete
//! marker) last modified no later than the limit: the object as it was
//! then. No secret is part of a message: errors name the server and the
//! key, never a header.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::{AwsAuthorizer, AwsCredential};
use object_store::client::{HttpClient, HttpConnector, HttpRequestBody, ReqwestConnector};
use quick_xml::events::Event;

use super::{wait, with_causes, RequestError, S3Access, CLIENT_RETRIES};

/// Most pages of one key's versions followed (1,000 entries each).
pub const MAX_PAGES: usize = 1_000;
/// Largest page answer read (a full page of 1,000 entries is about 400 KiB).
pub const MAX_PAGE_BYTES: usize = 8 << 20;

/// One entry of a ListObjectVersions answer: a version or a delete marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedVersion {
    pub key: String,
    pub version_id: String,
    /// `LastModified`, in ms since the epoch.
    pub last_modified_ms: i64,
    pub delete_marker: bool,
}

/// One page of a ListObjectVersions answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VersionsPage {
    /// In the order listed (per key, newest first).
    pub entries: Vec<ListedVersion>,
    pub truncated: bool,
    pub next_key_marker: Option<String>,
    pub next_version_id_marker: Option<String>,
}

/// What the object was at a moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtMoment {
    /// This version was current.
    Version(ListedVersion),
    /// It was deleted: the newest entry by then is this delete marker.
    Deleted(ListedVersion),
    /// No version is that old (the oldest listed, if any, is later).
    Nothing { oldest_ms: Option<i64> },
}

/// The entry of `key` current at `limit_ms`: among `entries` with exactly
/// that key and last modified no later than `limit_ms`, the newest (of two
/// equally old, the one listed first: S3 lists a key's versions newest
/// first).
pub fn version_at(entries: &[ListedVersion], key: &str, limit_ms: i64) -> AtMoment {
    let mine = entries.iter().filter(|e| e.key == key);
    let mut best: Option<&ListedVersion> = None;
    for e in mine.clone().filter(|e| e.last_modified_ms <= limit_ms) {
        if best.is_none_or(|b| e.last_modified_ms > b.last_modified_ms) {
            best = Some(e);
        }
    }
    match best {
        Some(e) if e.delete_marker => AtMoment::Deleted(e.clone()),
        Some(e) => AtMoment::Version(e.clone()),
        None => AtMoment::Nothing {
            oldest_ms: mine.map(|e| e.last_modified_ms).min(),
        },
    }
}

/// Reads one ListObjectVersions answer. `Err` says what is wrong with it.
pub fn parse_page(xml: &[u8]) -> Result<VersionsPage, String> {
    let text = std::str::from_utf8(xml).map_err(|e| format!("not UTF-8 ({e})"))?;
    let mut reader = quick_xml::Reader::from_str(text);
    let mut page = VersionsPage::default();
    // The open elements, by local name, from the root down.
    let mut path: Vec<String> = Vec::new();
    let mut text_of_leaf = String::new();
    let mut entry = Fields::default();
    let mut truncated: Option<String> = None;
    let mut root_seen = false;
    loop {
        let event = reader.read_event().map_err(|e| {
            format!(
                "not well-formed XML at byte {}: {e}",
                reader.error_position()
            )
        })?;
        match event {
            Event::Start(e) => {
                let name = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
                if path.is_empty() {
                    if root_seen {
                        return Err("more than one root element".into());
                    }
                    root_seen = true;
                    if name != "ListVersionsResult" {
                        return Err(format!("<{name}> where <ListVersionsResult> was expected"));
                    }
                }
                if path.len() == 1 && matches!(name.as_str(), "Version" | "DeleteMarker") {
                    entry = Fields::default();
                }
                path.push(name);
                text_of_leaf.clear();
            }
            Event::Empty(e) => {
                let name = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
                if path.is_empty() {
                    return Err(format!("<{name}/> where <ListVersionsResult> was expected"));
                }
                // An empty field (`<NextKeyMarker/>`) is an empty value.
                path.push(name);
                text_of_leaf.clear();
                field(&path, &text_of_leaf, &mut page, &mut entry, &mut truncated);
                path.pop();
            }
            Event::Text(e) => {
                let t = e.decode().map_err(|e| format!("bad text: {e}"))?;
                text_of_leaf.push_str(&t);
            }
            Event::CData(e) => {
                let t = e.decode().map_err(|e| format!("bad CDATA: {e}"))?;
                text_of_leaf.push_str(&t);
            }
            Event::GeneralRef(e) => {
                let c = match e
                    .resolve_char_ref()
                    .map_err(|e| format!("bad reference: {e}"))?
                {
                    Some(c) => c,
                    None => match e
                        .decode()
                        .map_err(|e| format!("bad reference: {e}"))?
                        .as_ref()
                    {
                        "amp" => '&',
                        "lt" => '<',
                        "gt" => '>',
                        "quot" => '"',
                        "apos" => '\'',
                        other => return Err(format!("unknown entity &{other};")),
                    },
                };
                text_of_leaf.push(c);
            }
            Event::End(_) => {
                field(&path, &text_of_leaf, &mut page, &mut entry, &mut truncated);
                if path.len() == 2 {
                    match path[1].as_str() {
                        "Version" => page.entries.push(entry.take(false)?),
                        "DeleteMarker" => page.entries.push(entry.take(true)?),
                        _ => {}
                    }
                }
                path.pop();
                text_of_leaf.clear();
            }
            Event::Eof => break,
            Event::Decl(_) | Event::PI(_) | Event::DocType(_) | Event::Comment(_) => {}
        }
    }
    if !root_seen {
        return Err("no <ListVersionsResult> (an empty or non-XML answer)".into());
    }
    if !path.is_empty() {
        return Err(format!("cut short inside <{}>", path.join("><")));
    }
    page.truncated = match truncated.as_deref().map(str::trim) {
        Some("true") => true,
        Some("false") | None => false,
        Some(other) => return Err(format!("<IsTruncated> is {other:?}")),
    };
    if page.truncated && page.next_key_marker.as_deref().is_none_or(str::is_empty) {
        return Err("a truncated page without <NextKeyMarker>".into());
    }
    Ok(page)
}

/// The fields of the entry being read.
#[derive(Default)]
struct Fields {
    key: Option<String>,
    version_id: Option<String>,
    last_modified: Option<String>,
}

impl Fields {
    fn take(&mut self, delete_marker: bool) -> Result<ListedVersion, String> {
        let what = if delete_marker {
            "<DeleteMarker>"
        } else {
            "<Version>"
        };
        let f = std::mem::take(self);
        let key = f.key.ok_or_else(|| format!("a {what} without <Key>"))?;
        let version_id = f
            .version_id
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("a {what} of {key:?} without <VersionId>"))?;
        let stamp = f
            .last_modified
            .ok_or_else(|| format!("a {what} of {key:?} without <LastModified>"))?;
        let last_modified_ms = chrono::DateTime::parse_from_rfc3339(stamp.trim())
            .map_err(|e| format!("a {what} of {key:?}: <LastModified> {stamp:?}: {e}"))?
            .timestamp_millis();
        Ok(ListedVersion {
            key,
            version_id,
            last_modified_ms,
            delete_marker,
        })
    }
}

/// Keeps the text of the leaf element `path` names where it belongs.
fn field(
    path: &[String],
    text: &str,
    page: &mut VersionsPage,
    entry: &mut Fields,
    truncated: &mut Option<String>,
) {
    let names: Vec<&str> = path.iter().map(String::as_str).collect();
    match names.as_slice() {
        [_, "IsTruncated"] => *truncated = Some(text.to_owned()),
        [_, "NextKeyMarker"] => page.next_key_marker = Some(text.to_owned()),
        [_, "NextVersionIdMarker"] => page.next_version_id_marker = Some(text.to_owned()),
        [_, "Version" | "DeleteMarker", "Key"] => entry.key = Some(text.to_owned()),
        [_, "Version" | "DeleteMarker", "VersionId"] => entry.version_id = Some(text.to_owned()),
        [_, "Version" | "DeleteMarker", "LastModified"] => {
            entry.last_modified = Some(text.to_owned())
        }
        _ => {}
    }
}

/// `s` percent-encoded as SigV4 canonicalizes it: all but `A-Za-z0-9-_.~`.
fn strict_encode(s: &str) -> String {
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

/// The URL of one page of `key`'s versions in `bucket`.
fn page_url(
    endpoint: Option<&str>,
    region: &str,
    bucket: &str,
    key: &str,
    markers: Option<&(String, String)>,
) -> String {
    let base = match endpoint {
        Some(e) => format!("{}/{bucket}", e.trim_end_matches('/')),
        None => format!("https://{bucket}.s3.{region}.amazonaws.com/"),
    };
    let mut query = format!("versions&prefix={}", strict_encode(key));
    if let Some((key_marker, version_marker)) = markers {
        query.push_str(&format!("&key-marker={}", strict_encode(key_marker)));
        if !version_marker.is_empty() {
            query.push_str(&format!(
                "&version-id-marker={}",
                strict_encode(version_marker)
            ));
        }
    }
    format!("{base}?{query}")
}

impl S3Access {
    /// The HTTP client for requests `object_store` does not make, with the
    /// same options as the buckets' clients; made once.
    fn http_client(&self) -> Result<HttpClient, String> {
        let mut http = self.http.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = http.as_ref() {
            return Ok(c.clone());
        }
        let made = ReqwestConnector::default()
            .connect(&self.client_options())
            .map_err(|e| {
                format!(
                    "S3 {}: cannot make an HTTP client: {e}",
                    self.settings.server()
                )
            })?;
        *http = Some(made.clone());
        Ok(made)
    }

    /// The credentials requests to `bucket` are signed with: the static
    /// ones of the settings, else those `object_store`'s providers give
    /// the bucket's client.
    async fn credential(&self, bucket: &str) -> Result<Arc<AwsCredential>, RequestError> {
        if let Some(c) = &self.settings.credentials {
            return Ok(Arc::new(AwsCredential {
                key_id: c.access_key_id.clone(),
                secret_key: c.secret_access_key.0.clone(),
                token: c.session_token.as_ref().map(|t| t.0.clone()),
            }));
        }
        let store = self.client(bucket).map_err(RequestError::Runtime)?;
        store
            .credentials()
            .get_credential()
            .await
            .map_err(RequestError::Store)
    }
}

/// One signed GET of `url`; its body when the answer is 200.
async fn signed_get(
    access: &S3Access,
    client: &HttpClient,
    bucket: &str,
    url: &str,
) -> Result<Bytes, RequestError> {
    let credential = access.credential(bucket).await?;
    let mut request = http::Request::builder()
        .method(http::Method::GET)
        .uri(url)
        .body(HttpRequestBody::empty())
        .map_err(|e| RequestError::Runtime(format!("building the request: {e}")))?;
    let region = access.settings.region.clone();
    AwsAuthorizer::new(&credential, "s3", &region)
        .try_authorize(&mut request, None)
        .map_err(|e| RequestError::Runtime(format!("signing the request: {e}")))?;
    let response = client
        .execute(request)
        .await
        .map_err(|e| RequestError::Http(with_causes(&e)))?;
    let status = response.status().as_u16();
    let mut body = response.into_body().bytes_stream();
    let mut bytes = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| RequestError::Http(with_causes(&e)))?;
        if bytes.len() + chunk.len() > MAX_PAGE_BYTES {
            return Err(RequestError::BadAnswer(format!(
                "an answer of more than {MAX_PAGE_BYTES} bytes"
            )));
        }
        bytes.extend_from_slice(&chunk);
    }
    if status != 200 {
        return Err(RequestError::Status {
            status,
            code: error_code(&bytes),
        });
    }
    Ok(Bytes::from(bytes))
}

/// The `<Code>` of an S3 error answer, if it has one.
fn error_code(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let code = text
        .split_once("<Code>")
        .and_then(|(_, rest)| rest.split_once("</Code>"))
        .map(|(code, _)| code.trim());
    match code {
        Some(c)
            if !c.is_empty() && c.len() <= 64 && c.bytes().all(|b| b.is_ascii_alphanumeric()) =>
        {
            c.to_owned()
        }
        _ => String::new(),
    }
}

/// Every listed entry of exactly `key` in `bucket` (ListObjectVersions,
/// every page up to the key's last). `Err` names the server and why.
pub(super) fn versions_of(
    access: &S3Access,
    bucket: &str,
    key: &str,
) -> Result<Vec<ListedVersion>, RequestError> {
    let settings = access.settings();
    let timeout = settings.request_timeout;
    let client = access.http_client().map_err(RequestError::Runtime)?;
    let mut entries = Vec::new();
    let mut markers: Option<(String, String)> = None;
    for _ in 0..MAX_PAGES {
        let url = page_url(
            settings.endpoint.as_deref(),
            &settings.region,
            bucket,
            key,
            markers.as_ref(),
        );
        let mut attempt = 0u32;
        let page = loop {
            let answer = wait(timeout, async {
                let body = signed_get(access, &client, bucket, &url).await?;
                parse_page(&body).map_err(|e| {
                    RequestError::BadAnswer(format!("not a ListObjectVersions answer: {e}"))
                })
            });
            match answer {
                Ok(page) => break page,
                Err(e) if e.is_transient() && (attempt as usize) < CLIENT_RETRIES => {
                    tracing::debug!(%bucket, %key, error = ?e, "ListObjectVersions failed; asking again");
                    let backoff = Duration::from_millis(100)
                        .saturating_mul(1 << attempt)
                        .min(Duration::from_secs(2));
                    std::thread::sleep(backoff);
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        };
        let past_key = page.entries.last().is_some_and(|e| e.key.as_str() > key);
        entries.extend(page.entries.into_iter().filter(|e| e.key == key));
        if !page.truncated || past_key {
            return Ok(entries);
        }
        let next = (
            page.next_key_marker.unwrap_or_default(),
            page.next_version_id_marker.unwrap_or_default(),
        );
        if next.0.as_str() > key {
            return Ok(entries);
        }
        if markers.as_ref() == Some(&next) {
            return Err(RequestError::BadAnswer(format!(
                "ListObjectVersions of {key:?} does not advance (the next page starts at {:?} again)",
                next.0
            )));
        }
        markers = Some(next);
    }
    Err(RequestError::BadAnswer(format!(
        "ListObjectVersions of {key:?} goes on past {MAX_PAGES} pages"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(key: &str, id: &str, ms: i64, marker: bool) -> ListedVersion {
        ListedVersion {
            key: key.into(),
            version_id: id.into(),
            last_modified_ms: ms,
            delete_marker: marker,
        }
    }

    const PAGE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListVersionsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>warehouse</Name><Prefix>t/000000_0</Prefix><KeyMarker></KeyMarker>
  <VersionIdMarker/><MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated>
  <NextKeyMarker>t/000000_0</NextKeyMarker><NextVersionIdMarker>v1</NextVersionIdMarker>
  <DeleteMarker><Key>t/000000_0</Key><VersionId>v3</VersionId><IsLatest>true</IsLatest>
    <LastModified>2024-01-01T00:00:30.000Z</LastModified><Owner><ID>x</ID></Owner></DeleteMarker>
  <Version><Key>t/000000_0</Key><VersionId>v2</VersionId><IsLatest>false</IsLatest>
    <LastModified>2024-01-01T00:00:20.500Z</LastModified><ETag>&quot;abc&quot;</ETag>
    <Size>10</Size><StorageClass>STANDARD</StorageClass></Version>
  <Version><Key>t/000000_0</Key><VersionId>v1</VersionId><IsLatest>false</IsLatest>
    <LastModified>2024-01-01T00:00:10Z</LastModified><ETag>"def"</ETag><Size>9</Size></Version>
  <Version><Key>t/000000_0_copy&amp;x</Key><VersionId>w1</VersionId>
    <LastModified>2024-01-01T00:00:05Z</LastModified></Version>
</ListVersionsResult>"#;

    #[test]
    fn a_list_object_versions_page_is_read_in_order_with_its_markers() {
        let page = parse_page(PAGE.as_bytes()).unwrap();
        let t0 = 1_704_067_200_000;
        assert_eq!(
            page.entries,
            vec![
                v("t/000000_0", "v3", t0 + 30_000, true),
                v("t/000000_0", "v2", t0 + 20_500, false),
                v("t/000000_0", "v1", t0 + 10_000, false),
                v("t/000000_0_copy&x", "w1", t0 + 5_000, false),
            ]
        );
        assert!(page.truncated);
        assert_eq!(page.next_key_marker.as_deref(), Some("t/000000_0"));
        assert_eq!(page.next_version_id_marker.as_deref(), Some("v1"));
        // The last page: no markers needed.
        let last = parse_page(
            b"<ListVersionsResult><IsTruncated>false</IsTruncated></ListVersionsResult>",
        )
        .unwrap();
        assert_eq!(last, VersionsPage::default());
    }

    #[test]
    fn garbage_instead_of_a_listing_is_an_error_that_says_what_is_wrong() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "no <ListVersionsResult>"),
            (b"garbage, not XML", "no <ListVersionsResult>"),
            (b"\xff\xfe<x/>", "not UTF-8"),
            (b"<Error><Code>AccessDenied</Code></Error>", "<Error> where"),
            (b"<ListVersionsResult><Version><Key>k</Key>", "cut short"),
            (b"<ListVersionsResult><a></b></ListVersionsResult>", "not well-formed"),
            (
                b"<ListVersionsResult><IsTruncated>maybe</IsTruncated></ListVersionsResult>",
                "<IsTruncated> is \"maybe\"",
            ),
            (
                b"<ListVersionsResult><IsTruncated>true</IsTruncated></ListVersionsResult>",
                "without <NextKeyMarker>",
            ),
            (
                b"<ListVersionsResult><Version><Key>k</Key><LastModified>2024-01-01T00:00:00Z</LastModified></Version></ListVersionsResult>",
                "without <VersionId>",
            ),
            (
                b"<ListVersionsResult><Version><Key>k</Key><VersionId>1</VersionId><LastModified>yesterday</LastModified></Version></ListVersionsResult>",
                "<LastModified> \"yesterday\"",
            ),
            (
                b"<ListVersionsResult><Version><VersionId>1</VersionId></Version></ListVersionsResult>",
                "without <Key>",
            ),
            (
                b"<ListVersionsResult><Version><Key>&bogus;</Key></Version></ListVersionsResult>",
                "bogus",
            ),
            (b"<ListVersionsResult/>", "<ListVersionsResult/> where"),
            (
                b"<ListVersionsResult></ListVersionsResult><ListVersionsResult></ListVersionsResult>",
                "more than one root",
            ),
        ];
        for (xml, want) in cases {
            let err = parse_page(xml).expect_err(&String::from_utf8_lossy(xml));
            assert!(
                err.contains(want),
                "{:?}: {err}",
                String::from_utf8_lossy(xml)
            );
        }
    }

    #[test]
    fn the_version_at_a_moment_is_the_newest_entry_of_the_exact_key_not_after_it() {
        let page = parse_page(PAGE.as_bytes()).unwrap();
        let t0 = 1_704_067_200_000;
        let at = |ms| version_at(&page.entries, "t/000000_0", t0 + ms);
        assert_eq!(at(10_000), AtMoment::Version(page.entries[2].clone()));
        assert_eq!(at(20_499), AtMoment::Version(page.entries[2].clone()));
        assert_eq!(at(20_500), AtMoment::Version(page.entries[1].clone()));
        assert_eq!(at(29_999), AtMoment::Version(page.entries[1].clone()));
        // Deleted by then: a delete marker is no version to read.
        assert_eq!(at(30_000), AtMoment::Deleted(page.entries[0].clone()));
        // Before the first version (the other key's older one does not count).
        assert_eq!(
            at(9_999),
            AtMoment::Nothing {
                oldest_ms: Some(t0 + 10_000)
            }
        );
        assert_eq!(
            version_at(&[], "k", 0),
            AtMoment::Nothing { oldest_ms: None }
        );
        // Two entries equally old: the one listed first is the newer.
        let tied = [v("k", "b", 5, false), v("k", "a", 5, false)];
        assert_eq!(
            version_at(&tied, "k", 5),
            AtMoment::Version(tied[0].clone())
        );
    }

    #[test]
    fn page_urls_encode_the_key_and_markers_as_sigv4_does() {
        let url = page_url(
            Some("http://127.0.0.1:8333/"),
            "us-east-1",
            "wh",
            "t/p=a%3Ab c+d/000000_0",
            Some(&("t/x y".to_owned(), "v+1".to_owned())),
        );
        assert_eq!(
            url,
            "http://127.0.0.1:8333/wh?versions&prefix=t%2Fp%3Da%253Ab%20c%2Bd%2F000000_0&key-marker=t%2Fx%20y&version-id-marker=v%2B1"
        );
        assert_eq!(
            page_url(None, "eu-west-1", "wh", "k", None),
            "https://wh.s3.eu-west-1.amazonaws.com/?versions&prefix=k"
        );
    }

    #[test]
    fn an_error_code_is_taken_only_when_it_looks_like_one() {
        assert_eq!(
            error_code(b"<Error><Code>SlowDown</Code><Message>x</Message></Error>"),
            "SlowDown"
        );
        assert_eq!(error_code(b"<Code>a b</Code>"), "");
        assert_eq!(error_code(b"nothing"), "");
    }
}
