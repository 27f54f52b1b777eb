//! Opening the storage a publication lives in, from its URL: one
//! `Arc<dyn ObjectStore>` for publisher and readers alike.
//!
//! - `s3://bucket/prefix`: the S3 client the source files are read
//!   through ([`S3Access`]: the AWS environment and profile,
//!   `AWS_ENDPOINT_URL`, path-style requests and plain HTTP for a custom
//!   endpoint, bounded and retried requests). Conditional writes are S3's `If-None-Match`
//!   and `If-Match`.
//! - `file:///dir`: a folder every host shares ([`SharedFolder`]).
//!   object_store's `LocalFileSystem` (0.14) refuses `PutMode::Update`
//!   (the head's compare-and-swap) and never fsyncs, so its writes are
//!   ours: temp file, fsync, `link` (create-only) or `rename`
//!   (overwrite; an update under an exclusive `flock` of the folder after
//!   comparing the e-tag), fsync of the folder. Reads, lists and deletes
//!   are `LocalFileSystem`'s, whose e-tags ours match.

use std::fmt;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::source_file::s3::S3Access;
use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreUrlError {
    #[error("{0:?} is not a storage URL (s3://bucket/prefix or file:///dir)")]
    Scheme(String),
    #[error("{url}: {detail}")]
    Open { url: String, detail: String },
}

/// Opens the storage `url` names.
pub fn open_store(url: &str) -> Result<Arc<dyn ObjectStore>, StoreUrlError> {
    let open_err = |detail: String| StoreUrlError::Open {
        url: url.to_owned(),
        detail,
    };
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(open_err("no bucket".into()));
        }
        let s3: Arc<dyn ObjectStore> = S3Access::from_process_environment()
            .client(bucket)
            .map_err(open_err)?;
        let prefix = prefix.trim_matches('/');
        return Ok(if prefix.is_empty() {
            s3
        } else {
            Arc::new(PrefixStore::new(s3, prefix))
        });
    }
    if let Some(dir) = url.strip_prefix("file://") {
        if !dir.starts_with('/') {
            return Err(open_err(
                "a file URL needs an absolute path: file:///dir".into(),
            ));
        }
        return SharedFolder::open(FsPath::new(dir))
            .map(|f| Arc::new(f) as Arc<dyn ObjectStore>)
            .map_err(|e| open_err(e.to_string()));
    }
    Err(StoreUrlError::Scheme(url.to_owned()))
}

/// A folder as object storage, with durable and conditional writes.
#[derive(Debug)]
pub struct SharedFolder {
    root: PathBuf,
    /// Reads, lists and deletes: `LocalFileSystem` from `/` under the
    /// folder's path as a prefix, so the folder need not exist (yet, or
    /// during an outage) for the store to open.
    inner: PrefixStore<LocalFileSystem>,
}

impl fmt::Display for SharedFolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedFolder({})", self.root.display())
    }
}

static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

impl SharedFolder {
    /// The folder `root` (an absolute path); created by the first write.
    pub fn open(root: &FsPath) -> std::io::Result<SharedFolder> {
        let prefix = root
            .to_str()
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(|| std::io::Error::other("the folder must be an absolute UTF-8 path"))?;
        let prefix = Path::parse(prefix).map_err(std::io::Error::other)?;
        Ok(SharedFolder {
            root: root.to_owned(),
            inner: PrefixStore::new(LocalFileSystem::new(), prefix),
        })
    }

    fn put_blocking(
        &self,
        location: &Path,
        payload: PutPayload,
        mode: PutMode,
    ) -> Result<PutResult> {
        let dest = self.root.join(location.as_ref());
        let generic = |e: std::io::Error| object_store::Error::Generic {
            store: "SharedFolder",
            source: format!("{}: {e}", dest.display()).into(),
        };
        let parent = dest
            .parent()
            .ok_or_else(|| generic(std::io::Error::other("no parent")))?;
        create_dirs_durably(&self.root, parent).map_err(generic)?;
        // `#` and digits: LocalFileSystem's lists skip such names.
        let mut temp = dest.as_os_str().to_owned();
        temp.push(format!(
            "#{}{}",
            std::process::id(),
            NEXT_TEMP.fetch_add(1, Ordering::Relaxed)
        ));
        let temp = PathBuf::from(temp);
        let written = (|| {
            let mut f = File::create(&temp)?;
            for chunk in payload.iter() {
                f.write_all(chunk)?;
            }
            f.sync_all()
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&temp);
            return Err(generic(e));
        }
        let dir = File::open(parent).map_err(generic)?;
        let placed = match &mode {
            PutMode::Overwrite => std::fs::rename(&temp, &dest).map_err(generic),
            PutMode::Create => {
                let linked = std::fs::hard_link(&temp, &dest);
                let _ = std::fs::remove_file(&temp);
                match linked {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        Err(object_store::Error::AlreadyExists {
                            path: location.to_string(),
                            source: e.into(),
                        })
                    }
                    Err(e) => Err(generic(e)),
                }
            }
            PutMode::Update(expected) => {
                // One writer at a time between the comparison and the
                // rename, across processes (and hosts, where the shared
                // filesystem carries flock).
                // SAFETY: flock on a descriptor we own.
                if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX) } != 0 {
                    let _ = std::fs::remove_file(&temp);
                    return Err(generic(std::io::Error::last_os_error()));
                }
                let current = std::fs::metadata(&dest).ok().map(|m| e_tag(&m));
                let result = if current.is_some() && current == expected.e_tag {
                    std::fs::rename(&temp, &dest).map_err(generic)
                } else {
                    let _ = std::fs::remove_file(&temp);
                    Err(object_store::Error::Precondition {
                        path: location.to_string(),
                        source: format!("expected e-tag {:?}, found {current:?}", expected.e_tag)
                            .into(),
                    })
                };
                // SAFETY: as above; closing `dir` would release it too.
                unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_UN) };
                result
            }
        };
        if placed.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        placed?;
        dir.sync_all().map_err(generic)?;
        let meta = std::fs::metadata(&dest).map_err(generic)?;
        Ok(PutResult {
            e_tag: Some(e_tag(&meta)),
            version: None,
            extensions: Default::default(),
        })
    }
}

/// LocalFileSystem's e-tag of a file: inode, mtime (µs) and size.
fn e_tag(m: &std::fs::Metadata) -> String {
    let mtime = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default()
        .as_micros();
    format!("\"{:x}-{mtime:x}-{:x}\"", m.ino(), m.len())
}

/// Creates `dir` (`root` or below it) and every missing folder on the way
/// from `root` (whose parent must exist), each made durable in its parent.
fn create_dirs_durably(root: &FsPath, dir: &FsPath) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        if dir != root {
            create_dirs_durably(root, parent)?;
        }
        match std::fs::create_dir(dir) {
            Ok(()) => File::open(parent)?.sync_all()?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[async_trait]
impl ObjectStore for SharedFolder {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        // Blocking file I/O on the caller's runtime: the publisher and
        // readers drive their storage from threads of their own.
        self.put_blocking(location, payload, opts.mode)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::{ObjectStoreExt, UpdateVersion};

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn put(mode: PutMode) -> PutOptions {
        PutOptions {
            mode,
            ..Default::default()
        }
    }

    #[test]
    fn a_shared_folder_creates_once_and_updates_only_the_version_read() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().join("pub").display());
        let store = open_store(&url).unwrap();
        rt().block_on(async {
            let p = Path::from("states/1");
            store
                .put_opts(&p, b"one".to_vec().into(), put(PutMode::Create))
                .await
                .unwrap();
            let again = store
                .put_opts(&p, b"two".to_vec().into(), put(PutMode::Create))
                .await;
            assert!(matches!(
                again,
                Err(object_store::Error::AlreadyExists { .. })
            ));
            let got = store.get(&p).await.unwrap();
            let first = UpdateVersion {
                e_tag: got.meta.e_tag.clone(),
                version: None,
            };
            assert_eq!(&got.bytes().await.unwrap()[..], b"one");
            let r = store
                .put_opts(
                    &p,
                    b"three".to_vec().into(),
                    put(PutMode::Update(first.clone())),
                )
                .await
                .unwrap();
            // The version read before is stale now.
            let stale = store
                .put_opts(&p, b"four".to_vec().into(), put(PutMode::Update(first)))
                .await;
            assert!(matches!(
                stale,
                Err(object_store::Error::Precondition { .. })
            ));
            let got = store.get(&p).await.unwrap();
            assert_eq!(got.meta.e_tag, r.e_tag, "our e-tags are LocalFileSystem's");
            assert_eq!(&got.bytes().await.unwrap()[..], b"three");
            // Temp files never show in a listing.
            use futures::TryStreamExt;
            let listed: Vec<ObjectMeta> = store.list(None).try_collect().await.unwrap();
            assert_eq!(listed.len(), 1);
        });
    }

    #[test]
    fn urls_other_than_s3_and_absolute_file_are_refused() {
        for url in ["http://x/y", "file://relative", "/tmp/x", "s3:///prefix"] {
            assert!(open_store(url).is_err(), "{url}");
        }
    }
}
