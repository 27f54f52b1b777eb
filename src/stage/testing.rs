//! Fixtures shared by the stage tests and by the tests of the checks the
//! sources hand the store (compiled in tests only).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::event::{BlobId, FileRef, Verify};

use super::durability::Unsynced;
use super::store::BlobStore;
use super::test_hooks;
use super::tmp::TMP_SHARDS;

/// Bytes the kernel copy engine copies per piece.
pub(crate) const KERNEL_COPY_PIECE_BYTES: u64 = super::copy::KERNEL_COPY_PIECE_BYTES;
/// Files at least this large take the pipelined paths.
pub(crate) const PIPELINE_MIN_BYTES: u64 = super::copy::PIPELINE_MIN_BYTES;

pub(crate) struct Fixture {
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) state: PathBuf,
    pub(crate) src: PathBuf,
    pub(crate) cm: PathBuf,
}

pub(crate) fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let (state, src, cm) = (
        dir.path().join("state"),
        dir.path().join("src"),
        dir.path().join("cm"),
    );
    for d in [&state, &src, &cm] {
        fs::create_dir_all(d).unwrap();
    }
    Fixture {
        _dir: dir,
        state,
        src,
        cm,
    }
}

pub(crate) fn sha(bytes: &[u8]) -> BlobId {
    BlobId(Sha256::digest(bytes).into())
}

pub(crate) fn file_ref(path: &str, content: &[u8]) -> FileRef {
    let name = path.rsplit('/').next().unwrap();
    FileRef::native(path, name, content.len() as u64, sha(content))
}

pub(crate) fn put(root: &Path, rel: &str, content: &[u8]) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, content).unwrap();
}

pub(crate) fn cm_name(f: &FileRef) -> String {
    format!("{}_{}", f.name, f.key().to_hex())
}

/// Temp files in the shards of `blobs/tmp`, and anything else there.
pub(crate) fn temp_count(state: &Path) -> usize {
    let tmp = state.join("blobs/tmp");
    fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap())
        .map(
            |e| match e.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) {
                Some(n) if n < TMP_SHARDS => fs::read_dir(e.path()).unwrap().count(),
                _ => 1,
            },
        )
        .sum()
}

/// A Hive reference to `dir/rel` (mapped through `--source-map` to `dir`).
pub(crate) fn hive_ref(dir: &Path, rel: &str, verify: Verify) -> FileRef {
    let mut f = FileRef::native(rel, rel.rsplit('/').next().unwrap(), 0, sha(b""));
    f.path = dir.join(rel).display().to_string();
    f.verify = verify;
    f.key = Some(sha(rel.as_bytes()));
    f.source_dir = Some(dir.display().to_string());
    f
}

pub(crate) fn store(fx: &Fixture) -> BlobStore {
    BlobStore::open(&fx.state).unwrap()
}

/// A file of `pieces` kernel-copy pieces and a bit, on the pipelined path.
pub(crate) fn multi_piece_content(pieces: u64, seed: usize) -> Vec<u8> {
    let len = (KERNEL_COPY_PIECE_BYTES * pieces) as usize + 4321;
    assert!(len as u64 >= PIPELINE_MIN_BYTES);
    (0..len).map(|i| (i * seed % 251) as u8).collect()
}

/// Fetches `f` (the only copy is at the source) while `change` runs on
/// the source file after the second piece was copied; the error text.
pub(crate) fn fetch_while_changing(
    fx: &Fixture,
    store: BlobStore,
    f: &FileRef,
    change: impl FnOnce(&Path) + 'static,
) -> String {
    let path = fx.src.join(&f.path);
    let mut change = Some(change);
    test_hooks::after_each_piece(Some(Box::new(move || {
        if let Some(change) = change.take() {
            change(&path);
        }
    })));
    let result = store.fetch(f, &fx.src, None);
    test_hooks::after_each_piece(None);
    assert_eq!(temp_count(&fx.state), 0);
    assert!(store.list().unwrap().is_empty());
    result.unwrap_err().to_string()
}

pub(crate) fn append_to(path: &Path) {
    let mut file = OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(b"appended").unwrap();
}

/// `n` verified copies of distinct contents named `{tag}-{i}`.
pub(crate) fn copies_of(
    fx: &Fixture,
    store: &BlobStore,
    tag: &str,
    n: usize,
) -> (Vec<BlobId>, Vec<Unsynced>) {
    (0..n)
        .map(|i| {
            let name = format!("{tag}-{i}");
            let content = format!("content of {name}");
            put(&fx.src, &name, content.as_bytes());
            let f = file_ref(&name, content.as_bytes());
            let copy = store
                .fetch_unsynced(&f, &fx.src, None)
                .unwrap()
                .copy
                .unwrap();
            (f.key(), copy)
        })
        .unzip()
}
