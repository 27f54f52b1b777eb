//! What a copy is checked with: its size and sha256 (the blob's name, and
//! for a native file the expected content), and the checksum a source's
//! files carry beyond that ([`StreamCheck`], made by the source's
//! [`SourceChecks`]: the Hive source's HDFS file checksum), fed the same
//! bytes in the same pass. [`BlobStore::copy_verified`] copies one place
//! into a temp file and checks what the file asks for.

use sha2::{Digest, Sha256};

use crate::event::{BlobId, FileRef, Verify};
use crate::source_file::{Identity, Location};

use super::copy::{
    advise_sequential, copy_in_kernel, copy_pipelined, copy_sequential, read_back,
    COPY_BUFFER_BYTES, PIPELINE_MIN_BYTES,
};
use super::store::{BlobStore, TempBlob};
use super::StageError;

/// A checksum other than sha256 that a file is checked with, fed the same
/// bytes in the same pass (Hive's HDFS file checksum).
pub trait StreamCheck: Send {
    fn update(&mut self, bytes: &[u8]);
    /// `Ok` when the bytes fed match; else what was found, and maybe
    /// another check to feed the same bytes before giving up.
    fn verify(self: Box<Self>) -> Result<(), CheckFailed>;
}

/// A [`StreamCheck`] that did not match.
pub struct CheckFailed {
    /// What was found (the whole story when `again` is `None`).
    pub problem: String,
    /// A further check of the same bytes that may still match (the HDFS
    /// checksum's other CRC type, needed only for old clusters): the stager
    /// feeds it the stored copy, never the source, which may have changed.
    pub again: Option<Box<dyn StreamCheck>>,
}

/// Makes the check a file's [`Verify`] asks for beyond size and sha256
/// (which the store checks itself), for the source that knows what it
/// means: the Hive source's HDFS file checksum
/// (`source::hive::checksum::HdfsChecks`). Handed to the store with
/// [`BlobStore::with_checks`] by whoever wires the pipeline.
pub trait SourceChecks: Send + Sync + std::fmt::Debug {
    /// The check for `verify`, ready to be fed; `Ok(None)` when there is
    /// none beyond sha256; `Err` when the expected value cannot be a
    /// checksum of its kind (or this source knows no such kind).
    fn stream_check(&self, verify: &Verify) -> Result<Option<Box<dyn StreamCheck>>, String>;
}

/// The store's [`SourceChecks`] until it is given others: none.
#[derive(Debug)]
pub(super) struct NoSourceChecks;

impl SourceChecks for NoSourceChecks {
    fn stream_check(&self, verify: &Verify) -> Result<Option<Box<dyn StreamCheck>>, String> {
        Err(format!(
            "no check for {} checksums is configured",
            verify.label()
        ))
    }
}

/// The checksum `verify` asks for beyond sha256, ready to be fed; `Err`
/// when the expected value cannot be a checksum of that kind.
fn stream_check(
    checks: &dyn SourceChecks,
    verify: &Verify,
) -> Result<Option<Box<dyn StreamCheck>>, String> {
    match verify {
        Verify::Sha256 { .. } | Verify::None => Ok(None),
        Verify::Hdfs { .. } => checks.stream_check(verify),
    }
}

/// Verifies `check`, fed the whole copy; while it offers a further check,
/// feeds that the `size` bytes stored in `temp` and verifies it, so what is
/// verified is always the blob to be. The inner `Err` says why the copy is
/// unusable.
fn verify_stored(
    mut check: Box<dyn StreamCheck>,
    temp: &TempBlob,
    size: u64,
) -> Result<Result<(), String>, StageError> {
    let mut buf = Vec::new();
    loop {
        match check.verify() {
            Ok(()) => return Ok(Ok(())),
            Err(CheckFailed {
                problem,
                again: None,
            }) => return Ok(Err(problem)),
            Err(CheckFailed {
                again: Some(mut again),
                ..
            }) => {
                if buf.is_empty() {
                    buf = vec![0u8; COPY_BUFFER_BYTES.min(size as usize).max(1)];
                }
                read_back(&temp.file, &temp.path, &mut buf, 0, size, |b| {
                    again.update(b)
                })?;
                check = again;
            }
        }
    }
}

/// The hashes computed while copying: sha256 always (the blob's name),
/// and the file's own checksum when it has one.
pub(super) struct Hashing {
    pub(super) sha: Sha256,
    pub(super) check: Option<Box<dyn StreamCheck>>,
}

impl Hashing {
    pub(super) fn update(&mut self, bytes: &[u8]) {
        self.sha.update(bytes);
        if let Some(check) = self.check.as_mut() {
            check.update(bytes);
        }
    }

    pub(super) fn finish(self) -> Digests {
        (BlobId(self.sha.finalize().into()), self.check)
    }
}

/// The sha256 of the bytes copied, and the checksum still to be compared.
pub(super) type Digests = (BlobId, Option<Box<dyn StreamCheck>>);

/// A verified copy of a file in `tmp/` ([`BlobStore::copy_verified`]),
/// with its content's sha256 and size.
pub(super) struct Copied {
    pub(super) temp: TempBlob,
    pub(super) blob: BlobId,
    pub(super) size: u64,
    /// The source's identity through the file read, after the copy.
    pub(super) source_after: Identity,
}

impl BlobStore {
    /// Copies `place` into a new temp file, hashing and counting on the way,
    /// and checks what `file.verify` asks for: size and sha256, or the HDFS
    /// checksum (computed in the same pass), or nothing beyond a stable
    /// length. Returns the copy with its sha256 and size. The outer `Err` is
    /// a store failure (ends the fetch); the inner `Err` says why this copy
    /// is unusable (try the next place).
    pub(super) fn copy_verified(
        &self,
        place: &Location,
        file: &FileRef,
        sync: bool,
    ) -> Result<Result<Copied, String>, StageError> {
        // A local file: beneath its root, never through a link out of it,
        // and only if it is a regular file (a FIFO or device is refused
        // unopened). The size comes from the check of that very inode.
        let src = match place.open() {
            Ok(opened) => opened,
            Err(e) => return Ok(Err(e.to_string())),
        };
        let expected = src.identity().size;
        let known = file.known();
        // Checked before copying so a wrong multi-GiB file costs nothing. A
        // file known only by its checksum must keep the length it had when
        // opened: growth or shrinking while reading is caught.
        if let Some((_, size)) = known {
            if expected != size {
                return Ok(Err(format!("size {expected} expected {size}")));
            }
        }
        let check = match stream_check(&*self.checks, &file.verify) {
            Ok(check) => check,
            Err(problem) => return Ok(Err(problem)),
        };
        let hashing = Hashing {
            sha: Sha256::new(),
            check,
        };
        if expected > COPY_BUFFER_BYTES as u64 {
            // Below one buffer the readahead window does not matter.
            if let Some(local) = src.local_file() {
                advise_sequential(local);
            }
        }

        let mut temp = self.create_temp(&file.key())?;
        // In the kernel where the file is local (and the kernel can copy
        // between the two filesystems), else through userspace.
        let in_kernel = match src.local_file() {
            Some(local) => copy_in_kernel(local, &mut temp, expected, hashing)?,
            None => Err(hashing),
        };
        let copied = match in_kernel {
            Ok(result) => result,
            Err(hashing) if expected >= PIPELINE_MIN_BYTES => {
                copy_pipelined(&*src, &mut temp, expected, hashing)?
            }
            Err(hashing) => copy_sequential(&*src, &mut temp, expected, hashing)?,
        };
        let (got, check) = match copied {
            Ok(digests) => digests,
            Err(problem) => return Ok(Err(problem)),
        };
        // `copy_file_range` never reads past `expected`: growth after the
        // last byte read shows only in the size. The caller also compares
        // the whole identity with what it listed.
        let source_after = match src.identity_now() {
            Ok(now) if now.size > expected => {
                return Ok(Err(format!(
                    "size {} expected {expected} (grew while reading)",
                    now.size
                )))
            }
            Ok(now) => now,
            Err(e) => return Ok(Err(format!("cannot stat after the copy: {e}"))),
        };
        if let Some((sha, _)) = known {
            if got != sha {
                return Ok(Err(format!("sha mismatch (content hashes to {got})")));
            }
        }
        if let Some(check) = check {
            if let Err(problem) = verify_stored(check, &temp, expected)? {
                return Ok(Err(problem));
            }
        }
        if sync {
            temp.sync_data()?;
        }
        Ok(Ok(Copied {
            temp,
            blob: got,
            size: expected,
            source_after,
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::stage::testing::*;

    #[test]
    fn a_check_the_store_was_not_given_makes_the_copy_unusable_with_the_reason() {
        let fx = fixture();
        put(&fx.src, "t/000000_0", b"hive bytes");
        let f = hive_ref(
            &fx.src,
            "t/000000_0",
            Verify::Hdfs {
                checksum: "00".into(),
            },
        );
        let err = store(&fx).fetch(&f, Path::new(""), None).unwrap_err();
        let StageError::Unavailable { detail, .. } = &err else {
            panic!("{err:?}")
        };
        assert!(
            detail.contains("no check for hdfs-md5md5crc32c checksums is configured"),
            "{detail}"
        );
        assert_eq!(temp_count(&fx.state), 0);
    }
}
