//! Bootstrap progress: counters the driver and the copy threads update,
//! rendered as the `bootstrap` object of the status JSON
//! ([`BootstrapReport`], a type status owns), and the progress line logged
//! every few seconds.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::status::{BootstrapReport, UnlistedTable};

/// The live counters.
pub struct BootstrapProgress {
    started: Instant,
    phase: Mutex<String>,
    round: AtomicU64,
    snapshot_id: AtomicI64,
    state_id: AtomicI64,
    tables_total: AtomicU64,
    tables_listed: AtomicU64,
    partitions: AtomicU64,
    files_copied: AtomicU64,
    bytes_copied: AtomicU64,
    files_reused: AtomicU64,
    bytes_reused: AtomicU64,
    events_applied: AtomicU64,
    relisted: AtomicU64,
    unlisted: Mutex<Vec<UnlistedTable>>,
    error: Mutex<Option<String>>,
}

impl Default for BootstrapProgress {
    fn default() -> Self {
        BootstrapProgress {
            started: Instant::now(),
            phase: Mutex::new("snapshot".into()),
            round: AtomicU64::new(0),
            snapshot_id: AtomicI64::new(0),
            state_id: AtomicI64::new(-1),
            tables_total: AtomicU64::new(0),
            tables_listed: AtomicU64::new(0),
            partitions: AtomicU64::new(0),
            files_copied: AtomicU64::new(0),
            bytes_copied: AtomicU64::new(0),
            files_reused: AtomicU64::new(0),
            bytes_reused: AtomicU64::new(0),
            events_applied: AtomicU64::new(0),
            relisted: AtomicU64::new(0),
            unlisted: Mutex::new(Vec::new()),
            error: Mutex::new(None),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl BootstrapProgress {
    pub fn set_phase(&self, phase: &str) {
        *lock(&self.phase) = phase.to_owned();
    }

    /// A new round over `tables` tables of the snapshot at `snapshot_id`.
    pub fn start_round(&self, round: u32, snapshot_id: i64, tables: u64, partitions: u64) {
        self.round.store(round.into(), Ordering::Relaxed);
        self.snapshot_id.store(snapshot_id, Ordering::Relaxed);
        self.tables_total.store(tables, Ordering::Relaxed);
        self.tables_listed.store(0, Ordering::Relaxed);
        self.partitions.store(partitions, Ordering::Relaxed);
        if round > 0 {
            self.relisted.fetch_add(tables, Ordering::Relaxed);
        }
    }

    pub fn table_listed(&self) {
        self.tables_listed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn copied(&self, bytes: u64) {
        self.files_copied.fetch_add(1, Ordering::Relaxed);
        self.bytes_copied.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn reused(&self, bytes: u64) {
        self.files_reused.fetch_add(1, Ordering::Relaxed);
        self.bytes_reused.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn event_applied(&self) {
        self.events_applied.fetch_add(1, Ordering::Relaxed);
    }

    pub fn done(&self, state_id: i64) {
        self.state_id.store(state_id, Ordering::Relaxed);
        self.set_phase("done");
    }

    pub fn failed(&self, error: String, unlisted: Vec<UnlistedTable>) {
        *lock(&self.unlisted) = unlisted;
        *lock(&self.error) = Some(error);
        self.set_phase("failed");
    }

    pub fn report(&self) -> BootstrapReport {
        let elapsed = self.started.elapsed().as_secs_f64();
        let bytes = self.bytes_copied.load(Ordering::Relaxed);
        let listed = self.tables_listed.load(Ordering::Relaxed);
        let total = self.tables_total.load(Ordering::Relaxed);
        let phase = lock(&self.phase).clone();
        let eta = (phase == "listing" && listed > 0 && elapsed > 0.0)
            .then(|| total.saturating_sub(listed) as f64 * elapsed / listed as f64);
        let state_id = self.state_id.load(Ordering::Relaxed);
        BootstrapReport {
            phase,
            round: self.round.load(Ordering::Relaxed) as u32,
            snapshot_id: self.snapshot_id.load(Ordering::Relaxed),
            state_id: (state_id >= 0).then_some(state_id),
            tables_total: total,
            tables_listed: listed,
            partitions: self.partitions.load(Ordering::Relaxed),
            files_copied: self.files_copied.load(Ordering::Relaxed),
            bytes_copied: bytes,
            files_reused: self.files_reused.load(Ordering::Relaxed),
            bytes_reused: self.bytes_reused.load(Ordering::Relaxed),
            events_applied: self.events_applied.load(Ordering::Relaxed),
            elapsed_seconds: (elapsed * 10.0).round() / 10.0,
            bytes_per_second: if elapsed > 0.0 {
                (bytes as f64 / elapsed).round()
            } else {
                0.0
            },
            eta_seconds: eta.map(|e| e.round()),
            relisted: self.relisted.load(Ordering::Relaxed),
            unlisted: lock(&self.unlisted).clone(),
            error: lock(&self.error).clone(),
        }
    }

    /// The progress line (logged every few seconds by the driver).
    pub fn log_line(&self) {
        let r = self.report();
        tracing::info!(
            phase = %r.phase,
            round = r.round,
            snapshot = r.snapshot_id,
            tables = format!("{}/{}", r.tables_listed, r.tables_total),
            files = r.files_copied + r.files_reused,
            copied_mib = format!("{:.1}", r.bytes_copied as f64 / f64::from(1 << 20)),
            reused_files = r.files_reused,
            mib_per_s = format!("{:.1}", r.bytes_per_second / f64::from(1 << 20)),
            eta = r.eta_seconds.map_or("unknown".to_owned(), |e| format!("{e:.0}s")),
            events = r.events_applied,
            "bootstrap"
        );
    }
}
