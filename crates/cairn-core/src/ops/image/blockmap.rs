//! cairn's own reader of ext2/3/4 inodes, for what `ext4-view` does not show or
//! reads otherwise than the kernel: the content of regular files (block-mapped or
//! extent-mapped; a null pointer at any level, a hole and an uninitialised extent
//! read as zeros: `ext4-view` reads a preallocated file's blocks as they are on
//! the disk, and takes a null *indirect* pointer of a sparse ext2/ext3 file for
//! corruption), inode numbers (hard links) and extended attributes. The walk of
//! the filesystem stays with `ext4-view`. The journal of a filesystem imaged
//! while mounted is replayed here as the kernel replays it
//! ([`Ext2::replay_journal`]), for this reader and for `ext4-view`, which is
//! given the replayed blocks ([`Replayed::read_recovered`]); a filesystem
//! whose journal cannot be replayed here is not read in place at all.
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
/// Journal features (incompatible ones): revocation blocks, 64-bit block
/// numbers, asynchronous commits, checksums v2 and v3. All are replayed, the
/// checksums checked; fast commits are not replayed.
const JBD2_REVOKE: u32 = 0x01;
const JBD2_64BIT: u32 = 0x02;
const JBD2_CSUM_V2: u32 = 0x08;
const JBD2_CSUM_V3: u32 = 0x10;
const JBD2_ALLOWED: u32 = JBD2_REVOKE | JBD2_64BIT | 0x04 | JBD2_CSUM_V2 | JBD2_CSUM_V3;
/// A journal's superblock: version 1 (no features) or 2.
const JBD2_SUPERBLOCK_V1: u32 = 3;
const JBD2_SUPERBLOCK_V2: u32 = 4;
/// The compatible feature of checksums v1: a CRC32 of each transaction's
/// descriptor and logged blocks in its commit block.
const JBD2_COMPAT_CHECKSUM: u32 = 0x01;
/// The fewest blocks jbd2 takes a journal to have.
const JBD2_MIN_BLOCKS: usize = 1024;
/// The filesystem's journal is on another device.
const INCOMPAT_JOURNAL_DEV: u32 = 0x0008;
/// Metadata checksums (read-only compatible): the superblock has one.
const RO_COMPAT_METADATA_CSUM: u32 = 0x0400;
/// Revoked blocks at most in a journal's log (the kernel keeps them in a
/// table in memory too; a journal of 1 GiB filled with revocation records
/// would otherwise hold 256 M of them).
const MAX_REVOKED: usize = 1 << 22;
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

/// A journal replayed ([`Ext2::replay_journal`]): what the filesystem reads
/// like once the kernel has replayed it.
#[derive(Default)]
pub(super) struct Replayed {
    /// Filesystem blocks the journal holds newer copies of (filesystem block to
    /// the journal's block, and whether the copy was escaped: its first four
    /// bytes, the journal's magic number, were written as zeros).
    map: JournalMap,
    /// The block size.
    block: u64,
    /// The filesystem's superblock (its 1024 bytes) as a reader that does not
    /// replay the journal itself must see it: replayed, with the flag that
    /// asks for recovery cleared and its checksum made again. `None` when the
    /// journal needs no recovery.
    superblock: Option<Box<[u8]>>,
}

impl Replayed {
    /// Reads `dst.len()` bytes at byte `at` of the filesystem, each block the
    /// journal holds a newer copy of from there (`read` reads the image).
    pub fn read_at(&self, read: &ReadAt<'_>, at: u64, dst: &mut [u8]) -> Result<(), String> {
        let journal = &self.map;
        if journal.is_empty() {
            return read(at, dst);
        }
        let block = self.block;
        let mut done = 0usize;
        while done < dst.len() {
            let pos = at.checked_add(done as u64).ok_or("a read past the image")?;
            let blk = pos / block;
            let within = (pos % block) as usize;
            let left = dst.len() - done;
            if let Some(&(j, escaped)) = journal.get(&blk) {
                let n = left.min(block as usize - within);
                let from = j
                    .checked_mul(block)
                    .ok_or("a journal block past the image")?;
                // The piece wanted of the journal's copy, straight into `dst`;
                // an escaped copy's first four bytes are the magic number.
                read(from + within as u64, &mut dst[done..done + n])?;
                if escaped && within < 4 {
                    let magic = JBD2_MAGIC.to_be_bytes();
                    let k = (4 - within).min(n);
                    dst[done..done + k].copy_from_slice(&magic[within..within + k]);
                }
                done += n;
                continue;
            }
            // Up to the next block the journal replaces, in one read.
            let n = match journal.range(blk + 1..).next() {
                Some((&next, _)) => left.min((next - blk).saturating_mul(block) as usize - within),
                None => left,
            };
            read(pos, &mut dst[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// [`Self::read_at`], the superblock as a reader that replays nothing must
    /// see it (`ext4-view`, which is then given the replayed filesystem and
    /// reads it as the kernel would once mounted).
    pub fn read_recovered(&self, read: &ReadAt<'_>, at: u64, dst: &mut [u8]) -> Result<(), String> {
        self.read_at(read, at, dst)?;
        if let Some(sb) = &self.superblock {
            let end = at.saturating_add(dst.len() as u64);
            let (from, to) = (at.max(1024), end.min(2048));
            if from < to {
                dst[(from - at) as usize..(to - at) as usize]
                    .copy_from_slice(&sb[(from - 1024) as usize..(to - 1024) as usize]);
            }
        }
        Ok(())
    }
}

/// The superblock `sb` (1024 bytes) with the flag asking for the journal's
/// recovery cleared, its checksum made again when it has one (CRC32C of what
/// precedes it, stored as the kernel stores it: not inverted at the end).
fn recovered(sb: &[u8]) -> Box<[u8]> {
    let mut sb = sb.to_vec().into_boxed_slice();
    let incompat = u32_at(&sb, 96) & !INCOMPAT_RECOVER;
    sb[96..100].copy_from_slice(&incompat.to_le_bytes());
    if u32_at(&sb, 0x64) & RO_COMPAT_METADATA_CSUM != 0 {
        let sum = crc32c_raw(!0, &[&sb[..0x3FC]]);
        sb[0x3FC..0x400].copy_from_slice(&sum.to_le_bytes());
    }
    sb
}

/// CRC32C of `parts` one after the other, from register `seed`, without the
/// final inversion: the form ext4 and jbd2 store (`crc32c(seed, ...)` there).
fn crc32c_raw(seed: u32, parts: &[&[u8]]) -> u32 {
    const CRC32C: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);
    // The crate's register starts reflected, and its result is inverted.
    let mut d = CRC32C.digest_with_initial(seed.reverse_bits());
    for p in parts {
        d.update(p);
    }
    !d.finalize()
}

/// Linux's `crc32_be(seed, data)` over `data`: CRC32 without reflection,
/// from register `seed`, without the final inversion (checksums v1).
fn crc32_be_raw(seed: u32, data: &[u8]) -> u32 {
    const CRC32: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_BZIP2);
    let mut d = CRC32.digest_with_initial(seed);
    d.update(data);
    !d.finalize()
}

/// What [`Ext2::open_cached`] keeps of a journal's replay: why it could not be
/// replayed, when it needs recovery and cannot be; the filesystem is then not
/// read at all (its last changes would be missing or half there).
pub(super) type JournalCache = std::sync::OnceLock<Result<std::sync::Arc<Replayed>, String>>;

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

/// How a journal's log is laid out (its superblock's features).
struct JournalLog {
    /// A descriptor tag's bytes, without the UUID that may follow it.
    tag_bytes: usize,
    /// Block numbers of 64 bits (in tags, after the flags; in revocations).
    bit64: bool,
    /// The checksum at the end of descriptor and revocation blocks (v2, v3).
    tail: usize,
    /// The log's first block, where it goes on past the journal's last.
    first: usize,
    /// Checksums v2 or v3: the seed (CRC32C of the journal's UUID) and
    /// whether they are v3 (32 bits in tags; v2 keeps 16).
    csum: Option<(u32, bool)>,
    /// Checksums v1: a CRC32 (big-endian, as `crc32_be`) of each
    /// transaction's descriptor and logged blocks, in its commit block.
    crc32: bool,
}

impl JournalLog {
    /// Whether descriptor or revocation block `b` holds the checksum its tail
    /// says (true without checksums).
    fn block_sum_holds(&self, b: &[u8]) -> bool {
        let Some((seed, _)) = self.csum else {
            return true;
        };
        let end = b.len() - 4;
        let sum = crc32c_raw(seed, &[&b[..end], &[0; 4]]);
        sum == be(b, end)
    }

    /// Whether a commit block holds its checksum (true without checksums).
    fn commit_sum_holds(&self, b: &[u8]) -> bool {
        let Some((seed, _)) = self.csum else {
            return true;
        };
        let sum = crc32c_raw(seed, &[&b[..16], &[0; 4], &b[20..]]);
        sum == be(b, 16)
    }

    /// Whether a commit block whose checksum fails was written in part: the
    /// checksum holds for its header alone (its first 64 bytes, the rest of
    /// the block zeros). Linux 6.x takes such a block for a commit.
    fn commit_partly_written(&self, b: &[u8]) -> bool {
        let Some((seed, _)) = self.csum else {
            return false;
        };
        let zeros = vec![0u8; b.len() - 64];
        let sum = crc32c_raw(seed, &[&b[..16], &[0; 4], &b[20..64], &zeros]);
        sum == be(b, 16)
    }

    /// Whether the logged block `data` of transaction `sequence` holds the
    /// checksum of its tag (`tag`: the tag's checksum field, true without
    /// checksums).
    fn data_sum_holds(&self, data: &[u8], sequence: u32, tag: u32) -> bool {
        let Some((seed, v3)) = self.csum else {
            return true;
        };
        let sum = crc32c_raw(seed, &[&sequence.to_be_bytes(), data]);
        if v3 { sum == tag } else { sum & 0xFFFF == tag }
    }

    /// The tags of descriptor block `b`, as jbd2 reads them: each logged
    /// block's number with the tag's flags (1 escaped, 2 same UUID, 8 last)
    /// and checksum field (v3: 32 bits at byte 12; v2: 16 bits at byte 4; 0
    /// without), up to the last tag or the block's checksum tail. The flags
    /// are the 16 bits at byte 6 in every format (the low half of v3's 32).
    fn tags(&self, b: &[u8]) -> Vec<(u64, u16, u32)> {
        let end = b.len() - self.tail;
        let mut tags = Vec::new();
        let mut t = 12;
        while t + self.tag_bytes <= end {
            let flags = (be(b, t + 4) & 0xFFFF) as u16;
            let mut target = u64::from(be(b, t));
            if self.bit64 {
                target |= u64::from(be(b, t + 8)) << 32;
            }
            let sum = match self.csum {
                Some((_, true)) => be(b, t + 12),
                Some((_, false)) => be(b, t + 4) >> 16,
                None => 0,
            };
            tags.push((target, flags, sum));
            t += self.tag_bytes;
            if flags & 2 == 0 {
                t += 16;
            }
            if flags & 8 != 0 {
                break;
            }
        }
        tags
    }
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
    /// The filesystem `read` reads, or `None` when it is not ext2/3/4; an
    /// error when it cannot be read here (its journal needs recovery and
    /// cannot be replayed, among others).
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
        // The journal, replayed as the kernel replays it when it mounts the
        // filesystem, and only when the superblock asks for it, as there.
        let replayed = cache.get_or_init(|| {
            let inum = u32_at(&sb, 0xE0);
            let compat = u32_at(&sb, 92);
            if incompat & INCOMPAT_RECOVER == 0 || compat & COMPAT_HAS_JOURNAL == 0 {
                return Ok(std::sync::Arc::new(Replayed {
                    block,
                    ..Default::default()
                }));
            }
            if incompat & INCOMPAT_JOURNAL_DEV != 0 {
                return Err("the journal is on another device".into());
            }
            if inum == 0 {
                return Err("the superblock names no journal inode".into());
            }
            let mut r = fs.replay_journal(inum)?;
            let mut now = [0u8; 1024];
            r.read_at(read, 1024, &mut now)?;
            r.superblock = Some(recovered(&now));
            Ok(std::sync::Arc::new(r))
        });
        fs.journal = replayed.clone()?;
        Ok(Some(fs))
    }

    /// The journal as replayed for this filesystem: what it reads like mounted.
    pub fn replayed(&self) -> std::sync::Arc<Replayed> {
        self.journal.clone()
    }

    /// Reads `dst.len()` bytes at byte `at` of the filesystem, each block the
    /// journal holds a newer copy of from there.
    fn read_at(&self, at: u64, dst: &mut [u8]) -> Result<(), String> {
        self.journal.read_at(self.read, at, dst)
    }

    /// The journal of inode `inum` replayed as the kernel (jbd2) replays it
    /// when the filesystem is mounted: the log is read from its start, wrapping
    /// from the journal's last block to its first, while each block is a
    /// journal block of the next transaction; the transactions that reached
    /// their commit block are replayed in order, each logged block unless a
    /// revocation in its transaction or a later committed one names it.
    /// Every tag format is read (checksums v3, v2 or none; 32- or 64-bit block
    /// numbers), escaped blocks get their first bytes back, and checksums (v1,
    /// v2, v3) are checked as jbd2 checks them ([`Self::kernel_replay`]).
    /// (`ext4-view` 1.0's own replay stops at the journal's end, keeps
    /// revocations within their transaction and reads checksum v3 logs only:
    /// QA r25 saw a file come back with an old directory block inside, and
    /// deleted files come back, so the replayed filesystem is given to it
    /// instead.)
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
                if blocks.len() as u64 > n {
                    break;
                }
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
        if blocks.iter().any(|&b| b >= self.blocks) {
            return Err("a journal outside the filesystem".into());
        }
        let bs = self.block as usize;
        let mut b = vec![0u8; bs];
        (self.read)(self.offset(blocks[0])?, &mut b)?;
        let kind = be(&b, 4);
        if be(&b, 0) != JBD2_MAGIC
            || !(kind == JBD2_SUPERBLOCK_V1 || kind == JBD2_SUPERBLOCK_V2)
            || u64::from(be(&b, 12)) != self.block
        {
            return Err("not a journal this reader replays".into());
        }
        let features = if kind == JBD2_SUPERBLOCK_V2 {
            be(&b, 40)
        } else {
            0
        };
        let compat = if kind == JBD2_SUPERBLOCK_V2 {
            be(&b, 36)
        } else {
            0
        };
        // Checksums of two versions at once, which jbd2 refuses too.
        let v2or3 = features & (JBD2_CSUM_V2 | JBD2_CSUM_V3);
        if v2or3 == JBD2_CSUM_V2 | JBD2_CSUM_V3 || v2or3 != 0 && compat & JBD2_COMPAT_CHECKSUM != 0
        {
            return Err("a journal with checksums of two versions at once".into());
        }
        // jbd2 knows no read-only compatible feature: one makes it refuse too.
        if kind == JBD2_SUPERBLOCK_V2 && be(&b, 44) != 0 {
            return Err(format!(
                "a journal of read-only features this reader does not know ({:#x})",
                be(&b, 44)
            ));
        }
        if features & !JBD2_ALLOWED != 0 {
            return Err(format!(
                "a journal of features this reader does not replay ({:#x})",
                features & !JBD2_ALLOWED
            ));
        }
        // With checksums, the journal's superblock has one too (CRC32C of its
        // 1,024 bytes, its own field as zeros), of the one type jbd2 knows.
        if features & (JBD2_CSUM_V2 | JBD2_CSUM_V3) != 0
            && (b[0x50] != 4
                || crc32c_raw(!0, &[&b[..0xFC], &[0; 4], &b[0x100..1024]]) != be(&b, 0xFC))
        {
            return Err("a journal whose superblock fails its checksum".into());
        }
        // As jbd2 checks them: at least 1,024 blocks (a journal that says it
        // is shorter is damaged: the kernel refuses to mount it), at most the
        // journal inode's.
        let (maxlen, first) = (be(&b, 16) as usize, be(&b, 20) as usize);
        if !(JBD2_MIN_BLOCKS..=blocks.len()).contains(&maxlen) || first == 0 || first >= maxlen {
            return Err("a journal whose bounds are damaged".into());
        }
        blocks.truncate(maxlen);
        let log = JournalLog {
            tag_bytes: match (features & JBD2_CSUM_V3 != 0, features & JBD2_64BIT != 0) {
                (true, _) => 16,
                (false, bit64) => {
                    8 + if bit64 { 4 } else { 0 } + if features & JBD2_CSUM_V2 != 0 { 2 } else { 0 }
                }
            },
            bit64: features & JBD2_64BIT != 0,
            tail: if features & (JBD2_CSUM_V2 | JBD2_CSUM_V3) != 0 {
                4
            } else {
                0
            },
            first,
            crc32: compat & JBD2_COMPAT_CHECKSUM != 0,
            csum: (features & (JBD2_CSUM_V2 | JBD2_CSUM_V3) != 0)
                .then(|| (crc32c_raw(!0, &[&b[48..64]]), features & JBD2_CSUM_V3 != 0)),
        };
        let (sequence, start) = (be(&b, 24), be(&b, 28) as usize);
        if start >= maxlen {
            return Err("a journal whose log starts outside it".into());
        }
        let map = self.kernel_replay(&blocks, sequence, start, &log)?;
        // A log that writes over the journal itself: the kernel's recovery
        // then fails (QA r26), as it does here.
        if let Some(b) = blocks.iter().find(|b| map.contains_key(b)) {
            return Err(format!(
                "a damaged journal (it logs block {b}, one of the journal's own)"
            ));
        }
        Ok(Replayed {
            map,
            block: self.block,
            superblock: None,
        })
    }

    /// [`Self::replay_journal`]'s log, from block `start` (0: nothing to replay).
    ///
    /// Checksums as jbd2 checks them (Linux 6.x `fs/jbd2/recovery.c`): a
    /// descriptor or revocation block that fails its own makes the next commit
    /// block decide: one older than the last commit ends the log there (stale
    /// blocks), and a later one is damage, on which the kernel refuses to
    /// mount. A commit block that fails its checksum (v2, v3: unless only its
    /// header was written; v1: the CRC32 of the transaction's blocks) ends the
    /// log before its transaction. A logged block to be replayed that fails its
    /// tag's checksum, or lies outside the filesystem, is damage (QA r26: such
    /// blocks were passed over, and a file was read as it was before its last
    /// change, exit 0).
    fn kernel_replay(
        &self,
        blocks: &[u64],
        mut sequence: u32,
        start: usize,
        log: &JournalLog,
    ) -> Result<JournalMap, String> {
        let bs = self.block as usize;
        let mut b = vec![0u8; bs];
        let mut data = vec![0u8; bs];
        if start == 0 {
            return Ok(JournalMap::new());
        }
        let next = |at: usize| {
            if at + 1 >= blocks.len() {
                log.first
            } else {
                at + 1
            }
        };
        // Logged blocks (target, journal block, escaped, transaction, tag's
        // checksum), and revocations: of the transaction being read, and of
        // the committed ones (target to the latest transaction naming it).
        let mut logged: Vec<(u64, u64, bool, u32, u32)> = Vec::new();
        let mut revoking: std::collections::HashSet<u64> = Default::default();
        let mut revoked: std::collections::HashMap<u64, u32> = Default::default();
        let mut committed: Option<u32> = None;
        // A descriptor or revocation block whose checksum failed: the next
        // commit block's time decides.
        let mut bad: Option<String> = None;
        let mut last_commit_time = 0u64;
        // Checksums v1: the CRC32 of the transaction's blocks so far.
        let mut crc32 = !0u32;
        let record = if log.bit64 { 8 } else { 4 };
        let (mut at, mut steps) = (start, 0usize);
        'log: while steps < blocks.len() {
            let Some(&blk) = blocks.get(at) else { break };
            (self.read)(self.offset(blk)?, &mut b)?;
            if be(&b, 0) != JBD2_MAGIC || be(&b, 8) != sequence {
                break;
            }
            let here = at;
            at = next(at);
            steps += 1;
            match be(&b, 4) {
                // Descriptor: the tags before the block's checksum tail.
                1 => {
                    if !log.block_sum_holds(&b) {
                        bad.get_or_insert(format!("journal block {here}: its checksum fails"));
                    }
                    if log.crc32 {
                        crc32 = crc32_be_raw(crc32, &b);
                    }
                    for (target, flags, sum) in log.tags(&b) {
                        let Some(&j) = blocks.get(at) else {
                            break 'log;
                        };
                        if log.crc32 {
                            (self.read)(self.offset(j)?, &mut data)?;
                            crc32 = crc32_be_raw(crc32, &data);
                        }
                        logged.push((target, j, flags & 1 != 0, sequence, sum));
                        at = next(at);
                        steps += 1;
                    }
                }
                // Revocation: the count includes the 16 bytes before the
                // records; one larger than the block is a damaged log, on
                // which the kernel refuses to mount.
                5 => {
                    if !log.block_sum_holds(&b) {
                        bad.get_or_insert(format!("journal block {here}: its checksum fails"));
                    }
                    let count = be(&b, 12) as usize;
                    if count > bs - log.tail {
                        return Err("a damaged journal revocation block".into());
                    }
                    let records = b.get(16..count).unwrap_or(&[]);
                    for c in records.chunks_exact(record) {
                        revoking.insert(if log.bit64 {
                            u64::from(be(c, 0)) << 32 | u64::from(be(c, 4))
                        } else {
                            u64::from(be(c, 0))
                        });
                    }
                    if revoking.len() + revoked.len() > MAX_REVOKED {
                        return Err("a journal revoking too many blocks".into());
                    }
                }
                2 => {
                    let time = u64::from(be(&b, 48)) << 32 | u64::from(be(&b, 52));
                    if let Some(why) = bad.take() {
                        if time >= last_commit_time {
                            return Err(format!("a damaged journal ({why})"));
                        }
                        // Stale blocks of an earlier use of the journal.
                        break;
                    }
                    // v1: the CRC32 in the commit block, or none recorded.
                    let v1 = (b[12], b[13], be(&b, 16));
                    let v1_holds = !log.crc32 || v1 == (1, 4, crc32) || v1 == (0, 0, 0);
                    // v2, v3: unless only its header was written.
                    let holds =
                        v1_holds && (log.commit_sum_holds(&b) || log.commit_partly_written(&b));
                    if !holds {
                        // The transaction was not committed whole (or the
                        // block is stale): the log ends before it.
                        break;
                    }
                    crc32 = !0;
                    last_commit_time = time;
                    for target in revoking.drain() {
                        revoked.insert(target, sequence);
                    }
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
        for (target, data, escaped, seq, sum) in logged {
            // Transactions after the last commit are not replayed; sequences
            // are compared as the kernel does, modulo 2³².
            let after = |a: u32, b: u32| (a.wrapping_sub(b) as i32) > 0;
            if after(seq, last) {
                continue;
            }
            if revoked.get(&target).is_some_and(|&r| !after(seq, r)) {
                continue;
            }
            if target >= self.blocks {
                return Err(format!(
                    "a damaged journal (it logs block {target}, outside the filesystem)"
                ));
            }
            if log.csum.is_some() {
                (self.read)(self.offset(data)?, &mut b)?;
                if !log.data_sum_holds(&b, seq, sum) {
                    return Err(format!(
                        "a damaged journal (its copy of block {target} fails its checksum)"
                    ));
                }
            }
            map.insert(target, (data, escaped));
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

    /// The target of symlink `ino` when it is kept in blocks (60 bytes or
    /// more: a shorter one is kept in the inode), read as a file's content;
    /// `None` for another inode. (`ext4-view` reads a target as a path, and
    /// refuses one holding a name longer than 255 bytes, which the kernel
    /// keeps: QA r24.)
    pub fn link_target(&self, ino: &Inode) -> Result<Option<Vec<u8>>, String> {
        const S_IFLNK: u16 = 0o120000;
        if ino.mode & S_IFMT != S_IFLNK
            || ino.flags & (INLINE_DATA_FL | ENCRYPT_FL) != 0
            || !(60..=4095).contains(&ino.size)
        {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(ino.size as usize);
        match self.copy(ino, &mut out, &|| false) {
            Ok(_) => Ok(Some(out)),
            Err(CopyError::Fs(e)) => Err(e),
            // Into memory, never stopped.
            Err(CopyError::Out(e)) => Err(e.to_string()),
            Err(CopyError::Stopped) => Err("stopped".into()),
        }
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
            let take = (ino.size - written).min(buf.len() as u64) as usize;
            if first != 0 {
                let at = self.offset(first).map_err(CopyError::Fs)?;
                self.read_or_salvage(at, &mut buf, take, out)?;
            }
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
        // Buffers no larger than the file (rounded to whole blocks) and zeros
        // only for a file with holes: a directory of small files restored
        // allocated, touched and unmapped 2 MiB per file (strace: two `mmap`
        // and `munmap` a file, 15,000 files 1.3 s, of which 0.9 s in the kernel).
        const PIECE: u64 = 1 << 20;
        let piece = PIECE.min(size.div_ceil(self.block).max(1) * self.block);
        let mut zeros: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; piece as usize];
        let mut fill = |out: &mut dyn Write, mut n: u64| -> Result<(), CopyError> {
            while n > 0 {
                if stop() {
                    return Err(CopyError::Stopped);
                }
                let k = n.min(PIECE);
                if zeros.len() < k as usize {
                    zeros.resize(k as usize, 0);
                }
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
                let k = left.min(piece);
                let whole = k.div_ceil(self.block) * self.block;
                self.read_or_salvage(at, &mut buf[..whole as usize], k as usize, out)?;
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

impl Ext2<'_> {
    /// Reads `buf` (whole blocks) at `at`. When that fails, the blocks before
    /// the first that cannot be read (of the `take` bytes the caller writes)
    /// are written to `out` before the error is given: a copy cut short gives
    /// everything before the damage (QA r40: a 1 MiB read that failed held
    /// back all of it).
    fn read_or_salvage(
        &self,
        at: u64,
        buf: &mut [u8],
        take: usize,
        out: &mut dyn Write,
    ) -> Result<(), CopyError> {
        if self.read_at(at, buf).is_ok() {
            return Ok(());
        }
        let block = self.block as usize;
        for (i, piece) in buf.chunks_mut(block).enumerate() {
            if let Err(e) = self.read_at(at + (i * block) as u64, piece) {
                let good = (i * block).min(take);
                // `buf` was read in part again: only the blocks read are given.
                out.write_all(&buf[..good]).map_err(CopyError::Out)?;
                return Err(CopyError::Fs(e));
            }
        }
        // Each block read on its own (the failure did not come back): `buf`
        // holds them all.
        Ok(())
    }
}

/// Filesystem blocks to the journal blocks holding their newer copies.
type JournalMap = std::collections::BTreeMap<u64, (u64, bool)>;

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

    /// A journal block: magic, type, sequence, then `body` from byte 12.
    fn jblock(kind: u32, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 1024];
        b[0..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        b[4..8].copy_from_slice(&kind.to_be_bytes());
        b[8..12].copy_from_slice(&seq.to_be_bytes());
        b[12..12 + body.len()].copy_from_slice(body);
        b
    }

    /// Descriptor tags in the 32-bit form without checksums (ext3): block
    /// number, 16-bit checksum (unused), 16-bit flags; the first tag with the
    /// log's UUID after it, the others "same UUID" (2), the last one marked (8).
    fn tags32(targets: &[(u32, u16)]) -> Vec<u8> {
        let mut t = Vec::new();
        for (i, &(target, flags)) in targets.iter().enumerate() {
            let mut f = flags | if i == 0 { 0 } else { 2 };
            if i + 1 == targets.len() {
                f |= 8;
            }
            t.extend_from_slice(&target.to_be_bytes());
            t.extend_from_slice(&0u16.to_be_bytes());
            t.extend_from_slice(&f.to_be_bytes());
            if i == 0 {
                t.extend_from_slice(&[0x55; 16]);
            }
        }
        t
    }

    /// Revocation records of 32 bits, after the count (which includes the 16
    /// bytes of header and count).
    fn revoke32(targets: &[u32]) -> Vec<u8> {
        let mut r = ((16 + 4 * targets.len()) as u32).to_be_bytes().to_vec();
        for t in targets {
            r.extend_from_slice(&t.to_be_bytes());
        }
        r
    }

    /// The kernel's replay of a synthetic log laid out in journal blocks 1..:
    /// a log that wraps past the journal's end, a block revoked in a later
    /// transaction, a revocation in a transaction that never committed, an
    /// escaped block, and an uncommitted transaction's blocks.
    #[test]
    fn the_journal_is_replayed_as_the_kernel_replays_it() {
        // The journal is filesystem blocks 100..112 (12 blocks; block 0 of it
        // is its superblock); the log starts at journal block 8, sequence 7.
        let journal: Vec<u64> = (100..112).collect();
        let mut disk = vec![vec![0u8; 1024]; 200];
        let mut put = |at: usize, b: Vec<u8>| disk[journal[at] as usize] = b;
        // Transaction 7: blocks 50 (escaped) and 51.
        put(8, jblock(1, 7, &tags32(&[(50, 1), (51, 0)])));
        put(9, vec![0xE1; 1024]);
        put(10, vec![0xE2; 1024]);
        // Its commit block, past which the log wraps to journal block 1.
        put(11, jblock(2, 7, &[]));
        // Transaction 8: block 52, and revokes 51 (logged in 7).
        put(1, jblock(1, 8, &tags32(&[(52, 0)])));
        put(2, vec![0xE3; 1024]);
        put(3, jblock(5, 8, &revoke32(&[51])));
        put(4, jblock(2, 8, &[]));
        // Transaction 9, never committed: block 53, and revokes 50 and 52.
        put(5, jblock(5, 9, &revoke32(&[50, 52])));
        put(6, jblock(1, 9, &tags32(&[(53, 0)])));
        put(7, vec![0xE4; 1024]);
        let read = reader(&disk);
        let fs = on_disk(&read);
        let log = JournalLog {
            tag_bytes: 8,
            bit64: false,
            tail: 0,
            first: 1,
            csum: None,
            crc32: false,
        };
        let map = fs.kernel_replay(&journal, 7, 8, &log).unwrap();
        let got: Vec<(u64, (u64, bool))> = map.into_iter().collect();
        assert_eq!(got, vec![(50, (109, true)), (52, (102, false))]);
        // Read through it: the escaped block gets the magic back, the rest of
        // the disk reads as it is.
        let replayed = Replayed {
            map: fs.kernel_replay(&journal, 7, 8, &log).unwrap(),
            block: 1024,
            superblock: None,
        };
        let mut b = vec![0u8; 3 * 1024];
        replayed.read_at(&read, 50 * 1024, &mut b).unwrap();
        assert_eq!(b[..4], JBD2_MAGIC.to_be_bytes());
        assert!(b[4..1024].iter().all(|&x| x == 0xE1));
        assert!(
            b[1024..2048].iter().all(|&x| x == 0),
            "a revoked block replayed"
        );
        assert!(b[2048..].iter().all(|&x| x == 0xE3));
        // A read that starts inside the escaped bytes.
        let mut b = [0u8; 4];
        replayed.read_at(&read, 50 * 1024 + 2, &mut b).unwrap();
        assert_eq!(b, [0x39, 0x98, 0xE1, 0xE1]);
        // A log with nothing to replay (start 0), and one whose first block is
        // not of the expected sequence.
        assert!(fs.kernel_replay(&journal, 7, 0, &log).unwrap().is_empty());
        assert!(fs.kernel_replay(&journal, 6, 8, &log).unwrap().is_empty());
        // A revocation block counting past its block is damage (the kernel
        // refuses to mount).
        let mut disk = vec![vec![0u8; 1024]; 200];
        disk[journal[8] as usize] = jblock(5, 7, &2000u32.to_be_bytes());
        let read = reader(&disk);
        assert!(on_disk(&read).kernel_replay(&journal, 7, 8, &log).is_err());
    }

    /// Checksums v3 as jbd2 writes them: a logged block that does not match
    /// its tag's checksum in a committed transaction is damage; a commit block
    /// whose checksum fails ends the log before its transaction; a descriptor
    /// whose checksum fails is damage once its transaction is committed.
    #[test]
    fn journal_checksums_are_checked_as_the_kernel_checks_them() {
        let seed = crc32c_raw(!0, &[&[0x42; 16]]);
        let log = JournalLog {
            tag_bytes: 16,
            bit64: true,
            tail: 4,
            first: 1,
            csum: Some((seed, true)),
            crc32: false,
        };
        let journal: Vec<u64> = (100..112).collect();
        let data = |fill: u8| vec![fill; 1024];
        // Transaction `seq` at journal block `at`: a descriptor logging
        // `target`, its data, a commit block; each checksum as written.
        let transaction = |disk: &mut Vec<Vec<u8>>, at: usize, seq: u32, target: u32, fill: u8| {
            let mut tag = target.to_be_bytes().to_vec();
            tag.extend_from_slice(&(8u32 | 2).to_be_bytes());
            tag.extend_from_slice(&0u32.to_be_bytes());
            let sum = crc32c_raw(seed, &[&seq.to_be_bytes(), &data(fill)]);
            tag.extend_from_slice(&sum.to_be_bytes());
            let mut d = jblock(1, seq, &tag);
            let tail = crc32c_raw(seed, &[&d[..1020], &[0; 4]]);
            d[1020..].copy_from_slice(&tail.to_be_bytes());
            let mut c = jblock(2, seq, &[]);
            let sum = crc32c_raw(seed, &[&c]);
            c[16..20].copy_from_slice(&sum.to_be_bytes());
            disk[journal[at] as usize] = d;
            disk[journal[at + 1] as usize] = data(fill);
            disk[journal[at + 2] as usize] = c;
        };
        let mut disk = vec![vec![0u8; 1024]; 200];
        transaction(&mut disk, 1, 7, 50, 0xA1);
        transaction(&mut disk, 4, 8, 51, 0xA2);
        let replay = |disk: &Vec<Vec<u8>>| {
            let read = reader(disk);
            on_disk(&read).kernel_replay(&journal, 7, 1, &log)
        };
        let whole = replay(&disk).unwrap();
        assert_eq!(whole.keys().copied().collect::<Vec<_>>(), vec![50, 51]);
        // The second commit block's checksum fails: the log ends before it.
        let mut torn = disk.clone();
        torn[journal[6] as usize][40] ^= 1;
        assert_eq!(
            replay(&torn).unwrap().keys().copied().collect::<Vec<_>>(),
            vec![50]
        );
        // Unless it fails past its header: written in part, taken as a commit.
        let mut partly = disk.clone();
        partly[journal[6] as usize][100] ^= 1;
        assert_eq!(
            replay(&partly).unwrap().keys().copied().collect::<Vec<_>>(),
            vec![50, 51]
        );
        // And a transaction logged after it is replayed.
        let mut after = partly.clone();
        transaction(&mut after, 7, 9, 52, 0xA3);
        let got = replay(&after).unwrap();
        assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![50, 51, 52]);
        // A logged block damaged in a committed transaction.
        let mut damaged = disk.clone();
        damaged[journal[2] as usize][7] ^= 1;
        let e = replay(&damaged).unwrap_err();
        assert!(e.contains("fails its checksum"), "{e}");
        // A damaged descriptor of a committed transaction.
        let mut damaged = disk.clone();
        damaged[journal[4] as usize][500] ^= 1;
        let e = replay(&damaged).unwrap_err();
        assert!(e.contains("journal block 4: its checksum fails"), "{e}");
        // A damaged descriptor followed by a commit older than the last one:
        // stale blocks of an earlier use of the journal, the log ends there.
        let set_time = |disk: &mut Vec<Vec<u8>>, at: usize, time: u64| {
            let c = &mut disk[journal[at] as usize];
            c[48..56].copy_from_slice(&time.to_be_bytes());
            c[16..20].fill(0);
            let sum = crc32c_raw(seed, &[&c[..]]);
            c[16..20].copy_from_slice(&sum.to_be_bytes());
        };
        let mut stale = disk.clone();
        set_time(&mut stale, 3, 100);
        set_time(&mut stale, 6, 50);
        stale[journal[4] as usize][500] ^= 1;
        assert_eq!(
            replay(&stale).unwrap().keys().copied().collect::<Vec<_>>(),
            vec![50]
        );
        // A block logged outside the filesystem (200 blocks).
        let mut outside = vec![vec![0u8; 1024]; 200];
        transaction(&mut outside, 1, 7, 5000, 0xA1);
        let e = replay(&outside).unwrap_err();
        assert!(e.contains("outside the filesystem"), "{e}");
    }

    /// Reads 1 KiB blocks `disk`.
    fn reader(disk: &[Vec<u8>]) -> impl Fn(u64, &mut [u8]) -> Result<(), String> + '_ {
        |at: u64, dst: &mut [u8]| {
            let (blk, within) = ((at / 1024) as usize, (at % 1024) as usize);
            let b = disk.get(blk).ok_or("past the disk")?;
            dst.copy_from_slice(&b[within..within + dst.len()]);
            Ok(())
        }
    }

    /// A filesystem of 200 blocks of 1 KiB read by `read` (for its journal).
    fn on_disk<'a>(read: &'a ReadAt<'a>) -> Ext2<'a> {
        Ext2 {
            read,
            block: 1024,
            blocks: 200,
            inodes: 0,
            per_group: 1,
            inode_size: 256,
            desc_size: 32,
            desc_start: 2048,
            journal: Default::default(),
        }
    }

    /// The superblock given to `ext4-view` asks for no recovery, and its
    /// checksum holds (CRC32C of the first 1020 bytes, as ext4 stores it).
    #[test]
    fn the_recovered_superblock_keeps_a_valid_checksum() {
        let mut sb = vec![0u8; 1024];
        sb[96..100].copy_from_slice(&(INCOMPAT_RECOVER | 0x40).to_le_bytes());
        sb[0x64..0x68].copy_from_slice(&RO_COMPAT_METADATA_CSUM.to_le_bytes());
        let r = recovered(&sb);
        assert_eq!(u32_at(&r, 96), 0x40);
        // CRC32C("123456789") is 0xE3069283: the algorithm is the right one.
        const CRC32C: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);
        assert_eq!(CRC32C.checksum(b"123456789"), 0xE306_9283);
        assert_eq!(u32_at(&r, 0x3FC), !CRC32C.checksum(&r[..0x3FC]));
        // Without metadata checksums, the checksum field is left alone.
        sb[0x64..0x68].copy_from_slice(&0u32.to_le_bytes());
        sb[0x3FC..].copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(recovered(&sb)[0x3FC..], [1, 2, 3, 4]);
    }

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
