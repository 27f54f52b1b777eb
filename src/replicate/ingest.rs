//! The ingest thread: follows the source into the journal.
//!
//! It polls a batch from the [`Source`], decodes each record against the
//! newest accepted tree, validates it ([`Validator`]: only events that can
//! apply reach the journal) and appends it; a batch is made durable with one
//! fdatasync (on the journal's sync thread, [`super::syncer`], while the next
//! batch is read) and only then published to the stager. It is the
//! journal's single writer.
//!
//! - A rejected record holds ingest at the last good state
//!   ([`RejectionHold`]): the source is read again from the position after
//!   the last record taken about once a second, so a corrected record
//!   resumes ingest without a restart.
//! - An unavailable source is retried with capped backoff; a failed journal
//!   write or sync is written again until it succeeds.
//! - After an id gap with `--bootstrap`, the re-bootstrap runs here
//!   (`bootstrap::after_gap`) and its one record is journaled like any
//!   accepted event ([`journal_rebootstrap`]), handed to the stager with its
//!   tree built ([`Handoff`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::syncer::{self, rewrite_journal_until_synced, IngestTo};
use super::threads::Cpu;
use super::{ReplicaError, Shared};
use crate::bootstrap::after_gap::{AfterGap, Gap};
use crate::bootstrap::{BootstrapConfig, Built};
use crate::catalog::tree::UNKNOWN_TIME;
use crate::catalog::Resolutions;
use crate::event::StateId;
use crate::journal::{encode_entry, journal_payload, Journal};
use crate::source::hive::{HiveConfig, HiveSource};
use crate::source::native::{LogPosition, NativeSource, SourceLog};
use crate::source::{
    Accepted, DecodeError, Position, Rejection, Source, SourceError, Validator, Verdict,
};
use crate::status::{Progress, Stall};

/// Opens the source where the journal left it (`resume`, the position
/// after the last journaled event) and starts the ingest thread.
pub(super) fn start(
    shared: &Shared,
    resume: Option<Position>,
    validator: Validator,
) -> Result<JoinHandle<()>, ReplicaError> {
    let (journal, progress, stop, cfg, handoff) = (
        Arc::clone(&shared.journal),
        Arc::clone(&shared.progress),
        Arc::clone(&shared.stop),
        Arc::clone(&shared.cfg),
        Arc::clone(&shared.handoff),
    );
    let ingest: Box<dyn FnOnce() + Send> = match &cfg.hive {
        None => {
            let pos = match resume {
                Some(Position::Log(pos)) => pos,
                None => LogPosition::default(),
                Some(Position::Hive { .. }) => {
                    return Err(ReplicaError::WrongSource("a Hive notification log"))
                }
            };
            let start = Position::Log(pos.clone());
            let source = NativeSource::new(SourceLog::new(&cfg.events_dir, pos), cfg.poll_interval);
            Box::new(move || {
                run_ingest(
                    source,
                    validator,
                    start,
                    IngestTo {
                        journal: &journal,
                        progress: &progress,
                        stop: &stop,
                    },
                    &mut |_, _| None,
                )
            })
        }
        Some(hive) => {
            let after = match resume {
                Some(Position::Hive { hive_event_id }) => hive_event_id,
                None => 0,
                Some(Position::Log(_)) => {
                    return Err(ReplicaError::WrongSource("a native events folder"))
                }
            };
            let source =
                HiveSource::open(hive, after).map_err(|e| ReplicaError::Source(e.to_string()))?;
            let start = Position::Hive {
                hive_event_id: after,
            };
            let again = cfg.rebootstrap.then(|| AfterGap {
                cfg: BootstrapConfig {
                    remotes: cfg.remotes.clone(),
                    ..BootstrapConfig::new(&cfg.state_dir, hive.clone())
                },
                blobs: Arc::clone(&shared.blobs),
                hold: Arc::clone(&shared.gc_hold),
            });
            let (hive, resolutions) = (hive.clone(), Arc::clone(&shared.resolutions));
            Box::new(move || {
                let mut on_fatal = |source: &mut HiveSource, validator: &mut Validator| {
                    let (Some(again), Some((from, to))) = (&again, source.gap()) else {
                        return None;
                    };
                    let at = validator.last_id();
                    let mut record = |built: Built| {
                        journal_rebootstrap(
                            built,
                            validator,
                            &resolutions,
                            &journal,
                            &handoff,
                            &progress,
                            &stop,
                        )
                    };
                    let gap = Gap { from, to };
                    let y = again.run(gap, at, &progress, &stop, &mut record)?;
                    *source = reopen_hive(&hive, y, &progress, &stop)?;
                    Some(Position::Hive {
                        hive_event_id: y.0 as i64,
                    })
                };
                run_ingest(
                    source,
                    validator,
                    start,
                    IngestTo {
                        journal: &journal,
                        progress: &progress,
                        stop: &stop,
                    },
                    &mut on_fatal,
                )
            })
        }
    };
    shared.spawn("ingest", Cpu::Foreground, ingest)
}

const INGEST_BATCH: usize = 4096;
/// Longest wait between attempts to read a source that is unavailable.
const SOURCE_BACKOFF_CAP: Duration = Duration::from_secs(10);

/// Follows `source` into the journal. `start` is where the source was
/// opened (after the last journaled event). `on_fatal` gets a source that
/// cannot go on: `Some(position)` when it made the source able to go on
/// from `position` (the re-bootstrap after an id gap), `None` to hold at
/// the last good state until the source is corrected.
fn run_ingest<S: Source>(
    mut source: S,
    mut validator: Validator,
    start: Position,
    to: IngestTo<'_>,
    on_fatal: &mut dyn FnMut(&mut S, &mut Validator) -> Option<Position>,
) {
    let IngestTo {
        journal,
        progress,
        stop,
        ..
    } = to;
    // Records read but not journaled yet: kept across a retry of the first.
    let mut backlog: VecDeque<S::Record> = VecDeque::new();
    let mut hold = RejectionHold {
        taken_through: start,
        held_at: None,
    };
    let mut failures = 0u32;
    let mut last_error: Option<String> = None;
    let mut report_error = |progress: &Progress, error: Option<String>, failures: &mut u32| {
        match &error {
            Some(msg) if last_error.as_ref() != Some(msg) => {
                warn!(error = %msg, "the source cannot be read; retrying with backoff");
                progress.set_ingest_stall(Some(Stall {
                    state_id: None,
                    reason: format!("{msg} (retrying)"),
                    file: None,
                    line: None,
                }));
            }
            Some(_) => {}
            None if last_error.is_some() => {
                info!("the source can be read again");
                progress.set_ingest_stall(None);
                *failures = 0;
            }
            None => {}
        }
        last_error = error;
    };
    // The last batch's fdatasync, running while the next batch is read
    // (see `syncer`); settled before anything that waits.
    let syncer = syncer::Syncer::start();
    let mut in_flight: Option<syncer::InFlight> = None;
    let settle = |in_flight: &mut Option<syncer::InFlight>| -> bool {
        let Some(f) = in_flight.take() else {
            return true;
        };
        let mut j = match journal.lock() {
            Ok(j) => j,
            Err(p) => p.into_inner(),
        };
        syncer::settle(syncer.as_ref(), &mut j, f, &[], to).is_ok()
    };
    while !stop.load(Ordering::Relaxed) {
        if backlog.is_empty() {
            // A poll that may wait (a query, an idle source) comes after the
            // last batch is published.
            if !source.more_ready() && !settle(&mut in_flight) {
                return;
            }
            match source.poll(INGEST_BATCH) {
                Ok(records) => backlog.extend(records),
                Err(SourceError::Fatal(r)) => {
                    if !settle(&mut in_flight) {
                        return;
                    }
                    progress.set_source(source.report());
                    if let Some(at) = on_fatal(&mut source, &mut validator) {
                        hold.taken_through = at;
                        progress.set_source(source.report());
                        continue;
                    }
                    if !hold.wait(&mut source, &r, progress, stop) {
                        return;
                    }
                    continue;
                }
                Err(SourceError::Transient(msg)) => {
                    if !settle(&mut in_flight) {
                        return;
                    }
                    report_error(progress, Some(msg), &mut failures);
                    progress.set_source(source.report());
                    sleep_unless_stopped(source_backoff(failures), stop);
                    failures += 1;
                    continue;
                }
            }
        }
        if backlog.is_empty() {
            if !settle(&mut in_flight) {
                return;
            }
            report_error(progress, None, &mut failures);
            // Re-read after a rejection and nothing is wrong any more
            // (the bad record was removed): the hold is over.
            hold.release(progress);
            progress.set_source(source.report());
            sleep_unless_stopped(source.idle_wait(), stop);
            continue;
        }
        let mut accepted = 0u64;
        // A source record that cannot be accepted (held until corrected),
        // or a failure to journal an accepted one (stops for good: the
        // validator has taken it, so reading it again would skip it).
        let mut rejected = None;
        let mut failed = None;
        let mut last_taken = None;
        let mut retry = None;
        let mut j = match journal.lock() {
            Ok(j) => j,
            Err(p) => p.into_inner(),
        };
        let mut last_time = UNKNOWN_TIME;
        // This batch's records, to write again if the sync fails.
        let mut appended: Vec<(StateId, Vec<u8>)> = Vec::new();
        while let Some(record) = backlog.front() {
            let event = match source.decode(record, validator.latest()) {
                Ok(event) => event,
                Err(DecodeError::Retry(msg)) => {
                    retry = Some(msg);
                    break;
                }
                Err(DecodeError::Rejected(r)) => {
                    rejected = Some(r);
                    break;
                }
            };
            let (file, line) = source.locate(record);
            // Serialised once: the validator hashes these bytes and the
            // journal record embeds them.
            let canonical = serde_json::to_vec(&event);
            let verdict = match &canonical {
                Ok(bytes) => validator.check_canonical(event, bytes, file, line),
                Err(_) => validator.check(event, file, line),
            };
            match verdict {
                Ok(Verdict::Accepted(acc)) => {
                    let next = source.position_after(record);
                    let id = acc.event.id;
                    let payload = match canonical.and_then(|event| journal_payload(&event, &next)) {
                        Ok(p) => p,
                        Err(e) => {
                            let (file, line) = source.locate(record);
                            failed = Some(Rejection {
                                state_id: Some(id),
                                file,
                                line,
                                reason: format!("cannot encode the event: {e}"),
                            });
                            break;
                        }
                    };
                    if let Err(e) = j.append(id, &payload) {
                        let (file, line) = source.locate(record);
                        failed = Some(Rejection {
                            state_id: Some(id),
                            file,
                            line,
                            reason: format!("journal: {e}"),
                        });
                        break;
                    }
                    appended.push((id, payload));
                    if let Some(t) = acc.event.time_ms {
                        last_time = t;
                    }
                    // Dropped here, not handed to the stager (see `Handoff`).
                    drop(acc);
                    accepted += 1;
                }
                Ok(Verdict::Duplicate) => {
                    progress.events_duplicate.fetch_add(1, Ordering::Relaxed);
                }
                Err(r) => {
                    rejected = Some(r);
                    break;
                }
            }
            last_taken = backlog.pop_front();
        }
        if let Some(record) = &last_taken {
            hold.taken_through = source.position_after(record);
        }
        let this = syncer::Batch {
            accepted,
            appended,
            last_id: validator.last_id(),
            last_time,
        };
        if syncer::end_batch(syncer.as_ref(), &mut j, &mut in_flight, this, to).is_err() {
            return;
        }
        drop(j);
        // What waits below comes after the batch is published.
        if (failed.is_some() || rejected.is_some() || retry.is_some()) && !settle(&mut in_flight) {
            return;
        }
        progress.set_source(source.report());
        if accepted > 0 {
            hold.release(progress);
        }
        if let Some(r) = failed {
            error!(rejection = %r, "cannot journal an accepted event; replication stops at the last good state");
            stop_at_rejection(progress, r.stall(), stop);
            return;
        }
        if let Some(r) = rejected {
            // What follows the rejected record was read past it: forget it,
            // the re-read brings it back.
            backlog.clear();
            if !hold.wait(&mut source, &r, progress, stop) {
                return;
            }
            continue;
        }
        if let Some(msg) = retry {
            report_error(progress, Some(msg), &mut failures);
            sleep_unless_stopped(source_backoff(failures), stop);
            failures += 1;
        } else if accepted > 0 {
            report_error(progress, None, &mut failures);
        }
    }
    // Shutdown: what is durable is published (a restart finds it either way).
    settle(&mut in_flight);
}

/// Journals a re-bootstrap (the ingest thread, the journal's only writer):
/// the record at the new id replaces the newest accepted warehouse with the
/// bootstrapped one (`plan::replacing`), so the stager stages (nothing:
/// its files are stored) and commits it like any state. Durability order:
/// blobs (published while staging), what the files resolved to, the record.
fn journal_rebootstrap(
    built: Built,
    validator: &mut Validator,
    resolutions: &Resolutions,
    journal: &Mutex<Journal>,
    handoff: &Handoff,
    progress: &Progress,
    stop: &AtomicBool,
) -> Result<StateId, String> {
    built
        .record_contents(resolutions)
        .map_err(|e| e.to_string())?;
    let event = crate::bootstrap::plan::replacing(validator.latest(), built.event);
    let y = event.id;
    if y <= validator.last_id() {
        return Err(format!(
            "the bootstrap state {y} is not above the replica's {}",
            validator.last_id()
        ));
    }
    let acc = match validator.check(event, None, None) {
        Ok(Verdict::Accepted(acc)) => acc,
        Ok(Verdict::Duplicate) => return Err(format!("state {y} is already journaled")),
        Err(r) => return Err(r.reason),
    };
    let next = Position::Hive {
        hive_event_id: y.0 as i64,
    };
    let payload = encode_entry(&acc.event, &next)
        .map_err(|e| format!("encoding the bootstrap record: {e}"))?;
    let bytes = payload.len();
    let mut j = match journal.lock() {
        Ok(j) => j,
        Err(p) => p.into_inner(),
    };
    // The validator has accepted it: write it until it is durable.
    if let Err(e) = j.append(y, &payload).and_then(|()| j.sync()) {
        if !rewrite_journal_until_synced(&mut j, &[(y, payload)], e, progress, stop) {
            return Err("stopped before the bootstrap record was durable".into());
        }
    }
    drop(j);
    if let Some(t) = acc.event.time_ms {
        progress.latest_time_ms.store(t, Ordering::Relaxed);
    }
    handoff.push(vec![(*acc, bytes)]);
    progress.events_accepted.fetch_add(1, Ordering::Relaxed);
    progress.latest.store(y.0, Ordering::Relaxed);
    Ok(y)
}

/// The Hive source again, after the re-bootstrap at `y` (retried while the
/// metastore is unavailable; None at shutdown).
fn reopen_hive(
    hive: &HiveConfig,
    y: StateId,
    progress: &Progress,
    stop: &AtomicBool,
) -> Option<HiveSource> {
    let mut failures = 0;
    while !stop.load(Ordering::Relaxed) {
        match HiveSource::open(hive, y.0 as i64) {
            Ok(s) => {
                if failures > 0 {
                    progress.set_ingest_stall(None);
                }
                return Some(s);
            }
            Err(e) => {
                warn!(error = %e, "cannot open the metastore after the re-bootstrap; retrying");
                progress.set_ingest_stall(Some(Stall {
                    state_id: None,
                    reason: format!("opening the metastore: {e} (retrying)"),
                    file: None,
                    line: None,
                }));
                sleep_unless_stopped(source_backoff(failures), stop);
                failures += 1;
            }
        }
    }
    None
}

/// Delay before the next read of a source that failed `failures` times in
/// a row: 200 ms doubling, capped.
fn source_backoff(failures: u32) -> Duration {
    let ms = 200u64.saturating_mul(1u64.checked_shl(failures).unwrap_or(u64::MAX));
    Duration::from_millis(ms).min(SOURCE_BACKOFF_CAP)
}

fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) {
    let until = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= until {
            return;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(50)));
    }
}

/// How often a rejected record is looked at again.
const REREAD_INTERVAL: Duration = Duration::from_secs(1);

/// Ingest's place after a rejection: what it waits at, and where the
/// source is read again from.
struct RejectionHold {
    /// Where the source continues after the last record taken (accepted or
    /// a duplicate): the rejected record is the next one.
    taken_through: Position,
    /// The rejection ingest is held at, while the source is re-read.
    held_at: Option<String>,
}

impl RejectionHold {
    /// Holds ingest at a rejected record: reports it (logging it when it is
    /// new), then waits until the source may hold a correction and has
    /// been rewound to `taken_through` (true), or shutdown (false).
    fn wait<S: Source>(
        &mut self,
        source: &mut S,
        rejection: &Rejection,
        progress: &Progress,
        stop: &AtomicBool,
    ) -> bool {
        let text = rejection.to_string();
        if self.held_at.as_deref() != Some(text.as_str()) {
            progress.events_rejected.fetch_add(1, Ordering::Relaxed);
            error!(rejection = %text, "rejected a source event; replication waits at the last good state until the source is corrected");
        }
        progress.set_ingest_stall(Some(rejection.stall()));
        self.held_at = Some(text);
        loop {
            sleep_unless_stopped(REREAD_INTERVAL, stop);
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            if source.reread_from(&self.taken_through) {
                return true;
            }
        }
    }

    /// Ends the hold once the source reads well again.
    fn release(&mut self, progress: &Progress) {
        if let Some(was) = self.held_at.take() {
            info!(rejection = %was, "the rejected source event was corrected; ingest resumes");
            progress.set_ingest_stall(None);
        }
    }
}

/// Ends ingest at an accepted event that cannot be journaled: reports it
/// and waits for shutdown (a restart reads the event again).
fn stop_at_rejection(progress: &Progress, stall: Stall, stop: &AtomicBool) {
    progress.set_ingest_stall(Some(stall));
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Accepted events with the trees ingest already built for them, so the
/// stager need not decode and apply them again: only the re-bootstrap's
/// (one event naming every file of the warehouse). Only durable events are
/// handed over (after the journal sync); the stager still takes its order
/// and pace from the journal and falls back to decoding a record when its
/// entry is not here (read from files, or dropped at the capacity bound).
///
/// Ingest's own batches are not handed over: each tree holds its own copy
/// of the directories its event changed (~10 KiB for an INSERT into a
/// table of 100 partitions), and freed on the stager thread that memory
/// went back to ingest as fresh pages (mimalloc's cross-thread frees),
/// whose zeroing took half of the ingest thread's time at 30,000 Hive
/// events/s. Dropped where it was built, it is reused hot; the stager
/// decodes and applies each record itself (~5–10 µs).
#[derive(Default)]
pub(super) struct Handoff {
    queue: Mutex<HandoffQueue>,
}

/// Entries with their journal payload size, the measure of their memory.
#[derive(Default)]
struct HandoffQueue {
    entries: VecDeque<(Accepted, usize)>,
    bytes: usize,
}

/// Entries kept for the stager (like the journal ring, a bound on memory):
/// at most this many...
const HANDOFF_CAPACITY: usize = 8192;
/// ...and at most this many bytes of their events' journal payloads.
const HANDOFF_BYTES: usize = 64 << 20;

impl HandoffQueue {
    fn pop_front(&mut self) -> Option<Accepted> {
        let (a, bytes) = self.entries.pop_front()?;
        self.bytes -= bytes;
        Some(a)
    }
}

impl Handoff {
    fn lock(&self) -> MutexGuard<'_, HandoffQueue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a batch of (accepted event, its journal payload bytes); the
    /// oldest entries go past the bounds (the stager decodes those).
    pub(super) fn push(&self, batch: Vec<(Accepted, usize)>) {
        let mut q = self.lock();
        for (a, bytes) in batch {
            q.bytes += bytes;
            q.entries.push_back((a, bytes));
        }
        while q.entries.len() > HANDOFF_CAPACITY || q.bytes > HANDOFF_BYTES {
            q.pop_front();
        }
    }

    /// The entry for `id`, dropping older ones the stager went past.
    pub(super) fn take(&self, id: StateId) -> Option<Accepted> {
        let mut q = self.lock();
        while q.entries.front().is_some_and(|(a, _)| a.event.id < id) {
            q.pop_front();
        }
        if q.entries.front().is_some_and(|(a, _)| a.event.id == id) {
            q.pop_front()
        } else {
            None
        }
    }
}
