//! The copy engines: a source file into a temp file, hashing on the way.
//! In the kernel (`copy_file_range`, the copy hashed back from the page
//! cache) where the kernel can copy between the two files; otherwise
//! through userspace, pipelined (sha256 on a second thread) for large files
//! and sequential for small ones. Each checks the length as it goes: a
//! source that grows or shrinks while read is a source problem.
//! [`copy_verified`] copies one place into a temp file with the engine
//! that fits and checks what the file asks for (`verify`).

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::mpsc;
use std::thread;

use sha2::{Digest, Sha256};

use crate::durable::Writeback;
use crate::event::{BlobId, FileRef};
use crate::source_file::{Identity, Location, Remotes, SourceFile};

use super::heartbeat::heartbeat;
#[cfg(test)]
use super::test_hooks;
use super::tmp::{TempBlob, Temps};
use super::verify::{
    check_version, stream_check, CheckFailed, Digests, EventTimeMargin, Hashing, Newer,
    SourceChecks, StreamCheck,
};
use super::{store_error, StageError};

/// Read → hash → write in chunks this large: big enough that syscall and
/// per-call hashing overhead vanish, small enough to stay in L2/L3.
const COPY_BUFFER_BYTES: usize = 1 << 20;

/// Bytes [`copy_in_kernel`] copies with `copy_file_range` before hashing
/// them back: small enough that the hash follows the copy closely (the
/// piece is still in the page cache, and an 8 MiB file has two pieces to
/// overlap), large enough that the calls cost nothing. Each call is a sign
/// of progress for the fetch timeout.
pub(super) const KERNEL_COPY_PIECE_BYTES: u64 = 4 << 20;

/// Files at least this large hash on a second thread while the copy goes
/// on ([`copy_in_kernel`], [`copy_pipelined`]); below it, starting a thread
/// costs more than the overlap saves.
pub(super) const PIPELINE_MIN_BYTES: u64 = 8 << 20;

/// Buffers circulating in the pipeline: enough to keep both threads busy.
const PIPELINE_BUFFERS: usize = 4;

/// A verified copy of a file in `tmp/` ([`copy_verified`]), with its
/// content's sha256 and size.
pub(super) struct Copied {
    pub(super) temp: TempBlob,
    pub(super) blob: BlobId,
    pub(super) size: u64,
    /// The source's identity through the file read, after the copy.
    pub(super) source_after: Identity,
}

/// Copies `place` into a new temp file from `temps`, hashing and counting
/// on the way, and checks what `file.verify` asks for: size and sha256, or
/// the HDFS checksum (made by `checks`, computed in the same pass), or
/// nothing beyond a stable length; a file without a checksum must not be
/// newer than its event (with `margin`), or the version current at its
/// event is read where the place keeps versions. Returns the copy with its
/// sha256 and size. The outer `Err` is a store failure (ends the fetch);
/// the inner `Err` says why this copy is unusable (try the next place).
pub(super) fn copy_verified(
    temps: &Temps,
    checks: &dyn SourceChecks,
    remotes: &Remotes,
    margin: EventTimeMargin,
    place: &Location,
    file: &FileRef,
    sync: bool,
) -> Result<Result<Copied, String>, StageError> {
    // A local file: beneath its root, never through a link out of it,
    // and only if it is a regular file (a FIFO or device is refused
    // unopened). The size comes from the check of that very inode.
    let src = match place.open_with(remotes) {
        Ok(opened) => opened,
        Err(e) => return Ok(Err(e.to_string())),
    };
    // What the source says about the version opened (its ETag, its
    // modification time) is checked before a byte is copied: the reader
    // reads that version only. A version newer than its event may have an
    // older one beside it that was current at the event (a versioned
    // bucket): that one is read instead, under the same rule.
    let src = match check_version(&file.verify, &*src, margin) {
        Ok(()) => src,
        Err(Newer::Other(problem)) => return Ok(Err(problem)),
        Err(Newer::Than { limit_ms, problem }) => {
            // The newer version's first part is not kept while the older
            // one is read (the memory bound per fetch thread).
            let keeps_versions = src.version().is_some();
            drop(src);
            match place.open_as_of(remotes, keeps_versions, limit_ms) {
                None => return Ok(Err(problem)),
                Some(Err(why)) => return Ok(Err(format!("{problem}; {why}"))),
                Some(Ok(older)) => match check_version(&file.verify, &*older, margin) {
                    Ok(()) => {
                        tracing::debug!(
                            file = %place,
                            version = older.version().unwrap_or_default(),
                            "reading the version current at the event"
                        );
                        older
                    }
                    Err(Newer::Other(why) | Newer::Than { problem: why, .. }) => {
                        return Ok(Err(format!(
                            "{problem}; the version current at its event: {why}"
                        )))
                    }
                },
            }
        }
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
    let check = match stream_check(checks, &file.verify) {
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

    let mut temp = temps.create(&file.key())?;
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
        // A remote file (HDFS) rewritten while read (an INSERT OVERWRITE
        // reusing its name) may keep its length; its modification time or
        // block size then differ. Its bytes may be a mix of both contents:
        // not a usable copy.
        Ok(now) if src.local_file().is_none() && now != *src.identity() => {
            return Ok(Err(format!(
                "changed while reading (was {:?}, now {now:?})",
                src.identity()
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

/// Why the bytes read from a source are not the expected file, or `None`.
/// Growth is caught as soon as it happens: reading on could take arbitrarily long.
fn check_length(copied: u64, expected: u64, at_end: bool) -> Option<String> {
    if copied > expected {
        Some(format!(
            "size > {expected} expected {expected} (grew while reading)"
        ))
    } else if at_end && copied != expected {
        Some(format!(
            "size {copied} expected {expected} (shrank while reading)"
        ))
    } else {
        None
    }
}

/// Reads once into `buf` at offset `copied`, retrying on EINTR. `Err`
/// describes a source problem.
fn read_chunk(src: &dyn SourceFile, buf: &mut [u8], copied: u64) -> Result<usize, String> {
    loop {
        match src.read_at(buf, copied) {
            Ok(n) => {
                heartbeat();
                return Ok(n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("read error after {copied} bytes: {e}")),
        }
    }
}

/// Copies `src` into `temp` inside the kernel (`copy_file_range`: no copy
/// through userspace) and hashes what the temp file holds — so the bytes
/// verified are exactly the bytes stored, read back from the page cache.
///
/// The copy goes in pieces of [`KERNEL_COPY_PIECE_BYTES`], and writeback of
/// the temp is started every [`WRITEBACK_CHUNK_BYTES`] (`TempBlob`'s
/// [`Writeback`]), so the disk writes the early pieces while the later ones
/// are copied and hashed, and the final `sync_data` waits for the tail
/// only. Each piece is read back and hashed as soon as it is copied, while
/// it is still in the page cache. For a file of at least
/// [`PIPELINE_MIN_BYTES`], sha256 runs on a second thread over the
/// buffers read back ([`BufferRing`]), beside the copy of the next pieces
/// and the file's own checksum on this thread, so one large file keeps
/// two cores busy; below that size both hashes run on this thread.
///
/// The length is checked as the other paths do: a source shorter than
/// `expected` ends the copy early, a longer one (it grew after it was
/// opened) is caught by an `fstat` after the copy.
///
/// `Ok(Err(hashing))` when the kernel cannot copy between these files
/// (other filesystem, not supported): the caller copies through userspace.
/// The outer `Err` is a store failure, the inner one a source problem.
pub(super) fn copy_in_kernel(
    src: &File,
    temp: &mut TempBlob,
    expected: u64,
    mut hashing: Hashing,
) -> Result<Result<Result<Digests, String>, Hashing>, StageError> {
    let TempBlob {
        file,
        path,
        writeback,
        ..
    } = temp;
    let (file, path): (&File, &Path) = (file, path);
    // The first piece alone decides whether the kernel can copy these files
    // at all; the hashing is handed on only once it could.
    let first = match copy_piece(src, file, path, 0, expected.min(KERNEL_COPY_PIECE_BYTES)) {
        Ok(n) => n,
        Err(PieceError::Unsupported) => return Ok(Err(hashing)),
        Err(PieceError::Source(problem)) => return Ok(Ok(Err(problem))),
        Err(PieceError::Store(e)) => return Err(e),
    };
    writeback.wrote(file, first);
    let copied = if expected < PIPELINE_MIN_BYTES {
        let mut buf = vec![0u8; COPY_BUFFER_BYTES.min(expected as usize).max(1)];
        read_back(file, path, &mut buf, 0, first, |b| hashing.update(b))?;
        copy_rest(src, file, path, writeback, first, expected, |from, to| {
            read_back(file, path, &mut buf, from, to, |b| hashing.update(b))
        })?
    } else {
        let Hashing { sha, mut check } = hashing;
        // Capacity for every buffer, so neither side ever blocks on a send.
        let (to_hasher, filled) = mpsc::sync_channel::<(Vec<u8>, usize)>(PIPELINE_BUFFERS);
        let (to_copier, free) = mpsc::sync_channel::<Vec<u8>>(PIPELINE_BUFFERS);
        let (copied, sha) = thread::scope(|scope| {
            let hasher = scope.spawn(move || {
                let mut sha = sha;
                for (buf, n) in filled {
                    sha.update(&buf[..n]);
                    // The copier may have stopped early; the buffer is then dropped.
                    let _ = to_copier.send(buf);
                }
                sha
            });
            let mut ring = BufferRing {
                to_hasher,
                free,
                allocated: 0,
            };
            let copied = ring
                .hash_back(file, path, 0, first, &mut check)
                .and_then(|()| {
                    copy_rest(src, file, path, writeback, first, expected, |from, to| {
                        ring.hash_back(file, path, from, to, &mut check)
                    })
                });
            // Closing the channel lets the hasher finish.
            drop(ring);
            match hasher.join() {
                Ok(sha) => (copied, sha),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        });
        hashing = Hashing { sha, check };
        copied?
    };
    let copied = match copied {
        Ok(copied) => copied,
        Err(problem) => return Ok(Ok(Err(problem))),
    };
    if let Some(problem) = check_length(copied, expected, true) {
        return Ok(Ok(Err(problem)));
    }
    // Growth after the last byte: the caller's `fstat` (copy_verified).
    Ok(Ok(Ok(hashing.finish())))
}

/// The read-back side of [`copy_in_kernel`] for a large file: reads each
/// copied piece back into one of [`PIPELINE_BUFFERS`] buffers, feeds it to
/// the file's own checksum on this thread and hands it to the sha256
/// thread, which gives it back. So the bytes are read back once, sha256
/// (the slowest step) runs beside the copy, the checksum and the read-back,
/// and memory stays bounded.
struct BufferRing {
    to_hasher: mpsc::SyncSender<(Vec<u8>, usize)>,
    free: mpsc::Receiver<Vec<u8>>,
    allocated: usize,
}

impl BufferRing {
    /// Reads bytes `from..to` of `file` back, feeding `check` and the
    /// sha256 thread. Returns early, without error, only when the sha256
    /// thread is gone: its join reports why.
    fn hash_back(
        &mut self,
        file: &File,
        path: &Path,
        from: u64,
        to: u64,
        check: &mut Option<Box<dyn StreamCheck>>,
    ) -> Result<(), StageError> {
        use std::os::unix::fs::FileExt;
        let mut at = from;
        while at < to {
            let mut buf = if self.allocated < PIPELINE_BUFFERS {
                self.allocated += 1;
                vec![0u8; COPY_BUFFER_BYTES]
            } else {
                match self.free.recv() {
                    Ok(buf) => buf,
                    Err(_) => return Ok(()),
                }
            };
            let n = buf.len().min((to - at) as usize);
            file.read_exact_at(&mut buf[..n], at)
                .map_err(|e| store_error("reading back", path, e))?;
            if let Some(check) = check.as_mut() {
                check.update(&buf[..n]);
            }
            heartbeat();
            if self.to_hasher.send((buf, n)).is_err() {
                return Ok(());
            }
            at += n as u64;
        }
        Ok(())
    }
}

/// Why [`copy_piece`] stopped.
enum PieceError {
    /// The kernel cannot copy between these files (only before any byte).
    Unsupported,
    /// Reading the source failed.
    Source(String),
    /// Writing the store failed (full disk).
    Store(StageError),
}

/// Copies up to `len` bytes from `src` to `dst` at both files' positions
/// with `copy_file_range`, `at` bytes having been copied before. Returns
/// the bytes copied: fewer than `len` only at the source's end.
fn copy_piece(
    src: &File,
    dst: &File,
    dst_path: &Path,
    at: u64,
    len: u64,
) -> Result<u64, PieceError> {
    use std::os::fd::AsRawFd;
    let mut done = 0u64;
    while done < len {
        // SAFETY: two valid open descriptors; null offsets use and advance
        // the files' own positions.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                std::ptr::null_mut(),
                dst.as_raw_fd(),
                std::ptr::null_mut(),
                (len - done) as usize,
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            let copied = at + done;
            return match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EXDEV | libc::ENOSYS | libc::EOPNOTSUPP | libc::EINVAL)
                    if copied == 0 =>
                {
                    Err(PieceError::Unsupported)
                }
                Some(libc::ENOSPC | libc::EDQUOT) => {
                    Err(PieceError::Store(store_error("writing", dst_path, e)))
                }
                _ => Err(PieceError::Source(format!(
                    "copy error after {copied} bytes: {e}"
                ))),
            };
        }
        if n == 0 {
            break; // the source is shorter than it said
        }
        heartbeat();
        done += n as u64;
    }
    Ok(done)
}

/// Copies pieces after the first `copied` bytes until `expected` or the
/// source's end, starting writeback as it goes and handing each piece's
/// range to `piece` (which hashes it, or has it hashed). Returns the bytes
/// copied in all; the inner `Err` is a source problem.
fn copy_rest(
    src: &File,
    dst: &File,
    dst_path: &Path,
    writeback: &mut Writeback,
    mut copied: u64,
    expected: u64,
    mut piece: impl FnMut(u64, u64) -> Result<(), StageError>,
) -> Result<Result<u64, String>, StageError> {
    while copied < expected {
        let want = (expected - copied).min(KERNEL_COPY_PIECE_BYTES);
        let n = match copy_piece(src, dst, dst_path, copied, want) {
            Ok(n) => n,
            Err(PieceError::Store(e)) => return Err(e),
            Err(PieceError::Source(problem)) => return Ok(Err(problem)),
            // Only before the first byte, which the caller copied.
            Err(PieceError::Unsupported) => {
                return Ok(Err(format!("copy error after {copied} bytes")))
            }
        };
        if n == 0 {
            break;
        }
        writeback.wrote(dst, n);
        piece(copied, copied + n)?;
        copied += n;
        #[cfg(test)]
        test_hooks::piece_copied();
        if n < want {
            break;
        }
    }
    Ok(Ok(copied))
}

/// Reads bytes `from..to` of the temp file `file` back (from the page
/// cache) through `buf`, handing every chunk to `f`. They are bytes this
/// process wrote, so a short read is a store failure.
fn read_back(
    file: &File,
    path: &Path,
    buf: &mut [u8],
    from: u64,
    to: u64,
    mut f: impl FnMut(&[u8]),
) -> Result<(), StageError> {
    use std::os::unix::fs::FileExt;
    let mut at = from;
    while at < to {
        let n = buf.len().min((to - at) as usize);
        let chunk = &mut buf[..n];
        file.read_exact_at(chunk, at)
            .map_err(|e| store_error("reading back", path, e))?;
        f(chunk);
        heartbeat();
        at += n as u64;
    }
    Ok(())
}

/// Copies `src` into `temp`, returning the digests of what was written. The
/// outer `Err` is a store failure, the inner one a source problem.
pub(super) fn copy_sequential(
    src: &dyn SourceFile,
    temp: &mut TempBlob,
    expected: u64,
    mut hashing: Hashing,
) -> Result<Result<Digests, String>, StageError> {
    let mut buf = vec![0u8; COPY_BUFFER_BYTES.min(expected as usize + 1).max(1)];
    let mut copied = 0u64;
    loop {
        let n = match read_chunk(src, &mut buf, copied) {
            Ok(n) => n,
            Err(problem) => return Ok(Err(problem)),
        };
        copied += n as u64;
        if let Some(problem) = check_length(copied, expected, n == 0) {
            return Ok(Err(problem));
        }
        if n == 0 {
            return Ok(Ok(hashing.finish()));
        }
        hashing.update(&buf[..n]);
        temp.write(&buf[..n])?;
    }
}

/// Like [`copy_sequential`], but hashes on a second thread. SHA-256 (even
/// with SHA-NI) is the slowest step, so overlapping it with the read and
/// write syscalls is what brings staging up to `cp` speed. Each buffer is
/// written first and then handed to the hasher, so exactly the bytes written
/// are hashed; a fixed set of buffers circulates, so memory stays bounded.
pub(super) fn copy_pipelined(
    src: &dyn SourceFile,
    temp: &mut TempBlob,
    expected: u64,
    mut hashing: Hashing,
) -> Result<Result<Digests, String>, StageError> {
    // Capacity for every buffer, so neither side ever blocks on a send.
    let (to_hasher, filled) = mpsc::sync_channel::<(Vec<u8>, usize)>(PIPELINE_BUFFERS);
    let (to_reader, free) = mpsc::sync_channel::<Vec<u8>>(PIPELINE_BUFFERS);
    thread::scope(|scope| {
        let hasher = scope.spawn(move || {
            for (buf, n) in filled {
                hashing.update(&buf[..n]);
                // The reader may have stopped early; the buffer is then dropped.
                let _ = to_reader.send(buf);
            }
            hashing.finish()
        });

        let mut allocated = 0;
        let mut copied = 0u64;
        let outcome = loop {
            let mut buf = if allocated < PIPELINE_BUFFERS {
                allocated += 1;
                vec![0u8; COPY_BUFFER_BYTES]
            } else {
                match free.recv() {
                    Ok(buf) => buf,
                    // Only if the hasher died; its join below reports why.
                    Err(_) => break Ok(None),
                }
            };
            let n = match read_chunk(src, &mut buf, copied) {
                Ok(n) => n,
                Err(problem) => break Ok(Some(problem)),
            };
            copied += n as u64;
            if let Some(problem) = check_length(copied, expected, n == 0) {
                break Ok(Some(problem));
            }
            if n == 0 {
                break Ok(None);
            }
            if let Err(e) = temp.write(&buf[..n]) {
                break Err(e);
            }
            if to_hasher.send((buf, n)).is_err() {
                break Ok(None);
            }
        };
        // Closing the channel lets the hasher finish.
        drop(to_hasher);
        let digest = match hasher.join() {
            Ok(digest) => digest,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        match outcome {
            Err(store_failure) => Err(store_failure),
            Ok(Some(problem)) => Ok(Err(problem)),
            Ok(None) => Ok(Ok(digest)),
        }
    })
}

fn advise_sequential(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open fd; the call is advisory only. Failure just
        // means default readahead, so the result is ignored.
        unsafe {
            libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

#[cfg(test)]
mod tests {
    use super::{KERNEL_COPY_PIECE_BYTES, PIPELINE_MIN_BYTES};
    use crate::stage::testing::*;
    use crate::stage::{BlobStore, FetchOutcome};
    use std::fs::{self, OpenOptions};

    #[test]
    fn large_file_is_verified_on_the_pipelined_path() {
        let fx = fixture();
        let good: Vec<u8> = (0..PIPELINE_MIN_BYTES as usize * 2 + 12345)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let f = file_ref("db/t/big", &good);
        let mut corrupt = good.clone();
        *corrupt.last_mut().unwrap() ^= 1;
        put(&fx.src, &f.path, &corrupt);
        put(&fx.cm, &cm_name(&f), &good);
        let store = BlobStore::open(&fx.state).unwrap();

        assert_eq!(
            store.fetch(&f, &fx.src, Some(&fx.cm)).unwrap(),
            FetchOutcome::FromChangeManagement
        );
        assert!(fs::read(store.path(&f.key())).unwrap() == good);
        assert_eq!(store.staged_bytes(), good.len() as u64);
        assert_eq!(temp_count(&fx.state), 0);
    }

    #[test]
    fn multi_piece_source_growing_mid_copy_is_unusable() {
        let fx = fixture();
        let content = multi_piece_content(3, 7);
        let f = file_ref("db/t/grows", &content);
        put(&fx.src, &f.path, &content);
        let err = fetch_while_changing(&fx, store(&fx), &f, append_to);
        assert!(err.contains("grew while reading"), "{err}");
    }

    #[test]
    fn multi_piece_source_shrinking_mid_copy_is_unusable() {
        let fx = fixture();
        let content = multi_piece_content(3, 11);
        let f = file_ref("db/t/shrinks", &content);
        put(&fx.src, &f.path, &content);
        let keep = KERNEL_COPY_PIECE_BYTES * 2 + 10;
        let err = fetch_while_changing(&fx, store(&fx), &f, move |path| {
            let file = OpenOptions::new().write(true).open(path).unwrap();
            file.set_len(keep).unwrap();
        });
        assert!(err.contains("shrank while reading"), "{err}");
    }
}
