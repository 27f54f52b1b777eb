//! Reading rows ahead: a [`RowSource`] (the metastore or `--hive-events`
//! files) run on its own thread, which reads the next batch of rows while
//! the ingest thread decodes, validates and journals the batch before it.
//!
//! Reading rows is serial work of the ingest loop: a database query, or
//! reading and parsing JSON Lines. [`RowsAhead`] takes it off the ingest
//! thread where that changes nothing the loop can observe:
//! - only after a poll answered a **full** batch (`limit` rows) does the
//!   thread read the next one at once, exactly the poll the ingest loop
//!   makes next ("poll again immediately while a batch is full", SPEC §2).
//!   After a short batch the next poll is made when asked, so an idle
//!   source is still polled every `--hive-poll-ms` and its new rows are
//!   not served from an old read;
//! - a batch read ahead is served only to the poll it answers (same
//!   `after`, same `limit`); any other poll, and every rewind, drops it;
//! - rows are immutable once the source shows them (ids increase, a row is
//!   committed before it is visible), so a batch read a moment early is
//!   the batch a poll now would give, or a prefix of it;
//! - a read ahead that failed is dropped, not reported: the next poll reads
//!   again and reports what it gets then (a transient error is retried with
//!   backoff by the ingest loop as before; a bad line is found again);
//! - every other call (`txn_writes`, `records_txn_writes`, `rewind`) runs on
//!   the thread in call order, after the read ahead in progress, so a
//!   transaction's writes are asked for after the rows before its commit
//!   were read, as without read-ahead. `newest_event_id` answers what the
//!   source said right after the poll that was served (one query per poll,
//!   as before).
//!
//! Used by [`super::HiveSource::open`]; the thread ends when the
//! [`RowsAhead`] is dropped.

use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

use super::model::{NotificationRow, RowSource, RowSourceError, TxnWriteRow};

type Rows = Result<Vec<NotificationRow>, RowSourceError>;
type Newest = Result<Option<i64>, RowSourceError>;

enum Request {
    Poll { after: i64, limit: usize },
    TxnWrites(i64),
    RecordsTxnWrites,
    Rewind,
}

enum Reply {
    Poll(Rows, Newest),
    TxnWrites(Result<Vec<TxnWriteRow>, RowSourceError>),
    RecordsTxnWrites(Result<bool, RowSourceError>),
    Rewind(bool),
}

/// A batch read before it was asked for.
struct Ahead {
    after: i64,
    limit: usize,
    rows: Vec<NotificationRow>,
    newest: Newest,
}

/// See the module docs.
pub struct RowsAhead {
    requests: Option<Sender<Request>>,
    replies: Receiver<Reply>,
    thread: Option<JoinHandle<()>>,
    describe: String,
    /// What the source said its newest event was, at the last poll.
    newest: Newest,
}

impl RowsAhead {
    /// Runs `rows` on a thread of its own. When the thread cannot be
    /// started, `Err` gives `rows` back to be used directly.
    pub fn spawn(rows: Box<dyn RowSource>) -> Result<RowsAhead, Box<dyn RowSource>> {
        let describe = rows.describe();
        let (requests, request_rx) = mpsc::channel::<Request>();
        let (reply_tx, replies) = mpsc::channel::<Reply>();
        // The source goes to the thread through this slot, so that a failed
        // spawn can give it back.
        let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(rows)));
        let theirs = std::sync::Arc::clone(&slot);
        let spawned = std::thread::Builder::new()
            .name("stagefs-hive-rows".into())
            .spawn(move || {
                let taken = theirs.lock().map(|mut s| s.take()).unwrap_or(None);
                if let Some(rows) = taken {
                    serve(rows, request_rx, reply_tx);
                }
            });
        match spawned {
            Ok(thread) => Ok(RowsAhead {
                requests: Some(requests),
                replies,
                thread: Some(thread),
                describe,
                newest: Ok(None),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the Hive row reader thread; reading rows on the ingest thread");
                // A failed spawn drops the closure unrun: the source is
                // still in the slot.
                let back = slot.lock().map(|mut s| s.take()).unwrap_or(None);
                Err(back.unwrap_or_else(|| Box::new(Stopped)))
            }
        }
    }

    fn ask(&mut self, request: Request) -> Option<Reply> {
        let sent = self
            .requests
            .as_ref()
            .is_some_and(|r| r.send(request).is_ok());
        if sent {
            self.replies.recv().ok()
        } else {
            None
        }
    }
}

/// The error of every call once the reader thread is gone (it panicked).
fn stopped() -> RowSourceError {
    RowSourceError::Fatal("the Hive row reader thread stopped unexpectedly".into())
}

/// A row source that only answers [`stopped`] (what a failed spawn gives
/// back if the source was not in its slot, which cannot happen).
struct Stopped;

impl RowSource for Stopped {
    fn poll(&mut self, _after: i64, _limit: usize) -> Rows {
        Err(stopped())
    }
    fn txn_writes(&mut self, _txn_id: i64) -> Result<Vec<TxnWriteRow>, RowSourceError> {
        Err(stopped())
    }
    fn newest_event_id(&mut self) -> Newest {
        Err(stopped())
    }
    fn describe(&self) -> String {
        String::new()
    }
}

/// The thread: answers requests in order, reading ahead after a full batch.
fn serve(mut rows: Box<dyn RowSource>, requests: Receiver<Request>, replies: Sender<Reply>) {
    let mut ahead: Option<Ahead> = None;
    for request in requests {
        let reply = match request {
            Request::Poll { after, limit } => {
                let (got, newest) = match ahead.take() {
                    Some(a) if a.after == after && a.limit == limit => (Ok(a.rows), a.newest),
                    _ => {
                        let got = rows.poll(after, limit);
                        (got, rows.newest_event_id())
                    }
                };
                let next = match &got {
                    Ok(r) if r.len() >= limit => r.last().map(|r| r.event_id),
                    _ => None,
                };
                if replies.send(Reply::Poll(got, newest)).is_err() {
                    return;
                }
                if let Some(after) = next {
                    if let Ok(got) = rows.poll(after, limit) {
                        if !got.is_empty() {
                            ahead = Some(Ahead {
                                after,
                                limit,
                                rows: got,
                                newest: rows.newest_event_id(),
                            });
                        }
                    }
                }
                continue;
            }
            Request::TxnWrites(txn) => Reply::TxnWrites(rows.txn_writes(txn)),
            Request::RecordsTxnWrites => Reply::RecordsTxnWrites(rows.records_txn_writes()),
            Request::Rewind => {
                ahead = None;
                Reply::Rewind(rows.rewind())
            }
        };
        if replies.send(reply).is_err() {
            return;
        }
    }
}

impl RowSource for RowsAhead {
    fn poll(&mut self, after: i64, limit: usize) -> Rows {
        match self.ask(Request::Poll { after, limit }) {
            Some(Reply::Poll(rows, newest)) => {
                self.newest = newest;
                rows
            }
            _ => Err(stopped()),
        }
    }

    fn txn_writes(&mut self, txn_id: i64) -> Result<Vec<TxnWriteRow>, RowSourceError> {
        match self.ask(Request::TxnWrites(txn_id)) {
            Some(Reply::TxnWrites(w)) => w,
            _ => Err(stopped()),
        }
    }

    fn records_txn_writes(&mut self) -> Result<bool, RowSourceError> {
        match self.ask(Request::RecordsTxnWrites) {
            Some(Reply::RecordsTxnWrites(r)) => r,
            _ => Err(stopped()),
        }
    }

    fn newest_event_id(&mut self) -> Newest {
        self.newest.clone()
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn rewind(&mut self) -> bool {
        match self.ask(Request::Rewind) {
            Some(Reply::Rewind(r)) => r,
            _ => false,
        }
    }
}

impl Drop for RowsAhead {
    fn drop(&mut self) {
        // Closing the requests ends the thread after what it is doing.
        self.requests = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn row(id: i64) -> NotificationRow {
        NotificationRow {
            nl_id: None,
            event_id: id,
            event_time: None,
            event_type: "OPEN_TXN".into(),
            cat_name: None,
            db_name: None,
            tbl_name: None,
            message: None,
            message_format: None,
        }
    }

    /// Rows `1..=last` (growing through `last`), failing the polls whose
    /// number (from 1) is in `fail`; every call is logged.
    struct Script {
        last: Arc<Mutex<i64>>,
        fail: Vec<usize>,
        polls: usize,
        log: Log,
    }

    impl RowSource for Script {
        fn poll(&mut self, after: i64, limit: usize) -> Rows {
            self.polls += 1;
            self.log.lock().unwrap().push(format!("poll {after}"));
            if self.fail.contains(&self.polls) {
                return Err(RowSourceError::Unavailable("timed out".into()));
            }
            let last = *self.last.lock().unwrap();
            Ok((after + 1..=last).take(limit).map(row).collect())
        }
        fn txn_writes(&mut self, txn_id: i64) -> Result<Vec<TxnWriteRow>, RowSourceError> {
            self.log.lock().unwrap().push(format!("writes {txn_id}"));
            Ok(Vec::new())
        }
        fn newest_event_id(&mut self) -> Newest {
            Ok(Some(*self.last.lock().unwrap()))
        }
        fn describe(&self) -> String {
            "script".into()
        }
        fn rewind(&mut self) -> bool {
            self.log.lock().unwrap().push("rewind".into());
            true
        }
    }

    type Log = Arc<Mutex<Vec<String>>>;

    fn script(last: i64, fail: &[usize]) -> (RowsAhead, Arc<Mutex<i64>>, Log) {
        let (last, log) = (Arc::new(Mutex::new(last)), Arc::new(Mutex::new(Vec::new())));
        let rows = Script {
            last: Arc::clone(&last),
            fail: fail.to_vec(),
            polls: 0,
            log: Arc::clone(&log),
        };
        let Ok(ahead) = RowsAhead::spawn(Box::new(rows)) else {
            panic!("cannot start the thread");
        };
        (ahead, last, log)
    }

    fn ids(rows: Rows) -> Vec<i64> {
        rows.unwrap().iter().map(|r| r.event_id).collect()
    }

    /// The calls the source saw so far (after the thread is done with them).
    fn calls(ahead: &mut RowsAhead, log: &Log) -> Vec<String> {
        // A call answered in order: everything before it has run.
        ahead.txn_writes(0).unwrap();
        let mut log = log.lock().unwrap();
        log.retain(|c| c != "writes 0");
        log.clone()
    }

    #[test]
    fn a_full_batch_is_followed_at_once_and_a_short_one_is_not() {
        let (mut ahead, last, log) = script(7, &[]);
        assert_eq!(ahead.describe(), "script");
        assert_eq!(ids(ahead.poll(0, 3)), vec![1, 2, 3]);
        assert_eq!(ids(ahead.poll(3, 3)), vec![4, 5, 6]);
        assert_eq!(ids(ahead.poll(6, 3)), vec![7]);
        assert_eq!(ahead.newest_event_id(), Ok(Some(7)));
        // After the short batch nothing was read ahead: new rows are seen
        // by the next poll, not hidden behind an old read.
        *last.lock().unwrap() = 9;
        assert_eq!(ids(ahead.poll(7, 3)), vec![8, 9]);
        assert_eq!(ahead.newest_event_id(), Ok(Some(9)));
        assert_eq!(
            calls(&mut ahead, &log),
            ["poll 0", "poll 3", "poll 6", "poll 7"]
        );
    }

    #[test]
    fn a_batch_read_ahead_serves_only_its_own_poll_and_a_rewind_drops_it() {
        let (mut ahead, _, log) = script(10, &[]);
        assert_eq!(ids(ahead.poll(0, 2)), vec![1, 2]);
        // Another `after` than the batch read ahead (3..4 after 2).
        assert_eq!(ids(ahead.poll(1, 2)), vec![2, 3]);
        assert_eq!(ids(ahead.poll(3, 2)), vec![4, 5]);
        assert!(ahead.rewind());
        assert_eq!(ids(ahead.poll(5, 2)), vec![6, 7]);
        assert_eq!(
            calls(&mut ahead, &log),
            // poll 2 is dropped unused; poll 3 serves the third poll.
            ["poll 0", "poll 2", "poll 1", "poll 3", "poll 5", "rewind", "poll 5", "poll 7"]
        );
    }

    #[test]
    fn a_failed_read_ahead_is_dropped_and_the_poll_reads_again() {
        // The second poll (the read ahead after the first batch) fails.
        let (mut ahead, _, log) = script(6, &[2]);
        assert_eq!(ids(ahead.poll(0, 3)), vec![1, 2, 3]);
        assert_eq!(ids(ahead.poll(3, 3)), vec![4, 5, 6]);
        assert_eq!(
            calls(&mut ahead, &log),
            ["poll 0", "poll 3", "poll 3", "poll 6"]
        );
        // A failure of the poll asked for is reported.
        let (mut ahead, _, _) = script(6, &[1]);
        assert_eq!(
            ahead.poll(0, 3).unwrap_err(),
            RowSourceError::Unavailable("timed out".into())
        );
        assert_eq!(ids(ahead.poll(0, 3)), vec![1, 2, 3]);
    }
}
