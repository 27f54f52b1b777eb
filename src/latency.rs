//! Latency histograms: the commit durations the stager records and the
//! per-operation timing of FUSE requests ([`FuseRequests`]), exported by
//! [`crate::metrics`].
//!
//! Invariant: recording is lock-free (relaxed atomic adds), so the FUSE
//! adapter can time every request; the count is the sum of the buckets, so
//! a scrape's `_count` always equals its `+Inf` bucket even while
//! observations race it.
//!
//! Written by the stager (`Progress::commit_duration`) and by
//! [`crate::fuse`] (a [`RequestTimer`] per request when `--metrics` is on);
//! read at scrape time by [`crate::metrics`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// A histogram of durations with fixed bounds, lock-free: one relaxed add
/// to the bucket and one to the sum per observation (prometheus-client's
/// own `Histogram` takes a mutex per observation, too much for every FUSE
/// request). The count is the sum of the buckets, so `_count` always
/// equals the `+Inf` bucket even while observations race a scrape.
#[derive(Debug)]
pub struct LatencyHistogram {
    /// Upper bounds in nanoseconds, ascending.
    bounds_ns: &'static [u64],
    /// One per bound, then the `+Inf` bucket; not cumulative.
    buckets: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// FUSE requests: 5 µs (a cached lookup) to 5 s.
const FUSE_BOUNDS_NS: &[u64] = &[
    5 * US,
    10 * US,
    25 * US,
    50 * US,
    100 * US,
    250 * US,
    500 * US,
    MS,
    5 * MS / 2,
    5 * MS,
    10 * MS,
    25 * MS,
    50 * MS,
    100 * MS,
    250 * MS,
    500 * MS,
    S,
    5 * S,
];

/// Commits (blob fsyncs, resolutions, the commit record): 1 ms to 60 s.
const COMMIT_BOUNDS_NS: &[u64] = &[
    MS,
    5 * MS / 2,
    5 * MS,
    10 * MS,
    25 * MS,
    50 * MS,
    100 * MS,
    250 * MS,
    500 * MS,
    S,
    5 * S / 2,
    5 * S,
    10 * S,
    30 * S,
    60 * S,
];

impl LatencyHistogram {
    fn new(bounds_ns: &'static [u64]) -> LatencyHistogram {
        LatencyHistogram {
            bounds_ns,
            buckets: (0..=bounds_ns.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// For commit durations.
    pub fn for_commits() -> LatencyHistogram {
        LatencyHistogram::new(COMMIT_BOUNDS_NS)
    }

    pub fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        // The first bucket whose bound is at least `ns` (Prometheus `le`).
        let i = self.bounds_ns.partition_point(|&b| b < ns);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        // Per-bucket counts; the encoder makes them cumulative.
        let buckets: Vec<(f64, u64)> = self
            .bounds_ns
            .iter()
            .map(|&b| b as f64 / S as f64)
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.buckets.iter().map(|b| b.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / S as f64;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The FUSE operations timed, one histogram each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FuseOp {
    Lookup,
    Forget,
    Getattr,
    Opendir,
    Readdir,
    Readdirplus,
    Releasedir,
    Open,
    Read,
    Release,
    Getxattr,
    Listxattr,
    Setxattr,
    Removexattr,
    Access,
    Statfs,
    Flush,
    /// Every data-changing request, answered `EROFS`.
    Refused,
}

impl FuseOp {
    pub const ALL: [FuseOp; 18] = [
        FuseOp::Lookup,
        FuseOp::Forget,
        FuseOp::Getattr,
        FuseOp::Opendir,
        FuseOp::Readdir,
        FuseOp::Readdirplus,
        FuseOp::Releasedir,
        FuseOp::Open,
        FuseOp::Read,
        FuseOp::Release,
        FuseOp::Getxattr,
        FuseOp::Listxattr,
        FuseOp::Setxattr,
        FuseOp::Removexattr,
        FuseOp::Access,
        FuseOp::Statfs,
        FuseOp::Flush,
        FuseOp::Refused,
    ];

    /// The `op` label.
    pub fn label(self) -> &'static str {
        match self {
            FuseOp::Lookup => "lookup",
            FuseOp::Forget => "forget",
            FuseOp::Getattr => "getattr",
            FuseOp::Opendir => "opendir",
            FuseOp::Readdir => "readdir",
            FuseOp::Readdirplus => "readdirplus",
            FuseOp::Releasedir => "releasedir",
            FuseOp::Open => "open",
            FuseOp::Read => "read",
            FuseOp::Release => "release",
            FuseOp::Getxattr => "getxattr",
            FuseOp::Listxattr => "listxattr",
            FuseOp::Setxattr => "setxattr",
            FuseOp::Removexattr => "removexattr",
            FuseOp::Access => "access",
            FuseOp::Statfs => "statfs",
            FuseOp::Flush => "flush",
            FuseOp::Refused => "refused",
        }
    }
}

/// Per-operation latency of the FUSE requests one mount answered.
#[derive(Debug)]
pub struct FuseRequests {
    /// Indexed by `FuseOp as usize`.
    by_op: Vec<LatencyHistogram>,
}

impl Default for FuseRequests {
    fn default() -> Self {
        FuseRequests {
            by_op: FuseOp::ALL
                .iter()
                .map(|_| LatencyHistogram::new(FUSE_BOUNDS_NS))
                .collect(),
        }
    }
}

impl FuseRequests {
    pub fn histogram(&self, op: FuseOp) -> &LatencyHistogram {
        &self.by_op[op as usize]
    }

    /// Starts timing one request; recorded when the timer drops.
    pub fn start(&self, op: FuseOp) -> RequestTimer<'_> {
        RequestTimer {
            histogram: self.histogram(op),
            started: Instant::now(),
        }
    }
}

/// Records the time since [`FuseRequests::start`] when dropped.
pub struct RequestTimer<'a> {
    histogram: &'a LatencyHistogram,
    started: Instant,
}

impl Drop for RequestTimer<'_> {
    fn drop(&mut self) {
        self.histogram.observe(self.started.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_by_upper_bound_and_counts_every_observation() {
        let h = LatencyHistogram::new(&[10 * US, MS]);
        h.observe(Duration::from_micros(10)); // le 10 µs: inclusive
        h.observe(Duration::from_micros(11));
        h.observe(Duration::from_secs(3)); // +Inf
        let counts: Vec<u64> = h
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        assert_eq!(counts, vec![1, 1, 1]);
        assert_eq!(h.count(), 3);
        assert_eq!(h.sum_ns.load(Ordering::Relaxed), 3 * S + 21 * US);
    }
}
