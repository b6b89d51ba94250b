//! cairn's own reader of ext2/3/4 inodes, for what `ext4-view` does not show or
//! reads otherwise than the kernel: the content of regular files (block-mapped or
//! extent-mapped; a null pointer at any level, a hole and an uninitialised extent
//! read as zeros: `ext4-view` reads a preallocated file's blocks as they are on
//! the disk, and takes a null *indirect* pointer of a sparse ext2/ext3 file for
//! corruption), inode numbers (hard links) and extended attributes. The walk of
//! the filesystem stays with `ext4-view`; the journal is replayed here as it
//! replays it ([`Ext2::replay_journal`]), and a filesystem whose journal this
//! reader cannot replay is not read here at all.
//!
//! The image is untrusted: every number read from it is bounded (block numbers
//! below the block count, inode numbers below the inode count, directory records
//! within their block, depth of extent trees), and a damaged structure is an error,
//! never a panic.

use std::io::Write;

/// Reads `dst.len()` bytes at a byte offset of the filesystem.
pub(super) type ReadAt<'a> = dyn Fn(u64, &mut [u8]) -> Result<(), String> + 'a;

const ROOT_INODE: u32 = 2;
const EXTENTS_FL: u32 = 0x0008_0000;
const ENCRYPT_FL: u32 = 0x0000_0800;
const INLINE_DATA_FL: u32 = 0x1000_0000;
const INCOMPAT_RECOVER: u32 = 0x0004;
const COMPAT_HAS_JOURNAL: u32 = 0x0004;
const JBD2_MAGIC: u32 = 0xC03B_3998;
/// Journal features replayed, as `ext4-view` 1.0 has them: 64-bit block
/// numbers and checksums v3 required, revocation allowed.
const JBD2_REQUIRED: u32 = 0x02 | 0x10;
const JBD2_ALLOWED: u32 = JBD2_REQUIRED | 0x01;
/// Journal blocks at most (a journal is 1 GiB at most: 1 M blocks of 1 KiB).
const MAX_JOURNAL_BLOCKS: u64 = 1 << 22;
const INCOMPAT_64BIT: u32 = 0x0080;
const S_IFMT: u16 = 0o170000;
const S_IFDIR: u16 = 0o040000;
const S_IFREG: u16 = 0o100000;
const EXTENT_MAGIC: u16 = 0xF30A;
/// Names a directory may hold twice before it is taken for a crafted one.
pub(super) const MAX_REPEATED_NAMES: usize = 1000;
/// How the errors of [`Ext2::crafted_tree`] begin.
const CRAFTED: &str = "a crafted extent tree";
const CRAFTED_DIR: &str = "a crafted directory";

fn is_crafted(e: &str) -> bool {
    e.starts_with(CRAFTED) || e.starts_with(CRAFTED_DIR)
}
/// Extent tree nodes below an inode's own, at most: 16 M extents fill about
/// 50,000 leaves of 4 KiB.
const MAX_EXTENT_NODES: usize = 1 << 20;

/// Extended attributes: full names and values.
pub(super) type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;
const XATTR_MAGIC: u32 = 0xEA02_0000;

/// The entries of an in-inode attribute area (values at offsets from its start).
fn parse_xattrs(area: &[u8], out: &mut Xattrs) -> Result<(), String> {
    parse_xattrs_at(area, area, out)
}

/// Attribute entries in `entries` (until four zero bytes or their end), values
/// at offsets into `values`.
fn parse_xattrs_at(entries: &[u8], values: &[u8], out: &mut Xattrs) -> Result<(), String> {
    let mut at = 0usize;
    while at + 16 <= entries.len() && u32_at(entries, at) != 0 {
        let name_len = usize::from(entries[at]);
        let index = entries[at + 1];
        let offs = usize::from(u16_at(entries, at + 2));
        let inum = u32_at(entries, at + 4);
        let size = u32_at(entries, at + 8) as usize;
        let name = entries
            .get(at + 16..at + 16 + name_len)
            .ok_or("damaged extended attribute entry")?;
        at += (16 + name_len + 3) & !3;
        if inum != 0 {
            return Err(format!(
                "extended attribute {:?} keeps its value in an inode of its own (not read)",
                String::from_utf8_lossy(name)
            ));
        }
        let value = values
            .get(offs..offs.saturating_add(size))
            .ok_or("damaged extended attribute value")?;
        let (full, value) = match index {
            1 => ([b"user.", name].concat(), value.to_vec()),
            2 => (b"system.posix_acl_access".to_vec(), acl_to_xattr(value)?),
            3 => (b"system.posix_acl_default".to_vec(), acl_to_xattr(value)?),
            4 => ([b"trusted.", name].concat(), value.to_vec()),
            6 => ([b"security.", name].concat(), value.to_vec()),
            7 => ([b"system.", name].concat(), value.to_vec()),
            8 => (b"system.richacl".to_vec(), value.to_vec()),
            other => return Err(format!("extended attribute name index {other}")),
        };
        out.push((full, value));
        if out.len() > 65536 {
            return Err("more than 65536 extended attributes".into());
        }
    }
    Ok(())
}

/// A POSIX ACL as ext4 stores it (version 1, short entries for the owner, group,
/// mask and others) in the form `setxattr` takes (version 2, every entry 8 bytes).
fn acl_to_xattr(disk: &[u8]) -> Result<Vec<u8>, String> {
    const USER: u16 = 0x02;
    const GROUP: u16 = 0x08;
    if disk.len() < 4 || u32_at(disk, 0) != 1 {
        return Err("damaged ACL".into());
    }
    let mut out = 2u32.to_le_bytes().to_vec();
    let mut at = 4;
    while at < disk.len() {
        let tag = u16_at(disk, at);
        let perm = disk.get(at + 2..at + 4).ok_or("damaged ACL")?;
        let id = if tag == USER || tag == GROUP {
            let id = disk.get(at + 4..at + 8).ok_or("damaged ACL")?;
            at += 8;
            id.to_vec()
        } else {
            at += 4;
            u32::MAX.to_le_bytes().to_vec()
        };
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(perm);
        out.extend_from_slice(&id);
    }
    Ok(out)
}

/// The superblock numbers this reader needs.
pub(super) struct Ext2<'a> {
    read: &'a ReadAt<'a>,
    block: u64,
    blocks: u64,
    inodes: u32,
    per_group: u32,
    inode_size: u64,
    desc_size: u64,
    desc_start: u64,
    /// The journal as replayed (shared by every reader of one image: a replay
    /// reads the whole log, twice).
    journal: std::sync::Arc<Replayed>,
}

/// A journal replayed ([`Ext2::replay_journal`]).
#[derive(Default)]
pub(super) struct Replayed {
    /// Filesystem blocks the journal holds newer copies of (filesystem block to
    /// the journal's block), read in their place, as `ext4-view` replays them.
    map: JournalMap,
    /// The kernel replays the journal otherwise than `ext4-view` (and this
    /// reader) do.
    differs: bool,
}

/// What [`Ext2::open_cached`] keeps of a journal's replay: `None` when it
/// cannot be replayed here, and the filesystem is then not read here at all.
pub(super) type JournalCache = std::sync::OnceLock<Option<std::sync::Arc<Replayed>>>;

/// What this reader needs of an inode.
pub(super) struct Inode {
    mode: u16,
    pub size: u64,
    flags: u32,
    block: [u32; 15],
    /// Names it has (hard links).
    pub links: u16,
    /// The block of its extended attributes outside the inode (0: none).
    file_acl: u64,
    /// The extended attributes inside the inode: the bytes after the magic.
    in_inode_xattrs: Vec<u8>,
}

impl Inode {
    /// A device's number, as the kernel reads it from the first block pointers
    /// (the old 16-bit encoding in the first, else the new one in the second).
    pub fn rdev(&self) -> u64 {
        let (major, minor) = if self.block[0] != 0 {
            let d = self.block[0];
            ((d >> 8) & 0xff, d & 0xff)
        } else {
            let d = self.block[1];
            ((d & 0xfff00) >> 8, (d & 0xff) | ((d >> 12) & 0xfff00))
        };
        libc::makedev(major, minor)
    }

    /// Its type and permission bits (`st_mode`).
    pub fn mode(&self) -> u16 {
        self.mode
    }

    fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .map_or(0, |s| u16::from_le_bytes([s[0], s[1]]))
}

/// The tags of a journal descriptor block read up to byte `end`: each logged
/// block's number with the tag's flags (1 escaped, 2 same UUID, 8 last), and
/// whether the last tag was reached before `end`. A tag is 16 bytes (the
/// checksum v3 form), and the log's UUID follows it unless it is the same.
fn descriptor_tags(b: &[u8], end: usize) -> (Vec<(u64, u32)>, bool) {
    let mut tags = Vec::new();
    let mut t = 12;
    while t + 16 <= end {
        let flags = be(b, t + 4);
        let size = if flags & 2 != 0 { 16 } else { 32 };
        if t + size > end {
            break;
        }
        tags.push((u64::from(be(b, t + 8)) << 32 | u64::from(be(b, t)), flags));
        t += size;
        if flags & 8 != 0 {
            return (tags, true);
        }
    }
    (tags, false)
}

/// A big-endian u32 (the journal's byte order), 0 past the end.
fn be(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

impl<'a> Ext2<'a> {
    /// The filesystem `read` reads, or `None` when it is not one this reader may
    /// read (not ext2/3/4, or a journal still to replay that it cannot replay).
    #[cfg(test)]
    pub fn open(read: &'a ReadAt<'a>) -> Result<Option<Ext2<'a>>, String> {
        Self::open_cached(read, &JournalCache::new())
    }

    /// [`Self::open`], the journal replayed once per `cache`.
    pub fn open_cached(
        read: &'a ReadAt<'a>,
        cache: &JournalCache,
    ) -> Result<Option<Ext2<'a>>, String> {
        let mut sb = [0u8; 1024];
        read(1024, &mut sb)?;
        if u16_at(&sb, 56) != 0xEF53 {
            return Ok(None);
        }
        let incompat = u32_at(&sb, 96);
        let log = u32_at(&sb, 24);
        if log > 6 {
            return Err(format!("block size 1024 << {log}"));
        }
        let block = 1024u64 << log;
        let bit64 = incompat & INCOMPAT_64BIT != 0;
        let mut blocks = u64::from(u32_at(&sb, 4));
        if bit64 {
            blocks |= u64::from(u32_at(&sb, 0x150)) << 32;
        }
        let inode_size = if u32_at(&sb, 76) >= 1 {
            u64::from(u16_at(&sb, 88))
        } else {
            128
        };
        let desc_size = if bit64 {
            u64::from(u16_at(&sb, 0xFE)).max(32)
        } else {
            32
        };
        let per_group = u32_at(&sb, 40);
        if inode_size < 128 || inode_size > block || !inode_size.is_power_of_two() {
            return Err(format!("inode size {inode_size}"));
        }
        if per_group == 0 || desc_size > block {
            return Err("no inodes per group".into());
        }
        let mut fs = Ext2 {
            read,
            block,
            blocks,
            inodes: u32_at(&sb, 0),
            per_group,
            inode_size,
            desc_size,
            // The descriptors start in the block after the superblock's (byte
            // 1024), whatever `s_first_data_block` says: it is 0 with bigalloc
            // even for 1 KiB blocks (QA r23: such a filesystem's inode tables
            // were looked for in the superblock).
            desc_start: (1024 / block + 1) * block,
            journal: Default::default(),
        };
        // The journal, replayed as `ext4-view` replays it (which reads every
        // block through it): this reader then reads what that one lists. One
        // it cannot replay is not read here at all (nor by `ext4-view` in most
        // such cases).
        let replayed = cache.get_or_init(|| {
            let inum = u32_at(&sb, 0xE0);
            if u32_at(&sb, 92) & COMPAT_HAS_JOURNAL == 0 || inum == 0 {
                return Some(Default::default());
            }
            match fs.replay_journal(inum) {
                Ok(r) => Some(std::sync::Arc::new(r)),
                Err(_) if incompat & INCOMPAT_RECOVER == 0 => Some(Default::default()),
                Err(_) => None,
            }
        });
        match replayed {
            Some(r) => fs.journal = r.clone(),
            None => return Ok(None),
        }
        Ok(Some(fs))
    }

    /// Reads `dst.len()` bytes at byte `at` of the filesystem, each block the
    /// journal holds a newer copy of from there.
    fn read_at(&self, at: u64, dst: &mut [u8]) -> Result<(), String> {
        let journal = &self.journal.map;
        if journal.is_empty() {
            return (self.read)(at, dst);
        }
        let mut done = 0usize;
        while done < dst.len() {
            let pos = at + done as u64;
            let blk = pos / self.block;
            let within = (pos % self.block) as usize;
            let left = dst.len() - done;
            if let Some(&j) = journal.get(&blk) {
                let n = left.min(self.block as usize - within);
                let mut b = vec![0u8; self.block as usize];
                (self.read)(self.offset(j)?, &mut b)?;
                dst[done..done + n].copy_from_slice(&b[within..within + n]);
                done += n;
                continue;
            }
            // Up to the next block the journal replaces, in one read.
            let n = match journal.range(blk + 1..).next() {
                Some((&next, _)) => left.min(((next - blk) * self.block) as usize - within),
                None => left,
            };
            (self.read)(pos, &mut dst[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// The journal's map of replaced blocks, as `ext4-view` 1.0 builds it: from
    /// the log's start block to the end of the journal (no wrap), each
    /// transaction's descriptor tags (the checksum v3 format, which is all it
    /// reads) taken at its commit block less the blocks its revocation blocks
    /// name; the first block that is not a journal block, or whose sequence is
    /// not the next, ends the log. Checksums are not verified here.
    /// Whether that differs from what the kernel replays is said too
    /// ([`Self::kernel_replay`]): a log that wraps past the journal's end,
    /// revocations of blocks logged in earlier transactions, full revocation
    /// blocks (QA r25: a file's data came back as an old directory block, and
    /// deleted files came back).
    fn replay_journal(&self, inum: u32) -> Result<Replayed, String> {
        let ino = self.inode(inum)?;
        let n = ino.size / self.block;
        if !(2..=MAX_JOURNAL_BLOCKS).contains(&n) {
            return Err(format!("a journal of {n} blocks"));
        }
        // The journal's own blocks, in order (read as they are on the disk).
        let mut blocks = Vec::with_capacity(n as usize);
        if ino.flags & EXTENTS_FL != 0 {
            let mut ext = self.extents(&ino)?;
            ext.sort_unstable_by_key(|e| e.0);
            for (logical, len, start) in ext {
                if logical != blocks.len() as u64 {
                    return Err("a journal with holes".into());
                }
                blocks.extend((0..u64::from(len)).map(|i| start + i));
            }
        } else {
            let mut caches = [Cache::default(), Cache::default(), Cache::default()];
            for l in 0..n {
                blocks.push(self.map(&ino, l, &mut caches)?);
            }
        }
        blocks.truncate(n as usize);
        if blocks.len() as u64 != n || blocks.contains(&0) {
            return Err("a journal with holes".into());
        }
        let bs = self.block as usize;
        let mut b = vec![0u8; bs];
        (self.read)(self.offset(blocks[0])?, &mut b)?;
        if be(&b, 0) != JBD2_MAGIC || be(&b, 4) != 4 || u64::from(be(&b, 12)) != self.block {
            return Err("not a journal this reader replays".into());
        }
        if be(&b, 40) & JBD2_REQUIRED != JBD2_REQUIRED || be(&b, 40) & !JBD2_ALLOWED != 0 {
            return Err("a journal of features this reader does not replay".into());
        }
        let sequence = be(&b, 24);
        let start = be(&b, 28) as usize;
        let first = (be(&b, 20) as usize).max(1);
        let map = self.view_replay(&blocks, sequence, start)?;
        let kernel = self.kernel_replay(&blocks, sequence, start, first);
        let differs = kernel.map_or(true, |k| k != map);
        Ok(Replayed { map, differs })
    }

    /// [`Self::replay_journal`] as `ext4-view` 1.0 does it.
    fn view_replay(
        &self,
        blocks: &[u64],
        mut sequence: u32,
        start: usize,
    ) -> Result<JournalMap, String> {
        let bs = self.block as usize;
        let mut b = vec![0u8; bs];
        let mut map = JournalMap::new();
        let mut pending = JournalMap::new();
        let mut revoked: Vec<u64> = Vec::new();
        let mut at = start;
        while at < blocks.len() {
            (self.read)(self.offset(blocks[at])?, &mut b)?;
            at += 1;
            if be(&b, 0) != JBD2_MAGIC || be(&b, 8) != sequence {
                break;
            }
            match be(&b, 4) {
                // Descriptor: a tag per block that follows, all of it in the
                // block (its checksum tail included, as `ext4-view` reads it).
                1 => {
                    let (tags, whole) = descriptor_tags(&b, bs);
                    if tags.iter().any(|&(_, flags)| flags & 1 != 0) {
                        return Err("an escaped journal block".into());
                    }
                    if !whole {
                        return Ok(map);
                    }
                    for (target, _) in tags {
                        // Its data goes on at the journal's start: the log wraps.
                        let Some(&data) = blocks.get(at) else {
                            return Ok(map);
                        };
                        at += 1;
                        pending.insert(target, data);
                    }
                }
                // Revocation: the table's size, then 8-byte block numbers.
                5 => {
                    let table = &b[12..bs - 4];
                    let len = be(table, 0) as usize;
                    if !len.is_multiple_of(8) {
                        return Ok(map);
                    }
                    let Some(entries) = table.get(4..4 + len) else {
                        return Ok(map);
                    };
                    revoked.extend(entries.chunks(8).map(|c| {
                        u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
                    }));
                    if revoked.len() > MAX_JOURNAL_BLOCKS as usize {
                        return Err("a journal revoking too many blocks".into());
                    }
                }
                // Commit.
                2 => {
                    for r in revoked.drain(..) {
                        pending.remove(&r);
                    }
                    map.append(&mut pending);
                    sequence = sequence.wrapping_add(1);
                }
                other => return Err(format!("a journal block of type {other}")),
            }
        }
        Ok(map)
    }

    /// The journal's map of replaced blocks as the kernel (jbd2) replays it:
    /// the log read from its start, wrapping from the journal's last block to
    /// its first, while each block is a journal block of the next sequence;
    /// the transactions that reached their commit block are replayed in order,
    /// each logged block unless a revocation in its transaction or a later one
    /// names it. Checksums are not verified (nor escaped blocks, which
    /// `ext4-view` refuses).
    fn kernel_replay(
        &self,
        blocks: &[u64],
        mut sequence: u32,
        start: usize,
        first: usize,
    ) -> Result<JournalMap, String> {
        let bs = self.block as usize;
        let mut b = vec![0u8; bs];
        if start == 0 {
            return Ok(JournalMap::new());
        }
        let next = |at: usize| {
            if at + 1 >= blocks.len() {
                first
            } else {
                at + 1
            }
        };
        // Logged blocks (target, journal block, transaction), revocations
        // (target to the latest transaction naming it), as the log goes.
        let mut logged: Vec<(u64, u64, u32)> = Vec::new();
        let mut revoked: std::collections::HashMap<u64, u32> = Default::default();
        let mut committed: Option<u32> = None;
        let (mut at, mut steps) = (start, 0usize);
        'log: while steps < blocks.len() {
            let Some(&blk) = blocks.get(at) else { break };
            (self.read)(self.offset(blk)?, &mut b)?;
            if be(&b, 0) != JBD2_MAGIC || be(&b, 8) != sequence {
                break;
            }
            at = next(at);
            steps += 1;
            match be(&b, 4) {
                // The tags before the block's checksum tail.
                1 => {
                    for (target, _) in descriptor_tags(&b, bs - 4).0 {
                        let Some(&data) = blocks.get(at) else {
                            break 'log;
                        };
                        logged.push((target, data, sequence));
                        at = next(at);
                        steps += 1;
                    }
                }
                5 => {
                    // The count includes the 16 bytes before the entries.
                    let count = (be(&b, 12) as usize).min(bs - 4);
                    for c in b.get(16..count).unwrap_or(&[]).chunks_exact(8) {
                        let target =
                            u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
                        let r = revoked.entry(target).or_insert(sequence);
                        *r = (*r).max(sequence);
                    }
                }
                2 => {
                    committed = Some(sequence);
                    sequence = sequence.wrapping_add(1);
                }
                _ => break,
            }
        }
        let mut map = JournalMap::new();
        let Some(last) = committed else {
            return Ok(map);
        };
        for (target, data, seq) in logged {
            // Transactions after the last commit are not replayed; sequences
            // are compared as the kernel does, modulo 2³².
            let after = |a: u32, b: u32| (a.wrapping_sub(b) as i32) > 0;
            if after(seq, last) {
                continue;
            }
            if revoked.get(&target).is_some_and(|&r| !after(seq, r)) {
                continue;
            }
            map.insert(target, data);
        }
        Ok(map)
    }

    /// The byte offset of block `n` (checked: the block count is the image's word).
    fn offset(&self, n: u64) -> Result<u64, String> {
        n.checked_mul(self.block)
            .filter(|_| n < self.blocks)
            .ok_or_else(|| format!("block {n} is outside the filesystem"))
    }

    fn read_block(&self, n: u64, dst: &mut [u8]) -> Result<(), String> {
        if n == 0 {
            return Err("block 0 read as data".into());
        }
        self.read_at(self.offset(n)?, dst)
    }

    pub fn inode(&self, n: u32) -> Result<Inode, String> {
        if n == 0 || n > self.inodes {
            return Err(format!("inode {n} is outside the filesystem"));
        }
        let (group, index) = (
            u64::from((n - 1) / self.per_group),
            u64::from((n - 1) % self.per_group),
        );
        let mut desc = [0u8; 64];
        let dlen = self.desc_size.min(64) as usize;
        self.read_at(self.desc_start + group * self.desc_size, &mut desc[..dlen])?;
        let mut table = u64::from(u32_at(&desc, 8));
        if dlen >= 64 {
            table |= u64::from(u32_at(&desc, 0x28)) << 32;
        }
        if table == 0 || table >= self.blocks {
            return Err(format!(
                "inode table of group {group} is outside the filesystem"
            ));
        }
        // The whole inode (at most a block, checked at open): the large inodes
        // of ext4 keep extended attributes after their fixed part.
        let mut raw = vec![0u8; self.inode_size as usize];
        let at = self
            .offset(table)?
            .checked_add(index * self.inode_size)
            .ok_or("inode past the end")?;
        self.read_at(at, &mut raw)?;
        let mut block = [0u32; 15];
        for (i, b) in block.iter_mut().enumerate() {
            *b = u32_at(&raw, 40 + 4 * i);
        }
        let mut in_inode_xattrs = Vec::new();
        if raw.len() > 132 {
            let extra = usize::from(u16_at(&raw, 128));
            let start = 128 + extra;
            if start + 4 <= raw.len() && u32_at(&raw, start) == XATTR_MAGIC {
                in_inode_xattrs = raw[start + 4..].to_vec();
            }
        }
        Ok(Inode {
            mode: u16_at(&raw, 0),
            size: u64::from(u32_at(&raw, 4)) | u64::from(u32_at(&raw, 108)) << 32,
            flags: u32_at(&raw, 32),
            block,
            links: u16_at(&raw, 26),
            file_acl: u64::from(u32_at(&raw, 104)) | u64::from(u16_at(&raw, 118)) << 32,
            in_inode_xattrs,
        })
    }

    /// The extended attributes of an inode, names in their usual form
    /// (`user.x`, `security.capability`, `system.posix_acl_access` with the value
    /// in the form `setxattr` takes). A value kept in an inode of its own
    /// (`ea_inode`) is not read: an error says so.
    pub fn xattrs(&self, ino: &Inode) -> Result<Xattrs, String> {
        let mut out = Vec::new();
        parse_xattrs(&ino.in_inode_xattrs, &mut out)?;
        if ino.file_acl != 0 {
            let mut b = vec![0u8; self.block as usize];
            self.read_block(ino.file_acl, &mut b)?;
            if u32_at(&b, 0) != XATTR_MAGIC || u32_at(&b, 8) != 1 {
                return Err(format!(
                    "the extended attribute block {} is damaged",
                    ino.file_acl
                ));
            }
            // Entries after the 32-byte header; values at offsets from the block's start.
            let entries = b[32..].to_vec();
            parse_xattrs_at(&entries, &b, &mut out)?;
        }
        Ok(out)
    }

    /// The entries of a directory: each name with its inode number (`.` and `..`
    /// included), a name once (the first entry, as `ext4-view` reads it). A
    /// directory whose entries are kept inside its inode (`inline_data`) is an
    /// error, and so is one whose names repeat more than a damaged block
    /// explains: held twice, a name is the mark of a crafted directory, whose
    /// blocks repeat (pentest: the same block under every pointer listed
    /// millions of entries).
    pub fn entries(&self, dir: &Inode) -> Result<Vec<(Vec<u8>, u32)>, String> {
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut repeats = 0usize;
        self.walk_dir(dir, &mut |name, inode| {
            if seen.insert(name.to_vec()) {
                out.push((name.to_vec(), inode));
            } else {
                repeats += 1;
            }
            repeats > MAX_REPEATED_NAMES
        })?;
        if repeats > MAX_REPEATED_NAMES {
            return Err(format!(
                "a damaged directory: more than {MAX_REPEATED_NAMES} of its names are held twice"
            ));
        }
        Ok(out)
    }

    /// Entry `index` of the indirect block `ptr` (0: a hole, so is every entry).
    fn indirect(&self, ptr: u32, index: u64, cache: &mut Cache) -> Result<u32, String> {
        if ptr == 0 {
            return Ok(0);
        }
        if cache.block != Some(ptr) {
            cache.data.resize(self.block as usize, 0);
            self.read_block(u64::from(ptr), &mut cache.data)?;
            cache.block = Some(ptr);
        }
        Ok(u32_at(&cache.data, (index * 4) as usize))
    }

    /// The filesystem block holding logical block `n` of a block-mapped inode; 0
    /// for a hole.
    fn map(&self, ino: &Inode, n: u64, c: &mut [Cache; 3]) -> Result<u64, String> {
        let per = self.block / 4;
        let b = &ino.block;
        let found = if n < 12 {
            b[n as usize]
        } else if n - 12 < per {
            self.indirect(b[12], n - 12, &mut c[0])?
        } else if n - 12 - per < per * per {
            let m = n - 12 - per;
            let l1 = self.indirect(b[13], m / per, &mut c[0])?;
            self.indirect(l1, m % per, &mut c[1])?
        } else if n - 12 - per - per * per < per * per * per {
            let m = n - 12 - per - per * per;
            let l1 = self.indirect(b[14], m / (per * per), &mut c[0])?;
            let l2 = self.indirect(l1, m / per % per, &mut c[1])?;
            self.indirect(l2, m % per, &mut c[2])?
        } else {
            return Err(format!(
                "logical block {n} is past what a block map can address"
            ));
        };
        if u64::from(found) >= self.blocks {
            return Err(format!("block {found} is outside the filesystem"));
        }
        Ok(u64::from(found))
    }

    /// The inode at `path` (absolute, no symlinks on the way, as `ext4-view`'s
    /// `canonicalize` gives it); `None` when a directory on the way keeps its
    /// entries inside its inode (`inline_data`) or the name is not there.
    pub fn lookup(&self, path: &[u8]) -> Result<Option<(u32, Inode)>, String> {
        let mut n = ROOT_INODE;
        let mut ino = self.inode(n)?;
        for name in path.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
            if !ino.is_dir() || ino.flags & INLINE_DATA_FL != 0 {
                return Ok(None);
            }
            let Some(next) = self.find_in_dir(&ino, name)? else {
                return Ok(None);
            };
            n = next;
            ino = self.inode(n)?;
        }
        Ok(Some((n, ino)))
    }

    fn find_in_dir(&self, dir: &Inode, name: &[u8]) -> Result<Option<u32>, String> {
        let mut found = None;
        self.walk_dir(dir, &mut |n, inode| {
            if n == name {
                found = Some(inode);
                return true;
            }
            false
        })?;
        Ok(found)
    }

    /// Calls `each(name, inode)` for every entry of a directory (linear: an
    /// htree directory's index blocks read as empty entries) until it returns
    /// true.
    fn walk_dir(
        &self,
        dir: &Inode,
        each: &mut dyn FnMut(&[u8], u32) -> bool,
    ) -> Result<(), String> {
        let physical = self.dir_blocks(dir)?;
        let mut data = vec![0u8; self.block as usize];
        for phys in physical {
            if phys == 0 {
                continue;
            }
            self.read_block(phys, &mut data)?;
            let mut off = 0usize;
            while off + 8 <= data.len() {
                let inode = u32_at(&data, off);
                let rec_len = usize::from(u16_at(&data, off + 4));
                let name_len = usize::from(data[off + 6]);
                if rec_len < 8
                    || rec_len % 4 != 0
                    || off + rec_len > data.len()
                    || 8 + name_len > rec_len
                {
                    return Err(format!("damaged directory record in block {phys}"));
                }
                if inode != 0 && each(&data[off + 8..off + 8 + name_len], inode) {
                    return Ok(());
                }
                off += rec_len;
            }
        }
        Ok(())
    }

    /// The extents of an extent-mapped inode: (first logical block, length,
    /// first physical block), uninitialised ones left out (they read as zeros).
    fn extents(&self, ino: &Inode) -> Result<Vec<Extent>, String> {
        self.extents_walked(ino).map(|(out, _)| out)
    }

    /// [`Self::extents`], with what the walk met.
    fn extents_walked(&self, ino: &Inode) -> Result<(Vec<Extent>, ExtentWalk), String> {
        let mut root = [0u8; 60];
        for (i, b) in ino.block.iter().enumerate() {
            root[4 * i..4 * i + 4].copy_from_slice(&b.to_le_bytes());
        }
        let mut out = Vec::new();
        let mut walk = ExtentWalk::default();
        self.extent_node(&root, None, &mut out, &mut walk)?;
        Ok((out, walk))
    }

    /// An error when the extent tree of `ino` names a block twice or is larger
    /// than any file's: `ext4-view` walks such a tree once per path through it
    /// (pentest: a crafted directory of five levels took 4·84⁴ reads, a larger
    /// one would never end), so it is not given one. Other damage is left for
    /// `ext4-view` to find and name.
    pub fn crafted_tree(&self, ino: &Inode) -> Result<(), String> {
        if ino.flags & INLINE_DATA_FL != 0 {
            return Ok(());
        }
        let checked = if ino.is_dir() {
            self.dir_blocks(ino).map(|_| ())
        } else if ino.flags & EXTENTS_FL != 0 {
            self.extents(ino).map(|_| ())
        } else {
            Ok(())
        };
        match checked {
            Err(e) if is_crafted(&e) => Err(e),
            _ => Ok(()),
        }
    }

    /// [`Self::crafted_tree`] for every directory on the way to `path` (and
    /// `path` itself), as this reader finds them.
    pub fn crafted_on_the_way(&self, path: &[u8]) -> Result<(), String> {
        let Ok(mut ino) = self.inode(ROOT_INODE) else {
            return Ok(());
        };
        for name in path.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
            self.crafted_tree(&ino)?;
            if !ino.is_dir() || ino.flags & INLINE_DATA_FL != 0 {
                return Ok(());
            }
            match self.find_in_dir(&ino, name) {
                Ok(Some(next)) => match self.inode(next) {
                    Ok(i) => ino = i,
                    Err(_) => return Ok(()),
                },
                Err(e) if is_crafted(&e) => return Err(e),
                _ => return Ok(()),
            }
        }
        self.crafted_tree(&ino)
    }

    /// Whether the kernel would replay the journal otherwise than it is read
    /// here (see [`Self::replay_journal`]).
    pub fn journal_differs(&self) -> bool {
        self.journal.differs
    }

    /// The blocks of a directory (0: a hole), checked as a crafted one would
    /// fail: larger than ext4 lets a directory grow, an uninitialised extent
    /// (`ext4-view` reads its old bytes as entries, this reader zeros), a block
    /// named twice (the same entries listed again and again: pentest, a
    /// directory of 2³¹ blocks mapped onto one had `ext4-view` read them all).
    fn dir_blocks(&self, dir: &Inode) -> Result<Vec<u64>, String> {
        if dir.flags & INLINE_DATA_FL != 0 {
            return Err("a directory kept inside its inode (inline_data)".into());
        }
        // A directory is not sparse: it cannot be larger than the filesystem, nor
        // than ext4 lets a directory grow (4 GiB with `large_dir`).
        if dir.size > self.blocks.saturating_mul(self.block) || dir.size > 4 << 30 {
            return Err(format!("{CRAFTED_DIR}: {} bytes", dir.size));
        }
        let blocks = dir.size.div_ceil(self.block);
        let mut physical: Vec<u64> = Vec::new();
        if dir.flags & EXTENTS_FL != 0 {
            let (extents, walk) = self.extents_walked(dir)?;
            if walk.uninitialised > 0 {
                return Err(format!("{CRAFTED_DIR}: an uninitialised extent"));
            }
            for (logical, len, start) in extents {
                for i in 0..u64::from(len).min(blocks.saturating_sub(logical)) {
                    physical.push(start + i);
                }
                if physical.len() as u64 > blocks {
                    return Err(format!("{CRAFTED_DIR}: its extents overlap"));
                }
            }
        } else {
            let mut caches = [Cache::default(), Cache::default(), Cache::default()];
            for l in 0..blocks {
                physical.push(self.map(dir, l, &mut caches)?);
            }
        }
        let mut sorted: Vec<u64> = physical.iter().copied().filter(|&p| p != 0).collect();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("{CRAFTED_DIR}: block {} is in it twice", w[0]));
        }
        Ok(physical)
    }

    /// Whether this reader reads the content of `ino` itself ([`Self::copy`]): a
    /// regular file, mapped by extents or by blocks, not kept inside its inode
    /// and not encrypted. `ext4-view` reads the others (or says why not); it
    /// reads an uninitialised extent's old disk bytes as the file's content,
    /// where the kernel reads zeros (QA r23: a preallocated file showed what a
    /// deleted file had left on the disk), and finds each file by its path,
    /// which costs a scan of its directory per file.
    pub fn reads(&self, ino: &Inode) -> bool {
        ino.mode & S_IFMT == S_IFREG && ino.flags & (INLINE_DATA_FL | ENCRYPT_FL) == 0
    }

    /// One node of an extent tree; `depth` is the depth its parent said it has.
    /// Every node is read once (a block listed twice is damage: pentest, a
    /// tree whose index nodes named one child 84 times each took 4·84⁴ reads),
    /// and extents count toward the bound whether initialised or not.
    fn extent_node(
        &self,
        node: &[u8],
        depth: Option<u16>,
        out: &mut Vec<Extent>,
        walk: &mut ExtentWalk,
    ) -> Result<(), String> {
        if node.len() < 12 || u16_at(node, 0) != EXTENT_MAGIC {
            return Err("damaged extent tree".into());
        }
        let entries = usize::from(u16_at(node, 2));
        let here = u16_at(node, 6);
        // ext4 trees are at most 5 levels deep; each level one less than its parent.
        if here > 5 || depth.is_some_and(|d| d != here) || 12 + 12 * entries > node.len() {
            return Err("damaged extent tree".into());
        }
        for e in 0..entries {
            let at = 12 + 12 * e;
            if here == 0 {
                walk.extents += 1;
                if walk.extents > 1 << 24 {
                    return Err(format!("{CRAFTED}: more than 16 M extents"));
                }
                let len = u16_at(node, at + 4);
                let start = u64::from(u32_at(node, at + 8)) | u64::from(u16_at(node, at + 6)) << 32;
                if len > 32768 {
                    walk.uninitialised += 1;
                    continue; // uninitialised: zeros
                }
                // What the kernel takes for corruption: no blocks, or block 0
                // (the boot block and superblock) as data.
                if len == 0 || start == 0 {
                    return Err(format!(
                        "damaged extent tree: an extent of {len} blocks at block {start}"
                    ));
                }
                if start.saturating_add(u64::from(len)) > self.blocks {
                    return Err(format!("extent at block {start} is outside the filesystem"));
                }
                out.push((u64::from(u32_at(node, at)), u32::from(len), start));
            } else {
                let child = u64::from(u32_at(node, at + 4)) | u64::from(u16_at(node, at + 8)) << 32;
                if !walk.nodes.insert(child) {
                    return Err(format!("{CRAFTED}: block {child} is in it twice"));
                }
                if walk.nodes.len() > MAX_EXTENT_NODES {
                    return Err(format!("{CRAFTED}: more than 1 M blocks"));
                }
                let mut b = vec![0u8; self.block as usize];
                self.read_block(child, &mut b)?;
                self.extent_node(&b, Some(here - 1), out, walk)?;
            }
        }
        Ok(())
    }

    /// Writes the file's `size` bytes to `out`: holes and uninitialised extents
    /// as zeros, consecutive blocks read together (up to 1 MiB). For a file
    /// [`Self::reads`].
    /// `stop` is asked between pieces: a terabyte of holes takes minutes.
    pub fn copy(
        &self,
        ino: &Inode,
        out: &mut dyn Write,
        stop: &dyn Fn() -> bool,
    ) -> Result<u64, CopyError> {
        if ino.flags & EXTENTS_FL != 0 {
            return self.copy_extents(ino, out, stop);
        }
        let mut caches = [Cache::default(), Cache::default(), Cache::default()];
        let total = ino.size.div_ceil(self.block);
        let batch = (1u64 << 20) / self.block;
        let mut buf = Vec::new();
        let mut written = 0u64;
        let mut n = 0u64;
        while n < total {
            if stop() {
                return Err(CopyError::Stopped);
            }
            let first = self.map(ino, n, &mut caches).map_err(CopyError::Fs)?;
            let mut run = 1u64;
            while run < batch && n + run < total {
                let next = self.map(ino, n + run, &mut caches).map_err(CopyError::Fs)?;
                let follows = if first == 0 {
                    next == 0
                } else {
                    next == first + run
                };
                if !follows {
                    break;
                }
                run += 1;
            }
            buf.clear();
            buf.resize((run * self.block) as usize, 0);
            if first != 0 {
                let at = self.offset(first).map_err(CopyError::Fs)?;
                self.read_at(at, &mut buf).map_err(CopyError::Fs)?;
            }
            let take = (ino.size - written).min(buf.len() as u64) as usize;
            out.write_all(&buf[..take]).map_err(CopyError::Out)?;
            written += take as u64;
            n += run;
        }
        Ok(written)
    }
}

impl Ext2<'_> {
    /// [`Self::copy`] of an extent-mapped file: its initialised extents in
    /// order of their logical blocks, zeros between them and after the last.
    fn copy_extents(
        &self,
        ino: &Inode,
        out: &mut dyn Write,
        stop: &dyn Fn() -> bool,
    ) -> Result<u64, CopyError> {
        let mut extents = self.extents(ino).map_err(CopyError::Fs)?;
        extents.sort_unstable_by_key(|e| e.0);
        let size = ino.size;
        const PIECE: u64 = 1 << 20;
        let zeros = vec![0u8; PIECE as usize];
        let mut buf = vec![0u8; PIECE as usize];
        let fill = |out: &mut dyn Write, mut n: u64| -> Result<(), CopyError> {
            while n > 0 {
                if stop() {
                    return Err(CopyError::Stopped);
                }
                let k = n.min(PIECE);
                out.write_all(&zeros[..k as usize])
                    .map_err(CopyError::Out)?;
                n -= k;
            }
            Ok(())
        };
        let mut pos = 0u64;
        for (logical, len, start) in extents {
            let from = logical.saturating_mul(self.block);
            if from >= size {
                break;
            }
            if from < pos {
                return Err(CopyError::Fs("damaged extent tree: extents overlap".into()));
            }
            fill(out, from - pos)?;
            pos = from;
            // Within the filesystem (checked as the tree was read), cut at the
            // file's size; read a whole number of blocks at a time.
            let mut left = (u64::from(len) * self.block).min(size - pos);
            let mut at = self.offset(start).map_err(CopyError::Fs)?;
            while left > 0 {
                if stop() {
                    return Err(CopyError::Stopped);
                }
                let k = left.min(PIECE);
                let whole = k.div_ceil(self.block) * self.block;
                self.read_at(at, &mut buf[..whole as usize])
                    .map_err(CopyError::Fs)?;
                out.write_all(&buf[..k as usize]).map_err(CopyError::Out)?;
                at += whole;
                left -= k;
                pos += k;
            }
        }
        fill(out, size - pos)?;
        Ok(size)
    }
}

/// Filesystem blocks to the journal blocks holding their newer copies.
type JournalMap = std::collections::BTreeMap<u64, u64>;

/// An initialised extent: its first logical block, its length and its first
/// block in the filesystem.
type Extent = (u64, u32, u64);

/// What a walk of one extent tree has met.
#[derive(Default)]
struct ExtentWalk {
    /// The blocks of the nodes read.
    nodes: std::collections::HashSet<u64>,
    /// Leaf entries, initialised or not.
    extents: usize,
    /// Uninitialised leaf entries.
    uninitialised: usize,
}

/// Why [`Ext2::copy`] stopped.
pub(super) enum CopyError {
    /// Reading the image's filesystem.
    Fs(String),
    /// Writing the output.
    Out(std::io::Error),
    /// `stop` said so.
    Stopped,
}

/// The indirect block read last at one level.
#[derive(Default)]
struct Cache {
    block: Option<u32>,
    data: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random filesystems with a valid magic and plausible sizes: every walk ends
    /// in an answer or an error, never a panic or a read outside the bytes given.
    #[test]
    fn damaged_attribute_areas_are_errors_not_panics() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..20_000 {
            let n = (next() % 200) as usize;
            let mut b: Vec<u8> = (0..n).map(|_| next() as u8).collect();
            if round % 2 == 0 && n >= 16 {
                // A plausible first entry: short name, small value.
                b[0] = (next() % 8) as u8;
                b[1] = (next() % 9) as u8;
                b[2..4].copy_from_slice(&((next() % 64) as u16).to_le_bytes());
                b[4..8].copy_from_slice(&0u32.to_le_bytes());
                b[8..12].copy_from_slice(&((next() % 40) as u32).to_le_bytes());
            }
            let mut out = Vec::new();
            let _ = parse_xattrs(&b, &mut out);
            let _ = acl_to_xattr(&b);
        }
        // An ACL in ext4's form: short entries for the owner, group, mask and
        // others, long ones for named users and groups.
        let mut disk = 1u32.to_le_bytes().to_vec();
        for (tag, perm, id) in [
            (1u16, 6u16, None),
            (2, 4, Some(1234u32)),
            (4, 4, None),
            (0x20, 0, None),
        ] {
            disk.extend_from_slice(&tag.to_le_bytes());
            disk.extend_from_slice(&perm.to_le_bytes());
            if let Some(id) = id {
                disk.extend_from_slice(&id.to_le_bytes());
            }
        }
        let x = acl_to_xattr(&disk).unwrap();
        assert_eq!(x.len(), 4 + 4 * 8);
        assert_eq!(&x[..4], &2u32.to_le_bytes());
        assert_eq!(&x[8..12], &u32::MAX.to_le_bytes());
        assert_eq!(&x[16..20], &1234u32.to_le_bytes());
        assert!(acl_to_xattr(&disk[..disk.len() - 2]).is_err());
    }

    #[test]
    fn damaged_filesystems_are_errors_not_panics() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..300 {
            let mut img: Vec<u8> = (0..64 * 1024).map(|_| next() as u8).collect();
            img[1024 + 56..1024 + 58].copy_from_slice(&0xEF53u16.to_le_bytes());
            img[1024 + 24..1024 + 28].copy_from_slice(&((next() % 3) as u32).to_le_bytes());
            img[1024 + 96..1024 + 100].copy_from_slice(&0u32.to_le_bytes());
            img[1024 + 4..1024 + 8].copy_from_slice(&64u32.to_le_bytes());
            img[1024..1028].copy_from_slice(&((next() % 64) as u32).to_le_bytes());
            let read = |at: u64, dst: &mut [u8]| -> Result<(), String> {
                let end = at
                    .checked_add(dst.len() as u64)
                    .filter(|&e| e <= img.len() as u64)
                    .ok_or("past the end")?;
                dst.copy_from_slice(&img[at as usize..end as usize]);
                Ok(())
            };
            let Ok(Some(fs)) = Ext2::open(&read) else {
                continue;
            };
            if let Ok(Some((_, ino))) = fs.lookup(b"/a/b")
                && ino.size < 16 << 20
                && fs.reads(&ino)
            {
                let _ = fs.copy(&ino, &mut std::io::sink(), &|| false);
            }
            for n in 1..8 {
                if let Ok(ino) = fs.inode(n) {
                    let _ = fs.reads(&ino);
                    let _ = fs.entries(&ino);
                    let _ = fs.xattrs(&ino);
                    let mut c = [Cache::default(), Cache::default(), Cache::default()];
                    for b in [0, 11, 12, 300, 70_000, 1 << 30] {
                        let _ = fs.map(&ino, b, &mut c);
                    }
                }
            }
        }
    }
}
