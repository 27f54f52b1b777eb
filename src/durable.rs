//! Durable file writes: the one place that knows the fsync orders.
//!
//! - Small state files that are replaced whole (pins) go through
//!   [`write_atomic`]: write temp, fsync, rename, fsync parent directory,
//!   so a crash leaves either the old or the new content, never a mix.
//! - Records written often (the commit record) are appended to a
//!   [`RecordLog`]: length + crc32c + payload, one `fdatasync` per append.
//!   A crash mid-append leaves a torn tail, which readers skip and the next
//!   writer cuts off; every record before it is intact.
//! - Blob staging uses [`fsync_dir`] after its own rename because it
//!   streams large files.
//!
//! Callers: `catalog` (commit log, pins), `stage` (blobs), the journal.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Replaces `path` with `bytes` atomically and durably.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(path, |w| w.write_all(bytes)).map(|_| ())
}

/// Like [`write_atomic`], with the content streamed by `write` (through a
/// buffer) instead of held in memory; returns the file's size.
pub fn write_atomic_with(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<u64> {
    write_atomic_paced(path, None, write)
}

/// Like [`write_atomic_with`], for large files written in the background
/// (checkpoints): with `max_bytes_per_s`, the writes are held to that rate
/// and the file is `fdatasync`ed every [`PACED_SYNC_EVERY`] bytes, so a
/// commit's flush never finds more than one step of this file waiting.
/// Unpaced, a commit's flush waits for everything written before it (on a
/// virtual disk the flush also empties the host's cache of it): measured
/// on this kind of machine, 8 files of 73 MiB written at full speed with
/// only the final fsync kept a 200-byte append's `fdatasync` above 20 ms
/// for 413 ms in all; written at 32 MiB/s with a sync every 2 MiB, 85 ms
/// (docs/BENCHMARKS.md, "Checkpoints and restart"). The writer sleeps
/// between writes, at most one buffer (1 MiB) at the rate, so a stop flag
/// checked by `write` is still seen promptly.
pub fn write_atomic_paced(
    path: &Path,
    max_bytes_per_s: Option<u64>,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<u64> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} has no file name", path.display()),
        )
    })?;
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    let size = {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        let pace = max_bytes_per_s.filter(|&r| r > 0).map(|rate| Pace {
            started: Instant::now(),
            bytes_per_s: rate,
            synced: 0,
        });
        let file = WritebackFile {
            file: f,
            writeback: Writeback::every(WRITEBACK_EVERY),
            pace,
        };
        let mut w = io::BufWriter::with_capacity(1 << 20, file);
        write(&mut w)?;
        let f = w.into_inner().map_err(io::IntoInnerError::into_error)?.file;
        f.sync_all()?;
        f.metadata()?.len()
    };
    fs::rename(&tmp, path)?;
    fsync_dir(dir)?;
    Ok(size)
}

/// Writeback of a file written front to back, started every `every`
/// bytes (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which queues the pages
/// without waiting), so the final flush of a large file (a blob, a
/// checkpoint) has little left to do and does not hold the disk for long
/// while commits wait for their own flush. Only a hint: the file's
/// `fsync`/`fdatasync` is what makes it durable.
pub(crate) struct Writeback {
    every: u64,
    written: u64,
    /// Offset up to which writeback has been started.
    from: u64,
}

impl Writeback {
    pub(crate) fn every(every: u64) -> Writeback {
        Writeback {
            every,
            written: 0,
            from: 0,
        }
    }

    /// `n` more bytes were written to `file` at its end (by `write` or
    /// `copy_file_range`); starts writeback
    /// of what waits once that is `every` bytes or more.
    pub(crate) fn wrote(&mut self, file: &File, n: u64) {
        self.written += n;
        #[cfg(target_os = "linux")]
        if self.written - self.from >= self.every {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid open fd and an in-range byte span; the call
            // only queues writeback, and failure is harmless (the final
            // sync still writes everything), so its result is ignored.
            unsafe {
                libc::sync_file_range(
                    file.as_raw_fd(),
                    self.from as libc::off64_t,
                    (self.written - self.from) as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WRITE,
                );
            }
            self.from = self.written;
        }
    }

    /// `n` more bytes were written, whose writeback the caller handles
    /// itself; returns the bytes written so far.
    fn wrote_unstarted(&mut self, n: u64) -> u64 {
        self.written += n;
        self.written
    }
}

/// Bytes between two writeback starts of [`write_atomic_with`]'s file.
const WRITEBACK_EVERY: u64 = 8 << 20;

/// Bytes between two `fdatasync`s of a paced [`write_atomic_paced`].
pub const PACED_SYNC_EVERY: u64 = 2 << 20;

/// The rate a paced write is held to, and how far it is synced.
struct Pace {
    started: Instant,
    bytes_per_s: u64,
    synced: u64,
}

/// A file whose writes go through a [`Writeback`], and are paced.
struct WritebackFile {
    file: File,
    writeback: Writeback,
    pace: Option<Pace>,
}

impl Write for WritebackFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        let Some(pace) = &mut self.pace else {
            self.writeback.wrote(&self.file, n as u64);
            return Ok(n);
        };
        let written = self.writeback.wrote_unstarted(n as u64);
        if written - pace.synced >= PACED_SYNC_EVERY {
            self.file.sync_data()?;
            pace.synced = written;
        }
        let due = Duration::from_secs_f64(written as f64 / pace.bytes_per_s as f64);
        if let Some(early) = due.checked_sub(pace.started.elapsed()) {
            std::thread::sleep(early);
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Bytes cut per step by [`remove_in_steps`], and the pause after each.
const REMOVE_STEP: u64 = 4 << 20;
const REMOVE_PAUSE: Duration = Duration::from_millis(20);

/// Deletes a large file by cutting it from the end in steps of 4 MiB, 20 ms
/// apart, then unlinking it. Freeing a whole large file at once makes one
/// big journal commit (with the `discard` mount option, one that waits for
/// the device to discard every extent), and every commit's `fdatasync`
/// waits for it: measured here, deleting a 73 MiB file at once held such
/// a flush above 20 ms for ~80 ms, in steps for ~10 ms. The file must no
/// longer be needed by anyone: readers holding it open see it shrink.
/// Once `stop` is set, the rest goes at once (shutdown must be prompt).
pub fn remove_in_steps(path: &Path, stop: Option<&AtomicBool>) -> io::Result<()> {
    let file = match OpenOptions::new().write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut size = file.metadata()?.len();
    while size > REMOVE_STEP && !stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
        size -= REMOVE_STEP;
        file.set_len(size)?;
        std::thread::sleep(REMOVE_PAUSE);
    }
    drop(file);
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Makes a directory's entries (renames, creates, unlinks) durable.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// First bytes of every [`RecordLog`] file: the format and its version.
const LOG_MAGIC: &[u8; 8] = b"SFRLOG1\n";
/// Bytes before each record's payload: length (u32 LE), crc32c (u32 LE).
const RECORD_HEADER: usize = 8;
/// No record stagefs writes comes near this; a longer length is damage.
const MAX_RECORD: usize = 16 << 20;

/// What a [`RecordLog`] file holds.
#[derive(Debug, Default)]
pub struct LogContents {
    /// Every whole, checksum-valid record, oldest first.
    pub records: Vec<Vec<u8>>,
    /// Bytes up to the end of the last valid record.
    pub valid_len: u64,
    /// Why the bytes after `valid_len` were not records (a torn append),
    /// when there are any.
    pub torn: Option<String>,
}

/// Reads a record log without changing it; `None` when the file does not
/// exist. A torn tail is reported in [`LogContents::torn`], not an error;
/// a file that does not start with the log's magic is an error.
pub fn read_log(path: &Path) -> io::Result<Option<LogContents>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    parse_log(&bytes).map(Some).map_err(|detail| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {detail}", path.display()),
        )
    })
}

fn parse_log(bytes: &[u8]) -> Result<LogContents, String> {
    if bytes.len() < LOG_MAGIC.len() {
        // Created but its magic never became durable: an empty log.
        return Ok(LogContents {
            torn: (!bytes.is_empty()).then(|| "partial file header".to_string()),
            ..LogContents::default()
        });
    }
    if &bytes[..LOG_MAGIC.len()] != LOG_MAGIC {
        return Err("not a stagefs record log (bad magic)".to_string());
    }
    let mut out = LogContents {
        valid_len: LOG_MAGIC.len() as u64,
        ..LogContents::default()
    };
    let mut at = LOG_MAGIC.len();
    while at < bytes.len() {
        let rest = &bytes[at..];
        let torn = if rest.len() < RECORD_HEADER {
            Some(format!("{} bytes of a record header", rest.len()))
        } else {
            let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
            if len > MAX_RECORD {
                Some(format!("record length {len} is not plausible"))
            } else if rest.len() < RECORD_HEADER + len {
                Some(format!(
                    "record of {len} bytes cut after {}",
                    rest.len() - RECORD_HEADER
                ))
            } else if crc32c::crc32c(&rest[RECORD_HEADER..RECORD_HEADER + len]) != crc {
                Some("record checksum mismatch".to_string())
            } else {
                out.records
                    .push(rest[RECORD_HEADER..RECORD_HEADER + len].to_vec());
                at += RECORD_HEADER + len;
                out.valid_len = at as u64;
                None
            }
        };
        if let Some(reason) = torn {
            // Appends are the only writes, so whatever fails to parse is
            // the tail of an append that never became durable.
            out.torn = Some(format!(
                "{reason} at offset {at} ({} bytes cut)",
                bytes.len() - at
            ));
            break;
        }
    }
    Ok(out)
}

fn encode_record(out: &mut Vec<u8>, payload: &[u8]) -> io::Result<()> {
    if payload.len() > MAX_RECORD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("record of {} bytes exceeds {MAX_RECORD}", payload.len()),
        ));
    }
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// An append-only file of length-prefixed, crc32c-checked records; each
/// [`RecordLog::append`] is durable after one `fdatasync`, where replacing
/// a file costs two flushes (file, then directory). The single writer of
/// its file; [`read_log`] is the reader's side.
pub struct RecordLog {
    file: File,
    path: PathBuf,
    len: u64,
}

impl RecordLog {
    /// Opens (or creates) the log for appending. A torn tail is cut off
    /// durably before anything is appended; the records found are
    /// returned.
    pub fn open(path: &Path) -> io::Result<(RecordLog, LogContents)> {
        let contents = read_log(path)?;
        let Some(contents) = contents.filter(|c| c.valid_len > 0) else {
            // Missing, or created without a durable header: start afresh.
            let mut header = Vec::with_capacity(LOG_MAGIC.len());
            header.extend_from_slice(LOG_MAGIC);
            write_atomic(path, &header)?;
            let file = OpenOptions::new().read(true).write(true).open(path)?;
            let log = RecordLog {
                file,
                path: path.to_owned(),
                len: LOG_MAGIC.len() as u64,
            };
            return Ok((log, LogContents::default()));
        };
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        if contents.torn.is_some() {
            file.set_len(contents.valid_len)?;
            file.sync_data()?;
        }
        let log = RecordLog {
            file,
            path: path.to_owned(),
            len: contents.valid_len,
        };
        Ok((log, contents))
    }

    /// Appends one record and makes it durable (one `fdatasync`). On error
    /// the record may or may not be in the file; the next append
    /// overwrites whatever part of it was written.
    pub fn append(&mut self, payload: &[u8]) -> io::Result<()> {
        let mut buf = Vec::with_capacity(RECORD_HEADER + payload.len());
        encode_record(&mut buf, payload)?;
        self.file.write_all_at(&buf, self.len)?;
        self.file.sync_data()?;
        self.len += buf.len() as u64;
        Ok(())
    }

    /// Replaces the whole log with `payloads` (compaction), atomically and
    /// durably (temp + fsync + rename + directory fsync).
    pub fn rewrite(&mut self, payloads: &[&[u8]]) -> io::Result<()> {
        let mut bytes = LOG_MAGIC.to_vec();
        for p in payloads {
            encode_record(&mut bytes, p)?;
        }
        write_atomic(&self.path, &bytes)?;
        self.file = OpenOptions::new().read(true).write(true).open(&self.path)?;
        self.len = bytes.len() as u64;
        Ok(())
    }

    /// Bytes in the file (header and records).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the log holds no record.
    pub fn is_empty(&self) -> bool {
        self.len <= LOG_MAGIC.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_content_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("commit");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_paced_write_stores_every_byte_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("checkpoint");
        // Several sync steps, written in pieces that do not line up with them.
        let bytes: Vec<u8> = (0..(5 * PACED_SYNC_EVERY + 12_345) as usize)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let size = write_atomic_paced(&p, Some(1 << 40), |w| {
            for piece in bytes.chunks(300_001) {
                w.write_all(piece)?;
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(size, bytes.len() as u64);
        assert_eq!(fs::read(&p).unwrap(), bytes);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn remove_in_steps_deletes_a_large_file_and_a_missing_one_is_fine() {
        let dir = tempfile::tempdir().unwrap();
        for stop in [false, true] {
            let p = dir.path().join(format!("old-{stop}"));
            let f = File::create(&p).unwrap();
            f.set_len(3 * REMOVE_STEP + 17).unwrap();
            drop(f);
            let flag = AtomicBool::new(stop);
            remove_in_steps(&p, Some(&flag)).unwrap();
            assert!(!p.exists());
            remove_in_steps(&p, None).unwrap();
        }
    }

    fn appended(path: &Path, records: &[&[u8]]) {
        let (mut log, _) = RecordLog::open(path).unwrap();
        for r in records {
            log.append(r).unwrap();
        }
    }

    #[test]
    fn record_log_returns_its_records_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        appended(&p, &[b"one", b"two"]);
        let (mut log, found) = RecordLog::open(&p).unwrap();
        assert_eq!(found.records, vec![b"one".to_vec(), b"two".to_vec()]);
        assert!(found.torn.is_none());
        log.append(b"three").unwrap();
        let read = read_log(&p).unwrap().unwrap();
        assert_eq!(read.records.len(), 3);
        assert_eq!(read.valid_len, log.len());
    }

    #[test]
    fn torn_record_log_tail_is_skipped_then_cut_by_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        appended(&p, &[b"first", b"second"]);
        let whole = fs::read(&p).unwrap();
        // Every cut inside the last record leaves exactly the first one.
        let second_starts = LOG_MAGIC.len() + RECORD_HEADER + b"first".len();
        for cut in second_starts + 1..whole.len() {
            fs::write(&p, &whole[..cut]).unwrap();
            let read = read_log(&p).unwrap().unwrap();
            assert_eq!(read.records, vec![b"first".to_vec()], "cut at {cut}");
            assert!(read.torn.is_some(), "cut at {cut}");
        }
        // A flipped payload byte fails the checksum.
        let mut flipped = whole.clone();
        *flipped.last_mut().unwrap() ^= 1;
        fs::write(&p, &flipped).unwrap();
        let (mut log, found) = RecordLog::open(&p).unwrap();
        assert_eq!(found.records, vec![b"first".to_vec()]);
        assert!(found.torn.unwrap().contains("checksum"));
        assert_eq!(fs::metadata(&p).unwrap().len(), second_starts as u64);
        log.append(b"again").unwrap();
        let read = read_log(&p).unwrap().unwrap();
        assert_eq!(read.records, vec![b"first".to_vec(), b"again".to_vec()]);
        assert!(read.torn.is_none());
    }

    #[test]
    fn record_log_without_durable_header_starts_empty_and_foreign_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        fs::write(&p, &LOG_MAGIC[..3]).unwrap();
        let (log, found) = RecordLog::open(&p).unwrap();
        assert!(found.records.is_empty() && log.is_empty());
        fs::write(&p, b"{\"visible\": 3}").unwrap();
        let err = read_log(&p).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(RecordLog::open(&p).is_err());
    }

    #[test]
    fn record_log_rewrite_keeps_only_the_given_records() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        let (mut log, _) = RecordLog::open(&p).unwrap();
        for i in 0..10u8 {
            log.append(&[i; 40]).unwrap();
        }
        log.rewrite(&[b"last"]).unwrap();
        log.append(b"next").unwrap();
        let read = read_log(&p).unwrap().unwrap();
        assert_eq!(read.records, vec![b"last".to_vec(), b"next".to_vec()]);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
