//! The operations: each takes options and returns a typed report.

pub mod backup;
pub mod blobs;
pub mod check;
pub mod copy;
pub mod diff;
pub mod dump;
pub mod export;
pub mod find;
pub mod forget;
pub mod image;
pub mod ls;
pub mod prune;
pub mod repair;
pub mod restore;
pub mod rewrite;
mod scan;
pub mod stats;
pub mod tag;
