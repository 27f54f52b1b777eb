//! The command line of `stagefs` (clap derive): the binary parses it, the
//! config file ([`crate::config`]) reads its keys from it, and
//! `stagefs completions` / `stagefs manpage` are generated from it.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::daemon::LogFormat;

#[derive(Debug, Parser)]
#[command(
    name = "stagefs",
    version,
    about = "A FUSE filesystem that shows a replicated warehouse only in states the source really had"
)]
pub struct Cli {
    /// How log lines are written to stderr: text (coloured only on a
    /// terminal) or json (one object per line).
    #[arg(
        long = "log-format",
        value_name = "text|json",
        global = true,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct SourceArgs {
    /// Folder that holds everything stagefs owns (journal, staged files, commits, pins).
    #[arg(long = "state", value_name = "DIR")]
    pub state: PathBuf,
    /// The source warehouse's files (native source).
    #[arg(long = "source-root", value_name = "DIR")]
    pub source_root: Option<PathBuf>,
    /// The source notification log: *.jsonl files, read in name order (native source).
    #[arg(long = "events", value_name = "DIR")]
    pub events: Option<PathBuf>,
    /// Follow Hive's metastore database: postgresql://user@host:port/db or
    /// mysql://user@host:port/db (password: STAGEFS_METASTORE_PASSWORD or
    /// ?password_file=; TLS: ?sslmode=…&sslrootcert=… or ?ssl-mode=…&ssl-ca=…).
    #[arg(long = "hive-metastore", value_name = "URL", conflicts_with_all = ["events", "hive_events"])]
    pub hive_metastore: Option<String>,
    /// Follow Hive NOTIFICATION_LOG rows exported as JSON Lines (a file or a folder of *.jsonl).
    #[arg(long = "hive-events", value_name = "PATH", conflicts_with = "events")]
    pub hive_events: Option<PathBuf>,
    /// Where Hive's file URIs are on this machine: PREFIX=DIR (repeatable).
    #[arg(long = "source-map", value_name = "PREFIX=DIR")]
    pub source_map: Vec<String>,
    /// The S3 endpoint for s3a:// and s3:// files (an S3-compatible store,
    /// addressed path-style; may be http://); overrides AWS_ENDPOINT_URL.
    #[arg(long = "s3-endpoint", value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// How much later than its event's EVENT_TIME a file without a checksum,
    /// read from HDFS or S3, may have been modified and still be accepted
    /// as "not newer than its event": 1s, 2500ms, 1.5s; at most 5s.
    #[arg(long = "event-time-margin", value_name = "DURATION", default_value = "1s", value_parser = crate::stage::EventTimeMargin::parse)]
    pub event_time_margin: crate::stage::EventTimeMargin,
    /// How often to poll the Hive notification log, in milliseconds.
    #[arg(long = "hive-poll-ms", value_name = "N", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    pub hive_poll_ms: u64,
    /// The metastore catalog to replicate (`CTLGS`; Hive 2 has only
    /// `hive`): rows and databases of other catalogs are skipped.
    #[arg(long = "catalog", value_name = "NAME", default_value = "hive")]
    pub catalog: String,
    /// Read the metastore password from this file (its first line); else
    /// it comes from STAGEFS_METASTORE_PASSWORD.
    #[arg(
        long = "metastore-password-file",
        value_name = "FILE",
        requires = "hive_metastore"
    )]
    pub metastore_password_file: Option<PathBuf>,
    /// Take options from this TOML file (keys: the long flags without
    /// dashes, and `mountpoint`); flags given here override it.
    #[arg(long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Change-management root: copies named `<file name>_<sha256>`.
    #[arg(long = "cm-root", value_name = "DIR")]
    pub cm_root: Option<PathBuf>,
    /// Build the first state from the metastore's tables (databases, tables,
    /// partitions, their files) before following its events.
    #[arg(long, requires = "hive_metastore")]
    pub bootstrap: bool,
    /// Newest unpinned versions kept browsable under .stagefs/snapshots.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    pub retain: u64,
    /// Seconds a read of a source file may make no progress before the
    /// fetch is abandoned and retried (a hung NFS or FUSE source).
    #[arg(long = "fetch-timeout", value_name = "SECS", default_value_t = crate::replicate::DEFAULT_FETCH_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub fetch_timeout: u64,
    /// Write a catalog checkpoint (and compact the journal) once the visible
    /// state-id moved N past the last one; 0: by time only.
    #[arg(long = "checkpoint-events", value_name = "N", default_value_t = crate::checkpoint::DEFAULT_CHECKPOINT_EVENTS)]
    pub checkpoint_events: u64,
    /// ...or once this many seconds passed with a newer visible state.
    #[arg(long = "checkpoint-interval", value_name = "SECONDS", default_value_t = crate::checkpoint::DEFAULT_CHECKPOINT_INTERVAL.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_interval: u64,
    /// MiB per second a checkpoint is written at, so its bytes never queue
    /// ahead of the commits' flushes; 0: as fast as the disk takes them.
    #[arg(long = "checkpoint-rate", value_name = "MIB_PER_S", default_value_t = crate::checkpoint::DEFAULT_CHECKPOINT_RATE_MIB)]
    pub checkpoint_rate: u64,
}

/// Publishing the visible states for reader hosts (SPEC §8).
#[derive(Debug, Args)]
pub struct PublishFlags {
    /// Publish every visible state (it may skip states) to shared storage:
    /// s3://bucket/prefix or file:///dir.
    #[arg(long, value_name = "URL")]
    pub publish: Option<String>,
    /// Sign the published head with this ed25519 key (`stagefs keygen`).
    #[arg(long = "signing-key", value_name = "FILE", requires = "publish")]
    pub signing_key: Option<PathBuf>,
    /// How long a state no longer retained or leased at the URL keeps its
    /// objects (a reader loading it has this long), and how long past its
    /// expiry a lease is still honoured (clock skew): 90s, 10m, 1h.
    #[arg(long = "gc-grace", value_name = "DURATION", default_value = "10m", value_parser = parse_duration, requires = "publish")]
    pub gc_grace: std::time::Duration,
}

/// A reader host: serve the states published at a URL (SPEC §8).
#[derive(Debug, Args)]
pub struct FollowFlags {
    /// Serve the states a publisher writes to URL (s3://bucket/prefix or
    /// file:///dir) instead of replicating a source.
    #[arg(
        long,
        value_name = "URL",
        conflicts_with = "SourceArgs",
        requires = "cache"
    )]
    pub from: Option<String>,
    /// Folder for fetched file content, catalogs and the commit record.
    #[arg(long, value_name = "DIR", requires = "from")]
    pub cache: Option<PathBuf>,
    /// Bytes of file content the cache keeps (suffixes K, M, G, T: powers of 1024).
    #[arg(long = "cache-size", value_name = "BYTES", default_value = "10G", value_parser = parse_size, requires = "from")]
    pub cache_size: u64,
    /// Refuse heads not signed by this public key (`stagefs keygen`'s FILE.pub).
    #[arg(long = "trusted-key", value_name = "FILE", requires = "from")]
    pub trusted_key: Option<PathBuf>,
    /// How often to read the published head, in milliseconds.
    #[arg(long = "poll-ms", value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..), requires = "from")]
    pub poll_ms: u64,
    /// Lifetime of the leases this host takes at the URL for its pins and
    /// `stagefs run` sessions (renewed every third of it while it runs;
    /// a dead host's leases end this long after its last renewal).
    #[arg(long = "lease-ttl", value_name = "DURATION", default_value = "60s", value_parser = parse_duration, requires = "from")]
    pub lease_ttl: std::time::Duration,
}

/// `90s`, `10m`, `2h`, `1d`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let (digits, unit) = match s.as_bytes().last() {
        Some(b's') => (&s[..s.len() - 1], 1),
        Some(b'm') => (&s[..s.len() - 1], 60),
        Some(b'h') => (&s[..s.len() - 1], 3600),
        Some(b'd') => (&s[..s.len() - 1], 86400),
        _ => (s, 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 90s, 10m, 2h, 1d)"))?;
    n.checked_mul(unit)
        .filter(|&secs| secs > 0)
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| format!("{s}: a duration must be positive and not too large"))
}

/// `10G`, `512M`, `4096`: bytes, with binary suffixes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 30),
        Some(b'T' | b't') => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 10G, 512M, 4096)"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s} is too large"))
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Replicate and serve the mount (foreground; Ctrl-C or SIGTERM unmounts).
    Mount {
        /// An empty directory to mount on.
        mountpoint: PathBuf,
        #[command(flatten)]
        source: Option<SourceArgs>,
        #[command(flatten)]
        follow: FollowFlags,
        /// Let users other than the mounting one read the mount.
        #[arg(long)]
        allow_other: bool,
        /// Serve Prometheus metrics at http://ADDR/metrics (HOST:PORT, e.g.
        /// 127.0.0.1:9464; off unless given).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
        #[command(flatten)]
        publish: PublishFlags,
    },
    /// Print the status JSON of a mount or a state folder.
    Status {
        /// A stagefs mountpoint.
        mountpoint: Option<PathBuf>,
        /// A state folder (works without a running daemon).
        #[arg(long = "state", value_name = "DIR", conflicts_with = "mountpoint")]
        state: Option<PathBuf>,
        /// Print one line per second (visible, latest, lag, rates) until interrupted.
        #[arg(long)]
        watch: bool,
    },
    /// Run COMMAND so that it and every process it starts see one state of the mount.
    Run {
        /// A stagefs mountpoint.
        mountpoint: PathBuf,
        /// The state to see: a retained state-id, or `visible` (the newest).
        #[arg(long, value_name = "STATE|visible", default_value = "visible")]
        at: String,
        /// Run COMMAND in its own mount namespace in which MOUNTPOINT shows
        /// the session's snapshot, so the kernel caches every name and file
        /// it resolves (root or CAP_SYS_ADMIN; docs/SEMANTICS.md, Sessions).
        #[arg(long)]
        private_mount: bool,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<std::ffi::OsString>,
    },
    /// Lease a state at the URL a mount publishes or follows, for a job
    /// started elsewhere (Airflow, cron): prints `STAGEFS_STATE_ID=N` and
    /// `STAGEFS_LEASE=ID` for a shell to eval. The lease ends at --ttl
    /// unless renewed (--renew ID) or released (--release ID).
    Lease {
        /// A stagefs mountpoint that publishes (--publish) or follows (--from) a URL.
        mountpoint: PathBuf,
        /// The state to lease: a state-id published at the URL, or `visible`.
        #[arg(long, value_name = "STATE|visible", default_value = "visible", conflicts_with_all = ["release", "renew"])]
        at: String,
        /// How long the lease lasts (from now; also for --renew).
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
        ttl: std::time::Duration,
        /// End lease ID now.
        #[arg(long, value_name = "ID", conflicts_with = "renew")]
        release: Option<String>,
        /// Extend lease ID to --ttl from now.
        #[arg(long, value_name = "ID")]
        renew: Option<String>,
    },
    /// Fetch files ahead into a reader host's cache (a table, a partition, a
    /// snapshot path; the whole visible state without PATH), with a
    /// progress line on stderr.
    Warm {
        /// A stagefs mountpoint (a reader host: `mount --from`).
        mountpoint: PathBuf,
        /// Folders or files under the mount.
        paths: Vec<PathBuf>,
    },
    /// Self-contained demo: a synthetic warehouse that keeps changing, mounted.
    Demo {
        /// Where to mount (default: a new folder under /tmp).
        mountpoint: Option<PathBuf>,
        /// Feed the demo through Hive notification rows (gzip(json-2.0)) instead of native events.
        #[arg(long)]
        hive: bool,
    },
    /// Replicate without mounting (headless; for staging hosts and tests).
    Replicate {
        #[command(flatten)]
        source: SourceArgs,
        #[command(flatten)]
        publish: PublishFlags,
        /// Serve Prometheus metrics at http://ADDR/metrics (HOST:PORT, e.g.
        /// 127.0.0.1:9464; off unless given).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
    },
    /// Write a new ed25519 key pair for signed publishing: FILE (secret,
    /// mode 0600) and FILE.pub (for readers' --trusted-key).
    Keygen {
        /// Where to write the secret key (must not exist).
        file: PathBuf,
    },
    /// Bootstrap a state folder from the Hive metastore's tables, then exit
    /// (`mount` or `replicate` with the same --state continues from it).
    Bootstrap {
        #[command(flatten)]
        source: SourceArgs,
    },
    /// Check a mount's or a replicate's setup before starting it (FUSE,
    /// mountpoint, state folder, metastore, source file systems); each
    /// check says ok or fail with a fix. Exits 0 only when all pass;
    /// changes nothing.
    Check {
        /// The mountpoint `mount` would use (without it: a `replicate` setup).
        mountpoint: Option<PathBuf>,
        #[command(flatten)]
        source: Option<SourceArgs>,
        #[command(flatten)]
        follow: FollowFlags,
        /// As for `mount`: check that other users may be let in.
        #[arg(long)]
        allow_other: bool,
        /// As for `mount`: check that this HOST:PORT can be bound.
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
        #[command(flatten)]
        publish: PublishFlags,
    },
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish,
    /// powershell) on stdout.
    Completions {
        /// The shell to complete for.
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Print the man page stagefs(1) (roff) on stdout.
    Manpage,
}

/// Writes the completion script of `stagefs` for `shell` to `out`.
/// (Generated in memory first: clap_complete panics on a write error,
/// such as a closed pipe.)
pub fn write_completions(
    shell: clap_complete::Shell,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(
        shell,
        &mut <Cli as clap::CommandFactory>::command(),
        "stagefs",
        &mut script,
    );
    out.write_all(&script)
}

/// Writes the man page stagefs(1) to `out`: the top-level page, then each
/// subcommand's page (its options) as a section of the same document, so
/// one file documents every option.
pub fn write_manpage(out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let cli = <Cli as clap::CommandFactory>::command();
    clap_mangen::Man::new(cli.clone()).render(out)?;
    for sub in cli.get_subcommands() {
        let name = format!("stagefs-{}", sub.get_name());
        let bin_name = format!("stagefs {}", sub.get_name());
        let sub = sub.clone().display_name(name).bin_name(bin_name);
        let man = clap_mangen::Man::new(sub);
        // Name, synopsis, description, options: no second title header.
        man.render_name_section(out)?;
        man.render_synopsis_section(out)?;
        man.render_description_section(out)?;
        man.render_options_section(out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn margin_of(args: &[&str]) -> Result<crate::stage::EventTimeMargin, String> {
        let mut argv = vec![
            "stagefs",
            "replicate",
            "--state",
            "/s",
            "--hive-events",
            "/e",
        ];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Replicate { source, .. } => Ok(source.event_time_margin),
            other => Err(format!("parsed as {other:?}")),
        }
    }

    #[test]
    fn event_time_margin_defaults_to_one_second_and_is_refused_above_five() {
        assert_eq!(margin_of(&[]).unwrap().as_millis(), 1_000);
        assert_eq!(
            margin_of(&["--event-time-margin", "2500ms"])
                .unwrap()
                .as_millis(),
            2_500
        );
        let err = margin_of(&["--event-time-margin", "6s"]).unwrap_err();
        assert!(
            err.contains("--event-time-margin") && err.contains("above the limit of 5s"),
            "{err}"
        );
        let err = margin_of(&["--event-time-margin=-1s"]).unwrap_err();
        assert!(err.contains("cannot be negative"), "{err}");
        let err = margin_of(&["--event-time-margin", "soon"]).unwrap_err();
        assert!(err.contains("is not an event-time margin"), "{err}");
        // Every command that takes --hive-metastore takes it.
        for cmd in ["mount", "replicate", "bootstrap", "check"] {
            let mut argv = vec!["stagefs", cmd];
            if cmd == "mount" {
                argv.push("/mnt");
            }
            argv.extend([
                "--state",
                "/s",
                "--hive-metastore",
                "postgresql://u@h:5432/db",
                "--event-time-margin",
                "3s",
            ]);
            assert!(Cli::try_parse_from(&argv).is_ok(), "{cmd}");
        }
    }
}
