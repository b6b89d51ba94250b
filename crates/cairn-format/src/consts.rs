//! Frozen format constants. DO NOT MODIFY the values of a released format version:
//! repositories written by it must keep opening. Add new constants instead.

/// Repository format version written by this code (the `version` field of `config`).
pub const REPO_FORMAT_VERSION: u32 = 1;

/// Format features (names in the config's `features` list) this code implements.
/// A repository listing any other name is refused: it was written under rules this
/// code does not know. A change that old readers would misread adds its name here and
/// to docs/FORMAT.md.
pub const KNOWN_FEATURES: &[&str] = &[FEATURE_ADMIN_NAMES];

/// Feature: objects that can remove or hide data from readers carry `admin-` in
/// their names — index files with `supersedes` or `forgotten` lists
/// (`index/admin-<id>`) and exclusive locks (`locks/admin-<id>`) — and readers
/// honour those lists and that exclusivity only under such a name. A server can then
/// tell, without the key, what an append-only client must not write. Every
/// repository created since 2026-11-25 has it.
pub const FEATURE_ADMIN_NAMES: &str = "admin-names";

/// Length of every object and blob id in bytes (BLAKE3 output size).
pub const ID_LEN: usize = 32;

/// Random prefix of a sealed envelope: the first 12 bytes derive a per-object subkey,
/// the last 12 bytes are the AEAD nonce (see `envelope`).
pub const ENVELOPE_NONCE_LEN: usize = 24;
/// AEAD tag (AES-256-GCM and ChaCha20-Poly1305 both use 16 bytes); for unencrypted
/// repositories the same 16 bytes hold a truncated keyed BLAKE3 checksum.
pub const ENVELOPE_TAG_LEN: usize = 16;
/// Bytes a sealed object is larger than its plaintext.
pub const ENVELOPE_OVERHEAD: usize = ENVELOPE_NONCE_LEN + ENVELOPE_TAG_LEN;

/// Magic at the very end of every pack file, after the header length.
pub const PACK_TRAILER_MAGIC: &[u8; 8] = b"CAIRNPK1";
/// Trailer = header length (u32 LE) || magic.
pub const PACK_TRAILER_LEN: usize = 4 + PACK_TRAILER_MAGIC.len();
/// One pack header entry: kind (1) || id (32) || length (4) || raw length (4) || compression (1).
pub const PACK_HEADER_ENTRY_LEN: usize = 1 + ID_LEN + 4 + 4 + 1;
/// Version byte at the start of a pack header plaintext.
pub const PACK_HEADER_VERSION: u8 = 1;
/// Hard cap on blobs in one pack (a 64 MiB pack of 64-byte blobs is 1 Mi entries).
pub const MAX_PACK_BLOBS: usize = 1 << 20;
/// Hard cap on a pack file's size: packs are written at about `DEFAULT_PACK_SIZE`,
/// a single blob can exceed it by one maximum chunk.
pub const MAX_PACK_SIZE: u64 = 1 << 30;
/// Target size of a data pack before it is sealed and uploaded.
pub const DEFAULT_PACK_SIZE: usize = 16 << 20;

/// Hard cap on the plaintext of any single blob. Chunks are at most 4 × 64 KiB and
/// chunk lists about 144 KiB; the cap is set by tree blobs of very large directories
/// (about 100 bytes per entry: 64 MiB is over 500,000 entries in one directory).
pub const MAX_BLOB_SIZE: usize = 64 << 20;
/// Hard cap on a blob's stored (sealed) length: its plaintext, compressed only when
/// that makes it smaller, plus the envelope; the rest is slack.
pub const MAX_SEALED_BLOB_LEN: usize = MAX_BLOB_SIZE + 1024;
/// Hard cap on snapshot objects (and on any metadata object's decoder).
pub const MAX_METADATA_OBJECT_SIZE: usize = 256 << 20;
/// Hard cap on config, key file and lock objects: each is under 2 KiB, and they
/// are read before anything else (a lock by every operation), so a hostile giant
/// must cost nothing.
pub const MAX_SMALL_OBJECT_SIZE: usize = 1 << 20;
/// Hard cap on a lock a server stores: a sealed lock is a few hundred bytes (its
/// longest fields are a host and a user name), so this leaves room for any
/// honest one and keeps a hijacked client's locks, which every operation that
/// waits for others reads, small.
pub const MAX_LOCK_SIZE: usize = 64 << 10;
/// Hard cap on an index file: cairn writes them at about 200,000 blobs (9 MB);
/// this is 20 million.
pub const MAX_INDEX_FILE_SIZE: usize = 1 << 30;
/// The largest index file cairn writes under a plain name, with room to spare:
/// writers start a new file after 200,000 blobs, so one holds at most that plus
/// the last pack's (at most [`MAX_PACK_BLOBS`], about 49 bytes each: 59 MB) and
/// its snapshot records. A cairn server takes no larger plain index file, and its
/// backup clients read none larger, so junk a hijacked client stores under that
/// kind costs each of them at most this much.
pub const MAX_WRITTEN_INDEX_FILE_SIZE: usize = 128 << 20;
/// Hard cap on a pending-deletion record when read. Prune writes them at 500,000
/// entries (a pack never split, so tens of MB) and a server takes none larger than
/// an index file, but a prune before the split wrote one record for everything it
/// retired, so readers allow more than writers may write.
pub const MAX_PENDING_RECORD_SIZE: u64 = 4 << 30;

/// Version byte at the start of an index file plaintext.
pub const INDEX_VERSION: u8 = 1;
/// Index files that also record committed and forgotten snapshots.
pub const INDEX_VERSION_SNAPSHOTS: u8 = 2;
/// Version byte at the start of a tree blob plaintext.
pub const TREE_VERSION: u8 = 1;
/// A tree whose nodes end with their inode flags ([`INODE_FLAGS`]): written only
/// for a directory holding an entry with such a flag set, so every other tree is
/// byte for byte what version 1 writes (and deduplicates with it).
pub const TREE_VERSION_FLAGS: u8 = 2;
/// The Linux inode flags (`chattr`, `FS_IOC_GETFLAGS`) a snapshot keeps, with the
/// letter `lsattr` shows for each, in its order: `s` secure deletion, `u`
/// undeletable, `S` synchronous updates, `D` synchronous directory updates, `i`
/// immutable, `a` append only, `d` no dump, `A` no atime updates. The others are
/// the file system's own (extents, inline data, encryption, casefolding) or mean
/// nothing once the data is written (no copy-on-write, compression), and are
/// neither stored nor set.
pub const INODE_FLAG_LETTERS: [(u32, char); 8] = [
    (0x0000_0001, 's'), // FS_SECRM_FL
    (0x0000_0002, 'u'), // FS_UNRM_FL
    (0x0000_0008, 'S'), // FS_SYNC_FL
    (0x0001_0000, 'D'), // FS_DIRSYNC_FL
    (0x0000_0010, 'i'), // FS_IMMUTABLE_FL
    (0x0000_0020, 'a'), // FS_APPEND_FL
    (0x0000_0040, 'd'), // FS_NODUMP_FL
    (0x0000_0080, 'A'), // FS_NOATIME_FL
];
/// All of [`INODE_FLAG_LETTERS`]' bits.
pub const INODE_FLAGS: u32 = {
    let mut flags = 0;
    let mut i = 0;
    while i < INODE_FLAG_LETTERS.len() {
        flags |= INODE_FLAG_LETTERS[i].0;
        i += 1;
    }
    flags
};
/// The inode flags that stop an entry from being changed, replaced or removed,
/// and a directory's entries from being added or removed: `i` and `a` (setting
/// or clearing them needs root).
pub const LOCKING_INODE_FLAGS: u32 = 0x10 | 0x20;
/// Version byte at the start of a chunk-list blob plaintext.
pub const CHUNK_LIST_VERSION: u8 = 1;
/// A file with at most this many chunks lists them inline in its tree node; larger files
/// reference a tree of chunk-list blobs.
pub const INLINE_CHUNKS_MAX: usize = 64;
/// Entries per chunk-list blob (36 bytes each: about 144 KiB of plaintext).
pub const CHUNK_LIST_FANOUT: usize = 4096;
/// Deepest chunk-list tree accepted (4096^6 chunks is far beyond any file).
pub const MAX_CHUNK_LIST_DEPTH: u8 = 6;
/// Hard cap on names, link targets, user/group names and xattr names.
pub const MAX_NAME_LEN: usize = 64 << 10;
/// Hard cap on one extended attribute value.
pub const MAX_XATTR_VALUE_LEN: usize = 16 << 20;
/// Hard cap on extended attributes of one node (Linux allows 64 KiB of names per
/// file, so real files have far fewer).
pub const MAX_XATTRS: usize = 1 << 16;

/// Argon2id defaults for new keys (OWASP-style: 64 MiB, 3 passes).
pub const KDF_DEFAULT_MEMORY_KIB: u32 = 64 * 1024;
pub const KDF_DEFAULT_ITERATIONS: u32 = 3;
pub const KDF_DEFAULT_PARALLELISM: u32 = 1;
/// Upper bounds accepted from a key file, so a hostile key file cannot make us
/// allocate or spin without limit.
pub const KDF_MAX_MEMORY_KIB: u32 = 4 * 1024 * 1024;
pub const KDF_MAX_ITERATIONS: u32 = 100;
pub const KDF_MAX_PARALLELISM: u32 = 64;

/// Block sizes (average chunk sizes) a repository may be created with.
pub const BLOCK_SIZES: [u32; 5] = [4096, 8192, 16384, 32768, 65536];
/// Default average chunk size.
pub const DEFAULT_BLOCK_SIZE: u32 = 16384;

/// Context strings for BLAKE3 key derivation from the 32-byte master secret.
pub const KDF_CONTEXT_ENCRYPTION: &str = "cairn 2026-11 v1 encryption key";
pub const KDF_CONTEXT_ID: &str = "cairn 2026-11 v1 blob id key";
pub const KDF_CONTEXT_MAC: &str = "cairn 2026-11 v1 mac key";
pub const KDF_CONTEXT_CHUNKER: &str = "cairn 2026-11 v1 chunker seed";
