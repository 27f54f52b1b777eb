//! Ingest: follows the source notification log and turns each complete line
//! into an accepted [`Event`] or a [`Rejection`] that names where and why.
//!
//! [`SourceLog`] tails a folder of `*.jsonl` files in file-name order: files
//! grow by appends, new files appear later, and a line counts only once it
//! ends with a newline. [`Validator`] decides acceptance: syntax
//! (`event::Event::parse_line`), strictly increasing ids (an identical
//! re-delivery is ignored), and whether the event applies to the newest
//! state (`catalog::Tree::apply`). Only accepted events reach the journal, so
//! a corrected log line replaces a rejected one after a restart.
//!
//! Called by the daemon's ingest thread; positions are stored in journal
//! records so a restart resumes after the last journaled line.

use std::collections::hash_map::DefaultHasher;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::catalog::{AddedFile, Tree};
use crate::event::{peek_id, Event, StateId, MAX_LINE_BYTES};

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
}

/// Tails the source log folder.
pub struct SourceLog {
    dir: PathBuf,
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
            buf_offset: pos.offset,
            pos,
            open: None,
            buf: Vec::new(),
        }
    }

    pub fn position(&self) -> &LogPosition {
        &self.pos
    }

    fn log_files(&self) -> Result<Vec<String>, IngestError> {
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
        loop {
            self.take_lines(max, &mut out);
            if out.len() >= max {
                return Ok(out);
            }
            match self.fill() {
                Ok(0) => {}
                Ok(_) => continue,
                // Hand over the good lines first; the error comes back on
                // the next poll, at the line it is about.
                Err(_) if !out.is_empty() => return Ok(out),
                Err(e) => return Err(e),
            }
            // At the end of the current file. An unterminated line holds us
            // here: it counts once its newline arrives.
            if !self.buf.is_empty() {
                return Ok(out);
            }
            let files = self.log_files()?;
            let Some(next) = files.into_iter().find(|f| *f > self.pos.file) else {
                return Ok(out);
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

    fn take_lines(&mut self, max: usize, out: &mut Vec<SourceLine>) {
        let mut start = (self.pos.offset - self.buf_offset) as usize;
        while out.len() < max {
            let Some(nl) = self.buf[start..].iter().position(|&b| b == b'\n') else {
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
                out.push(SourceLine {
                    bytes: line.to_vec(),
                    file: self.pos.file.clone(),
                    line: self.pos.line,
                    next: self.pos.clone(),
                });
            }
            start = end + 1;
        }
        // Drop consumed bytes so the buffer holds at most one partial line.
        self.buf.drain(..start);
        self.buf_offset = self.pos.offset;
    }
}

/// Why a source line was not accepted: replication stops at the last good
/// state with this in status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rejection {
    /// The event id when it could be read.
    pub state_id: Option<StateId>,
    pub file: String,
    pub line: u64,
    pub reason: String,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.state_id {
            Some(id) => write!(
                f,
                "event {id} at {}:{}: {}",
                self.file, self.line, self.reason
            ),
            None => write!(f, "{}:{}: {}", self.file, self.line, self.reason),
        }
    }
}

/// What happened to one source line.
#[derive(Debug)]
pub enum Verdict {
    /// New event, with the state after it (the validator's new latest).
    Accepted(Box<Accepted>),
    /// Same id and content as an event already accepted.
    Duplicate,
}

/// An accepted event and what applying it gave.
#[derive(Debug)]
pub struct Accepted {
    pub event: Event,
    pub tree: Arc<Tree>,
    pub added: Vec<AddedFile>,
}

/// Accepts or rejects source lines against the newest accepted state.
pub struct Validator {
    latest: Arc<Tree>,
    /// (id, content hash) of every accepted event, in id order, to
    /// recognise identical re-deliveries.
    seen: Vec<(StateId, u64)>,
}

fn content_hash(event: &Event) -> u64 {
    let mut h = DefaultHasher::new();
    // Canonical form: re-serialised, so key order and spacing don't matter.
    serde_json::to_vec(event).unwrap_or_default().hash(&mut h);
    h.finish()
}

impl Validator {
    pub fn new(latest: Arc<Tree>) -> Validator {
        Validator {
            latest,
            seen: Vec::new(),
        }
    }

    /// Records an event already accepted before (journal replay at start).
    pub fn replayed(&mut self, event: &Event, tree_after: Arc<Tree>) {
        self.seen.push((event.id, content_hash(event)));
        self.latest = tree_after;
    }

    pub fn latest(&self) -> &Arc<Tree> {
        &self.latest
    }

    pub fn last_id(&self) -> StateId {
        self.latest.state_id
    }

    pub fn check(&mut self, line: &SourceLine) -> Result<Verdict, Rejection> {
        let reject = |state_id: Option<StateId>, reason: String| Rejection {
            state_id,
            file: line.file.clone(),
            line: line.line,
            reason,
        };
        let event = Event::parse_line(&line.bytes)
            .map_err(|e| reject(peek_id(&line.bytes), e.to_string()))?;
        let last = self.latest.state_id;
        if event.id <= last {
            let hash = content_hash(&event);
            let known = self
                .seen
                .binary_search_by_key(&event.id, |(id, _)| *id)
                .ok()
                .map(|i| self.seen[i].1);
            return match known {
                Some(h) if h == hash => Ok(Verdict::Duplicate),
                Some(_) => Err(reject(
                    Some(event.id),
                    format!("id {} was already used by a different event", event.id),
                )),
                None => Err(reject(
                    Some(event.id),
                    format!("id {} does not increase past {last}", event.id),
                )),
            };
        }
        let (tree, added) = self
            .latest
            .apply(&event)
            .map_err(|e| reject(Some(event.id), e.to_string()))?;
        self.seen.push((event.id, content_hash(&event)));
        self.latest = Arc::new(tree);
        Ok(Verdict::Accepted(Box::new(Accepted {
            event,
            tree: Arc::clone(&self.latest),
            added,
        })))
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

    #[test]
    fn validator_ignores_identical_redelivery_and_rejects_conflicts() {
        let mut v = Validator::new(Arc::new(Tree::empty()));
        let line = |text: &str, n: u64| SourceLine {
            bytes: text.as_bytes().to_vec(),
            file: "log.jsonl".into(),
            line: n,
            next: LogPosition::default(),
        };
        assert!(matches!(
            v.check(&line(r#"{"id": 5, "op": "create_database", "db": "d"}"#, 1)),
            Ok(Verdict::Accepted(_))
        ));
        assert!(matches!(
            v.check(&line(
                r#"{"op": "create_database", "id": 5,  "db": "d"}"#,
                2
            )),
            Ok(Verdict::Duplicate)
        ));
        let r = v
            .check(&line(r#"{"id": 5, "op": "create_database", "db": "e"}"#, 3))
            .unwrap_err();
        assert_eq!((r.state_id, r.line), (Some(StateId(5)), 3));
        let r = v.check(&line(r#"{"id": 4, "op": "noop"}"#, 4)).unwrap_err();
        assert!(r.reason.contains("does not increase"), "{r}");
        let r = v
            .check(&line(r#"{"id": 6, "op": "create_database", "db": "d"}"#, 5))
            .unwrap_err();
        assert_eq!(
            r.to_string(),
            "event 6 at log.jsonl:5: database `d` already exists"
        );
        let r = v.check(&line(r#"{"id": 7, "op": "#, 6)).unwrap_err();
        assert!(r.reason.starts_with("malformed JSON"), "{r}");
        assert_eq!(v.last_id(), StateId(5));
    }
}
