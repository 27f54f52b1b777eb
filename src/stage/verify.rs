//! What a copy is checked with: its size and sha256 (the blob's name, and
//! for a native file the expected content), and the checksum a source's
//! files carry beyond that ([`StreamCheck`], made by the source's
//! [`SourceChecks`]: the Hive source's HDFS file checksum), fed the same
//! bytes in the same pass. The copy engines (`copy_verified`) hash with
//! [`Hashing`] and compare what the file asks for.

use sha2::{Digest, Sha256};

use crate::event::{BlobId, Verify};

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
/// [`BlobStore::with_checks`](super::BlobStore::with_checks) by whoever
/// wires the pipeline.
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
pub(super) fn stream_check(
    checks: &dyn SourceChecks,
    verify: &Verify,
) -> Result<Option<Box<dyn StreamCheck>>, String> {
    match verify {
        Verify::Sha256 { .. } | Verify::None => Ok(None),
        Verify::Hdfs { .. } => checks.stream_check(verify),
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::stage::testing::*;
    use crate::stage::StageError;

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
