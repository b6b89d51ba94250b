//! cairn-plan: tools for planning a datastore, not part of the engine.
//!
//! - [`estimate`]: what each block size would make of some data (dedup,
//!   compression, index size and RAM) before a datastore exists.
//! - [`machine`]: this machine's speed for each stage of the pipeline and of both
//!   index placements (`cairn bench`).

pub mod estimate;
pub mod machine;
pub mod scale;
