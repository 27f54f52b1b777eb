//! Prometheus metrics: `stagefs mount --metrics ADDR` serves the Prometheus
//! text format (version 0.0.4) at `http://ADDR/metrics`.
//!
//! Owns the exporter (a `tiny_http` server on one thread) and the
//! scrape-time collector. The two kinds of latency histograms the pipeline
//! and the FUSE adapter record into are [`crate::latency`]'s; every value
//! is read at scrape time from what
//! status already keeps ([`Progress`], the catalog snapshot, the blob store,
//! the view's readers), so a scrape and `.stagefs/status` never disagree and
//! nothing is counted twice. docs/OPERATIONS.md lists every metric.
//!
//! Invariants: text is produced only by `prometheus-client`'s encoder (never
//! formatted here); nothing binds unless `--metrics` names an address; the
//! FUSE adapter records only when given a [`FuseRequests`] (two relaxed
//! atomic adds and two clock reads per request), so a mount without
//! `--metrics` pays nothing.
//!
//! Called by the daemon ([`Exporter::bind`] before replication starts, so a
//! bad address is a usage error with nothing started; [`Exporter::serve`]
//! once the mount exists).

use std::collections::BTreeMap;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tracing::{info, warn};

use crate::follow::{FollowMetrics, FollowProbe};
use crate::latency::{FuseOp, FuseRequests};
use crate::publish::lease::KeeperReport;
use crate::publish::publisher::{PublishReport, PUBLISH_FAILURE_REASONS};
use crate::publish::PublishProbe;
use crate::replicate::Replica;
use crate::status::{Progress, StatusReport};
use crate::view::View;

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("--metrics {addr}: {reason}")]
    Address { addr: String, reason: String },
    #[error("--metrics {addr}: cannot listen: {reason}")]
    Bind { addr: String, reason: String },
    #[error("starting the metrics thread: {0}")]
    Spawn(std::io::Error),
}

/// Where the served states come from.
pub enum Serves {
    /// Replication from a source (`mount`, `replicate`).
    Replica(Arc<Replica>),
    /// A reader host (`mount --from URL`): the states published at URL.
    Published(FollowProbe),
}

/// What a scrape reads.
pub struct Sources {
    pub serves: Serves,
    /// `--publish URL`: the publisher's report.
    pub publish: Option<PublishProbe>,
    /// A reader host's leases at its URL (its pins and sessions).
    pub leases: Option<KeeperReport>,
    /// The mount's view (readers' views); None without a mount.
    pub view: Option<Arc<View>>,
    /// The mount's request timing; None without a mount.
    pub fuse: Option<Arc<FuseRequests>>,
}

/// Reads everything at scrape time.
struct Scrape(Sources);

impl fmt::Debug for Scrape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Scrape")
    }
}

/// Why replication is stalled, as the `reason` label of `stagefs_stalled`:
/// which part of the pipeline stopped. The message is in the status.
const STALL_REASONS: [&str; 4] = ["failed", "rejected_event", "source_unreadable", "staging"];

fn stall_reason(progress: &Progress) -> Option<&'static str> {
    let held = |m: &Mutex<Option<crate::status::Stall>>| {
        m.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    };
    if held(&progress.failure) {
        Some("failed")
    } else if held(&progress.ingest_stall) {
        // A rejected event stops ingest until restart, so once one was
        // counted the ingest stall is that rejection; otherwise the source
        // cannot be read (retrying, or fatal: a bad metastore URL, ...).
        if progress.events_rejected.load(Ordering::Relaxed) > 0 {
            Some("rejected_event")
        } else {
            Some("source_unreadable")
        }
    } else if held(&progress.stage_stall) {
        Some("staging")
    } else {
        None
    }
}

/// One family with a single label, counters or gauges.
fn family_by(
    enc: &mut DescriptorEncoder,
    kind: MetricType,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, u64)],
) -> fmt::Result {
    let mut family = enc.encode_descriptor(name, help, None, kind)?;
    for (value, n) in values {
        let labels = [(label, *value)];
        match kind {
            MetricType::Counter => ConstCounter::new(*n).encode(family.encode_family(&labels)?)?,
            _ => ConstGauge::new(*n as i64).encode(family.encode_family(&labels)?)?,
        }
    }
    Ok(())
}

/// The counts of `known` reasons (each present, 0 when not seen), then
/// any other reason seen.
fn by_reason<'a>(known: &[&'a str], seen: &BTreeMap<&'a str, u64>) -> Vec<(&'a str, u64)> {
    let mut out: Vec<(&str, u64)> = known
        .iter()
        .map(|r| (*r, seen.get(r).copied().unwrap_or(0)))
        .collect();
    for (r, n) in seen {
        if !known.contains(r) {
            out.push((r, *n));
        }
    }
    out
}

fn gauge<V: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: V,
) -> fmt::Result {
    let g = ConstGauge::new(value);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

/// A counter; the encoder adds `_total` to `name`.
fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    let c = ConstCounter::new(value);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

/// One counter family with a single label.
fn counters_by(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, u64)],
) -> fmt::Result {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value, n) in values {
        ConstCounter::new(*n).encode(family.encode_family(&[(label, *value)])?)?;
    }
    Ok(())
}

impl Scrape {
    fn encode_replication(
        &self,
        enc: &mut DescriptorEncoder,
        replica: &Replica,
        s: &StatusReport,
    ) -> fmt::Result {
        let progress = replica.progress();
        gauge(
            enc,
            "visible_state_id",
            "Newest state readers see (the last commit).",
            s.visible.0,
        )?;
        gauge(
            enc,
            "latest_state_id",
            "Newest state-id accepted from the source.",
            s.latest.0,
        )?;
        gauge(
            enc,
            "lag_events",
            "Events the source has that are not visible yet.",
            s.lag_events,
        )?;
        if let Some(lag) = s.lag_seconds {
            gauge(
                enc,
                "lag_seconds",
                "Age of the oldest event not visible yet (0 when caught up; absent while unknown).",
                lag,
            )?;
        }
        counter(
            enc,
            "events_accepted",
            "Source events accepted into the journal.",
            s.events_accepted,
        )?;
        counter(
            enc,
            "events_duplicate",
            "Source events skipped as exact repeats of accepted ones.",
            s.events_duplicate,
        )?;
        counter(
            enc,
            "events_rejected",
            "Source events rejected (replication stops at the last good state until restart).",
            progress.events_rejected.load(Ordering::Relaxed),
        )?;
        counter(enc, "commits", "States made visible.", s.commits)?;
        let h = &progress.commit_duration;
        h.encode(enc.encode_descriptor(
            "commit_duration_seconds",
            "Time to commit one state: publish its blobs, record resolutions, write the commit record.",
            None,
            h.metric_type(),
        )?)?;
        let from_source = s
            .staging
            .files_fetched
            .saturating_sub(s.staging.from_change_management);
        counters_by(
            enc,
            "fetches",
            "Files copied into the blob store, by where the copy came from.",
            "outcome",
            &[
                ("source", from_source),
                ("cm", s.staging.from_change_management),
            ],
        )?;
        let failures = progress.fetch_failures_by_reason();
        let mut by_reason: Vec<(&str, u64)> = ["unavailable", "disk full", "io"]
            .iter()
            .map(|r| (*r, failures.get(r).copied().unwrap_or(0)))
            .collect();
        by_reason.extend(
            failures
                .iter()
                .filter(|(r, _)| !by_reason.iter().any(|(k, _)| k == *r))
                .map(|(r, n)| (*r, *n))
                .collect::<Vec<_>>(),
        );
        counters_by(
            enc,
            "fetch_failures",
            "Failed fetch attempts (each is retried with backoff), by reason.",
            "reason",
            &by_reason,
        )?;
        gauge(
            enc,
            "fetches_in_flight",
            "Fetches running now.",
            s.staging.in_flight,
        )?;
        counter(
            enc,
            "staged_bytes",
            "Bytes copied into the blob store by fetches.",
            s.staging.bytes_fetched,
        )?;
        gauge(
            enc,
            "stored_blobs",
            "Blobs in the blob store.",
            replica.blobs().stored_blobs(),
        )?;
        gauge(
            enc,
            "stored_bytes",
            "Bytes of the blobs in the blob store.",
            s.staged_bytes,
        )?;
        gauge(
            enc,
            "unverified_files",
            "Files staged without a source checksum to verify them with (Hive).",
            s.unverified_files,
        )?;
        counter(enc, "gc_runs", "Garbage-collection passes.", s.gc.runs)?;
        counter(
            enc,
            "gc_removed_blobs",
            "Blobs removed by garbage collection.",
            s.gc.removed_blobs,
        )?;
        counter(
            enc,
            "gc_freed_bytes",
            "Bytes freed by garbage collection.",
            s.gc.freed_bytes,
        )?;
        counter(
            enc,
            "journal_records",
            "Records appended to the journal by this process.",
            s.journal.records,
        )?;
        let reason = stall_reason(progress);
        let mut stalled = enc.encode_descriptor(
            "stalled",
            "1 while replication cannot progress, on the series of its reason (the message is in stagefs status).",
            None,
            MetricType::Gauge,
        )?;
        for r in STALL_REASONS {
            let v = i64::from(reason == Some(r));
            ConstGauge::new(v).encode(stalled.encode_family(&[("reason", r)])?)?;
        }
        gauge(
            enc,
            "retained_versions",
            "Versions kept browsable (retained and pinned).",
            s.retained.len() as u64,
        )?;
        gauge(enc, "pins", "Pins in force.", s.pins.len() as u64)?;
        gauge(
            enc,
            "sessions",
            "stagefs run sessions in force.",
            s.sessions.len() as u64,
        )?;
        Ok(())
    }

    /// A reader host: where it is against the head, its stalls, its cache
    /// and what it fetched, its leases, and the catalog's versions.
    fn encode_follow(&self, enc: &mut DescriptorEncoder, m: &FollowMetrics) -> fmt::Result {
        let latest = m.visible.0 + m.behind();
        gauge(
            enc,
            "visible_state_id",
            "Newest published state this host shows.",
            m.visible.0,
        )?;
        gauge(
            enc,
            "latest_state_id",
            "The state the published head names (the visible one until a head was read).",
            latest,
        )?;
        gauge(
            enc,
            "lag_events",
            "Published states the head is ahead of the visible one (as stagefs_behind_states).",
            m.behind(),
        )?;
        gauge(
            enc,
            "behind_states",
            "How far this host is behind the publisher: the head's state-id minus the visible one.",
            m.behind(),
        )?;
        if let Some(lag) = m.lag_seconds() {
            gauge(
                enc,
                "lag_seconds",
                "The visible state's source time behind the head's (absent while unknown).",
                lag,
            )?;
        }
        if let Some(age) = m.head_age_ms() {
            gauge(
                enc,
                "head_age_seconds",
                "Time since the publisher wrote the head this host read last (absent until one was read).",
                age as f64 / 1000.0,
            )?;
        }
        if let Some(age) = m.head_read_age_ms {
            gauge(
                enc,
                "head_read_age_seconds",
                "Time since this host last read the head successfully (absent until it did).",
                age as f64 / 1000.0,
            )?;
        }
        counter(enc, "head_polls", "Reads of the published head.", m.polls)?;
        counter(
            enc,
            "head_poll_failures",
            "Reads of the published head that failed (unreachable, missing, invalid).",
            m.poll_failures,
        )?;
        let mut stalled = enc.encode_descriptor(
            "stalled",
            "1 while this host cannot move to the published head, on the series of its reason (the message is in stagefs status).",
            None,
            MetricType::Gauge,
        )?;
        for r in crate::follow::STALL_REASONS {
            let v = i64::from(m.stalled == Some(r));
            ConstGauge::new(v).encode(stalled.encode_family(&[("reason", r)])?)?;
        }
        family_by(
            enc,
            MetricType::Counter,
            "stalls",
            "Stalls begun, by reason.",
            "reason",
            &by_reason(&crate::follow::STALL_REASONS, &m.stalls),
        )?;
        let c = &m.cache;
        gauge(
            enc,
            "cache_bytes",
            "Bytes of file content in the cache.",
            c.bytes,
        )?;
        gauge(enc, "cache_limit_bytes", "--cache-size.", c.limit)?;
        counter(
            enc,
            "cache_evictions",
            "Cached files evicted to make room.",
            c.evicted,
        )?;
        counter(
            enc,
            "cache_fetches",
            "Content objects fetched from the URL (whole small files and pieces).",
            c.fetched,
        )?;
        counter(
            enc,
            "cache_fetched_bytes",
            "Bytes of content fetched from the URL.",
            c.fetched_bytes,
        )?;
        family_by(
            enc,
            MetricType::Counter,
            "cache_fetch_failures",
            "Content fetches that failed (the read gets EIO), by reason.",
            "reason",
            &by_reason(
                &crate::follow::cache::FETCH_FAILURE_REASONS,
                &c.failures_by_reason,
            ),
        )?;
        gauge(
            enc,
            "cache_unreachable",
            "1 while the last content fetch failed (reads that need bytes not cached fail with EIO).",
            i64::from(c.unreachable),
        )?;
        counter(
            enc,
            "catalog_fetches",
            "State records and catalog objects read from the URL (not from the local copies).",
            m.catalog_objects_fetched,
        )?;
        counter(
            enc,
            "catalog_fetched_bytes",
            "Bytes of state records and catalog objects read from the URL.",
            m.catalog_bytes_fetched,
        )?;
        if let Some(leases) = &self.0.leases {
            let held = leases.lock().unwrap_or_else(|p| p.into_inner()).len();
            gauge(
                enc,
                "leases_held",
                "Leases this host holds at the URL (one per state its pins and sessions hold).",
                held as u64,
            )?;
        }
        gauge(
            enc,
            "retained_versions",
            "Versions kept browsable (retained and pinned).",
            m.retained as u64,
        )?;
        gauge(enc, "pins", "Pins in force.", m.pins as u64)?;
        gauge(
            enc,
            "sessions",
            "stagefs run sessions in force.",
            m.sessions as u64,
        )
    }

    fn encode_readers(&self, enc: &mut DescriptorEncoder, view: &View) -> fmt::Result {
        let r = view.readers().summary();
        gauge(
            enc,
            "reader_views",
            "Processes with a view of their own (active within the view rule's quiet gap).",
            r.views as u64,
        )?;
        if let Some(oldest) = r.oldest_view {
            gauge(
                enc,
                "reader_oldest_view_state_id",
                "The oldest state a reader's view shows (absent without views).",
                oldest.0,
            )?;
        }
        counter(
            enc,
            "reader_unattributed_requests",
            "Requests no process could be named for (they see the newest visible state).",
            r.unattributed_requests,
        )?;
        counter(
            enc,
            "reader_view_moves",
            "Times a reader's view moved to a newer state.",
            r.view_moves,
        )?;
        counter(
            enc,
            "dentry_invalidations",
            "Directory entries the mount asked the kernel to drop.",
            r.dentry_invalidations,
        )?;
        gauge(
            enc,
            "session_connections",
            "stagefs run --private-mount connections the kernel still keeps (each holds its state from GC).",
            view.session_connection_states().len() as u64,
        )
    }

    fn encode_fuse(&self, enc: &mut DescriptorEncoder, fuse: &FuseRequests) -> fmt::Result {
        let mut family = enc.encode_descriptor(
            "fuse_request_duration_seconds",
            "FUSE requests answered, by operation: time from the handler's start to its reply (_count is the number of requests).",
            None,
            MetricType::Histogram,
        )?;
        for op in FuseOp::ALL {
            fuse.histogram(op)
                .encode(family.encode_family(&[("op", op.label())])?)?;
        }
        Ok(())
    }
}

/// `--publish URL`: what was published, how it fails, retention at URL.
fn encode_publish(enc: &mut DescriptorEncoder, r: &PublishReport) -> fmt::Result {
    counter(
        enc,
        "publish_states",
        "States published (the head replaced).",
        r.states,
    )?;
    counter(
        enc,
        "publish_objects_written",
        "Objects written to the URL (content, pieces, piece lists, catalogs).",
        r.objects_written,
    )?;
    counter(
        enc,
        "publish_bytes_written",
        "Bytes of the objects written to the URL.",
        r.bytes_written,
    )?;
    family_by(
        enc,
        MetricType::Counter,
        "publish_failures",
        "Failed publishing attempts (retried with backoff unless publishing stopped), by reason.",
        "reason",
        &by_reason(&PUBLISH_FAILURE_REASONS, &r.failures),
    )?;
    gauge(
        enc,
        "publish_failing",
        "1 while the last publishing attempt failed (the message is in status publish.error).",
        i64::from(r.error.is_some()),
    )?;
    gauge(
        enc,
        "publish_stopped",
        "1 once publishing stopped for good (the daemon exits).",
        i64::from(r.fatal),
    )?;
    if let Some(s) = r.published {
        gauge(
            enc,
            "publish_state_id",
            "The state the head at the URL names (absent until known).",
            s.0,
        )?;
    }
    if let Some(ms) = r.published_ms {
        gauge(
            enc,
            "publish_age_seconds",
            "Time since that head was written (absent until known).",
            (crate::status::now_ms() - ms).max(0) as f64 / 1000.0,
        )?;
    }
    gauge(
        enc,
        "publish_leases_live",
        "Leases at the URL not expired, at the last collection.",
        r.gc.leases_live,
    )?;
    gauge(
        enc,
        "publish_kept_states",
        "Published states kept by the last collection (retained, leased, held).",
        r.gc.kept.len() as u64,
    )?;
    counter(
        enc,
        "publish_gc_runs",
        "Garbage collections at the URL.",
        r.gc.runs,
    )?;
    counter(
        enc,
        "publish_gc_condemned_states",
        "Published states condemned (no longer retained or leased).",
        r.gc.states_condemned,
    )?;
    counter(
        enc,
        "publish_gc_deleted_objects",
        "Objects deleted at the URL by garbage collection.",
        r.gc.objects_deleted,
    )?;
    counter(
        enc,
        "publish_gc_deleted_bytes",
        "Bytes of the objects deleted at the URL.",
        r.gc.bytes_deleted,
    )
}

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        match &self.0.serves {
            Serves::Replica(replica) => {
                let status = replica.status();
                self.encode_replication(&mut enc, replica, &status)?;
            }
            Serves::Published(probe) => self.encode_follow(&mut enc, &probe.read())?,
        }
        if let Some(publish) = &self.0.publish {
            encode_publish(&mut enc, &publish.read())?;
        }
        if let Some(view) = &self.0.view {
            self.encode_readers(&mut enc, view)?;
        }
        if let Some(fuse) = &self.0.fuse {
            self.encode_fuse(&mut enc, fuse)?;
        }
        Ok(())
    }
}

fn registry(sources: Sources) -> Registry {
    let mut registry = Registry::with_prefix("stagefs");
    registry.register_collector(Box::new(Scrape(sources)));
    registry
}

fn render_registry(registry: &Registry) -> Result<String, fmt::Error> {
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, registry)?;
    Ok(text)
}

/// A bound, not yet serving, metrics listener.
pub struct Exporter {
    server: tiny_http::Server,
    addr: SocketAddr,
}

impl Exporter {
    /// Listens on `addr` (`HOST:PORT`; port 0 picks a free one).
    pub fn bind(addr: &str) -> Result<Exporter, MetricsError> {
        let address_err = |reason: String| MetricsError::Address {
            addr: addr.to_owned(),
            reason,
        };
        let resolved = addr
            .to_socket_addrs()
            .map_err(|e| address_err(format!("not a HOST:PORT address ({e})")))?
            .next()
            .ok_or_else(|| address_err("resolves to no address".into()))?;
        let server = tiny_http::Server::http(resolved).map_err(|e| MetricsError::Bind {
            addr: addr.to_owned(),
            reason: e.to_string(),
        })?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| address_err("not an IP address".into()))?;
        Ok(Exporter { server, addr })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers `GET /metrics` on its own thread until [`Serving::stop`].
    pub fn serve(self, sources: Sources) -> Result<Serving, MetricsError> {
        let server = Arc::new(self.server);
        let registry = registry(sources);
        let thread = {
            let server = Arc::clone(&server);
            std::thread::Builder::new()
                .name("stagefs-metrics".into())
                .spawn(move || answer_scrapes(&server, &registry))
                .map_err(MetricsError::Spawn)?
        };
        info!(url = %format!("http://{}/metrics", self.addr), "serving metrics");
        Ok(Serving {
            server,
            thread: Some(thread),
        })
    }
}

fn answer_scrapes(server: &tiny_http::Server, registry: &Registry) {
    use tiny_http::{Header, Method, Response};
    // `recv` fails only once `unblock` was called (shutdown).
    while let Ok(request) = server.recv() {
        let path = request.url().split('?').next().unwrap_or("");
        let get = matches!(request.method(), Method::Get | Method::Head);
        let response = match (get, path) {
            (true, "/metrics") => match render_registry(registry) {
                Ok(text) => {
                    let content_type = Header::from_bytes(
                        "Content-Type",
                        prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                    );
                    let mut r = Response::from_string(text);
                    if let Ok(h) = content_type {
                        r = r.with_header(h);
                    }
                    r
                }
                Err(_) => {
                    Response::from_string("cannot encode the metrics\n").with_status_code(500)
                }
            },
            (true, _) => {
                Response::from_string("not found: metrics are at /metrics\n").with_status_code(404)
            }
            (false, _) => Response::from_string("only GET\n").with_status_code(405),
        };
        if let Err(e) = request.respond(response) {
            warn!(error = %e, "cannot answer a metrics request");
        }
    }
}

/// The running exporter; [`Serving::stop`] ends it and drops what it read.
pub struct Serving {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl Serving {
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                warn!("the metrics thread panicked");
            }
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn fuse_histograms_encode_cumulative_buckets_per_operation() {
        #[derive(Debug)]
        struct Only(Arc<FuseRequests>);
        impl Collector for Only {
            fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
                let mut family = enc.encode_descriptor(
                    "fuse_request_duration_seconds",
                    "test",
                    None,
                    MetricType::Histogram,
                )?;
                for op in [FuseOp::Read, FuseOp::Lookup] {
                    self.0
                        .histogram(op)
                        .encode(family.encode_family(&[("op", op.label())])?)?;
                }
                Ok(())
            }
        }
        let fuse = Arc::new(FuseRequests::default());
        drop(fuse.start(FuseOp::Read));
        fuse.histogram(FuseOp::Read)
            .observe(Duration::from_millis(2));
        let mut registry = Registry::with_prefix("stagefs");
        registry.register_collector(Box::new(Only(Arc::clone(&fuse))));
        let text = render_registry(&registry).unwrap();
        assert!(
            text.contains("stagefs_fuse_request_duration_seconds_count{op=\"read\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "stagefs_fuse_request_duration_seconds_bucket{le=\"+Inf\",op=\"read\"} 2"
            ) || text.contains(
                "stagefs_fuse_request_duration_seconds_bucket{op=\"read\",le=\"+Inf\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains("stagefs_fuse_request_duration_seconds_count{op=\"lookup\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn binding_a_bad_address_is_an_address_error() {
        assert!(matches!(
            Exporter::bind("not an address"),
            Err(MetricsError::Address { .. })
        ));
    }

    #[test]
    fn binding_a_taken_port_is_a_bind_error() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        assert!(matches!(
            Exporter::bind(&addr),
            Err(MetricsError::Bind { .. })
        ));
    }
}
