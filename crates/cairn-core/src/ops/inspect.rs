//! `cairn list` and `cairn cat`: the repository's objects one at a time, decoded
//! and checked, for whoever has to look inside a repository by hand (restic's
//! `list` and `cat`). Every object is read the way the engine reads it — its hash
//! checked against its name, its seal opened with the key, lengths bounded — so
//! what is shown is what cairn itself would use, and a damaged object is an error
//! naming it rather than garbage on the screen.

use crate::error::{Error, Result};
use crate::repo::Repository;
use crate::tree::escape_name;
use cairn_backend::names;
use cairn_format::index::{IndexBlob, IndexPack};
use cairn_format::pack::BlobCompression;
use cairn_format::tree::{Content, Node};
use cairn_format::{BlobId, IndexId, PackId, PendingId, SnapshotId};
use serde::Serialize;

/// The kinds of stored object `list` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    Snapshots,
    Index,
    Packs,
    Keys,
    Locks,
    Pending,
}

impl Stored {
    fn prefix(self) -> &'static str {
        match self {
            Stored::Snapshots => names::SNAPSHOTS,
            Stored::Index => names::INDEX,
            Stored::Packs => names::DATA,
            Stored::Keys => names::KEYS,
            Stored::Locks => names::LOCKS,
            Stored::Pending => names::PENDING,
        }
    }

    /// The word for one object of the kind, in messages.
    pub fn noun(self) -> &'static str {
        match self {
            Stored::Snapshots => "snapshot",
            Stored::Index => "index file",
            Stored::Packs => "pack",
            Stored::Keys => "key",
            Stored::Locks => "lock",
            Stored::Pending => "pending deletion",
        }
    }
}

/// One stored object as the storage lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StoredObject {
    /// 64 hex digits.
    pub id: String,
    /// Bytes as stored.
    pub size: u64,
    /// Stored under the `admin-` name (an index file that supersedes or forgets,
    /// an exclusive lock: only an admin may write those through a server).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub admin: bool,
}

/// The objects of one kind, sorted by id. Names that are not where cairn puts
/// such an object (temporary files, strays) are left out, as every reader does.
pub fn list_stored(repo: &Repository, what: Stored) -> Result<Vec<StoredObject>> {
    let mut out: Vec<StoredObject> = repo
        .backend()
        .list(what.prefix())?
        .into_iter()
        .filter_map(|o| {
            let (admin, hex) = names::split_admin(names::listed(&o.name));
            // Names are lower case: another spelling is a stray no reader opens.
            let canonical = hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
            (hex.len() == 64 && canonical).then(|| StoredObject {
                id: hex.to_string(),
                size: o.size,
                admin,
            })
        })
        .collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// One blob of the loaded index, for `list blobs`.
#[derive(Clone, Debug, Serialize)]
pub struct ListedBlob {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub id: String,
    pub pack: String,
    /// Where it lies in its pack and its stored size (sealed and compressed).
    pub offset: u32,
    pub length: u32,
    /// Its size before compression (the bytes `cat blob` gives).
    pub raw_length: u32,
}

/// Every blob the loaded index holds (one line per copy a pack holds is not
/// wanted here: the copy readers use), in the index's own order: streaming, so
/// that 100 million blobs are not all held as strings at once.
pub fn list_blobs(repo: &Repository) -> impl Iterator<Item = ListedBlob> + '_ {
    let index = repo.index();
    index.iter().map(move |(id, loc)| ListedBlob {
        kind: kind_name(loc.kind),
        id: id.to_hex(),
        pack: index.pack_of(&loc).to_hex(),
        offset: loc.offset,
        length: loc.length,
        raw_length: loc.raw_length,
    })
}

/// A blob kind as `cat` and `list` write it: one word, as restic writes its own.
fn kind_name(k: cairn_format::pack::BlobKind) -> &'static str {
    match k {
        cairn_format::pack::BlobKind::Data => "data",
        cairn_format::pack::BlobKind::Tree => "tree",
        cairn_format::pack::BlobKind::ChunkList => "chunklist",
    }
}

/// The one id among `ids` that starts with `prefix` (any case), or why not.
pub fn resolve_prefix(noun: &str, prefix: &str, ids: &[String]) -> Result<String> {
    let lower = prefix.to_ascii_lowercase();
    if lower.is_empty() || !lower.bytes().all(|b| b.is_ascii_hexdigit()) || lower.len() > 64 {
        return Err(Error::BadArgument(format!(
            "{prefix:?} is not a {noun} id: give its 64 hex digits or the first few of them \
             (`cairn list` lists them)"
        )));
    }
    let found: Vec<&String> = ids.iter().filter(|i| i.starts_with(&lower)).collect();
    match found.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(Error::Invalid(format!("no {noun} matches {prefix:?}"))),
        many => Err(Error::Invalid(format!(
            "{noun} id {prefix:?} is ambiguous: it matches {} of them ({}{})",
            many.len(),
            many.iter()
                .take(4)
                .map(|i| &i[..16])
                .collect::<Vec<_>>()
                .join(", "),
            if many.len() > 4 { ", ..." } else { "" }
        ))),
    }
}

/// The stored object of kind `what` whose id starts with `prefix`.
pub fn find_stored(repo: &Repository, what: Stored, prefix: &str) -> Result<StoredObject> {
    let all = list_stored(repo, what)?;
    let ids: Vec<String> = all.iter().map(|o| o.id.clone()).collect();
    let id = resolve_prefix(what.noun(), prefix, &ids)?;
    Ok(all
        .into_iter()
        .find(|o| o.id == id)
        .expect("resolved among these"))
}

/// A blob entry of an index file, a pending deletion or a pack header.
#[derive(Clone, Debug, Serialize)]
pub struct BlobEntry {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub id: String,
    pub offset: u32,
    /// Stored (sealed) length.
    pub length: u32,
    /// Plaintext length.
    pub raw_length: u32,
    pub compression: &'static str,
}

impl From<&IndexBlob> for BlobEntry {
    fn from(b: &IndexBlob) -> BlobEntry {
        BlobEntry {
            kind: kind_name(b.kind),
            id: b.id.to_hex(),
            offset: b.offset,
            length: b.length,
            raw_length: b.raw_length,
            compression: match b.compression {
                BlobCompression::Raw => "none",
                BlobCompression::Zstd => "zstd",
            },
        }
    }
}

/// A pack with its entries, as an index file lists it.
#[derive(Clone, Debug, Serialize)]
pub struct PackEntries {
    pub id: String,
    pub blobs: Vec<BlobEntry>,
}

impl From<&IndexPack> for PackEntries {
    fn from(p: &IndexPack) -> PackEntries {
        PackEntries {
            id: p.id.to_hex(),
            blobs: p.blobs.iter().map(BlobEntry::from).collect(),
        }
    }
}

/// An index file, decoded.
#[derive(Clone, Debug, Serialize)]
pub struct IndexView {
    pub id: String,
    /// Stored under the `admin-` name. In a repository with the `admin-names`
    /// feature, only such a file's `supersedes` and `forgotten` count (and are
    /// shown): a plain name is one any backup client may write.
    pub admin: bool,
    pub supersedes: Vec<String>,
    pub packs: Vec<PackEntries>,
    pub snapshots: Vec<String>,
    pub forgotten: Vec<String>,
}

/// A pack's header, read from the pack itself.
#[derive(Clone, Debug, Serialize)]
pub struct PackView {
    pub id: String,
    pub size: u64,
    pub blobs: Vec<BlobEntry>,
}

/// A pending deletion prune left for its second half.
#[derive(Clone, Debug, Serialize)]
pub struct PendingView {
    pub id: String,
    pub created: String,
    /// The locks prune saw when it wrote the record: the packs go once all are gone.
    pub locks: Vec<String>,
    pub packs: Vec<PackEntries>,
    pub orphans: Vec<String>,
}

/// A lock, decoded, with what every reader concludes from it.
#[derive(Clone, Debug, Serialize)]
pub struct LockView {
    pub id: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub admin: bool,
    pub stale: bool,
    pub lock: cairn_format::lock::Lock,
}

/// One entry of a tree, every field the format keeps.
#[derive(Clone, Debug, Serialize)]
pub struct NodeView {
    /// The name, bytes that are not UTF-8 written out as `ls` writes them.
    pub name: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub mode: String,
    pub uid: u32,
    pub gid: u32,
    pub user: String,
    pub group: String,
    pub size: u64,
    pub mtime: String,
    pub atime: String,
    pub ctime: String,
    pub inode: u64,
    pub device_id: u64,
    pub links: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdev: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub xattrs: Vec<[String; 2]>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub flags: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subtree: Option<String>,
    /// A file's chunks in order, when the tree lists them itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<ChunkView>>,
    /// A file's chunks through a chunk list (`cat chunklist ROOT`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chunk_list: Option<ChunkListRef>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChunkView {
    pub id: String,
    pub length: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChunkListRef {
    pub root: String,
    pub depth: u8,
    pub chunks: u64,
}

impl From<&Node> for NodeView {
    fn from(n: &Node) -> NodeView {
        use cairn_format::tree::NodeKind;
        let time = |t: &cairn_format::tree::Timestamp| crate::time::format_unix(t.secs, t.nanos);
        let chunks = |c: &[cairn_format::tree::ChunkRef]| {
            c.iter()
                .map(|r| ChunkView {
                    id: r.id.to_hex(),
                    length: r.length,
                })
                .collect()
        };
        let (content, chunk_list) = match &n.content {
            Content::None => (None, None),
            Content::Inline(c) => (Some(chunks(c)), None),
            Content::Tree {
                root,
                depth,
                chunks,
            } => (
                None,
                Some(ChunkListRef {
                    root: root.to_hex(),
                    depth: *depth,
                    chunks: *chunks,
                }),
            ),
        };
        NodeView {
            name: escape_name(&n.name),
            kind: n.kind.name(),
            mode: format!("{:o}", n.mode),
            uid: n.uid,
            gid: n.gid,
            user: n.user.clone(),
            group: n.group.clone(),
            size: n.size,
            mtime: time(&n.mtime),
            atime: time(&n.atime),
            ctime: time(&n.ctime),
            inode: n.inode,
            device_id: n.dev,
            links: n.nlink,
            rdev: matches!(n.kind, NodeKind::CharDevice | NodeKind::BlockDevice).then_some(n.rdev),
            link_target: (n.kind == NodeKind::Symlink).then(|| escape_name(&n.link_target)),
            xattrs: n
                .xattrs
                .iter()
                .map(|(k, v)| [escape_name(k), escape_name(v)])
                .collect(),
            flags: cairn_format::tree::inode_flag_letters(n.flags),
            subtree: n.subtree.map(|s| s.to_hex()),
            content,
            chunk_list,
        }
    }
}

/// A tree blob, decoded.
#[derive(Clone, Debug, Serialize)]
pub struct TreeView {
    pub id: String,
    pub nodes: Vec<NodeView>,
}

/// A chunk-list blob, decoded: level 0 lists data chunks, higher levels list
/// chunk lists one level down.
#[derive(Clone, Debug, Serialize)]
pub struct ChunkListView {
    pub id: String,
    pub level: u8,
    pub entries: Vec<ChunkView>,
}

/// A key file (the master key stays wrapped: `cat` shows what is stored). The
/// config needs no function: [`Repository::config`] is it, authenticated.
pub fn key_file(repo: &Repository, prefix: &str) -> Result<cairn_format::key::KeyFile> {
    let id = repo.find_key(prefix)?;
    let listed = repo.list_keys()?;
    let (_, kf) = listed
        .into_iter()
        .find(|(k, _)| *k == id)
        .ok_or_else(|| Error::Invalid(format!("key {} vanished while read", id.short())))?;
    kf
}

pub fn index_view(repo: &Repository, prefix: &str) -> Result<IndexView> {
    let o = find_stored(repo, Stored::Index, prefix)?;
    let id = IndexId::from_hex(&o.id).map_err(|e| Error::Invalid(e.to_string()))?;
    let f = repo.read_index_file(&id)?;
    let hexes = |v: &[SnapshotId]| v.iter().map(|s| s.to_hex()).collect();
    Ok(IndexView {
        id: o.id,
        admin: o.admin,
        supersedes: f.supersedes.iter().map(|i| i.to_hex()).collect(),
        packs: f.packs.iter().map(PackEntries::from).collect(),
        snapshots: hexes(&f.snapshots),
        forgotten: hexes(&f.forgotten),
    })
}

/// A pack's header from the pack (not the index): what it says it holds.
pub fn pack_view(repo: &Repository, prefix: &str) -> Result<PackView> {
    let o = find_stored(repo, Stored::Packs, prefix)?;
    let id = PackId::from_hex(&o.id).map_err(|e| Error::Invalid(e.to_string()))?;
    // Read whole (a range at a time) and hashed: a pack's name is the hash of its
    // bytes, and a header that opens says nothing of the blobs before it.
    let name = names::pack(&o.id);
    let mut hasher = blake3::Hasher::new();
    let mut at = 0u64;
    while at < o.size {
        let len = (o.size - at).min(8 << 20);
        hasher.update(&repo.backend().get_range(&name, at, len)?);
        at += len;
    }
    if *hasher.finalize().as_bytes() != id.0 {
        return Err(Error::damaged(
            format!("pack {}", o.id),
            cairn_format::FormatError::malformed("pack", "its bytes do not hash to its name"),
        ));
    }
    let blobs = crate::ops::prune::read_header(repo, &id, o.size)?;
    Ok(PackView {
        id: o.id,
        size: o.size,
        blobs: blobs.iter().map(BlobEntry::from).collect(),
    })
}

pub fn pending_view(repo: &Repository, prefix: &str) -> Result<PendingView> {
    let o = find_stored(repo, Stored::Pending, prefix)?;
    let id = PendingId::from_hex(&o.id).map_err(|e| Error::Invalid(e.to_string()))?;
    let p = repo.read_pending(&id)?;
    Ok(PendingView {
        id: o.id,
        created: crate::time::format_unix(p.created, 0),
        locks: p.locks.iter().map(hex::encode).collect(),
        packs: p.packs.iter().map(PackEntries::from).collect(),
        orphans: p.orphans.iter().map(|o| o.to_hex()).collect(),
    })
}

pub fn lock_view(repo: &Repository, prefix: &str) -> Result<LockView> {
    let locks = crate::repo::lock::list_locks(repo)?;
    let ids: Vec<String> = locks.iter().map(|l| l.hex()).collect();
    // Messages (unlock, prune, a job waiting) name a lock by its eight digits
    // from the 17th on ([`crate::repo::lock::LockInfo::short`]): taken too.
    let lower = prefix.to_ascii_lowercase();
    let by_short: Vec<&String> = ids.iter().filter(|i| i[16..24] == *lower).collect();
    let id = match (by_short.as_slice(), resolve_prefix("lock", prefix, &ids)) {
        (_, Ok(id)) => id,
        ([one], Err(_)) => (*one).clone(),
        (_, Err(e)) => return Err(e),
    };
    let l = locks
        .into_iter()
        .find(|l| l.hex() == id)
        .expect("resolved among these");
    let admin = names::split_admin(names::listed(&l.name)).0;
    match l.lock {
        Some(lock) => Ok(LockView {
            id,
            admin,
            stale: l.stale,
            lock,
        }),
        None => Err(Error::Invalid(format!(
            "lock {id} cannot be read or opened with this repository's key (damaged, too \
             large, or not a lock); readers take it for {}",
            if l.stale { "stale" } else { "held" }
        ))),
    }
}

/// The blob whose id starts with `prefix` among those the loaded index holds.
pub fn find_blob(repo: &Repository, prefix: &str) -> Result<BlobId> {
    if prefix.len() == 64
        && let Ok(id) = BlobId::from_hex(&prefix.to_ascii_lowercase())
    {
        return if repo.index().contains(&id) {
            Ok(id)
        } else {
            Err(Error::Invalid(format!("no blob matches {prefix:?}")))
        };
    }
    let lower = prefix.to_ascii_lowercase();
    // A short prefix over millions of blobs would list half the index as its
    // matches; eight digits make a collision unlikely below a few million blobs.
    if lower.len() < 8 || !lower.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::BadArgument(format!(
            "{prefix:?} is not a blob id: give at least its first 8 hex digits \
             (`cairn list blobs` lists them)"
        )));
    }
    let mut found = repo
        .index()
        .iter()
        .map(|(id, _)| id)
        .filter(|id| id.to_hex().starts_with(&lower));
    let first = found.next();
    let more = found.take(3).collect::<Vec<_>>();
    match (first, more.is_empty()) {
        (Some(id), true) => Ok(id),
        (None, _) => Err(Error::Invalid(format!("no blob matches {prefix:?}"))),
        (Some(id), false) => Err(Error::Invalid(format!(
            "blob id {prefix:?} is ambiguous: it matches {} and more",
            id.short()
        ))),
    }
}

/// A blob's plaintext, authenticated and hashed against its id.
pub fn blob_bytes(repo: &Repository, prefix: &str) -> Result<Vec<u8>> {
    let id = find_blob(repo, prefix)?;
    repo.read_blob(&id)
}

pub fn tree_view(repo: &Repository, id: &BlobId) -> Result<TreeView> {
    let tree = repo.load_tree(id)?;
    Ok(TreeView {
        id: id.to_hex(),
        nodes: tree.nodes.iter().map(NodeView::from).collect(),
    })
}

/// The blob's kind is `want`, or an error saying what it is (a data blob decoded
/// as a tree would be called damaged).
fn expect_kind(repo: &Repository, id: &BlobId, want: cairn_format::pack::BlobKind) -> Result<()> {
    match repo.index().get(id) {
        Some(loc) if loc.kind != want => Err(Error::Invalid(format!(
            "blob {} is a {} blob, not a {}",
            id.short(),
            loc.kind.name(),
            want.name()
        ))),
        _ => Ok(()),
    }
}

pub fn chunk_list_view(repo: &Repository, prefix: &str) -> Result<ChunkListView> {
    let id = find_blob(repo, prefix)?;
    expect_kind(repo, &id, cairn_format::pack::BlobKind::ChunkList)?;
    let list = repo.load_chunk_list(&id)?;
    Ok(ChunkListView {
        id: id.to_hex(),
        level: list.level,
        entries: list
            .entries
            .iter()
            .map(|r| ChunkView {
                id: r.id.to_hex(),
                length: r.length,
            })
            .collect(),
    })
}

/// The tree a `cat tree` argument names: a tree blob's id (or 8+ digits of it),
/// or `SNAPSHOT[:PATH]` — a snapshot's root tree, or the directory at `PATH` in
/// it.
pub fn tree_of<A: crate::session::Access>(
    session: &crate::session::Session<A>,
    spec: &str,
) -> Result<BlobId> {
    let repo = session.repo();
    let (snap_spec, path) = match spec.split_once(':') {
        Some((s, p)) => (s, Some(p)),
        None => (spec, None),
    };
    // A bare hex string is tried as a tree blob first, then as a snapshot.
    if path.is_none()
        && snap_spec.len() >= 8
        && snap_spec.bytes().all(|b| b.is_ascii_hexdigit())
        && let Ok(id) = find_blob(repo, snap_spec)
    {
        // A blob of another kind is said to be one, unless a snapshot's id starts
        // with the same digits.
        match expect_kind(repo, &id, cairn_format::pack::BlobKind::Tree) {
            Ok(()) => return Ok(id),
            Err(e) => {
                if let Ok(found) = session.find_snapshot(snap_spec) {
                    return found
                        .1
                        .tree_id()
                        .map_err(|e| Error::damaged(format!("snapshot {}", found.0.short()), e));
                }
                return Err(e);
            }
        }
    }
    let (sid, snap) = session.find_snapshot(snap_spec)?;
    let tree = snap
        .tree_id()
        .map_err(|e| Error::damaged(format!("snapshot {}", sid.short()), e))?;
    let path = path.unwrap_or("/");
    if path.trim_matches('/').is_empty() {
        return Ok(tree);
    }
    match crate::ops::ls::find_node(repo, &tree, path)? {
        Some(n) => n.subtree.ok_or_else(|| {
            Error::Invalid(format!(
                "{path} in snapshot {} is a {}, not a directory",
                sid.short(),
                n.kind.name()
            ))
        }),
        None => Err(Error::Invalid(format!(
            "{path} is not in snapshot {}",
            sid.short()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.repeat(64 / s.len())).collect()
    }

    #[test]
    fn prefixes_resolve_to_one_id_or_say_why_not() {
        let all = ids(&["ab", "ac", "ff"]);
        assert_eq!(resolve_prefix("pack", "ab", &all).unwrap(), all[0]);
        assert_eq!(resolve_prefix("pack", "AC", &all).unwrap(), all[1]);
        let e = resolve_prefix("pack", "a", &all).unwrap_err().to_string();
        assert!(e.contains("ambiguous") && e.contains("2 of them"), "{e}");
        let e = resolve_prefix("pack", "00", &all).unwrap_err().to_string();
        assert!(e.contains("no pack matches"), "{e}");
        for bad in ["", "zz", "../x", &"a".repeat(65)] {
            let e = resolve_prefix("pack", bad, &all).unwrap_err().to_string();
            assert!(e.contains("is not a pack id"), "{bad}: {e}");
        }
    }
}
