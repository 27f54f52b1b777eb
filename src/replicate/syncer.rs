//! The ingest loop's group fsync, overlapped with the next batch: a batch's
//! journal records are written at the end of the batch, their fdatasync
//! runs on the syncer thread while the ingest thread reads, decodes and
//! validates the next batch, and the batch is published (handed to the
//! stager, `Progress::latest`) once it is durable.
//!
//! Invariants:
//! - nothing is published before it is durable: [`publish`] runs only after
//!   the batch's `Journal::finish_sync` succeeded, or after
//!   `rewrite_journal_until_synced` made its records durable again;
//! - batches are published in journal order: at most one batch is in
//!   flight ([`InFlight`]), and it is settled before the next batch's sync
//!   begins, before ingest waits for anything (an idle source, a backoff, a
//!   held rejection, a re-bootstrap) and before it stops;
//! - a failed fdatasync loses nothing: the batch in flight and every record
//!   appended since are written again, in order, until a sync succeeds
//!   (the same retry as a failed synchronous sync).
//!
//! Used by the ingest thread only (`super::ingest`), which also calls
//! [`rewrite_journal_until_synced`] for the re-bootstrap's record.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{debug, error, info};

use crate::catalog::tree::UNKNOWN_TIME;
use crate::event::StateId;
use crate::journal::{Journal, JournalError, SyncTicket};
use crate::stage::backoff;
use crate::status::{Progress, Stall};

/// Where ingest writes what it accepts, and its shared flags.
#[derive(Clone, Copy)]
pub(super) struct IngestTo<'a> {
    pub journal: &'a Mutex<Journal>,
    pub progress: &'a Progress,
    pub stop: &'a AtomicBool,
}

/// A batch whose records are in the journal but not yet published.
pub(super) struct Batch {
    /// Events accepted in the batch.
    pub accepted: u64,
    /// The batch's journal records, to write again if the sync fails.
    pub appended: Vec<(StateId, Vec<u8>)>,
    /// The validator's newest id after the batch (`Progress::latest`).
    pub last_id: StateId,
    /// Source time of the batch's newest event, or [`UNKNOWN_TIME`].
    pub last_time: i64,
}

/// The batch whose fdatasync the syncer thread is doing.
pub(super) struct InFlight(Batch);

/// Hands the batch to the stager and moves `Progress::latest`: only for a
/// batch whose records are durable.
fn publish(batch: Batch, to: IngestTo<'_>) {
    let progress = to.progress;
    progress
        .events_accepted
        .fetch_add(batch.accepted, Ordering::Relaxed);
    progress.latest.store(batch.last_id.0, Ordering::Relaxed);
    if batch.last_time != UNKNOWN_TIME {
        progress
            .latest_time_ms
            .store(batch.last_time, Ordering::Relaxed);
    }
}

/// The thread doing the fdatasyncs.
pub(super) struct Syncer {
    jobs: Option<Sender<SyncTicket>>,
    done: Receiver<(SyncTicket, io::Result<()>)>,
    thread: Option<JoinHandle<()>>,
}

impl Syncer {
    /// Starts the thread; None when it cannot be started (every sync is
    /// then done on the ingest thread, as before).
    pub fn start() -> Option<Syncer> {
        let (jobs, job_rx) = mpsc::channel::<SyncTicket>();
        let (done_tx, done) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("stagefs-journal-sync".into())
            .spawn(move || {
                for ticket in job_rx {
                    let synced = ticket.sync_data();
                    if done_tx.send((ticket, synced)).is_err() {
                        return;
                    }
                }
            });
        match spawned {
            Ok(thread) => Some(Syncer {
                jobs: Some(jobs),
                done,
                thread: Some(thread),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the journal sync thread; syncing on the ingest thread");
                None
            }
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Ends a batch whose records the ingest thread appended (the journal
/// locked as `j`): the batch in flight before it is settled and published
/// first (and, if its sync failed, written again together with this
/// batch's records); then this batch's fdatasync starts on `syncer`
/// (leaving it in `in_flight`), or, without a syncer or with nothing to
/// sync, it is made durable and published here. `Err` on shutdown during a
/// failed sync's retry.
pub(super) fn end_batch(
    syncer: Option<&Syncer>,
    j: &mut Journal,
    in_flight: &mut Option<InFlight>,
    batch: Batch,
    to: IngestTo<'_>,
) -> Result<(), Stopped> {
    if let Some(prev) = in_flight.take() {
        if settle(syncer, j, prev, &batch.appended, to)? {
            publish(batch, to);
            return Ok(());
        }
    }
    let ticket = match j.begin_sync() {
        Ok(None) => {
            publish(batch, to);
            return Ok(());
        }
        Ok(Some(ticket)) => ticket,
        // Not durable, never published, but already accepted by the
        // validator: write the same records again once the journal can
        // take them (space freed, say).
        Err(e) => return rewrite(j, batch, &[], e, to).map(|_| ()),
    };
    let ticket = match syncer.and_then(|s| s.jobs.as_ref()) {
        Some(jobs) => match jobs.send(ticket) {
            Ok(()) => {
                *in_flight = Some(InFlight(batch));
                return Ok(());
            }
            // The thread is gone: sync here.
            Err(mpsc::SendError(ticket)) => ticket,
        },
        None => ticket,
    };
    let synced = ticket.sync_data();
    finish(j, ticket, synced, batch, &[], to).map(|_| ())
}

/// Shutdown came while a failed sync was being retried.
#[derive(Debug)]
pub(super) struct Stopped;

/// Waits for the batch in flight to be durable and publishes it. `since`
/// are the records appended after it (not synced yet): when the sync
/// failed they are written again with it, and `Ok(true)` says they are
/// durable now too.
pub(super) fn settle(
    syncer: Option<&Syncer>,
    j: &mut Journal,
    in_flight: InFlight,
    since: &[(StateId, Vec<u8>)],
    to: IngestTo<'_>,
) -> Result<bool, Stopped> {
    let InFlight(batch) = in_flight;
    match syncer.and_then(|s| s.done.recv().ok()) {
        Some((ticket, synced)) => finish(j, ticket, synced, batch, since, to),
        None => {
            // The thread ended with the ticket (a sync does not panic, so
            // this is not expected): the records were written but are not
            // known durable; write them again.
            let e = j.sync_lost();
            rewrite(j, batch, since, e, to)
        }
    }
}

fn finish(
    j: &mut Journal,
    ticket: SyncTicket,
    synced: io::Result<()>,
    batch: Batch,
    since: &[(StateId, Vec<u8>)],
    to: IngestTo<'_>,
) -> Result<bool, Stopped> {
    match j.finish_sync(ticket, synced) {
        Ok(()) => {
            publish(batch, to);
            Ok(false)
        }
        Err(e) => rewrite(j, batch, since, e, to),
    }
}

/// After a failed sync: writes the batch's records and `since` again until
/// they are durable, then publishes the batch.
fn rewrite(
    j: &mut Journal,
    batch: Batch,
    since: &[(StateId, Vec<u8>)],
    error: JournalError,
    to: IngestTo<'_>,
) -> Result<bool, Stopped> {
    let records: Vec<(StateId, Vec<u8>)> = batch.appended.iter().chain(since).cloned().collect();
    if !rewrite_journal_until_synced(j, &records, error, to.progress, to.stop) {
        return Err(Stopped);
    }
    publish(batch, to);
    Ok(!since.is_empty())
}

/// After a failed journal sync: reports the stall, then (with capped
/// backoff) cuts the journal back to its durable end and writes `records`
/// again until a sync succeeds (true) or shutdown (false).
pub(super) fn rewrite_journal_until_synced(
    j: &mut Journal,
    records: &[(StateId, Vec<u8>)],
    first: JournalError,
    progress: &Progress,
    stop: &AtomicBool,
) -> bool {
    let mut error = first;
    let mut attempt = 0;
    loop {
        let reason = if error.is_no_space() {
            format!("disk full: journal: {error} (retrying)")
        } else {
            format!("journal: {error} (retrying)")
        };
        if attempt == 0 {
            error!(%reason, "journal sync failed; ingest waits and retries");
        }
        progress.set_ingest_stall(Some(Stall {
            state_id: None,
            reason,
            file: None,
            line: None,
        }));
        let until = Instant::now() + backoff(attempt);
        while Instant::now() < until {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let retried = j.reset_after_failure().and_then(|()| {
            for (id, payload) in records {
                j.append(*id, payload)?;
            }
            j.sync()
        });
        match retried {
            Ok(()) => {
                info!(
                    attempts = attempt + 1,
                    "journal sync succeeded again; ingest resumes"
                );
                progress.set_ingest_stall(None);
                return true;
            }
            Err(e) => {
                debug!(attempt, error = %e, "journal retry failed");
                error = e;
                attempt = attempt.saturating_add(1);
            }
        }
    }
}
