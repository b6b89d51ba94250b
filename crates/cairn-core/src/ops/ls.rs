//! Listing a snapshot's tree and finding nodes by path.

use crate::error::{Error, Result};
use crate::repo::Repository;
use cairn_format::BlobId;
use cairn_format::tree::{Node, NodeKind, Tree};

/// Splits a snapshot path (`/home/a/b`) into its components.
fn components(path: &str) -> Vec<&str> {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect()
}

/// Finds the node at `path`; the root (`/` or empty) has no node and returns `None`.
pub fn find_node(repo: &Repository, root: &BlobId, path: &str) -> Result<Option<Node>> {
    let comps = components(path);
    let mut tree = repo.load_tree(root)?;
    let mut found: Option<Node> = None;
    for (i, c) in comps.iter().enumerate() {
        let node = tree
            .nodes
            .iter()
            .find(|n| n.name == c.as_bytes())
            .cloned()
            .ok_or_else(|| {
                Error::Invalid(format!("{path}: no such file or directory in the snapshot"))
            })?;
        if i + 1 < comps.len() {
            match (node.kind, node.subtree) {
                (NodeKind::Dir, Some(sub)) => tree = repo.load_tree(&sub)?,
                _ => {
                    return Err(Error::Invalid(format!(
                        "{path}: not a directory in the snapshot"
                    )));
                }
            }
        }
        found = Some(node);
    }
    Ok(found)
}

/// Calls `f(path, node)` for every entry at and below `path`, depth first, in name
/// order. Unreadable subtrees are passed to `on_error` and skipped.
pub fn walk(
    repo: &Repository,
    root: &BlobId,
    path: &str,
    recursive: bool,
    f: &mut dyn FnMut(&str, &Node),
    on_error: &mut dyn FnMut(&str, Error),
) -> Result<()> {
    let start = find_node(repo, root, path)?;
    let base: String = components(path).iter().map(|c| format!("/{c}")).collect();
    let tree_id = match &start {
        None => *root,
        Some(n) => {
            f(&base, n);
            match n.subtree {
                Some(s) => s,
                None => return Ok(()),
            }
        }
    };
    fn rec(
        repo: &Repository,
        tree: &Tree,
        prefix: &str,
        recursive: bool,
        f: &mut dyn FnMut(&str, &Node),
        on_error: &mut dyn FnMut(&str, Error),
    ) {
        for n in &tree.nodes {
            let p = format!("{prefix}/{}", String::from_utf8_lossy(&n.name));
            f(&p, n);
            if recursive && let Some(sub) = n.subtree {
                match repo.load_tree(&sub) {
                    Ok(t) => rec(repo, &t, &p, recursive, f, on_error),
                    Err(e) => on_error(&p, e),
                }
            }
        }
    }
    let tree = repo.load_tree(&tree_id)?;
    rec(repo, &tree, &base, recursive, f, on_error);
    Ok(())
}
