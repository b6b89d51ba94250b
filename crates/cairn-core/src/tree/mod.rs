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
/// private-use stand-in (see [`RAW_BYTE`]). A character that is itself one of the
/// stand-ins (valid UTF-8 in a name, if odd) is written as the stand-ins of its
/// bytes, so that no two names read the same: a name holding U+10FFFF is not
/// taken for one holding the byte 0xff.
pub fn escape_name(name: &[u8]) -> String {
    let mut s = String::with_capacity(name.len());
    let raw = |s: &mut String, b: u8| {
        s.push(char::from_u32(RAW_BYTE + u32::from(b)).unwrap_or('\u{FFFD}'));
    };
    for chunk in name.utf8_chunks() {
        let valid = chunk.valid();
        // Every stand-in's UTF-8 begins with 0xf4: a byte search first, so that
        // the usual name costs no character walk.
        if valid.as_bytes().contains(&0xf4) && valid.chars().any(is_stand_in) {
            for c in valid.chars() {
                if is_stand_in(c) {
                    for &b in c.encode_utf8(&mut [0; 4]).as_bytes() {
                        raw(&mut s, b);
                    }
                } else {
                    s.push(c);
                }
            }
        } else {
            s.push_str(valid);
        }
        for &b in chunk.invalid() {
            raw(&mut s, b);
        }
    }
    s
}

/// A path given as an argument (or in a list file) in the form listings use:
/// its bytes that are not UTF-8 as stand-ins, and a stand-in character in it
/// taken for the byte it stands for, so that a path `--json` printed names the
/// same entry when given back. (A name that holds such a character itself is
/// found by the lookups of `ls` and `dump`, which try it as written too.)
pub fn escape_arg(arg: &[u8]) -> String {
    let mut s = String::with_capacity(arg.len());
    for chunk in arg.utf8_chunks() {
        s.push_str(chunk.valid());
        for &b in chunk.invalid() {
            s.push(char::from_u32(RAW_BYTE + u32::from(b)).unwrap_or('\u{FFFD}'));
        }
    }
    s
}

/// Whether `c` is one of [`escape_name`]'s stand-ins.
pub(crate) fn is_stand_in(c: char) -> bool {
    (RAW_BYTE..=RAW_BYTE + 0xFF).contains(&u32::from(c))
}

/// The byte a character stands for, if it is one of [`escape_name`]'s stand-ins:
/// for showing it as `\xff` where text is shown.
pub fn raw_byte(c: char) -> Option<u8> {
    u32::from(c)
        .checked_sub(RAW_BYTE)
        .and_then(|b| u8::try_from(b).ok())
}
