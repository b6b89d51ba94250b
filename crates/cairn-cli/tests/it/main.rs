//! Integration tests: every test drives the real `cairn` binary.

mod bad_input;
mod cli;
mod copy;
mod corruption;
mod crash;
mod crashkit;
mod deep;
mod dense;
mod estimate;
mod forget;
mod golden;
mod hostile;
mod image;
mod jobs;
mod keys;
mod look;
mod maintenance;
mod mount;
mod placement;
mod remote;
mod restore_over;
mod restore_race;
mod roundtrip;
mod server;
mod stats;
mod util;
