//! Source files and event lines written by hand in Hive-fed tests: a file
//! under `root/source` with the `FileRef` a native event would name.

use std::path::Path;

use crate::event::{BlobId, Event, FileRef};
use sha2::{Digest, Sha256};

/// Writes `content` to `root/source/rel` and returns its `FileRef`.
pub fn put_file(root: &Path, rel: &str, content: &[u8]) -> FileRef {
    let p = root.join("source").join(rel);
    std::fs::create_dir_all(p.parent().expect("rel names a file")).expect("create source dir");
    std::fs::write(&p, content).expect("write source file");
    let sha = BlobId(Sha256::digest(content).into());
    let name = rel.rsplit('/').next().unwrap_or(rel);
    FileRef::native(rel, name, content.len() as u64, sha)
}

/// One native event line, parsed (the test wrote it, so it is valid).
pub fn event(line: &str) -> Event {
    Event::parse_line(line.as_bytes()).expect("valid event line")
}
