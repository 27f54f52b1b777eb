//! Extended attributes (SPEC §5): which node has which `user.stagefs.*`
//! name, their values, and pins set and removed through them.
//!
//! Rules: a name a node lacks → `ENODATA`; setting or removing anything but
//! `user.stagefs.pin`, or the pin on a node other than the mount root or a
//! table directory reached through `MOUNT/<db>/<table>` → `ENOTSUP`; a bad
//! pin value → `EINVAL` (from [`PinError`]). Size probes and `ERANGE` are
//! the adapter's business: it has the buffer size, we return the bytes.
//!
//! The root's `state_id` answers the caller's view (SPEC §3.8); reading
//! `visible`, or setting or removing a pin, is a read-your-check that
//! moves the caller's view to the newest visible state.
//!
//! Sessions (`stagefs run`): `setfattr -n user.stagefs.session -v
//! STATE|visible MOUNT` makes the calling process the leader of a new
//! session at that state (`EINVAL` if not retained, `EPERM` if the caller
//! cannot be named); `getfattr -n user.stagefs.session MOUNT` answers the
//! caller's session id (`ENODATA` outside one); `setfattr -x` leaves it
//! (the leader's leaving ends it). Not listed by `listxattr`.
//!
//! Holds: `getfattr -n user.stagefs.hold MOUNT` moves the caller's view
//! to the newest visible state, holds it there for the caller and every
//! process below it until the next such read, and answers the state-id
//! (`EPERM` if the caller cannot be named, `ENODATA` with views off);
//! `setfattr -x user.stagefs.hold MOUNT` releases it (`ENODATA` if the
//! caller holds nothing). Not listed by `listxattr`.

use std::ffi::OsStr;

use super::readers::{Reader, ReadersSummary};
use super::{Caller, Resolved, Result, View, ViewError};
use crate::catalog::{Node, PinError, PinScope, SessionHold};

pub const STATE_ID: &str = "user.stagefs.state_id";
pub const VISIBLE: &str = "user.stagefs.visible";
/// Set on the root by `stagefs run --private-mount` to hand the daemon a
/// FUSE connection for its session (the adapter's, not the view's).
pub const CONNECTION: &str = "user.stagefs.connection";
pub const LATEST: &str = "user.stagefs.latest";
pub const SHA256: &str = "user.stagefs.sha256";
pub const SOURCE: &str = "user.stagefs.source";
pub const VERIFIED: &str = "user.stagefs.verified";
pub const PIN: &str = "user.stagefs.pin";
/// Set on a file (any value): fetches it whole into a reader host's cache
/// (`stagefs warm`); a no-op where content is local.
pub const WARM: &str = "user.stagefs.warm";
pub const SESSION: &str = "user.stagefs.session";
pub const HOLD: &str = "user.stagefs.hold";

impl View {
    /// `(name, value)` of every attribute `ino` has, in listing order.
    fn xattrs(&self, ino: u64, reader: Reader) -> Result<Vec<(&'static str, String)>> {
        let snap = self.catalog.snapshot();
        let resolved = self.resolve(ino)?;
        let mut out = Vec::with_capacity(4);
        match &resolved {
            Resolved::Root => {
                let shown = self.shown(reader)?;
                out.push((STATE_ID, shown.root_tree().state_id.to_string()));
                out.push((VISIBLE, snap.visible.state_id.to_string()));
                out.push((LATEST, self.status.latest().to_string()));
            }
            Resolved::StagefsDir | Resolved::StatusFile(_) | Resolved::SnapshotsDir => {
                out.push((STATE_ID, snap.visible.state_id.to_string()));
            }
            Resolved::LiveDb(db) => {
                let shown = self.shown(reader)?;
                let id = super::live_db_node(&shown, db)
                    .map_or(shown.root_tree().state_id, |d| d.meta.state_id);
                out.push((STATE_ID, id.to_string()));
            }
            Resolved::SnapshotRoot(id, _) => out.push((STATE_ID, id.to_string())),
            Resolved::Node { node, .. } => {
                out.push((STATE_ID, node.meta().state_id.to_string()));
                if let Node::File(f) = node {
                    out.push((SHA256, f.blob().to_hex()));
                    out.push((SOURCE, f.source.to_string()));
                    out.push((VERIFIED, f.verified.to_owned()));
                }
            }
        }
        if let Some(scope) = pin_scope(&resolved) {
            if let Some(pinned) = snap.pins.get(&scope) {
                out.push((PIN, pinned.to_string()));
            }
        }
        Ok(out)
    }

    /// The value of `name` on `ino`.
    pub fn getxattr(&self, ino: u64, name: &OsStr, caller: Caller) -> Result<Vec<u8>> {
        let name = name.to_str().ok_or(ViewError::NoAttr)?;
        let reader = self.reader(caller);
        if self.is_live_root(ino) && name == SESSION {
            return self.session_id(reader).map(String::into_bytes);
        }
        if self.is_live_root(ino) && name == HOLD {
            if reader == Reader::Unattributed {
                return Err(ViewError::Unattributed);
            }
            let snap = self.catalog.snapshot();
            let held = self.readers.hold(reader, &snap).ok_or(ViewError::NoAttr)?;
            return Ok(held.to_string().into_bytes());
        }
        if self.is_live_root(ino) && name == VISIBLE {
            // Read-your-check: answer and move the view from one snapshot.
            let snap = self.catalog.snapshot();
            self.readers.checked(reader, &snap);
            return Ok(snap.visible.state_id.to_string().into_bytes());
        }
        let attrs = self.xattrs(ino, reader)?;
        attrs
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.into_bytes())
            .ok_or(ViewError::NoAttr)
    }

    /// The NUL-terminated names `ino` has.
    pub fn listxattr(&self, ino: u64, caller: Caller) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for (name, _) in self.xattrs(ino, self.reader(caller))? {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    /// Only `user.stagefs.pin` on the root or a live table directory, and
    /// `user.stagefs.session` on the root.
    pub fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8], caller: Caller) -> Result<()> {
        if name == WARM {
            return match self.resolve(ino)? {
                Resolved::Node {
                    node: Node::File(f),
                    ..
                } => self.warm_file(&f.blob()).map(|_| ()),
                _ => Err(ViewError::XattrNotSupported(WARM.into())),
            };
        }
        let reader = self.reader(caller);
        if self.is_live_root(ino) && name == SESSION {
            let value = std::str::from_utf8(value).map_err(|_| PinError::BadValue)?;
            return self.open_session(reader, value);
        }
        let scope = self.pin_target(ino, name)?;
        let value = std::str::from_utf8(value).map_err(|_| PinError::BadValue)?;
        self.catalog.set_pin(&scope, value)?;
        self.readers.checked(reader, &self.catalog.snapshot());
        Ok(())
    }

    /// Only `user.stagefs.pin` can be removed (and the caller's session
    /// left); other names the node has are read-only (`ENOTSUP`), names it
    /// lacks are a miss (`ENODATA`).
    pub fn removexattr(&self, ino: u64, name: &OsStr, caller: Caller) -> Result<()> {
        let reader = self.reader(caller);
        if self.is_live_root(ino) && name == SESSION {
            return self.leave_session(reader);
        }
        if self.is_live_root(ino) && name == HOLD {
            return if self.readers.release(reader) {
                Ok(())
            } else {
                Err(ViewError::NoAttr)
            };
        }
        if name != PIN {
            return match self.getxattr(ino, name, caller) {
                Ok(_) => Err(ViewError::XattrNotSupported(
                    name.to_string_lossy().into_owned(),
                )),
                Err(e) => Err(e),
            };
        }
        let scope = self.pin_target(ino, name)?;
        if self.catalog.remove_pin(&scope)? {
            self.readers.checked(reader, &self.catalog.snapshot());
            Ok(())
        } else {
            Err(ViewError::NoAttr)
        }
    }

    /// The id of the session `reader` belongs to.
    fn session_id(&self, reader: Reader) -> Result<String> {
        let Reader::Process(proc) = reader else {
            return Err(ViewError::NoAttr);
        };
        let snap = self.catalog.snapshot();
        self.readers
            .session_of(proc, &snap, std::time::Instant::now())
            .ok_or(ViewError::NoAttr)
    }

    /// `reader` becomes the leader of a new session at `value`.
    fn open_session(&self, reader: Reader, value: &str) -> Result<()> {
        let Reader::Process(proc) = reader else {
            return Err(ViewError::Unattributed);
        };
        let id = format!("{}-{}", proc.pid, proc.start);
        let hold = SessionHold {
            state: crate::event::StateId(0),
            pid: proc.pid,
            start: proc.start,
            since_ms: crate::status::now_ms(),
        };
        let state = self.catalog.open_session(&id, value, hold)?;
        self.readers.joined(proc, &id);
        tracing::info!(session = %id, %state, pid = proc.pid, "session opened");
        Ok(())
    }

    /// `reader` leaves its session; a leader ends it.
    fn leave_session(&self, reader: Reader) -> Result<()> {
        let id = self.session_id(reader)?;
        let Reader::Process(proc) = reader else {
            return Err(ViewError::NoAttr);
        };
        let snap = self.catalog.snapshot();
        let leads = snap
            .pins
            .sessions
            .get(&id)
            .is_some_and(|h| h.pid == proc.pid && h.start == proc.start);
        if leads {
            self.catalog.close_session(&id)?;
            tracing::info!(session = %id, "session ended by its leader");
        }
        self.readers.left(proc);
        Ok(())
    }

    /// Periodic upkeep of readers (from the adapter's invalidation
    /// thread): ends sessions whose leader exited (a `stagefs run` killed
    /// with -9 included), forgets idle views.
    pub fn maintain_readers(&self) {
        let snap = self.catalog.snapshot();
        for id in self.readers.maintain(&snap) {
            match self.catalog.close_session(&id) {
                Ok(_) => tracing::info!(session = %id, "session ended: its leader exited"),
                Err(e) => tracing::warn!(session = %id, error = %e, "ending a session failed"),
            }
        }
    }

    /// Readers in use (status, tests).
    pub fn readers_summary(&self) -> ReadersSummary {
        self.readers.summary()
    }

    /// The pin scope `name` on `ino` would change, or why it cannot.
    fn pin_target(&self, ino: u64, name: &OsStr) -> Result<PinScope> {
        let resolved = self.resolve(ino)?;
        let shown = name.to_string_lossy();
        if name != PIN {
            return Err(ViewError::XattrNotSupported(shown.into_owned()));
        }
        pin_scope(&resolved).ok_or(ViewError::XattrNotSupported(shown.into_owned()))
    }
}

/// What a pin on this node would pin: the root, or a table reached through
/// its live path.
fn pin_scope(resolved: &Resolved) -> Option<PinScope> {
    match resolved {
        Resolved::Root => Some(PinScope::Root),
        Resolved::Node {
            live_table: Some((db, table)),
            node: Node::Dir(_),
            ..
        } => Some(PinScope::Table {
            db: db.to_string(),
            table: table.to_string(),
        }),
        Resolved::Node { .. }
        | Resolved::StagefsDir
        | Resolved::StatusFile(_)
        | Resolved::SnapshotsDir
        | Resolved::LiveDb(_)
        | Resolved::SnapshotRoot(..) => None,
    }
}
