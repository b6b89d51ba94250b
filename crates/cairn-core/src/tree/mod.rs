//! Directory trees and chunk lists as stored in a repository: reading them, walking
//! them, and finding every blob snapshots reach.

pub mod chunklist;
pub mod fixed;
pub mod reachable;
pub mod walk;

/// The first of 256 private-use code points (plane 16) that stand, in a path
/// given as text, for the bytes of a name that are not UTF-8: byte `b` is
/// `RAW_BYTE + b`. The CLI turns such an argument into this form
/// ([`escape_name`]), so that a name is matched by its exact bytes.
pub(crate) const RAW_BYTE: u32 = 0x10_FF00;

/// `name` as text without losing a byte: UTF-8 as it is, each other byte as its
/// private-use stand-in (see [`RAW_BYTE`]).
pub fn escape_name(name: &[u8]) -> String {
    let mut s = String::with_capacity(name.len());
    for chunk in name.utf8_chunks() {
        s.push_str(chunk.valid());
        for &b in chunk.invalid() {
            s.push(char::from_u32(RAW_BYTE + u32::from(b)).unwrap_or('\u{FFFD}'));
        }
    }
    s
}

/// The byte a character stands for, if it is one of [`escape_name`]'s stand-ins:
/// for showing it as `\xff` where text is shown.
pub fn raw_byte(c: char) -> Option<u8> {
    u32::from(c)
        .checked_sub(RAW_BYTE)
        .and_then(|b| u8::try_from(b).ok())
}
