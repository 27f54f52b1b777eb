//! Where each object of a publication lives at its URL (DESIGN "Many
//! hosts"), in the order the publisher writes them:
//!
//! ```text
//! blobs/<sha256>      file content, or one piece of a large file
//! pieces/<sha256>     the piece list of a large file (pieces::PieceList)
//! catalogs/<sha256>   one directory of a state's tree (catalog_object)
//! states/<state-id>   one published state: its root catalog (record)
//! HEAD                the newest published state (record), replaced
//!                     only by a conditional write
//! leases/<id>         a lease on one state (lease::Lease), written by
//!                     any host, overwritten to renew, deleted to release
//! condemned/<state>   written by garbage collection before it deletes
//!                     states/<state>; removed once the state's objects
//!                     are swept (gc)
//! ```
//!
//! Everything but HEAD and leases is immutable and named by its content
//! (or, for states and condemnation marks, by an id whose content never
//! changes once written), so a reader verifies an object by its name
//! alone. Only the publisher deletes, and only what `gc` allows.

use object_store::path::Path;

use crate::event::{BlobId, StateId};

/// The head object: names the newest published state.
pub const HEAD: &str = "HEAD";

/// Files larger than this are published as pieces of this size (the last
/// one shorter), each its own blob, so a reader verifies and serves the
/// first bytes of a large file without fetching all of it.
pub const PIECE_SIZE: u64 = 8 << 20;

pub fn head() -> Path {
    Path::from(HEAD)
}

pub fn blob(id: &BlobId) -> Path {
    Path::from(format!("blobs/{}", id.to_hex()))
}

pub fn pieces(id: &BlobId) -> Path {
    Path::from(format!("pieces/{}", id.to_hex()))
}

pub fn catalog(id: &BlobId) -> Path {
    Path::from(format!("catalogs/{}", id.to_hex()))
}

/// Where leases live.
pub const LEASES: &str = "leases/";
/// Where condemnation marks live.
pub const CONDEMNED: &str = "condemned/";

pub fn lease(id: &super::lease::LeaseId) -> Path {
    Path::from(format!("{LEASES}{id}"))
}

/// Zero-padded like states.
pub fn condemned(id: StateId) -> Path {
    Path::from(format!("{CONDEMNED}{:020}", id.0))
}

/// The state a `states/<id>` or `condemned/<id>` name gives (its last
/// part: 20 decimal digits).
pub fn state_of(path: &Path) -> Option<StateId> {
    let name = path.filename()?;
    (name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit()))
        .then(|| name.parse().ok().map(StateId))
        .flatten()
}

/// Zero-padded so that names sort by id.
pub fn state(id: StateId) -> Path {
    Path::from(format!("states/{:020}", id.0))
}

/// The sha256 of `bytes`: every immutable object's name.
pub fn content_id(bytes: &[u8]) -> BlobId {
    use sha2::{Digest, Sha256};
    BlobId(Sha256::digest(bytes).into())
}
