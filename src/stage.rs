//! stage
