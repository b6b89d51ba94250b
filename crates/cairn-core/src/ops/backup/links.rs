//! Hard links: a file with several names is read once per backup.
//!
//! Every name of a hard-linked file is the same inode, so the content read under
//! one name is the content of the others as long as the inode's size, mtime and
//! ctime are still those the first name was seen with (any write moves the
//! ctime). An rsnapshot-style tree holding 30 days of hard-linked copies was read
//! 30 times: the chunks deduplicated, but every byte was read and hashed again.
//!
//! The walker decides ([`Seen`]): the first name of an inode is read and marked
//! `linkable`; a later name of the unchanged inode is sent as
//! [`super::Item::Linked`], unread, once whoever read the first name (the walker
//! for a large file, a worker for a small one) said in [`Reads`] that it read
//! that very inode whole. A later name is read itself while the first is still
//! being read, and when the first could not be read whole: failed, changed while
//! read, or another file by the time it was opened (replaced, renamed or removed
//! since the walk saw it; QA: the other names were then left out). The archiver
//! takes items in the walker's order, so the first name is finished before a
//! later one arrives: [`Finished`] gives it the first name's content, xattrs and
//! flags. All three keep an inode until its last name was seen, at most
//! [`MAX_INODES`] at once (past that, names are read as any file is).

use cairn_format::tree::{Content, Node, NodeKind, Timestamp};
use std::collections::HashMap;
use std::sync::Mutex;

/// Most hard-linked inodes remembered at once: each costs the walker ~80 bytes
/// and the archiver its content's description (~150 bytes for a large file).
pub(crate) const MAX_INODES: usize = 250_000;

/// A file's device and inode number.
pub(crate) type Inode = (u64, u64);

/// The walker's side: the first name seen of each hard-linked inode.
#[derive(Default)]
pub(crate) struct Seen {
    first: HashMap<Inode, FirstName>,
}

struct FirstName {
    size: u64,
    mtime: Timestamp,
    ctime: Timestamp,
    /// Names not yet seen: the inode is forgotten when none is left.
    left: u64,
}

/// What the walker does with a regular file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Read it; `linkable`: its other names will take what is read.
    Read { linkable: bool },
    /// Another name of an inode read before and unchanged since; `last`: no
    /// other name of it is to come.
    Linked { last: bool },
}

impl Seen {
    /// `node` (a later name, decided [`Decision::Linked`] but not linked: its
    /// first name was not read whole) becomes the name later ones take from.
    pub(crate) fn restart(&mut self, node: &Node) {
        if let Some(f) = self.first.get_mut(&(node.dev, node.inode)) {
            (f.size, f.mtime, f.ctime) = (node.size, node.mtime, node.ctime);
        }
    }

    pub(crate) fn decide(&mut self, node: &Node) -> Decision {
        if node.kind != NodeKind::File || node.nlink < 2 {
            return Decision::Read { linkable: false };
        }
        let key = (node.dev, node.inode);
        let now = FirstName {
            size: node.size,
            mtime: node.mtime,
            ctime: node.ctime,
            left: node.nlink - 1,
        };
        if let Some(f) = self.first.get_mut(&key) {
            if (f.size, f.mtime, f.ctime) == (now.size, now.mtime, now.ctime) {
                f.left = f.left.saturating_sub(1);
                let last = f.left == 0;
                if last {
                    self.first.remove(&key);
                }
                return Decision::Linked { last };
            }
            // Written since its first name was read: read again, and the later
            // names take this read.
            *f = now;
            return Decision::Read { linkable: true };
        }
        if self.first.len() >= MAX_INODES {
            return Decision::Read { linkable: false };
        }
        self.first.insert(key, now);
        Decision::Read { linkable: true }
    }
}

/// How the read of each linkable name went, told by the thread that read it.
#[derive(Default)]
pub(crate) struct Reads(Mutex<HashMap<Inode, (Stamp, Read)>>);

/// A file's size, mtime and ctime as the walker saw them when it sent a name to
/// be read. A read says how it went under the stamp it was sent with, so that the
/// late word of a worker still reading an earlier name of the inode (written
/// since, and sent again under a later name) is not taken for the later read's:
/// it would link the names after it to a read that then fails, and leave them out.
pub(crate) type Stamp = (u64, Timestamp, Timestamp);

pub(crate) fn stamp(node: &Node) -> Stamp {
    (node.size, node.mtime, node.ctime)
}

/// The state of a linkable name's read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Read {
    Pending,
    /// That very inode, read whole, unchanged while read.
    Whole,
    /// Not read, not whole, or another file by the time it was opened.
    Failed,
}

impl Reads {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Inode, (Stamp, Read)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The walker has sent the linkable name of `key`, seen as `stamp`, to be read.
    pub(crate) fn start(&self, key: Inode, stamp: Stamp) {
        self.map().insert(key, (stamp, Read::Pending));
    }

    /// The reader of the linkable name of `key` sent as `stamp` is done: `whole`,
    /// it read that inode whole. Not remembered when the walker forgot the inode
    /// already, or has sent another name of it since (another stamp).
    pub(crate) fn done(&self, key: Inode, stamp: Stamp, whole: bool) {
        if let Some((s, r)) = self.map().get_mut(&key)
            && *s == stamp
        {
            *r = if whole { Read::Whole } else { Read::Failed };
        }
    }

    pub(crate) fn get(&self, key: Inode) -> Option<Read> {
        self.map().get(&key).map(|(_, r)| *r)
    }

    pub(crate) fn forget(&self, key: Inode) {
        self.map().remove(&key);
    }
}

/// The archiver's side: what each linkable file was read as.
#[derive(Default)]
pub(crate) struct Finished {
    read: HashMap<Inode, Outcome>,
}

/// What a linkable file was read as.
#[derive(Clone)]
pub(crate) struct Outcome {
    pub content: Content,
    /// The bytes read (what its stat said, unless it grew or shrank since).
    pub size: u64,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    pub flags: u32,
}

impl Finished {
    /// Records what the linkable file of inode `link` (as the walker saw it)
    /// was read as: `node` when read whole, nothing when it was not (`None`) or
    /// was another file by the time it was opened. The walker links later names
    /// only to a whole read of that inode ([`Reads`]), so recording nothing only
    /// drops a stale record.
    pub(crate) fn record(&mut self, link: Inode, node: Option<&Node>) {
        self.read.remove(&link);
        if let Some(n) = node
            && (n.dev, n.inode) == link
        {
            self.read.insert(
                link,
                Outcome {
                    content: n.content.clone(),
                    size: n.size,
                    xattrs: n.xattrs.clone(),
                    flags: n.flags,
                },
            );
        }
    }

    /// Forgets the inode `key`: its last name was read itself.
    pub(crate) fn forget(&mut self, key: Inode) {
        self.read.remove(&key);
    }

    /// What the first name of the inode of `node` was read as; `last`: the
    /// inode is forgotten.
    pub(crate) fn take(&mut self, node: &Node, last: bool) -> Option<Outcome> {
        let key = (node.dev, node.inode);
        if last {
            self.read.remove(&key)
        } else {
            self.read.get(&key).cloned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::BlobId;

    fn file(ino: u64, nlink: u64, size: u64, ctime: i64) -> Node {
        Node {
            name: b"f".to_vec(),
            kind: NodeKind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            user: String::new(),
            group: String::new(),
            mtime: Timestamp::default(),
            atime: Timestamp::default(),
            ctime: Timestamp {
                secs: ctime,
                nanos: 0,
            },
            inode: ino,
            dev: 1,
            nlink,
            size,
            rdev: 0,
            link_target: Vec::new(),
            xattrs: Vec::new(),
            content: Content::Tree {
                root: BlobId([ino as u8; 32]),
                depth: 1,
                chunks: 3,
            },
            subtree: None,
            flags: 0,
        }
    }

    #[test]
    fn later_names_are_linked_only_while_the_inode_is_unchanged() {
        let mut seen = Seen::default();
        let read = Decision::Read { linkable: true };
        assert_eq!(seen.decide(&file(7, 4, 100, 5)), read);
        assert_eq!(
            seen.decide(&file(7, 4, 100, 5)),
            Decision::Linked { last: false }
        );
        // Written since (another ctime or size): read again, and taken from then on.
        assert_eq!(seen.decide(&file(7, 4, 100, 6)), read);
        assert_eq!(seen.decide(&file(7, 4, 101, 6)), read);
        assert_eq!(
            seen.decide(&file(7, 4, 101, 6)),
            Decision::Linked { last: false }
        );
        // A file with one name, or not a file: read, nothing remembered.
        let alone = Decision::Read { linkable: false };
        assert_eq!(seen.decide(&file(8, 1, 100, 5)), alone);
        let mut dir = file(9, 3, 0, 0);
        dir.kind = NodeKind::Dir;
        assert_eq!(seen.decide(&dir), alone);
        // Three names: the third is the last, and the inode is forgotten.
        assert_eq!(seen.decide(&file(10, 3, 1, 1)), read);
        assert_eq!(
            seen.decide(&file(10, 3, 1, 1)),
            Decision::Linked { last: false }
        );
        assert_eq!(
            seen.decide(&file(10, 3, 1, 1)),
            Decision::Linked { last: true }
        );
        assert!(!seen.first.contains_key(&(1, 10)));
    }

    #[test]
    fn reads_are_told_only_while_the_walker_waits_for_them() {
        let reads = Reads::default();
        let key = (1, 5);
        let (one, two) = (stamp(&file(5, 3, 10, 1)), stamp(&file(5, 3, 10, 2)));
        assert_eq!(reads.get(key), None);
        reads.start(key, one);
        assert_eq!(reads.get(key), Some(Read::Pending));
        reads.done(key, one, true);
        assert_eq!(reads.get(key), Some(Read::Whole));
        reads.start(key, one);
        reads.done(key, one, false);
        assert_eq!(reads.get(key), Some(Read::Failed));
        // Written since, and sent again under another name: the first read's
        // late word is not the second's.
        reads.start(key, one);
        reads.start(key, two);
        reads.done(key, one, true);
        assert_eq!(reads.get(key), Some(Read::Pending));
        reads.done(key, two, false);
        assert_eq!(reads.get(key), Some(Read::Failed));
        reads.forget(key);
        reads.done(key, two, true);
        assert_eq!(reads.get(key), None);
        // A restarted first name takes the later name's times.
        let mut seen = Seen::default();
        assert_eq!(
            seen.decide(&file(5, 3, 10, 1)),
            Decision::Read { linkable: true }
        );
        seen.restart(&file(5, 3, 10, 1));
        assert_eq!(
            seen.decide(&file(5, 3, 10, 1)),
            Decision::Linked { last: false }
        );
    }

    #[test]
    fn past_the_cap_names_are_read() {
        let mut seen = Seen::default();
        for ino in 0..MAX_INODES as u64 {
            seen.decide(&file(ino, 2, 1, 0));
        }
        let over = file(MAX_INODES as u64, 2, 1, 0);
        assert_eq!(seen.decide(&over), Decision::Read { linkable: false });
        assert_eq!(seen.decide(&over), Decision::Read { linkable: false });
        // One forgotten (its last name seen) makes room.
        assert_eq!(
            seen.decide(&file(0, 2, 1, 0)),
            Decision::Linked { last: true }
        );
        assert_eq!(seen.decide(&over), Decision::Read { linkable: true });
    }

    #[test]
    fn the_archiver_gives_what_was_read_until_the_last_name() {
        let mut done = Finished::default();
        let n = file(3, 3, 10, 0);
        let key = (1, 3);
        assert!(done.take(&n, false).is_none());
        done.record(key, Some(&n));
        assert_eq!(
            done.take(&n, false).map(|o| o.content),
            Some(n.content.clone())
        );
        assert!(done.take(&n, true).is_some());
        assert!(done.take(&n, false).is_none());
        done.record(key, Some(&n));
        // Read again and failed: what the earlier read gave is not given.
        done.record(key, None);
        assert!(done.take(&n, false).is_none());
        // Replaced by another file before it was opened: nothing either.
        done.record(key, Some(&n));
        done.record(key, Some(&file(4, 1, 10, 0)));
        assert!(done.take(&n, true).is_none());
    }
}
