//! `stagefs lease MOUNT [--at STATE|visible] [--ttl DURATION]`, `--renew
//! ID` and `--release ID` (SPEC §8): a lease at the URL the mount
//! publishes to or follows, for a job a scheduler starts (Airflow, cron)
//! that `stagefs run` cannot wrap.
//!
//! The command reads the URL from the mount's status and writes the lease
//! itself, with the storage credentials of its own environment (the same
//! a reader host uses); no daemon keeps it alive: it lasts `--ttl` unless
//! renewed. It prints two lines a shell can eval:
//!
//! ```text
//! STAGEFS_STATE_ID=1234
//! STAGEFS_LEASE=<32 hex digits>
//! ```
//!
//! Called by the binary's `lease` subcommand only.

use std::path::Path;
use std::time::Duration;

use crate::daemon::DaemonError;
use crate::event::StateId;
use crate::publish::lease::{self, LeaseError, LeaseId};

/// Runs the subcommand; prints the lease on stdout.
pub fn lease(
    mount: &Path,
    at: &str,
    ttl: Duration,
    release: Option<String>,
    renew: Option<String>,
) -> Result<(), DaemonError> {
    let status = mount_status(mount)?;
    let url = status["from"]
        .as_str()
        .or_else(|| status["publish"]["url"].as_str())
        .ok_or_else(|| {
            DaemonError::Usage(format!(
                "{} neither publishes nor follows a URL: leases are for mounts with --publish or --from \
                 (use `stagefs run` on a single host)",
                mount.display()
            ))
        })?
        .to_owned();
    let store = crate::publish::open_store(&url).map_err(|e| DaemonError::Usage(e.to_string()))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| DaemonError::Io(format!("cannot start a runtime: {e}")))?;
    let parse_id = |s: &str| {
        LeaseId::parse(s).ok_or_else(|| {
            DaemonError::Usage(format!(
                "{s:?} is not a lease id (32 hex digits, as printed by `stagefs lease`)"
            ))
        })
    };
    let failed = |e: LeaseError| match e {
        LeaseError::NotRetained(_) | LeaseError::Gone(_) | LeaseError::Expired(_) => {
            DaemonError::Usage(format!("{url}: {e}"))
        }
        e => DaemonError::Io(format!("{url}: {e}")),
    };
    if let Some(id) = release {
        let id = parse_id(&id)?;
        return rt.block_on(lease::release(&*store, id)).map_err(failed);
    }
    if let Some(id) = renew {
        let id = parse_id(&id)?;
        let l = rt
            .block_on(lease::renew(&*store, id, ttl))
            .map_err(failed)?;
        print_lease(l.state, id);
        return Ok(());
    }
    let state = if at == "visible" {
        visible_at_url(&status, &store, &rt)?
    } else {
        match crate::publish::record::parse_u64(at) {
            Some(n) => StateId(n),
            None => {
                return Err(DaemonError::Usage(format!(
                    "lease: --at takes a decimal state-id or `visible`, not {at:?}"
                )))
            }
        }
    };
    let id = rt
        .block_on(lease::acquire(
            &*store,
            state,
            ttl,
            &lease::holder("stagefs lease"),
        ))
        .map_err(failed)?;
    print_lease(state, id);
    Ok(())
}

fn print_lease(state: StateId, id: LeaseId) {
    println!("STAGEFS_STATE_ID={}\nSTAGEFS_LEASE={id}", state.0);
}

/// The mount's status JSON.
fn mount_status(mount: &Path) -> Result<serde_json::Value, DaemonError> {
    let path = mount.join(".stagefs").join("status");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        DaemonError::Usage(format!(
            "{} is not a running stagefs mount ({e})",
            mount.display()
        ))
    })?;
    serde_json::from_str(&text)
        .map_err(|e| DaemonError::Io(format!("{}: not a status ({e})", path.display())))
}

/// `visible`: on a reader host its visible state (published by
/// construction); on a publisher the newest published state (HEAD), since
/// its visible state may not be published yet, or ever.
fn visible_at_url(
    status: &serde_json::Value,
    store: &std::sync::Arc<dyn object_store::ObjectStore>,
    rt: &tokio::runtime::Runtime,
) -> Result<StateId, DaemonError> {
    if status["from"].is_string() {
        return status["visible"]
            .as_u64()
            .map(StateId)
            .ok_or_else(|| DaemonError::Io("the status has no visible state".into()));
    }
    let head = rt.block_on(crate::publish::load::get_record(
        &**store,
        &crate::publish::layout::head(),
        crate::publish::record::RecordKind::Head,
        None,
    ));
    match head {
        Ok(d) => Ok(d.published.state_id),
        Err(crate::publish::load::LoadError::Missing { .. }) => Err(DaemonError::Usage(
            "nothing is published at the URL yet".into(),
        )),
        Err(e) => Err(DaemonError::Io(e.to_string())),
    }
}
