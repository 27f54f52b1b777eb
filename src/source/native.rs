//! The native source (SPEC §2 "Native event format"): follows the `--events`
//! folder and turns each complete line into an [`Event`].
//!
//! [`SourceLog`] tails a folder of `*.jsonl` files in file-name order (or one
//! file): files grow by appends, new files appear later, and a line counts
//! only once it ends with a newline. The Hive `--hive-events` reader reuses
//! it. [`NativeSource`] parses each line (`event::Event::parse_line`); a line
//! that does not parse is rejected with its file and line.
//!
//! Called by the ingest thread through [`super::Source`]; positions are
//! stored in journal records so a restart resumes after the last journaled
//! line.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{DecodeError, Position, Rejection, Source, SourceError};
use crate::catalog::Tree;
use crate::event::{peek_id, Event, MAX_LINE_BYTES};
use crate::status::SourceReport;

/// Where the next unread line of the source log starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogPosition {
    /// File name inside the events folder ("" = before the first file).
    pub file: String,
    /// Byte offset of the next unread line in `file`.
    pub offset: u64,
    /// Number of lines of `file` before `offset`.
    pub line: u64,
}

/// One complete line of the source log.
#[derive(Debug, Clone)]
pub struct SourceLine {
    pub bytes: Vec<u8>,
    pub file: String,
    /// 1-based line number within `file`.
    pub line: u64,
    /// The position just after this line.
    pub next: LogPosition,
}

/// One complete line borrowed from the log's read buffer
/// ([`SourceLog::poll_each`]).
#[derive(Debug, Clone, Copy)]
pub struct LineRef<'a> {
    /// The line without its newline (and `\r`).
    pub bytes: &'a [u8],
    /// The position just after the line: its file, and in `line` its
    /// 1-based line number.
    pub next: &'a LogPosition,
}

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("reading the events folder {path}: {source}")]
    ListDir { path: PathBuf, source: io::Error },
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{file}:{line}: line is longer than {max} bytes")]
    LineTooLong { file: String, line: u64, max: usize },
    #[error("{file} is shorter ({len} bytes) than the position already read ({offset}); the source log must only grow")]
    Shrunk { file: String, len: u64, offset: u64 },
    #[error("{file} changed before the position already read (byte {offset} no longer starts a line); only the lines after it may change")]
    Rewritten { file: String, offset: u64 },
}

/// Tails the source log folder (or one file).
pub struct SourceLog {
    dir: PathBuf,
    /// Set when following one file rather than a folder of `*.jsonl`.
    only: Option<String>,
    pos: LogPosition,
    open: Option<(String, File)>,
    buf: Vec<u8>,
    /// Bytes in `buf` start at this offset of the current file.
    buf_offset: u64,
}

const READ_CHUNK: usize = 1 << 20;

impl SourceLog {
    /// Starts at `pos` (the position stored with the last journaled event).
    pub fn new(dir: &Path, pos: LogPosition) -> SourceLog {
        SourceLog {
            dir: dir.to_owned(),
            only: None,
            buf_offset: pos.offset,
            pos,
            open: None,
            buf: Vec::new(),
        }
    }

    /// Follows `path`: a folder of `*.jsonl` files, or one file.
    pub fn follow(path: &Path, pos: LogPosition) -> SourceLog {
        match (path.is_file(), path.parent(), path.file_name()) {
            (true, Some(dir), Some(name)) => {
                let mut log = SourceLog::new(dir, pos);
                log.only = Some(name.to_string_lossy().into_owned());
                log
            }
            _ => SourceLog::new(path, pos),
        }
    }

    pub fn position(&self) -> &LogPosition {
        &self.pos
    }

    /// Forgets what was read after `pos`: the next poll reads from there.
    pub fn seek(&mut self, pos: LogPosition) {
        self.buf_offset = pos.offset;
        self.pos = pos;
        self.open = None;
        self.buf.clear();
    }

    /// Whether the file being read is no longer what its name shows: the
    /// name now leads to another file (the file was replaced, e.g. written
    /// aside and renamed into place), or the file is shorter than what was
    /// read of it (truncated). False when nothing is open or the name is
    /// gone (what was read stays read).
    pub fn replaced(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Some((name, f)) = &self.open else {
            return false;
        };
        let (Ok(open), Ok(now)) = (f.metadata(), std::fs::metadata(self.dir.join(name))) else {
            return false;
        };
        let read = self.buf_offset + self.buf.len() as u64;
        (open.dev(), open.ino()) != (now.dev(), now.ino()) || now.len() < read
    }

    /// Names, sizes and modification times of the files followed: changes
    /// when any of them is written, replaced, added or removed.
    pub fn fingerprint(&self) -> Vec<(String, u64, Option<std::time::SystemTime>)> {
        let Ok(files) = self.log_files() else {
            return Vec::new();
        };
        files
            .into_iter()
            .map(|name| {
                let meta = std::fs::metadata(self.dir.join(&name)).ok();
                let len = meta.as_ref().map_or(0, |m| m.len());
                let mtime = meta.and_then(|m| m.modified().ok());
                (name, len, mtime)
            })
            .collect()
    }

    /// The folder or file followed, for status.
    pub fn describe(&self) -> String {
        match &self.only {
            Some(name) => self.dir.join(name).display().to_string(),
            None => self.dir.display().to_string(),
        }
    }

    fn log_files(&self) -> Result<Vec<String>, IngestError> {
        if let Some(name) = &self.only {
            return Ok(vec![name.clone()]);
        }
        let rd = std::fs::read_dir(&self.dir).map_err(|source| IngestError::ListDir {
            path: self.dir.clone(),
            source,
        })?;
        let mut names = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|source| IngestError::ListDir {
                path: self.dir.clone(),
                source,
            })?;
            if let Some(name) = entry.file_name().to_str() {
                if name.ends_with(".jsonl") && !name.starts_with('.') {
                    names.push(name.to_owned());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// Up to `max` complete lines available now (empty when caught up).
    pub fn poll(&mut self, max: usize) -> Result<Vec<SourceLine>, IngestError> {
        let mut out = Vec::new();
        self.poll_each(max, |line| {
            out.push(SourceLine {
                bytes: line.bytes.to_vec(),
                file: line.next.file.clone(),
                line: line.next.line,
                next: line.next.clone(),
            });
            true
        })?;
        Ok(out)
    }

    /// [`SourceLog::poll`] without copying: hands each complete line
    /// available now, borrowed from the read buffer, to `visit`, up to
    /// `max` lines or until `visit` returns false (that line counts as
    /// read). Returns how many lines were visited; an error comes after
    /// the good lines, at the next call.
    pub fn poll_each(
        &mut self,
        max: usize,
        mut visit: impl FnMut(LineRef<'_>) -> bool,
    ) -> Result<usize, IngestError> {
        let mut taken = 0;
        loop {
            if self.take_lines(max, &mut taken, &mut visit) || taken >= max {
                return Ok(taken);
            }
            match self.fill() {
                Ok(0) => {}
                Ok(_) => continue,
                // Hand over the good lines first; the error comes back on
                // the next poll, at the line it is about.
                Err(_) if taken > 0 => return Ok(taken),
                Err(e) => return Err(e),
            }
            // At the end of the current file. An unterminated line holds us
            // here: it counts once its newline arrives.
            if !self.buf.is_empty() {
                return Ok(taken);
            }
            let files = self.log_files()?;
            let Some(next) = files.into_iter().find(|f| *f > self.pos.file) else {
                return Ok(taken);
            };
            // The writer finishes a file before it starts the next one, so
            // one more read after seeing the next file catches the last
            // appends to this one.
            if self.fill()? > 0 {
                continue;
            }
            self.pos = LogPosition {
                file: next,
                offset: 0,
                line: 0,
            };
            self.open = None;
            self.buf.clear();
            self.buf_offset = 0;
        }
    }

    /// Reads more bytes of the current file into `buf`; 0 when at its end.
    fn fill(&mut self) -> Result<usize, IngestError> {
        if self.pos.file.is_empty() {
            return Ok(0);
        }
        if self
            .open
            .as_ref()
            .is_none_or(|(name, _)| *name != self.pos.file)
        {
            let path = self.dir.join(&self.pos.file);
            let mut f = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
                Err(source) => return Err(IngestError::Read { path, source }),
            };
            let len = f
                .metadata()
                .map_err(|source| IngestError::Read {
                    path: path.clone(),
                    source,
                })?
                .len();
            if len < self.pos.offset {
                return Err(IngestError::Shrunk {
                    file: self.pos.file.clone(),
                    len,
                    offset: self.pos.offset,
                });
            }
            // A position inside a line means the file was rewritten before it
            // (a correction must only change lines not read yet).
            if self.pos.offset > 0 {
                let mut before = [0u8; 1];
                f.seek(SeekFrom::Start(self.pos.offset - 1))
                    .and_then(|_| f.read_exact(&mut before))
                    .map_err(|source| IngestError::Read {
                        path: path.clone(),
                        source,
                    })?;
                if before[0] != b'\n' {
                    return Err(IngestError::Rewritten {
                        file: self.pos.file.clone(),
                        offset: self.pos.offset,
                    });
                }
            }
            f.seek(SeekFrom::Start(self.pos.offset))
                .map_err(|source| IngestError::Read {
                    path: path.clone(),
                    source,
                })?;
            self.buf.clear();
            self.buf_offset = self.pos.offset;
            self.open = Some((self.pos.file.clone(), f));
        }
        let Some((name, f)) = self.open.as_mut() else {
            return Ok(0);
        };
        // `take` + `read_to_end` appends without zero-filling a buffer first.
        let n = f
            .by_ref()
            .take(READ_CHUNK as u64)
            .read_to_end(&mut self.buf)
            .map_err(|source| IngestError::Read {
                path: self.dir.join(name.as_str()),
                source,
            })?;
        if self.buf.len() > MAX_LINE_BYTES + 1 && !self.buf.contains(&b'\n') {
            return Err(IngestError::LineTooLong {
                file: self.pos.file.clone(),
                line: self.pos.line + 1,
                max: MAX_LINE_BYTES,
            });
        }
        Ok(n)
    }

    /// Visits the complete lines in `buf` (counting them in `taken`, up to
    /// `max`); true when `visit` asked to stop.
    fn take_lines(
        &mut self,
        max: usize,
        taken: &mut usize,
        visit: &mut dyn FnMut(LineRef<'_>) -> bool,
    ) -> bool {
        let mut start = (self.pos.offset - self.buf_offset) as usize;
        let mut stopped = false;
        while !stopped && *taken < max {
            let Some(nl) = memchr::memchr(b'\n', &self.buf[start..]) else {
                break;
            };
            let end = start + nl;
            let mut line = &self.buf[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            self.pos.offset += (nl + 1) as u64;
            self.pos.line += 1;
            if !line.iter().all(u8::is_ascii_whitespace) {
                *taken += 1;
                stopped = !visit(LineRef {
                    bytes: line,
                    next: &self.pos,
                });
            }
            start = end + 1;
        }
        // Drop consumed bytes so the buffer holds at most one partial line.
        self.buf.drain(..start);
        self.buf_offset = self.pos.offset;
        stopped
    }
}

/// The native source: lines of `--events`, parsed as native events.
pub struct NativeSource {
    log: SourceLog,
    poll_interval: Duration,
    error: Option<String>,
}

impl NativeSource {
    pub fn new(log: SourceLog, poll_interval: Duration) -> NativeSource {
        NativeSource {
            log,
            poll_interval,
            error: None,
        }
    }
}

impl Source for NativeSource {
    type Record = SourceLine;

    fn poll(&mut self, max: usize) -> Result<Vec<SourceLine>, SourceError> {
        let result = self.log.poll(max);
        self.error = result.as_ref().err().map(ToString::to_string);
        result.map_err(|e| match e {
            // A line that can never be accepted: a rejection like any other.
            IngestError::LineTooLong { file, line, max } => SourceError::Fatal(Rejection {
                state_id: None,
                file: Some(file),
                line: Some(line),
                reason: format!("the line is longer than {max} bytes"),
            }),
            // A transient read problem (or a log that shrank): report it and
            // keep trying; nothing is lost by waiting.
            other => SourceError::Transient(format!("reading the source log: {other}")),
        })
    }

    fn decode(&mut self, line: &SourceLine, _latest: &Tree) -> Result<Event, DecodeError> {
        Event::parse_line(&line.bytes).map_err(|e| {
            DecodeError::Rejected(Rejection {
                state_id: peek_id(&line.bytes),
                file: Some(line.file.clone()),
                line: Some(line.line),
                reason: e.to_string(),
            })
        })
    }

    fn position_after(&self, line: &SourceLine) -> Position {
        Position::Log(line.next.clone())
    }

    fn locate(&self, line: &SourceLine) -> (Option<String>, Option<u64>) {
        (Some(line.file.clone()), Some(line.line))
    }

    fn report(&mut self) -> SourceReport {
        SourceReport {
            kind: "native".into(),
            location: self.log.describe(),
            position: None,
            newest: None,
            error: self.error.clone(),
        }
    }

    fn idle_wait(&self) -> Duration {
        self.poll_interval
    }

    /// Reading one line again is cheap: always re-read from `at`.
    fn reread_from(&mut self, at: &Position) -> bool {
        match at {
            Position::Log(pos) => {
                self.log.seek(pos.clone());
                true
            }
            Position::Hive { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn append(dir: &Path, file: &str, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(file))
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    fn texts(lines: &[SourceLine]) -> Vec<String> {
        lines
            .iter()
            .map(|l| String::from_utf8(l.bytes.clone()).unwrap())
            .collect()
    }

    #[test]
    fn reads_files_in_name_order_and_waits_for_newlines() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = SourceLog::new(dir.path(), LogPosition::default());
        assert!(log.poll(10).unwrap().is_empty());
        append(dir.path(), "b.jsonl", "b1\n");
        append(dir.path(), "a.jsonl", "a1\na2\npartial");
        append(dir.path(), "notes.txt", "ignored\n");
        let got = log.poll(10).unwrap();
        assert_eq!(texts(&got), vec!["a1", "a2"]);
        assert_eq!((got[1].file.as_str(), got[1].line), ("a.jsonl", 2));
        // The unterminated line holds us in a.jsonl.
        assert!(log.poll(10).unwrap().is_empty());
        append(dir.path(), "a.jsonl", " done\n");
        assert_eq!(texts(&log.poll(10).unwrap()), vec!["partial done", "b1"]);
        append(dir.path(), "b.jsonl", "\n  \nb2\n");
        append(dir.path(), "c.jsonl", "c1\n");
        let got = log.poll(10).unwrap();
        assert_eq!(texts(&got), vec!["b2", "c1"]);
        assert_eq!(got[0].line, 4);
    }

    #[test]
    fn resumes_from_a_stored_position() {
        let dir = tempfile::tempdir().unwrap();
        append(dir.path(), "a.jsonl", "a1\na2\na3\n");
        let mut log = SourceLog::new(dir.path(), LogPosition::default());
        let got = log.poll(2).unwrap();
        let mut again = SourceLog::new(dir.path(), got[1].next.clone());
        let rest = again.poll(10).unwrap();
        assert_eq!(texts(&rest), vec!["a3"]);
        assert_eq!(rest[0].line, 3);
    }
}
