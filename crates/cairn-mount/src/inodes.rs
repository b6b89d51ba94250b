//! The inode table: which inode numbers the kernel knows and what each stands for.
//!
//! An inode lives exactly as long as the kernel holds a reference to it: every
//! lookup (and every entry of a `readdirplus` answer) counts one, `forget` takes
//! them back, and at zero the entry goes. The table therefore holds what the
//! kernel's own inode cache holds, which the kernel bounds by memory pressure, and
//! never everything ever seen: walking a snapshot of ten million files leaves the
//! table as small as the kernel lets its cache become (`echo 2 >
//! /proc/sys/vm/drop_caches` empties both). Only the three fixed top-level
//! directories are permanent.
//!
//! Numbers are never reused (a 64-bit counter), so the generation is always 0.
//! Names of one hard-linked file within a snapshot (same recorded device and inode,
//! more than one link) share one inode number, as they would after a restore.

use cairn_format::{BlobId, SnapshotId};
use fuser::FileAttr;
use std::collections::{HashMap, VecDeque};

/// The mount's root.
pub const ROOT: u64 = 1;
/// `hosts/` and `snapshots/` (only when every snapshot is mounted).
pub const HOSTS: u64 = 2;
pub const SNAPSHOTS: u64 = 3;
/// Fixed inodes below this are never forgotten.
const FIRST_DYNAMIC: u64 = 16;

/// What an inode stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum What {
    /// The root when every snapshot is mounted.
    Top,
    Hosts,
    Snapshots,
    /// The root's `latest` symlink, with its target (a newer snapshot is a new
    /// inode: the kernel caches symlink targets).
    Latest(String),
    /// `hosts/HOST/`.
    Host(String),
    /// `hosts/HOST/latest`, with its target.
    HostLatest(String, String),
    /// `snapshots/PREFIX`: a symlink to the full id (looked up, never listed).
    ShortId(SnapshotId),
    /// A snapshot's root directory (its tree has no node of its own).
    SnapRoot {
        snap: SnapshotId,
        tree: BlobId,
    },
    /// An entry of a snapshot: its node is the one named like the inode in the
    /// tree `dir`; `subtree` is set for directories.
    Entry {
        snap: SnapshotId,
        dir: BlobId,
        subtree: Option<BlobId>,
        has_xattrs: bool,
        /// A file whose holes are known only from its chunk list (read on a
        /// GETATTR): its attributes are answered with a TTL of zero until then.
        holes_unknown: bool,
    },
}

impl What {
    /// Content that never changes: a snapshot's tree (long cache times).
    pub fn immutable(&self) -> bool {
        matches!(self, What::SnapRoot { .. } | What::Entry { .. })
    }
}

#[derive(Debug)]
pub struct Inode {
    pub what: What,
    pub attr: FileAttr,
    /// The directory that holds it (for `..`; any one of a hard link's).
    pub parent: u64,
    /// The name it was first found under (the name of its node for entries).
    pub name: Box<[u8]>,
    lookups: u64,
    /// Every (directory, name) it is known under: one, or several for hard links.
    keys: Vec<(u64, Box<[u8]>)>,
    link: Option<LinkKey>,
    /// In [`Table::order`] (once at most).
    queued: bool,
    /// Given out by [`Table::oldest`] and neither forgotten nor looked up since.
    asked: bool,
}

/// A hard-linked file: (snapshot, recorded device, recorded inode).
pub type LinkKey = (SnapshotId, u64, u64);

#[derive(Debug, Default)]
pub struct Table {
    /// Boxed: a map's slots are allocated a power of two at a time, and an inode
    /// is about 350 bytes; unboxed, a table of 262,144 inodes held 524,288 of
    /// them (180 MB) whatever was in use.
    inodes: HashMap<u64, Box<Inode>>,
    by_name: HashMap<(u64, Box<[u8]>), u64>,
    links: HashMap<LinkKey, u64>,
    next: u64,
    /// Dynamic inodes, oldest first: the ones to ask the kernel to forget when
    /// the table is over its budget ([`Table::oldest`]). Holds numbers of inodes
    /// already forgotten too, until they reach the front or the queue is compacted.
    order: VecDeque<u64>,
    /// The most inodes held at once.
    peak: usize,
    /// Inodes given out by [`Table::oldest`] that the kernel has not forgotten
    /// yet (it may still use them, or its FORGET is on its way).
    asked: usize,
    /// The budget, and the thread that keeps it, woken when a new inode goes past it.
    max: usize,
    trimmer: Option<std::thread::Thread>,
}

impl Table {
    /// A table with the fixed root (`root`: what it stands for).
    pub fn new(root: What, attr: FileAttr) -> Table {
        let mut t = Table {
            next: FIRST_DYNAMIC,
            ..Default::default()
        };
        t.insert_fixed(ROOT, root, ROOT, b"", attr);
        t
    }

    pub fn insert_fixed(&mut self, ino: u64, what: What, parent: u64, name: &[u8], attr: FileAttr) {
        let mut attr = attr;
        attr.ino = fuser::INodeNo(ino);
        self.inodes.insert(
            ino,
            Box::new(Inode {
                what,
                attr,
                parent,
                name: name.into(),
                lookups: 0,
                keys: Vec::new(),
                link: None,
                queued: false,
                asked: false,
            }),
        );
        if ino != ROOT {
            self.by_name.insert((parent, name.into()), ino);
        }
    }

    pub fn get(&self, ino: u64) -> Option<&Inode> {
        self.inodes.get(&ino).map(|i| &**i)
    }

    /// Inodes held now.
    pub fn len(&self) -> usize {
        self.inodes.len()
    }

    /// The most inodes held at once so far.
    pub fn peak(&self) -> usize {
        self.peak
    }

    /// Never true once built: the root is always there.
    pub fn is_empty(&self) -> bool {
        self.inodes.is_empty()
    }

    /// The inode for `name` in `parent`, made by `make` if the kernel holds none;
    /// counts one lookup. A hard-linked file (`link`) found under another name
    /// gets that name's inode.
    pub fn lookup(
        &mut self,
        parent: u64,
        name: &[u8],
        link: Option<LinkKey>,
        make: impl FnOnce() -> (What, FileAttr),
    ) -> (u64, FileAttr) {
        let key = (parent, Box::<[u8]>::from(name));
        if let Some(&ino) = self.by_name.get(&key)
            && let Some(i) = self.inodes.get_mut(&ino)
        {
            i.lookups += 1;
            let attr = i.attr;
            self.enqueue(ino);
            return (ino, attr);
        }
        if let Some(l) = link
            && let Some(&ino) = self.links.get(&l)
            && let Some(i) = self.inodes.get_mut(&ino)
        {
            i.lookups += 1;
            i.keys.push(key.clone());
            let attr = i.attr;
            self.by_name.insert(key, ino);
            self.enqueue(ino);
            return (ino, attr);
        }
        let ino = self.next;
        self.next += 1;
        let (what, mut attr) = make();
        attr.ino = fuser::INodeNo(ino);
        if let Some(l) = link {
            self.links.insert(l, ino);
        }
        self.by_name.insert(key.clone(), ino);
        self.inodes.insert(
            ino,
            Box::new(Inode {
                what,
                attr,
                parent,
                name: key.1.clone(),
                lookups: 1,
                keys: vec![key],
                link,
                queued: false,
                asked: false,
            }),
        );
        self.peak = self.peak.max(self.inodes.len());
        self.enqueue(ino);
        if self.excess() > 0
            && let Some(t) = &self.trimmer
        {
            t.unpark();
        }
        (ino, attr)
    }

    /// Puts `ino` at the back of [`Self::order`] unless it is in it: a new inode,
    /// or one taken out by [`Self::oldest`] that the kernel looked up again (it
    /// still used it, or asked for it anew).
    fn enqueue(&mut self, ino: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            if i.asked {
                i.asked = false;
                self.asked -= 1;
            }
            if !i.queued {
                i.queued = true;
                self.order.push_back(ino);
            }
        }
        // Numbers of forgotten inodes are dropped once they are half the queue, so
        // that it stays within twice the table whatever the kernel forgets alone.
        if self.order.len() > 2 * self.inodes.len() + 4096 {
            let inodes = &self.inodes;
            self.order.retain(|n| inodes.contains_key(n));
        }
    }

    /// Takes up to `n` of the oldest dynamic inodes out of the queue and returns
    /// every (directory, name) each is known under: the entries to ask the kernel
    /// to forget ([`fuser::Notifier::inval_entry`]) when the table is over its
    /// budget. A directory found before its entries goes first, and with it the
    /// kernel drops what it holds below it unless in use. An inode the kernel still
    /// uses stays in the table until it is done with it; looked up again, it
    /// queues again.
    pub fn oldest(&mut self, n: usize) -> Vec<(u64, Box<[u8]>)> {
        let mut out = Vec::new();
        let mut taken = 0;
        while taken < n {
            let Some(ino) = self.order.pop_front() else {
                break;
            };
            let Some(i) = self.inodes.get_mut(&ino) else {
                continue;
            };
            i.queued = false;
            if !i.asked {
                i.asked = true;
                self.asked += 1;
            }
            taken += 1;
            out.extend(i.keys.iter().cloned());
        }
        out
    }

    /// Sets the budget ([`Self::excess`]) and the thread to wake past it.
    pub fn set_budget(&mut self, max: usize, trimmer: std::thread::Thread) {
        self.max = max;
        self.trimmer = Some(trimmer);
    }

    /// How many inodes to ask the kernel to forget now: past the budget, down to
    /// nine tenths of it, not counting those asked for already. Zero without a
    /// budget.
    pub fn excess(&self) -> usize {
        let held = self.inodes.len() - self.asked;
        if self.trimmer.is_none() || held <= self.max {
            return 0;
        }
        held - (self.max - self.max / 10)
    }

    /// [`Self::lookup`] for a top-level entry, which a new snapshot list can
    /// change: the name keeps its inode only while it stands for the same thing,
    /// else it gets a new one (the kernel caches what an inode was: a symlink's
    /// target, a directory's attributes), and the old inode lives on until the
    /// kernel forgets it.
    pub fn lookup_current(
        &mut self,
        parent: u64,
        name: &[u8],
        what: What,
        attr: FileAttr,
    ) -> (u64, FileAttr) {
        let key = (parent, Box::<[u8]>::from(name));
        if let Some(&ino) = self.by_name.get(&key)
            && self.inodes.get(&ino).is_some_and(|i| i.what != what)
        {
            self.by_name.remove(&key);
        }
        self.lookup(parent, name, None, || (what, attr))
    }

    /// The kernel dropped `n` references to `ino`.
    /// Drops `n` of the kernel's lookups of `ino`; true when that was the last and
    /// the inode is gone.
    pub fn forget(&mut self, ino: u64, n: u64) -> bool {
        if ino < FIRST_DYNAMIC {
            return false;
        }
        let Some(i) = self.inodes.get_mut(&ino) else {
            return false;
        };
        i.lookups = i.lookups.saturating_sub(n);
        if i.lookups > 0 {
            return false;
        }
        if let Some(i) = self.inodes.remove(&ino) {
            if i.asked {
                self.asked -= 1;
            }
            for k in i.keys {
                if self.by_name.get(&k) == Some(&ino) {
                    self.by_name.remove(&k);
                }
            }
            if let Some(l) = i.link
                && self.links.get(&l) == Some(&ino)
            {
                self.links.remove(&l);
            }
            self.shrink_when_sparse();
        }
        true
    }

    /// Gives memory back once the kernel has forgotten most of what it held (a
    /// walk of a large tree, then memory pressure or `drop_caches`): a map keeps
    /// its largest size otherwise, and the mount would stay as large as the
    /// largest walk it ever served.
    fn shrink_when_sparse(&mut self) {
        fn shrink<K: std::hash::Hash + Eq, V>(m: &mut HashMap<K, V>) {
            if m.capacity() > 4096 && m.len() < m.capacity() / 4 {
                m.shrink_to(m.len() * 2);
            }
        }
        shrink(&mut self.inodes);
        shrink(&mut self.by_name);
        shrink(&mut self.links);
        if self.order.capacity() > 4096 && self.order.len() < self.order.capacity() / 4 {
            self.order.shrink_to(self.order.len() * 2);
        }
    }

    /// Updates the attributes kept for `ino` (virtual entries whose size or time
    /// follows the snapshot list).
    pub fn set_attr(&mut self, ino: u64, attr: FileAttr) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.attr = attr;
            i.attr.ino = fuser::INodeNo(ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn attr() -> FileAttr {
        FileAttr {
            ino: fuser::INodeNo(0),
            size: 0,
            blocks: 0,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: fuser::FileType::RegularFile,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn entry() -> (What, FileAttr) {
        (
            What::Entry {
                snap: SnapshotId([1; 32]),
                dir: BlobId([2; 32]),
                subtree: None,
                has_xattrs: false,
                holes_unknown: false,
            },
            attr(),
        )
    }

    #[test]
    fn inodes_live_while_the_kernel_holds_them() {
        let mut t = Table::new(What::Top, attr());
        let (a, _) = t.lookup(ROOT, b"a", None, entry);
        let (a2, _) = t.lookup(ROOT, b"a", None, || panic!("known"));
        assert_eq!(a, a2);
        let (b, _) = t.lookup(ROOT, b"b", None, entry);
        assert_ne!(a, b);
        assert_eq!(t.len(), 3);
        t.forget(a, 1);
        assert!(t.get(a).is_some(), "one reference left");
        t.forget(a, 1);
        assert!(t.get(a).is_none());
        t.forget(b, 5);
        assert_eq!(t.len(), 1, "only the root stays");
        t.forget(ROOT, 1);
        assert!(t.get(ROOT).is_some());
        // A name found again gets a new number (numbers are never reused).
        let (a3, _) = t.lookup(ROOT, b"a", None, entry);
        assert!(a3 > b);
    }

    #[test]
    fn hard_links_share_one_inode_until_every_name_is_forgotten() {
        let mut t = Table::new(What::Top, attr());
        let link = Some((SnapshotId([1; 32]), 7, 42));
        let (x, _) = t.lookup(ROOT, b"x", link, entry);
        let (y, _) = t.lookup(5, b"y", link, || panic!("same inode"));
        assert_eq!(x, y);
        // Another snapshot's file with the same numbers is another inode.
        let (z, _) = t.lookup(ROOT, b"z", Some((SnapshotId([2; 32]), 7, 42)), entry);
        assert_ne!(x, z);
        t.forget(x, 2);
        assert!(t.get(x).is_none());
        assert_eq!(t.len(), 2);
        let (x2, _) = t.lookup(5, b"y", link, entry);
        assert_ne!(x2, x);
    }

    #[test]
    fn past_the_budget_the_oldest_entries_are_given_out_once_each() {
        let mut t = Table::new(What::Top, attr());
        assert_eq!(t.excess(), 0, "no budget, no trimming");
        t.set_budget(1024, std::thread::current());
        let mut inos = Vec::new();
        for n in 0..1100u32 {
            inos.push(t.lookup(ROOT, &n.to_be_bytes(), None, entry).0);
        }
        // 1,101 held with the root: down to 922 (nine tenths), 179 to ask for.
        assert_eq!(t.excess(), 1101 - 922);
        let first = t.oldest(t.excess());
        assert_eq!(first.len(), 179);
        assert_eq!(first[0], (ROOT, Box::from(&0u32.to_be_bytes()[..])));
        // Asked for and not yet forgotten: not asked for again.
        assert_eq!(t.excess(), 0);
        // The kernel forgets most; one it still used is looked up again and
        // queues again, at the back.
        for &ino in &inos[1..179] {
            assert!(t.forget(ino, 1));
        }
        t.lookup(ROOT, &0u32.to_be_bytes(), None, || panic!("still held"));
        assert_eq!(t.len(), 1101 - 178);
        assert_eq!(t.excess(), 0);
        let next = t.oldest(2);
        assert_eq!(next[0], (ROOT, Box::from(&179u32.to_be_bytes()[..])));
        // A hard link's every name is given out.
        let link = Some((SnapshotId([1; 32]), 7, 42));
        t.lookup(5, b"x", link, entry);
        t.lookup(6, b"y", link, || panic!("same inode"));
        let all = t.oldest(usize::MAX);
        assert_eq!(all.len(), 1100 - 181 + 1 + 2);
        assert_eq!(
            &all[all.len() - 3..][1..],
            &[(5, Box::from(&b"x"[..])), (6, Box::from(&b"y"[..]))]
        );
        assert_eq!(&*all[all.len() - 3].1, &0u32.to_be_bytes()[..]);
    }
}
