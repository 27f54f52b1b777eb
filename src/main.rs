//! The `stagefs` command: argument parsing and wiring only; everything it
//! runs lives in the library.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use stagefs::cli::{Cli, Command, FollowFlags, PublishFlags, SourceArgs};
use stagefs::daemon::{self, HiveArgs, MountArgs, PublishArgs, ReplicateArgs};
use stagefs::source::hive::HiveRows;

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let command = Cli::command();
    let subcommands: Vec<&str> = command.get_subcommands().map(|s| s.get_name()).collect();
    if stagefs::mount_helper::invoked_as_helper(&argv, &subcommands) {
        return mount_helper(&command, &argv[1..]);
    }
    // The --config file's options go in ahead of the flags (which win).
    let argv = match stagefs::config::apply(&command, argv) {
        Ok(argv) => argv,
        Err(e) => {
            eprintln!("stagefs: {e}");
            return ExitCode::from(2);
        }
    };
    let cli = match Cli::command()
        .try_get_matches_from(argv)
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    daemon::init_logging(cli.log_format);
    let result = match cli.command {
        Command::Mount {
            mountpoint,
            source,
            allow_other,
            metrics,
            publish,
            follow,
        } => match (source, follow) {
            (
                None,
                FollowFlags {
                    from: Some(url),
                    cache: Some(cache),
                    cache_size,
                    trusted_key,
                    poll_ms,
                    lease_ttl,
                },
            ) if publish.publish.is_none() => daemon::mount_from(daemon::FollowArgs {
                mountpoint,
                url,
                cache,
                cache_size,
                trusted_key,
                poll_ms,
                allow_other,
                lease_ttl,
                metrics,
            }),
            (Some(source), FollowFlags { from: None, .. }) => daemon::mount(MountArgs {
                mountpoint,
                replicate: ReplicateArgs {
                    publish: publish_args(publish),
                    ..replicate_args(source)
                },
                allow_other,
                metrics,
            }),
            _ => Err(daemon::DaemonError::Usage(
                "mount needs either a source (--state DIR and its flags) or --from URL --cache DIR \
                 (--publish only with a source)"
                    .into(),
            )),
        },
        Command::Status {
            mountpoint,
            state,
            watch,
        } => daemon::status(mountpoint, state, watch),
        Command::Run {
            mountpoint,
            at,
            private_mount,
            command,
        } => Err(stagefs::run::run(&mountpoint, &at, private_mount, &command)),
        Command::Warm { mountpoint, paths } => {
            stagefs::follow::warm::warm(&mountpoint, &paths).map(|_| ())
        }
        Command::Demo { mountpoint, hive } => stagefs::demo::run(mountpoint, hive),
        Command::Replicate {
            source,
            publish,
            metrics,
        } => daemon::replicate_with_metrics(
            ReplicateArgs {
                publish: publish_args(publish),
                ..replicate_args(source)
            },
            metrics,
        ),
        Command::Keygen { file } => daemon::keygen(&file),
        Command::Lease {
            mountpoint,
            at,
            ttl,
            release,
            renew,
        } => stagefs::lease_cmd::lease(&mountpoint, &at, ttl, release, renew),
        Command::Bootstrap { source } => daemon::bootstrap(replicate_args(source)),
        Command::Check {
            mountpoint,
            source,
            follow,
            allow_other,
            metrics,
            publish,
        } => {
            let serves = match (source, follow) {
                (
                    None,
                    FollowFlags {
                        from: Some(url),
                        cache: Some(cache),
                        cache_size,
                        trusted_key,
                        ..
                    },
                ) if publish.publish.is_none() => {
                    stagefs::check::Serves::Published(stagefs::check::FollowCheck {
                        url,
                        cache,
                        cache_size,
                        trusted_key,
                    })
                }
                (Some(source), FollowFlags { from: None, .. }) => {
                    stagefs::check::Serves::Source(Box::new(ReplicateArgs {
                        publish: publish_args(publish),
                        ..replicate_args(source)
                    }))
                }
                _ => {
                    eprintln!(
                        "stagefs check: give a source (--state DIR and its flags) or --from URL \
                         --cache DIR, as for mount (--publish only with a source)"
                    );
                    return ExitCode::from(2);
                }
            };
            let args = stagefs::check::CheckArgs {
                mountpoint,
                allow_other,
                metrics,
                serves,
            };
            let findings = stagefs::check::run(&args, &mut std::io::stdout());
            return if findings.iter().all(|f| f.passed()) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
        Command::Completions { shell } => {
            stagefs::cli::write_completions(shell, &mut std::io::stdout())
                .map_err(|e| daemon::DaemonError::Io(format!("writing the completions: {e}")))
        }
        Command::Manpage => stagefs::cli::write_manpage(&mut std::io::stdout())
            .map_err(|e| daemon::DaemonError::Io(format!("writing the man page: {e}"))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stagefs: {e}");
            if e.is_usage() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// `stagefs SOURCE MOUNTPOINT -o OPTIONS` from mount(8) or fuse3's
/// `mount.fuse`: starts `stagefs mount` detached and returns once mounted.
fn mount_helper(command: &clap::Command, args: &[std::ffi::OsString]) -> ExitCode {
    use stagefs::mount_helper;
    let mount = command.find_subcommand("mount");
    let is_flag = |key: &str| {
        key != "help"
            && key != "version"
            && mount
                .into_iter()
                .flat_map(|m| m.get_arguments())
                .chain(command.get_arguments())
                .any(|a| a.get_long() == Some(key))
    };
    let call = match mount_helper::parse(args, &is_flag) {
        Ok(call) => call,
        Err(e) => {
            eprintln!("stagefs: {e}");
            return ExitCode::from(2);
        }
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("stagefs: mount helper: finding this program: {e}");
            return ExitCode::FAILURE;
        }
    };
    match mount_helper::run(&exe, &call) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, e)) => {
            eprintln!("stagefs: {e}");
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
    }
}

fn replicate_args(s: SourceArgs) -> ReplicateArgs {
    // A password file joins the URL as the `?password_file=` it reads.
    let hive_metastore = match (s.hive_metastore, &s.metastore_password_file) {
        (Some(url), Some(file)) => Some(stagefs::config::with_password_file(&url, file)),
        (url, _) => url,
    };
    let hive_rows = match (hive_metastore, s.hive_events) {
        (Some(url), _) => Some(HiveRows::Metastore(url)),
        (None, Some(path)) => Some(HiveRows::Files(path)),
        (None, None) => None,
    };
    ReplicateArgs {
        state: s.state,
        source_root: s.source_root,
        events: s.events,
        cm_root: s.cm_root,
        retain: s.retain as usize,
        fetch_timeout: std::time::Duration::from_secs(s.fetch_timeout),
        s3_endpoint: s.s3_endpoint,
        hive: HiveArgs {
            rows: hive_rows,
            source_map: s.source_map,
            poll_ms: s.hive_poll_ms,
            event_time_margin: s.event_time_margin,
            bootstrap: s.bootstrap,
            catalog: s.catalog,
        },
        checkpoint_events: s.checkpoint_events,
        checkpoint_seconds: s.checkpoint_interval,
        checkpoint_rate_mib: s.checkpoint_rate,
        publish: None,
    }
}

fn publish_args(p: PublishFlags) -> Option<PublishArgs> {
    p.publish.map(|url| PublishArgs {
        url,
        signing_key: p.signing_key,
        gc_grace: p.gc_grace,
    })
}

/// mimalloc: the pipeline allocates in one thread and frees in another
/// (ingest builds trees, the stager drops them); glibc's arenas serialise
/// that on a lock and spent ~35% of ingest's time in malloc.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
