//! Publishing states to shared storage, for reader hosts (SPEC §8 "Many
//! hosts"): the object layout at a URL ([`layout`]), the codecs of its
//! objects ([`record`]: head and states, signed with ed25519;
//! [`catalog_object`]: one directory of a state; [`pieces`]: a large
//! file's piece list), the signing keys ([`keys`]), opening the storage
//! from its URL ([`store`]), loading a published state into a catalog
//! tree ([`load`]), the publisher thread ([`publisher`]), leases at the
//! URL ([`lease`]) and retention and garbage collection there ([`gc`]).
//!
//! Storage is not trusted: every decoder checks sizes, versions and
//! names, every immutable object is verified by its content id before it
//! is decoded, and a hostile object is an error with a reason, never a
//! panic. The daemon starts the publisher (`--publish URL`); a reader
//! host loads through [`load`].

pub mod catalog_object;
pub mod gc;
pub mod keys;
pub mod layout;
pub mod lease;
pub mod load;
pub mod pieces;
pub mod publisher;
pub mod record;
pub mod store;

pub use load::read_head;
pub use object_store::ObjectStore;
pub use publisher::{PublishConfig, PublishError, PublishProbe, PublishReport, Publisher};
pub use store::open_store;
#[cfg(test)]
mod tests;
