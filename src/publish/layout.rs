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
//! ```
//!
//! Everything but HEAD is immutable and named by its content (or, for
//! states, by an id whose content never changes once written), so a reader
//! verifies an object by its name alone.

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

/// Zero-padded so that names sort by id.
pub fn state(id: StateId) -> Path {
    Path::from(format!("states/{:020}", id.0))
}

/// The sha256 of `bytes`: every immutable object's name.
pub fn content_id(bytes: &[u8]) -> BlobId {
    use sha2::{Digest, Sha256};
    BlobId(Sha256::digest(bytes).into())
}
