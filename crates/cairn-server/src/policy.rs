//! Who may do what to which object: one table of role × object kind × action,
//! decided from the object's *name* alone, because the server has no key.
//!
//! That works because the format makes the dangerous kinds visible in names: in a
//! repository with the `admin-names` feature, index files that supersede or forget
//! are `index/admin-<id>` and exclusive locks are `locks/admin-<id>`, and readers
//! honour those lists and that exclusivity under such names only. An append-only
//! (backup) token may then create packs, plain index files, snapshots and its own
//! plain locks, and nothing it can create changes what a reader sees of existing
//! data.

use serde::{Deserialize, Serialize};

/// What a token may do in its datastore.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Adds backups: creates packs, plain index files, snapshots and its own locks;
    /// reads what a backup needs. Never deletes, replaces or hides anything.
    Backup,
    /// Reads and lists; may hold its own (shared) locks while it reads.
    Restore,
    /// Everything: forget, prune, repair, key and config changes.
    Admin,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "backup" => Some(Role::Backup),
            "restore" => Some(Role::Restore),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Backup => "backup",
            Role::Restore => "restore",
            Role::Admin => "admin",
        }
    }
}

/// The kinds of objects a repository holds, told apart by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Config,
    Key,
    Pack,
    Index,
    /// `index/admin-<id>`: may supersede other index files or forget snapshots.
    AdminIndex,
    Snapshot,
    Lock,
    /// `locks/admin-<id>`: an exclusive lock.
    AdminLock,
    Pending,
    /// `dedup/<index id>`: the plaintext list of an index file's data chunk ids,
    /// from which the server answers dedup queries.
    DedupList,
    /// `hosts/<snapshot id>`: the host a host-bound token stored the snapshot for,
    /// written by the server itself ([`crate::hosts`]).
    HostRecord,
    /// `received/<snapshot id>`: when the server received a snapshot from a
    /// non-admin token, written by the server itself ([`crate::hosts`]).
    ReceivedRecord,
    /// `forgotten/<snapshot id>`: a snapshot a key holder forgot, written by
    /// `forget` (and tag, rewrite, repair), read by the server to refuse it
    /// from a backup token again.
    ForgottenRecord,
}

impl Kind {
    /// The plaintext records about snapshots that a host-bound token may not read
    /// and that its listings leave out (another host's snapshot ids are in their
    /// names).
    pub fn snapshot_record(self) -> bool {
        matches!(
            self,
            Kind::HostRecord | Kind::ReceivedRecord | Kind::ForgottenRecord
        )
    }

    /// What a non-admin session may create only while it holds a job slot: what a
    /// backup writes (locks come before the slot, host records from the server).
    pub fn needs_job_slot(self) -> bool {
        matches!(
            self,
            Kind::Pack | Kind::Index | Kind::Snapshot | Kind::DedupList
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Config => "config",
            Kind::Key => "key",
            Kind::Pack => "pack",
            Kind::Index => "index",
            Kind::AdminIndex => "admin_index",
            Kind::Snapshot => "snapshot",
            Kind::Lock => "lock",
            Kind::AdminLock => "admin_lock",
            Kind::Pending => "pending",
            Kind::DedupList => "dedup_list",
            Kind::HostRecord => "host_record",
            Kind::ReceivedRecord => "received_record",
            Kind::ForgottenRecord => "forgotten_record",
        }
    }

    /// Whether the object's name is the BLAKE3 hash of its bytes, which the server
    /// checks on every write.
    pub fn content_addressed(self) -> bool {
        !matches!(
            self,
            Kind::Config
                | Kind::Lock
                | Kind::AdminLock
                | Kind::DedupList
                | Kind::HostRecord
                | Kind::ReceivedRecord
                | Kind::ForgottenRecord
        )
    }

    /// The largest body a write of this kind may carry.
    pub fn max_size(self, max_pack: u64) -> u64 {
        use cairn_format::consts::{
            MAX_INDEX_FILE_SIZE, MAX_LOCK_SIZE, MAX_METADATA_OBJECT_SIZE, MAX_SMALL_OBJECT_SIZE,
            MAX_WRITTEN_INDEX_FILE_SIZE,
        };
        match self {
            Kind::Pack => max_pack,
            // A snapshot lists every path it was given: `--files-from` with tens of
            // thousands of files makes it megabytes. Readers take up to this.
            Kind::Snapshot => MAX_METADATA_OBJECT_SIZE as u64,
            Kind::Index => MAX_WRITTEN_INDEX_FILE_SIZE as u64,
            Kind::AdminIndex | Kind::Pending | Kind::DedupList => MAX_INDEX_FILE_SIZE as u64,
            Kind::Lock | Kind::AdminLock => MAX_LOCK_SIZE as u64,
            _ => MAX_SMALL_OBJECT_SIZE as u64,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    List,
    Read,
    /// Store a new object; fails if the name exists.
    Create,
    /// Store an object, replacing one of that name.
    Replace,
    Delete,
}

impl Action {
    /// The verb for messages ("a backup token may not delete ...").
    pub fn verb(self) -> &'static str {
        match self {
            Action::List => "list",
            Action::Read => "read",
            Action::Create => "create",
            Action::Replace => "overwrite",
            Action::Delete => "delete",
        }
    }
}

/// The table's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Allowed on a lock of this token: one whose id starts with the token's lock
    /// prefix ([`crate::locks::owned_by`]), which any server can check.
    OwnLockOnly,
    Deny,
}

/// The policy for objects. Every role may list (names and sizes, which readers and
/// backups both need) any prefix of the layout ([`valid_prefix`]).
pub fn decide(role: Role, kind: Kind, action: Action) -> Decision {
    use Action::*;
    use Decision::*;
    use Kind::*;
    match role {
        Role::Admin => Allow,
        Role::Backup | Role::Restore => match (kind, action) {
            (_, List | Read) => Allow,
            // Readers hold shared locks so that prune waits for them; a token
            // creates, refreshes and deletes only its own.
            (Lock, Create | Replace | Delete) => OwnLockOnly,
            // A dedup list only for a plain index file that exists, which the
            // handler checks (`api::check_dedup_list`).
            (Pack | Index | Snapshot | DedupList, Create) if role == Role::Backup => Allow,
            _ => Deny,
        },
    }
}

/// A listing prefix the repository layout has: empty, a top-level directory, or
/// `data/<xx>/`.
pub fn valid_prefix(prefix: &str) -> bool {
    const TOP: &[&str] = &[
        "",
        "config",
        "keys/",
        "data/",
        "index/",
        "snapshots/",
        "locks/",
        "pending/",
        "dedup/",
        "hosts/",
        "received/",
        "forgotten/",
    ];
    if TOP.contains(&prefix) {
        return true;
    }
    match prefix.strip_prefix("data/") {
        Some(rest) => {
            let rest = rest.strip_suffix('/').unwrap_or(rest);
            rest.len() <= 2 && rest.bytes().all(is_lower_hex)
        }
        None => false,
    }
}

fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(is_lower_hex)
}

/// A name that is not one of the repository's objects.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a repository object name")]
pub struct BadName(pub String);

/// The kind of the object `name`, which must be exactly one of the layout's names
/// (so that nothing outside the datastore, and nothing the readers would not
/// understand, can be written).
pub fn classify(name: &str) -> Result<Kind, BadName> {
    let bad = || BadName(name.chars().take(200).collect());
    if name == "config" {
        return Ok(Kind::Config);
    }
    let (dir, base) = name.split_once('/').ok_or_else(bad)?;
    let (admin, id) = cairn_backend::names::split_admin(base);
    let kind = match (dir, admin) {
        ("keys", false) => Kind::Key,
        ("index", false) => Kind::Index,
        ("index", true) => Kind::AdminIndex,
        ("snapshots", false) => Kind::Snapshot,
        ("locks", false) => Kind::Lock,
        ("locks", true) => Kind::AdminLock,
        ("pending", false) => Kind::Pending,
        ("dedup", false) => Kind::DedupList,
        ("hosts", false) => Kind::HostRecord,
        ("received", false) => Kind::ReceivedRecord,
        ("forgotten", false) => Kind::ForgottenRecord,
        ("data", false) => {
            let (sub, id) = base.split_once('/').ok_or_else(bad)?;
            if !is_id(id) || id.get(..2) != Some(sub) {
                return Err(bad());
            }
            return Ok(Kind::Pack);
        }
        _ => return Err(bad()),
    };
    if !is_id(id) {
        return Err(bad());
    }
    Ok(kind)
}

/// The id part of a content-addressed object's name.
pub fn id_of(name: &str) -> Option<&str> {
    let base = cairn_backend::names::base(name);
    let (_, id) = cairn_backend::names::split_admin(base);
    is_id(id).then_some(id)
}

/// Why stored bytes are not the object their name says, found without the key.
#[derive(Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// The bytes hash to something else (damaged in transit or at rest, or forged).
    Hash {
        got: String,
    },
    /// A pack without a pack's trailer, or with a header that does not fit.
    NotAPack(&'static str),
    /// A dedup list that does not decode or names another index file.
    NotADedupList(String),
    Empty,
}

impl Mismatch {
    /// A short name for reports (`hash_mismatch`, `not_a_pack`, `empty`).
    pub fn kind(&self) -> &'static str {
        match self {
            Mismatch::Hash { .. } => "hash_mismatch",
            Mismatch::NotAPack(_) => "not_a_pack",
            Mismatch::NotADedupList(_) => "not_a_dedup_list",
            Mismatch::Empty => "empty",
        }
    }
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mismatch::Hash { got } => write!(
                f,
                "the content hashes to {}…, not to the name (damaged or forged)",
                &got[..16.min(got.len())]
            ),
            Mismatch::NotAPack(why) => write!(f, "not a pack ({why})"),
            Mismatch::NotADedupList(why) => write!(f, "not a dedup list ({why})"),
            Mismatch::Empty => write!(f, "empty object"),
        }
    }
}

/// What can be checked of an object without the key: a content-addressed object's
/// name is the BLAKE3 hash of its bytes, a pack ends in its trailer with a header
/// that fits, and nothing but the config is empty. Uploads (refused) and scrub
/// (reported) check the same.
pub fn verify(kind: Kind, name: &str, body: &[u8]) -> Result<(), Mismatch> {
    if body.is_empty() && kind != Kind::Config {
        return Err(Mismatch::Empty);
    }
    if kind.content_addressed() {
        let got = blake3::hash(body).to_hex();
        if Some(got.as_str()) != id_of(name) {
            return Err(Mismatch::Hash {
                got: got.to_string(),
            });
        }
    }
    if kind == Kind::DedupList {
        let l = cairn_format::dedup::DedupList::decode(body)
            .map_err(|e| Mismatch::NotADedupList(e.to_string()))?;
        if Some(hex::encode(l.index.0).as_str()) != id_of(name) {
            return Err(Mismatch::NotADedupList(
                "it describes another index file".into(),
            ));
        }
    }
    if kind == Kind::Pack {
        use cairn_format::consts::{PACK_TRAILER_LEN, PACK_TRAILER_MAGIC};
        let n = body.len();
        if n < PACK_TRAILER_LEN || &body[n - PACK_TRAILER_MAGIC.len()..] != PACK_TRAILER_MAGIC {
            return Err(Mismatch::NotAPack("no pack trailer"));
        }
        let at = n - PACK_TRAILER_LEN;
        let header_len =
            u32::from_le_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]) as usize;
        if header_len == 0 || header_len > at {
            return Err(Mismatch::NotAPack(
                "its header length does not fit the pack",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn names_are_classified_strictly() {
        assert_eq!(classify("config").unwrap(), Kind::Config);
        assert_eq!(classify(&format!("data/01/{ID}")).unwrap(), Kind::Pack);
        assert_eq!(classify(&format!("index/{ID}")).unwrap(), Kind::Index);
        assert_eq!(
            classify(&format!("index/admin-{ID}")).unwrap(),
            Kind::AdminIndex
        );
        assert_eq!(
            classify(&format!("locks/admin-{ID}")).unwrap(),
            Kind::AdminLock
        );
        assert_eq!(
            classify(&format!("snapshots/{ID}")).unwrap(),
            Kind::Snapshot
        );
        assert_eq!(classify(&format!("pending/{ID}")).unwrap(), Kind::Pending);
        assert_eq!(classify(&format!("keys/{ID}")).unwrap(), Kind::Key);
        assert_eq!(classify(&format!("dedup/{ID}")).unwrap(), Kind::DedupList);
        assert_eq!(classify(&format!("hosts/{ID}")).unwrap(), Kind::HostRecord);
        assert_eq!(
            classify(&format!("received/{ID}")).unwrap(),
            Kind::ReceivedRecord
        );
        for bad in [
            "".to_string(),
            "config2".into(),
            "/config".into(),
            format!("data/02/{ID}"),
            format!("data/01/{ID}/x"),
            format!("data/{ID}"),
            format!("index/{}", &ID[1..]),
            format!("index/{}", ID.to_uppercase()),
            format!("index/../{ID}"),
            format!("index/x-{ID}"),
            format!("pending/admin-{ID}"),
            format!("snapshots/admin-{ID}"),
            format!("keys/admin-{ID}"),
            format!("other/{ID}"),
            format!("index/{ID}.tmp"),
            format!("data/01/admin-{ID}"),
            format!("dedup/admin-{ID}"),
            format!("received/admin-{ID}"),
        ] {
            assert!(classify(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn backup_tokens_only_add() {
        use Action::*;
        let all_kinds = [
            Kind::Config,
            Kind::Key,
            Kind::Pack,
            Kind::Index,
            Kind::AdminIndex,
            Kind::Snapshot,
            Kind::Lock,
            Kind::AdminLock,
            Kind::Pending,
            Kind::DedupList,
            Kind::HostRecord,
            Kind::ReceivedRecord,
        ];
        for kind in all_kinds {
            for action in [List, Read, Create, Replace, Delete] {
                let d = decide(Role::Backup, kind, action);
                let expected = match (kind, action) {
                    (_, List | Read) => Decision::Allow,
                    (Kind::Pack | Kind::Index | Kind::Snapshot | Kind::DedupList, Create) => {
                        Decision::Allow
                    }
                    (Kind::Lock, Create | Replace | Delete) => Decision::OwnLockOnly,
                    _ => Decision::Deny,
                };
                assert_eq!(d, expected, "backup {kind:?} {action:?}");
                let r = decide(Role::Restore, kind, action);
                let expected = match (kind, action) {
                    (_, List | Read) => Decision::Allow,
                    (Kind::Lock, Create | Replace | Delete) => Decision::OwnLockOnly,
                    _ => Decision::Deny,
                };
                assert_eq!(r, expected, "restore {kind:?} {action:?}");
                assert_eq!(decide(Role::Admin, kind, action), Decision::Allow);
            }
        }
    }

    #[test]
    fn prefixes() {
        for p in [
            "", "data/", "data/ab/", "data/a", "index/", "locks/", "keys/",
        ] {
            assert!(valid_prefix(p), "{p}");
        }
        for p in ["../", "data/abc/", "data/AB/", "/", "index", "x/"] {
            assert!(!valid_prefix(p), "{p}");
        }
    }
}
