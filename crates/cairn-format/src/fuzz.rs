//! Structure-aware fuzzing of every decoder of repository bytes (test builds only).
//!
//! Random bytes die at the version byte, so every case starts from a *valid*
//! encoding of a generated value and mutates it where it hurts: the integer fields the
//! decoder itself read (found with [`crate::wire::trace`]) are overwritten with
//! boundary values, byte runs are cut, inserted, duplicated and spliced from another
//! valid encoding, version bytes change, and JSON objects are mutated as trees. For
//! sealed objects most cases mutate the *plaintext* and seal it again with the right
//! key, so the mutation reaches the parser instead of failing authentication.
//!
//! For every input each decoder must return a value or an error, never panic, and
//! never allocate more than `64 × input + 1 MiB` while decoding (a counting global
//! allocator measures the peak per thread): lengths are checked against the
//! remaining input before anything is allocated. A value it returns must survive
//! re-encoding (decode ∘ encode is the identity on it), and an envelope that opens
//! must be exactly what sealing its plaintext with its nonce gives.
//!
//! `cargo test` runs a fixed number of cases per decoder from a fixed seed (a few
//! seconds, reproducible). `scripts/fuzz.sh` runs longer, in release mode:
//!
//! - `CAIRN_FUZZ_SECS`: seconds per decoder instead of the fixed case count;
//! - `CAIRN_FUZZ_SEED`: the run's seed (decimal or `0x` hex);
//! - `CAIRN_FUZZ_CASE`: run only this case number (what a failure prints).

use crate::config::{ChunkerParams, Compression, Config, IndexPlacement};
use crate::consts::*;
use crate::dedup::DedupList;
use crate::envelope::{Encryption, Sealer};
use crate::index::{IndexBlob, IndexFile, IndexPack};
use crate::json::UnknownFields;
use crate::key::{KdfParams, KeyFile, MasterKey};
use crate::lock::Lock;
use crate::pack::{self, BlobCompression, BlobKind, PackEntry};
use crate::pending::PendingDeletion;
use crate::snapshot::{CopiedFrom, Snapshot, SnapshotSummary};
use crate::tree::{ChunkList, ChunkRef, Content, Node, NodeKind, Timestamp, Tree};
use crate::wire::trace::{self, Field, FieldKind};
use crate::wire::{Reader, Writer};
use crate::{BlobId, FormatError, IndexId, PackId, SnapshotId};
use serde_json::Value;
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------
// Allocation accounting

/// Counts the bytes live on the current thread while [`measure`] runs, and their
/// peak. Per thread, so tests running beside each other do not disturb it.
struct CountingAllocator;

thread_local! {
    static MEASURING: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn grew(n: usize) {
    let _ = MEASURING.try_with(|m| {
        if m.get() {
            let live = LIVE.with(|l| {
                let v = l.get().saturating_add(n);
                l.set(v);
                v
            });
            PEAK.with(|p| p.set(p.get().max(live)));
        }
    });
}

fn shrank(n: usize) {
    let _ = MEASURING.try_with(|m| {
        if m.get() {
            LIVE.with(|l| l.set(l.get().saturating_sub(n)));
        }
    });
}

#[allow(unsafe_code)]
// SAFETY: every method forwards to the system allocator with the caller's arguments
// unchanged and only updates thread-local counters (const-initialised `Cell`s, which
// never allocate or register destructors) after it returns.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { std::alloc::System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { std::alloc::System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: same contract as ours.
        unsafe { std::alloc::System.dealloc(ptr, layout) };
        shrank(layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { std::alloc::System.realloc(ptr, layout, new) };
        if !p.is_null() {
            if new >= layout.size() {
                grew(new - layout.size());
            } else {
                shrank(layout.size() - new);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Runs `f` and returns its result and the peak of bytes it held at once.
fn measure<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    MEASURING.with(|m| m.set(true));
    let out = f();
    MEASURING.with(|m| m.set(false));
    (out, PEAK.with(|p| p.get()))
}

/// What a decoder may allocate for an input: a constant for small inputs, and a
/// generous multiple of the input (decoded structures are larger than their bytes).
fn allocation_bound(input_len: usize) -> usize {
    64 * input_len + (1 << 20)
}

// ---------------------------------------------------------------------------------
// Deterministic randomness

/// SplitMix64: tiny, fast and the same everywhere, so a seed reproduces a case.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed)
    }
    fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.u64() % n as u64) as usize
    }
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }
    /// True with probability `1/n`.
    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
    fn u32(&mut self) -> u32 {
        self.u64() as u32
    }
    fn byte(&mut self) -> u8 {
        self.u64() as u8
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        for b in &mut out {
            *b = self.byte();
        }
        out
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
    /// A number that is often at an edge: small, a power of two or just off one,
    /// or the top of its type.
    fn edgy_u64(&mut self) -> u64 {
        match self.below(4) {
            0 => self.below(300) as u64,
            1 => {
                let p = 1u64 << self.below(64);
                p.wrapping_add(self.pick(&[0u64, 1, u64::MAX]))
            }
            2 => self.pick(&[0, 1, u64::from(u32::MAX), u64::MAX, i64::MAX as u64]),
            _ => self.u64(),
        }
    }
    fn edgy_u32(&mut self) -> u32 {
        if self.one_in(2) {
            self.edgy_u64() as u32
        } else {
            self.u32()
        }
    }
    /// Text that stresses JSON escaping and UTF-8 handling.
    fn text(&mut self, max: usize) -> String {
        const PIECES: &[&str] = &[
            "a", "Z", "0", "/", ".", "-", "_", " ", "\"", "\\", "\n", "\t", "\u{0}", "\u{1f}", "é",
            "ü", "日本", "\u{2028}", "\u{feff}", "🦀", "{", "}", "[", "]", ":", ",",
        ];
        let n = self.below(max + 1);
        (0..n).map(|_| self.pick(PIECES)).collect()
    }
    fn hex_id(&mut self) -> String {
        hex::encode(self.array::<32>())
    }
}

// ---------------------------------------------------------------------------------
// Generators of valid values

fn gen_timestamp(rng: &mut Rng) -> Timestamp {
    Timestamp {
        secs: rng.edgy_u64() as i64,
        nanos: if rng.one_in(3) {
            rng.pick(&[0, 1, 999_999_999])
        } else {
            rng.below(1_000_000_000) as u32
        },
    }
}

fn gen_chunk_refs(rng: &mut Rng, max: usize) -> Vec<ChunkRef> {
    let n = if rng.one_in(8) {
        max
    } else {
        rng.below(max.min(12) + 1)
    };
    (0..n)
        .map(|_| ChunkRef {
            id: BlobId(rng.array()),
            length: rng.edgy_u64(),
        })
        .collect()
}

fn gen_name(rng: &mut Rng) -> Vec<u8> {
    loop {
        let longest = if rng.one_in(20) { 300 } else { 12 };
        let n = rng.range(1, longest);
        let name: Vec<u8> = (0..n)
            .map(|_| match rng.below(4) {
                0 => rng.pick(b"abcxyz.-_ "),
                1 => rng.range(0x80, 0xff) as u8, // not UTF-8 on its own
                _ => rng.range(1, 0x7f) as u8,
            })
            .filter(|&b| b != b'/' && b != 0)
            .collect();
        if Node::name_is_safe(&name) {
            return name;
        }
    }
}

fn gen_node(rng: &mut Rng, name: Vec<u8>) -> Node {
    let kind = NodeKind::from_u8(rng.below(7) as u8).unwrap_or(NodeKind::File);
    let mut n = Node::new(name, kind);
    n.mode = rng.edgy_u32();
    n.uid = rng.edgy_u32();
    n.gid = rng.edgy_u32();
    n.user = rng.text(8);
    n.group = rng.text(8);
    n.mtime = gen_timestamp(rng);
    n.atime = gen_timestamp(rng);
    n.ctime = gen_timestamp(rng);
    n.inode = rng.edgy_u64();
    n.dev = rng.edgy_u64();
    n.nlink = rng.edgy_u64();
    n.size = rng.edgy_u64();
    n.rdev = rng.edgy_u64();
    if kind == NodeKind::Symlink || rng.one_in(10) {
        let len = rng.below(40);
        n.link_target = rng.bytes(len);
    }
    let nx = if rng.one_in(3) { rng.below(4) } else { 0 };
    n.xattrs = (0..nx)
        .map(|_| {
            let klen = rng.below(20);
            let vlen = if rng.one_in(10) { 3000 } else { rng.below(30) };
            (rng.bytes(klen), rng.bytes(vlen))
        })
        .collect();
    // Content belongs to files, but the decoder accepts it on any node.
    let choice = if kind == NodeKind::File || rng.one_in(10) {
        rng.below(3)
    } else {
        0
    };
    n.content = match choice {
        0 => Content::None,
        1 => Content::Inline(gen_chunk_refs(rng, INLINE_CHUNKS_MAX)),
        _ => Content::Tree {
            root: BlobId(rng.array()),
            depth: rng.range(1, MAX_CHUNK_LIST_DEPTH.into()) as u8,
            chunks: rng.edgy_u64(),
        },
    };
    n.subtree = (kind == NodeKind::Dir).then(|| BlobId(rng.array()));
    n
}

fn gen_tree(rng: &mut Rng) -> Tree {
    let count = if rng.one_in(10) {
        rng.below(60)
    } else {
        rng.below(6)
    };
    let mut names: Vec<Vec<u8>> = (0..count).map(|_| gen_name(rng)).collect();
    names.sort();
    names.dedup();
    Tree {
        nodes: names.into_iter().map(|n| gen_node(rng, n)).collect(),
    }
}

fn gen_chunk_list(rng: &mut Rng) -> ChunkList {
    let most = if rng.one_in(10) { 300 } else { 20 };
    ChunkList {
        level: rng.below(MAX_CHUNK_LIST_DEPTH.into()) as u8,
        entries: gen_chunk_refs(rng, most),
    }
}

fn gen_index_blob(rng: &mut Rng) -> IndexBlob {
    let length = rng.range(1, MAX_BLOB_SIZE + 1024) as u32;
    let offset = rng.below((MAX_PACK_SIZE - u64::from(length)) as usize + 1) as u32;
    IndexBlob {
        kind: BlobKind::from_u8(rng.below(3) as u8).unwrap_or(BlobKind::Data),
        id: BlobId(rng.array()),
        offset: if rng.one_in(3) { 0 } else { offset },
        length: if rng.one_in(3) {
            rng.range(1, 200) as u32
        } else {
            length
        },
        raw_length: rng.below(MAX_BLOB_SIZE + 1) as u32,
        compression: if rng.one_in(2) {
            BlobCompression::Zstd
        } else {
            BlobCompression::Raw
        },
    }
}

fn gen_index_packs(rng: &mut Rng) -> Vec<IndexPack> {
    (0..rng.below(4))
        .map(|_| {
            let most = if rng.one_in(8) { 100 } else { 6 };
            IndexPack {
                id: PackId(rng.array()),
                blobs: (0..rng.below(most)).map(|_| gen_index_blob(rng)).collect(),
            }
        })
        .collect()
}

fn gen_ids<T>(rng: &mut Rng, max: usize, f: fn([u8; 32]) -> T) -> Vec<T> {
    (0..rng.below(max + 1)).map(|_| f(rng.array())).collect()
}

fn gen_index(rng: &mut Rng) -> IndexFile {
    let v2 = rng.one_in(2);
    IndexFile {
        supersedes: gen_ids(rng, 3, IndexId),
        packs: gen_index_packs(rng),
        snapshots: if v2 {
            gen_ids(rng, 3, SnapshotId)
        } else {
            vec![]
        },
        forgotten: if v2 {
            gen_ids(rng, 3, SnapshotId)
        } else {
            vec![]
        },
    }
}

fn gen_pending(rng: &mut Rng) -> PendingDeletion {
    PendingDeletion {
        created: rng.edgy_u64() as i64,
        locks: gen_ids(rng, 3, |a| a),
        packs: gen_index_packs(rng),
        orphans: gen_ids(rng, 3, PackId),
    }
}

fn gen_pack_entries(rng: &mut Rng) -> Vec<PackEntry> {
    let most = if rng.one_in(8) { 200 } else { 8 };
    (0..rng.below(most))
        .map(|_| PackEntry {
            kind: BlobKind::from_u8(rng.below(3) as u8).unwrap_or(BlobKind::Data),
            id: BlobId(rng.array()),
            length: rng.range(ENVELOPE_OVERHEAD, 400) as u32,
            raw_length: rng.below(MAX_BLOB_SIZE + 1) as u32,
            compression: if rng.one_in(2) {
                BlobCompression::Zstd
            } else {
                BlobCompression::Raw
            },
        })
        .collect()
}

fn gen_config(rng: &mut Rng) -> Config {
    let encryption = rng.pick(&[
        Encryption::Aes256Gcm,
        Encryption::ChaCha20Poly1305,
        Encryption::None,
    ]);
    let mut chunker = ChunkerParams::for_block_size(rng.pick(&BLOCK_SIZES));
    chunker.normalization = rng.below(4) as u32;
    let mut unknown_fields = UnknownFields::default();
    if rng.one_in(3) {
        let value = match rng.below(4) {
            0 => "true".to_string(),
            1 => rng.u64().to_string(),
            2 => serde_json::to_string(&rng.text(10)).unwrap_or_default(),
            _ => r#"{"nested": [1, {"x": null}], "s": "\u00e9"}"#.to_string(),
        };
        if let Err(e) = unknown_fields.insert("zz_newer_setting", &value) {
            panic!("generated JSON {value:?} is invalid: {e}");
        }
    }
    Config {
        version: REPO_FORMAT_VERSION,
        id: rng.hex_id(),
        created: rng.text(30),
        encryption,
        chunker,
        compression: rng.pick(&[Compression::None, Compression::Standard, Compression::Max]),
        pack_size: rng.range(1 << 20, 256 << 20) as u32,
        max_concurrent_jobs: rng.range(1, 1024) as u32,
        index_placement: rng.pick(&[IndexPlacement::Ram, IndexPlacement::Ssd]),
        index_path: rng.one_in(2).then(|| rng.text(20)),
        memory_limit: rng.one_in(2).then(|| rng.u64()),
        plain_master_secret: (encryption == Encryption::None).then(|| rng.hex_id()),
        features: vec![],
        unknown_fields,
    }
}

fn gen_snapshot(rng: &mut Rng) -> Snapshot {
    let strings = |rng: &mut Rng, n: usize| (0..rng.below(n + 1)).map(|_| rng.text(20)).collect();
    Snapshot {
        version: 1,
        time: rng.text(35),
        utc_offset: None,
        hostname: rng.text(20),
        username: rng.text(10),
        paths: strings(rng, 4),
        tags: strings(rng, 3),
        tree: rng.hex_id(),
        parent: rng.one_in(2).then(|| rng.hex_id()),
        excludes: strings(rng, 3),
        original: rng.one_in(4).then(|| rng.hex_id()),
        copied_from: rng.one_in(3).then(|| CopiedFrom {
            repository: rng.hex_id(),
            snapshot: rng.hex_id(),
        }),
        program_version: rng.text(15),
        image: None,
        summary: SnapshotSummary {
            files_new: rng.edgy_u64(),
            files_changed: rng.edgy_u64(),
            files_unchanged: rng.edgy_u64(),
            dirs: rng.edgy_u64(),
            other_entries: rng.edgy_u64(),
            entries_skipped: rng.edgy_u64(),
            bytes_read: rng.edgy_u64(),
            total_bytes: rng.edgy_u64(),
            blobs_added: rng.edgy_u64(),
            data_added: rng.edgy_u64(),
            data_added_packed: rng.edgy_u64(),
            duration_secs: match rng.below(3) {
                0 => 0.0,
                1 => rng.below(100_000) as f64 / 1000.0,
                _ => f64::from_bits(rng.u64() >> 2),
            },
            entries_with_acl: rng.one_in(2).then(|| rng.edgy_u64()),
            dirs_new: rng.one_in(2).then(|| rng.edgy_u64()),
            dirs_changed: rng.one_in(2).then(|| rng.edgy_u64()),
            dirs_unchanged: rng.one_in(2).then(|| rng.edgy_u64()),
        },
    }
}

fn gen_lock(rng: &mut Rng) -> Lock {
    Lock {
        version: 1,
        operation: rng
            .pick(&["backup", "read", "prune", "repair", "copy"])
            .into(),
        exclusive: rng.one_in(2),
        hostname: rng.text(20),
        username: rng.text(10),
        pid: rng.edgy_u32(),
        boot_id: rng.text(36),
        pid_namespace: rng.text(12),
        created: rng.text(30),
        refreshed: rng.edgy_u64() as i64,
    }
}

const PASSWORD: &[u8] = b"fuzz password";

/// Argon2 parameters cheap enough to unwrap a key file in every case.
fn cheap_kdf(rng: &mut Rng) -> KdfParams {
    KdfParams {
        algorithm: "argon2id".into(),
        memory_kib: rng.pick(&[8, 16, 64]),
        iterations: rng.range(1, 2) as u32,
        parallelism: 1,
        salt: {
            let len = rng.pick(&[8, 16, 32]);
            hex::encode(rng.bytes(len))
        },
    }
}

fn kdf_is_cheap(k: &KdfParams) -> bool {
    k.memory_kib <= 256 && k.iterations <= 2 && k.parallelism <= 2
}

fn gen_key_file(rng: &mut Rng) -> KeyFile {
    let enc = rng.pick(&[
        Encryption::Aes256Gcm,
        Encryption::ChaCha20Poly1305,
        Encryption::None,
    ]);
    let master = MasterKey::from_secret(rng.array(), enc);
    let kdf = cheap_kdf(rng);
    let mut kf = KeyFile::wrap_with_nonce(
        &master,
        PASSWORD,
        kdf.clone(),
        rng.text(30),
        rng.text(20),
        rng.text(10),
        rng.array(),
    )
    .unwrap_or_else(|e| panic!("wrapping a generated key: {e}"));
    if rng.one_in(5) {
        // A sealed "secret" of the wrong length, under the right password: only the
        // length check stands between it and a master key.
        let wrapping = kdf
            .derive(PASSWORD)
            .unwrap_or_else(|e| panic!("deriving a generated key: {e}"));
        let len = rng.pick(&[0, 1, 31, 33, 64]);
        let bogus = rng.bytes(len);
        kf.data =
            hex::encode(Sealer::new(kf.encryption, wrapping).seal_with_nonce(rng.array(), &bogus));
    }
    kf
}

// ---------------------------------------------------------------------------------
// Mutation

/// Values a length, count or integer field is most likely to be mishandled at.
fn boundary_value(rng: &mut Rng, input_len: usize, original: u64) -> u64 {
    let n = input_len as u64;
    rng.pick(&[
        0,
        1,
        2,
        0x7f,
        0x80,
        0xff,
        0x3fff,
        0x4000,
        63,
        64,
        4095,
        4096,
        4097,
        65_536,
        (1 << 20) - 1,
        1 << 20,
        (1 << 20) + 1,
        MAX_BLOB_SIZE as u64,
        MAX_BLOB_SIZE as u64 + 1,
        MAX_BLOB_SIZE as u64 + 1025,
        MAX_PACK_SIZE,
        MAX_PACK_SIZE + 1,
        999_999_999,
        1_000_000_000,
        u64::from(u32::MAX) - 1,
        u64::from(u32::MAX),
        u64::from(u32::MAX) + 1,
        i64::MAX as u64,
        u64::MAX - 1,
        u64::MAX,
        n.saturating_sub(1),
        n,
        n + 1,
        n / 36,
        n / 24,
        original.wrapping_add(1),
        original.wrapping_sub(1),
        original.wrapping_mul(2),
    ])
}

fn leb128(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

fn read_leb128(b: &[u8]) -> u64 {
    let mut v = 0u64;
    for (i, x) in b.iter().enumerate().take(10) {
        v |= u64::from(x & 0x7f).wrapping_shl(7 * i as u32);
    }
    v
}

/// Overwrites a field the decoder read with an edge value of its kind.
fn mutate_field(rng: &mut Rng, data: &mut Vec<u8>, f: Field) {
    let end = f.offset + f.len;
    if end > data.len() {
        return;
    }
    let replacement = match f.kind {
        FieldKind::U8 => {
            let old = data[f.offset];
            vec![rng.pick(&[
                0,
                1,
                2,
                3,
                6,
                7,
                0x7f,
                0x80,
                0xfe,
                0xff,
                old.wrapping_add(1),
                old.wrapping_sub(1),
            ])]
        }
        FieldKind::U32 => {
            let mut old = [0u8; 4];
            old.copy_from_slice(&data[f.offset..end]);
            let v = boundary_value(rng, data.len(), u32::from_le_bytes(old).into());
            (v as u32).to_le_bytes().to_vec()
        }
        FieldKind::Varint => match rng.below(8) {
            // Non-minimal and over-long encodings.
            0 => {
                let mut v = leb128(read_leb128(&data[f.offset..end]));
                if let Some(last) = v.last_mut() {
                    *last |= 0x80;
                }
                v.push(0);
                v
            }
            1 => rng
                .pick(&[
                    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01][..],
                    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
                    &[
                        0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
                    ],
                    &[0x80],
                ])
                .to_vec(),
            _ => leb128(boundary_value(
                rng,
                data.len(),
                read_leb128(&data[f.offset..end]),
            )),
        },
    };
    data.splice(f.offset..end, replacement);
}

/// A random run inside `data`: (start, length), possibly empty.
fn run(rng: &mut Rng, len: usize) -> (usize, usize) {
    let start = rng.below(len + 1);
    let max = (len - start).min(if rng.one_in(8) { 4096 } else { 32 });
    (start, rng.below(max + 1))
}

/// One byte-level mutation.
fn mutate_bytes(rng: &mut Rng, data: &mut Vec<u8>, donor: &[u8]) {
    let len = data.len();
    match rng.below(9) {
        0 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            let any = rng.byte();
            data[i] = rng.pick(&[0, 1, 0x7f, 0x80, 0xff, any]);
        }
        2 => data.truncate(rng.below(len + 1)),
        3 => {
            let (s, n) = run(rng, len);
            data.drain(s..s + n);
        }
        4 => {
            let at = rng.below(len + 1);
            let n = rng.range(1, 16);
            let fill: Vec<u8> = if rng.one_in(2) {
                vec![rng.pick(&[0, 0x80, 0xff]); n]
            } else {
                rng.bytes(n)
            };
            data.splice(at..at, fill);
        }
        5 => {
            // Duplicate a run, sometimes many times (large, repetitive inputs).
            let (s, n) = run(rng, len);
            let piece = data[s..s + n].to_vec();
            let times = if rng.one_in(10) { rng.range(2, 200) } else { 1 };
            let at = rng.below(len + 1);
            let mut ins = Vec::with_capacity(piece.len() * times);
            for _ in 0..times {
                ins.extend_from_slice(&piece);
            }
            data.splice(at..at, ins);
        }
        6 => {
            // Splice: a prefix of this encoding, a suffix of another one.
            let cut = rng.below(len + 1);
            let from = rng.below(donor.len() + 1);
            data.truncate(cut);
            data.extend_from_slice(&donor[from..]);
        }
        7 if len > 0 => {
            // The version (first) byte.
            data[0] = rng.pick(&[0, 1, 2, 3, 0x7f, 0xff, data[0].wrapping_add(1)]);
        }
        _ if len >= 4 => {
            let i = rng.below(len - 3);
            let v = boundary_value(rng, len, 0) as u32;
            data[i..i + 4].copy_from_slice(&v.to_le_bytes());
        }
        _ => data.push(rng.byte()),
    }
}

/// Every node of a JSON tree, by its path of member names / element indices.
fn json_paths(v: &Value, path: &mut Vec<PathStep>, out: &mut Vec<Vec<PathStep>>) {
    out.push(path.clone());
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                path.push(PathStep::Key(k.clone()));
                json_paths(child, path, out);
                path.pop();
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                path.push(PathStep::Index(i));
                json_paths(child, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone)]
enum PathStep {
    Key(String),
    Index(usize),
}

fn json_at<'a>(v: &'a mut Value, path: &[PathStep]) -> Option<&'a mut Value> {
    let mut cur = v;
    for step in path {
        cur = match (step, cur) {
            (PathStep::Key(k), Value::Object(m)) => m.get_mut(k)?,
            (PathStep::Index(i), Value::Array(a)) => a.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn odd_json_value(rng: &mut Rng) -> Value {
    match rng.below(8) {
        0 => Value::from(rng.pick(&[
            0u64,
            1,
            2,
            4096,
            65_536,
            1 << 20,
            u64::from(u32::MAX),
            u64::from(u32::MAX) + 1,
            1 << 53,
            u64::MAX,
        ])),
        1 => Value::from(rng.pick(&[-1i64, i64::MIN, -4096])),
        2 => Value::from(rng.pick(&[0.5f64, -0.0, 1e300, 1.5, 16384.0])),
        3 => Value::from(match rng.below(4) {
            0 => String::new(),
            1 => "0".repeat(64),
            2 => "x".repeat(rng.range(100, 5000)),
            _ => rng.text(10),
        }),
        4 => Value::Null,
        5 => Value::Bool(rng.one_in(2)),
        6 => Value::Array(
            (0..rng.below(4))
                .map(|_| Value::from(rng.text(3)))
                .collect(),
        ),
        _ => {
            let mut m = serde_json::Map::new();
            m.insert(rng.text(5), Value::from(rng.u64()));
            Value::Object(m)
        }
    }
}

/// One mutation of a JSON text as a tree; `None` when the text is not JSON.
fn mutate_json(rng: &mut Rng, data: &[u8]) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(data).ok()?;
    let mut paths = Vec::new();
    json_paths(&v, &mut Vec::new(), &mut paths);
    let path = paths[rng.below(paths.len())].clone();
    let node = json_at(&mut v, &path)?;
    match (rng.below(6), node) {
        (0, Value::Object(m)) if !m.is_empty() => {
            let k = m.keys().nth(rng.below(m.len()))?.clone();
            m.remove(&k);
        }
        (1, Value::Object(m)) => {
            let name = rng.pick(&["zz_unknown", "version", "features", "", "config", "mac"]);
            m.insert(name.to_string(), odd_json_value(rng));
        }
        (2, Value::Array(a)) if !a.is_empty() => {
            let i = rng.below(a.len());
            if rng.one_in(2) {
                a.remove(i);
            } else {
                let dup = a[i].clone();
                for _ in 0..rng.range(1, 50) {
                    a.push(dup.clone());
                }
            }
        }
        (3, node) => {
            // Deep nesting: the parser's recursion limit must hold.
            let mut deep = std::mem::take(node);
            for _ in 0..rng.range(100, 300) {
                deep = Value::Array(vec![deep]);
            }
            *node = deep;
        }
        (_, node) => *node = odd_json_value(rng),
    }
    // A nesting too deep to serialise back is itself the test input.
    let text = if rng.one_in(2) {
        serde_json::to_vec(&v).ok()?
    } else {
        serde_json::to_vec_pretty(&v).ok()?
    };
    Some(text)
}

/// Inserts a JSON token at a random place (duplicate members, stray brackets).
fn insert_json_token(rng: &mut Rng, data: &mut Vec<u8>) {
    let token = rng.pick(&[
        &b"\"version\":2,"[..],
        b"\"version\":1,",
        b"\"features\":[\"zz\"],",
        b"\"zz\":[[[[]]]],",
        b"{",
        b"}",
        b"[",
        b"]",
        b"\"",
        b"\\u0000",
        b"\\ud800",
        b"1e999",
        b"-0",
        b",",
        b":",
    ]);
    let at = if rng.one_in(2) {
        data.iter().position(|&b| b == b'{').map_or(0, |p| p + 1)
    } else {
        rng.below(data.len() + 1)
    };
    data.splice(at..at, token.iter().copied());
}

/// Applies one to three structure-aware mutations.
fn mutate(rng: &mut Rng, data: &mut Vec<u8>, fields: &[Field], json: bool, donor: &[u8]) {
    // Field mutations first, while the decoder's offsets still hold (later fields
    // first, so earlier offsets stay valid).
    if !fields.is_empty() && !rng.one_in(4) {
        let mut chosen: Vec<Field> = (0..rng.range(1, 2))
            .map(|_| fields[rng.below(fields.len())])
            .collect();
        chosen.sort_by_key(|f| std::cmp::Reverse(f.offset));
        chosen.dedup_by_key(|f| f.offset);
        for f in chosen {
            mutate_field(rng, data, f);
        }
        if rng.one_in(2) {
            return;
        }
    }
    if json && !rng.one_in(4) {
        if let Some(m) = mutate_json(rng, data) {
            *data = m;
        }
        if rng.one_in(3) {
            insert_json_token(rng, data);
        }
        if !rng.one_in(4) {
            return;
        }
    }
    for _ in 0..rng.range(1, 3) {
        mutate_bytes(rng, data, donor);
    }
}

// ---------------------------------------------------------------------------------
// Targets

/// One decoder under test.
trait Target {
    /// What the decoder returns.
    type Value;
    fn name(&self) -> &'static str;
    /// The plaintext is JSON (mutated as a tree too).
    fn json(&self) -> bool {
        false
    }
    /// A valid plaintext encoding of a generated value.
    fn generate(&self, rng: &mut Rng) -> Vec<u8>;
    /// The fields the plaintext decoder reads (binary formats).
    fn fields(&self, _plain: &[u8]) -> Vec<Field> {
        Vec::new()
    }
    /// Plaintext to stored bytes: sealed with the right key, MACed, or packed.
    fn wrap(&self, plain: &[u8], _rng: &mut Rng) -> Vec<u8> {
        plain.to_vec()
    }
    /// The decoder, on stored bytes (measured for allocation).
    fn decode(&self, input: &[u8]) -> Result<Self::Value, FormatError>;
    /// Properties of a decoded value: round trip, invariants.
    fn verify(&self, input: &[u8], value: &Self::Value) -> Result<(), String>;
}

fn sealer(enc: Encryption) -> Sealer {
    MasterKey::from_secret([0x42; 32], enc).sealer
}

/// The sealer every sealed target uses (ChaCha20-Poly1305: one is enough here; the
/// envelope targets cover the others).
fn object_sealer() -> Sealer {
    sealer(Encryption::ChaCha20Poly1305)
}

fn round_trip<V: PartialEq + std::fmt::Debug>(
    value: &V,
    encode: impl Fn(&V) -> Vec<u8>,
    decode: impl Fn(&[u8]) -> Result<V, FormatError>,
) -> Result<(), String> {
    let bytes = encode(value);
    match decode(&bytes) {
        Ok(back) if &back == value => Ok(()),
        Ok(back) => Err(format!(
            "re-encoding changed the value: {value:?} became {back:?}"
        )),
        Err(e) => Err(format!("re-encoding of {value:?} does not decode: {e}")),
    }
}

struct EnvelopeTarget(Encryption, &'static str);

impl Target for EnvelopeTarget {
    type Value = Vec<u8>;
    fn name(&self) -> &'static str {
        self.1
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        let n = if rng.one_in(10) { 5000 } else { rng.below(100) };
        rng.bytes(n)
    }
    fn wrap(&self, plain: &[u8], rng: &mut Rng) -> Vec<u8> {
        sealer(self.0).seal_with_nonce(rng.array(), plain)
    }
    fn decode(&self, input: &[u8]) -> Result<Vec<u8>, FormatError> {
        sealer(self.0).open("fuzz", input)
    }
    fn verify(&self, input: &[u8], plain: &Vec<u8>) -> Result<(), String> {
        // Whatever opens must be exactly the sealing of its plaintext with its nonce:
        // otherwise a changed envelope was accepted.
        let mut nonce = [0u8; ENVELOPE_NONCE_LEN];
        if self.0 != Encryption::None {
            nonce.copy_from_slice(&input[..ENVELOPE_NONCE_LEN]);
        }
        if sealer(self.0).seal_with_nonce(nonce, plain) != input {
            return Err("an envelope that is not a sealing of its plaintext opened".into());
        }
        Ok(())
    }
}

/// Runs a sequence of wire reads named by the input's own prefix, so that every
/// reader primitive meets mutated bytes in every order.
struct WireTarget;

#[derive(Debug, PartialEq)]
enum WireValue {
    U(u64),
    I(i64),
    B(Vec<u8>),
}

const WIRE_OPS: u8 = 10;

fn wire_read(ops: &[u8], data: &[u8]) -> Result<Vec<WireValue>, FormatError> {
    let mut r = Reader::new(data, "wire");
    let mut out = Vec::new();
    for &op in ops {
        let before = r.remaining();
        out.push(match op % WIRE_OPS {
            0 => WireValue::U(r.varint()?),
            1 => WireValue::I(r.varint_i64()?),
            2 => WireValue::U(r.varint_u32()?.into()),
            3 => WireValue::B(r.bytes(1000)?.to_vec()),
            4 => {
                let n = r.count(8, 1 << 20)?;
                assert!(n <= 1 << 20, "count above its cap");
                assert!(n * 8 <= r.remaining(), "count the input cannot hold");
                WireValue::U(n as u64)
            }
            5 => WireValue::U(r.u8()?.into()),
            6 => WireValue::U(r.u32()?.into()),
            7 => WireValue::U(r.u64()?),
            8 => WireValue::B(r.array::<32>()?.to_vec()),
            _ => WireValue::B(r.bytes(MAX_NAME_LEN)?.to_vec()),
        });
        assert!(r.remaining() <= before, "reader went backwards");
    }
    r.finish()?;
    Ok(out)
}

fn wire_write(ops: &[u8], values: &[WireValue]) -> Vec<u8> {
    let mut w = Writer::new();
    w.u8(ops.len() as u8);
    w.raw(ops);
    for (&op, v) in ops.iter().zip(values) {
        match (op % WIRE_OPS, v) {
            (0 | 2 | 4, WireValue::U(x)) => w.varint(*x),
            (1, WireValue::I(x)) => w.varint_i64(*x),
            (3 | 9, WireValue::B(b)) => w.bytes(b),
            (5, WireValue::U(x)) => w.u8(*x as u8),
            (6, WireValue::U(x)) => w.u32(*x as u32),
            (7, WireValue::U(x)) => w.u64(*x),
            (8, WireValue::B(b)) => w.raw(b),
            _ => {}
        }
    }
    w.into_inner()
}

fn wire_split(input: &[u8]) -> Option<(&[u8], &[u8])> {
    let (&n, rest) = input.split_first()?;
    let n = usize::from(n).min(16);
    (rest.len() >= n).then(|| rest.split_at(n))
}

impl Target for WireTarget {
    type Value = (Vec<u8>, Vec<WireValue>);
    fn name(&self) -> &'static str {
        "wire"
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        let ops: Vec<u8> = (0..rng.range(1, 12))
            .map(|_| rng.below(WIRE_OPS.into()) as u8)
            .collect();
        let mut values = Vec::new();
        for &op in &ops {
            values.push(match op {
                0 => WireValue::U(rng.edgy_u64()),
                1 => WireValue::I(rng.edgy_u64() as i64),
                2 | 5 | 6 => WireValue::U(rng.edgy_u64() & 0xff),
                // A count the rest of the input can hold: 0.
                4 => WireValue::U(0),
                7 => WireValue::U(rng.u64()),
                8 => WireValue::B(rng.bytes(32)),
                _ => {
                    let len = rng.below(50);
                    WireValue::B(rng.bytes(len))
                }
            });
        }
        wire_write(&ops, &values)
    }
    fn fields(&self, plain: &[u8]) -> Vec<Field> {
        let Some((ops, _)) = wire_split(plain) else {
            return Vec::new();
        };
        let skip = 1 + ops.len();
        let (_, fields) = trace::capture(&plain[skip..], |d| wire_read(ops, d));
        fields
            .into_iter()
            .map(|f| Field {
                offset: f.offset + skip,
                ..f
            })
            .collect()
    }
    fn decode(&self, input: &[u8]) -> Result<Self::Value, FormatError> {
        let (ops, data) = wire_split(input).ok_or(FormatError::Truncated { what: "wire" })?;
        Ok((ops.to_vec(), wire_read(ops, data)?))
    }
    fn verify(&self, input: &[u8], (ops, values): &Self::Value) -> Result<(), String> {
        let again = wire_write(ops, values);
        match self.decode(&again) {
            Ok((_, back)) if &back == values => Ok(()),
            Ok((_, back)) => Err(format!("wire values changed: {values:?} became {back:?}")),
            // Writers emit minimal varints: re-encoding an over-long one shortens the
            // input, and a count that only fitted thanks to the padding may then not.
            Err(FormatError::Truncated { .. })
                if again.len() < input.len() && ops.iter().any(|o| o % WIRE_OPS == 4) =>
            {
                Ok(())
            }
            Err(e) => Err(format!("re-encoded wire values do not decode: {e}")),
        }
    }
}

struct TreeTarget;

fn check_tree_invariants(t: &Tree) -> Result<(), String> {
    for (i, n) in t.nodes.iter().enumerate() {
        if !Node::name_is_safe(&n.name) {
            return Err(format!("unsafe name accepted: {:?}", n.name));
        }
        if i > 0 && t.nodes[i - 1].name >= n.name {
            return Err("unsorted names accepted".into());
        }
        if (n.kind == NodeKind::Dir) != n.subtree.is_some() {
            return Err("subtree rule broken".into());
        }
        if let Content::Inline(refs) = &n.content
            && refs.len() > INLINE_CHUNKS_MAX
        {
            return Err("too many inline chunks accepted".into());
        }
        if let Content::Tree { depth, .. } = n.content
            && !(1..=MAX_CHUNK_LIST_DEPTH).contains(&depth)
        {
            return Err("chunk-list depth out of range accepted".into());
        }
        for t in [n.mtime, n.atime, n.ctime] {
            if t.nanos >= 1_000_000_000 {
                return Err("nanoseconds out of range accepted".into());
            }
        }
    }
    Ok(())
}

impl Target for TreeTarget {
    type Value = Tree;
    fn name(&self) -> &'static str {
        "tree"
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        gen_tree(rng).encode()
    }
    fn fields(&self, plain: &[u8]) -> Vec<Field> {
        trace::capture(plain, Tree::decode).1
    }
    fn decode(&self, input: &[u8]) -> Result<Tree, FormatError> {
        Tree::decode(input)
    }
    fn verify(&self, _input: &[u8], t: &Tree) -> Result<(), String> {
        check_tree_invariants(t)?;
        round_trip(t, Tree::encode, Tree::decode)
    }
}

struct ChunkListTarget;

impl Target for ChunkListTarget {
    type Value = ChunkList;
    fn name(&self) -> &'static str {
        "chunk list"
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        gen_chunk_list(rng).encode()
    }
    fn fields(&self, plain: &[u8]) -> Vec<Field> {
        trace::capture(plain, ChunkList::decode).1
    }
    fn decode(&self, input: &[u8]) -> Result<ChunkList, FormatError> {
        ChunkList::decode(input)
    }
    fn verify(&self, _input: &[u8], c: &ChunkList) -> Result<(), String> {
        if c.entries.len() > CHUNK_LIST_FANOUT || c.level >= MAX_CHUNK_LIST_DEPTH {
            return Err("chunk list beyond its caps accepted".into());
        }
        round_trip(c, ChunkList::encode, ChunkList::decode)
    }
}

struct IndexTarget;

impl Target for IndexTarget {
    type Value = IndexFile;
    fn name(&self) -> &'static str {
        "index file"
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        gen_index(rng).encode()
    }
    fn fields(&self, plain: &[u8]) -> Vec<Field> {
        trace::capture(plain, IndexFile::decode).1
    }
    fn wrap(&self, plain: &[u8], rng: &mut Rng) -> Vec<u8> {
        object_sealer().seal_with_nonce(rng.array(), plain)
    }
    fn decode(&self, input: &[u8]) -> Result<IndexFile, FormatError> {
        IndexFile::decode(&object_sealer().open("index file", input)?)
    }
    fn verify(&self, _input: &[u8], f: &IndexFile) -> Result<(), String> {
        for b in f.packs.iter().flat_map(|p| &p.blobs) {
            if u64::from(b.offset) + u64::from(b.length) > MAX_PACK_SIZE || b.length == 0 {
                return Err(format!("blob location out of range accepted: {b:?}"));
            }
        }
        round_trip(f, IndexFile::encode, IndexFile::decode)
    }
}

struct DedupTarget;

impl Target for DedupTarget {
    type Value = DedupList;
    fn name(&self) -> &'static str {
        "dedup list"
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        let file = gen_index(rng);
        let mut l = DedupList::of(IndexId(rng.array()), &file, rng.one_in(2));
        if rng.one_in(3) {
            l.packs = None; // format 1, still read
        }
        let enc = l.encode();
        enc[..enc.len() - 32].to_vec()
    }
    fn fields(&self, plain: &[u8]) -> Vec<Field> {
        trace::capture(plain, DedupList::decode_body).1
    }
    fn wrap(&self, plain: &[u8], _rng: &mut Rng) -> Vec<u8> {
        let mut v = plain.to_vec();
        v.extend_from_slice(blake3::hash(plain).as_bytes());
        v
    }
    fn decode(&self, input: &[u8]) -> Result<DedupList, FormatError> {
        DedupList::decode(input)
    }
    fn verify(&self, _input: &[u8], l: &DedupList) -> Result<(), String> {
        let sorted = |ids: &[crate::BlobId]| ids.windows(2).all(|w| w[0] < w[1]);
        if !sorted(&l.ids) || !l.packs.iter().flatten().all(|p| sorted(&p.ids)) {
            return Err("unsorted ids accepted".into());
        }
        if l.packs
            .iter()
            .flatten()
            .any(|p| p.end > crate::consts::MAX_PACK_SIZE)
        {
            return Err("a pack past the largest size accepted".into());
        }
        round_trip(l, DedupList::encode, DedupList::decode)
    }
}

struct PendingTarget;

impl Target for PendingTarget {
    type Value = PendingDeletion;
    fn name(&self) -> &'static str {
        "pending deletion"
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        gen_pending(rng).encode()
    }
    fn fields(&self, plain: &[u8]) -> Vec<Field> {
        trace::capture(plain, PendingDeletion::decode).1
    }
    fn wrap(&self, plain: &[u8], rng: &mut Rng) -> Vec<u8> {
        object_sealer().seal_with_nonce(rng.array(), plain)
    }
    fn decode(&self, input: &[u8]) -> Result<PendingDeletion, FormatError> {
        PendingDeletion::decode(&object_sealer().open("pending deletion", input)?)
    }
    fn verify(&self, _input: &[u8], p: &PendingDeletion) -> Result<(), String> {
        round_trip(p, PendingDeletion::encode, PendingDeletion::decode)
    }
}

/// A whole pack: trailer, sealed header, header entries.
struct PackTarget;

impl Target for PackTarget {
    type Value = Vec<PackEntry>;
    fn name(&self) -> &'static str {
        "pack"
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        pack::encode_header(&gen_pack_entries(rng))
    }
    fn fields(&self, plain: &[u8]) -> Vec<Field> {
        trace::capture(plain, pack::decode_header).1
    }
    fn wrap(&self, plain: &[u8], rng: &mut Rng) -> Vec<u8> {
        // Blob bytes are never read by the header decoder: a few random ones stand
        // in for them.
        let filler = rng.below(200);
        let mut out = rng.bytes(filler);
        let sealed = object_sealer().seal_with_nonce(rng.array(), plain);
        out.extend_from_slice(&sealed);
        out.extend_from_slice(&pack::encode_trailer(sealed.len() as u32));
        out
    }
    fn decode(&self, input: &[u8]) -> Result<Vec<PackEntry>, FormatError> {
        let size = input.len() as u64;
        let trailer = &input[input.len().saturating_sub(PACK_TRAILER_LEN)..];
        let (offset, len) = pack::parse_trailer(size, trailer)?;
        let start = offset as usize;
        let header = &input[start..start + len as usize];
        pack::decode_header(&object_sealer().open("pack header", header)?)
    }
    fn verify(&self, input: &[u8], entries: &Vec<PackEntry>) -> Result<(), String> {
        // The trailer parser must also keep a header inside packs of other sizes.
        let trailer = &input[input.len() - PACK_TRAILER_LEN..];
        for size in [
            0,
            11,
            12,
            13,
            input.len() as u64,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            if let Ok((off, len)) = pack::parse_trailer(size, trailer)
                && off
                    .checked_add(u64::from(len))
                    .is_none_or(|end| end > size - 12)
            {
                return Err(format!(
                    "header at {off}+{len} outside a pack of {size} bytes"
                ));
            }
        }
        // What prune and `repair index` do with a header: list its blobs in an index
        // file. Every header a reader accepts must give an index file it accepts.
        let file = IndexFile {
            packs: vec![IndexPack {
                id: PackId([0; 32]),
                blobs: IndexBlob::from_header(entries.clone()),
            }],
            ..Default::default()
        };
        if let Err(e) = IndexFile::decode(&file.encode()) {
            return Err(format!(
                "the index file listing an accepted pack header is refused: {e}"
            ));
        }
        round_trip(entries, |e| pack::encode_header(e), pack::decode_header)
    }
}

/// The config: parse, then the MAC check a reader does after unwrapping the key.
struct ConfigTarget;

fn config_mac(body: &[u8]) -> [u8; 32] {
    MasterKey::from_secret([0x42; 32], Encryption::Aes256Gcm).mac(body)
}

impl Target for ConfigTarget {
    type Value = (Config, bool);
    fn name(&self) -> &'static str {
        "config"
    }
    fn json(&self) -> bool {
        true
    }
    /// The plaintext is the `config` member; [`Target::wrap`] MACs it.
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        let file = gen_config(rng).to_bytes(config_mac);
        match Config::parse(&file) {
            Ok((_, body, _)) => body,
            Err(e) => panic!("generated config does not parse: {e}"),
        }
    }
    fn wrap(&self, plain: &[u8], rng: &mut Rng) -> Vec<u8> {
        let mut out = b"{\"config\": ".to_vec();
        out.extend_from_slice(plain);
        out.extend_from_slice(b", \"mac\": \"");
        let tag = if rng.one_in(10) {
            [0; 32]
        } else {
            config_mac(plain)
        };
        out.extend_from_slice(hex::encode(tag).as_bytes());
        out.extend_from_slice(b"\"}");
        out
    }
    fn decode(&self, input: &[u8]) -> Result<(Config, bool), FormatError> {
        let (config, body, tag) = Config::parse(input)?;
        Ok((config, config_mac(&body) == tag))
    }
    fn verify(&self, _input: &[u8], (config, _): &(Config, bool)) -> Result<(), String> {
        if let Err(e) = config.validate() {
            return Err(format!(
                "parse returned a config that does not validate: {e}"
            ));
        }
        round_trip(
            config,
            |c| c.to_bytes(config_mac),
            |b| {
                let (c, body, tag) = Config::parse(b)?;
                if config_mac(&body) != tag {
                    return Err(FormatError::Authentication { what: "config" });
                }
                Ok(c)
            },
        )
    }
}

struct KeyFileTarget;

impl Target for KeyFileTarget {
    type Value = (KeyFile, Option<Result<[u8; 32], FormatError>>);
    fn name(&self) -> &'static str {
        "key file"
    }
    fn json(&self) -> bool {
        true
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        gen_key_file(rng).to_bytes()
    }
    fn decode(&self, input: &[u8]) -> Result<Self::Value, FormatError> {
        let kf = KeyFile::from_bytes(input)?;
        // Argon2 with the file's own parameters is what a reader runs; the caps on
        // them (4 GiB, 100 passes) are by design, so only cheap ones run here.
        let secret = kdf_is_cheap(&kf.kdf).then(|| kf.unwrap_secret(PASSWORD));
        Ok((kf, secret))
    }
    fn verify(&self, _input: &[u8], (kf, _): &Self::Value) -> Result<(), String> {
        let again = kf.to_bytes();
        match KeyFile::from_bytes(&again) {
            Ok(back) if back.to_bytes() == again => Ok(()),
            Ok(_) => Err("key file changed when re-encoded".into()),
            Err(e) => Err(format!("re-encoded key file does not parse: {e}")),
        }
    }
}

struct SnapshotTarget;

impl Target for SnapshotTarget {
    type Value = Snapshot;
    fn name(&self) -> &'static str {
        "snapshot"
    }
    fn json(&self) -> bool {
        true
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        gen_snapshot(rng).to_bytes()
    }
    fn wrap(&self, plain: &[u8], rng: &mut Rng) -> Vec<u8> {
        object_sealer().seal_with_nonce(rng.array(), plain)
    }
    fn decode(&self, input: &[u8]) -> Result<Snapshot, FormatError> {
        Snapshot::from_bytes(&object_sealer().open("snapshot", input)?)
    }
    fn verify(&self, _input: &[u8], s: &Snapshot) -> Result<(), String> {
        if s.tree_id().is_err() {
            return Err("snapshot with an invalid tree id accepted".into());
        }
        round_trip(s, Snapshot::to_bytes, Snapshot::from_bytes)
    }
}

struct LockTarget;

impl Target for LockTarget {
    type Value = Lock;
    fn name(&self) -> &'static str {
        "lock"
    }
    fn json(&self) -> bool {
        true
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        gen_lock(rng).to_bytes()
    }
    fn wrap(&self, plain: &[u8], rng: &mut Rng) -> Vec<u8> {
        object_sealer().seal_with_nonce(rng.array(), plain)
    }
    fn decode(&self, input: &[u8]) -> Result<Lock, FormatError> {
        Lock::from_bytes(&object_sealer().open("lock", input)?)
    }
    fn verify(&self, _input: &[u8], l: &Lock) -> Result<(), String> {
        round_trip(l, Lock::to_bytes, Lock::from_bytes)
    }
}

// ---------------------------------------------------------------------------------
// Driver

/// Cases per decoder in a plain `cargo test` (a few seconds for all of them in a
/// debug build on one core).
const DEFAULT_CASES: u64 = 3000;
/// Default seed; `CAIRN_FUZZ_SEED` overrides it.
const DEFAULT_SEED: u64 = 0x00c0_ffee_ca12_2026;

struct Settings {
    seed: u64,
    duration: Option<Duration>,
    only_case: Option<u64>,
}

fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

impl Settings {
    fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let seed = var("CAIRN_FUZZ_SEED").map(|v| {
            parse_u64(&v).unwrap_or_else(|| panic!("CAIRN_FUZZ_SEED={v:?} is not a number"))
        });
        let duration = var("CAIRN_FUZZ_SECS").map(|v| {
            let secs: f64 = v
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("CAIRN_FUZZ_SECS={v:?} is not a number"));
            Duration::from_secs_f64(secs.max(0.0))
        });
        let only_case = var("CAIRN_FUZZ_CASE").map(|v| {
            parse_u64(&v).unwrap_or_else(|| panic!("CAIRN_FUZZ_CASE={v:?} is not a number"))
        });
        Settings {
            seed: seed.unwrap_or(DEFAULT_SEED),
            duration,
            only_case,
        }
    }
}

/// The seed of one case: the run's seed, the decoder and the case number, mixed.
fn case_seed(seed: u64, name: &str, case: u64) -> u64 {
    let h = blake3::hash(format!("{seed}/{name}/{case}").as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.as_bytes()[..8]);
    u64::from_le_bytes(b)
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".into()
    }
}

/// How a case built its input, for the statistics.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Valid,
    Plaintext,
    Stored,
}

/// Builds one case's input: valid, mutated plaintext re-wrapped, or mutated stored
/// bytes.
fn make_input<T: Target>(t: &T, rng: &mut Rng) -> (Vec<u8>, Mode) {
    let plain = t.generate(rng);
    let mode = match rng.below(10) {
        0 => Mode::Valid,
        1..=6 => Mode::Plaintext,
        _ => Mode::Stored,
    };
    let donor = t.generate(rng);
    match mode {
        Mode::Valid => (t.wrap(&plain, rng), mode),
        Mode::Plaintext => {
            let fields = t.fields(&plain);
            let mut m = plain;
            mutate(rng, &mut m, &fields, t.json(), &donor);
            (t.wrap(&m, rng), mode)
        }
        Mode::Stored => {
            let mut stored = t.wrap(&plain, rng);
            let donor = t.wrap(&donor, rng);
            mutate(rng, &mut stored, &[], false, &donor);
            (stored, mode)
        }
    }
}

/// What one case showed: whether it decoded and the decoder's peak allocation.
struct Outcome {
    decoded: bool,
    peak: usize,
}

/// Decodes one input and checks every property.
fn check_one<T: Target>(t: &T, input: &[u8], mode: Mode) -> Result<Outcome, String> {
    let (decoded, peak) = measure(|| catch_unwind(AssertUnwindSafe(|| t.decode(input))));
    let decoded = decoded.map_err(|p| format!("decoder panicked: {}", panic_message(&*p)))?;
    let bound = allocation_bound(input.len());
    if peak > bound {
        return Err(format!(
            "decoding {} bytes allocated {peak} bytes at once (bound {bound})",
            input.len()
        ));
    }
    match decoded {
        Ok(v) => {
            catch_unwind(AssertUnwindSafe(|| t.verify(input, &v)))
                .map_err(|p| format!("verification panicked: {}", panic_message(&*p)))??;
            Ok(Outcome {
                decoded: true,
                peak,
            })
        }
        Err(e) if mode == Mode::Valid => Err(format!("a valid encoding was rejected: {e}")),
        Err(_) => Ok(Outcome {
            decoded: false,
            peak,
        }),
    }
}

fn fuzz<T: Target>(t: &T) {
    let settings = Settings::from_env();
    let name = t.name();
    let started = Instant::now();
    let cases: Box<dyn Iterator<Item = u64>> = match settings.only_case {
        Some(c) => Box::new(std::iter::once(c)),
        None => Box::new(0..),
    };
    let (mut n, mut decoded) = (0u64, 0u64);
    // Largest peak allocation per input byte, over inputs of at least 4 KiB (below
    // that the fixed allowance dominates).
    let mut worst_ratio = 0f64;
    for case in cases {
        let done = match settings.duration {
            Some(d) => started.elapsed() >= d && n > 0,
            None => settings.only_case.is_none() && case >= DEFAULT_CASES,
        };
        if done {
            break;
        }
        let mut rng = Rng::new(case_seed(settings.seed, name, case));
        let (input, mode) = make_input(t, &mut rng);
        match check_one(t, &input, mode) {
            Ok(o) => {
                decoded += u64::from(o.decoded);
                if input.len() >= 4096 {
                    worst_ratio = worst_ratio.max(o.peak as f64 / input.len() as f64);
                }
            }
            Err(msg) => {
                const SHOWN: usize = 16 << 10;
                let shown = &input[..input.len().min(SHOWN)];
                panic!(
                    "fuzz {name}: {msg}\n  reproduce: CAIRN_FUZZ_SEED={seed:#x} CAIRN_FUZZ_CASE={case} \
                     cargo test -p cairn-format --lib fuzz::\n  input ({len} bytes{more}): {hex}",
                    seed = settings.seed,
                    len = input.len(),
                    more = if input.len() > SHOWN {
                        ", first 16 KiB"
                    } else {
                        ""
                    },
                    hex = hex::encode(shown),
                );
            }
        }
        n += 1;
    }
    println!(
        "fuzz {name}: {n} cases ({decoded} decoded) in {:.1} s, peak allocation up to {worst_ratio:.1}x the input, seed {:#x}",
        started.elapsed().as_secs_f64(),
        settings.seed
    );
}

#[test]
fn fuzz_wire() {
    fuzz(&WireTarget);
}

#[test]
fn fuzz_envelope_aes_256_gcm() {
    fuzz(&EnvelopeTarget(
        Encryption::Aes256Gcm,
        "envelope aes-256-gcm",
    ));
}

#[test]
fn fuzz_envelope_chacha20_poly1305() {
    fuzz(&EnvelopeTarget(
        Encryption::ChaCha20Poly1305,
        "envelope chacha20-poly1305",
    ));
}

#[test]
fn fuzz_envelope_none() {
    fuzz(&EnvelopeTarget(Encryption::None, "envelope none"));
}

#[test]
fn fuzz_config() {
    fuzz(&ConfigTarget);
}

#[test]
fn fuzz_key_file() {
    fuzz(&KeyFileTarget);
}

#[test]
fn fuzz_pack() {
    fuzz(&PackTarget);
}

#[test]
fn fuzz_index_file() {
    fuzz(&IndexTarget);
}

#[test]
fn fuzz_tree() {
    fuzz(&TreeTarget);
}

#[test]
fn fuzz_chunk_list() {
    fuzz(&ChunkListTarget);
}

#[test]
fn fuzz_snapshot() {
    fuzz(&SnapshotTarget);
}

#[test]
fn fuzz_dedup_list() {
    fuzz(&DedupTarget);
}

#[test]
fn fuzz_pending_deletion() {
    fuzz(&PendingTarget);
}

#[test]
fn fuzz_lock() {
    fuzz(&LockTarget);
}

/// The harness itself: the allocator sees allocations, field tracing finds fields,
/// and mutations change inputs, so a quiet run means something.
#[test]
fn the_fuzzer_can_see_what_it_checks() {
    let (v, peak) = measure(|| vec![0u8; 100_000]);
    assert!(peak >= 100_000, "{peak}");
    drop(v);
    let t = gen_tree(&mut Rng::new(7));
    let enc = t.encode();
    let fields = TreeTarget.fields(&enc);
    assert!(
        fields
            .iter()
            .any(|f| f.offset == 0 && f.kind == FieldKind::U8)
    );
    assert!(fields.iter().any(|f| f.kind == FieldKind::Varint));
    let mut rng = Rng::new(1);
    let mut changed = 0;
    for _ in 0..100 {
        let mut m = enc.clone();
        mutate(&mut rng, &mut m, &fields, false, &enc);
        changed += usize::from(m != enc);
    }
    assert!(changed > 90, "{changed}");
    // A decoder that over-allocates is caught.
    struct Greedy;
    impl Target for Greedy {
        type Value = ();
        fn name(&self) -> &'static str {
            "greedy"
        }
        fn generate(&self, _rng: &mut Rng) -> Vec<u8> {
            vec![1]
        }
        fn decode(&self, input: &[u8]) -> Result<(), FormatError> {
            let v: Vec<u64> = Vec::with_capacity(input.len() * 64 + (1 << 20));
            std::hint::black_box(&v);
            Ok(())
        }
        fn verify(&self, _: &[u8], _: &()) -> Result<(), String> {
            Ok(())
        }
    }
    let err = check_one(&Greedy, &[1, 2, 3], Mode::Stored)
        .err()
        .unwrap_or_default();
    assert!(err.contains("allocated"), "{err}");
}
