//! Extended attributes (SPEC §5): which node has which `user.stagefs.*`
//! name, their values, and pins set and removed through them.
//!
//! Rules: a name a node lacks → `ENODATA`; setting or removing anything but
//! `user.stagefs.pin`, or the pin on a node other than the mount root or a
//! table directory reached through `MOUNT/<db>/<table>` → `ENOTSUP`; a bad
//! pin value → `EINVAL` (from [`PinError`]). Size probes and `ERANGE` are
//! the adapter's business: it has the buffer size, we return the bytes.

use std::ffi::OsStr;

use super::{Resolved, Result, View, ViewError};
use crate::catalog::{Node, PinError, PinScope};

pub const STATE_ID: &str = "user.stagefs.state_id";
pub const VISIBLE: &str = "user.stagefs.visible";
pub const LATEST: &str = "user.stagefs.latest";
pub const SHA256: &str = "user.stagefs.sha256";
pub const SOURCE: &str = "user.stagefs.source";
pub const VERIFIED: &str = "user.stagefs.verified";
pub const PIN: &str = "user.stagefs.pin";

impl View {
    /// `(name, value)` of every attribute `ino` has, in listing order.
    fn xattrs(&self, ino: u64) -> Result<Vec<(&'static str, String)>> {
        let snap = self.catalog.snapshot();
        let resolved = self.resolve(ino)?;
        let mut out = Vec::with_capacity(4);
        match &resolved {
            Resolved::Root => {
                out.push((STATE_ID, snap.root_tree().state_id.to_string()));
                out.push((VISIBLE, snap.visible.state_id.to_string()));
                out.push((LATEST, self.status.latest().to_string()));
            }
            Resolved::StagefsDir | Resolved::StatusFile(_) | Resolved::SnapshotsDir => {
                out.push((STATE_ID, snap.visible.state_id.to_string()));
            }
            Resolved::LiveDb(db) => {
                let id = super::live_db_node(&snap, db)
                    .map_or(snap.root_tree().state_id, |d| d.meta.state_id);
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
    pub fn getxattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>> {
        let attrs = self.xattrs(ino)?;
        let name = name.to_str().ok_or(ViewError::NoAttr)?;
        attrs
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.into_bytes())
            .ok_or(ViewError::NoAttr)
    }

    /// The NUL-terminated names `ino` has.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for (name, _) in self.xattrs(ino)? {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    /// Only `user.stagefs.pin` on the root or a live table directory.
    pub fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8]) -> Result<()> {
        let scope = self.pin_target(ino, name)?;
        let value = std::str::from_utf8(value).map_err(|_| PinError::BadValue)?;
        self.catalog.set_pin(&scope, value)?;
        Ok(())
    }

    /// Only `user.stagefs.pin` can be removed; other names the node has
    /// are read-only (`ENOTSUP`), names it lacks are a miss (`ENODATA`).
    pub fn removexattr(&self, ino: u64, name: &OsStr) -> Result<()> {
        if name != PIN {
            return match self.getxattr(ino, name) {
                Ok(_) => Err(ViewError::XattrNotSupported(
                    name.to_string_lossy().into_owned(),
                )),
                Err(e) => Err(e),
            };
        }
        let scope = self.pin_target(ino, name)?;
        if self.catalog.remove_pin(&scope)? {
            Ok(())
        } else {
            Err(ViewError::NoAttr)
        }
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
