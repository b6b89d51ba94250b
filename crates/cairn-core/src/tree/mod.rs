//! Directory trees and chunk lists as stored in a repository: reading them, walking
//! them, and finding every blob snapshots reach.

pub mod chunklist;
pub mod fixed;
pub mod reachable;
pub mod walk;
