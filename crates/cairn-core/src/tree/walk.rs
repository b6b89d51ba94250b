//! The one way the engine walks a snapshot's directory trees in order: depth first,
//! entries in name order, with an explicit stack instead of recursion, so a tree
//! 100,000 levels deep (anyone who can create directories can make one) costs
//! memory for its path, not a thread's stack.
//!
//! A [`Visitor`] sees each directory entered, each entry, each subtree that cannot be
//! read, and each directory left; a directory's result is handed to its parent, so
//! the same walk serves listings (ls), checks (check) and rewrites that build new
//! trees bottom-up (repair, copy). Which subtrees to walk into is the visitor's
//! choice: it can skip a tree it has already handled (a tree shared by many
//! snapshots is walked once).
//!
//! Two walks are not this one, for reasons of their own: restore
//! (`ops/restore`) walks the target's directory descriptors alongside the trees
//! (it must hold, close and re-derive them, checked by device and inode, which a
//! visitor's per-directory state cannot), with the same explicit-stack shape; and
//! [`super::reachable`] loads trees in parallel and in no order, each once across
//! all snapshots, because prune and stats wait on storage latency, not on order.

use crate::error::{Error, Result};
use crate::repo::Repository;
use cairn_format::BlobId;
use cairn_format::tree::{Node, Tree};

/// What a walk asks of its caller.
pub trait Visitor {
    /// What the visitor keeps while a directory is being walked (e.g. its new
    /// nodes).
    type Dir;
    /// A directory's result, handed to its parent's [`Visitor::child`] (the root's
    /// is what [`walk`] returns).
    type Out;

    /// A directory's tree was loaded and its entries are next. `node` is `None` for
    /// the root; `path` is `""` for the root, else `/a/b`.
    fn enter(&mut self, path: &str, node: Option<&Node>, tree: &Tree) -> Result<Self::Dir>;

    /// An entry of the directory being walked, at `path`. Return the tree to walk
    /// into for a directory entry (`node.subtree`, or another), or `None` to not
    /// walk it (its result then never comes).
    fn entry(&mut self, dir: &mut Self::Dir, path: &str, node: &Node) -> Result<Option<BlobId>>;

    /// The tree of the directory entry `node` could not be read. Return `Ok` to go
    /// on without it, or the error to stop the walk.
    fn unreadable(
        &mut self,
        dir: &mut Self::Dir,
        path: &str,
        node: &Node,
        error: Error,
    ) -> Result<()>;

    /// Every entry of the directory was handled (and every subtree walked).
    fn leave(&mut self, path: &str, node: Option<&Node>, dir: Self::Dir) -> Result<Self::Out>;

    /// The result of the walked subdirectory `node` of `parent`.
    fn child(
        &mut self,
        parent: &mut Self::Dir,
        path: &str,
        node: &Node,
        out: Self::Out,
    ) -> Result<()>;
}

/// One directory on the walk's stack.
struct Frame<D> {
    tree: Tree,
    next: usize,
    dir: D,
    /// `path`'s length before this directory's name was appended.
    parent_len: usize,
    /// The directory entry (None for the root).
    node: Option<Node>,
}

/// Walks the trees below `root` (a snapshot's root tree, or any directory's tree)
/// and returns the root's result. An unreadable root is an error; an unreadable
/// subtree goes to [`Visitor::unreadable`].
pub fn walk<V: Visitor>(repo: &Repository, root: &BlobId, v: &mut V) -> Result<V::Out> {
    walk_from(repo, root, "", None, v)
}

/// [`walk`] starting at a directory whose path (`/a/b`) and node are known.
pub fn walk_from<V: Visitor>(
    repo: &Repository,
    root: &BlobId,
    root_path: &str,
    root_node: Option<Node>,
    v: &mut V,
) -> Result<V::Out> {
    let tree = repo.load_tree(root)?;
    let mut path = String::from(root_path);
    let dir = v.enter(&path, root_node.as_ref(), &tree)?;
    let mut stack = vec![Frame {
        tree,
        next: 0,
        dir,
        parent_len: path.len(),
        node: root_node,
    }];
    loop {
        let Some(top) = stack.last_mut() else {
            return Err(Error::Invalid("tree walk lost its place".into()));
        };
        let Some(node) = top.tree.nodes.get(top.next) else {
            // Directory done: leave it and give its result to the parent.
            let Some(f) = stack.pop() else {
                return Err(Error::Invalid("tree walk lost its place".into()));
            };
            let out = v.leave(&path, f.node.as_ref(), f.dir)?;
            let Some(parent) = stack.last_mut() else {
                return Ok(out);
            };
            path.truncate(f.parent_len);
            let Some(node) = f.node else {
                return Err(Error::Invalid("tree walk lost its place".into()));
            };
            let child_path = join(&path, &node.name);
            v.child(&mut parent.dir, &child_path, &node, out)?;
            parent.next += 1;
            continue;
        };
        let child_path = join(&path, &node.name);
        let Some(sub) = v.entry(&mut top.dir, &child_path, node)? else {
            top.next += 1;
            continue;
        };
        match repo.load_tree(&sub) {
            Ok(t) => {
                let node = node.clone();
                let parent_len = path.len();
                path = child_path;
                let dir = v.enter(&path, Some(&node), &t)?;
                stack.push(Frame {
                    tree: t,
                    next: 0,
                    dir,
                    parent_len,
                    node: Some(node),
                });
            }
            Err(e) => {
                let node = node.clone();
                v.unreadable(&mut top.dir, &child_path, &node, e)?;
                top.next += 1;
            }
        }
    }
}

/// `parent/name`, a name's bytes that are not UTF-8 as their stand-ins
/// ([`super::escape_name`]): two names never read the same, and a path
/// shown in `--json` names the same entry when given back.
pub fn join(parent: &str, name: &[u8]) -> String {
    let name = super::escape_name(name);
    let mut p = String::with_capacity(parent.len() + 1 + name.len());
    p.push_str(parent);
    p.push('/');
    p.push_str(&name);
    p
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::repo::blob::BlobEncoder;
    use crate::repo::packer::{BufferPool, Packer};
    use cairn_format::pack::BlobKind;
    use cairn_format::tree::{Content, NodeKind};
    use std::sync::Arc;

    pub(crate) fn dir_node(name: &[u8], sub: BlobId) -> Node {
        let mut n = Node::new(name.to_vec(), NodeKind::Dir);
        n.mode = 0o40755;
        n.subtree = Some(sub);
        n
    }

    pub(crate) fn file_node(name: &[u8]) -> Node {
        let mut n = Node::new(name.to_vec(), NodeKind::File);
        n.mode = 0o100644;
        n.content = Content::None;
        n
    }

    /// A chain `depth` directories deep (`d/d/d/...`) with a file `f` at the bottom,
    /// stored in `repo`; returns the root tree's id.
    pub(crate) fn deep_chain(repo: &mut Repository, depth: usize) -> BlobId {
        let pool = Arc::new(BufferPool::new(1));
        let up = repo.uploader(pool.clone());
        let mut packer = Packer::new(repo.key().clone(), pool, 16 << 20);
        let mut enc = BlobEncoder::new(None);
        let mut put = |t: &Tree| {
            let data = t.encode();
            let id = repo.key().blob_id(&data);
            if let Some(p) = packer.add(enc.encode(repo.key(), BlobKind::Tree, id, &data).unwrap())
            {
                up.send(p).unwrap();
            }
            id
        };
        let mut id = put(&Tree {
            nodes: vec![file_node(b"f")],
        });
        for _ in 0..depth {
            id = put(&Tree {
                nodes: vec![dir_node(b"d", id)],
            });
        }
        if let Some(p) = packer.finish() {
            up.send(p).unwrap();
        }
        up.finish().unwrap();
        repo.load_index_in_ram().unwrap();
        id
    }

    /// Counts entries and the deepest path; results flow bottom-up as subtree sizes.
    struct Count {
        entries: usize,
        deepest: usize,
    }
    impl Visitor for Count {
        type Dir = usize;
        type Out = usize;
        fn enter(&mut self, path: &str, _: Option<&Node>, _: &Tree) -> Result<usize> {
            self.deepest = self.deepest.max(path.len());
            Ok(0)
        }
        fn entry(&mut self, d: &mut usize, _: &str, n: &Node) -> Result<Option<BlobId>> {
            self.entries += 1;
            *d += 1;
            Ok(n.subtree)
        }
        fn unreadable(&mut self, _: &mut usize, _: &str, _: &Node, e: Error) -> Result<()> {
            Err(e)
        }
        fn leave(&mut self, _: &str, _: Option<&Node>, d: usize) -> Result<usize> {
            Ok(d)
        }
        fn child(&mut self, p: &mut usize, _: &str, _: &Node, out: usize) -> Result<()> {
            *p += out;
            Ok(())
        }
    }

    #[test]
    fn a_tree_100000_levels_deep_is_walked_without_recursion() {
        let mut repo = crate::testutil::mem_repo();
        let root = deep_chain(&mut repo, 100_000);
        // A small stack: recursion would overflow it long before the bottom.
        let total = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                let mut c = Count {
                    entries: 0,
                    deepest: 0,
                };
                let total = walk(&repo, &root, &mut c).unwrap();
                assert_eq!(c.entries, 100_001);
                assert_eq!(c.deepest, 2 * 100_000);
                total
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(total, 100_001);
    }
}
