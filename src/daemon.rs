//! The daemon: what `stagefs mount`, `stagefs replicate` and `stagefs status`
//! do around the library — argument checks (usage errors exit 2), logging,
//! signals, the mount's lifetime and the status file.
//!
//! Shutdown order: stop accepting kernel requests (unmount, lazily if a
//! reader still holds files open), then stop replication. Replication state
//! is durable at every step, so a `kill -9` anywhere is also fine: the same
//! command resumes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tracing::{info, warn};

use crate::catalog::{self, load_durable};
use crate::event::BlobId;
use crate::fuse::{self, MountOptions};
use crate::latency::FuseRequests;
use crate::metrics::{Exporter, Serves, Sources};
use crate::publish::{PublishConfig, PublishError, PublishProbe, Publisher};
use crate::redact::Redactor;
use crate::replicate::{Replica, ReplicaConfig, ReplicaError};
use crate::source::hive::map::SourceMap;
use crate::source::hive::{HiveConfig, HiveRows};
use crate::source_file::s3::{S3Access, S3Settings};
use crate::source_file::Remotes;
use crate::state_lock::state_in_use;
use crate::status::{PublishStatus, StatusReport};
use crate::view::{StatusSource, View, ViewConfig};

/// Why a command failed. `Usage` errors exit with status 2.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Replica(ReplicaError),
    #[error("{0}")]
    Mount(String),
    #[error("{0}")]
    Io(String),
}

impl DaemonError {
    pub fn is_usage(&self) -> bool {
        matches!(self, DaemonError::Usage(_))
    }
}

impl From<ReplicaError> for DaemonError {
    fn from(e: ReplicaError) -> Self {
        match e {
            ReplicaError::Locked(_) => DaemonError::Usage(e.to_string()),
            other => DaemonError::Replica(other),
        }
    }
}

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event; coloured only on a terminal.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `fields` (with
    /// `message`) and `spans`, the same fields as the text form.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("unknown log format {other:?} (text or json)")),
        }
    }
}

/// Logging to stderr, filtered by `STAGEFS_LOG` (default `info`).
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("STAGEFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,fuser::session=error"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match format {
        LogFormat::Text => {
            // Colour only on a terminal: a log file or pipe gets plain text
            // (and NO_COLOR, https://no-color.org, turns it off everywhere).
            let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            builder.with_ansi(colour).try_init()
        }
        LogFormat::Json => builder
            .json()
            .with_ansi(false)
            .with_current_span(false)
            .with_span_list(true)
            .try_init(),
    };
}

/// Arguments shared by `mount` and `replicate`.
#[derive(Debug, Clone)]
pub struct ReplicateArgs {
    pub state: PathBuf,
    /// Native source: `--source-root` and `--events`.
    pub source_root: Option<PathBuf>,
    pub events: Option<PathBuf>,
    pub cm_root: Option<PathBuf>,
    pub retain: usize,
    /// `--fetch-timeout`: see [`ReplicaConfig::fetch_timeout`].
    pub fetch_timeout: Duration,
    /// `--s3-endpoint`: the S3 endpoint (else the AWS environment's).
    pub s3_endpoint: Option<String>,
    pub hive: HiveArgs,
    /// `--checkpoint-events`: a checkpoint every N state-ids (0: by time only).
    pub checkpoint_events: u64,
    /// `--checkpoint-interval`: ...or after this many seconds.
    pub checkpoint_seconds: u64,
    /// `--checkpoint-rate`: MiB/s a checkpoint is written at (0: full speed).
    pub checkpoint_rate_mib: u64,
    /// `--publish URL [--signing-key FILE]`: publish the visible states.
    pub publish: Option<PublishArgs>,
}

/// `--publish URL` and `--signing-key FILE`.
#[derive(Debug, Clone)]
pub struct PublishArgs {
    pub url: String,
    pub signing_key: Option<PathBuf>,
    /// `--gc-grace`: see [`crate::publish::gc`].
    pub gc_grace: Duration,
}

/// The Hive source's flags; `rows` is None for the native source.
#[derive(Debug, Clone, Default)]
pub struct HiveArgs {
    pub rows: Option<HiveRows>,
    pub source_map: Vec<String>,
    pub poll_ms: u64,
    /// `--bootstrap`: build the first state from the metastore's tables.
    pub bootstrap: bool,
    /// `--event-time-margin`: see [`HiveConfig::event_time_margin`].
    pub event_time_margin: crate::stage::EventTimeMargin,
    /// `--catalog`: the metastore catalog replicated (empty: `hive`).
    pub catalog: String,
}

impl ReplicateArgs {
    /// A native source: `--source-root`, `--events`.
    pub fn native(state: &Path, source_root: &Path, events: &Path) -> ReplicateArgs {
        ReplicateArgs {
            state: state.to_owned(),
            source_root: Some(source_root.to_owned()),
            events: Some(events.to_owned()),
            cm_root: None,
            retain: 16,
            fetch_timeout: crate::replicate::DEFAULT_FETCH_TIMEOUT,
            s3_endpoint: None,
            hive: HiveArgs::default(),
            checkpoint_events: crate::checkpoint::DEFAULT_CHECKPOINT_EVENTS,
            checkpoint_seconds: crate::checkpoint::DEFAULT_CHECKPOINT_INTERVAL.as_secs(),
            checkpoint_rate_mib: crate::checkpoint::DEFAULT_CHECKPOINT_RATE_MIB,
            publish: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct MountArgs {
    pub mountpoint: PathBuf,
    pub replicate: ReplicateArgs,
    pub allow_other: bool,
    /// `--metrics ADDR`: serve Prometheus metrics there (off when None).
    pub metrics: Option<String>,
}

fn require_dir(flag: &str, path: &Path) -> Result<(), DaemonError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(DaemonError::Usage(format!(
            "{flag} {} is not a directory",
            path.display()
        ))),
        Err(e) => Err(DaemonError::Usage(format!(
            "{flag} {}: {e}",
            path.display()
        ))),
    }
}

impl ReplicateArgs {
    /// Hides these folders in what other users read.
    fn redactor(&self) -> Redactor {
        let mut roots = vec![(self.state.as_path(), "<state>")];
        if let Some(root) = &self.source_root {
            roots.push((root.as_path(), "<source-root>"));
        }
        if let Some(events) = &self.events {
            roots.push((events.as_path(), "<events>"));
        }
        if let Some(cm) = &self.cm_root {
            roots.push((cm.as_path(), "<cm-root>"));
        }
        // Hive: the local folders of --source-map PREFIX=DIR.
        for map in &self.hive.source_map {
            // Split as SourceMap::parse does: at the first `=/`.
            if let Some(at) = map.find("=/") {
                roots.push((Path::new(&map[at + 1..]), "<source-map>"));
            }
        }
        Redactor::new(roots)
    }

    fn config(&self) -> Result<ReplicaConfig, DaemonError> {
        let hive = self.hive_config()?;
        let (source_root, events) = match (&hive, &self.source_root, &self.events) {
            (None, Some(root), Some(events)) => {
                require_dir("--source-root", root)?;
                require_dir("--events", events)?;
                (root.clone(), events.clone())
            }
            (None, _, _) => {
                return Err(DaemonError::Usage(
                    "give --source-root and --events (native events), or --hive-metastore or --hive-events with --source-map (Hive)".into(),
                ))
            }
            (Some(_), None, None) => (PathBuf::new(), PathBuf::new()),
            (Some(_), _, _) => {
                return Err(DaemonError::Usage(
                    "--source-root and --events are for native events; a Hive source finds files through --source-map".into(),
                ))
            }
        };
        if let Some(cm) = &self.cm_root {
            if hive.is_some() {
                return Err(DaemonError::Usage(
                    "--cm-root is for native events; Hive file URIs name their change-management root (map it with --source-map)".into(),
                ));
            }
            require_dir("--cm-root", cm)?;
        }
        if self.state.exists() {
            require_dir("--state", &self.state)?;
        } else {
            std::fs::create_dir_all(&self.state).map_err(|e| {
                DaemonError::Usage(format!(
                    "--state {}: cannot create: {e}",
                    self.state.display()
                ))
            })?;
        }
        let mut cfg = ReplicaConfig::new(&self.state, &source_root, &events);
        cfg.cm_root = self.cm_root.clone();
        cfg.retain = self.retain.max(1);
        cfg.fetch_timeout = self.fetch_timeout;
        cfg.remotes = self.remotes()?;
        cfg.rebootstrap = self.hive.bootstrap && hive.is_some();
        cfg.hive = hive;
        cfg.checkpoint_events = self.checkpoint_events;
        cfg.checkpoint_interval = Duration::from_secs(self.checkpoint_seconds.max(1));
        cfg.checkpoint_rate = self.checkpoint_rate_mib.saturating_mul(1 << 20);
        // Ctrl-C or SIGTERM during recovery ends the start, changing nothing.
        cfg.cancel = Some(stop_requested);
        Ok(cfg)
    }

    /// How S3 is reached: the AWS environment and profile, `--s3-endpoint`
    /// over them, each request bounded by `--fetch-timeout`. Logged
    /// without a secret: the server, the region and where the
    /// credentials come from.
    fn remotes(&self) -> Result<Remotes, DaemonError> {
        if let Some(endpoint) = &self.s3_endpoint {
            let scheme_ok = endpoint.starts_with("http://") || endpoint.starts_with("https://");
            if !scheme_ok || endpoint.contains('@') {
                return Err(DaemonError::Usage(
                    "--s3-endpoint must be an http:// or https:// URL without user info".into(),
                ));
            }
        }
        let settings =
            S3Settings::from_environment(self.s3_endpoint.as_deref(), self.fetch_timeout);
        if self.hive.rows.is_some() {
            tracing::info!(
                server = %settings.server(),
                region = %settings.region,
                credentials = %settings.source,
                "S3 files (s3a://, s3://) are read from this server"
            );
        }
        Ok(Remotes::with_s3(Arc::new(S3Access::new(settings))))
    }

    /// The Hive source's configuration, checked; None for native events.
    fn hive_config(&self) -> Result<Option<HiveConfig>, DaemonError> {
        let Some(rows) = &self.hive.rows else {
            if !self.hive.source_map.is_empty() {
                return Err(DaemonError::Usage(
                    "--source-map is for a Hive source: add --hive-metastore or --hive-events"
                        .into(),
                ));
            }
            return Ok(None);
        };
        // No map is fine: hdfs:// URIs are read where they are.
        let map = SourceMap::parse(&self.hive.source_map).map_err(DaemonError::Usage)?;
        for dir in map.dirs() {
            require_dir("--source-map", dir)?;
        }
        if let HiveRows::Files(path) = rows {
            if !path.exists() {
                return Err(DaemonError::Usage(format!(
                    "--hive-events {}: no such file or folder",
                    path.display()
                )));
            }
        }
        let mut cfg = HiveConfig::new(rows.clone(), map);
        cfg.poll_interval = Duration::from_millis(self.hive.poll_ms.max(1));
        cfg.event_time_margin = self.hive.event_time_margin;
        if !self.hive.catalog.is_empty() {
            cfg.catalog = crate::source::hive::adapter::catalog_name(&self.hive.catalog)
                .map_err(DaemonError::Usage)?;
        }
        Ok(Some(cfg))
    }
}

/// Tells systemd how the service is (`Type=notify`: `READY=1` once mounted,
/// `STOPPING=1` when shutting down) through the datagram socket named by
/// `$NOTIFY_SOCKET` (a path, or `@name` for an abstract socket). Without
/// it (not started by systemd) nothing is sent; a failed send is logged at
/// debug level only, since readiness is a courtesy to the supervisor.
pub fn notify_systemd(state: &str) {
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let bytes = target.as_encoded_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name)
        }
        None => SocketAddr::from_pathname(&target),
    };
    let sent = UnixDatagram::unbound()
        .and_then(|sock| addr.and_then(|addr| sock.send_to_addr(state.as_bytes(), &addr)));
    if let Err(e) = sent {
        tracing::debug!(error = %e, "cannot notify systemd");
    }
}

/// Set by SIGINT/SIGTERM.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

pub fn install_signal_handlers() {
    // SAFETY: the handler only stores to an atomic, which is
    // async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Writes `state/status.json` (not fsynced: it is a courtesy copy for
/// `stagefs status --state`, rebuilt every second).
fn write_status_file(state: &Path, report: &StatusReport) {
    let tmp = state.join(".status.json.tmp");
    let dst = state.join("status.json");
    if std::fs::write(&tmp, report.to_json())
        .and_then(|_| std::fs::rename(&tmp, &dst))
        .is_err()
    {
        warn!("cannot write {}", dst.display());
    }
}

/// Runs replication without a mount until SIGINT/SIGTERM.
pub fn replicate(args: ReplicateArgs) -> Result<(), DaemonError> {
    replicate_with_metrics(args, None)
}

/// [`replicate`], serving Prometheus metrics at `metrics` (`--metrics`).
pub fn replicate_with_metrics(
    args: ReplicateArgs,
    metrics: Option<String>,
) -> Result<(), DaemonError> {
    let cfg = args.config()?;
    let publish = publish_config(&args)?;
    let exporter = bind_metrics(metrics.as_deref())?;
    install_signal_handlers();
    bootstrap_if_asked(&args, &cfg)?;
    let replica = match Replica::start(cfg) {
        Err(ReplicaError::Cancelled) => {
            info!("stopped during recovery");
            return Ok(());
        }
        r => Arc::new(r?),
    };
    show_bootstrap(&replica, &args.state);
    let stop_replica = |replica: Arc<Replica>| match Arc::try_unwrap(replica) {
        Ok(r) => r.stop(),
        Err(_) => warn!("replication still referenced at exit"),
    };
    let publisher = match start_publisher(publish, &replica) {
        Ok(p) => p,
        Err(e) => {
            stop_replica(replica);
            return Err(e);
        }
    };
    let probe = publisher.as_ref().map(Publisher::probe);
    let serving = match exporter.map(|e| {
        e.serve(Sources {
            serves: Serves::Replica(Arc::clone(&replica)),
            publish: probe.clone(),
            leases: None,
            view: None,
            fuse: None,
        })
    }) {
        Some(Err(e)) => {
            let _ = stop_publisher(publisher);
            stop_replica(replica);
            return Err(DaemonError::Io(e.to_string()));
        }
        Some(Ok(s)) => Some(s),
        None => None,
    };
    info!(state = %args.state.display(), "replicating (headless)");
    notify_systemd("READY=1\nSTATUS=replicating (headless)");
    let mut tick = 0u32;
    while !stop_requested() && !publisher.as_ref().is_some_and(Publisher::failed) {
        std::thread::sleep(Duration::from_millis(50));
        tick += 1;
        if tick % 20 == 0 {
            write_status_file(&args.state, &status_with(&replica, probe.as_ref()));
        }
    }
    notify_systemd("STOPPING=1");
    // Its thread holds the replica: stopped first.
    if let Some(s) = serving {
        s.stop();
    }
    write_status_file(&args.state, &status_with(&replica, probe.as_ref()));
    let published = stop_publisher(publisher);
    stop_replica(replica);
    info!("stopped");
    published
}

/// `--metrics ADDR` bound before anything starts: an address that cannot
/// be bound is a usage error with nothing started.
fn bind_metrics(addr: Option<&str>) -> Result<Option<Exporter>, DaemonError> {
    addr.map(Exporter::bind)
        .transpose()
        .map_err(|e| DaemonError::Usage(e.to_string()))
}

/// `stagefs keygen FILE`.
pub fn keygen(file: &Path) -> Result<(), DaemonError> {
    let public =
        crate::publish::keys::keygen(file).map_err(|e| DaemonError::Usage(e.to_string()))?;
    println!(
        "secret key: {}\npublic key: {}",
        file.display(),
        public.display()
    );
    Ok(())
}

/// The publisher's configuration of `--publish` (its key read and its URL
/// checked before anything starts: mistakes are usage errors).
fn publish_config(args: &ReplicateArgs) -> Result<Option<PublishConfig>, DaemonError> {
    let Some(p) = &args.publish else {
        return Ok(None);
    };
    crate::publish::open_store(&p.url)
        .map_err(|e| DaemonError::Usage(format!("--publish: {e}")))?;
    let signing_key = p
        .signing_key
        .as_deref()
        .map(crate::publish::keys::load_signing)
        .transpose()
        .map_err(|e| DaemonError::Usage(format!("--signing-key: {e}")))?;
    Ok(Some(PublishConfig {
        url: p.url.clone(),
        signing_key,
        state_dir: args.state.clone(),
        gc: crate::publish::gc::GcConfig {
            retain: args.retain,
            grace: p.gc_grace,
        },
        held: None,
    }))
}

/// Starts publishing the replica's visible states; a second publisher on
/// the URL is a usage error.
fn start_publisher(
    cfg: Option<PublishConfig>,
    replica: &Replica,
) -> Result<Option<Publisher>, DaemonError> {
    let Some(mut cfg) = cfg else {
        return Ok(None);
    };
    let url = cfg.url.clone();
    let catalog = Arc::clone(replica.catalog());
    {
        // This host's pins and sessions: published and kept at the URL.
        let catalog = Arc::clone(&catalog);
        cfg.held = Some(Arc::new(move || {
            let snap = catalog.snapshot();
            snap.pins
                .states()
                .filter_map(|s| snap.versions.get(&s).cloned())
                .collect()
        }));
    }
    let blobs = Arc::clone(replica.blobs());
    let publisher = Publisher::start(
        cfg,
        Arc::new(move || Arc::clone(&catalog.snapshot().visible)),
        Arc::new(move |b: &BlobId| blobs.path(b)),
    )
    .map_err(|e| match e {
        PublishError::SecondPublisher { .. } | PublishError::Url(_) => {
            DaemonError::Usage(e.to_string())
        }
        other => DaemonError::Io(format!("publishing to {url}: {other}")),
    })?;
    info!(url = %url, "publishing");
    Ok(Some(publisher))
}

/// Stops the publisher; an error when it had stopped for good.
fn stop_publisher(publisher: Option<Publisher>) -> Result<(), DaemonError> {
    let Some(p) = publisher else {
        return Ok(());
    };
    let report = p.report();
    p.stop();
    match (report.fatal, report.error) {
        (true, Some(e)) => Err(DaemonError::Io(format!(
            "publishing to {}: {e}",
            report.url
        ))),
        _ => Ok(()),
    }
}

/// `--bootstrap`: builds the first state before replication starts
/// (nothing is mounted meanwhile; `stagefs status --state` and the log
/// show progress). A state folder that already replicates is left as it is
/// here; its replica bootstraps again if it stops at an id gap
/// (`ReplicaConfig::rebootstrap`).
fn bootstrap_if_asked(args: &ReplicateArgs, cfg: &ReplicaConfig) -> Result<(), DaemonError> {
    if !args.hive.bootstrap {
        return Ok(());
    }
    let Some(hive) = &cfg.hive else {
        return Err(DaemonError::Usage(
            "--bootstrap needs --hive-metastore URL".into(),
        ));
    };
    run_bootstrap(&args.state, hive, &cfg.remotes).map(|_| ())
}

/// Runs a bootstrap into `state`, writing `status.json` every second.
fn run_bootstrap(
    state: &Path,
    hive: &HiveConfig,
    remotes: &Remotes,
) -> Result<crate::bootstrap::Outcome, DaemonError> {
    use crate::bootstrap::{self, BootstrapConfig, BootstrapError, BootstrapProgress};
    let mut cfg = BootstrapConfig::new(state, hive.clone());
    cfg.remotes = remotes.clone();
    let progress = BootstrapProgress::default();
    let finished = AtomicBool::new(false);
    let result = std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut tick = 0u32;
            while !finished.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                tick += 1;
                if tick % 20 == 0 {
                    let mut report = StatusReport::empty();
                    report.running = true;
                    report.bootstrap = Some(progress.report());
                    write_status_file(state, &report);
                }
            }
        });
        let result = bootstrap::run(&cfg, &progress, &stop_requested);
        finished.store(true, Ordering::Relaxed);
        result
    });
    let mut report = StatusReport::empty();
    report.bootstrap = Some(progress.report());
    if !matches!(result, Ok(bootstrap::Outcome::AlreadyReplicating(_))) {
        write_status_file(state, &report);
    }
    result.map_err(|e| match e {
        BootstrapError::Usage(u) => DaemonError::Usage(u),
        other => DaemonError::Io(other.to_string()),
    })
}

/// Puts the recorded bootstrap outcome into the replica's status.
fn show_bootstrap(replica: &Replica, state: &Path) {
    if let Some(report) = crate::bootstrap::last_report(state) {
        *replica
            .progress()
            .bootstrap
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(report);
    }
}

/// `stagefs bootstrap`: the bootstrap alone, without replicating after it.
/// On a folder that already replicates and stalled at an id gap, the
/// re-bootstrap of a `--bootstrap` daemon, run to its commit
/// (`rebootstrap_stalled`).
pub fn bootstrap(args: ReplicateArgs) -> Result<(), DaemonError> {
    let mut cfg = args.config()?;
    install_signal_handlers();
    let Some(hive) = cfg.hive.clone() else {
        return Err(DaemonError::Usage(
            "bootstrap needs --hive-metastore URL and --source-map".into(),
        ));
    };
    match run_bootstrap(&args.state, &hive, &cfg.remotes)? {
        crate::bootstrap::Outcome::Bootstrapped(id) => {
            info!(state_id = %id, "bootstrapped; `stagefs mount` or `replicate` on the same --state continues from here")
        }
        crate::bootstrap::Outcome::AlreadyReplicating(id) => {
            let gap = crate::bootstrap::gap_after(&hive, id)
                .map_err(|e| DaemonError::Io(e.to_string()))?;
            let Some((from, to)) = gap else {
                info!(latest = %id, "the state folder already replicates and has no gap; nothing to do");
                return Ok(());
            };
            info!(from, to, latest = %id, "events after the state folder's last id are missing: bootstrapping again");
            cfg.rebootstrap = true;
            let y = rebootstrap_stalled(cfg, id)?;
            info!(state_id = %y, "bootstrapped again; `stagefs mount` or `replicate` on the same --state continues from here");
        }
    }
    Ok(())
}

/// Runs the replica of a folder stalled at an id gap (its latest id `at`)
/// until its re-bootstrap is committed; returns the new state's id. A
/// failed run is an error (the daemon would try again; this command
/// reports it).
fn rebootstrap_stalled(
    cfg: ReplicaConfig,
    at: crate::event::StateId,
) -> Result<crate::event::StateId, DaemonError> {
    let state = cfg.state_dir.clone();
    let replica = Replica::start(cfg)?;
    let mut tick = 0u32;
    let result = loop {
        if stop_requested() {
            break Err(DaemonError::Io(
                "bootstrap stopped before it completed (run the same command to resume)".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
        tick += 1;
        if tick % 20 == 0 {
            write_status_file(&state, &replica.status());
        }
        let report = replica
            .progress()
            .bootstrap
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(report) = report else { continue };
        match (report.phase.as_str(), report.state_id) {
            ("failed", _) => {
                break Err(DaemonError::Io(format!(
                    "bootstrap: {}",
                    report.error.unwrap_or_else(|| "failed".into())
                )))
            }
            ("done", Some(y)) if y > at.0 as i64 => {
                let y = crate::event::StateId(y as u64);
                if replica.catalog().snapshot().visible.state_id >= y {
                    break Ok(y);
                }
            }
            _ => {}
        }
        if let Some(failure) = replica
            .progress()
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            break Err(DaemonError::Io(failure.reason));
        }
    };
    write_status_file(&state, &replica.status());
    replica.stop();
    result
}

/// The status served as `.stagefs/status`; with `--allow-other` its host
/// paths are redacted (other users read it). The third field: what it
/// publishes, shown as `publish` (its `url` is for `stagefs lease`).
struct ReplicaStatus(Arc<Replica>, Option<Redactor>, Option<PublishProbe>);

/// The replica's status with its `publish` object.
fn status_with(replica: &Replica, publish: Option<&PublishProbe>) -> StatusReport {
    let mut report = replica.status();
    report.publish = publish.map(|p| PublishStatus::of(&p.read()));
    report
}

impl StatusSource for ReplicaStatus {
    fn status_json(&self) -> String {
        let report = status_with(&self.0, self.2.as_ref());
        if self.1.is_none() {
            return report.to_json();
        }
        match serde_json::to_value(&report) {
            Ok(mut v) => {
                if let Some(redactor) = &self.1 {
                    redactor.redact_json(&mut v);
                }
                let mut s = serde_json::to_string_pretty(&v)
                    .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
                s.push('\n');
                s
            }
            Err(e) => format!("{{\"error\": \"{e}\"}}\n"),
        }
    }

    fn latest(&self) -> crate::event::StateId {
        // Without rendering the whole status on every `getxattr`.
        let visible = self.0.catalog().snapshot().visible.state_id;
        self.0.progress().latest(visible)
    }
}

/// A stagefs mount whose daemon died (`kill -9`) answers "Transport
/// endpoint is not connected". Running the same command again should resume
/// (SPEC §6), so such a dead mount is detached first. A `stat` of the root
/// may still answer from the kernel's attribute cache, so listing it (which
/// always asks the daemon) is checked too.
fn clear_dead_mount(path: &Path) {
    let not_connected = |e: std::io::Error| e.raw_os_error() == Some(libc::ENOTCONN);
    let dead = std::fs::metadata(path).err().is_some_and(not_connected)
        || std::fs::read_dir(path).err().is_some_and(not_connected);
    if !dead || !is_stagefs_mount(path) {
        return;
    }
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        warn!(mountpoint = %path.display(), "detached the dead mount of a previous stagefs run");
    }
}

/// True when `path` is mounted as a stagefs FUSE filesystem (by mountinfo,
/// which does not touch the possibly dead mount).
fn is_stagefs_mount(path: &Path) -> bool {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(path))
            .unwrap_or_else(|_| path.to_path_buf())
    };
    // "fuse stagefs", or "fuse.stagefs stagefs" where the subtype is kept.
    mount_types(&abs).iter().any(|(fstype, source)| {
        (fstype == "fuse" || fstype == "fuse.stagefs") && source == "stagefs"
    })
}

/// The filesystem type and source of every mount whose mount point is `at`
/// (an absolute path), from /proc/self/mountinfo.
fn mount_types(at: &Path) -> Vec<(String, String)> {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    mounts
        .lines()
        .filter_map(|l| {
            let mount_point = unescape_mountinfo(l.split(' ').nth(4)?);
            if Path::new(&mount_point) != at {
                return None;
            }
            // After " - ": filesystem type, then source.
            let mut tail = l.split(" - ").nth(1)?.split(' ');
            Some((
                tail.next()?.to_owned(),
                tail.next().unwrap_or("").to_owned(),
            ))
        })
        .collect()
}

fn check_mountpoint(path: &Path) -> Result<(), DaemonError> {
    clear_dead_mount(path);
    require_dir("mountpoint", path)?;
    let mut entries = std::fs::read_dir(path)
        .map_err(|e| DaemonError::Usage(format!("mountpoint {}: {e}", path.display())))?;
    if entries.next().is_some() {
        return Err(DaemonError::Usage(format!(
            "mountpoint {} is not an empty directory",
            path.display()
        )));
    }
    if is_mount_point(path) {
        return Err(DaemonError::Usage(format!(
            "{} is already a mount point",
            path.display()
        )));
    }
    Ok(())
}

/// True when `path` is the root of a mounted filesystem.
pub fn is_mount_point(path: &Path) -> bool {
    path.canonicalize()
        .is_ok_and(|canon| !mount_types(&canon).is_empty())
}

/// Decodes the octal escapes (`\040` for a space, ...) of a mountinfo path.
pub fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `stagefs mount`: replicate and serve until SIGINT/SIGTERM or an external
/// `umount`.
pub fn mount(args: MountArgs) -> Result<(), DaemonError> {
    check_mountpoint(&args.mountpoint)?;
    let cfg = args.replicate.config()?;
    let publish = publish_config(&args.replicate)?;
    // Before replication starts: an address that cannot be bound is a
    // usage error with nothing started.
    let exporter = bind_metrics(args.metrics.as_deref())?;
    install_signal_handlers();
    bootstrap_if_asked(&args.replicate, &cfg)?;
    let replica = match Replica::start(cfg) {
        // Nothing was mounted yet.
        Err(ReplicaError::Cancelled) => {
            info!("stopped during recovery; nothing was mounted");
            return Ok(());
        }
        r => Arc::new(r?),
    };
    show_bootstrap(&replica, &args.replicate.state);
    let publisher = match start_publisher(publish, &replica) {
        Ok(p) => p,
        Err(e) => {
            if let Ok(r) = Arc::try_unwrap(replica) {
                r.stop();
            }
            return Err(e);
        }
    };
    let state = args.replicate.state.clone();
    let should_stop = || stop_requested() || publisher.as_ref().is_some_and(Publisher::failed);
    let probe = publisher.as_ref().map(Publisher::probe);
    let result = serve_publishing(
        &args,
        &replica,
        exporter,
        probe.clone(),
        should_stop,
        |_| {},
    );
    let result = result.and(stop_publisher(publisher));
    write_status_file(&state, &status_with(&replica, probe.as_ref()));
    match Arc::try_unwrap(replica) {
        Ok(r) => r.stop(),
        Err(_) => warn!("replication still referenced at exit"),
    }
    info!("stopped");
    result
}

/// `stagefs mount MNT --from URL --cache DIR`: a reader host.
#[derive(Debug, Clone)]
pub struct FollowArgs {
    pub mountpoint: PathBuf,
    pub url: String,
    pub cache: PathBuf,
    pub cache_size: u64,
    pub trusted_key: Option<PathBuf>,
    pub poll_ms: u64,
    pub allow_other: bool,
    /// `--lease-ttl`: the leases of this host's pins and sessions.
    pub lease_ttl: Duration,
    /// `--metrics ADDR`: serve Prometheus metrics there (off when None).
    pub metrics: Option<String>,
}

/// Serves the states published at `args.url` until SIGINT/SIGTERM or an
/// external `umount`.
pub fn mount_from(args: FollowArgs) -> Result<(), DaemonError> {
    use crate::follow::{FollowConfig, FollowError, Follower};
    check_mountpoint(&args.mountpoint)?;
    let trusted_key = args
        .trusted_key
        .as_deref()
        .map(crate::publish::keys::load_trusted)
        .transpose()
        .map_err(|e| DaemonError::Usage(format!("--trusted-key: {e}")))?;
    let exporter = bind_metrics(args.metrics.as_deref())?;
    install_signal_handlers();
    let follower = Follower::start(FollowConfig {
        url: args.url.clone(),
        cache_dir: args.cache.clone(),
        cache_size: args.cache_size,
        trusted_key,
        poll: Duration::from_millis(args.poll_ms),
        retain: 16,
    })
    .map_err(|e| match e {
        FollowError::Url(_) | FollowError::Cache(..) => DaemonError::Usage(e.to_string()),
        FollowError::Cached { .. } => DaemonError::Io(e.to_string()),
    })?;
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let view = Arc::new(View::new(
        Arc::clone(follower.catalog()),
        follower.blob_path(),
        follower.status_source(),
        ViewConfig {
            uid,
            gid,
            mount_time: SystemTime::now(),
        },
    ));
    view.set_state_source(follower.state_source());
    view.set_fetched(follower.fetched_blobs());
    let requests = exporter.as_ref().map(|_| Arc::new(FuseRequests::default()));
    let opts = MountOptions {
        allow_other: args.allow_other,
        threads: 2,
        requests: requests.clone(),
        ..MountOptions::default()
    };
    let mounted = match fuse::mount(Arc::clone(&view), &args.mountpoint, &opts) {
        Ok(m) => m,
        Err(e) => {
            follower.stop();
            return Err(DaemonError::Mount(format!(
                "mounting {}: {e}",
                args.mountpoint.display()
            )));
        }
    };
    let keeper = start_lease_keeper(&args, follower.catalog());
    let metrics = match exporter {
        Some(exporter) => match exporter.serve(Sources {
            serves: Serves::Published(follower.probe()),
            publish: None,
            leases: keeper.as_ref().map(|k| k.held()),
            view: Some(view),
            fuse: requests,
        }) {
            Ok(m) => Some(m),
            Err(e) => {
                let _ = mounted.unmount();
                if let Some(k) = keeper {
                    k.stop();
                }
                follower.stop();
                return Err(DaemonError::Io(e.to_string()));
            }
        },
        None => {
            drop(view);
            None
        }
    };
    info!(mountpoint = %args.mountpoint.display(), url = %args.url, "mounted (reader host)");
    notify_systemd(&format!(
        "READY=1\nSTATUS=mounted at {}",
        args.mountpoint.display()
    ));
    while !stop_requested() {
        std::thread::sleep(Duration::from_millis(50));
        if mounted.is_ended() {
            info!("unmounted from outside");
            break;
        }
    }
    notify_systemd("STOPPING=1");
    // Its thread holds the view: stopped before the unmount.
    if let Some(m) = metrics {
        m.stop();
    }
    let result = mounted
        .unmount()
        .map_err(|e| DaemonError::Mount(format!("unmounting: {e}")));
    if let Some(k) = keeper {
        k.stop();
    }
    follower.stop();
    info!("stopped");
    result
}

/// A reader host's leases at the URL: one per state its pins and
/// `stagefs run` sessions hold (SPEC §8). Without them it still serves.
fn start_lease_keeper(
    args: &FollowArgs,
    catalog: &Arc<crate::catalog::Catalog>,
) -> Option<crate::publish::lease::LeaseKeeper> {
    use crate::publish::lease;
    let store = crate::publish::open_store(&args.url).ok()?;
    let catalog = Arc::clone(catalog);
    let states: lease::HeldStatesFn = Arc::new(move || catalog.snapshot().pins.states().collect());
    match lease::LeaseKeeper::start(
        store,
        states,
        args.lease_ttl,
        lease::holder("reader host pins and sessions"),
    ) {
        Ok(k) => Some(k),
        Err(e) => {
            warn!("cannot start leasing at {}: {e}", args.url);
            None
        }
    }
}

/// Mounts `replica` at `args.mountpoint` and serves until `should_stop()`
/// or an external unmount; `on_tick` runs every 50 ms (the demo uses it).
/// With an `exporter`, serves metrics of the mount meanwhile.
pub fn serve(
    args: &MountArgs,
    replica: &Arc<Replica>,
    exporter: Option<Exporter>,
    should_stop: impl Fn() -> bool,
    on_tick: impl FnMut(&Replica),
) -> Result<(), DaemonError> {
    serve_publishing(args, replica, exporter, None, should_stop, on_tick)
}

/// [`serve`] for a mount that also publishes (`--publish URL`): its
/// status and metrics show the publisher's report.
fn serve_publishing(
    args: &MountArgs,
    replica: &Arc<Replica>,
    exporter: Option<Exporter>,
    publish: Option<PublishProbe>,
    should_stop: impl Fn() -> bool,
    mut on_tick: impl FnMut(&Replica),
) -> Result<(), DaemonError> {
    let blobs = Arc::clone(replica.blobs());
    let blob_path = Arc::new(move |b: &BlobId| blobs.path(b));
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let view = Arc::new(View::new(
        Arc::clone(replica.catalog()),
        blob_path,
        Arc::new(ReplicaStatus(
            Arc::clone(replica),
            args.allow_other.then(|| args.replicate.redactor()),
            publish.clone(),
        )),
        ViewConfig {
            uid,
            gid,
            mount_time: SystemTime::now(),
        },
    ));
    {
        // Weak: the view holds the replica (for status); a strong reference
        // back would keep both alive past shutdown.
        let view = Arc::downgrade(&view);
        replica.set_held_dirs(Arc::new(move || {
            view.upgrade().map(|v| v.held_dirs()).unwrap_or_default()
        }));
    }
    let requests = exporter.as_ref().map(|_| Arc::new(FuseRequests::default()));
    let opts = MountOptions {
        allow_other: args.allow_other,
        threads: 2,
        requests: requests.clone(),
        ..MountOptions::default()
    };
    let mounted = fuse::mount(Arc::clone(&view), &args.mountpoint, &opts)
        .map_err(|e| DaemonError::Mount(format!("mounting {}: {e}", args.mountpoint.display())))?;
    info!(mountpoint = %args.mountpoint.display(), "mounted");
    // Started by the fstab mount helper: the log leaves its pipe first.
    crate::mount_helper::detach_stderr();
    notify_systemd(&format!(
        "READY=1\nSTATUS=mounted at {}",
        args.mountpoint.display()
    ));
    let metrics = match exporter {
        Some(exporter) => Some(
            exporter
                .serve(Sources {
                    serves: Serves::Replica(Arc::clone(replica)),
                    publish: publish.clone(),
                    leases: None,
                    view: Some(view),
                    fuse: requests,
                })
                .map_err(|e| DaemonError::Io(e.to_string()))?,
        ),
        None => {
            drop(view);
            None
        }
    };
    let mut tick = 0u32;
    let mut external = false;
    while !should_stop() {
        std::thread::sleep(Duration::from_millis(50));
        on_tick(replica);
        tick += 1;
        if tick % 20 == 0 {
            write_status_file(
                &args.replicate.state,
                &status_with(replica, publish.as_ref()),
            );
        }
        if mounted.is_ended() {
            external = true;
            info!("unmounted from outside");
            break;
        }
    }
    notify_systemd("STOPPING=1");
    if !external {
        info!("unmounting");
    }
    // Its thread holds the replica and the view: stopped before both go.
    if let Some(m) = metrics {
        m.stop();
    }
    mounted
        .unmount()
        .map_err(|e| DaemonError::Mount(format!("unmounting: {e}")))
}

/// `stagefs status`.
pub fn status(
    mountpoint: Option<PathBuf>,
    state: Option<PathBuf>,
    watch: bool,
) -> Result<(), DaemonError> {
    // A reader host's status (SPEC §8) is its own object: shown as it is.
    if let Some(mp) = &mountpoint {
        let text = std::fs::read_to_string(mp.join(".stagefs/status")).unwrap_or_default();
        let value: Option<serde_json::Value> = serde_json::from_str(&text).ok();
        if let Some(v) = value.filter(|v| v["role"] == "reader") {
            if watch {
                return Err(DaemonError::Usage(
                    "--watch is for replicating mounts; a reader host's status is printed whole"
                        .into(),
                ));
            }
            println!(
                "{}",
                serde_json::to_string_pretty(&v).map_err(|e| DaemonError::Io(e.to_string()))?
            );
            return Ok(());
        }
    }
    let read = || -> Result<StatusReport, DaemonError> {
        match (&mountpoint, &state) {
            (Some(mp), _) => {
                let p = mp.join(".stagefs/status");
                let text = std::fs::read_to_string(&p).map_err(|e| {
                    DaemonError::Usage(format!("{} is not a stagefs mount ({e})", mp.display()))
                })?;
                serde_json::from_str(&text).map_err(|e| {
                    DaemonError::Io(format!("{}: unreadable status: {e}", p.display()))
                })
            }
            (None, Some(dir)) => offline_status(dir),
            (None, None) => Err(DaemonError::Usage(
                "give a MOUNTPOINT or --state DIR".into(),
            )),
        }
    };
    if !watch {
        print!("{}", read()?.to_json());
        return Ok(());
    }
    install_signal_handlers();
    let mut prev: Option<(StatusReport, std::time::Instant)> = None;
    while !stop_requested() {
        let now = std::time::Instant::now();
        let s = read()?;
        let (ev_rate, byte_rate) = match &prev {
            Some((p, t)) => {
                let dt = now.duration_since(*t).as_secs_f64().max(1e-3);
                (
                    (s.visible.0.saturating_sub(p.visible.0)) as f64 / dt,
                    (s.staging
                        .bytes_fetched
                        .saturating_sub(p.staging.bytes_fetched)) as f64
                        / dt,
                )
            }
            None => (0.0, 0.0),
        };
        println!(
            "visible {} latest {} lag {} events / {} staged {} MiB ({:.0} ids/s, {:.1} MiB/s){}",
            s.visible,
            s.latest,
            s.lag_events,
            s.lag_seconds.map_or("? s".into(), |l| format!("{l:.1} s")),
            s.staged_bytes >> 20,
            ev_rate,
            byte_rate / (1 << 20) as f64,
            s.stalled
                .as_ref()
                .map_or(String::new(), |st| format!("  STALLED: {}", st.reason)),
        );
        prev = Some((s, now));
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(())
}

/// Status from the state folder: the daemon's last status file, with the
/// durable commit record and pins as the authority for what is visible.
fn offline_status(dir: &Path) -> Result<StatusReport, DaemonError> {
    require_dir("--state", dir)?;
    let running = state_in_use(dir);
    let (record, pins) = load_durable(dir).map_err(|e| DaemonError::Io(e.to_string()))?;
    let last: Option<StatusReport> = std::fs::read(dir.join("status.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let mut s = match last {
        Some(s) if running => return Ok(s),
        Some(s) => s,
        None if running => {
            return Err(DaemonError::Io(format!(
                "{} is in use but has no status yet; try again in a second",
                dir.display()
            )))
        }
        None if !catalog::has_commit_record(dir) && !dir.join("journal").exists() => {
            return Err(DaemonError::Usage(format!(
                "{} is not a stagefs state folder",
                dir.display()
            )))
        }
        None => StatusReport::empty(),
    };
    s.running = false;
    s.visible = record.visible;
    s.latest = s.latest.max(record.visible);
    s.lag_events = s.latest.0 - s.visible.0;
    s.retained = record.retained;
    s.pins = pins.labelled();
    s.sessions = crate::status::sessions_report(&pins);
    s.staging.in_flight = 0;
    Ok(s)
}
