//! Tree blobs (directory listings) and chunk-list blobs (a large file's chunk ids).
//!
//! ```text
//! tree      = version:u8 || count:varint || (len:varint || node)*count   nodes sorted by name
//! node      = name:bytes || kind:u8 || mode:varint || uid:varint || gid:varint
//!             || user:bytes || group:bytes || mtime || atime || ctime
//!             || inode:varint || dev:varint || nlink:varint || size:varint || rdev:varint
//!             || link_target:bytes || nxattr:varint || (name:bytes || value:bytes)*nxattr
//!             || content || subtree || [flags:varint]        (flags: version 2 only)
//! time      = seconds:zigzag varint || nanoseconds:varint (< 10^9)
//! content   = 0                                       (no content)
//!           | 1 || n:varint || (chunk id:32 || length:varint)*n     inline chunk list
//!           | 2 || root id:32 || depth:u8 || chunks:varint          chunk-list tree
//! subtree   = 0 | 1 || tree id:32                                   (directories)
//! chunklist = version:u8 || level:u8 || n:varint || (id:32 || length:varint)*n
//! ```
//! `bytes` is a varint length and that many bytes. At level 0 a chunk-list blob lists
//! data chunks; at level k > 0 it lists chunk-list blobs of level k-1 with the number
//! of file bytes each covers.

use crate::consts::*;
use crate::error::{Result, check_version};
use crate::id::BlobId;
use crate::wire::{Reader, Writer};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum NodeKind {
    File = 0,
    Dir = 1,
    Symlink = 2,
    Fifo = 3,
    CharDevice = 4,
    BlockDevice = 5,
    Socket = 6,
}

impl NodeKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => NodeKind::File,
            1 => NodeKind::Dir,
            2 => NodeKind::Symlink,
            3 => NodeKind::Fifo,
            4 => NodeKind::CharDevice,
            5 => NodeKind::BlockDevice,
            6 => NodeKind::Socket,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            NodeKind::File => "file",
            NodeKind::Dir => "dir",
            NodeKind::Symlink => "symlink",
            NodeKind::Fifo => "fifo",
            NodeKind::CharDevice => "chardev",
            NodeKind::BlockDevice => "blockdev",
            NodeKind::Socket => "socket",
        }
    }

    /// The `st_mode` file-type bits of this kind (`S_IFREG`, `S_IFDIR`, ...).
    pub fn type_bits(self) -> u32 {
        match self {
            NodeKind::File => 0o100000,
            NodeKind::Dir => 0o040000,
            NodeKind::Symlink => 0o120000,
            NodeKind::Fifo => 0o010000,
            NodeKind::CharDevice => 0o020000,
            NodeKind::BlockDevice => 0o060000,
            NodeKind::Socket => 0o140000,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

/// One data chunk of a file (or one child of a chunk-list node) and the bytes it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkRef {
    pub id: BlobId,
    pub length: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    None,
    Inline(Vec<ChunkRef>),
    Tree {
        root: BlobId,
        depth: u8,
        chunks: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// File name bytes (Unix names are bytes, not UTF-8).
    pub name: Vec<u8>,
    pub kind: NodeKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub user: String,
    pub group: String,
    pub mtime: Timestamp,
    pub atime: Timestamp,
    pub ctime: Timestamp,
    pub inode: u64,
    pub dev: u64,
    pub nlink: u64,
    pub size: u64,
    pub rdev: u64,
    pub link_target: Vec<u8>,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    pub content: Content,
    pub subtree: Option<BlobId>,
    /// Linux inode flags (`chattr`: immutable, append only, ...), only those of
    /// [`INODE_FLAGS`]; 0 for none.
    pub flags: u32,
}

impl Tree {
    /// The node named `name`: a binary search, since a valid tree's names are
    /// strictly increasing.
    pub fn find(&self, name: &[u8]) -> Option<&Node> {
        self.nodes
            .binary_search_by(|n| n.name.as_slice().cmp(name))
            .ok()
            .and_then(|i| self.nodes.get(i))
    }
}

/// Inode flags as `lsattr` and `chattr` write them (`i` immutable, `a` append
/// only, ...), in `lsattr`'s order.
pub fn inode_flag_letters(flags: u32) -> String {
    INODE_FLAG_LETTERS
        .iter()
        .filter(|&&(bit, _)| flags & bit != 0)
        .map(|&(_, c)| c)
        .collect()
}

/// The extended attributes Linux keeps POSIX ACLs under.
pub fn is_acl_name(name: &[u8]) -> bool {
    name == b"system.posix_acl_access" || name == b"system.posix_acl_default"
}

/// A POSIX ACL as Linux stores it in `system.posix_acl_*` (a version 2 header, then
/// entries of tag, permission bits and id, little-endian) in the text form of
/// `getfacl` and `setfacl` with numeric ids, one entry per line: `user::rw-`,
/// `user:1000:r-x`, `group::r--`, `mask::rwx`, `other::r--`. `None` for bytes
/// that are not such an ACL (the xattr is untrusted snapshot content).
pub fn acl_text(xattr: &[u8]) -> Option<String> {
    let (head, entries) = xattr.split_at_checked(4)?;
    if head != 2u32.to_le_bytes() || entries.is_empty() || entries.len() % 8 != 0 {
        return None;
    }
    let mut lines = Vec::with_capacity(entries.len() / 8);
    for e in entries.chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]);
        let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        let (kind, named) = match tag {
            0x01 => ("user", false),
            0x02 => ("user", true),
            0x04 => ("group", false),
            0x08 => ("group", true),
            0x10 => ("mask", false),
            0x20 => ("other", false),
            _ => return None,
        };
        if perm & !0o7 != 0 {
            return None;
        }
        let qualifier = if named { id.to_string() } else { String::new() };
        let bits: String = [(4, 'r'), (2, 'w'), (1, 'x')]
            .iter()
            .map(|&(b, c)| if perm & b != 0 { c } else { '-' })
            .collect();
        lines.push(format!("{kind}:{qualifier}:{bits}"));
    }
    Some(lines.join("\n"))
}

impl Node {
    pub fn new(name: Vec<u8>, kind: NodeKind) -> Self {
        Node {
            name,
            kind,
            mode: 0,
            uid: 0,
            gid: 0,
            user: String::new(),
            group: String::new(),
            mtime: Timestamp::default(),
            atime: Timestamp::default(),
            ctime: Timestamp::default(),
            inode: 0,
            dev: 0,
            nlink: 1,
            size: 0,
            rdev: 0,
            link_target: Vec::new(),
            xattrs: Vec::new(),
            content: Content::None,
            subtree: None,
            flags: 0,
        }
    }

    /// Whether the entry carries a POSIX ACL (an access or a default one).
    pub fn has_acl(&self) -> bool {
        self.xattrs.iter().any(|(k, _)| is_acl_name(k))
    }

    /// A name that is safe to join to a directory path: not empty, not `.` or `..`,
    /// and without `/` or NUL. Restore refuses everything else.
    pub fn name_is_safe(name: &[u8]) -> bool {
        !name.is_empty()
            && name != b"."
            && name != b".."
            && !name.contains(&b'/')
            && !name.contains(&0)
    }
}

/// Fewest bytes a node takes in a tree, with its length prefix: one-byte length,
/// a one-byte name, and the smallest form of every other field (22 bytes). Bounds
/// the node count a tree of a given size can claim before anything is allocated.
const MIN_NODE_RECORD_LEN: usize = 24;

fn put_time(w: &mut Writer, t: Timestamp) {
    w.varint_i64(t.secs);
    w.varint(t.nanos.into());
}

fn get_time(r: &mut Reader<'_>) -> Result<Timestamp> {
    let secs = r.varint_i64()?;
    let nanos = r.varint_u32()?;
    if nanos >= 1_000_000_000 {
        return Err(r.malformed("nanoseconds out of range"));
    }
    Ok(Timestamp { secs, nanos })
}

fn put_chunk_refs(w: &mut Writer, refs: &[ChunkRef]) {
    w.varint(refs.len() as u64);
    for c in refs {
        w.raw(&c.id.0);
        w.varint(c.length);
    }
}

fn get_chunk_refs(r: &mut Reader<'_>, cap: usize) -> Result<Vec<ChunkRef>> {
    let n = r.count(ID_LEN + 1, cap)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let id = BlobId(r.array()?);
        let length = r.varint()?;
        out.push(ChunkRef { id, length });
    }
    Ok(out)
}

fn encode_node(w: &mut Writer, n: &Node, with_flags: bool) {
    w.bytes(&n.name);
    w.u8(n.kind as u8);
    w.varint(n.mode.into());
    w.varint(n.uid.into());
    w.varint(n.gid.into());
    w.bytes(n.user.as_bytes());
    w.bytes(n.group.as_bytes());
    put_time(w, n.mtime);
    put_time(w, n.atime);
    put_time(w, n.ctime);
    w.varint(n.inode);
    w.varint(n.dev);
    w.varint(n.nlink);
    w.varint(n.size);
    w.varint(n.rdev);
    w.bytes(&n.link_target);
    w.varint(n.xattrs.len() as u64);
    for (k, v) in &n.xattrs {
        w.bytes(k);
        w.bytes(v);
    }
    match &n.content {
        Content::None => w.u8(0),
        Content::Inline(refs) => {
            w.u8(1);
            put_chunk_refs(w, refs);
        }
        Content::Tree {
            root,
            depth,
            chunks,
        } => {
            w.u8(2);
            w.raw(&root.0);
            w.u8(*depth);
            w.varint(*chunks);
        }
    }
    match &n.subtree {
        None => w.u8(0),
        Some(id) => {
            w.u8(1);
            w.raw(&id.0);
        }
    }
    if with_flags {
        w.varint(n.flags.into());
    }
}

fn decode_node(r: &mut Reader<'_>, with_flags: bool) -> Result<Node> {
    let name = r.bytes(MAX_NAME_LEN)?.to_vec();
    let k = r.u8()?;
    let kind = NodeKind::from_u8(k).ok_or_else(|| r.malformed("unknown node kind"))?;
    let mode = r.varint_u32()?;
    let uid = r.varint_u32()?;
    let gid = r.varint_u32()?;
    let user = String::from_utf8(r.bytes(MAX_NAME_LEN)?.to_vec())
        .map_err(|_| r.malformed("user name is not UTF-8"))?;
    let group = String::from_utf8(r.bytes(MAX_NAME_LEN)?.to_vec())
        .map_err(|_| r.malformed("group name is not UTF-8"))?;
    let mtime = get_time(r)?;
    let atime = get_time(r)?;
    let ctime = get_time(r)?;
    let inode = r.varint()?;
    let dev = r.varint()?;
    let nlink = r.varint()?;
    let size = r.varint()?;
    let rdev = r.varint()?;
    let link_target = r.bytes(MAX_NAME_LEN)?.to_vec();
    let nx = r.count(2, MAX_XATTRS)?;
    let mut xattrs = Vec::with_capacity(nx);
    for _ in 0..nx {
        let k = r.bytes(MAX_NAME_LEN)?.to_vec();
        let v = r.bytes(MAX_XATTR_VALUE_LEN)?.to_vec();
        xattrs.push((k, v));
    }
    let content = match r.u8()? {
        0 => Content::None,
        1 => Content::Inline(get_chunk_refs(r, INLINE_CHUNKS_MAX)?),
        2 => {
            let root = BlobId(r.array()?);
            let depth = r.u8()?;
            if depth == 0 || depth > MAX_CHUNK_LIST_DEPTH {
                return Err(r.malformed("chunk-list depth out of range"));
            }
            let chunks = r.varint()?;
            Content::Tree {
                root,
                depth,
                chunks,
            }
        }
        _ => return Err(r.malformed("unknown content tag")),
    };
    let subtree = match r.u8()? {
        0 => None,
        1 => Some(BlobId(r.array()?)),
        _ => return Err(r.malformed("unknown subtree tag")),
    };
    // Bits beyond the kept ones are refused, not carried: a reader sets only
    // what it knows.
    let flags = if with_flags { r.varint_u32()? } else { 0 };
    if flags & !INODE_FLAGS != 0 {
        return Err(r.malformed("unknown inode flags"));
    }
    Ok(Node {
        name,
        kind,
        mode,
        uid,
        gid,
        user,
        group,
        mtime,
        atime,
        ctime,
        inode,
        dev,
        nlink,
        size,
        rdev,
        link_target,
        xattrs,
        content,
        subtree,
        flags,
    })
}

/// A directory listing, nodes sorted by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tree {
    pub nodes: Vec<Node>,
}

impl Tree {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(64 + self.nodes.len() * 128);
        let with_flags = self.nodes.iter().any(|n| n.flags != 0);
        w.u8(if with_flags {
            TREE_VERSION_FLAGS
        } else {
            TREE_VERSION
        });
        w.varint(self.nodes.len() as u64);
        let mut nw = Writer::with_capacity(256);
        for n in &self.nodes {
            nw.buf.clear();
            encode_node(&mut nw, n, with_flags);
            w.bytes(&nw.buf);
        }
        w.into_inner()
    }

    /// Decodes and checks the invariants restore relies on: names are safe and
    /// strictly increasing (so no duplicates), directories have subtrees.
    pub fn decode(data: &[u8]) -> Result<Self> {
        let mut r = Reader::new(data, "tree");
        let v = r.u8()?;
        check_version(
            "tree",
            v.into(),
            TREE_VERSION.into(),
            TREE_VERSION_FLAGS.into(),
        )?;
        let with_flags = v == TREE_VERSION_FLAGS;
        let n = r.count(MIN_NODE_RECORD_LEN, usize::MAX)?;
        let mut nodes: Vec<Node> = Vec::with_capacity(n);
        for _ in 0..n {
            let nb = r.bytes(MAX_BLOB_SIZE)?;
            let mut nr = Reader::new(nb, "tree node");
            let node = decode_node(&mut nr, with_flags)?;
            nr.finish()?;
            if !Node::name_is_safe(&node.name) {
                return Err(r.malformed(format!(
                    "unsafe file name {:?}",
                    String::from_utf8_lossy(&node.name)
                )));
            }
            if let Some(prev) = nodes.last()
                && prev.name >= node.name
            {
                return Err(r.malformed("names not sorted or duplicated"));
            }
            if (node.kind == NodeKind::Dir) != node.subtree.is_some() {
                return Err(
                    r.malformed("subtree present on a non-directory or missing on a directory")
                );
            }
            nodes.push(node);
        }
        r.finish()?;
        Ok(Tree { nodes })
    }
}

/// One blob of a chunk-list tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkList {
    pub level: u8,
    pub entries: Vec<ChunkRef>,
}

impl ChunkList {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(8 + self.entries.len() * 36);
        w.u8(CHUNK_LIST_VERSION);
        w.u8(self.level);
        put_chunk_refs(&mut w, &self.entries);
        w.into_inner()
    }

    pub fn decode(data: &[u8]) -> Result<Self> {
        let mut r = Reader::new(data, "chunk list");
        let v = r.u8()?;
        let newest = CHUNK_LIST_VERSION.into();
        check_version("chunk list", v.into(), newest, newest)?;
        let level = r.u8()?;
        if level >= MAX_CHUNK_LIST_DEPTH {
            return Err(r.malformed("chunk-list level out of range"));
        }
        let entries = get_chunk_refs(&mut r, CHUNK_LIST_FANOUT)?;
        r.finish()?;
        Ok(ChunkList { level, entries })
    }
}

#[cfg(test)]
mod tests {

    /// Inode flags make a version-2 tree; a tree without any stays version 1,
    /// byte for byte, and a flag this version does not know is refused.
    #[test]
    fn inode_flags_need_version_2_only_where_they_are() {
        let plain = Tree {
            nodes: vec![Node::new(b"a".to_vec(), NodeKind::File)],
        };
        let bytes = plain.encode();
        assert_eq!(bytes[0], TREE_VERSION);
        let mut flagged = plain.clone();
        flagged.nodes[0].flags = 0x10 | 0x20;
        let fbytes = flagged.encode();
        assert_eq!(fbytes[0], TREE_VERSION_FLAGS);
        assert_eq!(Tree::decode(&fbytes).unwrap(), flagged);
        assert_eq!(Tree::decode(&bytes).unwrap(), plain);
        // An unknown bit (FS_EXTENT_FL here) is damage, never carried on.
        let mut odd = flagged.clone();
        odd.nodes[0].flags = 0x0008_0000;
        let e = Tree::decode(&odd.encode()).unwrap_err();
        assert!(e.to_string().contains("unknown inode flags"), "{e}");
        // A version beyond it is a newer format.
        let mut newer = fbytes.clone();
        newer[0] = TREE_VERSION_FLAGS + 1;
        assert!(matches!(
            Tree::decode(&newer),
            Err(crate::error::FormatError::NewerVersion { .. })
        ));
    }

    #[test]
    fn acls_read_as_getfacl_writes_them() {
        // setfacl -m u:1234:r-x,g:55:rw- (getfattr -e hex of the file).
        let hex = "0200000001000600ffffffff02000500d204000004000400ffffffff\
                   080006003700000010000700ffffffff20000400ffffffff";
        let bytes: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        assert_eq!(
            acl_text(&bytes).unwrap(),
            "user::rw-\nuser:1234:r-x\ngroup::r--\ngroup:55:rw-\nmask::rwx\nother::r--"
        );
        for bad in [
            &bytes[..4],
            &bytes[..11],
            &[1, 0, 0, 0, 1, 0, 6, 0, 0, 0, 0, 0][..],
            &[],
        ] {
            assert_eq!(acl_text(bad), None, "{bad:?}");
        }
        let mut odd_tag = bytes.clone();
        odd_tag[4] = 0x40;
        assert_eq!(acl_text(&odd_tag), None);
    }

    use super::*;
    use proptest::prelude::*;

    fn ts() -> impl Strategy<Value = Timestamp> {
        (any::<i64>(), 0u32..1_000_000_000).prop_map(|(secs, nanos)| Timestamp { secs, nanos })
    }

    fn chunk_ref() -> impl Strategy<Value = ChunkRef> {
        (any::<[u8; 32]>(), any::<u64>()).prop_map(|(id, length)| ChunkRef {
            id: BlobId(id),
            length,
        })
    }

    fn content() -> impl Strategy<Value = Content> {
        prop_oneof![
            Just(Content::None),
            proptest::collection::vec(chunk_ref(), 0..5).prop_map(Content::Inline),
            (any::<[u8; 32]>(), 1u8..=MAX_CHUNK_LIST_DEPTH, any::<u64>()).prop_map(
                |(r, depth, chunks)| Content::Tree {
                    root: BlobId(r),
                    depth,
                    chunks
                }
            ),
        ]
    }

    fn node() -> impl Strategy<Value = Node> {
        (
            (
                proptest::collection::vec(1u8..=255, 1..20),
                0u8..7,
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                ".*",
                ".*",
            ),
            (
                ts(),
                ts(),
                ts(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
            ),
            (
                proptest::collection::vec(any::<u8>(), 0..10),
                proptest::collection::vec(
                    (
                        proptest::collection::vec(any::<u8>(), 0..8),
                        proptest::collection::vec(any::<u8>(), 0..8),
                    ),
                    0..3,
                ),
                content(),
                any::<[u8; 32]>(),
            ),
        )
            .prop_map(
                |(
                    (name, k, mode, uid, gid, user, group),
                    (mtime, atime, ctime, inode, dev, nlink, size, rdev),
                    (link_target, xattrs, content, sub),
                )| {
                    let kind = NodeKind::from_u8(k).unwrap();
                    let name = name
                        .into_iter()
                        .map(|b| if b == b'/' { b'x' } else { b })
                        .collect();
                    Node {
                        name,
                        kind,
                        mode,
                        uid,
                        gid,
                        user,
                        group,
                        mtime,
                        atime,
                        ctime,
                        inode,
                        dev,
                        nlink,
                        size,
                        rdev,
                        link_target,
                        xattrs,
                        content,
                        subtree: (kind == NodeKind::Dir).then_some(BlobId(sub)),
                        flags: if mode % 3 == 0 { mode & INODE_FLAGS } else { 0 },
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn tree_round_trip(nodes in proptest::collection::vec(node(), 0..8)) {
            let mut nodes = nodes;
            nodes.sort_by(|a, b| a.name.cmp(&b.name));
            nodes.dedup_by(|a, b| a.name == b.name);
            nodes.retain(|n| Node::name_is_safe(&n.name));
            let t = Tree { nodes };
            prop_assert_eq!(Tree::decode(&t.encode()).unwrap(), t);
        }

        #[test]
        fn chunk_list_round_trip(level in 0u8..MAX_CHUNK_LIST_DEPTH, entries in proptest::collection::vec(chunk_ref(), 0..50)) {
            let c = ChunkList { level, entries };
            prop_assert_eq!(ChunkList::decode(&c.encode()).unwrap(), c);
        }

        #[test]
        fn decoders_never_panic(data: Vec<u8>) {
            let _ = Tree::decode(&data);
            let _ = ChunkList::decode(&data);
        }
    }

    #[test]
    fn unsafe_names_rejected() {
        for bad in [&b".."[..], b".", b"", b"a/b", b"a\0"] {
            let t = Tree {
                nodes: vec![Node::new(bad.to_vec(), NodeKind::File)],
            };
            assert!(Tree::decode(&t.encode()).is_err(), "{bad:?}");
        }
    }
}
